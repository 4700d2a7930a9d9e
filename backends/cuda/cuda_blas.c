/* cuBLAS, loaded when the first GPU opens rather than with the plugin: libcublas brings libcublasLt
 * (over 500 MB), whose mapping and relocation cost every process about 0.1 s and 25,000 page faults
 * at start-up, on machines without a GPU too, where the plugin only reports that there is none. */
#include "backends/cuda/cuda_impl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define CU_STR_(x) #x
#define CU_STR(x) CU_STR_(x)
/* the soname the toolkit's headers describe: "libcublas.so.13" */
#define CU_BLAS_SONAME "libcublas.so." CU_STR(CUBLAS_VER_MAJOR)

cu_blas_api cu_blas;
static pthread_once_t cu_blas_once = PTHREAD_ONCE_INIT;
static char cu_blas_why[512];   /* empty once loaded */

/* dlsym into a function pointer of the header's own type (names through the v2 macros:
 * cublasCreate is cublasCreate_v2). */
#define CU_BIND(field, fn)                                                                  \
    do {                                                                                    \
        void *p_ = dlsym(h, CU_STR(fn));                                                    \
        if (!p_) {                                                                          \
            snprintf(cu_blas_why, sizeof cu_blas_why, "%s has no symbol %s", CU_BLAS_SONAME, \
                     CU_STR(fn));                                                           \
            return;                                                                         \
        }                                                                                   \
        memcpy(&cu_blas.field, &p_, sizeof p_);                                             \
    } while (0)

static void cu_blas_load_once(void) {
    /* the plugin's run path names the toolkit's library directory; LD_LIBRARY_PATH also applies */
    void *h = dlopen(CU_BLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(cu_blas_why, sizeof cu_blas_why, "%s", e ? e : CU_BLAS_SONAME ": not found");
        return;
    }
    CU_BIND(create, cublasCreate);
    CU_BIND(destroy, cublasDestroy);
    CU_BIND(set_stream, cublasSetStream);
    CU_BIND(set_workspace, cublasSetWorkspace);
    CU_BIND(set_math_mode, cublasSetMathMode);
    CU_BIND(status_name, cublasGetStatusName);
    CU_BIND(status_string, cublasGetStatusString);
    CU_BIND(gemm_strided_batched_ex, cublasGemmStridedBatchedEx);
    cu_blas.loaded = true;
}

ca_status cu_blas_load(const char *what) {
    pthread_once(&cu_blas_once, cu_blas_load_once);
    if (cu_blas.loaded) return CA_OK;
    ca_error(CA_ERR_BACKEND, "%s: cuBLAS could not be loaded: %s", what, cu_blas_why);
    ca_error_hint("the CUDA plugin was built against cuBLAS %d (the CUDA toolkit's): install it, or put the "
                  "directory holding %s on LD_LIBRARY_PATH", CUBLAS_VER_MAJOR, CU_BLAS_SONAME);
    return CA_ERR_BACKEND;
}
