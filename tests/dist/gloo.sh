#!/bin/sh
# Collectives over Gloo through `caccel launch` at 2, 3 and 4 ranks (shared memory on one machine, and
# TCP only), and `caccel launch --backend mpi`.
. "$(dirname "$0")/lib.sh"
need_caccel
need_backend gloo
for np in 2 3 4; do
    note "caccel launch --num_processes $np: correctness over gloo"
    timeout 600 "$CACCEL" launch -q --num_processes "$np" --main_process_port 0 "$CHECK" --tag "$TAG" \
        --backend gloo --large-mib "$LARGE_MIB" >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "caccel launch -n $np failed"; }
    count "$np" "comm_check: OK rank .* backend gloo" "$WORK/out"
done
for np in 3 4; do
    note "caccel launch --num_processes $np: ca_comm_split over gloo (by parity, keys reversed; odd worlds leave one out)"
    timeout 600 "$CACCEL" launch -q --num_processes "$np" --main_process_port 0 "$CHECK" --tag "$TAG" \
        --backend gloo --mode split >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "split -n $np failed"; }
    count "$np" "comm_check: OK split rank" "$WORK/out"
done
# (2 and 4 ranks: all-reduces up to 256 KiB by recursive doubling, larger ones and 3 ranks by the ring)
note "the same over TCP sockets only (CACCEL_SHM=0): the path jobs across machines take"
for np in 2 3 4; do
    CACCEL_SHM=0 timeout 600 "$CACCEL" launch -q --num_processes "$np" --main_process_port 0 "$CHECK" --tag "$TAG" \
        --backend gloo --large-mib 1 >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "TCP-only run -n $np failed"; }
    count "$np" "comm_check: OK rank .* backend gloo" "$WORK/out"
done
note "--debug: every collective signature-checked"
timeout 600 "$CACCEL" launch -q --num_processes 3 --main_process_port 0 --debug "$CHECK" --tag "$TAG" \
    --backend gloo --debug --large-mib 1 >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "debug run failed"; }
count 3 "comm_check: OK rank .* backend gloo" "$WORK/out"
note "--tee: output prefixed with the rank"
timeout 120 "$CACCEL" launch -q --tee 3 --num_processes 2 --main_process_port 0 "$CHECK" --tag "$TAG" \
    --mode env >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "tee run failed"; }
count 1 "^\[rank0\]: comm_check: env rank 0 of 2 backend gloo" "$WORK/out"
count 1 "^\[rank1\]: comm_check: env rank 1 of 2 backend gloo" "$WORK/out"
note "a Gloo communicator leaves SIGPIPE ignored: a socket write whose peer died fails with EPIPE"
# (Gloo writes with writev, which would otherwise kill a surviving rank silently; the launcher
# starts its processes with SIGPIPE at its default action, as a shell does)
CACCEL_SHM=0 timeout 120 "$CACCEL" launch -q --num_processes 2 --main_process_port 0 "$CHECK" --tag "$TAG" \
    --backend gloo --mode sigpipe >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "sigpipe run failed"; }
count 2 "comm_check: rank [01]: writev to a closed socket: EPIPE" "$WORK/out"
if command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1 && [ -n "$(ls "$BUILD"/collectives/.libs/caccel_mpi.so 2>/dev/null)" ]; then
    note "caccel launch --backend mpi (through mpirun)"
    ASAN_OPTIONS="$ASAN_OPTIONS_MPI" CACCEL_MPIRUN_ARGS="--allow-run-as-root --oversubscribe" timeout 600 "$CACCEL" launch -q --backend mpi \
        --num_processes 2 "$CHECK" --tag "$TAG" --large-mib 1 >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "--backend mpi failed"; }
    count 2 "comm_check: OK rank .* backend mpi" "$WORK/out"
fi
no_orphans
echo "PASS"
