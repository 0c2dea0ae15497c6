//! The VM's network as the sandbox's CNI set it up on the host: the interface gets that
//! address, route and MTU, and the CNI interface's MAC address (busybox `ip`, which the
//! guest image has in /sbin). The MAC matters for guests restored from one template: they
//! would otherwise all have the template's.

use std::net::Ipv4Addr;
use std::process::Command;

/// Checks every value, then configures `interface`.
pub fn configure(
    interface: &str,
    address: &str,
    gateway: Option<&str>,
    mtu: Option<u32>,
    mac: Option<&str>,
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
    if let Some(mac) = mac {
        let bytes = unicast_mac(mac)
            .ok_or_else(|| format!("{mac:?} is not a unicast MAC address (aa:bb:cc:dd:ee:ff)"))?;
        // virtio-net takes a new address only while the interface is down.
        ip_cmd(&["link", "set", interface, "down"])?;
        super::sys::set_mac(interface, bytes)?;
    }
    ip_cmd(&["link", "set", interface, "mtu", &mtu.to_string(), "up"])?;
    ip_cmd(&["addr", "flush", "dev", interface])?;
    ip_cmd(&["addr", "add", address, "dev", interface])?;
    if let Some(g) = gateway {
        ip_cmd(&["route", "replace", "default", "via", g, "dev", interface])?;
    }
    Ok(())
}

/// Six colon-separated hex bytes, the first without the group bit.
fn unicast_mac(mac: &str) -> Option<[u8; 6]> {
    let mut bytes = [0u8; 6];
    let mut parts = mac.split(':');
    for byte in &mut bytes {
        let part = parts.next().filter(|p| p.len() == 2)?;
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    (parts.next().is_none() && bytes[0] & 1 == 0).then_some(bytes)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unicast_macs_are_taken() {
        assert_eq!(
            unicast_mac("0a:58:0a:63:00:05"),
            Some([0x0a, 0x58, 0x0a, 0x63, 0, 5])
        );
        assert!(unicast_mac("AA:bb:cc:dd:ee:fe").is_some());
        for bad in [
            "01:00:5e:00:00:01",
            "0a:58:0a:63:00",
            "0a:58:0a:63:00:05:07",
            "0a-58-0a-63-00-05",
            "0a:58:0a:63:00:5",
            "0a:58:0a:63:00:zz",
            "",
        ] {
            assert!(unicast_mac(bad).is_none(), "{bad}");
        }
    }
}
