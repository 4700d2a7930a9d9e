/* bert_tool: runs caccel's BertModel for the parity scripts.
 *   bert_tool forward MODEL_DIR IN OUT
 *     IN: i64 B, L, then input_ids, attention_mask, token_type_ids (each B*L i64);
 *     OUT: f32 last_hidden_state [B, L, hidden] then pooler_output [B, hidden].
 *   bert_tool predict MODEL_DIR MAX_LENGTH OUT
 *     loads a BertForSequenceClassification checkpoint (config.json's num_labels) and the
 *     tokenizer of MODEL_DIR, evaluates the held-out fortunes split; OUT: i64 N, L, then
 *     input_ids and attention_mask (N*L each) and caccel's predicted labels (N). */
#include <caccel/caccel.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what) {
    fprintf(stderr, "bert_tool: %s: %s\n", what, ca_last_error());
    exit(1);
}

static void *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(*n ? *n : 1);
    if (!p || fread(p, 1, *n, f) != *n) { fprintf(stderr, "bert_tool: cannot read %s\n", path); exit(1); }
    fclose(f);
    return p;
}

static void write_tensor(FILE *f, ca_tensor *t) {
    size_t n = ca_tensor_nbytes(t);
    void *h = malloc(n);
    if (ca_tensor_to_host(t, h, n) != CA_OK) die("to_host");
    fwrite(h, 1, n, f);
    free(h);
}

static int forward(const char *dir, const char *in, const char *out) {
    ca_bert_config c;
    if (ca_bert_config_load(dir, &c) != CA_OK) die("config");
    ca_module *m;
    if (ca_bert_model_create(&c, &m) != CA_OK) die("create");
    ca_bert_load_info info;
    if (ca_bert_load_pretrained(m, dir, &info) != CA_OK) die("load");
    ca_module_train(m, false);
    size_t n;
    int64_t *buf = read_all(in, &n);
    int64_t shape[2] = {buf[0], buf[1]}, bl = buf[0] * buf[1];
    if (n != (size_t)(2 + 3 * bl) * sizeof(int64_t)) { fprintf(stderr, "bert_tool: bad input size\n"); return 1; }
    ca_device *cpu = ca_cpu_device();
    FILE *f = fopen(out, "wb");
    if (!f) { perror(out); return 1; }
    CA_NO_GRAD {
        ca_tensor *ids = ca_from_host(cpu, CA_I64, 2, shape, buf + 2);
        ca_tensor *mask = ca_from_host(cpu, CA_I64, 2, shape, buf + 2 + bl);
        ca_tensor *types = ca_from_host(cpu, CA_I64, 2, shape, buf + 2 + 2 * bl);
        ca_bert_output o;
        if (ca_bert_forward(m, ids, mask, types, &o) != CA_OK) die("forward");
        write_tensor(f, o.last_hidden_state);
        write_tensor(f, o.pooler_output);
    }
    fclose(f);
    printf("loaded %lld tensors (prefix '%s', %lld unused)\n", (long long)info.loaded, info.prefix,
           (long long)info.unused);
    free(buf);
    ca_module_destroy(m);
    return 0;
}

static int predict(const char *dir, int64_t max_length, const char *out) {
    ca_bert_config c;
    if (ca_bert_config_load(dir, &c) != CA_OK) die("config");
    ca_module *m;
    if (ca_bert_for_sequence_classification_create(&c, c.num_labels, &m) != CA_OK) die("create");
    ca_bert_load_info info;
    if (ca_bert_load_pretrained(m, dir, &info) != CA_OK) die("load");
    if (info.initialized) { fprintf(stderr, "bert_tool: %s not in the checkpoint\n", info.first_initialized); return 1; }
    ca_module_train(m, false);
    ca_tokenizer *tok;
    if (ca_tokenizer_load(dir, &tok) != CA_OK) die("tokenizer");
    ca_dataset *ds;
    ca_fortunes_info fi;
    if (ca_fortunes_open(tok, &(ca_fortunes_opts){.max_length = max_length}, &ds, &fi) != CA_OK) die("fortunes");
    int64_t nrows = ca_dataset_length(ds), l = max_length;
    int64_t *x = malloc((size_t)(nrows * 2 * l) * 8), *pred = malloc((size_t)nrows * 8), y;
    FILE *f = fopen(out, "wb");
    if (!f || !x || !pred) { perror(out); return 1; }
    for (int64_t i = 0; i < nrows; i++)
        if (ca_dataset_get(ds, i, x + i * 2 * l, &y) != CA_OK) die("dataset");
    const int64_t bs = 64;
    for (int64_t i = 0; i < nrows; i += bs) {
        int64_t b = nrows - i < bs ? nrows - i : bs;
        CA_NO_GRAD {
            ca_tensor *xt = ca_from_host(ca_cpu_device(), CA_I64, 3, (int64_t[]){b, 2, l}, x + i * 2 * l);
            ca_tensor *p = ca_argmax(ca_module_forward(m, xt));
            if (!p || ca_tensor_to_host(p, pred + i, (size_t)b * 8) != CA_OK) die("predict");
        }
    }
    int64_t hdr[2] = {nrows, l};
    fwrite(hdr, 8, 2, f);
    for (int row = 0; row < 2; row++)
        for (int64_t i = 0; i < nrows; i++) fwrite(x + i * 2 * l + row * l, 8, (size_t)l, f);
    fwrite(pred, 8, (size_t)nrows, f);
    fclose(f);
    free(x);
    free(pred);
    ca_dataset_destroy(ds);
    ca_tokenizer_destroy(tok);
    ca_module_destroy(m);
    return 0;
}

int main(int argc, char **argv) {
    int rc = 2;
    if (argc == 5 && !strcmp(argv[1], "forward")) rc = forward(argv[2], argv[3], argv[4]);
    else if (argc == 5 && !strcmp(argv[1], "predict")) rc = predict(argv[2], atoll(argv[3]), argv[4]);
    else fprintf(stderr, "usage: bert_tool forward DIR IN OUT | predict DIR MAX_LENGTH OUT\n");
    ca_scope_release_all();
    ca_shutdown();
    return rc;
}
