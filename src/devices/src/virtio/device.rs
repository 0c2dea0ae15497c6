//! What a virtio device provides to the transport.

use std::sync::Arc;

use virtio_queue::{Queue, QueueState};
use vmm_sys_util::eventfd::EventFd;

use super::{GuestMemory, Interrupt, VirtioCommon};

#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    #[error("the device expects {expected} queues, the driver set up {found}")]
    QueueCount { expected: usize, found: usize },
    #[error("queue {0} is not valid in guest memory")]
    InvalidQueue(usize),
}

/// A virtio device type. Each embeds a [`VirtioCommon`] (type, features, queues,
/// configuration space, activation) and implements only what is its own: what it does when
/// the driver starts, resets or a snapshot restores it, and a configuration space it keeps
/// itself. The transport (virtio-mmio)
/// drives the device through this trait and knows nothing else of it.
pub trait VirtioDevice: Send {
    fn common(&self) -> &VirtioCommon;
    fn common_mut(&mut self) -> &mut VirtioCommon;
    /// The virtio device ID (2 for block, ...).
    fn device_type(&self) -> u32 {
        self.common().device_type()
    }
    /// Reads the device configuration space; bytes past its end read as zero.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(self.common().config_space(), offset, data);
    }
    /// Changes each time the device changes its configuration space, so that the driver can
    /// tell a torn read of a multi-byte field.
    fn config_generation(&self) -> u32 {
        self.common().config_generation()
    }
    /// Writes the configuration space; most devices ignore it.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
    /// The driver's queues are in place (on a vCPU thread): by default, the VMM thread is
    /// asked to serve whatever every queue already holds.
    fn activated(&mut self) {
        self.common().kick(0..self.common().queue_events().len());
    }
    /// The driver reset the device, whose queues are gone: drop what is the device's own.
    fn reset_device(&mut self) {}
    /// Called once a restored device is active again and the VM's interrupt controllers are
    /// restored (vsock tells the guest its connections are gone here).
    fn restored(&mut self) {}

    /// The largest size of each queue; their count is the number of queues.
    fn queue_max_sizes(&self) -> &[u16] {
        self.common().queue_max_sizes()
    }
    /// One eventfd per queue, signalled by KVM (ioeventfd) when the guest notifies it.
    fn queue_events(&self) -> &[EventFd] {
        self.common().queue_events()
    }
    /// Feature bits offered to the driver.
    fn avail_features(&self) -> u64 {
        self.common().avail_features()
    }
    /// The features the driver accepted (kept only where offered).
    fn set_acked_features(&mut self, features: u64) {
        self.common_mut().set_acked_features(features);
    }
    /// Starts the device on the driver's queues.
    fn activate(
        &mut self,
        mem: GuestMemory,
        queues: Vec<Queue>,
        irq: Arc<dyn Interrupt>,
    ) -> Result<(), ActivateError> {
        self.common_mut().activate(mem, queues, irq)?;
        self.activated();
        Ok(())
    }
    /// Stops the device after a driver reset, returning it to its pre-activation state.
    fn reset(&mut self) {
        self.common_mut().reset();
        self.reset_device();
    }
    /// The activated device's queues, in order, for a snapshot (empty before activation).
    /// A chain the device has taken but not given back is counted as not taken, so the
    /// restored device takes it again.
    fn queue_states(&self) -> Vec<QueueState> {
        self.common().queue_states()
    }
}

/// Implements [`VirtioDevice::common`] and [`VirtioDevice::common_mut`] for a device that
/// keeps its [`VirtioCommon`] in a field named `common`, as each of them does.
macro_rules! common_accessors {
    () => {
        fn common(&self) -> &$crate::virtio::VirtioCommon {
            &self.common
        }

        fn common_mut(&mut self) -> &mut $crate::virtio::VirtioCommon {
            &mut self.common
        }
    };
}
pub(crate) use common_accessors;

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
