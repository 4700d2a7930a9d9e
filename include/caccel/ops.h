/* caccel/ops.h: differentiable tensor operations (forward through the device's kernels, backward on the tape). */
#ifndef CACCEL_OPS_H
#define CACCEL_OPS_H

#include <caccel/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Every op: returns a new tensor in the current scope (or a view), or NULL
 * with the error recorded (NULL inputs give NULL). Inputs must be on one
 * device. Float ops accept f32, and f16/bf16 where the autocast policy says
 * (docs/MIXED_PRECISION.md); they compute in f32. When grad mode is on and an
 * input requires grad, the op records a tape node for backward.
 * Thread-safety: ops may run on several threads, each with its own tape.
 */

/* ----------------------------------------------------------- linear algebra */
/* [m,k] x [k,n] -> [m,n]. Inputs with more dimensions are batched over the
 * leading ones, which broadcast as in torch.matmul ([B,H,T,D] x [B,H,D,S],
 * [B,T,K] x [K,N], [B,1,M,K] x [H,K,N], ...); both inputs are at least 2-D.
 * Equal batch shapes run as one strided-batched GEMM; a right operand of rank
 * 2 folds the batch into its rows; a broadcast operand is expanded (a copy)
 * first, and its gradient summed back. Transposed views of 2-D operands are
 * passed to GEMM without copies. */
CA_API ca_tensor *ca_matmul(ca_tensor *a, ca_tensor *b);
/* x [.., in] , weight [out, in], bias [out] or NULL -> x weight^T + bias. */
CA_API ca_tensor *ca_linear(ca_tensor *x, ca_tensor *weight, ca_tensor *bias);

/* ----------------------------------------------------------- elementwise */
/* Broadcasting as in NumPy/PyTorch. */
CA_API ca_tensor *ca_add(ca_tensor *a, ca_tensor *b);
CA_API ca_tensor *ca_sub(ca_tensor *a, ca_tensor *b);
CA_API ca_tensor *ca_mul(ca_tensor *a, ca_tensor *b);
CA_API ca_tensor *ca_div(ca_tensor *a, ca_tensor *b);
CA_API ca_tensor *ca_add_scalar(ca_tensor *a, double s);
CA_API ca_tensor *ca_mul_scalar(ca_tensor *a, double s);
CA_API ca_tensor *ca_neg(ca_tensor *x);
CA_API ca_tensor *ca_relu(ca_tensor *x);
/* GELU, tanh approximation (torch's approximate="tanh"). */
CA_API ca_tensor *ca_gelu(ca_tensor *x);
/* GELU, exact: 0.5 x (1 + erf(x / sqrt 2)) (torch's default, BERT's "gelu"). */
CA_API ca_tensor *ca_gelu_erf(ca_tensor *x);
/* SiLU (swish): x sigmoid(x). */
CA_API ca_tensor *ca_silu(ca_tensor *x);
CA_API ca_tensor *ca_tanh(ca_tensor *x);
CA_API ca_tensor *ca_sigmoid(ca_tensor *x);
CA_API ca_tensor *ca_exp(ca_tensor *x);
CA_API ca_tensor *ca_log(ca_tensor *x);
CA_API ca_tensor *ca_sqrt(ca_tensor *x);
CA_API ca_tensor *ca_square(ca_tensor *x);
CA_API ca_tensor *ca_pow_scalar(ca_tensor *x, double p);

/* ----------------------------------------------------------- reductions */
CA_API ca_tensor *ca_sum(ca_tensor *x);                   /* all elements -> scalar */
CA_API ca_tensor *ca_mean(ca_tensor *x);
CA_API ca_tensor *ca_sum_dim(ca_tensor *x, int dim, bool keepdim);
CA_API ca_tensor *ca_mean_dim(ca_tensor *x, int dim, bool keepdim);
CA_API ca_tensor *ca_max_dim(ca_tensor *x, int dim, bool keepdim);  /* values only */
/* Index of the largest value along the last dim (i64, not differentiable). */
CA_API ca_tensor *ca_argmax(ca_tensor *x);

/* ----------------------------------------------------------- nn functions */
/* Along the last dimension. */
CA_API ca_tensor *ca_softmax(ca_tensor *x);
CA_API ca_tensor *ca_log_softmax(ca_tensor *x);

typedef enum ca_reduction { CA_REDUCTION_MEAN = 0, CA_REDUCTION_SUM = 1 } ca_reduction;
typedef struct ca_cross_entropy_opts {
    int64_t ignore_index;      /* default (zeroed struct): -100, as PyTorch */
    bool has_ignore_index;     /* false: -100 */
    ca_reduction reduction;
} ca_cross_entropy_opts;
/* Cross-entropy of logits [..., C] against labels [...] (i32 or i64), mean over
 * the rows whose label is not ignore_index (-100). Scalar f32. Fused: one pass
 * per row computes its log-sum-exp (saved, [rows] f32) and the loss; backward
 * writes softmax - onehot row by row; no log-probabilities are materialised. */
CA_API ca_tensor *ca_cross_entropy(ca_tensor *logits, ca_tensor *labels);
CA_API ca_tensor *ca_cross_entropy_ex(ca_tensor *logits, ca_tensor *labels,
                                      const ca_cross_entropy_opts *opts);
/* mean((a - b)^2), scalar. */
CA_API ca_tensor *ca_mse_loss(ca_tensor *a, ca_tensor *b);
/* Zeroes each element with probability p and scales the rest by 1/(1-p),
 * from the counter-based generator; identity when !training or p == 0. */
CA_API ca_tensor *ca_dropout(ca_tensor *x, double p, bool training);
/* ca_dropout of x, which holds [start, start + x's size) along dimension dim of a tensor `whole` long there
 * (the other dimensions the same): x's elements drop as those of the whole tensor's dropout, and the
 * generator advances as for the whole, so that ranks each holding a part (sequence parallelism's tokens)
 * drop together what one process drops. ca_dropout is the part [0, shape[0]) of dimension 0.
 * CA_ERR_INVALID when the part is not within the whole; CA_ERR_UNSUPPORTED (not yet) when a run of x's
 * elements does not start at a multiple of 4 elements of the whole (the generator's words). */
CA_API ca_tensor *ca_dropout_part(ca_tensor *x, double p, bool training, int dim, int64_t start, int64_t whole);
/* Normalises over the last dimension; weight/bias [C] or NULL. */
CA_API ca_tensor *ca_layer_norm(ca_tensor *x, ca_tensor *weight, ca_tensor *bias, double eps);
/* RMSNorm over the last dimension, as torch.nn.RMSNorm: x / sqrt(mean(x^2) + eps)
 * * weight; weight [C] or NULL. One kernel each way (rms_norm, rms_norm_backward). */
CA_API ca_tensor *ca_rms_norm(ca_tensor *x, ca_tensor *weight, double eps);
/* Rotary position embedding, Hugging Face's layout (apply_rotary_pos_emb with rotate_half, as
 * GPT-NeoX and Llama): x [B, H, T, D] (any float dtype, computed in f32, the result in x's dtype);
 * cos and sin [T, R] or [B, T, R] (per-batch positions; [1, T, R] too), the same shape, f32 (other
 * float dtypes are cast), no gradient wanted (CA_ERR_UNSUPPORTED otherwise); rot = 2R <= D. For
 * i < R: y[i] = x[i] cos[t, i] - x[i + R] sin[t, i], y[i + R] = x[i + R] cos[t, i] + x[i] sin[t, i];
 * dims from 2R on (partial rotary) pass through. The tables hold only the R distinct angles of a
 * position (Hugging Face's cos repeats them twice); ca_rope_tables (nn.h) makes them. One kernel
 * (rope), its backward the same kernel turning by minus the angles. CA_ERR_INVALID naming the
 * shapes for tables that do not fit x. */
CA_API ca_tensor *ca_rope(ca_tensor *x, ca_tensor *cos, ca_tensor *sin);
/* SwiGLU's gating, silu(gate) * up (equal to ca_mul(ca_silu(gate), up), in one pass): gate and up
 * the same shape (no broadcast: CA_ERR_INVALID naming both), float; mixed float dtypes promote to
 * f32. One kernel each way (swiglu, swiglu_backward: both gradients in one pass). */
CA_API ca_tensor *ca_swiglu(ca_tensor *gate, ca_tensor *up);
/* idx [...] (i32/i64) into table [V, D] -> [..., D]. */
CA_API ca_tensor *ca_embedding(ca_tensor *idx, ca_tensor *table);
/* As ca_embedding, with torch's padding_idx: rows looked up at padding_idx
 * get no gradient (the table's row keeps its gradient as it was). -1: none. */
CA_API ca_tensor *ca_embedding_ex(ca_tensor *idx, ca_tensor *table, int64_t padding_idx);

/* Scaled dot-product attention, as torch.nn.functional.scaled_dot_product_attention:
 * q [B,H,Tq,D], k [B,Hkv,Tk,D], v [B,Hkv,Tk,Dv] -> [B,H,Tq,Dv] =
 *   dropout(softmax(q k^T * scale + mask)) v,
 * with the softmax in f32 and scale <= 0 meaning 1/sqrt(D).
 * Hkv < H is grouped-query attention, as torch's enable_gqa=True: Hkv must divide H
 *   (CA_ERR_INVALID naming both head counts otherwise) and query head h reads kv
 *   head h / (H / Hkv), transformers' repeat_kv order, without k and v being
 *   copied; the gradients of k and v sum over each kv head's query heads.
 * mask: NULL; an f32 tensor added to the scores (-inf excludes), or a u8
 *   tensor where nonzero means "may attend" (torch's boolean attn_mask); its
 *   shape broadcasts to [B,H,Tq,Tk] (a key-padding mask is [B,1,1,Tk]). Not
 *   differentiated. causal: key j > query i is excluded (top-left aligned).
 * dropout_p > 0 drops probabilities with the counter-based generator, so a
 *   run is reproducible from the RNG state (pass 0 when evaluating).
 * A query row that may attend to no key gives zeros.
 * Backward recomputes the probabilities from q, k and the saved per-row
 * log-sum-exp; no [Tq, Tk] tensor is kept (docs/ARCHITECTURE.md). */
CA_API ca_tensor *ca_scaled_dot_product_attention(ca_tensor *q, ca_tensor *k, ca_tensor *v, ca_tensor *mask,
                                                  bool causal, double dropout_p, double scale);
/* ca_scaled_dot_product_attention of heads [head0, head0 + H) of an attention of `heads` heads (a
 * tensor-parallel rank's heads: ca_tp_heads gives both): the dropout drops what the whole attention's
 * drops for these heads, and the generator advances as for all `heads`, so that every rank of a tp group
 * draws one process's masks. Equal to ca_scaled_dot_product_attention when head0 is 0 and heads is H.
 * CA_ERR_INVALID when the heads are not within [0, heads); CA_ERR_UNSUPPORTED for dropout on a device
 * plugin older than ABI 3.6 (it draws the whole attention's stream only). */
CA_API ca_tensor *ca_scaled_dot_product_attention_heads(ca_tensor *q, ca_tensor *k, ca_tensor *v, ca_tensor *mask,
                                                        bool causal, double dropout_p, double scale, int64_t head0,
                                                        int64_t heads);

/* ----------------------------------------------------------- shape */
/* Views where the strides allow, else a copy. One dim may be -1. */
CA_API ca_tensor *ca_reshape(ca_tensor *x, int ndim, const int64_t *shape);
CA_API ca_tensor *ca_flatten(ca_tensor *x);               /* [N, ...] -> [N, prod(...)] */
CA_API ca_tensor *ca_transpose(ca_tensor *x, int d0, int d1);   /* view */
CA_API ca_tensor *ca_narrow(ca_tensor *x, int dim, int64_t start, int64_t len); /* view */
CA_API ca_tensor *ca_contiguous(ca_tensor *x);            /* x itself if already contiguous */
/* Elementwise cast (differentiable between float dtypes). */
CA_API ca_tensor *ca_cast(ca_tensor *x, ca_dtype dt);
/* x broadcast to `shape` (NumPy rules) as a contiguous copy; the gradient is
 * summed over the broadcast dimensions. */
CA_API ca_tensor *ca_expand(ca_tensor *x, int ndim, const int64_t *shape);
/* Joins n tensors along dim; all other dimensions must match. */
CA_API ca_tensor *ca_concat(int n, ca_tensor *const *xs, int dim);
/* Joins n tensors of one shape along a new dimension dim (0..ndim). */
CA_API ca_tensor *ca_stack(int n, ca_tensor *const *xs, int dim);
/* Cuts x along dim into n views of sizes[i] (which sum to the dimension). */
CA_API ca_status ca_split(ca_tensor *x, int dim, int n, const int64_t *sizes, ca_tensor **out);
/* The slices of x at positions idx (1-D, i32/i64) along dim, as torch.index_select. */
CA_API ca_tensor *ca_index_select(ca_tensor *x, int dim, ca_tensor *idx);
/* torch.gather (named apart from ca_gather, the all-gather of accelerator.h):
 * y[.., j, ..] = x[.., idx[.., j, ..], ..] along dim; idx (i32/i64) has x's
 * shape except along dim, and y has idx's shape. Differentiable in x (f32). */
CA_API ca_tensor *ca_gather_dim(ca_tensor *x, int dim, ca_tensor *idx);
/* cond ? a : b elementwise; cond is u8 (nonzero = true); the three broadcast.
 * Differentiable in a and b. */
CA_API ca_tensor *ca_where(ca_tensor *cond, ca_tensor *a, ca_tensor *b);
/* x with value where mask (u8, broadcast to x's shape) is nonzero. */
CA_API ca_tensor *ca_masked_fill(ca_tensor *x, ca_tensor *mask, double value);
/* A u8 [rows, cols] tensor on dev, 1 where j - i >= diagonal (torch.triu of
 * ones): triu(1) marks the future keys a causal mask excludes. */
CA_API ca_tensor *ca_triu_mask(ca_device *dev, int64_t rows, int64_t cols, int64_t diagonal);

#ifdef __cplusplus
}
#endif
#endif
