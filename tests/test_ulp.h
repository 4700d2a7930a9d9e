/* test_ulp.h: units in the last place for the device parity bounds, shared by test_ops (the cuda
 * column's tolerances) and test_cuda_numerics (host simulations of the GPU's rounding that check those
 * bounds separate the right results from the wrong ones). */
#ifndef CACCEL_TEST_ULP_H
#define CACCEL_TEST_ULP_H

#include <caccel/types.h>

#include <math.h>
#include <stdint.h>

/* One unit in the last place of dt at |v|. */
static inline double t_ulp_of(ca_dtype dt, double v) {
    int mant = dt == CA_F16 ? 10 : (dt == CA_BF16 ? 7 : 23);
    int emin = dt == CA_F16 ? -14 : -126;
    int e;
    frexp(fabs(v), &e);
    e -= 1;   /* v = 1.m * 2^e */
    if (e < emin || v == 0) e = emin;
    return ldexp(1.0, e - mant);
}

/* log_softmax = x - (max + log sum exp): near its zero (the row's maximum) a relative bound means
 * nothing; the error is that of the shift, a few of its ulps. x: the input, ref: the CPU's output. */
static inline double t_shift_ulps(const float *x, const float *ref, int64_t i, int64_t cols) {
    (void)cols;
    double shift = (double)x[i] - (double)ref[i];
    return 2 * t_ulp_of(CA_F32, shift) + t_ulp_of(CA_F32, ref[i]);
}

#endif
