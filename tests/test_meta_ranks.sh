#!/bin/sh
# Deferred initialisation across processes: a model built under ca_init_empty_weights (no storage)
# and prepared trains exactly as the same model built eagerly: DDP and ZeRO-3 at 2 and 4 ranks
# under caccel launch (Gloo) and mpirun equal one rank on the same global batch, bit for bit with
# the eager runs. Under ZeRO-3 each rank only ever makes its shard: the allocator's peak from before
# the build to the end of ca_prepare (allocator statistics, not timing) stays within the rank's
# parameter and momentum shards plus one parameter (+10%; the gradient shard comes with the first
# backward), where the eager build holds the whole model.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
DDP="$BUILD/tests/ddp_check"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true CACCEL_LOG_LEVEL=info
LAUNCH_FLAGS=""

train_backends
Z3="--use_fsdp --fsdp_sharding_strategy FULL_SHARD"

note "meta build == eager build: 1 rank, DDP and ZeRO-3 at 2 and 4 ranks, global batch 24, 4 steps"
"$DDP" --mode plain --batch 24 --steps 4 --depth 2 --dump "$WORK/ref.bin" > /dev/null 2>&1 || fail "1 rank eager"
"$DDP" --meta --mode plain --batch 24 --steps 4 --depth 2 --dump "$WORK/m1.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "1 rank meta"; }
same "$WORK/ref.bin" "$WORK/m1.bin"
cmp -s "$WORK/ref.bin" "$WORK/m1.bin" || fail "1 rank: the meta build differs from the eager one"
for be in $backends; do
    for np in 2 4; do
        b=$((24 / np))
        for mode in "" "$Z3"; do
            if [ "$be" = mpi ]; then flags="$mode"; pre=""; else flags=""; pre="$mode"; fi
            # shellcheck disable=SC2086
            launch "$np" "$be" $pre "$DDP" $flags --mode plain --batch $b --steps 4 --depth 2 --dump "$WORK/e.bin" > "$WORK/o" || { cat "$WORK/o"; fail "eager $np $be $mode"; }
            # shellcheck disable=SC2086
            launch "$np" "$be" $pre "$DDP" $flags --meta --mode plain --batch $b --steps 4 --depth 2 --dump "$WORK/m.bin" > "$WORK/o" || { cat "$WORK/o"; fail "meta $np $be $mode"; }
            count "$np" 'steps=4 ' "$WORK/o"
            cmp -s "$WORK/e.bin" "$WORK/m.bin" || fail "$np ranks $be ${mode:-DDP}: the meta build differs from the eager one"
            same "$WORK/ref.bin" "$WORK/m.bin"
        done
    done
done

be=$(echo "$backends" | awk '{print $1}')
note "zero3_init_flag (DeepSpeed's zero.Init) at ZeRO-3, 2 ranks: a program that builds eagerly gets a model without storage, equal to the eager run; at stage 2 the flag changes nothing"
DS3="--use_deepspeed --zero_stage 3"
# shellcheck disable=SC2086
launch 2 "$be" $DS3 "$DDP" --mode plain --batch 12 --steps 4 --depth 2 --dump "$WORK/d3e.bin" > "$WORK/o" || { cat "$WORK/o"; fail "DeepSpeed stage 3, eager"; }
grep -q "model_meta=1" "$WORK/o" && fail "without zero3_init_flag the model was built without storage"
# shellcheck disable=SC2086
launch 2 "$be" $DS3 --zero3_init_flag true "$DDP" --mode plain --batch 12 --steps 4 --depth 2 --dump "$WORK/d3i.bin" > "$WORK/o" || { cat "$WORK/o"; fail "DeepSpeed stage 3, zero3_init_flag"; }
count 2 'model_meta=1' "$WORK/o"
grep -q "zero3_init_flag (from [^)]*): the models built on this thread until ca_prepare have no storage" "$WORK/o" || { cat "$WORK/o"; fail "zero3_init_flag: no line saying so"; }
cmp -s "$WORK/d3e.bin" "$WORK/d3i.bin" || fail "zero3_init_flag: the run differs from the eager one"
same "$WORK/ref.bin" "$WORK/d3i.bin"
# shellcheck disable=SC2086
launch 2 "$be" --use_deepspeed --zero_stage 2 --zero3_init_flag true "$DDP" --mode plain --batch 12 --steps 4 --depth 2 --dump "$WORK/d2i.bin" > "$WORK/o" || { cat "$WORK/o"; fail "DeepSpeed stage 2, zero3_init_flag"; }
grep -q "model_meta=1" "$WORK/o" && fail "zero3_init_flag at stage 2 built the model without storage"
same "$WORK/ref.bin" "$WORK/d2i.bin"

note "pretrained weights into a meta model under ZeRO-3 (2 ranks): each rank copies its shard's slices from the file (fsdp_cpu_ram_efficient_loading, the default) == the eager model gathered whole and loaded (false) == one rank"
mkdir -p "$WORK/model"
"$DDP" --mode plain --batch 24 --steps 3 --depth 2 --save-model "$WORK/model" > /dev/null 2>&1 || fail "saving the model"
"$DDP" --load-model "$WORK/model" --mode plain --batch 24 --steps 2 --depth 2 --dump "$WORK/l1.bin" > /dev/null 2>&1 || fail "1 rank load"
# shellcheck disable=SC2086
launch 2 "$be" $Z3 --fsdp_cpu_ram_efficient_loading false "$DDP" --load-model "$WORK/model" --mode plain --batch 12 --steps 2 --depth 2 --dump "$WORK/le.bin" > "$WORK/o" || { cat "$WORK/o"; fail "eager load, gathered"; }
# shellcheck disable=SC2086
launch 2 "$be" $Z3 "$DDP" --meta --load-model "$WORK/model" --mode plain --batch 12 --steps 2 --depth 2 --dump "$WORK/lm.bin" > "$WORK/o" || { cat "$WORK/o"; fail "meta load, by slices"; }
cmp -s "$WORK/le.bin" "$WORK/lm.bin" || fail "the meta model loaded by slices differs from the eager one loaded whole"
same "$WORK/l1.bin" "$WORK/lm.bin"
cmp -s "$WORK/l1.bin" "$WORK/ref.bin" && fail "the loaded runs equal the unloaded one: nothing was loaded"

note "ZeRO-3 at 4 ranks (width 512, 8 more layers: 2.1M parameters): the meta build's peak through ca_prepare is the rank's shards plus one parameter; the eager build's holds the model"
peak() {   # peak FLAGS...: rank 0's "prepare_peak_bytes model_bytes largest_param_bytes"
    # shellcheck disable=SC2086
    launch 4 "$be" $Z3 "$DDP" "$@" --hidden 512 --depth 8 --mem --mode plain --batch 8 --steps 1 > "$WORK/o" || { cat "$WORK/o"; fail "peak $*"; }
    sed -n 's/^rank=0 prepare_peak_bytes=\([0-9]*\) model_bytes=\([0-9]*\) largest_param_bytes=\([0-9]*\)$/\1 \2 \3/p' "$WORK/o"
}
set -- $(peak)
eager=$1
set -- $(peak --meta)
meta=$1 model=$2 largest=$3
echo "  peak through ca_prepare at 4 ranks: eager $eager, meta $meta bytes; model $model, largest parameter $largest"
[ -n "$meta" ] && [ -n "$eager" ] || fail "no prepare_peak_bytes line"
[ "$eager" -ge "$model" ] || fail "the eager build's peak $eager is below the model's $model bytes"
# parameter and momentum shards (2 x model / 4) and one parameter's scratch, +10%: the gradient shard
# is made at the first backward, not by ca_prepare
limit=$(( (2 * model / 4 + largest) * 11 / 10 ))
[ "$meta" -le "$limit" ] || fail "the meta build's peak $meta exceeds 2/4 of the model (parameter and momentum shards) + one parameter + 10% ($limit)"
[ "$meta" -lt "$model" ] || fail "the meta build's peak $meta holds the whole model ($model)"
echo "PASS"
