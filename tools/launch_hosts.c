/* `caccel launch --hostfile FILE`: one command starts the job on every machine of a hostfile over
 * ssh (OpenSSH). Each machine runs `caccel launch --num_machines N --machine_rank i ...`; this
 * launcher streams their output with a "[host] " prefix and stops every machine when one fails, its
 * connection is lost, or it is interrupted.
 *
 * How a remote machine learns that it must stop: its launcher runs with CACCEL_LAUNCH_REMOTE=1 and
 * watches its standard input, which is the ssh channel. This launcher holds the write end of each
 * ssh's stdin and never writes after the job token: closing it (a stop), this launcher dying
 * (even by SIGKILL), or the connection dropping all end in EOF there, and the remote launcher then
 * stops its ranks as it does on SIGTERM. No pseudo-terminal is needed, so stdout and stderr stay apart.
 *
 * With --num_machines MIN:MAX (MAX the hostfile's hosts) each machine runs an elastic launcher: a machine
 * other than machine 0 that ends or whose connection is lost leaves the job, which machine 0 restarts at
 * the smaller size (within --max_restarts), and this launcher keeps the others running; machine 0 holds
 * the rendezvous, so its end is the job's. */
#include "tools/cli_impl.h"
#include "comm/store_impl.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define MAX_HOSTS 1024
#define MAX_HOSTFILE_BYTES (1 << 20)
#define MAX_SLOTS 4096
#define LINE_MAX_BYTES 4096
/* A configuration file up to this size travels to every machine on ssh's stdin; a larger one is
 * named by its path, which the machines must share. */
#define MAX_SENT_CONFIG 60000

typedef struct host {
    char name[256];      /* as written: [user@]address */
    int slots;
    pid_t pid;
    bool running;
    int status;
    int in_fd, out_fd, err_fd;   /* ssh's stdin (write end), stdout, stderr; -1 when closed */
    char out_line[LINE_MAX_BYTES], err_line[LINE_MAX_BYTES];
    size_t out_len, err_len;
} host;

typedef struct job {
    const ca_launch_hosts_opts *o;
    host *h;
    int n;
    int sfd;
    bool stopping;
    int64_t term_at, kill_at;   /* when the ssh sessions get SIGTERM, then SIGKILL, after a stop */
    int failed;                 /* the first host that failed, -1 none */
    int left;                   /* hosts that left an elastic job while it went on */
    int interrupted;
    char *cfg_text;             /* the configuration file's content, sent to every machine; NULL: none */
    size_t cfg_len;
    const char *cfg_name;       /* its name, without the directories */
} job;

/* Errors and progress (unless quiet), as every caccel command prints them. */
#define fail(J, ...) ca_cli_error((J)->o->cmd_name, __VA_ARGS__)
#define say(J, ...) ((J)->o->quiet ? (void)0 : ca_cli_say((J)->o->cmd_name, __VA_ARGS__))

/* ------------------------------------------------------------------ hostfile */

/* Host names travel inside a shell command on the remote side and as ssh's argument: only the
 * characters of host names, addresses and user names. */
static bool host_ok(const char *s) {
    if (!*s || *s == '-') return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("._-@", *s)) return false;
    return true;
}

static bool count_of(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!isdigit((unsigned char)*s) || *end || errno || v < 1 || v > MAX_SLOTS) return false;
    *out = (int)v;
    return true;
}

/* One line's words after the host: DeepSpeed's and Open MPI's `slots=N`, Open MPI's `max_slots=M`
 * (the processes started here never exceed slots, so it only has to be >= slots). */
static int parse_words(job *J, const char *file, int ln, host *h, char *save) {
    int max_slots = 0;
    for (char *w = strtok_r(NULL, " \t", &save); w; w = strtok_r(NULL, " \t", &save)) {
        if (strncmp(w, "slots=", 6) == 0) {
            if (!count_of(w + 6, &h->slots))
                return fail(J, "%s:%d: slots takes a count 1..%d, not '%s'", file, ln, MAX_SLOTS, w + 6);
        } else if (strncmp(w, "max_slots=", 10) == 0) {
            if (!count_of(w + 10, &max_slots))
                return fail(J, "%s:%d: max_slots takes a count 1..%d, not '%s'", file, ln, MAX_SLOTS, w + 10);
        } else {
            return fail(J, "%s:%d: unknown word '%s' (a line is `host slots=N`, `host slots=N max_slots=M` "
                        "or `host:N`)", file, ln, w);
        }
    }
    if (max_slots && max_slots < h->slots)
        return fail(J, "%s:%d: max_slots=%d is below slots=%d", file, ln, max_slots, h->slots);
    return 0;
}

/* One non-empty line: `host`, `host slots=N [max_slots=M]` or MPICH's `host:N`. */
static int parse_line(job *J, const char *file, int ln, char *line) {
    char *save = NULL, *name = strtok_r(line, " \t", &save);
    if (!name) return 0;
    if (J->n == MAX_HOSTS) return fail(J, "%s:%d: more than %d hosts", file, ln, MAX_HOSTS);
    host *h = &J->h[J->n];
    memset(h, 0, sizeof *h);
    h->slots = 1;   /* a bare host name: one slot, as mpirun counts it */
    char *colon = strchr(name, ':');
    if (colon) {
        *colon = '\0';
        if (!count_of(colon + 1, &h->slots))
            return fail(J, "%s:%d: '%s:%s': the count after ':' takes 1..%d", file, ln, name, colon + 1, MAX_SLOTS);
    }
    if (strlen(name) >= sizeof h->name || !host_ok(name))
        return fail(J, "%s:%d: '%s' is not a host name (letters, digits, '.', '-', '_', and user@)", file, ln, name);
    snprintf(h->name, sizeof h->name, "%s", name);
    if (parse_words(J, file, ln, h, save) != 0) return 1;
    for (int i = 0; i < J->n; i++)
        if (strcmp(J->h[i].name, h->name) == 0)
            return fail(J, "%s:%d: host %s is listed twice (first on another line)", file, ln, h->name);
    J->n++;
    return 0;
}

static int parse_text(job *J, const char *file, char *text) {
    int ln = 0;
    char *save = NULL;
    /* strtok_r would skip empty lines and lose the numbering: split by hand */
    for (char *line = text; line; line = save) {
        ln++;
        save = strchr(line, '\n');
        if (save) *save++ = '\0';
        line[strcspn(line, "#\r")] = '\0';
        if (parse_line(J, file, ln, line) != 0) return 1;
    }
    if (J->n == 0) return fail(J, "hostfile %s lists no host", file);
    for (int i = 1; i < J->n; i++)
        if (J->h[i].slots != J->h[0].slots)
            return fail(J, "hostfile %s: host %s has %d slot(s) but %s has %d: caccel launch starts the same "
                        "number of processes on every machine", file, J->h[i].name, J->h[i].slots, J->h[0].name,
                        J->h[0].slots);
    return 0;
}

/* The whole of a regular text file of at most `max` bytes into *text (NUL-terminated, the
 * caller frees it); `what` names the file in the errors. */
static int slurp(const job *J, const char *what, const char *file, long max, char **text, size_t *len) {
    int fd = open(file, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) return fail(J, "cannot open the %s %s: %s", what, file, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > max) {
        close(fd);
        return fail(J, "the %s %s is not a regular file of at most %ld bytes", what, file, max);
    }
    char *t = malloc((size_t)sb.st_size + 1);
    ssize_t got = t ? read(fd, t, (size_t)sb.st_size) : -1;
    close(fd);
    if (got < 0) {
        free(t);
        return fail(J, "cannot read the %s %s", what, file);
    }
    t[got] = '\0';
    if (strlen(t) != (size_t)got) {
        free(t);
        return fail(J, "the %s %s holds a NUL byte: not a text file", what, file);
    }
    *text = t;
    *len = (size_t)got;
    return 0;
}

static int read_hostfile(job *J, const char *file) {
    char *text = NULL;
    size_t len;
    if (slurp(J, "hostfile", file, MAX_HOSTFILE_BYTES, &text, &len) != 0) return 1;
    J->h = calloc(MAX_HOSTS, sizeof *J->h);
    int rc = J->h ? parse_text(J, file, text) : fail(J, "out of memory");
    free(text);
    return rc;
}

/* ------------------------------------------------------------------ ssh */

/* A growing command line; ok turns false when memory runs out. */
typedef struct sbuf {
    char *b;
    size_t len, cap;
    bool ok;
} sbuf;

static void raw(sbuf *s, const char *t) {
    size_t n = strlen(t);
    if (!s->ok) return;
    if (s->len + n + 1 > s->cap) {
        size_t c = (s->len + n + 1) * 2;
        char *b = realloc(s->b, c);
        if (!b) {
            s->ok = false;
            return;
        }
        s->b = b;
        s->cap = c;
    }
    memcpy(s->b + s->len, t, n + 1);
    s->len += n;
}

/* Appends 't': one shell word whatever it holds, each ' written as '\''. */
static void quoted(sbuf *s, const char *t) {
    raw(s, "'");
    for (const char *q; s->ok && (q = strchr(t, '\'')); t = q + 1) {
        char part[LINE_MAX_BYTES];
        size_t n = (size_t)(q - t);
        while (n >= sizeof part) {   /* a long word: in pieces */
            memcpy(part, t, sizeof part - 1);
            part[sizeof part - 1] = '\0';
            raw(s, part);
            t += sizeof part - 1;
            n -= sizeof part - 1;
        }
        memcpy(part, t, n);
        part[n] = '\0';
        raw(s, part);
        raw(s, "'\\''");
    }
    raw(s, t);
    raw(s, "'");
}

/* " 't'": the next word of a command */
static void word(sbuf *s, const char *t) {
    raw(s, " ");
    quoted(s, t);
}

static void word_int(sbuf *s, int v) {
    char num[32];
    snprintf(num, sizeof num, "%d", v);
    word(s, num);
}

/* The flags this launcher sets itself for each machine, or that only this side reads. */
static bool dropped_flag(const char *a, bool *takes_value, bool config_sent) {
    static const char *const names[] = {"hostfile", "deepspeed_hostfile", "ssh_port", "ssh_opts", "num_machines",
                                        "machine_rank", "main_process_ip", "main_process_port", "num_processes",
                                        "config_file"};
    size_t n = sizeof names / sizeof names[0] - !config_sent;
    for (size_t i = 0; i < n; i++) {
        const char *v = NULL;
        if (ca_cli_match_flag(a, names[i], &v)) {
            *takes_value = v == NULL;
            return true;
        }
    }
    return false;
}

/* The words of ssh and its options up to the host: ssh -o BatchMode=yes -o EXTRA [-p PORT] [--ssh_opts
 * words]. EXTRA: a connect timeout for the check, keep-alives for the job (a host that dies without
 * closing its connections is noticed within 15 s). */
static int ssh_words(const job *J, char **av, int max, char *opts, char *port, const char *extra) {
    int a = 0;
    av[a++] = "ssh";
    av[a++] = "-o";
    av[a++] = "BatchMode=yes";
    av[a++] = "-o";
    av[a++] = "ServerAliveCountMax=3";
    av[a++] = "-o";
    av[a++] = (char *)extra;
    if (J->o->ssh_port > 0) {
        snprintf(port, 16, "%d", J->o->ssh_port);
        av[a++] = "-p";
        av[a++] = port;
    }
    char *save = NULL;
    for (char *t = opts ? strtok_r(opts, " \t", &save) : NULL; t && a < max - 8; t = strtok_r(NULL, " \t", &save))
        av[a++] = t;
    return a;
}

/* The command machine `rank` runs: read the job token from stdin (kept out of `ps`), go to this
 * directory, and run caccel launch with the forwarded variables and flags for that machine. */
static char *remote_command(const job *J, int rank, const char *token_var) {
    const ca_launch_hosts_opts *o = J->o;
    char cwd[PATH_MAX], self[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) return NULL;
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) return NULL;
    self[sl] = '\0';
    sbuf s = {.ok = true};
    raw(&s, "caccel_cfg_dir=; read -r ");
    raw(&s, token_var);
    raw(&s, " && export ");
    raw(&s, token_var);
    if (J->cfg_text) {   /* the configuration follows the token: into a directory of its own */
        char n[32];
        snprintf(n, sizeof n, "%zu", J->cfg_len);
        raw(&s, " && caccel_cfg_dir=$(mktemp -d \"${TMPDIR:-/tmp}/caccel-config.XXXXXX\") && head -c ");
        raw(&s, n);
        raw(&s, " >\"$caccel_cfg_dir\"/");
        quoted(&s, J->cfg_name);
    }
    raw(&s, " && cd");
    word(&s, cwd);
    raw(&s, J->cfg_text ? " && env" : " && exec env");
    size_t tl = strlen(token_var);
    /* LD_LIBRARY_PATH too: the caccel binary at this path may need it to find libcaccel (an
     * uninstalled build, a prefix outside the loader's paths), and ssh starts a bare environment */
    for (char **e = environ; *e; e++)
        /* torchrun's PET_ variables (PET_MAX_RESTARTS, PET_RDZV_CONF): the flags below beat the others */
        if ((strncmp(*e, "ACCELERATE_", 11) == 0 || strncmp(*e, "CACCEL_", 7) == 0 || strncmp(*e, "PET_", 4) == 0 ||
             strncmp(*e, "LD_LIBRARY_PATH=", 16) == 0) &&
            !(strncmp(*e, token_var, tl) == 0 && (*e)[tl] == '='))
            word(&s, *e);
    word(&s, "CACCEL_LAUNCH_REMOTE=1");
    word(&s, self);
    word(&s, "launch");
    word(&s, "--num_machines");
    if (o->min_machines > 0) {
        char range[64];
        snprintf(range, sizeof range, "%d:%d", o->min_machines, J->n);
        word(&s, range);
    } else {
        word_int(&s, J->n);
    }
    word(&s, "--machine_rank");
    word_int(&s, rank);
    word(&s, "--main_process_ip");
    word(&s, o->main_process_ip);
    word(&s, "--main_process_port");
    word_int(&s, o->port);
    word(&s, "--num_processes");
    word_int(&s, J->n * J->h[0].slots);
    for (int i = 1; i < o->prog; i++) {
        bool takes = false;
        if (strcmp(o->argv[i], "--") == 0) continue;
        if (dropped_flag(o->argv[i], &takes, J->cfg_text != NULL)) {
            i += takes;
            continue;
        }
        word(&s, o->argv[i]);
    }
    if (J->cfg_text) {
        raw(&s, " --config_file \"$caccel_cfg_dir\"/");
        quoted(&s, J->cfg_name);
    }
    word(&s, "--");
    for (int i = o->prog; i < o->argc; i++) word(&s, o->argv[i]);
    /* no exec with a configuration: the shell removes it once the launcher has ended */
    if (J->cfg_text)
        raw(&s, "; caccel_rc=$?; [ -z \"$caccel_cfg_dir\" ] || rm -rf \"$caccel_cfg_dir\"; exit $caccel_rc");
    if (!s.ok) free(s.b);
    return s.ok ? s.b : NULL;
}

/* Forks `ssh ... host command` with the signal mask `old`, in its own process group (a Ctrl-C at
 * the terminal reaches this launcher, which stops the machines in order); pipes for its stdio. */
static pid_t spawn_ssh(const job *J, const host *h, const char *command, const char *extra, const sigset_t *old,
                       int *in, int *out, int *err) {
    int p[6] = {-1, -1, -1, -1, -1, -1}, *pi = p, *po = p + 2, *pe = p + 4;
    if (pipe2(pi, O_CLOEXEC) != 0 || pipe2(po, O_CLOEXEC) != 0 || pipe2(pe, O_CLOEXEC) != 0) {
        int e = errno;
        for (int i = 0; i < 6; i++)
            if (p[i] >= 0) close(p[i]);
        errno = e;
        return -1;
    }
    char *opts = J->o->ssh_opts ? strdup(J->o->ssh_opts) : NULL, port[16];
    char *av[80];
    int a = ssh_words(J, av, 76, opts, port, extra);
    av[a++] = (char *)h->name;
    av[a++] = (char *)command;
    av[a] = NULL;
    pid_t parent = getpid(), pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127);
        sigprocmask(SIG_SETMASK, old, NULL);
        signal(SIGPIPE, SIG_DFL);
        dup2(pi[0], STDIN_FILENO);
        dup2(po[1], STDOUT_FILENO);
        dup2(pe[1], STDERR_FILENO);
        execvp(av[0], av);
        fprintf(stderr, "cannot run ssh: %s (install the Debian package openssh-client)\n", strerror(errno));
        _exit(127);
    }
    int e = errno;
    free(opts);
    close(pi[0]);
    close(po[1]);
    close(pe[1]);
    if (pid < 0) {
        close(pi[1]);
        close(po[0]);
        close(pe[0]);
        errno = e;
        return -1;
    }
    *in = pi[1];
    *out = po[0];
    *err = pe[0];
    setpgid(pid, pid);
    return pid;
}

/* Every host answers `ssh host true` within 5 s, checked in parallel; each one that does not is
 * named, with ssh's last message, before anything starts. */
static int preflight(job *J) {
    sigset_t none;
    sigemptyset(&none);
    for (int i = 0; i < J->n; i++) {
        host *h = &J->h[i];
        h->pid = spawn_ssh(J, h, "true", "ConnectTimeout=5", &none, &h->in_fd, &h->out_fd, &h->err_fd);
        if (h->pid < 0) return fail(J, "cannot start ssh: %s", strerror(errno));
        close(h->in_fd);
        close(h->out_fd);
    }
    int bad = 0;
    for (int i = 0; i < J->n; i++) {
        host *h = &J->h[i];
        char msg[1024] = "", last[1024] = "";
        FILE *f = fdopen(h->err_fd, "r");
        while (f && fgets(msg, sizeof msg, f))
            if (msg[0] != '\n' && !strstr(msg, "Warning: Permanently added")) snprintf(last, sizeof last, "%s", msg);
        if (f) fclose(f);
        else close(h->err_fd);
        last[strcspn(last, "\r\n")] = '\0';
        int st = 0;
        while (waitpid(h->pid, &st, 0) < 0 && errno == EINTR) {}
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
        if (!bad++) fprintf(stderr, "caccel %s: error: these hosts of %s cannot be reached over ssh:\n",
                            J->o->cmd_name, J->o->hostfile);
        fprintf(stderr, "  %s (machine %d): %s\n", h->name, i, last[0] ? last : "ssh failed");
    }
    if (bad)
        fprintf(stderr, "  hint: `ssh -o BatchMode=yes%s%s HOST true` must succeed without a password for every "
                        "host (--ssh_port, --ssh_opts); nothing was started\n", J->o->ssh_port > 0 ? " -p PORT" : "",
                J->o->ssh_opts ? " SSH_OPTS" : "");
    return bad ? 1 : 0;
}

/* ------------------------------------------------------------------ the job */

/* Seconds a stopped machine gets to end its ranks before its ssh session is cut: the remote
 * launcher's own grace (CACCEL_LAUNCH_GRACE, default 10) and 5 s more. */
static int64_t stop_grace_ms(void) {
    const char *g = getenv("CACCEL_LAUNCH_GRACE");
    int s = g && *g ? atoi(g) : 10;
    if (s < 0 || s > 3600) s = 10;
    return ((int64_t)s + 5) * 1000;
}

/* Stops every machine: EOF on each remote launcher's stdin, which ends its ranks as SIGTERM does. */
static void stop_all(job *J) {
    if (J->stopping) return;
    J->stopping = true;
    for (int i = 0; i < J->n; i++)
        if (J->h[i].in_fd >= 0) {
            close(J->h[i].in_fd);
            J->h[i].in_fd = -1;
        }
    J->term_at = ca_now_ms() + stop_grace_ms();
    J->kill_at = J->term_at + 5000;
}

static void signal_ssh(job *J, int sig) {
    for (int i = 0; i < J->n; i++)
        if (J->h[i].running) kill(-J->h[i].pid, sig);
}

static void ended(job *J, int i, int st) {
    host *h = &J->h[i];
    h->running = false;
    h->status = st;
    if ((WIFEXITED(st) && WEXITSTATUS(st) == 0) || J->failed >= 0 || J->interrupted) return;
    /* an elastic job goes on without a machine other than machine 0 (which holds the rendezvous) */
    bool leaves = J->o->min_machines > 0 && i != 0;
    const char *then = leaves ? "the elastic job goes on without it" : "stopping every machine";
    if (WIFEXITED(st) && WEXITSTATUS(st) == 255)
        fprintf(stderr, "caccel %s: the connection to host %s (machine %d) was lost (ssh exited 255): %s\n",
                J->o->cmd_name, h->name, i, then);
    else if (WIFEXITED(st))
        fprintf(stderr, "caccel %s: host %s (machine %d) exited with code %d: %s\n", J->o->cmd_name, h->name, i,
                WEXITSTATUS(st), then);
    else
        fprintf(stderr, "caccel %s: ssh to host %s (machine %d) was killed by signal %d: %s\n", J->o->cmd_name,
                h->name, i, WTERMSIG(st), then);
    if (leaves) {
        J->left++;
        return;
    }
    J->failed = i;
    stop_all(J);
}

static void reap(job *J) {
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0)
        for (int i = 0; i < J->n; i++)
            if (J->h[i].pid == pid && J->h[i].running) ended(J, i, st);
}

/* Passes on the complete lines in a host's buffer, each prefixed "[host] "; `flush`: the rest too. */
static void emit_lines(const host *h, char *buf, size_t *len, FILE *to, bool flush) {
    size_t start = 0;
    for (size_t i = 0; i < *len; i++)
        if (buf[i] == '\n' || (flush && i + 1 == *len) || (i - start + 1 == LINE_MAX_BYTES - 1)) {
            fprintf(to, "[%s] %.*s%s", h->name, (int)(i - start + 1), buf + start, buf[i] == '\n' ? "" : "\n");
            start = i + 1;
        }
    memmove(buf, buf + start, *len - start);
    *len -= start;
    fflush(to);
}

static void pump(host *h, bool is_err) {
    int *fd = is_err ? &h->err_fd : &h->out_fd;
    char *buf = is_err ? h->err_line : h->out_line;
    size_t *len = is_err ? &h->err_len : &h->out_len;
    ssize_t r = read(*fd, buf + *len, LINE_MAX_BYTES - 1 - *len);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (r > 0) {
        *len += (size_t)r;
        emit_lines(h, buf, len, is_err ? stderr : stdout, *len == LINE_MAX_BYTES - 1);
        return;
    }
    emit_lines(h, buf, len, is_err ? stderr : stdout, true);
    close(*fd);
    *fd = -1;
}

static void on_signal(job *J) {
    struct signalfd_siginfo si;
    while (read(J->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        int sig = (int)si.ssi_signo;
        if (sig == SIGCHLD) continue;   /* reaped at the top of the loop */
        if (J->interrupted) {
            fprintf(stderr, "caccel %s: %s again: cutting every ssh session\n", J->o->cmd_name, strsignal(sig));
            signal_ssh(J, SIGKILL);
            continue;
        }
        J->interrupted = sig;
        say(J, "%s received: stopping every machine", strsignal(sig));
        stop_all(J);
    }
}

static bool busy(const job *J) {
    for (int i = 0; i < J->n; i++)
        if (J->h[i].running || J->h[i].out_fd >= 0 || J->h[i].err_fd >= 0) return true;
    return false;
}

static int supervise(job *J) {
    struct pollfd *pfd = calloc((size_t)(1 + 2 * J->n), sizeof *pfd);
    int *who = calloc((size_t)(1 + 2 * J->n), sizeof *who);
    if (!pfd || !who) {
        free(pfd);
        free(who);
        signal_ssh(J, SIGKILL);
        return fail(J, "out of memory");
    }
    for (;;) {
        reap(J);
        if (!busy(J)) break;
        int64_t now = ca_now_ms();
        if (J->stopping && now >= J->term_at) {
            signal_ssh(J, now >= J->kill_at ? SIGKILL : SIGTERM);
            J->term_at = now >= J->kill_at ? now + 3600 * 1000 : J->kill_at;
        }
        int np = 0;
        pfd[np++] = (struct pollfd){.fd = J->sfd, .events = POLLIN};
        for (int i = 0; i < J->n; i++) {
            if (J->h[i].out_fd >= 0) {
                who[np] = 2 * i;
                pfd[np++] = (struct pollfd){.fd = J->h[i].out_fd, .events = POLLIN};
            }
            if (J->h[i].err_fd >= 0) {
                who[np] = 2 * i + 1;
                pfd[np++] = (struct pollfd){.fd = J->h[i].err_fd, .events = POLLIN};
            }
        }
        if (poll(pfd, (nfds_t)np, 200) <= 0) continue;
        if (pfd[0].revents & POLLIN) on_signal(J);
        for (int p = 1; p < np; p++)
            if (pfd[p].revents & (POLLIN | POLLHUP | POLLERR)) pump(&J->h[who[p] / 2], who[p] & 1);
    }
    free(pfd);
    free(who);
    if (J->interrupted) return 128 + J->interrupted;
    if (J->failed >= 0) {
        int st = J->h[J->failed].status;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    return 0;
}

/* Starts one ssh session per host (machine i on line i) and hands each its job token. */
static int start_all(job *J, const sigset_t *old) {
    char token[CA_STORE_MAX_TOKEN + 2];
    const char *env = getenv(CA_STORE_TOKEN_ENV);
    if (env && *env) {
        if (strlen(env) > CA_STORE_MAX_TOKEN)
            return fail(J, "%s is longer than %u characters", CA_STORE_TOKEN_ENV, CA_STORE_MAX_TOKEN);
        snprintf(token, sizeof token, "%s", env);
    } else if (ca_store_make_token(token, sizeof token) != CA_OK) {
        return ca_cli_fail(J->o->cmd_name);
    }
    size_t tl = strlen(token);
    token[tl++] = '\n';
    for (int i = 0; i < J->n; i++) {
        host *h = &J->h[i];
        char *cmd = remote_command(J, i, CA_STORE_TOKEN_ENV);
        if (!cmd) {
            stop_all(J);
            return fail(J, "cannot build the command for host %s", h->name);
        }
        h->pid = spawn_ssh(J, h, cmd, "ServerAliveInterval=5", old, &h->in_fd, &h->out_fd, &h->err_fd);
        free(cmd);
        if (h->pid < 0) {
            stop_all(J);
            return fail(J, "cannot start ssh for host %s: %s", h->name, strerror(errno));
        }
        h->running = true;
        /* a pipe holds 64 KiB: the token and a configuration of at most MAX_SENT_CONFIG do not block */
        if (write(h->in_fd, token, tl) != (ssize_t)tl ||
            (J->cfg_text && J->cfg_len && write(h->in_fd, J->cfg_text, J->cfg_len) != (ssize_t)J->cfg_len)) {
            stop_all(J);
            return fail(J, "cannot pass the job token to ssh for host %s: %s", h->name, strerror(errno));
        }
    }
    return 0;
}

/* The job's shape from the hostfile, checked against what the configuration says. */
static int resolve(job *J, ca_launch_hosts_opts *o) {
    int total = J->n * J->h[0].slots;
    if (o->num_machines > 0 && o->num_machines != J->n && o->min_machines > 0)
        return fail(J, "--num_machines %d:%d, but the hostfile %s lists %d host(s): MAX is the hostfile's hosts",
                    o->min_machines, o->num_machines, o->hostfile, J->n);
    if (o->num_machines > 0 && o->num_machines != J->n)
        return fail(J, "--num_machines %d, but the hostfile %s lists %d host(s)", o->num_machines, o->hostfile, J->n);
    if (o->num_processes > 0 && o->num_processes != total)
        return fail(J, "--num_processes %d, but the hostfile %s has %d slot(s) in all (%d host(s) x %d)",
                    o->num_processes, o->hostfile, total, J->n, J->h[0].slots);
    if (o->port == 0 && J->n > 1)   /* machine 0 would pick one that the others cannot know */
        return fail(J, "--main_process_port 0 (any free port) needs one machine; the hostfile %s lists %d: give "
                    "a port", o->hostfile, J->n);
    if (!o->main_process_ip || !*o->main_process_ip || strcmp(o->main_process_ip, "null") == 0) {
        /* machine 0 serves the store: its address, without a user name */
        const char *at = strchr(J->h[0].name, '@');
        o->main_process_ip = at ? at + 1 : J->h[0].name;
    }
    return 0;
}

/* The configuration file this launcher read, whose content every machine gets (MAX_SENT_CONFIG). */
static int read_config(job *J) {
    const char *f = J->o->config_file;
    struct stat sb;
    if (!f || stat(f, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > MAX_SENT_CONFIG) return 0;
    if (slurp(J, "configuration file", f, MAX_SENT_CONFIG, &J->cfg_text, &J->cfg_len) != 0) return 1;
    const char *slash = strrchr(f, '/');
    J->cfg_name = slash ? slash + 1 : f;
    return 0;
}

int ca_launch_hosts(ca_launch_hosts_opts *o) {
    job J0 = {.o = o, .sfd = -1, .failed = -1}, *J = &J0;
    int rc = read_hostfile(J, o->hostfile);
    if (rc == 0) rc = resolve(J, o);
    if (rc == 0) rc = read_config(J);
    if (rc == 0) rc = preflight(J);
    if (rc != 0) {
        free(J->h);
        free(J->cfg_text);
        return rc;
    }
    say(J, "%d machine(s) x %d process(es) from %s; machine 0 (%s) serves the rendezvous at %s:%d", J->n,
        J->h[0].slots, o->hostfile, J->h[0].name, o->main_process_ip, o->port);
    sigset_t mask, old;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    signal(SIGINT, SIG_DFL);   /* a background job starts with SIGINT ignored: hear it anyway */
    sigprocmask(SIG_BLOCK, &mask, &old);
    J->sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    signal(SIGPIPE, SIG_IGN);
    for (int i = 0; i < J->n; i++) J->h[i].in_fd = J->h[i].out_fd = J->h[i].err_fd = -1;
    rc = J->sfd < 0 ? fail(J, "signalfd: %s", strerror(errno)) : start_all(J, &old);
    int code = J->sfd >= 0 ? supervise(J) : rc;
    if (rc != 0 && code == 0) code = rc;
    if (J->left)
        say(J, "%d of the %d machines left the elastic job while it ran; it ended with machine 0's status %d", J->left,
            J->n, code);
    if (J->sfd >= 0) close(J->sfd);
    sigprocmask(SIG_SETMASK, &old, NULL);
    free(J->h);
    free(J->cfg_text);
    return code;
}
