//! Prints where the test guest images are, for scripts: `cargo run -q -p test-guest`.

fn main() {
    println!("pvh={}", test_guest::PVH_ELF);
    println!("linux64={}", test_guest::LINUX64_ELF);
    println!("bzimage={}", test_guest::BZIMAGE);
}
