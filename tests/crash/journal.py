#!/usr/bin/python3
"""Writer and verifier of the kill -9 crash test (tests/crash/kill9.sh).

  journal.py write URI JOURNAL SEED REGION_BLOCKS FLUSH_EVERY
      Writes 4 KiB blocks at random LBAs of the first REGION_BLOCKS blocks, each block naming
      its (lba, stamp), and sends FLUSH every FLUSH_EVERY writes (sometimes FUA instead).
      Appends "W lba stamp" to JOURNAL before each write and "F" after each flush returns,
      each line flushed to the OS at once, so the journal survives the client being cut off.
      Runs until the server goes away.

  journal.py verify URI JOURNAL STATE
      STATE (JSON lba -> stamp) holds what earlier rounds verified. Every LBA must now hold
      the stamp of its last write before the journal's last F (flushed: must survive), or any
      stamp written after it (unflushed: may or may not survive). Prints what it checked,
      rewrites STATE with what it found, exits 1 on the first violation.
"""
import json, os, random, struct, sys
import nbd

BS = 4096


def block(lba, stamp):
    head = struct.pack("<QQ", lba, stamp)
    return (head * (BS // 16))


def decode(buf):
    if buf == bytes(BS):
        return 0
    lba, stamp = struct.unpack_from("<QQ", buf)
    if block(lba, stamp) != buf:
        return None
    return (lba, stamp)


def write(uri, journal, seed, region, flush_every):
    rnd = random.Random(seed)
    h = nbd.NBD()
    h.connect_uri(uri)
    j = open(journal, "a", buffering=1)
    n = 0
    stamp = seed << 32
    while True:
        lba = rnd.randrange(region)
        stamp += 1
        j.write("W %d %d\n" % (lba, stamp))
        j.flush()
        fua = rnd.random() < 0.05
        h.pwrite(block(lba, stamp), lba * BS, nbd.CMD_FLAG_FUA if fua else 0)
        n += 1
        if fua:
            j.write("F\n")
            j.flush()
        if n % flush_every == 0:
            h.flush()
            j.write("F\n")
            j.flush()


def verify(uri, journal, state_path):
    state = {}
    if os.path.exists(state_path):
        state = {int(k): v for k, v in json.load(open(state_path)).items()}
    durable = dict(state)       # lba -> stamp that must be there (0: zeros)
    pending = {}                # lba -> stamps written after the last flush
    for line in open(journal):
        p = line.split()
        if not p:
            continue
        if p[0] == "W" and len(p) == 3:
            pending.setdefault(int(p[1]), []).append(int(p[2]))
        elif p[0] == "F":
            for lba, stamps in pending.items():
                durable[lba] = stamps[-1]
            pending = {}
    h = nbd.NBD()
    h.connect_uri(uri)
    lbas = sorted(set(durable) | set(pending))
    flushed_ok = unflushed_seen = 0
    for lba in lbas:
        got = decode(h.pread(BS, lba * BS))
        want = durable.get(lba, 0)
        allowed = {want} | set(pending.get(lba, []))
        stamp = got if got == 0 else (got[1] if got and got[0] == lba else None)
        if stamp not in allowed:
            print("FAIL: lba %d holds %r, flushed stamp %d, unflushed %r"
                  % (lba, got, want, pending.get(lba, [])))
            sys.exit(1)
        if stamp == want:
            flushed_ok += 1
        else:
            unflushed_seen += 1
        state[lba] = stamp
    h.shutdown()
    json.dump({str(k): v for k, v in state.items()}, open(state_path + ".tmp", "w"))
    os.replace(state_path + ".tmp", state_path)
    print("verified %d blocks: %d hold their flushed contents, %d a later unflushed write"
          % (len(lbas), flushed_ok, unflushed_seen))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        try:
            write(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
        except nbd.Error:
            sys.exit(0)   # the server was killed: expected
    elif sys.argv[1] == "verify":
        verify(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)
