/* The CPU attention (forward and backward) and the optimizer kernels give the same bits at 1, 2 and 3
 * threads: causal and padded attention with one (b, h) problem (the threads share its query blocks) and
 * with more problems than threads, grouped-query attention (kv heads shared by query heads), AdamW and SGD over several tensors, and the sum of squares. The
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

static void att_run(const att_case *c, const float *const in[4], const uint8_t *mask, att_out *o) {
    int64_t nbh = c->batch * c->heads, nkv = kv_problems(c);
    ca_attention_params p = {.batch = c->batch, .heads = c->heads, .tq = c->tq, .tk = c->tk, .d = c->d,
                             .dv = c->dv, .scale = 0.3f, .causal = c->causal, .dropout_p = c->dropout,
                             .seed = 42, .offset = 7};
    if (mask) {
        p.mask = mask;
        p.mask_dtype = CA_U8;
        p.mask_stride[0] = c->tk;
        p.mask_stride[3] = 1;
    }
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
    for (int t = 1; t < NTH; t++) {
        cpu_set_threads(THREADS[t]);
        att_run(c, in, mask, &o);
        same_bits("out", c->name, THREADS[t], ref.out, o.out, nbh * c->tq * c->dv);
        same_bits("lse", c->name, THREADS[t], ref.lse, o.lse, nbh * c->tq);
        same_bits("dq", c->name, THREADS[t], ref.dq, o.dq, nbh * c->tq * c->d);
        same_bits("dk", c->name, THREADS[t], ref.dk, o.dk, nkv * c->tk * c->d);
        same_bits("dv", c->name, THREADS[t], ref.dv, o.dv, nkv * c->tk * c->dv);
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
