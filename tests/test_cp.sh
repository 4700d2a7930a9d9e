#!/bin/sh
# Context parallelism (parallelism_config_cp_size) on the device mesh, as users run it: the attention of a
# sequence split over the cp ranks in load-balanced causal chunks (ca_maybe_context_parallel; keys and
# values all-gathered over cp, their gradients reduce-scattered back; or, with
# parallelism_config_cp_comm_strategy alltoall, passed round the cp ring by sendrecv: ring attention) gives
# one process's output and gradients at cp 2 and cp 4 (grouped-query heads), and central differences of
# the whole loss, the cp communicator sending each method's formula of bytes; the loss is
# one process's mean when the cp ranks count different numbers of tokens; the GPT example trains at cp 2 and
# at cp 2 x dp_replicate 2 (and cp 2 x tp 2) to one process's losses and parameters on the same global batch,
# under caccel launch (Gloo) and mpirun (MPI); a Llama-family decoder (examples/llm_finetune: rotary
# positions, grouped-query heads) at cp 2 and cp 2 x tp 2 too; the mesh names the cp and dp_cp
# communicators; the GPT example at cp 2 on the lazy device (--tpu) gives one process's on it, with the
# all-gather and with ring attention, whose exchanges are nodes of the device's graph (the split attention
# at cp 2 and cp 4 there too); each combination that does not work yet is refused with a message naming
# its key.
# Tolerance: 1e-5 (outputs, gradients, losses, parameters); the split changes only the order of the sums.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
CP="$BUILD/tests/cp_check"
GPT="$BUILD/examples/gpt"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true CACCEL_LOG_LEVEL=info
# shellcheck disable=SC2034
LAUNCH_FLAGS=""   # read by launch: ACCELERATE_USE_CPU chooses the device

# tlaunch NP BACKEND FLAGS -- ARGS...: $PROG (default cp_check) through mesh_launch (dist/lib.sh)
tlaunch() { tl_np=$1 tl_be=$2; shift 2; mesh_launch "$tl_np" "$tl_be" "${PROG:-$CP}" "$@"; }
train_backends

note "cp 1: ca_maybe_context_parallel leaves the batch whole, the attention and loss are one process's"
"$CP" --central > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "cp 1"; }
count 1 'rank=0 cp attention ok .* holds q \[2, 4, 16, 8\]' "$WORK/o"
count 1 'rank=0 central ok' "$WORK/o"

# RING: the flags of ring attention; STRATS: both methods (allgather, then the ring)
RING="--parallelism_config_cp_comm_strategy alltoall"
for be in $backends; do
  for strat in allgather alltoall; do
    sf="--parallelism_config_cp_comm_strategy $strat" ra=""; [ $strat = alltoall ] && ra=--ring
    note "$be, $strat: the split attention at cp 2 and cp 4 == one process (output, q, k, v gradients)"
    # shellcheck disable=SC2086
    tlaunch 2 "$be" --parallelism_config_cp_size 2 $sf -- --central $ra > "$WORK/o" || { cat "$WORK/o"; fail "cp 2 $be $strat"; }
    count 1 'device mesh: dp_replicate 1 x dp_shard 1 x cp 2 x tp 1' "$WORK/o"
    count 2 'cp attention ok .* holds q \[2, 4, 8, 8\]' "$WORK/o"
    count 2 'central ok' "$WORK/o"
    # 2 (cp - 1) B Hkv (T / cp) D 4 = 2048 bytes a method's unit: 4 of them gathered, 6 round the ring
    want=4096; [ $strat = alltoall ] && want=6144
    count 2 "cp bytes $want (" "$WORK/o"
    # shellcheck disable=SC2086
    tlaunch 4 "$be" --parallelism_config_cp_size 4 $sf -- $ra > "$WORK/o" || { cat "$WORK/o"; fail "cp 4 $be $strat"; }
    count 4 'cp attention ok .* holds q \[2, 4, 4, 8\]' "$WORK/o"
    want=6144; [ $strat = alltoall ] && want=9216
    count 4 "cp bytes $want (" "$WORK/o"
  done
    note "$be: the loss at cp 2 == one process's mean (the ranks count 8 and 14 of the labels)"
    "$CP" --loss > "$WORK/o1" 2>&1 || { cat "$WORK/o1"; fail "loss, 1 rank"; }
    want=$(sed -n 's/^rank=0 cp loss ok //p' "$WORK/o1")
    tlaunch 2 "$be" --parallelism_config_cp_size 2 -- --loss > "$WORK/o" || { cat "$WORK/o"; fail "loss cp 2 $be"; }
    count 2 "cp loss ok $want" "$WORK/o"
done

be=${backends%% *}
note "$be: refusals under the split (a mask, non-causal, dropout, a second split, a length 2 cp does not divide)"
tlaunch 2 "$be" --parallelism_config_cp_size 2 -- --refuse > "$WORK/o" || { cat "$WORK/o"; fail "refuse $be"; }
count 2 'refused: .*context parallelism (parallelism_config_cp_size 2, from .*): attention with a mask (padding) is not split yet' "$WORK/o"
count 2 'refused: .*: non-causal attention is not split yet' "$WORK/o"
count 2 'refused: .*: attention dropout is not supported yet' "$WORK/o"
count 2 "refused: ca_maybe_context_parallel: this thread's batch is already split" "$WORK/o"
count 2 'refused: .*a sequence of 18 tokens does not split into 2 x parallelism_config_cp_size = 4 equal chunks' "$WORK/o"

# gpt_lines FILE: the losses, validation losses and the sample (4 decimals, as printed)
gpt_lines() { sed -n -e 's/^\(step [0-9]*\/[0-9]*: loss [0-9.]*\),.*/\1/p' -e '/^step [0-9]*: validation loss/p' -e '/^sample/,/^-- end of sample/p' "$1"; }
# lr 1e-3: AdamW's steps turn the split's other order of sums (the gradients' average over dp_cp, the keys'
# and values' gradients summed over cp) into differences of the parameters that grow with the learning
# rate: 1.4e-5 after 6 steps at test_tp.sh's 3e-3
SMALL="--n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --lr 1e-3 --log_interval 1 --eval_interval 3 --eval_samples 16 --dropout 0"
note "one process: the GPT example, batch 8 and 16, 6 steps"
# shellcheck disable=SC2086
"$GPT" $SMALL --batch_size 8 --max_steps 6 --sample_tokens 10 --output_dir "$WORK/g1.m" > "$WORK/g1" 2>&1 || { cat "$WORK/g1"; fail "gpt, 1 rank"; }
gpt_lines "$WORK/g1" > "$WORK/g1.l"
[ "$(grep -c '^step' "$WORK/g1.l")" -ge 8 ] || { cat "$WORK/g1"; fail "no loss lines"; }
# shellcheck disable=SC2086
"$GPT" $SMALL --batch_size 16 --max_steps 6 --output_dir "$WORK/go16" > "$WORK/g16" 2>&1 || { cat "$WORK/g16"; fail "gpt batch 16, 1 rank"; }
gpt_lines "$WORK/g16" > "$WORK/g16.l"
# gpt_cp2 BACKEND NAME REF ARGS...: the GPT example at cp 2 with ARGS (batch 8, 6 steps), its loss, validation
# and sample lines those of REF (one process's output), its model (in $WORK/NAME.m) one process's (REF.m)
gpt_cp2() {
    cb=$1 cn=$2 cref=$3; shift 3
    rm -rf "$WORK/$cn.m"
    # shellcheck disable=SC2086
    PROG="$GPT" tlaunch 2 "$cb" --parallelism_config_cp_size 2 -- $SMALL --batch_size 8 --max_steps 6 --sample_tokens 10 \
        "$@" --output_dir "$WORK/$cn.m" > "$WORK/$cn" 2>&1 || { cat "$WORK/$cn"; fail "gpt cp 2 $* ($cb)"; }
    count 1 'device mesh: dp_replicate 1 x dp_shard 1 x cp 2 x tp 1' "$WORK/$cn"
    count 2 'gpt: rank [01] validates 16 of every 32 tokens' "$WORK/$cn"   # validation splits too
    gpt_lines "$WORK/$cn" > "$WORK/$cn.l"
    cmp -s "$cref.l" "$WORK/$cn.l" || { diff "$cref.l" "$WORK/$cn.l"; fail "the GPT example at cp 2 $* differs from one process"; }
    echo "  $(grep -c . "$cref.l") loss, validation and sample lines the same"
    same_st "$cref.m/model.safetensors" "$WORK/$cn.m/model.safetensors"
}
for be in $backends; do
    note "$be: the GPT example at cp 2 (each rank 16 of every 32 tokens) == one process"
    gpt_cp2 "$be" g2 "$WORK/g1"

    note "$be: the GPT example at cp 2 x dp_replicate 2 on 4 ranks (batch 8 each) == one process (batch 16)"
    rm -rf "$WORK/go4"
    # shellcheck disable=SC2086
    PROG="$GPT" tlaunch 4 "$be" --parallelism_config_cp_size 2 --parallelism_config_dp_replicate_size 2 -- $SMALL \
        --batch_size 8 --max_steps 6 --output_dir "$WORK/go4" > "$WORK/g4" 2>&1 || { cat "$WORK/g4"; fail "gpt cp 2 x dp 2 $be"; }
    count 1 'device mesh: dp_replicate 2 x dp_shard 1 x cp 2 x tp 1' "$WORK/g4"
    gpt_lines "$WORK/g4" > "$WORK/g4.l"
    cmp -s "$WORK/g16.l" "$WORK/g4.l" || { diff "$WORK/g16.l" "$WORK/g4.l"; fail "the GPT example at cp 2 x dp 2 differs from one process"; }
    same_st "$WORK/go16/model.safetensors" "$WORK/go4/model.safetensors"

    note "$be: the GPT example with ring attention ($RING) at cp 2, and cp 2 x dp_replicate 2 on 4 ranks == one process"
    rm -rf "$WORK/go2" "$WORK/go4"
    # shellcheck disable=SC2086
    PROG="$GPT" tlaunch 2 "$be" --parallelism_config_cp_size 2 $RING -- $SMALL --batch_size 8 --max_steps 6 --sample_tokens 10 \
        --output_dir "$WORK/go2" > "$WORK/g2" 2>&1 || { cat "$WORK/g2"; fail "gpt cp 2 ring $be"; }
    gpt_lines "$WORK/g2" > "$WORK/g2.l"
    cmp -s "$WORK/g1.l" "$WORK/g2.l" || { diff "$WORK/g1.l" "$WORK/g2.l"; fail "the GPT example at cp 2 (ring) differs from one process"; }
    same_st "$WORK/g1.m/model.safetensors" "$WORK/go2/model.safetensors"
    # shellcheck disable=SC2086
    PROG="$GPT" tlaunch 4 "$be" --parallelism_config_cp_size 2 --parallelism_config_dp_replicate_size 2 $RING -- $SMALL \
        --batch_size 8 --max_steps 6 --output_dir "$WORK/go4" > "$WORK/g4" 2>&1 || { cat "$WORK/g4"; fail "gpt cp 2 x dp 2 ring $be"; }
    gpt_lines "$WORK/g4" > "$WORK/g4.l"
    cmp -s "$WORK/g16.l" "$WORK/g4.l" || { diff "$WORK/g16.l" "$WORK/g4.l"; fail "the GPT example at cp 2 x dp 2 (ring) differs from one process"; }
    same_st "$WORK/go16/model.safetensors" "$WORK/go4/model.safetensors"
done

be=${backends%% *}
note "$be: the GPT example at cp 2 with --gradient_checkpointing (the blocks recompute their split attention in backward) == one process"
# shellcheck disable=SC2086
"$GPT" $SMALL --batch_size 8 --max_steps 3 --gradient_checkpointing > "$WORK/c1" 2>&1 || { cat "$WORK/c1"; fail "checkpointing, 1 rank"; }
# shellcheck disable=SC2086
PROG="$GPT" tlaunch 2 "$be" --parallelism_config_cp_size 2 -- $SMALL --batch_size 8 --max_steps 3 --gradient_checkpointing \
    > "$WORK/c2" 2>&1 || { cat "$WORK/c2"; fail "gpt cp 2 checkpointing"; }
count 1 'gradient checkpointing: 2 blocks recompute' "$WORK/c2"
gpt_lines "$WORK/c1" > "$WORK/c1.l"
gpt_lines "$WORK/c2" > "$WORK/c2.l"
[ "$(grep -c '^step' "$WORK/c1.l")" -ge 4 ] || { cat "$WORK/c1"; fail "no loss lines"; }
cmp -s "$WORK/c1.l" "$WORK/c2.l" || { diff "$WORK/c1.l" "$WORK/c2.l"; fail "checkpointed blocks at cp 2 differ from one process"; }

note "$be: the GPT example at cp 2 x tp 2 on 4 ranks (each rank: 16 tokens, one head, half the vocabulary) == one process"
rm -rf "$WORK/go4"
# shellcheck disable=SC2086
PROG="$GPT" tlaunch 4 "$be" --parallelism_config_cp_size 2 --parallelism_config_tp_size 2 -- $SMALL --batch_size 8 \
    --max_steps 6 --sample_tokens 10 --output_dir "$WORK/go4" > "$WORK/g4" 2>&1 || { cat "$WORK/g4"; fail "gpt cp 2 x tp 2"; }
count 1 'device mesh: dp_replicate 1 x dp_shard 1 x cp 2 x tp 2' "$WORK/g4"
count 4 'gpt: rank [0-3] holds logits \[8, 16, 128\] of vocab 256 at tp 2' "$WORK/g4"
gpt_lines "$WORK/g4" > "$WORK/g4.l"
cmp -s "$WORK/g1.l" "$WORK/g4.l" || { diff "$WORK/g1.l" "$WORK/g4.l"; fail "the GPT example at cp 2 x tp 2 differs from one process"; }
# 1e-4 as test_tp.sh's GPT at tp 2: its vocabulary-parallel loss and tied head sum in another order too
# (1.1e-5 measured)
same_st "$WORK/g1.m/model.safetensors" "$WORK/go4/model.safetensors" 1e-4

note "$be: the mesh names the cp and dp_cp communicators"
PROG="$BUILD/tests/tp_check" tlaunch 4 "$be" --parallelism_config_cp_size 2 --parallelism_config_dp_replicate_size 2 -- \
    --mode mesh > "$WORK/o" || { cat "$WORK/o"; fail "mesh"; }
count 1 'rank=1 coords dp_replicate=0 dp_shard=0 cp=1 tp=0 dp_replicate=0/2 dp_shard=0/1 cp=1/2 tp=0/1 dp=0/2 dp_cp=1/4' "$WORK/o"
count 1 'rank=2 coords dp_replicate=1 dp_shard=0 cp=0 tp=0 dp_replicate=1/2 dp_shard=0/1 cp=0/2 tp=0/1 dp=1/2 dp_cp=2/4' "$WORK/o"
"$CACCEL" env --num_processes 4 --parallelism_config_cp_size 2 --parallelism_config_dp_replicate_size 2 > "$WORK/o" 2>&1 ||
    { cat "$WORK/o"; fail "caccel env"; }
count 1 'Device mesh: dp_replicate 2 x dp_shard 1 x cp 2 x tp 1 .*4 processes' "$WORK/o"
count 1 'gradients averaged over dp_cp' "$WORK/o"

# A Hugging Face decoder (examples/llm_finetune on examples/llama-tiny.json: rotary positions, 4 heads of which
# 2 key/value heads): the labels shifted before the split, the global positions with the ids
gpl=/usr/share/common-licenses/GPL-3
srcdir=${CACCEL_TEST_SRCDIR:-${srcdir:-.}}
if [ -f "$gpl" ]; then
    FT="$BUILD/examples/llm_finetune"
    mkdir "$WORK/base"
    cp "$srcdir/examples/llama-tiny.json" "$WORK/base/config.json" || fail "no examples/llama-tiny.json"
    RUN="--model $WORK/base --from_scratch --block_size 32 --log_interval 1 --seed 7 --eval_blocks 8 --max_steps 4 --lr 2e-3 --data $gpl --sample_tokens 8 --lora_r 0 --batch_size 8"
    llm_lines() { sed -n -e 's/^\(epoch [0-9]* step [0-9/]*: loss [0-9.]*\),.*/\1/p' -e 's/.*held-out loss \([0-9.]*\).*/held-out \1/p' \
        -e '/^sample [0-9]/p' "$1"; }
    note "one process: the decoder fine-tune, batch 8, 4 steps"
    # shellcheck disable=SC2086
    "$FT" --cpu $RUN --output_dir "$WORK/l1" > "$WORK/d1" 2>&1 || { cat "$WORK/d1"; fail "decoder, 1 rank"; }
    llm_lines "$WORK/d1" > "$WORK/d1.l"
    [ "$(grep -c ' step ' "$WORK/d1.l")" -eq 4 ] || { cat "$WORK/d1"; fail "no decoder loss lines"; }
    be0=$be   # (launch sets be: each run starts from the first backend again)
    for mode in cp ring ringmpi tp; do
        be=$be0 lbe=$be0
        case $mode in
            cp) np=2 flags="--parallelism_config_cp_size 2" ;;
            ring) np=2 flags="--parallelism_config_cp_size 2 $RING" ;;
            ringmpi) np=2 flags="--parallelism_config_cp_size 2 $RING"; lbe=${backends##* } ;;
            tp) np=4 flags="--parallelism_config_cp_size 2 --parallelism_config_tp_size 2" ;;
        esac
        [ $mode = ringmpi ] && [ "$lbe" = "$be" ] && continue   # one backend only: done by ring
        note "$lbe: the decoder fine-tune at $flags == one process"
        rm -rf "$WORK/l2"
        # shellcheck disable=SC2086
        PROG="$FT" tlaunch $np "$lbe" $flags -- $RUN --output_dir "$WORK/l2" > "$WORK/d2" 2>&1 || { cat "$WORK/d2"; fail "decoder $flags"; }
        llm_lines "$WORK/d2" > "$WORK/d2.l"
        # the step losses (6 decimals) within 1e-5, the held-out losses (4) within 1e-4, the samples the same
        paste -d ' ' "$WORK/d1.l" "$WORK/d2.l" | awk '
            / step / { d = $6 - $12; if (d < 0) d = -d; if (d > m) m = d; n++; next }
            /^held-out/ { d = $2 - $4; if (d < 0) d = -d; if (d > 1e-4) bad = 1; next }   # printed to 4 decimals
            { h = NF / 2; for (i = 1; i <= h; i++) if ($i != $(i + h)) bad = 1 }
            END { printf "  %d step losses, max |diff| %.3g\n", n, m; exit !(n == 4 && m <= 1e-5 && !bad) }' ||
            { diff "$WORK/d1.l" "$WORK/d2.l"; fail "the decoder at $flags differs from one process"; }
        # lr 2e-3 (test_tp_llm.sh's 5e-3 gives 9.9e-6, at the edge of 1e-5)
        same_st "$WORK/l1/model.safetensors" "$WORK/l2/model.safetensors"
    done
    be=$be0
fi

# refused NP PATTERN FLAGS -- ARGS...: the GPT example fails with a message matching PATTERN
refused() {
    rf_np=$1 rf_pat=$2; shift 2
    if PROG="$GPT" tlaunch "$rf_np" "$be" "$@" > "$WORK/r" 2>&1; then cat "$WORK/r"; fail "accepted: $*"; fi
    grep -q -- "$rf_pat" "$WORK/r" || { cat "$WORK/r"; fail "no message '$rf_pat' for: $*"; }
    echo "  refused: $*"
}
note "$be: refusals"
TINY="--n_layer 1 --n_head 2 --n_embd 32 --max_steps 1 --eval_samples 4"
# shellcheck disable=SC2086
refused 2 'a sequence of 30 tokens does not split into 2 x parallelism_config_cp_size = 4 equal chunks' --parallelism_config_cp_size 2 -- $TINY --block_size 30
# shellcheck disable=SC2086
refused 2 'attention dropout is not supported yet' --parallelism_config_cp_size 2 -- $TINY --dropout 0.1
# shellcheck disable=SC2086
refused 4 'parallelism_config_cp_size 2 (from .*) with parallelism_config.parallelism_config_dp_shard_size (from .*): sharded data parallelism needs distributed_type FSDP' --parallelism_config_cp_size 2 --parallelism_config_dp_shard_size 2 -- $TINY
# shellcheck disable=SC2086
refused 4 'parallelism_config_cp_size 2 (.*) x parallelism_config_tp_size 1 (default) = 2 processes, but the job has 4' --parallelism_config_cp_size 2 -- $TINY

# Context parallelism on the lazy device (--tpu: distributed_type XLA; ACCELERATE_USE_CPU would contradict
# it): the all-gathers of K and V, the reduce-scatters of their gradients and the loss's sums, or the ring's
# sendrecv exchanges, are nodes of the device's graph, run by its executor in graph order on the memory
# behind the device's buffers
(
unset ACCELERATE_USE_CPU
note "one process on the lazy device: the GPT example, batch 8, 6 steps"
# shellcheck disable=SC2086
"$GPT" $SMALL --batch_size 8 --max_steps 6 --sample_tokens 10 --tpu --output_dir "$WORK/z1.m" > "$WORK/z1" 2>&1 || { cat "$WORK/z1"; fail "gpt on xla, 1 rank"; }
count 1 'gpt: 1 process(es) on xla' "$WORK/z1"
gpt_lines "$WORK/z1" > "$WORK/z1.l"
[ "$(grep -c '^step' "$WORK/z1.l")" -ge 8 ] || { cat "$WORK/z1"; fail "no loss lines on xla"; }
for be in $backends; do
    note "$be: the GPT example at cp 2 on the lazy device == one process on it"
    gpt_cp2 "$be" z2 "$WORK/z1" --tpu
    count 1 'gpt: 2 process(es) on xla' "$WORK/z2"

    note "$be: ring attention on the lazy device at cp 2 and cp 4 == one process on it (output, q, k, v gradients), its sendrecv nodes of the graph"
    # shellcheck disable=SC2086
    tlaunch 2 "$be" --parallelism_config_cp_size 2 $RING -- --tpu --ring --central > "$WORK/o" || { cat "$WORK/o"; fail "ring on xla, cp 2 $be"; }
    count 2 "central ok" "$WORK/o"
    count 2 'cp attention ok .* holds q \[2, 4, 8, 8\]' "$WORK/o"
    count 2 "cp bytes 6144 (" "$WORK/o"
    count 2 'cp collectives in the graph 3$' "$WORK/o"   # 3 (cp - 1) sendrecv
    # shellcheck disable=SC2086
    tlaunch 4 "$be" --parallelism_config_cp_size 4 $RING -- --tpu --ring > "$WORK/o" || { cat "$WORK/o"; fail "ring on xla, cp 4 $be"; }
    count 4 'cp attention ok .* holds q \[2, 4, 4, 8\]' "$WORK/o"
    count 4 "cp bytes 9216 (" "$WORK/o"
    count 4 'cp collectives in the graph 9$' "$WORK/o"

    note "$be: the GPT example at cp 2 with ring attention ($RING) on the lazy device == one process on it"
    # shellcheck disable=SC2086
    gpt_cp2 "$be" z3 "$WORK/z1" --tpu $RING
    count 1 'gpt: 2 process(es) on xla' "$WORK/z3"
done
be=${backends%% *}
# shellcheck disable=SC2086
) || exit 1
echo "PASS"
