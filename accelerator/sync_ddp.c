/* Data parallelism (DDP), the strategy of several processes that each hold the whole model:
 * gradient buckets whose all-reduce starts during backward as soon as every gradient of a bucket is
 * final. A comm_hook (fp16, bf16, PowerSGD) changes how a bucket is sent. */
#include "accelerator/sync_impl.h"
#include "accelerator/mesh_impl.h"

#include <stdlib.h>
#include <string.h>

static void bucket_launch_ready(ca_accelerator *acc, int g);

/* A parameter's gradient is final for this backward pass. */
static void grad_ready(ca_tensor *leaf, void *ctx) {
    ca_accelerator *acc = ctx;
    if (!acc->in_backward || !acc->sync) return;
    for (int b = 0; b < acc->nbuckets; b++)
        for (int i = 0; i < acc->buckets[b].nparams; i++)
            if (acc->buckets[b].params[i] == leaf) {
                acc->buckets[b].ready++;
                bucket_launch_ready(acc, acc->buckets[b].group);
                return;
            }
}

/* Gradients no op wrote this pass are zero, so every rank reduces the same layout. */
static ca_status zero_unwritten(ca_bucket *bk) {
    for (int i = 0; i < bk->nparams; i++) {
        ca_tensor *p = bk->params[i];
        if (p->grad_defined) continue;
        ca_status s = CA_KCALL(ca_tdev(p), fill, .dt = CA_F32, .n = p->grad->numel, .value = 0.0,
                               .y = ca_tptr(p->grad));
        if (s != CA_OK) return s;
        p->grad_defined = true;
    }
    return CA_OK;
}

/* ------------------------------------------------------------------ the fp16/bf16 hooks */

/* As PyTorch's compress hooks: the bucket divided by the process count and rounded to 16 bits is
 * summed (in 16 bits, so the sum cannot overflow where the mean does not); wire_finish brings the
 * result back once the all-reduce is done. The bucket's 16-bit copy is its `wire`. */
static ca_status wire_init(ca_accelerator *acc, ca_bucket *bk, ca_dtype dt) {
    ca_tensor *w = ca_zeros(acc->device, dt, 1, &bk->numel);
    if (!w) return ca_last_status();
    bk->wire = ca_tensor_keep(w);
    return CA_OK;
}
static ca_status wire_init_f16(ca_accelerator *acc, ca_bucket *bk) { return wire_init(acc, bk, CA_F16); }
static ca_status wire_init_bf16(ca_accelerator *acc, ca_bucket *bk) { return wire_init(acc, bk, CA_BF16); }

static ca_status wire_launch(ca_accelerator *acc, ca_bucket *bk, bool *done) {
    ca_dtype dt = bk->wire->dtype;
    ca_comm *dp = ca_mesh_grad_comm(acc);   /* the data-parallel ranks (all, without tensor parallelism) */
    *done = true;
    ca_status s = CA_KCALL(ca_tdev(bk->flat), cast, .src_dt = CA_F32, .x = ca_tptr(bk->flat), .dst_dt = dt,
                           .y = ca_tptr(bk->wire), .n = bk->numel, .alpha = 1.0f / (float)ca_comm_size(dp));
    if (s == CA_OK)
        s = ca_comm_all_reduce(dp, ca_tptr(bk->wire), ca_tptr(bk->wire), (size_t)bk->numel, dt, CA_OP_SUM,
                               &bk->work);
    return s;
}

static ca_status wire_finish(ca_bucket *bk) {
    return CA_KCALL(ca_tdev(bk->flat), cast, .src_dt = bk->wire->dtype, .x = ca_tptr(bk->wire),
                    .dst_dt = CA_F32, .y = ca_tptr(bk->flat), .n = bk->numel, .alpha = 1.0f);
}

static void wire_free(ca_bucket *bk) {
    ca_tensor_free(bk->wire);
    bk->wire = NULL;
}

static const ca_bucket_hook hook_fp16 = {
    .name = "fp16", .init = wire_init_f16, .launch = wire_launch, .finish = wire_finish, .free = wire_free,
};
static const ca_bucket_hook hook_bf16 = {
    .name = "bf16", .init = wire_init_bf16, .launch = wire_launch, .finish = wire_finish, .free = wire_free,
};

/* ------------------------------------------------------------------ buckets */

/* The bucket's reduction: the hook's, or the plain f32 average. */
static ca_status launch(ca_accelerator *acc, ca_bucket *bk) {
    ca_status s = zero_unwritten(bk);
    bk->launched = true;
    if (s != CA_OK) return s;
    const ca_bucket_hook *h = acc->bucket_hook;
    bool done = false;
    if (h && h->launch) s = h->launch(acc, bk, &done);
    if (s != CA_OK || done) return s;
    return ca_comm_all_reduce(ca_mesh_grad_comm(acc), ca_tptr(bk->flat), ca_tptr(bk->flat), (size_t)bk->numel, CA_F32,
                              CA_OP_AVG, &bk->work);
}

/* A model's buckets launch strictly in index order on every rank. */
static void bucket_launch_ready(ca_accelerator *acc, int g) {
    while (acc->bucket_status == CA_OK && acc->group_next[g] < acc->group_begin[g + 1]) {
        ca_bucket *bk = &acc->buckets[acc->group_next[g]];
        if (bk->ready < bk->nparams) return;
        acc->bucket_status = launch(acc, bk);
        acc->group_next[g]++;
    }
}

/* Whether this backward reached model g: a model it did not reach (the other network of a GAN)
 * reduces nothing, as its own DDP wrapper would not run. */
static bool group_touched(const ca_accelerator *acc, int g) {
    for (int b = acc->group_begin[g]; b < acc->group_begin[g + 1]; b++)
        if (acc->buckets[b].ready > 0) return true;
    return false;
}

/* After backward: launch what unused parameters held back, then wait for all. */
static ca_status finish_buckets(ca_accelerator *acc) {
    for (int g = 0; g < acc->ngroups; g++) {
        if (!group_touched(acc, g)) continue;
        for (; acc->bucket_status == CA_OK && acc->group_next[g] < acc->group_begin[g + 1]; acc->group_next[g]++)
            acc->bucket_status = launch(acc, &acc->buckets[acc->group_next[g]]);
    }
    ca_status s = acc->bucket_status;
    for (int b = 0; b < acc->nbuckets; b++) {
        ca_bucket *bk = &acc->buckets[b];
        if (bk->work) {
            ca_status w = ca_work_wait(bk->work, -1);
            if (s == CA_OK) s = w;
            ca_work_free(bk->work);
            bk->work = NULL;
        }
        const ca_bucket_hook *h = acc->bucket_hook;
        if (s == CA_OK && h && h->finish && bk->launched) s = h->finish(bk);
        bk->ready = 0;
        bk->launched = false;
    }
    for (int g = 0; g < acc->ngroups; g++) acc->group_next[g] = acc->group_begin[g];
    acc->bucket_status = CA_OK;
    return s;
}

/* A new group for the next model's buckets. */
static ca_status add_group(ca_accelerator *acc) {
    int *gb = realloc(acc->group_begin, (size_t)(acc->ngroups + 2) * sizeof *gb);
    if (gb) acc->group_begin = gb;
    int *gn = gb ? realloc(acc->group_next, (size_t)(acc->ngroups + 1) * sizeof *gn) : NULL;
    if (!gn) return ca_error(CA_ERR_NOMEM, "out of host memory");
    acc->group_next = gn;
    acc->group_begin[acc->ngroups] = acc->group_next[acc->ngroups] = acc->nbuckets;
    acc->group_begin[++acc->ngroups] = acc->nbuckets;
    return CA_OK;
}

/* Buckets over the trainable parameters tp (names tn) in reverse order, each at most cap floats. */
static ca_status fill_buckets(ca_accelerator *acc, ca_tensor **tp, const char **tn, int n, int group, size_t cap) {
    for (int i = n - 1; i >= 0;) {
        int64_t numel = 0;
        int first = i;
        while (i >= 0 && (numel == 0 || (size_t)(numel + tp[i]->numel) <= cap)) numel += tp[i--]->numel;
        ca_bucket *nb = realloc(acc->buckets, (size_t)(acc->nbuckets + 1) * sizeof *nb);
        if (!nb) return ca_error(CA_ERR_NOMEM, "out of host memory");
        acc->buckets = nb;
        ca_bucket *bk = &acc->buckets[acc->nbuckets++];
        memset(bk, 0, sizeof *bk);
        bk->nparams = first - i;
        bk->group = group;
        acc->group_begin[group + 1] = acc->nbuckets;
        bk->params = calloc((size_t)bk->nparams, sizeof *bk->params);
        ca_tensor *flat = bk->params ? ca_zeros(acc->device, CA_F32, 1, &numel) : NULL;
        if (!flat) return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_NOMEM, "out of host memory");
        bk->flat = ca_tensor_keep(flat);
        bk->numel = numel;
        int64_t off = 0;
        for (int k = 0; k < bk->nparams; k++) {
            ca_tensor *p = tp[first - k];
            if (p->dtype != CA_F32 || ca_tdev(p) != acc->device)
                return ca_error(CA_ERR_INVALID, "data-parallel parameters must be f32 on the training device (%s); "
                                "a frozen one (requires_grad false) may be of any dtype", tn[first - k]);
            bk->params[k] = p;
            int64_t st[CA_MAX_DIMS], s = 1;
            for (int d = p->ndim - 1; d >= 0; d--) { st[d] = s; s *= p->shape[d]; }
            ca_tensor *g = ca_tensor_view(bk->flat, p->ndim, p->shape, st, off);
            if (!g) return ca_last_status();
            ca_tensor_free(p->grad);
            p->grad = ca_tensor_keep(g);
            p->grad_defined = false;
            ca_tensor_set_grad_hook(p, grad_ready, acc);
            off += p->numel;
        }
        const ca_bucket_hook *h = acc->bucket_hook;
        if (h && h->init && h->init(acc, bk) != CA_OK)
            return ca_error_context("comm_hook %s", ca_config_get(acc->cfg, "comm_hook"));
    }
    return CA_OK;
}

/* Buckets of at most bucket_cap_mb, filled in reverse registration order
 * (gradients arrive roughly from the last layer back), each parameter's .grad
 * a view into its bucket. */
static ca_status build_buckets(ca_accelerator *acc, ca_module *m) {
    int n = ca_module_num_params(m);
    ca_status gs = add_group(acc);
    if (gs != CA_OK) return gs;
    int group = acc->ngroups - 1;
    size_t cap = (size_t)(acc->st.bucket_cap_mb * 1024 * 1024 / sizeof(float));
    if (cap < 1) cap = 1;
    /* only the trainable parameters have a slot (torch's DDP: the parameters that require grad) */
    ca_tensor **tp = calloc((size_t)n + 1, sizeof *tp);
    const char **tn = calloc((size_t)n + 1, sizeof *tn);
    int nt = 0;
    if (!tp || !tn) {
        free(tp); free(tn);
        return ca_error(CA_ERR_NOMEM, "out of host memory");
    }
    for (int i = 0; i < n; i++)
        if (m->flat[i]->requires_grad) {
            tn[nt] = m->flat_names[i];
            tp[nt++] = m->flat[i];
        }
    gs = fill_buckets(acc, tp, tn, nt, group, cap);
    free(tp);
    free(tn);
    return gs;
}

static void free_buckets(ca_accelerator *acc) {
    for (int i = 0; i < acc->nbuckets; i++) {
        ca_work_free(acc->buckets[i].work);
        free(acc->buckets[i].params);
        ca_tensor_free(acc->buckets[i].flat);
        if (acc->bucket_hook && acc->bucket_hook->free) acc->bucket_hook->free(&acc->buckets[i]);
    }
    free(acc->buckets);
    acc->buckets = NULL;
    acc->nbuckets = 0;
    free(acc->group_begin);
    free(acc->group_next);
    acc->group_begin = acc->group_next = NULL;
    acc->ngroups = 0;
}

/* ------------------------------------------------------------------ the strategy */

static bool ddp_selected(const ca_accelerator *acc) { return acc->world > 1; }

/* comm_hook: how each bucket is sent (no hook: the plain f32 average). */
static ca_status ddp_configure(ca_accelerator *acc) {
    switch (acc->st.comm_hook) {
    case CA_COMM_HOOK_NO: acc->bucket_hook = NULL; break;
    case CA_COMM_HOOK_FP16: acc->bucket_hook = &hook_fp16; break;
    case CA_COMM_HOOK_BF16: acc->bucket_hook = &hook_bf16; break;
    case CA_COMM_HOOK_POWER_SGD: acc->bucket_hook = &ca_bucket_hook_power_sgd; break;
    case CA_COMM_HOOK_BATCHED_POWER_SGD: acc->bucket_hook = &ca_bucket_hook_batched_power_sgd; break;
    }
    return CA_OK;
}

/* The first model may have no bucket (wholly frozen: a teacher); its group is there all the same. */
static ca_status ddp_prepare_extra_model(ca_accelerator *acc, ca_module *m) {
    if (!acc->ngroups)
        return ca_error(CA_ERR_STATE, "ca_prepare: the first model has no gradient bucket group (rank %d)", acc->rank);
    return build_buckets(acc, m);
}

/* After a synchronising backward, also a failed one: what it launched is waited for. */
static ca_status ddp_after_backward(ca_accelerator *acc, bool sync, bool failed) {
    (void)failed;
    return acc->nbuckets && sync ? finish_buckets(acc) : CA_OK;
}

/* An fp16 overflow skipped the step: a hook's state that followed the gradients (PowerSGD's error
 * feedback) held the overflowed values. */
static ca_status ddp_skip_step(ca_accelerator *acc) {
    const ca_bucket_hook *h = acc->bucket_hook;
    ca_status s = CA_OK;
    for (int b = 0; h && h->reset && b < acc->nbuckets && s == CA_OK; b++) s = h->reset(&acc->buckets[b]);
    return s;
}

/* Join (join.c): a rank whose data ran out issues the all-reduces of the others' synchronising
 * backward with zero gradients. */
static ca_status ddp_shadow_backward(ca_accelerator *acc) {
    for (int b = 0; b < acc->nbuckets; b++) {
        ca_bucket *bk = &acc->buckets[b];
        ca_status s = CA_KCALL(acc->device, fill, .dt = CA_F32, .n = bk->numel, .value = 0.0, .y = ca_tptr(bk->flat));
        if (s == CA_OK)
            s = ca_comm_all_reduce(ca_mesh_grad_comm(acc), ca_tptr(bk->flat), ca_tptr(bk->flat), (size_t)bk->numel,
                                   CA_F32, CA_OP_AVG, NULL);
        if (s != CA_OK) return ca_error_context("join_uneven_inputs: shadowing bucket %d on rank %d", b, acc->rank);
    }
    return CA_OK;
}

/* The buckets of model group g reduce nothing any more (their parameters are gone). */
static void ddp_forget_model(ca_accelerator *acc, int g, bool last) {
    for (int b = 0; b < acc->nbuckets; b++)
        if (acc->buckets[b].group == g) acc->buckets[b].nparams = 0;
    if (last) free_buckets(acc);
}

const ca_sync_strategy ca_sync_ddp = {
    .name = "ddp",
    .replicated = true,
    .key = "distributed_type",
    .selected = ddp_selected,
    .configure = ddp_configure,
    .prepare_model = build_buckets,
    .prepare_extra_model = ddp_prepare_extra_model,
    .after_backward = ddp_after_backward,
    .skip_step = ddp_skip_step,
    .shadow_backward = ddp_shadow_backward,
    .forget_model = ddp_forget_model,
    .free = free_buckets,
};
