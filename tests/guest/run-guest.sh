#!/bin/bash
# Boots Debian's stock kernel in a qemu guest (TCG, no KVM) with the harness's
# initramfs and runs one guest script in it; proves that the script passed
# inside a real Linux kernel: exits 0 only when the guest printed its PASS
# marker (GUEST-RESULT <nonce> PASS), non-zero on a failing script, a kernel
# that never got there, a timeout, or a host that cannot fetch or run qemu.
#
#   tests/guest/run-guest.sh SCRIPT [NAME=VALUE...]
#
# SCRIPT runs as /test.sh under busybox sh with each NAME=VALUE exported; the
# guest reaches the host's 127.0.0.1 as 10.0.2.2 (its only route). Environment:
#   GUEST_CACHE    package cache (default $ROOT/target/guest-cache; see fetch.sh)
#   GUEST_LOG      serial console log (default: a new file under $GUEST_CACHE/logs)
#   GUEST_TIMEOUT  seconds before the guest is killed (default 300)
#   GUEST_MEM      guest memory in MiB (default 1024)
#   GUEST_SMP      guest CPUs (default 1)
#   GUEST_ACCEL    qemu accelerator (default tcg; kvm where /dev/kvm works)
#   GUEST_EXTRA_INITRD  another gzip'd cpio archive appended after the base one (e.g.
#                  fetch-trixie.sh's /opt/trixie tree)
set -euo pipefail
GUEST_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$GUEST_DIR/../.." && pwd)
export GUEST_CACHE=${GUEST_CACHE:-$ROOT/target/guest-cache}
CACHE=$GUEST_CACHE

die() { echo "guest FAILED: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: $0 SCRIPT [NAME=VALUE...]"
script=$1; shift
[ -f "$script" ] || die "no guest script $script"
for kv in "$@"; do [[ $kv == [A-Za-z_]*=* ]] || die "not NAME=VALUE: $kv"; done

t0=$(date +%s.%N)
dt() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# 1. Packages (cached after the first run). One fetch or build at a time per cache.
mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock 9
bash "$GUEST_DIR/fetch.sh" >/dev/null || die "could not fetch the guest packages (see above)"
t1=$(date +%s.%N)
SYS=$CACHE/sysroot
kdirs=("$CACHE"/kernel/lib/modules/*/)
[ -d "${kdirs[0]}" ] || die "no kernel modules in $CACHE/kernel"
kver=$(basename "${kdirs[0]}")
kernel=$CACHE/kernel/boot/vmlinuz-$kver
[ -f "$kernel" ] || die "no kernel $kernel in the cache"

# 2. Base initramfs, rebuilt when the cache or the harness changed.
base=$CACHE/initramfs-$kver.cpio.gz
if [ ! -f "$base" ] || [ "$CACHE/fetched.stamp" -nt "$base" ] ||
   [ "$GUEST_DIR/init" -nt "$base" ] || [ "$GUEST_DIR/mkinitramfs.py" -nt "$base" ]; then
    python3 "$GUEST_DIR/mkinitramfs.py" "$CACHE" "$kver" "$GUEST_DIR/init" "$base" ||
        die "initramfs build failed"
fi
flock -u 9
t2=$(date +%s.%N)

# 3. The test archive: the script and its environment.
mkdir -p "$CACHE/logs"
run=$(mktemp -d "$CACHE/logs/run.XXXXXX")
trap 'rm -rf "$run"' EXIT
nonce=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
{
    echo "export NONCE='$nonce'"
    for kv in "$@"; do printf "export %s='%s'\n" "${kv%%=*}" "${kv#*=}"; done
} > "$run/test.env"
python3 "$GUEST_DIR/mkinitramfs.py" --files "$run/test.cpio.gz" \
    "test.sh=$script" "test.env=$run/test.env"
extra=${GUEST_EXTRA_INITRD:-}
[ -z "$extra" ] || [ -f "$extra" ] || die "GUEST_EXTRA_INITRD $extra does not exist"
cat "$base" ${extra:+"$extra"} "$run/test.cpio.gz" > "$run/initrd"

# 4. Boot. qemu-system-x86 is unpacked, not installed: its libraries and
# firmware come from the sysroot.
qemu=$SYS/usr/bin/qemu-system-x86_64
[ -x "$qemu" ] || die "no $qemu in the cache"
# Default logs: the newest 20 are kept.
find "$CACHE/logs" -maxdepth 1 -name 'guest-*.log' -printf '%T@ %p\n' | sort -rn |
    tail -n +20 | cut -d' ' -f2- | xargs -r rm -f
log=${GUEST_LOG:-$CACHE/logs/guest-$(date +%Y%m%d-%H%M%S)-$$.log}
: > "$log"
export LD_LIBRARY_PATH=$SYS/usr/lib/x86_64-linux-gnu:$SYS/lib/x86_64-linux-gnu
"$qemu" --version >/dev/null 2>&1 || die "qemu-system-x86_64 cannot run here: $("$qemu" --version 2>&1 | tail -1)"
echo "guest: booting $kver (log $log)" >&2
rc=0
timeout -k 5 "${GUEST_TIMEOUT:-300}" "$qemu" \
    -L "$SYS/usr/share/qemu" -L "$SYS/usr/share/seabios" -L "$SYS/usr/lib/ipxe/qemu" \
    -accel "${GUEST_ACCEL:-tcg}" -cpu max -m "${GUEST_MEM:-1024}" -smp "${GUEST_SMP:-1}" \
    -nodefaults -nographic -no-reboot -serial "file:$log" -monitor none \
    -kernel "$kernel" -initrd "$run/initrd" \
    -append "console=ttyS0 panic=-1 quiet" \
    -netdev user,id=n0 -device virtio-net-pci,netdev=n0,romfile= \
    </dev/null >"$run/qemu.out" 2>&1 || rc=$?
unset LD_LIBRARY_PATH
t3=$(date +%s.%N)
echo "guest: fetch $(dt "$t0" "$t1")s, initramfs $(dt "$t1" "$t2")s, boot+script $(dt "$t2" "$t3")s" >&2

if grep -qa "^GUEST-RESULT $nonce PASS" "$log"; then
    echo "guest: PASS" >&2
    exit 0
fi
echo "---- guest console (last 40 lines of $log) ----" >&2
tail -40 "$log" | tr -d '\r' >&2
[ -s "$run/qemu.out" ] && { echo "---- qemu ----" >&2; tail -20 "$run/qemu.out" >&2; }
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    die "guest timed out after ${GUEST_TIMEOUT:-300}s without a result"
elif grep -qa "^GUEST-RESULT $nonce FAIL" "$log"; then
    die "guest script failed: $(grep -a "^GUEST-RESULT $nonce FAIL" "$log" | tr -d '\r')"
else
    die "guest ended (qemu exit $rc) without a result marker"
fi
