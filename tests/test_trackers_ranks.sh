#!/bin/sh
# Trackers on 2 ranks (caccel launch over Gloo): both ranks log 3 steps, only the main process writes
# (3 JSON lines, 6 CSV rows, all with rank 0's values).
. "$(dirname "$0")/dist/lib.sh"
need_caccel
need_backend gloo
PROG="$BUILD/tests/test_trackers"
export OPENBLAS_NUM_THREADS=1

timeout 300 "$CACCEL" launch --num_processes 2 --cpu --backend gloo "$PROG" --ranks "$WORK/logs" \
    > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "2 ranks logging"; }
cat "$WORK/o"
for r in 0 1; do grep -q "^rank $r: CA_OK" "$WORK/o" || fail "rank $r did not log"; done
d="$WORK/logs/ranks"
[ "$(wc -l < "$d/metrics.jsonl")" -eq 3 ] || { cat "$d/metrics.jsonl"; fail "expected 3 JSON lines"; }
[ "$(wc -l < "$d/metrics.csv")" -eq 7 ] || { cat "$d/metrics.csv"; fail "expected a header and 6 CSV rows"; }
grep -q '"rank":1' "$d/metrics.jsonl" && fail "rank 1 wrote metrics"
grep -q '"rank_count":"2"' "$d/hparams.json" || fail "hparams.json lacks the program's hyperparameters"
grep -q '"num_processes":{' "$d/hparams.json" || fail "hparams.json lacks the run's configuration"
echo "ok"
