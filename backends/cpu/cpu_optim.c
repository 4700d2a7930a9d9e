/* CPU multi-tensor kernels: fused AdamW and SGD, sum of squares, scale, unscale-and-check, clamp. */
#include "backends/cpu/cpu_impl.h"

#define LANES 16

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

ca_status cpu_adamw(void *dev, const ca_adamw_args *args) {
    const ca_tensor_list *t = args->t;
    const ca_adamw_args *a = args;
    adam_consts kc = {
        .decay = 1.0f - a->lr * a->weight_decay,
        .b1 = a->beta1, .c1 = 1.0f - a->beta1,
        .b2 = a->beta2, .c2 = 1.0f - a->beta2,
        .step = a->lr / a->bias_correction1,
        .inv_bc2_sqrt = 1.0f / sqrtf(a->bias_correction2),
        .eps = a->eps, .gscale = a->grad_scale,
    };
    float gb[CPU_CHUNK];
    for (int i = 0; i < t->count; i++) {
        int64_t n = t->numel[i];
        float *p = t->param[i], *m = t->state1[i], *v = t->state2[i];
        if (t->grad_dtype == CA_F32) {
            adamw_f32(n, &kc, p, t->grad[i], m, v);
            continue;
        }
        for (int64_t off = 0; off < n; off += CPU_CHUNK) {
            int64_t c = n - off < CPU_CHUNK ? n - off : CPU_CHUNK;
            cpu_to_f32(t->grad_dtype, t->grad[i], off, c, gb);
            adamw_f32(c, &kc, p + off, gb, m + off, v + off);
        }
    }
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

ca_status cpu_sgd(void *dev, const ca_sgd_args *args) {
    const ca_tensor_list *t = args->t;
    const ca_sgd_args *a = args;
    bool mom = a->momentum != 0.0f;
    sgd_consts kc = {.lr = a->lr, .momentum = a->momentum, .damp1 = 1.0f - a->dampening,
                     .wd = a->weight_decay, .gscale = a->grad_scale, .nesterov = a->nesterov,
                     .first = a->first_step};
    float gb[CPU_CHUNK];
    for (int i = 0; i < t->count; i++) {
        int64_t n = t->numel[i];
        float *p = t->param[i], *b = mom ? t->state1[i] : NULL;
        if (t->grad_dtype == CA_F32) {
            sgd_f32(n, &kc, p, t->grad[i], b);
            continue;
        }
        for (int64_t off = 0; off < n; off += CPU_CHUNK) {
            int64_t c = n - off < CPU_CHUNK ? n - off : CPU_CHUNK;
            cpu_to_f32(t->grad_dtype, t->grad[i], off, c, gb);
            sgd_f32(c, &kc, p + off, gb, b ? b + off : NULL);
        }
    }
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

ca_status cpu_sum_squares(void *dev, const ca_sum_squares_args *args) {
    const ca_tensor_list *t = args->t;
    float *out = args->out;
    float beta = args->beta;
    double total = 0.0;  /* per-chunk f32 sums, added in f64 */
    float buf[CPU_CHUNK];
    for (int i = 0; i < t->count; i++)
        for (int64_t off = 0; off < t->numel[i]; off += CPU_CHUNK) {
            int64_t c = t->numel[i] - off < CPU_CHUNK ? t->numel[i] - off : CPU_CHUNK;
            total += sumsq_run(cpu_view_f32(t->grad_dtype, t->param[i], off, c, buf), c);
        }
    *out = beta == 0.0f ? (float)total : (float)((double)beta * (double)*out + total);
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

static ca_status list_apply(const ca_tensor_list *t, enum list_op op, float a, float b, float *found_inf) {
    float buf[CPU_CHUNK];
    bool bad = false;
    for (int i = 0; i < t->count; i++) {
        int64_t n = t->numel[i];
        void *x = t->param[i];
        for (int64_t off = 0; off < n; off += CPU_CHUNK) {
            int64_t c = n - off < CPU_CHUNK ? n - off : CPU_CHUNK;
            float *v = t->grad_dtype == CA_F32 ? (float *)x + off : buf;
            if (v == buf) cpu_to_f32(t->grad_dtype, x, off, c, buf);
            switch (op) {
            case LIST_SCALE: scale_run(v, c, a); break;
            case LIST_UNSCALE: {
                float s = scale_check_run(v, c, a);
                if (s != s && t->grad_dtype == CA_F32) bad = true;
                break;
            }
            case LIST_CLAMP: clamp_run(v, c, a, b); break;
            }
            if (v == buf) {
                cpu_from_f32(t->grad_dtype, buf, c, x, off);
                /* a finite f32 may still round to Inf in half precision */
                if (op == LIST_UNSCALE && half_nonfinite(t->grad_dtype, x, off, c)) bad = true;
            }
        }
    }
    if (bad) *found_inf = 1.0f;
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
