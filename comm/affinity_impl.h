/* affinity_impl.h: enable_cpu_affinity: each local rank, and the OpenMP and BLAS threads it starts, bound to
 * its own cores of one NUMA node, through hwloc (docs/DISTRIBUTED.md, "Binding ranks to cores"). */
#ifndef CACCEL_AFFINITY_IMPL_H
#define CACCEL_AFFINITY_IMPL_H

#include "comm/procenv_impl.h"

#include <caccel/status.h>
#include <hwloc.h>
#include <stdbool.h>
#include <stddef.h>

/* Where a rank's set lies: filled by ca_affinity_rank_set. */
typedef struct ca_affinity_plan {
    int node;          /* logical index of the NUMA node among those with CPUs */
    int nodes;         /* NUMA nodes with CPUs (1 where the machine reports none) */
    int units;         /* cores (or PUs) in the set: the threads the rank runs */
    const char *unit;  /* "core" or "PU": PUs where the node has fewer cores than ranks */
    int ranks_on_node; /* local ranks placed on that node */
    bool shared;       /* more ranks on the node than PUs: the set is shared with other ranks */
} ca_affinity_plan;

/* The CPUs of local rank `local_rank` of `local_world` on `topo` (pure: reads the topology, binds
 * nothing). Ranks are spread over the NUMA nodes that have CPUs first, in blocks (2 ranks on 2 nodes:
 * one each; 4: two each); a node's cores are then split evenly and disjointly between its ranks, each
 * taking a contiguous run (at most `threads` cores when threads > 0). A node with fewer cores than
 * ranks is split by PUs; with fewer PUs than ranks, ranks share a PU and plan->shared says so. `out`
 * (allocated by the caller) receives the set. CA_ERR_INVALID for a rank outside [0, local_world). */
ca_status ca_affinity_rank_set(hwloc_topology_t topo, int local_world, int local_rank, int threads,
                               hwloc_bitmap_t out, ca_affinity_plan *plan);

/* "1 package, 2 NUMA nodes, 8 cores, 8 PUs" into buf. */
void ca_affinity_describe(hwloc_topology_t topo, char *buf, size_t len);

/* One line for rank `local_rank`: "CPUs 0-3 (4 cores of NUMA node 0)" into buf, or the error. */
ca_status ca_affinity_rank_line(hwloc_topology_t topo, int local_world, int local_rank, int threads, char *buf,
                                size_t len);

/* Binds this process (all its threads, and the threads it starts later, which inherit the binding) to
 * the set of its local rank from `pe`, and sets OMP_NUM_THREADS and OPENBLAS_NUM_THREADS to the set's
 * size unless one of them is set already (by the user, or by caccel launch from
 * num_cpu_threads_per_process). Call before the CPU device is opened. A process that is already bound
 * to fewer CPUs than it may use by anything but caccel launch (mpirun, srun, taskset) keeps that
 * binding, and the log says so; under caccel launch the ranks split the CPUs the launcher was given.
 * `origin` names where enable_cpu_affinity came from, for messages. Errors name the rank and the CPUs. */
ca_status ca_affinity_bind(const ca_procenv *pe, int threads, const char *origin);

#endif
