/* Objects and padding (Accelerate's gather_object, broadcast_object_list, pad_across_processes,
 * reduce, synchronize_rng_states). Byte buffers and lengths travel as device tensors, so every
 * backend (also one that reads device memory) sees the buffers it expects. */
#include "accelerator/accelerator_impl.h"

#include <stdlib.h>
#include <string.h>

/* A device tensor of n int64 values from host memory. */
static ca_tensor *i64_tensor(ca_accelerator *acc, int64_t n, const int64_t *v) {
    return ca_from_host(acc->device, CA_I64, 1, &n, v);
}

ca_status ca_gather_object(ca_accelerator *acc, const void *buf, size_t len, void **out, size_t *out_len,
                           size_t *counts) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!acc || !out || !out_len || (!buf && len))
        return ca_error(CA_ERR_INVALID, "ca_gather_object: NULL argument");
    int64_t w = acc->world, mine = (int64_t)len;
    ca_tensor *lt = i64_tensor(acc, 1, &mine), *all = lt ? ca_gather(acc, lt) : NULL;
    int64_t *lens = calloc((size_t)w, sizeof *lens);
    ca_status s = all && lens ? ca_tensor_to_host(all, lens, (size_t)w * sizeof *lens) : ca_last_status();
    int64_t max = 1, total = 0;
    for (int64_t r = 0; s == CA_OK && r < w; r++) {
        if (lens[r] > max) max = lens[r];
        total += lens[r];
    }
    /* every rank sends max bytes (its buffer, then zeros) so the all-gather has one size */
    unsigned char *pad = s == CA_OK ? calloc((size_t)max, 1) : NULL;
    if (s == CA_OK && !pad) s = ca_error(CA_ERR_NOMEM, "out of host memory");
    if (s == CA_OK && len) memcpy(pad, buf, len);
    ca_tensor *bt = s == CA_OK ? ca_from_host(acc->device, CA_U8, 1, &max, pad) : NULL;
    ca_tensor *ball = bt ? ca_gather(acc, bt) : NULL;
    unsigned char *host = ball ? malloc((size_t)(max * w)) : NULL, *res = host ? malloc((size_t)total + 1) : NULL;
    if (s == CA_OK) s = res ? ca_tensor_to_host(ball, host, (size_t)(max * w)) : ca_last_status();
    if (s == CA_OK && !res) s = ca_error(CA_ERR_NOMEM, "out of host memory");
    size_t off = 0;
    for (int64_t r = 0; s == CA_OK && r < w; r++) {
        memcpy(res + off, host + r * max, (size_t)lens[r]);
        off += (size_t)lens[r];
        if (counts) counts[r] = (size_t)lens[r];
    }
    free(lens);
    free(pad);
    free(host);
    if (s != CA_OK) {
        free(res);
        return ca_error_context("gather_object on rank %d", acc->rank);
    }
    *out = res;
    *out_len = off;
    return CA_OK;
}

ca_status ca_broadcast_object_list(ca_accelerator *acc, void **bufs, size_t *lens, int n, int root) {
    if (!acc || n < 0 || (n && (!bufs || !lens)))
        return ca_error(CA_ERR_INVALID, "ca_broadcast_object_list: NULL argument");
    if (root < 0 || root >= acc->world)
        return ca_error(CA_ERR_INVALID, "broadcast_object_list: root %d outside 0..%d", root, acc->world - 1);
    for (int i = 0; i < n; i++) {
        int64_t len = acc->rank == root ? (int64_t)lens[i] : 0;
        ca_tensor *lt = i64_tensor(acc, 1, &len);
        ca_status s = lt ? ca_broadcast(acc, lt, root) : ca_last_status();
        if (s == CA_OK) s = ca_tensor_to_host(lt, &len, sizeof len);
        int64_t m = len ? len : 1;
        unsigned char *host = s == CA_OK ? calloc((size_t)m, 1) : NULL;
        if (s == CA_OK && !host) s = ca_error(CA_ERR_NOMEM, "out of host memory");
        if (s == CA_OK && acc->rank == root && len) memcpy(host, bufs[i], (size_t)len);
        ca_tensor *bt = s == CA_OK ? ca_from_host(acc->device, CA_U8, 1, &m, host) : NULL;
        if (s == CA_OK) s = bt ? ca_broadcast(acc, bt, root) : ca_last_status();
        if (s == CA_OK) s = ca_tensor_to_host(bt, host, (size_t)m);
        if (s != CA_OK) {
            free(host);
            return ca_error_context("broadcast_object_list: object %d from rank %d", i, root);
        }
        if (acc->rank == root) {
            free(host);
            continue;
        }
        bufs[i] = host;
        lens[i] = (size_t)len;
    }
    return CA_OK;
}

/* Copies src's blocks into the padded dst (host buffers): for every index before dim, `inner`
 * bytes per row of dim. */
static void copy_padded(unsigned char *dst, const unsigned char *src, int64_t outer, int64_t old, int64_t max,
                        size_t inner, bool pad_first) {
    int64_t at = pad_first ? max - old : 0;
    for (int64_t o = 0; o < outer; o++)
        memcpy(dst + ((size_t)(o * max + at)) * inner, src + (size_t)(o * old) * inner, (size_t)old * inner);
}

ca_tensor *ca_pad_across_processes(ca_accelerator *acc, ca_tensor *t, int dim, double pad_index, bool pad_first) {
    if (!acc || !t) {
        if (!acc) ca_error(CA_ERR_INVALID, "ca_pad_across_processes: accelerator is NULL");
        return NULL;
    }
    if (dim < 0) dim += t->ndim;
    if (dim < 0 || dim >= t->ndim) return t;   /* as Accelerate: nothing to pad along */
    int64_t size = t->shape[dim];
    ca_tensor *st = i64_tensor(acc, 1, &size), *all = st ? ca_gather(acc, st) : NULL;
    int64_t *sizes = all ? calloc((size_t)acc->world, sizeof *sizes) : NULL;
    if (!sizes || ca_tensor_to_host(all, sizes, (size_t)acc->world * sizeof *sizes) != CA_OK) {
        free(sizes);
        if (all) ca_error_context("pad_across_processes on rank %d", acc->rank);
        return NULL;
    }
    int64_t max = size;
    for (int r = 0; r < acc->world; r++)
        if (sizes[r] > max) max = sizes[r];
    free(sizes);
    if (max == size) return t;
    ca_tensor *c = ca_contiguous(t);
    int64_t shape[CA_MAX_DIMS], outer = 1;
    memcpy(shape, t->shape, sizeof shape);
    shape[dim] = max;
    for (int d = 0; d < dim; d++) outer *= t->shape[d];
    size_t inner = ca_dtype_size(t->dtype);
    for (int d = dim + 1; d < t->ndim; d++) inner *= (size_t)t->shape[d];
    ca_tensor *out = c ? ca_full(ca_tdev(t), t->dtype, t->ndim, shape, pad_index) : NULL;
    unsigned char *src = out ? malloc(ca_tensor_nbytes(c) + 1) : NULL, *dst = src ? malloc(ca_tensor_nbytes(out)) : NULL;
    ca_status s = dst ? ca_tensor_to_host(c, src, ca_tensor_nbytes(c)) : CA_ERR_NOMEM;
    if (s == CA_OK) s = ca_tensor_to_host(out, dst, ca_tensor_nbytes(out));
    if (s == CA_OK) {
        copy_padded(dst, src, outer, size, max, inner, pad_first);
        s = ca_tensor_copy_from_host(out, dst, ca_tensor_nbytes(out));
    }
    free(src);
    free(dst);
    if (s == CA_ERR_NOMEM && out) ca_error(CA_ERR_NOMEM, "out of host memory");
    return s == CA_OK ? out : NULL;
}

/* Accelerate's reduce: "none" all-reduces with a sum too (its torch.distributed path does). */
ca_status ca_reduce_scaled(ca_accelerator *acc, ca_tensor *t, const char *reduction, double scale) {
    if (!acc || !reduction) return ca_error(CA_ERR_INVALID, "ca_reduce_scaled: NULL argument");
    static const struct { const char *name; ca_reduce_op op; } ops[] = {
        {"sum", CA_OP_SUM}, {"mean", CA_OP_AVG}, {"max", CA_OP_MAX}, {"none", CA_OP_SUM}};
    int k = 0;
    while (k < 4 && strcmp(reduction, ops[k].name) != 0) k++;
    if (k == 4)
        return ca_error(CA_ERR_INVALID, "reduce: reduction \"%s\" is not one of \"sum\", \"mean\", \"max\", "
                        "\"none\"", reduction);
    ca_status s = ca_reduce(acc, t, ops[k].op);
    if (s != CA_OK || scale == 1.0) return s;
    ca_tensor *f = ca_full(ca_tdev(t), t->dtype, t->ndim, t->shape, scale), *r = f ? ca_mul(t, f) : NULL;
    return r ? ca_tensor_copy_(t, r) : ca_last_status();
}

ca_status ca_synchronize_rng_states(ca_accelerator *acc) {
    if (!acc) return ca_error(CA_ERR_INVALID, "ca_synchronize_rng_states: accelerator is NULL");
    uint64_t seed, offset;
    ca_rng_get_state(&seed, &offset);
    int64_t v[2] = {(int64_t)seed, (int64_t)offset};
    ca_tensor *t = i64_tensor(acc, 2, v);
    ca_status s = t ? ca_broadcast(acc, t, 0) : ca_last_status();
    if (s == CA_OK) s = ca_tensor_to_host(t, v, sizeof v);
    if (s != CA_OK) return ca_error_context("synchronize_rng_states on rank %d", acc->rank);
    ca_rng_set_state((uint64_t)v[0], (uint64_t)v[1]);
    return CA_OK;
}
