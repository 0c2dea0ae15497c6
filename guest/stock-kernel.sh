#!/usr/bin/env bash
# Debian's stock cloud kernel (linux-image-*-cloud-amd64, unmodified) and a small initramfs
# that loads its virtio modules and hands over to the project's root filesystem on
# /dev/vda: what tests boot to check that a distribution kernel finds Ember's devices
# through ACPI. (Its virtio_mmio is a module without command-line devices, so it sees only
# what the DSDT describes.) Cached outside the repository by package version; prints the
# directory holding `vmlinuz` and `initrd.cpio.gz` on its last line.
#
#   guest/stock-kernel.sh            download and build what is missing
#   guest/stock-kernel.sh --dir      only print where they are (or would be)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache_root=${EMBER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ember}
fail() { echo "guest/stock-kernel.sh: $*" >&2; exit 1; }

# The package linux-image-cloud-amd64 points at (apt's lists name the version).
pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-6\./{print $2; exit}')
[ -n "$pkg" ] || fail "apt knows no linux-image-cloud-amd64 (run apt-get update on Debian 12)"
version=$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/{print $2}')
key=$( { cat "$here/stock-kernel.sh"; echo "$pkg $version"; dpkg-query -W -f='${Version}' busybox-static 2>/dev/null; } | sha256sum | cut -c1-16)
out="$cache_root/stock-kernel-$key"
if [ "${1:-}" = "--dir" ]; then
    echo "$out"
    exit 0
fi
if [ -f "$out/done" ]; then
    echo "$out"
    exit 0
fi
[ -x /bin/busybox ] || fail "/bin/busybox is missing (apt-get install busybox-static)"

mkdir -p "$cache_root"
work=$(mktemp -d "$cache_root/stock.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "guest/stock-kernel.sh: downloading $pkg $version" >&2
(cd "$work" && apt-get download -q "$pkg" >/dev/null 2>&1) || fail "cannot download $pkg (apt-get download $pkg)"
dpkg-deb -x "$work"/*.deb "$work/pkg"
release=$(ls "$work/pkg/lib/modules")
modules="$work/pkg/lib/modules/$release/kernel"

# The initramfs: busybox, the virtio modules in dependency order (virtio-mmio, and
# virtio-pci for `--enable-pci`), and an init that mounts the root disk and switches to it
# (its /sbin/init is the project's, which runs ember_cmd).
tree="$work/initrd"
MODULES="virtio_ring virtio virtio_mmio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_blk"
mkdir -p "$tree/bin" "$tree/lib/modules" "$tree/proc" "$tree/sys" "$tree/dev" "$tree/newroot"
cp /bin/busybox "$tree/bin/busybox"
for m in $MODULES; do
    found=$(find "$modules" -name "$m.ko" | head -n 1)
    [ -n "$found" ] || fail "$pkg has no $m.ko"
    cp "$found" "$tree/lib/modules/"
done
{ echo "#!/bin/busybox sh"; echo "MODULES=\"$MODULES\""; } > "$tree/init"
cat >> "$tree/init" <<'INIT'
# Loads the virtio modules, waits for the root disk (described by the DSDT, or found on the
# PCI bus), and switches to it.
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev
for m in $MODULES; do
    /bin/busybox insmod "/lib/modules/$m.ko" || echo "stock-initrd: insmod $m failed"
done
n=0
while [ ! -b /dev/vda ] && [ $n -lt 100 ]; do /bin/busybox sleep 0.1; n=$((n + 1)); done
[ -b /dev/vda ] || { echo "stock-initrd: no /dev/vda"; /bin/busybox ls /sys/bus/platform/devices; exit 1; }
/bin/busybox mount -o ro -t ext4 /dev/vda /newroot || exit 1
/bin/busybox umount /proc /sys
/bin/busybox mount --move /dev /newroot/dev 2>/dev/null || /bin/busybox umount /dev
exec /bin/busybox switch_root /newroot /sbin/init
INIT
chmod 755 "$tree/init"
(cd "$tree" && find . | cpio -o -H newc --quiet | gzip -9) > "$work/initrd.cpio.gz"

mkdir -p "$work/out"
cp "$work/pkg/boot/vmlinuz-$release" "$work/out/vmlinuz"
cp "$work/pkg/boot/config-$release" "$work/out/config"
mv "$work/initrd.cpio.gz" "$work/out/"
echo "$pkg $version" > "$work/out/package"
touch "$work/out/done"
rm -rf "$out"
mv "$work/out" "$out"
echo "$out"
