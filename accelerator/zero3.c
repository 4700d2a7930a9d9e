/* ZeRO stage 3 / FSDP FULL_SHARD: the parameters live sharded between steps. Each rank keeps only
 * its shard of the flat parameter space (pshard, the same layout as stages 1 and 2, so checkpoints
 * move between stages); the full storage of every parameter is freed. A wrap unit's parameters are
 * gathered just before its module's forward and released after it; a backward hook on the unit's
 * output gathers them again before the unit's backward, and they are released once every one of
 * their gradients is complete. Each unit's gradient is a buffer of its own, made before the unit's
 * backward; in a synchronising backward it is reduce-scattered into the gradient shard as soon as
 * the unit's last gradient is complete, and freed (no full flat gradient exists); in an
 * accumulation micro-step it stays and accumulates until the synchronising one.
 * A unit's parameters are spread over the ranks whose shards they cross (the flat layout is that of
 * stages 1 and 2), so the gather is an all-gather of each rank's part of the unit, in flat order,
 * padded to the largest part (slice), and the gradient's reduction a reduce-scatter of such parts:
 * each rank sends (N - 1) * slice elements. Where that is more than the 2 (N - 1) / N * numel of an
 * all-reduce of the whole unit (a unit mostly inside one rank's shard), both are all-reduces of
 * the unit instead (by_part false): the gather's with each rank's part in place and zeros
 * elsewhere (x + 0 = x).
 * Prefetch (fsdp_forward_prefetch, fsdp_backward_prefetch): the first forward records the order
 * the units run in; from the first backward on, a unit's hook issues the gather of the unit that
 * runs next (forward: the following one, as the unit's forward starts; backward: the preceding
 * one, before the unit's gradients (BACKWARD_PRE) or once they are complete (BACKWARD_POST)), and
 * that unit's own hook waits for it: the collective runs while this unit computes. */
#include "accelerator/accelerator_impl.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>


static ca_status oom(void) { return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_NOMEM, "out of memory"); }

/* ------------------------------------------------------------------ gather and release */

/* The part [*s, *t) of parameter i (flat indices) inside rank r's shard; empty when *s >= *t. */
static void in_shard(const ca_zero *z, int i, int r, int64_t *s, int64_t *t) {
    int64_t lo = r * z->shard, hi = lo + z->shard, b = z->off[i], e = b + z->params[i]->numel;
    *s = b > lo ? b : lo;
    *t = e < hi ? e : hi;
}

/* Elements of unit u inside rank r's shard. */
static int64_t unit_part(const ca_zero *z, const ca_zero_unit *u, int r) {
    int64_t n = 0, s, t;
    for (int j = 0; j < u->n; j++) {
        in_shard(z, u->idx[j], r, &s, &t);
        if (s < t) n += t - s;
    }
    return n;
}

/* Where rank r's part starts in the unit's flat order. */
static int64_t part_start(const ca_zero *z, const ca_zero_unit *u, int r) {
    int64_t n = 0;
    for (int q = 0; q < r; q++) n += unit_part(z, u, q);
    return n;
}

/* Packs this rank's part of the unit (in flat order) into send, or unpacks rank r's part of recv
 * into the parameters' storage. */
static ca_status unit_pack(ca_accelerator *acc, ca_zero_unit *u, int r, float *buf, bool pack) {
    ca_zero *z = &acc->zero;
    int64_t run = 0, s, t;
    ca_status st = CA_OK;
    for (int j = 0; st == CA_OK && j < u->n; j++) {
        int i = u->idx[j];
        in_shard(z, i, r, &s, &t);
        if (s >= t) continue;
        st = pack ? ca_zero_copy_f32(acc->device, ca_zero_fptr(z->pshard, s - r * z->shard), buf + run, t - s)
                  : ca_zero_copy_f32(acc->device, buf + run, ca_zero_fptr(z->params[i], s - z->off[i]), t - s);
        run += t - s;
    }
    return st;
}

static void gather_drop(ca_zero_unit *u) {
    ca_work_free(u->work);
    if (u->recv != u->send) ca_tensor_free(u->recv);
    ca_tensor_free(u->send);
    u->work = NULL;
    u->send = u->recv = NULL;
    u->pending = false;
}

static ca_status gather_failed(ca_zero_unit *u) {
    gather_drop(u);
    return ca_error_context("stage 3: gathering the %d parameter(s) of %s on rank %d", u->n, ca_module_type(u->mod),
                            u->acc->rank);
}

/* Mixed precision gathers the parameters in its dtype (FSDP's param_dtype): half the bytes, and the
 * same values autocast would compute with (f32 -> bf16 -> f32 -> bf16 rounds once). The f32 masters
 * stay in the shard; a summon (read, save, load) gathers in f32. */
static ca_dtype gather_dtype(const ca_accelerator *acc) {
    if (acc->zero.full_gather) return CA_F32;
    return acc->st.mixed_precision == CA_MP_BF16 ? CA_BF16 : acc->st.mixed_precision == CA_MP_FP16 ? CA_F16 : CA_F32;
}

/* Casts n elements between device buffers (f32 <-> the gather's dtype). */
static ca_status cast_n(ca_device *d, ca_dtype from, const void *x, ca_dtype to, void *y, int64_t n) {
    return n ? CA_KCALL(d, cast, .src_dt = from, .x = x, .dst_dt = to, .y = y, .n = n, .alpha = 1.0f) : CA_OK;
}

/* This rank's part into send: packed in f32, then (mixed precision) cast to the gather's dtype. */
static ca_status pack_send(ca_accelerator *acc, ca_zero_unit *u, int64_t at, int64_t n) {
    const ca_zero *z = &acc->zero;
    if (u->gdt == CA_F32) return unit_pack(acc, u, z->rank, ca_zero_fptr(u->send, at), true);
    ca_tensor *tmp = ca_zero_persistent_zeros(acc->device, n);
    if (!tmp) return oom();
    ca_status s = unit_pack(acc, u, z->rank, ca_zero_fptr(tmp, at), true);
    if (s == CA_OK) s = cast_n(acc->device, CA_F32, ca_tptr(tmp), u->gdt, ca_tptr(u->send), n);
    ca_tensor_free(tmp);
    return s;
}

/* Issues the unit's gather: this rank's part packed and the collective started, asynchronous where
 * the backend is (Gloo's work queue, MPI's nonblocking calls); gather_finish waits for it. */
static ca_status gather_start(ca_zero_unit *u, bool ahead) {
    if (u->gathered || u->pending || !u->n) return CA_OK;
    ca_accelerator *acc = u->acc;
    ca_zero *z = &acc->zero;
    /* by parts: [slice] -> [N * slice]; else one [numel] buffer, each rank's part at its place */
    bool parts = u->by_part && z->world > 1;
    int64_t nsend = u->by_part ? u->slice : u->numel;
    u->gdt = gather_dtype(acc);
    u->send = ca_zero_kept_zeros(acc->device, u->gdt, nsend);
    u->recv = u->send && parts ? ca_zero_kept_zeros(acc->device, u->gdt, u->slice * z->world) : u->send;
    u->pending = true;
    if (!u->recv) {
        oom();
        return gather_failed(u);
    }
    int64_t at = u->by_part ? 0 : part_start(z, u, z->rank);
    ca_status s = pack_send(acc, u, at, nsend);
    if (s == CA_OK && z->world > 1)
        s = u->by_part ? ca_comm_all_gather(z->comm, ca_tptr(u->send), ca_tptr(u->recv), (size_t)u->slice, u->gdt,
                                            &u->work)
                       : ca_comm_all_reduce(z->comm, ca_tptr(u->send), ca_tptr(u->send), (size_t)u->numel, u->gdt,
                                            CA_OP_SUM, &u->work);
    if (s != CA_OK) return gather_failed(u);
    z->gathers++;
    z->prefetched += ahead;
    return CA_OK;
}

/* The bytes stage 3 holds unsharded, the gathered units' full parameters and the units' full gradient
 * buffers: a running total (held), changed where a unit is gathered or released and where its
 * gradient buffer is made or freed, so a gather costs no pass over the units. The device remembers
 * it at the step's peak (ca_device_set_peak_mark: the memory report's unsharded bytes then); before an
 * allocation that it is to count, the mark is set to what held will be once it succeeds. */
static size_t gathered_bytes(const ca_zero_unit *u) { return u->n ? (size_t)u->numel * sizeof(float) : 0; }

/* The sum the running total stands for (CACCEL_TEST_ZERO3_HELD checks one against the other). */
static size_t held_recount(const ca_zero *z) {
    size_t now = 0;
    for (int k = 0; k < z->nunits; k++) {
        const ca_zero_unit *u = &z->units[k];
        if (u->gathered) now += gathered_bytes(u);
        if (u->grad) now += ca_tensor_nbytes(u->grad);
    }
    return now;
}

static void held_change(ca_accelerator *acc, size_t add, size_t sub) {
    ca_zero *z = &acc->zero;
    z->held = z->held + add - sub;
    ca_device_set_peak_mark(acc->device, z->held);
    if (!z->check_held) return;
    z->held_checks++;
    z->held_wrong += held_recount(z) != z->held;
}

static void set_gathered(ca_zero_unit *u, bool on) {
    if (u->gathered == on) return;
    u->gathered = on;
    held_change(u->acc, on ? gathered_bytes(u) : 0, on ? 0 : gathered_bytes(u));
}

/* held_peak, where held grows (the memory report's "unsharded"). */
static void note_held(ca_zero *z) {
    if (z->held > z->held_peak) z->held_peak = z->held;
}

/* Waits for the unit's gather and unpacks every rank's part into the parameters' storage. */
static ca_status gather_finish(ca_zero_unit *u) {
    ca_accelerator *acc = u->acc;
    ca_zero *z = &acc->zero;
    ca_status s = u->work ? ca_work_wait(u->work, -1) : CA_OK;
    size_t got = 0;   /* the storages made so far, counted by the peak mark before set_gathered does */
    for (int j = 0; s == CA_OK && j < u->n; j++) {
        ca_tensor *p = z->params[u->idx[j]];
        if (!p->storage->ptr) ca_device_set_peak_mark(acc->device, z->held + (got += p->storage->bytes));
        if (!p->storage->ptr) s = ca_device_alloc(acc->device, p->storage->bytes, &p->storage->ptr);
        if (s == CA_OK) p->storage->absent = NULL;
        p->version++;   /* a low-precision copy made from older values is stale */
    }
    ca_tensor *full = u->recv;   /* mixed precision: widened to f32 for the parameters' storage */
    if (s == CA_OK && u->gdt != CA_F32) {
        full = ca_zero_persistent_zeros(acc->device, u->recv->numel);
        s = full ? cast_n(acc->device, u->gdt, ca_tptr(u->recv), CA_F32, ca_tptr(full), u->recv->numel) : oom();
    }
    for (int r = 0; s == CA_OK && r < z->world; r++)
        s = unit_pack(acc, u, r, ca_zero_fptr(full, u->by_part ? r * u->slice : part_start(z, u, r)), false);
    if (full && full != u->recv) ca_tensor_free(full);
    if (s != CA_OK) {
        ca_device_set_peak_mark(acc->device, z->held);
        return gather_failed(u);
    }
    gather_drop(u);
    set_gathered(u, true);
    u->done = 0;
    note_held(z);
    return CA_OK;
}

static ca_status unit_gather(ca_zero_unit *u) {
    if (u->gathered || !u->n) {   /* a unit with no parameters of its own has nothing to gather */
        set_gathered(u, true);
        return CA_OK;
    }
    ca_status s = gather_start(u, false);
    return s == CA_OK ? gather_finish(u) : s;
}

/* Prefetch: the gather of the unit `step` places from u in the forward order (+1: the next
 * forward's, -1: the next backward's) is issued now, to run while u computes. Every rank runs the
 * same modules in the same order, so every rank issues the same collectives. */
static ca_status prefetch(ca_zero_unit *u, int step) {
    ca_zero *z = &u->acc->zero;
    int k = u->pos + step;
    if (!z->order_known || u->pos < 0 || k < 0 || k >= z->norder) return CA_OK;
    ca_zero_unit *next = &z->units[z->order[k]];
    if (step < 0 && next->in_backward) return CA_OK;   /* its backward ran: released, not to come */
    return gather_start(next, true);
}

/* ------------------------------------------------------------------ gradients */

/* The unit's gradient buffer, [N * slice] by parts, else [numel]: the parameters' .grad are views
 * of its first numel elements in flat order. A gradient made elsewhere (the parameter used outside
 * its unit) is copied in. */
static ca_status unit_grads(ca_zero_unit *u) {
    if (u->grad || !u->n) return CA_OK;
    ca_accelerator *acc = u->acc;
    ca_zero *z = &acc->zero;
    int64_t n = u->by_part ? u->slice * z->world : u->numel;
    ca_device_set_peak_mark(acc->device, z->held + (size_t)n * sizeof(float));
    if (!(u->grad = ca_zero_persistent_zeros(acc->device, n))) {
        ca_device_set_peak_mark(acc->device, z->held);
        return oom();
    }
    held_change(acc, ca_tensor_nbytes(u->grad), 0);
    note_held(z);
    int64_t pos = 0;
    ca_status s = CA_OK;
    for (int j = 0; s == CA_OK && j < u->n; pos += z->params[u->idx[j]]->numel, j++) {
        ca_tensor *p = z->params[u->idx[j]];
        ca_tensor *g = ca_zero_flat_view(u->grad, p->ndim, p->shape, pos);
        if (!g) return oom();
        bool had = p->grad && p->grad_defined;
        if (had) s = ca_zero_copy_f32(acc->device, ca_zero_fptr(p->grad, 0), ca_zero_fptr(g, 0), p->numel);
        ca_tensor_free(p->grad);
        p->grad = g;
        p->grad_defined = had;
    }
    return s;
}

static void free_grads(ca_zero_unit *u) {
    for (int j = 0; u->grad && j < u->n; j++) {
        ca_tensor *p = u->acc->zero.params[u->idx[j]];
        ca_tensor_free(p->grad);
        p->grad = NULL;
        p->grad_defined = false;
    }
    if (!u->grad) return;
    size_t bytes = ca_tensor_nbytes(u->grad);
    ca_tensor_free(u->grad);
    u->grad = NULL;
    held_change(u->acc, 0, bytes);
}

/* Lays the flat-order gradient out by rank for the reduce-scatter: rank r's part (a contiguous run
 * in flat order) moves to r * slice. Parts only move right, so the last goes first; each through
 * tmp, as a part may overlap its destination. */
static ca_status by_rank(ca_accelerator *acc, ca_zero_unit *u, float *buf, float *tmp) {
    const ca_zero *z = &acc->zero;
    int64_t start = u->numel;
    ca_status s = CA_OK;
    for (int r = z->world - 1; s == CA_OK && r >= 0; r--) {
        int64_t n = unit_part(z, u, r);
        start -= n;
        if (!n || start == r * u->slice) continue;
        s = ca_zero_copy_f32(acc->device, buf + start, tmp, n);
        if (s == CA_OK) s = ca_zero_copy_f32(acc->device, tmp, buf + r * u->slice, n);
    }
    return s;
}

/* Reduce-scatters (average) the unit's gradient into this rank's gradient shard and frees it.
 * Gradients no backward reached are zeros. */
static ca_status unit_reduce(ca_zero_unit *u) {
    if (u->reduced || !u->ntrain) return CA_OK;   /* frozen parameters only: no gradient to reduce */
    ca_accelerator *acc = u->acc;
    ca_zero *z = &acc->zero;
    ca_status s = unit_grads(u);
    for (int j = 0; s == CA_OK && j < u->n; j++) {
        ca_tensor *p = z->params[u->idx[j]];
        if (!p->grad_defined) s = CA_KCALL(acc->device, fill, .dt = CA_F32, .n = p->numel, .value = 0.0,
                                           .y = ca_tptr(p->grad));
        p->grad_defined = true;
    }
    bool parts = u->by_part && z->world > 1;
    ca_tensor *tmp = s == CA_OK && parts ? ca_zero_persistent_zeros(acc->device, u->slice) : NULL;
    if (s == CA_OK && parts && !tmp) s = oom();
    float *buf = u->grad ? ca_zero_fptr(u->grad, 0) : NULL, *mine = buf;
    if (s == CA_OK && parts) {
        s = by_rank(acc, u, buf, ca_zero_fptr(tmp, 0));
        if (s == CA_OK)
            s = ca_comm_reduce_scatter(z->comm, buf, ca_tptr(tmp), (size_t)u->slice, CA_F32, CA_OP_AVG, NULL);
        mine = ca_zero_fptr(tmp, 0);
    } else if (s == CA_OK && z->world > 1) {   /* the whole unit, then this rank's part of it */
        s = ca_comm_all_reduce(z->comm, buf, buf, (size_t)u->numel, CA_F32, CA_OP_AVG, NULL);
        mine = buf + part_start(z, u, z->rank);
    }
    int64_t lo = z->rank * z->shard, run = 0, a, b;
    for (int j = 0; s == CA_OK && j < u->n; j++) {   /* this rank's part, in flat order */
        in_shard(z, u->idx[j], z->rank, &a, &b);
        if (a >= b) continue;
        s = ca_zero_copy_f32(acc->device, mine + run, ca_zero_fptr(z->gshard, a - lo), b - a);
        run += b - a;
    }
    ca_tensor_free(tmp);
    free_grads(u);
    if (s != CA_OK)
        return ca_error_context("stage 3: reduce-scattering the gradients of the %d parameter(s) of %s on rank %d",
                                u->n, ca_module_type(u->mod), acc->rank);
    u->reduced = true;
    return CA_OK;
}

void ca_zero3_before_backward(ca_accelerator *acc) {
    acc->zero.err = CA_OK;
    acc->zero.order_known = acc->zero.norder > 0;
    for (int k = 0; k < acc->zero.nunits; k++) acc->zero.units[k].reduced = acc->zero.units[k].in_backward = false;
}

ca_status ca_zero3_reduce(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    ca_status s = z->err;
    for (int k = 0; s == CA_OK && k < z->nunits; k++) s = unit_reduce(&z->units[k]);
    return s;
}

/* What a read of a released parameter says (tensor.c prefixes the call and the parameter's name). */
static const char released_why[] =
    "is sharded (FSDP FULL_SHARD / DeepSpeed ZeRO-3): outside its module's forward and backward its full "
    "value exists only between ca_summon_full_params(acc, true) and ca_summon_full_params(acc, false), "
    "which every process calls";

static void unit_release(ca_zero_unit *u) {
    if (u->pending && gather_finish(u) != CA_OK) {   /* prefetched, then not used: its collective is out */
        if (u->acc->zero.err == CA_OK) u->acc->zero.err = ca_last_status();
        ca_clear_error();
    }
    if (!u->gathered || u->acc->zero.summoned) return;
    for (int j = 0; j < u->n; j++) {
        ca_storage *st = u->acc->zero.params[u->idx[j]]->storage;
        ca_device_free(st->dev, st->ptr);
        st->ptr = NULL;
        st->absent = released_why;
    }
    set_gathered(u, false);
}

void ca_zero3_release_all(ca_accelerator *acc) {
    for (int k = 0; k < acc->zero.nunits; k++) unit_release(&acc->zero.units[k]);
}

/* ------------------------------------------------------------------ hooks */

/* The first forward (until the first backward) records the order the units run in. */
static void record_order(ca_zero_unit *u) {
    ca_zero *z = &u->acc->zero;
    if (z->order_known || u->pos >= 0 || u->acc->in_backward) return;
    u->pos = z->norder;
    z->order[z->norder++] = (int)(u - z->units);
}

static ca_status pre_forward(void *ctx, ca_module *m) {
    (void)m;
    ca_zero_unit *u = ctx;
    record_order(u);
    u->in_forward = !u->gathered;
    ca_status s = unit_gather(u);
    /* not in a checkpointed module's recomputation, which runs during the backward */
    return s == CA_OK && u->acc->zero.fwd_prefetch && !u->acc->in_backward ? prefetch(u, +1) : s;
}

static ca_status pre_backward(void *ctx) {
    ca_zero_unit *u = ctx;
    u->done = 0;
    u->in_backward = true;
    ca_status s = unit_gather(u);
    if (s == CA_OK && u->acc->zero.bwd_prefetch == 1) s = prefetch(u, -1);   /* BACKWARD_PRE */
    return s == CA_OK && u->acc->in_backward ? unit_grads(u) : s;
}

static ca_tensor *post_forward(void *ctx, ca_module *m, ca_tensor *y) {
    (void)m;
    ca_zero_unit *u = ctx;
    if (y && ca_grad_enabled()) y = ca_backward_hook(y, pre_backward, u);
    if (u->in_forward) unit_release(u);
    u->in_forward = false;
    return y;
}

/* A parameter's gradient is complete: once all of the unit's are, a synchronising backward
 * reduce-scatters them, and the parameters go. The hook cannot fail: the first failure waits in
 * err for the end of the backward. */
static void grad_done(ca_tensor *leaf, void *ctx) {
    (void)leaf;
    ca_zero_unit *u = ctx;
    ca_accelerator *acc = u->acc;
    if (++u->done < u->ntrain) return;   /* a frozen parameter's gradient never comes */
    if (acc->zero.bwd_prefetch == 2 && acc->zero.err == CA_OK) acc->zero.err = prefetch(u, -1);   /* BACKWARD_POST */
    if (acc->in_backward && acc->sync && acc->zero.err == CA_OK) acc->zero.err = unit_reduce(u);
    unit_release(u);
}

/* ------------------------------------------------------------------ wrap units */

typedef struct wrap_ctx {
    const char *policy;          /* NULL: the top-level children */
    const char *classes;         /* TRANSFORMER_BASED_WRAP: type names */
    int64_t min_params;          /* SIZE_BASED_WRAP */
    ca_module **mods;
    int nmods;
} wrap_ctx;

static bool class_listed(const char *list, const char *type) {
    size_t n = strlen(type);
    for (const char *p = list; p && *p;) {
        while (*p == ' ' || *p == ',' || *p == '[' || *p == '"' || *p == '\'') p++;
        size_t k = strcspn(p, ",]\"' ");
        if (k == n && !strncmp(p, type, n)) return true;
        p += k;
    }
    return false;
}

static void add_mod(wrap_ctx *w, ca_module *m) { w->mods[w->nmods++] = m; }

/* Post-order; returns the parameters of m's subtree not inside a wrapped descendant. */
static int64_t mark(wrap_ctx *w, ca_module *m, bool root, int depth) {
    int64_t rest = 0;
    for (int i = 0; i < m->nparams; i++) rest += m->params[i]->numel;
    for (int i = 0; i < m->nchildren; i++) rest += mark(w, m->children[i], false, depth + 1);
    bool wrap = root;
    if (!root && !m->forward) wrap = false;   /* a container: its forward hook would never run */
    else if (!root && !w->policy) wrap = depth == 1 && ca_module_num_params(m) > 0;
    else if (!root && !strcasecmp(w->policy, "TRANSFORMER_BASED_WRAP")) wrap = class_listed(w->classes, m->type);
    else if (!root && !strcasecmp(w->policy, "SIZE_BASED_WRAP")) wrap = rest >= w->min_params;
    if (wrap) add_mod(w, m);
    return wrap ? 0 : rest;
}

static int unit_index(const wrap_ctx *w, const ca_module *m) {
    for (int k = 0; k < w->nmods; k++)
        if (w->mods[k] == m) return k;
    return -1;
}

/* Depth first in the order of the flat parameter list: each parameter to its innermost unit. */
static void assign(ca_zero *z, const wrap_ctx *w, ca_module *m, int cur, int *next) {
    int k = unit_index(w, m);
    if (k >= 0) cur = k;
    for (int i = 0; i < m->nparams; i++) z->unit_of[(*next)++] = cur;
    for (int i = 0; i < m->nchildren; i++) assign(z, w, m->children[i], cur, next);
}

static int count_mods(const ca_module *m) {
    int n = 1;
    for (int i = 0; i < m->nchildren; i++) n += count_mods(m->children[i]);
    return n;
}

/* fsdp_auto_wrap_policy under FSDP; NULL (the top-level children) when unset or under DeepSpeed. */
static const char *wrap_policy(const ca_accelerator *acc) {
    const char *v = ca_config_get(acc->cfg, "fsdp_config.fsdp_auto_wrap_policy");
    if (acc->st.distributed_type != CA_DIST_FSDP || !v || !*v || !strcmp(v, "null")) return NULL;
    return v;
}

static ca_status make_units(ca_accelerator *acc, ca_module *m) {
    ca_zero *z = &acc->zero;
    wrap_ctx w = {.policy = wrap_policy(acc),
                  .classes = ca_config_get(acc->cfg, "fsdp_config.fsdp_transformer_layer_cls_to_wrap")};
    ca_config_get_int(acc->cfg, "fsdp_config.fsdp_min_num_params", &w.min_params);
    w.mods = calloc((size_t)count_mods(m), sizeof *w.mods);
    z->unit_of = calloc((size_t)z->nparams + 1, sizeof *z->unit_of);
    z->units = calloc((size_t)count_mods(m), sizeof *z->units);
    z->order = calloc((size_t)count_mods(m), sizeof *z->order);
    if (!w.mods || !z->unit_of || !z->units || !z->order) {
        free(w.mods);
        return ca_error(CA_ERR_NOMEM, "out of host memory");
    }
    mark(&w, m, true, 0);
    int next = 0;
    assign(z, &w, m, unit_index(&w, m), &next);
    for (int k = 0; k < w.nmods; k++) z->units[k] = (ca_zero_unit){.mod = w.mods[k], .acc = acc, .pos = -1};
    z->nunits = w.nmods;
    free(w.mods);
    for (int i = 0; i < z->nparams; i++) z->units[z->unit_of[i]].n++;
    for (int k = 0; k < z->nunits; k++)
        if (!(z->units[k].idx = calloc((size_t)z->units[k].n + 1, sizeof(int))))
            return ca_error(CA_ERR_NOMEM, "out of host memory");
    for (int k = 0; k < z->nunits; k++) z->units[k].n = 0;
    for (int i = 0; i < z->nparams; i++) {
        ca_zero_unit *u = &z->units[z->unit_of[i]];
        u->idx[u->n++] = i;
        u->numel += z->params[i]->numel;
    }
    for (int k = 0; k < z->nunits; k++)   /* the all-gather's per-rank count: the largest part */
        for (int r = 0; r < z->world; r++) {
            int64_t n = unit_part(z, &z->units[k], r);
            if (n > z->units[k].slice) z->units[k].slice = n;
        }
    for (int k = 0; k < z->nunits; k++)   /* (N - 1) slice against 2 (N - 1) / N numel elements sent */
        z->units[k].by_part = z->world * z->units[k].slice <= 2 * z->units[k].numel;
    return CA_OK;
}

/* Also names each unnamed parameter as the model does, so that a read of one whose storage is
 * released says which (ca_tensor_check_present). */
static ca_status check_params(ca_accelerator *acc, ca_module *m) {
    ca_zero *z = &acc->zero;
    for (int i = 0; i < z->nparams; i++) {
        ca_tensor *p = z->params[i];
        if (p->offset != 0 || p->storage->bytes != (size_t)p->numel * sizeof(float) || p->storage->refs != 1)
            return ca_error(CA_ERR_UNSUPPORTED, "stage 3 (%s): parameter %s shares its storage with another tensor "
                            "(tied or a view); stage 3 frees each parameter's own storage", z->origin,
                            m->flat_names[i]);
        if (!ca_tensor_name(p)[0] && ca_tensor_set_name(p, m->flat_names[i]) != CA_OK) return ca_last_status();
    }
    return CA_OK;
}

/* A meta parameter's part of the shard (a model built under ca_init_empty_weights): this rank's slice
 * of its values in a host buffer of the slice's size, copied into the shard. A parameter whose values
 * come from a file (a load deferred to here) reads the slice's bytes alone; one made by its recorded
 * initialisation is made whole in a scratch buffer first: the rank's memory peaks at its shard plus
 * the largest parameter, never the whole model. */
static ca_status meta_slice(ca_accelerator *acc, const ca_zero_seg *sg) {
    ca_device *cpu = ca_cpu_device();   /* where the layers build eagerly: their values to the bit */
    void *tmp = NULL;
    ca_status s = cpu ? ca_device_alloc(cpu, (size_t)sg->n * sizeof(float), &tmp) : ca_last_status();
    if (s == CA_OK) s = ca_meta_fill_range(sg->param, sg->poff, sg->n, tmp);
    if (s == CA_OK)
        s = ca_device_copy_from_host(acc->device, ca_zero_fptr(acc->zero.pshard, sg->soff), tmp,
                                     (size_t)sg->n * sizeof(float));
    if (tmp) ca_device_free(cpu, tmp);
    return s == CA_OK ? CA_OK : ca_error_context("stage 3: materialising rank %d's part of the meta parameter %s",
                                                 acc->rank, ca_tensor_name(sg->param));
}

/* A read of a file's bytes (a load deferred to here) can fail on one rank alone: the file cut short
 * after the load. Every rank then fails ca_prepare, the others naming the failed ones, where the run's
 * first collective would have waited for them. */
ca_status ca_agree_file_reads(ca_accelerator *acc, ca_status s, const char *who, const char *part) {
    if (acc->world < 2) return s;
    int64_t one = 1, bad = s != CA_OK;
    ca_scope *sc = ca_scope_begin();
    ca_tensor *t = ca_from_host(acc->device, CA_I64, 1, &one, &bad);
    ca_status r = t ? ca_reduce(acc, t, CA_OP_SUM) : ca_last_status();
    if (r == CA_OK) r = ca_tensor_to_host(t, &bad, sizeof bad);
    ca_scope_end(sc);
    if (s != CA_OK || r != CA_OK) return s != CA_OK ? s : r;
    return bad ? ca_error(CA_ERR_PEER, "%s: %lld other rank(s) failed to read their %s of the model's "
                          "files; see their errors", who, (long long)bad, part) : CA_OK;
}

static ca_status fill_shard(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    ca_status s = CA_OK;
    bool files = false;   /* the same on every rank: every rank ran the same load */
    for (int i = 0; i < z->nparams; i++) files = files || ca_meta_from_file(z->params[i]);
    for (int k = 0; s == CA_OK && k < z->nsegs; k++)
        s = ca_tensor_is_meta(z->segs[k].param)
                ? meta_slice(acc, &z->segs[k])
                : ca_zero_copy_f32(acc->device, ca_zero_fptr(z->segs[k].param, z->segs[k].poff),
                                   ca_zero_fptr(z->pshard, z->segs[k].soff), z->segs[k].n);
    if (files) s = ca_agree_file_reads(acc, s, "stage 3", "shard");
    for (int i = 0; s == CA_OK && i < z->nparams; i++) {   /* the shard holds the values now */
        ca_storage *st = z->params[i]->storage;
        ca_meta_init_free(st->meta);
        st->meta = NULL;
    }
    return s;
}

bool ca_zero3_shard_loads_lean(const ca_accelerator *acc) {
    if (!acc || !acc->model || acc->zero.stage != 3 || !acc->zero.pshard || acc->zero.summoned) return false;
    return ca_ram_efficient_loading(acc);
}

bool ca_zero3_loads_lean(const ca_accelerator *acc) {
    /* tensor parallelism: the files hold whole tensors, the shard slices of them (ca_zero3_tp_loads_lean) */
    return acc && !acc->mesh && ca_zero3_shard_loads_lean(acc);
}

ca_status ca_zero3_load_shard(ca_accelerator *acc, const float *(*seg_data)(void *ctx, const ca_zero_seg *sg),
                              void *ctx) {
    ca_zero *z = &acc->zero;
    ca_status s = CA_OK;
    for (int k = 0; s == CA_OK && k < z->nsegs; k++) {
        const ca_zero_seg *sg = &z->segs[k];
        const float *src = seg_data(ctx, sg);
        s = src ? ca_device_copy_from_host(acc->device, ca_zero_fptr(z->pshard, sg->soff), src,
                                           (size_t)sg->n * sizeof(float))
                : ca_error(CA_ERR_INTERNAL, "stage 3: no values for parameter %s", ca_tensor_name(sg->param));
    }
    for (int i = 0; i < z->nparams; i++) z->params[i]->version++;   /* copies cast from older values are stale */
    return s == CA_OK ? CA_OK : ca_error_context("stage 3: loading rank %d's shard", acc->rank);
}

ca_status ca_zero3_build(ca_accelerator *acc, ca_module *m) {
    ca_zero *z = &acc->zero;
    ca_status s = check_params(acc, m);
    if (s == CA_OK && !(z->pshard = ca_zero_persistent_zeros(acc->device, z->shard))) s = oom();
    if (s == CA_OK) s = fill_shard(acc);
    if (s == CA_OK) s = make_units(acc, m);
    if (s != CA_OK) return s;
    int used = 0;
    z->held = z->held_peak = 0;
    z->check_held = getenv("CACCEL_TEST_ZERO3_HELD") != NULL;
    for (int k = 0; k < z->nunits; k++) {
        ca_zero_unit *u = &z->units[k];
        set_gathered(u, true);   /* the model's own storages, released below */
        if (!u->n) continue;   /* a wrapped module with no parameters of its own (the root, often) */
        used++;
        ca_module_set_forward_hooks(u->mod, pre_forward, post_forward, u);
        for (int j = 0; j < u->n; j++) {
            u->ntrain += z->params[u->idx[j]]->requires_grad;
            ca_tensor_set_grad_hook(z->params[u->idx[j]], grad_done, u);
        }
    }
    ca_zero3_release_all(acc);
    if (acc->rank == 0)
        ca_log_printf(CA_LOG_INFO, "sharded data parallelism: stage 3 keeps %lld of %lld parameters per process "
                      "between steps; %d wrap unit(s) (%s)", (long long)z->shard, (long long)z->numel, used,
                      wrap_policy(acc) ? wrap_policy(acc) : "the model's top-level children");
    return CA_OK;
}

ca_status ca_zero3_summon(ca_accelerator *acc, bool on) {
    ca_zero *z = &acc->zero;
    if (!z->pshard || on == z->summoned) return CA_OK;
    ca_status s = CA_OK;
    if (on) {   /* in f32: what a summon reads or writes back is the masters' values */
        if (gather_dtype(acc) != CA_F32) ca_zero3_release_all(acc);
        z->full_gather = true;
        for (int k = 0; s == CA_OK && k < z->nunits; k++) s = unit_gather(&z->units[k]);
        z->full_gather = false;
        z->summoned = s == CA_OK;
        return s;
    }
    for (int k = 0; s == CA_OK && k < z->nsegs; k++)   /* the values a load wrote become the shard */
        s = ca_zero_copy_f32(acc->device, ca_zero_fptr(z->segs[k].param, z->segs[k].poff), ca_zero_fptr(z->pshard, z->segs[k].soff),
                     z->segs[k].n);
    z->summoned = false;
    ca_zero3_release_all(acc);
    return s;
}

void ca_zero3_free(ca_accelerator *acc) {
    ca_zero *z = &acc->zero;
    if (z->gathers && acc->rank <= 0)
        ca_log_printf(CA_LOG_INFO, "stage 3: %llu unit gathers, %llu of them prefetched (forward prefetch %s, backward "
                      "prefetch %s)", (unsigned long long)z->gathers, (unsigned long long)z->prefetched,
                      z->fwd_prefetch ? "on" : "off",
                      z->bwd_prefetch == 1 ? "BACKWARD_PRE" : z->bwd_prefetch == 2 ? "BACKWARD_POST" : "off");
    if (z->check_held && z->nunits)   /* CACCEL_TEST_ZERO3_HELD (tests/test_zero3_held.sh) */
        ca_log_printf(CA_LOG_INFO, "stage 3: rank %d's running total of unsharded bytes checked %llu times against "
                      "the units' sum: %llu wrong (now %zu, the sum %zu; the most %zu)", acc->rank,
                      (unsigned long long)z->held_checks, (unsigned long long)z->held_wrong, z->held, held_recount(z),
                      z->held_peak);
    z->gathers = z->prefetched = 0;
    if (z->nparams && z->pshard) {   /* the model outlives the accelerator: whole parameters again */
        z->summoned = false;
        if (ca_zero3_summon(acc, true) != CA_OK) ca_clear_error();
        for (int i = 0; i < z->nparams; i++) {
            ca_storage *st = z->params[i]->storage;
            if (!st->ptr && ca_device_alloc(st->dev, st->bytes, &st->ptr) != CA_OK) ca_clear_error();
            if (st->ptr) st->absent = NULL;
            ca_tensor_set_grad_hook(z->params[i], NULL, NULL);
        }
    }
    for (int k = 0; k < z->nunits; k++) {
        if (z->nparams) {
            ca_module_set_forward_hooks(z->units[k].mod, NULL, NULL, NULL);
        }
        if (z->nparams) free_grads(&z->units[k]);   /* else the views went with the model */
        ca_tensor_free(z->units[k].grad);
        free(z->units[k].idx);
    }
    free(z->units);
    free(z->unit_of);
    free(z->order);
    z->order = NULL;
    z->norder = 0;
    z->order_known = false;
    ca_tensor_free(z->pshard);
    z->units = NULL;
    z->unit_of = NULL;
    z->pshard = NULL;
    z->nunits = 0;
    z->summoned = false;
    z->held = z->held_peak = 0;
    z->check_held = false;
}
