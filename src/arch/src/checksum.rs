//! The checksum rule of the MP and ACPI tables: all bytes of a region sum to zero.

/// The byte that makes `bytes` (with it in place of a zero) sum to zero.
pub fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(byte_sum(bytes))
}

/// The sum of `bytes`, modulo 256: zero for a whole table whose checksum is right.
pub fn byte_sum(bytes: &[u8]) -> u8 {
    bytes.iter().fold(0u8, |sum, b| sum.wrapping_add(*b))
}
