#!/bin/sh
# Asynchronous save_state on 2 and 4 ranks, under caccel launch (Gloo: the background thread
# exchanges the statuses on a communicator of its own) and under mpirun (the same when the MPI
# library gives MPI_THREAD_MULTIPLE, as ompi_info says Open MPI does; else the save is made
# synchronously, with a warning), and on the lazy xla device (--tpu) in one process and on 2 ranks
# (in the background too: the writer's communicator is on host memory). On 2 ranks of the lazy device:
# resumed from the asynchronous checkpoint, the run ends with the parameters of the run that went on;
# killed while the writers are held, the previous checkpoint loads. On 2 ranks of the CPU and the lazy
# device: a background write failing on rank 1 alone is returned on both ranks, nothing published.
# Every rank steps after the asynchronous save returned, while its background writer is held; the
# program says whether a background writer ran (it read the byte that released it); and the
# checkpoint equals a synchronous save of the same state, every file byte for byte (complete.json
# with its CRC-32s included).
. "$(dirname "$0")/dist/lib.sh"
need_caccel
need_backend gloo
export OPENBLAS_NUM_THREADS=1

check() {   # $1: what, $2: ranks, $3: output, $4: directory, $5: "in the background" or "on the calling thread"
    cat "$3"
    count "$2" "stepped to 7 after the asynchronous save returned" "$3"
    [ -z "$5" ] || count "$2" "the save was written $5" "$3"
    grep -q "^rank 0: the asynchronous checkpoint equals the synchronous one" "$3" || fail "$1: the checkpoints differ"
    [ -f "$4/async/random_states_$(($2 - 1)).json" ] || fail "$1: the last rank's file is not in the checkpoint"
    [ ! -e "$4/async.tmp" ] || fail "$1: async.tmp left"
}

for n in 2 4; do
    d="$WORK/gloo$n"
    mkdir -p "$d"
    timeout 300 "$CACCEL" launch --num_processes $n --cpu --backend gloo "$BUILD/tests/test_async_save" --ranks "$d" \
        > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "gloo, $n ranks"; }
    check "gloo, $n ranks" $n "$WORK/o" "$d" "in the background"
done

# the lazy xla device: one process, and 2 ranks over Gloo (the call runs the pending graph and copies
# to the host; the background thread exchanges its statuses on a host-memory communicator of its own)
d="$WORK/xla1"
mkdir -p "$d"
timeout 300 "$BUILD/tests/test_async_save" --ranks "$d" --tpu > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "xla, 1 process"; }
check "xla, 1 process" 1 "$WORK/o" "$d" "in the background"
d="$WORK/xla2"
mkdir -p "$d"
timeout 300 "$CACCEL" launch --num_processes 2 --backend gloo "$BUILD/tests/test_async_save" --ranks "$d" --tpu \
    > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "xla, 2 ranks"; }
check "xla, 2 ranks" 2 "$WORK/o" "$d" "in the background"

# 2 ranks on the lazy device: the asynchronous checkpoint of step 6 resumed to step 10 equals the run
# that went on (every rank's parameters, bit for bit); a job killed (kill -9) while every rank's
# background writer is held at 'files' leaves the synchronous checkpoint of step 3 loadable
xla2() { timeout 300 "$CACCEL" launch --num_processes 2 --backend gloo "$BUILD/tests/test_async_save" --resume "$@" --tpu; }
d="$WORK/xla2r"
mkdir -p "$d"
xla2 "$d" run > "$WORK/run" 2>&1 || { cat "$WORK/run"; fail "xla, 2 ranks: the run"; }
xla2 "$d" resume > "$WORK/res" 2>&1 || { cat "$WORK/res"; fail "xla, 2 ranks: the resumed run"; }
count 2 "loaded the checkpoint of step 6" "$WORK/res"
for r in 0 1; do
    a=$(grep "^rank $r: digest .* at step 10" "$WORK/run") b=$(grep "^rank $r: digest .* at step 10" "$WORK/res")
    [ -n "$a" ] && [ "$a" = "$b" ] || { cat "$WORK/run" "$WORK/res"; fail "xla, 2 ranks: rank $r resumed to other parameters"; }
done
echo "xla, 2 ranks: resumed from the asynchronous checkpoint to the same parameters: $(grep -c digest "$WORK/res") ranks"
d="$WORK/xla2k"
mkdir -p "$d"
CACCEL_TEST_SAVE_STALL=files:2 xla2 "$d" kill > "$WORK/kill" 2>&1 &
pid=$!
wait_lines 2 "stalled at 'files' of save 2" "xla, 2 ranks, kill" "$pid" "$WORK/kill"
wait_lines 2 "stepped to 8 while the save is in flight" "xla, 2 ranks, kill" "$pid" "$WORK/kill"
pkill -KILL -P $pid 2>/dev/null
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
[ -e "$d/ck.tmp" ] || { cat "$WORK/kill"; fail "xla, 2 ranks, kill: no ck.tmp: the save was not in flight"; }
xla2 "$d" load > "$WORK/load" 2>&1 || { cat "$WORK/kill" "$WORK/load"; fail "xla, 2 ranks: the load after the kill"; }
count 2 "loaded the checkpoint of step 3" "$WORK/load"
echo "xla, 2 ranks: killed while both writers were held; the previous checkpoint loads"

# a background write that fails on rank 1 alone (a full disk: CACCEL_TEST_SAVE_ENOSPC=1): every rank's
# next call returns the failure once (rank 1 its own, rank 0 naming rank 1), rank 0 does not publish
# (ck is still the synchronous checkpoint of step 3, no ck.tmp is left); on the CPU and the lazy device
for dev in cpu tpu; do
    d="$WORK/fail$dev"
    mkdir -p "$d"
    CACCEL_TEST_SAVE_ENOSPC=1 timeout 300 "$CACCEL" launch --num_processes 2 --backend gloo "$BUILD/tests/test_async_save" \
        --resume "$d" fail --$dev > "$WORK/fail" 2>&1 || { cat "$WORK/fail"; fail "$dev, 2 ranks: the failing save"; }
    cat "$WORK/fail"
    count 1 "^rank 1: wait_for_save 1: CA_ERR_IO: wait_for_save: the asynchronous save into $d/ck failed: .*No space left on device (rank 1, CACCEL_TEST_SAVE_ENOSPC)" "$WORK/fail"
    count 1 "^rank 0: wait_for_save 1: CA_ERR_PEER: wait_for_save: the asynchronous save into $d/ck failed: save_state: rank 1 failed (CA_ERR_IO); $d/ck is not complete" "$WORK/fail"
    count 2 "wait_for_save 2: CA_OK" "$WORK/fail"
    [ ! -e "$d/ck.tmp" ] || fail "$dev, 2 ranks: ck.tmp left after the failed save"
    timeout 300 "$CACCEL" launch --num_processes 2 --backend gloo "$BUILD/tests/test_async_save" --resume "$d" load --$dev \
        > "$WORK/load" 2>&1 || { cat "$WORK/load"; fail "$dev, 2 ranks: the load after the failed save"; }
    count 2 "loaded the checkpoint of step 3" "$WORK/load"
    echo "$dev, 2 ranks: rank 1's failed background write reported on both ranks; nothing published"
done

mpi_plugin=no
for p in $(echo "${CACCEL_PLUGIN_PATH:-}" | tr ':' ' '); do [ -e "$p/caccel_mpi.so" ] && mpi_plugin=yes; done
if command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1 && [ $mpi_plugin = yes ]; then
    how=   # unknown library: either way, as long as the checkpoint is right
    if command -v ompi_info >/dev/null 2>&1; then
        if ompi_info --parsable 2>/dev/null | grep -q "MPI_THREAD_MULTIPLE: yes"; then how="in the background"
        else how="on the calling thread"; fi
    fi
    echo "MPI: the save is expected to be written ${how:-either way}"
    for n in 2 4; do
        d="$WORK/mpi$n"
        mkdir -p "$d"
        run_mpi $n "$BUILD/tests/test_async_save" --ranks "$d" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "mpi, $n ranks"; }
        check "mpi, $n ranks" $n "$WORK/o" "$d" "$how"
    done
    d="$WORK/mpixla2"   # the lazy device: its collectives are graph nodes, the writer's are on host memory
    mkdir -p "$d"
    run_mpi 2 "$BUILD/tests/test_async_save" --ranks "$d" --tpu > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "mpi, xla, 2 ranks"; }
    check "mpi, xla, 2 ranks" 2 "$WORK/o" "$d" "$how"
else
    echo "no mpirun or MPI backend: the MPI part is not run"
fi
echo "ok"
