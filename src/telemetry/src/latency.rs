//! Firecracker's `latencies_us` section: how long the latest snapshot create, snapshot load,
//! pause and resume took, each measured twice, around the whole API request (`full_create_snapshot`,
//! ...) and around the VMM's own work (`vmm_full_create_snapshot`, ...). The difference is
//! the control plane's share: parsing, the hop to the VMM thread, and the answer.
//!
//! As in Firecracker, a value stays until the next operation of its kind replaces it: these
//! operations are rare, and a reader wants the latest, not a sum.

use std::sync::atomic::{AtomicU64, Ordering};

/// An operation whose duration is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timed {
    FullCreateSnapshot,
    DiffCreateSnapshot,
    LoadSnapshot,
    PauseVm,
    ResumeVm,
}

/// Where a duration was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// From a complete request on the API socket to its answer.
    Api,
    /// The VMM thread's handling of the action.
    Vmm,
}

const OPERATIONS: usize = 5;

/// The latest duration of each operation, in microseconds, per span.
#[derive(Debug, Default)]
pub struct LatencyMetrics {
    api: [AtomicU64; OPERATIONS],
    vmm: [AtomicU64; OPERATIONS],
}

impl Timed {
    fn index(self) -> usize {
        self as usize
    }

    /// Firecracker's name for the API-level figure; the VMM-level one adds `vmm_`.
    fn name(self) -> &'static str {
        match self {
            Timed::FullCreateSnapshot => "full_create_snapshot",
            Timed::DiffCreateSnapshot => "diff_create_snapshot",
            Timed::LoadSnapshot => "load_snapshot",
            Timed::PauseVm => "pause_vm",
            Timed::ResumeVm => "resume_vm",
        }
    }

    const ALL: [Timed; OPERATIONS] = [
        Timed::FullCreateSnapshot,
        Timed::DiffCreateSnapshot,
        Timed::LoadSnapshot,
        Timed::PauseVm,
        Timed::ResumeVm,
    ];
}

impl LatencyMetrics {
    pub fn record(&self, op: Timed, span: Span, micros: u64) {
        let slots = match span {
            Span::Api => &self.api,
            Span::Vmm => &self.vmm,
        };
        slots[op.index()].store(micros, Ordering::Relaxed);
    }

    /// Every field by Firecracker's name, API-level first.
    pub fn report(&self) -> Vec<(String, u64)> {
        let api = Timed::ALL.iter().map(|op| {
            (
                op.name().to_string(),
                self.api[op.index()].load(Ordering::Relaxed),
            )
        });
        let vmm = Timed::ALL.iter().map(|op| {
            let micros = self.vmm[op.index()].load(Ordering::Relaxed);
            (format!("vmm_{}", op.name()), micros)
        });
        api.chain(vmm).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_duration_stays_until_replaced() {
        let m = LatencyMetrics::default();
        m.record(Timed::LoadSnapshot, Span::Api, 900);
        m.record(Timed::LoadSnapshot, Span::Vmm, 700);
        m.record(Timed::PauseVm, Span::Vmm, 40);
        let report = m.report();
        let get = |name: &str| report.iter().find(|(n, _)| n == name).unwrap().1;
        assert_eq!(report.len(), 10);
        assert_eq!(get("load_snapshot"), 900);
        assert_eq!(get("vmm_load_snapshot"), 700);
        assert_eq!(get("vmm_pause_vm"), 40);
        assert_eq!(get("pause_vm"), 0);
        assert_eq!(m.report(), report, "a report does not reset the values");
        m.record(Timed::LoadSnapshot, Span::Api, 500);
        let get_again = m.report();
        assert_eq!(
            get_again
                .iter()
                .find(|(n, _)| n == "load_snapshot")
                .unwrap()
                .1,
            500
        );
    }
}
