/* tp_check: tensor parallelism run as real processes (caccel launch or mpirun), driven by tests/test_tp.sh.
 * The model is an MLP fc1 = Linear(8, 16), tanh, fc2 = Linear(16, 4); --plan splits fc1 colwise and fc2
 * rowwise (ca_tp_plan), which the accelerator applies when parallelism_config_tp_size is above 1.
 *   --mode train (default): S steps of SGD with momentum on a global batch of B (each data-parallel rank
 *     reads B / dp); every step rank 0 prints "step=N loss=L" (the loss averaged over the dp ranks); after
 *     training the whole parameters (the tp shards gathered) go to --dump PATH, as one process holds them.
 *   --mode gradcheck: loss = sum(w * model(x)) with x requiring grad; the gradients of x (which the
 *     colwise layer's backward all-reduces over tp) and of a few elements of every local shard against
 *     central differences; prints "gradcheck ok N" or the first mismatch.
 *   --mode mesh: prints this rank's mesh coordinates and the size of each dimension's communicator (and of
 *     dp_cp under context parallelism).
 *   --block: the model is a GPT-2 block (fused q, k, v colwise in 3 blocks, 2 heads; see block_model); train
 *     prints its losses (no --dump).
 *   --mode vocab: the vocabulary-parallel layers (see vocab_model): prints "rank=R vocab loss=L logits=2x3xC"
 *     (C: the logits' columns this rank holds) and checks every element of its shards' gradients against
 *     central differences ("rank=R vocab gradcheck ok N"); then prints "rank=R refused: MESSAGE" for
 *     ca_tp_cross_entropy given the whole vocabulary's logits (at tp > 1) and a label outside it.
 *     --vocab-bad colwise|pad: the embedding planned colwise, or made with a padding_idx (refused).
 *   --lora: LoRA adapters on fc1 and fc2 (see add_lora); gradcheck then checks the adapters' tensors.
 *   --clip: ca_clip_grad_norm(0.1) every step, each rank printing the norm; --bad-plan: a plan naming a Tanh.
 *   --load-state DIR: ca_load_state after prepare (the steps then count on from the checkpoint's);
 *   --save-state DIR, --save-model DIR: ca_save_state, ca_save_model after training (each rank prints the
 *     wall time of the save and of the load);
 *   --hidden N: fc1's outputs (16);
 *   --stop-rank R: rank R prints "rank=R stops" and stops itself (SIGSTOP) before its second step, a hung
 *     tp peer. */
#include <caccel/caccel.h>

#include "tests/synthetic_data.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define IN 8
static int64_t g_hid = 16;   /* fc1's outputs (--hidden N: a wider MLP for bench/run_tp_sharded_state.sh) */
#define OUT 4

static ca_dataset *synthetic(int64_t n) {
    return synthetic_classes(n, IN, OUT);
}

static ca_module *model(bool plan, bool bad_plan) {
    ca_module *m, *l;
    CA_CHECK(ca_sequential_create(&m));
    CA_CHECK(ca_linear_create(IN, g_hid, true, &l)); CA_CHECK(ca_module_add(m, "fc1", l));
    CA_CHECK(ca_tanh_create(&l));                 CA_CHECK(ca_module_add(m, "act", l));
    CA_CHECK(ca_linear_create(g_hid, OUT, true, &l)); CA_CHECK(ca_module_add(m, "fc2", l));
    if (plan) {
        CA_CHECK(ca_tp_plan(m, "fc1", "colwise"));
        CA_CHECK(ca_tp_plan(m, "fc2", "rowwise"));
    }
    if (bad_plan) CA_CHECK(ca_tp_plan(m, "act", "colwise"));
    return m;
}

/* --block: a GPT-2 block on the 8 inputs read as 2 tokens of 4 channels, 2 heads: c_attn (a fused q, k, v:
 * colwise in 3 blocks), attn.c_proj rowwise, mlp.c_fc colwise, mlp.c_proj rowwise; then a head Linear(8, 4)
 * (whole on every rank). Its forward takes the local sizes from the tensors, as a tensor-parallel model must. */
#define T_TOK 2
#define C_CH 4
#define N_HEAD 2

static ca_tensor *block_forward(ca_module *self, ca_tensor *x, void *ctx) {
    (void)ctx;
    int64_t B = ca_tensor_dim(x, 0);
    x = ca_reshape(x, CA_SHAPE(B, T_TOK, C_CH));
    ca_tensor *h1 = ca_module_forward(ca_module_child(self, "ln_1"), x), *p[3];
    ca_tensor *qkv = ca_module_forward(ca_module_child(self, "attn.c_attn"), h1);
    if (!qkv) return NULL;
    int64_t cl = ca_tensor_dim(qkv, 2) / 3, hl = N_HEAD * cl / C_CH;   /* this tp rank's channels and heads */
    if (ca_split(qkv, 2, 3, (int64_t[]){cl, cl, cl}, p) != CA_OK) return NULL;
    for (int i = 0; i < 3; i++) p[i] = ca_transpose(ca_reshape(p[i], CA_SHAPE(B, T_TOK, hl, C_CH / N_HEAD)), 1, 2);
    ca_tensor *y = ca_scaled_dot_product_attention(p[0], p[1], p[2], NULL, true, 0.0, 0.0);
    y = ca_reshape(ca_contiguous(ca_transpose(y, 1, 2)), CA_SHAPE(B, T_TOK, cl));
    x = ca_add(x, ca_module_forward(ca_module_child(self, "attn.c_proj"), y));
    ca_tensor *h = ca_gelu(ca_module_forward(ca_module_child(self, "mlp.c_fc"), x));
    x = ca_add(x, ca_module_forward(ca_module_child(self, "mlp.c_proj"), h));
    return ca_module_forward(ca_module_child(self, "head"), ca_reshape(x, CA_SHAPE(B, T_TOK * C_CH)));
}

static ca_module *add(ca_module *parent, const char *name, ca_module *child) {
    CA_CHECK(ca_module_add(parent, name, child));
    return child;
}

static ca_module *linear(int64_t in, int64_t out) {
    ca_module *l;
    CA_CHECK(ca_linear_create(in, out, true, &l));
    return l;
}

static ca_module *block_model(bool plan) {
    ca_module *m, *attn, *mlp, *l;
    CA_CHECK(ca_module_create("Block", block_forward, NULL, NULL, &m));
    CA_CHECK(ca_layer_norm_create(C_CH, 1e-5, &l));
    add(m, "ln_1", l);
    CA_CHECK(ca_module_create("Attention", NULL, NULL, NULL, &attn));
    add(m, "attn", attn);
    add(attn, "c_attn", linear(C_CH, 3 * C_CH));
    add(attn, "c_proj", linear(C_CH, C_CH));
    CA_CHECK(ca_module_create("MLP", NULL, NULL, NULL, &mlp));
    add(m, "mlp", mlp);
    add(mlp, "c_fc", linear(C_CH, 4 * C_CH));
    add(mlp, "c_proj", linear(4 * C_CH, C_CH));
    add(m, "head", linear(T_TOK * C_CH, OUT));
    if (plan) {
        CA_CHECK(ca_tp_plan_fused(m, "attn.c_attn", "colwise", 3));
        CA_CHECK(ca_tp_plan(m, "attn.c_proj", "rowwise"));
        CA_CHECK(ca_tp_plan(m, "mlp.c_fc", "colwise"));
        CA_CHECK(ca_tp_plan(m, "mlp.c_proj", "rowwise"));
    }
    return m;
}

/* The whole value of parameter `name` into h (n floats): a colwise part is a block of rows, a rowwise
 * weight's a block of columns; gathered over tp on every rank (collective). */
static void whole_param(ca_accelerator *acc, ca_module *m, const char *name, float *h, int64_t n) {
    ca_tensor *p = ca_module_param(m, name);
    int64_t local = ca_tensor_numel(p);
    ca_comm *tp = ca_mesh_comm(acc, "tp");
    if (!tp) ca_clear_error();
    int parts = (int)(n / local);
    if (parts == 1) {
        CA_CHECK(ca_tensor_to_host(p, h, (size_t)n * sizeof(float)));
        return;
    }
    float *mine = malloc((size_t)local * sizeof(float)), *all = malloc((size_t)n * sizeof(float));
    CA_CHECK(ca_tensor_to_host(p, mine, (size_t)local * sizeof(float)));
    CA_CHECK(ca_comm_all_gather(tp, mine, all, (size_t)local, CA_F32, NULL));
    if (!strcmp(name, "fc2.weight")) {   /* [OUT, g_hid / parts] per rank: columns side by side */
        int64_t cols = g_hid / parts;
        for (int r = 0; r < parts; r++)
            for (int64_t o = 0; o < OUT; o++)
                memcpy(h + o * g_hid + r * cols, all + r * local + o * cols, (size_t)cols * sizeof(float));
    } else {
        memcpy(h, all, (size_t)n * sizeof(float));
    }
    free(mine);
    free(all);
}

static void dump(ca_accelerator *acc, ca_module *m, const char *path) {
    const struct { const char *name; int64_t n; } ps[] = {
        {"fc1.weight", g_hid * IN}, {"fc1.bias", g_hid}, {"fc2.weight", OUT * g_hid}, {"fc2.bias", OUT},
    };
    FILE *f = path && ca_is_main_process(acc) ? fopen(path, "wb") : NULL;
    CA_CHECK(ca_summon_full_params(acc, true));   /* stage 3 keeps shards between steps; tp: its slices whole */
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        float *h = malloc((size_t)ps[i].n * sizeof(float));
        whole_param(acc, m, ps[i].name, h, ps[i].n);
        if (f) fwrite(h, sizeof(float), (size_t)ps[i].n, f);
        free(h);
    }
    CA_CHECK(ca_summon_full_params(acc, false));
    if (f) fclose(f);
}

/* The loss averaged over the data-parallel ranks (each read its part of the global batch). */
static double dp_mean(ca_accelerator *acc, double v) {
    ca_comm *dp = ca_mesh_comm(acc, "dp");
    if (!dp) {
        ca_clear_error();
        dp = ca_accelerator_comm(acc);
    }
    float f = (float)v, out = 0;
    CA_SCOPE {   /* through device memory: the lazy device's collectives take nothing else */
        ca_tensor *t = ca_from_host(ca_accelerator_device(acc), CA_F32, 0, NULL, &f);
        CA_CHECK(t ? ca_comm_all_reduce(dp, ca_tensor_data(t), ca_tensor_data(t), 1, CA_F32, CA_OP_AVG, NULL)
                   : ca_last_status());
        CA_CHECK(ca_tensor_to_host(t, &out, sizeof out));
    }
    return out;
}

/* --metrics: what gather_for_metrics and the throughput line count under tensor parallelism, where
 * the ranks of a tp group hold the same batch: each sample once. */
static bool g_metrics;

static void metrics_step(ca_accelerator *acc, const ca_batch *b) {
    CA_SCOPE {
        ca_tensor *all = ca_gather_for_metrics(acc, b->y, b);
        if (!all) CA_CHECK(ca_last_status());
        printf("rank=%d gathered=%lld\n", ca_process_index(acc), (long long)ca_tensor_dim(all, 0));
    }
    CA_CHECK(ca_throughput_step(acc, ca_tensor_dim(b->y, 0), 0));
}

static void metrics_report(ca_accelerator *acc) {
    ca_throughput r;
    CA_CHECK(ca_throughput_report(acc, &r));
    /* this rank's samples/s and the world's: the test checks the world's against the ranks' sum */
    printf("rank=%d samples_per_s=%.9g world_samples_per_s=%.9g\n", ca_process_index(acc), r.samples_per_s,
           r.world_samples_per_s);
}

/* Wall time in ms (the save and load times printed for the benchmark). */
static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* --load-state, --save-state, --save-model */
static const char *g_load, *g_save_model;
static int g_stop_rank = -1;   /* --stop-rank R */

static int train(ca_accelerator *acc, ca_module *m, int steps, int64_t batch, const char *dump_path, bool clip,
                 const char *save) {
    ca_dataset *ds = synthetic(512);
    ca_dataloader *dl;
    CA_CHECK(ca_dataloader_create(ds, &(ca_loader_opts){.batch_size = batch, .shuffle = true, .seed = 5}, &dl));
    ca_optimizer *opt;
    CA_CHECK(ca_sgd_create(m, &(ca_sgd_opts){.lr = 0.2, .momentum = 0.9}, &opt));
    CA_CHECK(ca_prepare(acc, m, opt, dl));
    double t0 = now_ms();
    if (g_load) CA_CHECK(ca_load_state(acc, g_load));
    if (g_load) printf("rank=%d load_state_ms=%.1f\n", ca_process_index(acc), now_ms() - t0);
    int first = (int)ca_optimizer_steps(opt);
    ca_batch b;
    for (int step = first; step < first + steps && ca_dataloader_next(dl, &b); step++) {
        if (step == first + 1 && ca_process_index(acc) == g_stop_rank) {
            printf("rank=%d stops\n", g_stop_rank);
            fflush(stdout);
            raise(SIGSTOP);
        }
        ca_tensor *loss = ca_cross_entropy(ca_module_forward(m, b.x), b.y);
        double lv;
        CA_CHECK(ca_tensor_item(loss, &lv));
        CA_CHECK(ca_backward(acc, loss));
        if (clip) {   /* 0.1: below these gradients' norm, so every step scales them */
            double norm;
            CA_CHECK(ca_clip_grad_norm(acc, 0.1, &norm));
            printf("rank=%d step=%d norm=%.9f\n", ca_process_index(acc), step, norm);
        }
        CA_CHECK(ca_optimizer_step(opt));
        ca_optimizer_zero_grad(opt);
        double mean = dp_mean(acc, lv);
        if (ca_is_main_process(acc)) printf("step=%d loss=%.9f\n", step, mean);
        if (g_metrics) metrics_step(acc, &b);
    }
    if (g_metrics) metrics_report(acc);
    CA_CHECK(ca_dataloader_status(dl));
    t0 = now_ms();
    if (save && ca_save_state(acc, save) != CA_OK) {
        printf("rank=%d save_state: %s\n", ca_process_index(acc), ca_last_error());
        return 3;
    }
    if (save) printf("rank=%d save_state_ms=%.1f\n", ca_process_index(acc), now_ms() - t0);
    if (g_save_model) CA_CHECK(ca_save_model(acc, m, g_save_model, 0));
    if (dump_path) dump(acc, m, dump_path);
    printf("rank=%d params=%lld steps=%d\n", ca_process_index(acc), (long long)ca_module_param_count(m), steps);
    ca_dataloader_destroy(dl);
    ca_optimizer_destroy(opt);
    ca_dataset_destroy(ds);
    return 0;
}

/* sum(w * model(x)) without a tape: a finite-difference point (every rank runs it: the forward is collective). */
static double eval(ca_module *m, ca_tensor *x, const float *w) {
    double l = 0;
    CA_SCOPE {
        CA_NO_GRAD {
            ca_tensor *out = ca_module_forward(m, x);
            float h[2 * OUT];
            CA_CHECK(out ? ca_tensor_to_host(out, h, sizeof h) : ca_last_status());
            for (int i = 0; i < 2 * OUT; i++) l += (double)h[i] * w[i];
        }
    }
    return l;
}

/* Central difference of element i of t against its analytic gradient g[i]; the rank `who` perturbs (the
 * others run the same forwards with their values unchanged). */
static int fd_check(ca_module *m, ca_tensor *x, const float *w, ca_tensor *t, const float *g, int64_t i, bool me,
                    const char *what) {
    int64_t n = ca_tensor_numel(t);
    float *h = malloc((size_t)n * sizeof(float));
    CA_CHECK(ca_tensor_to_host(t, h, (size_t)n * sizeof(float)));
    const float eps = 1e-2f, v = h[i];
    if (me) h[i] = v + eps;
    CA_CHECK(ca_tensor_copy_from_host(t, h, (size_t)n * sizeof(float)));
    double lp = eval(m, x, w);
    if (me) h[i] = v - eps;
    CA_CHECK(ca_tensor_copy_from_host(t, h, (size_t)n * sizeof(float)));
    double lm = eval(m, x, w);
    h[i] = v;
    CA_CHECK(ca_tensor_copy_from_host(t, h, (size_t)n * sizeof(float)));
    free(h);
    double fd = (lp - lm) / (2 * eps);
    if (!me || fabs(fd - g[i]) <= 2e-3 + 2e-2 * fabs(fd)) return 0;
    printf("gradcheck FAIL %s[%lld]: backward %.6f, central difference %.6f\n", what, (long long)i, g[i], fd);
    return 1;
}

/* --lora: LoRA adapters (r 2, lora_B random so that lora_A has a gradient, no dropout) on fc1 and fc2, the
 * base frozen: at tp 2 fc1's lora_B is split by its rows and fc2's lora_A by its columns. */
static bool g_lora;

static void add_lora(ca_module *m) {
    static const char *const targets[] = {"fc1", "fc2"};
    ca_lora_config c;
    ca_lora_config_init(&c);
    c.r = 2;
    c.lora_alpha = 4;
    c.init_lora_weights = false;
    c.target_modules = targets;
    c.n_target_modules = 2;
    int n = 0;
    CA_CHECK(ca_lora_apply(m, &c, &n));
}

static int gradcheck(ca_accelerator *acc, ca_module *m) {
    CA_CHECK(ca_prepare(acc, m, NULL, NULL));
    ca_comm *tp = ca_mesh_comm(acc, "tp");
    int tpr = tp ? ca_comm_rank(tp) : 0, tpn = tp ? ca_comm_size(tp) : 1, bad = 0, checked = 0;
    if (!tp) ca_clear_error();
    float xs[2 * IN], w[2 * OUT];
    for (int i = 0; i < 2 * IN; i++) xs[i] = sinf(0.7f * (float)i + 0.3f);
    for (int i = 0; i < 2 * OUT; i++) w[i] = cosf(1.3f * (float)i);
    ca_tensor *x = ca_tensor_keep(ca_from_host(ca_accelerator_device(acc), CA_F32, 2, (int64_t[]){2, IN}, xs));
    ca_tensor_set_requires_grad(x, true);
    CA_SCOPE {
        ca_tensor *out = ca_module_forward(m, x);
        ca_tensor *wt = ca_from_host(ca_accelerator_device(acc), CA_F32, 2, (int64_t[]){2, OUT}, w);
        CA_CHECK(out && wt ? ca_autograd_backward_with(out, wt) : ca_last_status());
    }
    /* the adapters' whole tensors (fc1's lora_A, fc2's lora_B) are perturbed on every rank at once, as the input */
    static const char *const base[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    static const char *const lora[] = {"fc1.lora_A.weight", "fc1.lora_B.weight", "fc2.lora_A.weight", "fc2.lora_B.weight"};
    static const bool lora_whole[] = {true, false, false, true};
    const char *const *names = g_lora ? lora : base;
    for (int k = -1; k < 4; k++) {   /* -1: the input, the same on every rank */
        ca_tensor *t = k < 0 ? x : ca_module_param(m, names[k]);
        bool whole = k < 0 || (g_lora && lora_whole[k]);
        int64_t n = ca_tensor_numel(t);
        float *g = malloc((size_t)n * sizeof(float));
        CA_CHECK(ca_tensor_to_host(ca_tensor_grad(t), g, (size_t)n * sizeof(float)));
        for (int r = 0; r < (whole ? 1 : tpn); r++)   /* one rank at a time perturbs its own shard */
            for (int64_t i = 0; i < n; i += n > 6 ? n / 6 : 1) {
                bad += fd_check(m, x, w, t, g, i, whole || r == tpr, k < 0 ? "input" : names[k]);
                checked++;
            }
        free(g);
    }
    ca_tensor_free(x);
    printf("rank=%d gradcheck %s %d\n", ca_process_index(acc), bad ? "FAILED" : "ok", checked);
    return bad ? 1 : 0;
}

/* --mode vocab: Embedding(8, 4) "wte" split rowwise (its vocabulary rows) and two output layers whose logits
 * add up: the tied one (ca_embedding_attend) and Linear(4, 8) "lm_head" split colwise; the loss is
 * ca_tp_cross_entropy over 2 x 3 tokens whose ids and labels lie on both tp ranks' halves, one label -100. */
#define V_VOCAB 8
#define V_DIM 4
static ca_module *vocab_model(const char *bad) {
    ca_module *m, *l;
    CA_CHECK(ca_module_create("VocabModel", NULL, NULL, NULL, &m));
    if (bad && !strcmp(bad, "pad")) CA_CHECK(ca_embedding_create_ex(V_VOCAB, V_DIM, 0, &l));
    else CA_CHECK(ca_embedding_create(V_VOCAB, V_DIM, &l));
    CA_CHECK(ca_module_add(m, "wte", l));
    CA_CHECK(ca_linear_create(V_DIM, V_VOCAB, false, &l)); CA_CHECK(ca_module_add(m, "lm_head", l));
    CA_CHECK(ca_tp_plan(m, "wte", bad && !strcmp(bad, "colwise") ? "colwise" : "rowwise"));
    CA_CHECK(ca_tp_plan(m, "lm_head", "colwise"));
    return m;
}

static ca_tensor *vocab_loss(ca_accelerator *acc, ca_module *m, int64_t *cols) {
    static const int64_t ids[6] = {1, 7, 4, 6, 0, 3}, labels[6] = {7, 2, -100, 3, 5, 0};
    ca_device *dev = ca_accelerator_device(acc);
    ca_module *wte = ca_module_child(m, "wte"), *head = ca_module_child(m, "lm_head");
    ca_tensor *x = ca_tanh(ca_module_forward(wte, ca_from_host(dev, CA_I64, CA_SHAPE(2, 3), ids)));
    ca_tensor *logits = ca_add(ca_embedding_attend(wte, x), ca_module_forward(head, x));
    if (cols && logits) *cols = ca_tensor_dim(logits, 2);
    return ca_tp_cross_entropy(head, logits, ca_from_host(dev, CA_I64, CA_SHAPE(2, 3), labels));
}

static int64_t cols_of(ca_module *head) { return ca_tensor_dim(ca_module_param(head, "weight"), 0); }

static double vocab_eval(ca_accelerator *acc, ca_module *m) {
    double l = 0;
    CA_NO_GRAD CA_SCOPE {
        ca_tensor *loss = vocab_loss(acc, m, NULL);
        if (!loss) CA_CHECK(ca_last_status());
        l = ca_item(loss);
    }
    return l;
}

/* Central differences of every element of the shards, one rank perturbing its own at a time. */
static int vocab_gradcheck(ca_accelerator *acc, ca_module *m, int tpr, int tpn, int *checked) {
    static const char *const names[] = {"wte.weight", "lm_head.weight"};
    int bad = 0;
    for (int k = 0; k < 2; k++) {
        ca_tensor *t = ca_module_param(m, names[k]);
        int64_t n = ca_tensor_numel(t);
        float *h = malloc((size_t)n * sizeof(float)), *g = malloc((size_t)n * sizeof(float));
        CA_CHECK(ca_tensor_to_host(t, h, (size_t)n * sizeof(float)));
        CA_CHECK(ca_tensor_to_host(ca_tensor_grad(t), g, (size_t)n * sizeof(float)));
        for (int r = 0; r < tpn; r++)
            for (int64_t i = 0; i < n; i++) {
                const float eps = 1e-2f, v = h[i];
                double l[2];
                for (int side = 0; side < 2; side++) {
                    if (r == tpr) h[i] = v + (side ? -eps : eps);
                    CA_CHECK(ca_tensor_copy_from_host(t, h, (size_t)n * sizeof(float)));
                    l[side] = vocab_eval(acc, m);
                    h[i] = v;
                }
                CA_CHECK(ca_tensor_copy_from_host(t, h, (size_t)n * sizeof(float)));
                double fd = (l[0] - l[1]) / (2 * eps);
                if (r != tpr) continue;
                (*checked)++;
                if (fabs(fd - g[i]) <= 1e-3 + 1e-2 * fabs(fd)) continue;
                printf("vocab gradcheck FAIL %s[%lld]: backward %.6f, central difference %.6f\n", names[k], (long long)i,
                       g[i], fd);
                bad++;
            }
        free(h);
        free(g);
    }
    return bad;
}

static int vocab_check(ca_accelerator *acc, ca_module *m) {
    CA_CHECK(ca_prepare(acc, m, NULL, NULL));
    ca_comm *tp = ca_mesh_comm(acc, "tp");
    int tpr = tp ? ca_comm_rank(tp) : 0, tpn = tp ? ca_comm_size(tp) : 1, checked = 0;
    if (!tp) ca_clear_error();
    int64_t cols = 0;
    double loss = 0;
    CA_SCOPE {
        ca_tensor *l = vocab_loss(acc, m, &cols);
        CA_CHECK(l ? ca_autograd_backward(l) : ca_last_status());
        loss = ca_item(l);
    }
    printf("rank=%d vocab loss=%.7f logits=2x3x%lld\n", ca_process_index(acc), loss, (long long)cols);
    int bad = vocab_gradcheck(acc, m, tpr, tpn, &checked);
    if (tpn > 1) CA_SCOPE {   /* misuse: the whole vocabulary's logits for a split head, a label outside it */
        ca_device *dev = ca_accelerator_device(acc);
        ca_module *head = ca_module_child(m, "lm_head");
        ca_tensor *y = ca_from_host(dev, CA_I64, CA_SHAPE(2, 3), (int64_t[]){0, 1, V_VOCAB + 1, 2, 3, 4});
        ca_tensor *logits[2] = {ca_zeros(dev, CA_F32, CA_SHAPE(2, 3, V_VOCAB)),
                                ca_zeros(dev, CA_F32, CA_SHAPE(2, 3, cols_of(head)))};
        for (int i = 0; i < 2; i++) {
            ca_tensor *l = ca_tp_cross_entropy(head, logits[i], y);
            double v;   /* a lazy device finds the label outside the vocabulary when its graph runs */
            if (!l || ca_tensor_item(l, &v) != CA_OK) printf("rank=%d refused: %s\n", ca_process_index(acc), ca_last_error());
            ca_clear_error();
        }
    }
    printf("rank=%d vocab gradcheck %s %d\n", ca_process_index(acc), bad ? "FAILED" : "ok", checked);
    return bad ? 1 : 0;
}

static void mesh_info(ca_accelerator *acc) {
    ca_mesh_shape sh;
    int c[CA_MESH_NDIMS];
    CA_CHECK(ca_accelerator_mesh(acc, &sh, c));
    printf("rank=%d coords dp_replicate=%d dp_shard=%d cp=%d tp=%d", ca_process_index(acc), c[0], c[1], c[2], c[3]);
    for (int d = 0; d <= CA_MESH_NDIMS; d++) {
        ca_comm *g = ca_mesh_comm(acc, ca_mesh_dim_name(d));
        printf(" %s=%d/%d", ca_mesh_dim_name(d), g ? ca_comm_rank(g) : -1, g ? ca_comm_size(g) : -1);
    }
    ca_comm *dcp = sh.size[CA_MESH_CP] > 1 ? ca_mesh_comm(acc, "dp_cp") : NULL;   /* context parallelism's */
    if (dcp) printf(" dp_cp=%d/%d", ca_comm_rank(dcp), ca_comm_size(dcp));
    printf("\n");
}

/* --late-tp: the tp groups without rank 0 run one more collective a while after rank 0 has finished.
 * Under mpirun rank 0 serves the store their records live in; it must not end it under them. The
 * delay provokes that order; nothing waits on it. */
static void late_tp_collective(ca_accelerator *acc) {
    ca_comm *tp = ca_mesh_comm(acc, "tp");
    if (!tp) return ca_clear_error();
    if (ca_process_index(acc) < ca_comm_size(tp)) return;
    /* the first of the pair waits inside the collective, where its watchdog reads the store */
    usleep(ca_process_index(acc) % 2 ? 2000 * 1000 : 1000 * 1000);
    float one = 1, sum = 0;
    CA_CHECK(ca_comm_all_reduce(tp, &one, &sum, 1, CA_F32, CA_OP_SUM, NULL));
    printf("late tp collective done: %g\n", (double)sum);
}

int main(int argc, char **argv) {
    const char *mode = "train", *dump_path = NULL, *save = NULL, *vocab_bad = NULL;
    int steps = 4;
    int64_t batch = 16;
    bool plan = false, clip = false, bad_plan = false, block = false, late = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mode") && i + 1 < argc) mode = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) dump_path = argv[++i];
        else if (!strcmp(argv[i], "--save-state") && i + 1 < argc) save = argv[++i];
        else if (!strcmp(argv[i], "--hidden") && i + 1 < argc) g_hid = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--load-state") && i + 1 < argc) g_load = argv[++i];
        else if (!strcmp(argv[i], "--save-model") && i + 1 < argc) g_save_model = argv[++i];
        else if (!strcmp(argv[i], "--plan")) plan = true;
        else if (!strcmp(argv[i], "--clip")) clip = true;
        else if (!strcmp(argv[i], "--bad-plan")) bad_plan = true;
        else if (!strcmp(argv[i], "--vocab-bad") && i + 1 < argc) vocab_bad = argv[++i];
        else if (!strcmp(argv[i], "--block")) block = true;
        else if (!strcmp(argv[i], "--late-tp")) late = true;
        else if (!strcmp(argv[i], "--metrics")) g_metrics = true;
        else if (!strcmp(argv[i], "--lora")) g_lora = true;
        else if (!strcmp(argv[i], "--stop-rank") && i + 1 < argc) g_stop_rank = atoi(argv[++i]);
    }
    ca_accelerator *acc;
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = argc, .argv = argv}, &acc));
    CA_CHECK(ca_set_seed(acc, 11));
    ca_module *m = !strcmp(mode, "vocab") ? vocab_model(vocab_bad) : block ? block_model(plan) : model(plan, bad_plan);
    if (g_lora) add_lora(m);
    int rc = 0;
    if (!strcmp(mode, "mesh")) mesh_info(acc);
    else if (!strcmp(mode, "gradcheck")) rc = gradcheck(acc, m);
    else if (!strcmp(mode, "vocab")) rc = vocab_check(acc, m);
    else rc = train(acc, m, steps, batch, dump_path, clip, save);
    if (late) late_tp_collective(acc);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
    ca_shutdown();
    return rc;
}
