/* avg_impl.h: the division of an all-reduce's sum by the world size (AVG), shared by the collective
 * plugins so that every backend averages to the same numbers. */
#ifndef CACCEL_AVG_IMPL_H
#define CACCEL_AVG_IMPL_H

#include <stddef.h>

/* x[i] /= p. Blocks of 16 with a fixed trip count vectorise at -O2, where the compiler's cheap cost
 * model leaves a loop of unknown length scalar (about 4x slower at 1 MiB). x / 2^k and x * 2^-k are
 * the same number, so a power-of-two world multiplies. */
static inline void ca_avg_f32(float *x, size_t n, int p) {
    const float d = (float)p, r = 1.0f / d;
    const int pow2 = (p & (p - 1)) == 0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if (pow2)
            for (size_t k = 0; k < 16; k++) x[i + k] *= r;
        else
            for (size_t k = 0; k < 16; k++) x[i + k] /= d;
    }
    for (; i < n; i++) x[i] = pow2 ? x[i] * r : x[i] / d;
}

#endif
