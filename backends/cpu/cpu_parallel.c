/* cpu_parallel.c: the drivers of cpu_parallel.h on OpenMP. The only file of the backend built with
 * -fopenmp: kernels stay serial range functions and need no OpenMP runtime of their own. */
#include "backends/cpu/cpu_parallel.h"

#include <cblas.h>
#include <stdatomic.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#else /* a compiler without OpenMP: every driver runs its range on the calling thread */
static int omp_in_parallel(void) { return 0; }
static int omp_get_thread_num(void) { return 0; }
static int omp_get_num_threads(void) { return 1; }
#endif

/* The process-wide count, read on every call: OpenMP's own nthreads-var is per thread, and kernels run
 * from the caller's threads (a training thread, a dataloader's), which would each start from the default. */
static atomic_int threads = 1;

int cpu_threads(void) {
#ifdef _OPENMP
    return atomic_load_explicit(&threads, memory_order_relaxed);
#else
    return 1;
#endif
}

void cpu_set_threads(int n) {
    if (n < 1) n = 1;
    atomic_store(&threads, n);
    openblas_set_num_threads(n);
}

bool cpu_in_parallel(void) { return omp_in_parallel() != 0; }

/* CACCEL_CPU_GRAIN=N replaces every loop's grain (and the blocks' threshold) by N: with N = 1 the tests run
 * every parallel path on their small shapes (tests/test_threads.sh). Read once; unset or invalid: the
 * kernels' own grains. */
static int64_t grain_override(void) {
    static atomic_llong g = -1;
    long long v = atomic_load_explicit(&g, memory_order_relaxed);
    if (v >= 0) return v;
    const char *e = getenv("CACCEL_CPU_GRAIN");
    char *end = NULL;
    long long n = e && *e ? strtoll(e, &end, 10) : 0;
    v = end && *end == '\0' && n > 0 ? n : 0;
    atomic_store(&g, v);
    return v;
}

int64_t cpu_grain_override(void) { return grain_override(); }

/* The floating-point mode (MXCSR: FTZ/DAZ, rounding) is per thread, and the device sets it on the calling
 * thread for the length of a kernel (cpu_device.c): a worker runs its part in the caller's mode and then
 * puts its own back, so a kernel computes the same bits on any thread. */
#if defined(__x86_64__) || defined(__i386__)
typedef unsigned fp_mode;
static fp_mode fp_get(void) { return _mm_getcsr(); }
static void fp_set(fp_mode m) { _mm_setcsr(m); }
#else
typedef int fp_mode;
static fp_mode fp_get(void) { return 0; }
static void fp_set(fp_mode m) { (void)m; }
#endif

/* Thread t of nt gets [n*t/nt, n*(t+1)/nt): contiguous, balanced within one element. */
static void split(int64_t n, int t, int nt, int64_t *lo, int64_t *hi) {
    *lo = (int64_t)((__int128)n * t / nt);
    *hi = (int64_t)((__int128)n * (t + 1) / nt);
}

/* fn over [0, n) on a team of nt threads, each in the caller's floating-point mode. */
static void run_team(int64_t n, int nt, cpu_range_fn fn, void *ctx) {
    fp_mode caller = fp_get();
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    {
        int64_t lo, hi;
        split(n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        fp_mode own = fp_get();
        if (own != caller) fp_set(caller);
        if (hi > lo) fn(ctx, lo, hi);
        if (own != caller) fp_set(own);
    }
}

void cpu_parallel_for(int64_t n, int64_t grain, cpu_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain_override() > 0) grain = grain_override();
    if (grain < 1) grain = 1;
    int nt = cpu_threads();
    int64_t most = n / grain;  /* never give a thread less than one grain */
    if (most < nt) nt = most < 1 ? 1 : (int)most;
    if (nt <= 1 || omp_in_parallel()) {
        fn(ctx, 0, n);
        return;
    }
    run_team(n, nt, fn, ctx);
}

typedef struct blocks_ctx {
    cpu_block_fn fn;
    void *ctx;
} blocks_ctx;

static void blocks_range(void *p, int64_t lo, int64_t hi) {
    const blocks_ctx *b = p;
    for (int64_t i = lo; i < hi; i++) b->fn(b->ctx, i);
}

void cpu_parallel_blocks(int64_t nblocks, int64_t block_cost, cpu_block_fn fn, void *ctx) {
    if (nblocks <= 0) return;
    int nt = cpu_threads();
    if (nt > nblocks) nt = (int)nblocks;
    int64_t threshold = grain_override() > 0 ? grain_override() : CPU_GRAIN;
    blocks_ctx b = {fn, ctx};
    if (nt <= 1 || omp_in_parallel() || nblocks * (block_cost < 1 ? 1 : block_cost) < threshold)
        blocks_range(&b, 0, nblocks);
    else
        run_team(nblocks, nt, blocks_range, &b);
}
