//! A container's resource use, from its cgroup (v2) in the guest: what the host's
//! `ctr task metrics` and the CRI's stats show, as numbers read from the cgroup's files.

use std::path::Path;

use serde_json::{json, Map, Value};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// A cgroup file is a few lines; `memory.stat` the longest, some 2 KiB.
const MAX_FILE: u64 = 64 << 10;

/// The cgroup of the running process `pid`, and what its files say: `memory.current`,
/// `memory.max`, `memory.swap.current`, `pids.current`, `pids.max` (a limit of `max` is
/// `null`), and the keys of `memory.stat` and `cpu.stat`. A file the guest's kernel does not
/// have (a controller not enabled) is left out.
pub fn of_process(pid: u32) -> Result<Value, String> {
    let text = read(Path::new(&format!("/proc/{pid}/cgroup")))
        .ok_or_else(|| format!("process {pid} has ended"))?;
    let relative = cgroup_path(&text).ok_or_else(|| format!("process {pid} has no cgroup v2"))?;
    let dir = Path::new(CGROUP_ROOT).join(relative.trim_start_matches('/'));
    Ok(read_dir(&dir))
}

/// The unified hierarchy's line (`0::/PATH`) of a `/proc/PID/cgroup`.
fn cgroup_path(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::"))
}

fn read_dir(dir: &Path) -> Value {
    let mut out = Map::new();
    out.insert("cgroup".into(), json!(dir.display().to_string()));
    for single in [
        "memory.current",
        "memory.max",
        "memory.swap.current",
        "memory.swap.max",
        "pids.current",
        "pids.max",
    ] {
        if let Some(text) = read(&dir.join(single)) {
            out.insert(single.into(), number(text.trim()));
        }
    }
    for keyed in ["memory.stat", "cpu.stat"] {
        if let Some(text) = read(&dir.join(keyed)) {
            out.insert(keyed.into(), Value::Object(pairs(&text)));
        }
    }
    Value::Object(out)
}

/// A cgroup value: a number, or `null` for `max` (no limit).
fn number(text: &str) -> Value {
    text.parse::<u64>().map_or(Value::Null, |n| json!(n))
}

/// `key value` lines (`memory.stat`, `cpu.stat`); lines that are not are skipped.
fn pairs(text: &str) -> Map<String, Value> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), json!(v.trim().parse::<u64>().ok()?)))
        })
        .collect()
}

fn read(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_FILE)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_files_become_numbers() {
        assert_eq!(
            cgroup_path("1:name=x:/a\n0::/default/c1\n"),
            Some("/default/c1")
        );
        assert_eq!(cgroup_path("1:cpu:/a\n"), None);
        assert_eq!(number("134217728"), json!(134217728));
        assert_eq!(number("max"), Value::Null);
        let stat = pairs("anon 4096\nfile 8192\nbroken\nodd x\n");
        assert_eq!(Value::Object(stat), json!({"anon": 4096, "file": 8192}));
    }

    #[test]
    fn a_cgroup_directory_is_read_and_missing_files_left_out() {
        let dir = std::env::temp_dir().join(format!("agent-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.current"), "1048576\n").unwrap();
        std::fs::write(dir.join("memory.max"), "max\n").unwrap();
        std::fs::write(dir.join("cpu.stat"), "usage_usec 250\nuser_usec 200\n").unwrap();
        let v = read_dir(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(v["memory.current"], json!(1048576));
        assert_eq!(v["memory.max"], Value::Null);
        assert!(v.get("pids.current").is_none());
        assert_eq!(v["cpu.stat"]["usage_usec"], json!(250));
    }
}
