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

/* Grains of work each thread of a team gets at least (CPU_TEAM_GRAINS * CPU_GRAIN = 64 Ki streaming
 * elements, 20 to 40 microseconds of one core). A team's fork-join grows with its size (the barrier, the
 * wake-ups, each thread's cold cache lines), so a kernel uses only the threads its work pays for:
 * bench/RESULTS.md measured the small GPT (ops of at most 256 Ki elements) slower at 16 threads than at 4
 * when each op forked over every thread a grain could feed. */
#define CPU_TEAM_GRAINS 2

/* The team of a loop of n iterations with this grain (iterations per CPU_GRAIN of work) at `threads` threads:
 * min(threads, ceil(n / (grain * CPU_TEAM_GRAINS))), never more than n, 1 when n < grain. A grain of 1 says
 * an iteration is a grain of work or more: each thread gets at least one. With CACCEL_CPU_GRAIN=N the grain is
 * N and a thread's share one grain (the tests' every-path mode). Depends on its arguments (and that knob)
 * only: a deterministic kernel's partition must not depend on it, only the number of threads that share
 * the partition's parts. */
int cpu_team_size(int64_t n, int64_t grain, int threads);

/* fn(ctx, lo, hi) over [0, n) split into cpu_team_size(n, grain, cpu_threads()) contiguous ranges; serial
 * (one call with [0, n)) when that is 1, or when called inside a parallel region. */
typedef void (*cpu_range_fn)(void *ctx, int64_t lo, int64_t hi);
void cpu_parallel_for(int64_t n, int64_t grain, cpu_range_fn fn, void *ctx);

/* fn(ctx, lo, hi) over [0, n) on exactly min(team, n, cpu_threads()) threads, for a caller that sized its
 * team by its own rule (a GEMM split in blocks, cpu_gemm_split.c); serial inside a parallel region. */
void cpu_parallel_team(int64_t n, int team, cpu_range_fn fn, void *ctx);

/* fn(ctx, b) for every block b in [0, nblocks), on the team cpu_team_size gives nblocks blocks of
 * block_cost streaming elements each (serial below CPU_GRAIN of work). Which thread runs a block does not
 * change what the block computes: the deterministic half of a reduction. */
typedef void (*cpu_block_fn)(void *ctx, int64_t block);
void cpu_parallel_blocks(int64_t nblocks, int64_t block_cost, cpu_block_fn fn, void *ctx);

/* The BLAS thread count as set: by cpu_set_threads, or deterministic mode's 1 (cpu_blas_set_threads). A
 * GEMM's own smaller count (cpu_blas_threads_begin) is put back to this one, never to OpenBLAS's global as
 * read at the time, which another thread's GEMM may have lowered for the length of its call. */
int cpu_blas_threads(void);
void cpu_blas_set_threads(int n);
/* A library GEMM (OpenBLAS, oneDNN) on n threads: sets OpenBLAS's count (its OpenMP build also takes the
 * calling thread's OpenMP count from it, and oneDNN's calls set that again) until cpu_blas_threads_end puts
 * cpu_blas_threads() back. No change when n is the count already. */
void cpu_blas_threads_begin(int n);
void cpu_blas_threads_end(void);

/* CACCEL_CPU_TEAMS=1: counts every kernel loop's team (1 = serial) and every library GEMM's thread count
 * (outside parallel regions) and prints both tallies on stderr at exit, one line each, so that a run at
 * many threads shows what the rules chose (bench/run_threads.sh). Off: nothing is counted. */
typedef enum cpu_team_kind { CPU_TEAM_LOOP, CPU_TEAM_GEMM } cpu_team_kind;
void cpu_team_note(cpu_team_kind kind, int team);

/* CACCEL_CPU_TEAMS_LOG=FILE: every fork-join of the kernels' team (a kernel loop, L; a GEMM split in blocks,
 * S) and every library GEMM on more than one thread (G) is recorded with its start and end on the calling
 * thread (CLOCK_MONOTONIC), its team, and for L and S the team's busy thread-seconds and the seconds in
 * which exactly one of its threads worked, from each thread's own timestamps (two clock reads per thread
 * and fork-join); the records are written at exit to the file the variable then names. bench/serial_profile.py
 * (--teams) takes the serial time of the caccel code from it exactly, beside a perf profile's samples or in a
 * run without perf, whose sampling interrupts stretch the joins themselves (bench/RESULTS.md). Off: no clock
 * is read. Teams above TEAM_LOG_MAX threads are not logged. */
#define TEAM_LOG_MAX 256
bool cpu_team_log_on(void);
double cpu_team_clock(void);
/* start, end: each thread's, or NULL (a library GEMM: its inside is the library's). Thread-safe. */
void cpu_team_log(char kind, double t0, double t1, int team, const double *start, const double *end);

/* Threads the kernels use (>= 1). */
int cpu_threads(void);
/* Sets the kernels' and OpenBLAS's thread count (clamped to >= 1). Not meant to be called while kernels
 * run on other threads. */
void cpu_set_threads(int n);
/* Whether the calling thread is inside one of the drivers' parallel regions. */
bool cpu_in_parallel(void);

#endif
