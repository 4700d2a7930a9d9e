/* BERT's WordPiece tokenizer on a small hand-written vocabulary (vocab.txt and tokenizer.json), its
 * errors, and the fortunes reader and dataset on hand-written fortune files. No Python needed;
 * tests/test_tokenizer_parity.sh checks the real vocabulary against Hugging Face. */
#include "test_util.h"

#include <sys/stat.h>

static char g_tmp[] = "/tmp/caccel-tok-XXXXXX";

/* ids 0..22 */
static const char *const VOCAB[] = {
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "un", "##aff", "##able", ",",
    "!", "cafe", "\xe6\x88\x91" /* 我 */, "\xe7\x88\xb1" /* 爱 */, "a", "##a", ".", "the", "##s",
    "Hello", "caf\xc3\xa9" /* café */, "i"};

static void write_file(const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_tmp, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static const char *path_of(const char *name) {
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", g_tmp, name);
    return p;
}

/* The vocabulary as a minimal Hugging Face tokenizer.json (BERT's shape), with `model_type`. */
static void write_json(const char *name, const char *model_type) {
    char buf[8192];
    int k = snprintf(buf, sizeof buf, "{\"version\":\"1.0\",\"added_tokens\":["
                     "{\"id\":0,\"content\":\"[PAD]\",\"special\":true,\"normalized\":false},"
                     "{\"id\":1,\"content\":\"[UNK]\",\"special\":true,\"normalized\":false},"
                     "{\"id\":2,\"content\":\"[CLS]\",\"special\":true,\"normalized\":false},"
                     "{\"id\":3,\"content\":\"[SEP]\",\"special\":true,\"normalized\":false}],"
                     "\"normalizer\":{\"type\":\"BertNormalizer\",\"clean_text\":true,"
                     "\"handle_chinese_chars\":true,\"strip_accents\":null,\"lowercase\":true},"
                     "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"
                     "\"post_processor\":{\"type\":\"BertProcessing\",\"sep\":[\"[SEP]\",3],"
                     "\"cls\":[\"[CLS]\",2]},"
                     "\"model\":{\"type\":\"%s\",\"unk_token\":\"[UNK]\","
                     "\"continuing_subword_prefix\":\"##\",\"max_input_chars_per_word\":100,"
                     "\"vocab\":{",
                     model_type);
    for (size_t i = 0; i < sizeof VOCAB / sizeof *VOCAB; i++)
        k += snprintf(buf + k, sizeof buf - (size_t)k, "%s\"%s\":%zu", i ? "," : "", VOCAB[i], i);
    snprintf(buf + k, sizeof buf - (size_t)k, "}}}");
    write_file(name, buf);
}

static int setup(void **state) {
    (void)state;
    if (!mkdtemp(g_tmp) || mkdir(path_of("f"), 0700) != 0) return -1;
    char buf[4096] = "";
    for (size_t i = 0; i < sizeof VOCAB / sizeof *VOCAB; i++) {
        strcat(buf, VOCAB[i]);
        strcat(buf, "\n");
    }
    write_file("vocab.txt", buf);
    write_json("tokenizer.json", "WordPiece");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    return system(cmd);
}

static ca_tokenizer *load(const char *name) {
    ca_tokenizer *t = NULL;
    T_OK(ca_tokenizer_load(path_of(name), &t));
    return t;
}

/* The ids of text, as a string "5 10 6". */
static const char *ids_of(const ca_tokenizer *t, const char *text) {
    static char out[1024];
    int64_t *ids, n;
    T_OK(ca_tokenizer_tokenize(t, text, &ids, &n));
    out[0] = '\0';
    for (int64_t i = 0; i < n; i++)
        snprintf(out + strlen(out), sizeof out - strlen(out), i ? " %lld" : "%lld", (long long)ids[i]);
    free(ids);
    return out;
}

static void check_basics(const ca_tokenizer *t) {
    assert_int_equal(ca_tokenizer_vocab_size(t), 23);
    assert_int_equal(ca_tokenizer_token_id(t, "##aff"), 8);
    assert_int_equal(ca_tokenizer_token_id(t, "nope"), -1);
    assert_string_equal(ca_tokenizer_token(t, 12), "cafe");
    assert_null(ca_tokenizer_token(t, 23));
    assert_int_equal(ca_tokenizer_special_id(t, CA_TOKEN_PAD), 0);
    assert_int_equal(ca_tokenizer_special_id(t, CA_TOKEN_UNK), 1);
    assert_int_equal(ca_tokenizer_special_id(t, CA_TOKEN_CLS), 2);
    assert_int_equal(ca_tokenizer_special_id(t, CA_TOKEN_SEP), 3);
    /* lower-casing, punctuation split, whitespace */
    assert_string_equal(ids_of(t, "Hello, World!"), "5 10 6 11");
    assert_string_equal(ids_of(t, "  hello\xe3\x80\x80world\t\n"), "5 6");  /* U+3000 */
    /* WordPiece: greedy longest match with ## continuations; a miss makes the word [UNK] */
    assert_string_equal(ids_of(t, "unaffable"), "7 8 9");
    assert_string_equal(ids_of(t, "unaffablex world"), "1 6");
    assert_string_equal(ids_of(t, "aaa."), "15 16 16 17");
    /* accents stripped (NFD, marks dropped) before lower-casing: café and CAFÉ are cafe */
    assert_string_equal(ids_of(t, "Caf\xc3\xa9 CAF\xc3\x89 cafe\xcc\x81"), "12 12 12");
    /* İ (U+0130) lower-cases to i + U+0307, whose mark is stripped */
    assert_string_equal(ids_of(t, "\xc4\xb0"), "22");
    /* CJK ideographs are words of their own, with or without spaces */
    assert_string_equal(ids_of(t, "\xe6\x88\x91\xe7\x88\xb1" "a\xe6\x88\x91" "a"), "13 14 15 13 15");
    /* control and format characters vanish; other whitespace separates */
    assert_string_equal(ids_of(t, "hel\x01lo w\xc2\xadorld\x7f"), "5 6");
    assert_string_equal(ids_of(t, "hello\x0bworld"), "1");            /* \v is Cc: dropped */
    /* special tokens are matched in the raw text, inside words too; lower case is not one */
    assert_string_equal(ids_of(t, "hello[SEP]world [sep]"), "5 3 6 1 1 1");
    assert_string_equal(ids_of(t, ""), "");
    assert_string_equal(ids_of(t, " \t "), "");
}

static void test_vocab_txt(void **state) {
    (void)state;
    ca_tokenizer *t = load("vocab.txt");
    assert_int_equal(ca_tokenizer_special_id(t, CA_TOKEN_MASK), 4);
    check_basics(t);
    ca_tokenizer_destroy(t);
}

static void test_tokenizer_json(void **state) {
    (void)state;
    ca_tokenizer *t = load("tokenizer.json");
    assert_int_equal(ca_tokenizer_special_id(t, CA_TOKEN_MASK), 4);
    check_basics(t);
    ca_tokenizer_destroy(t);
    /* a directory: tokenizer.json first */
    T_OK(ca_tokenizer_load(g_tmp, &t));
    assert_int_equal(ca_tokenizer_vocab_size(t), 23);
    ca_tokenizer_destroy(t);
}

static void test_options(void **state) {
    (void)state;
    ca_tokenizer_options o;
    ca_tokenizer_options_default(&o);
    o.strip_accents = 0;
    ca_tokenizer *t;
    T_OK(ca_tokenizer_load_vocab(path_of("vocab.txt"), &o, &t));
    assert_string_equal(ids_of(t, "Caf\xc3\xa9"), "21");               /* café kept */
    ca_tokenizer_destroy(t);
    o.lowercase = false;                                                /* cased */
    T_OK(ca_tokenizer_load_vocab(path_of("vocab.txt"), &o, &t));
    assert_string_equal(ids_of(t, "Hello hello HELLO"), "20 5 1");
    ca_tokenizer_destroy(t);
    ca_tokenizer_options_default(&o);
    o.max_input_chars_per_word = 5;
    o.handle_chinese_chars = false;
    T_OK(ca_tokenizer_load_vocab(path_of("vocab.txt"), &o, &t));
    assert_string_equal(ids_of(t, "aaaaa aaaaaa"), "15 16 16 16 16 1");
    assert_string_equal(ids_of(t, "\xe6\x88\x91\xe7\x88\xb1"), "1");  /* one unknown word */
    ca_tokenizer_destroy(t);
}

static void expect(const int64_t *got, const int64_t *want, int n) {
    for (int i = 0; i < n; i++)
        if (got[i] != want[i]) fail_msg("position %d: got %lld, want %lld", i, (long long)got[i],
                                        (long long)want[i]);
}

static void test_encode(void **state) {
    (void)state;
    ca_tokenizer *t = load("vocab.txt");
    int64_t ids[16], ty[16], m[16], len;
    T_OK(ca_tokenizer_encode(t, "hello world", NULL, 8, ids, ty, m, &len));
    expect(ids, (int64_t[]){2, 5, 6, 3, 0, 0, 0, 0}, 8);
    expect(ty, (int64_t[]){0, 0, 0, 0, 0, 0, 0, 0}, 8);
    expect(m, (int64_t[]){1, 1, 1, 1, 0, 0, 0, 0}, 8);
    assert_int_equal(len, 4);
    /* truncation keeps [SEP] */
    T_OK(ca_tokenizer_encode(t, "hello world hello world", NULL, 4, ids, NULL, m, &len));
    expect(ids, (int64_t[]){2, 5, 6, 3}, 4);
    expect(m, (int64_t[]){1, 1, 1, 1}, 4);
    T_OK(ca_tokenizer_encode(t, "", NULL, 3, ids, ty, m, &len));
    expect(ids, (int64_t[]){2, 3, 0}, 3);
    assert_int_equal(len, 2);
    /* pairs: type 1 for the second sentence and its [SEP] */
    T_OK(ca_tokenizer_encode(t, "hello", "world", 8, ids, ty, m, &len));
    expect(ids, (int64_t[]){2, 5, 3, 6, 3, 0, 0, 0}, 8);
    expect(ty, (int64_t[]){0, 0, 0, 1, 1, 0, 0, 0}, 8);
    expect(m, (int64_t[]){1, 1, 1, 1, 1, 0, 0, 0}, 8);
    /* longest first: the shorter keeps all when it fits in half the room ... */
    T_OK(ca_tokenizer_encode(t, "a a a a a a", "hello", 7, ids, ty, NULL, NULL));
    expect(ids, (int64_t[]){2, 15, 15, 15, 3, 5, 3}, 7);
    /* ... else both get half, the longer the odd one (room 5: 3 + 2) */
    T_OK(ca_tokenizer_encode(t, "a a a a", "world world world", 8, ids, ty, NULL, NULL));
    expect(ids, (int64_t[]){2, 15, 15, 15, 3, 6, 6, 3}, 8);
    expect(ty, (int64_t[]){0, 0, 0, 0, 0, 1, 1, 1}, 8);
    T_OK(ca_tokenizer_encode(t, "a a a", "world world world", 8, ids, ty, NULL, NULL));
    expect(ids, (int64_t[]){2, 15, 15, 3, 6, 6, 6, 3}, 8);      /* equal: the second */
    /* too short for the special tokens */
    assert_int_equal(ca_tokenizer_encode(t, "a", "b", 2, ids, NULL, NULL, NULL), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "max_length 2"));
    /* bad UTF-8 names the byte */
    int64_t *v, n;
    assert_int_equal(ca_tokenizer_tokenize(t, "abc\xff", &v, &n), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "not valid UTF-8 at byte 3"));
    assert_int_equal(ca_tokenizer_tokenize(t, "[SEP]ab\xc3", &v, &n), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "at byte 7"));
    ca_tokenizer_destroy(t);
}

/* Loads `name` after writing `text` into it, expecting status s and a message naming the file
 * and holding `what`. */
static void expect_load_error(const char *name, const char *text, ca_status s, const char *what) {
    if (text) write_file(name, text);
    ca_tokenizer *t = (ca_tokenizer *)1;
    assert_int_equal(ca_tokenizer_load(path_of(name), &t), s);
    assert_null(t);
    const char *msg = ca_last_error();
    if (!strstr(msg, path_of(name)) || !strstr(msg, what))
        fail_msg("message '%s' lacks '%s' or '%s'", msg, path_of(name), what);
}

static void test_errors(void **state) {
    (void)state;
    expect_load_error("missing.json", NULL, CA_ERR_IO, "cannot open");
    expect_load_error("missing-vocab.txt", NULL, CA_ERR_IO, "cannot open");
    /* json-c calls a truncated text "continue" */
    expect_load_error("bad.json", "{\"model\": [1, 2", CA_ERR_INVALID,
                      "not valid JSON: unexpected end of input at byte 15");
    write_json("unigram.json", "Unigram");
    expect_load_error("unigram.json", NULL, CA_ERR_UNSUPPORTED,
                      "model.type is 'Unigram'; only 'WordPiece' or 'BPE'");
    /* BERT's file as BPE: its "##" prefix is refused by name */
    write_json("bpe.json", "BPE");
    expect_load_error("bpe.json", NULL, CA_ERR_UNSUPPORTED, "model.continuing_subword_prefix");
    expect_load_error("nomodel.json", "{\"normalizer\": null}", CA_ERR_UNSUPPORTED,
                      "model.type is missing");
    expect_load_error("ids.json",
                      "{\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\","
                      "\"vocab\":{\"[UNK]\":0,\"a\":5}}}",
                      CA_ERR_INVALID, "model.vocab['a'] = 5");
    expect_load_error("norm.json",
                      "{\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\","
                      "\"vocab\":{\"[UNK]\":0}},\"normalizer\":{\"type\":\"NFC\"}}",
                      CA_ERR_UNSUPPORTED, "normalizer.type is 'NFC'");
    expect_load_error("unk.json",
                      "{\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"<unk>\","
                      "\"vocab\":{\"[UNK]\":0}}}",
                      CA_ERR_INVALID, "model.unk_token '<unk>'");
    expect_load_error("post.json",
                      "{\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\","
                      "\"vocab\":{\"[UNK]\":0,\"[PAD]\":1}},"
                      "\"normalizer\":{\"type\":\"BertNormalizer\"},"
                      "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"
                      "\"post_processor\":{\"type\":\"BertProcessing\",\"cls\":\"[CLS]\"}}",
                      CA_ERR_INVALID, "post_processor's [CLS]/[SEP] ids");
    expect_load_error("tmpl.json",
                      "{\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\","
                      "\"vocab\":{\"[UNK]\":0,\"[PAD]\":1}},"
                      "\"normalizer\":{\"type\":\"BertNormalizer\"},"
                      "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"
                      "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[],"
                      "\"pair\":[]}}",
                      CA_ERR_UNSUPPORTED, "post_processor is not BERT's template");
    expect_load_error("nounk.txt", "[PAD]\n[CLS]\n[SEP]\nhello\n", CA_ERR_INVALID, "no [UNK]");
    expect_load_error("empty.txt", "", CA_ERR_INVALID, "empty");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/nothing", g_tmp);
    assert_int_equal(mkdir(dir, 0700), 0);
    ca_tokenizer *t;
    assert_int_equal(ca_tokenizer_load(dir, &t), CA_ERR_NOT_FOUND);
    assert_non_null(strstr(ca_last_error(), "neither tokenizer.json nor vocab.txt"));
}

/* ------------------------------------------------------------------ fortunes */

/* WordPiece's decoder as tokenizers': "##" pieces join, cleanup glues punctuation. */
static void test_decode(void **state) {
    (void)state;
    ca_tokenizer *t = load("tokenizer.json");
    assert_string_equal(ca_tokenizer_model(t), "WordPiece");
    int64_t ids[] = {2, 5, 10, 7, 8, 9, 11, 3};
    char *text;
    T_OK(ca_tokenizer_decode(t, ids, 8, true, &text));
    assert_string_equal(text, "hello, unaffable!");
    free(text);
    T_OK(ca_tokenizer_decode(t, ids, 8, false, &text));
    assert_string_equal(text, "[CLS] hello, unaffable! [SEP]");
    free(text);
    int64_t bad[] = {5, 23};
    assert_int_equal(ca_tokenizer_decode(t, bad, 2, true, &text), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "id 23 (at 1)"));
    ca_tokenizer_destroy(t);
}

static void test_fortunes_read(void **state) {
    (void)state;
    write_file("f/alpha", "hello world\n%\n\n%\nthe cafe\n-- a\n%\n%\nlast, no percent");
    char **e;
    int64_t n;
    T_OK(ca_fortunes_read(path_of("f/alpha"), &e, &n));
    assert_int_equal(n, 3);
    assert_string_equal(e[0], "hello world");
    assert_string_equal(e[1], "the cafe\n-- a");
    assert_string_equal(e[2], "last, no percent");
    ca_fortunes_free(e, n);
    write_file("f/bad", "ok\n%\nfine\nbad \xff here\n%\n");
    assert_int_equal(ca_fortunes_read(path_of("f/bad"), &e, &n), CA_ERR_INVALID);
    assert_non_null(strstr(ca_last_error(), "line 4 is not valid UTF-8"));
    assert_non_null(strstr(ca_last_error(), path_of("f/bad")));
    assert_int_equal(ca_fortunes_read(path_of("f/none"), &e, &n), CA_ERR_IO);
    assert_non_null(strstr(ca_last_error(), path_of("f/none")));
    assert_non_null(strstr(ca_last_hint(), "fortunes"));
}

static void test_fortunes_dataset(void **state) {
    (void)state;
    /* alpha: 7 entries (one repeated within it), beta: 6 (one of them alpha's) */
    write_file("f/alpha", "hello\n%\nworld\n%\na a\n%\nhello\n%\nthe\n%\ncafe\n%\nun\n%\n");
    write_file("f/beta", "a\n%\nhello world\n%\nworld\n%\nthe cafe\n%\nthe a\n%\nun un un\n%\n");
    ca_tokenizer *t = load("vocab.txt");
    const char *cols[] = {"alpha", "beta"};
    char dir[512];
    snprintf(dir, sizeof dir, "%s/f", g_tmp);
    ca_fortunes_opts o = {.dir = dir, .collections = cols, .num_collections = 2, .train = true,
                          .max_length = 4};
    ca_fortunes_info info;
    ca_dataset *d;
    T_OK(ca_fortunes_open(t, &o, &d, &info));
    /* alpha: indices 0 1 2 (3 is a repeat) 5 6 train, 4 held out; beta: 0 1 3 train, 2 is a
     * repeat of alpha's "world", 4 held out, 5 train */
    assert_int_equal(info.num_classes, 2);
    assert_string_equal(info.names[1], "beta");
    assert_int_equal(info.count[0], 5);
    assert_int_equal(info.count[1], 4);
    assert_int_equal(info.total, 9);
    assert_int_equal(info.duplicates, 2);
    assert_int_equal(info.truncated, 1);                /* "un un un": 3 tokens + 2 > 4 */
    assert_int_equal(ca_dataset_length(d), 9);
    const ca_sample_spec *xs = ca_dataset_x_spec(d), *ys = ca_dataset_y_spec(d);
    assert_int_equal(xs->dtype, CA_I64);
    assert_int_equal(xs->ndim, 2);
    assert_int_equal(xs->shape[0], 2);
    assert_int_equal(xs->shape[1], 4);
    assert_int_equal(ys->ndim, 0);
    int64_t x[8], y;
    T_OK(ca_dataset_get(d, 1, x, &y));                  /* alpha's "world" */
    expect(x, (int64_t[]){2, 6, 3, 0, 1, 1, 1, 0}, 8);
    assert_int_equal(y, 0);
    T_OK(ca_dataset_get(d, 6, x, &y));                  /* beta's "hello world": fits */
    expect(x, (int64_t[]){2, 5, 6, 3, 1, 1, 1, 1}, 8);
    assert_int_equal(y, 1);
    ca_dataset_destroy(d);
    o.train = false;
    T_OK(ca_fortunes_open(t, &o, &d, &info));
    assert_int_equal(info.count[0], 1);
    assert_int_equal(info.count[1], 1);
    T_OK(ca_dataset_get(d, 1, x, &y));                  /* beta's "the a" */
    expect(x, (int64_t[]){2, 18, 15, 3, 1, 1, 1, 1}, 8);
    assert_int_equal(y, 1);
    ca_dataset_destroy(d);
    /* a missing collection names its path */
    const char *missing[] = {"alpha", "gamma"};
    o.collections = missing;
    assert_int_equal(ca_fortunes_open(t, &o, &d, NULL), CA_ERR_IO);
    assert_non_null(strstr(ca_last_error(), "f/gamma"));
    assert_null(d);
    ca_tokenizer_destroy(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab_txt),        cmocka_unit_test(test_tokenizer_json),
        cmocka_unit_test(test_options),          cmocka_unit_test(test_encode),
        cmocka_unit_test(test_errors),           cmocka_unit_test(test_decode),
        cmocka_unit_test(test_fortunes_read),
        cmocka_unit_test(test_fortunes_dataset),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
