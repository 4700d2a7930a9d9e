/* comm_check: a rank of a multi-process collective test, run under mpirun or caccel launch by tests/dist scripts. */
#include <caccel/backend.h>
#include <caccel/caccel.h>

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/*
 * Modes (--mode):
 *   correctness  every collective, reduce op and dtype at sizes 0, 1, 97 and
 *                >= 16 MiB (--large-mib), in place and not, blocking and
 *                asynchronous; compared exactly with the values computed here
 *   desync       rank 0 calls a barrier where the others call all_reduce:
 *                every rank must fail with the mismatch message
 *   timeout      the last rank sleeps (--sleep-ms) before an all_reduce the
 *                others already wait in: they must fail naming it
 *   exit         the last rank exits with code 7 after a barrier; the others
 *                keep reducing until the launcher stops them
 *   exit1-mid    after 3 all_reduces the victim (--victim, default the last
 *                rank) calls exit(1), as a failed CA_CHECK does; the others
 *                reduce on and must fail within seconds naming it
 *   exit0-early  the victim destroys its communicator and returns 0 after 3
 *                all_reduces; the others' 4th all_reduce must fail naming it
 *   kill9        the victim kills itself with SIGKILL after 3 all_reduces
 *                (--fail-code N: the others exit N after failing as expected,
 *                as a program whose CA_CHECK failed does)
 *   fault        every rank reduces in a loop; at all_reduce --step S the victim
 *                injects --fault kill9, stop (SIGSTOP), exit0, exit1, abort, segv, bus, fpe or ill and
 *                prints when (epoch ms); the others must fail naming it (a stopped
 *                rank: by the collective timeout) and exit --fail-code; a stopped
 *                victim that is continued fails in its next collective and exits 5;
 *                with --kernels each step first runs a small matmul ([4,8] x [8,2],
 *                f32, on the CPU), for the flight recorder's kernel records
 *   spin         every rank reduces forever (signal and orphan tests stop it); it
 *                prints "spinning" once its first all_reduce has completed, so
 *                a test that acts on the job on that line acts on a job that is
 *                connected and reducing
 *   last-bcast   two all_reduces, then a broadcast from rank 0 (#2) as every
 *                rank's last collective; each rank destroys its communicator
 *                (printing how long that took) and exits as soon as its part is
 *                done. With CACCEL_TEST_WAIT_DELAY holding a peer in its wait
 *                for the broadcast, rank 0 finishes (and leaves the store it
 *                serves) while the peer's watchdog still reads the store: the
 *                peer must complete the broadcast all the same
 *   ondemand     every rank completes an all_reduce, prints "comm_check: rank R
 *                (pid P) completed all_reduce #0", waits until --resume FILE exists
 *                (the test signals the ranks meanwhile: SIGUSR1 asks the flight
 *                recorder for a dump), then completes a second all_reduce and
 *                exits 0: the process went on after its dump. Its own SIGUSR1
 *                handler, installed first, counts the signals it was passed
 *   badtoken     rank 1 presents a wrong job token
 *   env          prints what the process environment says (rank, size, backend)
 *   p2p          point-to-point: a ring shift (sendrecv to the right, from the left) of
 *                payloads distinct per rank and size (0, 1, 97 and --large-mib MiB),
 *                blocking and asynchronous, then the same one-sided (even ranks send
 *                right, odd ones receive from the left), then a shift to the left by
 *                send and recv issued asynchronously in either order; each received
 *                buffer compared exactly with the sender's values
 *   p2p-kill     two ring shifts, then the victim (--victim, default the last rank)
 *                kills itself with SIGKILL; the others shift on and must fail naming it
 *   p2p-late     two ring shifts, then the last rank sleeps (--sleep-ms) before the third,
 *                which the others must fail by the timeout (--timeout-ms) naming it
 *   p2p-lazy     point-to-point on the lazy device (implies --device xla): ring shifts of
 *                device tensors, each sendrecv a node of the device's graph (nothing runs
 *                at the call; a kernel recorded after it reads what it received when the
 *                graph runs at the host read), the same shift again taken from the graph
 *                cache, a shift to the other side (another peer: another program where the
 *                ring has more than two ranks) and of another size compiled anew; then
 *                one-sided send and recv as nodes
 * --device xla: the communicator's buffers live on the lazy device (p2p-kill, p2p-late:
 *   each shift a node of its graph, run at once by a synchronisation, whose failure
 *   must name the peer as on the host); --device xla38: the same device registered with
 *   a table of ABI 3.8, without enqueue_host_fn_keyed: the exchanges are still nodes,
 *   recorded through enqueue_host_fn and keyed by their sizes alone (p2p-lazy: the
 *   shift to the other side is a cache hit)
 * --gate FILE: before creating the communicator, a rank says "comm_check: rank R at
 * the gate" and waits (at most 300 s) until FILE exists. A test that opens the gate
 * once every rank is there starts every rendezvous at once, however long the
 * processes took to start on a busy machine: a short --timeout-ms or
 * CACCEL_TIMEOUT (which bounds the rendezvous too) then times the collectives.
 * A rank prints "comm_check: OK ..." or "comm_check: EXPECTED ..." when it did
 * what the mode asks, and exits 0; anything else exits non-zero.
 */

typedef struct opts {
    const char *backend;
    const char *mode;
    int64_t timeout_ms;
    bool debug;
    int large_mib;
    int sleep_ms;
    int victim;                /* -1: the last rank */
    int fail_code;             /* exit status of a rank that failed as expected (leave modes) */
    const char *fault;         /* fault mode: kill9, stop, exit0, exit1, abort, segv, bus, fpe, ill */
    int step;                  /* fault mode: the all_reduce at which the victim injects it */
    const char *gate;          /* a file to wait for before creating the communicator */
    bool kernels;              /* fault mode: a matmul before each all_reduce */
    const char *resume;        /* ondemand mode: the file to wait for after the first all_reduce */
    ca_device *dev;            /* --device xla: the lazy device the buffers live on (NULL: host memory) */
} opts;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int die(int rank, const char *what) {
    fprintf(stderr, "comm_check: FAILED on rank %d: %s: %s\n", rank, what, ca_last_error());
    return 1;
}

/* ------------------------------------------------------------- values */

static uint16_t to_f16(float x) {
    uint32_t f;
    memcpy(&f, &x, 4);
    uint16_t s = (uint16_t)((f >> 16) & 0x8000);
    int32_t e = (int32_t)((f >> 23) & 0xff) - 127 + 15;
    uint32_t m = f & 0x7fffff;
    if (x == 0) return s;
    /* the test's values are small integers and their quotients: normal numbers */
    uint32_t hm = m >> 13, rem = m & 0x1fff;
    uint16_t h = (uint16_t)(s | ((uint32_t)e << 10) | hm);
    if (rem > 0x1000 || (rem == 0x1000 && (hm & 1))) h++;
    return h;
}

static uint16_t to_bf16(float x) {
    uint32_t f;
    memcpy(&f, &x, 4);
    return (uint16_t)((f + 0x7fff + ((f >> 16) & 1)) >> 16);
}

/* Element i of rank r: small integers, so every sum is exact in every dtype. */
static int val(int r, size_t i) { return (int)((i * 7 + (size_t)r * 13) % 17) - 8; }

static void put(void *buf, ca_dtype dt, size_t i, double v) {
    switch (dt) {
    case CA_F32: ((float *)buf)[i] = (float)v; break;
    case CA_F16: ((uint16_t *)buf)[i] = to_f16((float)v); break;
    case CA_BF16: ((uint16_t *)buf)[i] = to_bf16((float)v); break;
    case CA_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case CA_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    }
}

/* The expected reduction of element i over `world` ranks, as stored in dtype dt. */
static void expect(void *buf, ca_dtype dt, size_t pos, size_t i, ca_reduce_op op, int world) {
    long sum = 0, mn = 1000, mx = -1000;
    for (int r = 0; r < world; r++) {
        int v = val(r, i);
        sum += v;
        if (v < mn) mn = v;
        if (v > mx) mx = v;
    }
    switch (op) {
    case CA_OP_SUM: put(buf, dt, pos, (double)sum); break;
    case CA_OP_MIN: put(buf, dt, pos, (double)mn); break;
    case CA_OP_MAX: put(buf, dt, pos, (double)mx); break;
    case CA_OP_AVG:
        if (dt == CA_I32 || dt == CA_I64) put(buf, dt, pos, (double)(sum / world));
        else put(buf, dt, pos, (double)((float)sum / (float)world));
        break;
    }
}

static int compare(const void *got, const void *want, size_t n, ca_dtype dt, const char *what, int rank) {
    size_t es = ca_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        if (memcmp((const char *)got + i * es, (const char *)want + i * es, es) != 0) {
            long long g = 0, w = 0;
            memcpy(&g, (const char *)got + i * es, es);
            memcpy(&w, (const char *)want + i * es, es);
            fprintf(stderr, "comm_check: FAILED on rank %d: %s: element %zu of %zu is 0x%llx, expected 0x%llx\n",
                    rank, what, i, n, g, w);
            return 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------- correctness */

static const ca_dtype dtypes[] = {CA_F32, CA_F16, CA_BF16, CA_I32, CA_I64};
static const ca_reduce_op ops[] = {CA_OP_SUM, CA_OP_AVG, CA_OP_MIN, CA_OP_MAX};

static int check_all_reduce(ca_comm *c, ca_dtype dt, ca_reduce_op op, size_t n, bool inplace, int *checks) {
    int r = ca_comm_rank(c), w = ca_comm_size(c);
    size_t es = ca_dtype_size(dt);
    char *send = malloc(n * es + 1), *recv = malloc(n * es + 1), *want = malloc(n * es + 1);
    if (!send || !recv || !want) return die(r, "malloc");
    for (size_t i = 0; i < n; i++) {
        put(send, dt, i, val(r, i));
        expect(want, dt, i, i, op, w);
    }
    char what[128];
    snprintf(what, sizeof what, "all_reduce %s %s n=%zu%s", ca_dtype_name(dt), ca_reduce_op_name(op), n,
             inplace ? " in place" : "");
    ca_status s = ca_comm_all_reduce(c, send, inplace ? send : recv, n, dt, op, NULL);
    int bad = s != CA_OK ? die(r, what) : compare(inplace ? send : recv, want, n, dt, what, r);
    free(send);
    free(recv);
    free(want);
    (*checks)++;
    return bad;
}

static int check_broadcast(ca_comm *c, ca_dtype dt, size_t n, int root, int *checks) {
    int r = ca_comm_rank(c);
    size_t es = ca_dtype_size(dt);
    char *buf = malloc(n * es + 1), *want = malloc(n * es + 1);
    if (!buf || !want) return die(r, "malloc");
    for (size_t i = 0; i < n; i++) {
        put(buf, dt, i, r == root ? val(root, i) : 99);
        put(want, dt, i, val(root, i));
    }
    char what[128];
    snprintf(what, sizeof what, "broadcast %s n=%zu root %d", ca_dtype_name(dt), n, root);
    ca_status s = ca_comm_broadcast(c, buf, n, dt, root, NULL);
    int bad = s != CA_OK ? die(r, what) : compare(buf, want, n, dt, what, r);
    free(buf);
    free(want);
    (*checks)++;
    return bad;
}

static int check_all_gather(ca_comm *c, ca_dtype dt, size_t n, bool inplace, int *checks) {
    int r = ca_comm_rank(c), w = ca_comm_size(c);
    size_t es = ca_dtype_size(dt);
    char *send = malloc(n * es + 1), *recv = malloc(n * es * (size_t)w + 1), *want = malloc(n * es * (size_t)w + 1);
    if (!send || !recv || !want) return die(r, "malloc");
    for (size_t i = 0; i < n; i++) put(send, dt, i, val(r, i));
    for (int q = 0; q < w; q++)
        for (size_t i = 0; i < n; i++) put(want, dt, (size_t)q * n + i, val(q, i));
    const void *src = send;
    if (inplace) {
        memcpy(recv + (size_t)r * n * es, send, n * es);
        src = recv + (size_t)r * n * es;
    }
    char what[128];
    snprintf(what, sizeof what, "all_gather %s n=%zu%s", ca_dtype_name(dt), n, inplace ? " in place" : "");
    ca_status s = ca_comm_all_gather(c, src, recv, n, dt, NULL);
    int bad = s != CA_OK ? die(r, what) : compare(recv, want, n * (size_t)w, dt, what, r);
    free(send);
    free(recv);
    free(want);
    (*checks)++;
    return bad;
}

static int check_reduce_scatter(ca_comm *c, ca_dtype dt, ca_reduce_op op, size_t n, bool inplace, int *checks) {
    int r = ca_comm_rank(c), w = ca_comm_size(c);
    size_t es = ca_dtype_size(dt), total = n * (size_t)w;
    char *send = malloc(total * es + 1), *recv = malloc(n * es + 1), *want = malloc(n * es + 1);
    if (!send || !recv || !want) return die(r, "malloc");
    for (size_t i = 0; i < total; i++) put(send, dt, i, val(r, i));
    for (size_t i = 0; i < n; i++) expect(want, dt, i, (size_t)r * n + i, op, w);
    char what[128];
    snprintf(what, sizeof what, "reduce_scatter %s %s n=%zu%s", ca_dtype_name(dt), ca_reduce_op_name(op), n,
             inplace ? " in place" : "");
    ca_status s = ca_comm_reduce_scatter(c, send, inplace ? send : recv, n, dt, op, NULL);
    int bad = s != CA_OK ? die(r, what) : compare(inplace ? send : recv, want, n, dt, what, r);
    free(send);
    free(recv);
    free(want);
    (*checks)++;
    return bad;
}

/* Several all_reduces in flight at once, waited in reverse order. */
static int check_async(ca_comm *c, int *checks) {
    int r = ca_comm_rank(c), w = ca_comm_size(c);
    enum { K = 6, N = 1000 };
    float *bufs[K];
    ca_work *works[K];
    for (int k = 0; k < K; k++) {
        bufs[k] = malloc(N * sizeof(float));
        if (!bufs[k]) return die(r, "malloc");
        for (int i = 0; i < N; i++) bufs[k][i] = (float)(val(r, (size_t)i) + k);
        if (ca_comm_all_reduce(c, bufs[k], bufs[k], N, CA_F32, CA_OP_SUM, &works[k]) != CA_OK)
            return die(r, "async all_reduce");
    }
    int bad = 0;
    for (int k = K - 1; k >= 0; k--) {
        if (ca_work_wait(works[k], -1) != CA_OK) bad = die(r, "ca_work_wait");
        ca_work_free(works[k]);
        for (int i = 0; i < N && !bad; i++) {
            long want = (long)k * w;
            for (int q = 0; q < w; q++) want += val(q, (size_t)i);
            if (bufs[k][i] != (float)want) {
                fprintf(stderr, "comm_check: FAILED on rank %d: async all_reduce %d element %d is %g, expected %ld\n",
                        r, k, i, bufs[k][i], want);
                bad = 1;
            }
        }
        free(bufs[k]);
    }
    (*checks)++;
    return bad;
}

static int correctness(ca_comm *c, const opts *o) {
    int r = ca_comm_rank(c), w = ca_comm_size(c), checks = 0, bad = 0;
    double t0 = now_s();
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0] && !bad; d++) {
        ca_dtype dt = dtypes[d];
        size_t es = ca_dtype_size(dt), big = ((size_t)o->large_mib << 20) / es;
        size_t sizes[] = {0, 1, 97, big};
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0] && !bad; k++) {
            size_t n = sizes[k];
            if (n == big && o->large_mib <= 0) continue;
            for (size_t p = 0; p < sizeof ops / sizeof ops[0] && !bad; p++) {
                bad |= check_all_reduce(c, dt, ops[p], n, false, &checks);
                /* reduce_scatter: the largest buffer (the input) is n elements */
                size_t per = (n + (size_t)w - 1) / (size_t)w;
                if (!bad) bad |= check_reduce_scatter(c, dt, ops[p], n == 0 ? 0 : (n == big ? per : n), false, &checks);
            }
            if (!bad) bad |= check_broadcast(c, dt, n, (int)(k % (size_t)w), &checks);
            size_t per = n == big ? (n + (size_t)w - 1) / (size_t)w : n;
            if (!bad) bad |= check_all_gather(c, dt, per, false, &checks);
            if (n == 97 && !bad) {
                bad |= check_all_reduce(c, dt, CA_OP_SUM, n, true, &checks);
                if (!bad) bad |= check_all_gather(c, dt, n, true, &checks);
                if (!bad) bad |= check_reduce_scatter(c, dt, CA_OP_MAX, n, true, &checks);
            }
        }
    }
    if (!bad) bad |= check_async(c, &checks);
    if (!bad && ca_comm_barrier(c, NULL) != CA_OK) bad = die(r, "barrier");
    uint64_t seq = ca_comm_seq(c);
    if (!bad)
        printf("comm_check: OK rank %d of %d, backend %s: %d checks, %llu collectives, %.1f s\n", r, w,
               ca_comm_backend(c), checks, (unsigned long long)seq, now_s() - t0);
    return bad;
}

/* ------------------------------------------------------------- failures */

static int desync(ca_comm *c) {
    int r = ca_comm_rank(c);
    float x[16] = {0};
    for (int i = 0; i < 3; i++)
        if (ca_comm_all_reduce(c, x, x, 16, CA_F32, CA_OP_SUM, NULL) != CA_OK) return die(r, "warm-up all_reduce");
    double t0 = now_s();
    ca_status s = r == 0 ? ca_comm_barrier(c, NULL) : ca_comm_all_reduce(c, x, x, 16, CA_F32, CA_OP_SUM, NULL);
    double dt = now_s() - t0;
    const char *m = ca_last_error();
    if (s == CA_OK) {
        fprintf(stderr, "comm_check: FAILED on rank %d: the mismatched collective succeeded\n", r);
        return 1;
    }
    bool named = strstr(m, "mismatch") && strstr(m, "barrier") && strstr(m, "all_reduce") && strstr(m, "#3");
    printf("comm_check: %s rank %d failed after %.2f s (%s): %s\n", named ? "EXPECTED" : "UNEXPECTED", r, dt,
           ca_status_name(s), m);
    fflush(stdout);
    /* stay a while, so that the launcher (or mpirun, when this rank exits) does not stop the others
     * before they report: on a loaded 2-CPU machine a rank once took more than 2 s to */
    sleep(5);
    /* every later call fails at once */
    if (ca_comm_barrier(c, NULL) == CA_OK) {
        fprintf(stderr, "comm_check: FAILED on rank %d: a barrier after the failure succeeded\n", r);
        return 1;
    }
    return named ? 0 : 1;
}

static int timeout_mode(ca_comm *c, const opts *o) {
    int r = ca_comm_rank(c), w = ca_comm_size(c), late = w - 1;
    float x[16] = {0};
    for (int i = 0; i < 2; i++)
        if (ca_comm_all_reduce(c, x, x, 16, CA_F32, CA_OP_SUM, NULL) != CA_OK) return die(r, "warm-up all_reduce");
    if (r == late) usleep((useconds_t)o->sleep_ms * 1000);
    double t0 = now_s();
    ca_status s = ca_comm_all_reduce(c, x, x, 16, CA_F32, CA_OP_SUM, NULL);
    double dt = now_s() - t0;
    const char *m = ca_last_error();
    if (s == CA_OK) {
        fprintf(stderr, "comm_check: FAILED on rank %d: the all_reduce succeeded\n", r);
        return 1;
    }
    char late_rank[32];
    snprintf(late_rank, sizeof late_rank, "rank %d ", late);
    bool named;
    if (r == late) named = s == CA_ERR_PEER || s == CA_ERR_TIMEOUT;
    else named = s == CA_ERR_TIMEOUT && strstr(m, "all_reduce #2") && strstr(m, late_rank) &&
                 strstr(m, "timed out") && dt < (double)o->timeout_ms / 1000.0 + 5.0;
    printf("comm_check: %s rank %d failed after %.2f s (%s): %s\n", named ? "EXPECTED" : "UNEXPECTED", r, dt,
           ca_status_name(s), m);
    fflush(stdout);
    if (r != late) sleep(1);
    return named ? 0 : 1;
}

static int exit_mode(ca_comm *c) {
    int r = ca_comm_rank(c), w = ca_comm_size(c);
    if (ca_comm_barrier(c, NULL) != CA_OK) return die(r, "barrier");
    if (r == w - 1) {
        printf("comm_check: rank %d exits with code 7\n", r);
        fflush(stdout);
        _exit(7);
    }
    float x[16] = {0};
    for (;;)
        if (ca_comm_all_reduce(c, x, x, 16, CA_F32, CA_OP_SUM, NULL) != CA_OK) return die(r, "all_reduce");
}

/* Now, in ms since the epoch: when a fault happened, for the scripts to time the job's end from it. */
static double epoch_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* The victim leaves (exit1-mid, exit0-early, kill9); the others must fail
 * fast, naming it. Returns -1 when this rank is the victim and should return
 * 0 from main without destroying the communicator again. */
static int leave_mode(ca_comm *c, const opts *o) {
    int r = ca_comm_rank(c), w = ca_comm_size(c), victim = o->victim >= 0 ? o->victim : w - 1;
    float x[16] = {0};
    for (int i = 0; i < 3; i++)
        if (ca_comm_all_reduce(c, x, x, 16, CA_F32, CA_OP_SUM, NULL) != CA_OK) return die(r, "warm-up all_reduce");
    if (r == victim) {
        printf("comm_check: rank %d leaves (%s) after collective #2, at %.0f ms\n", r, o->mode, epoch_ms());
        fflush(stdout);
        if (strcmp(o->mode, "exit1-mid") == 0) exit(1);
        if (strcmp(o->mode, "kill9") == 0) raise(SIGKILL);
        ca_comm_destroy(c);
        return -1;
    }
    double t0 = now_s();
    ca_status s = CA_OK;
    /* exit1-mid: training goes on until the failure surfaces */
    for (int i = 0; s == CA_OK && i < 1000000; i++) {
        s = ca_comm_all_reduce(c, x, x, 16, CA_F32, CA_OP_SUM, NULL);
        if (strcmp(o->mode, "exit0-early") == 0) break;
    }
    double dt = now_s() - t0;
    const char *m = ca_last_error();
    if (s == CA_OK) {
        fprintf(stderr, "comm_check: FAILED on rank %d: the all_reduce succeeded without rank %d\n", r, victim);
        return 1;
    }
    char who[64];
    snprintf(who, sizeof who, "rank %d ", victim);
    bool named = s == CA_ERR_PEER && (strstr(m, who) || (victim == 0 && strstr(m, "(rank 0) is gone")));
    printf("comm_check: %s rank %d failed after %.2f s (%s): %s\n", named ? "EXPECTED" : "UNEXPECTED", r, dt,
           ca_status_name(s), m);
    fflush(stdout);
    return named ? o->fail_code : 1;
}

/* ------------------------------------------------------------- point-to-point */

/* Element i of the payload rank r sends in round k. */
static float p2p_val(int r, int k, size_t i) { return (float)((int)((i * 5 + (size_t)r * 31 + (size_t)k * 7) % 101) - 50); }

static int p2p_expect(int me, const float *got, size_t n, int from, int k) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != p2p_val(from, k, i)) {
            fprintf(stderr, "comm_check: FAILED on rank %d: round %d element %zu from rank %d: %g, expected %g\n", me,
                    k, i, from, (double)got[i], (double)p2p_val(from, k, i));
            return 1;
        }
    return 0;
}

static int p2p_mode(ca_comm *c, const opts *o) {
    int r = ca_comm_rank(c), w = ca_comm_size(c), right = (r + 1) % w, left = (r + w - 1) % w;
    size_t sizes[] = {0, 1, 97, (size_t)o->large_mib * (1u << 20) / sizeof(float)}, big = sizes[3];
    float *out = malloc(sizeof(float) * (big + 1)), *in = malloc(sizeof(float) * (big + 1));
    if (!out || !in) return die(r, "malloc");
    int k = 0, bad = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes && !bad; si++)
        for (int async = 0; async < 2 && !bad; async++, k++) {
            size_t n = sizes[si];
            for (size_t i = 0; i < n; i++) out[i] = p2p_val(r, k, i);
            ca_work *wk = NULL;
            ca_status s = ca_comm_sendrecv(c, out, n, right, in, n, left, CA_F32, async ? &wk : NULL);
            if (s == CA_OK && async) s = ca_work_wait(wk, -1);
            ca_work_free(wk);
            if (s != CA_OK) return die(r, "sendrecv");
            bad = p2p_expect(r, in, n, left, k);
        }
    /* one-sided: even ranks send to the right, odd ranks receive from the left (an odd world's last
     * rank sends to rank 0, which receives nothing: it stays out) */
    size_t n = 97;
    k++;
    for (size_t i = 0; i < n; i++) out[i] = p2p_val(r, k, i);
    ca_status s = CA_OK;
    if (r % 2 == 0 && right % 2 == 1) s = ca_comm_send(c, out, n, CA_F32, right, NULL);
    else if (r % 2 == 1) s = ca_comm_recv(c, in, n, CA_F32, left, NULL);
    if (s != CA_OK) return die(r, "send / recv");
    if (r % 2 == 1 && !bad) bad = p2p_expect(r, in, n, left, k);
    /* a shift to the left by a send and a recv in flight together, issued in either order */
    k++;
    for (size_t i = 0; i < n; i++) out[i] = p2p_val(r, k, i);
    ca_work *a = NULL, *b = NULL;
    if (r % 2 == 0) {
        s = ca_comm_send(c, out, n, CA_F32, left, &a);
        if (s == CA_OK) s = ca_comm_recv(c, in, n, CA_F32, right, &b);
    } else {
        s = ca_comm_recv(c, in, n, CA_F32, right, &b);
        if (s == CA_OK) s = ca_comm_send(c, out, n, CA_F32, left, &a);
    }
    if (s == CA_OK) s = ca_work_wait(b, -1);
    if (s == CA_OK) s = ca_work_wait(a, -1);
    ca_work_free(a);
    ca_work_free(b);
    if (s != CA_OK) return die(r, "send / recv in flight together");
    if (!bad) bad = p2p_expect(r, in, n, right, k);
    /* the refusals: a rank outside the communicator, this rank as one end only */
    if (ca_comm_send(c, out, 1, CA_F32, w, NULL) != CA_ERR_INVALID || !strstr(ca_last_error(), "is not a rank"))
        return die(r, "a send to a rank outside the communicator was not refused");
    if (ca_comm_sendrecv(c, out, 1, r, in, 1, left, CA_F32, NULL) != CA_ERR_INVALID)
        return die(r, "a send to itself with a receive from another was not refused");
    uint64_t sent = ca_comm_bytes(c);
    free(out);
    free(in);
    if (bad) return 1;
    printf("comm_check: OK p2p rank %d of %d backend %s (%d rounds, %llu bytes sent)\n", r, w, ca_comm_backend(c), k + 1,
           (unsigned long long)sent);
    return 0;
}

/* The victim dies (p2p-kill) or is late (p2p-late) after two ring shifts; the others shift on and must
 * fail naming it: its death, or the timeout of the shift it did not reach. */
/* One ring shift of 64 floats; on the lazy device a node of its graph, run at once. */
static ca_status shift64(ca_comm *c, const opts *o, const void *x, void *y) {
    int r = ca_comm_rank(c), w = ca_comm_size(c);
    ca_status s = ca_comm_sendrecv(c, x, 64, (r + 1) % w, y, 64, (r + w - 1) % w, CA_F32, NULL);
    return s == CA_OK && o->dev ? ca_device_synchronize(o->dev) : s;
}

static int p2p_kill_mode(ca_comm *c, const opts *o) {
    int r = ca_comm_rank(c), w = ca_comm_size(c), victim = o->victim >= 0 ? o->victim : w - 1;
    bool late = strcmp(o->mode, "p2p-late") == 0;
    float hx[64] = {0}, hy[64];
    void *x = hx, *y = hy;
    if (o->dev && (ca_device_alloc(o->dev, sizeof hx, &x) != CA_OK || ca_device_alloc(o->dev, sizeof hy, &y) != CA_OK ||
                   ca_device_copy_from_host(o->dev, x, hx, sizeof hx) != CA_OK))
        return die(r, "device buffers");
    for (int i = 0; i < 2; i++)
        if (shift64(c, o, x, y) != CA_OK) return die(r, "warm-up sendrecv");
    if (late && r == victim) {
        usleep((useconds_t)o->sleep_ms * 1000);
        ca_status s = shift64(c, o, x, y);
        printf("comm_check: %s late rank %d (%s): %s\n", s != CA_OK ? "EXPECTED" : "UNEXPECTED", r, ca_status_name(s),
               s != CA_OK ? ca_last_error() : "succeeded");
        return s != CA_OK ? 0 : 1;
    }
    if (!late && r == victim) {
        printf("comm_check: rank %d dies after two ring shifts\n", r);
        fflush(stdout);
        raise(SIGKILL);
    }
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && i < 1000000; i++) s = shift64(c, o, x, y);
    const char *m = ca_last_error();
    char who[64];
    snprintf(who, sizeof who, "rank %d ", victim);
    bool named = s != CA_OK && strstr(m, who) && strstr(m, "sendrecv") && (!late || s == CA_ERR_TIMEOUT) &&
                 (!o->dev || strstr(m, "xla: running node"));   /* on the lazy device: as a node of its graph */
    printf("comm_check: %s rank %d failed (%s): %s\n", named ? "EXPECTED" : "UNEXPECTED", r, ca_status_name(s), m);
    return named ? o->fail_code : 1;
}

static ca_xla_metrics xla_metrics(ca_device *d) {
    ca_xla_metrics m = {0};
    (void)ca_xla_metrics_get(d, &m);
    return m;
}

/* Round k's payload (n floats) to rank `to`, rank `from`'s into a tensor doubled by a kernel recorded
 * after the sendrecv, in a graph of its own: nothing may run at the calls; the read runs the graph. */
static int lazy_shift(ca_comm *c, ca_device *d, int k, size_t n, int to, int from) {
    int r = ca_comm_rank(c), bad = 0;
    float *h = malloc(sizeof(float) * (n + 1));
    if (!h) return die(r, "malloc");
    for (size_t i = 0; i < n; i++) h[i] = p2p_val(r, k, i);
    CA_SCOPE {
        ca_tensor *x = ca_from_host(d, CA_F32, 1, (int64_t[]){(int64_t)n}, h);
        ca_tensor *y = ca_empty(d, CA_F32, 1, (int64_t[]){(int64_t)n});
        uint64_t graphs = xla_metrics(d).graphs;
        ca_work *w = NULL;
        ca_status s = x && y ? ca_comm_sendrecv(c, ca_tensor_data(x), n, to, ca_tensor_data(y), n, from, CA_F32, &w)
                             : ca_last_status();
        if (s == CA_OK) s = ca_work_test(w);   /* complete at once: later device work sees the result */
        ca_work_free(w);
        ca_tensor *z = ca_add(y, y);
        if (s != CA_OK || !z) bad = die(r, "recording a sendrecv on the lazy device");
        else if (xla_metrics(d).graphs != graphs) bad = die(r, "a sendrecv on the lazy device ran its graph at the call");
        else if (ca_tensor_to_host(z, h, sizeof(float) * n) != CA_OK) bad = die(r, "the graph of a sendrecv");
        for (size_t i = 0; !bad && i < n; i++) h[i] /= 2;
        if (!bad) bad = p2p_expect(r, h, n, from, k);
    }
    free(h);
    return bad;
}

static int p2p_lazy_mode(ca_comm *c, const opts *o) {
    ca_device *d = o->dev;
    int r = ca_comm_rank(c), w = ca_comm_size(c), right = (r + 1) % w, left = (r + w - 1) % w;
    if (ca_xla_metrics_reset(d) != CA_OK) return die(r, "xla metrics");
    /* compiles after each shift: right, right again (cached), left (other peers), right of another size */
    int bad = lazy_shift(c, d, 0, 97, right, left);
    uint64_t c0 = xla_metrics(d).compiles;
    if (!bad) bad = lazy_shift(c, d, 1, 97, right, left);
    uint64_t c1 = xla_metrics(d).compiles;
    if (!bad) bad = lazy_shift(c, d, 2, 97, left, right);
    uint64_t c2 = xla_metrics(d).compiles;
    if (!bad) bad = lazy_shift(c, d, 3, 98, right, left);
    ca_xla_metrics m = xla_metrics(d);
    if (bad) return 1;
    /* one-sided, as p2p: even ranks send right, odd ones receive from the left */
    size_t n = 97;
    float *h = malloc(sizeof(float) * n);
    if (!h) return die(r, "malloc");
    for (size_t i = 0; i < n; i++) h[i] = p2p_val(r, 4, i);
    CA_SCOPE {
        ca_tensor *t = ca_from_host(d, CA_F32, 1, (int64_t[]){(int64_t)n}, h);
        ca_status s = t ? CA_OK : ca_last_status();
        if (s == CA_OK && r % 2 == 0 && right % 2 == 1) s = ca_comm_send(c, ca_tensor_data(t), n, CA_F32, right, NULL);
        else if (s == CA_OK && r % 2 == 1) s = ca_comm_recv(c, ca_tensor_data(t), n, CA_F32, left, NULL);
        if (s == CA_OK) s = ca_tensor_to_host(t, h, sizeof(float) * n);
        if (s != CA_OK) bad = die(r, "send / recv on the lazy device");
        else if (r % 2 == 1) bad = p2p_expect(r, h, n, left, 4);
    }
    free(h);
    if (bad) return 1;
    printf("comm_check: OK p2p-lazy rank %d of %d backend %s (%llu sendrecv in the graph; compiles: the same shift "
           "%llu, the other side %llu, another size %llu)\n", r, w, ca_comm_backend(c),
           (unsigned long long)m.collectives_in_graph, (unsigned long long)(c1 - c0), (unsigned long long)(c2 - c1),
           (unsigned long long)(m.compiles - c2));
    return 0;
}

/* Colors by parity (the last rank of an odd world joins none), keys reversed: each group orders its
 * ranks backwards and sums its own members only; then a second split (all in one group) and the
 * parent still agree. As HYBRID_SHARD splits: within a machine, and across. */
static int split_mode(ca_comm *c) {
    int r = ca_comm_rank(c), w = ca_comm_size(c);
    int color = (w % 2 && r == w - 1) ? -1 : r % 2;
    ca_comm *g = NULL, *all = NULL;
    if (ca_comm_split(c, color, w - r, &g) != CA_OK) return die(r, "ca_comm_split");
    int want_rank = 0, want_size = 0;
    float want = 0.0f;
    for (int q = r % 2; color >= 0 && q < w - (w % 2); q += 2) {
        want_size++;
        want_rank += q > r;
        want += (float)(q + 1);
    }
    float v = (float)(r + 1), one = 1.0f;
    if (color < 0 ? g != NULL : !g) return die(r, "ca_comm_split: a group for a negative color, or none");
    if (g && ca_comm_all_reduce(g, &v, &v, 1, CA_F32, CA_OP_SUM, NULL) != CA_OK) return die(r, "group all_reduce");
    if (ca_comm_split(c, 7, r, &all) != CA_OK) return die(r, "second ca_comm_split");
    if (ca_comm_all_reduce(all, &one, &one, 1, CA_F32, CA_OP_SUM, NULL) != CA_OK) return die(r, "all_reduce");
    bool ok = one == (float)w && ca_comm_rank(all) == r &&
              (!g || (ca_comm_rank(g) == want_rank && ca_comm_size(g) == want_size && v == want));
    printf("comm_check: %s split rank %d: group rank %d of %d (want %d of %d), sum %g (want %g), whole %g\n",
           ok ? "OK" : "FAILED", r, g ? ca_comm_rank(g) : -1, g ? ca_comm_size(g) : 0, want_rank, want_size,
           (double)v, (double)want, (double)one);
    ca_comm_destroy(g);
    ca_comm_destroy(all);
    return ok ? 0 : 1;
}

static void inject(const opts *o, int r) {
    printf("comm_check: rank %d injects %s at step %d, at %.0f ms\n", r, o->fault, o->step, epoch_ms());
    fflush(stdout);
    if (!strcmp(o->fault, "kill9")) raise(SIGKILL);
    else if (!strcmp(o->fault, "stop")) raise(SIGSTOP);
    else if (!strcmp(o->fault, "exit0")) exit(0);
    else if (!strcmp(o->fault, "exit1")) exit(1);
    else if (!strcmp(o->fault, "abort")) abort();
    else if (!strcmp(o->fault, "segv")) raise(SIGSEGV);   /* as a bad access delivers it, without UB */
    else if (!strcmp(o->fault, "bus")) raise(SIGBUS);     /* a truncated mapped file's page */
    else if (!strcmp(o->fault, "fpe")) raise(SIGFPE);     /* an integer division by zero */
    else if (!strcmp(o->fault, "ill")) raise(SIGILL);     /* an instruction this CPU lacks */
}

/* --kernels: one kernel call a step (its tensors end with the scope). */
static void step_kernel(void) {
    ca_scope *sc = ca_scope_begin();
    int64_t sa[2] = {4, 8}, sb[2] = {8, 2};
    ca_matmul(ca_full(ca_cpu_device(), CA_F32, 2, sa, 1.0), ca_full(ca_cpu_device(), CA_F32, 2, sb, 2.0));
    ca_scope_end(sc);
}

/* A fault at a chosen step (tests/dist/faults.sh): the others reduce until the failure surfaces. */
static int fault_mode(ca_comm *c, const opts *o) {
    int r = ca_comm_rank(c), w = ca_comm_size(c), victim = o->victim >= 0 ? o->victim : w - 1;
    float x[16] = {0};
    ca_status s = CA_OK;
    int i = 0;
    for (; s == CA_OK; i++) {
        if (r == victim && i == o->step) inject(o, r);
        if (o->kernels) step_kernel();
        s = ca_comm_all_reduce(c, x, x, 16, CA_F32, CA_OP_SUM, NULL);
    }
    const char *m = ca_last_error();
    if (r == victim) {   /* continued after SIGSTOP: the job went on without it */
        printf("comm_check: rank %d, continued, failed at step %d (%s): %s\n", r, i - 1, ca_status_name(s), m);
        return 5;
    }
    char who[64];
    snprintf(who, sizeof who, "rank %d", victim);
    /* a stopped rank is alive: the collective timeout names it among the ranks that did not arrive */
    const char *p = strstr(m, who);
    bool named = (s == CA_ERR_PEER || s == CA_ERR_TIMEOUT) && p && (p[strlen(who)] < '0' || p[strlen(who)] > '9');
    named = named || (s == CA_ERR_PEER && victim == 0 && strstr(m, "(rank 0) is gone"));
    printf("comm_check: %s rank %d failed at step %d (%s): %s\n", named ? "EXPECTED" : "UNEXPECTED", r, i - 1,
           ca_status_name(s), m);
    return named ? o->fail_code : 1;
}

static int last_bcast_mode(ca_comm *c) {
    int r = ca_comm_rank(c), w = ca_comm_size(c), checks = 0;
    float x[16] = {0};
    for (int i = 0; i < 2; i++)
        if (ca_comm_all_reduce(c, x, x, 16, CA_F32, CA_OP_SUM, NULL) != CA_OK) return die(r, "warm-up all_reduce");
    if (check_broadcast(c, CA_F32, 97, 0, &checks)) return 1;
    printf("comm_check: OK rank %d of %d: its last collective, broadcast #%llu, done; exiting\n", r, w,
           (unsigned long long)(ca_comm_seq(c) - 1));
    double t0 = now_s();
    ca_comm_destroy(c);
    printf("comm_check: rank %d destroyed its communicator in %.1f s\n", r, now_s() - t0);
    return -1;
}

/* Waits at most 120 s for `path` to exist (the test's go-ahead); false when it does not. */
static bool wait_file(const char *path) {
    for (int i = 0; access(path, F_OK) != 0; i++) {
        if (i >= 120 * 50) return false;
        usleep(20 * 1000);
    }
    return true;
}

/* The program's own SIGUSR1 handler, installed before the communicator (and its flight recorder):
 * the recorder's handler must call it after its dump. */
static volatile sig_atomic_t g_own_usr1;
static void own_usr1(int sig) {
    (void)sig;
    g_own_usr1++;
}

/* A dump on demand (SIGUSR1) while the job runs: the rank goes on and completes its next collective. */
static int ondemand_mode(ca_comm *c, const opts *o) {
    int r = ca_comm_rank(c);
    float x[16] = {0};
    if (ca_comm_all_reduce(c, x, x, 16, CA_F32, CA_OP_SUM, NULL) != CA_OK) return die(r, "first all_reduce");
    printf("comm_check: rank %d (pid %ld) completed all_reduce #0\n", r, (long)getpid());
    fflush(stdout);
    if (!o->resume || !wait_file(o->resume)) return die(r, "--resume FILE did not appear within 120 s");
    if (ca_comm_all_reduce(c, x, x, 16, CA_F32, CA_OP_SUM, NULL) != CA_OK) return die(r, "second all_reduce");
    printf("comm_check: OK rank %d went on after its dump; its own SIGUSR1 handler ran %d times\n", r,
           (int)g_own_usr1);
    return 0;
}

/* --gate: the rank as the launcher numbers it (the communicator does not exist yet) */
static int pass_gate(const char *gate) {
    const char *rk = getenv("RANK") ? getenv("RANK") : "?";
    printf("comm_check: rank %s at the gate\n", rk);
    for (int i = 0; access(gate, F_OK) != 0; i++) {
        if (i >= 300 * 50) {
            fprintf(stderr, "comm_check: FAILED on rank %s: the gate %s did not open within 300 s\n", rk, gate);
            return 1;
        }
        usleep(20 * 1000);
    }
    return 0;
}

/* Opens device `name`: "xla38" is the lazy xla device registered again with its table cut to ABI 3.8's
 * fields (the registry reads what a 3.8 plugin lacks as NULL). */
static ca_status open_device(const char *name, ca_device **out) {
    if (strcmp(name, "xla38") != 0) return ca_device_open(name, 0, NULL, out);
    static ca_device_ops old;
    static const ca_device_ops *devs[1];
    static ca_plugin p;
    ca_device *x;
    ca_status s = ca_device_open("xla", 0, NULL, &x);
    if (s != CA_OK) return s;
    old = *ca_device_ops_of(x);
    old.name = "xla38";
    old.struct_size = offsetof(ca_device_ops, enqueue_host_fn_keyed);
    devs[0] = &old;
    p = (ca_plugin){.struct_size = sizeof p, .abi_version = CA_ABI_VERSION, .name = "xla38", .version = "test",
                    .num_devices = 1, .devices = devs};
    if ((s = ca_register_plugin(&p, "comm_check")) != CA_OK) return s;
    return ca_device_open("xla38", 0, NULL, out);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    opts o = {.mode = "correctness", .large_mib = 16, .sleep_ms = 6000, .victim = -1, .fault = "kill9"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--backend") == 0 && v) o.backend = argv[++i];
        else if (strcmp(a, "--mode") == 0 && v) o.mode = argv[++i];
        else if (strcmp(a, "--timeout-ms") == 0 && v) o.timeout_ms = atoll(argv[++i]);
        else if (strcmp(a, "--large-mib") == 0 && v) o.large_mib = atoi(argv[++i]);
        else if (strcmp(a, "--sleep-ms") == 0 && v) o.sleep_ms = atoi(argv[++i]);
        else if (strcmp(a, "--victim") == 0 && v) o.victim = atoi(argv[++i]);
        else if (strcmp(a, "--fail-code") == 0 && v) o.fail_code = atoi(argv[++i]);
        else if (strcmp(a, "--fault") == 0 && v) o.fault = argv[++i];
        else if (strcmp(a, "--step") == 0 && v) o.step = atoi(argv[++i]);
        else if (strcmp(a, "--gate") == 0 && v) o.gate = argv[++i];
        else if (strcmp(a, "--debug") == 0) o.debug = true;
        else if (strcmp(a, "--kernels") == 0) o.kernels = true;
        else if (strcmp(a, "--resume") == 0 && v) o.resume = argv[++i];
        else if (strcmp(a, "--tag") == 0 && v) i++;   /* a marker for the scripts' pgrep */
        else if (strcmp(a, "--device") == 0 && v) {
            if (open_device(argv[++i], &o.dev) != CA_OK) return die(-1, "ca_device_open");
        }
        else {
            fprintf(stderr, "comm_check: unknown argument %s\n", a);
            return 2;
        }
    }
    if (strcmp(o.mode, "badtoken") == 0) {
        const char *rk = getenv("RANK");
        if (rk && atoi(rk) == 1) setenv("CACCEL_JOB_TOKEN", "not-the-job-token", 1);
    }
    if (o.gate && pass_gate(o.gate)) return 1;
    if (strcmp(o.mode, "ondemand") == 0) signal(SIGUSR1, own_usr1);
    ca_comm *c = NULL;
    if (strcmp(o.mode, "p2p-lazy") == 0 && !o.dev && ca_device_open("xla", 0, NULL, &o.dev) != CA_OK)
        return die(-1, "ca_device_open(xla)");
    ca_comm_options co = {.backend = o.backend, .timeout_ms = o.timeout_ms, .debug = o.debug, .device = o.dev};
    ca_status s = ca_comm_create(&co, &c);
    if (strcmp(o.mode, "badtoken") == 0) {
        const char *rk = getenv("RANK");
        int r = rk ? atoi(rk) : -1;
        if (r == 1) {
            bool ok = s == CA_ERR_PEER && strstr(ca_last_error(), "wrong job token");
            printf("comm_check: %s rank 1 was refused: %s\n", ok ? "EXPECTED" : "UNEXPECTED", ca_last_error());
            return ok ? 3 : 1;
        }
        if (s == CA_OK) {
            ca_comm_destroy(c);
            fprintf(stderr, "comm_check: rank %d joined although rank 1 could not\n", r);
            return 1;
        }
        printf("comm_check: rank %d could not form the communicator: %s\n", r, ca_last_error());
        return 4;
    }
    if (s != CA_OK) return die(-1, "ca_comm_create");
    int rc;
    if (strcmp(o.mode, "correctness") == 0) rc = correctness(c, &o);
    else if (strcmp(o.mode, "desync") == 0) rc = desync(c);
    else if (strcmp(o.mode, "split") == 0) rc = split_mode(c);
    else if (strcmp(o.mode, "timeout") == 0) rc = timeout_mode(c, &o);
    else if (strcmp(o.mode, "exit") == 0) rc = exit_mode(c);
    else if (strcmp(o.mode, "exit1-mid") == 0 || strcmp(o.mode, "exit0-early") == 0 || strcmp(o.mode, "kill9") == 0) {
        rc = leave_mode(c, &o);
        if (rc < 0) return 0;
    }
    else if (strcmp(o.mode, "fault") == 0) rc = fault_mode(c, &o);
    else if (strcmp(o.mode, "p2p") == 0) rc = p2p_mode(c, &o);
    else if (strcmp(o.mode, "p2p-kill") == 0 || strcmp(o.mode, "p2p-late") == 0) rc = p2p_kill_mode(c, &o);
    else if (strcmp(o.mode, "p2p-lazy") == 0) rc = p2p_lazy_mode(c, &o);
    else if (strcmp(o.mode, "ondemand") == 0) rc = ondemand_mode(c, &o);
    else if (strcmp(o.mode, "last-bcast") == 0) {
        rc = last_bcast_mode(c);
        if (rc < 0) return 0;
    }
    else if (strcmp(o.mode, "spin") == 0) {
        float x[16] = {0};
        /* the sign the tests act on: printed once an all_reduce has completed, not before the first one
         * (a job still connecting is not the job a signal, a cut link or a stopped rank should meet) */
        for (uint64_t i = 0; ca_comm_all_reduce(c, x, x, 16, CA_F32, CA_OP_SUM, NULL) == CA_OK; i++) {
            if (i == 0) printf("comm_check: rank %d spinning (all_reduce #0 done)\n", ca_comm_rank(c));
            usleep(1000);
        }
        rc = die(ca_comm_rank(c), "all_reduce");
    }
    else if (strcmp(o.mode, "sigpipe") == 0) {
        /* what a Gloo socket write meets when its peer has died: EPIPE, not a silent death */
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return die(ca_comm_rank(c), "socketpair");
        close(sv[1]);
        char byte = 0;
        struct iovec iov = {&byte, 1};
        ssize_t w = writev(sv[0], &iov, 1);
        printf("comm_check: rank %d: writev to a closed socket: %s\n", ca_comm_rank(c),
               w < 0 && errno == EPIPE ? "EPIPE" : "unexpected");
        close(sv[0]);
        rc = ca_comm_barrier(c, NULL) == CA_OK ? 0 : die(ca_comm_rank(c), "barrier");
    }
    else if (strcmp(o.mode, "env") == 0) {
        printf("comm_check: env rank %d of %d backend %s\n", ca_comm_rank(c), ca_comm_size(c), ca_comm_backend(c));
        rc = ca_comm_barrier(c, NULL) == CA_OK ? 0 : die(ca_comm_rank(c), "barrier");
    } else {
        fprintf(stderr, "comm_check: unknown mode %s\n", o.mode);
        rc = 2;
    }
    ca_comm_destroy(c);
    return rc;
}
