/* CUDA reductions and row-wise kernels: reduce over the middle of (outer, len, inner), argmax, softmax/log_softmax (+ backward). */
#include "backends/cuda/cuda_common.cuh"

/* ---------------------------------------------------------------- reduce */

/* inner == 1: one block per row of len contiguous elements. Sums in f64. */
template <typename T>
__global__ void reduce_rows_k(int op, int64_t outer, int64_t len, const typename T::S *x, typename T::S *y,
                              float beta) {
    __shared__ double shd[32];
    __shared__ float shf[32];
    for (int64_t o = blockIdx.x; o < outer; o += gridDim.x) {
        const typename T::S *row = x + o * len;
        float res;
        if (op == CA_OP_SUM || op == CA_OP_AVG) {
            double s = 0.0;
            for (int64_t l = threadIdx.x; l < len; l += blockDim.x) s += (double)T::ld(row, l);
            s = cu_block_reduce(s, CuSum(), shd);
            res = op == CA_OP_AVG ? (len ? (float)(s / (double)len) : NAN) : (float)s;
        } else if (op == CA_OP_MAX) {
            float m = -INFINITY;
            for (int64_t l = threadIdx.x; l < len; l += blockDim.x) m = CuMax()(m, T::ld(row, l));
            res = cu_block_reduce(m, CuMax(), shf);
        } else {
            float m = INFINITY;
            for (int64_t l = threadIdx.x; l < len; l += blockDim.x) m = CuMin()(m, T::ld(row, l));
            res = cu_block_reduce(m, CuMin(), shf);
        }
        if (threadIdx.x == 0) T::st(y, o, beta == 0.0f ? res : beta * T::ld(y, o) + res);
    }
}

/* inner > 1 (a bias gradient: the sum over 8192 rows of [8192, 768]): tiles of RC_COLS columns
 * (coalesced over i) by RC_LANES row lanes, so that a column's rows are read by 16 threads, not one;
 * long columns are cut into chunks on gridDim.y as well, so that small outputs still fill the GPU.
 * Every partial is combined in a fixed order: the result does not depend on the schedule. */
#define RC_COLS 32
#define RC_LANES 16
#define RC_MIN_CHUNK 256   /* rows of a chunk at least: 16 per lane */

/* The reduction's identity and combine step, sums in f64, max/min NaN-winning. */
CU_D double rc_init(int op) { return op == CA_OP_MAX ? -INFINITY : (op == CA_OP_MIN ? INFINITY : 0.0); }
CU_D double rc_add(int op, double acc, double v) {
    if (op == CA_OP_MAX) return (double)CuMax()((float)acc, (float)v);
    if (op == CA_OP_MIN) return (double)CuMin()((float)acc, (float)v);
    return acc + v;
}

/* The output from the combined value: the mean's scale, NaN for the mean of nothing, beta. */
template <typename T>
__device__ __forceinline__ void rc_store(int op, int64_t len, double acc, typename T::S *y, int64_t t, float beta) {
    float res;
    if (op == CA_OP_SUM || op == CA_OP_AVG) {
        double scale = op == CA_OP_AVG ? 1.0 / (double)len : 1.0;
        res = len ? (float)(acc * scale) : (op == CA_OP_AVG ? NAN : 0.0f);
    } else {
        res = (float)acc;
    }
    T::st(y, t, beta == 0.0f ? res : beta * T::ld(y, t) + res);
}

/* Block (tile of outer * ntiles, chunk blockIdx.y), threads (RC_COLS, RC_LANES): lane ty takes rows
 * l0 + ty, l0 + ty + RC_LANES, ...; the lanes' partials are combined in lane order. With one chunk
 * the block writes y, else the chunk's partial (part[chunk][o * inner + i]). */
template <typename T>
__global__ void reduce_tiles_k(int op, int64_t outer, int64_t len, int64_t inner, int64_t chunk, int64_t ntiles,
                               const typename T::S *x, double *part, typename T::S *y, float beta) {
    __shared__ double sh[RC_LANES][RC_COLS + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t l0 = (int64_t)blockIdx.y * chunk, l1 = l0 + chunk < len ? l0 + chunk : len;
    for (int64_t b = blockIdx.x; b < outer * ntiles; b += gridDim.x) {
        int64_t o = b / ntiles, i = (b % ntiles) * RC_COLS + tx;
        double acc = rc_init(op);
        if (i < inner) {
            const typename T::S *col = x + o * len * inner + i;
            for (int64_t l = l0 + ty; l < l1; l += RC_LANES) acc = rc_add(op, acc, (double)T::ld(col, l * inner));
        }
        __syncthreads();   /* sh may still be read for the previous tile */
        sh[ty][tx] = acc;
        __syncthreads();
        if (ty == 0 && i < inner) {
            for (int k = 1; k < RC_LANES; k++) acc = rc_add(op, acc, sh[k][tx]);
            if (part) part[(int64_t)blockIdx.y * outer * inner + o * inner + i] = acc;
            else rc_store<T>(op, len, acc, y, o * inner + i, beta);
        }
    }
}

/* y[t] from the chunks' partials, added in chunk order. */
template <typename T>
__global__ void reduce_chunks_k(int op, int64_t total, int64_t len, int64_t nchunks, const double *part,
                                typename T::S *y, float beta) {
    CU_GRID_LOOP(t, total) {
        double acc = part[t];
        for (int64_t k = 1; k < nchunks; k++) acc = rc_add(op, acc, part[k * total + t]);
        rc_store<T>(op, len, acc, y, t, beta);
    }
}

/* The tiled reduction over the middle dimension; a scratch for the partials when len is cut. */
static ca_status reduce_cols(cuda_device *d, int op, ca_dtype dt, int64_t outer, int64_t len, int64_t inner,
                             const void *x, void *y, float beta) {
    int64_t ntiles = (inner + RC_COLS - 1) / RC_COLS, blocks = outer * ntiles;
    int64_t want = (int64_t)d->sm_count * 4, nchunks = 1;
    if (blocks < want && len > RC_MIN_CHUNK) {
        nchunks = want / blocks;
        int64_t most = (len + RC_MIN_CHUNK - 1) / RC_MIN_CHUNK;
        if (nchunks > most) nchunks = most;
        if (nchunks > 65535) nchunks = 65535;
        if (nchunks < 1) nchunks = 1;
    }
    int64_t chunk = len > 0 ? (len + nchunks - 1) / nchunks : 1;
    nchunks = len > 0 ? (len + chunk - 1) / chunk : 1;
    void *tmp = NULL;
    if (nchunks > 1) {
        ca_status st = cu_tmp_alloc(d, (size_t)nchunks * (size_t)(outer * inner) * sizeof(double), &tmp);
        if (st != CA_OK) return ca_error_context("cuda kernel reduce (%lld column partials)", (long long)nchunks);
    }
    dim3 grid(cu_row_grid(blocks), (unsigned)nchunks), th(RC_COLS, RC_LANES);
    CU_FLOAT_SWITCH(dt, T, reduce_tiles_k<T><<<grid, th, 0, d->stream>>>(op, outer, len, inner, chunk, ntiles,
        (const T::S *)x, (double *)tmp, (T::S *)y, beta));
    if (tmp) {
        unsigned g = cu_grid(d, outer * inner, CU_THREADS);
        CU_FLOAT_SWITCH(dt, T, reduce_chunks_k<T><<<g, CU_THREADS, 0, d->stream>>>(op, outer * inner, len, nchunks,
            (const double *)tmp, (T::S *)y, beta));
    }
    ca_status st = CU_LAUNCHED(d, "reduce");
    if (tmp) cu_tmp_free(d, tmp);
    return st;
}

extern "C" ca_status cu_reduce(void *dev, const ca_reduce_args *args) {
    ca_reduce_op op = args->op;
    ca_dtype dt = args->dt;
    int64_t outer = args->outer;
    int64_t len = args->len;
    int64_t inner = args->inner;
    const void *x = args->x;
    void *y = args->y;
    float beta = args->beta;
    cuda_device *d = (cuda_device *)dev;
    const char *name = ca_reduce_op_name(op);
    if (outer == 0 || inner == 0) return CA_OK;
    ca_status st = cu_enter(d, "kernel reduce");
    if (st != CA_OK) return st;
    if (inner == 1) {
        int th = cu_row_threads(len);
        CU_FLOAT_SWITCH(dt, T, reduce_rows_k<T><<<cu_row_grid(outer), th, 0, d->stream>>>((int)op, outer, len,
            (const T::S *)x, (T::S *)y, beta));
        return CU_LAUNCHED(d, "reduce");
    }
    return reduce_cols(d, (int)op, dt, outer, len, inner, x, y, beta);
}

/* ---------------------------------------------------------------- argmax */

/* (value, index) with index -1 for "nothing yet": b replaces a when it is a
 * NaN and a is not, larger, or equal (both NaN) at a smaller index, so the
 * first maximum wins and a NaN counts as the largest value (as the CPU). */
CU_D bool arg_better(float bv, int64_t bi, float av, int64_t ai) {
    if (bi < 0) return false;
    if (ai < 0) return true;
    bool an = av != av, bn = bv != bv;
    if (an || bn) return bn && (!an || bi < ai);
    return bv > av || (bv == av && bi < ai);
}

template <typename T>
__global__ void argmax_k(int64_t rows, int64_t cols, const typename T::S *x, int64_t *idx) {
    __shared__ float sv[32];
    __shared__ int64_t si[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const typename T::S *row = x + r * cols;
        float bv = 0.0f;
        int64_t bi = -1;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            float v = T::ld(row, c);
            if (arg_better(v, c, bv, bi)) {
                bv = v;
                bi = c;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (arg_better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
        int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
        __syncthreads();
        if (lane == 0) {
            sv[warp] = bv;
            si[warp] = bi;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float v = sv[0];
            int64_t i = si[0];
            for (int w = 1; w < nw; w++)
                if (arg_better(sv[w], si[w], v, i)) {
                    v = sv[w];
                    i = si[w];
                }
            idx[r] = i;
        }
    }
}

extern "C" ca_status cu_argmax(void *dev, const ca_argmax_args *args) {
    ca_dtype dt = args->dt;
    int64_t rows = args->rows;
    int64_t cols = args->cols;
    const void *x = args->x;
    int64_t *idx = args->idx;
    cuda_device *d = (cuda_device *)dev;
    if (rows == 0) return CA_OK;
    ca_status st = cu_enter(d, "kernel argmax");
    if (st != CA_OK) return st;
    int th = cu_row_threads(cols);
    CU_FLOAT_SWITCH(dt, T, argmax_k<T><<<cu_row_grid(rows), th, 0, d->stream>>>(rows, cols, (const T::S *)x, idx));
    return CU_LAUNCHED(d, "argmax");
}

/* --------------------------------------------------------------- softmax */

/* Row max with NaN winning; an all -inf row gives 0 so that exp gives 0, not NaN. */
template <typename T>
__device__ __forceinline__ float row_max(const typename T::S *row, int64_t cols, float *shf) {
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = CuMax()(m, T::ld(row, c));
    m = cu_block_reduce(m, CuMax(), shf);
    return m == -INFINITY ? 0.0f : m;
}

template <typename T>
__global__ void softmax_k(bool log, int64_t rows, int64_t cols, const typename T::S *x, typename T::S *y) {
    __shared__ float shf[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const typename T::S *row = x + r * cols;
        typename T::S *out = y + r * cols;
        float m = row_max<T>(row, cols, shf);
        float s = 0.0f;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += expf(T::ld(row, c) - m);
        s = cu_block_reduce(s, CuSum(), shf);
        if (log) {
            float shift = m + logf(s);
            for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) T::st(out, c, T::ld(row, c) - shift);
        } else {
            float inv = 1.0f / s;
            for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) T::st(out, c, expf(T::ld(row, c) - m) * inv);
        }
    }
}

static ca_status check_rows(const char *k, ca_dtype dt, int64_t rows, int64_t cols) {
    return CA_OK;
}

extern "C" ca_status cu_softmax(void *dev, const ca_softmax_args *args) {
    bool log = args->log;
    ca_dtype dt = args->dt;
    int64_t rows = args->rows;
    int64_t cols = args->cols;
    const void *x = args->x;
    void *y = args->y;
    cuda_device *d = (cuda_device *)dev;
    const char *k = log ? "log_softmax" : "softmax";
    ca_status st = check_rows(k, dt, rows, cols);
    if (st != CA_OK) return st;
    if (rows == 0 || cols == 0) return CA_OK;
    if ((st = cu_enter(d, "kernel softmax")) != CA_OK) return st;
    int th = cu_row_threads(cols);
    CU_FLOAT_SWITCH(dt, T, softmax_k<T><<<cu_row_grid(rows), th, 0, d->stream>>>(log, rows, cols,
        (const T::S *)x, (T::S *)y));
    return CU_LAUNCHED(d, k);
}

/* softmax: dx = beta dx + y (dy - sum(dy y));  log: dx = beta dx + dy - exp(y) sum(dy).
 * dx may be y or dy: each element is read before it is written, by the same thread. */
template <typename T>
__global__ void softmax_bwd_k(bool log, int64_t rows, int64_t cols, const typename T::S *y,
                              const typename T::S *dy, typename T::S *dx, float beta) {
    __shared__ float shf[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t off = r * cols;
        float s = 0.0f;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
            s += log ? T::ld(dy, off + c) : T::ld(dy, off + c) * T::ld(y, off + c);
        s = cu_block_reduce(s, CuSum(), shf);
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            float yv = T::ld(y, off + c), dv = T::ld(dy, off + c);
            float g = log ? dv - expf(yv) * s : yv * (dv - s);
            T::st(dx, off + c, beta == 0.0f ? g : beta * T::ld(dx, off + c) + g);
        }
    }
}

extern "C" ca_status cu_softmax_backward(void *dev, const ca_softmax_backward_args *args) {
    bool log = args->log;
    ca_dtype dt = args->dt;
    int64_t rows = args->rows;
    int64_t cols = args->cols;
    const void *y = args->y;
    const void *dy = args->dy;
    void *dx = args->dx;
    float beta = args->beta;
    cuda_device *d = (cuda_device *)dev;
    const char *k = log ? "log_softmax_backward" : "softmax_backward";
    ca_status st = check_rows(k, dt, rows, cols);
    if (st != CA_OK) return st;
    if (rows == 0 || cols == 0) return CA_OK;
    if ((st = cu_enter(d, "kernel softmax_backward")) != CA_OK) return st;
    int th = cu_row_threads(cols);
    CU_FLOAT_SWITCH(dt, T, softmax_bwd_k<T><<<cu_row_grid(rows), th, 0, d->stream>>>(log, rows, cols,
        (const T::S *)y, (const T::S *)dy, (T::S *)dx, beta));
    return CU_LAUNCHED(d, k);
}
