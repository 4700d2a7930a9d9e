#!/bin/sh
# Sharded checkpoints (fsdp_state_dict_type SHARDED_STATE_DICT) saved at N processes load at M, under
# another ZeRO stage and another HSDP grouping, over Gloo (caccel launch) and MPI (mpirun): after the
# load the parameters and the optimizer state (SGD momentum; AdamW exp_avg and exp_avg_sq) equal the
# saved ones bit for bit (a FULL_STATE_DICT save right after the load gives the model.safetensors and
# optimizer.safetensors of a FULL_STATE_DICT save of the original run, byte for byte); a run continued
# at the new size equals one continued from the FULL_STATE_DICT checkpoint of the same state bit for bit
# (the same data position, global batch 24 at every size) and the uninterrupted run at the new size to
# 1e-5 (docs/TESTING.md: a size change reorders the gradient sums); and the refusals.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
DDP="$BUILD/tests/ddp_check"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true CACCEL_LOG_LEVEL=info CACCEL_SPLIT_BATCHES=true
LAUNCH_FLAGS=""   # ACCELERATE_USE_CPU (above) chooses the device

train_backends

# zr NP BACKEND STAGE DICT ARGS...: ddp_check on NP ranks, stage 1 (DeepSpeed zero_stage 1), 2
# (SHARD_GRAD_OP) or 3 (FULL_SHARD), saving state dicts of type DICT (SHARDED or FULL), global batch 24
# at every size (split_batches: the loader's batch is the global one, each rank takes its slice).
# $HSDP, when set, is the number of replicas (PARALLELISM_CONFIG_DP_REPLICATE_SIZE).
zr() {
    np=$1 be=$2 st=$3 sd=$4; shift 4
    case $st in
        1) fl="--use_deepspeed --zero_stage 1" ;;
        2) fl="--use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP" ;;
        *) fl="--use_fsdp --fsdp_sharding_strategy FULL_SHARD" ;;
    esac
    # shellcheck disable=SC2086
    if [ "$be" = mpi ]; then
        FSDP_STATE_DICT_TYPE=${sd}_STATE_DICT PARALLELISM_CONFIG_DP_REPLICATE_SIZE=${HSDP:-1} \
            launch "$np" "$be" "$DDP" $fl --batch 24 "$@"
    else
        FSDP_STATE_DICT_TYPE=${sd}_STATE_DICT PARALLELISM_CONFIG_DP_REPLICATE_SIZE=${HSDP:-1} \
            launch "$np" "$be" $fl "$DDP" --batch 24 "$@"
    fi
}

# save NAME NP BACKEND STAGE ARGS...: 6 steps, then a sharded save into $WORK/NAME.s and, by a second
# identical run, a full one into $WORK/NAME.f
save() {
    n=$1 np=$2 be=$3 st=$4; shift 4
    zr "$np" "$be" "$st" SHARDED --mode plain --steps 6 "$@" --save-state "$WORK/$n.s" > "$WORK/o" || { cat "$WORK/o"; fail "$n: sharded save"; }
    zr "$np" "$be" "$st" FULL --mode plain --steps 6 "$@" --save-state "$WORK/$n.f" > "$WORK/o" || { cat "$WORK/o"; fail "$n: full save"; }
}

# exact NAME NP BACKEND STAGE ARGS...: NAME.s loaded at NP ranks under STAGE and saved at once as a
# full state dict: its model and optimizer files are NAME.f's, byte for byte
exact() {
    n=$1 np=$2 be=$3 st=$4; shift 4
    rm -rf "$WORK/x"
    zr "$np" "$be" "$st" FULL --mode plain --steps 0 "$@" --load-state "$WORK/$n.s" --save-state "$WORK/x" > "$WORK/o" || { cat "$WORK/o"; fail "$n: loaded at $np ranks, stage $st, $be"; }
    for f in model.safetensors optimizer.safetensors; do
        cmp "$WORK/$n.f/$f" "$WORK/x/$f" || fail "$n loaded at $np ranks (stage $st, ${HSDP:-1} replica(s), $be): $f differs from the full save"
    done
    echo "  $n -> $np ranks, stage $st, ${HSDP:-1} replica(s), $be: model and optimizer state identical"
}

for be in $backends; do
    note "$be: SGD momentum, stage 2, saved at 4 ranks: loads at 1, 2, 3 and 4 bit for bit; saved at 1 and 2: loads at 4"
    save s4 4 "$be" 2
    grep -q 'was saved as' "$WORK/o" && fail "a save logged a load"
    [ -e "$WORK/s4.s/zero_shard_3.safetensors" ] && [ ! -e "$WORK/s4.s/model.safetensors" ] || { ls "$WORK/s4.s"; fail "s4: not a 4-shard checkpoint"; }
    for np in 1 2 3 4; do exact s4 "$np" "$be" 2; done
    count 0 'was saved as' "$WORK/o"   # the same size: no resharding
    exact s4 3 "$be" 2
    count 1 'was saved as 4 shards; each rank reads the parts of its shard of 3 (stage 2)' "$WORK/o"
    save s1 1 "$be" 2
    exact s1 4 "$be" 2
    save s2 2 "$be" 2
    exact s2 4 "$be" 2

    note "$be: AdamW, stage 3 saved at 4 ranks loads under stage 1 at 2 ranks, stage 1 at 2 under stage 3 at 4"
    save a3 4 "$be" 3 --adamw
    exact a3 2 "$be" 1 --adamw
    exact a3 3 "$be" 2 --adamw
    save a1 2 "$be" 1 --adamw
    exact a1 4 "$be" 3 --adamw
done

be=$(echo "$backends" | awk '{print $1}')
note "HSDP: 4 ranks as 2 replicas of 2 shards load as 1 group of 4 and the other way round"
HSDP=2 save h22 4 "$be" 3 --adamw
[ -e "$WORK/h22.s/zero_shard_1.safetensors" ] && [ ! -e "$WORK/h22.s/zero_shard_2.safetensors" ] || { ls "$WORK/h22.s"; fail "h22: not 2 shards"; }
exact h22 4 "$be" 3 --adamw
exact h22 3 "$be" 2 --adamw
HSDP=2 exact a3 4 "$be" 3 --adamw
HSDP=4 exact a3 4 "$be" 3 --adamw

note "continued runs: 6 more steps at 2 ranks from the 4-rank sharded checkpoint == from the 4-rank full one (bit for bit) == 12 uninterrupted steps at 2 (1e-5)"
for be in $backends; do
    zr 2 "$be" 2 FULL --mode plain --steps 6 --load-state "$WORK/s4.s" --dump "$WORK/cs.bin" > "$WORK/o" || { cat "$WORK/o"; fail "continued from s4.s"; }
    zr 2 "$be" 2 FULL --mode plain --steps 6 --load-state "$WORK/s4.f" --dump "$WORK/cf.bin" > "$WORK/o" || { cat "$WORK/o"; fail "continued from s4.f"; }
    cmp "$WORK/cs.bin" "$WORK/cf.bin" || fail "$be: continued from the sharded checkpoint differs from the full one"
    zr 2 "$be" 2 FULL --mode plain --steps 12 --dump "$WORK/u.bin" > "$WORK/o" || { cat "$WORK/o"; fail "uninterrupted"; }
    same "$WORK/u.bin" "$WORK/cs.bin"
    zr 3 "$be" 3 FULL --mode plain --steps 6 --adamw --load-state "$WORK/a3.s" --dump "$WORK/cs.bin" > "$WORK/o" || { cat "$WORK/o"; fail "continued from a3.s"; }
    zr 3 "$be" 3 FULL --mode plain --steps 6 --adamw --load-state "$WORK/a3.f" --dump "$WORK/cf.bin" > "$WORK/o" || { cat "$WORK/o"; fail "continued from a3.f"; }
    cmp "$WORK/cs.bin" "$WORK/cf.bin" || fail "$be: AdamW continued from the sharded checkpoint differs from the full one"
done

note "refusals: a missing shard file, another model, another optimizer kind"
refuse() {   # refuse WHAT MESSAGE ARGS...: the load fails on every rank with MESSAGE
    what=$1 msg=$2; shift 2
    zr 2 "$be" 2 FULL --mode plain --steps 0 "$@" > "$WORK/o" && { cat "$WORK/o"; fail "$what: loaded"; }
    grep -qF -- "$msg" "$WORK/o" || { cat "$WORK/o"; fail "$what: no message '$msg'"; }
    echo "  $what: refused"
}
cp -r "$WORK/s4.s" "$WORK/m.s"
rm "$WORK/m.s/zero_shard_3.safetensors"
refuse "a missing shard" "zero_shard_3.safetensors" --load-state "$WORK/m.s"
refuse "another model" "zero_index.json: params[0] is 'fc1.weight' of shape [32, 8] at offset 0, the model's parameter 0 is 'fc1.weight' of shape [16, 8] at offset 0" --hidden 16 --load-state "$WORK/s4.s"
refuse "AdamW state into SGD" "optimizers[0]: kind adamw in the file, sgd in the program" --load-state "$WORK/a3.s"
refuse "SGD state into AdamW" "optimizers[0]: kind sgd in the file, adamw in the program" --adamw --load-state "$WORK/s4.s"
echo "PASS"
