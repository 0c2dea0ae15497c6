#!/usr/bin/env bash
# Builds Ember's guest images from Debian packages and caches them outside the repository,
# keyed by a hash of every input, so a second run takes seconds:
#   vmlinux, bzImage      linux-source-6.1 + pvm-syscall.patch + kernel.fragment (allnoconfig)
#   rootfs.ext4           busybox-static + init, made with mkfs.ext4 -d (no mount, no loop)
#   initramfs.cpio.gz     the same tree as an initramfs
#   (both carry /bin/ember-agent, the project's static guest agent, src/guest-agent; the
#   root filesystem also Debian's crun, the OCI runtime the agent runs containers with)
# Prints the cache directory holding them on its last line.
#
#   guest/build.sh            build what is missing
#   guest/build.sh --dir      only print where the images are (or would be)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache_root=${EMBER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ember}

need() { command -v "$1" >/dev/null || { echo "guest/build.sh: $1 is missing (run .ci/install-deps)" >&2; exit 1; }; }
source_tar=/usr/src/linux-source-6.1.tar.xz
pkg_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo unknown; }

# The kernel is cached on its own, so that changing the init or the root filesystem does not
# rebuild it. Bump KERNEL_RECIPE when the kernel steps below change.
KERNEL_RECIPE=1
kernel_key=$( {
    echo "$KERNEL_RECIPE"
    cat "$here/kernel.fragment" "$here/pvm-syscall.patch"
    pkg_version linux-source-6.1
    gcc -dumpfullversion 2>/dev/null || true
} | sha256sum | cut -c1-16)
kernel_dir="$cache_root/kernel-$kernel_key"
repo=$(cd "$here/.." && pwd)
key=$( {
    cat "$here/build.sh" "$here/init"
    echo "$kernel_key"
    pkg_version busybox-static
    pkg_version crun
    cat "$repo/Cargo.lock" "$repo/Cargo.toml" "$repo"/src/guest-agent/Cargo.toml
    find "$repo/src/guest-agent/src" -name '*.rs' | sort | xargs cat
    rustc -V 2>/dev/null || true
} | sha256sum | cut -c1-16)
out="$cache_root/guest-$key"
if [ "${1:-}" = "--dir" ]; then
    echo "$out"
    exit 0
fi
if [ -f "$out/done" ]; then
    echo "$out"
    exit 0
fi

for tool in make gcc bc flex bison cpio gzip mkfs.ext4 xz patch cargo ldd crun; do need "$tool"; done
[ -f "$source_tar" ] || { echo "guest/build.sh: $source_tar is missing (apt-get install linux-source-6.1)" >&2; exit 1; }
[ -x /bin/busybox ] || { echo "guest/build.sh: /bin/busybox is missing (apt-get install busybox-static)" >&2; exit 1; }

mkdir -p "$cache_root"
work=$(mktemp -d "$cache_root/build.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [ ! -f "$kernel_dir/done" ]; then
    echo "guest/build.sh: building the kernel (a few minutes on 2 cores)" >&2
    tar -C "$work" -xf "$source_tar"
    src="$work/linux-source-6.1"
    # One small change for PVM hosts, off unless the command line asks for it (docs/pvm.md).
    patch -s -d "$src" -p1 < "$here/pvm-syscall.patch"
    make -C "$src" -s allnoconfig KCONFIG_ALLCONFIG="$here/kernel.fragment" >&2
    # Every option of the fragment must have survived allnoconfig's dependency resolution.
    while IFS= read -r opt; do
        case "$opt" in CONFIG_*=*) ;; *) continue ;; esac
        grep -qx "$opt" "$src/.config" || { echo "guest/build.sh: $opt did not stick in .config" >&2; exit 1; }
    done < "$here/kernel.fragment"
    make -C "$src" -s -j"$(nproc)" vmlinux bzImage >&2
    mkdir -p "$work/kernel"
    cp "$src/vmlinux" "$src/arch/x86/boot/bzImage" "$src/.config" "$work/kernel/"
    touch "$work/kernel/done"
    rm -rf "$kernel_dir"
    mv "$work/kernel" "$kernel_dir"
fi

echo "guest/build.sh: building the guest agent (static)" >&2
# Its own target directory, so that the host build's artefacts are left alone.
RUSTFLAGS="-C target-feature=+crt-static" cargo build -q --release --locked \
    --manifest-path "$repo/Cargo.toml" -p guest-agent \
    --target x86_64-unknown-linux-gnu --target-dir "$cache_root/agent-target" >&2
agent="$cache_root/agent-target/x86_64-unknown-linux-gnu/release/ember-agent"

echo "guest/build.sh: building the busybox root filesystem and initramfs" >&2
tree="$work/tree"
mkdir -p "$tree"/{bin,sbin,dev,proc,sys,tmp,etc,root,mnt,run}
cp /bin/busybox "$tree/bin/busybox"
cp "$here/init" "$tree/init"
cp "$agent" "$tree/bin/ember-agent"
ln -s ../init "$tree/sbin/init"
ln -s busybox "$tree/bin/sh"
# The applet links are made here rather than by `busybox --install` at boot: hundreds of
# system calls fewer in the guest, which matters where each one is slow (docs/pvm.md).
mkdir -p "$tree/usr/bin" "$tree/usr/sbin"
for applet in $(/bin/busybox --list-full); do
    [ -e "$tree/$applet" ] || [ -L "$tree/$applet" ] || ln -s /bin/busybox "$tree/$applet"
done
echo "root:x:0:0:root:/root:/bin/sh" > "$tree/etc/passwd"
printf '%s\n' "proc /proc proc defaults 0 0" "sysfs /sys sysfs defaults 0 0" \
    "tmpfs /tmp tmpfs defaults 0 0" > "$tree/etc/fstab"
(cd "$tree" && find . | cpio -o -H newc --quiet) | gzip -9 > "$work/initramfs.cpio.gz"
# The root filesystem also has crun and the shared libraries it loads, at the paths its
# loader looks for them (5 MiB the initramfs leaves out: there every byte is unpacked at boot).
crun=$(command -v crun)
cp "$crun" "$tree/usr/bin/crun"
for lib in $(ldd "$crun" | grep -o '/[^ ]*'); do
    mkdir -p "$tree$(dirname "$lib")"
    cp -L "$lib" "$tree$lib"
done
mkfs.ext4 -q -F -L ember-root -d "$tree" "$work/rootfs.ext4" 32M >/dev/null

mkdir -p "$out"
cp "$kernel_dir/vmlinux" "$kernel_dir/bzImage" "$work/rootfs.ext4" "$work/initramfs.cpio.gz" "$out/"
touch "$out/done"
echo "$out"
