/* slurm_impl.h: Slurm's per-node task counts, read by the launcher detection and by the CPU backend's thread count */
#ifndef CACCEL_SLURM_IMPL_H
#define CACCEL_SLURM_IMPL_H

#include <stdlib.h>

/* Tasks on node `node` (0-based) from Slurm's "2(x3),1" (SLURM_STEP_TASKS_PER_NODE: two tasks on
 * each of three nodes, then one); -1 when spec is NULL, malformed or has no such node. */
static inline int ca_slurm_tasks_on_node(const char *spec, int node) {
    if (!spec) return -1;
    int idx = 0;
    const char *p = spec;
    while (*p) {
        char *end;
        long n = strtol(p, &end, 10);
        if (end == p) return -1;
        long rep = 1;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x') return -1;
            rep = strtol(p + 2, &end, 10);
            if (*end != ')') return -1;
            p = end + 1;
        }
        if (node < idx + rep) return (int)n;
        idx += (int)rep;
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return -1;
}

#endif
