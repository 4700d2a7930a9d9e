/* caccel trace analyze DIR: tools/cmd_trace_analyze.c.
 * caccel trace merge DIR: the profiler's per-rank traces (DIR/trace_rank<r>.json) on one timeline,
 * written to DIR/trace_merged.json. Each rank's timestamps are relative to its own begin; the files
 * say where that begin was on CLOCK_MONOTONIC (otherData.clock_origin_ns), so the merge shifts each
 * rank by its origin's distance from the earliest. That is one clock on one machine; ranks of
 * several machines keep their own begins as zero (their clocks are not comparable). */
#include "tools/cli_impl.h"
#include "base/file_impl.h"
#include "core/json_impl.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CA_FILE_TRACE CA_FILE_KIND("a trace file", 16 * CA_FILE_GIB, CA_ERR_IO, CA_ERR_INVALID)
#define MAX_RANKS 4096

typedef struct {
    json_object *doc[MAX_RANKS];
    int rank[MAX_RANKS];
    int64_t origin[MAX_RANKS];
    const char *boot[MAX_RANKS];   /* otherData.boot_id (owned by doc): ranks of one clock share it */
    int n;
} traces;

/* One collective slice of one rank's trace, for the split into waiting for peers and moving data. */
typedef struct {
    const char *comm;
    int64_t seq;
    int rank, world, file;
    double ts, dur;                /* on the merged timeline, microseconds */
    json_object *args;
} coll_rec;

static int usage(FILE *f) {
    fprintf(f, "usage: caccel trace merge DIR\n"
               "  joins DIR/trace_rank<r>.json (written by --profile --output_trace_dir DIR) into\n"
               "  DIR/trace_merged.json: every rank a process of one timeline (docs/PROFILING.md)\n"
               "       caccel trace analyze DIR\n"
               "  reads the flight recorder's DIR/rank_<r>.json (written on a communicator failure with\n"
               "  CACCEL_FLIGHT_RECORDER_DIR=DIR) and says which rank is behind, on which collective, or\n"
               "  where the ranks called different collectives, and what each rank was doing\n");
    return f == stdout ? 0 : 2;
}

static int load_one(traces *t, const char *dir, const char *name, int rank) {
    char path[4400], why[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ca_status st;
    json_object *o = ca_json_load(path, CA_FILE_TRACE, why, sizeof why, &st);
    if (!o) {
        if (why[0]) fprintf(stderr, "caccel trace: error: %s is not JSON: %s\n", path, why);
        else fprintf(stderr, "caccel trace: error: %s\n", ca_last_error());
        return 1;
    }
    if (!json_object_is_type(ca_json_member(o, "traceEvents"), json_type_array)) {
        fprintf(stderr, "caccel trace: error: %s has no traceEvents array (not a Chrome trace)\n", path);
        json_object_put(o);
        return 1;
    }
    json_object *org = ca_json_member(ca_json_member(o, "otherData"), "clock_origin_ns");
    json_object *boot = ca_json_member(ca_json_member(o, "otherData"), "boot_id");
    t->boot[t->n] = boot && json_object_is_type(boot, json_type_string) ? json_object_get_string(boot) : "";
    t->doc[t->n] = o;
    t->rank[t->n] = rank;
    t->origin[t->n] = org ? json_object_get_int64(org) : 0;
    t->n++;
    return 0;
}

static int load_dir(traces *t, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "caccel trace: error: cannot open directory '%s'\n", dir);
        return 1;
    }
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        int rank, used = 0;
        if (sscanf(e->d_name, "trace_rank%d.json%n", &rank, &used) != 1 || e->d_name[used] != '\0') continue;
        if (t->n == MAX_RANKS) {
            fprintf(stderr, "caccel trace: error: more than %d traces in '%s'\n", MAX_RANKS, dir);
            rc = 1;
        } else rc = load_one(t, dir, e->d_name, rank);
    }
    closedir(d);
    if (rc == 0 && t->n == 0) {
        fprintf(stderr, "caccel trace: error: no trace_rank<r>.json in '%s' (run with --profile --output_trace_dir %s)\n",
                dir, dir);
        rc = 1;
    }
    return rc;
}

/* Moves every event of t->doc[i] into out, its timestamp shifted by shift_us. */
static void append_events(json_object *out, json_object *doc, double shift_us) {
    json_object *ev = ca_json_member(doc, "traceEvents");
    size_t n = json_object_array_length(ev);
    for (size_t k = 0; k < n; k++) {
        json_object *e = json_object_array_get_idx(ev, k), *ts = ca_json_member(e, "ts");
        if (ts && shift_us != 0) json_object_object_add(e, "ts", json_object_new_double(json_object_get_double(ts) + shift_us));
        json_object_array_add(out, json_object_get(e));
    }
}

static int coll_cmp(const void *a, const void *b) {
    const coll_rec *x = a, *y = b;
    int c = strcmp(x->comm, y->comm);
    if (c) return c;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* The collective slices of every trace, their times shifted onto the merged timeline. */
static coll_rec *coll_collect(const traces *t, const double *shift, size_t *count) {
    size_t n = 0, cap = 0;
    coll_rec *r = NULL;
    for (int i = 0; i < t->n; i++) {
        json_object *ev = ca_json_member(t->doc[i], "traceEvents");
        for (size_t k = 0; k < json_object_array_length(ev); k++) {
            json_object *e = json_object_array_get_idx(ev, k), *a = ca_json_member(e, "args");
            const char *cat = json_object_get_string(ca_json_member(e, "cat"));
            if (!cat || strcmp(cat, "collective") != 0 || !a || !ca_json_member(e, "dur")) continue;
            if (n == cap) {
                coll_rec *m = realloc(r, (cap = cap ? 2 * cap : 256) * sizeof *r);
                if (!m) return free(r), *count = 0, NULL;
                r = m;
            }
            const char *comm = json_object_get_string(ca_json_member(a, "comm"));
            r[n++] = (coll_rec){.comm = comm ? comm : "", .seq = json_object_get_int64(ca_json_member(a, "seq")),
                                .rank = json_object_get_int(ca_json_member(a, "rank")),
                                .world = json_object_get_int(ca_json_member(a, "world")), .file = i,
                                .ts = json_object_get_double(ca_json_member(e, "ts")) + shift[i],
                                .dur = json_object_get_double(ca_json_member(e, "dur")), .args = a};
        }
    }
    *count = n;
    return r;
}

/* Whether the records [a, b) are one collective of every rank of its communicator, on one clock. */
static int coll_complete(const traces *t, const coll_rec *r, size_t a, size_t b) {
    if ((int)(b - a) != r[a].world) return 0;
    for (size_t k = a; k < b; k++)
        if (r[k].rank != (int)(k - a) || !t->boot[r[k].file][0] || strcmp(t->boot[r[k].file], t->boot[r[a].file]))
            return 0;
    return 1;
}

/* Each collective's slice split, on every rank, at the issue of the last rank to arrive: before it
 * the rank waited for peers (peers_wait_us), after it the data moved (transfer_us: the transfers,
 * the reduction and the backend's own handshakes); last_arrival names that rank. Only where every
 * rank of the communicator recorded it and the ranks read one clock (the same boot_id); the others
 * are counted in *unsplit. */
static const char *const split_keys[3] = {"peers_wait_us", "transfer_us", "last_arrival"};

static int coll_split(const traces *t, const double *shift, int *unsplit) {
    size_t n = 0;
    coll_rec *r = coll_collect(t, shift, &n);
    int split = 0;
    *unsplit = 0;
    if (!r) return 0;
    qsort(r, n, sizeof *r, coll_cmp);
    for (size_t a = 0, b; a < n; a = b) {
        for (b = a + 1; b < n && r[b].seq == r[a].seq && strcmp(r[b].comm, r[a].comm) == 0; b++) {}
        if (!coll_complete(t, r, a, b)) {   /* a split a rank's own file holds is not the merge's to show */
            for (size_t k = a; k < b; k++)
                for (int f = 0; f < 3; f++) json_object_object_del(r[k].args, split_keys[f]);
            *unsplit += (int)(b - a);
            continue;
        }
        size_t last = a;
        for (size_t k = a; k < b; k++) if (r[k].ts > r[last].ts) last = k;
        for (size_t k = a; k < b; k++) {   /* to the nanosecond, as the slices are */
            double w = round((r[last].ts - r[k].ts) * 1e3) / 1e3, d = round(r[k].dur * 1e3) / 1e3;
            w = w < 0 ? 0 : w > d ? d : w;
            json_object_object_add(r[k].args, "peers_wait_us", json_object_new_double(w));
            json_object_object_add(r[k].args, "transfer_us", json_object_new_double(round((d - w) * 1e3) / 1e3));
            json_object_object_add(r[k].args, "last_arrival", json_object_new_int(r[last].rank));
            split++;
        }
    }
    free(r);
    return split;
}

static int merge(const char *dir) {
    traces *t = calloc(1, sizeof *t);
    if (!t) return 1;
    int rc = load_dir(t, dir);
    if (rc == 0) {
        int64_t min = t->origin[0];
        for (int i = 1; i < t->n; i++) if (t->origin[i] < min) min = t->origin[i];
        json_object *root = json_object_new_object(), *events = json_object_new_array();
        double shift[MAX_RANKS];
        for (int i = 0; i < t->n; i++) shift[i] = t->origin[i] ? (double)(t->origin[i] - min) / 1e3 : 0;
        int unsplit, split = coll_split(t, shift, &unsplit);
        for (int i = 0; i < t->n; i++) append_events(events, t->doc[i], shift[i]);
        json_object_object_add(root, "displayTimeUnit", json_object_new_string("ms"));
        json_object_object_add(root, "traceEvents", events);
        char path[4200];
        snprintf(path, sizeof path, "%s/trace_merged.json", dir);
        if (json_object_to_file_ext(path, root, JSON_C_TO_STRING_PLAIN) != 0) {
            fprintf(stderr, "caccel trace: error: cannot write '%s': %s\n", path, json_util_get_last_err());
            rc = 1;
        } else {
            printf("caccel trace: merged %d rank%s into %s\n", t->n, t->n == 1 ? "" : "s", path);
            if (split || unsplit)
                printf("caccel trace: %d collective slice%s split into waiting for peers and moving data "
                       "(peers_wait_us, transfer_us)%s", split, split == 1 ? "" : "s", unsplit ? "" : "\n");
            if (unsplit)
                printf("; %d not: a rank's record missing or the ranks on different machines' clocks\n", unsplit);
        }
        json_object_put(root);
    }
    for (int i = 0; i < t->n; i++) json_object_put(t->doc[i]);
    free(t);
    return rc;
}

int ca_cmd_trace(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) return usage(stdout);
    if (argc == 3 && strcmp(argv[1], "analyze") == 0) return ca_cmd_trace_analyze(argv[2]);
    if (argc != 3 || strcmp(argv[1], "merge") != 0) return usage(stderr);
    return merge(argv[2]);
}
