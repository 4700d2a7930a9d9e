#!/bin/sh
# Context parallelism (parallelism_config_cp_size) on the device mesh, as users run it: the attention of a
# sequence split over the cp ranks in load-balanced causal chunks (ca_maybe_context_parallel; keys and
# values all-gathered over cp, their gradients reduce-scattered back) gives one process's output and
# gradients at cp 2 and cp 4 (grouped-query heads), and central differences of the whole loss; the loss is
# one process's mean when the cp ranks count different numbers of tokens; the GPT example trains at cp 2 and
# at cp 2 x dp_replicate 2 (and cp 2 x tp 2) to one process's losses and parameters on the same global batch,
# under caccel launch (Gloo) and mpirun (MPI); the mesh names the cp and dp_cp communicators; each
# combination that does not work yet is refused with a message naming its key.
# Tolerance: 1e-5 (outputs, gradients, losses, parameters); the split changes only the order of the sums.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
CP="$BUILD/tests/cp_check"
GPT="$BUILD/examples/gpt"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true CACCEL_LOG_LEVEL=info
LAUNCH_FLAGS=""

# tlaunch NP BACKEND FLAGS -- ARGS...: $PROG with the configuration flags to caccel launch (Gloo) or to the
# program (mpirun), so that both spellings are exercised
tlaunch() {
    np=$1 be=$2; shift 2
    flags=""
    while [ "$1" != "--" ]; do flags="$flags $1"; shift; done
    shift
    # shellcheck disable=SC2086
    if [ "$be" = mpi ]; then launch "$np" "$be" "${PROG:-$CP}" "$@" $flags
    else launch "$np" "$be" $flags "${PROG:-$CP}" "$@"; fi
}
train_backends

note "cp 1: ca_maybe_context_parallel leaves the batch whole, the attention and loss are one process's"
"$CP" --central > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "cp 1"; }
count 1 'rank=0 cp attention ok .* holds q \[2, 4, 16, 8\]' "$WORK/o"
count 1 'rank=0 central ok' "$WORK/o"

for be in $backends; do
    note "$be: the split attention at cp 2 and cp 4 == one process (output, q, k, v gradients)"
    tlaunch 2 "$be" --parallelism_config_cp_size 2 -- --central > "$WORK/o" || { cat "$WORK/o"; fail "cp 2 $be"; }
    count 1 'device mesh: dp_replicate 1 x dp_shard 1 x cp 2 x tp 1' "$WORK/o"
    count 2 'cp attention ok .* holds q \[2, 4, 8, 8\]' "$WORK/o"
    count 2 'central ok' "$WORK/o"
    tlaunch 4 "$be" --parallelism_config_cp_size 4 -- > "$WORK/o" || { cat "$WORK/o"; fail "cp 4 $be"; }
    count 4 'cp attention ok .* holds q \[2, 4, 4, 8\]' "$WORK/o"
    note "$be: the loss at cp 2 == one process's mean (the ranks count 11 and 16 labels of a sequence)"
    "$CP" --loss > "$WORK/o1" 2>&1 || { cat "$WORK/o1"; fail "loss, 1 rank"; }
    want=$(sed -n 's/^rank=0 cp loss ok //p' "$WORK/o1")
    tlaunch 2 "$be" --parallelism_config_cp_size 2 -- --loss > "$WORK/o" || { cat "$WORK/o"; fail "loss cp 2 $be"; }
    count 2 "cp loss ok $want" "$WORK/o"
done
