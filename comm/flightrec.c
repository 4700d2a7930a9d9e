/* The flight recorder: each communicator's ring of its last collectives, and the dump of those and of
 * the process's last kernel calls when the communicator fails, on a signal or on demand (read by
 * `caccel trace analyze`).
 *
 * Why on only with a directory: the diagnosis of comm_diag.c already keeps what the peers need to
 * judge a hang (the last issued, oldest unfinished, waited-on and checked collective, and HIST
 * signatures); the ring adds times and outcomes for the post-mortem. Off (no directory), c->fr is NULL
 * and each hook is one branch; the kernel hook stays the one flag load it was (CA_TRACE_FR shares the
 * profiler's flag word). On, a collective writes one slot (and its signature's text) under the lock it
 * already holds, a kernel call one slot after an atomic add: no allocation, no new lock.
 *
 * Why one writer that is async-signal-safe (base/sigout_impl.h: digits and quoted strings into a
 * stack buffer, write(2), open/link/rename): a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
 * SIGABRT) cannot hand the dump to another thread and wait (the thread holding malloc's or the
 * ring's lock may be the one that crashed), and SIGUSR1 asks for a dump at any moment, the watchdog
 * perhaps not running. So the handler writes the dump itself from the rings as they stand, without
 * their locks: a record being written at that instant may be skipped (its number does not match) or
 * show the slot's previous text, bounded. The failure path uses the same writer over a copy taken
 * under the lock. Every text the dump holds is prepared outside the handler: the signatures at
 * issue, the host name at start.
 *
 * Which signals: SIGUSR1 writes and the process goes on (a handler the program had is called after);
 * a fatal signal writes, puts back the action it replaced (the default's core dump, or the program's
 * or a sanitizer's handler) and raises the signal again. SIGTERM from a launcher or a scheduler that
 * stops the job (caccel launch stops the others 0.3 s after a rank dies), with its disposition the
 * default, is only noted: the next watchdog tick (50 ms) writes the dump and ends the process by
 * SIGTERM as the default action would have; a process with no watchdog takes the default action at
 * once. A rank that is killed (SIGKILL) or stopped writes nothing: its absence is itself the
 * analyzer's evidence.
 *
 * Every dump is kept: DIR/rank_<r>.json is always the newest (renamed into place whole), and the
 * one it replaces stays as DIR/rank_<r>.<n>.json, n its number in the process (1: the first). */
#include "comm/comm_diag_impl.h"
#include "base/sigout_impl.h"
#include "base/text_impl.h"
#include "base/trace_impl.h"

#include <errno.h>
#include <fcntl.h>
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
#define FR_SIG_TEXT 120

typedef struct fr_coll {
    bool used;
    uint64_t seq;
    ca_coll_sig sig;
    int64_t t_issue_ns, t_end_ns;   /* t_end_ns 0: not finished */
    ca_status status;
    char sig_text[FR_SIG_TEXT];     /* ca_coll_sig_format's, made at issue: the signal handler cannot */
} fr_coll;

static pthread_once_t g_fr_once = PTHREAD_ONCE_INIT;
static char g_fr_dir[4096];
static char g_fr_host[256];
static int g_fr_entries;
static _Atomic unsigned g_fr_dumps;    /* dumps begun in this process: numbers the files kept */
static _Atomic int g_fr_writing;       /* dumps under way, for the SIGTERM tick to let them finish */
static _Atomic int g_fr_signal;        /* a SIGTERM noted by the handler, for the watchdog */
static _Atomic int g_fr_watchers;      /* watchdog threads of recording communicators */
static ca_comm *_Atomic g_fr_comm;     /* the first recording communicator (the world's): a signal dumps it */
static pid_t g_fr_pid;                 /* the process that installed the handlers (a forked child has no watchdog) */

static const int g_fr_fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
static struct sigaction g_fr_old[NSIG]; /* the actions replaced, put back or called */

static void dump_now(ca_comm *c, const fr_coll *ring, uint64_t next, const char *status, const char *msg, bool in_signal);

/* ---------------------------------------------------------------- text without stdio */

/* buf += s, cut to len (the handler's snprintf). */
static void cat(char *buf, size_t len, const char *s) {
    size_t n = strlen(buf);
    while (*s && n + 1 < len) buf[n++] = *s++;
    buf[n] = '\0';
}

static void cat_u(char *buf, size_t len, uint64_t v) {
    char b[21];
    cat(buf, len, ca_sigout_fmt_u64(v, b));
}

/* A warning line like CA_LOG_W's; in a signal handler written to stderr by write(2). */
static void fr_note(bool in_signal, const char *text) {
    if (!in_signal) {
        CA_LOG_W("%s", text);
        return;
    }
    ca_sigout o = {.fd = STDERR_FILENO};
    int rank = ca_log_get_rank();
    if (rank >= 0) {
        ca_sigout_str(&o, "[caccel rank ");
        ca_sigout_u64(&o, (uint64_t)rank);
        ca_sigout_str(&o, "] warning: ");
    } else ca_sigout_str(&o, "caccel: warning: ");
    ca_sigout_str(&o, text);
    ca_sigout_str(&o, "\n");
    ca_sigout_flush(&o);
}

/* "flight recorder: cannot write 'PATH': No space left on device" (errno's number in a handler). */
static void fr_cannot(bool in_signal, const char *what, const char *path, int err) {
    char t[4600] = "flight recorder: cannot ";
    cat(t, sizeof t, what);
    cat(t, sizeof t, " '");
    cat(t, sizeof t, path);
    cat(t, sizeof t, "': ");
    if (in_signal) {
        cat(t, sizeof t, "errno ");
        cat_u(t, sizeof t, (uint64_t)err);
    } else cat(t, sizeof t, strerror(err));
    fr_note(in_signal, t);
}

/* ---------------------------------------------------------------- the dump */

static void write_coll(ca_sigout *o, const fr_coll *e, bool first) {
    const ca_coll_sig *x = &e->sig;
    ca_sigout_str(o, first ? "\n    {\"seq\":" : ",\n    {\"seq\":");
    ca_sigout_u64(o, e->seq);
    ca_sigout_str(o, ",\"op\":\"");
    ca_sigout_str(o, ca_coll_kind_name(x->kind));
    ca_sigout_str(o, "\",\"sig\":");
    ca_sigout_json(o, e->sig_text, sizeof e->sig_text - 1);
    ca_sigout_str(o, ",\"dtype\":\"");
    ca_sigout_str(o, x->dtype >= 0 ? ca_dtype_name((ca_dtype)x->dtype) : "none");
    ca_sigout_str(o, "\",\"count\":");
    ca_sigout_u64(o, x->count);
    ca_sigout_str(o, ",\"redop\":\"");
    ca_sigout_str(o, x->redop >= 0 ? ca_reduce_op_name((ca_reduce_op)x->redop) : "none");
    ca_sigout_str(o, "\",\"root\":");
    ca_sigout_i64(o, x->root);
    ca_sigout_str(o, ",\"state\":\"");
    ca_sigout_str(o, !e->t_end_ns ? "unfinished" : e->status == CA_OK ? "completed" : "failed");
    ca_sigout_str(o, "\",\"t_issue_ns\":");
    ca_sigout_i64(o, e->t_issue_ns);
    ca_sigout_str(o, ",\"t_end_ns\":");
    ca_sigout_i64(o, e->t_end_ns);
    ca_sigout_str(o, "}");
}

/* The ring, oldest first. */
static void write_colls(ca_sigout *o, const fr_coll *ring, uint64_t n, uint64_t next) {
    ca_sigout_str(o, "[");
    bool first = true;
    for (uint64_t q = next > n ? next - n : 0; q < next; q++) {
        const fr_coll *e = &ring[q % n];
        if (!e->used || e->seq != q) continue;
        write_coll(o, e, first);
        first = false;
    }
    ca_sigout_str(o, first ? "]" : "\n  ]");
}

static void write_field(ca_sigout *o, const char *key, int64_t v) {
    ca_sigout_str(o, ",\n  \"");
    ca_sigout_str(o, key);
    ca_sigout_str(o, "\": ");
    ca_sigout_i64(o, v);
}

static void write_text(ca_sigout *o, const char *key, const char *s) {
    ca_sigout_str(o, ",\n  \"");
    ca_sigout_str(o, key);
    ca_sigout_str(o, "\": ");
    ca_sigout_json(o, s, 4096);
}

static void write_dump(ca_sigout *o, ca_comm *c, const fr_coll *ring, uint64_t next, unsigned k, const char *status,
                       const char *msg) {
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    ca_sigout_str(o, "{\n  \"format\": \"caccel-flight-recorder\",\n  \"version\": 1,\n  \"rank\": ");
    ca_sigout_i64(o, ca_comm_grank(c, c->rank));
    write_field(o, "world", c->world);
    write_field(o, "comm_rank", c->rank);
    write_text(o, "comm", c->prefix[0] ? c->prefix : "single");
    write_text(o, "backend", c->backend);
    write_text(o, "host", g_fr_host);
    write_field(o, "pid", (int64_t)getpid());
    write_field(o, "dump", (int64_t)k);
    write_field(o, "dump_ns", ca_trace_now_ns());
    write_field(o, "wall_ms", (int64_t)wall.tv_sec * 1000 + wall.tv_nsec / 1000000);
    write_field(o, "timeout_ms", c->timeout_ms);
    write_field(o, "issued", (int64_t)next);
    write_text(o, "status", status);
    write_text(o, "reason", msg);
    ca_sigout_str(o, ",\n  \"collectives\": ");
    write_colls(o, ring, c->fr_n, next);
    ca_sigout_str(o, ",\n  \"kernels\": ");
    ca_kernel_fr_write(o);
    ca_sigout_str(o, "\n}\n");
}

/* The newest dump moves in whole (rename); the one it replaces stays as rank_<r>.<k-1>.json: a hard
 * link, so that rank_<r>.json never goes missing meanwhile (a rename where links are not had). */
static void keep_previous(const char *path, unsigned k, bool in_signal) {
    char kept[4300] = "";
    cat(kept, sizeof kept, path);
    kept[strlen(kept) - 4] = '\0';   /* "json" */
    cat_u(kept, sizeof kept, k - 1);
    cat(kept, sizeof kept, ".json");
    unlink(kept);                    /* an earlier run's, in the same directory */
    if (link(path, kept) != 0 && errno != ENOENT && rename(path, kept) != 0 && errno != ENOENT)
        fr_cannot(in_signal, "keep the previous dump as", kept, errno);
}

/* "flight recorder: rank 0 wrote its last 6 collectives and kernel calls to DIR/rank_0.json (...)" */
static void note_written(ca_comm *c, int r, uint64_t next, const char *path, bool in_signal) {
    char t[9000] = "flight recorder: rank ";
    cat_u(t, sizeof t, (uint64_t)r);
    cat(t, sizeof t, " wrote its last ");
    cat_u(t, sizeof t, next < c->fr_n ? next : c->fr_n);
    cat(t, sizeof t, " collectives and kernel calls to ");
    cat(t, sizeof t, path);
    cat(t, sizeof t, " (read them all with `caccel trace analyze ");
    cat(t, sizeof t, g_fr_dir);
    cat(t, sizeof t, "`)");
    fr_note(in_signal, t);
}

/* DIR/rank_<r>.json through a temporary name, so a reader never sees half a file. Async-signal-safe. */
static void write_file(ca_comm *c, const fr_coll *ring, uint64_t next, const char *status, const char *msg,
                       bool in_signal) {
    char path[4200] = "", tmp[4300] = "";
    int r = ca_comm_grank(c, c->rank);
    unsigned k = atomic_fetch_add(&g_fr_dumps, 1) + 1;
    if (mkdir(g_fr_dir, 0777) != 0 && errno != EEXIST) {
        fr_cannot(in_signal, "create the directory", g_fr_dir, errno);
        return;
    }
    cat(path, sizeof path, g_fr_dir);
    cat(path, sizeof path, "/rank_");
    cat_u(path, sizeof path, (uint64_t)r);
    cat(path, sizeof path, ".json");
    cat(tmp, sizeof tmp, path);
    cat(tmp, sizeof tmp, ".tmp.");
    cat_u(tmp, sizeof tmp, (uint64_t)getpid());
    cat(tmp, sizeof tmp, ".");
    cat_u(tmp, sizeof tmp, k);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        fr_cannot(in_signal, "write", tmp, errno);
        return;
    }
    ca_sigout o = {.fd = fd};
    write_dump(&o, c, ring, next, k, status, msg);
    ca_sigout_flush(&o);
    int err = o.failed ? errno : 0;
    if (close(fd) != 0 && !err) err = errno;
    if (k > 1 && !err) keep_previous(path, k, in_signal);
    if (err || rename(tmp, path) != 0) {
        fr_cannot(in_signal, "write", path, err ? err : errno);
        unlink(tmp);
        return;
    }
    note_written(c, r, next, path, in_signal);
}

static void dump_now(ca_comm *c, const fr_coll *ring, uint64_t next, const char *status, const char *msg, bool in_signal) {
    atomic_fetch_add(&g_fr_writing, 1);
    write_file(c, ring, next, status, msg, in_signal);
    atomic_fetch_sub(&g_fr_writing, 1);
}

/* A failure: the ring copied under mu, so the file is written without the lock. */
static void fr_dump_as(ca_comm *c, const char *status, const char *msg) {
    if (!c->fr) return;
    fr_coll *ring = malloc(c->fr_n * sizeof *ring);
    if (!ring) {
        CA_LOG_W("flight recorder: out of memory copying %llu records; nothing written", (unsigned long long)c->fr_n);
        return;
    }
    pthread_mutex_lock(&c->mu);
    memcpy(ring, c->fr, c->fr_n * sizeof *ring);
    uint64_t next = c->next_seq;
    pthread_mutex_unlock(&c->mu);
    dump_now(c, ring, next, status, msg, false);
    free(ring);
}

void ca_comm_fr_dump(ca_comm *c, ca_status s, const char *msg) {
    fr_dump_as(c, ca_status_name(s), msg);
}

/* ---------------------------------------------------------------- signals */

static const char *sig_name(int sig) {
    switch (sig) {
    case SIGUSR1: return "SIGUSR1";
    case SIGTERM: return "SIGTERM";
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    default: return "a signal";
    }
}

/* A signal's dump: its status the signal's name, or the communicator's failure when it failed
 * before (that says most: the signal is then mostly its consequence, a launcher's SIGTERM or an
 * abort on the error), its reason saying both. Async-signal-safe. */
static const char *signal_reason(ca_comm *c, int sig, char *msg, size_t len) {
    msg[0] = '\0';
    bool failed = atomic_load(&c->failed) == 1;
    if (failed) {
        cat(msg, len, c->fail_msg);
        cat(msg, len, "; then ");
    }
    cat(msg, len, "the process received ");
    cat(msg, len, sig_name(sig));
    cat(msg, len, sig == SIGUSR1   ? " (a dump on demand; the process goes on)"
                  : sig == SIGTERM ? " (a launcher or a scheduler stopping the job)"
                                   : " (a fatal signal; its action follows)");
    cat(msg, len, " on rank ");
    cat_u(msg, len, (uint64_t)ca_comm_grank(c, c->rank));
    return failed ? ca_status_name(c->fail_status) : sig_name(sig);
}

/* In the handler: the rings as they stand, without their locks (see the top). */
static void signal_dump(int sig) {
    ca_comm *c = atomic_load(&g_fr_comm);
    if (!c || !c->fr || getpid() != g_fr_pid) return;
    char msg[1200];
    const char *status = signal_reason(c, sig, msg, sizeof msg);
    dump_now(c, c->fr, __atomic_load_n(&c->next_seq, __ATOMIC_ACQUIRE), status, msg, true);
}

/* SIGUSR1: the dump, then the handler the program had, if any; the process goes on. A forked child
 * (it inherits the handler, not the recorder) takes the action it would have had. */
static void fr_on_usr1(int sig, siginfo_t *info, void *ctx) {
    const struct sigaction *old = &g_fr_old[sig];
    if (getpid() != g_fr_pid && !(old->sa_flags & SA_SIGINFO) && old->sa_handler == SIG_DFL) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    int saved = errno;
    signal_dump(sig);
    errno = saved;
    if (old->sa_flags & SA_SIGINFO) old->sa_sigaction(sig, info, ctx);
    else if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) old->sa_handler(sig);
}

/* A fatal signal: the old action back first (a second fault inside the dump takes it, not this
 * handler again), the dump, and the signal again: blocked while this handler runs, it is delivered
 * on return with the old action (a fault's instruction would fault again anyway). */
static void fr_on_fatal(int sig, siginfo_t *info, void *ctx) {
    (void)info;
    (void)ctx;
    sigaction(sig, &g_fr_old[sig], NULL);
    signal_dump(sig);
    raise(sig);
}

/* Async-signal-safe: notes the signal, or (no watchdog to write the dump) takes the default action. */
static void fr_on_sigterm(int sig) {
    if (getpid() == g_fr_pid && atomic_load(&g_fr_watchers) > 0) {
        atomic_store(&g_fr_signal, sig);
        return;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

/* SIGTERM only over the default action: a program's own SIGTERM handler stays in charge. */
static void fr_install_sigterm(void) {
    struct sigaction old, sa;
    if (sigaction(SIGTERM, NULL, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) return;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fr_on_sigterm;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
}

/* In front of the action sig had, which is kept to be called or put back; an ignored signal stays
 * ignored. On the thread's alternate stack where it has one (fr_alt_stack's, or the program's). */
static void fr_install(int sig, void (*fn)(int, siginfo_t *, void *)) {
    struct sigaction sa, *old = &g_fr_old[sig];
    if (sigaction(sig, NULL, old) != 0 || (!(old->sa_flags & SA_SIGINFO) && old->sa_handler == SIG_IGN)) return;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = fn;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;   /* where the thread has one (fr_alt_stack) */
    sigaction(sig, &sa, NULL);
}

/* The handlers run on a stack of their own on the thread that starts the recorder (the program's
 * main thread, as a rule), where it has none yet: the interrupted code's stack is left alone below its
 * stack pointer (oneDNN's GEMM, interrupted there, corrupted the heap; bench/RESULTS.md), and the
 * dump's buffers (about 30 KB) need not fit what is left of it. */
static void fr_alt_stack(void) {
    static char stack[128 * 1024];
    stack_t old, ss = {.ss_sp = stack, .ss_size = sizeof stack};
    if (sigaltstack(NULL, &old) == 0 && (old.ss_flags & SS_DISABLE)) (void)sigaltstack(&ss, NULL);
}

static void fr_install_all(void) {
    g_fr_pid = getpid();
    fr_alt_stack();
    if (gethostname(g_fr_host, sizeof g_fr_host - 1) != 0) g_fr_host[0] = '\0';
    fr_install_sigterm();
    fr_install(SIGUSR1, fr_on_usr1);
    for (size_t i = 0; i < sizeof g_fr_fatal / sizeof g_fr_fatal[0]; i++) fr_install(g_fr_fatal[i], fr_on_fatal);
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
    fr_install_all();
}

/* ---------------------------------------------------------------- the hooks */

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
    ca_comm *none = NULL;
    if (c->fr) atomic_compare_exchange_strong(&g_fr_comm, &none, c);
}

void ca_comm_fr_free(ca_comm *c) {
    ca_comm *me = c;
    atomic_compare_exchange_strong(&g_fr_comm, &me, NULL);
    free(c->fr);
    c->fr = NULL;
}

void ca_comm_fr_issue(ca_comm *c, const ca_work *w) {
    fr_coll *e = &c->fr[w->seq % c->fr_n];
    *e = (fr_coll){.used = true, .seq = w->seq, .sig = w->sig, .t_issue_ns = ca_trace_now_ns()};
    ca_coll_sig_format(&w->sig, e->sig_text, sizeof e->sig_text);
}

void ca_comm_fr_end(ca_comm *c, const ca_work *w, ca_status s) {
    fr_coll *e = &c->fr[w->seq % c->fr_n];
    if (!e->used || e->seq != w->seq) return;   /* overwritten: more than fr_n issued since */
    e->t_end_ns = ca_trace_now_ns();
    e->status = s;
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
    char msg[1200];
    const char *status = signal_reason(c, sig, msg, sizeof msg);
    fr_dump_as(c, status, msg);
    /* another thread's dump (a failure at the same moment) finishes first, within a bound */
    for (int i = 0; i < 200 && atomic_load(&g_fr_writing) > 0; i++) usleep(10 * 1000);
    signal(sig, SIG_DFL);
    kill(getpid(), sig);
}
