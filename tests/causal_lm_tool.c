/* causal_lm_tool: runs caccel's decoder LMs for tests/test_causal_lm_parity.sh.
 *   causal_lm_tool run MODEL_DIR IN OUT [SAVE_DIR]
 *     IN: i64 B, T, then input_ids, attention_mask, labels, position_ids (each B*T i64).
 *     OUT: f32 logits without mask or positions [B, T, V], logits with both [B, T, V], the loss of
 *     the second against labels, then every parameter's gradient after backward of that loss, in
 *     the module's parameter order; OUT.names: one line "name numel" per parameter.
 *     SAVE_DIR: also writes config.json, generation_config.json and model.safetensors there.
 *   causal_lm_tool logits MODEL_DIR IN OUT: only the first logits (for a sharded checkpoint). */
#include <caccel/caccel.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what) {
    fprintf(stderr, "causal_lm_tool: %s: %s\n", what, ca_last_error());
    exit(1);
}

static int64_t *read_input(const char *path, int64_t *b, int64_t *t) {
    FILE *f = fopen(path, "rb");
    int64_t hdr[2];
    if (!f || fread(hdr, 8, 2, f) != 2) die(path);
    size_t n = (size_t)(4 * hdr[0] * hdr[1]);
    int64_t *buf = malloc(n * 8);
    if (!buf || fread(buf, 8, n, f) != n) die("short input");
    fclose(f);
    *b = hdr[0];
    *t = hdr[1];
    return buf;
}

static void write_tensor(FILE *f, ca_tensor *t) {
    size_t n = ca_tensor_nbytes(t);
    void *h = malloc(n ? n : 1);
    if (!h || ca_tensor_to_host(t, h, n) != CA_OK) die("to_host");
    fwrite(h, 1, n, f);
    free(h);
}

static ca_module *load(const char *dir) {
    ca_causal_lm_config c;
    if (ca_causal_lm_config_load(dir, &c) != CA_OK) die("config");
    ca_module *m;
    if (ca_causal_lm_create(&c, &m) != CA_OK) die("create");
    ca_causal_lm_load_info info;
    if (ca_causal_lm_load_pretrained(m, dir, &info) != CA_OK) die("load");
    printf("%s: %d file(s), %lld tensors loaded, %lld unused\n", ca_module_type(m), info.files,
           (long long)info.loaded, (long long)info.unused);
    return m;
}

static void run_grad(ca_module *m, const int64_t *buf, int64_t shape[2], FILE *f, const char *names) {
    ca_device *cpu = ca_cpu_device();
    int64_t bt = shape[0] * shape[1];
    ca_tensor *ids = ca_from_host(cpu, CA_I64, 2, shape, buf);
    ca_tensor *mask = ca_from_host(cpu, CA_I64, 2, shape, buf + bt);
    ca_tensor *labels = ca_from_host(cpu, CA_I64, 2, shape, buf + 2 * bt);
    ca_tensor *pos = ca_from_host(cpu, CA_I64, 2, shape, buf + 3 * bt);
    ca_tensor *logits;
    if (ca_causal_lm_forward(m, ids, mask, pos, &logits) != CA_OK) die("forward with mask");
    ca_tensor *loss = ca_causal_lm_loss(logits, labels);
    if (!loss || ca_autograd_backward(loss) != CA_OK) die("loss");
    write_tensor(f, logits);
    write_tensor(f, loss);
    FILE *nf = fopen(names, "w");
    if (!nf) die(names);
    for (int i = 0; i < ca_module_num_params(m); i++) {
        ca_tensor *p = ca_module_param_at(m, i);
        ca_tensor *g = ca_tensor_grad(p);
        if (!g) die(ca_module_param_name(m, i));
        write_tensor(f, g);
        fprintf(nf, "%s %lld\n", ca_module_param_name(m, i), (long long)ca_tensor_numel(p));
    }
    fclose(nf);
}

static int run(const char *dir, const char *in, const char *out, const char *save, bool grads) {
    ca_module *m = load(dir);
    int64_t shape[2];
    int64_t *buf = read_input(in, &shape[0], &shape[1]);
    FILE *f = fopen(out, "wb");
    if (!f) die(out);
    ca_module_train(m, false);
    CA_NO_GRAD {
        ca_tensor *ids = ca_from_host(ca_cpu_device(), CA_I64, 2, shape, buf);
        ca_tensor *logits = ca_module_forward(m, ids);
        if (!logits) die("forward");
        write_tensor(f, logits);
    }
    if (grads) {
        char names[4096];
        snprintf(names, sizeof names, "%s.names", out);
        run_grad(m, buf, shape, f, names);
    }
    fclose(f);
    if (save && (ca_causal_lm_save_config(m, save) != CA_OK || ca_save_model(NULL, m, save, 0) != CA_OK))
        die("save");
    free(buf);
    ca_module_destroy(m);
    return 0;
}

int main(int argc, char **argv) {
    int rc = 2;
    if ((argc == 5 || argc == 6) && !strcmp(argv[1], "run"))
        rc = run(argv[2], argv[3], argv[4], argc == 6 ? argv[5] : NULL, true);
    else if (argc == 5 && !strcmp(argv[1], "logits"))
        rc = run(argv[2], argv[3], argv[4], NULL, false);
    else
        fprintf(stderr, "usage: causal_lm_tool run DIR IN OUT [SAVE_DIR] | logits DIR IN OUT\n");
    ca_scope_release_all();
    ca_shutdown();
    return rc;
}
