#!/usr/bin/env python3
"""Real-disk benchmark (issue 16): flashpool on the drives users have, next to the disk itself.

In one run, on the filesystem of WORKDIR (the machine's real disk; refused on tmpfs):

  raw           fio straight on a file there (io_uring, O_DIRECT): the physical limit
  qemu-nbd      qemu-nbd -f raw -t -e 4 --cache=none --aio=io_uring on a file there
  flashpool     `flashpool serve` on its default pool there (5 allocated file drives of
                1 GiB, 4+1, one 1 GiB volume): what a new user runs
  flashpool-mem `flashpool serve --memory` (the same pool on memory drives): a second row
  flashpool-reactors  the default pool again, its connections on reactor threads
                (`--nbd-reactors N`, N = --reactors, default half the CPUs): the fixed set of
                threads against a thread per connection, in the same run

for 4 KiB random read at iodepth 1, 32 and 4 jobs x 8, 4 KiB random write at iodepth 32, and
1 MiB sequential read and write at iodepth 8. NBD clients are fio's nbd engine over a Unix
socket. Every target is prefilled with 1 MiB writes first. Per point: IOPS, MiB/s, mean and
p99 completion latency, and the server's CPU time per I/O (utime+stime of its process over the
fio run / I/Os). Servers take turns point by point (ROUNDS rounds), so background load hits
them alike; the table gives the median over rounds, and the ratios the issue sets targets for.

  python3 bench/disk_bench.py [--workdir DIR] [--runtime S] [--rounds N] [--doc FILE]

--doc rewrites the "## Real disk" section of that file (docs/PERFORMANCE.md).
"""

import argparse
import resource
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

from benchlib import cpu_ticks, stop_server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 1 << 30
POINTS = [
    # name, rw, bs, iodepth, numjobs. Sequential reads first, on the data as the prefill laid
    # it out (random writes afterwards scatter it: a log-structured pool then reads 4 KiB
    # pieces, which the "read 1M after random writes" point shows), writes last.
    ("read 1M qd8", "read", "1M", 8, 1),
    ("randread qd1", "randread", "4k", 1, 1),
    ("randread qd32", "randread", "4k", 32, 1),
    ("randread 4x8", "randread", "4k", 8, 4),
    ("write 1M qd8", "write", "1M", 8, 1),
    ("randwrite qd32", "randwrite", "4k", 32, 1),
    ("read 1M after random writes", "read", "1M", 8, 1),
]


def fstype(path):
    out = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T", path],
                         capture_output=True, text=True).stdout.split()
    return out if out else ["?", "?"]


def wait_socket(path, proc, what, timeout=30):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited early ({proc.returncode})")
        if os.path.exists(path):
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
                s.close()
                return
            except OSError:
                pass
        time.sleep(0.1)
    raise SystemExit(f"{what} did not listen on {path}")


class Target:
    def __init__(self, name, work, flashpool, reactors=1):
        self.name, self.work, self.flashpool = name, work, flashpool
        self.reactors = reactors
        self.proc = None
        self.dir = os.path.join(work, name)

    def start(self):
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        sock = os.path.join(self.dir, "nbd.sock")
        log = open(os.path.join(self.dir, "server.log"), "w")
        if self.name == "raw":
            self.file = os.path.join(self.dir, "raw.img")
            return
        if self.name == "qemu-nbd":
            img = os.path.join(self.dir, "disk.img")
            subprocess.run(["fallocate", "-l", str(SIZE), img], check=True)
            self.proc = subprocess.Popen(
                ["qemu-nbd", "-f", "raw", "-t", "-e", "4", "--cache=none", "--aio=io_uring",
                 "-k", sock, img], stdout=log, stderr=log)
            self.uri = f"nbd+unix:///?socket={sock}"
        else:
            args = [self.flashpool, "serve", "--data", os.path.join(self.dir, "data"),
                    "--socket", sock, "--listen", "127.0.0.1:0"]
            if self.name == "flashpool-mem":
                args.append("--memory")
            if self.name == "flashpool-reactors":
                args += ["--nbd-reactors", str(self.reactors)]
            self.proc = subprocess.Popen(args, stdout=log, stderr=log)
            self.uri = f"nbd+unix:///default?socket={sock}"
        wait_socket(sock, self.proc, self.name)

    def stop(self):
        if self.proc:
            stop_server(self.proc)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def fio_args(self):
        if self.name == "raw":
            return ["--ioengine=io_uring", "--direct=1", f"--filename={self.file}",
                    f"--size={SIZE}"]
        return ["--ioengine=nbd", f"--uri={self.uri}", f"--size={SIZE}"]

    def fio(self, rw, bs, qd, jobs, runtime, extra=()):
        args = ["fio", "--name=p", f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}",
                f"--numjobs={jobs}", "--group_reporting", "--output-format=json", *extra]
        if runtime:
            args += ["--time_based", f"--runtime={runtime}", "--randrepeat=0"]
        args += self.fio_args()
        t0 = cpu_ticks(self.proc.pid) if self.proc else 0
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(args, capture_output=True, text=True)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t1 = cpu_ticks(self.proc.pid) if self.proc else 0
        if out.returncode != 0:
            raise SystemExit(f"fio failed on {self.name}: {out.stderr[-2000:]}")
        j = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
        d = j["read"] if rw in ("read", "randread") else j["write"]
        ios = d["total_ios"]
        hz = os.sysconf("SC_CLK_TCK")
        return {
            "iops": d["iops"],
            "mibs": d["bw"] / 1024,
            "mean_us": d["clat_ns"]["mean"] / 1000,
            "p99_us": d["clat_ns"]["percentile"].get("99.000000", 0) / 1000,
            "cpu_us": ((t1 - t0) / hz * 1e6 / ios) if (self.proc and ios) else None,
            # fio's own CPU (its job processes included): the client's cost per I/O, which
            # bounds what one client can drive whatever the server does.
            "client_us": ((c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime) * 1e6 / ios)
            if ios else None,
        }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default=os.path.join(ROOT, "target", "disk-bench"))
    ap.add_argument("--runtime", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--targets", default="raw,qemu-nbd,flashpool,flashpool-mem,flashpool-reactors")
    ap.add_argument("--reactors", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="reactor threads of the flashpool-reactors target")
    ap.add_argument("--flashpool", default=os.path.join(ROOT, "target", "release", "flashpool"))
    ap.add_argument("--doc", default=None)
    a = ap.parse_args()
    # Absolute: qemu-nbd refuses a relative socket path ("socket path must be absolute").
    a.workdir = os.path.abspath(a.workdir)
    os.makedirs(a.workdir, exist_ok=True)
    fs = fstype(a.workdir)
    if fs[0] in ("tmpfs", "ramfs"):
        raise SystemExit(f"{a.workdir} is on {fs[0]}: this benchmark measures a real disk")
    names = a.targets.split(",")
    results = {n: {p[0]: [] for p in POINTS} for n in names}
    # The raw file's 1 MiB writes with an fdatasync per GiB written, as durable as flashpool,
    # whose checkpoint flushes its drives once per GiB of host data (fio and qemu-nbd never
    # flush in the points above; on a virtual disk the flush is where the host writes back).
    SYNCED = "write 1M qd8, fdatasync per GiB"
    results.setdefault("raw", {})[SYNCED] = []
    for rnd in range(a.rounds):
        targets = [Target(n, a.workdir, a.flashpool, a.reactors) for n in names]
        try:
            for t in targets:
                t.start()
                print(f"round {rnd + 1}: prefill {t.name}", file=sys.stderr, flush=True)
                t.fio("write", "1M", 8, 1, 0)
            for (pname, rw, bs, qd, jobs) in POINTS:
                for t in targets:
                    r = t.fio(rw, bs, qd, jobs, a.runtime)
                    results[t.name][pname].append(r)
                    if t.name == "raw" and pname == "write 1M qd8":
                        results["raw"][SYNCED].append(
                            t.fio(rw, bs, qd, jobs, a.runtime, ["--fdatasync=1024"]))
                    cpu = f"{r['cpu_us']:.1f}" if r["cpu_us"] is not None else "-"
                    print(f"round {rnd + 1} {t.name:14} {pname:15} {r['iops']:9.0f} IOPS "
                          f"{r['mibs']:8.1f} MiB/s mean {r['mean_us']:7.1f} us "
                          f"p99 {r['p99_us']:7.1f} us cpu/io {cpu} us "
                          f"client {r['client_us']:.1f} us",
                          file=sys.stderr, flush=True)
        finally:
            for t in targets:
                t.stop()

    def med(n, p, k):
        v = [r[k] for r in results[n][p] if r[k] is not None]
        return statistics.median(v) if v else None

    lines = []
    lines.append(f"Filesystem of the work dir: {fs[0]} on {fs[1]}; {a.rounds} round(s) of "
                 f"{a.runtime} s per point; medians over rounds.")
    lines.append("")
    lines.append("| point | " + " | ".join(names) + " |")
    lines.append("|---|" + "---:|" * len(names))
    for (pname, rw, bs, qd, jobs) in POINTS:
        cells = []
        for n in names:
            iops, mibs = med(n, pname, "iops"), med(n, pname, "mibs")
            mean, p99, cpu = med(n, pname, "mean_us"), med(n, pname, "p99_us"), med(n, pname, "cpu_us")
            client = med(n, pname, "client_us")
            head = f"{mibs:.0f} MiB/s" if bs == "1M" else f"{iops / 1000:.1f} K"
            cpu_s = f", {cpu:.1f} us CPU/IO" if cpu is not None else ""
            client_s = f", fio {client:.1f} us" if client is not None else ""
            cells.append(f"{head} ({mean:.0f} / {p99:.0f} us{cpu_s}{client_s})")
        lines.append(f"| {pname} | " + " | ".join(cells) + " |")
    if results["raw"][SYNCED]:
        mibs, mean, p99 = (med("raw", SYNCED, k) for k in ("mibs", "mean_us", "p99_us"))
        cells = [f"{mibs:.0f} MiB/s ({mean:.0f} / {p99:.0f} us)" if n == "raw" else "-"
                 for n in names]
        lines.append(f"| {SYNCED} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Cells: IOPS or bandwidth (mean / p99 completion latency, server CPU per I/O, "
                 "fio's own CPU per I/O).")
    if "raw" in names and "flashpool" in names:
        k, m = 4, 1

        def ratio(p, key, other="raw"):
            a_ = med("flashpool", p, key)
            b_ = med(other, p, key)
            return a_ / b_ if a_ and b_ else float("nan")
        lines.append("")
        lines.append("| target (issue 16) | measured | goal |")
        lines.append("|---|---:|---:|")
        lines.append(f"| randread qd32 vs raw file | {ratio('randread qd32', 'iops'):.2f}x | >= 0.8x |")
        if "qemu-nbd" in names:
            lines.append(f"| randread qd32 vs qemu-nbd | {ratio('randread qd32', 'iops', 'qemu-nbd'):.2f}x | >= 1.3x |")
        lines.append(f"| read 1M qd8 vs raw file | {ratio('read 1M qd8', 'mibs'):.2f}x | >= 0.7x |")
        lines.append(f"| write 1M qd8 vs raw file x k/(k+m) | {ratio('write 1M qd8', 'mibs') / (k / (k + m)):.2f}x | >= 0.7x |")
        if results["raw"][SYNCED]:
            synced = med("flashpool", "write 1M qd8", "mibs") / med("raw", SYNCED, "mibs")
            lines.append(f"| (reference) write 1M qd8 vs raw file with an fdatasync per GiB x k/(k+m) | {synced / (k / (k + m)):.2f}x | - |")
        lines.append(f"| randwrite qd32 vs raw file | {ratio('randwrite qd32', 'iops'):.2f}x | >= 1.7x |")
        d = med("flashpool", "randread qd1", "mean_us") - med("raw", "randread qd1", "mean_us")
        lines.append(f"| randread qd1 mean latency over raw file | {d:+.0f} us | <= +30 us |")
    if "flashpool" in names and "flashpool-reactors" in names:
        lines.append("")
        lines.append(f"Reactors ({a.reactors} reactor thread{'s' if a.reactors != 1 else ''}) against a thread per connection, same pool:")
        lines.append("")
        lines.append("| point | reactors / threads | server CPU per I/O, reactors / threads |")
        lines.append("|---|---:|---:|")
        for (pname, rw, bs, qd, jobs) in POINTS:
            r_, t_ = med("flashpool-reactors", pname, "iops"), med("flashpool", pname, "iops")
            rc, tc = med("flashpool-reactors", pname, "cpu_us"), med("flashpool", pname, "cpu_us")
            cpu = f"{rc / tc:.2f}x" if rc and tc else "-"
            lines.append(f"| {pname} | {r_ / t_:.2f}x | {cpu} |")
    text = "\n".join(lines)
    print(text)
    if a.doc:
        cmd = "python3 bench/disk_bench.py " + " ".join(
            f"--{k} {v}" for k, v in (("runtime", a.runtime), ("rounds", a.rounds)))
        section = (f"## Real disk (issue 16)\n\nCommand: `{cmd} --doc docs/PERFORMANCE.md`, "
                   f"{time.strftime('%Y-%m-%d')}.\n\n{text}\n\n")
        doc = open(a.doc).read() if os.path.exists(a.doc) else ""
        start = doc.find("## Real disk (issue 16)")
        if start >= 0:
            end = doc.find("\n## ", start + 5)
            doc = doc[:start] + section + (doc[end + 1:] if end >= 0 else "")
        else:
            doc = doc.rstrip() + "\n\n" + section
        open(a.doc, "w").write(doc)


if __name__ == "__main__":
    main()
