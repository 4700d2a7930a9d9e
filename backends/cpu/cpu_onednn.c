/* oneDNN's GEMMs for the CPU backend, loaded at run time when present: bf16 (dnnl_gemm_bf16bf16f32) and
 * f32 (dnnl_sgemm). */
#include "backends/cpu/cpu_impl.h"

#include <caccel/log.h>
#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/*
 * Why: bf16 operands converted to f32 blocks and fed to sgemm cost more than f32
 * itself. oneDNN (Debian's libdnnl2, which python3-torch also installs) has a
 * row-major bf16 x bf16 -> f32 GEMM that uses AVX512_BF16 where the CPU has it.
 * Its f32 GEMM (dnnl_sgemm) measured 2-31% faster than OpenBLAS 0.3.21's AVX-512
 * kernels on the MLP's shapes, most at batch 16-32, and 4-14% on square ones from
 * 128 (bench/RESULTS.md; BERT's Linear shapes: equal). The library is found with dlopen, so libcaccel gains no link
 * dependency. The choices:
 *   CACCEL_CPU_BF16_GEMM=auto|onednn|convert: auto takes oneDNN when the library
 *     loads and the CPU has AVX512_BF16, else converts;
 *   CACCEL_CPU_GEMM=auto|onednn|openblas (f32): auto takes oneDNN when the library
 *     loads and OpenBLAS itself runs AVX-512 kernels (where it was measured; a user
 *     who set OPENBLAS_CORETYPE=Haswell keeps the AVX2 kernels asked for), for GEMMs
 *     of at least CPU_ONEDNN_MIN_MNK multiply-adds run with one BLAS thread: below
 *     that size OpenBLAS's small-matrix kernels measured faster (0.5 against 1.8 us
 *     at 16 x 10 x 128). With more BLAS threads, from CPU_ONEDNN_MIN_MNK_THREADED
 *     (64 Mi) multiply-adds: at 2 threads OpenBLAS's pool trained the MLP (GEMMs up to
 *     26 Mi) as fast or faster than oneDNN's OpenMP pool, while on the transformers'
 *     GEMMs (150 Mi and up) OpenBLAS's threads spent the second core waiting for each
 *     other in sched_yield (bench/serial_profile.py: the GEMMs' work 1.24x at 2 threads)
 *     and oneDNN trained the GPT 6 x 384 step 5% and the BERT step 10-25% faster
 *     (bench/RESULTS.md). onednn sends every f32 GEMM to oneDNN.
 * oneDNN threads with OpenMP; before each call the calling thread's OpenMP count is
 * set to the BLAS thread count (once per change), so deterministic mode's single
 * thread and a GEMM on another thread both hold.
 */

typedef int (*gemm_bf16_fn)(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha,
                            const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta,
                            float *c, int64_t ldc);
typedef int (*gemm_f32_fn)(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                           int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
typedef void (*set_threads_fn)(int);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static gemm_bf16_fn gemm_bf16;         /* set when bf16 GEMMs go through oneDNN */
static gemm_f32_fn gemm_f32;           /* set when f32 GEMMs go through oneDNN */
static bool f32_forced;                /* CACCEL_CPU_GEMM=onednn: every size, any thread count */
static bool f32_behind;                /* OpenBLAS runs kernels below the CPU's: every f32 size to oneDNN */
static set_threads_fn omp_set_threads;
static _Thread_local int omp_now;      /* the calling thread's OpenMP count as last set here (0: not yet) */
static char why[160] = "bf16 GEMM converts to f32";
static char why_f32[160] = "f32 GEMM through OpenBLAS";

static bool cpu_has_bf16(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

/* OpenBLAS runs its AVX-512 kernels (its core as it names it, after OPENBLAS_CORETYPE). */
static bool openblas_avx512(void) {
    const char *c = openblas_get_corename();
    return c && (!strcasecmp(c, "skylakex") || !strcasecmp(c, "cooperlake") || !strcasecmp(c, "sapphirerapids"));
}

/* OpenBLAS's DYNAMIC_ARCH cores whose f32 kernels use AVX2 and FMA or more. */
static const char *const avx2_cores[] = {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids", "excavator"};

const char *cpu_coretype_hint_for(const char *core, bool avx2, bool avx512) {
    if (!core || !avx2) return NULL;
    for (size_t i = 0; i < sizeof avx2_cores / sizeof avx2_cores[0]; i++)
        if (!strcasecmp(core, avx2_cores[i])) return NULL;
    return avx512 ? "SkylakeX" : "Haswell";
}

const char *cpu_openblas_coretype_hint(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    return cpu_coretype_hint_for(openblas_get_corename(), avx2, avx512);
#else
    return NULL;
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

/* Whether bf16 GEMMs should go through oneDNN; `why` says so when not. */
static bool want_bf16(const char *mode, bool *forced) {
    *forced = mode && !strcmp(mode, "onednn");
    if (mode && !strcmp(mode, "convert")) {
        snprintf(why, sizeof why, "bf16 GEMM converts to f32 (CACCEL_CPU_BF16_GEMM=convert)");
        return false;
    }
    if (!*forced && !cpu_has_bf16()) {
        snprintf(why, sizeof why, "bf16 GEMM converts to f32 (no AVX512_BF16)");
        return false;
    }
    return true;
}

/* Whether f32 GEMMs should go through oneDNN; `why_f32` says so when not. */
static bool want_f32(const char *mode, bool *forced) {
    *forced = mode && !strcmp(mode, "onednn");
    if (mode && !strcmp(mode, "openblas")) {
        snprintf(why_f32, sizeof why_f32, "f32 GEMM through OpenBLAS (CACCEL_CPU_GEMM=openblas)");
        return false;
    }
    if (mode && *mode && strcmp(mode, "auto") && !*forced)
        snprintf(why_f32, sizeof why_f32, "f32 GEMM through OpenBLAS (CACCEL_CPU_GEMM=%.40s is not "
                 "auto|onednn|openblas)", mode);
    else if (!*forced && (f32_behind = cpu_openblas_coretype_hint() != NULL))
        return true;
    else if (!*forced && !openblas_avx512())
        snprintf(why_f32, sizeof why_f32, "f32 GEMM through OpenBLAS (its kernels are not AVX-512)");
    else
        return true;
    return false;
}

/* Some CPU models (virtual machines' among them) are unknown to OpenBLAS's detection, which then falls back
 * to kernels without AVX2, several times slower; it reads OPENBLAS_CORETYPE only when it loads, before
 * caccel runs, so the user is told what to set (and oneDNN, which detects the CPU itself, takes the f32
 * GEMMs where it is installed). */
static void warn_behind(void) {
    const char *hint = cpu_openblas_coretype_hint();
    if (!hint) return;
    const char *core = openblas_get_corename();
    CA_LOG_W("OpenBLAS chose its %s kernels on a CPU with %s: its GEMMs run several times slower than this CPU "
             "allows; set OPENBLAS_CORETYPE=%s in the environment%s", core ? core : "?",
             strcmp(hint, "SkylakeX") ? "AVX2" : "AVX-512",
             hint, getenv("OPENBLAS_CORETYPE") ? " (it is set, to a core without these instructions)" : "");
}

static void load(void) {
    warn_behind();
#if defined(__SANITIZE_ADDRESS__)
    /* LeakSanitizer's exit-time scan cannot stop oneDNN's OpenMP threads and crashes */
    snprintf(why, sizeof why, "bf16 GEMM converts to f32 (oneDNN is not used in sanitizer builds)");
    snprintf(why_f32, sizeof why_f32, "f32 GEMM through OpenBLAS (oneDNN is not used in sanitizer builds)");
    return;
#endif
    bool bf16_forced;
    bool bf16 = want_bf16(getenv("CACCEL_CPU_BF16_GEMM"), &bf16_forced);
    bool f32 = want_f32(getenv("CACCEL_CPU_GEMM"), &f32_forced);
    if (!bf16 && !f32) return;
    void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libdnnl.so.3", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        if (bf16)
            snprintf(why, sizeof why, "bf16 GEMM converts to f32 (oneDNN not installed: Debian package libdnnl2)");
        if (f32)
            snprintf(why_f32, sizeof why_f32, "f32 GEMM through OpenBLAS (oneDNN not installed: Debian package "
                     "libdnnl2)");
        return;
    }
    int (*get_isa)(void) = (int (*)(void))(uintptr_t)dlsym(h, "dnnl_get_effective_cpu_isa");
    const char *isa = get_isa ? isa_name(get_isa()) : "ISA unknown";
    if (bf16) {
        gemm_bf16 = (gemm_bf16_fn)(uintptr_t)dlsym(h, "dnnl_gemm_bf16bf16f32");
        if (!gemm_bf16)
            snprintf(why, sizeof why, "bf16 GEMM converts to f32 (this oneDNN has no dnnl_gemm_bf16bf16f32)");
        else
            snprintf(why, sizeof why, "bf16 GEMM through oneDNN (%s)%s", isa,
                     bf16_forced ? " (CACCEL_CPU_BF16_GEMM=onednn)" : "");
    }
    if (f32) {
        gemm_f32 = (gemm_f32_fn)(uintptr_t)dlsym(h, "dnnl_sgemm");
        if (!gemm_f32)
            snprintf(why_f32, sizeof why_f32, "f32 GEMM through OpenBLAS (this oneDNN has no dnnl_sgemm)");
        else if (f32_forced)
            snprintf(why_f32, sizeof why_f32, "f32 GEMM through oneDNN (CACCEL_CPU_GEMM=onednn)");
        else if (f32_behind)
            snprintf(why_f32, sizeof why_f32, "f32 GEMM through oneDNN (OpenBLAS runs its %s kernels: "
                     "OPENBLAS_CORETYPE=%s)", openblas_get_corename(), cpu_openblas_coretype_hint());
        else
            snprintf(why_f32, sizeof why_f32, "f32 GEMM through oneDNN from 2^%d multiply-adds (2^%d at >1 BLAS "
                     "thread)", __builtin_ctz(CPU_ONEDNN_MIN_MNK), __builtin_ctz(CPU_ONEDNN_MIN_MNK_THREADED));
    }
    omp_set_threads = (set_threads_fn)(uintptr_t)dlsym(h, "omp_set_num_threads");
}

/* oneDNN's OpenMP pool gets n threads (the BLAS thread count of the moment, or 1 for a block of a GEMM
 * split over the kernels' team), on the calling thread. */
static void omp_threads_n(int n) {
    if (n < 1) n = 1;
    if (omp_set_threads && omp_now != n) {
        omp_set_threads(n);
        omp_now = n;
    }
}

static void omp_threads(void) { omp_threads_n(openblas_get_num_threads()); }

const char *cpu_bf16_gemm_path(void) {
    pthread_once(&once, load);
    return why;
}

const char *cpu_f32_gemm_path(void) {
    pthread_once(&once, load);
    return why_f32;
}

bool cpu_bf16_gemm_available(void) {
    pthread_once(&once, load);
    return gemm_bf16 != NULL;
}

bool cpu_f32_gemm_onednn_at(int64_t m, int64_t n, int64_t k, int threads) {
    pthread_once(&once, load);
    if (!gemm_f32) return false;
    int64_t mnk = m * n * k;
    return f32_forced || f32_behind || mnk >= (threads <= 1 ? CPU_ONEDNN_MIN_MNK : CPU_ONEDNN_MIN_MNK_THREADED);
}

bool cpu_f32_gemm_onednn(int64_t m, int64_t n, int64_t k) {
    return cpu_f32_gemm_onednn_at(m, n, k, openblas_get_num_threads());
}

/* A oneDNN GEMM's status as the kernel's: the function and the sizes named on failure. */
static ca_status gemm_status(int rc, const char *fn, int64_t m, int64_t n, int64_t k) {
    if (rc == 0) return CA_OK;
    return ca_error(CA_ERR_BACKEND, "cpu kernel gemm: oneDNN %s failed (status %d, m %lld, n %lld, k %lld)", fn, rc,
                    (long long)m, (long long)n, (long long)k);
}

ca_status cpu_bf16_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                        int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    omp_threads();
    return gemm_status(gemm_bf16(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc),
                       "dnnl_gemm_bf16bf16f32", m, n, k);
}

ca_status cpu_onednn_sgemm_threads(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                                   const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                                   int64_t ldc) {
    omp_threads_n(threads);
    return gemm_status(gemm_f32(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc),
                       "dnnl_sgemm", m, n, k);
}
