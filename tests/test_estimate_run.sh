#!/bin/sh
# `caccel estimate-memory --run`: one step of the Fashion-MNIST MLP (784-256-128-10, AdamW, batch 64)
# on the lazy xla device; its model states are the MLP's exact sizes and its peak is within 5% of
# the peak measured by running the same step eagerly on the CPU (--measure, the caching allocator's
# statistics), at 1 process and at 2 and 4 under caccel launch; the same for the GPT example, also with
# activation checkpointing and bf16. Also: a program that never steps is reported, and --run's bad usage.
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

# the GPT example (2 layers, block 32, batch 8): plain, with activation checkpointing, with bf16
# mixed precision, and at 2 processes; each estimate within 5% of the measured peak (the lazy
# device's allocations replayed through the eager caching allocator: exact but for a few small
# allocations; replaying only its size classes, without its reuse of larger free blocks, was 7% low
# under bf16 and 1.2% for the f32 GPT; 5% and not less, as the eager run's GEMM path, and with it
# what it allocates, differs from one CPU to the next)
GPT="$BUILD/examples/gpt"
close() {   # close NAME NP ARGS...: the estimate and the measurement of one run agree within 5%
    name=$1 np=$2; shift 2
    e=$("$CACCEL" estimate-memory --num_processes "$np" --json --run "$GPT" "$@" 2>&1) || { echo "$e"; fail "$name: estimate"; }
    m=$(ACCELERATE_USE_CPU=true "$CACCEL" estimate-memory --num_processes "$np" --json --measure --run "$GPT" "$@" 2>&1) ||
        { echo "$m"; fail "$name: measure"; }
    pe=$(echo "$e" | tail -1 | field peak) pm=$(echo "$m" | tail -1 | field peak)
    note "$name: estimated $pe, measured $pm"
    d=$((pe > pm ? pe - pm : pm - pe))
    [ "$pm" -gt 0 ] && [ $((d * 20)) -le "$pm" ] || fail "$name: estimate $pe is more than 5% off $pm"
}
if [ -f "${CACCEL_FORTUNES_DIR:-/usr/share/games/fortunes}/science" ]; then
    G="--n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --batch_size 8 --eval_interval 1000"
    # shellcheck disable=SC2086
    close "gpt" 1 $G
    # shellcheck disable=SC2086
    close "gpt, activation checkpointing" 1 $G --gradient_checkpointing
    # shellcheck disable=SC2086
    # bf16: the lazy device runs the eager device's autocast (bf16 weight copies and activations),
    # not xla's bf16 storage, whose estimate was the f32 one, 16% under the measured peak
    close "gpt, bf16" 1 $G --mixed_precision bf16
    # shellcheck disable=SC2086
    have gloo && close "gpt, 2 processes" 2 $G
else
    note "SKIP gpt: no fortunes (apt-get install fortunes)"
fi

out=$("$CACCEL" estimate-memory --run /bin/true 2>&1) && fail "a program without a step passed"
echo "$out" | grep -q "/bin/true ended (exit status 0) without a report from rank 0" || { echo "$out"; fail "no-step message"; }
out=$("$CACCEL" estimate-memory --num_processes 1,2 --run "$FM" 2>&1) && fail "two process counts passed"
echo "$out" | grep -q "run takes no more than one --num_processes" || { echo "$out"; fail "usage message"; }
echo PASS
