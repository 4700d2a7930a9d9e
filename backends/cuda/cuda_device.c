/* The CUDA device vtable: device discovery (with the driver's reason when there is none), gpu_ids, streams, events, copies, and CUDA error conversion. */
#include "backends/cuda/cuda_impl.h"


#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ errors */

ca_status cu_error_at(cudaError_t e, const char *file, int line, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    /* a non-sticky error must not be reported again by the next call */
    cudaGetLastError();
    ca_status s = (e == cudaErrorMemoryAllocation) ? CA_ERR_NOMEM : CA_ERR_BACKEND;
    ca_error_at(s, file, line, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidPc:
    case cudaErrorECCUncorrectable:
        ca_error_hint("this error is sticky: the GPU context is unusable and the process must restart; "
                      "run with CACCEL_CUDA_SYNC=1 to find the kernel that caused it");
        break;
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDeviceFunction:
        ca_error_hint("the plugin was built for sm %s; reconfigure with --with-cuda-arch=<this GPU's "
                      "architecture> and rebuild", CA_CUDA_ARCHS);
        break;
    default:
        break;
    }
    return s;
}

ca_status cu_bad_dtype(const char *kernel, const char *what, ca_dtype dt) {
    return ca_kernel_bad_dtype("cuda", kernel, what, dt);
}

ca_status cu_enter(cuda_device *d, const char *what) {
    if (!d) return ca_error(CA_ERR_INVALID, "cuda %s: device context is NULL", what);
    CA_CUDA_TRY(cudaSetDevice(d->ordinal), "cuda %s: selecting GPU %d", what, d->ordinal);
    return CA_OK;
}

ca_status cu_check_deferred(cuda_device *d) {
    volatile cu_dev_error *e = d->err_host;
    if (!e || e->code == CU_ERR_NONE) return CA_OK;
    cu_dev_error copy = {.code = e->code, .backward = e->backward, .index = e->index,
                         .value = e->value, .bound = e->bound, .extra = e->extra};
    e->code = CU_ERR_NONE;
    if (d->err_claim) cudaMemsetAsync(d->err_claim, 0, sizeof(int), d->stream);
    switch (copy.code) {
    case CU_ERR_CE_LABEL:
        ca_error(CA_ERR_INVALID,
                 "cuda kernel %s: row %lld has label %lld, outside [0, %lld) and not the ignore_index "
                 "%lld (found by the GPU, reported at this synchronisation)",
                 copy.backward ? "cross_entropy_backward" : "cross_entropy", copy.index, copy.value,
                 copy.bound, copy.extra);
        ca_error_hint("labels must be class indices smaller than the number of logits per row");
        return CA_ERR_INVALID;
    case CU_ERR_EMB_INDEX:
        return ca_error(CA_ERR_INVALID,
                        "cuda kernel %s: index %lld at position %lld is outside the table's %lld rows (found "
                        "by the GPU, reported at this synchronisation; the row was skipped)",
                        copy.backward ? "embedding_backward" : "embedding", copy.value, copy.index, copy.bound);
    case CU_ERR_GATHER_INDEX:
        return ca_error(CA_ERR_INVALID,
                        "cuda kernel %s: index %lld at position %lld is outside [0, %lld) (found by the GPU, "
                        "reported at this synchronisation; the element was skipped)",
                        copy.backward ? "gather_backward" : "gather", copy.value, copy.index, copy.bound);
    default:
        return ca_error(CA_ERR_INTERNAL, "cuda: a kernel reported unknown problem %d", copy.code);
    }
}

ca_status cu_after_launch(cuda_device *d, const char *kernel) {
    CA_CUDA_TRY(cudaGetLastError(), "cuda kernel %s: launch", kernel);
    if (!d->sync_checks) return CA_OK;
    CA_CUDA_TRY(cudaStreamSynchronize(d->stream), "cuda kernel %s: execution", kernel);
    return cu_check_deferred(d);
}

/* --------------------------------------------------------- discovery */

const char *cu_version_string(void) {
    static char buf[96];
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
    cudaGetLastError();
    if (drv > 0)
        snprintf(buf, sizeof buf, "CUDA %d.%d (driver supports %d.%d)", rt / 1000, rt % 1000 / 10,
                 drv / 1000, drv % 1000 / 10);
    else
        snprintf(buf, sizeof buf, "CUDA %d.%d (no driver)", rt / 1000, rt % 1000 / 10);
    return buf;
}

/* True when the driver library can be loaded at all. */
static bool driver_library_present(void) {
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) return false;
    dlclose(h);
    return true;
}

int cu_visible_devices(char *reason, size_t reason_len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0) {
        if (reason && reason_len) reason[0] = '\0';
        return n;
    }
    cudaGetLastError();
    if (!reason || !reason_len) return 0;
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (e == cudaSuccess) {
        snprintf(reason, reason_len, "no CUDA-capable device is detected");
    } else if (e == cudaErrorInsufficientDriver && !driver_library_present()) {
        /* the runtime calls this "driver version is insufficient"; say what it is */
        snprintf(reason, reason_len, "no NVIDIA driver is installed: libcuda.so.1 was not found");
    } else if (e == cudaErrorInsufficientDriver) {
        int rt = 0, drv = 0;
        cudaRuntimeGetVersion(&rt);
        cudaDriverGetVersion(&drv);
        cudaGetLastError();
        snprintf(reason, reason_len, "%s (driver supports CUDA %d.%d, the plugin needs %d.%d)",
                 cudaGetErrorString(e), drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
    } else {
        snprintf(reason, reason_len, "%s", cudaGetErrorString(e));
    }
    if (cvd) {
        size_t l = strlen(reason);
        snprintf(reason + l, reason_len - l, " (CUDA_VISIBLE_DEVICES=%s)", cvd);
    }
    return 0;
}

static ca_status cu_device_count(int *count, char *reason, size_t reason_len) {
    if (!count) return ca_error(CA_ERR_INVALID, "cuda device_count: count is NULL");
    *count = cu_visible_devices(reason, reason_len);
    return CA_OK;
}

/* gpu_ids ("all", "0,2", "1"): the ordinal for local rank / index k. */
static ca_status resolve_ordinal(int index, const ca_device_open_args *args, int visible, int *ordinal) {
    *ordinal = index;
    const char *ids = args && args->struct_size >= offsetof(ca_device_open_args, gpu_ids) + sizeof(char *)
                          ? args->gpu_ids : NULL;
    if (ids && *ids && strcmp(ids, "all") != 0) {
        int list[256], n = 0;
        const char *p = ids;
        while (*p) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v > 1 << 20 || n == (int)(sizeof list / sizeof list[0]))
                return ca_error(CA_ERR_CONFIG, "cuda: gpu_ids '%s' is not a list of GPU numbers like \"0,1\"",
                                ids);
            list[n++] = (int)v;
            p = end;
            while (*p == ' ') p++;
            if (*p == ',') p++;
            while (*p == ' ') p++;
        }
        int k = args->local_rank >= 0 ? args->local_rank : index;
        *ordinal = list[k % n];
        if (*ordinal >= visible) {
            ca_error(CA_ERR_CONFIG, "cuda: gpu_ids '%s' names GPU %d, but %d GPU%s visible", ids, *ordinal,
                     visible, visible == 1 ? " is" : "s are");
            ca_error_hint("gpu_ids count GPUs after CUDA_VISIBLE_DEVICES (%s); `nvidia-smi -L` lists them",
                          getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
            return CA_ERR_CONFIG;
        }
    }
    if (*ordinal < 0 || *ordinal >= visible)
        return ca_error(CA_ERR_INVALID, "cuda: no GPU %d (%d visible)", *ordinal, visible);
    return CA_OK;
}

static bool env_on(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* The handle's workspace (when the default stream is current: cublasSetStream just reset it) and
 * math mode. */
static ca_status cu_blas_setup(cuda_device *d, const char *what) {
    cublasHandle_t h = (cublasHandle_t)d->cublas;
    cublasStatus_t bs = CUBLAS_STATUS_SUCCESS;
    if (d->stream == d->default_stream && d->blas_workspace)
        bs = cu_blas.set_workspace(h, d->blas_workspace, CU_BLAS_WORKSPACE);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cu_blas.set_math_mode(h, d->allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    if (bs != CUBLAS_STATUS_SUCCESS)
        return ca_error(CA_ERR_BACKEND, "%s: cublasSetWorkspace/cublasSetMathMode on GPU %d: %s", what, d->ordinal,
                        cu_blas.status_string(bs));
    return CA_OK;
}

static void cu_close(void *dev);
static void stage_free(cuda_device *d);

static ca_status cu_open(int index, const ca_device_open_args *args, void **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "cuda open: output pointer is NULL");
    *out = NULL;
    char reason[256];
    int visible = cu_visible_devices(reason, sizeof reason);
    if (visible == 0) return ca_error(CA_ERR_UNSUPPORTED, "cuda open: no GPU: %s", reason);
    int ordinal;
    void *eh = NULL, *ed = NULL;
    cublasHandle_t h = NULL;
    cublasStatus_t bs;
    ca_status st = resolve_ordinal(index, args, visible, &ordinal);
    if (st != CA_OK) return st;
    cuda_device *d = calloc(1, sizeof *d);
    if (!d) return ca_error(CA_ERR_NOMEM, "cuda open: out of host memory");
    d->index = index;
    d->ordinal = ordinal;
    d->sync_checks = env_on("CACCEL_CUDA_SYNC") || env_on("CUDA_LAUNCH_BLOCKING");
    bool tf32_arg = args && args->struct_size >= offsetof(ca_device_open_args, allow_tf32) + sizeof(bool) &&
                    args->allow_tf32;
    d->allow_tf32 = tf32_arg || env_on("CACCEL_ALLOW_TF32") || env_on("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE");
    pthread_mutex_init(&d->stage_mu, NULL);
    struct cudaDeviceProp prop;
    CA_CUDA_TRY_GOTO(cudaSetDevice(ordinal), st, fail, "cuda open: selecting GPU %d", ordinal);
    CA_CUDA_TRY_GOTO(cudaFree(NULL), st, fail, "cuda open: creating the context of GPU %d", ordinal);
    CA_CUDA_TRY_GOTO(cudaGetDeviceProperties(&prop, ordinal), st, fail, "cuda open: properties of GPU %d",
                     ordinal);
    snprintf(d->name, sizeof d->name, "%s", prop.name);
    d->cc_major = prop.major;
    d->cc_minor = prop.minor;
    d->sm_count = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    d->total_mem = prop.totalGlobalMem;
    cudaError_t pe = cu_probe_kernels();
    if (pe != cudaSuccess) {
        st = cu_error_at(pe, __FILE__, __LINE__, "cuda open: GPU %d (%s, sm_%d%d) cannot run the plugin's "
                         "kernels (built for sm %s)", ordinal, d->name, d->cc_major, d->cc_minor, CA_CUDA_ARCHS);
        goto fail;
    }
    CA_CUDA_TRY_GOTO(cudaStreamCreateWithFlags(&d->default_stream, cudaStreamNonBlocking), st, fail,
                     "cuda open: creating a stream on GPU %d", ordinal);
    d->stream = d->default_stream;
    CA_CUDA_TRY_GOTO(cudaHostAlloc(&eh, sizeof(cu_dev_error), cudaHostAllocMapped | cudaHostAllocPortable),
                     st, fail, "cuda open: pinned memory for kernel error reports");
    d->err_host = eh;
    memset(eh, 0, sizeof(cu_dev_error));
    CA_CUDA_TRY_GOTO(cudaHostGetDevicePointer(&ed, eh, 0), st, fail,
                     "cuda open: device address of the kernel error record");
    d->err_dev = ed;
    CA_CUDA_TRY_GOTO(cudaMalloc((void **)&d->err_claim, sizeof(int)), st, fail,
                     "cuda open: device memory for kernel error reports");
    CA_CUDA_TRY_GOTO(cudaMemsetAsync(d->err_claim, 0, sizeof(int), d->stream), st, fail,
                     "cuda open: clearing the error word");
    st = cu_blas_load("cuda open");
    if (st != CA_OK) goto fail;
    bs = cu_blas.create(&h);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        st = ca_error(bs == CUBLAS_STATUS_ALLOC_FAILED ? CA_ERR_NOMEM : CA_ERR_BACKEND,
                      "cuda open: cublasCreate on GPU %d: %s (%s)", ordinal, cu_blas.status_name(bs),
                      cu_blas.status_string(bs));
        goto fail;
    }
    d->cublas = h;
    bs = cu_blas.set_stream(h, d->stream);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        st = ca_error(CA_ERR_BACKEND, "cuda open: cublasSetStream: %s", cu_blas.status_string(bs));
        goto fail;
    }
    CA_CUDA_TRY_GOTO(cudaMalloc(&d->blas_workspace, CU_BLAS_WORKSPACE), st, fail,
                     "cuda open: cuBLAS's workspace (%zu MiB) on GPU %d", CU_BLAS_WORKSPACE >> 20, ordinal);
    st = cu_blas_setup(d, "cuda open");
    if (st != CA_OK) goto fail;
    st = cu_alloc_create(d, &d->alloc);
    if (st != CA_OK) goto fail;
    *out = d;
    return CA_OK;
fail:
    cu_close(d);
    return st;
}

static void cu_close(void *dev) {
    cuda_device *d = dev;
    if (!d) return;
    cudaSetDevice(d->ordinal);
    cudaDeviceSynchronize();
    cu_alloc_destroy(d->alloc);
    if (d->cublas) cu_blas.destroy((cublasHandle_t)d->cublas);
    if (d->blas_workspace) cudaFree(d->blas_workspace);
    stage_free(d);
    if (d->stream && d->stream != d->default_stream) d->stream = d->default_stream;
    if (d->default_stream) cudaStreamDestroy(d->default_stream);
    if (d->err_host) cudaFreeHost(d->err_host);
    if (d->err_claim) cudaFree(d->err_claim);
    cudaGetLastError();
    pthread_mutex_destroy(&d->stage_mu);
    free(d);
}

static ca_status cu_describe(void *dev, char *buf, size_t len) {
    cuda_device *d = dev;
    if (!d || !buf || !len) return ca_error(CA_ERR_INVALID, "cuda describe: device or buffer is NULL");
    snprintf(buf, len, "%s, sm_%d%d, %.1f GiB", d->name, d->cc_major, d->cc_minor,
             (double)d->total_mem / (1024.0 * 1024.0 * 1024.0));
    return CA_OK;
}

/* ------------------------------------------------------------ memory */

static ca_status cu_mem_alloc(void *dev, size_t bytes, void **ptr) {
    cuda_device *d = dev;
    if (!ptr) return ca_error(CA_ERR_INVALID, "cuda mem_alloc: output pointer is NULL");
    *ptr = NULL;
    ca_status st = cu_enter(d, "mem_alloc");
    if (st != CA_OK) return st;
    CA_CUDA_TRY(cudaMalloc(ptr, bytes ? bytes : 1), "cuda mem_alloc: %zu bytes on GPU %d", bytes, d->ordinal);
    return CA_OK;
}

static void cu_mem_free(void *dev, void *ptr) {
    cuda_device *d = dev;
    if (!ptr || !d) return;
    cudaSetDevice(d->ordinal);
    if (cudaFree(ptr) != cudaSuccess) {
        CA_LOG_E("cuda mem_free of %p: %s", ptr, cudaGetErrorString(cudaGetLastError()));
    }
}

static ca_status cu_host_alloc(void *dev, size_t bytes, void **ptr) {
    cuda_device *d = dev;
    if (!ptr) return ca_error(CA_ERR_INVALID, "cuda host_alloc: output pointer is NULL");
    *ptr = NULL;
    ca_status st = cu_enter(d, "host_alloc");
    if (st != CA_OK) return st;
    CA_CUDA_TRY(cudaHostAlloc(ptr, bytes ? bytes : 1, cudaHostAllocPortable),
                "cuda host_alloc: %zu bytes of pinned host memory", bytes);
    return CA_OK;
}

static void cu_host_free(void *dev, void *ptr) {
    if (!ptr) return;
    if (cudaFreeHost(ptr) != cudaSuccess)
        CA_LOG_E("cuda host_free of %p: %s", ptr, cudaGetErrorString(cudaGetLastError()));
}

/* Whether p is page-locked host memory (cudaHostAlloc'd or registered), which the GPU reads
 * directly and asynchronously. */
static bool is_pinned(const void *p) {
    struct cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return at.type == cudaMemoryTypeHost;
}

/* The staging slots, made on first use; false (and copies wait for the stream) without pinned
 * memory for them. Caller holds stage_mu. */
static bool stage_ready(cuda_device *d) {
    if (d->stage[0].buf) return true;
    if (d->stage_failed) return false;
    for (int i = 0; i < CU_STAGE_SLOTS; i++) {
        cu_stage_slot *sl = &d->stage[i];
        if (cudaHostAlloc(&sl->buf, CU_STAGE_BYTES, cudaHostAllocPortable) != cudaSuccess ||
            cudaEventCreateWithFlags(&sl->ev, cudaEventDisableTiming) != cudaSuccess) {
            cudaGetLastError();
            CA_LOG_W("cuda: no pinned memory for copy staging on GPU %d: host-to-device copies wait for the GPU",
                     d->ordinal);
            d->stage_failed = true;
            return false;
        }
    }
    return true;
}

static void stage_free(cuda_device *d) {
    for (int i = 0; i < CU_STAGE_SLOTS; i++) {
        if (d->stage[i].buf) cudaFreeHost(d->stage[i].buf);
        if (d->stage[i].ev) cudaEventDestroy(d->stage[i].ev);
        d->stage[i].buf = NULL;
        d->stage[i].ev = NULL;
    }
    cudaGetLastError();
}

/* Host (pageable) to device without waiting for the GPU: each chunk is copied into the next slot
 * once the GPU has read that slot's previous chunk, then queued on the stream. The caller may
 * reuse src when this returns; the stream orders dst's readers after the copy. */
static ca_status staged_h2d(cuda_device *d, char *dst, const char *src, size_t bytes, bool *done) {
    *done = false;
    pthread_mutex_lock(&d->stage_mu);
    if (!stage_ready(d)) {
        pthread_mutex_unlock(&d->stage_mu);
        return CA_OK;
    }
    ca_status st = CA_OK;
    for (size_t off = 0; off < bytes && st == CA_OK; off += CU_STAGE_BYTES) {
        size_t n = bytes - off < CU_STAGE_BYTES ? bytes - off : CU_STAGE_BYTES;
        cu_stage_slot *sl = &d->stage[d->stage_next];
        d->stage_next = (d->stage_next + 1) % CU_STAGE_SLOTS;
        cudaError_t e = cudaEventSynchronize(sl->ev);   /* the GPU has read its last chunk */
        if (e == cudaSuccess) {
            memcpy(sl->buf, src + off, n);
            e = cudaMemcpyAsync(dst + off, sl->buf, n, cudaMemcpyHostToDevice, d->stream);
        }
        if (e == cudaSuccess) e = cudaEventRecord(sl->ev, d->stream);
        if (e != cudaSuccess)
            st = cu_error_at(e, __FILE__, __LINE__, "cuda memcpy host to device of %zu bytes (staged, at %zu)", bytes,
                             off);
    }
    pthread_mutex_unlock(&d->stage_mu);
    *done = st == CA_OK;
    return st;
}

/* Device to device never waits (the stream orders it); host to device waits only when it cannot
 * stage (pinned sources with async go directly); device to host waits unless async. */
static ca_status cu_memcpy(void *dev, void *dst, const void *src, size_t bytes, ca_copy_kind kind, bool async) {
    cuda_device *d = dev;
    if (bytes == 0) return CA_OK;
    if (!dst || !src)
        return ca_error(CA_ERR_INVALID, "cuda memcpy: %s pointer is NULL (%zu bytes)",
                        dst ? "source" : "destination", bytes);
    static const char *names[] = {"host to device", "device to host", "device to device"};
    static const enum cudaMemcpyKind kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                                cudaMemcpyDeviceToDevice};
    if ((unsigned)kind > CA_COPY_D2D) return ca_error(CA_ERR_INVALID, "cuda memcpy: unknown copy kind %d", (int)kind);
    ca_status st = cu_enter(d, "memcpy");
    if (st != CA_OK) return st;
    if (kind == CA_COPY_H2D && !(async && is_pinned(src))) {
        bool done = false;
        st = staged_h2d(d, dst, src, bytes, &done);
        if (st != CA_OK || done) return st;
    }
    CA_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kinds[kind], d->stream), "cuda memcpy %s of %zu bytes",
                names[kind], bytes);
    if (async || kind == CA_COPY_D2D) return CA_OK;
    CA_CUDA_TRY(cudaStreamSynchronize(d->stream), "cuda memcpy %s of %zu bytes (waiting for the stream)",
                names[kind], bytes);
    return cu_check_deferred(d);
}

/* A copy on a stream other than the current one (ABI 3.8: an asynchronous save's copy stream), never
 * waiting; a device-to-host copy into pinned memory overlaps the compute stream's kernels. */
static ca_status cu_memcpy_on_stream(void *dev, void *dst, const void *src, size_t bytes, ca_copy_kind kind,
                                     void *stream) {
    cuda_device *d = dev;
    if (bytes == 0) return CA_OK;
    if (!dst || !src)
        return ca_error(CA_ERR_INVALID, "cuda memcpy_on_stream: %s pointer is NULL (%zu bytes)",
                        dst ? "source" : "destination", bytes);
    static const enum cudaMemcpyKind kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                                cudaMemcpyDeviceToDevice};
    if ((unsigned)kind > CA_COPY_D2D)
        return ca_error(CA_ERR_INVALID, "cuda memcpy_on_stream: unknown copy kind %d", (int)kind);
    ca_status st = cu_enter(d, "memcpy_on_stream");
    if (st != CA_OK) return st;
    CA_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kinds[kind], stream ? (cudaStream_t)stream : d->default_stream),
                "cuda memcpy_on_stream of %zu bytes on GPU %d", bytes, d->ordinal);
    return CA_OK;
}

/* ----------------------------------------------------- streams/events */

static ca_status cu_stream_create(void *dev, void **stream) {
    cuda_device *d = dev;
    if (!stream) return ca_error(CA_ERR_INVALID, "cuda stream_create: output pointer is NULL");
    ca_status st = cu_enter(d, "stream_create");
    if (st != CA_OK) return st;
    cudaStream_t s;
    CA_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cuda stream_create");
    *stream = s;
    return CA_OK;
}

static ca_status set_stream_impl(cuda_device *d, cudaStream_t s) {
    if (d->stream == s) return CA_OK;
    cublasStatus_t bs = cu_blas.set_stream((cublasHandle_t)d->cublas, s);
    if (bs != CUBLAS_STATUS_SUCCESS)
        return ca_error(CA_ERR_BACKEND, "cuda set_stream: cublasSetStream: %s", cu_blas.status_string(bs));
    d->stream = s;
    /* the workspace serves the default stream only: kernels of two streams must not share it */
    return cu_blas_setup(d, "cuda set_stream");
}

static void cu_stream_destroy(void *dev, void *stream) {
    cuda_device *d = dev;
    if (!stream || !d) return;
    cudaSetDevice(d->ordinal);
    if (d->stream == (cudaStream_t)stream && set_stream_impl(d, d->default_stream) != CA_OK)
        CA_LOG_E("%s", ca_last_error());
    if ((cudaStream_t)stream == d->default_stream) return;   /* owned by the device */
    cudaStreamDestroy((cudaStream_t)stream);
    cudaGetLastError();
}

static ca_status cu_set_stream(void *dev, void *stream) {
    cuda_device *d = dev;
    ca_status st = cu_enter(d, "set_stream");
    if (st != CA_OK) return st;
    return set_stream_impl(d, stream ? (cudaStream_t)stream : d->default_stream);
}

static ca_status cu_event_create(void *dev, void **event) {
    cuda_device *d = dev;
    if (!event) return ca_error(CA_ERR_INVALID, "cuda event_create: output pointer is NULL");
    ca_status st = cu_enter(d, "event_create");
    if (st != CA_OK) return st;
    cudaEvent_t e;
    CA_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cuda event_create");
    *event = e;
    return CA_OK;
}

static void cu_event_destroy(void *dev, void *event) {
    if (!event) return;
    cudaEventDestroy((cudaEvent_t)event);
    cudaGetLastError();
}

static ca_status cu_event_record(void *dev, void *event, void *stream) {
    cuda_device *d = dev;
    if (!event) return ca_error(CA_ERR_INVALID, "cuda event_record: event is NULL");
    ca_status st = cu_enter(d, "event_record");
    if (st != CA_OK) return st;
    CA_CUDA_TRY(cudaEventRecord((cudaEvent_t)event, stream ? (cudaStream_t)stream : d->default_stream),
                "cuda event_record");
    return CA_OK;
}

static ca_status cu_stream_wait_event(void *dev, void *stream, void *event) {
    cuda_device *d = dev;
    if (!event) return ca_error(CA_ERR_INVALID, "cuda stream_wait_event: event is NULL");
    ca_status st = cu_enter(d, "stream_wait_event");
    if (st != CA_OK) return st;
    CA_CUDA_TRY(cudaStreamWaitEvent(stream ? (cudaStream_t)stream : d->default_stream, (cudaEvent_t)event, 0),
                "cuda stream_wait_event");
    return CA_OK;
}

static ca_status cu_event_synchronize(void *dev, void *event) {
    cuda_device *d = dev;
    if (!event) return ca_error(CA_ERR_INVALID, "cuda event_synchronize: event is NULL");
    ca_status st = cu_enter(d, "event_synchronize");
    if (st != CA_OK) return st;
    CA_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)event), "cuda event_synchronize");
    return cu_check_deferred(d);
}

/* The background writer's wait (ABI 3.8): the event alone; the deferred data errors stay for the device's
 * own thread's next synchronisation. */
static ca_status cu_event_wait_any_thread(void *dev, void *event) {
    cuda_device *d = dev;
    if (!event) return ca_error(CA_ERR_INVALID, "cuda event_wait_any_thread: event is NULL");
    ca_status st = cu_enter(d, "event_wait_any_thread");
    if (st != CA_OK) return st;
    CA_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)event), "cuda event_wait_any_thread (GPU %d)", d->ordinal);
    return CA_OK;
}

static ca_status cu_synchronize(void *dev) {
    cuda_device *d = dev;
    ca_status st = cu_enter(d, "synchronize");
    if (st != CA_OK) return st;
    CA_CUDA_TRY(cudaDeviceSynchronize(), "cuda synchronize (GPU %d)", d->ordinal);
    return cu_check_deferred(d);
}

static void *cu_allocator_ctx(void *dev) { return ((cuda_device *)dev)->alloc; }

/* Deterministic mode (nested on/off calls, balanced): the kernels whose atomics add in a varying order
 * take an ordered path or refuse (docs/CUDA.md, Reproducibility). */
static void cu_set_deterministic(void *dev, bool on) {
    cuda_device *d = dev;
    if (on) d->deterministic++;
    else if (d->deterministic > 0) d->deterministic--;
}

/* The table: cu_<slot> for every slot of CA_KERNEL_LIST. */
#define CU_SLOT(slot) .slot = cu_##slot,
static const ca_kernels cu_kernels = {
    .struct_size = sizeof(ca_kernels),
    .abi_version = CA_ABI_VERSION,
    CA_KERNEL_LIST(CU_SLOT)
};
#undef CU_SLOT

const ca_device_ops cu_device_ops = {
    .struct_size = sizeof(ca_device_ops),
    .abi_version = CA_ABI_VERSION,
    .name = "cuda",
    .device_count = cu_device_count,
    .open = cu_open,
    .close = cu_close,
    .describe = cu_describe,
    .mem_alloc = cu_mem_alloc,
    .mem_free = cu_mem_free,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .memcpy = cu_memcpy,
    .stream_create = cu_stream_create,
    .stream_destroy = cu_stream_destroy,
    .set_stream = cu_set_stream,
    .event_create = cu_event_create,
    .event_destroy = cu_event_destroy,
    .event_record = cu_event_record,
    .stream_wait_event = cu_stream_wait_event,
    .event_synchronize = cu_event_synchronize,
    .synchronize = cu_synchronize,
    .kernels = &cu_kernels,
    .allocator = &cu_allocator_ops,
    .allocator_ctx = cu_allocator_ctx,
    .host_memory = false,
    .kind = CA_DEVICE_GPU,
    .set_deterministic = cu_set_deterministic,
    .memcpy_on_stream = cu_memcpy_on_stream,
    .event_wait_any_thread = cu_event_wait_any_thread,
};
