//! virtio-balloon: the host sets a target (`num_pages`); the guest's driver gives pages to
//! the balloon through the inflate queue, and Ember hands them back to the host
//! (`madvise(MADV_DONTNEED)` on the guest RAM mapping: the host frees them, and a later guest
//! access gets a zero page). Pages leaving through the deflate queue need nothing. With a
//! polling interval, the statistics queue's one buffer is handed back to the driver each
//! interval, and what it returns with is the guest's memory statistics. With free page
//! reporting (VIRTIO_BALLOON_F_REPORTING), the driver hands over ranges of memory the guest
//! has free, and they go back to the host the same way, until the guest uses them again.
//! Free page hinting ([`hinting`]) does the same in runs the host starts. Runs on the VMM
//! thread.

pub mod hinting;
mod stats;

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use event_manager::{EventOps, Events, MutEventSubscriber};
use telemetry::BalloonMetrics;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_BALLOON;
use virtio_queue::{QueueState, QueueT};
use vm_memory::{Address, Bytes, GuestAddress};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::timerfd::TimerFd;

pub use hinting::{HintingError, HintingState, HintingStatus, StartHintingCmd};
pub use stats::BalloonStats;

use crate::virtio::device::read_config_bytes;
use crate::virtio::watch::watch_all;
use crate::virtio::{common_accessors, GuestMemory, VirtioCommon, VirtioDevice};

pub const QUEUE_SIZE: u16 = 256;
/// The balloon's unit: 4 KiB pages, whatever the guest's page size.
const PFN_SHIFT: u64 = 12;
const PAGES_PER_MIB: u32 = 256;
/// Page numbers one inflate or deflate buffer may hold (Linux's driver sends up to 256).
const MAX_PFNS_PER_DESC: u32 = 4096;
/// Largest free range one reporting descriptor may name: Linux reports blocks of at most
/// its largest buddy order (4 MiB); more bounds the work one descriptor causes.
const MAX_REPORTED_RANGE: u32 = 64 << 20;

/// The balloon's own feature bits (virtio 1.2, 5.5.3).
#[derive(Debug, Clone, Copy)]
enum Feature {
    StatsVq = 1,
    DeflateOnOom = 2,
    FreePageHint = 3,
    Reporting = 5,
}

impl Feature {
    const fn bit(self) -> u64 {
        1 << self as u64
    }
}

/// The fixed queues' indices; the hinting and reporting queues follow those offered.
const INFLATE: usize = 0;
const DEFLATE: usize = 1;
const STATS: usize = 2;

/// What the builder needs to make the balloon.
#[derive(Debug, Clone)]
pub struct BalloonConfig {
    pub amount_mib: u32,
    pub deflate_on_oom: bool,
    /// 0: no statistics queue.
    pub stats_polling_interval_s: u16,
    /// Offer free page hinting (a queue after the statistics queue, if any).
    pub free_page_hinting: bool,
    /// Offer free page reporting (a queue after the statistics and hinting queues).
    pub free_page_reporting: bool,
    /// The size of the host pages behind guest RAM (4 KiB, or 2 MiB on hugetlbfs): only
    /// whole host pages can be given back.
    pub host_page_size: u64,
    pub metrics: Arc<BalloonMetrics>,
}

#[derive(Debug)]
pub struct Balloon {
    common: VirtioCommon,
    /// Pages the host wants in the balloon (`num_pages`).
    target_pages: u32,
    /// Pages the driver says it holds (`actual`, written by the driver).
    actual_pages: u32,
    stats_interval_s: u16,
    stats_timer: TimerFd,
    /// The statistics buffer the driver left with the device, to hand back at the next tick.
    stats_head: Option<u16>,
    stats: BalloonStats,
    /// The hinting queue's index, when offered, and where its runs stand.
    hinting: Option<usize>,
    hints: HintingState,
    /// The reporting queue's index, when offered.
    reporting: Option<usize>,
    host_page_size: u64,
    metrics: Arc<BalloonMetrics>,
}

impl Balloon {
    pub fn new(config: &BalloonConfig) -> std::io::Result<Self> {
        let mut avail_features = 1u64 << VIRTIO_F_VERSION_1;
        let mut queues = 2;
        if config.stats_polling_interval_s > 0 {
            avail_features |= Feature::StatsVq.bit();
            queues = 3;
        }
        if config.deflate_on_oom {
            avail_features |= Feature::DeflateOnOom.bit();
        }
        let mut hinting = None;
        if config.free_page_hinting {
            avail_features |= Feature::FreePageHint.bit();
            hinting = Some(queues);
            queues += 1;
        }
        let mut reporting = None;
        if config.free_page_reporting {
            avail_features |= Feature::Reporting.bit();
            reporting = Some(queues);
            queues += 1;
        }
        Ok(Balloon {
            common: VirtioCommon::new(
                VIRTIO_ID_BALLOON,
                avail_features,
                &vec![QUEUE_SIZE; queues],
                config.metrics.clone(),
            )?,
            target_pages: config.amount_mib.saturating_mul(PAGES_PER_MIB),
            actual_pages: 0,
            stats_interval_s: config.stats_polling_interval_s,
            stats_timer: TimerFd::new().map_err(std::io::Error::from)?,
            stats_head: None,
            stats: BalloonStats::default(),
            hinting,
            hints: HintingState::default(),
            reporting,
            host_page_size: config.host_page_size,
            metrics: config.metrics.clone(),
        })
    }

    /// `PATCH /balloon`: a new target; the driver is told through a configuration interrupt.
    pub fn set_target_mib(&mut self, amount_mib: u32) {
        self.target_pages = amount_mib.saturating_mul(PAGES_PER_MIB);
        self.common.config_changed();
    }

    /// `PATCH /balloon/hinting/start`: a new run, announced to the driver.
    pub fn start_hinting(&mut self, cmd: StartHintingCmd) -> Result<(), HintingError> {
        self.hinting_ready()?;
        let id = self.hints.start(cmd);
        self.set_hint_cmd(id);
        Ok(())
    }

    /// `PATCH /balloon/hinting/stop`: DONE, so the driver frees what it hinted.
    pub fn stop_hinting(&mut self) -> Result<(), HintingError> {
        self.hinting_ready()?;
        self.set_hint_cmd(hinting::CMD_DONE);
        Ok(())
    }

    /// `GET /balloon/hinting/status`.
    pub fn hinting_status(&self) -> Result<HintingStatus, HintingError> {
        self.hinting.ok_or(HintingError::NotEnabled)?;
        Ok(self.hints.status())
    }

    fn hinting_ready(&self) -> Result<(), HintingError> {
        self.hinting.ok_or(HintingError::NotEnabled)?;
        match self.common.active {
            Some(_) => Ok(()),
            None => Err(HintingError::NoDriver),
        }
    }

    /// Puts `cmd` in the configuration space and tells the driver.
    fn set_hint_cmd(&mut self, cmd: u32) {
        self.hints.host_cmd = cmd;
        self.common.config_changed();
    }

    /// Where hinting stands, for a snapshot.
    pub fn hinting_state(&self) -> Option<HintingState> {
        self.hinting.map(|_| self.hints)
    }

    /// A restored balloon's hinting as the snapshot saw it; once the device runs again it
    /// writes DONE ([`VirtioDevice::restored`]).
    pub fn restore_hinting(&mut self, state: HintingState) {
        if self.hinting.is_some() {
            self.hints = state;
        }
    }

    /// The pages the driver holds, as a snapshot saw them (`actual`).
    pub fn actual_pages(&self) -> u32 {
        self.actual_pages
    }

    /// A restored balloon: the driver's `actual` as it was.
    pub fn restore_actual_pages(&mut self, pages: u32) {
        self.actual_pages = pages;
    }

    /// `PATCH /balloon/statistics` after boot (never from or to 0): the next statistics now.
    pub fn set_stats_interval(&mut self, seconds: u16) {
        self.stats_interval_s = seconds;
        self.request_stats();
    }

    /// The latest statistics with the balloon's own sizes.
    pub fn stats(&self) -> BalloonStats {
        BalloonStats {
            target_pages: self.target_pages,
            actual_pages: self.actual_pages,
            target_mib: self.target_pages / PAGES_PER_MIB,
            actual_mib: self.actual_pages / PAGES_PER_MIB,
            ..self.stats.clone()
        }
    }

    /// Serves the inflate or deflate queue: each page number in an inflate chain is given
    /// back to the host; true if any chain.
    pub fn process_pfns(&mut self, queue: usize) -> bool {
        let Some(mut active) = self.common.active.take() else {
            return false;
        };
        let used_any = active.serve_queue(queue, |mem, chain| {
            for desc in chain {
                if desc.is_write_only() {
                    continue;
                }
                // Linux sends at most 256 page numbers per buffer; a guest's 4 GiB buffer
                // would keep the VMM thread reading (and discarding) for minutes.
                if desc.len() / 4 > MAX_PFNS_PER_DESC {
                    self.metrics.invalid_reqs_count.inc();
                    continue;
                }
                // The page numbers, as little-endian u32s; a short tail is ignored.
                let mut run: Option<(u64, u64)> = None;
                for i in 0..u64::from(desc.len() / 4) {
                    let Some(at) = desc.addr().checked_add(i * 4) else {
                        break;
                    };
                    let Ok(pfn) = mem.read_obj::<u32>(at) else {
                        self.metrics.invalid_reqs_count.inc();
                        break;
                    };
                    if queue == DEFLATE {
                        self.metrics.deflate_count.inc();
                        continue;
                    }
                    let page = u64::from(pfn) << PFN_SHIFT;
                    run = match run {
                        // Consecutive pages go in one madvise.
                        Some((start, len)) if start + len == page => Some((start, len + 4096)),
                        Some((start, len)) => {
                            self.give_back(mem, start, len);
                            Some((page, 4096))
                        }
                        None => Some((page, 4096)),
                    };
                }
                if let Some((start, len)) = run {
                    self.give_back(mem, start, len);
                }
            }
            Some(0)
        });
        self.common.active = Some(active);
        used_any
    }

    fn give_back(&self, mem: &GuestMemory, start: u64, len: u64) {
        match crate::sys::discard_guest_pages(mem, GuestAddress(start), len, self.host_page_size) {
            true => self.metrics.inflate_count.add(len >> PFN_SHIFT),
            false => self.metrics.invalid_reqs_count.inc(),
        }
    }

    /// Serves the hinting queue; writes DONE when a run that acknowledges its end ends.
    pub fn process_hints(&mut self) -> bool {
        let (Some(queue), Some(mut active)) = (self.hinting, self.common.active.take()) else {
            return false;
        };
        let (used, done) = self.hints.process(
            &mut active.queues[queue],
            &active.mem,
            &self.metrics,
            self.host_page_size,
        );
        if used {
            active.notify(queue);
        }
        self.common.active = Some(active);
        if done {
            self.set_hint_cmd(hinting::CMD_DONE);
        }
        used
    }

    /// Serves the reporting queue: every device-writable buffer names a free guest range
    /// (page-aligned, in guest RAM), which goes back to the host; each chain is returned.
    pub fn process_reports(&mut self) -> bool {
        let (Some(queue), Some(mut active)) = (self.reporting, self.common.active.take()) else {
            return false;
        };
        let used_any = active.serve_queue(queue, |mem, chain| {
            for desc in chain {
                let aligned = desc.addr().0 % 4096 == 0 && desc.len() % 4096 == 0;
                let ok = desc.is_write_only()
                    && aligned
                    && desc.len() <= MAX_REPORTED_RANGE
                    && crate::sys::discard_guest_pages(
                        mem,
                        desc.addr(),
                        u64::from(desc.len()),
                        self.host_page_size,
                    );
                self.metrics.free_page_report_count.inc();
                match ok {
                    true => self
                        .metrics
                        .free_page_report_freed
                        .add(u64::from(desc.len())),
                    false => self.metrics.free_page_report_fails.inc(),
                }
            }
            Some(0)
        });
        self.common.active = Some(active);
        used_any
    }

    /// The driver (re)posted its statistics buffer: read it, keep it until the next tick.
    pub fn process_stats(&mut self) {
        let Some(mut active) = self.common.active.take() else {
            return;
        };
        while let Some(chain) = active.queues[STATS].pop_descriptor_chain(&active.mem) {
            let head = chain.head_index();
            if let Some(previous) = self.stats_head.replace(head) {
                // Two buffers at once: hand the older back rather than keep it forever.
                let _ = active.queues[STATS].add_used(&active.mem, previous, 0);
            }
            let mut updated = false;
            for desc in chain.filter(|d| !d.is_write_only()) {
                updated |= self.stats.read_from(&active.mem, desc.addr(), desc.len());
            }
            match updated {
                true => self.metrics.stats_updates_count.inc(),
                false => self.metrics.stats_update_fails.inc(),
            }
        }
        self.common.active = Some(active);
        if !self.stats_timer.is_armed().unwrap_or(true) {
            self.arm_stats_timer();
        }
    }

    fn arm_stats_timer(&mut self) {
        if self.stats_interval_s > 0 {
            let period = Duration::from_secs(u64::from(self.stats_interval_s));
            let _ = self.stats_timer.reset(period, None);
        }
    }

    /// A tick: give the statistics buffer back, so the driver refills it.
    fn request_stats(&mut self) {
        self.arm_stats_timer();
        let (Some(active), Some(head)) = (&mut self.common.active, self.stats_head.take()) else {
            return;
        };
        let _ = active.queues[STATS].add_used(&active.mem, head, 0);
        active.notify(STATS);
    }
}

impl VirtioDevice for Balloon {
    common_accessors!();

    /// `num_pages`, `actual` and `free_page_hint_cmd_id`, little-endian u32s.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut space = self.target_pages.to_le_bytes().to_vec();
        space.extend_from_slice(&self.actual_pages.to_le_bytes());
        space.extend_from_slice(&self.hints.host_cmd.to_le_bytes());
        read_config_bytes(&space, offset, data);
    }

    /// The driver writes `actual` (offset 4) as it inflates and deflates.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        let mut actual = self.actual_pages.to_le_bytes();
        for (i, byte) in data.iter().enumerate() {
            if let Some(slot) = offset
                .checked_add(i as u64)
                .and_then(|o| o.checked_sub(4))
                .and_then(|o| actual.get_mut(o as usize))
            {
                *slot = *byte;
            }
        }
        self.actual_pages = u32::from_le_bytes(actual);
    }

    /// A run in progress at the snapshot is ended (DONE), and the driver is told, so that it
    /// frees what it held for the run, as Firecracker does at restore.
    fn restored(&mut self) {
        if self.hinting.is_some() {
            self.set_hint_cmd(hinting::CMD_DONE);
        }
    }

    /// (On a vCPU thread: the statistics timer is left to fire once more and find no driver.)
    fn reset_device(&mut self) {
        self.stats_head = None;
        // A driver that starts again finds no run: it held nothing for one any more.
        self.hints.host_cmd = hinting::CMD_STOP;
        self.hints.guest_cmd = None;
    }

    /// The statistics buffer the device holds was the last one taken: it is counted as not
    /// taken, so the restored balloon takes it again and statistics go on.
    fn queue_states(&self) -> Vec<QueueState> {
        let mut states = self.common.queue_states();
        if let (Some(_), Some(stats)) = (self.stats_head, states.get_mut(STATS)) {
            stats.next_avail = stats.next_avail.wrapping_sub(1);
        }
        states
    }
}

impl MutEventSubscriber for Balloon {
    fn init(&mut self, ops: &mut EventOps) {
        let queues = self.common.queue_events().iter().map(AsRawFd::as_raw_fd);
        let watched = queues
            .chain([self.stats_timer.as_raw_fd()])
            .map(|fd| Events::new_raw(fd, EventSet::IN));
        watch_all(ops, watched, &self.metrics.event_fails, "balloon");
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        let fd = events.fd();
        if fd == self.stats_timer.as_raw_fd() {
            let _ = self.stats_timer.wait();
            if self.common.is_active() {
                self.request_stats();
            }
            return;
        }
        let Some(queue) = self.common.notified_queue(fd) else {
            return;
        };
        match queue {
            INFLATE | DEFLATE => {
                self.process_pfns(queue);
            }
            q if Some(q) == self.reporting => {
                self.process_reports();
            }
            q if Some(q) == self.hinting => {
                self.process_hints();
            }
            _ => self.process_stats(),
        }
    }
}

#[cfg(test)]
mod tests;
