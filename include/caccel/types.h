/* caccel/types.h: element types and the operator enums shared by kernels, ops and collectives. */
#ifndef CACCEL_TYPES_H
#define CACCEL_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <caccel/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types. Values are part of the plugin ABI: append only. */
typedef enum ca_dtype {
    CA_F32 = 0,
    CA_F16 = 1,   /* IEEE binary16 */
    CA_BF16 = 2,  /* bfloat16 */
    CA_I32 = 3,
    CA_I64 = 4,
    CA_U8 = 5,
    CA_DTYPE_COUNT
} ca_dtype;

/* Bytes per element (0 for an invalid dtype). */
CA_API size_t ca_dtype_size(ca_dtype dt);
/* "f32", "f16", "bf16", "i32", "i64", "u8" ("?" for an invalid dtype). */
CA_API const char *ca_dtype_name(ca_dtype dt);
/* True for f32, f16, bf16. */
CA_API bool ca_dtype_is_float(ca_dtype dt);

/* Reductions, used by the reduce kernel and by collectives. */
typedef enum ca_reduce_op {
    CA_OP_SUM = 0,
    CA_OP_AVG = 1,   /* mean: sum / count (collectives: / world size) */
    CA_OP_MIN = 2,
    CA_OP_MAX = 3
} ca_reduce_op;
CA_API const char *ca_reduce_op_name(ca_reduce_op op);

/* Elementwise unary functions y = f(x) (alpha is the op's parameter where it has one). */
typedef enum ca_unary_op {
    CA_UNARY_NEG = 0,
    CA_UNARY_RELU,
    CA_UNARY_GELU_TANH, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    CA_UNARY_TANH,
    CA_UNARY_SIGMOID,
    CA_UNARY_EXP,
    CA_UNARY_LOG,
    CA_UNARY_SQRT,
    CA_UNARY_RSQRT,
    CA_UNARY_ABS,
    CA_UNARY_SQUARE,
    CA_UNARY_RECIP,
    CA_UNARY_SCALE,     /* alpha * x */
    CA_UNARY_ADD_SCALAR,/* x + alpha */
    CA_UNARY_POW,       /* x ^ alpha */
    CA_UNARY_GELU_ERF,  /* 0.5 x (1 + erf(x / sqrt 2)) (ABI 1.1) */
    CA_UNARY_SILU,      /* x sigmoid(x) (ABI 1.1) */
    CA_UNARY_OP_COUNT
} ca_unary_op;
CA_API const char *ca_unary_op_name(ca_unary_op op);

/* Elementwise binary functions y = f(a, b). */
typedef enum ca_binary_op {
    CA_BINARY_ADD = 0,
    CA_BINARY_SUB,
    CA_BINARY_MUL,
    CA_BINARY_DIV,
    CA_BINARY_MAX,
    CA_BINARY_MIN,
    CA_BINARY_OP_COUNT
} ca_binary_op;
CA_API const char *ca_binary_op_name(ca_binary_op op);

/* Most dimensions a tensor may have. */
#define CA_MAX_DIMS 8

#ifdef __cplusplus
}
#endif
#endif
