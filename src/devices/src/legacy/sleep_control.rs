//! The ACPI sleep control and status registers of a hardware-reduced machine, one I/O port
//! (the FADT points both at it). A guest powers off by writing SLP_EN with the `\_S5_` sleep
//! type; Ember then ends the VM as it does on an i8042 reset. Other sleep states are not
//! offered (the DSDT names only S5), so any other write is ignored, and reads give 0 (no
//! wake status).

use vmm_sys_util::eventfd::EventFd;

use crate::bus::BusDevice;

const SLP_EN: u8 = 1 << 5;
const SLP_TYP_SHIFT: u8 = 2;
const SLP_TYP_MASK: u8 = 0b111;

#[derive(Debug)]
pub struct SleepControl {
    /// Written when the guest asks for S5; the event loop ends the VM.
    power_off: EventFd,
    soft_off_type: u8,
}

impl SleepControl {
    /// `soft_off_type` is the S5 sleep type the DSDT's `\_S5_` announces.
    pub fn new(power_off: EventFd, soft_off_type: u8) -> Self {
        SleepControl {
            power_off,
            soft_off_type,
        }
    }
}

impl BusDevice for SleepControl {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, data: &[u8]) {
        let [value] = data else { return };
        let sleep_type = (value >> SLP_TYP_SHIFT) & SLP_TYP_MASK;
        if value & SLP_EN != 0 && sleep_type == self.soft_off_type {
            if let Err(e) = self.power_off.write(1) {
                log::error!("cannot signal the guest's power-off: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> (SleepControl, EventFd) {
        let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        (SleepControl::new(evt.try_clone().unwrap(), 5), evt)
    }

    #[test]
    fn slp_en_with_the_soft_off_type_powers_off() {
        let (mut dev, evt) = device();
        dev.write(0, &[(5 << 2) | SLP_EN]);
        assert_eq!(evt.read().unwrap(), 1);
    }

    #[test]
    fn other_writes_and_widths_do_nothing() {
        let (mut dev, evt) = device();
        // The wake-status clear Linux writes first, S5 without SLP_EN, S3 with it, and a
        // two-byte write.
        for data in [&[0x80][..], &[5 << 2], &[(3 << 2) | SLP_EN], &[0x34, 0]] {
            dev.write(0, data);
        }
        assert!(evt.read().is_err(), "nothing signalled");
        let mut b = [0xff; 2];
        dev.read(0, &mut b);
        assert_eq!(b, [0, 0]);
    }
}
