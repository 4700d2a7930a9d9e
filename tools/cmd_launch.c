/* `caccel launch`: Accelerate's launcher flags; spawns, supervises and tees the ranks, serves the rendezvous store. */
#include "tools/cli_impl.h"
#include "comm/store_impl.h"
#include "base/file_impl.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
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
#include <time.h>
#include <unistd.h>

extern char **environ;

#define DEFAULT_PORT 29500
/* How long failures are collected before one is named as the cause. */
#define DECIDE_MS 300
/* The launcher's store requests are tiny and answered at once by a live store: one unanswered for 5 s
 * means machine 0 is gone or unreachable, and the supervision loop must not wait out the store's
 * default 30 s (a machine cut off from the network would outlive the job's timeout by that much). */
#define STORE_IO_MS 5000
#define MAX_LOCAL 4096

/* Keys whose command-line value the workers must see: they read the
 * configuration again (file, then environment), so a flag given here travels
 * as the variable Accelerate's launcher would set. */
static const struct { const char *key, *var; } exported[] = {
    {"use_cpu", "ACCELERATE_USE_CPU"},
    {"mixed_precision", "ACCELERATE_MIXED_PRECISION"},
    {"gradient_accumulation_steps", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"},
    {"gradient_clipping", "ACCELERATE_GRADIENT_CLIPPING"},
    {"debug", "ACCELERATE_DEBUG_MODE"},
    {"enable_cpu_affinity", "ACCELERATE_CPU_AFFINITY"},
    {"downcast_bf16", "ACCELERATE_DOWNCAST_BF16"},
    {"dynamo_config.dynamo_backend", "ACCELERATE_DYNAMO_BACKEND"},
    {"dynamo_config.dynamo_mode", "ACCELERATE_DYNAMO_MODE"},
    {"dynamo_config.dynamo_use_fullgraph", "ACCELERATE_DYNAMO_USE_FULLGRAPH"},
    {"dynamo_config.dynamo_use_dynamic", "ACCELERATE_DYNAMO_USE_DYNAMIC"},
    {"backend", "CACCEL_BACKEND"},
    {"timeout", "CACCEL_TIMEOUT"},
    {"bucket_cap_mb", "CACCEL_BUCKET_CAP_MB"},
    {"flight_recorder_dir", "CACCEL_FLIGHT_RECORDER_DIR"},
    {"flight_recorder_entries", "CACCEL_FLIGHT_RECORDER_ENTRIES"},
    {"comm_hook", "CACCEL_COMM_HOOK"},
    {"allow_unknown_keys", "CACCEL_ALLOW_UNKNOWN_KEYS"},
    {"even_batches", "CACCEL_EVEN_BATCHES"},
    {"split_batches", "CACCEL_SPLIT_BATCHES"},
    {"dispatch_batches", "CACCEL_DISPATCH_BATCHES"},
    {"use_seedable_sampler", "CACCEL_USE_SEEDABLE_SAMPLER"},
    {"data_seed", "CACCEL_DATA_SEED"},
    {"non_blocking", "CACCEL_NON_BLOCKING"},
    {"deterministic", "CACCEL_DETERMINISTIC"},
    {"deterministic_shards", "CACCEL_DETERMINISTIC_SHARDS"},
    {"deepspeed_config.zero_stage", "ACCELERATE_DEEPSPEED_ZERO_STAGE"},
    {"deepspeed_config.deepspeed_config_file", "ACCELERATE_DEEPSPEED_CONFIG_FILE"},
    {"deepspeed_config.offload_optimizer_device", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"},
    {"deepspeed_config.offload_param_device", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE"},
    {"deepspeed_config.zero3_init_flag", "ACCELERATE_DEEPSPEED_ZERO3_INIT"},
    {"fsdp_config.fsdp_version", "FSDP_VERSION"},
    {"fsdp_config.fsdp_offload_params", "FSDP_OFFLOAD_PARAMS"},
    {"fsdp_config.fsdp_sharding_strategy", "FSDP_SHARDING_STRATEGY"},
    {"fsdp_config.fsdp_reshard_after_forward", "FSDP_RESHARD_AFTER_FORWARD"},
    {"fsdp_config.fsdp_state_dict_type", "FSDP_STATE_DICT_TYPE"},
    {"fsdp_config.fsdp_min_num_params", "FSDP_MIN_NUM_PARAMS"},
    {"fsdp_config.fsdp_auto_wrap_policy", "FSDP_AUTO_WRAP_POLICY"},
    {"fsdp_config.fsdp_transformer_layer_cls_to_wrap", "FSDP_TRANSFORMER_CLS_TO_WRAP"},
    {"fsdp_config.fsdp_backward_prefetch", "FSDP_BACKWARD_PREFETCH"},
    {"fsdp_config.fsdp_forward_prefetch", "FSDP_FORWARD_PREFETCH"},
    {"fsdp_config.fsdp_use_orig_params", "FSDP_USE_ORIG_PARAMS"},
    {"fsdp_config.fsdp_cpu_ram_efficient_loading", "FSDP_CPU_RAM_EFFICIENT_LOADING"},
    {"fsdp_config.fsdp_sync_module_states", "FSDP_SYNC_MODULE_STATES"},
    {"fsdp_config.fsdp_activation_checkpointing", "FSDP_ACTIVATION_CHECKPOINTING"},
    {"parallelism_config.parallelism_config_dp_replicate_size", "PARALLELISM_CONFIG_DP_REPLICATE_SIZE"},
    {"parallelism_config.parallelism_config_dp_shard_size", "PARALLELISM_CONFIG_DP_SHARD_SIZE"},
    {"parallelism_config.parallelism_config_tp_size", "PARALLELISM_CONFIG_TP_SIZE"},
    {"parallelism_config.parallelism_config_cp_size", "PARALLELISM_CONFIG_CP_SIZE"},
    {"parallelism_config.parallelism_config_cp_backend", "PARALLELISM_CONFIG_CP_BACKEND"},
    {"parallelism_config.parallelism_config_cp_comm_strategy", "PARALLELISM_CONFIG_CP_COMM_STRATEGY"},
    {"parallelism_config.parallelism_config_sp_size", "PARALLELISM_CONFIG_SP_SIZE"},
    {"parallelism_config.parallelism_config_sp_backend", "PARALLELISM_CONFIG_SP_BACKEND"},
    {"parallelism_config.parallelism_config_sp_seq_length", "PARALLELISM_CONFIG_SP_SEQ_LENGTH"},
    {"parallelism_config.parallelism_config_sp_seq_length_is_variable", "PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE"},
    {"parallelism_config.parallelism_config_sp_attn_implementation", "PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION"},
    /* the profiler (docs/PROFILING.md): caccel launch --profile --output_trace_dir DIR prog */
    {"profiling", "CACCEL_PROFILE"},
    {"output_trace_dir", "CACCEL_OUTPUT_TRACE_DIR"},
    {"profile_activities", "CACCEL_PROFILE_ACTIVITIES"},
    {"profile_wait", "CACCEL_PROFILE_WAIT"},
    {"profile_warmup", "CACCEL_PROFILE_WARMUP"},
    {"profile_active", "CACCEL_PROFILE_ACTIVE"},
    {"profile_repeat", "CACCEL_PROFILE_REPEAT"},
    {"profile_record_shapes", "CACCEL_PROFILE_RECORD_SHAPES"},
    {"profile_memory", "CACCEL_PROFILE_MEMORY"},
    {"profile_with_flops", "CACCEL_PROFILE_WITH_FLOPS"},
};

/* A distributed_type given on the command line (--use_fsdp, --use_deepspeed, --tpu) reaches the
 * workers as Accelerate's launcher sends it (ACCELERATE_USE_FSDP=true, ...); for XLA the variable is
 * caccel's own, as Accelerate's workers find the TPU through torch_xla instead. */
static const char *dist_type_var(const ca_config *cfg) {
    if (ca_config_source_of(cfg, "distributed_type") != CA_SRC_CLI) return NULL;
    ca_settings st;
    if (ca_config_settings(cfg, &st) != CA_OK) {
        ca_clear_error();
        return NULL;
    }
    switch (st.distributed_type) {   /* the configuration read the name (TPU is XLA) */
    case CA_DIST_FSDP: return "ACCELERATE_USE_FSDP";
    case CA_DIST_DEEPSPEED: return "ACCELERATE_USE_DEEPSPEED";
    case CA_DIST_XLA: return "CACCEL_USE_XLA";
    default: return NULL;
    }
}

/* Variables of an enclosing MPI job: a worker that saw them would believe
 * mpirun started it. */
static const char *const scrubbed_prefixes[] = {"OMPI_", "PMI_", "PMIX_", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"};

/* The subcommand the user typed, for every message: "launch", or "test" (caccel test runs its check
 * under the launcher, and a flag it rejects is one the user gave to caccel test). */
static const char *cmd_name = "launch";

typedef struct child {
    pid_t pid;
    int rank, local_rank;
    bool running;
    int status;
    int out_fd, err_fd;            /* tee pipes, -1 when not teed */
    char out_line[4096], err_line[4096];
    size_t out_len, err_len;
    FILE *out_log, *err_log;
} child;

typedef struct launch {
    /* flags */
    bool quiet;
    int tee_default;
    char tee_map[MAX_LOCAL > 64 ? 64 : MAX_LOCAL];   /* per local rank, -1 = default */
    const char *log_dir;
    const char *token_file;
    double monitor_interval;
    int max_restarts;              /* --max_restarts: the whole group is started again after a failure */
    int ssh_port;                  /* --ssh_port, --ssh_opts: how --hostfile reaches the machines */
    const char *ssh_opts;
    bool watch_stdin;              /* started by --hostfile over ssh: EOF on stdin stops the job */
    /* resolved */
    int nproc, nmachines, machine_rank, nlocal;
    char master_addr[256];
    int port;
    bool port_given;
    const char *backend;
    int64_t timeout_ms;
    char token[CA_STORE_MAX_TOKEN + 1];
    char **prog;
    /* running */
    child *kids;
    ca_store_server *server;
    ca_store_client *client;
    int sfd;
    bool stopping;
    int64_t kill_at;
    int first_fail;                /* index into kids, -1 none */
    int early_exit;                /* the first rank that exited 0 while others still ran, -1 none */
    int *failed_order;             /* failures seen before deciding, in the order reaped */
    int nfailed;
    int64_t decide_at;             /* when to name the failure that caused the others, 0 none */
    bool extended;                 /* decide_at was pushed back once to hear from other machines */
    int remote_fail_code;          /* another machine failed: exit with this */
    int interrupted;               /* signal received, 0 none */
    int restart_count;             /* group starts so far after the first, of any cause (CACCEL_RESTART_COUNT) */
    int failures;                  /* those after a failure (TORCHELASTIC_RESTART_COUNT): what --max_restarts
                                    * bounds; a restart that lets a machine join is not one, as in torchrun */
    /* elastic membership (--num_machines MIN:MAX): machine_rank is this machine's id, fixed for the job;
     * group_rank its place among the machines of the current round, which orders the ranks */
    bool elastic;
    int min_machines, max_machines, group_rank;
    int join_timeout_s, last_call_s;   /* --rdzv_conf join_timeout=S,last_call_timeout=S */
    unsigned char *member;         /* per machine id, M_OUT.. (below): in the current round or not */
    bool regroup;                  /* the processes stopped at a checkpoint to let a machine join */
    bool growing;                  /* this restart is such a regroup: a member it loses is a failure */
    int ended;                     /* the job ended while this machine waited to join: its status + 1, 0 not */
    bool store_lost;               /* machines 1.. of an elastic job: machine 0's store went away while the
                                    * job ran, so machine 0 is gone and no restart can follow */
} launch;

/* The command's progress (unless --quiet) and its errors, as every caccel command prints them. */
#define say(L, ...) ((L)->quiet ? (void)0 : ca_cli_say(cmd_name, __VA_ARGS__))
#define fail_msg(...) ca_cli_error(cmd_name, __VA_ARGS__)

static void usage(FILE *f) {
    fprintf(f,
        "usage: caccel launch [flags] PROGRAM [ARGS...]\n\n"
        "Starts PROGRAM as every process of a job on this machine, serves the rendezvous store,\n"
        "and stops the whole job when one process fails (exit status: the failed process's).\n\n"
        "Accelerate's flags (any `accelerate launch` configuration flag is accepted):\n"
        "  --config_file FILE            Accelerate/caccel YAML or JSON configuration\n"
        "  --num_processes N             processes in the whole job (all machines)\n"
        "  --num_machines N, --machine_rank R, --main_process_ip IP, --main_process_port PORT\n"
        "  --rdzv_endpoint HOST[:PORT]   torchrun's name for --main_process_ip and --main_process_port\n"
        "  --cpu, --multi_gpu, --mixed_precision no|fp16|bf16, --gradient_accumulation_steps N, --debug\n"
        "  --num_cpu_threads_per_process N   (default: physical cores / local processes)\n"
        "  -t, --tee [0-3]               prefix output with the rank: 1 stdout, 2 stderr, 3 both (bare --tee: 3)\n"
        "  --log_dir DIR                 also write each rank's output to DIR/<rank>/{stdout,stderr}.log\n"
        "  -q, --quiet                   no launcher messages\n"
        "caccel's own:\n"
        "  --backend gloo|mpi            collective backend (mpi: the job is started through mpirun)\n"
        "  --timeout SECONDS             collective and rendezvous timeout\n"
        "  --token_file PATH             job token shared by the machines (also CACCEL_JOB_TOKEN_FILE)\n"
        "  --max_restarts N              after a failure, start every process again, up to N times (default 0;\n"
        "                                a machine joining an elastic job is no failure)\n"
        "  --monitor_interval SECONDS    how often the processes are checked (default 0.5)\n"
        "  --hostfile FILE               start every machine of FILE (`host slots=N` lines) over ssh\n"
        "  --ssh_port PORT, --ssh_opts \"OPTIONS\"   how ssh reaches them\n"
        "  --num_machines MIN:MAX        elastic membership: MIN..MAX machines; shrinks when one dies, grows\n"
        "                                at a checkpoint when one comes (config file: num_machines: '2:3')\n"
        "  --rdzv_conf join_timeout=S,last_call_timeout=S   how long the rendezvous waits for MIN machines\n"
        "                                (default 600 s), then for more up to MAX (default 30 s); machine 0\n"
        "                                holds the rendezvous: when it is gone, the others end\n\n"
        "The processes get RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,\n"
        "CACCEL_JOB_TOKEN and the ACCELERATE_* variables. As torchrun, flags not given are read from\n"
        "PET_NNODES, PET_NODE_RANK, PET_MAX_RESTARTS, PET_RDZV_CONF and PET_RDZV_ENDPOINT.\n"
        "See docs/DISTRIBUTED.md.\n");
}

static const char *signame(int sig) {
    static char buf[32];
    const char *n = sigabbrev_np(sig);
    if (n) snprintf(buf, sizeof buf, "SIG%s", n);
    else snprintf(buf, sizeof buf, "signal %d", sig);
    return buf;
}

/* "exited with code 3" / "was killed by signal 11 (SIGSEGV: Segmentation fault)" */
static void describe_status(int st, char *buf, size_t len) {
    if (WIFEXITED(st)) snprintf(buf, len, "exited with code %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, len, "was killed by signal %d (%s: %s)%s", WTERMSIG(st), signame(WTERMSIG(st)),
                 strsignal(WTERMSIG(st)), WCOREDUMP(st) ? ", core dumped" : "");
    else snprintf(buf, len, "ended with status %d", st);
}

static int exit_code_of(int st) {
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return 1;
}

static bool parse_int(const char *s, int lo, int hi, int *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

/* --tee value: "3", or per local rank "0:3,1:1". */
static bool parse_tee(launch *L, const char *v) {
    if (!strchr(v, ':')) return parse_int(v, 0, 3, &L->tee_default);
    char *copy = strdup(v), *save = NULL;
    bool ok = copy != NULL;
    for (char *t = copy ? strtok_r(copy, ",", &save) : NULL; t && ok; t = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(t, ':');
        int lr, mode;
        if (!colon) { ok = false; break; }
        *colon = '\0';
        if (!parse_int(t, 0, (int)sizeof L->tee_map - 1, &lr) || !parse_int(colon + 1, 0, 3, &mode)) ok = false;
        else L->tee_map[lr] = (char)mode;
    }
    free(copy);
    return ok;
}

static int tee_mode(const launch *L, int local_rank) {
    if (local_rank < (int)sizeof L->tee_map && L->tee_map[local_rank] >= 0) return L->tee_map[local_rank];
    return L->tee_default;
}

/* Physical cores this process may run on (hyperthreads of one core count once). */
static int physical_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        return n > 0 ? (int)n : 1;
    }
    int logical = CPU_COUNT(&set), cores = 0;
    int seen[CPU_SETSIZE];
    int nseen = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &set)) continue;
        char path[128], buf[256];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", cpu);
        FILE *f = fopen(path, "r");
        int first = cpu;
        if (f) {
            if (fgets(buf, sizeof buf, f)) first = atoi(buf);
            fclose(f);
        }
        bool dup = false;
        for (int i = 0; i < nseen; i++)
            if (seen[i] == first) dup = true;
        if (!dup) {
            seen[nseen++] = first;
            cores++;
        }
    }
    return cores > 0 ? cores : (logical > 0 ? logical : 1);
}

/* ------------------------------------------------------------------ token */

/* 1: a token read; 0: the file is empty; -1: there is no file; -2: it cannot be a token file (a
 * FIFO, a directory, too large, unreadable), the error recorded. */
static int read_token_file(const char *path, char *tok, size_t len) {
    FILE *f;
    if (ca_file_fopen(path, CA_FILE_TOKEN, &f, NULL) != CA_OK) {
        if (ca_last_status() != CA_ERR_NOT_FOUND) return -2;
        ca_clear_error();
        return -1;
    }
    char buf[CA_STORE_MAX_TOKEN + 2] = "";
    bool ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok) return 0;
    buf[strcspn(buf, "\r\n")] = '\0';
    if (!buf[0]) return 0;
    snprintf(tok, len, "%s", buf);
    return 1;
}

/* The job token: CACCEL_JOB_TOKEN, else a token file (machine 0 writes it),
 * else, on one machine, a fresh random one. */
static int resolve_token(launch *L) {
    const char *env = getenv(CA_STORE_TOKEN_ENV);
    if (env && *env) {
        if (strlen(env) > CA_STORE_MAX_TOKEN)
            return fail_msg("%s is longer than %u characters", CA_STORE_TOKEN_ENV, CA_STORE_MAX_TOKEN);
        snprintf(L->token, sizeof L->token, "%s", env);
        return 0;
    }
    const char *path = L->token_file ? L->token_file : getenv("CACCEL_JOB_TOKEN_FILE");
    if (path && *path) {
        if (L->machine_rank == 0) {
            int r = read_token_file(path, L->token, sizeof L->token);
            if (r > 0) return 0;
            if (r == -2) return ca_cli_fail(cmd_name);
            if (ca_store_make_token(L->token, sizeof L->token) != CA_OK) return ca_cli_fail(cmd_name);
            int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
            if (fd < 0) return fail_msg("cannot write the job token to %s: %s", path, strerror(errno));
            dprintf(fd, "%s\n", L->token);
            close(fd);
            return 0;
        }
        int64_t until = ca_now_ms() + L->timeout_ms;
        while (ca_now_ms() < until) {
            int r = read_token_file(path, L->token, sizeof L->token);
            if (r > 0) return 0;
            if (r == -2) return ca_cli_fail(cmd_name);
            usleep(200 * 1000);
        }
        return fail_msg("no job token appeared in %s within %lld s (machine 0 writes it)", path,
                        (long long)(L->timeout_ms / 1000));
    }
    if (L->nmachines > 1) {
        fprintf(stderr, "caccel %s: error: a job on %d machines needs a shared job token\n", cmd_name, L->nmachines);
        fprintf(stderr, "  hint: export the same %s on every machine (e.g. %s=$(od -An -tx1 -N16 /dev/urandom "
                        "| tr -d ' \\n')), or pass --token_file PATH on a shared filesystem\n",
                CA_STORE_TOKEN_ENV, CA_STORE_TOKEN_ENV);
        return 1;
    }
    if (ca_store_make_token(L->token, sizeof L->token) != CA_OK) return ca_cli_fail(cmd_name);
    return 0;
}

/* ------------------------------------------------------------------ store */

static int start_store(launch *L) {
    if (L->machine_rank != 0) return 0;
    bool single = L->nmachines == 1 && !L->elastic;   /* an elastic job's machines may join later */
    const char *bind = single ? "127.0.0.1" : NULL;
    int err = 0;
    int want = L->port_given ? L->port : DEFAULT_PORT;
    if (want != 0) {
        if (ca_store_server_start(bind, want, L->token, &L->server, &err) == CA_OK) {
            L->port = want;
            return 0;
        }
        if (!single) {
            if (err == EADDRINUSE) {
                fprintf(stderr, "caccel %s: error: port %d is already in use on this machine (machine 0 "
                                "serves the rendezvous there)\n", cmd_name, want);
                fprintf(stderr, "  hint: pick a free --main_process_port and pass the same one on every machine\n");
                return 1;
            }
            return ca_cli_fail(cmd_name);
        }
        if (err != EADDRINUSE) return ca_cli_fail(cmd_name);
        ca_clear_error();
    }
    if (ca_store_server_start(bind, 0, L->token, &L->server, &err) != CA_OK) return ca_cli_fail(cmd_name);
    L->port = ca_store_server_port(L->server);
    if (want != 0)
        fprintf(stderr, "caccel %s: warning: port %d is busy; the rendezvous uses free port %d instead\n", cmd_name,
                want, L->port);
    return 0;
}

/* The launcher's own client: machines report failures and completion through the store. Connecting
 * retries a refused connection for timeout_ms (machine 0's store may not be up yet). */
static int connect_store(launch *L, int64_t timeout_ms) {
    const char *host = L->machine_rank == 0 ? "127.0.0.1" : L->master_addr;
    if (ca_store_client_connect(host, L->port, L->token, timeout_ms, &L->client) != CA_OK)
        return ca_cli_fail(cmd_name);
    ca_store_client_set_io_timeout(L->client, STORE_IO_MS);
    return 0;
}

/* ------------------------------------------------------------------ spawn */

static bool scrub(const char *entry) {
    for (size_t i = 0; i < sizeof scrubbed_prefixes / sizeof scrubbed_prefixes[0]; i++)
        if (strncmp(entry, scrubbed_prefixes[i], strlen(scrubbed_prefixes[i])) == 0) return true;
    return false;
}

static void setenv_int(const char *name, int v) {
    char num[32];
    snprintf(num, sizeof num, "%d", v);
    setenv(name, num, 1);
}

/* The job's size as the processes see it; an elastic job sets it again at each round. */
static void set_world_env(const launch *L) {
    setenv_int("ACCELERATE_NUM_PROCESSES", L->nproc);
    setenv_int("WORLD_SIZE", L->nproc);
    setenv_int("GROUP_RANK", L->group_rank);
    setenv_int("GROUP_WORLD_SIZE", L->nmachines);
}

/* OpenBLAS chooses its kernels when it loads, from OPENBLAS_CORETYPE or its own detection, which falls back to
 * kernels without AVX2 (Prescott) on CPU models it does not know, virtual machines' among them: there the
 * GEMM-bound steps ran at 0.25-0.31x PyTorch (bench/RESULTS.md, 16 cores). This process's OpenBLAS has loaded
 * already: where it chose so (the CPU backend's detection) and no OPENBLAS_CORETYPE is set, the workers get
 * the core this CPU runs, and one line says so. A user's OPENBLAS_CORETYPE is kept, whatever it names. */
static void set_blas_coretype(const launch *L) {
    const char *set = getenv("OPENBLAS_CORETYPE");
    /* test hook: the test set OPENBLAS_CORETYPE=Prescott only to load this process's OpenBLAS as its detection
     * does on an unknown CPU; the variable then counts as unset */
    if (getenv("CACCEL_TEST_CORETYPE_UNSET")) set = NULL;
    const char *hint = NULL;
    if ((set && *set) || ca_cpu_openblas_coretype_hint(&hint) != CA_OK || !hint) return;
    setenv("OPENBLAS_CORETYPE", hint, 1);
    say(L, "OpenBLAS chose kernels without AVX2 on this CPU, which has %s: the processes run with "
        "OPENBLAS_CORETYPE=%s", strcmp(hint, "SkylakeX") ? "AVX2" : "AVX-512", hint);
}

/* The environment every local process shares (ranks are added per child). */
static int setup_env(launch *L, ca_config *cfg, const ca_settings *st) {
    for (size_t i = 0; i < sizeof exported / sizeof exported[0]; i++) {
        if (ca_config_source_of(cfg, exported[i].key) != CA_SRC_CLI) continue;
        const char *v = ca_config_get(cfg, exported[i].key);
        if (v && strcmp(v, "null") != 0) setenv(exported[i].var, v, 1);
    }
    if (dist_type_var(cfg)) setenv(dist_type_var(cfg), "true", 1);
    const char *file = ca_config_file(cfg);
    if (file) setenv("ACCELERATE_CONFIG_FILE", file, 1);
    set_world_env(L);
    setenv_int("LOCAL_WORLD_SIZE", L->nlocal);
    /* the global batch the configuration describes is the one at MAX machines: the accelerator keeps
     * it at another size by changing the accumulation (docs/DISTRIBUTED.md) */
    if (L->elastic) setenv_int("CACCEL_ELASTIC_BASE_WORLD_SIZE", L->max_machines * L->nlocal);
    setenv("MASTER_ADDR", L->nmachines == 1 && !L->elastic ? "127.0.0.1" : L->master_addr, 1);
    setenv_int("MASTER_PORT", L->port);
    setenv(CA_STORE_TOKEN_ENV, L->token, 1);
    setenv("CACCEL_LAUNCHER", "caccel", 1);
    /* the launcher's rendezvous, read into MASTER_ADDR/MASTER_PORT above: the processes, which read the
     * configuration again, must not find it disagreeing with those (a single machine's 127.0.0.1) */
    unsetenv("PET_RDZV_ENDPOINT");
    unsetenv("CACCEL_JOB_TOKEN_FILE");

    /* as Accelerate does for CPU jobs: share the cores between the local processes */
    bool gpu = st->distributed_type == CA_DIST_MULTI_GPU && !st->use_cpu;
    if (!gpu) {
        int threads = st->num_cpu_threads_per_process;
        bool forced = threads > 0;
        if (!forced) {
            threads = physical_cores() / L->nlocal;
            if (threads < 1) threads = 1;
        }
        char num[32];
        snprintf(num, sizeof num, "%d", threads);
        /* with enable_cpu_affinity and no count asked for, each rank sizes its count to its set of cores
         * (comm/affinity.c): the sets differ where the cores do not divide evenly */
        bool by_set = st->enable_cpu_affinity && !forced;
        if (forced || (!by_set && !getenv("OMP_NUM_THREADS"))) setenv("OMP_NUM_THREADS", num, 1);
        if (forced || (!by_set && !getenv("OPENBLAS_NUM_THREADS"))) setenv("OPENBLAS_NUM_THREADS", num, 1);
        /* names the launcher as the count's source when the CPU device clamps it (cpu_threads.c) */
        setenv("CACCEL_NUM_CPU_THREADS_PER_PROCESS", num, 1);
    }
    set_blas_coretype(L);
    for (char **e = environ; *e;) {
        if (scrub(*e)) {
            char name[256];
            size_t n = strcspn(*e, "=");
            snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), *e);
            unsetenv(name);   /* environ shifts: look at the same slot again */
        } else {
            e++;
        }
    }
    return 0;
}

static FILE *open_log(const launch *L, int rank, const char *name) {
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/%d", L->log_dir, rank);
    mkdir(L->log_dir, 0755);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, L->restart_count ? "a" : "w");   /* a restarted group's output follows the last */
    if (!f) fprintf(stderr, "caccel %s: warning: cannot write %s: %s\n", cmd_name, path, strerror(errno));
    return f;
}

static int spawn(launch *L, child *k, const sigset_t *oldmask) {
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    int mode = tee_mode(L, k->local_rank);
    bool logs = L->log_dir != NULL;
    if (((mode & 1) || logs) && pipe2(out, O_CLOEXEC) != 0) return fail_msg("pipe: %s", strerror(errno));
    if (((mode & 2) || logs) && pipe2(err, O_CLOEXEC) != 0) return fail_msg("pipe: %s", strerror(errno));
    if (logs) {
        k->out_log = open_log(L, k->rank, "stdout.log");
        k->err_log = open_log(L, k->rank, "stderr.log");
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return fail_msg("fork: %s", strerror(errno));
    if (pid == 0) {
        /* the child: its own process group (signals reach its helpers too), dies with the launcher */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        sigprocmask(SIG_SETMASK, oldmask, NULL);
        signal(SIGPIPE, SIG_DFL);
        if (out[1] >= 0) dup2(out[1], STDOUT_FILENO);
        if (err[1] >= 0) dup2(err[1], STDERR_FILENO);
        char num[32];
        snprintf(num, sizeof num, "%d", k->rank);
        setenv("RANK", num, 1);
        snprintf(num, sizeof num, "%d", k->local_rank);
        setenv("LOCAL_RANK", num, 1);
        execvp(L->prog[0], L->prog);
        fprintf(stderr, "caccel %s: error: cannot run %s: %s\n", cmd_name, L->prog[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    k->pid = pid;
    k->running = true;
    if (out[1] >= 0) close(out[1]);
    if (err[1] >= 0) close(err[1]);
    k->out_fd = (mode & 1) || logs ? out[0] : -1;
    k->err_fd = (mode & 2) || logs ? err[0] : -1;
    return 0;
}

/* ------------------------------------------------------------------ output */

/* A log that cannot be written (a full disk, an I/O error) is closed with one warning naming it:
 * the rank's output still reaches the terminal, and the log is never silently cut short. */
static void log_failed(const launch *L, child *k, bool is_err, int err) {
    FILE **logf = is_err ? &k->err_log : &k->out_log;
    fprintf(stderr, "caccel %s: warning: cannot write %s/%d/%s: %s; the log ends here, the output goes on "
            "to the terminal only\n", cmd_name, L->log_dir, k->rank, is_err ? "stderr.log" : "stdout.log",
            strerror(err));
    fclose(*logf);
    *logf = NULL;
}

static void emit(const launch *L, child *k, bool is_err, const char *line, size_t n) {
    int mode = tee_mode(L, k->local_rank);
    bool show = is_err ? (mode & 2) : (mode & 1);
    FILE *logf = is_err ? k->err_log : k->out_log;
    if (logf) {
        errno = 0;
        if (fwrite(line, 1, n, logf) != n || fflush(logf) != 0) log_failed(L, k, is_err, errno ? errno : EIO);
    }
    FILE *f = is_err ? stderr : stdout;
    if (show) fprintf(f, "[rank%d]: %.*s", k->rank, (int)n, line);
    else fwrite(line, 1, n, f);
    fflush(f);
}

/* Reads what a pipe holds; returns false at end of file. */
static bool pump(const launch *L, child *k, bool is_err) {
    int *fd = is_err ? &k->err_fd : &k->out_fd;
    char *buf = is_err ? k->err_line : k->out_line;
    size_t *len = is_err ? &k->err_len : &k->out_len;
    size_t cap = sizeof k->out_line;
    ssize_t n = read(*fd, buf + *len, cap - *len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) {
        if (*len) {
            buf[(*len)++] = '\n';
            emit(L, k, is_err, buf, *len);
            *len = 0;
        }
        close(*fd);
        *fd = -1;
        return false;
    }
    *len += (size_t)n;
    size_t start = 0;
    for (size_t i = 0; i < *len; i++) {
        if (buf[i] == '\n') {
            emit(L, k, is_err, buf + start, i + 1 - start);
            start = i + 1;
        }
    }
    if (start == 0 && *len == cap) {   /* a line longer than the buffer: pass it on in pieces */
        emit(L, k, is_err, buf, *len);
        start = *len;
    }
    memmove(buf, buf + start, *len - start);
    *len -= start;
    return true;
}

/* ------------------------------------------------------------------ supervise */

/* A stopped process (SIGSTOP, a suspended job) keeps a SIGTERM pending until it is continued: the
 * SIGCONT after it lets a stopped rank end now rather than at the grace period's SIGKILL. */
static void signal_all(launch *L, int sig) {
    for (int i = 0; i < L->nlocal; i++)
        if (L->kids[i].running) {
            kill(-L->kids[i].pid, sig);
            if (sig == SIGTERM || sig == SIGINT) kill(-L->kids[i].pid, SIGCONT);
        }
}

/* Seconds between SIGTERM and SIGKILL when the processes are stopped (CACCEL_LAUNCH_GRACE, default 10). */
static int grace_s(void) {
    const char *g = getenv("CACCEL_LAUNCH_GRACE");
    int grace = g && *g ? atoi(g) : 10;
    return grace > 0 ? grace : 1;
}

static void begin_stop(launch *L, int sig) {
    if (!L->stopping) {
        L->stopping = true;
        L->kill_at = ca_now_ms() + (int64_t)grace_s() * 1000;
    }
    signal_all(L, sig);
}

static int running_count(const launch *L);

/* Collects exited children; `first` (the pid SIGCHLD named, 0 none) is
 * collected before the others: when one rank's exit makes the others fail
 * within the same instant, the one that went first is the one to report. */
static void reap(launch *L, pid_t first) {
    for (;;) {
        int st;
        pid_t pid = waitpid(first > 0 ? first : -1, &st, WNOHANG);
        if (first > 0) {
            first = 0;
            if (pid <= 0) continue;
        }
        if (pid <= 0) return;
        for (int i = 0; i < L->nlocal; i++) {
            child *k = &L->kids[i];
            if (k->pid != pid || !k->running) continue;
            k->running = false;
            k->status = st;
            bool failed = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
            if (!failed && L->early_exit < 0 && L->nfailed == 0 && !L->stopping && running_count(L) > 0)
                L->early_exit = i;
            if (failed && L->first_fail < 0 && !L->interrupted && !L->stopping) {
                L->failed_order[L->nfailed++] = i;
                if (L->decide_at == 0) L->decide_at = ca_now_ms() + DECIDE_MS;
            }
        }
    }
}

/* Did rank r's communicator fail (and say so in the store) before it exited? */
static bool failed_in_comm(launch *L, int rank) {
    if (!L->client) return false;
    char key[96];
    snprintf(key, sizeof key, "caccel/launch/comm_failed/%d", rank);
    ca_store_ref s = ca_store_client_ref(L->client);
    ca_status st = s.ops->check(s.store, key);
    ca_clear_error();
    return st == CA_OK;
}

/* The first failures have settled: names the one that caused the others (a
 * rank that died on its own rather than through a failed collective), tells
 * the other machines, and stops every process. */
static void check_remote(launch *L);

static void decide(launch *L) {
    /* a failure another machine reported explains ours */
    check_remote(L);
    if (L->remote_fail_code) {
        L->decide_at = 0;
        return;
    }
    int pick = -1;
    for (int j = 0; j < L->nfailed && pick < 0; j++)
        if (!failed_in_comm(L, L->kids[L->failed_order[j]].rank)) pick = L->failed_order[j];
    if (pick < 0 && L->nmachines > 1 && !L->extended) {
        /* all ours failed through a collective: the cause may be on another machine, whose
         * launcher is still collecting its own failures; give it time to say so */
        L->extended = true;
        L->decide_at = ca_now_ms() + 2000;
        return;
    }
    if (pick < 0) pick = L->failed_order[0];
    L->first_fail = pick;
    child *k = &L->kids[pick];
    char how[256];
    describe_status(k->status, how, sizeof how);
    fprintf(stderr, "caccel %s: rank %d (local rank %d, pid %d) %s; stopping the other processes\n", cmd_name, k->rank,
            k->local_rank, (int)k->pid, how);
    if (L->early_exit >= 0 && failed_in_comm(L, k->rank)) {
        /* a clean exit is no failure, but it is what the others' collectives waited for */
        const child *e = &L->kids[L->early_exit];
        fprintf(stderr, "caccel %s: before that, rank %d (local rank %d, pid %d) exited with code 0 while the "
                "others still ran\n", cmd_name, e->rank, e->local_rank, (int)e->pid);
    }
    if (L->nfailed > 1) {
        fprintf(stderr, "caccel %s: then failed too:", cmd_name);
        for (int j = 0; j < L->nfailed; j++) {
            if (L->failed_order[j] == pick) continue;
            child *o = &L->kids[L->failed_order[j]];
            describe_status(o->status, how, sizeof how);
            fprintf(stderr, " rank %d (%s)", o->rank, how);
        }
        fputc('\n', stderr);
    }
    if (L->client) {
        /* the other machines' launchers stop their processes too */
        char msg[512];
        describe_status(k->status, how, sizeof how);
        snprintf(msg, sizeof msg, "%d rank %d on machine %d %s", exit_code_of(k->status), k->rank, L->machine_rank,
                 how);
        ca_store_ref s = ca_store_client_ref(L->client);
        if (s.ops->set(s.store, "caccel/launch/failed", msg, strlen(msg)) != CA_OK) ca_clear_error();
    }
    begin_stop(L, SIGTERM);
}

static int running_count(const launch *L) {
    int n = 0;
    for (int i = 0; i < L->nlocal; i++) n += L->kids[i].running;
    return n;
}

/* Machine 0's store closed a connection of this launcher, refused a new one, or left a request unanswered
 * for STORE_IO_MS (its machine cut off): *why says which. */
static bool machine0_gone(launch *L, char *why, size_t len) {
    if (ca_store_client_gone(L->client, why, len)) return true;
    if (!ca_store_client_silent(L->client)) return false;
    snprintf(why, len, "no answer for %d s", STORE_IO_MS / 1000);
    return true;
}

/* Machines 1.. of an elastic job: machine 0's store closed this launcher's connection, refused a new one
 * or went silent while the job ran (machine 0 replaces its store only once every other machine has
 * stopped its processes, and ends it only once they are done, or after a failure it has reported in the
 * store, which this launcher then reads first: check_remote). Machine 0 died, was killed with its
 * launcher or was cut off, and it holds the rendezvous: stop this machine's processes, and end without
 * a restart. */
static void check_machine0(launch *L) {
    char why[256];
    if (!L->elastic || L->machine_rank == 0 || !L->client || L->stopping || !machine0_gone(L, why, sizeof why)) return;
    fprintf(stderr, "caccel %s: machine 0 is gone (its rendezvous store at %s:%d: %s); stopping this machine's "
            "processes\n", cmd_name, L->master_addr, L->port, why);
    L->store_lost = true;
    L->remote_fail_code = 1;
    begin_stop(L, SIGTERM);
}

/* Another machine's launcher reported a failure: stop ours too. */
static void check_remote(launch *L) {
    if (!L->client || L->stopping) return;
    ca_store_ref s = ca_store_client_ref(L->client);
    if (s.ops->check(s.store, "caccel/launch/failed") != CA_OK) {
        ca_clear_error();
        check_machine0(L);
        return;
    }
    char msg[520];
    size_t len = sizeof msg - 1;
    if (s.ops->get(s.store, "caccel/launch/failed", msg, &len, 1000) != CA_OK) {
        ca_clear_error();
        return;
    }
    msg[len] = '\0';
    int code = atoi(msg);
    const char *text = strchr(msg, ' ');
    fprintf(stderr, "caccel %s: %s; stopping this machine's processes\n", cmd_name, text ? text + 1 : msg);
    L->remote_fail_code = code ? code : 1;
    begin_stop(L, SIGTERM);
}

/* Started by `caccel launch --hostfile` over ssh: stdin is the ssh channel, and its EOF means that
 * launcher stopped the job, died, or lost the connection; the ranks stop as on SIGTERM. */
static void watch_stdin(launch *L) {
    char buf[256];
    ssize_t r = read(STDIN_FILENO, buf, sizeof buf);
    if (r > 0 || (r < 0 && (errno == EINTR || errno == EAGAIN))) return;
    L->watch_stdin = false;
    if (L->interrupted) return;
    L->interrupted = SIGHUP;
    fprintf(stderr, "caccel %s: the ssh session of caccel launch --hostfile closed: stopping every process\n",
            cmd_name);
    begin_stop(L, SIGTERM);
}

/* The descriptors supervise() waits on: the signalfd first, then ssh's channel when watched (who -1),
 * then each local process's stdout and stderr (who 2i and 2i+1). Returns how many. */
static int poll_set(launch *L, struct pollfd *pfd, int *who) {
    int np = 0;
    pfd[np++] = (struct pollfd){.fd = L->sfd, .events = POLLIN};
    if (L->watch_stdin) {
        who[np] = -1;
        pfd[np++] = (struct pollfd){.fd = STDIN_FILENO, .events = POLLIN};
    }
    for (int i = 0; i < L->nlocal; i++) {
        if (L->kids[i].out_fd >= 0) {
            who[np] = 2 * i;
            pfd[np++] = (struct pollfd){.fd = L->kids[i].out_fd, .events = POLLIN};
        }
        if (L->kids[i].err_fd >= 0) {
            who[np] = 2 * i + 1;
            pfd[np++] = (struct pollfd){.fd = L->kids[i].err_fd, .events = POLLIN};
        }
    }
    return np;
}

/* The signals queued on the signalfd: a child's end is reaped; the first SIGINT/SIGTERM/SIGHUP is
 * passed to every process, a second one kills them. */
static void read_signals(launch *L) {
    struct signalfd_siginfo si;
    while (read(L->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        int sig = (int)si.ssi_signo;
        if (sig == SIGCHLD) {
            reap(L, (pid_t)si.ssi_pid);
            continue;
        }
        if (L->interrupted) {
            fprintf(stderr, "caccel %s: %s again: killing every process\n", cmd_name, signame(sig));
            signal_all(L, SIGKILL);
            continue;
        }
        L->interrupted = sig;
        say(L, "%s received: passing it to every process", signame(sig));
        begin_stop(L, sig);
    }
}

/* A machine of an elastic job that has not reported within this long is taken for dead (its launcher
 * beats at every --monitor_interval while its processes run, and says when they have stopped). */
#define BEAT_DEAD_MS 5000

/* L->member: a machine outside the round, in it, (machine 0 at a restart) stopped, gone, waiting to join */
enum { M_OUT, M_IN, M_STOPPED, M_GONE, M_WAITING };

/* Machines 1.. of an elastic job show they are alive: machine 0 reads the counts when a restart
 * must tell the machines that stopped their processes from the ones that are gone. */
static void elastic_beat(launch *L) {
    if (!L->elastic || L->machine_rank == 0 || !L->client) return;
    char key[64];
    int64_t n;
    snprintf(key, sizeof key, "caccel/elastic/beat/%d", L->machine_rank);
    ca_store_ref s = ca_store_client_ref(L->client);
    if (s.ops->add(s.store, key, 1, &n) != CA_OK) ca_clear_error();
}

/* Machine 0 of an elastic job: a machine that joined the store after the round closed waits to join;
 * the processes see the note at their next complete checkpoint and stop there (accelerator/state.c). */
static void elastic_watch(launch *L) {
    if (!L->elastic || L->machine_rank != 0 || !L->client) return;
    ca_store_ref s = ca_store_client_ref(L->client);
    for (int id = 1; id < L->max_machines; id++) {
        char key[64];
        if (L->member[id] != M_OUT) continue;
        snprintf(key, sizeof key, "caccel/elastic/join/%d", id);
        if (s.ops->check(s.store, key) != CA_OK) {
            ca_clear_error();
            continue;
        }
        L->member[id] = M_WAITING;
        fprintf(stderr, "caccel %s: machine %d waits to join: the job grows at its next checkpoint\n", cmd_name, id);
        if (s.ops->set(s.store, "caccel/elastic/grow", "1", 1) != CA_OK) ca_clear_error();
    }
}

/* Every machine of an elastic job: the processes stopped at a checkpoint to let a machine join (rank 0
 * left the note): stop them all and start the grown group. */
static void elastic_check_regroup(launch *L) {
    if (!L->elastic || !L->client || L->stopping) return;
    ca_store_ref s = ca_store_client_ref(L->client);
    if (s.ops->check(s.store, "caccel/elastic/regroup") != CA_OK) {
        ca_clear_error();
        return;
    }
    fprintf(stderr, "caccel %s: the processes stopped at a checkpoint to let a machine join: starting the group "
            "again\n", cmd_name);
    L->regroup = true;
    begin_stop(L, SIGTERM);
}

static int supervise(launch *L) {
    int64_t next_remote = 0;
    int64_t interval = (int64_t)(L->monitor_interval * 1000);
    if (interval < 50) interval = 50;
    bool done_reported = false;
    for (;;) {
        reap(L, 0);
        bool pipes_open = false;
        for (int i = 0; i < L->nlocal; i++)
            if (L->kids[i].out_fd >= 0 || L->kids[i].err_fd >= 0) pipes_open = true;
        bool deciding = L->decide_at && L->first_fail < 0 && !L->remote_fail_code;
        if (running_count(L) == 0 && !pipes_open && !(deciding && ca_now_ms() < L->decide_at)) {
            if (deciding) {
                decide(L);
                /* decide() gave the other machines more time to report the cause: wait for it */
                if (L->first_fail < 0 && !L->remote_fail_code) continue;
            }
            if (L->nmachines == 1 || L->first_fail >= 0 || L->remote_fail_code || L->interrupted || L->regroup) break;
            /* machine 0 keeps the store up until every machine is done */
            if (!done_reported) {
                int64_t n;
                ca_store_ref s = ca_store_client_ref(L->client);
                if (s.ops->add(s.store, "caccel/launch/done", 1, &n) != CA_OK) ca_clear_error();
                done_reported = true;
                if (L->machine_rank != 0) break;
            }
            ca_store_ref s = ca_store_client_ref(L->client);
            int64_t n = 0;
            if (s.ops->add(s.store, "caccel/launch/done", 0, &n) == CA_OK && n >= L->nmachines) break;
            ca_clear_error();
            check_remote(L);
            if (L->remote_fail_code) break;
        }
        int64_t now = ca_now_ms();
        if (L->decide_at && L->first_fail < 0 && !L->remote_fail_code && now >= L->decide_at) decide(L);
        if (L->stopping && now >= L->kill_at && running_count(L) > 0) {
            fprintf(stderr, "caccel %s: %d process(es) still running after the grace period: SIGKILL\n", cmd_name,
                    running_count(L));
            signal_all(L, SIGKILL);
            L->kill_at = now + 3600 * 1000;
        }
        if ((L->nmachines > 1 || L->elastic) && now >= next_remote) {
            check_remote(L);
            elastic_beat(L);
            elastic_watch(L);
            elastic_check_regroup(L);
            next_remote = now + interval;
        }
        struct pollfd pfd[2 + 2 * MAX_LOCAL];
        int who[2 + 2 * MAX_LOCAL];
        int np = poll_set(L, pfd, who);
        int64_t wait = interval;
        if (L->decide_at && L->first_fail < 0 && !L->remote_fail_code && L->decide_at - now < wait)
            wait = L->decide_at > now ? L->decide_at - now : 0;
        int r = poll(pfd, (nfds_t)np, (int)wait);
        if (r < 0 && errno != EINTR) return fail_msg("poll: %s", strerror(errno));
        if (r <= 0) continue;
        if (pfd[0].revents & POLLIN) read_signals(L);
        for (int p = 1; p < np; p++)
            if (pfd[p].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) {
                if (who[p] < 0) watch_stdin(L);
                else pump(L, &L->kids[who[p] / 2], who[p] & 1);
            }
    }
    if (L->interrupted) return 128 + L->interrupted;
    if (L->regroup) return 1;   /* not a failure, but a restart all the same */
    if (L->first_fail >= 0) return exit_code_of(L->kids[L->first_fail].status);
    if (L->remote_fail_code) return L->remote_fail_code;
    return 0;
}

/* ------------------------------------------------------------------ mpi */

/* --backend mpi: the ranks are MPI processes, so mpirun starts them. */
static int run_mpirun(launch *L, ca_config *cfg) {
    const char *mpirun = getenv("MPIRUN");
    if (!mpirun || !*mpirun) mpirun = "mpirun";
    bool openmpi = false;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "%s --version 2>&1", mpirun);
    FILE *p = popen(cmd, "r");
    if (p) {
        char line[256];
        while (fgets(line, sizeof line, p))
            if (strstr(line, "Open MPI") || strstr(line, "OpenRTE")) openmpi = true;
        pclose(p);
    }
    const char *vars[sizeof exported / sizeof exported[0] + 5];
    int nv = 0;
    for (size_t i = 0; i < sizeof exported / sizeof exported[0]; i++) {
        if (ca_config_source_of(cfg, exported[i].key) != CA_SRC_CLI) continue;
        const char *v = ca_config_get(cfg, exported[i].key);
        if (!v || strcmp(v, "null") == 0) continue;
        setenv(exported[i].var, v, 1);
        vars[nv++] = exported[i].var;
    }
    if (dist_type_var(cfg)) {
        setenv(dist_type_var(cfg), "true", 1);
        vars[nv++] = dist_type_var(cfg);
    }
    const char *file = ca_config_file(cfg);
    if (file) {
        setenv("ACCELERATE_CONFIG_FILE", file, 1);
        vars[nv++] = "ACCELERATE_CONFIG_FILE";
    }
    setenv("CACCEL_BACKEND", "mpi", 1);
    bool listed = false;   /* --backend mpi on the command line put it in the list already */
    for (int i = 0; i < nv; i++) listed |= strcmp(vars[i], "CACCEL_BACKEND") == 0;
    if (!listed) vars[nv++] = "CACCEL_BACKEND";
    size_t nprog = 0;
    while (L->prog[nprog]) nprog++;
    char **av = calloc(64 + 2 * (size_t)nv + nprog, sizeof *av);
    if (!av) return fail_msg("out of memory");
    size_t a = 0;
    char np[32];
    snprintf(np, sizeof np, "%d", L->nproc);
    av[a++] = (char *)mpirun;
    av[a++] = "-np";
    av[a++] = np;
    const char *hostfile = ca_config_get(cfg, "mpirun_config.mpirun_hostfile");
    char ppn[48];
    if (hostfile && strcmp(hostfile, "null") != 0) {   /* the machines, and num_processes / num_machines on each */
        av[a++] = openmpi ? "--hostfile" : "-f";
        av[a++] = (char *)hostfile;
        snprintf(ppn, sizeof ppn, openmpi ? "ppr:%d:node" : "%d", L->nlocal);
        av[a++] = openmpi ? "--map-by" : "-ppn";
        av[a++] = ppn;
    }
    char *extra = getenv("CACCEL_MPIRUN_ARGS") ? strdup(getenv("CACCEL_MPIRUN_ARGS")) : NULL, *save = NULL;
    for (char *t = extra ? strtok_r(extra, " \t", &save) : NULL; t && a < 48; t = strtok_r(NULL, " \t", &save))
        av[a++] = t;
    char genv[4096] = "";
    for (int i = 0; i < nv; i++) {
        if (openmpi) {
            av[a++] = "-x";
            av[a++] = (char *)vars[i];
        } else {
            size_t u = strlen(genv);
            snprintf(genv + u, sizeof genv - u, "%s%s", u ? "," : "", vars[i]);
        }
    }
    if (!openmpi && genv[0]) {
        av[a++] = "-genvlist";
        av[a++] = genv;
    }
    for (size_t i = 0; i < nprog; i++) av[a++] = L->prog[i];
    av[a] = NULL;
    say(L, "backend mpi: starting %d processes through %s", L->nproc, mpirun);
    fflush(NULL);
    execvp(mpirun, av);
    int e = errno;
    fprintf(stderr, "caccel %s: error: cannot run %s: %s\n", cmd_name, mpirun, strerror(e));
    fprintf(stderr, "  hint: install the Debian package openmpi-bin (or set MPIRUN to your launcher)\n");
    free(extra);
    free(av);
    return 127;
}

/* ------------------------------------------------------------------ main */

/* Starts every local rank (children get the signal mask `old`) and supervises them to the end of this
 * attempt. *spawn_failed: a process could not be started (no restart helps). */
static int run_group(launch *L, const sigset_t *old, bool *spawn_failed) {
    int rc = 0;
    say(L, "%d process(es) on this machine (ranks %d-%d of %d, machine %d of %d), rendezvous %s:%d", L->nlocal,
        L->group_rank * L->nlocal, L->group_rank * L->nlocal + L->nlocal - 1, L->nproc, L->group_rank,
        L->nmachines, L->nmachines == 1 && !L->elastic ? "127.0.0.1" : L->master_addr, L->port);
    for (int i = 0; i < L->nlocal; i++) {
        child *k = &L->kids[i];
        k->rank = L->group_rank * L->nlocal + i;
        k->local_rank = i;
        k->out_fd = k->err_fd = -1;
        if (spawn(L, k, old) != 0) {
            rc = 1;
            begin_stop(L, SIGTERM);
            break;
        }
    }
    int code = supervise(L);
    if (rc && !code) code = rc;
    *spawn_failed = rc != 0;
    for (int i = 0; i < L->nlocal; i++) {
        for (int e = 0; e < 2; e++) {
            FILE *f = e ? L->kids[i].err_log : L->kids[i].out_log;
            if (f && fclose(f) != 0)
                fprintf(stderr, "caccel %s: warning: cannot write %s/%d/%s: %s\n", cmd_name, L->log_dir,
                        L->kids[i].rank, e ? "stderr.log" : "stdout.log", strerror(errno));
        }
    }
    return code;
}

/* A restarted group rendezvouses afresh: the keys of the failed attempt (addresses, barriers, failure
 * reports) must not be read by the new one, so machine 0 replaces the store by an empty one, on the
 * same port. With several machines the launchers agree first (agree_restart). */
static int fresh_store(launch *L) {
    ca_store_client_close(L->client);
    L->client = NULL;
    ca_store_server_stop(L->server);
    L->server = NULL;
    L->port_given = true;   /* the same port where it is free */
    int rc = start_store(L);
    if (rc == 0) rc = connect_store(L, L->timeout_ms);
    char num[32];
    snprintf(num, sizeof num, "%d", L->port);
    setenv("MASTER_PORT", num, 1);
    return rc;
}

/* An elastic job's machine that waits for a restart's store: machine 0 may have ended the job instead
 * (elastic_dismiss): then it says so, tells machine 0 it has seen it, and leaves without waiting out
 * join_timeout. True when it has ended. */
static bool job_ended(launch *L, ca_store_ref s) {
    char v[32], key[64];
    size_t len = sizeof v - 1;
    if (s.ops->check(s.store, "caccel/elastic/ended") != CA_OK ||
        s.ops->get(s.store, "caccel/elastic/ended", v, &len, STORE_IO_MS) != CA_OK) {
        ca_clear_error();
        return false;
    }
    v[len] = '\0';
    int status = atoi(v);
    L->ended = status + 1;
    if (L->group_rank < 0 || !L->restart_count)
        fprintf(stderr, "caccel %s: the job ended (machine 0's exit status %d) before machine %d could join: it leaves "
                "without starting its processes\n", cmd_name, status, L->machine_rank);
    else
        fprintf(stderr, "caccel %s: the job ended (machine 0's exit status %d) at restart %d: machine %d leaves "
                "without starting its processes\n", cmd_name, status, L->restart_count, L->machine_rank);
    snprintf(key, sizeof key, "caccel/elastic/left/%d", L->machine_rank);
    if (s.ops->set(s.store, key, "1", 1) != CA_OK) ca_clear_error();
    return true;
}

/* Machines 1.. of a restart: after saying in the old store that their processes have ended, they
 * reconnect until the store they reach is the new one (machine 0 marks it with the attempt's key).
 * The old store goes away meanwhile: a connection it accepts and then closes (while this launcher
 * presents the job token) is part of the swap, not a failure, and is tried again until the deadline.
 * The swap takes machine 0 a moment (it stops the old store and starts the new one on the same port):
 * in an elastic job, a store that has not answered for BEAT_DEAD_MS (refused or unanswered
 * connections) is machine 0 gone, as machine 0 takes a silent machine for gone. */
static int rejoin_store(launch *L, const char *gen_key, int64_t deadline) {
    ca_store_client_close(L->client);
    L->client = NULL;
    int wait_s = (int)((deadline - ca_now_ms() + 999) / 1000);   /* join_timeout for a machine that waits to join */
    int64_t heard = ca_now_ms();
    for (;;) {
        int64_t now = ca_now_ms(), left = deadline - now;
        if (left <= 0)
            return fail_msg("restart %d: machine 0's new rendezvous store at %s:%d did not come up within %d s%s",
                            L->restart_count, L->master_addr, L->port, wait_s,
                            L->elastic ? ": machine 0 holds the rendezvous, and an elastic job cannot go on without "
                                         "it (as with torchrun's c10d rendezvous)" : "");
        if (L->elastic && now - heard >= BEAT_DEAD_MS)
            return fail_msg("restart %d: machine 0 is gone (its rendezvous store at %s:%d: no answer for %d s); it "
                            "holds the rendezvous, and an elastic job cannot go on without it (as with torchrun's c10d "
                            "rendezvous)", L->restart_count, L->master_addr, L->port, (int)((now - heard) / 1000));
        if (L->elastic && heard + BEAT_DEAD_MS - now < left) left = heard + BEAT_DEAD_MS - now;
        if (ca_store_client_connect(L->master_addr, L->port, L->token, left, &L->client) != CA_OK) {
            if (deadline - ca_now_ms() <= 0) return ca_cli_fail(cmd_name);
            ca_clear_error();
            usleep(100 * 1000);
            continue;
        }
        heard = ca_now_ms();
        ca_store_client_set_io_timeout(L->client, STORE_IO_MS);
        ca_store_ref s = ca_store_client_ref(L->client);
        if (s.ops->check(s.store, gen_key) == CA_OK) return 0;
        ca_clear_error();
        if (L->elastic && job_ended(L, s)) return 1;
        ca_store_client_close(L->client);   /* the old store, not replaced yet */
        L->client = NULL;
        usleep(100 * 1000);
    }
}

/* Every machine's processes of the failed attempt have ended before machine 0 replaces the store, so
 * that no process of the old attempt meets the new one's keys: machines 1.. say so in the old store,
 * machine 0 waits for all of them (as long as a machine takes to hear of the failure and stop its
 * processes: the grace period and 30 s), replaces the store and marks it; the others rejoin it. */
static int agree_restart(launch *L) {
    char stopped[64], gen[64];
    snprintf(stopped, sizeof stopped, "caccel/launch/restart/%d/stopped", L->restart_count);
    snprintf(gen, sizeof gen, "caccel/launch/restart/%d/store", L->restart_count);
    int64_t deadline = ca_now_ms() + (int64_t)grace_s() * 1000 + 30000;
    ca_store_ref s = ca_store_client_ref(L->client);
    if (L->machine_rank != 0) {
        int64_t n;
        if (s.ops->add(s.store, stopped, 1, &n) != CA_OK) ca_clear_error();   /* machine 0 may be gone */
        return rejoin_store(L, gen, deadline);
    }
    for (int64_t n = 0;;) {
        if (s.ops->add(s.store, stopped, 0, &n) != CA_OK) ca_clear_error();
        if (n >= L->nmachines - 1) break;
        if (ca_now_ms() >= deadline)
            return fail_msg("restart %d: %lld of the %d other machines stopped their processes for the restart "
                            "within %d s (each needs the same --max_restarts)", L->restart_count, (long long)n,
                            L->nmachines - 1, grace_s() + 30);
        usleep(100 * 1000);
    }
    if (fresh_store(L) != 0) return 1;
    s = ca_store_client_ref(L->client);
    if (s.ops->set(s.store, gen, "1", 1) != CA_OK) return ca_cli_fail(cmd_name);
    return 0;
}

/* ------------------------------------------------------------------ elastic membership */

/* The size of a list of machine ids: "0,1,2" for every machine up to MAX (ids have at most 7 digits). */
static size_t id_list_size(const launch *L) { return (size_t)L->max_machines * 8 + 8; }

/* "0,1,2": the machines marked in `set` (ids in order), into buf of id_list_size() bytes */
static void id_list(const launch *L, const unsigned char *set, char *buf) {
    size_t u = 0, len = id_list_size(L);
    buf[0] = '\0';
    for (int id = 0; id < L->max_machines && u + 9 < len; id++)
        if (set[id]) u += (size_t)snprintf(buf + u, len - u, "%s%d", u ? "," : "", id);
}

static int member_count(const launch *L, const unsigned char *set) {
    int n = 0;
    for (int id = 0; id < L->max_machines; id++) n += set[id] != 0;
    return n;
}

/* Machine 0, at a restart: which members of the failed round stopped their processes (and rejoin), and
 * which are gone (no heartbeat for BEAT_DEAD_MS); L->member marks the first M_IN, the others M_GONE.
 * Waits for each member until it has said one or the other, up to `deadline`. */
static int elastic_survivors(launch *L, int64_t deadline) {
    int64_t *beat = calloc((size_t)L->max_machines, sizeof *beat);
    int64_t *since = calloc((size_t)L->max_machines, sizeof *since);
    if (!beat || !since) {
        free(beat);
        free(since);
        return fail_msg("out of memory");
    }
    ca_store_ref s = ca_store_client_ref(L->client);
    for (int pending = 1; pending;) {
        pending = 0;
        int64_t now = ca_now_ms();
        for (int id = 1; id < L->max_machines; id++) {
            if (L->member[id] != M_IN) continue;   /* not heard from yet */
            char key[96];
            int64_t n = 0;
            snprintf(key, sizeof key, "caccel/launch/restart/%d/stopped/%d", L->restart_count, id);
            if (s.ops->check(s.store, key) == CA_OK) {
                L->member[id] = M_STOPPED;
                continue;
            }
            ca_clear_error();
            snprintf(key, sizeof key, "caccel/elastic/beat/%d", id);
            if (s.ops->add(s.store, key, 0, &n) != CA_OK) ca_clear_error();
            if (n != beat[id] || !since[id]) beat[id] = n, since[id] = now;
            if (now - since[id] >= BEAT_DEAD_MS || now >= deadline) {
                fprintf(stderr, "caccel %s: machine %d has not answered for %d s: it leaves the job\n", cmd_name, id,
                        (int)((now - since[id]) / 1000));
                L->member[id] = M_GONE;
                continue;
            }
            pending = 1;
        }
        if (pending) usleep(100 * 1000);
    }
    free(beat);
    free(since);
    for (int id = 1; id < L->max_machines; id++)
        if (L->member[id] == M_STOPPED) L->member[id] = M_IN;
    return 0;
}

/* An elastic restart: the machines that stopped say so (machine 0 waits for them, and no longer for one
 * that is gone), machine 0 replaces the store, the others rejoin it. Machine 0 holds the store: when it
 * is gone, the job cannot go on. */
static int agree_restart_elastic(launch *L) {
    char key[96], gen[64];
    snprintf(gen, sizeof gen, "caccel/launch/restart/%d/store", L->restart_count);
    int64_t deadline = ca_now_ms() + (int64_t)grace_s() * 1000 + 30000;
    ca_store_ref s = ca_store_client_ref(L->client);
    if (L->machine_rank != 0) {
        snprintf(key, sizeof key, "caccel/launch/restart/%d/stopped/%d", L->restart_count, L->machine_rank);
        if (s.ops->set(s.store, key, "1", 1) != CA_OK) ca_clear_error();   /* machine 0 may be gone */
        return rejoin_store(L, gen, deadline);
    }
    if (elastic_survivors(L, deadline) != 0 || fresh_store(L) != 0) return 1;
    s = ca_store_client_ref(L->client);
    if (s.ops->set(s.store, gen, "1", 1) != CA_OK) return ca_cli_fail(cmd_name);
    return 0;
}

/* Machine 0: the machines that joined this round's store (ids 0..MAX-1), marked in `joined`. */
static int elastic_joined(launch *L, unsigned char *joined) {
    ca_store_ref s = ca_store_client_ref(L->client);
    for (int id = 0; id < L->max_machines; id++) {
        char key[64];
        snprintf(key, sizeof key, "caccel/elastic/join/%d", id);
        joined[id] = s.ops->check(s.store, key) == CA_OK;
        if (!joined[id]) ca_clear_error();
    }
    return member_count(L, joined);
}

/* Machine 0, at a restart that lets a machine join: members of the last round did not come back (`left`:
 * gone, or stopped and not rejoined). That is a failure, as a machine that dies while the group runs
 * is, and counts against --max_restarts (every machine adopts machine 0's count with the round). With
 * none left, the job ends: the machines that joined this round learn it in the store (elastic_dismiss
 * waits for them). Returns 0 to go on. */
static int grow_lost(launch *L, const unsigned char *joined, const char *left) {
    if (L->failures < L->max_restarts) {
        L->failures++;
        fprintf(stderr, "caccel %s: machine(s) %s left while the group restarted to let a machine join: a failure "
                "(restart %d of %d)\n", cmd_name, left, L->failures, L->max_restarts);
        return 0;
    }
    for (int id = 0; id < L->max_machines; id++)
        if (joined[id]) L->member[id] = M_OUT;   /* no member any more: each is told the job has ended */
    return fail_msg("machine(s) %s left while the group restarted to let a machine join: a failure, and "
                    "--max_restarts %d allows no more restarts (%d used): the job ends", left, L->max_restarts,
                    L->failures);
}

/* Machine 0: the round's members (`joined`, n of them) and the change from the last round, in the
 * store for every machine; L->member becomes `joined`. */
static int elastic_publish(launch *L, const unsigned char *joined, int n) {
    size_t cap = id_list_size(L), ccap = 3 * cap + 200;
    char *ids = malloc(cap), *left = malloc(cap), *came = malloc(cap), *change = malloc(ccap);
    unsigned char *diff = calloc((size_t)L->max_machines, 1);
    int rc = 0;
    if (!ids || !left || !came || !change || !diff) {
        rc = fail_msg("out of memory");
        goto out;
    }
    for (int id = 0; id < L->max_machines; id++)
        diff[id] = (L->member[id] == M_IN || L->member[id] == M_GONE) && !joined[id];
    id_list(L, diff, left);
    for (int id = 0; id < L->max_machines; id++)
        diff[id] = (L->member[id] == M_OUT || L->member[id] == M_WAITING) && joined[id];
    id_list(L, diff, came);
    id_list(L, joined, ids);
    if (L->growing && left[0]) {
        rc = grow_lost(L, joined, left);
        if (rc) goto out;
    }
    if (!L->restart_count)
        snprintf(change, ccap, "machines %s joined (%d of --num_machines %d:%d)", ids, n, L->min_machines,
                 L->max_machines);
    else
        snprintf(change, ccap, "%s%s%s%s%s%sthe job goes on with machines %s (%d of --num_machines %d:%d)",
                 left[0] ? "machine(s) " : "", left, !left[0] ? "" : L->growing ? " left during the restart (a failure); "
                 : " left; ", came[0] ? "machine(s) " : "", came,
                 came[0] ? " joined; " : "", ids, n, L->min_machines, L->max_machines);
    memcpy(L->member, joined, (size_t)L->max_machines);
    ca_store_ref s = ca_store_client_ref(L->client);
    char round[32];   /* "ROUND FAILURES": a machine that joins later counts restarts as the others do */
    snprintf(round, sizeof round, "%d %d", L->restart_count, L->failures);
    if (s.ops->set(s.store, "caccel/elastic/round", round, strlen(round)) != CA_OK ||
        s.ops->set(s.store, "caccel/elastic/change", change, strlen(change)) != CA_OK ||
        s.ops->set(s.store, "caccel/elastic/members", ids, strlen(ids)) != CA_OK)
        rc = ca_cli_fail(cmd_name);
out:
    free(ids);
    free(left);
    free(came);
    free(change);
    free(diff);
    return rc;
}

/* Machine 0 closes the round: the first one admits up to MAX machines, waiting join_timeout for MIN of
 * them and then last_call_timeout for more; a restart waits for the machines that stopped (L->member)
 * to rejoin, admits whoever else is there, and needs MIN of them. Publishes the members and the change. */
static int elastic_close(launch *L) {
    unsigned char *joined = calloc((size_t)L->max_machines, 1);
    if (!joined) return fail_msg("out of memory");
    int64_t start = ca_now_ms(), last_call = 0;
    int64_t end = L->restart_count ? start + (int64_t)grace_s() * 1000 + 30000 : start + (int64_t)L->join_timeout_s * 1000;
    int n;
    for (;;) {
        n = elastic_joined(L, joined);
        int64_t now = ca_now_ms();
        bool all_back = true;
        for (int id = 0; id < L->max_machines; id++)
            all_back &= (L->member[id] != M_IN && L->member[id] != M_WAITING) || joined[id];
        if (n == L->max_machines || (L->restart_count && all_back && n >= L->min_machines)) break;
        if (!L->restart_count && n >= L->min_machines && !last_call) last_call = now + (int64_t)L->last_call_s * 1000;
        if (last_call && now >= last_call) break;
        if (now >= end && n >= L->min_machines) break;
        if (now >= end || (L->restart_count && all_back)) {
            char *ids = malloc(id_list_size(L));
            if (ids) id_list(L, joined, ids);
            free(joined);
            int rc = fail_msg("the rendezvous has %d machine(s) (%s) after %d s: --num_machines %d:%d needs at least %d",
                              n, ids ? ids : "?", (int)((now - start) / 1000), L->min_machines, L->max_machines,
                              L->min_machines);
            free(ids);
            return rc;
        }
        usleep(100 * 1000);
    }
    int rc = elastic_publish(L, joined, n);
    free(joined);
    return rc;
}

/* Every machine: the members machine 0 published for this round (waiting for them up to `deadline`),
 * this machine's place among them, the job's new size. */
static int elastic_read_members(launch *L, int64_t deadline) {
    ca_store_ref s = ca_store_client_ref(L->client);
    char why[256];
    while (s.ops->check(s.store, "caccel/elastic/members") != CA_OK) {
        ca_clear_error();
        if (L->machine_rank != 0 && job_ended(L, s)) return 1;
        if (L->machine_rank != 0 && machine0_gone(L, why, sizeof why))
            return fail_msg("machine 0 is gone (its rendezvous store at %s:%d: %s) before it closed round %d; it "
                            "holds the rendezvous, and an elastic job cannot go on without it (as with torchrun's c10d "
                            "rendezvous)", L->master_addr, L->port, why, L->restart_count);
        if (ca_now_ms() >= deadline)
            return fail_msg("machine 0 (%s:%d) closed no rendezvous round within %d s", L->master_addr, L->port,
                            L->join_timeout_s + L->last_call_s);
        usleep(100 * 1000);
    }
    size_t cap = id_list_size(L), ccap = 3 * cap + 200, len = cap - 1, clen = ccap - 1;
    char *ids = malloc(cap), *change = malloc(ccap);
    if (!ids || !change || s.ops->get(s.store, "caccel/elastic/members", ids, &len, STORE_IO_MS) != CA_OK ||
        s.ops->get(s.store, "caccel/elastic/change", change, &clen, STORE_IO_MS) != CA_OK) {
        int rc = ids && change ? ca_cli_fail(cmd_name) : fail_msg("out of memory");
        free(ids);
        free(change);
        return rc;
    }
    ids[len] = change[clen] = '\0';
    char r[32];   /* "ROUND FAILURES": machine 0 counts a member lost at a grow as a failure (grow_lost) */
    size_t rlen = sizeof r - 1;
    int rnd, failures;
    if (s.ops->get(s.store, "caccel/elastic/round", r, &rlen, STORE_IO_MS) != CA_OK) ca_clear_error();
    else if (r[rlen] = '\0', sscanf(r, "%d %d", &rnd, &failures) == 2) L->failures = failures;
    memset(L->member, 0, (size_t)L->max_machines);
    L->group_rank = -1;
    int n = 0;
    for (char *p = ids, *end; *p; p = *end == ',' ? end + 1 : end) {
        int id = (int)strtol(p, &end, 10);
        if (end == p) break;   /* not a list machine 0 writes */
        if (id == L->machine_rank) L->group_rank = n;
        if (id >= 0 && id < L->max_machines) L->member[id] = M_IN;
        n++;
    }
    if (L->group_rank >= 0) fprintf(stderr, "caccel %s: membership (round %d): %s\n", cmd_name, L->restart_count, change);
    free(ids);
    free(change);
    if (L->group_rank < 0) return 3;   /* the round closed without this machine: it joins the next */
    L->nmachines = n;
    L->nproc = n * L->nlocal;
    set_world_env(L);
    return 0;
}

/* A machine that came after its round closed: machine 0 has seen it (elastic_watch) and the running
 * group stops at its next checkpoint; this machine waits for the store of that restart (up to
 * join_timeout) and joins its round. */
static int elastic_wait_next(launch *L) {
    char r[32], gen[64];
    size_t len = sizeof r - 1;
    ca_store_ref s = ca_store_client_ref(L->client);
    if (s.ops->get(s.store, "caccel/elastic/round", r, &len, STORE_IO_MS) != CA_OK) return ca_cli_fail(cmd_name);
    r[len] = '\0';
    if (sscanf(r, "%d %d", &L->restart_count, &L->failures) != 2) return fail_msg("machine 0 wrote round '%s'", r);
    L->restart_count++;   /* the restart that takes this machine in: a grow, which --max_restarts does not count */
    fprintf(stderr, "caccel %s: machine %d waits to join: the running group takes it in at its next checkpoint\n",
            cmd_name, L->machine_rank);
    snprintf(gen, sizeof gen, "caccel/launch/restart/%d/store", L->restart_count);
    return rejoin_store(L, gen, ca_now_ms() + (int64_t)L->join_timeout_s * 1000);
}

/* One rendezvous round of an elastic job, before its processes start: every machine joins (machine 0
 * closes the round), then learns its place; one that came too late waits for the next round. */
static int elastic_round(launch *L) {
    for (;;) {
        char key[64], host[256] = "";
        if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
        snprintf(key, sizeof key, "caccel/elastic/join/%d", L->machine_rank);
        ca_store_ref s = ca_store_client_ref(L->client);
        if (s.ops->set(s.store, key, host, strlen(host)) != CA_OK) return ca_cli_fail(cmd_name);
        if (L->machine_rank == 0 && elastic_close(L) != 0) return 1;
        int64_t wait_s = (int64_t)L->join_timeout_s + L->last_call_s + grace_s() + 30;
        int rc = elastic_read_members(L, ca_now_ms() + wait_s * 1000);
        if (rc != 3) return rc;
        if (elastic_wait_next(L) != 0) return 1;
    }
}

/* Machine 0, when the job ends: the machines that wait to join (their join key is in the store, and they
 * are no members) learn it now instead of waiting out join_timeout; machine 0 keeps the store up until
 * each has said it has seen it, or 10 s. */
static void elastic_dismiss(launch *L, int code) {
    if (!L->elastic || L->machine_rank != 0 || !L->client) return;
    ca_store_ref s = ca_store_client_ref(L->client);
    char key[64], v[16];
    snprintf(v, sizeof v, "%d", code);
    if (s.ops->set(s.store, "caccel/elastic/ended", v, strlen(v)) != CA_OK) {
        ca_clear_error();
        return;
    }
    int64_t deadline = ca_now_ms() + 10000;
    for (int id = 1; id < L->max_machines; id++) {
        snprintf(key, sizeof key, "caccel/elastic/join/%d", id);
        if (L->member[id] == M_IN || s.ops->check(s.store, key) != CA_OK) {
            ca_clear_error();
            continue;
        }
        snprintf(key, sizeof key, "caccel/elastic/left/%d", id);
        bool seen;
        while (!(seen = s.ops->check(s.store, key) == CA_OK) && ca_now_ms() < deadline) {
            ca_clear_error();
            usleep(50 * 1000);
        }
        ca_clear_error();
        fprintf(stderr, "caccel %s: machine %d waited to join: %s\n", cmd_name, id,
                seen ? "it has learnt that the job has ended" : "it did not answer within 10 s; the job ends");
    }
}

static void set_restart_env(const launch *L) {
    setenv_int("TORCHELASTIC_RESTART_COUNT", L->failures);
    setenv_int("CACCEL_RESTART_COUNT", L->restart_count);
    setenv_int("TORCHELASTIC_MAX_RESTARTS", L->max_restarts);
}

/* Runs the group, and as torchrun does with --max_restarts, starts the whole group again after a
 * failure until the restarts are used up. An interrupted launcher does not restart. */
static int spawn_and_supervise(launch *L, const sigset_t *old) {
    L->kids = calloc((size_t)L->nlocal, sizeof *L->kids);
    L->failed_order = calloc((size_t)L->nlocal, sizeof *L->failed_order);
    if (!L->kids || !L->failed_order) {
        free(L->kids);
        free(L->failed_order);
        return fail_msg("out of memory");
    }
    int code;
    for (;;) {
        if (L->elastic && elastic_round(L) != 0) {   /* a late machine learns the restart count here */
            code = L->ended ? L->ended > 1 : 1;         /* the job ended without it: its success or failure */
            break;
        }
        set_restart_env(L);
        bool spawn_failed = false;
        code = run_group(L, old, &spawn_failed);
        /* a group that stopped to let a machine join did not fail: torchrun counts only failures (a machine
         * that died is one) against --max_restarts */
        bool grow = L->regroup && !spawn_failed;
        L->growing = grow;
        if (L->store_lost) {
            fprintf(stderr, "caccel %s: machine 0 holds the rendezvous, and an elastic job cannot go on without it (as "
                    "with torchrun's c10d rendezvous): machine %d ends%s\n", cmd_name, L->machine_rank,
                    L->max_restarts > L->failures ? " without a restart" : "");
            if (!code) code = 1;
            break;
        }
        if (code == 0 || spawn_failed || L->interrupted || (!grow && L->failures >= L->max_restarts)) break;
        L->restart_count++;
        if (grow)
            fprintf(stderr, "caccel %s: restarting every process to let a machine join (not a failure: --max_restarts "
                    "%d used of %d)\n", cmd_name, L->failures, L->max_restarts);
        else
            fprintf(stderr, "caccel %s: restarting every process (restart %d of %d)\n", cmd_name, ++L->failures,
                    L->max_restarts);
        memset(L->kids, 0, (size_t)L->nlocal * sizeof *L->kids);
        L->stopping = false;
        L->first_fail = L->early_exit = -1;
        L->nfailed = 0;
        L->decide_at = 0;
        L->extended = false;
        L->remote_fail_code = 0;
        L->regroup = false;
        int agreed = L->elastic ? agree_restart_elastic(L) : L->nmachines > 1 ? agree_restart(L) : fresh_store(L);
        if (agreed != 0) {
            code = 1;
            break;
        }
    }
    elastic_dismiss(L, code);
    if (code != 0 && L->max_restarts > 0 && L->failures >= L->max_restarts && !L->interrupted && !L->ended)
        fprintf(stderr, "caccel %s: the job failed after %d restart(s) (--max_restarts %d)\n", cmd_name,
                L->failures, L->max_restarts);
    free(L->kids);
    free(L->failed_order);
    return code;
}

/* --rdzv_conf join_timeout=S,last_call_timeout=S (torchrun's keys; others are refused by name). It
 * replaces an earlier one (PET_RDZV_CONF), as torchrun's flag does: the keys not named take their defaults. */
static bool parse_rdzv_conf(launch *L, const char *v, const char *origin) {
    char *copy = strdup(v), *save = NULL;
    bool ok = copy != NULL;
    L->join_timeout_s = 600;   /* torchrun's defaults */
    L->last_call_s = 30;
    for (char *t = copy ? strtok_r(copy, ",", &save) : NULL; t && ok; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        int *dst = NULL;
        if (eq) *eq = '\0';
        if (strcmp(t, "join_timeout") == 0) dst = &L->join_timeout_s;
        else if (strcmp(t, "last_call_timeout") == 0) dst = &L->last_call_s;
        if (!dst || !eq || !parse_int(eq + 1, 0, 86400, dst)) {
            fail_msg("%s: '%s%s%s' is not join_timeout=SECONDS or last_call_timeout=SECONDS (0..86400)", origin,
                     t, eq ? "=" : "", eq ? eq + 1 : "");
            ok = false;
        }
    }
    free(copy);
    return ok;
}

/* torchrun's agent reads a flag not given from PET_<FLAG>: caccel launch reads those of its own flags
 * that are no configuration keys (PET_NNODES and PET_NODE_RANK are: config/config_keys.c); the flags,
 * read next, replace them. An empty variable counts as unset. Returns -1 to go on, else the exit code. */
static int env_flags(launch *L) {
    const char *v = getenv("PET_MAX_RESTARTS");
    if (v && *v && !parse_int(v, 0, 1000000, &L->max_restarts))
        return fail_msg("env PET_MAX_RESTARTS (--max_restarts) takes a count 0..1000000, not '%s'", v), 2;
    v = getenv("PET_RDZV_CONF");
    if (v && *v && !parse_rdzv_conf(L, v, "env PET_RDZV_CONF (--rdzv_conf)")) return 2;
    return -1;
}

/* The launcher's own flags, up to the program's name; the configuration flags are skipped here and
 * read by ca_config_load. Returns -1 to go on, else the exit code; *prog: the program's index. */
static int parse_flags(launch *L, int argc, char **argv, int *prog) {
    *prog = argc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (strcmp(a, "--") == 0 || a[0] != '-') {
            *prog = i + (a[0] == '-');
            break;
        }
        if (strcmp(a, "-h") == 0 || ca_cli_match_flag(a, "help", NULL)) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "-q") == 0 || ca_cli_match_flag(a, "quiet", NULL)) {
            L->quiet = true;
        } else if (strcmp(a, "-t") == 0 || ca_cli_match_flag(a, "tee", &v)) {
            if (!v && i + 1 < argc && (isdigit((unsigned char)argv[i + 1][0]))) v = argv[++i];
            if (!v) v = "3";
            if (!parse_tee(L, v)) return fail_msg("--tee takes 0-3 or local_rank:mode pairs, not '%s'", v), 2;
        } else if (ca_cli_match_flag(a, "log_dir", &v) || ca_cli_match_flag(a, "token_file", &v) ||
                   ca_cli_match_flag(a, "monitor_interval", &v) || ca_cli_match_flag(a, "max_restarts", &v) ||
                   ca_cli_match_flag(a, "role", &v) || ca_cli_match_flag(a, "ssh_port", &v) ||
                   ca_cli_match_flag(a, "ssh_opts", &v) || ca_cli_match_flag(a, "rdzv_conf", &v)) {
            if (!v) {
                if (i + 1 >= argc) return fail_msg("%s needs a value", a), 2;
                v = argv[++i];
            }
            if (ca_cli_match_flag(a, "log_dir", NULL)) L->log_dir = v;
            else if (ca_cli_match_flag(a, "token_file", NULL)) L->token_file = v;
            else if (ca_cli_match_flag(a, "ssh_opts", NULL)) L->ssh_opts = v;
            else if (ca_cli_match_flag(a, "rdzv_conf", NULL) && !parse_rdzv_conf(L, v, "--rdzv_conf")) return 2;
            else if (ca_cli_match_flag(a, "ssh_port", NULL) && !parse_int(v, 1, 65535, &L->ssh_port))
                return fail_msg("--ssh_port takes a port 1..65535, not '%s'", v), 2;
            else if (ca_cli_match_flag(a, "monitor_interval", NULL)) {
                char *end;
                L->monitor_interval = strtod(v, &end);
                if (*end || !(L->monitor_interval > 0) || L->monitor_interval > 3600)
                    return fail_msg("--monitor_interval takes seconds in (0, 3600], not '%s'", v), 2;
            } else if (ca_cli_match_flag(a, "max_restarts", NULL) && !parse_int(v, 0, 1000000, &L->max_restarts))
                return fail_msg("--max_restarts takes a count 0..1000000, not '%s'", v), 2;
        } else if (strcmp(a, "-m") == 0 || ca_cli_match_flag(a, "module", NULL)) {
            return fail_msg("-m/--module runs a Python module; caccel launches programs"), 2;
        } else if (!ca_cli_match_flag(a, "no_python", NULL)) {   /* --no_python: always true here */
            int n = ca_config_flag_arity(a);
            if (n < 0) {
                fprintf(stderr, "caccel %s: error: unknown flag %s\n", cmd_name, a);
                if (strcmp(cmd_name, "launch") == 0)
                    fprintf(stderr, "  hint: `caccel launch --help` lists the flags; the program and its own flags "
                                    "come after the program's name (or after --)\n");
                else
                    fprintf(stderr, "  hint: caccel %s takes the flags of caccel launch (`caccel launch --help` "
                                    "lists them)\n", cmd_name);
                return 2;
            }
            if (i + n >= argc) return fail_msg("%s needs a value", a), 2;
            i += n;
        }
    }
    if (*prog >= argc) {
        usage(stderr);
        return 2;
    }
    L->prog = argv + *prog;
    return -1;
}

/* The job's shape from the configuration: processes, machines, port, rendezvous address. Returns -1
 * to go on, else the exit code. */
static int resolve_job(launch *L, ca_config *cfg, const ca_settings *st) {
    L->nmachines = st->num_machines > 0 ? st->num_machines : 1;
    L->machine_rank = L->group_rank = st->machine_rank;
    L->max_machines = L->nmachines;   /* MAX of MIN:MAX: the configuration read it */
    L->timeout_ms = st->timeout_ms > 0 ? st->timeout_ms : 1800 * 1000;
    L->backend = st->backend;
    const char *defaulted[2];
    int nd = 0;
    L->nproc = st->num_processes < 1 ? L->nmachines : st->num_processes;
    if (st->num_processes < 1) defaulted[nd++] = "--num_processes";
    const char *pv = ca_config_get(cfg, "main_process_port");
    L->port_given = pv && strcmp(pv, "null") != 0;
    L->port = L->port_given ? st->main_process_port : DEFAULT_PORT;
    if (!L->port_given) defaulted[nd++] = "--main_process_port";
    if (nd && !L->quiet) {
        fprintf(stderr, "caccel %s: these values were not given and take their defaults:", cmd_name);
        for (int i = 0; i < nd; i++)
            fprintf(stderr, " %s=%d", defaulted[i], strcmp(defaulted[i], "--num_processes") == 0 ? L->nproc : L->port);
        fprintf(stderr, " (set them in the config file or on the command line to silence this)\n");
    }
    if (L->machine_rank < 0 || L->machine_rank >= L->nmachines)
        return fail_msg("--machine_rank %d is outside 0..%d (--num_machines %d)", L->machine_rank, L->nmachines - 1,
                        L->nmachines);
    if (L->nproc % L->nmachines != 0)
        return fail_msg("--num_processes %d (the whole job) is not a multiple of --num_machines %d", L->nproc,
                        L->nmachines);
    L->nlocal = L->nproc / L->nmachines;
    if (L->nlocal > MAX_LOCAL) return fail_msg("%d processes per machine: at most %d", L->nlocal, MAX_LOCAL);
    if (L->nmachines == 1) {
        snprintf(L->master_addr, sizeof L->master_addr, "127.0.0.1");
    } else if (!st->main_process_ip || !*st->main_process_ip || strcmp(st->main_process_ip, "null") == 0) {
        return fail_msg("--num_machines %d needs --main_process_ip (the address of machine 0)", L->nmachines);
    } else {
        snprintf(L->master_addr, sizeof L->master_addr, "%s", st->main_process_ip);
    }
    return -1;
}

/* mpirun starts the ranks with --backend mpi, and with an mpirun_hostfile (Accelerate's launcher
 * runs mpirun for it too). Returns -1 when caccel starts them itself, else the exit code. */
static int maybe_mpirun(launch *L, ca_config *cfg) {
    const char *hostfile = ca_config_get(cfg, "mpirun_config.mpirun_hostfile");
    bool has_hostfile = hostfile && strcmp(hostfile, "null") != 0;
    bool mpi = ca_registry_collective_needs_mpi_launcher(L->backend);
    if (has_hostfile && L->backend && !mpi)
        return fail_msg("mpirun_hostfile (%s) starts the processes through mpirun, which needs backend mpi, but "
                        "backend is %s (%s)", ca_config_origin(cfg, "mpirun_config.mpirun_hostfile"), L->backend,
                        ca_config_origin(cfg, "backend"));
    if (!mpi && !has_hostfile) return -1;
    if (L->elastic)
        return fail_msg("--num_machines %d:%d: mpirun starts a fixed set of processes, and elastic membership needs "
                        "caccel launch to start them (use backend gloo, or a fixed --num_machines)", L->min_machines,
                        L->max_machines), 2;
    if (L->max_restarts > 0)
        return fail_msg("--max_restarts %d: mpirun starts the processes with backend mpi, and restarts need "
                        "caccel launch to start them (use backend gloo)", L->max_restarts);
    if (L->nmachines > 1 && L->machine_rank != 0) {
        say(L, "backend mpi: mpirun on machine 0 starts every process; nothing to do here");
        return 0;
    }
    return run_mpirun(L, cfg);
}

/* With a hostfile (--hostfile, deepspeed_hostfile) this launcher starts every machine's launcher over ssh,
 * unless it is one of those (CACCEL_LAUNCH_REMOTE). Returns -1 to go on, else the exit code. */
static int maybe_hostfile(launch *L, ca_config *cfg, const ca_settings *st, int argc, char **argv, int prog) {
    const char *hostfile = ca_config_get(cfg, "deepspeed_config.deepspeed_hostfile");
    const char *remote = getenv("CACCEL_LAUNCH_REMOTE");
    if (remote && strcmp(remote, "1") == 0) {
        L->watch_stdin = true;
        return -1;
    }
    if (!hostfile || !*hostfile || strcmp(hostfile, "null") == 0) {
        if (L->ssh_port || L->ssh_opts) return fail_msg("--ssh_port and --ssh_opts need --hostfile"), 2;
        return -1;
    }
    const char *pv = ca_config_get(cfg, "main_process_port");
    ca_launch_hosts_opts o = {
        .cmd_name = cmd_name, .hostfile = hostfile, .config_file = ca_config_file(cfg), .ssh_port = L->ssh_port, .ssh_opts = L->ssh_opts,
        .num_processes = st->num_processes > 0 ? st->num_processes : 0,
        .num_machines = ca_config_source_of(cfg, "num_machines") != CA_SRC_DEFAULT ? st->num_machines : 0,
        .min_machines = L->min_machines,
        .main_process_ip = st->main_process_ip,
        .port = pv && strcmp(pv, "null") != 0 ? st->main_process_port : DEFAULT_PORT,
        .quiet = L->quiet, .argc = argc, .prog = prog, .argv = argv};
    return ca_launch_hosts(&o);
}

/* Starts the local ranks under the rendezvous store and supervises them. */
static int run_local(launch *L, ca_config *cfg, const ca_settings *st) {
    int rc = resolve_token(L);
    if (rc == 0) rc = start_store(L);
    if (rc == 0) rc = connect_store(L, L->timeout_ms);
    if (rc == 0) rc = setup_env(L, cfg, st);
    if (rc != 0) {
        ca_store_client_close(L->client);
        ca_store_server_stop(L->server);
        return rc;
    }
    /* signals arrive through a descriptor; children get the old mask back */
    sigset_t mask, old;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    /* a shell starts background jobs with SIGINT ignored: the launcher must still hear Ctrl-C and
     * pass it on; SIGHUP stays ignored under nohup */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    struct sigaction hup;
    if (sigaction(SIGHUP, NULL, &hup) == 0 && hup.sa_handler != SIG_IGN) sigaddset(&mask, SIGHUP);
    sigprocmask(SIG_BLOCK, &mask, &old);
    L->sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (L->sfd < 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        ca_store_client_close(L->client);
        ca_store_server_stop(L->server);
        return fail_msg("signalfd: %s", strerror(errno));
    }
    signal(SIGPIPE, SIG_IGN);
    int code = spawn_and_supervise(L, &old);
    close(L->sfd);
    sigprocmask(SIG_SETMASK, &old, NULL);
    ca_store_client_close(L->client);
    ca_store_server_stop(L->server);
    return code;
}

int ca_cmd_launch(int argc, char **argv) {
    if (argc > 0 && argv[0] && argv[0][0]) cmd_name = argv[0];
    launch L0 = {0}, *L = &L0;
    memset(L->tee_map, -1, sizeof L->tee_map);
    L->first_fail = -1;
    L->early_exit = -1;
    L->monitor_interval = 0.5;
    L->sfd = -1;
    L->join_timeout_s = 600;   /* torchrun's defaults */
    L->last_call_s = 30;
    int prog, rc = env_flags(L);
    if (rc < 0) rc = parse_flags(L, argc, argv, &prog);
    if (rc >= 0) return rc;
    ca_config *cfg = NULL;
    if (ca_config_create(&cfg) != CA_OK) return ca_cli_fail(cmd_name);
    rc = ca_config_load(cfg, NULL, prog, argv) != CA_OK ? ca_cli_fail(cmd_name) : -1;
    if (rc >= 0) {
        ca_config_destroy(cfg);
        return rc;
    }
    ca_settings st;
    ca_config_settings(cfg, &st);
    /* num_machines MIN:MAX (the flag, PET_NNODES or the config file): the configuration reads MAX */
    L->elastic = st.min_machines > 0;
    L->min_machines = st.min_machines;
    L->max_machines = st.num_machines;
    rc = maybe_hostfile(L, cfg, &st, argc, argv, prog);
    if (rc < 0) rc = resolve_job(L, cfg, &st);
    if (rc < 0 && L->elastic && !(L->member = calloc((size_t)L->max_machines, 1))) rc = fail_msg("out of memory");
    if (rc < 0) rc = maybe_mpirun(L, cfg);
    if (rc < 0) rc = run_local(L, cfg, &st);
    free(L->member);
    ca_config_destroy(cfg);
    return rc;
}
