#!/bin/bash
# A real filesystem: nbdfuse exposes the export as a file, a loop device
# over it, mkfs.ext4, mount, write a tree, unmount, e2fsck -fn; restart
# the server (SIGTERM), mount again and compare checksums.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || skip "needs root for losetup/mount"
[ -c /dev/fuse ] || skip "no /dev/fuse in this sandbox"
command -v nbdfuse >/dev/null || skip "nbdfuse not installed"
command -v losetup >/dev/null || skip "losetup not installed"
new_workdir
MP=$WORK/fuse; FS=$WORK/fs; mkdir -p "$MP" "$FS"
LOOP=; FUSE_PID=
teardown() {
    mountpoint -q "$FS" && umount "$FS"
    [ -n "$LOOP" ] && losetup -d "$LOOP" 2>/dev/null
    LOOP=
    if [ -n "$FUSE_PID" ]; then fusermount3 -u "$MP" 2>/dev/null || umount "$MP" 2>/dev/null; wait "$FUSE_PID" 2>/dev/null; fi
    FUSE_PID=
}
trap 'teardown; cleanup' EXIT

attach() {
    nbdfuse "$MP/disk" "$URI_UNIX" &
    FUSE_PID=$!
    local i
    for i in $(seq 100); do [ -e "$MP/disk" ] && break; sleep 0.1; done
    [ -e "$MP/disk" ] || skip "nbdfuse could not mount (FUSE not permitted in this sandbox?)"
    # A 512 MiB window keeps mkfs cheap whatever the export size.
    LOOP=$(losetup -f --show --direct-io=on --sizelimit $((512 << 20)) "$MP/disk") \
        || skip "loop devices are not available in this sandbox"
}

start_server
[ "$(export_size)" -ge $((512 << 20)) ] || die "export smaller than 512 MiB"
attach
mkfs.ext4 -q -F -E nodiscard "$LOOP"
mount "$LOOP" "$FS" || skip "mount is not permitted in this sandbox"
mkdir -p "$FS/tree"
for d in 1 2 3 4; do
    mkdir -p "$FS/tree/d$d"
    for f in $(seq 1 20); do head -c $((RANDOM * 4 + f)) /dev/urandom > "$FS/tree/d$d/f$f"; done
done
head -c $((32 << 20)) /dev/urandom > "$FS/tree/big"
cp -a /usr/share/doc/e2fsprogs "$FS/tree/" 2>/dev/null || true
(cd "$FS" && find tree -type f -print0 | sort -z | xargs -0 sha256sum) > "$WORK/sums"
fstrim "$FS" 2>/dev/null || true
umount "$FS"
e2fsck -fn "$LOOP"
teardown

stop_server
start_server
attach
e2fsck -fn "$LOOP"
mount "$LOOP" "$FS"
(cd "$FS" && sha256sum --quiet -c "$WORK/sums") || die "checksums differ after restart"
echo "$(wc -l < "$WORK/sums") files verified after restart"
umount "$FS"
teardown
stop_server
