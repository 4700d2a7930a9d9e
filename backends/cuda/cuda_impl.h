/* cuda_impl.h: private definitions of the CUDA backend: device context, error conversion, allocator and kernel entry points (shared by the C and CUDA sources). */
#ifndef CACCEL_CUDA_IMPL_H
#define CACCEL_CUDA_IMPL_H

#include <caccel/backend.h>
#include <caccel/log.h>
#include "base/kernel_check_impl.h"

#include <cuda_runtime_api.h>
#include <cublas_v2.h>

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The architectures the kernels were built for ("80;90"), from configure. */
#ifndef CA_CUDA_ARCHS
#define CA_CUDA_ARCHS "?"
#endif

typedef struct cu_alloc cu_alloc;   /* the caching allocator (cuda_alloc.c) */

/* Pinned staging for host-to-device copies from pageable memory (cuda_device.c): a copy goes
 * through the slots in turn, CU_STAGE_BYTES at a time, and returns without waiting for the GPU;
 * a slot's event says when the GPU has read it, and a slot is refilled only after that. */
#define CU_STAGE_SLOTS 4
#define CU_STAGE_BYTES ((size_t)4 << 20)
typedef struct cu_stage_slot {
    void *buf;                /* pinned, CU_STAGE_BYTES */
    cudaEvent_t ev;           /* recorded after the copy that reads buf */
} cu_stage_slot;

/* A problem a kernel found in its data (a label out of range, a negative
 * index). The device cannot return an error from a kernel, so the first such
 * problem is recorded here, in mapped pinned memory, and the next call that
 * synchronises (a copy to the host, synchronize, event_synchronize) reports it
 * as CA_ERR_INVALID. With CACCEL_CUDA_SYNC=1 every kernel call synchronises
 * and reports it itself. */
typedef enum cu_err_kind {
    CU_ERR_NONE = 0,
    CU_ERR_CE_LABEL = 1,      /* cross_entropy(+backward): label outside [0, cols), not ignore_index */
    CU_ERR_EMB_INDEX = 2,     /* embedding(+backward): index outside [0, rows) */
    CU_ERR_GATHER_INDEX = 3   /* gather(+backward): index outside [0, len) */
} cu_err_kind;

typedef struct cu_dev_error {
    int code;                 /* cu_err_kind; the first kernel to set it wins */
    int backward;             /* 1 when the backward kernel found it */
    long long index;          /* row / position */
    long long value;          /* the label / index */
    long long bound;          /* cols / table rows */
    long long extra;          /* ignore_index */
} cu_dev_error;

/* The context behind every `dev` pointer of this backend. */
typedef struct cuda_device {
    int index;                /* caccel's device index */
    int ordinal;              /* the CUDA device ordinal (after gpu_ids) */
    cudaStream_t default_stream;
    cudaStream_t stream;      /* the current stream: kernels, copies, cuBLAS, NCCL */
    void *cublas;             /* cublasHandle_t */
    cu_alloc *alloc;
    cu_dev_error *err_host;   /* mapped pinned memory ... */
    cu_dev_error *err_dev;    /* ... and its device address */
    int *err_claim;           /* device word: the first kernel to swap 0 -> 1 writes the record */
    bool sync_checks;         /* CACCEL_CUDA_SYNC=1 or CUDA_LAUNCH_BLOCKING=1 */
    int deterministic;        /* set_deterministic users: kernels with atomics take an ordered path or refuse */
    int sm_count;
    int cc_major, cc_minor;
    size_t total_mem;
    char name[256];
    /* cuBLAS's workspace on the default stream (CU_BLAS_WORKSPACE bytes): cublasSetStream resets
     * the handle to cuBLAS's own pool, so set_stream hands it back when the default is current */
    void *blas_workspace;
    /* f32 GEMMs on TF32 tensor cores (torch's allow_tf32 for matmul; off by default): the
     * config key allow_tf32 (CACCEL_ALLOW_TF32=1), or torch's TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 */
    bool allow_tf32;
    pthread_mutex_t stage_mu; /* the dataloader's thread and the main thread both copy */
    cu_stage_slot stage[CU_STAGE_SLOTS];
    int stage_next;
    bool stage_failed;        /* no pinned memory for it: copies wait for the stream instead */
} cuda_device;

/* cuBLAS's workspace per handle: 32 MiB, as torch gives it on sm_90 (CUBLAS_WORKSPACE_CONFIG's
 * default there), so that cuBLASLt's split-K kernels need no allocation of their own. */
#define CU_BLAS_WORKSPACE ((size_t)32 << 20)

/* ------------------------------------------------------------ errors */

/* Records "<what>: <cudaErrorName>: <description>" (what is printf-formatted)
 * and returns CA_ERR_NOMEM for allocation failures, else CA_ERR_BACKEND. A
 * sticky error (the context is unusable) gets a hint saying so. */
ca_status cu_error_at(cudaError_t e, const char *file, int line, const char *fmt, ...)
    CA_PRINTF(4, 5);

/* Converts a failing CUDA runtime call into a ca_error at the boundary. */
#define CA_CUDA_TRY(call, ...)                                                       \
    do {                                                                             \
        cudaError_t ca_cu_e_ = (call);                                               \
        if (ca_cu_e_ != cudaSuccess) return cu_error_at(ca_cu_e_, __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

/* The same with a cleanup label: sets `st` and jumps. */
#define CA_CUDA_TRY_GOTO(call, st, label, ...)                                       \
    do {                                                                             \
        cudaError_t ca_cu_e_ = (call);                                               \
        if (ca_cu_e_ != cudaSuccess) {                                               \
            (st) = cu_error_at(ca_cu_e_, __FILE__, __LINE__, __VA_ARGS__);           \
            goto label;                                                              \
        }                                                                            \
    } while (0)

/* Makes d's GPU current on the calling thread (each entry point does this:
 * the dataloader and the communicator call from their own threads). */
ca_status cu_enter(cuda_device *d, const char *what);

/* After a kernel launch: the launch error, and with sync_checks the
 * execution error and the kernel's data problems. */
ca_status cu_after_launch(cuda_device *d, const char *kernel);

/* After a synchronisation: reports (and clears) a data problem a kernel found. */
ca_status cu_check_deferred(cuda_device *d);

/* Error for a dtype a kernel does not take (as the CPU backend words it). */
ca_status cu_bad_dtype(const char *kernel, const char *what, ca_dtype dt);

/* -------------------------------------------------------- allocator */

ca_status cu_alloc_create(cuda_device *d, cu_alloc **out);
void cu_alloc_destroy(cu_alloc *a);
extern const ca_allocator_ops cu_allocator_ops;
/* Device scratch for a kernel on the current stream, from the cache (so a
 * steady state makes no cudaMalloc); freed when the call returns: the stream
 * orders its reuse after the kernel. */
ca_status cu_tmp_alloc(cuda_device *d, size_t bytes, void **ptr);
void cu_tmp_free(cuda_device *d, void *ptr);
/* Says that the block holding ptr (allocated for another stream) is used on `stream` too, as
 * torch's recordStream: its free is then held back until the work queued there so far is done. */
void cu_alloc_record_stream(cu_alloc *a, const void *ptr, cudaStream_t stream);

/* ------------------------------------------------------------ cuBLAS */

/* The cuBLAS calls the backend makes, bound by cu_blas_load (cuda_blas.c) the first time a GPU
 * opens; the plugin does not link cuBLAS, so a process that never opens a GPU never maps it. */
typedef struct cu_blas_api {
    bool loaded;
    cublasStatus_t (*create)(cublasHandle_t *handle);
    cublasStatus_t (*destroy)(cublasHandle_t handle);
    cublasStatus_t (*set_stream)(cublasHandle_t handle, cudaStream_t stream);
    cublasStatus_t (*set_workspace)(cublasHandle_t handle, void *workspace, size_t bytes);
    cublasStatus_t (*set_math_mode)(cublasHandle_t handle, cublasMath_t mode);
    const char *(*status_name)(cublasStatus_t status);
    const char *(*status_string)(cublasStatus_t status);
    cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t handle, cublasOperation_t transa,
                                              cublasOperation_t transb, int m, int n, int k, const void *alpha,
                                              const void *a, cudaDataType a_type, int lda, long long stride_a,
                                              const void *b, cudaDataType b_type, int ldb, long long stride_b,
                                              const void *beta, void *c, cudaDataType c_type, int ldc,
                                              long long stride_c, int batch, cublasComputeType_t compute,
                                              cublasGemmAlgo_t algo);
} cu_blas_api;
extern cu_blas_api cu_blas;
/* Loads cuBLAS once per process (thread-safe); CA_ERR_BACKEND naming `what` and the loader's reason
 * when it cannot. */
ca_status cu_blas_load(const char *what);

/* ----------------------------------------------------------- device */

extern const ca_device_ops cu_device_ops;
/* CUDA runtime version string ("CUDA 13.0 runtime, driver 13.0"). */
const char *cu_version_string(void);
/* 0 devices: why (the driver's words). Returns the device count. */
int cu_visible_devices(char *reason, size_t reason_len);
/* cudaSuccess when the kernels can run on the current GPU (an image for its
 * architecture is in the plugin). */
cudaError_t cu_probe_kernels(void);

/* ---------------------------------------------------------- kernels */

/* cu_<slot>(dev, args) for every slot of CA_KERNEL_LIST. */
#define CU_KERNEL_PROTO(slot) ca_status cu_##slot(void *dev, const ca_##slot##_args *args);
CA_KERNEL_LIST(CU_KERNEL_PROTO)
#undef CU_KERNEL_PROTO
/* C[i] = beta C[i] over `batch` m x n matrices (beta == 0: zeros, C not read);
 * GEMM with k == 0 or alpha == 0. */
ca_status cu_gemm_scale_c(cuda_device *d, ca_dtype dt, int64_t m, int64_t n, int64_t ldc, int64_t stride_c,
                          int64_t batch, float beta, void *c);

/* ------------------------------------------------------- collectives */

extern const ca_collective_ops cu_nccl_ops;
/* "NCCL 2.28.9" */
const char *cu_nccl_version_string(void);

#ifdef __cplusplus
}
#endif
#endif
