/* SGD and AdamW: parameter groups, lazily created state, one fused kernel call per group and device. */
#include "nn/nn_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ca_adamw_opts adamw_defaults(const ca_adamw_opts *o) {
    ca_adamw_opts d = o ? *o : (ca_adamw_opts){0};
    if (d.lr == 0) d.lr = 1e-3;
    if (d.beta1 == 0) d.beta1 = 0.9;
    if (d.beta2 == 0) d.beta2 = 0.999;
    if (d.eps == 0) d.eps = 1e-8;
    if (d.weight_decay == 0 && !d.weight_decay_set) d.weight_decay = 0.01;
    return d;
}

static ca_sgd_opts sgd_defaults(const ca_sgd_opts *o) {
    ca_sgd_opts d = o ? *o : (ca_sgd_opts){0};
    if (d.lr == 0) d.lr = 0.01;
    return d;
}

static ca_status check_opts(ca_optim_kind kind, const ca_adamw_opts *a, const ca_sgd_opts *s) {
    if (kind == CA_OPTIM_ADAMW) {
        if (a->lr < 0 || a->eps < 0 || a->weight_decay < 0 || a->beta1 < 0 || a->beta1 >= 1 ||
            a->beta2 < 0 || a->beta2 >= 1)
            return ca_error(CA_ERR_INVALID, "AdamW: lr, eps, weight_decay must be >= 0 and betas in [0, 1) "
                            "(got lr %g, betas (%g, %g), eps %g, weight_decay %g)",
                            a->lr, a->beta1, a->beta2, a->eps, a->weight_decay);
    } else {
        if (s->lr < 0 || s->momentum < 0 || s->weight_decay < 0)
            return ca_error(CA_ERR_INVALID, "SGD: lr, momentum, weight_decay must be >= 0");
        if (s->nesterov && (s->momentum <= 0 || s->dampening != 0))
            return ca_error(CA_ERR_INVALID, "SGD: Nesterov momentum requires a momentum and zero dampening");
    }
    return CA_OK;
}

static bool already_in(const ca_optimizer *o, const ca_tensor *p) {
    for (int g = 0; g < o->ngroups; g++)
        for (int i = 0; i < o->groups[g].n; i++)
            if (o->groups[g].params[i] == p) return true;
    return false;
}

static ca_status add_group(ca_optimizer *o, ca_tensor *const *params, int n, const void *opts) {
    ca_adamw_opts a = {0};
    ca_sgd_opts s = {0};
    if (o->kind == CA_OPTIM_ADAMW) a = adamw_defaults(opts);
    else s = sgd_defaults(opts);
    ca_status st = check_opts(o->kind, &a, &s);
    if (st != CA_OK) return st;
    for (int i = 0; i < n; i++) {
        if (!params[i] || !ca_dtype_is_float(params[i]->dtype) || !params[i]->persistent)
            return ca_error(CA_ERR_INVALID, "optimizer: parameter %d is not a persistent float tensor", i);
        if (already_in(o, params[i]))
            return ca_error(CA_ERR_INVALID, "optimizer: parameter %d appears in more than one group", i);
    }
    ca_optim_group *ng = realloc(o->groups, (size_t)(o->ngroups + 1) * sizeof *ng);
    if (!ng) return ca_error(CA_ERR_NOMEM, "out of host memory");
    o->groups = ng;
    ca_optim_group *g = &o->groups[o->ngroups];
    memset(g, 0, sizeof *g);
    g->params = calloc((size_t)(n ? n : 1), sizeof *g->params);
    g->state1 = calloc((size_t)(n ? n : 1), sizeof *g->state1);
    g->state2 = calloc((size_t)(n ? n : 1), sizeof *g->state2);
    if (!g->params || !g->state1 || !g->state2) {
        free(g->params); free(g->state1); free(g->state2);
        return ca_error(CA_ERR_NOMEM, "out of host memory");
    }
    memcpy(g->params, params, (size_t)n * sizeof *params);
    g->n = n;
    g->adamw = a;
    g->sgd = s;
    g->lr = g->base_lr = o->kind == CA_OPTIM_ADAMW ? a.lr : s.lr;
    g->first_index = ca_optimizer_num_params(o);
    o->ngroups++;
    return CA_OK;
}

static ca_status create(ca_optim_kind kind, ca_tensor *const *params, int n, const void *opts, ca_optimizer **out) {
    if (out) *out = NULL;
    if (!out || (n > 0 && !params)) return ca_error(CA_ERR_INVALID, "optimizer: parameters and out are required");
    ca_optimizer *o = calloc(1, sizeof *o);
    if (!o) return ca_error(CA_ERR_NOMEM, "out of host memory");
    o->kind = kind;
    ca_status s = add_group(o, params, n, opts);
    if (s != CA_OK) {
        ca_optimizer_destroy(o);
        return s;
    }
    *out = o;
    return CA_OK;
}

static ca_status from_module(ca_optim_kind kind, ca_module *m, const void *opts, ca_optimizer **out) {
    if (out) *out = NULL;
    if (!m) return ca_error(CA_ERR_INVALID, "optimizer: module is NULL");
    int n = ca_module_num_params(m);
    return create(kind, m->flat, n, opts, out);
}

ca_status ca_adamw_create(ca_module *m, const ca_adamw_opts *opts, ca_optimizer **out) {
    return from_module(CA_OPTIM_ADAMW, m, opts, out);
}
ca_status ca_sgd_create(ca_module *m, const ca_sgd_opts *opts, ca_optimizer **out) {
    return from_module(CA_OPTIM_SGD, m, opts, out);
}
ca_status ca_adamw_create_params(ca_tensor *const *params, int n, const ca_adamw_opts *opts, ca_optimizer **out) {
    return create(CA_OPTIM_ADAMW, params, n, opts, out);
}
ca_status ca_sgd_create_params(ca_tensor *const *params, int n, const ca_sgd_opts *opts, ca_optimizer **out) {
    return create(CA_OPTIM_SGD, params, n, opts, out);
}

ca_status ca_optimizer_add_group(ca_optimizer *o, ca_tensor *const *params, int n, const void *opts) {
    if (!o) return ca_error(CA_ERR_INVALID, "optimizer is NULL");
    ca_status s = add_group(o, params, n, opts);
    if (s == CA_OK && o->owner.owner) s = ca_optimizer_init_state(o);
    return s;
}

void ca_optimizer_destroy(ca_optimizer *o) {
    if (!o) return;
    if (o->owner.owner && o->owner.forget) o->owner.forget(o->owner.owner, o);
    for (int g = 0; g < o->ngroups; g++) {
        for (int i = 0; i < o->groups[g].n; i++) {
            ca_tensor_free(o->groups[g].state1[i]);
            ca_tensor_free(o->groups[g].state2[i]);
        }
        free(o->groups[g].params);
        free(o->groups[g].state1);
        free(o->groups[g].state2);
    }
    for (int i = 0; i < o->nstate_names; i++) free(o->state_names[i]);
    free(o->state_names);
    free(o->groups);
    free(o);
}

/* ------------------------------------------------------------------ state */

static ca_status zero_state(ca_tensor *p, ca_tensor **slot) {
    if (*slot && ca_tdev(*slot) == ca_tdev(p)) return CA_OK;
    if (*slot) return ca_tensor_move_(*slot, ca_tdev(p));
    ca_tensor *t = ca_zeros(ca_tdev(p), CA_F32, p->ndim, p->shape);
    if (!t) return ca_last_status();
    *slot = ca_tensor_keep(t);
    return CA_OK;
}

ca_status ca_optimizer_init_state(ca_optimizer *o) {
    for (int g = 0; g < o->ngroups; g++) {
        ca_optim_group *gr = &o->groups[g];
        bool needs1 = o->kind == CA_OPTIM_ADAMW || gr->sgd.momentum != 0;
        for (int i = 0; i < gr->n; i++) {
            if (!gr->params[i]->requires_grad) continue;   /* frozen: never stepped, no state */
            ca_status s = needs1 ? zero_state(gr->params[i], &gr->state1[i]) : CA_OK;
            if (s == CA_OK && o->kind == CA_OPTIM_ADAMW) s = zero_state(gr->params[i], &gr->state2[i]);
            if (s != CA_OK) return s;
        }
    }
    return CA_OK;
}

int64_t ca_optimizer_state_bytes(const ca_optimizer *o) {
    int64_t b = 0;
    for (int g = 0; o && g < o->ngroups; g++)
        for (int i = 0; i < o->groups[g].n; i++) {
            if (o->groups[g].state1[i]) b += (int64_t)ca_tensor_nbytes(o->groups[g].state1[i]);
            if (o->groups[g].state2[i]) b += (int64_t)ca_tensor_nbytes(o->groups[g].state2[i]);
        }
    return b;
}

int ca_optimizer_num_params(const ca_optimizer *o) {
    int n = 0;
    for (int g = 0; g < o->ngroups; g++) n += o->groups[g].n;
    return n;
}

ca_tensor *ca_optimizer_param_at(const ca_optimizer *o, int i) {
    for (int g = 0; g < o->ngroups; g++) {
        if (i < o->groups[g].n) return o->groups[g].params[i];
        i -= o->groups[g].n;
    }
    return NULL;
}

/* ------------------------------------------------------------------ step */

#define MAX_BATCH 256

/* One fused kernel call per run of parameters on the same device. */
static ca_status apply_group(ca_optimizer *o, ca_optim_group *g, float grad_scale) {
    void *p[MAX_BATCH], *s1[MAX_BATCH], *s2[MAX_BATCH];
    const void *gr[MAX_BATCH];
    int64_t numel[MAX_BATCH];
    int i = 0;
    while (i < g->n) {
        int k = 0;
        ca_device *dev = NULL;
        for (; i < g->n && k < MAX_BATCH; i++) {
            ca_tensor *t = g->params[i];
            /* no gradient (or frozen, whose gradient a bucket may still hold): skipped, as in PyTorch */
            if (!t->requires_grad || !t->grad_defined || !t->grad) continue;
            if (dev && ca_tdev(t) != dev) break;
            dev = ca_tdev(t);
            p[k] = ca_tptr(t);
            gr[k] = ca_tptr(t->grad);
            s1[k] = g->state1[i] ? ca_tptr(g->state1[i]) : NULL;
            s2[k] = g->state2[i] ? ca_tptr(g->state2[i]) : NULL;
            numel[k++] = t->numel;
        }
        if (!k) continue;
        ca_tensor_list tl = {.count = k, .param = p, .grad = gr, .state1 = s1, .state2 = s2,
                             .numel = numel, .grad_dtype = CA_F32};
        ca_status s;
        double t = (double)(o->steps + 1);
        if (o->kind == CA_OPTIM_ADAMW) {
            ca_adamw_args a = {
                .t = &tl,
                .lr = (float)g->lr, .beta1 = (float)g->adamw.beta1, .beta2 = (float)g->adamw.beta2,
                .eps = (float)g->adamw.eps, .weight_decay = (float)g->adamw.weight_decay,
                .bias_correction1 = (float)(1.0 - pow(g->adamw.beta1, t)),
                .bias_correction2 = (float)(1.0 - pow(g->adamw.beta2, t)),
                .grad_scale = grad_scale,
            };
            s = CA_KCALL_ARGS(dev, adamw, &a);
        } else {
            ca_sgd_args a = {
                .t = &tl,
                .lr = (float)g->lr, .momentum = (float)g->sgd.momentum, .dampening = (float)g->sgd.dampening,
                .weight_decay = (float)g->sgd.weight_decay, .nesterov = g->sgd.nesterov,
                .first_step = o->steps == 0, .grad_scale = grad_scale,
            };
            s = CA_KCALL_ARGS(dev, sgd, &a);
        }
        if (s != CA_OK) return s;
    }
    return CA_OK;
}

static void advance_schedule(ca_optimizer *o) {
    if (!o->has_schedule) return;
    int64_t stride = o->schedule_stride > 0 ? o->schedule_stride : 1;
    double f = ca_lr_schedule_factor(&o->schedule, o->steps * stride);
    for (int g = 0; g < o->ngroups; g++) o->groups[g].lr = o->groups[g].base_lr * f;
}

void ca_optimizer_set_owner(ca_optimizer *o, const ca_optimizer_owner *owner) {
    if (owner) o->owner = *owner;
    else memset(&o->owner, 0, sizeof o->owner);
}

void ca_optimizer_set_schedule_stride(ca_optimizer *o, int64_t stride) {
    o->schedule_stride = stride;
    advance_schedule(o);
}

ca_status ca_optimizer_apply(ca_optimizer *o, float grad_scale) {
    ca_status s = ca_optimizer_init_state(o);
    for (int g = 0; s == CA_OK && g < o->ngroups; g++) s = apply_group(o, &o->groups[g], grad_scale);
    if (s != CA_OK) return s;
    for (int g = 0; g < o->ngroups; g++)      /* low-precision copies are now stale */
        for (int i = 0; i < o->groups[g].n; i++)
            if (o->groups[g].params[i]->requires_grad) o->groups[g].params[i]->version++;
    o->steps++;
    o->skipped = false;
    advance_schedule(o);
    return CA_OK;
}

ca_status ca_optimizer_step(ca_optimizer *o) {
    if (!o) return ca_error(CA_ERR_INVALID, "optimizer is NULL");
    if (o->owner.owner) return o->owner.step(o->owner.owner, o);
    return ca_optimizer_apply(o, 1.0f);
}

void ca_optimizer_zero_grad(ca_optimizer *o) {
    if (!o || (o->owner.owner && !o->owner.should_zero_grad(o->owner.owner))) return;
    for (int g = 0; g < o->ngroups; g++)
        for (int i = 0; i < o->groups[g].n; i++) ca_tensor_zero_grad(o->groups[g].params[i]);
}

bool ca_optimizer_step_was_skipped(const ca_optimizer *o) { return o && o->skipped; }
int ca_optimizer_num_groups(const ca_optimizer *o) { return o ? o->ngroups : 0; }
int64_t ca_optimizer_steps(const ca_optimizer *o) { return o ? o->steps : 0; }

double ca_optimizer_get_lr(const ca_optimizer *o, int group) {
    return o && group >= 0 && group < o->ngroups ? o->groups[group].lr : NAN;
}

ca_status ca_optimizer_set_lr(ca_optimizer *o, int group, double lr) {
    if (!o || group < 0 || group >= o->ngroups || lr < 0)
        return ca_error(CA_ERR_INVALID, "set_lr: no group %d or negative lr %g", group, lr);
    o->groups[group].lr = o->groups[group].base_lr = lr;
    advance_schedule(o);
    return CA_OK;
}

ca_status ca_optimizer_set_steps(ca_optimizer *o, int64_t steps) {
    if (!o || steps < 0) return ca_error(CA_ERR_INVALID, "set_steps: negative step count");
    o->steps = steps;
    advance_schedule(o);
    return CA_OK;
}

ca_status ca_optimizer_set_schedule(ca_optimizer *o, const ca_lr_schedule *s) {
    if (!o || !s) return ca_error(CA_ERR_INVALID, "set_schedule: optimizer and schedule are required");
    if (s->warmup_steps < 0 || s->min_lr_ratio < 0 || s->min_lr_ratio > 1 ||
        (s->kind != CA_SCHED_CONSTANT && s->total_steps <= 0))
        return ca_error(CA_ERR_INVALID, "schedule: warmup_steps >= 0, min_lr_ratio in [0, 1], and total_steps > 0 "
                        "for linear/cosine decay");
    o->schedule = *s;
    o->has_schedule = true;
    advance_schedule(o);
    return CA_OK;
}

/* ------------------------------------------------------------------ state listing */

static ca_status build_state_names(ca_optimizer *o) {
    if (o->state_names) return CA_OK;
    int n = ca_optimizer_num_params(o) * 2;
    o->state_names = calloc((size_t)(n ? n : 1), sizeof *o->state_names);
    if (!o->state_names) return ca_error(CA_ERR_NOMEM, "out of host memory");
    const char *n1 = o->kind == CA_OPTIM_ADAMW ? "exp_avg" : "momentum_buffer";
    for (int g = 0; g < o->ngroups; g++)
        for (int i = 0; i < o->groups[g].n; i++) {
            int idx = o->groups[g].first_index + i;
            char buf[96];
            snprintf(buf, sizeof buf, "state.%d.%s", idx, n1);
            o->state_names[2 * idx] = strdup(buf);
            snprintf(buf, sizeof buf, "state.%d.exp_avg_sq", idx);
            o->state_names[2 * idx + 1] = strdup(buf);
        }
    o->nstate_names = n;
    return CA_OK;
}

/* Present state tensors, in (param, slot) order. A frozen parameter's are not listed, also those it
 * kept from before it was frozen: checkpoints hold the trainable parameters' state only. */
static ca_tensor *state_slot(ca_optimizer *o, int k, int *idx) {
    int pi = k / 2, slot = k % 2;
    *idx = k;
    for (int g = 0; g < o->ngroups; g++) {
        const ca_optim_group *gr = &o->groups[g];
        if (pi < gr->n) return !gr->params[pi]->requires_grad ? NULL : slot ? gr->state2[pi] : gr->state1[pi];
        pi -= gr->n;
    }
    return NULL;
}

ca_tensor *ca_optimizer_state_param(ca_optimizer *o, int i, const char **name, int *slot) {
    if (!o || build_state_names(o) != CA_OK) return NULL;
    for (int g = 0; g < o->ngroups; g++) {   /* the states ca_optimizer_init_state makes, in its order */
        const ca_optim_group *gr = &o->groups[g];
        bool has[2] = {o->kind == CA_OPTIM_ADAMW || gr->sgd.momentum != 0, o->kind == CA_OPTIM_ADAMW};
        for (int j = 0; j < gr->n; j++)
            for (int k = 0; k < 2; k++) {
                if (!gr->params[j]->requires_grad || !has[k] || i-- > 0) continue;
                if (name) *name = o->state_names[2 * (gr->first_index + j) + k];
                if (slot) *slot = k;
                return gr->params[j];
            }
    }
    return NULL;
}

int ca_optimizer_num_state(ca_optimizer *o) {
    if (!o || ca_optimizer_init_state(o) != CA_OK) return 0;
    int n = 0, idx;
    for (int k = 0; k < ca_optimizer_num_params(o) * 2; k++) n += state_slot(o, k, &idx) != NULL;
    return n;
}

ca_tensor *ca_optimizer_state_at(ca_optimizer *o, int i, const char **name) {
    if (!o || build_state_names(o) != CA_OK) return NULL;
    int idx;
    for (int k = 0; k < ca_optimizer_num_params(o) * 2; k++) {
        ca_tensor *t = state_slot(o, k, &idx);
        if (!t) continue;
        if (i-- == 0) {
            if (name) *name = o->state_names[idx];
            return t;
        }
    }
    return NULL;
}
