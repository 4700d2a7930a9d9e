/* The CUDA plugin on any machine: it loads (also without a driver, and without mapping cuBLAS until a GPU opens, or NCCL until a communicator needs it), lists its backends, reports its GPU count with the driver's reason, and the accelerator falls back to the CPU or, for MULTI_GPU, fails with that reason. */
#include "test_cuda_util.h"

#include <dlfcn.h>

static char reason[512];
static int ngpu;

static void test_registered(void **state) {
    bool dev = false, coll = false;
    for (int i = 0; i < ca_registry_count(); i++) {
        ca_backend_info bi;
        T_OK(ca_registry_get(i, &bi));
        if (strcmp(bi.name, "cuda") == 0 && bi.kind == CA_BACKEND_DEVICE) {
            dev = true;
            assert_non_null(strstr(bi.origin, "caccel_cuda.so"));
            assert_non_null(strstr(bi.version, "CUDA "));
            assert_non_null(strstr(bi.version, "NCCL "));
            assert_int_equal(bi.device_count, ngpu);
            assert_int_equal(bi.usable, ngpu > 0);
            if (ngpu == 0) assert_string_equal(bi.reason, reason);
            printf("cuda: %d device(s), version %s%s%s\n", bi.device_count, bi.version, ngpu ? "" : ", reason: ",
                   ngpu ? "" : bi.reason);
        }
        if (strcmp(bi.name, "nccl") == 0 && bi.kind == CA_BACKEND_COLLECTIVE) coll = true;
    }
    assert_true(dev);
    assert_true(coll);
}

static void test_open(void **state) {
    ca_device *d = NULL;
    ca_status s = ca_device_open("cuda", 0, NULL, &d);
    if (ngpu == 0) {
        assert_int_not_equal(s, CA_OK);
        assert_non_null(strstr(ca_last_error(), reason));
        return;
    }
    T_OK(s);
    assert_non_null(strstr(ca_device_description(d), ", sm_"));
    assert_false(ca_device_is_host(d));
    /* gpu_ids picks the GPU of a local rank; one that is not there is a configuration error */
    const ca_device_ops *ops = ca_registry_device("cuda");
    void *ctx = NULL;
    ca_device_open_args a = {.struct_size = sizeof a, .local_rank = 0, .gpu_ids = "0"};
    T_OK(ops->open(0, &a, &ctx));
    ops->close(ctx);
    char ids[32];
    snprintf(ids, sizeof ids, "%d", ngpu);
    a.gpu_ids = ids;
    assert_int_equal(ops->open(0, &a, &ctx), CA_ERR_CONFIG);
    assert_non_null(strstr(ca_last_error(), "gpu_ids"));
    a.gpu_ids = "zero";
    assert_int_equal(ops->open(0, &a, &ctx), CA_ERR_CONFIG);
}

static void test_accelerator_device(void **state) {
    const char *settings[] = {"use_cpu=false", NULL};
    ca_accelerator *acc = NULL;
    T_OK(ca_accelerator_create(&(ca_options){.settings = settings}, &acc));
    assert_string_equal(ca_device_name(ca_accelerator_device(acc)), ngpu ? "cuda" : "cpu");
    ca_accelerator_destroy(acc);
}

static void test_multi_gpu(void **state) {
    const char *settings[] = {"distributed_type=MULTI_GPU", NULL};
    ca_accelerator *acc = NULL;
    ca_status s = ca_accelerator_create(&(ca_options){.settings = settings}, &acc);
    if (ngpu == 0) {
        assert_int_equal(s, CA_ERR_UNSUPPORTED);
        assert_non_null(strstr(ca_last_error(), "MULTI_GPU"));
        assert_non_null(strstr(ca_last_error(), reason));
        printf("MULTI_GPU without a GPU: %s\n", ca_last_error());
        return;
    }
    T_OK(s);
    assert_string_equal(ca_device_name(ca_accelerator_device(acc)), "cuda");
    ca_accelerator_destroy(acc);
}

static void test_nccl_needs_cuda(void **state) {
    ca_comm *c = NULL;
    ca_comm_options co = {.backend = "nccl", .rank = 0, .world_size = 1, .device = ca_cpu_device()};
    assert_int_not_equal(ca_comm_create(&co, &c), CA_OK);
    assert_non_null(strstr(ca_last_error(), "nccl"));
}

/* Whether a library whose path contains `name` is mapped into this process. */
static bool mapped(const char *name) {
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, name) != NULL;
    fclose(f);
    return found;
}

/* NCCL is opened on first use, not with the plugin: without it (main names a library that is not
 * there in CACCEL_NCCL_LIBRARY) the cuda device is listed as before and the nccl backend says why. */
static void test_nccl_missing(void **state) {
    /* the registry refuses the plugin's backends on a machine without a GPU: its table, directly */
    char path[4096];
    tc_plugin_path(path, sizeof path);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    ca_plugin_init_fn init = (ca_plugin_init_fn)dlsym(h, CA_PLUGIN_INIT_SYMBOL);
    assert_non_null(init);
    const ca_plugin *pl = init();
    assert_int_equal(pl->num_collectives, 1);
    const ca_collective_ops *ops = pl->collectives[0];
    assert_string_equal(ops->name, "nccl");
    static const ca_device_ops unusable = {.struct_size = sizeof(ca_device_ops), .name = "cuda"};
    const ca_device_ops *dops = ca_registry_device("cuda");
    if (!dops) {   /* no GPU: the registry lists cuda as unusable; init checks the library before the device */
        ca_clear_error();
        dops = &unusable;
    }
    int dummy = 0;
    ca_comm_init_args a = {.struct_size = sizeof a, .world_size = 1, .timeout_ms = 1000, .device_ops = dops,
                           .device = &dummy};
    void *comm = NULL;
    assert_int_equal(ops->init(&a, &comm), CA_ERR_UNSUPPORTED);
    assert_null(comm);
    printf("without NCCL: %s\n  hint: %s\n", ca_last_error(), ca_last_hint());
    assert_non_null(strstr(ca_last_error(), "NCCL not found (libcaccel-test-no-nccl.so.2: "));
    assert_non_null(strstr(ca_last_hint(), "CACCEL_NCCL_LIBRARY"));
    assert_false(mapped("libnccl"));
    dlclose(h);
}

/* cuBLAS (with cuBLASLt, 0.1 s and 25,000 page faults to map) comes with the first GPU opened, not
 * with the plugin: a process on a machine without a GPU never maps it. */
static void test_cublas_with_the_gpu(void **state) {
    ca_device *d = NULL;
    ca_status s = ca_device_open("cuda", 0, NULL, &d);
    if (ngpu == 0) {
        assert_int_not_equal(s, CA_OK);
        assert_false(mapped("libcublas"));
        return;
    }
    T_OK(s);
    assert_true(mapped("libcublas"));
}

int main(void) {
    ca_log_set_level(CA_LOG_ERROR);
    setenv("CACCEL_NCCL_LIBRARY", "libcaccel-test-no-nccl.so.2", 1);   /* test_nccl_missing */
    tc_load_plugin();
    ngpu = tc_gpu_count(reason, sizeof reason);
    if (ngpu == 0 && !reason[0]) {
        fprintf(stderr, "FAIL: no GPU and no reason given\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registered),
        cmocka_unit_test(test_open),
        cmocka_unit_test(test_accelerator_device),
        cmocka_unit_test(test_multi_gpu),
        cmocka_unit_test(test_nccl_needs_cuda),
        cmocka_unit_test(test_nccl_missing),
        cmocka_unit_test(test_cublas_with_the_gpu),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_shutdown();
    return rc;
}
