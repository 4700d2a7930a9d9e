/* The CPU device vtable: host memory, synchronous copies, dummy streams/events, OpenBLAS threads. */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_parallel.h"
#include "backends/cpu/cpu_plugin.h"

#include <caccel/log.h>
#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#define CPU_ALIGN 64

static ca_status cpu_device_count(int *count, char *reason, size_t reason_len) {
    if (!count) return ca_error(CA_ERR_INVALID, "cpu device_count: count is NULL");
    *count = 1;
    if (reason && reason_len) reason[0] = '\0';
    return CA_OK;
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
    cpu_threads_open();
    d->blas_threads = openblas_get_num_threads();
    *dev = d;
    return CA_OK;
}

static pthread_mutex_t det_mu = PTHREAD_MUTEX_INITIALIZER;
static int det_users, det_saved_threads;
static atomic_bool det_on;   /* det_users > 0, read by every GEMM */

bool cpu_deterministic(void) { return atomic_load_explicit(&det_on, memory_order_relaxed); }

void ca_cpu_set_deterministic(bool on) {
    pthread_mutex_lock(&det_mu);
    if (on && det_users++ == 0) {
        det_saved_threads = cpu_blas_threads();
        cpu_blas_set_threads(1);
    } else if (!on && det_users > 0 && --det_users == 0) {
        cpu_blas_set_threads(det_saved_threads);
    }
    atomic_store(&det_on, det_users > 0);
    pthread_mutex_unlock(&det_mu);
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
    static const char *blas_par[] = {"serial", "pthreads", "OpenMP"};
    int par = openblas_get_parallel();
    char clamp[320], note[340] = "";
    cpu_threads_clamp(clamp, sizeof clamp);
    if (clamp[0]) snprintf(note, sizeof note, " (%s)", clamp);
    snprintf(buf, len, "%s, %d threads; %d kernel threads%s; %s, core %s, %d BLAS threads (%s); %s; %s", model,
             cpu_online_cpus(), cpu_threads(), note, config ? config : "OpenBLAS", core ? core : "?",
             openblas_get_num_threads(), par >= 0 && par <= 2 ? blas_par[par] : "?", cpu_f32_gemm_path(),
             cpu_bf16_gemm_path());
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

/* ------------------------------------------------ floating-point mode */

/* Kernels that compute run with subnormals flushed (FTZ: subnormal results
 * become 0; DAZ: subnormal inputs read as 0): Intel cores take a microcode
 * assist of ~100+ cycles per subnormal operand, and optimizer state decays
 * into that range. Only the control bits are switched, and only for the
 * call: the caller's mode comes back, the kernel's exception flags stay, as
 * after any function call. Kernels that move or select values (fill, cast,
 * copies, gather, embedding, where, argmax, clamp) keep them bit-exact. */
#if defined(__SSE2__)
#define CPU_FP_FLUSH 0x8040u /* MXCSR: FTZ (bit 15) | DAZ (bit 6) */
#endif

static atomic_int flush_mode = -1; /* -1: CACCEL_CPU_FLUSH_DENORMAL not read yet */

static bool env_flush_default(void) {
    const char *v = getenv("CACCEL_CPU_FLUSH_DENORMAL");
    if (!v || !*v) return true;
    if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "off") || !strcasecmp(v, "no"))
        return false;
    if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "on") || !strcasecmp(v, "yes"))
        return true;
    CA_LOG_W("CACCEL_CPU_FLUSH_DENORMAL=%s is not 0/1/true/false/on/off/yes/no: flushing stays on", v);
    return true;
}

static bool flush_on(void) {
    int m = atomic_load_explicit(&flush_mode, memory_order_relaxed);
    if (m < 0) {
        int want = env_flush_default() ? 1 : 0, unset = -1;
        atomic_compare_exchange_strong(&flush_mode, &unset, want);
        m = atomic_load(&flush_mode);
    }
    return m == 1;
}

void ca_cpu_set_flush_denormal(bool on) { atomic_store(&flush_mode, on ? 1 : 0); }

bool ca_cpu_flush_denormal(void) {
#if defined(CPU_FP_FLUSH)
    return flush_on();
#else
    return false;
#endif
}

/* Returns the caller's MXCSR; turns flushing on for the call when it is wanted and not on yet
 * (with flushing off the kernel runs in the caller's mode, whatever it is). */
static inline unsigned fp_enter(void) {
#if defined(CPU_FP_FLUSH)
    unsigned s = _mm_getcsr();
    if ((s & CPU_FP_FLUSH) != CPU_FP_FLUSH && flush_on()) _mm_setcsr(s | CPU_FP_FLUSH);
    return s;
#else
    return 0;
#endif
}

/* Restores the caller's FTZ and DAZ bits; the status flags the kernel raised stay. */
static inline void fp_leave(unsigned saved) {
#if defined(CPU_FP_FLUSH)
    unsigned now = _mm_getcsr();
    if ((now & CPU_FP_FLUSH) != (saved & CPU_FP_FLUSH))
        _mm_setcsr((now & ~CPU_FP_FLUSH) | (saved & CPU_FP_FLUSH));
#else
    (void)saved;
#endif
}

/* The kernels whose results flushing would change although they do no arithmetic on floats: they
 * convert (fill, cast), compare (argmax, clamp_list) or move bytes, so they keep denormals as
 * they are. (strcmp of two literals folds to a constant.) */
#define CPU_EXACT(slot)                                                                           \
    (!strcmp(slot, "fill") || !strcmp(slot, "cast") || !strcmp(slot, "copy_strided") ||          \
     !strcmp(slot, "argmax") || !strcmp(slot, "embedding") || !strcmp(slot, "clamp_list") ||      \
     !strcmp(slot, "where") || !strcmp(slot, "gather"))

/* fz_<slot>: cpu_<slot> between fp_enter and fp_leave (the others as they are). */
#define FZ(slot)                                                                  \
    static ca_status fz_##slot(void *dev, const ca_##slot##_args *args) {         \
        if (CPU_EXACT(#slot)) return cpu_##slot(dev, args);                        \
        unsigned saved_ = fp_enter();                                              \
        ca_status st_ = cpu_##slot(dev, args);                                     \
        fp_leave(saved_);                                                          \
        return st_;                                                                \
    }
CA_KERNEL_LIST(FZ)
#undef FZ

#define CPU_SLOT(slot) .slot = fz_##slot,
static const ca_kernels cpu_kernels = {
    .struct_size = sizeof(ca_kernels),
    .abi_version = CA_ABI_VERSION,
    CA_KERNEL_LIST(CPU_SLOT)
};
#undef CPU_SLOT

/* The device slot: determinism is process-wide on the cpu (one GEMM thread pool). */
static void cpu_set_deterministic(void *dev, bool on) {
    (void)dev;
    ca_cpu_set_deterministic(on);
}

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
    .kind = CA_DEVICE_HOST,
    .set_deterministic = cpu_set_deterministic,
    .attention_strides = true,
};
