/* The profiler's recorder: per-thread text buffers of Chrome trace events, the step schedule, the
 * trace file. A thread's first event registers its buffer on a global list (one mutex, once per
 * thread); later events append to it without a lock. ca_profile_end clears the flag, then waits
 * until no thread is inside a recording call (g_writers: each call counts itself in and looks at the
 * flag again, so a thread either sees the flag clear or is waited for) before it frees the buffers:
 * a dataloader or communication thread that records while the profile ends is safe. */
#include "base/base_impl.h"
#include "base/trace_impl.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

_Atomic int ca_trace_flags_;
_Atomic uint64_t ca_flops_counted_;
static int g_count_users;   /* under g.mu */

typedef struct tbuf {
    char *data;
    size_t len, cap;
    int tid;
    bool failed;             /* out of memory: events dropped */
    struct tbuf *next;
} tbuf;

static struct {
    pthread_mutex_t mu;
    bool running;
    _Atomic uint64_t gen;    /* counts begins: a thread's buffer of an ended profile is not reused */
    ca_profile_config cfg;
    char dir[4096], activities[64], last[4200];
    int flags;               /* CA_TRACE_* while recording */
    long step;
    tbuf *bufs;
    int ntids;
    int64_t t_begin_ns;
    bool stopped;            /* ca_profile_stop: nothing more is recorded */
    struct kept_coll *colls; /* ca_trace_collective's slices, under mu */
    size_t ncolls, capcolls;
    char split_note[160];
} g = { .mu = PTHREAD_MUTEX_INITIALIZER };

/* A collective's slice kept until the end, with the split the exchange gave it (wait_ns < 0: none). */
typedef struct kept_coll {
    ca_trace_coll_key key;
    int tid;
    char name[32], args[400];
    int64_t wait_ns;
    int last;
} kept_coll;

static _Atomic int g_writers;   /* recording calls in progress (ca_profile_end waits for 0) */
static _Thread_local tbuf *t_buf;
static _Thread_local uint64_t t_gen;   /* the profile t_buf belongs to (t_buf is freed with it) */

int64_t ca_trace_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static tbuf *my_buf(void) {
    tbuf *b = t_buf;
    pthread_mutex_lock(&g.mu);
    if (!g.running) b = NULL;
    else if (!b || t_gen != g.gen) {
        b = calloc(1, sizeof *b);
        if (b) {
            b->tid = ++g.ntids;
            b->next = g.bufs;
            g.bufs = b;
        }
        t_buf = b;
        t_gen = g.gen;
    }
    pthread_mutex_unlock(&g.mu);
    return b;
}

/* The calling thread's buffer: the lock is taken only when the thread has none for this profile. */
static tbuf *cur_buf(void) {
    tbuf *b = t_buf;
    if (b && t_gen == atomic_load_explicit(&g.gen, memory_order_relaxed)) return b;
    return my_buf();
}

static void buf_printf(tbuf *b, const char *fmt, ...) {
    for (int tries = 0; tries < 2 && !b->failed; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->data ? b->data + b->len : NULL, b->data ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) { b->failed = true; return; }
        if (b->data && b->len + (size_t)n < b->cap) { b->len += (size_t)n; return; }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) { b->failed = true; return; }
        b->data = d;
        b->cap = cap;
    }
}

/* name as a JSON string's inside: quotes, backslashes and control characters escaped. */
static void esc(const char *s, char *out, size_t n) {
    size_t o = 0;
    for (; s && *s && o + 7 < n; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { out[o++] = '\\'; out[o++] = (char)c; }
        else if (c < 0x20) o += (size_t)snprintf(out + o, n - o, "\\u%04x", c);
        else out[o++] = (char)c;
    }
    out[o] = '\0';
}

static int trace_pid(void) { return g.cfg.rank < 0 ? 0 : g.cfg.rank; }

/* Counts the caller in as a writer; false (and counted out) when recording stopped meanwhile. */
static bool writer_in(void) {
    atomic_fetch_add(&g_writers, 1);
    if (atomic_load(&ca_trace_flags_) & CA_TRACE_ON) return true;
    atomic_fetch_sub(&g_writers, 1);
    return false;
}

static void writer_out(void) { atomic_fetch_sub(&g_writers, 1); }

static void slice_at(const char *cat, const char *name, int64_t t0, int64_t t1, const char *args) {
    tbuf *b = cur_buf();
    if (!b) return;
    char en[256];
    esc(name, en, sizeof en);
    buf_printf(b, ",\n{\"ph\":\"X\",\"cat\":\"%s\",\"name\":\"%s\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d,"
               "\"args\":{%s}}", cat, en, (double)(t0 - g.t_begin_ns) / 1e3, (double)(t1 - t0) / 1e3,
               trace_pid(), b->tid, args ? args : "");
}

void ca_trace_slice_at(const char *cat, const char *name, int64_t t0, int64_t t1, const char *args) {
    if (!ca_trace_on() || !writer_in()) return;
    slice_at(cat, name, t0, t1, args);
    writer_out();
}

void ca_trace_slice(const char *cat, const char *name, int64_t t0, const char *args) {
    ca_trace_slice_at(cat, name, t0, ca_trace_now_ns(), args);
}

void ca_trace_collective(const char *name, int64_t t0, int64_t t1, const char *args, const char *comm, uint64_t seq,
                         int rank, int world) {
    if (!ca_trace_on() || !writer_in()) return;
    tbuf *b = cur_buf();
    pthread_mutex_lock(&g.mu);
    if (b && g.ncolls == g.capcolls) {
        size_t cap = g.capcolls ? 2 * g.capcolls : 256;
        kept_coll *m = realloc(g.colls, cap * sizeof *m);
        if (m) g.colls = m, g.capcolls = cap;
        else b->failed = true;   /* reported as dropped events */
    }
    if (b && g.ncolls < g.capcolls) {
        kept_coll *k = &g.colls[g.ncolls++];
        *k = (kept_coll){.key = {.seq = seq, .rank = rank, .world = world, .issue_ns = t0, .dur_ns = t1 - t0},
                         .tid = b->tid, .wait_ns = -1};
        snprintf(k->key.comm, sizeof k->key.comm, "%s", comm);
        snprintf(k->name, sizeof k->name, "%s", name);
        snprintf(k->args, sizeof k->args, "%s", args ? args : "");
    }
    pthread_mutex_unlock(&g.mu);
    writer_out();
}

ca_trace_coll_key *ca_trace_coll_keys(size_t *n) {
    pthread_mutex_lock(&g.mu);
    ca_trace_coll_key *k = g.ncolls ? malloc(g.ncolls * sizeof *k) : NULL;
    for (size_t i = 0; k && i < g.ncolls; i++) k[i] = g.colls[i].key;
    *n = k ? g.ncolls : 0;
    pthread_mutex_unlock(&g.mu);
    return k;
}

void ca_trace_coll_split(size_t i, int64_t wait_ns, int last_rank) {
    pthread_mutex_lock(&g.mu);
    if (i < g.ncolls) {
        int64_t d = g.colls[i].key.dur_ns;
        g.colls[i].wait_ns = wait_ns < 0 ? 0 : wait_ns > d ? d : wait_ns;
        g.colls[i].last = last_rank;
    }
    pthread_mutex_unlock(&g.mu);
}

void ca_trace_split_note(const char *note) {
    pthread_mutex_lock(&g.mu);
    snprintf(g.split_note, sizeof g.split_note, "%s", note ? note : "");
    pthread_mutex_unlock(&g.mu);
}

void ca_trace_counter(const char *name, const char *args) {
    if (!ca_trace_on() || !writer_in()) return;
    tbuf *b = cur_buf();
    if (b)
        buf_printf(b, ",\n{\"ph\":\"C\",\"name\":\"%s\",\"ts\":%.3f,\"pid\":%d,\"tid\":%d,\"args\":{%s}}", name,
                   (double)(ca_trace_now_ns() - g.t_begin_ns) / 1e3, trace_pid(), b->tid, args ? args : "");
    writer_out();
}

int64_t ca_profile_range_begin(void) { return ca_trace_on() ? ca_trace_now_ns() : 0; }

void ca_profile_range_end(const char *name, int64_t begin) {
    if (begin && ca_trace_on()) ca_trace_slice("user", name, begin, NULL);
}

/* torch.profiler.schedule: whether step s (from 0) is in an active phase. */
static bool step_records(const ca_profile_config *c, long s) {
    long cycle = (long)c->wait + c->warmup + c->active;
    if (cycle == 0) return true;
    if (c->repeat > 0 && s >= cycle * c->repeat) return false;
    return s % cycle >= (long)c->wait + c->warmup;
}

/* Sets the profiler's bits to f, keeping the meter's COUNT bit and the flight recorder's FR bit. */
static void store_trace_bits(int f) {
    int old = atomic_load(&ca_trace_flags_);
    while (!atomic_compare_exchange_weak(&ca_trace_flags_, &old, (old & (CA_TRACE_COUNT | CA_TRACE_FR)) | f)) {}
}

static void set_flags(void) {
    store_trace_bits(g.running && !g.stopped && step_records(&g.cfg, g.step) ? g.flags : 0);
}

void ca_flop_count_enable(bool on) {
    pthread_mutex_lock(&g.mu);
    g_count_users += on ? 1 : (g_count_users > 0 ? -1 : 0);
    if (g_count_users > 0) atomic_fetch_or(&ca_trace_flags_, CA_TRACE_COUNT);
    else atomic_fetch_and(&ca_trace_flags_, ~CA_TRACE_COUNT);
    pthread_mutex_unlock(&g.mu);
}

/* Creates dir (one level) and writes a probe file in it, so an unwritable directory fails at begin. */
static ca_status check_dir(const char *dir) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return ca_error(CA_ERR_IO, "profiler: output_trace_dir '%s' cannot be created: %s", dir, strerror(errno));
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.caccel_trace_probe.%ld", dir, (long)getpid());
    FILE *f = fopen(probe, "w");
    if (!f)
        return ca_error(CA_ERR_IO, "profiler: output_trace_dir '%s' is not writable: %s", dir, strerror(errno));
    fclose(f);
    remove(probe);
    return CA_OK;
}

static ca_status check_config(const ca_profile_config *c) {
    if (c->wait < 0 || c->warmup < 0 || c->active < 0 || c->repeat < 0)
        return ca_error(CA_ERR_INVALID, "profiler: schedule wait=%d warmup=%d active=%d repeat=%d: counts must be >= 0",
                        c->wait, c->warmup, c->active, c->repeat);
    if ((c->wait || c->warmup || c->repeat) && !c->active)
        return ca_error(CA_ERR_INVALID, "profiler: a schedule (wait=%d warmup=%d repeat=%d) needs active >= 1",
                        c->wait, c->warmup, c->repeat);
    /* ProfileKwargs' activity names, not backends: they are only kept in the trace's metadata */
    static const char *const known[] = {"cpu", "cuda", "cpu,cuda", "cuda,cpu"};
    bool ok = !c->activities;
    for (size_t i = 0; !ok && i < CA_ARRAY_LEN(known); i++) ok = strcmp(c->activities, known[i]) == 0;
    if (!ok)
        return ca_error(CA_ERR_INVALID, "profiler: activities '%s': expected cpu, cuda or cpu,cuda", c->activities);
    if (c->output_trace_dir && strlen(c->output_trace_dir) >= sizeof g.dir)
        return ca_error(CA_ERR_INVALID, "profiler: output_trace_dir is longer than %zu bytes", sizeof g.dir - 1);
    return CA_OK;
}

ca_status ca_profile_begin(const ca_profile_config *cfg) {
    ca_profile_config zero = {.rank = -1};
    const ca_profile_config *c = cfg ? cfg : &zero;
    if (g.running) return ca_error(CA_ERR_STATE, "profiler: ca_profile_begin while a profile is running (end it first)");
    ca_status s = check_config(c);
    const char *dir = c->output_trace_dir && *c->output_trace_dir ? c->output_trace_dir : ".";
    if (s == CA_OK) s = check_dir(dir);
    if (s != CA_OK) return s;
    pthread_mutex_lock(&g.mu);
    g.cfg = *c;
    snprintf(g.dir, sizeof g.dir, "%s", dir);
    snprintf(g.activities, sizeof g.activities, "%s", c->activities ? c->activities : "cpu,cuda");
    g.cfg.output_trace_dir = g.dir;
    g.cfg.activities = g.activities;
    g.flags = CA_TRACE_ON | (c->record_shapes ? CA_TRACE_SHAPES : 0) | (c->profile_memory ? CA_TRACE_MEMORY : 0) |
              (c->with_flops ? CA_TRACE_FLOPS : 0);
    g.step = 0;
    g.ntids = 0;
    g.gen++;
    g.t_begin_ns = ca_trace_now_ns();
    g.stopped = false;
    g.ncolls = 0;
    g.split_note[0] = '\0';
    g.running = true;
    set_flags();
    pthread_mutex_unlock(&g.mu);
    return CA_OK;
}

ca_status ca_profile_step(void) {
    if (!g.running) return CA_OK;
    int64_t now = ca_trace_now_ns();
    bool was = ca_trace_on();
    g.step++;
    if (was) {   /* a marker on the timeline where each recorded step ends */
        char a[64];
        snprintf(a, sizeof a, "\"step\":%ld", g.step - 1);
        ca_trace_slice_at("step", "ProfilerStep", now, now, a);
    }
    set_flags();
    return CA_OK;
}

bool ca_profile_running(void) { return g.running; }
bool ca_profile_recording(void) { return ca_trace_on(); }
const char *ca_profile_last_path(void) { return g.last; }

/* The kernel's boot id: ranks whose traces carry the same one read one CLOCK_MONOTONIC, so `caccel
 * trace merge` may compare their times (a collective's last arrival); "" where it cannot be read. */
void ca_trace_boot_id(char *out, size_t n) {
    out[0] = '\0';
    const char *test = getenv("CACCEL_TEST_BOOT_ID");   /* test hook: a rank that stands for another machine */
    FILE *f = test && *test ? NULL : fopen("/proc/sys/kernel/random/boot_id", "r");
    if (test && *test) snprintf(out, n, "%s", test);
    else if (!f) return;
    else if (!fgets(out, (int)n, f)) out[0] = '\0';
    if (f) fclose(f);
    for (char *p = out; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') || *p == '-')) { *p = '\0'; break; }
}

/* The kept collectives' slices, each with its split when the exchange gave one. */
static void write_colls(FILE *f, int pid) {
    for (size_t i = 0; i < g.ncolls; i++) {
        const kept_coll *k = &g.colls[i];
        char split[160] = "";
        if (k->wait_ns >= 0)
            snprintf(split, sizeof split, ",\"peers_wait_us\":%.3f,\"transfer_us\":%.3f,\"last_arrival\":%d",
                     (double)k->wait_ns / 1e3, (double)(k->key.dur_ns - k->wait_ns) / 1e3, k->last);
        fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"collective\",\"name\":\"%s\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,"
                   "\"tid\":%d,\"args\":{%s%s}}", k->name, (double)(k->key.issue_ns - g.t_begin_ns) / 1e3,
                (double)k->key.dur_ns / 1e3, pid, k->tid, k->args, split);
    }
}

/* Writes the header (metadata events), every thread's events, and the closing bracket. */
static bool write_events(FILE *f) {
    int pid = trace_pid();
    char boot[64];
    ca_trace_boot_id(boot, sizeof boot);
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"caccel\",\"rank\":%d,\"activities\":\"%s\","
               "\"steps\":%ld,\"clock\":\"CLOCK_MONOTONIC\",\"clock_origin_ns\":%lld,\"boot_id\":\"%s\","
               "\"collective_split\":\"%s\"},\n\"traceEvents\":[\n"
               "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,\"ts\":0,\"args\":{\"name\":\"rank %d\"}},\n"
               "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"tid\":0,\"ts\":0,\"args\":{\"sort_index\":%d}}",
            pid, g.activities, g.step, (long long)g.t_begin_ns, boot,
            g.split_note[0] ? g.split_note : "not split: no exchange between the ranks (the program ended the profile)",
            pid, pid, pid, pid);
    bool dropped = false;
    for (tbuf *b = g.bufs; b; b = b->next) {
        fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"ts\":0,\"args\":{\"name\":\"thread %d\"}}",
                pid, b->tid, b->tid);
        if (b->len) fwrite(b->data, 1, b->len, f);
        dropped |= b->failed;
    }
    write_colls(f, pid);
    fprintf(f, "\n]}\n");
    if (dropped) ca_log_printf(CA_LOG_WARNING, "profiler: out of memory while recording; some events were dropped");
    return fflush(f) == 0 && !ferror(f);
}

static void free_bufs(void) {
    for (tbuf *b = g.bufs, *n; b; b = n) {
        n = b->next;
        free(b->data);
        free(b);
    }
    g.bufs = NULL;
    free(g.colls);
    g.colls = NULL;
    g.ncolls = g.capcolls = 0;
}

void ca_profile_stop(void) {
    pthread_mutex_lock(&g.mu);
    g.stopped = true;
    store_trace_bits(0);
    pthread_mutex_unlock(&g.mu);
    while (atomic_load(&g_writers) > 0) sched_yield();   /* a recording call still writing */
}

ca_status ca_profile_end(void) {
    if (!g.running) return ca_error(CA_ERR_STATE, "profiler: ca_profile_end without ca_profile_begin");
    ca_profile_stop();
    pthread_mutex_lock(&g.mu);
    g.running = false;
    pthread_mutex_unlock(&g.mu);
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/trace_rank%d.json", g.dir, trace_pid());
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    ca_status s = CA_OK;
    if (!f) s = ca_error(CA_ERR_IO, "profiler: cannot write the trace '%s': %s", tmp, strerror(errno));
    else {
        bool ok = write_events(f);
        if (fclose(f) != 0) ok = false;
        if (!ok || rename(tmp, path) != 0) {
            s = ca_error(CA_ERR_IO, "profiler: cannot write the trace '%s': %s", path, strerror(errno));
            remove(tmp);
        } else snprintf(g.last, sizeof g.last, "%s", path);
    }
    pthread_mutex_lock(&g.mu);
    free_bufs();
    pthread_mutex_unlock(&g.mu);
    return s;
}
