//! The virtio-pci transport (virtio 1.x, 4.1, modern only): a PCI function whose one 64-bit
//! memory BAR holds the common configuration, the ISR byte, the device's configuration, the
//! queue notification addresses and the MSI-X table and PBA, each announced by a capability
//! in configuration space. The driver-side rules are the [`TransportState`] virtio-mmio uses
//! too, so a device does not know its transport. The function sits on the root bus of
//! [`crate::pci::root`].

pub mod common_config;
pub mod interrupt;

use std::sync::{Arc, Mutex};

use crate::bus::lock;
use crate::pci::config::{Bar, ConfigSpace, Ids};
use crate::pci::msix;
use crate::pci::root::PciFunction;
use crate::virtio::snapshot::{PciSnapshot, RestoreError, TransportSnapshot};
use crate::virtio::transport_state::{TransportState, FAILED};
use crate::virtio::{GuestMemory, VirtioDevice};
pub use interrupt::{MsiRouter, PciInterrupt};

/// Red Hat's vendor ID, which virtio devices use; device IDs are 0x1040 + the virtio type.
const VIRTIO_VENDOR: u16 = 0x1af4;
const MODERN_DEVICE_BASE: u16 = 0x1040;

/// The BAR: one 4 KiB page per structure, the MSI-X table taking two.
pub const BAR_SIZE: u64 = 0x8000;
const PAGE: u64 = 0x1000;
/// Queue `n` is notified by a write at `n * NOTIFY_MULTIPLIER` into the notification page.
const NOTIFY_MULTIPLIER: u32 = 4;
const DEVICE_CONFIG_LEN: u64 = PAGE;

/// The structures in the BAR, each numbered by the page it starts at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Region {
    Common = 0,
    Isr = 1,
    DeviceConfig = 2,
    Notify = 3,
    MsixTable = 4,
    MsixPba = 6,
}

impl Region {
    const ALL: [Region; 6] = [
        Region::Common,
        Region::Isr,
        Region::DeviceConfig,
        Region::Notify,
        Region::MsixTable,
        Region::MsixPba,
    ];

    /// Where the structure starts in the BAR.
    const fn start(self) -> u64 {
        self as u64 * PAGE
    }

    /// The structure a BAR offset falls in, and the offset within it.
    fn at(offset: u64) -> Option<(Region, u64)> {
        let region = Self::ALL
            .into_iter()
            .find(|r| r.start() == offset / PAGE * PAGE)?;
        Some((region, offset - region.start()))
    }
}

/// Where in the BAR a write notifies queue `queue`.
pub fn notify_offset(queue: usize) -> u64 {
    Region::Notify.start() + queue as u64 * u64::from(NOTIFY_MULTIPLIER)
}

/// The `cfg_type` of a virtio capability: which structure it points at.
enum CapType {
    Common = 1,
    Notify = 2,
    Isr = 3,
    DeviceConfig = 4,
}

/// PCI's capability ID for a vendor-specific capability, which virtio's are.
const CAP_VENDOR: u8 = 0x09;

/// A virtio capability (`virtio_pci_cap`) for BAR 0, with `extra` after it.
fn virtio_cap(cfg_type: CapType, region: Region, len: u64, extra: &[u8]) -> Vec<u8> {
    let mut c = vec![
        CAP_VENDOR,
        0,
        (16 + extra.len()) as u8,
        cfg_type as u8,
        0,
        0,
        0,
        0,
    ];
    c.extend_from_slice(&(region.start() as u32).to_le_bytes());
    c.extend_from_slice(&(len as u32).to_le_bytes());
    c.extend_from_slice(extra);
    c
}

/// The PCI class of each virtio device type (network, mass storage, other).
fn class(device_type: u32) -> u32 {
    match device_type {
        1 => 0x02_00_00,
        2 => 0x01_80_00,
        _ => 0xff_00_00,
    }
}

#[derive(Debug)]
pub struct PciTransport {
    state: TransportState,
    irq: Arc<PciInterrupt>,
    config: ConfigSpace,
    /// Where the MSI-X capability sits in configuration space.
    msix_cap: usize,
}

impl PciTransport {
    pub fn new(
        device: Arc<Mutex<dyn VirtioDevice>>,
        mem: GuestMemory,
        irq: Arc<PciInterrupt>,
    ) -> Self {
        let (device_type, queues) = {
            let d = lock(&device);
            (d.device_type(), d.queue_max_sizes().len() as u64)
        };
        let ids = Ids {
            vendor: VIRTIO_VENDOR,
            device: MODERN_DEVICE_BASE + device_type as u16,
            revision: 1,
            class: class(device_type),
            subsystem_vendor: VIRTIO_VENDOR,
            subsystem: 0x40,
        };
        let mut config = ConfigSpace::new(ids, &[Bar { size: BAR_SIZE }]);
        let (cap, writable) = irq
            .msix
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .capability(
                0,
                Region::MsixTable.start() as u32,
                Region::MsixPba.start() as u32,
            );
        let msix_cap = config.add_capability(&cap, &writable);
        config.add_capability(
            &virtio_cap(CapType::Common, Region::Common, common_config::LEN, &[]),
            &[],
        );
        let notify_len = queues * u64::from(NOTIFY_MULTIPLIER);
        let notify = virtio_cap(
            CapType::Notify,
            Region::Notify,
            notify_len,
            &NOTIFY_MULTIPLIER.to_le_bytes(),
        );
        config.add_capability(&notify, &[]);
        config.add_capability(&virtio_cap(CapType::Isr, Region::Isr, 1, &[]), &[]);
        config.add_capability(
            &virtio_cap(
                CapType::DeviceConfig,
                Region::DeviceConfig,
                DEVICE_CONFIG_LEN,
                &[],
            ),
            &[],
        );
        PciTransport {
            state: TransportState::new(device, mem, irq.clone()),
            irq,
            config,
            msix_cap,
        }
    }

    /// Where the guest (or Ember, before boot) placed the BAR.
    pub fn bar_address(&self) -> Option<u64> {
        self.config.bar_address(0)
    }

    pub fn set_bar_address(&mut self, addr: u64) {
        self.config.set_bar_address(0, addr);
    }

    /// A configuration-space read (through ECAM).
    pub fn config_read(&self, offset: u64, data: &mut [u8]) {
        self.config.read(offset, data);
    }

    /// A configuration-space write; a write to the MSI-X control word enables, disables or
    /// masks the vectors and their routes follow.
    pub fn config_write(&mut self, offset: u64, data: &[u8]) {
        self.config.write(offset, data);
        let control = self.msix_cap as u64 + 2;
        if offset <= control + 1 && offset + data.len() as u64 > control {
            let word = self.config.word(self.msix_cap + 2);
            let released = self
                .irq
                .msix
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .set_control(word);
            self.irq.update_routes(released);
        }
    }

    /// A read in the BAR, at `offset` from its start.
    pub fn bar_read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Some((region, at)) = Region::at(offset) else {
            return;
        };
        match region {
            Region::Common => common_config::read(&self.state, &self.irq, at, data),
            Region::Isr if at == 0 && data.len() == 1 => data[0] = self.irq.read_isr(),
            Region::DeviceConfig => lock(&self.state.device).read_config(at, data),
            Region::MsixTable => self.msix().table_read(at, data),
            Region::MsixPba => self.msix().pba_read(at, data),
            Region::Isr | Region::Notify => {}
        }
    }

    /// A write in the BAR.
    pub fn bar_write(&mut self, offset: u64, data: &[u8]) {
        let Some((region, at)) = Region::at(offset) else {
            return;
        };
        match region {
            Region::Common => common_config::write(&mut self.state, &self.irq, at, data),
            Region::DeviceConfig if self.state.status & FAILED == 0 => {
                lock(&self.state.device).write_config(at, data);
            }
            Region::Notify => {
                // A notification that came as an exit rather than through the ioeventfd.
                self.state
                    .notify((at / u64::from(NOTIFY_MULTIPLIER)) as u32);
            }
            Region::MsixTable => {
                let released = self.msix().table_write(at, data);
                self.irq.update_routes(released);
            }
            Region::DeviceConfig | Region::Isr | Region::MsixPba => {}
        }
    }

    /// The function's state for a snapshot of a paused VM.
    pub fn snapshot(&self) -> TransportSnapshot {
        let pci = PciSnapshot {
            config: self.config.bytes().to_vec(),
            msix: self.msix().clone(),
            vectors: lock(&self.irq.vectors).clone(),
        };
        self.state.save(u32::from(self.irq.isr()), Some(pci))
    }

    /// Puts a fresh function (and its device) in the state `saved`, its MSI-X routes in
    /// KVM included; nothing in `saved` is trusted (see [`ConfigSpace::restore_bytes`],
    /// [`PciInterrupt::restore`]). The caller moves the BAR's ioeventfds if the BAR moved.
    pub fn restore(&mut self, saved: &TransportSnapshot) -> Result<(), RestoreError> {
        let device_type = lock(&self.state.device).device_type();
        saved.check(device_type, true)?;
        let invalid = |reason| RestoreError::Pci {
            device_type,
            reason,
        };
        if let Some(pci) = &saved.pci {
            self.config.restore_bytes(&pci.config).map_err(invalid)?;
            let isr = saved.interrupt_status as u8;
            self.irq
                .restore(&pci.msix, &pci.vectors, isr)
                .map_err(invalid)?;
        }
        self.state.restore(saved)
    }

    /// Lets a restored, activated device tell its guest what the restore changed.
    pub fn announce_restore(&mut self) {
        self.state.announce_restore();
    }

    fn msix(&self) -> std::sync::MutexGuard<'_, msix::Msix> {
        self.irq.msix.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl PciFunction for PciTransport {
    fn config_read(&self, offset: u64, data: &mut [u8]) {
        PciTransport::config_read(self, offset, data);
    }

    fn config_write(&mut self, offset: u64, data: &[u8]) {
        PciTransport::config_write(self, offset, data);
    }

    fn bar(&self) -> Option<(u64, u64)> {
        let addr = self.config.bar_address(0)?;
        self.config.memory_enabled().then_some((addr, BAR_SIZE))
    }

    fn bar_read(&mut self, offset: u64, data: &mut [u8]) {
        PciTransport::bar_read(self, offset, data);
    }

    fn bar_write(&mut self, offset: u64, data: &[u8]) {
        PciTransport::bar_write(self, offset, data);
    }
}

#[cfg(test)]
mod tests;
