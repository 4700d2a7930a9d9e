/* CPU row-wise nn kernels: softmax/log_softmax, cross-entropy, layer norm (each + backward), embedding (+ backward). */
#include "backends/cpu/cpu_impl.h"

#include <stdlib.h>

#define LANES 16

/* Row scratch for f16/bf16 data: `count` arrays of `cols` floats. */
static ca_status rows_alloc(const char *kernel, int64_t cols, int count, float **out) {
    *out = malloc((size_t)cols * (size_t)count * sizeof(float));
    if (!*out)
        return ca_error(CA_ERR_NOMEM, "cpu kernel %s: out of host memory for %d row buffers of %lld floats",
                        kernel, count, (long long)cols);
    return CA_OK;
}

/* Rows with few columns are handled a block of rows at a time, so that the
 * exp loop runs over a whole block (vector-wide) rather than one short row. */
#define SMALL_COLS 256

static int64_t block_rows(int64_t cols) { return cols <= SMALL_COLS ? CPU_CHUNK / cols : 1; }

/* Block buffers: 3 arrays of max(CPU_CHUNK, cols) floats. */
static ca_status block_alloc(const char *kernel, int64_t cols, float **ws, int64_t *len) {
    *len = cols > CPU_CHUNK ? cols : CPU_CHUNK;
    return rows_alloc(kernel, *len, 3, ws);
}

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

ca_status cpu_softmax(void *dev, const ca_softmax_args *args) {
    bool log = args->log;
    ca_dtype dt = args->dt;
    int64_t rows = args->rows;
    int64_t cols = args->cols;
    const void *x = args->x;
    void *y = args->y;
    const char *k = log ? "log_softmax" : "softmax";
    ca_status st = CA_OK;
    if (rows == 0 || cols == 0) return CA_OK;
    float *ws, m[CPU_CHUNK], sum[CPU_CHUNK];
    int64_t len, R = block_rows(cols);
    if ((st = block_alloc(k, cols, &ws, &len)) != CA_OK) return st;
    float *xb = ws, *e = ws + len, *ob = ws + 2 * len;
    for (int64_t r0 = 0; r0 < rows; r0 += R) {
        int64_t nr = rows - r0 < R ? rows - r0 : R, n = nr * cols;
        const float *xs = cpu_view_f32(dt, x, r0 * cols, n, xb);
        float *out = dt == CA_F32 ? (float *)y + r0 * cols : ob;
        row_max(xs, nr, cols, m);
        exp_rows(xs, nr, cols, m, e);
        row_sum(e, nr, cols, sum);
        for (int64_t r = 0; r < nr; r++) {
            float s = sum[r];
            if (log)
                sub_row(xs + r * cols, cols, m[r] + logf(s), out + r * cols);
            else
                scale_row(memcpy(out + r * cols, e + r * cols, (size_t)cols * sizeof(float)), cols,
                          1.0f / s);
        }
        if (dt != CA_F32) cpu_from_f32(dt, ob, n, y, r0 * cols);
    }
    free(ws);
    return CA_OK;
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

ca_status cpu_softmax_backward(void *dev, const ca_softmax_backward_args *args) {
    bool log = args->log;
    ca_dtype dt = args->dt;
    int64_t rows = args->rows;
    int64_t cols = args->cols;
    const void *y = args->y;
    const void *dy = args->dy;
    void *dx = args->dx;
    float beta = args->beta;
    const char *k = log ? "log_softmax_backward" : "softmax_backward";
    ca_status st = CA_OK;
    if (rows == 0 || cols == 0) return CA_OK;
    float *ws = NULL;
    if ((dt != CA_F32 || dx == dy || dx == y) && (st = rows_alloc(k, cols, 3, &ws)) != CA_OK)
        return st;
    for (int64_t r = 0; r < rows; r++) {
        const float *yr = row_in(dt, y, r, cols, ws);
        const float *dr = row_in(dt, dy, r, cols, ws + cols);
        float s = log ? cpu_run_sum(dr, cols) : dot_row(dr, yr, cols);
        float *out = ws ? ws + 2 * cols : (float *)dx + r * cols;
        if (ws && beta != 0.0f) cpu_to_f32(dt, dx, r * cols, cols, out);
        softmax_grad_row(log, yr, dr, cols, s, beta, out);
        if (ws) cpu_from_f32(dt, out, cols, dx, r * cols);
    }
    free(ws);
    return CA_OK;
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

ca_status cpu_cross_entropy(void *dev, const ca_cross_entropy_args *args) {
    ca_dtype dt = args->dt;
    int64_t rows = args->rows;
    int64_t cols = args->cols;
    const void *logits = args->logits;
    ca_dtype label_dt = args->label_dt;
    const void *labels = args->labels;
    int64_t ignore_index = args->ignore_index;
    float *loss = args->loss;
    float *lse = args->lse;
    float *count = args->count;
    const char *k = "cross_entropy";
    ca_status st = CA_OK;
    for (int64_t r = 0; r < rows; r++)
        if ((st = check_label(k, r, cpu_index_at(label_dt, labels, r), cols, ignore_index)) != CA_OK)
            return st;
    float *ws, m[CPU_CHUNK], sum[CPU_CHUNK];
    int64_t len, R = block_rows(cols);
    if ((st = block_alloc(k, cols, &ws, &len)) != CA_OK) return st;
    float *xb = ws, *e = ws + len;
    double total = 0.0;
    int64_t n = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += R) {
        int64_t nr = rows - r0 < R ? rows - r0 : R;
        const float *xs = cpu_view_f32(dt, logits, r0 * cols, nr * cols, xb);
        row_max(xs, nr, cols, m);
        exp_rows(xs, nr, cols, m, e);
        row_sum(e, nr, cols, sum);
        for (int64_t r = 0; r < nr; r++) {
            float l = m[r] + logf(sum[r]);
            lse[r0 + r] = l;
            int64_t label = cpu_index_at(label_dt, labels, r0 + r);
            if (label == ignore_index) continue;
            total += (double)l - (double)xs[r * cols + label];
            n++;
        }
    }
    free(ws);
    *count = (float)n;
    *loss = n ? (float)(total / (double)n) : NAN;  /* all rows ignored: NaN, as torch */
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

ca_status cpu_cross_entropy_backward(void *dev, const ca_cross_entropy_backward_args *args) {
    ca_dtype dt = args->dt;
    int64_t rows = args->rows;
    int64_t cols = args->cols;
    const void *logits = args->logits;
    const float *lse = args->lse;
    ca_dtype label_dt = args->label_dt;
    const void *labels = args->labels;
    int64_t ignore_index = args->ignore_index;
    const float *dloss = args->dloss;
    const float *count = args->count;
    void *dlogits = args->dlogits;
    float beta = args->beta;
    const char *k = "cross_entropy_backward";
    ca_status st = CA_OK;
    if (rows == 0) return CA_OK;
    for (int64_t r = 0; r < rows; r++)
        if ((st = check_label(k, r, cpu_index_at(label_dt, labels, r), cols, ignore_index)) != CA_OK)
            return st;
    float *ws;
    int64_t len, R = block_rows(cols);
    if ((st = block_alloc(k, cols, &ws, &len)) != CA_OK) return st;
    float *xb = ws, *e = ws + len, *ob = ws + 2 * len;
    float scale = *count > 0.0f ? *dloss / *count : 0.0f;
    for (int64_t r0 = 0; r0 < rows; r0 += R) {
        int64_t nr = rows - r0 < R ? rows - r0 : R, n = nr * cols;
        const float *xs = cpu_view_f32(dt, logits, r0 * cols, n, xb);
        /* e = softmax - onehot, zero on ignored rows */
        exp_rows(xs, nr, cols, lse + r0, e);
        for (int64_t r = 0; r < nr; r++) {
            int64_t label = cpu_index_at(label_dt, labels, r0 + r);
            if (label == ignore_index)
                memset(e + r * cols, 0, (size_t)cols * sizeof(float));
            else
                e[r * cols + label] -= 1.0f;
        }
        float *out = dt == CA_F32 ? (float *)dlogits + r0 * cols : ob;
        if (dt != CA_F32 && beta != 0.0f) cpu_to_f32(dt, dlogits, r0 * cols, n, ob);
        axpby_block(e, n, scale, beta, out);
        if (dt != CA_F32) cpu_from_f32(dt, ob, n, dlogits, r0 * cols);
    }
    free(ws);
    return CA_OK;
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

ca_status cpu_layer_norm(void *dev, const ca_layer_norm_args *args) {
    ca_dtype dt = args->dt;
    int64_t rows = args->rows;
    int64_t cols = args->cols;
    const void *x = args->x;
    const void *gamma = args->gamma;
    const void *beta_ = args->beta_;
    float eps = args->eps;
    void *y = args->y;
    float *mean = args->mean;
    float *rstd = args->rstd;
    const char *k = "layer_norm";
    ca_status st = CA_OK;
    if (rows == 0) return CA_OK;
    float *ws = NULL;
    if (dt != CA_F32 && (st = rows_alloc(k, cols, 4, &ws)) != CA_OK) return st;
    const float *g = NULL, *b = NULL;
    if (gamma) g = cpu_view_f32(dt, gamma, 0, cols, ws ? ws + 2 * cols : NULL);
    if (beta_) b = cpu_view_f32(dt, beta_, 0, cols, ws ? ws + 3 * cols : NULL);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = row_in(dt, x, r, cols, ws);
        float mu = cpu_run_sum(xr, cols) / (float)cols;
        float var = sq_dev_sum(xr, cols, mu) / (float)cols;
        float rs = 1.0f / sqrtf(var + eps);
        if (mean) mean[r] = mu;
        if (rstd) rstd[r] = rs;
        float *out = dt == CA_F32 ? (float *)y + r * cols : ws + cols;
        norm_row(xr, cols, mu, rs, g, b, out);
        if (dt != CA_F32) cpu_from_f32(dt, out, cols, y, r * cols);
    }
    free(ws);
    return CA_OK;
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

ca_status cpu_layer_norm_backward(void *dev, const ca_layer_norm_backward_args *args) {
    ca_dtype dt = args->dt;
    int64_t rows = args->rows;
    int64_t cols = args->cols;
    const void *x = args->x;
    const void *gamma = args->gamma;
    const float *mean = args->mean;
    const float *rstd = args->rstd;
    const void *dy = args->dy;
    void *dx = args->dx;
    float beta = args->beta;
    void *dgamma = args->dgamma;
    void *dbeta_ = args->dbeta_;
    bool accumulate_params = args->accumulate_params;
    const char *k = "layer_norm_backward";
    ca_status st = CA_OK;
    /* rows of work: x, dy, xhat, gdy, dx out, gamma; then dgamma, dbeta accumulators */
    float *ws = NULL;
    int64_t c = cols > 0 ? cols : 1;
    if ((st = rows_alloc(k, c, 8, &ws)) != CA_OK) return st;
    float *xb = ws, *db = ws + c, *xhat = ws + 2 * c, *gdy = ws + 3 * c, *ob = ws + 4 * c;
    float *gb = ws + 5 * c, *dga = ws + 6 * c, *dba = ws + 7 * c;
    const float *g = gamma ? cpu_view_f32(dt, gamma, 0, cols, gb) : NULL;
    if (dgamma) memset(dga, 0, (size_t)c * sizeof(float));
    if (dbeta_) memset(dba, 0, (size_t)c * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = row_in(dt, x, r, cols, xb);
        const float *dr = row_in(dt, dy, r, cols, db);
        float s1, s2;
        ln_bwd_sums(xr, dr, g, cols, mean[r], rstd[r], xhat, gdy, &s1, &s2);
        /* before dx is written: dx may be dy itself */
        ln_bwd_params(xhat, dr, cols, dgamma ? dga : NULL, dbeta_ ? dba : NULL);
        if (dx) {
            float *out = dt == CA_F32 ? (float *)dx + r * cols : ob;
            if (dt != CA_F32 && beta != 0.0f) cpu_to_f32(dt, dx, r * cols, cols, ob);
            ln_bwd_dx(xhat, gdy, cols, rstd[r], s1 / (float)cols, s2 / (float)cols, beta, out);
            if (dt != CA_F32) cpu_from_f32(dt, ob, cols, dx, r * cols);
        }
    }
    /* parameters: overwrite, or add to what is there */
    void *outs[2] = {dgamma, dbeta_};
    float *accs[2] = {dga, dba};
    for (int p = 0; p < 2; p++) {
        if (!outs[p] || cols == 0) continue;
        if (accumulate_params) {
            cpu_to_f32(dt, outs[p], 0, cols, ob);
            for (int64_t i = 0; i < cols; i++) accs[p][i] += ob[i];
        }
        cpu_from_f32(dt, accs[p], cols, outs[p], 0);
    }
    free(ws);
    return CA_OK;
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

ca_status cpu_embedding(void *dev, const ca_embedding_args *args) {
    ca_dtype dt = args->dt;
    int64_t n = args->n;
    int64_t rows = args->rows;
    int64_t dim = args->dim;
    const void *table = args->table;
    ca_dtype idx_dt = args->idx_dt;
    const void *idx = args->idx;
    void *y = args->y;
    const char *k = "embedding";
    size_t es = ca_dtype_size(dt);
    if (n == 0) return CA_OK;
    ca_status st = check_indices(k, idx_dt, idx, n, rows);
    if (st != CA_OK) return st;
    if (dim == 0) return CA_OK;
    size_t row = (size_t)dim * es;
    for (int64_t i = 0; i < n; i++)
        memcpy((char *)y + (size_t)i * row, (const char *)table + (size_t)cpu_index_at(idx_dt, idx, i) * row, row);
    return CA_OK;
}

CPU_CLONES static void add_row(float *restrict t, const float *restrict d, int64_t n) {
    for (int64_t i = 0; i < n; i++) t[i] += d[i];
}

ca_status cpu_embedding_backward(void *dev, const ca_embedding_backward_args *args) {
    ca_dtype dt = args->dt;
    int64_t n = args->n;
    int64_t rows = args->rows;
    int64_t dim = args->dim;
    ca_dtype idx_dt = args->idx_dt;
    const void *idx = args->idx;
    const void *dy = args->dy;
    void *dtable = args->dtable;
    const char *k = "embedding_backward";
    if (n == 0) return CA_OK;
    /* all indices are checked before anything is written */
    ca_status st = check_indices(k, idx_dt, idx, n, rows);
    if (st != CA_OK) return st;
    if (dim == 0) return CA_OK;
    float tb[CPU_CHUNK], db[CPU_CHUNK];
    for (int64_t i = 0; i < n; i++) {
        int64_t v = cpu_index_at(idx_dt, idx, i);
        if (dt == CA_F32) {
            add_row((float *)dtable + v * dim, (const float *)dy + i * dim, dim);
            continue;
        }
        for (int64_t c0 = 0; c0 < dim; c0 += CPU_CHUNK) {
            int64_t c = dim - c0 < CPU_CHUNK ? dim - c0 : CPU_CHUNK;
            cpu_to_f32(dt, dtable, v * dim + c0, c, tb);
            cpu_to_f32(dt, dy, i * dim + c0, c, db);
            add_row(tb, db, c);
            cpu_from_f32(dt, tb, c, dtable, v * dim + c0);
        }
    }
    return CA_OK;
}

/* ------------------------------------------------------------- rms norm */

ca_status cpu_rms_norm(void *dev, const ca_rms_norm_args *a) {
    int64_t rows = a->rows, cols = a->cols;
    if (rows == 0) return CA_OK;
    float *ws;
    ca_status st = rows_alloc("rms_norm", cols, 3, &ws);
    if (st != CA_OK) return st;
    float *xb = ws, *gb = ws + cols, *yb = ws + 2 * cols;
    const float *g = a->gamma ? cpu_view_f32(a->dt, a->gamma, 0, cols, gb) : NULL;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = cpu_view_f32(a->dt, a->x, r * cols, cols, xb);
        double ss = 0.0;
        for (int64_t c = 0; c < cols; c++) ss += (double)x[c] * x[c];
        float rs = 1.0f / sqrtf((float)(ss / (double)cols) + a->eps);
        a->rstd[r] = rs;
        for (int64_t c = 0; c < cols; c++) yb[c] = g ? x[c] * rs * g[c] : x[c] * rs;
        cpu_from_f32(a->dt, yb, cols, a->y, r * cols);
    }
    free(ws);
    return CA_OK;
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

ca_status cpu_rms_norm_backward(void *dev, const ca_rms_norm_backward_args *a) {
    int64_t rows = a->rows, cols = a->cols;
    if (cols == 0) return CA_OK;
    float *ws;
    ca_status st = rows_alloc("rms_norm_backward", cols, 6, &ws);
    if (st != CA_OK) return st;
    float *xb = ws, *gb = ws + cols, *db = ws + 2 * cols, *dxr = ws + 3 * cols, *old = ws + 4 * cols;
    float *dg = a->dgamma ? ws + 5 * cols : NULL;
    if (dg) memset(dg, 0, (size_t)cols * sizeof(float));
    const float *g = a->gamma ? cpu_view_f32(a->dt, a->gamma, 0, cols, gb) : NULL;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = cpu_view_f32(a->dt, a->x, r * cols, cols, xb);
        const float *dy = cpu_view_f32(a->dt, a->dy, r * cols, cols, db);
        rms_bwd_row(x, g, dy, a->rstd[r], cols, dxr, dg);
        if (a->beta != 0.0f) {
            cpu_to_f32(a->dt, a->dx, r * cols, cols, old);
            for (int64_t c = 0; c < cols; c++) dxr[c] += a->beta * old[c];
        }
        cpu_from_f32(a->dt, dxr, cols, a->dx, r * cols);
    }
    if (dg) {
        if (a->accumulate_params) {
            cpu_to_f32(a->dt, a->dgamma, 0, cols, old);
            for (int64_t c = 0; c < cols; c++) dg[c] += old[c];
        }
        cpu_from_f32(a->dt, dg, cols, a->dgamma, 0);
    }
    free(ws);
    return CA_OK;
}
