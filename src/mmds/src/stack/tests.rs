//! The stack against a real TCP client: smoltcp again, on the guest's side of the link.

use std::sync::{Arc, Mutex};

use serde_json::json;
use smoltcp::wire::{
    IpProtocol, Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket, TcpRepr, TcpSeqNumber,
};

use super::*;
use crate::DataStore;

const GUEST_MAC: Mac = [0x06, 0, 0, 0, 0, 2];
const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const IP: Ipv4Addr = crate::DEFAULT_IPV4;

fn stack() -> MmdsStack {
    let mut store = DataStore::default();
    store.put(json!({"latest": {"id": "i-42"}})).unwrap();
    MmdsStack::new(IP, Arc::new(Mutex::new(store)))
}

/// Moves packets between a client interface and the stack until both are quiet.
struct Wire {
    client: Interface,
    link: Link,
    sockets: SocketSet<'static>,
}

impl Wire {
    fn new() -> Self {
        let mut link = Link::default();
        let mut client = Interface::new(
            Config::new(HardwareAddress::Ip),
            &mut link,
            SmolInstant::ZERO,
        );
        client.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(IpAddress::Ipv4(GUEST_IP), 24));
        });
        let _ = client
            .routes_mut()
            .add_default_ipv4_route(Ipv4Addr::new(10, 0, 0, 1));
        Wire {
            client,
            link,
            sockets: SocketSet::new(Vec::new()),
        }
    }

    fn run(&mut self, stack: &mut MmdsStack) {
        for _ in 0..50 {
            let now = SmolInstant::from_micros(stack.epoch.elapsed().as_micros() as i64);
            self.client.poll(now, &mut self.link, &mut self.sockets);
            let mut moved = false;
            // The client's "to_guest" queue is what it sends.
            while let Some(packet) = self.link.to_guest.pop_front() {
                stack.receive(&frame::ethernet(
                    MMDS_MAC,
                    GUEST_MAC,
                    ETHERTYPE_IPV4,
                    &packet,
                ));
                moved = true;
            }
            while let Some(f) = stack.next_frame().map(<[u8]>::to_vec) {
                stack.pop_frame();
                assert_eq!(&f[..6], &GUEST_MAC);
                self.link.from_guest.push_back(f[ETH_HEADER..].to_vec());
                moved = true;
            }
            if !moved {
                break;
            }
        }
    }

    fn connect(&mut self, stack: &mut MmdsStack, port: u16) -> SocketHandle {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; 65536]),
            tcp::SocketBuffer::new(vec![0; 65536]),
        );
        s.connect(
            self.client.context(),
            (IpAddress::Ipv4(IP), HTTP_PORT),
            port,
        )
        .unwrap();
        let h = self.sockets.add(s);
        self.run(stack);
        h
    }

    fn exchange(&mut self, stack: &mut MmdsStack, h: SocketHandle, request: &str) -> String {
        self.sockets
            .get_mut::<tcp::Socket>(h)
            .send_slice(request.as_bytes())
            .unwrap();
        self.run(stack);
        let mut got = Vec::new();
        let s = self.sockets.get_mut::<tcp::Socket>(h);
        while s.can_recv() {
            s.recv(|d| {
                got.extend_from_slice(d);
                (d.len(), ())
            })
            .unwrap();
        }
        String::from_utf8(got).unwrap()
    }
}

#[test]
fn a_client_gets_answers_on_one_connection() {
    let mut stack = stack();
    let mut wire = Wire::new();
    let h = wire.connect(&mut stack, 40000);
    assert_eq!(
        wire.sockets.get::<tcp::Socket>(h).state(),
        tcp::State::Established
    );
    let r = wire.exchange(&mut stack, h, "GET /latest/id HTTP/1.1\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    assert!(r.ends_with("\r\n\r\ni-42"), "{r}");
    let r = wire.exchange(
        &mut stack,
        h,
        "GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert!(r.starts_with("HTTP/1.1 404"), "{r}");
    wire.run(&mut stack);
    assert!(
        !wire.sockets.get::<tcp::Socket>(h).may_recv(),
        "the MMDS closes after Connection: close"
    );
}

#[test]
fn a_huge_request_gets_400() {
    let mut stack = stack();
    let mut wire = Wire::new();
    let h = wire.connect(&mut stack, 40001);
    let big = format!(
        "GET / HTTP/1.1\r\nX: {}\r\n\r\n",
        "a".repeat(MAX_REQUEST * 2)
    );
    let r = wire.exchange(&mut stack, h, &big);
    assert!(r.starts_with("HTTP/1.1 400"), "{r}");
}

fn syn(port: u16) -> Vec<u8> {
    syn_from(GUEST_IP, port)
}

fn syn_from(src: Ipv4Addr, port: u16) -> Vec<u8> {
    let tcp = TcpRepr {
        src_port: port,
        dst_port: HTTP_PORT,
        control: TcpControl::Syn,
        seq_number: TcpSeqNumber(1000),
        ack_number: None,
        window_len: 1000,
        window_scale: None,
        max_seg_size: None,
        sack_permitted: false,
        sack_ranges: [None; 3],
        timestamp: None,
        payload: &[],
    };
    let ip = Ipv4Repr {
        src_addr: src,
        dst_addr: IP,
        next_header: IpProtocol::Tcp,
        payload_len: tcp.buffer_len(),
        hop_limit: 64,
    };
    let mut buf = vec![0; ip.buffer_len() + tcp.buffer_len()];
    let caps = ChecksumCapabilities::default();
    let mut packet = Ipv4Packet::new_unchecked(&mut buf);
    ip.emit(&mut packet, &caps);
    let mut seg = TcpPacket::new_unchecked(packet.payload_mut());
    tcp.emit(&mut seg, &IpAddress::Ipv4(src), &IpAddress::Ipv4(IP), &caps);
    frame::ethernet(MMDS_MAC, GUEST_MAC, ETHERTYPE_IPV4, &buf)
}

fn drain(stack: &mut MmdsStack) -> (usize, usize) {
    let (mut syn_acks, mut rsts) = (0, 0);
    while let Some(f) = stack.next_frame().map(<[u8]>::to_vec) {
        stack.pop_frame();
        let ip = Ipv4Packet::new_checked(&f[ETH_HEADER..]).unwrap();
        let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
        syn_acks += usize::from(tcp.syn() && tcp.ack());
        rsts += usize::from(tcp.rst());
    }
    (syn_acks, rsts)
}

#[test]
fn a_syn_flood_is_bounded_and_the_stack_recovers() {
    let mut stack = stack();
    let mut syn_acks = 0;
    let mut rsts = 0;
    for port in 0..1000u16 {
        stack.receive(&syn(10_000 + port));
        let (a, r) = drain(&mut stack);
        syn_acks += a;
        rsts += r;
    }
    assert_eq!(syn_acks, MAX_CONNECTIONS);
    assert_eq!(rsts, 1000 - MAX_CONNECTIONS);
    assert!(stack.conns.len() <= MAX_CONNECTIONS);
    // Hostile bytes do not disturb it.
    let mut bad_length = syn(2);
    bad_length[ETH_HEADER + 2] = 0xff;
    let mut bad_offset = syn(3);
    bad_offset[ETH_HEADER + 20 + 12] = 0xf0;
    for junk in [
        &syn(1)[..40],
        &bad_length[..],
        &bad_offset[..],
        &[0x45; 60][..],
    ] {
        stack.receive(junk);
    }
    // Once the half-open connections time out, a real client is served.
    std::thread::sleep(HANDSHAKE_TIMEOUT + Duration::from_millis(50));
    stack.poll();
    drain(&mut stack);
    let mut wire = Wire::new();
    let h = wire.connect(&mut stack, 50000);
    let r = wire.exchange(&mut stack, h, "GET /latest/id HTTP/1.1\r\n\r\n");
    assert!(r.ends_with("i-42"), "{r}");
}

#[test]
fn one_connection_after_another() {
    let mut stack = stack();
    let mut wire = Wire::new();
    for port in 41000..41010 {
        if port == 41005 {
            // Listening sockets that waited longer than a handshake may take still accept.
            std::thread::sleep(HANDSHAKE_TIMEOUT + Duration::from_millis(100));
        }
        let h = wire.connect(&mut stack, port);
        let r = wire.exchange(
            &mut stack,
            h,
            "GET /latest/id HTTP/1.1\r\nConnection: close\r\n\r\n",
        );
        assert!(r.ends_with("i-42"), "connection from port {port}: {r:?}");
        wire.sockets.get_mut::<tcp::Socket>(h).close();
        wire.run(&mut stack);
    }
}

#[test]
fn segments_from_addresses_no_one_can_answer_are_dropped() {
    // Found by fuzzing: smoltcp asserts that a reply's destination is not 0.0.0.0, so a SYN
    // from there aborted ember.
    let mut stack = stack();
    for src in [
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::BROADCAST,
        Ipv4Addr::new(224, 0, 0, 1),
    ] {
        assert!(stack.receive(&syn_from(src, 4000)), "taken, for the MMDS");
        assert_eq!(drain(&mut stack), (0, 0), "{src}: no answer");
    }
    assert!(stack.receive(&syn(4001)));
    assert_eq!(drain(&mut stack), (1, 0), "the guest is still answered");
}
