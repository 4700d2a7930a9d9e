#!/bin/sh
# The flight recorder's SIGUSR1 dump in the middle of training (docs/PROFILING.md, "Flight recorder"):
# the Fashion-MNIST MLP trains on the CPU (oneDNN's GEMM where libdnnl is installed) while SIGUSR1
# comes every 0.1 s; every dump is written and the run ends normally. oneDNN's generated GEMM code
# keeps data below its stack pointer: a handler run on the interrupted stack overwrote it and glibc
# aborted on a corrupted heap (3 runs in 4 with 12 signals); the recorder's handlers run on a stack of
# their own.
set -u
b=${CACCEL_TEST_BUILDDIR:-.}
fail() { echo "FAIL: $*"; exit 1; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/caccel-frtrain.XXXXXX")
pid=""
trap '[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$WORK"' EXIT
export OPENBLAS_NUM_THREADS=1 CACCEL_FLIGHT_RECORDER_DIR="$WORK/fr"

for run in 1 2; do
    "$b/examples/fashion_mnist" --cpu --epochs 1 --max-steps 200 --progress false >"$WORK/out" 2>&1 &
    pid=$!
    # the sign: the line printed once the accelerator (and with it the recorder) is set up
    until grep -q "^fashion_mnist: 1 process(es) on cpu" "$WORK/out"; do
        kill -0 "$pid" 2>/dev/null || { cat "$WORK/out"; fail "run $run: fashion_mnist ended before training"; }
        sleep 0.05
    done
    sent=0
    while kill -0 "$pid" 2>/dev/null && [ "$sent" -lt 30 ]; do kill -USR1 "$pid" 2>/dev/null && sent=$((sent + 1)); sleep 0.1; done
    wait "$pid"
    rc=$?
    pid=""
    [ "$rc" = 0 ] || { cat "$WORK/out"; fail "run $run: fashion_mnist exited with status $rc after $sent SIGUSR1"; }
    n=$(grep -c "flight recorder: rank 0 wrote its last" "$WORK/out")
    [ "$n" -ge 1 ] || { cat "$WORK/out"; fail "run $run: no dump written for $sent SIGUSR1"; }
    grep -q "^epoch 1/1: train loss" "$WORK/out" || { cat "$WORK/out"; fail "run $run: no epoch line"; }
    echo "run $run: $sent SIGUSR1, $n dumps, exit 0"
done
"$b/tools/caccel" trace analyze "$WORK/fr" > "$WORK/report" 2>&1 || { cat "$WORK/report"; fail "trace analyze"; }
grep -q "^  dump on demand (SIGUSR1): " "$WORK/report" || { cat "$WORK/report"; fail "the newest dump is not SIGUSR1's"; }
echo ok
