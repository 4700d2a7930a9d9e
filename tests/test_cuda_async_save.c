/* An asynchronous save_state of a model trained on a GPU (tools/gpu-check.sh runs it): its checkpoint
 * equals a synchronous save of the same state bit for bit (every file, complete.json's CRC-32s included),
 * at the first save and again into the pinned buffers the first one left; and the stall, the time a loop
 * of training steps loses to a save in its middle against the same loop without one, measured for both
 * kinds of save and printed (no bound: the figures go to bench/RESULTS.md). The model: 6 linear layers of
 * 2048 x 2048 with AdamW, 302 MB of state (parameters and two moments). Exits 77 (SKIP) with the
 * driver's reason when there is no GPU. */
#include "test_cuda_util.h"
#include "test_ckpt_util.h"

#include <time.h>

enum { LAYERS = 6, WIDTH = 2048, BATCH = 64, STEPS = 8 };

static char g_dir[256];

typedef struct run {
    ca_accelerator *acc;
    ca_module *m;
    ca_optimizer *opt;
    ca_tensor *x, *y;
} run;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void run_open(run *r) {
    memset(r, 0, sizeof *r);
    char *argv[] = {"test", NULL};
    T_OK(ca_accelerator_create(&(ca_options){.argc = 1, .argv = argv}, &r->acc));
    ca_device *dev = ca_accelerator_device(r->acc);
    assert_string_equal(ca_device_name(dev), "cuda");
    T_OK(ca_set_seed(r->acc, 11));
    T_OK(ca_sequential_create(&r->m));
    for (int i = 0; i < LAYERS; i++) {
        ca_module *l;
        char name[16];
        snprintf(name, sizeof name, "fc%d", i);
        T_OK(ca_linear_create(WIDTH, WIDTH, true, &l));
        T_OK(ca_module_add(r->m, name, l));
        if (i + 1 < LAYERS) {
            snprintf(name, sizeof name, "act%d", i);
            T_OK(ca_relu_create(&l));
            T_OK(ca_module_add(r->m, name, l));
        }
    }
    T_OK(ca_adamw_create(r->m, &(ca_adamw_opts){.lr = 1e-4}, &r->opt));
    T_OK(ca_prepare(r->acc, r->m, r->opt, NULL));
    r->x = ca_rand_normal(dev, CA_F32, 2, (int64_t[]){BATCH, WIDTH}, 0.0f, 1.0f);
    int64_t labels[BATCH];
    for (int i = 0; i < BATCH; i++) labels[i] = (i * 7) % WIDTH;
    r->y = ca_from_host(dev, CA_I64, 1, (int64_t[]){BATCH}, labels);
    assert_non_null(r->x);
    assert_non_null(r->y);
}

static void train(run *r, int n) {
    for (int i = 0; i < n; i++) CA_SCOPE {
        T_OK(ca_backward(r->acc, ca_cross_entropy(ca_module_forward(r->m, r->x), r->y)));
        T_OK(ca_optimizer_step(r->opt));
        ca_optimizer_zero_grad(r->opt);
    }
}

static const char *in_dir(const char *name) { return t_path_in(g_dir, name); }

/* STEPS steps with a save (none, sync or async) after the first half; the device synchronised at the end,
 * so that the loop's time counts the GPU's work. *call_ms: the save call alone. */
static double loop_ms(run *r, int kind, const char *dir, double *call_ms) {
    T_OK(ca_device_synchronize(ca_accelerator_device(r->acc)));
    double t0 = now_ms();
    train(r, STEPS / 2);
    double c0 = now_ms();
    if (kind == 1) T_OK(ca_save_state(r->acc, dir));
    if (kind == 2) T_OK(ca_save_state_ex(r->acc, dir, &(ca_save_state_options){.async = true}));
    *call_ms = now_ms() - c0;
    train(r, STEPS - STEPS / 2);
    T_OK(ca_device_synchronize(ca_accelerator_device(r->acc)));
    double t = now_ms() - t0;
    T_OK(ca_wait_for_save(r->acc));   /* outside the loop: the writer's own time */
    return t;
}

static void test_async_equals_sync_and_stall(void **state) {
    (void)state;
    run r;
    run_open(&r);
    train(&r, 2);
    for (int round = 0; round < 2; round++) {   /* the second into the pinned buffers the first left */
        T_OK(ca_save_state(r.acc, in_dir("sync")));
        T_OK(ca_save_state_ex(r.acc, in_dir("async"), &(ca_save_state_options){.async = true}));
        T_OK(ca_wait_for_save(r.acc));
        t_assert_same_checkpoint(in_dir("sync"), in_dir("async"));
        train(&r, 1);
    }
    double none = 1e30, sync = 1e30, async = 1e30, call_sync = 0, call_async = 0, c;
    for (int rep = 0; rep < 3; rep++) {   /* best of 3, alternating */
        double t = loop_ms(&r, 0, NULL, &c);
        if (t < none) none = t;
        t = loop_ms(&r, 1, in_dir("sync"), &c);
        if (t < sync) sync = t, call_sync = c;
        t = loop_ms(&r, 2, in_dir("async"), &c);
        if (t < async) async = t, call_async = c;
    }
    printf("async save stall, %d x %d x %d f32 + AdamW (%.0f MB of state), %d steps of batch %d, best of 3:\n",
           LAYERS, WIDTH, WIDTH, 3.0 * LAYERS * (WIDTH * WIDTH + WIDTH) * 4 / 1e6, STEPS, BATCH);
    printf("  loop without a save %.1f ms; with a sync save %.1f ms (stall %.1f, call %.1f); with an async save "
           "%.1f ms (stall %.1f, call %.1f); async/sync stall %.3f\n", none, sync, sync - none, call_sync, async,
           async - none, call_async, (async - none) / (sync - none));
    ca_optimizer_destroy(r.opt);
    ca_module_destroy(r.m);
    ca_accelerator_destroy(r.acc);
    ca_scope_release_all();
}

int main(void) {
    (void)tc_open_or_skip("test_cuda_async_save");
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/caccel-cuda-async-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(g_dir)) return 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_async_equals_sync_and_stall)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    t_rm_tree(g_dir);
    return rc;
}
