/* Who started this process: caccel launch, torchrun-style variables, mpirun, srun or nothing; the store. */
#include "comm/procenv_impl.h"
#include "comm/store_impl.h"

#include <caccel/caccel.h>

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#define T_OK(expr)                                                                                   \
    do {                                                                                             \
        ca_status t_s_ = (expr);                                                                     \
        if (t_s_ != CA_OK) fail_msg("%s -> %s: %s", #expr, ca_status_name(t_s_), ca_last_error()); \
    } while (0)

static ca_procenv detect_ok(char *const *env) {
    ca_procenv pe;
    T_OK(ca_procenv_detect_from(env, &pe));
    return pe;
}

static void detect_fails(char *const *env, const char *names) {
    ca_procenv pe;
    assert_int_equal(ca_procenv_detect_from(env, &pe), CA_ERR_CONFIG);
    if (!strstr(ca_last_error(), names)) fail_msg("message '%s' does not name %s", ca_last_error(), names);
}

static void test_nothing(void **state) {
    (void)state;
    char *env[] = {"HOME=/root", "PATH=/bin", NULL};
    ca_procenv pe = detect_ok(env);
    assert_int_equal(pe.launcher, CA_LAUNCHER_NONE);
    assert_int_equal(pe.world_size, 1);
    assert_int_equal(pe.rank, 0);
    assert_string_equal(ca_procenv_pick_backend(&pe, NULL), "single");
}

static void test_caccel_launch(void **state) {
    (void)state;
    char *env[] = {"RANK=5", "WORLD_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4", "GROUP_RANK=1",
                   "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29511", "CACCEL_JOB_TOKEN=abc", "CACCEL_LAUNCHER=caccel",
                   "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=1", NULL};
    ca_procenv pe = detect_ok(env);
    assert_int_equal(pe.launcher, CA_LAUNCHER_CACCEL);
    assert_int_equal(pe.rank, 5);
    assert_int_equal(pe.world_size, 8);
    assert_int_equal(pe.local_rank, 1);
    assert_int_equal(pe.local_world_size, 4);
    assert_int_equal(pe.node_rank, 1);
    assert_true(pe.store_served);
    assert_false(pe.under_mpi);
    assert_string_equal(pe.master_addr, "10.0.0.1");
    assert_int_equal(pe.master_port, 29511);
    assert_string_equal(pe.token, "abc");
    assert_string_equal(ca_procenv_pick_backend(&pe, NULL), "gloo");
    assert_string_equal(ca_procenv_pick_backend(&pe, "mpi"), "mpi");
    assert_string_equal(ca_procenv_pick_backend(&pe, "auto"), "gloo");
}

static void test_torchrun_style(void **state) {
    (void)state;
    char *env[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=localhost", "MASTER_PORT=1234", NULL};
    ca_procenv pe = detect_ok(env);
    assert_int_equal(pe.launcher, CA_LAUNCHER_ENV);
    assert_false(pe.store_served);   /* rank 0 serves it */
    assert_int_equal(pe.local_world_size, 2);
}

static void test_open_mpi(void **state) {
    (void)state;
    char *env[] = {"OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=1",
                   "OMPI_COMM_WORLD_LOCAL_SIZE=2", NULL};
    ca_procenv pe = detect_ok(env);
    assert_int_equal(pe.launcher, CA_LAUNCHER_MPI);
    assert_true(pe.under_mpi);
    assert_int_equal(pe.rank, 3);
    assert_int_equal(pe.local_rank, 1);
    assert_int_equal(pe.local_world_size, 2);
    assert_string_equal(ca_procenv_pick_backend(&pe, NULL), "mpi");
    assert_string_equal(ca_procenv_pick_backend(&pe, "gloo"), "gloo");
}

static void test_mpich_and_pmix(void **state) {
    (void)state;
    char *hydra[] = {"PMI_RANK=2", "PMI_SIZE=3", "MPI_LOCALRANKID=2", "MPI_LOCALNRANKS=3", NULL};
    ca_procenv pe = detect_ok(hydra);
    assert_int_equal(pe.launcher, CA_LAUNCHER_MPI);
    assert_int_equal(pe.rank, 2);
    assert_int_equal(pe.world_size, 3);
    char *pmix[] = {"PMIX_RANK=1", "SLURM_NTASKS=2", NULL};
    pe = detect_ok(pmix);
    assert_true(pe.under_mpi);
    assert_int_equal(pe.world_size, 2);
    char *pmix_alone[] = {"PMIX_RANK=1", NULL};
    detect_fails(pmix_alone, "PMIX_RANK");
}

static void test_srun(void **state) {
    (void)state;
    char *env[] = {"SLURM_PROCID=5", "SLURM_STEP_ID=0", "SLURM_STEP_NUM_TASKS=8", "SLURM_NTASKS=16",
                   "SLURM_LOCALID=1", "SLURM_NODEID=1", "SLURM_STEP_TASKS_PER_NODE=4(x2)",
                   "SLURM_STEP_NODELIST=node[07-08]", "SLURM_JOB_ID=123456", "CACCEL_JOB_TOKEN=t", NULL};
    ca_procenv pe = detect_ok(env);
    assert_int_equal(pe.launcher, CA_LAUNCHER_SLURM);
    assert_int_equal(pe.rank, 5);
    assert_int_equal(pe.world_size, 8);
    assert_int_equal(pe.local_rank, 1);
    assert_int_equal(pe.local_world_size, 4);
    assert_int_equal(pe.node_rank, 1);
    assert_string_equal(pe.master_addr, "node07");
    assert_int_equal(pe.master_port, 29500 + 456);
    assert_string_equal(ca_procenv_pick_backend(&pe, NULL), "gloo");
    /* uneven nodes: "3,2(x2)" -> node 2 has 2 tasks */
    char *uneven[] = {"SLURM_PROCID=6", "SLURM_STEP_ID=0", "SLURM_STEP_NUM_TASKS=7", "SLURM_LOCALID=1",
                      "SLURM_NODEID=2", "SLURM_STEP_TASKS_PER_NODE=3,2(x2)", "MASTER_ADDR=head", NULL};
    pe = detect_ok(uneven);
    assert_int_equal(pe.local_world_size, 2);
    assert_string_equal(pe.master_addr, "head");
    /* the batch script itself (no step) is one process */
    char *batch[] = {"SLURM_PROCID=0", "SLURM_NTASKS=16", "SLURM_JOB_ID=1", NULL};
    pe = detect_ok(batch);
    assert_int_equal(pe.launcher, CA_LAUNCHER_NONE);
    assert_int_equal(pe.world_size, 1);
}

static void test_inconsistent(void **state) {
    (void)state;
    char *a[] = {"RANK=4", "WORLD_SIZE=4", NULL};
    detect_fails(a, "RANK/WORLD_SIZE");
    char *b[] = {"RANK=1", NULL};
    detect_fails(b, "WORLD_SIZE");
    char *c[] = {"RANK=one", "WORLD_SIZE=2", NULL};
    detect_fails(c, "RANK='one'");
    char *c2[] = {"RANK=1\nrank 0: done", "WORLD_SIZE=2", NULL};   /* escaped: the error stays one line */
    detect_fails(c2, "environment variable RANK='1\\nrank 0: done' is not an integer");
    assert_null(strchr(ca_last_error(), '\n'));
    char *d[] = {"RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2", NULL};
    detect_fails(d, "LOCAL_RANK");
    char *e[] = {"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=2", NULL};
    detect_fails(e, "OMPI_COMM_WORLD_RANK");
    char *f[] = {"RANK=0", "WORLD_SIZE=0", NULL};
    detect_fails(f, "world size 0");
    char *g[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=70000", NULL};
    detect_fails(g, "MASTER_PORT");
    char *h[] = {"SLURM_PROCID=0", "SLURM_STEP_ID=0", "SLURM_STEP_NUM_TASKS=4", "SLURM_LOCALID=0", "SLURM_NODEID=0",
                 "SLURM_STEP_TASKS_PER_NODE=garbage", NULL};
    detect_fails(h, "SLURM_STEP_TASKS_PER_NODE");
}

typedef struct joiner {
    ca_procenv pe;
    ca_status st;
    ca_store_client *cl;
    ca_store_server *srv;
} joiner;

static void *join_store(void *arg) {
    joiner *j = arg;
    j->st = ca_procenv_store(&j->pe, 10000, &j->cl, &j->srv);
    return NULL;
}

/* Without a launcher, rank 0 serves the store on MASTER_ADDR:MASTER_PORT and the others reach it. */
static void test_rank0_serves_store(void **state) {
    (void)state;
    ca_store_server *probe = NULL;
    T_OK(ca_store_server_start("127.0.0.1", 0, "x", &probe, NULL));
    char port[32];
    snprintf(port, sizeof port, "MASTER_PORT=%d", ca_store_server_port(probe));
    ca_store_server_stop(probe);
    char *e0[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", port, "CACCEL_JOB_TOKEN=tok", NULL};
    char *e1[] = {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", port, "CACCEL_JOB_TOKEN=tok", NULL};
    joiner j[2] = {{.pe = detect_ok(e1)}, {.pe = detect_ok(e0)}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, join_store, &j[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++)
        if (j[i].st != CA_OK) fail_msg("rank %d: %s", j[i].pe.rank, ca_last_error());
    assert_null(j[0].srv);       /* rank 1 only connects */
    assert_non_null(j[1].srv);   /* rank 0 serves */
    ca_store_ref a = ca_store_client_ref(j[0].cl), b = ca_store_client_ref(j[1].cl);
    T_OK(a.ops->set(a.store, "k", "v", 1));
    T_OK(b.ops->check(b.store, "k"));
    for (int i = 0; i < 2; i++) ca_store_client_close(j[i].cl);
    ca_store_server_stop(j[1].srv);
    /* no token: refused before any connection */
    char *nt[] = {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", port, NULL};
    ca_procenv pe = detect_ok(nt);
    ca_store_client *cl = NULL;
    ca_store_server *srv = NULL;
    assert_int_equal(ca_procenv_store(&pe, 1000, &cl, &srv), CA_ERR_CONFIG);
    assert_non_null(strstr(ca_last_error(), "CACCEL_JOB_TOKEN"));
    char *na[] = {"RANK=1", "WORLD_SIZE=2", "CACCEL_JOB_TOKEN=tok", NULL};
    pe = detect_ok(na);
    assert_int_equal(ca_procenv_store(&pe, 1000, &cl, &srv), CA_ERR_CONFIG);
    assert_non_null(strstr(ca_last_error(), "MASTER_ADDR"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nothing),
        cmocka_unit_test(test_caccel_launch),
        cmocka_unit_test(test_torchrun_style),
        cmocka_unit_test(test_open_mpi),
        cmocka_unit_test(test_mpich_and_pmix),
        cmocka_unit_test(test_srun),
        cmocka_unit_test(test_inconsistent),
        cmocka_unit_test(test_rank0_serves_store),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
