"""What the benchmark scripts (disk_bench.py, nvme_vs_nbd.py) share: a process's CPU time and
stopping a server the way its users do."""

import signal
import subprocess


def cpu_ticks(pid):
    """utime + stime of process `pid`, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (after the comm field)


def stop_server(proc):
    """SIGTERM (a clean shutdown), then SIGKILL if it has not exited in 60 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
