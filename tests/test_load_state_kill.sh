#!/bin/sh
# A peer killed (kill -9) during ca_load_state's rank-0 broadcast (DDP, AdamW, 2 processes), once it
# says it is held before rank 0's 2nd parameter broadcast (CACCEL_TEST_BCAST_STALL):
# - Gloo (ranks started without a launcher, so that rank 0 outlives its peer): rank 0's load fails
#   naming rank 1 and saying its state is restored; the process then goes on alone in the same program
#   (ddp_check --solo: the job's accelerator destroyed, a single-process one created, the restored
#   parameters trained 4 more steps and saved with ca_save_model), and its parameters equal those of
#   a job that never tried the load and went on alone the same way, bit for bit.
# - MPI (mpirun ends the job when a rank dies): every process of the job ends within mpirun's bound
#   (MPI_TIMEOUT, not reached), mpirun's status is not 0, and its report (or rank 0's error) names the
#   dead rank.
# Either way the checkpoint is not damaged: it loads on 2 processes afterwards, giving the state of
# the run that saved it.
. "$(dirname "$0")/dist/lib.sh"
. "$(dirname "$0")/bcast_stall.sh"
ARGS="--hidden 64 --adamw"
field() { sed -n "s/^rank=$1 $2=\([0-9a-f]*\).*/\1/p" "$3"; }   # field RANK NAME FILE
job() {   # job ARGS...: ddp_check on 2 ranks over Gloo, output in $WORK/o
    timeout 300 "$CACCEL" launch --num_processes 2 --cpu --backend gloo "$DDP" $ARGS "$@" > "$WORK/o" 2>&1 ||
        { cat "$WORK/o"; fail "ddp_check $*"; }
}
# intact: the checkpoint loads on 2 processes and gives the state saved (the 2-step run's)
intact() {
    job --steps 0 --load-state "$WORK/ck" --state-digest
    [ "$(field 0 state_fnv "$WORK/o")" = "$(field 0 state_fnv "$WORK/ref2")" ] ||
        { cat "$WORK/o"; fail "$1: the checkpoint does not load as saved after the kill"; }
    echo "$1: the checkpoint loads as saved"
}

note "the checkpoint of step 2; the state of step 2; a job of 3 steps that goes on alone for 4"
job --steps 2 --save-state "$WORK/ck"
job --steps 2 --state-digest
cp "$WORK/o" "$WORK/ref2"
job --steps 3 --solo 4
ref=$(field 0 solo_fnv "$WORK/o")
[ -n "$ref" ] && [ "$ref" = "$(field 1 solo_fnv "$WORK/o")" ] || { cat "$WORK/o"; fail "no solo digest"; }

note "gloo: rank 1 killed in the broadcast; rank 0 restored, then trains and saves alone"
mkdir -p "$WORK/solo"
stall_pair gloo kill "^rank=0 solo_fnv=" $ARGS --steps 3 --try-load-state "$WORK/ck" --solo 4 --save-model "$WORK/solo"
[ "$rc" = 0 ] || fail "gloo: rank 0 ended with status $rc after going on alone"
grep "^rank=0 load_state=CA_ERR" "$WORK/r0" | grep "rank 1" |
    grep -q "rank 0's training state is as it was before the load (restored)" ||
    fail "gloo: rank 0's error does not name rank 1 and say restored"
grep -q "^rank=0 solo: 1 process(es) now" "$WORK/r0" || fail "gloo: rank 0 did not go on as one process"
[ "$(field 0 solo_fnv "$WORK/r0")" = "$ref" ] ||
    fail "gloo: rank 0 went on alone to other parameters than the job that never tried the load"
[ -s "$WORK/solo/model.safetensors" ] || fail "gloo: the process alone saved no model"
echo "gloo: rank 0 went on alone from the restored state, bit for bit as the job that never loaded"
intact gloo

if [ $has_mpi = yes ]; then
    note "mpi: rank 1 killed (kill -9) in the broadcast: mpirun ends every rank, naming it"
    CACCEL_TEST_BCAST_STALL=2 MPI_TIMEOUT=120 run_mpi 2 -x CACCEL_TEST_BCAST_STALL "$DDP" $ARGS --steps 3 \
        --try-load-state "$WORK/ck" --cpu --backend mpi > "$WORK/m" 2>&1 &
    mp=$!
    wait_lines 1 "rank 1 stalled before parameter broadcast 2" "mpi kill" "$mp" "$WORK/m"
    victim=$(sed -n 's/.*rank 1 stalled before parameter broadcast 2 (CACCEL_TEST_BCAST_STALL, pid \([0-9]*\)).*/\1/p' "$WORK/m")
    [ -n "$victim" ] || { cat "$WORK/m"; fail "mpi: rank 1 did not say its pid"; }
    kill -9 "$victim"
    wait "$mp"
    mrc=$?
    cat "$WORK/m"
    # timeout's status is 124 (137 after its -k: then without mpirun's report); mpirun's own is not 0
    [ "$mrc" != 124 ] || fail "mpi: the job did not end within mpirun's bound"
    [ "$mrc" != 0 ] || fail "mpi: mpirun reported success after a rank was killed"
    grep -q "process rank 1 with PID .* exited on signal 9\|^rank=0 load_state=CA_ERR.*rank 1" "$WORK/m" ||
        fail "mpi: neither mpirun nor rank 0 named the killed rank 1 (status $mrc)"
    TAG="$WORK/ck" no_orphans   # every rank of the job (their command lines name the checkpoint) ended
    echo "mpi: the job ended (status $mrc), naming the killed rank"
    intact mpi
fi
echo PASS
