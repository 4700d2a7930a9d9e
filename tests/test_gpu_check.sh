#!/usr/bin/env bash
# The GPU machine's one command, as far as a machine without a GPU goes (tools/test.sh runs it as a
# stage of its own: it builds caccel once more). The bundle is made here (tools/gpu-bundle.sh), copied
# with the source tree into an empty folder the way the device tool copies them to a GPU machine, and
# tools/gpu-check.sh --no-gpu runs there with a bare environment (no CUDA_HOME, no PKG_CONFIG_PATH, no
# variables of this shell): the preflight, env.sh, configure and the build from the bundle, and the tests,
# of which those that need a GPU skip. Passes when its summary's last line says 0 failed.
# usage: tests/test_gpu_check.sh [WORKDIR]   (default: a temporary folder, removed at the end)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
fail() { echo "FAIL: test_gpu_check: $*"; exit 1; }
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] ||
    { echo "SKIP: test_gpu_check: no CUDA toolkit (nvcc) on this machine"; exit 77; }
w=${1:-$(mktemp -d)}
[ $# -ge 1 ] || trap 'rm -rf "$w"' EXIT
mkdir -p "$w/src" "$w/out"
cd "$top" || exit 2
[ -x configure ] || ./bootstrap >/dev/null 2>&1 || fail "bootstrap failed"
tools/gpu-bundle.sh "$w/bundle" > "$w/bundle.log" 2>&1 || { cat "$w/bundle.log"; fail "tools/gpu-bundle.sh failed"; }
# what travels: tracked and untracked-but-not-ignored files, then the bundle (carried)
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -C "$w/src" -xf - || fail "copying the tree"
mv "$w/bundle" "$w/src/_build-gpu"
cd "$w/src" || exit 2
env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME="${HOME:-/root}" \
    GPU_CHECK_BUILD="$w/build" bash tools/gpu-check.sh --no-gpu --budget 3000 "$w/out"
rc=$?
n=$(ls "$w/out" | wc -l)
[ "$n" -le 8 ] || fail "$n files in OUTDIR (at most 8)"
last=$(tail -1 "$w/out/summary.txt" 2>/dev/null)
case $last in
    *" passed, 0 failed") [ $rc -eq 0 ] || fail "summary says '$last' but the exit status is $rc" ;;
    *) fail "gpu-check --no-gpu: ${last:-no summary}" ;;
esac
echo "PASS: test_gpu_check ($last)"
