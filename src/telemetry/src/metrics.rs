//! The metrics Ember reports, under Firecracker's section and field names where Firecracker
//! has them: per-device counters (`block_<id>`, `net_<id>`, and their sums `block`, `net`),
//! API request counts (`get_api_requests`, `put_api_requests`, `patch_api_requests`), vCPU
//! exits (`vcpu`), the latest snapshot, pause and resume durations (`latencies_us`), and,
//! beyond Firecracker, the API's request latency (`api_server`).
//!
//! Devices, vCPUs and the API thread hold their own counters ([`std::sync::Arc`]s from the
//! [`Metrics`] registry) and bump them without locks; the VMM thread writes one JSON line
//! per flush ([`Metrics::line`]) with what changed since the previous one.

use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

use crate::counter::{Counter, MaxGauge};

/// Declares a struct of counters and the function that reports them by name.
macro_rules! counters {
    ($(#[$meta:meta])* $name:ident { $($field:ident),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        pub struct $name {
            $(pub $field: Counter,)*
        }

        impl $name {
            /// Each counter's change since the last report, by Firecracker's name.
            pub fn take(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($field), self.$field.take()),)*]
            }
        }
    };
}

/// Declares the counters of a virtio device: `activate_fails` first, which every device has
/// and [`DeviceMetrics`] hands to the device layer, then the device's own.
macro_rules! device_counters {
    ($(#[$meta:meta])* $name:ident { $($field:ident),* $(,)? }) => {
        counters!($(#[$meta])* $name { activate_fails, $($field),* });

        impl DeviceMetrics for $name {
            fn activate_fails(&self) -> &Counter {
                &self.activate_fails
            }
        }
    };
}

/// What the device layer counts for every virtio device, whatever its type.
pub trait DeviceMetrics: std::fmt::Debug + Send + Sync {
    /// Activations refused because a queue the driver set up is not valid.
    fn activate_fails(&self) -> &Counter;
}

device_counters!(
    /// One virtio-blk device.
    BlockMetrics {
        cfg_fails,
        event_fails,
        execute_fails,
        invalid_reqs_count,
        flush_count,
        queue_event_count,
        rate_limiter_event_count,
        rate_limiter_throttled_events,
        update_count,
        update_fails,
        read_bytes,
        write_bytes,
        read_count,
        write_count,
    }
);

device_counters!(
    /// The entropy device (Firecracker's `entropy` section, and `invalid_reqs_count`).
    EntropyMetrics {
        entropy_event_fails,
        entropy_event_count,
        entropy_bytes,
        host_rng_fails,
        entropy_rate_limiter_throttled,
        rate_limiter_event_count,
        invalid_reqs_count,
    }
);

device_counters!(
    /// The balloon (Firecracker's `balloon` section, and `invalid_reqs_count`).
    BalloonMetrics {
        inflate_count,
        deflate_count,
        stats_updates_count,
        stats_update_fails,
        event_fails,
        invalid_reqs_count,
        free_page_report_count,
        free_page_report_freed,
        free_page_report_fails,
        free_page_hint_count,
        free_page_hint_freed,
        free_page_hint_fails,
    }
);

device_counters!(
    /// The vsock device (Firecracker's `vsock` section).
    VsockMetrics {
        rx_queue_event_count,
        tx_queue_event_count,
        muxer_event_fails,
        conn_event_fails,
        rx_bytes_count,
        tx_bytes_count,
        rx_packets_count,
        tx_packets_count,
        conns_added,
        conns_killed,
        conns_removed,
        tx_write_fails,
        rx_read_fails,
        invalid_packets,
    }
);

device_counters!(
    /// One virtio-net device.
    NetMetrics {
        event_fails,
        no_rx_avail_buffer,
        rx_queue_event_count,
        rx_event_rate_limiter_count,
        rx_rate_limiter_throttled,
        rx_tap_event_count,
        rx_bytes_count,
        rx_packets_count,
        rx_fails,
        rx_count,
        tap_read_fails,
        tap_write_fails,
        tx_bytes_count,
        tx_malformed_frames,
        tx_fails,
        tx_count,
        tx_packets_count,
        tx_queue_event_count,
        tx_rate_limiter_event_count,
        tx_rate_limiter_throttled,
    }
);

counters!(
    /// The serial console (Firecracker's `uart` section, the bytes it counts).
    UartMetrics {
        missed_write_count,
        write_count,
        rate_limiter_dropped_bytes,
    }
);

counters!(
    /// All vCPUs together: KVM exits by kind, and exits that ended the vCPU.
    VcpuMetrics {
        exit_io_in,
        exit_io_out,
        exit_mmio_read,
        exit_mmio_write,
        exit_hlt,
        exit_emulated,
        failures,
    }
);

counters!(GetRequests {
    instance_info_count,
    machine_cfg_count,
    mmds_count,
    vmm_version_count,
    vm_config_count,
});

counters!(PutRequests {
    actions_count,
    actions_fails,
    boot_source_count,
    boot_source_fails,
    drive_count,
    drive_fails,
    logger_count,
    logger_fails,
    machine_cfg_count,
    machine_cfg_fails,
    metrics_count,
    metrics_fails,
    mmds_count,
    mmds_fails,
    network_count,
    network_fails,
});

counters!(PatchRequests {
    drive_count,
    drive_fails,
    machine_cfg_count,
    machine_cfg_fails,
    mmds_count,
    mmds_fails,
    network_count,
    network_fails,
    vm_count,
    vm_fails,
});

/// What the API thread counts.
#[derive(Debug, Default)]
pub struct ApiMetrics {
    pub get: GetRequests,
    pub put: PutRequests,
    pub patch: PatchRequests,
    /// Every request answered, whatever its path.
    pub request_count: Counter,
    /// Requests answered with a status of 400 or more.
    pub request_fails: Counter,
    /// Microseconds from a complete request to its answer being queued.
    pub latency_us_total: Counter,
    pub latency_us_max: MaxGauge,
}

impl ApiMetrics {
    /// Counts one answered request: `resource` is the path's first segment.
    pub fn record(&self, method: &str, resource: &str, failed: bool, latency_us: u64) {
        self.request_count.inc();
        self.latency_us_total.add(latency_us);
        self.latency_us_max.observe(latency_us);
        if failed {
            self.request_fails.inc();
        }
        let (get, put, patch) = (&self.get, &self.put, &self.patch);
        let (count, fails) = match (method, resource) {
            ("GET", "") => (&get.instance_info_count, None),
            ("GET", "machine-config") => (&get.machine_cfg_count, None),
            ("GET", "mmds") => (&get.mmds_count, None),
            ("GET", "version") => (&get.vmm_version_count, None),
            ("GET", "vm") => (&get.vm_config_count, None),
            ("PUT", "actions") => (&put.actions_count, Some(&put.actions_fails)),
            ("PUT", "boot-source") => (&put.boot_source_count, Some(&put.boot_source_fails)),
            ("PUT", "drives") => (&put.drive_count, Some(&put.drive_fails)),
            ("PUT", "logger") => (&put.logger_count, Some(&put.logger_fails)),
            ("PUT", "machine-config") => (&put.machine_cfg_count, Some(&put.machine_cfg_fails)),
            ("PUT", "metrics") => (&put.metrics_count, Some(&put.metrics_fails)),
            ("PUT", "mmds") => (&put.mmds_count, Some(&put.mmds_fails)),
            ("PUT", "network-interfaces") => (&put.network_count, Some(&put.network_fails)),
            ("PATCH", "drives") => (&patch.drive_count, Some(&patch.drive_fails)),
            ("PATCH", "machine-config") => {
                (&patch.machine_cfg_count, Some(&patch.machine_cfg_fails))
            }
            ("PATCH", "mmds") => (&patch.mmds_count, Some(&patch.mmds_fails)),
            ("PATCH", "network-interfaces") => (&patch.network_count, Some(&patch.network_fails)),
            ("PATCH", "vm") => (&patch.vm_count, Some(&patch.vm_fails)),
            _ => return,
        };
        count.inc();
        if let (true, Some(fails)) = (failed, fails) {
            fails.inc();
        }
    }
}

/// Every metric of one ember process.
#[derive(Debug, Default)]
pub struct Metrics {
    pub api: ApiMetrics,
    pub vcpu: VcpuMetrics,
    pub entropy: Arc<EntropyMetrics>,
    pub balloon: Arc<BalloonMetrics>,
    pub vsock: Arc<VsockMetrics>,
    pub uart: Arc<UartMetrics>,
    pub latencies: crate::latency::LatencyMetrics,
    blocks: Mutex<Vec<(String, Arc<BlockMetrics>)>>,
    nets: Mutex<Vec<(String, Arc<NetMetrics>)>>,
    /// Metric lines the destination could not take.
    pub missed_lines: Counter,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The counters registered under `id`, made on first use (a retried build reuses them).
fn entry<T: Default>(list: &Mutex<Vec<(String, Arc<T>)>>, id: &str) -> Arc<T> {
    let mut list = lock(list);
    if let Some((_, m)) = list.iter().find(|(name, _)| name == id) {
        return m.clone();
    }
    let m = Arc::new(T::default());
    list.push((id.to_string(), m.clone()));
    m
}

fn object(fields: &[(&'static str, u64)]) -> Value {
    Value::Object(
        fields
            .iter()
            .map(|&(k, v)| (k.to_string(), Value::from(v)))
            .collect(),
    )
}

/// Per-device sections and their sum under `kind`.
fn devices<T: Default>(
    out: &mut Map<String, Value>,
    kind: &str,
    list: &Mutex<Vec<(String, Arc<T>)>>,
    take: fn(&T) -> Vec<(&'static str, u64)>,
) {
    let list = lock(list);
    let mut sum: Vec<(&'static str, u64)> = Vec::new();
    for (id, m) in list.iter() {
        let fields = take(m);
        if sum.is_empty() {
            sum = fields.iter().map(|&(k, _)| (k, 0)).collect();
        }
        for (total, &(_, v)) in sum.iter_mut().zip(&fields) {
            total.1 = total.1.saturating_add(v);
        }
        out.insert(format!("{kind}_{id}"), object(&fields));
    }
    if sum.is_empty() {
        // No device of this kind: the section still lists its fields, at zero.
        sum = take(&T::default());
    }
    out.insert(kind.to_string(), object(&sum));
}

impl Metrics {
    pub fn block(&self, id: &str) -> Arc<BlockMetrics> {
        entry(&self.blocks, id)
    }

    pub fn net(&self, id: &str) -> Arc<NetMetrics> {
        entry(&self.nets, id)
    }

    /// One JSON line (with its newline) of everything that changed since the last one.
    pub fn line(&self) -> String {
        let mut out = Map::new();
        out.insert(
            "utc_timestamp_ms".into(),
            Value::from(crate::time::utc_ms()),
        );
        let api = &self.api;
        let server = [
            ("request_count", api.request_count.take()),
            ("request_fails", api.request_fails.take()),
            ("request_latency_us_total", api.latency_us_total.take()),
            ("request_latency_us_max", api.latency_us_max.take()),
            ("missed_metrics_lines", self.missed_lines.take()),
        ];
        out.insert("api_server".into(), object(&server));
        out.insert("get_api_requests".into(), object(&api.get.take()));
        out.insert("put_api_requests".into(), object(&api.put.take()));
        out.insert("patch_api_requests".into(), object(&api.patch.take()));
        devices(&mut out, "block", &self.blocks, BlockMetrics::take);
        devices(&mut out, "net", &self.nets, NetMetrics::take);
        out.insert("entropy".into(), object(&self.entropy.take()));
        out.insert("balloon".into(), object(&self.balloon.take()));
        out.insert("vsock".into(), object(&self.vsock.take()));
        out.insert("uart".into(), object(&self.uart.take()));
        out.insert("vcpu".into(), object(&self.vcpu.take()));
        let latencies = self.latencies.report().into_iter();
        let latencies = latencies.map(|(k, v)| (k, Value::from(v))).collect();
        out.insert("latencies_us".into(), Value::Object(latencies));
        let mut line = Value::Object(out).to_string();
        line.push('\n');
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_reports_each_device_and_their_sum_since_the_last_line() {
        let m = Metrics::default();
        let a = m.block("rootfs");
        let b = m.block("data");
        assert!(Arc::ptr_eq(&a, &m.block("rootfs")));
        a.read_bytes.add(4096);
        b.read_bytes.add(512);
        m.net("eth0").tx_bytes_count.add(60);
        m.api.record("PUT", "drives", true, 30);
        m.api.record("GET", "", false, 10);
        let v: Value = serde_json::from_str(&m.line()).unwrap();
        assert_eq!(v["block_rootfs"]["read_bytes"], 4096);
        assert_eq!(v["block_data"]["read_bytes"], 512);
        assert_eq!(v["block"]["read_bytes"], 4608);
        assert_eq!(v["net_eth0"]["tx_bytes_count"], 60);
        assert_eq!(v["net"]["tx_bytes_count"], 60);
        assert_eq!(v["put_api_requests"]["drive_count"], 1);
        assert_eq!(v["put_api_requests"]["drive_fails"], 1);
        assert_eq!(v["get_api_requests"]["instance_info_count"], 1);
        assert_eq!(v["api_server"]["request_count"], 2);
        assert_eq!(v["api_server"]["request_latency_us_total"], 40);
        assert_eq!(v["api_server"]["request_latency_us_max"], 30);
        assert!(v["utc_timestamp_ms"].as_u64().unwrap() > 1_700_000_000_000);

        let again: Value = serde_json::from_str(&m.line()).unwrap();
        assert_eq!(again["block"]["read_bytes"], 0);
        assert_eq!(again["block_rootfs"]["read_bytes"], 0);
        assert_eq!(again["api_server"]["request_count"], 0);
    }

    #[test]
    fn sections_exist_without_devices() {
        let v: Value = serde_json::from_str(&Metrics::default().line()).unwrap();
        assert_eq!(v["block"]["read_bytes"], 0);
        assert_eq!(v["net"]["rx_bytes_count"], 0);
        assert_eq!(v["vcpu"]["exit_mmio_write"], 0);
        assert_eq!(v["latencies_us"]["vmm_load_snapshot"], 0);
    }
}
