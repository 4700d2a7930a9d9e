/* Tensors of more than 2^31 elements on the GPU: the elementwise kernels take 32-bit indices below
 * 2^31 elements and 64-bit ones above; this checks the 64-bit paths (f16 add and neg in 16-byte
 * vectors, a u8 -> f16 cast) at 2^31 + 5 elements, at sampled positions on both sides of 2^31 and
 * at the end. Skips (77) with the driver's reason without a GPU. */
#include "test_cuda_util.h"

#include "base/half_impl.h"

#define BIG (((int64_t)1 << 31) + 5)

static ca_device *G;

/* An exact small integer per position, different on both sides of 2^31 (f16 holds it exactly). */
static float pattern(int64_t i) { return (float)((int64_t)(((uint64_t)i * 2654435761u) >> 7) % 2001 - 1000); }

/* The positions checked: both ends, around 2^31 (and 2^31 / 8, the vectors' own 2^28), and spread. */
static int64_t sample(int k) {
    if (k < 4096) return k;
    if (k < 8192) return BIG - 1 - (k - 4096);
    if (k < 12288) return BIG - 8192 + (k - 8192);   /* with the end's window: 8192 straddling 2^31 */
    if (k < 16384) return ((int64_t)1 << 28) - 2048 + (k - 12288);
    return (int64_t)(((uint64_t)k * 0x9E3779B97F4A7C15ull) % (uint64_t)BIG);
}
#define NSAMPLES 100000

static void check_f16(const char *what, const uint16_t *got, float (*want)(int64_t)) {
    for (int k = 0; k < NSAMPLES; k++) {
        int64_t i = sample(k);
        uint16_t w = ca_f32_to_f16(want(i));
        if (got[i] != w)
            fail_msg("%s: element %lld of %lld: got f16 0x%04x (%g), want 0x%04x (%g)", what, (long long)i,
                     (long long)BIG, got[i], ca_f16_to_f32(got[i]), w, ca_f16_to_f32(w));
    }
}

static float twice(int64_t i) { return 2.0f * pattern(i); }
static float negated(int64_t i) { return -pattern(i); }
static float as_u8(int64_t i) { return (float)(uint8_t)(i * 131 + (i >> 31) * 7); }

static void test_f16_add_and_neg(void **state) {
    uint16_t *h = malloc((size_t)BIG * 2);
    assert_non_null(h);
    for (int64_t i = 0; i < BIG; i++) h[i] = ca_f32_to_f16(pattern(i));
    CA_SCOPE {
        ca_tensor *x = T_NN(ca_from_host(G, CA_F16, 1, (int64_t[]){BIG}, h));
        ca_tensor *y = T_NN(ca_add(x, x));
        memset(h, 0xff, (size_t)BIG * 2);
        T_OK(ca_tensor_to_host(y, h, (size_t)BIG * 2));
        check_f16("add f16 [2^31 + 5]", h, twice);
        y = T_NN(ca_neg(x));
        memset(h, 0xff, (size_t)BIG * 2);
        T_OK(ca_tensor_to_host(y, h, (size_t)BIG * 2));
        check_f16("neg f16 [2^31 + 5]", h, negated);
    }
    free(h);
}

static void test_u8_cast(void **state) {
    uint8_t *b = malloc((size_t)BIG);
    uint16_t *h = malloc((size_t)BIG * 2);
    assert_non_null(b);
    assert_non_null(h);
    for (int64_t i = 0; i < BIG; i++) b[i] = (uint8_t)as_u8(i);
    CA_SCOPE {
        ca_tensor *x = T_NN(ca_from_host(G, CA_U8, 1, (int64_t[]){BIG}, b));
        ca_tensor *y = T_NN(ca_cast(x, CA_F16));
        memset(h, 0xff, (size_t)BIG * 2);
        T_OK(ca_tensor_to_host(y, h, (size_t)BIG * 2));
        check_f16("cast u8 -> f16 [2^31 + 5]", h, as_u8);
    }
    free(b);
    free(h);
}

int main(void) {
    ca_log_set_level(CA_LOG_WARNING);
    G = tc_open_or_skip("test_cuda_big");
    tc_dev = G;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_add_and_neg),
        cmocka_unit_test(test_u8_cast),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_scope_release_all();
    ca_shutdown();
    return rc;
}
