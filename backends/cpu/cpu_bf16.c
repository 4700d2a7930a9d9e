/* Native bf16 GEMM for the CPU backend: oneDNN's dnnl_gemm_bf16bf16f32, loaded at run time when present. */
#include "backends/cpu/cpu_impl.h"

#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Why: bf16 operands converted to f32 blocks and fed to sgemm cost more than f32
 * itself. oneDNN (Debian's libdnnl2, which python3-torch also installs) has a
 * row-major bf16 x bf16 -> f32 GEMM that uses AVX512_BF16 where the CPU has it.
 * It is found with dlopen, so libcaccel gains no link dependency. The choice
 * is CACCEL_CPU_BF16_GEMM=auto|onednn|convert; auto takes oneDNN when the library
 * loads and the CPU has AVX512_BF16 (bench/RESULTS.md has the measurement behind
 * this rule), else converts.
 */

typedef int (*gemm_bf16_fn)(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha,
                            const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta,
                            float *c, int64_t ldc);
typedef void (*set_threads_fn)(int);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static gemm_bf16_fn gemm_bf16;
static set_threads_fn omp_set_threads;
static atomic_bool loaded;             /* oneDNN's GEMM and thread setter are in place */
static char why[160] = "bf16 GEMM converts to f32";

static bool cpu_has_bf16(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

/* The instruction set oneDNN dispatches its kernels for (dnnl_get_effective_cpu_isa): its cpu_isa flags
 * build up bit by bit, 0xe7 avx512_core_bf16 and 0x3e7 avx512_core_amx (the AMX bits 0x300; checked
 * against oneDNN 2.6 with ONEDNN_MAX_CPU_ISA), so that a bf16 run can say which it used. */
static const char *isa_name(int isa) {
    if ((isa & 0x3e7) == 0x3e7) return "ISA avx512_core_amx: AMX";
    if ((isa & 0xe7) == 0xe7) return "ISA avx512_core_bf16: AVX512_BF16";
    if ((isa & 0x27) == 0x27) return "ISA avx512_core: no bf16 instructions";
    return "ISA below AVX-512: no bf16 instructions";
}

static void load(void) {
#if defined(__SANITIZE_ADDRESS__)
    /* LeakSanitizer's exit-time scan cannot stop oneDNN's OpenMP threads and crashes */
    snprintf(why, sizeof why, "bf16 GEMM converts to f32 (oneDNN is not used in sanitizer builds)");
    return;
#endif
    const char *mode = getenv("CACCEL_CPU_BF16_GEMM");
    if (mode && !strcmp(mode, "convert")) {
        snprintf(why, sizeof why, "bf16 GEMM converts to f32 (CACCEL_CPU_BF16_GEMM=convert)");
        return;
    }
    bool forced = mode && !strcmp(mode, "onednn");
    if (!forced && !cpu_has_bf16()) {
        snprintf(why, sizeof why, "bf16 GEMM converts to f32 (no AVX512_BF16)");
        return;
    }
    void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libdnnl.so.3", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, sizeof why, "bf16 GEMM converts to f32 (oneDNN not installed: Debian package libdnnl2)");
        return;
    }
    gemm_bf16 = (gemm_bf16_fn)(uintptr_t)dlsym(h, "dnnl_gemm_bf16bf16f32");
    omp_set_threads = (set_threads_fn)(uintptr_t)dlsym(h, "omp_set_num_threads");
    if (!gemm_bf16) {
        snprintf(why, sizeof why, "bf16 GEMM converts to f32 (this oneDNN has no dnnl_gemm_bf16bf16f32)");
        return;
    }
    /* oneDNN threads with OpenMP: give it the BLAS thread count */
    if (omp_set_threads) omp_set_threads(openblas_get_num_threads());
    atomic_store(&loaded, true);
    int (*get_isa)(void) = (int (*)(void))(uintptr_t)dlsym(h, "dnnl_get_effective_cpu_isa");
    snprintf(why, sizeof why, "bf16 GEMM through oneDNN (%s)%s", get_isa ? isa_name(get_isa()) : "ISA unknown",
             forced ? " (CACCEL_CPU_BF16_GEMM=onednn)" : "");
}

void cpu_bf16_set_threads(int n) {
    /* not loaded yet: load() will take the BLAS thread count, which is n by then */
    if (atomic_load(&loaded) && omp_set_threads) omp_set_threads(n);
}

const char *cpu_bf16_gemm_path(void) {
    pthread_once(&once, load);
    return why;
}

bool cpu_bf16_gemm_available(void) {
    pthread_once(&once, load);
    return gemm_bf16 != NULL;
}

ca_status cpu_bf16_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                        int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    int rc = gemm_bf16(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (rc != 0)
        return ca_error(CA_ERR_BACKEND, "cpu kernel gemm: oneDNN dnnl_gemm_bf16bf16f32 failed (status %d, "
                        "m %lld, n %lld, k %lld)", rc, (long long)m, (long long)n, (long long)k);
    return CA_OK;
}
