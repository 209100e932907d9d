#!/usr/bin/env python3
"""NVMe/TCP against NBD on the same pool, in one run (issue 17's benchmark).

One `flashpool serve --memory` (memory drives, so the front-ends are measured, not a disk)
exports its `default` volume over both doors at once: NBD (`--listen`, TCP on 127.0.0.1) and
NVMe/TCP (`--nvme-tcp`, 127.0.0.1). For ROUNDS rounds the volume is filled through NBD (fio,
1 MiB sequential writes, so 1 MiB reads find their data contiguous), then, point by point,
the two protocols take turns (NBD first in odd rounds, NVMe/TCP first in even ones):

  randread 1M qd8                               (1 MiB, aligned, random over the volume)
  randread qd1, randread qd32, randwrite qd32   (4 KiB, random over the 1 GiB volume)

NBD is driven by fio's nbd engine (libnbd), NVMe/TCP by `nvme-load`, the small Rust
initiator in crates/nvmet/examples/nvme-load.rs (no kernel initiator can be loaded here).
The clients differ, so IOPS and latency compare two client+server pairs; the fair
comparison of the servers is the server's CPU time per I/O: utime+stime of the server
process (/proc/PID/stat) over the client's run / I/Os completed. Each client's own CPU per
I/O (getrusage of the finished child) is reported too, to show whether a client limits
IOPS; "other CPU" is the machine's busy time minus server and client over the point
(100 = one core), i.e. background load on a shared machine. Table: medians over rounds, CPU
ranges min-max; ratios NVMe/TCP over NBD taken inside each round, median (min-max).

  python3 bench/nvme_vs_nbd.py [--runtime S] [--rounds N] [--flashpool BIN] [--load BIN]
                               [--file-drives]

`--file-drives` serves the default pool instead (five 1 GiB drive files in a work dir under
target/, on this machine's disk): the front-ends over the drives users have, where a read
waits for the disk (reads of both doors go through the engine's read queue).

Needs `cargo build --release -p flashpool -p flashpool-nvmet --example nvme-load` first.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import cpu_ticks, stop_server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 1 << 30
DRIVE_SIZE = "2G"  # 5 x 2 GiB memory drives (4+1): the 1 GiB volume, room to spare
POINTS = [
    # name, rw, block size, iodepth
    ("randread 1M qd8", "randread", "1M", 8),
    ("randread qd1", "randread", "4k", 1),
    ("randread qd32", "randread", "4k", 32),
    ("randwrite qd32", "randwrite", "4k", 32),
]
PROTOS = ["nbd", "nvme-tcp"]
HZ = os.sysconf("SC_CLK_TCK")


def busy_ticks():
    """Busy jiffies of the whole machine (all CPUs), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v[:8]) - v[3] - v[4]  # minus idle and iowait


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class Server:
    def __init__(self, flashpool, file_drives=False):
        if file_drives:
            # On the disk, not /tmp (which may be a tmpfs).
            base = os.path.join(ROOT, "target")
            os.makedirs(base, exist_ok=True)
            self.dir = tempfile.mkdtemp(prefix="nvme-vs-nbd-", dir=base)
        else:
            self.dir = tempfile.mkdtemp(prefix="nvme-vs-nbd-")
        self.out = os.path.join(self.dir, "stdout")
        self.log = os.path.join(self.dir, "server.log")
        drives = [] if file_drives else ["--memory", "--drive-size", DRIVE_SIZE]
        args = [flashpool, "serve", *drives, "--data", os.path.join(self.dir, "data"),
                "--listen", "127.0.0.1:0", "--nvme-tcp", "127.0.0.1:0",
                "--volume-size", str(SIZE)]
        self.cmd = " ".join(args[1:]).replace(self.dir, "TMP")
        self.proc = subprocess.Popen(args, stdout=open(self.out, "w"), stderr=open(self.log, "w"))
        self.nbd = self.nvme = None
        t0 = time.time()
        while time.time() - t0 < 120 and not (self.nbd and self.nvme):
            if self.proc.poll() is not None:
                raise SystemExit(f"flashpool serve exited ({self.proc.returncode}): "
                                 f"{open(self.log).read()[-2000:]}")
            for line in open(self.out).read().split():
                if line.startswith("nbd://"):
                    self.nbd = line
                elif line.startswith("nvme-tcp://"):
                    self.nvme = line
            time.sleep(0.2)
        if not (self.nbd and self.nvme):
            self.stop()
            raise SystemExit("flashpool serve printed no NBD and NVMe/TCP address in 120 s")

    def stop(self):
        stop_server(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


def measure(server, args, parse):
    """Run one client to completion; its result with the server/client/other CPU per I/O."""
    s0, c0, b0, t0 = cpu_ticks(server.proc.pid), children_cpu(), busy_ticks(), time.time()
    out = subprocess.run(args, capture_output=True, text=True)
    s1, c1, b1, t1 = cpu_ticks(server.proc.pid), children_cpu(), busy_ticks(), time.time()
    if out.returncode != 0:
        raise SystemExit(f"{args[0]} failed ({out.returncode}): {out.stderr[-2000:]}")
    r = parse(out.stdout)
    server_s, client_s = (s1 - s0) / HZ, c1 - c0
    r["server_us"] = server_s * 1e6 / r["ios"]
    r["client_us"] = client_s * 1e6 / r["ios"]
    r["other_pct"] = max(0.0, ((b1 - b0) / HZ - server_s - client_s) / (t1 - t0) * 100)
    return r


def parse_fio(stdout):
    j = json.loads(stdout[stdout.index("{"):])["jobs"][0]
    d = j["read"] if j["read"]["total_ios"] else j["write"]
    return {"ios": d["total_ios"], "iops": d["iops"], "mean_us": d["clat_ns"]["mean"] / 1000,
            "p99_us": d["clat_ns"]["percentile"].get("99.000000", 0) / 1000}


def parse_load(stdout):
    line = [x for x in stdout.splitlines() if x.startswith("nvme-load ")][-1]
    kv = dict(f.split("=", 1) for f in line.split()[1:])
    return {"ios": int(kv["ios"]), "iops": float(kv["iops"]), "mean_us": float(kv["mean_us"]),
            "p99_us": float(kv["p99_us"])}


def fio_nbd(server, rw, bs, qd, runtime):
    args = ["fio", "--name=p", f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}",
            "--ioengine=nbd", f"--uri={server.nbd}", f"--size={SIZE}", "--output-format=json"]
    if runtime:
        args += ["--time_based", f"--runtime={runtime}", "--randrepeat=0", "--norandommap"]
    return measure(server, args, parse_fio)


def nvme_load(server, load, rw, bs, qd, runtime):
    args = [load, "--addr", server.nvme, "--rw", rw, "--qd", str(qd), "--seconds", str(runtime),
            "--size", str(SIZE), "--bs", bs]
    return measure(server, args, parse_load)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runtime", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--flashpool", default=os.path.join(ROOT, "target", "release", "flashpool"))
    ap.add_argument("--load", default=os.path.join(ROOT, "target", "release", "examples",
                                                   "nvme-load"))
    ap.add_argument("--file-drives", action="store_true",
                    help="the default pool of drive files on this disk, not memory drives")
    a = ap.parse_args()
    for b in (a.flashpool, a.load):
        if not os.access(b, os.X_OK):
            raise SystemExit(f"{b} missing: cargo build --release -p flashpool "
                             "-p flashpool-nvmet --example nvme-load")
    load_before, started = loadavg(), time.strftime("%Y-%m-%d %H:%M")
    srv = Server(a.flashpool, a.file_drives)
    results = {p: {pt[0]: [] for pt in POINTS} for p in PROTOS}
    try:
        print(f"serving {srv.nbd} and {srv.nvme}; resting 10 s (drives prefaulted or allocated)",
              file=sys.stderr, flush=True)
        time.sleep(10)
        for rnd in range(a.rounds):
            r = fio_nbd(srv, "write", "1M", 8, 0)
            print(f"fill: {r['ios']} x 1 MiB through NBD", file=sys.stderr, flush=True)
            order = PROTOS if rnd % 2 == 0 else PROTOS[::-1]
            for (pname, rw, bs, qd) in POINTS:
                for proto in order:
                    if proto == "nbd":
                        r = fio_nbd(srv, rw, bs, qd, a.runtime)
                    else:
                        r = nvme_load(srv, a.load, rw, bs, qd, a.runtime)
                    results[proto][pname].append(r)
                    print(f"round {rnd + 1} {proto:8} {pname:15} {r['iops']:9.0f} IOPS "
                          f"mean {r['mean_us']:7.1f} us p99 {r['p99_us']:7.1f} us "
                          f"server {r['server_us']:5.2f} us/IO client {r['client_us']:5.2f} "
                          f"us/IO other {r['other_pct']:3.0f}%", file=sys.stderr, flush=True)
    finally:
        srv.stop()
    load_after = loadavg()

    def med(p, pt, k):
        return statistics.median(r[k] for r in results[p][pt])

    def rng(p, pt, k):
        v = [r[k] for r in results[p][pt]]
        return f"{min(v):.2f}-{max(v):.2f}"

    names = {"nbd": "NBD (fio nbd engine)", "nvme-tcp": "NVMe/TCP (nvme-load)"}
    out = [f"Run {started}, {a.rounds} rounds x {a.runtime} s per point, "
           f"load average before {load_before}, after {load_after}; "
           f"server: `flashpool {srv.cmd}`.", "",
           "| point | protocol (client) | IOPS | mean lat (us) | p99 lat (us) "
           "| server CPU us/IO | range | client CPU us/IO | other CPU % |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (pt, _, _, _) in POINTS:
        for p in PROTOS:
            out.append(f"| {pt} | {names[p]} | {med(p, pt, 'iops'):,.0f} | "
                       f"{med(p, pt, 'mean_us'):.1f} | {med(p, pt, 'p99_us'):.1f} | "
                       f"{med(p, pt, 'server_us'):.2f} | {rng(p, pt, 'server_us')} | "
                       f"{med(p, pt, 'client_us'):.2f} | {med(p, pt, 'other_pct'):.0f} |")
    out += ["", "NVMe/TCP over NBD, inside each round: median (min-max).", "",
            "| point | IOPS | mean latency | server CPU per I/O | client CPU per I/O |",
            "|---|---:|---:|---:|---:|"]
    for (pt, _, _, _) in POINTS:
        cells = []
        for k in ("iops", "mean_us", "server_us", "client_us"):
            v = [n[k] / b[k] for n, b in zip(results["nvme-tcp"][pt], results["nbd"][pt])]
            cells.append(f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")
        out.append(f"| {pt} | " + " | ".join(cells) + " |")
    out += ["", "The clients differ (fio's nbd engine on libnbd against the small nvme-load "
            "initiator): IOPS and latency compare client+server pairs; server CPU per I/O "
            "compares the servers."]
    print("\n".join(out))


if __name__ == "__main__":
    main()
