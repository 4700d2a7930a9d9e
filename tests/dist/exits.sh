#!/bin/sh
# A rank that leaves the job ends it within seconds, named: exit(1) in the middle of training, exit(0) while the
# others still call collectives, SIGKILL. Under caccel launch, under torchrun-style variables without a launcher
# (shared memory, and TCP with CACCEL_SHM=0; rank 0 serves the store, and its death is the store's), and under
# mpirun; at 2 and 4 ranks. The collective timeout stays at its default (1800 s): only the bounded time to
# failure and the message prove that the others noticed.
. "$(dirname "$0")/lib.sh"
need_caccel
unset CACCEL_TIMEOUT CACCEL_SHM CACCEL_SHM_SLOT_MB CACCEL_LAUNCHER RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
BOUND=20   # seconds from the rank's departure to the end of the job: generous against a busy machine, far below 1800

# bounded [END_MS]: the job ended (at END_MS, epoch ms; default now) within BOUND seconds of the moment
# the leaving rank left, which it prints: the time its processes took to start and connect on a busy
# machine is not the time to notice a departure
bounded() {
    end_ms=${1:-$(date +%s%3N)}
    left=$(sed -n 's/.*comm_check: rank [0-9]* leaves (.*) after collective #2, at \([0-9]*\) ms$/\1/p' \
        "$WORK/out" | head -n 1)
    [ -n "$left" ] || { cat "$WORK/out"; fail "the leaving rank did not say when it left"; }
    t=$(( (end_ms - left) / 1000 ))
    [ "$t" -lt "$BOUND" ] || { cat "$WORK/out"; show_survivors
        fail "the job ended $t s after the rank left (bound $BOUND s, timeout 1800 s)"; }
}

# ranks_bounded: under mpirun, every rank ended within BOUND seconds of the departure (run_mpi_watched's
# RANKS_END_MS); an mpirun that hung after that is reported, not failed (see run_mpi_watched)
ranks_bounded() {
    bounded "$RANKS_END_MS"
    [ "$MPIRUN_LINGERED" = 0 ] || echo "NOTE: every rank had ended after $RANKS_END s; mpirun had not exited 10 s later and was killed (open-mpi/ompi#3380)"
}

# common checks on every run's output
clean() {
    if grep -q "UNEXPECTED\|FAILED on rank" "$WORK/out"; then cat "$WORK/out"; fail "a rank failed in an unexpected way"; fi
    if grep -Eq "\(rank ([0-9]+)\) \(rank \1\)" "$WORK/out"; then cat "$WORK/out"; fail "a message names its rank twice"; fi
}

# the message every waiting rank must give (theirs, or a peer's that they quote)
exited_msg() { echo "cannot complete: rank $1 exited (status $2) after collective #2 while $3 in #3 all_reduce(f32, 16, sum)"; }
died_msg() { echo "cannot complete: .*rank $1 died (pid [0-9]* ended without exiting: killed or crashed; last seen "; }

waiting_ranks() { [ "$1" -eq 2 ] && echo "rank 0 waits" || echo "ranks 0-2 wait"; }

if [ -e "$BUILD/collectives/.libs/caccel_gloo.so" ]; then
    for np in 2 4; do
        v=$((np - 1))
        L="timeout 120 $CACCEL launch --main_process_port 0 --num_processes $np"
        note "caccel launch -n $np: rank $v calls exit(1) in the middle of training"
        $L "$CHECK" --tag "$TAG" --backend gloo --mode exit1-mid >"$WORK/out" 2>&1
        rc=$?
        [ "$rc" -eq 1 ] || { cat "$WORK/out"; fail "launcher exit status $rc, expected the rank's 1"; }
        count 1 "caccel launch: rank $v (local rank $v, pid [0-9]*) exited with code 1; stopping" "$WORK/out"
        bounded; clean

        note "caccel launch -n $np: rank $v returns 0 while the others call all_reduce"
        $L "$CHECK" --tag "$TAG" --backend gloo --mode exit0-early --fail-code 1 >"$WORK/out" 2>&1
        rc=$?
        [ "$rc" -eq 1 ] || { cat "$WORK/out"; fail "launcher exit status $rc, expected 1 (the failed collective)"; }
        grep -q "comm_check: EXPECTED rank .* (CA_ERR_PEER): .*$(exited_msg $v 0 "$(waiting_ranks "$np")")" "$WORK/out" ||
            { cat "$WORK/out"; fail "no waiting rank named rank $v's exit"; }
        count 1 "caccel launch: before that, rank $v (local rank $v, pid [0-9]*) exited with code 0 while the others still ran" "$WORK/out"
        bounded; clean

        note "caccel launch -n $np: rank $v is killed with SIGKILL"
        $L "$CHECK" --tag "$TAG" --backend gloo --mode kill9 >"$WORK/out" 2>&1
        rc=$?
        [ "$rc" -eq 137 ] || { cat "$WORK/out"; fail "launcher exit status $rc, expected 137 (SIGKILL)"; }
        count 1 "caccel launch: rank $v (local rank $v, pid [0-9]*) was killed by signal 9" "$WORK/out"
        bounded; clean
    done

    for shm in 1 0; do
        for np in 2 4; do
            v=$((np - 1))
            how="shared memory"; [ "$shm" = 0 ] && how="TCP (CACCEL_SHM=0)"
            export CACCEL_SHM=$shm
            note "no launcher, $how, $np ranks: rank $v returns 0 while the others call all_reduce"
            run_env "$np" "$CHECK" --tag "$TAG" --backend gloo --mode exit0-early >"$WORK/out" 2>&1
            count $((np - 1)) "comm_check: EXPECTED rank .* (CA_ERR_PEER): .*$(exited_msg $v 0 "$(waiting_ranks "$np")")" "$WORK/out"
            bounded; clean

            note "no launcher, $how, $np ranks: rank $v calls exit(1) in the middle of training"
            run_env "$np" "$CHECK" --tag "$TAG" --backend gloo --mode exit1-mid >"$WORK/out" 2>&1
            count $((np - 1)) "comm_check: EXPECTED rank .* (CA_ERR_PEER): .*$(exited_msg $v 1 "$(waiting_ranks "$np")")" "$WORK/out"
            bounded; clean

            note "no launcher, $how, $np ranks: rank $v is killed with SIGKILL"
            run_env "$np" "$CHECK" --tag "$TAG" --backend gloo --mode kill9 >"$WORK/out" 2>&1
            count $((np - 1)) "comm_check: EXPECTED rank .* (CA_ERR_PEER): .*$(died_msg $v)" "$WORK/out"
            bounded; clean

            # every other rank names the lost store in the one documented form, whichever of its threads (the
            # waiting collective, or the watchdog opening a second connection) saw the loss first
            note "no launcher, $how, $np ranks: rank 0, which serves the store, is killed with SIGKILL"
            run_env "$np" "$CHECK" --tag "$TAG" --backend gloo --mode kill9 --victim 0 >"$WORK/out" 2>&1
            count $((np - 1)) "comm_check: EXPECTED rank .* (CA_ERR_PEER): .*cannot complete: the rendezvous store at 127.0.0.1:[0-9]* (rank 0) is gone" "$WORK/out"
            bounded; clean
        done
    done
    unset CACCEL_SHM

    note "CACCEL_SHM_SLOT_MB is checked like every other variable"
    for bad in 99999999999999 abc 0; do
        CACCEL_SHM_SLOT_MB=$bad timeout 60 "$CACCEL" launch -q --main_process_port 0 --num_processes 2 "$CHECK" --tag "$TAG" \
            --backend gloo --mode env >"$WORK/out" 2>&1 && { cat "$WORK/out"; fail "CACCEL_SHM_SLOT_MB=$bad was accepted"; }
        count 2 "CACCEL_SHM_SLOT_MB='$bad' is not a whole number of MiB between 1 and 1024" "$WORK/out"
    done
fi

if command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1 && [ -e "$BUILD/collectives/.libs/caccel_mpi.so" ]; then
    for np in 2 4; do
        v=$((np - 1))
        note "mpirun -np $np: rank $v calls exit(1) in the middle of training"
        start=$(date +%s)
        MPI_TIMEOUT=60 run_mpi_watched "$np" "$CHECK" --tag "$TAG" --mode exit1-mid >"$WORK/out" 2>&1
        [ "$MPI_RC" -ne 0 ] || { cat "$WORK/out"; fail "mpirun succeeded"; }
        count 1 "caccel: rank $v exits with status 1: leaving without MPI_Finalize so that mpirun stops the other ranks now" "$WORK/out"
        ranks_bounded; clean

        note "mpirun -np $np: rank $v returns 0 while the others call all_reduce"
        start=$(date +%s)
        MPI_TIMEOUT=60 run_mpi_watched "$np" "$CHECK" --tag "$TAG" --mode exit0-early >"$WORK/out" 2>&1
        # the first rank to fail aborts the job, which may stop the others before they print
        grep -q "comm_check: EXPECTED rank .* (CA_ERR_PEER): .*$(exited_msg $v 0 "$(waiting_ranks "$np")")" "$WORK/out" ||
            { cat "$WORK/out"; fail "no waiting rank named rank $v's exit"; }
        ranks_bounded; clean

        note "mpirun -np $np: rank $v is killed with SIGKILL"
        start=$(date +%s)
        MPI_TIMEOUT=60 run_mpi_watched "$np" "$CHECK" --tag "$TAG" --mode kill9 >"$WORK/out" 2>&1
        [ "$MPI_RC" -ne 0 ] || { cat "$WORK/out"; fail "mpirun succeeded"; }
        # mpirun names it, or a waiting rank does before mpirun stops it
        grep -q "process rank $v with PID .* exited on signal 9\|comm_check: EXPECTED .*$(died_msg $v)" "$WORK/out" ||
            { cat "$WORK/out"; fail "nothing named rank $v's death"; }
        ranks_bounded; clean
    done
fi

note "caccel launch --backend mpi through an MPICH-style launcher passes CACCEL_BACKEND once"
cat >"$WORK/mpiexec" <<'EOF'
#!/bin/sh
[ "$1" = "--version" ] && { echo "HYDRA build details:"; exit 0; }
echo "ARGS: $*"
EOF
chmod +x "$WORK/mpiexec"
MPIRUN="$WORK/mpiexec" timeout 60 "$CACCEL" launch -q --backend mpi --num_processes 2 "$CHECK" >"$WORK/out" 2>&1 ||
    { cat "$WORK/out"; fail "the launcher did not run the MPICH-style launcher"; }
count 1 "^ARGS: -np 2 -genvlist CACCEL_BACKEND $CHECK\$" "$WORK/out"
no_orphans
echo "PASS"
