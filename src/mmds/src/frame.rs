//! The Ethernet and ARP framing around the MMDS: which guest frames are for it, the ARP
//! replies that make its address reachable, and the Ethernet header on what it sends.

use std::net::Ipv4Addr;

pub const ETH_HEADER: usize = 14;
pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_ARP: u16 = 0x0806;
const ARP_LEN: usize = 28;
const IP_PROTO_TCP: u8 = 6;

pub type Mac = [u8; 6];

/// What the MMDS does with a frame from the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// Not for the MMDS: it goes to the TAP.
    Tap,
    /// An ARP request for the MMDS address.
    Arp,
    /// An IPv4 TCP packet to the MMDS address (its IP packet starts at [`ETH_HEADER`]).
    Tcp,
}

fn ethertype(frame: &[u8]) -> Option<u16> {
    frame.get(12..14).map(|b| u16::from_be_bytes([b[0], b[1]]))
}

/// Sorts a guest frame by its headers alone; a frame too short for them goes to the TAP.
pub fn destination(frame: &[u8], mmds_ip: Ipv4Addr) -> Destination {
    let ip = mmds_ip.octets();
    match ethertype(frame) {
        Some(ETHERTYPE_ARP) => match frame.get(ETH_HEADER + 24..ETH_HEADER + 28) {
            Some(target) if target == ip => Destination::Arp,
            _ => Destination::Tap,
        },
        Some(ETHERTYPE_IPV4) => {
            let Some(header) = frame.get(ETH_HEADER..ETH_HEADER + 20) else {
                return Destination::Tap;
            };
            if header[0] >> 4 == 4 && header[9] == IP_PROTO_TCP && header[16..20] == ip {
                Destination::Tcp
            } else {
                Destination::Tap
            }
        }
        _ => Destination::Tap,
    }
}

/// The source MAC of a frame.
pub fn source(frame: &[u8]) -> Option<Mac> {
    frame.get(6..12).map(|b| b.try_into().unwrap_or_default())
}

/// The reply to an ARP request for `ip`, or None if `frame` is not a well-formed one.
pub fn arp_reply(frame: &[u8], mac: Mac, ip: Ipv4Addr) -> Option<Vec<u8>> {
    let arp = frame.get(ETH_HEADER..ETH_HEADER + ARP_LEN)?;
    // Ethernet hardware, IPv4 protocol, 6- and 4-byte addresses, operation 1 (request).
    if arp[..8] != [0, 1, 8, 0, 6, 4, 0, 1] || arp[24..28] != ip.octets() {
        return None;
    }
    let (sender_mac, sender_ip) = (&arp[8..14], &arp[14..18]);
    if sender_mac[0] & 1 != 0 {
        return None;
    }
    let mut reply = Vec::with_capacity(ARP_LEN);
    reply.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 2]);
    reply.extend_from_slice(&mac);
    reply.extend_from_slice(&ip.octets());
    reply.extend_from_slice(sender_mac);
    reply.extend_from_slice(sender_ip);
    let dst: Mac = sender_mac.try_into().ok()?;
    Some(ethernet(dst, mac, ETHERTYPE_ARP, &reply))
}

/// `payload` with an Ethernet header in front.
pub fn ethernet(dst: Mac, src: Mac, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(ETH_HEADER + payload.len());
    frame.extend_from_slice(&dst);
    frame.extend_from_slice(&src);
    frame.extend_from_slice(&ethertype.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    const GUEST: Mac = [0x06, 0, 0, 0, 0, 1];
    const MMDS: Mac = [0x06, 1, 0x23, 0x45, 0x67, 1];
    const IP: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);

    fn arp_request(target: [u8; 4]) -> Vec<u8> {
        let mut arp = vec![0, 1, 8, 0, 6, 4, 0, 1];
        arp.extend_from_slice(&GUEST);
        arp.extend_from_slice(&[10, 0, 0, 2]);
        arp.extend_from_slice(&[0; 6]);
        arp.extend_from_slice(&target);
        ethernet([0xff; 6], GUEST, ETHERTYPE_ARP, &arp)
    }

    fn ipv4(proto: u8, dst: [u8; 4]) -> Vec<u8> {
        let mut ip = vec![0x45, 0, 0, 40, 0, 0, 0, 0, 64, proto, 0, 0, 10, 0, 0, 2];
        ip.extend_from_slice(&dst);
        ip.extend_from_slice(&[0; 20]);
        ethernet(MMDS, GUEST, ETHERTYPE_IPV4, &ip)
    }

    #[test]
    fn frames_are_sorted_by_their_headers() {
        assert_eq!(destination(&arp_request(IP.octets()), IP), Destination::Arp);
        assert_eq!(
            destination(&arp_request([10, 0, 0, 1]), IP),
            Destination::Tap
        );
        assert_eq!(destination(&ipv4(6, IP.octets()), IP), Destination::Tcp);
        assert_eq!(destination(&ipv4(17, IP.octets()), IP), Destination::Tap);
        assert_eq!(destination(&ipv4(6, [10, 0, 0, 1]), IP), Destination::Tap);
        assert_eq!(destination(&[0u8; 5], IP), Destination::Tap);
        assert_eq!(
            destination(&ipv4(6, IP.octets())[..20], IP),
            Destination::Tap
        );
    }

    #[test]
    fn arp_requests_get_replies() {
        let reply = arp_reply(&arp_request(IP.octets()), MMDS, IP).unwrap();
        assert_eq!(&reply[..6], &GUEST);
        assert_eq!(&reply[6..12], &MMDS);
        assert_eq!(&reply[ETH_HEADER + 6..ETH_HEADER + 8], &[0, 2]);
        assert_eq!(&reply[ETH_HEADER + 8..ETH_HEADER + 14], &MMDS);
        assert_eq!(&reply[ETH_HEADER + 24..ETH_HEADER + 28], &[10, 0, 0, 2]);
        let mut bad = arp_request(IP.octets());
        bad[ETH_HEADER + 7] = 2;
        assert_eq!(arp_reply(&bad, MMDS, IP), None);
        assert_eq!(arp_reply(&bad[..30], MMDS, IP), None);
    }
}
