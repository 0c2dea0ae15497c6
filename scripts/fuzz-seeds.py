#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (scripts/fuzz): a few well-formed inputs per target,
from which the fuzzer mutates. Generated on each run, never committed."""
import json
import os
import struct
import sys

out = sys.argv[1]


def seed(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def http(method, path, body=b""):
    return (f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


machine = json.dumps({"vcpu_count": 2, "mem_size_mib": 256, "smt": False}).encode()
seed("http_request", "get", b"\x07" + http("GET", "/"))
seed("http_request", "put", b"\x40" + http("PUT", "/machine-config", machine) + http("GET", "/vm/config"))
seed("http_request", "continue", b"\xff" + http("PUT", "/actions", b'{"action_type":"InstanceStart"}')
     .replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n", 1))

bodies = {
    3: machine,
    1: b'{"action_type": "FlushMetrics"}',
    2: b'{"kernel_image_path": "/k", "boot_args": "console=ttyS0", "initrd_path": "/i"}',
    4: b'{"drive_id": "rootfs", "path_on_host": "/d", "is_root_device": true, "is_read_only": false,'
       b' "cache_type": "Writeback", "rate_limiter": {"bandwidth": {"size": 1000, "refill_time": 100}}}',
    5: b'{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:00:00:00:01"}',
    6: b'{"guest_cid": 3, "uds_path": "/v.sock"}',
    8: b'{"amount_mib": 10, "deflate_on_oom": true, "stats_polling_interval_s": 1}',
    10: b'{"latest": {"meta-data": {"id": "i-1"}}}',
    11: b'{"version": "V2", "network_interfaces": ["eth0"], "ipv4_address": "169.254.169.254"}',
    14: b'{"snapshot_path": "/s", "mem_file_path": "/m", "snapshot_type": "Diff"}',
    15: b'{"snapshot_path": "/s", "mem_backend": {"backend_type": "Uffd", "backend_path": "/u"},'
        b' "resume_vm": true, "network_overrides": [{"iface_id": "eth0", "host_dev_name": "t"}]}',
}
for path_index, body in bodies.items():
    for method in (1, 2):  # PUT, PATCH
        seed("api_request", f"{path_index}-{method}", bytes([path_index << 4 | method]) + body)

config = {
    "boot-source": {"kernel_image_path": "/k", "boot_args": "console=ttyS0"},
    "machine-config": {"vcpu_count": 1, "mem_size_mib": 128},
    "drives": [{"drive_id": "rootfs", "path_on_host": "/d", "is_root_device": True, "is_read_only": False}],
    "network-interfaces": [{"iface_id": "eth0", "host_dev_name": "tap0"}],
    "vsock": {"guest_cid": 3, "uds_path": "/v"},
    "balloon": {"amount_mib": 0, "deflate_on_oom": False},
    "entropy": {"rate_limiter": {"ops": {"size": 10, "refill_time": 1000}}},
    "mmds-config": {"network_interfaces": ["eth0"]},
    "logger": {"log_path": "/l", "level": "Info"},
    "metrics": {"metrics_path": "/m"},
}
seed("config_json", "full", json.dumps(config))


def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


guest_mac, mmds_mac = bytes.fromhex("060000000001"), bytes.fromhex("060000000002")
guest_ip, mmds_ip = bytes([169, 254, 0, 2]), bytes([169, 254, 169, 254])
arp = (b"\xff" * 6 + guest_mac + b"\x08\x06" + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1)
       + guest_mac + guest_ip + b"\0" * 6 + mmds_ip)


def tcp(flags, seq, ack, payload=b""):
    hdr = struct.pack("!HHIIBBHHH", 40000, 80, seq, ack, 5 << 4, flags, 65535, 0, 0)
    pseudo = guest_ip + mmds_ip + struct.pack("!BBH", 0, 6, len(hdr) + len(payload))
    c = csum(pseudo + hdr + payload)
    hdr = hdr[:16] + struct.pack("!H", c) + hdr[18:]
    total = 20 + len(hdr) + len(payload)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 1, 0, 64, 6, 0, guest_ip, mmds_ip)
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    return mmds_mac + guest_mac + b"\x08\x00" + ip + hdr + payload


get = b"GET /latest/meta-data/id HTTP/1.1\r\nAccept: application/json\r\n\r\n"
frames = [arp, tcp(0x02, 1000, 0), tcp(0x10, 1001, 1), tcp(0x18, 1001, 1, get)]
seed("mmds_frame", "arp", struct.pack("<H", len(arp)) + arp)
seed("mmds_frame", "tcp-get", b"".join(struct.pack("<H", len(f)) + f for f in frames))

seed("snapshot_state", "header", b"EMBERSNP" + struct.pack("<IQ", 1, 2) + b"{}" + b"\0" * 8)
seed("jailer_args", "run", "\0".join(["jailer", "--id", "vm1", "--exec-file", "/usr/bin/ember", "--uid",
                                      "1000", "--gid", "1000", "--cgroup", "cpu.max=100000",
                                      "--resource-limit", "no-file=1024", "--", "--no-api"]))


def queue_seed(chain, avail_heads, extra):
    """Queue 0 at address 0 (16 entries): descriptors, then the avail ring; `extra` buffers
    at 0x8000 and beyond are appended by address."""
    mem = bytearray(0x9000)
    for i, (addr, length, flags, nxt) in enumerate(chain):
        struct.pack_into("<QIHH", mem, i * 16, addr, length, flags, nxt)
    struct.pack_into("<HH", mem, 256, 0, len(avail_heads))
    for i, h in enumerate(avail_heads):
        struct.pack_into("<H", mem, 260 + 2 * i, h)
    for addr, data in extra:
        mem[addr:addr + len(data)] = data
    return bytes(mem)


# virtio-blk: a read (header, 512-byte buffer, status), a write, a flush, a get-id.
blk = queue_seed([(0x8000, 16, 1, 1), (0x8100, 512, 3, 2), (0x8400, 1, 2, 0),
                  (0x8010, 16, 1, 4), (0x8100, 512, 1, 5), (0x8401, 1, 2, 0)], [0, 3],
                 [(0x8000, struct.pack("<IIQ", 0, 0, 1)), (0x8010, struct.pack("<IIQ", 1, 0, 2))])
seed("virtio_block", "read-write", b"\x02" + blk)
seed("virtio_rng", "two", queue_seed([(0x8000, 64, 2, 0), (0x8100, 4096, 2, 0)], [0, 1], []))
seed("virtio_balloon", "inflate", queue_seed([(0x8000, 16, 0, 0)], [0], [(0x8000, struct.pack("<4I", 1, 2, 3, 300))]))
# Free page hinting (queue 3, at 0x3000): the run's ID 2, a 4 KiB block at 0x10000, STOP.
mem = bytearray(0x9000)
for i, (addr, length, flags) in enumerate([(0x8000, 4, 0), (0x10000, 4096, 2), (0x8004, 4, 0)]):
    struct.pack_into("<QIHH", mem, 0x3000 + i * 16, addr, length, flags, 0)
struct.pack_into("<HHHHH", mem, 0x3100, 0, 3, 0, 1, 2)
struct.pack_into("<II", mem, 0x8000, 2, 0)
seed("virtio_balloon", "hinting", bytes(mem))
hdr = struct.pack("<QQIIIHHIII", 3, 2, 1024, 5000, 0, 1, 1, 0, 65536, 0)
seed("virtio_vsock", "request", queue_seed([(0x8000, len(hdr), 0, 0)], [0], [(0x8000, hdr)]))
vnet = b"\0" * 12
seed("virtio_net", "arp", queue_seed([], [], []))
for i, f in enumerate(frames):
    # TX is queue 1, at 0x1000: its descriptor table, then its avail ring.
    mem = bytearray(0x9000)
    struct.pack_into("<QIHH", mem, 0x1000, 0x8000, len(vnet) + len(f), 0, 0)
    struct.pack_into("<HHH", mem, 0x1100, 0, 1, 0)
    mem[0x8000:0x8000 + 12 + len(f)] = vnet + f
    seed("virtio_net", f"frame{i}", bytes(mem))
