/* The lazy xla device: work is recorded and runs at synchronisation points; the compiler's cache
 * (the second identical step compiles nothing; a short last batch compiles once), dead-code
 * elimination, fusion of elementwise chains (bit-identical to eager, fused or not, in training
 * too; node by node when buffers overlap), the buffer plan and the placement of intermediates,
 * the device's memory (its addresses are not host memory; host memory is refused; transfers are
 * counted), host functions (collectives) in graph order and keyed by their attributes (a
 * collective's peers) in the cache, the metrics; bf16 storage (downcast_bf16). */
#include "test_util.h"
#include "test_kcall.h"
#include "core/device_impl.h"

/* XKC(slot, ...): kernel `slot` of table k on context c, checked as the core checks it. */
#define XKC(slot, ...) TKC("xla", k, c, slot, __VA_ARGS__)

static ca_device *X;

static ca_xla_metrics metrics(void) {
    ca_xla_metrics m;
    T_OK(ca_xla_metrics_get(X, &m));
    return m;
}

/* Kernels record; nothing runs until the host reads device memory. */
static void test_lazy_until_read(void **state) {
    T_OK(ca_xla_metrics_reset(X));
    CA_SCOPE {
        ca_tensor *a = ca_full(X, CA_F32, CA_SHAPE(4), 2.0);
        ca_tensor *b = ca_mul(ca_add(a, a), a);
        ca_xla_metrics m = metrics();
        assert_true(m.nodes_recorded >= 3);
        assert_int_equal(m.graphs, 0);
        assert_int_equal(m.d2h_transfers, 0);
        float h[4];
        T_OK(ca_tensor_to_host(b, h, sizeof h));
        for (int i = 0; i < 4; i++) assert_true(h[i] == 8.0f);
        m = metrics();
        assert_int_equal(m.graphs, 1);
        assert_int_equal(m.d2h_transfers, 1);
        assert_int_equal(m.d2h_bytes, sizeof h);
        double v;
        T_OK(ca_tensor_item(ca_sum(b), &v));
        assert_true(v == 32.0);
        assert_int_equal(metrics().graphs, 2);
    }
}

/* A host function (what the core records for a collective) runs in graph order at the next
 * synchronisation, on the host addresses of the device buffers' memory (never the device addresses,
 * which the host cannot read); its failure fails that execution; a node whose recording fails, or
 * that is never run, gets fn(ctx, false) so its context is freed. */
typedef struct host_ctx {
    const void *dev;           /* the buffer's device address */
    float seen;                /* buf[0] when the function ran */
    int runs, drops;
    ca_status result;
} host_ctx;

static ca_status host_fn(void *ctx, bool run, const void *in, void *out) {
    host_ctx *h = ctx;
    if (!run) {
        h->drops++;
        return CA_OK;
    }
    assert_null(in);
    assert_non_null(out);
    assert_ptr_not_equal(out, h->dev);
    float *buf = out;
    h->runs++;
    h->seen = buf[0];
    buf[0] *= 10.0f;           /* in place, as an all-reduce writes its buffer */
    return h->result == CA_OK ? CA_OK : ca_error(h->result, "host function failed on purpose");
}

static void test_host_fn_in_graph_order(void **state) {
    const ca_device_ops *ops = ca_device_ops_of(X);
    assert_non_null(ops->enqueue_host_fn);
    T_OK(ca_xla_metrics_reset(X));
    CA_SCOPE {
        ca_tensor *a = ca_full(X, CA_F32, CA_SHAPE(4), 2.0);   /* recorded before: the function sees 2 */
        host_ctx h = {.dev = ca_tensor_data(a)};
        T_OK(ops->enqueue_host_fn(ca_device_context(X), host_fn, &h, NULL, 0, ca_tensor_data(a), 4 * sizeof(float)));
        ca_tensor *b = ca_add(a, a);                           /* recorded after: it sees 20 */
        assert_int_equal(h.runs, 0);
        float out[4];
        T_OK(ca_tensor_to_host(b, out, sizeof out));
        assert_int_equal(h.runs, 1);
        assert_true(h.seen == 2.0f);
        assert_true(out[0] == 40.0f && out[1] == 4.0f);
        assert_int_equal(metrics().collectives_in_graph, 1);
        /* a failing function fails the execution that ran it, with its message */
        h.result = CA_ERR_PEER;
        T_OK(ops->enqueue_host_fn(ca_device_context(X), host_fn, &h, NULL, 0, ca_tensor_data(a), 4 * sizeof(float)));
        assert_int_equal(ca_device_synchronize(X), CA_ERR_PEER);
        assert_non_null(strstr(ca_last_error(), "host function failed on purpose"));
        ca_clear_error();
        /* a recording that fails (host memory is not the device's) drops the context at once */
        float host[4];
        assert_int_equal(ops->enqueue_host_fn(ca_device_context(X), host_fn, &h, NULL, 0, host, sizeof host),
                         CA_ERR_INVALID);
        ca_clear_error();
        assert_int_equal(h.drops, 1);
        assert_int_equal(h.runs, 2);
    }
}

/* A keyed host function's attributes (what the core passes for a collective: its kind, counts, peers)
 * are part of the graph's key: the same graph with the same attributes is a cache hit, with another
 * peer another program, however alike its buffers; the unkeyed slot is the keyed one without any. */
static ca_status keyed_graph(const int64_t *attr, int nattr, host_ctx *h) {
    const ca_device_ops *ops = ca_device_ops_of(X);
    ca_status s = CA_OK;
    CA_SCOPE {
        ca_tensor *a = ca_full(X, CA_F32, CA_SHAPE(4), 2.0);
        h->dev = ca_tensor_data(a);
        s = attr ? ops->enqueue_host_fn_keyed(ca_device_context(X), host_fn, h, NULL, 0, ca_tensor_data(a),
                                              4 * sizeof(float), attr, nattr)
                 : ops->enqueue_host_fn(ca_device_context(X), host_fn, h, NULL, 0, ca_tensor_data(a), 4 * sizeof(float));
        if (s == CA_OK) s = ca_device_synchronize(X);
    }
    return s;
}

static void test_host_fn_keyed(void **state) {
    const ca_device_ops *ops = ca_device_ops_of(X);
    assert_non_null(ops->enqueue_host_fn_keyed);
    T_OK(ca_xla_metrics_reset(X));
    host_ctx h = {0};
    int64_t right[] = {7, 0, 16, 0, 1, 3, 16, 4}, left[] = {7, 0, 16, 0, 3, 1, 16, 4};   /* a sendrecv's, rank 2 of 4 */
    T_OK(keyed_graph(right, 8, &h));
    T_OK(keyed_graph(right, 8, &h));
    ca_xla_metrics m = metrics();
    assert_int_equal(m.compiles, 1);
    assert_int_equal(m.cache_hits, 1);
    T_OK(keyed_graph(left, 8, &h));            /* the other peers: compiled anew */
    assert_int_equal(metrics().compiles, 2);
    T_OK(keyed_graph(right, 7, &h));           /* fewer attributes: another key */
    assert_int_equal(metrics().compiles, 3);
    T_OK(keyed_graph(NULL, 0, &h));            /* the unkeyed slot: no attributes */
    T_OK(keyed_graph(right, 0, &h));
    m = metrics();
    assert_int_equal(m.compiles, 4);
    assert_int_equal(m.cache_hits, 2);
    assert_int_equal(h.runs, 6);
    assert_int_equal(m.collectives_in_graph, 6);
}

/* The core checks a kernel call's contract before the lazy device records it: a bad call fails at
 * the call, naming the kernel and the device, records nothing, and leaves the step to run. */
static void test_bad_call_fails_at_the_op(void **state) {
    T_OK(ca_xla_metrics_reset(X));
    ca_tensor *a = ca_tensor_keep(ca_full(X, CA_F32, CA_SHAPE(4), 2.0));
    ca_tensor *y = ca_tensor_keep(ca_empty(X, CA_F32, CA_SHAPE(4)));
    assert_non_null(y);
    uint64_t before = metrics().nodes_recorded;
    ca_bcast_args sh = {.ndim = 1, .shape = {-4}, .a_stride = {1}, .b_stride = {1}};
    ca_status s = CA_KCALL(X, binary, .op = CA_BINARY_ADD, .dt = CA_F32, .shape = sh, .a = ca_tensor_data(a),
                           .b = ca_tensor_data(a), .y = ca_tensor_data(y));
    assert_int_equal(s, CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "xla kernel binary"));
    assert_non_null(strstr(ca_last_error(), "dim 0 has negative size -4"));
    s = CA_KCALL(X, softmax, .dt = CA_I32, .rows = 1, .cols = 4, .x = ca_tensor_data(a), .y = ca_tensor_data(y));
    assert_int_equal(s, CA_ERR_UNSUPPORTED);
    assert_non_null(strstr(ca_last_error(), "xla kernel softmax: tensor dtype i32"));
    assert_int_equal(metrics().nodes_recorded, before);
    ca_clear_error();
    T_OK(ca_device_synchronize(X));
    float h[4];
    T_OK(ca_tensor_to_host(a, h, sizeof h));
    assert_true(h[0] == 2.0f && h[3] == 2.0f);
    ca_tensor_free(a);
    ca_tensor_free(y);
}

/* Device memory is the arena's: a host pointer handed to a kernel is refused, naming the kernel. */
static void test_host_memory_refused(void **state) {
    float host[8] = {0};
    ca_status s = TKC("xla", ca_device_kernels(X), ca_device_context(X), fill, .dt = CA_F32, .n = 8, .value = 1.0,
                      .y = host);
    assert_int_equal(s, CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "xla fill"));
    assert_non_null(strstr(ca_last_error(), "is not"));
    ca_clear_error();
    T_OK(ca_device_synchronize(X));
    /* transfers are real copies, counted */
    T_OK(ca_xla_metrics_reset(X));
    void *d = NULL;
    T_OK(ca_device_alloc(X, sizeof host, &d));
    assert_true(d != (void *)host);
    host[3] = 5.0f;
    T_OK(ca_device_copy_from_host(X, d, host, sizeof host));
    host[3] = 0.0f;
    T_OK(ca_device_copy_to_host(X, host, d, sizeof host));
    assert_true(host[3] == 5.0f);
    ca_xla_metrics m = metrics();
    assert_int_equal(m.h2d_transfers, 1);
    assert_int_equal(m.h2d_bytes, sizeof host);
    assert_int_equal(m.d2h_transfers, 1);
    ca_device_free(X, d);
}

/* A write overwritten before it is read, and a temporary freed unread, are dead; writes to memory
 * that survives the graph are not. */
static void test_dead_code(void **state) {
    const ca_kernels *k = ca_device_kernels(X);
    void *c = ca_device_context(X), *a = NULL, *t = NULL, *p = NULL;
    T_OK(ca_device_alloc(X, 64 * 4, &a));
    T_OK(ca_device_alloc(X, 64 * 4, &t));
    T_OK(ca_device_alloc(X, 64 * 4, &p));
    T_OK(ca_device_synchronize(X));
    T_OK(ca_xla_metrics_reset(X));
    T_OK(XKC(fill, .dt = CA_F32, .n = 64, .value = 1.0, .y = a));           /* dead: overwritten below, unread */
    T_OK(XKC(fill, .dt = CA_F32, .n = 64, .value = 2.0, .y = a));
    T_OK(XKC(fill, .dt = CA_F32, .n = 64, .value = 3.0, .y = t));           /* live: read by the next node */
    T_OK(XKC(axpby, .dt = CA_F32, .n = 64, .alpha = 1.0f, .x = t, .beta = 1.0f, .y = p));        /* p survives: live */
    T_OK(XKC(unary, .op = CA_UNARY_NEG, .dt = CA_F32, .n = 64, .x = t, .y = t, .alpha = 0));   /* dead: t is freed unread */
    T_OK(XKC(axpby, .dt = CA_F32, .n = 64, .alpha = 1.0f, .x = a, .beta = 0.0f, .y = t));        /* dead: t is freed unread */
    ca_device_free(X, t);
    float h[64];
    T_OK(ca_device_copy_to_host(X, h, a, sizeof h));
    assert_true(h[0] == 2.0f && h[63] == 2.0f);
    ca_xla_metrics m = metrics();
    assert_int_equal(m.nodes_recorded, 6);
    assert_int_equal(m.nodes_eliminated, 3);
    assert_int_equal(m.nodes_executed, 3);
    ca_device_free(X, a);
    ca_device_free(X, p);
}

static ca_dataset *synthetic(int64_t n, int in, int classes) {
    float *x = malloc(sizeof(float) * (size_t)(n * in));
    int64_t *y = malloc(sizeof(int64_t) * (size_t)n);
    uint64_t s = 99;
    for (int64_t i = 0; i < n; i++) {
        for (int j = 0; j < in; j++) x[i * in + j] = t_randf(&s, -1, 1);
        y[i] = (int64_t)(t_rand_u64(&s) % (uint64_t)classes);
    }
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 1, .shape = {in}}, ys = {.dtype = CA_I64, .ndim = 0};
    ca_dataset *ds;
    T_OK(ca_dataset_from_memory(&xs, x, &ys, y, n, &ds));
    free(x);
    free(y);
    return ds;
}

/* An accelerator with distributed_type XLA, as a program's configuration would ask for it. */
static ca_accelerator *xla_accelerator(void) {
    const char *settings[] = {"distributed_type=XLA", NULL};
    char *argv[] = {"test", NULL};
    ca_accelerator *acc;
    T_OK(ca_accelerator_create(&(ca_options){.argc = 1, .argv = argv, .settings = settings}, &acc));
    return acc;
}

static ca_module *mlp(void) {
    ca_module *seq, *l;
    T_OK(ca_sequential_create(&seq));
    T_OK(ca_linear_create(8, 16, true, &l)); T_OK(ca_module_add(seq, "fc1", l));
    T_OK(ca_gelu_create(&l));                 T_OK(ca_module_add(seq, "act", l));
    T_OK(ca_dropout_create(0.1, &l));         T_OK(ca_module_add(seq, "drop", l));
    T_OK(ca_layer_norm_create(16, 0, &l));    T_OK(ca_module_add(seq, "norm", l));
    T_OK(ca_linear_create(16, 3, true, &l));  T_OK(ca_module_add(seq, "fc2", l));
    return seq;
}

/* distributed_type XLA trains on the xla device; the prepared dataloader marks each step. Step 2
 * compiles nothing, the short last batch compiles once, the second epoch nothing at all and
 * allocates no device memory. */
static void test_training_cache(void **state) {
    ca_accelerator *acc = xla_accelerator();
    assert_string_equal(ca_device_name(ca_accelerator_device(acc)), "xla");
    ca_device *dev = ca_accelerator_device(acc);
    T_OK(ca_set_seed(acc, 5));
    ca_dataset *ds = synthetic(8 * 16 + 5, 8, 3);   /* 8 batches of 16, then one of 5 */
    ca_dataloader *dl;
    T_OK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = 16, .shuffle = true}, &dl));
    ca_module *m = mlp();
    ca_optimizer *opt;
    T_OK(ca_adamw_create(m, NULL, &opt));
    T_OK(ca_prepare(acc, m, opt, dl));
    T_OK(ca_device_synchronize(dev));
    T_OK(ca_xla_metrics_reset(dev));
    uint64_t compiles[2][10] = {{0}}, device_allocs[2] = {0};
    for (int epoch = 0; epoch < 2; epoch++) {
        ca_allocator_stats st;
        T_OK(ca_device_memory_stats(dev, &st));
        device_allocs[epoch] = st.num_device_allocs;
        ca_batch b;
        int step = 0;
        while (ca_dataloader_next(dl, &b)) {
            T_OK(ca_backward(acc, ca_cross_entropy(ca_module_forward(m, b.x), b.y)));
            T_OK(ca_optimizer_step(opt));
            ca_optimizer_zero_grad(opt);
            T_OK(ca_mark_step(acc));
            ca_xla_metrics xm;
            T_OK(ca_xla_metrics_get(dev, &xm));
            compiles[epoch][step++] = xm.compiles;
        }
        T_OK(ca_dataloader_status(dl));
        assert_int_equal(step, 9);
    }
    for (int e = 0; e < 2; e++) {
        printf("epoch %d compiles after each step:", e + 1);
        for (int i = 0; i < 9; i++) printf(" %llu", (unsigned long long)compiles[e][i]);
        printf("\n");
    }
    assert_true(compiles[0][0] >= 1);
    for (int i = 1; i < 8; i++) assert_int_equal(compiles[0][i], compiles[0][0]);   /* step 2..8: cached */
    assert_int_equal(compiles[0][8], compiles[0][7] + 1);                        /* the short batch */
    for (int i = 0; i < 9; i++) assert_int_equal(compiles[1][i], compiles[0][8]);  /* epoch 2: nothing */
    ca_allocator_stats st;   /* ... and allocates no device memory: blocks come from the cache, */
    T_OK(ca_device_memory_stats(dev, &st));   /* intermediates from the graph arena */
    printf("device allocations: %llu in epoch 1, %llu in epoch 2\n",
           (unsigned long long)(device_allocs[1] - device_allocs[0]),
           (unsigned long long)(st.num_device_allocs - device_allocs[1]));
    assert_int_equal(st.num_device_allocs, device_allocs[1]);
    ca_xla_metrics xm;
    T_OK(ca_xla_metrics_get(dev, &xm));
    assert_true(xm.cache_hits >= 16);
    assert_true(xm.mark_steps >= 18);
    char report[2048];
    T_OK(ca_xla_metrics_report(dev, report, sizeof report));
    assert_non_null(strstr(report, "compiles: "));
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
}

/* The prepared dataloader ends a step's scope before it marks the step, as torch_xla sees Python's
 * dead tensors at mark_step: the step's temporaries are the graph's intermediates (placed in its
 * arena), not blocks that outlive it. Each step here makes a 1 MiB temporary and its square. */
static void test_step_temporaries_are_intermediates(void **state) {
    ca_accelerator *acc = xla_accelerator();
    ca_device *dev = ca_accelerator_device(acc);
    ca_dataset *ds = synthetic(4 * 8, 8, 3);
    ca_dataloader *dl;
    T_OK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = 8}, &dl));
    T_OK(ca_prepare_dataloader(acc, dl));
    const int64_t n = 1 << 18;   /* 1 MiB of f32 */
    ca_tensor *kept = NULL;
    ca_batch b;
    int steps = 0;
    while (ca_dataloader_next(dl, &b)) {
        if (steps++ > 0) {   /* the previous step's graph ran in next() */
            ca_xla_metrics m;
            T_OK(ca_xla_metrics_get(dev, &m));
            printf("step %d: intermediates %llu bytes, arena %llu\n", steps - 1,
                   (unsigned long long)m.intermediate_bytes, (unsigned long long)m.arena_bytes);
            assert_true(m.intermediate_bytes >= 2 * (uint64_t)n * 4);
            assert_true(m.arena_bytes >= 2 * (uint64_t)n * 4 && m.arena_bytes <= 3 * (uint64_t)n * 4);
        }
        ca_tensor *big = ca_full(dev, CA_F32, CA_SHAPE(n), 0.5);
        ca_tensor *s = ca_add(ca_sum(ca_mul(big, big)), ca_sum(b.x));
        ca_tensor_free(kept);
        kept = ca_tensor_keep(ca_detach(s));
    }
    T_OK(ca_dataloader_status(dl));
    assert_int_equal(steps, 4);
    double v;
    T_OK(ca_tensor_item(kept, &v));
    assert_true(fabs(v - 0.25 * (double)n) < 0.5 * (double)n);
    ca_tensor_free(kept);
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
    ca_accelerator_destroy(acc);
}

/* clip_grad_norm computes the norm and the coefficient on the device (torch's arithmetic): without
 * a request for the norm it runs no graph, so the step stays one graph; the clipped gradients have
 * norm max_norm, and the norm, when asked for, is read at the end. */
static void test_clip_grad_norm_in_graph(void **state) {
    ca_accelerator *acc = xla_accelerator();
    ca_device *dev = ca_accelerator_device(acc);
    ca_module *m;
    T_OK(ca_linear_create(4, 3, true, &m));
    T_OK(ca_prepare(acc, m, NULL, NULL));
    T_OK(ca_device_synchronize(dev));
    T_OK(ca_xla_metrics_reset(dev));
    CA_SCOPE {
        ca_tensor *x = ca_full(dev, CA_F32, CA_SHAPE(2, 4), 3.0);
        T_OK(ca_backward(acc, ca_sum(ca_module_forward(m, x))));
    }
    T_OK(ca_clip_grad_norm(acc, 1.0, NULL));
    ca_xla_metrics xm;
    T_OK(ca_xla_metrics_get(dev, &xm));
    assert_int_equal(xm.graphs, 0);   /* nothing read back yet */
    double after = 0;
    for (int i = 0; i < 2; i++) {
        float *g = t_host(ca_tensor_grad(ca_module_param_at(m, i)));
        for (int j = 0; j < ca_tensor_numel(ca_module_param_at(m, i)); j++) after += (double)g[j] * g[j];
        free(g);
    }
    assert_float_equal(sqrt(after), 1.0, 1e-5);   /* dW = 6 (12 entries), db = 2 (3): norm 21.07 */
    double norm;
    T_OK(ca_clip_grad_norm(acc, 0.5, &norm));     /* asked for: the norm before this clipping */
    assert_float_equal(norm, 1.0, 1e-5);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
}

/* y = relu(tanh(a * b + c) * 2 - log(a)) with c broadcast over rows: five elementwise nodes whose
 * intermediates are freed by the scope, computed on dev; a and b from the host. */
static ca_tensor *chain(ca_device *dev, const float *ha, const float *hb, const float *hc, int64_t r, int64_t n) {
    ca_tensor *y = NULL;
    CA_SCOPE {
        ca_tensor *a = ca_from_host(dev, CA_F32, CA_SHAPE(r, n), ha);
        ca_tensor *b = ca_from_host(dev, CA_F32, CA_SHAPE(r, n), hb);
        ca_tensor *c = ca_from_host(dev, CA_F32, CA_SHAPE(1, n), hc);
        y = ca_tensor_keep(ca_relu(ca_sub(ca_mul_scalar(ca_tanh(ca_add(ca_mul(a, b), c)), 2.0), ca_log(a))));
    }
    return y;
}

static void chain_case(int64_t r, int64_t n, bool fuse) {
    size_t e = (size_t)(r * n);
    float *ha = malloc(e * 4), *hb = malloc(e * 4), *hc = malloc((size_t)n * 4), *hx = malloc(e * 4),
          *hy = malloc(e * 4);
    uint64_t seed = 7;
    for (size_t i = 0; i < e; i++) {
        ha[i] = t_randf(&seed, -0.5f, 2.0f);   /* log of a negative: NaN, compared bit for bit too */
        hb[i] = t_randf(&seed, -2.0f, 2.0f);
    }
    for (int64_t i = 0; i < n; i++) hc[i] = t_randf(&seed, -1.0f, 1.0f);
    setenv("CACCEL_XLA_FUSION", fuse ? "1" : "0", 1);
    T_OK(ca_device_synchronize(X));
    T_OK(ca_xla_metrics_reset(X));
    ca_tensor *yx = chain(X, ha, hb, hc, r, n), *yc = chain(ca_cpu_device(), ha, hb, hc, r, n);
    T_OK(ca_tensor_to_host(yx, hx, e * 4));
    T_OK(ca_tensor_to_host(yc, hy, e * 4));
    unsetenv("CACCEL_XLA_FUSION");
    assert_memory_equal(hx, hy, e * 4);
    ca_xla_metrics m = metrics();
    printf("%lld x %lld, fusion %s: nodes executed %llu, kernels launched %llu, fused kernels %llu (%llu nodes)\n",
           (long long)r, (long long)n, fuse ? "on" : "off", (unsigned long long)m.nodes_executed,
           (unsigned long long)m.kernels_launched, (unsigned long long)m.fused_kernels,
           (unsigned long long)m.fused_nodes);
    if (fuse) {
        /* mul, add, tanh, scale, sub, relu: one loop (log(a) is computed before, its result read) */
        assert_int_equal(m.fused_kernels, 1);
        assert_true(m.fused_nodes >= 5);
        assert_int_equal(m.kernels_launched, m.nodes_executed - m.fused_nodes + 1);
    } else {
        assert_int_equal(m.fused_kernels, 0);
        assert_int_equal(m.kernels_launched, m.nodes_executed);
    }
    ca_tensor_free(yx);
    ca_tensor_free(yc);
    free(ha); free(hb); free(hc); free(hx); free(hy);
}

/* A fused elementwise chain (with a broadcast operand) equals the eager cpu result bit for bit,
 * and so does the same graph unfused; the metrics show the fusion. Sizes not a multiple of the
 * loop's chunk, and a different size for each mode so that each compiles its own program. */
static void test_fusion(void **state) {
    chain_case(7, 301, true);
    chain_case(5, 301, false);
}

/* Every unary op fuses, including the ones built on the cpu backend's own exp (sigmoid, SiLU, both
 * GELUs): add -> op -> scale runs as one loop and equals the cpu kernels bit for bit, because both
 * run the same per-element code (base/unary_math_impl.h). */
static void unary_through(ca_device *d, ca_unary_op op, const float *ha, const float *hb, float *out, size_t n) {
    const ca_kernels *k = ca_device_kernels(d);
    void *c = ca_device_context(d), *a = NULL, *b = NULL, *t = NULL, *u = NULL, *y = NULL;
    size_t bytes = n * sizeof(float);
    T_OK(ca_device_alloc(d, bytes, &a));
    T_OK(ca_device_alloc(d, bytes, &b));
    T_OK(ca_device_alloc(d, bytes, &t));
    T_OK(ca_device_alloc(d, bytes, &u));
    T_OK(ca_device_alloc(d, bytes, &y));
    T_OK(ca_device_copy_from_host(d, a, ha, bytes));
    T_OK(ca_device_copy_from_host(d, b, hb, bytes));
    ca_bcast_args sh = {.ndim = 1, .shape = {(int64_t)n}, .a_stride = {1}, .b_stride = {1}};
    T_OK(XKC(binary, .op = CA_BINARY_ADD, .dt = CA_F32, .shape = sh, .a = a, .b = b, .y = t));
    T_OK(XKC(unary, .op = op, .dt = CA_F32, .n = (int64_t)n, .x = t, .y = u,
             .alpha = op == CA_UNARY_POW ? 3.0f : 0.75f));
    ca_device_free(d, t);
    T_OK(XKC(unary, .op = CA_UNARY_SCALE, .dt = CA_F32, .n = (int64_t)n, .x = u, .y = y, .alpha = 1.5f));
    ca_device_free(d, u);
    T_OK(ca_device_copy_to_host(d, out, y, bytes));
    ca_device_free(d, a);
    ca_device_free(d, b);
    ca_device_free(d, y);
}

static void test_fusion_every_unary(void **state) {
    enum { N = 777 };
    float ha[N], hb[N], hx[N], hc[N];
    uint64_t seed = 11;
    for (int i = 0; i < N; i++) {
        ha[i] = t_randf(&seed, -6.0f, 6.0f);
        hb[i] = t_randf(&seed, -1.0f, 1.0f);
    }
    for (int op = 0; op < CA_UNARY_OP_COUNT; op++) {
        T_OK(ca_xla_metrics_reset(X));
        unary_through(X, (ca_unary_op)op, ha, hb, hx, N);
        unary_through(ca_cpu_device(), (ca_unary_op)op, ha, hb, hc, N);
        ca_xla_metrics m = metrics();
        if (memcmp(hx, hc, sizeof hx) != 0) fail_msg("unary op %d: the fused loop differs from the cpu kernel", op);
        if (m.fused_kernels != 1 || m.fused_nodes != 3) fail_msg("unary op %d: %llu fused loops of %llu nodes, not 1 of 3", op,
                                                                 (unsigned long long)m.fused_kernels,
                                                                 (unsigned long long)m.fused_nodes);
    }
}

/* A chain whose output overlaps a broadcast input (the loop would overwrite the row it still
 * reads) runs node by node: the result is the eager one, and no fused loop is counted. */
static void test_fusion_overlap(void **state) {
    const ca_kernels *k = ca_device_kernels(X);
    void *c = ca_device_context(X), *y = NULL, *b = NULL, *t = NULL;
    enum { R = 3, N = 300 };
    float hb[R * N], hy[R * N], want[R * N];
    uint64_t seed = 3;
    for (int i = 0; i < R * N; i++) {
        hb[i] = t_randf(&seed, -1, 1);
        hy[i] = t_randf(&seed, -1, 1);
    }
    for (int i = 0; i < R * N; i++) {   /* a is y's first row, broadcast over the rows */
        float v = hy[i % N] + hb[i];
        want[i] = v < 0.0f ? 0.0f : v;
    }
    T_OK(ca_device_alloc(X, sizeof hy, &y));
    T_OK(ca_device_alloc(X, sizeof hb, &b));
    T_OK(ca_device_alloc(X, sizeof hb, &t));
    T_OK(ca_device_copy_from_host(X, y, hy, sizeof hy));
    T_OK(ca_device_copy_from_host(X, b, hb, sizeof hb));
    T_OK(ca_xla_metrics_reset(X));
    ca_bcast_args sh = {.ndim = 2, .shape = {R, N}, .a_stride = {0, 1}, .b_stride = {N, 1}};
    T_OK(XKC(binary, .op = CA_BINARY_ADD, .dt = CA_F32, .shape = sh, .a = y, .b = b, .y = t));
    T_OK(XKC(unary, .op = CA_UNARY_RELU, .dt = CA_F32, .n = R * N, .x = t, .y = y, .alpha = 0));
    ca_device_free(X, t);
    T_OK(ca_device_copy_to_host(X, hy, y, sizeof hy));
    assert_memory_equal(hy, want, sizeof hy);
    ca_xla_metrics m = metrics();
    assert_int_equal(m.nodes_executed, 2);
    assert_int_equal(m.fused_kernels, 0);
    assert_int_equal(m.kernels_launched, 2);   /* planned as one loop, run node by node */
    ca_device_free(X, y);
    ca_device_free(X, b);
}

/* Trains the 8-16-3 model of mlp() for 6 steps of AdamW on dev, the inputs normalised on the device
 * inside each step (relu((x - mu) * 2) with mu broadcast over rows: a chain the compiler fuses, as
 * no gradient flows into it); returns all parameters on the host. */
static float *train_normalised(ca_device *dev, int64_t *count) {
    enum { B = 16, D = 8 };
    float hx[B * D], hmu[D];
    int64_t hy[B];
    uint64_t seed = 11;
    for (int i = 0; i < B * D; i++) hx[i] = t_randf(&seed, -1, 1);
    for (int i = 0; i < D; i++) hmu[i] = t_randf(&seed, -0.5f, 0.5f);
    for (int i = 0; i < B; i++) hy[i] = (int64_t)(t_rand_u64(&seed) % 3);
    ca_manual_seed(4);
    ca_module *m = mlp();
    ca_module_train(m, false);   /* no dropout: the parity is of the arithmetic */
    T_OK(ca_module_to(m, dev));
    ca_optimizer *opt;
    T_OK(ca_adamw_create(m, NULL, &opt));
    ca_tensor *x = ca_tensor_keep(ca_from_host(dev, CA_F32, CA_SHAPE(B, D), hx));
    ca_tensor *mu = ca_tensor_keep(ca_from_host(dev, CA_F32, CA_SHAPE(1, D), hmu));
    ca_tensor *y = ca_tensor_keep(ca_from_host(dev, CA_I64, CA_SHAPE(B), hy));
    for (int step = 0; step < 6; step++) {
        CA_SCOPE {
            ca_tensor *xn = ca_relu(ca_mul_scalar(ca_sub(x, mu), 2.0));
            T_OK(ca_autograd_backward(ca_cross_entropy(ca_module_forward(m, xn), y)));
            T_OK(ca_optimizer_step(opt));
            ca_optimizer_zero_grad(opt);
        }
        T_OK(ca_device_mark_step(dev));
    }
    *count = ca_module_param_count(m);
    float *out = malloc((size_t)*count * sizeof *out), *p = out;
    for (int i = 0; i < ca_module_num_params(m); i++) {
        ca_tensor *t = ca_module_param_at(m, i);
        T_OK(ca_tensor_to_host(t, p, (size_t)ca_tensor_numel(t) * sizeof *p));
        p += ca_tensor_numel(t);
    }
    ca_tensor_free(x);
    ca_tensor_free(mu);
    ca_tensor_free(y);
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    return out;
}

/* Training with a fused chain in every step ends with the eager cpu run's parameters, bit for bit. */
static void test_fusion_training(void **state) {
    T_OK(ca_device_synchronize(X));
    T_OK(ca_xla_metrics_reset(X));
    int64_t nx, nc;
    float *px = train_normalised(X, &nx), *pc = train_normalised(ca_cpu_device(), &nc);
    ca_xla_metrics m = metrics();
    printf("6 training steps: %llu fused loops (%llu nodes), %llu kernels launched\n",
           (unsigned long long)m.fused_kernels, (unsigned long long)m.fused_nodes,
           (unsigned long long)m.kernels_launched);
    assert_true(m.fused_kernels >= 6);
    assert_int_equal(nx, nc);
    assert_memory_equal(px, pc, (size_t)nx * sizeof *px);
    free(px);
    free(pc);
}

/* Buffer planning and placement: a chain of temporaries needs two of them at once, not all of them;
 * the program places them at offsets in the graph arena by their live ranges, so the device holds
 * two blocks' memory for them while the graph runs (eight before placement), and temporaries a
 * fused loop never writes get no memory at all. Memory is counted as `reserved`: `allocated`
 * counts the addresses handed out, which hold no memory until a graph or a transfer needs it. */
static uint64_t reserved_growth(ca_allocator_stats *st0) {
    ca_allocator_stats st1;
    T_OK(ca_device_memory_stats(X, &st1));
    return st1.peak_reserved - st0->reserved;
}

static void test_buffer_plan(void **state) {
    const int64_t n = 1 << 16;   /* 256 KiB */
    const uint64_t blk = (uint64_t)n * 4;
    ca_tensor *a = ca_tensor_keep(ca_full(X, CA_F32, CA_SHAPE(n), 0.5));
    T_OK(ca_device_synchronize(X));
    T_OK(ca_xla_metrics_reset(X));
    T_OK(ca_device_empty_cache(X));
    T_OK(ca_device_reset_peak_stats(X));
    ca_allocator_stats st0;
    T_OK(ca_device_memory_stats(X, &st0));
    ca_tensor *y = NULL;
    CA_SCOPE {
        ca_tensor *t = a;
        for (int i = 0; i < 8; i++) t = ca_softmax(t);   /* not elementwise, not fused: 8 intermediates */
        y = ca_tensor_keep(ca_add(t, a));
    }
    T_OK(ca_device_synchronize(X));
    ca_xla_metrics m = metrics();
    printf("planned peak %llu bytes, arena %llu, of %llu bytes of intermediates; device memory +%llu\n",
           (unsigned long long)m.planned_peak_bytes, (unsigned long long)m.arena_bytes,
           (unsigned long long)m.intermediate_bytes, (unsigned long long)reserved_growth(&st0));
    assert_int_equal(m.intermediate_bytes, 8 * blk);
    assert_int_equal(m.planned_peak_bytes, 2 * blk);
    assert_int_equal(m.arena_bytes, 2 * blk);
    assert_true(reserved_growth(&st0) <= 3 * blk + 4096);   /* the arena and y */
    double v;
    CA_SCOPE { T_OK(ca_tensor_item(ca_sum(y), &v)); }
    assert_true(fabs(v - (double)n * (1.0 / (double)n + 0.5)) < 1e-3 * (double)n);
    ca_tensor_free(y);
    /* a chain freed as it goes, fused into one loop: only its result gets memory */
    T_OK(ca_device_empty_cache(X));
    T_OK(ca_device_reset_peak_stats(X));
    T_OK(ca_device_memory_stats(X, &st0));
    ca_tensor *t = ca_tensor_keep(ca_sigmoid(a));
    for (int i = 0; i < 7; i++) {
        ca_tensor *u = ca_tensor_keep(ca_sigmoid(t));
        ca_tensor_free(t);
        t = u;
    }
    assert_int_equal(metrics().graphs, 2);   /* all of it still pending */
    float *h = malloc((size_t)blk);
    T_OK(ca_tensor_to_host(t, h, (size_t)blk));
    assert_true(h[0] > 0.5f && h[0] < 1.0f);
    printf("device memory over the fused chain: +%llu bytes\n", (unsigned long long)reserved_growth(&st0));
    assert_true(reserved_growth(&st0) <= blk + 4096);
    free(h);
    ca_tensor_free(t);
    ca_tensor_free(a);
}

/* Device addresses are the device's own: the range behind them is reserved without access, so a
 * host read through one faults instead of reading what a pending graph has not written yet. */
static void test_device_addresses(void **state) {
    ca_tensor *a = ca_tensor_keep(ca_full(X, CA_F32, CA_SHAPE(1), 1.5));
    float h;
    T_OK(ca_tensor_to_host(a, &h, sizeof h));
    assert_true(h == 1.5f);
    uintptr_t p = (uintptr_t)ca_tensor_data(a);
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[512], perms[8] = "";
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && p >= lo && p < hi) found = true;
    }
    fclose(f);
    assert_true(found);
    printf("device address %p lies in a mapping with permissions %s\n", (void *)p, perms);
    assert_string_equal(perms, "---p");
    ca_tensor_free(a);
}

/* bf16 storage (mixed_precision bf16 on xla, torch_xla's XLA_USE_BF16): a node's f32 inputs that came
 * from the host are rounded to bf16 before it reads them, its f32 outputs after it wrote them; other
 * dtypes are left alone (an i64 index that would change if read as floats); a fused chain rounds
 * only what it stores; turned off, results are f32 again. */
static float to_bf16(float f) {     /* round to nearest even; the test's values are finite */
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static bool is_bf16(float f) { return to_bf16(f) == f; }

static void test_bf16_storage(void **state) {
    ca_device *d = X;
    assert_false(ca_xla_bf16_storage(d));
    T_OK(ca_xla_set_bf16_storage(d, true));
    assert_true(ca_xla_bf16_storage(d));
    enum { N = 41, ROWS = 300 };
    float ha[N], hb[N], table[ROWS * 2];
    for (int i = 0; i < N; i++) {
        ha[i] = 1.0f + (float)i / 1000.0f;       /* not bf16 values: 8 bits of mantissa are too few */
        hb[i] = 0.3f + (float)i / 7000.0f;
    }
    for (int i = 0; i < ROWS * 2; i++) table[i] = (float)i + 0.123f;
    int64_t idx[2] = {257, 3};                   /* as a float, 257 is a subnormal bf16 rounding would change */
    CA_SCOPE {
        ca_tensor *a = ca_from_host(d, CA_F32, CA_SHAPE(N), ha), *b = ca_from_host(d, CA_F32, CA_SHAPE(N), hb);
        ca_tensor *p = ca_mul(a, b);
        ca_tensor *s = ca_sum(p);
        ca_tensor *e = ca_embedding(ca_from_host(d, CA_I64, CA_SHAPE(2), idx), ca_from_host(d, CA_F32,
                                                                                          CA_SHAPE(ROWS, 2), table));
        float hp[N], hs, he[4];
        T_OK(ca_tensor_to_host(p, hp, sizeof hp));
        T_OK(ca_tensor_to_host(s, &hs, sizeof hs));
        T_OK(ca_tensor_to_host(e, he, sizeof he));
        double sum = 0;
        bool all_bf16_inputs = true;
        for (int i = 0; i < N; i++) {
            /* a product of two bf16 values is exact in f32: one rounding, to bf16, at the output */
            assert_true(hp[i] == to_bf16(to_bf16(ha[i]) * to_bf16(hb[i])));
            all_bf16_inputs &= is_bf16(ha[i]);
            sum += hp[i];
        }
        assert_false(all_bf16_inputs);
        assert_true(is_bf16(hs) && fabs(hs - sum) <= 0.01 * fabs(sum));
        assert_true(he[0] == to_bf16(table[514]) && he[1] == to_bf16(table[515]));   /* row 257 */
        assert_true(he[2] == to_bf16(table[6]) && he[3] == to_bf16(table[7]));       /* row 3 */
        /* a fused chain keeps its intermediate in f32 and rounds what it stores */
        uint64_t fused = metrics().fused_kernels;
        ca_tensor *f = NULL;
        CA_SCOPE { f = ca_tensor_keep(ca_add(ca_mul(a, b), a)); }
        float hf[N];
        T_OK(ca_tensor_to_host(f, hf, sizeof hf));
        ca_tensor_free(f);
        assert_true(metrics().fused_kernels > fused);
        for (int i = 0; i < N; i++) {
            float ra = to_bf16(ha[i]), rb = to_bf16(hb[i]);
            assert_true(hf[i] == to_bf16(ra * rb + ra));
        }
        /* off: the same product is f32 again (the inputs stay as they were rounded) */
        T_OK(ca_xla_set_bf16_storage(d, false));
        ca_tensor *q = ca_mul(a, b);
        float hq[N];
        T_OK(ca_tensor_to_host(q, hq, sizeof hq));
        int not_bf16 = 0;
        for (int i = 0; i < N; i++) {
            assert_true(hq[i] == to_bf16(ha[i]) * to_bf16(hb[i]));
            not_bf16 += !is_bf16(hq[i]);
        }
        assert_true(not_bf16 > 0);
    }
    assert_int_equal(ca_xla_set_bf16_storage(ca_cpu_device(), true), CA_ERR_INVALID);
    assert_false(ca_xla_bf16_storage(ca_cpu_device()));
    /* an accelerator with bf16 on xla turns it on (no autocast then), and back off when destroyed */
    char *argv[] = {"test_xla", "--tpu", "--mixed_precision", "bf16", NULL};
    ca_accelerator *acc;
    T_OK(ca_accelerator_create(&(ca_options){.argc = 4, .argv = argv}, &acc));
    assert_ptr_equal(ca_accelerator_device(acc), d);
    assert_true(ca_xla_bf16_storage(d));
    ca_accelerator_destroy(acc);
    assert_false(ca_xla_bf16_storage(d));
}

/* The metrics calls refuse other devices, naming the device. */
static void test_metrics_other_device(void **state) {
    ca_xla_metrics m;
    assert_int_equal(ca_xla_metrics_get(ca_cpu_device(), &m), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "cpu:0 is not an xla device"));
    T_OK(ca_device_mark_step(ca_cpu_device()));
}

int main(void) {
    ca_log_set_level(CA_LOG_WARNING);
    T_OK(ca_device_open("xla", 0, NULL, &X));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lazy_until_read), cmocka_unit_test(test_host_memory_refused),
        cmocka_unit_test(test_host_fn_in_graph_order), cmocka_unit_test(test_host_fn_keyed),
        cmocka_unit_test(test_bad_call_fails_at_the_op),
        cmocka_unit_test(test_dead_code),       cmocka_unit_test(test_training_cache),
        cmocka_unit_test(test_metrics_other_device), cmocka_unit_test(test_fusion),
        cmocka_unit_test(test_fusion_every_unary),
        cmocka_unit_test(test_buffer_plan),     cmocka_unit_test(test_fusion_overlap),
        cmocka_unit_test(test_device_addresses), cmocka_unit_test(test_step_temporaries_are_intermediates),
        cmocka_unit_test(test_clip_grad_norm_in_graph),
        cmocka_unit_test(test_fusion_training), cmocka_unit_test(test_bf16_storage),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_shutdown();
    return rc;
}
