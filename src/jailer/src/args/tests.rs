use vmm_sys_util::tempdir::TempDir;

use super::*;

fn parse_list(list: &[&str]) -> Result<Command, Error> {
    parse(list.iter().map(|s| s.to_string()))
}

/// A static executable that exists on every test host: this test binary is dynamic, so
/// the checks that need a static one build a tiny ELF header instead.
fn fake_elf(dir: &Path, interp: Option<&str>) -> PathBuf {
    let mut b = vec![0u8; 64 + 56];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2;
    b[5] = 1;
    b[18] = 62;
    b[32..40].copy_from_slice(&64u64.to_le_bytes());
    b[54] = 56;
    b[56] = 1;
    if let Some(name) = interp {
        let off = b.len() as u64;
        b[64..68].copy_from_slice(&3u32.to_le_bytes());
        b[64 + 8..64 + 16].copy_from_slice(&off.to_le_bytes());
        b[64 + 32..64 + 40].copy_from_slice(&(name.len() as u64 + 1).to_le_bytes());
        b.extend_from_slice(name.as_bytes());
        b.push(0);
    }
    let path = dir.join(if interp.is_some() {
        "dynamic"
    } else {
        "static"
    });
    std::fs::write(&path, b).unwrap();
    path
}

/// A fresh directory, removed when the test ends (passed or not).
fn scratch(name: &str) -> TempDir {
    TempDir::new_with_prefix(std::env::temp_dir().join(format!("jailer-args-{name}-"))).unwrap()
}

#[test]
fn a_full_command_line_and_its_defaults() {
    let dir = scratch("full");
    let exec = fake_elf(dir.as_path(), None);
    let exec = exec.to_str().unwrap();
    let Command::Run(a) = parse_list(&[
        "--id",
        "vm-1",
        "--exec-file",
        exec,
        "--uid",
        "1234",
        "--gid=1234",
        "--cgroup",
        "pids.max=10",
        "--cgroup",
        "cpuset.cpus=0",
        "--resource-limit",
        "no-file=64",
        "--",
        "--api-sock",
        "/run/e.sock",
    ])
    .unwrap() else {
        panic!()
    };
    assert_eq!(a.id, "vm-1");
    assert_eq!((a.uid, a.gid), (1234, 1234));
    assert_eq!(a.chroot_base, PathBuf::from("/srv/jailer"));
    assert_eq!(a.cgroup_version, 1);
    assert_eq!(a.cgroups.len(), 2);
    assert_eq!(a.limits, vec![(Resource::NoFile, 64)]);
    assert_eq!(a.vmm_args, vec!["--api-sock", "/run/e.sock"]);
    assert_eq!(a.exec_name(), "static");
    let root = lookup("root", "/etc/passwd");
    assert_eq!(root, Some(0));
}

#[test]
fn bad_arguments_are_refused_with_the_reason() {
    let dir = scratch("bad");
    let exec = fake_elf(dir.as_path(), None);
    let exec = exec.to_str().unwrap();
    let dynamic = fake_elf(dir.as_path(), Some("/lib64/ld-linux-x86-64.so.2"));
    let base = |extra: &[&str]| {
        let mut v = vec![
            "--id",
            "ok",
            "--exec-file",
            exec,
            "--uid",
            "1",
            "--gid",
            "1",
        ];
        v.extend_from_slice(extra);
        parse_list(&v).unwrap_err()
    };
    for id in ["a/b", "", "x_y", &"a".repeat(65)] {
        let e = parse_list(&["--id", id, "--exec-file", exec, "--uid", "1", "--gid", "1"]);
        assert_eq!(e.unwrap_err(), Error::Id(id.into()));
    }
    let e = parse_list(&[
        "--id",
        "a",
        "--exec-file",
        "ember",
        "--uid",
        "1",
        "--gid",
        "1",
    ]);
    assert_eq!(e.unwrap_err(), Error::RelativeExec("ember".into()));
    let e = parse_list(&[
        "--id",
        "a",
        "--exec-file",
        "/no/such",
        "--uid",
        "1",
        "--gid",
        "1",
    ]);
    assert_eq!(e.unwrap_err(), Error::NoExec("/no/such".into()));
    let d = dynamic.to_str().unwrap();
    let e = parse_list(&["--id", "a", "--exec-file", d, "--uid", "1", "--gid", "1"]);
    assert!(e
        .unwrap_err()
        .to_string()
        .contains("needs /lib64/ld-linux-x86-64.so.2"));
    let e = parse_list(&[
        "--id",
        "a",
        "--exec-file",
        "/etc/passwd",
        "--uid",
        "1",
        "--gid",
        "1",
    ]);
    assert!(matches!(e.unwrap_err(), Error::NotElf { .. }));
    let e = parse_list(&[
        "--id",
        "a",
        "--exec-file",
        exec,
        "--uid",
        "nobody-here",
        "--gid",
        "1",
    ]);
    assert!(matches!(
        e.unwrap_err(),
        Error::NoSuchId { flag: "--uid", .. }
    ));
    assert_eq!(
        parse_list(&["--exec-file", exec]).unwrap_err(),
        Error::Required("--id")
    );
    assert_eq!(
        base(&["--chroot-base-dir", "/etc/passwd"]),
        Error::BaseNotDir("/etc/passwd".into())
    );
    assert_eq!(
        base(&["--chroot-base-dir", "srv"]),
        Error::RelativeBase("srv".into())
    );
    assert_eq!(
        base(&["--netns", "/no/ns"]),
        Error::NoNetns("/no/ns".into())
    );
    for bad in ["pids", "=1", "pids.max", "../x.y=1", "a.b=1\n2"] {
        assert_eq!(base(&["--cgroup", bad]), Error::Cgroup(bad.into()), "{bad}");
    }
    assert_eq!(
        base(&["--cgroup-version", "3"]),
        Error::CgroupVersion("3".into())
    );
    for bad in ["/abs", "a/../b", ""] {
        assert_eq!(
            base(&["--parent-cgroup", bad]),
            Error::ParentCgroup(bad.into())
        );
    }
    for bad in ["cpu=1", "fsize=-1", "no-file"] {
        assert_eq!(base(&["--resource-limit", bad]), Error::Limit(bad.into()));
    }
    assert_eq!(
        base(&["--daemonize=1"]),
        flags::Error::UnexpectedValue("--daemonize".into()).into()
    );
    assert_eq!(
        base(&["--id", "b"]),
        flags::Error::Duplicate("--id".into()).into()
    );
    assert_eq!(
        base(&["--bogus"]),
        flags::Error::Unknown {
            arg: "--bogus".into(),
            program: "jailer"
        }
        .into()
    );
}
