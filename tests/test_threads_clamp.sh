#!/bin/sh
# A thread count above the CPUs the process may use is clamped, with one warning naming the count, its
# source and the limit (docs/ARCHITECTURE.md, "Threads on the CPU"): under `taskset -c C` (one CPU)
# OMP_NUM_THREADS=2 gives 1 kernel thread, as `caccel env`'s device description says; the launcher's
# --num_cpu_threads_per_process is named as such. (The cgroup quota parser: tests/test_cpu_parallel.c.)
set -u
b=${CACCEL_TEST_BUILDDIR:-.}
CACCEL="$b/tools/caccel"
fail() { echo "FAIL: $*"; exit 1; }
command -v taskset > /dev/null || { echo "SKIP: no taskset (util-linux)"; exit 77; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/caccel-clamp.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
unset OPENBLAS_NUM_THREADS CACCEL_NUM_CPU_THREADS_PER_PROCESS
cpu=$(taskset -pc $$ | sed 's/.*: *//; s/[-,].*//')   # the first CPU this test may run on
taskset -c "$cpu" true || { echo "SKIP: cannot bind to CPU $cpu"; exit 77; }
[ "$(nproc --all)" -ge 2 ] || { echo "SKIP: one CPU online: nothing to clamp"; exit 77; }

OMP_NUM_THREADS=2 taskset -c "$cpu" "$CACCEL" env > "$WORK/out" 2> "$WORK/err" || { cat "$WORK/out" "$WORK/err"; fail "caccel env failed"; }
desc=$(grep '^CPU device:' "$WORK/out")
echo "$desc" | grep -o '[0-9]* kernel threads[^;]*'
echo "$desc" | grep -q '; 1 kernel threads (clamped from 2 (OMP_NUM_THREADS): affinity mask allows 1 CPU)' ||
    fail "the description does not show 1 kernel thread, clamped: $desc"
grep 'cpu: ' "$WORK/err"
n=$(grep -c 'cpu: 2 threads requested (OMP_NUM_THREADS), but affinity mask allows 1 CPU: using 1' "$WORK/err")
[ "$n" -eq 1 ] || { cat "$WORK/err"; fail "expected the warning once, got it $n times"; }

# with 2 CPUs to run on, the count is taken as asked and nothing is said (unless a cgroup quota of
# 1 CPU holds this test, which the warning then names)
if [ "$(nproc)" -ge 2 ]; then
    OMP_NUM_THREADS=2 "$CACCEL" env > "$WORK/out" 2> "$WORK/err" || fail "caccel env failed"
    if grep -q 'but cgroup .* = 1 CPU: using 1' "$WORK/err"; then
        echo "(a cgroup quota of 1 CPU here: $(grep 'threads requested' "$WORK/err"))"
    else
        grep -q '; 2 kernel threads;' "$WORK/out" || { grep '^CPU device:' "$WORK/out"; fail "OMP_NUM_THREADS=2 not taken on 2 CPUs"; }
        grep -q 'threads requested' "$WORK/err" && { cat "$WORK/err"; fail "warned without a restriction"; }
    fi
fi

# the launcher's count is named as the launcher's
taskset -c "$cpu" "$CACCEL" launch -q --num_processes 1 --num_cpu_threads_per_process 2 --cpu "$CACCEL" env \
    > "$WORK/out" 2> "$WORK/err" || { cat "$WORK/out" "$WORK/err"; fail "caccel launch ... caccel env failed"; }
grep -q "cpu: 2 threads requested (caccel launch's num_cpu_threads_per_process), but affinity mask allows 1 CPU: using 1" \
    "$WORK/out" "$WORK/err" || { cat "$WORK/out" "$WORK/err"; fail "the launcher's count not named"; }
echo ok
