#!/bin/sh
# Context parallelism on a GPU, without one: cp_check on tests/mock_gpu.h's device (kind GPU, not host
# memory, the CPU's kernels), so that the accelerator takes a GPU's paths (the mesh's checks for a GPU, the
# collectives staged through host memory over Gloo and MPI). The allgather method at cp 2 gives one
# process's output and gradients (and central differences of the whole loss), as on the CPU (test_cp.sh), and
# so does ring attention (alltoall), whose blocks are merged by device operations on a GPU. The same code
# on a real GPU over NCCL is tests/test_cuda_cp.sh (tools/gpu-check.sh).
# Tolerance: 1e-5 (cp_check's), the split changes only the order of the sums.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
CP="$BUILD/tests/cp_check"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=false CACCEL_LOG_LEVEL=info
# shellcheck disable=SC2034
LAUNCH_FLAGS=""   # no --cpu: the mock GPU is the device
train_backends

"$CP" --central --mock-gpu > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "cp 1 on the mock GPU"; }
count 1 'rank=0 on device mock_gpu' "$WORK/o"
count 1 'rank=0 cp attention ok .* holds q \[2, 4, 16, 8\]' "$WORK/o"
for be in $backends; do
    note "$be: allgather at cp 2 on the mock GPU == one process (output, q, k, v gradients, central differences)"
    mesh_launch 2 "$be" "$CP" --parallelism_config_cp_size 2 -- --central --mock-gpu > "$WORK/o" 2>&1 ||
        { cat "$WORK/o"; fail "cp 2 on the mock GPU ($be)"; }
    count 2 'on device mock_gpu' "$WORK/o"
    count 1 'device mesh: dp_replicate 1 x dp_shard 1 x cp 2 x tp 1' "$WORK/o"
    count 2 'cp attention ok .* holds q \[2, 4, 8, 8\]' "$WORK/o"
    count 2 'central ok' "$WORK/o"
    count 2 'cp bytes 4096 (' "$WORK/o"
    note "$be: the loss at cp 2 on the mock GPU == one process's mean"
    "$CP" --loss --mock-gpu > "$WORK/o1" 2>&1 || { cat "$WORK/o1"; fail "loss, 1 rank"; }
    want=$(sed -n 's/^rank=0 cp loss ok //p' "$WORK/o1")
    mesh_launch 2 "$be" "$CP" --parallelism_config_cp_size 2 -- --loss --mock-gpu > "$WORK/o" 2>&1 ||
        { cat "$WORK/o"; fail "loss cp 2 on the mock GPU ($be)"; }
    count 2 "cp loss ok $want" "$WORK/o"
done

for be in $backends; do
    note "$be: ring attention (alltoall) at cp 2 on the mock GPU == one process (device operations: cp_ring_dev.c)"
    mesh_launch 2 "$be" "$CP" --parallelism_config_cp_size 2 --parallelism_config_cp_comm_strategy alltoall -- \
        --central --mock-gpu --ring > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "ring on the mock GPU ($be)"; }
    count 2 'on device mock_gpu' "$WORK/o"
    count 2 'cp attention ok .* holds q \[2, 4, 8, 8\]' "$WORK/o"
    count 2 'central ok' "$WORK/o"
    count 2 'cp bytes 6144 (' "$WORK/o"
done
echo "PASS"
