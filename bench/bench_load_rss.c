/* bench_load_rss: peak resident memory of one rank while a model is built, prepared and loaded
 * from safetensors. The model: --layers L Linear(W, W) (default 16 x 4096: 268M f32 parameters,
 * 1.07 GB). --save DIR writes it (one process, eager) and exits; otherwise each rank builds it
 * (eagerly, or --meta under ca_init_empty_weights), ca_prepares it (no optimizer: the load is what
 * is measured), loads --load DIR with ca_load_model, and prints from /proc/self/status
 *   rank=R base_mb=VmRSS-before-the-model hwm_mb=VmHWM rss_anon_mb=RssAnon rss_file_mb=RssFile model_mb=M unit_mb=U
 * VmHWM counts the file's mapped pages this process touched; RssAnon (at the end) is its own
 * memory, the page cache of the file shared by the machine's ranks is RssFile. */
#include <caccel/caccel.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    const char *save = NULL, *load = NULL;
    bool meta = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--width") && i + 1 < argc) width = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--save") && i + 1 < argc) save = argv[++i];
        else if (!strcmp(argv[i], "--load") && i + 1 < argc) load = argv[++i];
        else if (!strcmp(argv[i], "--meta")) meta = true;
        else if (ca_config_flag_arity(argv[i]) >= 0) i += ca_config_flag_arity(argv[i]);
        else { fprintf(stderr, "bench_load_rss: unknown argument %s\n", argv[i]); return 2; }
    }
    ca_accelerator *acc;
    CA_CHECK(ca_accelerator_create(&(ca_options){.argc = argc, .argv = argv}, &acc));
    CA_CHECK(ca_set_seed(acc, 1));
    long base_kb = status_kb("VmRSS");   /* the runtime itself: libraries, communicator */
    CA_CHECK(ca_init_empty_weights(meta));
    ca_module *m = model(layers, width);
    CA_CHECK(ca_init_empty_weights(false));
    if (save) {
        CA_CHECK(ca_save_model(acc, m, save, 0));
    } else {
        CA_CHECK(ca_prepare(acc, m, NULL, NULL));
        if (load) CA_CHECK(ca_load_model(acc, m, load));
        double mb = 1.0 / 1024.0;
        printf("rank=%d base_mb=%.0f hwm_mb=%.0f rss_anon_mb=%.0f rss_file_mb=%.0f model_mb=%.0f unit_mb=%.0f\n",
               ca_process_index(acc), base_kb * mb, status_kb("VmHWM") * mb, status_kb("RssAnon") * mb, status_kb("RssFile") * mb,
               (double)(layers * width * width) * 4 / 1048576.0, (double)(width * width) * 4 / 1048576.0);
    }
    ca_module_destroy(m);
    ca_accelerator_destroy(acc);
    ca_shutdown();
    return 0;
}
