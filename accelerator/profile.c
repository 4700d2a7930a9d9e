/* The profiler as the accelerator runs it: the configuration's profile keys (Accelerate's
 * ProfileKwargs) begin a trace at ca_accelerator_create, each optimizer step is a step of the
 * schedule, and ca_accelerator_destroy ends it (docs/PROFILING.md). */
#include "accelerator/accelerator_impl.h"
#include "base/trace_impl.h"

#include <caccel/profile.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cfg_int(const ca_accelerator *acc, const char *key) {
    int64_t v = 0;
    if (ca_config_get_int(acc->cfg, key, &v) != CA_OK) {
        ca_clear_error();
        v = 0;
    }
    return (int)v;
}

static bool cfg_bool(const ca_accelerator *acc, const char *key) {
    bool v = false;
    if (ca_config_get_bool(acc->cfg, key, &v) != CA_OK) {
        ca_clear_error();
        v = false;
    }
    return v;
}

ca_status ca_accelerator_profile_begin(ca_accelerator *acc) {
    if (!cfg_bool(acc, "profiling")) return CA_OK;
    if (ca_profile_running()) {   /* the program profiles itself: its begin and end stand */
        ca_log_printf(CA_LOG_WARNING, "profiling (from %s): a profile is already running; the accelerator leaves it as it is",
                      ca_config_origin(acc->cfg, "profiling"));
        return CA_OK;
    }
    ca_profile_config pc = {
        .activities = ca_config_get(acc->cfg, "profile_activities"),
        .wait = cfg_int(acc, "profile_wait"),
        .warmup = cfg_int(acc, "profile_warmup"),
        .active = cfg_int(acc, "profile_active"),
        .repeat = cfg_int(acc, "profile_repeat"),
        .record_shapes = cfg_bool(acc, "profile_record_shapes"),
        .profile_memory = cfg_bool(acc, "profile_memory"),
        .with_flops = cfg_bool(acc, "profile_with_flops"),
        .output_trace_dir = ca_config_get(acc->cfg, "output_trace_dir"),
        .rank = acc->rank < 0 ? 0 : acc->rank,
    };
    ca_status s = ca_profile_begin(&pc);
    if (s != CA_OK) return ca_error_context("profiling (from %s)", ca_config_origin(acc->cfg, "profiling"));
    acc->profiling = true;
    return CA_OK;
}

void ca_accelerator_profile_step(ca_accelerator *acc, const ca_optimizer *o) {
    /* one step per optimizer step of the first prepared optimizer, as prof.step() once per loop */
    if (acc->profiling && acc->nopts > 0 && acc->opts[0] == o && ca_profile_step() != CA_OK) ca_clear_error();
}

/* ------------------------------------------------------------------ the collectives' split */

/* What each rank sends of one collective: the key its peers find it by and its issue time. */
typedef struct wire_coll {
    char comm[96];
    uint64_t seq;
    int32_t rank, world;
    int64_t issue_ns;
} wire_coll;

#define BOOT_BYTES 64   /* each rank's part starts with its boot id */

typedef struct peer_coll {
    const wire_coll *w;
    int boot;            /* the rank (of the process group) whose boot id it carries */
} peer_coll;

static int peer_cmp(const void *a, const void *b) {
    const wire_coll *x = ((const peer_coll *)a)->w, *y = ((const peer_coll *)b)->w;
    int c = strcmp(x->comm, y->comm);
    if (c) return c;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Every rank's part, [BOOT_BYTES + max * sizeof(wire_coll)] bytes each, gathered over the process
 * group: two all-gathers (the counts, then the padded parts). */
static ca_status exchange(ca_accelerator *acc, const ca_trace_coll_key *k, size_t n, char **all, int64_t *max) {
    int world = ca_comm_size(acc->comm);
    int64_t mine = (int64_t)n, *counts = calloc((size_t)world, sizeof *counts);
    if (!counts) return ca_error(CA_ERR_NOMEM, "out of host memory");
    ca_status s = ca_comm_all_gather(acc->comm, &mine, counts, 1, CA_I64, NULL);
    *max = 0;
    for (int r = 0; s == CA_OK && r < world; r++) if (counts[r] > *max) *max = counts[r];
    free(counts);
    size_t part = BOOT_BYTES + (size_t)*max * sizeof(wire_coll);
    char *send = s == CA_OK ? calloc(1, part) : NULL;
    *all = send ? calloc((size_t)world, part) : NULL;
    if (s == CA_OK && !*all) s = ca_error(CA_ERR_NOMEM, "out of host memory for %d x %zu bytes", world, part);
    if (s == CA_OK) {
        ca_trace_boot_id(send, BOOT_BYTES);
        wire_coll *w = (wire_coll *)(send + BOOT_BYTES);
        for (size_t i = 0; i < n; i++) {
            w[i] = (wire_coll){.seq = k[i].seq, .rank = k[i].rank, .world = k[i].world, .issue_ns = k[i].issue_ns};
            memcpy(w[i].comm, k[i].comm, sizeof w[i].comm);
        }
        s = ca_comm_all_gather(acc->comm, send, *all, part, CA_U8, NULL);
    }
    free(send);
    return s;
}

/* Splits kept collective i at the last arrival of its group [a, b) of the sorted peers' records,
 * when every rank of its communicator is there and all of them read this rank's clock. */
static bool split_one(size_t i, const ca_trace_coll_key *k, const peer_coll *p, size_t np, const char *all,
                      size_t part, int me) {
    if (k->world == 1) {   /* its own communicator ("single" names many): it waited for no one */
        ca_trace_coll_split(i, 0, k->rank);
        return true;
    }
    wire_coll want = {.seq = k->seq, .rank = 0};
    memcpy(want.comm, k->comm, sizeof want.comm);
    peer_coll key = {.w = &want};
    size_t lo = 0, hi = np;   /* the first record of (comm, seq) */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (peer_cmp(&p[mid], &key) < 0) lo = mid + 1;
        else hi = mid;
    }
    const wire_coll *last = NULL;
    for (int r = 0; r < k->world; r++) {
        size_t at = lo + (size_t)r;
        if (at >= np || strcmp(p[at].w->comm, k->comm) || p[at].w->seq != k->seq || p[at].w->rank != r ||
            !all[(size_t)me * part] || strcmp(all + (size_t)p[at].boot * part, all + (size_t)me * part))
            return false;
        if (!last || p[at].w->issue_ns > last->issue_ns) last = p[at].w;
    }
    ca_trace_coll_split(i, last->issue_ns - k->issue_ns, last->rank);
    return true;
}

/* Each rank's own trace gets what `caccel trace merge` adds: every collective split into waiting for
 * the peers (to the issue of the last rank of its communicator) and moving data, where all its
 * ranks recorded it and read one clock (the same boot id). The ranks exchange their collectives'
 * (communicator, sequence number, issue time) over the process group at the profile's end;
 * recording stops first, so the exchange is not in the trace. */
static void split_collectives(ca_accelerator *acc) {
    ca_profile_stop();
    int64_t t0 = ca_trace_now_ns();
    size_t n = 0, np = 0, split = 0;
    ca_trace_coll_key *k = ca_trace_coll_keys(&n);
    int world = acc->comm ? ca_comm_size(acc->comm) : 1, me = acc->comm ? ca_comm_rank(acc->comm) : 0;
    char note[160], *all = NULL;
    int64_t max = 0;
    if (world > 1 && ca_device_kind_of(acc->device) == CA_DEVICE_GPU) {   /* its buffers are the device's */
        snprintf(note, sizeof note, "not split: the exchange of issue times over a %s process group is not yet "
                 "supported (caccel trace merge splits)", ca_device_name(acc->device));
        goto out;
    }
    ca_status s = world > 1 ? exchange(acc, k, n, &all, &max) : CA_OK;
    if (s != CA_OK) {
        snprintf(note, sizeof note, "not split: the exchange of issue times failed: %.100s", ca_last_error());
        ca_log_printf(CA_LOG_WARNING, "profiler: rank %d: %s", me, note);
        ca_clear_error();
        goto out;
    }
    size_t part = BOOT_BYTES + (size_t)max * sizeof(wire_coll);
    char self[BOOT_BYTES] = "";
    if (world == 1) ca_trace_boot_id(all = self, sizeof self);
    size_t cap = world > 1 ? (size_t)world * (size_t)max : n;
    peer_coll *p = calloc(cap ? cap : 1, sizeof *p);
    for (int r = 0; p && world > 1 && r < world; r++) {
        const char *base = all + (size_t)r * part;
        for (int64_t j = 0; j < max && ((const wire_coll *)(base + BOOT_BYTES))[j].world > 0; j++)
            p[np++] = (peer_coll){.w = (const wire_coll *)(base + BOOT_BYTES) + j, .boot = r};
    }
    wire_coll *solo = world == 1 && n ? calloc(n, sizeof *solo) : NULL;   /* one process: its own records */
    for (size_t i = 0; p && solo && i < n; i++) {
        solo[i] = (wire_coll){.seq = k[i].seq, .rank = k[i].rank, .world = k[i].world, .issue_ns = k[i].issue_ns};
        memcpy(solo[i].comm, k[i].comm, sizeof solo[i].comm);
        p[np++] = (peer_coll){.w = &solo[i], .boot = 0};
    }
    if (p) qsort(p, np, sizeof *p, peer_cmp);
    for (size_t i = 0; p && i < n; i++) split += split_one(i, &k[i], p, np, all, world > 1 ? part : 0, world > 1 ? me : 0);
    snprintf(note, sizeof note, "%s in %.2f ms: %zu of %zu collectives split%s", world > 1 ? "exchanged" : "one process",
             (double)(ca_trace_now_ns() - t0) / 1e6, split, n,
             split < n ? " (the others: a rank's record missing or the ranks on different machines' clocks)" : "");
    free(p);
    free(solo);
    if (all != self) free(all);
out:
    ca_trace_split_note(note);
    free(k);
}

void ca_accelerator_profile_end(ca_accelerator *acc) {
    if (!acc->profiling) return;
    split_collectives(acc);
    acc->profiling = false;
    if (ca_profile_end() != CA_OK) {
        ca_log_printf(CA_LOG_ERROR, "profiler: %s", ca_last_error());
        ca_clear_error();
    } else if (acc->rank <= 0) {
        ca_log_printf(CA_LOG_INFO, "profiler: trace written to %s", ca_profile_last_path());
    }
}
