#!/bin/sh
# `caccel launch` and OpenBLAS's kernels: where OpenBLAS chose kernels without AVX2 on a CPU with AVX2 and FMA
# (its detection falls back to Prescott on CPU models it does not know) and OPENBLAS_CORETYPE is unset, the
# workers get the core the CPU backend's detection names (Haswell, SkylakeX) and the launcher says so in one
# line; a user's OPENBLAS_CORETYPE is kept. Injection: OPENBLAS_CORETYPE=Prescott loads the launcher's
# OpenBLAS on those kernels (as tests/test_cpu_gemm_paths.sh does); CACCEL_TEST_CORETYPE_UNSET=1 makes the
# launcher count the variable as unset, as on a CPU its detection does not know.
set -u
b=${CACCEL_TEST_BUILDDIR:-.}
CACCEL="$b/tools/caccel"
fail() { echo "FAIL: $*"; exit 1; }
grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo || { echo "SKIP: no AVX2 and FMA: no faster kernels to name"; exit 77; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/caccel-coretype.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
unset OPENBLAS_CORETYPE CACCEL_TEST_CORETYPE_UNSET
LINE='OpenBLAS chose kernels without AVX2 on this CPU, which has \(AVX2\|AVX-512\): the processes run with OPENBLAS_CORETYPE=\(Haswell\|SkylakeX\)'

launch() {   # launch NAME [launch flags]: the worker prints its OPENBLAS_CORETYPE and its CPU device line
    name=$1; shift
    "$CACCEL" launch "$@" --num_processes 1 --cpu sh -c 'echo "coretype=${OPENBLAS_CORETYPE-unset}"; '"'$CACCEL'"' env' \
        > "$WORK/$name.out" 2> "$WORK/$name.err" || { cat "$WORK/$name.out" "$WORK/$name.err"; fail "$name: launch failed"; }
    sed -n 's/^coretype=//p' "$WORK/$name.out"
}

# OpenBLAS on kernels below the CPU's, the variable counted as unset: the workers get the CPU's core
got=$(OPENBLAS_CORETYPE=Prescott CACCEL_TEST_CORETYPE_UNSET=1 launch hint)
case $got in Haswell | SkylakeX) ;; *) cat "$WORK/hint.out" "$WORK/hint.err"; fail "workers got OPENBLAS_CORETYPE=$got, not the CPU's core" ;; esac
n=$(grep -c "$LINE" "$WORK/hint.err")
[ "$n" -eq 1 ] || { cat "$WORK/hint.err"; fail "expected the launcher's line once, got it $n times"; }
grep -q "OPENBLAS_CORETYPE=$got\$" "$WORK/hint.err" || fail "the line names another core than the workers got ($got)"
grep -q "^CPU device: .*, core $got" "$WORK/hint.out" || { grep '^CPU device' "$WORK/hint.out"; fail "the worker's OpenBLAS does not run $got"; }
grep -q 'OpenBLAS chose its' "$WORK/hint.out" "$WORK/hint.err" && fail "the worker still warns of kernels below the CPU's"
echo "workers got OPENBLAS_CORETYPE=$got: $(grep -o 'OpenBLAS chose kernels.*' "$WORK/hint.err")"

# --quiet: the same variable, no line
got=$(OPENBLAS_CORETYPE=Prescott CACCEL_TEST_CORETYPE_UNSET=1 launch quiet -q)
case $got in Haswell | SkylakeX) ;; *) fail "-q: workers got OPENBLAS_CORETYPE=$got" ;; esac
grep -q "$LINE" "$WORK/quiet.err" && fail "-q: the launcher's line printed"

# a user's OPENBLAS_CORETYPE is kept, even one below the CPU's, and nothing is said by the launcher
got=$(OPENBLAS_CORETYPE=Prescott launch user)
[ "$got" = Prescott ] || fail "the user's OPENBLAS_CORETYPE=Prescott became $got"
grep -q "$LINE" "$WORK/user.err" && fail "the launcher spoke of a core the user chose"

# OpenBLAS's own choice: set only where its detection fell below the CPU (as `caccel env` warns)
got=$(launch own)
if "$CACCEL" env 2>&1 | grep -q 'OpenBLAS chose its'; then
    case $got in Haswell | SkylakeX) ;; *) fail "OpenBLAS below this CPU, workers got $got" ;; esac
else
    [ "$got" = unset ] || { cat "$WORK/own.err"; fail "OpenBLAS runs this CPU's kernels, yet workers got OPENBLAS_CORETYPE=$got"; }
    grep -q "$LINE" "$WORK/own.err" && fail "a line without a change"
fi
echo ok
