//! The virtio-pci transport driven as Linux's virtio_pci_modern driver does, through
//! configuration space and the BAR, with a recording MSI router; and the accesses a hostile
//! driver might make.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::*;
use crate::pci::msix::Message;
use crate::virtio::test_utils::CountingDevice;
use crate::virtio::transport_state::{ACK, DRIVER, DRIVER_OK, FEATURES_OK};
use crate::virtio::{Interrupt, InterruptKind};

/// Every routing table the transport handed over, in order.
#[derive(Debug, Default)]
struct Routes(Mutex<Vec<Vec<Option<Message>>>>);

#[derive(Debug)]
struct Router(Arc<Routes>);

impl MsiRouter for Router {
    fn route(&self, messages: &[Option<Message>]) -> std::io::Result<()> {
        self.0 .0.lock().unwrap().push(messages.to_vec());
        Ok(())
    }
}

struct Fixture {
    t: PciTransport,
    device: Arc<Mutex<CountingDevice>>,
    irq: Arc<PciInterrupt>,
    irqfds: Vec<EventFd>,
    routes: Arc<Routes>,
    activations: Arc<AtomicU32>,
}

fn fixture() -> Fixture {
    let (device, activations) = CountingDevice::new(&[16, 8]);
    let device = Arc::new(Mutex::new(device));
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let irqfds: Vec<EventFd> = (0..3)
        .map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap())
        .collect();
    let ours = irqfds.iter().map(|e| e.try_clone().unwrap()).collect();
    let routes = Arc::new(Routes::default());
    let irq = Arc::new(PciInterrupt::new(2, ours, Box::new(Router(routes.clone()))));
    let mut t = PciTransport::new(device.clone(), mem, irq.clone());
    t.set_bar_address(0xe000_0000);
    Fixture {
        t,
        device,
        irq,
        irqfds,
        routes,
        activations,
    }
}

fn rd(t: &mut PciTransport, offset: u64, len: usize) -> u64 {
    let mut b = vec![0u8; len];
    t.bar_read(offset, &mut b);
    b.resize(8, 0);
    u64::from_le_bytes(b.try_into().unwrap())
}

fn wr(t: &mut PciTransport, offset: u64, len: usize, value: u64) {
    t.bar_write(offset, &value.to_le_bytes()[..len]);
}

fn cfg8(t: &PciTransport, offset: u64) -> u8 {
    let mut b = [0u8];
    t.config_read(offset, &mut b);
    b[0]
}

/// The capabilities' (ID, cfg_type, offset) in chain order.
fn capabilities(t: &PciTransport) -> Vec<(u8, u8, u32)> {
    let mut out = Vec::new();
    let mut at = cfg8(t, 0x34);
    while at != 0 {
        let mut off = [0u8; 4];
        t.config_read(u64::from(at) + 8, &mut off);
        out.push((
            cfg8(t, u64::from(at)),
            cfg8(t, u64::from(at) + 3),
            u32::from_le_bytes(off),
        ));
        at = cfg8(t, u64::from(at) + 1);
    }
    out
}

/// A fixture whose driver has done [`bring_up`].
fn running() -> Fixture {
    let mut f = fixture();
    bring_up(&mut f);
    f
}

/// What Linux does: status, features, both queues with a vector each, MSI-X on, DRIVER_OK.
fn bring_up(f: &mut Fixture) {
    let t = &mut f.t;
    wr(t, 0x14, 1, u64::from(ACK));
    wr(t, 0x14, 1, u64::from(ACK | DRIVER));
    wr(t, 0x00, 4, 1);
    assert_eq!(rd(t, 0x04, 4), 1, "VERSION_1 is bit 32");
    wr(t, 0x08, 4, 1);
    wr(t, 0x0c, 4, 1);
    wr(t, 0x14, 1, u64::from(ACK | DRIVER | FEATURES_OK));
    assert_eq!(rd(t, 0x14, 1), u64::from(ACK | DRIVER | FEATURES_OK));
    wr(t, 0x10, 2, 2); // config changes on vector 2
    for q in 0..2u64 {
        wr(t, 0x16, 2, q);
        wr(t, 0x18, 2, 8);
        wr(t, 0x1a, 2, q);
        assert_eq!(rd(t, 0x1a, 2), q, "the vector reads back");
        assert_eq!(rd(t, 0x1e, 2), q, "notify offset");
        let base = 0x1_0000 + q * 0x1000;
        wr(t, 0x20, 8, base);
        wr(t, 0x28, 4, base + 0x100);
        wr(t, 0x2c, 4, 0);
        wr(t, 0x30, 8, base + 0x200);
        wr(t, 0x1c, 2, 1);
    }
    // MSI-X on, then each vector's entry, unmasked.
    let control = f.t.msix_cap as u64 + 2;
    f.t.config_write(control, &(1u16 << 15).to_le_bytes());
    for v in 0..3u64 {
        wr(&mut f.t, 0x4000 + 16 * v, 8, 0xfee0_0000 + v);
        wr(&mut f.t, 0x4000 + 16 * v + 8, 4, 0x40 + v);
        wr(&mut f.t, 0x4000 + 16 * v + 12, 4, 0);
    }
    wr(
        &mut f.t,
        0x14,
        1,
        u64::from(ACK | DRIVER | FEATURES_OK | DRIVER_OK),
    );
}

#[test]
fn configuration_space_announces_a_modern_virtio_device_and_its_structures() {
    let f = fixture();
    let mut id = [0u8; 4];
    f.t.config_read(0, &mut id);
    assert_eq!(
        u32::from_le_bytes(id),
        0x106a_1af4,
        "the modern ID: 0x1040 + type 42"
    );
    assert_eq!(cfg8(&f.t, 8), 1, "revision 1");
    assert_eq!(
        capabilities(&f.t),
        vec![
            (0x11, 0x00, 0x6000),
            (0x09, CapType::Common as u8, 0x0000),
            (0x09, CapType::Notify as u8, 0x3000),
            (0x09, CapType::Isr as u8, 0x1000),
            (0x09, CapType::DeviceConfig as u8, 0x2000),
        ]
    );
    assert_eq!(f.t.bar_address(), Some(0xe000_0000));
}

#[test]
fn a_linux_like_bring_up_activates_the_device_and_queues_fire_their_vectors() {
    let mut f = running();
    assert_eq!(f.activations.load(Ordering::SeqCst), 1);
    assert_eq!(rd(&mut f.t, 0x12, 2), 2, "num_queues");
    // Every vector got its route once unmasked; the last table has all three.
    let routes = f.routes.0.lock().unwrap().clone();
    assert_eq!(
        routes.last().unwrap(),
        &(0..3u16)
            .map(|v| {
                Some(Message {
                    addr: 0xfee0_0000 + u64::from(v),
                    data: 0x40 + u32::from(v),
                })
            })
            .collect::<Vec<_>>()
    );
    f.irq.trigger(InterruptKind::Queue(1)).unwrap();
    assert_eq!(f.irqfds[1].read().unwrap(), 1);
    assert!(f.irqfds[0].read().is_err());
    f.irq.trigger(InterruptKind::Config).unwrap();
    assert_eq!(f.irqfds[2].read().unwrap(), 1);
    assert_eq!(
        rd(&mut f.t, 0x1000, 1),
        3,
        "ISR: queue and config, cleared by the read"
    );
    assert_eq!(rd(&mut f.t, 0x1000, 1), 0);
    // The device's own configuration is in its window.
    assert_eq!(rd(&mut f.t, 0x2000, 4), 0x0403_0201);
}

#[test]
fn a_masked_vector_holds_its_interrupt_until_unmasked() {
    let mut f = running();
    wr(&mut f.t, 0x4000 + 12, 4, 1);
    f.irq.trigger(InterruptKind::Queue(0)).unwrap();
    assert!(f.irqfds[0].read().is_err(), "masked");
    assert_eq!(rd(&mut f.t, 0x6000, 8), 1, "pending bit");
    wr(&mut f.t, 0x4000 + 12, 4, 0);
    assert_eq!(f.irqfds[0].read().unwrap(), 1, "sent on unmask");
    assert_eq!(rd(&mut f.t, 0x6000, 8), 0);
}

#[test]
fn hostile_accesses_change_nothing_they_should_not() {
    let mut f = fixture();
    // Queue set-up before FEATURES_OK is ignored.
    wr(&mut f.t, 0x16, 2, 0);
    wr(&mut f.t, 0x18, 2, 4);
    assert_eq!(rd(&mut f.t, 0x18, 2), 16);
    // A vector past the table reads back as "none"; a queue past the last reads as none.
    wr(&mut f.t, 0x10, 2, 77);
    assert_eq!(rd(&mut f.t, 0x10, 2), 0xffff);
    wr(&mut f.t, 0x16, 2, 9);
    assert_eq!(rd(&mut f.t, 0x1a, 2), 0xffff);
    assert_eq!(rd(&mut f.t, 0x18, 2), 0);
    // Wrong widths and offsets, inside and past every structure.
    for (off, len) in [
        (0x01u64, 4usize),
        (0x12, 4),
        (0x14, 2),
        (0x37, 1),
        (0x1003, 1),
        (0x2ffe, 4),
        (0x4001, 4),
        (0x6004, 2),
        (0x7ff8, 8),
        (BAR_SIZE, 4),
        (u64::MAX - 1, 2),
    ] {
        let before = rd(&mut f.t, 0x14, 1);
        wr(&mut f.t, off, len, u64::MAX);
        let mut b = vec![0xaau8; len];
        f.t.bar_read(off, &mut b);
        assert_eq!(rd(&mut f.t, 0x14, 1), before, "{off:#x}");
    }
    // Notifications to queues that do not exist, before and after DRIVER_OK.
    wr(&mut f.t, 0x3000 + 4 * 40, 2, 0);
    bring_up(&mut f);
    wr(&mut f.t, 0x3000 + 4 * 40, 2, 0);
    wr(&mut f.t, 0x3004, 2, 1);
    assert_eq!(lock(&f.device).queue_events()[1].read().unwrap(), 1);
    // Configuration space past the header and misaligned.
    f.t.config_write(0x100, &[1, 2, 3, 4]);
    f.t.config_write(0x35, &[0xff, 0xff]);
    let mut b = [0u8; 4];
    f.t.config_read(0x100, &mut b);
    assert_eq!(b, [0; 4]);
    // A reset forgets the vectors.
    wr(&mut f.t, 0x14, 1, 0);
    assert_eq!(rd(&mut f.t, 0x10, 2), 0xffff);
    assert_eq!(rd(&mut f.t, 0x14, 1), 0);
}

#[test]
fn a_snapshot_restores_vectors_routes_and_a_moved_bar_into_a_fresh_function() {
    let mut f = running();
    // The guest moved the BAR and masked vector 1, which then fired: pending.
    f.t.config_write(0x10, &0xe001_0000u32.to_le_bytes());
    wr(&mut f.t, 0x4000 + 16 + 12, 4, 1);
    f.irq.trigger(InterruptKind::Queue(1)).unwrap();
    let saved = f.t.snapshot();

    let mut g = fixture();
    g.t.restore(&saved).unwrap();
    assert_eq!(g.activations.load(Ordering::SeqCst), 1, "started again");
    assert_eq!(g.t.bar_address(), Some(0xe001_0000));
    assert_eq!(rd(&mut g.t, 0x1a, 2), 1, "queue 1's vector");
    assert_eq!(rd(&mut g.t, 0x6000, 8), 0b10, "vector 1 still pending");
    // KVM's routes are set from the restored table at once: vectors 0 and 2.
    let last = g.routes.0.lock().unwrap().last().cloned().unwrap();
    assert!(last[0].is_some() && last[1].is_none() && last[2].is_some());
    assert_eq!(g.t.snapshot(), saved);
    // Unmasking delivers what was pending before the snapshot.
    wr(&mut g.t, 0x4000 + 16 + 12, 4, 0);
    assert_eq!(g.irqfds[1].read().unwrap(), 1);
}

#[test]
fn a_snapshot_of_another_transport_or_layout_is_refused() {
    let f = running();
    let saved = f.t.snapshot();
    let mut mmio = saved.clone();
    mmio.pci = None;
    let e = fixture().t.restore(&mmio).unwrap_err().to_string();
    assert!(
        e.contains("is on virtio-mmio, this microVM's on virtio-pci"),
        "{e}"
    );
    // A read-only byte changed (the device ID), or a table of another size.
    let mut bad = saved.clone();
    bad.pci.as_mut().unwrap().config[2] ^= 1;
    let e = fixture().t.restore(&bad).unwrap_err().to_string();
    assert!(e.contains("read-only byte 0x2"), "{e}");
    let mut bad = saved.clone();
    bad.pci.as_mut().unwrap().config.truncate(64);
    assert!(fixture().t.restore(&bad).is_err());
    let mut bad = saved;
    bad.pci.as_mut().unwrap().vectors.queues.push(0);
    let e = fixture().t.restore(&bad).unwrap_err().to_string();
    assert!(e.contains("MSI-X vectors for 3 queues"), "{e}");
}
