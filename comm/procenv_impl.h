/* procenv_impl.h: who started this process (caccel launch, mpirun, srun, nothing) and the MULTI_CPU communicator. */
#ifndef CACCEL_PROCENV_IMPL_H
#define CACCEL_PROCENV_IMPL_H

#include <caccel/collective.h>

#include <stdbool.h>
#include <stdint.h>

struct ca_store_client;
struct ca_store_server;

typedef enum ca_launcher_kind {
    CA_LAUNCHER_NONE = 0,   /* one process */
    CA_LAUNCHER_CACCEL,     /* caccel launch (RANK, ... plus CACCEL_LAUNCHER and the job token) */
    CA_LAUNCHER_ENV,        /* RANK/WORLD_SIZE set by something else (torchrun-style) */
    CA_LAUNCHER_MPI,        /* mpirun / mpiexec (Open MPI, MPICH/Hydra, PMIx) */
    CA_LAUNCHER_SLURM       /* srun without MPI */
} ca_launcher_kind;

typedef struct ca_procenv {
    ca_launcher_kind launcher;
    const char *launcher_name;  /* "caccel launch", "mpirun (Open MPI)", "srun", "none", ... */
    char source[160];           /* the variables rank and size came from, for messages */
    int rank, world_size;
    int local_rank, local_world_size;
    int node_rank;              /* machine index, -1 when unknown */
    bool under_mpi;             /* an MPI launcher started us: the MPI backend can run */
    bool store_served;          /* a launcher serves the rendezvous store (else rank 0 serves it) */
    char master_addr[256];      /* "" when unknown */
    int master_port;            /* 0 when unknown */
    char token[257];            /* CACCEL_JOB_TOKEN, "" when unset */
} ca_procenv;

/* Reads the process environment. Values that contradict each other (rank >=
 * world size, negative or non-numeric values, local rank >= local size) fail
 * with CA_ERR_CONFIG naming the variables. */
ca_status ca_procenv_detect(ca_procenv *out);
/* The same from an explicit "NAME=value" list (NULL-terminated); for tests. */
ca_status ca_procenv_detect_from(char *const *envp, ca_procenv *out);

/* The collective backend for distributed_type MULTI_CPU: `asked` when given
 * ("gloo", "mpi"), else "single" for one process, "mpi" under an MPI
 * launcher, else "gloo". */
const char *ca_procenv_pick_backend(const ca_procenv *pe, const char *asked);

/* Connects to the job's rendezvous store: the launcher's, or, when there is
 * none, the one rank 0 serves on MASTER_ADDR:MASTER_PORT (rank 0 starts it;
 * *server is then non-NULL and must outlive every user of the store). */
ca_status ca_procenv_store(const ca_procenv *pe, int64_t timeout_ms, struct ca_store_client **client,
                           struct ca_store_server **server);

#endif
