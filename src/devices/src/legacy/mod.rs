//! The legacy devices a Linux guest on Ember needs: COM1 for its console, the i8042 for its
//! reboot path and the ACPI sleep control register for its power-off; and Firecracker's boot
//! timer.

pub mod boot_timer;
pub mod i8042;
pub mod serial;
pub mod serial_output;
pub mod sleep_control;

pub use boot_timer::BootTimer;
pub use i8042::I8042;
pub use serial::Serial;
pub use serial::SerialSnapshot;
pub use serial_output::SerialOutput;
pub use sleep_control::SleepControl;
