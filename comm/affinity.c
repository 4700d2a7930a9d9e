/* affinity.c: enable_cpu_affinity (Accelerate's set_numa_affinity, DeepSpeed's --bind_cores_to_rank):
 * each local rank bound to its own cores of one NUMA node, so that its OpenMP team and BLAS threads
 * stay on memory local to them and never share a core with another rank's.
 *
 * Through hwloc, the topology library Open MPI and Slurm use, rather than reading /sys: it knows the
 * NUMA nodes, packages, cores and hyperthreads of every platform and kernel version (including
 * machines whose /sys reports no NUMA node, offline CPUs and cgroup-restricted CPU sets), binds every
 * thread of the process in one call, and loads synthetic and XML topologies, which is how the tests
 * check machines this one is not. */
#include "comm/affinity_impl.h"

#include <caccel/log.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The i-th NUMA node that has CPUs (a node of memory alone, HBM or CXL, takes no rank); NULL past the last.
 * A topology without NUMA nodes counts as one: the machine. */
static hwloc_obj_t cpu_node(hwloc_topology_t topo, int i, int *count) {
    int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE), seen = 0;
    hwloc_obj_t found = NULL;
    for (int k = 0; k < n; k++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)k);
        if (!o || !o->cpuset || hwloc_bitmap_iszero(o->cpuset)) continue;
        if (seen == i) found = o;
        seen++;
    }
    if (seen == 0) {
        seen = 1;
        if (i == 0) found = hwloc_get_root_obj(topo);
    }
    if (count) *count = seen;
    return found;
}

/* Ranks in blocks over the nodes: rank r goes to node r * nodes / world, so that 2 ranks on 2 nodes
 * take one each and 4 take two each; `first` is that node's first rank, `count` its number of ranks. */
static void place(int nodes, int world, int rank, int *node, int *first, int *count) {
    long long n = (long long)rank * nodes / world;
    long long lo = (n * world + nodes - 1) / nodes, hi = ((n + 1) * world + nodes - 1) / nodes;
    *node = (int)n;
    *first = (int)lo;
    *count = (int)(hi - lo);
}

ca_status ca_affinity_rank_set(hwloc_topology_t topo, int local_world, int local_rank, int threads,
                               hwloc_bitmap_t out, ca_affinity_plan *plan) {
    if (!topo || !out || !plan) return ca_error(CA_ERR_INVALID, "ca_affinity_rank_set: NULL argument");
    if (local_world < 1 || local_rank < 0 || local_rank >= local_world)
        return ca_error(CA_ERR_INVALID, "enable_cpu_affinity: local rank %d is not in [0, %d) (the local world size)",
                        local_rank, local_world);
    memset(plan, 0, sizeof *plan);
    int first = 0;
    cpu_node(topo, 0, &plan->nodes);
    place(plan->nodes, local_world, local_rank, &plan->node, &first, &plan->ranks_on_node);
    hwloc_obj_t node = cpu_node(topo, plan->node, NULL);
    int k = plan->ranks_on_node, index = local_rank - first;
    /* cores, or PUs where the node has fewer cores than ranks (or reports no cores) */
    hwloc_obj_type_t type = HWLOC_OBJ_CORE;
    int units = hwloc_get_nbobjs_inside_cpuset_by_type(topo, node->cpuset, type);
    if (units < k) {
        type = HWLOC_OBJ_PU;
        units = hwloc_get_nbobjs_inside_cpuset_by_type(topo, node->cpuset, type);
    }
    if (units < 1) return ca_error(CA_ERR_BACKEND, "enable_cpu_affinity: NUMA node %d has no PU", plan->node);
    plan->unit = type == HWLOC_OBJ_CORE ? "core" : "PU";
    int lo, hi;
    if (units >= k) {   /* a contiguous run each: neighbours share caches, not cores */
        lo = (int)((long long)index * units / k);
        hi = (int)((long long)(index + 1) * units / k);
        if (threads > 0 && hi - lo > threads) hi = lo + threads;
    } else {            /* more ranks than PUs: spread them, sharing */
        lo = (int)((long long)index * units / k);
        hi = lo + 1;
        plan->shared = true;
    }
    hwloc_bitmap_zero(out);
    for (int u = lo; u < hi; u++) {
        hwloc_obj_t o = hwloc_get_obj_inside_cpuset_by_type(topo, node->cpuset, type, (unsigned)u);
        if (o) hwloc_bitmap_or(out, out, o->cpuset);
    }
    plan->units = hi - lo;
    return CA_OK;
}

static void count_of(hwloc_topology_t topo, hwloc_obj_type_t type, const char *name, const char *sep, char *buf,
                     size_t len) {
    int n = hwloc_get_nbobjs_by_type(topo, type);
    if (type == HWLOC_OBJ_NUMANODE) cpu_node(topo, 0, &n);
    size_t at = strlen(buf);
    if (at < len) snprintf(buf + at, len - at, "%s%d %s%s", sep, n, name, n == 1 ? "" : "s");
}

void ca_affinity_describe(hwloc_topology_t topo, char *buf, size_t len) {
    if (!len) return;
    buf[0] = '\0';
    count_of(topo, HWLOC_OBJ_PACKAGE, "package", "", buf, len);
    count_of(topo, HWLOC_OBJ_NUMANODE, "NUMA node", ", ", buf, len);
    count_of(topo, HWLOC_OBJ_CORE, "core", ", ", buf, len);
    count_of(topo, HWLOC_OBJ_PU, "PU", ", ", buf, len);
}

ca_status ca_affinity_rank_line(hwloc_topology_t topo, int local_world, int local_rank, int threads, char *buf,
                                size_t len) {
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) return ca_error(CA_ERR_NOMEM, "out of host memory");
    ca_affinity_plan p;
    ca_status s = ca_affinity_rank_set(topo, local_world, local_rank, threads, set, &p);
    if (s == CA_OK) {
        char cpus[256];
        hwloc_bitmap_list_snprintf(cpus, sizeof cpus, set);
        snprintf(buf, len, "CPUs %s (%d %s%s of NUMA node %d%s)", cpus, p.units, p.unit, p.units == 1 ? "" : "s",
                 p.node, p.shared ? ", shared: more local ranks than PUs" : "");
    }
    hwloc_bitmap_free(set);
    return s;
}

/* The set this process bound itself to, "" before: a second ca_accelerator_create in the same process finds
 * it bound, and must neither take its own binding for a launcher's nor split its set again. */
static pthread_mutex_t bound_mu = PTHREAD_MUTEX_INITIALIZER;
static char bound_here[256];

/* Binds to the plan's set and sizes the thread count to it. */
static ca_status bind_to(hwloc_topology_t topo, const ca_procenv *pe, int threads, const char *origin) {
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) return ca_error(CA_ERR_NOMEM, "out of host memory");
    ca_affinity_plan p;
    ca_status s = ca_affinity_rank_set(topo, pe->local_world_size, pe->local_rank, threads, set, &p);
    char cpus[256] = "";
    hwloc_bitmap_list_snprintf(cpus, sizeof cpus, set);
    if (s == CA_OK && hwloc_set_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) != 0)
        s = ca_error(CA_ERR_BACKEND, "enable_cpu_affinity (from %s): cannot bind local rank %d to CPUs %s: %s", origin,
                     pe->local_rank, cpus, strerror(errno));
    hwloc_bitmap_free(set);
    if (s != CA_OK) return s;
    snprintf(bound_here, sizeof bound_here, "%s", cpus);
    const char *omp = getenv("OMP_NUM_THREADS"), *blas = getenv("OPENBLAS_NUM_THREADS");
    bool user = (omp && *omp) || (blas && *blas);
    if (!user) {
        char num[16];
        snprintf(num, sizeof num, "%d", p.units);
        setenv("OMP_NUM_THREADS", num, 1);
        setenv("OPENBLAS_NUM_THREADS", num, 1);
    }
    if (p.shared)
        CA_LOG_W("enable_cpu_affinity: %d local ranks on NUMA node %d, which has fewer PUs: local rank %d shares "
                 "CPU %s with another rank", p.ranks_on_node, p.node, pe->local_rank, cpus);
    CA_LOG_I("enable_cpu_affinity (from %s): local rank %d of %d bound to CPUs %s (%d %s%s of NUMA node %d); %s",
             origin, pe->local_rank, pe->local_world_size, cpus, p.units, p.unit, p.units == 1 ? "" : "s", p.node,
             user ? "threads as OMP_NUM_THREADS/OPENBLAS_NUM_THREADS ask" : "OMP_NUM_THREADS set to the set's size");
    return CA_OK;
}

/* True when the process is bound to fewer CPUs than the topology allows it. */
static bool already_bound(hwloc_topology_t topo, hwloc_bitmap_t current) {
    if (hwloc_get_cpubind(topo, current, HWLOC_CPUBIND_PROCESS) != 0) return false;
    return !hwloc_bitmap_isincluded(hwloc_topology_get_allowed_cpuset(topo), current);
}

static ca_status bind_in(hwloc_topology_t topo, const ca_procenv *pe, int threads, const char *origin) {
    hwloc_bitmap_t current = hwloc_bitmap_alloc();
    if (!current) return ca_error(CA_ERR_NOMEM, "out of host memory");
    ca_status s = CA_OK;
    if (already_bound(topo, current)) {
        char cpus[256];
        hwloc_bitmap_list_snprintf(cpus, sizeof cpus, current);
        if (bound_here[0] && strcmp(cpus, bound_here) == 0) {   /* our own binding, from an earlier create */
            hwloc_bitmap_free(current);
            return CA_OK;
        }
        if (pe->launcher != CA_LAUNCHER_CACCEL) {
            /* mpirun's --bind-to, srun's --cpu-bind, taskset: the launcher placed this rank; keep it */
            CA_LOG_I("enable_cpu_affinity (from %s): local rank %d is already bound to CPUs %s (started by %s): "
                     "keeping that binding", origin, pe->local_rank, cpus, pe->launcher_name);
            hwloc_bitmap_free(current);
            return CA_OK;
        }
        /* caccel launch itself started inside a binding: its ranks share out the CPUs it was given */
        if (hwloc_topology_restrict(topo, current, 0) != 0)
            s = ca_error(CA_ERR_BACKEND, "enable_cpu_affinity: cannot restrict the topology to CPUs %s: %s", cpus,
                         strerror(errno));
    }
    hwloc_bitmap_free(current);
    return s == CA_OK ? bind_to(topo, pe, threads, origin) : s;
}

ca_status ca_affinity_bind(const ca_procenv *pe, int threads, const char *origin) {
    if (!pe) return ca_error(CA_ERR_INVALID, "ca_affinity_bind: NULL process environment");
    if (!origin) origin = "enable_cpu_affinity";
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0) return ca_error(CA_ERR_NOMEM, "hwloc: cannot create a topology");
    ca_status s = CA_OK;
    if (hwloc_topology_load(topo) != 0)
        s = ca_error(CA_ERR_BACKEND, "enable_cpu_affinity (from %s): hwloc cannot read this machine's topology: %s",
                     origin, strerror(errno));
    if (s == CA_OK) {
        pthread_mutex_lock(&bound_mu);
        s = bind_in(topo, pe, threads, origin);
        pthread_mutex_unlock(&bound_mu);
    }
    hwloc_topology_destroy(topo);
    return s;
}
