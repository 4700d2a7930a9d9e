/* Experiment trackers (caccel/tracking.h): log_with's JSON lines and CSV files and the run's
 * hyperparameters, written by the main process only. */
#include "accelerator/accelerator_impl.h"
#include "accelerator/mlflow_impl.h"
#ifdef CA_HAVE_TENSORBOARD
#include "accelerator/tensorboard_impl.h"
#define TK_WRITES "json, csv, mlflow, tensorboard"
#else
#define TK_WRITES "json, csv, mlflow"
#endif

#include <json-c/json.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef struct ca_trackers {
    FILE *jsonl;
    FILE *csv;
    FILE *tb;                  /* TensorBoard events (CA_HAVE_TENSORBOARD) */
    ca_mlflow *mlflow;         /* MLflow's file store under <logging_dir>/mlruns */
    bool started;
    char dir[PATH_MAX];        /* <logging_dir>/<project>: where the files above live */
    int jsonl_err, csv_err;    /* the first write error of each file (errno), 0 while none */
    bool warned;               /* a write error was reported as a warning */
} ca_trackers;

/* Accelerate's trackers that need their Python clients, and the ones this build does not write. */
static const char *const tk_python[] = {"wandb", "comet_ml", "aim", "clearml", "dvclive", "swanlab",
                                        "trackio", "tensorboard", NULL};

static const char *tk_cfg(const ca_accelerator *acc, const char *key) {
    const char *v = ca_config_get(acc->cfg, key);
    return v && v[0] && strcmp(v, "null") != 0 ? v : NULL;
}

static double tk_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* mkdir -p */
static ca_status tk_mkdirs(const char *path) {
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return ca_error(CA_ERR_INVALID, "trackers: path too long: %s", path);
    for (char *p = buf + 1;; p++) {
        if (*p && *p != '/') continue;
        char c = *p;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return ca_error(CA_ERR_IO, "trackers: cannot create %s: %s", buf, strerror(errno));
        if (!(*p = c)) break;
    }
    return CA_OK;
}

typedef struct tk_which {
    bool json, csv, tb, mlflow;
} tk_which;

/* Which trackers log_with names; an error for the others. */
static ca_status tk_parse(const ca_accelerator *acc, const char *list, tk_which *w) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *t = strtok_r(buf, ", []\"'", &save); t; t = strtok_r(NULL, ", []\"'", &save)) {
#ifdef CA_HAVE_TENSORBOARD
        if (!strcmp(t, "tensorboard")) { w->tb = true; continue; }
        if (!strcmp(t, "all")) { w->json = w->csv = w->tb = w->mlflow = true; continue; }
#else
        if (!strcmp(t, "all")) { w->json = w->csv = w->mlflow = true; continue; }
#endif
        if (!strcmp(t, "json") || !strcmp(t, "jsonl")) { w->json = true; continue; }
        if (!strcmp(t, "csv")) { w->csv = true; continue; }
        if (!strcmp(t, "mlflow")) { w->mlflow = true; continue; }
        for (int i = 0; tk_python[i]; i++)
            if (!strcmp(t, tk_python[i]))
                return ca_error(CA_ERR_UNSUPPORTED, "log_with %s (from %s): %s is not available in caccel: %s; "
                                "caccel writes: " TK_WRITES " (or all)", t, ca_config_origin(acc->cfg, "log_with"), t,
                                !strcmp(t, "tensorboard") ? "this build does not write its files (configure found no protobuf-c)"
                                                                                    : "it needs its Python client");
        return ca_error(CA_ERR_CONFIG, "log_with '%s' (from %s): unknown tracker; known: " TK_WRITES ", all",
                        t, ca_config_origin(acc->cfg, "log_with"));
    }
    return CA_OK;
}

static ca_status tk_open(const char *dir, const char *name, FILE **out) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return ca_error(CA_ERR_INVALID, "trackers: path too long: %s/%s", dir, name);
    *out = fopen(path, "a");
    if (!*out) return ca_error(CA_ERR_IO, "trackers: cannot open %s: %s", path, strerror(errno));
    return CA_OK;
}

/* hparams.json: the program's pairs and every configuration value with its origin. */
static ca_status tk_write_hparams(const ca_accelerator *acc, const char *dir, const char *project,
                                  const char *const *config) {
    json_object *root = json_object_new_object(), *user = json_object_new_object(), *run = json_object_new_object();
    json_object_object_add(root, "project", json_object_new_string(project));
    for (int i = 0; config && config[i]; i++) {
        const char *eq = strchr(config[i], '=');
        char key[256];
        snprintf(key, sizeof key, "%.*s", eq ? (int)(eq - config[i]) : (int)strlen(config[i]), config[i]);
        json_object_object_add(user, key, json_object_new_string(eq ? eq + 1 : ""));
    }
    for (int i = 0; i < ca_config_count(acc->cfg); i++) {
        ca_config_entry e;
        if (ca_config_entry_at(acc->cfg, i, &e) != CA_OK || !e.value) continue;
        json_object *v = json_object_new_object();
        json_object_object_add(v, "value", json_object_new_string(e.value));
        json_object_object_add(v, "origin", json_object_new_string(e.origin ? e.origin : ""));
        json_object_object_add(run, e.key, v);
    }
    json_object_object_add(root, "config", user);
    json_object_object_add(root, "run", run);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/hparams.json", dir);
    errno = 0;
    int rc = json_object_to_file_ext(path, root, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
    int e = errno;   /* json-c's own text repeats the path and ends in a newline: the system's reason instead */
    json_object_put(root);
    return rc == 0 ? CA_OK : ca_error(CA_ERR_IO, "trackers: cannot write %s: %s", path, e ? strerror(e) : "write failed");
}

/* MLflow's params: every configuration value, then the program's pairs (which win on a clash). */
static ca_status tk_open_mlflow(const ca_accelerator *acc, ca_trackers *t, const char *base, const char *project,
                                const char *const *config) {
    size_t nconf = 0, n = 0;
    while (config && config[nconf]) nconf++;
    ca_mlflow_param *p = calloc((size_t)ca_config_count(acc->cfg) + nconf + 1, sizeof *p);
    char **keys = calloc(nconf + 1, sizeof *keys);
    if (!p || !keys) return free(p), free(keys), ca_error(CA_ERR_NOMEM, "init_trackers: out of host memory");
    for (int i = 0; i < ca_config_count(acc->cfg); i++) {
        ca_config_entry e;
        if (ca_config_entry_at(acc->cfg, i, &e) == CA_OK && e.value) p[n++] = (ca_mlflow_param){e.key, e.value};
    }
    for (size_t i = 0; i < nconf; i++) {
        const char *eq = strchr(config[i], '=');
        keys[i] = strndup(config[i], eq ? (size_t)(eq - config[i]) : strlen(config[i]));
        if (keys[i]) p[n++] = (ca_mlflow_param){keys[i], eq ? eq + 1 : ""};
    }
    char root[PATH_MAX];
    ca_status s = snprintf(root, sizeof root, "%s/mlruns", base) < (int)sizeof root
                      ? ca_mlflow_open(root, project, p, n, &t->mlflow)
                      : ca_error(CA_ERR_INVALID, "trackers: logging directory too long");
    for (size_t i = 0; i < nconf; i++) free(keys[i]);
    free(keys), free(p);
    return s;
}

static ca_status tk_start(ca_accelerator *acc, ca_trackers *t, const char *project, const char *const *config,
                          const tk_which *w) {
    const char *base = tk_cfg(acc, "logging_dir");
    if (!base) base = tk_cfg(acc, "project_dir");
    if (!base) base = ".";
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s/%s", base, project) >= (int)sizeof dir)
        return ca_error(CA_ERR_INVALID, "trackers: logging directory too long");
    snprintf(t->dir, sizeof t->dir, "%s", dir);
    ca_status s = tk_mkdirs(dir);
    if (s == CA_OK) s = tk_write_hparams(acc, dir, project, config);
    if (s == CA_OK && w->json) s = tk_open(dir, "metrics.jsonl", &t->jsonl);
    if (s == CA_OK && w->csv) s = tk_open(dir, "metrics.csv", &t->csv);
    if (s == CA_OK && t->csv && ftell(t->csv) == 0) fputs("step,time,name,value\n", t->csv);
#ifdef CA_HAVE_TENSORBOARD
    if (s == CA_OK && w->tb) s = ca_tb_open(dir, &t->tb);
#endif
    if (s == CA_OK && w->mlflow) s = tk_open_mlflow(acc, t, base, project, config);
    return s;
}

ca_status ca_init_trackers(ca_accelerator *acc, const char *project, const char *const *config) {
    if (!acc || !project || !project[0] || strchr(project, '/') || !strcmp(project, "..") || !strcmp(project, "."))
        return ca_error(CA_ERR_INVALID, "init_trackers: the project name must be a directory name (got '%s')",
                        project ? project : "(null)");
    if (acc->trackers && acc->trackers->started)
        return ca_error(CA_ERR_STATE, "init_trackers: trackers already started (call ca_end_training first)");
    const char *list = tk_cfg(acc, "log_with");
    tk_which w = {0};
    ca_status s = list ? tk_parse(acc, list, &w) : CA_OK;
    if (s != CA_OK) return s;
    ca_trackers *t = acc->trackers ? acc->trackers : calloc(1, sizeof *t);
    if (!t) return ca_error(CA_ERR_NOMEM, "init_trackers: out of host memory");
    acc->trackers = t;
    t->started = true;
    if (!list || !ca_is_main_process(acc)) return CA_OK;
    s = tk_start(acc, t, project, config, &w);
    if (s != CA_OK) ca_end_training(acc);
    return s;
}

static void tk_csv_name(FILE *f, const char *name) {
    if (!strpbrk(name, ",\"\n\r")) { fputs(name, f); return; }
    fputc('"', f);
    for (const char *p = name; *p; p++) {
        if (*p == '"') fputc('"', f);
        fputc(*p, f);
    }
    fputc('"', f);
}

static void tk_write(ca_trackers *t, const ca_metric *values, size_t n, int64_t step, double now) {
    if (t->jsonl) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "step", step >= 0 ? json_object_new_int64(step) : NULL);
        json_object_object_add(o, "time", json_object_new_double(now));
        for (size_t i = 0; i < n; i++) json_object_object_add(o, values[i].name, json_object_new_double(values[i].value));
        errno = 0;
        fprintf(t->jsonl, "%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
        json_object_put(o);
        if ((fflush(t->jsonl) != 0 || ferror(t->jsonl)) && !t->jsonl_err) t->jsonl_err = errno ? errno : EIO;
    }
    if (t->csv) {
        errno = 0;
        for (size_t i = 0; i < n; i++) {
            if (step >= 0) fprintf(t->csv, "%lld", (long long)step);
            fprintf(t->csv, ",%.6f,", now);
            tk_csv_name(t->csv, values[i].name);
            fprintf(t->csv, ",%.17g\n", values[i].value);
        }
        if ((fflush(t->csv) != 0 || ferror(t->csv)) && !t->csv_err) t->csv_err = errno ? errno : EIO;
    }
}

/* A tracker that cannot write (a full disk, an I/O error) fails every ca_log_metrics from then on,
 * naming the file and the reason, and says so once as a warning too: a program that ignores the
 * status still learns that its logs stop short. */
static ca_status tk_failed(ca_trackers *t, ca_status s) {
    if (!t->warned) CA_LOG_W("trackers: %s", ca_last_error());
    t->warned = true;
    return s;
}

static ca_status tk_file_failed(ca_trackers *t, const char *name, int err) {
    return tk_failed(t, ca_error(CA_ERR_IO, "log_metrics: cannot write %s/%s: %s (the file ends before this "
                                 "step)", t->dir, name, strerror(err)));
}

ca_status ca_log_metrics(ca_accelerator *acc, const ca_metric *values, size_t n, int64_t step) {
    if (!acc || (n && !values)) return ca_error(CA_ERR_INVALID, "log_metrics: NULL accelerator or values");
    for (size_t i = 0; i < n; i++)
        if (!values[i].name || !values[i].name[0])
            return ca_error(CA_ERR_INVALID, "log_metrics: value %zu has no name", i);
    ca_progress_note_metrics(acc->progress, values, n);
    if (!acc->trackers || !acc->trackers->started)
        return tk_cfg(acc, "log_with") ? ca_error(CA_ERR_STATE, "log_metrics: call ca_init_trackers first (log_with %s, "
                                                  "from %s)", tk_cfg(acc, "log_with"),
                                                  ca_config_origin(acc->cfg, "log_with"))
                                       : CA_OK;
    double now = tk_now();
    ca_trackers *t = acc->trackers;
    ca_status ms = t->mlflow ? ca_mlflow_log(t->mlflow, values, n, step, now) : CA_OK;
    if (ms == CA_ERR_IO) return tk_failed(t, ms);
    if (ms != CA_OK) return ms;
    tk_write(t, values, n, step, now);
#ifdef CA_HAVE_TENSORBOARD
    ca_status s = t->tb ? ca_tb_scalars(t->tb, values, n, step, now) : CA_OK;
    if (s != CA_OK) return tk_failed(t, ca_error_context("%s", t->dir));
#endif
    if (t->jsonl_err) return tk_file_failed(t, "metrics.jsonl", t->jsonl_err);
    if (t->csv_err) return tk_file_failed(t, "metrics.csv", t->csv_err);
    return CA_OK;
}

ca_status ca_end_training(ca_accelerator *acc) {
    if (!acc || !acc->trackers) return CA_OK;
    ca_trackers *t = acc->trackers;
    int bad = 0;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", t->dir);
    if (t->jsonl) bad |= fclose(t->jsonl) != 0;
    if (t->csv) bad |= fclose(t->csv) != 0;
    if (t->tb) bad |= fclose(t->tb) != 0;
    ca_status s = ca_mlflow_close(t->mlflow);   /* the run's status FINISHED */
    free(t);
    acc->trackers = NULL;
    if (bad) return ca_error(CA_ERR_IO, "end_training: closing the metrics files under %s failed: %s", dir, strerror(errno));
    return s;
}
