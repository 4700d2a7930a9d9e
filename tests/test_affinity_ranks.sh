#!/bin/sh
# enable_cpu_affinity on real processes: 2 ranks of `caccel launch --enable_cpu_affinity` are each bound to
# their own CPUs (disjoint sets, one thread each on a 2-CPU machine), and `caccel env` prints the same
# sets; under `mpirun --bind-to core` the ranks keep mpirun's binding and the log says so.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
need_backend gloo
RANK="$BUILD/tests/affinity_rank"
[ "$(nproc)" -ge 2 ] || skip "one CPU: 2 ranks cannot have disjoint sets"
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS

# the sets as CPU lists from "rank R: before X after Y threads T", sorted by rank
sets() { grep "^rank [0-9]*: before" "$1" | sort | sed 's/^rank \([0-9]*\): before .* after \([^ ]*\) threads \(.*\)$/\1 \2 \3/'; }

# cpus_of LIST: one CPU per line ("0-2,5" -> 0 1 2 5)
cpus_of() { echo "$1" | tr ',' '\n' | while IFS=- read -r a b; do seq "$a" "${b:-$a}"; done; }

note "caccel launch --enable_cpu_affinity --num_processes 2"
CACCEL_LOG_LEVEL=info timeout 120 "$CACCEL" launch --num_processes 2 --cpu --backend gloo --enable_cpu_affinity \
    "$RANK" > "$WORK/o" 2>&1 || { cat "$WORK/o"; fail "2 ranks with enable_cpu_affinity"; }
cat "$WORK/o"
sets "$WORK/o" > "$WORK/sets"
[ "$(wc -l < "$WORK/sets")" = 2 ] || fail "expected a line from each of the 2 ranks"
s0=$(sed -n 1p "$WORK/sets" | cut -d' ' -f2) s1=$(sed -n 2p "$WORK/sets" | cut -d' ' -f2)
[ -n "$s0" ] && [ -n "$s1" ] || fail "a rank reported no binding"
common=$( (cpus_of "$s0"; cpus_of "$s1") | sort | uniq -d)
[ -z "$common" ] || fail "ranks 0 ($s0) and 1 ($s1) share CPUs: $common"
# each rank's thread count follows its set (the launcher left OMP_NUM_THREADS to the ranks): a thread
# per core, so at least 1 and at most the set's PUs
while read -r r set threads; do
    [ "$threads" -ge 1 ] && [ "$threads" -le "$(cpus_of "$set" | wc -l)" ] || fail "rank $r: $threads threads for CPUs $set"
done < "$WORK/sets"
count 2 "enable_cpu_affinity (from [^)]*): local rank [01] of 2 bound to CPUs" "$WORK/o"

note "caccel env prints the topology and the same sets"
"$CACCEL" env --num_processes 2 --enable_cpu_affinity > "$WORK/env" 2>&1 || { cat "$WORK/env"; fail "caccel env"; }
grep -E "^CPU topology \(hwloc [0-9.]+\): [0-9]+ packages?, [0-9]+ NUMA nodes?, [0-9]+ cores?, [0-9]+ PUs?$" "$WORK/env" ||
    { cat "$WORK/env"; fail "caccel env: no topology line"; }
grep -q "^  local rank 0: CPUs $s0 (" "$WORK/env" || { cat "$WORK/env"; fail "caccel env: rank 0's set is not $s0"; }
grep -q "^  local rank 1: CPUs $s1 (" "$WORK/env" || { cat "$WORK/env"; fail "caccel env: rank 1's set is not $s1"; }

if command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1 && [ -e "$BUILD/collectives/.libs/caccel_mpi.so" ]; then
    note "mpirun --bind-to core: mpirun's binding is kept"
    MPI_TIMEOUT=120 run_mpi 2 --bind-to core -x CACCEL_LOG_LEVEL=info -x ACCELERATE_CPU_AFFINITY=true \
        -x CACCEL_PLUGIN_PATH "$RANK" --cpu > "$WORK/m" 2>&1 || { cat "$WORK/m"; fail "mpirun"; }
    cat "$WORK/m"
    whole="0-$(($(nproc) - 1))"
    if sets "$WORK/m" | grep -q . && ! grep -q "^rank [01]: before $whole after" "$WORK/m"; then
        count 2 "local rank [01] is already bound to CPUs .* (started by mpirun.*): keeping that binding" "$WORK/m"
        grep "^rank [01]: before" "$WORK/m" | while read -r _ r _ b _ a _; do
            [ "$b" = "$a" ] || fail "rank $r: mpirun bound it to $b, caccel moved it to $a"
        done || exit 1
    else
        echo "NOTE: mpirun did not bind the ranks here; nothing to defer to"
    fi
fi
echo "ok"
