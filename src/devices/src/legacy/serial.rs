//! COM1: vm-superio's 8250 UART, its output on ember's stdout and its input from ember's stdin.
//! Input that does not fit the UART's FIFO waits here and is fed in as the guest reads, so no
//! typed byte is dropped.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;

use event_manager::{EventOps, Events, MutEventSubscriber};
use serde::{Deserialize, Serialize};
use vm_superio::serial::{NoEvents, SerialState};
use vm_superio::Trigger;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use crate::bus::BusDevice;

/// Input waiting for FIFO space is bounded: past this, stdin is not read until the guest has
/// drained the buffer to half of it.
const MAX_PENDING_INPUT: usize = 64 * 1024;
/// Offset of the receive buffer register.
const RBR: u8 = 0;

/// Raises the UART's interrupt line through an irqfd.
#[derive(Debug)]
pub struct IrqFdTrigger(pub EventFd);

impl Trigger for IrqFdTrigger {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

type Uart = vm_superio::Serial<IrqFdTrigger, NoEvents, Box<dyn Write + Send>>;

/// The UART's registers and receive FIFO, as a snapshot keeps them (vm-superio's
/// `SerialState`, which has no serde support of its own).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SerialSnapshot {
    pub divisor_low: u8,
    pub divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    pub fifo: Vec<u8>,
}

/// The serial port and its input source.
pub struct Serial {
    uart: Uart,
    input: Option<File>,
    pending: VecDeque<u8>,
    /// Stdin is out of the epoll set while the buffer is full; `resume` brings it back.
    paused: bool,
    resume: EventFd,
}

impl std::fmt::Debug for Serial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serial")
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl Serial {
    /// `irq` is the irqfd of IRQ 4; `input` is read when it is readable (None: no input).
    pub fn new(
        irq: EventFd,
        output: Box<dyn Write + Send>,
        input: Option<File>,
    ) -> io::Result<Self> {
        Self::with_uart(vm_superio::Serial::new(IrqFdTrigger(irq), output), input)
    }

    fn with_uart(uart: Uart, input: Option<File>) -> io::Result<Self> {
        Ok(Serial {
            uart,
            input,
            pending: VecDeque::new(),
            paused: false,
            resume: EventFd::new(libc::EFD_NONBLOCK)?,
        })
    }

    /// A serial port whose UART starts in the state `saved` (a snapshot's); a FIFO longer
    /// than the UART's is refused.
    pub fn restored(
        irq: EventFd,
        output: Box<dyn Write + Send>,
        input: Option<File>,
        saved: &SerialSnapshot,
    ) -> io::Result<Self> {
        let state = SerialState {
            baud_divisor_low: saved.divisor_low,
            baud_divisor_high: saved.divisor_high,
            interrupt_enable: saved.interrupt_enable,
            interrupt_identification: saved.interrupt_identification,
            line_control: saved.line_control,
            line_status: saved.line_status,
            modem_control: saved.modem_control,
            modem_status: saved.modem_status,
            scratch: saved.scratch,
            in_buffer: saved.fifo.clone(),
        };
        let uart = vm_superio::Serial::from_state(&state, IrqFdTrigger(irq), NoEvents, output)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{e:?}")))?;
        Self::with_uart(uart, input)
    }

    /// The UART's state for a snapshot. Input not yet in the FIFO stays with this process.
    pub fn snapshot(&self) -> SerialSnapshot {
        let s = self.uart.state();
        SerialSnapshot {
            divisor_low: s.baud_divisor_low,
            divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            fifo: s.in_buffer,
        }
    }

    /// Moves waiting input into the FIFO as far as it has room.
    fn feed(&mut self) {
        let room = self.uart.fifo_capacity().min(self.pending.len());
        if room == 0 {
            return;
        }
        let bytes: Vec<u8> = self.pending.drain(..room).collect();
        if let Err(e) = self.uart.enqueue_raw_bytes(&bytes) {
            log::warn!("serial input interrupt failed: {e:?}");
        }
        if self.paused && self.pending.len() <= MAX_PENDING_INPUT / 2 {
            self.paused = false;
            let _ = self.resume.write(1);
        }
    }

    /// Queues bytes as if typed on stdin.
    pub fn push_input(&mut self, bytes: &[u8]) {
        self.pending.extend(bytes);
        self.feed();
    }
}

impl BusDevice for Serial {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let (Ok(offset), [byte]) = (u8::try_from(offset), &mut *data) else {
            data.fill(0);
            return;
        };
        *byte = self.uart.read(offset);
        if offset == RBR {
            self.feed();
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Ok(offset), [byte]) = (u8::try_from(offset), data) {
            if let Err(e) = self.uart.write(offset, *byte) {
                log::warn!("serial output failed: {e:?}");
            }
        }
    }
}

impl MutEventSubscriber for Serial {
    fn init(&mut self, ops: &mut EventOps) {
        if let Some(input) = &self.input {
            // Regular files and closed descriptors cannot be polled: the guest then has no input.
            if ops.add(Events::new(input, EventSet::IN)).is_err() {
                self.input = None;
                return;
            }
            let _ = ops.add(Events::new(&self.resume, EventSet::IN));
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let Some(input) = self.input.as_mut() else {
            return;
        };
        if events.fd() == self.resume.as_raw_fd() {
            let _ = self.resume.read();
            let _ = ops.add(Events::new(input, EventSet::IN));
            return;
        }
        if events.fd() != input.as_raw_fd() {
            return;
        }
        let mut buf = [0u8; 1024];
        let done = events
            .event_set()
            .intersects(EventSet::HANG_UP | EventSet::ERROR)
            && !events.event_set().contains(EventSet::IN);
        match if done { Ok(0) } else { input.read(&mut buf) } {
            Ok(0) | Err(_) => {
                let _ = ops.remove(Events::new(input, EventSet::IN));
                self.input = None;
            }
            Ok(n) => {
                self.pending.extend(&buf[..n]);
                if self.pending.len() >= MAX_PENDING_INPUT {
                    let _ = ops.remove(Events::new(input, EventSet::IN));
                    self.paused = true;
                }
                self.feed();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn guest_output_reaches_the_writer_and_input_beyond_the_fifo_is_kept() {
        let sink = Sink::default();
        let mut serial =
            Serial::new(EventFd::new(0).unwrap(), Box::new(sink.clone()), None).unwrap();
        for b in b"hi" {
            serial.write(0, &[*b]);
        }
        assert_eq!(&*sink.0.lock().unwrap(), b"hi");
        let typed: Vec<u8> = (0..200u8).collect();
        serial.push_input(&typed);
        let mut got = vec![];
        for _ in 0..200 {
            let mut b = [0u8];
            serial.read(0, &mut b);
            got.push(b[0]);
        }
        assert_eq!(got, typed);
    }

    #[test]
    fn a_restored_uart_has_the_saved_registers_and_fifo() {
        let mut serial = Serial::new(EventFd::new(0).unwrap(), Box::new(io::sink()), None).unwrap();
        serial.write(1, &[0x01]); // IER: receive interrupts
        serial.write(7, &[0x5a]); // scratch
        serial.push_input(b"abc");
        let saved = serial.snapshot();
        assert_eq!(saved.fifo, b"abc");
        let mut copy =
            Serial::restored(EventFd::new(0).unwrap(), Box::new(io::sink()), None, &saved).unwrap();
        assert_eq!(copy.snapshot(), saved);
        let mut b = [0u8];
        copy.read(7, &mut b);
        assert_eq!(b[0], 0x5a);
        copy.read(0, &mut b);
        assert_eq!(b[0], b'a');
        let too_long = SerialSnapshot {
            fifo: vec![0; 65],
            ..saved
        };
        let refused = Serial::restored(
            EventFd::new(0).unwrap(),
            Box::new(io::sink()),
            None,
            &too_long,
        );
        assert!(refused.is_err());
    }

    #[test]
    fn odd_sized_accesses_are_ignored() {
        let mut serial = Serial::new(EventFd::new(0).unwrap(), Box::new(io::sink()), None).unwrap();
        let mut wide = [0xffu8; 2];
        serial.read(0, &mut wide);
        assert_eq!(wide, [0, 0]);
        serial.write(0x1_0000_0000, &[1]);
    }
}
