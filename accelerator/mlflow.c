/* log_with mlflow: MLflow's local file store (mlflow_impl.h). Everything is plain files, so no MLflow
 * client is needed; the layout is the one MLflow's FileStore reads. */
#include "accelerator/mlflow_impl.h"
#include "base/file_impl.h"

#include <caccel/log.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { MLF_RUNNING = 1, MLF_FINISHED = 3, MLF_SOURCE_LOCAL = 4 };   /* MLflow's RunStatus, SourceType */

struct ca_mlflow {
    char run_dir[PATH_MAX];
    char exp_id[32], run_id[33], run_name[64], user[64];
    char artifact_uri[PATH_MAX + 64];
    long long start_ms;
};

static long long mlf_ms(double unix_seconds) {
    return (long long)(unix_seconds * 1000.0);
}

static long long mlf_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* n random bytes from the kernel; the clock and pid when /dev/urandom is unreadable. */
static void mlf_random(unsigned char *buf, size_t n) {
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, buf, n) : -1;
    if (fd >= 0) close(fd);
    if (got == (ssize_t)n) return;
    uint64_t x = (uint64_t)mlf_now_ms() * 6364136223846793005ull ^ (uint64_t)getpid();
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        buf[i] = (unsigned char)(x >> 56);
    }
}

static ca_status mlf_mkdir(const char *path) {
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return ca_error(CA_ERR_IO, "mlflow: cannot create %s: %s", path, strerror(errno));
    return CA_OK;
}

/* A YAML single-quoted scalar ('' stands for '). */
static void mlf_yaml_str(FILE *f, const char *key, const char *v) {
    fprintf(f, "%s: '", key);
    for (; *v; v++) {
        if (*v == '\'') fputc('\'', f);
        fputc(*v, f);
    }
    fputs("'\n", f);
}

/* Writes `path` whole through a temporary file and rename, so a reader never sees half of it. */
static ca_status mlf_write_file(const char *path, const char *text) {
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return ca_error(CA_ERR_IO, "mlflow: cannot create %s: %s", tmp, strerror(errno));
    int bad = fputs(text, f) < 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) return ca_error(CA_ERR_IO, "mlflow: cannot write %s: %s", path, strerror(errno));
    return CA_OK;
}

/* MLflow's rule for metric, param and tag names: letters, digits, '_', '-', '.', ' ', ':', '/';
 * not absolute, no '..' component, at most 250 characters. */
static bool mlf_valid_name(const char *s) {
    size_t len = strlen(s);
    if (!len || len > 250 || s[0] == '/') return false;
    for (const char *p = s; *p; p++) {
        bool ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                  strchr("_-. :/", *p);
        if (!ok) return false;
        if (p[0] == '.' && p[1] == '.' && (p == s || p[-1] == '/') && (p[2] == '/' || !p[2])) return false;
    }
    return true;
}

/* dir/sub/name (name may hold '/': its folders are made), written whole. */
static ca_status mlf_put(const char *dir, const char *sub, const char *name, const char *text) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s/%s", dir, sub, name) >= (int)sizeof path)
        return ca_error(CA_ERR_INVALID, "mlflow: path too long for %s '%s'", sub, name);
    for (char *p = strchr(path + strlen(dir) + 1, '/'); p; p = strchr(p + 1, '/')) {
        *p = '\0';
        ca_status s = mlf_mkdir(path);
        *p = '/';
        if (s != CA_OK) return s;
    }
    return mlf_write_file(path, text);
}

/* The value of `name:` in an experiment's meta.yaml, unquoted, into out (empty when absent). */
static void mlf_meta_name(const char *meta, char *out, size_t cap) {
    out[0] = '\0';
    FILE *f;
    if (ca_file_fopen(meta, CA_FILE_MLFLOW_META, &f, NULL) != CA_OK) {
        if (ca_last_status() != CA_ERR_NOT_FOUND) CA_LOG_W("mlflow: %s; passing over that experiment", ca_last_error());
        ca_clear_error();
        return;
    }
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "name: ", 6) != 0) continue;
        char *v = line + 6, *e = v + strcspn(v, "\r\n");
        *e = '\0';
        size_t k = 0;
        char q = (*v == '\'' || *v == '"') ? *v++ : 0;
        for (; *v && k + 1 < cap; v++) {
            if (q && *v == q) {
                if (q == '\'' && v[1] == '\'') v++;   /* '' inside single quotes */
                else break;
            }
            out[k++] = *v;
        }
        out[k] = '\0';
        break;
    }
    fclose(f);
}

/* The id of the active experiment named `name` under root, or "" when there is none. */
static void mlf_find_experiment(const char *root, const char *name, char *id, size_t cap) {
    id[0] = '\0';
    DIR *d = opendir(root);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || strspn(e->d_name, "0123456789") != strlen(e->d_name)) continue;
        char meta[PATH_MAX], got[512];
        snprintf(meta, sizeof meta, "%s/%s/meta.yaml", root, e->d_name);
        mlf_meta_name(meta, got, sizeof got);
        if (!strcmp(got, name)) {
            snprintf(id, cap, "%s", e->d_name);
            break;
        }
    }
    closedir(d);
}

static ca_status mlf_write_experiment(const char *root, const char *abs_root, const char *id, const char *name) {
    char dir[PATH_MAX], meta[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/%s", root, id);
    ca_status s = mlf_mkdir(dir);
    if (s != CA_OK) return s;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return ca_error(CA_ERR_NOMEM, "mlflow: out of host memory");
    long long now = mlf_now_ms();
    fprintf(f, "artifact_location: 'file://%s/%s'\ncreation_time: %lld\n", abs_root, id, now);
    mlf_yaml_str(f, "experiment_id", id);
    fprintf(f, "last_update_time: %lld\nlifecycle_stage: active\n", now);
    mlf_yaml_str(f, "name", name);
    fclose(f);
    snprintf(meta, sizeof meta, "%s/meta.yaml", dir);
    s = mlf_write_file(meta, text);
    free(text);
    return s;
}

/* The run's meta.yaml with `status`; end_time null while it runs. */
static ca_status mlf_write_run_meta(const ca_mlflow *m, int status, long long end_ms) {
    char *text = NULL, meta[PATH_MAX + 16];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return ca_error(CA_ERR_NOMEM, "mlflow: out of host memory");
    mlf_yaml_str(f, "artifact_uri", m->artifact_uri);
    fputs("deleted_time: null\n", f);
    if (end_ms >= 0) fprintf(f, "end_time: %lld\n", end_ms);
    else fputs("end_time: null\n", f);
    fputs("entry_point_name: ''\n", f);
    mlf_yaml_str(f, "experiment_id", m->exp_id);
    fputs("lifecycle_stage: active\n", f);
    mlf_yaml_str(f, "run_id", m->run_id);
    mlf_yaml_str(f, "run_name", m->run_name);
    mlf_yaml_str(f, "run_uuid", m->run_id);
    fprintf(f, "source_name: ''\nsource_type: %d\nsource_version: ''\nstart_time: %lld\nstatus: %d\ntags: []\n",
            MLF_SOURCE_LOCAL, m->start_ms, status);
    mlf_yaml_str(f, "user_id", m->user);
    fclose(f);
    snprintf(meta, sizeof meta, "%s/meta.yaml", m->run_dir);
    ca_status s = mlf_write_file(meta, text);
    free(text);
    return s;
}

/* The experiment's id under root: the existing one of that name, or a new one (and the Default
 * experiment 0 when root is new, as MLflow's store creates it). */
static ca_status mlf_experiment(const char *root, const char *name, char *id, size_t cap) {
    struct stat st;
    bool fresh = stat(root, &st) != 0;
    ca_status s = mlf_mkdir(root);
    char abs_root[PATH_MAX];
    if (s == CA_OK && !realpath(root, abs_root))
        s = ca_error(CA_ERR_IO, "mlflow: cannot resolve %s: %s", root, strerror(errno));
    if (s == CA_OK && fresh) s = mlf_write_experiment(root, abs_root, "0", "Default");
    if (s != CA_OK) return s;
    mlf_find_experiment(root, name, id, cap);
    if (id[0]) return CA_OK;
    uint64_t r;
    mlf_random((unsigned char *)&r, sizeof r);
    snprintf(id, cap, "%llu", (unsigned long long)(r >> 1 | 1ull << 40));   /* 13 to 19 digits, never "0" */
    return mlf_write_experiment(root, abs_root, id, name);
}

static void mlf_identity(ca_mlflow *m) {
    unsigned char b[16];
    mlf_random(b, sizeof b);
    b[6] = (unsigned char)((b[6] & 0x0F) | 0x40);   /* uuid4: version and variant bits */
    b[8] = (unsigned char)((b[8] & 0x3F) | 0x80);
    for (int i = 0; i < 16; i++) snprintf(m->run_id + 2 * i, 3, "%02x", b[i]);
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(m->run_name, sizeof m->run_name, "caccel-%Y%m%d-%H%M%S", &tm);
    const char *u = getenv("USER");
    struct passwd *pw = u && *u ? NULL : getpwuid(getuid());
    snprintf(m->user, sizeof m->user, "%s", u && *u ? u : pw ? pw->pw_name : "unknown");
}

static ca_status mlf_start_run(ca_mlflow *m, const char *root, const ca_mlflow_param *params, size_t nparams) {
    char abs_root[PATH_MAX];
    if (!realpath(root, abs_root)) return ca_error(CA_ERR_IO, "mlflow: cannot resolve %s: %s", root, strerror(errno));
    snprintf(m->run_dir, sizeof m->run_dir, "%s/%s/%s", root, m->exp_id, m->run_id);
    snprintf(m->artifact_uri, sizeof m->artifact_uri, "file://%s/%s/%s/artifacts", abs_root, m->exp_id, m->run_id);
    static const char *const subs[] = {"", "/metrics", "/params", "/tags", "/artifacts"};
    for (int i = 0; i < 5; i++) {
        char d[PATH_MAX + 16];
        snprintf(d, sizeof d, "%s%s", m->run_dir, subs[i]);
        ca_status s = mlf_mkdir(d);
        if (s != CA_OK) return s;
    }
    ca_status s = mlf_write_run_meta(m, MLF_RUNNING, -1);
    const char *tags[][2] = {{"mlflow.runName", m->run_name}, {"mlflow.user", m->user}, {"mlflow.source.type", "LOCAL"}};
    for (int i = 0; s == CA_OK && i < 3; i++) s = mlf_put(m->run_dir, "tags", tags[i][0], tags[i][1]);
    for (size_t i = 0; s == CA_OK && i < nparams; i++) {
        if (!mlf_valid_name(params[i].key))
            return ca_error(CA_ERR_INVALID, "mlflow: parameter name '%s' is not one MLflow accepts (letters, digits, "
                            "'_-. :/', not starting with '/')", params[i].key);
        s = mlf_put(m->run_dir, "params", params[i].key, params[i].value);
    }
    return s;
}

ca_status ca_mlflow_open(const char *root, const char *experiment, const ca_mlflow_param *params, size_t nparams,
                         ca_mlflow **out) {
    *out = NULL;
    ca_mlflow *m = calloc(1, sizeof *m);
    if (!m) return ca_error(CA_ERR_NOMEM, "mlflow: out of host memory");
    m->start_ms = mlf_now_ms();
    mlf_identity(m);
    ca_status s = mlf_experiment(root, experiment, m->exp_id, sizeof m->exp_id);
    if (s == CA_OK) s = mlf_start_run(m, root, params, nparams);
    if (s != CA_OK) return free(m), s;
    *out = m;
    return CA_OK;
}

ca_status ca_mlflow_log(ca_mlflow *m, const ca_metric *values, size_t n, int64_t step, double unix_seconds) {
    for (size_t i = 0; i < n; i++)
        if (!mlf_valid_name(values[i].name))
            return ca_error(CA_ERR_INVALID, "log_metrics: metric name '%s' is not one MLflow accepts (letters, "
                            "digits, '_-. :/', not starting with '/')", values[i].name);
    for (size_t i = 0; i < n; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/metrics/%s", m->run_dir, values[i].name);
        if (strchr(values[i].name, '/') && access(path, F_OK) != 0) {
            ca_status s = mlf_put(m->run_dir, "metrics", values[i].name, "");   /* makes its folders */
            if (s != CA_OK) return s;
        }
        FILE *f = fopen(path, "a");
        if (!f) return ca_error(CA_ERR_IO, "mlflow: cannot open %s: %s", path, strerror(errno));
        fprintf(f, "%lld %.17g %lld\n", mlf_ms(unix_seconds), values[i].value, (long long)(step < 0 ? 0 : step));
        if (fclose(f) != 0) return ca_error(CA_ERR_IO, "mlflow: writing %s failed: %s", path, strerror(errno));
    }
    return CA_OK;
}

ca_status ca_mlflow_close(ca_mlflow *m) {
    if (!m) return CA_OK;
    ca_status s = mlf_write_run_meta(m, MLF_FINISHED, mlf_now_ms());
    free(m);
    return s;
}
