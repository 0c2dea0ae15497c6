//! The two legacy devices a Linux guest on Ember needs: COM1 for its console and the i8042
//! for its reboot path; and Firecracker's boot timer.

pub mod boot_timer;
pub mod i8042;
pub mod serial;
pub mod serial_output;

pub use boot_timer::BootTimer;
pub use i8042::I8042;
pub use serial::Serial;
pub use serial::SerialSnapshot;
pub use serial_output::SerialOutput;
