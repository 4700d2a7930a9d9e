# bcast_stall.sh: sourced by the tests of a load that loses a peer in the middle of rank 0's broadcasts
# (after tests/dist/lib.sh): the 2-process checks of tests/ddp_check ($DDP) on the CPU over Gloo, and
# over MPI where has_mpi is yes (mpirun and the MPI backend are there).
need_caccel
need_backend gloo
DDP="$BUILD/tests/ddp_check"
export OPENBLAS_NUM_THREADS=1 ACCELERATE_USE_CPU=true
has_mpi=no
if command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1; then
    for p in $(echo "${CACCEL_PLUGIN_PATH:-}" | tr ':' ' '); do [ -e "$p/caccel_mpi.so" ] && has_mpi=yes; done
fi

#
# stall_pair BACKEND HOW LAST ARGS...: ddp_check ARGS on 2 ranks, rank 1 held before its 2nd parameter
# broadcast from rank 0 (CACCEL_TEST_BCAST_STALL=2, which prints a line with its pid), then killed
# (HOW kill) or stopped (HOW stop) once it says so; rank 0 then meets the communicator's deadline
# (CACCEL_TIMEOUT=10) or sees the death. Gloo: the ranks run without a launcher (as torchrun or srun
# start them), so that rank 0 outlives its peer; MPI (a stopped peer only: mpirun ends the job when a
# rank dies): rank 1 is killed once rank 0 printed a line matching LAST, and mpirun ends with it.
# Rank 0's output (both ranks' under MPI) is in $WORK/r0; rc is rank 0's status (mpirun's under MPI).
stall_pair() {
    be=$1 how=$2 last=$3
    shift 3
    rm -f "$WORK/r0" "$WORK/r1"
    if [ "$be" = mpi ]; then
        CACCEL_TEST_BCAST_STALL=2 CACCEL_TIMEOUT=10 run_mpi 2 -x CACCEL_TEST_BCAST_STALL -x CACCEL_TIMEOUT \
            "$DDP" "$@" --cpu --backend mpi > "$WORK/r0" 2>&1 &
        p0=$! r1out="$WORK/r0" pids=$!
    else
        port=$(free_port)
        [ -n "$port" ] || fail "no free port"
        for r in 0 1; do
            MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r \
                CACCEL_BACKEND=gloo CACCEL_JOB_TOKEN=stall-$$-$how CACCEL_TEST_BCAST_STALL=2 CACCEL_TIMEOUT=10 \
                timeout 200 "$DDP" "$@" > "$WORK/r$r" 2>&1 &
            eval "p$r=\$!"
        done
        r1out="$WORK/r1" pids="$p0 $p1"
    fi
    wait_lines 1 "rank 1 stalled before parameter broadcast 2" "$be $how" "$pids" "$r1out"
    victim=$(sed -n 's/.*rank 1 stalled before parameter broadcast 2 (CACCEL_TEST_BCAST_STALL, pid \([0-9]*\)).*/\1/p' "$r1out")
    [ -n "$victim" ] || fail "$be $how: rank 1 did not say its pid"
    if [ "$how" = kill ]; then kill -9 "$victim"; else kill -STOP "$victim"; fi
    [ "$be" != mpi ] || wait_lines 1 "$last" "$be $how" "$p0" "$WORK/r0"
    kill -9 "$victim" 2>/dev/null
    wait "$p0"
    rc=$?
    [ "$be" = mpi ] || wait "$p1" 2>/dev/null
    cat "$WORK/r0"
}
