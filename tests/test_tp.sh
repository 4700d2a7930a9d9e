#!/bin/sh
# Tensor parallelism (parallelism_config_tp_size) on the device mesh, as users run it: an MLP whose fc1 is
# split colwise and fc2 rowwise (ca_tp_plan) trains at tp 2 on 2 ranks and at tp 2 x dp_replicate 2 on 4,
# under caccel launch (Gloo) and mpirun (MPI), to the losses and parameters of one process on the same
# global batch; the split layers' gradients (the input's all-reduced over tp) match central differences;
# the mesh lays the ranks out tp innermost; and each combination that does not work yet is refused with a
# message naming its key.
# Tolerance: 1e-5 (losses and parameters after 4 steps); the split changes only the order of the sums.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
TP="$BUILD/tests/tp_check"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true CACCEL_LOG_LEVEL=info
LAUNCH_FLAGS=""   # no --cpu flag: ACCELERATE_USE_CPU (above) chooses the device, and --use_fsdp goes with it

# tlaunch NP BACKEND FLAGS -- ARGS...: $PROG (default tp_check) with the configuration flags to caccel launch
# (Gloo) or to the program (mpirun), so that both spellings are exercised
tlaunch() {
    np=$1 be=$2; shift 2
    flags=""
    while [ "$1" != "--" ]; do flags="$flags $1"; shift; done
    shift
    # shellcheck disable=SC2086
    if [ "$be" = mpi ]; then launch "$np" "$be" "${PROG:-$TP}" "$@" $flags
    else launch "$np" "$be" $flags "${PROG:-$TP}" "$@"; fi
}

# losses FILE: the step lines
losses() { grep '^step=' "$1" | sed 's/.*loss=//'; }
same_losses() {
    paste "$1" "$2" | awk -v want="${NSTEPS:-4}" '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; n++ }
        END { printf "  %d steps, max |diff| %.3g\n", n, m; exit !(n == want && m <= 1e-5) }' ||
        fail "losses differ beyond 1e-5"
}

train_backends

note "one process, global batch 16, 4 steps (the plan does nothing at tp 1)"
"$TP" --plan --steps 4 --batch 16 --dump "$WORK/ref.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "1 rank"; }
losses "$WORK/o" > "$WORK/ref.loss"

for be in $backends; do
    note "$be: tp 2 on 2 ranks == one process"
    tlaunch 2 "$be" --parallelism_config_tp_size 2 -- --plan --steps 4 --batch 16 --dump "$WORK/tp.bin" > "$WORK/o" ||
        { cat "$WORK/o"; fail "tp 2 $be"; }
    count 1 'device mesh: dp_replicate 1 x dp_shard 1 x cp 1 x tp 2' "$WORK/o"
    count 2 'params=108 steps=4' "$WORK/o"   # each rank: half of fc1 (64 + 8) and of fc2.weight (32), fc2.bias whole (4)
    losses "$WORK/o" > "$WORK/tp.loss"
    same_losses "$WORK/ref.loss" "$WORK/tp.loss"
    same "$WORK/ref.bin" "$WORK/tp.bin"

    note "$be: tp 2 x dp_replicate 2 on 4 ranks == one process"
    tlaunch 4 "$be" --parallelism_config_tp_size 2 --parallelism_config_dp_replicate_size 2 -- \
        --plan --steps 4 --batch 8 --dump "$WORK/tp4.bin" > "$WORK/o" || { cat "$WORK/o"; fail "tp 2 x dp 2 $be"; }
    count 1 'device mesh: dp_replicate 2 x dp_shard 1 x cp 1 x tp 2' "$WORK/o"
    losses "$WORK/o" > "$WORK/tp4.loss"
    same_losses "$WORK/ref.loss" "$WORK/tp4.loss"
    same "$WORK/ref.bin" "$WORK/tp4.bin"
done

# The ranks of a tp group read the same batch: gather_for_metrics and the throughput line's world
# figures count it once (8 samples a data-parallel rank, 16 gathered; the world's samples/s is the
# ranks' sum over tp 2, not the sum: each rank's rate is its own timing, the relation is exact up to
# the f32 all-reduce).
be=${backends%% *}
note "$be: gather_for_metrics and the world's samples/s at tp 2 x dp_replicate 2"
tlaunch 4 "$be" --parallelism_config_tp_size 2 --parallelism_config_dp_replicate_size 2 -- \
    --plan --steps 3 --batch 8 --metrics > "$WORK/o" || { cat "$WORK/o"; fail "metrics $be"; }
count 12 'gathered=16$' "$WORK/o"
count 4 'world_samples_per_s=' "$WORK/o"
sed -n 's/.*samples_per_s=\([0-9.e+]*\) world_samples_per_s=\([0-9.e+]*\)$/\1 \2/p' "$WORK/o" |
    awk '{ sum += $1; w[NR] = $2 } END {
        for (i = 1; i <= NR; i++) { d = w[i] - sum / 2; if (d < 0) d = -d; if (d > 1e-4 * sum) { print "world", w[i], "ranks sum", sum; exit 1 } }
        exit NR != 4 }' || { cat "$WORK/o"; fail "the world's samples/s is not the ranks' sum over tp 2"; }

# The profiler's collective slices carry the communicator's name (ca_comm_set_name: the mesh's "tp"), so
# that a trace's bytes can be summed per mesh dimension (bench/run_tp.sh does).
note "$be: the trace's collectives name the tp communicator"
tlaunch 2 "$be" --parallelism_config_tp_size 2 --profile --output_trace_dir "$WORK/trace" -- --plan --steps 2 --batch 16 \
    > "$WORK/o" || { cat "$WORK/o"; fail "profiled tp 2 $be"; }
for r in 0 1; do
    grep -q '"name":"tp","rank":'$r',"world":2,"dtype":"f32"' "$WORK/trace/trace_rank$r.json" ||
        fail "rank $r's trace names no collective of the tp communicator"
done

# Under mpirun rank 0 serves the rendezvous store, which also holds the records of the tp group of
# ranks 2 and 3: that group's collective after rank 0 is done must still complete.
if echo "$backends" | grep -q mpi; then
    note "mpi: a tp group without rank 0 runs a collective after rank 0 has finished"
    tlaunch 4 mpi --parallelism_config_tp_size 2 --parallelism_config_dp_replicate_size 2 -- \
        --plan --steps 1 --batch 8 --late-tp > "$WORK/o" || { cat "$WORK/o"; fail "late tp collective"; }
    count 2 'late tp collective done: 2' "$WORK/o"
fi

for be in $backends; do
    note "$be: a GPT-2 block (fused q, k, v colwise, 2 heads) at tp 2 == one process, 6 steps"
    "$TP" --block --plan --steps 6 --batch 16 > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "block, 1 rank"; }
    losses "$WORK/o" > "$WORK/b1.loss"
    tlaunch 2 "$be" --parallelism_config_tp_size 2 -- --block --plan --steps 6 --batch 16 > "$WORK/o" ||
        { cat "$WORK/o"; fail "block tp 2 $be"; }
    losses "$WORK/o" > "$WORK/b2.loss"
    NSTEPS=6 same_losses "$WORK/b1.loss" "$WORK/b2.loss"
done

be=${backends%% *}
be=$(echo "$be" | tr -d ' ')
note "$be: clip_grad_norm at tp 2: the norm of the whole model on every rank, training as one process"
"$TP" --plan --clip --steps 4 --batch 16 --dump "$WORK/c1.bin" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "clip, 1 rank"; }
grep 'rank=0 step=.* norm=' "$WORK/o" | sed 's/.*norm=//' > "$WORK/c1.norm"
tlaunch 2 "$be" --parallelism_config_tp_size 2 -- --plan --clip --steps 4 --batch 16 --dump "$WORK/c2.bin" > "$WORK/o" ||
    { cat "$WORK/o"; fail "clip tp 2"; }
for r in 0 1; do
    grep "rank=$r step=.* norm=" "$WORK/o" | sed 's/.*norm=//' > "$WORK/c2.norm"
    same_losses "$WORK/c1.norm" "$WORK/c2.norm"
done
same "$WORK/c1.bin" "$WORK/c2.bin"
note "$be: the split layers' gradients against central differences at tp 2"
tlaunch 2 "$be" --parallelism_config_tp_size 2 -- --plan --mode gradcheck > "$WORK/o" || { cat "$WORK/o"; fail "gradcheck"; }
count 2 'gradcheck ok' "$WORK/o"

note "$be: the mesh at 4 ranks, tp innermost"
tlaunch 4 "$be" --parallelism_config_tp_size 2 --parallelism_config_dp_replicate_size 2 -- --mode mesh > "$WORK/o" ||
    { cat "$WORK/o"; fail "mesh"; }
count 1 'rank=0 coords dp_replicate=0 dp_shard=0 cp=0 tp=0 dp_replicate=0/2 dp_shard=0/1 cp=0/1 tp=0/2 dp=0/2' "$WORK/o"
count 1 'rank=1 coords dp_replicate=0 dp_shard=0 cp=0 tp=1 dp_replicate=0/2 dp_shard=0/1 cp=0/1 tp=1/2 dp=0/2' "$WORK/o"
count 1 'rank=2 coords dp_replicate=1 dp_shard=0 cp=0 tp=0 dp_replicate=1/2 dp_shard=0/1 cp=0/1 tp=0/2 dp=1/2' "$WORK/o"
count 1 'rank=3 coords dp_replicate=1 dp_shard=0 cp=0 tp=1 dp_replicate=1/2 dp_shard=0/1 cp=0/1 tp=1/2 dp=1/2' "$WORK/o"

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
note "$be: the GPT example unchanged at tp 2 (c_attn fused colwise, the MLP, clipping at 1.0) == one process"
GPT="$BUILD/examples/gpt"
SMALL="--n_layer 2 --n_head 2 --n_embd 64 --block_size 32 --lr 3e-3 --log_interval 2 --eval_interval 4 --eval_samples 16"
# shellcheck disable=SC2086
"$GPT" $SMALL --batch_size 8 --max_steps 6 --sample_tokens 10 --dropout 0 > "$WORK/g1" 2>&1 || { cat "$WORK/g1"; fail "gpt, 1 rank"; }
# shellcheck disable=SC2086
PROG="$GPT" tlaunch 2 "$be" --parallelism_config_tp_size 2 -- $SMALL --batch_size 8 --max_steps 6 --sample_tokens 10 --dropout 0 \
    > "$WORK/g2" 2>&1 || { cat "$WORK/g2"; fail "gpt tp 2"; }
gpt_lines() { sed -n -e 's/^\(step [0-9]*\/[0-9]*: loss [0-9.]*\),.*/\1/p' -e '/^step [0-9]*: validation loss/p' -e '/^sample/,/^-- end of sample/p' "$1"; }
gpt_lines "$WORK/g1" > "$WORK/g1.l"
gpt_lines "$WORK/g2" > "$WORK/g2.l"
[ "$(grep -c '^step' "$WORK/g1.l")" -ge 5 ] || { cat "$WORK/g1"; fail "no loss lines"; }
cmp -s "$WORK/g1.l" "$WORK/g2.l" || { diff "$WORK/g1.l" "$WORK/g2.l"; fail "the GPT example at tp 2 differs from one process"; }
echo "  $(grep -c . "$WORK/g1.l") loss, validation and sample lines the same"
# shellcheck disable=SC2086
if PROG="$GPT" tlaunch 2 "$be" --parallelism_config_tp_size 2 -- --n_layer 1 --n_head 3 --n_embd 48 --max_steps 1 > "$WORK/r" 2>&1; then
    cat "$WORK/r"; fail "3 heads at tp 2 accepted"; fi
grep -q 'gpt: --n_head 3 is not a multiple of parallelism_config_tp_size 2' "$WORK/r" || { cat "$WORK/r"; fail "no heads message"; }

note "$be: refusals"
refused 2 --parallelism_config_tp_size 2 -- --steps 1 -- 'parallelism_config_tp_size 2 (from .*) needs a tensor-parallel plan on the model'
refused 4 --parallelism_config_tp_size 2 -- --plan --steps 1 -- 'parallelism_config_tp_size 2 (.*) = 2 processes, but the job has 4'
refused 4 --parallelism_config_tp_size 2 --parallelism_config_dp_shard_size 2 -- --plan --steps 1 -- 'with parallelism_config.parallelism_config_dp_shard_size (from .*): sharded data parallelism over the other ranks is not supported yet'
refused 2 --parallelism_config_tp_size 2 --use_fsdp -- --plan --steps 1 -- 'with distributed_type (from .*): composition with ZeRO / FSDP is not supported yet'
refused 2 --parallelism_config_tp_size 2 -- --plan --steps 1 --save-state $WORK/ck -- 'save_state: not supported yet with tensor parallelism'
refused 2 --parallelism_config_tp_size 2 -- --plan --bad-plan --steps 1 -- '"act" is a Tanh; caccel splits Linear layers only'
refused 2 --parallelism_config_cp_size 2 -- --plan --steps 1 -- 'parallelism_config_cp_size = 2 asks for context parallelism: not supported yet'
refused 3 --parallelism_config_tp_size 3 -- --plan --steps 1 -- 'colwise Linear "fc1" has 16 output features, which parallelism_config_tp_size 3 does not divide'
echo "PASS"
