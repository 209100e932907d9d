#!/bin/bash
# Pool membership with real block devices (loop devices) and real clients (flashpool only).
#  1. A 4+1 pool over five loop devices (`serve --drive /dev/loopN ...`, devices used whole),
#     and again over five file drives given with --drive,
#     holding 32 MiB written by nbdcopy. For each of the first, a middle and the last member:
#     the member's device is detached, the server starts degraded and serves every byte
#     (qemu-img compare), accepts writes (qemu-io), `flashpool drive replace` puts a spare
#     device in its place while serving, the rebuild makes the pool whole (status --json), and
#     after another member is lost the pool still serves every byte.
#  2. The devices re-attached in another order (each file now behind a different /dev/loopN):
#     the members are found by their superblocks, and the data verifies.
#  3. 4+2: two members missing still serve; 4+1: two missing is refused, naming both, and the
#     pool opens again once one is back.
#  4. A device holding ext4 is refused at creation without --force.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
if [ "${SERVER_KIND:-}" != flashpool ]; then echo "SKIP: member checks need flashpool serve"; exit 0; fi
command -v losetup >/dev/null || die "losetup missing"
[ "$(id -u)" = 0 ] || skip "loop devices need root"
new_workdir
# detach_all: every loop device backed by a file of this check's work dir.
detach_all() {
    local l
    for l in $(losetup -a | grep -F "$WORK/" | cut -d: -f1); do losetup -d "$l" 2>/dev/null || true; done
}
cleanup_all() {
    cleanup_server_only
    detach_all
    [ -n "${WORK:-}" ] && rm -rf "$WORK"
}
cleanup_server_only() {
    if [ -n "${SERVER_PID:-}" ]; then kill -TERM "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=; fi
}
trap cleanup_all EXIT
# A timeout or ^C ends the check through its EXIT trap, so no loop device is left attached.
trap "exit 143" TERM INT
FP="$TARGET/release/flashpool"

# attach FILE: attaches a loop device and appends its path to DEVS.
attach() {
    local l
    l=$(losetup -f --show "$1") || die "losetup failed for $1 (loop devices unavailable?)"
    DEVS+=("$l")
}
# detach DEV: the member is lost (a loop device detached, a file drive moved away).
detach() {
    if [ -b "$1" ]; then losetup -d "$1"; else mv "$1" "$1.gone"; fi
}
json() { "$FP" status --data "$DATA" --json; }
# same_data: the export's first 32 MiB equal the source written at the start.
same_data() {
    rm -f "$WORK/out.img"
    nbdcopy "$URI_UNIX" "$WORK/out.img" && cmp -n 33554432 "$WORK/out.img" "$WORK/src.img"
}
pyq() { $PY -c "import json,sys; v=json.load(sys.stdin); $1"; }

head -c 32M /dev/urandom > "$WORK/src.img"

# --- 1. each of first, middle, last member lost, served, replaced ---
# On loop devices (a member lost = its device detached) and on file drives (a member lost = its
# file moved away; the spare is a new file `replace` creates at the pool's drive size).
for kind in loop file; do
for victim in 0 2 4; do
    echo "== $kind: member $victim"
    rm -rf "$DATA" "$WORK"/f*.img*; DEVS=()
    for i in 0 1 2 3 4 5; do
        if [ "$kind" = loop ]; then
            truncate -s 0 "$WORK/b$i.img"; truncate -s 192M "$WORK/b$i.img"
            attach "$WORK/b$i.img"
        else
            DEVS+=("$WORK/f$i.img")
        fi
    done
    DRIVE_ARGS=()
    for i in 0 1 2 3 4; do DRIVE_ARGS+=(--drive "${DEVS[$i]}"); done
    SERVER_CMD="$FP serve --drive-size 192M --volume-size 96M ${DRIVE_ARGS[*]}" start_server
    nbdcopy "$WORK/src.img" "$URI_UNIX"
    stop_server
    detach "${DEVS[$victim]}"
    SERVER_CMD="$FP serve" start_server
    grep -q "member $victim" "$WORK/server.log" || die "no warning names member $victim"
    json | pyq "p=v['protection']; assert p['members_down']==1, p; print(p['summary'])"
    # qemu-img compares the 32 MiB source with the 96 MiB export (the rest must read zero).
    qemu-img compare -f raw -F raw "$WORK/src.img" "$URI_UNIX" || die "degraded read differs (member $victim gone)"
    qemu-io -f raw -c "write -P 0x5a 48M 8M" "$URI_UNIX" >/dev/null || die "degraded write failed"
    "$FP" drive --data "$DATA" replace "$victim" "${DEVS[5]}"
    json | pyq "p=v['protection']; d=v['drives']; assert p['members_down']==0 and p['failures_tolerated']==1, p; assert d[$victim]['state']=='retired', d; print('replaced:', p['summary'])"
    stop_server
    other=$(( (victim + 1) % 5 ))
    detach "${DEVS[$other]}"
    SERVER_CMD="$FP serve" start_server
    same_data || die "read differs after a second loss"
    qemu-io -f raw -c "read -P 0x5a 48M 8M" "$URI_UNIX" >/dev/null || die "written data lost after a second loss"
    stop_server
    detach_all
    echo "$kind: member $victim: degraded serve, write, replace, rebuild, second loss: every byte there"
done
done

# new_loop_pool N [SERVE ARGS...]: a fresh data dir, N new loop devices (DEVS), a pool made of
# them by `serve` with 32 MiB of src.img written through nbdcopy; the server is stopped.
new_loop_pool() {
    local n=$1 i; shift
    rm -rf "$DATA"; DEVS=()
    for i in $(seq 0 $((n - 1))); do
        truncate -s 0 "$WORK/b$i.img"; truncate -s 192M "$WORK/b$i.img"; attach "$WORK/b$i.img"
    done
    DRIVE_ARGS=(); for l in "${DEVS[@]}"; do DRIVE_ARGS+=(--drive "$l"); done
    SERVER_CMD="$FP serve --volume-size 96M $* ${DRIVE_ARGS[*]}" start_server
    nbdcopy "$WORK/src.img" "$URI_UNIX"
    stop_server
}

# --- 2. devices move between names ---
new_loop_pool 5
for l in "${DEVS[@]}"; do detach "$l"; done
# A spare device first, then the members in reverse order: every name now points elsewhere.
DEVS=(); truncate -s 64M "$WORK/spare.img"; attach "$WORK/spare.img"
for i in 4 3 2 1 0; do attach "$WORK/b$i.img"; done
SERVER_CMD="$FP serve" start_server
json | pyq "p=v['protection']; assert p['members_down']==0, (p, v['drives'], v['not_members']); print('moved devices found by superblock:', [d['identity'] for d in v['drives']])"
same_data || die "data differs after the devices moved"
stop_server
detach_all

# --- 3. two missing: 4+2 serves, 4+1 refuses until one is back ---
new_loop_pool 6 --ec 4+2
detach "${DEVS[1]}"; detach "${DEVS[4]}"
SERVER_CMD="$FP serve" start_server
json | pyq "p=v['protection']; assert p['members_down']==2 and p['failures_tolerated']==0, p; print('4+2:', p['summary'])"
same_data || die "4+2 with two members gone: data differs"
stop_server
detach_all

new_loop_pool 5
detach "${DEVS[0]}"; detach "${DEVS[3]}"
if "$FP" serve --data "$DATA" --listen "127.0.0.1:$PORT" > "$WORK/refused.log" 2>&1; then die "4+1 with two members gone was not refused"; fi
grep -q "2 of 5 members missing" "$WORK/refused.log" || { cat "$WORK/refused.log"; die "refusal does not count the missing"; }
grep -q "missing: member 0" "$WORK/refused.log" && grep -q "missing: member 3" "$WORK/refused.log" || { cat "$WORK/refused.log"; die "refusal does not name both"; }
attach "$WORK/b3.img"
SERVER_CMD="$FP serve" start_server
same_data || die "data differs after one member came back"
stop_server
echo "two missing: 4+2 serves, 4+1 refused naming both, opens again with one back"
detach_all

# --- 4. a device holding ext4 ---
rm -rf "$DATA"; DEVS=()
for i in 0 1 2 3 4; do truncate -s 0 "$WORK/b$i.img"; truncate -s 192M "$WORK/b$i.img"; attach "$WORK/b$i.img"; done
mkfs.ext4 -q -F "${DEVS[2]}"
DRIVE_ARGS=(); for l in "${DEVS[@]}"; do DRIVE_ARGS+=(--drive "$l"); done
if "$FP" serve --data "$DATA" --listen "127.0.0.1:$PORT" "${DRIVE_ARGS[@]}" > "$WORK/ext4.log" 2>&1; then die "a device holding ext4 was overwritten without --force"; fi
grep -q "holds an ext4 filesystem" "$WORK/ext4.log" || { cat "$WORK/ext4.log"; die "the refusal does not name the filesystem"; }
e2fsck -fn "${DEVS[2]}" >/dev/null || die "the refused creation damaged the ext4 filesystem"
SERVER_CMD="$FP serve --force --volume-size 96M ${DRIVE_ARGS[*]}" start_server
stop_server
echo "ext4 refused without --force, untouched; accepted with it"
