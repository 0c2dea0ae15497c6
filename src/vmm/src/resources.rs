//! `VmResources`: everything the guest will be given, gathered before boot. The config file
//! lands here in one go ([`VmResources::from_json`]); the API lands here one request at a
//! time through the same `set_*` methods, so both see the same checks.

use crate::config::{
    parse_json, BootSourceConfig, ConfigError, DriveConfig, MachineConfig, VmConfig,
};

/// virtio-mmio devices get IRQs 5..=23.
pub const MAX_DRIVES: usize =
    (arch::layout::LAST_VIRTIO_IRQ - arch::layout::FIRST_VIRTIO_IRQ + 1) as usize;

#[derive(Debug, Clone, Default)]
pub struct VmResources {
    pub boot_source: Option<BootSourceConfig>,
    pub machine_config: MachineConfig,
    /// Kept with the root device first, so that it is /dev/vda.
    drives: Vec<DriveConfig>,
    /// `--boot-timer`: when the ember process started, for the guest's boot-time report.
    pub boot_timer: Option<std::time::Instant>,
}

impl VmResources {
    /// Parses and validates a `--config-file`.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let config: VmConfig = parse_json(text)?;
        config.check_later()?;
        let mut resources = VmResources::default();
        resources.set_boot_source(config.boot_source.ok_or(ConfigError::NoBootSource)?)?;
        if let Some(machine) = config.machine_config {
            resources.set_machine_config(machine)?;
        }
        for drive in config.drives {
            resources.add_drive(drive)?;
        }
        Ok(resources)
    }

    pub fn set_boot_source(&mut self, boot: BootSourceConfig) -> Result<(), ConfigError> {
        boot.validate()?;
        self.boot_source = Some(boot);
        Ok(())
    }

    pub fn set_machine_config(&mut self, machine: MachineConfig) -> Result<(), ConfigError> {
        machine.validate()?;
        self.machine_config = machine;
        Ok(())
    }

    /// Adds a drive. In a config file an ID may appear once; the API's PUT of an existing ID
    /// goes through [`VmResources::replace_drive`].
    pub fn add_drive(&mut self, drive: DriveConfig) -> Result<(), ConfigError> {
        if self.has_drive(&drive.drive_id) {
            return Err(ConfigError::DuplicateDriveId(drive.drive_id));
        }
        self.replace_drive(drive)
    }

    /// Inserts or replaces the drive with this ID.
    pub fn replace_drive(&mut self, drive: DriveConfig) -> Result<(), ConfigError> {
        drive.validate()?;
        let others = self.drives.iter().filter(|d| d.drive_id != drive.drive_id);
        if drive.is_root_device {
            if let Some(root) = others.clone().find(|d| d.is_root_device) {
                return Err(ConfigError::TwoRootDevices(
                    root.drive_id.clone(),
                    drive.drive_id,
                ));
            }
        }
        let count = others.count() + 1;
        if count > MAX_DRIVES {
            return Err(ConfigError::TooManyDrives {
                max: MAX_DRIVES,
                count,
            });
        }
        match self
            .drives
            .iter_mut()
            .find(|d| d.drive_id == drive.drive_id)
        {
            Some(slot) => *slot = drive,
            None => self.drives.push(drive),
        }
        // Stable: the root first, the others in the order given.
        self.drives.sort_by_key(|d| !d.is_root_device);
        Ok(())
    }

    pub fn drives(&self) -> &[DriveConfig] {
        &self.drives
    }

    pub fn has_drive(&self, id: &str) -> bool {
        self.drives.iter().any(|d| d.drive_id == id)
    }

    /// Everything configured, in the config-file format (`GET /vm/config`).
    pub fn to_config(&self) -> VmConfig {
        VmConfig::new(
            self.boot_source.clone(),
            self.drives.clone(),
            self.machine_config.clone(),
        )
    }
}
