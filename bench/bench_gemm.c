/* Benchmark: f32 GEMM through the CPU kernel table (OpenBLAS or oneDNN, CACCEL_CPU_GEMM) against raw
 * cblas_sgemm, 1 and 2 threads. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/device_impl.h"
#include "backends/cpu/cpu_parallel.h"
#include "backends/cpu/cpu_plugin.h"

/*
 * Usage: bench_gemm [repetitions [threads]]   (defaults: 7 samples; threads 1 then 2)
 *
 * For each thread count, layout and size n (square, m = n = k), the two
 * callers run alternately, `repetitions` samples each; a sample times enough
 * back-to-back calls to last about 50 ms. Reported: the median GFLOP/s of
 * each caller and the median over sample pairs of the speed ratio (kernel
 * table / cblas). Sizes 64..2048 use the
 * NN layout; 512 and 1024 also run NT (a Linear layer's forward, x W^T) and
 * TN (its weight gradient, g^T x). Then the MLP's (784-256) Linear shapes at batch 16, 32, 128 and 512:
 * the forward x W^T (NT, m = batch) and the weight gradient g^T x (TN, k = batch).
 */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct bench_case {
    const ca_kernels *kernels;
    void *dev;
    bool ta, tb;
    int m, n, k;
    float *a, *b, *c;
} bench_case;

/* Row-major leading dimensions of A ([m,k] or [k,m]) and B ([k,n] or [n,k]). */
static int lda_of(const bench_case *bc) { return bc->ta ? bc->m : bc->k; }
static int ldb_of(const bench_case *bc) { return bc->tb ? bc->k : bc->n; }

static int run_kernel(const bench_case *bc, int iters) {
    ca_gemm_args g = {.struct_size = sizeof g, .trans_a = bc->ta, .trans_b = bc->tb, .m = bc->m, .n = bc->n, .k = bc->k,
                      .alpha = 1.0f, .beta = 0.0f, .a_dtype = CA_F32, .b_dtype = CA_F32,
                      .c_dtype = CA_F32, .a = bc->a, .lda = lda_of(bc), .b = bc->b, .ldb = ldb_of(bc),
                      .c = bc->c, .ldc = bc->n};
    for (int i = 0; i < iters; i++)
        if (bc->kernels->gemm(bc->dev, &g) != CA_OK) {
            ca_error_print();
            return -1;
        }
    return 0;
}

static int run_cblas(const bench_case *bc, int iters) {
    for (int i = 0; i < iters; i++)
        cblas_sgemm(CblasRowMajor, bc->ta ? CblasTrans : CblasNoTrans,
                    bc->tb ? CblasTrans : CblasNoTrans, bc->m, bc->n, bc->k, 1.0f, bc->a, lda_of(bc),
                    bc->b, ldb_of(bc), 0.0f, bc->c, bc->n);
    return 0;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    int only = argc > 2 ? atoi(argv[2]) : 0;
    if (reps < 1 || reps > 1000 || only < 0 || only > 2) {
        fprintf(stderr, "usage: %s [repetitions (1..1000, default 7) [threads (1 or 2; default both)]]\n",
                argv[0]);
        return 2;
    }
    const ca_plugin *pl = ca_cpu_plugin();
    const ca_device_ops *ops = pl->devices[0];
    void *dev;
    if (ops->open(0, NULL, &dev) != CA_OK) {
        ca_error_print();
        return 1;
    }
    /* before the description, which settles the GEMM path and oneDNN's thread count */
    if (only) cpu_set_threads(only);   /* the kernels' and the BLAS's count, which GEMMs put back */
    char desc[512];
    ops->describe(dev, desc, sizeof desc);
    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("# device: %s\n# OPENBLAS_CORETYPE=%s, %d samples per point (median), alternating callers\n",
           desc, ct ? ct : "(unset)", reps);
    if (!only && strstr(desc, "f32 GEMM through oneDNN"))
        printf("# oneDNN takes its thread count at its first GEMM: run one thread count per process "
               "(%s REPS 1, then %s REPS 2) for the 2-thread rows\n", argv[0], argv[0]);
    printf("%-7s %-6s %16s %12s %12s %7s\n", "threads", "layout", "m x n x k", "table GF/s", "cblas GF/s", "ratio");

    /* square NN at every size, NT and TN at 512 and 1024; then the MLP's Linear shapes */
    enum { NCASES = 6 + 4 + 8 };
    bench_case cases[NCASES];
    const int sizes[] = {64, 128, 256, 512, 1024, 2048};
    int nc = 0;
    for (int si = 0; si < 6; si++)
        for (int layout = 0; layout < 3; layout++) {
            int n = sizes[si];
            if (layout > 0 && n != 512 && n != 1024) continue;
            cases[nc++] = (bench_case){.ta = layout == 2, .tb = layout == 1, .m = n, .n = n, .k = n};
        }
    const int batches[] = {16, 32, 128, 512};
    for (int bi = 0; bi < 4; bi++) {
        cases[nc++] = (bench_case){.tb = true, .m = batches[bi], .n = 256, .k = 784};
        cases[nc++] = (bench_case){.ta = true, .m = 256, .n = 784, .k = batches[bi]};
    }
    const size_t maxn = 2048;
    float *a = NULL, *b = NULL, *c = NULL;
    if (ops->mem_alloc(dev, maxn * maxn * 4, (void **)&a) != CA_OK ||
        ops->mem_alloc(dev, maxn * maxn * 4, (void **)&b) != CA_OK ||
        ops->mem_alloc(dev, maxn * maxn * 4, (void **)&c) != CA_OK) {
        ca_error_print();
        return 1;
    }
    unsigned s = 12345;
    for (size_t i = 0; i < maxn * maxn; i++) {
        s = s * 1103515245u + 12345u;
        a[i] = (float)((s >> 9) & 0xffff) / 65536.0f - 0.5f;
        b[i] = (float)((s >> 3) & 0xffff) / 65536.0f - 0.5f;
    }
    double *tk = malloc((size_t)reps * sizeof *tk), *tc = malloc((size_t)reps * sizeof *tc);
    double *pr = malloc((size_t)reps * sizeof *pr);
    int status = 0;
    const int threads[] = {1, 2};
    for (int ti = 0; ti < 2; ti++) {
        if (only && threads[ti] != only) continue;
        openblas_set_num_threads(threads[ti]);
        for (int ci = 0; ci < nc; ci++) {
            bench_case bc = cases[ci];
            bc.a = a, bc.b = b, bc.c = c;
            bc.dev = dev;
            bc.kernels = ops->kernels;
            double flop = 2.0 * bc.m * (double)bc.n * bc.k;
            /* warm up (threads, caches, page faults) for ~20 ms, then
             * calibrate: enough calls for ~50 ms per sample */
            double t0 = now_s();
            int warm = 0;
            while (now_s() - t0 < 0.02 || warm < 2) {
                run_cblas(&bc, 1);
                run_kernel(&bc, 1);
                warm++;
            }
            double one = (now_s() - t0) / (2.0 * warm);
            int iters = (int)(0.05 / one);
            if (iters < 1) iters = 1;
            for (int r = 0; r < reps; r++) {
                t0 = now_s();
                if (run_kernel(&bc, iters) != 0) status = 1;
                tk[r] = now_s() - t0;
                t0 = now_s();
                run_cblas(&bc, iters);
                tc[r] = now_s() - t0;
            }
            /* the ratio is the median over adjacent pairs, which cancels
             * slow changes in background load */
            for (int r = 0; r < reps; r++) pr[r] = tc[r] / tk[r];
            double ratio = median(pr, reps);
            double gk = flop * iters / median(tk, reps) / 1e9;
            double gc = flop * iters / median(tc, reps) / 1e9;
            char shape[48];
            snprintf(shape, sizeof shape, "%d x %d x %d", bc.m, bc.n, bc.k);
            printf("%-7d %-6s %16s %12.1f %12.1f %7.3f\n", threads[ti], bc.ta ? "TN" : bc.tb ? "NT" : "NN", shape, gk,
                   gc, ratio);
            fflush(stdout);
        }
    }
    free(tk);
    free(tc);
    free(pr);
    ops->mem_free(dev, a);
    ops->mem_free(dev, b);
    ops->mem_free(dev, c);
    ops->close(dev);
    return status;
}
