#!/bin/sh
# Sharded state dicts under tensor parallelism (fsdp_state_dict_type SHARDED_STATE_DICT at
# parallelism_config_tp_size 2), as users run them: each rank writes its shard of its tp slices
# (zero_shard_<tp rank x dp + shard>.safetensors) and rank 0 the index with tp_size and each parameter's
# split_dim and parts. tests/tp_check's MLP (fc1 colwise, fc2 rowwise, SGD with momentum) saved after 2 steps
# at tp 2 x FULL_SHARD 2 on 4 ranks loads, under caccel launch (Gloo) and mpirun (MPI), at tp 2 x dp 2 (the
# same mesh), tp 2 x dp 1, tp 1 x dp 2 and in one process: saved again as FULL_STATE_DICT, its parameters and
# momentum are bit-equal to those of the same 2 steps saved as FULL_STATE_DICT; 2 more steps from it at tp 2
# x dp 2 and at tp 1 x dp 2 give the losses and parameters of 4 uninterrupted steps (1e-5, docs/TESTING.md);
# zero_stage 2 saves and resumes the same way; a sharded checkpoint of no tp loads at tp 2; caccel
# merge-weights reassembles the tp slices into one process's model.safetensors.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
TP="$BUILD/tests/tp_check"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true CACCEL_LOG_LEVEL=info
# shellcheck disable=SC2034
LAUNCH_FLAGS=""   # ACCELERATE_USE_CPU chooses the device; --use_fsdp goes with it

# tlaunch NP BACKEND FLAGS -- ARGS...: tp_check through mesh_launch (dist/lib.sh)
tlaunch() { tl_np=$1 tl_be=$2; shift 2; mesh_launch "$tl_np" "$tl_be" "$TP" "$@"; }
losses() { grep '^step=' "$1" | sed 's/.*loss=//'; }
same_losses() {
    paste "$1" "$2" | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; n++ }
        END { printf "  %d losses, max |diff| %.3g\n", n, m; exit !(n == 2 && m <= 1e-5) }' ||
        fail "$2 differs from $1 beyond 1e-5"
}
MESH="--parallelism_config_tp_size 2 --parallelism_config_dp_shard_size 2"
FS="--use_fsdp --fsdp_sharding_strategy FULL_SHARD"
SH="--fsdp_state_dict_type SHARDED_STATE_DICT"
train_backends

note "one process, global batch 16: 4 steps, and the last 2 of them"
"$TP" --plan --steps 4 --batch 16 --dump "$WORK/ref.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "1 rank"; }
losses "$WORK/o" | tail -n 2 > "$WORK/ref2.loss"

for be in $backends; do
    note "$be: tp 2 x FULL_SHARD 2 after 2 steps, saved sharded and as FULL_STATE_DICT"
    rm -rf "$WORK/cks" "$WORK/ckf"
    # shellcheck disable=SC2086
    tlaunch 4 "$be" $MESH $FS $SH -- --plan --steps 2 --batch 8 --save-state "$WORK/cks" > "$WORK/o" ||
        { cat "$WORK/o"; fail "sharded save at tp 2 x dp 2"; }
    for k in 0 1 2 3; do [ -e "$WORK/cks/zero_shard_$k.safetensors" ] || fail "no zero_shard_$k"; done
    [ ! -e "$WORK/cks/model.safetensors" ] || fail "a sharded save wrote model.safetensors"
    grep -q '"tp_size":2' "$WORK/cks/zero_index.json" || { cat "$WORK/cks/zero_index.json"; fail "no tp_size in the index"; }
    grep -q '"split_dim":1' "$WORK/cks/zero_index.json" || fail "no split_dim of the rowwise fc2.weight in the index"
    # shellcheck disable=SC2086
    tlaunch 4 "$be" $MESH $FS -- --plan --steps 2 --batch 8 --save-state "$WORK/ckf" > "$WORK/o" ||
        { cat "$WORK/o"; fail "full save at tp 2 x dp 2"; }
    # load at NP FLAGS: the sharded checkpoint saved again as full state == the full save, bit for bit
    for run in "4 $MESH" "2 --parallelism_config_tp_size 2" "2" "1"; do
        # shellcheck disable=SC2086
        set -- $run
        np=$1; shift
        rm -rf "$WORK/ckx"
        # shellcheck disable=SC2086
        tlaunch "$np" "$be" "$@" $FS -- --plan --steps 0 --batch 8 --load-state "$WORK/cks" --save-state "$WORK/ckx" \
            > "$WORK/o" || { cat "$WORK/o"; fail "load at $np processes $*"; }
        for f in model optimizer; do
            cmp "$WORK/ckf/$f.safetensors" "$WORK/ckx/$f.safetensors" || fail "$f at $np processes $* differs"
        done
        echo "  loaded at $np process(es) ${*:-(no mesh)}: parameters and momentum bit-equal"
    done
    note "$be: 2 more steps from the sharded checkpoint at tp 2 x dp 2 and at tp 1 x dp 2 == the uninterrupted run"
    for run in "4 $MESH" "2 --parallelism_config_dp_shard_size 2"; do
        # shellcheck disable=SC2086
        set -- $run
        np=$1; shift
        # shellcheck disable=SC2086
        tlaunch "$np" "$be" "$@" $FS -- --plan --steps 2 --batch 8 --load-state "$WORK/cks" --dump "$WORK/r.bin" > "$WORK/r" ||
            { cat "$WORK/r"; fail "resume at $np processes $*"; }
        count 1 '^step=2 ' "$WORK/r"
        losses "$WORK/r" > "$WORK/r.loss"
        same_losses "$WORK/ref2.loss" "$WORK/r.loss"
        same "$WORK/ref.bin" "$WORK/r.bin"
    done
done
be=${backends%% *}

note "$be: zero_stage 2 saves its shards of the tp slices and resumes at tp 2 x dp 2"
rm -rf "$WORK/ckz"
# shellcheck disable=SC2086
tlaunch 4 "$be" $MESH --use_deepspeed --zero_stage 2 $SH -- --plan --steps 2 --batch 8 --save-state "$WORK/ckz" > "$WORK/o" ||
    { cat "$WORK/o"; fail "zero_stage 2 sharded save"; }
[ -e "$WORK/ckz/zero_shard_3.safetensors" ] || fail "no zero_shard_3 at zero_stage 2"
# shellcheck disable=SC2086
tlaunch 4 "$be" $MESH --use_deepspeed --zero_stage 2 -- --plan --steps 2 --batch 8 --load-state "$WORK/ckz" --dump "$WORK/r.bin" \
    > "$WORK/r" || { cat "$WORK/r"; fail "zero_stage 2 resume"; }
losses "$WORK/r" > "$WORK/r.loss"
same_losses "$WORK/ref2.loss" "$WORK/r.loss"
same "$WORK/ref.bin" "$WORK/r.bin"

note "$be: a sharded checkpoint without tp (FULL_SHARD 2) loads at tp 2 x dp 2"
rm -rf "$WORK/ck2" "$WORK/ck2f" "$WORK/ckx"
# shellcheck disable=SC2086
tlaunch 2 "$be" $FS $SH -- --plan --steps 2 --batch 8 --save-state "$WORK/ck2" > "$WORK/o" || { cat "$WORK/o"; fail "save without tp"; }
# shellcheck disable=SC2086
tlaunch 2 "$be" $FS -- --plan --steps 2 --batch 8 --save-state "$WORK/ck2f" > "$WORK/o" || { cat "$WORK/o"; fail "full save without tp"; }
# shellcheck disable=SC2086
tlaunch 4 "$be" $MESH $FS -- --plan --steps 0 --batch 8 --load-state "$WORK/ck2" --save-state "$WORK/ckx" > "$WORK/o" ||
    { cat "$WORK/o"; fail "load without tp at tp 2"; }
count 1 'saved as 2 shards at tp 1; at tp 2 every rank reads each shard file, makes the tensors whole and keeps its slice.s shard of 2' "$WORK/o"
for f in model optimizer; do cmp "$WORK/ck2f/$f.safetensors" "$WORK/ckx/$f.safetensors" || fail "$f from tp 1 at tp 2 differs"; done

note "caccel merge-weights: the tp slices reassembled into one process's model.safetensors"
"$CACCEL" merge-weights "$WORK/cks" "$WORK/merged" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "merge-weights"; }
cmp "$WORK/ckf/model.safetensors" "$WORK/merged/model.safetensors" || fail "the merged model differs from the full save's"

echo "PASS"
