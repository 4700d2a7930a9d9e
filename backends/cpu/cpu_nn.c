/* CPU row-wise nn kernels: softmax/log_softmax, cross-entropy, layer norm, RMS norm (each + backward),
 * embedding (+ backward).
 *
 * Threads: every kernel splits its rows among the kernel threads (cpu_parallel.h). A row's output depends
 * on that row only, so forward passes and input gradients are the same at any thread count. The sums over
 * rows (the loss, the norms' parameter gradients) add fixed blocks of rows and then the blocks' partials in
 * block order (block_len); the embedding backward adds each table row's gradients in index order on one
 * thread. Every result is therefore bit-identical at 1, 2, 3 ... threads. */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_parallel.h"

#include <stdatomic.h>
#include <stdlib.h>

#define LANES 16

/* ---------------------------------------------------------------- threads */

/* What every parallel kernel shares with its ranges. A range allocates its own row buffers (`floats` of
 * them); a worker cannot report an error itself (the message is per thread), so it raises `nomem` and the
 * kernel reports it on the calling thread. */
typedef struct nn_job {
    const char *kernel;
    int64_t floats;
    atomic_bool nomem;
} nn_job;

/* The range's buffers (NULL without failing when the kernel needs none). */
static bool job_alloc(nn_job *job, float **ws) {
    *ws = NULL;
    if (job->floats == 0) return true;
    *ws = malloc((size_t)job->floats * sizeof(float));
    if (!*ws) atomic_store(&job->nomem, true);
    return *ws != NULL;
}

/* fn over [0, n) on the kernel threads, n items (rows or blocks of rows) of `cost` streaming elements each. */
static ca_status run_job(nn_job *job, int64_t n, int64_t cost, cpu_range_fn fn, void *ctx) {
    cpu_parallel_for(n, cpu_grain_for(cost), fn, ctx);
    if (!atomic_load(&job->nomem)) return CA_OK;
    return ca_error(CA_ERR_NOMEM, "cpu kernel %s: out of host memory for a thread's row buffers (%lld floats)",
                    job->kernel, (long long)job->floats);
}

/* Rows per block of a sum over rows: at least CPU_REDUCE_BLOCK elements, and at most MAX_ROW_BLOCKS blocks,
 * so that the partials (blocks x cols floats) stay a small part of the data. It depends on the shape only:
 * the sum is the same at every thread count. */
#define MAX_ROW_BLOCKS 64

static int64_t block_len(int64_t rows, int64_t cols) {
    int64_t c = cols > 0 ? cols : 1, len = (CPU_REDUCE_BLOCK + c - 1) / c;
    int64_t fewest = (rows + MAX_ROW_BLOCKS - 1) / MAX_ROW_BLOCKS;
    return len > fewest ? len : (fewest > 0 ? fewest : 1);
}

static int64_t blocks_of(int64_t rows, int64_t len) { return (rows + len - 1) / len; }

CPU_CLONES static void add_row(float *restrict t, const float *restrict d, int64_t n) {
    for (int64_t i = 0; i < n; i++) t[i] += d[i];
}

/* A parameter gradient from its blocks' partials: out = (accumulate ? out : 0) + the partials added in
 * block order. acc, old: buffers of cols floats. */
static void combine_params(ca_dtype dt, const float *part, int64_t nb, int64_t cols, bool accumulate, float *acc,
                           float *old, void *out) {
    memset(acc, 0, (size_t)cols * sizeof(float));
    for (int64_t b = 0; b < nb; b++) add_row(acc, part + b * cols, cols);
    if (accumulate) {
        cpu_to_f32(dt, out, 0, cols, old);
        add_row(acc, old, cols);
    }
    cpu_from_f32(dt, acc, cols, out, 0);
}

/* Buffers of the calling thread: `count` arrays of `cols` floats. */
static ca_status rows_alloc(const char *kernel, int64_t cols, int64_t count, float **out) {
    int64_t c = cols > 0 ? cols : 1;
    *out = malloc((size_t)c * (size_t)count * sizeof(float));
    if (!*out)
        return ca_error(CA_ERR_NOMEM, "cpu kernel %s: out of host memory for %lld row buffers of %lld floats",
                        kernel, (long long)count, (long long)cols);
    return CA_OK;
}

/* Rows with few columns are handled a block of rows at a time, so that the
 * exp loop runs over a whole block (vector-wide) rather than one short row. */
#define SMALL_COLS 256

static int64_t block_rows(int64_t cols) { return cols <= SMALL_COLS ? CPU_CHUNK / cols : 1; }

/* Floats of one of the three block buffers: max(CPU_CHUNK, cols). */
static int64_t chunk_len(int64_t cols) { return cols > CPU_CHUNK ? cols : CPU_CHUNK; }
/* e[r, c] = exp(x[r, c] - shift[r]) over nr rows of cols. */
CPU_CLONES static void exp_rows(const float *restrict x, int64_t nr, int64_t cols,
                                const float *restrict shift, float *restrict e) {
    for (int64_t r = 0; r < nr; r++)
        for (int64_t c = 0; c < cols; c++) e[r * cols + c] = x[r * cols + c] - shift[r];
    for (int64_t i = 0; i < nr * cols; i++) e[i] = ca_fast_expf(e[i]);
}

/* Short rows: one pass per column across the rows of a block, so that no
 * row is a chain of dependent operations. */
#define SHORT_COLS 64

CPU_CLONES static void short_rows_max(const float *restrict x, int64_t nr, int64_t cols,
                                      float *restrict m) {
    for (int64_t r = 0; r < nr; r++) m[r] = x[r * cols];
    for (int64_t c = 1; c < cols; c++)
        for (int64_t r = 0; r < nr; r++) {
            float v = x[r * cols + c];
            m[r] = (v > m[r] || v != v) ? v : m[r];
        }
}

CPU_CLONES static void short_rows_sum(const float *restrict x, int64_t nr, int64_t cols,
                                      float *restrict s) {
    for (int64_t r = 0; r < nr; r++) s[r] = x[r * cols];
    for (int64_t c = 1; c < cols; c++)
        for (int64_t r = 0; r < nr; r++) s[r] += x[r * cols + c];
}

/* m[r] = max of row r (0 for an all -inf row, so that exp gives 0, not NaN). */
static void row_max(const float *x, int64_t nr, int64_t cols, float *m) {
    if (cols < SHORT_COLS) {
        short_rows_max(x, nr, cols, m);
    } else {
        for (int64_t r = 0; r < nr; r++) m[r] = cpu_run_max(x + r * cols, cols, -INFINITY);
    }
    for (int64_t r = 0; r < nr; r++) m[r] = m[r] == -INFINITY ? 0.0f : m[r];
}

/* s[r] = sum of row r. */
static void row_sum(const float *x, int64_t nr, int64_t cols, float *s) {
    if (cols < SHORT_COLS) {
        short_rows_sum(x, nr, cols, s);
        return;
    }
    for (int64_t r = 0; r < nr; r++) s[r] = cpu_run_sum(x + r * cols, cols);
}

CPU_CLONES static void scale_row(float *restrict y, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) y[i] *= s;
}

/* y = x - s; y may be x itself. */
CPU_CLONES static void sub_row(const float *x, int64_t n, float s, float *y) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] - s;
}

/* Row r of x as f32: x itself when f32, else converted into buf. */
static const float *row_in(ca_dtype dt, const void *x, int64_t r, int64_t cols, float *buf) {
    return cpu_view_f32(dt, x, r * cols, cols, buf);
}

/* Streaming elements per row of the softmax kernels: a max, an exp, a sum and a scale pass. */
#define SOFTMAX_COST 4

typedef struct softmax_job {
    nn_job job;
    const ca_softmax_args *a;
} softmax_job;

/* Rows [lo, hi), R rows at a time. */
static void softmax_range(void *ctx, int64_t lo, int64_t hi) {
    softmax_job *j = ctx;
    const ca_softmax_args *a = j->a;
    int64_t cols = a->cols, len = chunk_len(cols), R = block_rows(cols);
    float *ws, m[CPU_CHUNK], sum[CPU_CHUNK];
    if (!job_alloc(&j->job, &ws)) return;
    float *xb = ws, *e = ws + len, *ob = ws + 2 * len;
    for (int64_t r0 = lo; r0 < hi; r0 += R) {
        int64_t nr = hi - r0 < R ? hi - r0 : R, n = nr * cols;
        const float *xs = cpu_view_f32(a->dt, a->x, r0 * cols, n, xb);
        float *out = a->dt == CA_F32 ? (float *)a->y + r0 * cols : ob;
        row_max(xs, nr, cols, m);
        exp_rows(xs, nr, cols, m, e);
        row_sum(e, nr, cols, sum);
        for (int64_t r = 0; r < nr; r++) {
            float s = sum[r];
            if (a->log)
                sub_row(xs + r * cols, cols, m[r] + logf(s), out + r * cols);
            else
                scale_row(memcpy(out + r * cols, e + r * cols, (size_t)cols * sizeof(float)), cols,
                          1.0f / s);
        }
        if (a->dt != CA_F32) cpu_from_f32(a->dt, ob, n, a->y, r0 * cols);
    }
    free(ws);
}

ca_status cpu_softmax(void *dev, const ca_softmax_args *args) {
    if (args->rows == 0 || args->cols == 0) return CA_OK;
    softmax_job j = {.job = {.kernel = args->log ? "log_softmax" : "softmax", .floats = 3 * chunk_len(args->cols)},
                     .a = args};
    return run_job(&j.job, args->rows, SOFTMAX_COST * args->cols, softmax_range, &j);
}

CPU_CLONES static float dot_row(const float *restrict a, const float *restrict b, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += a[i + j] * b[i + j];
    float s = 0.0f;
    for (; i < n; i++) s += a[i] * b[i];
    for (int j = 0; j < LANES; j++) s += acc[j];
    return s;
}

/* softmax: g = y (dy - s) with s = sum(dy y);  log: g = dy - exp(y) s with s = sum(dy). */
CPU_CLONES static void softmax_grad_row(bool log, const float *restrict y, const float *restrict dy,
                                        int64_t n, float s, float beta, float *restrict dx) {
    if (log) {
        if (beta == 0.0f)
            for (int64_t i = 0; i < n; i++) dx[i] = dy[i] - ca_fast_expf(y[i]) * s;
        else
            for (int64_t i = 0; i < n; i++) dx[i] = beta * dx[i] + (dy[i] - ca_fast_expf(y[i]) * s);
    } else {
        if (beta == 0.0f)
            for (int64_t i = 0; i < n; i++) dx[i] = y[i] * (dy[i] - s);
        else
            for (int64_t i = 0; i < n; i++) dx[i] = beta * dx[i] + y[i] * (dy[i] - s);
    }
}

typedef struct softmax_bwd_job {
    nn_job job;
    const ca_softmax_backward_args *a;
} softmax_bwd_job;

/* Rows [lo, hi); row buffers (ws) when the data are f16/bf16 or dx is y or dy. */
static void softmax_bwd_range(void *ctx, int64_t lo, int64_t hi) {
    softmax_bwd_job *j = ctx;
    const ca_softmax_backward_args *a = j->a;
    int64_t cols = a->cols;
    ca_dtype dt = a->dt;
    float *ws;
    if (!job_alloc(&j->job, &ws)) return;
    for (int64_t r = lo; r < hi; r++) {
        const float *yr = row_in(dt, a->y, r, cols, ws);
        const float *dr = row_in(dt, a->dy, r, cols, ws ? ws + cols : NULL);
        float s = a->log ? cpu_run_sum(dr, cols) : dot_row(dr, yr, cols);
        float *out = ws ? ws + 2 * cols : (float *)a->dx + r * cols;
        if (ws && a->beta != 0.0f) cpu_to_f32(dt, a->dx, r * cols, cols, out);
        softmax_grad_row(a->log, yr, dr, cols, s, a->beta, out);
        if (ws) cpu_from_f32(dt, out, cols, a->dx, r * cols);
    }
    free(ws);
}

ca_status cpu_softmax_backward(void *dev, const ca_softmax_backward_args *args) {
    if (args->rows == 0 || args->cols == 0) return CA_OK;
    bool bufs = args->dt != CA_F32 || args->dx == args->dy || args->dx == args->y;
    softmax_bwd_job j = {.job = {.kernel = args->log ? "log_softmax_backward" : "softmax_backward",
                                 .floats = bufs ? 3 * args->cols : 0},
                         .a = args};
    return run_job(&j.job, args->rows, SOFTMAX_COST * args->cols, softmax_bwd_range, &j);
}

/* ------------------------------------------------------------ cross-entropy */

static ca_status check_label(const char *k, int64_t r, int64_t label, int64_t cols,
                             int64_t ignore_index) {
    if (label == ignore_index || (label >= 0 && label < cols)) return CA_OK;
    ca_error(CA_ERR_INVALID, "cpu kernel %s: row %lld has label %lld, outside [0, %lld) and not "
                             "the ignore_index %lld", k, (long long)r, (long long)label,
             (long long)cols, (long long)ignore_index);
    ca_error_hint("labels must be class indices smaller than the number of logits per row");
    return CA_ERR_INVALID;
}

static ca_status check_labels(const char *k, ca_dtype label_dt, const void *labels, int64_t rows, int64_t cols,
                              int64_t ignore_index) {
    ca_status st = CA_OK;
    for (int64_t r = 0; r < rows && st == CA_OK; r++)
        st = check_label(k, r, cpu_index_at(label_dt, labels, r), cols, ignore_index);
    return st;
}

/* The loss is a sum over rows: each fixed block of `len` rows sums its own (total, count) on one thread. */
typedef struct ce_job {
    nn_job job;
    const ca_cross_entropy_args *a;
    int64_t len;
    double total[MAX_ROW_BLOCKS];
    int64_t count[MAX_ROW_BLOCKS];
} ce_job;

/* Rows r0 .. r0 + nr of one block: lse, and the block's loss total and count of rows not ignored. */
static void ce_rows(const ca_cross_entropy_args *a, int64_t r0, int64_t nr, float *xb, float *e, double *total,
                    int64_t *count) {
    float m[CPU_CHUNK], sum[CPU_CHUNK];
    int64_t cols = a->cols;
    const float *xs = cpu_view_f32(a->dt, a->logits, r0 * cols, nr * cols, xb);
    row_max(xs, nr, cols, m);
    exp_rows(xs, nr, cols, m, e);
    row_sum(e, nr, cols, sum);
    for (int64_t r = 0; r < nr; r++) {
        float l = m[r] + logf(sum[r]);
        a->lse[r0 + r] = l;
        int64_t label = cpu_index_at(a->label_dt, a->labels, r0 + r);
        if (label == a->ignore_index) continue;
        *total += (double)l - (double)xs[r * cols + label];
        (*count)++;
    }
}

/* Blocks [b0, b1). */
static void ce_range(void *ctx, int64_t b0, int64_t b1) {
    ce_job *j = ctx;
    const ca_cross_entropy_args *a = j->a;
    int64_t len = chunk_len(a->cols), R = block_rows(a->cols);
    float *ws;
    if (!job_alloc(&j->job, &ws)) return;
    for (int64_t b = b0; b < b1; b++) {
        int64_t lo = b * j->len, hi = lo + j->len < a->rows ? lo + j->len : a->rows;
        double total = 0.0;
        int64_t count = 0;
        for (int64_t r0 = lo; r0 < hi; r0 += R)
            ce_rows(a, r0, hi - r0 < R ? hi - r0 : R, ws, ws + len, &total, &count);
        j->total[b] = total;
        j->count[b] = count;
    }
    free(ws);
}

ca_status cpu_cross_entropy(void *dev, const ca_cross_entropy_args *args) {
    ca_status st = check_labels("cross_entropy", args->label_dt, args->labels, args->rows, args->cols,
                                args->ignore_index);
    if (st != CA_OK) return st;
    /* the job lives on this stack only while the kernel runs: its partials are MAX_ROW_BLOCKS wide */
    ce_job j = {.job = {.kernel = "cross_entropy", .floats = 2 * chunk_len(args->cols)}, .a = args,
                .len = block_len(args->rows, args->cols)};
    int64_t nb = blocks_of(args->rows, j.len);
    if ((st = run_job(&j.job, nb, j.len * SOFTMAX_COST * args->cols, ce_range, &j)) != CA_OK) return st;
    double total = 0.0;
    int64_t n = 0;
    for (int64_t b = 0; b < nb; b++) {
        total += j.total[b];
        n += j.count[b];
    }
    *args->count = (float)n;
    *args->loss = n ? (float)(total / (double)n) : NAN;  /* all rows ignored: NaN, as torch */
    return CA_OK;
}

/* out = beta out + scale g over a block (beta == 0: out is not read). */
CPU_CLONES static void axpby_block(const float *restrict g, int64_t n, float scale, float beta,
                                   float *restrict out) {
    if (beta == 0.0f)
        for (int64_t i = 0; i < n; i++) out[i] = scale * g[i];
    else
        for (int64_t i = 0; i < n; i++) out[i] = beta * out[i] + scale * g[i];
}

typedef struct ce_bwd_job {
    nn_job job;
    const ca_cross_entropy_backward_args *a;
    float scale;
} ce_bwd_job;

/* Rows [lo, hi), R rows at a time. */
static void ce_bwd_range(void *ctx, int64_t lo, int64_t hi) {
    ce_bwd_job *j = ctx;
    const ca_cross_entropy_backward_args *a = j->a;
    int64_t cols = a->cols, len = chunk_len(cols), R = block_rows(cols);
    ca_dtype dt = a->dt;
    float *ws;
    if (!job_alloc(&j->job, &ws)) return;
    float *xb = ws, *e = ws + len, *ob = ws + 2 * len;
    for (int64_t r0 = lo; r0 < hi; r0 += R) {
        int64_t nr = hi - r0 < R ? hi - r0 : R, n = nr * cols;
        const float *xs = cpu_view_f32(dt, a->logits, r0 * cols, n, xb);
        /* e = softmax - onehot, zero on ignored rows */
        exp_rows(xs, nr, cols, a->lse + r0, e);
        for (int64_t r = 0; r < nr; r++) {
            int64_t label = cpu_index_at(a->label_dt, a->labels, r0 + r);
            if (label == a->ignore_index)
                memset(e + r * cols, 0, (size_t)cols * sizeof(float));
            else
                e[r * cols + label] -= 1.0f;
        }
        float *out = dt == CA_F32 ? (float *)a->dlogits + r0 * cols : ob;
        if (dt != CA_F32 && a->beta != 0.0f) cpu_to_f32(dt, a->dlogits, r0 * cols, n, ob);
        axpby_block(e, n, j->scale, a->beta, out);
        if (dt != CA_F32) cpu_from_f32(dt, ob, n, a->dlogits, r0 * cols);
    }
    free(ws);
}

ca_status cpu_cross_entropy_backward(void *dev, const ca_cross_entropy_backward_args *args) {
    if (args->rows == 0) return CA_OK;
    ca_status st = check_labels("cross_entropy_backward", args->label_dt, args->labels, args->rows, args->cols,
                                args->ignore_index);
    if (st != CA_OK) return st;
    ce_bwd_job j = {.job = {.kernel = "cross_entropy_backward", .floats = 3 * chunk_len(args->cols)}, .a = args,
                    .scale = *args->count > 0.0f ? *args->dloss / *args->count : 0.0f};
    return run_job(&j.job, args->rows, SOFTMAX_COST * args->cols, ce_bwd_range, &j);
}
/* ---------------------------------------------------------------- layer norm */

CPU_CLONES static float sq_dev_sum(const float *restrict x, int64_t n, float mean) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) {
            float d = x[i + j] - mean;
            acc[j] += d * d;
        }
    float s = 0.0f;
    for (; i < n; i++) s += (x[i] - mean) * (x[i] - mean);
    for (int j = 0; j < LANES; j++) s += acc[j];
    return s;
}

CPU_CLONES static void norm_row(const float *restrict x, int64_t n, float mean, float rstd,
                                const float *restrict g, const float *restrict b,
                                float *restrict y) {
    if (g && b)
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * rstd * g[i] + b[i];
    else if (g)
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * rstd * g[i];
    else if (b)
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * rstd + b[i];
    else
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * rstd;
}

/* Streaming elements per row of a norm: forward reads a row three times, backward about five. */
#define NORM_COST 3
#define NORM_BWD_COST 5

typedef struct ln_job {
    nn_job job;
    const ca_layer_norm_args *a;
    const float *g, *b;        /* gamma and beta as f32, or NULL */
} ln_job;

/* Rows [lo, hi); f16/bf16 rows pass through two row buffers. */
static void ln_range(void *ctx, int64_t lo, int64_t hi) {
    ln_job *j = ctx;
    const ca_layer_norm_args *a = j->a;
    int64_t cols = a->cols;
    float *ws;
    if (!job_alloc(&j->job, &ws)) return;
    for (int64_t r = lo; r < hi; r++) {
        const float *xr = row_in(a->dt, a->x, r, cols, ws);
        float mu = cpu_run_sum(xr, cols) / (float)cols;
        float var = sq_dev_sum(xr, cols, mu) / (float)cols;
        float rs = 1.0f / sqrtf(var + a->eps);
        if (a->mean) a->mean[r] = mu;
        if (a->rstd) a->rstd[r] = rs;
        float *out = a->dt == CA_F32 ? (float *)a->y + r * cols : ws + cols;
        norm_row(xr, cols, mu, rs, j->g, j->b, out);
        if (a->dt != CA_F32) cpu_from_f32(a->dt, out, cols, a->y, r * cols);
    }
    free(ws);
}

ca_status cpu_layer_norm(void *dev, const ca_layer_norm_args *args) {
    ca_dtype dt = args->dt;
    int64_t cols = args->cols;
    const char *k = "layer_norm";
    if (args->rows == 0) return CA_OK;
    float *ws = NULL;   /* gamma and beta as f32 */
    ca_status st = dt == CA_F32 ? CA_OK : rows_alloc(k, cols, 2, &ws);
    if (st != CA_OK) return st;
    ln_job j = {.job = {.kernel = k, .floats = dt == CA_F32 ? 0 : 2 * cols}, .a = args};
    if (args->gamma) j.g = cpu_view_f32(dt, args->gamma, 0, cols, ws);
    if (args->beta_) j.b = cpu_view_f32(dt, args->beta_, 0, cols, ws ? ws + cols : NULL);
    st = run_job(&j.job, args->rows, NORM_COST * cols, ln_range, &j);
    free(ws);
    return st;
}

/* gdy = g * dy (g may be NULL), xhat = (x - mean) rstd; returns the sums of
 * gdy and gdy * xhat. */
CPU_CLONES static void ln_bwd_sums(const float *restrict x, const float *restrict dy,
                                   const float *restrict g, int64_t n, float mean, float rstd,
                                   float *restrict xhat, float *restrict gdy, float *s1, float *s2) {
    float a1[LANES] = {0}, a2[LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        xhat[i] = (x[i] - mean) * rstd;
        gdy[i] = g ? g[i] * dy[i] : dy[i];
    }
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) {
            a1[j] += gdy[i + j];
            a2[j] += gdy[i + j] * xhat[i + j];
        }
    float t1 = 0.0f, t2 = 0.0f;
    for (; i < n; i++) {
        t1 += gdy[i];
        t2 += gdy[i] * xhat[i];
    }
    for (int j = 0; j < LANES; j++) {
        t1 += a1[j];
        t2 += a2[j];
    }
    *s1 = t1;
    *s2 = t2;
}

CPU_CLONES static void ln_bwd_dx(const float *restrict xhat, const float *restrict gdy, int64_t n,
                                 float rstd, float c1, float c2, float beta, float *restrict dx) {
    if (beta == 0.0f)
        for (int64_t i = 0; i < n; i++) dx[i] = rstd * (gdy[i] - c1 - xhat[i] * c2);
    else
        for (int64_t i = 0; i < n; i++) dx[i] = beta * dx[i] + rstd * (gdy[i] - c1 - xhat[i] * c2);
}

CPU_CLONES static void ln_bwd_params(const float *restrict xhat, const float *restrict dy,
                                     int64_t n, float *restrict dg, float *restrict db) {
    if (dg)
        for (int64_t i = 0; i < n; i++) dg[i] += dy[i] * xhat[i];
    if (db)
        for (int64_t i = 0; i < n; i++) db[i] += dy[i];
}

/* dgamma and dbeta are sums over rows: block b of `len` rows adds its rows into its own partials
 * pdg + b cols, pdb + b cols (NULL: not wanted); cpu_layer_norm_backward adds the blocks in order. */
typedef struct ln_bwd_job {
    nn_job job;
    const ca_layer_norm_backward_args *a;
    const float *g;            /* gamma as f32, or NULL */
    int64_t len;
    float *pdg, *pdb;
} ln_bwd_job;

/* Row r: dx, and its terms of the block's partials dg, db (NULL: not wanted). ws: 5 rows. */
static void ln_bwd_row(const ln_bwd_job *j, int64_t r, float *ws, float *dg, float *db) {
    const ca_layer_norm_backward_args *a = j->a;
    int64_t cols = a->cols;
    ca_dtype dt = a->dt;
    float *xhat = ws + 2 * cols, *gdy = ws + 3 * cols, *ob = ws + 4 * cols;
    const float *xr = row_in(dt, a->x, r, cols, ws);
    const float *dr = row_in(dt, a->dy, r, cols, ws + cols);
    float s1, s2;
    ln_bwd_sums(xr, dr, j->g, cols, a->mean[r], a->rstd[r], xhat, gdy, &s1, &s2);
    /* before dx is written: dx may be dy itself */
    ln_bwd_params(xhat, dr, cols, dg, db);
    if (!a->dx) return;
    float *out = dt == CA_F32 ? (float *)a->dx + r * cols : ob;
    if (dt != CA_F32 && a->beta != 0.0f) cpu_to_f32(dt, a->dx, r * cols, cols, ob);
    ln_bwd_dx(xhat, gdy, cols, a->rstd[r], s1 / (float)cols, s2 / (float)cols, a->beta, out);
    if (dt != CA_F32) cpu_from_f32(dt, ob, cols, a->dx, r * cols);
}

/* Blocks [b0, b1). */
static void ln_bwd_range(void *ctx, int64_t b0, int64_t b1) {
    ln_bwd_job *j = ctx;
    int64_t cols = j->a->cols, rows = j->a->rows;
    float *ws;
    if (!job_alloc(&j->job, &ws)) return;
    for (int64_t b = b0; b < b1; b++) {
        float *dg = j->pdg ? j->pdg + b * cols : NULL, *db = j->pdb ? j->pdb + b * cols : NULL;
        if (dg) memset(dg, 0, (size_t)cols * sizeof(float));
        if (db) memset(db, 0, (size_t)cols * sizeof(float));
        int64_t hi = (b + 1) * j->len < rows ? (b + 1) * j->len : rows;
        for (int64_t r = b * j->len; r < hi; r++) ln_bwd_row(j, r, ws, dg, db);
    }
    free(ws);
}

ca_status cpu_layer_norm_backward(void *dev, const ca_layer_norm_backward_args *args) {
    ca_dtype dt = args->dt;
    int64_t rows = args->rows, cols = args->cols;
    const char *k = "layer_norm_backward";
    if (cols == 0) return CA_OK;
    ln_bwd_job j = {.job = {.kernel = k, .floats = 5 * cols}, .a = args, .len = block_len(rows, cols)};
    int64_t nb = blocks_of(rows, j.len), np = (args->dgamma != NULL) + (args->dbeta_ != NULL);
    /* this thread's buffers: gamma, two rows to combine the partials, then the partials */
    float *ws;
    ca_status st = rows_alloc(k, cols, 3 + np * nb, &ws);
    if (st != CA_OK) return st;
    float *acc = ws + cols, *old = ws + 2 * cols, *part = ws + 3 * cols;
    j.g = args->gamma ? cpu_view_f32(dt, args->gamma, 0, cols, ws) : NULL;
    if (args->dgamma) j.pdg = part;
    if (args->dbeta_) j.pdb = part + (args->dgamma ? nb * cols : 0);
    st = run_job(&j.job, nb, j.len * NORM_BWD_COST * cols, ln_bwd_range, &j);
    bool add = args->accumulate_params;
    if (st == CA_OK && args->dgamma) combine_params(dt, j.pdg, nb, cols, add, acc, old, args->dgamma);
    if (st == CA_OK && args->dbeta_) combine_params(dt, j.pdb, nb, cols, add, acc, old, args->dbeta_);
    free(ws);
    return st;
}
/* ---------------------------------------------------------------- embedding */

static ca_status check_indices(const char *k, ca_dtype idx_dt, const void *idx, int64_t n, int64_t rows) {
    for (int64_t i = 0; i < n; i++) {
        int64_t v = cpu_index_at(idx_dt, idx, i);
        if (v < 0 || v >= rows)
            return ca_error(CA_ERR_INVALID, "cpu kernel %s: index %lld at position %lld is outside the "
                            "table's %lld rows", k, (long long)v, (long long)i, (long long)rows);
    }
    return CA_OK;
}

typedef struct emb_job {
    nn_job job;
    const ca_embedding_args *a;
} emb_job;

/* Lookups [lo, hi). */
static void emb_range(void *ctx, int64_t lo, int64_t hi) {
    const ca_embedding_args *a = ((emb_job *)ctx)->a;
    size_t row = (size_t)a->dim * ca_dtype_size(a->dt);
    for (int64_t i = lo; i < hi; i++) {
        size_t v = (size_t)cpu_index_at(a->idx_dt, a->idx, i);
        memcpy((char *)a->y + (size_t)i * row, (const char *)a->table + v * row, row);
    }
}

ca_status cpu_embedding(void *dev, const ca_embedding_args *args) {
    const char *k = "embedding";
    if (args->n == 0) return CA_OK;
    ca_status st = check_indices(k, args->idx_dt, args->idx, args->n, args->rows);
    if (st != CA_OK || args->dim == 0) return st;
    emb_job j = {.job = {.kernel = k}, .a = args};
    int64_t cost = args->dim * (int64_t)ca_dtype_size(args->dt) / 4;
    return run_job(&j.job, args->n, cost, emb_range, &j);
}

/* The lookups grouped by table row: positions order[start[v] .. start[v + 1]) read row v, in index order.
 * One thread adds a whole group, in that order: every element of the table gets its sum in index order,
 * whatever the thread count, and no two threads write one row. */
typedef struct emb_bwd_job {
    nn_job job;
    const ca_embedding_backward_args *a;
    const int64_t *start, *order;
} emb_bwd_job;

/* dtable[v] += dy[pos[0]] + dy[pos[1]] + ... in that order. f16/bf16 add in f32 and round once per element
 * (rounding after every addition loses the small terms of a frequent token). */
static void emb_bwd_group(const ca_embedding_backward_args *a, int64_t v, const int64_t *pos, int64_t count) {
    int64_t dim = a->dim;
    if (a->dt == CA_F32) {
        for (int64_t p = 0; p < count; p++)
            add_row((float *)a->dtable + v * dim, (const float *)a->dy + pos[p] * dim, dim);
        return;
    }
    float tb[CPU_CHUNK], db[CPU_CHUNK];
    for (int64_t c0 = 0; c0 < dim; c0 += CPU_CHUNK) {
        int64_t c = dim - c0 < CPU_CHUNK ? dim - c0 : CPU_CHUNK;
        cpu_to_f32(a->dt, a->dtable, v * dim + c0, c, tb);
        for (int64_t p = 0; p < count; p++) {
            cpu_to_f32(a->dt, a->dy, pos[p] * dim + c0, c, db);
            add_row(tb, db, c);
        }
        cpu_from_f32(a->dt, tb, c, a->dtable, v * dim + c0);
    }
}

/* The groups that begin in [lo, hi) of the sorted positions (a group may run past hi). */
static void emb_bwd_range(void *ctx, int64_t lo, int64_t hi) {
    const emb_bwd_job *j = ctx;
    const ca_embedding_backward_args *a = j->a;
    int64_t k = lo;
    if (k > 0) {   /* a group begun before lo is the previous range's */
        int64_t v = cpu_index_at(a->idx_dt, a->idx, j->order[k]);
        if (j->start[v] < k) k = j->start[v + 1];
    }
    while (k < hi) {
        int64_t v = cpu_index_at(a->idx_dt, a->idx, j->order[k]), end = j->start[v + 1];
        emb_bwd_group(a, v, j->order + k, end - k);
        k = end;
    }
}

/* start[rows + 1], order[n]: the positions sorted by row, each row's in index order (a counting sort). */
static void emb_bwd_sort(const ca_embedding_backward_args *a, int64_t *start, int64_t *order) {
    memset(start, 0, (size_t)(a->rows + 1) * sizeof *start);
    for (int64_t i = 0; i < a->n; i++) start[cpu_index_at(a->idx_dt, a->idx, i) + 1]++;
    for (int64_t v = 0; v < a->rows; v++) start[v + 1] += start[v];
    for (int64_t i = 0; i < a->n; i++) order[start[cpu_index_at(a->idx_dt, a->idx, i)]++] = i;
    /* each start[v] is now row v's end, the start of row v + 1 */
    memmove(start + 1, start, (size_t)a->rows * sizeof *start);
    start[0] = 0;
}

ca_status cpu_embedding_backward(void *dev, const ca_embedding_backward_args *args) {
    const char *k = "embedding_backward";
    if (args->n == 0) return CA_OK;
    /* all indices are checked before anything is written */
    ca_status st = check_indices(k, args->idx_dt, args->idx, args->n, args->rows);
    if (st != CA_OK || args->dim == 0) return st;
    int64_t *start = malloc((size_t)(args->rows + 1 + args->n) * sizeof *start);
    if (!start)
        return ca_error(CA_ERR_NOMEM, "cpu kernel %s: out of host memory to group %lld lookups by the table's "
                        "%lld rows", k, (long long)args->n, (long long)args->rows);
    emb_bwd_job j = {.job = {.kernel = k}, .a = args, .start = start, .order = start + args->rows + 1};
    emb_bwd_sort(args, start, start + args->rows + 1);
    st = run_job(&j.job, args->n, args->dim, emb_bwd_range, &j);
    free(start);
    return st;
}

/* ------------------------------------------------------------- rms norm */

typedef struct rms_job {
    nn_job job;
    const ca_rms_norm_args *a;
    const float *g;            /* gamma as f32, or NULL */
} rms_job;

/* Rows [lo, hi); two row buffers. */
static void rms_range(void *ctx, int64_t lo, int64_t hi) {
    rms_job *j = ctx;
    const ca_rms_norm_args *a = j->a;
    int64_t cols = a->cols;
    const float *g = j->g;
    float *ws;
    if (!job_alloc(&j->job, &ws)) return;
    float *xb = ws, *yb = ws + cols;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = cpu_view_f32(a->dt, a->x, r * cols, cols, xb);
        double ss = 0.0;
        for (int64_t c = 0; c < cols; c++) ss += (double)x[c] * x[c];
        float rs = 1.0f / sqrtf((float)(ss / (double)cols) + a->eps);
        a->rstd[r] = rs;
        for (int64_t c = 0; c < cols; c++) yb[c] = g ? x[c] * rs * g[c] : x[c] * rs;
        cpu_from_f32(a->dt, yb, cols, a->y, r * cols);
    }
    free(ws);
}

ca_status cpu_rms_norm(void *dev, const ca_rms_norm_args *a) {
    int64_t rows = a->rows, cols = a->cols;
    if (rows == 0) return CA_OK;
    float *gb;
    ca_status st = rows_alloc("rms_norm", cols, 1, &gb);
    if (st != CA_OK) return st;
    rms_job j = {.job = {.kernel = "rms_norm", .floats = 2 * cols}, .a = a,
                 .g = a->gamma ? cpu_view_f32(a->dt, a->gamma, 0, cols, gb) : NULL};
    st = run_job(&j.job, rows, NORM_COST * cols, rms_range, &j);
    free(gb);
    return st;
}

/* One row of the backward: dxr = rstd (g dy - xhat mean(g dy xhat)) (before beta); dg += dy xhat. */
static void rms_bwd_row(const float *x, const float *g, const float *dy, float rs, int64_t cols, float *dxr,
                        float *dg) {
    double s = 0.0;
    for (int64_t c = 0; c < cols; c++) s += (double)(g ? g[c] * dy[c] : dy[c]) * (x[c] * rs);
    float m = (float)(s / (double)cols);
    for (int64_t c = 0; c < cols; c++) {
        float xhat = x[c] * rs, gdy = g ? g[c] * dy[c] : dy[c];
        dxr[c] = rs * (gdy - xhat * m);
        if (dg) dg[c] += dy[c] * xhat;
    }
}

/* dgamma is a sum over rows: block b of `len` rows adds its rows into pdg + b cols (NULL: not wanted). */
typedef struct rms_bwd_job {
    nn_job job;
    const ca_rms_norm_backward_args *a;
    const float *g;            /* gamma as f32, or NULL */
    int64_t len;
    float *pdg;
} rms_bwd_job;

/* Blocks [b0, b1); four row buffers. */
static void rms_bwd_range(void *ctx, int64_t b0, int64_t b1) {
    rms_bwd_job *j = ctx;
    const ca_rms_norm_backward_args *a = j->a;
    int64_t cols = a->cols;
    float *ws;
    if (!job_alloc(&j->job, &ws)) return;
    float *xb = ws, *db = ws + cols, *dxr = ws + 2 * cols, *old = ws + 3 * cols;
    for (int64_t b = b0; b < b1; b++) {
        float *dg = j->pdg ? j->pdg + b * cols : NULL;
        if (dg) memset(dg, 0, (size_t)cols * sizeof(float));
        int64_t hi = (b + 1) * j->len < a->rows ? (b + 1) * j->len : a->rows;
        for (int64_t r = b * j->len; r < hi; r++) {
            const float *x = cpu_view_f32(a->dt, a->x, r * cols, cols, xb);
            const float *dy = cpu_view_f32(a->dt, a->dy, r * cols, cols, db);
            rms_bwd_row(x, j->g, dy, a->rstd[r], cols, dxr, dg);
            if (a->beta != 0.0f) {
                cpu_to_f32(a->dt, a->dx, r * cols, cols, old);
                for (int64_t c = 0; c < cols; c++) dxr[c] += a->beta * old[c];
            }
            cpu_from_f32(a->dt, dxr, cols, a->dx, r * cols);
        }
    }
    free(ws);
}

ca_status cpu_rms_norm_backward(void *dev, const ca_rms_norm_backward_args *a) {
    int64_t rows = a->rows, cols = a->cols;
    const char *k = "rms_norm_backward";
    if (cols == 0) return CA_OK;
    rms_bwd_job j = {.job = {.kernel = k, .floats = 4 * cols}, .a = a, .len = block_len(rows, cols)};
    int64_t nb = blocks_of(rows, j.len);
    /* this thread's buffers: gamma, two rows to combine the partials, then the partials */
    float *ws;
    ca_status st = rows_alloc(k, cols, 3 + (a->dgamma ? nb : 0), &ws);
    if (st != CA_OK) return st;
    j.g = a->gamma ? cpu_view_f32(a->dt, a->gamma, 0, cols, ws) : NULL;
    j.pdg = a->dgamma ? ws + 3 * cols : NULL;
    st = run_job(&j.job, nb, j.len * NORM_BWD_COST * cols, rms_bwd_range, &j);
    if (st == CA_OK && a->dgamma)
        combine_params(a->dt, j.pdg, nb, cols, a->accumulate_params, ws + cols, ws + 2 * cols, a->dgamma);
    free(ws);
    return st;
}

/* ------------------------------------------------------------------ rope */

/* One row turned: the pairs (i, i + half) of the first 2 half dims by the angles (c, sg s); the rest
 * copied. sg is -1 for the inverse rotation. */
CPU_CLONES static void rope_row(const float *restrict x, const float *restrict c, const float *restrict s, float sg,
                                int64_t half, int64_t dim, float *restrict y) {
    for (int64_t i = 0; i < half; i++) {
        float si = sg * s[i], a = x[i], b = x[i + half];
        y[i] = a * c[i] - b * si;
        y[i + half] = b * c[i] + a * si;
    }
    for (int64_t i = 2 * half; i < dim; i++) y[i] = x[i];
}

typedef struct rope_job {
    nn_job job;
    const ca_rope_args *a;
    bool direct;               /* rows written straight into y (f32, beta 0, y is not x) */
} rope_job;

/* Rows [lo, hi) of the [batch * heads * seq, dim] view; three row buffers (x, y, the old y). */
static void rope_range(void *ctx, int64_t lo, int64_t hi) {
    rope_job *j = ctx;
    const ca_rope_args *a = j->a;
    int64_t dim = a->dim, half = a->rot / 2, per_batch = a->heads * a->seq;
    float *ws;
    if (!job_alloc(&j->job, &ws)) return;
    float *xb = ws, *yb = ws + dim, *old = ws + 2 * dim;
    for (int64_t r = lo; r < hi; r++) {
        int64_t b = a->table_batch == 1 ? 0 : r / per_batch, t = r % a->seq;
        int64_t toff = (b * a->seq + t) * half;
        const float *x = cpu_view_f32(a->dt, a->x, r * dim, dim, xb);
        float sg = a->inverse ? -1.0f : 1.0f;
        if (j->direct) {   /* f32, beta 0, y apart from x: no staging copy */
            rope_row(x, a->cos + toff, a->sin + toff, sg, half, dim, (float *)a->y + r * dim);
            continue;
        }
        rope_row(x, a->cos + toff, a->sin + toff, sg, half, dim, yb);
        if (a->beta != 0.0f) {
            cpu_to_f32(a->dt, a->y, r * dim, dim, old);
            for (int64_t c = 0; c < dim; c++) yb[c] += a->beta * old[c];
        }
        cpu_from_f32(a->dt, yb, dim, a->y, r * dim);
    }
    free(ws);
}

/* Every row's result depends on that row only: the same at any thread count. y may be x: a row is read
 * whole into f32 before it is written. */
ca_status cpu_rope(void *dev, const ca_rope_args *a) {
    int64_t rows = a->batch * a->heads * a->seq;
    if (rows == 0 || a->dim == 0) return CA_OK;
    rope_job j = {.job = {.kernel = "rope", .floats = 3 * a->dim}, .a = a,
                  .direct = a->dt == CA_F32 && a->beta == 0.0f && a->y != a->x};
    return run_job(&j.job, rows, 2 * a->dim, rope_range, &j);
}
