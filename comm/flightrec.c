/* The flight recorder: each communicator's ring of its last collectives, and the dump of those and of
 * the process's last kernel calls when the communicator fails (read by `caccel trace analyze`).
 *
 * Why on only with a directory: the diagnosis of comm_diag.c already keeps what the peers need to
 * judge a hang (the last issued, oldest unfinished, waited-on and checked collective, and HIST
 * signatures); the ring adds times and outcomes for the post-mortem. Off (no directory), c->fr is NULL
 * and each hook is one branch; the kernel hook stays the one flag load it was (CA_TRACE_FR shares the
 * profiler's flag word). On, a collective writes one slot under the lock it already holds, a kernel
 * call one slot after an atomic add: no allocation, no new lock.
 *
 * Why the dump runs in the failure path and on the watchdog thread, never in a signal handler: a
 * rank's failure to its survivors (a collective timeout, a mismatch, a peer that died, left or
 * failed) ends in comm_fail on an ordinary thread, which can use stdio and rename. A launcher or a
 * scheduler that stops the job sends SIGTERM, often before the survivors' own failure surfaces (caccel
 * launch stops the others 0.3 s after a rank dies): with a directory configured, and SIGTERM's
 * disposition the default, the handler only notes the signal; the next watchdog tick (50 ms) writes
 * the dump and ends the process by SIGTERM as the default action would have. A process with no
 * watchdog running takes the default action at once. A rank that is killed, stopped or crashes
 * writes nothing; its absence is itself the analyzer's evidence. */
#include "comm/comm_diag_impl.h"
#include "base/text_impl.h"
#include "base/trace_impl.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FR_DEFAULT_ENTRIES 2000
#define FR_MAX_ENTRIES 100000   /* both rings of 100,000 write about 50 MB: within the reader's 64 MiB */

typedef struct fr_coll {
    bool used;
    uint64_t seq;
    ca_coll_sig sig;
    int64_t t_issue_ns, t_end_ns;   /* t_end_ns 0: not finished */
    ca_status status;
} fr_coll;

static pthread_once_t g_fr_once = PTHREAD_ONCE_INIT;
static char g_fr_dir[4096];
static int g_fr_entries;
static _Atomic int g_fr_dumped;       /* FR_* */
static _Atomic int g_fr_signal;       /* a SIGTERM noted by the handler, for the watchdog */
static _Atomic int g_fr_watchers;     /* watchdog threads of recording communicators */
enum { FR_NONE, FR_WRITING, FR_DONE };

static pid_t g_fr_pid;                /* the process that installed the handler (a forked child has no watchdog) */

/* Async-signal-safe: notes the signal, or (no watchdog to write the dump) takes the default action. */
static void fr_on_sigterm(int sig) {
    if (getpid() == g_fr_pid && atomic_load(&g_fr_watchers) > 0) {
        atomic_store(&g_fr_signal, sig);
        return;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Only over the default action: a program's own SIGTERM handler stays in charge. */
static void fr_install_sigterm(void) {
    struct sigaction old, sa;
    if (sigaction(SIGTERM, NULL, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) return;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fr_on_sigterm;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    g_fr_pid = getpid();
    sigaction(SIGTERM, &sa, NULL);
}

/* CACCEL_FLIGHT_RECORDER_DIR and CACCEL_FLIGHT_RECORDER_ENTRIES, read once per process. */
static void fr_read_env(void) {
    const char *d = getenv("CACCEL_FLIGHT_RECORDER_DIR");
    if (!d || !*d) return;
    if (strlen(d) >= sizeof g_fr_dir - 64) {
        CA_LOG_W("CACCEL_FLIGHT_RECORDER_DIR is longer than %zu bytes; the flight recorder is off", sizeof g_fr_dir - 64);
        return;
    }
    g_fr_entries = FR_DEFAULT_ENTRIES;
    const char *v = getenv("CACCEL_FLIGHT_RECORDER_ENTRIES");
    if (v && *v) {
        char *end, q[128];
        long n = strtol(v, &end, 10);
        if (*end || n < 1 || n > FR_MAX_ENTRIES)
            CA_LOG_W("CACCEL_FLIGHT_RECORDER_ENTRIES='%s' is not a number from 1 to %d; using %d",
                     ca_escape(v, q, sizeof q), FR_MAX_ENTRIES, FR_DEFAULT_ENTRIES);
        else g_fr_entries = (int)n;
    }
    snprintf(g_fr_dir, sizeof g_fr_dir, "%s", d);
    fr_install_sigterm();
}

void ca_comm_fr_init(ca_comm *c) {
    pthread_once(&g_fr_once, fr_read_env);
    if (!g_fr_dir[0]) return;
    c->fr = calloc((size_t)g_fr_entries, sizeof *c->fr);
    if (!c->fr || !ca_kernel_fr_enable(g_fr_entries)) {
        if (c->fr) CA_LOG_W("flight recorder: out of memory for %d kernel records; only collectives are kept",
                            g_fr_entries);
        else CA_LOG_W("flight recorder: out of memory for %d collective records; the recorder is off", g_fr_entries);
    }
    c->fr_n = c->fr ? (uint64_t)g_fr_entries : 0;
}

void ca_comm_fr_free(ca_comm *c) {
    free(c->fr);
    c->fr = NULL;
}

void ca_comm_fr_issue(ca_comm *c, const ca_work *w) {
    fr_coll *e = &c->fr[w->seq % c->fr_n];
    *e = (fr_coll){.used = true, .seq = w->seq, .sig = w->sig, .t_issue_ns = ca_trace_now_ns()};
}

void ca_comm_fr_end(ca_comm *c, const ca_work *w, ca_status s) {
    fr_coll *e = &c->fr[w->seq % c->fr_n];
    if (!e->used || e->seq != w->seq) return;   /* overwritten: more than fr_n issued since */
    e->t_end_ns = ca_trace_now_ns();
    e->status = s;
}

/* s as a JSON string's contents. */
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

static void write_coll(FILE *f, const fr_coll *e, bool first) {
    char sig[200];
    ca_coll_sig_format(&e->sig, sig, sizeof sig);
    const ca_coll_sig *x = &e->sig;
    const char *state = !e->t_end_ns ? "unfinished" : e->status == CA_OK ? "completed" : "failed";
    fprintf(f, "%s\n    {\"seq\":%llu,\"op\":\"%s\",\"sig\":", first ? "" : ",", (unsigned long long)e->seq,
            ca_coll_kind_name(x->kind));
    json_str(f, sig);
    fprintf(f, ",\"dtype\":\"%s\",\"count\":%llu,\"redop\":\"%s\",\"root\":%d,\"state\":\"%s\",\"t_issue_ns\":%lld,"
            "\"t_end_ns\":%lld}", x->dtype >= 0 ? ca_dtype_name((ca_dtype)x->dtype) : "none",
            (unsigned long long)x->count, x->redop >= 0 ? ca_reduce_op_name((ca_reduce_op)x->redop) : "none", x->root,
            state, (long long)e->t_issue_ns, (long long)e->t_end_ns);
}

/* The ring, oldest first: a copy taken under mu, so the file is written without the lock. */
static void write_colls(FILE *f, const fr_coll *ring, uint64_t n, uint64_t next) {
    fputc('[', f);
    bool first = true;
    for (uint64_t q = next > n ? next - n : 0; q < next; q++) {
        const fr_coll *e = &ring[q % n];
        if (!e->used || e->seq != q) continue;
        write_coll(f, e, first);
        first = false;
    }
    fputs(first ? "]" : "\n  ]", f);
}

static void write_dump(FILE *f, ca_comm *c, const fr_coll *ring, uint64_t next, const char *status, const char *msg) {
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    fprintf(f, "{\n  \"format\": \"caccel-flight-recorder\",\n  \"version\": 1,\n  \"rank\": %d,\n  \"world\": %d,\n"
            "  \"comm_rank\": %d,\n  \"comm\": ", ca_comm_grank(c, c->rank), c->world, c->rank);
    json_str(f, c->prefix[0] ? c->prefix : "single");
    fprintf(f, ",\n  \"backend\": ");
    json_str(f, c->backend);
    fprintf(f, ",\n  \"host\": ");
    json_str(f, host);
    fprintf(f, ",\n  \"pid\": %ld,\n  \"dump_ns\": %lld,\n  \"wall_ms\": %lld,\n  \"timeout_ms\": %lld,\n"
            "  \"issued\": %llu,\n  \"status\": \"%s\",\n  \"reason\": ", (long)getpid(), (long long)ca_trace_now_ns(),
            (long long)wall.tv_sec * 1000 + wall.tv_nsec / 1000000, (long long)c->timeout_ms, (unsigned long long)next,
            status);
    json_str(f, msg);
    fprintf(f, ",\n  \"collectives\": ");
    write_colls(f, ring, c->fr_n, next);
    fprintf(f, ",\n  \"kernels\": ");
    ca_kernel_fr_write(f);
    fprintf(f, "\n}\n");
}

/* DIR/rank_<r>.json through a temporary name, so a reader never sees half a file. */
static void write_file(ca_comm *c, const fr_coll *ring, uint64_t next, const char *status, const char *msg) {
    char path[4200], tmp[4300];
    int r = ca_comm_grank(c, c->rank);
    if (mkdir(g_fr_dir, 0777) != 0 && errno != EEXIST) {
        CA_LOG_W("flight recorder: cannot create the directory '%s': %s", g_fr_dir, strerror(errno));
        return;
    }
    snprintf(path, sizeof path, "%s/rank_%d.json", g_fr_dir, r);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        CA_LOG_W("flight recorder: cannot write '%s': %s", tmp, strerror(errno));
        return;
    }
    write_dump(f, c, ring, next, status, msg);
    bool ok = !ferror(f);
    if (fclose(f) != 0) ok = false;
    if (!ok || rename(tmp, path) != 0) {
        CA_LOG_W("flight recorder: cannot write '%s': %s", path, strerror(errno));
        remove(tmp);
        return;
    }
    CA_LOG_W("flight recorder: rank %d wrote its last %llu collectives and kernel calls to %s (read them all with "
             "`caccel trace analyze %s`)", r, (unsigned long long)(next < c->fr_n ? next : c->fr_n), path, g_fr_dir);
}

static void fr_dump_as(ca_comm *c, const char *status, const char *msg) {
    int none = FR_NONE;
    if (!c->fr || !atomic_compare_exchange_strong(&g_fr_dumped, &none, FR_WRITING))
        return;   /* the first failure of the process says most */
    fr_coll *ring = malloc(c->fr_n * sizeof *ring);
    if (!ring) CA_LOG_W("flight recorder: out of memory copying %llu records; nothing written", (unsigned long long)c->fr_n);
    if (ring) {
        pthread_mutex_lock(&c->mu);
        memcpy(ring, c->fr, c->fr_n * sizeof *ring);
        uint64_t next = c->next_seq;
        pthread_mutex_unlock(&c->mu);
        write_file(c, ring, next, status, msg);
        free(ring);
    }
    atomic_store(&g_fr_dumped, FR_DONE);
}

void ca_comm_fr_dump(ca_comm *c, ca_status s, const char *msg) {
    fr_dump_as(c, ca_status_name(s), msg);
}

void ca_comm_fr_watch(ca_comm *c, bool on) {
    if (!c->fr) return;
    if (on) {
        atomic_fetch_add(&g_fr_watchers, 1);
        return;
    }
    ca_comm_fr_tick(c);   /* a SIGTERM noted meanwhile: this watchdog still acts on it */
    /* the last watchdog leaves: a SIGTERM the handler noted just now has no one else to act on it */
    if (atomic_fetch_sub(&g_fr_watchers, 1) == 1 && atomic_load(&g_fr_signal)) {
        signal(SIGTERM, SIG_DFL);
        kill(getpid(), SIGTERM);
    }
}

void ca_comm_fr_tick(ca_comm *c) {
    int sig = atomic_load(&g_fr_signal);
    if (!c->fr || !sig) return;
    char msg[200];
    snprintf(msg, sizeof msg, "the process received SIGTERM (a launcher or a scheduler stopping the job) on rank %d",
             ca_comm_grank(c, c->rank));
    fr_dump_as(c, "SIGTERM", msg);
    /* another thread's dump (a failure at the same moment) finishes first, within a bound */
    for (int i = 0; i < 200 && atomic_load(&g_fr_dumped) == FR_WRITING; i++) usleep(10 * 1000);
    signal(sig, SIG_DFL);
    kill(getpid(), sig);
}
