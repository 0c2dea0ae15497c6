//! The snapshot state file: a fixed header, the state as JSON, and a CRC-64 over both, so a
//! file from another format version, a truncated file and a damaged file are each refused
//! with their own error before anything is restored.
//!
//! Layout (little-endian): `EMBERSNP` (8 bytes), format version (u32), payload length
//! (u64), payload, CRC-64/XZ of everything before it (u64).

use std::io::Write;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

const MAGIC: &[u8; 8] = b"EMBERSNP";
/// The format this build writes and reads; a change to the state's layout bumps it.
pub const FORMAT_VERSION: u32 = 1;
const HEADER_LEN: usize = 8 + 4 + 8;
const CRC_LEN: usize = 8;
/// Far above any microVM's state (a few hundred KiB with many vCPUs): a length past it is
/// a damaged header, not a reason to allocate.
const MAX_PAYLOAD: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotFileError {
    #[error("cannot read the snapshot file {path}: {source}")]
    Read {
        path: String,
        source: hostfile::Error,
    },
    #[error("cannot write the snapshot file {path}: {source}")]
    Write {
        path: String,
        source: hostfile::Error,
    },
    #[error("{path} is not an Ember snapshot file")]
    NotASnapshot { path: String },
    #[error("the snapshot file {path} has format version {found}; this Ember reads version {FORMAT_VERSION}")]
    Version { path: String, found: u32 },
    #[error("the snapshot file {path} is truncated: {len} bytes, {expected} expected")]
    Truncated {
        path: String,
        len: usize,
        expected: u64,
    },
    #[error("the snapshot file {path} is damaged: its checksum does not match")]
    Checksum { path: String },
    #[error("the snapshot file {path} holds a state this Ember cannot read: {reason}")]
    State { path: String, reason: String },
}

/// CRC-64/XZ (ECMA-182 polynomial, reflected), table-driven.
fn crc64(data: &[u8]) -> u64 {
    const POLY: u64 = 0xc96c_5795_d787_0f42;
    static TABLE: std::sync::OnceLock<[u64; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u64; 256];
        for (i, slot) in t.iter_mut().enumerate() {
            let mut c = i as u64;
            for _ in 0..8 {
                c = if c & 1 == 1 { (c >> 1) ^ POLY } else { c >> 1 };
            }
            *slot = c;
        }
        t
    });
    let mut crc = !0u64;
    for &b in data {
        crc = table[((crc ^ u64::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// The file's bytes for `state`.
pub fn encode<T: Serialize>(state: &T) -> Vec<u8> {
    let payload = serde_json::to_vec(state).expect("snapshot state serializes");
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + CRC_LEN);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&payload);
    let crc = crc64(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The state in `bytes` (the contents of `path`), checked in order: magic, version, length,
/// checksum, then the state itself.
pub fn decode<T: DeserializeOwned>(path: &str, bytes: &[u8]) -> Result<T, SnapshotFileError> {
    let path = || path.to_string();
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(SnapshotFileError::NotASnapshot { path: path() });
    }
    let truncated = |expected: u64| SnapshotFileError::Truncated {
        path: path(),
        len: bytes.len(),
        expected,
    };
    let Some(header) = bytes.get(..HEADER_LEN) else {
        return Err(truncated((HEADER_LEN + CRC_LEN) as u64));
    };
    let found = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
    if found != FORMAT_VERSION {
        return Err(SnapshotFileError::Version {
            path: path(),
            found,
        });
    }
    let len = u64::from_le_bytes(header[12..20].try_into().expect("8 bytes"));
    if len > MAX_PAYLOAD {
        return Err(SnapshotFileError::Checksum { path: path() });
    }
    let expected = (HEADER_LEN + CRC_LEN) as u64 + len;
    if (bytes.len() as u64) < expected {
        return Err(truncated(expected));
    }
    let end = HEADER_LEN + len as usize;
    let stored = u64::from_le_bytes(bytes[end..end + CRC_LEN].try_into().expect("8 bytes"));
    if bytes.len() as u64 != expected || crc64(&bytes[..end]) != stored {
        return Err(SnapshotFileError::Checksum { path: path() });
    }
    serde_json::from_slice(&bytes[HEADER_LEN..end]).map_err(|e| SnapshotFileError::State {
        path: path(),
        reason: e.to_string(),
    })
}

/// Writes `state` to `path` (created or truncated) and syncs it.
pub fn save<T: Serialize>(path: &Path, state: &T) -> Result<(), SnapshotFileError> {
    let err = |source| SnapshotFileError::Write {
        path: path.display().to_string(),
        source,
    };
    let mut f = hostfile::create(path).map_err(err)?;
    f.write_all(&encode(state)).map_err(|e| err(e.into()))?;
    f.sync_all().map_err(|e| err(e.into()))
}

/// Reads and checks the state in `path`.
pub fn load<T: DeserializeOwned>(path: &Path) -> Result<T, SnapshotFileError> {
    let name = path.display().to_string();
    let limit = (HEADER_LEN + CRC_LEN) as u64 + MAX_PAYLOAD;
    let bytes = hostfile::read(path, limit).map_err(|source| SnapshotFileError::Read {
        path: name.clone(),
        source,
    })?;
    decode(&name, &bytes)
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct State {
        vcpus: Vec<Vec<u8>>,
        clock: u64,
    }

    fn state() -> State {
        State {
            vcpus: vec![vec![1, 2, 3], (0..=255).collect()],
            clock: 0x1234_5678_9abc,
        }
    }

    #[test]
    fn crc64_is_the_xz_variant() {
        assert_eq!(crc64(b"123456789"), 0x995d_c9bb_df19_39fa);
    }

    #[test]
    fn a_state_round_trips() {
        let bytes = encode(&state());
        assert_eq!(&bytes[..8], b"EMBERSNP");
        assert_eq!(decode::<State>("s", &bytes).unwrap(), state());
    }

    #[test]
    fn a_truncated_file_is_refused_at_every_length() {
        let bytes = encode(&state());
        for len in 0..bytes.len() {
            let e = decode::<State>("s", &bytes[..len]).unwrap_err().to_string();
            let expected = match len < 8 {
                true => "not an Ember snapshot file",
                false => "is truncated",
            };
            assert!(e.contains(expected), "{len}: {e}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            decode::<State>("s", &longer),
            Err(SnapshotFileError::Checksum { .. })
        ));
    }

    #[test]
    fn any_damaged_byte_is_refused() {
        let bytes = encode(&state());
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            let e = decode::<State>("s", &bad).unwrap_err();
            assert!(
                matches!(
                    e,
                    SnapshotFileError::Checksum { .. }
                        | SnapshotFileError::NotASnapshot { .. }
                        | SnapshotFileError::Version { .. }
                        | SnapshotFileError::Truncated { .. }
                ),
                "byte {at}: {e}"
            );
        }
    }

    #[test]
    fn another_format_version_is_named() {
        let mut bytes = encode(&state());
        bytes[8..12].copy_from_slice(&7u32.to_le_bytes());
        let e = decode::<State>("snap", &bytes).unwrap_err().to_string();
        assert_eq!(
            e,
            "the snapshot file snap has format version 7; this Ember reads version 1"
        );
    }

    #[test]
    fn a_state_of_another_shape_is_refused_with_its_reason() {
        let bytes = encode(&serde_json::json!({"vcpus": "none"}));
        let e = decode::<State>("s", &bytes).unwrap_err().to_string();
        assert!(e.contains("holds a state this Ember cannot read"), "{e}");
    }

    #[test]
    fn save_and_load_use_the_file() {
        let path = std::env::temp_dir().join(format!("ember-snap-{}", std::process::id()));
        save(&path, &state()).unwrap();
        assert_eq!(load::<State>(&path).unwrap(), state());
        std::fs::remove_file(&path).unwrap();
        let e = load::<State>(&path).unwrap_err().to_string();
        assert!(e.starts_with("cannot read the snapshot file"), "{e}");
    }
}
