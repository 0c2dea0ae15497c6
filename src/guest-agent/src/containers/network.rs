//! The VM's network as the sandbox's CNI set it up on the host: the interface gets that
//! address, route and MTU (busybox `ip`, which the guest image has in /sbin).

use std::net::Ipv4Addr;
use std::process::Command;

/// Checks every value, then configures `interface`.
pub fn configure(
    interface: &str,
    address: &str,
    gateway: Option<&str>,
    mtu: Option<u32>,
) -> Result<(), String> {
    let name_ok = !interface.is_empty()
        && interface.len() < 16
        && interface
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !name_ok
        || !std::path::Path::new("/sys/class/net")
            .join(interface)
            .exists()
    {
        return Err(format!("there is no network interface {interface:?}"));
    }
    let (ip, prefix) = address
        .split_once('/')
        .ok_or_else(|| format!("the address {address:?} has no prefix length (a.b.c.d/n)"))?;
    let valid = ip.parse::<Ipv4Addr>().is_ok() && prefix.parse::<u8>().is_ok_and(|p| p <= 32);
    if !valid {
        return Err(format!(
            "{address:?} is not an IPv4 address with a prefix length"
        ));
    }
    if let Some(g) = gateway {
        g.parse::<Ipv4Addr>()
            .map_err(|_| format!("the gateway {g:?} is not an IPv4 address"))?;
    }
    let mtu = mtu.unwrap_or(1500);
    if !(68..=65535).contains(&mtu) {
        return Err(format!("the MTU {mtu} is outside 68 to 65535"));
    }
    ip_cmd(&["link", "set", interface, "mtu", &mtu.to_string(), "up"])?;
    ip_cmd(&["addr", "flush", "dev", interface])?;
    ip_cmd(&["addr", "add", address, "dev", interface])?;
    if let Some(g) = gateway {
        ip_cmd(&["route", "replace", "default", "via", g, "dev", interface])?;
    }
    Ok(())
}

fn ip_cmd(args: &[&str]) -> Result<(), String> {
    // busybox installs it in /sbin.
    let out = Command::new("/sbin/ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}
