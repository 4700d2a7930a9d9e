/* Core tests: status and logging, the registry (plugins, wrong-ABI refusal), the caching allocator, tensors and scopes. */
#include "test_util.h"
#include "base/ptr_map_impl.h"
#include "tensor/tensor_impl.h"   /* to read the name autograd records for an op */

#include <unistd.h>

static const char *builddir(void) {
    const char *d = getenv("CACCEL_TEST_BUILDDIR");
    return d ? d : ".";
}

/* ------------------------------------------------------------------ status */

static void test_error_record(void **state) {
    ca_clear_error();
    assert_int_equal(ca_last_status(), CA_OK);
    assert_string_equal(ca_last_error(), "");
    ca_status s = ca_error(CA_ERR_CONFIG, "cfg.yaml:%d: bad value for '%s'", 4, "mixed_precision");
    assert_int_equal(s, CA_ERR_CONFIG);
    ca_error_hint("allowed: no, fp16, bf16");
    assert_string_equal(ca_last_error(), "cfg.yaml:4: bad value for 'mixed_precision'");
    assert_string_equal(ca_last_hint(), "allowed: no, fp16, bf16");
    ca_error_context("loading %s", "cfg.yaml");
    assert_string_equal(ca_last_error(), "loading cfg.yaml: cfg.yaml:4: bad value for 'mixed_precision'");
    assert_string_equal(ca_status_name(CA_ERR_TIMEOUT), "CA_ERR_TIMEOUT");
    ca_log_set_rank(3);
    ca_error(CA_ERR_PEER, "peer left");
    assert_string_equal(ca_last_error(), "peer left (rank 3)");
    /* a message that wraps one already carrying the suffix gets it once */
    char wrapped[256];
    snprintf(wrapped, sizeof wrapped, "%s", ca_last_error());
    ca_error(CA_ERR_PEER, "%s", wrapped);
    assert_string_equal(ca_last_error(), "peer left (rank 3)");
    ca_error(CA_ERR_PEER, "collective failed (rank 2)");
    assert_string_equal(ca_last_error(), "collective failed (rank 2) (rank 3)");
    ca_log_set_rank(-1);
    ca_clear_error();
}

static void test_log_levels(void **state) {
    ca_log_level l;
    assert_int_equal(ca_log_parse_level("info", &l), CA_OK);
    assert_int_equal(l, CA_LOG_INFO);
    assert_int_equal(ca_log_parse_level("CRITICAL", &l), CA_OK);
    assert_int_equal(l, CA_LOG_ERROR);
    assert_int_equal(ca_log_parse_level("loud", &l), CA_ERR_CONFIG);
    assert_non_null(strstr(ca_last_error(), "loud"));
}

static void test_dtypes(void **state) {
    assert_int_equal(ca_dtype_size(CA_BF16), 2);
    assert_int_equal(ca_dtype_size(CA_I64), 8);
    assert_string_equal(ca_dtype_name(CA_U8), "u8");
    assert_true(ca_dtype_is_float(CA_F16));
    assert_false(ca_dtype_is_float(CA_I32));
}

/* Every entry of each enum list in caccel/types.h has a name of its own, and the out-of-range
 * value gets "?". */
typedef const char *(*name_fn)(int);
static void check_names(const char *what, int count, name_fn name) {
    for (int i = 0; i < count; i++) {
        const char *n = name(i);
        if (!n || !*n || !strcmp(n, "?")) fail_msg("%s %d has no name", what, i);
        for (int j = 0; j < i; j++)
            if (!strcmp(n, name(j))) fail_msg("%s %d and %d are both named '%s'", what, j, i, n);
    }
    assert_string_equal(name(count), "?");
    assert_string_equal(name(-1), "?");
}
static const char *dtype_name(int i) { return ca_dtype_name((ca_dtype)i); }
static const char *reduce_name(int i) { return ca_reduce_op_name((ca_reduce_op)i); }
static const char *unary_name(int i) { return ca_unary_op_name((ca_unary_op)i); }
static const char *binary_name(int i) { return ca_binary_op_name((ca_binary_op)i); }

static void test_enum_names(void **state) {
    check_names("dtype", CA_DTYPE_COUNT, dtype_name);
    check_names("reduce op", CA_REDUCE_OP_COUNT, reduce_name);
    check_names("unary op", CA_UNARY_OP_COUNT, unary_name);
    check_names("binary op", CA_BINARY_OP_COUNT, binary_name);
    for (int i = 0; i < CA_DTYPE_COUNT; i++)
        if (ca_dtype_size((ca_dtype)i) == 0) fail_msg("dtype %s has no size", ca_dtype_name((ca_dtype)i));
    assert_int_equal(ca_dtype_size(CA_DTYPE_COUNT), 0);
    assert_false(ca_dtype_is_float(CA_DTYPE_COUNT));
    assert_string_equal(ca_reduce_op_name(CA_OP_AVG), "avg");
    assert_string_equal(ca_binary_op_name(CA_BINARY_MIN), "min");
}

/* The name an op's autograd node carries (what "backward of %s" errors say) is the op's name
 * from caccel/types.h: ca_mul_scalar's was "mul_scalar" in the graph but "scale" in errors. */
static void test_op_node_names(void **state) {
    CA_SCOPE {
        float v[2] = {1, 2};
        ca_tensor *x = ca_from_host(ca_cpu_device(), CA_F32, CA_SHAPE(2), v);
        ca_tensor_set_requires_grad(x, true);
        struct { ca_tensor *y; const char *want; } c[] = {
            {ca_mul_scalar(x, 3), ca_unary_op_name(CA_UNARY_SCALE)},
            {ca_add_scalar(x, 3), ca_unary_op_name(CA_UNARY_ADD_SCALAR)},
            {ca_gelu(x), ca_unary_op_name(CA_UNARY_GELU_TANH)},
            {ca_silu(x), ca_unary_op_name(CA_UNARY_SILU)},
            {ca_add(x, x), ca_binary_op_name(CA_BINARY_ADD)},
            {ca_div(x, x), ca_binary_op_name(CA_BINARY_DIV)},
        };
        for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
            assert_non_null(c[i].y);
            assert_non_null(c[i].y->grad_fn);
            assert_string_equal(c[i].y->grad_fn->vt->name, c[i].want);
        }
        assert_string_equal(ca_unary_op_name(CA_UNARY_SCALE), "mul_scalar");
        /* and an error names the op the user called */
        int32_t iv[2] = {1, 2};
        ca_tensor *xi = ca_from_host(ca_cpu_device(), CA_I32, CA_SHAPE(2), iv);
        assert_null(ca_mul_scalar(xi, 2));
        assert_non_null(strstr(ca_last_error(), "mul_scalar"));
        ca_clear_error();
    }
}

/* ------------------------------------------------------------------ registry */

static void test_registry_builtins(void **state) {
    T_OK(ca_registry_load_plugins());
    bool cpu = false, single = false;
    for (int i = 0; i < ca_registry_count(); i++) {
        ca_backend_info bi;
        T_OK(ca_registry_get(i, &bi));
        if (!strcmp(bi.name, "cpu") && bi.kind == CA_BACKEND_DEVICE) {
            cpu = true;
            assert_true(bi.usable);
            assert_int_equal(bi.device_count, 1);
        }
        if (!strcmp(bi.name, "single") && bi.kind == CA_BACKEND_COLLECTIVE) single = true;
    }
    assert_true(cpu && single);
    assert_non_null(ca_registry_collective("single"));
    assert_null(ca_registry_collective("carrier-pigeon"));
    assert_int_equal(ca_last_status(), CA_ERR_NOT_FOUND);
    assert_non_null(strstr(ca_last_error(), "carrier-pigeon"));
    assert_non_null(strstr(ca_last_error(), "single"));     /* lists what exists */
}

static void test_registry_refuses_wrong_abi(void **state) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/.libs/caccel_test_badabi.so", builddir());
    if (access(path, R_OK) != 0) fail_msg("test plugin %s missing", path);
    assert_int_equal(ca_registry_load_plugin_file(path), CA_ERR_ABI);
    assert_non_null(strstr(ca_last_error(), "ABI"));
    assert_non_null(strstr(ca_last_error(), path));
    /* listed as refused, and never callable */
    bool listed = false;
    for (int i = 0; i < ca_registry_count(); i++) {
        ca_backend_info bi;
        T_OK(ca_registry_get(i, &bi));
        if (!strcmp(bi.origin, path)) {
            listed = true;
            assert_false(bi.usable);
            assert_non_null(strstr(bi.reason, "refused"));
        }
    }
    assert_true(listed);
    assert_null(ca_registry_device("testdev"));
}

static void test_registry_loads_plugin_with_reason(void **state) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/.libs/caccel_test_goodabi.so", builddir());
    T_OK(ca_registry_load_plugin_file(path));
    ca_device *d = NULL;
    assert_int_equal(ca_device_open("testdev", 0, NULL, &d), CA_ERR_UNSUPPORTED);
    assert_non_null(strstr(ca_last_error(), "no test hardware attached"));
}

/* A backend whose kernel table ends where ABI 1.0's did (the CPU's tables cut before
 * `attention`, the first slot 1.1 appended) loads, runs the kernels it has, and names
 * the kernel it lacks and the device. */
static void test_registry_older_minor_lacks_new_kernels(void **state) {
    static ca_kernels k10;
    static ca_device_ops ops;
    static const ca_device_ops *devs[1];
    static ca_plugin p;
    ops = *ca_device_ops_of(ca_cpu_device());
    memcpy(&k10, ops.kernels, offsetof(ca_kernels, attention));
    k10.struct_size = offsetof(ca_kernels, attention);
    k10.abi_version = (uint32_t)CA_ABI_MAJOR << 16;
    ops.name = "cpu_abi10";
    ops.abi_version = k10.abi_version;
    ops.kernels = &k10;
    devs[0] = &ops;
    p = (ca_plugin){.struct_size = sizeof p, .abi_version = k10.abi_version, .name = "cpu_abi10",
                    .version = "test", .num_devices = 1, .devices = devs};
    T_OK(ca_register_plugin(&p, "test_core"));
    ca_device *d = NULL;
    T_OK(ca_device_open("cpu_abi10", 0, NULL, &d));
    CA_SCOPE {
        ca_tensor *q = T_NN(ca_full(d, CA_F32, CA_SHAPE(1, 1, 2, 2), 0.5));
        assert_non_null(ca_add(q, q));
        assert_null(ca_scaled_dot_product_attention(q, q, q, NULL, false, 0, 0));
        assert_non_null(strstr(ca_last_error(), "device backend 'cpu_abi10' has no kernel 'attention'"));
        assert_non_null(strstr(ca_last_error(), "op attention cannot run on device cpu_abi10:0"));
        assert_int_equal(ca_last_status(), CA_ERR_UNSUPPORTED);
    }
}

/* A 3.1 backend (the CPU's table cut before `rope`, the first slot 3.3 appended) loads and runs
 * rms_norm; rope and swiglu fail naming the kernel the table lacks. */
static void test_registry_abi31_lacks_rope_swiglu(void **state) {
    static ca_kernels k31;
    static ca_device_ops ops;
    static const ca_device_ops *devs[1];
    static ca_plugin p;
    ops = *ca_device_ops_of(ca_cpu_device());
    memcpy(&k31, ops.kernels, offsetof(ca_kernels, rope));
    k31.struct_size = offsetof(ca_kernels, rope);
    k31.abi_version = (uint32_t)CA_ABI_MAJOR << 16 | 1;
    ops.name = "cpu_abi31";
    ops.abi_version = k31.abi_version;
    ops.kernels = &k31;
    devs[0] = &ops;
    p = (ca_plugin){.struct_size = sizeof p, .abi_version = k31.abi_version, .name = "cpu_abi31",
                    .version = "test", .num_devices = 1, .devices = devs};
    T_OK(ca_register_plugin(&p, "test_core"));
    ca_device *d = NULL;
    T_OK(ca_device_open("cpu_abi31", 0, NULL, &d));
    CA_SCOPE {
        ca_tensor *x = T_NN(ca_full(d, CA_F32, CA_SHAPE(1, 1, 2, 4), 0.5));
        ca_tensor *c = T_NN(ca_full(d, CA_F32, CA_SHAPE(2, 2), 1.0));
        assert_non_null(ca_rms_norm(x, NULL, 1e-6));
        assert_null(ca_rope(x, c, c));
        assert_non_null(strstr(ca_last_error(), "device backend 'cpu_abi31' has no kernel 'rope'"));
        assert_null(ca_swiglu(x, x));
        assert_non_null(strstr(ca_last_error(), "device backend 'cpu_abi31' has no kernel 'swiglu'"));
        assert_int_equal(ca_last_status(), CA_ERR_UNSUPPORTED);
    }
}

/* A 3.4 kernel table knows no kv_heads (ABI 3.5): grouped-query attention on it gets k and v repeated to
 * every query head by the op, so the table's kernels see as many kv heads as query heads, and the results
 * are the CPU's (forward: the same bits; dK: the repeat path sums the heads in another order). */
static ca_kernels k34;
static ca_status att34(void *dev, const ca_attention_args *a) {
    if (a->kv_heads != 0 && a->kv_heads != a->p.heads) return ca_error(CA_ERR_INTERNAL, "kv_heads reached a 3.4 table");
    return ca_device_ops_of(ca_cpu_device())->kernels->attention(dev, a);
}
static ca_status att34_backward(void *dev, const ca_attention_backward_args *a) {
    if (a->kv_heads != 0 && a->kv_heads != a->p.heads) return ca_error(CA_ERR_INTERNAL, "kv_heads reached a 3.4 table");
    return ca_device_ops_of(ca_cpu_device())->kernels->attention_backward(dev, a);
}

/* out (and k's gradient in *dk) of 4 query heads over 2 kv heads on device d. */
static float *gqa_on(ca_device *d, const float *hq, const float *hk, float **dk) {
    ca_tensor *q = T_NN(ca_from_host(d, CA_F32, CA_SHAPE(1, 4, 3, 2), hq));
    ca_tensor *k = T_NN(ca_from_host(d, CA_F32, CA_SHAPE(1, 2, 3, 2), hk));
    ca_tensor_set_requires_grad(k, true);
    ca_tensor *o = T_NN(ca_scaled_dot_product_attention(q, k, k, NULL, true, 0, 0));
    T_OK(ca_autograd_backward(ca_sum(ca_mul(o, o))));
    *dk = t_host(T_NN(ca_tensor_grad(k)));
    return t_host(o);
}

/* Registers ops (the CPU's, changed by the caller; they must outlive the registry) as a plugin of one
 * device under ops->name, and opens it. */
static ca_device *open_variant(const ca_device_ops *ops) {
    static const ca_device_ops *devs[4][1];
    static ca_plugin p[4];
    static int n;
    assert_true(n < 4);
    devs[n][0] = ops;
    p[n] = (ca_plugin){.struct_size = sizeof p[n], .abi_version = ops->abi_version, .name = ops->name,
                       .version = "test", .num_devices = 1, .devices = devs[n]};
    T_OK(ca_register_plugin(&p[n++], "test_core"));
    ca_device *d = NULL;
    T_OK(ca_device_open(ops->name, 0, NULL, &d));
    return d;
}

static void test_registry_abi34_attention_repeats_kv(void **state) {
    static ca_device_ops ops;
    ops = *ca_device_ops_of(ca_cpu_device());
    k34 = *ops.kernels;
    k34.abi_version = (uint32_t)CA_ABI_MAJOR << 16 | 4;
    k34.attention = att34;
    k34.attention_backward = att34_backward;
    ops.name = "cpu_abi34";
    ops.abi_version = k34.abi_version;
    ops.kernels = &k34;
    ca_device *d = open_variant(&ops);
    float hq[24], hk[12];
    for (int i = 0; i < 24; i++) hq[i] = (float)((i * 7) % 11) / 5.0f - 1.0f;
    for (int i = 0; i < 12; i++) hk[i] = (float)((i * 5) % 9) / 4.0f - 1.0f;
    CA_SCOPE {
        float *dk_old, *dk_cpu;
        float *old = gqa_on(d, hq, hk, &dk_old), *cpu = gqa_on(ca_cpu_device(), hq, hk, &dk_cpu);
        assert_memory_equal(old, cpu, sizeof(float) * 24);
        for (int i = 0; i < 12; i++) assert_float_equal(dk_old[i], dk_cpu[i], 1e-5);
        free(old); free(cpu); free(dk_old); free(dk_cpu);
    }
}

/* A device whose kernels read no strides (attention_strides false, as CUDA's, or a table older than ABI
 * 3.10) gets q, k, v, out and every gradient contiguous with zero strides, and the results of the CPU's own
 * strided path: the GPT's views of one projection, forward and backward. */
static ca_kernels k_nost;
static bool nost_zero(const ca_attention_layout *l) {
    static const ca_attention_layout zero;
    return memcmp(l, &zero, sizeof zero) == 0;
}
static ca_status att_nost(void *dev, const ca_attention_args *a) {
    if (!nost_zero(&a->st)) return ca_error(CA_ERR_INTERNAL, "strides reached a device that reads none");
    return ca_device_ops_of(ca_cpu_device())->kernels->attention(dev, a);
}
static ca_status att_nost_backward(void *dev, const ca_attention_backward_args *a) {
    if (!nost_zero(&a->st) || !nost_zero(&a->dst))
        return ca_error(CA_ERR_INTERNAL, "strides reached a device that reads none");
    return ca_device_ops_of(ca_cpu_device())->kernels->attention_backward(dev, a);
}

/* out and dx of sum(attention(q, k, v) w) with q, k, v transposed slices of one [1, 6, 3 x 2 x 4] x. */
static void views_on(ca_device *d, const float *hx, const float *hw, float **res) {
    ca_tensor *x = T_NN(ca_from_host(d, CA_F32, CA_SHAPE(1, 6, 24), hx)), *p[3];
    ca_tensor_set_requires_grad(x, true);
    T_OK(ca_split(T_NN(ca_mul_scalar(x, 1.5)), 2, 3, (int64_t[]){8, 8, 8}, p));
    for (int i = 0; i < 3; i++) p[i] = T_NN(ca_transpose(ca_reshape(p[i], CA_SHAPE(1, 6, 2, 4)), 1, 2));
    ca_tensor *o = T_NN(ca_scaled_dot_product_attention(p[0], p[1], p[2], NULL, true, 0, 0));
    ca_tensor *w = T_NN(ca_from_host(d, CA_F32, CA_SHAPE(1, 2, 6, 4), hw));
    T_OK(ca_autograd_backward(ca_sum(ca_mul(o, w))));
    res[0] = t_host(o);
    res[1] = t_host(T_NN(ca_tensor_grad(x)));
}

static void test_attention_device_without_strides(void **state) {
    static ca_device_ops ops;
    ops = *ca_device_ops_of(ca_cpu_device());
    k_nost = *ops.kernels;
    k_nost.attention = att_nost;
    k_nost.attention_backward = att_nost_backward;
    ops.name = "cpu_nostrides";
    ops.kernels = &k_nost;
    ops.attention_strides = false;
    ca_device *d = open_variant(&ops);
    float hx[144], hw[48];
    for (int i = 0; i < 144; i++) hx[i] = (float)((i * 7) % 13) / 6.0f - 1.0f;
    for (int i = 0; i < 48; i++) hw[i] = (float)((i * 5) % 9) / 4.0f - 1.0f;
    CA_SCOPE {
        float *a[2], *b[2];
        views_on(d, hx, hw, a);
        views_on(ca_cpu_device(), hx, hw, b);
        assert_memory_equal(a[0], b[0], sizeof(float) * 48);
        assert_memory_equal(a[1], b[1], sizeof(float) * 144);
        for (int i = 0; i < 2; i++) { free(a[i]); free(b[i]); }
    }
}

/* A device says what it is through its table, and the core drives it through its slots, never by
 * its name: a lazy device called anything is lazy, its mark_step and determinism slots are called,
 * the accelerator's query picks the highest score of a kind, and a table of an older minor (no
 * `kind`) reads as host or GPU from host_memory. */
static int slot_steps, slot_det;
static ca_status count_step(void *dev) { (void)dev; slot_steps++; return CA_OK; }
static void count_det(void *dev, bool on) { (void)dev; slot_det += on ? 1 : -1; }
static int prefer(char *reason, size_t len) { (void)reason; (void)len; return 5; }

static void test_device_kind_slots(void **state) {
    static ca_device_ops lazy, old;
    static const ca_device_ops *devs[2];
    static ca_plugin p;
    ca_device *cpu = ca_cpu_device(), *xla = NULL;
    assert_int_equal(ca_device_kind_of(cpu), CA_DEVICE_HOST);
    assert_false(ca_device_is_lazy(cpu));
    T_OK(ca_device_open("xla", 0, NULL, &xla));
    assert_int_equal(ca_device_kind_of(xla), CA_DEVICE_LAZY);
    assert_true(ca_device_is_lazy(xla));
    ca_backend_info bi;
    T_OK(ca_registry_best_device(CA_DEVICE_LAZY, &bi));
    assert_string_equal(bi.name, "xla");
    assert_int_equal(ca_registry_best_device(CA_DEVICE_GPU + 10, &bi), CA_ERR_NOT_FOUND);
    assert_null(bi.name);

    lazy = *ca_device_ops_of(cpu);
    lazy.name = "lazy_test";
    lazy.kind = CA_DEVICE_LAZY;
    lazy.mark_step = count_step;
    lazy.set_deterministic = count_det;
    old = *ca_device_ops_of(cpu);
    old.name = "old_gpu_test";
    old.host_memory = false;
    old.struct_size = offsetof(ca_device_ops, kind);
    devs[0] = &lazy;
    devs[1] = &old;
    p = (ca_plugin){.struct_size = sizeof p, .abi_version = CA_ABI_VERSION, .name = "kinds", .version = "test",
                    .num_devices = 2, .devices = devs, .score = prefer};
    T_OK(ca_register_plugin(&p, "test_core"));
    T_OK(ca_registry_best_device(CA_DEVICE_LAZY, &bi));
    assert_string_equal(bi.name, "lazy_test");    /* score 5 beats the built-in's 1 */
    T_OK(ca_registry_best_device(CA_DEVICE_GPU, &bi));
    assert_string_equal(bi.name, "old_gpu_test");

    ca_device *d = NULL, *g = NULL;
    T_OK(ca_device_open("lazy_test", 0, NULL, &d));
    assert_true(ca_device_is_lazy(d));
    T_OK(ca_device_mark_step(d));
    T_OK(ca_device_mark_step(cpu));                 /* no slot: nothing to do */
    assert_int_equal(slot_steps, 1);
    ca_device_set_deterministic(d, true);
    assert_int_equal(slot_det, 1);
    ca_device_set_deterministic(d, false);
    assert_int_equal(slot_det, 0);
    /* the xla extras resolve through get_proc: a lazy device without them is no xla device */
    ca_xla_metrics m;
    assert_int_equal(ca_xla_metrics_get(d, &m), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "lazy_test:0 is not an xla device"));
    assert_false(ca_xla_bf16_storage(d));
    T_OK(ca_xla_metrics_get(xla, &m));
    T_OK(ca_device_open("old_gpu_test", 0, NULL, &g));
    assert_int_equal(ca_device_kind_of(g), CA_DEVICE_GPU);
    assert_false(ca_device_is_lazy(g));
}

/* A collective says what it needs through its table, never by its name: a communicator over a GPU
 * stages through host memory for a collective whose device_names names a host device of any name,
 * and refuses one that names no device it has; needs_mpi_launcher comes from the table (false in a
 * table of an older minor) or, for a plugin not loaded, from the registry's row for it. */
static void test_collective_slots(void **state) {
    static ca_device_ops host, gpu;
    static ca_collective_ops staged, nowhere, launched, old;
    static const ca_device_ops *devs[2];
    static const ca_collective_ops *colls[4];
    static ca_plugin p;
    host = *ca_device_ops_of(ca_cpu_device());
    host.name = "host_named_test";
    gpu = host;
    gpu.name = "gpu_named_test";
    gpu.host_memory = false;
    gpu.kind = CA_DEVICE_GPU;
    const ca_collective_ops *single = ca_registry_collective("single");
    assert_non_null(single);
    staged = nowhere = launched = old = *single;
    staged.name = "staged_test";
    staged.device_names = "host_named_test";
    nowhere.name = "nowhere_test";
    nowhere.device_names = "no_device_test";
    launched.name = "launched_test";
    launched.needs_mpi_launcher = true;
    old.name = "old_coll_test";
    old.needs_mpi_launcher = true;               /* beyond its struct_size: not read */
    old.struct_size = offsetof(ca_collective_ops, needs_mpi_launcher);
    devs[0] = &host;
    devs[1] = &gpu;
    colls[0] = &staged;
    colls[1] = &nowhere;
    colls[2] = &launched;
    colls[3] = &old;
    p = (ca_plugin){.struct_size = sizeof p, .abi_version = CA_ABI_VERSION, .name = "coll_slots", .version = "test",
                    .num_devices = 2, .devices = devs, .num_collectives = 4, .collectives = colls};
    T_OK(ca_register_plugin(&p, "test_core"));

    ca_device *g = NULL;
    T_OK(ca_device_open("gpu_named_test", 0, NULL, &g));
    ca_comm *c = NULL;
    ca_comm_options o = {.backend = "staged_test", .rank = 0, .world_size = 1, .device = g};
    T_OK(ca_comm_create(&o, &c));
    assert_string_equal(ca_comm_backend(c), "staged_test");
    ca_comm_destroy(c);
    o.backend = "nowhere_test";
    assert_int_equal(ca_comm_create(&o, &c), CA_ERR_UNSUPPORTED);
    assert_non_null(strstr(ca_last_error(), "collective backend 'nowhere_test' cannot reduce on device 'gpu_named_test'"));

    assert_true(ca_registry_collective_needs_mpi_launcher("launched_test"));
    assert_false(ca_registry_collective_needs_mpi_launcher("old_coll_test"));
    assert_false(ca_registry_collective_needs_mpi_launcher("staged_test"));
    assert_true(ca_registry_collective_needs_mpi_launcher("mpi"));   /* loaded or not */
    assert_false(ca_registry_collective_needs_mpi_launcher("gloo"));
    assert_false(ca_registry_collective_needs_mpi_launcher("no_such_collective"));
    ca_clear_error();
    assert_false(ca_registry_collective_needs_mpi_launcher(NULL));
}

/* ------------------------------------------------------------------ allocator */

static void test_caching_allocator_reuses(void **state) {
    ca_device *cpu = ca_cpu_device();
    T_OK(ca_device_empty_cache(cpu));
    ca_allocator_stats a, b;
    T_OK(ca_device_memory_stats(cpu, &a));
    void *p[8];
    for (int i = 0; i < 8; i++) T_OK(ca_device_alloc(cpu, 1000 + (size_t)i, &p[i]));
    for (int i = 0; i < 8; i++) assert_int_equal((uintptr_t)p[i] % 64, 0);
    for (int i = 0; i < 8; i++) ca_device_free(cpu, p[i]);
    T_OK(ca_device_memory_stats(cpu, &b));
    uint64_t raw = b.num_device_allocs;
    assert_int_equal(b.allocated, a.allocated);
    assert_true(b.reserved > a.reserved);
    for (int round = 0; round < 100; round++) {       /* the same sizes again: all from the cache */
        for (int i = 0; i < 8; i++) T_OK(ca_device_alloc(cpu, 1000 + (size_t)i, &p[i]));
        for (int i = 0; i < 8; i++) ca_device_free(cpu, p[i]);
    }
    T_OK(ca_device_memory_stats(cpu, &b));
    assert_int_equal(b.num_device_allocs, raw);
    assert_true(b.num_cache_hits >= 800);
    assert_true(b.peak_allocated >= 8 * 1000);
    T_OK(ca_device_empty_cache(cpu));
    T_OK(ca_device_memory_stats(cpu, &b));
    assert_int_equal(b.reserved, b.allocated);
}

/* Out of memory names the device, the size asked for and what the allocator holds. */
static void test_allocator_out_of_memory(void **state) {
#ifdef __SANITIZE_ADDRESS__
    skip();   /* AddressSanitizer aborts on a failed allocation (allocator_may_return_null=0) */
#endif
    void *p = NULL;
    assert_int_equal(ca_device_alloc(ca_cpu_device(), (size_t)1 << 60, &p), CA_ERR_NOMEM);
    assert_null(p);
    assert_non_null(strstr(ca_last_error(), "cpu: out of memory allocating 1152921504606846976 bytes ("));
    assert_non_null(strstr(ca_last_error(), "reserved,"));
    assert_non_null(strstr(ca_last_error(), "in use by tensors)"));
}

/* Sizes that change every step (text padded to its longest sequence) must not grow the cache to the sum of
 * every size seen: reserved stays within the cache limit (max(64 MiB, peak / 2)) of the peak in use. */
static void test_caching_allocator_bounded_for_varying_sizes(void **state) {
    ca_device *cpu = ca_cpu_device();
    T_OK(ca_device_empty_cache(cpu));
    T_OK(ca_device_reset_peak_stats(cpu));
    ca_allocator_stats a, b;
    T_OK(ca_device_memory_stats(cpu, &a));
    size_t sum = 0;
    for (int r = 0; r < 24; r++) {      /* growing classes: no older block can serve a newer request */
        size_t n = ((size_t)1 << 20 << (r / 4)) / 4 * (size_t)(4 + r % 4);
        void *p = NULL;
        T_OK(ca_device_alloc(cpu, n, &p));
        ca_device_free(cpu, p);
        sum += n;
    }
    T_OK(ca_device_memory_stats(cpu, &b));
    size_t peak = b.peak_allocated - a.allocated, limit = peak / 2 > (64u << 20) ? peak / 2 : (64u << 20);
    assert_true(sum > peak + limit);                   /* without a bound the cache would hold them all */
    assert_true(b.peak_reserved - a.reserved <= peak + limit);
    /* a smaller request takes a free block of up to twice its size instead of asking the device */
    void *big = NULL, *small = NULL;
    T_OK(ca_device_alloc(cpu, 3000000, &big));
    ca_device_free(cpu, big);
    T_OK(ca_device_memory_stats(cpu, &a));
    T_OK(ca_device_alloc(cpu, 2000000, &small));
    T_OK(ca_device_memory_stats(cpu, &b));
    assert_ptr_equal(small, big);
    assert_int_equal(b.num_device_allocs, a.num_device_allocs);
    ca_device_free(cpu, small);
    T_OK(ca_device_empty_cache(cpu));
}

/* ------------------------------------------------------------------ tensors */

static void test_scopes_release(void **state) {
    int64_t live0 = ca_scope_live_tensors();
    ca_tensor *kept = NULL;
    CA_SCOPE {
        ca_tensor *a = T_NN(ca_zeros(ca_cpu_device(), CA_F32, CA_SHAPE(4, 4)));
        ca_tensor *b = ca_add(a, a);
        CA_SCOPE { ca_mul(b, b); ca_relu(b); }                  /* inner scope: released at its end */
        assert_int_equal(ca_scope_live_tensors(), live0 + 2);
        kept = ca_tensor_keep(ca_add_scalar(b, 1.0));
    }
    assert_int_equal(ca_scope_live_tensors(), live0);
    float *h = t_host(kept);
    assert_float_equal(h[5], 1.0f, 0);
    free(h);
    ca_tensor_free(kept);
    /* ending an outer scope also ends scopes still open inside it */
    ca_scope *outer = ca_scope_begin();
    ca_scope_begin();
    ca_zeros(ca_cpu_device(), CA_F32, CA_SHAPE(2));
    ca_scope_end(outer);
    assert_int_equal(ca_scope_live_tensors(), live0);
}

static void test_views_share_storage(void **state) {
    CA_SCOPE {
        float v[6] = {0, 1, 2, 3, 4, 5};
        ca_tensor *a = ca_from_host(ca_cpu_device(), CA_F32, CA_SHAPE(2, 3), v);
        ca_tensor *t = ca_transpose(a, 0, 1);
        assert_false(ca_tensor_is_contiguous(t));
        assert_ptr_equal(ca_tensor_data(t), ca_tensor_data(a));
        float h[6];
        T_OK(ca_tensor_to_host(t, h, sizeof h));
        float want[6] = {0, 3, 1, 4, 2, 5};
        for (int i = 0; i < 6; i++) assert_float_equal(h[i], want[i], 0);
        ca_tensor *n = ca_narrow(a, 1, 1, 2);
        T_OK(ca_tensor_to_host(n, h, 4 * sizeof(float)));
        assert_float_equal(h[0], 1, 0);
        assert_float_equal(h[2], 4, 0);
        ca_tensor *r = ca_reshape(a, CA_SHAPE(3, -1));
        assert_int_equal(ca_tensor_dim(r, 1), 2);
        assert_ptr_equal(ca_tensor_data(r), ca_tensor_data(a));
        /* a strided slice: splitting or adding dims is a view, merging its rows is a copy */
        ca_tensor *q = ca_narrow(a, 1, 1, 2);
        ca_tensor *rv = ca_reshape(q, CA_SHAPE(2, 1, 2)), *rc = ca_reshape(q, CA_SHAPE(4));
        assert_ptr_equal(ca_tensor_data(rv), ca_tensor_data(q));
        assert_ptr_not_equal(ca_tensor_data(rc), ca_tensor_data(q));
        float want_q[4] = {1, 2, 4, 5};
        T_OK(ca_tensor_to_host(rv, h, 4 * sizeof(float)));
        for (int i = 0; i < 4; i++) assert_float_equal(h[i], want_q[i], 0);
        T_OK(ca_tensor_to_host(rc, h, 4 * sizeof(float)));
        for (int i = 0; i < 4; i++) assert_float_equal(h[i], want_q[i], 0);
        assert_null(ca_reshape(a, CA_SHAPE(4, 2)));
        assert_non_null(strstr(ca_last_error(), "[2, 3]"));
        double item;
        assert_int_equal(ca_tensor_item(a, &item), CA_ERR_INVALID);
        T_OK(ca_tensor_item(ca_sum(a), &item));
        assert_float_equal(item, 15.0, 1e-6);
    }
}

/* A persistent view keeps its storage alive after the base's scope ends. */
static void test_storage_refcount(void **state) {
    ca_tensor *v = NULL;
    CA_SCOPE {
        ca_tensor *a = ca_full(ca_cpu_device(), CA_F32, CA_SHAPE(8), 3.0);
        v = ca_tensor_keep(ca_narrow(a, 0, 2, 3));
    }
    float h[3];
    T_OK(ca_tensor_to_host(v, h, sizeof h));
    assert_float_equal(h[2], 3.0f, 0);
    ca_tensor_free(v);
}

static void test_random_is_seeded(void **state) {
    CA_SCOPE {
        ca_manual_seed(42);
        float *a = t_host(ca_rand_uniform(ca_cpu_device(), CA_F32, CA_SHAPE(64), -1, 1));
        float *n = t_host(ca_rand_normal(ca_cpu_device(), CA_F32, CA_SHAPE(4096), 0, 1));
        ca_manual_seed(42);
        float *b = t_host(ca_rand_uniform(ca_cpu_device(), CA_F32, CA_SHAPE(64), -1, 1));
        assert_memory_equal(a, b, 64 * sizeof(float));
        double mean = 0, var = 0;
        for (int i = 0; i < 4096; i++) mean += n[i] / 4096.0;
        for (int i = 0; i < 4096; i++) var += (n[i] - mean) * (n[i] - mean) / 4096.0;
        assert_true(fabs(mean) < 0.06 && fabs(var - 1.0) < 0.08);
        for (int i = 0; i < 64; i++) assert_true(a[i] >= -1 && a[i] < 1);
        free(a); free(b); free(n);
    }
}

/* The allocators' pointer map against a plain array: inserts past several growths, removals
 * (backward shift) in an order that breaks probe chains, lookups of present and absent keys. */
static void test_ptr_map(void **state) {
    enum { N = 5000 };
    static char keys[N];
    ca_ptr_map m = {0};
    for (int i = 0; i < N; i++) assert_true(ca_ptr_map_put(&m, &keys[i], &keys[(i + 1) % N]));
    assert_int_equal(m.nused, N);
    for (int i = 0; i < N; i += 3) assert_ptr_equal(ca_ptr_map_take(&m, &keys[i]), &keys[(i + 1) % N]);
    for (int i = 0; i < N; i++)
        assert_ptr_equal(ca_ptr_map_get(&m, &keys[i]), i % 3 ? &keys[(i + 1) % N] : NULL);
    assert_null(ca_ptr_map_take(&m, &keys[0]));
    assert_null(ca_ptr_map_get(&m, &m));
    for (int i = 0; i < N; i += 3) assert_true(ca_ptr_map_put(&m, &keys[i], &keys[i]));
    for (int i = 0; i < N; i++) assert_non_null(ca_ptr_map_get(&m, &keys[i]));
    assert_int_equal(m.nused, N);
    ca_ptr_map_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_record),
        cmocka_unit_test(test_ptr_map),
        cmocka_unit_test(test_log_levels),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_enum_names),
        cmocka_unit_test(test_op_node_names),
        cmocka_unit_test(test_registry_builtins),
        cmocka_unit_test(test_registry_refuses_wrong_abi),
        cmocka_unit_test(test_registry_loads_plugin_with_reason),
        cmocka_unit_test(test_registry_older_minor_lacks_new_kernels),
        cmocka_unit_test(test_registry_abi31_lacks_rope_swiglu),
        cmocka_unit_test(test_registry_abi34_attention_repeats_kv),
        cmocka_unit_test(test_attention_device_without_strides),
        cmocka_unit_test(test_device_kind_slots),
        cmocka_unit_test(test_collective_slots),
        cmocka_unit_test(test_caching_allocator_reuses),
        cmocka_unit_test(test_caching_allocator_bounded_for_varying_sizes),
        cmocka_unit_test(test_allocator_out_of_memory),
        cmocka_unit_test(test_scopes_release),
        cmocka_unit_test(test_views_share_storage),
        cmocka_unit_test(test_storage_refcount),
        cmocka_unit_test(test_random_is_seeded),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_scope_release_all();
    ca_shutdown();
    return rc;
}
