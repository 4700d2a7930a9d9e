/* enable_cpu_affinity's sets (comm/affinity.c) on synthetic topologies: two NUMA nodes of four cores, one
 * node of two cores, hyperthreaded cores; 1, 2, 4 and 8 local ranks. Each set lies inside one NUMA node,
 * no two ranks share a CPU (unless there are more ranks than PUs, which is said), and the ranks together
 * cover the nodes they are on. Then the binding of this process itself: bound, and the thread count
 * follows the set; already bound by another launcher, left alone. */
#include "comm/affinity_impl.h"

#include <caccel/caccel.h>

#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#define T_OK(expr)                                                                                   \
    do {                                                                                             \
        ca_status t_s_ = (expr);                                                                     \
        if (t_s_ != CA_OK) fail_msg("%s -> %s: %s", #expr, ca_status_name(t_s_), ca_last_error()); \
    } while (0)

static hwloc_topology_t synthetic(const char *desc) {
    hwloc_topology_t t;
    assert_int_equal(hwloc_topology_init(&t), 0);
    assert_int_equal(hwloc_topology_set_synthetic(t, desc), 0);
    assert_int_equal(hwloc_topology_load(t), 0);
    return t;
}

/* The NUMA node whose CPUs include all of `set`, or -1. */
static int node_holding(hwloc_topology_t t, hwloc_const_bitmap_t set) {
    int n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
    for (int i = 0; i < n; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, (unsigned)i);
        if (hwloc_bitmap_isincluded(set, o->cpuset)) return i;
    }
    return -1;
}

/* For `world` ranks: every set non-empty and inside one node, pairwise disjoint, together covering the
 * CPUs of the nodes used; returns how many nodes the ranks were spread over. */
static int check_world(const char *desc, int world, int threads, int want_units) {
    hwloc_topology_t t = synthetic(desc);
    hwloc_bitmap_t set = hwloc_bitmap_alloc(), all = hwloc_bitmap_alloc(), nodes_cpus = hwloc_bitmap_alloc();
    int used[64] = {0}, nused = 0;
    for (int r = 0; r < world; r++) {
        ca_affinity_plan p;
        T_OK(ca_affinity_rank_set(t, world, r, threads, set, &p));
        char cpus[128];
        hwloc_bitmap_list_snprintf(cpus, sizeof cpus, set);
        assert_false(hwloc_bitmap_iszero(set));
        assert_false(p.shared);
        if (want_units) assert_int_equal(p.units, want_units);
        assert_int_equal(hwloc_bitmap_weight(set), hwloc_get_nbobjs_inside_cpuset_by_type(t, set, HWLOC_OBJ_PU));
        int node = node_holding(t, set);
        if (node < 0) fail_msg("%s, %d ranks: rank %d's CPUs %s span NUMA nodes", desc, world, r, cpus);
        assert_int_equal(node, p.node);
        if (hwloc_bitmap_intersects(all, set))
            fail_msg("%s, %d ranks: rank %d's CPUs %s overlap another rank's", desc, world, r, cpus);
        hwloc_bitmap_or(all, all, set);
        if (!used[node]++) {
            nused++;
            hwloc_bitmap_or(nodes_cpus, nodes_cpus,
                            hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, (unsigned)node)->cpuset);
        }
    }
    if (threads == 0 && !hwloc_bitmap_isequal(all, nodes_cpus)) {
        char a[128], b[128];
        hwloc_bitmap_list_snprintf(a, sizeof a, all);
        hwloc_bitmap_list_snprintf(b, sizeof b, nodes_cpus);
        fail_msg("%s, %d ranks: the sets cover %s, not the nodes' CPUs %s", desc, world, a, b);
    }
    hwloc_bitmap_free(set);
    hwloc_bitmap_free(all);
    hwloc_bitmap_free(nodes_cpus);
    hwloc_topology_destroy(t);
    return nused;
}

static void test_two_nodes_of_four(void **state) {
    (void)state;
    const char *d = "pack:2 numa:1 core:4 pu:1";
    assert_int_equal(check_world(d, 1, 0, 4), 1);   /* one rank: all of node 0 */
    assert_int_equal(check_world(d, 2, 0, 4), 2);   /* NUMA nodes first: one rank on each */
    assert_int_equal(check_world(d, 4, 0, 2), 2);
    assert_int_equal(check_world(d, 8, 0, 1), 2);
    assert_int_equal(check_world(d, 3, 0, 0), 2);   /* uneven: 2 + 1 ranks, 2 + 2 and 4 cores */
    assert_int_equal(check_world(d, 2, 2, 2), 2);   /* num_cpu_threads_per_process 2: 2 cores each */
}

static void test_one_node_of_two(void **state) {
    (void)state;
    const char *d = "numa:1 core:2 pu:1";
    assert_int_equal(check_world(d, 1, 0, 2), 1);
    assert_int_equal(check_world(d, 2, 0, 1), 1);
    /* more ranks than PUs: each gets one PU, shared, and the plan says so */
    hwloc_topology_t t = synthetic(d);
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    int shared = 0;
    for (int r = 0; r < 4; r++) {
        ca_affinity_plan p;
        T_OK(ca_affinity_rank_set(t, 4, r, 0, set, &p));
        assert_int_equal(hwloc_bitmap_weight(set), 1);
        shared += p.shared;
    }
    assert_int_equal(shared, 4);
    char line[256];
    T_OK(ca_affinity_rank_line(t, 4, 3, 0, line, sizeof line));
    assert_non_null(strstr(line, "shared: more local ranks than PUs"));
    hwloc_bitmap_free(set);
    hwloc_topology_destroy(t);
}

/* Two cores of two hyperthreads each: 2 ranks take a core each, 4 ranks a PU each. */
static void test_hyperthreads(void **state) {
    (void)state;
    const char *d = "pack:1 numa:1 core:2 pu:2";
    assert_int_equal(check_world(d, 2, 0, 1), 1);
    assert_int_equal(check_world(d, 4, 0, 1), 1);
    hwloc_topology_t t = synthetic(d);
    char line[256], desc[256];
    T_OK(ca_affinity_rank_line(t, 2, 1, 0, line, sizeof line));
    assert_string_equal(line, "CPUs 2-3 (1 core of NUMA node 0)");
    T_OK(ca_affinity_rank_line(t, 4, 1, 0, line, sizeof line));
    assert_string_equal(line, "CPUs 1 (1 PU of NUMA node 0)");
    ca_affinity_describe(t, desc, sizeof desc);
    assert_string_equal(desc, "1 package, 1 NUMA node, 2 cores, 4 PUs");
    hwloc_topology_destroy(t);
}

static void test_bad_rank(void **state) {
    (void)state;
    hwloc_topology_t t = synthetic("numa:1 core:2 pu:1");
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    ca_affinity_plan p;
    assert_int_equal(ca_affinity_rank_set(t, 2, 2, 0, set, &p), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "local rank 2 is not in [0, 2)"));
    assert_int_equal(ca_affinity_rank_set(t, 0, 0, 0, set, &p), CA_ERR_INVALID);
    hwloc_bitmap_free(set);
    hwloc_topology_destroy(t);
}

static int bound_cpus(void) {
    cpu_set_t s;
    assert_int_equal(sched_getaffinity(0, sizeof s, &s), 0);
    return CPU_COUNT(&s);
}

/* This process, as the only local rank: bound to node 0's cores, OMP_NUM_THREADS follows; a user's count
 * is kept. Then bound to one CPU by "mpirun" (as --bind-to core does): the binding stays. */
static void test_bind_self(void **state) {
    (void)state;
    cpu_set_t orig;
    assert_int_equal(sched_getaffinity(0, sizeof orig, &orig), 0);
    ca_procenv pe = {.launcher = CA_LAUNCHER_NONE, .launcher_name = "none", .local_world_size = 1};
    unsetenv("OMP_NUM_THREADS");
    unsetenv("OPENBLAS_NUM_THREADS");
    T_OK(ca_affinity_bind(&pe, 0, "test"));
    char want[16];
    snprintf(want, sizeof want, "%d", bound_cpus());
    assert_non_null(getenv("OMP_NUM_THREADS"));
    assert_string_equal(getenv("OPENBLAS_NUM_THREADS"), want);
    setenv("OMP_NUM_THREADS", "7", 1);
    T_OK(ca_affinity_bind(&pe, 0, "test"));
    assert_string_equal(getenv("OMP_NUM_THREADS"), "7");
    if (CPU_COUNT(&orig) < 2) {
        sched_setaffinity(0, sizeof orig, &orig);
        return;   /* one CPU: no narrower binding to defer to */
    }
    /* mpirun bound rank 1 of 2 to the last CPU: kept, though the plan would give it another set */
    int last = -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &orig)) last = c;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(last, &one);
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    ca_procenv mpi = {.launcher = CA_LAUNCHER_MPI, .launcher_name = "mpirun (Open MPI)", .local_rank = 0,
                      .local_world_size = 2};
    unsetenv("OMP_NUM_THREADS");
    unsetenv("OPENBLAS_NUM_THREADS");
    T_OK(ca_affinity_bind(&mpi, 0, "test"));
    cpu_set_t now;
    assert_int_equal(sched_getaffinity(0, sizeof now, &now), 0);
    assert_true(CPU_EQUAL(&now, &one));
    assert_null(getenv("OMP_NUM_THREADS"));   /* left alone entirely: the thread count is mpirun's user's */
    /* under caccel launch (itself started inside that binding) the ranks split the CPU it was given */
    ca_procenv cl = {.launcher = CA_LAUNCHER_CACCEL, .launcher_name = "caccel launch", .local_rank = 0,
                     .local_world_size = 1};
    T_OK(ca_affinity_bind(&cl, 0, "test"));
    assert_int_equal(sched_getaffinity(0, sizeof now, &now), 0);
    assert_true(CPU_EQUAL(&now, &one));
    assert_int_equal(sched_setaffinity(0, sizeof orig, &orig), 0);
}

/* A second ca_accelerator_create in a rank of caccel launch finds its own binding: the set stays (it is
 * not split again as if the launcher had been started inside it). Needs 4 CPUs to tell. */
static void test_bind_twice(void **state) {
    (void)state;
    cpu_set_t orig, first, now;
    assert_int_equal(sched_getaffinity(0, sizeof orig, &orig), 0);
    if (CPU_COUNT(&orig) < 4 || CPU_COUNT(&orig) < (int)sysconf(_SC_NPROCESSORS_ONLN)) {
        skip();
    }
    ca_procenv cl = {.launcher = CA_LAUNCHER_CACCEL, .launcher_name = "caccel launch", .local_rank = 0,
                     .local_world_size = 2};
    T_OK(ca_affinity_bind(&cl, 0, "test"));
    assert_int_equal(sched_getaffinity(0, sizeof first, &first), 0);
    T_OK(ca_affinity_bind(&cl, 0, "test"));
    assert_int_equal(sched_getaffinity(0, sizeof now, &now), 0);
    assert_true(CPU_EQUAL(&now, &first));
    assert_int_equal(sched_setaffinity(0, sizeof orig, &orig), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_nodes_of_four), cmocka_unit_test(test_one_node_of_two),
        cmocka_unit_test(test_hyperthreads),      cmocka_unit_test(test_bad_rank),
        cmocka_unit_test(test_bind_self),         cmocka_unit_test(test_bind_twice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
