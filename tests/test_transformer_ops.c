/* The transformer ops' forward values against naive references: batched matmul, attention (grouped-query against the repeat_kv path too), joins and selections, norms, activations, cross-entropy over a large vocabulary. */
#include "test_util.h"

#include <string.h>

static ca_device *cpu(void) { return ca_cpu_device(); }

static void expect_close(const char *what, const float *got, const double *want, int64_t n, double tol) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= tol * (1 + fabs(want[i]))))
            fail_msg("%s[%lld]: got %.7g, want %.7g", what, (long long)i, got[i], want[i]);
}

/* ------------------------------------------------------------------ matmul */

static void test_matmul_broadcast_values(void **state) {
    uint64_t s = 1;
    CA_SCOPE {
        ca_tensor *a = t_randn(&s, CA_SHAPE(2, 1, 3, 4), -1, 1, 0), *b = t_randn(&s, CA_SHAPE(3, 4, 2), -1, 1, 0);
        ca_tensor *c = T_NN(ca_matmul(a, b));
        assert_int_equal(ca_tensor_ndim(c), 4);
        const int64_t *cs = ca_tensor_shape(c);
        assert_true(cs[0] == 2 && cs[1] == 3 && cs[2] == 3 && cs[3] == 2);
        float *ha = t_host(a), *hb = t_host(b), *hc = t_host(c);
        double want[2 * 3 * 3 * 2];
        for (int i = 0; i < 2; i++)
            for (int h = 0; h < 3; h++)
                for (int m = 0; m < 3; m++)
                    for (int n = 0; n < 2; n++) {
                        double acc = 0;
                        for (int k = 0; k < 4; k++) acc += (double)ha[(i * 3 + m) * 4 + k] * hb[(h * 4 + k) * 2 + n];
                        want[((i * 3 + h) * 3 + m) * 2 + n] = acc;
                    }
        expect_close("matmul [2,1,3,4] x [3,4,2]", hc, want, 36, 1e-5);
        free(ha); free(hb); free(hc);
        assert_null(ca_matmul(t_randn(&s, CA_SHAPE(2, 3, 4), -1, 1, 0), t_randn(&s, CA_SHAPE(3, 4, 2), -1, 1, 0)));
        assert_non_null(strstr(ca_last_error(), "cannot multiply [2, 3, 4]"));
    }
}

/* ------------------------------------------------------------------ attention */

typedef struct att_case {
    int64_t B, H, Tq, Tk, D, Dv;
    bool causal;
    const float *fmask;        /* [B,1,Tq,Tk] additive, or NULL */
    const uint8_t *bmask;      /* [B,1,1,Tk] key padding, or NULL */
    double scale, p;
    const float *u;            /* dropout uniforms [B,H,Tq,Tk], or NULL */
} att_case;

/* softmax(q k^T * scale + mask) v in double, dropout applied to the probabilities. */
static void att_naive(const att_case *c, const float *q, const float *k, const float *v, double *out) {
    double *sc = malloc((size_t)c->Tk * sizeof *sc);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++)
            for (int64_t i = 0; i < c->Tq; i++) {
                int64_t bh = b * c->H + h;
                double m = -INFINITY, z = 0;
                for (int64_t j = 0; j < c->Tk; j++) {
                    double d = 0;
                    for (int64_t e = 0; e < c->D; e++) d += (double)q[(bh * c->Tq + i) * c->D + e] * k[(bh * c->Tk + j) * c->D + e];
                    d *= c->scale;
                    if (c->fmask) d += c->fmask[(b * c->Tq + i) * c->Tk + j];
                    if ((c->bmask && !c->bmask[b * c->Tk + j]) || (c->causal && j > i)) d = -INFINITY;
                    sc[j] = d;
                    m = fmax(m, d);
                }
                for (int64_t j = 0; j < c->Tk; j++) z += m == -INFINITY ? 0 : exp(sc[j] - m);
                for (int64_t e = 0; e < c->Dv; e++) {
                    double acc = 0;
                    for (int64_t j = 0; j < c->Tk && m != -INFINITY; j++) {
                        double p = exp(sc[j] - m) / z;
                        if (c->u) p *= c->u[(bh * c->Tq + i) * c->Tk + j] >= c->p ? 1 / (1 - c->p) : 0;
                        acc += p * v[(bh * c->Tk + j) * c->Dv + e];
                    }
                    out[(bh * c->Tq + i) * c->Dv + e] = acc;
                }
            }
    free(sc);
}

static void att_check(const char *name, const att_case *c, uint64_t *s) {
    CA_SCOPE {
        ca_tensor *q = t_randn(s, CA_SHAPE(c->B, c->H, c->Tq, c->D), -2, 2, 0);
        ca_tensor *k = t_randn(s, CA_SHAPE(c->B, c->H, c->Tk, c->D), -2, 2, 0);
        ca_tensor *v = t_randn(s, CA_SHAPE(c->B, c->H, c->Tk, c->Dv), -1, 1, 0);
        ca_tensor *mask = NULL;
        if (c->fmask) mask = ca_from_host(cpu(), CA_F32, CA_SHAPE(c->B, 1, c->Tq, c->Tk), c->fmask);
        if (c->bmask) mask = ca_from_host(cpu(), CA_U8, CA_SHAPE(c->B, 1, 1, c->Tk), c->bmask);
        ca_rng_set_state(11, 0);
        ca_tensor *o = T_NN(ca_scaled_dot_product_attention(q, k, v, mask, c->causal, c->p, c->scale));
        float *hq = t_host(q), *hk = t_host(k), *hv = t_host(v), *ho = t_host(o);
        int64_t n = c->B * c->H * c->Tq * c->Dv;
        double *want = malloc((size_t)n * sizeof *want);
        att_naive(c, hq, hk, hv, want);
        expect_close(name, ho, want, n, 2e-5);
        free(hq); free(hk); free(hv); free(ho); free(want);
    }
}

static void test_attention_reference(void **state) {
    uint64_t s = 2;
    enum { B = 2, Tq = 5, Tk = 7 };
    float fm[B * Tq * Tk];
    for (int i = 0; i < B * Tq * Tk; i++) fm[i] = i % 5 == 0 ? -INFINITY : 0.05f * (float)(i % 11) - 0.2f;
    uint8_t pad[B * Tk] = {1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1};
    att_case plain = {B, 3, Tq, Tk, 4, 6, false, NULL, NULL, 0.5, 0, NULL};
    att_check("attention", &plain, &s);
    att_case causal = plain;
    causal.causal = true;
    att_check("attention causal", &causal, &s);
    att_case add = plain;
    add.fmask = fm;
    att_check("attention additive mask", &add, &s);
    att_case padc = causal;
    padc.bmask = pad;
    att_check("attention key padding + causal", &padc, &s);
    att_case big = {1, 2, 130, 100, 8, 8, true, NULL, NULL, 1 / sqrt(8.0), 0, NULL};  /* several row blocks */
    att_check("attention 130 x 100 causal", &big, &s);
    att_case nod = {1, 1, 3, 4, 0, 2, false, NULL, NULL, 1, 0, NULL};   /* D = 0: equal scores, the mean of v */
    att_check("attention with D = 0", &nod, &s);
    /* a row that may attend to nothing gives zeros (torch gives NaN) */
    uint8_t none[B * Tk] = {0};
    none[Tk] = 1;
    att_case empty = plain;
    empty.bmask = none;
    att_check("attention with no key allowed", &empty, &s);
}

/* The explicit composition, through the library's own ops. */
static void test_attention_matches_composition(void **state) {
    uint64_t s = 3;
    CA_SCOPE {
        ca_tensor *q = t_randn(&s, CA_SHAPE(2, 2, 6, 4), -1, 1, 0), *k = t_randn(&s, CA_SHAPE(2, 2, 6, 4), -1, 1, 0);
        ca_tensor *v = t_randn(&s, CA_SHAPE(2, 2, 6, 4), -1, 1, 0);
        ca_tensor *cm = T_NN(ca_triu_mask(cpu(), 6, 6, 1));          /* 1 above the diagonal: the future */
        ca_tensor *scores = ca_mul_scalar(ca_matmul(q, ca_transpose(k, 2, 3)), 0.5);
        ca_tensor *ref = T_NN(ca_matmul(ca_softmax(ca_masked_fill(scores, cm, -INFINITY)), v));
        ca_tensor *o = T_NN(ca_scaled_dot_product_attention(q, k, v, NULL, true, 0, 0));
        float *a = t_host(o), *b = t_host(ref);
        for (int i = 0; i < 2 * 2 * 6 * 4; i++) assert_float_equal(a[i], b[i], 1e-5);
        free(a); free(b);
    }
}

static void test_attention_dropout(void **state) {
    uint64_t s = 4;
    enum { B = 1, H = 2, T = 6, D = 3 };
    CA_SCOPE {
        ca_tensor *q = t_randn(&s, CA_SHAPE(B, H, T, D), -1, 1, 0), *k = t_randn(&s, CA_SHAPE(B, H, T, D), -1, 1, 0);
        ca_tensor *v = t_randn(&s, CA_SHAPE(B, H, T, D), -1, 1, 0);
        ca_rng_set_state(5, 40);
        float *a = t_host(T_NN(ca_scaled_dot_product_attention(q, k, v, NULL, false, 0.25, 0)));
        float *b = t_host(T_NN(ca_scaled_dot_product_attention(q, k, v, NULL, false, 0.25, 0)));
        ca_rng_set_state(5, 40);
        float *c = t_host(T_NN(ca_scaled_dot_product_attention(q, k, v, NULL, false, 0.25, 0)));
        /* the same state gives the same output; the generator moves on between calls */
        assert_memory_equal(a, c, sizeof(float) * B * H * T * D);
        assert_memory_not_equal(a, b, sizeof(float) * B * H * T * D);
        /* the kept elements are those of the uniform stream at the same state */
        ca_rng_set_state(5, 40);
        float *u = t_host(ca_rand_uniform(cpu(), CA_F32, CA_SHAPE(B, H, T, T), 0, 1));
        att_case dc = {B, H, T, T, D, D, false, NULL, NULL, 1 / sqrt((double)D), 0.25, u};
        float *hq = t_host(q), *hk = t_host(k), *hv = t_host(v);
        double want[B * H * T * D];
        att_naive(&dc, hq, hk, hv, want);
        expect_close("attention dropout", a, want, B * H * T * D, 2e-5);
        free(a); free(b); free(c); free(u); free(hq); free(hk); free(hv);
    }
    /* several row blocks of the kernel, Tk not a multiple of 4 (a row's words start mid-counter), causal */
    enum { B2 = 2, H2 = 3, TQ = 70, TK = 67 };
    CA_SCOPE {
        ca_tensor *q = t_randn(&s, CA_SHAPE(B2, H2, TQ, D), -1, 1, 0), *k = t_randn(&s, CA_SHAPE(B2, H2, TK, D), -1, 1, 0);
        ca_tensor *v = t_randn(&s, CA_SHAPE(B2, H2, TK, D), -1, 1, 0);
        ca_rng_set_state(6, 8);
        float *a = t_host(T_NN(ca_scaled_dot_product_attention(q, k, v, NULL, true, 0.3, 0)));
        ca_rng_set_state(6, 8);
        float *u = t_host(ca_rand_uniform(cpu(), CA_F32, CA_SHAPE(B2, H2, TQ, TK), 0, 1));
        att_case dc = {B2, H2, TQ, TK, D, D, true, NULL, NULL, 1 / sqrt((double)D), 0.3, u};
        float *hq = t_host(q), *hk = t_host(k), *hv = t_host(v);
        double *want = malloc(sizeof(double) * B2 * H2 * TQ * D);
        att_naive(&dc, hq, hk, hv, want);
        expect_close("attention dropout, 70 x 67 causal", a, want, B2 * H2 * TQ * D, 2e-5);
        free(a); free(u); free(hq); free(hk); free(hv); free(want);
    }
}

/* ca_dropout_part: each part along the sequence drops as the same elements of the whole tensor's dropout, and
 * the generator moves as for the whole (sequence parallelism's ranks); a part whose rows start off a
 * generator word is refused, as is one outside the whole. */
static void test_dropout_part(void **state) {
    uint64_t s = 9, seed, after_whole, after_part;
    enum { B = 3, T = 8, C = 6, t = 4 };
    CA_SCOPE {
        ca_tensor *x = t_randn(&s, CA_SHAPE(B, T, C), -1, 1, 0);
        ca_rng_set_state(5, 40);
        float *whole = t_host(T_NN(ca_dropout(x, 0.3, true)));
        ca_rng_get_state(&seed, &after_whole);
        for (int r = 0; r < T / t; r++) {
            ca_rng_set_state(5, 40);
            float *part = t_host(T_NN(ca_dropout_part(ca_contiguous(ca_narrow(x, 1, r * t, t)), 0.3, true, 1, r * t, T)));
            ca_rng_get_state(&seed, &after_part);
            assert_int_equal(after_part, after_whole);
            for (int b = 0; b < B; b++)
                assert_memory_equal(part + b * t * C, whole + (b * T + r * t) * C, sizeof(float) * t * C);
            free(part);
        }
        free(whole);
        assert_ptr_equal(ca_dropout_part(x, 0.3, false, 1, 0, T), x);   /* evaluation: x itself */
        /* rows of 3 x 3 elements starting at element 9 of each row of 24: off a word of 4 */
        ca_tensor *odd = t_randn(&s, CA_SHAPE(B, 3, 3), -1, 1, 0);
        assert_null(ca_dropout_part(odd, 0.3, true, 1, 3, 8));
        assert_int_equal(ca_last_status(), CA_ERR_UNSUPPORTED);
        assert_null(ca_dropout_part(x, 0.3, true, 1, 4, 8));   /* [4, 12) of 8 */
        assert_int_equal(ca_last_status(), CA_ERR_INVALID);
        ca_clear_error();
    }
}

/* Forward with grad keeps out and the per-row lse, not the [T, T] probabilities. */
static void test_attention_memory(void **state) {
    uint64_t s = 5;
    enum { T = 512, D = 16 };
    CA_SCOPE {
        ca_tensor *q = t_randn(&s, CA_SHAPE(1, 1, T, D), -1, 1, 0), *k = t_randn(&s, CA_SHAPE(1, 1, T, D), -1, 1, 0);
        ca_tensor *v = t_randn(&s, CA_SHAPE(1, 1, T, D), -1, 1, 0);
        ca_tensor_set_requires_grad(q, true);
        ca_allocator_stats before, after;
        T_OK(ca_device_memory_stats(cpu(), &before));
        T_OK(ca_device_reset_peak_stats(cpu()));
        ca_tensor *o = T_NN(ca_scaled_dot_product_attention(q, k, v, NULL, true, 0.1, 0));
        T_OK(ca_device_memory_stats(cpu(), &after));
        size_t tt = (size_t)T * T * sizeof(float);
        if (after.peak_allocated - before.allocated >= tt / 8)
            fail_msg("attention forward allocated %zu bytes at T=%d (a [T, T] f32 tensor is %zu)",
                     after.peak_allocated - before.allocated, T, tt);
        T_OK(ca_device_reset_peak_stats(cpu()));
        T_OK(ca_autograd_backward(ca_sum(o)));
        T_OK(ca_device_memory_stats(cpu(), &after));
        if (after.peak_allocated - before.allocated >= tt / 2)
            fail_msg("attention backward allocated %zu bytes at T=%d (a [T, T] f32 tensor is %zu)",
                     after.peak_allocated - before.allocated, T, tt);
    }
}

static void test_attention_errors(void **state) {
    uint64_t s = 6;
    CA_SCOPE {
        ca_tensor *q = t_randn(&s, CA_SHAPE(1, 2, 3, 4), -1, 1, 0), *k = t_randn(&s, CA_SHAPE(1, 2, 5, 4), -1, 1, 0);
        ca_tensor *v3 = t_randn(&s, CA_SHAPE(2, 5, 4), -1, 1, 0);
        assert_null(ca_scaled_dot_product_attention(q, k, v3, NULL, false, 0, 0));
        assert_non_null(strstr(ca_last_error(), "v [2, 5, 4]"));
        ca_tensor *v = t_randn(&s, CA_SHAPE(1, 2, 5, 4), -1, 1, 0);
        ca_tensor *m = t_randn(&s, CA_SHAPE(4, 5), -1, 1, 0);
        assert_null(ca_scaled_dot_product_attention(q, k, v, m, false, 0, 0));
        assert_non_null(strstr(ca_last_error(), "mask [4, 5] f32 does not broadcast to [1, 2, 3, 5]"));
        assert_null(ca_scaled_dot_product_attention(q, k, v, NULL, false, 1.0, 0));
        assert_non_null(strstr(ca_last_error(), "dropout probability"));
        /* grouped-query attention: the kv heads (3) must divide the query heads (2) */
        ca_tensor *k3 = t_randn(&s, CA_SHAPE(1, 3, 5, 4), -1, 1, 0), *v3h = t_randn(&s, CA_SHAPE(1, 3, 5, 4), -1, 1, 0);
        assert_null(ca_scaled_dot_product_attention(q, k3, v3h, NULL, false, 0, 0));
        assert_non_null(strstr(ca_last_error(), "k and v have 3 heads, which do not divide q's 2 heads"));
        /* k and v with different head counts */
        ca_tensor *v1 = t_randn(&s, CA_SHAPE(1, 1, 5, 4), -1, 1, 0);
        assert_null(ca_scaled_dot_product_attention(q, k, v1, NULL, false, 0, 0));
        assert_non_null(strstr(ca_last_error(), "k [B,Hkv,Tk,D], v [B,Hkv,Tk,Dv]"));
    }
}

/* Grouped-query attention against the repeat_kv path (k and v copied to every query head, as transformers'
 * repeat_kv), 4 query heads over 2 and 1 kv heads, 130 rows (three query blocks of the CPU kernel), causal
 * with a key-padding mask. The forward and dQ do the same arithmetic in the same order: the same bits. dK
 * and dV add a kv head's terms in the order (query block, query head) where the repeat path sums each
 * query head's blocks and then the heads: equal within 1e-5 (relative, plus 1e-5 absolute). */
static ca_tensor *repeat_kv(ca_tensor *x, int64_t n_rep) {
    int64_t b = ca_tensor_dim(x, 0), kv = ca_tensor_dim(x, 1), t = ca_tensor_dim(x, 2), d = ca_tensor_dim(x, 3);
    x = ca_expand(ca_reshape(x, 5, (int64_t[]){b, kv, 1, t, d}), 5, (int64_t[]){b, kv, n_rep, t, d});
    return ca_reshape(x, 4, (int64_t[]){b, kv * n_rep, t, d});
}

/* out and the gradients of q, k, v (host copies) of sum(attention(q, k, v) * w), through the repeat path
 * when `repeat`. */
static void gqa_run(ca_tensor *const *in, ca_tensor *w, ca_tensor *mask, bool repeat, float **res) {
    int64_t n_rep = ca_tensor_dim(in[0], 1) / ca_tensor_dim(in[1], 1);
    for (int i = 0; i < 3; i++) ca_tensor_zero_grad(in[i]);
    ca_tensor *k = repeat ? repeat_kv(in[1], n_rep) : in[1], *v = repeat ? repeat_kv(in[2], n_rep) : in[2];
    ca_tensor *o = T_NN(ca_scaled_dot_product_attention(in[0], k, v, mask, true, 0, 0));
    T_OK(ca_autograd_backward(ca_sum(ca_mul(o, w))));
    res[0] = t_host(o);
    for (int i = 0; i < 3; i++) res[i + 1] = t_host(T_NN(ca_tensor_grad(in[i])));
}

static void test_attention_grouped_query_matches_repeat(void **state) {
    uint64_t s = 8;
    enum { B = 2, H = 4, T = 130, D = 8 };
    for (int64_t hkv = 2; hkv >= 1; hkv--) CA_SCOPE {
        ca_tensor *in[3] = {t_randn(&s, CA_SHAPE(B, H, T, D), -1, 1, 0), t_randn(&s, CA_SHAPE(B, hkv, T, D), -1, 1, 0),
                            t_randn(&s, CA_SHAPE(B, hkv, T, D), -1, 1, 0)};
        for (int i = 0; i < 3; i++) ca_tensor_set_requires_grad(in[i], true);
        ca_tensor *w = t_randn(&s, CA_SHAPE(B, H, T, D), -1, 1, 0);
        uint8_t keep[B * T];
        for (int j = 0; j < B * T; j++) keep[j] = j % T < T - 11 * (j / T) - 2;   /* batch 1 pads 13 keys */
        ca_tensor *mask = T_NN(ca_from_host(cpu(), CA_U8, CA_SHAPE(B, 1, 1, T), keep));
        float *g[4], *r[4];
        gqa_run(in, w, mask, false, g);
        gqa_run(in, w, mask, true, r);
        assert_memory_equal(g[0], r[0], sizeof(float) * B * H * T * D);
        assert_memory_equal(g[1], r[1], sizeof(float) * B * H * T * D);
        for (int i = 2; i < 4; i++)
            for (int64_t j = 0; j < B * hkv * T * D; j++)
                if (!(fabsf(g[i][j] - r[i][j]) <= 1e-5f * (1 + fabsf(r[i][j]))))
                    fail_msg("H %d, Hkv %lld: %s[%lld] is %.9g, the repeat path's %.9g", H, (long long)hkv,
                             i == 2 ? "dk" : "dv", (long long)j, g[i][j], r[i][j]);
        for (int i = 0; i < 4; i++) { free(g[i]); free(r[i]); }
    }
}

/* ------------------------------------------------------------------ attention on views */

/* q, k and v as a GPT makes them: [B, T, H D] slices of one projection y [B, T, (H + 2 Hkv) D] (q's H heads,
 * then k's and v's Hkv), each seen as [B, H, T, D] through a reshape and a transpose (views, no copy); with
 * `copy`, contiguous copies of those views. */
static void qkv_views(ca_tensor *y, int64_t h, int64_t hkv, int64_t d, bool copy, ca_tensor **p) {
    int64_t b = ca_tensor_dim(y, 0), t = ca_tensor_dim(y, 1), heads[3] = {h, hkv, hkv};
    T_OK(ca_split(y, 2, 3, (int64_t[]){h * d, hkv * d, hkv * d}, p));
    for (int i = 0; i < 3; i++) {
        p[i] = T_NN(ca_transpose(ca_reshape(p[i], CA_SHAPE(b, t, heads[i], d)), 1, 2));
        if (copy) p[i] = T_NN(ca_contiguous(p[i]));
    }
}

/* The output (merged back to [B, T, H D]) and dx of sum(merge(attention(q, k, v)) w) (+ sum(y w2) when w2: y
 * read by another op too) with y = 2 x, on views or on contiguous copies (host copies into res[0], res[1]). */
typedef struct view_case {
    int64_t b, h, hkv, t, d;
    bool causal, pad;
    double dropout;
} view_case;

static void views_run(const view_case *c, ca_tensor *x, ca_tensor *w, ca_tensor *w2, bool copy, float **res) {
    ca_tensor_zero_grad(x);
    ca_tensor *y = T_NN(ca_mul_scalar(x, 2.0)), *p[3], *mask = NULL;
    qkv_views(y, c->h, c->hkv, c->d, copy, p);
    if (c->pad) {   /* batch i keeps its first t - 3 i - 1 keys */
        uint8_t *keep = malloc((size_t)(c->b * c->t));
        for (int64_t j = 0; j < c->b * c->t; j++) keep[j] = j % c->t < c->t - 3 * (j / c->t) - 1;
        mask = T_NN(ca_from_host(cpu(), CA_U8, CA_SHAPE(c->b, 1, 1, c->t), keep));
        free(keep);
    }
    ca_rng_set_state(11, 3);
    ca_tensor *o = T_NN(ca_scaled_dot_product_attention(p[0], p[1], p[2], mask, c->causal, c->dropout, 0));
    o = T_NN(ca_reshape(ca_contiguous(ca_transpose(o, 1, 2)), CA_SHAPE(c->b, c->t, c->h * c->d)));
    ca_tensor *loss = ca_sum(ca_mul(o, w));
    if (w2) loss = ca_add(loss, ca_sum(ca_mul(y, w2)));
    T_OK(ca_autograd_backward(T_NN(loss)));
    res[0] = t_host(o);
    res[1] = t_host(T_NN(ca_tensor_grad(x)));
}

/* Attention on the strided views of one projection (read in place, gradients written into the
 * projection's) gives the bits it gives on contiguous copies, forward and backward: the GPT's causal case,
 * grouped-query attention with a key-padding mask and dropout, several query blocks, and a projection that
 * another op reads too (its gradient then gets two terms). */
static void test_attention_views_equal_copies(void **state) {
    static const view_case cases[] = {
        {2, 3, 3, 20, 8, true, false, 0.0},
        {2, 4, 2, 70, 4, false, true, 0.2},
        {1, 2, 1, 130, 8, true, true, 0.0},
    };
    uint64_t s = 12;
    for (int ci = 0; ci < 3; ci++)
        for (int other = 0; other < 2; other++) CA_SCOPE {
            const view_case *c = &cases[ci];
            int64_t cols = (c->h + 2 * c->hkv) * c->d, n = c->b * c->t * cols, no = c->b * c->t * c->h * c->d;
            ca_tensor *x = t_randn(&s, CA_SHAPE(c->b, c->t, cols), -1, 1, 0);
            ca_tensor_set_requires_grad(x, true);
            ca_tensor *w = t_randn(&s, CA_SHAPE(c->b, c->t, c->h * c->d), -1, 1, 0);
            ca_tensor *w2 = other ? t_randn(&s, CA_SHAPE(c->b, c->t, cols), -1, 1, 0) : NULL;
            float *v[2], *r[2];
            views_run(c, x, w, w2, false, v);
            views_run(c, x, w, w2, true, r);
            for (int i = 0; i < 2; i++) {
                int64_t len = i == 0 ? no : n;
                for (int64_t j = 0; j < len; j++)
                    if (memcmp(&v[i][j], &r[i][j], sizeof(float)) != 0)
                        fail_msg("case %d%s: %s[%lld] is %a on views, %a on copies", ci, other ? " (y read twice)" : "",
                                 i == 0 ? "out" : "dx", (long long)j, (double)v[i][j], (double)r[i][j]);
                free(v[i]); free(r[i]);
            }
        }
}

/* The copy kernels of one step of a GPT attention block, as examples/gpt builds it (c_attn, split, views of
 * q, k and v, attention, heads merged, c_proj; Linear layers without bias, whose bias would be copied into
 * their output; a cross-entropy loss), counted in the kernel trace: none, forward or backward. The attention reads q, k and v
 * where the projection holds them, writes its output where the merge of heads wants it and the gradients
 * of q, k and v into the projection's. */
static void test_attention_block_copies(void **state) {
    enum { B = 2, T = 24, H = 3, D = 8, C = H * D };
    uint64_t s = 13;
    ca_module *attn, *proj;
    T_OK(ca_linear_create(C, 3 * C, false, &attn));
    T_OK(ca_linear_create(C, C, false, &proj));
    char dir[64];
    snprintf(dir, sizeof dir, "test_transformer_ops.%ld.trace", (long)getpid());
    CA_SCOPE {
        ca_tensor *x = t_randn(&s, CA_SHAPE(B, T, C), -1, 1, 0), *p[3];
        ca_tensor_set_requires_grad(x, true);
        T_OK(ca_profile_begin(&(ca_profile_config){.output_trace_dir = dir}));
        qkv_views(T_NN(ca_module_forward(attn, x)), H, H, D, false, p);
        ca_tensor *y = T_NN(ca_scaled_dot_product_attention(p[0], p[1], p[2], NULL, true, 0, 0));
        y = T_NN(ca_reshape(ca_contiguous(ca_transpose(y, 1, 2)), CA_SHAPE(B, T, C)));
        int32_t labels[B * T];
        for (int i = 0; i < B * T; i++) labels[i] = (i * 7) % C;
        ca_tensor *lab = T_NN(ca_from_host(cpu(), CA_I32, CA_SHAPE(B, T), labels));
        T_OK(ca_autograd_backward(T_NN(ca_cross_entropy(ca_module_forward(proj, y), lab))));
        T_OK(ca_profile_end());
    }
    const char *path = ca_profile_last_path();
    assert_int_equal(t_trace_count(path, "\"name\":\"attention\""), 1);
    assert_int_equal(t_trace_count(path, "\"name\":\"attention_backward\""), 1);
    int copies = t_trace_count(path, "\"name\":\"copy_strided\"");
    if (copies != 0) fail_msg("%d copy kernels in the step of a GPT attention block (trace %s)", copies, path);
    t_rm_tree(dir);
    ca_module_destroy(attn);
    ca_module_destroy(proj);
}

/* ------------------------------------------------------------------ joins and selections */

static void test_join_select_values(void **state) {
    CA_SCOPE {
        float a[6] = {1, 2, 3, 4, 5, 6}, b[2] = {7, 8};
        ca_tensor *ta = ca_from_host(cpu(), CA_F32, CA_SHAPE(2, 3), a);
        ca_tensor *tb = ca_from_host(cpu(), CA_F32, CA_SHAPE(2, 1), b);
        float *c = t_host(T_NN(ca_concat(2, (ca_tensor *[]){ta, tb}, 1)));
        float wc[8] = {1, 2, 3, 7, 4, 5, 6, 8};
        assert_memory_equal(c, wc, sizeof wc);
        free(c);
        ca_tensor *st = T_NN(ca_stack(2, (ca_tensor *[]){ta, ta}, 1));
        assert_true(ca_tensor_shape(st)[0] == 2 && ca_tensor_shape(st)[1] == 2 && ca_tensor_shape(st)[2] == 3);
        float *hs = t_host(st);
        float ws[12] = {1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6};
        assert_memory_equal(hs, ws, sizeof ws);
        free(hs);
        ca_tensor *parts[2];
        T_OK(ca_split(ta, 1, 2, (const int64_t[]){1, 2}, parts));
        float *p1 = t_host(ca_contiguous(parts[1]));
        float wp[4] = {2, 3, 5, 6};
        assert_memory_equal(p1, wp, sizeof wp);
        free(p1);
        assert_int_equal(ca_split(ta, 1, 2, (const int64_t[]){1, 1}, parts), CA_ERR_INVALID);
        assert_non_null(strstr(ca_last_error(), "sizes sum to 2, dimension 1 has 3"));
        int32_t idx[3] = {2, 0, 2};
        float *sel = t_host(T_NN(ca_index_select(ta, 1, ca_from_host(cpu(), CA_I32, CA_SHAPE(3), idx))));
        float wsel[6] = {3, 1, 3, 6, 4, 6};
        assert_memory_equal(sel, wsel, sizeof wsel);
        free(sel);
        int64_t gi[4] = {2, 0, 1, 1};          /* torch.gather(ta, 1, [[2, 0], [1, 1]]) */
        ca_tensor *tg = ca_from_host(cpu(), CA_I64, CA_SHAPE(2, 2), gi);
        float *ga = t_host(T_NN(ca_gather_dim(ta, 1, tg)));
        float wg[4] = {3, 1, 5, 5};
        assert_memory_equal(ga, wg, sizeof wg);
        free(ga);
        gi[3] = 3;
        assert_null(ca_gather_dim(ta, 1, ca_from_host(cpu(), CA_I64, CA_SHAPE(2, 2), gi)));
        assert_non_null(strstr(ca_last_error(), "index 3 at position 3 is outside [0, 3)"));
        uint8_t cond[3] = {1, 0, 1};
        ca_tensor *tc = ca_from_host(cpu(), CA_U8, CA_SHAPE(3), cond);
        float *w = t_host(T_NN(ca_where(tc, ta, ca_full(cpu(), CA_F32, 0, NULL, -1.0))));
        float ww[6] = {1, -1, 3, 4, -1, 6};
        assert_memory_equal(w, ww, sizeof ww);
        free(w);
        float *mf = t_host(T_NN(ca_masked_fill(ta, tc, -INFINITY)));
        assert_true(isinf(mf[0]) && mf[0] < 0 && mf[1] == 2 && isinf(mf[5]));
        free(mf);
        ca_tensor *tri = T_NN(ca_triu_mask(cpu(), 3, 4, 1));
        uint8_t ht[12], wt[12] = {0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1};
        T_OK(ca_tensor_to_host(tri, ht, sizeof ht));
        assert_memory_equal(ht, wt, sizeof wt);
    }
}

/* ------------------------------------------------------------------ norms and activations */

static void test_activation_and_norm_values(void **state) {
    uint64_t s = 7;
    CA_SCOPE {
        ca_tensor *x = t_randn(&s, CA_SHAPE(4, 8), -4, 4, 0), *w = t_randn(&s, CA_SHAPE(8), 0.5f, 1.5f, 0);
        float *hx = t_host(x), *hw = t_host(w);
        float *ge = t_host(T_NN(ca_gelu_erf(x))), *si = t_host(T_NN(ca_silu(x)));
        float *rn = t_host(T_NN(ca_rms_norm(x, w, 1e-6)));
        double wge[32], wsi[32], wrn[32];
        for (int i = 0; i < 32; i++) {
            wge[i] = 0.5 * hx[i] * (1 + erf(hx[i] / sqrt(2.0)));
            wsi[i] = hx[i] / (1 + exp(-(double)hx[i]));
        }
        for (int r = 0; r < 4; r++) {
            double ms = 0;
            for (int c = 0; c < 8; c++) ms += (double)hx[r * 8 + c] * hx[r * 8 + c] / 8;
            for (int c = 0; c < 8; c++) wrn[r * 8 + c] = hx[r * 8 + c] / sqrt(ms + 1e-6) * hw[c];
        }
        expect_close("gelu_erf", ge, wge, 32, 1e-6);
        expect_close("silu", si, wsi, 32, 1e-6);
        expect_close("rms_norm", rn, wrn, 32, 1e-5);
        free(hx); free(hw); free(ge); free(si); free(rn);
    }
}

/* ------------------------------------------------------------------ cross entropy */

/* RMSNorm as the same op made of elementwise ops and a mean (what ca_rms_norm was before its kernels). */
static ca_tensor *rms_norm_composite(ca_tensor *x, ca_tensor *w, double eps) {
    ca_tensor *ms = ca_mean_dim(ca_square(x), -1, true);
    ca_tensor *y = ca_mul(x, ca_pow_scalar(ca_add_scalar(ms, eps), -0.5));
    return w ? ca_mul(y, w) : y;
}

/* The rms_norm kernels against the composite op: output, and the gradients of x and the weight under
 * a weighted sum (so that dy differs per element), with and without weight, several row lengths. */
static void test_rms_norm_kernel_vs_composite(void **state) {
    uint64_t s = 11;
    const int64_t cols[] = {1, 7, 64, 1000};
    for (int ci = 0; ci < 4; ci++)
        for (int weighted = 0; weighted < 2; weighted++) CA_SCOPE {
            int64_t C = cols[ci], n = 3 * C;
            float *hy[2], *hgx[2], *hgw[2] = {NULL, NULL};
            ca_tensor *up = t_randn(&s, CA_SHAPE(3, C), -1, 1, 0);
            uint64_t s0 = s;
            for (int k = 0; k < 2; k++) {   /* the same x and w for both */
                uint64_t sk = s0;
                ca_tensor *x = t_randn(&sk, CA_SHAPE(3, C), -2, 2, 0), *w = t_randn(&sk, CA_SHAPE(C), 0.5f, 1.5f, 0);
                if (!weighted) w = NULL;
                ca_tensor_set_requires_grad(x, true);
                if (w) ca_tensor_set_requires_grad(w, true);
                ca_tensor *y = T_NN(k == 0 ? ca_rms_norm(x, w, 1e-5) : rms_norm_composite(x, w, 1e-5));
                T_OK(ca_autograd_backward(ca_sum(ca_mul(y, up))));
                hy[k] = t_host(y);
                hgx[k] = t_host(ca_tensor_grad(x));
                if (w) hgw[k] = t_host(ca_tensor_grad(w));
            }
            double want[3000];
            for (int64_t i = 0; i < n; i++) want[i] = hy[1][i];
            expect_close("rms_norm kernel vs composite", hy[0], want, n, 1e-5);
            for (int64_t i = 0; i < n; i++) want[i] = hgx[1][i];
            expect_close("rms_norm dx kernel vs composite", hgx[0], want, n, 1e-4);
            if (weighted) {
                for (int64_t i = 0; i < C; i++) want[i] = hgw[1][i];
                expect_close("rms_norm dweight kernel vs composite", hgw[0], want, C, 1e-4);
            }
            for (int k = 0; k < 2; k++) { free(hy[k]); free(hgx[k]); free(hgw[k]); }
        }
}

/* The swiglu kernels against ca_mul(ca_silu(gate), up): in f32 the same expressions in the same order, so
 * output and both gradients are bit for bit the composite's; sizes around a vector and a chunk. */
static void test_swiglu_equals_composite(void **state) {
    uint64_t s = 5;
    const int64_t sizes[] = {1, 7, 64, 1031, 5000};
    for (int si = 0; si < 5; si++) CA_SCOPE {
        int64_t n = sizes[si];
        float *h[2][3];
        ca_tensor *w = t_randn(&s, CA_SHAPE(n), -1, 1, 0);
        uint64_t s0 = s;
        for (int k = 0; k < 2; k++) {
            uint64_t sk = s0;
            ca_tensor *g = t_randn(&sk, CA_SHAPE(n), -8, 8, 0), *u = t_randn(&sk, CA_SHAPE(n), -2, 2, 0);
            ca_tensor_set_requires_grad(g, true);
            ca_tensor_set_requires_grad(u, true);
            ca_tensor *y = T_NN(k == 0 ? ca_swiglu(g, u) : ca_mul(ca_silu(g), u));
            T_OK(ca_autograd_backward(ca_sum(ca_mul(y, w))));
            h[k][0] = t_host(y);
            h[k][1] = t_host(ca_tensor_grad(g));
            h[k][2] = t_host(ca_tensor_grad(u));
        }
        for (int j = 0; j < 3; j++) {
            if (memcmp(h[0][j], h[1][j], (size_t)n * sizeof(float)) != 0)
                fail_msg("swiglu [%lld]: %s differs from the composite's", (long long)n,
                         j == 0 ? "the output" : j == 1 ? "the gate's gradient" : "up's gradient");
            free(h[0][j]);
            free(h[1][j]);
        }
    }
}

/* rope's refusals: tables that want a gradient; rope_scaling types by name; configs out of range. */
static void test_rope_refusals(void **state) {
    CA_SCOPE {
        uint64_t s = 3;
        ca_tensor *x = t_randn(&s, CA_SHAPE(1, 2, 3, 4), -1, 1, 0), *c = t_randn(&s, CA_SHAPE(3, 2), -1, 1, 0);
        ca_tensor *sn = t_randn(&s, CA_SHAPE(3, 2), -1, 1, 0);
        ca_tensor_set_requires_grad(sn, true);
        assert_null(ca_rope(x, c, sn));
        assert_int_equal(ca_last_status(), CA_ERR_UNSUPPORTED);
        assert_non_null(strstr(ca_last_error(), "the cos/sin tables get no gradient"));
    }
    ca_rope_scaling_type t;
    assert_int_equal(ca_rope_scaling_parse("longrope", &t), CA_ERR_INVALID);
    assert_string_equal(ca_last_error(), "rope_scaling type \"longrope\" is not supported (linear, dynamic, llama3, yarn)");
    const char *ok[] = {NULL, "", "default", "none", "linear", "dynamic", "llama3", "yarn"};
    const ca_rope_scaling_type want[] = {CA_ROPE_SCALING_NONE, CA_ROPE_SCALING_NONE, CA_ROPE_SCALING_NONE,
                                         CA_ROPE_SCALING_NONE, CA_ROPE_SCALING_LINEAR, CA_ROPE_SCALING_DYNAMIC,
                                         CA_ROPE_SCALING_LLAMA3, CA_ROPE_SCALING_YARN};
    for (int i = 0; i < 8; i++) {
        T_OK(ca_rope_scaling_parse(ok[i], &t));
        assert_int_equal(t, want[i]);
    }
    ca_tensor *cs = (ca_tensor *)1, *sn = (ca_tensor *)1;
    const struct { ca_rope_config c; const char *msg; } bad[] = {
        {{.head_dim = 8, .rotary_dim = 5}, "rotary_dim is out of range"},
        {{.head_dim = 8, .rotary_dim = 10}, "rotary_dim is out of range"},
        {{.head_dim = 8, .type = CA_ROPE_SCALING_LINEAR}, "rope_scaling factor is out of range for rope_scaling type linear"},
        {{.head_dim = 8, .type = CA_ROPE_SCALING_DYNAMIC, .factor = 2}, "max_position_embeddings is out of range"},
        {{.head_dim = 8, .type = CA_ROPE_SCALING_LLAMA3, .factor = 8, .original_max_position_embeddings = 64,
          .low_freq_factor = 4, .high_freq_factor = 1}, "low_freq_factor/high_freq_factor is out of range"},
        {{.head_dim = 8, .type = CA_ROPE_SCALING_YARN, .factor = 4}, "original_max_position_embeddings is out of range"},
    };
    for (int i = 0; i < 6; i++) {
        assert_int_equal(ca_rope_tables(ca_cpu_device(), &bad[i].c, NULL, 1, 4, &cs, &sn), CA_ERR_INVALID);
        if (!strstr(ca_last_error(), bad[i].msg)) fail_msg("config %d: %s", i, ca_last_error());
        assert_null(cs);
        assert_null(sn);
    }
}

/* GPT-2's padded vocabulary: the loss and its gradient against a double-precision reference. */
static void test_cross_entropy_large_vocab(void **state) {
    enum { R = 3, V = 50304 };
    uint64_t s = 8;
    CA_SCOPE {
        ca_tensor *x = t_randn(&s, CA_SHAPE(1, R, V), -8, 8, 0);
        ca_tensor_set_requires_grad(x, true);
        int64_t lab[R] = {50303, -100, 17};
        ca_tensor *l = ca_from_host(cpu(), CA_I64, CA_SHAPE(1, R), lab);
        ca_tensor *loss = T_NN(ca_cross_entropy(x, l));
        T_OK(ca_autograd_backward(loss));
        float *hx = t_host(x), *g = t_host(ca_tensor_grad(x));
        double want = 0;
        for (int r = 0; r < R; r++) {
            double m = -INFINITY, z = 0;
            for (int c = 0; c < V; c++) m = fmax(m, hx[r * V + c]);
            for (int c = 0; c < V; c++) z += exp(hx[r * V + c] - m);
            for (int c = 0; c < V; c += 997) {
                double p = lab[r] < 0 ? 0 : (exp(hx[r * V + c] - m) / z - (c == lab[r])) / 2;
                assert_float_equal(g[r * V + c], p, 1e-7);
            }
            if (lab[r] >= 0) {
                want += (m + log(z) - hx[r * V + lab[r]]) / 2;
                assert_float_equal(g[r * V + lab[r]], (exp(hx[r * V + lab[r]] - m) / z - 1) / 2, 1e-6);
            }
        }
        assert_float_equal(ca_item(loss), want, 1e-4 * fabs(want));
        free(hx); free(g);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_broadcast_values),
        cmocka_unit_test(test_attention_reference),
        cmocka_unit_test(test_attention_matches_composition),
        cmocka_unit_test(test_attention_dropout),
        cmocka_unit_test(test_dropout_part),
        cmocka_unit_test(test_attention_memory),
        cmocka_unit_test(test_attention_errors),
        cmocka_unit_test(test_attention_grouped_query_matches_repeat),
        cmocka_unit_test(test_attention_views_equal_copies),
        cmocka_unit_test(test_attention_block_copies),
        cmocka_unit_test(test_join_select_values),
        cmocka_unit_test(test_activation_and_norm_values), cmocka_unit_test(test_rms_norm_kernel_vs_composite),
        cmocka_unit_test(test_swiglu_equals_composite), cmocka_unit_test(test_rope_refusals),
        cmocka_unit_test(test_cross_entropy_large_vocab),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ca_scope_release_all();
    ca_shutdown();
    return rc;
}
