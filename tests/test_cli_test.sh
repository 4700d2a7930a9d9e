#!/bin/sh
# `caccel test`: the self-check passes at 1 and 2 processes (every line "ok", the verdict, exit 0),
# and a broken setup (an unsupported precision) exits non-zero with the reason.
. "$(dirname "$0")/dist/lib.sh"
need_caccel
export OPENBLAS_NUM_THREADS=1

run_test() {   # run_test NAME FLAGS...: expects every check ok
    name=$1; shift
    timeout 300 "$CACCEL" test "$@" > "$WORK/$name" 2>&1 || { cat "$WORK/$name"; fail "caccel test $* exited non-zero"; }
    cat "$WORK/$name"
    grep -q "^  FAIL" "$WORK/$name" && fail "caccel test $*: a check failed"
    n=$(grep -c "^  ok  " "$WORK/$name")
    grep -q "^caccel test: all $n checks passed: the setup works\$" "$WORK/$name" || fail "caccel test $*: no verdict"
    [ "$n" -ge 40 ] || fail "caccel test $*: only $n checks ran"
    for c in "all_reduce max bf16" "reduce_scatter sum i64" "RNG in sync after set_seed" \
             "dataloader shards: every sample once over all ranks" "parameters in sync after prepare" \
             "5 epochs of training reduce the loss 4x"; do
        grep -q "^  ok    $c" "$WORK/$name" || fail "caccel test $*: no check '$c'"
    done
}

note "caccel test names itself in the errors of the launcher flags it takes"
"$CACCEL" test --bogus > "$WORK/bogus" 2>&1 && { cat "$WORK/bogus"; fail "caccel test --bogus exited 0"; }
cat "$WORK/bogus"
grep -q "^caccel test: error: unknown flag --bogus\$" "$WORK/bogus" || fail "caccel test --bogus: not named caccel test"
"$CACCEL" test --num_processes many > "$WORK/many" 2>&1 && { cat "$WORK/many"; fail "--num_processes many exited 0"; }
cat "$WORK/many"
grep -q "^caccel test: error: --num_processes: invalid value 'many'" "$WORK/many" || fail "--num_processes many: not named caccel test"
grep -q "caccel launch:" "$WORK/bogus" "$WORK/many" && fail "an error calls caccel test caccel launch"
grep -q "^  hint: caccel test takes the flags of caccel launch" "$WORK/bogus" || fail "caccel test --bogus: no hint"

note "without /proc/self/exe (a private /proc, where unshare is allowed) the reason is named"
if unshare --mount true 2>/dev/null; then
    unshare --mount sh -c 'mount -t tmpfs none /proc && exec "$0" test --cpu' "$CACCEL" > "$WORK/noexe" 2>&1 &&
        { cat "$WORK/noexe"; fail "caccel test without /proc exited 0"; }
    cat "$WORK/noexe"
    grep -q "^caccel test: error: cannot find the caccel executable to run under launch: /proc/self/exe: No such file or directory\$" \
        "$WORK/noexe" || fail "no reason for /proc/self/exe"
else
    echo "SKIP (part): unshare --mount is not allowed here"
fi

note "1 process"
run_test one --cpu --num_processes 1 --main_process_port 0
grep -q "^caccel test: 1 process(es), backend single, device cpu" "$WORK/one" || fail "the setup line (1 process)"

need_backend gloo
note "2 processes over Gloo"
run_test two --cpu --num_processes 2 --backend gloo --main_process_port 0
grep -q "^caccel test: 2 process(es), backend gloo, device cpu" "$WORK/two" || fail "the setup line (2 processes)"
grep -q "^  ok    broadcast f32 from rank 1" "$WORK/two" || fail "no broadcast from the last rank"

note "a broken setup fails"
timeout 300 "$CACCEL" test --cpu --num_processes 2 --backend gloo --main_process_port 0 --mixed_precision fp8 \
    > "$WORK/bad" 2>&1 && { cat "$WORK/bad"; fail "caccel test with fp8 exited 0"; }
cat "$WORK/bad"
grep -q "caccel test: error: .*mixed_precision fp8 .*not supported" "$WORK/bad" || fail "the reason is not printed"
echo "ok"
