"""A flush-journal writer over NBD: the client a fault test needs to prove that nothing a
server acknowledged as flushed is ever lost, whatever happens to it between flushes.

    journal.py URI write LOG SEED [--stop FILE] [--max N]
        write 4-64 KiB pieces at random 4 KiB-aligned offsets of the export, one request at
        a time, with a flush after every 1-8 writes, until FILE exists (then a last flush and
        exit 0) or N writes; every write is appended to LOG before it is sent ("W block
        stamp count") and every flush after it completes ("F"), each run starting with "S", so
        a writer killed at any
        point, or a server killed under it, leaves a LOG that says what was promised. An
        error from the server ends the run with exit 1, the log intact.
    journal.py URI verify LOG
        read every 4 KiB block the log wrote and check it holds what the log promised: the
        last write to it that a later flush covered, or any write to it after that (those
        were not promised, a crash may keep them or not); a block never covered by a flush
        may also still hold what was there before (zeros on a fresh volume).

Each block written carries its number and the write's stamp in its first 16 bytes and bytes
derived from both after, so a block from the wrong place or the wrong time is seen.
Exit 0 when every block checks out; the report says how many blocks and writes were checked.
"""
import os
import random
import struct
import sys

import nbd

BLOCK = 4096


def block_bytes(block: int, stamp: int) -> bytes:
    head = struct.pack("<QQ", block, stamp)
    body = random.Random(block * 1_000_003 + stamp).randbytes(BLOCK - len(head))
    return head + body


def write(uri: str, log_path: str, seed: int, stop: str, max_writes: int) -> int:
    h = nbd.NBD()
    h.connect_uri(uri)
    blocks = h.get_size() // BLOCK
    rng = random.Random(seed)
    # Stamps continue from an earlier run's log, so every write of the file is distinct.
    stamp = 0
    if os.path.exists(log_path):
        with open(log_path) as f:
            for line in f:
                p = line.split()
                if p and p[0] == "W":
                    stamp = max(stamp, int(p[2]))
    log = open(log_path, "a", buffering=1)
    # A new session: a flush of this run covers none of an earlier, killed run's writes.
    log.write("S\n")
    writes = flushes = 0
    try:
        while True:
            for _ in range(rng.randint(1, 8)):
                count = rng.randint(1, 16)
                first = rng.randrange(0, blocks - count + 1)
                stamp += 1
                data = b"".join(block_bytes(first + i, stamp) for i in range(count))
                log.write(f"W {first} {stamp} {count}\n")
                h.pwrite(data, first * BLOCK)
                writes += 1
            h.flush()
            log.write("F\n")
            flushes += 1
            if (stop and os.path.exists(stop)) or (max_writes and writes >= max_writes):
                break
    except nbd.Error as e:
        print(f"journal: write ended by the server after {writes} writes, {flushes} flushes: {e}")
        return 1
    finally:
        log.close()
    print(f"journal: {writes} writes, {flushes} flushes")
    return 0


def promised(log_path: str) -> dict:
    """Block -> (stamps allowed, whether a flush covered a write to it)."""
    # For each block: its writes in order, and the index of the last one a flush covered.
    writes: dict = {}
    covered: dict = {}
    unflushed: list = []
    with open(log_path) as f:
        for line in f:
            p = line.split()
            if not p:
                continue
            if p[0] == "W" and len(p) == 4:
                first, stamp, count = int(p[1]), int(p[2]), int(p[3])
                for b in range(first, first + count):
                    writes.setdefault(b, []).append(stamp)
                    unflushed.append(b)
            elif p[0] == "F":
                for b in unflushed:
                    covered[b] = len(writes[b]) - 1
                unflushed = []
            elif p[0] == "S":
                # The writer before was killed: what it had not flushed stays unpromised.
                unflushed = []
            # A torn last line (the writer killed mid-append) promised nothing.
    out = {}
    for b, stamps in writes.items():
        k = covered.get(b)
        if k is None:
            out[b] = (set(stamps), False)
        else:
            out[b] = (set(stamps[k:]), True)
    return out


def verify(uri: str, log_path: str) -> int:
    h = nbd.NBD()
    h.connect_uri(uri)
    want = promised(log_path)
    bad = 0
    flushed = 0
    for b in sorted(want):
        allowed, was_flushed = want[b]
        flushed += was_flushed
        got = h.pread(BLOCK, b * BLOCK)
        block, stamp = struct.unpack("<QQ", got[:16])
        ok = block == b and stamp in allowed and got == block_bytes(b, stamp)
        # Never promised: what was there before (zeros on a fresh volume) may still be.
        if ok or (not was_flushed and got == bytes(BLOCK)):
            continue
        bad += 1
        if bad <= 10:
            print(f"journal: block {b}: holds block {block} stamp {stamp}, "
                  f"promised one of {sorted(allowed)[:5]} (flushed: {was_flushed})")
    print(f"journal: verified {len(want)} blocks ({flushed} covered by a flush), {bad} bad")
    return 1 if bad else 0


def main() -> int:
    if len(sys.argv) >= 5 and sys.argv[2] == "write":
        args = sys.argv[5:]
        stop = args[args.index("--stop") + 1] if "--stop" in args else ""
        mx = int(args[args.index("--max") + 1]) if "--max" in args else 0
        return write(sys.argv[1], sys.argv[3], int(sys.argv[4]), stop, mx)
    if len(sys.argv) == 4 and sys.argv[2] == "verify":
        return verify(sys.argv[1], sys.argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
