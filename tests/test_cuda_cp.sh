#!/bin/sh
# Context parallelism on real GPUs (tools/gpu-check.sh runs it): cp_check's split attention (the allgather
# method: keys and values all-gathered over the cp communicator, their gradients reduce-scattered back)
# gives one process's output and q, k, v gradients on the same GPU, within cp_check's 1e-5, and central
# differences of the whole loss; and the loss at cp 2 is one process's mean. On two GPUs over NCCL (the
# cp communicator sends the method's 4096 bytes); on one GPU, two processes share it: NCCL refuses two
# ranks on one GPU, so the nccl backend stages its collectives through host memory over Gloo (docs/CUDA.md,
# Choosing the GPU) and the test checks that it said so. Ring attention (alltoall: the keys and values
# passed round by sendrecv, the blocks merged by device operations) likewise, at cp 2 with central
# differences (host-tested in tests/test_cp_mock_gpu.sh). Exits 77 (SKIP) with the driver's reason when
# there is no GPU.
set -u
b=${CACCEL_TEST_BUILDDIR:-.}
fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
CACCEL_PLUGIN_PATH="$b/backends/cuda/.libs${CACCEL_PLUGIN_PATH:+:$CACCEL_PLUGIN_PATH}"
export CACCEL_PLUGIN_PATH CACCEL_LOG_LEVEL=info
unset ACCELERATE_USE_CPU ACCELERATE_DISTRIBUTED_TYPE RANK WORLD_SIZE LOCAL_RANK

row=$("$b/tools/caccel" env 2>&1 | grep -E '^  cuda +device ') || fail "caccel env does not list the cuda backend"
ngpu=$(echo "$row" | awk '{ print $3 }')
[ "${ngpu:-0}" -gt 0 ] 2>/dev/null || skip "no GPU: $(echo "$row" | sed 's/.*unusable: //')"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/caccel-cuda-cp.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
CP="$b/tests/cp_check"
count() {   # count N PATTERN FILE
    n=$(grep -c -- "$2" "$3" || true)
    [ "$n" -eq "$1" ] || { cat "$3"; fail "expected $1 line(s) matching '$2' in $(basename "$3"), got $n"; }
}
cp2() {   # cp2 NAME LAUNCH-FLAGS...: cp_check --central and --loss at cp 2 on two processes
    name=$1; shift
    timeout 300 "$b/tools/caccel" launch --num_processes 2 --main_process_port 0 "$@" --parallelism_config_cp_size 2 \
        "$CP" --central > "$WORK/$name" 2>&1 || { cat "$WORK/$name"; fail "cp 2 ($name) exited non-zero"; }
    count 2 'on device cuda' "$WORK/$name"
    count 2 'cp attention ok .* holds q \[2, 4, 8, 8\]' "$WORK/$name"
    count 2 'central ok' "$WORK/$name"
    timeout 300 "$b/tools/caccel" launch --num_processes 2 --main_process_port 0 "$@" --parallelism_config_cp_size 2 \
        "$CP" --loss > "$WORK/$name.loss" 2>&1 || { cat "$WORK/$name.loss"; fail "loss cp 2 ($name) exited non-zero"; }
    count 2 "cp loss ok $want" "$WORK/$name.loss"
    timeout 300 "$b/tools/caccel" launch --num_processes 2 --main_process_port 0 "$@" --parallelism_config_cp_size 2 \
        --parallelism_config_cp_comm_strategy alltoall "$CP" --central --ring > "$WORK/$name.ring" 2>&1 ||
        { cat "$WORK/$name.ring"; fail "ring cp 2 ($name) exited non-zero"; }
    count 2 'cp attention ok .* holds q \[2, 4, 8, 8\]' "$WORK/$name.ring"
    count 2 'central ok' "$WORK/$name.ring"
    echo "cp 2 ($name): attention (all-gather and ring), central differences and loss as one process"
}

"$CP" --central > "$WORK/one" 2>&1 || { cat "$WORK/one"; fail "cp 1 on the GPU"; }
count 1 'rank=0 on device cuda' "$WORK/one"
count 1 'rank=0 cp attention ok' "$WORK/one"
"$CP" --loss > "$WORK/one.loss" 2>&1 || { cat "$WORK/one.loss"; fail "loss, 1 process on the GPU"; }
want=$(sed -n 's/^rank=0 cp loss ok //p' "$WORK/one.loss")
[ -n "$want" ] || { cat "$WORK/one.loss"; fail "no loss line"; }

have_gloo=""
for d in $(echo "$CACCEL_PLUGIN_PATH" | tr ':' ' '); do [ -e "$d/caccel_gloo.so" ] && have_gloo=yes; done
if [ -n "$have_gloo" ]; then
    cp2 shared --gpu_ids 0
    grep -q "share GPU" "$WORK/shared" || { cat "$WORK/shared"; fail "two ranks on one GPU: the nccl backend did not say it stages through Gloo"; }
else
    echo "the Gloo plugin was not built: two processes on one GPU left out"
fi
if [ "$ngpu" -ge 2 ]; then
    cp2 nccl --multi_gpu
    count 2 'cp bytes 4096 (' "$WORK/nccl"
else
    echo "one GPU: cp 2 on two GPUs over NCCL left out (it needs two)"
fi
echo "ok"
