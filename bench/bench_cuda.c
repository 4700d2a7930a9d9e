/* The CUDA backend's speed: GEMM through the kernel table against raw cuBLAS in the same run (f32, TF32, bf16; n = 1024..8192), and Fashion-MNIST MLP training throughput on the GPU. Prints key=value lines for bench/run_cuda.sh. */
#include <caccel/caccel.h>

#include "bench/bench_util.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void die(const char *what) {
    fprintf(stderr, "bench_cuda: %s\n", what);
    exit(1);
}

/* ------------------------------------------------------------------ GEMM */

typedef struct mode {
    const char *name;
    ca_dtype in, out;
    bool tf32;
} mode;

static const mode MODES[] = {
    {"f32", CA_F32, CA_F32, false},
    {"tf32", CA_F32, CA_F32, true},
    {"bf16", CA_BF16, CA_BF16, false},
};

static cudaDataType_t cuda_type(ca_dtype dt) { return dt == CA_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

/* Seconds per GEMM: C[n,n] = A[n,n] B[n,n] through caccel's kernel table. */
static double caccel_gemm(ca_device *g, const mode *m, int n, void *a, void *b, void *c, int reps) {
    const ca_kernels *k = ca_device_kernels(g);
    void *ctx = ca_device_context(g);
    ca_gemm_args args = {.struct_size = sizeof(ca_gemm_args), .m = n, .n = n, .k = n, .alpha = 1, .beta = 0,
                         .a_dtype = m->in, .b_dtype = m->in, .c_dtype = m->out, .a = a, .lda = n, .b = b,
                         .ldb = n, .c = c, .ldc = n, .allow_tf32 = m->tf32};
    for (int i = 0; i < 3; i++) CA_CHECK(k->gemm(ctx, &args));
    CA_CHECK(ca_device_synchronize(g));
    double t0 = now_s();
    for (int i = 0; i < reps; i++) CA_CHECK(k->gemm(ctx, &args));
    CA_CHECK(ca_device_synchronize(g));
    return (now_s() - t0) / reps;
}

/* The same GEMM on raw cuBLAS (row-major as caccel does it: operands swapped). */
static void raw_call(cublasHandle_t h, const mode *m, int n, void *a, void *b, void *c) {
    float one = 1, zero = 0;
    cublasComputeType_t ct = m->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b, cuda_type(m->in), n, a, cuda_type(m->in), n,
                     &zero, c, cuda_type(m->out), n, ct, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
        die("cublasGemmEx failed");
}

static double raw_gemm(cublasHandle_t h, const mode *m, int n, void *a, void *b, void *c, int reps) {
    for (int i = 0; i < 3; i++) raw_call(h, m, n, a, b, c);
    if (cudaDeviceSynchronize() != cudaSuccess) die("cudaDeviceSynchronize failed");
    double t0 = now_s();
    for (int i = 0; i < reps; i++) raw_call(h, m, n, a, b, c);
    if (cudaDeviceSynchronize() != cudaSuccess) die("cudaDeviceSynchronize failed");
    return (now_s() - t0) / reps;
}

static void bench_gemm(ca_device *g, const int *sizes, int nsizes) {
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) die("cublasCreate failed");
    for (int si = 0; si < nsizes; si++) {
        int n = sizes[si];
        for (size_t mi = 0; mi < sizeof MODES / sizeof MODES[0]; mi++) {
            const mode *m = &MODES[mi];
            size_t es = ca_dtype_size(m->in), bytes = (size_t)n * n * es;
            void *a, *b, *c;
            CA_CHECK(ca_device_alloc(g, bytes, &a));
            CA_CHECK(ca_device_alloc(g, bytes, &b));
            CA_CHECK(ca_device_alloc(g, (size_t)n * n * ca_dtype_size(m->out), &c));
            const ca_kernels *k = ca_device_kernels(g);
            CA_CHECK(k->rng(ca_device_context(g), &(ca_rng_args){.struct_size = sizeof(ca_rng_args), .kind = CA_RNG_UNIFORM,
                                                        .dt = m->in, .n = (int64_t)n * n, .seed = 1, .offset = 0,
                                                        .a = -1, .b = 1, .y = a}));
            CA_CHECK(k->rng(ca_device_context(g), &(ca_rng_args){.struct_size = sizeof(ca_rng_args), .kind = CA_RNG_UNIFORM,
                                                        .dt = m->in, .n = (int64_t)n * n, .seed = 2, .offset = 0,
                                                        .a = -1, .b = 1, .y = b}));
            int reps = n <= 2048 ? 50 : (n <= 4096 ? 10 : 4);
            /* alternate, so that clocks and temperature treat both alike */
            double tc = 1e30, tr = 1e30;
            for (int round = 0; round < 3; round++) {
                double x = caccel_gemm(g, m, n, a, b, c, reps), y = raw_gemm(h, m, n, a, b, c, reps);
                if (x < tc) tc = x;
                if (y < tr) tr = y;
            }
            double flops = 2.0 * n * (double)n * n;
            printf("bench=gemm mode=%s n=%d caccel_tflops=%.2f cublas_tflops=%.2f caccel_over_cublas=%.3f\n", m->name,
                   n, flops / tc * 1e-12, flops / tr * 1e-12, tr / tc);
            fflush(stdout);
            ca_device_free(g, a);
            ca_device_free(g, b);
            ca_device_free(g, c);
        }
    }
    cublasDestroy(h);
}

/* ------------------------------------------------------------------- MLP */

static void bench_mlp(const int *batches, int nb, int epochs, const char *precision) {
    ca_accelerator *acc;
    char *gpu_argv[] = {"bench_cuda", "--mixed_precision", (char *)precision, NULL};
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = 3, .argv = gpu_argv, .use_cpu = CA_NO}, &acc));
    ca_device *dev = ca_accelerator_device(acc);
    if (strcmp(ca_device_name(dev), "cuda") != 0) die("no GPU: the accelerator chose the CPU");
    ca_tensor *xtr, *ytr, *xte, *yte;
    load(dev, true, &xtr, &ytr);
    load(dev, false, &xte, &yte);
    int64_t n = ca_tensor_dim(xtr, 0);
    for (int bi = 0; bi < nb; bi++) {
        int B = batches[bi];
        CA_CHECK(ca_set_seed(acc, 42));
        ca_module *m = mlp();
        ca_optimizer *opt;
        CA_CHECK(ca_adamw_create(m, NULL, &opt));
        CA_CHECK(ca_prepare(acc, m, opt, NULL));
        ca_allocator_stats s0, s1;
        int64_t seen = 0;
        CA_CHECK(ca_device_synchronize(dev));
        double t0 = now_s();
        for (int e = 0; e < epochs; e++) {
            for (int64_t i = 0; i < n; i += B) {
                int64_t len = i + B <= n ? B : n - i;
                if (e == 0 && i == 10 * (int64_t)B) CA_CHECK(ca_device_memory_stats(dev, &s0));
                CA_SCOPE {
                    ca_tensor *loss = ca_cross_entropy(ca_module_forward(m, ca_narrow(xtr, 0, i, len)),
                                                       ca_narrow(ytr, 0, i, len));
                    CA_CHECK(ca_backward(acc, loss));
                    CA_CHECK(ca_optimizer_step(opt));
                    ca_optimizer_zero_grad(opt);
                }
                seen += len;
            }
        }
        CA_CHECK(ca_device_synchronize(dev));
        double secs = now_s() - t0;
        CA_CHECK(ca_device_memory_stats(dev, &s1));
        printf("bench=mlp impl=caccel precision=%s batch=%d samples_per_s=%.0f accuracy=%.2f "
               "cuda_mallocs_after_warmup=%llu\n",
               precision, B, (double)seen / secs, accuracy(m, xte, yte),
               (unsigned long long)(n > 10 * (int64_t)B ? s1.num_device_allocs - s0.num_device_allocs : 0));
        fflush(stdout);
        ca_optimizer_destroy(opt);
        ca_module_destroy(m);
    }
    ca_tensor_free(xtr);
    ca_tensor_free(ytr);
    ca_tensor_free(xte);
    ca_tensor_free(yte);
    ca_accelerator_destroy(acc);
}

static int parse_list(char *s, int *out, int max) {
    int k = 0;
    for (char *t = strtok(s, ","); t && k < max; t = strtok(NULL, ",")) out[k++] = atoi(t);
    return k;
}

int main(int argc, char **argv) {
    int sizes[8] = {1024, 2048, 4096, 8192}, ns = 4;
    int batches[8] = {128, 512, 2048}, nb = 3, epochs = 1;
    const char *precision = "no";
    bool gemm = true, mlp_on = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sizes") && i + 1 < argc) ns = parse_list(argv[++i], sizes, 8);
        else if (!strcmp(argv[i], "--batch-sizes") && i + 1 < argc) nb = parse_list(argv[++i], batches, 8);
        else if (!strcmp(argv[i], "--epochs") && i + 1 < argc) epochs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc) precision = argv[++i];
        else if (!strcmp(argv[i], "--gemm-only")) mlp_on = false;
        else if (!strcmp(argv[i], "--mlp-only")) gemm = false;
        else {
            fprintf(stderr, "usage: bench_cuda [--sizes 1024,2048] [--batch-sizes 128,512] [--epochs N] "
                            "[--precision no|bf16|fp16] [--gemm-only | --mlp-only]\n");
            return 2;
        }
    }
    ca_device *g = NULL;
    if (ca_device_open("cuda", 0, NULL, &g) != CA_OK) {
        fprintf(stderr, "bench_cuda: no GPU: %s\n", ca_last_error());
        return 77;
    }
    printf("# %s\n", ca_device_description(g));
    if (gemm) bench_gemm(g, sizes, ns);
    if (mlp_on) bench_mlp(batches, nb, epochs, precision);
    ca_scope_release_all();
    ca_shutdown();
    return 0;
}
