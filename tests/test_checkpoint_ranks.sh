#!/bin/sh
# ca_save_model on 2 ranks (caccel launch over Gloo): rank 0 writes, every rank returns only once the
# file exists (each loads it back at once), and when rank 0 fails the other rank fails too.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
need_backend gloo
PROG="$BUILD/tests/test_checkpoint"
export OPENBLAS_NUM_THREADS=1

mkdir -p "$WORK/out"
timeout 300 "$CACCEL" launch --num_processes 2 --cpu --backend gloo "$PROG" --ranks "$WORK/out" \
    > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "2 ranks saving"; }
cat "$WORK/o"
for r in 0 1; do
    grep -q "^rank $r: CA_OK same parameters" "$WORK/o" || fail "rank $r did not load what rank 0 saved"
done

timeout 300 "$CACCEL" launch --num_processes 2 --cpu --backend gloo "$PROG" --ranks "$WORK/missing" \
    > "$WORK/o" 2>&1
cat "$WORK/o"
grep -q "^rank 0: CA_ERR_NOT_FOUND .*missing is not a directory" "$WORK/o" || fail "rank 0's error"
grep -q "^rank 1: CA_ERR_PEER .*rank 0 failed to write the model" "$WORK/o" || fail "rank 1 did not fail"
echo "ok"
