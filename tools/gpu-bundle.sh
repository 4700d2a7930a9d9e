#!/bin/sh
# gpu-bundle.sh: prepares a folder that lets this source tree build and run its CUDA tests and benchmark on a
# machine that has a GPU, nvcc and PyTorch but no Debian packages and no network (docs/CUDA.md).
#
# usage (in the repository root, after ./bootstrap): tools/gpu-bundle.sh [DIR]     (default DIR: _build-gpu)
#
# DIR gets: the OpenBLAS (its OpenMP build), libyaml, zlib, cmocka and Gloo packages of this machine's Debian release, fetched with
# `apt-get download`; their headers unpacked (`dpkg -x`) into DIR/dev, their runtime libraries left as .deb
# files (OpenBLAS alone is 36 MB unpacked) that env.sh unpacks with `dpkg -x` there; the autotools output
# (configure, Makefile.in, ...), which git ignores and so does not travel; Fashion-MNIST and the fortunes
# (the GPT benchmark's corpus); the CUDA headers and static runtime of this machine's toolkit, used there
# only where that machine's CUDA lacks them; and env.sh, which sets everything up when sourced on the GPU
# machine. tools/gpu-check.sh runs everything there in one command. DIR should be ignored by git (the default is, by
# .gitignore's /_build*/), so that it travels only when carried.
set -eu

dir=${1:-_build-gpu}
[ -f configure.ac ] && [ -d backends/cuda ] || { echo "gpu-bundle.sh: run it in the caccel repository root" >&2; exit 2; }
[ -x configure ] && [ -f Makefile.in ] || { echo "gpu-bundle.sh: run ./bootstrap first (configure and Makefile.in travel in the bundle)" >&2; exit 2; }
# the autotools output travels as it is: older than its sources, it would build yesterday's Makefile
stale=$(find configure.ac Makefile.am $(find . -name "*.mk" -not -path "./_*") -newer Makefile.in 2>/dev/null)
[ -z "$stale" ] || { echo "gpu-bundle.sh: run ./bootstrap first: newer than Makefile.in: $(echo $stale)" >&2; exit 2; }
command -v apt-get >/dev/null && command -v dpkg >/dev/null || { echo "gpu-bundle.sh: needs apt-get and dpkg (Debian or Ubuntu)" >&2; exit 2; }

rm -rf "$dir"
mkdir -p "$dir/debs" "$dir/dev" "$dir/autotools" "$dir/data/fashion-mnist" "$dir/data/fortunes" \
         "$dir/cuda/include" "$dir/cuda/lib64"
git check-ignore -q "$dir/x" 2>/dev/null || echo "gpu-bundle.sh: warning: git does not ignore $dir; add it to .git/info/exclude" >&2

# headers and link-time files here; shared libraries unpacked there
# (Gloo too: two processes sharing one GPU stage their collectives through it)
dev_pkgs="libopenblas-openmp-dev libyaml-dev zlib1g-dev libcmocka-dev libgloo-dev libjson-c-dev libutf8proc-dev
          libpcre2-dev"
# (not libgomp1: the GPU machine's gcc brings its own, which its -fopenmp code needs)
run_pkgs="libopenblas0-openmp libgfortran5 libquadmath0 libyaml-0-2 zlib1g libcmocka0 libgloo0 libhiredis0.14
          libjson-c5 libutf8proc2 libpcre2-8-0
          libibverbs1 libnl-3-200 libnl-route-3-200"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download $dev_pkgs $run_pkgs >/dev/null)
for p in $run_pkgs; do cp "$tmp"/"${p}"_*.deb "$dir/debs/"; done
for p in $dev_pkgs; do dpkg -x "$tmp"/"${p}"_*.deb "$tmp/x"; done
# only the headers: static libraries and the rest stay behind
mkdir -p "$dir/dev/include"
cp "$tmp/x/usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h" \
   "$tmp/x/usr/include/x86_64-linux-gnu/openblas-openmp/openblas_config.h" \
   "$tmp/x/usr/include/yaml.h" "$tmp/x/usr/include/zlib.h" "$tmp/x/usr/include/cmocka.h" \
   "$tmp/x/usr/include/utf8proc.h" "$tmp/x/usr/include/pcre2.h" "$dir/dev/include/"
cp -R "$tmp/x/usr/include/json-c" "$dir/dev/include/"
cp -R "$tmp/x/usr/include/gloo" "$dir/dev/include/"
[ -f "$tmp/x/usr/include/zconf.h" ] && cp "$tmp/x/usr/include/zconf.h" "$dir/dev/include/"
[ -f "$tmp/x/usr/include/x86_64-linux-gnu/zconf.h" ] && cp "$tmp/x/usr/include/x86_64-linux-gnu/zconf.h" "$dir/dev/include/"

# the generated build files git ignores
for f in configure Makefile.in aclocal.m4 config.h.in build-aux m4; do cp -R "$f" "$dir/autotools/"; done

# the dataset (Debian's dataset-fashion-mnist, or $CACCEL_DATA_DIR/fashion-mnist)
src=${CACCEL_DATA_DIR:+$CACCEL_DATA_DIR/fashion-mnist}
[ -n "$src" ] && [ -f "$src/train-images-idx3-ubyte.gz" ] || src=/usr/share/datasets/fashion-mnist
if [ -f "$src/train-images-idx3-ubyte.gz" ]; then
    cp "$src"/*-ubyte.gz "$dir/data/fashion-mnist/"
else
    echo "gpu-bundle.sh: Fashion-MNIST not found (install dataset-fashion-mnist): the training test will SKIP" >&2
fi

# the GPT benchmark's corpus (Debian's fortunes, or $CACCEL_FORTUNES_DIR)
fsrc=${CACCEL_FORTUNES_DIR:-/usr/share/games/fortunes}
if [ -d "$fsrc" ]; then
    find "$fsrc" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -exec cp {} "$dir/data/fortunes/" \;
else
    echo "gpu-bundle.sh: the fortunes are not installed (apt-get install fortunes): bench-gpt-cuda will fail" >&2
fi

# CUDA fallbacks: the headers and the static runtime of this machine's toolkit (CUDA_HOME or /usr/local/cuda).
# The GPU machine's own toolkit comes first; these fill in what it lacks (nvcc without the cuBLAS or
# NCCL headers, a toolkit without libcudart_static.a). Same major version as the GPU machine's nvcc.
chome=${CUDA_HOME:-/usr/local/cuda}
if [ -d "$chome/include" ]; then
    for h in cublas_v2.h cublas_api.h cublas.h cublasLt.h nccl.h; do
        [ -f "$chome/include/$h" ] && cp "$chome/include/$h" "$dir/cuda/include/"
    done
    [ -f "$chome/lib64/libcudart_static.a" ] && cp "$chome/lib64/libcudart_static.a" "$dir/cuda/lib64/"
else
    echo "gpu-bundle.sh: no CUDA toolkit at $chome: the bundle carries no CUDA fallbacks" >&2
fi

cat > "$dir/env.sh" <<'ENV'
# env.sh: source it in the repository root on the GPU machine (`. @DIR@/env.sh`). It unpacks the
# runtime libraries, restores the autotools output, finds CUDA, cuBLAS and NCCL (the toolkit, or the
# nvidia-* Python packages PyTorch brings) and exports what ./configure and the programs need.
# the bundle is where this file is (bash), else @DIR@ under the repository root: the bundle may have been
# made under another name or path and moved into the tree, as tests/test_gpu_check.sh does
if [ -n "${BASH_SOURCE:-}" ]; then B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); else B=$(pwd)/@DIR@; fi
[ -f "$B/env.sh" ] || { echo "env.sh: source it in the repository root" >&2; return 1; }
R=$B/root
if [ ! -d "$R" ]; then
    # dpkg -x, or where there is no dpkg, the .deb's data archive taken out with ar and tar
    for f in "$B"/debs/*.deb; do
        if command -v dpkg >/dev/null 2>&1; then dpkg -x "$f" "$R"
        else mkdir -p "$R" && (cd "$R" && ar p "$f" "$(ar t "$f" | grep '^data\.tar')" | tar -xJf -); fi
    done
fi
L=$B/lnk
mkdir -p "$L"
ln -sf "$R/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0" "$L/libopenblas.so.0"
ln -sf "$L/libopenblas.so.0" "$L/libopenblas.so"
for lib in "$R"/usr/lib/x86_64-linux-gnu/lib*.so.* "$R"/lib/x86_64-linux-gnu/lib*.so.* "$R"/usr/lib/lib*.so.*; do
    [ -e "$lib" ] && ln -sf "$lib" "$L/$(basename "$lib")"
done
ln -sf "$L/libyaml-0.so.2" "$L/libyaml.so"
ln -sf "$L/libz.so.1" "$L/libz.so"
ln -sf "$L/libcmocka.so.0" "$L/libcmocka.so"
ln -sf "$L/libgloo.so.0" "$L/libgloo.so"
ln -sf "$L/libjson-c.so.5" "$L/libjson-c.so"
ln -sf "$L/libutf8proc.so.2" "$L/libutf8proc.so"
ln -sf "$L/libpcre2-8.so.0" "$L/libpcre2-8.so"
# the autotools output; touched so that make does not try to regenerate it
cp -R "$B"/autotools/* .
touch aclocal.m4 configure config.h.in Makefile.in
# CUDA: nvcc on the PATH or in /usr/local/cuda. configure and the plugin want one CUDA_HOME with bin/,
# include/ and lib64/; on GPU machines the headers and libraries are spread over the toolkit, PyTorch's
# nvidia-* Python packages and this bundle. So CUDA_HOME becomes $B/cuda-home: links to the toolkit's
# entries, and include/ and lib64/ filled from the toolkit first, then Python's packages, then the bundle.
[ "${CUDA_HOME:-}" = "$B/cuda-home" ] && CUDA_HOME=""   # sourced a second time
# The toolkit's folder: CUDA_HOME, else where nvcc says its top is (nvcc on the PATH can be a wrapper
# script or a link elsewhere), else /usr/local/cuda.
real=${CUDA_HOME:-}
if [ -z "$real" ]; then
    nv=$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
    real=$(cd /tmp && "$nv" --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
    [ -n "$real" ] && [ -d "$real" ] && real=$(cd "$real" && pwd -P) || real=/usr/local/cuda
fi
C=$B/cuda-home
rm -rf "$C" && mkdir -p "$C/include" "$C/lib64"
for e in "$real"/*; do
    case ${e##*/} in include|lib64) ;; *) ln -s "$e" "$C/${e##*/}" ;; esac
done
link_all() {   # link_all DIR SUBDIR: links DIR's entries into $C/SUBDIR where that name is not there yet
    [ -d "$1" ] || return 0
    for f in "$1"/*; do [ -e "$f" ] && [ ! -e "$C/$2/${f##*/}" ] && ln -s "$f" "$C/$2/${f##*/}"; done
}
link_all "$real/include" include
link_all "$real/lib64" lib64
link_all "$real/targets/x86_64-linux/lib" lib64
pyroot=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null || true)
if [ -n "$pyroot" ]; then
    for d in $(find "$pyroot/nvidia" -maxdepth 3 -type d \( -name include -o -name lib \) 2>/dev/null); do
        case $d in */include) link_all "$d" include ;; */lib) link_all "$d" lib64 ;; esac
    done
fi
link_all "$B/cuda/include" include
link_all "$B/cuda/lib64" lib64
# the unversioned names the linker wants, where only the runtime's .so.N is there
for l in "$C"/lib64/lib*.so.[0-9]*; do
    [ -e "$l" ] || continue
    u=${l%%.so.*}.so
    [ -e "$u" ] || ln -s "$(readlink -f "$l")" "$u"
done
CUDA_HOME=$C
PATH=$real/bin:$PATH
export CUDA_HOME PATH
export CPPFLAGS="-I$B/dev/include"
export LDFLAGS="-L$L -Wl,-rpath,$L"
export LD_LIBRARY_PATH="$L:$C/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OPENBLAS_CFLAGS="-I$B/dev/include" OPENBLAS_LIBS="-L$L -lopenblas"
export YAML_CFLAGS="-I$B/dev/include" YAML_LIBS="-L$L -lyaml"
export ZLIB_CFLAGS="-I$B/dev/include" ZLIB_LIBS="-L$L -lz"
export CMOCKA_CFLAGS="-I$B/dev/include" CMOCKA_LIBS="-L$L -lcmocka"
export JSONC_CFLAGS="-I$B/dev/include" JSONC_LIBS="-L$L -ljson-c"
export UTF8PROC_CFLAGS="-I$B/dev/include" UTF8PROC_LIBS="-L$L -lutf8proc"
export PCRE2_CFLAGS="-I$B/dev/include" PCRE2_LIBS="-L$L -lpcre2-8"
[ -f "$B/data/fashion-mnist/train-images-idx3-ubyte.gz" ] && export CACCEL_DATA_DIR="$B/data"
[ -n "$(ls "$B/data/fortunes" 2>/dev/null)" ] && export CACCEL_FORTUNES_DIR="$B/data/fortunes"
echo "gpu-bundle: CUDA_HOME=$CUDA_HOME (links into $real, Python's nvidia packages${pyroot:+ in $pyroot} and the bundle) nvcc=$(command -v nvcc || echo none)"
ENV
sed -i "s|@DIR@|$dir|g" "$dir/env.sh"
echo "gpu-bundle.sh: $dir is ready ($(du -sh "$dir" | cut -f1)); on the GPU machine, in the repository root:"
echo "  tools/gpu-check.sh --bundle $dir OUTDIR"
