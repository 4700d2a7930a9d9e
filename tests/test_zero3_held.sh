#!/bin/sh
# Stage 3's running total of the bytes it holds unsharded (gathered units' full parameters and
# gradient buffers; accelerator/zero3.c keeps it as units are gathered, released, and their
# gradient buffers made and freed, instead of summing every unit at each gather): under the test hook
# CACCEL_TEST_ZERO3_HELD every change is checked against the sum over the units, and each rank logs
# the count of checks and of wrong totals when the accelerator ends. 2 ranks, 10 wrap units,
# accumulation 2, 4 steps; without prefetch, with forward and BACKWARD_PRE prefetch, and with
# BACKWARD_POST and activation checkpointing; over Gloo and under mpirun.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
DDP="$BUILD/tests/ddp_check"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true CACCEL_LOG_LEVEL=info CACCEL_TEST_ZERO3_HELD=1
LAUNCH_FLAGS=""
train_backends
held() {   # held BACKEND FLAGS...
    hbe=$1; shift
    if [ "$hbe" = mpi ]; then launch 2 mpi "$DDP" --use_fsdp --fsdp_sharding_strategy FULL_SHARD "$@" --hidden 64 --depth 8 --mode accum --k 2 --batch 8 --steps 4
    else launch 2 gloo --use_fsdp --fsdp_sharding_strategy FULL_SHARD "$@" "$DDP" --hidden 64 --depth 8 --mode accum --k 2 --batch 8 --steps 4; fi
}
for be in $backends; do
    for flags in "" "--fsdp_forward_prefetch true --fsdp_backward_prefetch BACKWARD_PRE" \
                 "--fsdp_backward_prefetch BACKWARD_POST --fsdp_activation_checkpointing true"; do
        # shellcheck disable=SC2086
        held "$be" $flags > "$WORK/o" || { cat "$WORK/o"; fail "$be $flags"; }
        # hundreds of changes per rank (170 gathers, as many releases, 80 gradient buffers made and
        # freed); at the end every unit is gathered whole again: 34051 parameters, 136204 bytes
        count 2 "stage 3: rank [01]'s running total of unsharded bytes checked [1-9][0-9][0-9]* times against the units' sum: 0 wrong (now 136204, the sum 136204; the most [1-9][0-9]*)" "$WORK/o"
        note "$be $flags: $(grep -o 'checked [0-9]* times' "$WORK/o" | head -1)"
    done
done
echo PASS
