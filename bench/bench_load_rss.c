/* bench_load_rss: peak resident memory of one rank while a model is built, prepared and loaded
 * from safetensors. The model: --layers L Linear(W, W) (default 16 x 4096: 268M f32 parameters,
 * 1.07 GB). --save DIR writes it (one process, eager) and exits; otherwise each rank builds it
 * (eagerly, or --meta under ca_init_empty_weights), ca_prepares it (no optimizer: the load is what
 * is measured), loads --load DIR with ca_load_model, and prints from /proc/self/status
 *   rank=R base_mb=VmRSS-before-the-model base_anon_mb=RssAnon-then hwm_mb=VmHWM
 *          peak_anon_mb=P peak_file_mb=F prep_anon_mb=A prep_file_mb=B rss_anon_mb=RssAnon rss_file_mb=RssFile
 *          model_mb=M unit_mb=U
 * VmHWM counts the file's mapped pages this process touched as well as its own (anonymous) memory;
 * the machine's page cache holds those pages once for all of its ranks. The kernel keeps no peak of
 * RssAnon alone: a thread samples RssAnon and RssFile every millisecond from before the build to
 * the end of the load (peak_anon_mb, peak_file_mb; a spike shorter than that may be missed);
 * prep_* are the values at the end of ca_prepare, rss_* at the end of the load.
 * --save-state DIR: every rank prepares the model and ca_save_states it (its layout as the launch's
 * configuration says: fsdp_state_dict_type); --load-state DIR: ca_load_state instead of ca_load_model
 * (no optimizer in either: the parameters are what is measured). --early (implies --meta) loads --load
 * into the meta model before ca_prepare: at stage 3 ca_prepare then reads each rank's shard's bytes
 * alone, under DDP rank 0 reads and broadcasts. --tp-plan: the layers alternate colwise and rowwise
 * (ca_tp_plan) under parallelism_config_tp_size; each rank then also prints load_s (the seconds of
 * ca_load_model, or with --early of ca_prepare, which reads) and rchar_mb (the bytes read()/pread()
 * read meanwhile, /proc/self/io; pages of a mapped file are counted in peak_file_mb instead). */
#include <caccel/caccel.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') v = atol(line + n + 1);
    if (f) fclose(f);
    return v;
}

/* The sampler: the largest RssAnon and RssFile seen until stop is set. */
typedef struct sampler {
    atomic_bool stop;
    long anon_kb, file_kb;
} sampler;

static void *sample(void *arg) {
    sampler *sp = arg;
    const struct timespec ms = {0, 1000000};
    while (!atomic_load(&sp->stop)) {
        long a = status_kb("RssAnon"), f = status_kb("RssFile");
        if (a > sp->anon_kb) sp->anon_kb = a;
        if (f > sp->file_kb) sp->file_kb = f;
        nanosleep(&ms, NULL);
    }
    return NULL;
}

static long io_rchar(void) {
    FILE *f = fopen("/proc/self/io", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "rchar:", 6)) v = atol(line + 6);
    if (f) fclose(f);
    return v;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static ca_module *model(int64_t layers, int64_t width) {
    ca_module *m, *l;
    CA_CHECK(ca_sequential_create(&m));
    for (int64_t i = 0; i < layers; i++) {
        CA_CHECK(ca_linear_create(width, width, false, &l));
        CA_CHECK(ca_module_add(m, NULL, l));
    }
    return m;
}

int main(int argc, char **argv) {
    int64_t layers = 16, width = 4096;
    const char *save = NULL, *load = NULL, *save_state = NULL, *load_state = NULL;
    bool meta = false, early = false, plan = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--width") && i + 1 < argc) width = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--save") && i + 1 < argc) save = argv[++i];
        else if (!strcmp(argv[i], "--load") && i + 1 < argc) load = argv[++i];
        else if (!strcmp(argv[i], "--save-state") && i + 1 < argc) save_state = argv[++i];
        else if (!strcmp(argv[i], "--load-state") && i + 1 < argc) load_state = argv[++i];
        else if (!strcmp(argv[i], "--meta")) meta = true;
        else if (!strcmp(argv[i], "--early")) early = meta = true;
        else if (!strcmp(argv[i], "--tp-plan")) plan = true;
        else if (ca_config_flag_arity(argv[i]) >= 0) i += ca_config_flag_arity(argv[i]);
        else { fprintf(stderr, "bench_load_rss: unknown argument %s\n", argv[i]); return 2; }
    }
    ca_accelerator *acc;
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = argc, .argv = argv}, &acc));
    CA_CHECK(ca_set_seed(acc, 1));
    long base_kb = status_kb("VmRSS"), base_anon_kb = status_kb("RssAnon");   /* the runtime itself */
    sampler sp = {.anon_kb = base_anon_kb, .file_kb = status_kb("RssFile")};
    pthread_t th;
    bool sampling = !save && !save_state && pthread_create(&th, NULL, sample, &sp) == 0;
    CA_CHECK(ca_init_empty_weights(meta));
    ca_module *m = model(layers, width);
    CA_CHECK(ca_init_empty_weights(false));
    for (int64_t i = 0; plan && i < layers; i++) {
        char name[32];
        snprintf(name, sizeof name, "%lld", (long long)i);
        CA_CHECK(ca_tp_plan(m, name, i % 2 ? "rowwise" : "colwise"));
    }
    if (save) {
        CA_CHECK(ca_save_model(acc, m, save, 0));
    } else if (save_state) {
        CA_CHECK(ca_prepare(acc, m, NULL, NULL));
        CA_CHECK(ca_save_state(acc, save_state));
    } else {
        long r0 = io_rchar();
        double t0 = now_s(), t1;
        if (load && early) CA_CHECK(ca_load_model(acc, m, load));   /* into the meta model: read at ca_prepare */
        CA_CHECK(ca_prepare(acc, m, NULL, NULL));
        long prep_anon = status_kb("RssAnon"), prep_file = status_kb("RssFile");
        if (!early) r0 = io_rchar(), t0 = now_s();
        if (load && !early) CA_CHECK(ca_load_model(acc, m, load));
        if (load_state) CA_CHECK(ca_load_state(acc, load_state));   /* timed and counted as load_model */
        t1 = now_s();
        if (plan) printf("rank=%d load_s=%.3f rchar_mb=%.1f\n", ca_process_index(acc), t1 - t0,
                         (double)(io_rchar() - r0) / 1048576.0);
        long anon = status_kb("RssAnon"), file = status_kb("RssFile");
        atomic_store(&sp.stop, true);
        if (sampling) pthread_join(th, NULL);
        double mb = 1.0 / 1024.0;
        printf("rank=%d base_mb=%.0f base_anon_mb=%.0f hwm_mb=%.0f peak_anon_mb=%.0f peak_file_mb=%.0f prep_anon_mb=%.0f "
               "prep_file_mb=%.0f rss_anon_mb=%.0f rss_file_mb=%.0f model_mb=%.0f unit_mb=%.0f\n",
               ca_process_index(acc), base_kb * mb, base_anon_kb * mb, status_kb("VmHWM") * mb, sp.anon_kb * mb,
               sp.file_kb * mb, prep_anon * mb, prep_file * mb, anon * mb, file * mb,
               (double)(layers * width * width) * 4 / 1048576.0, (double)(width * width) * 4 / 1048576.0);
    }
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
    ca_shutdown();
    return 0;
}
