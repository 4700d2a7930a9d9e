/* Modules: the tree of children and named parameters, forward dispatch, training mode, device moves. */
#include "nn/nn_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ca_status ca_module_create(const char *type, ca_forward_fn fn, void *ctx, void (*ctx_free)(void *),
                           ca_module **out) {
    if (!out) {
        if (ctx_free && ctx) ctx_free(ctx);
        return ca_error(CA_ERR_INVALID, "ca_module_create: out is NULL");
    }
    *out = NULL;
    ca_module *m = calloc(1, sizeof *m);
    if (m) m->type = strdup(type ? type : "Module");
    if (!m || !m->type) {
        free(m);
        if (ctx_free && ctx) ctx_free(ctx);
        return ca_error(CA_ERR_NOMEM, "out of host memory creating a module");
    }
    m->forward = fn;
    m->ctx = ctx;
    m->ctx_free = ctx_free;
    m->training = true;
    *out = m;
    return CA_OK;
}

static void invalidate(ca_module *m) {
    for (; m; m = m->parent) m->flat_valid = false;
}

static bool valid_name(const char *name) {
    if (!name || !*name) return false;
    for (const char *p = name; *p; p++)
        if (*p == '.') return false;
    return true;
}

ca_status ca_module_add(ca_module *parent, const char *name, ca_module *child) {
    if (!parent || !child) {
        ca_module_destroy(child);
        return ca_error(CA_ERR_INVALID, "ca_module_add: parent and child are required");
    }
    char idx[32];
    if (!name) {
        snprintf(idx, sizeof idx, "%d", parent->nchildren);
        name = idx;
    }
    if (!valid_name(name)) {
        ca_module_destroy(child);
        return ca_error(CA_ERR_INVALID, "module name '%s' is empty or contains '.'", name);
    }
    for (int i = 0; i < parent->nchildren; i++)
        if (strcmp(parent->child_names[i], name) == 0) {
            ca_module_destroy(child);
            return ca_error(CA_ERR_INVALID, "a child named '%s' already exists in this %s", name, parent->type);
        }
    char **nn = realloc(parent->child_names, (size_t)(parent->nchildren + 1) * sizeof *nn);
    if (nn) parent->child_names = nn;
    ca_module **nc = nn ? realloc(parent->children, (size_t)(parent->nchildren + 1) * sizeof *nc) : NULL;
    if (nc) parent->children = nc;
    char *copy = nc ? strdup(name) : NULL;
    if (!copy) {
        ca_module_destroy(child);
        return ca_error(CA_ERR_NOMEM, "out of host memory");
    }
    parent->child_names[parent->nchildren] = copy;
    parent->children[parent->nchildren++] = child;
    child->parent = parent;
    invalidate(parent);
    return CA_OK;
}

ca_status ca_module_add_param(ca_module *m, const char *name, ca_tensor *param) {
    if (!m || !param || !valid_name(name)) {
        ca_tensor_free(param);
        return ca_error(CA_ERR_INVALID, "ca_module_add_param: bad module, tensor or name '%s'", name ? name : "");
    }
    if (!param->persistent) ca_tensor_keep(param);
    char **nn = realloc(m->param_names, (size_t)(m->nparams + 1) * sizeof *nn);
    if (nn) m->param_names = nn;
    ca_tensor **np = nn ? realloc(m->params, (size_t)(m->nparams + 1) * sizeof *np) : NULL;
    if (np) m->params = np;
    char *copy = np ? strdup(name) : NULL;
    if (!copy) {
        ca_tensor_free(param);
        return ca_error(CA_ERR_NOMEM, "out of host memory");
    }
    m->param_names[m->nparams] = copy;
    m->params[m->nparams++] = param;
    param->requires_grad = true;
    invalidate(m);
    return CA_OK;
}

static ca_status checkpointed_forward(void *ctx, int n_in, ca_tensor *const *in, int n_out, ca_tensor **out) {
    (void)n_in;
    (void)n_out;
    ca_module *m = ctx;
    out[0] = m->forward(m, in[0], m->ctx);
    return out[0] ? CA_OK : ca_last_status();
}

static ca_tensor *run_forward(ca_module *m, ca_tensor *x) {
    if (!m->checkpoint || !ca_grad_enabled()) return m->forward(m, x, m->ctx);
    ca_tensor *y = NULL;
    if (ca_checkpoint(checkpointed_forward, m, 1, &x, 1, &y) != CA_OK) {
        ca_error_context("checkpointed forward of %s", m->type);
        return NULL;
    }
    return y;
}

static int first_meta(ca_module *m) {
    int n = ca_module_num_params(m);
    for (int i = 0; i < n; i++)
        if (ca_tensor_is_meta(m->flat[i])) return i;
    return -1;
}

/* A forward of a model built under ca_init_empty_weights, before ca_prepare gave it its values. */
static ca_status meta_refused(ca_module *m) {
    int i = first_meta(m);
    if (i < 0) return CA_OK;
    return ca_error(CA_ERR_STATE, "forward of %s: parameter %s has no storage (built under ca_init_empty_weights, "
                    "the meta device); ca_prepare or ca_module_materialize gives it its values first", m->type,
                    m->flat_names[i]);
}

ca_tensor *ca_module_forward(ca_module *m, ca_tensor *x) {
    if (!m) {
        ca_error(CA_ERR_INVALID, "forward of a NULL module");
        return NULL;
    }
    if (!x) return NULL;
    if (!m->forward) {
        ca_error(CA_ERR_INVALID, "module %s has no forward function", m->type);
        return NULL;
    }
    if (ca_meta_live() && meta_refused(m) != CA_OK) return NULL;
    /* a prepared model's forward runs under the accelerator's autocast */
    if (m->pre_forward && m->pre_forward(m->hook_ctx, m) != CA_OK) {
        ca_error_context("gathering the parameters of %s", m->type);
        return NULL;
    }
    ca_dtype old = m->autocast ? ca_autocast_set(m->autocast) : CA_F32;
    ca_tape_private_begin();   /* the forward's locals: backward frees them after use */
    bool no_grad = !ca_grad_enabled();
    ca_locals_mark mark = no_grad ? ca_forward_locals_mark() : (ca_locals_mark){0};
    ca_tensor *y = run_forward(m, x);
    /* under no_grad nothing reads them again: torch's reference counts free them here too */
    if (no_grad && y) ca_forward_locals_free(mark, y);
    if (m->autocast) ca_autocast_set(old);
    if (m->post_forward) y = m->post_forward(m->hook_ctx, m, y);
    ca_tape_private_end(y);
    if (!y && ca_last_status() == CA_OK) ca_error(CA_ERR_INTERNAL, "forward of %s returned NULL without an error", m->type);
    return y;
}

/* ------------------------------------------------------------------ parameters */

static void free_flat(ca_module *m) {
    for (int i = 0; i < m->nflat; i++) free(m->flat_names[i]);
    free(m->flat_names);
    free(m->flat);
    m->flat = NULL;
    m->flat_names = NULL;
    m->nflat = 0;
}

static bool collect(ca_module *m, const char *prefix, ca_module *root) {
    for (int i = 0; i < m->nparams; i++) {
        size_t len = strlen(prefix) + strlen(m->param_names[i]) + 2;
        char *name = malloc(len);
        ca_tensor **nf = realloc(root->flat, (size_t)(root->nflat + 1) * sizeof *nf);
        if (nf) root->flat = nf;
        char **nn = nf ? realloc(root->flat_names, (size_t)(root->nflat + 1) * sizeof *nn) : NULL;
        if (nn) root->flat_names = nn;
        if (!name || !nn) { free(name); return false; }
        snprintf(name, len, "%s%s%s", prefix, *prefix ? "." : "", m->param_names[i]);
        /* a meta parameter's refusals name it (ca_tensor_check_present): by its longest name, the
         * one from the outermost module listed */
        if (ca_tensor_is_meta(m->params[i]) && strlen(name) > strlen(ca_tensor_name(m->params[i])) &&
            ca_tensor_set_name(m->params[i], name) != CA_OK)
            ca_clear_error();
        root->flat[root->nflat] = m->params[i];
        root->flat_names[root->nflat++] = name;
    }
    for (int i = 0; i < m->nchildren; i++) {
        size_t len = strlen(prefix) + strlen(m->child_names[i]) + 2;
        char *p = malloc(len);
        if (!p) return false;
        snprintf(p, len, "%s%s%s", prefix, *prefix ? "." : "", m->child_names[i]);
        bool ok = collect(m->children[i], p, root);
        free(p);
        if (!ok) return false;
    }
    return true;
}

static bool ensure_flat(ca_module *m) {
    if (m->flat_valid) return true;
    free_flat(m);
    if (!collect(m, "", m)) {
        free_flat(m);
        ca_error(CA_ERR_NOMEM, "out of host memory listing parameters");
        return false;
    }
    m->flat_valid = true;
    return true;
}

int ca_module_num_params(ca_module *m) { return m && ensure_flat(m) ? m->nflat : 0; }

ca_tensor *ca_module_param_at(ca_module *m, int i) {
    return m && ensure_flat(m) && i >= 0 && i < m->nflat ? m->flat[i] : NULL;
}

const char *ca_module_param_name(ca_module *m, int i) {
    return m && ensure_flat(m) && i >= 0 && i < m->nflat ? m->flat_names[i] : NULL;
}

ca_tensor *ca_module_param(ca_module *m, const char *name) {
    int n = ca_module_num_params(m);
    for (int i = 0; i < n; i++)
        if (strcmp(m->flat_names[i], name) == 0) return m->flat[i];
    return NULL;
}

int64_t ca_module_param_count(ca_module *m) {
    int64_t total = 0;
    int n = ca_module_num_params(m);
    for (int i = 0; i < n; i++) total += m->flat[i]->numel;
    return total;
}

ca_module *ca_module_child(ca_module *m, const char *path) {
    while (m && path && *path) {
        const char *dot = strchr(path, '.');
        size_t len = dot ? (size_t)(dot - path) : strlen(path);
        ca_module *next = NULL;
        for (int i = 0; i < m->nchildren; i++)
            if (strlen(m->child_names[i]) == len && strncmp(m->child_names[i], path, len) == 0) next = m->children[i];
        m = next;
        path = dot ? dot + 1 : NULL;
    }
    return m;
}

const char *ca_module_type(const ca_module *m) { return m ? m->type : ""; }

void ca_module_train(ca_module *m, bool training) {
    if (!m) return;
    m->training = training;
    for (int i = 0; i < m->nchildren; i++) ca_module_train(m->children[i], training);
}

bool ca_module_is_training(const ca_module *m) { return m && m->training; }

ca_status ca_module_set_checkpointing(ca_module *m, bool on) {
    if (!m) return ca_error(CA_ERR_INVALID, "ca_module_set_checkpointing: module is NULL");
    m->checkpoint = on;
    return CA_OK;
}

bool ca_module_checkpointing(const ca_module *m) { return m && m->checkpoint; }

/* Children of one type, at least two, each with parameters: a stack of layers. */
static bool is_layer_stack(ca_module *m) {
    if (m->nchildren < 2) return false;
    for (int i = 0; i < m->nchildren; i++)
        if (strcmp(m->children[i]->type, m->children[0]->type) != 0 || ca_module_num_params(m->children[i]) == 0)
            return false;
    return true;
}

static int mark_layers(ca_module *m, bool on) {
    if (is_layer_stack(m)) {
        for (int i = 0; i < m->nchildren; i++) m->children[i]->checkpoint = on;
        return m->nchildren;
    }
    int n = 0;
    for (int i = 0; i < m->nchildren; i++) n += mark_layers(m->children[i], on);
    return n;
}

ca_status ca_module_checkpoint_layers(ca_module *m, bool on, int *marked) {
    if (!m) return ca_error(CA_ERR_INVALID, "ca_module_checkpoint_layers: module is NULL");
    int n = mark_layers(m, on);
    if (n == 0)
        for (int i = 0; i < m->nchildren; i++)
            if (ca_module_num_params(m->children[i]) > 0) {
                m->children[i]->checkpoint = on;
                n++;
            }
    if (marked) *marked = n;
    return CA_OK;
}

ca_status ca_module_to(ca_module *m, ca_device *dev) {
    int n = ca_module_num_params(m);
    for (int i = 0; i < n; i++) {
        ca_status s = ca_tensor_move_(m->flat[i], dev);
        if (s != CA_OK) return ca_error_context("moving parameter %s", m->flat_names[i]);
    }
    return CA_OK;
}

bool ca_module_is_meta(ca_module *m) { return m && first_meta(m) >= 0; }

ca_status ca_module_materialize(ca_module *m) {
    if (!m) return ca_error(CA_ERR_INVALID, "ca_module_materialize: module is NULL");
    int n = ca_module_num_params(m);
    for (int i = 0; i < n; i++)
        if (ca_tensor_materialize_(m->flat[i]) != CA_OK)
            return ca_error_context("materialising parameter %s", m->flat_names[i]);
    return CA_OK;
}

void ca_module_zero_grad(ca_module *m) {
    int n = ca_module_num_params(m);
    for (int i = 0; i < n; i++) ca_tensor_zero_grad(m->flat[i]);
}

/* torch's Module.requires_grad_: a frozen parameter keeps no gradient either (its old one would
 * otherwise be stepped again by an optimizer that sees it defined). */
ca_status ca_module_requires_grad(ca_module *m, bool on) {
    if (!m) return ca_error(CA_ERR_INVALID, "requires_grad: module is NULL");
    int n = ca_module_num_params(m);
    for (int i = 0; i < n; i++) {
        ca_tensor_set_requires_grad(m->flat[i], on);
        if (!on) ca_tensor_zero_grad(m->flat[i]);
    }
    return CA_OK;
}

void ca_module_get_nb_trainable_parameters(ca_module *m, int64_t *trainable, int64_t *all) {
    int64_t t = 0, a = 0;
    int n = m ? ca_module_num_params(m) : 0;
    for (int i = 0; i < n; i++) {
        a += m->flat[i]->numel;
        if (m->flat[i]->requires_grad) t += m->flat[i]->numel;
    }
    if (trainable) *trainable = t;
    if (all) *all = a;
}

int64_t ca_module_num_trainable_params(ca_module *m) {
    int64_t t;
    ca_module_get_nb_trainable_parameters(m, &t, NULL);
    return t;
}

int64_t ca_module_trainable_bytes(ca_module *m) {
    int64_t b = 0;
    int n = m ? ca_module_num_params(m) : 0;
    for (int i = 0; i < n; i++)
        if (m->flat[i]->requires_grad) b += m->flat[i]->numel * (int64_t)ca_dtype_size(m->flat[i]->dtype);
    return b;
}

/* v with a comma every three digits, as Python's "{:,d}". */
static void with_commas(int64_t v, char *out, size_t size) {
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%lld", (long long)v), k = 0;
    for (int i = 0; i < n && (size_t)k + 2 < size; i++) {
        if (i && digits[i - 1] != '-' && (n - i) % 3 == 0) out[k++] = ',';
        out[k++] = digits[i];
    }
    out[k] = 0;
}

void ca_module_trainable_summary(ca_module *m, char *buf, size_t size) {
    if (!buf || !size) return;
    int64_t t, a;
    ca_module_get_nb_trainable_parameters(m, &t, &a);
    char ts[40], as[40];
    with_commas(t, ts, sizeof ts);
    with_commas(a, as, sizeof as);
    snprintf(buf, size, "trainable params: %s || all params: %s || trainable%%: %.4f", ts, as,
             a ? 100.0 * (double)t / (double)a : 0.0);
}

void ca_module_print_trainable_parameters(ca_module *m) {
    char buf[160];
    ca_module_trainable_summary(m, buf, sizeof buf);
    printf("%s\n", buf);
}

void ca_module_set_owner(ca_module *m, const ca_module_owner *owner) {
    int n = ca_module_num_params(m);
    if (!owner) {
        m->owner = NULL;
        m->owner_forget = NULL;
        m->autocast = CA_F32;
        for (int i = 0; i < n; i++) ca_tensor_set_grad_hook(m->flat[i], NULL, NULL);
        return;
    }
    m->owner = owner->owner;
    m->owner_forget = owner->forget;
    m->autocast = owner->autocast;
    for (int i = 0; i < n; i++) m->flat[i]->version++;   /* copies cast under another autocast are stale */
}

void ca_module_set_forward_hooks(ca_module *m, ca_status (*pre)(void *ctx, ca_module *m),
                                 ca_tensor *(*post)(void *ctx, ca_module *m, ca_tensor *y), void *ctx) {
    m->pre_forward = pre;
    m->post_forward = post;
    m->hook_ctx = ctx;
}

/* ------------------------------------------------------------------ tensor-parallel plan */

ca_status ca_tp_plan_fused(ca_module *m, const char *pattern, const char *style, int parts) {
    if (!m || !pattern || !pattern[0] || !style || parts < 1)
        return ca_error(CA_ERR_INVALID, "ca_tp_plan: a module, a name pattern, a style and parts >= 1 are required");
    ca_tp_style st = !strcmp(style, "colwise") ? CA_TP_COLWISE : !strcmp(style, "rowwise") ? CA_TP_ROWWISE
                     : !strcmp(style, "colwise_gather_output") ? CA_TP_COLWISE_GATHER
                     : !strcmp(style, "sequence_parallel") ? CA_TP_SEQUENCE : 0;
    if (!st)
        return ca_error(CA_ERR_UNSUPPORTED, "ca_tp_plan: style \"%s\" for \"%s\" is not supported yet (caccel splits "
                        "Linear layers \"colwise\", \"colwise_gather_output\" and \"rowwise\", Embedding layers \"rowwise\", "
                        "norms \"sequence_parallel\"; Hugging Face's colwise_rep, local_colwise, local_rowwise, gather "
                        "and replicate are not implemented)", style, pattern);
    char **np = realloc(m->tp_pattern, (size_t)(m->ntp + 1) * sizeof *np);
    if (np) m->tp_pattern = np;
    ca_tp_style *ns = np ? realloc(m->tp_style, (size_t)(m->ntp + 1) * sizeof *ns) : NULL;
    if (ns) m->tp_style = ns;
    int *pp = ns ? realloc(m->tp_parts, (size_t)(m->ntp + 1) * sizeof *pp) : NULL;
    if (pp) m->tp_parts = pp;
    char *copy = pp ? strdup(pattern) : NULL;
    if (!copy) return ca_error(CA_ERR_NOMEM, "out of host memory");
    m->tp_pattern[m->ntp] = copy;
    m->tp_parts[m->ntp] = parts;
    m->tp_style[m->ntp++] = st;
    return CA_OK;
}

ca_status ca_tp_plan(ca_module *m, const char *pattern, const char *style) {
    return ca_tp_plan_fused(m, pattern, style, 1);
}

/* Whether dotted name matches pattern, "*" standing for one whole component. */
static bool tp_name_match(const char *pat, const char *name) {
    while (*pat && *name) {
        size_t pl = strcspn(pat, "."), nl = strcspn(name, ".");
        if (!(pl == 1 && pat[0] == '*') && (pl != nl || strncmp(pat, name, pl) != 0)) return false;
        pat += pl;
        name += nl;
        if (*pat != *name) return false;   /* one ends where the other goes on */
        if (*pat) pat++, name++;
    }
    return !*pat && !*name;
}

int ca_tp_plan_match(const ca_module *m, const char *name, int *parts) {
    for (int i = 0; m && name && i < m->ntp; i++)
        if (tp_name_match(m->tp_pattern[i], name)) {
            if (parts) *parts = m->tp_parts[i];
            return (int)m->tp_style[i];
        }
    return 0;
}

ca_status ca_tp_heads(ca_module *proj, int64_t local_heads, int64_t *head0, int64_t *heads) {
    if (!proj || !head0 || !heads || local_heads < 1)
        return ca_error(CA_ERR_INVALID, "ca_tp_heads: a module, a head count above 0 and two outputs are required");
    bool split = proj->tp_size > 1;   /* set by the accelerator while the split forward runs */
    *head0 = split ? proj->tp_rank * local_heads : 0;
    *heads = split ? proj->tp_size * local_heads : local_heads;
    return CA_OK;
}

void ca_module_destroy(ca_module *m) {
    if (!m) return;
    if (m->owner && m->owner_forget) m->owner_forget(m->owner, m);
    for (int i = 0; i < m->nchildren; i++) {
        ca_module_destroy(m->children[i]);
        free(m->child_names[i]);
    }
    for (int i = 0; i < m->nparams; i++) {
        ca_tensor_free(m->params[i]);
        free(m->param_names[i]);
    }
    free_flat(m);
    for (int i = 0; i < m->ntp; i++) free(m->tp_pattern[i]);
    free(m->tp_pattern);
    free(m->tp_style);
    free(m->tp_parts);
    if (m->ctx_free && m->ctx) m->ctx_free(m->ctx);
    free(m->children);
    free(m->child_names);
    free(m->params);
    free(m->param_names);
    free(m->type);
    free(m);
}

static void print_tree(ca_module *m, const char *name, int depth) {
    fprintf(stderr, "%*s%s%s%s", depth * 2, "", name ? name : "", name ? ": " : "", m->type);
    for (int i = 0; i < m->nparams; i++) {
        char sh[128];
        fprintf(stderr, "%s%s %s", i ? ", " : " (", m->param_names[i],
                ca_shape_str(m->params[i]->ndim, m->params[i]->shape, sh, sizeof sh));
    }
    fprintf(stderr, "%s\n", m->nparams ? ")" : "");
    for (int i = 0; i < m->nchildren; i++) print_tree(m->children[i], m->child_names[i], depth + 1);
}

void ca_module_print(ca_module *m) {
    if (!m) return;
    print_tree(m, NULL, 0);
    fprintf(stderr, "%lld parameters\n", (long long)ca_module_param_count(m));
}

/* Sequence parallelism's split and gather (include/caccel/nn.h): through the ops the accelerator installed
 * on a module its plan split (accelerator/tp_seq.c); x itself for any other module. */
static const ca_module_seq *seq_ops(const ca_module *m, const char *fn) {
    if (!m) ca_error(CA_ERR_INVALID, "%s: a module is required", fn);
    return m ? m->tp_seq : NULL;
}

ca_tensor *ca_tp_sequence_split(ca_module *m, ca_tensor *x) {
    if (!x) return NULL;
    const ca_module_seq *sq = seq_ops(m, "ca_tp_sequence_split");
    return sq ? sq->split(sq->ctx, x) : m ? x : NULL;
}

ca_tensor *ca_tp_sequence_gather(ca_module *m, ca_tensor *x) {
    if (!x) return NULL;
    const ca_module_seq *sq = seq_ops(m, "ca_tp_sequence_gather");
    return sq ? sq->gather(sq->ctx, x) : m ? x : NULL;
}

/* This rank's tokens' part of the mask of the whole [B, T, ...] (local: no communication). */
ca_tensor *ca_tp_sequence_dropout(ca_module *m, ca_tensor *x, double p, bool training) {
    if (!x) return NULL;
    const ca_module_seq *sq = seq_ops(m, "ca_tp_sequence_dropout");
    if (!sq) return m ? ca_dropout(x, p, training) : NULL;
    if (x->ndim < 2) {
        ca_error(CA_ERR_INVALID, "ca_tp_sequence_dropout: x of %d dimensions; this rank's tokens [B, T/tp, ...] are "
                 "needed", x->ndim);
        return NULL;
    }
    int64_t t = x->shape[1];
    return ca_dropout_part(x, p, training, 1, sq->rank * t, sq->size * t);
}
