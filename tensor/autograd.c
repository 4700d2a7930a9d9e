/* Autograd: the tape (nodes recorded by ops), gradient buffers, backward, no_grad and leaf hooks. */
#include "tensor/tensor_impl.h"
#include "base/trace_impl.h"

#include <stdio.h>

#include <stdlib.h>
#include <string.h>

static _Thread_local int tl_no_grad;
static _Thread_local int tl_private;
static _Atomic uint64_t node_ids;
static _Atomic uint64_t pass_ids;

void ca_no_grad_begin(void) { tl_no_grad++; }
void ca_no_grad_end(void) { if (tl_no_grad > 0) tl_no_grad--; }
bool ca_grad_enabled(void) { return tl_no_grad == 0; }
int ca_no_grad_depth(void) { return tl_no_grad; }
void ca_no_grad_set_depth(int depth) { tl_no_grad = depth; }
uint64_t ca_next_node_id(void) { return atomic_load(&node_ids) + 1; }
void ca_tape_private_begin(void) { tl_private++; }
void ca_tape_private_end(ca_tensor *y) {
    if (tl_private > 0 && --tl_private == 0 && y && y->grad_fn) y->grad_fn->private_out = false;
}

bool ca_needs_grad(int n, ca_tensor *const *in) {
    if (tl_no_grad) return false;
    for (int i = 0; i < n; i++)
        if (in[i] && in[i]->requires_grad) return true;
    return false;
}

ca_node *ca_record(const ca_node_vt *vt, ca_tensor *out, int nin, ca_tensor *const *in) {
    ca_node *n = calloc(1, sizeof *n);
    if (!n) {
        ca_error(CA_ERR_NOMEM, "out of host memory recording %s", vt->name);
        return NULL;
    }
    n->vt = vt;
    n->id = atomic_fetch_add(&node_ids, 1) + 1;
    n->nin = nin;
    for (int i = 0; i < nin; i++) n->in[i] = in[i];
    n->out = out;
    n->private_out = tl_private > 0;
    ca_scope_add_node(n);
    out->grad_fn = n;
    out->requires_grad = true;
    return n;
}

static bool is_leaf(const ca_tensor *t) { return t->grad_fn == NULL; }

ca_tensor *ca_grad_target(ca_tensor *t, float *beta) {
    if (!t || !t->requires_grad) return NULL;
    if (is_leaf(t)) {
        if (!t->grad) {
            ca_tensor *g = ca_tensor_new(ca_tdev(t), t->dtype, t->ndim, t->shape);
            if (!g) return NULL;
            if (t->persistent) ca_tensor_keep(g);
            else ca_tensor_move_to_scope(g, t->scope);
            t->grad = g;
            t->grad_defined = false;
        }
        *beta = t->grad_defined ? 1.0f : 0.0f;
        return t->grad;
    }
    if (!t->bgrad) {
        t->bgrad = ca_tensor_new(ca_tdev(t), t->dtype, t->ndim, t->shape);
        if (!t->bgrad) return NULL;
        t->bgrad_defined = false;
    }
    *beta = t->bgrad_defined ? 1.0f : 0.0f;
    return t->bgrad;
}

bool ca_grad_adopt(ca_tensor *t, ca_tensor *g) {
    if (!t->requires_grad || is_leaf(t) || t->bgrad || g->dtype != t->dtype || g->numel != t->numel ||
        ca_tdev(g) != ca_tdev(t) || !ca_tensor_is_contiguous(g))
        return false;
    ca_tensor *v = g;
    if (g->ndim != t->ndim || memcmp(g->shape, t->shape, (size_t)t->ndim * sizeof *t->shape) != 0) {
        int64_t st[CA_MAX_DIMS], acc = 1;   /* same elements in the same order, t's shape */
        for (int i = t->ndim - 1; i >= 0; i--) { st[i] = acc; acc *= t->shape[i]; }
        v = ca_tensor_view(g, t->ndim, t->shape, st, g->offset);
        if (!v) return false;
    }
    t->bgrad = v;
    t->bgrad_defined = true;
    t->bgrad_split = 0;
    return true;
}

bool ca_grad_adopt_view(ca_tensor *t, ca_tensor *v) {
    if (!t->requires_grad || is_leaf(t) || t->bgrad || !ca_node_takes_strided_grad(t->grad_fn) ||
        v->dtype != t->dtype || v->ndim != t->ndim || ca_tdev(v) != ca_tdev(t) ||
        memcmp(v->shape, t->shape, (size_t)t->ndim * sizeof *t->shape) != 0)
        return false;
    t->bgrad = v;
    t->bgrad_defined = true;
    t->bgrad_split = 0;
    return true;
}

ca_tensor *ca_grad_view_root(ca_tensor *x) {
    if (!x || !x->requires_grad) return NULL;
    ca_tensor *t = x;
    while (t->grad_fn && ca_node_is_view(t->grad_fn) && !t->bgrad_defined) {
        ca_tensor *in = t->grad_fn->in[0];
        if (!in || !in->requires_grad || in->storage != t->storage || in->dtype != t->dtype) break;
        t = in;
    }
    return is_leaf(t) || t->bgrad_defined || !ca_tensor_is_contiguous(t) ? NULL : t;
}

void ca_grad_written(ca_tensor *t) {
    if (is_leaf(t)) {
        t->grad_defined = true;
    } else {
        t->bgrad_defined = true;
        t->bgrad_split = 0;
    }
}

/* ------------------------------------------------------------------ backward */

typedef struct node_vec {
    ca_node **v;
    size_t n, cap;
} node_vec;

static bool vec_push(node_vec *a, ca_node *n) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        ca_node **v = realloc(a->v, cap * sizeof *v);
        if (!v) return false;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = n;
    return true;
}

/* A node an earlier backward ran: what it saved is freed (torch: "Trying to backward through the graph
 * a second time"). */
static ca_status refuse_consumed(const ca_node *n) {
    return ca_error(CA_ERR_STATE, "backward: the graph through %s (node %llu) was already run by an earlier "
                    "backward, which freed the activations it saved; run the forward again to backpropagate again",
                    n->vt->name, (unsigned long long)n->id);
}

/* Every node `root` depends on, marked with `pass`. */
static ca_status collect(ca_node *root, uint64_t pass, node_vec *out) {
    node_vec stack = {0};
    ca_status s = CA_OK;
    root->visit = pass;
    if (!vec_push(&stack, root)) s = ca_error(CA_ERR_NOMEM, "out of host memory in backward");
    while (s == CA_OK && stack.n) {
        ca_node *n = stack.v[--stack.n];
        if (n->consumed) { s = refuse_consumed(n); break; }
        if (!vec_push(out, n)) { s = ca_error(CA_ERR_NOMEM, "out of host memory in backward"); break; }
        for (int i = 0; i < n->nin; i++) {
            ca_tensor *t = n->in[i];
            if (!t || !t->requires_grad || !t->grad_fn || t->grad_fn->visit == pass) continue;
            t->grad_fn->visit = pass;
            if (!vec_push(&stack, t->grad_fn)) { s = ca_error(CA_ERR_NOMEM, "out of host memory in backward"); break; }
        }
    }
    free(stack.v);
    return s;
}

static int by_id_desc(const void *a, const void *b) {
    uint64_t x = (*(ca_node *const *)a)->id, y = (*(ca_node *const *)b)->id;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Non-leaf gradients are per pass: a tensor seen in an earlier pass starts fresh. */
static void count_use(ca_tensor *t, uint64_t pass) {
    if (!t || !t->requires_grad || !is_leaf(t)) return;
    if (t->backward_pass != pass) {
        t->backward_pass = pass;
        t->pending_uses = 0;
    }
    t->pending_uses++;
}

static void reset_for_pass(node_vec *nodes, uint64_t pass) {
    for (size_t k = 0; k < nodes->n; k++) {
        ca_node *n = nodes->v[k];
        ca_tensor *o = n->out;
        o->bgrad = NULL;
        o->bgrad_defined = false;
        o->backward_pass = pass;
        for (int i = 0; i < n->nin; i++) count_use(n->in[i], pass);
        for (int i = 0; i < n->nleaves; i++) count_use(n->leaves[i], pass);
    }
}

static void leaf_used(ca_tensor *t) {
    if (!t || !t->requires_grad || !is_leaf(t)) return;
    if (--t->pending_uses == 0 && t->hook) t->hook(t, t->hook_ctx);
}

/* The profiler's slice of one backward node, named as torch names its nodes ("<op>Backward"). */
static void trace_node(const ca_node *n, int64_t t0) {
    char name[96], args[96];
    snprintf(name, sizeof name, "%sBackward", n->vt->name);
    snprintf(args, sizeof args, "\"op\":\"%s\",\"inputs\":%d", n->vt->name, n->nin);
    ca_trace_slice("autograd", name, t0, args);
}

/* Gives st's memory back to the allocator; the tensors sharing it stay, `why` telling a reader where
 * the values went (ca_tensor_check_present). */
static void free_values(ca_storage *st, const char *why) {
    ca_device_free(st->dev, st->ptr);
    st->ptr = NULL;
    st->absent = why;
}

void ca_grad_release(ca_tensor *t) {
    ca_tensor *g = t->bgrad;
    if (!g || g->persistent || !g->storage->ptr || atomic_load(&g->storage->refs) != 1) return;
    free_values(g->storage, "intermediate gradient, freed once backward had consumed it");
    t->bgrad = NULL;
    t->bgrad_defined = false;
}

static const char activation_freed[] =
    "activation, freed by backward once the last node that saved it had run (read it before backward, or "
    "run the forward again)";

/* Pass `pass` has finished with t, the output of a node it ran: every node reading t's values (t's
 * own and its readers, created later) has run, nodes running in decreasing id order. The storage's
 * memory goes once every tensor sharing it is so finished: a view made outside the tape (detach,
 * no_grad), a parameter or the tensor backward started from (kept) is never counted, so what a
 * caller can still reach keeps its values. torch frees a node's saved tensors the same way when
 * backward runs without retain_graph: the backward's peak falls as it proceeds instead of holding
 * every activation of the step until the scope ends. */
static void activation_done(ca_tensor *t, uint64_t pass, int nkeep, ca_tensor *const *keep) {
    ca_storage *st = t->storage;
    if (t->persistent || !st->ptr) return;
    for (int i = 0; i < nkeep; i++)
        if (keep[i] == t) return;
    if (st->done_pass != pass) {
        st->done_pass = pass;
        st->done = 0;
    }
    if (t->done_pass == pass) return;
    t->done_pass = pass;
    if (++st->done == atomic_load(&st->refs)) free_values(st, activation_freed);
}

/* What only n's backward read: the tensors the op made for it (a dropout mask, a norm's statistics). */
static void release_saved(ca_node *n) {
    for (int i = 0; i < CA_NODE_MAX_SAVED; i++) {
        ca_tensor *t = n->saved[i];
        if (!t || !(n->owned_saved & (1u << i)) || t->persistent || !t->storage->ptr ||
            atomic_load(&t->storage->refs) != 1)
            continue;
        free_values(t->storage, activation_freed);
    }
}

/* After n's backward, nothing reads its output's gradient again: every reader of n->out (a node
 * created later) has run, nodes running in decreasing id order. Its memory goes back to the
 * allocator then, as torch frees each intermediate gradient once consumed, instead of every
 * non-leaf gradient of the pass living until the scope ends: the backward's peak holds the
 * gradients in flight, not all of them. Kept: one handed over to an input (ca_grad_adopt), and the
 * outputs of a node run for its side effect (n->always: a checkpoint region reads its outputs'
 * gradients together and releases them itself). */
static void release_consumed(ca_node *n) {
    if (n->always) return;
    for (int i = 0; i < n->nin; i++)
        if (n->in[i] && n->out->bgrad && n->in[i]->bgrad == n->out->bgrad) return;
    ca_grad_release(n->out);
}

/* The tensors backward starts from: their values stay for the caller (the loss it prints). */
typedef struct roots {
    int n;
    ca_tensor *const *t;
} roots;

/* After n's backward (or its skip: no gradient reached it) the pass is done with what n saved. Its
 * output goes too when only the tape holds it (a module forward's local: C has no reference count
 * to tell whether a caller kept a tensor, so what an op returned to the program stays). A
 * checkpoint's nodes (n->always) keep their outputs: the region's recompute handles them together. */
static void node_done(ca_node *n, uint64_t pass, roots keep) {
    n->consumed = true;
    release_saved(n);
    if (n->private_out && !n->always) activation_done(n->out, pass, keep.n, keep.t);
}

/* Runs the sorted nodes' backward functions, then tells each leaf input it was used. */
static ca_status process(node_vec *nodes, uint64_t pass, roots keep) {
    ca_status s = CA_OK;
    for (size_t k = 0; s == CA_OK && k < nodes->n; k++) {
        ca_node *n = nodes->v[k];
        if (n->out->bgrad_defined || n->always) {
            int64_t t0 = ca_trace_on() ? ca_trace_now_ns() : 0;
            s = n->vt->backward(n, n->out->bgrad_defined ? n->out->bgrad : NULL);
            if (s != CA_OK) ca_error_context("backward of %s", n->vt->name);
            if (t0) trace_node(n, t0);
            if (s == CA_OK) release_consumed(n);
        }
        if (s == CA_OK) node_done(n, pass, keep);
        for (int i = 0; s == CA_OK && i < n->nin; i++) leaf_used(n->in[i]);
        for (int i = 0; s == CA_OK && i < n->nleaves; i++) leaf_used(n->leaves[i]);
    }
    return s;
}

static ca_status seed_gradient(ca_tensor *out, const ca_tensor *grad_out) {
    float beta;
    ca_tensor *g = ca_grad_target(out, &beta);
    if (!g) return ca_last_status();
    ca_status s;
    if (grad_out) s = ca_tensor_copy_(g, grad_out);
    else s = CA_KCALL(ca_tdev(g), fill, .dt = g->dtype, .n = g->numel, .value = 1.0, .y = ca_tptr(g));
    if (s == CA_OK) ca_grad_written(out);
    return s;
}

static ca_status run_backward(ca_tensor *out, const ca_tensor *grad_out) {
    if (!out) return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_INVALID, "backward of NULL");
    if (!out->requires_grad)
        return ca_error(CA_ERR_INVALID, "backward: the tensor does not require grad (no parameter "
                        "contributed to it, or it was computed under no_grad)");
    uint64_t pass = atomic_fetch_add(&pass_ids, 1) + 1;
    if (!out->grad_fn) return seed_gradient(out, grad_out);   /* a leaf: d out / d out */
    node_vec nodes = {0};
    ca_status s = collect(out->grad_fn, pass, &nodes);
    if (s == CA_OK) {
        qsort(nodes.v, nodes.n, sizeof *nodes.v, by_id_desc);
        reset_for_pass(&nodes, pass);
        s = seed_gradient(out, grad_out);
    }
    if (s == CA_OK) s = process(&nodes, pass, (roots){1, &out});
    free(nodes.v);
    return s;
}

/* grad into t's gradient: written when it has none yet this pass, else added. */
static ca_status seed_add(ca_tensor *t, const ca_tensor *grad) {
    float beta;
    ca_tensor *g = ca_grad_target(t, &beta);
    if (!g) return ca_last_status();
    ca_status s = CA_KCALL(ca_tdev(g), axpby, .dt = g->dtype, .n = g->numel, .alpha = 1.0f,
                           .x = ca_tptr(grad), .beta = beta, .y = ca_tptr(g));
    if (s == CA_OK) ca_grad_written(t);
    return s;
}

ca_status ca_backward_roots(int n, ca_tensor *const *outs, ca_tensor *const *grads, uint64_t pass) {
    node_vec nodes = {0};
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && i < n; i++)
        if (grads[i] && outs[i]->grad_fn && outs[i]->grad_fn->visit != pass)
            s = collect(outs[i]->grad_fn, pass, &nodes);
    if (s == CA_OK) {
        qsort(nodes.v, nodes.n, sizeof *nodes.v, by_id_desc);
        reset_for_pass(&nodes, pass);
    }
    for (int i = 0; s == CA_OK && i < n; i++)
        if (grads[i] && outs[i]->requires_grad) s = seed_add(outs[i], grads[i]);
    if (s == CA_OK) s = process(&nodes, pass, (roots){n, outs});
    free(nodes.v);
    return s;
}

ca_status ca_autograd_backward(ca_tensor *loss) {
    if (loss && loss->numel != 1)
        return ca_error(CA_ERR_INVALID, "backward needs a scalar loss, got %lld elements "
                        "(reduce it with ca_mean or ca_sum first)", (long long)loss->numel);
    return run_backward(loss, NULL);
}

ca_status ca_autograd_backward_with(ca_tensor *out, const ca_tensor *grad_out) {
    if (out && grad_out && out->numel != grad_out->numel)
        return ca_error(CA_ERR_INVALID, "backward: gradient has %lld elements, output %lld",
                        (long long)grad_out->numel, (long long)out->numel);
    return run_backward(out, grad_out);
}
