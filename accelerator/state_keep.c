/* state_keep.c: a host copy of what a load changes, taken before it changes anything and put back
 * when it fails part-way. ca_load_model's rank-0 broadcast keeps the model's parameters;
 * ca_load_state's keeps the rank's whole training state (parameters, optimizer state tensors and
 * scalars, the ZeRO shard's state, the scaler, the accumulation counter, the generator, the
 * dataloaders' positions; the registered objects are applied only once everything else arrived),
 * since every rank has applied the scalars and rank 0 the files by the time a broadcast to a peer
 * fails. */
#include "accelerator/accelerator_impl.h"
#include "accelerator/checkpoint_impl.h"
#include "accelerator/sync_impl.h"
#include "data/data_impl.h"
#include "nn/nn_impl.h"
#include "tensor/tensor_impl.h"
#include <stdlib.h>
#include <string.h>

typedef struct kept_tensor {
    ca_tensor *t;
    void *bytes;
    struct ca_meta_init *mark;   /* a meta parameter (before ca_prepare): its record, no bytes */
} kept_tensor;

typedef struct kept_group {     /* a group's scalars; its tensors are in the tensor list */
    double lr, base_lr;
    ca_adamw_opts adamw;
    ca_sgd_opts sgd;
    bool *had1, *had2;          /* which state slots existed (the load may make the others) */
} kept_group;

typedef struct kept_opt {
    int64_t steps;
    bool has_schedule;
    ca_lr_schedule schedule;
    kept_group *groups;
    int ngroups;
} kept_opt;

struct ca_ck_kept {
    kept_tensor *t;
    int nt, cap;
    size_t bytes;               /* host bytes held by the tensor copies */
    bool whole;                 /* the training state (ca_ck_keep_state), not only parameters */
    ca_grad_scaler_state scaler;
    int64_t micro_step;
    uint64_t rng_seed, rng_offset;
    kept_opt *opts;
    int nopts;
    ca_loader_state *loaders;
    int nloaders;
};

static ca_status oom(const char *who, int rank, const char *what, size_t n) {
    return ca_error(CA_ERR_NOMEM, "%s: rank %d cannot keep a host copy of %s (%zu bytes) to restore if the load "
                    "fails", who, rank, what, n);
}

/* t's bytes on the host, remembered with t (NULL: nothing to keep). */
static ca_status keep_tensor(ca_ck_kept *k, ca_tensor *t, const char *who, int rank, const char *what) {
    if (!t) return CA_OK;
    if (k->nt == k->cap) {
        int cap = k->cap ? 2 * k->cap : 16;
        kept_tensor *n = realloc(k->t, (size_t)cap * sizeof *n);
        if (!n) return oom(who, rank, what, 0);
        k->t = n;
        k->cap = cap;
    }
    ca_status s = CA_OK;
    if (ca_tensor_is_meta(t)) {   /* no values: its record, to make it meta again */
        struct ca_meta_init *mark = ca_meta_mark(t, &s);
        if (s == CA_OK) k->t[k->nt++] = (kept_tensor){t, NULL, mark};
        return s;
    }
    size_t nb = ca_tensor_nbytes(t);
    void *b = malloc(nb ? nb : 1);
    if (!b) return oom(who, rank, what, nb);
    k->t[k->nt++] = (kept_tensor){t, b, NULL};
    k->bytes += nb;
    s = ca_tensor_to_host(t, b, nb);
    return s == CA_OK ? s : ca_error_context("%s: rank %d keeping %s", who, rank, what);
}

ca_status ca_ck_keep_params(ca_module *model, int rank, const char *who, ca_ck_kept **out) {
    ca_ck_kept *k = calloc(1, sizeof *k);
    *out = k;
    if (!k) return oom(who, rank, "the model", 0);
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && model && i < ca_module_num_params(model); i++)
        s = keep_tensor(k, ca_module_param_at(model, i), who, rank, ca_module_param_name(model, i));
    return s;
}

/* transient: the groups' state tensors are a load's full-sized copy that the strategy scatters into
 * its shard and drops (ZeRO): not kept, the shard is. */
static ca_status keep_optimizer(ca_ck_kept *k, const ca_optimizer *o, kept_opt *ko, int rank, bool transient) {
    ko->steps = o->steps;
    ko->has_schedule = o->has_schedule;
    ko->schedule = o->schedule;
    if (!(ko->groups = calloc((size_t)(o->ngroups ? o->ngroups : 1), sizeof *ko->groups)))
        return oom("load_state", rank, "an optimizer's groups", 0);
    ko->ngroups = o->ngroups;
    ca_status s = CA_OK;
    for (int g = 0; s == CA_OK && g < o->ngroups; g++) {
        const ca_optim_group *G = &o->groups[g];
        kept_group *kg = &ko->groups[g];
        *kg = (kept_group){.lr = G->lr, .base_lr = G->base_lr, .adamw = G->adamw, .sgd = G->sgd};
        kg->had1 = calloc((size_t)(G->n ? G->n : 1), sizeof *kg->had1);
        kg->had2 = calloc((size_t)(G->n ? G->n : 1), sizeof *kg->had2);
        if (!kg->had1 || !kg->had2) return oom("load_state", rank, "an optimizer's groups", 0);
        for (int i = 0; s == CA_OK && !transient && i < G->n; i++) {
            kg->had1[i] = G->state1[i] != NULL;
            kg->had2[i] = G->state2[i] != NULL;
            s = keep_tensor(k, G->state1[i], "load_state", rank, "an optimizer state tensor");
            if (s == CA_OK) s = keep_tensor(k, G->state2[i], "load_state", rank, "an optimizer state tensor");
        }
    }
    return s;
}

ca_status ca_ck_keep_state(ca_accelerator *acc, ca_ck_kept **out) {
    ca_status s = ca_ck_keep_params(acc->model, acc->rank, "load_state", out);
    ca_ck_kept *k = *out;
    if (s != CA_OK) return s;
    k->whole = true;
    k->scaler = acc->scaler;
    k->micro_step = acc->micro_step;
    ca_rng_get_state(&k->rng_seed, &k->rng_offset);
    if (!(k->opts = calloc((size_t)(acc->nopts ? acc->nopts : 1), sizeof *k->opts)))
        return oom("load_state", acc->rank, "the optimizers", 0);
    k->nopts = acc->nopts;
    bool transient = acc->sync_ops && acc->sync_ops->scatter_state;
    for (int i = 0; s == CA_OK && i < acc->nopts; i++)
        s = keep_optimizer(k, acc->opts[i], &k->opts[i], acc->rank, transient);
    /* ZeRO: the shard of the optimizer state (the groups hold none between steps) */
    if (s == CA_OK) s = keep_tensor(k, acc->zero.s1, "load_state", acc->rank, "the optimizer state shard");
    if (s == CA_OK) s = keep_tensor(k, acc->zero.s2, "load_state", acc->rank, "the optimizer state shard");
    if (s == CA_OK && !(k->loaders = calloc((size_t)(acc->nloaders ? acc->nloaders : 1), sizeof *k->loaders)))
        s = oom("load_state", acc->rank, "the dataloaders' state", 0);
    for (int i = 0; s == CA_OK && i < acc->nloaders; i++) ca_dataloader_get_state(acc->loaders[i], &k->loaders[i]);
    if (s == CA_OK) k->nloaders = acc->nloaders;
    return s;
}

size_t ca_ck_kept_bytes(const ca_ck_kept *k) { return k ? k->bytes : 0; }

/* The optimizer's scalars back; a state slot the load made goes again (it did not exist before). */
static void restore_optimizer(ca_optimizer *o, const kept_opt *ko) {
    o->steps = ko->steps;
    o->has_schedule = ko->has_schedule;
    o->schedule = ko->schedule;
    for (int g = 0; g < o->ngroups; g++) {
        ca_optim_group *G = &o->groups[g];
        const kept_group *kg = &ko->groups[g];
        G->lr = kg->lr;
        G->base_lr = kg->base_lr;
        G->adamw = kg->adamw;
        G->sgd = kg->sgd;
        for (int i = 0; i < G->n; i++) {
            if (!kg->had1[i] && G->state1[i]) ca_tensor_free(G->state1[i]), G->state1[i] = NULL;
            if (!kg->had2[i] && G->state2[i]) ca_tensor_free(G->state2[i]), G->state2[i] = NULL;
        }
    }
}

/* Each loader at its kept seed, epoch and position: its next batch is the one it would have given. */
static ca_status restore_loader(ca_dataloader *dl, const ca_loader_state *ls) {
    ca_status s = ca_dataloader_set_seed(dl, ls->seed);
    if (s == CA_OK) s = ca_dataloader_set_epoch(dl, ls->epoch);
    if (s == CA_OK) s = ca_dataloader_skip_batches(dl, ls->position);
    return s;
}

ca_status ca_ck_restore(ca_accelerator *acc, ca_ck_kept *k) {
    ca_status s = CA_OK;
    for (int i = 0; k && i < k->nt; i++) {   /* local copies: nothing here depends on a peer */
        ca_tensor *t = k->t[i].t;
        if (!k->t[i].bytes) {   /* meta before the load: meta again, with its record (now t's) */
            ca_meta_revert(t, k->t[i].mark);
            k->t[i].mark = NULL;
            continue;
        }
        ca_status r = ca_tensor_copy_from_host(t, k->t[i].bytes, ca_tensor_nbytes(t));
        t->version++;   /* copies cast from the loaded values are stale */
        if (r != CA_OK && s == CA_OK) s = r;
    }
    if (!k || !k->whole) return s;
    acc->scaler = k->scaler;
    acc->micro_step = k->micro_step;
    ca_rng_set_state(k->rng_seed, k->rng_offset);
    for (int i = 0; i < k->nopts && i < acc->nopts; i++) restore_optimizer(acc->opts[i], &k->opts[i]);
    for (int i = 0; i < k->nloaders && i < acc->nloaders; i++) {
        ca_status r = restore_loader(acc->loaders[i], &k->loaders[i]);
        if (r != CA_OK && s == CA_OK) s = r;
    }
    return s;
}

void ca_ck_kept_free(ca_ck_kept *k) {
    if (!k) return;
    for (int i = 0; i < k->nt; i++) {
        free(k->t[i].bytes);
        ca_meta_init_free(k->t[i].mark);
    }
    free(k->t);
    for (int i = 0; k->opts && i < k->nopts; i++) {
        for (int g = 0; k->opts[i].groups && g < k->opts[i].ngroups; g++) {
            free(k->opts[i].groups[g].had1);
            free(k->opts[i].groups[g].had2);
        }
        free(k->opts[i].groups);
    }
    free(k->opts);
    free(k->loaders);
    free(k);
}
