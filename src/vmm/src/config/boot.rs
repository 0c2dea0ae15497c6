//! `boot-source`: the kernel, its command line and an optional initrd.

use serde::{Deserialize, Serialize};

use hostfile::Kind;

use super::{check_readable, ConfigError};

/// Firecracker 1.16's default command line, used when `boot_args` is absent (its
/// `DEFAULT_KERNEL_CMDLINE`; since its ACPI support it no longer passes `i8042.nopnp`). Like
/// Firecracker, the builder adds `pci=off` unless `--enable-pci` is given.
pub const DEFAULT_BOOT_ARGS: &str = "reboot=k panic=1 nomodule 8250.nr_uarts=0 i8042.noaux \
     i8042.nomux i8042.dumbkbd swiotlb=noforce";

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BootSourceConfig {
    pub kernel_image_path: String,
    pub boot_args: Option<String>,
    pub initrd_path: Option<String>,
}

impl BootSourceConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_readable("the kernel image", &self.kernel_image_path, Kind::Regular)?;
        if let Some(initrd) = &self.initrd_path {
            check_readable("the initrd", initrd, Kind::Regular)?;
        }
        if self.boot_args.as_deref().is_some_and(|a| a.contains('\0')) {
            return Err(ConfigError::BootArgsNul);
        }
        Ok(())
    }

    pub fn boot_args(&self) -> &str {
        self.boot_args.as_deref().unwrap_or(DEFAULT_BOOT_ARGS)
    }
}
