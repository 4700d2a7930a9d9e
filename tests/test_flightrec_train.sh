#!/bin/sh
# The flight recorder's SIGUSR1 dump in the middle of training (docs/PROFILING.md, "Flight recorder"):
# the Fashion-MNIST MLP trains on the CPU (oneDNN's GEMM where libdnnl is installed) while SIGUSR1
# comes again each time the last one's dump is written, up to 30; every dump is written and the run
# ends normally. oneDNN's generated GEMM code keeps data below its stack pointer: a handler run on the
# interrupted stack overwrote it and glibc aborted on a corrupted heap (3 runs in 4 with 12 signals);
# the recorder's handlers run on a stack of their own.
set -u
. "$(dirname "$0")/dist/lib.sh"
pid=""
kill_run() { [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; }
CLEANUPS="kill_run"
export OPENBLAS_NUM_THREADS=1 CACCEL_FLIGHT_RECORDER_DIR="$WORK/fr"
dump="flight recorder: rank 0 wrote its last"

for run in 1 2; do
    "$BUILD/examples/fashion_mnist" --cpu --epochs 1 --max-steps 200 --progress false >"$WORK/out" 2>&1 &
    pid=$!
    # the sign: the line printed once the accelerator (and with it the recorder) is set up
    lines_or_exit 1 "^fashion_mnist: 1 process(es) on cpu" "$pid" "$WORK/out" ||
        { cat "$WORK/out"; fail "run $run: fashion_mnist ended before training"; }
    sent=0
    # the next signal once the last one's dump is out, so that each lands on its own, mid-training
    while [ "$sent" -lt 30 ] && kill -USR1 "$pid" 2>/dev/null; do
        sent=$((sent + 1))
        lines_or_exit "$sent" "$dump" "$pid" "$WORK/out" || break
    done
    wait "$pid"
    rc=$?
    pid=""
    [ "$rc" = 0 ] || { cat "$WORK/out"; fail "run $run: fashion_mnist exited with status $rc after $sent SIGUSR1"; }
    n=$(grep -c "$dump" "$WORK/out")
    # the last signal may have come as the run ended, before its dump
    [ "$n" -ge 1 ] && [ "$n" -ge $((sent - 1)) ] || { cat "$WORK/out"; fail "run $run: $n dumps written for $sent SIGUSR1"; }
    grep -q "^epoch 1/1: train loss" "$WORK/out" || { cat "$WORK/out"; fail "run $run: no epoch line"; }
    echo "run $run: $sent SIGUSR1, $n dumps, exit 0"
done
"$CACCEL" trace analyze "$WORK/fr" > "$WORK/report" 2>&1 || { cat "$WORK/report"; fail "trace analyze"; }
grep -q "^  dump on demand (SIGUSR1): " "$WORK/report" || { cat "$WORK/report"; fail "the newest dump is not SIGUSR1's"; }
echo ok
