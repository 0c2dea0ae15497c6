//! A container's stats for containerd (`ctr task metrics`, the CRI's container stats): the
//! guest agent's reading of the container's cgroup v2, as containerd's cgroup v2 `Metrics`.

use containerd_shim::protos::cgroups_v2::metrics::{CPUStat, MemoryStat, Metrics, PidsStat};
use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::{Message, MessageField};
use serde_json::Value;

/// containerd's name for the message (its typeurl): how `ctr` knows what the bytes are.
const TYPE_URL: &str = "io.containerd.cgroups.v2.Metrics";

/// Sets each named field of `message` from the key of the same name in `stat` (0 if absent):
/// cgroup v2's files and containerd's messages use the same names.
macro_rules! same_names {
    ($message:ident from $stat:expr; $($field:ident),* $(,)?) => {
        $( $message.$field = $stat[stringify!($field)].as_u64().unwrap_or(0); )*
    };
}

/// `reading` (the agent's `stats` answer) as containerd's `Metrics`, packed.
pub fn from_agent(reading: &Value) -> Result<Any, String> {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let limit = |v: &Value| v.as_u64().unwrap_or(u64::MAX);
    let mut cpu = CPUStat::default();
    same_names!(cpu from reading["cpu.stat"];
        usage_usec, user_usec, system_usec, nr_periods, nr_throttled, throttled_usec);
    let mut memory = MemoryStat {
        usage: n(&reading["memory.current"]),
        usage_limit: limit(&reading["memory.max"]),
        swap_usage: n(&reading["memory.swap.current"]),
        swap_limit: limit(&reading["memory.swap.max"]),
        ..Default::default()
    };
    same_names!(memory from reading["memory.stat"];
        anon, file, kernel_stack, slab, sock, shmem, file_mapped, file_dirty, file_writeback,
        inactive_anon, active_anon, inactive_file, active_file, unevictable, pgfault, pgmajfault);
    let metrics = Metrics {
        pids: MessageField::some(PidsStat {
            current: n(&reading["pids.current"]),
            limit: limit(&reading["pids.max"]),
            ..Default::default()
        }),
        cpu: MessageField::some(cpu),
        memory: MessageField::some(memory),
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
        assert_eq!(m.memory.file, 2048);
        assert_eq!(m.memory.swap_limit, u64::MAX);
    }
}
