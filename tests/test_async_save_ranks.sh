#!/bin/sh
# Asynchronous save_state on 2 and 4 ranks, under caccel launch (Gloo: the background thread
# exchanges the statuses on a communicator of its own) and under mpirun (the same when the MPI
# library gives MPI_THREAD_MULTIPLE, as ompi_info says Open MPI does; else the save is made
# synchronously, with a warning), and on the lazy xla device (--tpu) in one process and on 2 ranks.
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

# the lazy xla device: one process (asynchronous: the call copies to the host), and 2 ranks over Gloo
# (the communicator is on the device: synchronous, with a warning)
d="$WORK/xla1"
mkdir -p "$d"
timeout 300 "$BUILD/tests/test_async_save" --ranks "$d" --tpu > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "xla, 1 process"; }
check "xla, 1 process" 1 "$WORK/o" "$d" "in the background"
d="$WORK/xla2"
mkdir -p "$d"
timeout 300 "$CACCEL" launch --num_processes 2 --backend gloo "$BUILD/tests/test_async_save" --ranks "$d" --tpu \
    > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "xla, 2 ranks"; }
check "xla, 2 ranks" 2 "$WORK/o" "$d" "on the calling thread"

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
else
    echo "no mpirun or MPI backend: the MPI part is not run"
fi
echo "ok"
