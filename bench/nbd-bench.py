#!/usr/bin/env python3
"""Helper of bench/nbd-bench.sh (standard library only).

  snap PID FILE        CPU ticks of PID and of every other process, now
  point BASE           one line per fio point (BASE.json, BASE.cpu0/1)
  report WORK ...      the markdown section; rewrites "## NBD front-end" in --doc
"""
import argparse
import datetime
import json
import os
import re
import statistics
import sys

HZ = os.sysconf("SC_CLK_TCK")
SECTION = "## NBD front-end"
# Free page reporting (virtio-balloon): free memory the guest hands back to the host, which
# drops it; the next touch of such a page faults on the host. Its counter, when the kernel has
# it, says how much was handed back during a point.
REPORTED = "/sys/module/page_reporting/parameters/reported_kib"


def reported_kib():
    try:
        return int(open(REPORTED).read())
    except (OSError, ValueError):
        return None


def snap(pid, out):
    procs = {}
    me = os.getpid()
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == me:
            continue
        try:
            s = open(f"/proc/{p}/stat").read()
        except OSError:
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        f = s[s.rindex(")") + 2:].split()
        procs[p] = (comm, int(f[11]) + int(f[12]))  # utime + stime
    import time
    json.dump({"t": time.time(), "server": str(pid), "p": procs, "reported_kib": reported_kib()},
              open(out, "w"))


def point(base):
    """IOPS, mean/p99 latency (us), server and client (fio) CPU us per I/O, other CPU %,
    MiB of free memory handed back to the host during the point."""
    j = json.load(open(base + ".json"))["jobs"][0]
    rw = "read" if j["read"]["total_ios"] else "write"
    d = j[rw]
    lat = d["lat_ns"]
    p99 = lat.get("percentile", {}).get("99.000000", 0) / 1000
    a, b = (json.load(open(base + x)) for x in (".cpu0", ".cpu1"))
    srv = a["server"]
    dt = b["t"] - a["t"]
    s_ticks = b["p"].get(srv, ["", 0])[1] - a["p"].get(srv, ["", 0])[1]
    other = 0
    for pid, (comm, t) in b["p"].items():
        if pid == srv or comm.startswith("fio"):
            continue
        other += t - a["p"].get(pid, [comm, 0])[1]
    # I/Os in the CPU window: fio's rate over its measured runtime times
    # the window (they are the same window up to fio's start-up).
    ios = d["iops"] * dt
    # fio's own CPU (usr + sys, % of its runtime) per I/O: the client's cost, which sets the
    # IOPS ceiling when the client is the bottleneck.
    fio_ios = d["total_ios"]
    client = ((j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] * 1e3 / fio_ios
              if fio_ios else float("nan"))
    ra, rb = a.get("reported_kib"), b.get("reported_kib")
    r = {
        "iops": d["iops"],
        "mean": lat["mean"] / 1000,
        "p99": p99,
        "cpu": s_ticks / HZ * 1e6 / ios if ios else float("nan"),
        "client": client,
        "other": 100 * other / HZ / dt if dt else 0,
        "reported": (rb - ra) / 1024 if ra is not None and rb is not None else None,
    }
    name = os.path.basename(base)
    rep = "" if r["reported"] is None else f", {r['reported']:.0f} MiB handed back to the host"
    print(f"{name}: {r['iops']:,.0f} IOPS, mean {r['mean']:.1f} us, p99 {r['p99']:.1f} us, "
          f"{r['cpu']:.2f} us CPU/IO, client {r['client']:.2f} us CPU/IO, "
          f"other CPU {r['other']:.0f}%{rep}")
    return r


def fmt_range(vals, f):
    if len(vals) == 1:
        return f.format(vals[0])
    return f"{f.format(min(vals))}–{f.format(max(vals))}"


def report(a):
    servers, rws, qds = a.servers.split(), a.rws.split(), a.qds.split()
    rounds = range(1, a.rounds + 1)
    res = {}
    for s in servers:
        for rw in rws:
            for qd in qds:
                for r in rounds:
                    base = os.path.join(a.work, f"{s}-{rw}-qd{qd}-r{r}")
                    if os.path.exists(base + ".json"):
                        with open(os.devnull, "w") as null:
                            old, sys.stdout = sys.stdout, null
                            try:
                                res[(s, rw, qd, r)] = point(base)
                            finally:
                                sys.stdout = old
    med = statistics.median
    out = [SECTION, ""]
    out.append(f"Measured {datetime.date.today().isoformat()} with:")
    out.append("")
    out.append("```")
    out.append(a.command.strip())
    out.append("```")
    out.append("")
    out.append(f"{a.setup}. {a.versions}. Servers: `flashpool serve --memory --ec 4+1` "
               "(memory drives, 4+1 parity, 1 GiB volume; `flashpool` on drives large enough "
               "that the pool never cleans during a run, `flashpool-gc` on drives small enough "
               "that the volume fills 60 % of the pool and every randwrite run cleans, both with the "
               "default adaptive busy polling, `flashpool-nopoll` as `flashpool` with "
               "`--busy-poll-us 0`), nbdkit `null` and `memory` plugins, "
               "`memserve` (our front-end over a RAM disk) and `memserve-null` (over an export "
               "that stores nothing, when measured), "
               "`qemu-nbd -f raw -t -e 4 --cache=none --aio=io_uring` on a /dev/shm file; every "
               "export prefilled (except null) so reads hit data. Server CPU = utime+stime from "
               "`/proc/PID/stat` over fio's measured window / I/Os completed in it. "
               "*Client CPU* = fio's usr+sys time per I/O (fio's JSON): the client's cost, which "
               "caps IOPS when fio is the bottleneck. "
               "*Other CPU* = every process except the server and fio over the same window "
               "(100 = one core): background load on the shared 2-vCPU machine. Before each "
               "point the server rests one second per GiB it holds (flashpool's prefaulted memory "
               "drives slow the machine for seconds after start-up), and after each server "
               "exits the script waits until the kernel has handed its freed memory back to the "
               "host (free page reporting, when the kernel has it).")
    out.append("")
    out.append("Median over rounds; IOPS and CPU/IO ranges are min–max over rounds.")
    out.append("")
    out.append("| server | rw | iodepth | IOPS | IOPS range | mean lat (us) | p99 lat (us) "
               "| server CPU us/IO | CPU us/IO range | client CPU us/IO | other CPU % |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in servers:
        for rw in rws:
            for qd in qds:
                pts = [res[(s, rw, qd, r)] for r in rounds if (s, rw, qd, r) in res]
                if not pts:
                    continue
                col = lambda k: [p[k] for p in pts]  # noqa: E731
                out.append(
                    f"| {s} | {rw} | {qd} | {med(col('iops')):,.0f} | "
                    f"{fmt_range(col('iops'), '{:,.0f}')} | {med(col('mean')):.1f} | "
                    f"{med(col('p99')):.1f} | {med(col('cpu')):.2f} | "
                    f"{fmt_range(col('cpu'), '{:.2f}')} | {med(col('client')):.2f} | "
                    f"{med(col('other')):.0f} |")
    # Targets, each ratio computed within one round, then median and range.
    out.append("")
    out.append("Targets (issue 3), ratios taken inside each round; median (min–max over rounds):")
    out.append("")
    out.append("| server | target | rw | ratio | required | met |")
    out.append("|---|---|---|---:|---:|:---:|")

    def ratios(rw, qd, den, key, num_s="flashpool"):
        v = []
        for r in rounds:
            x, y = res.get((num_s, rw, qd, r)), res.get((den, rw, qd, r))
            if x and y and y[key]:
                v.append(x[key] / y[key])
        return v

    def row(name, rw, v, bound, le):
        if not v:
            return
        m = med(v)
        ok = m <= bound if le else m >= bound
        out.append(f"| {who} | {name} | {rw} | {m:.2f} ({fmt_range(v, '{:.2f}')}) | "
                   f"{'≤' if le else '≥'} {bound} | {'yes' if ok else '**no**'} |")

    # flashpool is what the targets are about; memserve (front-end alone,
    # no engine) shows which side of the server a miss comes from, and
    # memserve-null (front-end over an export that stores nothing) its floor.
    for who in [w for w in ("flashpool", "flashpool-nopoll", "flashpool-gc", "memserve",
                            "memserve-null")
                if w in servers]:
        for rw in rws:
            def r(qd, den, key):
                return ratios(rw, qd, den, key, who)
            row("qd32 IOPS vs nbdkit-memory", rw, r("32", "nbdkit-memory", "iops"), 1.0, False)
            row("qd32 IOPS vs qemu-nbd", rw, r("32", "qemu-nbd", "iops"), 2.0, False)
            row("qd32 CPU/IO vs nbdkit-memory", rw, r("32", "nbdkit-memory", "cpu"), 0.7, True)
            row("qd1 mean latency vs nbdkit-memory", rw, r("1", "nbdkit-memory", "mean"), 1.0, True)
    text = "\n".join(out) + "\n"
    if a.extra and os.path.exists(a.extra):
        text += "\n" + open(a.extra).read().rstrip("\n") + "\n"
    print(text)
    if a.doc != "-":
        replace_section(a.doc, text)
        print(f"rewrote '{SECTION}' in {a.doc}", file=sys.stderr)


def replace_section(path, text):
    """Replace the level-2 section SECTION (up to the next '## ') or append it."""
    try:
        doc = open(path).read()
    except FileNotFoundError:
        doc = "# Performance\n\n"
    lines = doc.splitlines(keepends=True)
    start = next((i for i, l in enumerate(lines) if l.rstrip() == SECTION), None)
    if start is None:
        if doc and not doc.endswith("\n"):
            doc += "\n"
        new = doc + ("\n" if doc.strip() else "") + text
    else:
        end = len(lines)
        fence = False
        for i in range(start + 1, len(lines)):
            if lines[i].startswith("```"):
                fence = not fence
            if not fence and re.match(r"## ", lines[i]):
                end = i
                break
        body = text if end == len(lines) else text + "\n"
        new = "".join(lines[:start]) + body + "".join(lines[end:])
    tmp = path + ".tmp"
    open(tmp, "w").write(new)
    os.replace(tmp, path)


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "snap":
        snap(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 2 and sys.argv[1] == "point":
        point(sys.argv[2])
    elif len(sys.argv) >= 2 and sys.argv[1] == "report":
        p = argparse.ArgumentParser()
        p.add_argument("work")
        for k in ("servers", "rws", "qds", "command", "versions", "setup", "doc"):
            p.add_argument("--" + k, required=True)
        p.add_argument("--rounds", type=int, required=True)
        p.add_argument("--extra", help="markdown appended to the section (notes)")
        report(p.parse_args(sys.argv[2:]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
