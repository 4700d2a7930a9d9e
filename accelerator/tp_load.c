/* tp_load.c: reading a checkpoint's files under tensor parallelism by byte range: each rank reads its tp
 * slice of every split tensor and the replicated ones whole (ca_load_model after or before ca_prepare,
 * ca_load_state), and the ranks of a tp group verify the chunks of a checkpoint file together, each
 * hashing only the bytes it read (tensor/st_parts.c), so that no rank reads a chunk whole. */
#include "accelerator/mesh_impl.h"
#include "tensor/safetensors_impl.h"
#include "tensor/tensor_impl.h"

#include <stdlib.h>
#include <string.h>

void ca_tp_file_shape(const ca_accelerator *acc, const ca_tensor *p, int64_t *shape) {
    memcpy(shape, ca_tensor_shape(p), (size_t)ca_tensor_ndim(p) * sizeof *shape);
    int dim = acc ? ca_tp_split_dim(acc, p) : -1;
    if (dim >= 0) shape[dim] *= acc->mesh->shape.size[CA_MESH_TP];
}

/* The part of tensor e that this rank keeps of parameter p: its tp slice of a split one (*split), p whole
 * otherwise. */
static ca_status tp_slice(ca_accelerator *acc, const ca_st_entry *e, const ca_tensor *p, const int64_t *shape,
                          ca_slice *sl, bool *split) {
    *sl = (ca_slice){.dim = 0, .parts = 1, .start = 0, .len = shape[0]};
    int tp = acc->mesh->shape.size[CA_MESH_TP], r = acc->mesh->coord[CA_MESH_TP];
    ca_status s = ca_tp_param_split(acc, p, &sl->dim, &sl->parts);
    *split = s == CA_OK && sl->dim >= 0;
    if (*split) {
        sl->len = shape[sl->dim] / sl->parts / tp;
        sl->start = r * sl->len;
    } else {
        sl->dim = 0;
    }
    return s == CA_OK ? CA_OK : ca_error_context("tensor '%s'", e->name);
}

ca_status ca_tp_read_entry(ca_accelerator *acc, ca_meta_src *src, const ca_st_file *f, const ca_st_entry *e,
                           const ca_tensor *p, int64_t start, int64_t count, void *buf, ca_st_parts *parts) {
    int64_t one = 1;
    const int64_t *shape = e->ndim ? e->shape : &one;   /* a scalar: one element */
    ca_slice sl;
    bool split;
    ca_status s = tp_slice(acc, e, p, shape, &sl, &split);
    if (count < 0) count = ca_tensor_numel(p);
    /* the chunks' sums: each rank its slices, tp rank 0 the replicated tensors (read by every rank) */
    if (parts && (split || acc->mesh->coord[CA_MESH_TP] == 0)) ca_meta_src_set_tap(src, ca_st_parts_add, parts);
    if (s == CA_OK) s = ca_meta_src_read_slice_range(src, f->data_start + e->begin, e->dtype, e->dtype,
                                                     e->ndim ? e->ndim : 1, shape, &sl, start, count, buf);
    ca_meta_src_set_tap(src, NULL, NULL);
    return s == CA_OK ? CA_OK : ca_error_context("%s: tensor '%s' (rank %d)", f->path, e->name, acc->rank);
}

ca_status ca_tp_file_read(ca_accelerator *acc, ca_st_file *f, const ca_tensor *(*param_of)(void *ctx, const char *name),
                          void *ctx, bool sums, ca_tp_file *out) {
    *out = (ca_tp_file){.n = f->n};
    ca_status s = ca_meta_src_open(f, &out->src);
    if (s == CA_OK && sums) s = ca_st_parts_new(f, &out->parts);
    if (s == CA_OK && !(out->buf = calloc((size_t)f->n + 1, sizeof *out->buf)))
        s = ca_error(CA_ERR_NOMEM, "load: out of host memory (rank %d)", acc->rank);
    for (int j = 0; s == CA_OK && j < f->n; j++) {
        const ca_st_entry *e = &f->entries[j];
        const ca_tensor *p = param_of(ctx, e->name);
        if (!p) return ca_error(CA_ERR_INTERNAL, "%s: no tensor of this rank for '%s'", f->path, e->name);
        size_t bytes = (size_t)ca_tensor_numel(p) * ca_dtype_size(e->dtype);
        if (!(out->buf[j] = malloc(bytes + 1)))
            s = ca_error(CA_ERR_NOMEM, "load: out of host memory for '%s' (rank %d)", e->name, acc->rank);
        if (s == CA_OK) s = ca_tp_read_entry(acc, out->src, f, e, p, 0, -1, out->buf[j], out->parts);
    }
    return s;
}

void ca_tp_file_free(ca_tp_file *t) {
    for (int j = 0; t->buf && j < t->n; j++) free(t->buf[j]);
    free(t->buf);
    ca_meta_src_unref(t->src);
    ca_st_parts_free(t->parts);
    *t = (ca_tp_file){0};
}

/* This rank's sums of every chunk of the n files (parts[i] NULL: none, that file verified whole), in
 * order, into sums (*count of them). rest: this rank hashes the bytes outside the files' tensors (the
 * header, any gap): one rank of the combining group. */
static ca_status tp_local_sums(ca_accelerator *acc, ca_st_file *const *files, ca_st_parts *const *parts, int n,
                               bool rest, uint32_t **sums, size_t *count) {
    *count = 0;
    for (int i = 0; i < n; i++) *count += parts[i] ? files[i]->sums.nchunks : 0;
    *sums = calloc(*count + 1, sizeof **sums);
    ca_status s = *sums ? CA_OK : ca_error(CA_ERR_NOMEM, "load: out of host memory (rank %d)", acc->rank);
    size_t at = 0;
    for (int i = 0; s == CA_OK && i < n; i++) {
        if (!parts[i]) {
            s = ca_st_verify_range(files[i], 0, files[i]->size);   /* no chunk sums (an older checkpoint) */
            continue;
        }
        if (rest) s = ca_st_parts_add_rest(parts[i], files[i]);
        if (s == CA_OK) s = ca_st_parts_sums(parts[i], files[i]->path, *sums + at);
        at += files[i]->sums.nchunks;
    }
    return s;
}

/* The count sums of every rank of c, rank after rank, into all (count x size of c). Collective over c. */
static ca_status tp_gather_sums(ca_accelerator *acc, ca_comm *c, const uint32_t *sums, size_t count, uint32_t *all) {
    ca_status x = CA_OK;
    CA_SCOPE {
        int64_t n1 = (int64_t)count, nall = n1 * ca_comm_size(c);
        ca_tensor *mine = ca_from_host(acc->device, CA_I32, 1, &n1, sums);
        ca_tensor *recv = ca_zeros(acc->device, CA_I32, 1, &nall);
        x = mine && recv ? CA_OK : ca_last_status();
        if (x == CA_OK) x = ca_comm_all_gather(c, ca_tptr(mine), ca_tptr(recv), count, CA_I32, NULL);
        if (x == CA_OK) x = ca_tensor_to_host(recv, all, (size_t)nall * sizeof *all);
    }
    return x == CA_OK ? CA_OK : ca_error_context("load: exchanging the sums of the slices read (rank %d)", acc->rank);
}

ca_status ca_tp_verify_parts(ca_accelerator *acc, ca_st_file *const *files, ca_st_parts *const *parts, int n,
                             ca_comm *dp) {
    uint32_t *sums = NULL;
    size_t count = 0;
    bool rest = acc->mesh->coord[CA_MESH_TP] == 0 && (!dp || ca_comm_rank(dp) == 0);
    ca_status s = tp_local_sums(acc, files, parts, n, rest, &sums, &count);   /* a failure here still takes part */
    int tp = acc->mesh->shape.size[CA_MESH_TP], d = dp ? ca_comm_size(dp) : 1;
    size_t rows = (size_t)(tp > d ? tp : d);
    uint32_t *all = malloc(count * rows * sizeof *all + 1), *one = malloc(count * (size_t)tp * sizeof *one + 1);
    ca_status x = sums && all && one ? CA_OK : ca_error(CA_ERR_NOMEM, "load: out of host memory (rank %d)", acc->rank);
    /* the dp group's sums first, XORed into one row (its ranks read disjoint parts of its tp slices),
     * then the tp group's rows: tp x d processes' parts of each chunk */
    if (x == CA_OK && count && d > 1) {
        x = tp_gather_sums(acc, dp, sums, count, all);
        for (int r = 1; x == CA_OK && r < d; r++)
            for (size_t c = 0; c < count; c++) all[c] ^= all[(size_t)r * count + c];
        if (x == CA_OK) memcpy(sums, all, count * sizeof *sums);
    }
    if (x == CA_OK && count) x = tp_gather_sums(acc, acc->mesh->comm[CA_MESH_TP], sums, count, all);
    if (s == CA_OK) s = x;
    size_t at = 0;
    for (int i = 0; s == CA_OK && i < n; i++) {
        if (!parts[i]) continue;
        size_t nc = files[i]->sums.nchunks;   /* this file's rows, one per tp rank */
        for (int r = 0; r < tp; r++) memcpy(one + (size_t)r * nc, all + (size_t)r * count + at, nc * sizeof *one);
        s = ca_st_parts_verify(files[i], one, tp, tp * d);
        at += nc;
    }
    free(one);
    free(all);
    free(sums);
    return s;
}
