//! A container's stats for containerd (`ctr task metrics`, the CRI's container stats): the
//! guest agent's reading of the container's cgroup v2, as containerd's cgroup v2 `Metrics`.

use containerd_shim::protos::cgroups_v2::metrics::{CPUStat, MemoryStat, Metrics, PidsStat};
use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::{Message, MessageField};
use serde_json::Value;

/// containerd's name for the message (its typeurl): how `ctr` knows what the bytes are.
const TYPE_URL: &str = "io.containerd.cgroups.v2.Metrics";

/// `reading` (the agent's `stats` answer) as containerd's `Metrics`, packed.
pub fn from_agent(reading: &Value) -> Result<Any, String> {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let limit = |v: &Value| v.as_u64().unwrap_or(u64::MAX);
    let memory_stat = &reading["memory.stat"];
    let cpu_stat = &reading["cpu.stat"];
    let metrics = Metrics {
        pids: MessageField::some(PidsStat {
            current: n(&reading["pids.current"]),
            limit: limit(&reading["pids.max"]),
            ..Default::default()
        }),
        cpu: MessageField::some(CPUStat {
            usage_usec: n(&cpu_stat["usage_usec"]),
            user_usec: n(&cpu_stat["user_usec"]),
            system_usec: n(&cpu_stat["system_usec"]),
            nr_periods: n(&cpu_stat["nr_periods"]),
            nr_throttled: n(&cpu_stat["nr_throttled"]),
            throttled_usec: n(&cpu_stat["throttled_usec"]),
            ..Default::default()
        }),
        memory: MessageField::some(MemoryStat {
            usage: n(&reading["memory.current"]),
            usage_limit: limit(&reading["memory.max"]),
            swap_usage: n(&reading["memory.swap.current"]),
            swap_limit: limit(&reading["memory.swap.max"]),
            anon: n(&memory_stat["anon"]),
            file: n(&memory_stat["file"]),
            kernel_stack: n(&memory_stat["kernel_stack"]),
            slab: n(&memory_stat["slab"]),
            sock: n(&memory_stat["sock"]),
            shmem: n(&memory_stat["shmem"]),
            file_mapped: n(&memory_stat["file_mapped"]),
            file_dirty: n(&memory_stat["file_dirty"]),
            file_writeback: n(&memory_stat["file_writeback"]),
            inactive_anon: n(&memory_stat["inactive_anon"]),
            active_anon: n(&memory_stat["active_anon"]),
            inactive_file: n(&memory_stat["inactive_file"]),
            active_file: n(&memory_stat["active_file"]),
            unevictable: n(&memory_stat["unevictable"]),
            pgfault: n(&memory_stat["pgfault"]),
            pgmajfault: n(&memory_stat["pgmajfault"]),
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok(Any {
        type_url: TYPE_URL.to_string(),
        value: metrics.write_to_bytes().map_err(|e| e.to_string())?,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_agent_reading_becomes_cgroup_v2_metrics() {
        let reading = json!({"memory.current": 4096, "memory.max": 134217728,
            "pids.current": 2, "pids.max": null,
            "memory.stat": {"anon": 1024, "file": 2048}, "cpu.stat": {"usage_usec": 77}});
        let any = from_agent(&reading).unwrap();
        assert_eq!(any.type_url, TYPE_URL);
        let m = Metrics::parse_from_bytes(&any.value).unwrap();
        assert_eq!(m.memory.usage, 4096);
        assert_eq!(m.memory.usage_limit, 134217728);
        assert_eq!(m.memory.anon, 1024);
        assert_eq!(m.pids.current, 2);
        assert_eq!(m.pids.limit, u64::MAX);
        assert_eq!(m.cpu.usage_usec, 77);
        assert_eq!(m.memory.swap_limit, u64::MAX);
    }
}
