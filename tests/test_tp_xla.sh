#!/bin/sh
# Tensor parallelism (parallelism_config_tp_size) on the lazy device (--tpu: distributed_type XLA), as users
# run it: the split layers' all-reduces, all-gathers and reduce-scatters are nodes of each rank's graph.
# The GPT example (c_attn fused colwise, the MLP, wte and the tied head vocabulary-parallel, clipping at 1.0)
# at tp 2 and at tp 2 x dp_replicate 2 on 4 ranks gives one process's losses, validation losses, sample and
# saved parameters on the lazy device on the same global batch, under caccel launch (Gloo) and mpirun
# (MPI), --sequence_parallel and cp 2 x tp 2 too; its step runs as many graphs as a dp 2 step (the vocabulary-parallel
# embedding's and loss's masks are made by the graph, no read of the ids or labels cuts it); a Llama-family
# decoder (examples/llm_finetune, examples/llama-tiny.json) at tp 2 gives one process's, with LoRA adapters
# too (losses and PEFT's adapter file); tp_check's MLP at
# tp 2 with clip_grad_norm gives one process's norms and parameters; a checkpoint saved at tp 2 on the lazy
# device resumes at one process to the uninterrupted run; the vocabulary-parallel layers' gradients match
# central differences, and a label outside the vocabulary fails the graph naming it; a stopped tp peer fails
# the graph's collective naming the tp group and the peer; sharded data parallelism beside tp is refused
# naming its key; the throughput line sums the ranks' rates.
# Tolerance: 1e-5 (losses, norms, parameters; 1e-4 for the GPT's after 6 AdamW steps, as tests/test_tp.sh):
# the split changes only the order of the sums.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
TP="$BUILD/tests/tp_check"
GPT="$BUILD/examples/gpt"
FT="$BUILD/examples/llm_finetune"
srcdir=${CACCEL_TEST_SRCDIR:-${srcdir:-.}}
unset ACCELERATE_USE_CPU   # it would contradict --tpu
export OPENBLAS_NUM_THREADS=1 CACCEL_LOG_LEVEL=info
# shellcheck disable=SC2034
LAUNCH_FLAGS=""   # read by launch: --tpu (on every program's command line) chooses the device
train_backends
first=${backends%% *}

# tlaunch NP BACKEND FLAGS -- ARGS...: $PROG (default tp_check) through mesh_launch (dist/lib.sh)
tlaunch() { tl_np=$1 tl_be=$2; shift 2; mesh_launch "$tl_np" "$tl_be" "${PROG:-$TP}" "$@"; }
# losses FILE: the step lines
losses() { grep '^step=' "$1" | sed 's/.*loss=//'; }
same_losses() {
    paste "$1" "$2" | awk -v want="${NSTEPS:-4}" '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; n++ }
        END { printf "  %d values, max |diff| %.3g\n", n, m; exit !(n == want && m <= 1e-5) }' ||
        fail "$2: values differ beyond 1e-5"
}
gpt_lines() { sed -n -e 's/^\(step [0-9]*\/[0-9]*: loss [0-9.]*\),.*/\1/p' -e '/^step [0-9]*: validation loss/p' -e '/^sample/,/^-- end of sample/p' "$1"; }

SMALL="--n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --lr 3e-3 --log_interval 2 --eval_interval 4 --eval_samples 16 --dropout 0 --tpu"
note "one process on the lazy device: the GPT example, batch 8 and 16, 6 steps"
for b in 8 16; do
    # shellcheck disable=SC2086
    "$GPT" $SMALL --batch_size $b --max_steps 6 --sample_tokens 10 --output_dir "$WORK/z$b.m" > "$WORK/z$b" 2>&1 ||
        { cat "$WORK/z$b"; fail "gpt on xla, batch $b, 1 rank"; }
    count 1 'gpt: 1 process(es) on xla' "$WORK/z$b"
    gpt_lines "$WORK/z$b" > "$WORK/z$b.l"
    [ "$(grep -c '^step' "$WORK/z$b.l")" -ge 5 ] || { cat "$WORK/z$b"; fail "no loss lines on xla"; }
done
# gpt_tp BACKEND NP NAME REF FLAGS -- ARGS...: the GPT example on NP ranks with the mesh FLAGS, its loss,
# validation and sample lines REF's (one process's), its model one process's (REF.m) to 1e-4
gpt_tp() {
    gb=$1 gnp=$2 gn=$3 gref=$4; shift 4
    rm -rf "$WORK/$gn.m"
    gflags=""
    while [ "$1" != "--" ]; do gflags="$gflags $1"; shift; done
    shift
    # shellcheck disable=SC2086
    PROG="$GPT" tlaunch "$gnp" "$gb" $gflags -- $SMALL --max_steps 6 --sample_tokens 10 "$@" \
        --output_dir "$WORK/$gn.m" > "$WORK/$gn" 2>&1 || { cat "$WORK/$gn"; fail "gpt$gflags $* ($gb)"; }
    count 1 "gpt: $gnp process(es) on xla" "$WORK/$gn"
    count "$gnp" 'gpt: rank [0-3] holds logits \[8, [0-9]*, 128\] of vocab 256 at tp 2' "$WORK/$gn"   # the vocabulary-parallel head
    # the throughput line's sum over the ranks (a collective of host numbers, through device memory here)
    grep -q "^throughput: step .*; all $gnp processes: " "$WORK/$gn" || { cat "$WORK/$gn"; fail "no throughput line of all ranks"; }
    gpt_lines "$WORK/$gn" > "$WORK/$gn.l"
    cmp -s "$gref.l" "$WORK/$gn.l" || { diff "$gref.l" "$WORK/$gn.l"; fail "the GPT example$gflags $* on xla differs ($gb)"; }
    echo "  $(grep -c . "$gref.l") loss, validation and sample lines the same"
    same_st "$gref.m/model.safetensors" "$WORK/$gn.m/model.safetensors" 1e-4
}
for be in $backends; do
    note "$be: the GPT example at tp 2 on the lazy device == one process on it"
    gpt_tp "$be" 2 t2 "$WORK/z8" --parallelism_config_tp_size 2 -- --batch_size 8
    count 1 'device mesh: dp_replicate 1 x dp_shard 1 x cp 1 x tp 2' "$WORK/t2"
    note "$be: the GPT example at tp 2 x dp_replicate 2 on 4 ranks (batch 8 each) on the lazy device == one process (batch 16)"
    gpt_tp "$be" 4 t4 "$WORK/z16" --parallelism_config_tp_size 2 --parallelism_config_dp_replicate_size 2 -- --batch_size 8
    count 1 'device mesh: dp_replicate 2 x dp_shard 1 x cp 1 x tp 2' "$WORK/t4"
done
note "$first: the GPT example with --sequence_parallel at tp 2 on the lazy device == one process"
gpt_tp "$first" 2 ts "$WORK/z8" --parallelism_config_tp_size 2 -- --batch_size 8 --sequence_parallel
note "$first: the GPT example at cp 2 x tp 2 on 4 ranks on the lazy device == one process"
gpt_tp "$first" 4 tc "$WORK/z8" --parallelism_config_tp_size 2 --parallelism_config_cp_size 2 -- --batch_size 8
count 1 'device mesh: dp_replicate 1 x dp_shard 1 x cp 2 x tp 2' "$WORK/tc"

# graphs BACKEND STEPS FLAGS: the graphs rank 0 ran in a GPT run of STEPS steps at FLAGS (2 ranks, no
# evaluation, no sample); the difference of two step counts is what the added steps ran
graphs() {
    gb=$1 gs=$2; shift 2
    # shellcheck disable=SC2086
    CACCEL_XLA_METRICS=1 PROG="$GPT" tlaunch 2 "$gb" "$@" -- $SMALL --batch_size 8 --max_steps "$gs" --eval_interval 0 \
        --eval_samples 8 --sample_tokens 0 > "$WORK/gr" 2>&1 || { cat "$WORK/gr"; fail "gpt $* for the graph count"; }
    n=$(sed -n 's/^  graphs: //p' "$WORK/gr" | sort -n | tail -1)
    [ -n "$n" ] || { cat "$WORK/gr"; fail "no xla metrics"; }
    echo "$n"
}
note "$first: 6 more steps at tp 2 run as many graphs as 6 more at dp 2 (nothing read back inside a step)"
tp6=$(graphs "$first" 6 --parallelism_config_tp_size 2) || { echo "$tp6"; exit 1; }
tp12=$(graphs "$first" 12 --parallelism_config_tp_size 2) || { echo "$tp12"; exit 1; }
dp6=$(graphs "$first" 6) || { echo "$dp6"; exit 1; }
dp12=$(graphs "$first" 12) || { echo "$dp12"; exit 1; }
echo "  tp 2: $tp6 -> $tp12 graphs, dp 2: $dp6 -> $dp12"
[ $((tp12 - tp6)) -eq $((dp12 - dp6)) ] || fail "6 steps at tp 2 ran $((tp12 - tp6)) graphs, at dp 2 $((dp12 - dp6))"

gpl=/usr/share/common-licenses/GPL-3
if [ -f "$gpl" ]; then
    note "$first: a Llama-family decoder (examples/llm_finetune) at tp 2 on the lazy device == one process on it"
    mkdir "$WORK/base"
    cp "$srcdir/examples/llama-tiny.json" "$WORK/base/config.json" || fail "no examples/llama-tiny.json"
    RUN="--model $WORK/base --from_scratch --block_size 32 --log_interval 1 --seed 7 --eval_blocks 8 --max_steps 4 --lr 5e-3
         --data $gpl --sample_tokens 8 --batch_size 16 --tpu"
    llm_lines() { sed -n -e 's/^\(epoch [0-9]* step [0-9/]*: loss [0-9.]*\),.*/\1/p' -e 's/^\(epoch [0-9]*: .*held-out loss [0-9.]*\).*/\1/p' \
        -e '/^sample [0-9]/p' "$1"; }
    # shellcheck disable=SC2086
    "$FT" $RUN --lora_r 0 --output_dir "$WORK/l1" > "$WORK/l1.o" 2>&1 || { cat "$WORK/l1.o"; fail "decoder on xla, 1 process"; }
    # shellcheck disable=SC2086
    PROG="$FT" tlaunch 2 "$first" --parallelism_config_tp_size 2 -- $RUN --lora_r 0 --output_dir "$WORK/l2" > "$WORK/l2.o" 2>&1 ||
        { cat "$WORK/l2.o"; fail "decoder at tp 2 on xla"; }
    count 2 'llm_finetune: rank [01] holds 70080 parameters (its tensor-parallel slices)' "$WORK/l2.o"
    llm_lines "$WORK/l1.o" > "$WORK/l1.l"
    llm_lines "$WORK/l2.o" > "$WORK/l2.l"
    [ "$(grep -c ' step ' "$WORK/l1.l")" -ge 4 ] || { cat "$WORK/l1.o"; fail "no decoder loss lines"; }
    cmp -s "$WORK/l1.l" "$WORK/l2.l" || { diff "$WORK/l1.l" "$WORK/l2.l"; fail "the decoder at tp 2 on xla differs"; }
    echo "  $(grep -c . "$WORK/l1.l") loss, held-out and sample lines the same"
    same_st "$WORK/l1/model.safetensors" "$WORK/l2/model.safetensors" 1e-5
    note "$first: LoRA adapters on its colwise and rowwise layers at tp 2 on the lazy device == one process on it"
    LORA="--lora_r 4 --lora_dropout 0 --target_modules q_proj,v_proj,o_proj,gate_proj,down_proj"
    # shellcheck disable=SC2086
    "$FT" $RUN $LORA --output_dir "$WORK/a1" > "$WORK/a1.o" 2>&1 || { cat "$WORK/a1.o"; fail "LoRA on xla, 1 process"; }
    # shellcheck disable=SC2086
    PROG="$FT" tlaunch 2 "$first" --parallelism_config_tp_size 2 -- $RUN $LORA --output_dir "$WORK/a2" > "$WORK/a2.o" 2>&1 ||
        { cat "$WORK/a2.o"; fail "LoRA at tp 2 on xla"; }
    llm_lines "$WORK/a1.o" > "$WORK/a1.l"
    llm_lines "$WORK/a2.o" > "$WORK/a2.l"
    cmp -s "$WORK/a1.l" "$WORK/a2.l" || { diff "$WORK/a1.l" "$WORK/a2.l"; fail "LoRA at tp 2 on xla differs"; }
    same_st "$WORK/a1/adapter_model.safetensors" "$WORK/a2/adapter_model.safetensors" 1e-5   # PEFT's file, gathered whole
else
    echo "  (no $gpl: the decoder case is left out)"
fi

note "$first: tp_check's MLP with clip_grad_norm at tp 2 on the lazy device == one process on it"
"$TP" --plan --clip --steps 4 --batch 16 --dump "$WORK/c1.bin" --tpu > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "clip, 1 rank"; }
grep 'rank=0 step=.* norm=' "$WORK/o" | sed 's/.*norm=//' > "$WORK/c1.norm"
losses "$WORK/o" > "$WORK/ref.loss"
tlaunch 2 "$first" --parallelism_config_tp_size 2 -- --plan --clip --steps 4 --batch 16 --dump "$WORK/c2.bin" --tpu > "$WORK/o" ||
    { cat "$WORK/o"; fail "clip tp 2"; }
count 2 'params=108 steps=4' "$WORK/o"
for r in 0 1; do
    grep "rank=$r step=.* norm=" "$WORK/o" | sed 's/.*norm=//' > "$WORK/c2.norm"
    same_losses "$WORK/c1.norm" "$WORK/c2.norm"
done
losses "$WORK/o" > "$WORK/c2.loss"
same_losses "$WORK/ref.loss" "$WORK/c2.loss"
same "$WORK/c1.bin" "$WORK/c2.bin"

note "$first: a checkpoint saved at tp 2 on the lazy device after 2 steps resumes at one process for 2 more == 4 steps"
"$TP" --plan --steps 4 --batch 16 --dump "$WORK/ref.bin" --tpu > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "4 steps, 1 rank"; }
losses "$WORK/o" | tail -n 2 > "$WORK/ref2.loss"
mkdir -p "$WORK/m1" "$WORK/m2"
tlaunch 2 "$first" --parallelism_config_tp_size 2 -- --plan --steps 2 --batch 16 --save-state "$WORK/ck2" --save-model "$WORK/m2" \
    --tpu > "$WORK/o" || { cat "$WORK/o"; fail "save at tp 2 on xla"; }
count 2 'params=108 steps=2' "$WORK/o"   # each rank's slices again after the saves
"$TP" --plan --steps 2 --batch 16 --load-state "$WORK/ck2" --dump "$WORK/r1.bin" --tpu > "$WORK/o" 2>&1 ||
    { cat "$WORK/o"; fail "resume at 1 rank"; }
count 1 '^step=2 ' "$WORK/o"
losses "$WORK/o" > "$WORK/r1.loss"
NSTEPS=2 same_losses "$WORK/ref2.loss" "$WORK/r1.loss"
same "$WORK/ref.bin" "$WORK/r1.bin"
"$TP" --plan --steps 0 --batch 16 --load-state "$WORK/ck2" --tpu --save-model "$WORK/m1" > "$WORK/o" 2>&1 ||
    { cat "$WORK/o"; fail "load at 1 rank"; }
same_st "$WORK/m2/model.safetensors" "$WORK/m1/model.safetensors"   # save_model at tp 2 wrote one process's file

note "$first: the vocabulary-parallel embedding, tied and colwise heads and cross-entropy at tp 2 on the lazy device"
"$TP" --mode vocab --tpu > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "vocab, 1 rank"; }
sed -n 's/.*vocab loss=\([0-9.]*\).*/\1/p' "$WORK/o" > "$WORK/v1.loss"
tlaunch 2 "$first" --parallelism_config_tp_size 2 -- --mode vocab --tpu > "$WORK/o" || { cat "$WORK/o"; fail "vocab tp 2"; }
count 2 'vocab loss=.* logits=2x3x4$' "$WORK/o"
count 2 'vocab gradcheck ok 32$' "$WORK/o"
# the graph's gather from the vocabulary's table fails on the label 9 (of a vocabulary of 8), at its position
count 2 'refused: xla: running node [0-9]* (gather) of a graph of [0-9]* nodes: cpu kernel gather: index 9 at position 2 is outside \[0, 8)' "$WORK/o"
for r in 0 1; do
    sed -n "s/^rank=$r vocab loss=\([0-9.]*\).*/\1/p" "$WORK/o" > "$WORK/v2.loss"
    NSTEPS=1 same_losses "$WORK/v1.loss" "$WORK/v2.loss"
done

if have gloo; then
    note "gloo: a stopped tp peer (rank 1, timeout 5 s) fails rank 0's graph, naming the tp group and the peer"
    tlaunch 2 gloo --parallelism_config_tp_size 2 -- --plan --steps 100000 --batch 16 --timeout 5 --stop-rank 1 --tpu \
        > "$WORK/o" && fail "a run with a stopped tp peer succeeded"
    count 1 'rank=1 stops' "$WORK/o"
    grep -q 'xla: running node [0-9]* (host_fn) of a graph of [0-9]* nodes: (in the tp group of ranks 0, 1 split from ' "$WORK/o" ||
        { cat "$WORK/o"; fail "no error names the tp group"; }
    grep -q 'rank 1 is stopped (pid' "$WORK/o" || { cat "$WORK/o"; fail "no error names rank 1 as stopped"; }
fi

note "$first: refusals on the lazy device"
# shellcheck disable=SC2086
if PROG="$GPT" tlaunch 4 "$first" --parallelism_config_tp_size 2 --parallelism_config_dp_shard_size 2 -- $SMALL --max_steps 1 > "$WORK/r" 2>&1; then
    cat "$WORK/r"; fail "tp 2 x dp_shard 2 on xla accepted"; fi
grep -q 'parallelism_config_tp_size 2 (from .*) with parallelism_config.parallelism_config_dp_shard_size (from .*): sharded data parallelism (ZeRO / FSDP) does not run on the lazy device yet' "$WORK/r" ||
    { cat "$WORK/r"; fail "no dp_shard message"; }
echo "PASS"
