/* MLP training throughput (784-256-128-10, AdamW) through caccel, with the step time compared to the
 * summed time of the same step's eight GEMMs called on raw cblas_sgemm in the same run (the GEMM-only
 * bound: pct_of_bound = 100 * bound / step), and, where caccel's f32 GEMMs run on oneDNN, on raw
 * dnnl_sgemm too (pct_of_lib_bound: the share of the step the library's GEMMs take). The step is split into forward, backward and optimizer
 * (timed around each call) and "other_us" = step - bound - optimizer, the cost outside GEMM and the
 * optimizer (elementwise and loss kernels, dispatch, autograd, allocator, scopes, batch hand-off).
 * One line of key=value results per batch size, for bench/run_mlp.sh. --local-sgd-steps N trains under
 * LocalSGD (parameters averaged every N steps; bench/run_netem.sh). */
#include <caccel/caccel.h>

#include "bench/bench_util.h"

#include <cblas.h>
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>

/* One raw row-major sgemm: OpenBLAS's, or oneDNN's (the f32 path caccel takes where oneDNN is faster). */
typedef void (*sgemm_fn)(bool ta, bool tb, int m, int n, int k, const float *a, int lda, const float *b, int ldb,
                         float beta, float *c, int ldc);
typedef int (*dnnl_sgemm_fn)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                             int64_t, float, float *, int64_t);
static dnnl_sgemm_fn dnnl_sgemm;

static void blas_sgemm(bool ta, bool tb, int m, int n, int k, const float *a, int lda, const float *b, int ldb,
                       float beta, float *c, int ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1, a, lda, b,
                ldb, beta, c, ldc);
}

/* caccel's rule (backends/cpu/cpu_onednn.c): oneDNN from 2^19 multiply-adds, OpenBLAS below */
static void onednn_sgemm(bool ta, bool tb, int m, int n, int k, const float *a, int lda, const float *b, int ldb,
                         float beta, float *c, int ldc) {
    if ((int64_t)m * n * k < (1 << 19)) blas_sgemm(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
    else dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1, a, lda, b, ldb, beta, c, ldc);
}

/* The eight GEMMs of one step at batch B, on a raw sgemm with the layouts caccel uses. */
static double gemm_step_seconds(int B, int reps, sgemm_fn gemm) {
    static const int L[4] = {784, 256, 128, 10};
    size_t big = (size_t)B * 784 + 784 * 256 * 2 + (size_t)B * 256 * 4;
    float *buf = calloc(big * 3, sizeof(float));
    float *x = buf, *w = buf + big, *g = buf + 2 * big;
    for (size_t i = 0; i < big * 3; i++) buf[i] = (float)(i % 13) * 0.01f;
    double total = 0;
    for (int r = -20; r < reps; r++) {          /* 20 warm-up repetitions, then the mean */
        double t0 = now_s();
        for (int l = 0; l < 3; l++)   /* forward: y = x W^T + b (C pre-filled with the bias) */
            gemm(false, true, B, L[l + 1], L[l], x, L[l], w, L[l], 1, g, L[l + 1]);
        for (int l = 2; l >= 0; l--) {   /* backward: dW = g^T h, and dh = g W except for the input */
            gemm(true, false, L[l + 1], L[l], B, g, L[l + 1], x, L[l], 0, w, L[l]);
            if (l > 0)
                gemm(false, false, B, L[l], L[l + 1], g, L[l + 1], w, L[l], 0, x, L[l]);
        }
        if (r >= 0) total += now_s() - t0;
    }
    free(buf);
    return total / reps;
}

/* How the CPU backend runs bf16 GEMMs, from the device's description ("bf16 GEMM through oneDNN (ISA
 * avx512_core_bf16: ...)" or "bf16 GEMM converts to f32 (...)"), as one word: onednn-<isa> or convert. */
static void bf16_gemm_path(ca_device *dev, char *out, size_t len) {
    const char *d = strstr(ca_device_description(dev), "bf16 GEMM ");
    const char *isa = d ? strstr(d, "ISA ") : NULL;
    if (!d) snprintf(out, len, "none");
    else if (!strstr(d, "through oneDNN")) snprintf(out, len, "convert");
    else if (!isa) snprintf(out, len, "onednn");
    else snprintf(out, len, "onednn-%.*s", (int)strcspn(isa + 4, ":) ;"), isa + 4);
}

/* Which library runs caccel's f32 GEMMs (from the device's description: oneDNN takes them with one BLAS
 * thread), and oneDNN's sgemm for the second bound when it is oneDNN (the same library caccel loaded). */
static const char *f32_gemm_path(ca_device *dev) {
    const char *d = ca_device_description(dev);
    if (!strstr(d, "f32 GEMM through oneDNN")) return "openblas";
    if (openblas_get_num_threads() != 1 && !strstr(d, "CACCEL_CPU_GEMM=onednn")) return "openblas";
    if (!dnnl_sgemm) {
        void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!h) h = dlopen("libdnnl.so.3", RTLD_NOW | RTLD_LOCAL);
        if (h) dnnl_sgemm = (dnnl_sgemm_fn)(uintptr_t)dlsym(h, "dnnl_sgemm");
    }
    return dnnl_sgemm ? "onednn" : "openblas";
}

/* "on" unless CACCEL_CPU_FLUSH_DENORMAL turns subnormal flushing off. */
static const char *flush_setting(void) {
    const char *v = getenv("CACCEL_CPU_FLUSH_DENORMAL");
    if (!v || !*v) return "on";
    return (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "off") || !strcasecmp(v, "no")) ? "off" : "on";
}

int main(int argc, char **argv) {
    int batches[8] = {16, 32, 128, 512}, nb = 4, epochs = 1, local_sgd = 0;
    char *precision = "no";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch-sizes") && i + 1 < argc) {
            nb = 0;
            for (char *s = strtok(argv[++i], ","); s && nb < 8; s = strtok(NULL, ",")) batches[nb++] = atoi(s);
        } else if (!strcmp(argv[i], "--epochs") && i + 1 < argc) {
            epochs = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--precision") && i + 1 < argc) {
            precision = argv[++i];
        } else if (!strcmp(argv[i], "--local-sgd-steps") && i + 1 < argc) {   /* LocalSGD every N steps */
            local_sgd = atoi(argv[++i]);
        }
    }
    ca_accelerator *acc;
    char *cpu_argv[] = {"bench_mlp", "--cpu", "--mixed_precision", precision, NULL};
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = 4, .argv = cpu_argv}, &acc));
    ca_device *dev = ca_accelerator_device(acc);
    ca_tensor *xtr, *ytr, *xte, *yte;
    load(dev, true, &xtr, &ytr);
    load(dev, false, &xte, &yte);
    int64_t n = ca_tensor_dim(xtr, 0);
    /* data parallel: global batch i is rows [i*B*W, (i+1)*B*W); rank r takes its r-th slice of B */
    int64_t W = ca_num_processes(acc), R = ca_process_index(acc);
    for (int bi = 0; bi < nb; bi++) {
        int B = batches[bi];
        CA_CHECK(ca_set_seed(acc, 42));
        ca_module *m = mlp();
        ca_optimizer *opt;
        CA_CHECK(ca_adamw_create(m, NULL, &opt));
        CA_CHECK(ca_prepare(acc, m, opt, NULL));
        int64_t steps = 0, seen = 0;
        double t_fwd = 0, t_bwd = 0, t_opt = 0;
        ca_allocator_stats m0, m1;
        CA_CHECK(ca_device_reset_peak_stats(dev));
        CA_CHECK(ca_device_memory_stats(dev, &m0));
        ca_local_sgd *lsgd = NULL;
        if (local_sgd > 0) CA_CHECK(ca_local_sgd_begin(acc, m, local_sgd, true, &lsgd));
        double t0 = now_s();
        for (int e = 0; e < epochs; e++) {
            for (int64_t g = 0; g < n; g += B * W) {
                int64_t i = g + R * B;
                if (W > 1 && g + B * W > n) break;        /* data parallel: whole global batches only */
                int64_t len = i + B <= n ? B : n - i;     /* one process: the short last batch is kept */
                CA_SCOPE {
                    double p0 = now_s();
                    ca_tensor *loss = ca_cross_entropy(ca_module_forward(m, ca_narrow(xtr, 0, i, len)),
                                                       ca_narrow(ytr, 0, i, len));
                    double p1 = now_s();
                    CA_CHECK(ca_backward(acc, loss));     /* includes the gradient all-reduce */
                    double p2 = now_s();
                    CA_CHECK(ca_optimizer_step(opt));
                    ca_optimizer_zero_grad(opt);
                    if (lsgd) CA_CHECK(ca_local_sgd_step(lsgd));
                    t_fwd += p1 - p0;
                    t_bwd += p2 - p1;
                    t_opt += now_s() - p2;
                }
                steps++;
                seen += len * W;
            }
        }
        CA_CHECK(ca_local_sgd_end(lsgd));
        double secs = now_s() - t0;
        bench_window("mlp", B, t0, t0 + secs);
        CA_CHECK(ca_device_memory_stats(dev, &m1));
        double step_s = secs / (double)steps;
        double gemm_s = gemm_step_seconds(B, 200, blas_sgemm);
        const char *f32_path = f32_gemm_path(dev);
        /* the bound through the library caccel's GEMMs ran on: the share of the step outside GEMM */
        double lib_s = strcmp(f32_path, "onednn") ? gemm_s : gemm_step_seconds(B, 200, onednn_sgemm);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        double acc_pct = accuracy(m, xte, yte);
        double opt_s = t_opt / (double)steps;
        char bf16[64];
        bf16_gemm_path(dev, bf16, sizeof bf16);
        if (R == 0)
        printf("impl=caccel procs=%lld precision=%s batch=%d threads=%d samples_per_s=%.0f step_us=%.1f gemm_us=%.1f "
               "step_over_gemm=%.3f pct_of_bound=%.1f bound_samples_per_s=%.0f accuracy=%.2f peak_rss_mib=%.1f "
               "step_mem_mib=%.2f fwd_us=%.1f bwd_us=%.1f opt_us=%.1f other_us=%.1f blas_core=%s kernels=%s "
               "flush_denormal=%s bf16_gemm=%s f32_gemm=%s lib_gemm_us=%.1f pct_of_lib_bound=%.1f\n",
               (long long)W, precision, B, openblas_get_num_threads(), (double)seen / secs,
               step_s * 1e6, gemm_s * 1e6, step_s / gemm_s, 100.0 * gemm_s / step_s, (double)(B * W) / gemm_s,
               acc_pct, ru.ru_maxrss / 1024.0, (double)(m1.peak_allocated - m0.allocated) / (1 << 20),
               t_fwd / (double)steps * 1e6, t_bwd / (double)steps * 1e6, opt_s * 1e6,
               (step_s - gemm_s - opt_s) * 1e6, openblas_get_corename(), bench_kernel_set(), flush_setting(), bf16,
               f32_path, lib_s * 1e6, 100.0 * lib_s / step_s);
        fflush(stdout);
        ca_optimizer_destroy(opt);
        ca_module_destroy(m);
    }
    ca_tensor_free(xtr); ca_tensor_free(ytr); ca_tensor_free(xte); ca_tensor_free(yte);
    ca_accelerator_destroy(acc);
    ca_shutdown();
    return 0;
}
