use super::*;

/// Runs `f` in a forked child and returns how it ended: Ok(exit status) or Err(signal).
/// The child only makes system calls (no allocation), so forking a threaded test is safe.
fn in_child(f: impl FnOnce() -> i32) -> Result<i32, i32> {
    // SAFETY: the child calls only async-signal-safe code (seccomp and raw system calls)
    // before it exits with _exit.
    match unsafe { libc::fork() } {
        0 => {
            let status = f();
            // SAFETY: _exit ends the child without running the parent's destructors.
            unsafe { libc::_exit(status) }
        }
        pid => {
            let mut status = 0;
            // SAFETY: waits for the child just forked; `status` is a valid out-pointer.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            match libc::WIFSIGNALED(status) {
                true => Err(libc::WTERMSIG(status)),
                false => Ok(libc::WEXITSTATUS(status)),
            }
        }
    }
}

/// In a child: installs the filter, or exits with 90 if it cannot.
fn install_or_exit(filters: &Filters, thread: Thread) {
    if filters.install(thread).is_err() {
        // SAFETY: _exit ends the forked child at once.
        unsafe { libc::_exit(90) }
    }
}

#[test]
fn every_thread_kind_has_a_compiled_filter() {
    let Filters {
        programs: Some(programs),
    } = Filters::builtin()
    else {
        panic!("no programs")
    };
    for (thread, program) in Thread::ALL.iter().zip(programs.iter()) {
        assert!(
            program.len() > 20,
            "{thread:?}: {} instructions",
            program.len()
        );
        // The last instruction returns; the first loads the architecture.
        assert_eq!(program[0].code, 0x20, "{thread:?}");
    }
    assert!(!Filters::disabled().enabled());
}

#[test]
fn a_vcpu_thread_may_run_kvm_but_not_exec_or_open() {
    let filters = Filters::builtin();
    let path = c"/bin/true";
    // Allowed: write to a descriptor, then exit.
    assert_eq!(
        in_child(|| {
            install_or_exit(&filters, Thread::Vcpu);
            // SAFETY: writes zero bytes from a valid pointer.
            unsafe { libc::write(2, path.as_ptr().cast(), 0) };
            7
        }),
        Ok(7)
    );
    // Forbidden on a vCPU thread: execve, openat, and an ioctl outside its list (TIOCGWINSZ).
    for forbidden in [libc::SYS_execve, libc::SYS_openat, libc::SYS_ioctl] {
        let ended = in_child(|| {
            install_or_exit(&filters, Thread::Vcpu);
            let args: [*const libc::c_char; 1] = [std::ptr::null()];
            // SAFETY: each call gets valid pointers or plain integers; seccomp stops it first.
            unsafe {
                match forbidden {
                    libc::SYS_execve => {
                        libc::syscall(forbidden, path.as_ptr(), args.as_ptr(), args.as_ptr())
                    }
                    libc::SYS_openat => libc::syscall(forbidden, libc::AT_FDCWD, path.as_ptr(), 0),
                    _ => libc::syscall(forbidden, 0, libc::TIOCGWINSZ, 0),
                }
            };
            0
        });
        assert_eq!(ended, Err(libc::SIGSYS), "system call {forbidden}");
    }
}

#[test]
fn mmap_of_executable_memory_is_refused_everywhere() {
    let filters = Filters::builtin();
    for thread in Thread::ALL {
        let ended = in_child(|| {
            install_or_exit(&filters, thread);
            // SAFETY: an anonymous private mapping; seccomp stops it first.
            unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_EXEC,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            0
        });
        assert_eq!(ended, Err(libc::SIGSYS), "{thread:?}");
    }
}

#[test]
fn user_filter_files_are_checked() {
    let good = br#"{"vmm": {"default_action": "allow", "filter_action": "trap", "filter": []},
                    "api": {"default_action": "allow", "filter_action": "trap", "filter": []},
                    "vcpu": {"default_action": "trap", "filter_action": "allow",
                             "filter": [{"syscall": "ioctl"}]}}"#;
    assert!(Filters::from_json(good, "f.json").unwrap().enabled());
    let missing = br#"{"vmm": {"default_action": "allow", "filter_action": "trap", "filter": []}}"#;
    let e = Filters::from_json(missing, "f.json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("no filter for the Api thread"), "{e}");
    let bad_name = br#"{"vmm": {"default_action": "allow", "filter_action": "trap",
                               "filter": [{"syscall": "no_such_call"}]}}"#;
    let e = Filters::from_json(bad_name, "f.json")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("f.json is not a valid filter") && e.contains("no_such_call"),
        "{e}"
    );
    let e = Filters::from_json(b"{", "f.json").unwrap_err().to_string();
    assert!(e.contains("is not a valid filter"), "{e}");
    let e = Filters::from_json_file("/no/such.json")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("cannot read the seccomp filter file /no/such.json"),
        "{e}"
    );
}
