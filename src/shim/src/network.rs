//! CNI networking: a sandbox whose spec names a network namespace made on the host (by CNI,
//! for the pod) gets a TAP device in that namespace joined to the CNI interface there by two
//! tc redirects (everything arriving on one leaves by the other), and the guest's eth0 takes
//! the address CNI gave that interface. The container reaches what the CNI interface
//! reaches, with the address CNI assigned.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The TAP device the shim makes in the sandbox's namespace.
pub const TAP: &str = "tap0";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0} failed in the network namespace {1}: {2}")]
    Tool(String, PathBuf, String),
    #[error(
        "the network namespace {0} has no interface with an IPv4 address (did CNI run for it?)"
    )]
    NoInterface(PathBuf),
}

/// What CNI set up: the interface, its address (`10.88.0.5/16`), gateway and MTU.
#[derive(Debug, Clone)]
pub struct Network {
    pub netns: PathBuf,
    pub interface: String,
    pub address: String,
    pub gateway: Option<String>,
    pub mtu: u64,
    /// The CNI interface's MAC address, which the guest's eth0 takes: frames leave the
    /// namespace as if from that interface.
    pub mac: Option<String>,
}

/// The host network namespace the spec puts the container in, if it names one (a path that
/// is not a guest process's `/proc/PID/ns/net`).
pub fn netns_of(spec: &Value) -> Option<PathBuf> {
    let namespaces = spec["linux"]["namespaces"].as_array()?;
    namespaces
        .iter()
        .filter(|n| n["type"] == "network")
        .filter_map(|n| n["path"].as_str())
        .find(|p| !p.starts_with("/proc/"))
        .map(PathBuf::from)
}

/// Runs `args` in `netns` (nsenter), returning its output.
fn run_in(netns: &Path, args: &[&str]) -> Result<String, Error> {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(args)
        .output()
        .map_err(|e| Error::Tool(args.join(" "), netns.to_path_buf(), e.to_string()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(Error::Tool(args.join(" "), netns.to_path_buf(), err));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Reads the CNI interface of `netns` and makes the TAP beside it.
pub fn prepare(netns: &Path) -> Result<Network, Error> {
    let addrs: Value =
        serde_json::from_str(&run_in(netns, &["ip", "-j", "addr", "show"])?).unwrap_or_default();
    let found = addrs.as_array().into_iter().flatten().find_map(|link| {
        let name = link["ifname"].as_str()?;
        if name == "lo" || name == TAP {
            return None;
        }
        let inet = link["addr_info"]
            .as_array()?
            .iter()
            .find(|a| a["family"] == "inet")?;
        let address = format!(
            "{}/{}",
            inet["local"].as_str()?,
            inet["prefixlen"].as_u64()?
        );
        Some((
            name.to_string(),
            address,
            link["mtu"].as_u64().unwrap_or(1500),
            link["address"].as_str().map(str::to_string),
        ))
    });
    let (interface, address, mtu, mac) =
        found.ok_or_else(|| Error::NoInterface(netns.to_path_buf()))?;
    let routes: Value =
        serde_json::from_str(&run_in(netns, &["ip", "-j", "route", "show", "default"])?)
            .unwrap_or_default();
    let gateway = routes[0]["gateway"].as_str().map(str::to_string);
    let mtu_arg = mtu.to_string();
    run_in(netns, &["ip", "tuntap", "add", "dev", TAP, "mode", "tap"])?;
    run_in(netns, &["ip", "link", "set", TAP, "mtu", &mtu_arg, "up"])?;
    Ok(Network {
        netns: netns.to_path_buf(),
        interface,
        address,
        gateway,
        mtu,
        mac,
    })
}

/// Joins the TAP (which Ember now has open) and the CNI interface: each one's ingress is
/// the other's egress.
pub fn connect(net: &Network) -> Result<(), Error> {
    for (from, to) in [(net.interface.as_str(), TAP), (TAP, net.interface.as_str())] {
        run_in(&net.netns, &["tc", "qdisc", "add", "dev", from, "ingress"])?;
        run_in(
            &net.netns,
            &[
                "tc", "filter", "add", "dev", from, "parent", "ffff:", "protocol", "all", "u32",
                "match", "u8", "0", "0", "action", "mirred", "egress", "redirect", "dev", to,
            ],
        )?;
    }
    Ok(())
}

/// Removes what [`prepare`] and [`connect`] added (the TAP takes its own filters along).
pub fn tear_down(netns: &Path) {
    let _ = run_in(netns, &["ip", "link", "del", TAP]);
    let Ok(text) = run_in(netns, &["ip", "-j", "link", "show"]) else {
        return;
    };
    let links: Value = serde_json::from_str(&text).unwrap_or_default();
    for link in links.as_array().into_iter().flatten() {
        if let Some(name) = link["ifname"].as_str().filter(|n| *n != "lo") {
            let _ = run_in(netns, &["tc", "qdisc", "del", "dev", name, "ingress"]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_cni_namespace_is_one_the_host_made() {
        let spec = |ns: Value| json!({"linux": {"namespaces": ns}});
        let cni =
            spec(json!([{"type": "pid"}, {"type": "network", "path": "/var/run/netns/cni-1"}]));
        assert_eq!(netns_of(&cni), Some(PathBuf::from("/var/run/netns/cni-1")));
        assert_eq!(netns_of(&spec(json!([{"type": "network"}]))), None);
        let joined = spec(json!([{"type": "network", "path": "/proc/40/ns/net"}]));
        assert_eq!(netns_of(&joined), None);
        assert_eq!(netns_of(&json!({})), None);
    }
}
