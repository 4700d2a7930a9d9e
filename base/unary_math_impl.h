/* The per-element arithmetic of the unary f32 kernels, shared by the CPU backend's kernels and the
 * lazy device's fused loops (backends/xla_stub/xla_fusion.c): one definition, so a fused loop gives
 * the CPU kernel's results bit for bit. Both are compiled with -std=c11 (no floating-point
 * contraction) and the same target clones. */
#ifndef CACCEL_BASE_UNARY_MATH_IMPL_H
#define CACCEL_BASE_UNARY_MATH_IMPL_H

#include <caccel/backend.h>
#include "base/half_impl.h"

#include <math.h>
#include <stdint.h>

#define CA_MATH_INLINE static inline __attribute__((always_inline))
#define CA_GELU_K 0.7978845608028654f  /* sqrt(2/pi) */
#define CA_GELU_C 0.044715f

/* expf to about 2 ulp, written for the vectoriser (no calls, no branches):
 * e^x = 2^n e^r with |r| <= ln2/2, the 2^n applied in two halves so that
 * subnormal results come out right. */
CA_MATH_INLINE float ca_fast_expf(float x) {
    const float shifter = 12582912.0f;                  /* 1.5 * 2^23: rounds to an integer */
    float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
    float k = xc * 1.44269504088896341f + shifter;
    float n = k - shifter;
    int32_t ni = (int32_t)(ca_f32_bits(k) - ca_f32_bits(shifter));
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    int32_t n1 = ni / 2, n2 = ni - n1;
    float s1 = ca_bits_f32((uint32_t)(n1 + 127) << 23);
    float s2 = ca_bits_f32((uint32_t)(n2 + 127) << 23);
    float y = p * s1 * s2;
    y = x > 88.72283935546875f ? INFINITY : y;
    y = x < -103.972084045410156f ? 0.0f : y;
    return x != x ? x : y;
}

/* The standard normal CDF Phi(x) = (1 + erf(x / sqrt 2)) / 2, for GELU, written for the
 * vectoriser (libm's erff is a scalar call): erfc by Numerical Recipes' Chebyshev fit
 * erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2), relative error below 1.2e-7 in exact
 * arithmetic; in f32 about 2e-7 relative for |x| < 8 (the rounding of z^2 grows it in the far
 * tail, where Phi < 1e-15). Taken from erfc on both sides, so the negative tail keeps its
 * relative accuracy instead of cancelling in 1 + erf. */
CA_MATH_INLINE float ca_phif(float x) {
    float z = (x < 0.0f ? -x : x) * 0.70710678118654752f;
    float t = 1.0f / (1.0f + 0.5f * z);
    float p = 0.17087277f;
    p = p * t - 0.82215223f;
    p = p * t + 1.48851587f;
    p = p * t - 1.13520398f;
    p = p * t + 0.27886807f;
    p = p * t - 0.18628806f;
    p = p * t + 0.09678418f;
    p = p * t + 0.37409196f;
    p = p * t + 1.00002368f;
    p = p * t - 1.26551223f;
    float half_erfc = 0.5f * t * ca_fast_expf(p - z * z);
    return x < 0.0f ? half_erfc : 1.0f - half_erfc;
}

/* One loop per op; the switch runs once per call, never per element. The
 * body is inlined into an in-place and a two-buffer variant so that the
 * compiler knows exactly how x and y alias in each. */
CA_MATH_INLINE void ca_unary_f32_loop(ca_unary_op op, int64_t n, const float *x, float *y, float alpha) {
    switch (op) {
    case CA_UNARY_NEG: for (int64_t i = 0; i < n; i++) y[i] = -x[i]; break;
    case CA_UNARY_RELU: for (int64_t i = 0; i < n; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i]; break;
    case CA_UNARY_GELU_TANH:
        /* 0.5 x (1 + tanh(u)) == x * sigmoid(2u) */
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            float u2 = 2.0f * CA_GELU_K * (v + CA_GELU_C * v * v * v);
            y[i] = v / (1.0f + ca_fast_expf(-u2));
        }
        break;
    case CA_UNARY_TANH: for (int64_t i = 0; i < n; i++) y[i] = tanhf(x[i]); break;
    case CA_UNARY_SIGMOID:
        for (int64_t i = 0; i < n; i++) y[i] = 1.0f / (1.0f + ca_fast_expf(-x[i]));
        break;
    case CA_UNARY_EXP: for (int64_t i = 0; i < n; i++) y[i] = ca_fast_expf(x[i]); break;
    case CA_UNARY_LOG: for (int64_t i = 0; i < n; i++) y[i] = logf(x[i]); break;
    case CA_UNARY_SQRT: for (int64_t i = 0; i < n; i++) y[i] = sqrtf(x[i]); break;
    case CA_UNARY_RSQRT: for (int64_t i = 0; i < n; i++) y[i] = 1.0f / sqrtf(x[i]); break;
    case CA_UNARY_ABS: for (int64_t i = 0; i < n; i++) y[i] = fabsf(x[i]); break;
    case CA_UNARY_SQUARE: for (int64_t i = 0; i < n; i++) y[i] = x[i] * x[i]; break;
    case CA_UNARY_RECIP: for (int64_t i = 0; i < n; i++) y[i] = 1.0f / x[i]; break;
    case CA_UNARY_SCALE: for (int64_t i = 0; i < n; i++) y[i] = alpha * x[i]; break;
    case CA_UNARY_ADD_SCALAR: for (int64_t i = 0; i < n; i++) y[i] = x[i] + alpha; break;
    case CA_UNARY_POW:
        if (alpha == 2.0f)
            for (int64_t i = 0; i < n; i++) y[i] = x[i] * x[i];
        else if (alpha == 1.0f)
            for (int64_t i = 0; i < n; i++) y[i] = x[i];
        else if (alpha == 0.5f)
            for (int64_t i = 0; i < n; i++) y[i] = sqrtf(x[i]);
        else
            for (int64_t i = 0; i < n; i++) y[i] = powf(x[i], alpha);
        break;
    case CA_UNARY_GELU_ERF:
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * ca_phif(x[i]);
        break;
    case CA_UNARY_SILU: for (int64_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + ca_fast_expf(-x[i])); break;
    case CA_UNARY_OP_COUNT: break;   /* not an op; no default, so -Wswitch wants a case per op */
    }
}

#endif
