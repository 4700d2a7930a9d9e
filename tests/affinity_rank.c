/* A rank of tests/test_affinity_ranks.sh: prints the CPUs it is bound to before and after
 * ca_accelerator_create (which applies enable_cpu_affinity) and the thread count it was left with. */
#include <caccel/caccel.h>

#include <hwloc.h>
#include <stdio.h>
#include <stdlib.h>

static void cpus(hwloc_topology_t t, char *buf, size_t len) {
    hwloc_bitmap_t b = hwloc_bitmap_alloc();
    if (hwloc_get_cpubind(t, b, HWLOC_CPUBIND_PROCESS) != 0) hwloc_bitmap_zero(b);
    hwloc_bitmap_list_snprintf(buf, len, b);
    hwloc_bitmap_free(b);
}

int main(int argc, char **argv) {
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0 || hwloc_topology_load(t) != 0) return 2;
    char before[256], after[256];
    cpus(t, before, sizeof before);
    ca_accelerator *acc = NULL;
    ca_status s = ca_accelerator_create(&(ca_options){.argc = argc, .argv = argv}, &acc);
    if (s != CA_OK) {
        fprintf(stderr, "create: %s: %s\n", ca_status_name(s), ca_last_error());
        return 1;
    }
    cpus(t, after, sizeof after);
    const char *omp = getenv("OMP_NUM_THREADS");
    printf("rank %d: before %s after %s threads %s\n", ca_process_index(acc), before, after, omp ? omp : "unset");
    fflush(stdout);
    ca_accelerator_destroy(acc);
    hwloc_topology_destroy(t);
    return 0;
}
