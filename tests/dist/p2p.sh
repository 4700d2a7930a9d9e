#!/bin/sh
# Point-to-point (ca_comm_sendrecv, ca_comm_send, ca_comm_recv) at 2 and 4 ranks over Gloo (caccel launch,
# shared memory and TCP alike: point-to-point always takes the pairs) and MPI (mpirun): ring shifts of
# payloads distinct per rank at 0, 1, 97 elements and 16 MiB (9 under the sanitizers), blocking and
# asynchronous, one-sided sends and receives, send and recv in flight together; a peer killed with
# SIGKILL between two shifts ends the others naming it (Gloo), or mpirun stops the job naming it (MPI); a
# peer late for a shift ends the other by the timeout, naming it (Gloo). On the lazy device (xla) each
# sendrecv is a node of the device's graph: shifts of device tensors at 2 and 4 ranks (Gloo, MPI), nothing run
# at the call, the graph cache keyed by the exchange's peers and size; a killed or late peer fails the
# graph's run naming it, as on the host (Gloo).
. "$(dirname "$0")/lib.sh"
need_caccel
clean() {
    if grep -q "UNEXPECTED\|FAILED on rank" "$WORK/out"; then cat "$WORK/out"; fail "a rank failed in an unexpected way"; fi
}
if [ -e "$BUILD/collectives/.libs/caccel_gloo.so" ]; then
    for shm in 1 0; do
        for np in 2 4; do
            note "caccel launch -n $np, gloo (CACCEL_SHM=$shm): ring shifts, send / recv"
            CACCEL_SHM=$shm timeout 600 "$CACCEL" launch -q --num_processes "$np" --main_process_port 0 "$CHECK" --tag "$TAG" \
                --backend gloo --mode p2p --large-mib "$LARGE_MIB" >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "p2p -n $np failed"; }
            count "$np" "comm_check: OK p2p rank .* of $np backend gloo (11 rounds" "$WORK/out"
        done
    done
    for np in 2 4; do
        v=$((np - 1))
        note "no launcher, gloo, $np ranks: rank $v is killed between two ring shifts"
        run_env "$np" "$CHECK" --tag "$TAG" --backend gloo --mode p2p-kill >"$WORK/out" 2>&1
        count $((np - 1)) "comm_check: EXPECTED rank .* (CA_ERR_PEER): sendrecv #[0-9]* (f32, 64 elements, to rank [0-9], from rank [0-9]) on rank [0-9] cannot complete: .*rank $v died" "$WORK/out"
        clean
    done
    note "caccel launch -n 2, gloo: rank 1 is late for a ring shift (timeout 3 s, late by 6 s)"
    timeout 120 "$CACCEL" launch -q --num_processes 2 --main_process_port 0 "$CHECK" --tag "$TAG" --backend gloo \
        --mode p2p-late --timeout-ms 3000 --sleep-ms 6000 >"$WORK/out" 2>&1
    count 1 "comm_check: EXPECTED rank 0 failed (CA_ERR_TIMEOUT): sendrecv #2 (f32, 64 elements, to rank 1, from rank 1) timed out after 3 s on rank 0.*rank 1 " "$WORK/out"
    clean
    for np in 2 4; do
        # the shift to the other side is another program only where the two sides are different ranks
        other=1; [ "$np" = 2 ] && other=0
        note "caccel launch -n $np, gloo: sendrecv on the lazy device, nodes of its graph"
        timeout 600 "$CACCEL" launch -q --num_processes "$np" --main_process_port 0 "$CHECK" --tag "$TAG" \
            --backend gloo --mode p2p-lazy >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "p2p-lazy -n $np failed"; }
        count "$np" "comm_check: OK p2p-lazy rank .* of $np backend gloo (4 sendrecv in the graph; compiles: the same shift 0, the other side $other, another size 1)" "$WORK/out"
    done
    note "caccel launch -n 4, gloo: a lazy device of ABI 3.8 (no enqueue_host_fn_keyed): sendrecv nodes keyed by their sizes alone"
    timeout 600 "$CACCEL" launch -q --num_processes 4 --main_process_port 0 "$CHECK" --tag "$TAG" \
        --backend gloo --mode p2p-lazy --device xla38 >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "p2p-lazy xla38 failed"; }
    count 4 "comm_check: OK p2p-lazy rank .* of 4 backend gloo (4 sendrecv in the graph; compiles: the same shift 0, the other side 0, another size 1)" "$WORK/out"
    note "no launcher, gloo, 2 ranks, the lazy device: rank 1 is killed between two ring shifts"
    run_env 2 "$CHECK" --tag "$TAG" --backend gloo --mode p2p-kill --device xla >"$WORK/out" 2>&1
    count 1 "comm_check: EXPECTED rank 0 .* (CA_ERR_PEER): xla: running node .*sendrecv #[0-9]* (f32, 64 elements, to rank 1, from rank 1) on rank 0 cannot complete: .*rank 1 died" "$WORK/out"
    clean
    note "caccel launch -n 2, gloo, the lazy device: rank 1 is late for a ring shift (timeout 3 s, late by 6 s)"
    timeout 120 "$CACCEL" launch -q --num_processes 2 --main_process_port 0 "$CHECK" --tag "$TAG" --backend gloo \
        --mode p2p-late --device xla --timeout-ms 3000 --sleep-ms 6000 >"$WORK/out" 2>&1
    count 1 "comm_check: EXPECTED rank 0 failed (CA_ERR_TIMEOUT): xla: running node .*sendrecv #2 (f32, 64 elements, to rank 1, from rank 1) timed out after 3 s on rank 0.*rank 1 " "$WORK/out"
    clean
fi
if command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1 && [ -e "$BUILD/collectives/.libs/caccel_mpi.so" ]; then
    for np in 2 4; do
        note "mpirun -np $np: ring shifts, send / recv"
        run_mpi "$np" "$CHECK" --tag "$TAG" --mode p2p --large-mib "$LARGE_MIB" >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "mpirun p2p -np $np failed"; }
        count "$np" "comm_check: OK p2p rank .* of $np backend mpi (11 rounds" "$WORK/out"
        note "mpirun -np $np: sendrecv on the lazy device, nodes of its graph"
        run_mpi "$np" "$CHECK" --tag "$TAG" --mode p2p-lazy >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "mpirun p2p-lazy -np $np failed"; }
        other=1; [ "$np" = 2 ] && other=0
        count "$np" "comm_check: OK p2p-lazy rank .* of $np backend mpi (4 sendrecv in the graph; compiles: the same shift 0, the other side $other, another size 1)" "$WORK/out"
        v=$((np - 1))
        note "mpirun -np $np: rank $v is killed between two ring shifts"
        MPI_TIMEOUT=60 run_mpi_watched "$np" "$CHECK" --tag "$TAG" --mode p2p-kill >"$WORK/out" 2>&1
        [ "$MPI_RC" -ne 0 ] || { cat "$WORK/out"; fail "mpirun succeeded"; }
        grep -q "process rank $v with PID .* exited on signal 9\|comm_check: EXPECTED .*rank $v died" "$WORK/out" ||
            { cat "$WORK/out"; fail "nothing named rank $v's death"; }
        clean
    done
fi
no_orphans
echo "PASS"
