/* text_tool: the C side of tests/test_tokenizer_parity.sh and tests/test_minilm_files.sh.
 *
 *   text_tool encode TOKENIZER MAXLEN  stdin: lines "HEX_A" or "HEX_A HEX_B" (UTF-8 bytes in hex;
 *                                      "-" for the empty string); stdout per line:
 *                                      "ids;type_ids;mask" (space-separated numbers), or, with
 *                                      MAXLEN 0, the ids of ca_tokenizer_tokenize; a text
 *                                      the tokenizer refuses (bad UTF-8) prints "ERR"
 *   text_tool decode TOKENIZER SKIP    stdin: lines of ids ("-": none); stdout: the text of
 *                                      ca_tokenizer_decode in hex ("-": empty), SKIP 1 leaves the
 *                                      special tokens out
 *   text_tool fortunes DIR [COLL...]   every entry of the collections (default: the dataset's
 *                                      four): "COLLECTION INDEX HEX"
 *   text_tool dataset TOKENIZER DIR    the fortunes dataset's per-class counts, both splits
 *   text_tool bert DIR                 config.json's fields, and model.safetensors checked
 *                                      against them */
#include <caccel/caccel.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *unhex(const char *h) {
    if (strcmp(h, "-") == 0) return strdup("");
    size_t n = strlen(h) / 2;
    char *s = malloc(n + 1);
    for (size_t i = 0; s && i < n; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        s[i] = (char)v;
    }
    if (s) s[n] = '\0';
    return s;
}

static void print_row(const int64_t *v, int64_t n, const char *end) {
    for (int64_t i = 0; i < n; i++) printf(i ? " %lld" : "%lld", (long long)v[i]);
    fputs(end, stdout);
}

static int encode(const char *path, int64_t L) {
    ca_tokenizer *t;
    CA_CHECK(ca_tokenizer_load(path, &t));
    static char line[1 << 22];
    int64_t *buf = malloc(3 * (size_t)(L > 0 ? L : 1) * sizeof *buf);
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = '\0';
        char *sp = strchr(line, ' ');
        if (sp) *sp = '\0';
        char *a = unhex(line), *b = sp ? unhex(sp + 1) : NULL;
        if (L == 0) {
            int64_t *ids, n;
            if (ca_tokenizer_tokenize(t, a, &ids, &n) != CA_OK) {
                puts("ERR");
            } else {
                print_row(ids, n, "\n");
                free(ids);
            }
        } else if (ca_tokenizer_encode(t, a, b, L, buf, buf + L, buf + 2 * L, NULL) != CA_OK) {
            puts("ERR");
        } else {
            print_row(buf, L, ";");
            print_row(buf + L, L, ";");
            print_row(buf + 2 * L, L, "\n");
        }
        free(a);
        free(b);
    }
    free(buf);
    ca_tokenizer_destroy(t);
    return 0;
}

static int decode(const char *path, bool skip) {
    ca_tokenizer *t;
    CA_CHECK(ca_tokenizer_load(path, &t));
    static char line[1 << 22];
    int64_t *ids = malloc(sizeof line / 2 * sizeof *ids);
    while (ids && fgets(line, sizeof line, stdin)) {
        int64_t n = 0;
        for (char *p = line, *e; *p && *p != '\n' && *p != '-'; p = e) {
            ids[n++] = strtoll(p, &e, 10);
            if (e == p) break;
        }
        char *text;
        CA_CHECK(ca_tokenizer_decode(t, ids, n, skip, &text));
        if (!*text) putchar('-');
        for (const unsigned char *p = (const unsigned char *)text; *p; p++) printf("%02x", *p);
        putchar('\n');
        free(text);
    }
    free(ids);
    ca_tokenizer_destroy(t);
    return 0;
}

static int dump(const char *dir, int n, char **names) {
    int nd;
    const char *const *def = ca_fortunes_default_collections(&nd);
    for (int c = 0; c < (n ? n : nd); c++) {
        const char *name = n ? names[c] : def[c];
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        char **e;
        int64_t k;
        CA_CHECK(ca_fortunes_read(path, &e, &k));
        for (int64_t i = 0; i < k; i++) {
            printf("%s %lld ", name, (long long)i);
            for (const unsigned char *p = (const unsigned char *)e[i]; *p; p++) printf("%02x", *p);
            putchar('\n');
        }
        ca_fortunes_free(e, k);
    }
    return 0;
}

static int dataset(const char *path, const char *dir) {
    ca_tokenizer *t;
    CA_CHECK(ca_tokenizer_load(path, &t));
    for (int train = 1; train >= 0; train--) {
        ca_fortunes_opts o = {.dir = dir, .train = train};
        ca_fortunes_info info;
        ca_dataset *d;
        CA_CHECK(ca_fortunes_open(t, &o, &d, &info));
        printf("%s:", train ? "train" : "test");
        for (int c = 0; c < info.num_classes; c++)
            printf(" %s=%lld", info.names[c], (long long)info.count[c]);
        printf(" total=%lld truncated=%lld duplicates=%lld\n", (long long)info.total,
               (long long)info.truncated, (long long)info.duplicates);
        ca_dataset_destroy(d);
    }
    ca_tokenizer_destroy(t);
    return 0;
}

static int bert(const char *dir) {
    ca_bert_config c;
    CA_CHECK(ca_bert_config_load(dir, &c));
    printf("config: architectures=%s vocab_size=%lld hidden_size=%lld num_hidden_layers=%lld "
           "num_attention_heads=%lld intermediate_size=%lld hidden_act=%s "
           "max_position_embeddings=%lld type_vocab_size=%lld layer_norm_eps=%g pad_token_id=%lld "
           "num_labels=%lld\n",
           c.architectures, (long long)c.vocab_size, (long long)c.hidden_size,
           (long long)c.num_hidden_layers, (long long)c.num_attention_heads,
           (long long)c.intermediate_size, c.hidden_act, (long long)c.max_position_embeddings,
           (long long)c.type_vocab_size, c.layer_norm_eps, (long long)c.pad_token_id,
           (long long)c.num_labels);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ca_bert_check r;
    CA_CHECK(ca_bert_check_checkpoint(path, &c, &r));
    printf("checkpoint: prefix='%s' matched=%lld of %lld extra=%lld pooler=%s gamma_beta=%s\n",
           r.prefix, (long long)r.matched, (long long)ca_bert_tensor_names(&c, NULL, 0),
           (long long)r.extra, r.has_pooler ? "yes" : "no", r.gamma_beta ? "yes" : "no");
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "encode") == 0) return encode(argv[2], atoll(argv[3]));
    if (argc == 4 && strcmp(argv[1], "decode") == 0) return decode(argv[2], atoi(argv[3]) != 0);
    if (argc >= 3 && strcmp(argv[1], "fortunes") == 0) return dump(argv[2], argc - 3, argv + 3);
    if (argc == 4 && strcmp(argv[1], "dataset") == 0) return dataset(argv[2], argv[3]);
    if (argc == 3 && strcmp(argv[1], "bert") == 0) return bert(argv[2]);
    fprintf(stderr, "usage: text_tool encode TOKENIZER MAXLEN | decode TOKENIZER SKIP | "
                    "fortunes DIR [COLL...] | "
                    "dataset TOKENIZER DIR | bert DIR\n");
    return 2;
}
