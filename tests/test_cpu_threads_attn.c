/* The CPU attention (forward and backward) and the optimizer kernels give the same bits at 1, 2 and 3
 * threads: causal and padded attention with one (b, h) problem (the threads share its query blocks) and
 * with more problems than threads, grouped-query attention (kv heads shared by query heads), AdamW and SGD over several tensors, and the sum of squares. The
 * attention gives them too with every tensor strided (ABI 3.10's ca_attention_layout: q, k and v as slices
 * of one projection, out, dout and the gradients token-major), writing nothing outside its outputs. The
 * grain is forced to 1 so that the parallel paths run on these small shapes. */
#include "test_cpu_util.h"
#include "backends/cpu/cpu_parallel.h"

static const int THREADS[] = {1, 2, 3};
#define NTH 3

/* ------------------------------------------------------------ attention */

typedef struct att_case {
    const char *name;
    int64_t batch, heads, tq, tk, d, dv;
    bool causal, pad;        /* pad: a u8 key-padding mask, [B, 1, 1, Tk] broadcast */
    float dropout;
    int64_t kv_heads;        /* 0: as heads; fewer: grouped-query attention */
} att_case;

typedef struct att_out {
    float *out, *lse, *dq, *dk, *dv;
} att_out;

static float *rnd(int64_t n) {
    float *x = mk(CA_F32, n);
    for (int64_t i = 0; i < n; i++) x[i] = (float)urand(-1, 1);
    return x;
}

static int64_t kv_problems(const att_case *c) { return c->batch * (c->kv_heads ? c->kv_heads : c->heads); }

/* The problem of case c, with its [B, 1, 1, Tk] u8 mask when given. */
static ca_attention_params att_params(const att_case *c, const uint8_t *mask) {
    ca_attention_params p = {.batch = c->batch, .heads = c->heads, .tq = c->tq, .tk = c->tk, .d = c->d,
                             .dv = c->dv, .scale = 0.3f, .causal = c->causal, .dropout_p = c->dropout,
                             .seed = 42, .offset = 7};
    if (mask) {
        p.mask = mask;
        p.mask_dtype = CA_U8;
        p.mask_stride[0] = c->tk;
        p.mask_stride[3] = 1;
    }
    return p;
}

static void att_run(const att_case *c, const float *const in[4], const uint8_t *mask, att_out *o) {
    int64_t nbh = c->batch * c->heads, nkv = kv_problems(c);
    ca_attention_params p = att_params(c, mask);
    o->out = mk(CA_F32, nbh * c->tq * c->dv);
    o->lse = mk(CA_F32, nbh * c->tq);
    o->dq = mk(CA_F32, nbh * c->tq * c->d);
    o->dk = mk(CA_F32, nkv * c->tk * c->d);
    o->dv = mk(CA_F32, nkv * c->tk * c->dv);
    OK(KC(attention, .dt = CA_F32, .p = p, .q = in[0], .k = in[1], .v = in[2], .out = o->out, .lse = o->lse,
          .kv_heads = c->kv_heads));
    OK(KC(attention_backward, .dt = CA_F32, .p = p, .q = in[0], .k = in[1], .v = in[2], .out = o->out,
          .dout = in[3], .lse = o->lse, .dq = o->dq, .dk = o->dk, .dv = o->dv, .kv_heads = c->kv_heads));
}

static void att_free(att_out *o) { free(o->out); free(o->lse); free(o->dq); free(o->dk); free(o->dv); }

/* ------------------------------------------ the same through strides (ca_attention_layout) */

/* Where a [B, heads, T, E] tensor lies in a token-major buffer: row (b, t) of `w` floats, the tensor's heads
 * from column c0 (as q, k and v in one [B, T, 3 C] projection); strides {T w, E, w, 1}. */
typedef struct tok_place {
    float *buf;
    int64_t heads, t, e, w, c0;
} tok_place;

static void place_strides(const tok_place *p, int64_t *st) {
    st[0] = p->t * p->w; st[1] = p->e; st[2] = p->w; st[3] = 1;
}
static float *place_at(const tok_place *p, int64_t b, int64_t h, int64_t i, int64_t e) {
    return p->buf + (b * p->t + i) * p->w + p->c0 + h * p->e + e;
}
/* x (contiguous) into its place, or (back) its place into x. */
static void place_copy(const tok_place *p, int64_t batch, float *x, bool back) {
    for (int64_t b = 0, n = 0; b < batch; b++)
        for (int64_t h = 0; h < p->heads; h++)
            for (int64_t i = 0; i < p->t; i++)
                for (int64_t e = 0; e < p->e; e++, n++) {
                    if (back) x[n] = *place_at(p, b, h, i, e);
                    else *place_at(p, b, h, i, e) = x[n];
                }
}

#define SENTINEL 7.25f

/* Every float of the buffer outside the places holds the sentinel still: the kernel wrote nothing else. */
static void gaps_untouched(const char *name, const float *buf, int64_t n, const tok_place *p, int np, int64_t batch) {
    float *seen = calloc((size_t)n, sizeof *seen);
    assert_non_null(seen);
    for (int k = 0; k < np; k++)
        for (int64_t b = 0; b < batch; b++)
            for (int64_t h = 0; h < p[k].heads; h++)
                for (int64_t i = 0; i < p[k].t; i++)
                    for (int64_t e = 0; e < p[k].e; e++) seen[place_at(&p[k], b, h, i, e) - buf] = 1;
    for (int64_t i = 0; i < n; i++)
        if (!seen[i] && buf[i] != SENTINEL) fail_msg("%s: float %lld outside the tensors was written", name, (long long)i);
    free(seen);
}

/* Places of q, k, v (and of dq, dk, dv) in one buffer of rows [H D | Hkv D | Hkv Dv | 1 unused] when Tq = Tk,
 * else q in one (a column unused) and k, v in another: the three from one projection, as a GPT's. */
static int64_t qkv_places(const att_case *c, float *buf[2], tok_place *p) {
    int64_t hkv = c->kv_heads ? c->kv_heads : c->heads, wq = c->heads * c->d, wk = hkv * c->d, wv = hkv * c->dv;
    bool one = c->tq == c->tk;
    int64_t w0 = one ? wq + wk + wv + 1 : wq + 1, w1 = one ? w0 : wk + wv + 1, n0 = c->batch * c->tq * w0;
    int64_t n1 = one ? 0 : c->batch * c->tk * w1;
    buf[0] = mk(CA_F32, n0 + n1);
    buf[1] = one ? buf[0] : buf[0] + n0;
    for (int64_t i = 0; i < n0 + n1; i++) buf[0][i] = SENTINEL;
    p[0] = (tok_place){buf[0], c->heads, c->tq, c->d, w0, 0};
    p[1] = (tok_place){buf[1], hkv, c->tk, c->d, w1, one ? wq : 0};
    p[2] = (tok_place){buf[1], hkv, c->tk, c->dv, w1, one ? wq + wk : wk};
    return n0 + n1;
}

/* att_run with q, k, v, out, dout and dq, dk, dv strided (results gathered back into o) at the current
 * thread count; checks that nothing outside the outputs was written. */
static void att_run_strided(const att_case *c, const float *const in[4], const uint8_t *mask, att_out *o) {
    int64_t nbh = c->batch * c->heads, nkv = kv_problems(c), wo = c->heads * c->dv + 2;
    float *ib[2], *gb[2];
    tok_place pi[3], pg[3];
    qkv_places(c, ib, pi);
    int64_t ng = qkv_places(c, gb, pg), no = c->batch * c->tq * wo;
    for (int i = 0; i < 3; i++) place_copy(&pi[i], c->batch, (float *)in[i], false);
    float *ob = mk(CA_F32, 2 * no);
    for (int64_t i = 0; i < 2 * no; i++) ob[i] = SENTINEL;
    tok_place po = {ob, c->heads, c->tq, c->dv, wo, 0}, pd = {ob + no, c->heads, c->tq, c->dv, wo, 1};
    place_copy(&pd, c->batch, (float *)in[3], false);
    ca_attention_layout st, dst;
    place_strides(&pi[0], st.q); place_strides(&pi[1], st.k); place_strides(&pi[2], st.v); place_strides(&po, st.o);
    place_strides(&pg[0], dst.q); place_strides(&pg[1], dst.k); place_strides(&pg[2], dst.v);
    place_strides(&pd, dst.o);
    ca_attention_params p = att_params(c, mask);
    o->lse = mk(CA_F32, nbh * c->tq);
    OK(KC(attention, .dt = CA_F32, .p = p, .q = place_at(&pi[0], 0, 0, 0, 0), .k = place_at(&pi[1], 0, 0, 0, 0),
          .v = place_at(&pi[2], 0, 0, 0, 0), .out = place_at(&po, 0, 0, 0, 0), .lse = o->lse,
          .kv_heads = c->kv_heads, .st = st));
    OK(KC(attention_backward, .dt = CA_F32, .p = p, .q = place_at(&pi[0], 0, 0, 0, 0),
          .k = place_at(&pi[1], 0, 0, 0, 0), .v = place_at(&pi[2], 0, 0, 0, 0), .out = place_at(&po, 0, 0, 0, 0),
          .dout = place_at(&pd, 0, 0, 0, 0), .lse = o->lse, .dq = place_at(&pg[0], 0, 0, 0, 0),
          .dk = place_at(&pg[1], 0, 0, 0, 0), .dv = place_at(&pg[2], 0, 0, 0, 0), .kv_heads = c->kv_heads,
          .st = st, .dst = dst));
    o->out = mk(CA_F32, nbh * c->tq * c->dv);
    o->dq = mk(CA_F32, nbh * c->tq * c->d);
    o->dk = mk(CA_F32, nkv * c->tk * c->d);
    o->dv = mk(CA_F32, nkv * c->tk * c->dv);
    place_copy(&po, c->batch, o->out, true);
    place_copy(&pg[0], c->batch, o->dq, true);
    place_copy(&pg[1], c->batch, o->dk, true);
    place_copy(&pg[2], c->batch, o->dv, true);
    gaps_untouched(c->name, gb[0], ng, pg, 3, c->batch);
    tok_place pout[2] = {po, pd};
    gaps_untouched(c->name, ob, 2 * no, pout, 2, c->batch);
    free(ib[0]); free(gb[0]); free(ob);
}

static void same_bits(const char *what, const char *name, int threads, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s %s: element %lld is %a at 1 thread, %a at %d", name, what, (long long)i, (double)a[i],
                     (double)b[i], threads);
}

static bool any_nonzero(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) if (x[i] != 0.0f) return true;
    return false;
}

static void att_check(const att_case *c) {
    int64_t nbh = c->batch * c->heads, nkv = kv_problems(c);
    float *q = rnd(nbh * c->tq * c->d), *k = rnd(nkv * c->tk * c->d), *v = rnd(nkv * c->tk * c->dv);
    float *g = rnd(nbh * c->tq * c->dv);
    const float *in[4] = {q, k, v, g};
    uint8_t *mask = NULL;
    if (c->pad) {   /* batch b keeps its first tk - 5 b - 3 keys */
        mask = mk(CA_U8, c->batch * c->tk);
        for (int64_t b = 0; b < c->batch; b++)
            for (int64_t j = 0; j < c->tk; j++) mask[b * c->tk + j] = j < c->tk - 5 * b - 3;
    }
    att_out ref, o;
    cpu_set_threads(1);
    att_run(c, in, mask, &ref);
    assert_true(any_nonzero(ref.dk, nkv * c->tk * c->d) && any_nonzero(ref.dv, nkv * c->tk * c->dv));
    for (int r = 1; r < 2 * NTH; r++) {   /* contiguous at 2 and 3 threads, strided at 1, 2 and 3 */
        int t = r < NTH ? r : r - NTH;
        cpu_set_threads(THREADS[t]);
        if (r < NTH) att_run(c, in, mask, &o);
        else att_run_strided(c, in, mask, &o);
        bool s = r >= NTH;
        same_bits(s ? "strided out" : "out", c->name, THREADS[t], ref.out, o.out, nbh * c->tq * c->dv);
        same_bits(s ? "strided lse" : "lse", c->name, THREADS[t], ref.lse, o.lse, nbh * c->tq);
        same_bits(s ? "strided dq" : "dq", c->name, THREADS[t], ref.dq, o.dq, nbh * c->tq * c->d);
        same_bits(s ? "strided dk" : "dk", c->name, THREADS[t], ref.dk, o.dk, nkv * c->tk * c->d);
        same_bits(s ? "strided dv" : "dv", c->name, THREADS[t], ref.dv, o.dv, nkv * c->tk * c->dv);
        att_free(&o);
    }
    cpu_set_threads(1);
    att_free(&ref);
    free(q); free(k); free(v); free(g); free(mask);
}

/* B*H = 1: the threads share one problem's query blocks (Tq = 200: four blocks of up to 64 rows). */
static void test_attention_one_problem(void **state) {
    att_check(&(att_case){"1x1 causal", 1, 1, 200, 200, 16, 8, true, false, 0.0f, 0});
    att_check(&(att_case){"1x1 padded", 1, 1, 150, 90, 8, 12, false, true, 0.0f, 0});
    att_check(&(att_case){"1x1 causal padded dropout", 1, 1, 130, 130, 8, 8, true, true, 0.2f, 0});
}

/* B*H = 5 (between 1 and 2 per thread at 3 threads) and 8 (more than 2 per thread): both ways of
 * sharing the work. */
static void test_attention_many_problems(void **state) {
    att_check(&(att_case){"1x5 causal", 1, 5, 140, 140, 8, 8, true, false, 0.0f, 0});
    att_check(&(att_case){"2x4 causal padded", 2, 4, 100, 100, 8, 8, true, true, 0.0f, 0});
    att_check(&(att_case){"4x2 padded dropout", 4, 2, 70, 150, 4, 8, false, true, 0.1f, 0});
}

/* Grouped-query attention: a kv head's dK and dV sum its query heads' terms, whichever threads computed
 * them. One kv problem (B 1, H 4, Hkv 1: the threads share the query blocks of its four heads), 2 and 4
 * kv problems (below two per thread: waves), and 8 (above: whole kv problems per thread). */
static void test_attention_grouped_query(void **state) {
    att_check(&(att_case){"1x4 kv 1 causal", 1, 4, 130, 130, 8, 8, true, false, 0.0f, 1});
    att_check(&(att_case){"2x4 kv 1 causal padded", 2, 4, 100, 100, 8, 8, true, true, 0.0f, 1});
    att_check(&(att_case){"2x4 kv 2 padded dropout", 2, 4, 70, 90, 4, 8, false, true, 0.1f, 2});
    att_check(&(att_case){"4x4 kv 2 causal padded", 4, 4, 80, 80, 8, 4, true, true, 0.0f, 2});
}

/* ------------------------------------------------------------ optimizers */

#define NT 4
static const int64_t NUMEL[NT] = {5000, 37, 70001, 1024};

typedef struct opt_state {
    float *p[NT], *m[NT], *v[NT];
    void *g[NT];
} opt_state;

static void opt_init(opt_state *s, ca_dtype gdt) {
    rng_state = 0x1234567ull;
    for (int i = 0; i < NT; i++) {
        s->p[i] = rnd(NUMEL[i]);
        s->m[i] = rnd(NUMEL[i]);
        s->v[i] = mk(CA_F32, NUMEL[i]);
        s->g[i] = mk(gdt, NUMEL[i]);
        for (int64_t j = 0; j < NUMEL[i]; j++) {
            s->v[i][j] = (float)urand(0, 1);
            set(gdt, s->g[i], j, urand(-3, 3));
        }
    }
}

static void opt_free(opt_state *s) {
    for (int i = 0; i < NT; i++) { free(s->p[i]); free(s->m[i]); free(s->v[i]); free(s->g[i]); }
}

/* Three AdamW steps, three SGD (momentum, Nesterov) steps, then the sum of squares of the gradients. */
static float opt_steps(opt_state *s, ca_dtype gdt) {
    int64_t numel[NT];
    for (int i = 0; i < NT; i++) numel[i] = NUMEL[i];
    ca_tensor_list ta = {.count = NT, .param = (void *const *)s->p, .grad = (const void *const *)s->g,
                         .state1 = (void *const *)s->m, .state2 = (void *const *)s->v, .numel = numel,
                         .grad_dtype = gdt};
    for (int step = 1; step <= 3; step++) {
        ca_adamw_args a = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f,
                           .bias_correction1 = 1.0f - powf(0.9f, (float)step),
                           .bias_correction2 = 1.0f - powf(0.999f, (float)step), .grad_scale = 0.5f};
        OK(KC_LIST(adamw, &ta, &a));
    }
    ca_tensor_list tsg = ta;
    tsg.state1 = (void *const *)s->v;
    for (int step = 0; step < 3; step++) {
        ca_sgd_args a = {.lr = 1e-2f, .momentum = 0.9f, .weight_decay = 1e-3f, .nesterov = true,
                         .first_step = step == 0, .grad_scale = 1.0f};
        OK(KC_LIST(sgd, &tsg, &a));
    }
    ca_tensor_list tg = {.count = NT, .param = (void *const *)s->g, .numel = numel, .grad_dtype = gdt};
    float out = 0.0f;
    OK(KC(sum_squares, .t = &tg, .out = &out, .beta = 0));
    return out;
}

static void opt_check(ca_dtype gdt) {
    opt_state ref, s;
    cpu_set_threads(1);
    opt_init(&ref, gdt);
    float ref_sq = opt_steps(&ref, gdt);
    assert_true(ref_sq > 0.0f);
    for (int t = 1; t < NTH; t++) {
        cpu_set_threads(THREADS[t]);
        opt_init(&s, gdt);
        float sq = opt_steps(&s, gdt);
        const char *name = ca_dtype_name(gdt);
        for (int i = 0; i < NT; i++) {
            same_bits("param", name, THREADS[t], ref.p[i], s.p[i], NUMEL[i]);
            same_bits("exp_avg", name, THREADS[t], ref.m[i], s.m[i], NUMEL[i]);
            same_bits("exp_avg_sq / momentum", name, THREADS[t], ref.v[i], s.v[i], NUMEL[i]);
        }
        same_bits("sum of squares", name, THREADS[t], &ref_sq, &sq, 1);
        opt_free(&s);
    }
    cpu_set_threads(1);
    opt_free(&ref);
}

static void test_optimizers_f32(void **state) { opt_check(CA_F32); }
static void test_optimizers_bf16_grads(void **state) { opt_check(CA_BF16); }

int main(void) {
    setenv("CACCEL_CPU_GRAIN", "1", 1);   /* read at the first parallel call */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_one_problem),
        cmocka_unit_test(test_attention_many_problems),
        cmocka_unit_test(test_attention_grouped_query),
        cmocka_unit_test(test_optimizers_f32),
        cmocka_unit_test(test_optimizers_bf16_grads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
