/* Names and sizes of dtypes and operator enums; the monotonic clock. */
#include "base/base_impl.h"

#include <time.h>

size_t ca_dtype_size(ca_dtype dt) {
    switch (dt) {
    case CA_F32: case CA_I32: return 4;
    case CA_F16: case CA_BF16: return 2;
    case CA_I64: return 8;
    case CA_U8: return 1;
    default: return 0;
    }
}

const char *ca_dtype_name(ca_dtype dt) {
    static const char *names[] = {"f32", "f16", "bf16", "i32", "i64", "u8"};
    return (unsigned)dt < CA_DTYPE_COUNT ? names[dt] : "?";
}

bool ca_dtype_is_float(ca_dtype dt) { return dt == CA_F32 || dt == CA_F16 || dt == CA_BF16; }

const char *ca_reduce_op_name(ca_reduce_op op) {
    static const char *names[] = {"sum", "avg", "min", "max"};
    return (unsigned)op < 4 ? names[op] : "?";
}

const char *ca_unary_op_name(ca_unary_op op) {
    static const char *names[] = {"neg", "relu", "gelu", "tanh", "sigmoid", "exp", "log", "sqrt",
                                  "rsqrt", "abs", "square", "recip", "scale", "add_scalar", "pow",
                                  "gelu_erf", "silu"};
    return (unsigned)op < CA_UNARY_OP_COUNT ? names[op] : "?";
}

const char *ca_binary_op_name(ca_binary_op op) {
    static const char *names[] = {"add", "sub", "mul", "div", "max", "min"};
    return (unsigned)op < CA_BINARY_OP_COUNT ? names[op] : "?";
}

int64_t ca_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
