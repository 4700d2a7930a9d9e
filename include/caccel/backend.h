/* caccel/backend.h: the plugin ABI: device, kernel, allocator, collective and store vtables. */
#ifndef CACCEL_BACKEND_H
#define CACCEL_BACKEND_H

/*
 * Who uses this header: authors of device backends (cpu, cuda, xla_stub) and
 * collective backends (single, mpi, gloo, nccl). Training programs never need it.
 *
 * Rules of the ABI (PJRT-style):
 *  - every table starts with `struct_size` and `abi_version`; fields are only
 *    ever appended, so a plugin built against an older minor ABI is accepted
 *    and the core treats the fields it lacks (beyond its struct_size) as NULL;
 *  - a plugin whose major ABI differs from CA_ABI_MAJOR is refused, never called;
 *  - a NULL optional slot means "unsupported here": the core either falls back
 *    or fails with CA_ERR_UNSUPPORTED naming the backend and the slot;
 *  - every pointer named `dev`, `x`, `y`, `a`, `b`... in a kernel is a device
 *    pointer: the core never dereferences it;
 *  - every function returns a ca_status and, on failure, records a message
 *    with ca_error() (include the backend's name and what was asked for).
 *
 * Threading: a device context is used by one host thread at a time (the core
 * serialises calls per device); allocators must be thread-safe (the dataloader's
 * prefetch thread allocates); collective calls on one communicator come from one
 * thread, but ca_work wait/test may be called from another.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <caccel/status.h>
#include <caccel/types.h>
#include <caccel/version.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ kernels */

/*
 * ABI 3: every kernel takes the device context and ONE argument struct,
 * `ca_status (*slot)(void *dev, const ca_<slot>_args *args)`, as PJRT's C API does.
 * Each struct starts with `struct_size` (the caller's sizeof, set by the core's call
 * macro), so a struct may grow by appending fields: a backend reads a field beyond
 * args->struct_size as zero. The core checks every call's shapes, dtypes, enum values
 * and NULL pointers (base/kernel_check_impl.h, ca_kcheck_<slot>) before the backend
 * sees it; a backend checks only its own limits and what depends on the data (an
 * index out of range).
 *
 * Every output named y/dx/... takes a `beta` where noted: out = beta * out + result;
 * beta == 0 means out is not read. Shapes are plain integers; all buffers are
 * contiguous unless a stride is passed. A NULL slot is "unsupported on this device".
 */

/* The kernel slots, in table order. APPEND ONLY: the table, the backends' tables and
 * prototypes, the core's checked dispatch and the lazy device's records are all
 * expanded from this list (X(slot) for each slot). */
#define CA_KERNEL_LIST(X)                                                                         \
    X(gemm) X(fill) X(cast) X(copy_strided) X(unary) X(unary_backward) X(binary) X(axpby)         \
    X(reduce) X(argmax) X(softmax) X(softmax_backward) X(cross_entropy) X(cross_entropy_backward) \
    X(layer_norm) X(layer_norm_backward) X(embedding) X(embedding_backward) X(rng) X(dropout)     \
    X(dropout_backward) X(adamw) X(sgd) X(sum_squares) X(scale_list) X(unscale_check)             \
    X(clamp_list) X(attention) X(attention_backward) X(where) X(gather) X(gather_backward)          \
    X(rms_norm) X(rms_norm_backward) X(rope) X(swiglu) X(swiglu_backward)

/* Row-major GEMM: C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C.
 * op(X) = X or X^T. lda/ldb/ldc are row strides in elements. When batch > 1,
 * matrix i starts at a + i*stride_a (elements), likewise b and c.
 * Dtypes: a_dtype == b_dtype in {f32, f16, bf16}; c_dtype f32 or the same as a;
 * accumulation is always in f32. beta == 0 means C is not read. */
typedef struct ca_gemm_args {
    size_t struct_size;
    bool trans_a, trans_b;
    int64_t m, n, k;
    float alpha, beta;
    ca_dtype a_dtype, b_dtype, c_dtype;
    const void *a; int64_t lda; int64_t stride_a;
    const void *b; int64_t ldb; int64_t stride_b;
    void *c;       int64_t ldc; int64_t stride_c;
    int64_t batch;   /* 0 or 1: a single GEMM */
    bool allow_tf32; /* devices with TF32 may use it for f32 inputs */
} ca_gemm_args;

/* y[i] = value, converted to dt. */
typedef struct ca_fill_args {
    size_t struct_size;
    ca_dtype dt; int64_t n; double value; void *y;
} ca_fill_args;

/* y[i] = (dst_dt)(alpha * (float)x[i]); float->int rounds to nearest;
 * f32->f16/bf16 rounds to nearest even, keeps NaN/Inf, saturates to Inf. */
typedef struct ca_cast_args {
    size_t struct_size;
    ca_dtype src_dt; const void *x; ca_dtype dst_dt; void *y; int64_t n; float alpha;
} ca_cast_args;

/* y[strided] = x[strided] over `shape` (ndim 0..CA_MAX_DIMS, element strides; any may
 * be 0 on x). The three arrays have ndim entries. */
typedef struct ca_copy_strided_args {
    size_t struct_size;
    ca_dtype dt; int ndim; const int64_t *shape;
    const void *x; const int64_t *x_stride;
    void *y; const int64_t *y_stride;
} ca_copy_strided_args;

/* y = f(x) (float dtypes; y may alias x, or not overlap it at all). */
typedef struct ca_unary_args {
    size_t struct_size;
    ca_unary_op op; ca_dtype dt; int64_t n; const void *x; void *y; float alpha;
} ca_unary_args;

/* dx = beta dx + dy * f'(x). x is the forward input and y the forward output;
 * relu/tanh/sigmoid/exp/sqrt read only y, neg/scale/add_scalar neither, the others
 * read x (the unused one may be NULL). */
typedef struct ca_unary_backward_args {
    size_t struct_size;
    ca_unary_op op; ca_dtype dt; int64_t n; const void *x; const void *y; const void *dy;
    void *dx; float alpha, beta;
} ca_unary_backward_args;

/* Broadcast shape of binary and where: y (contiguous, `shape`) = op(a, b) where a and b
 * are read with their element strides (0 on broadcast dimensions). */
typedef struct ca_bcast_args {
    int ndim;                      /* 1..CA_MAX_DIMS */
    int64_t shape[CA_MAX_DIMS];
    int64_t a_stride[CA_MAX_DIMS];
    int64_t b_stride[CA_MAX_DIMS];
} ca_bcast_args;

/* y = op(a, b) with broadcasting (see ca_bcast_args). */
typedef struct ca_binary_args {
    size_t struct_size;
    ca_binary_op op; ca_dtype dt; ca_bcast_args shape; const void *a; const void *b; void *y;
} ca_binary_args;

/* y = alpha x + beta y. */
typedef struct ca_axpby_args {
    size_t struct_size;
    ca_dtype dt; int64_t n; float alpha; const void *x; float beta; void *y;
} ca_axpby_args;

/* y[o, i] = beta y[o, i] + R_l x[o, l, i] for l < len (R = sum, mean, min, max). */
typedef struct ca_reduce_args {
    size_t struct_size;
    ca_reduce_op op; ca_dtype dt; int64_t outer, len, inner; const void *x; void *y; float beta;
} ca_reduce_args;

/* idx[r] = argmax_c x[r, c] (first on ties), i64 output. */
typedef struct ca_argmax_args {
    size_t struct_size;
    ca_dtype dt; int64_t rows, cols; const void *x; int64_t *idx;
} ca_argmax_args;

/* Row-wise softmax or log_softmax over `cols`. */
typedef struct ca_softmax_args {
    size_t struct_size;
    bool log; ca_dtype dt; int64_t rows, cols; const void *x; void *y;
} ca_softmax_args;

/* softmax: dx = beta dx + y (dy - sum(dy y));  log: dx = beta dx + dy - exp(y) sum(dy). */
typedef struct ca_softmax_backward_args {
    size_t struct_size;
    bool log; ca_dtype dt; int64_t rows, cols; const void *y; const void *dy; void *dx; float beta;
} ca_softmax_backward_args;

/* Mean cross-entropy of logits [rows, cols] against integer labels (label_dt
 * i32 or i64); rows whose label == ignore_index count for nothing.
 * Writes loss (f32 scalar), lse[rows] (f32, saved for backward) and
 * count (f32 scalar: rows not ignored). Labels outside [0, cols) other
 * than ignore_index give CA_ERR_INVALID where the device can check. */
typedef struct ca_cross_entropy_args {
    size_t struct_size;
    ca_dtype dt; int64_t rows, cols; const void *logits; ca_dtype label_dt; const void *labels;
    int64_t ignore_index; float *loss; float *lse; float *count;
} ca_cross_entropy_args;

/* dlogits = beta dlogits + dloss / count * (softmax(logits) - onehot(label));
 * dloss and count are device scalars (f32). */
typedef struct ca_cross_entropy_backward_args {
    size_t struct_size;
    ca_dtype dt; int64_t rows, cols; const void *logits; const float *lse; ca_dtype label_dt;
    const void *labels; int64_t ignore_index; const float *dloss; const float *count;
    void *dlogits; float beta;
} ca_cross_entropy_backward_args;

/* y = (x - mean) * rstd * gamma + beta_ over the last dim; writes mean, rstd
 * (f32, [rows]). gamma/beta_ may be NULL (no affine). */
typedef struct ca_layer_norm_args {
    size_t struct_size;
    ca_dtype dt; int64_t rows, cols; const void *x; const void *gamma; const void *beta_;
    float eps; void *y; float *mean; float *rstd;
} ca_layer_norm_args;

/* dx = beta dx + ...; dgamma, dbeta_ accumulate (+=) when non-NULL and
 * `accumulate_params`, else are overwritten. */
typedef struct ca_layer_norm_backward_args {
    size_t struct_size;
    ca_dtype dt; int64_t rows, cols; const void *x; const void *gamma; const float *mean;
    const float *rstd; const void *dy; void *dx; float beta; void *dgamma; void *dbeta_;
    bool accumulate_params;
} ca_layer_norm_backward_args;

/* y[i, :] = table[idx[i], :] for a table of `rows` rows; idx_dt i32 or i64. An
 * index outside [0, rows) gives CA_ERR_INVALID (position and value) where the
 * device can check, and never reads outside the table. */
typedef struct ca_embedding_args {
    size_t struct_size;
    ca_dtype dt; int64_t n, rows, dim; const void *table; ca_dtype idx_dt; const void *idx; void *y;
} ca_embedding_args;

/* dtable[idx[i], :] += dy[i, :]; same index rule. */
typedef struct ca_embedding_backward_args {
    size_t struct_size;
    ca_dtype dt; int64_t n, rows, dim; ca_dtype idx_dt; const void *idx; const void *dy; void *dtable;
} ca_embedding_backward_args;

/* The counter-based RNG, identical on every backend: Philox4x32-10 with
 * key = (seed lo, seed hi) and counter = (c lo, c hi, 0, 0), c = offset + j.
 *  uniform element i: c = offset + i/4, word i%4, u = (word >> 8) * 2^-24 in [0,1)
 *  normal element i:  c = offset + i/2, words 2(i%2), 2(i%2)+1 give u1, u2;
 *                     u1' = ((w>>8)+1) * 2^-24 in (0,1];  z = sqrt(-2 ln u1') cos(2 pi u2)
 *  dropout element i: uniform u as above; kept when u >= p, scaled by 1/(1-p).
 * A call consumes ca_rng_counters(kind, n) counters starting at `offset`. */
typedef enum ca_rng_kind { CA_RNG_UNIFORM = 0, CA_RNG_NORMAL = 1 } ca_rng_kind;
static inline uint64_t ca_rng_counters(ca_rng_kind kind, int64_t n) {
    return kind == CA_RNG_NORMAL ? (uint64_t)(n + 1) / 2 : (uint64_t)(n + 3) / 4;
}

/* Counter-based random numbers (see the RNG contract above): uniform [a,b) / normal(a, b). */
typedef struct ca_rng_args {
    size_t struct_size;
    ca_rng_kind kind; ca_dtype dt; int64_t n; uint64_t seed, offset; float a, b; void *y;
} ca_rng_args;

/* y = x * mask / (1 - p), mask[i] = 1 when element i is kept (u8). */
typedef struct ca_dropout_args {
    size_t struct_size;
    ca_dtype dt; int64_t n; float p; uint64_t seed, offset; const void *x; void *y; uint8_t *mask;
} ca_dropout_args;

/* dx = beta dx + dy * mask / (1 - p). */
typedef struct ca_dropout_backward_args {
    size_t struct_size;
    ca_dtype dt; int64_t n; float p; const uint8_t *mask; const void *dy; void *dx; float beta;
} ca_dropout_backward_args;

/* A list of tensors updated by one fused kernel (one launch per parameter
 * group). Arrays have `count` entries; unused arrays may be NULL. The list kernels
 * other than adamw and sgd read the tensors in t->param, with dtype t->grad_dtype
 * (the accelerator passes gradients there). */
typedef struct ca_tensor_list {
    int count;
    void *const *param;        /* f32 master weights, updated in place */
    const void *const *grad;   /* gradients (grad_dtype) */
    void *const *state1;       /* SGD momentum buffer / AdamW exp_avg (f32) */
    void *const *state2;       /* AdamW exp_avg_sq (f32) */
    const int64_t *numel;
    ca_dtype grad_dtype;       /* f32 (f16/bf16 allowed where the backend says so) */
} ca_tensor_list;

/* Fused AdamW over a parameter group (param, grad, state1, state2), decoupled weight
 * decay, bias-corrected, as torch.optim.AdamW:
 *   p -= lr*wd*p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   p -= lr * (m / bc1) / (sqrt(v / bc2) + eps)        with bc_i = 1 - b_i^t. */
typedef struct ca_adamw_args {
    size_t struct_size;
    const ca_tensor_list *t;
    float lr, beta1, beta2, eps, weight_decay;
    float bias_correction1, bias_correction2;
    float grad_scale;          /* gradients are multiplied by this first (1 = none) */
} ca_adamw_args;

/* Fused SGD over a parameter group (param, grad, state1 when momentum != 0), as
 * torch.optim.SGD: g += wd p; buf = first ? g : momentum buf + (1-dampening) g;
 * g = nesterov ? g + momentum buf : buf (when momentum != 0); p -= lr g. */
typedef struct ca_sgd_args {
    size_t struct_size;
    const ca_tensor_list *t;
    float lr, momentum, dampening, weight_decay;
    bool nesterov;
    bool first_step;           /* momentum buffers are initialised from g */
    float grad_scale;
} ca_sgd_args;

/* out (f32 device scalar) = beta out + sum over tensors of sum(x^2). */
typedef struct ca_sum_squares_args {
    size_t struct_size;
    const ca_tensor_list *t; float *out; float beta;
} ca_sum_squares_args;

/* x *= alpha for every tensor in t->param (dtype t->grad_dtype). */
typedef struct ca_scale_list_args {
    size_t struct_size;
    const ca_tensor_list *t; float alpha;
} ca_scale_list_args;

/* x *= inv_scale for every tensor in t->param; *found_inf (f32 device
 * scalar) is set to 1 if any result is Inf or NaN (never reset to 0 here). */
typedef struct ca_unscale_check_args {
    size_t struct_size;
    const ca_tensor_list *t; float inv_scale; float *found_inf;
} ca_unscale_check_args;

/* x = clamp(x, lo, hi) elementwise over every tensor in t->param. */
typedef struct ca_clamp_list_args {
    size_t struct_size;
    const ca_tensor_list *t; float lo, hi;
} ca_clamp_list_args;

/* The problem of scaled dot-product attention over batch*heads independent problems.
 * q [B,H,Tq,D], k [B,Hkv,Tk,D], v [B,Hkv,Tk,Dv], out [B,H,Tq,Dv], contiguous (or strided, ABI 3.10's
 * ca_attention_layout), where Hkv is the
 * args' kv_heads (ABI 3.5; 0 reads as H): query head h reads kv head h / (H / Hkv), each kv head
 * serving H / Hkv query heads in a row (grouped-query attention, as transformers' repeat_kv orders
 * them); Hkv divides H. The backward's dk and dv are [B,Hkv,Tk,*]: a kv head's gradient sums the
 * terms of its query heads.
 *   s_ij = scale q_i.k_j (+ mask_ij when the mask is f32); key j is excluded when
 *   causal and j > i (top-left aligned, as torch's is_causal) or when a u8 mask
 *   is 0 at (i, j) (nonzero = may attend, as torch's boolean attn_mask);
 *   p_ij = softmax_j(s_ij) in f32, lse_i = log sum_j exp(s_ij) ([B,H,Tq], f32);
 *   out_i = sum_j p_ij d_ij v_j with d_ij = keep/(1-dropout_p) from the dropout
 *   contract above, element ((b H + h) Tq + i) Tk + j of the stream at `offset` (with the args'
 *   stream_heads, ABI 3.6: ((b Hs + h0 + h) Tq + i) Tk + j).
 * A row with every key excluded gives out_i = 0 and lse_i = -inf. */
typedef struct ca_attention_params {
    int64_t batch, heads, tq, tk, d, dv;
    float scale;
    bool causal;
    float dropout_p;               /* 0: no dropout */
    uint64_t seed, offset;
    const void *mask;              /* NULL, f32 (additive) or u8 (boolean) */
    ca_dtype mask_dtype;
    int64_t mask_stride[4];        /* element strides over [b, h, i, j]; 0 broadcasts */
} ca_attention_params;

/* ABI 3.10: element strides over [b, h, t, e] of an attention's four [B, *, T, *] tensors (q, k, v and out;
 * in the backward's second layout dq, dk, dv and dout), read where the device's ops set attention_strides
 * (else every tensor is contiguous). A tensor whose four are 0 is contiguous. e's stride is 1 and t's at
 * least e's size (each head's rows a matrix with a leading dimension), so that q, k and v may be views of
 * one [B, T, 3, H, D] projection and dq, dk, dv views of its gradient, with no copy on either side. The
 * outputs overlap neither each other nor the inputs. */
typedef struct ca_attention_layout {
    int64_t q[4], k[4], v[4], o[4];
} ca_attention_layout;

/* Forward of ca_attention_params (dt f32; the backend may take more). */
typedef struct ca_attention_args {
    size_t struct_size;
    ca_dtype dt; ca_attention_params p;
    const void *q; const void *k; const void *v; void *out; float *lse;
    int64_t kv_heads;              /* ABI 3.5: heads of k and v (0: as many as q) */
    /* ABI 3.6: the dropout stream's heads. This call's H heads are heads [stream_head0, stream_head0 + H)
     * of an attention of stream_heads heads (0: H from 0), and head h of batch b draws element
     * ((b stream_heads + stream_head0 + h) Tq + i) Tk + j: a tensor-parallel rank's heads drop what the
     * whole attention drops for them (ca_attention_stream_bh). */
    int64_t stream_heads, stream_head0;
    ca_attention_layout st;        /* ABI 3.10: q, k, v and out (ca_attention_layout) */
} ca_attention_args;

/* dq, dk, dv (overwritten) from dout, recomputing p from q, k and the saved
 * lse (no [Tq, Tk] tensor is kept between forward and backward); out is
 * the forward's output (its row dot with dout is softmax's correction). */
typedef struct ca_attention_backward_args {
    size_t struct_size;
    ca_dtype dt; ca_attention_params p;
    const void *q; const void *k; const void *v; const void *out; const void *dout;
    const float *lse; void *dq; void *dk; void *dv;
    int64_t kv_heads;              /* ABI 3.5: as ca_attention_args' */
    int64_t stream_heads, stream_head0;   /* ABI 3.6: as ca_attention_args' */
    ca_attention_layout st;        /* ABI 3.10: q, k, v and out */
    ca_attention_layout dst;       /* ABI 3.10: dq, dk, dv and dout (in its o) */
} ca_attention_backward_args;

/* Problem bh = b H + h of an attention call of H heads as the dropout stream numbers it: b stream_heads +
 * stream_head0 + h (bh itself when stream_heads is 0). */
static inline uint64_t ca_attention_stream_bh(int64_t bh, int64_t heads, int64_t stream_heads, int64_t head0) {
    if (stream_heads <= 0 || heads <= 0) return (uint64_t)bh;
    return (uint64_t)(bh / heads * stream_heads + head0 + bh % heads);
}

/* Query heads per kv head of an attention call (1 when kv_heads is 0 or H). */
static inline int64_t ca_attention_group(int64_t heads, int64_t kv_heads) {
    return kv_heads > 0 && heads > 0 ? heads / kv_heads : 1;
}

/* y = cond ? a : b with broadcasting (any dtype): `shape` gives y's shape and the
 * strides of a and b; cond (u8, nonzero = true) is read with cond_stride (ndim entries). */
typedef struct ca_where_args {
    size_t struct_size;
    ca_dtype dt; ca_bcast_args shape; const int64_t *cond_stride; const uint8_t *cond;
    const void *a; const void *b; void *y;
} ca_where_args;

/* torch.gather along the middle dim of x [outer, len, inner]:
 * y[o, j, i] = x[o, idx[o, j, i], i] for idx, y [outer, n, inner] (idx_dt i32 or
 * i64; any dtype for x). An index outside [0, len) gives CA_ERR_INVALID
 * (position and value) where the device can check, and is never read. */
typedef struct ca_gather_args {
    size_t struct_size;
    ca_dtype dt; int64_t outer, len, inner, n; const void *x; ca_dtype idx_dt; const void *idx; void *y;
} ca_gather_args;

/* dx[o, idx[o, j, i], i] += dy[o, j, i] (float dtypes the device names; f32 at least). */
typedef struct ca_gather_backward_args {
    size_t struct_size;
    ca_dtype dt; int64_t outer, len, inner, n; ca_dtype idx_dt; const void *idx; const void *dy; void *dx;
} ca_gather_backward_args;

/* RMSNorm over the last dim (ABI 3.1): y = x * rstd * gamma with rstd = 1 / sqrt(mean(x^2) + eps);
 * writes rstd (f32, [rows]). gamma may be NULL (no weight). */
typedef struct ca_rms_norm_args {
    size_t struct_size;
    ca_dtype dt; int64_t rows, cols; const void *x; const void *gamma; float eps; void *y; float *rstd;
} ca_rms_norm_args;

/* dx = beta dx + rstd (g dy - xhat mean(g dy xhat)) with xhat = x rstd, g = gamma (1 when NULL);
 * dgamma (when non-NULL) = sum over rows of dy xhat, added to it when `accumulate_params`, else
 * overwritten. rstd is the forward's. */
typedef struct ca_rms_norm_backward_args {
    size_t struct_size;
    ca_dtype dt; int64_t rows, cols; const void *x; const void *gamma; const float *rstd; const void *dy;
    void *dx; float beta; void *dgamma; bool accumulate_params;
} ca_rms_norm_backward_args;

/* Rotary position embedding (ABI 3.3), Hugging Face's "rotate_half" layout (GPT-NeoX, Llama): x and
 * y are [batch, heads, seq, dim]; within the first `rot` dims of each row (rot even, 0 < rot <= dim)
 * element i and element i + rot/2 (i < rot/2) turn by the angle of position t:
 *   y[i] = x[i] c - x[i + rot/2] s,   y[i + rot/2] = x[i + rot/2] c + x[i] s,
 * c = cos[b', t, i], s = sin[b', t, i] (f32 tables [table_batch, seq, rot/2]; table_batch is 1, one
 * table for every batch (b' = 0), or batch, per-batch positions (b' = b)); dims from rot on are copied.
 * inverse: turn by minus the angle (s negated), which is the backward (the rotation's transpose).
 * y = beta y + the rotated x (beta 0: y is not read); y is x itself or does not overlap it. x and y
 * in dt (float dtypes the device names; f32 at least), computed in f32. */
typedef struct ca_rope_args {
    size_t struct_size;
    ca_dtype dt; int64_t batch, heads, seq, dim, rot, table_batch; const void *x; const float *cos;
    const float *sin; bool inverse; void *y; float beta;
} ca_rope_args;

/* SwiGLU (ABI 3.3): y = silu(gate) up = gate / (1 + exp(-gate)) * up over n elements (float dtypes,
 * computed in f32); y does not overlap gate or up. */
typedef struct ca_swiglu_args {
    size_t struct_size;
    ca_dtype dt; int64_t n; const void *gate; const void *up; void *y;
} ca_swiglu_args;

/* Its backward in one pass: with s = sigmoid(gate),
 *   dgate = beta_gate dgate + dy up s (1 + gate (1 - s)),   dup = beta_up dup + dy silu(gate).
 * Either output may be NULL (not wanted), not both; beta 0: the output is not read. The outputs do
 * not overlap each other or the inputs. */
typedef struct ca_swiglu_backward_args {
    size_t struct_size;
    ca_dtype dt; int64_t n; const void *gate; const void *up; const void *dy; void *dgate; void *dup;
    float beta_gate, beta_up;
} ca_swiglu_backward_args;

/* The kernel table: struct_size, abi_version, then one slot per CA_KERNEL_LIST entry. */
#define CA_KERNEL_SLOT_(slot) ca_status (*slot)(void *dev, const ca_##slot##_args *args);
typedef struct ca_kernels {
    size_t struct_size;
    uint32_t abi_version;
    CA_KERNEL_LIST(CA_KERNEL_SLOT_)
} ca_kernels;
#undef CA_KERNEL_SLOT_

/* The number of kernel slots. */
#define CA_KERNEL_COUNT_(slot) +1
enum { CA_KERNEL_COUNT = 0 CA_KERNEL_LIST(CA_KERNEL_COUNT_) };
#undef CA_KERNEL_COUNT_
/* Slot positions are ABI: the table is the two header fields, then exactly one pointer per list
 * entry in list order (the first and the ABI-1.1 slots pinned). */
CA_TYPES_ASSERT_(sizeof(ca_kernels) == offsetof(ca_kernels, gemm) + CA_KERNEL_COUNT * sizeof(void (*)(void)) &&
                     offsetof(ca_kernels, attention) == offsetof(ca_kernels, gemm) + 27 * sizeof(void (*)(void)),
                 "ca_kernels has one slot per CA_KERNEL_LIST entry, in order");

/* ---------------------------------------------------------------- allocator */

typedef struct ca_allocator_stats {
    size_t allocated;          /* bytes handed out and not yet freed */
    size_t peak_allocated;
    size_t reserved;           /* bytes held from the device (allocated + cached); on a lazy
                                * device (xla), the memory behind its addresses: blocks that
                                * have some, its cache and graph arena (addresses handed out,
                                * counted in allocated, hold none until a graph needs them) */
    size_t peak_reserved;
    uint64_t num_allocs;       /* alloc calls served */
    uint64_t num_frees;
    uint64_t num_device_allocs;/* raw device allocations (malloc / cudaMalloc) */
    uint64_t num_device_frees;
    uint64_t num_cache_hits;   /* allocs served from the cache */
} ca_allocator_stats;

/* An allocator over one device. Thread-safe. `stream` is the stream the
 * memory will be used on (NULL = default); caching allocators reuse a block on
 * the same stream only. */
typedef struct ca_allocator_ops {
    size_t struct_size;
    uint32_t abi_version;
    const char *name;
    ca_status (*alloc)(void *actx, size_t bytes, void *stream, void **ptr);
    void (*free)(void *actx, void *ptr);
    void (*stats)(void *actx, ca_allocator_stats *out);
    void (*empty_cache)(void *actx);      /* optional */
    void (*reset_peak)(void *actx);       /* optional */
} ca_allocator_ops;

/* ------------------------------------------------------------------- device */

typedef enum ca_copy_kind {
    CA_COPY_H2D = 0,
    CA_COPY_D2H = 1,
    CA_COPY_D2D = 2
} ca_copy_kind;

/* What a device is (ABI 2.1), how the core and the accelerator choose and drive it. 0 in a table
 * of an older minor: the core reads host_memory (true: host, false: GPU). */
typedef enum ca_device_kind {
    CA_DEVICE_KIND_UNSET = 0,
    CA_DEVICE_HOST = 1,        /* device pointers are host memory (cpu) */
    CA_DEVICE_GPU = 2,         /* eager accelerator with memory of its own (cuda) */
    CA_DEVICE_LAZY = 3         /* records work and runs it at synchronisation points (xla) */
} ca_device_kind;

/* Options a device is opened with (append-only). */
typedef struct ca_device_open_args {
    size_t struct_size;
    int local_rank;            /* -1 when not distributed */
    const char *gpu_ids;       /* config's gpu_ids ("all", "0,1"), may be NULL */
    /* appended: f32 GEMMs may use TF32 (config's allow_tf32; read only when struct_size covers it) */
    bool allow_tf32;
} ca_device_open_args;

typedef struct ca_device_ops {
    size_t struct_size;
    uint32_t abi_version;
    const char *name;          /* "cpu", "cuda", "xla" */

    /* Number of usable devices. When 0, `reason` says why (no driver, ...). */
    ca_status (*device_count)(int *count, char *reason, size_t reason_len);
    ca_status (*open)(int index, const ca_device_open_args *args, void **dev);
    void (*close)(void *dev);                      /* accepts NULL */
    /* One line for humans ("NVIDIA H100 80GB HBM3, 79 GiB", "AMD EPYC, 2 threads"). */
    ca_status (*describe)(void *dev, char *buf, size_t len);

    /* Raw device memory (the caching allocator sits on top). */
    ca_status (*mem_alloc)(void *dev, size_t bytes, void **ptr);
    void (*mem_free)(void *dev, void *ptr);
    /* Page-locked host memory for fast/asynchronous copies; NULL slots: plain malloc. */
    ca_status (*host_alloc)(void *dev, size_t bytes, void **ptr);
    void (*host_free)(void *dev, void *ptr);
    /* Copies on the current stream; when !async the call returns after the copy. */
    ca_status (*memcpy)(void *dev, void *dst, const void *src, size_t bytes,
                        ca_copy_kind kind, bool async);

    /* Streams and events. NULL stream = the device's default stream. */
    ca_status (*stream_create)(void *dev, void **stream);
    void (*stream_destroy)(void *dev, void *stream);
    ca_status (*set_stream)(void *dev, void *stream);   /* where kernels/copies go */
    ca_status (*event_create)(void *dev, void **event);
    void (*event_destroy)(void *dev, void *event);
    ca_status (*event_record)(void *dev, void *event, void *stream);
    ca_status (*stream_wait_event)(void *dev, void *stream, void *event);
    ca_status (*event_synchronize)(void *dev, void *event);
    ca_status (*synchronize)(void *dev);                /* all streams */

    const ca_kernels *kernels;
    /* Optional allocator of the device's own; NULL: the core's caching
     * allocator over mem_alloc/mem_free. `allocator_ctx(dev)` gives its context. */
    const ca_allocator_ops *allocator;
    void *(*allocator_ctx)(void *dev);
    /* True when device pointers are host pointers (cpu): host buffers may be
     * handed to kernels directly. The core still never dereferences them. */
    bool host_memory;
    /* Optional, for lazy devices (xla): records fn(ctx, true, in_host, out_host) to run on the host
     * in the device's order, after every operation recorded before it and before every one recorded
     * after. `in` (read) and `out` (read and written; either may be NULL) are device addresses;
     * fn gets the host addresses of the same bytes, valid while it runs (a lazy device's addresses
     * are not host memory). Its status fails the execution that ran it. The device owns ctx from the
     * call on, even when the call fails: fn(ctx, false, NULL, NULL) discards it (a graph dropped
     * without running, a failed recording). The core records collectives this way, so they run in
     * graph order. */
    ca_status (*enqueue_host_fn)(void *dev, ca_status (*fn)(void *ctx, bool run, const void *in, void *out),
                                 void *ctx, const void *in, size_t in_bytes, void *out, size_t out_bytes);

    /* ---- ABI 2.1 ---- */
    ca_device_kind kind;
    /* Optional: a step boundary (torch_xla's mark_step): a lazy device runs what it recorded.
     * NULL: nothing to do. */
    ca_status (*mark_step)(void *dev);
    /* Optional: kernels give bit-identical results run to run (cpu: fixed reduction order),
     * nested on/off calls balanced. NULL: the device is deterministic already or cannot be. */
    void (*set_deterministic)(void *dev, bool on);
    /* Optional: the dtype every f32 value the device holds is stored in: CA_F32 (native) or CA_BF16
     * (rounded to nearest even, as torch_xla's XLA_USE_BF16). NULL: f32 only. */
    ca_status (*set_storage_dtype)(void *dev, ca_dtype dt);
    ca_dtype (*storage_dtype)(void *dev);
    /* Optional: a backend's own extras by name (as ggml's get_proc_address), NULL when unknown.
     * A function comes back as a data pointer: cast it through uintptr_t. */
    void *(*get_proc)(const char *name);

    /* ---- ABI 3.8 ---- */
    /* Optional, together (either NULL: the core copies on the current stream with memcpy and waits, and an
     * asynchronous save's host copy is synchronous). memcpy_on_stream copies on `stream` (one of
     * stream_create's; NULL: the default stream) and returns without waiting, whatever the kind; the host
     * side of a device-to-host copy is host_alloc memory. event_wait_any_thread waits on the host until
     * `event` completed, called from a thread other than the device's own while that one goes on (an
     * asynchronous save's writer waits so for the copies of its state): it reports the failure of the work
     * before the event only, never the device's deferred data errors, which stay for its own thread. */
    ca_status (*memcpy_on_stream)(void *dev, void *dst, const void *src, size_t bytes, ca_copy_kind kind,
                                  void *stream);
    ca_status (*event_wait_any_thread)(void *dev, void *event);

    /* ---- ABI 3.9 ---- */
    /* Optional, for lazy devices: enqueue_host_fn with the structural attributes of what fn does
     * (`nattr` words, copied: for a collective its kind, element type, counts, reduce op and peers),
     * which the device keys its compiled programs by, as a compiler's program holds the collectives it
     * runs (a point-to-point exchange with another peer or of another size is another program). NULL:
     * the core calls enqueue_host_fn, which keys the function by its buffers' sizes alone. */
    ca_status (*enqueue_host_fn_keyed)(void *dev, ca_status (*fn)(void *ctx, bool run, const void *in, void *out),
                                       void *ctx, const void *in, size_t in_bytes, void *out, size_t out_bytes,
                                       const int64_t *attr, int nattr);

    /* ---- ABI 3.10 ---- */
    /* The attention kernels read the args' ca_attention_layout (strided q, k, v, out and gradients); false
     * (or a table of an older minor): the core hands them contiguous tensors. */
    bool attention_strides;
} ca_device_ops;

/* ------------------------------------------------------------- rendezvous */

/* A key-value store shared by the ranks of a job (served by the launcher or
 * rank 0). Blocking calls take a timeout and fail with CA_ERR_TIMEOUT naming
 * the key. Values are byte strings up to CA_STORE_MAX_VALUE. Thread-safe. */
#define CA_STORE_MAX_VALUE (16u << 20)
typedef struct ca_store_ops {
    size_t struct_size;
    uint32_t abi_version;
    ca_status (*set)(void *store, const char *key, const void *value, size_t len);
    /* Waits until `key` exists, then copies it; *len in: capacity, out: size. */
    ca_status (*get)(void *store, const char *key, void *value, size_t *len, int64_t timeout_ms);
    /* Atomically adds delta to an integer key (created as 0); returns the new value. */
    ca_status (*add)(void *store, const char *key, int64_t delta, int64_t *result);
    /* Returns CA_OK if key exists now, CA_ERR_NOT_FOUND otherwise. */
    ca_status (*check)(void *store, const char *key);
    ca_status (*wait)(void *store, const char *const *keys, int nkeys, int64_t timeout_ms);
} ca_store_ops;

typedef struct ca_store_ref {
    const ca_store_ops *ops;
    void *store;
} ca_store_ref;

/* --------------------------------------------------------------- collective */

typedef struct ca_comm_init_args {
    size_t struct_size;
    int rank, world_size;
    int local_rank, local_world_size;
    ca_store_ref store;        /* may be {NULL, NULL} for single/MPI */
    int64_t timeout_ms;        /* every blocking step honours it */
    const ca_device_ops *device_ops; /* the device buffers live on */
    void *device;
    const char *prefix;        /* store key prefix for this communicator */
    /* A host-memory backend (gloo where it is registered, else NULL) and the host device, for a device
     * backend that cannot serve this job and stages through host memory instead (nccl when ranks share
     * a GPU): the core hands them over so that a plugin need not reach into the registry. ABI 3.2. */
    const struct ca_collective_ops *host_collective;
    const ca_device_ops *host_device_ops;
    void *host_device;
} ca_comm_init_args;

typedef struct ca_work_impl ca_work_impl;  /* backend-defined */

/* The collective vtable. Buffers are device pointers of args->device. Each op
 * is asynchronous: it returns a work handle (or NULL when already complete)
 * that the core waits on with a deadline. send may equal recv (in place).
 * Counts are elements; all_gather/reduce_scatter counts are per rank. */
typedef struct ca_collective_ops {
    size_t struct_size;
    uint32_t abi_version;
    const char *name;          /* "single", "mpi", "gloo", "nccl" */
    /* Devices this backend can reduce on directly ("cpu", "cuda"; "*": any, as it moves nothing).
     * A communicator over a device that does not say its backend takes the first registered one
     * naming the device. */
    const char *device_names;
    ca_status (*init)(const ca_comm_init_args *args, void **comm);
    void (*destroy)(void *comm);
    ca_status (*all_reduce)(void *comm, const void *send, void *recv, size_t count,
                            ca_dtype dt, ca_reduce_op op, ca_work_impl **work);
    ca_status (*broadcast)(void *comm, void *buf, size_t count, ca_dtype dt, int root,
                           ca_work_impl **work);
    ca_status (*all_gather)(void *comm, const void *send, void *recv, size_t count,
                            ca_dtype dt, ca_work_impl **work);
    ca_status (*reduce_scatter)(void *comm, const void *send, void *recv, size_t count,
                                ca_dtype dt, ca_reduce_op op, ca_work_impl **work);
    ca_status (*barrier)(void *comm, ca_work_impl **work);
    /* CA_OK done, CA_IN_PROGRESS not yet, <0 failed. */
    ca_status (*work_test)(ca_work_impl *work);
    /* Waits at most timeout_ms (<0: forever); CA_ERR_TIMEOUT when it passes. */
    ca_status (*work_wait)(ca_work_impl *work, int64_t timeout_ms);
    void (*work_free)(ca_work_impl *work);
    /* Makes every pending and future call on comm fail promptly (after a timeout). */
    ca_status (*abort)(void *comm);
    /* Optional (NULL: the core builds the group's communicator with init over the store, as
     * Gloo's). Splits comm as MPI_Comm_split does: collective over every rank of comm, each in
     * the same order relative to its other calls; ranks of one color form *out, ordered by key,
     * then by rank in comm; color < 0 joins none (*out = NULL). args describe this rank in its
     * group (ignored when color < 0). Called only after every rank of comm reached the split. */
    ca_status (*split)(void *comm, int color, int key, const ca_comm_init_args *args, void **out);

    /* ---- ABI 2.1 ---- */
    /* True when the ranks are the launcher's (MPI): the backend runs only in processes an MPI
     * launcher started, and the core makes no store for it. */
    bool needs_mpi_launcher;

    /* ---- ABI 3.4 ---- */
    /* Optional: true when another communicator of this backend may run collectives on a second
     * thread while comm runs its own on the first (MPI: the library gave MPI_THREAD_MULTIPLE).
     * NULL or false: the core never does so (an asynchronous save_state then saves synchronously). */
    bool (*threads_concurrent)(void *comm);

    /* ---- ABI 3.7 ---- */
    /* Optional (NULL: the communicator refuses point-to-point): sends send_count elements to rank dst
     * and receives recv_count elements from rank src in one operation, both in flight together, so
     * that every rank of a ring may call it at once without deadlock. dst < 0: nothing is sent; src <
     * 0: nothing is received. Messages between two ranks are matched in the order they were issued
     * (MPI's non-overtaking rule); send and recv do not overlap. */
    ca_status (*sendrecv)(void *comm, const void *send, size_t send_count, int dst, void *recv, size_t recv_count,
                          int src, ca_dtype dt, ca_work_impl **work);
} ca_collective_ops;

/* ------------------------------------------------------------------ plugins */

/* What a plugin's single exported symbol returns. */
typedef struct ca_plugin {
    size_t struct_size;
    uint32_t abi_version;          /* CA_ABI_VERSION the plugin was built with */
    const char *name;              /* "cuda", "mpi", "gloo" */
    const char *version;           /* of what it wraps: "Open MPI 4.1.4", "CUDA 13.0" */
    int num_devices;               /* device backends it provides */
    const ca_device_ops *const *devices;
    int num_collectives;           /* collective backends it provides */
    const ca_collective_ops *const *collectives;
    /* 0 when it cannot run on this machine (reason filled); else a preference. Optional. */
    int (*score)(char *reason, size_t reason_len);
} ca_plugin;

typedef const ca_plugin *(*ca_plugin_init_fn)(void);
#define CA_PLUGIN_INIT_SYMBOL "ca_plugin_init"
#define CA_PLUGIN_EXPORT __attribute__((visibility("default")))

/* Registers a statically built backend (embedded builds fold plugins in this
 * way). Returns CA_ERR_ABI if the table's ABI is not this library's. */
CA_API ca_status ca_register_plugin(const ca_plugin *plugin, const char *origin);

/* Wall-clock helper for backends: monotonic milliseconds. */
CA_API int64_t ca_now_ms(void);

#ifdef __cplusplus
}
#endif
#endif
