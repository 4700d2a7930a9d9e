/* Experiment trackers (caccel/tracking.h): log_with json and csv files read back, the run's
 * hyperparameters, the refused and unknown trackers, the call order. With arguments it is the C side
 * of tests/test_trackers_ranks.sh (under caccel launch):
 *   test_trackers --ranks DIR    every rank initialises the trackers and logs 3 steps into DIR
 * and of tests/test_trackers_tensorboard.sh:
 *   test_trackers --log DIR LOG_WITH   logs loss 1/(s+1) and accuracy s/8 at steps 0..4 into DIR/run
 *                                      (project "run", hyperparameter lr=0.01);
 *                                      exits 77 when this build does not write LOG_WITH */
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/caccel-trackers-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    t_rm_tree(g_dir);
    return 0;
}

/* The whole file (caller frees), or NULL when it does not exist. */
static char *slurp(const char *dir, const char *name) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 16);
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static ca_accelerator *make_acc(const char *log_with, const char *extra) {
    char lw[128], ld[300];
    snprintf(lw, sizeof lw, "log_with=%s", log_with);
    snprintf(ld, sizeof ld, "logging_dir=%s", g_dir);
    const char *settings[] = {"use_cpu=true", ld, log_with ? lw : extra, log_with ? extra : NULL, NULL};
    char *argv[] = {"test_trackers", NULL};
    ca_accelerator *acc = NULL;
    T_OK(ca_accelerator_create(&(ca_options){.argc = 1, .argv = argv, .settings = settings}, &acc));
    return acc;
}

static void test_json_and_csv(void **state) {
    (void)state;
    ca_accelerator *acc = make_acc("json,csv", NULL);
    const char *hp[] = {"lr=0.01", "batch_size=32", NULL};
    T_OK(ca_init_trackers(acc, "run1", hp));
    T_OK(ca_log_metrics(acc, (ca_metric[]){{"loss", 2.5}, {"accuracy", 0.125}}, 2, 0));
    T_OK(ca_log_metrics(acc, (ca_metric[]){{"loss", 1.25}}, 1, 10));
    T_OK(ca_log_metrics(acc, (ca_metric[]){{"eval,loss", 3}}, 1, -1));
    T_OK(ca_end_training(acc));
    char dir[300];
    snprintf(dir, sizeof dir, "%s/run1", g_dir);
    char *jl = slurp(dir, "metrics.jsonl"), *csv = slurp(dir, "metrics.csv"), *hpj = slurp(dir, "hparams.json");
    assert_non_null(jl);
    assert_non_null(csv);
    assert_non_null(hpj);
    /* three lines, in order, each with its step and values */
    char *l1 = strstr(jl, "{\"step\":0,\"time\":"), *l2 = strstr(jl, "{\"step\":10,"), *l3 = strstr(jl, "{\"step\":null,");
    assert_true(l1 && l2 && l3 && l1 < l2 && l2 < l3);
    assert_non_null(strstr(l1, "\"loss\":2.5,\"accuracy\":0.125}\n"));
    assert_non_null(strstr(l2, "\"loss\":1.25}\n"));
    assert_non_null(strstr(l3, "\"eval,loss\":3"));
    /* CSV: the header, one row per value, names with a comma quoted */
    assert_int_equal(strncmp(csv, "step,time,name,value\n0,", 23), 0);
    assert_non_null(strstr(csv, ",loss,2.5\n"));
    assert_non_null(strstr(csv, ",accuracy,0.125\n"));
    assert_non_null(strstr(csv, "\n10,"));
    assert_non_null(strstr(csv, "\n,"));
    assert_non_null(strstr(csv, ",\"eval,loss\",3\n"));
    /* hyperparameters: the program's pairs and the run's configuration with origins */
    assert_non_null(strstr(hpj, "\"project\":\"run1\""));
    assert_non_null(strstr(hpj, "\"lr\":\"0.01\""));
    assert_non_null(strstr(hpj, "\"batch_size\":\"32\""));
    assert_non_null(strstr(hpj, "\"log_with\":{"));
    assert_non_null(strstr(hpj, "\"value\":\"json,csv\""));
    assert_non_null(strstr(hpj, "\"use_cpu\":{"));
    free(jl), free(csv), free(hpj);
    ca_accelerator_destroy(acc);
}

/* A metrics file that cannot be written (here /dev/full, as on a full disk) fails ca_log_metrics
 * with the file and the reason, at every step from then on: never a silently short log. */
static void test_full_disk(void **state) {
    (void)state;
    if (access("/dev/full", W_OK) != 0) skip();
    char dir[300], link[400];
    snprintf(dir, sizeof dir, "%s/full", g_dir);
    snprintf(link, sizeof link, "%s/metrics.jsonl", dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    assert_int_equal(symlink("/dev/full", link), 0);
    ca_accelerator *acc = make_acc("json", NULL);
    T_OK(ca_init_trackers(acc, "full", NULL));
    for (int step = 0; step < 2; step++) {
        assert_int_equal(ca_log_metrics(acc, (ca_metric[]){{"loss", 1}}, 1, step), CA_ERR_IO);
        assert_non_null(strstr(ca_last_error(), "full/metrics.jsonl"));
        assert_non_null(strstr(ca_last_error(), strerror(ENOSPC)));
    }
    ca_end_training(acc);
    ca_accelerator_destroy(acc);
}

static void test_refused_trackers(void **state) {
    (void)state;
    static const char *const python[] = {"wandb", "comet_ml", "aim", "clearml", "dvclive", NULL};
    for (int i = 0; python[i]; i++) {
        ca_accelerator *acc = make_acc(python[i], NULL);   /* the key is accepted */
        assert_int_equal(ca_init_trackers(acc, "run", NULL), CA_ERR_UNSUPPORTED);
        char want[128];
        snprintf(want, sizeof want, "log_with %s (from ", python[i]);
        assert_non_null(strstr(ca_last_error(), want));
        assert_non_null(strstr(ca_last_error(), "it needs its Python client; caccel writes: json, csv"));
        ca_accelerator_destroy(acc);
    }
    ca_accelerator *acc = make_acc("jsno", NULL);
    assert_int_equal(ca_init_trackers(acc, "run", NULL), CA_ERR_CONFIG);
    assert_non_null(strstr(ca_last_error(), "log_with 'jsno'"));
    assert_non_null(strstr(ca_last_error(), "unknown tracker; known: json, csv"));
    ca_accelerator_destroy(acc);
    struct stat st;
    char p[300];
    snprintf(p, sizeof p, "%s/run", g_dir);
    assert_int_not_equal(stat(p, &st), 0);   /* nothing written */
}

static void test_call_order(void **state) {
    (void)state;
    ca_accelerator *acc = make_acc("json", NULL);
    assert_int_equal(ca_log_metrics(acc, (ca_metric[]){{"loss", 1}}, 1, 0), CA_ERR_STATE);
    assert_non_null(strstr(ca_last_error(), "call ca_init_trackers first"));
    assert_int_equal(ca_init_trackers(acc, "a/b", NULL), CA_ERR_INVALID);
    T_OK(ca_init_trackers(acc, "run", NULL));
    assert_int_equal(ca_init_trackers(acc, "run", NULL), CA_ERR_STATE);
    assert_int_equal(ca_log_metrics(acc, (ca_metric[]){{"", 1}}, 1, 0), CA_ERR_INVALID);
    ca_accelerator_destroy(acc);   /* closes the files without ca_end_training */

    /* without log_with every call is a no-op that succeeds */
    acc = make_acc(NULL, NULL);
    T_OK(ca_init_trackers(acc, "quiet", NULL));
    T_OK(ca_log_metrics(acc, (ca_metric[]){{"loss", 1}}, 1, 0));
    T_OK(ca_end_training(acc));
    T_OK(ca_end_training(acc));
    ca_accelerator_destroy(acc);
    char *none = slurp(g_dir, "quiet/hparams.json");
    assert_null(none);
}

/* The one entry of dir that `want` accepts (caller frees), NULL when there is none or several. */
static char *only_entry(const char *dir, bool (*want)(const char *name)) {
    DIR *d = opendir(dir);
    char *found = NULL;
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (want(e->d_name)) n++, free(found), found = strdup(e->d_name);
    if (d) closedir(d);
    if (n != 1) free(found), found = NULL;
    return found;
}

static bool is_new_experiment(const char *name) {
    return name[0] != '.' && strcmp(name, "0") != 0 && strspn(name, "0123456789") == strlen(name);
}

static bool is_run_id(const char *name) {
    return strlen(name) == 32 && strspn(name, "0123456789abcdef") == 32;
}

/* log_with mlflow: MLflow's file store under <logging_dir>/mlruns, read back by hand (the shell test
 * reads it with MLflow itself). */
static void test_mlflow_layout(void **state) {
    (void)state;
    ca_accelerator *acc = make_acc("mlflow", NULL);
    const char *hp[] = {"lr=0.01", "batch_size=32", NULL};
    T_OK(ca_init_trackers(acc, "run1", hp));
    T_OK(ca_log_metrics(acc, (ca_metric[]){{"loss", 2.5}, {"eval/accuracy", 0.125}}, 2, 0));
    T_OK(ca_log_metrics(acc, (ca_metric[]){{"loss", 1.25}}, 1, 10));
    T_OK(ca_log_metrics(acc, (ca_metric[]){{"loss", 1}}, 1, -1));
    assert_int_equal(ca_log_metrics(acc, (ca_metric[]){{"eval,loss", 3}}, 1, 0), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "metric name 'eval,loss'"));
    char root[300], p[700];
    snprintf(root, sizeof root, "%s/mlruns", g_dir);
    char *meta0 = slurp(root, "0/meta.yaml");
    assert_non_null(meta0);
    assert_non_null(strstr(meta0, "name: 'Default'\n"));
    char *exp = only_entry(root, is_new_experiment);
    assert_non_null(exp);
    snprintf(p, sizeof p, "%s/%s", root, exp);
    char *emeta = slurp(p, "meta.yaml"), *run = only_entry(p, is_run_id);
    assert_non_null(emeta);
    assert_non_null(strstr(emeta, "name: 'run1'\n"));
    assert_non_null(strstr(emeta, "lifecycle_stage: active\n"));
    assert_non_null(run);
    snprintf(p, sizeof p, "%s/%s/%s", root, exp, run);
    char *rmeta = slurp(p, "meta.yaml");
    assert_non_null(strstr(rmeta, "status: 1\n"));   /* RUNNING until end_training */
    assert_non_null(strstr(rmeta, "end_time: null\n"));
    char want[128];
    snprintf(want, sizeof want, "run_id: '%s'\n", run);
    assert_non_null(strstr(rmeta, want));
    snprintf(want, sizeof want, "experiment_id: '%s'\n", exp);
    assert_non_null(strstr(rmeta, want));
    free(rmeta);
    T_OK(ca_end_training(acc));
    rmeta = slurp(p, "meta.yaml");
    assert_non_null(strstr(rmeta, "status: 3\n"));   /* FINISHED */
    assert_null(strstr(rmeta, "end_time: null"));
    char *loss = slurp(p, "metrics/loss"), *accm = slurp(p, "metrics/eval/accuracy");
    long long ts[3];
    double v[3];
    long long st[3];
    assert_int_equal(sscanf(loss, "%lld %lf %lld\n%lld %lf %lld\n%lld %lf %lld\n", &ts[0], &v[0], &st[0], &ts[1],
                            &v[1], &st[1], &ts[2], &v[2], &st[2]), 9);
    assert_true(ts[0] > 1600000000000LL && ts[1] >= ts[0]);   /* milliseconds since 1970 */
    assert_true(v[0] == 2.5 && st[0] == 0 && v[1] == 1.25 && st[1] == 10 && v[2] == 1 && st[2] == 0);
    assert_non_null(strstr(accm, " 0.125 0\n"));
    char *lr = slurp(p, "params/lr"), *bs = slurp(p, "params/batch_size"), *lw = slurp(p, "params/log_with");
    char *name = slurp(p, "tags/mlflow.runName");
    assert_string_equal(lr, "0.01");
    assert_string_equal(bs, "32");
    assert_string_equal(lw, "mlflow");
    assert_non_null(name);
    assert_true(strncmp(name, "caccel-", 7) == 0);
    free(meta0), free(emeta), free(rmeta), free(loss), free(accm), free(lr), free(bs), free(lw), free(name);
    free(run);
    ca_accelerator_destroy(acc);

    /* a second run of the project goes into the same experiment */
    acc = make_acc("mlflow", NULL);
    T_OK(ca_init_trackers(acc, "run1", NULL));
    T_OK(ca_end_training(acc));
    ca_accelerator_destroy(acc);
    snprintf(p, sizeof p, "%s/%s", root, exp);
    DIR *d = opendir(p);
    int runs = 0;
    for (struct dirent *e; d && (e = readdir(d));) runs += is_run_id(e->d_name);
    if (d) closedir(d);
    assert_int_equal(runs, 2);
    free(exp);
}

/* ca_options.log_with, and logging_dir defaulting to project_dir. */
static void test_options_and_project_dir(void **state) {
    (void)state;
    char pd[300];
    snprintf(pd, sizeof pd, "project_dir=%s/proj", g_dir);
    const char *settings[] = {"use_cpu=true", pd, NULL};
    char *argv[] = {"test_trackers", NULL};
    ca_accelerator *acc = NULL;
    T_OK(ca_accelerator_create(&(ca_options){.argc = 1, .argv = argv, .settings = settings, .log_with = "csv"},
                               &acc));
    T_OK(ca_init_trackers(acc, "r", NULL));
    T_OK(ca_log_metrics(acc, (ca_metric[]){{"loss", 0.5}}, 1, 1));
    ca_accelerator_destroy(acc);
    char dir[320];
    snprintf(dir, sizeof dir, "%s/proj/r", g_dir);
    char *csv = slurp(dir, "metrics.csv"), *jl = slurp(dir, "metrics.jsonl");
    assert_non_null(csv);
    assert_null(jl);
    assert_non_null(strstr(csv, "\n1,"));
    assert_non_null(strstr(csv, ",loss,0.5\n"));
    free(csv);
}

/* Under caccel launch: every rank logs; only the main process may write. */
static int ranks(const char *dir) {
    char ld[600];
    snprintf(ld, sizeof ld, "logging_dir=%s", dir);
    const char *settings[] = {ld, "log_with=json,csv", NULL};
    char *argv[] = {"test_trackers", NULL};
    ca_accelerator *acc = NULL;
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = 1, .argv = argv, .settings = settings}, &acc));
    const char *hp[] = {"rank_count=2", NULL};
    ca_status s = ca_init_trackers(acc, "ranks", hp);
    for (int step = 0; s == CA_OK && step < 3; step++)
        s = ca_log_metrics(acc, (ca_metric[]){{"loss", 1.0 / (step + 1)}, {"rank", ca_process_index(acc)}}, 2, step);
    if (s == CA_OK) s = ca_end_training(acc);
    printf("rank %d: %s\n", ca_process_index(acc), ca_status_name(s));
    ca_accelerator_destroy(acc);
    return s == CA_OK ? 0 : 1;
}

static int log_steps(const char *dir, const char *log_with) {
    char ld[600], lw[200];
    snprintf(ld, sizeof ld, "logging_dir=%s", dir);
    snprintf(lw, sizeof lw, "log_with=%s", log_with);
    const char *settings[] = {"use_cpu=true", ld, lw, NULL};
    char *argv[] = {"test_trackers", NULL};
    ca_accelerator *acc = NULL;
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = 1, .argv = argv, .settings = settings}, &acc));
    const char *hp[] = {"lr=0.01", NULL};
    ca_status s = ca_init_trackers(acc, "run", hp);
    if (s == CA_ERR_UNSUPPORTED) {
        printf("%s\n", ca_last_error());
        ca_accelerator_destroy(acc);
        return 77;
    }
    for (int step = 0; s == CA_OK && step < 5; step++)
        s = ca_log_metrics(acc, (ca_metric[]){{"loss", 1.0 / (step + 1)}, {"accuracy", step / 8.0}}, 2, step);
    if (s == CA_OK) s = ca_end_training(acc);
    if (s != CA_OK) printf("%s: %s\n", ca_status_name(s), ca_last_error());
    ca_accelerator_destroy(acc);
    return s == CA_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--ranks")) return ranks(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "--log")) return log_steps(argv[2], argv[3]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_json_and_csv, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_trackers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_disk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_call_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_options_and_project_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mlflow_layout, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
