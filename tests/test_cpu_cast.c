/* Tests of the CPU backend's fill, casts (f32/f16/bf16 bit-exact, int<->float), copy_strided, Philox RNG and dropout. */
#include "test_cpu_util.h"
#include "backends/cpu/cpu_impl.h"

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ------------------------------------------------------------ half casts */

static void test_half_to_f32_exhaustive(void **state) {
    const ca_dtype dts[] = {CA_F16, CA_BF16};
    uint16_t *h = malloc(65536 * 2), *back = malloc(65536 * 2);
    float *f = malloc(65536 * 4);
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    for (int d = 0; d < 2; d++) {
        ca_dtype dt = dts[d];
        OK(KC(cast, .src_dt = dt, .x = h, .dst_dt = CA_F32, .y = f, .n = 65536, .alpha = 1.0f));
        for (int i = 0; i < 65536; i++) {
            double r = ref_decode((uint16_t)i, ebits_of(dt), mbits_of(dt));
            if (isnan(r)) {
                if (!isnan(f[i]) || !(f2u(f[i]) & 0x00400000u))
                    fail_msg("%s 0x%04x: want a quiet NaN, got 0x%08x", ca_dtype_name(dt), i, f2u(f[i]));
                if ((f2u(f[i]) >> 31) != (uint32_t)(i >> 15)) fail_msg("%s 0x%04x: NaN lost its sign", ca_dtype_name(dt), i);
            } else if ((double)f[i] != r || !signbit(f[i]) != !signbit(r)) {
                fail_msg("%s 0x%04x -> %.9g, want %.9g", ca_dtype_name(dt), i, (double)f[i], r);
            }
        }
        /* and back: the identity, except that NaNs come back quiet */
        OK(KC(cast, .src_dt = CA_F32, .x = f, .dst_dt = dt, .y = back, .n = 65536, .alpha = 1.0f));
        uint16_t quiet = dt == CA_F16 ? 0x0200 : 0x0040;
        for (int i = 0; i < 65536; i++) {
            uint16_t want = (uint16_t)i;
            if (isnan(ref_decode(want, ebits_of(dt), mbits_of(dt)))) want |= quiet;
            if (back[i] != want) fail_msg("%s 0x%04x -> f32 -> 0x%04x", ca_dtype_name(dt), i, back[i]);
        }
    }
    free(h);
    free(back);
    free(f);
}

static void check_f32_to_half(ca_dtype dt, const float *x, int64_t n) {
    uint16_t *h = malloc((size_t)n * 2);
    OK(KC(cast, .src_dt = CA_F32, .x = x, .dst_dt = dt, .y = h, .n = n, .alpha = 1.0f));
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i])) {
            if (!isnan(ref_decode(h[i], ebits_of(dt), mbits_of(dt))))
                fail_msg("%s: NaN 0x%08x became 0x%04x", ca_dtype_name(dt), f2u(x[i]), h[i]);
            continue;
        }
        uint16_t want = ref_encode(x[i], ebits_of(dt), mbits_of(dt));
        if (h[i] != want)
            fail_msg("%s: %.9g (0x%08x) -> 0x%04x, want 0x%04x", ca_dtype_name(dt), (double)x[i],
                     f2u(x[i]), h[i], want);
    }
    free(h);
}

static void test_f32_to_half(void **state) {
    /* random bit patterns: every exponent, subnormals, NaNs */
    int64_t n = 1 << 20;
    float *x = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) x[i] = u2f((uint32_t)(urand(0, 4294967296.0)));
    /* values near the f16 range, where its rounding and overflow happen */
    for (int64_t i = 0; i < n / 4; i++) x[i] = (float)(urand(-1, 1) * pow(2, urand(-27, 17)));
    const ca_dtype dts[] = {CA_F16, CA_BF16};
    for (int d = 0; d < 2; d++) check_f32_to_half(dts[d], x, n);
    free(x);
    float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, u2f(0x7f800001u), u2f(0xffc12345u),
                  65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e10f, u2f(0x7f7fffffu), u2f(0x00000001u),
                  u2f(0x80000001u), u2f(0x007fffffu), 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f,
                  8.940697e-08f, 6.1035156e-05f, 6.1035152e-05f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f,
                  u2f(0x3f808000u), u2f(0x3f818000u), u2f(0x7f7f8000u), u2f(0x7f7f7fffu)};
    for (int d = 0; d < 2; d++) check_f32_to_half(dts[d], sp, NELEM(sp));
    /* the ties, spelled out */
    uint16_t h[8];
    float t16[8] = {1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 0x1p-25f, 0x3p-25f, 65520.0f, 65519.99f, 1e-10f, -0x1p-24f};
    OK(KC(cast, .src_dt = CA_F32, .x = t16, .dst_dt = CA_F16, .y = h, .n = 8, .alpha = 1.0f));
    assert_int_equal(h[0], 0x3c00);  /* tie to even: down */
    assert_int_equal(h[1], 0x3c02);  /* tie to even: up */
    assert_int_equal(h[2], 0x0000);  /* half the smallest subnormal: to 0 */
    assert_int_equal(h[3], 0x0002);  /* 1.5 subnormal ulps: to 2 */
    assert_int_equal(h[4], 0x7c00);  /* overflow to Inf */
    assert_int_equal(h[5], 0x7bff);
    assert_int_equal(h[6], 0x0000);
    assert_int_equal(h[7], 0x8001);
    float tb[4] = {u2f(0x3f808000u), u2f(0x3f818000u), u2f(0x7f7f8000u), u2f(0x00008000u)};
    OK(KC(cast, .src_dt = CA_F32, .x = tb, .dst_dt = CA_BF16, .y = h, .n = 4, .alpha = 1.0f));
    assert_int_equal(h[0], 0x3f80);
    assert_int_equal(h[1], 0x3f82);
    assert_int_equal(h[2], 0x7f80);  /* overflow to Inf */
    assert_int_equal(h[3], 0x0000);  /* subnormal tie to even */
}

static void test_half_to_half(void **state) {
    uint16_t *h = malloc(65536 * 2), *o = malloc(65536 * 2);
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    OK(KC(cast, .src_dt = CA_F16, .x = h, .dst_dt = CA_BF16, .y = o, .n = 65536, .alpha = 1.0f));
    for (int i = 0; i < 65536; i++) {
        double v = ref_decode((uint16_t)i, 5, 10);
        if (isnan(v)) assert_true(isnan(ref_decode(o[i], 8, 7)));
        else if (o[i] != ref_encode(v, 8, 7)) fail_msg("f16 0x%04x -> bf16 0x%04x", i, o[i]);
    }
    OK(KC(cast, .src_dt = CA_BF16, .x = h, .dst_dt = CA_F16, .y = o, .n = 65536, .alpha = 1.0f));
    for (int i = 0; i < 65536; i++) {
        double v = ref_decode((uint16_t)i, 8, 7);
        if (isnan(v)) assert_true(isnan(ref_decode(o[i], 5, 10)));
        else if (o[i] != ref_encode(v, 5, 10)) fail_msg("bf16 0x%04x -> f16 0x%04x", i, o[i]);
    }
    /* in place with alpha: bf16 -> bf16 times 2 */
    uint16_t v[3] = {0x3f80, 0xc000, 0x7f80};
    OK(KC(cast, .src_dt = CA_BF16, .x = v, .dst_dt = CA_BF16, .y = v, .n = 3, .alpha = 2.0f));
    assert_true(v[0] == 0x4000 && v[1] == 0xc080 && v[2] == 0x7f80);
    free(h);
    free(o);
}

/* ------------------------------------------------------------ int casts */

static void test_int_casts(void **state) {
    uint8_t px[256];
    float f[256];
    for (int i = 0; i < 256; i++) px[i] = (uint8_t)i;
    const float inv = 1.0f / 255.0f;
    for (int n = 1; n <= 256; n += 17) {
        OK(KC(cast, .src_dt = CA_U8, .x = px, .dst_dt = CA_F32, .y = f, .n = n, .alpha = inv));
        for (int i = 0; i < n; i++) assert_true(f[i] == inv * (float)i);
    }
    assert_true(f[255] == inv * 255.0f);
    /* f32 -> u8: ties to even, saturation, NaN -> 0 */
    float fx[] = {0.4f, 0.5f, 1.5f, 2.5f, 254.5f, 255.4f, 300.0f, -3.0f, NAN, INFINITY, -0.6f};
    uint8_t u[NELEM(fx)];
    OK(KC(cast, .src_dt = CA_F32, .x = fx, .dst_dt = CA_U8, .y = u, .n = NELEM(fx), .alpha = 1.0f));
    const uint8_t uw[] = {0, 0, 2, 2, 254, 255, 255, 0, 0, 255, 0};
    assert_memory_equal(u, uw, sizeof uw);
    /* f32 -> i32 / i64 */
    float fi[] = {2.5f, -2.5f, 3.5f, 3e9f, -3e9f, NAN, 1e19f, -1e19f, 16777216.0f};
    int32_t i32[NELEM(fi)];
    int64_t i64[NELEM(fi)];
    OK(KC(cast, .src_dt = CA_F32, .x = fi, .dst_dt = CA_I32, .y = i32, .n = NELEM(fi), .alpha = 1.0f));
    OK(KC(cast, .src_dt = CA_F32, .x = fi, .dst_dt = CA_I64, .y = i64, .n = NELEM(fi), .alpha = 1.0f));
    const int32_t w32[] = {2, -2, 4, INT32_MAX, INT32_MIN, 0, INT32_MAX, INT32_MIN, 16777216};
    const int64_t w64[] = {2, -2, 4, 3000000000LL, -3000000000LL, 0, INT64_MAX, INT64_MIN, 16777216};
    assert_memory_equal(i32, w32, sizeof w32);
    assert_memory_equal(i64, w64, sizeof w64);
    /* float scale then round: 7 * 0.5 = 3.5 -> 4 */
    int32_t seven = 7, r;
    float seven_f = 7.0f;
    OK(KC(cast, .src_dt = CA_F32, .x = &seven_f, .dst_dt = CA_I32, .y = &r, .n = 1, .alpha = 0.5f));
    assert_int_equal(r, 4);
    OK(KC(cast, .src_dt = CA_I32, .x = &seven, .dst_dt = CA_I32, .y = &r, .n = 1, .alpha = 0.5f));
    assert_int_equal(r, 4);
    /* int -> int is exact when alpha == 1, saturating when narrowing */
    int64_t big[] = {16777217, -16777217, 1LL << 40, -(1LL << 40), 300, -1};
    int32_t n32[6];
    uint8_t n8[6];
    OK(KC(cast, .src_dt = CA_I64, .x = big, .dst_dt = CA_I32, .y = n32, .n = 6, .alpha = 1.0f));
    const int32_t wn32[] = {16777217, -16777217, INT32_MAX, INT32_MIN, 300, -1};
    assert_memory_equal(n32, wn32, sizeof wn32);
    OK(KC(cast, .src_dt = CA_I64, .x = big, .dst_dt = CA_U8, .y = n8, .n = 6, .alpha = 1.0f));
    const uint8_t wn8[] = {255, 0, 255, 0, 255, 0};
    assert_memory_equal(n8, wn8, sizeof wn8);
    int64_t back[6];
    OK(KC(cast, .src_dt = CA_I32, .x = n32, .dst_dt = CA_I64, .y = back, .n = 6, .alpha = 1.0f));
    for (int i = 0; i < 6; i++) assert_true(back[i] == n32[i]);
    /* int -> float with a scale; i64 and i32 */
    float ff[6];
    OK(KC(cast, .src_dt = CA_I64, .x = big, .dst_dt = CA_F32, .y = ff, .n = 6, .alpha = 2.0f));
    for (int i = 0; i < 6; i++) assert_true(ff[i] == 2.0f * (float)big[i]);
    OK(KC(cast, .src_dt = CA_I32, .x = n32, .dst_dt = CA_F32, .y = ff, .n = 6, .alpha = 1.0f));
    for (int i = 0; i < 6; i++) assert_true(ff[i] == (float)n32[i]);
    /* u8 -> f16/bf16 and f16 -> u8 */
    uint16_t hh[256];
    OK(KC(cast, .src_dt = CA_U8, .x = px, .dst_dt = CA_F16, .y = hh, .n = 256, .alpha = inv));
    for (int i = 0; i < 256; i++) assert_int_equal(hh[i], ref_encode(inv * (float)i, 5, 10));
    OK(KC(cast, .src_dt = CA_U8, .x = px, .dst_dt = CA_BF16, .y = hh, .n = 256, .alpha = 1.0f));
    OK(KC(cast, .src_dt = CA_BF16, .x = hh, .dst_dt = CA_U8, .y = u, .n = 11, .alpha = 1.0f));
    for (int i = 0; i < 11; i++) assert_int_equal(u[i], i);
    /* same dtype, alpha 1: a copy; f32 in place with alpha */
    float c[4] = {1, 2, 3, 4};
    OK(KC(cast, .src_dt = CA_F32, .x = c, .dst_dt = CA_F32, .y = c, .n = 4, .alpha = 1.0f));
    OK(KC(cast, .src_dt = CA_F32, .x = c, .dst_dt = CA_F32, .y = c, .n = 4, .alpha = -2.0f));
    assert_true(c[0] == -2 && c[3] == -8);
    /* narrowing in place (f32 -> bf16 over the same buffer) is allowed */
    OK(KC(cast, .src_dt = CA_F32, .x = c, .dst_dt = CA_BF16, .y = c, .n = 4, .alpha = 1.0f));
    assert_int_equal(((uint16_t *)c)[3], 0xc100);
    /* widening over its own input is refused */
    uint16_t w[4] = {0};
    assert_int_equal(KC(cast, .src_dt = CA_BF16, .x = w, .dst_dt = CA_F32, .y = w, .n = 2, .alpha = 1.0f), CA_ERR_INVALID);
    assert_int_equal(KC(cast, .src_dt = (ca_dtype)42, .x = w, .dst_dt = CA_F32, .y = f, .n = 1, .alpha = 1.0f), CA_ERR_INVALID);
    OK(KC(cast, .src_dt = CA_F32, .x = NULL, .dst_dt = CA_F16, .y = NULL, .n = 0, .alpha = 1.0f));
    /* a large conversion crosses many chunks */
    int64_t nn = 100003;
    uint8_t *bx = malloc((size_t)nn);
    float *by = malloc((size_t)nn * 4);
    for (int64_t i = 0; i < nn; i++) bx[i] = (uint8_t)(i * 7);
    OK(KC(cast, .src_dt = CA_U8, .x = bx, .dst_dt = CA_F32, .y = by, .n = nn, .alpha = inv));
    for (int64_t i = 0; i < nn; i++) assert_true(by[i] == inv * (float)bx[i]);
    free(bx);
    free(by);
}

/* ------------------------------------------------------------ fill */

static void test_fill(void **state) {
    const int64_t sizes[] = {1, 7, 257, 4099};
    for (int s = 0; s < NELEM(sizes); s++) {
        int64_t n = sizes[s];
        float *f = mk(CA_F32, n);
        OK(KC(fill, .dt = CA_F32, .n = n, .value = 0.1, .y = f));
        for (int64_t i = 0; i < n; i++) assert_true(f[i] == 0.1f);
        uint16_t *h = mk(CA_F16, n);
        OK(KC(fill, .dt = CA_F16, .n = n, .value = -2.5, .y = h));
        for (int64_t i = 0; i < n; i++) assert_int_equal(h[i], 0xc100);
        OK(KC(fill, .dt = CA_BF16, .n = n, .value = 3.0, .y = h));
        for (int64_t i = 0; i < n; i++) assert_int_equal(h[i], 0x4040);
        int32_t *i32 = mk(CA_I32, n);
        OK(KC(fill, .dt = CA_I32, .n = n, .value = 2.5, .y = i32));
        for (int64_t i = 0; i < n; i++) assert_int_equal(i32[i], 2);
        int64_t *i64 = mk(CA_I64, n);
        OK(KC(fill, .dt = CA_I64, .n = n, .value = -7, .y = i64));
        for (int64_t i = 0; i < n; i++) assert_true(i64[i] == -7);
        uint8_t *u8 = mk(CA_U8, n);
        OK(KC(fill, .dt = CA_U8, .n = n, .value = 300, .y = u8));
        for (int64_t i = 0; i < n; i++) assert_int_equal(u8[i], 255);
        free(f);
        free(h);
        free(i32);
        free(i64);
        free(u8);
    }
    uint16_t h;
    OK(KC(fill, .dt = CA_F16, .n = 1, .value = 1e6, .y = &h));
    assert_int_equal(h, 0x7c00);
    float f;
    OK(KC(fill, .dt = CA_F32, .n = 1, .value = NAN, .y = &f));
    assert_true(isnan(f));
    OK(KC(fill, .dt = CA_F32, .n = 0, .value = 1, .y = NULL));
    assert_int_equal(KC(fill, .dt = CA_F32, .n = -1, .value = 1, .y = &f), CA_ERR_INVALID);
    assert_int_equal(KC(fill, .dt = CA_DTYPE_COUNT, .n = 1, .value = 1, .y = &f), CA_ERR_INVALID);
}

/* ------------------------------------------------------------ copy_strided */

static void check_copy(ca_dtype dt, int ndim, const int64_t *shape, const int64_t *xs,
                       int64_t xoff, int64_t xlen, const int64_t *ys, int64_t ylen) {
    size_t es = ca_dtype_size(dt);
    unsigned char *x = malloc((size_t)xlen * es), *y = malloc((size_t)ylen * es),
                  *want = malloc((size_t)ylen * es);
    for (size_t i = 0; i < (size_t)xlen * es; i++) x[i] = (unsigned char)(urand(0, 256));
    memset(y, 0xab, (size_t)ylen * es);
    memset(want, 0xab, (size_t)ylen * es);
    int64_t n = 1, idx[CA_MAX_DIMS] = {0};
    for (int d = 0; d < ndim; d++) n *= shape[d];
    for (int64_t i = 0; i < n; i++) {
        int64_t xo = xoff, yo = 0;
        for (int d = 0; d < ndim; d++) {
            xo += idx[d] * xs[d];
            yo += idx[d] * ys[d];
        }
        memcpy(want + yo * (int64_t)es, x + xo * (int64_t)es, es);
        for (int d = ndim - 1; d >= 0; d--) {
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
        }
    }
    OK(KC(copy_strided, .dt = dt, .ndim = ndim, .shape = shape, .x = x + xoff * (int64_t)es, .x_stride = xs,
          .y = y, .y_stride = ys));
    assert_memory_equal(y, want, (size_t)ylen * es);
    free(x);
    free(y);
    free(want);
}

static void test_copy_strided(void **state) {
    const ca_dtype dts[] = {CA_U8, CA_F16, CA_F32, CA_I64};
    for (int d = 0; d < NELEM(dts); d++) {
        ca_dtype dt = dts[d];
        /* transpose [13, 7] -> [7, 13] */
        int64_t s2[2] = {7, 13}, xs2[2] = {1, 7}, ys2[2] = {13, 1};
        check_copy(dt, 2, s2, xs2, 0, 91, ys2, 91);
        /* contiguous (one memcpy after merging) */
        int64_t xc[2] = {13, 1};
        check_copy(dt, 2, s2, xc, 0, 91, ys2, 91);
        /* 3-D permutation with a size-1 dim */
        int64_t s4[4] = {3, 1, 5, 7}, xs4[4] = {1, 99, 21, 3}, ys4[4] = {35, 35, 7, 1};
        check_copy(dt, 4, s4, xs4, 0, 105, ys4, 105);
        /* broadcast (stride 0) into a padded output */
        int64_t sb[2] = {4, 257}, xsb[2] = {0, 1}, ysb[2] = {260, 1};
        check_copy(dt, 2, sb, xsb, 0, 257, ysb, 4 * 260);
        /* negative stride: a flip */
        int64_t sf[1] = {11}, xsf[1] = {-1}, ysf[1] = {1};
        check_copy(dt, 1, sf, xsf, 10, 11, ysf, 11);
        /* strided output */
        int64_t so[1] = {1031}, xso[1] = {1}, yso[1] = {3};
        check_copy(dt, 1, so, xso, 0, 1031, yso, 3093);
        /* a scalar (ndim 0) */
        check_copy(dt, 0, NULL, NULL, 0, 1, NULL, 1);
    }
    int64_t zero[2] = {0, 5}, st[2] = {5, 1};
    OK(KC(copy_strided, .dt = CA_F32, .ndim = 2, .shape = zero, .x = NULL, .x_stride = st, .y = NULL,
          .y_stride = st));
    assert_int_equal(KC(copy_strided, .dt = CA_F32, .ndim = CA_MAX_DIMS + 1, .shape = zero, .x = NULL,
                        .x_stride = st, .y = NULL, .y_stride = st), CA_ERR_INVALID);
    assert_int_equal(KC(copy_strided, .dt = (ca_dtype)-1, .ndim = 1, .shape = zero, .x = NULL, .x_stride = st,
                        .y = NULL, .y_stride = st), CA_ERR_INVALID);
}

/* ------------------------------------------------------------ RNG */

/* Philox4x32-10 written from the Random123 paper, independent of the backend. */
static void philox_ref(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]}, k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
        uint32_t n[4] = {(uint32_t)(p1 >> 32) ^ c[1] ^ k0, (uint32_t)p1,
                         (uint32_t)(p0 >> 32) ^ c[3] ^ k1, (uint32_t)p0};
        memcpy(c, n, sizeof c);
    }
    memcpy(out, c, sizeof c);
}

static void test_philox_kat(void **state) {
    /* Random123's kat_vectors: counter[4] key[2] -> output[4] */
    const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
        {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
         0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
        {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u,
         0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        philox_ref(kat[i], kat[i] + 4, out);
        for (int w = 0; w < 4; w++) assert_int_equal(out[w], kat[i][6 + w]);
    }
    /* the backend's block generator: counter 0, key 0 is the first vector */
    uint32_t w[4];
    cpu_philox_words(0, 0, 1, w);
    for (int j = 0; j < 4; j++) assert_int_equal(w[j], kat[0][6 + j]);
    /* and the all-ones key with counter (2^64 - 1, 0, 0): against the reference */
    uint64_t seed = 0xffffffffffffffffull;
    int64_t cnt = 1000;
    uint32_t *blk = malloc((size_t)cnt * 16);
    const uint64_t starts[] = {0, 0xfffffffffffffe00ull, 0xffffff00ull, 12345};
    for (int s = 0; s < NELEM(starts); s++) {
        cpu_philox_words(seed - (uint64_t)s, starts[s], cnt, blk);
        for (int64_t j = 0; j < cnt; j++) {
            uint64_t c = starts[s] + (uint64_t)j;
            uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), 0, 0};
            uint32_t key[2] = {(uint32_t)(seed - (uint64_t)s), (uint32_t)((seed - (uint64_t)s) >> 32)};
            uint32_t ref[4];
            philox_ref(ctr, key, ref);
            for (int q = 0; q < 4; q++)
                if (blk[4 * j + q] != ref[q]) fail_msg("philox counter %llu word %d", (unsigned long long)c, q);
        }
    }
    free(blk);
}

static void ref_words(uint64_t seed, uint64_t c, uint32_t out[4]) {
    uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), 0, 0}, key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    philox_ref(ctr, key, out);
}

static void test_rng_uniform(void **state) {
    const int64_t sizes[] = {1, 3, 4, 5, 7, 1023, 1024, 1025, 4099, 100003};
    const uint64_t seed = 0x0123456789abcdefull, offset = 77;
    for (int s = 0; s < NELEM(sizes); s++) {
        int64_t n = sizes[s];
        float *y = malloc((size_t)n * 4);
        OK(KC(rng, .kind = CA_RNG_UNIFORM, .dt = CA_F32, .n = n, .seed = seed, .offset = offset, .a = -1.0f,
              .b = 3.0f, .y = y));
        for (int64_t i = 0; i < n; i++) {
            uint32_t w[4];
            ref_words(seed, offset + (uint64_t)i / 4, w);
            float u = (float)(w[i % 4] >> 8) * 0x1p-24f;
            float want = -1.0f + 4.0f * u;
            if (y[i] != want) fail_msg("uniform element %lld: %.9g, want %.9g", (long long)i, (double)y[i], (double)want);
            assert_true(y[i] >= -1.0f && y[i] < 3.0f);
        }
        /* offset consistency: n elements from offset o are the tail of a longer draw from o - 5 */
        float *longer = malloc((size_t)(n + 20) * 4);
        OK(KC(rng, .kind = CA_RNG_UNIFORM, .dt = CA_F32, .n = n + 20, .seed = seed, .offset = offset - 5,
              .a = -1.0f, .b = 3.0f, .y = longer));
        assert_memory_equal(longer + 20, y, (size_t)n * 4);
        /* same arguments, same numbers; f16 output is the f32 draw rounded */
        uint16_t *h = malloc((size_t)n * 2);
        OK(KC(rng, .kind = CA_RNG_UNIFORM, .dt = CA_F16, .n = n, .seed = seed, .offset = offset, .a = -1.0f,
              .b = 3.0f, .y = h));
        for (int64_t i = 0; i < n; i++) assert_int_equal(h[i], ref_encode(y[i], 5, 10));
        free(h);
        free(longer);
        free(y);
    }
    /* a different seed gives different numbers */
    float a[64], b[64];
    OK(KC(rng, .kind = CA_RNG_UNIFORM, .dt = CA_F32, .n = 64, .seed = 1, .offset = 0, .a = 0, .b = 1, .y = a));
    OK(KC(rng, .kind = CA_RNG_UNIFORM, .dt = CA_F32, .n = 64, .seed = 2, .offset = 0, .a = 0, .b = 1, .y = b));
    assert_true(memcmp(a, b, sizeof a) != 0);
    assert_int_equal(ca_rng_counters(CA_RNG_UNIFORM, 5), 2);
    assert_int_equal(ca_rng_counters(CA_RNG_NORMAL, 5), 3);
    assert_int_equal(KC(rng, .kind = (ca_rng_kind)7, .dt = CA_F32, .n = 1, .seed = 0, .offset = 0, .a = 0,
                        .b = 1, .y = a), CA_ERR_INVALID);
    assert_int_equal(KC(rng, .kind = CA_RNG_UNIFORM, .dt = CA_I32, .n = 1, .seed = 0, .offset = 0, .a = 0,
                        .b = 1, .y = a), CA_ERR_UNSUPPORTED);
}

static void test_rng_normal(void **state) {
    const int64_t sizes[] = {1, 2, 3, 511, 512, 513, 100001};
    const uint64_t seed = 42, offset = 1000;
    for (int s = 0; s < NELEM(sizes); s++) {
        int64_t n = sizes[s];
        float *y = malloc((size_t)n * 4);
        OK(KC(rng, .kind = CA_RNG_NORMAL, .dt = CA_F32, .n = n, .seed = seed, .offset = offset, .a = 0.5f,
              .b = 2.0f, .y = y));
        double sum = 0, sq = 0;
        for (int64_t i = 0; i < n; i++) {
            uint32_t w[4];
            ref_words(seed, offset + (uint64_t)i / 2, w);
            double u1 = ((double)(w[2 * (i % 2)] >> 8) + 1) * 0x1p-24;
            double u2 = (double)(w[2 * (i % 2) + 1] >> 8) * 0x1p-24;
            double z = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
            double want = 0.5 + 2.0 * z;
            if (fabs(y[i] - want) > 1e-5 * (1 + fabs(want)))
                fail_msg("normal element %lld: %.9g, want %.9g", (long long)i, (double)y[i], want);
            sum += z;
            sq += z * z;
        }
        if (n > 100000) {
            double mean = sum / (double)n, var = sq / (double)n - mean * mean;
            assert_true(fabs(mean) < 0.02);
            assert_true(fabs(var - 1) < 0.03);
        }
        float *longer = malloc((size_t)(n + 6) * 4);
        OK(KC(rng, .kind = CA_RNG_NORMAL, .dt = CA_F32, .n = n + 6, .seed = seed, .offset = offset - 3,
              .a = 0.5f, .b = 2.0f, .y = longer));
        assert_memory_equal(longer + 6, y, (size_t)n * 4);
        free(longer);
        free(y);
    }
}

/* ------------------------------------------------------------ dropout */

static void test_dropout(void **state) {
    const float ps[] = {0.0f, 0.1f, 0.3f, 0.5f, 1.0f};
    const int64_t sizes[] = {1, 7, 1025, 100003};
    const ca_dtype dts[] = {CA_F32, CA_F16, CA_BF16};
    for (int pi = 0; pi < NELEM(ps); pi++)
        for (int s = 0; s < NELEM(sizes); s++)
            for (int d = 0; d < 3; d++) {
                float p = ps[pi];
                int64_t n = sizes[s];
                ca_dtype dt = dts[d];
                uint64_t seed = 99 + (uint64_t)s, off = 5;
                void *x = mk_rand(dt, n, -2, 2), *y = mk(dt, n);
                uint8_t *mask = malloc((size_t)n);
                float *u = malloc((size_t)n * 4);
                OK(KC(dropout, .dt = dt, .n = n, .p = p, .seed = seed, .offset = off, .x = x, .y = y,
                      .mask = mask));
                OK(KC(rng, .kind = CA_RNG_UNIFORM, .dt = CA_F32, .n = n, .seed = seed, .offset = off, .a = 0,
                      .b = 1, .y = u));
                double scale = p < 1 ? 1.0 / (1.0 - (double)p) : 0, kept = 0;
                double *ref = malloc((size_t)n * 8);
                for (int64_t i = 0; i < n; i++) {
                    assert_int_equal(mask[i], u[i] >= p);
                    kept += mask[i];
                    ref[i] = mask[i] ? get(dt, x, i) * scale : 0;
                }
                check_close("dropout", dt, y, ref, n, tol_of(dt), 0);
                if (n > 100000) assert_true(fabs(kept / (double)n - (1 - p)) < 0.01);
                if (p == 0) assert_true(kept == (double)n);
                if (p == 1) assert_true(kept == 0);
                /* backward, beta 0 over NaN and beta 0.5 */
                for (int b = 0; b < 2; b++) {
                    void *dy = mk_rand(dt, n, -1, 1), *dx = mk_rand(dt, n, -1, 1);
                    if (!b) fill_nan(dt, dx, n);
                    for (int64_t i = 0; i < n; i++)
                        ref[i] = (b ? 0.5 * get(dt, dx, i) : 0) + (mask[i] ? get(dt, dy, i) * scale : 0);
                    OK(KC(dropout_backward, .dt = dt, .n = n, .p = p, .mask = mask, .dy = dy, .dx = dx,
                          .beta = b ? 0.5f : 0.0f));
                    check_close("dropout_backward", dt, dx, ref, n, tol_of(dt), 1e-7);
                    free(dy);
                    free(dx);
                }
                /* in place, no mask wanted */
                for (int64_t i = 0; i < n; i++) ref[i] = mask[i] ? get(dt, x, i) * scale : 0;
                OK(KC(dropout, .dt = dt, .n = n, .p = p, .seed = seed, .offset = off, .x = x, .y = x,
                      .mask = NULL));
                check_close("dropout in place", dt, x, ref, n, tol_of(dt), 0);
                free(x);
                free(y);
                free(mask);
                free(u);
                free(ref);
            }
    float v = 1;
    uint8_t m;
    assert_int_equal(KC(dropout, .dt = CA_F32, .n = 1, .p = 1.5f, .seed = 0, .offset = 0, .x = &v, .y = &v,
                        .mask = &m), CA_ERR_INVALID);
    assert_int_equal(KC(dropout, .dt = CA_F32, .n = 1, .p = NAN, .seed = 0, .offset = 0, .x = &v, .y = &v,
                        .mask = &m), CA_ERR_INVALID);
    assert_int_equal(KC(dropout_backward, .dt = CA_F32, .n = 1, .p = 0.5f, .mask = NULL, .dy = &v, .dx = &v,
                        .beta = 0), CA_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_to_f32_exhaustive),
        cmocka_unit_test(test_f32_to_half),
        cmocka_unit_test(test_half_to_half),
        cmocka_unit_test(test_int_casts),
        cmocka_unit_test(test_fill),
        cmocka_unit_test(test_copy_strided),
        cmocka_unit_test(test_philox_kat),
        cmocka_unit_test(test_rng_uniform),
        cmocka_unit_test(test_rng_normal),
        cmocka_unit_test(test_dropout),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
