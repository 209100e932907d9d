#!/bin/bash
# Fetches (never installs) what the guest harness needs from Debian's mirror
# with `apt-get download` and unpacks it with `dpkg-deb -x` into a cache:
#   $CACHE/debs/     the .deb files
#   $CACHE/sysroot/  qemu-system-x86, seabios, ipxe, busybox-static, nbd-client,
#                    nvme-cli, fio, e2fsprogs and every dependency that is not
#                    installed on this host (those libraries are on the host)
#   $CACHE/kernel/   Debian's stock kernel (linux-image-*-amd64)
# Proves nothing by itself; prints the cache dir and exits 0 when it is ready.
# A complete cache (the stamp file) is reused without touching the network.
#
#   tests/guest/fetch.sh          GUEST_CACHE=DIR overrides the cache dir
set -euo pipefail
GUEST_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$GUEST_DIR/../.." && pwd)
CACHE=${GUEST_CACHE:-$ROOT/target/guest-cache}
# Tools unpacked into the sysroot (with their not-installed dependencies).
PACKAGES=(qemu-system-x86 seabios ipxe-qemu qemu-system-data busybox-static
          nbd-client nvme-cli fio e2fsprogs util-linux)
# The kernel: the version linux-image-amd64 points at, unless GUEST_KERNEL_PKG says.
STAMP_VERSION=1

die() { echo "guest fetch FAILED: $*" >&2; exit 1; }

stamp=$CACHE/fetched.stamp
if [ -f "$stamp" ] && [ "$(head -1 "$stamp")" = "v$STAMP_VERSION ${PACKAGES[*]} ${GUEST_KERNEL_PKG:-}" ]; then
    echo "$CACHE"; exit 0
fi

command -v apt-get >/dev/null || die "apt-get not found (the harness needs a Debian host to fetch its packages)"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found"
mkdir -p "$CACHE/debs"

installed() { [[ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null)" == ii* ]]; }

# Depends of the packages named (first alternative, no virtual packages): one
# apt-cache call per level of the closure, not per package.
deps_of() {
    apt-cache depends --no-recommends --no-suggests --no-enhances --no-breaks \
        --no-replaces --no-conflicts "$@" 2>/dev/null |
        awk '/^  \|?(Pre)?Depends:/ { if (!alt && $2 !~ /^</) print $2; alt = ($1 ~ /^\|/); next }
             { alt = 0 }' | sort -u
}

kernel_of() { deps_of linux-image-amd64 | grep '^linux-image-' | head -1 || true; }
if [ -n "${GUEST_KERNEL_PKG:-}" ]; then
    kernel_pkg=$GUEST_KERNEL_PKG
else
    kernel_pkg=$(kernel_of)
    if [ -z "$kernel_pkg" ] && [ "$(id -u)" = 0 ]; then
        echo "no package lists: apt-get update" >&2
        apt-get update -qq >&2 || die "apt-get update failed"
        kernel_pkg=$(kernel_of)
    fi
    [ -n "$kernel_pkg" ] || die "cannot resolve linux-image-amd64 (run apt-get update first)"
fi

# The closure: the packages asked for, then every dependency not installed here.
declare -A seen=()
for p in "${PACKAGES[@]}"; do seen[$p]=1; done
level=("${PACKAGES[@]}")
want=()
while [ ${#level[@]} -gt 0 ]; do
    want+=("${level[@]}")
    next=()
    for d in $(deps_of "${level[@]}"); do
        [ -n "${seen[$d]:-}" ] && continue
        seen[$d]=1
        installed "$d" && continue
        next+=("$d")
    done
    level=("${next[@]}")
done

echo "fetching ${#want[@]} packages and $kernel_pkg into $CACHE/debs" >&2
rm -f "$CACHE"/debs/*.deb
(cd "$CACHE/debs" && apt-get -o APT::Sandbox::User=root download -q "${want[@]}" "$kernel_pkg" >&2) ||
    die "apt-get download failed (no network to the Debian mirror? run apt-get update first)"

rm -rf "$CACHE/sysroot" "$CACHE/kernel"
mkdir -p "$CACHE/sysroot" "$CACHE/kernel"
shopt -s nullglob
for p in "${want[@]}"; do
    debs=("$CACHE/debs/${p}_"*.deb)
    [ ${#debs[@]} -eq 1 ] || die "expected one .deb for $p in $CACHE/debs, found ${#debs[@]}"
    dpkg-deb -x "${debs[0]}" "$CACHE/sysroot"
done
debs=("$CACHE/debs/${kernel_pkg}_"*.deb)
[ ${#debs[@]} -eq 1 ] || die "expected one .deb for $kernel_pkg in $CACHE/debs"
dpkg-deb -x "${debs[0]}" "$CACHE/kernel"
kernels=("$CACHE/kernel/boot/"vmlinuz-*)
[ ${#kernels[@]} -eq 1 ] || die "$kernel_pkg holds no vmlinuz"
[ -x "$CACHE/sysroot/usr/bin/qemu-system-x86_64" ] || die "qemu-system-x86_64 missing from the sysroot"
[ -x "$CACHE/sysroot/bin/busybox" ] || die "busybox missing from the sysroot"
printf 'v%s %s %s\n%s\n' "$STAMP_VERSION" "${PACKAGES[*]}" "${GUEST_KERNEL_PKG:-}" "$kernel_pkg" > "$stamp"
echo "$CACHE"
