//! A minimal i8042 keyboard controller: enough for Linux's probe (self-test, the command byte,
//! keyboard ACKs), the reset command 0xFE, which ends the VM, and one key combination the API
//! can press: Ctrl+Alt+Del (Firecracker's `SendCtrlAltDel`).

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

const CTR_KBD_INT: u8 = 0x01;
const CTR_KBD_DISABLED: u8 = 0x10;
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
const KBD_ACK: u8 = 0xfa;
const KBD_RESET: u8 = 0xff;
const KBD_BAT_OK: u8 = 0xaa;
const KBD_GET_ID: u8 = 0xf2;

/// The controller: a command byte, an output queue and the reset line.
#[derive(Debug)]
pub struct I8042 {
    reset: EventFd,
    irq: EventFd,
    ctr: u8,
    status: u8,
    /// A command waiting for its data byte on port 0x60.
    awaiting: Option<u8>,
    output: VecDeque<u8>,
}

impl I8042 {
    /// `reset` is signalled on command 0xFE; `irq` is the irqfd of IRQ 1.
    pub fn new(reset: EventFd, irq: EventFd) -> Self {
        I8042 {
            reset,
            irq,
            ctr: CTR_KBD_INT | CTR_TRANSLATE | 0x04,
            status: STATUS_SYSTEM | STATUS_UNLOCKED,
            awaiting: None,
            output: VecDeque::new(),
        }
    }

    fn push(&mut self, byte: u8) {
        if self.output.len() < OUTPUT_LIMIT {
            self.output.push_back(byte);
        }
        self.interrupt();
    }

    fn interrupt(&self) {
        if self.ctr & CTR_KBD_INT != 0 {
            let _ = self.irq.write(1);
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
        self.output.extend(keys);
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
            CMD_SELF_TEST => self.push(SELF_TEST_OK),
            CMD_KBD_TEST => self.push(0x00),
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
        let full = if self.output.is_empty() {
            0
        } else {
            STATUS_OUTPUT_FULL
        };
        self.status | full
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let value = match offset {
            DATA_OFFSET => {
                let byte = self.output.pop_front().unwrap_or(0);
                // Linux reads one byte per interrupt: raise another for the next one.
                if !self.output.is_empty() {
                    self.interrupt();
                }
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
        I8042::new(
            EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            EventFd::new(libc::EFD_NONBLOCK).unwrap(),
        )
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
    fn keyboard_reset_is_acknowledged() {
        let mut dev = device();
        dev.write(DATA_OFFSET, &[KBD_RESET]);
        assert_eq!(dev.irq.read().unwrap(), 2);
        assert_eq!(read(&mut dev, DATA_OFFSET), KBD_ACK);
        assert_eq!(
            dev.irq.read().unwrap(),
            1,
            "one more byte waits: another interrupt"
        );
        assert_eq!(read(&mut dev, DATA_OFFSET), KBD_BAT_OK);
        assert!(dev.irq.read().is_err(), "queue empty: no interrupt");
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
            dev.output.iter().copied().collect::<Vec<_>>(),
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
    }
}
