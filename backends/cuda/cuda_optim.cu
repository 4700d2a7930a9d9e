/* CUDA multi-tensor kernels: fused AdamW and SGD, sum of squares, scale, unscale-and-check, clamp; one launch per group of up to 36 tensors. */
#include "backends/cuda/cuda_common.cuh"

/* A group of tensors passed by value as kernel parameters (under the 4 KiB
 * limit), split into blocks of CHUNK elements: block b works on tensor t
 * with start[t] <= b < start[t + 1]. */
#define LIST_MAX 36
#define CHUNK 4096

struct list_group {
    int count;
    void *p[LIST_MAX];
    const void *g[LIST_MAX];
    void *s1[LIST_MAX];
    void *s2[LIST_MAX];
    int64_t n[LIST_MAX];
    int64_t start[LIST_MAX + 1];
};

/* The tensor of this block and the element range [*lo, *hi). */
CU_D int group_find(const list_group &G, int64_t b, int64_t *lo, int64_t *hi) {
    int t = 0;
    while (t + 1 < G.count && G.start[t + 1] <= b) t++;
    *lo = (b - G.start[t]) * CHUNK;
    int64_t h = *lo + CHUNK;
    *hi = h < G.n[t] ? h : G.n[t];
    return t;
}

/* Calls launch(group, blocks) for consecutive groups of the non-empty tensors. */
template <typename F>
static ca_status for_groups(cuda_device *d, const char *k, const ca_tensor_list *t, bool s1, bool s2, F launch) {
    list_group G;
    G.count = 0;
    G.start[0] = 0;
    for (int i = 0; i <= t->count; i++) {
        bool flush = i == t->count || G.count == LIST_MAX;
        if (flush && G.count > 0) {
            launch(G, G.start[G.count]);
            ca_status st = CU_LAUNCHED(d, k);
            if (st != CA_OK) return st;
            G.count = 0;
        }
        if (i == t->count) break;
        if (t->numel[i] == 0) continue;
        int c = G.count;
        G.p[c] = t->param[i];
        G.g[c] = t->grad ? t->grad[i] : NULL;
        G.s1[c] = s1 ? t->state1[i] : NULL;
        G.s2[c] = s2 ? t->state2[i] : NULL;
        G.n[c] = t->numel[i];
        G.start[c + 1] = G.start[c] + (t->numel[i] + CHUNK - 1) / CHUNK;
        G.count++;
    }
    return CA_OK;
}

/* ----------------------------------------------------------------- AdamW */

struct adam_consts {
    float decay, b1, c1, b2, c2, step, inv_bc2_sqrt, eps, gscale;
};

/* torch.optim.AdamW's order of operations, as the CPU's adamw_f32. */
template <typename T>
__global__ void adamw_k(list_group G, adam_consts k) {
    int64_t lo, hi;
    int t = group_find(G, blockIdx.x, &lo, &hi);
    float *p = (float *)G.p[t], *m = (float *)G.s1[t], *v = (float *)G.s2[t];
    const typename T::S *g = (const typename T::S *)G.g[t];
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float gi = T::ld(g, i) * k.gscale;
        float pi = p[i] * k.decay;
        float mi = k.b1 * m[i] + k.c1 * gi;
        float vi = k.b2 * v[i] + k.c2 * gi * gi;
        float denom = sqrtf(vi) * k.inv_bc2_sqrt + k.eps;
        p[i] = pi - k.step * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}

extern "C" ca_status cu_adamw(void *dev, const ca_adamw_args *args) {
    const ca_tensor_list *t = args->t;
    const ca_adamw_args *a = args;
    cuda_device *d = (cuda_device *)dev;
    const char *k = "adamw";
    ca_status st = CA_OK;
    if (t->count == 0) return CA_OK;
    if ((st = cu_enter(d, "kernel adamw")) != CA_OK) return st;
    adam_consts kc;
    kc.decay = 1.0f - a->lr * a->weight_decay;
    kc.b1 = a->beta1;
    kc.c1 = 1.0f - a->beta1;
    kc.b2 = a->beta2;
    kc.c2 = 1.0f - a->beta2;
    kc.step = a->lr / a->bias_correction1;
    kc.inv_bc2_sqrt = 1.0f / sqrtf(a->bias_correction2);
    kc.eps = a->eps;
    kc.gscale = a->grad_scale;
    ca_dtype dt = t->grad_dtype;
    return for_groups(d, k, t, true, true, [&](const list_group &G, int64_t blocks) {
        CU_FLOAT_SWITCH(dt, T, adamw_k<T><<<(unsigned)blocks, CU_THREADS, 0, d->stream>>>(G, kc));
    });
}

/* ------------------------------------------------------------------- SGD */

struct sgd_consts {
    float lr, momentum, damp1, wd, gscale;
    bool nesterov, first;
};

template <typename T>
__global__ void sgd_k(list_group G, sgd_consts k) {
    int64_t lo, hi;
    int t = group_find(G, blockIdx.x, &lo, &hi);
    float *p = (float *)G.p[t], *buf = (float *)G.s1[t];
    const typename T::S *g = (const typename T::S *)G.g[t];
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float gi = T::ld(g, i) * k.gscale;
        if (k.wd != 0.0f) gi += k.wd * p[i];   /* skipped, not times 0: an Inf weight stays Inf */
        if (!buf) {
            p[i] -= k.lr * gi;
            continue;
        }
        float b = k.first ? gi : k.momentum * buf[i] + k.damp1 * gi;
        buf[i] = b;
        float dd = k.nesterov ? gi + k.momentum * b : b;
        p[i] -= k.lr * dd;
    }
}

extern "C" ca_status cu_sgd(void *dev, const ca_sgd_args *args) {
    const ca_tensor_list *t = args->t;
    const ca_sgd_args *a = args;
    cuda_device *d = (cuda_device *)dev;
    const char *k = "sgd";
    bool mom = a->momentum != 0.0f;
    ca_status st = CA_OK;
    if (t->count == 0) return CA_OK;
    if ((st = cu_enter(d, "kernel sgd")) != CA_OK) return st;
    sgd_consts kc;
    kc.lr = a->lr;
    kc.momentum = a->momentum;
    kc.damp1 = 1.0f - a->dampening;
    kc.wd = a->weight_decay;
    kc.gscale = a->grad_scale;
    kc.nesterov = a->nesterov;
    kc.first = a->first_step;
    ca_dtype dt = t->grad_dtype;
    return for_groups(d, k, t, mom, false, [&](const list_group &G, int64_t blocks) {
        CU_FLOAT_SWITCH(dt, T, sgd_k<T><<<(unsigned)blocks, CU_THREADS, 0, d->stream>>>(G, kc));
    });
}

/* ----------------------------------------- list utilities (param[] in grad_dtype) */

/* Per block: sum of x^2 in f64, added to *acc, or in deterministic mode stored in part[blockIdx.x] (the
 * atomics' order varies run to run; sumsq_ordered_k adds the partials in a fixed order). */
template <typename T>
__global__ void sumsq_k(list_group G, double *acc, double *part) {
    __shared__ double shd[32];
    int64_t lo, hi;
    int t = group_find(G, blockIdx.x, &lo, &hi);
    const typename T::S *x = (const typename T::S *)G.p[t];
    float s = 0.0f;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float v = T::ld(x, i);
        s += v * v;
    }
    double tot = cu_block_reduce((double)s, CuSum(), shd);
    if (threadIdx.x == 0) {
        if (part) part[blockIdx.x] = tot;
        else atomicAdd(acc, tot);
    }
}

/* Deterministic mode: *acc = the nb block partials summed in a fixed order (one block). */
__global__ void sumsq_ordered_k(const double *part, int64_t nb, double *acc) {
    __shared__ double shd[32];
    double s = 0.0;
    for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) s += part[b];
    s = cu_block_reduce(s, CuSum(), shd);
    if (threadIdx.x == 0) *acc = s;
}

__global__ void sumsq_final_k(const double *acc, float *out, float beta) {
    double total = *acc;
    *out = beta == 0.0f ? (float)total : (float)((double)beta * (double)*out + total);
}

extern "C" ca_status cu_sum_squares(void *dev, const ca_sum_squares_args *args) {
    const ca_tensor_list *t = args->t;
    float *out = args->out;
    float beta = args->beta;
    cuda_device *d = (cuda_device *)dev;
    const char *k = "sum_squares";
    ca_status st = CA_OK;
    if ((st = cu_enter(d, "kernel sum_squares")) != CA_OK) return st;
    int64_t nb = 0;   /* deterministic mode: one partial per block of every group */
    if (d->deterministic)
        for (int i = 0; i < t->count; i++) nb += (t->numel[i] + CHUNK - 1) / CHUNK;
    void *tmp = NULL;
    if ((st = cu_tmp_alloc(d, sizeof(double) * (size_t)(1 + nb), &tmp)) != CA_OK)
        return ca_error_context("cuda kernel %s", k);
    double *acc = (double *)tmp, *part = nb ? acc + 1 : NULL;
    int64_t base = 0;
    cudaError_t e = cudaMemsetAsync(acc, 0, sizeof(double), d->stream);
    if (e != cudaSuccess) {
        cu_tmp_free(d, tmp);
        return cu_error_at(e, __FILE__, __LINE__, "cuda kernel %s: clearing the accumulator", k);
    }
    ca_dtype dt = t->grad_dtype;
    st = for_groups(d, k, t, false, false, [&](const list_group &G, int64_t blocks) {
        CU_FLOAT_SWITCH(dt, T, sumsq_k<T><<<(unsigned)blocks, CU_THREADS, 0, d->stream>>>(G, acc,
            part ? part + base : (double *)NULL));
        base += blocks;
    });
    if (st == CA_OK && part) {
        sumsq_ordered_k<<<1, CU_THREADS, 0, d->stream>>>(part, nb, acc);
        st = CU_LAUNCHED(d, k);
    }
    if (st == CA_OK) {
        sumsq_final_k<<<1, 1, 0, d->stream>>>(acc, out, beta);
        st = CU_LAUNCHED(d, k);
    }
    cu_tmp_free(d, tmp);
    return st;
}

enum list_op { LIST_SCALE, LIST_UNSCALE, LIST_CLAMP };

/* x = x * a (scale, unscale) or clamp(x, a, b) in place; unscale flags a
 * stored result that is Inf or NaN (a finite f32 may round to Inf in half). */
template <typename T>
__global__ void list_k(list_group G, int op, float a, float b, float *found_inf) {
    int64_t lo, hi;
    int t = group_find(G, blockIdx.x, &lo, &hi);
    typename T::S *x = (typename T::S *)G.p[t];
    bool bad = false;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float v = T::ld(x, i);
        if (op == LIST_CLAMP) {
            v = v < a ? a : v;
            v = v > b ? b : v;
        } else {
            v = v * a;
        }
        T::st(x, i, v);
        if (op == LIST_UNSCALE && !isfinite(T::ld(x, i))) bad = true;
    }
    if (bad) *found_inf = 1.0f;
}

static ca_status list_apply(cuda_device *d, const char *k, const ca_tensor_list *t, enum list_op op, float a,
                            float b, float *found_inf) {
    ca_status st = CA_OK;
    if (t->count == 0) return CA_OK;
    if ((st = cu_enter(d, k)) != CA_OK) return st;
    ca_dtype dt = t->grad_dtype;
    return for_groups(d, k, t, false, false, [&](const list_group &G, int64_t blocks) {
        CU_FLOAT_SWITCH(dt, T, list_k<T><<<(unsigned)blocks, CU_THREADS, 0, d->stream>>>(G, (int)op, a, b, found_inf));
    });
}

extern "C" ca_status cu_scale_list(void *dev, const ca_scale_list_args *args) {
    const ca_tensor_list *t = args->t;
    float alpha = args->alpha;
    return list_apply((cuda_device *)dev, "scale_list", t, LIST_SCALE, alpha, 0.0f, NULL);
}

extern "C" ca_status cu_unscale_check(void *dev, const ca_unscale_check_args *args) {
    const ca_tensor_list *t = args->t;
    float inv_scale = args->inv_scale;
    float *found_inf = args->found_inf;
    return list_apply((cuda_device *)dev, "unscale_check", t, LIST_UNSCALE, inv_scale, 0.0f, found_inf);
}

extern "C" ca_status cu_clamp_list(void *dev, const ca_clamp_list_args *args) {
    const ca_tensor_list *t = args->t;
    float lo = args->lo;
    float hi = args->hi;
    return list_apply((cuda_device *)dev, "clamp_list", t, LIST_CLAMP, lo, hi, NULL);
}
