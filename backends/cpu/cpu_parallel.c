/* cpu_parallel.c: the drivers of cpu_parallel.h on OpenMP. The only file of the backend built with
 * -fopenmp: kernels stay serial range functions and need no OpenMP runtime of their own. */
#include "backends/cpu/cpu_parallel.h"

#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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
    cpu_blas_set_threads(n);
}

/* 0 until first set: OpenBLAS's own count then */
static atomic_int blas_threads;

int cpu_blas_threads(void) {
    int n = atomic_load_explicit(&blas_threads, memory_order_relaxed);
    return n > 0 ? n : openblas_get_num_threads();
}

void cpu_blas_set_threads(int n) {
    if (n < 1) n = 1;
    atomic_store(&blas_threads, n);
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

/* Thread t of nt gets [n*t/nt, n*(t+1)/nt): contiguous, balanced within one element. Fixed shares, not
 * chunks claimed by whichever thread is free: claimed chunks were measured to cost 5% more work on the small
 * GPT (a thread's rows move to the other core from op to op) and to shorten no serial stretch that the
 * runs' spread could show (bench/RESULTS.md, 2026-11-30). */
static void split(int64_t n, int t, int nt, int64_t *lo, int64_t *hi) {
    *lo = (int64_t)((__int128)n * t / nt);
    *hi = (int64_t)((__int128)n * (t + 1) / nt);
}

/* ------------------------------------------------------------ CACCEL_CPU_TEAMS_LOG */

/* One fork-join as the log writes it (cpu_parallel.h). */
typedef struct team_rec {
    double t0, t1, busy, one;
    int team;
    char kind;
} team_rec;

static struct {
    pthread_mutex_t lock;
    team_rec *r;
    size_t n, cap;
    bool full;
} tlog = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void tlog_print(FILE *f, const char *path) {
    fprintf(f, "# caccel cpu teams log: kind t0 t1 team busy one (CLOCK_MONOTONIC seconds; L kernel loop, S GEMM "
               "split in blocks, G library GEMM; busy: thread-seconds worked, one: seconds with one thread "
               "working; - where unknown)%s\n", tlog.full ? " (truncated: the log's memory ran out)" : "");
    for (size_t i = 0; i < tlog.n; i++) {
        const team_rec *r = &tlog.r[i];
        if (r->kind == 'G')
            fprintf(f, "G %.7f %.7f %d - -\n", r->t0, r->t1, r->team);
        else
            fprintf(f, "%c %.7f %.7f %d %.7f %.7f\n", r->kind, r->t0, r->t1, r->team, r->busy, r->one);
    }
    if (fclose(f) != 0) fprintf(stderr, "caccel: CACCEL_CPU_TEAMS_LOG: writing %s failed\n", path);
}

/* At exit: the records to the file the variable names then, their memory freed (a record made later is
 * dropped). */
static void tlog_write(void) {
    const char *path = getenv("CACCEL_CPU_TEAMS_LOG");
    pthread_mutex_lock(&tlog.lock);
    FILE *f = path && *path ? fopen(path, "w") : NULL;
    if (!f) fprintf(stderr, "caccel: CACCEL_CPU_TEAMS_LOG: cannot write %s\n", path ? path : "(unset at exit)");
    else tlog_print(f, path);
    free(tlog.r);
    tlog.r = NULL;
    tlog.n = tlog.cap = 0;
    tlog.full = true;
    pthread_mutex_unlock(&tlog.lock);
}

/* A diagnostic switch decided once from the environment (*on: -1 until then): the first caller to decide
 * registers at_exit when it is on. */
static bool switch_once(atomic_int *on, bool want, void (*at_exit)(void)) {
    int unset = -1;
    if (atomic_compare_exchange_strong(on, &unset, want) && want) atexit(at_exit);
    return atomic_load(on);
}

bool cpu_team_log_on(void) {
    static atomic_int on = -1;
    int v = atomic_load_explicit(&on, memory_order_relaxed);
    if (v >= 0) return v;
    const char *e = getenv("CACCEL_CPU_TEAMS_LOG");
    return switch_once(&on, e && *e, tlog_write);
}

double cpu_team_clock(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_edge(const void *a, const void *b) {
    double x = ((const double *)a)[0], y = ((const double *)b)[0];
    return x < y ? -1 : x > y;
}

/* A team's busy thread-seconds and the seconds in which exactly one of its threads worked, from each
 * thread's start and end: the edges sorted, the working count swept. */
static void team_times(int nt, const double *start, const double *end, double *busy, double *one) {
    double edge[2 * TEAM_LOG_MAX][2];
    *busy = *one = 0.0;
    for (int i = 0; i < nt; i++) {
        *busy += end[i] - start[i];
        edge[2 * i][0] = start[i], edge[2 * i][1] = 1;
        edge[2 * i + 1][0] = end[i], edge[2 * i + 1][1] = -1;
    }
    qsort(edge, (size_t)(2 * nt), sizeof edge[0], cmp_edge);
    int working = 0;
    for (int i = 0; i + 1 < 2 * nt; i++) {
        working += (int)edge[i][1];
        if (working == 1) *one += edge[i + 1][0] - edge[i][0];
    }
}

void cpu_team_log(char kind, double t0, double t1, int nt, const double *start, const double *end) {
    team_rec r = {.t0 = t0, .t1 = t1, .team = nt, .kind = kind};
    if (start) team_times(nt, start, end, &r.busy, &r.one);
    pthread_mutex_lock(&tlog.lock);
    if (tlog.n == tlog.cap && !tlog.full) {
        size_t cap = tlog.cap ? 2 * tlog.cap : 4096;
        team_rec *p = realloc(tlog.r, cap * sizeof *p);
        if (p) tlog.r = p, tlog.cap = cap;
        else tlog.full = true;
    }
    if (tlog.n < tlog.cap) tlog.r[tlog.n++] = r;
    pthread_mutex_unlock(&tlog.lock);
}

/* fn over [0, n) on a team of nt threads, each in the caller's floating-point mode; logged as `kind`. */
static void run_team(int64_t n, int nt, cpu_range_fn fn, void *ctx, char kind) {
    fp_mode caller = fp_get();
    bool timed = nt <= TEAM_LOG_MAX && cpu_team_log_on();
    double start[TEAM_LOG_MAX], end[TEAM_LOG_MAX], t0 = timed ? cpu_team_clock() : 0.0;
    int got = 1;   /* the team OpenMP gave (it may give fewer than asked) */
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
    {
        int64_t lo, hi;
        int t = omp_get_thread_num(), team = omp_get_num_threads();
        split(n, t, team, &lo, &hi);
        if (timed) start[t] = cpu_team_clock();
        fp_mode own = fp_get();
        if (own != caller) fp_set(caller);
        if (hi > lo) fn(ctx, lo, hi);
        if (own != caller) fp_set(own);
        if (timed) end[t] = cpu_team_clock();
        if (t == 0) got = team;
    }
    if (timed) cpu_team_log(kind, t0, cpu_team_clock(), got, start, end);
}

int cpu_team_size(int64_t n, int64_t grain, int nthreads) {
    int64_t over = grain_override();
    if (over > 0) grain = over;
    if (grain < 1) grain = 1;
    if (nthreads <= 1 || n < grain) return 1;
    /* a thread's share in iterations: CPU_TEAM_GRAINS grains, one iteration where the grain is one */
    int64_t share = over > 0 || grain == 1 ? grain : grain * CPU_TEAM_GRAINS;
    int64_t team = n / share + (n % share != 0);
    return team < nthreads ? (int)team : nthreads;
}

/* The tallies of CACCEL_CPU_TEAMS=1: slot t - 1 counts teams of t threads, the last slot larger ones. */
#define TEAM_SLOTS 64
static atomic_llong tally[2][TEAM_SLOTS];

static void print_tally(void) {
    static const char *const what[2] = {"kernel loops", "library GEMMs"};
    for (int k = 0; k < 2; k++) {
        char line[1024];
        int at = snprintf(line, sizeof line, "caccel cpu teams: %s by threads:", what[k]);
        for (int t = 0; t < TEAM_SLOTS && at < (int)sizeof line - 40; t++) {
            long long c = atomic_load(&tally[k][t]);
            if (c) at += snprintf(line + at, sizeof line - (size_t)at, " %d%s=%lld", t + 1, t == TEAM_SLOTS - 1 ? "+" : "", c);
        }
        fprintf(stderr, "%s\n", line);
    }
}

static bool tally_on(void) {
    static atomic_int on = -1;
    int v = atomic_load_explicit(&on, memory_order_relaxed);
    if (v >= 0) return v;
    const char *e = getenv("CACCEL_CPU_TEAMS");
    return switch_once(&on, e && !strcmp(e, "1"), print_tally);
}

void cpu_team_note(cpu_team_kind kind, int team) {
    if (!tally_on() || omp_in_parallel()) return;
    int slot = team < 1 ? 0 : team > TEAM_SLOTS ? TEAM_SLOTS - 1 : team - 1;
    atomic_fetch_add_explicit(&tally[kind == CPU_TEAM_GEMM][slot], 1, memory_order_relaxed);
}

void cpu_parallel_team(int64_t n, int team, cpu_range_fn fn, void *ctx) {
    if (n <= 0) return;
    int nt = cpu_threads();
    if (team < nt) nt = team;
    if (n < nt) nt = (int)n;
    if (nt <= 1 || omp_in_parallel()) {
        fn(ctx, 0, n);
        return;
    }
    run_team(n, nt, fn, ctx, 'S');
}

void cpu_parallel_for(int64_t n, int64_t grain, cpu_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (omp_in_parallel()) {
        fn(ctx, 0, n);
        return;
    }
    int nt = cpu_team_size(n, grain, cpu_threads());
    cpu_team_note(CPU_TEAM_LOOP, nt);
    if (nt <= 1)
        fn(ctx, 0, n);
    else
        run_team(n, nt, fn, ctx, 'L');
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
    blocks_ctx b = {fn, ctx};
    cpu_parallel_for(nblocks, cpu_grain_for(block_cost), blocks_range, &b);
}

void cpu_blas_threads_begin(int n) {
    if (n < 1) n = 1;
    if (openblas_get_num_threads() != n) openblas_set_num_threads(n);
}

void cpu_blas_threads_end(void) {
    int n = cpu_blas_threads();
    if (openblas_get_num_threads() != n) openblas_set_num_threads(n);
}
