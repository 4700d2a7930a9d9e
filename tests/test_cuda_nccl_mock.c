/* The nccl backend (nccl_coll.c) on a mocked CUDA runtime and a mocked libnccl (tests/mock_nccl.c), on any machine: an op runs on NCCL's own stream after the compute stream's work, the compute stream waits for it, its buffers are recorded with the allocator; abort ends an enqueue that never settles without waiting for it. */
#include "test_util.h"
#include "backends/cuda/cuda_impl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>

/* ------------------------------------------------------ the mock runtime */

/* Streams and events are addresses; the calls that order them are logged in order. */
static char s_main, s_nccl, ev_pool[64];
static int ev_next;
typedef struct call {
    char kind;                 /* 'r' record(ev, stream), 'w' stream wait(stream, ev), 'a' record_stream(ptr, stream) */
    const void *a, *b;
} call;
static call trace[256];
static atomic_int ntrace;

static void log_call(char kind, const void *a, const void *b) {
    int i = atomic_fetch_add(&ntrace, 1);
    if (i < 256) trace[i] = (call){kind, a, b};
}

cudaError_t cudaSetDevice(int d) { return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorName(cudaError_t e) { return "cudaErrorMock"; }
const char *cudaGetErrorString(cudaError_t e) { return "mock error"; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int f) {
    *s = (cudaStream_t)&s_nccl;
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int f) {
    *e = (cudaEvent_t)&ev_pool[ev_next++ % 64];
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) { return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    log_call('r', e, s);
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int f) {
    log_call('w', s, e);
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaSuccess; }
static float one_buf;
cudaError_t cudaMalloc(void **p, size_t n) {
    *p = &one_buf;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) { return cudaSuccess; }
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) { return cudaSuccess; }
cudaError_t cudaDeviceGetPCIBusId(char *b, int len, int d) {
    snprintf(b, (size_t)len, "0000:00:00.0");
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int f) {
    *p = malloc(n);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    memcpy(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return cudaSuccess; }

/* the plugin's own helpers nccl_coll.c calls (cuda_device.c's and cuda_alloc.c's) */
ca_status cu_enter(cuda_device *d, const char *what) { return CA_OK; }
ca_status cu_error_at(cudaError_t e, const char *file, int line, const char *fmt, ...) {
    return ca_error(CA_ERR_BACKEND, "mock cuda error %d", (int)e);
}
void cu_alloc_record_stream(cu_alloc *a, const void *ptr, cudaStream_t stream) { log_call('a', ptr, stream); }

/* --------------------------------------------------------------- tests */

static cuda_device dev = {.ordinal = 0, .name = "mock GPU"};
static const ca_device_ops cuda_ops = {.struct_size = sizeof(ca_device_ops), .name = "cuda"};
static void *mock_lib;
static atomic_int *ops_entered, *aborts;
static cudaStream_t *last_stream;

static void *open_comm(int64_t timeout_ms) {
    ca_comm_init_args a = {.struct_size = sizeof a, .rank = 0, .world_size = 1, .timeout_ms = timeout_ms,
                           .device_ops = &cuda_ops, .device = &dev};
    void *comm = NULL;
    T_OK(cu_nccl_ops.init(&a, &comm));
    return comm;
}

/* The index of the first call of the trace from `from` on that matches, or -1. */
static int find(int from, char kind, const void *a, const void *b) {
    for (int i = from; i < atomic_load(&ntrace) && i < 256; i++)
        if (trace[i].kind == kind && trace[i].a == a && trace[i].b == b) return i;
    return -1;
}

static const void *find_record_on(int from, const void *stream) {
    for (int i = from; i < atomic_load(&ntrace) && i < 256; i++)
        if (trace[i].kind == 'r' && trace[i].b == stream) return trace[i].a;
    return NULL;
}

/* An op without a work handle: NCCL's stream waits for an event of the compute stream, NCCL runs
 * on its own stream, both buffers are recorded there, and the compute stream waits for the op. */
static void test_op_on_its_own_stream(void **state) {
    void *comm = open_comm(60000);
    float send[4], recv[4];
    atomic_store(&ntrace, 0);
    T_OK(cu_nccl_ops.all_reduce(comm, send, recv, 4, CA_F32, CA_OP_SUM, NULL));
    assert_ptr_equal(*last_stream, &s_nccl);
    const void *ready = find_record_on(0, &s_main);
    assert_non_null(ready);
    int w = find(0, 'w', &s_nccl, ready);
    assert_true(w > find(0, 'r', ready, &s_main));
    assert_true(find(0, 'a', send, &s_nccl) >= 0);
    assert_true(find(0, 'a', recv, &s_nccl) >= 0);
    const void *done = find_record_on(w, &s_nccl);
    assert_non_null(done);
    assert_true(find(w, 'w', &s_main, done) > w);

    /* with a handle, the compute stream waits once the handle is found complete */
    atomic_store(&ntrace, 0);
    ca_work_impl *work = NULL;
    T_OK(cu_nccl_ops.broadcast(comm, recv, 4, CA_F32, 0, &work));
    assert_non_null(work);
    done = find_record_on(0, &s_nccl);
    assert_non_null(done);
    assert_int_equal(find(0, 'w', &s_main, done), -1);
    T_OK(cu_nccl_ops.work_wait(work, 1000));
    assert_true(find(0, 'w', &s_main, done) >= 0);
    cu_nccl_ops.work_free(work);
    cu_nccl_ops.destroy(comm);
}

/* sendrecv: ncclRecv and ncclSend inside one group (a ring's ranks each send and receive at once
 * without deadlock), on NCCL's stream with both buffers recorded there; a one-sided recv issues
 * only its half, in a group too. */
static void test_sendrecv_in_one_group(void **state) {
    atomic_int *in_group = dlsym(mock_lib, "mock_nccl_p2p_in_group"), *groups = dlsym(mock_lib, "mock_nccl_groups");
    assert_non_null(in_group);
    assert_non_null(groups);
    void *comm = open_comm(60000);
    float send[4], recv[4];
    int ops0 = atomic_load(ops_entered), in0 = atomic_load(in_group), g0 = atomic_load(groups);
    atomic_store(&ntrace, 0);
    T_OK(cu_nccl_ops.sendrecv(comm, send, 4, 0, recv, 4, 0, CA_F32, NULL));
    assert_int_equal(atomic_load(ops_entered) - ops0, 2);
    assert_int_equal(atomic_load(in_group) - in0, 2);
    assert_int_equal(atomic_load(groups) - g0, 1);
    assert_ptr_equal(*last_stream, &s_nccl);
    assert_true(find(0, 'a', send, &s_nccl) >= 0);
    assert_true(find(0, 'a', recv, &s_nccl) >= 0);
    ca_work_impl *work = NULL;
    T_OK(cu_nccl_ops.sendrecv(comm, NULL, 0, -1, recv, 4, 0, CA_F32, &work));
    assert_int_equal(atomic_load(ops_entered) - ops0, 3);
    assert_int_equal(atomic_load(in_group) - in0, 3);
    assert_int_equal(atomic_load(groups) - g0, 2);
    T_OK(cu_nccl_ops.work_wait(work, 1000));
    cu_nccl_ops.work_free(work);
    cu_nccl_ops.destroy(comm);
}

typedef struct issue {
    void *comm;
    ca_status st;
    char msg[512];
} issue;

static void *issuer(void *arg) {
    issue *is = arg;
    float buf[4] = {0};
    ca_work_impl *work = NULL;
    is->st = cu_nccl_ops.all_reduce(is->comm, buf, buf, 4, CA_F32, CA_OP_SUM, &work);
    snprintf(is->msg, sizeof is->msg, "%s", ca_last_error());
    if (work) cu_nccl_ops.work_free(work);
    return NULL;
}

/* An enqueue that never settles holds the communicator's mutex; abort (the watchdog's) must not
 * wait for it: it ends within the 2 s grace, and the issuer returns "aborted". Before, abort
 * waited for the mutex until the issuer's own timeout (here 8 s). */
static void test_abort_does_not_wait_for_a_stuck_enqueue(void **state) {
    setenv("MOCK_NCCL_STUCK", "1", 1);
    issue is = {.comm = open_comm(8000)};
    int entered = atomic_load(ops_entered), aborted = atomic_load(aborts);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, issuer, &is), 0);
    while (atomic_load(ops_entered) == entered) sched_yield();   /* the issuer is inside the enqueue */
    int64_t t0 = ca_now_ms();
    T_OK(cu_nccl_ops.abort(is.comm));
    int64_t took = ca_now_ms() - t0;
    pthread_join(th, NULL);
    printf("abort took %lld ms; the issuer: %s\n", (long long)took, is.msg);
    assert_true(took < 2000);
    assert_int_equal(is.st, CA_ERR_STATE);
    assert_non_null(strstr(is.msg, "aborted"));
    assert_int_equal(atomic_load(aborts), aborted + 1);
    /* later calls fail at once; destroy does not finalize an aborted communicator */
    float buf[1];
    assert_int_equal(cu_nccl_ops.all_reduce(is.comm, buf, buf, 1, CA_F32, CA_OP_SUM, NULL), CA_ERR_STATE);
    cu_nccl_ops.destroy(is.comm);
    unsetenv("MOCK_NCCL_STUCK");
}

int main(void) {
    ca_log_set_level(CA_LOG_ERROR);
    const char *b = getenv("CACCEL_TEST_BUILDDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/.libs/mock_nccl.so", b && *b ? b : ".");
    setenv("CACCEL_NCCL_LIBRARY", path, 1);
    mock_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!mock_lib) {
        fprintf(stderr, "FAIL: %s\n", dlerror());
        return 1;
    }
    ops_entered = dlsym(mock_lib, "mock_nccl_ops_entered");
    aborts = dlsym(mock_lib, "mock_nccl_aborts");
    last_stream = dlsym(mock_lib, "mock_nccl_last_stream");
    if (!ops_entered || !aborts || !last_stream) {
        fprintf(stderr, "FAIL: %s lacks the mock's counters\n", path);
        return 1;
    }
    dev.stream = dev.default_stream = (cudaStream_t)&s_main;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_on_its_own_stream),
        cmocka_unit_test(test_sendrecv_in_one_group),
        cmocka_unit_test(test_abort_does_not_wait_for_a_stuck_enqueue),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_shutdown();
    return rc;
}
