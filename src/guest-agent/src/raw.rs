//! Hostile TCP/IPv4 through a raw socket: what a compromised guest kernel could send the
//! MMDS. The kernel adds nothing but the IP checksum (IP_HDRINCL), so every other field is
//! ours to get wrong.

use std::net::Ipv4Addr;

fn checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    for pair in data.chunks(2) {
        let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4 packet (no options) carrying a TCP header with `flags` and `payload`.
fn packet(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    flags: u8,
    offset_words: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut tcp = vec![0u8; 20];
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&dport.to_be_bytes());
    tcp[4..8].copy_from_slice(&0x1000_0000u32.to_be_bytes());
    tcp[12] = offset_words << 4;
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&4096u16.to_be_bytes());
    tcp.extend_from_slice(payload);
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&(tcp.len() as u16).to_be_bytes());
    pseudo.extend_from_slice(&tcp);
    let sum = checksum(&pseudo);
    tcp[16..18].copy_from_slice(&sum.to_be_bytes());
    let total = 20 + tcp.len();
    let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0];
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    ip.extend_from_slice(&tcp);
    ip
}

struct RawSocket(i32);

impl RawSocket {
    fn open() -> std::io::Result<Self> {
        // SAFETY: socket() takes no pointers.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(RawSocket(fd))
    }

    fn send(&self, packet: &[u8], dst: Ipv4Addr) -> bool {
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(dst.octets()),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: `packet` and `addr` are valid for the lengths given for the whole call.
        let n = unsafe {
            libc::sendto(
                self.0,
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&addr as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        n >= 0
    }
}

impl Drop for RawSocket {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe { libc::close(self.0) };
    }
}

/// The guest's address on the route to `dst`, found by connecting a UDP socket.
fn source_for(dst: Ipv4Addr) -> Result<Ipv4Addr, String> {
    let udp = std::net::UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
    udp.connect((dst, 9)).map_err(|e| e.to_string())?;
    match udp.local_addr().map_err(|e| e.to_string())?.ip() {
        std::net::IpAddr::V4(ip) => Ok(ip),
        other => Err(format!("unexpected source address {other}")),
    }
}

pub fn flood(ip: &str, port: &str) -> Result<String, String> {
    let dst: Ipv4Addr = ip.parse().map_err(|e| format!("bad address {ip}: {e}"))?;
    let port: u16 = port.parse().map_err(|e| format!("bad port {port}: {e}"))?;
    let src = source_for(dst)?;
    let socket = RawSocket::open().map_err(|e| format!("raw socket: {e}"))?;
    let mut sent = 0;
    let mut send = |p: &[u8]| sent += usize::from(socket.send(p, dst));
    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    const FIN: u8 = 0x01;
    const RST: u8 = 0x04;
    // 2,000 SYNs from different ports, never completed.
    for i in 0..2000u16 {
        send(&packet(src, dst, 20_000 + i, port, SYN, 5, &[]));
    }
    // Data offsets below the minimum and past the end, every flag combination, data on a
    // connection that does not exist, to a closed port too.
    for offset in [0u8, 1, 4, 15] {
        send(&packet(src, dst, 30_000, port, SYN, offset, &[0xaa; 8]));
    }
    for flags in 0..=255u8 {
        send(&packet(
            src,
            dst,
            31_000 + u16::from(flags),
            port,
            flags,
            5,
            b"GET / HTTP/1.1\r\n\r\n",
        ));
    }
    send(&packet(src, dst, 32_000, port, ACK, 5, &[0x55; 1200]));
    send(&packet(src, dst, 32_001, port, FIN | ACK, 5, &[]));
    send(&packet(src, dst, 32_002, port, RST, 5, &[]));
    send(&packet(src, dst, 32_003, port + 1, SYN, 5, &[]));
    // A packet whose IP total length claims more than it has is fixed up by the kernel, so
    // the short and lying headers come as TCP headers with options that overrun.
    let mut options = packet(src, dst, 32_004, port, SYN, 15, &[]);
    options.truncate(20 + 24);
    send(&options);
    Ok(format!("raw packets sent {sent}"))
}
