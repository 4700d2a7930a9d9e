/* Sharded data parallelism, ZeRO stages 1 to 3 (FSDP SHARD_GRAD_OP / FULL_SHARD, DeepSpeed zero_stage): the
 * parameters form one flat index space split into one equal shard per rank. Each rank keeps the
 * optimizer state of its shard only and updates only its shard; an all-gather then gives every rank
 * the whole updated parameters. Stage 1 all-reduces the full gradient (kept between steps); stage 2
 * reduce-scatters it into the shard and frees the full gradient until the next backward. Stage 3 keeps
 * the parameters' values in the shard only (zero3.c): no all-gather after the step, the wrap units
 * gather theirs when they run and reduce-scatter their gradients as their backward ends. */
#include "accelerator/accelerator_impl.h"
#include "accelerator/mesh_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static ca_status oom(void) { return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_NOMEM, "out of memory"); }

/* Every parameter's .grad becomes a view of the flat gradient at its offset. */
static ca_status attach_grads(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    for (int i = 0; i < z->nparams; i++) {
        ca_tensor *p = z->params[i];
        ca_tensor *g = ca_zero_flat_view(z->gflat, p->ndim, p->shape, z->off[i]);
        if (!g) return oom();
        ca_tensor_free(p->grad);
        p->grad = g;
        p->grad_defined = false;
    }
    return CA_OK;
}

/* Stage 2 after the reduce-scatter: no full gradient is kept. */
static void detach_grads(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    for (int i = 0; i < z->nparams; i++) {
        ca_tensor_free(z->params[i]->grad);
        z->params[i]->grad = NULL;
        z->params[i]->grad_defined = false;
    }
    ca_tensor_free(z->gflat);
    z->gflat = NULL;
}

static ca_status build_segments(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    int64_t lo = z->rank * z->shard, hi = lo + z->shard;
    z->segs = calloc((size_t)z->nparams, sizeof *z->segs);
    if (!z->segs) return ca_error(CA_ERR_NOMEM, "out of host memory");
    for (int i = 0; i < z->nparams; i++) {
        int64_t b = z->off[i], e = b + z->params[i]->numel;
        int64_t s = b > lo ? b : lo, t = e < hi ? e : hi;
        if (s >= t) continue;
        z->segs[z->nsegs++] = (ca_zero_seg){.param = z->params[i], .poff = s - b, .soff = s - lo, .n = t - s,
                                             .group = -1};
    }
    /* stage 3 with frozen parameters: the optimizer state holds the trainable segments only */
    z->tshard = z->shard;
    for (int i = 0; i < z->nparams; i++) z->compact = z->compact || !z->params[i]->requires_grad;
    if (z->compact) z->tshard = 0;
    for (int k = 0; k < z->nsegs; k++) {
        ca_zero_seg *sg = &z->segs[k];
        sg->toff = !z->compact ? sg->soff : sg->param->requires_grad ? z->tshard : -1;
        if (z->compact && sg->toff >= 0) z->tshard += sg->n;
    }
    return CA_OK;
}

ca_tensor *ca_zero_state_unpack(ca_accelerator *acc, ca_tensor *st) {
    ca_zero *z = &acc->zero;
    if (!z->compact) return st;
    ca_device *d = ca_tensor_device(st);
    ca_tensor *full = ca_zero_persistent_zeros(d, z->shard);
    for (int k = 0; full && k < z->nsegs; k++) {
        const ca_zero_seg *sg = &z->segs[k];
        if (sg->toff >= 0 && ca_zero_copy_f32(d, ca_zero_fptr(st, sg->toff), ca_zero_fptr(full, sg->soff), sg->n) != CA_OK) {
            ca_tensor_free(full);
            return NULL;
        }
    }
    return full;
}

ca_status ca_zero_state_pack(ca_accelerator *acc, ca_tensor *full, ca_tensor *st) {
    ca_zero *z = &acc->zero;
    ca_status s = CA_OK;
    for (int k = 0; z->compact && s == CA_OK && k < z->nsegs; k++) {
        const ca_zero_seg *sg = &z->segs[k];
        if (sg->toff >= 0)
            s = ca_zero_copy_f32(ca_tensor_device(st), ca_zero_fptr(full, sg->soff), ca_zero_fptr(st, sg->toff), sg->n);
    }
    return s;
}

/* The shard group: every rank that averages gradients (every rank; under tensor parallelism those of this
 * rank's tp coordinate: the mesh's dp communicator, each sharding its own slices; under context parallelism
 * its dp_cp one, as Accelerate's flattened "dp_shard_cp": the cp ranks hold the same parameters, so they
 * shard them too, while only the dp ranks read different batches), or under HYBRID_SHARD groups of
 * group_size consecutive ones (a machine, as launchers place ranks; the mesh's dp_shard x cp) with a second
 * split joining the ranks at the same place in each group, which hold the same shard and average their
 * shard's gradient. */
static ca_status build_groups(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    ca_comm *dp = ca_mesh_grad_comm(acc);
    int rank, world;
    ca_mesh_data_rank(acc, &rank, &world);   /* no mesh: the process group's, whatever comm is made yet */
    if (acc->mesh) {
        rank = ca_comm_rank(dp);
        world = ca_comm_size(dp);
    }
    z->comm = dp;
    z->rank = rank;
    z->world = world;
    int g = z->group_size;
    if (g <= 0 || g >= world) return CA_OK;
    ca_status s = ca_comm_split(dp, rank / g, rank, &z->own);
    if (s == CA_OK) s = ca_comm_split(dp, rank % g, rank, &z->rep);
    if (s == CA_OK && acc->mesh)
        s = ca_comm_set_name(z->own, acc->mesh->shape.size[CA_MESH_CP] > 1 ? "dp_shard_cp" : "dp_shard");
    if (s != CA_OK)
        return ca_error_context("HYBRID_SHARD: forming the shard groups of %d processes (rank %d)", g, acc->rank);
    z->comm = z->own;
    z->rank = rank % g;
    z->world = g;
    return CA_OK;
}

/* HYBRID_SHARD: the shard's gradient, averaged within the group, averaged over the replicas. */
static ca_status replicas_avg(ca_accelerator *acc, float *x, int64_t n) {
    ca_zero *z = &acc->zero;
    if (!z->rep || n <= 0) return CA_OK;
    ca_status s = ca_comm_all_reduce(z->rep, x, x, (size_t)n, CA_F32, CA_OP_AVG, NULL);
    return s == CA_OK ? CA_OK : ca_error_context("HYBRID_SHARD: averaging the shard's gradient over the replicas");
}

ca_status ca_zero_build(ca_accelerator *acc, ca_module *m) {
    ca_zero *z = &acc->zero;
    ca_status s = build_groups(acc);
    if (s != CA_OK) return s;
    int n = ca_module_num_params(m);
    z->params = calloc((size_t)n + 1, sizeof *z->params);
    z->names = calloc((size_t)n + 1, sizeof *z->names);
    z->off = calloc((size_t)n + 1, sizeof *z->off);
    if (!z->params || !z->names || !z->off) return ca_error(CA_ERR_NOMEM, "out of host memory");
    for (int i = 0; i < n; i++) {
        ca_tensor *p = m->flat[i];
        /* stages 1 and 2 keep every parameter whole: a frozen one needs no gradient or state shard. Stage 3
         * shards it too (the frozen base of the model is the bulk of it), with no update */
        if (!p->requires_grad && z->stage < 3) continue;
        if (p->dtype != CA_F32 || ca_tdev(p) != acc->device || !ca_tensor_is_contiguous(p))
            return ca_error(CA_ERR_INVALID, "sharded data parallelism (stage %d): parameter %s must be a contiguous "
                            "f32 tensor on the training device%s", z->stage, m->flat_names[i],
                            z->stage < 3 ? " (a frozen one, requires_grad false, may be of any dtype)" : "");
        z->params[z->nparams] = p;
        z->names[z->nparams] = m->flat_names[i];
        z->off[z->nparams++] = z->numel;
        z->numel += p->numel;
    }
    z->shard = (z->numel + z->world - 1) / z->world;
    if (z->shard < 1) z->shard = 1;
    s = build_segments(acc);
    if (s == CA_OK && z->stage == 3) s = ca_zero3_build(acc, m);
    if (s != CA_OK) return s;
    if (acc->rank == 0)
        ca_log_printf(CA_LOG_INFO, "sharded data parallelism: stage %d (%s), %lld parameters in %d shards of %lld%s",
                      z->stage, z->origin, (long long)z->numel, z->world, (long long)z->shard,
                      z->nparams < n ? "; the frozen ones (requires_grad false) kept whole, with no gradient "
                                       "or optimizer state" : "");
    if (acc->rank == 0 && z->rep)
        ca_log_printf(CA_LOG_INFO, "HYBRID_SHARD: shards within groups of %d processes, replicated %d times",
                      z->world, ca_comm_size(ca_mesh_grad_comm(acc)) / z->world);
    return CA_OK;
}

static int group_of(const ca_optimizer *o, const ca_tensor *p) {
    for (int g = 0; g < o->ngroups; g++)
        for (int i = 0; i < o->groups[g].n; i++)
            if (o->groups[g].params[i] == p) return g;
    return -1;
}

/* The optimizer's own per-parameter state is dropped: the shard's state replaces it. */
static void drop_full_state(ca_optimizer *o) {
    for (int g = 0; g < o->ngroups; g++)
        for (int i = 0; i < o->groups[g].n; i++) {
            ca_tensor_free(o->groups[g].state1[i]);
            ca_tensor_free(o->groups[g].state2[i]);
            o->groups[g].state1[i] = o->groups[g].state2[i] = NULL;
        }
}

ca_status ca_zero_add_optimizer(ca_accelerator *acc, ca_optimizer *o) {
    ca_zero *z = &acc->zero;
    if (!z->params)
        return ca_error(CA_ERR_STATE, "sharded data parallelism: prepare the model before (or with) its optimizer");
    for (int k = 0; k < z->nsegs; k++) {   /* segments of parameters o does not hold stay unassigned */
        int g = group_of(o, z->segs[k].param);
        if (g < 0 || !z->segs[k].param->requires_grad) continue;   /* stage 3's frozen ones: not updated */
        z->segs[k].opt = o;
        z->segs[k].group = g;
    }
    bool need1 = o->kind == CA_OPTIM_ADAMW;
    for (int g = 0; g < o->ngroups; g++) need1 = need1 || o->groups[g].sgd.momentum != 0;
    bool off = ca_zero_offload_wanted(acc);
    ca_device *sd = off ? ca_cpu_device() : acc->device;   /* where the state lives */
    int64_t n = z->tshard ? z->tshard : 1;   /* a shard of frozen parameters only: a token buffer */
    if (need1 && !z->s1 && !(z->s1 = ca_zero_persistent_zeros(sd, n))) return oom();
    if (o->kind == CA_OPTIM_ADAMW && !z->s2 && !(z->s2 = ca_zero_persistent_zeros(sd, n))) return oom();
    if (z->compact)
        ca_log_printf(CA_LOG_INFO, "sharded data parallelism: rank %d keeps optimizer state for %lld of its %lld "
                      "shard elements (the others are frozen parameters)", acc->rank, (long long)z->tshard,
                      (long long)z->shard);
    if (off) {
        ca_status s = ca_zero_offload_init(acc);
        if (s != CA_OK) return s;
    }
    drop_full_state(o);
    return CA_OK;
}

/* The shard's gradient (stage 1: with the full flat gradient it is a view of), made at the first
 * ca_backward and kept: preparing (and loading) a model holds no gradient, as in PyTorch, where a
 * .grad appears at the first backward. Zeros, as each later backward finds it. */
static ca_status grad_shard(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    if (z->view && z->view->grad) return CA_OK;
    ca_status s = CA_OK;
    if (!z->gshard && z->stage == 1) {   /* the full gradient lives on; the shard's gradient is a view of it */
        z->gflat = ca_zero_persistent_zeros(acc->device, z->shard * z->world);
        if (!z->gflat || (s = attach_grads(acc)) != CA_OK) return z->gflat ? s : oom();
        z->gshard = ca_zero_flat_view(z->gflat, 1, &z->shard, z->rank * z->shard);
    } else if (!z->gshard) {
        z->gshard = ca_zero_persistent_zeros(acc->device, z->shard);
    }
    if (!z->view && z->gshard) z->view = ca_zero_flat_view(z->gshard, 1, &z->shard, 0);
    ca_tensor *g = z->view ? ca_zero_flat_view(z->gshard, 1, &z->shard, 0) : NULL;
    if (!g) return oom();
    z->view->grad = g;
    z->view->grad_defined = true;
    return CA_OK;
}

ca_status ca_zero_before_backward(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    z->reduced = false;
    ca_status s = grad_shard(acc);
    if (s != CA_OK)
        return ca_error_context("sharded data parallelism: making the gradient shard of %lld elements on rank %d",
                                (long long)z->shard, acc->rank);
    if (z->stage == 3) {   /* per-unit gradients (zero3.c) */
        ca_zero3_before_backward(acc);
        return CA_OK;
    }
    if (z->stage < 2 || z->gflat) return CA_OK;   /* accumulating: the flat gradient is there already */
    z->gflat = ca_zero_persistent_zeros(acc->device, z->shard * z->world);
    return z->gflat ? attach_grads(acc) : oom();
}

ca_status ca_zero_reduce(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    if (z->stage == 3) {
        ca_status s = ca_zero3_reduce(acc);
        ca_zero3_release_all(acc);   /* units some parameter's gradient never reached */
        if (s == CA_OK) s = replicas_avg(acc, ca_zero_fptr(z->gshard, 0), z->shard);
        z->reduced = s == CA_OK;
        return s;
    }
    if (!z->gflat) return ca_error(CA_ERR_STATE, "sharded data parallelism: no gradient to reduce");
    for (int i = 0; i < z->nparams; i++) {   /* unused parameters reduce zeros, as under DDP */
        ca_tensor *p = z->params[i];
        if (p->grad_defined) continue;
        ca_status s = CA_KCALL(acc->device, fill, .dt = CA_F32, .n = p->numel, .value = 0.0,
                               .y = ca_tptr(p->grad));
        if (s != CA_OK) return s;
        p->grad_defined = true;
    }
    size_t n = (size_t)(z->shard * z->world);
    ca_status s = z->stage == 1
        ? ca_comm_all_reduce(ca_mesh_grad_comm(acc), ca_tptr(z->gflat), ca_tptr(z->gflat), n, CA_F32, CA_OP_AVG, NULL)
        : ca_comm_reduce_scatter(z->comm, ca_tptr(z->gflat), ca_tptr(z->gshard), (size_t)z->shard, CA_F32,
                                 CA_OP_AVG, NULL);
    if (s == CA_OK && z->stage == 2) s = replicas_avg(acc, ca_zero_fptr(z->gshard, 0), z->shard);
    if (s != CA_OK) return ca_error_context("sharded data parallelism: reducing the gradients (stage %d)", z->stage);
    if (z->stage >= 2) detach_grads(acc);
    z->reduced = true;
    return CA_OK;
}

ca_status ca_zero_split_sumsq(ca_accelerator *acc, void *out) {
    enum { MAXN = 256 };
    ca_zero *z = &acc->zero;
    void *x[MAXN];
    int64_t numel[MAXN];
    int k = 0;
    for (int i = 0; i <= z->nsegs; i++) {
        if (i < z->nsegs && !ca_tp_is_split(acc, z->segs[i].param)) continue;
        if (i < z->nsegs) {
            x[k] = ca_zero_fptr(z->gshard, z->segs[i].soff);
            numel[k++] = z->segs[i].n;
            if (k < MAXN) continue;
        }
        if (!k) continue;
        ca_tensor_list tl = {.count = k, .param = x, .numel = numel, .grad_dtype = CA_F32};
        ca_status s = CA_KCALL(acc->device, sum_squares, .t = &tl, .out = out, .beta = 1.0f);
        if (s != CA_OK) return s;
        k = 0;
    }
    return CA_OK;
}

/* One fused kernel call per run of segments of the same group. */
static ca_status update_group(ca_accelerator *acc, ca_optimizer *o, int g) {
    enum { MAXN = 256 };
    ca_zero *z = &acc->zero;
    ca_device *dev = z->hp ? ca_cpu_device() : acc->device;   /* offload: the host updates */
    const ca_optim_group *gr = &o->groups[g];
    void *p[MAXN], *s1[MAXN], *s2[MAXN];
    const void *gd[MAXN];
    int64_t numel[MAXN];
    int k = 0;
    for (int i = 0; i <= z->nsegs; i++) {
        if (i < z->nsegs) {
            const ca_zero_seg *sg = &z->segs[i];
            if (sg->opt != o || sg->group != g) continue;
            if (z->hp) {   /* offload: the host copies */
                p[k] = z->hp + sg->soff;
                gd[k] = z->hg + sg->soff;
            } else {
                p[k] = z->pshard ? ca_zero_fptr(z->pshard, sg->soff) : ca_zero_fptr(sg->param, sg->poff);
                gd[k] = ca_zero_fptr(z->gshard, sg->soff);
            }
            s1[k] = z->s1 ? ca_zero_fptr(z->s1, sg->toff) : NULL;
            s2[k] = z->s2 ? ca_zero_fptr(z->s2, sg->toff) : NULL;
            numel[k++] = sg->n;
            if (k < MAXN) continue;
        }
        if (!k) continue;
        ca_tensor_list tl = {.count = k, .param = p, .grad = gd, .state1 = s1, .state2 = s2, .numel = numel,
                             .grad_dtype = CA_F32};
        double t = (double)(o->steps + 1);
        ca_status s;
        if (o->kind == CA_OPTIM_ADAMW) {
            ca_adamw_args a = {
                .t = &tl,
                .lr = (float)gr->lr, .beta1 = (float)gr->adamw.beta1, .beta2 = (float)gr->adamw.beta2,
                .eps = (float)gr->adamw.eps, .weight_decay = (float)gr->adamw.weight_decay,
                .bias_correction1 = (float)(1.0 - pow(gr->adamw.beta1, t)),
                .bias_correction2 = (float)(1.0 - pow(gr->adamw.beta2, t)), .grad_scale = 1.0f,
            };
            s = CA_KCALL_ARGS(dev, adamw, &a);
        } else {
            ca_sgd_args a = {
                .t = &tl,
                .lr = (float)gr->lr, .momentum = (float)gr->sgd.momentum, .dampening = (float)gr->sgd.dampening,
                .weight_decay = (float)gr->sgd.weight_decay, .nesterov = gr->sgd.nesterov,
                .first_step = o->steps == 0, .grad_scale = 1.0f,
            };
            s = CA_KCALL_ARGS(dev, sgd, &a);
        }
        if (s != CA_OK) return s;
        k = 0;
    }
    return CA_OK;
}

/* Every rank's updated shard to every rank: pack this rank's segments, all-gather, unpack. */
static ca_status gather_params(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    int64_t all = z->shard * z->world;
    /* kept, so that they are freed now and not with the caller's scope */
    ca_tensor *send = ca_zero_persistent_zeros(acc->device, z->shard);
    ca_tensor *full = send ? ca_zero_persistent_zeros(acc->device, all) : NULL;
    if (!full) {
        ca_tensor_free(send);
        return oom();
    }
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && i < z->nsegs; i++)
        s = ca_zero_copy_f32(acc->device, ca_zero_fptr(z->segs[i].param, z->segs[i].poff), ca_zero_fptr(send, z->segs[i].soff), z->segs[i].n);
    if (s == CA_OK) s = ca_comm_all_gather(z->comm, ca_tptr(send), ca_tptr(full), (size_t)z->shard, CA_F32, NULL);
    for (int i = 0; s == CA_OK && i < z->nparams; i++) {
        s = ca_zero_copy_f32(acc->device, ca_zero_fptr(full, z->off[i]), ca_zero_fptr(z->params[i], 0), z->params[i]->numel);
        z->params[i]->version++;   /* low-precision copies are stale */
    }
    ca_tensor_free(send);
    ca_tensor_free(full);
    return s == CA_OK ? CA_OK : ca_error_context("sharded data parallelism: gathering the updated parameters");
}

ca_status ca_zero_step(ca_accelerator *acc, ca_optimizer *o) {
    if (!acc->zero.reduced)
        return ca_error(CA_ERR_STATE, "sharded data parallelism: the optimizer stepped without a synchronising "
                        "ca_backward before it (gradients live in shards reduced by ca_backward)");
    ca_status s = acc->zero.hp ? ca_zero_offload_fetch(acc) : CA_OK;
    for (int g = 0; s == CA_OK && g < o->ngroups; g++) s = update_group(acc, o, g);
    if (s == CA_OK && acc->zero.hp) s = ca_zero_offload_store(acc);
    if (s == CA_OK && !acc->zero.pshard) s = gather_params(acc);
    for (int i = 0; s == CA_OK && acc->zero.pshard && i < acc->zero.nparams; i++) acc->zero.params[i]->version++;
    if (s == CA_OK && acc->zero.summoned) {   /* summoned parameters follow the update */
        acc->zero.summoned = false;
        ca_zero3_release_all(acc);
        s = ca_zero3_summon(acc, true);
    }
    if (s != CA_OK) return s;
    o->skipped = false;
    return ca_optimizer_set_steps(o, o->steps + 1);   /* advances the schedule as a plain step does */
}

/* ------------------------------------------------------------------ full optimizer state */

/* Every rank's shard of one state buffer into the optimizer's per-parameter tensors (or back). */
static ca_status state_exchange(ca_accelerator *acc, ca_optimizer *o, ca_tensor *host_or_dev, int which,
                                bool gather) {
    ca_zero *z = &acc->zero;
    int64_t all = z->shard * z->world;
    size_t bytes = (size_t)z->shard * sizeof(float);
    /* an offloaded state lives in host memory: the collective runs on a device copy of it */
    bool staged = ca_tensor_device(host_or_dev) != acc->device;
    ca_tensor *shard = staged ? ca_zero_persistent_zeros(acc->device, z->shard) : host_or_dev;
    ca_tensor *full = shard ? ca_zero_persistent_zeros(acc->device, all) : NULL;
    if (!full) {
        if (staged) ca_tensor_free(shard);
        return oom();
    }
    ca_status s = CA_OK;
    if (staged && gather) s = ca_device_copy_from_host(acc->device, ca_tptr(shard), ca_tptr(host_or_dev), bytes);
    if (s == CA_OK && gather)
        s = ca_comm_all_gather(z->comm, ca_tptr(shard), ca_tptr(full), (size_t)z->shard, CA_F32, NULL);
    for (int i = 0; s == CA_OK && i < z->nparams; i++) {
        int g = group_of(o, z->params[i]);
        if (g < 0) continue;
        const ca_optim_group *gr = &o->groups[g];
        ca_tensor *st = NULL;
        for (int j = 0; j < gr->n; j++)
            if (gr->params[j] == z->params[i]) st = which == 1 ? gr->state1[j] : gr->state2[j];
        if (!st) continue;
        s = gather ? ca_zero_copy_f32(acc->device, ca_zero_fptr(full, z->off[i]), ca_zero_fptr(st, 0), st->numel)
                   : ca_zero_copy_f32(acc->device, ca_zero_fptr(st, 0), ca_zero_fptr(full, z->off[i]), st->numel);
    }
    if (s == CA_OK && !gather) s = ca_zero_copy_f32(acc->device, ca_zero_fptr(full, z->rank * z->shard), ca_zero_fptr(shard, 0), z->shard);
    if (s == CA_OK && staged && !gather) s = ca_device_copy_to_host(acc->device, ca_tptr(host_or_dev), ca_tptr(shard), bytes);
    if (staged) ca_tensor_free(shard);
    ca_tensor_free(full);
    return s;
}

/* state_exchange over a shard-sized view of a compact state buffer. */
static ca_status exchange(ca_accelerator *acc, ca_optimizer *o, ca_tensor *st, int which, bool gather) {
    ca_tensor *full = ca_zero_state_unpack(acc, st);
    if (!full) return oom();
    ca_status s = state_exchange(acc, o, full, which, gather);
    if (s == CA_OK && !gather && full != st) s = ca_zero_state_pack(acc, full, st);
    if (full != st) ca_tensor_free(full);
    return s;
}

ca_status ca_zero_gather_state(ca_accelerator *acc, ca_optimizer *o) {
    ca_status s = ca_optimizer_init_state(o);
    if (s == CA_OK && acc->zero.s1) s = exchange(acc, o, acc->zero.s1, 1, true);
    if (s == CA_OK && acc->zero.s2) s = exchange(acc, o, acc->zero.s2, 2, true);
    return s;
}

void ca_zero_drop_state(ca_optimizer *o) { drop_full_state(o); }

ca_status ca_zero_scatter_state(ca_accelerator *acc, ca_optimizer *o) {
    ca_status s = CA_OK;
    if (acc->zero.s1) s = exchange(acc, o, acc->zero.s1, 1, false);
    if (s == CA_OK && acc->zero.s2) s = exchange(acc, o, acc->zero.s2, 2, false);
    drop_full_state(o);
    return s;
}

void ca_zero_free(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    ca_zero3_free(acc);
    if (z->gflat && z->params)
        for (int i = 0; i < z->nparams; i++) {   /* the parameters keep no view of a freed buffer */
            ca_tensor_free(z->params[i]->grad);
            z->params[i]->grad = NULL;
            z->params[i]->grad_defined = false;
        }
    ca_tensor_free(z->gflat);
    ca_tensor_free(z->gshard);
    ca_tensor_free(z->view);
    ca_tensor_free(z->s1);
    ca_tensor_free(z->s2);
    ca_zero_offload_free(acc);
    ca_comm_destroy(z->own);
    ca_comm_destroy(z->rep);
    z->own = z->rep = NULL;
    z->comm = NULL;
    free(z->params);
    free(z->names);
    free(z->off);
    free(z->segs);
    z->gflat = z->gshard = z->view = z->s1 = z->s2 = NULL;
    z->params = NULL;
    z->names = NULL;
    z->off = NULL;
    z->segs = NULL;
    z->nparams = z->nsegs = 0;
    z->numel = z->shard = z->tshard = 0;
    z->compact = false;
    z->reduced = false;
}
