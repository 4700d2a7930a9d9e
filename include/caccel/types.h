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

/* Each enum below is generated from a list, CA_<ENUM>_LIST(X), that calls X once per entry in value
 * order with the entry's enumerator (without its prefix), its name and its other facts. The names
 * (ca_dtype_name, ca_unary_op_name, ...) and the tables indexed by the enum are generated from the
 * same list or checked at compile time to have one row per entry, so that the one place a new entry
 * is written is its list (at the end: values are part of the plugin ABI, append only); the build
 * then stops at each kernel switch that has no case for it (docs/CONTRIBUTING.md). */

/* Element types: X(enumerator, name, bytes per element, is a float type). */
#define CA_DTYPE_LIST(X)                                                                           \
    X(F32, "f32", 4, 1)                                                                            \
    X(F16, "f16", 2, 1)   /* IEEE binary16 */                                                      \
    X(BF16, "bf16", 2, 1) /* bfloat16 */                                                           \
    X(I32, "i32", 4, 0)                                                                            \
    X(I64, "i64", 8, 0)                                                                            \
    X(U8, "u8", 1, 0)

/* Reductions, used by the reduce kernel and by collectives: X(enumerator, name).
 * AVG is the mean: sum / count (collectives: / world size). */
#define CA_REDUCE_OP_LIST(X) X(SUM, "sum") X(AVG, "avg") X(MIN, "min") X(MAX, "max")

/* Elementwise unary functions y = f(x) (alpha is the op's parameter where it has one):
 * X(enumerator, name). The name is the one ca_ functions, errors and autograd report. */
#define CA_UNARY_OP_LIST(X)                                                                        \
    X(NEG, "neg")                                                                                  \
    X(RELU, "relu")                                                                                \
    X(GELU_TANH, "gelu")  /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */                    \
    X(TANH, "tanh")                                                                                \
    X(SIGMOID, "sigmoid")                                                                          \
    X(EXP, "exp")                                                                                  \
    X(LOG, "log")                                                                                  \
    X(SQRT, "sqrt")                                                                                \
    X(RSQRT, "rsqrt")                                                                              \
    X(ABS, "abs")                                                                                  \
    X(SQUARE, "square")                                                                            \
    X(RECIP, "recip")                                                                              \
    X(SCALE, "mul_scalar")     /* alpha * x (ca_mul_scalar) */                                     \
    X(ADD_SCALAR, "add_scalar") /* x + alpha */                                                    \
    X(POW, "pow")              /* x ^ alpha */                                                     \
    X(GELU_ERF, "gelu_erf")    /* 0.5 x (1 + erf(x / sqrt 2)) (ABI 1.1) */                         \
    X(SILU, "silu")            /* x sigmoid(x) (ABI 1.1) */

/* Elementwise binary functions y = f(a, b): X(enumerator, name). */
#define CA_BINARY_OP_LIST(X)                                                                       \
    X(ADD, "add") X(SUB, "sub") X(MUL, "mul") X(DIV, "div") X(MAX, "max") X(MIN, "min")

#define CA_DTYPE_ENUMERATOR_(e, ...) CA_##e,
#define CA_REDUCE_OP_ENUMERATOR_(e, ...) CA_OP_##e,
#define CA_UNARY_OP_ENUMERATOR_(e, ...) CA_UNARY_##e,
#define CA_BINARY_OP_ENUMERATOR_(e, ...) CA_BINARY_##e,

typedef enum ca_dtype { CA_DTYPE_LIST(CA_DTYPE_ENUMERATOR_) CA_DTYPE_COUNT } ca_dtype;

/* Bytes per element (0 for an invalid dtype). */
CA_API size_t ca_dtype_size(ca_dtype dt);
/* "f32", "f16", "bf16", "i32", "i64", "u8" ("?" for an invalid dtype). */
CA_API const char *ca_dtype_name(ca_dtype dt);
/* True for f32, f16, bf16. */
CA_API bool ca_dtype_is_float(ca_dtype dt);

typedef enum ca_reduce_op { CA_REDUCE_OP_LIST(CA_REDUCE_OP_ENUMERATOR_) } ca_reduce_op;
/* Outside ca_reduce_op, so that switches over it need no case for it. */
#define CA_REDUCE_OP_ONE_(e, ...) +1
enum { CA_REDUCE_OP_COUNT = 0 CA_REDUCE_OP_LIST(CA_REDUCE_OP_ONE_) };
CA_API const char *ca_reduce_op_name(ca_reduce_op op);

typedef enum ca_unary_op { CA_UNARY_OP_LIST(CA_UNARY_OP_ENUMERATOR_) CA_UNARY_OP_COUNT } ca_unary_op;
CA_API const char *ca_unary_op_name(ca_unary_op op);

typedef enum ca_binary_op { CA_BINARY_OP_LIST(CA_BINARY_OP_ENUMERATOR_) CA_BINARY_OP_COUNT } ca_binary_op;
CA_API const char *ca_binary_op_name(ca_binary_op op);

/* The values plugins were built against: a list reordered by mistake fails here (entries appended
 * at the end of a list leave these alone). */
#ifdef __cplusplus
#define CA_TYPES_ASSERT_(c, m) static_assert(c, m)
#else
#define CA_TYPES_ASSERT_(c, m) _Static_assert(c, m)
#endif
CA_TYPES_ASSERT_(CA_F32 == 0 && CA_F16 == 1 && CA_BF16 == 2 && CA_I32 == 3 && CA_I64 == 4 && CA_U8 == 5,
                 "ca_dtype values are ABI");
CA_TYPES_ASSERT_(CA_OP_SUM == 0 && CA_OP_AVG == 1 && CA_OP_MIN == 2 && CA_OP_MAX == 3,
                 "ca_reduce_op values are ABI");
CA_TYPES_ASSERT_(CA_UNARY_NEG == 0 && CA_UNARY_RECIP == 11 && CA_UNARY_SCALE == 12 && CA_UNARY_POW == 14 &&
                     CA_UNARY_GELU_ERF == 15 && CA_UNARY_SILU == 16,
                 "ca_unary_op values are ABI");
CA_TYPES_ASSERT_(CA_BINARY_ADD == 0 && CA_BINARY_DIV == 3 && CA_BINARY_MAX == 4 && CA_BINARY_MIN == 5,
                 "ca_binary_op values are ABI");

/* Most dimensions a tensor may have. */
#define CA_MAX_DIMS 8

#ifdef __cplusplus
}
#endif
#endif
