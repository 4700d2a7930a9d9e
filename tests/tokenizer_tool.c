/* tokenizer_tool: the C side of tests/test_tokenizer_parity.sh.
 *
 *   tokenizer_tool encode TOKENIZER MAXLEN   stdin: lines "HEX_A" or "HEX_A HEX_B" (UTF-8 bytes
 *                                            in hex; "-" for the empty string); stdout per line:
 *                                            "ids;type_ids;mask" (space-separated numbers), or,
 *                                            with MAXLEN 0, the ids of ca_tokenizer_tokenize
 *   tokenizer_tool fortunes DIR [COLL...]    every entry of the collections (default: the
 *                                            dataset's four): "COLLECTION INDEX HEX"
 *   tokenizer_tool dataset TOKENIZER DIR     the fortunes dataset's per-class counts, both splits */
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
            CA_CHECK(ca_tokenizer_tokenize(t, a, &ids, &n));
            print_row(ids, n, "\n");
            free(ids);
        } else {
            CA_CHECK(ca_tokenizer_encode(t, a, b, L, buf, buf + L, buf + 2 * L, NULL));
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

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "encode") == 0) return encode(argv[2], atoll(argv[3]));
    if (argc >= 3 && strcmp(argv[1], "fortunes") == 0) return dump(argv[2], argc - 3, argv + 3);
    if (argc == 4 && strcmp(argv[1], "dataset") == 0) return dataset(argv[2], argv[3]);
    fprintf(stderr, "usage: tokenizer_tool encode TOKENIZER MAXLEN | fortunes DIR [COLL...] | "
                    "dataset TOKENIZER DIR\n");
    return 2;
}
