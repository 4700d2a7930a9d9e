/* CPU multi-tensor kernels: fused AdamW and SGD, sum of squares, scale, unscale-and-check, clamp. */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_parallel.h"

#include <stdatomic.h>
#include <stdlib.h>

#define LANES 16

/* ------------------------------------------------- the list in chunks, on the threads */

/* A list's elements are taken in chunks of CPU_CHUNK, each tensor's chunks in turn, and the threads take
 * contiguous ranges of chunks. fn sees runs of whole chunks of one tensor (tensor i, elements [off,
 * off + n), `chunk` the list's index of the first), so that what it computes for an element, or a sum for a
 * chunk, is the same at every thread count. */
typedef void (*list_run_fn)(const void *ctx, int i, int64_t chunk, int64_t off, int64_t n);

typedef struct list_job {
    const ca_tensor_list *t;
    list_run_fn fn;
    const void *ctx;
} list_job;

static int64_t chunks_of(int64_t n) { return (n + CPU_CHUNK - 1) / CPU_CHUNK; }

static int64_t list_chunks(const ca_tensor_list *t) {
    int64_t c = 0;
    for (int i = 0; i < t->count; i++) c += chunks_of(t->numel[i]);
    return c;
}

static void list_range(void *ctx, int64_t lo, int64_t hi) {
    const list_job *j = ctx;
    int64_t first = 0;  /* the list's index of tensor i's first chunk */
    for (int i = 0; i < j->t->count && first < hi; i++) {
        int64_t n = j->t->numel[i], nc = chunks_of(n);
        int64_t a = lo > first ? lo - first : 0, b = hi - first < nc ? hi - first : nc;
        if (a < b) {
            int64_t off = a * CPU_CHUNK, end = b * CPU_CHUNK < n ? b * CPU_CHUNK : n;
            j->fn(j->ctx, i, first + a, off, end - off);
        }
        first += nc;
    }
}

/* fn over the whole list; `cost`: streaming elements (cpu_parallel.h) per element of the list. */
static void list_for(const ca_tensor_list *t, int64_t cost, list_run_fn fn, const void *ctx) {
    list_job j = {.t = t, .fn = fn, .ctx = ctx};
    cpu_parallel_for(list_chunks(t), cpu_grain_for(cost * CPU_CHUNK), list_range, &j);
}

/* ---------------------------------------------------------------- AdamW */

typedef struct adam_consts {
    float decay;           /* 1 - lr * weight_decay */
    float b1, c1, b2, c2;  /* beta and 1 - beta */
    float step;            /* lr / bias_correction1 */
    float inv_bc2_sqrt;    /* 1 / sqrt(bias_correction2): one division per element, not two */
    float eps, gscale;
} adam_consts;

/* One pass over p, g, m, v, in the order torch.optim.AdamW uses. */
CPU_CLONES static void adamw_f32(int64_t n, const adam_consts *kc, float *restrict p,
                                 const float *restrict g, float *restrict m, float *restrict v) {
    const adam_consts k = *kc;
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * k.gscale;
        float pi = p[i] * k.decay;
        float mi = k.b1 * m[i] + k.c1 * gi;
        float vi = k.b2 * v[i] + k.c2 * gi * gi;
        float denom = sqrtf(vi) * k.inv_bc2_sqrt + k.eps;
        p[i] = pi - k.step * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}

typedef struct adam_job {
    const ca_adamw_args *args;
    adam_consts k;
} adam_job;

static void adamw_list_run(const void *ctx, int i, int64_t chunk, int64_t off, int64_t n) {
    const adam_job *j = ctx;
    const ca_tensor_list *t = j->args->t;
    float *p = (float *)t->param[i] + off, *m = (float *)t->state1[i] + off, *v = (float *)t->state2[i] + off;
    if (t->grad_dtype == CA_F32) {
        adamw_f32(n, &j->k, p, (const float *)t->grad[i] + off, m, v);
        return;
    }
    float gb[CPU_CHUNK];
    for (int64_t o = 0; o < n; o += CPU_CHUNK) {
        int64_t c = n - o < CPU_CHUNK ? n - o : CPU_CHUNK;
        cpu_to_f32(t->grad_dtype, t->grad[i], off + o, c, gb);
        adamw_f32(c, &j->k, p + o, gb, m + o, v + o);
    }
}

/* Seven streams (p, g, m, v in; p, m, v out) and a square root and a division per element. */
ca_status cpu_adamw(void *dev, const ca_adamw_args *args) {
    const ca_adamw_args *a = args;
    adam_job j = {.args = args, .k = {
        .decay = 1.0f - a->lr * a->weight_decay,
        .b1 = a->beta1, .c1 = 1.0f - a->beta1,
        .b2 = a->beta2, .c2 = 1.0f - a->beta2,
        .step = a->lr / a->bias_correction1,
        .inv_bc2_sqrt = 1.0f / sqrtf(a->bias_correction2),
        .eps = a->eps, .gscale = a->grad_scale,
    }};
    list_for(args->t, 4, adamw_list_run, &j);
    return CA_OK;
}

/* ------------------------------------------------------------------ SGD */

typedef struct sgd_consts {
    float lr, momentum, damp1, wd, gscale;  /* damp1 = 1 - dampening */
    bool nesterov, first;
} sgd_consts;

CPU_CLONES static void sgd_f32(int64_t n, const sgd_consts *kc, float *restrict p,
                               const float *restrict g, float *restrict buf) {
    const sgd_consts k = *kc;
    /* weight decay is skipped, not multiplied by 0, so that an Inf weight
     * does not turn into NaN (torch does the same) */
    if (!buf) {
        for (int64_t i = 0; i < n; i++) {
            float gi = g[i] * k.gscale;
            if (k.wd != 0.0f) gi += k.wd * p[i];
            p[i] -= k.lr * gi;
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * k.gscale;
        if (k.wd != 0.0f) gi += k.wd * p[i];
        float b = k.first ? gi : k.momentum * buf[i] + k.damp1 * gi;
        buf[i] = b;
        float d = k.nesterov ? gi + k.momentum * b : b;
        p[i] -= k.lr * d;
    }
}

typedef struct sgd_job {
    const ca_sgd_args *args;
    sgd_consts k;
} sgd_job;

static void sgd_list_run(const void *ctx, int i, int64_t chunk, int64_t off, int64_t n) {
    const sgd_job *j = ctx;
    const ca_tensor_list *t = j->args->t;
    float *p = (float *)t->param[i] + off, *b = j->args->momentum != 0.0f ? (float *)t->state1[i] + off : NULL;
    if (t->grad_dtype == CA_F32) {
        sgd_f32(n, &j->k, p, (const float *)t->grad[i] + off, b);
        return;
    }
    float gb[CPU_CHUNK];
    for (int64_t o = 0; o < n; o += CPU_CHUNK) {
        int64_t c = n - o < CPU_CHUNK ? n - o : CPU_CHUNK;
        cpu_to_f32(t->grad_dtype, t->grad[i], off + o, c, gb);
        sgd_f32(c, &j->k, p + o, gb, b ? b + o : NULL);
    }
}

ca_status cpu_sgd(void *dev, const ca_sgd_args *args) {
    const ca_sgd_args *a = args;
    sgd_job j = {.args = args, .k = {.lr = a->lr, .momentum = a->momentum, .damp1 = 1.0f - a->dampening,
                                     .wd = a->weight_decay, .gscale = a->grad_scale, .nesterov = a->nesterov,
                                     .first = a->first_step}};
    list_for(args->t, 3, sgd_list_run, &j);
    return CA_OK;
}

/* ------------------------------------------------- list utilities (param[] in grad_dtype) */

CPU_CLONES static float sumsq_run(const float *restrict x, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += x[i + j] * x[i + j];
    float s = 0.0f;
    for (; i < n; i++) s += x[i] * x[i];
    for (int j = 0; j < LANES; j++) s += acc[j];
    return s;
}

/* Each chunk's sum in f32 into sums[chunk]. */
typedef struct sumsq_job {
    const ca_tensor_list *t;
    float *sums;
} sumsq_job;

static void sumsq_list_run(const void *ctx, int i, int64_t chunk, int64_t off, int64_t n) {
    const sumsq_job *j = ctx;
    float buf[CPU_CHUNK];
    for (int64_t o = 0; o < n; o += CPU_CHUNK, chunk++) {
        int64_t c = n - o < CPU_CHUNK ? n - o : CPU_CHUNK;
        j->sums[chunk] = sumsq_run(cpu_view_f32(j->t->grad_dtype, j->t->param[i], off + o, c, buf), c);
    }
}

/* The chunks' f32 sums, computed on the threads, are added in f64 in chunk order on this thread: the same
 * bits at every thread count. */
ca_status cpu_sum_squares(void *dev, const ca_sum_squares_args *args) {
    const ca_tensor_list *t = args->t;
    int64_t chunks = list_chunks(t);
    float small[256], *sums = chunks <= 256 ? small : malloc((size_t)chunks * sizeof(float));
    if (!sums)
        return ca_error(CA_ERR_NOMEM, "cpu kernel sum_squares: no memory for %lld chunk sums", (long long)chunks);
    sumsq_job j = {.t = t, .sums = sums};
    list_for(t, 1, sumsq_list_run, &j);
    double total = 0.0;
    for (int64_t c = 0; c < chunks; c++) total += sums[c];
    if (sums != small) free(sums);
    *args->out = args->beta == 0.0f ? (float)total : (float)((double)args->beta * (double)*args->out + total);
    return CA_OK;
}

CPU_CLONES static void scale_run(float *restrict x, int64_t n, float a) {
    for (int64_t i = 0; i < n; i++) x[i] *= a;
}

/* Scales in place, returns NaN when any result is Inf or NaN (r * 0 is NaN
 * exactly for those), else 0. */
CPU_CLONES static float scale_check_run(float *restrict x, int64_t n, float a) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) {
            float r = x[i + j] * a;
            x[i + j] = r;
            acc[j] += r * 0.0f;
        }
    float s = 0.0f;
    for (; i < n; i++) {
        float r = x[i] * a;
        x[i] = r;
        s += r * 0.0f;
    }
    for (int j = 0; j < LANES; j++) s += acc[j];
    return s;
}

CPU_CLONES static void clamp_run(float *restrict x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        v = v < lo ? lo : v;
        x[i] = v > hi ? hi : v;
    }
}

/* True when any stored half value is Inf or NaN (all exponent bits set). */
static bool half_nonfinite(ca_dtype dt, const void *x, int64_t off, int64_t n) {
    const uint16_t *h = (const uint16_t *)x + off;
    uint16_t e = dt == CA_F16 ? 0x7c00u : 0x7f80u;
    unsigned bad = 0;
    for (int64_t i = 0; i < n; i++) bad |= (h[i] & e) == e;
    return bad != 0;
}

enum list_op { LIST_SCALE, LIST_UNSCALE, LIST_CLAMP };

typedef struct apply_job {
    const ca_tensor_list *t;
    enum list_op op;
    float a, b;
    atomic_int *bad;   /* set when unscaling finds an Inf or NaN */
} apply_job;

static void apply_list_run(const void *ctx, int i, int64_t chunk, int64_t off, int64_t n) {
    const apply_job *j = ctx;
    const ca_tensor_list *t = j->t;
    void *x = t->param[i];
    float buf[CPU_CHUNK];
    bool bad = false;
    for (int64_t o = off; o < off + n; o += CPU_CHUNK) {
        int64_t c = off + n - o < CPU_CHUNK ? off + n - o : CPU_CHUNK;
        float *v = t->grad_dtype == CA_F32 ? (float *)x + o : buf;
        if (v == buf) cpu_to_f32(t->grad_dtype, x, o, c, buf);
        switch (j->op) {
        case LIST_SCALE: scale_run(v, c, j->a); break;
        case LIST_UNSCALE: {
            float s = scale_check_run(v, c, j->a);
            if (s != s && t->grad_dtype == CA_F32) bad = true;
            break;
        }
        case LIST_CLAMP: clamp_run(v, c, j->a, j->b); break;
        }
        if (v == buf) {
            cpu_from_f32(t->grad_dtype, buf, c, x, o);
            /* a finite f32 may still round to Inf in half precision */
            if (j->op == LIST_UNSCALE && half_nonfinite(t->grad_dtype, x, o, c)) bad = true;
        }
    }
    if (bad) atomic_store_explicit(j->bad, 1, memory_order_relaxed);
}

static ca_status list_apply(const ca_tensor_list *t, enum list_op op, float a, float b, float *found_inf) {
    atomic_int bad = 0;
    apply_job j = {.t = t, .op = op, .a = a, .b = b, .bad = &bad};
    list_for(t, t->grad_dtype == CA_F32 ? 1 : 2, apply_list_run, &j);
    if (atomic_load(&bad)) *found_inf = 1.0f;
    return CA_OK;
}

ca_status cpu_scale_list(void *dev, const ca_scale_list_args *args) {
    const ca_tensor_list *t = args->t;
    float alpha = args->alpha;
    return list_apply(t, LIST_SCALE, alpha, 0.0f, NULL);
}

ca_status cpu_unscale_check(void *dev, const ca_unscale_check_args *args) {
    const ca_tensor_list *t = args->t;
    float inv_scale = args->inv_scale;
    float *found_inf = args->found_inf;
    return list_apply(t, LIST_UNSCALE, inv_scale, 0.0f, found_inf);
}

ca_status cpu_clamp_list(void *dev, const ca_clamp_list_args *args) {
    const ca_tensor_list *t = args->t;
    float lo = args->lo;
    float hi = args->hi;
    return list_apply(t, LIST_CLAMP, lo, hi, NULL);
}
