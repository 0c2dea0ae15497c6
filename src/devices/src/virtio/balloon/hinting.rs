//! Free page hinting (VIRTIO_BALLOON_F_FREE_PAGE_HINT), run by the host through the API. The
//! host starts a run by putting a new command ID (2 or more) in the configuration space. The
//! driver answers on the hinting queue with that ID (a 4-byte buffer the device reads), then
//! hands over blocks of memory it took from the guest's free memory (device-writable
//! buffers, 4 MiB each from Linux), then the ID STOP (0). Ember gives those blocks back to the
//! host. Once the host writes DONE (1), by itself at STOP or through the API, the driver
//! frees the blocks to the guest again, whose next touch finds zero pages.

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueT};
use vm_memory::Bytes;

use telemetry::BalloonMetrics;

use crate::virtio::GuestMemory;

/// The driver has finished (from the driver) or is to stop (from the host).
pub const CMD_STOP: u32 = 0;
/// The driver may give the hinted blocks back to the guest.
pub const CMD_DONE: u32 = 1;
/// Largest block one descriptor may name (Linux hints blocks of its largest buddy order,
/// 4 MiB); more bounds the work one descriptor causes.
const MAX_HINTED_BLOCK: u32 = 64 << 20;

/// Why a hinting request is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HintingError {
    #[error("free page hinting is not enabled on the balloon (free_page_hinting was false when it was configured)")]
    NotEnabled,
    #[error("the guest's balloon driver has not started yet, so no hinting run can be started or stopped")]
    NoDriver,
}

/// Where a run stands; kept in snapshots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HintingState {
    /// The command the host last gave (STOP until the first run).
    pub host_cmd: u32,
    /// The ID of the last run started.
    pub last_cmd_id: u32,
    /// The command the driver last sent, if any.
    pub guest_cmd: Option<u32>,
    /// Write DONE as soon as the driver sends STOP.
    pub acknowledge_on_stop: bool,
}

/// `GET /balloon/hinting/status` (Firecracker's `BalloonHintingStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HintingStatus {
    pub host_cmd: u32,
    pub guest_cmd: Option<u32>,
}

/// `PATCH /balloon/hinting/start` (Firecracker's `BalloonStartCmd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartHintingCmd {
    #[serde(default = "yes")]
    pub acknowledge_on_stop: bool,
}

fn yes() -> bool {
    true
}

impl Default for StartHintingCmd {
    fn default() -> Self {
        StartHintingCmd {
            acknowledge_on_stop: true,
        }
    }
}

impl HintingState {
    /// Begins a new run: the command ID to give the driver.
    pub fn start(&mut self, cmd: StartHintingCmd) -> u32 {
        let id = self.last_cmd_id.wrapping_add(1).max(2);
        self.last_cmd_id = id;
        self.acknowledge_on_stop = cmd.acknowledge_on_stop;
        self.host_cmd = id;
        id
    }

    pub fn status(&self) -> HintingStatus {
        HintingStatus {
            host_cmd: self.host_cmd,
            guest_cmd: self.guest_cmd,
        }
    }

    /// Serves the hinting queue: command IDs are recorded, and the blocks of the run the
    /// host still wants go back to the host; blocks of an older run, or after STOP or DONE,
    /// are only returned to the driver. True in the first place if any chain was used; true
    /// in the second if DONE is now due (the driver sent STOP and the run acknowledges it).
    pub fn process(
        &mut self,
        queue: &mut Queue,
        mem: &GuestMemory,
        metrics: &BalloonMetrics,
        host_page: u64,
    ) -> (bool, bool) {
        let mut used_any = false;
        let mut finished = false;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            for desc in chain {
                if !desc.is_write_only() {
                    // A command ID: four bytes the driver wrote.
                    let cmd = match desc.len() {
                        4 => mem.read_obj::<u32>(desc.addr()).ok(),
                        _ => None,
                    };
                    let Some(cmd) = cmd.map(u32::from_le) else {
                        metrics.invalid_reqs_count.inc();
                        continue;
                    };
                    self.guest_cmd = Some(cmd);
                    // DONE is not the driver's to send; taken as a STOP.
                    finished = cmd == CMD_STOP || cmd == CMD_DONE;
                    continue;
                }
                let wanted = self.host_cmd > CMD_DONE && self.guest_cmd == Some(self.host_cmd);
                if !wanted {
                    continue;
                }
                metrics.free_page_hint_count.inc();
                let aligned = desc.addr().0 % 4096 == 0 && desc.len() % 4096 == 0;
                let given = aligned
                    && desc.len() <= MAX_HINTED_BLOCK
                    && crate::sys::discard_guest_pages(
                        mem,
                        desc.addr(),
                        u64::from(desc.len()),
                        host_page,
                    );
                match given {
                    true => metrics.free_page_hint_freed.add(u64::from(desc.len())),
                    false => metrics.free_page_hint_fails.inc(),
                }
            }
            let _ = queue.add_used(mem, head, 0);
            used_any = true;
        }
        let ack = finished && self.acknowledge_on_stop && self.host_cmd > CMD_DONE;
        (used_any, ack)
    }
}
