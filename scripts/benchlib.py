"""What the benchmark scripts share: paths, running commands, the summary line of a timing,
the test guest's location, QEMU's microvm command line, reading a process's memory, and
requests on ember's API socket."""
import os
import socket
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# EMBER_BIN times another build (another libc, an older commit) with the same scripts.
EMBER = os.environ.get("EMBER_BIN") or os.path.join(ROOT, "target/x86_64-unknown-linux-musl/release/ember")
# EMBER_PCI=1: every benchmark's microVM with --enable-pci (its devices on virtio-pci).
PCI = os.environ.get("EMBER_PCI") == "1"
EMBER_FLAGS = ["--enable-pci"] if PCI else []
# The guest kernel command line of the Linux guest in both benchmarks.
LINUX_ARGS = "console=ttyS0 reboot=k panic=1 i8042.noaux i8042.nomux i8042.dumbkbd" + (
    "" if PCI else " pci=off")


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, cwd=ROOT, **kw)


def stats(name, values, unit="ms", digits=1):
    """Prints and returns median, min and max."""
    values = sorted(values)
    med = statistics.median(values)
    print(f"{name}: median {med:.{digits}f} {unit}, min {values[0]:.{digits}f}, "
          f"max {values[-1]:.{digits}f} ({len(values)} runs)")
    return {"median": med, "min": values[0], "max": values[-1], "runs": len(values)}


def host_kind():
    """Which KVM this host has: kvm_pvm, kvm_intel, kvm_amd, or KVM when /sys does not say."""
    for m in ("kvm_pvm", "kvm_intel", "kvm_amd"):
        if os.path.exists(f"/sys/module/{m}"):
            return m
    return "KVM"


def guest_paths():
    """The test guest images (release build): {"pvh": ..., "linux64": ..., "bzimage": ...}.
    EMBER_BENCH_GUESTS may hold what the build printed (scripts/bench-kvm-host sets it, so
    that nothing is built on the emulated host)."""
    out = os.environ.get("EMBER_BENCH_GUESTS") or build_test_guests()
    return dict(line.split("=", 1) for line in out.split())


def build_test_guests():
    """Builds the test guest images (release) and returns what the build printed: a
    `name=path` line per image."""
    return sh("cargo", "run", "--release", "--locked", "-q", "-p", "test-guest",
              capture_output=True, text=True).stdout


def release_build():
    """Builds ember in release mode, unless EMBER_BENCH_GUESTS says it was built already."""
    if not os.environ.get("EMBER_BENCH_GUESTS"):
        sh("cargo", "build", "--release", "--locked", "-q", "-p", "ember")


def linux_images():
    """The Linux guest images' directory: EMBER_GUEST_DIR, else what guest/build.sh makes."""
    return os.environ.get("EMBER_GUEST_DIR") or sh(
        "guest/build.sh", capture_output=True, text=True).stdout.strip().splitlines()[-1]


def qemu_microvm(kernel, args, extra=()):
    """QEMU's microvm with the same machine as the benchmarks give ember: 1 vCPU, 128 MiB."""
    return ["qemu-system-x86_64", "-M", "microvm", "-enable-kvm", "-cpu", "host", "-m", "128",
            "-smp", "1", "-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio",
            "-no-reboot", "-kernel", kernel, "-append", args, *extra]


def rss_and_guest_kib(pid, guest_bytes):
    """A process's RSS and the part of it in guest RAM, in KiB, from /proc/PID/smaps. The
    kernel may merge the guest mapping with an adjacent malloc arena (at most 64 MiB), so a
    mapping of the guest's size or a little larger counts as guest RAM."""
    total = guest = 0
    size = None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                fields = line.split()
                if "-" in fields[0] and ":" not in fields[0]:
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    size = end - start
                elif fields[0] == "Rss:":
                    kib = int(fields[1])
                    total += kib
                    if guest_bytes <= size < guest_bytes + (64 << 20):
                        guest += kib
    except FileNotFoundError:
        pass
    return total, guest


def request(sock, method, path, body=None):
    """One HTTP request on a connected socket; returns (status, body)."""
    data = body.encode() if body else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(data)}\r\n\r\n"
    sock.sendall(head.encode() + data)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(head.split(b" ")[1]), rest[:length]


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def call(path, method, url, body=None):
    with connect(path) as s:
        return request(s, method, url, body)
