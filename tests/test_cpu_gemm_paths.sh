#!/bin/sh
# The CPU GEMM has two paths for f32 (oneDNN's sgemm, OpenBLAS) and two for bf16 (oneDNN, f32
# conversion): the GEMM tests must pass on each. The oneDNN halves are skipped, with the reason,
# where libdnnl is absent (or in sanitizer builds, which do not load it).
b=${CACCEL_TEST_BUILDDIR:-.}
CACCEL_CPU_GEMM=openblas CACCEL_CPU_BF16_GEMM=convert "$b/tests/test_cpu_gemm" ||
    { echo "FAIL: GEMM tests with OpenBLAS and the conversion path"; exit 1; }
desc=$(CACCEL_CPU_GEMM=onednn CACCEL_CPU_BF16_GEMM=onednn "$b/tools/caccel" env 2>/dev/null | grep 'GEMM' | head -1)
f32=$(echo "$desc" | grep -o 'f32 GEMM [^;]*')
bf16=$(echo "$desc" | grep -o 'bf16 GEMM [^;]*')
echo "with CACCEL_CPU_GEMM=onednn: $f32"
echo "with CACCEL_CPU_BF16_GEMM=onednn: $bf16"
case $f32 in *"through OpenBLAS (CACCEL_CPU_GEMM=openblas)"*) echo "FAIL: the f32 path ignored CACCEL_CPU_GEMM"; exit 1 ;; esac
case "$f32$bf16" in
    *"f32 GEMM through oneDNN"*"bf16 GEMM through oneDNN"*) ;;
    *) echo "SKIP: oneDNN paths not testable here ($f32; $bf16)"; exit 77 ;;
esac
CACCEL_CPU_GEMM=onednn CACCEL_CPU_BF16_GEMM=onednn "$b/tests/test_cpu_gemm" ||
    { echo "FAIL: GEMM tests with oneDNN"; exit 1; }
# OpenBLAS on kernels below the CPU's (its detection falls back to Prescott on CPU models it does not know):
# a warning names the OPENBLAS_CORETYPE to set, every f32 GEMM goes to oneDNN, and the GEMMs stay right
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    out=$(OPENBLAS_CORETYPE=Prescott "$b/tools/caccel" env 2>&1)
    echo "$out" | grep -q 'OpenBLAS chose its Prescott kernels on a CPU with .*set OPENBLAS_CORETYPE=\(Haswell\|SkylakeX\)' ||
        { echo "FAIL: no OPENBLAS_CORETYPE warning on Prescott kernels"; echo "$out" | head -5; exit 1; }
    echo "$out" | grep -q 'f32 GEMM through oneDNN (OpenBLAS runs its Prescott kernels' ||
        { echo "FAIL: f32 GEMMs not on oneDNN with Prescott kernels"; echo "$out" | grep GEMM; exit 1; }
    OPENBLAS_CORETYPE=Prescott "$b/tests/test_cpu_gemm" ||
        { echo "FAIL: GEMM tests on OpenBLAS's Prescott kernels"; exit 1; }
    "$b/tools/caccel" env 2>&1 | grep -q 'OpenBLAS chose its' &&
        { echo "FAIL: the OPENBLAS_CORETYPE warning on OpenBLAS's own choice of kernels"; exit 1; }
fi
# the default (auto) names its choice, and openblas is honoured
CACCEL_CPU_GEMM=openblas "$b/tools/caccel" env 2>/dev/null | grep -q 'f32 GEMM through OpenBLAS (CACCEL_CPU_GEMM=openblas)' ||
    { echo "FAIL: CACCEL_CPU_GEMM=openblas not reported"; exit 1; }
CACCEL_CPU_GEMM=bogus "$b/tools/caccel" env 2>/dev/null | grep -q 'CACCEL_CPU_GEMM=bogus is not auto|onednn|openblas' ||
    { echo "FAIL: a bad CACCEL_CPU_GEMM not reported"; exit 1; }
echo ok
