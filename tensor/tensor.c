/* Tensors: storage, creation, queries, host copies, and the scope that owns intermediates. */
#include "tensor/tensor_impl.h"

#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ scopes */

static _Thread_local ca_scope *tl_top;          /* innermost open scope */
static _Thread_local ca_scope tl_root = {.is_root = true};
static _Thread_local bool tl_root_open;
static _Thread_local int64_t tl_live;
static _Thread_local uint64_t tl_scope_ids;
static _Thread_local ca_scope *tl_pool;          /* ended scopes, reused */

static _Thread_local uint64_t tl_serial;   /* tensors made on this thread, numbering them */

static ca_scope *current_scope(void) {
    if (tl_top) return tl_top;
    tl_root_open = true;
    return &tl_root;
}

ca_scope *ca_scope_begin(void) {
    ca_scope *s = tl_pool;
    if (s) tl_pool = s->parent;
    else if (!(s = calloc(1, sizeof *s))) {
        ca_error(CA_ERR_NOMEM, "out of host memory opening a scope");
        return NULL;
    }
    memset(s, 0, sizeof *s);
    s->id = ++tl_scope_ids;
    s->parent = tl_top;
    tl_top = s;
    return s;
}

/* An ended scope returns to the pool with id 0, so stale handles never match. */
static void scope_recycle(ca_scope *s) {
    s->id = 0;
    s->parent = tl_pool;
    tl_pool = s;
}

uint64_t ca_scope_id(const ca_scope *s) { return s ? s->id : 0; }

static void storage_release(ca_storage *st) {
    if (!st) return;
    if (atomic_fetch_sub(&st->refs, 1) == 1) {
        ca_meta_init_free(st->meta);
        ca_device_free(st->dev, st->ptr);
        free(st);
    }
}

void ca_storage_release(ca_storage *st) { storage_release(st); }

static void tensor_destroy(ca_tensor *t) {
    /* a finished tensor that goes stops counting: the storage's other tensors decide alone */
    if (t->storage && t->done_pass && t->done_pass == t->storage->done_pass) t->storage->done--;
    storage_release(t->storage);
    free(t->name);
    free(t);
}

static void release_contents(ca_scope *s) {
    for (ca_node *n = s->nodes; n;) {
        ca_node *next = n->scope_next;
        if (n->release) n->release(n);
        free(n);
        n = next;
    }
    s->nodes = NULL;
    for (ca_tensor *t = s->tensors; t;) {
        ca_tensor *next = t->scope_next;
        tensor_destroy(t);
        tl_live--;
        t = next;
    }
    s->tensors = NULL;
}

static bool scope_is_open(const ca_scope *s, uint64_t id) {
    for (ca_scope *p = tl_top; p; p = p->parent)
        if (p == s) return p->id == id && id != 0;
    return false;
}

static void end_open_scope(ca_scope *s) {
    /* scopes opened inside s and still open end with it */
    while (tl_top != s) {
        ca_scope *inner = tl_top;
        tl_top = inner->parent;
        release_contents(inner);
        scope_recycle(inner);
    }
    tl_top = s->parent;
    release_contents(s);
    scope_recycle(s);
}

void ca_scope_end_id(ca_scope *s, uint64_t id) {
    if (s && !s->is_root && scope_is_open(s, id)) end_open_scope(s);
}

void ca_scope_end(ca_scope *s) {
    if (!s || s->is_root) return;
    if (!scope_is_open(s, s->id)) {
        ca_log_printf(CA_LOG_WARNING, "ca_scope_end: the scope is not open on this thread (ended twice, "
                      "or already ended with an enclosing scope)");
        return;
    }
    end_open_scope(s);
}

void ca_scope_release_all(void) {
    while (tl_top) end_open_scope(tl_top);
    if (tl_root_open) release_contents(&tl_root);
    while (tl_pool) {
        ca_scope *n = tl_pool->parent;
        free(tl_pool);
        tl_pool = n;
    }
}

int64_t ca_scope_live_tensors(void) { return tl_live; }

static _Thread_local uint64_t tl_locals_calls;

ca_locals_mark ca_forward_locals_mark(void) {
    ca_scope *s = current_scope();
    return (ca_locals_mark){.scope = s, .scope_id = s->id, .serial = tl_serial};
}

static const char local_freed[] =
    "local of a module's forward under no_grad, freed when that forward returned (read it inside the "
    "forward, or return it)";

/* The scope's list holds the newest tensors first: those made since the mark lead it, until the first
 * older one (a tensor moved in from another scope also ends the walk: fewer frees, never a wrong one). */
void ca_forward_locals_free(ca_locals_mark mark, const ca_tensor *y) {
    ca_scope *s = current_scope();
    if (s != mark.scope || s->id != mark.scope_id) return;   /* the forward changed scopes: left to them */
    uint64_t call = ++tl_locals_calls;
    for (ca_tensor *t = s->tensors; t && t->serial > mark.serial; t = t->scope_next) {
        ca_storage *st = t->storage;
        if (!st) continue;
        if (st->local_mark != call) {
            st->local_mark = call;
            st->local = 0;
        }
        st->local++;
    }
    for (ca_tensor *t = s->tensors; t && t->serial > mark.serial; t = t->scope_next) {
        ca_storage *st = t->storage;
        if (!st || !st->ptr || st->meta || t->persistent || (y && y->storage == st) ||
            st->local != atomic_load(&st->refs))
            continue;
        ca_device_free(st->dev, st->ptr);
        st->ptr = NULL;
        st->absent = local_freed;
    }
}

static void scope_add_tensor(ca_tensor *t) {
    ca_scope *s = current_scope();
    t->serial = ++tl_serial;
    t->scope = s;
    t->scope_next = s->tensors;
    s->tensors = t;
    tl_live++;
}

/* Removes t from its scope's list (O(length); keep is rare). */
static void scope_remove_tensor(ca_tensor *t) {
    ca_scope *s = t->scope;
    if (!s) return;
    for (ca_tensor **p = &s->tensors; *p; p = &(*p)->scope_next)
        if (*p == t) {
            *p = t->scope_next;
            tl_live--;
            break;
        }
    t->scope = NULL;
    t->scope_next = NULL;
}

void ca_tensor_move_to_scope(ca_tensor *t, ca_scope *s) {
    if (!s || t->scope == s || t->persistent) return;
    scope_remove_tensor(t);
    t->scope = s;
    t->scope_next = s->tensors;
    s->tensors = t;
    tl_live++;
}

void ca_scope_add_node(ca_node *n) {
    ca_scope *s = current_scope();
    n->scope = s;
    n->scope_next = s->nodes;
    s->nodes = n;
}

/* ------------------------------------------------------------------ creation */

int64_t ca_shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

const char *ca_shape_str(int ndim, const int64_t *shape, char *buf, size_t len) {
    size_t used = 0;
    used += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, "]");
    return buf;
}

void ca_tensor_set_contiguous(ca_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->stride[i] = s;
        s *= t->shape[i];
    }
    t->numel = s;
}

ca_tensor *ca_tensor_alloc_struct(void) {
    ca_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        ca_error(CA_ERR_NOMEM, "out of host memory for a tensor");
        return NULL;
    }
    scope_add_tensor(t);
    return t;
}

static ca_status check_shape(ca_dtype dt, int ndim, const int64_t *shape) {
    if ((unsigned)dt >= CA_DTYPE_COUNT) return ca_error(CA_ERR_INVALID, "invalid dtype %d", (int)dt);
    if (ndim < 0 || ndim > CA_MAX_DIMS)
        return ca_error(CA_ERR_INVALID, "a tensor has 0..%d dimensions, not %d", CA_MAX_DIMS, ndim);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0) return ca_error(CA_ERR_INVALID, "negative size %lld in dimension %d",
                                          (long long)shape[i], i);
    return CA_OK;
}

static ca_storage *storage_new(ca_device *dev, size_t bytes) {
    ca_storage *st = calloc(1, sizeof *st);
    if (!st) {
        ca_error(CA_ERR_NOMEM, "out of host memory");
        return NULL;
    }
    if (ca_device_alloc(dev, bytes, &st->ptr) != CA_OK) {
        free(st);
        return NULL;
    }
    st->dev = dev;
    st->bytes = bytes;
    atomic_init(&st->refs, 1);
    return st;
}

/* A contiguous tensor's header (dtype, shape, strides) without storage: the part a tensor with
 * memory and a meta parameter share. */
static ca_tensor *tensor_header(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape) {
    if (!dev) {
        ca_error(CA_ERR_INVALID, "no device given for a new tensor");
        return NULL;
    }
    if (check_shape(dt, ndim, shape) != CA_OK) return NULL;
    ca_tensor *t = ca_tensor_alloc_struct();
    if (!t) return NULL;
    t->dtype = dt;
    t->ndim = ndim;
    if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    ca_tensor_set_contiguous(t);
    return t;
}

ca_tensor *ca_tensor_new(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape) {
    ca_tensor *t = tensor_header(dev, dt, ndim, shape);
    if (!t) return NULL;
    t->storage = storage_new(dev, (size_t)t->numel * ca_dtype_size(dt));
    return t->storage ? t : NULL;
}

ca_tensor *ca_meta_parameter_new(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape) {
    ca_tensor *t = tensor_header(dev, dt, ndim, shape);
    if (!t) return NULL;
    t->storage = calloc(1, sizeof *t->storage);
    if (!t->storage) {
        ca_error(CA_ERR_NOMEM, "out of host memory for a meta parameter");
        return NULL;
    }
    t->storage->dev = dev;
    t->storage->bytes = (size_t)t->numel * ca_dtype_size(dt);
    atomic_init(&t->storage->refs, 1);
    return ca_meta_storage(t->storage) == CA_OK ? t : NULL;
}

ca_tensor *ca_tensor_view(ca_tensor *t, int ndim, const int64_t *shape, const int64_t *stride,
                          int64_t offset) {
    ca_tensor *v = ca_tensor_alloc_struct();
    if (!v) return NULL;
    v->storage = t->storage;
    atomic_fetch_add(&t->storage->refs, 1);
    v->offset = offset;
    v->dtype = t->dtype;
    v->ndim = ndim;
    if (ndim) {
        memcpy(v->shape, shape, (size_t)ndim * sizeof *shape);
        memcpy(v->stride, stride, (size_t)ndim * sizeof *stride);
    }
    v->numel = ca_shape_numel(ndim, shape);
    return v;
}

ca_tensor *ca_empty(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape) {
    return ca_tensor_new(dev, dt, ndim, shape);
}

ca_tensor *ca_full(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape, double v) {
    ca_tensor *t = ca_tensor_new(dev, dt, ndim, shape);
    if (t && t->numel && CA_KCALL(dev, fill, .dt = dt, .n = t->numel, .value = v, .y = ca_tptr(t)) != CA_OK) return NULL;
    return t;
}

ca_tensor *ca_zeros(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape) {
    return ca_full(dev, dt, ndim, shape, 0.0);
}

ca_tensor *ca_from_host(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape, const void *data) {
    ca_tensor *t = ca_tensor_new(dev, dt, ndim, shape);
    if (t && ca_device_copy_from_host(dev, ca_tptr(t), data, ca_tensor_nbytes(t)) != CA_OK) return NULL;
    return t;
}

/* ------------------------------------------------------------------ random */

static pthread_mutex_t rng_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t rng_seed = 0, rng_offset = 0;

void ca_manual_seed(uint64_t seed) {
    pthread_mutex_lock(&rng_mu);
    rng_seed = seed;
    rng_offset = 0;
    pthread_mutex_unlock(&rng_mu);
}

void ca_rng_get_state(uint64_t *seed, uint64_t *offset) {
    pthread_mutex_lock(&rng_mu);
    *seed = rng_seed;
    *offset = rng_offset;
    pthread_mutex_unlock(&rng_mu);
}

void ca_rng_set_state(uint64_t seed, uint64_t offset) {
    pthread_mutex_lock(&rng_mu);
    rng_seed = seed;
    rng_offset = offset;
    pthread_mutex_unlock(&rng_mu);
}

uint64_t ca_rng_reserve(uint64_t counters) {
    pthread_mutex_lock(&rng_mu);
    uint64_t o = rng_offset;
    rng_offset += counters;
    pthread_mutex_unlock(&rng_mu);
    return o;
}

static uint64_t current_seed(void) {
    pthread_mutex_lock(&rng_mu);
    uint64_t s = rng_seed;
    pthread_mutex_unlock(&rng_mu);
    return s;
}

static ca_tensor *rand_tensor(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape,
                              ca_rng_kind kind, float a, float b) {
    if (!ca_dtype_is_float(dt)) {
        ca_error(CA_ERR_INVALID, "random tensors are float (got %s)", ca_dtype_name(dt));
        return NULL;
    }
    ca_tensor *t = ca_tensor_new(dev, dt, ndim, shape);
    if (!t || !t->numel) return t;
    uint64_t seed = current_seed();
    uint64_t off = ca_rng_reserve(ca_rng_counters(kind, t->numel));
    if (CA_KCALL(dev, rng, .kind = kind, .dt = dt, .n = t->numel, .seed = seed, .offset = off, .a = a, .b = b,
                 .y = ca_tptr(t)) != CA_OK) return NULL;
    return t;
}

ca_tensor *ca_rand_uniform(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape, float lo, float hi) {
    return rand_tensor(dev, dt, ndim, shape, CA_RNG_UNIFORM, lo, hi);
}

ca_tensor *ca_rand_normal(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape, float mean, float std) {
    return rand_tensor(dev, dt, ndim, shape, CA_RNG_NORMAL, mean, std);
}

/* ------------------------------------------------------------------ persistence */

ca_status ca_parameter_create(ca_device *dev, ca_dtype dt, int ndim, const int64_t *shape, ca_tensor **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_parameter_create: out is NULL");
    *out = NULL;
    ca_tensor *t = ca_init_empty_weights_enabled() ? ca_meta_parameter_new(dev, dt, ndim, shape)
                                                   : ca_tensor_new(dev, dt, ndim, shape);
    if (!t) return ca_last_status();
    ca_tensor_keep(t);
    t->requires_grad = true;
    *out = t;
    return CA_OK;
}

ca_tensor *ca_tensor_keep(ca_tensor *t) {
    if (!t || t->persistent) return t;
    scope_remove_tensor(t);
    t->persistent = true;
    t->grad_fn = NULL;          /* a kept tensor is a new leaf: its tape ends with the scope */
    return t;
}

void ca_tensor_free(ca_tensor *t) {
    if (!t || !t->persistent) return;
    ca_tensor_free(t->lowp);
    if (t->grad) {
        t->grad->persistent = true;
        ca_tensor_free(t->grad);
    }
    tensor_destroy(t);
}

/* The gradient no longer fits a tensor whose storage or shape changed in place: it goes. */
static void drop_grad(ca_tensor *t) {
    ca_tensor *g = t->grad;
    t->grad = NULL;
    t->grad_defined = false;
    ca_tensor_free(g);
}

ca_status ca_tensor_move_(ca_tensor *t, ca_device *dev) {
    if (!t || !dev) return ca_error(CA_ERR_INVALID, "ca_tensor_move_: tensor and device are required");
    if (ca_tdev(t) == dev) return CA_OK;
    if (t->storage->meta && !t->storage->ptr) {   /* nothing to copy: its values will be made on dev */
        t->storage->dev = dev;
        return CA_OK;
    }
    if (!ca_tensor_is_contiguous(t))
        return ca_error(CA_ERR_INVALID, "ca_tensor_move_: only contiguous tensors can move");
    size_t bytes = ca_tensor_nbytes(t);
    ca_storage *st = storage_new(dev, bytes);
    if (!st) return ca_last_status();
    void *host = malloc(bytes ? bytes : 1);
    ca_status s = host ? ca_tensor_to_host(t, host, bytes) : ca_error(CA_ERR_NOMEM, "out of host memory");
    if (s == CA_OK) s = ca_device_copy_from_host(dev, st->ptr, host, bytes);
    free(host);
    if (s != CA_OK) {
        storage_release(st);
        return s;
    }
    storage_release(t->storage);
    t->storage = st;
    t->offset = 0;
    t->version++;
    drop_grad(t);   /* of the old storage or shape */
    return CA_OK;
}

/* The slices' elements, copied out of the host copy `full` of a contiguous tensor into `part`: in each
 * of `parts` equal blocks of dimension dim, [start, start + len) of the block. */
static void narrow_copy(const ca_tensor *t, int dim, int parts, int64_t start, int64_t len, const char *full,
                        char *part) {
    size_t es = ca_dtype_size(t->dtype);
    int64_t outer = 1, inner = 1, block = t->shape[dim] / parts;
    for (int d = 0; d < dim; d++) outer *= t->shape[d];
    for (int d = dim + 1; d < t->ndim; d++) inner *= t->shape[d];
    size_t row = (size_t)(len * inner) * es;
    for (int64_t o = 0; o < outer; o++)
        for (int k = 0; k < parts; k++)
            memcpy(part + (size_t)(o * parts + k) * row,
                   full + ((size_t)(o * t->shape[dim] + k * block + start) * (size_t)inner) * es, row);
}

/* t (contiguous) takes storage st, dimension dim now len long: the same object in a new shape. */
static void adopt_storage(ca_tensor *t, ca_storage *st, int dim, int64_t len) {
    storage_release(t->storage);
    t->storage = st;
    t->offset = 0;
    t->shape[dim] = len;
    ca_tensor_set_contiguous(t);
    t->version++;
    ca_tensor_free(t->lowp);    /* a copy of the old shape */
    t->lowp = NULL;
    drop_grad(t);   /* of the old storage or shape */
}

ca_status ca_tensor_narrow_(ca_tensor *t, int dim, int parts, int64_t start, int64_t len) {
    if (!t || dim < 0 || dim >= t->ndim || parts < 1 || t->shape[dim] % parts || start < 0 || len < 1 ||
        start + len > t->shape[dim] / parts)
        return ca_error(CA_ERR_INVALID, "ca_tensor_narrow_: a tensor and a slice inside each of %d block(s) of "
                        "dimension %d are required", parts, dim);
    if (!ca_tensor_is_contiguous(t) || t->storage->absent)
        return ca_error(CA_ERR_INVALID, "ca_tensor_narrow_: only a contiguous tensor with its values can be narrowed");
    size_t bytes = ca_tensor_nbytes(t), pbytes = bytes / (size_t)t->shape[dim] * (size_t)(len * parts);
    char *full = malloc(bytes ? bytes : 1), *part = malloc(pbytes ? pbytes : 1);
    ca_storage *st = full && part ? storage_new(ca_tdev(t), pbytes) : NULL;
    ca_status s = !full || !part ? ca_error(CA_ERR_NOMEM, "out of host memory") : st ? CA_OK : ca_last_status();
    if (s == CA_OK) s = ca_tensor_to_host(t, full, bytes);
    if (s == CA_OK) narrow_copy(t, dim, parts, start, len, full, part);
    if (s == CA_OK) s = ca_device_copy_from_host(ca_tdev(t), st->ptr, part, pbytes);
    free(full);
    free(part);
    if (s != CA_OK) {
        if (st) storage_release(st);
        return s;
    }
    adopt_storage(t, st, dim, len * parts);
    return CA_OK;
}

ca_status ca_tensor_resize_dim_(ca_tensor *t, int dim, int64_t len, const void *host) {
    if (!t || !host || dim < 0 || dim >= t->ndim || len < 1 || t->shape[dim] < 1)
        return ca_error(CA_ERR_INVALID, "ca_tensor_resize_dim_: a tensor, its new values and a length of dimension "
                        "%d are required", dim);
    if (!ca_tensor_is_contiguous(t) || t->storage->absent)
        return ca_error(CA_ERR_INVALID, "ca_tensor_resize_dim_: only a contiguous tensor with its values can be resized");
    size_t bytes = ca_tensor_nbytes(t) / (size_t)t->shape[dim] * (size_t)len;
    ca_storage *st = storage_new(ca_tdev(t), bytes);
    if (!st) return ca_last_status();
    ca_status s = ca_device_copy_from_host(ca_tdev(t), st->ptr, host, bytes);
    if (s != CA_OK) {
        storage_release(st);
        return s;
    }
    adopt_storage(t, st, dim, len);
    return CA_OK;
}

ca_status ca_tensor_to_device(const ca_tensor *t, ca_device *dev, ca_tensor **out) {
    if (!out) return ca_error(CA_ERR_INVALID, "ca_tensor_to_device: out is NULL");
    *out = NULL;
    if (!t) return ca_error(CA_ERR_INVALID, "ca_tensor_to_device: tensor is NULL");
    ca_tensor *c = ca_tensor_new(dev, t->dtype, t->ndim, t->shape);
    if (!c) return ca_last_status();
    ca_tensor_keep(c);
    ca_status s = ca_tensor_copy_(c, t);
    if (s != CA_OK) {
        ca_tensor_free(c);
        return s;
    }
    *out = c;
    return CA_OK;
}

/* ------------------------------------------------------------------ queries */

ca_dtype ca_tensor_dtype(const ca_tensor *t) { return t->dtype; }
int ca_tensor_ndim(const ca_tensor *t) { return t->ndim; }
const int64_t *ca_tensor_shape(const ca_tensor *t) { return t->shape; }
const int64_t *ca_tensor_strides(const ca_tensor *t) { return t->stride; }
int64_t ca_tensor_numel(const ca_tensor *t) { return t->numel; }
size_t ca_tensor_nbytes(const ca_tensor *t) { return (size_t)t->numel * ca_dtype_size(t->dtype); }
ca_device *ca_tensor_device(const ca_tensor *t) { return ca_tdev(t); }
void *ca_tensor_data(const ca_tensor *t) {
    return ca_tensor_check_present(t, "ca_tensor_data") == CA_OK ? ca_tptr(t) : NULL;
}
bool ca_tensor_requires_grad(const ca_tensor *t) { return t && t->requires_grad; }
void ca_tensor_set_requires_grad(ca_tensor *t, bool on) { if (t) t->requires_grad = on; }
ca_tensor *ca_tensor_grad(const ca_tensor *t) { return t && t->grad_defined ? t->grad : NULL; }
/* The gradient's memory goes back to the allocator, as torch's zero_grad(set_to_none=True): between
 * the optimizer step and the next backward the model holds no gradients, so the next forward's
 * activations reuse their blocks and the step's peak is parameters + optimizer state + activations,
 * not that plus a second copy of the parameters. The next backward writes (beta 0) a fresh one from the
 * cache, as it wrote the kept one: the same values. A gradient that is a view of a flat buffer
 * (data-parallel buckets, ZeRO) or that something else still references stays: only its flag drops. */
void ca_tensor_zero_grad(ca_tensor *t) {
    if (!t) return;
    t->grad_defined = false;
    ca_tensor *g = t->grad;
    if (g && g->persistent && g->offset == 0 && atomic_load(&g->storage->refs) == 1 &&
        g->storage->bytes == ca_tensor_nbytes(g)) {
        t->grad = NULL;
        ca_tensor_free(g);
    }
}
const char *ca_tensor_name(const ca_tensor *t) { return t && t->name ? t->name : ""; }

int64_t ca_tensor_dim(const ca_tensor *t, int d) {
    if (d < 0) d += t->ndim;
    return d >= 0 && d < t->ndim ? t->shape[d] : 0;
}

ca_status ca_tensor_set_name(ca_tensor *t, const char *name) {
    char *n = strdup(name ? name : "");
    if (!n) return ca_error(CA_ERR_NOMEM, "out of host memory");
    free(t->name);
    t->name = n;
    return CA_OK;
}

bool ca_tensor_is_contiguous(const ca_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

void ca_tensor_set_grad_hook(ca_tensor *leaf, ca_grad_hook fn, void *ctx) {
    leaf->hook = fn;
    leaf->hook_ctx = ctx;
}

/* ------------------------------------------------------------------ copies */

/* A storage whose memory its owner released (a sharded parameter between uses) holds a NULL
 * address: reading it would hand the device NULL and fail with no word of which tensor or why. */
ca_status ca_tensor_check_present(const ca_tensor *t, const char *op) {
    if (t->storage->ptr || !t->storage->absent || !t->numel) return CA_OK;
    const char *what = t->requires_grad && !t->grad_fn ? "parameter" : "tensor";   /* an activation: a tensor */
    if (t->name && *t->name)
        return ca_error(CA_ERR_STATE, "%s: %s '%s' %s", op, what, t->name, t->storage->absent);
    return ca_error(CA_ERR_STATE, "%s: the %s %s", op, what, t->storage->absent);
}

/* Copies src's elements into the contiguous buffer dst on dst_dev. */
static ca_status gather_contiguous(const ca_tensor *src, void *dst) {
    ca_device *d = ca_tdev(src);
    if (ca_tensor_is_contiguous(src))
        return ca_device_copy(d, dst, ca_tptr(src), ca_tensor_nbytes(src));
    int64_t dstride[CA_MAX_DIMS], s = 1;
    for (int i = src->ndim - 1; i >= 0; i--) {
        dstride[i] = s;
        s *= src->shape[i];
    }
    return CA_KCALL(d, copy_strided, .dt = src->dtype, .ndim = src->ndim, .shape = src->shape,
                    .x = ca_tptr(src), .x_stride = src->stride, .y = dst, .y_stride = dstride);
}

ca_status ca_tensor_to_host(const ca_tensor *t, void *dst, size_t bytes) {
    if (!t) return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_INVALID, "NULL tensor");
    size_t need = ca_tensor_nbytes(t);
    if (bytes < need)
        return ca_error(CA_ERR_INVALID, "ca_tensor_to_host: buffer of %zu bytes, tensor needs %zu", bytes, need);
    if (!need) return CA_OK;
    ca_status s = ca_tensor_check_present(t, "ca_tensor_to_host");
    if (s != CA_OK) return s;
    ca_device *d = ca_tdev(t);
    if (ca_tensor_is_contiguous(t)) return ca_device_copy_to_host(d, dst, ca_tptr(t), need);
    void *tmp;
    s = ca_device_alloc(d, need, &tmp);
    if (s != CA_OK) return s;
    s = gather_contiguous(t, tmp);
    if (s == CA_OK) s = ca_device_copy_to_host(d, dst, tmp, need);
    ca_device_free(d, tmp);
    return s;
}

ca_status ca_tensor_copy_from_host(ca_tensor *t, const void *src, size_t bytes) {
    size_t need = ca_tensor_nbytes(t);
    if (!ca_tensor_is_contiguous(t))
        return ca_error(CA_ERR_INVALID, "ca_tensor_copy_from_host: tensor is not contiguous");
    if (bytes != need)
        return ca_error(CA_ERR_INVALID, "ca_tensor_copy_from_host: %zu bytes given, tensor holds %zu", bytes, need);
    ca_status s = ca_tensor_check_present(t, "ca_tensor_copy_from_host");
    if (s != CA_OK) return s;
    t->version++;
    return ca_device_copy_from_host(ca_tdev(t), ca_tptr(t), src, need);
}

ca_status ca_tensor_copy_(ca_tensor *dst, const ca_tensor *src) {
    if (!dst || !src) return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_INVALID, "NULL tensor");
    if (dst->dtype != src->dtype || dst->ndim != src->ndim ||
        memcmp(dst->shape, src->shape, (size_t)src->ndim * sizeof(int64_t)) != 0) {
        char a[128], b[128];
        return ca_error(CA_ERR_INVALID, "copy: shapes/dtypes differ (%s %s vs %s %s)",
                        ca_shape_str(dst->ndim, dst->shape, a, sizeof a), ca_dtype_name(dst->dtype),
                        ca_shape_str(src->ndim, src->shape, b, sizeof b), ca_dtype_name(src->dtype));
    }
    if (!ca_tensor_is_contiguous(dst)) return ca_error(CA_ERR_INVALID, "copy: destination is not contiguous");
    size_t bytes = ca_tensor_nbytes(src);
    if (!bytes) return CA_OK;
    ca_status s = ca_tensor_check_present(src, "copy (source)");
    if (s == CA_OK) s = ca_tensor_check_present(dst, "copy (destination)");
    if (s != CA_OK) return s;
    dst->version++;
    if (ca_tdev(dst) == ca_tdev(src)) return gather_contiguous(src, ca_tptr(dst));
    /* across devices: through host memory */
    void *host = malloc(bytes);
    if (!host) return ca_error(CA_ERR_NOMEM, "out of host memory");
    s = ca_tensor_to_host(src, host, bytes);
    if (s == CA_OK) s = ca_device_copy_from_host(ca_tdev(dst), ca_tptr(dst), host, bytes);
    free(host);
    return s;
}

ca_status ca_tensor_item(const ca_tensor *t, double *out) {
    if (!t) return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_INVALID, "NULL tensor");
    if (t->numel != 1) return ca_error(CA_ERR_INVALID, "item() needs a one-element tensor, got %lld elements",
                                       (long long)t->numel);
    union { float f; double d; int32_t i; int64_t l; uint8_t u; uint16_t h; } v;
    ca_status s = ca_tensor_check_present(t, "item");
    if (s != CA_OK) return s;
    s = ca_device_copy_to_host(ca_tdev(t), &v, ca_tptr(t), ca_dtype_size(t->dtype));
    if (s != CA_OK) return s;
    switch (t->dtype) {
    case CA_F32: *out = v.f; break;
    case CA_I32: *out = v.i; break;
    case CA_I64: *out = (double)v.l; break;
    case CA_U8: *out = v.u; break;
    case CA_BF16: { uint32_t b = (uint32_t)v.h << 16; float f; memcpy(&f, &b, 4); *out = f; break; }
    case CA_F16: {
        float f;
        ca_status cs = CA_KCALL(ca_cpu_device(), cast, .src_dt = CA_F16, .x = &v.h, .dst_dt = CA_F32, .y = &f,
                                .n = 1, .alpha = 1.0f);
        if (cs != CA_OK) return cs;
        *out = f;
        break;
    }
    default: return ca_error(CA_ERR_INVALID, "item(): bad dtype");
    }
    return CA_OK;
}

double ca_item(const ca_tensor *t) {
    double v;
    return ca_tensor_item(t, &v) == CA_OK ? v : NAN;
}

void ca_tensor_print(const ca_tensor *t, const char *label) {
    char sh[128];
    if (!t) {
        fprintf(stderr, "%s: NULL (%s)\n", label ? label : "tensor", ca_last_error());
        return;
    }
    fprintf(stderr, "%s: %s %s on %s%s", label ? label : "tensor", ca_shape_str(t->ndim, t->shape, sh, sizeof sh),
            ca_dtype_name(t->dtype), ca_device_name(ca_tdev(t)), t->requires_grad ? " (requires grad)" : "");
    int64_t n = t->numel < 8 ? t->numel : 8;
    if (t->dtype == CA_F32 && n > 0) {
        float v[8];
        float *all = malloc(ca_tensor_nbytes(t));
        if (all && ca_tensor_to_host(t, all, ca_tensor_nbytes(t)) == CA_OK) {
            memcpy(v, all, (size_t)n * sizeof(float));
            fprintf(stderr, " = [");
            for (int64_t i = 0; i < n; i++) fprintf(stderr, "%s%g", i ? ", " : "", v[i]);
            fprintf(stderr, "%s]", t->numel > n ? ", ..." : "");
        }
        free(all);
    }
    fprintf(stderr, "\n");
}
