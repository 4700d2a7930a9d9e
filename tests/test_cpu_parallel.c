/* The CPU kernels' thread drivers (backends/cpu/cpu_parallel.h) and their setup (cpu_threads.c):
 * cpu_parallel_for covers [0, n) exactly once in contiguous ranges, one per thread; a nested call and a
 * loop below its grain run serial on the calling thread; cpu_parallel_blocks visits every block once;
 * workers run in the caller's MXCSR mode; a forked child runs its kernels on one thread instead of
 * hanging in libgomp; and the cgroup CPU quota parser on fixture files. Run without CACCEL_CPU_GRAIN. */
#include "test_cpu_util.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_parallel.h"
#include "backends/cpu/cpu_plugin.h"
#include <cblas.h>

#define MAXN 4096
#define MAXCALLS 64

/* What the range functions saw. */
typedef struct seen {
    atomic_int hits[MAXN];
    atomic_int calls;
    int64_t lo[MAXCALLS], hi[MAXCALLS];
    pthread_t who[MAXCALLS];
    unsigned csr[MAXCALLS];
    atomic_int nested_calls, nested_whole;
} seen;

static seen S;

static void reset(void) { memset(&S, 0, sizeof S); }

static unsigned csr_now(void) {
#if defined(__SSE2__)
    return _mm_getcsr() & 0xffc0u;   /* every bit but the status flags */
#else
    return 0;
#endif
}

static void record(int64_t lo, int64_t hi) {
    int c = atomic_fetch_add(&S.calls, 1);
    if (c < MAXCALLS) {
        S.lo[c] = lo;
        S.hi[c] = hi;
        S.who[c] = pthread_self();
        S.csr[c] = csr_now();
    }
    for (int64_t i = lo; i < hi && i < MAXN; i++) atomic_fetch_add(&S.hits[i], 1);
}

static void range_fn(void *ctx, int64_t lo, int64_t hi) {
    (void)ctx;
    record(lo, hi);
}

static void inner_fn(void *ctx, int64_t lo, int64_t hi) {
    (void)ctx;
    atomic_fetch_add(&S.nested_calls, 1);
    if (lo == 0 && hi == 100 && cpu_in_parallel()) atomic_fetch_add(&S.nested_whole, 1);
}

static void outer_fn(void *ctx, int64_t lo, int64_t hi) {
    record(lo, hi);
    cpu_parallel_for(100, 1, inner_fn, ctx);
}

static void block_fn(void *ctx, int64_t b) {
    (void)ctx;
    record(b, b + 1);
}

static int distinct_threads(int calls) {
    int d = 0;
    for (int i = 0; i < calls; i++) {
        bool dup = false;
        for (int j = 0; j < i; j++) dup = dup || pthread_equal(S.who[i], S.who[j]);
        d += !dup;
    }
    return d;
}

/* Every element once; the calls' ranges, sorted by lo, tile [0, n) (each call one contiguous range). */
static void assert_tiles(int64_t n, int calls) {
    assert_int_equal(atomic_load(&S.calls), calls);
    for (int64_t i = 0; i < n; i++)
        if (atomic_load(&S.hits[i]) != 1) fail_msg("element %lld covered %d times", (long long)i, S.hits[i]);
    int64_t at = 0;
    for (int k = 0; k < calls; k++) {   /* find the range starting at `at` */
        int found = -1;
        for (int c = 0; c < calls; c++)
            if (S.lo[c] == at && S.hi[c] > at) found = c;
        if (found < 0) fail_msg("no range starts at %lld", (long long)at);
        at = S.hi[found];
    }
    assert_int_equal(at, n);
}

static void test_ranges_cover_once(void **state) {
    (void)state;
    const int64_t sizes[] = {3, 7, 1000, MAXN};
    for (int nt = 1; nt <= 4; nt++) {
        cpu_set_threads(nt);
        int t = cpu_threads();   /* 1 where built without OpenMP */
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            int64_t n = sizes[k];
            reset();
            cpu_parallel_for(n, 1, range_fn, NULL);
            int want = n < t ? (int)n : t;
            assert_tiles(n, want);
            assert_int_equal(distinct_threads(want), want);   /* really on `want` threads */
            for (int c = 0; c < want; c++)    /* balanced within one element */
                assert_true(S.hi[c] - S.lo[c] == n / want || S.hi[c] - S.lo[c] == n / want + 1);
        }
    }
}

static void test_grain_keeps_small_serial(void **state) {
    (void)state;
    cpu_set_threads(3);
    int t = cpu_threads();
    reset();
    cpu_parallel_for(10, 100, range_fn, NULL);   /* below one grain: one call, here */
    assert_tiles(10, 1);
    assert_true(pthread_equal(S.who[0], pthread_self()));
    reset();
    cpu_parallel_for(5, 2, range_fn, NULL);      /* two grains' worth: never a thread under one grain */
    assert_tiles(5, t < 2 ? t : 2);
    reset();
    cpu_parallel_for(CPU_GRAIN - 1, CPU_GRAIN, range_fn, NULL);
    assert_int_equal(atomic_load(&S.calls), 1);
}

static void test_nested_runs_serial(void **state) {
    (void)state;
    cpu_set_threads(3);
    int t = cpu_threads();
    reset();
    cpu_parallel_for(30, 1, outer_fn, NULL);
    assert_tiles(30, t);
    assert_int_equal(atomic_load(&S.nested_calls), t);   /* one whole-range call per outer range */
    if (t > 1) assert_int_equal(atomic_load(&S.nested_whole), t);
    assert_false(cpu_in_parallel());
}

static void test_blocks_once(void **state) {
    (void)state;
    cpu_set_threads(3);
    int t = cpu_threads();
    reset();
    cpu_parallel_blocks(10, CPU_GRAIN, block_fn, NULL);
    assert_tiles(10, 10);
    assert_int_equal(distinct_threads(10), t);
    reset();
    cpu_parallel_blocks(10, 1, block_fn, NULL);   /* 10 elements of work: serial, in block order */
    assert_tiles(10, 10);
    for (int c = 0; c < 10; c++) {
        assert_int_equal(S.lo[c], c);
        assert_true(pthread_equal(S.who[c], pthread_self()));
    }
}

/* The team rule (cpu_team_size) at the sizes of bench/RESULTS.md's small GPT: an op of 256 Ki elements gets
 * 4 threads of 16, not the 8 one grain a thread would feed; a library GEMM's threads grow with its
 * multiply-adds (cpu_gemm_threads). */
static void test_team_rule(void **state) {
    (void)state;
    assert_int_equal(cpu_team_size(262144, CPU_GRAIN, 16), 4);
    assert_int_equal(cpu_team_size(262144, CPU_GRAIN, 2), 2);
    assert_int_equal(cpu_team_size(262144, CPU_GRAIN, 1), 1);
    assert_int_equal(cpu_team_size(1 << 20, CPU_GRAIN, 16), 16);   /* the MLP's GELU: every thread */
    assert_int_equal(cpu_team_size(1 << 20, CPU_GRAIN, 64), 16);
    assert_int_equal(cpu_team_size(CPU_TEAM_GRAINS * CPU_GRAIN, CPU_GRAIN, 16), 1);   /* one thread's share */
    assert_int_equal(cpu_team_size(CPU_TEAM_GRAINS * CPU_GRAIN + 1, CPU_GRAIN, 16), 2);
    assert_int_equal(cpu_team_size(CPU_GRAIN - 1, CPU_GRAIN, 16), 1);
    assert_int_equal(cpu_team_size(2048, cpu_grain_for(128), 16), 4);   /* 2048 rows of 128: a layer norm */
    assert_int_equal(cpu_team_size(2048, cpu_grain_for(128), 3), 3);
    assert_int_equal(cpu_team_size(10, 1, 16), 10);   /* grain 1: an iteration a thread */
    assert_int_equal(cpu_team_size(100, 1, 16), 16);
    assert_int_equal(cpu_team_size(0, 1, 16), 1);
    /* library GEMMs: 16 Mi multiply-adds a thread */
    assert_int_equal(cpu_gemm_threads(2048, 128, 384, 16), 6);     /* the small GPT's c_attn */
    assert_int_equal(cpu_gemm_threads(2048, 128, 384, 4), 4);
    assert_int_equal(cpu_gemm_threads(2048, 384, 1152, 16), 16);   /* GPT 6 x 384's c_attn */
    assert_int_equal(cpu_gemm_threads(16, 784, 256, 16), 1);
    assert_int_equal(cpu_gemm_threads(256, 256, 256, 16), 1);      /* exactly one thread's share */
    assert_int_equal(cpu_gemm_threads(256, 256, 257, 16), 2);
    assert_int_equal(cpu_gemm_threads(2048, 384, 1152, 1), 1);     /* deterministic mode's one BLAS thread */
}

/* The drivers run the rule's team: at 16 threads (oversubscribed here, which changes no count) a loop of
 * 256 Ki elements forks 4 threads and a reduction of 32 fixed blocks of CPU_REDUCE_BLOCK 4; the reduction's
 * sum is the same bits at 1, 2, 3 and 16 threads, its blocks fixed by the size alone. */
static float block_sums[32];
static float data_for_sum[32 * CPU_REDUCE_BLOCK];

static void sum_block(void *ctx, int64_t b) {
    (void)ctx;
    record(b, b + 1);
    float s = 0.0f;
    for (int64_t i = 0; i < CPU_REDUCE_BLOCK; i++) s += data_for_sum[b * CPU_REDUCE_BLOCK + i];
    block_sums[b] = s;
}

static float blocks_sum(int nt) {
    cpu_set_threads(nt);
    reset();
    cpu_parallel_blocks(32, CPU_REDUCE_BLOCK, sum_block, NULL);
    assert_tiles(32, 32);
    float s = 0.0f;
    for (int b = 0; b < 32; b++) s += block_sums[b];
    return s;
}

static void test_team_drivers(void **state) {
    (void)state;
    cpu_set_threads(16);
    if (cpu_threads() == 1) skip();   /* built without OpenMP */
    reset();
    cpu_parallel_for(262144, CPU_GRAIN, range_fn, NULL);
    assert_int_equal(atomic_load(&S.calls), 4);
    assert_int_equal(distinct_threads(4), 4);
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof data_for_sum / sizeof data_for_sum[0]; i++) {
        x = x * 1664525u + 1013904223u;
        data_for_sum[i] = (float)(x >> 8) / (float)(1u << 24) - 0.5f;
    }
    float one = blocks_sum(1);
    assert_int_equal(distinct_threads(32), 1);
    float sixteen = blocks_sum(16);
    assert_int_equal(distinct_threads(32), 4);
    float two = blocks_sum(2), three = blocks_sum(3);
    assert_int_equal(distinct_threads(32), 3);
    assert_memory_equal(&one, &two, sizeof one);
    assert_memory_equal(&one, &three, sizeof one);
    assert_memory_equal(&one, &sixteen, sizeof one);
}

/* A GEMM on fewer BLAS threads puts back the count as set, not the one it found: another thread's GEMM may
 * have lowered OpenBLAS's global count for its own call. */
static void test_blas_count_put_back(void **state) {
    (void)state;
    cpu_set_threads(3);
    assert_int_equal(cpu_blas_threads(), 3);
    cpu_blas_threads_begin(1);
    assert_int_equal(openblas_get_num_threads(), 1);
    openblas_set_num_threads(2);   /* as another thread's GEMM would */
    cpu_blas_threads_end();
    assert_int_equal(openblas_get_num_threads(), 3);
    ca_cpu_set_deterministic(true);   /* deterministic mode's one BLAS thread is the count as set */
    assert_int_equal(cpu_blas_threads(), 1);
    cpu_blas_threads_begin(cpu_gemm_threads(2048, 384, 1152, cpu_blas_threads()));
    assert_int_equal(openblas_get_num_threads(), 1);
    cpu_blas_threads_end();
    ca_cpu_set_deterministic(false);
    assert_int_equal(openblas_get_num_threads(), 3);
}

#if defined(__SSE2__)
/* Workers run in the caller's mode (FTZ/DAZ and rounding), whatever mode the previous call had. */
static void test_workers_in_caller_mode(void **state) {
    (void)state;
    cpu_set_threads(3);
    int t = cpu_threads();
    unsigned saved = _mm_getcsr();
    unsigned modes[] = {saved | 0x8040u, (saved & ~0x8040u) | 0x6000u, saved & ~0xe040u};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        _mm_setcsr(modes[m]);
        reset();
        cpu_parallel_for(64, 1, range_fn, NULL);
        _mm_setcsr(saved);
        assert_int_equal(atomic_load(&S.calls), t);
        for (int c = 0; c < t; c++) assert_int_equal(S.csr[c], modes[m] & 0xffc0u);
    }
    reset();
    cpu_parallel_blocks(6, CPU_GRAIN, block_fn, NULL);
    for (int c = 0; c < 6; c++) assert_int_equal(S.csr[c], saved & 0xffc0u);
}
#else
static void test_workers_in_caller_mode(void **state) { skip(); }
#endif

/* After the parent used the team, a forked child runs its parallel loops on one thread (libgomp's pool
 * did not come along: with 2 threads the child would wait for it forever). */
static void test_fork_child_one_thread(void **state) {
    (void)state;
    cpu_set_threads(2);
    int t = cpu_threads();
    reset();
    cpu_parallel_for(100, 1, range_fn, NULL);   /* the team exists now */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(20);   /* a hang ends the child with SIGALRM */
        reset();
        cpu_parallel_for(100, 1, range_fn, NULL);
        cpu_parallel_blocks(4, CPU_GRAIN, block_fn, NULL);
        _exit(cpu_threads() == 1 && atomic_load(&S.calls) == 5 ? 0 : 3);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st)) fail_msg("the child died of signal %d (SIGALRM: it hung)", WTERMSIG(st));
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_int_equal(cpu_threads(), t);   /* the parent keeps its count */
}

/* ---- the cgroup quota parser, on fixture files in a temporary folder */

static char tmp[64];

static void put(const char *rel, const char *text) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", tmp, rel);
    for (char *p = path + strlen(tmp) + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0700);
            *p = '/';
        }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int quota(const char *why_wanted) {
    char proc[128], why[200];
    snprintf(proc, sizeof proc, "%s/proc_cgroup", tmp);
    int n = cpu_cgroup_cpus(proc, tmp, why, sizeof why);
    assert_string_equal(why, why_wanted);
    return n;
}

static void test_cgroup_quota(void **state) {
    (void)state;
    snprintf(tmp, sizeof tmp, "%s/caccel-cg.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    assert_non_null(mkdtemp(tmp));
    put("proc_cgroup", "0::/job/step\n");
    put("job/step/cpu.max", "max 100000\n");
    assert_int_equal(quota(""), 0);                     /* no quota */
    put("job/step/cpu.max", "150000 100000\n");
    assert_int_equal(quota("cgroup cpu.max quota 150000/100000 = 2 CPUs"), 2);   /* rounded up */
    put("job/cpu.max", "100000 100000\n");              /* a parent's tighter quota counts */
    assert_int_equal(quota("cgroup cpu.max quota 100000/100000 = 1 CPU"), 1);
    put("proc_cgroup", "0::/gone\n");                   /* a path not under the mount: the root's */
    put("cpu.max", "400000 100000\n");
    assert_int_equal(quota("cgroup cpu.max quota 400000/100000 = 4 CPUs"), 4);
    /* v1 (a hybrid system lists v2's line too): the "cpu" hierarchy's files */
    put("proc_cgroup", "12:pids:/x\n0::/job/step\n4:cpu,cpuacct:/docker/abc\n");
    put("cpu/docker/abc/cpu.cfs_quota_us", "-1\n");
    put("cpu/docker/abc/cpu.cfs_period_us", "100000\n");
    assert_int_equal(quota(""), 0);
    put("cpu/docker/abc/cpu.cfs_quota_us", "250000\n");
    assert_int_equal(quota("cgroup cpu.cfs_quota_us/cpu.cfs_period_us quota 250000/100000 = 3 CPUs"), 3);
    put("proc_cgroup", "garbage\n");                   /* no cgroup named, or none with cpu */
    assert_int_equal(quota(""), 0);
    put("proc_cgroup", "3:memory:/docker/abc\n4:cpuset:/docker/abc\n");
    assert_int_equal(quota(""), 0);
    char why[200] = "x";
    assert_int_equal(cpu_cgroup_cpus("/nonexistent/cgroup", tmp, why, sizeof why), 0);
    assert_string_equal(why, "");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    unsetenv("CACCEL_CPU_GRAIN");   /* the grains under test are the callers' own */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranges_cover_once), cmocka_unit_test(test_grain_keeps_small_serial),
        cmocka_unit_test(test_nested_runs_serial), cmocka_unit_test(test_blocks_once),
        cmocka_unit_test(test_workers_in_caller_mode), cmocka_unit_test(test_fork_child_one_thread),
        cmocka_unit_test(test_cgroup_quota), cmocka_unit_test(test_team_rule), cmocka_unit_test(test_team_drivers),
        cmocka_unit_test(test_blas_count_put_back),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
