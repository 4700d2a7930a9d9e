/* test_cpu_util.h: the harness shared by the CPU backend tests: the device, reference f16/bf16
 * encoding, typed buffers, and tolerance checks. */
#ifndef CACCEL_TEST_CPU_UTIL_H
#define CACCEL_TEST_CPU_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/device_impl.h"
#include "backends/cpu/cpu_plugin.h"
#include "test_kcall.h"

static const ca_device_ops *ops;
static const ca_kernels *K;
static void *dev;

/* KC(slot, .field = value, ...): kernel `slot` of the CPU table, checked as the core checks it. */
#define KC(slot, ...) TKC("cpu", K, dev, slot, __VA_ARGS__)
#define KC_ARGS(slot, a) TKC_ARGS("cpu", K, dev, slot, a)
#define KC_LIST(slot, tl, a) TKC_LIST("cpu", K, dev, slot, tl, a)

static inline int setup(void **state) {
    const ca_plugin *pl = ca_cpu_plugin();
    if (!pl || pl->num_devices != 1) return -1;
    ops = pl->devices[0];
    ca_device_open_args args = {.struct_size = sizeof args, .local_rank = -1};
    if (ops->open(0, &args, &dev) != CA_OK) return -1;
    K = ops->kernels;
    return 0;
}

static inline int teardown(void **state) {
    ops->close(dev);
    return 0;
}

#define OK(expr)                                                                      \
    do {                                                                              \
        ca_status s_ = (expr);                                                        \
        if (s_ != CA_OK) fail_msg("%s -> %s: %s", #expr, ca_status_name(s_), ca_last_error()); \
    } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static inline double urand(double lo, double hi) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    uint64_t r = rng_state * 0x2545f4914f6cdd1dull;
    return lo + (hi - lo) * (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

/* Reference half formats, independent of the backend's bit tricks. */
static inline double ref_decode(uint16_t h, int ebits, int mbits) {
    int bias = (1 << (ebits - 1)) - 1;
    int e = (h >> mbits) & ((1 << ebits) - 1);
    int m = h & ((1 << mbits) - 1);
    double s = (h >> (ebits + mbits)) & 1 ? -1.0 : 1.0;
    if (e == (1 << ebits) - 1) return m ? NAN : s * INFINITY;
    if (e == 0) return s * ldexp(m, 1 - bias - mbits);
    return s * ldexp(1.0 + ldexp(m, -mbits), e - bias);
}

static inline uint16_t ref_encode(double x, int ebits, int mbits) {
    int bias = (1 << (ebits - 1)) - 1, emin = 1 - bias;
    uint16_t sign = signbit(x) ? (uint16_t)(1u << (ebits + mbits)) : 0;
    uint16_t inf = (uint16_t)(((1u << ebits) - 1) << mbits);
    if (isnan(x)) return (uint16_t)(inf | (1u << (mbits - 1)));
    double a = fabs(x);
    if (isinf(a)) return sign | inf;
    int e;
    frexp(a, &e);
    int ex = e - 1 < emin ? emin : e - 1;
    double q = ldexp(1.0, ex - mbits);
    double r = nearbyint(a / q) * q;  /* ties to even */
    double maxv = ldexp(2.0 - ldexp(1.0, -mbits), bias);
    if (r > maxv) return sign | inf;
    if (r == 0) return sign;
    if (r < ldexp(1.0, emin)) return sign | (uint16_t)(r / ldexp(1.0, emin - mbits));
    frexp(r, &e);
    int E = e - 1 + bias;
    uint16_t M = (uint16_t)((r / ldexp(1.0, e - 1) - 1.0) * ldexp(1.0, mbits));
    return (uint16_t)(sign | (uint16_t)(E << mbits) | M);
}

static inline int ebits_of(ca_dtype dt) { return dt == CA_F16 ? 5 : 8; }
static inline int mbits_of(ca_dtype dt) { return dt == CA_F16 ? 10 : 7; }

static inline void *mk(ca_dtype dt, int64_t n) {
    void *p = calloc((size_t)(n > 0 ? n : 1), ca_dtype_size(dt));
    assert_non_null(p);
    return p;
}

static inline double get(ca_dtype dt, const void *p, int64_t i) {
    switch (dt) {
    case CA_F32: return ((const float *)p)[i];
    case CA_F16: case CA_BF16: return ref_decode(((const uint16_t *)p)[i], ebits_of(dt), mbits_of(dt));
    case CA_I32: return ((const int32_t *)p)[i];
    case CA_I64: return (double)((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

static inline void set(ca_dtype dt, void *p, int64_t i, double v) {
    switch (dt) {
    case CA_F32: ((float *)p)[i] = (float)v; break;
    case CA_F16: case CA_BF16:
        ((uint16_t *)p)[i] = ref_encode((float)v, ebits_of(dt), mbits_of(dt));
        break;
    case CA_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case CA_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    default: ((uint8_t *)p)[i] = (uint8_t)v; break;
    }
}

static inline void *mk_rand(ca_dtype dt, int64_t n, double lo, double hi) {
    void *p = mk(dt, n);
    for (int64_t i = 0; i < n; i++) set(dt, p, i, urand(lo, hi));
    return p;
}

static inline void fill_nan(ca_dtype dt, void *p, int64_t n) {
    for (int64_t i = 0; i < n; i++) set(dt, p, i, NAN);
}

/* Relative tolerance of results stored in dt. */
static inline double tol_of(ca_dtype dt) { return dt == CA_F32 ? 2e-5 : (dt == CA_F16 ? 2e-3 : 1.6e-2); }

static inline void check_close(const char *what, ca_dtype dt, const void *got, const double *ref,
                        int64_t n, double rtol, double atol) {
    for (int64_t i = 0; i < n; i++) {
        double g = get(dt, got, i), r = ref[i];
        if (isnan(r) && isnan(g)) continue;
        if (isinf(r) && g == r) continue;
        if (fabs(g - r) <= atol + rtol * fabs(r)) continue;
        fail_msg("%s (%s): element %lld of %lld: got %.9g, want %.9g", what, ca_dtype_name(dt),
                 (long long)i, (long long)n, g, r);
    }
}

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

#endif
