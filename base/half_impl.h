/* half_impl.h: the one copy of the IEEE binary16 and bfloat16 <-> f32 conversions (round to
 * nearest even, overflow to Inf, NaN stays a quiet NaN), shared by the CPU backend, the CUDA
 * kernels (host and device) and the collective plugins, so every backend rounds bit for bit
 * alike. Branch-free, so that loops over them vectorise. */
#ifndef CACCEL_HALF_IMPL_H
#define CACCEL_HALF_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define CA_HALF_FN static __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define CA_HALF_FN static inline __attribute__((always_inline))
#else
#define CA_HALF_FN static inline
#endif

CA_HALF_FN uint32_t ca_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

CA_HALF_FN float ca_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* IEEE binary16 -> f32, exact; a NaN comes back quiet. */
CA_HALF_FN float ca_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = (uint32_t)(h & 0x7fffu) << 13;        /* exponent and mantissa in f32 position */
    uint32_t exp = em & 0x0f800000u;
    uint32_t normal = em + ((127u - 15u) << 23);
    uint32_t special = (em + ((255u - 31u) << 23)) | (em & 0x007fe000u ? 0x00400000u : 0u);
    /* subnormal: let the FPU normalise (m * 2^-24 is exact in f32) */
    uint32_t sub = ca_f32_bits(ca_bits_f32(em + (1u << 23) + ((127u - 15u) << 23)) -
                               ca_bits_f32((127u - 14u) << 23));
    uint32_t o = exp == 0x0f800000u ? special : (exp == 0 ? sub : normal);
    return ca_bits_f32(o | sign);
}

/* f32 -> binary16 with round-to-nearest-even; overflow gives Inf, NaN a quiet NaN. */
CA_HALF_FN uint16_t ca_f32_to_f16(float f) {
    uint32_t u = ca_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    /* large: Inf, NaN, or a finite value that is >= 65520 and so rounds to Inf */
    uint32_t big = a > 0x7f800000u ? 0x7e00u | ((a >> 13) & 0x3ffu) : 0x7c00u;
    /* subnormal result: adding 0.5 puts the f16 subnormal ulp (2^-24) at the
     * f32 ulp of the sum, so the FPU rounds to nearest even for us */
    uint32_t sub = ca_f32_bits(ca_bits_f32(a) + 0.5f) - 0x3f000000u;
    /* normal: rebias, then round on the 13 dropped bits (ties to even) */
    uint32_t nrm = (a + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    uint32_t o = a >= 0x477ff000u ? big : (a < 0x38800000u ? sub : nrm);
    return (uint16_t)(o | sign);
}

/* bfloat16 -> f32, exact; a NaN comes back quiet. */
CA_HALF_FN float ca_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    bool nan = (h & 0x7f80u) == 0x7f80u && (h & 0x7fu);
    return ca_bits_f32(nan ? u | 0x00400000u : u);
}

/* f32 -> bfloat16 with round-to-nearest-even; NaN stays a quiet NaN. */
CA_HALF_FN uint16_t ca_f32_to_bf16(float f) {
    uint32_t u = ca_f32_bits(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u) : (uint16_t)r;
}

#endif
