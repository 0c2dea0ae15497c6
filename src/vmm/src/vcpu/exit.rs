//! What a vCPU does with each KVM exit: a plain function from the exit and the buses to an
//! outcome, so that tests can feed it fabricated exits without a guest.

use devices::Bus;
use kvm_bindings::{KVM_SYSTEM_EVENT_RESET, KVM_SYSTEM_EVENT_SHUTDOWN};
use kvm_ioctls::VcpuExit;

use crate::{VcpuFailure, VmExit};

/// Port 0x80, the POST/delay port that kernels write to; nothing is there.
const DELAY_PORT: u16 = 0x80;

/// Keep running, or stop the VM for this reason.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Continue,
    /// KVM gave up on an instruction: the vCPU thread tries it itself ([`super::emulate`]).
    Emulate,
    Stop(VmExit),
}

/// Counts an exit by kind in the vCPU metrics.
pub fn count(exit: &VcpuExit<'_>, metrics: &telemetry::VcpuMetrics) {
    let counter = match exit {
        VcpuExit::IoIn(..) => &metrics.exit_io_in,
        VcpuExit::IoOut(..) => &metrics.exit_io_out,
        VcpuExit::MmioRead(..) => &metrics.exit_mmio_read,
        VcpuExit::MmioWrite(..) => &metrics.exit_mmio_write,
        VcpuExit::Hlt => &metrics.exit_hlt,
        VcpuExit::InternalError => &metrics.exit_emulated,
        _ => return,
    };
    counter.inc();
}

/// Routes port and MMIO accesses to the devices and turns the rest into an outcome.
pub fn handle(exit: VcpuExit<'_>, index: u8, pio: &Bus, mmio: &Bus) -> Outcome {
    match exit {
        VcpuExit::IoIn(port, data) => {
            if !pio.read(u64::from(port), data) {
                // Nothing there: the bus floats high.
                data.fill(0xff);
            }
            Outcome::Continue
        }
        VcpuExit::IoOut(port, data) => {
            if port != DELAY_PORT {
                pio.write(u64::from(port), data);
            }
            Outcome::Continue
        }
        VcpuExit::MmioRead(addr, data) => {
            if !mmio.read(addr, data) {
                data.fill(0);
            }
            Outcome::Continue
        }
        VcpuExit::MmioWrite(addr, data) => {
            mmio.write(addr, data);
            Outcome::Continue
        }
        // With the in-kernel irqchip HLT is handled by KVM; an exit here only means "run again".
        VcpuExit::Hlt | VcpuExit::IrqWindowOpen | VcpuExit::Intr => Outcome::Continue,
        // A triple fault: the CPU resets. Said in the log, as a supervisor sees exit status 0
        // for it as for a reboot.
        VcpuExit::Shutdown => {
            log::warn!(
                "vCPU {index}: the guest triple-faulted (KVM_EXIT_SHUTDOWN); the microVM resets"
            );
            Outcome::Stop(VmExit::Reset)
        }
        VcpuExit::SystemEvent(kind, _) => match kind {
            KVM_SYSTEM_EVENT_RESET => Outcome::Stop(VmExit::Reset),
            KVM_SYSTEM_EVENT_SHUTDOWN => Outcome::Stop(VmExit::PowerOff),
            other => stop(index, VcpuFailure::SystemEvent(other)),
        },
        VcpuExit::FailEntry(reason, cpu) => stop(index, VcpuFailure::FailEntry { reason, cpu }),
        VcpuExit::InternalError => Outcome::Emulate,
        other => stop(index, VcpuFailure::UnexpectedExit(format!("{other:?}"))),
    }
}

/// vCPU `index` stops the VM because of `failure`.
pub fn stop(index: u8, failure: VcpuFailure) -> Outcome {
    Outcome::Stop(VmExit::VcpuError { index, failure })
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::BusDevice;
    use std::sync::{Arc, Mutex};

    struct Recorder(Vec<(u64, Vec<u8>)>);
    impl BusDevice for Recorder {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(0x40 + offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.0.push((offset, data.to_vec()));
        }
    }

    fn buses() -> (Bus, Bus, Arc<Mutex<Recorder>>) {
        let dev = Arc::new(Mutex::new(Recorder(vec![])));
        let mut pio = Bus::new();
        pio.insert(0x3f8, 8, dev.clone()).unwrap();
        let mut mmio = Bus::new();
        mmio.insert(0xd000_0000, 0x1000, dev.clone()).unwrap();
        (pio, mmio, dev)
    }

    #[test]
    fn port_and_mmio_accesses_reach_the_device() {
        let (pio, mmio, dev) = buses();
        let mut b = [0u8; 1];
        assert_eq!(
            handle(VcpuExit::IoIn(0x3fd, &mut b), 0, &pio, &mmio),
            Outcome::Continue
        );
        assert_eq!(b[0], 0x45);
        assert_eq!(
            handle(VcpuExit::IoOut(0x3f8, b"A"), 0, &pio, &mmio),
            Outcome::Continue
        );
        let mut w = [0u8; 4];
        handle(VcpuExit::MmioRead(0xd000_0070, &mut w), 0, &pio, &mmio);
        assert_eq!(w, [0x40 + 0x70; 4]);
        handle(
            VcpuExit::MmioWrite(0xd000_0050, &[1, 0, 0, 0]),
            0,
            &pio,
            &mmio,
        );
        assert_eq!(
            dev.lock().unwrap().0,
            vec![(0, b"A".to_vec()), (0x50, vec![1, 0, 0, 0])]
        );
    }

    #[test]
    fn unmapped_reads_float() {
        let (pio, mmio, _) = buses();
        let mut b = [0u8; 2];
        handle(VcpuExit::IoIn(0x2f8, &mut b), 0, &pio, &mmio);
        assert_eq!(b, [0xff, 0xff]);
        let mut w = [9u8; 4];
        handle(VcpuExit::MmioRead(0x1234, &mut w), 0, &pio, &mmio);
        assert_eq!(w, [0; 4]);
    }

    #[test]
    fn reset_shutdown_and_failures_stop_the_vm() {
        let (pio, mmio, _) = buses();
        assert_eq!(
            handle(VcpuExit::Shutdown, 0, &pio, &mmio),
            Outcome::Stop(VmExit::Reset)
        );
        assert_eq!(
            handle(
                VcpuExit::SystemEvent(KVM_SYSTEM_EVENT_SHUTDOWN, &[]),
                0,
                &pio,
                &mmio
            ),
            Outcome::Stop(VmExit::PowerOff)
        );
        assert_eq!(
            handle(VcpuExit::InternalError, 2, &pio, &mmio),
            Outcome::Emulate
        );
        assert!(matches!(
            handle(VcpuExit::FailEntry(0x21, 1), 0, &pio, &mmio),
            Outcome::Stop(VmExit::VcpuError { index: 0, .. })
        ));
    }
}
