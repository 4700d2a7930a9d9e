/* `caccel test`: Accelerate's `accelerate test`. Runs a self-check under the configured launch
 * (`caccel launch [flags] <this caccel> test --worker`): every collective and dtype, RNG and
 * parameter sync across ranks, dataloader sharding, and a few training steps that must reduce the
 * loss. The main process prints one line per check and a verdict; any failed check on any rank
 * makes every process exit 1. */
#include "tools/cli_impl.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TS_COUNT 6   /* elements per rank in the collective checks */

typedef struct ts_run {
    ca_accelerator *acc;
    int rank, world, nchecks, nfailed;
} ts_run;

/* Every rank's verdict on one check, agreed (a failure anywhere fails it); printed by the main
 * process with the first failing rank's detail when it is rank 0's. */
static void ts_report(ts_run *r, const char *name, int ok, const char *detail) {
    int failed_here = !ok, failed = failed_here;
    CA_SCOPE {
        float v = (float)failed_here;
        ca_tensor *t = ca_from_host(ca_accelerator_device(r->acc), CA_F32, CA_SHAPE(1), &v);
        if (t && ca_reduce(r->acc, t, CA_OP_SUM) == CA_OK && ca_tensor_to_host(t, &v, sizeof v) == CA_OK)
            failed = v > 0;
        else
            failed = 1;
    }
    r->nchecks++;
    r->nfailed += failed;
    if (failed_here && !ca_is_main_process(r->acc))
        fprintf(stderr, "caccel test: rank %d: %s: %s\n", r->rank, name, detail ? detail : "failed");
    if (ca_is_main_process(r->acc))
        printf("  %-4s  %s%s%s\n", failed ? "FAIL" : "ok", name, failed && failed_here && detail ? ": " : "",
               failed && failed_here && detail ? detail : failed && !failed_here ? " (on another rank)" : "");
    fflush(stdout);
}

/* ---- collectives on host buffers ---- */

static size_t ts_size(ca_dtype dt) { return dt == CA_F16 || dt == CA_BF16 ? 2 : dt == CA_I64 ? 8 : 4; }

static uint16_t ts_half(float f) {   /* small integers only: exact */
    uint32_t u;
    memcpy(&u, &f, 4);
    if (!(u & 0x7fffffff)) return (uint16_t)(u >> 16);
    int e = (int)((u >> 23) & 0xff) - 127 + 15;
    return (uint16_t)((u >> 16 & 0x8000) | (unsigned)e << 10 | (u >> 13 & 0x3ff));
}

static double ts_get(const void *buf, ca_dtype dt, size_t i) {
    const unsigned char *p = (const unsigned char *)buf + i * ts_size(dt);
    float f;
    uint32_t u;
    uint16_t h;
    switch (dt) {
    case CA_F32: memcpy(&f, p, 4); return f;
    case CA_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case CA_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case CA_BF16: memcpy(&h, p, 2); u = (uint32_t)h << 16; memcpy(&f, &u, 4); return f;
    case CA_F16: {
        memcpy(&h, p, 2);
        int e = h >> 10 & 0x1f;
        double m = h & 0x3ff, v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
        return h & 0x8000 ? -v : v;
    }
    default: return NAN;
    }
}

static void ts_set(void *buf, ca_dtype dt, size_t i, double v) {
    unsigned char *p = (unsigned char *)buf + i * ts_size(dt);
    float f = (float)v;
    uint32_t u;
    uint16_t h;
    switch (dt) {
    case CA_F32: memcpy(p, &f, 4); break;
    case CA_I32: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
    case CA_I64: { int64_t x = (int64_t)v; memcpy(p, &x, 8); break; }
    case CA_BF16: memcpy(&u, &f, 4); h = (uint16_t)(u >> 16); memcpy(p, &h, 2); break;
    case CA_F16: h = ts_half(f); memcpy(p, &h, 2); break;
    default: break;
    }
}

/* Rank r's element i: (r + 1) * (i + 1), exact in every dtype for the worlds a test runs. */
static double ts_val(int r, size_t i) { return (double)(r + 1) * (double)(i + 1); }

static double ts_expect(ca_reduce_op op, int world, size_t i) {
    double sum = 0;
    for (int r = 0; r < world; r++) sum += ts_val(r, i);
    return op == CA_OP_SUM ? sum : op == CA_OP_MIN ? ts_val(0, i) : op == CA_OP_MAX ? ts_val(world - 1, i)
                                                                                      : sum / world;
}

static void ts_all_reduce(ts_run *r, ca_comm *c, ca_dtype dt, ca_reduce_op op) {
    unsigned char send[TS_COUNT * 8], recv[TS_COUNT * 8];
    char name[96], detail[160] = "";
    for (size_t i = 0; i < TS_COUNT; i++) ts_set(send, dt, i, ts_val(r->rank, i));
    ca_status s = ca_comm_all_reduce(c, send, recv, TS_COUNT, dt, op, NULL);
    int ok = s == CA_OK;
    if (!ok) snprintf(detail, sizeof detail, "%s", ca_last_error());
    for (size_t i = 0; ok && i < TS_COUNT; i++) {
        double want = ts_expect(op, r->world, i);
        if (dt == CA_I32 || dt == CA_I64) want = trunc(want);
        if (fabs(ts_get(recv, dt, i) - want) > 1e-2 * fabs(want)) {
            ok = 0;
            snprintf(detail, sizeof detail, "element %zu is %g, expected %g", i, ts_get(recv, dt, i), want);
        }
    }
    snprintf(name, sizeof name, "all_reduce %s %s", ca_reduce_op_name(op), ca_dtype_name(dt));
    ca_clear_error();
    ts_report(r, name, ok, detail);
}

static void ts_gather_bcast(ts_run *r, ca_comm *c, ca_dtype dt) {
    size_t n = TS_COUNT, w = (size_t)r->world, es = ts_size(dt);
    unsigned char *send = malloc(n * es), *recv = malloc(n * es * w), *scat = malloc(n * es * w);
    char name[96], detail[160] = "";
    int ok = send && recv && scat;
    for (size_t i = 0; ok && i < n; i++) ts_set(send, dt, i, ts_val(r->rank, i));
    /* all_gather: rank q's block holds q's values */
    ca_status s = ok ? ca_comm_all_gather(c, send, recv, n, dt, NULL) : CA_ERR_NOMEM;
    ok = s == CA_OK;
    for (size_t q = 0; ok && q < w; q++)
        for (size_t i = 0; ok && i < n; i++)
            if (ts_get(recv, dt, q * n + i) != ts_val((int)q, i))
                ok = 0, snprintf(detail, sizeof detail, "rank %zu's element %zu is %g", q, i, ts_get(recv, dt, q * n + i));
    if (s != CA_OK) snprintf(detail, sizeof detail, "%s", ca_last_error());
    snprintf(name, sizeof name, "all_gather %s", ca_dtype_name(dt));
    ca_clear_error();
    ts_report(r, name, ok, detail);

    /* broadcast from the last rank */
    detail[0] = '\0';
    s = ca_comm_broadcast(c, send, n, dt, r->world - 1, NULL);
    ok = s == CA_OK;
    for (size_t i = 0; ok && i < n; i++)
        if (ts_get(send, dt, i) != ts_val(r->world - 1, i)) ok = 0, snprintf(detail, sizeof detail, "element %zu differs", i);
    if (s != CA_OK) snprintf(detail, sizeof detail, "%s", ca_last_error());
    snprintf(name, sizeof name, "broadcast %s from rank %d", ca_dtype_name(dt), r->world - 1);
    ca_clear_error();
    ts_report(r, name, ok, detail);

    /* reduce_scatter (sum): rank q gets block q of the sum of every rank's w*n values */
    detail[0] = '\0';
    for (size_t k = 0; k < w * n; k++) ts_set(scat, dt, k, ts_val(r->rank, k % n));
    s = ca_comm_reduce_scatter(c, scat, recv, n, dt, CA_OP_SUM, NULL);
    ok = s == CA_OK;
    for (size_t i = 0; ok && i < n; i++)
        if (ts_get(recv, dt, i) != ts_expect(CA_OP_SUM, r->world, i))
            ok = 0, snprintf(detail, sizeof detail, "element %zu is %g", i, ts_get(recv, dt, i));
    if (s != CA_OK) snprintf(detail, sizeof detail, "%s", ca_last_error());
    snprintf(name, sizeof name, "reduce_scatter sum %s", ca_dtype_name(dt));
    ca_clear_error();
    ts_report(r, name, ok, detail);
    free(send), free(recv), free(scat);
}

static void ts_collectives(ts_run *r) {
    ca_comm *c = ca_accelerator_comm(r->acc);
    if (ca_device_kind_of(ca_accelerator_device(r->acc)) != CA_DEVICE_HOST) {
        if (ca_is_main_process(r->acc))
            printf("  skip  communicator collectives on host buffers (device %s: the accelerator's are checked)\n",
                   ca_device_name(ca_accelerator_device(r->acc)));
        return;
    }
    static const ca_dtype dts[] = {CA_F32, CA_F16, CA_BF16, CA_I32, CA_I64};
    static const ca_reduce_op ops[] = {CA_OP_SUM, CA_OP_AVG, CA_OP_MIN, CA_OP_MAX};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
            if (!(ops[o] == CA_OP_AVG && (dts[d] == CA_I32 || dts[d] == CA_I64))) ts_all_reduce(r, c, dts[d], ops[o]);
        ts_gather_bcast(r, c, dts[d]);
    }
    ca_status s = ca_comm_barrier(c, NULL);
    ts_report(r, "barrier", s == CA_OK, ca_last_error());
    ca_clear_error();
}

/* ---- the accelerator's helpers, RNG and parameter sync ---- */

/* Whether every rank's copy of t (on the device) is the same as rank 0's. */
static int ts_same_everywhere(ts_run *r, ca_tensor *t, char *detail, size_t len) {
    int ok = 1;
    CA_SCOPE {
        ca_tensor *g = ca_gather(r->acc, t);
        int64_t n = ca_tensor_numel(t);
        float *h = g ? malloc(ca_tensor_nbytes(g)) : NULL;
        if (!h || ca_tensor_to_host(g, h, ca_tensor_nbytes(g)) != CA_OK) {
            ok = 0;
            snprintf(detail, len, "gather failed: %s", ca_last_error());
        }
        for (int q = 1; ok && q < r->world; q++)
            if (memcmp(h, h + q * n, (size_t)n * sizeof *h) != 0) ok = 0, snprintf(detail, len, "rank %d differs from rank 0", q);
        free(h);
    }
    return ok;
}

static void ts_helpers(ts_run *r) {
    ca_device *dev = ca_accelerator_device(r->acc);
    char detail[200] = "";
    CA_SCOPE {
        float v[3] = {(float)r->rank + 1, 2, 3}, out[3] = {0};
        ca_tensor *t = ca_from_host(dev, CA_F32, CA_SHAPE(3), v);
        int ok = t && ca_reduce(r->acc, t, CA_OP_SUM) == CA_OK && ca_tensor_to_host(t, out, sizeof out) == CA_OK &&
                 out[0] == (float)(r->world * (r->world + 1) / 2) && out[1] == 2.0f * r->world;
        ts_report(r, "accelerator reduce (sum)", ok, ca_last_error());
        ca_clear_error();
        float b[2] = {(float)r->rank, 7};
        ca_tensor *bt = ca_from_host(dev, CA_F32, CA_SHAPE(2), b);
        ok = bt && ca_broadcast(r->acc, bt, 0) == CA_OK && ca_tensor_to_host(bt, b, sizeof b) == CA_OK && b[0] == 0;
        ts_report(r, "accelerator broadcast", ok, ca_last_error());
        ca_clear_error();
    }
    ca_status s = ca_wait_for_everyone(r->acc);
    ts_report(r, "wait_for_everyone", s == CA_OK, ca_last_error());

    /* set_seed gives every rank the same stream */
    CA_SCOPE {
        ca_set_seed(r->acc, 1234);
        ca_tensor *x = ca_rand_uniform(dev, CA_F32, CA_SHAPE(16), 0.0, 1.0);
        ts_report(r, "RNG in sync after set_seed", x && ts_same_everywhere(r, x, detail, sizeof detail), detail);
    }
}

/* ---- data and training ---- */

#define TS_N 96       /* samples: a multiple of batch * world for worlds 1, 2, 3, 4, 6, 8 */
#define TS_BATCH 4

static void ts_sharding(ts_run *r) {
    float x[TS_N], y[TS_N];
    for (int i = 0; i < TS_N; i++) x[i] = (float)i, y[i] = 0;
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 1, .shape = {1}}, ys = xs;
    ca_dataset *ds = NULL;
    ca_dataloader *dl = NULL;
    char detail[200] = "";
    int ok = ca_dataset_from_memory(&xs, x, &ys, y, TS_N, &ds) == CA_OK &&
             ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = TS_BATCH, .shuffle = true}, &dl) == CA_OK &&
             ca_prepare_dataloader(r->acc, dl) == CA_OK;
    if (!ok) snprintf(detail, sizeof detail, "%s", ca_last_error());
    float seen[TS_N] = {0};
    ca_batch b;
    while (ok && ca_dataloader_next(dl, &b)) {
        float v[TS_BATCH];
        if (ca_tensor_to_host(b.x, v, (size_t)b.size * sizeof *v) != CA_OK) { ok = 0; break; }
        for (int64_t i = 0; i < b.size; i++) seen[(int)v[i]] += 1;
    }
    if (ok && ca_dataloader_status(dl) != CA_OK) ok = 0, snprintf(detail, sizeof detail, "%s", ca_last_error());
    CA_SCOPE {   /* every sample exactly once over all ranks */
        ca_tensor *t = ca_from_host(ca_accelerator_device(r->acc), CA_F32, CA_SHAPE(TS_N), seen);
        if (!t || ca_reduce(r->acc, t, CA_OP_SUM) != CA_OK || ca_tensor_to_host(t, seen, sizeof seen) != CA_OK)
            ok = 0, snprintf(detail, sizeof detail, "%s", ca_last_error());
        for (int i = 0; ok && i < TS_N; i++)
            if (seen[i] != 1) ok = 0, snprintf(detail, sizeof detail, "sample %d was seen %g times over all ranks", i, seen[i]);
    }
    ts_report(r, "dataloader shards: every sample once over all ranks", ok, detail);
    ca_clear_error();
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
}

static void ts_training(ts_run *r) {
    enum { D = 4 };
    float x[TS_N * D], y[TS_N];
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < TS_N; i++) {
        y[i] = 0.5f;
        for (int j = 0; j < D; j++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            x[i * D + j] = (float)((s >> 40) * (1.0 / 16777216.0)) * 2 - 1;
            y[i] += (float)(j + 1) * x[i * D + j];
        }
    }
    ca_sample_spec xs = {.dtype = CA_F32, .ndim = 1, .shape = {D}}, ys = {.dtype = CA_F32, .ndim = 1, .shape = {1}};
    ca_dataset *ds = NULL;
    ca_dataloader *dl = NULL;
    ca_module *model = NULL;
    ca_optimizer *opt = NULL;
    char detail[200] = "";
    ca_manual_seed(100 + (uint64_t)r->rank);   /* different initial weights: prepare must sync them */
    int ok = ca_dataset_from_memory(&xs, x, &ys, y, TS_N, &ds) == CA_OK &&
             ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = 8, .shuffle = true}, &dl) == CA_OK &&
             ca_linear_create(D, 1, true, &model) == CA_OK &&
             ca_sgd_create(model, &(ca_sgd_opts){.lr = 0.1, .momentum = 0.5}, &opt) == CA_OK &&
             ca_prepare(r->acc, model, opt, dl) == CA_OK;
    if (!ok) snprintf(detail, sizeof detail, "%s", ca_last_error());
    int same = ok;
    for (int i = 0; same && i < ca_module_num_params(model); i++)
        same = ts_same_everywhere(r, ca_module_param_at(model, i), detail, sizeof detail);
    ts_report(r, "parameters in sync after prepare", same, detail);
    double first = -1, last = -1;
    for (int epoch = 0; ok && epoch < 5; epoch++) {
        double sum = 0;
        int n = 0;
        ca_batch b;
        while (ok && ca_dataloader_next(dl, &b)) {
            CA_ACCUMULATE(r->acc, model) {
                ca_tensor *loss = ca_mse_loss(ca_module_forward(model, b.x), b.y);
                ok = loss && ca_backward(r->acc, loss) == CA_OK && ca_optimizer_step(opt) == CA_OK;
                ca_optimizer_zero_grad(opt);
                if (ok) sum += ca_item(loss), n++;
            }
        }
        if (ok && ca_dataloader_status(dl) != CA_OK) ok = 0;
        if (n && first < 0) first = sum / n;
        if (n) last = sum / n;
    }
    if (!ok) snprintf(detail, sizeof detail, "%s", ca_last_error());
    else if (!(last < first / 4))
        ok = 0, snprintf(detail, sizeof detail, "mean loss %.4g after 5 epochs, %.4g after the first", last, first);
    if (ca_is_main_process(r->acc) && ok)
        printf("        (mean squared error %.4g after the first epoch, %.4g after the fifth)\n", first, last);
    ts_report(r, "5 epochs of training reduce the loss 4x", ok, detail);
    same = 1;
    for (int i = 0; same && model && i < ca_module_num_params(model); i++)
        same = ts_same_everywhere(r, ca_module_param_at(model, i), detail, sizeof detail);
    ts_report(r, "parameters in sync after training", same, detail);
    ca_clear_error();
    ca_dataloader_destroy(dl);
    ca_dataset_destroy(ds);
    ca_optimizer_destroy(opt);
    ca_module_destroy(model);
}

static int ts_worker(int argc, char **argv) {
    ts_run r = {0};
    if (ca_accelerator_create(&(ca_options){.argc = argc, .argv = argv}, &r.acc) != CA_OK)
        return ca_cli_fail("test");
    r.rank = ca_process_index(r.acc);
    r.world = ca_num_processes(r.acc);
    const ca_settings *st = ca_accelerator_settings(r.acc);
    if (ca_is_main_process(r.acc))
        printf("caccel test: %d process(es), backend %s, device %s, mixed precision %s, distributed type %s\n",
               r.world, r.world > 1 ? ca_comm_backend(ca_accelerator_comm(r.acc)) : "single",
               ca_device_name(ca_accelerator_device(r.acc)), ca_mixed_precision_name(st->mixed_precision),
               ca_distributed_type_name(st->distributed_type));
    ts_collectives(&r);
    ts_helpers(&r);
    ts_sharding(&r);
    ts_training(&r);
    if (ca_is_main_process(r.acc)) {
        if (r.nfailed) printf("caccel test: FAILED: %d of %d checks failed\n", r.nfailed, r.nchecks);
        else printf("caccel test: all %d checks passed: the setup works\n", r.nchecks);
    }
    int rc = r.nfailed ? 1 : 0;
    ca_accelerator_destroy(r.acc);
    ca_scope_release_all();
    return rc;
}

static void ts_usage(FILE *f) {
    fprintf(f, "usage: caccel test [--config_file FILE] [launch flags...]\n\n"
               "Runs caccel's self-check under `caccel launch` with the configuration (and the flags of\n"
               "`caccel launch`: --num_processes, --cpu, --backend, --mixed_precision, ...): collectives of\n"
               "every kind and dtype, RNG and parameter sync across ranks, dataloader sharding, and a few\n"
               "training steps that must reduce the loss. One line per check, then a verdict; exits 1\n"
               "when a check fails.\n");
}

int ca_cmd_test(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "--worker")) return ts_worker(argc - 1, argv + 1);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return ts_usage(stdout), 0;
    char self[PATH_MAX];
    errno = 0;
    ssize_t n = readlink("/proc/self/exe", self, sizeof self);
    if (n <= 0 || n >= (ssize_t)sizeof self) {   /* n == sizeof self: the path may be cut */
        fprintf(stderr, "caccel test: error: cannot find the caccel executable to run under launch: /proc/self/exe: "
                        "%s\n", n < 0 ? strerror(errno) : n == 0 ? "an empty link" : "a path longer than PATH_MAX");
        return 1;
    }
    self[n] = '\0';
    /* caccel launch <the flags given> <this caccel> test --worker; the launcher's messages say
     * "caccel test" (its argv[0]) */
    char **largv = calloc((size_t)argc + 4, sizeof *largv);
    if (!largv) return 1;
    int k = 0;
    largv[k++] = "test";
    for (int i = 1; i < argc; i++) largv[k++] = argv[i];
    largv[k++] = self;
    largv[k++] = "test";
    largv[k++] = "--worker";
    int rc = ca_cmd_launch(k, largv);
    free(largv);
    return rc;
}
