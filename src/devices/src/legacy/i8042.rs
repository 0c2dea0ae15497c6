//! A minimal i8042 keyboard controller: enough for Linux's probe (self-test, the command byte,
//! keyboard ACKs), the reset command 0xFE, which ends the VM, and one key combination the API
//! can press: Ctrl+Alt+Del (Firecracker's `SendCtrlAltDel`).
//!
//! Its auxiliary (mouse) port behaves as a real controller's with nothing plugged in: the
//! port can be disabled and enabled, its interface test passes, the loopback command echoes
//! its byte as if the mouse had sent it (on IRQ 12), and a byte sent to the mouse is answered
//! by the controller's time-out. Linux's probe waits out a timeout (up to half a second of
//! polling each) for every command a controller leaves unanswered.

use std::collections::VecDeque;

use vmm_sys_util::eventfd::EventFd;

use crate::bus::BusDevice;

/// Offsets from port 0x60: data at 0x60, status/command at 0x64.
pub const DATA_OFFSET: u64 = 0;
pub const COMMAND_OFFSET: u64 = 4;
/// Ports 0x60..=0x64.
pub const PORT_RANGE: u64 = 5;

const STATUS_OUTPUT_FULL: u8 = 0x01;
const STATUS_SYSTEM: u8 = 0x04;
const STATUS_LAST_WAS_COMMAND: u8 = 0x08;
const STATUS_UNLOCKED: u8 = 0x10;
/// The byte in the output buffer came from the auxiliary port.
const STATUS_AUX_DATA: u8 = 0x20;
/// The device did not answer in time (a byte sent to the absent mouse).
const STATUS_TIMEOUT: u8 = 0x40;

const CTR_KBD_INT: u8 = 0x01;
const CTR_AUX_INT: u8 = 0x02;
const CTR_KBD_DISABLED: u8 = 0x10;
const CTR_AUX_DISABLED: u8 = 0x20;
/// The controller translates the keyboard's scan code set 2 into set 1.
const CTR_TRANSLATE: u8 = 0x40;

/// Ctrl, Alt and Del pressed, then released in reverse order: scan code set 1 (what a guest
/// reads when the controller translates) and set 2.
const CTRL_ALT_DEL_SET1: &[u8] = &[0x1d, 0x38, 0xe0, 0x53, 0xe0, 0xd3, 0xb8, 0x9d];
const CTRL_ALT_DEL_SET2: &[u8] = &[
    0x14, 0x11, 0xe0, 0x71, 0xe0, 0xf0, 0x71, 0xf0, 0x11, 0xf0, 0x14,
];
/// Room for a few replies and one whole key sequence; a guest that never reads cannot make
/// the queue grow past it.
const OUTPUT_LIMIT: usize = 16;

const CMD_READ_CTR: u8 = 0x20;
const CMD_WRITE_CTR: u8 = 0x60;
const CMD_AUX_DISABLE: u8 = 0xa7;
const CMD_AUX_ENABLE: u8 = 0xa8;
const CMD_AUX_TEST: u8 = 0xa9;
const CMD_SELF_TEST: u8 = 0xaa;
const CMD_KBD_TEST: u8 = 0xab;
const CMD_KBD_DISABLE: u8 = 0xad;
const CMD_KBD_ENABLE: u8 = 0xae;
const CMD_READ_OUTPUT_PORT: u8 = 0xd0;
const CMD_WRITE_OUTPUT_PORT: u8 = 0xd1;
const CMD_WRITE_KBD_OUTPUT: u8 = 0xd2;
const CMD_WRITE_AUX_OUTPUT: u8 = 0xd3;
const CMD_WRITE_AUX: u8 = 0xd4;
const CMD_RESET_CPU: u8 = 0xfe;

const SELF_TEST_OK: u8 = 0x55;
/// The interface tests' "no error".
const INTERFACE_OK: u8 = 0x00;
/// What the controller puts in the output buffer when the mouse does not answer.
const AUX_NO_DEVICE: u8 = 0xfe;
const KBD_ACK: u8 = 0xfa;
const KBD_RESET: u8 = 0xff;
const KBD_BAT_OK: u8 = 0xaa;
const KBD_GET_ID: u8 = 0xf2;

/// Which port a byte in the output buffer came from, as the status register tells the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The keyboard, or the controller itself answering a command.
    Keyboard,
    /// The auxiliary port (its loopback).
    Aux,
    /// The auxiliary port's time-out: no mouse answered.
    AuxTimeout,
}

impl Source {
    fn status_bits(self) -> u8 {
        match self {
            Source::Keyboard => 0,
            Source::Aux => STATUS_AUX_DATA,
            Source::AuxTimeout => STATUS_AUX_DATA | STATUS_TIMEOUT,
        }
    }
}

/// The controller: a command byte, an output queue and the reset line.
#[derive(Debug)]
pub struct I8042 {
    reset: EventFd,
    /// The irqfds of IRQ 1 (keyboard) and IRQ 12 (auxiliary port).
    kbd_irq: EventFd,
    aux_irq: EventFd,
    ctr: u8,
    status: u8,
    /// A command waiting for its data byte on port 0x60.
    awaiting: Option<u8>,
    output: VecDeque<(u8, Source)>,
}

impl I8042 {
    /// `reset` is signalled on command 0xFE; `kbd_irq` and `aux_irq` are the irqfds of IRQs
    /// 1 and 12.
    pub fn new(reset: EventFd, kbd_irq: EventFd, aux_irq: EventFd) -> Self {
        I8042 {
            reset,
            kbd_irq,
            aux_irq,
            ctr: CTR_KBD_INT | CTR_TRANSLATE | 0x04,
            status: STATUS_SYSTEM | STATUS_UNLOCKED,
            awaiting: None,
            output: VecDeque::new(),
        }
    }

    fn push(&mut self, byte: u8) {
        self.push_from(byte, Source::Keyboard);
    }

    fn push_from(&mut self, byte: u8, source: Source) {
        if self.output.len() < OUTPUT_LIMIT {
            self.output.push_back((byte, source));
        }
        self.interrupt();
    }

    /// Raises the interrupt of the port whose byte the guest reads next, if the command byte
    /// enables it.
    fn interrupt(&self) {
        let Some(&(_, source)) = self.output.front() else {
            return;
        };
        let (enabled, irq) = match source {
            Source::Keyboard => (self.ctr & CTR_KBD_INT != 0, &self.kbd_irq),
            Source::Aux | Source::AuxTimeout => (self.ctr & CTR_AUX_INT != 0, &self.aux_irq),
        };
        if enabled {
            let _ = irq.write(1);
        }
    }

    /// Queues the key sequence Ctrl+Alt+Del, whole or not at all; the guest reads it one
    /// byte per interrupt.
    pub fn press_ctrl_alt_del(&mut self) {
        let keys = if self.ctr & CTR_TRANSLATE != 0 {
            CTRL_ALT_DEL_SET1
        } else {
            CTRL_ALT_DEL_SET2
        };
        if self.output.len() + keys.len() > OUTPUT_LIMIT {
            log::warn!("i8042: the guest has not read its keyboard queue; Ctrl+Alt+Del dropped");
            return;
        }
        self.output
            .extend(keys.iter().map(|&k| (k, Source::Keyboard)));
        self.interrupt();
    }

    fn command(&mut self, cmd: u8) {
        self.status |= STATUS_LAST_WAS_COMMAND;
        match cmd {
            CMD_READ_CTR => self.push(self.ctr),
            CMD_WRITE_CTR
            | CMD_WRITE_OUTPUT_PORT
            | CMD_WRITE_KBD_OUTPUT
            | CMD_WRITE_AUX_OUTPUT
            | CMD_WRITE_AUX => self.awaiting = Some(cmd),
            CMD_AUX_DISABLE => self.ctr |= CTR_AUX_DISABLED,
            CMD_AUX_ENABLE => self.ctr &= !CTR_AUX_DISABLED,
            CMD_AUX_TEST | CMD_KBD_TEST => self.push(INTERFACE_OK),
            CMD_SELF_TEST => self.push(SELF_TEST_OK),
            CMD_KBD_DISABLE => self.ctr |= CTR_KBD_DISABLED,
            CMD_KBD_ENABLE => self.ctr &= !CTR_KBD_DISABLED,
            CMD_READ_OUTPUT_PORT => self.push(0x01),
            CMD_RESET_CPU => {
                if let Err(e) = self.reset.write(1) {
                    log::error!("i8042 reset could not be signalled: {e}");
                }
            }
            _ => {}
        }
    }

    fn data(&mut self, byte: u8) {
        self.status &= !STATUS_LAST_WAS_COMMAND;
        match self.awaiting.take() {
            Some(CMD_WRITE_CTR) => self.ctr = byte,
            Some(CMD_WRITE_KBD_OUTPUT) => self.push(byte),
            // The loopback: the byte comes back as if the mouse had sent it.
            Some(CMD_WRITE_AUX_OUTPUT) => self.push_from(byte, Source::Aux),
            // A byte for the mouse, which is not there: the controller times out.
            Some(CMD_WRITE_AUX) => self.push_from(AUX_NO_DEVICE, Source::AuxTimeout),
            Some(_) => {}
            // A byte for the keyboard itself.
            None => {
                self.push(KBD_ACK);
                match byte {
                    KBD_RESET => self.push(KBD_BAT_OK),
                    KBD_GET_ID => {
                        self.push(0xab);
                        self.push(0x83);
                    }
                    _ => {}
                }
            }
        }
    }

    fn status(&self) -> u8 {
        match self.output.front() {
            Some(&(_, source)) => self.status | STATUS_OUTPUT_FULL | source.status_bits(),
            None => self.status,
        }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let value = match offset {
            DATA_OFFSET => {
                let byte = self.output.pop_front().map_or(0, |(byte, _)| byte);
                // Linux reads one byte per interrupt: raise another for the next one.
                self.interrupt();
                byte
            }
            COMMAND_OFFSET => self.status(),
            _ => 0xff,
        };
        data.fill(0);
        if let Some(first) = data.first_mut() {
            *first = value;
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let [byte] = data else { return };
        match offset {
            DATA_OFFSET => self.data(*byte),
            COMMAND_OFFSET => self.command(*byte),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> I8042 {
        let evt = || EventFd::new(libc::EFD_NONBLOCK).unwrap();
        I8042::new(evt(), evt(), evt())
    }

    /// Linux's `__i8042_command`: the command, its parameter bytes, then as many answers as
    /// it expects, each of which must be waiting at once (Linux polls up to half a second
    /// for one that is not). Returns the answers with the status seen before each.
    fn command(dev: &mut I8042, cmd: u8, params: &[u8], answers: usize) -> Vec<(u8, u8)> {
        dev.write(COMMAND_OFFSET, &[cmd]);
        for p in params {
            dev.write(DATA_OFFSET, &[*p]);
        }
        (0..answers)
            .map(|_| {
                let status = read(dev, COMMAND_OFFSET);
                assert_ne!(
                    status & STATUS_OUTPUT_FULL,
                    0,
                    "command {cmd:#x} unanswered"
                );
                (status, read(dev, DATA_OFFSET))
            })
            .collect()
    }

    fn ctr(dev: &mut I8042) -> u8 {
        command(dev, CMD_READ_CTR, &[], 1)[0].1
    }

    fn read(dev: &mut I8042, offset: u64) -> u8 {
        let mut b = [0u8];
        dev.read(offset, &mut b);
        b[0]
    }

    #[test]
    fn reset_command_signals_the_reset_event() {
        let mut dev = device();
        assert!(dev.reset.read().is_err(), "nothing signalled yet");
        dev.write(COMMAND_OFFSET, &[CMD_RESET_CPU]);
        assert_eq!(dev.reset.read().unwrap(), 1);
    }

    #[test]
    fn self_test_and_command_byte_round_trip() {
        let mut dev = device();
        dev.write(COMMAND_OFFSET, &[CMD_SELF_TEST]);
        assert_eq!(read(&mut dev, COMMAND_OFFSET) & STATUS_OUTPUT_FULL, 1);
        assert_eq!(read(&mut dev, DATA_OFFSET), SELF_TEST_OK);
        assert_eq!(read(&mut dev, COMMAND_OFFSET) & STATUS_OUTPUT_FULL, 0);
        dev.write(COMMAND_OFFSET, &[CMD_WRITE_CTR]);
        dev.write(DATA_OFFSET, &[0x65]);
        dev.write(COMMAND_OFFSET, &[CMD_READ_CTR]);
        assert_eq!(read(&mut dev, DATA_OFFSET), 0x65);
    }

    #[test]
    fn aux_disable_and_enable_set_the_command_byte_bit() {
        // Linux's i8042_toggle_aux: the command, then the CTR until the bit follows.
        let mut dev = device();
        command(&mut dev, CMD_AUX_DISABLE, &[], 0);
        assert_ne!(ctr(&mut dev) & CTR_AUX_DISABLED, 0);
        command(&mut dev, CMD_AUX_ENABLE, &[], 0);
        assert_eq!(ctr(&mut dev) & CTR_AUX_DISABLED, 0);
    }

    #[test]
    fn aux_interface_test_passes() {
        let mut dev = device();
        let [(status, answer)] = command(&mut dev, CMD_AUX_TEST, &[], 1)[..] else {
            unreachable!()
        };
        assert_eq!(answer, INTERFACE_OK);
        assert_eq!(status & STATUS_AUX_DATA, 0, "the controller's own answer");
    }

    #[test]
    fn aux_loopback_echoes_from_the_aux_port() {
        let mut dev = device();
        // Interrupts off, as during Linux's first loopback test: polled, no IRQ at all.
        dev.ctr &= !(CTR_KBD_INT | CTR_AUX_INT);
        let got = command(&mut dev, CMD_WRITE_AUX_OUTPUT, &[0x5a], 1);
        assert_eq!(got[0].1, 0x5a);
        assert_ne!(got[0].0 & STATUS_AUX_DATA, 0, "Linux checks the AUX bit");
        assert!(dev.kbd_irq.read().is_err() && dev.aux_irq.read().is_err());
        assert_eq!(read(&mut dev, COMMAND_OFFSET) & STATUS_AUX_DATA, 0);
    }

    #[test]
    fn aux_loopback_raises_irq_12_when_enabled() {
        // Linux's AUX IRQ test: CTR with the AUX interrupt on, loopback 0xa5, and the byte
        // must arrive through IRQ 12 (else Linux waits 250 ms and drops the port).
        let mut dev = device();
        command(&mut dev, CMD_WRITE_CTR, &[CTR_KBD_INT | CTR_AUX_INT], 0);
        dev.write(COMMAND_OFFSET, &[CMD_WRITE_AUX_OUTPUT]);
        dev.write(DATA_OFFSET, &[0xa5]);
        assert_eq!(dev.aux_irq.read().unwrap(), 1);
        assert!(dev.kbd_irq.read().is_err(), "not the keyboard's line");
        let status = read(&mut dev, COMMAND_OFFSET);
        assert_eq!(status & (STATUS_OUTPUT_FULL | STATUS_AUX_DATA), 0x21);
        assert_eq!(read(&mut dev, DATA_OFFSET), 0xa5);
    }

    #[test]
    fn a_byte_for_the_absent_mouse_times_out() {
        let mut dev = device();
        command(&mut dev, CMD_WRITE_CTR, &[CTR_AUX_INT], 0);
        dev.write(COMMAND_OFFSET, &[CMD_WRITE_AUX]);
        dev.write(DATA_OFFSET, &[0xff]);
        assert_eq!(dev.aux_irq.read().unwrap(), 1);
        let status = read(&mut dev, COMMAND_OFFSET);
        assert_ne!(status & STATUS_TIMEOUT, 0);
        assert_ne!(status & STATUS_AUX_DATA, 0);
        assert_eq!(read(&mut dev, DATA_OFFSET), AUX_NO_DEVICE);
    }

    #[test]
    fn linux_probe_of_the_aux_port_waits_for_nothing() {
        // The whole of Linux 6.1's i8042_check_aux, in order; `command` fails at the first
        // answer that is not already waiting.
        let mut dev = device();
        let initial = ctr(&mut dev);
        let disabled = (initial | CTR_KBD_DISABLED | CTR_AUX_DISABLED) & !CTR_KBD_INT;
        command(&mut dev, CMD_WRITE_CTR, &[disabled], 0);
        let loop_back = command(&mut dev, CMD_WRITE_AUX_OUTPUT, &[0x5a], 1);
        assert_eq!(
            loop_back[0].1, 0x5a,
            "the loop works: no AUX_TEST, no broken loop"
        );
        command(&mut dev, CMD_AUX_DISABLE, &[], 0);
        assert_ne!(
            ctr(&mut dev) & CTR_AUX_DISABLED,
            0,
            "first try of toggle_aux(false)"
        );
        command(&mut dev, CMD_AUX_ENABLE, &[], 0);
        let enabled = ctr(&mut dev);
        assert_eq!(
            enabled & CTR_AUX_DISABLED,
            0,
            "first try of toggle_aux(true)"
        );
        command(&mut dev, CMD_WRITE_CTR, &[enabled | CTR_AUX_INT], 0);
        command(&mut dev, CMD_WRITE_AUX_OUTPUT, &[0xa5], 0);
        assert_eq!(dev.aux_irq.read().unwrap(), 1, "the IRQ test's interrupt");
        assert_eq!(read(&mut dev, COMMAND_OFFSET) & 0x21, 0x21);
        assert_eq!(read(&mut dev, DATA_OFFSET), 0xa5);
        assert_eq!(read(&mut dev, COMMAND_OFFSET) & STATUS_OUTPUT_FULL, 0);
    }

    #[test]
    fn keyboard_reset_is_acknowledged() {
        let mut dev = device();
        dev.write(DATA_OFFSET, &[KBD_RESET]);
        assert_eq!(dev.kbd_irq.read().unwrap(), 2);
        assert_eq!(read(&mut dev, DATA_OFFSET), KBD_ACK);
        assert_eq!(
            dev.kbd_irq.read().unwrap(),
            1,
            "one more byte waits: another interrupt"
        );
        assert_eq!(read(&mut dev, DATA_OFFSET), KBD_BAT_OK);
        assert!(dev.kbd_irq.read().is_err(), "queue empty: no interrupt");
    }

    #[test]
    fn ctrl_alt_del_in_the_scan_code_set_the_guest_reads() {
        let mut dev = device();
        dev.press_ctrl_alt_del();
        let got: Vec<u8> = (0..CTRL_ALT_DEL_SET1.len())
            .map(|_| read(&mut dev, DATA_OFFSET))
            .collect();
        assert_eq!(got, CTRL_ALT_DEL_SET1);
        dev.write(COMMAND_OFFSET, &[CMD_WRITE_CTR]);
        dev.write(DATA_OFFSET, &[CTR_KBD_INT]);
        dev.press_ctrl_alt_del();
        assert_eq!(
            dev.output.iter().map(|&(k, _)| k).collect::<Vec<_>>(),
            CTRL_ALT_DEL_SET2
        );
        // A guest that never reads: the second press does not fit and is dropped whole.
        dev.press_ctrl_alt_del();
        assert_eq!(dev.output.len(), CTRL_ALT_DEL_SET2.len());
    }

    #[test]
    fn a_flood_of_commands_stays_bounded() {
        let mut dev = device();
        for _ in 0..10_000 {
            dev.write(COMMAND_OFFSET, &[CMD_SELF_TEST]);
        }
        assert_eq!(dev.output.len(), OUTPUT_LIMIT);
        // The AUX port's loopback and its time-outs are bounded by the same queue.
        let mut dev = device();
        for i in 0..10_000u32 {
            let cmd = if i % 2 == 0 {
                CMD_WRITE_AUX_OUTPUT
            } else {
                CMD_WRITE_AUX
            };
            dev.write(COMMAND_OFFSET, &[cmd]);
            dev.write(DATA_OFFSET, &[i as u8]);
        }
        assert_eq!(dev.output.len(), OUTPUT_LIMIT);
    }
}
