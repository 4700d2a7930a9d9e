#!/bin/sh
# The CPU kernels' parallel paths (docs/ARCHITECTURE.md, "Threads on the CPU") against the same
# references as their serial ones: the op conformance table (with finite differences; its xla column is
# the lazy device, whose executor runs these kernels and whose fused loops, copies and host transfers
# split on the same threads), the kernel, cast and GEMM tests (GEMMs split in blocks of rows or columns),
# the lazy device's own tests, autograd, the layers, the transformer ops, mixed precision, activation checkpointing,
# BERT, and GPT's activation-checkpointing equivalence (losses identical with and without the
# recompute, on 1 and 2 processes), each at 2 and 3 threads with CACCEL_CPU_GRAIN=1, so that every loop of every kernel
# splits even on these tests' small shapes (3 threads: ranges of unequal length). One thread is the
# serial path, which the suite runs anyway. Under the sanitizers (CACCEL_TEST_SANITIZED=yes) only 3
# threads run: unequal ranges are where an index would go out of bounds, and data races are not what
# AddressSanitizer finds. Last, CACCEL_CPU_TEAMS=1's tallies of the kernel loops' and GEMMs' teams at exit,
# and CACCEL_CPU_TEAMS_LOG's timed records of them.
set -u
b=${CACCEL_TEST_BUILDDIR:-.}
s=$(cd "$(dirname "$0")" && pwd)
fail() { echo "FAIL: $*"; exit 1; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/caccel-threads.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export CACCEL_CPU_GRAIN=1

threads="2 3"
[ "${CACCEL_TEST_SANITIZED:-no}" != yes ] || threads=3
for t in $threads; do
    echo "== $t thread(s), CACCEL_CPU_GRAIN=1"
    for p in test_ops test_cpu_kernels test_cpu_cast test_cpu_gemm test_xla test_autograd test_nn \
             test_transformer_ops test_mixed_precision test_actckpt test_bert; do
        [ -x "$b/tests/$p" ] || fail "tests/$p is not built"
        OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t "$b/tests/$p" > "$WORK/log" 2>&1 ||
            { tail -40 "$WORK/log"; fail "tests/$p at $t thread(s)"; }
        echo "  $p: ok"
    done
    # where this machine clamps the count (an affinity mask, a cgroup quota), say so
    OMP_NUM_THREADS=$t "$b/tools/caccel" env 2>/dev/null | grep -q "; $t kernel threads" ||
        echo "  (this machine runs fewer than $t kernel threads: $(OMP_NUM_THREADS=$t "$b/tools/caccel" env 2>/dev/null |
            grep -o '[0-9]* kernel threads[^;]*'))"
    if [ -f "${CACCEL_FORTUNES_DIR:-/usr/share/games/fortunes}/science" ]; then
        OMP_NUM_THREADS=$t sh "$s/test_actckpt_gpt.sh" > "$WORK/log" 2>&1 ||
            { tail -40 "$WORK/log"; fail "tests/test_actckpt_gpt.sh at $t thread(s)"; }
        echo "  test_actckpt_gpt.sh: ok"
    fi
done
# CACCEL_CPU_TEAMS=1: at exit, how many kernel loops and library GEMMs ran on how many threads
out=$(CACCEL_CPU_TEAMS=1 OMP_NUM_THREADS=3 OPENBLAS_NUM_THREADS=3 "$b/tests/test_cpu_kernels" 2>&1)
echo "$out" | grep '^caccel cpu teams: kernel'
echo "$out" | grep -q '^caccel cpu teams: kernel loops by threads: .*3=[1-9]' || fail "no tally of 3-thread kernel loops"
out=$(CACCEL_CPU_TEAMS=1 OMP_NUM_THREADS=3 OPENBLAS_NUM_THREADS=3 "$b/tests/test_cpu_gemm" 2>&1)
echo "$out" | grep '^caccel cpu teams: library'
echo "$out" | grep -q '^caccel cpu teams: library GEMMs by threads: .*3=[1-9]' || fail "no tally of library GEMMs"
# CACCEL_CPU_TEAMS_LOG=FILE: each fork-join (L, S) and threaded library GEMM (G) timed, written at exit; a
# record's busy time fits its team and length, its one-thread time its length and its busy time
for t in test_cpu_kernels test_cpu_gemm; do
    rm -f "$WORK/teams"
    CACCEL_CPU_TEAMS_LOG="$WORK/teams" OMP_NUM_THREADS=3 OPENBLAS_NUM_THREADS=3 "$b/tests/$t" > /dev/null 2>&1 ||
        fail "$t with CACCEL_CPU_TEAMS_LOG"
    awk -v t="$t" 'NR == 1 && !/^# caccel cpu teams log/ { print "no header"; bad = 1 }
        NR > 1 && $1 != "G" { n[$1 $4]++; len = $3 - $2
            if (len < 0 || $5 < 0 || $6 < 0 || $5 > $4 * len + 1e-6 || $6 > len + 1e-6 || $6 > $5 + 1e-6) {
                print "bad record: " $0; bad = 1 } }
        NR > 1 && $1 == "G" { n["G" $4]++; if ($3 < $2 || $5 != "-") { print "bad record: " $0; bad = 1 } }
        END { if (t == "test_cpu_kernels" && !n["L3"]) { print "no 3-thread kernel loop"; bad = 1 }
              if (t == "test_cpu_gemm" && !n["G3"] && !n["S3"]) { print "no 3-thread GEMM"; bad = 1 }
              for (k in n) printf "  %s %s: %d\n", t, k, n[k]; exit bad }' "$WORK/teams" ||
        fail "CACCEL_CPU_TEAMS_LOG of $t"
done
echo ok
