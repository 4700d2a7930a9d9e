/* caccel trace analyze DIR: reads the flight recorder's dumps (DIR/rank_<r>.json, the newest each
 * rank wrote when its communicator failed, on a signal or on SIGUSR1's demand; earlier ones, kept as
 * rank_<r>.<n>.json, are not read; docs/PROFILING.md, "Flight recorder") and says which rank is
 * behind and on which collective, or where the ranks called different collectives, and what every
 * rank was doing: the collective it was in, its last completed one, its last kernel call. A rank
 * with no file was killed, crashed or stopped before it could write one (only a failing rank that
 * runs writes): that absence is evidence too. Every file is read within bounds (a regular file of at
 * most 64 MiB, at most 4096 ranks, each value checked), and an error names the file. */
#include "tools/cli_impl.h"
#include "base/file_impl.h"
#include "core/json_impl.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CA_FILE_FR CA_FILE_KIND("a flight recorder dump", 64 * CA_FILE_MIB, CA_ERR_IO, CA_ERR_INVALID)
#define FR_MAX_RANKS 4096

enum { ST_COMPLETED, ST_FAILED, ST_UNFINISHED };
static const char *const st_names[] = {"completed", "failed", "unfinished"};

typedef struct {
    uint64_t seq;
    char sig[160];
    int state;
    int64_t t_issue, t_end;
} fr_coll;

typedef struct {
    bool present;
    int world;
    long pid;
    int64_t dump_ns;
    uint64_t issued;
    char comm[100], host[80], status[40], reason[600], kernel[200];
    int64_t kernel_ns;        /* the last kernel call's end (0: none) */
    fr_coll *c;               /* by seq, ascending */
    size_t nc;
} fr_rank;

typedef struct {
    fr_rank r[FR_MAX_RANKS];
    int world;                /* from the files (they must agree) */
    const char *dir;
} fr_job;

static int bad(const char *path, const char *what) {
    fprintf(stderr, "caccel trace: error: %s: %s\n", path, what);
    return 1;
}

static bool get_i64(json_object *o, const char *key, int64_t *out) {
    json_object *v = ca_json_member(o, key);
    if (!json_object_is_type(v, json_type_int)) return false;
    *out = json_object_get_int64(v);
    return true;
}

static void get_str(json_object *o, const char *key, char *buf, size_t len) {
    const char *s = ca_json_member_str(o, key);
    snprintf(buf, len, "%s", s ? s : "");
}

static int parse_coll(json_object *e, const char *path, size_t i, fr_coll *out) {
    char what[160];
    const char *sig = ca_json_member_str(e, "sig"), *st = ca_json_member_str(e, "state");
    int64_t seq;
    snprintf(what, sizeof what, "collectives[%zu] is not a record with seq, sig, state, t_issue_ns and t_end_ns", i);
    if (!get_i64(e, "seq", &seq) || seq < 0 || !sig || !st || !get_i64(e, "t_issue_ns", &out->t_issue) ||
        !get_i64(e, "t_end_ns", &out->t_end))
        return bad(path, what);
    out->seq = (uint64_t)seq;
    snprintf(out->sig, sizeof out->sig, "%s", sig);
    out->state = -1;
    for (int k = 0; k < 3; k++)
        if (!strcmp(st, st_names[k])) out->state = k;
    if (out->state < 0) {
        snprintf(what, sizeof what, "collectives[%zu] has state '%.40s' (completed, failed or unfinished)", i, st);
        return bad(path, what);
    }
    if (i > 0 && out[-1].seq >= out->seq) {
        snprintf(what, sizeof what, "collectives[%zu] (#%llu) does not follow #%llu", i, (unsigned long long)out->seq,
                 (unsigned long long)out[-1].seq);
        return bad(path, what);
    }
    return 0;
}

static int parse_colls(json_object *a, const char *path, fr_rank *r) {
    if (!json_object_is_type(a, json_type_array)) return bad(path, "no collectives array");
    size_t n = json_object_array_length(a);
    r->c = calloc(n ? n : 1, sizeof *r->c);
    if (!r->c) return bad(path, "out of memory");
    for (size_t i = 0; i < n; i++)
        if (parse_coll(json_object_array_get_idx(a, i), path, i, r->c + i)) return 1;
    r->nc = n;
    return 0;
}

/* "matmul f32 [[2,3],[3,4]] on cpu:0" from the last kernel record. */
static void parse_kernels(json_object *a, fr_rank *r) {
    size_t n = json_object_is_type(a, json_type_array) ? json_object_array_length(a) : 0;
    if (n == 0) return;
    json_object *k = json_object_array_get_idx(a, n - 1), *sh = ca_json_member(k, "shapes");
    const char *op = ca_json_member_str(k, "op"), *dt = ca_json_member_str(k, "dtype");
    const char *dev = ca_json_member_str(k, "device");
    snprintf(r->kernel, sizeof r->kernel, "%.40s %.10s %.100s on %.20s", op ? op : "?", dt ? dt : "?",
             sh ? json_object_to_json_string_ext(sh, JSON_C_TO_STRING_PLAIN) : "[]", dev ? dev : "?");
    if (!get_i64(k, "t_end_ns", &r->kernel_ns)) r->kernel_ns = 0;
}

static int parse_rank(json_object *o, const char *path, int rank, fr_rank *r) {
    const char *fmt = ca_json_member_str(o, "format");
    int64_t rk, world, issued, pid;
    if (!fmt || strcmp(fmt, "caccel-flight-recorder") != 0)
        return bad(path, "not a flight recorder dump (its \"format\" is not \"caccel-flight-recorder\")");
    if (!get_i64(o, "rank", &rk) || !get_i64(o, "world", &world) || !get_i64(o, "issued", &issued) || issued < 0 ||
        !get_i64(o, "dump_ns", &r->dump_ns))
        return bad(path, "rank, world, issued or dump_ns is missing or not an integer");
    if (world < 1 || world > FR_MAX_RANKS || rk != rank) {
        char what[160];
        snprintf(what, sizeof what, "says rank %lld of world %lld (want rank %d, world 1 to %d)", (long long)rk,
                 (long long)world, rank, FR_MAX_RANKS);
        return bad(path, what);
    }
    r->world = (int)world;
    r->issued = (uint64_t)issued;
    r->pid = get_i64(o, "pid", &pid) ? (long)pid : 0;
    get_str(o, "comm", r->comm, sizeof r->comm);
    get_str(o, "host", r->host, sizeof r->host);
    get_str(o, "status", r->status, sizeof r->status);
    get_str(o, "reason", r->reason, sizeof r->reason);
    parse_kernels(ca_json_member(o, "kernels"), r);
    if (parse_colls(ca_json_member(o, "collectives"), path, r)) return 1;
    r->present = true;
    return 0;
}

static int load_rank(fr_job *j, const char *name, int rank) {
    char path[4400], why[256];
    snprintf(path, sizeof path, "%s/%s", j->dir, name);
    if (rank < 0 || rank >= FR_MAX_RANKS) return bad(path, "rank out of range (0 to 4095)");
    ca_status st;
    json_object *o = ca_json_load(path, CA_FILE_FR, why, sizeof why, &st);
    if (!o) {
        if (why[0]) return bad(path, why);
        fprintf(stderr, "caccel trace: error: %s\n", ca_last_error());
        return 1;
    }
    int rc = parse_rank(o, path, rank, &j->r[rank]);
    json_object_put(o);
    if (rc == 0 && j->world && j->r[rank].world != j->world) {
        char what[160];
        snprintf(what, sizeof what, "says world %d where the other files say %d", j->r[rank].world, j->world);
        return bad(path, what);
    }
    if (rc == 0) j->world = j->r[rank].world;
    return rc;
}

static int load_dir(fr_job *j) {
    DIR *d = opendir(j->dir);
    if (!d) {
        fprintf(stderr, "caccel trace: error: cannot open directory '%s'\n", j->dir);
        return 1;
    }
    int rc = 0, n = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        int rank, used = 0;
        if (sscanf(e->d_name, "rank_%d.json%n", &rank, &used) != 1 || e->d_name[used] != '\0') continue;
        rc = load_rank(j, e->d_name, rank);
        n++;
    }
    closedir(d);
    if (rc == 0 && n == 0) {
        fprintf(stderr, "caccel trace: error: no rank_<r>.json in '%s' (the flight recorder writes them there when a "
                "communicator fails with CACCEL_FLIGHT_RECORDER_DIR set)\n", j->dir);
        rc = 1;
    }
    for (int r = j->world; rc == 0 && r < FR_MAX_RANKS; r++)
        if (j->r[r].present) {
            char path[4400];
            snprintf(path, sizeof path, "%s/rank_%d.json", j->dir, r);
            rc = bad(path, "its rank is not below the world size the files say");
        }
    return rc;
}

/* ------------------------------------------------------------------ analysis */

static const fr_coll *find(const fr_rank *r, uint64_t seq) {
    size_t lo = 0, hi = r->nc;
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (r->c[m].seq < seq) lo = m + 1;
        else hi = m;
    }
    return lo < r->nc && r->c[lo].seq == seq ? &r->c[lo] : NULL;
}

/* Where rank r stands: its first collective not completed, or the next it would have called. */
static uint64_t position(const fr_rank *r) {
    for (size_t i = 0; i < r->nc; i++)
        if (r->c[i].state != ST_COMPLETED) return r->c[i].seq;
    return r->issued;
}

/* Its progress: a rank in #n is ahead of one that has not called #n yet. */
static uint64_t progress(const fr_rank *r) {
    uint64_t p = position(r);
    return 2 * p + (p < r->issued ? 1 : 0);
}

/* "all_reduce(f32, 16, sum) #7, failed" or "#7 (not called)" */
static void at_text(const fr_rank *r, uint64_t seq, char *buf, size_t len) {
    const fr_coll *c = find(r, seq);
    if (c) snprintf(buf, len, "#%llu %s (%s)", (unsigned long long)seq, c->sig, st_names[c->state]);
    else if (seq >= r->issued) snprintf(buf, len, "#%llu (not called yet)", (unsigned long long)seq);
    else snprintf(buf, len, "#%llu (no longer in its record)", (unsigned long long)seq);
}

static void add_rank(char *buf, size_t len, int r) {
    size_t o = strlen(buf);
    if (o + 1 < len) snprintf(buf + o, len - o, "%s%d", o ? "," : "", r);
}

/* The lowest seq at which two ranks' records hold different collectives; false when none. Each rank
 * is compared with the lowest rank that recorded the same seq before it. */
static bool first_mismatch(const fr_job *j, uint64_t *at) {
    bool found = false;
    for (int r = 0; r < j->world; r++) {
        if (!j->r[r].present) continue;
        for (size_t i = 0; i < j->r[r].nc; i++) {
            const fr_coll *c = &j->r[r].c[i];
            if (found && c->seq >= *at) break;
            for (int q = 0; q < r; q++) {
                const fr_coll *o = j->r[q].present ? find(&j->r[q], c->seq) : NULL;
                if (!o) continue;
                if (strcmp(o->sig, c->sig) != 0) { *at = c->seq; found = true; }
                break;
            }
        }
    }
    return found;
}

/* Groups the ranks by the collective they recorded at #at: "rank 0 called barrier; ranks 1,2 called
 * all_reduce(...)", and when one rank alone differs from all the others, names it. */
static void verdict_mismatch(const fr_job *j, uint64_t at) {
    printf("verdict: collective mismatch at #%llu:", (unsigned long long)at);
    bool *done = calloc((size_t)j->world, sizeof *done);
    int groups = 0, lone = -1, lone_n = 0;
    for (int r = 0; done && r < j->world; r++) {
        const fr_coll *c = j->r[r].present && !done[r] ? find(&j->r[r], at) : NULL;
        if (!c) continue;
        char ranks[600] = "";
        int n = 0;
        for (int q = r; q < j->world; q++) {
            const fr_coll *o = j->r[q].present ? find(&j->r[q], at) : NULL;
            if (o && !strcmp(o->sig, c->sig)) { done[q] = true; add_rank(ranks, sizeof ranks, q); n++; }
        }
        printf("%s rank%s %s called %s", groups ? ";" : "", n > 1 ? "s" : "", ranks, c->sig);
        if (n == 1) { lone = r; lone_n++; }
        groups++;
    }
    free(done);
    if (groups == 2 && lone_n == 1) printf("; rank %d differs from the others", lone);
    printf("; every rank must call the same collectives in the same order\n");
}

/* When rank r gave up on #seq: its end, or (a wait that failed) its dump, written as it failed. */
static int64_t gave_up(const fr_job *j, int r, uint64_t seq) {
    const fr_coll *c = find(&j->r[r], seq);
    return c && c->t_end ? c->t_end : j->r[r].dump_ns;
}

/* Every rank stopped in #seq: on one machine (one monotonic clock), a rank that issued it only after
 * all the others had given up on it arrived late (it was stopped, or busy elsewhere). -1: none. */
static int late_arrival(const fr_job *j, uint64_t seq) {
    int late = -1;
    int64_t last_issue = 0;
    for (int r = 0; r < j->world; r++) {
        const fr_coll *c = find(&j->r[r], seq);
        if (!c || strcmp(j->r[r].host, j->r[0].host) != 0) return -1;
        if (c->t_issue > last_issue) { last_issue = c->t_issue; late = r; }
    }
    for (int r = 0; r < j->world; r++)
        if (r != late && gave_up(j, r, seq) > last_issue) return -1;
    return late;
}

static void verdict_missing(const fr_job *j, const char *missing, uint64_t lo) {
    char at[300] = "";
    const char *who = strchr(missing, ',') ? "ranks" : "rank", *verb = strchr(missing, ',') ? "are" : "is";
    for (int r = 0; r < j->world && !at[0]; r++)
        if (j->r[r].present && position(&j->r[r]) == lo) at_text(&j->r[r], lo, at, sizeof at);
    printf("verdict: %s %s %s behind: no record (killed, crashed or stopped: a failing rank that still runs "
           "writes one); the others stopped at %s\n", who, missing, verb, at);
}

/* Every rank at the same place: the one that arrived late, if the clocks show it. */
static void verdict_even(const fr_job *j, uint64_t pos) {
    char at[300];
    at_text(&j->r[0], pos, at, sizeof at);
    int late = late_arrival(j, pos);
    if (late < 0) {
        printf("verdict: no rank is behind: every rank stopped at %s; the failures below say why\n", at);
        return;
    }
    const fr_coll *c = find(&j->r[late], pos);
    int64_t last = 0;
    for (int r = 0; r < j->world; r++)
        if (r != late && gave_up(j, r, pos) > last) last = gave_up(j, r, pos);
    printf("verdict: rank %d is behind: it issued #%llu %s %.3f s after every other rank had given up on it "
           "(it was stopped or busy elsewhere)\n", late, (unsigned long long)pos, c->sig,
           (double)(c->t_issue - last) / 1e9);
}

/* No mismatch: the ranks without a file, or those least advanced, are behind. */
static void verdict_behind(const fr_job *j) {
    char missing[600] = "", low[600] = "", ahead[600] = "", at[300], mine[300];
    uint64_t lo = UINT64_MAX, hi = 0, plo = UINT64_MAX;
    int ref = -1, lref = -1;
    for (int r = 0; r < j->world; r++) {
        if (!j->r[r].present) { add_rank(missing, sizeof missing, r); continue; }
        uint64_t p = progress(&j->r[r]);
        if (p < lo) { lo = p; lref = r; plo = position(&j->r[r]); }
        if (p > hi) { hi = p; ref = r; }
    }
    if (missing[0]) {
        verdict_missing(j, missing, plo);
        return;
    }
    if (lo == hi) {
        verdict_even(j, plo);
        return;
    }
    for (int r = 0; r < j->world; r++) add_rank(progress(&j->r[r]) == lo ? low : ahead, sizeof low, r);
    at_text(&j->r[ref], position(&j->r[ref]), at, sizeof at);
    at_text(&j->r[lref], plo, mine, sizeof mine);
    bool many = strchr(ahead, ',') != NULL;
    printf("verdict: %s %s %s behind: stopped at %s while %s %s %s at %s\n", strchr(low, ',') ? "ranks" : "rank", low,
           strchr(low, ',') ? "are" : "is", mine, many ? "ranks" : "rank", ahead, many ? "are" : "is", at);
}

static void ago(int64_t t, int64_t now, char *buf, size_t len) {
    if (!t || now < t) snprintf(buf, len, "?");
    else snprintf(buf, len, "%.3f s", (double)(now - t) / 1e9);
}

/* The peers rank r waited on in #seq, the collective it was in: those that had not called it when
 * they wrote their files, or on one machine issued it only after r had given up on it, and those with
 * no file (torch's fr_trace names them the same way). Nothing when every peer was in it too. */
static void waited_on(const fr_job *j, int r, uint64_t seq) {
    char late[600] = "", none[600] = "";
    int64_t gave = gave_up(j, r, seq);
    for (int q = 0; q < j->world; q++) {
        const fr_rank *x = &j->r[q];
        const fr_coll *c = x->present ? find(x, seq) : NULL;
        if (q == r) continue;
        if (!x->present) add_rank(none, sizeof none, q);
        else if (x->issued <= seq || (c && !strcmp(x->host, j->r[r].host) && c->t_issue > gave))
            add_rank(late, sizeof late, q);
    }
    if (!late[0] && !none[0]) return;
    printf("  waited on in #%llu:", (unsigned long long)seq);
    if (late[0]) printf(" rank%s %s (not called when it gave up)", strchr(late, ',') ? "s" : "", late);
    if (none[0]) printf("%s rank%s %s (no record)", late[0] ? ";" : "", strchr(none, ',') ? "s" : "", none);
    printf("\n");
}

/* What rank r was doing when it wrote its file. */
static void describe(const fr_job *j, int r) {
    const fr_rank *x = &j->r[r];
    if (!x->present) {
        printf("rank %d: no record\n", r);
        return;
    }
    char where[300], since[40], last[300] = "none";
    uint64_t p = position(x);
    at_text(x, p, where, sizeof where);
    const fr_coll *c = find(x, p);
    ago(c ? c->t_issue : 0, x->dump_ns, since, sizeof since);
    for (size_t i = x->nc; i-- > 0;)
        if (x->c[i].state == ST_COMPLETED && x->c[i].seq < p) {
            snprintf(last, sizeof last, "#%llu %s", (unsigned long long)x->c[i].seq, x->c[i].sig);
            break;
        }
    printf("rank %d (pid %ld%s%s): at %s%s%s%s; last completed %s; %llu issued, %zu recorded\n", r, x->pid,
           x->host[0] ? " on " : "", x->host, where, c ? ", issued " : "", c ? since : "", c ? " before the dump" : "", last,
           (unsigned long long)x->issued, x->nc);
    if (x->kernel[0]) {
        ago(x->kernel_ns, x->dump_ns, since, sizeof since);
        printf("  last kernel call: %s, ended %s before the dump\n", x->kernel, since);
    } else printf("  last kernel call: none recorded\n");
    if (c && c->state != ST_COMPLETED) waited_on(j, r, p);
    /* SIGUSR1 asked for a dump of a run that had not failed */
    printf("  %s (%s): %s\n", strcmp(x->status, "SIGUSR1") ? "failure" : "dump on demand", x->status, x->reason);
}

static void report(const fr_job *j) {
    int n = 0;
    for (int r = 0; r < j->world; r++) n += j->r[r].present;
    printf("flight recorder: %d of %d rank%s wrote a record in %s\n", n, j->world, j->world == 1 ? "" : "s", j->dir);
    uint64_t at = 0;
    if (first_mismatch(j, &at)) verdict_mismatch(j, at);
    else verdict_behind(j);
    for (int r = 0; r < j->world; r++) describe(j, r);
}

int ca_cmd_trace_analyze(const char *dir) {
    fr_job *j = calloc(1, sizeof *j);
    if (!j) return 1;
    j->dir = dir;
    int rc = load_dir(j);
    if (rc == 0) report(j);
    for (int r = 0; r < FR_MAX_RANKS; r++) free(j->r[r].c);
    free(j);
    return rc;
}
