/* Tests of the CPU backend's plugin descriptor and device vtable: memory, copies, streams/events, description, OpenBLAS threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <unistd.h>

#include "core/device_impl.h"
#include "backends/cpu/cpu_plugin.h"
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_parallel.h"

static const ca_device_ops *cpu_ops(void) { return ca_cpu_plugin()->devices[0]; }

static void test_plugin(void **state) {
    const ca_plugin *p = ca_cpu_plugin();
    assert_non_null(p);
    assert_true(p == ca_cpu_plugin());
    assert_int_equal(p->struct_size, sizeof(ca_plugin));
    assert_int_equal(p->abi_version, CA_ABI_VERSION);
    assert_string_equal(p->name, "cpu");
    assert_non_null(p->version);
    assert_true(strncmp(p->version, "OpenBLAS ", 9) == 0 && strlen(p->version) > 9);
    assert_int_equal(p->num_devices, 1);
    assert_int_equal(p->num_collectives, 0);
    assert_null(p->collectives);
    char reason[64] = "x";
    assert_non_null(p->score);
    assert_true(p->score(reason, sizeof reason) > 0);
    assert_string_equal(reason, "");
}

static void test_tables(void **state) {
    const ca_device_ops *o = cpu_ops();
    assert_int_equal(o->struct_size, sizeof(ca_device_ops));
    assert_int_equal(o->abi_version, CA_ABI_VERSION);
    assert_string_equal(o->name, "cpu");
    assert_true(o->host_memory);
    assert_null(o->allocator);
    assert_null(o->allocator_ctx);
    assert_null(o->host_alloc);
    assert_null(o->host_free);
    void (*const dev_slots[])(void) = {
        (void (*)(void))o->device_count, (void (*)(void))o->open, (void (*)(void))o->close,
        (void (*)(void))o->describe, (void (*)(void))o->mem_alloc, (void (*)(void))o->mem_free,
        (void (*)(void))o->memcpy, (void (*)(void))o->stream_create,
        (void (*)(void))o->stream_destroy, (void (*)(void))o->set_stream,
        (void (*)(void))o->event_create, (void (*)(void))o->event_destroy,
        (void (*)(void))o->event_record, (void (*)(void))o->stream_wait_event,
        (void (*)(void))o->event_synchronize, (void (*)(void))o->synchronize};
    for (size_t i = 0; i < sizeof dev_slots / sizeof dev_slots[0]; i++) assert_non_null(dev_slots[i]);
    const ca_kernels *k = o->kernels;
    assert_non_null(k);
    assert_int_equal(k->struct_size, sizeof(ca_kernels));
    assert_int_equal(k->abi_version, CA_ABI_VERSION);
    /* every slot after the header is a function pointer, and every one is set */
    size_t first = offsetof(ca_kernels, gemm), slots = (sizeof(ca_kernels) - first) / sizeof(void (*)(void));
    assert_int_equal(slots, 37);     /* 27 of ABI 1.0, 5 in 1.1, rms_norm (+ bwd) in 3.1, rope, swiglu (+ bwd) in 3.3 */
    for (size_t i = 0; i < slots; i++) {
        void (*fp)(void);
        memcpy(&fp, (const char *)k + first + i * sizeof fp, sizeof fp);
        if (!fp) fail_msg("kernel slot %zu is NULL", i);
    }
}

static void test_open_describe(void **state) {
    const ca_device_ops *o = cpu_ops();
    int count = -1;
    char reason[32] = "x";
    assert_int_equal(o->device_count(&count, reason, sizeof reason), CA_OK);
    assert_int_equal(count, 1);
    assert_string_equal(reason, "");
    void *dev = (void *)1;
    assert_int_equal(o->open(1, NULL, &dev), CA_ERR_NOT_FOUND);
    assert_null(dev);
    ca_device_open_args args = {.struct_size = sizeof args, .local_rank = -1};
    assert_int_equal(o->open(0, &args, &dev), CA_OK);
    char desc[512];
    assert_int_equal(o->describe(dev, desc, sizeof desc), CA_OK);
    assert_non_null(strstr(desc, "threads"));
    assert_non_null(strstr(desc, "OpenBLAS"));
    assert_non_null(strstr(desc, openblas_get_corename()));
    char small[8];
    assert_int_equal(o->describe(dev, small, sizeof small), CA_OK);  /* truncated, terminated */
    assert_int_equal(strlen(small), 7);
    /* the model name from /proc/cpuinfo where there is one */
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) != 0) continue;
            char *p = strchr(line, ':');
            if (!p) break;
            p += 2;
            p[strcspn(p, "\n")] = '\0';
            assert_non_null(strstr(desc, p));
            break;
        }
        fclose(f);
    }
    assert_int_equal(o->synchronize(dev), CA_OK);
    o->close(dev);
    o->close(NULL);
}

static void test_memory(void **state) {
    const ca_device_ops *o = cpu_ops();
    void *dev;
    assert_int_equal(o->open(0, NULL, &dev), CA_OK);
    const size_t sizes[] = {0, 1, 63, 64, 65, 4099, 1 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = NULL, *q = NULL;
        assert_int_equal(o->mem_alloc(dev, sizes[i], &p), CA_OK);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        memset(p, 0x5a, sizes[i]);
        assert_int_equal(o->mem_alloc(dev, sizes[i], &q), CA_OK);
        for (ca_copy_kind k = CA_COPY_H2D; k <= CA_COPY_D2D; k++) {
            memset(q, 0, sizes[i]);
            assert_int_equal(o->memcpy(dev, q, p, sizes[i], k, k == CA_COPY_D2H), CA_OK);
            if (sizes[i]) assert_memory_equal(p, q, sizes[i]);
        }
        o->mem_free(dev, p);
        o->mem_free(dev, q);
    }
    void *p;
    assert_int_equal(o->mem_alloc(dev, SIZE_MAX - 8, &p), CA_ERR_NOMEM);
    assert_int_equal(o->memcpy(dev, NULL, NULL, 0, CA_COPY_H2D, false), CA_OK);
    char b[4];
    assert_int_equal(o->memcpy(dev, b, NULL, 4, CA_COPY_H2D, false), CA_ERR_INVALID);
    assert_int_equal(o->memcpy(dev, b, b, 4, (ca_copy_kind)9, false), CA_ERR_INVALID);
    o->mem_free(dev, NULL);
    o->close(dev);
}

static void test_streams_events(void **state) {
    const ca_device_ops *o = cpu_ops();
    void *dev, *s1, *s2, *e1, *e2;
    assert_int_equal(o->open(0, NULL, &dev), CA_OK);
    assert_int_equal(o->stream_create(dev, &s1), CA_OK);
    assert_int_equal(o->stream_create(dev, &s2), CA_OK);
    assert_non_null(s1);
    assert_true(s1 != s2);
    assert_int_equal(o->event_create(dev, &e1), CA_OK);
    assert_int_equal(o->event_create(dev, &e2), CA_OK);
    assert_true(e1 != e2);
    assert_int_equal(o->set_stream(dev, s1), CA_OK);
    assert_int_equal(o->event_record(dev, e1, s1), CA_OK);
    assert_int_equal(o->event_record(dev, e2, NULL), CA_OK);
    assert_int_equal(o->stream_wait_event(dev, s2, e1), CA_OK);
    assert_int_equal(o->event_synchronize(dev, e1), CA_OK);
    assert_int_equal(o->set_stream(dev, NULL), CA_OK);
    assert_int_equal(o->synchronize(dev), CA_OK);
    assert_int_equal(o->event_record(dev, NULL, s1), CA_ERR_INVALID);
    o->event_destroy(dev, e1);
    o->event_destroy(dev, e2);
    o->stream_destroy(dev, s1);
    o->stream_destroy(dev, s2);
    o->close(dev);
}

static void test_blas_threads(void **state) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1) online = 1;
    unsetenv("OPENBLAS_NUM_THREADS");
    unsetenv("OMP_NUM_THREADS");
    unsetenv("LOCAL_WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    unsetenv("SLURM_PROCID");   /* the test may itself run in a Slurm step */
    assert_int_equal(cpu_default_blas_threads(), online);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    assert_int_equal(cpu_default_blas_threads(), online / 2 > 0 ? online / 2 : 1);
    setenv("LOCAL_WORLD_SIZE", "1000", 1);  /* wins over Open MPI's; never below 1 */
    assert_int_equal(cpu_default_blas_threads(), online / 1000 > 0 ? online / 1000 : 1);
    setenv("LOCAL_WORLD_SIZE", "junk", 1);
    assert_int_equal(cpu_default_blas_threads(), online / 2 > 0 ? online / 2 : 1);
    setenv("OMP_NUM_THREADS", "3", 1);
    assert_int_equal(cpu_default_blas_threads(), 0);  /* the user's choice stands */
    unsetenv("OMP_NUM_THREADS");
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    assert_int_equal(cpu_default_blas_threads(), 0);
    /* open applies the default */
    unsetenv("OPENBLAS_NUM_THREADS");
    unsetenv("LOCAL_WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    openblas_set_num_threads(1);
    const ca_device_ops *o = cpu_ops();
    void *dev;
    assert_int_equal(o->open(0, NULL, &dev), CA_OK);
    if (online <= openblas_get_num_procs()) assert_int_equal(openblas_get_num_threads(), online);
    o->close(dev);
    /* with OPENBLAS_NUM_THREADS set, open leaves the count alone */
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    openblas_set_num_threads(1);
    assert_int_equal(o->open(0, NULL, &dev), CA_OK);
    assert_int_equal(openblas_get_num_threads(), 1);
    o->close(dev);
    unsetenv("OPENBLAS_NUM_THREADS");
}

static int share(long online, int procs) { return online / procs > 0 ? (int)(online / procs) : 1; }

/* A task of a Slurm step (srun sets no LOCAL_WORLD_SIZE): the CPUs Slurm gave it, else its share
 * among the step's tasks on its node; a local size set by a launcher inside the step wins. */
static void test_blas_threads_slurm(void **state) {
    (void)state;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1) online = 1;
    const char *vars[] = {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                          "SLURM_PROCID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_NODEID",
                          "SLURM_STEP_TASKS_PER_NODE", "SLURM_CPUS_PER_TASK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "3,2(x2)", 1);
    setenv("SLURM_NODEID", "2", 1);
    assert_int_equal(cpu_default_blas_threads(), online);   /* no step id: the batch script, one process */
    setenv("SLURM_STEP_ID", "0", 1);
    assert_int_equal(cpu_default_blas_threads(), share(online, 2));   /* node 2 runs 2 of the step's tasks */
    setenv("SLURM_NODEID", "0", 1);
    assert_int_equal(cpu_default_blas_threads(), share(online, 3));
    setenv("SLURM_STEP_TASKS_PER_NODE", "garbage", 1);
    assert_int_equal(cpu_default_blas_threads(), online);
    unsetenv("SLURM_STEP_ID");
    setenv("SLURM_STEPID", "0", 1);                                /* the older name */
    setenv("SLURM_STEP_TASKS_PER_NODE", "4", 1);
    assert_int_equal(cpu_default_blas_threads(), share(online, 4));
    cpu_set_t all, one;
    assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
    int usable = CPU_COUNT(&all) < online ? CPU_COUNT(&all) : (int)online;
    setenv("SLURM_CPUS_PER_TASK", "3", 1);                         /* srun -c 3 */
    assert_int_equal(cpu_default_blas_threads(), usable < 3 ? usable : 3);
    CPU_ZERO(&one);                          /* bound to one CPU: one thread, whatever -c said */
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all)) { CPU_SET(c, &one); break; }
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    assert_int_equal(cpu_default_blas_threads(), 1);
    assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
    setenv("LOCAL_WORLD_SIZE", "2", 1);                            /* caccel launch inside the step */
    assert_int_equal(cpu_default_blas_threads(), share(online, 2));
    setenv("OMP_NUM_THREADS", "7", 1);
    assert_int_equal(cpu_default_blas_threads(), 0);
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

/* Deterministic mode runs GEMMs on one thread while any user holds it, then restores the count. */
static void test_deterministic_threads(void **state) {
    (void)state;
    cpu_set_threads(2);   /* the kernels' and the BLAS's count, which deterministic mode puts back */
    int before = openblas_get_num_threads();
    ca_cpu_set_deterministic(true);
    assert_int_equal(openblas_get_num_threads(), 1);
    ca_cpu_set_deterministic(true);
    ca_cpu_set_deterministic(false);
    assert_int_equal(openblas_get_num_threads(), 1);   /* one user left */
    ca_cpu_set_deterministic(false);
    assert_int_equal(openblas_get_num_threads(), before);
    ca_cpu_set_deterministic(false);                    /* unbalanced off: no effect */
    assert_int_equal(openblas_get_num_threads(), before);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plugin),
        cmocka_unit_test(test_tables),
        cmocka_unit_test(test_open_describe),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_streams_events),
        cmocka_unit_test(test_blas_threads),
        cmocka_unit_test(test_blas_threads_slurm),
        cmocka_unit_test(test_deterministic_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
