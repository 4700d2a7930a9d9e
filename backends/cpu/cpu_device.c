/* The CPU device vtable: host memory, synchronous copies, dummy streams/events, OpenBLAS threads. */
#include "backends/cpu/cpu_impl.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define CPU_ALIGN 64

static ca_status cpu_device_count(int *count, char *reason, size_t reason_len) {
    if (!count) return ca_error(CA_ERR_INVALID, "cpu device_count: count is NULL");
    *count = 1;
    if (reason && reason_len) reason[0] = '\0';
    return CA_OK;
}

static int env_positive(const char *name, int def) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end != '\0' || x < 1 || x > 1 << 20) return def;
    return (int)x;
}

static int online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

/* Online cores shared among the processes of this machine, unless the user
 * has told OpenBLAS (or OpenMP) how many threads to use. 0 = leave as is. */
int cpu_default_blas_threads(void) {
    const char *ob = getenv("OPENBLAS_NUM_THREADS"), *omp = getenv("OMP_NUM_THREADS");
    if ((ob && *ob) || (omp && *omp)) return 0;
    int procs = env_positive("LOCAL_WORLD_SIZE", env_positive("OMPI_COMM_WORLD_LOCAL_SIZE", 1));
    int t = online_cpus() / procs;
    return t < 1 ? 1 : t;
}

static ca_status cpu_open(int index, const ca_device_open_args *args, void **dev) {
    if (!dev) return ca_error(CA_ERR_INVALID, "cpu open: output pointer is NULL");
    *dev = NULL;
    if (index != 0)
        return ca_error(CA_ERR_NOT_FOUND, "cpu open: no device %d (the cpu backend has one device, 0)",
                        index);
    cpu_device *d = calloc(1, sizeof *d);
    if (!d) return ca_error(CA_ERR_NOMEM, "cpu open: out of host memory");
    d->index = index;
    int t = cpu_default_blas_threads();
    if (t > 0) openblas_set_num_threads(t);
    d->blas_threads = openblas_get_num_threads();
    *dev = d;
    return CA_OK;
}

static void cpu_close(void *dev) {
    cpu_device *d = dev;
    if (!d) return;
    free(d->scratch);
    free(d);
}

/* "model name" (x86) or the first of a few other keys ARM/POWER kernels use. */
static void cpu_model_name(char *out, size_t len) {
    snprintf(out, len, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    static const char *keys[] = {"model name", "Model", "cpu model", "Hardware", "cpu"};
    char line[512];
    int best = (int)(sizeof keys / sizeof keys[0]);
    while (fgets(line, sizeof line, f)) {
        for (int k = 0; k < best; k++) {
            size_t kl = strlen(keys[k]);
            if (strncmp(line, keys[k], kl) != 0) continue;
            const char *p = line + kl;
            while (*p == ' ' || *p == '\t') p++;
            if (*p != ':') continue;
            p++;
            while (*p == ' ' || *p == '\t') p++;
            size_t l = strcspn(p, "\n");
            if (l == 0) continue;
            snprintf(out, len, "%.*s", (int)l, p);
            best = k;
            break;
        }
        if (best == 0) break;
    }
    fclose(f);
}

static ca_status cpu_describe(void *dev, char *buf, size_t len) {
    if (!buf || !len) return ca_error(CA_ERR_INVALID, "cpu describe: buffer is NULL or empty");
    char model[256];
    cpu_model_name(model, sizeof model);
    const char *config = openblas_get_config(), *core = openblas_get_corename();
    snprintf(buf, len, "%s, %d threads; %s, core %s, %d BLAS threads; %s", model, online_cpus(),
             config ? config : "OpenBLAS", core ? core : "?", openblas_get_num_threads(), cpu_bf16_gemm_path());
    return CA_OK;
}

static ca_status cpu_mem_alloc(void *dev, size_t bytes, void **ptr) {
    if (!ptr) return ca_error(CA_ERR_INVALID, "cpu mem_alloc: output pointer is NULL");
    if (bytes > SIZE_MAX - CPU_ALIGN)
        return ca_error(CA_ERR_NOMEM, "cpu mem_alloc: %zu bytes is more than can be addressed", bytes);
    size_t rounded = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    if (rounded == 0) rounded = CPU_ALIGN;
    *ptr = aligned_alloc(CPU_ALIGN, rounded);
    if (!*ptr) return ca_error(CA_ERR_NOMEM, "cpu mem_alloc: out of host memory (%zu bytes)", bytes);
    return CA_OK;
}

static void cpu_mem_free(void *dev, void *ptr) { free(ptr); }

static ca_status cpu_memcpy(void *dev, void *dst, const void *src, size_t bytes, ca_copy_kind kind,
                            bool async) {
    if (bytes == 0) return CA_OK;
    if (!dst || !src)
        return ca_error(CA_ERR_INVALID, "cpu memcpy: %s pointer is NULL (%zu bytes)",
                        dst ? "source" : "destination", bytes);
    if ((unsigned)kind > CA_COPY_D2D)
        return ca_error(CA_ERR_INVALID, "cpu memcpy: unknown copy kind %d", (int)kind);
    memmove(dst, src, bytes);
    return CA_OK;
}

/* Execution is synchronous, so streams and events only need to be distinct
 * valid handles. */
typedef struct cpu_handle {
    int kind;
} cpu_handle;

static ca_status handle_new(int kind, void **out, const char *what) {
    if (!out) return ca_error(CA_ERR_INVALID, "cpu %s_create: output pointer is NULL", what);
    cpu_handle *h = malloc(sizeof *h);
    if (!h) return ca_error(CA_ERR_NOMEM, "cpu %s_create: out of host memory", what);
    h->kind = kind;
    *out = h;
    return CA_OK;
}

static ca_status cpu_stream_create(void *dev, void **stream) { return handle_new(1, stream, "stream"); }
static void cpu_stream_destroy(void *dev, void *stream) { free(stream); }
static ca_status cpu_set_stream(void *dev, void *stream) { return CA_OK; }
static ca_status cpu_event_create(void *dev, void **event) { return handle_new(2, event, "event"); }
static void cpu_event_destroy(void *dev, void *event) { free(event); }
static ca_status cpu_event_record(void *dev, void *event, void *stream) {
    if (!event) return ca_error(CA_ERR_INVALID, "cpu event_record: event is NULL");
    return CA_OK;
}
static ca_status cpu_stream_wait_event(void *dev, void *stream, void *event) {
    if (!event) return ca_error(CA_ERR_INVALID, "cpu stream_wait_event: event is NULL");
    return CA_OK;
}
static ca_status cpu_event_synchronize(void *dev, void *event) {
    if (!event) return ca_error(CA_ERR_INVALID, "cpu event_synchronize: event is NULL");
    return CA_OK;
}
static ca_status cpu_synchronize(void *dev) { return CA_OK; }

static const ca_kernels cpu_kernels = {
    .struct_size = sizeof(ca_kernels),
    .abi_version = CA_ABI_VERSION,
    .gemm = cpu_gemm,
    .fill = cpu_fill,
    .cast = cpu_cast,
    .copy_strided = cpu_copy_strided,
    .unary = cpu_unary,
    .unary_backward = cpu_unary_backward,
    .binary = cpu_binary,
    .axpby = cpu_axpby,
    .reduce = cpu_reduce,
    .argmax = cpu_argmax,
    .softmax = cpu_softmax,
    .softmax_backward = cpu_softmax_backward,
    .cross_entropy = cpu_cross_entropy,
    .cross_entropy_backward = cpu_cross_entropy_backward,
    .layer_norm = cpu_layer_norm,
    .layer_norm_backward = cpu_layer_norm_backward,
    .embedding = cpu_embedding,
    .embedding_backward = cpu_embedding_backward,
    .rng = cpu_rng,
    .dropout = cpu_dropout,
    .dropout_backward = cpu_dropout_backward,
    .adamw = cpu_adamw,
    .sgd = cpu_sgd,
    .sum_squares = cpu_sum_squares,
    .scale_list = cpu_scale_list,
    .unscale_check = cpu_unscale_check,
    .clamp_list = cpu_clamp_list,
    .attention = cpu_attention,
    .attention_backward = cpu_attention_backward,
    .where = cpu_where,
    .gather = cpu_gather,
    .gather_backward = cpu_gather_backward,
};

const ca_device_ops cpu_device_ops = {
    .struct_size = sizeof(ca_device_ops),
    .abi_version = CA_ABI_VERSION,
    .name = "cpu",
    .device_count = cpu_device_count,
    .open = cpu_open,
    .close = cpu_close,
    .describe = cpu_describe,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .host_alloc = NULL,
    .host_free = NULL,
    .memcpy = cpu_memcpy,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .set_stream = cpu_set_stream,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_synchronize = cpu_event_synchronize,
    .synchronize = cpu_synchronize,
    .kernels = &cpu_kernels,
    .allocator = NULL,
    .allocator_ctx = NULL,
    .host_memory = true,
};
