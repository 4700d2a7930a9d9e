/* lora_tool: caccel's LoRA on a BertModel for tests/test_lora_peft.sh.
 *   lora_tool forward BASE_DIR ADAPTER IN OUT
 *     loads the BertModel of BASE_DIR (config.json, model.safetensors) and the PEFT adapter
 *     directory ADAPTER; or, with ADAPTER "new:DIR", wraps query and value itself (r 4, alpha 8,
 *     lora_B random as init_lora_weights=False) and saves the adapter to DIR. Runs IN (i64 B, L,
 *     input_ids, attention_mask, token_type_ids) and backward of sum(last_hidden_state * sin(0.37 i + 0.1));
 *     OUT: f32 last_hidden_state, pooler_output, then the gradient of each lora parameter in
 *     the model's order (printed as "grad NAME NUMEL"). Exits 1 if a base parameter got one.
 *   lora_tool merge BASE_DIR ADAPTER OUT_DIR
 *     loads both, merge_and_unload, and saves the model (model.safetensors + config.json). */
#include <caccel/caccel.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void die(const char *what) {
    fprintf(stderr, "lora_tool: %s: %s\n", what, ca_last_error());
    exit(1);
}

static ca_module *load_base(const char *dir) {
    ca_bert_config c;
    if (ca_bert_config_load(dir, &c) != CA_OK) die("config");
    ca_module *m;
    if (ca_bert_model_create(&c, &m) != CA_OK) die("create");
    if (ca_bert_load_pretrained(m, dir, NULL) != CA_OK) die("load");
    ca_module_train(m, false);
    return m;
}

static void add_adapter(ca_module *m, const char *adapter) {
    if (strncmp(adapter, "new:", 4) != 0) {
        if (ca_lora_load(m, adapter) != CA_OK) die("ca_lora_load");
        return;
    }
    static const char *const qv[] = {"query", "value"};
    ca_lora_config c;
    ca_lora_config_init(&c);
    c.r = 4;
    c.lora_alpha = 8;
    c.target_modules = qv;
    c.n_target_modules = 2;
    c.init_lora_weights = false;
    ca_manual_seed(3);
    int n;
    if (ca_lora_apply(m, &c, &n) != CA_OK) die("ca_lora_apply");
    printf("wrapped %d layers\n", n);
    if (ca_lora_save(m, adapter + 4) != CA_OK) die("ca_lora_save");
}

static void write_tensor(FILE *f, ca_tensor *t) {
    size_t n = ca_tensor_nbytes(t);
    void *h = malloc(n);
    if (ca_tensor_to_host(t, h, n) != CA_OK) die("to_host");
    fwrite(h, 1, n, f);
    free(h);
}

static int64_t *read_input(const char *path, int64_t *shape) {
    FILE *f = fopen(path, "rb");
    if (!f || fread(shape, sizeof *shape, 2, f) != 2) die("input");
    int64_t bl = shape[0] * shape[1];
    int64_t *buf = malloc((size_t)(3 * bl) * sizeof *buf);
    if (fread(buf, sizeof *buf, (size_t)(3 * bl), f) != (size_t)(3 * bl)) die("input");
    fclose(f);
    return buf;
}

static int forward(const char *base, const char *adapter, const char *in, const char *out) {
    ca_module *m = load_base(base);
    add_adapter(m, adapter);
    int64_t shape[2];
    int64_t *buf = read_input(in, shape), bl = shape[0] * shape[1];
    ca_device *cpu = ca_cpu_device();
    FILE *f = fopen(out, "wb");
    if (!f) die(out);
    int bad = 0;
    CA_SCOPE {
        ca_tensor *ids = ca_from_host(cpu, CA_I64, 2, shape, buf);
        ca_tensor *mask = ca_from_host(cpu, CA_I64, 2, shape, buf + bl);
        ca_tensor *types = ca_from_host(cpu, CA_I64, 2, shape, buf + 2 * bl);
        ca_bert_output o;
        if (ca_bert_forward(m, ids, mask, types, &o) != CA_OK) die("forward");
        write_tensor(f, o.last_hidden_state);
        write_tensor(f, o.pooler_output);
        /* LayerNorm's output has a near-constant sum and sum of squares: weight it instead */
        int64_t n = ca_tensor_numel(o.last_hidden_state);
        float *w = malloc((size_t)n * sizeof *w);
        for (int64_t i = 0; i < n; i++) w[i] = sinf(0.37f * (float)i + 0.1f);
        ca_tensor *wt = ca_from_host(cpu, CA_F32, 3, ca_tensor_shape(o.last_hidden_state), w);
        free(w);
        if (ca_autograd_backward(ca_sum(ca_mul(o.last_hidden_state, wt))) != CA_OK) die("backward");
        for (int i = 0; i < ca_module_num_params(m); i++) {
            const char *name = ca_module_param_name(m, i);
            ca_tensor *g = ca_tensor_grad(ca_module_param_at(m, i));
            if (!strstr(name, "lora_")) {
                if (g) fprintf(stderr, "lora_tool: frozen parameter %s has a gradient\n", name), bad = 1;
                continue;
            }
            if (!g) fprintf(stderr, "lora_tool: %s has no gradient\n", name), bad = 1;
            else {
                printf("grad %s %lld\n", name, (long long)ca_tensor_numel(g));
                write_tensor(f, g);
            }
        }
    }
    fclose(f);
    free(buf);
    ca_module_destroy(m);
    return bad;
}

static int merge(const char *base, const char *adapter, const char *out) {
    ca_module *m = load_base(base);
    add_adapter(m, adapter);
    if (ca_lora_merge_and_unload(m) != CA_OK) die("merge_and_unload");
    mkdir(out, 0777);
    if (ca_save_model(NULL, m, out, 0) != CA_OK || ca_bert_save_config(m, out, NULL) != CA_OK) die("save");
    ca_module_destroy(m);
    return 0;
}

int main(int argc, char **argv) {
    int rc = 2;
    if (argc == 6 && !strcmp(argv[1], "forward")) rc = forward(argv[2], argv[3], argv[4], argv[5]);
    else if (argc == 5 && !strcmp(argv[1], "merge")) rc = merge(argv[2], argv[3], argv[4]);
    else fprintf(stderr, "usage: lora_tool forward BASE ADAPTER|new:DIR IN OUT | merge BASE ADAPTER OUT\n");
    ca_shutdown();
    return rc;
}
