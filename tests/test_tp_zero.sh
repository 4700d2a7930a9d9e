#!/bin/sh
# Tensor parallelism composed with sharded data parallelism (parallelism_config_dp_shard_size with
# parallelism_config_tp_size; distributed_type FSDP or DEEPSPEED), as users run it: each tp rank's slices
# are the parameters the ZeRO stage shards over the data-parallel ranks of its tp coordinate (the mesh's dp
# communicator). On 4 ranks at tp 2 x dp_shard 2, under caccel launch (Gloo) and mpirun (MPI):
# - tests/tp_check's MLP (fc1 colwise, fc2 rowwise) under FSDP FULL_SHARD (also offloaded), SHARD_GRAD_OP and
#   DeepSpeed zero_stage 1 and 2 trains to the losses and parameters of one process on the same global batch;
#   tp 2 x dp_shard 2 x dp_replicate 2 (HSDP) on 8 ranks too; clip_grad_norm gives one process's norm
#   (the split layers' squares summed over tp, the replicated ones counted once);
# - each rank's memory report (CACCEL_MEMORY_REPORT) holds a quarter of the split layers and half of the
#   replicated bias: its shard of its tp slice, parameters and optimizer state alike;
# - save_state at tp 2 x FULL_SHARD 2 (and zero_stage 2) writes one process's files (the state gathered
#   over dp, then over tp), which resume at the same mesh and at tp 1 x FULL_SHARD 2 to the uninterrupted
#   run and load in one process; one process's checkpoint loads at tp 2 x FULL_SHARD 2;
# - the GPT example (FULL_SHARD; zero_stage 2) and a small Llama fine-tune (examples/llm_finetune,
#   FULL_SHARD) unchanged at tp 2 x dp_shard 2 give one process's losses and saved model;
# - what does not compose is refused naming its key: dp_shard without a ZeRO stage (sharded state dicts
#   under tp: tests/test_tp_sharded_state.sh).
# Tolerance: 1e-5 (losses and parameters); the split and the shards change only the order of the sums.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
TP="$BUILD/tests/tp_check"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true CACCEL_LOG_LEVEL=info
LAUNCH_FLAGS=""   # ACCELERATE_USE_CPU chooses the device; --use_fsdp goes with it

# tlaunch NP BACKEND FLAGS -- ARGS...: $PROG (default tp_check) with the configuration flags to caccel launch
# (Gloo) or to the program (mpirun)
tlaunch() {
    np=$1 be=$2; shift 2
    flags=""
    while [ "$1" != "--" ]; do flags="$flags $1"; shift; done
    shift
    # shellcheck disable=SC2086
    if [ "$be" = mpi ]; then launch "$np" "$be" "${PROG:-$TP}" "$@" $flags
    else launch "$np" "$be" $flags "${PROG:-$TP}" "$@"; fi
}
losses() { grep '^step=' "$1" | sed 's/.*loss=//'; }
same_losses() {
    paste "$1" "$2" | awk -v want="${NSTEPS:-4}" '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; n++ }
        END { printf "  %d values, max |diff| %.3g\n", n, m; exit !(n == want && m <= 1e-5) }' ||
        fail "$2 differs from $1 beyond 1e-5"
}
MESH="--parallelism_config_tp_size 2 --parallelism_config_dp_shard_size 2"
FS="--use_fsdp --fsdp_sharding_strategy FULL_SHARD"

train_backends

note "one process, global batch 16, 4 steps"
"$TP" --plan --steps 4 --batch 16 --dump "$WORK/ref.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "1 rank"; }
losses "$WORK/o" > "$WORK/ref.loss"

# shard NAME BACKEND STRATEGY-FLAGS...: tp 2 x dp_shard 2 on 4 ranks (batch 8 each) == one process
shard() {
    name=$1 b=$2; shift 2
    # shellcheck disable=SC2086
    tlaunch 4 "$b" $MESH "$@" -- --plan --steps 4 --batch 8 --dump "$WORK/$name.bin" > "$WORK/$name" ||
        { cat "$WORK/$name"; fail "$name"; }
    count 1 'device mesh: dp_replicate 1 x dp_shard 2 x cp 1 x tp 2' "$WORK/$name"
    count 4 'params=108 steps=4' "$WORK/$name"   # each rank's tp slices (fc1 half, fc2.weight half, fc2.bias)
    losses "$WORK/$name" > "$WORK/$name.loss"
    same_losses "$WORK/ref.loss" "$WORK/$name.loss"
    same "$WORK/ref.bin" "$WORK/$name.bin"
}
for be in $backends; do
    note "$be: tp 2 x dp_shard 2 under FSDP FULL_SHARD == one process"
    # shellcheck disable=SC2086
    shard "fs$be" "$be" $FS
    count 1 'stage 3 keeps 54 of 108 parameters per process' "$WORK/fs$be"   # half of each tp rank's slices
    note "$be: tp 2 x dp_shard 2 under DeepSpeed zero_stage 2 and FSDP SHARD_GRAD_OP == one process"
    shard "z2$be" "$be" --use_deepspeed --zero_stage 2
    count 1 'sharded data parallelism: stage 2 (.*), 108 parameters in 2 shards of 54' "$WORK/z2$be"
    shard "sgo$be" "$be" --use_fsdp --fsdp_sharding_strategy SHARD_GRAD_OP
done
be=${backends%% *}
note "$be: DeepSpeed zero_stage 1, and FULL_SHARD with the optimizer offloaded, at tp 2 x dp_shard 2 == one process"
shard z1 "$be" --use_deepspeed --zero_stage 1
# shellcheck disable=SC2086
shard fsoff "$be" $FS --fsdp_offload_params true

note "$be: HSDP at tp 2: dp_replicate 2 x dp_shard 2 x tp 2 on 8 ranks (batch 4 each) == one process"
# shellcheck disable=SC2086
tlaunch 8 "$be" $MESH --parallelism_config_dp_replicate_size 2 $FS -- --plan --steps 4 --batch 4 \
    --dump "$WORK/h8.bin" > "$WORK/h8" || { cat "$WORK/h8"; fail "HSDP at tp 2"; }
count 1 'device mesh: dp_replicate 2 x dp_shard 2 x cp 1 x tp 2' "$WORK/h8"
count 1 'HYBRID_SHARD: shards within groups of 2 processes, replicated 2 times' "$WORK/h8"
losses "$WORK/h8" > "$WORK/h8.loss"
same_losses "$WORK/ref.loss" "$WORK/h8.loss"
same "$WORK/ref.bin" "$WORK/h8.bin"

note "$be: clip_grad_norm at tp 2 x FULL_SHARD 2: one process's norm on every rank"
"$TP" --plan --clip --steps 4 --batch 16 --dump "$WORK/c1.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "clip, 1 rank"; }
grep 'rank=0 step=.* norm=' "$WORK/o" | sed 's/.*norm=//' > "$WORK/c1.norm"
for zs in "$FS" "--use_deepspeed --zero_stage 2"; do
    # shellcheck disable=SC2086
    tlaunch 4 "$be" $MESH $zs -- --plan --clip --steps 4 --batch 8 --dump "$WORK/c4.bin" > "$WORK/o" ||
        { cat "$WORK/o"; fail "clip at tp 2 x dp_shard 2 ($zs)"; }
    for r in 0 1 2 3; do
        grep "rank=$r step=.* norm=" "$WORK/o" | sed 's/.*norm=//' > "$WORK/c4.norm"
        same_losses "$WORK/c1.norm" "$WORK/c4.norm"
    done
    same "$WORK/c1.bin" "$WORK/c4.bin"
done

note "$be: per-rank memory at tp 2 x FULL_SHARD 2: a quarter of the split layers, half of the replicated bias"
# 1 process: 212 parameters (fc1 128 + 16, fc2 64 + 4), 848 bytes, and as many of SGD's momentum. Each rank:
# its tp slice of 108 (fc1 72, fc2.weight 32, fc2.bias 4) in 2 shards of 54: 216 bytes each
CACCEL_MEMORY_REPORT="$WORK/mem1" "$TP" --plan --steps 2 --batch 16 > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "memory, 1 rank"; }
grep -q 'parameters=848 gradients=848 optimizer_state=848 ' "$WORK/mem1.0" || { cat "$WORK/mem1.0"; fail "1 rank's report"; }
# shellcheck disable=SC2086
CACCEL_MEMORY_REPORT="$WORK/mem" tlaunch 4 "$be" $MESH $FS -- --plan --steps 2 --batch 8 > "$WORK/o" ||
    { cat "$WORK/o"; fail "memory at tp 2 x FULL_SHARD 2"; }
for r in 0 1 2 3; do
    grep -q "^rank=$r world=4 device=cpu zero=3 parameters=216 gradients=216 optimizer_state=216 " "$WORK/mem.$r" ||
        { cat "$WORK/mem.$r"; fail "rank $r does not hold a quarter of the split layers"; }
done
echo "  every rank: parameters, gradients, optimizer state 216 bytes each (one process: 848)"

note "$be: checkpoints at tp 2 x FULL_SHARD 2 are one process's; resumed at the same mesh and at tp 1 x FULL_SHARD 2"
"$TP" --plan --steps 2 --batch 16 --save-state "$WORK/ck1" --dump "$WORK/s1.bin" > "$WORK/o" 2>&1 ||
    { cat "$WORK/o"; fail "save, 1 rank"; }
tail -n 2 "$WORK/ref.loss" > "$WORK/ref2.loss"
# resume NAME CKPT NP FLAGS...: 2 more steps from CKPT (2 data-parallel ranks of 8) == steps 3 and 4 of the
# uninterrupted run
resume() {
    name=$1 ck=$2 np=$3; shift 3
    # shellcheck disable=SC2086
    tlaunch "$np" "$be" "$@" -- --plan --steps 2 --batch 8 --load-state "$ck" --dump "$WORK/$name.bin" \
        > "$WORK/$name" || { cat "$WORK/$name"; fail "resume $name"; }
    count 1 '^step=2 ' "$WORK/$name"
    losses "$WORK/$name" > "$WORK/$name.loss"
    NSTEPS=2 same_losses "$WORK/ref2.loss" "$WORK/$name.loss"
    same "$WORK/ref.bin" "$WORK/$name.bin"
}
for zs in "$FS" "--use_deepspeed --zero_stage 2"; do
    rm -rf "$WORK/ck4"
    # shellcheck disable=SC2086
    tlaunch 4 "$be" $MESH $zs -- --plan --steps 2 --batch 8 --save-state "$WORK/ck4" > "$WORK/o" ||
        { cat "$WORK/o"; fail "save at tp 2 x dp_shard 2 ($zs)"; }
    count 4 'params=108 steps=2' "$WORK/o"
    same_st "$WORK/ck1/model.safetensors" "$WORK/ck4/model.safetensors"
    same_st "$WORK/ck1/optimizer.safetensors" "$WORK/ck4/optimizer.safetensors"   # the momentum, whole
    # shellcheck disable=SC2086
    resume "r4" "$WORK/ck4" 4 $MESH $zs
done
resume r1 "$WORK/ck4" 2 --use_deepspeed --zero_stage 2   # no mesh: plain ZeRO over 2 ranks
# shellcheck disable=SC2086
resume r2 "$WORK/ck4" 2 $FS
# one process's checkpoint (its dataloader at batch 16) at tp 2 x FULL_SHARD 2: its parameters on every rank
# shellcheck disable=SC2086
tlaunch 4 "$be" $MESH $FS -- --plan --steps 0 --batch 16 --load-state "$WORK/ck1" --dump "$WORK/d4.bin" > "$WORK/o" ||
    { cat "$WORK/o"; fail "load one process's checkpoint at tp 2 x FULL_SHARD 2"; }
same "$WORK/s1.bin" "$WORK/d4.bin"
# and the checkpoint of tp 2 x FULL_SHARD 2 (its dataloader at batch 8) in one process: its parameters
"$TP" --plan --steps 0 --batch 8 --load-state "$WORK/ck4" --dump "$WORK/r0.bin" > "$WORK/r0" 2>&1 ||
    { cat "$WORK/r0"; fail "load at 1 process"; }
same "$WORK/s1.bin" "$WORK/r0.bin"

note "$be: the GPT example unchanged at tp 2 x dp_shard 2 (batch 8 each) == one process (batch 16)"
GPT="$BUILD/examples/gpt"
SMALL="--n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --lr 3e-3 --log_interval 2 --eval_interval 4 --eval_samples 16"
gpt_lines() { sed -n -e 's/^\(step [0-9]*\/[0-9]*: loss [0-9.]*\),.*/\1/p' -e '/^step [0-9]*: validation loss/p' -e '/^sample/,/^-- end of sample/p' "$1"; }
# shellcheck disable=SC2086
"$GPT" $SMALL --batch_size 16 --max_steps 6 --sample_tokens 10 --dropout 0 --output_dir "$WORK/go1" > "$WORK/g1" 2>&1 ||
    { cat "$WORK/g1"; fail "gpt, 1 rank"; }
gpt_lines "$WORK/g1" > "$WORK/g1.l"
[ "$(grep -c '^step' "$WORK/g1.l")" -ge 5 ] || { cat "$WORK/g1"; fail "no loss lines"; }
for run in "gloo $FS" "mpi --use_deepspeed --zero_stage 2"; do
    b=${run%% *} zs=${run#* }
    echo "$backends" | grep -q "$b" || continue
    # shellcheck disable=SC2086
    PROG="$GPT" tlaunch 4 "$b" $MESH $zs -- $SMALL --batch_size 8 --max_steps 6 --sample_tokens 10 --dropout 0 \
        --output_dir "$WORK/go4$b" > "$WORK/g4$b" 2>&1 || { cat "$WORK/g4$b"; fail "gpt tp 2 x dp_shard 2 ($b, $zs)"; }
    count 1 'device mesh: dp_replicate 1 x dp_shard 2 x cp 1 x tp 2' "$WORK/g4$b"
    count 4 'gpt: rank [0-3] holds logits \[8, 32, 128\] of vocab 256 at tp 2' "$WORK/g4$b"
    gpt_lines "$WORK/g4$b" > "$WORK/g4.l"
    cmp -s "$WORK/g1.l" "$WORK/g4.l" || { diff "$WORK/g1.l" "$WORK/g4.l"; fail "the GPT example at tp 2 x dp_shard 2 ($b, $zs) differs from one process"; }
    echo "  $b, $zs: $(grep -c . "$WORK/g1.l") loss, validation and sample lines the same"
    same_st "$WORK/go1/model.safetensors" "$WORK/go4$b/model.safetensors"
done

be=${backends%% *}   # (launch set it: the GPT runs' last)
note "$be: a small Llama fine-tune (examples/llm_finetune) at tp 2 x FULL_SHARD 2 == one process"
gpl=/usr/share/common-licenses/GPL-3
if [ -f "$gpl" ]; then
    FT="$BUILD/examples/llm_finetune"
    srcdir=${CACCEL_TEST_SRCDIR:-${srcdir:-.}}
    mkdir "$WORK/base"
    cp "$srcdir/examples/llama-tiny.json" "$WORK/base/config.json" || fail "no examples/llama-tiny.json"
    RUN="--from_scratch --block_size 32 --log_interval 1 --seed 7 --eval_blocks 8 --max_steps 4 --lr 5e-3 --data $gpl --lora_r 0"
    ft_lines() { sed -n -e 's/^\(epoch [0-9]* step [0-9/]*: loss [0-9.]*\),.*/\1/p' -e 's/^epoch [0-9]*: .*held-out loss \([0-9.]*\).*/held-out \1/p' "$1"; }
    # shellcheck disable=SC2086
    "$FT" --cpu --model "$WORK/base" $RUN --batch_size 16 --output_dir "$WORK/l1" > "$WORK/ft1" 2>&1 || { cat "$WORK/ft1"; fail "llama, 1 process"; }
    # shellcheck disable=SC2086
    PROG="$FT" tlaunch 4 "$be" $MESH $FS -- --model "$WORK/base" $RUN --batch_size 8 --output_dir "$WORK/l4" > "$WORK/ft4" ||
        { cat "$WORK/ft4"; fail "llama at tp 2 x FULL_SHARD 2"; }
    count 4 'llm_finetune: rank [0-3] holds 70080 parameters (its tensor-parallel slices)' "$WORK/ft4"
    ft_lines "$WORK/ft1" > "$WORK/ft1.l"
    ft_lines "$WORK/ft4" > "$WORK/ft4.l"
    [ "$(grep -c ' step ' "$WORK/ft1.l")" -ge 4 ] || { cat "$WORK/ft1"; fail "no llama loss lines"; }
    paste -d ' ' "$WORK/ft1.l" "$WORK/ft4.l" | awk '
        /step/ { d = $6 - $12; if (d < 0) d = -d; if (d > m) m = d; n++; next }
        { d = $2 - $4; if (d < 0) d = -d; if (d > 1e-4) bad = 1 }   # held-out: 4 decimals
        END { printf "  %d step losses, max |diff| %.3g\n", n, m; exit !(n >= 4 && m <= 1e-5 && !bad) }' ||
        { diff "$WORK/ft1.l" "$WORK/ft4.l"; fail "the Llama fine-tune at tp 2 x FULL_SHARD 2 differs from one process"; }
    same_st "$WORK/l1/model.safetensors" "$WORK/l4/model.safetensors"
else
    echo "  skipped: $gpl not found (Debian's base-files)"
fi

# refused NP FLAGS -- ARGS -- PATTERN: the run fails with a message matching PATTERN
refused() {
    np=$1; shift
    flags=""
    while [ "$1" != "--" ]; do flags="$flags $1"; shift; done
    shift
    args=""
    while [ "$1" != "--" ]; do args="$args $1"; shift; done
    shift
    # shellcheck disable=SC2086
    if tlaunch "$np" "$be" $flags -- $args > "$WORK/r" 2>&1; then cat "$WORK/r"; fail "accepted: $flags $args"; fi
    grep -q -- "$1" "$WORK/r" || { cat "$WORK/r"; fail "no message '$1' for: $flags $args"; }
    echo "  refused: $flags $args"
}
note "$be: refusals"
# shellcheck disable=SC2086
refused 4 $MESH -- --plan --steps 1 -- 'with parallelism_config.parallelism_config_dp_shard_size (from .*): sharded data parallelism needs distributed_type FSDP'
echo "PASS"
