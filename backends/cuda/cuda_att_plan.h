/* cuda_att_plan.h: how CUDA attention cuts batch x heads into chunks whose [Tq, Tk] f32 score buffers fit a fixed scratch budget (plain C, no CUDA: tests/test_cuda_att_plan.c checks it on any machine). */
#ifndef CACCEL_CUDA_ATT_PLAN_H
#define CACCEL_CUDA_ATT_PLAN_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The default scratch budget of one attention call (CACCEL_CUDA_ATT_SCRATCH=bytes overrides it): at
 * GPT-2's T 1024 a head's forward needs 4 MiB and its backward 8 MiB, so 256 MiB runs 64 (forward) or
 * 32 (backward) heads per batched GEMM, enough to fill a GPU, while a T x T tensor over every head
 * (B 8 x H 12 x T 1024: 768 MiB for the backward, 12 GiB at T 4096) is never allocated. */
#define CU_ATT_SCRATCH_DEFAULT ((size_t)256 << 20)

typedef struct cu_att_plan {
    int64_t heads;    /* heads per chunk (the last chunk may have fewer); >= 1 */
    int64_t chunks;   /* ceil(bh / heads) */
    size_t bytes;     /* the scratch: heads x buffers x tq x tk floats */
} cu_att_plan;

/* Plans bh (>= 1) heads of `buffers` [tq, tk] f32 buffers each (tq, tk >= 1) within `budget` bytes:
 * as many heads per chunk as fit, at least 1 (a single head over the budget still runs, its scratch
 * allocation then fails or not on its own) and at most INT_MAX (cuBLAS's batch count). Returns false
 * when one head's buffers exceed SIZE_MAX. */
static inline bool cu_att_plan_make(int64_t bh, int64_t tq, int64_t tk, int buffers, size_t budget,
                                    cu_att_plan *p) {
    size_t unit = sizeof(float) * (size_t)buffers;
    if ((uint64_t)tq > SIZE_MAX / unit || (uint64_t)tk > SIZE_MAX / unit / (size_t)tq) return false;
    size_t head = unit * (size_t)tq * (size_t)tk;
    int64_t h = (int64_t)(budget / head < (size_t)INT_MAX ? budget / head : (size_t)INT_MAX);
    if (h < 1) h = 1;
    if (h > bh) h = bh;
    p->heads = h;
    p->chunks = (bh + h - 1) / h;
    p->bytes = head * (size_t)h;   /* <= max(budget, head): no overflow */
    return true;
}

/* Grouped-query attention (kv_heads < heads; 0 or heads: every head its own k and v): the g = heads /
 * kv_heads query heads of a kv head are consecutive and read the same K and V, so one GEMM per kv head
 * takes their g Tq query rows at once (dK and dV then sum the group inside the GEMM, without atomics).
 * Plans batch * kv_heads units of g Tq rows each: p->heads counts kv heads per chunk. False when one
 * unit's buffers exceed SIZE_MAX or its g Tq rows cuBLAS's int. */
static inline bool cu_att_plan_groups(int64_t batch, int64_t heads, int64_t kv_heads, int64_t tq, int64_t tk,
                                      int buffers, size_t budget, cu_att_plan *p) {
    int64_t kv = kv_heads > 0 ? kv_heads : heads, g = kv > 0 && heads / kv > 0 ? heads / kv : 1;
    if (tq > INT_MAX / g) return false;
    return cu_att_plan_make(batch * kv, g * tq, tk, buffers, budget, p);
}

#ifdef __cplusplus
}
#endif
#endif
