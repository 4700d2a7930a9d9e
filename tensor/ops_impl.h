/* ops_impl.h: helpers shared by the op files (argument checks, gradient accumulation). */
#ifndef CACCEL_OPS_IMPL_H
#define CACCEL_OPS_IMPL_H

#include "tensor/tensor_impl.h"

/* NULL inputs propagate: the first error stays recorded. */
#define CA_OP_NULLCHECK1(a) do { if (!(a)) return NULL; } while (0)
#define CA_OP_NULLCHECK2(a, b) do { if (!(a) || !(b)) return NULL; } while (0)

/* Fails (records, returns false) unless t is a float tensor. */
bool ca_op_check_float(const char *op, const ca_tensor *t);
/* Fails unless a and b are on the same device. */
bool ca_op_check_same_device(const char *op, const ca_tensor *a, const ca_tensor *b);
/* A scoped contiguous tensor with t's shape and dtype on t's device. */
ca_tensor *ca_op_new_like(const ca_tensor *t);
/* Adds `g` (contiguous, t's logical shape) into t's gradient. */
ca_status ca_op_accumulate(ca_tensor *t, ca_tensor *g, float alpha);
/* Adds `g` (contiguous, shape out_shape) into t's gradient, summing over the
 * dimensions along which t was broadcast to out_shape. */
ca_status ca_op_accumulate_reduced(ca_tensor *t, ca_tensor *g, float alpha);
/* ca_op_accumulate_reduced for a g that nothing reads or writes afterwards: when alpha is 1 and t
 * has no gradient yet this pass, g becomes it (ca_grad_adopt) instead of being copied. */
ca_status ca_op_accumulate_owned(ca_tensor *t, ca_tensor *g, float alpha);
/* A replacement of ca_scaled_dot_product_attention for the calling thread (context parallelism's,
 * accelerator/cp.c), with its arguments; NULL fn restores the op. The replacement runs the op itself
 * through ca_op_attention. */
typedef ca_tensor *(*ca_attention_hook)(void *ctx, ca_tensor *q, ca_tensor *k, ca_tensor *v, ca_tensor *mask,
                                        bool causal, double dropout_p, double scale);
void ca_attention_set_hook(ca_attention_hook fn, void *ctx);
/* ca_scaled_dot_product_attention without the hook. */
ca_tensor *ca_op_attention(ca_tensor *q, ca_tensor *k, ca_tensor *v, ca_tensor *mask, bool causal,
                           double dropout_p, double scale);
/* Scalar f32 tensor holding v (scoped). */
ca_tensor *ca_op_scalar(ca_device *dev, float v);
/* ca_narrow for part `part` of the split numbered split_id (nonzero, unique per ca_split call): the parts of
 * one split cover disjoint regions of x, which their backward relies on (tensor/ops_shape.c). */
ca_tensor *ca_op_split_part(ca_tensor *x, int dim, int64_t start, int64_t len, uint64_t split_id, int part);

#endif
