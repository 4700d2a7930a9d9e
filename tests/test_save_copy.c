/* An asynchronous save_state on a device with memory of its own, on a mocked GPU: the CPU's kernels
 * behind a device table that says it is no host memory, with pinned host memory, streams and events
 * that log every call, and copies on a stream that land only when the device's order says so (the
 * compute stream waits for them, or the writer waits for their event). Checked: each copy runs on the
 * copy stream into pinned memory, after an event recorded on the compute stream once the step's writes
 * were enqueued; after the last copy an event closes them and the compute stream waits for it; the
 * background writer (another thread) waits for that event before it writes; the checkpoint equals a
 * synchronous one byte for byte; the pinned buffers are reused by the next save and freed at the
 * accelerator's teardown with the stream and events; a copy that fails is reported by the next call
 * (ca_wait_for_save), naming the directory, and nothing is published; where pinned memory is refused,
 * and on a device table of ABI 3.7 (no memcpy_on_stream), the save copies synchronously, as before. */
#include "test_ckpt_util.h"
#include "mock_gpu.h"

#include <pthread.h>
#include <stddef.h>
#include <sys/stat.h>

static char g_dir[256];
static ca_device_ops g_full, g_old;
static const ca_device_ops *g_full_devs[1], *g_old_devs[1];
static ca_plugin g_full_plugin, g_old_plugin;
static pthread_t g_main;

/* ------------------------------------------------------------------ the mocked device */

enum { LOG_MAX = 4096, PINNED_MAX = 256, PENDING_MAX = 256 };
typedef struct entry {
    char what;              /* R record, W stream waits, C copy enqueued, S the writer's wait */
    void *stream, *event;
    bool main_thread;
} entry;
static entry g_log[LOG_MAX];
static int g_nlog;
static void *g_pinned[PINNED_MAX];
static size_t g_pinned_len[PINNED_MAX];
static int g_allocs, g_frees, g_streams, g_streams_freed, g_events, g_events_freed;
static struct { void *dst; const void *src; size_t n; } g_pending[PENDING_MAX];
static int g_npending;
static bool g_fail_copy, g_refuse_pinned;
static int g_stream_token;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static void log_call(char what, void *stream, void *event) {
    pthread_mutex_lock(&g_mu);
    if (g_nlog < LOG_MAX)
        g_log[g_nlog++] = (entry){what, stream, event, pthread_equal(pthread_self(), g_main) != 0};
    pthread_mutex_unlock(&g_mu);
}

static ca_status m_host_alloc(void *dev, size_t bytes, void **ptr) {
    (void)dev;
    if (g_refuse_pinned) return ca_error(CA_ERR_NOMEM, "pinned_test: no pinned memory (mocked)");
    assert_true(g_allocs < PINNED_MAX);
    *ptr = malloc(bytes);
    g_pinned[g_allocs] = *ptr;
    g_pinned_len[g_allocs++] = bytes;
    return CA_OK;
}

static void m_host_free(void *dev, void *ptr) {
    (void)dev;
    g_frees++;
    free(ptr);
}

/* Whether [p, p + n) lies in one pinned allocation. */
static bool in_pinned(const void *p, size_t n) {
    for (int i = 0; i < g_allocs; i++) {
        const char *b = g_pinned[i];
        if ((const char *)p >= b && (const char *)p + n <= b + g_pinned_len[i]) return true;
    }
    return false;
}

static ca_status m_stream_create(void *dev, void **stream) {
    (void)dev;
    g_streams++;
    *stream = &g_stream_token;
    return CA_OK;
}

static void m_stream_destroy(void *dev, void *stream) {
    (void)dev;
    assert_ptr_equal(stream, &g_stream_token);
    g_streams_freed++;
}

static ca_status m_event_create(void *dev, void **event) {
    (void)dev;
    g_events++;
    *event = malloc(1);
    return CA_OK;
}

static void m_event_destroy(void *dev, void *event) {
    (void)dev;
    g_events_freed++;
    free(event);
}

static ca_status m_event_record(void *dev, void *event, void *stream) {
    (void)dev;
    log_call('R', stream, event);
    return CA_OK;
}

/* The copies land when the device's order needs them: before the compute stream goes on past an
 * event recorded after them, or when the host waits for such an event. */
static void land_copies(void) {
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_npending; i++) memcpy(g_pending[i].dst, g_pending[i].src, g_pending[i].n);
    g_npending = 0;
    pthread_mutex_unlock(&g_mu);
}

static ca_status m_stream_wait_event(void *dev, void *stream, void *event) {
    (void)dev;
    log_call('W', stream, event);
    if (!stream) land_copies();
    return CA_OK;
}

static ca_status m_memcpy_on_stream(void *dev, void *dst, const void *src, size_t bytes, ca_copy_kind kind,
                                    void *stream) {
    (void)dev;
    assert_int_equal(kind, CA_COPY_D2H);
    assert_true(in_pinned(dst, bytes));
    log_call('C', stream, NULL);
    pthread_mutex_lock(&g_mu);
    assert_true(g_npending < PENDING_MAX);
    g_pending[g_npending].dst = dst;
    g_pending[g_npending].src = src;
    g_pending[g_npending++].n = bytes;
    pthread_mutex_unlock(&g_mu);
    return CA_OK;
}

static ca_status m_event_wait_any_thread(void *dev, void *event) {
    (void)dev;
    log_call('S', NULL, event);
    land_copies();
    return g_fail_copy ? ca_error(CA_ERR_BACKEND, "pinned_test: the copy failed (mocked)") : CA_OK;
}

static int prefer_full(char *reason, size_t len) { (void)reason, (void)len; return 50; }
static int prefer_old(char *reason, size_t len) { (void)reason, (void)len; return 60; }

/* The mocked GPU: the CPU's table, not host memory, kind GPU, with the slots above. `old`: a table of
 * ABI 3.7, which ends before memcpy_on_stream. Registered once each; the later one scores higher. */
static void register_device(bool old) {
    ca_device_ops *o = old ? &g_old : &g_full;
    if (o->name) return;
    mock_gpu_ops(o, old ? "pinned_old_test" : "pinned_test");
    o->host_alloc = m_host_alloc;
    o->host_free = m_host_free;
    o->stream_create = m_stream_create;
    o->stream_destroy = m_stream_destroy;
    o->event_create = m_event_create;
    o->event_destroy = m_event_destroy;
    o->event_record = m_event_record;
    o->stream_wait_event = m_stream_wait_event;
    o->memcpy_on_stream = m_memcpy_on_stream;
    o->event_wait_any_thread = m_event_wait_any_thread;
    if (old) o->struct_size = offsetof(ca_device_ops, memcpy_on_stream);
    T_OK(mock_gpu_register(o, old ? g_old_devs : g_full_devs, old ? &g_old_plugin : &g_full_plugin,
                           old ? prefer_old : prefer_full));
}

/* ------------------------------------------------------------------ a small run */

static int setup(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/caccel-save-copy-XXXXXX", base && *base ? base : "/tmp");
    g_nlog = g_allocs = g_frees = g_streams = g_streams_freed = g_events = g_events_freed = g_npending = 0;
    g_fail_copy = g_refuse_pinned = false;
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    ca_scope_release_all();
    t_rm_tree(g_dir);
    return 0;
}

static const char *in_dir(const char *name) { return t_path_in(g_dir, name); }

typedef struct run {
    ca_accelerator *acc;
    ca_dataset *ds;
    ca_dataloader *dl;
    ca_module *m;
    ca_optimizer *opt;
} run;

static void run_open(run *r, const char *device) {
    memset(r, 0, sizeof *r);
    char *argv[] = {"test", NULL};
    T_OK(ca_accelerator_create(&(ca_options){.argc = 1, .argv = argv}, &r->acc));
    assert_string_equal(ca_device_name(ca_accelerator_device(r->acc)), device);
    T_OK(ca_set_seed(r->acc, 5));
    enum { N = 32, IN = 6 };
    float x[N * IN];
    int64_t y[N];
    uint64_t s = 3;
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < IN; j++) x[i * IN + j] = t_randf(&s, -1, 1);
        y[i] = (int64_t)(t_rand_u64(&s) % 3);
    }
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 1, .shape = {IN}}, ys = {.dtype = CA_I64, .ndim = 0};
    T_OK(ca_dataset_from_memory(&xs, x, &ys, y, N, &r->ds));
    T_OK(ca_dataloader_create(r->ds, &(ca_loader_opts){.batch_size = 4, .shuffle = true}, &r->dl));
    ca_module *l;
    T_OK(ca_sequential_create(&r->m));
    T_OK(ca_linear_create(IN, 16, true, &l));  T_OK(ca_module_add(r->m, "fc1", l));
    T_OK(ca_relu_create(&l));                  T_OK(ca_module_add(r->m, "act", l));
    T_OK(ca_linear_create(16, 3, true, &l));   T_OK(ca_module_add(r->m, "fc2", l));
    T_OK(ca_adamw_create(r->m, &(ca_adamw_opts){.lr = 0.01}, &r->opt));
    T_OK(ca_prepare(r->acc, r->m, r->opt, r->dl));
}

static void run_close(run *r) {
    ca_dataloader_destroy(r->dl);
    ca_optimizer_destroy(r->opt);
    ca_module_destroy(r->m);
    ca_dataset_destroy(r->ds);
    ca_accelerator_destroy(r->acc);
}

static void train(run *r, int n) {
    ca_batch b;
    for (int i = 0; i < n; i++) {
        if (!ca_dataloader_next(r->dl, &b)) {
            T_OK(ca_dataloader_status(r->dl));
            assert_true(ca_dataloader_next(r->dl, &b));
        }
        CA_SCOPE {
            ca_tensor *loss = ca_cross_entropy(ca_module_forward(r->m, b.x), b.y);
            T_OK(ca_backward(r->acc, loss));
            T_OK(ca_optimizer_step(r->opt));
            ca_optimizer_zero_grad(r->opt);
        }
    }
}

/* The log of one asynchronous save from entry `from`: n copies, each after the compute stream's event
 * (R on the default stream, then the copy stream waits for it: W), then the closing event on the copy
 * stream and the compute stream's wait for it, all on the calling thread; then the writer's wait for
 * that event on another thread. Returns the entry after it. */
static int assert_save_log(int from, int *ncopies) {
    int i = from, n = 0;
    void *copy_stream = &g_stream_token, *computed = NULL, *copied = NULL;
    while (i + 2 < g_nlog && g_log[i].what == 'R' && g_log[i + 2].what == 'C') {
        assert_null(g_log[i].stream);                               /* recorded on the compute stream */
        assert_true(computed == NULL || g_log[i].event == computed);
        computed = g_log[i].event;
        assert_int_equal(g_log[i + 1].what, 'W');                   /* the copy stream waits for it */
        assert_ptr_equal(g_log[i + 1].stream, copy_stream);
        assert_ptr_equal(g_log[i + 1].event, computed);
        assert_ptr_equal(g_log[i + 2].stream, copy_stream);         /* the copy, on the copy stream */
        for (int k = i; k < i + 3; k++) assert_true(g_log[k].main_thread);
        i += 3;
        n++;
    }
    assert_true(n > 0);
    assert_true(i + 2 < g_nlog);
    assert_int_equal(g_log[i].what, 'R');                           /* closed on the copy stream */
    assert_ptr_equal(g_log[i].stream, copy_stream);
    copied = g_log[i].event;
    assert_ptr_not_equal(copied, computed);
    assert_int_equal(g_log[i + 1].what, 'W');                       /* the compute stream waits for it */
    assert_null(g_log[i + 1].stream);
    assert_ptr_equal(g_log[i + 1].event, copied);
    assert_int_equal(g_log[i + 2].what, 'S');                       /* the writer, on its own thread */
    assert_ptr_equal(g_log[i + 2].event, copied);
    assert_false(g_log[i + 2].main_thread);
    *ncopies = n;
    return i + 3;
}

/* ------------------------------------------------------------------ the tests */

static void test_pinned_copies(void **state) {
    (void)state;
    register_device(false);
    run r;
    run_open(&r, "pinned_test");
    train(&r, 3);
    T_OK(ca_save_state(r.acc, in_dir("sync")));
    assert_int_equal(g_nlog, 0);                                    /* a synchronous save: none of it */
    T_OK(ca_save_state_ex(r.acc, in_dir("async"), &(ca_save_state_options){.async = true}));
    T_OK(ca_wait_for_save(r.acc));
    t_assert_same_checkpoint(in_dir("sync"), in_dir("async"));
    int n1, at = assert_save_log(0, &n1);
    assert_int_equal(at, g_nlog);
    /* the parameters (4) and AdamW's two moments of each, and its step count where it is a tensor */
    assert_true(n1 >= 12);
    int allocs = g_allocs;
    assert_true(allocs > 0);
    assert_int_equal(g_streams, 1);
    assert_int_equal(g_events, 2);

    train(&r, 2);   /* the run goes on; the next save reuses the pinned buffers */
    T_OK(ca_save_state(r.acc, in_dir("sync")));
    T_OK(ca_save_state_ex(r.acc, in_dir("async"), &(ca_save_state_options){.async = true}));
    T_OK(ca_wait_for_save(r.acc));
    t_assert_same_checkpoint(in_dir("sync"), in_dir("async"));
    int n2;
    assert_int_equal(assert_save_log(at, &n2), g_nlog);
    assert_int_equal(n2, n1);
    assert_int_equal(g_allocs, allocs);                             /* no new pinned memory */
    assert_int_equal(g_frees, 0);
    run_close(&r);
    assert_int_equal(g_frees, allocs);                              /* freed at the teardown */
    assert_int_equal(g_streams_freed, 1);
    assert_int_equal(g_events_freed, 2);
}

/* A copy that fails on the device is the save's failure, returned by the next call; nothing published,
 * and the next save goes through. */
static void test_failed_copy_reported(void **state) {
    (void)state;
    register_device(false);
    run r;
    run_open(&r, "pinned_test");
    train(&r, 2);
    g_fail_copy = true;
    T_OK(ca_save_state_ex(r.acc, in_dir("ck"), &(ca_save_state_options){.async = true}));
    assert_int_equal(ca_wait_for_save(r.acc), CA_ERR_BACKEND);
    const char *e = ca_last_error();
    assert_non_null(strstr(e, "wait_for_save: the asynchronous save into"));
    assert_non_null(strstr(e, "/ck failed"));
    assert_non_null(strstr(e, "to pinned host memory"));
    assert_non_null(strstr(e, "pinned_test: the copy failed (mocked)"));
    struct stat st;
    assert_int_not_equal(stat(in_dir("ck/complete.json"), &st), 0);
    T_OK(ca_wait_for_save(r.acc));                                  /* reported once */
    g_fail_copy = false;
    T_OK(ca_save_state_ex(r.acc, in_dir("ck"), &(ca_save_state_options){.async = true}));
    T_OK(ca_wait_for_save(r.acc));
    assert_int_equal(stat(in_dir("ck/complete.json"), &st), 0);
    run_close(&r);
    assert_int_equal(g_frees, g_allocs);
}

/* Pinned memory refused: each file's host copy is ordinary memory, copied synchronously (no copy on the
 * stream into memory that is not pinned), and the checkpoint is the same. */
static void test_pinned_refused(void **state) {
    (void)state;
    register_device(false);
    run r;
    run_open(&r, "pinned_test");
    train(&r, 2);
    g_refuse_pinned = true;
    T_OK(ca_save_state(r.acc, in_dir("sync")));
    T_OK(ca_save_state_ex(r.acc, in_dir("async"), &(ca_save_state_options){.async = true}));
    T_OK(ca_wait_for_save(r.acc));
    t_assert_same_checkpoint(in_dir("sync"), in_dir("async"));
    for (int i = 0; i < g_nlog; i++) assert_int_not_equal(g_log[i].what, 'C');
    run_close(&r);
}

/* A device table of ABI 3.7 has no memcpy_on_stream: the host copy is made synchronously, in ordinary
 * memory, as before; the checkpoint is the same. */
static void test_fallback_without_slots(void **state) {
    (void)state;
    register_device(true);
    run r;
    run_open(&r, "pinned_old_test");
    train(&r, 3);
    int allocs = g_allocs;   /* the loader's pinned staging, if any: not the save's */
    T_OK(ca_save_state(r.acc, in_dir("sync")));
    T_OK(ca_save_state_ex(r.acc, in_dir("async"), &(ca_save_state_options){.async = true}));
    T_OK(ca_wait_for_save(r.acc));
    t_assert_same_checkpoint(in_dir("sync"), in_dir("async"));
    assert_int_equal(g_allocs, allocs);
    run_close(&r);
    assert_int_equal(g_nlog, 0);
    assert_int_equal(g_streams, 0);
}

int main(void) {
    g_main = pthread_self();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pinned_copies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_copy_reported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fallback_without_slots, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
