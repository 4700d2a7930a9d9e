/* Byte-level and SentencePiece-style BPE (GPT-2, Llama 2/3, Mistral, Qwen2) as Hugging Face's
 * `tokenizers` runs it: added tokens matched first, then per remaining piece the normaliser, the
 * pre-tokenizers (Split with a regex, ByteLevel, Metaspace) and the BPE model (merges applied by
 * rank through a priority queue over a linked list of symbols, as tokenizers' Word::merge_all,
 * so a long word costs O(n log n)); the template adds BOS/EOS; the decoders turn ids back into
 * text. Regexes run on PCRE2 (compiled by tokenizer_bpe_load.c). docs/TEXT.md has the rules. */
#include "data/tokenizer_bpe_impl.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define NOMEM() ca_error(CA_ERR_NOMEM, "tokenizer: out of memory")

/* ------------------------------------------------------------------ pieces of text */

typedef struct piece {
    size_t off, len;
    bool first;        /* starts at offset 0 of the original text (Metaspace's "first") */
} piece;

typedef struct plist {
    char *buf;
    size_t blen, bcap;
    piece *p;
    size_t n, cap;
} plist;

static void pl_free(plist *l) {
    free(l->buf);
    free(l->p);
    memset(l, 0, sizeof *l);
}

/* Appends bytes to the buffer (not a piece yet). */
static bool pl_bytes(plist *l, const char *s, size_t len) {
    if (l->blen + len + 1 > l->bcap) {
        size_t cap = l->bcap ? l->bcap : 256;
        while (cap < l->blen + len + 1) cap *= 2;
        char *b = realloc(l->buf, cap);
        if (!b) return false;
        l->buf = b;
        l->bcap = cap;
    }
    memcpy(l->buf + l->blen, s, len);
    l->blen += len;
    return true;
}

/* Closes the bytes appended since `start` as a piece; empty pieces are dropped (tokenizers
 * drops empty splits). */
static bool pl_close(plist *l, size_t start, bool first) {
    if (l->blen == start) return true;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        piece *p = realloc(l->p, cap * sizeof *p);
        if (!p) return false;
        l->p = p;
        l->cap = cap;
    }
    l->p[l->n++] = (piece){start, l->blen - start, first};
    return true;
}

static bool pl_add(plist *l, const char *s, size_t len, bool first) {
    size_t start = l->blen;
    return pl_bytes(l, s, len) && pl_close(l, start, first);
}

/* ------------------------------------------------------------------ normalisers */

static ca_status replace_all(const char *s, size_t len, const char *pat, const char *with,
                             plist *out) {
    size_t pl = strlen(pat), wl = strlen(with), i = 0;
    while (i < len) {
        if (pl > 0 && pl <= len - i && memcmp(s + i, pat, pl) == 0) {
            if (!pl_bytes(out, with, wl)) return NOMEM();
            i += pl;
        } else {
            if (!pl_bytes(out, s + i, 1)) return NOMEM();
            i++;
        }
    }
    return CA_OK;
}

/* One normaliser over s[0, len), written to out's buffer. */
static ca_status normalize_one(const ca_bpe_norm *nm, const char *s, size_t len, plist *out) {
    if (nm->kind == CA_NORM_PREPEND) {
        if (len > 0 && !pl_bytes(out, nm->content, strlen(nm->content))) return NOMEM();
        return pl_bytes(out, s, len) ? CA_OK : NOMEM();
    }
    if (nm->kind == CA_NORM_REPLACE) return replace_all(s, len, nm->pattern, nm->content, out);
    int opt = UTF8PROC_STABLE | (nm->kind == CA_NORM_NFC || nm->kind == CA_NORM_NFKC
                                     ? UTF8PROC_COMPOSE
                                     : UTF8PROC_DECOMPOSE);
    if (nm->kind == CA_NORM_NFKC || nm->kind == CA_NORM_NFKD) opt |= UTF8PROC_COMPAT;
    utf8proc_uint8_t *r = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &r, opt);
    if (n < 0) return n == UTF8PROC_ERROR_NOMEM ? NOMEM()
                                                : ca_error(CA_ERR_INVALID, "tokenizer: %s",
                                                           utf8proc_errmsg(n));
    bool ok = pl_bytes(out, (const char *)r, (size_t)n);
    free(r);
    return ok ? CA_OK : NOMEM();
}

/* The normaliser chain over s[0, len): the result in *res (a plist used as a buffer). */
static ca_status normalize(const ca_bpe *b, const char *s, size_t len, plist *res) {
    plist cur = {0};
    if (!pl_bytes(&cur, s, len)) return NOMEM();
    for (int i = 0; i < b->n_norm; i++) {
        plist next = {0};
        ca_status st = normalize_one(&b->norm[i], cur.buf, cur.blen, &next);
        pl_free(&cur);
        if (st != CA_OK) {
            pl_free(&next);
            return st;
        }
        cur = next;
        if (!cur.buf && !pl_bytes(&cur, "", 0)) return NOMEM();
    }
    *res = cur;
    return CA_OK;
}

/* ------------------------------------------------------------------ regex splitting */

typedef struct match {
    size_t s, e;
    bool is_match;
} match;

typedef struct mlist {
    match *m;
    size_t n, cap;
} mlist;

static bool ml_push(mlist *l, size_t s, size_t e, bool is_match) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        match *m = realloc(l->m, cap * sizeof *m);
        if (!m) return false;
        l->m = m;
        l->cap = cap;
    }
    l->m[l->n++] = (match){s, e, is_match};
    return true;
}

/* The matches of re in s and the gaps between them, in order (tokenizers' find_matches). An empty
 * match moves the search on by one character. */
static ca_status find_matches(const pcre2_code *re, const char *s, size_t len, mlist *out,
                              pcre2_match_data *md, pcre2_match_context *mc) {
    size_t prev = 0, at = 0;
    while (at <= len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, md, mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return ca_error(CA_ERR_INVALID, "tokenizer: the pre-tokenizer's regex failed on a "
                            "piece of %zu bytes: %s", len, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if ((prev != ms && !ml_push(out, prev, ms, false)) || !ml_push(out, ms, me, true))
            return NOMEM();
        prev = me;
        if (me > ms) {
            at = me;
        } else {            /* empty: the next character */
            if (me >= len) break;
            at = me + 1;
            while (at < len && ((unsigned char)s[at] & 0xC0) == 0x80) at++;
        }
    }
    if (prev != len && !ml_push(out, prev, len, false)) return NOMEM();
    return CA_OK;
}

/* Folds the matches into pieces by tokenizers' SplitDelimiterBehavior, onto out. */
static bool split_by(const mlist *m, int behavior, bool invert, const char *s, bool first,
                     plist *out) {
    size_t n = 0;
    match *acc = malloc((m->n + 1) * sizeof *acc);
    if (!acc) return false;
    bool prev = false;
    for (size_t k = 0; k < m->n; k++) {
        size_t i = behavior == CA_SPLIT_NEXT ? m->n - 1 - k : k;
        match x = m->m[i];
        bool is = x.is_match != invert;
        if (behavior == CA_SPLIT_REMOVED) {
            if (!is) acc[n++] = x;
        } else if (behavior == CA_SPLIT_ISOLATED) {
            acc[n++] = x;
        } else if (behavior == CA_SPLIT_CONTIGUOUS ? (is == prev && n > 0)
                                                   : (is && !prev && n > 0)) {
            if (behavior == CA_SPLIT_NEXT) acc[n - 1].s = x.s;
            else acc[n - 1].e = x.e;
        } else {
            acc[n++] = x;
        }
        prev = is;
    }
    bool ok = true;
    for (size_t k = 0; ok && k < n; k++) {
        size_t i = behavior == CA_SPLIT_NEXT ? n - 1 - k : k;
        ok = pl_add(out, s + acc[i].s, acc[i].e - acc[i].s, first && acc[i].s == 0);
    }
    free(acc);
    return ok;
}

/* ------------------------------------------------------------------ pre-tokenizers */

/* GPT-2's bytes_to_unicode: printable bytes (33-126, 161-172, 174-255) stand for themselves, the
 * 68 others, in order, for 256 + n: 0-32, then 127-160, then 173. */
static int32_t byte_char(unsigned char c) {
    if (c <= 32) return 256 + c;
    if (c >= 127 && c <= 160) return 256 + 33 + (c - 127);
    if (c == 173) return 256 + 67;
    return c;
}

static bool push_byte_level(plist *out, const char *s, size_t len) {
    for (size_t i = 0; i < len; i++) {
        utf8proc_uint8_t u[4];
        utf8proc_ssize_t k = utf8proc_encode_char(byte_char((unsigned char)s[i]), u);
        if (!pl_bytes(out, (const char *)u, (size_t)k)) return false;
    }
    return true;
}

typedef struct rx_ctx {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
} rx_ctx;

static ca_status split_piece(const ca_bpe_pretok *p, const char *s, size_t len, bool first,
                             plist *out, rx_ctx *rx) {
    mlist m = {0};
    ca_status st = find_matches(p->re, s, len, &m, rx->md, rx->mc);
    if (st == CA_OK && !split_by(&m, p->behavior, p->invert, s, first, out)) st = NOMEM();
    free(m.m);
    return st;
}

/* ByteLevel: the prefix space, GPT-2's regex (isolated), then every byte as its character. */
static ca_status byte_level(const ca_bpe_pretok *p, const char *s, size_t len, bool first,
                            plist *out, rx_ctx *rx) {
    plist tmp = {0};
    bool pre = p->add_prefix_space && (len == 0 || s[0] != ' ');
    if ((pre && !pl_bytes(&tmp, " ", 1)) || !pl_bytes(&tmp, s, len)) {
        pl_free(&tmp);
        return NOMEM();
    }
    plist parts = {0};
    ca_status st = CA_OK;
    if (p->re)
        st = split_piece(p, tmp.buf, tmp.blen, first, &parts, rx);
    else if (!pl_add(&parts, tmp.buf, tmp.blen, first))
        st = NOMEM();
    for (size_t i = 0; st == CA_OK && i < parts.n; i++) {
        size_t start = out->blen;
        if (!push_byte_level(out, parts.buf + parts.p[i].off, parts.p[i].len) ||
            !pl_close(out, start, parts.p[i].first))
            st = NOMEM();
    }
    pl_free(&tmp);
    pl_free(&parts);
    return st;
}

/* Metaspace: spaces become the replacement, which is prepended as the scheme says, and each
 * piece then starts at a replacement (MergedWithNext). */
static ca_status metaspace(const ca_bpe_pretok *p, const char *s, size_t len, bool first,
                           plist *out) {
    plist tmp = {0};
    size_t rl = strlen(p->repl);
    /* tokenizers replaces the spaces first, so a leading space counts as a replacement */
    bool starts = (len >= rl && memcmp(s, p->repl, rl) == 0) || (len > 0 && s[0] == ' ');
    bool pre = !starts && (p->prepend == CA_PREPEND_ALWAYS ||
                           (p->prepend == CA_PREPEND_FIRST && first));
    if (pre && !pl_bytes(&tmp, p->repl, rl)) return NOMEM();
    ca_status st = replace_all(s, len, " ", p->repl, &tmp);
    if (st == CA_OK && !tmp.buf && !pl_bytes(&tmp, "", 0)) st = NOMEM();
    if (st == CA_OK && !p->split && !pl_add(out, tmp.buf, tmp.blen, first)) st = NOMEM();
    if (st == CA_OK && p->split) {
        size_t start = 0;
        for (size_t i = 0; i <= tmp.blen && st == CA_OK; i++) {
            bool cut = i == tmp.blen || (i > start && tmp.blen - i >= rl &&
                                         memcmp(tmp.buf + i, p->repl, rl) == 0);
            if (!cut) continue;
            if (!pl_add(out, tmp.buf + start, i - start, first && start == 0)) st = NOMEM();
            start = i;
        }
    }
    pl_free(&tmp);
    return st;
}

/* The pre-tokenizers in turn over one normalised piece; the result in *res. */
static ca_status pretokenize(const ca_bpe *b, const char *s, size_t len, bool first, plist *res,
                             rx_ctx *rx) {
    plist cur = {0};
    if (!pl_add(&cur, s, len, first) && len > 0) return NOMEM();
    for (int k = 0; k < b->n_pre; k++) {
        const ca_bpe_pretok *p = &b->pre[k];
        plist next = {0};
        ca_status st = CA_OK;
        for (size_t i = 0; st == CA_OK && i < cur.n; i++) {
            const char *ps = cur.buf + cur.p[i].off;
            size_t pl = cur.p[i].len;
            bool f = cur.p[i].first;
            if (p->kind == CA_PRE_SPLIT) st = split_piece(p, ps, pl, f, &next, rx);
            else if (p->kind == CA_PRE_BYTELEVEL) st = byte_level(p, ps, pl, f, &next, rx);
            else st = metaspace(p, ps, pl, f, &next);
        }
        pl_free(&cur);
        cur = next;
        if (st != CA_OK) {
            pl_free(&cur);
            return st;
        }
    }
    *res = cur;
    return CA_OK;
}

/* ------------------------------------------------------------------ the BPE model */

bool ca_bpe_merge_find(const ca_bpe *b, int64_t left, int64_t right, int64_t *rank, int64_t *id) {
    if (!b->mkey) return false;
    uint64_t key = (uint64_t)left << 32 | (uint64_t)right;
    for (uint64_t i = (key * 0x9E3779B97F4A7C15ULL) >> 20 & b->mmask;; i = (i + 1) & b->mmask) {
        if (b->mkey[i] == UINT64_MAX) return false;
        if (b->mkey[i] == key) {
            *rank = b->mrank[i];
            *id = b->mnew[i];
            return true;
        }
    }
}

typedef struct sym {
    int64_t id;
    int64_t prev, next;
    size_t len;
} sym;

typedef struct qent {
    int64_t rank, pos, id;
} qent;

/* Min-heap on (rank, pos): the lowest rank first, then the leftmost (tokenizers' Merge order). */
static bool q_less(const qent *a, const qent *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void q_push(qent *q, size_t *n, qent e) {
    size_t i = (*n)++;
    while (i > 0 && q_less(&e, &q[(i - 1) / 2])) {
        q[i] = q[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    q[i] = e;
}

static qent q_pop(qent *q, size_t *n) {
    qent top = q[0], last = q[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && q_less(&q[c + 1], &q[c])) c++;
        if (!q_less(&q[c], &last)) break;
        q[i] = q[c];
        i = c;
    }
    if (*n > 0) q[i] = last;
    return top;
}

static void sym_add(sym *w, size_t *n, int64_t id, size_t len) {
    if (*n > 0) w[*n - 1].next = (int64_t)*n;
    w[*n] = (sym){id, (int64_t)*n - 1, -1, len};
    (*n)++;
}

/* Word::merge_all: pops merges by rank, skips stale entries, queues the new neighbours' pairs. */
static void merge_all(const ca_bpe *b, sym *w, size_t n, qent *q) {
    size_t nq = 0;
    int64_t rank, id;
    for (size_t i = 0; i + 1 < n; i++)
        if (ca_bpe_merge_find(b, w[i].id, w[i + 1].id, &rank, &id))
            q_push(q, &nq, (qent){rank, (int64_t)i, id});
    while (nq > 0) {
        qent top = q_pop(q, &nq);
        sym *cur = &w[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        sym right = w[cur->next];
        if (!ca_bpe_merge_find(b, cur->id, right.id, &rank, &id) || id != top.id) continue;
        w[cur->next].len = 0;
        cur->id = top.id;
        cur->len += right.len;
        cur->next = right.next;
        if (right.next >= 0) w[right.next].prev = top.pos;
        if (cur->prev >= 0 && ca_bpe_merge_find(b, w[cur->prev].id, cur->id, &rank, &id))
            q_push(q, &nq, (qent){rank, cur->prev, id});
        if (cur->next >= 0 && ca_bpe_merge_find(b, cur->id, w[cur->next].id, &rank, &id))
            q_push(q, &nq, (qent){rank, top.pos, id});
    }
}

/* The initial symbols of a word (BPE::merge_word): each character's token, else its <0xNN>
 * byte tokens (byte_fallback), else [unk] (consecutive ones fused with fuse_unk), else dropped. */
static size_t word_symbols(const ca_tokenizer *t, const char *s, size_t len, sym *w) {
    const ca_bpe *b = t->bpe;
    size_t n = 0, unk_len = 0;
    bool pending = false;
    for (size_t i = 0; i < len;) {
        size_t k = 1;
        while (i + k < len && ((unsigned char)s[i + k] & 0xC0) == 0x80) k++;
        int64_t id = ca_vocab_find(t, s + i, k);
        if (id >= 0) {
            if (pending) sym_add(w, &n, b->unk, unk_len);
            pending = false;
            sym_add(w, &n, id, k);
        } else {
            bool bytes = b->byte_fallback;
            for (size_t j = 0; bytes && j < k; j++) bytes = b->byte_id[(unsigned char)s[i + j]] >= 0;
            if (bytes) {
                for (size_t j = 0; j < k; j++) sym_add(w, &n, b->byte_id[(unsigned char)s[i + j]], 1);
            } else if (b->unk >= 0) {
                if (pending && !b->fuse_unk) sym_add(w, &n, b->unk, unk_len);
                unk_len = pending && b->fuse_unk ? unk_len + k : k;
                pending = true;
            }
        }
        i += k;
    }
    if (pending) sym_add(w, &n, b->unk, unk_len);
    return n;
}

static ca_status bpe_word(const ca_tokenizer *t, const char *s, size_t len, ca_idvec *out) {
    if (t->bpe->ignore_merges) {
        int64_t id = ca_vocab_find(t, s, len);
        if (id >= 0) return ca_idvec_push(out, id) ? CA_OK : NOMEM();
    }
    sym *w = malloc((len + 1) * sizeof *w);
    qent *q = malloc((3 * len + 1) * sizeof *q);
    ca_status st = w && q ? CA_OK : NOMEM();
    if (st == CA_OK) {
        size_t n = word_symbols(t, s, len, w);
        merge_all(t->bpe, w, n, q);
        for (size_t i = 0; i < n && st == CA_OK; i++)
            if (w[i].len > 0 && !ca_idvec_push(out, w[i].id)) st = NOMEM();
    }
    free(w);
    free(q);
    return st;
}

/* ------------------------------------------------------------------ added tokens */

/* Regex-crate \w and \s as tokenizers' single_word / lstrip / rstrip use them. */
static bool is_word_char(int32_t c) {
    if (c == '_' || c == 0x200C || c == 0x200D) return true;
    utf8proc_category_t k = utf8proc_category(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
           (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ND) ||
           k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC;
}

static bool is_space(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* The character ending at s[end) (valid UTF-8), its start in *at. */
static int32_t char_before(const char *s, size_t end, size_t *at) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    utf8proc_int32_t c;
    utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(end - i), &c);
    *at = i;
    return c;
}

static int32_t char_at(const char *s, size_t len, size_t i, size_t *k) {
    utf8proc_int32_t c;
    utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                          (utf8proc_ssize_t)(len - i), &c);
    *k = r > 0 ? (size_t)r : 1;
    return r > 0 ? c : -1;
}

/* The leftmost-longest added token of the given kind (normalized or not) in s[from, len). */
static int next_added(const ca_tokenizer *t, bool normalized, const char *s, size_t from,
                      size_t len, size_t *at) {
    const bool *first = t->bpe->added_first[normalized];
    for (size_t i = from; i < len; i++) {
        if (!first[(unsigned char)s[i]]) continue;   /* Llama 3 has 256 added tokens */
        int best = -1;
        for (int k = 0; k < t->n_added; k++) {
            const ca_added_token *a = &t->added[k];
            if (a->normalized != normalized || a->len == 0 || a->len > len - i ||
                memcmp(s + i, a->content, a->len) != 0)
                continue;
            if (best < 0 || a->len > t->added[best].len) best = k;
        }
        if (best >= 0) {
            *at = i;
            return best;
        }
    }
    return -1;
}

typedef ca_status (*seg_fn)(const ca_tokenizer *t, const char *s, size_t len, bool first,
                            ca_idvec *out, rx_ctx *rx);

/* AddedVocabulary::find_matches: splits s at the added tokens of one kind, honouring
 * single_word, lstrip and rstrip; the text between goes to fn, the tokens' ids to out. */
static ca_status split_added(const ca_tokenizer *t, bool normalized, const char *s, size_t len,
                             bool first, seg_fn fn, ca_idvec *out, rx_ctx *rx) {
    size_t done = 0, from = 0, at;
    int k;
    while ((k = next_added(t, normalized, s, from, len, &at)) >= 0) {
        const ca_added_token *a = &t->added[k];
        size_t start = at, stop = at + a->len, cl;
        from = stop;     /* the matches do not overlap, refused ones included */
        if (a->single_word) {
            bool left = start == 0 || !is_word_char(char_before(s, start, &cl));
            bool right = stop == len || !is_word_char(char_at(s, len, stop, &cl));
            if (!left || !right) continue;
        }
        if (a->lstrip) {
            size_t p = start;
            while (p > 0 && is_space(char_before(s, p, &cl))) p = cl;
            start = p > done ? p : done;
        }
        if (a->rstrip) {
            while (stop < len && is_space(char_at(s, len, stop, &cl))) stop += cl;
        }
        if (start > done) {
            ca_status st = fn(t, s + done, start - done, first && done == 0, out, rx);
            if (st != CA_OK) return st;
        }
        if (!ca_idvec_push(out, a->id)) return NOMEM();
        done = stop;
    }
    return done < len ? fn(t, s + done, len - done, first && done == 0, out, rx) : CA_OK;
}

/* Pre-tokenizes and BPE-encodes a normalised piece without added tokens. */
static ca_status encode_normalized(const ca_tokenizer *t, const char *s, size_t len, bool first,
                                   ca_idvec *out, rx_ctx *rx) {
    plist words = {0};
    ca_status st = pretokenize(t->bpe, s, len, first, &words, rx);
    for (size_t i = 0; st == CA_OK && i < words.n; i++)
        st = bpe_word(t, words.buf + words.p[i].off, words.p[i].len, out);
    pl_free(&words);
    return st;
}

/* A raw piece between non-normalised added tokens: normalised, then split at normalised ones. */
static ca_status encode_raw(const ca_tokenizer *t, const char *s, size_t len, bool first,
                            ca_idvec *out, rx_ctx *rx) {
    plist norm = {0};
    ca_status st = normalize(t->bpe, s, len, &norm);
    if (st == CA_OK)
        st = split_added(t, true, norm.buf, norm.blen, first, encode_normalized, out, rx);
    pl_free(&norm);
    return st;
}

/* The text must be valid UTF-8: Python's tokenizers takes str, which cannot hold anything else. */
static ca_status check_utf8(const char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                              (utf8proc_ssize_t)(len - i), &c);
        if (k <= 0)
            return ca_error(CA_ERR_INVALID, "tokenizer: text is not valid UTF-8 at byte %zu", i);
        i += (size_t)k;
    }
    return CA_OK;
}

ca_status ca_bpe_tokenize_into(const ca_tokenizer *t, const char *text, size_t len,
                               ca_idvec *out) {
    if (len > CA_BPE_MAX_TEXT)
        return ca_error(CA_ERR_INVALID, "tokenizer: the text has %zu bytes, more than the %zu "
                        "one call encodes; split it", len, CA_BPE_MAX_TEXT);
    ca_status st = check_utf8(text, len);
    if (st != CA_OK || len == 0) return st;
    rx_ctx rx = {0};
    rx.md = pcre2_match_data_create(1, NULL);
    rx.mc = pcre2_match_context_create(NULL);
    rx.js = pcre2_jit_stack_create(32 << 10, 8 << 20, NULL);
    if (!rx.md || !rx.mc) st = NOMEM();
    if (st == CA_OK && rx.js) pcre2_jit_stack_assign(rx.mc, NULL, rx.js);
    if (st == CA_OK) st = split_added(t, false, text, len, true, encode_raw, out, &rx);
    pcre2_match_data_free(rx.md);
    pcre2_match_context_free(rx.mc);
    pcre2_jit_stack_free(rx.js);
    return st;
}

/* ------------------------------------------------------------------ template */

size_t ca_bpe_template_added(const ca_tokenizer *t, bool pair) {
    const ca_bpe *b = t->bpe;
    const ca_bpe_item *it = pair ? b->pair : b->single;
    int n = pair ? b->n_pair : b->n_single;
    size_t k = 0;
    for (int i = 0; i < n; i++) k += it[i].seq < 0;
    return k;
}

ca_status ca_bpe_template(const ca_tokenizer *t, const ca_idvec *a, const ca_idvec *b,
                          size_t keep_a, size_t keep_b, ca_idvec *ids, ca_idvec *types) {
    const ca_bpe *m = t->bpe;
    const ca_bpe_item *it = b ? m->pair : m->single;
    int n = b ? m->n_pair : m->n_single;
    if (n == 0) {       /* no post-processor: A (then B), type ids 0 and 1 */
        for (size_t i = 0; i < keep_a; i++)
            if (!ca_idvec_push(ids, a->v[i]) || !ca_idvec_push(types, 0)) return NOMEM();
        for (size_t i = 0; b && i < keep_b; i++)
            if (!ca_idvec_push(ids, b->v[i]) || !ca_idvec_push(types, 1)) return NOMEM();
        return CA_OK;
    }
    for (int i = 0; i < n; i++) {
        const ca_idvec *src = it[i].seq == 0 ? a : b;
        size_t keep = it[i].seq == 0 ? keep_a : keep_b;
        if (it[i].seq < 0) {
            if (!ca_idvec_push(ids, it[i].id) || !ca_idvec_push(types, it[i].type_id))
                return NOMEM();
            continue;
        }
        for (size_t j = 0; j < keep; j++)
            if (!ca_idvec_push(ids, src->v[j]) || !ca_idvec_push(types, it[i].type_id))
                return NOMEM();
    }
    return CA_OK;
}

/* ------------------------------------------------------------------ decoders */

/* The length of the UTF-8 sequence at s (1..4) and whether it is valid; an invalid one's length
 * is its maximal valid prefix (at least 1), the unit Rust's from_utf8_lossy replaces by U+FFFD. */
static size_t utf8_seq(const unsigned char *s, size_t n, bool *ok) {
    unsigned c = s[0], lo = 0x80, hi = 0xBF;
    size_t need;
    *ok = false;
    if (c < 0x80) need = 0;
    else if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) need = 2;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else return 1;
    for (size_t i = 1; i <= need; i++) {
        if (i >= n) return i;
        unsigned d = s[i];
        if (i == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) return i;
    }
    *ok = true;
    return need + 1;
}

static bool push_lossy(plist *out, const char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        bool ok;
        size_t k = utf8_seq((const unsigned char *)s + i, len - i, &ok);
        if (!pl_bytes(out, ok ? s + i : "\xEF\xBF\xBD", ok ? k : 3)) return false;
        i += k;
    }
    return true;
}

/* The byte a byte-level character stands for, or -1 (byte_char's inverse). */
static int char_byte(int32_t c) {
    if (c < 0 || c > 256 + 67) return -1;
    if (c >= 256) return c <= 256 + 32 ? c - 256 : c < 256 + 67 ? c - 256 - 33 + 127 : 173;
    return byte_char((unsigned char)c) == c ? c : -1;
}

/* ByteLevel: the bytes each token's characters stand for (a token with another character keeps
 * its own bytes), all read as UTF-8 with U+FFFD for what is not. */
static ca_status dec_byte_level(const plist *in, plist *out) {
    plist raw = {0};
    bool ok = pl_bytes(&raw, "", 0);
    for (size_t i = 0; ok && i < in->n; i++) {
        const char *s = in->buf + in->p[i].off;
        size_t len = in->p[i].len, start = raw.blen, k;
        bool mapped = true;
        for (size_t j = 0; ok && mapped && j < len; j += k) {
            int b = char_byte(char_at(s, len, j, &k));
            if (b < 0) mapped = false;
            else ok = pl_bytes(&raw, (const char *)&(unsigned char){(unsigned char)b}, 1);
        }
        if (ok && !mapped) {
            raw.blen = start;
            ok = pl_bytes(&raw, s, len);
        }
    }
    size_t start = out->blen;
    ok = ok && push_lossy(out, raw.buf, raw.blen) && pl_close(out, start, false);
    pl_free(&raw);
    return ok ? CA_OK : NOMEM();
}

static int byte_token(const char *s, size_t len) {
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* ByteFallback: runs of <0xNN> tokens become their bytes when those are valid UTF-8, else one
 * U+FFFD per token. */
static bool flush_bytes(plist *out, const char *bytes, size_t n) {
    if (n == 0) return true;
    size_t start = out->blen;
    bool valid = true;
    for (size_t i = 0; valid && i < n;) {
        size_t k = utf8_seq((const unsigned char *)bytes + i, n - i, &valid);
        i += k;
    }
    if (valid) return pl_bytes(out, bytes, n) && pl_close(out, start, false);
    for (size_t i = 0; i < n; i++)
        if (!pl_bytes(out, "\xEF\xBF\xBD", 3)) return false;
    return pl_close(out, start, false);
}

static ca_status dec_byte_fallback(const plist *in, plist *out) {
    char *bytes = malloc(in->n + 1);
    size_t nb = 0;
    bool ok = bytes != NULL;
    for (size_t i = 0; ok && i < in->n; i++) {
        int v = byte_token(in->buf + in->p[i].off, in->p[i].len);
        if (v >= 0) {
            bytes[nb++] = (char)v;
            continue;
        }
        ok = flush_bytes(out, bytes, nb) && pl_add(out, in->buf + in->p[i].off, in->p[i].len, false);
        nb = 0;
    }
    ok = ok && flush_bytes(out, bytes, nb);
    free(bytes);
    return ok ? CA_OK : NOMEM();
}

/* Strip: up to `start` leading and `stop` trailing `content` characters of each token. */
static bool dec_strip(const ca_bpe_dec *d, const char *s, size_t len, plist *out) {
    size_t cl = strlen(d->content), a = 0, e = len;
    for (int i = 0; i < d->start && len - a >= cl && memcmp(s + a, d->content, cl) == 0; i++) a += cl;
    for (int i = 0; i < d->stop && e - a >= cl && memcmp(s + e - cl, d->content, cl) == 0; i++) e -= cl;
    size_t start = out->blen;
    return pl_bytes(out, s + a, e - a) && pl_close(out, start, false);
}

/* Metaspace: the replacement becomes a space, except in the first token when a prefix was added
 * (there it is dropped, as tokenizers does). */
static bool dec_metaspace(const ca_bpe_dec *d, size_t index, const char *s, size_t len,
                          plist *out) {
    size_t start = out->blen, rl = strlen(d->repl);
    bool drop = index == 0 && d->prepend != CA_PREPEND_NEVER;
    for (size_t i = 0; i < len;) {
        if (len - i >= rl && memcmp(s + i, d->repl, rl) == 0) {
            if (!drop && !pl_bytes(out, " ", 1)) return false;
            i += rl;
        } else {
            if (!pl_bytes(out, s + i, 1)) return false;
            i++;
        }
    }
    return pl_close(out, start, false) && (out->blen > start || true);
}

static ca_status decode_one(const ca_bpe_dec *d, const plist *in, plist *out) {
    if (d->kind == CA_DEC_BYTELEVEL) return dec_byte_level(in, out);
    if (d->kind == CA_DEC_BYTEFALLBACK) return dec_byte_fallback(in, out);
    size_t fused = out->blen;
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->buf + in->p[i].off;
        size_t len = in->p[i].len, start = out->blen;
        bool ok;
        if (d->kind == CA_DEC_FUSE) ok = pl_bytes(out, s, len);
        else if (d->kind == CA_DEC_STRIP) ok = dec_strip(d, s, len, out);
        else if (d->kind == CA_DEC_METASPACE) ok = dec_metaspace(d, i, s, len, out);
        else ok = replace_all(s, len, d->pattern, d->content, out) == CA_OK &&
                  pl_close(out, start, false);
        if (!ok) return NOMEM();
    }
    if (d->kind == CA_DEC_FUSE && !pl_close(out, fused, false)) return NOMEM();
    return CA_OK;
}

ca_status ca_bpe_decode(const ca_tokenizer *t, const int64_t *ids, size_t n, bool skip_special,
                        char **text) {
    plist cur = {0};
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n) {
            pl_free(&cur);
            return ca_error(CA_ERR_INVALID, "ca_tokenizer_decode: id %lld (at %zu) is not in the "
                            "vocabulary of %lld tokens", (long long)ids[i], i, (long long)t->n);
        }
        bool special = false;
        for (int k = 0; k < t->n_added && skip_special; k++)
            special |= t->added[k].special && t->added[k].id == ids[i];
        if (special) continue;
        const char *tok = t->tokens[ids[i]];
        if (!pl_add(&cur, tok, strlen(tok), false) && strlen(tok) > 0) {
            pl_free(&cur);
            return NOMEM();
        }
    }
    for (int k = 0; k < t->bpe->n_dec; k++) {
        plist next = {0};
        ca_status st = decode_one(&t->bpe->dec[k], &cur, &next);
        pl_free(&cur);
        cur = next;
        if (st != CA_OK) {
            pl_free(&cur);
            return st;
        }
    }
    /* No decoder: tokenizers joins the tokens with spaces. */
    plist res = {0};
    bool ok = pl_bytes(&res, "", 0);
    for (size_t i = 0; ok && i < cur.n; i++)
        ok = (t->bpe->n_dec > 0 || i == 0 || pl_bytes(&res, " ", 1)) &&
             pl_bytes(&res, cur.buf + cur.p[i].off, cur.p[i].len);
    pl_free(&cur);
    if (!ok) {
        pl_free(&res);
        return NOMEM();
    }
    res.buf[res.blen] = '\0';
    *text = res.buf;
    free(res.p);
    return CA_OK;
}
