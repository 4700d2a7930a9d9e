#!/bin/sh
# ca_load_model into a prepared model that every rank holds whole (DDP; ZeRO stage 2) on 2 processes
# over Gloo, where rank 0 reads the file and broadcasts: a peer that dies (kill -9) or stops (SIGSTOP,
# the communicator's deadline, CACCEL_TIMEOUT=10 here, then passes: a dead peer on the same machine is
# seen by the shared-memory transport only so) in the middle of the broadcasts fails the load on rank 0,
# naming rank 1, and rank 0's model is the one it held before the load bit for bit (it had already
# written the file's values into it). The ranks run without a launcher (as torchrun or srun start
# them), so that rank 0 outlives its peer; rank 1 is held before its 2nd parameter broadcast by
# CACCEL_TEST_BCAST_STALL, after printing a line the test waits for. ca_load_state's rank-0 broadcast:
# tests/test_load_state_restore.sh.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
need_backend gloo
DDP="$BUILD/tests/ddp_check"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true CACCEL_BACKEND=gloo
digest_of() { sed -n "s/^rank=$1 params_fnv=\([0-9a-f]*\).*/\1/p" "$2"; }

mkdir -p "$WORK/m"
timeout 300 "$CACCEL" launch --num_processes 2 --cpu --backend gloo "$DDP" --steps 3 --hidden 64 --save-model "$WORK/m" \
    > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "save"; }

# pair HOW ARGS...: two ranks of ddp_check ARGS, rank 1 held before its 2nd parameter broadcast from
# rank 0; HOW (kill, stop) is done to rank 1 once it says so; rank 0's output is in $WORK/r0 and its
# exit status in $rc
pair() {
    how=$1; shift
    port=$(free_port)
    [ -n "$port" ] || fail "no free port"
    for r in 0 1; do
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r \
            CACCEL_JOB_TOKEN=bcast-$$-$how CACCEL_TEST_BCAST_STALL=2 CACCEL_TIMEOUT=${CACCEL_TIMEOUT:-10} \
            timeout 200 "$DDP" --hidden 64 "$@" > "$WORK/r$r" 2>&1 &
        eval "p$r=\$!"
    done
    wait_lines 1 "rank 1 stalled before parameter broadcast 2" "$how" "$p0 $p1" "$WORK/r1"
    # the stalled rank itself, not the timeout(1) that started it ($p1), which would leave it running
    victim=$(sed -n 's/.*rank 1 stalled before parameter broadcast 2 (CACCEL_TEST_BCAST_STALL, pid \([0-9]*\)).*/\1/p' "$WORK/r1")
    [ -n "$victim" ] || fail "$how: rank 1 did not say its pid"
    if [ "$how" = kill ]; then kill -9 "$victim"; else kill -STOP "$victim"; fi
    wait "$p0"
    rc=$?
    kill -9 "$victim" 2>/dev/null
    wait "$p1" 2>/dev/null
    cat "$WORK/r0"
}

# fail_peer HOW: ca_load_model (ddp_check --try-load-model) fails on rank 0, naming rank 1, and
# rank 0's parameters are those it held before
fail_peer() {
    pair "$1" --steps 1 --try-load-model "$WORK/m"
    [ $rc = 3 ] || fail "$how: rank 0 ended with status $rc, not the failed load's 3"
    grep -q "^rank=0 load_model=CA_ERR" "$WORK/r0" || fail "$how: rank 0's load did not fail"
    grep "^rank=0 load_model=" "$WORK/r0" | grep -q "rank 1" || fail "$how: rank 0's error does not name rank 1"
    grep "^rank=0 load_model=" "$WORK/r0" | grep -q "rank 0's model is as it was before the load (restored)" ||
        fail "$how: rank 0 does not say that its model was restored"
    [ "$(digest_of 0 "$WORK/r0" | sort -u | wc -l)" = 1 ] && [ "$(digest_of 0 "$WORK/r0" | wc -l)" = 2 ] ||
        fail "$how: rank 0's parameters after the failed load differ from those before it"
    [ "$(digest_of 0 "$WORK/r0" | head -1)" != "$(cat "$WORK/saved")" ] || fail "$how: the run already held the saved parameters"
}

timeout 300 "$CACCEL" launch --num_processes 2 --cpu --backend gloo "$DDP" --steps 0 --hidden 64 --load-model "$WORK/m" --digest \
    > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "load"; }
digest_of 0 "$WORK/o" > "$WORK/saved"

note "DDP: rank 1 killed (kill -9) before the 2nd parameter broadcast"
fail_peer kill
note "ZeRO stage 2: rank 1 killed before the 2nd parameter broadcast"
ACCELERATE_USE_DEEPSPEED=true ACCELERATE_DEEPSPEED_ZERO_STAGE=2 fail_peer kill
note "DDP: rank 1 stopped (SIGSTOP) before the 2nd parameter broadcast"
fail_peer stop

echo "PASS"
