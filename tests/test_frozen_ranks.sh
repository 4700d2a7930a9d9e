#!/bin/sh
# Frozen parameters (requires_grad false) across processes: with fc1 frozen (288 of the 387
# parameters), 2 and 4 ranks under caccel launch (Gloo) and mpirun (MPI) hold the same parameters as
# one rank on the same global batch, for DDP and ZeRO stages 1, 2 and 3; the frozen parameters keep
# their first values bit for bit; and the bytes are those of the 99 trainable parameters only: the
# optimizer's state (SGD momentum: 99 x 4 bytes), DDP's bucket all-reduce per step (also compressed
# by comm_hook fp16), the ZeRO
# stage 1/2 flat space (99 parameters in shards of 50; its all-reduce / reduce-scatter and all-gather
# per step), stage 3 keeps optimizer state for the trainable elements of each shard only and its unit
# of frozen parameters reduce-scatters nothing; save_state after 3 steps and load_state then 3 more
# equal 6 uninterrupted steps bit for bit (DDP; stage 3 with a full and with a sharded state dict), the
# optimizer file holding fc2's state only.
# Tolerance: parameters agree to 1e-5 (absolute), as tests/test_zero.sh.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
DDP="$BUILD/tests/ddp_check"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true CACCEL_LOG_LEVEL=info

LAUNCH_FLAGS=""   # no --cpu flag: ACCELERATE_USE_CPU (above) chooses the device

# zlaunch NP BACKEND STAGE PROGRAM ARGS...: as tests/test_zero.sh (stage 3 through FULL_SHARD under
# Gloo, zero_stage elsewhere)
zlaunch() {
    np=$1 be=$2 st=$3; shift 3
    prog=$1; shift
    if [ "$be" != mpi ] && [ "$st" = 3 ]; then launch "$np" "$be" --use_fsdp --fsdp_sharding_strategy FULL_SHARD "$prog" "$@"
    elif [ "$be" = mpi ]; then launch "$np" "$be" "$prog" --use_deepspeed --zero_stage "$st" "$@"
    else launch "$np" "$be" --use_deepspeed --zero_stage "$st" "$prog" "$@"; fi
}

train_backends

note "fc1 frozen, SGD with momentum, global batch 24, 6 steps: 1 rank == DDP == stage 1, 2, 3 at 2 and 4 ranks"
"$DDP" --freeze fc1 --mode plain --batch 24 --steps 6 --dump "$WORK/ref.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "1 rank"; }
count 1 'frozen_unchanged=1' "$WORK/o"
count 1 'opt_state_bytes=396$' "$WORK/o"
for be in $backends; do
    for np in 2 4; do
        b=$((24 / np))
        launch "$np" "$be" "$DDP" --freeze fc1 --mode plain --batch $b --steps 6 --dump "$WORK/ddp.bin" > "$WORK/o" || { cat "$WORK/o"; fail "DDP $np $be"; }
        count "$np" 'frozen_unchanged=1' "$WORK/o"
        count "$np" 'opt_state_bytes=396$' "$WORK/o"
        same "$WORK/ref.bin" "$WORK/ddp.bin"
        shard=$(( (99 + np - 1) / np ))
        for st in 1 2 3; do
            zlaunch "$np" "$be" $st "$DDP" --freeze fc1 --mode plain --batch $b --steps 6 --dump "$WORK/z.bin" > "$WORK/o" || { cat "$WORK/o"; fail "stage $st $np $be"; }
            if [ $st = 3 ]; then   # stage 3 shards the frozen base too
                count 1 "stage 3 .*387 parameters in $np shards of $(( (387 + np - 1) / np ))$" "$WORK/o"
            else
                count 1 "stage $st .*99 parameters in $np shards of $shard; the frozen ones (requires_grad false) kept whole" "$WORK/o"
            fi
            count "$np" 'frozen_unchanged=1' "$WORK/o"
            count "$np" 'opt_state_bytes=0$' "$WORK/o"   # the state lives in the shard
            same "$WORK/ref.bin" "$WORK/z.bin"
        done
    done
done

be=$(echo "$backends" | awk '{print $1}')
note "bytes per optimizer step on 2 ranks (accumulation 2): the trainable parameters' only"
# an all-reduce of b bytes on 2 ranks counts 2 (N - 1) / N b = b; an all-gather or reduce-scatter of a
# per-rank part of b bytes counts (N - 1) b = b
launch 2 "$be" "$DDP" --freeze fc1 --mode accum --k 2 --batch 12 --steps 3 > "$WORK/o" || { cat "$WORK/o"; fail "DDP accum"; }
count 6 'bytes_per_step=396$' "$WORK/o"         # fc2's 99 gradients in f32
launch 2 "$be" "$DDP" --freeze fc1 --mode accum --k 2 --batch 12 --steps 3 --comm_hook fp16 > "$WORK/o" || { cat "$WORK/o"; fail "DDP fp16 hook"; }
count 6 'bytes_per_step=198$' "$WORK/o"         # the same 99 in f16
zlaunch 2 "$be" 1 "$DDP" --freeze fc1 --mode accum --k 2 --batch 12 --steps 3 > "$WORK/o" || { cat "$WORK/o"; fail "stage 1 accum"; }
count 6 'bytes_per_step=600$' "$WORK/o"         # all-reduce of 2 x 50, all-gather of 50
zlaunch 2 "$be" 2 "$DDP" --freeze fc1 --mode accum --k 2 --batch 12 --steps 3 > "$WORK/o" || { cat "$WORK/o"; fail "stage 2 accum"; }
count 6 'bytes_per_step=400$' "$WORK/o"         # reduce-scatter and all-gather of 50
zlaunch 2 "$be" 3 "$DDP" --mode accum --k 2 --batch 12 --steps 3 > "$WORK/o" || { cat "$WORK/o"; fail "stage 3 accum"; }
count 6 'collectives_per_step=10$' "$WORK/o"
zlaunch 2 "$be" 3 "$DDP" --freeze fc1 --mode accum --k 2 --batch 12 --steps 3 > "$WORK/o" || { cat "$WORK/o"; fail "stage 3 frozen accum"; }
count 6 'collectives_per_step=7$' "$WORK/o"     # fc1's unit: no reduce-scatter, no gather for a backward
note "stage 3 on 2 ranks: optimizer state for the trainable elements of each shard only"
zlaunch 2 "$be" 3 "$DDP" --freeze fc1 --mode plain --batch 12 --steps 2 > "$WORK/o" || { cat "$WORK/o"; fail "stage 3 state"; }
# the flat space is fc1's 288 frozen parameters, then fc2's 99; shards of 194
count 1 'rank 0 keeps optimizer state for 0 of its 194 shard elements' "$WORK/o"
count 1 'rank 1 keeps optimizer state for 99 of its 194 shard elements' "$WORK/o"

note "save_state at step 3, load_state and 3 more == 6 uninterrupted (DDP; stage 3 full and sharded state dicts)"
# resume LABEL FLAGS: FLAGS (unquoted) go where the launcher takes them, as zlaunch does
resume() {
    label=$1 flags=$2
    rm -rf "$WORK/ck"
    on2() {   # shellcheck disable=SC2086
        if [ "$be" = mpi ]; then launch 2 mpi "$DDP" "$@" $flags; else launch 2 "$be" $flags "$DDP" "$@"; fi
    }
    on2 --freeze fc1 --mode plain --batch 12 --steps 6 --dump "$WORK/full.bin" > "$WORK/o" || { cat "$WORK/o"; fail "$label: 6 steps"; }
    on2 --freeze fc1 --mode plain --batch 12 --steps 3 --save-state "$WORK/ck" > "$WORK/o" || { cat "$WORK/o"; fail "$label: save"; }
    on2 --freeze fc1 --mode plain --batch 12 --steps 3 --load-state "$WORK/ck" --dump "$WORK/res.bin" > "$WORK/o" || { cat "$WORK/o"; fail "$label: resume"; }
    count 2 'frozen_unchanged=1' "$WORK/o"
    cmp "$WORK/full.bin" "$WORK/res.bin" || fail "$label: resumed differs from the uninterrupted run"
    echo "  $label: resumed == uninterrupted"
}
resume DDP ""
grep -q '"frozen"' "$WORK/ck/caccel_state.json" || fail "caccel_state.json has no model.frozen"
names=$(grep -a -o 'state\.[0-9]*\.[a-z_]*' "$WORK/ck/optimizer.safetensors" | sort -u | tr '\n' ' ')
[ "$names" = "state.2.momentum_buffer state.3.momentum_buffer " ] || fail "optimizer file holds: $names"
resume "stage 3" "--use_fsdp --fsdp_sharding_strategy FULL_SHARD"
resume "stage 3 sharded" "--use_fsdp --fsdp_sharding_strategy FULL_SHARD --fsdp_state_dict_type SHARDED_STATE_DICT"
echo "PASS"
