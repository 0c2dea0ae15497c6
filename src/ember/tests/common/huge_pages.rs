//! The host's pool of 2 MiB huge pages (`vm.nr_hugepages`) for tests of `huge_pages: "2M"`:
//! raised for one test and lowered again after it, one such test at a time per binary.

use std::sync::{Mutex, MutexGuard};

const NR: &str = "/proc/sys/vm/nr_hugepages";
const POOL: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// `pages` more 2 MiB pages in the host's pool while this lives.
pub struct HugePool {
    before: u64,
    _one: MutexGuard<'static, ()>,
}

fn read(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn set(total: u64) -> std::io::Result<()> {
    std::fs::write(NR, total.to_string())
}

/// Adds `pages` to the pool, or prints the SKIPPED line when this host cannot (not root, or
/// not enough free memory for them).
pub fn huge_pages_or_skip(test: &str, pages: u64) -> Option<HugePool> {
    let one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(before) = read(NR) else {
        super::skip(
            test,
            "this host has no 2 MiB huge page pool (no /proc/sys/vm/nr_hugepages)",
        );
        return None;
    };
    if let Err(e) = set(before + pages) {
        super::skip(test, &format!("cannot raise vm.nr_hugepages ({e})"));
        return None;
    }
    let pool = HugePool { before, _one: one };
    let got = read(NR).unwrap_or(before);
    if got < before + pages {
        super::skip(
            test,
            &format!(
                "the host could add only {} of {pages} huge pages",
                got - before
            ),
        );
        return None;
    }
    Some(pool)
}

impl HugePool {
    /// Unreserved free pages in the pool now.
    pub fn available(&self) -> u64 {
        let free = read(&format!("{POOL}/free_hugepages")).unwrap_or(0);
        free.saturating_sub(read(&format!("{POOL}/resv_hugepages")).unwrap_or(0))
    }
}

impl Drop for HugePool {
    fn drop(&mut self) {
        let _ = set(self.before);
    }
}

/// KiB of `pid`'s mappings that are backed by 2 MiB pages (their whole size, touched or not).
pub fn huge_mapped_kib(pid: u32) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut size = 0;
    let mut total = 0;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("Size:"), Some(kib)) => size = kib.parse().unwrap_or(0),
            (Some("KernelPageSize:"), Some("2048")) => total += size,
            _ => {}
        }
    }
    total
}

/// KiB of 2 MiB pages `pid` holds now (touched and not given back).
pub fn huge_resident_kib(pid: u32) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    smaps
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            match words.next() {
                Some("Private_Hugetlb:" | "Shared_Hugetlb:") => words.next()?.parse::<u64>().ok(),
                _ => None,
            }
        })
        .sum()
}
