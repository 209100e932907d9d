#!/usr/bin/env python3
"""Builds the guest's base initramfs (a gzip'd newc cpio) from the fetched cache.

It holds busybox (static), nbd-client, nvme-cli, fio, e2fsprogs and blkdiscard
with every shared library ldd finds for them (the sysroot's copies first, then
the host's: both are Debian bookworm) and the loader; the kernel modules the
guest needs (virtio net, nbd, nvme-tcp, ext4, ...) with their dependencies,
resolved from each module's own modinfo `depends=` and listed in load order in
/etc/guest-modules; a modules.dep for busybox modprobe; and tests/guest/init.

Run by tests/guest/run-guest.sh; usage:
    mkinitramfs.py CACHE KVER INIT OUT.cpio.gz
    mkinitramfs.py --files OUT.cpio.gz GUESTPATH=HOSTPATH...
The test script is not in the base: run-guest.sh appends it as a second archive
(the --files form; the kernel unpacks concatenated archives in order).
"""
import gzip
import lzma
import os
import re
import stat
import subprocess
import sys

# Binaries: path in the sysroot -> path in the guest.
BINARIES = {
    "bin/busybox": "bin/busybox",
    "sbin/nbd-client": "sbin/nbd-client",
    "usr/sbin/nvme": "sbin/nvme",
    "usr/bin/fio": "bin/fio",
    "sbin/mke2fs": "sbin/mke2fs",
    "sbin/e2fsck": "sbin/e2fsck",
    "sbin/blkdiscard": "sbin/blkdiscard",
}
EXTRA_FILES = {"etc/mke2fs.conf": "etc/mke2fs.conf"}
LINKS = {  # guest path -> target
    "sbin/mkfs.ext4": "mke2fs",
    "sbin/fsck.ext4": "e2fsck",
    "lib64": "lib",
    "usr/lib": "../lib",
}
# Modules loaded at boot (with their dependencies, in order).
MODULES = [
    "virtio_pci", "virtio_net", "nbd", "nvme-tcp", "crc32c_generic", "crc32c-intel",
    "ext4",
]
# Shipped (and in modules.dep) but not loaded: `modprobe NAME` in a guest script.
# nvmet-tcp is the kernel's NVMe/TCP target, for a loopback self-test of the initiator;
# tls is kernel TLS, which nvme-tcp's TLS (and tlshd) needs, with the AES-GCM AEAD it
# programs into the socket (gcm and ghash: busybox modprobe cannot resolve the crypto-gcm(aes)
# alias the kernel asks for, so a guest script loads them by name).
OPTIONAL_MODULES = ["nvmet-tcp", "loop", "tls", "gcm", "ghash-generic"]


class Cpio:
    def __init__(self):
        self.out = []
        self.ino = 1000
        self.seen = set()

    def _entry(self, name, mode, data=b"", rdev=(0, 0)):
        self.ino += 1
        nameb = name.encode() + b"\0"
        hdr = "070701" + "".join(
            "%08x" % v
            for v in (self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1],
                      len(nameb), 0))
        buf = hdr.encode() + nameb
        buf += b"\0" * (-len(buf) % 4)
        buf += data + b"\0" * (-len(data) % 4)
        self.out.append(buf)

    def dirs(self, path):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d and d not in self.seen:
                self.seen.add(d)
                self._entry(d, stat.S_IFDIR | 0o755)

    def dir(self, path):
        self.dirs(path + "/x")

    def file(self, path, data, mode=0o755):
        assert path not in self.seen, path
        self.dirs(path)
        self.seen.add(path)
        self._entry(path, stat.S_IFREG | mode, data)

    def link(self, path, target):
        self.dirs(path)
        self.seen.add(path)
        self._entry(path, stat.S_IFLNK | 0o777, target.encode())

    def node(self, path, major, minor):
        self.dirs(path)
        self.seen.add(path)
        self._entry(path, stat.S_IFCHR | 0o600, rdev=(major, minor))

    def finish(self):
        self._entry("TRAILER!!!", 0)
        return b"".join(self.out)


def libs_of(binary, libpath):
    env = dict(os.environ, LD_LIBRARY_PATH=libpath)
    out = subprocess.run(["ldd", binary], env=env, capture_output=True, text=True)
    if out.returncode != 0 and "not a dynamic executable" in out.stdout + out.stderr:
        return []
    libs = []
    for line in out.stdout.splitlines():
        if "not found" in line:
            sys.exit(f"mkinitramfs: {binary}: {line.strip()}")
        m = re.search(r"(/\S+)\s+\(0x", line)
        if m:
            libs.append(m.group(1))
    return libs


def module_bytes(path):
    """A module file's contents, decompressed (newer Debian kernels ship .ko.xz)."""
    data = open(path, "rb").read()
    if path.endswith(".xz"):
        return lzma.decompress(data)
    if path.endswith(".gz"):
        return gzip.decompress(data)
    return data


def modinfo_fields(path):
    data = module_bytes(path)
    fields = {}
    for key in (b"depends", b"softdep"):
        for m in re.finditer(rb"(?:^|\0)" + key + rb"=([^\0]*)", data):
            fields.setdefault(key.decode(), []).append(m.group(1).decode())
    return fields


def main():
    cache, kver, init, out = sys.argv[1:5]
    sysroot = os.path.join(cache, "sysroot")
    moddir = os.path.join(cache, "kernel", "lib", "modules", kver)
    c = Cpio()
    for d in ("dev", "proc", "sys", "tmp", "mnt", "run", "root", "etc", "lib/x86_64-linux-gnu",
              "usr/bin", "usr/sbin"):
        c.dir(d)
    c.node("dev/console", 5, 1)
    c.node("dev/null", 1, 3)
    for guest, target in LINKS.items():
        c.link(guest, target)
    c.file("init", open(init, "rb").read())

    libpath = ":".join(os.path.join(sysroot, p) for p in
                       ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"))
    libs = {}
    for src, dst in BINARIES.items():
        path = os.path.join(sysroot, src)
        if not os.path.exists(path):
            sys.exit(f"mkinitramfs: {path} missing (fetch incomplete?)")
        c.file(dst, open(path, "rb").read())
        for lib in libs_of(path, libpath):
            libs.setdefault(os.path.basename(lib), lib)
    for src, dst in EXTRA_FILES.items():
        c.file(dst, open(os.path.join(sysroot, src), "rb").read(), 0o644)
    for name, path in sorted(libs.items()):
        if name.startswith("ld-linux"):
            c.file("lib/" + name, open(path, "rb").read())
        else:
            c.file("lib/x86_64-linux-gnu/" + name, open(path, "rb").read())

    # Modules: name -> relative path (module names treat - and _ alike).
    # Compressed modules (.ko.xz, .ko.gz) go into the initramfs decompressed, as .ko.
    index, source = {}, {}
    for dirpath, _, files in os.walk(moddir):
        for f in files:
            base = re.sub(r"\.(xz|gz)$", "", f)
            if base.endswith(".ko"):
                rel = os.path.relpath(os.path.join(dirpath, base), moddir)
                index[base[:-3].replace("-", "_")] = rel
                source[rel] = os.path.join(dirpath, f)
    # Built into the kernel (modules.builtin, e.g. virtio_pci in 6.12): nothing to load.
    builtin = set()
    bpath = os.path.join(moddir, "modules.builtin")
    if os.path.exists(bpath):
        for line in open(bpath):
            builtin.add(os.path.basename(line.strip())[:-3].replace("-", "_"))
    order, deps_of = [], {}

    def visit(name, stack=()):
        key = name.replace("-", "_")
        if key in order or (key in builtin and key not in index):
            return
        if key not in index:
            sys.exit(f"mkinitramfs: module {name} not in {moddir}")
        if key in stack:
            return
        info = modinfo_fields(source[index[key]])
        deps = [d for s in info.get("depends", []) for d in s.split(",") if d]
        for sd in info.get("softdep", []):  # "pre: a b post: c": the pre ones first
            m = re.search(r"pre:\s*([^:]*?)(?:\s+post:|$)", sd)
            for d in (m.group(1).split() if m else []):
                if d.replace("-", "_") in index:
                    deps.append(d)
        deps_of[key] = [d.replace("-", "_") for d in deps]
        for d in deps:
            visit(d, stack + (key,))
        order.append(key)

    for m in MODULES:
        visit(m)
    boot = list(order)
    for m in OPTIONAL_MODULES:
        visit(m)
    for key in order:
        rel = index[key]
        c.file(f"lib/modules/{kver}/{rel}", module_bytes(source[rel]), 0o644)

    def closure(key, acc):
        for d in deps_of.get(key, []):
            if d not in acc:
                acc.append(d)
                closure(d, acc)
        return acc

    dep = "".join(f"{index[k]}: {' '.join(index[d] for d in closure(k, []))}\n" for k in order)
    c.file(f"lib/modules/{kver}/modules.dep", dep.encode(), 0o644)
    c.file("etc/guest-modules", "".join(f"/lib/modules/{kver}/{index[k]}\n" for k in boot).encode(), 0o644)
    tmp = f"{out}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(gzip.compress(c.finish(), compresslevel=6))
    os.replace(tmp, out)
    print(f"initramfs {out}: {len(libs)} libraries, {len(order)} modules", file=sys.stderr)


def files_only():
    out = sys.argv[2]
    c = Cpio()
    for arg in sys.argv[3:]:
        guest, host = arg.split("=", 1)
        c.file(guest.lstrip("/"), open(host, "rb").read())
    with open(out, "wb") as f:
        f.write(gzip.compress(c.finish(), compresslevel=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--files":
        files_only()
    else:
        main()
