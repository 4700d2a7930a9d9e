#!/bin/sh
# examples/gpt --gradient_checkpointing trains exactly as without it: with dropout 0.1 (masks
# replayed in the recompute), in f32 and under bf16 autocast, every logged loss and the final
# validation loss are the same to the last printed digit, as the gradients are bit-identical.
# On two processes (Gloo) the configuration key fsdp_activation_checkpointing does the same through
# ca_prepare, with the gradient hooks that start the all-reduce firing after the recompute, and
# under FSDP FULL_SHARD (stage 3: parameters gathered per Linear for the forward and the recompute),
# also when a rank's only validation batch is padding.
set -u
b=${CACCEL_TEST_BUILDDIR:-.}
GPT="$b/examples/gpt"
CACCEL="$b/tools/caccel"
fail() { echo "FAIL: $*"; exit 1; }
fdir=${CACCEL_FORTUNES_DIR:-/usr/share/games/fortunes}
[ -f "$fdir/science" ] || { echo "SKIP: fortunes not found in $fdir (apt-get install fortunes)"; exit 77; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/caccel-actckpt.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OPENBLAS_NUM_THREADS=1
SMALL="--n_layer 3 --n_head 2 --n_embd 32 --block_size 16 --batch_size 8 --max_steps 12 --dropout 0.1
       --log_interval 1 --eval_interval 12 --eval_samples 32 --seed 7 --cpu"

losses() { sed -n 's/^\(step [0-9/]*: loss [0-9.]*\),.*/\1/p; s/.*\(final validation loss [0-9.]*\).*/\1/p' "$1"; }

for mp in no bf16; do
    echo "== mixed_precision $mp"
    "$GPT" $SMALL --mixed_precision $mp > "$WORK/plain" 2>&1 || { cat "$WORK/plain"; fail "gpt exited non-zero"; }
    "$GPT" $SMALL --mixed_precision $mp --gradient_checkpointing > "$WORK/ckpt" 2>&1 ||
        { cat "$WORK/ckpt"; fail "gpt --gradient_checkpointing exited non-zero"; }
    grep -q "gradient checkpointing: 3 blocks" "$WORK/ckpt" || { cat "$WORK/ckpt"; fail "the blocks were not marked"; }
    losses "$WORK/plain" > "$WORK/plain.l"
    losses "$WORK/ckpt" > "$WORK/ckpt.l"
    [ "$(wc -l < "$WORK/plain.l")" -eq 13 ] || { cat "$WORK/plain"; fail "expected 12 loss lines and a validation loss"; }
    diff "$WORK/plain.l" "$WORK/ckpt.l" || fail "losses differ with --gradient_checkpointing ($mp)"
    echo "same: $(tail -1 "$WORK/ckpt.l")"
done

echo "== two processes, fsdp_activation_checkpointing"
gloo=""
for d in $(echo "${CACCEL_PLUGIN_PATH:-}" | tr ':' ' '); do [ -e "$d/caccel_gloo.so" ] && gloo=yes; done
if [ -x "$CACCEL" ] && [ -n "$gloo" ]; then
    run2() { timeout 300 "$CACCEL" launch --num_processes 2 --cpu --backend gloo "$GPT" $SMALL "$@"; }
    run2 > "$WORK/plain" 2>&1 || { cat "$WORK/plain"; fail "gpt on two processes exited non-zero"; }
    CACCEL_LOG_LEVEL=info run2 --fsdp_activation_checkpointing true > "$WORK/ckpt" 2>&1 ||
        { cat "$WORK/ckpt"; fail "gpt on two processes with fsdp_activation_checkpointing exited non-zero"; }
    grep -q "fsdp_activation_checkpointing (from --fsdp_activation_checkpointing): 3 layers of GPT checkpointed" \
        "$WORK/ckpt" || { cat "$WORK/ckpt"; fail "ca_prepare did not mark the blocks"; }
    losses "$WORK/plain" > "$WORK/plain.l"
    losses "$WORK/ckpt" > "$WORK/ckpt.l"
    [ "$(wc -l < "$WORK/plain.l")" -eq 13 ] || { cat "$WORK/plain"; fail "expected 12 loss lines and a validation loss"; }
    diff "$WORK/plain.l" "$WORK/ckpt.l" || fail "losses differ with fsdp_activation_checkpointing on two processes"
    echo "same: $(tail -1 "$WORK/ckpt.l")"
    # stage 3 (FULL_SHARD), one wrap unit per Linear, blocks checkpointed: the units are gathered for
    # the forward, again for the recompute in backward; generation after it summons the parameters
    run3() { timeout 300 "$CACCEL" launch --num_processes 2 --backend gloo --use_fsdp --fsdp_sharding_strategy FULL_SHARD "$GPT" $SMALL "$@"; }
    ACCELERATE_USE_CPU=true CACCEL_LOG_LEVEL=info run3 --fsdp_activation_checkpointing true --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP \
        --fsdp_transformer_layer_cls_to_wrap Linear > "$WORK/z3" 2>&1 || { cat "$WORK/z3"; fail "gpt under FULL_SHARD exited non-zero"; }
    grep -q "stage 3 keeps 23440 of 46880 parameters per process between steps; 13 wrap unit(s) (TRANSFORMER_BASED_WRAP)" \
        "$WORK/z3" || { cat "$WORK/z3"; fail "no stage 3 with 13 wrap units"; }
    losses "$WORK/z3" > "$WORK/z3.l"
    diff "$WORK/plain.l" "$WORK/z3.l" || fail "losses differ under FULL_SHARD with checkpointing on two processes"
    echo "same under FULL_SHARD: $(tail -1 "$WORK/z3.l")"
    # one validation window on two processes: rank 1's only batch is all padding, and under FULL_SHARD
    # its forward is collective, so it must still run it (it skipped it, and rank 0 waited out the timeout)
    run2 --max_steps 2 --eval_samples 1 > "$WORK/one" 2>&1 || { cat "$WORK/one"; fail "gpt --eval_samples 1"; }
    ACCELERATE_USE_CPU=true CACCEL_TIMEOUT=60 run3 --max_steps 2 --eval_samples 1 > "$WORK/z3one" 2>&1 ||
        { cat "$WORK/z3one"; fail "gpt under FULL_SHARD with one validation window exited non-zero"; }
    losses "$WORK/one" > "$WORK/one.l"
    losses "$WORK/z3one" > "$WORK/z3one.l"
    diff "$WORK/one.l" "$WORK/z3one.l" || fail "one validation window: losses under FULL_SHARD differ from plain data parallelism"
    echo "same with a batch of padding only: $(tail -1 "$WORK/z3one.l")"
else
    echo "(two processes skipped: no caccel or Gloo plugin on CACCEL_PLUGIN_PATH)"
fi
echo "PASS"
