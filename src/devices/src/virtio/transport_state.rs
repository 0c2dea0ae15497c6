//! What the guest's driver sets up through any virtio transport, and the rules it must
//! follow (virtio 1.x, 3.1): the device-status state machine, feature negotiation, queue
//! set-up, activation and reset. virtio-mmio and virtio-pci are two register maps over this
//! one state: a transport decodes an access and calls in here. Every value comes from the
//! guest, so every change is checked against the state the spec allows it in; anything else
//! is ignored, never trusted.

use std::sync::{Arc, Mutex};

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
    VIRTIO_F_VERSION_1,
};
use virtio_queue::{Queue, QueueT};

use super::snapshot::{PciSnapshot, QueueSnapshot, RestoreError, TransportSnapshot};
use super::{GuestMemory, Interrupt, InterruptKind, VirtioDevice};
use crate::bus::lock;

pub const ACK: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE;
pub const DRIVER: u32 = VIRTIO_CONFIG_S_DRIVER;
pub const FEATURES_OK: u32 = VIRTIO_CONFIG_S_FEATURES_OK;
pub const DRIVER_OK: u32 = VIRTIO_CONFIG_S_DRIVER_OK;
pub const FAILED: u32 = VIRTIO_CONFIG_S_FAILED;
pub const NEEDS_RESET: u32 = VIRTIO_CONFIG_S_NEEDS_RESET;

pub struct TransportState {
    pub device: Arc<Mutex<dyn VirtioDevice>>,
    pub mem: GuestMemory,
    irq: Arc<dyn Interrupt>,
    pub status: u32,
    pub device_features_sel: u32,
    pub driver_features_sel: u32,
    pub driver_features: u64,
    pub queue_sel: u32,
    /// The queues while the driver sets them up; the device owns them once activated.
    queues: Vec<Queue>,
    activated: bool,
    /// The guest may fail activation in a loop: logged sparingly.
    activation_log: telemetry::Sparse,
}

/// Written out, not derived: `dyn VirtioDevice` has no `Debug` on purpose (as a supertrait
/// it would keep every device's `Debug` code in the binary through the vtable, 57 KiB).
impl std::fmt::Debug for TransportState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportState")
            .field("status", &self.status)
            .field("activated", &self.activated)
            .finish()
    }
}

impl TransportState {
    pub fn new(
        device: Arc<Mutex<dyn VirtioDevice>>,
        mem: GuestMemory,
        irq: Arc<dyn Interrupt>,
    ) -> Self {
        let queues = fresh_queues(&*lock(&device));
        TransportState {
            device,
            mem,
            irq,
            status: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            queue_sel: 0,
            queues,
            activated: false,
            activation_log: telemetry::Sparse::per_minute(),
        }
    }

    /// The selected 32 bits of the features the device offers.
    pub fn device_features_word(&self) -> u32 {
        let offered = lock(&self.device).avail_features();
        match self.device_features_sel {
            0 => offered as u32,
            1 => (offered >> 32) as u32,
            _ => 0,
        }
    }

    /// The selected 32 bits of what the driver accepted.
    pub fn driver_features_word(&self) -> u32 {
        match self.driver_features_sel {
            0 => self.driver_features as u32,
            1 => (self.driver_features >> 32) as u32,
            _ => 0,
        }
    }

    /// The driver accepts features: only between DRIVER and FEATURES_OK.
    pub fn write_driver_features_word(&mut self, value: u32) {
        if self.status & (DRIVER | FEATURES_OK | FAILED) != DRIVER {
            return;
        }
        let v = u64::from(value);
        match self.driver_features_sel {
            0 => self.driver_features = (self.driver_features & !0xffff_ffff) | v,
            1 => self.driver_features = (self.driver_features & 0xffff_ffff) | (v << 32),
            _ => {}
        }
    }

    /// The selected queue as the driver sees it before activation (None once activated or
    /// for a selector past the last queue).
    pub fn selected_queue(&self) -> Option<&Queue> {
        self.queues.get(self.queue_sel as usize)
    }

    /// The selected queue, if its registers may change now: between FEATURES_OK and
    /// DRIVER_OK only.
    pub fn queue_to_set_up(&mut self) -> Option<&mut Queue> {
        if self.status & (FEATURES_OK | DRIVER_OK | FAILED) != FEATURES_OK {
            return None;
        }
        self.queues.get_mut(self.queue_sel as usize)
    }

    /// A notification that came as an exit rather than through the ioeventfd.
    pub fn notify(&self, queue: u32) {
        if self.status & DRIVER_OK == 0 {
            return;
        }
        let device = lock(&self.device);
        if let Some(evt) = device.queue_events().get(queue as usize) {
            let _ = evt.write(1);
        }
    }

    /// The driver writes the device status: a reset (0), or one more bit in the order the
    /// spec gives; anything else is ignored.
    pub fn set_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        let old = self.status;
        // Only a reset clears bits; anything else that drops one is a driver bug.
        if value & old != old {
            return;
        }
        let added = value & !old;
        let allowed = match added {
            FAILED => true,
            ACK => old == 0,
            DRIVER => old == ACK,
            FEATURES_OK => old == ACK | DRIVER && self.features_acceptable(),
            DRIVER_OK => old == ACK | DRIVER | FEATURES_OK,
            _ => false,
        };
        if !allowed {
            return;
        }
        self.status = value;
        if added == FEATURES_OK {
            lock(&self.device).set_acked_features(self.driver_features);
        }
        if added == DRIVER_OK {
            self.activate();
        }
    }

    /// The driver may accept only offered features, and must accept VIRTIO_F_VERSION_1.
    fn features_acceptable(&self) -> bool {
        let offered = lock(&self.device).avail_features();
        self.driver_features & !offered == 0
            && self.driver_features & (1 << VIRTIO_F_VERSION_1) != 0
    }

    fn activate(&mut self) {
        let bad = self
            .queues
            .iter()
            .position(|q| !(q.ready() && q.is_valid(&self.mem)));
        let result = match bad {
            // The device owns the queues from here on; a reset gives the transport fresh ones.
            None => {
                let queues = std::mem::take(&mut self.queues);
                lock(&self.device).activate(self.mem.clone(), queues, self.irq.clone())
            }
            Some(index) => Err(super::ActivateError::InvalidQueue(index)),
        };
        match result {
            Ok(()) => self.activated = true,
            Err(e) => {
                if let Some(held) = self.activation_log.admit() {
                    log::warn!(
                        "virtio device activation failed: {e} ({held} more since the last line)"
                    );
                }
                self.status |= NEEDS_RESET;
                let _ = self.irq.trigger(InterruptKind::Config);
            }
        }
    }

    /// Back to the state before the driver touched anything; the device is reset too.
    pub fn reset(&mut self) {
        if self.activated {
            lock(&self.device).reset();
            self.activated = false;
        }
        self.status = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.driver_features = 0;
        self.queue_sel = 0;
        self.queues = fresh_queues(&*lock(&self.device));
    }

    /// The driver-side state and the queues' positions, for a snapshot of a paused VM; the
    /// interrupt status and the PCI function's state are the transport's own.
    pub fn save(&self, interrupt_status: u32, pci: Option<PciSnapshot>) -> TransportSnapshot {
        let queues = match self.activated {
            true => lock(&self.device).queue_states(),
            false => self.queues.iter().map(Queue::state).collect(),
        };
        TransportSnapshot {
            device_type: lock(&self.device).device_type(),
            status: self.status,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            driver_features: self.driver_features,
            queue_sel: self.queue_sel,
            interrupt_status,
            activated: self.activated,
            queues: queues.into_iter().map(QueueSnapshot::from).collect(),
            pci,
        }
    }

    /// Puts a fresh state (and its device) where `saved` was; an activated device starts
    /// again on its saved queues. Nothing in `saved` is trusted: another queue count or a
    /// queue virtio-queue refuses is an error. (The transport has checked the device type
    /// and its own part: [`TransportSnapshot::check`].)
    pub fn restore(&mut self, saved: &TransportSnapshot) -> Result<(), RestoreError> {
        let device_type = lock(&self.device).device_type();
        if saved.queues.len() != self.queues.len() {
            return Err(RestoreError::QueueCount {
                device_type,
                saved: saved.queues.len(),
                here: self.queues.len(),
            });
        }
        let mut queues = Vec::with_capacity(saved.queues.len());
        for (index, (q, fresh)) in saved.queues.iter().zip(&self.queues).enumerate() {
            let bad = |reason: String| RestoreError::Queue {
                device_type,
                index,
                reason,
            };
            if q.max_size != fresh.max_size() {
                return Err(bad(format!("its largest size is {}", q.max_size)));
            }
            queues.push(q.to_queue().map_err(bad)?);
        }
        self.status = saved.status;
        self.device_features_sel = saved.device_features_sel;
        self.driver_features_sel = saved.driver_features_sel;
        self.driver_features = saved.driver_features & lock(&self.device).avail_features();
        self.queue_sel = saved.queue_sel;
        if self.status & FEATURES_OK != 0 {
            lock(&self.device).set_acked_features(self.driver_features);
        }
        if !saved.activated {
            self.queues = queues;
            return Ok(());
        }
        lock(&self.device)
            .activate(self.mem.clone(), queues, self.irq.clone())
            .map_err(|e| RestoreError::Activate {
                device_type,
                reason: e.to_string(),
            })?;
        self.activated = true;
        self.queues.clear();
        Ok(())
    }

    /// Lets a restored, activated device tell its guest what the restore changed (vsock's
    /// transport reset, the balloon's hinting stop).
    pub fn announce_restore(&mut self) {
        if self.activated {
            lock(&self.device).restored();
        }
    }
}

fn fresh_queues(device: &dyn VirtioDevice) -> Vec<Queue> {
    device
        .queue_max_sizes()
        .iter()
        .filter_map(|&max| Queue::new(max).ok())
        .collect()
}
