/* Activation checkpointing: a region keeps only its inputs during forward and reruns its forward
 * during backward (same RNG state, same autocast) to rebuild its tape, then backpropagates through it. */
#include "tensor/ops_impl.h"

#include <stdlib.h>
#include <string.h>

#define CKPT_MAX_OUT 8

typedef struct ckpt {
    ca_checkpoint_fn fn;
    void *fn_ctx;
    int nin, nout;
    ca_tensor **in;                  /* the caller's inputs (they outlive the nodes) */
    ca_node *nodes[CKPT_MAX_OUT];    /* one per output, recorded in output order */
    ca_tensor **leaves;              /* leaves the region reached (parameters) */
    int nleaves;
    uint64_t rng_seed, rng_offset, rng_end;
    ca_dtype autocast;
    int refs;                        /* nodes still holding it */
} ckpt;

static void ckpt_free(ckpt *c) {
    if (!c) return;
    free(c->in);
    free(c->leaves);
    free(c);
}

static void ckpt_release(ca_node *n) {
    ckpt *c = n->ctx;
    n->ctx = NULL;
    if (c && --c->refs == 0) ckpt_free(c);
}

/* ------------------------------------------------------------------ running the region */

/* Leaf views of the inputs: the region's tape starts at them, not at the caller's graph. */
static ca_status detach_inputs(const ckpt *c, ca_tensor **d) {
    for (int i = 0; i < c->nin; i++) {
        d[i] = ca_detach(c->in[i]);
        if (!d[i]) return ca_last_status();
        d[i]->requires_grad = c->in[i]->requires_grad && ca_dtype_is_float(c->in[i]->dtype);
    }
    return CA_OK;
}

/* Runs fn with grad recording on, under the autocast of the forward. */
static ca_status run_region(const ckpt *c, ca_tensor **din, ca_tensor **out) {
    int depth = ca_no_grad_depth();
    ca_no_grad_set_depth(0);
    ca_dtype old = ca_autocast_set(c->autocast);
    for (int i = 0; i < c->nout; i++) out[i] = NULL;
    ca_status s = c->fn(c->fn_ctx, c->nin, din, c->nout, out);
    ca_autocast_set(old);
    ca_no_grad_set_depth(depth);
    for (int i = 0; s == CA_OK && i < c->nout; i++)
        if (!out[i]) s = ca_last_status() ? ca_last_status()
                                          : ca_error(CA_ERR_INVALID, "checkpointed function left output %d NULL", i);
    return s;
}

static bool has_leaf(const ckpt *c, const ca_tensor *t) {
    for (int i = 0; i < c->nleaves; i++)
        if (c->leaves[i] == t) return true;
    return false;
}

/* Open before the region began (so alive as long as the checkpoint node). */
static bool outlives(const ca_tensor *t, const ca_scope *region) {
    if (t->persistent) return true;
    for (const ca_scope *p = region->parent; p; p = p->parent)
        if (t->scope == p) return true;
    return t->scope && t->scope->is_root;
}

static ca_status add_leaf(ckpt *c, ca_tensor *t, ca_scope *region) {
    if (!t || !t->requires_grad || t->grad_fn || !outlives(t, region) || has_leaf(c, t)) return CA_OK;
    ca_tensor **v = realloc(c->leaves, (size_t)(c->nleaves + 1) * sizeof *v);
    if (!v) return ca_error(CA_ERR_NOMEM, "out of host memory checkpointing a region");
    c->leaves = v;
    c->leaves[c->nleaves++] = t;
    return CA_OK;
}

/* Every leaf requiring grad that the region's tape reaches besides its own inputs (which are
 * views made in the region): the parameters, counted as uses of the checkpoint node (a nested
 * checkpoint's leaves included). A tensor with history from outside the region that is not an
 * input would lose its gradient: refused. */
static ca_status find_leaves(ckpt *c, ca_scope *region, uint64_t first_id) {
    ca_status s = CA_OK;
    for (ca_node *n = region->nodes; n && s == CA_OK; n = n->scope_next) {
        for (int i = 0; s == CA_OK && i < n->nin; i++) {
            ca_tensor *t = n->in[i];
            if (t && t->requires_grad && t->grad_fn && t->grad_fn->id < first_id)
                return ca_error(CA_ERR_INVALID, "checkpointed function used a tensor with autograd history "
                                "that is not among its inputs (op %s): pass it as an input", n->vt->name);
            s = add_leaf(c, t, region);
        }
        for (int i = 0; s == CA_OK && i < n->nleaves; i++) s = add_leaf(c, n->leaves[i], region);
    }
    return s;
}

/* ------------------------------------------------------------------ backward */

/* Recomputes the region and backpropagates the outputs' gradients through it into the inputs. */
static ca_status recompute_backward(ckpt *c, uint64_t pass) {
    ca_tensor *grads[CKPT_MAX_OUT] = {0};
    bool any = false;
    for (int i = 0; i < c->nout; i++) {
        if (!c->nodes[i]) return ca_error(CA_ERR_STATE, "backward of a checkpoint whose forward failed");
        ca_tensor *o = c->nodes[i]->out;
        if (c->nodes[i]->visit == pass && o->bgrad_defined) grads[i] = o->bgrad;
        any = any || grads[i];
    }
    if (!any) return CA_OK;
    float beta;   /* the inputs' gradient buffers belong to the caller's scope, not the recompute's */
    for (int i = 0; i < c->nin; i++)
        if (c->in[i]->requires_grad && !ca_grad_target(c->in[i], &beta)) return ca_last_status();
    uint64_t seed, offset;
    ca_rng_get_state(&seed, &offset);
    ca_rng_set_state(c->rng_seed, c->rng_offset);
    ca_scope *sc = ca_scope_begin();
    if (!sc) return ca_last_status();
    ca_tensor **din = calloc((size_t)c->nin, sizeof *din), *out[CKPT_MAX_OUT];
    ca_status s = din ? detach_inputs(c, din) : ca_error(CA_ERR_NOMEM, "out of host memory recomputing");
    if (s == CA_OK) s = run_region(c, din, out);
    uint64_t unused, end;
    ca_rng_get_state(&unused, &end);
    ca_rng_set_state(seed, offset);
    if (s == CA_OK && end != c->rng_end)
        s = ca_error(CA_ERR_STATE, "checkpointed region drew %llu random counters on recompute, %llu in "
                     "forward: its forward must be deterministic", (unsigned long long)(end - c->rng_offset),
                     (unsigned long long)(c->rng_end - c->rng_offset));
    for (int i = 0; s == CA_OK && i < c->nout; i++)
        if (out[i]->numel != c->nodes[i]->out->numel)
            s = ca_error(CA_ERR_STATE, "checkpointed region's output %d has %lld elements on recompute, %lld "
                         "in forward", i, (long long)out[i]->numel, (long long)c->nodes[i]->out->numel);
    if (s == CA_OK) s = ca_backward_roots(c->nout, out, grads, pass);
    for (int i = 0; s == CA_OK && i < c->nin; i++)
        if (din[i]->requires_grad && din[i]->grad && din[i]->grad_defined)
            s = ca_op_accumulate(c->in[i], din[i]->grad, 1.0f);
    free(din);
    ca_scope_end(sc);
    return s;
}

/* Each output's node: the lowest-numbered one this pass reached does the work for all, after
 * the others (nodes run in decreasing id order), so every output's gradient is complete. */
static ca_status ckpt_backward(ca_node *n, ca_tensor *g) {
    (void)g;
    ckpt *c = n->ctx;
    for (int i = 0; i < c->nout && c->nodes[i] != n; i++)
        if (c->nodes[i]->visit == n->visit) return CA_OK;
    ca_status s = recompute_backward(c, n->visit);
    for (int i = 0; s == CA_OK && i < c->nout; i++) ca_grad_release(c->nodes[i]->out);   /* consumed */
    return s;
}

static const ca_node_vt ckpt_vt = {"checkpoint", ckpt_backward};

/* ------------------------------------------------------------------ forward */

/* The region's outputs as new tensors of the caller's scope, with the checkpoint as history. */
static ca_status record_outputs(ckpt *c, ca_tensor **out) {
    ca_tensor *gin[CA_NODE_MAX_IN];
    int ng = 0;
    for (int i = 0; i < c->nin; i++)
        if (c->in[i]->requires_grad && ca_dtype_is_float(c->in[i]->dtype)) gin[ng++] = c->in[i];
    for (int i = 0; i < c->nout; i++) {
        ca_node *n = ca_record(&ckpt_vt, out[i], ng, gin);
        if (!n) return ca_last_status();
        n->leaves = c->leaves;
        n->nleaves = c->nleaves;
        n->ctx = c;
        n->release = ckpt_release;
        n->always = true;
        c->refs++;
        c->nodes[i] = n;
    }
    return CA_OK;
}

static ca_status check_args(ca_checkpoint_fn fn, int n_in, ca_tensor *const *in, int n_out, ca_tensor **out) {
    if (!fn || n_in < 1 || !in || n_out < 1 || !out)
        return ca_error(CA_ERR_INVALID, "ca_checkpoint: a function, at least one input and one output are required");
    if (n_out > CKPT_MAX_OUT)
        return ca_error(CA_ERR_INVALID, "ca_checkpoint: %d outputs, at most %d", n_out, CKPT_MAX_OUT);
    int ng = 0;
    for (int i = 0; i < n_in; i++) {
        if (!in[i]) return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_INVALID, "ca_checkpoint: input %d is NULL", i);
        ng += in[i]->requires_grad && ca_dtype_is_float(in[i]->dtype);
    }
    if (ng > CA_NODE_MAX_IN)
        return ca_error(CA_ERR_INVALID, "ca_checkpoint: %d inputs require grad, at most %d", ng, CA_NODE_MAX_IN);
    return CA_OK;
}

static ckpt *ckpt_new(ca_checkpoint_fn fn, void *ctx, int n_in, ca_tensor *const *in, int n_out) {
    ckpt *c = calloc(1, sizeof *c);
    if (c) c->in = malloc((size_t)n_in * sizeof *c->in);
    if (!c || !c->in) {
        ckpt_free(c);
        ca_error(CA_ERR_NOMEM, "out of host memory checkpointing a region");
        return NULL;
    }
    c->fn = fn;
    c->fn_ctx = ctx;
    c->nin = n_in;
    c->nout = n_out;
    memcpy(c->in, in, (size_t)n_in * sizeof *in);
    c->autocast = ca_autocast_dtype();
    ca_rng_get_state(&c->rng_seed, &c->rng_offset);
    return c;
}

/* A tensor of the current scope with t's layout, taking over one reference to t's storage. */
static ca_tensor *adopt(const ca_tensor *t) {
    ca_tensor *v = ca_tensor_alloc_struct();
    if (!v) return NULL;
    v->storage = t->storage;
    v->offset = t->offset;
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    memcpy(v->shape, t->shape, sizeof v->shape);
    memcpy(v->stride, t->stride, sizeof v->stride);
    v->numel = t->numel;
    return v;
}

/* Forward in a scope of its own: everything the region made is freed with that scope but the
 * outputs' storage, which new tensors of the caller's scope take over. */
static ca_status forward(ckpt *c, ca_tensor **out) {
    ca_scope *region = ca_scope_begin();
    if (!region) return ca_last_status();
    ca_tensor **din = calloc((size_t)c->nin, sizeof *din), *res[CKPT_MAX_OUT], keep[CKPT_MAX_OUT];
    uint64_t first_id = ca_next_node_id();
    ca_status s = din ? detach_inputs(c, din) : ca_error(CA_ERR_NOMEM, "out of host memory checkpointing");
    if (s == CA_OK) s = run_region(c, din, res);
    if (s == CA_OK) s = find_leaves(c, region, first_id);
    uint64_t unused;
    ca_rng_get_state(&unused, &c->rng_end);
    int held = 0;
    for (; s == CA_OK && held < c->nout; held++) {
        keep[held] = *res[held];
        if (keep[held].storage) atomic_fetch_add(&keep[held].storage->refs, 1);
    }
    free(din);
    ca_scope_end(region);
    for (int i = 0; i < held; i++) {
        out[i] = s == CA_OK ? adopt(&keep[i]) : NULL;
        if (!out[i]) {
            if (s == CA_OK) s = ca_last_status();
            ca_storage_release(keep[i].storage);
        }
    }
    return s;
}

ca_status ca_checkpoint(ca_checkpoint_fn fn, void *ctx, int n_in, ca_tensor *const *in, int n_out, ca_tensor **out) {
    ca_status s = check_args(fn, n_in, in, n_out, out);
    if (s != CA_OK) return s;
    if (!ca_grad_enabled()) return fn(ctx, n_in, in, n_out, out);   /* nothing to save */
    ckpt *c = ckpt_new(fn, ctx, n_in, in, n_out);
    if (!c) return ca_last_status();
    s = forward(c, out);
    bool grad = false;
    for (int i = 0; s == CA_OK && i < n_in; i++) grad = grad || c->in[i]->requires_grad;
    grad = grad || c->nleaves > 0;
    if (s == CA_OK && grad) s = record_outputs(c, out);
    if (c->refs == 0) ckpt_free(c);
    if (s != CA_OK) for (int i = 0; i < n_out; i++) out[i] = NULL;
    return s;
}

/* ------------------------------------------------------------------ backward hooks */

typedef struct bhook {
    ca_status (*fn)(void *ctx);
    void *ctx;
} bhook;

static void bhook_release(ca_node *n) {
    free(n->ctx);
    n->ctx = NULL;
}

static ca_status bhook_backward(ca_node *n, ca_tensor *g) {
    const bhook *h = n->ctx;
    ca_status s = h ? h->fn(h->ctx) : CA_OK;
    return s == CA_OK ? ca_op_accumulate_owned(n->in[0], g, 1.0f) : s;   /* g's only reader */
}
static const ca_node_vt bhook_vt = {"backward_hook", bhook_backward};

ca_tensor *ca_backward_hook(ca_tensor *y, ca_status (*fn)(void *ctx), void *ctx) {
    if (!y || !ca_needs_grad(1, &y)) return y;
    bhook *h = malloc(sizeof *h);
    ca_tensor *v = h ? ca_tensor_view(y, y->ndim, y->shape, y->stride, y->offset) : NULL;
    ca_node *n = v ? ca_record(&bhook_vt, v, 1, &y) : NULL;
    if (!n) {
        free(h);
        if (!ca_last_status()) ca_error(CA_ERR_NOMEM, "out of host memory recording a backward hook");
        return NULL;
    }
    *h = (bhook){.fn = fn, .ctx = ctx};
    n->ctx = h;
    n->release = bhook_release;
    return v;
}
