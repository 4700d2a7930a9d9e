#!/usr/bin/env bash
# gpu-check.sh: the one command that checks caccel on a GPU machine (docs/CUDA.md, "Checking a GPU
# machine"). On a bare x86-64 machine with an NVIDIA GPU, nvcc, make, gcc and PyTorch but no Debian
# packages, with the bundle of tools/gpu-bundle.sh in the source tree, it
#   1. prints a preflight (GPU, driver, nvcc, make, gcc, PyTorch, and which cuBLAS, NCCL and CUDA runtime
#      it found),
#   2. configures and builds once: the library, the plugins, and only the programs the GPU checks run,
#   3. runs the CUDA tests and `make bench-cuda` and `make bench-gpt-cuda`, each under its own timeout,
#      going on after a failure; with a GPU present a skipped test counts as a failure,
# and leaves at most 8 files in OUTDIR: env.txt, build.log, tests.txt, test-logs.tar.gz, bench-cuda.txt,
# bench-gpt-cuda.txt and summary.txt, whose last line is "N passed, N failed"; with --threads, also the
# CPU backend's thread scaling on that machine's cores against its PyTorch (bench/run_threads.sh) in threads.txt.
#
# usage: tools/gpu-check.sh [--no-gpu] [--bundle DIR] [--budget SECONDS] [--no-bench] [--threads LIST] OUTDIR
#   --no-gpu      on a machine without a GPU (CI): everything up to the first GPU call; the tests run and
#                 those that need a GPU count as skipped, the benchmarks are not run
#   --bundle DIR  the bundle (default _build-gpu); it must be inside the source tree
#   --budget S    seconds for the whole run (default 470); each stage's timeout is cut to what is left
#   --no-bench    the tests only
#   --threads L   after the GPU benchmarks, bench/run_threads.sh at the thread counts L ("1 2 4 8 16"): first
#                 the GPT 4 x 128 alone with its kernels' teams at each count, then the GPT 6 x 384 and BERT
#                 steps, against python3's PyTorch eager, one run each (PARTS of the second run, REPS and
#                 TORCH_COMPILE from the environment override), in what is left of the budget
# Environment: GPU_CHECK_BUILD (build folder, default a fresh temporary one), CC (default gcc, or
# "ccache gcc" where ccache is installed).
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
no_gpu=false bundle=_build-gpu budget=470 bench=true out="" threads=""
while [ $# -gt 0 ]; do
    case $1 in
        --no-gpu) no_gpu=true; shift ;;
        --bundle) bundle=$2; shift 2 ;;
        --budget) budget=$2; shift 2 ;;
        --no-bench) bench=false; shift ;;
        --threads) threads=$2; shift 2 ;;
        -*) echo "gpu-check.sh: unknown option $1" >&2; exit 2 ;;
        *) out=$1; shift ;;
    esac
done
[ -n "$out" ] || { echo "usage: tools/gpu-check.sh [--no-gpu] [--bundle DIR] [--budget S] [--no-bench] OUTDIR" >&2; exit 2; }
mkdir -p "$out" && out=$(cd "$out" && pwd) || { echo "gpu-check.sh: cannot create $out" >&2; exit 2; }
start=$SECONDS
pass=0 fail=0 skip=0
summary=$out/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
result() {   # result PASS|FAIL|SKIP NAME [WHY]
    case $1 in PASS) pass=$((pass + 1)) ;; FAIL) fail=$((fail + 1)) ;; SKIP) skip=$((skip + 1)) ;; esac
    note "$1: $2${3:+ ($3)}"
}
left() { echo $((budget - (SECONDS - start))); }
cap() {   # cap SECONDS: a stage's timeout, sized for the default budget on a 16-core GPU machine: scaled
          # with --budget (a 2-CPU machine needs longer), then cut to the time left (at least 5 s)
    local l t=$(($1 * budget / 470)); l=$(left)
    [ "$t" -lt "$l" ] && echo "$t" || { [ "$l" -gt 5 ] && echo "$l" || echo 5; }
}
finish() {
    $no_gpu && [ $skip -gt 0 ] && note "($skip skipped: no GPU on this machine, --no-gpu)"
    note "gpu-check took $((SECONDS - start)) s"
    note "$pass passed, $fail failed"
    [ $fail -eq 0 ]
    exit
}

# ------------------------------------------------------------------ 1. preflight
preflight() {
    echo "# gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(uname -m), $(nproc) CPUs"
    echo "source: $(git -C "$top" describe --always --dirty 2>/dev/null || echo 'not a git checkout')"
    if command -v nvidia-smi >/dev/null 2>&1; then
        echo "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | head -4)"
    else
        echo "GPU: nvidia-smi not found"
    fi
    local nvcc; nvcc=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })
    echo "nvcc: ${nvcc:-not found}${nvcc:+ ($("$nvcc" --version | tail -2 | head -1))}"
    for t in make gcc g++ python3; do
        local p; p=$(command -v $t) && echo "$t: $p ($($t --version 2>&1 | head -1))" || echo "$t: not found"
    done
    echo "PyTorch: $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -1)"
}
{ preflight; } > "$out/env.txt" 2>&1
cat "$out/env.txt"
missing=""
for t in make gcc g++; do command -v $t >/dev/null 2>&1 || missing="$missing $t"; done
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || missing="$missing nvcc"
[ -z "$missing" ] && result PASS preflight || { result FAIL preflight "missing:$missing"; finish; }
if ! $no_gpu; then
    if ! nvidia-smi -L >/dev/null 2>&1; then result FAIL "GPU" "nvidia-smi lists no GPU; use --no-gpu on a machine without one"; finish; fi
fi

# ------------------------------------------------------------------ 2. build
# the bundle's env.sh restores the autotools output, unpacks the libraries and finds CUDA, cuBLAS and NCCL
cd "$top" || exit 2
[ -f "$bundle/env.sh" ] || { result FAIL bundle "$bundle/env.sh not found: run tools/gpu-bundle.sh where Debian's packages are, and carry $bundle"; finish; }
# shellcheck disable=SC1090,SC1091
. "$bundle/env.sh" >> "$out/env.txt" 2>&1 || { result FAIL bundle "sourcing $bundle/env.sh failed (env.txt)"; finish; }
{
    echo "CUDA_HOME=$CUDA_HOME"
    for l in libcudart.so.13 libcudart_static.a libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
        f=""
        for d in $(echo "$LD_LIBRARY_PATH" | tr ':' ' ') "$CUDA_HOME/lib64" "$CUDA_HOME/lib" /usr/lib/x86_64-linux-gnu; do
            [ -e "$d/$l" ] && { f=$(readlink -f "$d/$l"); break; }
        done
        echo "$l: ${f:-not found}"
    done
} >> "$out/env.txt"
tail -6 "$out/env.txt"
arch=90
if ! $no_gpu; then
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
    case $cc in [0-9][0-9]|[0-9][0-9][0-9]) arch=$cc ;; esac
fi
b=${GPU_CHECK_BUILD:-$(mktemp -d /tmp/caccel-gpu-check.XXXXXX)}
mkdir -p "$b"
cc=${CC:-gcc} cxx=${CXX:-g++}
[ -z "${CC:-}" ] && command -v ccache >/dev/null 2>&1 && cc="ccache gcc" cxx="ccache g++"
jobs=$(nproc)
build() {
    cd "$b" &&
    timeout "$(cap 60)" "$top/configure" -q --with-cuda="$CUDA_HOME" --with-cuda-arch="$arch" CC="$cc" CXX="$cxx" &&
    timeout "$(cap 300)" make -j"$jobs" all &&
    progs=$(make -s print-gpu-programs) && [ -n "$progs" ] &&
    timeout "$(cap 120)" make -j"$jobs" $progs
}
echo "== build in $b (sm_$arch, $jobs jobs)"
if build > "$out/build.log" 2>&1; then
    result PASS build "$((SECONDS - start)) s so far"
else
    tail -30 "$out/build.log"
    result FAIL build "see build.log"
    finish
fi
[ -f "$b/backends/cuda/.libs/caccel_cuda.so" ] ||
    { result FAIL "CUDA plugin" "configure did not enable CUDA (build.log)"; finish; }

# ------------------------------------------------------------------ 3. tests
tests=$(cd "$b" && make -s print-gpu-tests)
# without a GPU, test_ops stops after loading the CUDA plugin, with the cuda column's reason: its cpu
# and xla columns are those make check runs in every build (CI's -Werror and sanitizer stages)
$no_gpu && export CACCEL_TEST_OPS_GPU_ONLY=1
[ -n "$tests" ] || { result FAIL tests "make print-gpu-tests names no test"; finish; }
: > "$out/tests.txt"
for t in $tests; do
    # check_PROGRAMS emptied: make check would build every test program first, not only this one's
    (cd "$b" && timeout "$(cap 150)" make check TESTS="$t" check_PROGRAMS= > /dev/null 2>&1)
    rc=$?
    res=$(sed -n 's/^:test-result: //p' "$b/$t.trs" 2>/dev/null | head -1)
    [ $rc -eq 124 ] && res=TIMEOUT
    why=$(grep -m1 -E '^(SKIP|FAIL)[: ]' "$b/$t.log" 2>/dev/null | cut -c1-200)
    echo "$t: ${res:-NO RESULT} $why" >> "$out/tests.txt"
    case $res in
        PASS) result PASS "$t" ;;
        SKIP) if $no_gpu; then result SKIP "$t" "$why"; else result FAIL "$t" "skipped with a GPU present: $why"; fi ;;
        *) result FAIL "$t" "${res:-no result}${why:+: $why}" ;;
    esac
done
(cd "$b" && tar czf "$out/test-logs.tar.gz" $(for t in $tests; do [ -f "$t.log" ] && echo "$t.log"; done) 2>/dev/null)

# ------------------------------------------------------------------ 4. benchmarks
if $no_gpu || ! $bench; then
    note "benchmarks: not run ($($no_gpu && echo "--no-gpu" || echo "--no-bench"))"
    finish
fi
bench() {   # bench NAME CAP ARGS...: one benchmark under its timeout; 77 (skipped) counts as a failure here
    local name=$1 t=$2; shift 2
    (cd "$b" && timeout "$(cap "$t")" make "$name" "$@") > "$out/$name.txt" 2>&1
    local rc=$?
    tail -12 "$out/$name.txt"
    case $rc in
        0) result PASS "$name" ;;
        124) result FAIL "$name" "timed out after $(cap "$t") s" ;;
        *) result FAIL "$name" "exit $rc: $(grep -m1 -iE 'skip|error|fail' "$out/$name.txt" | cut -c1-160)" ;;
    esac
}
bench bench-cuda 150 BENCH_CUDA_ARGS="--reps 2 --sizes 2048,8192 --batch-sizes 512,2048 --python python3"
bench bench-gpt-cuda 150 BENCH_GPT_CUDA_ARGS="--steps 10"
# the CPU backend on this machine's cores (issue: thread scaling beyond two cores); the build's programs run
# in place (libtool wrappers), the bundle's libraries on LD_LIBRARY_PATH; no perf there, so the fit alone
if [ -n "$threads" ]; then
    if (cd "$b" && timeout "$(cap 60)" make -j"$jobs" examples/gpt bench/bench_transformer tools/caccel) \
        >> "$out/build.log" 2>&1; then
        # first the small GPT (4 x 128, T 64, batch 32) alone at every count, 16 included: the workload that ran
        # slower at 16 threads than at 4 before kernels and GEMMs took teams sized by their work; its teams
        # at each count (CACCEL_CPU_TEAMS) end its half of threads.txt
        PARTS=gpt-small REPS=${REPS:-1} TORCH_COMPILE=${TORCH_COMPILE:-0} PROFILE=0 \
            TORCH_PYTHON=${TORCH_PYTHON:-python3} THREADS="$threads" \
            timeout "$(left)" bash "$top/bench/run_threads.sh" --build "$b" > "$out/threads.txt" 2>&1
        rc=$?
        grep -E '4x128|threads:' "$out/threads.txt" | tail -20
        case $rc in
            0) result PASS threads-gpt-small ;;
            *) result FAIL threads-gpt-small "exit $rc (threads.txt, its first half)" ;;
        esac
        PARTS=${PARTS:-gpt-large,bert} REPS=${REPS:-1} TORCH_COMPILE=${TORCH_COMPILE:-0} PROFILE=0 \
            TORCH_PYTHON=${TORCH_PYTHON:-python3} THREADS="$threads" \
            timeout "$(left)" bash "$top/bench/run_threads.sh" --build "$b" >> "$out/threads.txt" 2>&1
        rc=$?
        tail -30 "$out/threads.txt"
        case $rc in
            0) result PASS threads ;;
            124) result FAIL threads "timed out with the budget spent (threads.txt has what finished)" ;;
            *) result FAIL threads "exit $rc (threads.txt)" ;;
        esac
    else
        result FAIL threads "building the thread-scaling programs failed (build.log)"
    fi
fi
finish
