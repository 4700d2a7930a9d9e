/* half_reduce_impl.h: the fp16 and bf16 reductions of the collective plugins (Gloo, MPI), in one
 * place and vectorised. Values are widened to f32, reduced, and rounded back to nearest even
 * (base/half_impl.h), so every backend gives the same bits. */
#ifndef CACCEL_HALF_REDUCE_IMPL_H
#define CACCEL_HALF_REDUCE_IMPL_H

#include <caccel/types.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[i] = a[i] op b[i] for n 16-bit floats; out may be a or b. */
typedef void (*ca_half_reduce_fn)(void *out, const void *a, const void *b, size_t n);

/* The reduction for dt (CA_F16 or CA_BF16) and op (0 sum, 1 min, 2 max: NaN wins); NULL for any other. */
ca_half_reduce_fn ca_half_reducer(ca_dtype dt, int op);

/* x[i] = x[i] / p, rounded back to dt (CA_F16 or CA_BF16): an average's last step. */
void ca_half_divide(ca_dtype dt, uint16_t *x, size_t n, int p);

#ifdef __cplusplus
}
#endif

#endif
