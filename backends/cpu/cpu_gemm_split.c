/* cpu_gemm_split.c: a small or medium f32 GEMM split over the kernels' OpenMP team (cpu_parallel.h) in
 * blocks of C's rows or columns, each block one single-threaded GEMM.
 *
 * Why: OpenBLAS keeps GEMMs of the MLP's sizes (16 x 784 x 256 and the like) on one thread, or splits them
 * so that its threads wait for each other in sched_yield (bench/RESULTS.md: the MLP's serial fraction was
 * 16-30%, most of it these GEMMs). Inside a parallel region OpenBLAS's OpenMP build and oneDNN run on the
 * calling thread, so a block is a plain one-thread call and the team is the one the other kernels use. A
 * block takes the one-thread library rule (oneDNN from CPU_ONEDNN_MIN_MNK multiply-adds, where it measured
 * faster on these shapes). A GEMM from CPU_ONEDNN_MIN_MNK_THREADED is split too while each thread's block
 * keeps CPU_GEMM_SPLIT_BIG_MNK multiply-adds, else it stays with the library's own threads: at 2 threads
 * oneDNN's own partition of the GPT 6 x 384's GEMMs (2048 x 1152 x 384 and the like) spent 8% more CPU time
 * than two one-thread oneDNN calls on halves of C (bench/RESULTS.md), time that the step's profile
 * counted as GEMM work grown at 2 threads and as serial stretches where one thread ran on alone.
 *
 * Determinism: a block is all of k for its rows or columns, so no sum is split and each element's sum
 * runs in the library's own order; but a library may choose its kernel by the block's shape. Where
 * deterministic mode promises the same bits at every thread count (docs/DETERMINISM.md) the blocks
 * depend on the shape alone (at most CPU_GEMM_DET_BLOCKS, CACCEL_CPU_GRAIN ignored) and run at every thread
 * count, one included.
 * Otherwise there is one block per thread and one thread runs the whole GEMM as one call. */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_parallel.h"

#include <cblas.h>
#include <stdatomic.h>

/* Multiply-adds per block below which a GEMM is not split: about 10 microseconds of one core's GEMM, against
 * the 1 to 3 microseconds a fork-join costs (the MLP's batch-16 output layer, 16 x 128 x 10, stays whole). */
#define CPU_GEMM_SPLIT_MNK (1 << 18)
/* Rows or columns per block are a multiple of this (OpenBLAS's and oneDNN's f32 register tiles are 16
 * wide with AVX-512; 16 floats are a 64-byte line, so blocks of C's columns share no line either). */
#define CPU_GEMM_SPLIT_ALIGN 16
/* The most blocks in deterministic mode, whatever the thread count. */
#define CPU_GEMM_DET_BLOCKS 8
/* Multiply-adds each thread of a library GEMM (one not split here) gets at least: 16 Mi, 0.2 to 0.5 ms of one
 * core, against OpenBLAS's own floor of 256 Ki a thread, under which the threads of its OpenMP and pthreads
 * pools spent their time waiting for each other in sched_yield on the 128-wide GEMMs of the small GPT
 * (bench/RESULTS.md, 16 cores). A GEMM of the GPT 6 x 384's or BERT's size (300 Mi and up) still gets 16
 * threads; the small GPT's 2048 x 128 x 384 (96 Mi) gets 6. */
#define CPU_GEMM_THREAD_MNK (1 << 24)
/* Multiply-adds per block from which a large GEMM (CPU_ONEDNN_MIN_MNK_THREADED and up) is split, one block a
 * thread: 128 Mi, 1 to 3 ms of one core. Below it (the small GPT's 2048 x 512 x 128 at 2 threads; GPT 6 x
 * 384's GEMMs at 16) the library's own 2-D partition keeps each thread's share of B and C smaller. */
#define CPU_GEMM_SPLIT_BIG_MNK (1 << 27)

typedef struct split_gemm {
    bool ta, tb, by_rows;
    int64_t m, n, k, lda, ldb, ldc, dim, nblocks;
    float alpha, beta;
    const float *a, *b;
    float *c;
    atomic_int failed;   /* 1 + the first failing block's index, 0 when none failed */
} split_gemm;

/* Block i of nb over dim, in units of CPU_GEMM_SPLIT_ALIGN (the last block takes the remainder). */
static void block_bounds(int64_t dim, int64_t i, int64_t nb, int64_t *lo, int64_t *hi) {
    int64_t units = (dim + CPU_GEMM_SPLIT_ALIGN - 1) / CPU_GEMM_SPLIT_ALIGN;
    *lo = units * i / nb * CPU_GEMM_SPLIT_ALIGN;
    *hi = units * (i + 1) / nb * CPU_GEMM_SPLIT_ALIGN;
    if (*hi > dim) *hi = dim;
}

/* One block as one single-threaded GEMM: rows [lo, hi) of C take rows of op(A); columns, columns of op(B). */
static ca_status run_block(const split_gemm *s, int64_t lo, int64_t hi) {
    int64_t m = s->by_rows ? hi - lo : s->m, n = s->by_rows ? s->n : hi - lo;
    const float *a = s->a, *b = s->b;
    float *c = s->c;
    if (s->by_rows) {
        a += s->ta ? lo : lo * s->lda;
        c += lo * s->ldc;
    } else {
        b += s->tb ? lo * s->ldb : lo;
        c += lo;
    }
    if (cpu_f32_gemm_onednn_at(m, n, s->k, 1))
        return cpu_onednn_sgemm_threads(1, s->ta, s->tb, m, n, s->k, s->alpha, a, s->lda, b, s->ldb, s->beta, c,
                                        s->ldc);
    cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, (blasint)m,
                (blasint)n, (blasint)s->k, s->alpha, a, (blasint)s->lda, b, (blasint)s->ldb, s->beta, c,
                (blasint)s->ldc);
    return CA_OK;
}

static void blocks_range(void *p, int64_t lo, int64_t hi) {
    split_gemm *s = p;
    for (int64_t i = lo; i < hi; i++) {
        int64_t r0, r1;
        block_bounds(s->dim, i, s->nblocks, &r0, &r1);
        if (r1 > r0 && run_block(s, r0, r1) != CA_OK) {
            int none = 0;
            atomic_compare_exchange_strong(&s->failed, &none, (int)(i + 1));
        }
    }
}

int cpu_gemm_threads(int64_t m, int64_t n, int64_t k, int threads) {
    int64_t mnk = m * n * k, per = cpu_grain_override() > 0 ? cpu_grain_override() : CPU_GEMM_THREAD_MNK;
    int64_t want = mnk / per + (mnk % per != 0);
    if (want < 1) want = 1;
    return threads < 1 ? 1 : want < threads ? (int)want : threads;
}

/* Blocks for this GEMM, 1 when it is not split. The count is bounded by the work (a block at least
 * CPU_GEMM_SPLIT_MNK multiply-adds), by C's widest dimension in register tiles, and by the threads (outside
 * deterministic mode) or CPU_GEMM_DET_BLOCKS (in it); each block then gets a thread of its own. */
static int64_t split_blocks(int64_t m, int64_t n, int64_t k, bool deterministic) {
    int64_t mnk = m * n * k, dim = m > n ? m : n;
    if (!deterministic && (cpu_threads() <= 1 || cpu_in_parallel())) return 1;
    /* large GEMMs keep their library's own threads (oneDNN's team; OpenBLAS's where oneDNN is absent) unless
     * every thread's block is large too (CPU_GEMM_SPLIT_BIG_MNK) */
    bool big = mnk >= CPU_ONEDNN_MIN_MNK_THREADED;
    if (!deterministic && (big ? mnk / cpu_threads() < CPU_GEMM_SPLIT_BIG_MNK
                               : cpu_f32_gemm_onednn_at(m, n, k, cpu_threads())))
        return 1;
    /* deterministic blocks ignore CACCEL_CPU_GRAIN too: the bits may not depend on a test's knob */
    int64_t grain = cpu_grain_override() > 0 && !deterministic ? cpu_grain_override() : CPU_GEMM_SPLIT_MNK;
    int64_t most = mnk / grain, units = (dim + CPU_GEMM_SPLIT_ALIGN - 1) / CPU_GEMM_SPLIT_ALIGN;
    if (most > units) most = units;
    int64_t cap = deterministic ? CPU_GEMM_DET_BLOCKS : cpu_threads();
    return most < cap ? (most < 1 ? 1 : most) : cap;
}

bool cpu_gemm_split(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float beta, float *c, int64_t ldc, ca_status *st) {
    int64_t nb = split_blocks(m, n, k, cpu_deterministic());
    if (nb <= 1) return false;
    split_gemm s = {.ta = ta, .tb = tb, .by_rows = m > n, .m = m, .n = n, .k = k, .lda = lda, .ldb = ldb,
                    .ldc = ldc, .dim = m > n ? m : n, .nblocks = nb, .alpha = alpha, .beta = beta, .a = a,
                    .b = b, .c = c};
    atomic_init(&s.failed, 0);
    cpu_team_note(CPU_TEAM_GEMM, (int)(nb < cpu_threads() ? nb : cpu_threads()));
    cpu_parallel_team(nb, (int)nb, blocks_range, &s);
    int bad = atomic_load(&s.failed);
    /* a worker's error message stays on its thread: name the block here */
    *st = bad == 0 ? CA_OK
                   : ca_error(CA_ERR_BACKEND, "cpu kernel gemm: block %d of %lld of a %lld x %lld x %lld GEMM "
                                              "split over the threads failed in oneDNN",
                              bad - 1, (long long)nb, (long long)m, (long long)n, (long long)k);
    return true;
}
