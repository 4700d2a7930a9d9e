/* LoRA layers (PEFT's lora.Linear): target matching by PEFT's rules, wrapping a model's Linear
 * layers in place, the adapter's forward, merge and unmerge. PEFT's files are nn/lora_files.c. */
#include "nn/lora_impl.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LORA_TYPE "lora.Linear"

void ca_lora_config_init(ca_lora_config *cfg) {
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg);
    cfg->r = 8;
    cfg->lora_alpha = 8;
    cfg->bias = "none";
    cfg->init_lora_weights = true;
}

double ca_lora_scaling(const ca_lora_config *cfg) {
    return cfg->use_rslora ? cfg->lora_alpha / sqrt((double)cfg->r) : cfg->lora_alpha / (double)cfg->r;
}

/* ------------------------------------------------------------------ target matching */

/* A compiled target_regex: Python's re.fullmatch is an anchored match at both ends. */
typedef struct matcher {
    const ca_lora_config *cfg;
    pcre2_code *re;
    pcre2_match_data *md;
} matcher;

static void matcher_close(matcher *mt) {
    pcre2_match_data_free(mt->md);
    pcre2_code_free(mt->re);
    mt->md = NULL;
    mt->re = NULL;
}

static ca_status matcher_open(matcher *mt, const ca_lora_config *cfg, const char *what) {
    memset(mt, 0, sizeof *mt);
    mt->cfg = cfg;
    if (!cfg->target_regex) return CA_OK;
    int err;
    PCRE2_SIZE off;
    /* Python 3's str patterns are Unicode: \w, \d and \s match Unicode classes */
    mt->re = pcre2_compile((PCRE2_SPTR)cfg->target_regex, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err,
                           &off, NULL);
    if (!mt->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return ca_error(CA_ERR_INVALID, "%s: target_modules regex '%s' does not compile: %s (at %zu)", what,
                        cfg->target_regex, (const char *)msg, (size_t)off);
    }
    mt->md = pcre2_match_data_create_from_pattern(mt->re, NULL);
    if (!mt->md) {
        matcher_close(mt);
        return ca_error(CA_ERR_NOMEM, "out of host memory matching target_modules");
    }
    return CA_OK;
}

/* PEFT 0.10's check_target_module_exists: a string is re.fullmatch over the name; a list matches
 * the name itself or a name ending in "." + target. */
static bool matcher_test(const matcher *mt, const char *name) {
    if (mt->re)
        return pcre2_match(mt->re, (PCRE2_SPTR)name, PCRE2_ZERO_TERMINATED, 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED,
                           mt->md, NULL) >= 0;
    size_t len = strlen(name);
    for (int i = 0; i < mt->cfg->n_target_modules; i++) {
        const char *t = mt->cfg->target_modules[i];
        size_t tl = strlen(t);
        if (strcmp(name, t) == 0) return true;
        if (len > tl && name[len - tl - 1] == '.' && strcmp(name + len - tl, t) == 0) return true;
    }
    return false;
}

ca_status ca_lora_config_check(const ca_lora_config *cfg, const char *what) {
    if (!cfg) return ca_error(CA_ERR_INVALID, "%s: the config is NULL", what);
    if (cfg->r <= 0) return ca_error(CA_ERR_INVALID, "%s: \"r\" is %lld; a positive rank is needed", what, (long long)cfg->r);
    if (!isfinite(cfg->lora_alpha))
        return ca_error(CA_ERR_INVALID, "%s: \"lora_alpha\" is %g; a finite number is needed", what, cfg->lora_alpha);
    if (!(cfg->lora_dropout >= 0 && cfg->lora_dropout < 1))
        return ca_error(CA_ERR_INVALID, "%s: \"lora_dropout\" is %g; a probability in [0, 1) is needed", what,
                        cfg->lora_dropout);
    if (cfg->bias && strcmp(cfg->bias, "none") != 0)
        return ca_error(CA_ERR_INVALID, "%s: \"bias\" is \"%s\"; only \"none\" is implemented", what, cfg->bias);
    bool list = cfg->n_target_modules > 0;
    if (list == (cfg->target_regex != NULL))
        return ca_error(CA_ERR_INVALID, "%s: \"target_modules\" needs exactly one of a list of names (%d given) "
                        "and a regular expression (%s)", what, cfg->n_target_modules,
                        cfg->target_regex ? "given" : "none");
    for (int i = 0; i < cfg->n_target_modules; i++)
        if (!cfg->target_modules || !cfg->target_modules[i] || !*cfg->target_modules[i])
            return ca_error(CA_ERR_INVALID, "%s: \"target_modules\" entry %d is empty", what, i);
    matcher mt;
    ca_status s = matcher_open(&mt, cfg, what);
    matcher_close(&mt);
    return s;
}

ca_status ca_lora_target_matches(const ca_lora_config *cfg, const char *name, bool *match) {
    if (!name || !match) return ca_error(CA_ERR_INVALID, "ca_lora_target_matches: name and match are required");
    ca_status s = ca_lora_config_check(cfg, "LoraConfig");
    matcher mt;
    if (s == CA_OK) s = matcher_open(&mt, cfg, "LoraConfig");
    if (s != CA_OK) return s;
    *match = matcher_test(&mt, name);
    matcher_close(&mt);
    return CA_OK;
}

/* ------------------------------------------------------------------ config copies */

static char *dup_or_null(const char *s, bool *ok) {
    if (!s) return NULL;
    char *d = strdup(s);
    if (!d) *ok = false;
    return d;
}

void ca_lora_config_free(ca_lora_config *c) {
    if (!c) return;
    for (int i = 0; c->target_modules && i < c->n_target_modules; i++) free((char *)c->target_modules[i]);
    free((void *)c->target_modules);
    free((char *)c->target_regex);
    free((char *)c->bias);
    free((char *)c->task_type);
    free((char *)c->base_model_name_or_path);
    memset(c, 0, sizeof *c);
}

ca_status ca_lora_config_copy(ca_lora_config *dst, const ca_lora_config *src) {
    *dst = *src;
    bool ok = true;
    dst->target_modules = NULL;
    dst->n_target_modules = 0;
    dst->target_regex = dup_or_null(src->target_regex, &ok);
    dst->bias = dup_or_null(src->bias ? src->bias : "none", &ok);
    dst->task_type = dup_or_null(src->task_type, &ok);
    dst->base_model_name_or_path = dup_or_null(src->base_model_name_or_path, &ok);
    if (ok && src->n_target_modules > 0) {
        char **names = calloc((size_t)src->n_target_modules, sizeof *names);
        dst->target_modules = (const char *const *)names;
        ok = names != NULL;
        for (int i = 0; ok && i < src->n_target_modules; i++, dst->n_target_modules++)
            ok = (names[i] = strdup(src->target_modules[i])) != NULL;
    }
    if (ok) return CA_OK;
    ca_lora_config_free(dst);
    return ca_error(CA_ERR_NOMEM, "out of host memory copying a LoraConfig");
}

/* ------------------------------------------------------------------ walking the model */

void ca_lora_named_free(ca_lora_named *list, int n) {
    for (int i = 0; list && i < n; i++) free(list[i].name);
    free(list);
}

typedef bool (*keep_fn)(ca_module *m, const char *name, const void *arg);

/* Appends every module under m (not m itself) that keep accepts, depth first, with full names.
 * The children of a wrapped layer (its lora_A and lora_B) are not visited. */
static bool walk(ca_module *m, const char *prefix, keep_fn keep, const void *arg, ca_lora_named **list, int *n) {
    if (ca_lora_layer_of(m)) return true;
    for (int i = 0; i < m->nchildren; i++) {
        size_t len = strlen(prefix) + strlen(m->child_names[i]) + 2;
        char *name = malloc(len);
        if (!name) return false;
        snprintf(name, len, "%s%s%s", prefix, *prefix ? "." : "", m->child_names[i]);
        ca_module *c = m->children[i];
        if (keep(c, name, arg)) {
            ca_lora_named *nl = realloc(*list, (size_t)(*n + 1) * sizeof *nl);
            if (!nl) { free(name); return false; }
            *list = nl;
            nl[(*n)++] = (ca_lora_named){strdup(name), c};
            if (!nl[*n - 1].name) { free(name); return false; }
        }
        bool ok = walk(c, name, keep, arg, list, n);
        free(name);
        if (!ok) return false;
    }
    return true;
}

static ca_status collect(ca_module *model, keep_fn keep, const void *arg, ca_lora_named **out, int *n) {
    *out = NULL;
    *n = 0;
    if (walk(model, "", keep, arg, out, n)) return CA_OK;
    ca_lora_named_free(*out, *n);
    *out = NULL;
    *n = 0;
    return ca_error(CA_ERR_NOMEM, "out of host memory listing the model's modules");
}

/* Wrapped layers are their own ctx owners: walk() stops at them, so they are tested before. */
static bool keep_wrapped(ca_module *m, const char *name, const void *arg) {
    (void)name;
    (void)arg;
    return ca_lora_layer_of(m) != NULL;
}

ca_status ca_lora_layers(ca_module *model, ca_lora_named **out, int *n) {
    if (!model) return ca_error(CA_ERR_INVALID, "LoRA: the model is NULL");
    return collect(model, keep_wrapped, NULL, out, n);
}

static bool keep_match(ca_module *m, const char *name, const void *arg) {
    (void)m;
    return matcher_test(arg, name);
}

bool ca_lora_layout(const ca_module *m, bool *fan_in_fan_out, int64_t *in, int64_t *out) {
    bool conv1d = strcmp(m->type, "Conv1D") == 0;
    if ((!conv1d && strcmp(m->type, "Linear") != 0) || m->nparams < 1 || m->params[0]->ndim != 2) return false;
    *fan_in_fan_out = conv1d;
    *in = m->params[0]->shape[conv1d ? 0 : 1];
    *out = m->params[0]->shape[conv1d ? 1 : 0];
    return true;
}

static ca_status check_target(const ca_lora_named *t) {
    bool fifo;
    int64_t in, out;
    if (ca_lora_layer_of(t->m))
        return ca_error(CA_ERR_INVALID, "LoRA: module '%s' already has an adapter", t->name);
    if (!ca_lora_layout(t->m, &fifo, &in, &out))
        return ca_error(CA_ERR_INVALID, "LoRA: target module '%s' is a %s; only Linear and Conv1D layers take an "
                        "adapter (as PEFT's lora.Linear)", t->name, t->m->type);
    return CA_OK;
}

static void targets_text(const ca_lora_config *cfg, char *buf, size_t len) {
    if (cfg->target_regex) {
        snprintf(buf, len, "'%s'", cfg->target_regex);
        return;
    }
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < cfg->n_target_modules && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s'%s'", i ? ", " : "[", cfg->target_modules[i]);
    if (used < len) snprintf(buf + used, len - used, "]");
}

ca_status ca_lora_targets(ca_module *model, const ca_lora_config *cfg, ca_lora_named **out, int *n) {
    *out = NULL;
    *n = 0;
    matcher mt;
    ca_status s = matcher_open(&mt, cfg, "LoraConfig");
    if (s == CA_OK) s = collect(model, keep_match, &mt, out, n);
    matcher_close(&mt);
    for (int i = 0; s == CA_OK && i < *n; i++) s = check_target(&(*out)[i]);
    if (s == CA_OK && *n == 0) {
        char t[512];
        targets_text(cfg, t, sizeof t);
        s = ca_error(CA_ERR_INVALID, "LoRA: target_modules %s match no module of the model", t);
    }
    if (s != CA_OK) {
        ca_lora_named_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return s;
}

/* ------------------------------------------------------------------ the layer */

static void layer_free(void *p) {
    ca_lora_layer *l = p;
    if (!l) return;
    if (l->base_ctx_free && l->base_ctx) l->base_ctx_free(l->base_ctx);
    ca_lora_config_free(&l->cfg);
    free(l->base_type);
    free(l);
}

ca_lora_layer *ca_lora_layer_of(const ca_module *m) {
    return m && m->ctx_free == layer_free ? m->ctx : NULL;
}

/* PEFT's lora.Linear.forward: result = base(x) + lora_B(lora_A(dropout(x))) * scaling. Under tensor
 * parallelism the base is a split Linear's forward, lora_B holds the output rows of a colwise base and
 * lora_A the input columns of a rowwise one, and tp_mix joins the ranks' r-wide products (under sequence
 * parallelism along the sequence: a colwise base's x is this rank's tokens, a rowwise base's output). */
static ca_tensor *lora_forward(ca_module *self, ca_tensor *x, void *ctx) {
    ca_lora_layer *l = ctx;
    ca_tensor *y = l->base_forward(self, x, l->base_ctx);
    if (!y || l->merged) return y;
    ca_tensor *wa = l->a->params[0], *wb = l->b->params[0];
    bool tokens = l->tp_whole && !l->tp_whole_b;   /* x: this rank's tokens, dropping their part of the mask */
    if (l->tp_whole) *(l->tp_whole_b ? &wb : &wa) = l->tp_whole(l->tp_whole_b ? wb : wa, l->tp_ctx);
    ca_tensor *h = tokens ? ca_tp_sequence_dropout(self, x, l->cfg.lora_dropout, self->training)
                          : ca_dropout(x, l->cfg.lora_dropout, self->training);
    h = ca_linear(h, wa, NULL);
    if (l->tp_mix) h = l->tp_mix(h, l->tp_ctx);   /* a split base: lora_A's product over the tp ranks */
    h = ca_linear(h, wb, NULL);
    return ca_add(y, ca_mul_scalar(h, l->scaling));
}

static void invalidate_up(ca_module *m) {
    for (; m; m = m->parent) m->flat_valid = false;
}

/* Removes (and frees) the child `c` of m. */
static void drop_child(ca_module *m, ca_module *c) {
    for (int i = 0; i < m->nchildren; i++)
        if (m->children[i] == c) {
            ca_module_destroy(c);
            free(m->child_names[i]);
            memmove(m->children + i, m->children + i + 1, (size_t)(m->nchildren - i - 1) * sizeof *m->children);
            memmove(m->child_names + i, m->child_names + i + 1, (size_t)(m->nchildren - i - 1) * sizeof *m->child_names);
            m->nchildren--;
            break;
        }
    invalidate_up(m);
}

/* The layer as it was before wrap(): its forward, ctx and type back, lora_A and lora_B freed. */
static void unwrap(ca_module *m) {
    ca_lora_layer *l = ca_lora_layer_of(m);
    if (!l) return;
    if (l->a) drop_child(m, l->a);
    if (l->b) drop_child(m, l->b);
    m->forward = l->base_forward;
    m->ctx = l->base_ctx;
    m->ctx_free = l->base_ctx_free;
    l->base_ctx_free = NULL;
    free(m->type);
    m->type = l->base_type;
    l->base_type = NULL;
    layer_free(l);
}

/* lora_A keeps Linear's kaiming_uniform_(a=sqrt(5)) (PEFT's init of A); PEFT zeroes B. */
static ca_status make_adapters(ca_module *m, ca_lora_layer *l) {
    ca_module *a = NULL, *b = NULL;
    ca_status s = ca_linear_create(l->in, l->cfg.r, false, &a);
    if (s == CA_OK) s = ca_linear_create(l->cfg.r, l->out, false, &b);
    ca_tensor *bw = b ? b->params[0] : NULL;
    if (s == CA_OK && l->cfg.init_lora_weights)
        s = ca_tensor_init_fill_(bw, 0, bw->numel, 0.0);
    ca_device *dev = ca_tensor_device(m->params[0]);
    if (s == CA_OK) s = ca_module_to(a, dev);
    if (s == CA_OK) s = ca_module_to(b, dev);
    if (s != CA_OK) {
        ca_module_destroy(a);
        ca_module_destroy(b);
        return s;
    }
    s = ca_module_add(m, "lora_A", a);          /* takes a, also on failure */
    if (s == CA_OK) l->a = a;
    s = s == CA_OK ? ca_module_add(m, "lora_B", b) : (ca_module_destroy(b), s);
    if (s == CA_OK) l->b = b;
    return s;
}

static ca_status wrap(const ca_lora_named *t, const ca_lora_config *cfg) {
    ca_module *m = t->m;
    ca_lora_layer *l = calloc(1, sizeof *l);
    char *type = strdup(LORA_TYPE);
    if (!l || !type) {
        free(l);
        free(type);
        return ca_error(CA_ERR_NOMEM, "out of host memory wrapping '%s'", t->name);
    }
    ca_status s = ca_lora_config_copy(&l->cfg, cfg);
    if (s != CA_OK) {
        free(l);
        free(type);
        return s;
    }
    ca_lora_layout(m, &l->fan_in_fan_out, &l->in, &l->out);
    if (l->fan_in_fan_out != cfg->fan_in_fan_out)     /* PEFT warns and follows the layer */
        CA_LOG_W("LoRA: fan_in_fan_out is %s but '%s' is a %s; using %s", cfg->fan_in_fan_out ? "true" : "false",
                 t->name, m->type, l->fan_in_fan_out ? "true" : "false");
    l->cfg.fan_in_fan_out = l->fan_in_fan_out;
    l->scaling = ca_lora_scaling(cfg);
    l->base_forward = m->forward;
    l->base_ctx = m->ctx;
    l->base_ctx_free = m->ctx_free;
    l->base_type = m->type;
    m->type = type;
    m->forward = lora_forward;
    m->ctx = l;
    m->ctx_free = layer_free;
    s = make_adapters(m, l);
    if (s != CA_OK) {
        unwrap(m);
        ca_error_context("adding the adapter of '%s'", t->name);
    }
    return s;
}

/* PEFT's mark_only_lora_as_trainable (bias "none"): only parameters named "lora_" train. */
static void freeze_base(ca_module *model) {
    int n = ca_module_num_params(model);
    for (int i = 0; i < n; i++)
        if (!strstr(ca_module_param_name(model, i), "lora_"))
            ca_tensor_set_requires_grad(ca_module_param_at(model, i), false);
}

ca_status ca_lora_apply(ca_module *model, const ca_lora_config *cfg, int *n_wrapped) {
    if (n_wrapped) *n_wrapped = 0;
    if (!model) return ca_error(CA_ERR_INVALID, "ca_lora_apply: the model is NULL");
    ca_status s = ca_lora_config_check(cfg, "LoraConfig");
    ca_lora_named *t = NULL;
    int n = 0, done = 0;
    if (s == CA_OK) s = ca_lora_targets(model, cfg, &t, &n);
    for (; s == CA_OK && done < n; done++) s = wrap(&t[done], cfg);
    if (s != CA_OK)    /* all or nothing */
        for (int i = 0; i < done; i++) unwrap(t[i].m);
    ca_lora_named_free(t, n);
    if (s != CA_OK) return s;
    freeze_base(model);
    if (n_wrapped) *n_wrapped = n;
    return CA_OK;
}

/* ------------------------------------------------------------------ merge */

/* W += sign * scaling * (B A), transposed for fan_in_fan_out (PEFT's get_delta_weight). */
static ca_status add_delta(ca_module *m, ca_lora_layer *l, double sign) {
    ca_tensor *w = m->params[0];
    ca_status s = CA_OK;
    CA_NO_GRAD {
        ca_scope *sc = ca_scope_begin();
        ca_tensor *d = ca_matmul(l->b->params[0], l->a->params[0]);
        if (l->fan_in_fan_out) d = ca_contiguous(ca_transpose(d, 0, 1));
        if (d && d->dtype != w->dtype) d = ca_cast(d, w->dtype);
        ca_tensor *nw = ca_add(w, ca_mul_scalar(d, sign * l->scaling));
        s = nw ? ca_tensor_copy_(w, nw) : ca_last_status();
        ca_scope_end(sc);
    }
    return s;
}

static ca_status set_merged(ca_module *model, bool merge, bool unload) {
    ca_lora_named *t;
    int n;
    ca_status s = ca_lora_layers(model, &t, &n);
    if (s == CA_OK && n == 0) s = ca_error(CA_ERR_INVALID, "LoRA: the model has no adapters to %s", merge ? "merge" : "unmerge");
    for (int i = 0; s == CA_OK && i < n; i++) {
        ca_lora_layer *l = ca_lora_layer_of(t[i].m);
        if (l->merged == merge) continue;
        s = add_delta(t[i].m, l, merge ? 1.0 : -1.0);
        if (s == CA_OK) l->merged = merge;
        else ca_error_context("%s the adapter of '%s'", merge ? "merging" : "unmerging", t[i].name);
    }
    for (int i = 0; s == CA_OK && unload && i < n; i++) unwrap(t[i].m);
    ca_lora_named_free(t, n);
    return s;
}

ca_status ca_lora_merge(ca_module *model) { return set_merged(model, true, false); }
ca_status ca_lora_unmerge(ca_module *model) { return set_merged(model, false, false); }
ca_status ca_lora_merge_and_unload(ca_module *model) { return set_merged(model, true, true); }
