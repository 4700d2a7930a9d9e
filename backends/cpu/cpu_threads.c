/* cpu_threads.c: how many threads the CPU kernels and OpenBLAS use (one count for both, cpu_parallel.h),
 * where that count came from, and the two corrections made to it at device open:
 *  - the clamp: a count above the CPUs this process may run on (its affinity mask when narrower than the
 *    online CPUs, a cgroup CPU quota) is lowered to them, with one warning. More threads than CPUs make
 *    every fork-join wait for threads that are not running (an OpenMP team spins at its barriers), which
 *    costs far more than the threads gain; a job script's OMP_NUM_THREADS sized for the whole node is
 *    the usual way in. A count above an unrestricted machine's CPUs is taken as asked.
 *  - fork: GNU libgomp is not fork-safe: a child that starts a parallel region after the parent used
 *    the team waits for pool threads that fork did not copy, forever. A child process (a data loader's
 *    worker, a test's fork) therefore runs the kernels and OpenBLAS on one thread, as PyTorch does. */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_parallel.h"
#include "base/slurm_impl.h"

#include <caccel/log.h>
#include <cblas.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int env_positive(const char *name, int def) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end != '\0' || x < 1 || x > 1 << 20) return def;
    return (int)x;
}

int cpu_online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

/* CPUs this process may run on (a Slurm step bound to its CPUs, taskset), at most the online ones. */
static int usable_cpus(void) {
    cpu_set_t set;
    int online = cpu_online_cpus();
    if (sched_getaffinity(0, sizeof set, &set) != 0) return online;
    int n = CPU_COUNT(&set);
    return n > 0 && n < online ? n : online;
}

static bool in_slurm_step(void) {
    const char *id = getenv("SLURM_STEP_ID"), *old = getenv("SLURM_STEPID"), *proc = getenv("SLURM_PROCID");
    return proc && *proc && ((id && *id) || (old && *old));
}

/* Online cores shared among the processes of this machine, unless the user
 * has told OpenBLAS (or OpenMP) how many threads to use. 0 = leave as is.
 * srun sets no local size of its own: a task of a Slurm step takes the CPUs
 * Slurm gave it (SLURM_CPUS_PER_TASK), else its share among the step's tasks
 * on this node, so that N tasks do not each start a thread per core. */
int cpu_default_blas_threads(void) {
    const char *ob = getenv("OPENBLAS_NUM_THREADS"), *omp = getenv("OMP_NUM_THREADS");
    if ((ob && *ob) || (omp && *omp)) return 0;
    int procs = env_positive("LOCAL_WORLD_SIZE", env_positive("OMPI_COMM_WORLD_LOCAL_SIZE", 0));
    if (procs == 0 && in_slurm_step()) {
        /* a step's tasks inherit the job's SLURM_CPUS_PER_TASK even where the step got fewer CPUs
         * (srun of Slurm 22.05 does not inherit -c): never more threads than CPUs to run on */
        int given = env_positive("SLURM_CPUS_PER_TASK", 0), usable = usable_cpus();
        if (given > 0) return given < usable ? given : usable;
        procs = ca_slurm_tasks_on_node(getenv("SLURM_STEP_TASKS_PER_NODE"), env_positive("SLURM_NODEID", 0));
    }
    int t = cpu_online_cpus() / (procs > 0 ? procs : 1);
    return t < 1 ? 1 : t;
}

/* ------------------------------------------------------------ cgroup quota */

/* The CPUs one cgroup directory's quota allows (quota / period rounded up), 0 when it sets none: v2's
 * cpu.max ("max 100000" or "150000 100000"), else v1's cpu.cfs_quota_us (-1: none) and cpu.cfs_period_us.
 * `why` gets "cgroup cpu.max quota 150000/100000 = 2 CPUs". */
static int quota_cpus(long long quota, long long period, const char *file, char *why, size_t len) {
    if (quota <= 0 || period <= 0) return 0;
    long long n = (quota + period - 1) / period;
    if (n > INT_MAX) return 0;
    snprintf(why, len, "cgroup %s quota %lld/%lld = %lld CPU%s", file, quota, period, n, n == 1 ? "" : "s");
    return (int)n;
}

static bool read_ll(const char *dir, const char *name, long long *v) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fscanf(f, "%lld", v) == 1;
    fclose(f);
    return ok;
}

static int dir_quota_cpus(const char *dir, char *why, size_t len) {
    char path[PATH_MAX], max[32] = "";
    long long quota = 0, period = 0;
    snprintf(path, sizeof path, "%s/cpu.max", dir);
    FILE *f = fopen(path, "r");
    if (f) {
        int got = fscanf(f, "%31s %lld", max, &period);
        fclose(f);
        if (got != 2 || strcmp(max, "max") == 0) return 0;
        return quota_cpus(strtoll(max, NULL, 10), period, "cpu.max", why, len);
    }
    if (!read_ll(dir, "cpu.cfs_quota_us", &quota) || !read_ll(dir, "cpu.cfs_period_us", &period)) return 0;
    return quota_cpus(quota, period, "cpu.cfs_quota_us/cpu.cfs_period_us", why, len);
}

/* The cgroup path of this process from a file in the format of /proc/self/cgroup: that of the v1
 * hierarchy whose controllers include "cpu" ("4:cpu,cpuacct:/path"), else v2's "0::/path" (a hybrid
 * system lists both, with the cpu controller on v1). Sets *v2; the path has no trailing slash. */
static bool cgroup_path(const char *proc_cgroup, char *out, size_t len, bool *v2) {
    out[0] = '\0';
    FILE *f = fopen(proc_cgroup, "r");
    if (!f) return false;
    char line[PATH_MAX + 64];
    bool v1_found = false, v2_found = false;
    while (!v1_found && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = *c2 = '\0';   /* line: the hierarchy id, c1 + 1: its controllers */
        char ctl[256];
        snprintf(ctl, sizeof ctl, ",%s,", c1 + 1);
        bool is_v2 = strcmp(line, "0") == 0 && c1[1] == '\0';
        v1_found = !is_v2 && strstr(ctl, ",cpu,") != NULL;
        if (v1_found || (is_v2 && !v2_found)) snprintf(out, len, "%s", c2 + 1);
        v2_found = v2_found || is_v2;
    }
    fclose(f);
    *v2 = !v1_found;
    size_t l = strlen(out);
    while (l > 0 && out[l - 1] == '/') out[--l] = '\0';
    return v1_found || v2_found;
}

/* The CPUs a cgroup CPU quota allows this process, 0 when none applies. `proc_cgroup` is a file in the
 * format of /proc/self/cgroup and `root` the cgroup file system's mount (/sys/fs/cgroup: v2's, or the
 * folder holding v1's "cpu" hierarchy). Every cgroup from the process's up to the root limits it, so
 * the smallest quota on that path counts; a path missing under `root` (a container's own cgroup mounted
 * as the root) is skipped. */
int cpu_cgroup_cpus(const char *proc_cgroup, const char *root, char *why, size_t len) {
    char rel[PATH_MAX], dir[PATH_MAX], reason[160];
    bool v2 = false;
    if (why && len) why[0] = '\0';
    if (!cgroup_path(proc_cgroup, rel, sizeof rel, &v2)) return 0;
    int best = 0;
    for (;;) {
        snprintf(dir, sizeof dir, "%s%s%s", root, v2 ? "" : "/cpu", rel);
        int n = dir_quota_cpus(dir, reason, sizeof reason);
        if (n > 0 && (best == 0 || n < best)) {
            best = n;
            if (why && len) snprintf(why, len, "%s", reason);
        }
        char *slash = strrchr(rel, '/');
        if (!slash) break;
        *slash = '\0';   /* "/a/b" -> "/a" -> "" (the root) */
    }
    return best;
}

/* ------------------------------------------------------------ the count */

/* The CPUs this process may use, 0 when nothing restricts it below the online CPUs; `why` says what. */
static int allowed_cpus(char *why, size_t len) {
    int online = cpu_online_cpus(), aff = usable_cpus(), best = 0;
    if (aff < online) {
        best = aff;
        snprintf(why, len, "affinity mask allows %d CPU%s", aff, aff == 1 ? "" : "s");
    }
    char cg[160];
    int q = cpu_cgroup_cpus("/proc/self/cgroup", "/sys/fs/cgroup", cg, sizeof cg);
    if (q > 0 && q < online && (best == 0 || q < best)) {
        best = q;
        snprintf(why, len, "%s", cg);
    }
    return best;
}

/* A thread count from the environment: "N", or OpenMP's list "N,M" (nested levels) whose first is ours. */
static int env_count(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    long x = strtol(v, &end, 10);
    return (*end == '\0' || *end == ',') && x >= 1 && x <= 1 << 20 ? (int)x : 0;
}

/* The count asked for and where it came from. The variable the BLAS itself obeys comes first: OpenBLAS's
 * OpenMP build follows OpenMP's count (OMP_NUM_THREADS) at every call, the other builds read
 * OPENBLAS_NUM_THREADS before OMP_NUM_THREADS. `caccel launch` sets both, and
 * CACCEL_NUM_CPU_THREADS_PER_PROCESS to its --num_cpu_threads_per_process (or its default), so that a
 * clamp names the launcher. */
static int requested_threads(const char **source) {
    bool omp_first = openblas_get_parallel() == 2;
    const char *vars[] = {omp_first ? "OMP_NUM_THREADS" : "OPENBLAS_NUM_THREADS",
                          omp_first ? "OPENBLAS_NUM_THREADS" : "OMP_NUM_THREADS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        int n = env_count(vars[i]);
        if (n == 0) continue;
        bool launcher = n == env_count("CACCEL_NUM_CPU_THREADS_PER_PROCESS");
        *source = launcher ? "caccel launch's num_cpu_threads_per_process" : vars[i];
        return n;
    }
    int t = cpu_default_blas_threads();
    *source = "default";
    return t > 0 ? t : openblas_get_num_threads();
}

static pthread_mutex_t choose_mu = PTHREAD_MUTEX_INITIALIZER;
static char clamp_note[320];   /* "" or the last open's clamp, under choose_mu */

void cpu_threads_clamp(char *out, size_t len) {
    pthread_mutex_lock(&choose_mu);
    snprintf(out, len, "%s", clamp_note);
    pthread_mutex_unlock(&choose_mu);
}

/* Sets the count for a device open: the one asked for, clamped to the CPUs allowed. The warning is
 * given once per process, however often the device is opened. */
static void choose_threads(void) {
    static bool warned;
    const char *source = "default";
    char why[200] = "";
    int n = requested_threads(&source), allowed = allowed_cpus(why, sizeof why);
    pthread_mutex_lock(&choose_mu);
    clamp_note[0] = '\0';
    if (allowed > 0 && n > allowed) {
        snprintf(clamp_note, sizeof clamp_note, "clamped from %d (%s): %s", n, source, why);
        if (!warned) CA_LOG_W("cpu: %d threads requested (%s), but %s: using %d", n, source, why, allowed);
        warned = true;
        n = allowed;
    }
    cpu_set_threads(n);
    pthread_mutex_unlock(&choose_mu);
}

/* The child of a fork has only the forking thread: the OpenMP team did not come along (OpenBLAS's
 * pthreads build rebuilds its own pool), and libgomp would wait for it at the first parallel region. One
 * thread needs no team. */
static void one_thread_in_child(void) { cpu_set_threads(1); }

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, one_thread_in_child); }

/* Every open of the device sets the count (as the environment now asks); the first registers the fork
 * handler. */
void cpu_threads_open(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_fork_handler);
    choose_threads();
}
