"""Fill a volume over NBD with a deterministic pattern, or verify what an earlier fill wrote.

    fill.py URI write BYTES STATE   write 1 MiB pieces until BYTES or ENOSPC, flushing every
                                    8 MiB and at the end; record in STATE how many pieces a
                                    successful flush covered (a write is promised only once
                                    flushed: the server may acknowledge a write and lose it
                                    if the flush after it fails)
    fill.py URI verify STATE        read the recorded pieces back and compare

Exit 0 on success; `write` prints how far it got and whether the server answered ENOSPC.
"""
import errno
import random
import sys

import nbd

MIB = 1 << 20


def piece(i: int) -> bytes:
    # 1 MiB of incompressible bytes derived from i (compression must not flatter the fill).
    return random.Random(i).randbytes(MIB)


def is_enospc(e: "nbd.Error") -> bool:
    return getattr(e, "errno", None) == errno.ENOSPC or "ENOSPC" in str(e)


def main() -> int:
    uri, action = sys.argv[1], sys.argv[2]
    h = nbd.NBD()
    h.connect_uri(uri)
    if action == "write":
        target, state = int(sys.argv[3]), sys.argv[4]
        n, flushed, full = 0, 0, False

        def flush() -> bool:
            nonlocal flushed, full
            try:
                h.flush()
                flushed = n
                return True
            except nbd.Error as e:
                if not is_enospc(e):
                    raise
                full = True
                return False

        while (n + 1) * MIB <= min(target, h.get_size()):
            try:
                h.pwrite(piece(n), n * MIB)
            except nbd.Error as e:
                if is_enospc(e):
                    full = True
                    break
                raise
            n += 1
            if n % 8 == 0 and not flush():
                break
        if not full:
            flush()
        # Only pieces a successful flush covered count.
        with open(state, "w") as f:
            f.write(str(flushed))
        print(f"wrote {n} MiB, {flushed} MiB flushed, ENOSPC: {full}")
        return 0
    state = sys.argv[3]
    n = int(open(state).read())
    for i in range(n):
        if h.pread(MIB, i * MIB) != piece(i):
            print(f"piece {i} differs")
            return 1
    print(f"verified {n} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
