/* The throughput meter (caccel/throughput.h): the matrix FLOPs it counts are exactly 2 m n k per GEMM
 * (forward and both backward GEMMs of a matmul), the warm-up step is left out, samples and tokens
 * add up, MFU is achieved over the peak the key gives (from a setting or the environment); the peak
 * cache is written once and reused, and a corrupt, foreign or unreadable cache file is refused with
 * a warning and probed again. The line itself is checked on the GPT example (tests/test_gpt_mfu.sh). */
#include "test_util.h"
#include "base/trace_impl.h"

#include <caccel/throughput.h>
#include <caccel/xla.h>
#include <sys/stat.h>

static char *argv_cpu[] = {"test", "--cpu", NULL};

static ca_accelerator *make_acc(const char *const *settings) {
    ca_accelerator *acc;
    T_OK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = argv_cpu, .settings = settings}, &acc));
    return acc;
}

/* c = a b with a [m,k] and b [k,n]; with grad, backward through both: dA = dC B^T, dB = A^T dC. */
static void matmul_step(ca_accelerator *acc, int64_t m, int64_t n, int64_t k, bool grad) {
    CA_SCOPE {
        ca_device *dev = ca_accelerator_device(acc);
        ca_tensor *a = ca_full(dev, CA_F32, 2, (int64_t[]){m, k}, 0.5);
        ca_tensor *b = ca_full(dev, CA_F32, 2, (int64_t[]){k, n}, 0.25);
        ca_tensor_set_requires_grad(a, grad);
        ca_tensor_set_requires_grad(b, grad);
        ca_tensor *c = ca_matmul(a, b);
        assert_non_null(c);
        if (grad) T_OK(ca_autograd_backward(ca_sum(c)));
    }
}

static void test_exact_flops(void **state) {
    (void)state;
    const char *settings[] = {"peak_flops=1e12", NULL};
    ca_accelerator *acc = make_acc(settings);
    ca_throughput r;
    assert_int_equal(ca_throughput_report(acc, &r), CA_ERR_STATE);   /* nothing counted yet */
    ca_clear_error();
    matmul_step(acc, 64, 64, 64, true);          /* the warm-up step: not counted */
    T_OK(ca_throughput_step(acc, 100, 1000));
    for (int i = 0; i < 3; i++) {
        matmul_step(acc, 3, 5, 7, true);         /* 2*3*5*7 forward, twice that backward */
        T_OK(ca_throughput_step(acc, 4, 32));
    }
    matmul_step(acc, 11, 13, 17, false);         /* forward only, counted into the next step */
    T_OK(ca_throughput_step(acc, 2, 0));
    T_OK(ca_throughput_report(acc, &r));
    assert_int_equal(r.step, 5);
    assert_int_equal(r.steps, 4);
    assert_true(r.flops == 3 * 6.0 * 3 * 5 * 7 + 2.0 * 11 * 13 * 17);
    assert_true(r.samples == 14 && r.tokens == 96);
    assert_true(r.seconds > 0);
    assert_true(r.peak_flops == 1e12 && r.peak_dtype == CA_F32);
    assert_string_equal(r.peak_source, "peak_flops");
    assert_true(fabs(r.mfu - r.flops / r.seconds / 1e12) <= 1e-12 * r.mfu);
    assert_true(fabs(r.tokens_per_s - 96 / r.seconds) <= 1e-9 * r.tokens_per_s);
    /* the report closed the interval */
    assert_int_equal(ca_throughput_report(acc, &r), CA_ERR_STATE);
    ca_clear_error();
    matmul_step(acc, 2, 2, 2, true);
    T_OK(ca_throughput_step(acc, 1, 0));
    T_OK(ca_throughput_report(acc, &r));
    assert_true(r.flops == 6.0 * 8 && r.steps == 1);
    /* paused (an evaluation): neither its FLOPs nor its time count */
    T_OK(ca_throughput_pause(acc));
    matmul_step(acc, 32, 32, 32, false);
    T_OK(ca_throughput_resume(acc));
    matmul_step(acc, 2, 3, 4, false);
    T_OK(ca_throughput_step(acc, 1, 0));
    T_OK(ca_throughput_report(acc, &r));
    assert_true(r.flops == 2.0 * 2 * 3 * 4 && r.steps == 1);
    /* a step counted while paused was not timed: it only restarts the clock */
    T_OK(ca_throughput_pause(acc));
    matmul_step(acc, 2, 2, 2, false);
    T_OK(ca_throughput_step(acc, 1, 0));
    assert_int_equal(ca_throughput_report(acc, &r), CA_ERR_STATE);
    ca_clear_error();
    assert_int_equal(ca_throughput_step(acc, -1, 0), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "negative count"));
    ca_clear_error();
    ca_accelerator_destroy(acc);
    /* with no meter the kernel path does not count */
    CA_SCOPE {
        ca_tensor *a = ca_full(ca_cpu_device(), CA_F32, 2, (int64_t[]){4, 4}, 1);
        ca_matmul(a, a);
    }
    assert_false(ca_trace_flags() & CA_TRACE_COUNT);
}

static uint64_t graphs_run(ca_accelerator *acc) {
    ca_xla_metrics m;
    T_OK(ca_xla_metrics_get(ca_accelerator_device(acc), &m));
    return m.graphs;
}

/* On the lazy device (--tpu) kernels are recorded at trace time and run when a graph executes: the
 * FLOPs are counted once (when recorded), each interval's time holds its steps' graphs (run at its
 * end, before the clock stops), and the graph of work done while paused (an evaluation whose result
 * is still pending) runs at the resume, before the clock restarts, not inside the next interval. */
static void test_lazy_device(void **state) {
    (void)state;
    char *argv_tpu[] = {"test", "--tpu", NULL};
    const char *settings[] = {"peak_flops=1e12", NULL};
    ca_accelerator *acc;
    T_OK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = argv_tpu, .settings = settings}, &acc));
    assert_true(ca_device_is_lazy(ca_accelerator_device(acc)));
    matmul_step(acc, 8, 8, 8, true);             /* the warm-up step: its graph runs as the clock starts */
    T_OK(ca_throughput_step(acc, 1, 0));
    matmul_step(acc, 3, 5, 7, true);
    T_OK(ca_throughput_step(acc, 4, 0));
    uint64_t g0 = graphs_run(acc);
    ca_throughput r;
    T_OK(ca_throughput_report(acc, &r));
    assert_true(graphs_run(acc) > g0);           /* the step's graph ran inside the interval */
    assert_true(r.flops == 6.0 * 3 * 5 * 7 && r.steps == 1);   /* counted once, when recorded */
    T_OK(ca_throughput_pause(acc));
    CA_SCOPE {
        ca_device *dev = ca_accelerator_device(acc);
        ca_tensor *e = ca_matmul(ca_full(dev, CA_F32, 2, (int64_t[]){64, 64}, 1),
                                 ca_full(dev, CA_F32, 2, (int64_t[]){64, 64}, 1));
        assert_non_null(e);                      /* pending: nothing read it yet */
        uint64_t g1 = graphs_run(acc);
        T_OK(ca_throughput_resume(acc));
        assert_true(graphs_run(acc) > g1);       /* the evaluation's graph ran before the clock restarted */
        static float v[64 * 64];
        T_OK(ca_tensor_to_host(e, v, sizeof v));
        assert_true(v[0] == 64.0f && v[64 * 64 - 1] == 64.0f);
    }
    ca_accelerator_destroy(acc);
}

/* peak_flops from the environment, the dtype from mixed_precision; a negative one is refused. */
static void test_config(void **state) {
    (void)state;
    setenv("CACCEL_PEAK_FLOPS", "2.5e13", 1);
    const char *settings[] = {"mixed_precision=bf16", NULL};
    ca_accelerator *acc = make_acc(settings);
    ca_throughput r;
    T_OK(ca_throughput_step(acc, 1, 0));
    matmul_step(acc, 4, 4, 4, false);
    T_OK(ca_throughput_step(acc, 1, 0));
    T_OK(ca_throughput_report(acc, &r));
    assert_true(r.peak_flops == 2.5e13 && r.peak_dtype == CA_BF16);
    assert_string_equal(r.peak_source, "peak_flops");
    ca_accelerator_destroy(acc);
    unsetenv("CACCEL_PEAK_FLOPS");
    const char *bad[] = {"peak_flops=-1", NULL};
    assert_int_not_equal(ca_accelerator_create(&(ca_options){.argc = 2, .argv = argv_cpu, .settings = bad}, &acc), CA_OK);
    assert_non_null(strstr(ca_last_error(), "peak_flops"));
    ca_clear_error();
}

static char g_cache[512];

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = calloc(1, 4096);
    size_t n = fread(s, 1, 4095, f);
    s[n] = 0;
    fclose(f);
    return s;
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Probed once, then read back; each bad file probed again and (a regular-file place) rewritten. */
static void test_cache(void **state) {
    (void)state;
    char cwd[300], path[1024];
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(g_cache, sizeof g_cache, "%s/test_throughput.%ld.d", cwd, (long)getpid());
    t_rm_tree(g_cache);
    setenv("XDG_CACHE_HOME", g_cache, 1);   /* does not exist yet: made on the first write */
    ca_device *dev = ca_cpu_device();
    T_OK(ca_peak_cache_path(dev, CA_F32, path, sizeof path));
    assert_non_null(strstr(path, "/caccel/peak-f32-"));
    double p1 = 0, p2 = 0;
    const char *src = NULL;
    T_OK(ca_peak_flops(dev, CA_F32, 0.05, &p1, &src));
    assert_string_equal(src, "probe");
    assert_true(p1 > 0);
    char *text = slurp(path);
    assert_non_null(text);
    assert_non_null(strstr(text, "\"peak_flops\""));
    free(text);
    T_OK(ca_peak_flops(dev, CA_F32, 0.05, &p2, &src));
    assert_string_equal(src, "cache");
    assert_true(fabs(p2 - p1) <= 1e-9 * p1);
    const char *bad[] = {"{\"peak_flops\": ", "[1, 2]", "{\"device\": \"another machine\", \"dtype\": \"f32\", \"peak_flops\": 1e9}",
                         "{\"peak_flops\": -3}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        put(path, bad[i]);
        T_OK(ca_peak_flops(dev, CA_F32, 0.05, &p2, &src));
        assert_string_equal(src, "probe");
        text = slurp(path);
        assert_non_null(strstr(text, ca_device_description(dev)));   /* rewritten for this machine */
        free(text);
    }
    /* not a regular file: refused (not read), probed, left as it is */
    remove(path);
    assert_int_equal(mkdir(path, 0700), 0);
    T_OK(ca_peak_flops(dev, CA_F32, 0.05, &p2, &src));
    assert_string_equal(src, "probe");
    rmdir(path);
    /* a dtype the device cannot multiply: the probe's error, in its context */
    assert_int_not_equal(ca_peak_flops(dev, CA_I64, 0.05, &p2, &src), CA_OK);
    assert_non_null(strstr(ca_last_error(), "peak FLOP/s probe (i64 GEMM 256x256 on cpu)"));
    ca_clear_error();
    unsetenv("XDG_CACHE_HOME");
    t_rm_tree(g_cache);
}

/* A cached peak below what the program runs at (probed while the machine was busy) is raised to the
 * interval's rate, in the report and in the cache file; MFU stays a fraction. */
static void test_raised_peak(void **state) {
    (void)state;
    char cwd[300], path[1024], text[1200];
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(g_cache, sizeof g_cache, "%s/test_throughput_raise.%ld.d", cwd, (long)getpid());
    t_rm_tree(g_cache);
    setenv("XDG_CACHE_HOME", g_cache, 1);
    ca_device *dev = ca_cpu_device();
    T_OK(ca_peak_cache_path(dev, CA_F32, path, sizeof path));
    double p = 0;
    const char *src = NULL;
    T_OK(ca_peak_flops(dev, CA_F32, 0.05, &p, &src));   /* makes the folder and a valid file */
    snprintf(text, sizeof text, "{\"device\": \"%s\", \"dtype\": \"f32\", \"peak_flops\": 1000}", ca_device_description(dev));
    put(path, text);
    const char *none[] = {NULL};
    ca_accelerator *acc = make_acc(none);
    ca_throughput r;
    T_OK(ca_throughput_step(acc, 1, 0));
    matmul_step(acc, 64, 64, 64, true);
    T_OK(ca_throughput_step(acc, 1, 0));
    T_OK(ca_throughput_report(acc, &r));
    assert_string_equal(r.peak_source, "raised");
    assert_true(r.peak_flops == r.flops_per_s && r.peak_flops > 1000);
    assert_true(fabs(r.mfu - 1) <= 1e-12);
    ca_accelerator_destroy(acc);
    T_OK(ca_peak_flops(dev, CA_F32, 0.05, &p, &src));
    assert_string_equal(src, "cache");
    assert_true(fabs(p - r.peak_flops) <= 1e-9 * p);
    unsetenv("XDG_CACHE_HOME");
    t_rm_tree(g_cache);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_flops),
        cmocka_unit_test(test_lazy_device),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_raised_peak),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
