/* cpu_impl.h: private definitions of the CPU backend: device context, half-precision conversions, kernel entry points. */
#ifndef CACCEL_CPU_IMPL_H
#define CACCEL_CPU_IMPL_H

#include <caccel/backend.h>
#include "base/half_impl.h"
#include "base/kernel_check_impl.h"
#include "base/unary_math_impl.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Hot loops are compiled for AVX-512, AVX2 and baseline x86-64 and picked at
 * load time (ifunc), so one binary runs on any x86-64 and uses what it finds.
 * Other targets get the plain build. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(CA_CPU_NO_CLONES)
#define CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CPU_CLONES
#endif

/* For helpers used inside cloned loops: an out-of-line copy would be built
 * for the baseline target only, so they must always be inlined. */
#define CPU_INLINE static inline __attribute__((always_inline))

/* Elements per chunk when f16/bf16 data are converted through an f32 buffer. */
#define CPU_CHUNK 1024

/* The context behind every `dev` pointer of this backend. */
typedef struct cpu_device {
    int index;
    int blas_threads;          /* OpenBLAS threads when the device was opened */
    void *scratch;             /* GEMM conversion buffer (f16/bf16 operands) */
    size_t scratch_bytes;
} cpu_device;

/* oneDNN's GEMMs when it is present and chosen (cpu_onednn.c); row-major, C f32. The paths are
 * fixed at first use (environment, CPU, OpenBLAS's core); the *_path strings say which and why. */
bool cpu_bf16_gemm_available(void);
const char *cpu_bf16_gemm_path(void);
/* Whether an f32 GEMM of this size goes to oneDNN now (auto: from CPU_ONEDNN_MIN_MNK multiply-adds
 * with one BLAS thread, from CPU_ONEDNN_MIN_MNK_THREADED with more). */
#define CPU_ONEDNN_MIN_MNK (1 << 19)
#define CPU_ONEDNN_MIN_MNK_THREADED (1 << 26)
bool cpu_f32_gemm_onednn(int64_t m, int64_t n, int64_t k);
/* The OPENBLAS_CORETYPE ("Haswell", "SkylakeX") that would give OpenBLAS the kernels this CPU supports, when
 * its own detection chose a core without AVX2 on a CPU with it; NULL otherwise. _for: the rule alone. */
const char *cpu_openblas_coretype_hint(void);
const char *cpu_coretype_hint_for(const char *core, bool avx2, bool avx512);
/* The same rule for a GEMM run on `threads` threads (1: a block of a split GEMM, cpu_gemm_split.c). */
bool cpu_f32_gemm_onednn_at(int64_t m, int64_t n, int64_t k, int threads);
const char *cpu_f32_gemm_path(void);
ca_status cpu_bf16_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                        int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* dnnl_sgemm on `threads` OpenMP threads (a block of a split GEMM: 1; else cpu_gemm_threads's count). */
ca_status cpu_onednn_sgemm_threads(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                                   const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                                   int64_t ldc);

/* An f32 GEMM (k > 0, alpha != 0) split over the kernels' threads in blocks of C's rows or columns
 * (cpu_gemm_split.c): false when this one is not split (too small, one thread, inside a parallel region,
 * large enough for oneDNN's own threads but under CPU_GEMM_SPLIT_BIG_MNK a thread), else true with the GEMM
 * done and its status in *st. */
bool cpu_gemm_split(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float beta, float *c, int64_t ldc, ca_status *st);
/* Threads for a library GEMM (OpenBLAS, oneDNN) of m x n x k not split by cpu_gemm_split, at `threads` BLAS
 * threads: min(threads, ceil(m n k / CPU_GEMM_THREAD_MNK)), at least 1 (cpu_gemm_split.c says why). */
int cpu_gemm_threads(int64_t m, int64_t n, int64_t k, int threads);
/* Whether deterministic mode is on (ca_cpu_set_deterministic). */
bool cpu_deterministic(void);

/* ---------------------------------------------------------------- bits */

/* --------------------------------------------------------- shared helpers */

/* Error for a dtype a kernel does not take. */
ca_status cpu_bad_dtype(const char *kernel, const char *what, ca_dtype dt);

/* f16/bf16/f32 <-> f32 conversion of n contiguous elements starting at
 * element `off` (f32 in or out: a copy). */
void cpu_to_f32(ca_dtype dt, const void *x, int64_t off, int64_t n, float *out);
void cpu_from_f32(ca_dtype dt, const float *x, int64_t n, void *y, int64_t off);
/* As cpu_to_f32 with an element stride. */
void cpu_to_f32_strided(ca_dtype dt, const void *x, int64_t off, int64_t stride, int64_t n,
                        float *out);

/* The f32 view of n elements at element `off` of x: x itself when f32, else
 * the elements converted into buf (at least n floats). */
static inline const float *cpu_view_f32(ca_dtype dt, const void *x, int64_t off, int64_t n,
                                        float *buf) {
    if (dt == CA_F32) return (const float *)x + off;
    cpu_to_f32(dt, x, off, n, buf);
    return buf;
}

/* Reads an integer label/index (i32 or i64). */
static inline int64_t cpu_index_at(ca_dtype idx_dt, const void *idx, int64_t i) {
    return idx_dt == CA_I64 ? ((const int64_t *)idx)[i] : (int64_t)((const int32_t *)idx)[i];
}

/* Sum and maximum (NaN wins; m is the starting value) of n contiguous floats,
 * in vector lanes. */
float cpu_run_sum(const float *x, int64_t n);
float cpu_run_max(const float *x, int64_t n, float m);

/* Philox4x32-10 words for `count` consecutive counters starting at
 * `counter`: out[4j + w] is word w of counter + j. */
void cpu_philox_words(uint64_t seed, uint64_t counter, int64_t count, uint32_t *out);

/* Threads (cpu_threads.c). The OpenBLAS thread count this process should use by default; 0 when
 * OPENBLAS_NUM_THREADS or OMP_NUM_THREADS is set. */
int cpu_default_blas_threads(void);
int cpu_online_cpus(void);
/* At device open: sets the kernels' and OpenBLAS's count from the environment, clamped to the CPUs the
 * process may use (warned once), and registers the fork handler (first open). */
void cpu_threads_open(void);
/* The last open's clamp ("clamped from 2 (OMP_NUM_THREADS): affinity mask allows 1 CPU"), "" if none. */
void cpu_threads_clamp(char *out, size_t len);
/* CPUs a cgroup CPU quota allows (0: none): `proc_cgroup` in /proc/self/cgroup's format, `root` the
 * cgroup mount (v2's, or the folder of v1's "cpu" hierarchy); `why` names the quota. */
int cpu_cgroup_cpus(const char *proc_cgroup, const char *root, char *why, size_t len);

/* The device vtable (cpu_device.c), which points at the kernel table. */
extern const ca_device_ops cpu_device_ops;

/* ---------------------------------------------------------------- kernels */

/* cpu_<slot>(dev, args) for every slot of CA_KERNEL_LIST. */
#define CPU_KERNEL_PROTO(slot) ca_status cpu_##slot(void *dev, const ca_##slot##_args *args);
CA_KERNEL_LIST(CPU_KERNEL_PROTO)
#undef CPU_KERNEL_PROTO

#endif
