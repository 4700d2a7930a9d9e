/* accelerator/checkpoint.c: ca_save_model / ca_load_model, the model files of Accelerate's
 * save_model and load_checkpoint_in_model (safetensors, sharded with Hugging Face's index). */
#include <caccel/checkpoint.h>
#include <caccel/log.h>
#include <caccel/tensor.h>

#include "accelerator/checkpoint_impl.h"
#include "accelerator/save_copy_impl.h"
#include "accelerator/mesh_impl.h"
#include "accelerator/sync_impl.h"
#include "tensor/safetensors_impl.h"
#include "core/json_impl.h"
#include "base/file_impl.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CK_SINGLE "model.safetensors"
#define CK_INDEX "model.safetensors.index.json"

/* ------------------------------------------------------------- saving */

typedef struct ck_host {
    ca_st_tensor *t;      /* one per parameter, in registration order */
    int n;
} ck_host;

static void ck_host_free(ck_host *h) {
    free(h->t);
    memset(h, 0, sizeof *h);
}

/* Host copies of every parameter (the device's memory is not readable here). */
const void *ca_ck_host_data(ca_tensor *t) {
    ca_device *d = ca_tensor_device(t);
    if (!ca_device_is_host(d) || !ca_tensor_is_contiguous(t) || ca_device_synchronize(d) != CA_OK) return NULL;
    return ca_tensor_data(t);
}

/* A device tensor's bytes, copied off the device where the writer wants them (ca_ck_st_tensor). */
static ca_status ck_fill(void *ctx, void *dst, size_t len) {
    ca_tensor *t = ctx;
    ca_status s = ca_save_copy_fill(t, dst, len);   /* an asynchronous save's: on its copy stream */
    return s == CA_OK ? s : ca_error_context("tensor '%s': copying it to the host", ca_tensor_name(t));
}

void ca_ck_st_tensor(ca_tensor *x, const char *name, ca_st_tensor *out) {
    const void *host = ca_ck_host_data(x);   /* written from where it lies: no copy */
    *out = (ca_st_tensor){name, ca_tensor_dtype(x), ca_tensor_ndim(x), ca_tensor_shape(x), host,
                          host ? NULL : ck_fill, x};
}

/* Every parameter as the writer takes it: a device's are copied when the files are made. */
static ca_status ck_host_copies(ca_module *m, ck_host *h) {
    int n = ca_module_num_params(m);
    h->t = calloc((size_t)(n ? n : 1), sizeof *h->t);
    if (!h->t) return ca_error(CA_ERR_NOMEM, "save_model: out of memory");
    for (h->n = 0; h->n < n; h->n++)
        ca_ck_st_tensor(ca_module_param_at(m, h->n), ca_module_param_name(m, h->n), &h->t[h->n]);
    return CA_OK;
}

static size_t ck_bytes(const ca_st_tensor *t) {
    size_t n = ca_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

/* huggingface_hub's split_torch_state_dict_into_shards: in order, a tensor that would tip the
 * current shard over max starts a new one; a tensor larger than max gets a shard of its own.
 * shard[i] gets tensor i's shard; returns the number of shards. */
static int ck_plan_shards(const ca_st_tensor *t, int n, size_t max, int *shard) {
    int next = 0, cur_first = -1;
    size_t cur = 0;
    for (int i = 0; i < n; i++) {
        size_t b = ck_bytes(&t[i]);
        if (max && b > max) {
            shard[i] = next++;
            continue;
        }
        if (max && cur + b > max) {
            for (int j = cur_first; j < i; j++)
                if (shard[j] < 0) shard[j] = next;
            next++;
            cur = 0;
            cur_first = -1;
        }
        shard[i] = -1;
        if (cur_first < 0) cur_first = i;
        cur += b;
    }
    if (cur_first >= 0) {
        for (int j = cur_first; j < n; j++)
            if (shard[j] < 0) shard[j] = next;
        next++;
    }
    return next;
}

static void ck_shard_name(char *buf, size_t len, int i, int nshards) {
    snprintf(buf, len, "model-%05d-of-%05d.safetensors", i + 1, nshards);
}

static int ck_cmp_name(const void *a, const void *b) {
    return strcmp((*(const ca_st_tensor *const *)a)->name, (*(const ca_st_tensor *const *)b)->name);
}

static void ck_put_json_string(FILE *fp, const char *s) {
    json_object *js = json_object_new_string(s);
    fputs(json_object_to_json_string_ext(js, JSON_C_TO_STRING_NOSLASHESCAPE), fp);
    json_object_put(js);
}

/* The index as Python's json.dumps(index, indent=2, sort_keys=True) + "\n" writes it. */
static char *ck_index_text(const ck_host *h, const int *shard, int nshards, size_t *len) {
    const ca_st_tensor **order = malloc((size_t)h->n * sizeof *order);
    char *text = NULL;
    FILE *fp = open_memstream(&text, len);
    if (!order || !fp) {
        free(order);
        if (fp) fclose(fp);
        free(text);
        return NULL;
    }
    size_t total = 0;
    for (int i = 0; i < h->n; i++) order[i] = &h->t[i], total += ck_bytes(&h->t[i]);
    qsort(order, (size_t)h->n, sizeof *order, ck_cmp_name);
    fprintf(fp, "{\n  \"metadata\": {\n    \"total_size\": %zu\n  },\n  \"weight_map\": {\n", total);
    for (int i = 0; i < h->n; i++) {
        char fname[64];
        ck_shard_name(fname, sizeof fname, shard[order[i] - h->t], nshards);
        fputs("    ", fp);
        ck_put_json_string(fp, order[i]->name);
        fprintf(fp, ": \"%s\"%s\n", fname, i + 1 < h->n ? "," : "");
    }
    fputs("  }\n}\n", fp);
    fclose(fp);
    free(order);
    return text;
}

static ca_status ck_join(char *buf, size_t len, const char *dir, const char *name) {
    if ((size_t)snprintf(buf, len, "%s/%s", dir, name) >= len)
        return ca_error(CA_ERR_INVALID, "%s/%s: path too long", dir, name);
    return CA_OK;
}

static ca_status ck_write_shards(const char *dir, const ck_host *h, const int *shard, int nshards) {
    ca_st_tensor *sub = malloc((size_t)(h->n ? h->n : 1) * sizeof *sub);
    if (!sub) return ca_error(CA_ERR_NOMEM, "save_model: out of memory");
    ca_status s = CA_OK;
    for (int k = 0; k < nshards && s == CA_OK; k++) {
        char name[64], path[PATH_MAX];
        int m = 0;
        for (int i = 0; i < h->n; i++)
            if (shard[i] == k) sub[m++] = h->t[i];
        ck_shard_name(name, sizeof name, k, nshards);
        s = ck_join(path, sizeof path, dir, name);
        if (s == CA_OK) s = ca_st_write(path, sub, m);
    }
    free(sub);
    return s;
}

static ca_status ck_write_index(const char *dir, const ck_host *h, const int *shard, int nshards) {
    char path[PATH_MAX];
    ca_status s = ck_join(path, sizeof path, dir, CK_INDEX);
    if (s != CA_OK) return s;
    size_t len = 0;
    char *text = ck_index_text(h, shard, nshards, &len);
    if (!text) return ca_error(CA_ERR_NOMEM, "%s: out of memory", path);
    s = ca_st_write_atomic(path, (const void *const[]){text}, (const size_t[]){len}, 1);
    free(text);
    return s;
}

/* Removes the other layout's main file, which a loader would otherwise prefer or mix in. */
static ca_status ck_remove_stale(const char *dir, bool sharded) {
    char path[PATH_MAX];
    ca_status s = ck_join(path, sizeof path, dir, sharded ? CK_SINGLE : CK_INDEX);
    if (s == CA_OK && unlink(path) != 0 && errno != ENOENT)
        s = ca_error(CA_ERR_IO, "%s: cannot remove the stale file: %s", path, strerror(errno));
    return s;
}

ca_status ca_ck_save_model_files(ca_module *model, const char *dir, size_t max_shard_size) {
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return ca_error(CA_ERR_NOT_FOUND, "save_model: %s is not a directory", dir);
    ck_host h = {0};
    ca_status s = ck_host_copies(model, &h);
    int *shard = malloc((size_t)(h.n ? h.n : 1) * sizeof *shard);
    if (s == CA_OK && !shard) s = ca_error(CA_ERR_NOMEM, "save_model: out of memory");
    int nshards = s == CA_OK ? ck_plan_shards(h.t, h.n, max_shard_size, shard) : 0;
    if (s == CA_OK && nshards <= 1) {
        char path[PATH_MAX];
        s = ck_join(path, sizeof path, dir, CK_SINGLE);
        if (s == CA_OK) s = ca_st_write(path, h.t, h.n);
    } else if (s == CA_OK) {
        s = ck_write_shards(dir, &h, shard, nshards);
        if (s == CA_OK) s = ck_write_index(dir, &h, shard, nshards);
    }
    if (s == CA_OK) s = ck_remove_stale(dir, nshards > 1);
    free(shard);
    ck_host_free(&h);
    return s;
}

/* Rank 0's status reaches every rank (a broadcast, which also makes the others wait for it); `what`
 * completes the others' error: "save_model: rank 0 failed to <what>". */
static ca_status ck_share_status(ca_accelerator *acc, ca_status s, const char *what) {
    ca_status out = CA_OK;
    CA_SCOPE {
        ca_tensor *t = ca_full(ca_accelerator_device(acc), CA_F32, 0, NULL, (double)s);
        double v = 0;
        out = t ? ca_broadcast(acc, t, 0) : ca_last_status();
        if (out == CA_OK) out = ca_tensor_item(t, &v);
        if (out == CA_OK && !ca_is_main_process(acc) && v != 0)
            out = ca_error(CA_ERR_PEER, "%s (%s)", what, ca_status_name((ca_status)(int)v));
    }
    return out == CA_OK ? s : out;
}

/* Rank 0's status s shared (ck_share_status), keeping rank 0's own message on rank 0. */
static ca_status ck_share_rank0(ca_accelerator *acc, ca_status s, const char *what) {
    if (s != CA_OK) {  /* keep rank 0's message: the status broadcast would overwrite it */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ca_last_error());
        ca_status b = ck_share_status(acc, s, what);
        return b == s ? ca_error(s, "%s", msg) : b;
    }
    return ck_share_status(acc, s, what);
}

static ca_status save_model(ca_accelerator *acc, ca_module *model, const char *dir, size_t max_shard_size) {
    bool main = !acc || ca_is_main_process(acc);
    ca_status s = main ? ca_ck_save_model_files(model, dir, max_shard_size) : CA_OK;
    if (!acc || ca_num_processes(acc) <= 1) return s;
    return ck_share_rank0(acc, s, "save_model: rank 0 failed to write the model");
}

/* ------------------------------------------------------------- loading */

/* The tensors to load: each one's file and entry. */
typedef struct ck_src {
    ca_st_file *files;
    int nfiles;
    const ca_st_file **file_of;
    const ca_st_entry **entry;
    int n;
} ck_src;

static void ck_src_free(ck_src *src) {
    for (int i = 0; i < src->nfiles; i++) ca_st_close(&src->files[i]);
    free(src->files);
    free(src->file_of);
    free(src->entry);
    memset(src, 0, sizeof *src);
}

static ca_status ck_src_alloc(ck_src *src, int nfiles, int n) {
    src->files = calloc((size_t)(nfiles ? nfiles : 1), sizeof *src->files);
    src->file_of = calloc((size_t)(n ? n : 1), sizeof *src->file_of);
    src->entry = calloc((size_t)(n ? n : 1), sizeof *src->entry);
    if (!src->files || !src->file_of || !src->entry)
        return ca_error(CA_ERR_NOMEM, "load_model: out of memory");
    return CA_OK;
}

/* One opened file (taken: *opened is left empty), or the file at path opened here. */
static ca_status ck_src_single_file(const char *path, ca_st_file *opened, ck_src *src) {
    ca_status s = ck_src_alloc(src, 1, 0);
    if (s == CA_OK && opened) {
        src->files[0] = *opened;
        memset(opened, 0, sizeof *opened);
    }
    if (s == CA_OK && !opened) s = ca_st_open(path, &src->files[0]);
    if (s != CA_OK) return s;
    src->nfiles = 1;
    ca_st_file *f = &src->files[0];
    free(src->file_of);
    free(src->entry);
    src->file_of = calloc((size_t)(f->n ? f->n : 1), sizeof *src->file_of);
    src->entry = calloc((size_t)(f->n ? f->n : 1), sizeof *src->entry);
    if (!src->file_of || !src->entry) return ca_error(CA_ERR_NOMEM, "load_model: out of memory");
    for (int i = 0; i < f->n; i++) src->file_of[i] = f, src->entry[i] = &f->entries[i];
    src->n = f->n;
    return CA_OK;
}

static ca_status ck_src_single(const char *path, ck_src *src) { return ck_src_single_file(path, NULL, src); }

/* The shard called `fname` next to the index, opened once. */
static ca_status ck_shard(ck_src *src, const char *index, const char *fname, ca_st_file **out) {
    char path[PATH_MAX];
    const char *slash = strrchr(index, '/');
    int dl = slash ? (int)(slash - index) : 1;
    if ((size_t)snprintf(path, sizeof path, "%.*s/%s", dl, slash ? index : ".", fname) >= sizeof path)
        return ca_error(CA_ERR_INVALID, "%s: shard path too long", index);
    for (int i = 0; i < src->nfiles; i++)
        if (strcmp(src->files[i].path, path) == 0) return *out = &src->files[i], CA_OK;
    ca_status s = ca_st_open(path, &src->files[src->nfiles]);
    if (s != CA_OK) return ca_error_context("%s: shard of the index", index);
    *out = &src->files[src->nfiles++];
    return CA_OK;
}

static ca_status ck_src_map(const char *index, json_object *map, ck_src *src) {
    json_object_object_foreach(map, name, val) {
        if (!json_object_is_type(val, json_type_string))
            return ca_error(CA_ERR_IO, "%s: weight_map: tensor '%s' does not map to a file name",
                            index, name);
        const char *fname = json_object_get_string(val);
        if (strchr(fname, '/'))
            return ca_error(CA_ERR_IO, "%s: weight_map: tensor '%s': file '%s' is not in the "
                            "index's directory", index, name, fname);
        ca_st_file *f = NULL;
        ca_status s = ck_shard(src, index, fname, &f);
        if (s != CA_OK) return s;
        const ca_st_entry *e = ca_st_find(f, name);
        if (!e)
            return ca_error(CA_ERR_IO, "%s: tensor '%s': the index maps it to %s, which has no such "
                            "tensor", index, name, f->path);
        src->file_of[src->n] = f;
        src->entry[src->n++] = e;
    }
    return CA_OK;
}

static ca_status ck_src_index(const char *index, ck_src *src) {
    char why[256];
    ca_status s;
    json_object *root = ca_json_load(index, CA_FILE_INDEX, why, sizeof why, &s);
    if (!root) return why[0] ? ca_error(CA_ERR_IO, "%s: cannot read the index: %s", index, why) : s;
    json_object *map = NULL;
    if (!json_object_object_get_ex(root, "weight_map", &map) ||
        !json_object_is_type(map, json_type_object))
        s = ca_error(CA_ERR_IO, "%s: no \"weight_map\" object", index);
    int n = s == CA_OK ? json_object_object_length(map) : 0;
    if (s == CA_OK) s = ck_src_alloc(src, n, n);
    if (s == CA_OK) s = ck_src_map(index, map, src);
    json_object_put(root);
    return s;
}

static bool ck_ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* A directory: model.safetensors, else the index (as from_pretrained chooses). */
static ca_status ck_src_open(const char *where, ck_src *src) {
    struct stat st;
    if (stat(where, &st) != 0)
        return ca_error(CA_ERR_NOT_FOUND, "load_model: %s: %s", where, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return ck_ends_with(where, ".json") ? ck_src_index(where, src) : ck_src_single(where, src);
    char path[PATH_MAX];
    ca_status s = ck_join(path, sizeof path, where, CK_SINGLE);
    if (s == CA_OK && access(path, F_OK) == 0) return ck_src_single(path, src);
    if (s == CA_OK) s = ck_join(path, sizeof path, where, CK_INDEX);
    if (s == CA_OK && access(path, F_OK) == 0) return ck_src_index(path, src);
    return s != CA_OK ? s : ca_error(CA_ERR_NOT_FOUND, "load_model: %s holds neither " CK_SINGLE
                                     " nor " CK_INDEX, where);
}

static void ck_shape_str(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

static ca_status ck_check_one(const ca_st_file *f, const ca_st_entry *e, const ca_tensor *p, const ca_accelerator *tp) {
    if (e->dtype != ca_tensor_dtype(p))
        return ca_error(CA_ERR_INVALID, "%s: tensor '%s': dtype %s in the file, %s in the model",
                        f->path, e->name, ca_st_dtype_name(e->dtype),
                        ca_st_dtype_name(ca_tensor_dtype(p)));
    int64_t shape[CA_MAX_DIMS];
    ca_tp_file_shape(tp, p, shape);   /* under tensor parallelism (tp non-NULL) a split one's whole shape */
    bool same = e->ndim == ca_tensor_ndim(p);
    for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == shape[d];
    if (same) return CA_OK;
    char a[160], b[160];
    ck_shape_str(a, sizeof a, e->ndim, e->shape);
    ck_shape_str(b, sizeof b, ca_tensor_ndim(p), shape);
    return ca_error(CA_ERR_INVALID, "%s: tensor '%s': shape %s in the file, %s in the model",
                    f->path, e->name, a, b);
}

/* Every tensor has a parameter of the same name, dtype and shape, and every parameter a tensor. */
static ca_status ck_validate(const ck_src *src, ca_module *model, const char *where, const ca_accelerator *tp) {
    for (int i = 0; i < src->n; i++) {
        ca_tensor *p = ca_module_param(model, src->entry[i]->name);
        if (!p)
            return ca_error(CA_ERR_INVALID, "%s: tensor '%s' has no parameter of that name in the "
                            "model", src->file_of[i]->path, src->entry[i]->name);
        ca_status s = ck_check_one(src->file_of[i], src->entry[i], p, tp);
        if (s != CA_OK) return s;
    }
    int np = ca_module_num_params(model);
    for (int j = 0; j < np; j++) {
        const char *name = ca_module_param_name(model, j);
        bool found = false;
        for (int i = 0; i < src->n && !found; i++) found = strcmp(src->entry[i]->name, name) == 0;
        if (!found)
            return ca_error(CA_ERR_INVALID, "%s: no tensor '%s' for the model's parameter of that "
                            "name", where, name);
    }
    return CA_OK;
}

/* The model files at `where`, opened and checked against `model` (nothing written yet). */
struct ca_ck_model_src {
    ck_src src;
    ca_tp_file *tp;              /* ca_ck_model_read_tp: each file's tensors as this rank's slices */
    float **seg;                 /* ca_ck_model_read_tp_shard: [nseg] stage 3's segments of the tp slices */
    int nseg;
};

ca_status ca_ck_model_open(const char *where, ca_module *model, ca_ck_model_src **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return ca_error(CA_ERR_NOMEM, "load_model: out of memory");
    ca_status s = ck_src_open(where, &(*out)->src);
    if (s == CA_OK) s = ck_validate(&(*out)->src, model, where, NULL);
    if (s != CA_OK) {
        ca_ck_model_close(*out);
        *out = NULL;
    }
    return s;
}

ca_status ca_ck_model_adopt(ca_st_file *f, ca_module *model, const ca_accelerator *tp, ca_ck_model_src **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) {
        ca_st_close(f);
        return ca_error(CA_ERR_NOMEM, "load_model: out of memory");
    }
    char where[PATH_MAX];
    snprintf(where, sizeof where, "%s", f->path);
    ca_status s = ck_src_single_file(where, f, &(*out)->src);
    ca_st_close(f);   /* taken on success (left empty); closed on a failed allocation */
    if (s == CA_OK) s = ck_validate(&(*out)->src, model, where, tp);
    if (s != CA_OK) {
        ca_ck_model_close(*out);
        *out = NULL;
    }
    return s;
}

ca_status ca_ck_model_apply(const ca_ck_model_src *m, ca_module *model) {
    const ck_src *src = &m->src;
    ca_status s = CA_OK;
    for (int i = 0; i < src->n && s == CA_OK; i++) {
        const ca_st_entry *e = src->entry[i];
        ca_tensor *p = ca_module_param(model, e->name);
        if (ca_tensor_is_meta(p)) s = ca_meta_allocate(p);   /* a meta model: memory, not its init */
        const ca_st_file *f = src->file_of[i];
        if (s == CA_OK && m->tp)   /* read already */
            s = ca_tensor_copy_from_host(p, m->tp[f - src->files].buf[e - f->entries], ca_tensor_nbytes(p));
        else if (s == CA_OK) s = ca_tensor_copy_from_host(p, ca_st_data(src->file_of[i], e), (size_t)(e->end - e->begin));
        p->version++;
        if (s != CA_OK) ca_error_context("%s: tensor '%s'", src->file_of[i]->path, e->name);
    }
    return s;
}

static const ca_tensor *ck_param_of(void *model, const char *name) { return ca_module_param(model, name); }

ca_status ca_ck_model_read_tp(ca_accelerator *acc, ca_ck_model_src *m, bool sums) {
    m->tp = calloc((size_t)m->src.nfiles + 1, sizeof *m->tp);
    ca_status s = m->tp ? CA_OK : ca_error(CA_ERR_NOMEM, "load: out of host memory (rank %d)", acc->rank);
    for (int k = 0; s == CA_OK && k < m->src.nfiles; k++)
        s = ca_tp_file_read(acc, &m->src.files[k], ck_param_of, acc->model, sums, &m->tp[k]);
    return s;
}

/* A segment of this rank's stage-3 shard: which file and entry hold its parameter. */
static ca_st_file *ck_file_of(const ck_src *src, const char *name, const ca_st_entry **e);

ca_status ca_ck_model_read_tp_shard(ca_accelerator *acc, ca_ck_model_src *m, bool sums) {
    const ca_zero *z = &acc->zero;
    m->tp = calloc((size_t)m->src.nfiles + 1, sizeof *m->tp);
    m->seg = calloc((size_t)z->nsegs + 1, sizeof *m->seg);
    ca_status s = m->tp && m->seg ? CA_OK : ca_error(CA_ERR_NOMEM, "load: out of host memory (rank %d)", acc->rank);
    if (s == CA_OK) m->nseg = z->nsegs;
    for (int k = 0; s == CA_OK && k < m->src.nfiles; k++) {   /* each file's descriptor and sums, no buffers */
        ca_st_file *f = &m->src.files[k];
        s = ca_meta_src_open(f, &m->tp[k].src);
        if (s == CA_OK && sums) s = ca_st_parts_new(f, &m->tp[k].parts);
    }
    for (int k = 0; s == CA_OK && k < z->nsegs; k++) {
        const ca_zero_seg *sg = &z->segs[k];
        const ca_st_entry *e = NULL;
        ca_st_file *f = ck_file_of(&m->src, ca_tensor_name(sg->param), &e);
        if (!f) return ca_error(CA_ERR_INTERNAL, "load: no tensor for parameter %s", ca_tensor_name(sg->param));
        ca_tp_file *t = &m->tp[f - m->src.files];
        if (!(m->seg[k] = malloc((size_t)sg->n * sizeof(float) + 1)))
            s = ca_error(CA_ERR_NOMEM, "load: out of host memory for '%s' (rank %d)", e->name, acc->rank);
        if (s == CA_OK) s = ca_tp_read_entry(acc, t->src, f, e, sg->param, sg->poff, sg->n, m->seg[k], t->parts);
    }
    return s;
}

ca_st_file *ca_ck_model_file(ca_ck_model_src *m, int i, struct ca_st_parts **parts) {
    if (!m || i >= m->src.nfiles) return NULL;
    *parts = m->tp ? m->tp[i].parts : NULL;
    return &m->src.files[i];
}

void ca_ck_model_close(ca_ck_model_src *m) {
    if (!m) return;
    for (int k = 0; m->tp && k < m->src.nfiles; k++) ca_tp_file_free(&m->tp[k]);
    for (int k = 0; m->seg && k < m->nseg; k++) free(m->seg[k]);
    free(m->seg);
    free(m->tp);
    ck_src_free(&m->src);
    free(m);
}

/* A local load that failed part-way: what it kept back in place (NULL: nothing was kept), the
 * failure's message kept. */
static void ck_undo(ca_ck_kept *kept) {
    if (!kept) return;
    char msg[1024];
    ca_status s = ca_last_status();
    snprintf(msg, sizeof msg, "%s", ca_last_error());
    ca_ck_restore(NULL, kept);
    ca_error(s, "%s", msg);
}

/* Every rank reads the files. A meta model (not yet prepared) keeps its records first: a load that
 * fails part-way (a file cut short under it) leaves it meta, nothing half-filled. */
static ca_status load_model(ca_module *model, const char *dir_or_file) {
    ca_ck_model_src *m = NULL;
    ca_ck_kept *kept = NULL;
    ca_status s = ca_ck_model_open(dir_or_file, model, &m);
    if (s == CA_OK && ca_module_is_meta(model)) s = ca_ck_keep_params(model, 0, "load_model", &kept);
    if (s == CA_OK) s = ca_ck_model_apply(m, model);
    if (s != CA_OK) ck_undo(kept);
    ca_ck_kept_free(kept);
    ca_ck_model_close(m);
    return s;
}

/* Stage 3 keeps shards of the parameters between steps: whole while they are saved or loaded. */
static bool summon(ca_accelerator *acc, ca_module *model, ca_status *s) {
    const ca_sync_strategy *ops = acc ? acc->sync_ops : NULL;
    bool shards = ops && model && acc->model == model && ops->params_sharded && ops->params_sharded(acc);
    *s = shards ? ops->summon(acc, true) : CA_OK;
    return shards;
}

/* Tensor parallelism's split layers of the prepared model whole on every rank (collective) while fn
 * saves or loads it, then each rank's slice again: the files are one process's at any tp size. */
static ca_status tp_whole(ca_accelerator *acc, ca_module *model, const char *path,
                          ca_status (*fn)(ca_accelerator *, ca_module *, const char *, size_t), size_t arg) {
    bool tp = acc && acc->mesh && acc->model == model;
    ca_status s = CA_OK;
    bool shards = tp && summon(acc, model, &s);   /* stage 3 under tp: each rank's slices whole first */
    if (s == CA_OK && tp) s = ca_tp_summon(acc, true);
    if (s == CA_OK) s = fn(acc, model, path, arg);
    ca_status r = tp ? ca_tp_summon(acc, false) : CA_OK;
    ca_status z = shards ? acc->sync_ops->summon(acc, false) : CA_OK;
    return s != CA_OK ? s : r != CA_OK ? r : z;
}

static ca_status save_model_whole(ca_accelerator *acc, ca_module *model, const char *dir, size_t max_shard_size) {
    ca_status s;
    bool shards = summon(acc, model, &s);
    if (s == CA_OK) s = save_model(acc, model, dir, max_shard_size);
    ca_status r = shards ? acc->sync_ops->summon(acc, false) : CA_OK;
    return s != CA_OK ? s : r;
}

ca_status ca_save_model(ca_accelerator *acc, ca_module *model, const char *dir, size_t max_shard_size) {
    if (!model || !dir) return ca_error(CA_ERR_INVALID, "save_model: model and dir are required");
    return tp_whole(acc, model, dir, save_model_whole, max_shard_size);
}

static const float *ck_data_of(void *ctx, const ca_zero_seg *sg) {
    const ck_src *src = ctx;
    const char *name = ca_tensor_name(sg->param);
    for (int i = 0; i < src->n; i++)
        if (!strcmp(src->entry[i]->name, name)) return (const float *)ca_st_data(src->file_of[i], src->entry[i]) + sg->poff;
    return NULL;
}

/* The file holding tensor `name` (writable: verifying marks its chunks) and its entry. */
static ca_st_file *ck_file_of(const ck_src *src, const char *name, const ca_st_entry **e) {
    for (int i = 0; i < src->n; i++)
        if (!strcmp(src->entry[i]->name, name)) {
            *e = src->entry[i];
            return &src->files[src->file_of[i] - src->files];
        }
    return NULL;
}

ca_status ca_ck_model_verify_shard(ca_accelerator *acc, ca_ck_model_src *m) {
    const ca_zero *z = &acc->zero;
    ca_status s = CA_OK;
    for (int k = 0; s == CA_OK && k < z->nsegs; k++) {
        const ca_zero_seg *sg = &z->segs[k];
        const ca_st_entry *e = NULL;
        ca_st_file *f = ck_file_of(&m->src, ca_tensor_name(sg->param), &e);
        s = f ? ca_st_verify_range(f, f->data_start + e->begin + (uint64_t)sg->poff * sizeof(float),
                                   (uint64_t)sg->n * sizeof(float))
              : ca_error(CA_ERR_INTERNAL, "stage 3: no tensor for parameter %s", ca_tensor_name(sg->param));
    }
    return s;
}

static const float *ck_seg_data(void *ctx, const ca_zero_seg *sg) {
    const ca_ck_model_src *m = ((void **)ctx)[0];
    const ca_accelerator *acc = ((void **)ctx)[1];
    return m->seg[sg - acc->zero.segs];
}

ca_status ca_ck_model_apply_shard(ca_accelerator *acc, ca_ck_model_src *m) {
    void *ctx[2] = {m, acc};
    if (m->seg) return ca_zero3_load_shard(acc, ck_seg_data, ctx);   /* read already (ca_ck_model_read_tp_shard) */
    ca_status s = CA_OK;   /* the sizes again, just before the mappings are read (a file cut short would fault) */
    for (int i = 0; s == CA_OK && i < m->src.nfiles; i++) s = ca_st_verify_range(&m->src.files[i], 0, 0);
    return s == CA_OK ? ca_zero3_load_shard(acc, ck_data_of, &m->src) : s;
}

/* A prepared model that every rank holds whole and equal (DDP, ZeRO stages 1 and 2) on several
 * processes, under fsdp_cpu_ram_efficient_loading (true by default): rank 0 reads the files and the
 * others receive its parameters, as Accelerate's sync_module_states broadcasts rank 0's. */
bool ca_ck_rank0_reads(const ca_accelerator *acc, const ca_module *model) {
    if (!acc || acc->model != model || acc->world < 2 || !acc->comm) return false;
    const ca_sync_strategy *ops = acc->sync_ops;
    if (!ops || !ops->replicated) return false;   /* the others: one process, or their own layout */
    if (ops->params_sharded && ops->params_sharded(acc)) return false;   /* stage 3: the shard's slices */
    return ca_ram_efficient_loading(acc);
}

/* Test hook: CACCEL_TEST_BCAST_STALL=<n> stops rank 1 before it takes part in the n-th parameter
 * broadcast from rank 0 (1-based) of a load (ca_load_model, ca_load_state), after printing a line, so that a test kills or stops it
 * there: the peer that fails mid-broadcast, at a point no sleep has to hit. */
static void ck_test_bcast_stall(const ca_accelerator *acc, int i, const char *who) {
    const char *v = getenv("CACCEL_TEST_BCAST_STALL");
    if (!v || acc->rank != 1 || atoi(v) != i + 1) return;
    fprintf(stderr, "%s: rank 1 stalled before parameter broadcast %d (CACCEL_TEST_BCAST_STALL, pid %d)\n", who, i + 1,
            (int)getpid());
    fflush(stderr);
    for (;;) pause();
}

ca_status ca_ck_broadcast_params(ca_accelerator *acc, ca_module *model, const char *who) {
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && i < ca_module_num_params(model); i++) {
        ca_tensor *p = ca_module_param_at(model, i);
        ck_test_bcast_stall(acc, i, who);
        s = ca_comm_broadcast(acc->comm, ca_tptr(p), (size_t)p->numel, p->dtype, 0, NULL);
        p->version++;   /* copies cast from older values are stale */
        if (s != CA_OK) ca_error_context("%s: broadcasting parameter %s from rank 0", who, ca_module_param_name(model, i));
    }
    return s;
}

/* Every rank's status to every rank (one all-reduce of a slot per rank): CA_OK when all are, else
 * the first failing rank's status, *bad that rank; a failed exchange (a peer died or timed out) is
 * returned as it is, *bad -1. This rank's own message is kept when it failed. */
static ca_status ck_agree(ca_accelerator *acc, ca_status mine, int *bad) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ca_last_error());
    *bad = -1;
    ca_status out = CA_OK;
    CA_SCOPE {
        ca_tensor *t = ca_zeros(acc->device, CA_F32, CA_SHAPE(acc->world));
        float *v = calloc((size_t)acc->world, sizeof *v);
        out = t && v ? CA_OK : ca_error(CA_ERR_NOMEM, "load_model: out of memory (rank %d)", acc->rank);
        if (v) v[acc->rank] = (float)mine;
        if (out == CA_OK) out = ca_tensor_copy_from_host(t, v, (size_t)acc->world * sizeof *v);
        if (out == CA_OK) out = ca_comm_all_reduce(acc->comm, ca_tptr(t), ca_tptr(t), (size_t)acc->world, CA_F32,
                                                   CA_OP_SUM, NULL);
        if (out == CA_OK) out = ca_tensor_to_host(t, v, (size_t)acc->world * sizeof *v);
        for (int r = 0; out == CA_OK && r < acc->world && *bad < 0; r++)
            if (v[r] != 0.0f) *bad = r, mine = (ca_status)(int)v[r];
        free(v);
    }
    if (out != CA_OK) return mine != CA_OK ? ca_error(mine, "%s", msg) : out;   /* this rank's own failure first */
    if (*bad == acc->rank) return ca_error(mine, "%s", msg);
    return *bad < 0 ? CA_OK : mine;
}

/* A rank-0 load that failed after every rank kept its parameters (ca_ck_keep_params): the kept
 * values back (a meta parameter meta again, its record as before), and the error says so, naming the
 * failed rank or keeping this rank's own message (a communicator's names the peer). */
static ca_status ck_put_back(ca_accelerator *acc, ca_status s, int bad, ca_ck_kept *kept) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ca_last_error());
    ca_status r = ca_ck_restore(acc, kept);
    if (bad >= 0 && bad != acc->rank)
        return ca_error(CA_ERR_PEER, "load_model: rank %d failed (%s) while rank 0's parameters were broadcast; "
                        "rank %d's model is as it was before the load", bad, ca_status_name(s), acc->rank);
    return ca_error(s, "%s; rank %d's model is %s", msg, acc->rank,
                    r == CA_OK ? "as it was before the load (restored)" : "NOT restored: do not use it");
}

/* Rank 0 loads (checked before anything is written: a failure changes no rank), its status reaches
 * every rank, then every parameter goes from rank 0 to the others: the same bytes on every rank.
 * All or nothing: every rank first keeps a host copy of its parameters, and after the broadcasts the
 * ranks agree (one all-reduce) that each received them; when a broadcast or that agreement fails (a
 * peer died, stopped or timed out), every rank that is still running puts its copy back, rank 0
 * included, which had written the file's values before sending them. We chose restoring over
 * "the model is now inconsistent, do not use it": a failed ca_load_model leaves the model as it was,
 * on every rank, the guarantee it gives everywhere else; it costs a host copy of the model per rank
 * for the duration of the load. (Rank 0 cannot apply only after the broadcasts instead: the
 * broadcast sends from its parameters, on the device the communicator works on.) */
static ca_status load_on_rank0(ca_accelerator *acc, ca_module *model, const char *where) {
    ca_ck_model_src *m = NULL;
    ca_ck_kept *kept = NULL;
    int bad = -1;
    ca_status s = acc->rank == 0 ? ca_ck_model_open(where, model, &m) : CA_OK;
    s = ck_share_rank0(acc, s, "load_model: rank 0 failed to read the model; nothing was loaded");
    if (s != CA_OK) return s;
    /* no rank starts unless every rank kept its copy */
    s = ck_agree(acc, ca_ck_keep_params(model, acc->rank, "load_model", &kept), &bad);
    bool started = s == CA_OK;
    if (s == CA_OK && acc->rank == 0) s = ca_ck_model_apply(m, model);
    ca_ck_model_close(m);
    if (s == CA_OK) s = ca_ck_broadcast_params(acc, model, "load_model");
    if (started) s = ck_agree(acc, s, &bad);   /* every rank has them */
    if (started && s != CA_OK) s = ck_put_back(acc, s, bad, kept);
    ca_ck_kept_free(kept);
    if (s == CA_OK && acc->rank == 0)
        CA_LOG_I("load_model: rank 0 read %s and broadcast its %d parameters (fsdp_cpu_ram_efficient_loading)", where,
                 ca_module_num_params(model));
    return s;
}

/* A meta model (ca_init_empty_weights) not yet prepared, on several processes whose strategy will
 * hold it whole on every rank (DDP, ZeRO stages 1 and 2; not stage 3, not tensor parallelism), its
 * parameters on the accelerator's device (what the collectives take), under
 * fsdp_cpu_ram_efficient_loading: rank 0 alone reads the files, as Accelerate's rank 0 loads and
 * sync_module_states gives the others its values. Every rank calls ca_load_model on it (one program). */
static bool rank0_reads_meta(const ca_accelerator *acc, ca_module *model) {
    if (!acc || acc->model == model || acc->world < 2 || !acc->comm || acc->mesh || !ca_module_is_meta(model))
        return false;
    const ca_sync_strategy *ops = acc->sync_ops;
    if (!ops || !ops->replicated || acc->zero.stage == 3) return false;
    for (int i = 0; i < ca_module_num_params(model); i++)
        if (ca_tensor_device(ca_module_param_at(model, i)) != acc->device) return false;
    return ca_ram_efficient_loading(acc);
}

/* Which parameters rank 0 holds values of (has[i] 1), from rank 0 to every rank: those the file gave
 * (and any it held already); the others stay meta on every rank and ca_prepare initialises them. */
static ca_status share_loaded(ca_accelerator *acc, ca_module *model, unsigned char *has) {
    int n = ca_module_num_params(model);
    for (int i = 0; acc->rank == 0 && i < n; i++) has[i] = !ca_tensor_is_meta(ca_module_param_at(model, i));
    ca_tensor *t = ca_tensor_keep(ca_empty(acc->device, CA_U8, 1, (int64_t[]){n}));
    if (!t) return ca_error_context("load_model: a buffer of %d bytes on rank %d", n, acc->rank);
    ca_status s = acc->rank == 0 ? ca_device_copy_from_host(acc->device, ca_tptr(t), has, (size_t)n) : CA_OK;
    if (s == CA_OK) s = ca_comm_broadcast(acc->comm, ca_tptr(t), (size_t)n, CA_U8, 0, NULL);
    if (s == CA_OK && acc->rank != 0) s = ca_device_copy_to_host(acc->device, has, ca_tptr(t), (size_t)n);
    ca_tensor_free(t);
    return s;
}

/* rank0_reads_meta: rank 0 loads (materialising what the file holds), its status reaches every rank,
 * then each parameter it holds goes to the others, which give it memory first. All or nothing, as
 * load_on_rank0: every rank keeps each parameter's meta record first (a few bytes; a host copy of a
 * parameter that has memory already), the ranks agree after the broadcasts that each received them,
 * and when a broadcast or that agreement fails every rank still running makes the parameters meta
 * again with their records: nothing half-filled, nothing for ca_prepare but what was there. */
static ca_status load_meta_on_rank0(ca_accelerator *acc, ca_module *model, const char *where) {
    int n = ca_module_num_params(model), sent = 0, bad = -1;
    ca_ck_kept *kept = NULL;
    unsigned char *has = calloc((size_t)(n ? n : 1), 1);
    ca_status s = has ? ca_ck_keep_params(model, acc->rank, "load_model", &kept)
                      : ca_error(CA_ERR_NOMEM, "load_model: out of host memory (rank %d)", acc->rank);
    s = ck_agree(acc, s, &bad);   /* no rank starts unless every rank kept its records */
    bool started = s == CA_OK;
    if (s == CA_OK && acc->rank == 0) s = load_model(model, where);   /* meta as before when it fails */
    if (started) s = ck_share_rank0(acc, s, "load_model: rank 0 failed to read the model; nothing was loaded");
    bool shared = s == CA_OK;
    if (s == CA_OK) s = share_loaded(acc, model, has);
    for (int i = 0; s == CA_OK && i < n; i++) {
        ca_tensor *p = ca_module_param_at(model, i);
        if (!has[i]) continue;
        ck_test_bcast_stall(acc, sent, "load_model");
        if (ca_tensor_is_meta(p)) s = ca_meta_allocate(p);   /* memory, not its initialisation */
        if (s == CA_OK) s = ca_comm_broadcast(acc->comm, ca_tptr(p), (size_t)p->numel, p->dtype, 0, NULL);
        p->version++;
        sent++;
        if (s != CA_OK) ca_error_context("load_model: broadcasting parameter %s from rank 0", ca_module_param_name(model, i));
    }
    if (shared) s = ck_agree(acc, s, &bad);   /* every rank has them */
    if (shared && s != CA_OK) s = ck_put_back(acc, s, bad, kept);
    ca_ck_kept_free(kept);
    free(has);
    if (s == CA_OK && acc->rank == 0)
        CA_LOG_I("load_model: rank 0 read %s into the meta model and broadcast its %d parameters "
                 "(fsdp_cpu_ram_efficient_loading)", where, sent);
    return s;
}

/* A meta model not yet prepared, to be prepared at stage 3 (ZeRO-3, FULL_SHARD) under
 * fsdp_cpu_ram_efficient_loading: nothing is read now. The files are checked against the model and
 * each meta parameter records where its values lie; ca_prepare then reads on each rank only the
 * bytes of its shard's slices (ca_zero3_build), and no rank holds a whole parameter. */
static bool defers_to_prepare(const ca_accelerator *acc, ca_module *model) {
    if (!acc || acc->model == model || !ca_module_is_meta(model)) return false;
    if (ca_tp_reads_slices(acc)) return true;   /* each rank reads its tp slices at ca_prepare (tp.c) */
    if (acc->zero.stage != 3 || acc->mesh) return false;
    return ca_ram_efficient_loading(acc);
}

static ca_status load_deferred(ca_module *model, const char *where) {
    ca_ck_model_src *m = NULL;
    ca_ck_kept *kept = NULL;   /* a failure part-way records nothing: the records as before */
    ca_status s = ca_ck_model_open(where, model, &m);
    if (s == CA_OK) s = ca_ck_keep_params(model, 0, "load_model", &kept);
    const ck_src *src = s == CA_OK ? &m->src : NULL;
    ca_meta_src **keep = src ? calloc((size_t)src->nfiles + 1, sizeof *keep) : NULL;
    if (src && !keep) s = ca_error(CA_ERR_NOMEM, "load_model: out of host memory");
    for (int i = 0; s == CA_OK && i < src->n; i++) {   /* the meta parameters first: nothing is written yet */
        ca_tensor *p = ca_module_param(model, src->entry[i]->name);
        if (ca_tensor_is_meta(p)) s = ca_meta_record_file(p, src->file_of[i], src->entry[i], &keep[src->file_of[i] - src->files]);
    }
    for (int i = 0; s == CA_OK && i < src->n; i++) {   /* any parameter that has memory already */
        ca_tensor *p = ca_module_param(model, src->entry[i]->name);
        if (!ca_tensor_is_meta(p))
            s = ca_tensor_copy_from_host(p, ca_st_data(src->file_of[i], src->entry[i]),
                                         (size_t)(src->entry[i]->end - src->entry[i]->begin));
    }
    for (int i = 0; keep && i < src->nfiles; i++) ca_meta_src_unref(keep[i]);
    free(keep);
    if (s != CA_OK) ck_undo(kept);
    ca_ck_kept_free(kept);
    ca_ck_model_close(m);
    return s;
}

static ca_status load_model_whole(ca_accelerator *acc, ca_module *model, const char *dir_or_file, size_t unused) {
    (void)unused;
    ca_status s;
    /* stage 3 under fsdp_cpu_ram_efficient_loading (Accelerate's default for FSDP): each rank reads
     * only the slices its shard keeps, no rank gathers the whole model */
    if (acc && acc->model == model && ca_zero3_loads_lean(acc)) {
        ca_ck_model_src *m = NULL;
        s = ca_ck_model_open(dir_or_file, model, &m);
        if (s == CA_OK) s = ca_ck_model_apply_shard(acc, m);
        ca_ck_model_close(m);
        return s;
    }
    if (defers_to_prepare(acc, model)) return load_deferred(model, dir_or_file);
    if (ca_ck_rank0_reads(acc, model)) return load_on_rank0(acc, model, dir_or_file);
    if (rank0_reads_meta(acc, model)) return load_meta_on_rank0(acc, model, dir_or_file);
    bool shards = summon(acc, model, &s);
    if (s == CA_OK) s = load_model(model, dir_or_file);
    ca_status r = shards ? acc->sync_ops->summon(acc, false) : CA_OK;
    return s != CA_OK ? s : r;
}

/* A model prepared under tensor parallelism, its parameters held (not stage 3's shards, which the
 * summon of tp_whole makes whole): each rank reads its slices by byte range (load_tp_slices). */
static bool tp_reads_slices(const ca_accelerator *acc, const ca_module *model) {
    const ca_sync_strategy *ops = acc ? acc->sync_ops : NULL;
    return acc && acc->model == model && ca_tp_reads_slices(acc) && !(ops && ops->params_sharded && ops->params_sharded(acc));
}

/* Under tensor parallelism each rank reads, with pread, its slice of every split parameter (a colwise
 * layer's rows: one range; a rowwise layer's column block: one range a row) and the replicated ones
 * whole, into host buffers of those sizes; nothing is written until every rank has read its part (one
 * status exchange): a failed load changes no rank. The file's pages are not mapped into the rank
 * beyond the header. */
static ca_status load_tp_slices(ca_accelerator *acc, ca_module *model, const char *where) {
    ca_ck_model_src *m = calloc(1, sizeof *m);
    ca_status s = m ? ck_src_open(where, &m->src) : ca_error(CA_ERR_NOMEM, "load_model: out of memory");
    if (s == CA_OK) s = ck_validate(&m->src, model, where, acc);
    if (s == CA_OK) s = ca_ck_model_read_tp(acc, m, false);
    s = ca_agree_file_reads(acc, s, "load_model", "tp slices");
    if (s == CA_OK) s = ca_ck_model_apply(m, model);
    ca_ck_model_close(m);
    return s;
}

/* A model prepared at stage 3 beside tensor parallelism (FULL_SHARD over dp_shard_size, tp_size > 1),
 * fsdp_cpu_ram_efficient_loading true: each rank reads, with pread, only its shard's part of its tp slice
 * of every parameter (stage 3's segments: a range of the tp-local parameter's elements; of a replicated
 * one, of the whole) into host buffers of the segments' sizes; the ranks agree; then the buffers go into
 * the shard. Nothing is gathered: no rank holds a whole layer, nor its whole slice. */
static ca_status load_tp_shard(ca_accelerator *acc, ca_module *model, const char *where) {
    ca_ck_model_src *m = calloc(1, sizeof *m);
    ca_status s = m ? ck_src_open(where, &m->src) : ca_error(CA_ERR_NOMEM, "load_model: out of memory");
    if (s == CA_OK) s = ck_validate(&m->src, model, where, acc);
    if (s == CA_OK) s = ca_ck_model_read_tp_shard(acc, m, false);
    s = ca_agree_file_reads(acc, s, "load_model", "shards of their tp slices");
    if (s == CA_OK) s = ca_ck_model_apply_shard(acc, m);
    ca_ck_model_close(m);
    return s;
}

ca_status ca_load_model(ca_accelerator *acc, ca_module *model, const char *dir_or_file) {
    if (!model || !dir_or_file) return ca_error(CA_ERR_INVALID, "load_model: model and a path are required");
    if (acc && acc->model == model && ca_tp_reads_slices(acc) && ca_zero3_shard_loads_lean(acc))
        return load_tp_shard(acc, model, dir_or_file);
    if (tp_reads_slices(acc, model)) return load_tp_slices(acc, model, dir_or_file);
    return tp_whole(acc, model, dir_or_file, load_model_whole, 0);
}
