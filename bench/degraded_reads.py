#!/usr/bin/env python3
"""Reads with a drive down: the default pool, healthy and then degraded, in one run.

`flashpool serve` on its default pool in WORKDIR (5 file drives on the machine's real disk,
4+1; refused on tmpfs), the volume filled with 1 MiB writes fio can verify. Then, healthy:
4 KiB random reads at iodepth 1 and 32 and 1 MiB sequential reads at iodepth 8 over NBD
(fio's nbd engine on the Unix socket). Then `flashpool drive fail 2` through the admin socket
(the server's rebuild held off by --rebuild-delay) and the same points again: every read of a
block on the failed drive is rebuilt from the rest of its stripe. Last, fio verifies the whole
volume on the degraded pool. A failed drive stays down until rebuilt, so the points cannot
take turns: each runs ROUNDS times healthy, then ROUNDS times degraded; the table gives medians
and each degraded point as a fraction of its healthy one.

  python3 bench/degraded_reads.py [--workdir DIR] [--runtime S] [--rounds N] [--flashpool BIN]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

from benchlib import cpu_ticks, stop_server
from disk_bench import fstype, wait_socket

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 1 << 30
POINTS = [
    ("randread qd1", "randread", "4k", 1),
    ("randread qd32", "randread", "4k", 32),
    ("read 1M qd8", "read", "1M", 8),
]
VERIFY = ["--verify=crc32c", "--verify_fatal=1", "--randseed=7"]


def fio(uri, rw, bs, qd, runtime=None, extra=()):
    args = ["fio", "--name=p", "--ioengine=nbd", f"--uri={uri}", f"--size={SIZE}",
            f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}", "--output-format=json", *extra]
    if runtime:
        args += ["--time_based", f"--runtime={runtime}", "--randrepeat=0"]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"fio {rw} {bs} failed: {out.stdout[-1500:]} {out.stderr[-1500:]}")
    j = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    return j["read"] if rw in ("read", "randread") else j["write"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default=os.path.join(ROOT, "target", "degraded-bench"))
    ap.add_argument("--runtime", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--flashpool", default=os.path.join(ROOT, "target", "release", "flashpool"))
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    fs = fstype(a.workdir)
    if fs[0] == "tmpfs":
        raise SystemExit(f"{a.workdir} is on tmpfs: this benchmark measures a real disk")
    data = os.path.join(a.workdir, "data")
    shutil.rmtree(data, ignore_errors=True)
    sock = os.path.join(a.workdir, "nbd.sock")
    log = open(os.path.join(a.workdir, "server.log"), "w")
    proc = subprocess.Popen(
        [a.flashpool, "serve", "--data", data, "--socket", sock, "--listen", "127.0.0.1:0",
         "--rebuild-delay", "86400"], stdout=log, stderr=log)
    uri = f"nbd+unix:///default?socket={sock}"
    try:
        wait_socket(sock, proc, "flashpool serve")
        fio(uri, "write", "1M", 8, extra=VERIFY + ["--do_verify=0"])
        results = {}
        for state in ("healthy", "degraded"):
            if state == "degraded":
                subprocess.run([a.flashpool, "drive", "fail", "2", "--data", data], check=True,
                               capture_output=True)
            for name, rw, bs, qd in POINTS:
                runs = []
                for _ in range(a.rounds):
                    t0 = cpu_ticks(proc.pid)
                    d = fio(uri, rw, bs, qd, a.runtime)
                    t1 = cpu_ticks(proc.pid)
                    hz = os.sysconf("SC_CLK_TCK")
                    runs.append({
                        "iops": d["iops"], "mibs": d["bw"] / 1024,
                        "mean_us": d["clat_ns"]["mean"] / 1000,
                        "p99_us": d["clat_ns"]["percentile"].get("99.000000", 0) / 1000,
                        "cpu_us": (t1 - t0) / hz * 1e6 / max(d["total_ios"], 1),
                    })
                results[(state, name)] = {k: statistics.median(r[k] for r in runs)
                                          for k in runs[0]}
                r = results[(state, name)]
                print(f"{state:9} {name:14} {r['iops']:9.0f} IOPS {r['mibs']:8.1f} MiB/s "
                      f"mean {r['mean_us']:8.0f} us p99 {r['p99_us']:8.0f} us "
                      f"cpu {r['cpu_us']:6.1f} us/io", flush=True)
        fio(uri, "write", "1M", 8, extra=VERIFY + ["--verify_only"])
        print("verify on the degraded pool: ok")
    finally:
        stop_server(proc)
    print()
    print(f"fs {fs[0]} on {fs[1]}, {a.rounds} rounds x {a.runtime} s, medians")
    print("| point | healthy | degraded (1 of 5 drives failed) | degraded / healthy |")
    print("|---|---:|---:|---:|")
    for name, rw, bs, _ in POINTS:
        h, d = results[("healthy", name)], results[("degraded", name)]
        unit, key = ("MiB/s", "mibs") if bs == "1M" else ("IOPS", "iops")
        print(f"| {name} | {h[key]:.0f} {unit}, {h['mean_us']:.0f} us mean | "
              f"{d[key]:.0f} {unit}, {d['mean_us']:.0f} us mean | {d[key] / h[key]:.2f}x |")
    shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
