#!/usr/bin/env bash
# Copies what bench/run_threads.sh runs into DEST, for a machine without the build's Debian packages (python3
# with torch and transformers only): the programs themselves (libtool's .libs copies: the build tree's wrappers
# name the build machine's paths) in DEST/examples, DEST/bench and DEST/tools, every library `ldd` lists for
# them but the C library's own, and libdnnl.so.2 where installed (oneDNN's GEMMs, loaded at run time) in
# DEST/lib, and the fortunes (examples/gpt's data) in DEST/fortunes; with --data, Fashion-MNIST in
# DEST/fashion-mnist too (30 MiB; without it run_threads.sh skips the mlp part). Then, there:
#   LD_LIBRARY_PATH=DEST/lib CACCEL_FORTUNES_DIR=DEST/fortunes [CACCEL_DATA_DIR=DEST] \
#     THREADS="1 2 4 8 16" bash bench/run_threads.sh --build DEST
# usage: stage_threads.sh BUILD DEST [--data]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: stage_threads.sh BUILD DEST [--data]" >&2; exit 2; }
build=$(cd "$1" && pwd) dest=$2 data=${3:-}
mkdir -p "$dest/examples" "$dest/bench" "$dest/tools" "$dest/lib"
progs=("$build/examples/.libs/gpt" "$build/bench/.libs/bench_transformer" "$build/bench/.libs/bench_mlp"
       "$build/bench/.libs/bench_xla" "$build/tools/.libs/caccel")
for p in "${progs[@]}"; do
    [ -x "$p" ] || { echo "stage_threads.sh: $p not built (make examples/gpt bench/bench_transformer" \
                          "bench/bench_mlp bench/bench_xla tools/caccel in $build)" >&2; exit 1; }
    sub=$(basename "$(dirname "$(dirname "$p")")")
    cp "$p" "$dest/$sub/"
done
LD_LIBRARY_PATH=$build/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ldd "${progs[@]}" |
    awk '/=> \// {print $3}' | sort -u | grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$dest/lib/"; done
dnnl=$(ldconfig -p 2>/dev/null | awk '/libdnnl\.so\.2 / {print $NF}' | head -1) || true
if [ -n "$dnnl" ]; then cp -L "$dnnl" "$dest/lib/"; fi
cp -r "${CACCEL_FORTUNES_DIR:-/usr/share/games/fortunes}" "$dest/fortunes"
if [ "$data" = --data ]; then cp -r "${CACCEL_DATA_DIR:-/usr/share/datasets}/fashion-mnist" "$dest/"; fi
du -sh "$dest"
