#!/bin/sh
# ca_load_state where rank 0 reads the model (and, under DDP, the optimizer state) and broadcasts it
# (2 processes, fsdp_cpu_ram_efficient_loading true: the default), under DDP and ZeRO stage 2, over
# Gloo and MPI: a load that fails part-way leaves every rank still running with the training state it
# held before, bit for bit, and an error naming the peer or the file.
# - rank 1 killed (kill -9; Gloo) or stopped (SIGSTOP; Gloo and MPI, the communicator's deadline
#   CACCEL_TIMEOUT=10 then passes) before rank 0's 2nd parameter broadcast, once it says so
#   (CACCEL_TEST_BCAST_STALL): rank 0 had applied the checkpoint, every rank its scalars, generator and
#   loaders; rank 0's state digest (parameters, optimizer state tensors under DDP, step count, learning
#   rate, loss scaler, generator) after the failed load equals the one before it and a run's that never
#   loaded, and so does its next batch (the data position); its error names rank 1 and says restored.
#   (tests/bcast_stall.sh: under mpirun a rank's death ends the job, so MPI is checked with a stopped
#   peer only.)
# - rank 0's optimizer file corrupt: every rank refuses (rank 0 naming the file, rank 1 rank 0 or the
#   file), keeps its state, and the two train on to the parameters of a run that never loaded.
. "$(dirname "$0")/dist/lib.sh"
. "$(dirname "$0")/bcast_stall.sh"
ARGS="--hidden 64 --adamw"
field() { sed -n "s/^rank=$1 $2=\([0-9a-f]*\).*/\1/p" "$3"; }   # field RANK NAME FILE: every such value


# job BACKEND ARGS...: ddp_check on 2 ranks, output in $WORK/o
job() {
    be=$1; shift
    if [ "$be" = mpi ]; then run_mpi 2 "$DDP" $ARGS "$@" --cpu --backend mpi > "$WORK/o" 2>&1
    else timeout 300 "$CACCEL" launch --num_processes 2 --cpu --backend gloo "$DDP" $ARGS "$@" > "$WORK/o" 2>&1; fi ||
        { cat "$WORK/o"; fail "$be: ddp_check $*"; }
}

# restored BACKEND HOW: rank 0's load failed naming rank 1, its state and data position as before
restored() {
    stall_pair "$1" "$2" "^rank=0 next_batch=" $ARGS --steps 3 --try-load-state "$WORK/ck"
    what="$1, $2, $cfg"
    [ "$1" = mpi ] || [ $rc = 3 ] || fail "$what: rank 0 ended with status $rc, not the failed load's 3"
    line=$(grep "^rank=0 load_state=" "$WORK/r0")
    echo "$line" | grep -q "^rank=0 load_state=CA_ERR" || fail "$what: rank 0's load did not fail"
    echo "$line" | grep -q "rank 1" || fail "$what: rank 0's error does not name rank 1"
    echo "$line" | grep -q "rank 0's training state is as it was before the load (restored)" ||
        fail "$what: rank 0 does not say that its state was restored"
    [ "$(field 0 state_fnv "$WORK/r0" | sort -u)" = "$(cat "$WORK/ref_state")" ] &&
        [ "$(field 0 state_fnv "$WORK/r0" | wc -l)" = 2 ] ||
        fail "$what: rank 0's state after the failed load differs from the one before it (or from the run's)"
    [ "$(field 0 next_batch "$WORK/r0")" = "$(cat "$WORK/ref_batch")" ] ||
        fail "$what: rank 0's next batch after the failed load is not the run's (its data position moved)"
    echo "$what: rank 0 restored, bit for bit"
}

# corrupt BACKEND: rank 0's optimizer file corrupt; both refuse, keep their state and train on
corrupt() {
    be=$1
    rm -rf "$WORK/bad"
    cp -r "$WORK/ck" "$WORK/bad"
    f="$WORK/bad/optimizer.safetensors"
    size=$(wc -c < "$f")
    printf '\377' | dd of="$f" bs=1 seek=$((size - 5)) conv=notrunc 2>/dev/null
    job "$be" --steps 3 --try-load-state "$WORK/bad" --after 2
    cat "$WORK/o"
    grep "^rank=0 load_state=CA_ERR" "$WORK/o" | grep -q "optimizer.safetensors: corrupt" ||
        fail "$be: rank 0 does not name the corrupt optimizer file"
    grep "^rank=1 load_state=CA_ERR" "$WORK/o" | grep -q "rank 0 failed\|optimizer.safetensors: corrupt" ||
        fail "$be: rank 1 names neither rank 0 nor the file"
    for r in 0 1; do
        [ "$(field $r state_fnv "$WORK/o" | sort -u)" = "$(field $r state_fnv "$WORK/ref" | head -1)" ] ||
            fail "$be: rank $r's state changed"
        [ "$(field $r params_fnv "$WORK/o")" = "$(field $r params_fnv "$WORK/ref5")" ] ||
            fail "$be: rank $r trained on to other parameters than a run that never loaded"
    done
    echo "$be: corrupt optimizer file refused on both ranks; both trained on as if never loaded"
}

for cfg in ddp zero2; do
    if [ $cfg = zero2 ]; then export ACCELERATE_USE_DEEPSPEED=true ACCELERATE_DEEPSPEED_ZERO_STAGE=2; fi
    note "$cfg: the checkpoint of step 2, the run of step 3 (and 5) that never loads"
    rm -rf "$WORK/ck"
    job gloo --steps 2 --save-state "$WORK/ck"
    job gloo --steps 3 --state-digest
    cp "$WORK/o" "$WORK/ref"
    field 0 state_fnv "$WORK/ref" > "$WORK/ref_state"
    field 0 next_batch "$WORK/ref" > "$WORK/ref_batch"
    [ -s "$WORK/ref_state" ] && [ -s "$WORK/ref_batch" ] || { cat "$WORK/ref"; fail "$cfg: no reference digest"; }
    job gloo --steps 5 --digest
    cp "$WORK/o" "$WORK/ref5"
    restored gloo kill
    restored gloo stop
    corrupt gloo
    if [ $has_mpi = yes ]; then
        restored mpi stop
        corrupt mpi
    fi
done
[ $has_mpi = yes ] || echo "no mpirun or MPI backend: the MPI part is not run"
echo "PASS"
