/* kernel_desc_impl.h: what the profiler records of a kernel call, described from the call's
 * argument struct (header-only, so every caller of CA_KCALL, the library's tests included, has them;
 * core/kernel_trace.c writes the slice). Which ops count FLOPs (docs/PROFILING.md): GEMM (2 m n k
 * per matrix), attention (its two GEMMs forward, five backward), elementwise unary and binary (1 per
 * output element), axpby (3 per element). */
#ifndef CACCEL_KERNEL_DESC_IMPL_H
#define CACCEL_KERNEL_DESC_IMPL_H

#include "base/base_impl.h"
#include <stdio.h>

typedef struct ca_kdesc {
    int dtype;            /* ca_dtype, -1: not described */
    double flops;         /* 0: not counted */
    const char *detail;   /* the unary or binary op's name, or NULL */
    char shapes[200];     /* a JSON array of the operands' shapes, or "" */
} ca_kdesc;

static inline void ca_kdesc_none(const void *args, ca_kdesc *d) { CA_UNUSED(args); CA_UNUSED(d); }

/* The matrix FLOPs of a call, all the throughput meter counts (caccel/throughput.h): GEMM and
 * attention, the work a device's peak is quoted for (elementwise ops, which with_flops also
 * shows, are left out as llm.c's and torchtitan's MFU leave them out). */
static inline double ca_kflops_gemm(const ca_gemm_args *a) {
    return 2.0 * (double)a->m * (double)a->n * (double)a->k * (double)(a->batch > 1 ? a->batch : 1);
}
static inline double ca_kflops_attn_(const ca_attention_params *p, double gemm_terms) {
    return 2.0 * (double)p->batch * (double)p->heads * (double)p->tq * (double)p->tk * gemm_terms;
}
static inline double ca_kflops_attention(const ca_attention_args *a) {
    return ca_kflops_attn_(&a->p, (double)(a->p.d + a->p.dv));   /* S = Q K^T, O = P V */
}
static inline double ca_kflops_attention_backward(const ca_attention_backward_args *a) {
    return ca_kflops_attn_(&a->p, (double)(3 * a->p.d + 2 * a->p.dv));   /* S again, dV, dP, dQ, dK */
}
static inline double ca_kflops_none(const void *args) { CA_UNUSED(args); return 0; }
#define CA_KFLOPS_(args)                                                                          \
    _Generic((args), const ca_gemm_args *: ca_kflops_gemm, const ca_attention_args *: ca_kflops_attention, \
             const ca_attention_backward_args *: ca_kflops_attention_backward, default: ca_kflops_none)(args)

static inline void ca_kdesc_gemm(const ca_gemm_args *a, ca_kdesc *d) {
    int64_t batch = a->batch > 1 ? a->batch : 1;
    d->dtype = a->a_dtype;
    d->flops = ca_kflops_gemm(a);
    snprintf(d->shapes, sizeof d->shapes, "[[%lld,%lld,%lld],[%lld,%lld,%lld]]", (long long)batch, (long long)a->m,
             (long long)a->k, (long long)batch, (long long)a->k, (long long)a->n);   /* logical: op(A), op(B) */
}

static inline void ca_kdesc_attn_(const ca_attention_params *p, ca_dtype dt, double gemm_terms, ca_kdesc *d) {
    d->dtype = dt;
    d->flops = ca_kflops_attn_(p, gemm_terms);
    snprintf(d->shapes, sizeof d->shapes, "[[%lld,%lld,%lld,%lld],[%lld,%lld,%lld,%lld]]", (long long)p->batch,
             (long long)p->heads, (long long)p->tq, (long long)p->d, (long long)p->batch, (long long)p->heads,
             (long long)p->tk, (long long)p->dv);
}

static inline void ca_kdesc_attention(const ca_attention_args *a, ca_kdesc *d) {
    ca_kdesc_attn_(&a->p, a->dt, (double)(a->p.d + a->p.dv), d);   /* S = Q K^T, O = P V */
}

static inline void ca_kdesc_attention_backward(const ca_attention_backward_args *a, ca_kdesc *d) {
    ca_kdesc_attn_(&a->p, a->dt, (double)(3 * a->p.d + 2 * a->p.dv), d);   /* S again, dV, dP, dQ, dK */
}

static inline void ca_kdesc_unary(const ca_unary_args *a, ca_kdesc *d) {
    d->dtype = a->dt;
    d->flops = (double)a->n;
    d->detail = ca_unary_op_name(a->op);
    snprintf(d->shapes, sizeof d->shapes, "[[%lld]]", (long long)a->n);
}

static inline void ca_kdesc_binary(const ca_binary_args *a, ca_kdesc *d) {
    d->dtype = a->dt;
    d->detail = ca_binary_op_name(a->op);
    double n = 1;
    size_t at = (size_t)snprintf(d->shapes, sizeof d->shapes, "[[");
    for (int i = 0; i < a->shape.ndim && i < CA_MAX_DIMS && at < sizeof d->shapes; i++) {
        n *= (double)a->shape.shape[i];
        at += (size_t)snprintf(d->shapes + at, sizeof d->shapes - at, "%s%lld", i ? "," : "", (long long)a->shape.shape[i]);
    }
    if (at < sizeof d->shapes) snprintf(d->shapes + at, sizeof d->shapes - at, "]]");
    d->flops = n;
}

static inline void ca_kdesc_rows_cols_(ca_dtype dt, int64_t rows, int64_t cols, ca_kdesc *d) {
    d->dtype = dt;
    snprintf(d->shapes, sizeof d->shapes, "[[%lld,%lld]]", (long long)rows, (long long)cols);
}

static inline void ca_kdesc_softmax(const ca_softmax_args *a, ca_kdesc *d) { ca_kdesc_rows_cols_(a->dt, a->rows, a->cols, d); }
static inline void ca_kdesc_layer_norm(const ca_layer_norm_args *a, ca_kdesc *d) { ca_kdesc_rows_cols_(a->dt, a->rows, a->cols, d); }
static inline void ca_kdesc_cross_entropy(const ca_cross_entropy_args *a, ca_kdesc *d) { ca_kdesc_rows_cols_(a->dt, a->rows, a->cols, d); }

static inline void ca_kdesc_reduce(const ca_reduce_args *a, ca_kdesc *d) {
    d->dtype = a->dt;
    snprintf(d->shapes, sizeof d->shapes, "[[%lld,%lld,%lld]]", (long long)a->outer, (long long)a->len,
             (long long)a->inner);
}

static inline void ca_kdesc_axpby(const ca_axpby_args *a, ca_kdesc *d) {
    d->dtype = a->dt;
    d->flops = 3.0 * (double)a->n;
    snprintf(d->shapes, sizeof d->shapes, "[[%lld]]", (long long)a->n);
}

#define CA_KDESC_(args, d)                                                                        \
    _Generic((args), const ca_gemm_args *: ca_kdesc_gemm, const ca_attention_args *: ca_kdesc_attention, \
             const ca_attention_backward_args *: ca_kdesc_attention_backward,                     \
             const ca_unary_args *: ca_kdesc_unary, const ca_binary_args *: ca_kdesc_binary,       \
             const ca_softmax_args *: ca_kdesc_softmax, const ca_layer_norm_args *: ca_kdesc_layer_norm, \
             const ca_cross_entropy_args *: ca_kdesc_cross_entropy, const ca_reduce_args *: ca_kdesc_reduce, \
             const ca_axpby_args *: ca_kdesc_axpby, default: ca_kdesc_none)((args), (d))

#endif
