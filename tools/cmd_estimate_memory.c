/* `caccel estimate-memory MODEL`: the memory a model's parameters take for inference and for
 * training with Adam, per dtype, as `accelerate estimate-memory` prints it, plus the per-process
 * model states of each ZeRO stage. The model is read from its safetensors headers only (shapes),
 * so a multi-gigabyte checkpoint costs a few kilobytes of reading. */
#include "tools/cli_impl.h"
#include "core/json_impl.h"
#include "base/file_impl.h"

#include <json-c/json.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define EM_MAX_HEADER (100u << 20)   /* safetensors caps its header at 100 MB too */
#define EM_MAX_NPROCS 16

typedef struct em_tensor {
    char *name;
    uint64_t numel;
} em_tensor;

typedef struct em_model {
    em_tensor *t;
    size_t n, cap;
} em_model;

static void em_free(em_model *m) {
    for (size_t i = 0; i < m->n; i++) free(m->t[i].name);
    free(m->t);
    memset(m, 0, sizeof *m);
}

static ca_status em_add(em_model *m, const char *name, uint64_t numel) {
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 64;
        em_tensor *t = realloc(m->t, cap * sizeof *t);
        if (!t) return ca_error(CA_ERR_NOMEM, "estimate-memory: out of memory");
        m->t = t, m->cap = cap;
    }
    m->t[m->n].name = strdup(name);
    if (!m->t[m->n].name) return ca_error(CA_ERR_NOMEM, "estimate-memory: out of memory");
    m->t[m->n++].numel = numel;
    return CA_OK;
}

static ca_status em_read_header(const char *path, char **out) {
    FILE *f;
    ca_status o = ca_file_fopen(path, CA_FILE_SAFETENSORS, &f, NULL);   /* only the header is read */
    if (o != CA_OK) return o;
    unsigned char len8[8];
    uint64_t len = 0;
    ca_status s = CA_OK;
    if (fread(len8, 1, 8, f) != 8) s = ca_error(CA_ERR_IO, "%s: not a safetensors file (shorter than 8 bytes)", path);
    for (int i = 7; s == CA_OK && i >= 0; i--) len = len << 8 | len8[i];
    if (s == CA_OK && (len < 2 || len > EM_MAX_HEADER))
        s = ca_error(CA_ERR_IO, "%s: not a safetensors file (header length %llu)", path, (unsigned long long)len);
    char *text = s == CA_OK ? malloc(len + 1) : NULL;
    if (s == CA_OK && !text) s = ca_error(CA_ERR_NOMEM, "%s: out of memory for the header", path);
    if (s == CA_OK && fread(text, 1, len, f) != len)
        s = ca_error(CA_ERR_IO, "%s: truncated safetensors header (%llu bytes announced)", path,
                     (unsigned long long)len);
    fclose(f);
    if (s != CA_OK) return free(text), s;
    text[len] = '\0';
    *out = text;
    return CA_OK;
}

static ca_status em_shape(const char *path, const char *name, json_object *info, uint64_t *numel) {
    json_object *shape = NULL;
    if (!json_object_is_type(info, json_type_object) || !json_object_object_get_ex(info, "shape", &shape) ||
        !json_object_is_type(shape, json_type_array))
        return ca_error(CA_ERR_IO, "%s: tensor '%s' has no \"shape\" array", path, name);
    uint64_t n = 1;
    for (size_t i = 0; i < json_object_array_length(shape); i++) {
        json_object *d = json_object_array_get_idx(shape, i);
        uint64_t v;
        if (!ca_json_get_u64(d, &v)) return ca_error(CA_ERR_IO, "%s: tensor '%s': dimension %zu is not a size", path, name, i);
        n *= v;
    }
    *numel = n;
    return CA_OK;
}

/* Every tensor of one safetensors file, from its header. */
static ca_status em_load_file(const char *path, em_model *m) {
    char *text = NULL;
    ca_status s = em_read_header(path, &text);
    if (s != CA_OK) return s;
    const char *why;
    size_t where;
    json_object *root = ca_json_parse(text, strlen(text), &why, &where);
    free(text);
    if (!root) return ca_error(CA_ERR_IO, "%s: the safetensors header is not valid JSON: %s at byte %zu", path, why, where);
    if (!json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        return ca_error(CA_ERR_IO, "%s: the safetensors header is not a JSON object", path);
    }
    json_object_object_foreach(root, name, info) {
        if (strcmp(name, "__metadata__") == 0) continue;
        uint64_t numel = 0;
        s = em_shape(path, name, info, &numel);
        if (s == CA_OK) s = em_add(m, name, numel);
        if (s != CA_OK) break;
    }
    json_object_put(root);
    return s;
}

/* An index (model.safetensors.index.json): the headers of the distinct shards it names. */
static ca_status em_load_index(const char *index, em_model *m) {
    char why[256];
    ca_status s;
    json_object *root = ca_json_load(index, CA_FILE_INDEX, why, sizeof why, &s), *map = NULL;
    if (!root) return why[0] ? ca_error(CA_ERR_IO, "%s: cannot read the index: %s", index, why) : s;
    if (!json_object_object_get_ex(root, "weight_map", &map) || !json_object_is_type(map, json_type_object))
        s = ca_error(CA_ERR_IO, "%s: no \"weight_map\" object", index);
    json_object *seen = json_object_new_object();
    const char *slash = strrchr(index, '/');
    int dl = slash ? (int)(slash - index) : 1;
    if (s == CA_OK) {
        json_object_object_foreach(map, tname, file) {
            const char *fname = json_object_get_string(file);
            if (!json_object_is_type(file, json_type_string) || strchr(fname, '/')) {
                s = ca_error(CA_ERR_IO, "%s: weight_map: tensor '%s' does not map to a file of the index's "
                             "directory", index, tname);
                break;
            }
            if (json_object_object_get_ex(seen, fname, NULL)) continue;
            json_object_object_add(seen, fname, NULL);
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%.*s/%s", dl, slash ? index : ".", fname);
            if ((s = em_load_file(path, m)) != CA_OK) break;
        }
    }
    json_object_put(seen);
    json_object_put(root);
    return s;
}

static int em_ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* A file, an index, or a directory holding model.safetensors or its index (as from_pretrained). */
static ca_status em_load(const char *where, em_model *m) {
    struct stat st;
    if (stat(where, &st) != 0)
        return ca_error(CA_ERR_NOT_FOUND, "%s: %s", where, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return em_ends_with(where, ".json") ? em_load_index(where, m) : em_load_file(where, m);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/model.safetensors", where);
    if (stat(path, &st) == 0) return em_load_file(path, m);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", where);
    if (stat(path, &st) == 0) return em_load_index(path, m);
    return ca_error(CA_ERR_NOT_FOUND, "%s holds neither model.safetensors nor model.safetensors.index.json", where);
}

/* The largest layer is found by sorting the tensors by module, not by comparing every tensor with
 * every other (100,000 tensors took 93 s that way): each module's parameter count is one run of the
 * sorted keys, and whether it has submodules one binary search. */
typedef struct em_key {
    const char *s;       /* the tensor's name; its module is the first len bytes */
    size_t len;
    size_t idx;          /* the tensor's position in the files */
} em_key;

/* The module a tensor belongs to: its name up to the last '.' (a top-level tensor is its own). */
static size_t em_module_len(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot ? (size_t)(dot - name) : strlen(name);
}

static int em_cmp_key(const void *a, const void *b) {
    const em_key *x = a, *y = b;
    int c = memcmp(x->s, y->s, x->len < y->len ? x->len : y->len);
    if (c) return c;
    return x->len != y->len ? (x->len < y->len ? -1 : 1) : (x->idx > y->idx) - (x->idx < y->idx);
}

/* A module against the prefix "<p>." of its descendants: 0 for a descendant of p. The
 * descendants lie together in the sorted keys, so bsearch finds one when there is one. */
static int em_cmp_descendant(const void *probe, const void *elem) {
    const em_key *p = probe, *k = elem;
    int c = memcmp(p->s, k->s, p->len < k->len ? p->len : k->len);
    if (c) return c;
    if (k->len <= p->len) return 1;        /* k is p or a prefix of it: before "<p>." */
    return '.' - (unsigned char)k->s[p->len];
}

/* Per tensor: its module's parameter count (in sum) and whether the module has submodules, a
 * tensor named "<module>.<child>.<x>" (in skip). Accelerate's get_max_layer_size only counts
 * modules without children (their own tensors are then skipped). */
static void em_modules(const em_key *k, size_t n, uint64_t *sum, char *skip, const em_model *m) {
    for (size_t a = 0, b; a < n; a = b) {
        uint64_t total = 0;
        for (b = a; b < n && k[b].len == k[a].len && memcmp(k[b].s, k[a].s, k[a].len) == 0; b++)
            total += m->t[k[b].idx].numel;
        char children = bsearch(&k[a], k, n, sizeof *k, em_cmp_descendant) != NULL;
        for (size_t i = a; i < b; i++) {
            sum[k[i].idx] = total;
            skip[k[i].idx] = children && strchr(k[i].s, '.');
        }
    }
}

/* The largest layer's parameter count (a layer: a module with no submodules) and its name; the
 * first in the files' order of those of the largest count. */
static ca_status em_largest_layer(const em_model *m, char *name, size_t size, uint64_t *largest) {
    em_key *k = malloc((m->n ? m->n : 1) * sizeof *k);
    uint64_t *sum = malloc((m->n ? m->n : 1) * sizeof *sum);
    char *skip = malloc(m->n ? m->n : 1);
    ca_status s = k && sum && skip ? CA_OK : ca_error(CA_ERR_NOMEM, "estimate-memory: out of memory");
    *largest = 0;
    name[0] = '\0';
    for (size_t i = 0; s == CA_OK && i < m->n; i++) k[i] = (em_key){m->t[i].name, em_module_len(m->t[i].name), i};
    if (s == CA_OK) {
        qsort(k, m->n, sizeof *k, em_cmp_key);
        em_modules(k, m->n, sum, skip, m);
    }
    for (size_t i = 0; s == CA_OK && i < m->n; i++)
        if (!skip[i] && sum[i] > *largest)
            *largest = sum[i], snprintf(name, size, "%.*s", (int)em_module_len(m->t[i].name), m->t[i].name);
    free(k);
    free(sum);
    free(skip);
    return s;
}

/* ---- the figures ---- */

typedef struct em_dtype {
    const char *name;
    const char *alias[3];
    double divisor;      /* of the float32 size (Accelerate's model is created in float32) */
    int trainable;       /* Accelerate prints N/A for int8/int4 training */
} em_dtype;

static const em_dtype em_dtypes[] = {
    {"float32", {"f32", "fp32", NULL}, 1, 1},
    {"float16", {"f16", "fp16", "half"}, 2, 1},
    {"bfloat16", {"bf16", NULL, NULL}, 2, 1},
    {"int8", {"i8", NULL, NULL}, 4, 0},
    {"int4", {"i4", NULL, NULL}, 8, 0},
};
#define EM_NDTYPES (sizeof em_dtypes / sizeof em_dtypes[0])

static const em_dtype *em_find_dtype(const char *s) {
    for (size_t i = 0; i < EM_NDTYPES; i++) {
        if (strcmp(s, em_dtypes[i].name) == 0) return &em_dtypes[i];
        for (int a = 0; a < 3 && em_dtypes[i].alias[a]; a++)
            if (strcmp(s, em_dtypes[i].alias[a]) == 0) return &em_dtypes[i];
    }
    return NULL;
}

/* Accelerate's estimate_training_usage: the largest of model, gradients, optimizer and step for a
 * batch of 1 (float32: 4x the float32 size; float16/bfloat16 mixed precision: 2x). */
static uint64_t em_training_adam(uint64_t f32_bytes, const em_dtype *d) {
    return strcmp(d->name, "float32") == 0 ? 4 * f32_bytes : 2 * f32_bytes;
}

/* Per-process model states under ZeRO stage 0-3 with n processes (the ZeRO paper's accounting:
 * parameters p, gradients g, Adam's states k bytes per parameter; float32: 4+4+8, mixed precision:
 * 2+2+12 for the float32 master copy, momentum and variance). Activations are not counted. */
static uint64_t em_zero_bytes(uint64_t params, const em_dtype *d, int stage, int n) {
    int mixed = strcmp(d->name, "float32") != 0;
    double p = mixed ? 2 : 4, g = p, k = mixed ? 12 : 8, P = (double)params;
    double per = stage == 0 ? p + g + k : stage == 1 ? p + g + k / n : stage == 2 ? p + (g + k) / n
                                                                                  : (p + g + k) / n;
    return (uint64_t)(per * P + 0.5);
}

/* Accelerate's convert_bytes: "<round(size, 2)> <unit>", Python's spelling of ints and floats. */
static void em_convert_bytes(char *buf, size_t len, double size, int is_int) {
    static const char *units[] = {"bytes", "KB", "MB", "GB", "TB", "PB"};
    int u = 0;
    while (u < 5 && size >= 1024.0) size /= 1024.0, u++, is_int = 0;
    if (is_int) {
        snprintf(buf, len, "%.0f %s", size, units[u]);
        return;
    }
    char num[64];
    snprintf(num, sizeof num, "%.2f", size);
    size_t k = strlen(num);
    while (k > 0 && num[k - 1] == '0' && num[k - 2] != '.') num[--k] = '\0';
    snprintf(buf, len, "%s %s", num, units[u]);
}

/* ---- Accelerate's create_ascii_table ---- */

#define EM_CELL 64

static void em_repeat(const char *s, int n) {
    for (int i = 0; i < n; i++) fputs(s, stdout);
}

/* Python's str.center. */
static void em_center(const char *s, int width) {
    int len = (int)strlen(s), marg = width - len;
    if (marg <= 0) { fputs(s, stdout); return; }
    int left = marg / 2 + (marg & width & 1);
    printf("%*s%s%*s", left, "", s, marg - left, "");
}

static void em_make_row(const char *l, const char *m, const char *r, const int *w, int ncol, int diff) {
    fputs(l, stdout);
    for (int i = 0; i < ncol; i++) {
        if (i) fputs(m, stdout);
        em_repeat("─", w[i]);
    }
    em_repeat("─", diff);
    puts(r);
}

static void em_table(const char *title, const char *const *head, char (*cells)[EM_CELL], int nrow, int ncol) {
    int w[8], sum = 0, diff = 0;
    for (int c = 0; c < ncol; c++) {
        w[c] = (int)strlen(head[c]);
        for (int r = 0; r < nrow; r++)
            if ((int)strlen(cells[r * ncol + c]) > w[c]) w[c] = (int)strlen(cells[r * ncol + c]);
        sum += w[c];
    }
    int sep_len = sum + ncol + 1;
    if ((int)strlen(title) > sum) {
        diff = abs((int)strlen(title) - sep_len);
        w[ncol - 1] += diff;
        sep_len += 2 * diff;
    }
    em_make_row("┌", "─", "┐", w, ncol, diff);
    fputs("│", stdout), em_center(title, sep_len - 2), puts("│");
    em_make_row("├", "┬", "┤", w, ncol, diff);
    w[ncol - 1] += diff;
    for (int r = -1; r < nrow; r++) {
        for (int c = 0; c < ncol; c++)
            fputs("│", stdout), em_center(r < 0 ? head[c] : cells[r * ncol + c], w[c]);
        puts("│");
        if (r < 0) em_make_row("├", "┼", "┤", w, ncol, 0);
    }
    em_make_row("└", "┴", "┘", w, ncol, 0);
}

/* ---- the command ---- */

typedef struct em_args {
    const char *model;
    const em_dtype *dtypes[EM_NDTYPES];
    int ndtypes;
    int nprocs[EM_MAX_NPROCS];
    int nnprocs;
    int json;
    int measure;              /* --run: on the program's own device, not the lazy one */
    int run_argc;             /* --run PROGRAM ARGS: 0 when not given */
    char **run_argv;
} em_args;

static void em_usage(FILE *f) {
    fprintf(f, "usage: caccel estimate-memory MODEL [--dtypes D [D ...]] [--num_processes N[,N...]] [--json]\n"
               "       caccel estimate-memory [--num_processes N] [--measure] [--json] --run PROGRAM [ARGS...]\n\n"
               "MODEL: a .safetensors file, a model.safetensors.index.json, or a directory holding either\n"
               "(a Hugging Face model directory). Only the safetensors headers are read.\n\n"
               "Prints Accelerate's table (largest layer, total size, training using Adam, per dtype) and\n"
               "the per-process memory of the model states (parameters, gradients, Adam's states) under\n"
               "ZeRO stages 0-3 for each process count. Activations are not counted.\n\n"
               "  --dtypes       float32 float16 bfloat16 int8 int4 (also f32, fp16, bf16); default:\n"
               "                 float32 bfloat16 float16\n"
               "  --num_processes  process counts for the ZeRO table, e.g. 1,2,8 (default 1,2,4,8)\n"
               "  --json         the same figures, in bytes, as JSON\n\n"
               "--run runs one training step of PROGRAM (a caccel program; its configuration as usual:\n"
               "ZeRO stage, mixed precision, activation checkpointing) on the lazy xla device, with N\n"
               "processes under caccel launch, and prints per rank the parameters, gradients, optimizer\n"
               "state, activations and the peak of the step. The program stops after its first optimizer\n"
               "step. --measure runs the step on the device the configuration chooses instead.\n");
}

static int em_add_dtypes(em_args *a, const char *list) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        const em_dtype *d = em_find_dtype(tok);
        if (!d) {
            fprintf(stderr, "caccel estimate-memory: error: --dtypes: unknown dtype '%s' (float32, float16, "
                            "bfloat16, int8, int4)\n", tok);
            return 0;
        }
        if (a->ndtypes < (int)EM_NDTYPES) a->dtypes[a->ndtypes++] = d;
    }
    return 1;
}

static int em_add_nprocs(em_args *a, const char *list) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        char *end = NULL;
        long v = strtol(tok, &end, 10);
        if (*end || v < 1 || v > 1 << 20) {
            fprintf(stderr, "caccel estimate-memory: error: --num_processes: '%s' is not a process count\n", tok);
            return 0;
        }
        if (a->nnprocs < EM_MAX_NPROCS) a->nprocs[a->nnprocs++] = (int)v;
    }
    return 1;
}

/* --run takes one process count and no MODEL. */
static int em_check_run(em_args *a) {
    const char *bad = a->model ? "a MODEL" : a->nnprocs > 1 ? "more than one --num_processes" : a->ndtypes ? "--dtypes" : NULL;
    if (bad) {
        fprintf(stderr, "caccel estimate-memory: error: --run takes no %s (it runs the program at one process count)\n", bad);
        return em_usage(stderr), 2;
    }
    return 0;
}

/* 0: parsed; 1: --help printed; 2: bad usage (reported). */
static int em_parse(int argc, char **argv, em_args *a) {
    const char *v = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return em_usage(stdout), 1;
        if (ca_cli_match_flag(argv[i], "run", NULL)) {
            if (i + 1 >= argc) {
                fprintf(stderr, "caccel estimate-memory: error: --run needs a PROGRAM\n");
                return em_usage(stderr), 2;
            }
            a->run_argc = argc - i - 1, a->run_argv = argv + i + 1;   /* the rest is the program's */
            break;
        } else if (ca_cli_match_flag(argv[i], "measure", NULL)) {
            a->measure = 1;
        } else if (ca_cli_match_flag(argv[i], "json", NULL)) {
            a->json = 1;
        } else if (ca_cli_match_flag(argv[i], "dtypes", &v)) {
            if (v && !em_add_dtypes(a, v)) return 2;
            while (!v && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)   /* nargs="+" */
                if (!em_add_dtypes(a, argv[++i])) return 2;
        } else if (ca_cli_match_flag(argv[i], "num_processes", &v)) {
            if (!v && i + 1 < argc) v = argv[++i];
            if (!v || !em_add_nprocs(a, v)) return 2;
        } else if (argv[i][0] == '-' || a->model) {
            fprintf(stderr, "caccel estimate-memory: error: unexpected argument '%s'\n", argv[i]);
            return em_usage(stderr), 2;
        } else {
            a->model = argv[i];
        }
    }
    if (a->run_argc) return em_check_run(a);
    if (!a->model) return em_usage(stderr), 2;
    if (!a->ndtypes) em_add_dtypes(a, "float32,bfloat16,float16");
    if (!a->nnprocs) em_add_nprocs(a, "1,2,4,8");
    return 0;
}

static void em_print_tables(const em_args *a, uint64_t params, uint64_t largest, const char *largest_name) {
    char cells[EM_NDTYPES * 4][EM_CELL];
    uint64_t f32 = 4 * params, big = 4 * largest;
    for (int i = 0; i < a->ndtypes; i++) {
        const em_dtype *d = a->dtypes[i];
        char(*row)[EM_CELL] = &cells[i * 4];
        snprintf(row[0], EM_CELL, "%s", d->name);
        em_convert_bytes(row[1], EM_CELL, (double)big / d->divisor, d->divisor == 1);
        em_convert_bytes(row[2], EM_CELL, (double)f32 / d->divisor, d->divisor == 1);
        if (d->trainable) em_convert_bytes(row[3], EM_CELL, (double)em_training_adam(f32, d), 1);
        else snprintf(row[3], EM_CELL, "N/A");
    }
    char title[PATH_MAX + 64];
    snprintf(title, sizeof title, "Memory Usage for loading `%s`", a->model);
    static const char *const head[] = {"dtype", "Largest Layer", "Total Size", "Training using Adam"};
    em_table(title, head, cells, a->ndtypes, 4);
    printf("%llu parameters (every tensor of the files, saved buffers included); largest layer: %s "
           "(%llu parameters)\n\n", (unsigned long long)params,
           largest_name[0] ? largest_name : "-", (unsigned long long)largest);

    char(*z)[EM_CELL] = malloc(sizeof(char[EM_CELL]) * 6 * EM_NDTYPES * EM_MAX_NPROCS);
    if (!z) return;
    int nrow = 0;
    for (int i = 0; i < a->ndtypes; i++) {
        if (!a->dtypes[i]->trainable) continue;
        for (int k = 0; k < a->nnprocs; k++, nrow++) {
            snprintf(z[nrow * 6], EM_CELL, "%s", a->dtypes[i]->name);
            snprintf(z[nrow * 6 + 1], EM_CELL, "%d", a->nprocs[k]);
            for (int st = 0; st < 4; st++)
                em_convert_bytes(z[nrow * 6 + 2 + st], EM_CELL,
                                 (double)em_zero_bytes(params, a->dtypes[i], st, a->nprocs[k]), 1);
        }
    }
    static const char *const zhead[] = {"dtype", "processes", "ZeRO 0", "ZeRO 1", "ZeRO 2", "ZeRO 3"};
    if (nrow) em_table("Training using Adam, per process (model states)", zhead, z, nrow, 6);
    free(z);
}

static void em_print_json(const em_args *a, uint64_t params, uint64_t largest, const char *largest_name) {
    json_object *root = json_object_new_object(), *rows = json_object_new_array();
    json_object_object_add(root, "model", json_object_new_string(a->model));
    json_object_object_add(root, "parameters", json_object_new_int64((int64_t)params));
    json_object_object_add(root, "largest_layer_name", json_object_new_string(largest_name));
    json_object_object_add(root, "largest_layer_parameters", json_object_new_int64((int64_t)largest));
    for (int i = 0; i < a->ndtypes; i++) {
        const em_dtype *d = a->dtypes[i];
        json_object *r = json_object_new_object();
        json_object_object_add(r, "dtype", json_object_new_string(d->name));
        json_object_object_add(r, "largest_layer", json_object_new_int64((int64_t)(4 * largest / (uint64_t)d->divisor)));
        json_object_object_add(r, "total_size", json_object_new_int64((int64_t)(4 * params / (uint64_t)d->divisor)));
        json_object_object_add(r, "training_adam", d->trainable ? json_object_new_int64(
                                   (int64_t)em_training_adam(4 * params, d)) : NULL);
        json_object *zero = json_object_new_array();
        for (int k = 0; d->trainable && k < a->nnprocs; k++) {
            json_object *e = json_object_new_object(), *st = json_object_new_array();
            json_object_object_add(e, "num_processes", json_object_new_int(a->nprocs[k]));
            for (int s = 0; s < 4; s++)
                json_object_array_add(st, json_object_new_int64((int64_t)em_zero_bytes(params, d, s, a->nprocs[k])));
            json_object_object_add(e, "per_process_by_stage", st);
            json_object_array_add(zero, e);
        }
        json_object_object_add(r, "zero", zero);
        json_object_array_add(rows, r);
    }
    json_object_object_add(root, "dtypes", rows);
    puts(json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(root);
}

int ca_cmd_estimate_memory(int argc, char **argv) {
    em_args a;
    memset(&a, 0, sizeof a);
    int rc = em_parse(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    if (a.run_argc)
        return ca_em_run_program(&(ca_em_run){.argc = a.run_argc, .argv = a.run_argv, .json = a.json,
                                              .measure = a.measure, .nprocs = a.nnprocs ? a.nprocs[0] : 1});
    em_model m = {0};
    if (em_load(a.model, &m) != CA_OK) {
        em_free(&m);
        return ca_cli_fail("estimate-memory");
    }
    uint64_t params = 0;
    for (size_t i = 0; i < m.n; i++) params += m.t[i].numel;
    char largest_name[512];
    uint64_t largest = 0;
    if (em_largest_layer(&m, largest_name, sizeof largest_name, &largest) != CA_OK) {
        em_free(&m);
        return ca_cli_fail("estimate-memory");
    }
    if (a.json) em_print_json(&a, params, largest, largest_name);
    else em_print_tables(&a, params, largest, largest_name);
    em_free(&m);
    return 0;
}
