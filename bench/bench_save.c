/* bench_save: ca_save_model and ca_load_model against the same bytes written and read raw
 * (write + fsync + rename, the same durability as the save) and against dd and cp of the file;
 * then ca_save_state / ca_load_state (model + AdamW state: three times the bytes) against the raw
 * write of as many bytes.
 * usage: bench_save [--mib N] [--reps R] [--dir D]; prints MB/s per method and the ratios. */
#include "bench/bench_util.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A model of about `mib` MiB: square linear layers of 1024 x 1024 f32 (4 MiB each). */
static ca_module *model_of(int mib) {
    ca_module *seq, *l;
    CA_CHECK(ca_sequential_create(&seq));
    for (int i = 0; i < (mib + 3) / 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "%d", i);
        CA_CHECK(ca_linear_create(1024, 1024, false, &l));
        CA_CHECK(ca_module_add(seq, name, l));
    }
    return seq;
}

/* The raw peer of a save: the same bytes to dir/raw.bin.tmp, fsync, rename, fsync of the folder. */
static void raw_write(const char *dir, const void *buf, size_t n) {
    char tmp[4096], fin[4096];
    snprintf(tmp, sizeof tmp, "%s/raw.bin.tmp", dir);
    snprintf(fin, sizeof fin, "%s/raw.bin", dir);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { perror(tmp); exit(1); }
    for (size_t off = 0; off < n;) {
        ssize_t w = write(fd, (const char *)buf + off, n - off);
        if (w <= 0) { perror("write"); exit(1); }
        off += (size_t)w;
    }
    fsync(fd);
    close(fd);
    rename(tmp, fin);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) { fsync(dfd); close(dfd); }
}

static void raw_read(const char *path, void *buf, size_t n) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) { perror(path); exit(1); }
    for (size_t off = 0; off < n;) {
        ssize_t r = read(fd, (char *)buf + off, n - off);
        if (r <= 0) break;
        off += (size_t)r;
    }
    close(fd);
}

static double timed_shell(const char *cmd) {
    double t0 = now_s();
    if (system(cmd) != 0) { fprintf(stderr, "bench_save: '%s' failed\n", cmd); exit(1); }
    return now_s() - t0;
}

/* ca_save_state of the same model with AdamW after one step (exp_avg, exp_avg_sq exist), against
 * a raw write+fsync+rename of the same number of bytes; then ca_load_state. */
static void bench_state(ca_module *m, const char *dir, int reps, size_t param_bytes) {
    ca_accelerator *acc;
    const char *settings[] = {"use_cpu=true", NULL};
    CA_CHECK(ca_accelerator_create(&(ca_options){.settings = settings}, &acc));
    ca_optimizer *opt;
    CA_CHECK(ca_adamw_create(m, NULL, &opt));
    CA_CHECK(ca_prepare(acc, m, opt, NULL));
    CA_SCOPE {
        ca_tensor *x = ca_rand_normal(ca_accelerator_device(acc), CA_F32, CA_SHAPE(2, 1024), 0.0f, 1.0f);
        CA_CHECK(ca_backward(acc, ca_mean(ca_module_forward(m, x))));
        CA_CHECK(ca_optimizer_step(opt));
    }
    size_t bytes = 3 * param_bytes;
    char *buf = malloc(bytes), sdir[4096];
    if (!buf) { fprintf(stderr, "bench_save: out of memory\n"); exit(1); }
    memset(buf, 7, bytes);
    snprintf(sdir, sizeof sdir, "%s/state", dir);
    double t[3][50];
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        CA_CHECK(ca_save_state(acc, sdir));
        t[0][r] = now_s() - t0;
        t0 = now_s();
        raw_write(dir, buf, bytes);
        t[1][r] = now_s() - t0;
        t0 = now_s();
        CA_CHECK(ca_load_state(acc, sdir));
        t[2][r] = now_s() - t0;
    }
    double mb = (double)bytes / 1e6, save = median(t[0], reps), raw = median(t[1], reps);
    printf("# training state: %.0f MB (model + AdamW exp_avg + exp_avg_sq)\n", mb);
    printf("%-34s %10.0f %10s\n", "ca_save_state (atomic, fsync)", mb / save, "1.00");
    printf("%-34s %10.0f %10.2f\n", "write+fsync+rename, same bytes", mb / raw, raw / save);
    printf("%-34s %10.0f %10s\n", "ca_load_state (CRC, validate, copy)", mb / median(t[2], reps), "");
    free(buf);
    ca_optimizer_destroy(opt);
    ca_accelerator_destroy(acc);
}

int main(int argc, char **argv) {
    int mib = 256, reps = 5;
    const char *dir = "bench-save.tmp";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mib")) mib = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
    }
    if (reps < 1 || reps > 50 || mib < 1) { fprintf(stderr, "bench_save: bad arguments\n"); return 2; }
    mkdir(dir, 0755);
    ca_module *m = model_of(mib);
    size_t bytes = (size_t)ca_module_param_count(m) * sizeof(float);
    char *buf = malloc(bytes);
    memset(buf, 7, bytes);
    char file[4096], cmd[8400];
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    double t[5][50];
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        CA_CHECK(ca_save_model(NULL, m, dir, 0));
        t[0][r] = now_s() - t0;
        t0 = now_s();
        raw_write(dir, buf, bytes);
        t[1][r] = now_s() - t0;
        snprintf(cmd, sizeof cmd, "dd if='%s' of='%s/dd.bin' bs=4M conv=fsync status=none", file, dir);
        t[2][r] = timed_shell(cmd);
        snprintf(cmd, sizeof cmd, "cp '%s' '%s/cp.bin' && sync '%s/cp.bin'", file, dir, dir);
        t[3][r] = timed_shell(cmd);
        t0 = now_s();
        CA_CHECK(ca_load_model(NULL, m, dir));
        t[4][r] = now_s() - t0;
    }
    double mb = (double)bytes / 1e6, save = median(t[0], reps), raw = median(t[1], reps);
    printf("# %.0f MB of f32 parameters, %d repetitions, medians; folder %s\n", mb, reps, dir);
    printf("%-34s %10s %10s\n", "method", "MB/s", "save/this");
    printf("%-34s %10.0f %10s\n", "ca_save_model (atomic, fsync)", mb / save, "1.00");
    printf("%-34s %10.0f %10.2f\n", "write+fsync+rename, same bytes", mb / raw, raw / save);
    printf("%-34s %10.0f %10.2f\n", "dd bs=4M conv=fsync of the file", mb / median(t[2], reps), median(t[2], reps) / save);
    printf("%-34s %10.0f %10.2f\n", "cp + sync of the file", mb / median(t[3], reps), median(t[3], reps) / save);
    double t0 = now_s();
    for (int r = 0; r < reps; r++) raw_read(file, buf, bytes);
    double rd = (now_s() - t0) / reps;
    printf("%-34s %10.0f %10s\n", "ca_load_model (validate + copy)", mb / median(t[4], reps), "");
    printf("%-34s %10.0f %10s\n", "read() of the file (page cache)", mb / rd, "");
    bench_state(m, dir, reps, bytes);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) return 1;
    free(buf);
    ca_module_destroy(m);
    ca_shutdown();
    return 0;
}
