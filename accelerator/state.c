/* accelerator/state.c: ca_save_state / ca_load_state (Accelerate's save_state / load_state), its
 * ProjectConfiguration (automatic naming, total_limit), and ca_register_for_checkpointing.
 *
 * Protocol (docs/CHECKPOINTS.md, "Atomicity"): rank 0 creates <dir>.tmp; every rank writes its
 * files there (each atomically, fsync'd); the statuses are exchanged; rank 0 records every file's
 * size and CRC-32 in complete.json inside <dir>.tmp, swaps it with <dir> (or renames it there),
 * removes the previous checkpoint and tells the others. A load checks every file on every rank,
 * exchanges the statuses, and only then applies anything. */
#include "accelerator/sync_impl.h"
#include "comm/comm_impl.h"
#include "accelerator/checkpoint_impl.h"
#include "accelerator/mesh_impl.h"
#include "accelerator/save_copy_impl.h"
#include "tensor/safetensors_impl.h"
#include "base/trace_impl.h"
#include "base/thread_impl.h"
#include "core/json_impl.h"
#include "base/file_impl.h"

#include <caccel/log.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <json-c/json.h>
#include <zlib.h>

#define SS_MODEL "model.safetensors"
#define SS_STATE "caccel_state.json"
#define SS_CONFIG "caccel_config.json"
#define SS_MARKER "complete.json"
#define SS_FORMAT "caccel-state"
#define SS_VERSION 1

/* ------------------------------------------------------------------ small helpers */

static ca_status ss_path(char *buf, const char *dir, const char *name) {
    if ((size_t)snprintf(buf, PATH_MAX, "%s/%s", dir, name) >= PATH_MAX)
        return ca_error(CA_ERR_INVALID, "%s/%s: path too long", dir, name);
    return CA_OK;
}

static void ss_opt_name(char *buf, size_t len, int i) {
    if (i == 0) snprintf(buf, len, "optimizer.safetensors");
    else snprintf(buf, len, "optimizer_%d.safetensors", i);
}

static void ss_custom_name(char *buf, size_t len, int i, bool per_rank, int rank) {
    if (per_rank) snprintf(buf, len, "custom_checkpoint_%d_%d.bin", i, rank);
    else snprintf(buf, len, "custom_checkpoint_%d.bin", i);
}

static void ss_rng_name(char *buf, size_t len, int rank) {
    snprintf(buf, len, "random_states_%d.json", rank);
}

static ca_status ss_write_json(const char *dir, const char *name, json_object *root) {
    char path[PATH_MAX];
    ca_status s = ss_path(path, dir, name);
    if (s != CA_OK) return s;
    size_t len = 0;
    const char *text = json_object_to_json_string_length(
        root, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    return ca_st_write_atomic(path, (const void *const[]){text, "\n"}, (const size_t[]){len, 1}, 2);
}

/* A file of the checkpoint whole; `max`: the size its manifest records (checked already). */
static ca_status ss_read_file(const char *path, uint64_t max, unsigned char **buf, size_t *len) {
    ca_file_kind k = CA_FILE_CHECKPOINT;
    k.max_bytes = max;
    return ca_file_read(path, k, (char **)buf, len);
}

static ca_status ss_sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return ca_error(CA_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? CA_OK : ca_error(CA_ERR_IO, "%s: fsync failed: %s", dir, strerror(errno));
}

static void ss_parent(char *buf, const char *path) {
    snprintf(buf, PATH_MAX, "%s", path);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    char *slash = strrchr(buf, '/');
    if (!slash) snprintf(buf, PATH_MAX, ".");
    else if (slash == buf) buf[1] = '\0';
    else *slash = '\0';
}

static bool ss_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* mkdir -p */
static ca_status ss_mkdirs(const char *dir) {
    char buf[PATH_MAX];
    if ((size_t)snprintf(buf, sizeof buf, "%s", dir) >= sizeof buf)
        return ca_error(CA_ERR_INVALID, "%s: path too long", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return ca_error(CA_ERR_IO, "%s: cannot create the directory: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return ca_error(CA_ERR_IO, "%s: cannot create the directory: %s", buf, strerror(errno));
    return CA_OK;
}

/* ------------------------------------------------------------------ directories save_state may touch
 *
 * save_state removes or replaces a directory only when it is caccel's: empty, or holding one of
 * the regular files below (the ownership file is written into every <dir>.tmp as soon as it is
 * created, so a save killed at any point leaves a directory recognised as caccel's), and no
 * directory. It never follows a symbolic link: a link in the place of a directory is an error,
 * and a directory is emptied through a descriptor opened with O_NOFOLLOW. */

#define SS_OWNER ".caccel_checkpoint"

typedef enum { SS_NONE, SS_DIR, SS_LINK, SS_OTHER } ss_type;

typedef struct ss_dirinfo {
    ss_type type;
    bool empty, owned, complete;   /* complete: a regular complete.json */
    char subdir[256];              /* the first directory inside it, "" if none */
} ss_dirinfo;

static bool ss_is_owner_file(const char *name) {
    return !strcmp(name, SS_OWNER) || !strcmp(name, SS_MARKER) || !strcmp(name, SS_STATE);
}

static const char *ss_base(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The entries of the open directory `fd` (which stays open), not following links. */
static ca_status ss_scan(int fd, const char *path, ss_dirinfo *in) {
    int dup_fd = dup(fd);
    DIR *d = dup_fd < 0 ? NULL : fdopendir(dup_fd);
    if (!d) {
        if (dup_fd >= 0) close(dup_fd);
        return ca_error(CA_ERR_IO, "%s: %s", path, strerror(errno));
    }
    rewinddir(d);   /* the duplicate shares the offset of an earlier scan */
    *in = (ss_dirinfo){.type = SS_DIR, .empty = true};
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        in->empty = false;
        struct stat st;
        if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (S_ISDIR(st.st_mode) && !in->subdir[0]) snprintf(in->subdir, sizeof in->subdir, "%s", e->d_name);
        if (S_ISREG(st.st_mode) && ss_is_owner_file(e->d_name)) {
            in->owned = true;
            in->complete |= !strcmp(e->d_name, SS_MARKER);
        }
    }
    closedir(d);
    return CA_OK;
}

/* What `path` is, without following a link at its end. */
static ca_status ss_inspect(const char *path, ss_dirinfo *in) {
    struct stat st;
    *in = (ss_dirinfo){.type = SS_NONE};
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? CA_OK : ca_error(CA_ERR_IO, "save_state: %s: %s", path, strerror(errno));
    in->type = S_ISLNK(st.st_mode) ? SS_LINK : S_ISDIR(st.st_mode) ? SS_DIR : SS_OTHER;
    if (in->type != SS_DIR) return CA_OK;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return ca_error(CA_ERR_IO, "save_state: %s: %s", path, strerror(errno));
    ca_status s = ss_scan(fd, path, in);
    close(fd);
    return s;
}

/* CA_OK when save_state may remove or replace what `in` describes (`verb`: "removing",
 * "replacing"); else an error naming the path. */
static ca_status ss_check_ours(const char *path, const ss_dirinfo *in, const char *verb) {
    if (in->type == SS_LINK)
        return ca_error(CA_ERR_STATE, "save_state: %s is a symbolic link: not %s it (save_state never "
                        "follows a link; remove it or save elsewhere)", path, verb);
    if (in->type == SS_OTHER)
        return ca_error(CA_ERR_STATE, "save_state: %s exists and is not a directory: not %s it", path, verb);
    if (in->type == SS_DIR && !in->empty && !in->owned)
        return ca_error(CA_ERR_STATE, "save_state: %s exists and is not a checkpoint (no " SS_MARKER ", "
                        SS_STATE " or " SS_OWNER "): not %s it", path, verb);
    if (in->type == SS_DIR && in->subdir[0])
        return ca_error(CA_ERR_STATE, "save_state: %s holds a directory (%s), which no checkpoint does: "
                        "not %s it", path, in->subdir, verb);
    return CA_OK;
}

static void ss_test_stall(const ca_accelerator *acc, const char *phase);

/* Unlinks every entry of `fd` but the ownership files (a checkpoint is flat: files only, checked
 * before). A link is removed as a link. */
static ca_status ss_unlink_entries(int fd, const char *dir) {
    int dup_fd = dup(fd);
    DIR *d = dup_fd < 0 ? NULL : fdopendir(dup_fd);
    if (!d) {
        if (dup_fd >= 0) close(dup_fd);
        return ca_error(CA_ERR_IO, "%s: %s", dir, strerror(errno));
    }
    rewinddir(d);
    struct dirent *e;
    ca_status s = CA_OK;
    while (s == CA_OK && (e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || ss_is_owner_file(e->d_name)) continue;
        if (unlinkat(fd, e->d_name, 0) != 0 && errno != ENOENT)
            s = ca_error(CA_ERR_IO, "%s/%s: cannot remove: %s", dir, e->d_name, strerror(errno));
    }
    closedir(d);
    return s;
}

/* Removes a directory save_state made (nothing when there is none), or fails naming it when it is
 * not one (ss_check_ours). complete.json goes first, so that a crash half-way leaves an incomplete
 * checkpoint, never one that looks complete; the other ownership files go last, so that what a
 * crash leaves is still recognised as caccel's. `phase`: the test hook's name for this removal. */
static ca_status ss_remove_dir(const ca_accelerator *acc, const char *dir, const char *phase) {
    char parent[PATH_MAX];
    ss_parent(parent, dir);
    ss_dirinfo in;
    ca_status s = ss_inspect(dir, &in);
    if (s != CA_OK || in.type == SS_NONE) return s;
    if ((s = ss_check_ours(dir, &in, "removing")) != CA_OK) return s;
    int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int fd = pfd < 0 ? -1 : openat(pfd, ss_base(dir), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) s = ca_error(CA_ERR_IO, "save_state: %s: %s", dir, strerror(errno));
    if (s == CA_OK) s = ss_scan(fd, dir, &in);   /* again, through the descriptor that is emptied */
    if (s == CA_OK) s = ss_check_ours(dir, &in, "removing");
    if (s == CA_OK && unlinkat(fd, SS_MARKER, 0) != 0 && errno != ENOENT)
        s = ca_error(CA_ERR_IO, "%s/" SS_MARKER ": cannot remove: %s", dir, strerror(errno));
    if (s == CA_OK && phase) ss_test_stall(acc, phase);
    if (s == CA_OK) s = ss_unlink_entries(fd, dir);
    static const char *const last[] = {SS_STATE, SS_OWNER};
    for (int i = 0; s == CA_OK && i < 2; i++)
        if (unlinkat(fd, last[i], 0) != 0 && errno != ENOENT)
            s = ca_error(CA_ERR_IO, "%s/%s: cannot remove: %s", dir, last[i], strerror(errno));
    if (s == CA_OK && unlinkat(pfd, ss_base(dir), AT_REMOVEDIR) != 0)
        s = ca_error(CA_ERR_IO, "%s: cannot remove the directory: %s", dir, strerror(errno));
    if (fd >= 0) close(fd);
    if (pfd >= 0) close(pfd);
    return s;
}

/* Every rank's status to every rank. CA_OK when all are; else the first failing rank's status,
 * *bad set to that rank. A failed exchange (a peer died) is returned as it is, *bad = -1. */
static ca_status ss_exchange(ca_accelerator *acc, ca_status mine, int *bad) {
    *bad = mine != CA_OK ? acc->rank : -1;
    if (acc->world <= 1) return mine;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ca_last_error());
    ca_status out = CA_OK;
    CA_SCOPE {
        ca_tensor *t = ca_zeros(ca_accelerator_device(acc), CA_F32, CA_SHAPE(acc->world));
        float *v = malloc((size_t)acc->world * sizeof *v);
        out = t && v ? CA_OK : ca_error(CA_ERR_NOMEM, "save/load_state: out of memory");
        if (out == CA_OK) {
            for (int r = 0; r < acc->world; r++) v[r] = r == acc->rank ? (float)mine : 0.0f;
            out = ca_tensor_copy_from_host(t, v, (size_t)acc->world * sizeof *v);
        }
        if (out == CA_OK) out = ca_reduce(acc, t, CA_OP_SUM);
        if (out == CA_OK) out = ca_tensor_to_host(t, v, (size_t)acc->world * sizeof *v);
        for (int r = 0; out == CA_OK && r < acc->world && *bad < 0; r++)
            if (v[r] != 0.0f) *bad = r, mine = (ca_status)(int)v[r];
        free(v);
    }
    if (out != CA_OK) {
        *bad = -1;
        return out;
    }
    if (*bad == acc->rank) ca_error(mine, "%s", msg);   /* keep this rank's own message */
    return *bad < 0 ? CA_OK : mine;
}

/* ------------------------------------------------------------------ JSON reading */

typedef struct ss_json {
    const char *file;
    bool bad;
} ss_json;

static json_object *js_get(ss_json *j, json_object *o, const char *key, json_type type) {
    json_object *v = NULL;
    if (j->bad) return NULL;
    bool ok = o && json_object_object_get_ex(o, key, &v) &&
              (json_object_is_type(v, type) || (type == json_type_double && json_object_is_type(v, json_type_int)));
    if (ok) return v;
    j->bad = true;
    ca_error(CA_ERR_IO, "%s: key \"%s\" is missing or not a%s %s", j->file, key,
             type == json_type_int || type == json_type_object || type == json_type_array ? "n" : "",
             json_type_to_name(type));
    return NULL;
}

static int64_t js_int(ss_json *j, json_object *o, const char *key) {
    json_object *v = js_get(j, o, key, json_type_int);
    return v ? json_object_get_int64(v) : 0;
}

static uint64_t js_u64(ss_json *j, json_object *o, const char *key) {
    json_object *v = js_get(j, o, key, json_type_int);
    return v ? json_object_get_uint64(v) : 0;
}

static double js_double(ss_json *j, json_object *o, const char *key) {
    json_object *v = js_get(j, o, key, json_type_double);
    return v ? json_object_get_double(v) : 0;
}

static bool js_bool(ss_json *j, json_object *o, const char *key) {
    json_object *v = js_get(j, o, key, json_type_boolean);
    return v && json_object_get_boolean(v);
}

static const char *js_str(ss_json *j, json_object *o, const char *key) {
    json_object *v = js_get(j, o, key, json_type_string);
    return v ? json_object_get_string(v) : "";
}

static ca_status js_load(const char *path, json_object **out) {
    char why[256];
    ca_status s;
    *out = ca_json_load(path, CA_FILE_CHECKPOINT_JSON, why, sizeof why, &s);
    if (*out && json_object_is_type(*out, json_type_object)) return CA_OK;
    if (!*out && !why[0]) return s;   /* the reader's error names the file */
    if (*out) snprintf(why, sizeof why, "a JSON %s, not an object", json_type_to_name(json_object_get_type(*out)));
    json_object_put(*out);
    *out = NULL;
    return ca_error(CA_ERR_IO, "%s: cannot read the JSON: %s", path, why);
}

/* ------------------------------------------------------------------ saving: the pieces */

static json_object *ss_schedule_json(const ca_optimizer *o) {
    if (!o->has_schedule) return NULL;
    static const char *const kinds[] = {"constant", "linear", "cosine"};
    json_object *s = json_object_new_object();
    json_object_object_add(s, "kind", json_object_new_string(kinds[o->schedule.kind]));
    json_object_object_add(s, "warmup_steps", json_object_new_int64(o->schedule.warmup_steps));
    json_object_object_add(s, "total_steps", json_object_new_int64(o->schedule.total_steps));
    json_object_object_add(s, "min_lr_ratio", json_object_new_double(o->schedule.min_lr_ratio));
    return s;
}

static json_object *ss_group_json(const ca_optimizer *o, const ca_optim_group *g) {
    json_object *j = json_object_new_object();
    json_object_object_add(j, "num_params", json_object_new_int(g->n));
    json_object_object_add(j, "lr", json_object_new_double(g->lr));
    json_object_object_add(j, "base_lr", json_object_new_double(g->base_lr));
    if (o->kind == CA_OPTIM_ADAMW) {
        json_object_object_add(j, "beta1", json_object_new_double(g->adamw.beta1));
        json_object_object_add(j, "beta2", json_object_new_double(g->adamw.beta2));
        json_object_object_add(j, "eps", json_object_new_double(g->adamw.eps));
        json_object_object_add(j, "weight_decay", json_object_new_double(g->adamw.weight_decay));
    } else {
        json_object_object_add(j, "momentum", json_object_new_double(g->sgd.momentum));
        json_object_object_add(j, "dampening", json_object_new_double(g->sgd.dampening));
        json_object_object_add(j, "weight_decay", json_object_new_double(g->sgd.weight_decay));
        json_object_object_add(j, "nesterov", json_object_new_boolean(g->sgd.nesterov));
    }
    return j;
}

static json_object *ss_optimizer_json(ca_optimizer *o, const char *file) {
    json_object *j = json_object_new_object(), *groups = json_object_new_array();
    json_object_object_add(j, "file", json_object_new_string(file));
    json_object_object_add(j, "kind", json_object_new_string(o->kind == CA_OPTIM_ADAMW ? "adamw" : "sgd"));
    json_object_object_add(j, "steps", json_object_new_int64(o->steps));
    json_object_object_add(j, "num_params", json_object_new_int(ca_optimizer_num_params(o)));
    json_object_object_add(j, "schedule_stride", json_object_new_int64(o->schedule_stride));
    json_object *sched = ss_schedule_json(o);
    json_object_object_add(j, "schedule", sched ? sched : json_object_new_null());
    for (int g = 0; g < o->ngroups; g++) json_object_array_add(groups, ss_group_json(o, &o->groups[g]));
    json_object_object_add(j, "param_groups", groups);
    return j;
}

/* The optimizer's state tensors, copied to the host where they are not in host memory, as one
 * safetensors file. */
static ca_status ss_save_optimizer(ca_optimizer *o, const char *path) {
    int n = ca_optimizer_num_state(o);
    ca_st_tensor *t = calloc((size_t)(n ? n : 1), sizeof *t);
    ca_status s = t ? CA_OK : ca_error(CA_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; s == CA_OK && i < n; i++) {
        const char *name = NULL;
        ca_tensor *x = ca_optimizer_state_at(o, i, &name);
        if (!x) s = ca_error(CA_ERR_INTERNAL, "%s: no state tensor %d", path, i);
        else ca_ck_st_tensor(x, name, &t[i]);   /* a device's copied when the file is made */
    }
    if (s == CA_OK) s = ca_st_write(path, t, n);
    free(t);
    return s;
}

static json_object *ss_loader_json(const ca_dataloader *dl) {
    ca_loader_state ls;
    ca_dataloader_get_state(dl, &ls);
    json_object *j = json_object_new_object();
    json_object_object_add(j, "epoch", json_object_new_int64(ls.epoch));
    json_object_object_add(j, "position", json_object_new_int64(ls.position));
    json_object_object_add(j, "batches_per_epoch", json_object_new_int64(ls.rank_batches));
    json_object_object_add(j, "batch_size", json_object_new_int64(ls.batch_size));
    json_object_object_add(j, "dataset_length", json_object_new_int64(ls.dataset_len));
    json_object_object_add(j, "seed", json_object_new_uint64(ls.seed));
    json_object_object_add(j, "shuffle", json_object_new_boolean(ls.shuffle));
    json_object_object_add(j, "drop_last", json_object_new_boolean(ls.drop_last));
    json_object_object_add(j, "world_size", json_object_new_int(ls.world));
    json_object_object_add(j, "split_batches", json_object_new_boolean(ls.split));
    return j;
}

static json_object *ss_state_json(ca_accelerator *acc, int64_t iteration) {
    json_object *root = json_object_new_object();
    json_object_object_add(root, "format", json_object_new_string(SS_FORMAT));
    json_object_object_add(root, "version", json_object_new_int(SS_VERSION));
    json_object_object_add(root, "world_size", json_object_new_int(acc->world));
    json_object_object_add(root, "iteration", json_object_new_int64(iteration));
    json_object_object_add(root, "micro_step", json_object_new_int64(acc->micro_step));
    json_object *gs = json_object_new_object();
    json_object_object_add(gs, "scale", json_object_new_double(acc->scaler.scale));
    json_object_object_add(gs, "growth_tracker", json_object_new_int64(acc->scaler.growth_tracker));
    json_object_object_add(root, "grad_scaler", gs);
    json_object *model = json_object_new_null();
    if (acc->model) {
        model = json_object_new_object();
        json_object_object_add(model, "file", json_object_new_string(SS_MODEL));
        json_object_object_add(model, "num_params", json_object_new_int(ca_module_num_params(acc->model)));
        json_object *frozen = json_object_new_array();   /* requires_grad false, by name */
        for (int i = 0; i < ca_module_num_params(acc->model); i++)
            if (!acc->model->flat[i]->requires_grad)
                json_object_array_add(frozen, json_object_new_string(acc->model->flat_names[i]));
        json_object_object_add(model, "frozen", frozen);
    }
    json_object_object_add(root, "model", model);
    json_object *opts = json_object_new_array(), *loaders = json_object_new_array();
    json_object *custom = json_object_new_array();
    for (int i = 0; i < acc->nopts; i++) {
        char name[64];
        ss_opt_name(name, sizeof name, i);
        json_object_array_add(opts, ss_optimizer_json(acc->opts[i], name));
    }
    for (int i = 0; i < acc->nloaders; i++) json_object_array_add(loaders, ss_loader_json(acc->loaders[i]));
    for (int i = 0; i < acc->ncustom; i++) {
        json_object *c = json_object_new_object();
        json_object_object_add(c, "name", json_object_new_string(acc->custom[i].name));
        json_object_object_add(c, "per_rank", json_object_new_boolean(acc->custom[i].per_rank));
        json_object_array_add(custom, c);
    }
    json_object_object_add(root, "optimizers", opts);
    json_object_object_add(root, "dataloaders", loaders);
    json_object_object_add(root, "custom", custom);
    return root;
}

static json_object *ss_config_json(const ca_config *cfg) {
    static const char *const src[] = {"default", "program", "file", "environment", "command line"};
    json_object *root = json_object_new_object(), *keys = json_object_new_object();
    json_object_object_add(root, "config_file", ca_config_file(cfg) ? json_object_new_string(ca_config_file(cfg))
                                                                    : json_object_new_null());
    for (int i = 0; i < ca_config_count(cfg); i++) {
        ca_config_entry e;
        if (ca_config_entry_at(cfg, i, &e) != CA_OK) continue;
        json_object *k = json_object_new_object();
        json_object_object_add(k, "value", e.value ? json_object_new_string(e.value) : json_object_new_null());
        json_object_object_add(k, "origin", json_object_new_string(e.origin ? e.origin : ""));
        json_object_object_add(k, "source", json_object_new_string(src[e.source]));
        json_object_object_add(keys, e.key, k);
    }
    json_object_object_add(root, "keys", keys);
    return root;
}

static ca_status ss_save_custom(const ca_checkpointable *c, const char *dir, const char *name) {
    char path[PATH_MAX];
    ca_status s = ss_path(path, dir, name);
    void *data = NULL;
    size_t len = 0;
    if (s == CA_OK) s = c->save(c->ctx, &data, &len);
    if (s != CA_OK) {
        free(data);
        return ca_error_context("save_state: custom object '%s'", c->name);
    }
    s = ca_st_write_atomic(path, (const void *const[]){data ? data : ""}, (const size_t[]){len}, 1);
    free(data);
    return s;
}

static ca_status ss_save_rng(const ca_accelerator *acc, const char *dir) {
    uint64_t seed, offset;
    ca_rng_get_state(&seed, &offset);
    json_object *j = json_object_new_object();
    json_object_object_add(j, "rank", json_object_new_int(acc->rank));
    json_object_object_add(j, "seed", json_object_new_uint64(seed));
    json_object_object_add(j, "offset", json_object_new_uint64(offset));
    char name[64];
    ss_rng_name(name, sizeof name, acc->rank);
    ca_status s = ss_write_json(dir, name, j);
    json_object_put(j);
    return s;
}

/* This rank's files: rank 0 the replicated state, every rank its own. */
static ca_status ss_save_local(ca_accelerator *acc, const char *dir, int64_t iteration, bool sharded) {
    ca_status s = ss_save_rng(acc, dir);
    char name[64], path[PATH_MAX];
    for (int i = 0; s == CA_OK && i < acc->ncustom; i++) {
        if (!acc->custom[i].per_rank && acc->rank != 0) continue;
        ss_custom_name(name, sizeof name, i, acc->custom[i].per_rank, acc->rank);
        s = ss_save_custom(&acc->custom[i], dir, name);
    }
    if (acc->rank != 0) return s;
    if (s == CA_OK && acc->model && !sharded) s = ca_ck_save_model_files(acc->model, dir, 0);
    for (int i = 0; s == CA_OK && !sharded && i < acc->nopts; i++) {
        ss_opt_name(name, sizeof name, i);
        s = ss_path(path, dir, name);
        if (s == CA_OK) s = ss_save_optimizer(acc->opts[i], path);
    }
    if (s == CA_OK) {
        json_object *j = ss_state_json(acc, iteration);
        s = ss_write_json(dir, SS_STATE, j);
        json_object_put(j);
    }
    if (s == CA_OK) {
        json_object *j = ss_config_json(acc->cfg);
        s = ss_write_json(dir, SS_CONFIG, j);
        json_object_put(j);
    }
    return s;
}

/* Tensor parallelism over a strategy that keeps the optimizer state in parts (ZeRO): the full state is
 * gathered from the parts before the tp slices are made whole (with_full_params, where it is made whole
 * over tp too) and kept into the parts after they are split again; a save or a load between them sees
 * per-parameter tensors, whole. */
static bool ss_state_whole_outside(const ca_accelerator *acc) {
    return acc->mesh && acc->model && acc->sync_ops->gather_state && acc->sync_ops->scatter_state;
}

/* A strategy that keeps the optimizer state in parts (sync_zero.c): either each rank saves its part
 * (SHARDED_STATE_DICT), or the full state is gathered from every rank's part for the files rank 0
 * writes (FULL_STATE_DICT), then freed again. Collective. */
static ca_status ss_save_local_full(ca_accelerator *acc, const char *dir, int64_t iteration) {
    const ca_sync_strategy *ops = acc->sync_ops;
    if (ops->saves_shards && ops->saves_shards(acc)) {   /* each rank its shard, no full files */
        ca_status s = ops->save_shard(acc, dir);
        return s == CA_OK ? ss_save_local(acc, dir, iteration, true) : s;
    }
    bool own = !ss_state_whole_outside(acc);
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && own && ops->gather_state && i < acc->nopts; i++) s = ops->gather_state(acc, acc->opts[i]);
    if (s == CA_OK) s = ss_save_local(acc, dir, iteration, false);
    for (int i = 0; own && ops->drop_state && i < acc->nopts; i++) ops->drop_state(acc->opts[i]);
    return s;
}

/* ------------------------------------------------------------------ saving: the protocol */

/* Test hook: CACCEL_TEST_SAVE_STALL=<phase>:<n> stops this process at <phase> of its n-th save, so
 * that a test can kill it there: "files" (every rank: its files written), and on rank 0 "manifest"
 * (complete.json written inside <dir>.tmp), "aside" (where no swap exists: the previous <dir> moved
 * to <dir>.old), "renamed" (the new checkpoint is at <dir>), "removing" (the previous one half
 * removed: its complete.json gone), "pruning" (the same for a checkpoint beyond total_limit). */
static void ss_test_stall(const ca_accelerator *acc, const char *phase) {
    const char *v = getenv("CACCEL_TEST_SAVE_STALL");
    size_t n = strlen(phase);
    if (!v || strncmp(v, phase, n) != 0 || v[n] != ':' || atoi(v + n + 1) != acc->nsaves) return;
    fprintf(stderr, "save_state: rank %d stalled at '%s' of save %d (CACCEL_TEST_SAVE_STALL)\n",
            acc->rank, phase, acc->nsaves);
    fflush(stderr);
    for (;;) pause();
}

/* The chunk size the manifest records (CACCEL_TEST_ST_CHUNK: another, for tests of small files). */
static uint64_t ss_chunk_size(void) {
    const char *v = getenv("CACCEL_TEST_ST_CHUNK");
    long long n = v ? atoll(v) : 0;
    return n > 0 ? (uint64_t)n : CA_ST_CHUNK_SIZE;
}

/* Size and CRC-32 of a file, read in 4 MiB pieces (the files are still in the page cache; a whole
 * copy would cost a fresh allocation as large as the file). want >= 0: a file of another size is
 * refused before it is read. chunks: also the CRC-32 of every ss_chunk_size() bytes, appended. */
static ca_status ss_file_crc(const char *path, int64_t want, size_t *len, uint32_t *crc, json_object *chunks) {
    int fd;
    uint64_t size;
    ca_status s = ca_file_open(path, CA_FILE_CHECKPOINT, &fd, &size);
    if (s != CA_OK) return s;
    if (want >= 0 && size != (uint64_t)want) {
        close(fd);
        return ca_error(CA_ERR_IO, "%s: %s: %llu bytes, the checkpoint recorded %" PRId64, path,
                        size < (uint64_t)want ? "truncated" : "size differs", (unsigned long long)size, want);
    }
    uint64_t cs = ss_chunk_size(), piece = chunks ? cs : 4 << 20;
    if (piece > (64u << 20)) piece = 4 << 20;   /* a chunk read in pieces would need its own running CRC */
    unsigned char *buf = malloc(piece);
    uLong c = crc32(0L, Z_NULL, 0), cc = c;
    size_t total = 0;
    int64_t k = 0;
    while (buf && (k = ca_file_read_fd(fd, buf, piece)) > 0) {
        c = crc32(c, buf, (uInt)k);
        if (chunks) json_object_array_add(chunks, json_object_new_int64((int64_t)crc32(cc, buf, (uInt)k)));
        total += (size_t)k;
    }
    s = !buf ? ca_error(CA_ERR_NOMEM, "%s: out of memory", path)
        : k < 0 ? ca_error(CA_ERR_IO, "%s: read failed: %s", path, strerror(errno))
        : chunks && piece != cs ? ca_error(CA_ERR_INVALID, "%s: CACCEL_TEST_ST_CHUNK above 64 MiB", path) : CA_OK;
    free(buf);
    close(fd);
    *len = total;
    *crc = (uint32_t)c;
    return s;
}

static bool ss_ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Size and CRC-32 of a file this thread wrote from the host copy `known` (crcs[i] of its file i,
 * computed from memory while the disk wrote it), and its chunk sums (chunks non-NULL): those the
 * write computed on the way (the CRC-32 was combined from them), else from memory; false when it
 * is not one of them. */
static bool ss_known_crc(const ca_st_capture *known, const uint32_t *crcs, const char *path, size_t *len,
                         uint32_t *crc, json_object *chunks) {
    for (int i = 0; known && crcs && i < known->n; i++)
        if (!strcmp(known->files[i].path, path)) {
            const ca_st_held *h = &known->files[i];
            *len = h->len;
            *crc = crcs[i];
            uint64_t cs = ss_chunk_size();
            if (chunks && h->sums && h->nsums == (h->len ? (h->len - 1) / cs + 1 : 0)) {   /* from the write */
                for (size_t k = 0; k < h->nsums; k++) json_object_array_add(chunks, json_object_new_int64(h->sums[k]));
                return true;
            }
            for (size_t at = 0; chunks && at < h->len; at += cs) {
                size_t k = h->len - at < cs ? h->len - at : (size_t)cs;
                json_object_array_add(chunks, json_object_new_int64((int64_t)crc32(crc32(0L, Z_NULL, 0),
                                                                                    h->data + at, (uInt)k)));
            }
            return true;
        }
    return false;
}

/* The manifest: every file of `dir` with its size and CRC-32 (read back, but for those of `known`). */
static ca_status ss_manifest(const char *dir, int world, const ca_st_capture *known, const uint32_t *crcs,
                             json_object **out) {
    DIR *d = opendir(dir);
    if (!d) return ca_error(CA_ERR_IO, "%s: %s", dir, strerror(errno));
    json_object *files = json_object_new_object();
    struct dirent *e;
    ca_status s = CA_OK;
    while (s == CA_OK && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[PATH_MAX];
        size_t len = 0;
        uint32_t crc = 0;
        s = ss_path(path, dir, e->d_name);
        /* safetensors files: chunk sums too, so that a load verifies only the ranges it reads */
        json_object *chunks = ss_ends_with(e->d_name, ".safetensors") ? json_object_new_array() : NULL;
        if (s == CA_OK && !ss_known_crc(known, crcs, path, &len, &crc, chunks))
            s = ss_file_crc(path, -1, &len, &crc, chunks);
        if (s != CA_OK) {
            json_object_put(chunks);
            break;
        }
        json_object *f = json_object_new_object();
        json_object_object_add(f, "size", json_object_new_int64((int64_t)len));
        json_object_object_add(f, "crc32", json_object_new_int64(crc));
        if (chunks) json_object_object_add(f, "chunk_size", json_object_new_int64((int64_t)ss_chunk_size()));
        if (chunks) json_object_object_add(f, "chunk_crc32", chunks);
        json_object_object_add(files, e->d_name, f);
    }
    closedir(d);
    if (s != CA_OK) {
        json_object_put(files);
        return s;
    }
    *out = json_object_new_object();
    json_object_object_add(*out, "format", json_object_new_string("caccel-checkpoint"));
    json_object_object_add(*out, "version", json_object_new_int(SS_VERSION));
    json_object_object_add(*out, "world_size", json_object_new_int(world));
    json_object_object_add(*out, "files", files);
    return CA_OK;
}

/* Swaps the directories `a` and `b` in one step; -1 with errno ENOSYS where the system (or, with
 * EINVAL or ENOTSUP, the file system) cannot. CACCEL_TEST_SAVE_NO_SWAP=1 takes the path of those
 * systems, so that it is tested here too. */
static int ss_swap(const char *a, const char *b) {
    const char *v = getenv("CACCEL_TEST_SAVE_NO_SWAP");
    if (v && !strcmp(v, "1")) {
        errno = ENOSYS;
        return -1;
    }
#if defined(RENAME_EXCHANGE)   /* Linux 3.15, glibc 2.28 */
    return renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE);
#elif defined(RENAME_SWAP)     /* macOS 10.12 */
    return renamex_np(a, b, RENAME_SWAP);
#else
    (void)a, (void)b;
    errno = ENOSYS;
    return -1;
#endif
}

/* Puts the complete <tmp> at <dir>. An existing <dir> is swapped with it in one step where the
 * system can: <dir> is the previous complete checkpoint up to that instant and the new one after
 * it. Elsewhere the previous <dir> moves to <dir>.old first; in between, load_state finds the
 * complete <dir>.tmp. *prev gets where the previous checkpoint lies now ("" when there was none). */
static ca_status ss_publish(const ca_accelerator *acc, const char *tmp, const char *dir, char *prev) {
    char parent[PATH_MAX];
    struct stat st;
    ss_parent(parent, dir);
    prev[0] = '\0';
    bool had = lstat(dir, &st) == 0;
    if (!had && errno != ENOENT) return ca_error(CA_ERR_IO, "%s: %s", dir, strerror(errno));
    if (had && ss_swap(tmp, dir) == 0) {
        snprintf(prev, PATH_MAX, "%s", tmp);
        return ss_sync_dir(parent);
    }
    if (had && errno != ENOSYS && errno != EINVAL && errno != ENOTSUP)
        return ca_error(CA_ERR_IO, "%s: cannot swap with %s: %s", tmp, dir, strerror(errno));
    if (had) {
        snprintf(prev, PATH_MAX, "%s.old", dir);
        if (rename(dir, prev) != 0)
            return ca_error(CA_ERR_IO, "%s: cannot move the previous checkpoint to %s: %s", dir, prev,
                            strerror(errno));
        ca_status s = ss_sync_dir(parent);
        if (s != CA_OK) return s;
        ss_test_stall(acc, "aside");
    }
    if (rename(tmp, dir) != 0)
        return ca_error(CA_ERR_IO, "%s: cannot rename to %s: %s", tmp, dir, strerror(errno));
    return ss_sync_dir(parent);
}

/* Rank 0, once every rank has written: the manifest, complete.json, goes into <dir>.tmp (fsync'd
 * with it), so that the directory is complete before it is published; then it is put at <dir>
 * and the previous checkpoint removed. *published: whether <dir>.tmp has moved. */
static ca_status ss_finish(ca_accelerator *acc, const char *tmp, const char *dir, const ca_st_capture *known,
                           const uint32_t *crcs, bool *published) {
    json_object *man = NULL;
    char prev[PATH_MAX];
    *published = false;
    ca_status s = ss_manifest(tmp, acc->world, known, crcs, &man);
    if (s == CA_OK) s = ss_write_json(tmp, SS_MARKER, man);   /* atomic; fsyncs the file and tmp */
    json_object_put(man);
    if (s == CA_OK) {
        ss_test_stall(acc, "manifest");
        *published = true;
        s = ss_publish(acc, tmp, dir, prev);
    }
    if (s == CA_OK) ss_test_stall(acc, "renamed");
    if (s == CA_OK && prev[0]) s = ss_remove_dir(acc, prev, "removing");
    if (s != CA_OK) ca_error_context("save_state: %s", dir);
    return s;
}

static const char *ss_cfg_str(const ca_accelerator *acc, const char *key) {
    const char *v = ca_config_get(acc->cfg, key);
    return v && strcmp(v, "null") != 0 && v[0] ? v : NULL;
}

static int64_t ss_iteration(ca_accelerator *acc) {
    if (!acc->iteration_known) {
        int64_t it = 0;
        if (ca_config_get_int(acc->cfg, "iteration", &it) != CA_OK) it = 0;
        acc->iteration = it;
        acc->iteration_known = true;
    }
    return acc->iteration;
}

static ca_status ss_checkpoints_dir(const ca_accelerator *acc, char *buf) {
    const char *pd = ss_cfg_str(acc, "project_dir");
    return ss_path(buf, pd ? pd : ".", "checkpoints");
}

/* checkpoint_<n> -> n; -1 for other names. */
static int64_t ss_checkpoint_number(const char *name) {
    if (strncmp(name, "checkpoint_", 11) != 0 || !name[11]) return -1;
    int64_t n = 0;
    for (const char *p = name + 11; *p; p++) {
        if (*p < '0' || *p > '9' || n > INT64_MAX / 10 - 10) return -1;
        n = n * 10 + (*p - '0');
    }
    return n;
}

typedef struct ss_ck {
    int64_t n;
    bool complete;
} ss_ck;

static int ss_cmp_ck(const void *a, const void *b) {
    int64_t x = ((const ss_ck *)a)->n, y = ((const ss_ck *)b)->n;
    return (x > y) - (x < y);
}

/* The checkpoint_<n> directories under `root`, ascending. A link of that name is not one of them:
 * it is neither loaded nor removed. */
static ca_status ss_list(const char *root, ss_ck **out, int *count) {
    *out = NULL;
    *count = 0;
    DIR *d = opendir(root);
    if (!d) return errno == ENOENT ? CA_OK : ca_error(CA_ERR_IO, "%s: %s", root, strerror(errno));
    struct dirent *e;
    int cap = 0;
    ca_status s = CA_OK;
    while ((e = readdir(d)) != NULL) {
        int64_t n = ss_checkpoint_number(e->d_name);
        char dir[PATH_MAX], marker[PATH_MAX];
        struct stat st;
        if (n < 0 || ss_path(dir, root, e->d_name) != CA_OK || ss_path(marker, dir, SS_MARKER) != CA_OK ||
            lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
            continue;
        if (*count == cap) {
            ss_ck *p = realloc(*out, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *p);
            if (!p) {
                s = ca_error(CA_ERR_NOMEM, "%s: out of memory", root);
                break;
            }
            *out = p;
        }
        (*out)[(*count)++] = (ss_ck){n, lstat(marker, &st) == 0 && S_ISREG(st.st_mode)};
    }
    closedir(d);
    if (s == CA_OK) qsort(*out, (size_t)*count, sizeof **out, ss_cmp_ck);
    return s;
}

/* total_limit, or 0 where none is set. Read by the calling thread: an asynchronous save prunes on
 * its own thread, which does not read the configuration. */
static int64_t ss_total_limit(const ca_accelerator *acc) {
    int64_t limit = 0;
    if (!ss_cfg_str(acc, "total_limit") || ca_config_get_int(acc->cfg, "total_limit", &limit) != CA_OK) return 0;
    return limit > 0 ? limit : 0;
}

/* total_limit (rank 0, after a save): the oldest complete checkpoints beyond the limit go, and so
 * do the incomplete ones older than the newest complete one (what a save or a removal killed
 * half-way left: load_state never picks them); an incomplete one that is not caccel's stays. */
static ca_status ss_apply_limit(const ca_accelerator *acc, const char *root, int64_t limit) {
    if (limit <= 0) return CA_OK;
    ss_ck *ck = NULL;
    int n = 0, complete = 0, newest = -1;
    ca_status s = ss_list(root, &ck, &n);
    for (int i = 0; i < n; i++) {
        complete += ck[i].complete;
        if (ck[i].complete) newest = i;
    }
    for (int i = 0; s == CA_OK && i < newest; i++) {
        if (ck[i].complete && complete <= limit) continue;
        char dir[PATH_MAX], name[64];
        ss_dirinfo in;
        snprintf(name, sizeof name, "checkpoint_%" PRId64, ck[i].n);
        s = ss_path(dir, root, name);
        if (s == CA_OK && !ck[i].complete &&
            (ss_inspect(dir, &in) != CA_OK || ss_check_ours(dir, &in, "removing") != CA_OK)) {
            CA_LOG_W("%s", ca_last_error());   /* not caccel's: left where it is */
            continue;
        }
        if (s == CA_OK) s = ss_remove_dir(acc, dir, "pruning");
        if (s == CA_OK) CA_LOG_I("save_state: total_limit %" PRId64 ": removed %s%s", limit, dir,
                                 ck[i].complete ? "" : " (incomplete)");
        complete -= ck[i].complete;
    }
    free(ck);
    return s;
}

/* Rank 0, a named directory that is not complete: the complete checkpoint an interrupted save left
 * beside it (<dir>.tmp, the newer, else <dir>.old) is put back at <dir> first, so that the save
 * starts, as every save does, with the latest complete checkpoint at <dir>. */
static ca_status ss_recover(const ca_accelerator *acc, const char *dir, const ss_dirinfo *d, const char *tmp,
                            const ss_dirinfo *t, const char *old, const ss_dirinfo *o) {
    const char *from = t->type == SS_DIR && t->complete ? tmp : o->type == SS_DIR && o->complete ? old : NULL;
    if (!from) return CA_OK;
    ca_status s = d->type == SS_DIR ? ss_remove_dir(acc, dir, NULL) : CA_OK;   /* incomplete: nothing lost */
    char parent[PATH_MAX];
    ss_parent(parent, dir);
    if (s == CA_OK && rename(from, dir) != 0)
        s = ca_error(CA_ERR_IO, "save_state: %s: cannot move it back to %s: %s", from, dir, strerror(errno));
    if (s == CA_OK) s = ss_sync_dir(parent);
    if (s == CA_OK)
        CA_LOG_W("save_state: %s was not a complete checkpoint; moved %s, the complete one an interrupted "
                 "save left, back in its place", dir, from);
    return s;
}

/* <dir>.tmp, new, with the file that marks it as caccel's. The file is created under its own name, not
 * written elsewhere and renamed: a process killed at any point here leaves a directory that is empty or
 * holds that file (its text is not read), both of which a later save recognises as its own and
 * removes; a rename's temporary file would leave one it must refuse to touch. */
static ca_status ss_make_tmp(const char *tmp) {
    static const char text[] = "caccel save_state made this directory; it removes it only while this file is here\n";
    char path[PATH_MAX];
    if (mkdir(tmp, 0755) != 0)
        return ca_error(CA_ERR_IO, "%s: cannot create the directory: %s", tmp, strerror(errno));
    ca_status s = ss_path(path, tmp, SS_OWNER);
    int fd = s == CA_OK ? open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644) : -1;
    if (s == CA_OK && fd < 0) s = ca_error(CA_ERR_IO, "%s: cannot create it: %s", path, strerror(errno));
    if (fd >= 0 && write(fd, text, sizeof text - 1) != (ssize_t)(sizeof text - 1))
        s = ca_error(CA_ERR_IO, "%s: cannot write it: %s", path, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && s == CA_OK)
        s = ca_error(CA_ERR_IO, "%s: cannot write it: %s", path, strerror(errno));
    if (s != CA_OK) {   /* empty again */
        if (fd >= 0) unlink(path);
        rmdir(tmp);
    }
    return s;
}

/* Rank 0: the parent exists, <dir> is none or caccel's (and, automatically named, not complete),
 * <dir>.tmp is new and <dir>.old gone. Everything is checked before anything is removed. */
static ca_status ss_prepare_dirs(const ca_accelerator *acc, const char *dir, const char *tmp, bool automatic) {
    char parent[PATH_MAX], old[PATH_MAX];
    ss_dirinfo d, t, o;
    ss_parent(parent, dir);
    snprintf(old, sizeof old, "%.*s.old", PATH_MAX - 5, dir);
    ca_status s = ss_inspect(dir, &d);
    if (s == CA_OK) s = ss_check_ours(dir, &d, "replacing");
    if (s == CA_OK) s = ss_inspect(tmp, &t);
    if (s == CA_OK) s = ss_check_ours(tmp, &t, "removing");
    if (s == CA_OK) s = ss_inspect(old, &o);
    if (s == CA_OK) s = ss_check_ours(old, &o, "removing");
    if (s == CA_OK && automatic && d.complete)
        return ca_error(CA_ERR_STATE, "save_state: %s already exists; set the configuration key "
                        "iteration to a number not used yet", dir);
    if (s == CA_OK) s = ss_mkdirs(parent);
    if (s == CA_OK && automatic && d.type == SS_DIR) {
        CA_LOG_W("save_state: removing the incomplete checkpoint %s (no " SS_MARKER ")", dir);
        s = ss_remove_dir(acc, dir, NULL);
    }
    if (s == CA_OK && !automatic && !d.complete) s = ss_recover(acc, dir, &d, tmp, &t, old, &o);
    if (s == CA_OK) s = ss_remove_dir(acc, tmp, NULL);   /* a killed save's leftovers */
    if (s == CA_OK) s = ss_remove_dir(acc, old, NULL);
    if (s == CA_OK) s = ss_make_tmp(tmp);
    return s;
}

/* A peer's failure, named on the ranks that did not fail themselves. */
static ca_status ss_fail(ca_accelerator *acc, ca_status s, int bad, const char *what, const char *dir) {
    if (bad < 0 || bad == acc->rank) return s;
    if (!strcmp(what, "save_state"))
        return ca_error(CA_ERR_PEER, "save_state: rank %d failed (%s); %s is not complete", bad,
                        ca_status_name(s), dir);
    return ca_error(CA_ERR_PEER, "load_state: rank %d failed (%s) to load %s; nothing was applied",
                    bad, ca_status_name(s), dir);
}

/* A failed save's <dir>.tmp goes (it frees the space on a full disk), keeping the error's message.
 * Only before it was published: from then on it may hold the only complete checkpoint. */
static void ss_discard(const ca_accelerator *acc, const char *tmp) {
    char msg[1024];
    ca_status s = ca_last_status();
    snprintf(msg, sizeof msg, "%s", ca_last_error());
    if (ss_remove_dir(acc, tmp, NULL) != CA_OK) CA_LOG_W("save_state: %s", ca_last_error());
    ca_error(s, "%s", msg);
}

/* Where a save goes: `target`, its `tmp` beside it and, automatically named, the checkpoints
 * directory `root` and the iteration (else -1). */
static ca_status ss_target(ca_accelerator *acc, const char *dir, char *target, char *tmp, char *root,
                           int64_t *iteration) {
    bool automatic = dir == NULL;
    *iteration = automatic ? ss_iteration(acc) : -1;
    ca_status s = CA_OK;
    if (automatic) {
        bool on = false;
        if (ca_config_get_bool(acc->cfg, "automatic_checkpoint_naming", &on) != CA_OK || !on)
            return ca_error(CA_ERR_INVALID, "save_state: no directory given and "
                            "automatic_checkpoint_naming is off (turn it on, or pass a directory)");
        char name[64];
        snprintf(name, sizeof name, "checkpoint_%" PRId64, *iteration);
        s = ss_checkpoints_dir(acc, root);
        if (s == CA_OK) s = ss_path(target, root, name);
    } else if ((size_t)snprintf(target, PATH_MAX, "%s", dir) >= PATH_MAX) {
        s = ca_error(CA_ERR_INVALID, "save_state: %s: path too long", dir);
    }
    if (s != CA_OK) return s;
    while (strlen(target) > 1 && target[strlen(target) - 1] == '/') target[strlen(target) - 1] = '\0';
    snprintf(tmp, PATH_MAX, "%.*s.tmp", PATH_MAX - 5, target);
    return CA_OK;
}

static ca_status save_state(ca_accelerator *acc, const char *dir) {
    char target[PATH_MAX], tmp[PATH_MAX], root[PATH_MAX];
    bool automatic = dir == NULL;
    int64_t iteration;
    ca_status s = ss_target(acc, dir, target, tmp, root, &iteration);
    if (s != CA_OK) return s;
    acc->nsaves++;
    int bad;
    s = acc->rank == 0 ? ss_prepare_dirs(acc, target, tmp, automatic) : CA_OK;
    s = ss_exchange(acc, s, &bad);                       /* the others wait for the directory */
    if (s != CA_OK) return ss_fail(acc, s, bad, "save_state", target);
    s = ss_save_local_full(acc, tmp, iteration);
    if (s == CA_OK) ss_test_stall(acc, "files");
    s = ss_exchange(acc, s, &bad);                       /* every rank has written */
    if (s != CA_OK) {
        if (acc->rank == 0) ss_discard(acc, tmp);
        return ss_fail(acc, s, bad, "save_state", target);
    }
    bool published = false;
    s = acc->rank == 0 ? ss_finish(acc, tmp, target, NULL, NULL, &published) : CA_OK;
    if (s != CA_OK && !published) ss_discard(acc, tmp);
    s = ss_exchange(acc, s, &bad);                       /* complete (or not) for every rank */
    if (s != CA_OK) return ss_fail(acc, s, bad, "save_state", target);
    if (automatic) {
        acc->iteration++;
        if (acc->rank == 0) s = ss_apply_limit(acc, root, ss_total_limit(acc));
    }
    return s;
}

/* ------------------------------------------------------------------ asynchronous saves */

/* The save in flight and what stays between saves. The calling thread does every collective on the
 * accelerator's communicator (the directory exchange, the gathers of sharded state) and the host
 * copy; the background thread then does steps 2 to 5 of the protocol, its two status exchanges on
 * `comm`, a communicator of its own: two threads never share one (docs/CHECKPOINTS.md). It reads
 * acc only for rank, world and the test hooks' save count, which nothing changes while it runs:
 * every save, load and the teardown join it first. */
typedef struct ss_async {
    ca_accelerator *acc;
    ca_comm *comm;                 /* world > 1: split from acc->comm at the first asynchronous save */
    pthread_t thread;
    bool running;                  /* a thread to join */
    atomic_bool done;              /* it has finished (refuse_if_busy looks without waiting) */
    ca_st_capture files;           /* the host copy: every file this rank writes, its bytes */
    ca_save_copy *copy;            /* a GPU's copies into it: pinned, on a copy stream (NULL: synchronous) */
    char target[PATH_MAX], tmp[PATH_MAX], root[PATH_MAX];
    int64_t limit;                 /* total_limit to apply after the publication (0: none) */
    int hold_fd;                   /* test hook CACCEL_TEST_SAVE_HOLD (-1: none) */
    bool enospc;                   /* test hook CACCEL_TEST_SAVE_ENOSPC names this rank */
    ca_status status;              /* the finished save's, until a call returns it */
    char msg[1024];
} ss_async;

/* The status exchange of ss_exchange on the background thread's communicator (host memory). */
static ca_status ss_exchange_bg(ss_async *a, ca_status mine, int *bad) {
    const ca_accelerator *acc = a->acc;
    *bad = mine != CA_OK ? acc->rank : -1;
    if (acc->world <= 1) return mine;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ca_last_error());
    float *v = calloc((size_t)acc->world * 2, sizeof *v);
    if (!v) return ca_error(CA_ERR_NOMEM, "save_state: out of memory");
    v[acc->rank] = (float)mine;
    ca_status out = ca_comm_all_reduce(a->comm, v, v + acc->world, (size_t)acc->world, CA_F32, CA_OP_SUM, NULL);
    for (int r = 0; out == CA_OK && r < acc->world && *bad < 0; r++)
        if (v[acc->world + r] != 0.0f) *bad = r, mine = (ca_status)(int)v[acc->world + r];
    free(v);
    if (out != CA_OK) {
        *bad = -1;
        return out;
    }
    if (*bad == acc->rank) ca_error(mine, "%s", msg);
    return *bad < 0 ? CA_OK : mine;
}

/* Test hook: CACCEL_TEST_SAVE_HOLD=<fd> holds every background write until a byte can be read from
 * descriptor fd, after printing a line, so that a test steps the run while a save is in flight. The
 * variable is read on the calling thread (a test changes its environment while the writer runs). */
static int ss_test_hold_fd(void) {
    const char *v = getenv("CACCEL_TEST_SAVE_HOLD");
    return v && *v ? atoi(v) : -1;
}

static void ss_test_hold(const ca_accelerator *acc, int fd) {
    if (fd < 0) return;
    fprintf(stderr, "save_state: rank %d holding the background write of save %d (CACCEL_TEST_SAVE_HOLD)\n",
            acc->rank, acc->nsaves);
    fflush(stderr);
    char c;
    while (read(fd, &c, 1) < 0 && errno == EINTR) continue;
}

/* Test hook: CACCEL_TEST_SAVE_ENOSPC=<rank>: that rank's background writes fail as on a full disk
 * (its files not written, ENOSPC), the other ranks' succeed, so that a test sees one rank's failure
 * reach every rank and keep rank 0 from publishing. Read on the calling thread, as the hold. */
static bool ss_test_enospc(const ca_accelerator *acc) {
    const char *v = getenv("CACCEL_TEST_SAVE_ENOSPC");
    return v && *v && atoi(v) == acc->rank;
}

static ca_status ss_capture_write(ss_async *a, uint32_t *crcs) {
    if (a->enospc)
        return ca_error(CA_ERR_IO, "%s: cannot write: %s (rank %d, CACCEL_TEST_SAVE_ENOSPC)",
                        a->files.n > 0 ? a->files.files[0].path : a->tmp, strerror(ENOSPC), a->acc->rank);
    return ca_st_capture_write(&a->files, crcs, crcs ? ss_chunk_size() : 0);
}

/* Steps 2-5 from the host copy (as save_state does them from the live state), then total_limit. */
static ca_status ss_async_write(ss_async *a) {
    ca_accelerator *acc = a->acc;
    int bad;
    ss_test_hold(acc, a->hold_fd);
    ca_status s = ca_save_copy_wait(a->copy);   /* the device's copies into the host copy have landed */
    /* rank 0's CRC-32s from the host copy, computed while the disk writes (the others' files are
     * read back for the manifest, as in a synchronous save) */
    uint32_t *crcs = acc->rank == 0 ? calloc((size_t)a->files.n + 1, sizeof *crcs) : NULL;
    if (s == CA_OK)
        s = acc->rank == 0 && !crcs ? ca_error(CA_ERR_NOMEM, "save_state: out of memory") : ss_capture_write(a, crcs);
    if (s == CA_OK) ss_test_stall(acc, "files");
    s = ss_exchange_bg(a, s, &bad);
    bool published = false;
    if (s == CA_OK && acc->rank == 0) s = ss_finish(acc, a->tmp, a->target, &a->files, crcs, &published);
    else if (s != CA_OK) {   /* step 3: a rank failed to write; nothing is published */
        free(crcs);
        ca_st_capture_reset(&a->files);
        if (acc->rank == 0) ss_discard(acc, a->tmp);
        return ss_fail(acc, s, bad, "save_state", a->target);
    }
    free(crcs);
    ca_st_capture_reset(&a->files);   /* kept for the next save: fresh memory costs a page fault a page */
    if (s != CA_OK && !published) ss_discard(acc, a->tmp);
    s = ss_exchange_bg(a, s, &bad);
    if (s != CA_OK) return ss_fail(acc, s, bad, "save_state", a->target);
    return acc->rank == 0 ? ss_apply_limit(acc, a->root, a->limit) : CA_OK;
}

static void *ss_async_main(void *arg) {
    ss_async *a = arg;
    ca_thread_begin("async_save");
    a->status = ss_async_write(a);
    if (a->status != CA_OK) snprintf(a->msg, sizeof a->msg, "%s", ca_last_error());
    atomic_store(&a->done, true);
    return NULL;
}

/* Joins the save in flight; returns its failure, or an earlier one not returned yet, once. */
static ca_status ss_async_join(ca_accelerator *acc, const char *who) {
    ss_async *a = acc->async;
    if (!a) return CA_OK;
    if (a->running) pthread_join(a->thread, NULL);
    a->running = false;
    ca_status s = a->status;
    a->status = CA_OK;
    if (s == CA_OK) return CA_OK;
    return ca_error(s, "%s: the asynchronous save into %s failed: %s", who, a->target, a->msg);
}

/* Whether a background thread can exchange statuses without touching the accelerator's
 * communicator: one process, or its own communicator (ss_async_init: on host memory, whatever the
 * accelerator's device) whose backend allows a second thread while the first trains (Gloo; MPI when
 * the library gave MPI_THREAD_MULTIPLE). The same answer on every rank: one backend, one library. */
static bool ss_async_possible(const ca_accelerator *acc) {
    if (acc->world <= 1) return true;
    return acc->async && acc->async->comm && ca_comm_threads_concurrent(acc->async->comm);
}

/* The state, the first time: the background thread's communicator (collective: every rank is in
 * this save), on host memory even where the accelerator's collectives are the lazy device's graph
 * nodes or a GPU's (its exchanges pass a few host floats, and a device graph is the calling
 * thread's). */
static ca_status ss_async_init(ca_accelerator *acc) {
    if (acc->async) return CA_OK;
    ss_async *a = calloc(1, sizeof *a);
    if (!a) return ca_error(CA_ERR_NOMEM, "save_state: out of memory");
    a->acc = acc;
    atomic_init(&a->done, true);
    ca_status s = acc->world > 1 ? ca_comm_split_host(acc->comm, 0, acc->rank, &a->comm) : CA_OK;
    if (s != CA_OK) {
        free(a);
        return ca_error_context("save_state: the asynchronous saves' communicator");
    }
    if ((s = ca_save_copy_create(acc->device, &a->copy)) != CA_OK) {
        ca_comm_destroy(a->comm);
        free(a);
        return s;
    }
    ca_save_copy_hook(a->copy, &a->files);   /* the host copy in pinned memory, kept between saves */
    acc->async = a;
    return CA_OK;
}

/* Step 1 and the host copy on the calling thread, then the thread. */
static ca_status ss_async_start(ca_accelerator *acc, const char *dir) {
    ss_async *a = acc->async;
    int64_t iteration;
    ca_status s = ss_target(acc, dir, a->target, a->tmp, a->root, &iteration);
    if (s != CA_OK) return s;
    acc->nsaves++;
    int bad;
    /* From here every file goes to host memory, the ownership file of <dir>.tmp first: the
     * background thread writes it (fsync'd, as every file) before the others, and until then the
     * directory is empty, which save_state also takes for its own. The caller waits for no fsync. */
    ca_st_capture *prev = ca_st_capture_set(&a->files);
    s = acc->rank == 0 ? ss_prepare_dirs(acc, a->target, a->tmp, dir == NULL) : CA_OK;
    ca_st_capture_set(prev);
    s = ss_exchange(acc, s, &bad);
    if (s != CA_OK) {
        ca_st_capture_free(&a->files);
        return ss_fail(acc, s, bad, "save_state", a->target);
    }
    prev = ca_st_capture_set(&a->files);
    ca_save_copy *prev_copy = ca_save_copy_set(a->copy);   /* a GPU's tensors: enqueued, not waited for */
    s = ss_save_local_full(acc, a->tmp, iteration);   /* every file, into host memory */
    ca_save_copy_set(prev_copy);
    ca_st_capture_set(prev);
    ca_status ended = ca_save_copy_end(a->copy);
    if (s == CA_OK) s = ended;
    s = ss_exchange(acc, s, &bad);                     /* every rank has its copy */
    if (s != CA_OK) {
        if (ca_save_copy_wait(a->copy) != CA_OK) CA_LOG_E("%s", ca_last_error());   /* before the buffers go */
        ca_st_capture_free(&a->files);
        if (acc->rank == 0) ss_discard(acc, a->tmp);
        return ss_fail(acc, s, bad, "save_state", a->target);
    }
    a->limit = dir == NULL ? ss_total_limit(acc) : 0;
    a->hold_fd = ss_test_hold_fd();
    a->enospc = ss_test_enospc(acc);
    if (dir == NULL) acc->iteration++;                 /* the next save takes the next number */
    atomic_store(&a->done, false);
    int rc = pthread_create(&a->thread, NULL, ss_async_main, a);
    if (rc != 0) {   /* write it here instead: the checkpoint is never lost */
        atomic_store(&a->done, true);
        CA_LOG_W("save_state: no background thread (%s); writing %s on this thread", strerror(rc), a->target);
        ss_async_main(a);
        return ss_async_join(acc, "save_state");
    }
    a->running = true;
    return CA_OK;
}

static ca_status save_state_async(ca_accelerator *acc, const char *dir) {
    ca_status s = ss_async_init(acc);
    return s == CA_OK ? ss_async_start(acc, dir) : s;
}

/* refuse_if_busy: every rank refuses when any rank's save is still in flight (a rank that went on
 * alone would wait in the directory exchange for the others). Collective. */
static ca_status ss_refuse_if_busy(ca_accelerator *acc) {
    const ss_async *a = acc->async;
    bool busy = a && a->running && !atomic_load(&a->done);
    ca_status mine = busy ? ca_error(CA_ERR_STATE, "save_state: the asynchronous save into %s is still being "
                                     "written (refuse_if_busy); nothing saved", a->target) : CA_OK;
    int bad;
    ca_status s = ss_exchange(acc, mine, &bad);
    if (s == CA_OK || bad < 0 || bad == acc->rank) return s;
    return ca_error(CA_ERR_STATE, "save_state: rank %d's asynchronous save is still being written "
                    "(refuse_if_busy); nothing saved", bad);
}

/* ------------------------------------------------------------------ loading: checking */

/* Everything read and checked, waiting to be applied. */
typedef struct ss_loaded {
    json_object *manifest, *files;     /* complete.json and its "files": all that a load reads */
    ca_ck_model_src *model;
    ca_st_file *opts;
    json_object *state, *rng;
    unsigned char **custom;
    size_t *custom_len;
    int nopts, ncustom;
    int64_t iteration;
    bool *was_on;                      /* the model's requires_grad before the checkpoint's were set */
    bool sliced;                       /* each optimizer state tensor: only this rank's slice is read */
    bool lean;                         /* stage 3: only the model file's slices of this rank's shard */
    bool opt_lean;                     /* ZeRO, any stage: only this rank's slices of the optimizer
                                        * state, read into its shard's host buffers (no full state) */
    bool model0, opts0;                /* the model file, the optimizers' files: read by rank 0 alone */
    bool tp;                           /* ss_tp_reads: this rank's tp slices of the model and optimizer
                                        * files, read by byte range (tp_load.c) */
    bool tpz;                          /* ss_tp_zero_reads: ZeRO beside tp, each rank its shard's part of its
                                        * tp slices (the model's whole slices at stages 1 and 2) */
    ca_tp_file *otp;                   /* [nopts] with tp (tpz): each optimizer file's slices (descriptor and
                                        * sums; the buffers are the ZeRO shard's) */
} ss_loaded;

static void ss_loaded_free(ss_loaded *L) {
    ca_ck_model_close(L->model);
    for (int i = 0; L->opts && i < L->nopts; i++) ca_st_close(&L->opts[i]);
    for (int i = 0; L->otp && i < L->nopts; i++) ca_tp_file_free(&L->otp[i]);
    free(L->opts);
    free(L->otp);
    for (int i = 0; L->custom && i < L->ncustom; i++) free(L->custom[i]);
    free(L->custom);
    free(L->custom_len);
    json_object_put(L->state);
    json_object_put(L->rng);
    json_object_put(L->manifest);
    free(L->was_on);
    memset(L, 0, sizeof *L);
}

/* The size complete.json records for `name`, or -1 when it does not list it. */
static int64_t ss_listed(const ss_loaded *L, const char *name) {
    json_object *f = NULL, *v = NULL;
    if (!L->files || !json_object_object_get_ex(L->files, name, &f) || !json_object_object_get_ex(f, "size", &v))
        return -1;
    return json_object_get_int64(v);
}

/* dir/name for a file the load reads. Only a file complete.json lists has been checked (size and
 * CRC-32), so only such a file is read, whatever else the directory holds. */
static ca_status ss_listed_path(const ss_loaded *L, const char *dir, const char *name, char *path) {
    ca_status s = ss_path(path, dir, name);
    if (s == CA_OK && ss_listed(L, name) < 0)
        s = ca_error(CA_ERR_IO, "load_state: %s: " SS_MARKER " does not list %s; the checkpoint was not saved "
                     "with it, so it is not read", dir, name);
    return s;
}

/* A name complete.json may list: a file of the checkpoint's own directory. */
static bool ss_plain_name(const char *name) {
    return name[0] && strchr(name, '/') == NULL && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

/* The files load_state maps and verifies itself, over the same mapping it reads them from
 * (ss_open_listed): the model's, the optimizers' and a sharded checkpoint's shard files (zero_state.c
 * verifies the ranges it reads through ca_state_open_file). */
static bool ss_mapped_by_load(const char *name) {
    return strcmp(name, SS_MODEL) == 0 || ((strncmp(name, "optimizer", 9) == 0 || strncmp(name, "zero_shard_", 11) == 0) &&
                                           ss_ends_with(name, ".safetensors"));
}

/* The size of a file that is verified later, checked now as ss_file_crc checks it. */
static ca_status ss_file_size(const char *path, size_t *len) {
    int fd;
    uint64_t size;
    ca_status s = ca_file_open(path, CA_FILE_CHECKPOINT, &fd, &size);
    if (s != CA_OK) return s;
    close(fd);
    *len = (size_t)size;
    return CA_OK;
}

/* What complete.json records of `name` (listed: ss_check_files checked its size): size, CRC-32 and,
 * where the checkpoint has them, the chunk sums into *chunks (the caller frees it). */
static ca_status ss_sums(const ss_loaded *L, const char *dir, const char *name, ca_st_sums *sums, uint32_t **chunks) {
    json_object *f = NULL, *v = NULL, *list = NULL;
    json_object_object_get_ex(L->files, name, &f);
    *chunks = NULL;
    *sums = (ca_st_sums){.size = (uint64_t)ss_listed(L, name)};
    if (json_object_object_get_ex(f, "crc32", &v)) sums->crc32 = (uint32_t)json_object_get_int64(v);
    if (!json_object_object_get_ex(f, "chunk_size", &v)) return CA_OK;   /* an older checkpoint: verified whole */
    int64_t cs = json_object_is_type(v, json_type_int) ? json_object_get_int64(v) : 0;
    size_t n = cs > 0 ? (size_t)((sums->size + (uint64_t)cs - 1) / (uint64_t)cs) : 0;
    if (cs <= 0 || !json_object_object_get_ex(f, "chunk_crc32", &list) || !json_object_is_type(list, json_type_array) ||
        json_object_array_length(list) != n)
        return ca_error(CA_ERR_IO, "%s/" SS_MARKER ": %s: \"chunk_size\" is not a positive integer or \"chunk_crc32\" "
                        "is not a list of one CRC-32 per chunk", dir, name);
    if (!(*chunks = malloc((n ? n : 1) * sizeof **chunks))) return ca_error(CA_ERR_NOMEM, "load_state: out of memory");
    for (size_t i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(list, i);
        int64_t x = json_object_is_type(c, json_type_int) ? json_object_get_int64(c) : -1;
        if (x < 0 || x > UINT32_MAX)
            return ca_error(CA_ERR_IO, "%s/" SS_MARKER ": %s: \"chunk_crc32\"[%zu] is not a CRC-32", dir, name, i);
        (*chunks)[i] = (uint32_t)x;
    }
    sums->chunk_size = (uint64_t)cs;
    sums->nchunks = n;
    sums->chunk_crc = *chunks;
    return CA_OK;
}

/* A file ss_mapped_by_load names, mapped once: its CRC-32 verified over the mapping (whole, or
 * only the header: the caller verifies the ranges it reads), then parsed. */
static ca_status ss_open_listed(const ss_loaded *L, const char *dir, const char *name, bool whole, ca_st_file *f) {
    char path[PATH_MAX];
    ca_st_sums sums;
    uint32_t *chunks = NULL;
    ca_status s = ss_listed_path(L, dir, name, path);
    if (s == CA_OK) s = ss_sums(L, dir, name, &sums, &chunks);
    if (s == CA_OK) s = ca_st_open_checked(path, &sums, whole, f);
    else memset(f, 0, sizeof *f);
    free(chunks);
    return s;
}

/* A file the ranks of a tp (x dp_shard) group read in parts and verify together (ss_tp_verify): with chunk
 * sums as ss_open_listed opens it (the header's chunks verified); without them (an older checkpoint, the
 * whole file's CRC-32 only) as one chunk of the file's size, verified nowhere before the group combines
 * its parts of it: no rank reads the file whole. A file beyond 4 GiB without chunk sums (the parts' CRCs
 * are of at most 4 GiB) is verified whole on every rank as before. */
static ca_status ss_open_parts(const ss_loaded *L, const char *dir, const char *name, ca_st_file *f) {
    char path[PATH_MAX];
    ca_st_sums sums;
    uint32_t *chunks = NULL;
    ca_status s = ss_listed_path(L, dir, name, path);
    if (s == CA_OK) s = ss_sums(L, dir, name, &sums, &chunks);
    bool one = s == CA_OK && !sums.chunk_size && sums.size > 0 && sums.size <= UINT32_MAX;
    if (one) sums.chunk_size = sums.size, sums.nchunks = 1, sums.chunk_crc = &sums.crc32;
    if (s == CA_OK) s = one ? ca_st_open_unverified(path, &sums, f) : ca_st_open_checked(path, &sums, false, f);
    else memset(f, 0, sizeof *f);
    free(chunks);
    return s;
}

/* The checkpoint a load is checking: the strategy's check_shard opens the shard files through it. */
struct ca_state_files {
    const ss_loaded *L;
    const char *dir;
};

ca_status ca_state_open_file(const ca_state_files *files, const char *name, bool whole, ca_st_file *f) {
    return ss_open_listed(files->L, files->dir, name, whole, f);
}

/* The marker exists and every file it lists has its recorded size and CRC-32; L keeps the list.
 * `who` ("load_state", "merge_weights") begins the errors that name no file. defer: the files
 * ss_mapped_by_load names are only measured here; their bytes are verified where they are read. */
static ca_status ss_check_files(const char *who, const char *dir, ss_loaded *L, bool defer) {
    char path[PATH_MAX];
    ca_status s = ss_path(path, dir, SS_MARKER);
    if (s != CA_OK) return s;
    if (!ss_exists(dir)) return ca_error(CA_ERR_NOT_FOUND, "%s: %s: no such directory", who, dir);
    if (!ss_exists(path))
        return ca_error(CA_ERR_NOT_FOUND, "%s: %s is not a complete checkpoint: it has no "
                        SS_MARKER " (the save did not finish)", who, dir);
    s = js_load(path, &L->manifest);
    ss_json j = {path, false};
    json_object *files = s == CA_OK ? js_get(&j, L->manifest, "files", json_type_object) : NULL;
    if (s == CA_OK && j.bad) s = ca_last_status();
    if (s != CA_OK) return s;
    json_object_object_foreach(files, name, f) {
        int64_t size = js_int(&j, f, "size");
        uint32_t crc = (uint32_t)js_int(&j, f, "crc32"), got = 0;
        size_t len = 0;
        char fp[PATH_MAX];
        if (j.bad) return ca_last_status();
        if (!ss_plain_name(name) || size < 0)
            return ca_error(CA_ERR_IO, "%s: \"%s\" (%" PRId64 " bytes) is not a file of the checkpoint's "
                            "directory", path, name, size);
        s = ss_path(fp, dir, name);
        bool later = defer && ss_mapped_by_load(name);
        if (s == CA_OK) s = later ? ss_file_size(fp, &len) : ss_file_crc(fp, size, &len, &got, NULL);
        if (later) got = crc;
        if (s == CA_OK && (int64_t)len != size)
            s = ca_error(CA_ERR_IO, "%s: %s: %zu bytes, the checkpoint recorded %" PRId64,
                         fp, (int64_t)len < size ? "truncated" : "size differs", len, size);
        if (s == CA_OK && got != crc)
            s = ca_error(CA_ERR_IO, "%s: corrupt: CRC-32 %08" PRIx32 ", the checkpoint recorded "
                         "%08" PRIx32, fp, got, crc);
        if (s != CA_OK) return s;
    }
    L->files = files;
    return CA_OK;
}

ca_status ca_state_check_files(const char *who, const char *dir) {
    ss_loaded L = {0};
    ca_status s = ss_check_files(who, dir, &L, false);
    ss_loaded_free(&L);
    return s;
}

/* f against o's state as ca_optimizer_init_state would make it (names, f32, the parameters'
 * shapes; tp non-NULL: a split one's whole shape), without making it: a sharded run reads only its
 * slices. */
static ca_status ss_check_opt_tensors(const ca_accelerator *tp, ca_optimizer *o, const ca_st_file *f) {
    int n = 0;
    while (ca_optimizer_state_param(o, n, NULL, NULL)) n++;
    if (f->n != n)
        return ca_error(CA_ERR_INVALID, "%s: %d state tensors in the file, %d in the optimizer",
                        f->path, f->n, n);
    for (int i = 0; i < n; i++) {
        const char *name = NULL;
        const ca_tensor *p = ca_optimizer_state_param(o, i, &name, NULL);
        const ca_st_entry *e = ca_st_find(f, name);
        if (!e) return ca_error(CA_ERR_INVALID, "%s: no tensor '%s' for the optimizer's state", f->path, name);
        int64_t shape[CA_MAX_DIMS];
        ca_tp_file_shape(tp, p, shape);   /* tp: a split parameter's state whole in the file */
        bool same = e->dtype == CA_F32 && e->ndim == ca_tensor_ndim(p);
        for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == shape[d];
        if (!same)
            return ca_error(CA_ERR_INVALID, "%s: tensor '%s': %s %lld elements in the file, %s %lld in "
                            "the optimizer", f->path, name, ca_st_dtype_name(e->dtype),
                            (long long)((e->end - e->begin) / (ca_dtype_size(e->dtype) ? ca_dtype_size(e->dtype) : 1)),
                            ca_st_dtype_name(CA_F32), (long long)ca_tensor_numel(p));
    }
    return CA_OK;
}

/* The elements [*off, *off + *n) of optimizer state tensor x that this rank keeps (a sharded run,
 * sync_ops->state_slice), found through the parameter x belongs to; the whole tensor otherwise. */
static void ss_opt_slice(const ca_accelerator *acc, const ca_optimizer *o, const ca_tensor *x, int64_t *off,
                         int64_t *n) {
    *off = 0;
    *n = ca_tensor_numel(x);
    for (int g = 0; g < o->ngroups; g++)
        for (int j = 0; j < o->groups[g].n; j++)
            if (o->groups[g].state1[j] == x || o->groups[g].state2[j] == x) {
                acc->sync_ops->state_slice(acc, o->groups[g].params[j], off, n);
                return;
            }
}

/* Every state tensor's slice of f verified (ss_check_opt_tensors matched names, dtypes, shapes). */
static ca_status ss_verify_opt_slices(const ca_accelerator *acc, ca_optimizer *o, ca_st_file *f) {
    ca_status s = CA_OK;
    const char *name = NULL;
    ca_tensor *p;
    for (int i = 0; s == CA_OK && (p = ca_optimizer_state_param(o, i, &name, NULL)) != NULL; i++) {
        const ca_st_entry *e = ca_st_find(f, name);
        int64_t off, n;
        acc->sync_ops->state_slice(acc, p, &off, &n);
        s = ca_st_verify_range(f, f->data_start + e->begin + (uint64_t)off * sizeof(float), (uint64_t)n * sizeof(float));
    }
    return s;
}

static ca_status ss_check_optimizer(ss_json *j, ca_optimizer *o, json_object *jo, int i) {
    const char *kind = js_str(j, jo, "kind");
    int64_t np = js_int(j, jo, "num_params"), steps = js_int(j, jo, "steps");
    json_object *groups = js_get(j, jo, "param_groups", json_type_array);
    if (j->bad) return ca_last_status();
    const char *want = o->kind == CA_OPTIM_ADAMW ? "adamw" : "sgd";
    if (strcmp(kind, want) != 0)
        return ca_error(CA_ERR_INVALID, "%s: optimizers[%d]: kind %s in the file, %s in the program",
                        j->file, i, kind, want);
    if (np != ca_optimizer_num_params(o) || (int)json_object_array_length(groups) != o->ngroups)
        return ca_error(CA_ERR_INVALID, "%s: optimizers[%d]: %lld parameters in %d groups in the file, "
                        "%d in %d in the program", j->file, i, (long long)np,
                        (int)json_object_array_length(groups), ca_optimizer_num_params(o), o->ngroups);
    if (steps < 0) return ca_error(CA_ERR_INVALID, "%s: optimizers[%d]: steps %lld", j->file, i, (long long)steps);
    for (int g = 0; g < o->ngroups; g++) {
        json_object *jg = json_object_array_get_idx(groups, (size_t)g);
        int64_t gn = js_int(j, jg, "num_params");
        js_double(j, jg, "lr");
        js_double(j, jg, "base_lr");
        js_double(j, jg, "weight_decay");
        if (j->bad) return ca_last_status();
        if (gn != o->groups[g].n)
            return ca_error(CA_ERR_INVALID, "%s: optimizers[%d].param_groups[%d]: %lld parameters in "
                            "the file, %d in the program", j->file, i, g, (long long)gn, o->groups[g].n);
    }
    json_object *sched = NULL;
    if (json_object_object_get_ex(jo, "schedule", &sched) && sched) {
        const char *k = js_str(j, sched, "kind");
        js_int(j, sched, "warmup_steps");
        js_int(j, sched, "total_steps");
        js_double(j, sched, "min_lr_ratio");
        if (j->bad) return ca_last_status();
        if (strcmp(k, "constant") && strcmp(k, "linear") && strcmp(k, "cosine"))
            return ca_error(CA_ERR_INVALID, "%s: optimizers[%d].schedule: unknown kind '%s'", j->file, i, k);
    }
    return CA_OK;
}

static ca_status ss_check_loader(ss_json *j, ca_dataloader *dl, json_object *jl, int i) {
    ca_loader_state ls;
    ca_dataloader_get_state(dl, &ls);
    int64_t bs = js_int(j, jl, "batch_size"), len = js_int(j, jl, "dataset_length");
    int64_t epoch = js_int(j, jl, "epoch"), pos = js_int(j, jl, "position");
    int64_t world = js_int(j, jl, "world_size");
    uint64_t seed = js_u64(j, jl, "seed");
    bool shuffle = js_bool(j, jl, "shuffle");
    if (j->bad) return ca_last_status();
    if (bs != ls.batch_size || len != ls.dataset_len || shuffle != ls.shuffle)
        return ca_error(CA_ERR_INVALID, "%s: dataloaders[%d]: batch size %lld, %lld samples%s in the file; "
                        "batch size %lld, %lld samples%s in the program", j->file, i, (long long)bs,
                        (long long)len, shuffle ? ", shuffled" : "", (long long)ls.batch_size,
                        (long long)ls.dataset_len, ls.shuffle ? ", shuffled" : "");
    if (ls.seed_fixed && ls.seed_fixed != seed && shuffle)
        return ca_error(CA_ERR_INVALID, "%s: dataloaders[%d]: shuffle seed %" PRIu64 " in the file, but "
                        "the loader's options fix %" PRIu64, j->file, i, seed, ls.seed_fixed);
    if (epoch < 0 || pos < 0 || world < 1)
        return ca_error(CA_ERR_INVALID, "%s: dataloaders[%d]: epoch %lld, position %lld, world size %lld",
                        j->file, i, (long long)epoch, (long long)pos, (long long)world);
    return CA_OK;
}

static bool ss_name_in(json_object *names, const char *name) {
    for (size_t k = 0; k < json_object_array_length(names); k++) {
        json_object *v = json_object_array_get_idx(names, k);
        if (json_object_is_type(v, json_type_string) && !strcmp(json_object_get_string(v), name)) return true;
    }
    return false;
}

/* The checkpoint's requires_grad per parameter (model.frozen: the frozen ones by name; absent in
 * checkpoints older than it: nothing to restore). A model whose reduction was laid out at ca_prepare
 * over another trainable set is refused; otherwise the flags are set now, before the optimizer's state
 * is checked against the file (a frozen parameter has none), and L->was_on undoes that if the load
 * fails. */
static ca_status ss_restore_frozen(ca_accelerator *acc, ss_json *j, json_object *model, ss_loaded *L) {
    json_object *frozen = NULL;
    if (!acc->model || !model || !json_object_object_get_ex(model, "frozen", &frozen)) return CA_OK;
    if (!json_object_is_type(frozen, json_type_array))
        return ca_error(CA_ERR_INVALID, "%s: key \"model.frozen\" is not an array of parameter names", j->file);
    ca_module *m = acc->model;
    int n = ca_module_num_params(m);
    for (int i = 0; i < n; i++) {
        bool on = !ss_name_in(frozen, m->flat_names[i]);
        if (on == m->flat[i]->requires_grad || !acc->nsnaps) continue;
        return ca_error(CA_ERR_INVALID, "%s: parameter %s is %s in the checkpoint and %s in the prepared model; "
                        "%s laid out its gradient reduction over the trainable set at ca_prepare: set requires_grad "
                        "as the checkpoint has it before ca_prepare (rank %d)", j->file, m->flat_names[i],
                        on ? "trainable" : "frozen", on ? "frozen" : "trainable", acc->sync_ops->name, acc->rank);
    }
    if (!(L->was_on = calloc((size_t)n + 1, sizeof *L->was_on))) return ca_error(CA_ERR_NOMEM, "out of host memory");
    for (int i = 0; i < n; i++) {
        L->was_on[i] = m->flat[i]->requires_grad;
        ca_tensor_set_requires_grad(m->flat[i], !ss_name_in(frozen, m->flat_names[i]));
    }
    return CA_OK;
}

/* A failed load leaves requires_grad as it was. */
static void ss_undo_frozen(ca_accelerator *acc, const ss_loaded *L) {
    for (int i = 0; L->was_on && acc->model && i < ca_module_num_params(acc->model); i++)
        ca_tensor_set_requires_grad(acc->model->flat[i], L->was_on[i]);
}

static ca_status ss_check_state(ca_accelerator *acc, const char *dir, ss_loaded *L) {
    char path[PATH_MAX];
    ca_status s = ss_listed_path(L, dir, SS_STATE, path);
    if (s == CA_OK) s = js_load(path, &L->state);
    if (s != CA_OK) return s;
    ss_json j = {path, false};
    json_object *st = L->state, *model = NULL;
    const char *fmt = js_str(&j, st, "format");
    int64_t ver = js_int(&j, st, "version");
    js_int(&j, st, "micro_step");
    L->iteration = js_int(&j, st, "iteration");
    json_object *gs = js_get(&j, st, "grad_scaler", json_type_object);
    js_double(&j, gs, "scale");
    js_int(&j, gs, "growth_tracker");
    json_object *opts = js_get(&j, st, "optimizers", json_type_array);
    json_object *loaders = js_get(&j, st, "dataloaders", json_type_array);
    json_object *custom = js_get(&j, st, "custom", json_type_array);
    if (j.bad) return ca_last_status();
    if (L->iteration < -1 || L->iteration == INT64_MAX)   /* -1: not an automatic name; the next is + 1 */
        return ca_error(CA_ERR_INVALID, "%s: key \"iteration\" is %lld, outside -1 to %lld", path,
                        (long long)L->iteration, (long long)INT64_MAX - 1);
    if (strcmp(fmt, SS_FORMAT) != 0 || ver != SS_VERSION)
        return ca_error(CA_ERR_INVALID, "%s: format %s version %lld; this caccel reads %s version %d",
                        path, fmt, (long long)ver, SS_FORMAT, SS_VERSION);
    bool has_model = json_object_object_get_ex(st, "model", &model) && model;
    if (has_model != (acc->model != NULL))
        return ca_error(CA_ERR_INVALID, "%s: the checkpoint has %s model, the program prepared %s", path,
                        has_model ? "a" : "no", acc->model ? "one" : "none");
    int no = (int)json_object_array_length(opts), nl = (int)json_object_array_length(loaders);
    int nc = (int)json_object_array_length(custom);
    if (no != acc->nopts || nl != acc->nloaders || nc != acc->ncustom)
        return ca_error(CA_ERR_INVALID, "%s: %d optimizer(s), %d dataloader(s), %d custom object(s) in the "
                        "checkpoint; the program prepared %d, %d and registered %d", path, no, nl, nc,
                        acc->nopts, acc->nloaders, acc->ncustom);
    if (has_model) s = ss_restore_frozen(acc, &j, model, L);
    for (int i = 0; s == CA_OK && i < no; i++)
        s = ss_check_optimizer(&j, acc->opts[i], json_object_array_get_idx(opts, (size_t)i), i);
    for (int i = 0; s == CA_OK && i < nl; i++)
        s = ss_check_loader(&j, acc->loaders[i], json_object_array_get_idx(loaders, (size_t)i), i);
    for (int i = 0; s == CA_OK && i < nc; i++) {
        json_object *c = json_object_array_get_idx(custom, (size_t)i);
        const char *name = js_str(&j, c, "name");
        bool per_rank = js_bool(&j, c, "per_rank");
        if (j.bad) return ca_last_status();
        if (strcmp(name, acc->custom[i].name) != 0 || per_rank != acc->custom[i].per_rank)
            s = ca_error(CA_ERR_INVALID, "%s: custom[%d] is '%s'%s in the checkpoint, '%s'%s in the "
                         "program", path, i, name, per_rank ? " (per rank)" : "", acc->custom[i].name,
                         acc->custom[i].per_rank ? " (per rank)" : "");
    }
    return s;
}

/* This rank's file of a per-rank kind, or rank 0's when the checkpoint has fewer ranks. Only files
 * complete.json lists are read; rank 0's own file unlisted is left to ss_listed_path to report, and
 * neither file listed is an error naming both, not a warning that goes on to use one. */
static ca_status ss_rank_file(const ss_loaded *L, const char *dir, char *path, const char *mine, const char *rank0) {
    if (ss_listed(L, mine) >= 0 || strcmp(mine, rank0) == 0) return ss_listed_path(L, dir, mine, path);
    if (ss_listed(L, rank0) < 0)
        return ca_error(CA_ERR_NOT_FOUND, "load_state: %s has neither %s nor rank 0's %s, which a rank the checkpoint "
                        "has no file for takes", dir, mine, rank0);
    CA_LOG_W("load_state: %s: no %s (saved with fewer processes); using %s", dir, mine, rank0);
    return ss_listed_path(L, dir, rank0, path);
}

static ca_status ss_check_rng(ca_accelerator *acc, const char *dir, ss_loaded *L) {
    char path[PATH_MAX], mine[64], zero[64];
    ss_rng_name(mine, sizeof mine, acc->rank);
    ss_rng_name(zero, sizeof zero, 0);
    ca_status s = ss_rank_file(L, dir, path, mine, zero);
    if (s == CA_OK) s = js_load(path, &L->rng);
    ss_json j = {path, false};
    if (s == CA_OK) {
        js_u64(&j, L->rng, "seed");
        js_u64(&j, L->rng, "offset");
        if (j.bad) s = ca_last_status();
    }
    return s;
}

static ca_status ss_check_custom(ca_accelerator *acc, const char *dir, ss_loaded *L) {
    L->custom = calloc((size_t)(acc->ncustom ? acc->ncustom : 1), sizeof *L->custom);
    L->custom_len = calloc((size_t)(acc->ncustom ? acc->ncustom : 1), sizeof *L->custom_len);
    if (!L->custom || !L->custom_len) return ca_error(CA_ERR_NOMEM, "load_state: out of memory");
    L->ncustom = acc->ncustom;
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && i < acc->ncustom; i++) {
        const ca_checkpointable *c = &acc->custom[i];
        char path[PATH_MAX], mine[80], zero[80];
        ss_custom_name(mine, sizeof mine, i, c->per_rank, acc->rank);
        ss_custom_name(zero, sizeof zero, i, c->per_rank, 0);
        s = ss_rank_file(L, dir, path, mine, zero);
        /* bounded by the size complete.json lists for it (mine or zero: the name after the '/') */
        if (s == CA_OK)
            s = ss_read_file(path, (uint64_t)ss_listed(L, strrchr(path, '/') + 1), &L->custom[i], &L->custom_len[i]);
        if (s == CA_OK && (s = c->load(c->ctx, L->custom[i], L->custom_len[i], false)) != CA_OK)
            ca_error_context("%s: custom object '%s'", path, c->name);
    }
    return s;
}

/* A sharded checkpoint's index against this run; a run whose strategy keeps no shards refuses it. */
static ca_status check_shard(ca_accelerator *acc, const char *dir, const ss_loaded *L) {
    ca_state_files files = {L, dir};
    if (acc->sync_ops->check_shard) return acc->sync_ops->check_shard(acc, dir, &files);
    return ca_error(CA_ERR_INVALID, "load_state: %s holds a sharded state dict: load it under sharded data "
                    "parallelism, or merge its weights first (caccel merge-weights)", dir);
}

/* Every rank's shard of a sharded checkpoint is listed (check_shard matched its world size). */
static ca_status ss_shards_listed(const ca_accelerator *acc, const char *dir, const ss_loaded *L) {
    char path[PATH_MAX], name[64];
    ca_status s = CA_OK;
    int n = acc->sync_ops->shard_count ? acc->sync_ops->shard_count(acc) : 0;
    for (int r = 0; s == CA_OK && r < n; r++) {
        snprintf(name, sizeof name, CA_ZERO_SHARD_FMT, r);
        s = ss_listed_path(L, dir, name, path);
    }
    return s;
}

/* The parameter whose state the optimizer file's tensor `name` is (tp: the split it follows). */
static const ca_tensor *ss_state_param_of(void *o, const char *name) {
    const char *n = NULL;
    ca_tensor *p;
    for (int i = 0; (p = ca_optimizer_state_param(o, i, &n, NULL)) != NULL; i++)
        if (!strcmp(n, name)) return p;
    return NULL;
}

/* Under tensor parallelism over whole-state data parallelism (DDP, one data-parallel rank), each rank
 * reads its tp slices of model.safetensors and of the optimizer files by byte range and the tp group
 * verifies their chunks together (ca_tp_verify_parts): nothing is made whole, no rank reads a file whole.
 * With ZeRO beside tp: ss_tp_zero_reads. */
static bool ss_tp_reads(const ca_accelerator *acc) {
    const ca_sync_strategy *ops = acc->sync_ops;
    if (!acc->model || !ca_tp_reads_slices(acc) || ops->scatter_state || (ops->params_sharded && ops->params_sharded(acc)))
        return false;
    return ca_ram_efficient_loading(acc);
}

/* ZeRO beside tensor parallelism (dp_shard_size, any stage) from a full state dict: each rank reads of the
 * optimizer files only its shard's part of its tp slice of each state tensor, and of model.safetensors the
 * same at stage 3 (its whole tp slices at stages 1 and 2, which keep the parameters whole); the chunks
 * are verified by the tp x dp_shard group's sums together (the model's at stages 1 and 2 by the tp group's).
 * Nothing is made whole, gathered or broadcast. */
static bool ss_tp_zero_reads(const ca_accelerator *acc) {
    const ca_sync_strategy *ops = acc->sync_ops;
    /* summoned (ca_summon_full_params: the layers whole, stage 3's parameters gathered): the gathering load */
    return acc->model && ca_tp_reads_slices(acc) && !acc->mesh->summons && !acc->zero.summoned && ops->scatter_state &&
           ops->read_state_slices && ops->load_state_slices && acc->zero.stage >= 1 && acc->zero.comm &&
           ca_ram_efficient_loading(acc);
}

static bool ss_params_sharded(const ca_accelerator *acc) {
    return acc->sync_ops->params_sharded && acc->sync_ops->params_sharded(acc);
}

/* The chunks of the files the tp slices were read from, verified together by the tp group (or, for the
 * files whose tp slices the ZeRO shards divide, the tp x dp_shard group). Collective over tp (and dp):
 * every rank of the group has read (each one's check passed: ss_exchange before). */
static ca_status ss_tp_verify(ca_accelerator *acc, ss_loaded *L) {
    ca_st_file **files = calloc((size_t)L->nopts + 2, sizeof *files);
    ca_st_parts **parts = calloc((size_t)L->nopts + 2, sizeof *parts);
    int n = 0;
    ca_status s = files && parts ? CA_OK : ca_error(CA_ERR_NOMEM, "load_state: out of memory");
    ca_comm *dp = L->tpz ? acc->zero.comm : NULL;
    bool model_dp = L->tpz && ss_params_sharded(acc);   /* stage 3: the model's slices are sharded too */
    if (s == CA_OK && L->model) files[n] = ca_ck_model_file(L->model, 0, &parts[n]), n++;
    if (s == CA_OK && !model_dp && n) s = ca_tp_verify_parts(acc, files, parts, n, NULL), n = 0;
    for (int i = 0; s == CA_OK && i < L->nopts; i++) files[n] = &L->opts[i], parts[n++] = L->otp[i].parts;
    if (s == CA_OK && n) s = ca_tp_verify_parts(acc, files, parts, n, dp);
    free(files);
    free(parts);
    return s;
}

/* ZeRO beside tp: this rank's shard's part of its tp slice of each of o's state tensors in f, read through
 * a descriptor of f (pread) into the shard's host buffers, hashed for ss_tp_verify. */
static ca_status ss_tp_zero_read_state(ca_accelerator *acc, ca_optimizer *o, ca_st_file *f, ca_tp_file *t) {
    ca_status s = ca_meta_src_open(f, &t->src);
    if (s == CA_OK) s = ca_st_parts_new(f, &t->parts);
    return s == CA_OK ? acc->sync_ops->read_state_slices(acc, o, f, t) : s;
}

/* Reads and checks every file of `dir` that this rank needs (those complete.json lists, checked by
 * ss_check_files); applies nothing. sharded: the tensors are in the shard files. */
static ca_status ss_check_all(ca_accelerator *acc, const char *dir, ss_loaded *L, bool sharded) {
    ca_status s = ss_check_state(acc, dir, L);
    char name[64];
    if (s == CA_OK && sharded) s = check_shard(acc, dir, L);
    if (s == CA_OK && sharded) s = ss_shards_listed(acc, dir, L);
    bool others = acc->rank != 0;   /* rank 0 alone reads what it broadcasts (ss_broadcast) */
    if (s == CA_OK && acc->model && !sharded && !(L->model0 && others)) {   /* stage 3: only its shard's slices */
        ca_st_file mf;
        bool tp = L->tp || L->tpz, shard = L->tpz && ss_params_sharded(acc);
        s = tp ? ss_open_parts(L, dir, SS_MODEL, &mf) : ss_open_listed(L, dir, SS_MODEL, !L->lean, &mf);
        if (s == CA_OK) s = ca_ck_model_adopt(&mf, acc->model, tp ? acc : NULL, &L->model);
        if (s == CA_OK && L->lean) s = ca_ck_model_verify_shard(acc, L->model);
        /* verified: ss_tp_verify */
        if (s == CA_OK && tp) s = shard ? ca_ck_model_read_tp_shard(acc, L->model, true) : ca_ck_model_read_tp(acc, L->model, true);
    }
    if (s == CA_OK && !(L->opts = calloc((size_t)(acc->nopts ? acc->nopts : 1), sizeof *L->opts)))
        s = ca_error(CA_ERR_NOMEM, "load_state: out of memory");
    if (s == CA_OK && (L->tp || L->tpz) && !(L->otp = calloc((size_t)(acc->nopts ? acc->nopts : 1), sizeof *L->otp)))
        s = ca_error(CA_ERR_NOMEM, "load_state: out of memory");
    /* a sharded run keeps a slice of each optimizer state tensor: only the slices are verified and read */
    L->sliced = !sharded && acc->sync_ops->scatter_state && acc->sync_ops->state_slice && !ss_state_whole_outside(acc);
    for (int i = 0; s == CA_OK && !sharded && !(L->opts0 && others) && i < acc->nopts; i++) {
        ss_opt_name(name, sizeof name, i);
        s = L->tp || L->tpz ? ss_open_parts(L, dir, name, &L->opts[i]) : ss_open_listed(L, dir, name, !L->sliced, &L->opts[i]);
        if (s == CA_OK) L->nopts = i + 1;
        if (s == CA_OK) s = ss_check_opt_tensors(L->tp || L->tpz ? acc : NULL, acc->opts[i], &L->opts[i]);
        if (s == CA_OK && L->tp) s = ca_tp_file_read(acc, &L->opts[i], ss_state_param_of, acc->opts[i], true, &L->otp[i]);
        if (s == CA_OK && L->tpz) s = ss_tp_zero_read_state(acc, acc->opts[i], &L->opts[i], &L->otp[i]);
        if (s == CA_OK && L->sliced && !L->opt_lean) s = ss_verify_opt_slices(acc, acc->opts[i], &L->opts[i]);
        /* lean: the slices read into the shard's host buffers now; the file is done with */
        if (s == CA_OK && L->opt_lean) s = acc->sync_ops->read_state_slices(acc, acc->opts[i], &L->opts[i], NULL);
        if (L->opt_lean) ca_st_close(&L->opts[i]);
    }
    if (s == CA_OK) s = ss_check_rng(acc, dir, L);
    if (s == CA_OK) s = ss_check_custom(acc, dir, L);
    return s;
}

/* ------------------------------------------------------------------ loading: applying */

/* State tensor x from f: all of it, or (sliced) only the slice this rank keeps; the rest of x stays
 * as ca_optimizer_init_state made it, and scatter_state reads only the slice. */
static ca_status ss_copy_state(const ca_accelerator *acc, const ca_optimizer *o, ca_tensor *x, ca_st_file *f,
                               const ca_st_entry *e, bool sliced) {
    int64_t off = 0, n = ca_tensor_numel(x);
    size_t es = ca_dtype_size(e->dtype);
    if (sliced) ss_opt_slice(acc, o, x, &off, &n);
    /* the size again, just before the mapping is read: a file cut short since the check would fault */
    ca_status s = ca_st_verify_range(f, f->data_start + e->begin + (uint64_t)off * es, 0);
    if (s != CA_OK || n == 0) return s;
    if (!sliced) return ca_tensor_copy_from_host(x, ca_st_data(f, e), (size_t)(e->end - e->begin));
    x->version++;
    return ca_device_copy_from_host(ca_tdev(x), (char *)ca_tptr(x) + (size_t)off * es,
                                    (const char *)ca_st_data(f, e) + (size_t)off * es, (size_t)n * es);
}

static ca_status ss_apply_optimizer(const ca_accelerator *acc, ca_optimizer *o, json_object *jo, ca_st_file *f,
                                    bool sliced, const ca_tp_file *tp) {
    ss_json j = {f->path ? f->path : SS_STATE, false};
    json_object *groups = js_get(&j, jo, "param_groups", json_type_array), *sched = NULL;
    for (int g = 0; g < o->ngroups; g++) {
        json_object *jg = json_object_array_get_idx(groups, (size_t)g);
        ca_optim_group *G = &o->groups[g];
        G->lr = js_double(&j, jg, "lr");
        G->base_lr = js_double(&j, jg, "base_lr");
        if (o->kind == CA_OPTIM_ADAMW) {
            G->adamw.weight_decay = js_double(&j, jg, "weight_decay");
            if (json_object_object_get_ex(jg, "beta1", NULL)) {
                G->adamw.beta1 = js_double(&j, jg, "beta1");
                G->adamw.beta2 = js_double(&j, jg, "beta2");
                G->adamw.eps = js_double(&j, jg, "eps");
            }
        } else {
            G->sgd.weight_decay = js_double(&j, jg, "weight_decay");
        }
    }
    o->has_schedule = json_object_object_get_ex(jo, "schedule", &sched) && sched;
    if (o->has_schedule) {
        const char *k = js_str(&j, sched, "kind");
        o->schedule = (ca_lr_schedule){.kind = !strcmp(k, "cosine") ? CA_SCHED_COSINE
                                               : !strcmp(k, "linear") ? CA_SCHED_LINEAR : CA_SCHED_CONSTANT,
                                       .warmup_steps = js_int(&j, sched, "warmup_steps"),
                                       .total_steps = js_int(&j, sched, "total_steps"),
                                       .min_lr_ratio = js_double(&j, sched, "min_lr_ratio")};
    }
    ca_status s = CA_OK;
    int n = f->path ? ca_optimizer_num_state(o) : 0;   /* no file: a sharded checkpoint's shard holds them */
    for (int i = 0; s == CA_OK && i < n; i++) {
        const char *name = NULL;
        ca_tensor *x = ca_optimizer_state_at(o, i, &name);
        const ca_st_entry *e = ca_st_find(f, name);
        if (tp) x->version++;
        s = tp ? ca_tensor_copy_from_host(x, tp->buf[e - f->entries], ca_tensor_nbytes(x))   /* its tp slice, read */
               : ss_copy_state(acc, o, x, f, e, sliced);
    }
    /* the step count last: with a schedule it recomputes each group's lr from base_lr, which
     * gives the saved lr again on the same world size */
    if (s == CA_OK) s = ca_optimizer_set_steps(o, js_int(&j, jo, "steps"));
    return s;
}

/* The batch to continue at: the same one on the same world size; else the same global sample
 * position, rounded down to a whole step of the new world (a few samples are seen again). Under
 * split_batches a rank's batch is a slice of the global one, so its position counts global batches
 * (a checkpoint without the key was saved as this run loads). */
static int64_t ss_loader_skip(json_object *jl, const ca_loader_state *now) {
    ss_json j = {"", false};
    int64_t pos = js_int(&j, jl, "position"), w = js_int(&j, jl, "world_size");
    int64_t most = now->rank_batches < 0 ? INT64_MAX : now->rank_batches;   /* < 0: a stream, length unknown */
    if (w == now->world) return pos < most ? pos : most;
    json_object *js = NULL;
    bool split = json_object_object_get_ex(jl, "split_batches", &js) ? json_object_get_boolean(js) : now->split;
    int64_t global = split ? pos : pos * w;     /* global batches consumed */
    int64_t per = now->split ? 1 : now->world;   /* global batches per batch of a rank (the data-parallel
                                                  * ranks: a tp group reads one batch) */
    int64_t k = global / per;
    if (k * per != global)
        CA_LOG_W("load_state: the checkpoint was saved on %lld processes: the dataloader continues at "
                 "global batch %lld, not %lld (the batches in between are seen again)",
                 (long long)w, (long long)(k * per), (long long)global);
    return k < most ? k : most;
}

static ca_status ss_apply(ca_accelerator *acc, ss_loaded *L) {
    ss_json j = {"", false};
    json_object *st = L->state;
    ca_status s = !acc->model || !L->model ? CA_OK
                 : L->lean || (L->tpz && ss_params_sharded(acc)) ? ca_ck_model_apply_shard(acc, L->model)
                                           : ca_ck_model_apply(L->model, acc->model);
    json_object *opts = js_get(&j, st, "optimizers", json_type_array);
    for (int i = 0; s == CA_OK && i < acc->nopts; i++)
        s = ss_apply_optimizer(acc, acc->opts[i], json_object_array_get_idx(opts, (size_t)i), &L->opts[i], L->sliced,
                               L->otp ? &L->otp[i] : NULL);
    json_object *gs = js_get(&j, st, "grad_scaler", json_type_object);
    if (s == CA_OK) {
        acc->scaler.scale = js_double(&j, gs, "scale");
        acc->scaler.growth_tracker = js_int(&j, gs, "growth_tracker");
        acc->micro_step = js_int(&j, st, "micro_step");
    }
    json_object *loaders = js_get(&j, st, "dataloaders", json_type_array);
    for (int i = 0; s == CA_OK && i < acc->nloaders; i++) {
        json_object *jl = json_object_array_get_idx(loaders, (size_t)i);
        ca_dataloader *dl = acc->loaders[i];
        s = ca_dataloader_set_seed(dl, js_u64(&j, jl, "seed"));
        if (s == CA_OK) s = ca_dataloader_set_epoch(dl, js_int(&j, jl, "epoch"));
        ca_loader_state now;
        ca_dataloader_get_state(dl, &now);
        if (s == CA_OK) s = ca_dataloader_skip_batches(dl, ss_loader_skip(jl, &now));
    }
    if (s == CA_OK) ca_rng_set_state(js_u64(&j, L->rng, "seed"), js_u64(&j, L->rng, "offset"));
    return s;
}

/* The registered objects last, once every rank has everything else (their bytes passed the check, so
 * their load does not fail: nothing of theirs has to be undone). */
static ca_status ss_apply_custom(ca_accelerator *acc, const ss_loaded *L) {
    ca_status s = CA_OK;
    for (int i = 0; s == CA_OK && i < acc->ncustom; i++) {
        const ca_checkpointable *c = &acc->custom[i];
        s = c->load(c->ctx, L->custom[i], L->custom_len[i], true);
        if (s != CA_OK) ca_error_context("load_state: custom object '%s'", c->name);
    }
    return s;
}

/* What rank 0 alone read (L->model0, L->opts0) from rank 0 to every rank: the parameters, then each
 * optimizer's state tensors (made first on the other ranks, as rank 0's check made its own). */
static ca_status ss_broadcast(ca_accelerator *acc, const ss_loaded *L, const char *dir) {
    ca_status s = ca_ck_broadcast_params(acc, acc->model, "load_state");
    for (int i = 0; s == CA_OK && L->opts0 && i < acc->nopts; i++) {
        ca_optimizer *o = acc->opts[i];
        int n = ca_optimizer_num_state(o);
        for (int k = 0; s == CA_OK && k < n; k++) {
            const char *name = NULL;
            ca_tensor *x = ca_optimizer_state_at(o, k, &name);
            s = ca_comm_broadcast(acc->comm, ca_tptr(x), (size_t)ca_tensor_numel(x), ca_tensor_dtype(x), 0, NULL);
            x->version++;
            if (s != CA_OK) ca_error_context("load_state: broadcasting optimizer %d's %s from rank 0", i, name);
        }
    }
    if (s == CA_OK && acc->rank == 0)
        CA_LOG_I("load_state: rank 0 read %s's model%s and broadcast them (fsdp_cpu_ram_efficient_loading)", dir,
                 L->opts0 && acc->nopts ? " and optimizer state" : "");
    return s;
}

/* A load that failed after this rank kept its state (ss_load_dir: rank 0's broadcast): the kept state
 * back in place, and the error says so, naming the failed rank or keeping the communicator's message
 * (which names the peer). */
static ca_status ss_put_back(ca_accelerator *acc, ca_status s, int bad, ca_ck_kept *kept, const char *dir) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ca_last_error());
    ca_status r = ca_ck_restore(acc, kept);
    const char *how = r == CA_OK ? "as it was before the load (restored)" : "NOT restored: do not train on";
    if (bad >= 0 && bad != acc->rank)
        return ca_error(CA_ERR_PEER, "load_state: rank %d failed (%s) to load %s after rank 0 read it; rank %d's "
                        "training state is %s", bad, ca_status_name(s), dir, acc->rank, how);
    return ca_error(s, "%s; load_state: rank %d's training state is %s", msg, acc->rank, how);
}

static ca_status ss_load_dir(ca_accelerator *acc, const char *dir) {
    ss_loaded L = {0};
    int bad;
    ca_status s = ss_check_files("load_state", dir, &L, true);   /* what complete.json lists is all the load reads */
    bool sharded = ss_listed(&L, CA_ZERO_INDEX) >= 0;
    /* sharded run, full checkpoint: the full state is read into per-parameter tensors, then each rank
     * keeps its shard; sharded checkpoint: each rank reads its shard file */
    const ca_sync_strategy *ops = acc->sync_ops;
    /* stage 3, lean: of model.safetensors only this rank's shard's slices are read, into its shard;
     * of the optimizer state (every stage: each keeps a shard of it) only this rank's slices */
    L.lean = s == CA_OK && acc->model && !sharded && ca_zero3_loads_lean(acc);
    L.tp = s == CA_OK && !sharded && ss_tp_reads(acc);   /* each rank its tp slices: nothing broadcast */
    L.tpz = s == CA_OK && !sharded && ss_tp_zero_reads(acc);   /* its shard's part of them */
    if (L.tpz && acc->rank == 0)
        ca_log_printf(CA_LOG_INFO, "load_state: %s: each rank reads its dp_shard part of its tp slices (tp %d x dp_shard "
                      "%d, stage %d%s); nothing is gathered or broadcast", dir, acc->mesh->shape.size[CA_MESH_TP],
                      acc->zero.world, acc->zero.stage, ss_params_sharded(acc) ? "" : ": the model's tp slices whole");
    L.opt_lean = s == CA_OK && acc->model && !sharded && ops->read_state_slices && ops->state_lean &&
                 ops->state_lean(acc);
    bool full = s == CA_OK && ops->scatter_state && !sharded && !L.opt_lean && !ss_state_whole_outside(acc);
    /* a model every rank holds whole: rank 0 reads it, and the optimizer state where every rank holds
     * that whole too (DDP; ZeRO stages 1 and 2 read only each rank's slice of it), and broadcasts */
    L.model0 = s == CA_OK && !sharded && !L.tp && !L.tpz && ca_ck_rank0_reads(acc, acc->model);
    L.opts0 = L.model0 && !ops->scatter_state;
    for (int i = 0; s == CA_OK && full && i < acc->nopts; i++) s = ca_optimizer_init_state(acc->opts[i]);
    if (s == CA_OK) s = ss_check_all(acc, dir, &L, sharded);
    /* rank 0's broadcast: every rank keeps its state before anything is applied (no rank applies
     * unless each could), so that a peer lost in the middle leaves every rank still running as it
     * was (ss_put_back) */
    ca_ck_kept *kept = NULL;
    if (s == CA_OK && L.model0) s = ca_ck_keep_state(acc, &kept);
    if (s == CA_OK && kept)
        CA_LOG_D("load_state: rank %d keeps %zu bytes of its training state on the host while rank 0's read is "
                 "broadcast (put back if the load fails)", acc->rank, ca_ck_kept_bytes(kept));
    s = ss_exchange(acc, s, &bad);                  /* nothing is applied unless every rank can */
    if (s == CA_OK && (L.tp || L.tpz)) s = ss_exchange(acc, ss_tp_verify(acc, &L), &bad);   /* the slices' chunks */
    for (int i = 0; L.tpz && i < L.nopts; i++) ca_st_close(&L.opts[i]);   /* read: the state is in the shard's buffers */
    bool keeps = s == CA_OK && L.model0;
    if (s == CA_OK) s = ss_apply(acc, &L);
    else s = ss_fail(acc, s, bad, "load_state", dir);
    if (keeps) s = ss_exchange(acc, s, &bad);   /* every rank applied, or none broadcasts */
    if (s == CA_OK && L.model0) s = ss_broadcast(acc, &L, dir);
    bool settled = s != CA_OK;   /* a failure every rank knows of (or a collective that failed) */
    if (s == CA_OK && sharded) s = ops->load_shard(acc, dir);
    if (L.opt_lean || L.tpz) {
        ca_status z = ops->load_state_slices(acc, s == CA_OK);
        if (s == CA_OK) s = z;
    }
    for (int i = 0; full && i < acc->nopts; i++) {
        ca_status z = s == CA_OK ? ops->scatter_state(acc, acc->opts[i]) : CA_OK;
        ops->drop_state(acc->opts[i]);
        if (s == CA_OK) s = z;
    }
    if (keeps && !settled) s = ss_exchange(acc, s, &bad);   /* every rank has it all */
    if (keeps && s != CA_OK) s = ss_put_back(acc, s, bad, kept, dir);
    if (s == CA_OK) s = ss_apply_custom(acc, &L);
    ca_ck_kept_free(kept);
    if (s != CA_OK) ss_undo_frozen(acc, &L);
    if (s == CA_OK && L.iteration >= 0) {
        acc->iteration = L.iteration + 1;
        acc->iteration_known = true;
    }
    ss_loaded_free(&L);
    return s;
}

/* The newest complete checkpoint_<n> under <project_dir>/checkpoints. */
static ca_status ss_latest(const ca_accelerator *acc, char *out) {
    char root[PATH_MAX];
    ss_ck *ck = NULL;
    int n = 0;
    ca_status s = ss_checkpoints_dir(acc, root);
    if (s == CA_OK) s = ss_list(root, &ck, &n);
    int i = n - 1;
    for (; s == CA_OK && i >= 0 && !ck[i].complete; i--)
        if (acc->rank == 0)
            CA_LOG_W("load_state: %s/checkpoint_%" PRId64 " is not complete (no " SS_MARKER
                     "): passing over it", root, ck[i].n);
    if (s == CA_OK && i < 0)
        s = ca_error(CA_ERR_NOT_FOUND, "load_state: no complete checkpoint under %s%s", root,
                     n ? " (only incomplete ones)" : "");
    if (s == CA_OK) {
        char name[64];
        snprintf(name, sizeof name, "checkpoint_%" PRId64, ck[i].n);
        s = ss_path(out, root, name);
    }
    free(ck);
    return s;
}

/* The directory load_state(dir) reads: `dir` when it is complete; else the complete checkpoint an
 * interrupted save left beside it (<dir>.tmp, the newer, else <dir>.old: ss_publish), with a
 * warning; else `dir`, whose check then says what is missing. */
static ca_status ss_resolve(const ca_accelerator *acc, const char *dir, char *out) {
    char marker[PATH_MAX], cand[PATH_MAX];
    if ((size_t)snprintf(out, PATH_MAX, "%s", dir) >= PATH_MAX - 4)
        return ca_error(CA_ERR_INVALID, "load_state: %s: path too long", dir);
    for (size_t n = strlen(out); n > 1 && out[n - 1] == '/'; n--) out[n - 1] = '\0';
    ca_status s = ss_path(marker, out, SS_MARKER);
    if (s != CA_OK || ss_exists(marker)) return s;
    static const char *const ext[] = {".tmp", ".old"};
    for (int i = 0; i < 2; i++) {
        ss_dirinfo in;
        snprintf(cand, sizeof cand, "%s%s", out, ext[i]);
        if (ss_inspect(cand, &in) != CA_OK || in.type != SS_DIR || !in.complete) continue;
        if (acc->rank == 0)
            CA_LOG_W("load_state: %s is not a complete checkpoint (%s); loading %s, the complete one an "
                     "interrupted save left (the next save_state into %s puts it back in place)", out,
                     ss_exists(out) ? "no " SS_MARKER : "no such directory", cand, out);
        snprintf(out, PATH_MAX, "%s", cand);
        break;
    }
    return CA_OK;
}

static ca_status load_state(ca_accelerator *acc, const char *dir) {
    char path[PATH_MAX];
    ca_status s = CA_OK;
    if (dir) {
        if ((s = ss_resolve(acc, dir, path)) != CA_OK) return s;
        dir = path;
    } else {
        s = ss_latest(acc, path);
        int bad;   /* every rank must have found one, or none goes on */
        s = ss_exchange(acc, s, &bad);
        if (s != CA_OK) return ss_fail(acc, s, bad, "load_state", "the latest checkpoint");
        CA_LOG_I("load_state: loading %s", path);
        dir = path;
    }
    s = ss_load_dir(acc, dir);
    /* an elastic job's log names the step where the group goes on after a change of membership (shown at
     * the default level, with the launcher's line naming the machines) */
    const char *base = getenv("CACCEL_ELASTIC_BASE_WORLD_SIZE");
    if (s == CA_OK && base && *base && acc->rank <= 0 && acc->nopts > 0)
        ca_log_printf(CA_LOG_WARNING, "elastic: the group of %d processes resumes at optimizer step %lld (%s)",
                      acc->world, (long long)ca_optimizer_steps(acc->opts[0]), dir);
    return s;
}

/* ------------------------------------------------------------------ custom objects */

ca_status ca_register_for_checkpointing(ca_accelerator *acc, const ca_checkpointable *obj) {
    if (!acc || !obj || !obj->name || !obj->name[0] || !obj->save || !obj->load)
        return ca_error(CA_ERR_INVALID, "register_for_checkpointing: an object needs a name, save and load");
    for (int i = 0; i < acc->ncustom; i++)
        if (strcmp(acc->custom[i].name, obj->name) == 0)
            return ca_error(CA_ERR_INVALID, "register_for_checkpointing: '%s' is registered already", obj->name);
    ca_checkpointable *c = realloc(acc->custom, (size_t)(acc->ncustom + 1) * sizeof *c);
    if (!c) return ca_error(CA_ERR_NOMEM, "register_for_checkpointing: out of memory");
    acc->custom = c;
    c[acc->ncustom] = *obj;
    if (!(c[acc->ncustom].name = strdup(obj->name)))
        return ca_error(CA_ERR_NOMEM, "register_for_checkpointing: out of memory");
    acc->ncustom++;
    return CA_OK;
}

void ca_state_free(ca_accelerator *acc) {
    if (acc->async) {   /* the save in flight ends first; its failure, unreported, is logged */
        if (ss_async_join(acc, "teardown") != CA_OK) CA_LOG_E("%s", ca_last_error());
        ca_st_capture_free(&acc->async->files);
        ca_save_copy_destroy(acc->async->copy);   /* after the pinned buffers it allocated */
        ca_comm_destroy(acc->async->comm);
        free(acc->async);
        acc->async = NULL;
    }
    for (int i = 0; i < acc->ncustom; i++) free((char *)acc->custom[i].name);
    free(acc->custom);
    acc->custom = NULL;
    acc->ncustom = 0;
}

/* Stage 3 keeps shards of the parameters between steps, tensor parallelism slices of the split layers (and
 * of their optimizer state): whole while they are saved or loaded, so that the files are one process's.
 * tp_whole false (a sharded state dict under tp): the slices stay, each tp rank's shard files are of them. */
static ca_status with_full_params(ca_accelerator *acc, ca_status (*fn)(ca_accelerator *, const char *),
                                  const char *dir, bool load, bool tp_whole) {
    const ca_sync_strategy *ops = acc->sync_ops;
    bool shards = ops->params_sharded && ops->params_sharded(acc), state = tp_whole && ss_state_whole_outside(acc);
    ca_status s = shards ? ops->summon(acc, true) : CA_OK;
    for (int i = 0; s == CA_OK && state && i < acc->nopts; i++) s = ops->gather_state(acc, acc->opts[i]);
    if (s == CA_OK && tp_whole) s = ca_tp_summon(acc, true);
    if (s == CA_OK) s = fn(acc, dir);
    ca_status t = tp_whole ? ca_tp_summon(acc, false) : CA_OK;
    for (int i = 0; state && i < acc->nopts; i++) {   /* a load's values into the parts; a save's dropped */
        ca_status z = load && s == CA_OK && t == CA_OK ? ops->scatter_state(acc, acc->opts[i]) : CA_OK;
        ops->drop_state(acc->opts[i]);
        if (t == CA_OK) t = z;
    }
    ca_status r = shards ? ops->summon(acc, false) : CA_OK;
    return s != CA_OK ? s : t != CA_OK ? t : r;
}

/* An elastic job grows at a checkpoint: caccel launch marks a machine waiting to join
 * (caccel/elastic/grow). Every rank learns from rank 0 whether one waits (one broadcast). Outside an
 * elastic job of several processes: false, with no communication. */
static bool elastic_grow_pending(ca_accelerator *acc) {
    if (!getenv("CACCEL_ELASTIC_BASE_WORLD_SIZE") || acc->world < 2) return false;
    ca_store_ref st = ca_comm_launch_store(acc->comm);
    if (!st.ops) return false;
    double v = 0;
    if (acc->rank == 0 && st.ops->check(st.store, "caccel/elastic/grow") == CA_OK) v = 1;
    ca_clear_error();
    CA_SCOPE {
        ca_tensor *t = ca_full(ca_accelerator_device(acc), CA_F32, 0, NULL, v);
        if (!t || ca_broadcast(acc, t, 0) != CA_OK || ca_tensor_item(t, &v) != CA_OK) v = 0;
    }
    ca_clear_error();
    return v != 0;
}

/* After a complete synchronous save: if a machine waits, rank 0 asks the launchers to regroup and
 * every process waits for them to stop it, so that the grown group resumes from exactly this
 * checkpoint (docs/DISTRIBUTED.md, Elastic membership). */
static void elastic_grow_point(ca_accelerator *acc) {
    if (!elastic_grow_pending(acc)) return;
    ca_store_ref st = ca_comm_launch_store(acc->comm);
    long long step = acc->nopts > 0 ? (long long)ca_optimizer_steps(acc->opts[0]) : 0;
    if (acc->rank == 0) {
        ca_log_printf(CA_LOG_WARNING, "elastic: a machine waits to join: the group stops at this checkpoint "
                      "(optimizer step %lld) to grow", step);
        char num[32];
        snprintf(num, sizeof num, "%lld", step);
        if (st.ops->set(st.store, "caccel/elastic/regroup", num, strlen(num)) != CA_OK) ca_clear_error();
    }
    fflush(NULL);
    for (;;) pause();   /* the launcher stops every process (SIGTERM) and starts the grown group */
}

ca_status ca_save_state_ex(ca_accelerator *acc, const char *dir, const ca_save_state_options *opts) {
    if (!acc) return ca_error(CA_ERR_INVALID, "save_state: the accelerator is NULL");
    if (acc->nextra)   /* the checkpoint layout holds one model */
        return ca_error(CA_ERR_UNSUPPORTED, "save_state: %d model(s) prepared after the first; save them with "
                        "ca_save_model or ca_register_for_checkpointing", acc->nextra);
    ca_save_state_options o = {0};
    if (opts) o = *opts;
    else if (ca_config_get_bool(acc->cfg, "async_save", &o.async) != CA_OK) o.async = false;
    ca_status s = o.refuse_if_busy ? ss_refuse_if_busy(acc) : CA_OK;
    if (s == CA_OK) s = ss_async_join(acc, "save_state");   /* one save in flight; an earlier failure first */
    if (s == CA_OK && o.async) s = ss_async_init(acc);   /* collective: every rank is in this save */
    if (s != CA_OK) return s;
    static bool warned;   /* once per process */
    if (o.async && !ss_async_possible(acc)) {
        if (!warned)
            CA_LOG_W("save_state: async: %d processes over %s on %s: saving synchronously (the background "
                     "thread needs a host-memory communicator of its own that the backend allows on a second "
                     "thread; MPI: the library must give MPI_THREAD_MULTIPLE)", acc->world,
                     acc->comm ? ca_comm_backend(acc->comm) : "none", ca_device_name(acc->device));
        warned = true;
        o.async = false;
    }
    /* An asynchronous save returns before its checkpoint is complete, so it cannot be where the group
     * stops to grow; when a machine waits to join, this save is made synchronously instead and the
     * group grows at it (the next checkpoint boundary, as for synchronous saves). */
    if (o.async && elastic_grow_pending(acc)) {
        if (acc->rank == 0)
            CA_LOG_W("save_state: a machine waits to join the elastic job: this save runs synchronously, so "
                     "that the group can grow at it");
        o.async = false;
    }
    int64_t t0 = ca_trace_on() ? ca_trace_now_ns() : 0;   /* the profiler's checkpoint stall */
    bool shards = acc->sync_ops->saves_shards && acc->sync_ops->saves_shards(acc);
    s = with_full_params(acc, o.async ? save_state_async : save_state, dir, false, !shards);
    if (t0) ca_trace_slice("checkpoint", "save_state", t0, s == CA_OK ? "\"ok\":true" : "\"ok\":false");
    if (s == CA_OK && !o.async) elastic_grow_point(acc);
    return s;
}

ca_status ca_save_state(ca_accelerator *acc, const char *dir) {
    return ca_save_state_ex(acc, dir, NULL);
}

ca_status ca_wait_for_save(ca_accelerator *acc) {
    if (!acc) return ca_error(CA_ERR_INVALID, "wait_for_save: the accelerator is NULL");
    return ss_async_join(acc, "wait_for_save");
}

/* Whether the checkpoint a load under tensor parallelism reads (dir, NULL: the latest) is a sharded state
 * dict: each tp rank's shard files hold its slices, so nothing is made whole around it (with_full_params). */
static bool ss_tp_sharded_load(const ca_accelerator *acc, const char *dir) {
    if (!acc->mesh || !acc->model || !acc->sync_ops->check_shard) return false;
    char path[PATH_MAX], ix[PATH_MAX];
    ca_status s = dir ? ss_resolve(acc, dir, path) : ss_latest(acc, path);
    bool yes = s == CA_OK && ss_path(ix, path, CA_ZERO_INDEX) == CA_OK && ss_exists(ix);
    ca_clear_error();   /* load_state resolves it again and says why it cannot */
    return yes;
}

ca_status ca_load_state(ca_accelerator *acc, const char *dir) {
    if (!acc) return ca_error(CA_ERR_INVALID, "load_state: the accelerator is NULL");
    ca_status s = ss_async_join(acc, "load_state");   /* a save in flight is finished (or failed) first */
    if (s != CA_OK) return s;
    /* stage 3 under fsdp_cpu_ram_efficient_loading: each rank copies its shard's slices of the
     * files straight into its shard (ss_check_all, ca_zero_check_shard); nothing is gathered */
    /* ZeRO beside tp from a full state dict: each rank its shard's part of its tp slices (ss_tp_zero_reads) */
    if (ss_tp_zero_reads(acc) && !ss_tp_sharded_load(acc, dir)) return load_state(acc, dir);
    return ca_zero3_loads_lean(acc) ? load_state(acc, dir)
                                    : with_full_params(acc, load_state, dir, true,
                                                       !ss_tp_reads(acc) && !ss_tp_sharded_load(acc, dir));
}
