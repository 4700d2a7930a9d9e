#!/bin/sh
# A program's last collective never fails because a peer finished first. Without a launcher (mpirun,
# torchrun-style variables) rank 0 serves the rendezvous store, which ends with its communicator; a
# peer still waiting in the last collective may yet read the store (its watchdog reads every peer's
# record 0.2 s into a wait, then at growing intervals). Here the peer is held in its wait for the last
# broadcast for 3 s (CACCEL_TEST_WAIT_DELAY, once it has said that it waits), so rank 0 finishes its
# part and destroys its communicator while the peer's watchdog reads the store: the broadcast must
# complete on every rank all the same (a rank slow to see it complete met this about once in a hundred
# runs on a loaded machine). The store's host waits for its peers only so long: a peer held past that
# bound does not hold rank 0's exit.
. "$(dirname "$0")/lib.sh"
need_caccel
unset CACCEL_TIMEOUT CACCEL_SHM CACCEL_SHM_SLOT_MB CACCEL_LAUNCHER RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
HOLD=3000
DRAIN_BOUND=10   # seconds: what the store's host waits at most (comm/comm_diag_impl.h, DRAIN_MS)

# every rank completed its last broadcast, and the held rank was held
all_done() {   # all_done NP HELD_RANK
    count "$1" "comm_check: OK rank [0-9]* of $1: its last collective, broadcast #2, done; exiting" "$WORK/out"
    count 1 "caccel: rank $2 holds its wait for collective #2 for $HOLD ms" "$WORK/out"
    if grep -q "FAILED\|cannot complete" "$WORK/out"; then cat "$WORK/out"; fail "a rank failed"; fi
}

if have gloo; then
    for setup in "1 2 shared memory" "0 3 TCP (CACCEL_SHM=0)"; do
        set -- $setup
        shm=$1 np=$2 h=$(($2 - 1))
        shift 2
        note "no launcher, $*, $np ranks: rank 0 exits after its last broadcast while rank $h still waits in it"
        CACCEL_SHM=$shm CACCEL_TEST_WAIT_DELAY=$h:2:$HOLD run_env "$np" "$CHECK" --tag "$TAG" --backend gloo --mode last-bcast >"$WORK/out"
        all_done "$np" "$h"
    done

    note "no launcher, TCP: a peer held past the bound ($DRAIN_BOUND s) does not hold rank 0's exit"
    HOLD=20000
    CACCEL_SHM=0 CACCEL_TEST_WAIT_DELAY=1:2:$HOLD run_env 2 "$CHECK" --tag "$TAG" --backend gloo --mode last-bcast >"$WORK/out"
    count 1 "comm_check: OK rank 0 of 2: its last collective, broadcast #2, done" "$WORK/out"
    t=$(sed -n 's/^comm_check: rank 0 destroyed its communicator in \([0-9.]*\) s$/\1/p' "$WORK/out")
    echo "  rank 0 destroyed its communicator in $t s"
    # (the held rank goes on for 20 s: a destroy that waited for it would take that long)
    [ -n "$t" ] && awk -v t="$t" -v b="$DRAIN_BOUND" 'BEGIN { exit !(t >= b - 1 && t < b + 5) }' ||
        { cat "$WORK/out"; fail "rank 0's destroy took ${t:-?} s, not the bound of $DRAIN_BOUND s"; }
    # the store is gone when the held rank reads it: that rank fails, naming the store
    count 1 "comm_check: FAILED on rank 1: broadcast .*cannot complete: the rendezvous store at 127.0.0.1:[0-9]* (rank 0) is gone" "$WORK/out"
    HOLD=3000
else
    echo "SKIPPED PART: no launcher (the Gloo plugin was not built)"
fi

# under mpirun over Gloo (MASTER_ADDR set: rank 0 serves the store), and over MPI (rank 0 serves the
# store it hands the others over MPI)
if command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1 && have mpi; then
    for be in gloo mpi; do
        have "$be" || continue
        for np in 2 3; do
            h=$((np - 1))
            set --
            [ "$be" = gloo ] && set -- -x MASTER_ADDR=127.0.0.1 -x "MASTER_PORT=$(free_port)" -x CACCEL_JOB_TOKEN=shutdown-$$
            note "mpirun -np $np, backend $be: rank 0 exits after its last broadcast while rank $h still waits in it"
            CACCEL_TEST_WAIT_DELAY=$h:2:$HOLD MPI_TIMEOUT=120 run_mpi "$np" -x CACCEL_TEST_WAIT_DELAY "$@" "$CHECK" \
                --tag "$TAG" --backend "$be" --mode last-bcast >"$WORK/out" 2>&1
            rc=$?
            [ "$rc" -eq 0 ] || { cat "$WORK/out"; fail "mpirun exited $rc"; }
            all_done "$np" "$h"
        done
    done
else
    echo "SKIPPED PART: mpirun (no mpirun or no MPI plugin)"
fi
no_orphans
echo "PASS"
