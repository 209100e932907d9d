#!/usr/bin/env bash
# Packs what bench/disk_bench.py runs (fio with its nbd engine, qemu-nbd, flashpool) with every
# shared library they load, so the benchmark runs on a machine that has none of them installed
# (the 16-core device machine). Each program runs through the bundled dynamic loader, so the
# other machine's libraries never mix with these.
#
#   bench/portable_bundle.sh OUT.tar.xz [PROGRAM...]   (default: target/release/flashpool)
#
# Each PROGRAM is packed under its file name (copy a second build to another name first, to
# compare two). On the other machine: tar xJf OUT.tar.xz -C DIR; then
#   PATH=DIR/bin:$PATH python3 bench/disk_bench.py --flashpool DIR/bin/flashpool ...
set -euo pipefail
out=$(realpath -m "$1")
shift
progs=("$@")
[ ${#progs[@]} -gt 0 ] || progs=(target/release/flashpool)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/lib" "$tmp/real"
for prog in "$(command -v fio)" "$(command -v qemu-nbd)" "${progs[@]}"; do
    name=$(basename "$prog")
    cp "$prog" "$tmp/real/$name"
    strip "$tmp/real/$name" 2>/dev/null || true
    ldd "$prog" | awk '/=>/ {print $3} $1 ~ /ld-linux/ {print $1}' | while read -r lib; do
        [ -f "$lib" ] && cp -Ln "$lib" "$tmp/lib/" 2>/dev/null || true
    done
    cat > "$tmp/bin/$name" <<WRAP
#!/bin/sh
here=\$(dirname "\$(readlink -f "\$0")")/..
exec "\$here/lib/ld-linux-x86-64.so.2" --library-path "\$here/lib" "\$here/real/$name" "\$@"
WRAP
    chmod +x "$tmp/bin/$name"
done
tar cJf "$out" -C "$tmp" bin lib real
ls -la "$out"
