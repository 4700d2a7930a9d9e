/* bench_async_save: the training stall of ca_save_state, synchronous against asynchronous
 * (ca_save_state_ex with async: the time the calling thread is inside the call, which the step loop
 * loses), and the background write's throughput (bytes of the checkpoint over the time from the
 * call's return to the publication, ca_wait_for_save) against `cp` + `sync` of the same files to the
 * same file system. The model: square 1024 x 1024 f32 Linear layers (4 MiB each) with AdamW after
 * one step, so that the state is three times the parameters. Under caccel launch every rank saves
 * (rank 0 the model and optimizer files, each rank its own), the stall is rank 0's, and rank 0 times
 * cp; --device tpu runs on the lazy xla device (the call runs its graph and copies to the host).
 * usage: bench_async_save [--mib N] [--reps R] [--dir D] [--device cpu|tpu]; prints medians. */
#include "bench/bench_util.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

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

static double dir_bytes(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) { perror(dir); exit(1); }
    struct dirent *e;
    double n = 0;
    while ((e = readdir(d))) {
        char p[8192];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) n += (double)st.st_size;
    }
    closedir(d);
    return n;
}

static double timed_shell(const char *cmd) {
    double t0 = now_s();
    if (system(cmd) != 0) { fprintf(stderr, "bench_async_save: '%s' failed\n", cmd); exit(1); }
    return now_s() - t0;
}

int main(int argc, char **argv) {
    int mib = 256, reps = 3;
    const char *dir = "bench-async-save.tmp", *device = "cpu";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mib")) mib = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--device")) device = argv[i + 1];
    }
    if (reps < 1 || reps > 50 || mib < 1) { fprintf(stderr, "bench_async_save: bad arguments\n"); return 2; }
    mkdir(dir, 0755);
    ca_module *m = model_of(mib);
    ca_accelerator *acc;
    char flag[64];
    snprintf(flag, sizeof flag, "--%s", device);
    char *args[] = {"bench_async_save", flag, NULL};
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = 2, .argv = args}, &acc));
    int rank = ca_process_index(acc), world = ca_num_processes(acc);
    ca_optimizer *opt;
    CA_CHECK(ca_adamw_create(m, NULL, &opt));
    CA_CHECK(ca_prepare(acc, m, opt, NULL));
    CA_SCOPE {
        ca_tensor *x = ca_rand_normal(ca_accelerator_device(acc), CA_F32, CA_SHAPE(2, 1024), 0.0f, 1.0f);
        CA_CHECK(ca_backward(acc, ca_mean(ca_module_forward(m, x))));
        CA_CHECK(ca_optimizer_step(opt));
    }
    char sdir[4096], adir[4096], cdir[4096], cmd[20000];
    snprintf(sdir, sizeof sdir, "%s/sync", dir);
    snprintf(adir, sizeof adir, "%s/async", dir);
    snprintf(cdir, sizeof cdir, "%s/cp", dir);
    double t[5][50], bytes = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        CA_CHECK(ca_save_state(acc, sdir));
        t[0][r] = now_s() - t0;
        t0 = now_s();
        CA_CHECK(ca_save_state_ex(acc, adir, &(ca_save_state_options){.async = true}));
        double t1 = now_s();
        t[1][r] = t1 - t0;
        CA_CHECK(ca_wait_for_save(acc));
        t[2][r] = now_s() - t1;
        if (rank != 0) continue;
        bytes = dir_bytes(adir);
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s' && sync '%s'/*", cdir, adir, cdir, cdir);
        t[3][r] = timed_shell(cmd);
    }
    CA_CHECK(ca_wait_for_everyone(acc));
    if (rank != 0) goto out;
    double mb = bytes / 1e6, sync_s = median(t[0], reps), stall = median(t[1], reps);
    double bg = median(t[2], reps), cp = median(t[3], reps);
    printf("# %d MiB of parameters, AdamW: a checkpoint of %.0f MB; %d rank(s) on %s, rank 0's times; %d "
           "repetitions, medians; folder %s\n", mib, mb, world, device, reps, dir);
    printf("%-44s %10.3f s\n", "synchronous ca_save_state (stall)", sync_s);
    printf("%-44s %10.3f s  (%.1f%% of the synchronous save)\n", "asynchronous: the call (stall, host copy)", stall,
           100.0 * stall / sync_s);
    printf("%-44s %10.0f MB/s\n", "asynchronous: background write to publication", mb / bg);
    printf("%-44s %10.0f MB/s  (background / cp: %.2f)\n", "cp -r + sync of the same files", mb / cp, cp / bg);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) return 1;
out:
    ca_optimizer_destroy(opt);
    ca_accelerator_destroy(acc);
    ca_module_destroy(m);
    ca_shutdown();
    return 0;
}
