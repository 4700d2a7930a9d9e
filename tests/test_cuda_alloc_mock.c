/* The CUDA caching allocator on a mocked CUDA runtime (any machine, no GPU): record-stream semantics (a block used on another stream is reused only after an event recorded there at free completed), interior pointers, empty_cache and out-of-memory waiting for such blocks, and teardown with blocks still parked. */
#include "test_util.h"
#include "backends/cuda/cuda_impl.h"

/* ------------------------------------------------------ the mock runtime */

/* A stream is a queue with a count of the work issued and of the work done; the test says when
 * work completes. An event is a ticket on a stream. Device memory is host memory. */
typedef struct mock_stream {
    long issued, completed;
} mock_stream;
typedef struct mock_event {
    mock_stream *s;
    long ticket;
} mock_event;

static mock_stream s_main, s_coll, s_copy;
static long m_mallocs, m_frees, m_events_live, m_event_records;
static size_t m_limit = SIZE_MAX, m_in_use;   /* cudaMalloc fails past this many bytes */

static struct { void *p; size_t n; } m_segs[256];   /* the segments handed out */

cudaError_t cudaMalloc(void **p, size_t n) {
    if (m_in_use + n > m_limit) return cudaErrorMemoryAllocation;
    for (int i = 0; i < 256; i++) {
        if (m_segs[i].p) continue;
        if (!(*p = aligned_alloc(512, n))) return cudaErrorMemoryAllocation;
        m_segs[i].p = *p;
        m_segs[i].n = n;
        m_in_use += n;
        m_mallocs++;
        return cudaSuccess;
    }
    return cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void *p) {
    for (int i = 0; p && i < 256; i++) {
        if (m_segs[i].p != p) continue;
        free(p);
        m_in_use -= m_segs[i].n;
        m_segs[i].p = NULL;
        m_frees++;
        return cudaSuccess;
    }
    return p ? cudaErrorInvalidValue : cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { return cudaSuccess; }
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) {
    *f = 0;
    *t = 0;
    return cudaSuccess;
}
const char *cudaGetErrorName(cudaError_t e) { return "cudaErrorMock"; }
const char *cudaGetErrorString(cudaError_t e) { return "mock error"; }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags) {
    *ev = (cudaEvent_t)calloc(1, sizeof(mock_event));
    m_events_live++;
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t ev) {
    free(ev);
    m_events_live--;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t st) {
    mock_event *e = (mock_event *)ev;
    e->s = (mock_stream *)st;
    e->ticket = e->s->issued;   /* the work issued so far */
    m_event_records++;
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t ev) {
    mock_event *e = (mock_event *)ev;
    return e->s->completed >= e->ticket ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
    mock_event *e = (mock_event *)ev;
    if (e->s->completed < e->ticket) e->s->completed = e->ticket;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t st) {
    mock_stream *s = (mock_stream *)st;
    s->completed = s->issued;
    return cudaSuccess;
}

/* the plugin's own helpers that cuda_alloc.c calls (cuda_device.c's, which needs a GPU) */
ca_status cu_enter(cuda_device *d, const char *what) { return CA_OK; }
ca_status cu_error_at(cudaError_t e, const char *file, int line, const char *fmt, ...) {
    return ca_error(CA_ERR_BACKEND, "mock cuda error %d", (int)e);
}

/* --------------------------------------------------------------- tests */

static cuda_device dev = {.ordinal = 0, .name = "mock GPU"};
static cu_alloc *A;

static void *alloc(size_t n) {
    void *p = NULL;
    T_OK(cu_allocator_ops.alloc(A, n, NULL, &p));
    return p;
}

static ca_allocator_stats stats(void) {
    ca_allocator_stats s;
    cu_allocator_ops.stats(A, &s);
    return s;
}

static int setup(void **state) {
    dev.stream = dev.default_stream = (cudaStream_t)&s_main;
    s_main = s_coll = s_copy = (mock_stream){0};
    m_limit = SIZE_MAX;
    T_OK(cu_alloc_create(&dev, &A));
    dev.alloc = A;
    return 0;
}

static int teardown(void **state) {
    cu_alloc_destroy(A);
    A = NULL;
    assert_int_equal(m_events_live, 0);   /* every event recorded for a parked block was destroyed */
    return 0;
}

/* A block the collective stream used is not handed to the next request of the main stream while
 * the collective is still queued; it is once the collective completed. */
static void test_reuse_waits_for_other_stream(void **state) {
    char *p = alloc(4096);
    s_coll.issued = 5;                             /* an all-reduce reading p is queued there */
    cu_alloc_record_stream(A, p, (cudaStream_t)&s_coll);
    cu_allocator_ops.free(A, p);
    assert_int_equal(stats().allocated, 4096);   /* parked: still counted as allocated */
    char *q = alloc(4096);
    assert_ptr_not_equal(q, p);                  /* not p: the collective may still write it */
    cu_allocator_ops.free(A, q);
    s_coll.completed = 5;                          /* the collective finished */
    char *r = alloc(4096);
    assert_ptr_equal(r, p);                        /* best fit again: p's block, merged back */
    cu_allocator_ops.free(A, r);
    assert_int_equal(stats().allocated, 0);
}

/* Work queued on the other stream after the free does not hold the block back: the event marks
 * what was queued when it was freed. */
static void test_event_marks_the_free(void **state) {
    char *p = alloc(1000);
    s_copy.issued = 1;
    cu_alloc_record_stream(A, p, (cudaStream_t)&s_copy);
    cu_allocator_ops.free(A, p);
    s_copy.completed = 1;
    s_copy.issued = 9;                             /* later work there, unrelated to p */
    char *q = alloc(1000);
    assert_ptr_equal(q, p);
    cu_allocator_ops.free(A, q);
}

/* A pointer inside the allocation (a view) names its block; the block's own stream and repeated
 * records add no event. */
static void test_interior_pointer_and_repeats(void **state) {
    char *p = alloc(1 << 16);
    long rec0 = m_event_records;
    s_coll.issued = 2;
    cu_alloc_record_stream(A, p + 1000, (cudaStream_t)&s_coll);
    cu_alloc_record_stream(A, p + 2000, (cudaStream_t)&s_coll);
    cu_alloc_record_stream(A, p, (cudaStream_t)&s_main);   /* its own: nothing to do */
    cu_allocator_ops.free(A, p);
    assert_int_equal(m_event_records - rec0, 1);
    char *q = alloc(1 << 16);
    assert_ptr_not_equal(q, p);
    cu_allocator_ops.free(A, q);
    s_coll.completed = 2;
    q = alloc(1 << 16);
    assert_ptr_equal(q, p);
    cu_allocator_ops.free(A, q);
    /* a block freed without a record is reused at once, as before */
    char *r = alloc(1 << 16);
    cu_allocator_ops.free(A, r);
    assert_ptr_equal(alloc(1 << 16), r);
    cu_allocator_ops.free(A, r);
}

/* empty_cache waits for the other streams and returns the segment; so does an allocation that
 * would otherwise fail for want of memory. */
static void test_empty_cache_and_oom_wait(void **state) {
    char *p = alloc(12 << 20);                     /* a large segment of its own */
    s_coll.issued = 1;
    cu_alloc_record_stream(A, p, (cudaStream_t)&s_coll);
    cu_allocator_ops.free(A, p);
    assert_int_equal(stats().reserved, 12 << 20);
    cu_allocator_ops.empty_cache(A);
    assert_int_equal(stats().reserved, 0);
    assert_int_equal(stats().allocated, 0);
    assert_int_equal(s_coll.completed, 1);

    m_limit = m_in_use + (12 << 20);               /* room for one such segment only */
    p = alloc(12 << 20);
    s_coll.issued = 2;
    cu_alloc_record_stream(A, p, (cudaStream_t)&s_coll);
    cu_allocator_ops.free(A, p);
    void *q = NULL;
    T_OK(cu_allocator_ops.alloc(A, 12 << 20, NULL, &q));   /* waits, returns p's segment, retries */
    assert_int_equal(s_coll.completed, 2);
    cu_allocator_ops.free(A, q);
    cu_allocator_ops.empty_cache(A);
}

/* Closing the device with blocks parked frees them and their events (checked in teardown, and by
 * ASan for the memory). */
static void test_destroy_with_parked(void **state) {
    char *p = alloc(300), *q = alloc(300);
    s_coll.issued = 1;
    cu_alloc_record_stream(A, p, (cudaStream_t)&s_coll);
    cu_alloc_record_stream(A, q, (cudaStream_t)&s_copy);
    s_copy.issued = 1;
    cu_allocator_ops.free(A, p);
    cu_allocator_ops.free(A, q);
    assert_true(m_events_live >= 2);
}

int main(void) {
    ca_log_set_level(CA_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_reuse_waits_for_other_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_event_marks_the_free, setup, teardown),
        cmocka_unit_test_setup_teardown(test_interior_pointer_and_repeats, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_cache_and_oom_wait, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_with_parked, setup, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_shutdown();
    return rc;
}
