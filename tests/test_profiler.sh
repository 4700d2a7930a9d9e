#!/bin/sh
# The profiler as users run it: `--profile --output_trace_dir DIR` on a training program (one rank,
# then 2 ranks under caccel launch over Gloo) writes DIR/trace_rank<r>.json in the Chrome
# trace-event format, with kernel slices (op, shapes, dtype, device, FLOPs), autograd's backward
# nodes, the allocator's counter track, dataloader waits, the checkpoint save, the lazy device's
# graph compiles and runs and, at 2 ranks,
# the collectives with the same sequence numbers on both; `caccel trace merge DIR` puts both ranks
# on one timeline and splits each collective into waiting for peers and moving data (not for ranks
# on different machines' clocks), and each rank's own trace holds the same split (the ranks exchange
# their issue times at the profile's end; under Gloo and MPI; not on two clocks); the schedule's keys come from the environment; an unwritable directory is
# refused at the start. The events are checked with python's json module (tests/profile_check.py);
# where Perfetto's trace processor (PyPI perfetto) imports and starts, the same facts are queried
# with it too, else that part says it is skipped.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
DDP="$BUILD/tests/ddp_check"
SRC=${CACCEL_TEST_SRCDIR:-$(dirname "$0")/..}
PY=""
for p in python3 /usr/bin/python3; do command -v "$p" >/dev/null 2>&1 && { PY=$p; break; }; done
[ -n "$PY" ] || skip "no python3 to read the traces"
CHECK_PY="$SRC/tests/profile_check.py"
export OPENBLAS_NUM_THREADS=1 CACCEL_LOG_LEVEL=info
PROF="--profile --profile_record_shapes true --profile_memory true --profile_with_flops true"

note "one rank: kernels, backward nodes, memory counter, dataloader waits, the checkpoint save"
# shellcheck disable=SC2086
"$DDP" --cpu --mode plain --batch 8 --steps 4 --save-state "$WORK/ck1" $PROF --output_trace_dir "$WORK/t1" \
    > "$WORK/o1" 2>&1 || { cat "$WORK/o1"; fail "profiled run"; }
count 1 "profiler: trace written to $WORK/t1/trace_rank0.json" "$WORK/o1"
"$PY" "$CHECK_PY" single "$WORK/t1/trace_rank0.json" || fail "trace of one rank"

note "the schedule from the environment: wait 1, warmup 1, active 1, repeat 1 records 1 of 4 steps"
CACCEL_PROFILE=true CACCEL_PROFILE_WAIT=1 CACCEL_PROFILE_WARMUP=1 CACCEL_PROFILE_ACTIVE=1 CACCEL_PROFILE_REPEAT=1 \
    CACCEL_OUTPUT_TRACE_DIR="$WORK/t3" "$DDP" --cpu --mode plain --batch 8 --steps 4 > "$WORK/o3" 2>&1 ||
    { cat "$WORK/o3"; fail "scheduled run"; }
"$PY" "$CHECK_PY" steps "$WORK/t3/trace_rank0.json" 1 || fail "schedule"

note "the lazy device (--tpu): its graph compiles and runs"
"$DDP" --tpu --mode plain --batch 8 --steps 3 --profile --output_trace_dir "$WORK/t5" > "$WORK/o5" 2>&1 ||
    { cat "$WORK/o5"; fail "profiled run on the lazy device"; }
"$PY" "$CHECK_PY" names "$WORK/t5/trace_rank0.json" xla_compile xla_execute dataloader_wait || fail "lazy device trace"

note "an output_trace_dir below a regular file is refused before training, naming it"
: > "$WORK/afile"
if "$DDP" --cpu --mode plain --batch 8 --steps 1 --profile --output_trace_dir "$WORK/afile/t" > "$WORK/o4" 2>&1; then
    fail "an unwritable output_trace_dir was accepted"
fi
count 1 "output_trace_dir '$WORK/afile/t' cannot be created" "$WORK/o4"

if have gloo; then
    note "2 ranks under caccel launch (Gloo): collectives with their sequence numbers; caccel trace merge"
    # shellcheck disable=SC2086
    launch 2 gloo $PROF --output_trace_dir "$WORK/t2" "$DDP" --mode plain --batch 8 --steps 4 --save-state "$WORK/ck2" \
        > "$WORK/o2" || { cat "$WORK/o2"; fail "2 ranks profiled"; }
    "$CACCEL" trace merge "$WORK/t2" > "$WORK/om" 2>&1 || { cat "$WORK/om"; fail "caccel trace merge"; }
    count 1 "merged 2 ranks into $WORK/t2/trace_merged.json" "$WORK/om"
    "$PY" "$CHECK_PY" ranks "$WORK/t2" 2 || fail "traces of 2 ranks"
    count 1 "^caccel trace: [1-9][0-9]* collective slices split into waiting for peers and moving data" "$WORK/om"
    # each rank's own trace: the same split, from the issue times the ranks exchanged at the end
    "$PY" "$CHECK_PY" own "$WORK/t2" 2 || fail "the ranks' own traces (Gloo)"
    # a rank on another clock (the test hook stands for another machine's boot id): nothing split
    launch 2 gloo --profile --output_trace_dir "$WORK/t2c" sh -c \
        '[ "$RANK" = 1 ] && export CACCEL_TEST_BOOT_ID=0000-ffff; exec "$0" "$@"' "$DDP" --mode plain --batch 8 --steps 2 \
        > "$WORK/o2c" || { cat "$WORK/o2c"; fail "2 ranks on two clocks"; }
    "$PY" "$CHECK_PY" unsplit "$WORK/t2c" 2 || fail "the ranks' own traces on two clocks"
    # ranks on different clocks (another boot_id: another machine) are merged but not split
    mkdir -p "$WORK/t2b"
    cp "$WORK/t2/trace_rank0.json" "$WORK/t2b/"
    sed 's/"boot_id":"[^"]*"/"boot_id":"another-machine"/' "$WORK/t2/trace_rank1.json" > "$WORK/t2b/trace_rank1.json"
    "$CACCEL" trace merge "$WORK/t2b" > "$WORK/omb" 2>&1 || { cat "$WORK/omb"; fail "merge of two clocks"; }
    count 1 "split into waiting for peers and moving data (peers_wait_us, transfer_us); [1-9][0-9]* not: a rank's record missing or the ranks on different machines' clocks" "$WORK/omb"
    grep -q peers_wait_us "$WORK/t2b/trace_merged.json" && fail "collectives of two clocks were split"
else
    echo "skipped-part: 2 ranks (the Gloo plugin was not built)"
fi
if have mpi && command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1; then
    note "2 ranks under mpirun (MPI): caccel trace merge splits each collective"
    # shellcheck disable=SC2086
    launch 2 mpi "$DDP" --mode plain --batch 8 --steps 2 --profile --output_trace_dir "$WORK/t6" > "$WORK/o6" ||
        { cat "$WORK/o6"; fail "2 ranks profiled under MPI"; }
    "$CACCEL" trace merge "$WORK/t6" > "$WORK/om6" 2>&1 || { cat "$WORK/om6"; fail "caccel trace merge (MPI)"; }
    count 1 "^caccel trace: [1-9][0-9]* collective slices split into waiting for peers and moving data" "$WORK/om6"
    "$PY" "$CHECK_PY" split "$WORK/t6/trace_merged.json" || fail "MPI's collectives split"
    "$PY" "$CHECK_PY" own "$WORK/t6" 2 || fail "the ranks' own traces (MPI)"
else
    echo "skipped-part: 2 ranks under MPI (the MPI plugin or mpirun is missing)"
fi
"$CACCEL" trace merge "$WORK/nothing" > "$WORK/on" 2>&1 && fail "merge of a missing directory succeeded"
count 1 "cannot open directory '$WORK/nothing'" "$WORK/on"

if "$PY" -c 'from perfetto.trace_processor import TraceProcessor' 2>/dev/null; then
    "$PY" - "$WORK/t1/trace_rank0.json" > "$WORK/op" 2>&1 <<'PY'
import sys
from perfetto.trace_processor import TraceProcessor
try:
    tp = TraceProcessor(trace=sys.argv[1])
except Exception as e:  # the package fetches its trace_processor_shell binary at run time
    print("cannot start: %s" % e)
    sys.exit(77)
def n(q):
    return next(iter(tp.query(q))).n
assert n("select count(*) as n from slice where name = 'gemm'") > 0
assert n("select count(*) as n from slice where name like '%Backward'") > 0
assert n("select count(*) as n from counter_track where name like 'memory%'") > 0
print("ok: perfetto trace processor")
PY
    rc=$?
    if [ $rc = 77 ]; then echo "skipped-part: Perfetto trace processor query ($(cat "$WORK/op"))"
    elif [ $rc != 0 ]; then cat "$WORK/op"; fail "Perfetto trace processor query"
    else cat "$WORK/op"; fi
else
    echo "skipped-part: Perfetto trace processor query (python's perfetto package is not installed)"
fi
echo "PASS"
