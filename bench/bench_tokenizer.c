/* Tokenizer throughput: ca_tokenizer_tokenize over every line of a file of texts (hex-encoded UTF-8,
 * one text per line, as tests/tokenizer_bpe_cases.py writes them), best of REPS passes, one thread.
 * Prints "MB/s tokens" for bench/run_tokenizer.sh, which sets it against Hugging Face's tokenizers
 * on the same tokenizer.json and texts.
 * usage: bench_tokenizer TOKENIZER.json TEXTS.hex REPS */
#include <caccel/caccel.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"

static int hexval(int c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

/* The texts of the file, decoded ("-" is the empty text). */
static char **read_texts(const char *path, int64_t *n, double *bytes) {
    FILE *f = fopen(path, "r");
    if (!f) { perror(path); exit(1); }
    char **v = NULL, *line = NULL;
    size_t cap = 0;
    int64_t nv = 0, capv = 0;
    ssize_t len;
    *bytes = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (nv == capv && !(v = realloc(v, sizeof *v * (size_t)(capv = capv ? 2 * capv : 1024)))) exit(1);
        size_t m = strcmp(line, "-") ? (size_t)len / 2 : 0;
        char *t = malloc(m + 1);
        if (!t) exit(1);
        for (size_t i = 0; i < m; i++) t[i] = (char)(hexval(line[2 * i]) << 4 | hexval(line[2 * i + 1]));
        t[m] = '\0';
        v[nv++] = t;
        *bytes += (double)m;
    }
    free(line);
    fclose(f);
    *n = nv;
    return v;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: bench_tokenizer TOKENIZER.json TEXTS.hex REPS\n");
        return 2;
    }
    ca_tokenizer *tok;
    CA_CHECK(ca_tokenizer_load(argv[1], &tok));
    int64_t n;
    double bytes, best = 1e30;
    char **texts = read_texts(argv[2], &n, &bytes);
    int reps = atoi(argv[3]);
    int64_t tokens = 0;
    for (int r = 0; r < (reps > 0 ? reps : 1); r++) {
        double t0 = now_s();
        tokens = 0;
        for (int64_t i = 0; i < n; i++) {
            int64_t *ids, k;
            CA_CHECK(ca_tokenizer_tokenize(tok, texts[i], &ids, &k));
            tokens += k;
            free(ids);
        }
        double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    printf("%.3f %lld\n", bytes / best / 1e6, (long long)tokens);
    for (int64_t i = 0; i < n; i++) free(texts[i]);
    free(texts);
    ca_tokenizer_destroy(tok);
    ca_shutdown();
    return 0;
}
