/* Transformer training benchmarks: a BERT fine-tune step at all-MiniLM-L6-v2's shape (random
 * initialisation) with the same step's GEMMs on raw cblas_sgemm in the same run, and the fused
 * attention against a naive matmul-softmax-matmul built from ops (time and peak memory).
 * One line of key=value results per configuration, for bench/run_transformer.sh.
 * usage: bench_transformer bert [--batch-sizes 8,16] [--seq 128] [--steps N]
 *        bench_transformer bert-memory [--batch-sizes 16] [--seq 64] [--min-seq 8] [--steps 64]
 *        bench_transformer attention [--seqs 512,1024] [--heads 12] [--head-dim 32] [--reps N] */
#include <caccel/caccel.h>

#include "bench/bench_util.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <sys/resource.h>

/* MiniLM-L6-v2: 6 layers, 384 channels, 12 heads, FFN 1536, GELU (erf), dropout 0.1. */
static ca_bert_config minilm(void) {
    ca_bert_config c = {.vocab_size = 30522, .hidden_size = 384, .num_hidden_layers = 6,
                        .num_attention_heads = 12, .intermediate_size = 1536, .hidden_dropout_prob = 0.1,
                        .attention_probs_dropout_prob = 0.1, .max_position_embeddings = 512,
                        .type_vocab_size = 2, .layer_norm_eps = 1e-12, .pad_token_id = 0, .num_labels = 2};
    strcpy(c.hidden_act, "gelu");
    return c;
}

/* y[M,N] = x[M,K] W[N,K]^T, then dX = dY W and dW = dY^T X: a Linear's three GEMMs. */
static void linear_gemms(int M, int N, int K, float *x, float *w, float *y) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, x, K, w, K, 0, y, N);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1, y, N, w, K, 0, x, K);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1, y, N, x, K, 0, w, K);
}

/* The step's Linear GEMMs (forward + backward) on raw cblas_sgemm: per layer Q, K, V, attention
 * output [BL,384]x[384,384], FFN up [BL,384]->1536 and down 1536->384; the pooler and classifier. */
static double bert_linear_gemm_seconds(const ca_bert_config *c, int B, int L, int reps, double *cpu) {
    int M = B * L, h = (int)c->hidden_size, f = (int)c->intermediate_size;
    float *x = calloc((size_t)M * f, sizeof(float)), *y = calloc((size_t)M * f, sizeof(float));
    float *w = calloc((size_t)h * f, sizeof(float));
    double total = 0;
    *cpu = 0;
    for (int r = -2; r < reps; r++) {
        double t0 = now_s(), c0 = cpu_s();
        for (int l = 0; l < c->num_hidden_layers; l++) {
            for (int i = 0; i < 4; i++) linear_gemms(M, h, h, x, w, y);
            linear_gemms(M, f, h, x, w, y);
            linear_gemms(M, h, f, x, w, y);
        }
        linear_gemms(B, h, h, x, w, y);
        linear_gemms(B, (int)c->num_labels, h, x, w, y);
        if (r >= 0) total += now_s() - t0, *cpu += cpu_s() - c0;
    }
    free(x); free(y); free(w);
    *cpu /= reps;
    return total / reps;
}

/* The attention core's GEMMs per head on raw cblas_sgemm: forward S = Q K^T, O = P V; backward
 * dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q (6 GEMMs of [L,L,D] per head and layer). */
static double bert_attention_gemm_seconds(const ca_bert_config *c, int B, int L, int reps, double *cpu) {
    int D = (int)(c->hidden_size / c->num_attention_heads);
    float *q = calloc((size_t)L * D, sizeof(float)), *k = calloc((size_t)L * D, sizeof(float));
    float *s = calloc((size_t)L * L, sizeof(float));
    double total = 0;
    int heads = B * (int)c->num_attention_heads * (int)c->num_hidden_layers;
    *cpu = 0;
    for (int r = -2; r < reps; r++) {
        double t0 = now_s(), c0 = cpu_s();
        for (int i = 0; i < heads; i++) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, L, D, 1, q, D, k, D, 0, s, L);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, D, L, 1, s, L, k, D, 0, q, D);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, L, L, D, 1, q, D, k, D, 0, s, L);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, L, D, L, 1, s, L, q, D, 0, k, D);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, L, D, L, 1, s, L, k, D, 0, q, D);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, L, D, L, 1, s, L, q, D, 0, k, D);
        }
        if (r >= 0) total += now_s() - t0, *cpu += cpu_s() - c0;
    }
    free(q); free(k); free(s);
    *cpu /= reps;
    return total / reps;
}

/* The fused attention alone at the step's shape (forward + backward, all layers), dropout as in
 * training: the "attention" share of the step. */
static double bert_attention_op_seconds(ca_device *dev, const ca_bert_config *c, int B, int L, int reps,
                                        double *cpu) {
    int64_t H = c->num_attention_heads, D = c->hidden_size / H;
    double total = 0;
    *cpu = 0;
    for (int r = -2; r < reps; r++) {
        CA_SCOPE {
            ca_tensor *t[3];
            for (int i = 0; i < 3; i++) {
                t[i] = ca_rand_normal(dev, CA_F32, CA_SHAPE(B, H, L, D), 0, 1);
                ca_tensor_set_requires_grad(t[i], true);
            }
            double t0 = now_s(), c0 = cpu_s();
            for (int l = 0; l < c->num_hidden_layers; l++) {
                ca_tensor *o = ca_scaled_dot_product_attention(t[0], t[1], t[2], NULL, false,
                                                               c->attention_probs_dropout_prob, 0);
                CA_CHECK(ca_autograd_backward(ca_sum(o)));
            }
            if (r >= 0) total += now_s() - t0, *cpu += cpu_s() - c0;
        }
    }
    *cpu /= reps;
    return total / reps;
}

static void bench_bert(ca_accelerator *acc, const int *batches, int nb, int L, int steps) {
    ca_device *dev = ca_accelerator_device(acc);
    ca_bert_config c = minilm();
    for (int bi = 0; bi < nb; bi++) {
        int B = batches[bi];
        CA_CHECK(ca_set_seed(acc, 42));
        ca_module *m;
        CA_CHECK(ca_bert_for_sequence_classification_create(&c, 2, &m));
        ca_module_train(m, true);
        ca_optimizer *opt;
        CA_CHECK(ca_adamw_create(m, &(ca_adamw_opts){.lr = 2e-5}, &opt));
        CA_CHECK(ca_prepare(acc, m, opt, NULL));
        int64_t *ids = malloc(sizeof(int64_t) * (size_t)B * L), *lab = malloc(sizeof(int64_t) * (size_t)B);
        for (int i = 0; i < B * L; i++) ids[i] = 1000 + (i * 7919) % 20000;
        for (int i = 0; i < B; i++) lab[i] = i % 2;
        ca_tensor *x = ca_tensor_keep(ca_from_host(dev, CA_I64, CA_SHAPE(B, L), ids));
        ca_tensor *y = ca_tensor_keep(ca_from_host(dev, CA_I64, CA_SHAPE(B), lab));
        ca_allocator_stats m0, m1;
        double secs = 0, cpu = 0;
        double w0 = 0;
        for (int s = -2; s < steps; s++) {   /* two warm-up steps */
            if (s == 0) {
                CA_CHECK(ca_device_reset_peak_stats(dev));
                CA_CHECK(ca_device_memory_stats(dev, &m0));
                w0 = now_s();
            }
            double t0 = now_s(), c0 = cpu_s();
            CA_SCOPE {
                ca_tensor *loss = ca_cross_entropy(ca_module_forward(m, x), y);
                CA_CHECK(ca_backward(acc, loss));
                CA_CHECK(ca_optimizer_step(opt));
                ca_optimizer_zero_grad(opt);
            }
            if (s >= 0) secs += now_s() - t0, cpu += cpu_s() - c0;
        }
        bench_window("bert", B, w0, now_s());
        CA_CHECK(ca_device_memory_stats(dev, &m1));
        double step_s = secs / steps, step_c = cpu / steps, lin_c, att_gemm_c, att_c;
        double lin_s = bert_linear_gemm_seconds(&c, B, L, 3, &lin_c);
        double att_gemm_s = bert_attention_gemm_seconds(&c, B, L, 3, &att_gemm_c);
        double att_s = bert_attention_op_seconds(dev, &c, B, L, 3, &att_c);
        double other_s = step_s - lin_s - att_s;
        printf("impl=caccel model=bert batch=%d seq=%d threads=%d samples_per_s=%.2f step_ms=%.1f "
               "linear_gemm_ms=%.1f attn_gemm_ms=%.1f gemm_bound_ms=%.1f step_over_gemm=%.3f "
               "attention_ms=%.1f other_ms=%.1f outside_gemm_pct=%.1f step_mem_mib=%.1f\n",
               B, L, openblas_get_num_threads(), B / step_s, step_s * 1e3, lin_s * 1e3, att_gemm_s * 1e3,
               (lin_s + att_gemm_s) * 1e3, step_s / (lin_s + att_gemm_s), att_s * 1e3, other_s * 1e3,
               100.0 * (1 - (lin_s + att_gemm_s) / step_s), (double)(m1.peak_allocated - m0.allocated) / (1 << 20));
        /* The same split in CPU time (all threads): robust to load for 1 thread. */
        printf("impl=caccel model=bert-cpu batch=%d seq=%d threads=%d step_cpu_ms=%.1f linear_gemm_cpu_ms=%.1f "
               "attn_gemm_cpu_ms=%.1f gemm_bound_cpu_ms=%.1f step_over_gemm_cpu=%.3f attention_cpu_ms=%.1f "
               "other_cpu_ms=%.1f\n", B, L, openblas_get_num_threads(), step_c * 1e3, lin_c * 1e3, att_gemm_c * 1e3,
               (lin_c + att_gemm_c) * 1e3, step_c / (lin_c + att_gemm_c), att_c * 1e3,
               (step_c - lin_c - att_c) * 1e3);
        fflush(stdout);
        ca_tensor_free(x); ca_tensor_free(y);
        free(ids); free(lab);
        ca_optimizer_destroy(opt);
        ca_module_destroy(m);
    }
}

/* Records into *peak (if larger) the allocator's peak since the last mark, above base, and into
 * top the peak itself; resets the peak. Returns the bytes allocated now. */
static size_t top;   /* the largest peak_allocated seen by phase_mark */
static size_t phase_mark(ca_device *dev, size_t *peak, size_t base) {
    ca_allocator_stats st;
    CA_CHECK(ca_device_memory_stats(dev, &st));
    if (peak && st.peak_allocated - base > *peak) *peak = st.peak_allocated - base;
    if (st.peak_allocated > top) top = st.peak_allocated;
    CA_CHECK(ca_device_reset_peak_stats(dev));
    return st.allocated;
}

/* Where a fine-tune's memory goes: steps at batch B whose sequence length varies per batch as
 * examples/bert_classifier's trim to the batch's longest sample does (lengths drawn in
 * [min_len, L]), or stays L (min_len = L); allocator statistics and the process's peak RSS. */
static void bench_bert_memory(ca_accelerator *acc, int B, int min_len, int L, int steps) {
    ca_device *dev = ca_accelerator_device(acc);
    ca_bert_config c = minilm();
    CA_CHECK(ca_set_seed(acc, 42));
    ca_module *m;
    CA_CHECK(ca_bert_for_sequence_classification_create(&c, 2, &m));
    ca_module_train(m, true);
    ca_optimizer *opt;
    CA_CHECK(ca_adamw_create(m, &(ca_adamw_opts){.lr = 2e-5}, &opt));
    CA_CHECK(ca_prepare(acc, m, opt, NULL));
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)B * L), lab[64];
    for (int i = 0; i < B * L; i++) ids[i] = 1000 + (i * 7919) % 20000;
    for (int i = 0; i < B && i < 64; i++) lab[i] = i % 2;
    uint64_t rng = 12345;
    size_t peak[3] = {0, 0, 0};   /* the largest peak above the step's start from step 3 (the optimizer's
                                     state exists): forward, backward, optimizer */
    for (int s = 1; s <= steps; s++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int len = min_len + (int)((rng >> 33) % (uint64_t)(L - min_len + 1));
        size_t base = phase_mark(dev, NULL, 0);
        CA_SCOPE {
            ca_tensor *x = ca_from_host(dev, CA_I64, CA_SHAPE(B, len), ids);
            ca_tensor *y = ca_from_host(dev, CA_I64, CA_SHAPE(B), lab);
            ca_tensor *loss = ca_cross_entropy(ca_module_forward(m, x), y);
            phase_mark(dev, s > 2 ? &peak[0] : NULL, base);
            CA_CHECK(ca_backward(acc, loss));
            phase_mark(dev, s > 2 ? &peak[1] : NULL, base);
            CA_CHECK(ca_optimizer_step(opt));
            ca_optimizer_zero_grad(opt);
            phase_mark(dev, s > 2 ? &peak[2] : NULL, base);
        }
        if (s == 1 || s == steps || (s & (s - 1)) == 0) {
            ca_allocator_stats st;
            CA_CHECK(ca_device_memory_stats(dev, &st));
            struct rusage ru;
            getrusage(RUSAGE_SELF, &ru);
            printf("impl=caccel model=bert-memory batch=%d len=%d..%d step=%d allocated_mib=%.0f "
                   "peak_allocated_mib=%.0f reserved_mib=%.0f peak_reserved_mib=%.0f peak_rss_mib=%.0f "
                   "above_start_mib_fwd=%.0f bwd=%.0f opt=%.0f\n",
                   B, min_len, L, s, st.allocated / 1048576.0, top / 1048576.0,
                   st.reserved / 1048576.0, st.peak_reserved / 1048576.0, ru.ru_maxrss / 1024.0,
                   peak[0] / 1048576.0, peak[1] / 1048576.0, peak[2] / 1048576.0);
            fflush(stdout);
        }
    }
    free(ids);
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
}

/* softmax(q k^T * scale) v from ops: the [T, T] scores and probabilities are materialised. */
static ca_tensor *naive_attention(ca_tensor *q, ca_tensor *k, ca_tensor *v, double scale) {
    return ca_matmul(ca_softmax(ca_mul_scalar(ca_matmul(q, ca_transpose(k, 2, 3)), scale)), v);
}

static void bench_attention(ca_device *dev, const int *seqs, int ns, int64_t H, int64_t D, int reps) {
    for (int si = 0; si < ns; si++) {
        int64_t T = seqs[si];
        for (int fused = 1; fused >= 0; fused--) {
            double total = 0;
            ca_allocator_stats m0, m1;
            CA_CHECK(ca_device_empty_cache(dev));
            CA_CHECK(ca_device_reset_peak_stats(dev));
            CA_CHECK(ca_device_memory_stats(dev, &m0));
            for (int r = -1; r < reps; r++) {
                CA_SCOPE {
                    ca_tensor *t[3];
                    for (int i = 0; i < 3; i++) {
                        t[i] = ca_rand_normal(dev, CA_F32, CA_SHAPE(1, H, T, D), 0, 1);
                        ca_tensor_set_requires_grad(t[i], true);
                    }
                    double t0 = now_s();
                    ca_tensor *o = fused ? ca_scaled_dot_product_attention(t[0], t[1], t[2], NULL, false, 0, 0)
                                         : naive_attention(t[0], t[1], t[2], 1.0 / sqrt((double)D));
                    CA_CHECK(ca_autograd_backward(ca_sum(o)));
                    if (r >= 0) total += now_s() - t0;
                }
            }
            CA_CHECK(ca_device_memory_stats(dev, &m1));
            printf("impl=caccel model=attention kind=%s batch=1 heads=%lld head_dim=%lld seq=%lld threads=%d "
                   "fwd_bwd_ms=%.2f peak_mib=%.2f\n", fused ? "fused" : "naive", (long long)H, (long long)D,
                   (long long)T, openblas_get_num_threads(), total / reps * 1e3,
                   (double)(m1.peak_allocated - m0.allocated) / (1 << 20));
            fflush(stdout);
        }
    }
}

static int parse_list(char *s, int *out, int max) {
    int n = 0;
    for (char *p = strtok(s, ","); p && n < max; p = strtok(NULL, ",")) out[n++] = atoi(p);
    return n;
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "bert") && strcmp(argv[1], "bert-memory") && strcmp(argv[1], "attention"))) {
        fprintf(stderr, "usage: bench_transformer bert|bert-memory|attention [options] (see the source's header)\n");
        return 2;
    }
    int batches[8] = {8, 16}, nb = 2, seqs[8] = {512, 1024}, ns = 2, L = 128, steps = 5, reps = 3, min_len = 0;
    int64_t H = 12, D = 32;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch-sizes")) nb = parse_list(argv[i + 1], batches, 8);
        else if (!strcmp(argv[i], "--seqs")) ns = parse_list(argv[i + 1], seqs, 8);
        else if (!strcmp(argv[i], "--seq")) L = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--min-seq")) min_len = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) H = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--head-dim")) D = atoll(argv[i + 1]);
        else { fprintf(stderr, "bench_transformer: unknown option %s\n", argv[i]); return 2; }
    }
    ca_accelerator *acc;
    char *cpu_argv[] = {"bench_transformer", "--cpu", NULL};
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = cpu_argv}, &acc));
    if (!strcmp(argv[1], "bert")) bench_bert(acc, batches, nb, L, steps);
    else if (!strcmp(argv[1], "bert-memory"))
        bench_bert_memory(acc, batches[0], min_len > 0 && min_len <= L ? min_len : L, L, steps);
    else bench_attention(ca_accelerator_device(acc), seqs, ns, H, D, reps);
    ca_accelerator_destroy(acc);
    ca_shutdown();
    return 0;
}
