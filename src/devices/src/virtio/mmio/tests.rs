//! The virtio-mmio register file and status machine, driven as a guest driver would, plus the
//! out-of-order and malformed writes a hostile one might make.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::*;
use crate::virtio::test_utils::CountingDevice;
use crate::virtio::transport_state::*;

struct Fixture {
    transport: MmioTransport,
    device: Arc<Mutex<CountingDevice>>,
    activations: Arc<AtomicU32>,
}

fn fixture() -> Fixture {
    let (device, activations) = CountingDevice::new(&[16, 8]);
    let device = Arc::new(Mutex::new(device));
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let irq = Arc::new(IrqTrigger::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()));
    let transport = MmioTransport::new(device.clone(), mem, irq);
    Fixture {
        transport,
        device,
        activations,
    }
}

fn rd(t: &mut MmioTransport, offset: u64) -> u32 {
    let mut b = [0u8; 4];
    t.read(offset, &mut b);
    u32::from_le_bytes(b)
}

fn wr(t: &mut MmioTransport, offset: u64, value: u32) {
    t.write(offset, &value.to_le_bytes());
}

/// Every status step done: the driver is running.
const STARTED: u32 = ACK | DRIVER | FEATURES_OK | DRIVER_OK;

/// Sets up both queues in valid, non-overlapping memory.
fn setup_queues(t: &mut MmioTransport) {
    for (q, base) in [(0u32, 0x1_0000u32), (1, 0x2_0000)] {
        wr(t, REG_QUEUE_SEL, q);
        wr(t, REG_QUEUE_NUM, 8);
        wr(t, REG_QUEUE_DESC_LOW, base);
        wr(t, REG_QUEUE_AVAIL_LOW, base + 0x1000);
        wr(t, REG_QUEUE_USED_LOW, base + 0x2000);
        wr(t, REG_QUEUE_READY, 1);
    }
}

fn negotiate(t: &mut MmioTransport, features_hi: u32, features_lo: u32) {
    wr(t, REG_STATUS, ACK);
    wr(t, REG_STATUS, ACK | DRIVER);
    wr(t, REG_DRIVER_FEATURES_SEL, 0);
    wr(t, REG_DRIVER_FEATURES, features_lo);
    wr(t, REG_DRIVER_FEATURES_SEL, 1);
    wr(t, REG_DRIVER_FEATURES, features_hi);
    wr(t, REG_STATUS, ACK | DRIVER | FEATURES_OK);
}

#[test]
fn identification_registers() {
    let mut f = fixture();
    let t = &mut f.transport;
    assert_eq!(rd(t, REG_MAGIC), 0x7472_6976);
    assert_eq!(rd(t, REG_VERSION), 2);
    assert_eq!(rd(t, REG_DEVICE_ID), 42);
    wr(t, REG_DEVICE_FEATURES_SEL, 0);
    assert_eq!(rd(t, REG_DEVICE_FEATURES), 0b101);
    wr(t, REG_DEVICE_FEATURES_SEL, 1);
    assert_eq!(rd(t, REG_DEVICE_FEATURES), 1);
    wr(t, REG_DEVICE_FEATURES_SEL, 7);
    assert_eq!(rd(t, REG_DEVICE_FEATURES), 0);
    wr(t, REG_QUEUE_SEL, 1);
    assert_eq!(rd(t, REG_QUEUE_NUM_MAX), 8);
    wr(t, REG_QUEUE_SEL, 9);
    assert_eq!(rd(t, REG_QUEUE_NUM_MAX), 0, "no such queue");
    let mut cfg = [0u8; 4];
    t.read(CONFIG_SPACE + 6, &mut cfg);
    assert_eq!(cfg, [7, 8, 0, 0], "config past its end reads as zero");
}

#[test]
fn the_full_handshake_activates_the_device_once() {
    let mut f = fixture();
    negotiate(&mut f.transport, 1, 0b100);
    assert_eq!(f.transport.status(), ACK | DRIVER | FEATURES_OK);
    assert_eq!(
        f.device.lock().unwrap().common.acked_features(),
        (1 << 32) | 0b100
    );
    setup_queues(&mut f.transport);
    wr(&mut f.transport, REG_STATUS, STARTED);
    assert_eq!(f.activations.load(Ordering::SeqCst), 1);
    assert_eq!(f.transport.status() & NEEDS_RESET, 0);
    // Queue registers are frozen once running.
    wr(&mut f.transport, REG_QUEUE_SEL, 0);
    wr(&mut f.transport, REG_QUEUE_READY, 0);
    // A notify arriving as an MMIO write reaches the queue's eventfd.
    wr(&mut f.transport, REG_QUEUE_NOTIFY, 1);
    assert_eq!(
        f.device
            .lock()
            .unwrap()
            .common
            .queue_event(1)
            .read()
            .unwrap(),
        1
    );
    wr(&mut f.transport, REG_QUEUE_NOTIFY, 1000);
    // Reset returns everything to the start.
    wr(&mut f.transport, REG_STATUS, 0);
    assert_eq!(f.transport.status(), 0);
    assert_eq!(f.device.lock().unwrap().resets, 1);
    wr(&mut f.transport, REG_QUEUE_SEL, 0);
    assert_eq!(rd(&mut f.transport, REG_QUEUE_READY), 0);
    assert_eq!(rd(&mut f.transport, REG_QUEUE_NUM_MAX), 16);
}

/// A restored device raises its interrupts (vsock's transport reset) only when told to, once
/// the VM's interrupt controllers are restored: one raised during the transport's restore
/// would be overwritten by their saved state and lost.
#[test]
fn a_restored_device_announces_the_restore_only_when_asked() {
    let mut f = fixture();
    negotiate(&mut f.transport, 1, 0);
    setup_queues(&mut f.transport);
    wr(&mut f.transport, REG_STATUS, STARTED);
    let saved = f.transport.snapshot();
    let mut g = fixture();
    g.transport.restore(&saved).unwrap();
    assert_eq!(g.activations.load(Ordering::SeqCst), 1);
    assert_eq!(g.device.lock().unwrap().restored, 0);
    g.transport.announce_restore();
    assert_eq!(g.device.lock().unwrap().restored, 1);
    // A device the driver had not started has nothing to announce.
    let mut h = fixture();
    h.transport
        .restore(&fixture().transport.snapshot())
        .unwrap();
    h.transport.announce_restore();
    assert_eq!(h.device.lock().unwrap().restored, 0);
}

#[test]
fn features_without_version_1_or_not_offered_are_refused() {
    for (high, low, why) in [
        (0, 0b001, "no VERSION_1"),
        (1, 0b010, "bit 1 was never offered"),
        (1 | 0x8000, 0, "bit 47 was never offered"),
    ] {
        let mut f = fixture();
        negotiate(&mut f.transport, high, low);
        let status = f.transport.status();
        assert_eq!(status, ACK | DRIVER, "{why}: FEATURES_OK stays clear");
    }
}

#[test]
fn out_of_order_status_writes_are_ignored() {
    let mut f = fixture();
    let t = &mut f.transport;
    wr(t, REG_STATUS, DRIVER_OK);
    assert_eq!(t.status(), 0, "DRIVER_OK before anything");
    wr(t, REG_STATUS, STARTED);
    assert_eq!(t.status(), 0, "several steps at once");
    wr(t, REG_STATUS, ACK);
    wr(t, REG_STATUS, ACK | FEATURES_OK);
    assert_eq!(t.status(), ACK, "FEATURES_OK without DRIVER");
    wr(t, REG_STATUS, DRIVER);
    assert_eq!(t.status(), ACK, "clearing a bit without a reset");
    wr(t, REG_STATUS, ACK | FAILED);
    assert_eq!(t.status(), ACK | FAILED);
    assert_eq!(f.activations.load(Ordering::SeqCst), 0);
}

#[test]
fn invalid_queues_mean_needs_reset_not_activation() {
    let mut f = fixture();
    negotiate(&mut f.transport, 1, 0);
    // Queue 0 only, and with its rings outside the 1 MiB of guest memory.
    wr(&mut f.transport, REG_QUEUE_SEL, 0);
    wr(&mut f.transport, REG_QUEUE_NUM, 8);
    wr(&mut f.transport, REG_QUEUE_DESC_LOW, 0xfff0_0000);
    wr(&mut f.transport, REG_QUEUE_READY, 1);
    wr(&mut f.transport, REG_STATUS, STARTED);
    assert_eq!(f.activations.load(Ordering::SeqCst), 0);
    assert_ne!(f.transport.status() & NEEDS_RESET, 0);
    assert_ne!(
        rd(&mut f.transport, REG_INTERRUPT_STATUS) & 2,
        0,
        "config interrupt raised"
    );
    wr(&mut f.transport, REG_INTERRUPT_ACK, 2);
    assert_eq!(rd(&mut f.transport, REG_INTERRUPT_STATUS), 0);
}

#[test]
fn queue_setup_before_features_ok_and_odd_accesses_are_ignored() {
    let mut f = fixture();
    let t = &mut f.transport;
    wr(t, REG_QUEUE_SEL, 0);
    wr(t, REG_QUEUE_READY, 1);
    assert_eq!(rd(t, REG_QUEUE_READY), 0, "queue set-up before FEATURES_OK");
    negotiate(t, 1, 0);
    wr(t, REG_QUEUE_NUM, 7);
    wr(t, REG_QUEUE_NUM, 0x1_0000);
    // A 2-byte write and a misaligned one change nothing; a 2-byte read gives zeros.
    t.write(REG_STATUS, &[0, 0]);
    t.write(REG_STATUS + 1, &[0, 0, 0, 0]);
    assert_eq!(t.status(), ACK | DRIVER | FEATURES_OK);
    let mut half = [0xffu8; 2];
    t.read(REG_MAGIC, &mut half);
    assert_eq!(half, [0, 0]);
}
