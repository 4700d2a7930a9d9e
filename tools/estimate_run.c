/* estimate_run.c: `caccel estimate-memory --run PROGRAM [ARGS]`: runs one training step of the
 * program on the lazy xla device (or, with --measure, on the device its configuration chooses) and
 * prints the memory of that step per rank: parameters, gradients, optimizer state, activations and
 * the peak. The library writes the figures (accelerator/memory_report.c, CACCEL_MEMORY_REPORT) at
 * the first optimizer step and ends the program there. */
#include "tools/cli_impl.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define ER_FIELDS 7
#define ER_TABLE 6   /* the table's columns; unsharded_most (stage 3's most at once) goes under it */
static const char *const er_keys[ER_FIELDS] = {"parameters", "gradients", "optimizer_state", "unsharded", "activations",
                                               "peak", "unsharded_most"};

typedef struct er_rank {
    unsigned long long v[ER_FIELDS];
    int zero;
    char device[32];
} er_rank;

/* argv of the child: PROGRAM ARGS, or `caccel launch --num_processes N PROGRAM ARGS` for N > 1. */
static char **er_argv(const ca_em_run *r) {
    char **v = calloc((size_t)r->argc + 5, sizeof *v);
    static char self[PATH_MAX], np[16];
    if (!v) return NULL;
    int k = 0;
    if (r->nprocs > 1) {
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) return free(v), NULL;
        self[n] = '\0';
        snprintf(np, sizeof np, "%d", r->nprocs);
        v[k++] = self, v[k++] = "launch", v[k++] = "--num_processes", v[k++] = np;
    }
    for (int i = 0; i < r->argc; i++) v[k++] = r->argv[i];
    return v;
}

/* Runs the program (and its ranks) to the end of its first step; the status it exited with. */
static int er_spawn(const ca_em_run *r, const char *report) {
    char **v = er_argv(r);
    if (!v) return fprintf(stderr, "caccel estimate-memory: error: cannot find the caccel executable for launch\n"), -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("CACCEL_MEMORY_REPORT", report, 1);
        if (!r->measure) setenv("CACCEL_MEMORY_ESTIMATE", "1", 1);   /* the lazy device, whatever the type */
        execvp(v[0], v);
        fprintf(stderr, "caccel estimate-memory: error: cannot run %s: %s\n", v[0], strerror(errno));
        _exit(127);
    }
    free(v);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0)
        return fprintf(stderr, "caccel estimate-memory: error: cannot run %s: %s\n", r->argv[0], strerror(errno)), -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Reads REPORT.<rank> (one line of key=value pairs) and removes it. */
static int er_read(const char *report, int rank, er_rank *out) {
    char path[PATH_MAX], line[1024];
    snprintf(path, sizeof path, "%s.%d", report, rank);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    unlink(path);
    memset(out, 0, sizeof *out);
    for (char *save = NULL, *tok = ok ? strtok_r(line, " \n", &save) : NULL; tok; tok = strtok_r(NULL, " \n", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = '\0';
        for (int k = 0; k < ER_FIELDS; k++)
            if (!strcmp(tok, er_keys[k])) out->v[k] = strtoull(eq + 1, NULL, 10);
        if (!strcmp(tok, "zero")) out->zero = atoi(eq + 1);
        if (!strcmp(tok, "device")) snprintf(out->device, sizeof out->device, "%s", eq + 1);
    }
    return ok;
}

static void er_print(const ca_em_run *r, const er_rank *ranks) {
    if (r->json) {
        printf("{\"program\": \"%s\", \"num_processes\": %d, \"measured\": %s, \"ranks\": [", r->argv[0], r->nprocs,
               r->measure ? "true" : "false");
        for (int i = 0; i < r->nprocs; i++) {
            printf("%s{\"rank\": %d, \"device\": \"%s\", \"zero_stage\": %d", i ? ", " : "", i, ranks[i].device,
                   ranks[i].zero);
            for (int k = 0; k < ER_FIELDS; k++) printf(", \"%s\": %llu", er_keys[k], ranks[i].v[k]);
            printf("}");
        }
        printf("]}\n");
        return;
    }
    printf("Memory of one training step of `%s`, %d process%s, %s on the %s device\n", r->argv[0], r->nprocs,
           r->nprocs == 1 ? "" : "es", r->measure ? "measured" : "estimated", ranks[0].device);
    int zero = ranks[0].zero;
    static const char *const sharded[] = {"", "the optimizer state", "the optimizer state and gradients",
                                          "the optimizer state, gradients and parameters"};
    if (zero >= 1 && zero <= 3) printf("ZeRO stage %d: each rank holds its shard of %s\n", zero, sharded[zero]);
    printf("%-5s %14s %14s %16s %14s %14s %14s\n", "rank", "parameters", "gradients", "optimizer state", "unsharded",
           "activations", "peak");
    for (int i = 0; i < r->nprocs; i++) {
        printf("%-5d", i);
        for (int k = 0; k < ER_TABLE; k++) printf(" %*llu", k == 2 ? 16 : 14, ranks[i].v[k]);
        printf("\n");
    }
    for (int i = 0; zero == 3 && i < r->nprocs; i++)
        printf("rank %d held at most %llu bytes of gathered units at once during the step\n", i, ranks[i].v[6]);
    printf("(bytes; unsharded: %s; activations: the peak less the rest, temporaries included)\n",
           zero == 2 ? "the flat gradient of every parameter, held from the backward to its reduce-scatter"
           : zero == 3 ? "the gathered units (full parameters and gradients) held at the moment of the peak"
                       : "none, the model states are whole");
}

int ca_em_run_program(const ca_em_run *r) {
    char dir[] = "/tmp/caccel-estimate-XXXXXX", report[PATH_MAX];
    const char *tmp = getenv("TMPDIR");
    char tdir[PATH_MAX];
    snprintf(tdir, sizeof tdir, "%s/caccel-estimate-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    char *d = mkdtemp(tdir);
    if (!d) d = mkdtemp(dir);
    if (!d) return fprintf(stderr, "caccel estimate-memory: error: cannot make a directory for the report: %s\n",
                           strerror(errno)), 1;
    snprintf(report, sizeof report, "%s/report", d);
    int st = er_spawn(r, report);
    er_rank *ranks = calloc((size_t)r->nprocs, sizeof *ranks);
    int rc = st < 0 || !ranks;
    for (int i = 0; !rc && i < r->nprocs; i++)
        if (!er_read(report, i, &ranks[i])) {
            fprintf(stderr, "caccel estimate-memory: error: %s ended (exit status %d) without a report from rank %d: "
                            "it must train through ca_prepare's optimizer and reach its first ca_optimizer_step\n",
                    r->argv[0], st, i);
            rc = 1;
        }
    for (int i = 0; i < r->nprocs; i++) {   /* leftovers of a failed run */
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s.%d", report, i);
        unlink(p);
    }
    rmdir(d);
    if (!rc) er_print(r, ranks);
    free(ranks);
    return rc;
}
