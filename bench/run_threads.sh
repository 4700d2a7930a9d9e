#!/usr/bin/env bash
# Thread scaling of the CPU backend against PyTorch: each workload at each thread count in a list, caccel,
# PyTorch eager and PyTorch torch.compile alternating, medians of REPS runs; then a table of throughputs,
# caccel/PyTorch ratios and the 1 -> k thread scaling, and each caccel step's serial fraction with its
# Amdahl projection to 16 and 64 cores. Nothing here is asserted by a test.
#
# Workloads (--parts, comma-separated):
#   gpt   examples/gpt's training tokens/s at 4 x 128 (4 heads), T 64, batch 32 and at 6 x 384 (6 heads),
#         T 256, batch 8, against the PyTorch GPT of tests/test_gpt_parity.sh (bench/peers/torch_transformer.py);
#         gpt-small and gpt-large: one of the two shapes alone;
#   bert  a BERT fine-tune step at all-MiniLM-L6-v2's shape, T 128, batch 8 (bench_transformer bert) against
#         transformers' BertForSequenceClassification;
#   mlp   the 784-256-128-10 MLP, one Fashion-MNIST epoch at batch 16 and 128 (bench_mlp, bench/peers/torch_mlp.py);
#   xla   the same MLP on the lazy xla device (bench_xla, synthetic inputs), set against the PyTorch MLP rows.
# Threads: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS for caccel (one OpenMP team, backends/cpu/cpu_parallel.h),
# torch.set_num_threads (and the same variables) for PyTorch.
# GEMM peak: examples/gpt prints its MFU against the peak its GEMM probe measured on this machine at this thread
# count; the GPT rows' median MFU gives the highest caccel/torch ratio any implementation of the step could
# reach here (caccel/torch / MFU: every operation at the best GEMM's rate), so that a ratio target above it is
# reported as the hardware's, not chased.
# Teams: with the GPT 4 x 128 in the parts, one short run of it at each thread count with CACCEL_CPU_TEAMS=1
# prints (at the end) how many kernel loops and library GEMMs ran on how many threads (the rules of
# backends/cpu/cpu_parallel.h and cpu_gemm_split.c).
# OpenBLAS's kernels: where `caccel env` warns that OpenBLAS chose kernels below the CPU's (an unknown CPU
# model) and OPENBLAS_CORETYPE is unset, the core it names is exported for every run (as `caccel launch`
# does for its workers), with a note.
#
# Serial fraction f (work done while one thread runs and the others wait, over all the work):
#   profile  where `perf record` works: each caccel step at 1 and at PROFILE_THREADS threads (default 2) under
#            perf record -e cpu-clock[:u] --switch-events (+ sched:sched_wakeup where permitted) -k
#            CLOCK_MONOTONIC, the samples inside the timed loop only (the bench programs print its window
#            with BENCH_WINDOWS=1; examples/gpt's two log lines bound it), and the caccel trace of the same run
#            (CACCEL_PROFILE). bench/serial_profile.py rebuilds each thread's time line from its own samples
#            and switches (working; waiting in libgomp or a yield; asleep; preempted) and sweeps them: the
#            work of a stretch with one busy thread is serial (a preempted thread's catch-up excepted), f =
#            serial / all work; the same over the gemm kernel calls gives the GEMMs' own f; the serial
#            time by function and by kernel call, and the work at n threads against 1, are printed too.
#            PyTorch's eager steps (gpt, bert) are profiled the same way at PROFILE_THREADS threads (the peer
#            prints its window with BENCH_WINDOWS=1; PROFILE_TORCH=0 skips them): its f beside caccel's.
#   timed    with the profile: caccel's own fork-joins timed instead of sampled (CACCEL_CPU_TEAMS_LOG: each
#            thread's start and end in every kernel loop), the calling thread's time outside any team
#            serial, the insides of the threaded library GEMMs from the samples (serial_profile.py --teams);
#            and each profiled caccel step once more without perf or a trace, timed alone ("no perf": the
#            GEMMs' insides at the profile's GEMM f), since the sampling's interrupts stretch joins too.
#   fit      always: from the measured speed-up s_k at k threads, Amdahl's f = (k / s_k - 1) / (k - 1).
#   Projection: speed-up(N) = 1 / (f + (1 - f) / N) for N = 16 and 64.
#
# usage: run_threads.sh [--build DIR] [--threads "1 2"] [--reps N] [--parts gpt,bert,mlp,xla] [--quick]
# Environment (defaults): THREADS ("1 2"), REPS (3), PARTS (gpt,bert,mlp,xla), QUICK (0: 1 = few steps, to see
# that everything runs; not for results), TORCH_PYTHON (python3: the interpreter with torch and transformers),
# TORCH_COMPILE (1; 0 skips the torch.compile runs), PROFILE_THREADS (2), PROFILE (1; 0 skips perf), PROFILE_TORCH (1),
# PROFILE_REPS (3: profiles at PROFILE_THREADS threads, the median kept),
# CACCEL_DATA_DIR (fashion-mnist's parent, default /usr/share/datasets), CACCEL_FORTUNES_DIR (examples/gpt's data).
# DIR (default .) is the build directory holding examples/gpt, bench/bench_transformer, bench/bench_mlp and
# bench/bench_xla (`make bench-threads` builds them and passes it); a part whose program or data is missing is
# skipped with a note. A 16-core machine without Debian packages (python3 with torch and transformers, no perf):
#   THREADS="1 2 4 8 16" TORCH_PYTHON=python3 bash bench/run_threads.sh --build DIR
# where DIR is what bench/stage_threads.sh copied from a build (the programs themselves, their libraries and the
# data), with LD_LIBRARY_PATH=DIR/lib CACCEL_FORTUNES_DIR=DIR/fortunes (and CACCEL_DATA_DIR=DIR if staged with
# --data; else the mlp part is skipped); without perf only the fit is printed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=. threads=${THREADS:-1 2} reps=${REPS:-3} parts=${PARTS:-gpt,bert,mlp,xla} quick=${QUICK:-0}
while [ $# -gt 0 ]; do
    case $1 in
        --build) build=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --parts) parts=$2; shift 2 ;;
        --quick) quick=1; shift ;;
        *) echo "run_threads.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
threads=${threads//,/ }
py=${TORCH_PYTHON:-python3}
compile=${TORCH_COMPILE:-1}
pthreads=${PROFILE_THREADS:-2}
data=${CACCEL_DATA_DIR:-/usr/share/datasets}/fashion-mnist
gpt=$build/examples/gpt bert=$build/bench/bench_transformer mlp=$build/bench/bench_mlp xla=$build/bench/bench_xla
# steps: the GPT's timed steps are the second half of its log (as run_transformer.sh)
if [ "$quick" = 1 ]; then gpt_small=8 gpt_large=4 bert_steps=1 xla_steps=30; else gpt_small=40 gpt_large=6 bert_steps=5 xla_steps=300; fi
has() { case ",$parts," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
gpt_shapes=()
if has gpt || has gpt-small; then gpt_shapes+=("4 4 128 64 32 $gpt_small"); fi
if has gpt || has gpt-large; then gpt_shapes+=("6 6 384 256 8 $gpt_large"); fi
[ ${#gpt_shapes[@]} = 0 ] || parts=$parts,gpt

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$tmp/rows
: > "$out"
note() { echo "# $*" | tee -a "$tmp/notes" >&2; }
# Skip what cannot run here, saying why.
for p in gpt bert mlp xla; do
    has $p || continue
    prog=${!p}
    [ -x "$prog" ] || { note "$p: skipped, $prog not built"; parts=${parts//$p/}; }
done
if has mlp && [ ! -e "$data/train-images-idx3-ubyte.gz" ]; then
    note "mlp: skipped, no Fashion-MNIST in $data (CACCEL_DATA_DIR)"; parts=${parts//mlp/}
fi
torch_ok=1
if ! $py -c "import torch, transformers" 2>/dev/null; then
    note "PyTorch peers skipped: $py cannot import torch and transformers (TORCH_PYTHON)"; torch_ok=0
fi

# row IMPL MODEL THREADS CMD...: runs CMD, appends its key=value rows; a failing run is one status=failed row.
row() {
    local impl=$1 model=$2 t=$3; shift 3
    local rc=0 before
    before=$(wc -l < "$out")
    "$@" >> "$out" 2>> "$tmp/stderr" || rc=$?
    if [ $rc != 0 ]; then
        echo "impl=$impl model=$model threads=$t status=failed reason=exit_status_$rc" >> "$out"
        note "$impl $model at $t threads failed: $(tail -1 "$tmp/stderr")"
    fi
    # each row as it comes, on stderr: a run cut short by a timeout still shows what it measured
    tail -n +"$((before + 1))" "$out" | sed 's/^/# row /' >&2
}
gpt_caccel() {   # L H C T B N: examples/gpt's second-half tokens/s (and MFU, where it prints one) as a row
    local log tps mfu
    log=$("$gpt" --cpu --n_layer "$1" --n_head "$2" --n_embd "$3" --block_size "$4" --batch_size "$5" \
          --max_steps "$6" --log_interval $(($6 / 2)) --eval_interval 0 --eval_samples 4 --sample_tokens 0)
    tps=$(sed -n 's/.* \([0-9.]*\) tokens\/s$/\1/p' <<< "$log" | tail -1)
    mfu=$(sed -n 's/^throughput: .*MFU \([0-9.]*\)% of .*/\1/p' <<< "$log" | tail -1)
    [ -n "$tps" ] || return 1
    echo "impl=caccel model=gpt shape=${1}x${2}x${3}xT${4} batch=$5 threads=$t tokens_per_s=$tps${mfu:+ mfu_pct=$mfu}"
}
xla_caccel() {   # bench_xla's MLP table (batch, cpu samples/s, xla samples/s, ...) as rows
    "$xla" --batch-sizes 16,128 --steps "$xla_steps" --reps 1 |
        awk -v t="$t" '/^ *batch /{on=1; next} on && NF==0 {exit}
                       on {print "impl=caccel model=xla-mlp batch=" $1 " threads=" t " samples_per_s=" $3
                           " eager_samples_per_s=" $2}'
}
peers() {   # IMPL-suffix flags: the torch runs of one part, eager then compiled
    local model=$1; shift
    [ "$torch_ok" = 1 ] || return 0
    row torch "$model" "$t" "$py" "$@"
    if [ "$compile" = 1 ] && [ ! -e "$tmp/compile-failed-$model" ]; then
        row torch-compile "$model" "$t" "$py" "$@" --compile
        # one failure (a missing compiler, an unsupported op) is reported once, not retried every run
        if grep -q "impl=torch-compile model=$model .*status=failed" "$out"; then : > "$tmp/compile-failed-$model"; fi
    fi
}

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(getconf _NPROCESSORS_ONLN) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), threads $threads, medians of $reps$([ "$quick" = 1 ] && echo ', QUICK (few steps: not results)')"
if [ -x "$build/tools/caccel" ]; then
    hint=$("$build/tools/caccel" env 2>&1 | sed -n 's/.*OpenBLAS chose its .* set OPENBLAS_CORETYPE=\([A-Za-z]*\) .*/\1/p' | head -1)
    if [ -n "$hint" ] && [ -z "${OPENBLAS_CORETYPE:-}" ]; then
        export OPENBLAS_CORETYPE=$hint
        note "OpenBLAS chose kernels below this CPU's: OPENBLAS_CORETYPE=$hint for every run"
    fi
    "$build/tools/caccel" env 2>/dev/null | grep '^CPU device' | sed 's/^/# /' || true
fi
if [ "$torch_ok" = 1 ]; then
    $py -c "import torch, transformers as t; b = [l for l in torch.__config__.parallel_info().splitlines() if 'backend' in l]; print(f'# torch {torch.__version__}, transformers {t.__version__}', *b[:1], sep=', ')" || true
fi
for t in $threads; do
    export OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t
    for r in $(seq "$reps"); do
        if has gpt; then
            for s in "${gpt_shapes[@]}"; do
                read -r L H C T B N <<< "$s"
                row caccel gpt "$t" gpt_caccel "$L" "$H" "$C" "$T" "$B" "$N"
                peers gpt "$here/peers/torch_transformer.py" gpt --threads "$t" --n_layer "$L" --n_head "$H" \
                    --n_embd "$C" --block_size "$T" --batch_size "$B" --steps $((N / 2))
            done
        fi
        if has bert; then
            row caccel bert "$t" "$bert" bert --batch-sizes 8 --steps "$bert_steps"
            peers bert "$here/peers/torch_transformer.py" bert --threads "$t" --batch-sizes 8 --steps "$bert_steps"
        fi
        if has mlp; then
            row caccel mlp "$t" "$mlp" --batch-sizes 16,128
            peers mlp "$here/peers/torch_mlp.py" --threads "$t" --batch-sizes 16,128 --data "$data"
        fi
        if has xla; then row caccel xla-mlp "$t" xla_caccel; fi
    done
done

# The teams of the GPT 4 x 128 (CACCEL_CPU_TEAMS=1): a short run at each thread count, its tallies kept for
# the end of the report.
: > "$tmp/teams"
if has gpt && [ "${gpt_shapes[0]%% *}" = 4 ]; then
    read -r L H C T B N <<< "${gpt_shapes[0]}"
    for t in $threads; do
        OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t CACCEL_CPU_TEAMS=1 "$gpt" --cpu --n_layer "$L" --n_head "$H" \
            --n_embd "$C" --block_size "$T" --batch_size "$B" --max_steps 4 --log_interval 2 --eval_interval 0 \
            --eval_samples 4 --sample_tokens 0 2>&1 > /dev/null | sed -n "s/^caccel cpu teams: /# gpt ${L}x${C} T$T b$B, 4 steps, $t threads: /p" >> "$tmp/teams" || true
    done
fi

# The profile: each caccel step under perf at 1 thread (the work the speed-up divides) and at $pthreads
# threads (the serial stretches), the samples inside its timed window kept (bench/serial_profile.py).
# stdout passes through a stamper (the monotonic time of each line's arrival: examples/gpt flushes its log
# lines, which bound its window); the bench programs print their windows on stderr. A program on the
# accelerator also writes its trace (CACCEL_PROFILE, docs/PROFILING.md): the serial time per kernel call.
cat > "$tmp/stamp.py" <<'PY'
import sys, time
for line in sys.stdin:
    print(f"{time.monotonic():.6f} {line}", end="", flush=True)
PY
period=100000   # ns of a thread's CPU time per sample
# user-space samples (perf_event_paranoid 2 allows them); the kernel's too where permitted (root, paranoid
# <= 1: a thread's page faults and system calls are then its work, or its waiting inside sched_yield)
clock=cpu-clock:u
if perf record -q -e cpu-clock -o "$tmp/probe.data" -- true > /dev/null 2>&1; then clock=cpu-clock; fi
perf_events=(-e "$clock" -c "$period" --switch-events)
# where the kernel's tracepoints may be read (root, or paranoid <= -1): when a blocked thread was woken, so
# that its wait for a CPU on a busy machine counts as a stall, not as sleep
if perf record -q -e sched:sched_wakeup -o "$tmp/probe.data" -- true > /dev/null 2>&1; then
    perf_events+=(-e sched:sched_wakeup)
fi
profile() {   # NAME THREADS CMD...: $tmp/NAME.json from serial_profile.py (windows in $tmp/NAME.windows)
    local name=$1 nt=$2; shift 2
    rm -f "$tmp/$name.teams"
    if ! BENCH_WINDOWS=1 OPENBLAS_NUM_THREADS=$nt OMP_NUM_THREADS=$nt CACCEL_PROFILE=true \
        CACCEL_CPU_TEAMS_LOG="$tmp/$name.teams" \
        CACCEL_PROFILE_RECORD_SHAPES=true CACCEL_OUTPUT_TRACE_DIR="$tmp/$name.trace" \
        perf record -q "${perf_events[@]}" -k CLOCK_MONOTONIC -o "$tmp/$name.data" -- "$@" \
        2> "$tmp/$name.err" | python3 -u "$tmp/stamp.py" > "$tmp/$name.out"; then
        note "profile of $name failed: $(tail -1 "$tmp/$name.err")"
        return 0
    fi
    grep '^# window ' "$tmp/$name.err" > "$tmp/$name.windows" || true
}
analyse() {   # NAME
    local name=$1 trace=()
    [ -s "$tmp/$name.windows" ] || { note "profile of $name: no timed window found"; return 0; }
    [ -f "$tmp/$name.trace/trace_rank0.json" ] && trace=(--trace "$tmp/$name.trace/trace_rank0.json")
    [ -s "$tmp/$name.teams" ] && trace+=(--teams "$tmp/$name.teams")
    python3 "$here/serial_profile.py" --data "$tmp/$name.data" --windows "$tmp/$name.windows" \
        --period-ns "$period" --top 8 "${trace[@]}" > "$tmp/$name.json" ||
        note "profile of $name: serial_profile.py failed"
    rm -f "$tmp/$name.data" "$tmp/$name.teams"
}
unprofiled() {   # NAME THREADS CMD...: the profiled run NAME again without perf or a trace, its fork-joins logged
    local name=$1 nt=$2; shift 2   # (CACCEL_CPU_TEAMS_LOG): the timed f of the program itself, the threaded
    local u=$name.noperf           # GEMMs' insides at NAME's GEMM f; kept in NAME.json as "timed_noperf"
    [ -s "$tmp/$name.json" ] || return 0
    rm -f "$tmp/$u.teams"
    if ! BENCH_WINDOWS=1 OPENBLAS_NUM_THREADS=$nt OMP_NUM_THREADS=$nt CACCEL_CPU_TEAMS_LOG="$tmp/$u.teams" "$@" \
        2> "$tmp/$u.err" | python3 -u "$tmp/stamp.py" > "$tmp/$u.out"; then
        note "unprofiled run of $name failed: $(tail -1 "$tmp/$u.err")"
        return 0
    fi
    if grep -q '^# window ' "$tmp/$u.err"; then grep '^# window ' "$tmp/$u.err" > "$tmp/$u.windows"; else gpt_window "$u"; fi
    python3 - "$here/serial_profile.py" "$tmp/$name.json" "$tmp/$u" <<'PY' || note "unprofiled run of $name: not analysed"
import json, subprocess, sys
sp, js, u = sys.argv[1:]
prof = json.load(open(js))
for batch, p in prof.items():
    g = p.get("gemm_f")
    if g is None or g != g:
        continue
    out = subprocess.run([sys.executable, sp, "--teams", u + ".teams", "--gemm-f", str(g), "--windows", u + ".windows"],
                         check=True, capture_output=True, text=True).stdout
    t = json.loads(out).get(batch, {}).get("timed")
    if t:
        p["timed_noperf"] = t
json.dump(prof, open(js, "w"))
PY
    rm -f "$tmp/$u.teams"
}
gpt_window() {   # NAME: examples/gpt's timed half, between its first and its last log line
    awk '/tokens\/s$/ {if (!a) a = $1; b = $1} END {if (a && b > a) print "# window gpt batch=0 from=" a " to=" b}' \
        "$tmp/$1.out" > "$tmp/$1.windows"
}
torch_profiled() {   # NT: whether PyTorch's steps are profiled at NT threads beside caccel's
    [ "$torch_ok" = 1 ] && [ "${PROFILE_TORCH:-1}" = 1 ] && [ "$1" -gt 1 ]
}
profile_all() {   # NT SUFFIX: every part's caccel step at NT threads as NAME-tNT.SUFFIX, each GPT and BERT step
    local nt=$1 sx=$2 name   # followed by PyTorch's (torch-NAME) where torch_profiled: its f is set beside caccel's
    if has gpt; then
        for s in "${gpt_shapes[@]}"; do
            read -r L H C T B N <<< "$s"
            name=gpt-${L}x${H}x${C}xT${T}-t$nt$sx
            profile "$name" "$nt" "$gpt" --cpu --n_layer "$L" --n_head "$H" --n_embd "$C" --block_size "$T" \
                --batch_size "$B" --max_steps "$N" --log_interval $((N / 2)) --eval_interval 0 \
                --eval_samples 4 --sample_tokens 0
            gpt_window "$name"
            analyse "$name"
            [ "$nt" -gt 1 ] && unprofiled "$name" "$nt" "$gpt" --cpu --n_layer "$L" --n_head "$H" --n_embd "$C" \
                --block_size "$T" --batch_size "$B" --max_steps "$N" --log_interval $((N / 2)) --eval_interval 0 \
                --eval_samples 4 --sample_tokens 0
            torch_profiled "$nt" || continue
            profile "torch-$name" "$nt" "$py" "$here/peers/torch_transformer.py" gpt --threads "$nt" --n_layer "$L" \
                --n_head "$H" --n_embd "$C" --block_size "$T" --batch_size "$B" --steps $((N / 2))
            analyse "torch-$name"
        done
    fi
    if has bert; then
        profile "bert-t$nt$sx" "$nt" "$bert" bert --batch-sizes 8 --steps "$bert_steps"
        analyse "bert-t$nt$sx"
        [ "$nt" -gt 1 ] && unprofiled "bert-t$nt$sx" "$nt" "$bert" bert --batch-sizes 8 --steps "$bert_steps"
        if torch_profiled "$nt"; then
            profile "torch-bert-t$nt$sx" "$nt" "$py" "$here/peers/torch_transformer.py" bert --threads "$nt" \
                --batch-sizes 8 --steps "$bert_steps"
            analyse "torch-bert-t$nt$sx"
        fi
    fi
    if has mlp; then profile "mlp-t$nt$sx" "$nt" "$mlp" --batch-sizes 16,128; analyse "mlp-t$nt$sx"; fi
    if has xla; then
        profile "xla-mlp-t$nt$sx" "$nt" "$xla" --batch-sizes 16,128 --steps "$xla_steps" --reps 1
        analyse "xla-mlp-t$nt$sx"
    fi
}
if [ "${PROFILE:-1}" = 1 ] && command -v perf > /dev/null &&
   perf record -q "${perf_events[@]}" -k CLOCK_MONOTONIC -o "$tmp/probe.data" -- true > /dev/null 2>&1; then
    # at 1 thread once (the work the speed-up divides; nothing is serial there); at $pthreads threads
    # PROFILE_REPS times, caccel and PyTorch alternating, each profile's median run by f kept as NAME.json
    # (a short window's f moves by a few points with the host's noise), with every run's f beside it
    if [ "$pthreads" -gt 1 ]; then profile_all 1 ""; fi
    preps=${PROFILE_REPS:-3}
    for r in $(seq "$preps"); do profile_all "$pthreads" ".r$r"; done
    python3 - "$tmp" "$preps" <<'PY'
import glob, json, os, sys
tmp, reps = sys.argv[1], int(sys.argv[2])
for first in glob.glob(os.path.join(tmp, "*.r1.json")):
    base = first[: -len(".r1.json")]
    runs = []
    for r in range(1, reps + 1):
        try:
            runs.append(json.load(open(f"{base}.r{r}.json")))
        except (OSError, ValueError):
            pass
    out = {}
    for batch in runs[0] if runs else {}:
        have = sorted((x[batch] for x in runs if batch in x and x[batch].get("f") == x[batch].get("f")),
                      key=lambda d: d["f"])
        if have:
            out[batch] = dict(have[(len(have) - 1) // 2], f_runs=[d["f"] for d in have])
            for key, runs in (("timed", "f_timed_runs"), ("timed_noperf", "f_noperf_runs")):
                fs = sorted(d[key]["f"] for d in have if key in d)
                if fs:
                    out[batch][runs] = fs
    json.dump(out, open(base + ".json", "w"))
PY
else
    note "no perf profile (perf missing, not permitted, or PROFILE=0): the serial fraction from the speed-up fit only"
fi

python3 - "$out" "$tmp" "$pthreads" <<'PY'
import json, os, statistics, sys
out, tmp, pthreads = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = []
for line in open(out):
    if line.startswith("impl="):
        rows.append(dict(kv.split("=", 1) for kv in line.split() if "=" in kv))

def runs_of(impl, w, t):
    """The figures of one implementation's runs, in the order they ran."""
    return [float(r[w["key"]]) for r in rows if r["impl"] == impl and r.get("threads") == str(t)
            and w["key"] in r and all(r.get(k) == x for k, x in w["match"].items())]

def med(impl, w, t):
    v = runs_of(impl, w, t)
    return (statistics.median(v), len(v)) if v else (float("nan"), 0)

# workload: how its rows are picked, its unit, and (xla) the PyTorch rows it is set against
W = [dict(name="gpt 4x128 T64 b32", match={"model": "gpt", "shape": "4x4x128xT64"}, key="tokens_per_s", unit="tok/s"),
     dict(name="gpt 6x384 T256 b8", match={"model": "gpt", "shape": "6x6x384xT256"}, key="tokens_per_s", unit="tok/s"),
     dict(name="bert MiniLM T128 b8", match={"model": "bert", "batch": "8"}, key="samples_per_s", unit="samples/s"),
     dict(name="mlp b16", match={"model": None, "batch": "16", "precision": "no"}, key="samples_per_s", unit="samples/s"),
     dict(name="mlp b128", match={"model": None, "batch": "128", "precision": "no"}, key="samples_per_s", unit="samples/s"),
     dict(name="xla mlp b16", match={"model": "xla-mlp", "batch": "16"}, key="samples_per_s", unit="samples/s",
          peer={"model": None, "batch": "16", "precision": "no"}),
     dict(name="xla mlp b128", match={"model": "xla-mlp", "batch": "128"}, key="samples_per_s", unit="samples/s",
          peer={"model": None, "batch": "128", "precision": "no"})]
ths = sorted({int(r["threads"]) for r in rows if "threads" in r})
nan = float("nan")
def ratio(a, b):
    return f"{a / b:.2f}" if a == a and b == b and b > 0 else "-"
def num(x):
    return f"{x:.0f}" if x >= 100 else f"{x:.2f}" if x == x else "-"

print("\nThroughput (median of the runs), caccel/torch and caccel/torch.compile")
print(f"{'workload':>20} {'unit':>9} {'thr':>3} | {'caccel':>9} {'torch':>9} {'compile':>9} | {'c/torch':>7} {'c/compile':>9} | n"
      f" | c/torch of each alternating pair")
live = []
for w in W:
    peer = dict(w, match=w.get("peer", w["match"]))
    for t in ths:
        c, n = med("caccel", w, t)
        if not n:
            continue
        q, _ = med("torch", peer, t)
        k, _ = med("torch-compile", peer, t)
        if w["name"] not in live:
            live.append(w["name"])
        pairs = " ".join(ratio(a, b) for a, b in zip(runs_of("caccel", w, t), runs_of("torch", peer, t)))
        print(f"{w['name']:>20} {w['unit']:>9} {t:>3} | {num(c):>9} {num(q):>9} {num(k):>9} | {ratio(c, q):>7} {ratio(c, k):>9} | {n}"
              f" | {pairs or '-'}")
# The GPT steps against the GEMM probe's peak (examples/gpt's MFU line): the most caccel/torch can reach on this
# machine is caccel/torch / MFU, every operation of the step at the best GEMM's rate.
bound = []
for w in (w for w in W if w["match"].get("model") == "gpt"):
    for t in ths:
        m = runs_of("caccel", dict(w, key="mfu_pct"), t)
        c, q = med("caccel", w, t)[0], med("torch", w, t)[0]
        if m and q == q:
            mm = statistics.median(m)
            bound.append(f"{w['name']:>20} {t:>3} | {mm:6.1f}% | {q / c * mm:6.1f}% | {c / q / mm * 100:6.2f}")
if bound:
    print("\nThe GPT steps against the GEMM peak (examples/gpt's MFU of the peak its GEMM probe measured): caccel's"
          " MFU, PyTorch's at its median, and the highest caccel/torch any step could reach (caccel/torch / MFU)")
    print(f"{'workload':>20} {'thr':>3} | {'caccel':>7} | {'torch':>7} | {'ceiling':>6}")
    print("\n".join(bound))
fails = {(r["impl"], r["model"]) : r.get("reason", "") for r in rows if r.get("status") == "failed"}
for (impl, model), why in sorted(fails.items()):
    print(f"# {impl} {model}: failed ({why.replace('_', ' ')})")
if "xla mlp b16" in live:
    print("# xla rows: bench_xla's synthetic inputs against the PyTorch MLP's Fashion-MNIST epoch (same model, batch, AdamW)")

fit = {}
if len(ths) > 1 and ths[0] == 1:
    print("\nScaling from 1 thread: throughput at k threads / at 1 thread")
    print(f"{'workload':>20} {'impl':>13} | " + " ".join(f"{'1->' + str(k):>6}" for k in ths[1:]))
    for w in W:
        if w["name"] not in live:
            continue
        for impl in ("caccel", "torch", "torch-compile"):
            pw = w if impl == "caccel" else dict(w, match=w.get("peer", w["match"]))
            base = med(impl, pw, 1)[0]
            if base != base:
                continue
            s = [med(impl, pw, k)[0] / base for k in ths[1:]]
            if impl == "caccel":
                fit[w["name"]] = (ths[-1], s[-1])
            print(f"{w['name']:>20} {impl:>13} | " + " ".join(f"{x:6.2f}" for x in s))

# The profile (bench/serial_profile.py): f from the per-thread time lines at pthreads threads, the functions
# and kernel calls of the serial stretches, and the work at pthreads threads against the work at 1.
def profile(name, batch, nt):
    p = os.path.join(tmp, f"{name}-t{nt}.json")
    if not os.path.exists(p):
        return None
    return json.load(open(p)).get(str(batch))

def amdahl(f, N):
    return 1 / (f + (1 - f) / N)

def profile_row(name, method, p, ratios):
    """One profile's row: f, its Amdahl projections, the GEMMs' own, `ratios` and every run's f."""
    f, fg = p["f"], p["gemm_f"]
    each = " ".join(f"{x:.3f}" for x in p.get("f_runs", [])) or "-"
    print(f"{name:>20} {method:>8} | {f:6.3f} {p['f_raw']:6.3f} {p['wall_share'].get('serial', nan):6.3f} |"
          f" {amdahl(f, 2):5.2f} {amdahl(f, 16):6.2f} {amdahl(f, 64):6.2f} |"
          f" {fg:6.3f} {amdahl(fg, 16):6.2f} {amdahl(fg, 64):6.2f} | {ratios} | {each}")
prof = {"gpt 4x128 T64 b32": ("gpt-4x4x128xT64", 0), "gpt 6x384 T256 b8": ("gpt-6x6x384xT256", 0),
        "bert MiniLM T128 b8": ("bert", 8), "mlp b16": ("mlp", 16), "mlp b128": ("mlp", 128),
        "xla mlp b16": ("xla-mlp", 16), "xla mlp b128": ("xla-mlp", 128)}
names = live or [n for n in prof if profile(*prof[n], pthreads)]
print(f"\nSerial fraction f of the caccel step and Amdahl's speed-up 1 / (f + (1 - f) / N), beside the GEMMs' own")
print(f"# profile: perf at {pthreads} threads, each thread's time line from its samples and context switches;"
      f" f = the work done while it is the only busy thread / all the work (preemption's catch-up excluded;"
      f" f raw: included). GEMM: the same over the gemm kernel calls only; ratio = GEMM s(N) / step s(N)")
print(f"# fit: f = (k / s_k - 1) / (k - 1) from the measured 1 -> k speed-up s_k (k = the largest thread count)")
print(f"{'workload':>20} {'method':>8} | {'f':>6} {'f raw':>6} {'1 busy':>6} | {'s(2)':>5} {'s(16)':>6} {'s(64)':>6} |"
      f" {'GEMM f':>6} {'s(16)':>6} {'s(64)':>6} | {'ratio 16':>8} {'64':>5} | f of each run")
if not fit and not any(profile(*prof[n], pthreads) for n in names):
    print("# none: the fit needs 1 thread and more in THREADS, the profile needs perf")
for name in names:
    pr = profile(*prof[name], pthreads) if pthreads > 1 else None
    if pr and pr.get("f") is not None and pr["f"] == pr["f"]:
        f, fg = pr["f"], pr["gemm_f"]
        g = [amdahl(fg, N) if fg == fg else nan for N in (16, 64)]
        r = [x / amdahl(f, N) for x, N in zip(g, (16, 64))]
        profile_row(name, "profile", pr, f"{r[0]:8.2f} {r[1]:5.2f}")
    for key, runs_key, method in (("timed", "f_timed_runs", "timed"), ("timed_noperf", "f_noperf_runs", "no perf")):
        tm = pr.get(key) if pr else None
        if not tm or tm["f"] != tm["f"]:
            continue
        runs = pr.get(runs_key) or [tm["f"]]
        ft = runs[(len(runs) - 1) // 2]
        g = [amdahl(pr["gemm_f"], N) for N in (16, 64)]
        r = [x / amdahl(ft, N) for x, N in zip(g, (16, 64))]
        print(f"{name:>20} {method:>8} | {ft:6.3f} {'-':>6} {'-':>6} | {amdahl(ft, 2):5.2f} {amdahl(ft, 16):6.2f}"
              f" {amdahl(ft, 64):6.2f} | {'':>6} {'':>6} {'':>6} | {r[0]:8.2f} {r[1]:5.2f} | "
              + " ".join(f"{x:.3f}" for x in runs))
    tp = profile("torch-" + prof[name][0], prof[name][1], pthreads) if pthreads > 1 else None
    if tp and tp.get("f") is not None and tp["f"] == tp["f"]:
        profile_row(name, "torch", tp, f"{'':>8} {'':>5}")
    if name in fit:
        k, s = fit[name]
        f = min(1.0, max(0.0, (k / s - 1) / (k - 1)))
        print(f"{name:>20} {'fit':>8} | {f:6.3f} {'-':>6} {'-':>6} | {amdahl(f, 2):5.2f} {amdahl(f, 16):6.2f}"
              f" {amdahl(f, 64):6.2f} |   (s_{k} = {s:.2f})")
print("# 1 busy: the share of the window's wall time with one busy thread (on a busy machine mostly another's preemption)")
print("# timed: caccel's own fork-joins from their timestamps (CACCEL_CPU_TEAMS_LOG), the threaded library GEMMs'"
      " insides from the samples, a preempted thread's lost time included; the median of the runs")
print("# no perf: the same program run again without perf or a trace, timed alone (its GEMMs at the profile's GEMM f):"
      " the sampling's own interrupts and the trace's records left out")
print("# torch: PyTorch's eager step of the same workload under the same profile (its GEMMs: MKL's and oneDNN's symbols)")
print("# each profile row: the run with the median f of PROFILE_REPS runs; f of each run: all of them")

for name in names:
    pr = profile(*prof[name], pthreads) if pthreads > 1 else None
    if not pr:
        continue
    ms = pr["serial_ms"] + pr["parallel_ms"]
    print(f"\n{name}: serial stretches at {pthreads} threads, {pr['serial_ms']:.1f} ms of {ms:.0f} ms of work"
          f" in the window (ms, of which the main thread's)")
    cols = [("function", pr["serial_funcs"]), ("kernel call", pr.get("serial_ops") or [])]
    for title, rows_ in cols:
        if rows_:
            print(f"  by {title}: " + "; ".join(f"{n} {v:.1f} ({m:.1f})" for n, v, m in rows_))
    for key, label in (("timed", "timed"), ("timed_noperf", "timed without perf")):
        tm = pr.get(key)
        if tm:
            print(f"  {label}: the calling thread alone {tm['alone_ms']:.1f} ms; kernel loops' work {tm['loops_busy_ms']:.0f}"
                  f" ms, one thread working {tm['loops_one_ms']:.1f} ms ({tm['forks']} fork-joins, median"
                  f" {tm['one_median_us']:.1f} us each; {tm['one_tail_ms']:.1f} ms in those over 100 us); threaded"
                  f" library GEMMs {tm['gemm_wall_ms']:.0f} ms of wall, their serial work {tm['gemm_serial_ms']:.1f}"
                  f" of {tm['gemm_serial_ms'] + tm['gemm_parallel_ms']:.0f} ms")
    if pr.get("serial_by_others"):
        print("  by who ran alone while the others did what (ms): "
              + "; ".join(f"{k} {v:.1f}" for k, v in pr["serial_by_others"].items()))
    one = profile(*prof[name], 1)
    if one:
        w1 = one["serial_ms"] + one["parallel_ms"]
        g = [x["gemm_serial_ms"] + x["gemm_parallel_ms"] for x in (pr, one)]
        print(f"  work at {pthreads} threads / at 1: {ms / w1:.2f} ({ms:.0f} / {w1:.0f} ms); the GEMMs'"
              f" {ratio(g[0], g[1])} ({g[0]:.0f} / {g[1]:.0f}), the rest's {ratio(ms - g[0], w1 - g[1])}")
        print(f"  the functions (ms at"
              f" {pthreads}, at 1): " + "; ".join(f"{n} {v:.0f}, {dict((k, x) for k, x in one['work_funcs']).get(n, 0):.0f}"
                                                   for n, v in pr["work_funcs"][:6]))
PY
if [ -s "$tmp/teams" ]; then
    echo
    echo "Teams: kernel loops and library GEMMs by the threads they ran on (CACCEL_CPU_TEAMS=1; 1 = serial)"
    cat "$tmp/teams"
fi
