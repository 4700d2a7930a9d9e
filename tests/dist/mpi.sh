#!/bin/sh
# Collectives under a real mpirun at 2, 3 and 4 ranks: every op, dtype and size (0, 1, 97, 16 MiB;
# 9 MiB under the sanitizers).
. "$(dirname "$0")/lib.sh"
need_mpirun
for np in 2 3 4; do
    note "mpirun -np $np: correctness"
    run_mpi "$np" "$CHECK" --tag "$TAG" --large-mib "$LARGE_MIB" >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "mpirun -np $np failed"; }
    count "$np" "comm_check: OK rank .* backend mpi" "$WORK/out"
done
for np in 3 4; do
    note "mpirun -np $np: ca_comm_split (MPI_Comm_split; by parity, keys reversed; odd worlds leave one out)"
    run_mpi "$np" "$CHECK" --tag "$TAG" --mode split >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "split -np $np failed"; }
    count "$np" "comm_check: OK split rank" "$WORK/out"
done
note "mpirun -np 3: a barrier only rank 0 reaches"
run_mpi 3 "$CHECK" --tag "$TAG" --mode desync --timeout-ms 60000 >"$WORK/out" 2>&1
count 3 "comm_check: EXPECTED" "$WORK/out"
note "mpirun -np 3: the last rank is late"
run_mpi 3 "$CHECK" --tag "$TAG" --mode timeout --timeout-ms 3000 --sleep-ms 6000 >"$WORK/out" 2>&1
count 2 "comm_check: EXPECTED rank [01] failed .*CA_ERR_TIMEOUT.*timed out after 3 s.*rank 2 has finished #1" "$WORK/out"
no_orphans
echo "PASS"
