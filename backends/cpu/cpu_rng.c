/* CPU counter-based random numbers: Philox4x32-10, uniform and normal draws, dropout (the contract of backend.h). */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_parallel.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* Counters per block: the words of one block live on the stack. */
#define RNG_BLOCK 256

/* Philox on `count` (<= RNG_BLOCK) counters at once, laid out as separate
 * lanes so that the ten rounds vectorise across counters. */
CPU_CLONES static void philox_block(uint32_t k0, uint32_t k1, uint64_t counter, int count,
                                    uint32_t *restrict out) {
    uint32_t c0[RNG_BLOCK], c1[RNG_BLOCK], c2[RNG_BLOCK], c3[RNG_BLOCK];
    for (int j = 0; j < count; j++) {
        uint64_t c = counter + (uint64_t)j;
        c0[j] = (uint32_t)c;
        c1[j] = (uint32_t)(c >> 32);
        c2[j] = 0;
        c3[j] = 0;
    }
    for (int r = 0; r < 10; r++) {
        for (int j = 0; j < count; j++) {
            uint64_t p0 = (uint64_t)PHILOX_M0 * c0[j];
            uint64_t p1 = (uint64_t)PHILOX_M1 * c2[j];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[j] ^ k0;
            uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[j] ^ k1;
            c1[j] = (uint32_t)p1;
            c3[j] = (uint32_t)p0;
            c0[j] = n0;
            c2[j] = n2;
        }
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    for (int j = 0; j < count; j++) {
        out[4 * j + 0] = c0[j];
        out[4 * j + 1] = c1[j];
        out[4 * j + 2] = c2[j];
        out[4 * j + 3] = c3[j];
    }
}

void cpu_philox_words(uint64_t seed, uint64_t counter, int64_t count, uint32_t *out) {
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int64_t j = 0; j < count; j += RNG_BLOCK) {
        int c = count - j < RNG_BLOCK ? (int)(count - j) : RNG_BLOCK;
        philox_block(k0, k1, counter + (uint64_t)j, c, out + 4 * j);
    }
}

#define TWO_M24 5.9604644775390625e-08f /* 2^-24 */

CPU_CLONES static void words_uniform(const uint32_t *restrict w, int64_t n, float lo, float span,
                                     float *restrict y) {
    for (int64_t i = 0; i < n; i++) y[i] = lo + span * ((float)(w[i] >> 8) * TWO_M24);
}

static void words_normal(const uint32_t *restrict w, int64_t n, float mean, float sd,
                         float *restrict y) {
    const float two_pi = 6.28318530717958648f;
    for (int64_t i = 0; i < n; i++) {
        float u1 = (float)((w[2 * i] >> 8) + 1u) * TWO_M24;
        float u2 = (float)(w[2 * i + 1] >> 8) * TWO_M24;
        y[i] = mean + sd * (sqrtf(-2.0f * logf(u1)) * cosf(two_pi * u2));
    }
}

/* Element i of a draw comes from counter offset + i / (elements per counter) alone, so a block of
 * RNG_BLOCK counters can be drawn on any thread: the output is the same at every thread count. */

/* Blocks [lo, hi) of RNG_BLOCK counters of an rng call. */
static void rng_range(void *ctx, int64_t lo, int64_t hi) {
    const ca_rng_args *a = ctx;
    uint32_t words[4 * RNG_BLOCK];
    float buf[2 * RNG_BLOCK];
    /* elements per block of RNG_BLOCK counters */
    int64_t per = a->kind == CA_RNG_NORMAL ? 2 * RNG_BLOCK : 4 * RNG_BLOCK;
    for (int64_t blk = lo; blk < hi; blk++) {
        int64_t i0 = blk * per, c = a->n - i0 < per ? a->n - i0 : per;
        cpu_philox_words(a->seed, a->offset + (uint64_t)blk * RNG_BLOCK, (int64_t)ca_rng_counters(a->kind, c), words);
        for (int64_t j = 0; j < c; j += 2 * RNG_BLOCK) {
            int64_t cj = c - j < 2 * RNG_BLOCK ? c - j : 2 * RNG_BLOCK;
            float *out = a->dt == CA_F32 ? (float *)a->y + i0 + j : buf;
            if (a->kind == CA_RNG_UNIFORM)
                words_uniform(words + j, cj, a->a, a->b - a->a, out);
            else
                words_normal(words + 2 * j, cj, a->a, a->b, out);
            if (a->dt != CA_F32) cpu_from_f32(a->dt, buf, cj, a->y, i0 + j);
        }
    }
}

ca_status cpu_rng(void *dev, const ca_rng_args *args) {
    int64_t per = args->kind == CA_RNG_NORMAL ? 2 * RNG_BLOCK : 4 * RNG_BLOCK;
    /* ten Philox rounds per counter (and log/cos per normal): several streaming elements' work each */
    cpu_parallel_for((args->n + per - 1) / per, cpu_grain_for(4 * per), rng_range, (void *)args);
    return CA_OK;
}

CPU_CLONES static void dropout_f32(const uint32_t *restrict w, int64_t n, float p, float scale,
                                   const float *restrict x, float *restrict y,
                                   uint8_t *restrict mask) {
    for (int64_t i = 0; i < n; i++) {
        float u = (float)(w[i] >> 8) * TWO_M24;
        y[i] = x[i] * (u >= p ? scale : 0.0f);
        mask[i] = (uint8_t)(u >= p);
    }
}

/* Blocks [lo, hi) of 4 * RNG_BLOCK elements of a dropout (one RNG_BLOCK of counters each). */
static void dropout_range(void *ctx, int64_t lo, int64_t hi) {
    const ca_dropout_args *a = ctx;
    float scale = a->p < 1.0f ? 1.0f / (1.0f - a->p) : 0.0f;
    uint32_t words[4 * RNG_BLOCK];
    float xb[4 * RNG_BLOCK], yb[4 * RNG_BLOCK];
    uint8_t mb[4 * RNG_BLOCK];
    for (int64_t blk = lo; blk < hi; blk++) {
        int64_t i0 = blk * 4 * RNG_BLOCK, c = a->n - i0 < 4 * RNG_BLOCK ? a->n - i0 : 4 * RNG_BLOCK;
        cpu_philox_words(a->seed, a->offset + (uint64_t)blk * RNG_BLOCK,
                         (int64_t)ca_rng_counters(CA_RNG_UNIFORM, c), words);
        const float *xs = cpu_view_f32(a->dt, a->x, i0, c, xb);
        float *ys = a->dt == CA_F32 && a->x != a->y ? (float *)a->y + i0 : yb;
        dropout_f32(words, c, a->p, scale, xs, ys, a->mask ? a->mask + i0 : mb);
        if (ys == yb) cpu_from_f32(a->dt, yb, c, a->y, i0);
    }
}

ca_status cpu_dropout(void *dev, const ca_dropout_args *args) {
    int64_t per = 4 * RNG_BLOCK;
    cpu_parallel_for((args->n + per - 1) / per, cpu_grain_for(4 * per), dropout_range, (void *)args);
    return CA_OK;
}

CPU_CLONES static void dropout_bwd_f32(int64_t n, float scale, const uint8_t *restrict mask,
                                       const float *restrict dy, float beta, float *restrict dx) {
    if (beta == 0.0f) {
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * ((float)mask[i] * scale);
    } else {
        for (int64_t i = 0; i < n; i++) dx[i] = beta * dx[i] + dy[i] * ((float)mask[i] * scale);
    }
}

/* Elements [lo, hi) of a dropout backward. */
static void dropout_bwd_range(void *ctx, int64_t lo, int64_t hi) {
    const ca_dropout_backward_args *a = ctx;
    ca_dtype dt = a->dt;
    float scale = a->p < 1.0f ? 1.0f / (1.0f - a->p) : 0.0f;
    float db[CPU_CHUNK], xb[CPU_CHUNK];
    for (int64_t off = lo; off < hi; off += CPU_CHUNK) {
        int64_t c = hi - off < CPU_CHUNK ? hi - off : CPU_CHUNK;
        const float *d = cpu_view_f32(dt, a->dy, off, c, db);
        if (dt == CA_F32 && a->dx != a->dy) {
            dropout_bwd_f32(c, scale, a->mask + off, d, a->beta, (float *)a->dx + off);
            continue;
        }
        if (a->beta != 0.0f) cpu_to_f32(dt, a->dx, off, c, xb);
        dropout_bwd_f32(c, scale, a->mask + off, d, a->beta, xb);
        cpu_from_f32(dt, xb, c, a->dx, off);
    }
}

ca_status cpu_dropout_backward(void *dev, const ca_dropout_backward_args *args) {
    cpu_parallel_for(args->n, cpu_grain_for(args->dt == CA_F32 ? 1 : 2), dropout_bwd_range, (void *)args);
    return CA_OK;
}
