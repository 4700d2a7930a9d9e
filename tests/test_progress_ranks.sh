#!/bin/sh
# The progress bar on 2 ranks (caccel launch over Gloo): both ranks run a 10-step bar with stderr
# not a terminal; only the main process's lines appear (10 lines, one per 10%, with the loss).
. "$(dirname "$0")/dist/lib.sh"
need_caccel
need_backend gloo
PROG="$BUILD/tests/test_progress"
export OPENBLAS_NUM_THREADS=1

timeout 300 "$CACCEL" launch --num_processes 2 --cpu --backend gloo "$PROG" --ranks \
    > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "2 ranks with a progress bar"; }
cat "$WORK/o"
for r in 0 1; do grep -q "rank $r: counted 10" "$WORK/o" || fail "rank $r did not finish"; done
grep -q "rank 1: .*%" "$WORK/o" && fail "rank 1 drew a progress bar"
[ "$(grep -c "rank 0: .*/10 \[" "$WORK/o")" -eq 10 ] || fail "expected 10 lines from rank 0's bar"
grep -q "rank 0: 100% 10/10 \[.*, loss=0.1\]" "$WORK/o" || fail "the last line lacks 10/10 or the loss"
echo "ok"
