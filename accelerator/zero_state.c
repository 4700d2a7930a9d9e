/* Sharded state dicts (fsdp_state_dict_type SHARDED_STATE_DICT) of sharded data parallelism: each rank
 * writes its shard of the flat parameters and of the optimizer state, zero_shard_<k>.safetensors,
 * and rank 0 an index, zero_index.json, of where each parameter lies in the flat index space.
 * Under tensor parallelism each tp rank's flat space holds its slices (the same layout on every tp rank:
 * the plan splits evenly): file k = tp rank x world_size + shard, and the index adds tp_size and each
 * parameter's split_dim (-1: whole) and parts (fused blocks), which is what reassembles the whole tensors.
 * ca_merge_weights turns such a checkpoint into one model.safetensors. */
#include "accelerator/accelerator_impl.h"
#include "accelerator/checkpoint_impl.h"
#include "accelerator/mesh_impl.h"
#include "tensor/safetensors_impl.h"
#include "core/json_impl.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ZS_INDEX CA_ZERO_INDEX
#define ZS_FORMAT "caccel-zero-shards"

static void shard_name(char *buf, size_t size, const char *dir, int rank) {
    snprintf(buf, size, "%s/" CA_ZERO_SHARD_FMT, dir, rank);
}

static int tp_rank(const ca_accelerator *acc) { return acc->mesh ? acc->mesh->coord[CA_MESH_TP] : 0; }
static int tp_size(const ca_accelerator *acc) { return acc->mesh ? acc->mesh->shape.size[CA_MESH_TP] : 1; }

/* This rank's parameter shard, on the host (padding zero): packed on the device, copied once. */
static ca_status params_to_host(ca_accelerator *acc, float *out) {
    ca_zero *z = &acc->zero;
    ca_tensor *tmp = ca_tensor_keep(ca_zeros(acc->device, CA_F32, 1, &z->shard));
    if (!tmp) return ca_last_status();
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && i < z->nsegs; i++) {
        const ca_zero_seg *sg = &z->segs[i];
        int64_t shape[1] = {sg->n}, st[1] = {1};
        s = CA_KCALL(acc->device, copy_strided, .dt = CA_F32, .ndim = 1, .shape = shape,
                     .x = (float *)ca_tptr(sg->param) + sg->poff, .x_stride = st,
                     .y = (float *)ca_tptr(tmp) + sg->soff, .y_stride = st);
    }
    if (s == CA_OK) s = ca_tensor_to_host(tmp, out, (size_t)z->shard * sizeof *out);
    ca_tensor_free(tmp);
    return s;
}

static ca_status write_index(ca_accelerator *acc, const char *dir) {
    ca_zero *z = &acc->zero;
    json_object *root = json_object_new_object(), *params = json_object_new_array();
    json_object_object_add(root, "format", json_object_new_string(ZS_FORMAT));
    json_object_object_add(root, "world_size", json_object_new_int(z->world));
    json_object_object_add(root, "tp_size", json_object_new_int(tp_size(acc)));
    json_object_object_add(root, "shard", json_object_new_int64(z->shard));
    json_object_object_add(root, "numel", json_object_new_int64(z->numel));
    for (int i = 0; i < z->nparams; i++) {
        json_object *p = json_object_new_object(), *shape = json_object_new_array();
        for (int d = 0; d < z->params[i]->ndim; d++) json_object_array_add(shape, json_object_new_int64(z->params[i]->shape[d]));
        json_object_object_add(p, "name", json_object_new_string(acc->zero.names[i]));
        json_object_object_add(p, "shape", shape);
        json_object_object_add(p, "offset", json_object_new_int64(z->off[i]));
        int dim, parts;
        ca_status s = ca_tp_param_split(acc, z->params[i], &dim, &parts);
        if (s != CA_OK) {
            json_object_put(p);
            json_object_put(params);
            json_object_put(root);
            return s;
        }
        if (dim >= 0) {
            json_object_object_add(p, "split_dim", json_object_new_int(dim));
            json_object_object_add(p, "parts", json_object_new_int(parts));
        }
        json_object_array_add(params, p);
    }
    json_object_object_add(root, "params", params);
    const char *text = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/" ZS_INDEX, dir);
    const void *parts[1] = {text};
    size_t lens[1] = {strlen(text)};
    ca_status s = ca_st_write_atomic(path, parts, lens, 1);
    json_object_put(root);
    return s;
}

/* A state buffer as the shard file holds it: shard-sized, zeros where frozen parameters lie. */
static ca_status state_to_host(ca_accelerator *acc, ca_tensor *st, float *out) {
    ca_tensor *full = ca_zero_state_unpack(acc, st);
    if (!full) return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_NOMEM, "out of memory");
    ca_status s = ca_tensor_to_host(full, out, (size_t)acc->zero.shard * sizeof *out);
    if (full != st) ca_tensor_free(full);
    return s;
}

static ca_status state_from_host(ca_accelerator *acc, ca_tensor *st, const void *data, size_t bytes) {
    ca_tensor *full = ca_zero_state_unpack(acc, st);
    if (!full) return ca_last_status() ? ca_last_status() : ca_error(CA_ERR_NOMEM, "out of memory");
    ca_status s = ca_tensor_copy_from_host(full, data, bytes);
    if (s == CA_OK && full != st) s = ca_zero_state_pack(acc, full, st);
    if (full != st) ca_tensor_free(full);
    return s;
}

ca_status ca_zero_save_shard(ca_accelerator *acc, const char *dir) {
    ca_zero *z = &acc->zero;
    if (acc->model && z->nparams != ca_module_num_params(acc->model))   /* stages 1, 2: frozen ones not in it */
        return ca_error(CA_ERR_UNSUPPORTED, "save_state: fsdp_state_dict_type %s under stage %d shards the "
                        "trainable parameters only; %d of the model's %d are frozen (requires_grad false): use "
                        "FULL_STATE_DICT (rank %d)", ca_config_get(acc->cfg, "fsdp_config.fsdp_state_dict_type"),
                        z->stage, ca_module_num_params(acc->model) - z->nparams, ca_module_num_params(acc->model),
                        acc->rank);
    if (z->rep && ca_comm_rank(z->rep) != 0) return CA_OK;   /* HYBRID_SHARD: the first group writes; the
                                                              * others hold copies */
    float *buf = malloc((size_t)z->shard * 3 * sizeof *buf);
    if (!buf) return ca_error(CA_ERR_NOMEM, "out of host memory");
    ca_st_tensor t[3];
    int n = 0;
    ca_status s = params_to_host(acc, buf);
    t[n++] = (ca_st_tensor){.name = "params", .dtype = CA_F32, .ndim = 1, .shape = &z->shard, .data = buf};
    if (s == CA_OK && z->s1) {
        s = state_to_host(acc, z->s1, buf + z->shard);
        t[n++] = (ca_st_tensor){.name = "state1", .dtype = CA_F32, .ndim = 1, .shape = &z->shard, .data = buf + z->shard};
    }
    if (s == CA_OK && z->s2) {
        s = state_to_host(acc, z->s2, buf + 2 * z->shard);
        t[n++] = (ca_st_tensor){.name = "state2", .dtype = CA_F32, .ndim = 1, .shape = &z->shard,
                                .data = buf + 2 * z->shard};
    }
    char path[PATH_MAX];
    shard_name(path, sizeof path, dir, tp_rank(acc) * z->world + z->rank);
    if (s == CA_OK) s = ca_st_write(path, t, n);
    free(buf);
    if (s == CA_OK && acc->rank == 0) s = write_index(acc, dir);
    return s;
}

/* ------------------------------------------------------------------ reading */

/* A FULL_STATE_DICT load reads, of each parameter's optimizer state, the slice scatter_state keeps. */
void ca_zero_state_slice(const ca_accelerator *acc, const ca_tensor *param, int64_t *off, int64_t *n) {
    const ca_zero *z = &acc->zero;
    *off = *n = 0;
    for (int i = 0; i < z->nsegs; i++)
        if (z->segs[i].param == param) {
            *off = z->segs[i].poff;
            *n = z->segs[i].n;
            return;
        }
}

typedef struct zs_index {
    char path[PATH_MAX];         /* dir/zero_index.json, for the messages */
    json_object *root;
    int world, tp;               /* shards per tp rank, tp ranks: world x tp files */
    int64_t shard, numel;        /* world * shard * sizeof(float) fits in an int64_t */
    json_object *params;
} zs_index;

/* The integer `key` of o, from lo to hi. Errors name the file, the place in it (`at`: "" or
 * "params[3] ('fc.weight'): ") and the key. */
static ca_status zs_int(const char *path, const char *at, json_object *o, const char *key, int64_t lo, int64_t hi,
                        int64_t *out) {
    json_object *v = NULL;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_int))
        return ca_error(CA_ERR_IO, "%s: %skey \"%s\" is missing or not an integer", path, at, key);
    *out = json_object_get_int64(v);   /* json-c saturates larger numbers at INT64_MAX */
    if (*out < lo || *out > hi)
        return ca_error(CA_ERR_IO, "%s: %skey \"%s\" is %lld, outside %lld to %lld", path, at, key, (long long)*out,
                        (long long)lo, (long long)hi);
    return CA_OK;
}

/* The index, every top-level field checked: the sizes it gives are allocated and multiplied later. */
static ca_status read_index(const char *dir, zs_index *ix) {
    memset(ix, 0, sizeof *ix);
    snprintf(ix->path, sizeof ix->path, "%s/" ZS_INDEX, dir);
    const char *path = ix->path;
    char why[256];
    ca_status rs;
    ix->root = ca_json_load(path, CA_FILE_CHECKPOINT_JSON, why, sizeof why, &rs);
    if (!ix->root)
        return why[0] ? ca_error(CA_ERR_IO, "%s: cannot read the sharded-checkpoint index: %s", path, why) : rs;
    if (!json_object_is_type(ix->root, json_type_object))
        return ca_error(CA_ERR_IO, "%s: not a sharded-checkpoint index: not a JSON object", path);
    json_object *fmt = NULL;
    if (!json_object_object_get_ex(ix->root, "format", &fmt) || !json_object_is_type(fmt, json_type_string) ||
        strcmp(json_object_get_string(fmt), ZS_FORMAT) != 0)
        return ca_error(CA_ERR_IO, "%s: key \"format\" is not \"" ZS_FORMAT "\": not a sharded-checkpoint index", path);
    int64_t world = 0;
    ca_status s = zs_int(path, "", ix->root, "world_size", 1, INT_MAX, &world);
    int64_t tp = 1;   /* absent: saved without tensor parallelism */
    if (s == CA_OK && json_object_object_get_ex(ix->root, "tp_size", NULL))
        s = zs_int(path, "", ix->root, "tp_size", 1, INT_MAX / world, &tp);
    world *= tp;   /* below: every file's shard, together */
    if (s == CA_OK) s = zs_int(path, "", ix->root, "shard", 1, INT64_MAX, &ix->shard);
    if (s == CA_OK && ix->shard > INT64_MAX / (int64_t)sizeof(float) / world)
        s = ca_error(CA_ERR_IO, "%s: key \"shard\" (%lld) times key \"world_size\" (%lld) parameters overflow a "
                     "64-bit byte count", path, (long long)ix->shard, (long long)world);
    if (s == CA_OK) s = zs_int(path, "", ix->root, "numel", 0, ix->shard * (world / tp), &ix->numel);
    if (s == CA_OK && (!json_object_object_get_ex(ix->root, "params", &ix->params) ||
                       !json_object_is_type(ix->params, json_type_array)))
        s = ca_error(CA_ERR_IO, "%s: key \"params\" is missing or not an array", path);
    ix->world = (int)(world / tp);
    ix->tp = (int)tp;
    return s;
}

/* Every shard file exists and can hold its `shard` floats before world * shard of them are
 * allocated: the index's numbers size nothing that the files do not back. */
static ca_status check_shard_files(const char *dir, const zs_index *ix) {
    for (int r = 0; r < ix->world * ix->tp; r++) {
        char path[PATH_MAX];
        struct stat st;
        shard_name(path, sizeof path, dir, r);
        if (stat(path, &st) != 0)
            return ca_error(errno == ENOENT ? CA_ERR_NOT_FOUND : CA_ERR_IO, "%s: %s (%s: key \"world_size\" is %d)",
                            path, strerror(errno), ix->path, ix->world);
        if ((uint64_t)st.st_size < (uint64_t)ix->shard * sizeof(float))
            return ca_error(CA_ERR_IO, "%s: %lld bytes, too few for a shard of %lld parameters (%s: key \"shard\")",
                            path, (long long)st.st_size, (long long)ix->shard, ix->path);
    }
    return CA_OK;
}

/* Every rank's parameter shard concatenated: the flat parameters [tp][world * shard] (each tp rank's). */
static ca_status read_all_params(const char *dir, const zs_index *ix, float **out) {
    ca_status s = check_shard_files(dir, ix);
    size_t files = (size_t)ix->world * (size_t)ix->tp;
    float *flat = s == CA_OK ? calloc((size_t)ix->shard * files, sizeof *flat) : NULL;
    if (s == CA_OK && !flat) s = ca_error(CA_ERR_NOMEM, "out of host memory");
    for (int r = 0; s == CA_OK && r < (int)files; r++) {
        char path[PATH_MAX];
        ca_st_file f = {0};
        shard_name(path, sizeof path, dir, r);
        s = ca_st_open(path, &f);
        const ca_st_entry *e = s == CA_OK ? ca_st_find(&f, "params") : NULL;
        if (s == CA_OK && (!e || e->dtype != CA_F32 || e->end - e->begin != (uint64_t)ix->shard * sizeof(float)))
            s = ca_error(CA_ERR_IO, "%s: no f32 tensor 'params' of %lld elements", path, (long long)ix->shard);
        if (s == CA_OK) memcpy(flat + (size_t)r * (size_t)ix->shard, ca_st_data(&f, e), (size_t)ix->shard * sizeof *flat);
        ca_st_close(&f);
    }
    if (s != CA_OK) free(flat);
    else *out = flat;
    return s;
}

/* ------------------------------------------------------------------ merge-weights */

/* The element count of a shape (0 when a dimension is 0, whatever the others); false when it
 * overflows an int64_t. */
static bool shape_numel(const int64_t *shape, int nd, int64_t *numel) {
    *numel = 0;
    for (int d = 0; d < nd; d++)
        if (shape[d] == 0) return true;
    int64_t n = 1;
    for (int d = 0; d < nd; d++) {
        if (n > INT64_MAX / shape[d]) return false;
        n *= shape[d];
    }
    *numel = n;
    return true;
}

/* The shape of params[i] into shape; at names the entry for the messages. */
static ca_status merge_shape(const zs_index *ix, const char *at, json_object *p, int64_t *shape, int *nd) {
    json_object *js = NULL;
    if (!json_object_object_get_ex(p, "shape", &js) || !json_object_is_type(js, json_type_array))
        return ca_error(CA_ERR_IO, "%s: %skey \"shape\" is missing or not an array", ix->path, at);
    size_t n = json_object_array_length(js);
    if (n > CA_MAX_DIMS)
        return ca_error(CA_ERR_IO, "%s: %skey \"shape\" has %zu dimensions, at most %d", ix->path, at, n, CA_MAX_DIMS);
    for (size_t d = 0; d < n; d++) {
        json_object *v = json_object_array_get_idx(js, d);
        if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0)
            return ca_error(CA_ERR_IO, "%s: %skey \"shape\": dimension %zu is %s, not a size", ix->path, at, d,
                            json_object_to_json_string(v));
        shape[d] = json_object_get_int64(v);
    }
    *nd = (int)n;
    return CA_OK;
}

/* How params[i] (shape: its slice's, nd dimensions) was split over the index's tp ranks: *dim -1 (whole
 * on every tp rank, or no tp) or a dimension, in *parts blocks that each tp rank holds part of. */
static ca_status zs_split(const zs_index *ix, const char *at, json_object *p, const int64_t *shape, int nd, int *dim,
                          int *parts) {
    int64_t d = -1, k = 1;
    ca_status s = CA_OK;
    if (json_object_object_get_ex(p, "split_dim", NULL)) s = zs_int(ix->path, at, p, "split_dim", 0, nd - 1, &d);
    if (s == CA_OK && d >= 0) s = zs_int(ix->path, at, p, "parts", 1, shape[d] > 0 ? shape[d] : 1, &k);
    if (s == CA_OK && d >= 0 && shape[d] % k)
        s = ca_error(CA_ERR_IO, "%s: %skey \"parts\" (%lld) does not divide dimension %lld of its shape (%lld)",
                     ix->path, at, (long long)k, (long long)d, (long long)shape[d]);
    *dim = (int)d;
    *parts = (int)k;
    return s;
}

/* params[i] of the index as a tensor of the merged file: a name, a shape of at most CA_MAX_DIMS
 * sizes (a tp rank's slice), and an offset such that its elements lie inside the numel flat parameters
 * (*off); with its split (zs_split) where dim is not NULL. */
static ca_status merge_param(const zs_index *ix, int i, ca_st_tensor *t, int64_t *shape, int64_t *off, int *dim,
                             int *parts) {
    json_object *p = json_object_array_get_idx(ix->params, (size_t)i), *jn = NULL;
    char at[300];
    if (!json_object_is_type(p, json_type_object))
        return ca_error(CA_ERR_IO, "%s: params[%d] is not an object", ix->path, i);
    const char *name = json_object_object_get_ex(p, "name", &jn) && json_object_is_type(jn, json_type_string)
                       ? json_object_get_string(jn) : NULL;
    if (!name || !name[0] || strlen(name) != (size_t)json_object_get_string_len(jn))
        return ca_error(CA_ERR_IO, "%s: params[%d]: key \"name\" is missing or not a tensor name", ix->path, i);
    snprintf(at, sizeof at, "params[%d] ('%.200s'): ", i, name);
    int nd = 0;
    int64_t numel = 0;
    ca_status s = merge_shape(ix, at, p, shape, &nd);
    if (s == CA_OK && !shape_numel(shape, nd, &numel))
        s = ca_error(CA_ERR_IO, "%s: %skey \"shape\": the element count overflows 64 bits", ix->path, at);
    if (s == CA_OK) s = zs_int(ix->path, at, p, "offset", 0, INT64_MAX, off);
    if (s == CA_OK && (numel > ix->numel || *off > ix->numel - numel))
        s = ca_error(CA_ERR_IO, "%s: %s%lld elements at key \"offset\" %lld lie outside the %lld parameters (key "
                     "\"numel\")", ix->path, at, (long long)numel, (long long)*off, (long long)ix->numel);
    if (s == CA_OK && dim) s = zs_split(ix, at, p, shape, nd, dim, parts);
    *t = (ca_st_tensor){.name = name, .dtype = CA_F32, .ndim = nd, .shape = shape};
    return s;
}

/* Tensor parallelism's slices of a tensor split along dim in `parts` blocks: each tp rank's slice is
 * outer x parts runs of `run` elements; run b of rank r lies at (b tp + r) run of the whole tensor. */
static int64_t tp_outer(const int64_t *shape, int dim) {
    int64_t o = 1;
    for (int d = 0; d < dim; d++) o *= shape[d];
    return o;
}

/* whole (the whole tensor, nd dims of shape `whole_shape`) from tp slices (rank r's at slices + r n, each
 * of n elements), or (cut) rank r's slice of it into slices + r n. */
static void tp_runs(const int64_t *whole_shape, int nd, int dim, int parts, int tp, int r, float *whole, float *slice,
                    bool cut) {
    int64_t inner = 1;
    for (int d = dim + 1; d < nd; d++) inner *= whole_shape[d];
    int64_t run = whole_shape[dim] / tp / parts * inner, blocks = tp_outer(whole_shape, dim) * parts;
    for (int64_t b = 0; b < blocks; b++) {
        float *w = whole + (b * tp + r) * run, *sl = slice + b * run;
        memcpy(cut ? sl : w, cut ? w : sl, (size_t)run * sizeof *w);
    }
}

/* One parameter as the index lists it: its slice's shape and place in a tp rank's flat space, its split. */
typedef struct zs_param {
    int64_t shape[CA_MAX_DIMS], whole[CA_MAX_DIMS], off, numel;   /* numel: the slice's */
    int nd, dim, parts;
} zs_param;

static ca_status zs_param_at(const zs_index *ix, int i, ca_st_tensor *t, zs_param *q) {
    ca_status s = merge_param(ix, i, t, q->shape, &q->off, &q->dim, &q->parts);
    q->nd = t->ndim;
    memcpy(q->whole, q->shape, sizeof q->whole);
    if (s == CA_OK && q->dim >= 0 && q->whole[q->dim] > INT64_MAX / ix->tp)
        s = ca_error(CA_ERR_IO, "%s: params[%d] ('%s'): key \"shape\" times key \"tp_size\" overflows", ix->path, i,
                     t->name);
    if (s == CA_OK && q->dim >= 0) q->whole[q->dim] *= ix->tp;
    if (s == CA_OK) shape_numel(q->shape, q->nd, &q->numel);
    return s;
}

/* The whole tensor of q into out from every tp rank's flat space (blocks: tp of `stride` elements). */
static ca_status zs_whole(const zs_index *ix, const zs_param *q, const float *blocks, int64_t stride, float *out) {
    if (q->dim < 0 || ix->tp == 1) {
        memcpy(out, blocks + q->off, (size_t)q->numel * sizeof *out);
        return CA_OK;
    }
    float *all = malloc((size_t)(q->numel ? q->numel : 1) * (size_t)ix->tp * sizeof *all);
    if (!all) return ca_error(CA_ERR_NOMEM, "out of host memory");
    for (int r = 0; r < ix->tp; r++) memcpy(all + r * q->numel, blocks + r * stride + q->off, (size_t)q->numel * sizeof *all);
    for (int r = 0; r < ix->tp; r++) tp_runs(q->whole, q->nd, q->dim, q->parts, ix->tp, r, out, all + r * q->numel, false);
    free(all);
    return CA_OK;
}

/* out/model.safetensors. A directory this call made is removed again when the write fails, so a
 * failed merge leaves nothing behind (the file itself is written to a temporary name and renamed). */
static ca_status write_merged(const zs_index *ix, const char *out, const ca_st_tensor *t, int n) {
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/model.safetensors", out) >= sizeof path)
        return ca_error(CA_ERR_INVALID, "merge_weights: %s/model.safetensors: path too long", out);
    bool made = mkdir(out, 0777) == 0;
    if (!made && errno != EEXIST) return ca_error(CA_ERR_IO, "merge_weights: %s: %s", out, strerror(errno));
    ca_status s = ca_st_write(path, t, n);
    if (s == CA_ERR_INVALID) ca_error_context("merge_weights: %s", ix->path);   /* a name given twice */
    if (s != CA_OK && made) rmdir(out);
    return s;
}

/* The checkpoint is checked as load_state checks it (complete.json, every file's size and CRC-32)
 * and every field of the index before anything is allocated from it or written. */
ca_status ca_merge_weights(const char *dir, const char *out) {
    if (!dir || !out) return ca_error(CA_ERR_INVALID, "merge_weights: a checkpoint directory and an output are required");
    zs_index ix = {0};
    float *flat = NULL, *whole = NULL;
    ca_st_tensor *t = NULL;
    zs_param *q = NULL;
    ca_status s = ca_state_check_files("merge_weights", dir);
    if (s == CA_OK) s = read_index(dir, &ix);
    int n = s == CA_OK ? (int)json_object_array_length(ix.params) : 0;
    if (s == CA_OK && (!(t = calloc((size_t)n + 1, sizeof *t)) || !(q = calloc((size_t)n + 1, sizeof *q))))
        s = ca_error(CA_ERR_NOMEM, "out of host memory");
    int64_t total = 0;   /* the whole tensors' elements (tp > 1: the slices reassembled) */
    for (int i = 0; s == CA_OK && i < n; i++) {
        s = zs_param_at(&ix, i, &t[i], &q[i]);
        t[i].shape = q[i].whole;
        total += q[i].dim >= 0 ? q[i].numel * ix.tp : q[i].numel;
    }
    if (s == CA_OK) s = read_all_params(dir, &ix, &flat);
    if (s == CA_OK && ix.tp > 1 && !(whole = malloc((size_t)(total ? total : 1) * sizeof *whole)))
        s = ca_error(CA_ERR_NOMEM, "out of host memory");
    int64_t at = 0;
    for (int i = 0; s == CA_OK && i < n; i++) {
        if (ix.tp == 1) {
            t[i].data = flat + q[i].off;
            continue;
        }
        s = zs_whole(&ix, &q[i], flat, (int64_t)ix.world * ix.shard, whole + at);
        t[i].data = whole + at;
        at += q[i].dim >= 0 ? q[i].numel * ix.tp : q[i].numel;
    }
    if (s == CA_OK) s = write_merged(&ix, out, t, n);
    free(t);
    free(q);
    free(flat);
    free(whole);
    json_object_put(ix.root);
    return s;
}

/* ------------------------------------------------------------------ loading at any world size */

/* The flat index space is the same at every world size and stage (parameters back to back in the
 * model's order, zero_index.json's offsets; only the padding at its end, up to world * shard,
 * differs), so a checkpoint of W shards of S loads into a run of N shards of S' by position: old
 * shard k holds elements [k S, (k + 1) S), this rank's new shard [rank S', (rank + 1) S'). The check
 * reads what this rank needs into host buffers, the load only copies them to the device: a refusal
 * on any rank leaves every rank's run as it was. */
struct ca_zero_load {
    int world;                   /* the checkpoint's shard count */
    bool lean;                   /* stage 3 (ca_zero3_loads_lean): flat is this rank's new shard only
                                  * (a FULL_STATE_DICT load's state buffers: flat NULL) */
    float *flat;                 /* [numel] every parameter (stages 1, 2 hold them whole), or lean [shard]
                                  * the parameters of this rank's new shard, its padding zero */
    float *st[2];                /* [shard] state1, state2 over this rank's new shard (NULL: not kept) */
};

static const char *const zs_state[2] = {"state1", "state2"};
static const char *const zs_state_what[2] = {"exp_avg or momentum_buffer", "exp_avg_sq"};

void ca_zero_load_free(ca_accelerator *acc) {
    struct ca_zero_load *L = acc->zero.load;
    if (!L) return;
    free(L->flat);
    free(L->st[0]);
    free(L->st[1]);
    free(L);
    acc->zero.load = NULL;
}

int ca_zero_load_shards(const ca_accelerator *acc) {
    return acc->zero.load ? acc->zero.load->world : acc->zero.world;
}

static void shape_text(char *buf, size_t size, const int64_t *shape, int nd) {
    size_t k = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < nd && k < size; d++)
        k += (size_t)snprintf(buf + k, size - k, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (k < size) snprintf(buf + k, size - k, "]");
}

/* params[i] of the index (checked as merge-weights checks it) is the model's i-th sharded parameter:
 * the same name, shape and offset. */
static ca_status check_param(ca_accelerator *acc, const zs_index *ix, int i) {
    const ca_zero *z = &acc->zero;
    ca_st_tensor t;
    int64_t shape[CA_MAX_DIMS], off = 0;
    ca_status s = merge_param(ix, i, &t, shape, &off, NULL, NULL);
    if (s != CA_OK) return s;
    const ca_tensor *p = z->params[i];
    bool same = strcmp(t.name, z->names[i]) == 0 && off == z->off[i] && t.ndim == p->ndim;
    for (int d = 0; same && d < t.ndim; d++) same = shape[d] == p->shape[d];
    if (same) return CA_OK;
    char was[160], is[160];
    shape_text(was, sizeof was, shape, t.ndim);
    shape_text(is, sizeof is, p->shape, p->ndim);
    return ca_error(CA_ERR_INVALID, "load_state: %s: params[%d] is '%s' of shape %s at offset %lld, the model's "
                    "parameter %d is '%s' of shape %s at offset %lld", ix->path, i, t.name, was, (long long)off, i,
                    z->names[i], is, (long long)z->off[i]);
}

/* Parameter by parameter first, so that a model of another size is named by its first parameter
 * that differs; then the counts (a parameter more or less at the end). */
static ca_status check_index_params(ca_accelerator *acc, const zs_index *ix) {
    const ca_zero *z = &acc->zero;
    int n = (int)json_object_array_length(ix->params);
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && i < n && i < z->nparams; i++) s = check_param(acc, ix, i);
    if (s == CA_OK && (ix->numel != z->numel || n != z->nparams))
        s = ca_error(CA_ERR_INVALID, "load_state: %s: %lld parameters in %d tensors, the model shards %lld in %d "
                     "(stages 1 and 2 shard the trainable parameters, stage 3 every one)", ix->path,
                     (long long)ix->numel, n, (long long)z->numel, z->nparams);
    return s;
}

/* Tensor `name` of an old shard file: absent (*e NULL), or f32 of the index's `shard` elements. */
static ca_status shard_entry(const ca_st_file *f, const zs_index *ix, const char *name, const ca_st_entry **e) {
    *e = ca_st_find(f, name);
    if (*e && ((*e)->dtype != CA_F32 || (*e)->end - (*e)->begin != (uint64_t)ix->shard * sizeof(float)))
        return ca_error(CA_ERR_IO, "%s: tensor '%s' is not f32 of %lld elements (%s: key \"shard\")", f->path, name,
                        (long long)ix->shard, ix->path);
    return CA_OK;
}

/* The old file's optimizer state k against this run's optimizer: both keep it or neither does. */
static ca_status check_state_kind(const ca_st_file *f, int k, bool kept, bool saved) {
    if (kept && !saved)
        return ca_error(CA_ERR_INVALID, "load_state: %s: no optimizer state '%s' (%s), which this run's optimizer "
                        "keeps: the checkpoint's optimizer is of another kind", f->path, zs_state[k], zs_state_what[k]);
    if (!kept && saved)
        return ca_error(CA_ERR_INVALID, "load_state: %s: optimizer state '%s' (%s), which this run's optimizer does "
                        "not keep: the checkpoint's optimizer is of another kind", f->path, zs_state[k],
                        zs_state_what[k]);
    return CA_OK;
}

/* Elements [from, from + n) of tensor e of f into out, read with pread (the file's pages are not mapped
 * into the rank) and verified (complete.json's chunk sums: only the chunks they lie in). */
static ca_status read_range(ca_st_file *f, const ca_st_entry *e, int64_t from, int64_t n, float *out) {
    if (n <= 0) return CA_OK;
    return ca_st_read_range(f, f->data_start + e->begin + (uint64_t)from * sizeof(float), (uint64_t)n * sizeof(float), out);
}

/* Old shard k: its parameters into L->flat (lean: only the part that overlaps this rank's new
 * shard), and of its optimizer state the part that overlaps into L->st. Only those byte ranges (and
 * the header) are verified and read: of another rank's shard file, the parameters (lean: none but
 * the overlap) and the state slices that fall in this rank's shard. */
static ca_status read_old_shard(ca_accelerator *acc, const ca_state_files *files, const zs_index *ix, int k,
                                struct ca_zero_load *L) {
    const ca_zero *z = &acc->zero;
    char name[64];
    ca_st_file f = {0};
    snprintf(name, sizeof name, CA_ZERO_SHARD_FMT, tp_rank(acc) * ix->world + k);   /* this tp rank's */
    int64_t ob = (int64_t)k * ix->shard, oe = ob + ix->shard < ix->numel ? ob + ix->shard : ix->numel;
    int64_t nb = (int64_t)z->rank * z->shard, ne = nb + z->shard < z->numel ? nb + z->shard : z->numel;
    int64_t b = ob > nb ? ob : nb, t = oe < ne ? oe : ne;   /* the overlap, empty when t <= b */
    const ca_st_entry *e = NULL;
    ca_status s = ca_state_open_file(files, name, false, &f);
    if (s == CA_OK) s = shard_entry(&f, ix, "params", &e);
    if (s == CA_OK && !e) s = ca_error(CA_ERR_IO, "%s: no tensor 'params' (a shard of the flat parameters)", f.path);
    if (s == CA_OK) s = L->lean ? read_range(&f, e, b - ob, t - b, L->flat + (b - nb)) : read_range(&f, e, 0, oe - ob, L->flat + ob);
    for (int j = 0; s == CA_OK && j < 2; j++) {
        s = shard_entry(&f, ix, zs_state[j], &e);
        if (s == CA_OK) s = check_state_kind(&f, j, L->st[j] != NULL, e != NULL);
        if (s == CA_OK && L->st[j]) s = read_range(&f, e, b - ob, t - b, L->st[j] + (b - nb));
    }
    ca_st_close(&f);
    return s;
}

/* ---- a checkpoint of another tp size (tp 1 either side included) */

/* Tensor j (-1: "params", else zs_state[j]) of every file whole into out [tp][world * shard] (file k at
 * k shard); a state this run does not keep (kept false) only checked absent. */
static ca_status read_kind(const ca_state_files *files, const zs_index *ix, int j, bool kept, float *out) {
    ca_status s = CA_OK;
    for (int k = 0; s == CA_OK && k < ix->world * ix->tp; k++) {
        char name[64];
        ca_st_file f = {0};
        const ca_st_entry *e = NULL;
        snprintf(name, sizeof name, CA_ZERO_SHARD_FMT, k);
        s = ca_state_open_file(files, name, false, &f);
        if (s == CA_OK) s = shard_entry(&f, ix, j < 0 ? "params" : zs_state[j], &e);
        if (s == CA_OK && j < 0 && !e) s = ca_error(CA_ERR_IO, "%s: no tensor 'params' (a shard of the flat parameters)", f.path);
        if (s == CA_OK && j >= 0) s = check_state_kind(&f, j, kept, e != NULL);
        if (s == CA_OK && (j < 0 || kept)) s = read_range(&f, e, 0, ix->shard, out + (int64_t)k * ix->shard);
        ca_st_close(&f);
    }
    return s;
}

/* The index's parameters against this run's: the same names in the same order and the same whole shapes
 * (each side's slice times its tp size along its split dimension). */
static ca_status match_other_tp(ca_accelerator *acc, const zs_index *ix, zs_param *q) {
    const ca_zero *z = &acc->zero;
    int n = (int)json_object_array_length(ix->params);
    if (n != z->nparams)
        return ca_error(CA_ERR_INVALID, "load_state: %s: %d tensors, the model shards %d (stages 1 and 2 shard the "
                        "trainable parameters, stage 3 every one)", ix->path, n, z->nparams);
    for (int i = 0; i < n; i++) {
        ca_st_tensor t;
        int d, k;
        ca_status s = zs_param_at(ix, i, &t, &q[i]);
        if (s == CA_OK) s = ca_tp_param_split(acc, z->params[i], &d, &k);
        if (s != CA_OK) return s;
        const ca_tensor *p = z->params[i];
        bool same = strcmp(t.name, z->names[i]) == 0 && t.ndim == p->ndim;
        for (int a = 0; same && a < p->ndim; a++) same = q[i].whole[a] == p->shape[a] * (a == d ? tp_size(acc) : 1);
        if (same) continue;
        char was[160], is[160];
        shape_text(was, sizeof was, q[i].whole, t.ndim);
        shape_text(is, sizeof is, p->shape, p->ndim);
        return ca_error(CA_ERR_INVALID, "load_state: %s: params[%d] is '%s' of whole shape %s (tp_size %d), the "
                        "model's parameter %d is '%s' with slice %s at tp %d", ix->path, i, t.name, was, ix->tp, i,
                        z->names[i], is, tp_size(acc));
    }
    return CA_OK;
}

/* This run's flat space (its tp rank's slices, at z->off) from every tp rank's flat space of the
 * checkpoint (blocks), through each whole tensor; whole: a buffer of the largest one. */
static ca_status cut_mine(ca_accelerator *acc, const zs_index *ix, const zs_param *q, const float *blocks, float *whole,
                          float *flat) {
    const ca_zero *z = &acc->zero;
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && i < z->nparams; i++) {
        int d, k;
        s = zs_whole(ix, &q[i], blocks, (int64_t)ix->world * ix->shard, whole);
        if (s == CA_OK) s = ca_tp_param_split(acc, z->params[i], &d, &k);
        if (s == CA_OK && d < 0) memcpy(flat + z->off[i], whole, (size_t)z->params[i]->numel * sizeof *flat);
        else if (s == CA_OK) tp_runs(q[i].whole, q[i].nd, d, k, tp_size(acc), tp_rank(acc), whole, flat + z->off[i], true);
    }
    return s;
}

/* Elements [rank shard, + shard) of this run's flat space (n: its numel) into out, the padding zero. */
static void my_shard(const ca_zero *z, const float *flat, int64_t n, float *out) {
    int64_t b = (int64_t)z->rank * z->shard, e = b + z->shard < n ? b + z->shard : n;
    if (e > b) memcpy(out, flat + b, (size_t)(e - b) * sizeof *out);
}

/* Every file read whole, the parameters and each state this run keeps made whole and cut to this rank's
 * slices, then its shard taken: each rank holds the whole model's values of one kind at a time. */
static ca_status read_other_tp(ca_accelerator *acc, const ca_state_files *files, const zs_index *ix,
                               struct ca_zero_load *L) {
    const ca_zero *z = &acc->zero;
    int n = (int)json_object_array_length(ix->params);
    zs_param *q = calloc((size_t)n + 1, sizeof *q);
    ca_status s = q ? match_other_tp(acc, ix, q) : ca_error(CA_ERR_NOMEM, "out of host memory");
    int64_t most = 1;
    for (int i = 0; s == CA_OK && i < n; i++) most = q[i].numel * ix->tp > most ? q[i].numel * ix->tp : most;
    size_t all = (size_t)ix->shard * (size_t)ix->world * (size_t)ix->tp;
    float *blocks = s == CA_OK ? malloc(all * sizeof *blocks) : NULL, *whole = blocks ? malloc((size_t)most * sizeof *whole) : NULL;
    float *flat = whole ? calloc((size_t)(z->numel ? z->numel : 1), sizeof *flat) : NULL;
    if (s == CA_OK && !flat) s = ca_error(CA_ERR_NOMEM, "load_state: out of host memory");
    for (int j = -1; s == CA_OK && j < 2; j++) {
        bool kept = j < 0 || L->st[j];
        s = read_kind(files, ix, j, kept, blocks);
        if (s != CA_OK || !kept) continue;
        s = cut_mine(acc, ix, q, blocks, whole, flat);
        if (s == CA_OK && j < 0 && !L->lean) memcpy(L->flat, flat, (size_t)z->numel * sizeof *flat);
        else if (s == CA_OK) my_shard(z, flat, z->numel, j < 0 ? L->flat : L->st[j]);
    }
    free(q);
    free(blocks);
    free(whole);
    free(flat);
    return s;
}

/* The host buffers of a load; params false: the optimizer state's only (flat stays NULL). */
static ca_status load_alloc(const ca_zero *z, int world, bool lean, bool params, struct ca_zero_load **out) {
    struct ca_zero_load *L = calloc(1, sizeof *L);
    *out = L;
    if (!L) return ca_error(CA_ERR_NOMEM, "load_state: out of host memory");
    L->world = world;
    L->lean = lean;
    int64_t n = lean ? z->shard : z->numel;
    if (params)
        L->flat = lean ? calloc((size_t)(n ? n : 1), sizeof *L->flat) : malloc((size_t)(n ? n : 1) * sizeof *L->flat);
    ca_tensor *kept[2] = {z->s1, z->s2};
    bool ok = !params || L->flat != NULL;
    for (int j = 0; j < 2; j++)
        if (kept[j]) ok = ok && (L->st[j] = calloc((size_t)z->shard, sizeof *L->st[j])) != NULL;
    return ok ? CA_OK : ca_error(CA_ERR_NOMEM, "load_state: out of host memory");
}

ca_status ca_zero_check_shard(ca_accelerator *acc, const char *dir, const ca_state_files *files) {
    ca_zero *z = &acc->zero;
    zs_index ix;
    ca_zero_load_free(acc);
    ca_status s = read_index(dir, &ix);
    if (s == CA_OK && !z->stage)
        s = ca_error(CA_ERR_INVALID, "load_state: %s holds a sharded state dict: load it under sharded data "
                     "parallelism, or merge its weights first (caccel merge-weights)", dir);
    /* the same tp size: this tp rank's files hold this run's flat space, resharded by position */
    bool same_tp = s == CA_OK && ix.tp == tp_size(acc);
    if (s == CA_OK && same_tp) s = check_index_params(acc, &ix);
    if (s == CA_OK) s = check_shard_files(dir, &ix);
    if (s == CA_OK) s = load_alloc(z, ix.world * ix.tp, ca_zero3_loads_lean(acc), true, &z->load);
    for (int k = 0; s == CA_OK && same_tp && k < ix.world; k++) s = read_old_shard(acc, files, &ix, k, z->load);
    if (s == CA_OK && !same_tp) s = read_other_tp(acc, files, &ix, z->load);
    if (s != CA_OK) ca_zero_load_free(acc);
    if (s == CA_OK && acc->rank == 0 && same_tp && ix.world != z->world)
        ca_log_printf(CA_LOG_INFO, "load_state: %s was saved as %d shards; each rank reads the parts of its shard of "
                      "%d (stage %d)", dir, ix.world, z->world, z->stage);
    if (s == CA_OK && acc->rank == 0 && !same_tp)
        ca_log_printf(CA_LOG_INFO, "load_state: %s was saved as %d shards at tp %d; at tp %d every rank reads each "
                      "shard file, makes the tensors whole and keeps its slice's shard of %d (stage %d)", dir, ix.world,
                      ix.tp, tp_size(acc), z->world, z->stage);
    json_object_put(ix.root);
    return s;
}

/* ------------------------------------------------------------------ full state dicts, lean */

/* This rank's segment of param (NULL: no element of it lies in this rank's shard). */
static const ca_zero_seg *seg_of(const ca_zero *z, const ca_tensor *param) {
    for (int i = 0; i < z->nsegs; i++)
        if (z->segs[i].param == param) return &z->segs[i];
    return NULL;
}

/* Every stage keeps a shard of the optimizer state: stages 1 and 2 read only its slices whatever
 * the parameters (whole on every rank: rank 0 may read and broadcast them); stage 3 when its
 * parameters load lean too (not summoned: a summoned load gathers, then scatters the full state). */
bool ca_zero_loads_state_lean(const ca_accelerator *acc) {
    /* tensor parallelism: the files hold whole tensors; state.c reads the shard's part of this rank's tp
     * slices (ss_tp_zero_reads), through read_state_slices with its descriptor */
    if (!acc || !acc->model || acc->zero.stage < 1 || acc->mesh) return false;
    if (acc->zero.stage == 3) return ca_zero3_loads_lean(acc);
    return ca_ram_efficient_loading(acc);
}

/* A FULL_STATE_DICT checkpoint under fsdp_cpu_ram_efficient_loading (ca_zero_loads_state_lean, or beside
 * tensor parallelism with tp: read through tp->src, hashed into tp->parts for the tp x dp group's
 * verification, not verified here): of
 * each of o's state tensors in f only this rank's segment is verified and read, into shard-sized host
 * buffers laid out as the shard files hold them (frozen parameters and padding zero). No rank builds
 * the full state: the buffers are 1/N of it. ss_check_opt_tensors matched f's names, dtypes and
 * shapes first. */
ca_status ca_zero_read_state_slices(ca_accelerator *acc, ca_optimizer *o, ca_st_file *f, ca_tp_file *tp) {
    ca_zero *z = &acc->zero;
    ca_tensor *kept[2] = {z->s1, z->s2};
    ca_status s = CA_OK;
    /* a sharded load's buffers (params read: flat), left by a load that another rank refused, go;
     * the optimizers of this load fill one set of buffers together */
    if (z->load && z->load->flat) ca_zero_load_free(acc);
    /* the parameters come from model.safetensors (ca_zero3_load_shard): no buffer for them */
    if (!z->load && (s = load_alloc(z, z->world, true, false, &z->load)) != CA_OK) return s;
    const char *name = NULL;
    int slot = 0;
    ca_tensor *p;
    for (int i = 0; s == CA_OK && (p = ca_optimizer_state_param(o, i, &name, &slot)) != NULL; i++) {
        const ca_zero_seg *sg = seg_of(z, p);
        if (!sg || !kept[slot]) continue;   /* another rank's parameter; a state this run does not keep */
        const ca_st_entry *e = ca_st_find(f, name);
        float *dst = z->load->st[slot] + sg->soff;
        /* tp: the segment is a range of this rank's tp slice, a piece of every row of a rowwise split */
        s = tp ? ca_tp_read_entry(acc, tp->src, f, e, p, sg->poff, sg->n, dst, tp->parts)
               : read_range(f, e, sg->poff, sg->n, dst);
    }
    return s;
}

/* What ca_zero_read_state_slices read copied into the shard's optimizer state (apply), or dropped
 * (a load that a rank refused). */
ca_status ca_zero_load_state_slices(ca_accelerator *acc, bool apply) {
    ca_zero *z = &acc->zero;
    struct ca_zero_load *L = z->load;
    ca_tensor *dst[2] = {z->s1, z->s2};
    ca_status s = CA_OK;
    for (int j = 0; apply && L && s == CA_OK && j < 2; j++)
        if (dst[j] && L->st[j]) s = state_from_host(acc, dst[j], L->st[j], (size_t)z->shard * sizeof(float));
    ca_zero_load_free(acc);
    return s;
}

ca_status ca_zero_load_shard(ca_accelerator *acc, const char *dir) {
    ca_zero *z = &acc->zero;
    struct ca_zero_load *L = z->load;
    if (!L) return ca_error(CA_ERR_STATE, "load_state: %s: the sharded checkpoint was not checked first", dir);
    ca_status s = CA_OK;
    if (L->lean)   /* straight into the stage-3 shard; copies cast from older values are stale */
        s = ca_device_copy_from_host(acc->device, ca_zero_fptr(z->pshard, 0), L->flat, (size_t)z->shard * sizeof *L->flat);
    for (int i = 0; s == CA_OK && i < z->nparams; i++) {
        if (!L->lean)
            s = ca_tensor_copy_from_host(z->params[i], L->flat + z->off[i], (size_t)z->params[i]->numel * sizeof *L->flat);
        z->params[i]->version++;
    }
    ca_tensor *dst[2] = {z->s1, z->s2};
    for (int j = 0; s == CA_OK && j < 2; j++)
        if (dst[j]) s = state_from_host(acc, dst[j], L->st[j], (size_t)z->shard * sizeof(float));
    ca_zero_load_free(acc);
    return s;
}
