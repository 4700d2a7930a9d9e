/* The BPE tokenizer on small hand-written tokenizer.json files (tests/data/tokenizer-bpe): the
 * merge rules (rank before position, leftmost on a tie, stale queue entries, repeated pairs,
 * ignore_merges, unknown characters with and without unk_token and fuse_unk, byte fallback), Llama
 * 3's Split regex with Oniguruma's \s (U+0085 in, U+180E out), added tokens with lstrip / rstrip / single_word, the
 * template, the decoders, a long word in O(n log n), and every refusal by name. The expected ids
 * are what Hugging Face's tokenizers gives for the same files. No Python needed;
 * tests/test_tokenizer_bpe_parity.sh checks trained tokenizers against tokenizers itself. */
#include "test_util.h"

#include <time.h>

static const char *data(const char *name) {
    static char p[1024];
    const char *src = getenv("CACCEL_TEST_SRCDIR");
    snprintf(p, sizeof p, "%s/tests/data/tokenizer-bpe/%s", src ? src : ".", name);
    return p;
}

static ca_tokenizer *load(const char *name) {
    ca_tokenizer *t = NULL;
    T_OK(ca_tokenizer_load(data(name), &t));
    assert_string_equal(ca_tokenizer_model(t), "BPE");
    return t;
}

/* The ids of text as "5 10 6". */
static const char *ids_of(const ca_tokenizer *t, const char *text) {
    static char buf[4096];
    int64_t *ids, n;
    T_OK(ca_tokenizer_tokenize(t, text, &ids, &n));
    buf[0] = '\0';
    for (int64_t i = 0; i < n && strlen(buf) < sizeof buf - 32; i++)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), i ? " %lld" : "%lld", (long long)ids[i]);
    free(ids);
    return buf;
}

#define EXPECT_IDS(t, text, want) assert_string_equal(ids_of(t, text), want)

static void test_merges(void **state) {
    (void)state;
    ca_tokenizer *t = load("merges.json");
    assert_int_equal(ca_tokenizer_vocab_size(t), 12);
    assert_int_equal(ca_tokenizer_token_id(t, "abc"), 7);
    EXPECT_IDS(t, "abc", "7");      /* "b c" (rank 0) before "a b" (rank 1), then "a bc" */
    EXPECT_IDS(t, "aaa", "6 0");    /* a tie: the leftmost pair first */
    EXPECT_IDS(t, "aaaa", "9");     /* the stale (a, a) entry in the middle is skipped */
    EXPECT_IDS(t, "abcd", "7 3");   /* "c d" lost its c to "b c"; "abcd" needs ignore_merges */
    EXPECT_IDS(t, "xay", "0");      /* no unk_token: unknown characters are dropped */
    EXPECT_IDS(t, "", "");
    ca_tokenizer_destroy(t);
    /* merges as [a, b] lists, ignore_merges, unk_token fused */
    t = load("merges_list.json");
    EXPECT_IDS(t, "abcd", "10");
    EXPECT_IDS(t, "abc", "7");
    EXPECT_IDS(t, "xxa", "11 0");
    EXPECT_IDS(t, "xayb", "11 0 11 1");
    ca_tokenizer_destroy(t);
    t = load("unk.json");           /* unk_token, not fused */
    EXPECT_IDS(t, "xxa", "11 11 0");
    EXPECT_IDS(t, "xayb", "11 0 11 1");
    ca_tokenizer_destroy(t);
}

/* A word of 200,000 letters: the priority queue merges it in O(n log n) (a rescan per merge
 * would take minutes); "aa aa" then halves it to 4-letter tokens. */
static void test_long_word(void **state) {
    (void)state;
    ca_tokenizer *t = load("merges.json");
    size_t n = 200000;
    char *s = malloc(n + 1);
    memset(s, 'a', n);
    s[n] = '\0';
    int64_t *ids, k;
    clock_t c0 = clock();
    T_OK(ca_tokenizer_tokenize(t, s, &ids, &k));
    double secs = (double)(clock() - c0) / CLOCKS_PER_SEC;
    assert_int_equal(k, (int64_t)n / 4);
    for (int64_t i = 0; i < k; i++) assert_int_equal(ids[i], 9);
    double limit = getenv("CACCEL_UNDER_VALGRIND") ? 100 : 5;   /* about 0.05 s natively */
    if (secs > limit) fail_msg("200,000 letters took %.1f s of CPU", secs);
    free(ids);
    free(s);
    /* past 64 MiB a call is refused before any work, naming the size */
    size_t big = ((size_t)64 << 20) + 1;
    s = malloc(big + 1);
    memset(s, 'a', big);
    s[big] = '\0';
    ids = NULL;
    assert_int_equal(ca_tokenizer_tokenize(t, s, &ids, &k), CA_ERR_INVALID);
    assert_null(ids);
    assert_non_null(strstr(ca_last_error(), "the text has 67108865 bytes, more than the 67108864"));
    free(s);
    ca_tokenizer_destroy(t);
}

static void expect_decode(const ca_tokenizer *t, const int64_t *ids, int64_t n, bool skip,
                          const char *want) {
    char *text;
    T_OK(ca_tokenizer_decode(t, ids, n, skip, &text));
    assert_string_equal(text, want);
    free(text);
}

static void test_byte_fallback(void **state) {
    (void)state;
    ca_tokenizer *t = load("byte_fallback.json");
    EXPECT_IDS(t, "ab", "10");
    EXPECT_IDS(t, " ab", "10");              /* the space is the replacement: none prepended */
    EXPECT_IDS(t, "a \xc3\xa9\n", "9 6 3 4 5");     /* é and \n as <0xNN> tokens */
    EXPECT_IDS(t, "<s>ab</s>", "1 7 8 2");   /* prepend_scheme first: not after <s> */
    EXPECT_IDS(t, "\xf0\x9f\x98\x80" "ab", "6 0 7 8");  /* 😀's bytes have no tokens: <unk> */
    assert_int_equal(ca_tokenizer_special_id(t, CA_TOKEN_BOS), 1);
    assert_int_equal(ca_tokenizer_special_id(t, CA_TOKEN_UNK), 0);
    int64_t ids[8], ty[8], m[8], len;
    T_OK(ca_tokenizer_encode(t, "ab", NULL, 4, ids, ty, m, &len));
    assert_int_equal(len, 2);
    int64_t want_ids[] = {1, 10, 0, 0}, want_m[] = {1, 1, 0, 0};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ids[i], want_ids[i]);
        assert_int_equal(m[i], want_m[i]);
    }
    T_OK(ca_tokenizer_encode(t, "ab", "ab", 4, ids, ty, m, &len));   /* <s> A <s>:1 B:1 */
    assert_int_equal(ids[2], 1);
    assert_int_equal(ty[2], 1);
    assert_int_equal(ty[3], 1);
    int64_t dec[] = {1, 9, 6, 3, 4, 5};
    expect_decode(t, dec, 6, true, "a \xc3\xa9\n");
    expect_decode(t, dec, 6, false, "<s> a \xc3\xa9\n");
    int64_t half[] = {9, 3, 7};                /* a lone <0xC3>: U+FFFD */
    expect_decode(t, half, 3, true, "a\xef\xbf\xbd" "a");
    int64_t bad[] = {1, 99};
    char *text = (char *)1;
    assert_int_equal(ca_tokenizer_decode(t, bad, 2, true, &text), CA_ERR_INVALID);
    assert_null(text);
    assert_non_null(strstr(ca_last_error(), "id 99 (at 1)"));
    int64_t *none = NULL;
    assert_int_equal(ca_tokenizer_tokenize(t, "a\xc3", &none, &len), CA_ERR_INVALID);
    assert_null(none);
    assert_non_null(strstr(ca_last_error(), "not valid UTF-8 at byte 1"));
    ca_tokenizer_destroy(t);
}

static void test_split_bytelevel(void **state) {
    (void)state;
    ca_tokenizer *t = load("split_bytelevel.json");
    EXPECT_IDS(t, "the cat's", "116 256 32 99 97 116 261");   /* "h e" first; no "t he" merge */
    EXPECT_IDS(t, "THE'S", "84 72 69 39 83");                 /* (?i:'s) takes 'S */
    EXPECT_IDS(t, "x<mask>y  <mask>", "120 269 121 269");     /* <mask> lstrip eats the spaces */
    EXPECT_IDS(t, "word sword words (word)",                  /* single_word */
               "270 32 115 119 111 114 100 32 119 111 114 100 115 32 40 270 41");
    EXPECT_IDS(t, "a<r>   b", "97 271 98");                   /* <r> rstrip */
    /* U+0085 is \s: "\x85" | "\x85b", so the merge "Âħ b" applies */
    EXPECT_IDS(t, "a\xc2\x85\xc2\x85" "b", "97 263 264");
    /* U+180E is not \s for Oniguruma (PCRE2's own \s has it): "\u180e\u180e" | "b", so the
     * merge of U+180E and b does not apply */
    EXPECT_IDS(t, "a\xe1\xa0\x8e\xe1\xa0\x8e" "b", "97 266 266 98");
    EXPECT_IDS(t, "  \n\n  x", "32 32 10 10 32 32 120");
    EXPECT_IDS(t, "12345", "49 50 51 52 53");
    int64_t ids[8], ty[8], len;
    T_OK(ca_tokenizer_encode(t, "the", "cat", 8, ids, ty, NULL, &len));
    int64_t want[] = {268, 116, 256, 268, 99, 97, 116}, want_ty[] = {0, 0, 0, 1, 1, 1, 1};
    assert_int_equal(len, 7);
    for (int i = 0; i < 7; i++) {
        assert_int_equal(ids[i], want[i]);
        assert_int_equal(ty[i], want_ty[i]);
    }
    int64_t dec[] = {268, 120, 269, 121, 269};
    expect_decode(t, dec, 5, false, "<|begin_of_text|>x<mask>y<mask>");
    expect_decode(t, dec, 5, true, "xy");
    int64_t dec2[] = {97, 263, 264};
    expect_decode(t, dec2, 3, true, "a\xc2\x85\xc2\x85" "b");
    ca_tokenizer_destroy(t);
    t = load("gpt2.json");
    EXPECT_IDS(t, "the cat's", "116 256 32 99 97 116 261");
    EXPECT_IDS(t, "h\xc3\xa9llo", "104 195 169 108 108 111");
    int64_t d3[] = {104, 195, 169, 108, 108, 111};
    expect_decode(t, d3, 6, true, "h\xc3\xa9llo");
    int64_t d4[] = {104, 195};                /* half a character: U+FFFD as from_utf8_lossy */
    expect_decode(t, d4, 2, true, "h\xef\xbf\xbd");
    ca_tokenizer_destroy(t);
}

/* Possessive and atomic groups mean the same in Oniguruma and PCRE2; MergedWithPrevious. */
static void test_split_possessive(void **state) {
    (void)state;
    ca_tokenizer *t = load("split_possessive.json");
    /* "'" and "s" are pieces of their own (no "'s" merge); digits come in threes */
    EXPECT_IDS(t, "the cat's 12345", "116 256 32 99 97 116 39 115 32 49 50 51 52 53");
    EXPECT_IDS(t, "he  the", "256 32 258");
    ca_tokenizer_destroy(t);
}

/* Oniguruma's meanings where PCRE2's differ: ^ and $ at every line, (?m) dot-all, \v VT alone,
 * \uHHHH; the pattern removes what it matches, so the ids show what it matched. */
static void test_split_oniguruma(void **state) {
    (void)state;
    ca_tokenizer *t = load("split_oniguruma.json");
    EXPECT_IDS(t, "xa\nab\nbx", "120 97 10 10 98 120");
    EXPECT_IDS(t, "c\nd\x0b\x0c", "100 12");
    EXPECT_IDS(t, "BAB", "66 66");
    ca_tokenizer_destroy(t);
}

/* Loading `name` fails with s and a message naming the file and holding `what`. */
static void expect_refused(const char *name, ca_status s, const char *what) {
    ca_tokenizer *t = (ca_tokenizer *)1;
    assert_int_equal(ca_tokenizer_load(data(name), &t), s);
    assert_null(t);
    const char *msg = ca_last_error();
    if (!strstr(msg, data(name)) || !strstr(msg, what))
        fail_msg("message '%s' lacks '%s' or '%s'", msg, data(name), what);
}

static void test_refusals(void **state) {
    (void)state;
    expect_refused("refuse_prefix.json", CA_ERR_UNSUPPORTED, "model.continuing_subword_prefix: is set");
    expect_refused("refuse_suffix.json", CA_ERR_UNSUPPORTED, "model.end_of_word_suffix: is set");
    expect_refused("refuse_dropout.json", CA_ERR_UNSUPPORTED, "model.dropout: is set");
    expect_refused("refuse_pretok.json", CA_ERR_UNSUPPORTED,
                   "pre_tokenizer.pretokenizers[0].type 'Whitespace' is not supported");
    expect_refused("refuse_normalizer.json", CA_ERR_UNSUPPORTED,
                   "normalizer.type 'Lowercase' is not supported");
    expect_refused("refuse_replace_regex.json", CA_ERR_UNSUPPORTED,
                   "normalizer: only a String pattern is supported");
    expect_refused("refuse_decoder.json", CA_ERR_UNSUPPORTED,
                   "decoder.type 'WordPiece' is not supported");
    expect_refused("refuse_post.json", CA_ERR_UNSUPPORTED,
                   "post_processor.type 'RobertaProcessing' is not supported");
    expect_refused("refuse_regex_h.json", CA_ERR_UNSUPPORTED,
                   "pre_tokenizer.pattern.Regex: the regex '\\h+' uses \\h, \\H or \\V");
    expect_refused("refuse_regex_word.json", CA_ERR_UNSUPPORTED,
                   "the regex '\\w+' uses \\w, \\W, \\b or \\B (Oniguruma's word characters");
    expect_refused("refuse_regex_interval.json", CA_ERR_UNSUPPORTED,
                   "the regex '\\p{N}{1,3}+' uses an interval followed by +");
    expect_refused("refuse_regex_syntax.json", CA_ERR_UNSUPPORTED,
                   "pre_tokenizer.pattern.Regex: the regex '(a|b' does not compile under PCRE2");
    expect_refused("bad_merge.json", CA_ERR_INVALID, "model.merges[1] ('b' 'z'): 'z' is not in");
    expect_refused("bad_merge_result.json", CA_ERR_INVALID,
                   "model.merges[1] ('d' 'd'): 'dd' is not in");
    expect_refused("bad_merge_form.json", CA_ERR_INVALID, "model.merges[0] is neither");
    expect_refused("hole.json", CA_ERR_INVALID, "no token has id 1");
    /* an id far above the entries: refused before the id table is sized by it (16 GiB here) */
    expect_refused("huge_id.json", CA_ERR_INVALID, "id 2147483646 with 2 tokens");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merges),        cmocka_unit_test(test_long_word),
        cmocka_unit_test(test_byte_fallback), cmocka_unit_test(test_split_bytelevel),
        cmocka_unit_test(test_split_possessive), cmocka_unit_test(test_split_oniguruma),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
