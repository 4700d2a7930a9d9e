/* bench_allreduce: all_reduce latency and bandwidth through caccel against raw MPI_Allreduce or raw Gloo. */
#include <caccel/caccel.h>

#ifdef CA_BENCH_MPI
#include <mpi.h>
#endif

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * Run with 2 ranks under mpirun (--backend mpi: raw MPI_Allreduce is timed
 * in the same processes) or under caccel launch (--backend gloo --raw FILE:
 * FILE holds bench_gloo_raw's figures from the same machine, a moment before).
 * Every point is a SUM in place (--op avg: caccel's average; --dtype bf16|f16: caccel's in that
 * type, the same bytes, as DDP's comm_hook sends them; the raw column stays f32 sum); the time is the slowest rank's, the best of
 * `rounds` alternating caccel/raw measurements of `iters` calls each.
 *   latency: microseconds per call; bandwidth: bytes / time (algorithm bandwidth).
 */

#define MAX_SIZES 32

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int iters_for(size_t bytes) {
    size_t it = (size_t)256 << 20;   /* about 256 MiB moved per measurement */
    it /= bytes ? bytes : 1;
    if (it > 20000) it = 20000;
    if (it < 5) it = 5;
    return (int)it;
}

/* The slowest rank's value. */
static double slowest(ca_comm *c, double us) {
    int64_t v = (int64_t)(us * 1000.0);
    if (ca_comm_all_reduce(c, &v, &v, 1, CA_I64, CA_OP_MAX, NULL) != CA_OK) return -1;
    return (double)v / 1000.0;
}

/* the reduction timed: sum, or the average that DDP's gradients use (--op avg) */
static ca_reduce_op g_op = CA_OP_SUM;
/* caccel's element type (--dtype): f32, or the 16-bit types of DDP's comm_hook */
static ca_dtype g_dt = CA_F32;

static double time_caccel(ca_comm *c, float *buf, size_t n, int iters) {
    for (int i = 0; i < 2; i++) ca_comm_all_reduce(c, buf, buf, n, g_dt, g_op, NULL);
    ca_comm_barrier(c, NULL);
    double t0 = now_us();
    for (int i = 0; i < iters; i++)
        if (ca_comm_all_reduce(c, buf, buf, n, g_dt, g_op, NULL) != CA_OK) {
            fprintf(stderr, "bench_allreduce: %s\n", ca_last_error());
            exit(1);
        }
    return slowest(c, (now_us() - t0) / iters);
}

#ifdef CA_BENCH_MPI
static double time_mpi(ca_comm *c, float *buf, size_t n, int iters) {
    for (int i = 0; i < 2; i++) MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    ca_comm_barrier(c, NULL);
    double t0 = now_us();
    for (int i = 0; i < iters; i++) MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    return slowest(c, (now_us() - t0) / iters);
}
#endif

static void fmt_size(size_t b, char *buf, size_t len) {
    if (b >= (1u << 20)) snprintf(buf, len, "%zu MiB", b >> 20);
    else if (b >= 1024) snprintf(buf, len, "%zu KiB", b >> 10);
    else snprintf(buf, len, "%zu B", b);
}

int main(int argc, char **argv) {
    const char *backend = NULL, *raw_file = NULL;
    size_t max_bytes = (size_t)64 << 20;
    int rounds = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) backend = argv[++i];
        else if (strcmp(argv[i], "--raw") == 0 && i + 1 < argc) raw_file = argv[++i];
        else if (strcmp(argv[i], "--max-mib") == 0 && i + 1 < argc) max_bytes = (size_t)atoi(argv[++i]) << 20;
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--op") == 0 && i + 1 < argc && strcmp(argv[i + 1], "avg") == 0) {
            g_op = CA_OP_AVG;   /* the raw columns stay sums: compare caccel with itself */
            i++;
        } else if (strcmp(argv[i], "--op") == 0 && i + 1 < argc && strcmp(argv[i + 1], "sum") == 0) {
            i++;
        } else if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
            const char *d = argv[++i];
            if (!strcmp(d, "f32")) g_dt = CA_F32;
            else if (!strcmp(d, "bf16")) g_dt = CA_BF16;
            else if (!strcmp(d, "f16")) g_dt = CA_F16;
            else {
                fprintf(stderr, "bench_allreduce: --dtype takes f32, bf16 or f16, not %s\n", d);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: bench_allreduce [--backend mpi|gloo] [--raw FILE] [--max-mib N] [--rounds N] "
                            "[--op sum|avg] [--dtype f32|bf16|f16]\n");
            return 2;
        }
    }
    ca_comm *c = NULL;
    ca_comm_options o = {.backend = backend, .timeout_ms = 600000};
    if (ca_comm_create(&o, &c) != CA_OK) {
        fprintf(stderr, "bench_allreduce: %s\n", ca_last_error());
        if (ca_last_hint()[0]) fprintf(stderr, "  hint: %s\n", ca_last_hint());
        return 1;
    }
    int rank = ca_comm_rank(c);
    const char *be = ca_comm_backend(c);
    bool mpi = strcmp(be, "mpi") == 0;
#ifndef CA_BENCH_MPI
    if (mpi && rank == 0) fprintf(stderr, "bench_allreduce: built without MPI: no raw MPI_Allreduce column\n");
#endif
    size_t sizes[MAX_SIZES];
    double raw_us[MAX_SIZES];
    int nsizes = 0;
    for (size_t b = 4; b <= max_bytes && nsizes < MAX_SIZES; b *= 4) {
        sizes[nsizes] = b;
        raw_us[nsizes++] = -1;
    }
    if (raw_file) {
        FILE *f = fopen(raw_file, "r");
        if (!f) {
            fprintf(stderr, "bench_allreduce: cannot read %s\n", raw_file);
            return 1;
        }
        char line[256];
        size_t b;
        double us;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "raw-gloo %zu %lf", &b, &us) == 2)
                for (int i = 0; i < nsizes; i++)
                    if (sizes[i] == b) raw_us[i] = us;
        fclose(f);
    }
    const char *raw_name = mpi ? "MPI_Allreduce" : raw_file ? "gloo::allreduce" : "none";
    float *buf = malloc(max_bytes);
    if (!buf) return 1;
    for (size_t i = 0; i < max_bytes / 4; i++) buf[i] = 0.0f;   /* sums of zeros stay finite */
    if (rank == 0) {
        printf("# all_reduce %s %s in place, %d ranks, backend %s; raw (f32 sum): %s\n", ca_dtype_name(g_dt),
               g_op == CA_OP_AVG ? "avg" : "sum", ca_comm_size(c), be, raw_name);
        printf("# %-9s %12s %12s %12s %12s %9s %12s\n", "size", "caccel_us", "raw_us", "caccel_GB/s", "raw_GB/s",
               "bw_ratio", "added_us");
    }
    for (int s = 0; s < nsizes; s++) {
        size_t n = sizes[s] / ca_dtype_size(g_dt);
        int iters = iters_for(sizes[s]);
        double best_c = 1e30, best_r = raw_us[s] > 0 ? raw_us[s] : 1e30;
        for (int r = 0; r < rounds; r++) {
#ifdef CA_BENCH_MPI
            if (mpi) {
                double t = time_mpi(c, buf, sizes[s] / 4, iters);
                if (t < best_r) best_r = t;
            }
#endif
            double t = time_caccel(c, buf, n, iters);
            if (t < best_c) best_c = t;
        }
        if (rank == 0) {
            char sz[32];
            fmt_size(sizes[s], sz, sizeof sz);
            double gb_c = (double)sizes[s] / best_c * 1e-3;
            if (best_r < 1e29) {
                double gb_r = (double)sizes[s] / best_r * 1e-3;
                printf("  %-9s %12.2f %12.2f %12.3f %12.3f %9.3f %12.2f\n", sz, best_c, best_r, gb_c, gb_r,
                       best_r / best_c, best_c - best_r);
            } else {
                printf("  %-9s %12.2f %12s %12.3f %12s %9s %12s\n", sz, best_c, "-", gb_c, "-", "-", "-");
            }
            fflush(stdout);
        }
    }
    free(buf);
    ca_comm_destroy(c);
    return 0;
}
