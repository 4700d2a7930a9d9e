/* Datasets: the generic object over custom ops, and the in-memory dataset. */
#include "data/data_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ca_status ca_sample_spec_bytes(const ca_sample_spec *s, const char *what, size_t *bytes) {
    if (!s) return ca_error(CA_ERR_INVALID, "%s sample spec is NULL", what);
    size_t esize = ca_dtype_size(s->dtype);
    if (esize == 0)
        return ca_error(CA_ERR_INVALID, "%s sample spec has an invalid dtype (%d)", what,
                        (int)s->dtype);
    if (s->ndim < 0 || s->ndim >= CA_MAX_DIMS)
        return ca_error(CA_ERR_INVALID,
                        "%s sample spec has ndim %d; it must be 0..%d (the batch adds a dimension)",
                        what, s->ndim, CA_MAX_DIMS - 1);
    size_t total = esize;
    for (int d = 0; d < s->ndim; d++) {
        if (s->shape[d] <= 0)
            return ca_error(CA_ERR_INVALID, "%s sample spec has dimension %d of size %lld", what,
                            d, (long long)s->shape[d]);
        if (total > SIZE_MAX / (size_t)s->shape[d] || total * (size_t)s->shape[d] > INT64_MAX)
            return ca_error(CA_ERR_INVALID, "%s sample spec is too large", what);
        total *= (size_t)s->shape[d];
    }
    *bytes = total;
    return CA_OK;
}

ca_status ca_dataset_create(const ca_dataset_ops *ops, void *ctx, const ca_sample_spec *x,
                            const ca_sample_spec *y, ca_dataset **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_dataset_create: out is NULL");
    *out = NULL;
    if (!ops) return ca_error(CA_ERR_INVALID, "ca_dataset_create: ops is NULL");
    size_t need = offsetof(ca_dataset_ops, get) + sizeof ops->get;
    if (ops->struct_size < need)
        return ca_error(CA_ERR_INVALID,
                        "ca_dataset_create: ops->struct_size is %zu, at least %zu expected "
                        "(set it to sizeof(ca_dataset_ops))",
                        ops->struct_size, need);
    if (!ops->length || !ops->get)
        return ca_error(CA_ERR_INVALID, "ca_dataset_create: ops->length and ops->get are required");
    size_t xb, yb;
    ca_status s = ca_sample_spec_bytes(x, "x", &xb);
    if (s != CA_OK) return s;
    s = ca_sample_spec_bytes(y, "y", &yb);
    if (s != CA_OK) return s;

    ca_dataset *d = calloc(1, sizeof *d);
    if (!d) return ca_error(CA_ERR_NOMEM, "ca_dataset_create: out of memory");
    size_t n = ops->struct_size < sizeof d->ops ? ops->struct_size : sizeof d->ops;
    memcpy(&d->ops, ops, n);
    d->ops.struct_size = sizeof d->ops;
    d->ctx = ctx;
    d->x = *x;
    d->y = *y;
    d->x_bytes = xb;
    d->y_bytes = yb;
    snprintf(d->name, sizeof d->name, "custom dataset");
    *out = d;
    return CA_OK;
}

static int64_t no_length(void *ctx) {
    (void)ctx;
    return -1;
}

static ca_status no_get(void *ctx, int64_t i, void *x, void *y) {
    (void)ctx, (void)x, (void)y;
    return ca_error(CA_ERR_UNSUPPORTED, "an iterable dataset has no sample %lld: it is read in order", (long long)i);
}

ca_status ca_dataset_create_iterable(const ca_iterable_ops *ops, void *ctx, const ca_sample_spec *x,
                                     const ca_sample_spec *y, ca_dataset **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_dataset_create_iterable: out is NULL");
    *out = NULL;
    if (!ops) return ca_error(CA_ERR_INVALID, "ca_dataset_create_iterable: ops is NULL");
    size_t need = offsetof(ca_iterable_ops, next) + sizeof ops->next;
    if (ops->struct_size < need)
        return ca_error(CA_ERR_INVALID,
                        "ca_dataset_create_iterable: ops->struct_size is %zu, at least %zu expected "
                        "(set it to sizeof(ca_iterable_ops))",
                        ops->struct_size, need);
    if (!ops->begin || !ops->next)
        return ca_error(CA_ERR_INVALID, "ca_dataset_create_iterable: ops->begin and ops->next are required");
    ca_dataset_ops base = {.struct_size = sizeof base, .length = no_length, .get = no_get};
    ca_status s = ca_dataset_create(&base, ctx, x, y, out);
    if (s != CA_OK) return s;
    ca_dataset *d = *out;
    size_t n = ops->struct_size < sizeof d->it ? ops->struct_size : sizeof d->it;
    memcpy(&d->it, ops, n);
    d->it.struct_size = sizeof d->it;
    d->ops.destroy = d->it.destroy;
    d->iterable = true;
    snprintf(d->name, sizeof d->name, "iterable dataset");
    return CA_OK;
}

bool ca_dataset_is_iterable(const ca_dataset *d) { return d && d->iterable; }

int64_t ca_dataset_length(const ca_dataset *d) {
    if (!d) return 0;
    if (d->iterable) return -1;
    int64_t n = d->ops.length(d->ctx);
    return n < 0 ? 0 : n;
}

const ca_sample_spec *ca_dataset_x_spec(const ca_dataset *d) { return d ? &d->x : NULL; }
const ca_sample_spec *ca_dataset_y_spec(const ca_dataset *d) { return d ? &d->y : NULL; }

ca_status ca_dataset_get(ca_dataset *d, int64_t i, void *x, void *y) {
    if (!d || !x || !y) return ca_error(CA_ERR_INVALID, "ca_dataset_get: NULL argument");
    if (d->iterable) return no_get(d->ctx, i, x, y);
    int64_t n = ca_dataset_length(d);
    if (i < 0 || i >= n)
        return ca_error(CA_ERR_INVALID, "%s: sample %lld out of range (length %lld)", d->name,
                        (long long)i, (long long)n);
    ca_status s = d->ops.get(d->ctx, i, x, y);
    /* A get that fails without recording a message still gets one. */
    if (s != CA_OK && ca_last_status() != s)
        return ca_error(s, "%s: reading sample %lld failed (%s)", d->name, (long long)i,
                        ca_status_name(s));
    return s;
}

void ca_dataset_destroy(ca_dataset *d) {
    if (!d) return;
    if (d->ops.destroy) d->ops.destroy(d->ctx);
    free(d);
}

/* ------------------------------------------------------------- in memory */

typedef struct mem_ctx {
    int64_t n;
    size_t x_bytes, y_bytes;
    unsigned char *x, *y;
} mem_ctx;

static int64_t mem_length(void *ctx) { return ((mem_ctx *)ctx)->n; }

static ca_status mem_get(void *ctx, int64_t i, void *x, void *y) {
    mem_ctx *m = ctx;
    memcpy(x, m->x + (size_t)i * m->x_bytes, m->x_bytes);
    memcpy(y, m->y + (size_t)i * m->y_bytes, m->y_bytes);
    return CA_OK;
}

static void mem_destroy(void *ctx) {
    mem_ctx *m = ctx;
    free(m->x);
    free(m->y);
    free(m);
}

static const ca_dataset_ops mem_ops = {
    .struct_size = sizeof(ca_dataset_ops),
    .length = mem_length,
    .get = mem_get,
    .destroy = mem_destroy,
};

ca_status ca_dataset_from_memory(const ca_sample_spec *x, const void *xdata,
                                 const ca_sample_spec *y, const void *ydata, int64_t n,
                                 ca_dataset **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_dataset_from_memory: out is NULL");
    *out = NULL;
    if (n < 0)
        return ca_error(CA_ERR_INVALID, "ca_dataset_from_memory: n is %lld", (long long)n);
    if (n > 0 && (!xdata || !ydata))
        return ca_error(CA_ERR_INVALID, "ca_dataset_from_memory: data pointer is NULL");
    size_t xb, yb;
    ca_status s = ca_sample_spec_bytes(x, "x", &xb);
    if (s != CA_OK) return s;
    s = ca_sample_spec_bytes(y, "y", &yb);
    if (s != CA_OK) return s;
    if ((uint64_t)n > SIZE_MAX / xb || (uint64_t)n > SIZE_MAX / yb)
        return ca_error(CA_ERR_INVALID, "ca_dataset_from_memory: %lld samples are too many",
                        (long long)n);

    mem_ctx *m = calloc(1, sizeof *m);
    if (!m) return ca_error(CA_ERR_NOMEM, "ca_dataset_from_memory: out of memory");
    m->n = n;
    m->x_bytes = xb;
    m->y_bytes = yb;
    size_t xt = (size_t)n * xb, yt = (size_t)n * yb;
    m->x = malloc(xt ? xt : 1);
    m->y = malloc(yt ? yt : 1);
    if (!m->x || !m->y) {
        mem_destroy(m);
        return ca_error(CA_ERR_NOMEM, "ca_dataset_from_memory: cannot allocate %zu bytes",
                        xt + yt);
    }
    if (xt) memcpy(m->x, xdata, xt);
    if (yt) memcpy(m->y, ydata, yt);
    s = ca_dataset_create(&mem_ops, m, x, y, out);
    if (s != CA_OK) {
        mem_destroy(m);
        return s;
    }
    snprintf((*out)->name, sizeof (*out)->name, "in-memory dataset");
    return CA_OK;
}
