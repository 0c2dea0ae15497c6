//! Builds the test guest with the system's gcc and GNU as into OUT_DIR, in three forms: an
//! ELF with a PVH note, an ELF entered through the 64-bit Linux protocol, and a bzImage. No
//! binary is kept in the repository.

use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?} failed");
}

const CFLAGS: &[&str] = &[
    "-m64",
    "-O2",
    "-ffreestanding",
    "-fno-pic",
    "-fno-pie",
    "-fno-stack-protector",
    "-mno-red-zone",
    "-mgeneral-regs-only",
    "-fno-asynchronous-unwind-tables",
    "-fno-builtin",
    "-Wall",
    "-Werror",
    "-c",
];

fn link(out: &Path, objects: &[&Path], script: &Path, name: &str) -> PathBuf {
    let elf = out.join(name);
    let mut cmd = Command::new("ld");
    cmd.args([
        "-nostdlib",
        "-static",
        "-no-pie",
        "--build-id=none",
        "-z",
        "max-page-size=4096",
        "-T",
    ])
    .arg(script);
    cmd.args(objects).arg("-o").arg(&elf);
    run(&mut cmd);
    elf
}

/// A bzImage: one setup sector holding the boot protocol header, then the flat image whose
/// 64-bit entry is at offset 0x200.
fn bzimage(out: &Path, elf: &Path) -> PathBuf {
    let flat = out.join("guest.bin");
    run(Command::new("objcopy")
        .args(["-O", "binary"])
        .arg(elf)
        .arg(&flat));
    let body = std::fs::read(&flat).expect("flat guest image");
    let mut setup = vec![0u8; 1024];
    setup[0x1f1] = 1; // setup_sects
    setup[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
    setup[0x202..0x206].copy_from_slice(b"HdrS");
    setup[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes()); // protocol 2.15
    setup[0x211] = 0x01; // LOADED_HIGH
    setup[0x214..0x218].copy_from_slice(&0x10_0000u32.to_le_bytes()); // code32_start
    setup[0x22c..0x230].copy_from_slice(&0x7fff_ffffu32.to_le_bytes()); // initrd_addr_max
    setup[0x230..0x234].copy_from_slice(&0x20_0000u32.to_le_bytes()); // kernel_alignment
    setup[0x236..0x238].copy_from_slice(&0x0001u16.to_le_bytes()); // XLF_KERNEL_64
    setup[0x238..0x23c].copy_from_slice(&2048u32.to_le_bytes()); // cmdline_size
    let image = out.join("guest.bzImage");
    std::fs::write(&image, [setup, body].concat()).expect("write bzImage");
    image
}

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("guest");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    for f in ["entry.S", "main.c", "link.ld"] {
        println!("cargo:rerun-if-changed=guest/{f}");
    }
    let compile = |source: &str, defines: &[&str], object: &str| {
        let object = out.join(object);
        run(Command::new("gcc")
            .args(CFLAGS)
            .args(defines)
            .arg(dir.join(source))
            .arg("-o")
            .arg(&object));
        object
    };
    let main_o = compile("main.c", &[], "main.o");
    let entry_pvh = compile("entry.S", &["-DPVH_NOTE"], "entry-pvh.o");
    let entry_64 = compile("entry.S", &[], "entry-64.o");
    let script = dir.join("link.ld");
    link(&out, &[&entry_pvh, &main_o], &script, "guest-pvh.elf");
    let elf64 = link(&out, &[&entry_64, &main_o], &script, "guest-linux64.elf");
    bzimage(&out, &elf64);
}
