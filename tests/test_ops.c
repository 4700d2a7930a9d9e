/* Op conformance: one table, one row per op case, run through the public ops API on every device
 * that opens (cpu, the lazy xla device, cuda) and compared with the CPU: forward, backward, and
 * backward against central finite differences on every device. docs/TESTING.md, "test_ops". */
#include "test_util.h"
#include "test_ulp.h"

#include <caccel/backend.h>   /* the registry: why the cuda device is not there */

/* A row names its leading fields in order and only the rest it sets: the others are zero. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

/* ------------------------------------------------------------------ the table's vocabulary */

/* Dtype sets of a row, one bit per ca_dtype. */
#define B(dt) (1u << (dt))
#define FLT (B(CA_F32) | B(CA_F16) | B(CA_BF16))
#define F32 B(CA_F32)
#define ANY (FLT | B(CA_I32) | B(CA_I64) | B(CA_U8))

/* What a builder gets: the device the inputs are on, the row's dtype, the row's context. */
typedef struct oc_call {
    ca_device *dev;
    ca_dtype dt;
    const void *ctx;
} oc_call;
typedef ca_tensor *(*oc_build)(ca_tensor **in, const oc_call *c);
/* Fills n raw values of dt (an input's data). */
typedef void (*oc_gen)(ca_dtype dt, void *raw, int64_t n, uint64_t *seed, const void *arg);

typedef struct oc_in {
    int ndim;
    int64_t shape[4];
    float lo, hi, gap;         /* uniform values in [lo, hi), |v| >= gap (default generator) */
    ca_dtype fixed;            /* with is_fixed: this dtype, not the row's, and never differentiated */
    bool is_fixed;
    oc_gen gen;                /* NULL: uniform */
    const void *arg;           /* the generator's argument, or the literal data when gen is NULL */
} oc_in;

/* A tolerance of the cuda column against the CPU. All zero: bit for bit. Else
 * |dev - cpu| <= atol + rtol |cpu| (a half type: rtol at least 2 of its ulps, atol at least 1e-3);
 * bound (f32 only): its own limit per element. why: one line, the reason. */
typedef struct oc_tol {
    double rtol, atol;         /* f32 (and the half types unless f16/bf16 say) */
    double f16, bf16;          /* half types: |dev - cpu| <= v (1 + |cpu|) */
    double ulps;               /* half types: at most this many units in the last place */
    double (*bound)(const float *x, const float *ref, int64_t i, int64_t cols);
    const char *why;
} oc_tol;

#define MAXIN 6   /* inputs of a row */

typedef struct op_case {
    const char *name;
    oc_build build;
    const void *ctx;
    int nin;
    oc_in in[MAXIN];
    unsigned dtypes;           /* the row's dtypes; float inputs are made in it */
    bool grad;                 /* differentiable: backward against the CPU, and finite differences */
    bool rng;                  /* the generator is reset before every forward (dropout) */
    double fd_eps, fd_atol, fd_rtol;   /* finite differences (f32); zero: eps 1e-2, atol 2e-3, rtol 2e-2 */
    const char *no_fd;         /* finite differences not run, and why */
    oc_tol fwd, bwd;           /* the cuda column (xla runs the CPU's kernels: always bit for bit) */
    double min_identical;      /* fraction of the cuda forward that must still be bit-identical */
    const char *error;         /* the op must fail on every device with this in the message */
} op_case;

/* ------------------------------------------------------------------ devices */

/* DEV_COUNT, outside the columns: the CPU's kernels behind a table that records which slots the op
 * rows reach (the coverage check at the end). */
enum { DEV_CPU, DEV_XLA, DEV_CUDA, ND, DEV_COUNT = ND };
static const char *dev_name[ND + 1] = {"cpu", "xla", "cuda", "count"};
static ca_device *devs[ND + 1];
static char skip_reason[ND][512];

static void open_cuda(void) {
    char path[4096];
    const char *b = getenv("CACCEL_TEST_BUILDDIR");
    snprintf(path, sizeof path, "%s/backends/cuda/.libs/caccel_cuda.so", b && *b ? b : ".");
    if (access(path, R_OK) != 0) {
        snprintf(skip_reason[DEV_CUDA], sizeof skip_reason[0], "the CUDA plugin is not built (%s)", path);
        return;
    }
    if (ca_registry_load_plugin_file(path) != CA_OK) {   /* the build made it: it must load */
        fprintf(stderr, "FAIL: cannot load the CUDA plugin %s: %s\n", path, ca_last_error());
        exit(1);
    }
    const ca_device_ops *ops = ca_registry_device("cuda");
    int n = 0;
    char reason[400] = "";
    if (!ops) {   /* the registry refuses an unusable backend: its reason is in the listing */
        ca_clear_error();
        for (int i = 0; i < ca_registry_count(); i++) {
            ca_backend_info bi;
            if (ca_registry_get(i, &bi) == CA_OK && bi.kind == CA_BACKEND_DEVICE && strcmp(bi.name, "cuda") == 0)
                snprintf(reason, sizeof reason, "%s", bi.reason);
        }
    } else if (ops->device_count(&n, reason, sizeof reason) != CA_OK) {
        n = 0;
    }
    if (n == 0) {
        snprintf(skip_reason[DEV_CUDA], sizeof skip_reason[0], "no GPU: %s", reason[0] ? reason : "no CUDA device");
        return;
    }
    ca_device_open_args args = {.struct_size = sizeof args, .local_rank = -1};
    if (ca_device_open("cuda", 0, &args, &devs[DEV_CUDA]) != CA_OK) {
        fprintf(stderr, "FAIL: a GPU is visible but cannot be opened: %s\n", ca_last_error());
        exit(1);
    }
}

/* The slots, numbered as in CA_KERNEL_LIST: a new slot is a new number, and the coverage check at the
 * end fails until an op row reaches it or a kernel row runs it. */
#define KS_ENUM_(s) KS_##s,
enum { CA_KERNEL_LIST(KS_ENUM_) KS_COUNT };
#undef KS_ENUM_
#define KS_NAME_(s) #s,
static const char *const slot_name[KS_COUNT] = {CA_KERNEL_LIST(KS_NAME_)};
#undef KS_NAME_
static bool slot_covered[KS_COUNT];

static const ca_kernels *cpu_kernels;
#define KS_COUNTING_(s) \
    static ca_status count_##s(void *dev, const ca_##s##_args *a) { slot_covered[KS_##s] = true; \
                                                                      return cpu_kernels->s(dev, a); }
CA_KERNEL_LIST(KS_COUNTING_)
#undef KS_COUNTING_

/* The "count" device: the CPU's device with every kernel slot counted. */
static void open_counting(void) {
    static ca_kernels k;
    static ca_device_ops ops;
    static const ca_device_ops *list[1];
    static ca_plugin p;
    ops = *ca_device_ops_of(ca_cpu_device());
    cpu_kernels = ops.kernels;
    k = *cpu_kernels;
#define KS_SET_(s) k.s = count_##s;
    CA_KERNEL_LIST(KS_SET_)
#undef KS_SET_
    ops.name = "count";
    ops.kernels = &k;
    list[0] = &ops;
    p = (ca_plugin){.struct_size = sizeof p, .abi_version = ops.abi_version, .name = "count", .version = "test",
                    .num_devices = 1, .devices = list};
    T_OK(ca_register_plugin(&p, "test_ops"));
    T_OK(ca_device_open("count", 0, NULL, &devs[DEV_COUNT]));
}

static void open_devices(void) {
    devs[DEV_CPU] = ca_cpu_device();
    if (ca_device_open("xla", 0, NULL, &devs[DEV_XLA]) != CA_OK) {   /* built in: always there */
        fprintf(stderr, "FAIL: cannot open the xla device: %s\n", ca_last_error());
        exit(1);
    }
    open_cuda();
    open_counting();
    for (int d = 0; d < ND; d++) {
        if (devs[d]) printf("test_ops: %s: %s\n", dev_name[d], ca_device_description(devs[d]));
        else printf("SKIP %s: %s\n", dev_name[d], skip_reason[d]);
    }
}

/* ------------------------------------------------------------------ inputs */

static int64_t in_numel(const oc_in *s) {
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->shape[i];
    return n;
}

/* f32 values rounded to dt by the CPU's cast (the reference's rounding). */
static void from_f32(ca_dtype dt, const float *v, int64_t n, void *raw) {
    if (dt == CA_F32) {
        memcpy(raw, v, (size_t)n * 4);
        return;
    }
    CA_SCOPE {
        ca_tensor *t = T_NN(ca_from_host(ca_cpu_device(), CA_F32, 1, (int64_t[]){n}, v));
        T_OK(ca_tensor_to_host(T_NN(ca_cast(t, dt)), raw, (size_t)n * ca_dtype_size(dt)));
    }
}

/* The default generator: uniform floats (or integers) in [lo, hi), |v| >= gap. */
static void gen_uniform(ca_dtype dt, void *raw, int64_t n, uint64_t *seed, const oc_in *s) {
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) {
        do v[i] = t_randf(seed, s->lo, s->hi); while (fabsf(v[i]) < s->gap);
        if (!ca_dtype_is_float(dt)) v[i] = floorf(v[i]);
    }
    from_f32(dt, v, n, raw);
    free(v);
}

/* The CPU tensor of input s for a row run in dtype dt. */
static ca_tensor *make_input(const oc_in *s, ca_dtype row_dt, uint64_t *seed) {
    ca_dtype dt = s->is_fixed ? s->fixed : row_dt;
    int64_t n = in_numel(s);
    void *raw = malloc((size_t)(n ? n : 1) * ca_dtype_size(dt));
    if (s->gen) s->gen(dt, raw, n, seed, s->arg);
    else if (s->arg) memcpy(raw, s->arg, (size_t)n * ca_dtype_size(dt));
    else gen_uniform(dt, raw, n, seed, s);
    ca_tensor *t = T_NN(ca_from_host(ca_cpu_device(), dt, s->ndim, s->shape, raw));
    free(raw);
    return t;
}

static bool differentiated(const op_case *r, int i, ca_dtype dt) {
    return r->grad && !r->in[i].is_fixed && ca_dtype_is_float(dt);
}

/* ------------------------------------------------------------------ one run on one device */

typedef struct oc_result {
    ca_dtype dt;               /* of the output */
    int64_t n;
    void *raw;                 /* the output's bytes */
    int64_t cols;              /* the output's last dimension */
    void *grad[MAXIN];         /* the inputs' gradients (bytes in the input's dtype) */
    ca_dtype gdt[MAXIN];
    int64_t gn[MAXIN];
    ca_tensor *in[MAXIN];      /* the inputs on the device (persistent; freed by result_free) */
} oc_result;

static void *host_bytes(ca_tensor *t) {
    size_t bytes = ca_tensor_nbytes(t);
    void *h = malloc(bytes ? bytes : 1);
    T_OK(ca_tensor_to_host(T_NN(ca_contiguous(t)), h, bytes));
    return h;
}

/* Weights of the loss sum(w * out): fixed for a row, the same on every device. */
static float *loss_weights(int64_t n) {
    uint64_t s = 0x9e3779b97f4a7c15ull;
    float *w = malloc((size_t)(n ? n : 1) * sizeof *w);
    for (int64_t i = 0; i < n; i++) w[i] = t_randf(&s, -1.0f, 1.0f);
    return w;
}

static ca_tensor *forward(const op_case *r, ca_tensor **in, const oc_call *c) {
    if (r->rng) ca_rng_set_state(7, 0);
    return r->build(in, c);
}

/* Forward (and backward with sum(w * out)) of row r in dtype dt on dev, from the CPU inputs. */
static bool run_on(const op_case *r, ca_dtype dt, int d, ca_tensor **cpu_in, oc_result *res) {
    ca_device *dev = devs[d];
    memset(res, 0, sizeof *res);
    for (int i = 0; i < r->nin; i++) {
        T_OK(ca_tensor_to_device(cpu_in[i], dev, &res->in[i]));
        ca_tensor_set_requires_grad(res->in[i], differentiated(r, i, ca_tensor_dtype(cpu_in[i])));
    }
    oc_call c = {.dev = dev, .dt = dt, .ctx = r->ctx};
    bool ok = true;
    CA_SCOPE {
        ca_tensor *out = forward(r, res->in, &c);
        if (out) {
            res->dt = ca_tensor_dtype(out);
            res->n = ca_tensor_numel(out);
            res->cols = ca_tensor_ndim(out) ? ca_tensor_dim(out, -1) : 1;
            size_t bytes = ca_tensor_nbytes(out);
            res->raw = malloc(bytes ? bytes : 1);
            ca_status s = ca_tensor_to_host(T_NN(ca_contiguous(ca_detach(out))), res->raw, bytes);
            if (s != CA_OK) ok = false;
        } else {
            ok = false;
        }
        if (ok && r->grad && ca_tensor_requires_grad(out)) {
            if (ca_tensor_device(out) != dev) fail_msg("%s: the output is not on %s", r->name, dev_name[d]);
            float *w = loss_weights(res->n);
            ca_tensor *w32 = T_NN(ca_from_host(dev, CA_F32, ca_tensor_ndim(out), ca_tensor_shape(out), w));
            ca_tensor *wt = T_NN(ca_cast(w32, res->dt));
            free(w);
            T_OK(ca_autograd_backward_with(out, wt));
            for (int i = 0; i < r->nin; i++) {
                if (!ca_tensor_requires_grad(res->in[i])) continue;
                ca_tensor *g = ca_tensor_grad(res->in[i]);
                if (!g) fail_msg("%s (%s) on %s: input %d got no gradient", r->name, ca_dtype_name(dt), dev_name[d], i);
                if (ca_tensor_device(g) != dev) fail_msg("%s: the gradient of input %d is not on %s", r->name, i,
                    dev_name[d]);
                res->gdt[i] = ca_tensor_dtype(g);
                res->gn[i] = ca_tensor_numel(g);
                res->grad[i] = host_bytes(g);
            }
        }
    }
    return ok;
}

static void result_free(oc_result *res) {
    free(res->raw);
    for (int i = 0; i < MAXIN; i++) {
        free(res->grad[i]);
        ca_tensor_free(res->in[i]);
    }
    memset(res, 0, sizeof *res);
}

/* ------------------------------------------------------------------ comparisons */

static float *to_f32(ca_dtype dt, const void *raw, int64_t n) {
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    CA_SCOPE {
        ca_tensor *t = T_NN(ca_from_host(ca_cpu_device(), dt, 1, (int64_t[]){n}, raw));
        T_OK(ca_tensor_to_host(T_NN(ca_cast(t, CA_F32)), f, (size_t)n * 4));
    }
    return f;
}

#define ulp_of t_ulp_of   /* tests/test_ulp.h */

static bool tol_exact(const oc_tol *t) {
    return t->rtol == 0 && t->atol == 0 && t->f16 == 0 && t->bf16 == 0 && t->ulps == 0 && !t->bound;
}

/* The limit of |dev - cpu| at a reference value a (element i). */
static double limit(const oc_tol *t, ca_dtype dt, const float *x, const float *ref, int64_t i, int64_t cols) {
    double a = fabs((double)ref[i]);
    if (dt == CA_F32) return t->bound ? t->bound(x, ref, i, cols) : t->atol + t->rtol * a;
    if (t->ulps) return t->ulps * ulp_of(dt, a);
    double h = dt == CA_F16 ? t->f16 : t->bf16;
    if (h) return h * (1 + a);
    double r = t->rtol > 2 * ulp_of(dt, 1.0) ? t->rtol : 2 * ulp_of(dt, 1.0);
    return (t->atol > 1e-3 ? t->atol : 1e-3) + r * a;
}

/* Whether the bits of one element of float type dt are a NaN. */
static bool nan_bits(ca_dtype dt, uint64_t v) {
    switch (dt) {
    case CA_F32: return (v & 0x7fffffffu) > 0x7f800000u;
    case CA_F16: return (v & 0x7fffu) > 0x7c00u;
    case CA_BF16: return (v & 0x7fffu) > 0x7f80u;
    default: return false;
    }
}

static void compare(const char *what, const oc_tol *t, ca_dtype dt, const void *ref, const void *got, int64_t n,
                    const float *x, int64_t cols) {
    size_t es = ca_dtype_size(dt);
    if (tol_exact(t) || !ca_dtype_is_float(dt)) {
        if (memcmp(ref, got, (size_t)n * es) == 0) return;
        for (int64_t i = 0; i < n; i++)
            if (memcmp((const char *)ref + i * es, (const char *)got + i * es, es) != 0) {
                uint64_t a = 0, b = 0;
                memcpy(&a, (const char *)ref + i * es, es);
                memcpy(&b, (const char *)got + i * es, es);
                /* NaN payloads are the device's: CUDA's arithmetic gives 0x7fffffff where x86 gives
                 * 0x7fc00000. Any NaN matches any NaN, as torch.testing's equal_nan. */
                if (ca_dtype_is_float(dt) && nan_bits(dt, a) && nan_bits(dt, b)) continue;
                fail_msg("%s: element %lld differs: cpu bits 0x%llx, got 0x%llx", what, (long long)i,
                         (unsigned long long)a, (unsigned long long)b);
            }
    }
    float *a = to_f32(dt, ref, n), *b = to_f32(dt, got, n);
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i]) || isinf(a[i]) || isinf(b[i])) {
            if (!(isnan(a[i]) && isnan(b[i])) && a[i] != b[i])
                fail_msg("%s: element %lld: cpu %g, got %g", what, (long long)i, a[i], b[i]);
            continue;
        }
        double d = fabs((double)a[i] - (double)b[i]);
        double lim = limit(t, dt, x, a, i, cols);
        if (!(d <= lim))
            fail_msg("%s: element %lld: cpu %.9g, got %.9g (|diff| %.3g > %.3g: %s)", what, (long long)i, a[i], b[i], d,
                     lim, t->why ? t->why : "");
    }
    free(a);
    free(b);
}

static const oc_tol EXACT = {0};

/* The cuda column against the CPU: forward and each gradient. */
static void compare_results(const op_case *r, ca_dtype dt, int d, const oc_result *ref, const oc_result *got,
                            ca_tensor **cpu_in) {
    char what[256];
    const oc_tol *fwd = d == DEV_CUDA ? &r->fwd : &EXACT, *bwd = d == DEV_CUDA ? &r->bwd : &EXACT;
    snprintf(what, sizeof what, "%s (%s) forward on %s", r->name, ca_dtype_name(dt), dev_name[d]);
    if (ref->n != got->n || ref->dt != got->dt) fail_msg("%s: %lld %s values, cpu %lld %s", what, (long long)got->n,
                                                         ca_dtype_name(got->dt), (long long)ref->n,
                                                             ca_dtype_name(ref->dt));
    float *x = NULL;
    if (fwd->bound && r->nin > 0) {   /* the bound reads the input */
        void *raw = host_bytes(cpu_in[0]);
        x = to_f32(ca_tensor_dtype(cpu_in[0]), raw, ca_tensor_numel(cpu_in[0]));
        free(raw);
    }
    compare(what, fwd, ref->dt, ref->raw, got->raw, ref->n, x, ref->cols);
    free(x);
    if (r->min_identical > 0 && d == DEV_CUDA) {
        size_t es = ca_dtype_size(ref->dt);
        int64_t same = 0;
        for (int64_t i = 0; i < ref->n; i++)
            same += memcmp((char *)ref->raw + i * es, (char *)got->raw + i * es, es) == 0;
        if (same < r->min_identical * (double)ref->n)
            fail_msg("%s: only %lld of %lld values bit-identical", what, (long long)same, (long long)ref->n);
    }
    for (int i = 0; i < r->nin; i++) {
        if (!ref->grad[i] && !got->grad[i]) continue;
        snprintf(what, sizeof what, "%s (%s) d/d input %d on %s", r->name, ca_dtype_name(dt), i, dev_name[d]);
        if (!ref->grad[i] || !got->grad[i]) fail_msg("%s: a gradient on one device only", what);
        compare(what, bwd, ref->gdt[i], ref->grad[i], got->grad[i], ref->gn[i], NULL, 0);
    }
}

/* ------------------------------------------------------------------ finite differences */

/* sum(w * f(in)) without a tape, accumulated in double on the host. */
static double loss_at(const op_case *r, ca_tensor **in, const oc_call *c, const float *w) {
    double l = 0;
    CA_SCOPE {
        CA_NO_GRAD {
            ca_tensor *out = forward(r, in, c);
            if (!out) fail_msg("%s: forward failed: %s", r->name, ca_last_error());
            float *h = t_host(T_NN(ca_cast(ca_detach(out), CA_F32)));
            for (int64_t i = 0; i < ca_tensor_numel(out); i++) l += (double)h[i] * w[i];
            free(h);
        }
    }
    return l;
}

/* Backward on device d against central differences at up to 48 elements of each input (f32); under
 * valgrind, which checks memory, not numbers, 6 (each path still runs). */
static void finite_differences(const op_case *r, int d, oc_result *res) {
    double eps = r->fd_eps ? r->fd_eps : 1e-2, atol = r->fd_atol ? r->fd_atol : 2e-3;
    double rtol = r->fd_rtol ? r->fd_rtol : 2e-2;
    oc_call c = {.dev = devs[d], .dt = CA_F32, .ctx = r->ctx};
    float *w = loss_weights(res->n);
    for (int i = 0; i < r->nin; i++) {
        if (!res->grad[i]) continue;
        ca_tensor *t = res->in[i];
        float *x = t_host(t), *g = to_f32(res->gdt[i], res->grad[i], res->gn[i]);
        int64_t samples = getenv("CACCEL_UNDER_VALGRIND") ? 6 : 48;
        int64_t n = ca_tensor_numel(t), step = n > samples ? n / samples : 1;
        for (int64_t j = 0; j < n; j += step) {
            float orig = x[j];
            x[j] = orig + (float)eps;
            T_OK(ca_tensor_copy_from_host(t, x, ca_tensor_nbytes(t)));
            double lp = loss_at(r, res->in, &c, w);
            x[j] = orig - (float)eps;
            T_OK(ca_tensor_copy_from_host(t, x, ca_tensor_nbytes(t)));
            double lm = loss_at(r, res->in, &c, w);
            x[j] = orig;
            T_OK(ca_tensor_copy_from_host(t, x, ca_tensor_nbytes(t)));
            double num = (lp - lm) / (2 * eps), err = fabs(num - g[j]);
            if (!(err <= atol + rtol * fabs(num)))
                fail_msg("%s on %s: d/d input %d[%lld]: backward %.6g, finite difference %.6g (|diff| %.3g)", r->name,
                         dev_name[d], i, (long long)j, g[j], num, err);
        }
        free(x);
        free(g);
    }
    free(w);
}

/* ------------------------------------------------------------------ the driver */

/* The op must fail on device d, at the latest when its values are read, naming the cause. */
static void expect_error(const op_case *r, ca_dtype dt, int d, ca_tensor **cpu_in) {
    oc_result res;
    bool ok = run_on(r, dt, d, cpu_in, &res);
    if (ok) fail_msg("%s on %s: succeeded, expected an error with \"%s\"", r->name, dev_name[d], r->error);
    assert_int_equal(ca_last_status(), CA_ERR_INVALID);
    if (!strstr(ca_last_error(), r->error))
        fail_msg("%s on %s: error \"%s\" does not say \"%s\"", r->name, dev_name[d], ca_last_error(), r->error);
    ca_clear_error();
    T_OK(ca_device_synchronize(devs[d]));   /* reported once */
    result_free(&res);
}

static int64_t runs, fd_runs;
/* The accelerator rows pick their device by name from the configuration: not the count device. */
static ca_tensor *b_accelerator(ca_tensor **in, const oc_call *c);

static void run_row(const op_case *r, ca_dtype dt, uint64_t seed) {
    ca_tensor *cpu_in[MAXIN] = {0};
    CA_SCOPE {
        for (int i = 0; i < r->nin; i++) cpu_in[i] = make_input(&r->in[i], dt, &seed);
        if (r->error) {
            for (int d = 0; d < ND; d++)
                if (devs[d]) expect_error(r, dt, d, cpu_in);
        } else {
            oc_result ref, got;
            if (!run_on(r, dt, DEV_CPU, cpu_in, &ref))
                fail_msg("%s (%s) on cpu: %s", r->name, ca_dtype_name(dt), ca_last_error());
            bool fd = r->grad && dt == CA_F32 && !r->no_fd;
            for (int d = 0; d < ND; d++) {
                if (!devs[d]) continue;
                if (d != DEV_CPU) {
                    if (!run_on(r, dt, d, cpu_in, &got))
                        fail_msg("%s (%s) on %s: %s", r->name, ca_dtype_name(dt), dev_name[d], ca_last_error());
                    compare_results(r, dt, d, &ref, &got, cpu_in);
                }
                if (fd) finite_differences(r, d, d == DEV_CPU ? &ref : &got);
                if (d != DEV_CPU) result_free(&got);
                runs++;
                fd_runs += fd;
            }
            result_free(&ref);
            if (r->build != b_accelerator && !(r->dtypes & (B(dt) - 1))) {   /* once a row: its slots */
                if (!run_on(r, dt, DEV_COUNT, cpu_in, &got)) fail_msg("%s on count: %s", r->name, ca_last_error());
                result_free(&got);
            }
        }
    }
}

static void run_table(const op_case *rows, size_t nrows) {
    for (size_t k = 0; k < nrows; k++)
        for (int dt = 0; dt < 6; dt++)
            if (rows[k].dtypes & B(dt)) run_row(&rows[k], (ca_dtype)dt,
                0x243f6a8885a308d3ull + k * 7919 + (uint64_t)dt);
}

/* ================================================================== the table */

#define SH(...) .ndim = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), .shape = {__VA_ARGS__}
/* A float input in the row's dtype, uniform in [lo, hi). */
#define U(lo_, hi_, ...) {SH(__VA_ARGS__), .lo = (lo_), .hi = (hi_)}
/* An input of a fixed dtype (indices, labels, masks): literal data, or a generator. */
#define FIX(dt_, data_, ...) {SH(__VA_ARGS__), .is_fixed = true, .fixed = (dt_), .arg = (data_)}
#define FIXG(dt_, gen_, arg_, ...) {SH(__VA_ARGS__), .is_fixed = true, .fixed = (dt_), .gen = (gen_), .arg = (arg_)}
/* uniform f32 values in [lo, hi) whatever the row's dtype, never differentiated (rope's tables) */
#define UF32(lo_, hi_, ...) {SH(__VA_ARGS__), .lo = (lo_), .hi = (hi_), .is_fixed = true, .fixed = CA_F32}
/* A float input in the row's dtype, uniform in [lo, hi) with |v| >= gap (kinks). */
#define GAP(lo_, hi_, gap_, ...) {SH(__VA_ARGS__), .lo = (lo_), .hi = (hi_), .gap = (gap_)}
/* An input in the row's dtype from a generator. */
#define G(gen_, arg_, ...) {SH(__VA_ARGS__), .gen = (gen_), .arg = (arg_)}

/* ------------------------------------------------------------------ tolerances of the cuda column */
/* The plugin is compiled with --fmad=false, so an op whose result is a fixed sequence of IEEE
 * operations (casts, fill, copies, arithmetic unary ops, binary ops, gradient accumulation, max,
 * argmax, embedding, uniform numbers, dropout, AdamW, SGD) must agree bit for bit: those rows leave
 * fwd/bwd zero. Transcendental functions (CUDA's expf/logf/tanhf/powf against glibc's) differ by a
 * few ulp, and sums are added in another order: */
#define T_EXACT {0}
#define T_TRANSC {.rtol = 4e-6, .atol = 1e-6, .why = "CUDA's expf/logf/tanhf/powf against glibc's: a few ulp"}
#define T_GELU_TAIL {.rtol = 1e-5, .atol = 1e-30, .why = "CUDA's erfcf/expf against the CPU's Phi: relative"}
#define T_SUM {.rtol = 1e-5, .atol = 1e-5, .why = "sums added in another order"}
#define T_SOFTMAX {.rtol = 1e-5, .atol = 1e-7, .why = "softmax: expf and a sum in another order"}
/* atol: dx = y (dy - s) with s = sum(dy y) over up to 1000 columns summed in another order (a warp tree
 * on the GPU); the H200 measured |diff| 1.22e-6 at [29,1000] */
#define T_SOFTMAX_B {.rtol = 2e-5, .atol = 4e-6, .why = "softmax backward: a row sum in another order"}
/* log_softmax = x - (max + log sum exp): near its zero (the row's maximum) a relative bound means
 * nothing; the error is that of the shift, a few of its ulps (t_shift_ulps, tests/test_ulp.h;
 * tests/test_cuda_numerics shows a one-ulp different shift passing it and failing the relative one). */
#define T_LOG_SOFTMAX10 {.rtol = 1e-5, .atol = 1e-7, .bound = t_shift_ulps, \
                         .why = "f32: 2 ulps of the shift max + log(sum exp) and the result's rounding"}
#define T_CE {.rtol = 1e-5, .atol = 1e-6, .why = "cross-entropy: log-sum-exp summed in another order"}
#define T_CE_B {.rtol = 1e-5, .atol = 1e-7, .why = "cross-entropy backward: expf against glibc's"}
#define T_LN {.rtol = 2e-5, .atol = 1e-5, .why = "layer norm: mean and variance summed in another order"}
#define T_LN_B {.rtol = 5e-5, .atol = 2e-5, .why = "layer norm backward: two row sums and a column sum, reordered"}
/* The embedding backward: the CPU adds each element's gradients in index order, f16/bf16 in f32 with
 * one rounding at the end; CUDA adds with atomics in another order. A half type: within 2 ulps of the
 * CPU (two f32 sums of the same terms in different orders, each rounded once). */
#define T_EMB_B {.rtol = 1e-5, .atol = 1e-5, .ulps = 2, \
                 .why = "atomics add in another order (half types: f32 accumulation, rounded once)"}
#define T_NORMAL {.rtol = 6e-7, .atol = 6e-7, .why = "glibc's logf and cosf are not correctly rounded in every case"}
/* The gradient checks through the ops: fused kernels (attention), sums in another order. */
#define T_ROPE {.rtol = 1e-6, .atol = 1e-6, .why = "rope: the same f32 products (nvcc --fmad=false); a few ulps of margin"}
#define T_SWIGLU_B {.rtol = 4e-6, .atol = 1e-6, .why = "swiglu backward: CUDA's expf against the CPU's"}
#define T_OPS {.rtol = 1e-4, .atol = 1e-4, .why = "composed ops, sums in another order"}
#define T_OPS_B {.rtol = 1e-3, .atol = 1e-4, .why = "composed backward, sums in another order"}
#define OPS .fwd = T_OPS, .bwd = T_OPS_B
/* GEMM: cuBLAS sums k products in another order (and half inputs in f32): per sqrt(k); backward's k is
 * the forward's m or n. */
#define T_GEMM(k) {.rtol = 2e-5 * SQRT_##k, .atol = 2e-5 * SQRT_##k, .f16 = 3e-3 * SQRT_##k, \
                   .bf16 = 2e-2 * SQRT_##k, .why = "cuBLAS: k products summed in another order (2e-5 sqrt k)"}
#define GEMM(kf, kb) .fwd = T_GEMM(kf), .bwd = T_GEMM(kb)
#define SQRT_53 7.2801
#define SQRT_31 5.5678
#define SQRT_10 3.1623
#define SQRT_40 6.3246
#define SQRT_32 5.6569

/* ------------------------------------------------------------------ generators */

/* The awkward values: NaN, infinities, -0, huge, tiny, halfway cases; integers beyond f32's precision. */
static void gen_awkward(ca_dtype dt, void *raw, int64_t n, uint64_t *seed, const void *arg) {
    (void)arg;
    if (!ca_dtype_is_float(dt)) {
        for (int64_t i = 0; i < n; i++) {
            int64_t v = (int64_t)(t_rand_u64(seed) % 100000) - 50000;
            if (i % 7 == 0) v = (int64_t)(t_rand_u64(seed) >> 1) * (i % 2 ? 1 : -1);
            if (dt == CA_U8) ((uint8_t *)raw)[i] = (uint8_t)(v & 0xff);
            else if (dt == CA_I32) ((int32_t *)raw)[i] = (int32_t)v;
            else ((int64_t *)raw)[i] = v;
        }
        return;
    }
    static const float special[] = {NAN, INFINITY, -INFINITY, -0.0f, 65504.0f, 65520.0f, 1e-8f, 5.9604645e-08f,
                                    2.5f, 3.5f, -254.5f, 255.5f, 1e20f, -1e20f, 3e38f, 1.00048828125f};
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = i < (int64_t)(sizeof special / sizeof special[0]) ? special[i]
                                                                : t_randf(seed, -70000, 70000) * (i % 3 ? 1e-3f : 1.0f);
    from_f32(dt, v, n, raw);
    free(v);
}

/* Labels in [0, arg[0]), every fifth one arg[1] (ignore_index), row arg[2] (if >= 0) out of range. */
static void gen_labels(ca_dtype dt, void *raw, int64_t n, uint64_t *seed, const void *arg) {
    const int64_t *a = arg;
    for (int64_t r = 0; r < n; r++) {
        int64_t v = (int64_t)(t_rand_u64(seed) % (uint64_t)a[0]);
        if (r % 5 == 3) v = a[1];
        if (r == a[2]) v = a[0] + 2;
        if (dt == CA_I64) ((int64_t *)raw)[r] = v;
        else ((int32_t *)raw)[r] = (int32_t)v;
    }
}
static const int64_t LAB10[3] = {10, -100, -1}, LAB1000[3] = {1000, -100, -1}, LAB_BAD[3] = {4, -100, 6};
static const int64_t GL50[3] = {50, 0, -1};   /* gather along 50: every fifth index 0 */

/* A u8 condition: 0 or 1, about half each (where). */
static void gen_cond(ca_dtype dt, void *raw, int64_t n, uint64_t *seed, const void *arg) {
    for (int64_t i = 0; i < n; i++) ((uint8_t *)raw)[i] = (uint8_t)(t_rand_u64(seed) >> 63);
}
static const int64_t IDX50[3] = {50, 0, -1};   /* embedding: many repeats */

/* Integers in [-20, 20) (many ties) with NaNs, the maximum, in some rows; arg: the row length. */
static void gen_ties(ca_dtype dt, void *raw, int64_t n, uint64_t *seed, const void *arg) {
    int64_t cols = *(const int64_t *)arg;
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (float)(int)t_randf(seed, -20, 20);
    if (cols > 3) {
        v[2 * cols + 3] = NAN;
        v[5 * cols + 1] = NAN;
        v[5 * cols + cols - 1] = NAN;
        v[7 * cols + cols - 1] = 1000.0f;
    }
    from_f32(dt, v, n, raw);
    free(v);
}
static const int64_t C1 = 1, C10 = 10, C33 = 33, C1000 = 1000, C5000 = 5000;

/* ------------------------------------------------------------------ builders (the public ops API) */

static ca_tensor *last2(ca_tensor *t) { return ca_transpose(t, ca_tensor_ndim(t) - 2, ca_tensor_ndim(t) - 1); }
/* ctx: bit 0 transposes a, bit 1 b (views: GEMM reads them transposed, no copy for 2-D operands). */
static ca_tensor *b_matmul(ca_tensor **in, const oc_call *c) {
    int t = c->ctx ? *(const int *)c->ctx : 0;
    return ca_matmul(t & 1 ? last2(in[0]) : in[0], t & 2 ? last2(in[1]) : in[1]);
}
static const int TN = 0, TA = 1, TB = 2, TAB = 3;
static ca_tensor *b_linear(ca_tensor **in, const oc_call *c) { return ca_linear(in[0], in[1], in[2]); }
static ca_tensor *b_linear_nb(ca_tensor **in, const oc_call *c) { return ca_linear(in[0], in[1], NULL); }

static ca_tensor *b_full(ca_tensor **in, const oc_call *c) {
    return ca_full(c->dev, c->dt, 1, (int64_t[]){1031}, *(const double *)c->ctx);
}
static const double V1 = 1.5, V2 = -2.7, V3 = 1e10, V4 = -1e30, V5 = 300.5, V6 = 2.5, V7 = 65519.0, V8 = NAN;
static ca_tensor *b_cast_to(ca_tensor **in, const oc_call *c) { return ca_cast(in[0], c->dt); }
/* x stored [5, 4, 6], read as [6, 5, 4] (permuted) and broadcast along a new last dim of 3. */
static ca_tensor *b_copy_strided(ca_tensor **in, const oc_call *c) {
    ca_tensor *v = ca_transpose(ca_transpose(in[0], 0, 2), 1, 2);
    return ca_expand(ca_reshape(v, 4, (int64_t[]){6, 5, 4, 1}), 4, (int64_t[]){6, 5, 4, 3});
}
static ca_tensor *b_contig_t(ca_tensor **in, const oc_call *c) { return ca_contiguous(ca_transpose(in[0], 0, 1)); }
static ca_tensor *b_cast_rt(ca_tensor **in, const oc_call *c) {
    return ca_cast(ca_cast(in[0], *(const ca_dtype *)c->ctx), CA_F32);
}
static const ca_dtype DT_F16 = CA_F16, DT_BF16 = CA_BF16;

typedef ca_tensor *(*unary_fn)(ca_tensor *);
typedef struct un_ctx { unary_fn f; double a; ca_tensor *(*fa)(ca_tensor *, double); } un_ctx;
static ca_tensor *b_unary(ca_tensor **in, const oc_call *c) {
    const un_ctx *u = c->ctx;
    return u->f ? u->f(in[0]) : u->fa(in[0], u->a);
}
static const un_ctx U_NEG = {ca_neg}, U_RELU = {ca_relu}, U_GELU = {ca_gelu}, U_GELU_ERF = {ca_gelu_erf},
                    U_SILU = {ca_silu}, U_TANH = {ca_tanh}, U_SIGMOID = {ca_sigmoid}, U_EXP = {ca_exp},
                    U_LOG = {ca_log}, U_SQRT = {ca_sqrt}, U_SQUARE = {ca_square},
                    U_SCALE = {NULL, -0.75, ca_mul_scalar}, U_ADDS = {NULL, -0.75, ca_add_scalar},
                    U_ADDS15 = {NULL, 1.5, ca_add_scalar}, U_POW2 = {NULL, 2.0, ca_pow_scalar},
                    U_POW1 = {NULL, 1.0, ca_pow_scalar}, U_POW05 = {NULL, 0.5, ca_pow_scalar},
                    U_POW25 = {NULL, 2.5, ca_pow_scalar}, U_POWM15 = {NULL, -1.5, ca_pow_scalar};
static ca_tensor *b_scalar_chain(ca_tensor **in, const oc_call *c) {
    return ca_mul_scalar(ca_add_scalar(in[0], 1.5), -0.75);
}
/* The gradient of x reaches it three times: the tape adds them (axpby). */
static ca_tensor *b_accumulate(ca_tensor **in, const oc_call *c) {
    return ca_add(ca_mul(in[0], in[0]), ca_mul_scalar(in[0], -3.0));
}

typedef ca_tensor *(*binary_fn)(ca_tensor *, ca_tensor *);
typedef struct bin_ctx { binary_fn f; bool ta; } bin_ctx;
static ca_tensor *b_binary(ca_tensor **in, const oc_call *c) {
    const bin_ctx *b = c->ctx;
    return b->f(b->ta ? ca_transpose(in[0], 0, 2) : in[0], in[1]);
}
static const bin_ctx ADD = {ca_add}, SUB = {ca_sub}, MUL = {ca_mul}, DIV = {ca_div};
static const bin_ctx ADD_T = {ca_add, true}, SUB_T = {ca_sub, true}, MUL_T = {ca_mul, true}, DIV_T = {ca_div, true};

typedef struct red_ctx { int kind, dim; bool keep, all; } red_ctx;   /* kind: 0 sum, 1 mean, 2 max */
static ca_tensor *b_reduce(ca_tensor **in, const oc_call *c) {
    const red_ctx *r = c->ctx;
    if (r->all) return r->kind ? ca_mean(in[0]) : ca_sum(in[0]);
    if (r->kind == 2) return ca_max_dim(in[0], r->dim, r->keep);
    return r->kind ? ca_mean_dim(in[0], r->dim, r->keep) : ca_sum_dim(in[0], r->dim, r->keep);
}
static const red_ctx R_SUM = {0, 0, false, true}, R_MEAN = {1, 0, false, true}, R_SUMM1 = {0, -1},
                     R_MEANM1K = {1, -1, true}, R_SUM1 = {0, 1}, R_MEAN1 = {1, 1}, R_MAX1 = {2, 1},
                     R_SUM0 = {0, 0}, R_SUM2 = {0, 2}, R_MEAN0K = {1, 0, true}, R_MEAN1K = {1, 1, true},
                     R_MEAN2K = {1, 2, true};
static ca_tensor *b_argmax(ca_tensor **in, const oc_call *c) { return ca_argmax(in[0]); }
static ca_tensor *b_softmax(ca_tensor **in, const oc_call *c) { return ca_softmax(in[0]); }
static ca_tensor *b_log_softmax(ca_tensor **in, const oc_call *c) { return ca_log_softmax(in[0]); }
static ca_tensor *b_ce(ca_tensor **in, const oc_call *c) { return ca_cross_entropy_ex(in[0], in[1], c->ctx); }
static const ca_cross_entropy_opts CE_SUM = {.reduction = CA_REDUCTION_SUM};
static const ca_cross_entropy_opts CE_IGN4 = {.has_ignore_index = true, .ignore_index = 4};
static ca_tensor *b_mse(ca_tensor **in, const oc_call *c) { return ca_mse_loss(in[0], in[1]); }
static ca_tensor *b_ln(ca_tensor **in, const oc_call *c) {
    int aff = *(const int *)c->ctx;
    return ca_layer_norm(in[0], aff >= 1 ? in[1] : NULL, aff == 2 ? in[2] : NULL, 1e-5);
}
static const int AFF0 = 0, AFF1 = 1, AFF2 = 2;
static ca_tensor *b_rms(ca_tensor **in, const oc_call *c) { return ca_rms_norm(in[0], c->ctx ? in[1] : NULL, 1e-6); }
static const int WITH = 1;
static ca_tensor *b_rope(ca_tensor **in, const oc_call *c) { return ca_rope(in[0], in[1], in[2]); }
static ca_tensor *b_swiglu(ca_tensor **in, const oc_call *c) {
    return c->ctx ? ca_swiglu(in[0], in[0]) : ca_swiglu(in[0], in[1]);
}
static const int SAME = 1;
static ca_tensor *b_embedding(ca_tensor **in, const oc_call *c) { return ca_embedding(in[1], in[0]); }
/* A language-model head tied to its embedding: logits = emb(idx) W^T with one W. */
static ca_tensor *b_tied(ca_tensor **in, const oc_call *c) { return ca_linear(ca_embedding(in[1], in[0]), in[0],
    NULL); }
static ca_tensor *b_index_select(ca_tensor **in, const oc_call *c) { return ca_index_select(in[0], 1, in[1]); }
static ca_tensor *b_gather(ca_tensor **in, const oc_call *c) { return ca_gather_dim(in[0], 1, in[1]); }
static ca_tensor *b_where(ca_tensor **in, const oc_call *c) { return ca_where(in[2], in[0], in[1]); }
static ca_tensor *b_masked_fill(ca_tensor **in, const oc_call *c) { return ca_masked_fill(in[0], in[1], -3.5); }
static ca_tensor *b_concat(ca_tensor **in, const oc_call *c) { return ca_concat(*(const int *)c->ctx, in, 1); }
static ca_tensor *b_stack(ca_tensor **in, const oc_call *c) { return ca_stack(3, in, *(const int *)c->ctx); }
static const int N3 = 3, N6 = 6, D0 = 0, D2 = 2;
static ca_tensor *b_split(ca_tensor **in, const oc_call *c) {
    ca_tensor *p[3];
    if (ca_split(in[0], 0, 3, (const int64_t[]){2, 1, 3}, p) != CA_OK) return NULL;
    ca_tensor *r[3] = {ca_mul_scalar(p[2], 2.0), p[0], p[1]};
    return ca_concat(3, r, 0);
}
/* A split of a non-leaf along its last dim (the GPT's q, k, v out of one projection): its parts copy into
 * their regions of the gradient; `whole` also uses the input itself, `uses` picks the parts. */
typedef struct split_ctx { bool whole; int uses; } split_ctx;
static const split_ctx SPLIT_ALL = {false, 7}, SPLIT_WHOLE = {true, 5};
static ca_tensor *b_split_nonleaf(ca_tensor **in, const oc_call *c) {
    const split_ctx *sc = c->ctx;
    ca_tensor *y = ca_mul(in[0], in[1]), *p[3], *r[4];
    if (ca_split(y, 2, 3, (const int64_t[]){3, 5, 4}, p) != CA_OK) return NULL;
    int n = 0;
    for (int j = 2; j >= 0; j--)
        if (sc->uses >> j & 1) r[n++] = ca_mul_scalar(p[j], (double)j + 1.0);
    if (sc->whole) r[n++] = y;
    return ca_concat(n, r, 2);
}
static ca_tensor *b_reshape(ca_tensor **in, const oc_call *c) { return ca_mul(ca_reshape(in[0], 2, (int64_t[]){4, -1}),
    in[1]); }
static ca_tensor *b_transpose(ca_tensor **in, const oc_call *c) { return ca_mul(ca_transpose(in[0], 0, 2), in[1]); }
static ca_tensor *b_narrow(ca_tensor **in, const oc_call *c) { return ca_mul(ca_narrow(in[0], 2, 1, 3), in[1]); }
/* [2, 3, 6] -> a slice of 4 along the last dim -> [2, 3, 2, 2] (a view of the slice) -> heads first */
static ca_tensor *b_reshape_slice(ca_tensor **in, const oc_call *c) {
    return ca_mul(ca_transpose(ca_reshape(ca_narrow(in[0], 2, 1, 4), 4, (int64_t[]){2, 3, 2, 2}), 1, 2), in[1]);
}
static ca_tensor *b_flatten(ca_tensor **in, const oc_call *c) { return ca_flatten(in[0]); }
static ca_tensor *b_expand(ca_tensor **in, const oc_call *c) { return ca_expand(in[0], 3, (int64_t[]){2, 3, 4}); }
static ca_tensor *b_dropout(ca_tensor **in, const oc_call *c) { return ca_dropout(in[0], *(const double *)c->ctx,
    true); }
static const double P03 = 0.3, P09 = 0.9;

/* Attention: the mask (if any) is input 3. */
typedef struct sdpa_ctx { bool causal; double p, scale; } sdpa_ctx;
static ca_tensor *b_sdpa(ca_tensor **in, const oc_call *c) {
    const sdpa_ctx *a = c->ctx;
    return ca_scaled_dot_product_attention(in[0], in[1], in[2], in[3], a->causal, a->p, a->scale);
}
static const sdpa_ctx SD_PLAIN = {false, 0, 0}, SD_CAUSAL = {true, 0, 0}, SD_SCALE = {false, 0, 0.7},
                      SD_DROP = {false, 0.3, 0}, SD_CAUSAL_DROP = {true, 0.2, 0};
static const uint8_t KEEP[2 * 5] = {1, 1, 1, 0, 0, 1, 1, 1, 1, 1};   /* key padding: batch 0 has 3 keys */
static const float ADDM[2 * 5] = {0, 0.1f, 0.2f, -INFINITY, -INFINITY, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f};
static const int64_t EIDX[7] = {3, 0, 3, 9, 1, 3, 0}, SIDX[5] = {3, 0, 3, 2, 3}, TIED[4] = {2, 0, 4, 2};
static const int32_t GIDX[12] = {3, 0, 3, 1, 1, 2, 0, 0, 0, 2, 3, 3};
static const uint8_t COND3[3] = {1, 0, 1};
static const int64_t LAB64[6] = {0, 4, 2, -100, 3, 1}, BAD_IDX[3] = {1, 50, 2};
static const int32_t LAB32[6] = {1, 1, 0, 4, 2, 3};
static const int64_t LAB3D[6] = {0, 2, -100, 1, 3, 0};

/* ------------------------------------------------------------------ rows */

static const op_case MATMUL[] = {
    /* GEMM as the kernel parity test ran it: every transpose, batched, a rank-2 right operand folded */
    {"matmul [37,53]x[53,29]", b_matmul, &TN, 2, {U(-1, 1, 37, 53), U(-1, 1, 53, 29)}, FLT, true, GEMM(53, 53)},
    {"matmul A^T", b_matmul, &TA, 2, {U(-1, 1, 53, 37), U(-1, 1, 53, 29)}, FLT, true, GEMM(53, 53)},
    {"matmul B^T", b_matmul, &TB, 2, {U(-1, 1, 37, 53), U(-1, 1, 29, 53)}, FLT, true, GEMM(53, 53)},
    {"matmul A^T B^T", b_matmul, &TAB, 2, {U(-1, 1, 53, 37), U(-1, 1, 29, 53)}, FLT, true, GEMM(53, 53)},
    {"matmul batched [3,17,31]x[3,31,40]", b_matmul, &TN, 2, {U(-1, 1, 3, 17, 31), U(-1, 1, 3, 31, 40)}, FLT, true,
     GEMM(31, 40)},
    {"matmul batched A^T", b_matmul, &TA, 2, {U(-1, 1, 3, 31, 17), U(-1, 1, 3, 31, 40)}, FLT, true, GEMM(31, 40)},
    {"matmul batched B^T", b_matmul, &TB, 2, {U(-1, 1, 3, 17, 31), U(-1, 1, 3, 40, 31)}, FLT, true, GEMM(31, 40)},
    {"matmul batched A^T B^T", b_matmul, &TAB, 2, {U(-1, 1, 3, 31, 17), U(-1, 1, 3, 40, 31)}, FLT, true,
     GEMM(31, 40)},
    {"matmul [4,8,10]x[10,9] (rows folded)", b_matmul, &TN, 2, {U(-1, 1, 4, 8, 10), U(-1, 1, 10, 9)}, FLT, true,
     GEMM(10, 32)},
    {"matmul [4,8,10]x[9,10]^T", b_matmul, &TB, 2, {U(-1, 1, 4, 8, 10), U(-1, 1, 9, 10)}, FLT, true, GEMM(10, 32)},
    {"matmul [7,5]^T x [7,3]", b_matmul, &TA, 2, {U(-1, 1, 7, 5), U(-1, 1, 7, 3)}, FLT, true, OPS},
    {"matmul [5,7] x [3,7]^T", b_matmul, &TB, 2, {U(-1, 1, 5, 7), U(-1, 1, 3, 7)}, FLT, true, OPS},
    {"matmul of two dtypes", b_matmul, &TN, 2, {U(-1, 1, 4, 4), {SH(4, 4), .is_fixed = true, .fixed = CA_F32}},
     B(CA_F16), false, .error = "cannot multiply [4, 4] f16 by [4, 4] f32"},
    {"matmul k = 0", b_matmul, &TN, 2, {U(-1, 1, 5, 0), U(-1, 1, 0, 6)}, FLT, false},
    /* the gradient checks */
    {"matmul [5,7]x[7,3]", b_matmul, &TN, 2, {U(-1, 1, 5, 7), U(-1, 1, 7, 3)}, FLT, true, OPS},
    {"matmul [2,4,3]x[2,3,5]", b_matmul, &TN, 2, {U(-1, 1, 2, 4, 3), U(-1, 1, 2, 3, 5)}, FLT, true, OPS},
    {"matmul broadcast [2,1,4,5]x[3,5,2]", b_matmul, &TN, 2, {U(-1, 1, 2, 1, 4, 5), U(-1, 1, 3, 5, 2)}, FLT, true,
     OPS},
    {"matmul [2,3,4,5]x[2,3,5,2]", b_matmul, &TN, 2, {U(-1, 1, 2, 3, 4, 5), U(-1, 1, 2, 3, 5, 2)}, FLT, true, OPS},
    {"matmul [2,4,5]x[5,3] (a weight on the right)", b_matmul, &TN, 2, {U(-1, 1, 2, 4, 5), U(-1, 1, 5, 3)}, FLT, true,
     OPS},
    {"matmul [4,5]x[2,5,3] (a matrix on the left)", b_matmul, &TN, 2, {U(-1, 1, 4, 5), U(-1, 1, 2, 5, 3)}, FLT, true,
     OPS},
    {"linear", b_linear, NULL, 3, {U(-1, 1, 6, 5), U(-1, 1, 4, 5), U(-1, 1, 4)}, FLT, true, OPS},
    {"linear 3-D input", b_linear, NULL, 3, {U(-1, 1, 2, 3, 5), U(-1, 1, 4, 5), U(-1, 1, 4)}, FLT, true, OPS},
    {"linear without bias", b_linear_nb, NULL, 2, {U(-1, 1, 6, 5), U(-1, 1, 4, 5)}, FLT, true, OPS},
};

#define FILL(v) {"full " #v, b_full, &v, 0, {{0}}, ANY, false}
#define CAST(dt) {"cast from " #dt, b_cast_to, NULL, 1, {FIXG(dt, gen_awkward, NULL, 2053)}, ANY, false}
static const op_case COPY[] = {
    FILL(V1), FILL(V2), FILL(V3), FILL(V4), FILL(V5), FILL(V6), FILL(V7), FILL(V8),
    CAST(CA_F32), CAST(CA_F16), CAST(CA_BF16), CAST(CA_I32), CAST(CA_I64), CAST(CA_U8),
    {"copy strided (permuted, broadcast)", b_copy_strided, NULL, 1, {G(gen_awkward, NULL, 5, 4, 6)}, ANY, false},
    {"contiguous of a transpose", b_contig_t, NULL, 1, {G(gen_awkward, NULL, 13, 257)}, ANY, false},
    {"expand", b_expand, NULL, 1, {U(-1, 1, 3, 1)}, FLT, true, .bwd = T_SUM},
    {"contiguous", b_contig_t, NULL, 1, {U(-1, 1, 2, 3, 4)}, FLT, true},
    {"cast f16 round trip", b_cast_rt, &DT_F16, 1, {U(-1, 1, 2, 3, 4)}, F32, true, .fd_eps = 0.05, .fd_atol = 2e-2,
     .fd_rtol = 5e-2},
    {"cast bf16 round trip", b_cast_rt, &DT_BF16, 1, {U(-1, 1, 2, 3, 4)}, F32, true, .fd_eps = 0.1, .fd_atol = 6e-2,
     .fd_rtol = 1e-1},
};

/* Inputs of the unary rows: 3001 values (vector tails), and 13 (the gradient checks). */
#define UN(name, ctx, lo_, hi_, gap_, fwd_) \
    {name, b_unary, &ctx, 1, {GAP(lo_, hi_, gap_, 3001)}, FLT, true, .fwd = fwd_, .bwd = T_TRANSC}
#define UNP(name, ctx, fwd_) \
    {name, b_unary, &ctx, 1, {U(0.05f, 4, 3001)}, FLT, true, .fd_eps = 1e-3, .fwd = fwd_, .bwd = T_TRANSC}
#define UN13(name, ctx, lo_, hi_, gap_) {name " [13]", b_unary, &ctx, 1, {GAP(lo_, hi_, gap_, 13)}, FLT, true, OPS}
static const op_case UNARY[] = {
    UN("neg", U_NEG, -4, 4, 0, T_EXACT), UN("relu", U_RELU, -4, 4, 0.05f, T_EXACT),
    UN("gelu", U_GELU, -4, 4, 0, T_TRANSC), UN("gelu_erf", U_GELU_ERF, -4, 4, 0, T_TRANSC),
    /* relative only: 1 + erf(x / sqrt 2) cancelled here (10% off at -5), below any absolute term */
    {"gelu_erf's negative tail [-6,-3)", b_unary, &U_GELU_ERF, 1, {U(-6, -3, 3001)}, F32, true, .fwd = T_GELU_TAIL,
     .bwd = T_GELU_TAIL, .no_fd = "values of 1e-9 to 4e-3: gelu_erf [-4,4) checks the differences"},
    UN("silu", U_SILU, -4, 4, 0, T_TRANSC), UN("tanh", U_TANH, -4, 4, 0, T_TRANSC),
    UN("sigmoid", U_SIGMOID, -4, 4, 0, T_TRANSC), UN("exp", U_EXP, -4, 4, 0, T_TRANSC),
    UN("square", U_SQUARE, -4, 4, 0, T_EXACT), UN("mul_scalar", U_SCALE, -4, 4, 0, T_EXACT),
    UN("add_scalar", U_ADDS, -4, 4, 0, T_EXACT),
    UNP("log", U_LOG, T_TRANSC), UNP("sqrt", U_SQRT, T_EXACT), UNP("pow 2", U_POW2, T_EXACT),
    UNP("pow 1", U_POW1, T_EXACT), UNP("pow 0.5", U_POW05, T_EXACT), UNP("pow 2.5", U_POW25, T_TRANSC),
    UNP("pow -1.5", U_POWM15, T_TRANSC),
    UN13("neg", U_NEG, -2, 2, 0), UN13("relu", U_RELU, -2, 2, 0.05f), UN13("gelu", U_GELU, -3, 3, 0),
    UN13("tanh", U_TANH, -2, 2, 0), UN13("sigmoid", U_SIGMOID, -3, 3, 0), UN13("exp", U_EXP, -2, 2, 0),
    UN13("log", U_LOG, 0.3f, 3, 0), UN13("sqrt", U_SQRT, 0.3f, 3, 0), UN13("square", U_SQUARE, -2, 2, 0),
    UN13("gelu_erf", U_GELU_ERF, -3, 3, 0), UN13("silu", U_SILU, -3, 3, 0),
    {"add_scalar [4,5]", b_unary, &U_ADDS15, 1, {U(0.3f, 2, 4, 5)}, FLT, true},
    {"mul_scalar [4,5]", b_unary, &U_SCALE, 1, {U(0.3f, 2, 4, 5)}, FLT, true},
    {"pow 2.5 [4,5]", b_unary, &U_POW25, 1, {U(0.3f, 2, 4, 5)}, FLT, true, OPS},
    {"add_scalar then mul_scalar [4,5]", b_scalar_chain, NULL, 1, {U(0.3f, 2, 4, 5)}, FLT, true},
    /* a leaf used three times: the tape adds its gradients */
    {"gradient accumulation (axpby)", b_accumulate, NULL, 1, {U(-2, 2, 4099)}, FLT, true},
};

/* y[4, 5, 6] = a op b: b of the same shape, a row, a column, a scalar; a transposed (strides 1, 4, 20). */
/* The gradient checks: a [3,4] (or [2,3,4]) kept 0.3 from 0 by b of the same shape, a row, a column, a
 * scalar, or leading dims broadcast; then swapped (broadcast on the left: sw, positive for div). */
#define BGC(name, ctx, sa, sb) \
    {name " " #sa " by " #sb, b_binary, &ctx, 2, {GAP(-2, 2, 0.3f, ID sa), U(0.5f, 2, ID sb)}, FLT, true, OPS}
#define BSW(name, ctx, sw, sa, sb) \
    {name " " #sb " by " #sa " (swapped)", b_binary, &ctx, 2, {U(0.5f, 2, ID sb), sw(ID sa)}, FLT, true, OPS}
#define ID(...) __VA_ARGS__
#define SW_ANY(...) GAP(-2, 2, 0.3f, __VA_ARGS__)
#define SW_DIV(...) U(0.5f, 2, __VA_ARGS__)
/* y[4, 5, 6] = a op b: b of the same shape, a row, a column, a scalar; a transposed (strides 1, 4, 20). */
#define BIN(name, ctx, ctx_t, sw)                                                                       \
    {name " [4,5,6]", b_binary, &ctx, 2, {U(-3, 3, 4, 5, 6), U(0.25f, 3, 4, 5, 6)}, FLT, true, .bwd = T_SUM},   \
    {name " [4,5,6] by [6]", b_binary, &ctx, 2, {U(-3, 3, 4, 5, 6), U(0.25f, 3, 6)}, FLT, true, .bwd = T_SUM},  \
    {name " [4,5,6] by [4,5,1]", b_binary, &ctx, 2, {U(-3, 3, 4, 5, 6), U(0.25f, 3, 4, 5, 1)}, FLT, true,      \
     .bwd = T_SUM},                                                                                              \
    {name " [4,5,6] by [1]", b_binary, &ctx, 2, {U(-3, 3, 4, 5, 6), U(0.25f, 3, 1)}, FLT, true, .bwd = T_SUM},  \
    {name " [6,5,4]^T by [4,5,6]", b_binary, &ctx_t, 2, {U(-3, 3, 6, 5, 4), U(0.25f, 3, 4, 5, 6)}, FLT, true,  \
     .bwd = T_SUM},                                                                                              \
    BGC(name, ctx, (3, 4), (3, 4)), BGC(name, ctx, (3, 4), (4)), BGC(name, ctx, (3, 4), (3, 1)),                \
    BGC(name, ctx, (3, 4), (1)), BGC(name, ctx, (2, 3, 4), (3, 1)),                                             \
    BSW(name, ctx, sw, (3, 4), (3, 4)), BSW(name, ctx, sw, (3, 4), (4)), BSW(name, ctx, sw, (3, 4), (3, 1)),    \
    BSW(name, ctx, sw, (3, 4), (1)), BSW(name, ctx, sw, (2, 3, 4), (3, 1))
static const op_case BINARY[] = {
    BIN("add", ADD, ADD_T, SW_ANY), BIN("sub", SUB, SUB_T, SW_ANY), BIN("mul", MUL, MUL_T, SW_ANY),
    BIN("div", DIV, DIV_T, SW_DIV),
};

/* Reductions over dim 1 of [outer, len, inner]: long rows, strided, one long row, len 1, len 0. */
#define RED(name, ctx, fwd_, g, ...) \
    {name, b_reduce, &ctx, 1, {U(-1, 1, __VA_ARGS__)}, FLT, g, .fwd = fwd_, .bwd = T_SUM}
#define RED3(o, l, i) RED("sum_dim [" #o "," #l "," #i "]", R_SUM1, T_SUM, true, o, l, i), \
                      RED("mean_dim [" #o "," #l "," #i "]", R_MEAN1, T_SUM, true, o, l, i), \
                      RED("max_dim [" #o "," #l "," #i "]", R_MAX1, T_EXACT, false, o, l, i)
static const op_case REDUCE[] = {
    RED3(3, 1000, 1), RED3(2, 17, 33), RED3(1, 100000, 1), RED3(5, 1, 7), RED3(64, 10, 1),
    RED("sum_dim [4,0,3]", R_SUM1, T_SUM, true, 4, 0, 3), RED("mean_dim [4,0,3]", R_MEAN1, T_SUM, true, 4, 0, 3),
    {"max_dim of length 0", b_reduce, &R_MAX1, 1, {U(-1, 1, 2, 0, 3)}, F32, false,
     .error = "max of an empty dimension"},
    RED("sum_dim 1", R_SUM1, T_SUM, true, 3, 4, 5),
    RED("sum", R_SUM, T_SUM, true, 3, 4, 5), RED("mean", R_MEAN, T_SUM, true, 3, 4, 5),
    RED("sum_dim 0", R_SUM0, T_SUM, true, 3, 4, 5), RED("sum_dim 2", R_SUM2, T_SUM, true, 3, 4, 5),
    RED("mean_dim 0 keepdim", R_MEAN0K, T_SUM, true, 3, 4, 5), RED("mean_dim 1 keepdim", R_MEAN1K, T_SUM, true, 3, 4,
        5),
    RED("mean_dim 2 keepdim", R_MEAN2K, T_SUM, true, 3, 4, 5),
    RED("sum_dim -1", R_SUMM1, T_SUM, true, 3, 4, 5), RED("mean_dim -1 keepdim", R_MEANM1K, T_SUM, true, 3, 4, 5),
    /* ties everywhere, NaN (the maximum) in some rows: the first maximum's index */
    {"argmax [37,1]", b_argmax, NULL, 1, {G(gen_ties, &C1, 37, 1)}, FLT, false},
    {"argmax [37,10]", b_argmax, NULL, 1, {G(gen_ties, &C10, 37, 10)}, FLT, false},
    {"argmax [37,33]", b_argmax, NULL, 1, {G(gen_ties, &C33, 37, 33)}, FLT, false},
    {"argmax [37,1000]", b_argmax, NULL, 1, {G(gen_ties, &C1000, 37, 1000)}, FLT, false},
    {"argmax [37,5000]", b_argmax, NULL, 1, {G(gen_ties, &C5000, 37, 5000)}, FLT, false},
};

#define SMX(c, fwd_log)                                                                                      \
    {"softmax [29," #c "]", b_softmax, NULL, 1, {U(-8, 8, 29, c)}, FLT, true, .fwd = T_SOFTMAX,                \
     .bwd = T_SOFTMAX_B},                                                                                      \
    {"log_softmax [29," #c "]", b_log_softmax, NULL, 1, {U(-8, 8, 29, c)}, FLT, true, .fwd = fwd_log,          \
     .bwd = T_SOFTMAX_B}
#define CE(c, lab, ldt) {"cross_entropy [77," #c "] " #ldt " labels, ignore -100", b_ce, NULL, 2, \
                         {U(-5, 5, 77, c), FIXG(ldt, gen_labels, lab, 77)}, FLT, true, .fwd = T_CE, .bwd = T_CE_B}
static const op_case SOFTMAX[] = {
    SMX(10, T_LOG_SOFTMAX10), SMX(128, T_SOFTMAX), SMX(1000, T_SOFTMAX), SMX(3001, T_SOFTMAX),
    {"softmax [4,7]", b_softmax, NULL, 1, {U(-3, 3, 4, 7)}, FLT, true, OPS},
    {"log_softmax [4,7]", b_log_softmax, NULL, 1, {U(-3, 3, 4, 7)}, FLT, true, OPS},
    CE(10, LAB10, CA_I32), CE(10, LAB10, CA_I64), CE(1000, LAB1000, CA_I32), CE(1000, LAB1000, CA_I64),
    {"cross_entropy ignore_index", b_ce, NULL, 2, {U(-2, 2, 6, 5), FIX(CA_I64, LAB64, 6)}, FLT, true, OPS},
    {"cross_entropy sum", b_ce, &CE_SUM, 2, {U(-2, 2, 6, 5), FIX(CA_I64, LAB64, 6)}, FLT, true, OPS},
    {"cross_entropy i32 ignore 4", b_ce, &CE_IGN4, 2, {U(-2, 2, 6, 5), FIX(CA_I32, LAB32, 6)}, FLT, true, OPS},
    {"cross_entropy 3-D logits", b_ce, NULL, 2, {U(-2, 2, 2, 3, 5), FIX(CA_I64, LAB3D, 2, 3)}, FLT, true, OPS},
    {"cross_entropy label out of range", b_ce, NULL, 2, {U(-1, 1, 8, 4), FIXG(CA_I64, gen_labels, LAB_BAD, 8)}, F32,
     false,
     .error = "row 6 has label 6"},
    {"mse_loss", b_mse, NULL, 2, {U(-2, 2, 3, 4), U(-2, 2, 3, 4)}, FLT, true, OPS},
};

#define LN(c, aff, nin)                                                                                      \
    {"layer_norm [33," #c "] " #aff, b_ln, &aff, nin, {U(-3, 3, 33, c), U(0.5f, 1.5f, c), U(-1, 1, c)}, FLT, true, \
     .fwd = T_LN, .bwd = T_LN_B}
static const op_case NORM[] = {
    LN(16, AFF0, 1), LN(16, AFF1, 2), LN(16, AFF2, 3), LN(768, AFF0, 1), LN(768, AFF1, 2), LN(768, AFF2, 3),
    LN(3000, AFF0, 1), LN(3000, AFF1, 2), LN(3000, AFF2, 3),
    {"layer_norm [5,8]", b_ln, &AFF2, 3, {U(-2, 2, 5, 8), U(0.5f, 1.5f, 8), U(-1, 1, 8)}, FLT, true, OPS},
    {"layer_norm [5,8] without affine", b_ln, &AFF0, 1, {U(-2, 2, 5, 8)}, FLT, true, OPS},
    {"rms_norm [3,2,6]", b_rms, &WITH, 2, {U(-2, 2, 3, 2, 6), U(0.5f, 1.5f, 6)}, FLT, true, OPS},
    {"rms_norm [3,2,6] without weight", b_rms, NULL, 1, {U(-2, 2, 3, 2, 6)}, FLT, true, OPS},
    {"rms_norm [33,768]", b_rms, &WITH, 2, {U(-3, 3, 33, 768), U(0.5f, 1.5f, 768)}, FLT, true, .fwd = T_LN,
     .bwd = T_LN_B},
    /* rope: full and partial rotary, one table for every batch or one per batch ([1, T, R] too) */
    {"rope [2,3,5,8] tables [5,4]", b_rope, NULL, 3, {U(-2, 2, 2, 3, 5, 8), UF32(-1, 1, 5, 4), UF32(-1, 1, 5, 4)},
     FLT, true, .fwd = T_ROPE, .bwd = T_ROPE},
    {"rope [2,2,4,10] partial rot 6, per-batch tables [2,4,3]", b_rope, NULL, 3,
     {U(-2, 2, 2, 2, 4, 10), UF32(-1, 1, 2, 4, 3), UF32(-1, 1, 2, 4, 3)}, FLT, true, .fwd = T_ROPE, .bwd = T_ROPE},
    {"rope [1,2,3,6] tables [1,3,3]", b_rope, NULL, 3, {U(-2, 2, 1, 2, 3, 6), UF32(-1, 1, 1, 3, 3),
     UF32(-1, 1, 1, 3, 3)}, FLT, true, .fwd = T_ROPE, .bwd = T_ROPE},
    {"rope [3,4,37,64] tables [37,32]", b_rope, NULL, 3, {U(-2, 2, 3, 4, 37, 64), UF32(-1, 1, 37, 32),
     UF32(-1, 1, 37, 32)}, FLT, true, .fwd = T_ROPE, .bwd = T_ROPE},
    {"rope tables for another sequence length", b_rope, NULL, 3, {U(-1, 1, 1, 2, 5, 8), UF32(-1, 1, 4, 4),
     UF32(-1, 1, 4, 4)}, F32, false, .error = "must both be [T, R] or [B or 1, T, R] with T = 5"},
    {"rope tables wider than the head", b_rope, NULL, 3, {U(-1, 1, 1, 2, 5, 8), UF32(-1, 1, 5, 5),
     UF32(-1, 1, 5, 5)}, F32, false, .error = "2R <= the head dim 8"},
    {"rope x not 4-D", b_rope, NULL, 3, {U(-1, 1, 2, 5, 8), UF32(-1, 1, 5, 4), UF32(-1, 1, 5, 4)}, F32, false,
     .error = "x must be [batch, heads, seq, head_dim]"},
    /* swiglu: the same tensor as gate and up (its two gradients added), more than a vector's tail */
    {"swiglu [3,7]", b_swiglu, NULL, 2, {U(-4, 4, 3, 7), U(-2, 2, 3, 7)}, FLT, true, .fwd = T_TRANSC, .bwd = T_SWIGLU_B},
    {"swiglu [33,257]", b_swiglu, NULL, 2, {U(-6, 6, 33, 257), U(-2, 2, 33, 257)}, FLT, true, .fwd = T_TRANSC,
     .bwd = T_SWIGLU_B},
    {"swiglu gate = up [5,9]", b_swiglu, &SAME, 1, {U(-4, 4, 5, 9)}, FLT, true, .fwd = T_TRANSC, .bwd = T_SWIGLU_B},
    {"swiglu shapes differ", b_swiglu, NULL, 2, {U(-1, 1, 3, 4), U(-1, 1, 4, 3)}, F32, false,
     .error = "swiglu: gate [3, 4] and up [4, 3] must have the same shape"},
};

static const op_case INDEX[] = {
    /* 301 lookups of a [50, 37] table with many repeats; the table holds the awkward values */
    {"embedding [50,37] i32 indices", b_embedding, NULL, 2, {G(gen_awkward, NULL, 50, 37), FIXG(CA_I32, gen_labels,
     IDX50, 301)},
     FLT, true, .no_fd = "the table holds NaN and inf; the [10,4] row checks the differences", .bwd = T_EMB_B},
    {"embedding [50,37] i64 indices", b_embedding, NULL, 2, {G(gen_awkward, NULL, 50, 37), FIXG(CA_I64, gen_labels,
     IDX50, 301)},
     FLT, true, .no_fd = "the table holds NaN and inf; the [10,4] row checks the differences", .bwd = T_EMB_B},
    {"embedding [10,4]", b_embedding, NULL, 2, {U(-1, 1, 10, 4), FIX(CA_I64, EIDX, 7)}, FLT, true, OPS},
    {"embedding tied to the output layer", b_tied, NULL, 2, {U(-1, 1, 5, 3), FIX(CA_I64, TIED, 4)}, FLT, true,
     OPS},
    {"embedding index out of range", b_embedding, NULL, 2, {U(-1, 1, 50, 4), FIX(CA_I64, BAD_IDX, 3)}, F32, false,
     .error = "index 50 at position 1"},
    {"index_select", b_index_select, NULL, 2, {U(-1, 1, 2, 4, 3), FIX(CA_I64, SIDX, 5)}, FLT, true, OPS},
    {"gather", b_gather, NULL, 2, {U(-1, 1, 2, 4, 3), FIX(CA_I32, GIDX, 2, 2, 3)}, F32, true, OPS},
    {"where", b_where, NULL, 3, {U(-1, 1, 3, 4), U(-1, 1, 4), FIX(CA_U8, COND3, 3, 1)}, FLT, true, OPS},
    /* more than one block of the cuda kernels, both operands and the condition broadcast */
    {"where [33,257], b [257], cond [33,1]", b_where, NULL, 3,
     {U(-1, 1, 33, 257), U(-1, 1, 257), FIXG(CA_U8, gen_cond, NULL, 33, 1)}, FLT, true, OPS},
    {"where [3,40,70], cond [3,40,70]", b_where, NULL, 3,
     {U(-1, 1, 3, 40, 70), U(-1, 1, 3, 40, 70), FIXG(CA_U8, gen_cond, NULL, 3, 40, 70)}, FLT, true, OPS},
    {"gather [3,50,7] along 50, 20 i64 indices", b_gather, NULL, 2,
     {U(-1, 1, 3, 50, 7), FIXG(CA_I64, gen_labels, GL50, 3, 20, 7)}, F32, true, OPS},
    {"gather [2,300,33] along 300, 129 i32 indices", b_gather, NULL, 2,
     {U(-1, 1, 2, 300, 33), FIXG(CA_I32, gen_labels, GL50, 2, 129, 33)}, F32, true, OPS},
    {"masked_fill", b_masked_fill, NULL, 2, {U(-1, 1, 3, 4), FIX(CA_U8, COND3, 3, 1)}, FLT, true, OPS},
    {"concat", b_concat, &N3, 3, {U(-1, 1, 2, 1, 3), U(-1, 1, 2, 2, 3), U(-1, 1, 2, 3, 3)}, FLT, true},
    {"concat of 6 (chained nodes)", b_concat, &N6, 6,
     {U(-1, 1, 2, 1, 3), U(-1, 1, 2, 2, 3), U(-1, 1, 2, 3, 3), U(-1, 1, 2, 1, 3), U(-1, 1, 2, 2, 3), U(-1, 1, 2, 3, 3)},
     FLT, true},
    {"stack dim 0", b_stack, &D0, 3, {U(-1, 1, 2, 3), U(-1, 1, 2, 3), U(-1, 1, 2, 3)}, FLT, true},
    {"stack dim 2", b_stack, &D2, 3, {U(-1, 1, 2, 3), U(-1, 1, 2, 3), U(-1, 1, 2, 3)}, FLT, true},
    {"split", b_split, NULL, 1, {U(-1, 1, 6, 4)}, FLT, true},
    {"split of a non-leaf, every part", b_split_nonleaf, &SPLIT_ALL, 2, {U(-1, 1, 2, 3, 12), U(-1, 1, 2, 3, 12)}, FLT,
     true},
    {"split of a non-leaf, a part unused, the input used whole", b_split_nonleaf, &SPLIT_WHOLE, 2,
     {U(-1, 1, 2, 3, 12), U(-1, 1, 2, 3, 12)}, FLT, true},
    {"reshape", b_reshape, NULL, 2, {U(-1, 1, 2, 3, 4), U(-1, 1, 4, 6)}, FLT, true},
    {"reshape of a strided slice (a view)", b_reshape_slice, NULL, 2, {U(-1, 1, 2, 3, 6), U(-1, 1, 2, 2, 3, 2)}, FLT,
     true},
    {"transpose", b_transpose, NULL, 2, {U(-1, 1, 2, 3, 4), U(-1, 1, 4, 3, 2)}, FLT, true},
    {"narrow", b_narrow, NULL, 2, {U(-1, 1, 2, 3, 4), U(-1, 1, 2, 3, 3)}, FLT, true},
    {"flatten", b_flatten, NULL, 1, {U(-1, 1, 2, 3, 4)}, FLT, true},
};

/* The generator's numbers for three (seed, counter) states, one after the other. */
typedef struct rng_ctx { bool normal; int64_t n; } rng_ctx;
static ca_tensor *b_rng(ca_tensor **in, const oc_call *c) {
    static const uint64_t seeds[] = {0, 42, 0xdeadbeefcafef00dull}, offsets[] = {0, 7, (1ull << 32) - 3};
    const rng_ctx *r = c->ctx;
    ca_tensor *parts[3];
    for (int k = 0; k < 3; k++) {
        ca_rng_set_state(seeds[k], offsets[k]);
        parts[k] = r->normal ? ca_rand_normal(c->dev, c->dt, 1, &r->n, -2.0f, 3.0f)
                             : ca_rand_uniform(c->dev, c->dt, 1, &r->n, 0.5f, 2.0f);
    }
    return ca_concat(3, parts, 0);
}
#define RNG(kind, n_, ...) \
    {kind " [" #n_ "]", b_rng, &(const rng_ctx){strcmp(kind, "normal") == 0, n_}, 0, {{0}}, FLT, false, __VA_ARGS__}
#define NORMAL(n_, frac) RNG("normal", n_, .fwd = T_NORMAL, .min_identical = frac)
#define DROP(p, n_) {"dropout p " #p " [" #n_ "]", b_dropout, &p, 1, {U(-2, 2, n_)}, FLT, true, .rng = true}
static const op_case RANDOM[] = {
    RNG("uniform", 1), RNG("uniform", 3), RNG("uniform", 4), RNG("uniform", 1001), RNG("uniform", 65537),
    /* glibc's logf is not always correctly rounded: most numbers, not all, are the CPU's bits */
    NORMAL(1, 0), NORMAL(3, 0), NORMAL(4, 0), NORMAL(1001, 0.5), NORMAL(65537, 0.5),
    DROP(P03, 10007), DROP(P09, 10007), {"dropout p 0.3 [3,4]", b_dropout, &P03, 1, {U(-2, 2, 3, 4)}, FLT, true,
        .rng = true},
};

#define QKV(tq, tk) U(-1, 1, 2, 2, tq, 3), U(-1, 1, 2, 2, tk, 3), U(-1, 1, 2, 2, tk, 4)
#define GQA(hkv, tq, tk) U(-1, 1, 2, 4, tq, 3), U(-1, 1, 2, hkv, tk, 3), U(-1, 1, 2, hkv, tk, 4)
static const op_case ATTENTION[] = {
    {"sdpa", b_sdpa, &SD_PLAIN, 3, {QKV(5, 5)}, FLT, true, OPS},
    {"sdpa causal", b_sdpa, &SD_CAUSAL, 3, {QKV(5, 5)}, FLT, true, OPS},
    {"sdpa additive mask, scale 0.7", b_sdpa, &SD_SCALE, 4, {QKV(5, 5), FIX(CA_F32, ADDM, 2, 1, 1, 5)}, FLT, true,
     OPS},
    {"sdpa key padding", b_sdpa, &SD_PLAIN, 4, {QKV(5, 5), FIX(CA_U8, KEEP, 2, 1, 1, 5)}, FLT, true, OPS},
    {"sdpa key padding + causal", b_sdpa, &SD_CAUSAL, 4, {QKV(5, 5), FIX(CA_U8, KEEP, 2, 1, 1, 5)}, FLT, true,
     OPS},
    {"sdpa key padding + dropout", b_sdpa, &SD_DROP, 4, {QKV(5, 5), FIX(CA_U8, KEEP, 2, 1, 1, 5)}, FLT, true,
     .rng = true, OPS},
    {"sdpa causal, 70 queries, 66 keys", b_sdpa, &SD_CAUSAL, 3, {U(-1, 1, 1, 1, 70, 2), U(-1, 1, 1, 1, 66, 2), U(-1, 1,
     1, 1, 66, 3)}, FLT, true, OPS},
    {"sdpa causal dropout, 70 queries, 66 keys", b_sdpa, &SD_CAUSAL_DROP, 3, {U(-1, 1, 1, 1, 70, 2), U(-1, 1, 1, 1, 66,
     2), U(-1, 1, 1, 1, 66, 3)}, FLT, true, .rng = true, OPS},
    /* T > 32: several warps per query row and several key blocks in the cuda kernels */
    {"sdpa 67 queries and keys", b_sdpa, &SD_PLAIN, 3, {QKV(67, 67)}, FLT, true, OPS},
    {"sdpa causal, 67 queries and keys", b_sdpa, &SD_CAUSAL, 3, {QKV(67, 67)}, FLT, true, OPS},
    {"sdpa 130 queries and keys", b_sdpa, &SD_PLAIN, 3, {QKV(130, 130)}, FLT, true, OPS},
    {"sdpa causal, 130 queries and keys", b_sdpa, &SD_CAUSAL, 3, {QKV(130, 130)}, FLT, true, OPS},
    /* grouped-query attention: 4 query heads over 2 or 1 kv heads (torch's enable_gqa) */
    {"sdpa GQA 4:2 causal", b_sdpa, &SD_CAUSAL, 3, {GQA(2, 5, 5)}, FLT, true, OPS},
    {"sdpa GQA 4:1 causal", b_sdpa, &SD_CAUSAL, 3, {GQA(1, 5, 5)}, FLT, true, OPS},
    {"sdpa GQA 4:2 key padding", b_sdpa, &SD_PLAIN, 4, {GQA(2, 5, 5), FIX(CA_U8, KEEP, 2, 1, 1, 5)}, FLT, true, OPS},
    {"sdpa GQA 4:1 key padding + causal", b_sdpa, &SD_CAUSAL, 4, {GQA(1, 5, 5), FIX(CA_U8, KEEP, 2, 1, 1, 5)}, FLT,
     true, OPS},
    {"sdpa GQA 4:2 key padding + dropout", b_sdpa, &SD_DROP, 4, {GQA(2, 5, 5), FIX(CA_U8, KEEP, 2, 1, 1, 5)}, FLT,
     true, .rng = true, OPS},
    {"sdpa GQA 4:2 causal, 70 queries and keys", b_sdpa, &SD_CAUSAL, 3, {GQA(2, 70, 70)}, FLT, true, OPS},
    {"sdpa GQA 3 kv heads of 4", b_sdpa, &SD_PLAIN, 3, {GQA(3, 5, 5)}, FLT, false,
     .error = "k and v have 3 heads, which do not divide q's 4 heads"},
};

/* ------------------------------------------------------------------ optimizers */

#define NT 41   /* more than one launch group of the list kernels */
static int64_t tl_size(int i) { return i == 3 ? 0 : (i % 7 == 0 ? 9000 + i : 1 + i * 37); }

typedef struct opt_ctx { bool adamw; ca_adamw_opts a; ca_sgd_opts s; int steps; } opt_ctx;
/* NT parameters on the device, `steps` steps from fixed gradients; out: parameters and states. */
static ca_tensor *b_optimizer(ca_tensor **in, const oc_call *c) {
    const opt_ctx *o = c->ctx;
    uint64_t seed = 99;
    ca_tensor *p[NT], *g[NT];
    for (int i = 0; i < NT; i++) {
        int64_t n = tl_size(i);
        float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
        for (int64_t j = 0; j < n; j++) h[j] = t_randf(&seed, -1, 1);
        p[i] = ca_tensor_keep(T_NN(ca_from_host(c->dev, CA_F32, 1, &n, h)));
        for (int64_t j = 0; j < n; j++) h[j] = t_randf(&seed, -1, 1);
        g[i] = T_NN(ca_from_host(c->dev, CA_F32, 1, &n, h));
        free(h);
        ca_tensor_set_requires_grad(p[i], true);
    }
    ca_optimizer *opt;
    T_OK(o->adamw ? ca_adamw_create_params(p, NT, &o->a, &opt) : ca_sgd_create_params(p, NT, &o->s, &opt));
    for (int step = 0; step < o->steps; step++) {
        for (int i = 0; i < NT; i++) {   /* the gradient: g, then g / (step + 1) */
            ca_tensor_zero_grad(p[i]);
            T_OK(ca_autograd_backward_with(ca_mul_scalar(p[i], 1.0), ca_mul_scalar(g[i], 1.0 / (step + 1))));
        }
        T_OK(ca_optimizer_step(opt));
    }
    int ns = ca_optimizer_num_state(opt);
    ca_tensor *all[NT + 2 * NT];
    int n = 0;
    for (int i = 0; i < NT; i++) all[n++] = ca_detach(p[i]);
    for (int i = 0; i < ns; i++) all[n++] = ca_reshape(ca_optimizer_state_at(opt, i, NULL), 1, (int64_t[]){-1});
    ca_tensor *out = NULL;
    CA_NO_GRAD out = ca_contiguous(ca_concat(n, all, 0));
    T_OK(ca_device_synchronize(c->dev));
    ca_optimizer_destroy(opt);
    for (int i = 0; i < NT; i++) ca_tensor_free(p[i]);
    return out;
}
static const opt_ctx O_ADAMW = {true, {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01},
    {0}, 3};
static const opt_ctx O_SGD = {false, {0}, {.lr = 0.1}, 2};
static const opt_ctx O_SGD_M = {false, {0}, {.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-4}, 3};
static const opt_ctx O_SGD_N = {false, {0}, {.lr = 0.01, .momentum = 0.8, .nesterov = true, .weight_decay = 0.1}, 3};
static const op_case OPTIM[] = {
    {"adamw, 3 steps, 41 tensors", b_optimizer, &O_ADAMW, 0, {{0}}, F32, false},
    {"sgd, 2 steps", b_optimizer, &O_SGD, 0, {{0}}, F32, false},
    {"sgd momentum, dampening, weight decay, 3 steps", b_optimizer, &O_SGD_M, 0, {{0}}, F32, false},
    {"sgd nesterov, 3 steps", b_optimizer, &O_SGD_N, 0, {{0}}, F32, false},
};

/* The list kernels of the accelerator (gradient norm, scaling, clamping, fp16 unscaling with the
 * overflow check) on NT prepared parameters with fixed gradients. */
typedef struct acc_ctx { const char *mp; int kind; } acc_ctx;   /* kind: 0 clip norm, 1 clip value, 2 step */
static ca_tensor *b_accelerator(ca_tensor **in, const oc_call *c) {
    const acc_ctx *a = c->ctx;
    const char *hw = c->dev == devs[DEV_CPU] ? "--cpu" : (c->dev == devs[DEV_XLA] ? "--tpu" : NULL);
    char *argv[] = {"test_ops", "--mixed_precision", (char *)a->mp, (char *)hw, NULL};
    ca_accelerator *acc;
    T_OK(ca_accelerator_create(&(ca_options){.argc = hw ? 4 : 3, .argv = argv}, &acc));
    ca_device *dev = ca_accelerator_device(acc);
    if (strcmp(ca_device_name(dev), ca_device_name(c->dev)) != 0)
        fail_msg("the accelerator runs on %s, not %s", ca_device_name(dev), ca_device_name(c->dev));
    ca_module *m;
    T_OK(ca_module_create("Params", NULL, NULL, NULL, &m));
    uint64_t seed = 77;
    ca_tensor *p[NT];
    float *h = malloc(9100 * sizeof *h);
    for (int i = 0; i < NT; i++) {
        int64_t n = tl_size(i);
        T_OK(ca_parameter_create(ca_cpu_device(), CA_F32, 1, &n, &p[i]));
        for (int64_t j = 0; j < n; j++) h[j] = t_randf(&seed, -1, 1);
        T_OK(ca_tensor_copy_from_host(p[i], h, (size_t)n * 4));
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        T_OK(ca_module_add_param(m, name, p[i]));
    }
    ca_optimizer *opt;
    T_OK(ca_sgd_create(m, &(ca_sgd_opts){.lr = 0.1}, &opt));
    T_OK(ca_prepare(acc, m, opt, NULL));
    ca_tensor *loss = NULL;
    for (int i = 0; i < NT; i++) {   /* d loss / d p_i = g_i */
        int64_t n = tl_size(i);
        for (int64_t j = 0; j < n; j++) h[j] = t_randf(&seed, -1, 1);
        if (a->kind == 3 && i == 40) h[5] = 1e35f;   /* times the loss scale: inf */
        ca_tensor *term = ca_sum(ca_mul(p[i], T_NN(ca_from_host(dev, CA_F32, 1, &n, h))));
        loss = loss ? ca_add(loss, term) : term;
    }
    free(h);
    T_OK(ca_backward(acc, loss));
    double norm = 0;
    if (a->kind == 0) T_OK(ca_clip_grad_norm(acc, 3.0, &norm));
    if (a->kind == 1) T_OK(ca_clip_grad_value(acc, 0.25));
    if (a->kind >= 2) T_OK(ca_optimizer_step(opt));
    ca_grad_scaler_state st = {0};
    if (strcmp(a->mp, "fp16") == 0) T_OK(ca_grad_scaler_get(acc, &st));
    /* the norm (163.96), the scale (65536; halved to 32768 on overflow), 1 when the step was skipped */
    float extra[3] = {(float)norm, (float)st.scale, ca_optimizer_step_was_skipped(opt) ? 1.0f : 0.0f};
    if ((a->kind == 0 && !(norm > 3)) || (a->kind == 3 && extra[2] != 1.0f))
        fail_msg("%s: norm %g, skipped %g: the case did not happen", ca_device_name(dev), norm, extra[2]);
    ca_tensor *all[2 * NT + 1];
    int n = 0;
    for (int i = 0; i < NT; i++) {
        all[n++] = ca_detach(p[i]);
        if (ca_tensor_grad(p[i])) all[n++] = ca_tensor_grad(p[i]);
    }
    all[n++] = ca_from_host(dev, CA_F32, 1, (int64_t[]){3}, extra);
    ca_tensor *out = NULL;
    CA_NO_GRAD out = ca_contiguous(ca_concat(n, all, 0));
    T_OK(ca_device_synchronize(dev));
    ca_tensor *host = NULL;   /* on the row's device: the accelerator's goes with it */
    T_OK(ca_tensor_to_device(out, c->dev, &host));
    ca_optimizer_destroy(opt);
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
    ca_tensor *r = ca_mul_scalar(host, 1.0);   /* a scoped copy: host is persistent */
    T_OK(ca_device_synchronize(c->dev));
    ca_tensor_free(host);
    return r;
}
static const acc_ctx A_NORM = {"no", 0}, A_VALUE = {"no", 1}, A_FP16 = {"fp16", 2}, A_FP16_INF = {"fp16", 3};
static const op_case ACCEL[] = {
    {"clip_grad_norm (sum of squares, scale)", b_accelerator, &A_NORM, 0, {{0}}, F32, false,
     .fwd = {.rtol = 1e-5, .atol = 1e-7, .why = "the norm is summed in another order, and the gradients scaled by it"}},
    {"clip_grad_value (clamp)", b_accelerator, &A_VALUE, 0, {{0}}, F32, false},
    {"fp16 step (unscale, check, sgd)", b_accelerator, &A_FP16, 0, {{0}}, F32, false},
    {"fp16 step with an overflow (skipped, scale halved)", b_accelerator, &A_FP16_INF, 0, {{0}}, F32, false},
};

/* ================================================================== kernel rows */
/* Kernel parameters the ops API cannot reach (GEMM alpha/beta/TF32/half into f32/padded ldc, scaled
 * and in-place casts, rsqrt/abs/recip, max/min, reduce min, the backward kernels' beta, a padded
 * strided destination, the internal lse/mean/rstd outputs, dgamma accumulation, half gradient
 * lists, grad_scale, unscale by 0, clamp_list's error): a row names a slot of CA_KERNEL_LIST and
 * the buffers of its args; it runs through each device's raw table with the core's checks
 * (test_kcall.h) on buffers of the public device API, and every buffer is compared with the CPU's. */

#include "test_kcall.h"

#define KMAXB 8   /* buffers of a kernel row */

/* A buffer: of the row's dtype (row) or a fixed one; uniform in [lo, hi), or from a generator
 * (gen, arg), or literal data (arg alone). */
typedef struct kbuf {
    int64_t n;
    bool row;
    ca_dtype dt;
    float lo, hi;
    oc_gen gen;
    const void *arg;
} kbuf;

/* A row's parameters: each slot family reads those it needs. */
typedef struct kp {
    int op;
    float alpha, beta;
    int64_t s[6];              /* sizes */
    bool flag;                 /* tf32, log softmax, accumulate_params, first_step */
    bool inplace;
    ca_dtype dt2;              /* in-place cast: the destination dtype */
} kp;

/* Builds the slot's args over the device buffers p (dtypes bdt) and calls it as the core would. */
typedef ca_status (*kr_call)(const kp *q, const ca_dtype *bdt, const char *be, const ca_kernels *k, void *cx,
                             void *const *p);

typedef struct kernel_row {
    const char *name;
    int slot;
    kr_call call;
    const kp *q;
    int nb;
    kbuf b[KMAXB];
    unsigned dtypes;
    oc_tol tol;                /* the cuda column (xla: bit for bit) */
    const char *error;         /* the call must fail on every device with this in the message */
} kernel_row;

#define KC(slot, ...) TKC(be, k, cx, slot, __VA_ARGS__)
#define KARGS const kp *q, const ca_dtype *bdt, const char *be, const ca_kernels *k, void *cx, void *const *p

static ca_status kc_gemm(KARGS) {   /* op: bit 0 transposes a, bit 1 b; s: m, n, k, batch, ldc padding */
    int64_t m = q->s[0], n = q->s[1], kk = q->s[2], ldc = n + q->s[4];
    return KC(gemm, .trans_a = q->op & 1, .trans_b = (q->op & 2) != 0, .m = m, .n = n, .k = kk, .alpha = q->alpha,
              .beta = q->beta, .a_dtype = bdt[0], .b_dtype = bdt[1], .c_dtype = bdt[2], .a = p[0],
              .lda = q->op & 1 ? m : (kk ? kk : 1), .stride_a = m * kk, .b = p[1], .ldb = q->op & 2 ? kk : n,
              .stride_b = kk * n, .c = p[2], .ldc = ldc, .stride_c = m * ldc, .batch = q->s[3],
              .allow_tf32 = q->flag);
}
static ca_status kc_cast(KARGS) {
    return KC(cast, .src_dt = bdt[0], .x = p[0], .dst_dt = q->inplace ? q->dt2 : bdt[1], .y = p[q->inplace ? 0 : 1],
              .n = q->s[0], .alpha = q->alpha);
}
static ca_status kc_copy_strided(KARGS) {   /* x [a, b, c] read permuted (c, a, b) into y with a padded row */
    int64_t a = q->s[0], b = q->s[1], c = q->s[2], pad = q->s[3];
    return KC(copy_strided, .dt = bdt[0], .ndim = 3, .shape = (const int64_t[]){c, a, b}, .x = p[0],
              .x_stride = (const int64_t[]){1, b * c, c}, .y = p[1],
              .y_stride = (const int64_t[]){a * (b + pad), b + pad, 1});
}
static ca_status kc_unary(KARGS) {
    return KC(unary, .op = q->op, .dt = bdt[0], .n = q->s[0], .x = p[0], .y = p[q->inplace ? 0 : 1], .alpha = q->alpha);
}
static ca_status kc_unary_backward(KARGS) {
    return KC(unary_backward, .op = q->op, .dt = bdt[0], .n = q->s[0], .x = p[0], .y = p[1], .dy = p[2], .dx = p[3],
              .alpha = q->alpha, .beta = q->beta);
}
static ca_status kc_binary(KARGS) {   /* y [s0, s1] = a [s0, s1] op b (s2: b is a row [s1]) */
    int64_t r = q->s[0], c = q->s[1];
    ca_bcast_args sh = {.ndim = 2, .shape = {r, c}, .a_stride = {c, 1}, .b_stride = {q->s[2] ? 0 : c, 1}};
    return KC(binary, .op = q->op, .dt = bdt[0], .shape = sh, .a = p[0], .b = p[1], .y = p[q->inplace ? 0 : 2]);
}
static ca_status kc_axpby(KARGS) {
    return KC(axpby, .dt = bdt[0], .n = q->s[0], .alpha = q->alpha, .x = p[0], .beta = q->beta, .y = p[1]);
}
static ca_status kc_reduce(KARGS) {
    return KC(reduce, .op = q->op, .dt = bdt[0], .outer = q->s[0], .len = q->s[1], .inner = q->s[2], .x = p[0],
              .y = p[1], .beta = q->beta);
}
static ca_status kc_softmax_backward(KARGS) {
    return KC(softmax_backward, .log = q->flag, .dt = bdt[0], .rows = q->s[0], .cols = q->s[1], .y = p[0], .dy = p[1],
              .dx = p[2], .beta = q->beta);
}
static ca_status kc_dropout_backward(KARGS) {   /* dy, dx, mask */
    return KC(dropout_backward, .dt = bdt[0], .n = q->s[0], .p = q->alpha, .mask = p[2], .dy = p[0], .dx = p[1],
              .beta = q->beta);
}
static ca_status kc_cross_entropy(KARGS) {   /* logits, labels, loss, lse, count */
    return KC(cross_entropy, .dt = bdt[0], .rows = q->s[0], .cols = q->s[1], .logits = p[0], .label_dt = bdt[1],
              .labels = p[1], .ignore_index = -100, .loss = p[2], .lse = p[3], .count = p[4]);
}
static ca_status kc_cross_entropy_backward(KARGS) {   /* logits, lse, labels, dloss, count, dlogits */
    return KC(cross_entropy_backward, .dt = bdt[0], .rows = q->s[0], .cols = q->s[1], .logits = p[0], .lse = p[1],
              .label_dt = bdt[2], .labels = p[2], .ignore_index = -100, .dloss = p[3], .count = p[4], .dlogits = p[5],
              .beta = q->beta);
}
static ca_status kc_layer_norm(KARGS) {   /* x, gamma, beta, y, mean, rstd */
    return KC(layer_norm, .dt = bdt[0], .rows = q->s[0], .cols = q->s[1], .x = p[0], .gamma = p[1], .beta_ = p[2],
              .eps = 1e-5f, .y = p[3], .mean = p[4], .rstd = p[5]);
}
static ca_status kc_layer_norm_backward(KARGS) {   /* x, gamma, mean, rstd, dy, dx, dgamma, dbeta */
    return KC(layer_norm_backward, .dt = bdt[0], .rows = q->s[0], .cols = q->s[1], .x = p[0], .gamma = p[1],
              .mean = p[2], .rstd = p[3], .dy = p[4], .dx = p[5], .beta = q->beta, .dgamma = p[6], .dbeta_ = p[7],
              .accumulate_params = q->flag);
}
static ca_status kc_rms_norm(KARGS) {   /* x, gamma, y, rstd */
    return KC(rms_norm, .dt = bdt[0], .rows = q->s[0], .cols = q->s[1], .x = p[0], .gamma = p[1], .eps = 1e-6f,
              .y = p[2], .rstd = p[3]);
}
static ca_status kc_rms_norm_backward(KARGS) {   /* x, gamma, rstd, dy, dx, dgamma */
    return KC(rms_norm_backward, .dt = bdt[0], .rows = q->s[0], .cols = q->s[1], .x = p[0], .gamma = p[1],
              .rstd = p[2], .dy = p[3], .dx = p[4], .beta = q->beta, .dgamma = p[5], .accumulate_params = q->flag);
}
static ca_status kc_rope(KARGS) {   /* x, cos, sin, y; s: batch, heads, seq, dim, rot, table_batch */
    return KC(rope, .dt = bdt[0], .batch = q->s[0], .heads = q->s[1], .seq = q->s[2], .dim = q->s[3], .rot = q->s[4],
              .table_batch = q->s[5], .x = p[0], .cos = p[1], .sin = p[2], .inverse = q->flag,
              .y = p[q->inplace ? 0 : 3], .beta = q->beta);
}
static ca_status kc_swiglu_backward(KARGS) {   /* gate, up, dy, dgate, dup; op bit 0: no dgate, bit 1: no dup */
    return KC(swiglu_backward, .dt = bdt[0], .n = q->s[0], .gate = p[0], .up = p[1], .dy = p[2],
              .dgate = q->op & 1 ? NULL : p[3], .dup = q->op & 2 ? NULL : p[4], .beta_gate = q->beta,
              .beta_up = q->alpha);
}
static ca_status kc_attention(KARGS) {   /* q, k, v, out, lse: [1, 2, s0, 3] x [1, op or 2, s1, 3] */
    ca_attention_params ap = {.batch = 1, .heads = 2, .tq = q->s[0], .tk = q->s[1], .d = 3, .dv = 3,
                              .scale = 0.577f, .causal = q->flag};
    return KC(attention, .dt = bdt[0], .p = ap, .q = p[0], .k = p[1], .v = p[2], .out = p[3], .lse = p[4],
              .kv_heads = q->op);
}

/* The tensor lists: tensors of the vector-tail sizes, and an empty one, packed one after the other in
 * each buffer: param (0), grad (1), state1 (2), state2 (3); the scalar output is buffer 4. */
#define KLN 6
static const int64_t klist_n[KLN] = {1, 7, 0, 13, 257, 1031};
#define KLIST_TOTAL 1309
typedef struct klist { void *param[KLN]; const void *grad[KLN]; void *s1[KLN], *s2[KLN]; ca_tensor_list t; } klist;
static void klist_make(klist *l, const ca_dtype *bdt, void *const *p, ca_dtype grad_dt, int nb) {
    int64_t off = 0;
    for (int i = 0; i < KLN; i++) {
        l->param[i] = (char *)p[0] + off * (int64_t)ca_dtype_size(bdt[0]);
        l->grad[i] = nb > 1 ? (const char *)p[1] + off * (int64_t)ca_dtype_size(bdt[1]) : NULL;
        l->s1[i] = nb > 2 ? (char *)p[2] + off * 4 : NULL;
        l->s2[i] = nb > 3 ? (char *)p[3] + off * 4 : NULL;
        off += klist_n[i];
    }
    l->t = (ca_tensor_list){.count = KLN, .param = l->param, .grad = l->grad, .state1 = l->s1, .state2 = l->s2,
                            .numel = klist_n, .grad_dtype = grad_dt};
}
static ca_status kc_adamw(KARGS) {
    klist l;
    klist_make(&l, bdt, p, bdt[1], 4);
    return KC(adamw, .t = &l.t, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
              .bias_correction1 = 0.19f, .bias_correction2 = 0.003f, .grad_scale = q->alpha);
}
static ca_status kc_sgd(KARGS) {
    klist l;
    klist_make(&l, bdt, p, bdt[1], 3);
    return KC(sgd, .t = &l.t, .lr = 0.05f, .momentum = 0.9f, .dampening = 0.1f, .weight_decay = 1e-4f,
              .first_step = q->flag, .grad_scale = q->alpha);
}
static ca_status kc_sum_squares(KARGS) {   /* param (row dtype), out */
    klist l;
    klist_make(&l, bdt, p, bdt[0], 1);
    return KC(sum_squares, .t = &l.t, .out = p[1], .beta = q->beta);
}
static ca_status kc_scale_list(KARGS) {
    klist l;
    klist_make(&l, bdt, p, bdt[0], 1);
    return KC(scale_list, .t = &l.t, .alpha = q->alpha);
}
static ca_status kc_unscale_check(KARGS) {   /* param (row dtype), found_inf */
    klist l;
    klist_make(&l, bdt, p, bdt[0], 1);
    return KC(unscale_check, .t = &l.t, .inv_scale = q->alpha, .found_inf = p[1]);
}
static ca_status kc_clamp_list(KARGS) {
    klist l;
    klist_make(&l, bdt, p, bdt[0], 1);
    return KC(clamp_list, .t = &l.t, .lo = q->alpha, .hi = q->beta);
}
#undef KARGS

/* ------------------------------------------------------------------ running a kernel row */

static void kbuf_fill(const kbuf *b, ca_dtype dt, void *raw, uint64_t *seed) {
    if (b->gen) b->gen(dt, raw, b->n, seed, b->arg);
    else if (b->arg) memcpy(raw, b->arg, (size_t)b->n * ca_dtype_size(dt));
    else gen_uniform(dt, raw, b->n, seed, &(const oc_in){.lo = b->lo, .hi = b->hi});
}

/* Runs row r on device d from the host inputs `in`; the buffers afterwards in out (NULL: an error was
 * expected and checked). */
static void kernel_run(const kernel_row *r, const ca_dtype *bdt, int d, void *const *in, void **out) {
    ca_device *dev = devs[d];
    void *p[KMAXB] = {0};
    for (int i = 0; i < r->nb; i++) {
        size_t bytes = (size_t)r->b[i].n * ca_dtype_size(bdt[i]);
        T_OK(ca_device_alloc(dev, bytes ? bytes : 1, &p[i]));
        if (bytes) T_OK(ca_device_copy_from_host(dev, p[i], in[i], bytes));
    }
    ca_status s = r->call(r->q, bdt, ca_device_name(dev), ca_device_kernels(dev), ca_device_context(dev), p);
    if (r->error) {
        if (s == CA_OK) fail_msg("%s on %s: succeeded, expected an error with \"%s\"", r->name, dev_name[d], r->error);
        if (!strstr(ca_last_error(), r->error))
            fail_msg("%s on %s: error \"%s\" does not say \"%s\"", r->name, dev_name[d], ca_last_error(), r->error);
        ca_clear_error();
    } else if (s != CA_OK) {
        fail_msg("%s (%s) on %s: %s", r->name, ca_dtype_name(bdt[0]), dev_name[d], ca_last_error());
    }
    for (int i = 0; i < r->nb; i++) {
        size_t bytes = (size_t)r->b[i].n * ca_dtype_size(bdt[i]);
        out[i] = malloc(bytes ? bytes : 1);
        if (bytes) T_OK(ca_device_copy_to_host(dev, out[i], p[i], bytes));
        ca_device_free(dev, p[i]);
    }
}

static void run_kernel_row(const kernel_row *r, ca_dtype dt, uint64_t seed) {
    ca_dtype bdt[KMAXB];
    void *in[KMAXB] = {0}, *ref[KMAXB] = {0}, *got[KMAXB] = {0};
    for (int i = 0; i < r->nb; i++) {
        bdt[i] = r->b[i].row ? dt : r->b[i].dt;
        in[i] = malloc(r->b[i].n ? (size_t)r->b[i].n * ca_dtype_size(bdt[i]) : 1);
        kbuf_fill(&r->b[i], bdt[i], in[i], &seed);
    }
    kernel_run(r, bdt, DEV_CPU, in, ref);
    for (int d = DEV_XLA; d < ND; d++) {
        if (!devs[d]) continue;
        kernel_run(r, bdt, d, in, got);
        for (int i = 0; i < r->nb && !r->error; i++) {
            char what[256];
            snprintf(what, sizeof what, "%s (%s) buffer %d on %s", r->name, ca_dtype_name(dt), i, dev_name[d]);
            /* an in-place cast leaves the destination dtype's bits in its one buffer */
            ca_dtype cdt = r->call == kc_cast && r->q->inplace ? r->q->dt2 : bdt[i];
            compare(what, d == DEV_CUDA ? &r->tol : &EXACT, cdt, ref[i], got[i], r->b[i].n, NULL, 0);
        }
        for (int i = 0; i < r->nb; i++) free(got[i]);
        runs++;
    }
    for (int i = 0; i < r->nb; i++) {
        free(in[i]);
        free(ref[i]);
    }
    slot_covered[r->slot] = true;
}

/* ------------------------------------------------------------------ kernel rows */

/* Buffers: of the row's dtype, uniform in [lo, hi); of a fixed dtype; from a generator; literal data. */
#define KR(n_, lo_, hi_) {.n = (n_), .row = true, .lo = (lo_), .hi = (hi_)}
#define KF(dt_, n_, lo_, hi_) {.n = (n_), .dt = (dt_), .lo = (lo_), .hi = (hi_)}
#define KG(n_, gen_, arg_) {.n = (n_), .row = true, .gen = (gen_), .arg = (arg_)}
#define KFG(dt_, n_, gen_, arg_) {.n = (n_), .dt = (dt_), .gen = (gen_), .arg = (arg_)}
#define KROW(name, slot, ...) name, KS_##slot, kc_##slot, &(const kp){__VA_ARGS__}
static const float ZERO1[1] = {0};

#define T_TF32 {.rtol = 4e-3 * 16, .atol = 4e-3 * 16, .why = "TF32 products (10-bit mantissa): 4e-3 sqrt k"}
#define T_HALF_IN(v) {.rtol = (v), .atol = (v), .why = "cuBLAS: half products summed in f32 in another order"}
/* max/min: the same values (a limit far below any ulp), but a NaN's bits are the device's own */
#define T_MAXMIN {.atol = 1e-30, .ulps = 1e-6, .why = "max/min: a NaN stays NaN (its bits are the device's)"}
#define T_ATT {.rtol = 1e-4, .atol = 1e-5, .why = "fused attention: exp and row sums in another order"}

/* C [batch, m, n + pad] = alpha op(A) op(B) + beta C; C of the row's dtype or f32 (c32). */
#define KGEMM(name, t_, m_, n_, k_, b_, pad_, al, be, tf, c32, dts, ...)                                        \
    {KROW(name, gemm, .op = t_, .s = {m_, n_, k_, b_, pad_}, .alpha = al, .beta = be, .flag = tf), 3,             \
     {KR((b_ ? b_ : 1) * m_ * k_, -1, 1), KR((b_ ? b_ : 1) * k_ * n_, -1, 1),                                     \
      {.n = (b_ ? b_ : 1) * m_ * (n_ + pad_), .row = !(c32), .dt = CA_F32, .lo = -1, .hi = 1}}, dts, __VA_ARGS__}
#define KGEMM4(m_, n_, k_, b_, pad_, al, be, ...)                                                               \
    KGEMM("gemm [" #m_ "," #n_ "," #k_ "] batch " #b_ " ldc +" #pad_ " alpha " #al " beta " #be, 0, m_, n_, k_,  \
          b_, pad_, al, be, false, false, FLT, __VA_ARGS__),                                                      \
    KGEMM("gemm A^T [" #m_ "," #n_ "," #k_ "] batch " #b_ " ldc +" #pad_ " alpha " #al " beta " #be, 1, m_, n_,  \
          k_, b_, pad_, al, be, false, false, FLT, __VA_ARGS__),                                                  \
    KGEMM("gemm B^T [" #m_ "," #n_ "," #k_ "] batch " #b_ " ldc +" #pad_ " alpha " #al " beta " #be, 2, m_, n_,  \
          k_, b_, pad_, al, be, false, false, FLT, __VA_ARGS__),                                                  \
    KGEMM("gemm A^T B^T [" #m_ "," #n_ "," #k_ "] batch " #b_ " ldc +" #pad_ " alpha " #al " beta " #be, 3, m_,  \
          n_, k_, b_, pad_, al, be, false, false, FLT, __VA_ARGS__)
static const kernel_row K_GEMM[] = {
    KGEMM4(17, 40, 31, 3, 2, 0.5, 0.75, T_GEMM(31)),
    KGEMM4(8, 9, 10, 4, 1, 1.0, 1.0, T_GEMM(10)),
    KGEMM("gemm alpha 0 (C = beta C) ldc +2", 0, 5, 6, 7, 2, 2, 0.0, 0.5, false, false, FLT, T_GEMM(10)),
    KGEMM("gemm k 0 beta 0.5", 0, 5, 6, 0, 0, 1, 1.0, 0.5, false, false, FLT, T_GEMM(10)),
    KGEMM("gemm TF32 B^T [128,96,256]", 2, 128, 96, 256, 0, 0, 1.0, 0.0, true, false, F32, T_TF32),
    KGEMM("gemm TF32 A^T [64,64,512] batch 2 beta 1", 1, 64, 64, 512, 2, 0, 1.0, 1.0, true, false, F32, T_TF32),
    KGEMM("gemm f16 into f32, ldc +2, alpha 0.5 beta 0.75", 0, 17, 40, 31, 3, 2, 0.5, 0.75, false, true,
          B(CA_F16), T_HALF_IN(3e-3 * SQRT_31)),
    KGEMM("gemm bf16 into f32, B^T", 2, 17, 40, 31, 3, 2, 1.0, 0.0, false, true, B(CA_BF16),
          T_HALF_IN(2e-2 * SQRT_31)),
};

/* y (the row's dtype) = alpha x, x of every dtype holding the awkward values; in place: one buffer. */
#define KCAST(src, al, n_) \
    {KROW("cast from " #src " alpha " #al " [" #n_ "]", cast, .s = {n_}, .alpha = al), 2, \
     {KFG(src, n_, gen_awkward, NULL), KR(n_, 0, 1)}, ANY}
#define KCAST_IP(src, dst, al) \
    {KROW("cast in place " #src " to " #dst " alpha " #al, cast, .s = {1031}, .alpha = al, .inplace = true, \
          .dt2 = dst), 1, {KFG(src, 1031, gen_awkward, NULL)}, F32}
static const kernel_row K_CAST[] = {
    KCAST(CA_F32, 0.5, 1031), KCAST(CA_F16, 0.5, 1031), KCAST(CA_BF16, 0.5, 1031), KCAST(CA_I32, 0.5, 1031),
    KCAST(CA_I64, 0.5, 1031), KCAST(CA_U8, 0.5, 1031),
    KCAST(CA_F32, 1.0 / 255, 1031), KCAST(CA_F16, 1.0 / 255, 1031), KCAST(CA_BF16, 1.0 / 255, 1031),
    KCAST(CA_I32, 1.0 / 255, 1031), KCAST(CA_I64, 1.0 / 255, 1031), KCAST(CA_U8, 1.0 / 255, 1031),
    KCAST(CA_F32, 0.5, 1), KCAST(CA_F32, 0.5, 7), KCAST(CA_F32, 0.5, 13), KCAST(CA_F32, 0.5, 257),
    KCAST_IP(CA_F32, CA_I32, 0.5), KCAST_IP(CA_I32, CA_F32, 1.0), KCAST_IP(CA_F16, CA_BF16, 1.0),
    KCAST_IP(CA_BF16, CA_F16, 0.5), KCAST_IP(CA_F32, CA_F32, 1.0 / 255),
    /* a permuted read into a destination whose rows are padded: the padding stays as it was */
    {KROW("copy_strided into a padded destination", copy_strided, .s = {5, 4, 6, 3}), 2,
     {KR(120, -50, 50), KR(210, -50, 50)}, ANY},
};

/* Unary ops the ops API does not offer, in place, and the backward kernels' beta. */
#define KUN(name, op_, n_, inp, xbuf, tol_) \
    {KROW(name " [" #n_ "]", unary, .op = op_, .s = {n_}, .inplace = inp), 2, {xbuf, KR(n_, -1, 1)}, FLT, tol_}
#define KUB(name, op_, al, be, tol_)                                                                           \
    {KROW(name " backward beta " #be, unary_backward, .op = op_, .s = {1031}, .alpha = al, .beta = be), 4,    \
     {KR(1031, 0.1, 4), KR(1031, 0.1, 4), KR(1031, -1, 1), KR(1031, -1, 1)}, FLT, tol_}
#define T_UB {.rtol = 4e-6, .atol = 1e-6, .why = "the derivative's functions and dx = beta dx + ... : a few ulp"}
static const kernel_row K_UNARY[] = {
    KUN("rsqrt", CA_UNARY_RSQRT, 1, false, KR(1, 0.05, 4), T_EXACT),
    KUN("rsqrt", CA_UNARY_RSQRT, 7, false, KR(7, 0.05, 4), T_EXACT),
    KUN("rsqrt", CA_UNARY_RSQRT, 13, false, KR(13, 0.05, 4), T_EXACT),
    KUN("rsqrt", CA_UNARY_RSQRT, 257, false, KR(257, 0.05, 4), T_EXACT),
    KUN("rsqrt", CA_UNARY_RSQRT, 1031, false, KR(1031, 0.05, 4), T_EXACT),
    KUN("abs of the awkward values", CA_UNARY_ABS, 1031, false, KG(1031, gen_awkward, NULL), T_EXACT),
    KUN("recip of the awkward values", CA_UNARY_RECIP, 1031, false, KG(1031, gen_awkward, NULL), T_EXACT),
    KUN("recip", CA_UNARY_RECIP, 13, false, KR(13, 0.25, 4), T_EXACT),
    KUN("abs in place", CA_UNARY_ABS, 257, true, KR(257, -4, 4), T_EXACT),
    KUN("exp in place", CA_UNARY_EXP, 1031, true, KR(1031, -4, 4), T_TRANSC),
    KUN("rsqrt in place", CA_UNARY_RSQRT, 13, true, KR(13, 0.05, 4), T_EXACT),
    KUB("rsqrt", CA_UNARY_RSQRT, 0, 0.5, T_UB), KUB("abs", CA_UNARY_ABS, 0, 1.0, T_UB),
    KUB("recip", CA_UNARY_RECIP, 0, 0.5, T_UB), KUB("tanh", CA_UNARY_TANH, 0, 1.0, T_UB),
    KUB("pow 2.5", CA_UNARY_POW, 2.5, 0.5, T_UB), KUB("gelu", CA_UNARY_GELU_TANH, 0, 1.0, T_UB),
    KUB("log", CA_UNARY_LOG, 0, 0.0, T_UB),
};

/* max/min with NaN among the awkward values, in place, a row broadcast; axpby's other pairs. */
#define KBIN(name, op_, r, c, rowb, inp) \
    {KROW(name, binary, .op = op_, .s = {r, c, rowb}, .inplace = inp), 3, \
     {KG(r * c, gen_awkward, NULL), KR(rowb ? c : r * c, -100, 100), KR(r * c, -1, 1)}, FLT, T_MAXMIN}
#define KAXPBY(al, be, n_) \
    {KROW("axpby alpha " #al " beta " #be " [" #n_ "]", axpby, .s = {n_}, .alpha = al, .beta = be), 2, \
     {KR(n_, -2, 2), KR(n_, -2, 2)}, FLT}
static const kernel_row K_BINARY[] = {
    KBIN("max (NaN, inf) [1031]", CA_BINARY_MAX, 1, 1031, false, false),
    KBIN("min (NaN, inf) [1031]", CA_BINARY_MIN, 1, 1031, false, false),
    KBIN("max [7,13] by [13] in place", CA_BINARY_MAX, 7, 13, true, true),
    KBIN("min [7,13] by [13] in place", CA_BINARY_MIN, 7, 13, true, true),
    KAXPBY(0.5, -1.25, 1), KAXPBY(0.5, -1.25, 7), KAXPBY(0.5, -1.25, 13), KAXPBY(0.5, -1.25, 257),
    KAXPBY(0.5, -1.25, 1031), KAXPBY(-2.0, 0.0, 1031), KAXPBY(0.0, 0.5, 1031), KAXPBY(1.0, -1.0, 13),
};

/* reduce min, and beta != 0 (y = beta y + R x). */
#define KRED(name, op_, o, l, i, be, tol_) \
    {KROW(name " [" #o "," #l "," #i "] beta " #be, reduce, .op = op_, .s = {o, l, i}, .beta = be), 2, \
     {KR(o * l * i, -1, 1), KR(o * i, -1, 1)}, FLT, tol_}
static const kernel_row K_REDUCE[] = {
    KRED("min", CA_OP_MIN, 3, 1000, 1, 0.0, T_EXACT), KRED("min", CA_OP_MIN, 2, 17, 33, 0.0, T_EXACT),
    KRED("min", CA_OP_MIN, 5, 1, 7, 0.0, T_EXACT), KRED("min", CA_OP_MIN, 2, 17, 33, 0.5, T_SUM),
    KRED("max", CA_OP_MAX, 2, 17, 33, 0.5, T_SUM), KRED("sum", CA_OP_SUM, 2, 17, 33, 0.5, T_SUM),
    KRED("mean", CA_OP_AVG, 3, 1000, 1, 0.5, T_SUM),
    /* a bias gradient's shape: tiles of 32 columns, the 3000 or 8192 rows cut into chunks */
    KRED("sum", CA_OP_SUM, 1, 8192, 96, 0.0, T_SUM), KRED("mean", CA_OP_AVG, 2, 3000, 45, 0.5, T_SUM),
    KRED("max", CA_OP_MAX, 1, 3000, 70, 0.0, T_EXACT), KRED("min", CA_OP_MIN, 3, 3000, 33, 1.0, T_SUM),
};

/* The internal outputs (lse, mean, rstd), the backward kernels' beta, dgamma accumulation. */
#define KSMB(lg, be, c) \
    {KROW("softmax_backward log " #lg " [29," #c "] beta " #be, softmax_backward, .flag = lg, .s = {29, c}, \
          .beta = be), \
     3, {KR(29 * c, lg ? -5 : 0, lg ? 0 : 1), KR(29 * c, -1, 1), KR(29 * c, -1, 1)}, FLT, T_SOFTMAX_B}
#define KCE(c) \
    {KROW("cross_entropy [77," #c "] loss, lse, count", cross_entropy, .s = {77, c}), 5, \
     {KR(77 * c, -5, 5), KFG(CA_I64, 77, gen_labels, LAB10), KF(CA_F32, 1, 0, 1), KF(CA_F32, 77, 0, 1), \
      KF(CA_F32, 1, 0, 1)}, FLT, T_CE}
#define KCEB(c, be) \
    {KROW("cross_entropy_backward [77," #c "] beta " #be, cross_entropy_backward, .s = {77, c}, .beta = be), 6, \
     {KR(77 * c, -5, 5), KF(CA_F32, 77, 2, 4), KFG(CA_I64, 77, gen_labels, LAB10), KF(CA_F32, 1, 0.5, 1), \
      KF(CA_F32, 1, 50, 60), KR(77 * c, -1, 1)}, FLT, T_CE_B}
#define KLN_(c) \
    {KROW("layer_norm [33," #c "] y, mean, rstd", layer_norm, .s = {33, c}), 6, \
     {KR(33 * c, -3, 3), KR(c, 0.5, 2), KR(c, -1, 1), KR(33 * c, 0, 1), KF(CA_F32, 33, 0, 1), KF(CA_F32, 33, 0, 1)}, \
     FLT, T_LN}
#define KLNB(c, acc, be) \
    {KROW("layer_norm_backward [33," #c "] accumulate " #acc " beta " #be, layer_norm_backward, .s = {33, c}, \
          .flag = acc, .beta = be), 8, \
     {KR(33 * c, -3, 3), KR(c, 0.5, 2), KF(CA_F32, 33, -1, 1), KF(CA_F32, 33, 0.5, 2), KR(33 * c, -1, 1), \
      KR(33 * c, -1, 1), KR(c, -1, 1), KR(c, -1, 1)}, FLT, T_LN_B}
#define KRMS(c) \
    {KROW("rms_norm [33," #c "] y, rstd", rms_norm, .s = {33, c}), 4, \
     {KR(33 * c, -3, 3), KR(c, 0.5, 2), KR(33 * c, 0, 1), KF(CA_F32, 33, 0, 1)}, FLT, T_LN}
#define KRMSB(c, acc, be) \
    {KROW("rms_norm_backward [33," #c "] accumulate " #acc " beta " #be, rms_norm_backward, .s = {33, c}, .flag = acc, \
          .beta = be), 6, \
     {KR(33 * c, -3, 3), KR(c, 0.5, 2), KF(CA_F32, 33, 0.5, 2), KR(33 * c, -1, 1), KR(33 * c, -1, 1), \
      KR(c, -1, 1)}, FLT, T_LN_B}
#define KATT(tq, tk, causal) \
    {KROW("attention [1,2," #tq "," #tk "] causal " #causal " out, lse", attention, .s = {tq, tk}, .flag = causal), \
     5, {KR(6 * tq, -1, 1), KR(6 * tk, -1, 1), KR(6 * tk, -1, 1), KR(6 * tq, 0, 1), KF(CA_F32, 2 * tq, 0, 1)}, F32, \
     T_ATT}
static const kernel_row K_NN[] = {
    KSMB(false, 1.0, 128), KSMB(false, 0.5, 1000), KSMB(true, 1.0, 128), KSMB(true, 0.5, 10),
    {KROW("dropout_backward p 0.3 [10007] beta 1", dropout_backward, .s = {10007}, .alpha = 0.3, .beta = 1.0), 3,
     {KR(10007, -2, 2), KR(10007, -2, 2), KF(CA_U8, 10007, 0, 2)}, FLT},
    KCE(10), KCE(1000), KCEB(10, 1.0), KCEB(1000, 0.5),
    KLN_(16), KLN_(768), KLNB(16, true, 1.0), KLNB(768, true, 0.5), KLNB(768, false, 0.0),
    KRMS(16), KRMS(768), KRMSB(16, true, 1.0), KRMSB(768, true, 0.5), KRMSB(768, false, 0.0),
    /* rope's inverse (the backward) accumulated, in place; swiglu_backward's betas and a missing output */
    {KROW("rope [2,3,7,10] rot 6, per-batch tables, inverse, beta 0.5", rope, .s = {2, 3, 7, 10, 6, 2}, .flag = true,
          .beta = 0.5), 4, {KR(420, -2, 2), KF(CA_F32, 42, -1, 1), KF(CA_F32, 42, -1, 1), KR(420, -1, 1)}, FLT, T_ROPE},
    {KROW("rope [1,2,5,8] in place, beta 1", rope, .s = {1, 2, 5, 8, 8, 1}, .inplace = true, .beta = 1.0), 4,
     {KR(80, -2, 2), KF(CA_F32, 20, -1, 1), KF(CA_F32, 20, -1, 1), KR(1, 0, 1)}, FLT, T_ROPE},
    {KROW("swiglu_backward [1031] beta 1 and 0.5", swiglu_backward, .s = {1031}, .beta = 1.0, .alpha = 0.5), 5,
     {KR(1031, -6, 6), KR(1031, -2, 2), KR(1031, -1, 1), KR(1031, -1, 1), KR(1031, -1, 1)}, FLT, T_SWIGLU_B},
    {KROW("swiglu_backward [257] dup only", swiglu_backward, .s = {257}, .op = 1), 5,
     {KR(257, -6, 6), KR(257, -2, 2), KR(257, -1, 1), KR(257, -1, 1), KR(257, -1, 1)}, FLT, T_SWIGLU_B},
    KATT(5, 7, false), KATT(5, 7, true), KATT(70, 66, true),
    KATT(67, 67, false), KATT(67, 67, true), KATT(130, 130, false), KATT(130, 130, true), KATT(130, 67, false),
    KATT(3, 13000, false),   /* a row of scores larger than a block's shared memory */
    /* grouped-query attention: both query heads over one kv head; kv_heads that does not divide heads */
    {KROW("attention [1,2,70,66] over 1 kv head causal out, lse", attention, .s = {70, 66}, .flag = true, .op = 1),
     5, {KR(6 * 70, -1, 1), KR(3 * 66, -1, 1), KR(3 * 66, -1, 1), KR(6 * 70, 0, 1), KF(CA_F32, 2 * 70, 0, 1)}, F32,
     T_ATT},
    {KROW("attention kv_heads 3 of 2 heads", attention, .s = {5, 5}, .op = 3), 5, {KR(30, -1, 1), KR(30, -1, 1),
     KR(30, -1, 1), KR(30, 0, 1), KF(CA_F32, 10, 0, 1)}, F32, .error = "kv_heads 3 does not divide heads 2"},
};

/* The list kernels over half gradients, grad_scale, unscale by 0, clamp_list's error. */
#define KLP KF(CA_F32, KLIST_TOTAL, -1, 1)
static const kernel_row K_LIST[] = {
    {KROW("adamw, half gradients, grad_scale 0.5", adamw, .alpha = 0.5), 4,
     {KLP, KR(KLIST_TOTAL, -1, 1), KF(CA_F32, KLIST_TOTAL, -0.1, 0.1), KF(CA_F32, KLIST_TOTAL, 0, 0.01)}, FLT},
    {KROW("sgd momentum, half gradients, first step, grad_scale 0.25", sgd, .alpha = 0.25, .flag = true), 3,
     {KLP, KR(KLIST_TOTAL, -1, 1), KF(CA_F32, KLIST_TOTAL, -0.1, 0.1)}, FLT},
    {KROW("sgd momentum, half gradients, grad_scale 2", sgd, .alpha = 2.0), 3,
     {KLP, KR(KLIST_TOTAL, -1, 1), KF(CA_F32, KLIST_TOTAL, -0.1, 0.1)}, FLT},
    {KROW("sum_squares beta 1", sum_squares, .beta = 1.0), 2, {KR(KLIST_TOTAL, -1, 1), KF(CA_F32, 1, 0, 10)}, FLT,
     T_SUM},
    {KROW("scale_list 0.5", scale_list, .alpha = 0.5), 1, {KR(KLIST_TOTAL, -4, 4)}, FLT},
    {KROW("unscale_check by 0 (the awkward values: inf * 0 is NaN)", unscale_check, .alpha = 0.0), 2,
     {KG(KLIST_TOTAL, gen_awkward, NULL), KFG(CA_F32, 1, NULL, ZERO1)}, FLT},
    {KROW("unscale_check 2^-16, finite", unscale_check, .alpha = 1.0 / 65536), 2,
     {KR(KLIST_TOTAL, -4, 4), KFG(CA_F32, 1, NULL, ZERO1)}, FLT},
    {KROW("clamp_list -0.5, 0.25", clamp_list, .alpha = -0.5, .beta = 0.25), 1, {KR(KLIST_TOTAL, -2, 2)}, FLT},
    {KROW("clamp_list 1, -1", clamp_list, .alpha = 1.0, .beta = -1.0), 1, {KR(KLIST_TOTAL, -2, 2)}, FLT,
     .error = "lo 1 is greater than hi -1"},
};

static void run_kernel_table(const kernel_row *rows, size_t nrows) {
    for (size_t k = 0; k < nrows; k++)
        for (int dt = 0; dt < 6; dt++)
            if (rows[k].dtypes & B(dt)) run_kernel_row(&rows[k], (ca_dtype)dt, 0x13198a2e03707344ull + k * 7919 +
                (uint64_t)dt);
}

/* ------------------------------------------------------------------ cmocka */

#define TABLE(t) static void test_##t(void **state) { run_table(t, sizeof t / sizeof t[0]); }
TABLE(MATMUL)
TABLE(COPY)
TABLE(UNARY)
TABLE(BINARY)
TABLE(REDUCE)
TABLE(SOFTMAX)
TABLE(NORM)
TABLE(INDEX)
TABLE(RANDOM)
TABLE(ATTENTION)
/* The attention rows again with a scratch budget of 1 byte (CACCEL_CUDA_ATT_SCRATCH, read per call): the
 * CUDA kernels then run one head per chunk, several chunks per call, as long sequences do. */
static void test_ATTENTION_chunked(void **state) {
    setenv("CACCEL_CUDA_ATT_SCRATCH", "1", 1);
    run_table(ATTENTION, sizeof ATTENTION / sizeof ATTENTION[0]);
    unsetenv("CACCEL_CUDA_ATT_SCRATCH");
}
TABLE(OPTIM)
TABLE(ACCEL)

/* The host values of t (f32, at most 1024). */
static void heads_host(ca_tensor *t, float *h, int64_t n) {
    assert_int_equal(ca_tensor_numel(t), n);
    T_OK(ca_tensor_to_host(T_NN(ca_contiguous(ca_detach(t))), h, (size_t)n * sizeof(float)));
}

/* ca_scaled_dot_product_attention_heads: heads [2, 4) of 4 (a tensor-parallel rank's) with dropout drop
 * what the whole attention drops for them, forward and backward, bit for bit, and leave the generator
 * where the whole attention leaves it; heads outside [0, heads) are refused. */
static void test_ATTENTION_heads(void **state) {
    (void)state;
    ca_device *cpu = ca_cpu_device();
    int64_t sh[4] = {2, 4, 6, 8};
    enum { N = 2 * 2 * 6 * 8 };
    ca_manual_seed(11);
    ca_tensor *in[3], *part_in[3];
    for (int i = 0; i < 3; i++) {
        in[i] = T_NN(ca_rand_uniform(cpu, CA_F32, 4, sh, -1.0f, 1.0f));
        part_in[i] = T_NN(ca_contiguous(ca_narrow(in[i], 1, 2, 2)));
        ca_tensor_set_requires_grad(in[i], true);
        ca_tensor_set_requires_grad(part_in[i], true);
    }
    uint64_t seed, whole_off, part_off;
    ca_manual_seed(3);
    ca_tensor *whole = T_NN(ca_scaled_dot_product_attention(in[0], in[1], in[2], NULL, true, 0.3, 0));
    ca_rng_get_state(&seed, &whole_off);
    ca_manual_seed(3);
    ca_tensor *part = T_NN(ca_scaled_dot_product_attention_heads(part_in[0], part_in[1], part_in[2], NULL, true, 0.3,
                                                                 0, 2, 4));
    ca_rng_get_state(&seed, &part_off);
    assert_true(whole_off == part_off);
    static float a[N], b[N];
    heads_host(ca_narrow(whole, 1, 2, 2), a, N);
    heads_host(part, b, N);
    assert_memory_equal(a, b, sizeof a);
    T_OK(ca_autograd_backward(T_NN(ca_sum(ca_square(ca_narrow(whole, 1, 2, 2))))));
    T_OK(ca_autograd_backward(T_NN(ca_sum(ca_square(part)))));
    for (int i = 0; i < 3; i++) {
        heads_host(ca_narrow(ca_tensor_grad(in[i]), 1, 2, 2), a, N);
        heads_host(ca_tensor_grad(part_in[i]), b, N);
        assert_memory_equal(a, b, sizeof a);
    }
    ca_manual_seed(3);   /* without the stream's heads the part draws other masks */
    heads_host(T_NN(ca_scaled_dot_product_attention(part_in[0], part_in[1], part_in[2], NULL, true, 0.3, 0)), b, N);
    heads_host(ca_narrow(whole, 1, 2, 2), a, N);
    assert_true(memcmp(a, b, sizeof a) != 0);
    assert_null(ca_scaled_dot_product_attention_heads(part_in[0], part_in[1], part_in[2], NULL, true, 0.3, 0, 3, 4));
    assert_non_null(strstr(ca_last_error(), "q's 2 heads from head 3 are not within 4 heads"));
}
#define KTABLE(t) static void test_##t(void **state) { run_kernel_table(t, sizeof t / sizeof t[0]); }
KTABLE(K_GEMM)
KTABLE(K_CAST)
KTABLE(K_UNARY)
KTABLE(K_BINARY)
KTABLE(K_REDUCE)
KTABLE(K_NN)
KTABLE(K_LIST)

/* Deterministic mode on the GPU: gather_backward adds in position order (the CPU's bits), sum_squares sums
 * its block partials in a fixed order (the same bits run after run), embedding_backward gives the CPU's
 * bits (it is ordered in every mode). */
static void *det_up(ca_device *g, const void *x, size_t bytes) {
    void *p = NULL;
    T_OK(ca_device_alloc(g, bytes, &p));
    T_OK(ca_device_copy_from_host(g, p, x, bytes));
    return p;
}
static void test_cuda_deterministic(void **state) {
    (void)state;
    ca_device *g = devs[DEV_CUDA], *c = ca_cpu_device();
    if (!g) {
        printf("SKIP cuda deterministic mode: %s\n", skip_reason[DEV_CUDA]);
        return;
    }
    enum { OUTER = 3, LEN = 7, INNER = 5, N = 40, NY = OUTER * N * INNER, NX = OUTER * LEN * INNER };
    static float dy[NY], dx_cpu[NX], dx_gpu[NX];
    static int32_t idx[NY];
    for (int i = 0; i < NY; i++) {
        dy[i] = sinf((float)i) * (i % 3 == 0 ? 1e4f : 1.0f);   /* magnitudes whose sum depends on the order */
        idx[i] = (i * 7 + i / 3) % LEN;
    }
    for (int i = 0; i < NX; i++) dx_cpu[i] = 0.25f * (float)i;
    void *ddy = det_up(g, dy, sizeof dy), *didx = det_up(g, idx, sizeof idx), *ddx = det_up(g, dx_cpu, sizeof dx_cpu);
    ca_gather_backward_args a = {sizeof a, CA_F32, OUTER, LEN, INNER, N, CA_I32, idx, dy, dx_cpu};
    T_OK(ca_device_kernels(c)->gather_backward(ca_device_context(c), &a));
    ca_device_set_deterministic(g, true);
    a.idx = didx; a.dy = ddy; a.dx = ddx;
    T_OK(ca_device_kernels(g)->gather_backward(ca_device_context(g), &a));
    T_OK(ca_device_copy_to_host(g, dx_gpu, ddx, sizeof dx_gpu));
    assert_memory_equal(dx_gpu, dx_cpu, sizeof dx_cpu);

    /* 3 tensors over several 4096-element blocks: the partials summed in block order, twice the same bits */
    static float x[3][9001];
    void *px[3];
    int64_t numel[3] = {9001, 1, 5000};
    for (int t = 0; t < 3; t++) {
        for (int i = 0; i < 9001; i++) x[t][i] = sinf((float)(i + 7 * t)) * (i % 5 == 0 ? 100.0f : 0.01f);
        px[t] = det_up(g, x[t], sizeof x[t]);
    }
    float out[2] = {0, 0}, zero = 0.0f;
    void *dout = det_up(g, &zero, sizeof zero);
    ca_tensor_list tl = {.count = 3, .param = px, .numel = numel, .grad_dtype = CA_F32};
    ca_sum_squares_args sq = {sizeof sq, &tl, dout, 0.0f};
    double want = 0.0;
    for (int t = 0; t < 3; t++)
        for (int64_t i = 0; i < numel[t]; i++) want += (double)x[t][i] * x[t][i];
    for (int r = 0; r < 2; r++) {
        T_OK(ca_device_kernels(g)->sum_squares(ca_device_context(g), &sq));
        T_OK(ca_device_copy_to_host(g, &out[r], dout, sizeof out[r]));
    }
    assert_memory_equal(&out[0], &out[1], sizeof out[0]);
    assert_true(fabs(out[0] - want) <= 1e-5 * want);

    /* embedding backward adds each table row's gradients in index order (sorted runs) in every mode: the
     * CPU's bits, with magnitudes whose sum depends on the order */
    static float et_cpu[LEN], et_gpu[LEN];
    for (int i = 0; i < LEN; i++) et_cpu[i] = 0.5f * (float)i;
    void *det = det_up(g, et_cpu, sizeof et_cpu);
    ca_embedding_backward_args e = {sizeof e, CA_F32, NY, LEN, 1, CA_I32, idx, dy, et_cpu};
    T_OK(ca_device_kernels(c)->embedding_backward(ca_device_context(c), &e));
    e.idx = didx; e.dy = ddy; e.dtable = det;
    T_OK(ca_device_kernels(g)->embedding_backward(ca_device_context(g), &e));
    T_OK(ca_device_copy_to_host(g, et_gpu, det, sizeof et_gpu));
    assert_memory_equal(et_gpu, et_cpu, sizeof et_cpu);
    ca_device_set_deterministic(g, false);
    ca_device_free(g, ddy); ca_device_free(g, didx); ca_device_free(g, ddx); ca_device_free(g, dout);
    ca_device_free(g, det);
    for (int t = 0; t < 3; t++) ca_device_free(g, px[t]);
}

/* Every slot of CA_KERNEL_LIST has a conformance case: an op row reached it (on the count device) or a
 * kernel row ran it. */
static void test_coverage(void **state) {
    for (int i = 0; i < KS_COUNT; i++)
        if (!slot_covered[i]) fail_msg("kernel slot %s has no conformance case: add an op row or a kernel row",
                                       slot_name[i]);
}

static const char *tol_str(const oc_tol *t, char *buf, size_t len) {
    if (tol_exact(t)) return "exact";
    snprintf(buf, len, "%s", t->why);
    return buf;
}

static void dtype_names(unsigned dtypes, char *dts, size_t len) {
    dts[0] = 0;
    for (int dt = 0; dt < 6; dt++)
        if (dtypes & B(dt)) snprintf(dts + strlen(dts), len - strlen(dts), "%s%s", dts[0] ? "," : "",
            ca_dtype_name((ca_dtype)dt));
}

/* The kernel rows: table | row | dtypes | slot | what the cuda column allows. */
static void list_kernel_rows(void) {
#define L(t) {#t, t, sizeof t / sizeof t[0]}
    static const struct { const char *name; const kernel_row *rows; size_t n; } tables[] = {
        L(K_GEMM), L(K_CAST), L(K_UNARY), L(K_BINARY), L(K_REDUCE), L(K_NN), L(K_LIST),
    };
#undef L
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
        for (size_t k = 0; k < tables[t].n; k++) {
            const kernel_row *r = &tables[t].rows[k];
            char dts[64], f[160];
            dtype_names(r->dtypes, dts, sizeof dts);
            printf("%s | %s | %s | kernel %s | %s | cuda: %s\n", tables[t].name, r->name, dts, slot_name[r->slot],
                   r->error ? "error" : "buffers", tol_str(&r->tol, f, sizeof f));
        }
}

/* test_ops --list: the rows, their dtypes, and what the cuda column allows. */
static void list_rows(void) {
#define L(t) {#t, t, sizeof t / sizeof t[0]}
    static const struct { const char *name; const op_case *rows; size_t n; } tables[] = {
        L(MATMUL), L(COPY), L(UNARY), L(BINARY), L(REDUCE), L(SOFTMAX), L(NORM), L(INDEX), L(RANDOM),
        L(ATTENTION), L(OPTIM), L(ACCEL),
    };
#undef L
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
        for (size_t k = 0; k < tables[t].n; k++) {
            const op_case *r = &tables[t].rows[k];
            char dts[64] = "", f[160], b[160];
            for (int dt = 0; dt < 6; dt++)
                if (r->dtypes & B(dt)) snprintf(dts + strlen(dts), sizeof dts - strlen(dts), "%s%s", dts[0] ? "," : "",
                    ca_dtype_name((ca_dtype)dt));
            printf("%s | %s | %s | %s | cuda forward: %s | backward: %s\n", tables[t].name, r->name, dts,
                   r->error ? "error" : (!r->grad ? "forward" : (r->no_fd ? "backward" : "backward, differences")),
                   tol_str(&r->fwd, f, sizeof f), r->grad ? tol_str(&r->bwd, b, sizeof b) : "-");
        }
    list_kernel_rows();
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        list_rows();
        return 0;
    }
    ca_log_set_level(CA_LOG_WARNING);
    /* The reference keeps denormals as IEEE says (the CPU backend flushes them by default, for speed):
     * CUDA's kernels, built without -ftz, keep them, and 1 / 3e38 must be the same denormal on both. The
     * xla column runs the same host kernels in the same mode; flushing has its own test (test_cpu_fpmode).
     * The CPU backend reads the variable at its first kernel. */
    setenv("CACCEL_CPU_FLUSH_DENORMAL", "0", 1);
    open_devices();
    /* tools/gpu-check.sh --no-gpu: the CUDA plugin built from the bundle has loaded and said why it
     * has no device; without that device the table is the CPU and xla columns make check runs in
     * every build, so the run ends here as a skip, with the reason */
    const char *gpu_only = getenv("CACCEL_TEST_OPS_GPU_ONLY");
    if (gpu_only && strcmp(gpu_only, "1") == 0 && !devs[DEV_CUDA]) {
        printf("SKIP: test_ops: the cuda column: %s (CACCEL_TEST_OPS_GPU_ONLY=1: the cpu and xla columns "
               "run in make check)\n", skip_reason[DEV_CUDA]);
        ca_scope_release_all();
        ca_shutdown();
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_MATMUL),  cmocka_unit_test(test_COPY),    cmocka_unit_test(test_UNARY),
        cmocka_unit_test(test_BINARY),  cmocka_unit_test(test_REDUCE),  cmocka_unit_test(test_SOFTMAX),
        cmocka_unit_test(test_NORM),    cmocka_unit_test(test_INDEX),   cmocka_unit_test(test_RANDOM),
        cmocka_unit_test(test_ATTENTION), cmocka_unit_test(test_ATTENTION_chunked), cmocka_unit_test(test_ATTENTION_heads), cmocka_unit_test(test_OPTIM),   cmocka_unit_test(test_ACCEL),
        cmocka_unit_test(test_K_GEMM),  cmocka_unit_test(test_K_CAST),  cmocka_unit_test(test_K_UNARY),
        cmocka_unit_test(test_K_BINARY), cmocka_unit_test(test_K_REDUCE), cmocka_unit_test(test_K_NN),
        cmocka_unit_test(test_K_LIST),  cmocka_unit_test(test_cuda_deterministic), cmocka_unit_test(test_coverage),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    printf("test_ops: %lld row runs on devices, %lld with finite differences\n", (long long)runs, (long long)fd_runs);
    ca_scope_release_all();
    ca_shutdown();
    return rc;
}
