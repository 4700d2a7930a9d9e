/* CUDA elementwise kernels: fill, cast, copy_strided, unary (+ backward), broadcasting binary, axpby, and C = beta C for GEMM.
 * Contiguous ones go through ew_k: 16-byte vector loads where aligned, 32-bit indices below 2^31 elements. */
#include "backends/cuda/cuda_common.cuh"

#define GELU_K 0.7978845608028654f  /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* ------------------------------------------------------------------ fill */

template <typename U>
__global__ void fill_k(U *y, int64_t n, U v) {
    CU_GRID_LOOP(i, n) y[i] = v;
}

/* Float -> integer as the kernels define it (the CPU's round_sat): round to
 * nearest even, NaN -> 0, saturate. */
CU_HD int64_t round_sat(double v, double lo, double hi) {
    if (v != v) return 0;
    if (v <= lo) return (int64_t)lo;
    if (v >= hi) return (int64_t)hi;
    return (int64_t)rint(v);
}

CU_HD int64_t round_sat_i64(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)rint(v);
}

extern "C" cudaError_t cu_probe_kernels(void) {
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, (const void *)fill_k<uint32_t>);
    if (e != cudaSuccess) cudaGetLastError();
    return e;
}

extern "C" ca_status cu_fill(void *dev, const ca_fill_args *args) {
    ca_dtype dt = args->dt;
    int64_t n = args->n;
    double value = args->value;
    void *y = args->y;
    cuda_device *d = (cuda_device *)dev;
    if (n == 0) return CA_OK;
    ca_status st = cu_enter(d, "kernel fill");
    if (st != CA_OK) return st;
    unsigned g = cu_grid(d, n, CU_THREADS);
    switch (dt) {
    case CA_F32: fill_k<uint32_t><<<g, CU_THREADS, 0, d->stream>>>((uint32_t *)y, n, ca_f32_bits((float)value)); break;
    case CA_F16: fill_k<uint16_t><<<g, CU_THREADS, 0, d->stream>>>((uint16_t *)y, n, ca_f32_to_f16((float)value)); break;
    case CA_BF16: fill_k<uint16_t><<<g, CU_THREADS, 0, d->stream>>>((uint16_t *)y, n, ca_f32_to_bf16((float)value)); break;
    case CA_I32:
        fill_k<int32_t><<<g, CU_THREADS, 0, d->stream>>>((int32_t *)y, n,
                                                          (int32_t)round_sat(value, (double)INT32_MIN, (double)INT32_MAX));
        break;
    case CA_I64: fill_k<int64_t><<<g, CU_THREADS, 0, d->stream>>>((int64_t *)y, n, round_sat_i64(value)); break;
    case CA_U8:
        CA_CUDA_TRY(cudaMemsetAsync(y, (int)round_sat(value, 0.0, 255.0), (size_t)n, d->stream),
                    "cuda kernel fill (u8, %lld elements)", (long long)n);
        break;
    default: break;
    }
    return CU_LAUNCHED(d, "fill");
}

/* ------------------------------------------------------------------ cast */

/* Any dtype as float, alpha applied as the CPU's load_scaled does. */
CU_D float cast_load(ca_dtype dt, const void *x, int64_t i, float alpha) {
    switch (dt) {
    case CA_U8: return alpha * (float)((const uint8_t *)x)[i];
    case CA_I32: return alpha * (float)((const int32_t *)x)[i];
    case CA_I64: return alpha * (float)((const int64_t *)x)[i];
    case CA_F16: { float v = ca_f16_to_f32(((const uint16_t *)x)[i]); return alpha != 1.0f ? v * alpha : v; }
    case CA_BF16: { float v = ca_bf16_to_f32(((const uint16_t *)x)[i]); return alpha != 1.0f ? v * alpha : v; }
    default: { float v = ((const float *)x)[i]; return alpha != 1.0f ? v * alpha : v; }
    }
}

CU_D void cast_store(ca_dtype dt, void *y, int64_t i, float v) {
    switch (dt) {
    case CA_U8: {
        v = v != v ? 0.0f : (v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v));
        ((uint8_t *)y)[i] = (uint8_t)rintf(v);
        break;
    }
    case CA_I32: ((int32_t *)y)[i] = (int32_t)round_sat((double)v, (double)INT32_MIN, (double)INT32_MAX); break;
    case CA_I64: ((int64_t *)y)[i] = round_sat_i64((double)v); break;
    case CA_F16: ((uint16_t *)y)[i] = ca_f32_to_f16(v); break;
    case CA_BF16: ((uint16_t *)y)[i] = ca_f32_to_bf16(v); break;
    default: ((float *)y)[i] = v; break;
    }
}

__global__ void cast_k(ca_dtype sdt, const void *x, ca_dtype ddt, void *y, int64_t n, float alpha) {
    CU_GRID_LOOP(i, n) cast_store(ddt, y, i, cast_load(sdt, x, i, alpha));
}

CU_D int64_t int_at(ca_dtype dt, const void *x, int64_t i) {
    switch (dt) {
    case CA_U8: return ((const uint8_t *)x)[i];
    case CA_I32: return ((const int32_t *)x)[i];
    default: return ((const int64_t *)x)[i];
    }
}

/* Integer -> integer with alpha == 1: exact, saturating. */
__global__ void cast_int_k(ca_dtype sdt, const void *x, ca_dtype ddt, void *y, int64_t n) {
    CU_GRID_LOOP(i, n) {
        int64_t v = int_at(sdt, x, i);
        switch (ddt) {
        case CA_U8: ((uint8_t *)y)[i] = (uint8_t)(v < 0 ? 0 : (v > 255 ? 255 : v)); break;
        case CA_I32: ((int32_t *)y)[i] = (int32_t)(v < INT32_MIN ? INT32_MIN : (v > INT32_MAX ? INT32_MAX : v)); break;
        default: ((int64_t *)y)[i] = v; break;
        }
    }
}

static bool is_int(ca_dtype dt) { return dt == CA_I32 || dt == CA_I64 || dt == CA_U8; }

extern "C" ca_status cu_cast(void *dev, const ca_cast_args *args) {
    ca_dtype src_dt = args->src_dt;
    const void *x = args->x;
    ca_dtype dst_dt = args->dst_dt;
    void *y = args->y;
    int64_t n = args->n;
    float alpha = args->alpha;
    cuda_device *d = (cuda_device *)dev;
    if (n == 0) return CA_OK;
    size_t ssz = ca_dtype_size(src_dt), dsz = ca_dtype_size(dst_dt);
    uintptr_t xb = (uintptr_t)x, yb = (uintptr_t)y;
    bool overlap = yb < xb + (size_t)n * ssz && xb < yb + (size_t)n * dsz;
    bool same = src_dt == dst_dt && alpha == 1.0f;
    if (overlap && !same && !(xb == yb && dsz <= ssz))
        return ca_error(CA_ERR_INVALID, "cuda kernel cast: output overlaps the input (%s -> %s)",
                        ca_dtype_name(src_dt), ca_dtype_name(dst_dt));
    ca_status st = cu_enter(d, "kernel cast");
    if (st != CA_OK) return st;
    if (x == y && same) return CA_OK;
    /* in place into smaller elements (or an overlapping copy): threads would
     * overwrite inputs others have not read yet, so the input goes aside first */
    void *tmp = NULL;
    if (overlap) {
        st = cu_tmp_alloc(d, (size_t)n * ssz, &tmp);
        if (st != CA_OK) return ca_error_context("cuda kernel cast in place");
        cudaError_t e = cudaMemcpyAsync(tmp, x, (size_t)n * ssz, cudaMemcpyDeviceToDevice, d->stream);
        if (e != cudaSuccess) {
            cu_tmp_free(d, tmp);
            return cu_error_at(e, __FILE__, __LINE__, "cuda kernel cast: copying the input aside");
        }
        x = tmp;
    }
    if (same) {
        cudaError_t e = cudaMemcpyAsync(y, x, (size_t)n * ssz, cudaMemcpyDeviceToDevice, d->stream);
        if (tmp) cu_tmp_free(d, tmp);
        if (e != cudaSuccess)
            return cu_error_at(e, __FILE__, __LINE__, "cuda kernel cast (copy of %lld %s)", (long long)n,
                               ca_dtype_name(src_dt));
        return CU_LAUNCHED(d, "cast");
    }
    unsigned g = cu_grid(d, n, CU_THREADS);
    if (alpha == 1.0f && is_int(src_dt) && is_int(dst_dt))
        cast_int_k<<<g, CU_THREADS, 0, d->stream>>>(src_dt, x, dst_dt, y, n);
    else
        cast_k<<<g, CU_THREADS, 0, d->stream>>>(src_dt, x, dst_dt, y, n, alpha);
    st = CU_LAUNCHED(d, "cast");
    if (tmp) cu_tmp_free(d, tmp);
    return st;
}

/* --------------------------------------------------------- copy_strided */

struct strided_args {
    int nd;
    int64_t sh[CA_MAX_DIMS], xs[CA_MAX_DIMS], ys[CA_MAX_DIMS];
};

/* I: uint32_t where total < 2^31 (32-bit divisions), else int64_t; offsets in 64 bits. */
template <typename U, typename I>
__global__ void copy_strided_k(strided_args a, I total, const U *x, U *y) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
        I r = i;
        int64_t xo = 0, yo = 0;
        for (int dd = a.nd - 1; dd >= 0; dd--) {
            I sh = (I)a.sh[dd], c = r % sh;
            r /= sh;
            xo += (int64_t)c * a.xs[dd];
            yo += (int64_t)c * a.ys[dd];
        }
        y[yo] = x[xo];
    }
}

template <typename U>
static void copy_strided_launch(cuda_device *d, const strided_args &a, int64_t total, const void *x, void *y) {
    unsigned g = cu_grid(d, total, CU_THREADS);
    if (total < ((int64_t)1 << 31))
        copy_strided_k<U, uint32_t><<<g, CU_THREADS, 0, d->stream>>>(a, (uint32_t)total, (const U *)x, (U *)y);
    else
        copy_strided_k<U, int64_t><<<g, CU_THREADS, 0, d->stream>>>(a, total, (const U *)x, (U *)y);
}

extern "C" ca_status cu_copy_strided(void *dev, const ca_copy_strided_args *args) {
    ca_dtype dt = args->dt;
    int ndim = args->ndim;
    const int64_t *shape = args->shape;
    const void *x = args->x;
    const int64_t *x_stride = args->x_stride;
    void *y = args->y;
    const int64_t *y_stride = args->y_stride;
    cuda_device *d = (cuda_device *)dev;
    size_t es = ca_dtype_size(dt);
    strided_args a;
    a.nd = 0;
    int64_t total = 1;
    for (int k = 0; k < ndim; k++) {
        if (shape[k] == 0) return CA_OK;
        if (shape[k] == 1) continue;
        int nd = a.nd;
        if (nd > 0 && a.xs[nd - 1] == x_stride[k] * shape[k] && a.ys[nd - 1] == y_stride[k] * shape[k]) {
            a.sh[nd - 1] *= shape[k];
            a.xs[nd - 1] = x_stride[k];
            a.ys[nd - 1] = y_stride[k];
        } else {
            a.sh[nd] = shape[k];
            a.xs[nd] = x_stride[k];
            a.ys[nd] = y_stride[k];
            a.nd++;
        }
        total *= shape[k];
    }
    ca_status st = cu_enter(d, "kernel copy_strided");
    if (st != CA_OK) return st;
    if (a.nd == 0 || (a.nd == 1 && a.xs[0] == 1 && a.ys[0] == 1)) {
        CA_CUDA_TRY(cudaMemcpyAsync(y, x, (size_t)total * es, cudaMemcpyDeviceToDevice, d->stream),
                    "cuda kernel copy_strided (%lld contiguous elements)", (long long)total);
        return CU_LAUNCHED(d, "copy_strided");
    }
    switch (es) {
    case 1: copy_strided_launch<uint8_t>(d, a, total, x, y); break;
    case 2: copy_strided_launch<uint16_t>(d, a, total, x, y); break;
    case 4: copy_strided_launch<uint32_t>(d, a, total, x, y); break;
    default: copy_strided_launch<uint64_t>(d, a, total, x, y); break;
    }
    return CU_LAUNCHED(d, "copy_strided");
}

/* ------------------------------------------------- contiguous elementwise */

/* 16 bytes of storage elements: one vector load or store (4 f32, 8 f16/bf16). */
template <typename S>
union Vec16 {
    uint4 u;
    S s[16 / sizeof(S)];
};

/* y[i] = f(a[i], b[i], c[i], y[i]) over n contiguous elements; a, b, c may be NULL (read as 0), and
 * y is read only with read_y. I is the index type: uint32_t where n < 2^31 (32-bit index arithmetic;
 * i + stride stays below 2^32), else int64_t. With VEC, every pointer is 16-byte aligned and the
 * elements go in 16-byte vectors, the last n % W one by one. Each element is read before it is
 * written, by the same thread, so y may be one of the inputs. */
template <typename T, typename I, bool VEC, typename F>
__global__ void ew_k(F f, I n, const typename T::S *a, const typename T::S *b, const typename T::S *c,
                     typename T::S *y, bool read_y) {
    typedef typename T::S S;
    I tid = (I)blockIdx.x * blockDim.x + threadIdx.x, step = (I)gridDim.x * blockDim.x, start = 0;
    if (VEC) {
        const int W = 16 / sizeof(S);
        I np = n / W;
        for (I p = tid; p < np; p += step) {
            Vec16<S> va, vb, vc, vy;
            if (a) va.u = ((const uint4 *)a)[p];
            if (b) vb.u = ((const uint4 *)b)[p];
            if (c) vc.u = ((const uint4 *)c)[p];
            if (read_y) vy.u = ((const uint4 *)y)[p];
#pragma unroll
            for (int k = 0; k < W; k++)
                T::st(vy.s, k, f(a ? T::ld(va.s, k) : 0.0f, b ? T::ld(vb.s, k) : 0.0f, c ? T::ld(vc.s, k) : 0.0f,
                                 read_y ? T::ld(vy.s, k) : 0.0f));
            ((uint4 *)y)[p] = vy.u;
        }
        start = np * W;
    }
    for (I i = start + tid; i < n; i += step)
        T::st(y, i, f(a ? T::ld(a, i) : 0.0f, b ? T::ld(b, i) : 0.0f, c ? T::ld(c, i) : 0.0f,
                      read_y ? T::ld(y, i) : 0.0f));
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Launches ew_k with the index type and vector width the size and pointers allow. */
template <typename T, typename F>
static void ew_launch(cuda_device *d, F f, int64_t n, const void *a, const void *b, const void *c, void *y,
                      bool read_y) {
    typedef typename T::S S;
    const S *pa = (const S *)a, *pb = (const S *)b, *pc = (const S *)c;
    S *py = (S *)y;
    const int W = 16 / sizeof(S);
    bool vec = aligned16(a) && aligned16(b) && aligned16(c) && aligned16(y) && n >= W;
    unsigned g = cu_grid(d, vec ? n / W : n, CU_THREADS);
    bool small = n < ((int64_t)1 << 31);
    if (vec && small) ew_k<T, uint32_t, true><<<g, CU_THREADS, 0, d->stream>>>(f, (uint32_t)n, pa, pb, pc, py, read_y);
    else if (vec) ew_k<T, int64_t, true><<<g, CU_THREADS, 0, d->stream>>>(f, n, pa, pb, pc, py, read_y);
    else if (small) ew_k<T, uint32_t, false><<<g, CU_THREADS, 0, d->stream>>>(f, (uint32_t)n, pa, pb, pc, py, read_y);
    else ew_k<T, int64_t, false><<<g, CU_THREADS, 0, d->stream>>>(f, n, pa, pb, pc, py, read_y);
}

/* ----------------------------------------------------------------- unary */

/* Device code gets no -Wswitch: an op added to CA_UNARY_OP_LIST stops the build here until
 * unary_f and unary_grad_f have its case and this count is raised (likewise binary_f). */
static_assert(CA_UNARY_OP_COUNT == 17, "unary_f and unary_grad_f need a case for every ca_unary_op");
static_assert(CA_BINARY_OP_COUNT == 6, "binary_f needs a case for every ca_binary_op");

/* 2 Phi(x) = 1 + erf(x / sqrt 2), taken as erfc(-x / sqrt 2): 1 + erf cancels in the negative
 * tail (at x = -5 it kept 10% relative error), erfc keeps full relative accuracy there, as the
 * CPU's Phi (base/unary_math_impl.h) does. */
CU_D float gelu_cdf2(float x) { return erfcf(x * -0.7071067811865476f); }

/* The CPU's unary_loop for one element, operation for operation. */
CU_D float unary_f(int op, float x, float alpha) {
    switch (op) {
    case CA_UNARY_NEG: return -x;
    case CA_UNARY_RELU: return x < 0.0f ? 0.0f : x;
    case CA_UNARY_GELU_TANH: {
        float u2 = 2.0f * GELU_K * (x + GELU_C * x * x * x);
        return x / (1.0f + expf(-u2));
    }
    case CA_UNARY_TANH: return tanhf(x);
    case CA_UNARY_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case CA_UNARY_EXP: return expf(x);
    case CA_UNARY_LOG: return logf(x);
    case CA_UNARY_SQRT: return sqrtf(x);
    case CA_UNARY_RSQRT: return 1.0f / sqrtf(x);
    case CA_UNARY_ABS: return fabsf(x);
    case CA_UNARY_SQUARE: return x * x;
    case CA_UNARY_RECIP: return 1.0f / x;
    case CA_UNARY_SCALE: return alpha * x;
    case CA_UNARY_ADD_SCALAR: return x + alpha;
    case CA_UNARY_POW:
        if (alpha == 2.0f) return x * x;
        if (alpha == 1.0f) return x;
        if (alpha == 0.5f) return sqrtf(x);
        return powf(x, alpha);
    case CA_UNARY_GELU_ERF: return 0.5f * x * gelu_cdf2(x);
    case CA_UNARY_SILU: return x / (1.0f + expf(-x));
    default: return x;
    }
}

struct UnaryF {
    int op;
    float alpha;
    __device__ __forceinline__ float operator()(float x, float, float, float) const { return unary_f(op, x, alpha); }
};

extern "C" ca_status cu_unary(void *dev, const ca_unary_args *args) {
    ca_unary_op op = args->op;
    ca_dtype dt = args->dt;
    int64_t n = args->n;
    const void *x = args->x;
    void *y = args->y;
    float alpha = args->alpha;
    cuda_device *d = (cuda_device *)dev;
    if (n == 0) return CA_OK;
    size_t bytes = (size_t)n * ca_dtype_size(dt);
    if (x != y && (uintptr_t)y < (uintptr_t)x + bytes && (uintptr_t)x < (uintptr_t)y + bytes)
        return ca_error(CA_ERR_INVALID, "cuda kernel unary %s: y partly overlaps x", ca_unary_op_name(op));
    ca_status st = cu_enter(d, "kernel unary");
    if (st != CA_OK) return st;
    UnaryF f = {(int)op, alpha};
    CU_FLOAT_SWITCH(dt, T, ew_launch<T>(d, f, n, x, NULL, NULL, y, false));
    return CU_LAUNCHED(d, "unary");
}

/* The CPU's unary_grad for one element. */
CU_D float unary_grad_f(int op, float x, float y, float dy, float alpha) {
    switch (op) {
    case CA_UNARY_NEG: return -dy;
    case CA_UNARY_RELU: return y > 0.0f ? dy : 0.0f;
    case CA_UNARY_GELU_TANH: {
        float u2 = 2.0f * GELU_K * (x + GELU_C * x * x * x);
        float s = 1.0f / (1.0f + expf(-u2));
        float du2 = 2.0f * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
        return dy * (s + x * s * (1.0f - s) * du2);
    }
    case CA_UNARY_TANH: return dy * (1.0f - y * y);
    case CA_UNARY_SIGMOID: return dy * y * (1.0f - y);
    case CA_UNARY_EXP: return dy * y;
    case CA_UNARY_LOG: return dy / x;
    case CA_UNARY_SQRT: return dy * 0.5f / y;
    case CA_UNARY_RSQRT: return dy * -0.5f / (x * sqrtf(x));
    case CA_UNARY_ABS: return x > 0.0f ? dy : (x < 0.0f ? -dy : 0.0f);
    case CA_UNARY_SQUARE: return dy * 2.0f * x;
    case CA_UNARY_RECIP: return -dy / (x * x);
    case CA_UNARY_SCALE: return dy * alpha;
    case CA_UNARY_ADD_SCALAR: return dy;
    case CA_UNARY_POW:
        if (alpha == 2.0f) return dy * 2.0f * x;
        if (alpha == 1.0f) return dy;
        return dy * alpha * powf(x, alpha - 1.0f);
    case CA_UNARY_GELU_ERF:
        return dy * (0.5f * gelu_cdf2(x) + x * 0.3989422804014327f * expf(-0.5f * x * x));
    case CA_UNARY_SILU: {
        float s = 1.0f / (1.0f + expf(-x));
        return dy * s * (1.0f + x * (1.0f - s));
    }
    default: return dy;
    }
}

/* out = beta out + g, beta == 0 not reading out (the CPU's accumulate_f32). */
CU_D float accumulate(float out, float g, float beta) {
    if (beta == 0.0f) return g;
    if (beta == 1.0f) return out + g;
    return beta * out + g;
}

/* dx = beta dx + grad(x, y, dy); x or y NULL (read as 0) where the op does not need it. */
struct UnaryBwdF {
    int op;
    float alpha, beta;
    __device__ __forceinline__ float operator()(float x, float y, float dy, float dx) const {
        return accumulate(dx, unary_grad_f(op, x, y, dy, alpha), beta);
    }
};

static bool reads_y(ca_unary_op op) {
    return op == CA_UNARY_RELU || op == CA_UNARY_TANH || op == CA_UNARY_SIGMOID || op == CA_UNARY_EXP ||
           op == CA_UNARY_SQRT;
}

static bool reads_input(ca_unary_op op) {
    return !(op == CA_UNARY_NEG || op == CA_UNARY_SCALE || op == CA_UNARY_ADD_SCALAR);
}

extern "C" ca_status cu_unary_backward(void *dev, const ca_unary_backward_args *args) {
    ca_unary_op op = args->op;
    ca_dtype dt = args->dt;
    int64_t n = args->n;
    const void *x = args->x;
    const void *y = args->y;
    const void *dy = args->dy;
    void *dx = args->dx;
    float alpha = args->alpha;
    float beta = args->beta;
    cuda_device *d = (cuda_device *)dev;
    const char *name = ca_unary_op_name(op);
    if (n == 0) return CA_OK;
    bool need_y = reads_y(op), need_x = !need_y && reads_input(op);
    ca_status st = cu_enter(d, "kernel unary_backward");
    if (st != CA_OK) return st;
    const void *xs = need_x ? x : NULL, *ys = need_y ? y : NULL;
    UnaryBwdF f = {(int)op, alpha, beta};
    CU_FLOAT_SWITCH(dt, T, ew_launch<T>(d, f, n, xs, ys, dy, dx, beta != 0.0f));
    return CU_LAUNCHED(d, "unary_backward");
}

/* ---------------------------------------------------------------- binary */

struct bcast_args {
    int nd;
    int64_t sh[CA_MAX_DIMS], as[CA_MAX_DIMS], bs[CA_MAX_DIMS];
};

CU_D float binary_f(int op, float av, float bv) {
    switch (op) {
    case CA_BINARY_ADD: return av + bv;
    case CA_BINARY_SUB: return av - bv;
    case CA_BINARY_MUL: return av * bv;
    case CA_BINARY_DIV: return av / bv;
    case CA_BINARY_MAX: return (av > bv || av != av) ? av : bv;   /* NaN propagates, as torch.maximum */
    case CA_BINARY_MIN: return (av < bv || av != av) ? av : bv;
    default: return av;
    }
}

/* I: uint32_t where total < 2^31 (32-bit divisions, several times cheaper), else int64_t. */
template <typename T, typename I>
__global__ void binary_k(int op, bcast_args a, I total, const typename T::S *x, const typename T::S *z,
                         typename T::S *y) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
        I r = i;
        int64_t ao = 0, bo = 0;
        for (int dd = a.nd - 1; dd >= 0; dd--) {
            I sh = (I)a.sh[dd], c = r % sh;
            r /= sh;
            ao += (int64_t)c * a.as[dd];
            bo += (int64_t)c * a.bs[dd];
        }
        T::st(y, i, binary_f(op, T::ld(x, ao), T::ld(z, bo)));
    }
}

/* Both operands contiguous and of y's shape. */
struct BinaryF {
    int op;
    __device__ __forceinline__ float operator()(float a, float b, float, float) const { return binary_f(op, a, b); }
};

extern "C" ca_status cu_binary(void *dev, const ca_binary_args *args) {
    ca_binary_op op = args->op;
    ca_dtype dt = args->dt;
    const ca_bcast_args *shape = &args->shape;
    const void *a = args->a;
    const void *b = args->b;
    void *y = args->y;
    cuda_device *d = (cuda_device *)dev;
    const char *name = ca_binary_op_name(op);
    bcast_args m;
    m.nd = 0;
    int64_t total = 1;
    for (int k = 0; k < shape->ndim; k++) {
        int64_t s = shape->shape[k];
        if (s == 0) return CA_OK;
        if (s == 1) continue;
        int nd = m.nd;
        if (nd > 0 && m.as[nd - 1] == shape->a_stride[k] * s && m.bs[nd - 1] == shape->b_stride[k] * s) {
            m.sh[nd - 1] *= s;
            m.as[nd - 1] = shape->a_stride[k];
            m.bs[nd - 1] = shape->b_stride[k];
        } else {
            m.sh[nd] = s;
            m.as[nd] = shape->a_stride[k];
            m.bs[nd] = shape->b_stride[k];
            m.nd++;
        }
        total *= s;
    }
    if (m.nd == 0) {
        m.nd = 1;
        m.sh[0] = 1;
        m.as[0] = m.bs[0] = 0;
    }
    ca_status st = cu_enter(d, "kernel binary");
    if (st != CA_OK) return st;
    unsigned g = cu_grid(d, total, CU_THREADS);
    bool flat = m.nd == 1 && m.as[0] == 1 && m.bs[0] == 1;
    BinaryF f = {(int)op};
    if (flat)
        CU_FLOAT_SWITCH(dt, T, ew_launch<T>(d, f, total, a, b, NULL, y, false))
    else if (total < ((int64_t)1 << 31))
        CU_FLOAT_SWITCH(dt, T, binary_k<T, uint32_t><<<g, CU_THREADS, 0, d->stream>>>((int)op, m, (uint32_t)total,
            (const T::S *)a, (const T::S *)b, (T::S *)y))
    else
        CU_FLOAT_SWITCH(dt, T, binary_k<T, int64_t><<<g, CU_THREADS, 0, d->stream>>>((int)op, m, total,
            (const T::S *)a, (const T::S *)b, (T::S *)y))
    return CU_LAUNCHED(d, "binary");
}

/* ----------------------------------------------------------------- axpby */

/* y = alpha x + beta y, y not read when beta == 0. */
struct AxpbyF {
    float alpha, beta;
    __device__ __forceinline__ float operator()(float xv, float, float, float yv) const {
        if (beta == 0.0f) return alpha == 1.0f ? xv : alpha * xv;
        if (alpha == 1.0f && beta == 1.0f) return yv + xv;
        return alpha * xv + beta * yv;
    }
};

extern "C" ca_status cu_axpby(void *dev, const ca_axpby_args *args) {
    ca_dtype dt = args->dt;
    int64_t n = args->n;
    float alpha = args->alpha;
    const void *x = args->x;
    float beta = args->beta;
    void *y = args->y;
    cuda_device *d = (cuda_device *)dev;
    if (n == 0) return CA_OK;
    ca_status st = cu_enter(d, "kernel axpby");
    if (st != CA_OK) return st;
    AxpbyF f = {alpha, beta};
    CU_FLOAT_SWITCH(dt, T, ew_launch<T>(d, f, n, x, NULL, NULL, y, beta != 0.0f));
    return CU_LAUNCHED(d, "axpby");
}

/* ------------------------------------------------------ GEMM C = beta C */

template <typename T>
__global__ void scale_c_k(int64_t m, int64_t n, int64_t ldc, int64_t stride_c, int64_t batch, float beta,
                          typename T::S *c) {
    int64_t total = batch * m * n;
    CU_GRID_LOOP(i, total) {
        int64_t j = i % n, r = i / n, row = r % m, bi = r / m;
        int64_t off = bi * stride_c + row * ldc + j;
        T::st(c, off, beta == 0.0f ? 0.0f : beta * T::ld(c, off));
    }
}

extern "C" ca_status cu_gemm_scale_c(cuda_device *d, ca_dtype dt, int64_t m, int64_t n, int64_t ldc,
                                     int64_t stride_c, int64_t batch, float beta, void *c) {
    if (beta == 1.0f) return CA_OK;
    int64_t total = batch * m * n;
    unsigned g = cu_grid(d, total, CU_THREADS);
    CU_FLOAT_SWITCH(dt, T, scale_c_k<T><<<g, CU_THREADS, 0, d->stream>>>(m, n, ldc, stride_c, batch, beta, (T::S *)c));
    return CU_LAUNCHED(d, "gemm");
}

/* ---------------------------------------------------------------- swiglu */

/* y = silu(gate) up, silu as unary_f computes it. */
struct SwigluF {
    __device__ __forceinline__ float operator()(float g, float u, float, float) const {
        return g / (1.0f + expf(-g)) * u;
    }
};

extern "C" ca_status cu_swiglu(void *dev, const ca_swiglu_args *a) {
    cuda_device *d = (cuda_device *)dev;
    if (a->n == 0) return CA_OK;
    ca_status st = cu_enter(d, "kernel swiglu");
    if (st != CA_OK) return st;
    CU_FLOAT_SWITCH(a->dt, T, ew_launch<T>(d, SwigluF(), a->n, a->gate, a->up, NULL, a->y, false));
    return CU_LAUNCHED(d, "swiglu");
}

/* Both gradients of one element (the CPU's swiglu_grad_f32), each added to its output's old value. */
struct SwigluBwdF {
    float bg, bu;
    __device__ __forceinline__ void operator()(float g, float u, float dy, float og, float ou, float *dg,
                                               float *du) const {
        float den = 1.0f + expf(-g), s = 1.0f / den;
        *dg = accumulate(og, dy * u * s * (1.0f + g * (1.0f - s)), bg);
        *du = accumulate(ou, dy * (g / den), bu);
    }
};

/* ew_k with two outputs: dgate and dup (either NULL), 16-byte vectors with VEC, index type I. */
template <typename T, typename I, bool VEC>
__global__ void swiglu_bwd_k(SwigluBwdF f, I n, const typename T::S *g, const typename T::S *u,
                             const typename T::S *dy, typename T::S *dg, typename T::S *du) {
    typedef typename T::S S;
    I tid = (I)blockIdx.x * blockDim.x + threadIdx.x, step = (I)gridDim.x * blockDim.x, start = 0;
    bool rg = dg && f.bg != 0.0f, ru = du && f.bu != 0.0f;
    float og = 0.0f, ou = 0.0f, rdg, rdu;
    if (VEC) {
        const int W = 16 / sizeof(S);
        I np = n / W;
        for (I p = tid; p < np; p += step) {
            Vec16<S> vg, vu, vd, vog, vou;
            vg.u = ((const uint4 *)g)[p];
            vu.u = ((const uint4 *)u)[p];
            vd.u = ((const uint4 *)dy)[p];
            if (rg) vog.u = ((const uint4 *)dg)[p];
            if (ru) vou.u = ((const uint4 *)du)[p];
#pragma unroll
            for (int k = 0; k < W; k++) {
                f(T::ld(vg.s, k), T::ld(vu.s, k), T::ld(vd.s, k), rg ? T::ld(vog.s, k) : 0.0f,
                  ru ? T::ld(vou.s, k) : 0.0f, &rdg, &rdu);
                T::st(vog.s, k, rdg);
                T::st(vou.s, k, rdu);
            }
            if (dg) ((uint4 *)dg)[p] = vog.u;
            if (du) ((uint4 *)du)[p] = vou.u;
        }
        start = np * W;
    }
    for (I i = start + tid; i < n; i += step) {
        if (rg) og = T::ld(dg, i);
        if (ru) ou = T::ld(du, i);
        f(T::ld(g, i), T::ld(u, i), T::ld(dy, i), og, ou, &rdg, &rdu);
        if (dg) T::st(dg, i, rdg);
        if (du) T::st(du, i, rdu);
    }
}

template <typename T>
static void swiglu_bwd_launch(cuda_device *d, const ca_swiglu_backward_args *a) {
    typedef typename T::S S;
    int64_t n = a->n;
    const int W = 16 / sizeof(S);
    bool vec = aligned16(a->gate) && aligned16(a->up) && aligned16(a->dy) && aligned16(a->dgate) &&
               aligned16(a->dup) && n >= W;
    unsigned grid = cu_grid(d, vec ? n / W : n, CU_THREADS);
    bool small = n < ((int64_t)1 << 31);
    SwigluBwdF f = {a->beta_gate, a->beta_up};
    const S *g = (const S *)a->gate, *u = (const S *)a->up, *dy = (const S *)a->dy;
    S *dg = (S *)a->dgate, *du = (S *)a->dup;
    dim3 gr(grid), th(CU_THREADS);
    if (vec && small) swiglu_bwd_k<T, uint32_t, true><<<gr, th, 0, d->stream>>>(f, (uint32_t)n, g, u, dy, dg, du);
    else if (vec) swiglu_bwd_k<T, int64_t, true><<<gr, th, 0, d->stream>>>(f, n, g, u, dy, dg, du);
    else if (small) swiglu_bwd_k<T, uint32_t, false><<<gr, th, 0, d->stream>>>(f, (uint32_t)n, g, u, dy, dg, du);
    else swiglu_bwd_k<T, int64_t, false><<<gr, th, 0, d->stream>>>(f, n, g, u, dy, dg, du);
}

extern "C" ca_status cu_swiglu_backward(void *dev, const ca_swiglu_backward_args *a) {
    cuda_device *d = (cuda_device *)dev;
    if (a->n == 0) return CA_OK;
    ca_status st = cu_enter(d, "kernel swiglu_backward");
    if (st != CA_OK) return st;
    CU_FLOAT_SWITCH(a->dt, T, swiglu_bwd_launch<T>(d, a));
    return CU_LAUNCHED(d, "swiglu_backward");
}
