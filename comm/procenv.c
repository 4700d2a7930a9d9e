/* Process environment: rank and size from caccel launch, torchrun-style variables, mpirun or srun; the store. */
#include "base/base_impl.h"
#include "base/slurm_impl.h"
#include "base/text_impl.h"
#include "comm/comm_impl.h"
#include "comm/procenv_impl.h"
#include "comm/store_impl.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

typedef struct envsrc {
    char *const *envp;
} envsrc;

static const char *ev(const envsrc *e, const char *name) {
    if (!e->envp) {
        const char *v = getenv(name);
        return v && *v ? v : NULL;
    }
    size_t n = strlen(name);
    for (char *const *p = e->envp; *p; p++)
        if (strncmp(*p, name, n) == 0 && (*p)[n] == '=') return (*p)[n + 1] ? *p + n + 1 : NULL;
    return NULL;
}

/* Parses variable `name` as an int; *present false when unset. */
static ca_status ev_int(const envsrc *e, const char *name, int *out, bool *present) {
    const char *v = ev(e, name);
    if (present) *present = v != NULL;
    if (!v) return CA_OK;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    while (*end && isspace((unsigned char)*end)) end++;
    char q[256];
    if (errno || *end || end == v || x < INT_MIN || x > INT_MAX)
        return ca_error(CA_ERR_CONFIG, "environment variable %s='%s' is not an integer", name,
                        ca_escape(v, q, sizeof q));
    *out = (int)x;
    return CA_OK;
}

/* Reads a (rank, size) pair of variables: both or neither. */
static ca_status ev_pair(const envsrc *e, const char *rname, const char *sname, int *r, int *s, bool *found) {
    bool hr = false, hs = false;
    ca_status st = ev_int(e, rname, r, &hr);
    if (st == CA_OK) st = ev_int(e, sname, s, &hs);
    if (st != CA_OK) return st;
    if (hr != hs)
        return ca_error(CA_ERR_CONFIG, "environment variable %s is set but %s is not", hr ? rname : sname,
                        hr ? sname : rname);
    *found = hr;
    return CA_OK;
}

/* "node[01-04,07],gpu5" -> "node01" */
static void first_host(const char *list, char *buf, size_t len) {
    buf[0] = '\0';
    if (!list) return;
    size_t i = 0, o = 0;
    while (list[i] && list[i] != ',' && list[i] != '[' && o + 1 < len) buf[o++] = list[i++];
    buf[o] = '\0';
    if (list[i] == '[') {
        i++;
        while (list[i] && isdigit((unsigned char)list[i]) && o + 1 < len) buf[o++] = list[i++];
        buf[o] = '\0';
    }
}

static ca_status check_ranks(const ca_procenv *pe) {
    if (pe->world_size < 1)
        return ca_error(CA_ERR_CONFIG, "world size %d from %s: must be at least 1", pe->world_size, pe->source);
    if (pe->rank < 0 || pe->rank >= pe->world_size)
        return ca_error(CA_ERR_CONFIG, "rank %d from %s is outside the world of %d processes", pe->rank,
                        pe->source, pe->world_size);
    if (pe->local_world_size < 1 || pe->local_world_size > pe->world_size)
        return ca_error(CA_ERR_CONFIG, "local world size %d from %s must be between 1 and the world size %d",
                        pe->local_world_size, pe->source, pe->world_size);
    if (pe->local_rank < 0 || pe->local_rank >= pe->local_world_size)
        return ca_error(CA_ERR_CONFIG, "local rank %d from %s is outside the %d local processes", pe->local_rank,
                        pe->source, pe->local_world_size);
    if (pe->master_port < 0 || pe->master_port > 65535)
        return ca_error(CA_ERR_CONFIG, "MASTER_PORT=%d is not a TCP port (0-65535)", pe->master_port);
    return CA_OK;
}

static ca_status master(const envsrc *e, ca_procenv *pe) {
    const char *a = ev(e, "MASTER_ADDR");
    if (a) snprintf(pe->master_addr, sizeof pe->master_addr, "%s", a);
    return ev_int(e, "MASTER_PORT", &pe->master_port, NULL);
}

/* Launchers that name the rank, the world size and the local rank and size in four variables,
 * in the order they are looked for: caccel's/torchrun's first, then MPI's. */
typedef struct launcher_vars {
    const char *rank, *size, *local_rank, *local_size;
    ca_launcher_kind kind;
    const char *name;
} launcher_vars;

static const launcher_vars launchers[] = {
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", CA_LAUNCHER_ENV, "RANK/WORLD_SIZE environment"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
     CA_LAUNCHER_MPI, "mpirun (Open MPI)"},
    {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", CA_LAUNCHER_MPI, "mpiexec (MPICH/Hydra PMI)"},
};

/* One row of the table; *found when its rank and size are set. */
static ca_status from_table(const envsrc *e, const launcher_vars *l, ca_procenv *pe, bool *found) {
    ca_status s = ev_pair(e, l->rank, l->size, &pe->rank, &pe->world_size, found);
    if (s != CA_OK || !*found) return s;
    pe->launcher = l->kind;
    pe->launcher_name = l->name;
    pe->under_mpi = l->kind == CA_LAUNCHER_MPI;
    snprintf(pe->source, sizeof pe->source, "%s/%s/%s/%s", l->rank, l->size, l->local_rank, l->local_size);
    bool lf = false;
    if ((s = ev_pair(e, l->local_rank, l->local_size, &pe->local_rank, &pe->local_world_size, &lf)) != CA_OK)
        return s;
    if (!lf) {
        pe->local_rank = pe->rank;
        pe->local_world_size = pe->world_size;
    }
    if (l->kind == CA_LAUNCHER_ENV) {   /* caccel launch says so; torchrun also names the machine */
        const char *who = ev(e, "CACCEL_LAUNCHER");
        if (who && strcmp(who, "caccel") == 0) {
            pe->launcher = CA_LAUNCHER_CACCEL;
            pe->launcher_name = "caccel launch";
            pe->store_served = true;
        }
        bool gf = false;
        if ((s = ev_int(e, "GROUP_RANK", &pe->node_rank, &gf)) != CA_OK) return s;
        if (!gf) pe->node_rank = -1;
    }
    return master(e, pe);
}

/* Local rank and size from Slurm's variables; the whole world when they are missing. */
static ca_status slurm_local(const envsrc *e, ca_procenv *pe, bool strict) {
    bool lf = false, nf = false;
    int nid = 0;
    ca_status s = ev_int(e, "SLURM_LOCALID", &pe->local_rank, &lf);
    if (s == CA_OK) s = ev_int(e, "SLURM_NODEID", &nid, &nf);
    if (s != CA_OK) return s;
    if (strict) pe->node_rank = nf ? nid : -1;
    const char *spec = ev(e, "SLURM_STEP_TASKS_PER_NODE");
    if (!spec && strict) spec = ev(e, "SLURM_TASKS_PER_NODE");
    int per = ca_slurm_tasks_on_node(spec, nid);
    if (lf && per > 0) {
        pe->local_world_size = per;
        return CA_OK;
    }
    char q[256];
    if (strict && lf && per <= 0 && spec)
        return ca_error(CA_ERR_CONFIG, "cannot read the tasks of node %d from SLURM_STEP_TASKS_PER_NODE='%s'", nid,
                        ca_escape(spec, q, sizeof q));
    pe->local_rank = pe->rank;
    pe->local_world_size = pe->world_size;
    return CA_OK;
}

/* A PMIx launcher (mpirun of Open MPI 5, srun --mpi=pmix): the size comes from Slurm. */
static ca_status from_pmix(const envsrc *e, ca_procenv *pe, bool *found) {
    ca_status s = ev_int(e, "PMIX_RANK", &pe->rank, found);
    if (s != CA_OK || !*found) return s;
    pe->launcher = CA_LAUNCHER_MPI;
    pe->launcher_name = "PMIx launcher";
    pe->under_mpi = true;
    bool sf = false;
    const char *sz = ev(e, "SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
    if ((s = ev_int(e, sz, &pe->world_size, &sf)) != CA_OK) return s;
    if (!sf)
        return ca_error(CA_ERR_CONFIG, "PMIX_RANK is set but no world size variable (OMPI_COMM_WORLD_SIZE, "
                                       "PMI_SIZE or SLURM_NTASKS) is");
    snprintf(pe->source, sizeof pe->source, "PMIX_RANK/%s", sz);
    if ((s = slurm_local(e, pe, false)) != CA_OK) return s;
    return master(e, pe);
}

/* srun without MPI; the batch script itself (no step id) is one process. Rank 0 serves the store on
 * MASTER_ADDR (default: the step's first node) and MASTER_PORT (default 29500 + job id mod 1000). */
static ca_status from_slurm(const envsrc *e, ca_procenv *pe, bool *found) {
    *found = ev(e, "SLURM_PROCID") && (ev(e, "SLURM_STEP_ID") || ev(e, "SLURM_STEPID"));
    if (!*found) return CA_OK;
    pe->launcher = CA_LAUNCHER_SLURM;
    pe->launcher_name = "srun";
    const char *sz = ev(e, "SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
    bool sf = false;
    ca_status s = ev_int(e, "SLURM_PROCID", &pe->rank, NULL);
    if (s == CA_OK) s = ev_int(e, sz, &pe->world_size, &sf);
    if (s != CA_OK) return s;
    if (!sf) return ca_error(CA_ERR_CONFIG, "SLURM_PROCID is set but neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS is");
    snprintf(pe->source, sizeof pe->source, "SLURM_PROCID/%s/SLURM_LOCALID/SLURM_STEP_TASKS_PER_NODE", sz);
    if ((s = slurm_local(e, pe, true)) != CA_OK) return s;
    if ((s = master(e, pe)) != CA_OK) return s;
    if (!pe->master_addr[0]) {
        const char *nl = ev(e, "SLURM_STEP_NODELIST");
        if (!nl) nl = ev(e, "SLURM_JOB_NODELIST");
        first_host(nl, pe->master_addr, sizeof pe->master_addr);
    }
    if (!pe->master_port) {
        int job = 0;
        if ((s = ev_int(e, "SLURM_JOB_ID", &job, NULL)) != CA_OK) return s;
        pe->master_port = 29500 + (job > 0 ? job % 1000 : 0);
    }
    return CA_OK;
}

static ca_status detect(const envsrc *e, ca_procenv *pe) {
    memset(pe, 0, sizeof *pe);
    pe->launcher = CA_LAUNCHER_NONE;
    pe->launcher_name = "none";
    pe->world_size = 1;
    pe->local_world_size = 1;
    pe->node_rank = -1;
    snprintf(pe->source, sizeof pe->source, "no launcher");
    const char *tok = ev(e, CA_STORE_TOKEN_ENV);
    if (tok) snprintf(pe->token, sizeof pe->token, "%s", tok);
    bool found = false;
    ca_status s = CA_OK;
    for (size_t i = 0; s == CA_OK && !found && i < CA_ARRAY_LEN(launchers); i++)
        s = from_table(e, &launchers[i], pe, &found);
    if (s == CA_OK && !found) s = from_pmix(e, pe, &found);
    if (s == CA_OK && !found) s = from_slurm(e, pe, &found);
    if (s != CA_OK || !found) return s;
    return check_ranks(pe);
}

ca_status ca_procenv_detect_from(char *const *envp, ca_procenv *out) {
    static char *const empty[] = { NULL };
    envsrc e = { .envp = envp ? envp : empty };
    return detect(&e, out);
}

ca_status ca_procenv_detect(ca_procenv *out) {
    envsrc e = { .envp = NULL };
    return detect(&e, out);
}

/* Here rather than in comm.c so that this file stands alone (tests link it by itself). */
int64_t ca_comm_default_timeout_ms(void) {
    const char *v = getenv("CACCEL_TIMEOUT");
    if (v && *v) {
        char *end;
        long long sec = strtoll(v, &end, 10);
        if (!*end && sec > 0 && sec < INT64_MAX / 1000) return (int64_t)sec * 1000;
        char q[256];
        CA_LOG_W("CACCEL_TIMEOUT='%s' is not a positive number of seconds; using 1800", ca_escape(v, q, sizeof q));
    }
    return 1800 * 1000;
}

const char *ca_procenv_pick_backend(const ca_procenv *pe, const char *asked) {
    if (asked && *asked && strcmp(asked, "auto") != 0) return asked;
    if (pe->world_size <= 1) return "single";
    if (pe->under_mpi) return "mpi";
    return "gloo";
}

static bool is_loopback(const char *h) {
    return strcmp(h, "localhost") == 0 || strncmp(h, "127.", 4) == 0 || strcmp(h, "::1") == 0;
}

ca_status ca_procenv_store(const ca_procenv *pe, int64_t timeout_ms, ca_store_client **client,
                           ca_store_server **server) {
    *client = NULL;
    *server = NULL;
    if (timeout_ms <= 0) timeout_ms = ca_comm_default_timeout_ms();
    if (!pe->master_addr[0] || pe->master_port <= 0) {
        ca_error(CA_ERR_CONFIG, "%d processes started by %s but MASTER_ADDR/MASTER_PORT are not set: "
                 "no rendezvous store to meet at", pe->world_size, pe->launcher_name);
        ca_error_hint("start the program with `caccel launch`, or set MASTER_ADDR and MASTER_PORT (and %s) for "
                      "every process", CA_STORE_TOKEN_ENV);
        return CA_ERR_CONFIG;
    }
    if (!pe->token[0]) {
        ca_error(CA_ERR_CONFIG, "%s is not set: the rendezvous store at %s:%d only admits processes that carry the "
                 "job token", CA_STORE_TOKEN_ENV, pe->master_addr, pe->master_port);
        ca_error_hint("`caccel launch` sets it; without the launcher, export the same random value on every process "
                      "(e.g. %s=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \\n'))", CA_STORE_TOKEN_ENV);
        return CA_ERR_CONFIG;
    }
    ca_store_server *srv = NULL;
    if (!pe->store_served && pe->rank == 0) {
        bool single_node = pe->local_world_size == pe->world_size;
        const char *bind_host = single_node ? (is_loopback(pe->master_addr) ? "127.0.0.1" : pe->master_addr) : NULL;
        int err = 0;
        ca_status s = ca_store_server_start(bind_host, pe->master_port, pe->token, &srv, &err);
        if (s != CA_OK) {
            if (err == EADDRINUSE) {
                ca_error(CA_ERR_IO, "rank 0 cannot serve the rendezvous store on %s:%d: the port is already in use",
                         pe->master_addr, pe->master_port);
                ca_error_hint("pick a free MASTER_PORT, or start with `caccel launch`, which finds one");
            }
            return ca_last_status();
        }
    }
    ca_status s = ca_store_client_connect(pe->master_addr, pe->master_port, pe->token, timeout_ms, client);
    if (s != CA_OK) {
        ca_store_server_stop(srv);
        return s;
    }
    ca_store_client_set_server_name(*client, pe->store_served ? "caccel launch" : "rank 0");
    *server = srv;
    return CA_OK;
}
