/* Tensor-parallel Linear (Megatron-LM's column and row split) over the device mesh's tp communicator, and
 * the plan (ca_tp_plan) that makes a prepared model's Linear layers so. Two autograd ops carry the
 * communication: tp_copy (identity forward, all-reduce of the gradient backward) in front of a colwise
 * layer, tp_reduce (all-reduce forward, identity backward) after a rowwise one. */
#include "accelerator/mesh_impl.h"
#include "tensor/ops_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ the two ops */

static ca_status tp_copy_backward(ca_node *n, ca_tensor *g) {
    ca_comm *tp = n->ctx;
    ca_tensor *sum = ca_op_new_like(g);
    if (!sum) return ca_last_status();
    ca_status s = ca_comm_all_reduce(tp, ca_tptr(g), ca_tptr(sum), (size_t)g->numel, g->dtype, CA_OP_SUM, NULL);
    if (s != CA_OK) return ca_error_context("tensor-parallel Linear (colwise): the input's gradient");
    return ca_op_accumulate_owned(n->in[0], sum, 1.0f);
}
static const ca_node_vt tp_copy_vt = {"tp_copy", tp_copy_backward};

/* x, whose gradient is summed over the tp ranks in backward (each holds the part its columns give). */
static ca_tensor *tp_copy(ca_tensor *x, ca_comm *tp) {
    if (!x || !ca_needs_grad(1, &x)) return x;
    ca_tensor *v = ca_tensor_view(x, x->ndim, x->shape, x->stride, x->offset);
    ca_node *n = v ? ca_record(&tp_copy_vt, v, 1, &x) : NULL;
    if (!n) return NULL;
    n->ctx = tp;
    return v;
}

static ca_status tp_reduce_backward(ca_node *n, ca_tensor *g) {
    return ca_op_accumulate_owned(n->in[0], g, 1.0f);   /* every rank's part had the whole output's gradient */
}
static const ca_node_vt tp_reduce_vt = {"tp_reduce", tp_reduce_backward};

/* The sum over the tp ranks of y (each rank's product of its rows of the input features). */
static ca_tensor *tp_reduce(ca_tensor *y, ca_comm *tp) {
    if (!y) return NULL;
    if (!ca_tensor_is_contiguous(y)) y = ca_contiguous(y);
    ca_tensor *out = y ? ca_op_new_like(y) : NULL;
    if (!out) return NULL;
    if (ca_comm_all_reduce(tp, ca_tptr(y), ca_tptr(out), (size_t)y->numel, y->dtype, CA_OP_SUM, NULL) != CA_OK) {
        ca_error_context("tensor-parallel Linear (rowwise): the output");
        return NULL;
    }
    if (ca_needs_grad(1, &y) && !ca_record(&tp_reduce_vt, out, 1, &y)) return NULL;
    return out;
}

/* ------------------------------------------------------------------ the layers' forwards */

static ca_tensor *no_comm(ca_module *self) {
    ca_error(CA_ERR_STATE, "a tensor-parallel %s holds one tp rank's part of its weight and runs only while the "
             "accelerator that split it exists", self->type);
    return NULL;
}

static ca_tensor *colwise_forward(ca_module *self, ca_tensor *x, void *ctx) {
    if (!ctx) return no_comm(self);
    return ca_linear(tp_copy(x, ctx), self->params[0], self->nparams > 1 ? self->params[1] : NULL);
}

static ca_tensor *rowwise_forward(ca_module *self, ca_tensor *x, void *ctx) {
    if (!ctx) return no_comm(self);
    ca_tensor *y = tp_reduce(ca_linear(x, self->params[0], NULL), ctx);
    return y && self->nparams > 1 ? ca_add(y, self->params[1]) : y;
}

/* ------------------------------------------------------------------ the plan */

typedef struct tp_walk {
    ca_accelerator *acc;
    ca_module *root;
    int matched;
} tp_walk;

/* Splits Linear module l (named `name`) by style over the tp ranks, each of its `parts` blocks alike. */
static ca_status tp_split(tp_walk *w, ca_module *l, const char *name, int style, int parts) {
    ca_mesh *m = w->acc->mesh;
    int tp = m->shape.size[CA_MESH_TP], r = m->coord[CA_MESH_TP];
    if (strcmp(l->type, "Linear") != 0 || l->nparams < 1 || l->params[0]->ndim != 2)
        return ca_error(CA_ERR_UNSUPPORTED, "ca_tp_plan: \"%s\" is a %s; caccel splits Linear layers only (not yet "
                        "embeddings or norms)", name, l->type);
    ca_tensor *wt = l->params[0];
    int dim = style == CA_TP_COLWISE ? 0 : 1;     /* weight [out, in]: colwise splits out, rowwise in */
    int64_t n = wt->shape[dim];
    if (n % parts != 0 || (n / parts) % tp != 0)
        return ca_error(CA_ERR_CONFIG, "ca_tp_plan: %s Linear \"%s\" has %lld %s features%s, which "
                        "parallelism_config_tp_size %d does not divide", style == CA_TP_COLWISE ? "colwise" : "rowwise",
                        name, (long long)(n / parts), dim ? "input" : "output", parts > 1 ? " per fused block" : "", tp);
    int64_t part = n / parts / tp;
    ca_status s = ca_tensor_narrow_(wt, dim, parts, r * part, part);
    if (s == CA_OK && l->nparams > 1 && style == CA_TP_COLWISE)
        s = ca_tensor_narrow_(l->params[1], 0, parts, r * part, part);
    if (s != CA_OK) return ca_error_context("splitting \"%s\" over the tp ranks (rank %d)", name, w->acc->rank);
    ca_module **nt = realloc(m->tp, (size_t)(m->ntp + 1) * sizeof *nt);
    if (!nt) return ca_error(CA_ERR_NOMEM, "out of host memory");
    m->tp = nt;
    m->tp[m->ntp++] = l;
    l->forward = style == CA_TP_COLWISE ? colwise_forward : rowwise_forward;
    l->ctx = m->comm[CA_MESH_TP];
    w->matched++;
    return CA_OK;
}

/* Every module under mod (named prefix) that the plan names is split. */
static ca_status tp_visit(tp_walk *w, ca_module *mod, const char *prefix) {
    for (int i = 0; i < mod->nchildren; i++) {
        char name[512];
        snprintf(name, sizeof name, "%s%s%s", prefix, prefix[0] ? "." : "", mod->child_names[i]);
        int parts = 1, style = ca_tp_plan_match(w->root, name, &parts);
        ca_status s = style ? tp_split(w, mod->children[i], name, style, parts) : tp_visit(w, mod->children[i], name);
        if (s != CA_OK) return s;
    }
    return CA_OK;
}

ca_status ca_tp_apply(ca_accelerator *acc, ca_module *m) {
    if (!acc->mesh) return CA_OK;
    const char *tpo = ca_config_origin(acc->cfg, "parallelism_config.parallelism_config_tp_size");
    int tp = acc->mesh->shape.size[CA_MESH_TP];
    if (!m->ntp)
        return ca_error(CA_ERR_UNSUPPORTED, "ca_prepare: parallelism_config_tp_size %d (from %s) needs a tensor-parallel "
                        "plan on the model (ca_tp_plan(model, \"fc1\", \"colwise\"), ...); a model without one is "
                        "not split automatically yet", tp, tpo);
    tp_walk w = {.acc = acc, .root = m};
    ca_status s = tp_visit(&w, m, "");
    if (s == CA_OK && !w.matched)
        s = ca_error(CA_ERR_CONFIG, "ca_prepare: the model's tensor-parallel plan (%d entr%s, the first \"%s\") names no "
                     "module of it", m->ntp, m->ntp > 1 ? "ies" : "y", m->tp_pattern[0]);
    if (s == CA_OK) ca_module_zero_grad(m);
    return s;
}

void ca_tp_release(ca_accelerator *acc) {
    if (!acc->mesh) return;
    for (int i = 0; acc->model && i < acc->mesh->ntp; i++) acc->mesh->tp[i]->ctx = NULL;
    free(acc->mesh->tp);
    acc->mesh->tp = NULL;
    acc->mesh->ntp = 0;
}

bool ca_tp_is_split(const ca_accelerator *acc, const ca_tensor *t) {
    for (int i = 0; acc->mesh && i < acc->mesh->ntp; i++) {
        const ca_module *l = acc->mesh->tp[i];   /* a rowwise layer's bias is whole */
        if (l->params[0] == t || (l->forward == colwise_forward && l->nparams > 1 && l->params[1] == t)) return true;
    }
    return false;
}
