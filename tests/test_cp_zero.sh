#!/bin/sh
# Context parallelism composed with sharded data parallelism (parallelism_config_cp_size with ZeRO stages 1
# to 3 and FSDP FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD), as users run it: as Accelerate's flattened
# "dp_shard_cp" mesh dimension, the parameters, gradients and optimizer state are sharded over dp_shard x cp
# (the cp ranks hold the same parameters), batches are split over dp only (the cp ranks of one dp index read
# the same batch and split its sequences), and gradients are averaged over dp x cp. Under caccel launch
# (Gloo) and mpirun (MPI), the GPT example gives one process's losses, validation losses and saved model on
# the same global batch:
# - cp 2 x dp_shard 2 under FSDP FULL_SHARD on 4 ranks (batch 8 each: one process's 16);
# - cp 2 under DeepSpeed zero_stage 2, and under FULL_SHARD (sharding over cp alone), on 2 ranks;
# - cp 2 x dp_replicate 2 under FULL_SHARD (HSDP: shards over cp, replicated over dp_replicate), SHARD_GRAD_OP
#   and zero_stage 1 at cp 2 x dp_shard 2, and cp 2 x tp 2 x dp_shard 2 on 8 ranks;
# - each rank's memory report holds a quarter of cp 2's parameters, gradients and optimizer state at cp 2 x
#   dp_shard 2 (shards=4); `caccel env` names the flattened dp_shard_cp group;
# - dp_shard beside cp without a ZeRO stage is still refused, naming its key.
# Tolerance: 1e-5 (parameters; the losses as printed, 4 decimals); the split and the shards change only the
# order of the sums.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
GPT="$BUILD/examples/gpt"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true CACCEL_LOG_LEVEL=info
# shellcheck disable=SC2034
LAUNCH_FLAGS=""   # read by launch: ACCELERATE_USE_CPU chooses the device

# glaunch NP BACKEND FLAGS -- ARGS...: the GPT example through mesh_launch (dist/lib.sh)
glaunch() { gl_np=$1 gl_be=$2; shift 2; mesh_launch "$gl_np" "$gl_be" "$GPT" "$@"; }
train_backends

gpt_lines() { sed -n -e 's/^\(step [0-9]*\/[0-9]*: loss [0-9.]*\),.*/\1/p' -e '/^step [0-9]*: validation loss/p' "$1"; }
# lr 1e-3 as test_cp.sh (AdamW turns the other order of sums into parameter differences that grow with it)
SMALL="--n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --lr 1e-3 --log_interval 1 --eval_interval 3 --eval_samples 16 --dropout 0 --max_steps 4"
note "one process: the GPT example, batch 8 and 16, 4 steps"
for b in 8 16; do
    # shellcheck disable=SC2086
    "$GPT" $SMALL --batch_size $b --output_dir "$WORK/g$b" > "$WORK/g$b.o" 2>&1 || { cat "$WORK/g$b.o"; fail "gpt batch $b, 1 rank"; }
    gpt_lines "$WORK/g$b.o" > "$WORK/g$b.l"
    [ "$(grep -c '^step' "$WORK/g$b.l")" -ge 5 ] || { cat "$WORK/g$b.o"; fail "no loss lines"; }
done

# equal NAME NP BACKEND REF MESH-FLAGS...: the GPT example (batch 8 a data-parallel rank) == one process at
# batch REF; $WORK/NAME.o holds its output
equal() {
    eq_name=$1 eq_np=$2 eq_be=$3 eq_ref=$4; shift 4
    rm -rf "${WORK:?}/$eq_name"
    # shellcheck disable=SC2086
    glaunch "$eq_np" "$eq_be" "$@" -- $SMALL --batch_size 8 --output_dir "$WORK/$eq_name" > "$WORK/$eq_name.o" 2>&1 ||
        { cat "$WORK/$eq_name.o"; fail "$eq_name ($*)"; }
    gpt_lines "$WORK/$eq_name.o" > "$WORK/$eq_name.l"
    cmp -s "$WORK/g$eq_ref.l" "$WORK/$eq_name.l" ||
        { diff "$WORK/g$eq_ref.l" "$WORK/$eq_name.l"; fail "$eq_name ($*) differs from one process"; }
    echo "  $eq_name: $(grep -c . "$WORK/$eq_name.l") loss and validation lines the same"
    same_st "$WORK/g$eq_ref/model.safetensors" "$WORK/$eq_name/model.safetensors"
}
CP="--parallelism_config_cp_size 2"
FS="--use_fsdp --fsdp_sharding_strategy FULL_SHARD"
P=118528   # the model's parameters
for be in $backends; do
    note "$be: cp 2 x dp_shard 2 under FULL_SHARD on 4 ranks == one process (batch 16)"
    # shellcheck disable=SC2086
    equal "fs4$be" 4 "$be" 16 $CP --parallelism_config_dp_shard_size 2 $FS
    count 1 'device mesh: dp_replicate 1 x dp_shard 2 x cp 2 x tp 1' "$WORK/fs4$be.o"
    count 1 "stage 3 (.*), $P parameters in 4 shards of 29632" "$WORK/fs4$be.o"
    note "$be: cp 2 under zero_stage 2 and under FULL_SHARD (sharded over cp alone) on 2 ranks == one process (batch 8)"
    # shellcheck disable=SC2086
    equal "z2$be" 2 "$be" 8 $CP --use_deepspeed --zero_stage 2
    count 1 "stage 2 (.*), $P parameters in 2 shards of 59264" "$WORK/z2$be.o"
    # shellcheck disable=SC2086
    equal "fs2$be" 2 "$be" 8 $CP $FS
    count 1 "stage 3 (.*), $P parameters in 2 shards of 59264" "$WORK/fs2$be.o"
done
be=${backends%% *}
note "$be: HSDP at cp 2 x dp_replicate 2 (shards over cp, replicated), SHARD_GRAD_OP and zero_stage 1 at cp 2 x dp_shard 2"
# shellcheck disable=SC2086
equal hsdp 4 "$be" 16 $CP --parallelism_config_dp_replicate_size 2 $FS
count 1 'HYBRID_SHARD: shards within groups of 2 processes, replicated 2 times' "$WORK/hsdp.o"
# shellcheck disable=SC2086
equal sgo 4 "$be" 16 $CP --parallelism_config_dp_shard_size 2 --use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP
# shellcheck disable=SC2086
equal z1 4 "$be" 16 $CP --parallelism_config_dp_shard_size 2 --use_deepspeed --zero_stage 1
note "$be: cp 2 x tp 2 x dp_shard 2 under FULL_SHARD on 8 ranks == one process (batch 16)"
rm -rf "$WORK/t8"
# shellcheck disable=SC2086
glaunch 8 "$be" $CP --parallelism_config_tp_size 2 --parallelism_config_dp_shard_size 2 $FS -- $SMALL --batch_size 8 \
    --output_dir "$WORK/t8" > "$WORK/t8.o" 2>&1 || { cat "$WORK/t8.o"; fail "cp 2 x tp 2 x dp_shard 2"; }
count 1 'device mesh: dp_replicate 1 x dp_shard 2 x cp 2 x tp 2' "$WORK/t8.o"
gpt_lines "$WORK/t8.o" > "$WORK/t8.l"
cmp -s "$WORK/g16.l" "$WORK/t8.l" || { diff "$WORK/g16.l" "$WORK/t8.l"; fail "cp 2 x tp 2 x dp_shard 2 differs from one process"; }
# 1e-4 as test_cp.sh's cp 2 x tp 2: the vocabulary-parallel loss and the tied head sum in another order too
same_st "$WORK/g16/model.safetensors" "$WORK/t8/model.safetensors" 1e-4

note "$be: per-rank memory: cp 2 x dp_shard 2 under FULL_SHARD holds a quarter of cp 2's model states"
# cp 2 alone (plain data parallelism over dp_cp): every parameter, its gradient and AdamW's two moments
MEMARGS="--n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --dropout 0 --max_steps 2 --eval_interval 0 --eval_samples 8 --batch_size 8"
# shellcheck disable=SC2086
CACCEL_MEMORY_REPORT="$WORK/mc" glaunch 2 "$be" $CP -- $MEMARGS > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "memory at cp 2"; }
# shellcheck disable=SC2086
CACCEL_MEMORY_REPORT="$WORK/mz" glaunch 4 "$be" $CP --parallelism_config_dp_shard_size 2 $FS -- $MEMARGS > "$WORK/o" 2>&1 ||
    { cat "$WORK/o"; fail "memory at cp 2 x dp_shard 2"; }
whole=$((P * 4)) shard=$((29632 * 4))
for r in 0 1; do
    grep -q "^rank=$r world=2 device=cpu zero=0 parameters=$whole gradients=$whole optimizer_state=$((2 * whole)) .* shards=1\$" "$WORK/mc.$r" ||
        { cat "$WORK/mc.$r"; fail "rank $r at cp 2 does not hold the whole model"; }
done
for r in 0 1 2 3; do
    grep -q "^rank=$r world=4 device=cpu zero=3 parameters=$shard gradients=$shard optimizer_state=$((2 * shard)) .* shards=4\$" "$WORK/mz.$r" ||
        { cat "$WORK/mz.$r"; fail "rank $r at cp 2 x dp_shard 2 does not hold a quarter"; }
done
echo "  cp 2: $whole bytes of parameters a rank; cp 2 x dp_shard 2 (FULL_SHARD): $shard, a quarter"

note "caccel env names the flattened dp_shard_cp group"
# shellcheck disable=SC2086
"$CACCEL" env --num_processes 4 $CP --parallelism_config_dp_shard_size 2 $FS > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "caccel env"; }
count 1 'Device mesh: dp_replicate 1 x dp_shard 2 x cp 2 x tp 1 .*4 processes' "$WORK/o"
count 1 'dp_shard_cp: ZeRO / FSDP shards parameters, gradients and optimizer state over dp_shard 2 x cp 2 = 4 ranks$' "$WORK/o"
# shellcheck disable=SC2086
"$CACCEL" env --num_processes 4 $CP --parallelism_config_dp_replicate_size 2 > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "caccel env, DDP"; }
count 0 'dp_shard_cp' "$WORK/o"

note "$be: what remains refused"
# shellcheck disable=SC2086
if glaunch 4 "$be" $CP --parallelism_config_dp_shard_size 2 -- $SMALL --batch_size 8 > "$WORK/r" 2>&1; then cat "$WORK/r"; fail "accepted: dp_shard without a ZeRO stage"; fi
grep -q 'parallelism_config_cp_size 2 (from .*) with parallelism_config.parallelism_config_dp_shard_size (from .*): sharded data parallelism needs distributed_type FSDP' "$WORK/r" ||
    { cat "$WORK/r"; fail "no refusal of dp_shard without a ZeRO stage"; }
echo "  refused: cp 2 x dp_shard 2 under MULTI_CPU"
echo "PASS"
