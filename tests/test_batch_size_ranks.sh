#!/bin/sh
# find_executable_batch_size on 2 ranks under caccel launch (Gloo): only rank 1's device is capped
# at what batch 40 needs, yet both ranks try 64, 57, 51, 45, 40 and return 40 (one rank out of
# memory makes all retry); a step that fails otherwise on rank 1 makes rank 0 return CA_ERR_PEER.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
BC="$BUILD/tests/batch_size_check"
export OPENBLAS_NUM_THREADS=1
have gloo || skip "no gloo collective backend"

out=$(timeout 120 "$CACCEL" launch --num_processes 2 --cpu --backend gloo "$BC" 2>&1) || { echo "$out"; fail "2 ranks"; }
for r in 0 1; do
    echo "$out" | grep -q "^rank=$r found=40 calls=64,57,51,45,40\$" || { echo "$out"; fail "rank $r did not agree on 40"; }
done

out=$(timeout 120 "$CACCEL" launch --num_processes 2 --cpu --backend gloo "$BC" --fail-other 2>&1)
echo "$out" | grep -q "^rank=0 status=CA_ERR_PEER error=.*find_executable_batch_size: 1 rank(s) failed at batch size 64 with an error other than out of memory" ||
    { echo "$out"; fail "rank 0 did not report rank 1's failure"; }
echo "$out" | grep -q "^rank=1 status=CA_ERR_IO error=.*step failed on purpose" || { echo "$out"; fail "rank 1's own error"; }
echo "PASS"
