#!/bin/sh
# The CUDA plugin as users meet it, on any machine: `caccel env` lists it with its GPU count (and the
# driver's reason when that is 0); without a GPU a program falls back to the CPU with a one-line
# notice and --multi_gpu fails with the reason; with one, the program trains on it.
set -u
b=${CACCEL_TEST_BUILDDIR:-.}
fail() { echo "FAIL: $*"; exit 1; }
plugin="$b/backends/cuda/.libs/caccel_cuda.so"
[ -e "$plugin" ] || fail "$plugin was not built"
CACCEL_PLUGIN_PATH="$b/backends/cuda/.libs${CACCEL_PLUGIN_PATH:+:$CACCEL_PLUGIN_PATH}"
export CACCEL_PLUGIN_PATH
unset CACCEL_LOG_LEVEL ACCELERATE_LOG_LEVEL ACCELERATE_USE_CPU ACCELERATE_DISTRIBUTED_TYPE RANK WORLD_SIZE LOCAL_RANK

# NCCL and cuBLAS are opened when first used: a machine without them still loads the plugin and its GPU
if command -v readelf >/dev/null 2>&1; then
    needed=$(readelf -d "$plugin" | grep NEEDED) || fail "readelf -d $plugin lists no NEEDED entries"
    echo "$needed" | grep -E 'libnccl|libcublas' && fail "$plugin links NCCL or cuBLAS at load time: $needed"
fi

out=$("$b/tools/caccel" env 2>&1) || { echo "$out"; fail "caccel env exited non-zero"; }
row=$(echo "$out" | grep -E '^  cuda +device ') || { echo "$out"; fail "caccel env does not list the cuda backend"; }
echo "$out" | grep -E '^  nccl +collective ' >/dev/null || { echo "$out"; fail "caccel env does not list nccl"; }
echo "env: $row"
ngpu=$(echo "$row" | awk '{ print $3 }')
case $ngpu in '' | *[!0-9]*) fail "no device count in: $row" ;; esac
if [ "$ngpu" -eq 0 ]; then
    echo "$row" | grep -E 'unusable: .+' >/dev/null || fail "0 GPUs but no reason in: $row"
else
    echo "$row" | grep -E ' ok$' >/dev/null || fail "$ngpu GPU(s) but not usable: $row"
fi

data=${CACCEL_DATA_DIR:-}/fashion-mnist
[ -n "${CACCEL_DATA_DIR:-}" ] && [ -e "$data/train-images-idx3-ubyte.gz" ] || data=/usr/share/datasets/fashion-mnist
if [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then
    echo "Fashion-MNIST not installed: the training checks are left out"
    echo "ok"
    exit 0
fi
fm="$b/examples/fashion_mnist"
out=$(CACCEL_LOG_LEVEL=INFO "$fm" --epochs 1 --max-steps 3 2>&1) || { echo "$out"; fail "fashion_mnist exited non-zero"; }
if [ "$ngpu" -eq 0 ]; then
    notice=$(echo "$out" | grep 'no GPU is usable (' ) || { echo "$out"; fail "no notice about the fallback to the CPU"; }
    [ "$(echo "$notice" | wc -l)" -eq 1 ] || fail "more than one notice line: $notice"
    echo "fallback: $notice"
    echo "$out" | grep '1 process(es) on cpu' >/dev/null || { echo "$out"; fail "did not train on the CPU"; }
    out=$("$fm" --epochs 1 --max-steps 3 --multi_gpu 2>&1) && { echo "$out"; fail "--multi_gpu without a GPU succeeded"; }
    echo "$out" | grep 'MULTI_GPU (from --multi_gpu) needs a GPU: ' >/dev/null ||
        { echo "$out"; fail "--multi_gpu failed without the reason"; }
    echo "multi_gpu: $(echo "$out" | head -1)"
else
    echo "$out" | grep '1 process(es) on cuda' >/dev/null || { echo "$out"; fail "did not train on the GPU"; }
fi
echo "ok"
