#!/usr/bin/python3
"""libnbd probe: negotiate with the server under test and check every
advertised flag, the block-size constraints, the base:allocation meta
context, structured reads with holes, fast zero, cache, block-status
extents, error mapping and multi-conn visibility.

usage: /usr/bin/python3 probe.py URI     (Debian's python3 has `nbd`)
Prints one line per check and exits non-zero if any failed.
"""
import errno
import os
import sys

import nbd

URI = sys.argv[1]
failures = []


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + (f" ({detail})" if detail and not cond else ""))
    if not cond:
        failures.append(name)


def expect_error(name, fn, want_errno):
    try:
        fn()
    except nbd.Error as e:
        check(name, e.errnum == want_errno, f"errno {e.errnum} {e.string}")
        return
    check(name, False, "no error")


# --- handshake in option mode -------------------------------------------
h = nbd.NBD()
h.set_opt_mode(True)
h.connect_uri(URI)
check("protocol newstyle-fixed", h.get_protocol() == "newstyle-fixed", h.get_protocol())
check("structured replies negotiated", h.get_structured_replies_negotiated())
hf = h.get_handshake_flags()
check("handshake flags FIXED_NEWSTYLE|NO_ZEROES",
      hf & nbd.HANDSHAKE_FLAG_FIXED_NEWSTYLE and hf & nbd.HANDSHAKE_FLAG_NO_ZEROES, str(hf))

exports = []
h.opt_list(lambda name, desc: exports.append((name, desc)) or 0)
check("OPT_LIST returns exports", len(exports) >= 1, str(exports))

contexts = []
n = h.opt_list_meta_context(lambda name: contexts.append(name) or 0)
check("OPT_LIST_META_CONTEXT offers base:allocation", nbd.CONTEXT_BASE_ALLOCATION in contexts, str(contexts))

h.set_export_name("does-not-exist-e2e")
try:
    h.opt_info()
    check("OPT_INFO on a missing export fails", False)
except nbd.Error:
    check("OPT_INFO on a missing export fails", True)

h.set_export_name("")
h.set_full_info(True)
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.opt_info()
size = h.get_size()
check("OPT_INFO reports a size", size > 0, str(size))
check("INFO_NAME gives a canonical name", len(h.get_canonical_export_name()) > 0)
check("block size minimum 1", h.get_block_size(nbd.SIZE_MINIMUM) == 1, str(h.get_block_size(nbd.SIZE_MINIMUM)))
check("block size preferred 4096", h.get_block_size(nbd.SIZE_PREFERRED) == 4096)
check("block size maximum 32 MiB", h.get_block_size(nbd.SIZE_MAXIMUM) == 32 << 20)
h.opt_go()

# --- transmission flags ---------------------------------------------------
for flag in ["can_flush", "can_fua", "can_trim", "can_zero", "can_fast_zero",
             "can_df", "can_cache", "can_multi_conn"]:
    check(flag, getattr(h, flag)() is True)
check("not read-only", not h.is_read_only())
check("not rotational", not h.is_rotational())
check("meta context base:allocation negotiated", h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION))

# --- data, holes, zeroes ---------------------------------------------------
BASE = min(size // 2, 64 << 20) // 4096 * 4096
MiB = 1 << 20
pat = os.urandom(256 * 1024)
h.pwrite(pat, BASE)
h.pwrite(pat[:4096], BASE + 1 * MiB, nbd.CMD_FLAG_FUA)
check("pread returns what pwrite wrote", h.pread(len(pat), BASE) == pat)
check("unaligned 1-byte read", h.pread(1, BASE + 12345) == pat[12345:12346])
h.pwrite(b"\x01\x02\x03", BASE + 7)
check("unaligned 3-byte write", h.pread(5, BASE + 6) == pat[6:7] + b"\x01\x02\x03" + pat[10:11])
h.pwrite(pat[:3], BASE + 7)

# A region that is certainly a hole: zero it first.
HOLE = BASE + 4 * MiB
h.zero(MiB, HOLE)
chunks = []
def on_chunk(buf, offset, status, err):
    chunks.append((offset, len(buf), status))
    return 0
buf = h.pread_structured(MiB, HOLE, on_chunk)
check("structured read of a zeroed range reads zeroes", bytes(buf) == bytes(MiB))
check("structured read of a hole uses OFFSET_HOLE", chunks and all(c[2] == nbd.READ_HOLE for c in chunks), str(chunks))

chunks.clear()
h.pread_structured(256 * 1024, BASE, on_chunk)
check("structured read of data uses OFFSET_DATA", all(c[2] == nbd.READ_DATA for c in chunks), str(chunks))

chunks.clear()
h.pwrite(pat[:4096], HOLE + 8192)
buf = h.pread_structured(65536, HOLE, on_chunk, nbd.CMD_FLAG_DF)
check("DF read: one content chunk", len(chunks) == 1 and chunks[0][2] == nbd.READ_DATA, str(chunks))
check("DF read: right bytes", bytes(buf) == bytes(8192) + pat[:4096] + bytes(65536 - 12288))

# block status over hole / data / hole
extents = []
def on_extents(ctx, offset, entries, err):
    if ctx == nbd.CONTEXT_BASE_ALLOCATION:
        extents.extend(zip(entries[0::2], entries[1::2]))
    return 0
h.block_status(65536, HOLE, on_extents)
check("block status: hole, data, hole",
      extents[:3] == [(8192, nbd.STATE_HOLE | nbd.STATE_ZERO), (4096, 0), (65536 - 12288, nbd.STATE_HOLE | nbd.STATE_ZERO)]
      or (extents[0][1] & nbd.STATE_ZERO and any(f == 0 for _, f in extents)),
      str(extents))
check("block status: lengths within the request", sum(l for l, _ in extents) <= 65536, str(extents))
extents.clear()
h.block_status(65536, HOLE, on_extents, nbd.CMD_FLAG_REQ_ONE)
check("block status REQ_ONE: one extent", len(extents) == 1, str(extents))
extents.clear()
h.block_status(65536, BASE, on_extents)
check("block status of written data has no HOLE flag", extents and extents[0][1] & nbd.STATE_HOLE == 0, str(extents))

# write zeroes variants
h.zero(65536, BASE, nbd.CMD_FLAG_FAST_ZERO)
check("fast zero succeeds and reads zeroes", h.pread(65536, BASE) == bytes(65536))
h.zero(65536, BASE + 65536, nbd.CMD_FLAG_NO_HOLE | nbd.CMD_FLAG_FUA)
check("zero NO_HOLE|FUA reads zeroes", h.pread(65536, BASE + 65536) == bytes(65536))
h.trim(65536, BASE + 131072, nbd.CMD_FLAG_FUA)
h.cache(MiB, BASE)
check("cache succeeds", True)
h.flush()
check("flush succeeds", True)

# errors: let bad requests reach the server
h.set_strict_mode(0)
expect_error("read past the end -> EINVAL", lambda: h.pread(4096, size - 2048), errno.EINVAL)
expect_error("write past the end -> ENOSPC", lambda: h.pwrite(bytes(4096), size - 2048), errno.ENOSPC)
expect_error("zero past the end -> ENOSPC", lambda: h.zero(4096, size - 2048), errno.ENOSPC)
expect_error("block status past the end -> EINVAL", lambda: h.block_status(4096, size, on_extents), errno.EINVAL)
expect_error("REQ_ONE on a read -> EINVAL", lambda: h.pread(512, 0, nbd.CMD_FLAG_REQ_ONE), errno.EINVAL)
check("connection still usable after errors", h.pread(4096, BASE + 1 * MiB) == pat[:4096])

# many requests in flight, answered out of order
cookies = {}
for i in range(64):
    b = nbd.Buffer.from_bytearray(bytearray(os.urandom(4096)))
    cookies[h.aio_pwrite(b, BASE + 8 * MiB + i * 4096)] = i
while h.aio_in_flight() > 0:
    h.poll(-1)
done = all(h.aio_command_completed(c) for c in cookies)
check("64 writes in flight all complete", done)

# multi-conn: a write acknowledged on one connection, flushed on another,
# is visible on a third.
h2 = nbd.NBD(); h2.connect_uri(URI)
h3 = nbd.NBD(); h3.connect_uri(URI)
data = os.urandom(8192)
h2.pwrite(data, BASE + 2 * MiB)
h3.flush()
check("multi-conn: visible on another connection after flush", h.pread(8192, BASE + 2 * MiB) == data)
h2.shutdown(); h3.shutdown()
h.shutdown()

print(f"{'FAILED' if failures else 'PASSED'}: {len(failures)} failed checks")
sys.exit(1 if failures else 0)
