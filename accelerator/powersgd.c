/* DDP's PowerSGD hooks (comm_hook: power_sgd, batched_power_sgd): PyTorch's powerSGD_hook and
 * batched_powerSGD_hook, as Accelerate selects them, with PowerSGDState's options under the key
 * comm_state_option. A gradient seen as an n x m matrix M (its first dimension by the rest; batched: the
 * whole bucket as a zero-padded square) is sent as two factors of rank r: P = M Q is summed over the
 * ranks and orthonormalised, Q = M^T P is averaged, and M is replaced by P Q^T, the same on every rank.
 * What that lost is added to the next step's gradient (error feedback); Q starts the next step (warm
 * start). Gradients too small to gain (1-D ones, biases) are averaged as they are. */
#include "accelerator/accelerator_impl.h"

#include <math.h>
#include <stdlib.h>

typedef struct psgd_span {
    int64_t off, len;            /* a gradient averaged uncompressed: its elements in the bucket */
} psgd_span;

typedef struct psgd_mat {
    int64_t off;                 /* first element of M in the compressed buffer */
    int64_t n, m, r;             /* M is n x m, approximated at rank r */
    int64_t p_off, q_off;        /* P (n x r) and Q (m x r) in the P and Q buffers */
} psgd_mat;

typedef struct ca_psgd ca_psgd;
struct ca_psgd {
    bool batched;
    int64_t len;                 /* elements compressed: the bucket's, or side^2 (batched) */
    int nmats, nspans;
    psgd_mat *mats;
    psgd_span *spans;            /* per-tensor hook: the gradients too small to compress */
    int64_t unc_numel;           /* their elements in all */
    int64_t p_numel, q_numel;
    ca_tensor *pad;              /* batched: [side^2], the bucket then zeros */
    ca_tensor *error;            /* [len]: what compression lost (error feedback) */
    ca_tensor *unc, *p, *q;
    float *host;                 /* P or Q on the host for Gram-Schmidt (device not host memory) */
    double *work;                /* Gram-Schmidt's double copy of one matrix */
    bool have_q;
    int64_t iter;                /* synchronising steps this bucket has seen */
    uint64_t rng_offset;
    /* comm_state_option */
    int64_t rank, start_iter, stats_every, seed;
    double min_rate, eps;
    bool error_feedback, warm_start;
};

static ca_status read_options(const ca_accelerator *acc, ca_psgd *ps) {
    const ca_config *c = acc->cfg;
    ca_status s = ca_config_get_int(c, "comm_state_option.matrix_approximation_rank", &ps->rank);
    if (s == CA_OK) s = ca_config_get_int(c, "comm_state_option.start_powerSGD_iter", &ps->start_iter);
    if (s == CA_OK) s = ca_config_get_int(c, "comm_state_option.compression_stats_logging_frequency", &ps->stats_every);
    if (s == CA_OK) s = ca_config_get_int(c, "comm_state_option.random_seed", &ps->seed);
    if (s == CA_OK) s = ca_config_get_double(c, "comm_state_option.min_compression_rate", &ps->min_rate);
    if (s == CA_OK) s = ca_config_get_double(c, "comm_state_option.orthogonalization_epsilon", &ps->eps);
    if (s == CA_OK) s = ca_config_get_bool(c, "comm_state_option.use_error_feedback", &ps->error_feedback);
    if (s == CA_OK) s = ca_config_get_bool(c, "comm_state_option.warm_start", &ps->warm_start);
    return s;
}

static ca_status add_mat(ca_psgd *ps, int64_t off, int64_t n, int64_t m, int64_t r) {
    psgd_mat *nm = realloc(ps->mats, (size_t)(ps->nmats + 1) * sizeof *nm);
    if (!nm) return ca_error(CA_ERR_NOMEM, "out of host memory");
    ps->mats = nm;
    nm[ps->nmats++] = (psgd_mat){.off = off, .n = n, .m = m, .r = r, .p_off = ps->p_numel, .q_off = ps->q_numel};
    ps->p_numel += n * r;
    ps->q_numel += m * r;
    return CA_OK;
}

static ca_status add_span(ca_psgd *ps, int64_t off, int64_t len) {
    psgd_span *ns = realloc(ps->spans, (size_t)(ps->nspans + 1) * sizeof *ns);
    if (!ns) return ca_error(CA_ERR_NOMEM, "out of host memory");
    ps->spans = ns;
    ns[ps->nspans++] = (psgd_span){.off = off, .len = len};
    ps->unc_numel += len;
    return CA_OK;
}

/* PyTorch's _should_compress: worth it when (n + m) r * min_compression_rate < n m. */
static ca_status plan_tensors(ca_psgd *ps, const ca_bucket *bk) {
    int64_t off = 0;
    ca_status s = CA_OK;
    for (int k = 0; k < bk->nparams && s == CA_OK; k++) {
        const ca_tensor *t = bk->params[k];
        int64_t n = t->ndim > 0 ? t->shape[0] : 1, m = n > 0 ? t->numel / n : 0;
        int64_t r = n < m ? n : m;
        if (r > ps->rank) r = ps->rank;
        if (r > 0 && (double)((n + m) * r) * ps->min_rate < (double)(n * m)) s = add_mat(ps, off, n, m, r);
        else if (t->numel > 0) s = add_span(ps, off, t->numel);
        off += t->numel;
    }
    return s;
}

static ca_tensor *persistent(ca_device *d, int64_t n) {
    int64_t len = n > 0 ? n : 1;
    ca_tensor *t = ca_zeros(d, CA_F32, 1, &len);
    return t ? ca_tensor_keep(t) : NULL;
}

static ca_status psgd_create(ca_accelerator *acc, ca_bucket *bk, bool batched) {
    ca_psgd *ps = calloc(1, sizeof *ps);
    if (!ps) return ca_error(CA_ERR_NOMEM, "out of host memory");
    bk->psgd = ps;
    ps->batched = batched;
    ca_status s = read_options(acc, ps);
    if (s != CA_OK) return s;
    if (batched) {
        int64_t side = (int64_t)ceil(sqrt((double)bk->numel));
        while (side * side < bk->numel) side++;
        ps->len = side * side;
        s = add_mat(ps, 0, side, side, side < ps->rank ? side : ps->rank);
    } else {
        ps->len = bk->numel;
        s = plan_tensors(ps, bk);
    }
    if (s != CA_OK) return s;
    ca_device *d = acc->device;
    if ((batched && !(ps->pad = persistent(d, ps->len))) ||
        (ps->error_feedback && !(ps->error = persistent(d, ps->len))) || !(ps->unc = persistent(d, ps->unc_numel)) ||
        !(ps->p = persistent(d, ps->p_numel)) || !(ps->q = persistent(d, ps->q_numel)))
        return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_NOMEM, "out of device memory for PowerSGD");
    int64_t most = ps->p_numel > ps->q_numel ? ps->p_numel : ps->q_numel;
    size_t most_n = (size_t)(most > 0 ? most : 1);
    ps->work = malloc(most_n * sizeof(double));
    if (!ca_device_is_host(d)) ps->host = malloc(most_n * sizeof(float));
    if (!ps->work || (!ca_device_is_host(d) && !ps->host)) return ca_error(CA_ERR_NOMEM, "out of host memory");
    /* every bucket draws its Q from its own stretch of the counter space: the same on every rank */
    ps->rng_offset = (uint64_t)(acc->nbuckets) << 40;
    return CA_OK;
}

static void psgd_free(ca_psgd *ps) {
    if (!ps) return;
    free(ps->mats);
    free(ps->spans);
    ca_tensor_free(ps->pad);
    ca_tensor_free(ps->error);
    ca_tensor_free(ps->unc);
    ca_tensor_free(ps->p);
    ca_tensor_free(ps->q);
    free(ps->host);
    free(ps->work);
    free(ps);
}

/* Modified Gram-Schmidt on the r columns of a row-major n x r matrix, carried out in double (w: n r
 * doubles) and rounded once: PyTorch's _orthogonalize_gram_schmidt, more exactly (in float a column that
 * is nearly dependent on the earlier ones comes back far from orthogonal to them). A column whose norm
 * is zero stays zero where PyTorch would divide by it. */
static void gram_schmidt(float *a, double *w, int64_t n, int64_t r, double eps) {
    for (int64_t i = 0; i < n * r; i++) w[i] = a[i];
    for (int64_t j = 0; j < r; j++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += w[i * r + j] * w[i * r + j];
        double norm = sqrt(ss) + eps;
        if (norm > 0)
            for (int64_t i = 0; i < n; i++) w[i * r + j] /= norm;
        for (int64_t k = j + 1; k < r; k++) {
            double dot = 0;
            for (int64_t i = 0; i < n; i++) dot += w[i * r + j] * w[i * r + k];
            for (int64_t i = 0; i < n; i++) w[i * r + k] -= dot * w[i * r + j];
        }
    }
    for (int64_t i = 0; i < n * r; i++) a[i] = (float)w[i];
}

/* Orthonormalises every matrix's P (or Q) columns, through the host where the device is not host memory. */
static ca_status orthogonalize(ca_psgd *ps, ca_tensor *t, bool p) {
    int64_t total = p ? ps->p_numel : ps->q_numel;
    if (total == 0) return CA_OK;
    ca_device *d = ca_tdev(t);
    float *h = ps->host ? ps->host : ca_tptr(t);
    size_t bytes = (size_t)total * sizeof(float);
    if (ps->host) {
        ca_status s = ca_device_copy_to_host(d, h, ca_tptr(t), bytes);
        if (s != CA_OK) return s;
    }
    for (int i = 0; i < ps->nmats; i++) {
        const psgd_mat *mt = &ps->mats[i];
        gram_schmidt(h + (p ? mt->p_off : mt->q_off), ps->work, p ? mt->n : mt->m, mt->r, ps->eps);
    }
    return ps->host ? ca_device_copy_from_host(d, ca_tptr(t), h, bytes) : CA_OK;
}

/* C (rows x cols) = op(A) op(B), row-major f32 through the device's GEMM. */
static ca_status mm(ca_device *d, bool ta, bool tb, int64_t rows, int64_t cols, int64_t inner, const float *a,
                    int64_t lda, const float *b, int64_t ldb, float *c) {
    ca_gemm_args g = {.trans_a = ta, .trans_b = tb, .m = rows, .n = cols, .k = inner, .alpha = 1.0f, .beta = 0.0f,
                      .a_dtype = CA_F32, .b_dtype = CA_F32, .c_dtype = CA_F32, .a = a, .lda = lda, .b = b,
                      .ldb = ldb, .c = c, .ldc = cols, .batch = 1};
    return CA_KCALL_ARGS(d, gemm, &g);
}

/* Q of every matrix: drawn (the first step, or every step without warm start) or last step's, orthonormal. */
static ca_status prepare_q(ca_psgd *ps) {
    if (ps->q_numel == 0) return CA_OK;
    if (!ps->have_q || !ps->warm_start) {
        ca_status s = CA_KCALL(ca_tdev(ps->q), rng, .kind = CA_RNG_NORMAL, .dt = CA_F32, .n = ps->q_numel,
                               .seed = (uint64_t)ps->seed, .offset = ps->rng_offset, .a = 0.0f, .b = 1.0f,
                               .y = ca_tptr(ps->q));
        if (s != CA_OK) return s;
        ps->rng_offset += ca_rng_counters(CA_RNG_NORMAL, ps->q_numel);
        ps->have_q = true;
    }
    return orthogonalize(ps, ps->q, false);
}

/* Per-tensor hook: the uncompressed gradients, gathered into one buffer for one average. */
static ca_status move_spans(ca_psgd *ps, float *buf, bool gather) {
    ca_device *d = ca_tdev(ps->unc);
    float *u = ca_tptr(ps->unc);
    for (int i = 0; i < ps->nspans; i++) {
        float *at = buf + ps->spans[i].off;
        size_t bytes = (size_t)ps->spans[i].len * sizeof(float);
        ca_status s = gather ? ca_device_copy(d, u, at, bytes) : ca_device_copy(d, at, u, bytes);
        if (s != CA_OK) return s;
        u += ps->spans[i].len;
    }
    return CA_OK;
}

/* P = M Q, summed; P orthonormalised; Q = M^T P, averaged; M = P Q^T. */
static ca_status low_rank(ca_accelerator *acc, ca_psgd *ps, float *buf) {
    ca_device *d = acc->device;
    float *p = ca_tptr(ps->p), *q = ca_tptr(ps->q);
    ca_status s = prepare_q(ps);
    for (int i = 0; i < ps->nmats && s == CA_OK; i++) {
        const psgd_mat *mt = &ps->mats[i];
        s = mm(d, false, false, mt->n, mt->r, mt->m, buf + mt->off, mt->m, q + mt->q_off, mt->r, p + mt->p_off);
    }
    if (s == CA_OK && ps->p_numel)
        s = ca_comm_all_reduce(acc->comm, p, p, (size_t)ps->p_numel, CA_F32, CA_OP_SUM, NULL);
    if (s == CA_OK) s = orthogonalize(ps, ps->p, true);
    for (int i = 0; i < ps->nmats && s == CA_OK; i++) {
        const psgd_mat *mt = &ps->mats[i];
        s = mm(d, true, false, mt->m, mt->r, mt->n, buf + mt->off, mt->m, p + mt->p_off, mt->r, q + mt->q_off);
    }
    if (s == CA_OK && ps->q_numel)
        s = ca_comm_all_reduce(acc->comm, q, q, (size_t)ps->q_numel, CA_F32, CA_OP_AVG, NULL);
    for (int i = 0; i < ps->nmats && s == CA_OK; i++) {
        const psgd_mat *mt = &ps->mats[i];
        s = mm(d, false, true, mt->n, mt->m, mt->r, p + mt->p_off, mt->r, q + mt->q_off, mt->r, buf + mt->off);
    }
    return s;
}

static void log_stats(const ca_accelerator *acc, const ca_bucket *bk, const ca_psgd *ps) {
    if (acc->rank != 0 || ps->iter % ps->stats_every != 0) return;
    int64_t sent = ps->p_numel + ps->q_numel + ps->unc_numel;
    ca_log_printf(CA_LOG_INFO, "PowerSGD: bucket of %lld values sent as %lld (compression rate %.1f) at step %lld",
                  (long long)bk->numel, (long long)sent, sent ? (double)bk->numel / (double)sent : 0.0,
                  (long long)ps->iter);
}

/* After a skipped fp16 step: an overflow went through the factors, so the error feedback and Q hold
 * non-finite values every later step would inherit (and skip); both start afresh, alike on every rank
 * (every rank skips). */
static ca_status psgd_reset(ca_psgd *ps) {
    if (!ps) return CA_OK;
    ps->have_q = false;
    return ps->error ? CA_KCALL(ca_tdev(ps->error), fill, .dt = CA_F32, .n = ps->len, .value = 0.0,
                                .y = ca_tptr(ps->error)) : CA_OK;
}

/* Counts this synchronising step; false for PyTorch's warm-up (start_powerSGD_iter plain averages). */
static bool psgd_compresses(ca_psgd *ps) {
    return ps->iter++ >= ps->start_iter;
}

/* Blocking: three collectives in a row, the same order on every rank. */
static ca_status psgd_reduce(ca_accelerator *acc, ca_bucket *bk) {
    ca_psgd *ps = bk->psgd;
    float *flat = ca_tptr(bk->flat);
    ca_device *d = acc->device;
    float *buf = flat;
    ca_status s = CA_OK;
    if (ps->batched) {
        buf = ca_tptr(ps->pad);
        s = ca_device_copy(d, buf, flat, (size_t)bk->numel * sizeof(float));
        if (s == CA_OK && ps->len > bk->numel) s = CA_KCALL(d, fill, .dt = CA_F32, .n = ps->len - bk->numel,
                                                            .value = 0.0, .y = buf + bk->numel);
    }
    float *err = ps->error ? ca_tptr(ps->error) : NULL;
    if (s == CA_OK && err) s = CA_KCALL(d, axpby, .dt = CA_F32, .n = ps->len, .alpha = 1.0f, .x = err,
                                        .beta = 1.0f, .y = buf);
    if (s == CA_OK && err) s = ca_device_copy(d, err, buf, (size_t)ps->len * sizeof(float));
    /* the collectives run one after the other, in the same order on every rank */
    if (s == CA_OK && ps->unc_numel) s = move_spans(ps, buf, true);
    if (s == CA_OK && ps->unc_numel)
        s = ca_comm_all_reduce(acc->comm, ca_tptr(ps->unc), ca_tptr(ps->unc), (size_t)ps->unc_numel, CA_F32,
                               CA_OP_AVG, NULL);
    if (s == CA_OK && ps->unc_numel) s = move_spans(ps, buf, false);
    if (s == CA_OK) s = low_rank(acc, ps, buf);
    if (s == CA_OK && err) s = CA_KCALL(d, axpby, .dt = CA_F32, .n = ps->len, .alpha = -1.0f, .x = buf,
                                        .beta = 1.0f, .y = err);
    if (s == CA_OK && ps->batched) s = ca_device_copy(d, flat, buf, (size_t)bk->numel * sizeof(float));
    if (s != CA_OK) return ca_error_context("PowerSGD on a gradient bucket of %lld values (rank %d)",
                                            (long long)bk->numel, acc->rank);
    log_stats(acc, bk, ps);
    return CA_OK;
}

/* ------------------------------------------------------------------ as DDP's bucket hook */

static ca_status psgd_init(ca_accelerator *acc, ca_bucket *bk) { return psgd_create(acc, bk, false); }
static ca_status psgd_init_batched(ca_accelerator *acc, ca_bucket *bk) { return psgd_create(acc, bk, true); }

/* The warm-up's steps leave the bucket to the plain average. */
static ca_status psgd_launch(ca_accelerator *acc, ca_bucket *bk, bool *done) {
    *done = psgd_compresses(bk->psgd);
    return *done ? psgd_reduce(acc, bk) : CA_OK;
}

static ca_status psgd_reset_bucket(ca_bucket *bk) { return psgd_reset(bk->psgd); }

static void psgd_free_bucket(ca_bucket *bk) {
    psgd_free(bk->psgd);
    bk->psgd = NULL;
}

const ca_bucket_hook ca_bucket_hook_power_sgd = {
    .name = "power_sgd", .init = psgd_init, .launch = psgd_launch, .reset = psgd_reset_bucket,
    .free = psgd_free_bucket,
};
const ca_bucket_hook ca_bucket_hook_batched_power_sgd = {
    .name = "batched_power_sgd", .init = psgd_init_batched, .launch = psgd_launch, .reset = psgd_reset_bucket,
    .free = psgd_free_bucket,
};
