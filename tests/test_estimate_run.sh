#!/bin/sh
# `caccel estimate-memory --run`: one step of the Fashion-MNIST MLP (784-256-128-10, AdamW, batch 64)
# on the lazy xla device; its model states are the MLP's exact sizes and its peak is within 5% of
# the peak measured by running the same step eagerly on the CPU (--measure, the caching allocator's
# statistics), at 1 process and at 2 and 4 under caccel launch, also under ZeRO stages 1, 2 and 3
# (DeepSpeed and FSDP), whose sharded states match the measured run's to the byte; the same for the
# GPT example, also with activation checkpointing, bf16 and ZeRO, and for the BERT fine-tune on
# all-MiniLM-L6-v2 (CACCEL_MINILM_DIR; skipped without it). Also: a program that never steps
# is reported, and --run's bad usage.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
FM="$BUILD/examples/fashion_mnist"
export OPENBLAS_NUM_THREADS=1
unset ACCELERATE_USE_CPU CACCEL_USE_XLA
fmnist_subset 256 "$WORK/fm" || skip "no Fashion-MNIST (tools/install-deps.sh installs it)"

field() { sed -n "s/.*\"$1\": \([0-9]*\).*/\1/p"; }
est=$("$CACCEL" estimate-memory --json --run "$FM" --data "$WORK/fm" --batch-size 64 2>&1) || { echo "$est"; fail "estimate"; }
echo "$est" | tail -1
meas=$(ACCELERATE_USE_CPU=true "$CACCEL" estimate-memory --json --measure --run "$FM" --data "$WORK/fm" --batch-size 64 2>&1) ||
    { echo "$meas"; fail "measure"; }
echo "$meas" | tail -1
echo "$est" | grep -q '"device": "xla"' || fail "the estimate did not run on the xla device"
echo "$meas" | grep -q '"device": "cpu"' || fail "the measurement did not run on the cpu device"
# 235146 parameters in f32; AdamW keeps two states per parameter
for out in "$est" "$meas"; do
    [ "$(echo "$out" | tail -1 | field parameters)" = 940584 ] || fail "parameters"
    [ "$(echo "$out" | tail -1 | field gradients)" = 940584 ] || fail "gradients"
    [ "$(echo "$out" | tail -1 | field optimizer_state)" = 1881168 ] || fail "optimizer state"
done
pe=$(echo "$est" | tail -1 | field peak) pm=$(echo "$meas" | tail -1 | field peak)
note "peak: estimated $pe, measured $pm"
[ "$pe" -gt 0 ] && [ "$pm" -gt 0 ] || fail "no peak"
d=$((pe > pm ? pe - pm : pm - pe))
[ $((d * 20)) -le "$pm" ] || fail "estimate $pe is more than 5% off the measured peak $pm"

# 2 and 4 processes under caccel launch (Gloo): the last rank's estimate within 5% of its measured peak
if have gloo; then
    for np in 2 4; do
        last=$((np - 1))
        est=$("$CACCEL" estimate-memory --num_processes "$np" --json --run "$FM" --data "$WORK/fm" --batch-size 64 2>&1) ||
            { echo "$est"; fail "estimate, $np processes"; }
        meas=$(ACCELERATE_USE_CPU=true "$CACCEL" estimate-memory --num_processes "$np" --json --measure --run "$FM" \
            --data "$WORK/fm" --batch-size 64 2>&1) || { echo "$meas"; fail "measure, $np processes"; }
        echo "$est" | tail -1 | grep -q "\"rank\": $last, \"device\": \"xla\"" || { echo "$est"; fail "no report of rank $last"; }
        pe=$(echo "$est" | tail -1 | field peak) pm=$(echo "$meas" | tail -1 | field peak)
        note "$np processes, rank $last's peak: estimated $pe, measured $pm"
        d=$((pe > pm ? pe - pm : pm - pe))
        [ "$pm" -gt 0 ] && [ $((d * 20)) -le "$pm" ] || fail "$np processes: estimate $pe is more than 5% off $pm"
    done
fi

# ZeRO and FSDP: the strategy runs for real on the lazy device (CACCEL_MEMORY_ESTIMATE chooses the
# device, not distributed_type, which stays DEEPSPEED or FSDP), so each rank's shards of the optimizer
# state, the gradients (stages 2 and 3) and the parameters (stage 3) are the measured run's to the
# byte: the MLP's 235,146 parameters padded to NP shards of ceil(235146 / NP); the peak within 5%.
# Stages 1, 2 and 3 each at 2 and 4 processes, through DeepSpeed's zero_stage and FSDP's strategy names.
# Without the lazy device under DeepSpeed/FSDP the estimate stops on "both choose distributed_type".
zero_case() {   # zero_case NP STAGE VAR=VALUE...: the strategy's variables for both runs
    np=$1 st=$2; shift 2
    last=$((np - 1)) shard=$(((235146 + np - 1) / np))
    e=$(env "$@" "$CACCEL" estimate-memory --num_processes "$np" --json --run "$FM" --data "$WORK/fm" --batch-size 64 2>&1) ||
        { echo "$e"; fail "$* at $np: estimate"; }
    m=$(env ACCELERATE_USE_CPU=true "$@" "$CACCEL" estimate-memory --num_processes "$np" --json --measure --run "$FM" \
        --data "$WORK/fm" --batch-size 64 2>&1) || { echo "$m"; fail "$* at $np: measure"; }
    e=$(echo "$e" | tail -1) m=$(echo "$m" | tail -1)
    echo "$e" | grep -q "\"rank\": $last, \"device\": \"xla\", \"zero_stage\": $st," || { echo "$e"; fail "$* at $np: not stage $st on xla"; }
    echo "$m" | grep -q "\"rank\": $last, \"device\": \"cpu\", \"zero_stage\": $st," || { echo "$m"; fail "$* at $np: not stage $st on cpu"; }
    want_p=940584 want_g=$((4 * shard * np)) want_u=0
    [ "$st" -ge 2 ] && want_g=$((4 * shard)) want_u=$((4 * shard * np))
    [ "$st" = 3 ] && want_p=$((4 * shard))
    for out in "$e" "$m"; do
        [ "$(echo "$out" | field parameters)" = $want_p ] || { echo "$out"; fail "$* at $np: parameters (want $want_p)"; }
        [ "$(echo "$out" | field gradients)" = $want_g ] || { echo "$out"; fail "$* at $np: gradients (want $want_g)"; }
        [ "$(echo "$out" | field optimizer_state)" = $((8 * shard)) ] || { echo "$out"; fail "$* at $np: optimizer state"; }
        [ "$st" = 3 ] || [ "$(echo "$out" | field unsharded)" = $want_u ] || { echo "$out"; fail "$* at $np: unsharded"; }
    done
    # stage 3's gathered units: the same units gathered in the same order in both runs, at the peak
    # (unsharded) and at most (unsharded_most); the activations, the peak's rest, then agree to the
    # byte; the five parts add up to the peak
    for f in unsharded unsharded_most activations; do
        [ "$(echo "$e" | field $f)" = "$(echo "$m" | field $f)" ] || { echo "$e"; echo "$m"; fail "$* at $np: $f differs"; }
    done
    for out in "$e" "$m"; do
        sum=$(($(echo "$out" | field parameters) + $(echo "$out" | field gradients) + $(echo "$out" | field optimizer_state) \
            + $(echo "$out" | field unsharded) + $(echo "$out" | field activations)))
        [ "$sum" = "$(echo "$out" | field peak)" ] || { echo "$out"; fail "$* at $np: the parts add up to $sum, not the peak"; }
        [ "$(echo "$out" | field unsharded)" -le "$(echo "$out" | field unsharded_most)" ] || { echo "$out"; fail "$* at $np: unsharded above its most"; }
    done
    # at stage 3 the MLP's peak does not fall where most is gathered (at 2 processes 803,840 bytes
    # at the peak, fc1's parameters, against 1,744,424 at most): counting the most undercounted the
    # activations by the difference
    if [ "$st" = 3 ]; then
        [ "$(echo "$e" | field unsharded)" -lt "$(echo "$e" | field unsharded_most)" ] || { echo "$e"; fail "$* at $np: stage 3's peak at its most gathered"; }
    fi
    pe=$(echo "$e" | field peak) pm=$(echo "$m" | field peak)
    note "$* at $np processes, rank $last's peak: estimated $pe, measured $pm"
    d=$((pe > pm ? pe - pm : pm - pe))
    [ "$pm" -gt 0 ] && [ $((d * 20)) -le "$pm" ] || fail "$* at $np: estimate $pe is more than 5% off $pm"
}
if have gloo; then
    DS="ACCELERATE_USE_DEEPSPEED=true" FS="ACCELERATE_USE_FSDP=true"
    zero_case 2 1 $DS ACCELERATE_DEEPSPEED_ZERO_STAGE=1
    zero_case 2 2 $DS ACCELERATE_DEEPSPEED_ZERO_STAGE=2
    zero_case 2 3 $FS FSDP_SHARDING_STRATEGY=FULL_SHARD
    # under the sanitizers (CACCEL_TEST_SANITIZED) 2 processes only: 4 run the same code
    if [ "${CACCEL_TEST_SANITIZED:-}" != yes ]; then
        zero_case 4 1 $DS ACCELERATE_DEEPSPEED_ZERO_STAGE=1
        zero_case 4 2 $FS FSDP_SHARDING_STRATEGY=SHARD_GRAD_OP
        zero_case 4 3 $DS ACCELERATE_DEEPSPEED_ZERO_STAGE=3
    fi
fi

# the GPT example (2 layers, block 32, batch 8): plain, with activation checkpointing, with bf16
# mixed precision, and at 2 processes; each estimate within 5% of the measured peak (the lazy
# device's allocations replayed through the eager caching allocator: exact but for a few small
# allocations; replaying only its size classes, without its reuse of larger free blocks, was 7% low
# under bf16 and 1.2% for the f32 GPT; 5% and not less, as the eager run's GEMM path, and with it
# what it allocates, differs from one CPU to the next)
GPT="$BUILD/examples/gpt"
ZENV=""    # VAR=VALUE words for both runs of close (the strategy's variables)
close() {   # close NAME NP PROGRAM ARGS...: the estimate and the measurement of one run agree within 5%
    name=$1 np=$2 prog=$3; shift 3
    # shellcheck disable=SC2086
    e=$(env $ZENV "$CACCEL" estimate-memory --num_processes "$np" --json --run "$prog" "$@" 2>&1) || { echo "$e"; fail "$name: estimate"; }
    # shellcheck disable=SC2086
    m=$(env ACCELERATE_USE_CPU=true $ZENV "$CACCEL" estimate-memory --num_processes "$np" --json --measure --run "$prog" "$@" 2>&1) ||
        { echo "$m"; fail "$name: measure"; }
    pe=$(echo "$e" | tail -1 | field peak) pm=$(echo "$m" | tail -1 | field peak)
    note "$name: estimated $pe, measured $pm"
    d=$((pe > pm ? pe - pm : pm - pe))
    [ "$pm" -gt 0 ] && [ $((d * 20)) -le "$pm" ] || fail "$name: estimate $pe is more than 5% off $pm"
    # the activations too (at stage 3 counted with the units gathered at the peak)
    ae=$(echo "$e" | tail -1 | field activations) am=$(echo "$m" | tail -1 | field activations)
    d=$((ae > am ? ae - am : am - ae))
    [ "$am" -gt 0 ] && [ $((d * 20)) -le "$am" ] || fail "$name: activations $ae estimated, more than 5% off $am"
}
if [ -f "${CACCEL_FORTUNES_DIR:-/usr/share/games/fortunes}/science" ]; then
    G="--n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --batch_size 8 --eval_interval 1000"
    # shellcheck disable=SC2086
    close "gpt" 1 "$GPT" $G
    # shellcheck disable=SC2086
    close "gpt, activation checkpointing" 1 "$GPT" $G --gradient_checkpointing
    # shellcheck disable=SC2086
    # bf16: the lazy device runs the eager device's autocast (bf16 weight copies and activations),
    # not xla's bf16 storage, whose estimate was the f32 one, 16% under the measured peak
    close "gpt, bf16" 1 "$GPT" $G --mixed_precision bf16
    # shellcheck disable=SC2086
    have gloo && close "gpt, 2 processes" 2 "$GPT" $G
    # under ZeRO: stage 3 in bf16 (its gathers in bf16, widened into the f32 parameters) and stage 2
    # at 4 processes
    ZENV="ACCELERATE_USE_FSDP=true FSDP_SHARDING_STRATEGY=FULL_SHARD"
    # shellcheck disable=SC2086
    have gloo && close "gpt, FULL_SHARD, bf16" 2 "$GPT" $G --mixed_precision bf16
    ZENV="ACCELERATE_USE_DEEPSPEED=true ACCELERATE_DEEPSPEED_ZERO_STAGE=2"
    # shellcheck disable=SC2086
    have gloo && close "gpt, zero_stage 2" 4 "$GPT" $G
    ZENV=""
else
    note "SKIP gpt: no fortunes (apt-get install fortunes)"
fi

# the BERT fine-tune (examples/bert_classifier on the pretrained all-MiniLM-L6-v2, 22.7M parameters,
# tools/fetch-minilm.sh; skipped without it): 1 and 2 processes, zero_stage 2 at 2 (its flat
# gradient of 90.9 MB held unsharded from the backward to the reduce-scatter) and FULL_SHARD at 2.
# Under the sanitizers the zero_stage 2 run only (the others go through the same code on the GPT
# example above).
bert=""
for d in "${CACCEL_MINILM_DIR:-}" "${CACCEL_DATA_DIR:+$CACCEL_DATA_DIR/all-minilm-l6-v2}" "$BUILD/data/all-minilm-l6-v2"; do
    [ -n "$d" ] && [ -f "$d/model.safetensors" ] && { bert=$d; break; }
done
if [ -n "$bert" ] && [ -f "${CACCEL_FORTUNES_DIR:-/usr/share/games/fortunes}/science" ]; then
    B="--model $bert --max_steps 2 --batch_size 8 --max_length 32"
    if [ "${CACCEL_TEST_SANITIZED:-}" != yes ]; then
        # shellcheck disable=SC2086
        close "bert" 1 "$BUILD/examples/bert_classifier" $B
        # shellcheck disable=SC2086
        have gloo && close "bert, 2 processes" 2 "$BUILD/examples/bert_classifier" $B
    fi
    ZENV="ACCELERATE_USE_DEEPSPEED=true ACCELERATE_DEEPSPEED_ZERO_STAGE=2"
    # shellcheck disable=SC2086
    have gloo && close "bert, zero_stage 2" 2 "$BUILD/examples/bert_classifier" $B
    # FULL_SHARD: the classifier runs its encoder through ca_module_forward, whose hook gathers the
    # encoder's unit (it called the encoder's function directly, and the first lookup found no table)
    ZENV="ACCELERATE_USE_FSDP=true FSDP_SHARDING_STRATEGY=FULL_SHARD"
    # shellcheck disable=SC2086
    have gloo && [ "${CACCEL_TEST_SANITIZED:-}" != yes ] && close "bert, FULL_SHARD" 2 "$BUILD/examples/bert_classifier" $B
    ZENV=""
else
    note "SKIP bert: no all-MiniLM-L6-v2 (tools/fetch-minilm.sh; CACCEL_MINILM_DIR) or no fortunes"
fi

out=$("$CACCEL" estimate-memory --run /bin/true 2>&1) && fail "a program without a step passed"
echo "$out" | grep -q "/bin/true ended (exit status 0) without a report from rank 0" || { echo "$out"; fail "no-step message"; }
out=$("$CACCEL" estimate-memory --num_processes 1,2 --run "$FM" 2>&1) && fail "two process counts passed"
echo "$out" | grep -q "run takes no more than one --num_processes" || { echo "$out"; fail "usage message"; }
echo PASS
