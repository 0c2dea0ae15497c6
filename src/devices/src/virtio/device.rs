//! What a virtio device provides to the transport.

use std::sync::Arc;

use virtio_queue::{Queue, QueueState};
use vmm_sys_util::eventfd::EventFd;

use super::{GuestMemory, IrqTrigger};

#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    #[error("the device expects {expected} queues, the driver set up {found}")]
    QueueCount { expected: usize, found: usize },
    #[error("queue {0} is not valid in guest memory")]
    InvalidQueue(usize),
}

/// A virtio device type. The transport owns the generic state (features selected, queues,
/// status); the device owns its configuration space and does the work once activated.
pub trait VirtioDevice: Send {
    /// The virtio device ID (2 for block, ...).
    fn device_type(&self) -> u32;
    /// The largest size of each queue; their count is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];
    /// One eventfd per queue, signalled by KVM (ioeventfd) when the guest notifies it.
    fn queue_events(&self) -> &[EventFd];
    /// Feature bits offered to the driver.
    fn avail_features(&self) -> u64;
    /// The features the driver accepted (always a subset of `avail_features`).
    fn set_acked_features(&mut self, features: u64);
    /// Reads the device configuration space; bytes past its end read as zero.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Changes each time the device changes its configuration space, so that the driver can
    /// tell a torn read of a multi-byte field.
    fn config_generation(&self) -> u32 {
        0
    }
    /// Writes the configuration space; most devices ignore it.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
    /// Starts the device on the driver's queues.
    fn activate(
        &mut self,
        mem: GuestMemory,
        queues: Vec<Queue>,
        irq: Arc<IrqTrigger>,
    ) -> Result<(), ActivateError>;
    /// Stops the device after a driver reset, returning it to its pre-activation state.
    fn reset(&mut self);
    /// The activated device's queues, in order, for a snapshot (empty before activation).
    /// A chain the device has taken but not given back is counted as not taken, so the
    /// restored device takes it again.
    fn queue_states(&self) -> Vec<QueueState>;
    /// Called once a restored device is active again and the VM's interrupt controllers are
    /// restored (vsock tells the guest its connections are gone here).
    fn restored(&mut self) {}
}

/// Copies `src[offset..]` into `data`, zero-filling whatever lies past the end.
pub fn read_config_bytes(src: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(start) = usize::try_from(offset) else {
        return;
    };
    if let Some(bytes) = src.get(start..) {
        let n = bytes.len().min(data.len());
        data[..n].copy_from_slice(&bytes[..n]);
    }
}

/// The driver's queues if there are `expected` of them and each lies in guest memory;
/// `fails` counts a refusal for an invalid queue (the device's `activate_fails`).
pub fn checked_queues(
    mem: &GuestMemory,
    queues: Vec<Queue>,
    expected: usize,
    fails: &telemetry::Counter,
) -> Result<Vec<Queue>, ActivateError> {
    use virtio_queue::QueueT;
    if queues.len() != expected {
        return Err(ActivateError::QueueCount {
            expected,
            found: queues.len(),
        });
    }
    if let Some(bad) = queues.iter().position(|q| !q.is_valid(mem)) {
        fails.inc();
        return Err(ActivateError::InvalidQueue(bad));
    }
    Ok(queues)
}
