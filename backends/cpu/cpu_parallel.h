/* cpu_parallel.h: the CPU kernels' threads. One OpenMP team, the same one OpenBLAS (its OpenMP build) and
 * oneDNN use, so that a step's GEMMs and the kernels around them share threads instead of two pools spinning
 * against each other. Kernels stay plain serial loops over a range (cloned per ISA by CPU_CLONES); these
 * drivers, built with OpenMP in cpu_parallel.c, split the range. No OpenMP pragma appears in a kernel file.
 *
 * Threading: the drivers may be called from any thread. Inside a parallel region (a nested call) they run
 * the whole range on the calling thread. The thread count is process-wide (cpu_set_threads).
 *
 * Determinism: cpu_parallel_for hands each thread a contiguous range; a kernel whose result for one element
 * depends only on that element is then the same at every thread count. A reduction must not depend on how
 * the range was split: it sums fixed blocks (cpu_parallel_blocks, CPU_REDUCE_BLOCK) and then combines the
 * block partials in block order on one thread, so its result is bit-identical at 1, 2, 3 ... threads. */
#ifndef CACCEL_CPU_PARALLEL_H
#define CACCEL_CPU_PARALLEL_H

#include <stdbool.h>
#include <stdint.h>

/* Elements of streaming work (one read, one write of a float) below which a loop stays serial: about 10
 * microseconds at memory speed, against the 1 to 3 microseconds a fork-join of an idle OpenMP team costs. A
 * kernel with more work per element passes a smaller grain (cpu_grain_for). */
#define CPU_GRAIN 32768

/* CACCEL_CPU_GRAIN=N in the environment replaces every grain and threshold by N (read once): tests set 1 so
 * that every parallel path runs on their small shapes. */

/* The CACCEL_CPU_GRAIN override, 0 when unset: for a threshold that is not a loop's grain (a GEMM's
 * multiply-adds, cpu_gemm_split.c). */
int64_t cpu_grain_override(void);

/* Elements per fixed block of a deterministic reduction (see above). */
#define CPU_REDUCE_BLOCK 8192

/* Grain for a loop whose iterations each cost about `cost` streaming elements (a row of `cols` floats:
 * cost = cols). Never below 1. */
static inline int64_t cpu_grain_for(int64_t cost) {
    if (cost < 1) cost = 1;
    int64_t g = CPU_GRAIN / cost;
    return g < 1 ? 1 : g;
}

/* fn(ctx, lo, hi) over [0, n) split into at most cpu_threads() contiguous ranges; serial (one call with
 * [0, n)) when n < grain, when one thread is set, or when called inside a parallel region. */
typedef void (*cpu_range_fn)(void *ctx, int64_t lo, int64_t hi);
void cpu_parallel_for(int64_t n, int64_t grain, cpu_range_fn fn, void *ctx);

/* fn(ctx, b) for every block b in [0, nblocks), in parallel when nblocks * block_cost >= CPU_GRAIN. Which
 * thread runs a block does not change what the block computes: the deterministic half of a reduction. */
typedef void (*cpu_block_fn)(void *ctx, int64_t block);
void cpu_parallel_blocks(int64_t nblocks, int64_t block_cost, cpu_block_fn fn, void *ctx);

/* Threads the kernels use (>= 1). */
int cpu_threads(void);
/* Sets the kernels' and OpenBLAS's thread count (clamped to >= 1). Not meant to be called while kernels
 * run on other threads. */
void cpu_set_threads(int n);
/* Whether the calling thread is inside one of the drivers' parallel regions. */
bool cpu_in_parallel(void);

#endif
