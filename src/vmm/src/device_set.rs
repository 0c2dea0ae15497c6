//! The devices of a built microVM, kept so that the API can reach them after boot and a
//! snapshot can save them. Virtio devices are kept by type and ID rather than in a field per
//! kind, so that a new kind of device needs no change here.

use std::any::Any;
use std::sync::{Arc, Mutex};

use devices::legacy::Serial;
use devices::virtio::pci::PciTransport;
use devices::virtio::MmioTransport;

/// A virtio device behind its lock, with the type erased.
type AnyDevice = Arc<dyn Any + Send + Sync>;

#[derive(Debug, Default)]
pub struct Devices {
    pub serial: Option<Arc<Mutex<Serial>>>,
    /// Every virtio-mmio transport, in the order of their MMIO windows.
    pub transports: Vec<Arc<Mutex<MmioTransport>>>,
    /// Under `--enable-pci`, every virtio-pci transport instead, in slot order.
    pub pci_transports: Vec<Arc<Mutex<PciTransport>>>,
    /// Every virtio device with its ID (a drive's or an interface's; a device of which
    /// there is at most one has its kind's name), in attach order.
    virtio: Vec<(String, AnyDevice)>,
}

impl Devices {
    pub fn add<D: Send + 'static>(&mut self, id: &str, device: Arc<Mutex<D>>) {
        self.virtio.push((id.to_string(), device));
    }

    /// The device of type `D` with this ID.
    pub fn get<D: 'static>(&self, id: &str) -> Option<&Mutex<D>> {
        self.virtio
            .iter()
            .filter(|(name, _)| name == id)
            .find_map(|(_, device)| device.downcast_ref())
    }

    /// The device of type `D`, for a kind of which there is at most one (the balloon).
    pub fn only<D: 'static>(&self) -> Option<&Mutex<D>> {
        self.all().next()
    }

    /// Every device of type `D`, in attach order.
    pub fn all<D: 'static>(&self) -> impl Iterator<Item = &Mutex<D>> {
        self.virtio.iter().filter_map(|(_, d)| d.downcast_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_found_by_type_and_id() {
        let mut set = Devices::default();
        set.add("a", Arc::new(Mutex::new(1u32)));
        set.add("b", Arc::new(Mutex::new(2u32)));
        set.add("a", Arc::new(Mutex::new("text")));
        assert_eq!(*set.get::<u32>("b").unwrap().lock().unwrap(), 2);
        assert_eq!(*set.get::<&str>("a").unwrap().lock().unwrap(), "text");
        assert!(set.get::<u64>("a").is_none());
        assert!(set.get::<u32>("c").is_none());
        let all: Vec<u32> = set.all::<u32>().map(|d| *d.lock().unwrap()).collect();
        assert_eq!(all, [1, 2]);
        assert_eq!(*set.only::<&str>().unwrap().lock().unwrap(), "text");
        assert!(set.only::<u64>().is_none());
    }
}
