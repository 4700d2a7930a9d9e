/* Accelerator tests (one process): flat memory over 10,000 steps, gradient accumulation, clipping, configuration errors, LocalSGD's checks. */
#include "test_util.h"

static char *argv_cpu[] = {"test", "--cpu", NULL};

static ca_accelerator *make_acc(const char *const *settings) {
    ca_accelerator *acc;
    T_OK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = argv_cpu, .settings = settings}, &acc));
    return acc;
}

static ca_module *small_mlp(int in, int hidden, int out) {
    ca_module *seq, *l;
    T_OK(ca_sequential_create(&seq));
    T_OK(ca_linear_create(in, hidden, true, &l)); T_OK(ca_module_add(seq, "fc1", l));
    T_OK(ca_gelu_create(&l));                     T_OK(ca_module_add(seq, "act", l));
    T_OK(ca_dropout_create(0.1, &l));             T_OK(ca_module_add(seq, "drop", l));
    T_OK(ca_layer_norm_create(hidden, 0, &l));    T_OK(ca_module_add(seq, "norm", l));
    T_OK(ca_linear_create(hidden, out, true, &l)); T_OK(ca_module_add(seq, "fc2", l));
    return seq;
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

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* The lifetime rule in a real loop: after warm-up, 10,000 steps allocate nothing new. */
static void test_memory_flat_over_10000_steps(void **state) {
    ca_accelerator *acc = make_acc(NULL);
    ca_dataset *ds = synthetic(512, 16, 4);
    ca_dataloader *dl;
    T_OK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = 32, .shuffle = true}, &dl));
    ca_module *m = small_mlp(16, 32, 4);
    ca_optimizer *opt;
    T_OK(ca_adamw_create(m, NULL, &opt));
    T_OK(ca_prepare(acc, m, opt, dl));
    ca_device *dev = ca_accelerator_device(acc);
    ca_allocator_stats warm = {0}, now;
    long rss_warm = 0;
    int64_t live_warm = 0;
    int step = 0;
    while (step < 10000) {
        ca_batch b;
        while (step < 10000 && ca_dataloader_next(dl, &b)) {
            ca_tensor *loss = ca_cross_entropy(ca_module_forward(m, b.x), b.y);
            T_OK(ca_backward(acc, loss));
            T_OK(ca_optimizer_step(opt));
            ca_optimizer_zero_grad(opt);
            if (++step == 200) {
                T_OK(ca_device_memory_stats(dev, &warm));
                rss_warm = rss_kib();
                live_warm = ca_scope_live_tensors();
            }
        }
        T_OK(ca_dataloader_status(dl));
    }
    T_OK(ca_device_memory_stats(dev, &now));
    /* no raw allocation after warm-up, the peak did not move, live tensors are one step's worth */
    assert_int_equal(now.num_device_allocs, warm.num_device_allocs);
    assert_int_equal(now.peak_allocated, warm.peak_allocated);
    assert_true(now.num_allocs > warm.num_allocs + 9000);
    assert_true(ca_scope_live_tensors() <= live_warm + 8);
    /* RSS means nothing under valgrind or ASan (their own bookkeeping and quarantine grow) */
#ifndef __SANITIZE_ADDRESS__
    long grown = rss_kib() - rss_warm;
    if (!getenv("CACCEL_UNDER_VALGRIND") && grown > 2048)
        fail_msg("RSS grew by %ld KiB over 9,800 steps", grown);
#else
    (void)rss_warm;
#endif
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
}

/* One training step of the MLP on the next batch; returns the bytes in use just before zero_grad. */
static size_t one_step(ca_accelerator *acc, ca_dataloader *dl, ca_module *m, ca_optimizer *opt) {
    ca_batch b;
    ca_allocator_stats st;
    assert_true(ca_dataloader_next(dl, &b));
    ca_tensor *loss = ca_cross_entropy(ca_module_forward(m, b.x), b.y);
    T_OK(ca_backward(acc, loss));
    T_OK(ca_optimizer_step(opt));
    T_OK(ca_device_memory_stats(ca_accelerator_device(acc), &st));
    ca_optimizer_zero_grad(opt);
    return st.allocated;
}

/* The structural part of the peak: the first step reserves what a step needs (activations,
 * gradients, AdamW's state); every later step is served from that, holds no more at its peak and
 * ends holding what the first ended with. zero_grad gives the gradients' memory back, as torch's
 * zero_grad(set_to_none=True) does, so the next forward's activations reuse it. */
static void test_later_steps_allocate_nothing_new(void **state) {
    ca_accelerator *acc = make_acc(NULL);
    ca_device *dev = ca_accelerator_device(acc);
    ca_dataset *ds = synthetic(512, 64, 4);
    ca_dataloader *dl;
    T_OK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = 32, .shuffle = true}, &dl));
    ca_module *m = small_mlp(64, 256, 4);
    ca_optimizer *opt;
    T_OK(ca_adamw_create(m, NULL, &opt));
    T_OK(ca_prepare(acc, m, opt, dl));
    size_t grad_bytes = 0;
    for (int i = 0; i < ca_module_num_params(m); i++) grad_bytes += ca_tensor_nbytes(ca_module_param_at(m, i));
    T_OK(ca_device_empty_cache(dev));
    T_OK(ca_device_reset_peak_stats(dev));
    ca_allocator_stats first, now;
    size_t held = one_step(acc, dl, m, opt);
    T_OK(ca_device_memory_stats(dev, &first));
    assert_true(held - first.allocated >= grad_bytes);        /* zero_grad released the gradients */
    for (int step = 2; step <= 12; step++) {
        T_OK(ca_device_reset_peak_stats(dev));
        one_step(acc, dl, m, opt);
        T_OK(ca_device_memory_stats(dev, &now));
        if (now.num_device_allocs != first.num_device_allocs || now.allocated != first.allocated ||
            now.peak_allocated > first.peak_allocated || now.reserved > first.reserved)
            fail_msg("step %d: %llu raw allocations (first step: %llu), %zu bytes held after it (%zu), "
                     "%zu at its peak (%zu), %zu reserved (%zu)", step, (unsigned long long)now.num_device_allocs,
                     (unsigned long long)first.num_device_allocs, now.allocated, first.allocated,
                     now.peak_allocated, first.peak_allocated, now.reserved, first.reserved);
    }
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
}

/* Parameters of a model trained for `steps` real steps with accumulation k and batch b. */
static float *train_params(int k, int64_t batch, int steps, int *nfloats) {
    char ga[64];
    snprintf(ga, sizeof ga, "gradient_accumulation_steps=%d", k);
    const char *settings[] = {ga, NULL};
    ca_accelerator *acc = make_acc(settings);
    T_OK(ca_set_seed(acc, 5));
    ca_dataset *ds = synthetic(512, 8, 3);
    ca_dataloader *dl;
    T_OK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = batch, .shuffle = true, .seed = 3}, &dl));
    ca_module *m, *l;
    T_OK(ca_sequential_create(&m));
    T_OK(ca_linear_create(8, 16, true, &l)); T_OK(ca_module_add(m, "fc1", l));
    T_OK(ca_tanh_create(&l));                T_OK(ca_module_add(m, "act", l));
    T_OK(ca_linear_create(16, 3, true, &l)); T_OK(ca_module_add(m, "fc2", l));
    ca_optimizer *opt;
    T_OK(ca_sgd_create(m, &(ca_sgd_opts){.lr = 0.1, .momentum = 0.9}, &opt));
    T_OK(ca_prepare(acc, m, opt, dl));
    ca_batch b;
    while (ca_optimizer_steps(opt) < steps && ca_dataloader_next(dl, &b)) {
        CA_ACCUMULATE(acc, m) {
            T_OK(ca_backward(acc, ca_cross_entropy(ca_module_forward(m, b.x), b.y)));
            T_OK(ca_optimizer_step(opt));
            ca_optimizer_zero_grad(opt);
        }
    }
    int total = (int)ca_module_param_count(m), off = 0;
    float *out = malloc(sizeof(float) * (size_t)total);
    for (int i = 0; i < ca_module_num_params(m); i++) {
        ca_tensor *p = ca_module_param_at(m, i);
        T_OK(ca_tensor_to_host(p, out + off, ca_tensor_nbytes(p)));
        off += (int)ca_tensor_numel(p);
    }
    *nfloats = total;
    assert_int_equal(ca_optimizer_steps(opt), steps);
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
    return out;
}

/* k micro-batches of B with accumulation == one batch of k*B (same samples, same order). */
static void test_accumulation_equals_big_batch(void **state) {
    int n1, n2;
    float *acc4 = train_params(4, 8, 10, &n1);
    float *big = train_params(1, 32, 10, &n2);
    assert_int_equal(n1, n2);
    for (int i = 0; i < n1; i++)
        if (fabsf(acc4[i] - big[i]) > 1e-5f * (1 + fabsf(big[i])))
            fail_msg("parameter %d: accumulated %.8g vs big batch %.8g", i, acc4[i], big[i]);
    free(acc4);
    free(big);
}

static void test_clip_grad_norm(void **state) {
    ca_accelerator *acc = make_acc(NULL);
    ca_module *m;
    T_OK(ca_linear_create(4, 3, true, &m));
    T_OK(ca_prepare(acc, m, NULL, NULL));
    CA_SCOPE {
        ca_tensor *x = ca_full(ca_accelerator_device(acc), CA_F32, CA_SHAPE(2, 4), 3.0);
        T_OK(ca_backward(acc, ca_sum(ca_module_forward(m, x))));
    }
    /* reference: dW = 6 everywhere (12 entries), db = 2 (3 entries) */
    double ref = sqrt(12 * 36.0 + 3 * 4.0), norm;
    /* on host memory the gradients are scaled by one list kernel (as their sum of squares is taken), not
     * a broadcasting multiply per gradient: the profile of the call says which kernels ran */
    char dir[64];
    snprintf(dir, sizeof dir, "test_accelerator.%ld.trace", (long)getpid());
    T_OK(ca_profile_begin(&(ca_profile_config){.output_trace_dir = dir}));
    T_OK(ca_clip_grad_norm(acc, 1.0, &norm));
    T_OK(ca_profile_end());
    FILE *f = fopen(ca_profile_last_path(), "r");
    assert_non_null(f);
    char trace[1 << 16];
    size_t len = fread(trace, 1, sizeof trace - 1, f);
    fclose(f);
    trace[len] = '\0';
    assert_non_null(strstr(trace, "\"name\":\"scale_list\""));
    assert_null(strstr(trace, "\"name\":\"binary.mul\""));
    t_rm_tree(dir);
    assert_float_equal(norm, ref, 1e-4);
    double after = 0;
    for (int i = 0; i < 2; i++) {
        float *g = t_host(ca_tensor_grad(ca_module_param_at(m, i)));
        for (int j = 0; j < ca_tensor_numel(ca_module_param_at(m, i)); j++) after += (double)g[j] * g[j];
        free(g);
    }
    assert_float_equal(sqrt(after), 1.0, 1e-4);
    T_OK(ca_clip_grad_value(acc, 0.1));
    float *g = t_host(ca_tensor_grad(ca_module_param_at(m, 0)));
    for (int j = 0; j < 12; j++) assert_true(fabsf(g[j]) <= 0.1f + 1e-7f);
    free(g);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
}

/* End of dataloader follows the loader being iterated: an inner loader run during the outer
 * loader's last batch syncs every 2nd micro-step (not every one), and the outer loader's own
 * step after the inner loop still sees the outer loader's end. */
static void test_nested_loaders_end_of_dataloader(void **state) {
    const char *settings[] = {"gradient_accumulation_steps=2", NULL};
    ca_accelerator *acc = make_acc(settings);
    ca_dataset *ods = synthetic(16, 4, 2), *ids = synthetic(32, 4, 2);
    ca_dataloader *outer, *inner;
    T_OK(ca_dataloader_create(ods, &(ca_loader_opts){.batch_size = 8}, &outer));
    T_OK(ca_dataloader_create(ids, &(ca_loader_opts){.batch_size = 8}, &inner));
    ca_module *m;
    T_OK(ca_linear_create(4, 2, true, &m));
    T_OK(ca_prepare(acc, m, NULL, outer));
    T_OK(ca_prepare_dataloader(acc, inner));
    char seen[16] = {0};
    int n = 0;
    ca_batch ob, ib;
    while (ca_dataloader_next(outer, &ob)) {
        while (ca_dataloader_next(inner, &ib))
            CA_ACCUMULATE(acc, m) seen[n++] = ca_sync_gradients(acc) ? 'T' : 'F';
        CA_ACCUMULATE(acc, m) seen[n++] = ca_sync_gradients(acc) ? 'T' : 'F';
    }
    assert_string_equal(seen, "FTFTF" "TFTTT");   /* old rule: "FTFTF" "TTTTT" */
    ca_dataloader_destroy(inner);
    ca_dataloader_destroy(outer);
    ca_dataset_destroy(ids);
    ca_dataset_destroy(ods);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
}

static void test_configuration_reaches_the_accelerator(void **state) {
    const char *s1[] = {"distributed_type=MEGATRON_LM", NULL};
    ca_accelerator *acc;
    assert_int_equal(ca_accelerator_create(&(ca_options){.settings = s1}, &acc), CA_ERR_UNSUPPORTED);
    assert_non_null(strstr(ca_last_error(), "MEGATRON_LM"));
    char *argv[] = {"prog", "--mixed_precision", "fp8", "--cpu", NULL};
    assert_int_equal(ca_accelerator_create(&(ca_options){.argc = 4, .argv = argv}, &acc), CA_ERR_UNSUPPORTED);
    assert_non_null(strstr(ca_last_error(), "fp8"));
    assert_non_null(strstr(ca_last_error(), "--mixed_precision"));
    /* a DeepSpeed JSON that stops early, or is not an object: the reason in words (json-c's last
     * error was "json_tokener_parse_ex failed: continue" and a newline, or NULL) */
    char ds[64] = "/tmp/caccel-ds-XXXXXX";
    int fd = mkstemp(ds);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "{\"zero_optimization\": {", 23), 23);
    close(fd);
    char dsf[128];
    snprintf(dsf, sizeof dsf, "deepspeed_config.deepspeed_config_file=%s", ds);
    const char *s2[] = {"distributed_type=DEEPSPEED", dsf, "use_cpu=true", NULL};
    assert_int_equal(ca_accelerator_create(&(ca_options){.settings = s2}, &acc), CA_ERR_CONFIG);
    assert_non_null(strstr(ca_last_error(), "cannot read it as a JSON object (unexpected end of input at byte 23)"));
    FILE *f = fopen(ds, "w");
    fputs("[\"auto\"]", f);
    fclose(f);
    assert_int_equal(ca_accelerator_create(&(ca_options){.settings = s2}, &acc), CA_ERR_CONFIG);
    assert_non_null(strstr(ca_last_error(), "cannot read it as a JSON object (a JSON array, not an object)"));
    unlink(ds);
    acc = make_acc(NULL);
    assert_true(ca_is_main_process(acc));
    assert_int_equal(ca_num_processes(acc), 1);
    assert_string_equal(ca_device_name(ca_accelerator_device(acc)), "cpu");
    assert_string_equal(ca_config_origin(ca_accelerator_config(acc), "use_cpu"), "--cpu");
    int64_t b, e;
    ca_split_between_processes(acc, 10, &b, &e);
    assert_true(b == 0 && e == 10);
    T_OK(ca_wait_for_everyone(acc));
    ca_accelerator_destroy(acc);
}

/* LocalSGD on one process does nothing (Accelerate: enabled only when distributed); its arguments are
 * checked; sharded data parallelism and deterministic mode refuse it naming the key. */
static void test_local_sgd_one_process_and_refusals(void **state) {
    ca_accelerator *acc = make_acc(NULL);
    ca_module *m = small_mlp(4, 8, 2);
    T_OK(ca_prepare(acc, m, NULL, NULL));
    ca_local_sgd *ls = NULL;
    assert_int_equal(ca_local_sgd_begin(acc, m, 0, true, &ls), CA_ERR_INVALID);
    assert_null(ls);
    T_OK(ca_local_sgd_begin(acc, m, 2, true, &ls));
    uint64_t seq = ca_comm_seq(ca_accelerator_comm(acc));
    for (int i = 0; i < 4; i++) T_OK(ca_local_sgd_step(ls));
    T_OK(ca_local_sgd_end(ls));
    assert_int_equal(ca_comm_seq(ca_accelerator_comm(acc)), seq);   /* nothing averaged */
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
    const char *refused[][2] = {{"distributed_type=FSDP", "FSDP"}, {"deterministic=true", "deterministic"}};
    for (int i = 0; i < 2; i++) {
        const char *set[] = {refused[i][0], NULL};
        acc = make_acc(set);
        m = small_mlp(4, 8, 2);
        assert_int_equal(ca_local_sgd_begin(acc, m, 2, true, &ls), CA_ERR_UNSUPPORTED);
        assert_non_null(strstr(ca_last_error(), refused[i][1]));
        assert_null(ls);
        ca_module_destroy(m);
        ca_accelerator_destroy(acc);
    }
}

/* Deterministic mode on one process: a batch of 4 comes as 4 micro-batches (virtual shards), the
 * gradients synchronise only on the last, and the shard gradients x = {1e8, 1, -1e8, 1} of
 * d(w * x)/dw are summed in shard order: ((1e8 + 1) - 1e8) + 1 = 1 in f32, then / 4. A pairwise
 * tree, (1e8 + 1) + (-1e8 + 1), would give 0. */
static void test_det_fixed_order_sum(void **state) {
    const char *settings[] = {"deterministic=true", "deterministic_shards=4", NULL};
    ca_accelerator *acc = make_acc(settings);
    float x[] = {1e8f, 1.0f, -1e8f, 1.0f};
    int64_t y[] = {0, 0, 0, 0};
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 1, .shape = {1}}, ys = {.dtype = CA_I64, .ndim = 0};
    ca_dataset *ds;
    T_OK(ca_dataset_from_memory(&xs, x, &ys, y, 4, &ds));
    ca_dataloader *dl;
    T_OK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = 4}, &dl));
    ca_module *m;
    T_OK(ca_linear_create(1, 1, false, &m));
    T_OK(ca_prepare(acc, m, NULL, dl));
    float one = 1.0f;
    T_OK(ca_tensor_copy_from_host(ca_module_param_at(m, 0), &one, sizeof one));
    ca_batch b;
    int k = 0;
    while (ca_dataloader_next(dl, &b)) {
        assert_int_equal(b.size, 1);
        CA_ACCUMULATE(acc, m) {
            T_OK(ca_backward(acc, ca_mean(ca_module_forward(m, b.x))));
            assert_int_equal(ca_sync_gradients(acc), k == 3);
        }
        k++;
    }
    assert_int_equal(k, 4);
    float g;
    T_OK(ca_tensor_to_host(ca_tensor_grad(ca_module_param_at(m, 0)), &g, sizeof g));
    assert_true(g == 0.25f);

    /* a loader whose batch does not split into the shards stays whole (evaluation works), and
     * training on its batches is refused, naming the key */
    ca_dataloader *odd;
    T_OK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = 2}, &odd));
    T_OK(ca_prepare(acc, NULL, NULL, odd));
    assert_true(ca_dataloader_next(odd, &b));
    assert_int_equal(b.size, 2);
    assert_int_equal(ca_backward(acc, ca_mean(ca_module_forward(m, b.x))), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "batch_size 2 per process is not a multiple of 4 (deterministic_shards"));
    assert_non_null(strstr(ca_last_error(), "ca_backward"));
    ca_dataloader_destroy(odd);
    ca_accelerator_destroy(acc);
    assert_true(ca_dataloader_next(dl, &b));   /* the loader outlives the accelerator: whole batches again */
    assert_int_equal(b.size, 4);
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
    ca_module_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory_flat_over_10000_steps),
        cmocka_unit_test(test_later_steps_allocate_nothing_new),
        cmocka_unit_test(test_accumulation_equals_big_batch),
        cmocka_unit_test(test_clip_grad_norm),
        cmocka_unit_test(test_nested_loaders_end_of_dataloader),
        cmocka_unit_test(test_configuration_reaches_the_accelerator),
        cmocka_unit_test(test_det_fixed_order_sum),
        cmocka_unit_test(test_local_sgd_one_process_and_refusals),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_scope_release_all();
    ca_shutdown();
    return rc;
}
