//! `VmResources`: everything the guest will be given, gathered before boot. The config file
//! lands here in one go ([`VmResources::from_json`]); the API lands here one request at a
//! time through the same `set_*` methods, so both see the same checks.

use crate::config::{
    check_amount, parse_json, BalloonDeviceConfig, BalloonStatsUpdate, BalloonUpdate,
    BootSourceConfig, ConfigError, CpuConfig, CpuTemplate, DriveConfig, EntropyDeviceConfig,
    LoggerConfig, MachineConfig, MetricsConfig, MmdsConfig, NetworkInterfaceConfig, PartialDrive,
    PartialNetworkInterface, RateLimiterConfig, SerialConfig, StaticCpuTemplate, VmConfig,
    VsockDeviceConfig,
};

use crate::builder::VirtioSpec;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::Arc;

/// virtio-mmio devices (drives and network interfaces) get IRQs 5..=23.
pub const MAX_DEVICES: usize =
    (arch::layout::LAST_VIRTIO_IRQ - arch::layout::FIRST_VIRTIO_IRQ + 1) as usize;

/// A CPU template file larger than this is not one (Firecracker's are a few KiB).
const MAX_CPU_TEMPLATE_FILE: u64 = 1 << 20;

#[derive(Debug, Clone, Default)]
pub struct VmResources {
    pub boot_source: Option<BootSourceConfig>,
    pub machine_config: MachineConfig,
    /// A custom CPU template (`PUT /cpu-config`); a static one is in `machine_config`. The
    /// last one set wins.
    pub cpu_template: Option<CpuTemplate>,
    /// Kept with the root device first, so that it is /dev/vda.
    drives: Vec<DriveConfig>,
    network_interfaces: Vec<NetworkInterfaceConfig>,
    pub mmds_config: Option<MmdsConfig>,
    /// The entropy device, if there is one.
    entropy: Option<EntropyDeviceConfig>,
    /// The vsock device, if there is one, and the socket `PUT /vsock` bound for it.
    vsock: Option<(VsockDeviceConfig, Arc<UnixListener>)>,
    /// The balloon, if there is one; its target follows `PATCH /balloon` after boot too.
    balloon: Option<BalloonDeviceConfig>,
    /// The config file's `logger` and `metrics`, applied when ember starts.
    pub logger: Option<LoggerConfig>,
    pub metrics: Option<MetricsConfig>,
    /// `PUT /serial`: where the console output goes instead of stdout, and its rate.
    pub serial: Option<SerialConfig>,
    /// `--boot-timer`: when the ember process started, for the guest's boot-time report.
    pub boot_timer: Option<std::time::Instant>,
    /// `--enable-pci`: virtio devices on a PCI bus instead of virtio-mmio.
    pub pci_enabled: bool,
}

impl VmResources {
    /// Parses and validates a `--config-file`.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let config: VmConfig = parse_json(text)?;
        config.check_later()?;
        if config.boot_source.is_none() {
            return Err(ConfigError::NoBootSource);
        }
        Self::from_config(config)
    }

    /// A snapshot's configuration, checked as a config file's is; it needs no boot source.
    pub fn from_snapshot(config: VmConfig) -> Result<Self, ConfigError> {
        config.check_later()?;
        Self::from_config(config)
    }

    fn from_config(config: VmConfig) -> Result<Self, ConfigError> {
        let mut resources = VmResources::default();
        // `GET /vm/config` shows an unset boot source as an empty kernel path.
        if let Some(boot) = config
            .boot_source
            .filter(|b| !b.kernel_image_path.is_empty())
        {
            resources.set_boot_source(boot)?;
        }
        if let Some(machine) = config.machine_config {
            resources.set_machine_config(machine)?;
        }
        match config.cpu_config {
            None => {}
            Some(CpuConfig::Template(t)) => resources.set_cpu_template(t),
            Some(CpuConfig::Path(path)) => {
                let text = hostfile::read_to_string(Path::new(&path), MAX_CPU_TEMPLATE_FILE)
                    .map_err(|source| ConfigError::Unreadable {
                        what: "the CPU template",
                        path: path.clone(),
                        source,
                    })?;
                let template = crate::config::parse_json_in(&text, Some("cpu-config"))?;
                resources.set_cpu_template(template);
            }
        }
        for drive in config.drives {
            resources.add_drive(drive)?;
        }
        for iface in config.network_interfaces {
            if resources.has_iface(&iface.iface_id) {
                return Err(ConfigError::DuplicateIfaceId(iface.iface_id));
            }
            resources.replace_network_interface(iface)?;
        }
        if let Some(mmds) = config.mmds_config {
            resources.set_mmds_config(mmds)?;
        }
        if let Some(entropy) = config.entropy {
            resources.set_entropy(entropy)?;
        }
        if let Some(vsock) = config.vsock {
            resources.set_vsock(vsock)?;
        }
        if let Some(balloon) = config.balloon {
            resources.set_balloon(balloon)?;
        }
        resources.logger = config.logger;
        resources.metrics = config.metrics;
        Ok(resources)
    }

    pub fn set_boot_source(&mut self, boot: BootSourceConfig) -> Result<(), ConfigError> {
        boot.validate()?;
        self.boot_source = Some(boot);
        Ok(())
    }

    /// A new machine configuration. Its `cpu_template`, as in Firecracker: absent keeps the
    /// current template, "None" clears any, a static one replaces a custom one.
    pub fn set_machine_config(&mut self, mut machine: MachineConfig) -> Result<(), ConfigError> {
        machine.validate()?;
        match machine.cpu_template {
            None => machine.cpu_template = self.machine_config.cpu_template,
            Some(StaticCpuTemplate::None) => {
                machine.cpu_template = None;
                self.cpu_template = None;
            }
            Some(_) => self.cpu_template = None,
        }
        self.machine_config = machine;
        Ok(())
    }

    /// `PUT /serial`; the file is opened at `InstanceStart`.
    pub fn set_serial(&mut self, config: SerialConfig) -> Result<(), ConfigError> {
        config.validate()?;
        self.serial = Some(config);
        Ok(())
    }

    /// `PUT /cpu-config`: a custom template, which replaces a static one.
    pub fn set_cpu_template(&mut self, template: CpuTemplate) {
        self.machine_config.cpu_template = None;
        self.cpu_template = Some(template);
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
        if drive.io_engine == crate::config::IoEngine::Async {
            devices::virtio::block::probe_async_engine().map_err(|source| {
                ConfigError::NoIoUring {
                    drive: drive.drive_id.clone(),
                    source,
                }
            })?;
        }
        let others = self.drives.iter().filter(|d| d.drive_id != drive.drive_id);
        if drive.is_root_device {
            if let Some(root) = others.clone().find(|d| d.is_root_device) {
                return Err(ConfigError::TwoRootDevices(
                    root.drive_id.clone(),
                    drive.drive_id,
                ));
            }
        }
        self.check_device_count(
            others.count() + 1 + self.network_interfaces.len() + self.others(),
        )?;
        let id = drive.drive_id.clone();
        upsert(&mut self.drives, drive, |d| d.drive_id == id);
        // Stable: the root first, the others in the order given.
        self.drives.sort_by_key(|d| !d.is_root_device);
        Ok(())
    }

    /// Devices other than drives and interfaces that take an interrupt line.
    fn others(&self) -> usize {
        usize::from(self.entropy.is_some())
            + usize::from(self.balloon.is_some())
            + usize::from(self.vsock.is_some())
    }

    fn check_device_count(&self, count: usize) -> Result<(), ConfigError> {
        match count > MAX_DEVICES {
            true => Err(ConfigError::TooManyDevices {
                max: MAX_DEVICES,
                count,
            }),
            false => Ok(()),
        }
    }

    /// Inserts or replaces the interface with this ID; its MAC and TAP must be its own.
    pub fn replace_network_interface(
        &mut self,
        iface: NetworkInterfaceConfig,
    ) -> Result<(), ConfigError> {
        let others: Vec<&NetworkInterfaceConfig> = self
            .network_interfaces
            .iter()
            .filter(|i| i.iface_id != iface.iface_id)
            .collect();
        if let Some(other) = others
            .iter()
            .find(|o| o.host_dev_name == iface.host_dev_name)
        {
            return Err(ConfigError::DuplicateTap {
                tap: iface.host_dev_name,
                other: other.iface_id.clone(),
            });
        }
        if let Some(mac) = iface.guest_mac {
            if let Some(other) = others.iter().find(|o| o.guest_mac == Some(mac)) {
                return Err(ConfigError::DuplicateMac {
                    mac,
                    other: other.iface_id.clone(),
                });
            }
        }
        self.check_device_count(self.drives.len() + others.len() + 1 + self.others())?;
        iface.validate()?;
        let id = iface.iface_id.clone();
        upsert(&mut self.network_interfaces, iface, |i| i.iface_id == id);
        Ok(())
    }

    pub fn network_interfaces(&self) -> &[NetworkInterfaceConfig] {
        &self.network_interfaces
    }

    pub fn has_iface(&self, id: &str) -> bool {
        self.network_interfaces.iter().any(|i| i.iface_id == id)
    }

    /// `PUT /mmds/config`: every interface it names must exist already.
    pub fn set_mmds_config(&mut self, config: MmdsConfig) -> Result<(), ConfigError> {
        config.validate()?;
        if let Some(unknown) = config
            .network_interfaces
            .iter()
            .find(|id| !self.has_iface(id))
        {
            return Err(ConfigError::MmdsUnknownIface(unknown.clone()));
        }
        self.mmds_config = Some(config);
        Ok(())
    }

    /// Every virtio device's configuration, in attach order (a snapshot's devices are
    /// matched to these by that order): drives (the root first), interfaces, then the
    /// entropy device, the balloon and vsock.
    pub(crate) fn virtio_devices(&self) -> Vec<&dyn VirtioSpec> {
        let drives = self.drives.iter().map(|d| d as &dyn VirtioSpec);
        let ifaces = self.network_interfaces.iter().map(|i| i as &dyn VirtioSpec);
        let entropy = self.entropy.iter().map(|e| e as &dyn VirtioSpec);
        let balloon = self.balloon.iter().map(|b| b as &dyn VirtioSpec);
        let vsock = self.vsock.iter().map(|v| v as &dyn VirtioSpec);
        drives
            .chain(ifaces)
            .chain(entropy)
            .chain(balloon)
            .chain(vsock)
            .collect()
    }

    /// `PUT /entropy`: adds the entropy device, or replaces its configuration.
    pub fn set_entropy(&mut self, config: EntropyDeviceConfig) -> Result<(), ConfigError> {
        config.validate()?;
        if self.entropy.is_none() {
            let count = self.drives.len() + self.network_interfaces.len() + self.others() + 1;
            self.check_device_count(count)?;
        }
        self.entropy = Some(config);
        Ok(())
    }

    pub fn entropy(&self) -> Option<&EntropyDeviceConfig> {
        self.entropy.as_ref()
    }

    /// `PUT /vsock`: adds the vsock device, or replaces it. Like Firecracker, ember listens
    /// on `uds_path` from here on (host processes may connect before the guest boots), and
    /// refuses a path that exists.
    pub fn set_vsock(&mut self, config: VsockDeviceConfig) -> Result<(), ConfigError> {
        config.validate()?;
        if self.vsock.is_none() {
            let count = self.drives.len() + self.network_interfaces.len() + self.others() + 1;
            self.check_device_count(count)?;
        }
        let listener = match self.vsock.take() {
            Some((old, listener)) if old.uds_path == config.uds_path => listener,
            old => {
                let listener = UnixListener::bind(&config.uds_path).map_err(|source| {
                    ConfigError::VsockListen {
                        path: config.uds_path.clone(),
                        source,
                    }
                });
                let listener = match listener {
                    Ok(l) => l,
                    Err(e) => {
                        self.vsock = old;
                        return Err(e);
                    }
                };
                if let Some((old, _)) = old {
                    let _ = std::fs::remove_file(&old.uds_path);
                }
                Arc::new(listener)
            }
        };
        self.vsock = Some((config, listener));
        Ok(())
    }

    /// The vsock device's configuration and listening socket.
    pub fn vsock(&self) -> Option<(&VsockDeviceConfig, &Arc<UnixListener>)> {
        self.vsock.as_ref().map(|(c, l)| (c, l))
    }

    /// `PUT /balloon`: adds the balloon, or replaces its configuration.
    pub fn set_balloon(&mut self, config: BalloonDeviceConfig) -> Result<(), ConfigError> {
        config.validate(self.machine_config.mem_size_mib)?;
        if self.balloon.is_none() {
            let count = self.drives.len() + self.network_interfaces.len() + self.others() + 1;
            self.check_device_count(count)?;
        }
        self.balloon = Some(config);
        Ok(())
    }

    /// `PATCH /balloon`: a new target (checked against guest memory).
    pub fn patch_balloon(&mut self, update: BalloonUpdate) -> Result<(), ConfigError> {
        let mem = self.machine_config.mem_size_mib;
        let balloon = self.balloon.as_mut().ok_or(ConfigError::NoBalloon)?;
        check_amount(update.amount_mib, mem)?;
        balloon.amount_mib = update.amount_mib;
        Ok(())
    }

    /// `PATCH /balloon/statistics`; after boot only to another non-zero interval.
    pub fn patch_balloon_stats(
        &mut self,
        update: BalloonStatsUpdate,
        booted: bool,
    ) -> Result<(), ConfigError> {
        let balloon = self.balloon.as_mut().ok_or(ConfigError::NoBalloon)?;
        let (was, now) = (
            balloon.stats_polling_interval_s,
            update.stats_polling_interval_s,
        );
        if booted && (was == 0) != (now == 0) {
            return Err(ConfigError::BalloonStatsOnOff);
        }
        balloon.stats_polling_interval_s = now;
        Ok(())
    }

    pub fn balloon(&self) -> Option<&BalloonDeviceConfig> {
        self.balloon.as_ref()
    }

    /// Records a `PATCH` that the running drive took, for `GET /vm/config`.
    pub fn patch_drive(&mut self, patch: &PartialDrive) {
        let drive = self
            .drives
            .iter_mut()
            .find(|d| d.drive_id == patch.drive_id);
        if let Some(d) = drive {
            if let Some(path) = &patch.path_on_host {
                d.path_on_host = path.clone();
            }
            if let Some(limiter) = &patch.rate_limiter {
                d.rate_limiter = RateLimiterConfig::patched(d.rate_limiter, limiter);
            }
        }
    }

    /// Records a `PATCH` that the running interface took, for `GET /vm/config`.
    pub fn patch_network_interface(&mut self, patch: &PartialNetworkInterface) {
        let ifaces = &mut self.network_interfaces;
        if let Some(i) = ifaces.iter_mut().find(|i| i.iface_id == patch.iface_id) {
            if let Some(l) = &patch.rx_rate_limiter {
                i.rx_rate_limiter = RateLimiterConfig::patched(i.rx_rate_limiter, l);
            }
            if let Some(l) = &patch.tx_rate_limiter {
                i.tx_rate_limiter = RateLimiterConfig::patched(i.tx_rate_limiter, l);
            }
        }
    }

    pub fn drives(&self) -> &[DriveConfig] {
        &self.drives
    }

    pub fn has_drive(&self, id: &str) -> bool {
        self.drives.iter().any(|d| d.drive_id == id)
    }

    /// Everything configured, in the config-file format (`GET /vm/config`).
    pub fn to_config(&self) -> VmConfig {
        VmConfig {
            boot_source: Some(self.boot_source.clone().unwrap_or_default()),
            drives: self.drives.clone(),
            network_interfaces: self.network_interfaces.clone(),
            mmds_config: self.mmds_config.clone(),
            vsock: self.vsock.as_ref().map(|(c, _)| VsockDeviceConfig {
                vsock_id: None,
                ..c.clone()
            }),
            entropy: self.entropy.clone(),
            balloon: self.balloon.clone(),
            cpu_config: self.cpu_template.clone().map(CpuConfig::Template),
            ..VmConfig::new(self.machine_config.clone())
        }
    }
}

/// Replaces the item of `list` that `same` picks out with `item`, or adds `item` at the end.
fn upsert<T>(list: &mut Vec<T>, item: T, same: impl Fn(&T) -> bool) {
    match list.iter_mut().find(|t| same(t)) {
        Some(slot) => *slot = item,
        None => list.push(item),
    }
}
