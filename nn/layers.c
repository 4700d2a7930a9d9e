/* Built-in layers (Linear, Embedding, LayerNorm, RMSNorm, activations, Dropout, Flatten, Sequential) with PyTorch's default initialisation. */
#include "nn/nn_impl.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Fills a parameter from the process generator in place (records the draw on a meta parameter). */
static ca_status init_param(ca_tensor *t, ca_rng_kind kind, float a, float b) {
    return kind == CA_RNG_NORMAL ? ca_tensor_init_normal_(t, a, b) : ca_tensor_init_uniform_(t, a, b);
}

static ca_status new_param(ca_module *m, const char *name, int ndim, const int64_t *shape, ca_tensor **out) {
    ca_device *cpu = ca_cpu_device();
    if (!cpu) return ca_last_status();
    ca_tensor *t;
    ca_status s = ca_parameter_create(cpu, CA_F32, ndim, shape, &t);
    if (s != CA_OK) return s;
    s = ca_module_add_param(m, name, t);
    if (s == CA_OK) *out = t;
    return s;
}

static ca_status finish(ca_module *m, ca_status s, ca_module **out) {
    if (s != CA_OK) {
        ca_module_destroy(m);
        return s;
    }
    *out = m;
    return CA_OK;
}

/* ------------------------------------------------------------------ Linear */

static ca_tensor *linear_forward(ca_module *self, ca_tensor *x, void *ctx) {
    return ca_linear(x, self->params[0], self->nparams > 1 ? self->params[1] : NULL);
}

ca_status ca_linear_create(int64_t in, int64_t out_features, bool bias, ca_module **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_linear_create: out is NULL");
    *out = NULL;
    if (in <= 0 || out_features <= 0)
        return ca_error(CA_ERR_INVALID, "Linear(%lld, %lld): sizes must be positive", (long long)in,
                        (long long)out_features);
    ca_module *m;
    ca_status s = ca_module_create("Linear", linear_forward, NULL, NULL, &m);
    if (s != CA_OK) return s;
    /* torch: kaiming_uniform_(a=sqrt(5)) gives U(-1/sqrt(in), 1/sqrt(in)); bias the same bound */
    float bound = 1.0f / sqrtf((float)in);
    ca_tensor *w, *b;
    s = new_param(m, "weight", 2, (int64_t[]){out_features, in}, &w);
    if (s == CA_OK) s = init_param(w, CA_RNG_UNIFORM, -bound, bound);
    if (s == CA_OK && bias) s = new_param(m, "bias", 1, &out_features, &b);
    if (s == CA_OK && bias) s = init_param(b, CA_RNG_UNIFORM, -bound, bound);
    return finish(m, s, out);
}

/* ------------------------------------------------------------------ Embedding */

static ca_tensor *embedding_forward(ca_module *self, ca_tensor *x, void *ctx) {
    return ca_embedding(x, self->params[0]);
}

ca_status ca_embedding_create(int64_t num, int64_t dim, ca_module **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_embedding_create: out is NULL");
    *out = NULL;
    if (num <= 0 || dim <= 0)
        return ca_error(CA_ERR_INVALID, "Embedding(%lld, %lld): sizes must be positive", (long long)num, (long long)dim);
    ca_module *m;
    ca_status s = ca_module_create("Embedding", embedding_forward, NULL, NULL, &m);
    if (s != CA_OK) return s;
    ca_tensor *w;
    s = new_param(m, "weight", 2, (int64_t[]){num, dim}, &w);
    if (s == CA_OK) s = init_param(w, CA_RNG_NORMAL, 0.0f, 1.0f);     /* torch: N(0, 1) */
    return finish(m, s, out);
}

/* ------------------------------------------------------------------ LayerNorm */

static ca_tensor *layer_norm_forward(ca_module *self, ca_tensor *x, void *ctx) {
    return ca_layer_norm(x, self->params[0], self->params[1], self->p);
}

ca_status ca_layer_norm_create(int64_t dim, double eps, ca_module **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_layer_norm_create: out is NULL");
    *out = NULL;
    if (dim <= 0) return ca_error(CA_ERR_INVALID, "LayerNorm(%lld): size must be positive", (long long)dim);
    ca_module *m;
    ca_status s = ca_module_create("LayerNorm", layer_norm_forward, NULL, NULL, &m);
    if (s != CA_OK) return s;
    m->p = eps > 0 ? eps : 1e-5;
    ca_tensor *w, *b;
    s = new_param(m, "weight", 1, &dim, &w);
    if (s == CA_OK) s = ca_tensor_init_fill_(w, 0, dim, 1.0);
    if (s == CA_OK) s = new_param(m, "bias", 1, &dim, &b);
    if (s == CA_OK) s = ca_tensor_init_fill_(b, 0, dim, 0.0);
    return finish(m, s, out);
}

/* ------------------------------------------------------------------ parameter-free */

static ca_tensor *relu_forward(ca_module *self, ca_tensor *x, void *ctx) { return ca_relu(x); }
static ca_tensor *gelu_forward(ca_module *self, ca_tensor *x, void *ctx) { return ca_gelu(x); }
static ca_tensor *tanh_forward(ca_module *self, ca_tensor *x, void *ctx) { return ca_tanh(x); }
static ca_tensor *flatten_forward(ca_module *self, ca_tensor *x, void *ctx) { return ca_flatten(x); }
static ca_tensor *dropout_forward(ca_module *self, ca_tensor *x, void *ctx) {
    return ca_dropout(x, self->p, self->training);
}

ca_status ca_relu_create(ca_module **out) { return ca_module_create("ReLU", relu_forward, NULL, NULL, out); }
ca_status ca_gelu_create(ca_module **out) { return ca_module_create("GELU", gelu_forward, NULL, NULL, out); }
ca_status ca_tanh_create(ca_module **out) { return ca_module_create("Tanh", tanh_forward, NULL, NULL, out); }
ca_status ca_flatten_create(ca_module **out) { return ca_module_create("Flatten", flatten_forward, NULL, NULL, out); }

ca_status ca_dropout_create(double p, ca_module **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_dropout_create: out is NULL");
    *out = NULL;
    if (p < 0 || p >= 1) return ca_error(CA_ERR_INVALID, "Dropout(p=%g): p must be in [0, 1)", p);
    ca_status s = ca_module_create("Dropout", dropout_forward, NULL, NULL, out);
    if (s == CA_OK) (*out)->p = p;
    return s;
}

/* ------------------------------------------------------------------ Sequential */

static ca_tensor *sequential_forward(ca_module *self, ca_tensor *x, void *ctx) {
    for (int i = 0; i < self->nchildren && x; i++) x = ca_module_forward(self->children[i], x);
    return x;
}

ca_status ca_sequential_create(ca_module **out) {
    return ca_module_create("Sequential", sequential_forward, NULL, NULL, out);
}

/* ------------------------------------------------------------------ transformer layers */

/* ctx carries padding_idx + 1 (0: none), so the module needs no allocation of its own. */
static ca_tensor *embedding_pad_forward(ca_module *self, ca_tensor *x, void *ctx) {
    return ca_embedding_ex(x, self->params[0], (int64_t)(intptr_t)ctx - 1);
}

ca_status ca_embedding_create_ex(int64_t num, int64_t dim, int64_t padding_idx, ca_module **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_embedding_create_ex: out is NULL");
    *out = NULL;
    if (num <= 0 || dim <= 0)
        return ca_error(CA_ERR_INVALID, "Embedding(%lld, %lld): sizes must be positive", (long long)num, (long long)dim);
    if (padding_idx < -1 || padding_idx >= num)
        return ca_error(CA_ERR_INVALID, "Embedding(%lld, %lld, padding_idx=%lld): padding_idx must be in [0, %lld) "
                        "or -1 (none)", (long long)num, (long long)dim, (long long)padding_idx, (long long)num);
    ca_module *m;
    ca_status s = ca_module_create("Embedding", embedding_pad_forward, (void *)(intptr_t)(padding_idx + 1), NULL, &m);
    if (s != CA_OK) return s;
    ca_tensor *w;
    s = new_param(m, "weight", 2, (int64_t[]){num, dim}, &w);
    if (s == CA_OK) s = init_param(w, CA_RNG_NORMAL, 0.0f, 1.0f);
    if (s == CA_OK && padding_idx >= 0)     /* torch zeroes the padding row */
        s = ca_tensor_init_fill_(w, padding_idx * dim, dim, 0.0);
    return finish(m, s, out);
}

static ca_tensor *rms_norm_forward(ca_module *self, ca_tensor *x, void *ctx) {
    return ca_rms_norm(x, self->params[0], self->p);
}

ca_status ca_rms_norm_create(int64_t dim, double eps, ca_module **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_rms_norm_create: out is NULL");
    *out = NULL;
    if (dim <= 0) return ca_error(CA_ERR_INVALID, "RMSNorm(%lld): size must be positive", (long long)dim);
    ca_module *m;
    ca_status s = ca_module_create("RMSNorm", rms_norm_forward, NULL, NULL, &m);
    if (s != CA_OK) return s;
    m->p = eps > 0 ? eps : 1.1920928955078125e-07;    /* torch: finfo(float32).eps */
    ca_tensor *w;
    s = new_param(m, "weight", 1, &dim, &w);
    if (s == CA_OK) s = ca_tensor_init_fill_(w, 0, dim, 1.0);
    return finish(m, s, out);
}

static ca_tensor *gelu_erf_forward(ca_module *self, ca_tensor *x, void *ctx) { return ca_gelu_erf(x); }
static ca_tensor *silu_forward(ca_module *self, ca_tensor *x, void *ctx) { return ca_silu(x); }

ca_status ca_gelu_erf_create(ca_module **out) { return ca_module_create("GELU", gelu_erf_forward, NULL, NULL, out); }
ca_status ca_silu_create(ca_module **out) { return ca_module_create("SiLU", silu_forward, NULL, NULL, out); }

/* ------------------------------------------------------------------ pretrained models' initialisation */

ca_status ca_nn_init_normal(ca_tensor *t, float std) { return ca_tensor_init_normal_(t, 0.0f, std); }

ca_status ca_nn_add_linear(ca_module *parent, const char *name, int64_t in, int64_t out_f, bool bias, float std,
                           ca_module **out) {
    ca_module *l;
    ca_status s = ca_linear_create(in, out_f, bias, &l);
    if (s != CA_OK) return s;              /* nothing was made (out of memory, most likely) */
    s = ca_nn_init_normal(l->params[0], std);
    if (s == CA_OK && bias)
        s = ca_tensor_init_fill_(l->params[1], 0, out_f, 0.0);
    if (s != CA_OK) {
        ca_module_destroy(l);
        return s;
    }
    s = ca_module_add(parent, name, l);    /* which destroys l when it fails */
    if (s == CA_OK) *out = l;
    return s;
}

ca_status ca_nn_add_embedding(ca_module *parent, const char *name, int64_t n, int64_t dim, int64_t pad, float std,
                              ca_module **out) {
    ca_module *e;
    ca_status s = ca_embedding_create_ex(n, dim, pad, &e);
    if (s != CA_OK) return s;              /* nothing was made */
    s = ca_nn_init_normal(e->params[0], std);
    if (s == CA_OK && pad >= 0)
        s = ca_tensor_init_fill_(e->params[0], pad * dim, dim, 0.0);
    if (s != CA_OK) {
        ca_module_destroy(e);
        return s;
    }
    s = ca_module_add(parent, name, e);    /* which destroys e when it fails */
    if (s == CA_OK) *out = e;
    return s;
}
