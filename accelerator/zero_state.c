/* Sharded state dicts (fsdp_state_dict_type SHARDED_STATE_DICT) of sharded data parallelism: each rank
 * writes its shard of the flat parameters and of the optimizer state, zero_shard_<rank>.safetensors,
 * and rank 0 an index, zero_index.json, of where each parameter lies in the flat index space.
 * ca_merge_weights turns such a checkpoint into one model.safetensors. */
#include "accelerator/accelerator_impl.h"
#include "accelerator/checkpoint_impl.h"
#include "tensor/safetensors_impl.h"
#include "core/json_impl.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ZS_INDEX CA_ZERO_INDEX

static void shard_name(char *buf, size_t size, const char *dir, int rank) {
    snprintf(buf, size, "%s/" CA_ZERO_SHARD_FMT, dir, rank);
}

/* This rank's parameter shard, on the host (padding zero): packed on the device, copied once. */
static ca_status params_to_host(ca_accelerator *acc, float *out) {
    ca_zero *z = &acc->zero;
    ca_tensor *tmp = ca_tensor_keep(ca_zeros(acc->device, CA_F32, 1, &z->shard));
    if (!tmp) return ca_last_status();
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && i < z->nsegs; i++) {
        const ca_zero_seg *sg = &z->segs[i];
        int64_t shape[1] = {sg->n}, st[1] = {1};
        s = CA_KCALL(acc->device, copy_strided, CA_F32, 1, shape, (float *)ca_tptr(sg->param) + sg->poff, st,
                     (float *)ca_tptr(tmp) + sg->soff, st);
    }
    if (s == CA_OK) s = ca_tensor_to_host(tmp, out, (size_t)z->shard * sizeof *out);
    ca_tensor_free(tmp);
    return s;
}

static ca_status write_index(ca_accelerator *acc, const char *dir) {
    ca_zero *z = &acc->zero;
    json_object *root = json_object_new_object(), *params = json_object_new_array();
    json_object_object_add(root, "format", json_object_new_string("caccel-zero-shards"));
    json_object_object_add(root, "world_size", json_object_new_int(z->world));
    json_object_object_add(root, "shard", json_object_new_int64(z->shard));
    json_object_object_add(root, "numel", json_object_new_int64(z->numel));
    for (int i = 0; i < z->nparams; i++) {
        json_object *p = json_object_new_object(), *shape = json_object_new_array();
        for (int d = 0; d < z->params[i]->ndim; d++) json_object_array_add(shape, json_object_new_int64(z->params[i]->shape[d]));
        json_object_object_add(p, "name", json_object_new_string(acc->model->flat_names[i]));
        json_object_object_add(p, "shape", shape);
        json_object_object_add(p, "offset", json_object_new_int64(z->off[i]));
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

ca_status ca_zero_save_shard(ca_accelerator *acc, const char *dir) {
    ca_zero *z = &acc->zero;
    if (acc->rank >= z->world) return CA_OK;   /* HYBRID_SHARD: the first group writes; the others hold copies */
    float *buf = malloc((size_t)z->shard * 3 * sizeof *buf);
    if (!buf) return ca_error(CA_ERR_NOMEM, "out of host memory");
    ca_st_tensor t[3];
    int n = 0;
    ca_status s = params_to_host(acc, buf);
    t[n++] = (ca_st_tensor){.name = "params", .dtype = CA_F32, .ndim = 1, .shape = &z->shard, .data = buf};
    if (s == CA_OK && z->s1) {
        s = ca_tensor_to_host(z->s1, buf + z->shard, (size_t)z->shard * sizeof *buf);
        t[n++] = (ca_st_tensor){.name = "state1", .dtype = CA_F32, .ndim = 1, .shape = &z->shard, .data = buf + z->shard};
    }
    if (s == CA_OK && z->s2) {
        s = ca_tensor_to_host(z->s2, buf + 2 * z->shard, (size_t)z->shard * sizeof *buf);
        t[n++] = (ca_st_tensor){.name = "state2", .dtype = CA_F32, .ndim = 1, .shape = &z->shard,
                                .data = buf + 2 * z->shard};
    }
    char path[PATH_MAX];
    shard_name(path, sizeof path, dir, z->rank);
    if (s == CA_OK) s = ca_st_write(path, t, n);
    free(buf);
    if (s == CA_OK && acc->rank == 0) s = write_index(acc, dir);
    return s;
}

/* ------------------------------------------------------------------ reading */

typedef struct zs_index {
    json_object *root;
    int world;
    int64_t shard, numel;
    json_object *params;
} zs_index;

static ca_status read_index(const char *dir, zs_index *ix) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/" ZS_INDEX, dir);
    memset(ix, 0, sizeof *ix);
    char why[256];
    ca_status s;
    ix->root = ca_json_load(path, CA_FILE_CHECKPOINT_JSON, why, sizeof why, &s);
    if (!ix->root)
        return why[0] ? ca_error(CA_ERR_IO, "%s: cannot read the sharded-checkpoint index: %s", path, why) : s;
    json_object *w, *sh, *nu;
    if (!json_object_object_get_ex(ix->root, "world_size", &w) ||
        !json_object_object_get_ex(ix->root, "shard", &sh) || !json_object_object_get_ex(ix->root, "numel", &nu) ||
        !json_object_object_get_ex(ix->root, "params", &ix->params) ||
        !json_object_is_type(ix->params, json_type_array))
        return ca_error(CA_ERR_IO, "%s: not a sharded-checkpoint index (world_size, shard, numel, params)", path);
    ix->world = json_object_get_int(w);
    ix->shard = json_object_get_int64(sh);
    ix->numel = json_object_get_int64(nu);
    if (ix->world < 1 || ix->shard < 1 || ix->numel > ix->shard * ix->world)
        return ca_error(CA_ERR_IO, "%s: inconsistent world_size %d, shard %lld, numel %lld", path, ix->world,
                        (long long)ix->shard, (long long)ix->numel);
    return CA_OK;
}

/* Every rank's parameter shard concatenated: the flat parameters [world * shard]. */
static ca_status read_all_params(const char *dir, const zs_index *ix, float **out) {
    float *flat = calloc((size_t)(ix->shard * ix->world), sizeof *flat);
    if (!flat) return ca_error(CA_ERR_NOMEM, "out of host memory");
    ca_status s = CA_OK;
    for (int r = 0; s == CA_OK && r < ix->world; r++) {
        char path[PATH_MAX];
        ca_st_file f = {0};
        shard_name(path, sizeof path, dir, r);
        s = ca_st_open(path, &f);
        const ca_st_entry *e = s == CA_OK ? ca_st_find(&f, "params") : NULL;
        if (s == CA_OK && (!e || e->dtype != CA_F32 || e->end - e->begin != (uint64_t)ix->shard * sizeof(float)))
            s = ca_error(CA_ERR_IO, "%s: no f32 tensor 'params' of %lld elements", path, (long long)ix->shard);
        if (s == CA_OK) memcpy(flat + r * ix->shard, ca_st_data(&f, e), (size_t)ix->shard * sizeof *flat);
        ca_st_close(&f);
    }
    if (s != CA_OK) free(flat);
    else *out = flat;
    return s;
}

static const char *param_name(json_object *p) {
    json_object *v;
    return json_object_object_get_ex(p, "name", &v) ? json_object_get_string(v) : "";
}
static int64_t param_offset(json_object *p) {
    json_object *v;
    return json_object_object_get_ex(p, "offset", &v) ? json_object_get_int64(v) : -1;
}

ca_status ca_zero_check_shard(ca_accelerator *acc, const char *dir) {
    zs_index ix;
    ca_zero *z = &acc->zero;
    ca_status s = read_index(dir, &ix);
    if (s == CA_OK && !z->stage)
        s = ca_error(CA_ERR_INVALID, "load_state: %s holds a sharded state dict: load it under sharded data "
                     "parallelism, or merge its weights first (caccel merge-weights)", dir);
    else if (s == CA_OK && ix.world != z->world)
        s = ca_error(CA_ERR_INVALID, "load_state: %s was saved as %d shards, this run shards over %d processes: load "
                     "it on %d, or save with fsdp_state_dict_type FULL_STATE_DICT", dir, ix.world, z->world, ix.world);
    else if (s == CA_OK && (ix.numel != z->numel || (int)json_object_array_length(ix.params) != z->nparams))
        s = ca_error(CA_ERR_INVALID, "load_state: %s: %lld parameters in %d tensors, the model has %lld in %d", dir,
                     (long long)ix.numel, (int)json_object_array_length(ix.params), (long long)z->numel, z->nparams);
    for (int i = 0; s == CA_OK && i < z->nparams; i++) {
        json_object *p = json_object_array_get_idx(ix.params, (size_t)i);
        if (strcmp(param_name(p), acc->model->flat_names[i]) != 0 || param_offset(p) != z->off[i])
            s = ca_error(CA_ERR_INVALID, "load_state: %s: tensor %d is '%s' at %lld, the model's is '%s' at %lld", dir,
                         i, param_name(p), (long long)param_offset(p), acc->model->flat_names[i], (long long)z->off[i]);
    }
    json_object_put(ix.root);
    return s;
}

static ca_status load_state_shard(ca_accelerator *acc, const char *dir) {
    ca_zero *z = &acc->zero;
    char path[PATH_MAX];
    ca_st_file f = {0};
    shard_name(path, sizeof path, dir, z->rank);
    ca_status s = ca_st_open(path, &f);
    ca_tensor *dst[2] = {z->s1, z->s2};
    const char *names[2] = {"state1", "state2"};
    for (int k = 0; s == CA_OK && k < 2; k++) {
        if (!dst[k]) continue;
        const ca_st_entry *e = ca_st_find(&f, names[k]);
        if (!e || e->end - e->begin != (uint64_t)z->shard * sizeof(float))
            s = ca_error(CA_ERR_IO, "%s: no optimizer state '%s' of %lld elements (the optimizer differs)", path,
                         names[k], (long long)z->shard);
        else
            s = ca_tensor_copy_from_host(dst[k], ca_st_data(&f, e), (size_t)(e->end - e->begin));
    }
    ca_st_close(&f);
    return s;
}

ca_status ca_zero_load_shard(ca_accelerator *acc, const char *dir) {
    ca_zero *z = &acc->zero;
    zs_index ix;
    float *flat = NULL;
    ca_status s = read_index(dir, &ix);
    if (s == CA_OK) s = read_all_params(dir, &ix, &flat);
    for (int i = 0; s == CA_OK && i < z->nparams; i++) {
        s = ca_tensor_copy_from_host(z->params[i], flat + z->off[i], (size_t)z->params[i]->numel * sizeof *flat);
        z->params[i]->version++;
    }
    if (s == CA_OK) s = load_state_shard(acc, dir);
    free(flat);
    json_object_put(ix.root);
    return s;
}

/* ------------------------------------------------------------------ merge-weights */

ca_status ca_merge_weights(const char *dir, const char *out) {
    if (!dir || !out) return ca_error(CA_ERR_INVALID, "merge_weights: a checkpoint directory and an output are required");
    zs_index ix;
    float *flat = NULL;
    ca_status s = read_index(dir, &ix);
    if (s == CA_OK) s = read_all_params(dir, &ix, &flat);
    int n = s == CA_OK ? (int)json_object_array_length(ix.params) : 0;
    ca_st_tensor *t = s == CA_OK ? calloc((size_t)n + 1, sizeof *t) : NULL;
    int64_t (*shapes)[CA_MAX_DIMS] = s == CA_OK ? calloc((size_t)n + 1, sizeof *shapes) : NULL;
    if (s == CA_OK && (!t || !shapes)) s = ca_error(CA_ERR_NOMEM, "out of host memory");
    for (int i = 0; s == CA_OK && i < n; i++) {
        json_object *p = json_object_array_get_idx(ix.params, (size_t)i), *shape;
        int64_t numel = 1, off = param_offset(p);
        json_object_object_get_ex(p, "shape", &shape);
        int nd = shape ? (int)json_object_array_length(shape) : 0;
        if (nd > CA_MAX_DIMS) nd = CA_MAX_DIMS;
        for (int d = 0; d < nd; d++) numel *= shapes[i][d] = json_object_get_int64(json_object_array_get_idx(shape, (size_t)d));
        if (off < 0 || off + numel > ix.numel)
            s = ca_error(CA_ERR_IO, "%s/" ZS_INDEX ": tensor '%s' lies outside the %lld parameters", dir, param_name(p),
                         (long long)ix.numel);
        t[i] = (ca_st_tensor){.name = param_name(p), .dtype = CA_F32, .ndim = nd, .shape = shapes[i], .data = flat + off};
    }
    if (s == CA_OK && mkdir(out, 0777) != 0 && errno != EEXIST)
        s = ca_error(CA_ERR_IO, "merge_weights: %s: %s", out, strerror(errno));
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    if (s == CA_OK) s = ca_st_write(path, t, n);
    free(t);
    free(shapes);
    free(flat);
    json_object_put(ix.root);
    return s;
}
