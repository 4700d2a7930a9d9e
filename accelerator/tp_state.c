/* Full-state checkpoints under tensor parallelism (Accelerate's full state dict with a tp mesh): while a
 * save or a load runs, each split parameter of the prepared model and the optimizers' state of it (SGD's
 * momentum, AdamW's moments: split the same way) are whole on every rank, gathered over the tp
 * communicator, so that the files are those one process writes and a checkpoint of any tp size loads at
 * any other; afterwards each rank keeps its slice of the values (a load's) again. The tensors stay the
 * same objects (the optimizer and the modules hold them), resized in place. */
#include "accelerator/mesh_impl.h"
#include "tensor/tensor_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ca_status ca_tp_split_of(const ca_accelerator *acc, ca_module *model, const ca_tensor *p, const char *name, int *dim,
                         int *parts) {
    char mod[512];
    const char *dot = strrchr(name, '.');
    int len = dot ? (int)(dot - name) : 0;
    snprintf(mod, sizeof mod, "%.*s", len, name);
    *parts = 1;
    int style = ca_tp_plan_match(model, mod, parts);
    size_t ml = strlen(mod);   /* a LoRA adapter's lora_A / lora_B: split as the plan split its base layer */
    if (!style && ml > 7 && (!strcmp(mod + ml - 7, ".lora_A") || !strcmp(mod + ml - 7, ".lora_B"))) {
        mod[ml - 7] = '\0';
        style = ca_tp_plan_match(model, mod, parts);
    }
    if (!style)
        return ca_error(CA_ERR_INTERNAL, "tensor parallelism: parameter \"%s\" is split but the plan names no module "
                        "\"%s\"", name, mod);
    if (style != CA_TP_COLWISE && style != CA_TP_ROWWISE && style != CA_TP_COLWISE_GATHER)   /* a style added later says how it splits here */
        return ca_error(CA_ERR_UNSUPPORTED, "tensor parallelism: parameter \"%s\" is split by tensor-parallel style "
                        "%d, whose full-state checkpoint (the gather of its slices) is not implemented", name, style);
    *dim = ca_tp_split_dim(acc, p);
    return CA_OK;
}

/* The slices of every tp rank side by side: `all` holds rank r's contiguous slice at r * n elements, each
 * slice `parts` blocks of dimension dim; `full` gets, in each block, rank 0's rows (or columns), then rank
 * 1's, ..., as the tensor was before the split. */
static void tp_interleave(const ca_tensor *t, int dim, int parts, int tp, const char *all, char *full) {
    size_t es = ca_dtype_size(t->dtype), n = (size_t)t->numel;
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < dim; d++) outer *= t->shape[d];
    for (int d = dim + 1; d < t->ndim; d++) inner *= t->shape[d];
    size_t run = (size_t)(t->shape[dim] / parts * inner) * es;   /* one rank's part of one block */
    for (int64_t o = 0; o < outer; o++)
        for (int k = 0; k < parts; k++)
            for (int r = 0; r < tp; r++)
                memcpy(full + ((size_t)(o * parts + k) * (size_t)tp + (size_t)r) * run,
                       all + (size_t)r * n * es + (size_t)(o * parts + k) * run, run);
}

/* t (this rank's slice) becomes the whole tensor on every rank of the tp group. Collective over tp. */
static ca_status tp_gather(ca_accelerator *acc, ca_tensor *t, int dim, int parts) {
    ca_comm *c = acc->mesh->comm[CA_MESH_TP];
    int tp = acc->mesh->shape.size[CA_MESH_TP];
    size_t bytes = ca_tensor_nbytes(t) * (size_t)tp;
    int64_t total = t->numel * tp;
    char *all = malloc(bytes ? bytes : 1), *full = malloc(bytes ? bytes : 1);
    ca_tensor *recv = ca_tensor_keep(ca_zeros(ca_tdev(t), t->dtype, 1, &total));
    ca_status s = !all || !full ? ca_error(CA_ERR_NOMEM, "out of host memory") : recv ? CA_OK : ca_last_status();
    if (s == CA_OK && !ca_tensor_is_contiguous(t))
        s = ca_error(CA_ERR_INTERNAL, "tensor parallelism: a split tensor is not contiguous");
    if (s == CA_OK) s = ca_comm_all_gather(c, ca_tptr(t), ca_tptr(recv), (size_t)t->numel, t->dtype, NULL);
    if (s == CA_OK) s = ca_tensor_to_host(recv, all, bytes);
    if (s == CA_OK) tp_interleave(t, dim, parts, tp, all, full);
    if (s == CA_OK) s = ca_tensor_resize_dim_(t, dim, t->shape[dim] * tp, full);
    ca_tensor_free(recv);
    free(all);
    free(full);
    return s;
}

/* The optimizer states of parameter p: slot 0 and 1 of every prepared optimizer's group that holds it. */
static ca_tensor **tp_state_slot(ca_accelerator *acc, const ca_tensor *p, int k) {
    int seen = 0;
    for (int i = 0; i < acc->nopts; i++)
        for (int g = 0; g < acc->opts[i]->ngroups; g++) {
            ca_optim_group *G = &acc->opts[i]->groups[g];
            for (int j = 0; j < G->n; j++)
                if (G->params[j] == p) {
                    if (seen++ == k / 2) return k % 2 ? &G->state2[j] : &G->state1[j];
                }
        }
    return NULL;
}

/* Parameter w->p and its optimizer state whole (its gradient set aside first). */
static ca_status tp_whole_one(ca_accelerator *acc, ca_tp_whole *w) {
    w->p->grad = NULL;   /* in w */
    ca_status s = tp_gather(acc, w->p, w->dim, w->parts);
    ca_tensor **st;
    for (int k = 0; s == CA_OK && (st = tp_state_slot(acc, w->p, k)) != NULL; k++)
        if (*st) s = tp_gather(acc, *st, w->dim, w->parts);   /* made lazily: none before the first step */
    return s;
}

/* Back to this rank's slice of w->p (when it was gathered) and of each state tensor of the whole shape
 * (those made while whole too: a load or a save makes them), its gradient restored. Local. */
static ca_status tp_split_one(ca_accelerator *acc, ca_tp_whole *w) {
    ca_tensor *p = w->p;
    int tp = acc->mesh->shape.size[CA_MESH_TP], r = acc->mesh->coord[CA_MESH_TP];
    int64_t part = w->slice / w->parts, whole = w->slice * tp;
    ca_status s = CA_OK;
    ca_tensor **st;
    for (int k = 0; (st = tp_state_slot(acc, p, k)) != NULL; k++)
        if (s == CA_OK && *st && (*st)->ndim == p->ndim && (*st)->shape[w->dim] == whole)
            s = ca_tensor_narrow_(*st, w->dim, w->parts, r * part, part);
    if (s == CA_OK && p->shape[w->dim] == whole) s = ca_tensor_narrow_(p, w->dim, w->parts, r * part, part);
    p->grad = w->grad;   /* the slice's gradient: its shape again */
    p->grad_defined = w->grad_defined;
    return s;
}

static ca_status tp_summon_off(ca_accelerator *acc) {
    ca_mesh *m = acc->mesh;
    ca_status s = CA_OK;
    for (int i = 0; i < m->nwhole; i++) {
        ca_status r = tp_split_one(acc, &m->whole[i]);
        if (s == CA_OK && r != CA_OK) s = ca_error_context("tensor parallelism: keeping rank %d's slice of a "
                                                           "parameter after a checkpoint", acc->rank);
    }
    free(m->whole);
    m->whole = NULL;
    m->nwhole = 0;
    return s;
}

ca_status ca_tp_summon(ca_accelerator *acc, bool on) {
    ca_mesh *m = acc ? acc->mesh : NULL;
    if (!m || !acc->model) return CA_OK;
    if (!on) return m->summons == 0 || --m->summons > 0 ? CA_OK : tp_summon_off(acc);
    if (m->summons > 0) {
        m->summons++;
        return CA_OK;
    }
    ca_module *model = acc->model;
    int n = ca_module_num_params(model);
    if (!(m->whole = calloc((size_t)(n ? n : 1), sizeof *m->whole))) return ca_error(CA_ERR_NOMEM, "out of host memory");
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && i < n; i++) {
        ca_tensor *p = ca_module_param_at(model, i);
        if (!ca_tp_is_split(acc, p)) continue;
        ca_tp_whole *w = &m->whole[m->nwhole];
        *w = (ca_tp_whole){.p = p, .grad = p->grad, .grad_defined = p->grad_defined};
        s = ca_tp_split_of(acc, model, p, ca_module_param_name(model, i), &w->dim, &w->parts);
        if (s != CA_OK) break;
        w->slice = p->shape[w->dim];
        m->nwhole++;   /* listed before it is gathered: a failure part-way is undone by the split */
        s = tp_whole_one(acc, w);
        if (s != CA_OK) ca_error_context("tensor parallelism: gathering parameter \"%s\" over the tp ranks (rank %d)",
                                         ca_module_param_name(model, i), acc->rank);
    }
    if (s != CA_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ca_last_error());
        tp_summon_off(acc);
        return ca_error(s, "%s", msg);
    }
    m->summons = 1;
    return CA_OK;
}

ca_status ca_tp_full_params(ca_accelerator *acc, bool on) {
    if (!acc->mesh || !acc->model) return CA_OK;
    if (!on) {
        if (acc->mesh->summons == 1) ca_tp_set_plain(acc, false);   /* the last: the split forwards again */
        return ca_tp_summon(acc, false);
    }
    ca_status s = ca_tp_summon(acc, true);
    if (s == CA_OK) ca_tp_set_plain(acc, true);
    return s;
}

ca_status ca_tp_param_split(const ca_accelerator *acc, const ca_tensor *p, int *dim, int *parts) {
    *dim = -1;
    *parts = 1;
    if (!acc->mesh || !acc->model || !ca_tp_is_split(acc, p)) return CA_OK;
    ca_module *model = acc->model;
    for (int i = 0; i < ca_module_num_params(model); i++)
        if (ca_module_param_at(model, i) == p)
            return ca_tp_split_of(acc, model, p, ca_module_param_name(model, i), dim, parts);
    return ca_error(CA_ERR_INTERNAL, "tensor parallelism: a split parameter is not the prepared model's");
}
