/* Benchmark: f32 GEMM through the CPU kernel table against raw cblas_sgemm, 1 and 2 OpenBLAS threads. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/device_impl.h"
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
 * TN (its weight gradient, g^T x).
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
    const ca_kernels *k;
    void *dev;
    bool ta, tb;
    int n;
    float *a, *b, *c;
} bench_case;

static int run_kernel(const bench_case *bc, int iters) {
    ca_gemm_args g = {.trans_a = bc->ta, .trans_b = bc->tb, .m = bc->n, .n = bc->n, .k = bc->n,
                      .alpha = 1.0f, .beta = 0.0f, .a_dtype = CA_F32, .b_dtype = CA_F32,
                      .c_dtype = CA_F32, .a = bc->a, .lda = bc->n, .b = bc->b, .ldb = bc->n,
                      .c = bc->c, .ldc = bc->n};
    for (int i = 0; i < iters; i++)
        if (bc->k->gemm(bc->dev, &g) != CA_OK) {
            ca_error_print();
            return -1;
        }
    return 0;
}

static int run_cblas(const bench_case *bc, int iters) {
    for (int i = 0; i < iters; i++)
        cblas_sgemm(CblasRowMajor, bc->ta ? CblasTrans : CblasNoTrans,
                    bc->tb ? CblasTrans : CblasNoTrans, bc->n, bc->n, bc->n, 1.0f, bc->a, bc->n,
                    bc->b, bc->n, 0.0f, bc->c, bc->n);
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
    char desc[512];
    ops->describe(dev, desc, sizeof desc);
    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("# device: %s\n# OPENBLAS_CORETYPE=%s, %d samples per point (median), alternating callers\n",
           desc, ct ? ct : "(unset)", reps);
    printf("%-7s %-6s %5s %12s %12s %7s\n", "threads", "layout", "n", "table GF/s", "cblas GF/s", "ratio");

    const int sizes[] = {64, 128, 256, 512, 1024, 2048};
    const int nsizes = (int)(sizeof sizes / sizeof sizes[0]);
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
        for (int si = 0; si < nsizes; si++)
            for (int layout = 0; layout < 3; layout++) {
                int n = sizes[si];
                if (layout > 0 && n != 512 && n != 1024) continue;
                bench_case bc = {ops->kernels, dev, layout == 2, layout == 1, n, a, b, c};
                double flop = 2.0 * n * (double)n * n;
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
                static const char *names[] = {"NN", "NT", "TN"};
                printf("%-7d %-6s %5d %12.1f %12.1f %7.3f\n", threads[ti], names[layout], n, gk, gc, ratio);
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
