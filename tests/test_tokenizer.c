/* test_tokenizer.c: unit tests for tokenizer.c.
 *
 * Builds small vocabularies in a temporary directory and checks encoding
 * (merge order, ties, byte fallback, text that looks like special pieces,
 * against a naive reference), streaming decode (split characters, U+FFFD,
 * the space after BOS), round trips, and every way tokenizer_build rejects a
 * file. The same for version 2 ("LTOK") files: the sentencepiece vocabulary
 * with stored kinds, and a byte-level BPE vocabulary (merges by rank, ties,
 * special pieces, the pre-tokenizers' splits against Hugging Face's, invalid
 * UTF-8 as U+FFFD, missing byte pieces, 200 KB runs of one character, decode)
 * with each bad-file kind. When the shared models are present it also checks
 * known encodings for tok512.bin and times a 1 MB encode with the Llama 2
 * vocabulary. No Python needed: tests/test_tokenizer_bpe.py compares with
 * tokenizers itself.
 *
 * Build and run from the repository root:
 *   cc -std=c11 -Wall -Wextra -O2 -I. tests/test_tokenizer.c -o test_tokenizer -lm
 *   ./test_tokenizer [MODELS_DIR]
 * MODELS_DIR defaults to $SHARED_DIR/models, else ../shared/models.
 * Prints one line per failure and ends with "tokenizer: P passed, F failed";
 * exits non-zero on any failure.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include "../tokenizer.c"

#include <stdlib.h>
#include <time.h>

static int n_passed, n_failed;

/* Record one check; on failure print where and why (printf-style). */
static void check(int ok, int line, const char *fmt, ...)
{
    if (ok) {
        n_passed++;
        return;
    }
    n_failed++;
    printf("FAIL line %d: ", line);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}
#define CHECK(cond, ...) check((cond), __LINE__, __VA_ARGS__)

/* Print ids as "[a b c]" into buf (truncated to len). */
static const char *format_ids(char *buf, size_t len, const int *ids, int n)
{
    size_t pos = 0;
    pos += (size_t)snprintf(buf + pos, len - pos, "[");
    for (int i = 0; i < n && pos < len; i++)
        pos += (size_t)snprintf(buf + pos, len - pos, i ? " %d" : "%d", ids[i]);
    if (pos < len)
        snprintf(buf + pos, len - pos, "]");
    return buf;
}

/* Print bytes with C escapes for anything outside printable ASCII. */
static const char *format_bytes(char *buf, size_t len, const char *s, size_t n)
{
    size_t pos = 0;
    for (size_t i = 0; i < n && pos + 5 < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            buf[pos++] = (char)c;
        else
            pos += (size_t)snprintf(buf + pos, len - pos, "\\x%02X", c);
    }
    buf[pos] = '\0';
    return buf;
}

static void check_ids(int line, const char *what, const int *got, int n_got, const int *want,
                      int n_want)
{
    int same = n_got == n_want && (n_got <= 0 || memcmp(got, want, (size_t)n_got * sizeof *got) == 0);
    char a[1024], b[1024];
    check(same, line, "%s: expected %s, got %s", what, format_ids(a, sizeof a, want, n_want),
          format_ids(b, sizeof b, got, n_got));
}

static void check_bytes(int line, const char *what, const char *got, size_t n_got,
                        const char *want, size_t n_want)
{
    int same = n_got == n_want && memcmp(got, want, n_got) == 0;
    char a[1024], b[1024];
    check(same, line, "%s: expected \"%s\", got \"%s\"", what, format_bytes(a, sizeof a, want, n_want),
          format_bytes(b, sizeof b, got, n_got));
}

/* ------------------------------------------------------------------------
 * Test vocabularies
 * ------------------------------------------------------------------------ */

static char tmp_dir[256];

/* tmp_dir/name into buf. */
static const char *tmp_path(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", tmp_dir, name);
    return buf;
}

static void put_i32(FILE *f, int32_t v)
{
    uint32_t u = (uint32_t)v;
    unsigned char b[4] = {(unsigned char)u, (unsigned char)(u >> 8), (unsigned char)(u >> 16),
                          (unsigned char)(u >> 24)};
    fwrite(b, 1, 4, f);
}

static void put_f32(FILE *f, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    put_i32(f, (int32_t)u);
}

static void put_entry(FILE *f, float score, const char *piece)
{
    put_f32(f, score);
    put_i32(f, (int32_t)strlen(piece));
    fwrite(piece, 1, strlen(piece), f);
}

/* The first 259 entries of a Llama-style vocabulary: <unk>, BOS, EOS and the
 * byte pieces <0x00>..<0xFF> (ids 3..258), all scored 0. */
static void put_llama_head(FILE *f)
{
    put_entry(f, 0.0f, "<unk>");
    put_entry(f, 0.0f, "\n<s>\n");
    put_entry(f, 0.0f, "\n</s>\n");
    for (int b = 0; b < 256; b++) {
        char piece[8];
        snprintf(piece, sizeof piece, "<0x%02X>", b);
        put_entry(f, 0.0f, piece);
    }
}

/* Normal pieces of the small test vocabulary, ids 259 on. Single characters
 * score low so that the scores of the merged pieces decide the order. */
static const struct {
    const char *piece;
    float score;
} small_pieces[] = {
    {" ", -50}, {"a", -51}, {"b", -52}, {"c", -53}, {"x", -54}, {"y", -55}, {"z", -56},
    {"<", -57}, {">", -58}, {"0", -59}, {"4", -60}, {"1", -61}, {"u", -62}, {"n", -63},
    {"k", -64}, {"h", -65}, {"i", -66},
    {"bc", -1},   /* beats "ab": " abc" -> " ", "a", "bc" */
    {"ab", -2},
    {"xy", -3},   /* ties with "yz": the leftmost pair wins */
    {"yz", -3},
    {"<0", -4}, {"x4", -5}, {"1>", -6}, {"<0x4", -7}, /* "<0x4" + "1>" would be byte 0x41 */
    {"<u", -8}, {"nk", -9}, {"<unk", -10},           /* "<unk" + ">" would be <unk> */
    {" h", -11}, {"hi", -12},                         /* the dummy space merges too */
    {"\xC3\xA9", -0.0f},                              /* "é", scored -0.0 like Llama's best piece */
};
#define N_SMALL ((int)(sizeof small_pieces / sizeof small_pieces[0]))
#define SMALL_VOCAB (259 + N_SMALL)

/* Id of a piece of the small vocabulary (-1 if absent, a test bug). */
static int small_id(const char *piece)
{
    for (int i = 0; i < N_SMALL; i++)
        if (strcmp(small_pieces[i].piece, piece) == 0)
            return 259 + i;
    return -1;
}

static void write_small_vocab(const char *path)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        printf("cannot write %s\n", path);
        exit(2);
    }
    put_i32(f, 6);
    put_llama_head(f);
    for (int i = 0; i < N_SMALL; i++)
        put_entry(f, small_pieces[i].score, small_pieces[i].piece);
    fclose(f);
}

/* ------------------------------------------------------------------------
 * Encoding
 * ------------------------------------------------------------------------ */

/* Encode text[0..n), with BOS when add_bos, and compare with want (BOS
 * included). */
static void check_encode(int line, const Tokenizer *t, int add_bos, const char *text, size_t n, const int *want,
                         int n_want)
{
    int *ids = malloc(tokenizer_bound(n) * sizeof *ids);
    int got = tokenizer_encode(t, text, n, add_bos, 0, ids);
    char what[300], esc[200];
    snprintf(what, sizeof what, "encode (%s) \"%s\"", tokenizer_type_name(t), format_bytes(esc, sizeof esc, text, n));
    check_ids(line, what, ids, got, want, n_want);
    free(ids);
}
/* ENCODE: with BOS (sentencepiece's tests); ENCODE_PLAIN: without. */
#define ENCODE_WITH(add_bos, t, text, ...)                                                                      \
    do {                                                                                                        \
        const int want_[] = {__VA_ARGS__};                                                                      \
        check_encode(__LINE__, t, add_bos, text, sizeof(text) - 1, want_, (int)(sizeof want_ / sizeof *want_)); \
    } while (0)
#define ENCODE(t, text, ...) ENCODE_WITH(1, t, text, __VA_ARGS__)
#define ENCODE_PLAIN(t, text, ...) ENCODE_WITH(0, t, text, __VA_ARGS__)

/* The obvious quadratic BPE: rescan all pairs after every merge. Used as an
 * independent reference for the heap-based encoder. Returns the id count. */
static int naive_encode(const Tokenizer *t, const char *text, size_t n, int *ids)
{
    int n_ids = 0;
    ids[n_ids++] = t->bos_id;
    if (n == 0)
        return n_ids;
    char *buf = malloc(n + 1);
    int *start = malloc((n + 1) * sizeof *start), *len = malloc((n + 1) * sizeof *len);
    buf[0] = ' ';
    memcpy(buf + 1, text, n);
    int n_sym = 0;
    for (size_t pos = 0; pos < n + 1; n_sym++) {
        start[n_sym] = (int)pos;
        len[n_sym] = utf8_char_length((unsigned char *)buf + pos, n + 1 - pos);
        pos += (size_t)len[n_sym];
    }
    for (;;) {
        int best = -1;
        float best_score = 0;
        for (int i = 0; i + 1 < n_sym; i++) {
            int id = lookup_piece(t, buf + start[i], len[i] + len[i + 1]);
            if (id >= 0 && (best < 0 || t->scores[id] > best_score)) {
                best = i;
                best_score = t->scores[id];
            }
        }
        if (best < 0)
            break;
        len[best] += len[best + 1];
        memmove(start + best + 1, start + best + 2, (size_t)(n_sym - best - 2) * sizeof *start);
        memmove(len + best + 1, len + best + 2, (size_t)(n_sym - best - 2) * sizeof *len);
        n_sym--;
    }
    for (int i = 0; i < n_sym; i++) {
        int id = lookup_piece(t, buf + start[i], len[i]);
        if (id >= 0)
            ids[n_ids++] = id;
        else
            for (int k = 0; k < len[i]; k++)
                ids[n_ids++] = t->byte_offset + (unsigned char)buf[start[i] + k];
    }
    free(buf);
    free(start);
    free(len);
    return n_ids;
}

static void test_encode_small(const Tokenizer *t)
{
    const int SP = small_id(" "), B0 = t->byte_offset;
    CHECK(t->byte_offset == 3, "byte_offset: expected 3, got %d", t->byte_offset);
    ENCODE(t, "", 1);
    ENCODE(t, "abc", 1, SP, small_id("a"), small_id("bc"));      /* higher score first */
    ENCODE(t, "ab", 1, SP, small_id("ab"));
    ENCODE(t, "xyz", 1, SP, small_id("xy"), small_id("z"));      /* tie: leftmost */
    ENCODE(t, "yzxy", 1, SP, small_id("yz"), small_id("xy"));
    ENCODE(t, "hi", 1, small_id(" h"), small_id("i"));           /* " h" beats "hi" */
    ENCODE(t, "<0x41>", 1, SP, small_id("<0x4"), small_id("1>")); /* not byte 0x41 */
    ENCODE(t, "<unk>", 1, SP, small_id("<unk"), small_id(">"));  /* not <unk> */
    ENCODE(t, "\xC3\xA9", 1, SP, small_id("\xC3\xA9"));         /* é is a piece */
    ENCODE(t, "\xE2\x82\xAC", 1, SP, B0 + 0xE2, B0 + 0x82, B0 + 0xAC); /* € is not */
    ENCODE(t, "a\xFF" "b", 1, SP, small_id("a"), B0 + 0xFF, small_id("b")); /* invalid byte */
    ENCODE(t, "\xE2\x82" "a", 1, SP, B0 + 0xE2, B0 + 0x82, small_id("a")); /* cut sequence */
    ENCODE(t, "\xED\xA0\x80", 1, SP, B0 + 0xED, B0 + 0xA0, B0 + 0x80); /* surrogate */
    ENCODE(t, "a\0b", 1, SP, small_id("a"), B0, small_id("b"));   /* NUL is a byte */
    ENCODE(t, " a", 1, SP, SP, small_id("a"));
    ENCODE(t, "\n<s>\n", 1, SP, B0 + '\n', small_id("<"), B0 + 's', small_id(">"), B0 + '\n');

    /* add_bos / add_eos and the empty text. */
    int ids[8];
    int n = tokenizer_encode(t, "", 0, 0, 0, ids);
    CHECK(n == 0, "encode \"\" without BOS/EOS: expected 0 ids, got %d", n);
    n = tokenizer_encode(t, "", 0, 1, 1, ids);
    CHECK(n == 2 && ids[0] == 1 && ids[1] == 2, "encode \"\" with BOS+EOS: expected [1 2], n=%d", n);
    n = tokenizer_encode(t, "ab", 2, 0, 1, ids);
    CHECK(n == 3 && ids[0] == SP && ids[2] == 2, "encode \"ab\" with EOS only: n=%d", n);

    /* The heap encoder against the quadratic reference on random strings
     * over an alphabet rich in merges. */
    const char *alphabet[] = {"a", "b", "c", "x", "y", "z", " ", "<", ">", "0", "x", "4", "1",
                              "u", "n", "k", "h", "i", "\xC3\xA9", "\xE2\x82\xAC", "\xFF"};
    unsigned seed = 12345;
    int mismatches = 0;
    for (int round = 0; round < 300; round++) {
        char text[128];
        size_t len = 0;
        seed = seed * 1103515245u + 12345u;
        int count = (int)(seed >> 16) % 30;
        for (int i = 0; i < count; i++) {
            seed = seed * 1103515245u + 12345u;
            const char *s = alphabet[(seed >> 16) % (sizeof alphabet / sizeof *alphabet)];
            memcpy(text + len, s, strlen(s));
            len += strlen(s);
        }
        int got[200], want[200];
        int n_got = tokenizer_encode(t, text, len, 1, 0, got);
        int n_want = naive_encode(t, text, len, want);
        if (n_got != n_want || memcmp(got, want, (size_t)n_got * sizeof *got) != 0) {
            if (mismatches++ < 3)
                check_ids(__LINE__, "heap encoder vs naive reference", got, n_got, want, n_want);
        }
    }
    CHECK(mismatches == 0, "heap encoder differs from the naive reference on %d of 300 strings",
          mismatches);
}

/* ------------------------------------------------------------------------
 * Decoding
 * ------------------------------------------------------------------------ */

/* Decode ids[1..n) after ids[0] (like run.c after BOS), flush, compare. */
static void check_decode(int line, const Tokenizer *t, const int *ids, int n, const char *want,
                         size_t n_want)
{
    size_t bound = tokenizer_decode_bound(t);
    char *piece = malloc(bound), out[1024];
    size_t len = 0;
    int within_bound = 1;
    DecodeState st = {{0}, 0};
    for (int i = 1; i < n; i++) {
        size_t k = tokenizer_decode(t, &st, ids[i - 1], ids[i], piece);
        within_bound &= k < bound;
        memcpy(out + len, piece, k);
        len += k;
    }
    size_t k = tokenizer_decode_flush(&st, piece);
    memcpy(out + len, piece, k);
    len += k;
    check_bytes(line, "decode", out, len, want, n_want);
    check(within_bound, line, "decode wrote more than tokenizer_decode_bound");
    free(piece);
}
#define DECODE(t, want, ...)                                                                \
    do {                                                                                    \
        const int ids_[] = {__VA_ARGS__};                                                   \
        check_decode(__LINE__, t, ids_, (int)(sizeof ids_ / sizeof *ids_), want, sizeof(want) - 1); \
    } while (0)

static void test_decode_small(const Tokenizer *t)
{
    const int SP = small_id(" "), B0 = t->byte_offset, A = small_id("a");
    char out[64];
    DecodeState st = {{0}, 0};

    /* A two-byte character split over two byte tokens: nothing, then "é". */
    size_t n = tokenizer_decode(t, &st, A, B0 + 0xC3, out);
    CHECK(n == 0 && st.n_pending == 1, "decode <0xC3>: expected 0 bytes held back, got %zu", n);
    n = tokenizer_decode(t, &st, B0 + 0xC3, B0 + 0xA9, out);
    check_bytes(__LINE__, "decode <0xC3><0xA9>", out, n, "\xC3\xA9", 2);

    DECODE(t, "\xE2\x82\xAC", A, B0 + 0xE2, B0 + 0x82, B0 + 0xAC);            /* € */
    DECODE(t, "\xF0\x9F\x98\x80", A, B0 + 0xF0, B0 + 0x9F, B0 + 0x98, B0 + 0x80); /* 😀 */
    DECODE(t, "a\xF0\x9F\x98\x80" "b", 0, A, B0 + 0xF0, B0 + 0x9F, B0 + 0x98, B0 + 0x80,
           small_id("b"));

    /* U+FFFD, one per bad byte, never a half sequence. */
    DECODE(t, "\xEF\xBF\xBD", A, B0 + 0xFF);                       /* never valid */
    DECODE(t, "\xEF\xBF\xBD", A, B0 + 0x80);                       /* lone continuation */
    DECODE(t, "\xEF\xBF\xBD" "a", A, B0 + 0xC3, A);                /* cut by a normal piece */
    DECODE(t, "\xEF\xBF\xBD\xEF\xBF\xBD", A, B0 + 0xE2, B0 + 0x82); /* cut by the end: flush */
    DECODE(t, "\xEF\xBF\xBD\xEF\xBF\xBD", A, B0 + 0xC0, B0 + 0x80); /* overlong */
    DECODE(t, "\xEF\xBF\xBD\xEF\xBF\xBD", A, B0 + 0xED, B0 + 0xA0); /* surrogate */
    DECODE(t, "\xEF\xBF\xBD\xEF\xBF\xBD", A, B0 + 0xF4, B0 + 0x90); /* above U+10FFFF */
    DECODE(t, "\xEF\xBF\xBD\xC3\xA9", A, B0 + 0xE2, B0 + 0xC3, B0 + 0xA9); /* restart */
    DECODE(t, "\0", A, B0);                                        /* NUL byte */

    /* After BOS the dummy-prefix space goes, once, and only from a normal piece. */
    DECODE(t, "h", 1, small_id(" h"));
    DECODE(t, "a h", 1, A, small_id(" h"));
    DECODE(t, " a", 1, SP, SP, A);
    DECODE(t, " ", 1, B0 + ' ');

    /* Out-of-range ids print nothing. */
    n = tokenizer_decode(t, &st, 1, -1, out);
    size_t n2 = tokenizer_decode(t, &st, 1, t->vocab_size, out);
    CHECK(n == 0 && n2 == 0, "decode of out-of-range ids: expected 0 bytes, got %zu and %zu", n, n2);
}

/* Fragments the round trips join into random texts. */
static const char *const sp_alphabet[] = {"a", "b", "c", "x", "y", "z", " ", "  ", "\n", "\t", "<", ">",
                                          "<s>", "<unk>", "<0x41>", "0", "\xC3\xA9", "\xE2\x82\xAC",
                                          "\xF0\x9F\x98\x80", "\xE6\x97\xA5", "\xF4\x8F\xBF\xBF",
                                          "\xEF\xBF\xBD", "h", "i", "the", " the", "Once upon"};
#define N_SP_ALPHABET ((int)(sizeof sp_alphabet / sizeof *sp_alphabet))

/* decode(encode(x)) == x for valid UTF-8 x made of fragments of alphabet,
 * encoded with BOS and streamed token by token after it. */
static void check_round_trip(const Tokenizer *t, const char *label, const char *const *alphabet, int n_alphabet,
                             unsigned seed, int rounds)
{
    size_t bound = tokenizer_decode_bound(t);
    char *piece = malloc(bound);
    int failures = 0;
    for (int round = 0; round < rounds; round++) {
        char text[512], out[2048];
        size_t len = 0, out_len = 0;
        seed = seed * 1103515245u + 12345u;
        int count = (int)(seed >> 16) % 40;
        for (int i = 0; i < count; i++) {
            seed = seed * 1103515245u + 12345u;
            const char *s = alphabet[(seed >> 16) % (unsigned)n_alphabet];
            memcpy(text + len, s, strlen(s));
            len += strlen(s);
        }
        int ids[600];
        int n = tokenizer_encode(t, text, len, 1, 0, ids);
        DecodeState st = {{0}, 0};
        for (int i = 1; i < n; i++) {
            size_t k = tokenizer_decode(t, &st, ids[i - 1], ids[i], piece);
            memcpy(out + out_len, piece, k);
            out_len += k;
        }
        out_len += tokenizer_decode_flush(&st, out + out_len);
        if (out_len != len || memcmp(out, text, len) != 0) {
            if (failures++ < 3) {
                char what[64];
                snprintf(what, sizeof what, "round trip (%s)", label);
                check_bytes(__LINE__, what, out, out_len, text, len);
            }
        }
    }
    CHECK(failures == 0, "round trip (%s): %d of %d strings differ", label, failures, rounds);
    free(piece);
}

/* tokenizer_encode_long gives the ids of one tokenizer_encode of the whole
 * text, cut in pieces of `chunk` bytes or not (a vocabulary with a piece that
 * reaches across a space is encoded whole: can_cut says which is expected). */
static int n_progress;
static void count_progress(size_t done, size_t total) { (void)done, (void)total, n_progress++; }
static void check_encode_long(const Tokenizer *t, const char *label, int can_cut)
{
    static const char *const words[] = {"the", "cat", "sat", "on", "a", "mat", "x", "y", "Once", "upon",
                                        "\xC3\xA9t\xC3\xA9", "\xE6\x97\xA5", "don't", "12345", ".", ",", "\n",
                                        "\n\n", "  ", "<s>", "<|im_end|>", "\t", "ab", "bc"};
    size_t n = 0, cap = 40000;
    char *text = malloc(cap);
    unsigned seed = 7;
    while (n + 32 < cap) { // words with single spaces between most of them
        seed = seed * 1103515245u + 12345u;
        const char *w = words[(seed >> 16) % (sizeof words / sizeof *words)];
        memcpy(text + n, w, strlen(w));
        n += strlen(w);
        seed = seed * 1103515245u + 12345u;
        if ((seed >> 16) % 5) text[n++] = ' ';
    }
    int *whole = malloc(tokenizer_bound(n) * sizeof(int)), *pieces = NULL;
    int n_whole = tokenizer_encode(t, text, n, 0, 0, whole);
    n_progress = 0;
    int n_pieces = tokenizer_encode_long(t, text, n, 97, &pieces, count_progress);
    int same = n_pieces == n_whole && memcmp(whole, pieces, (size_t)n_whole * sizeof(int)) == 0;
    CHECK(same, "encode_long (%s): %d ids against %d from one encode", label, n_pieces, n_whole);
    CHECK(can_cut ? n_progress > 100 : n_progress == 1, "encode_long (%s): %d pieces of a %zu-byte text", label,
          n_progress, n);
    free(text);
    free(whole);
    free(pieces);
}

/* ------------------------------------------------------------------------
 * Loader errors
 * ------------------------------------------------------------------------ */

/* tokenizer_build(path, vocab_size) must fail with a one-line message that
 * names the file and contains `expect`. */
static void check_load_error(int line, const char *path, int vocab_size, int bos, int eos,
                             const char *expect)
{
    Tokenizer t;
    char err[512];
    err[0] = '\0';
    int rc = tokenizer_build(&t, path, vocab_size, bos, eos, err, sizeof err);
    int ok = rc == -1 && strstr(err, path) != NULL && strstr(err, expect) != NULL &&
             strchr(err, '\n') == NULL && t.vocab == NULL;
    check(ok, line, "loading %s: expected -1 and a message with \"%s\", got %d \"%s\"", path,
          expect, rc, err);
    tokenizer_free(&t); /* harmless after a failure */
}

/* Write a small vocabulary file and let `damage` change it: kinds below. */
enum { WHOLE, CUT_AT, NEG_LEN, LONG_PIECE, NAN_SCORE, SWAP_BYTES, EXTRA_TOKENS, TRAILING };

static const char *write_damaged(const char *name, int kind, long arg)
{
    static char path[512];
    tmp_path(path, sizeof path, name);
    FILE *f = fopen(path, "wb");
    put_i32(f, 6);
    put_llama_head(f);
    for (int i = 0; i < N_SMALL; i++) {
        int id = 259 + i;
        if (kind == NEG_LEN && id == arg) {
            put_f32(f, -1);
            put_i32(f, -5);
        } else if (kind == LONG_PIECE && id == arg) {
            put_entry(f, -1, "toolong");
        } else if (kind == NAN_SCORE && id == arg) {
            put_entry(f, NAN, "q");
        } else {
            put_entry(f, small_pieces[i].score, small_pieces[i].piece);
        }
    }
    if (kind == EXTRA_TOKENS)
        for (long i = 0; i < arg; i++)
            put_entry(f, -99, "extra");
    if (kind == TRAILING)
        fwrite("\1\2\3", 1, 3, f);
    fclose(f);
    if (kind == CUT_AT || kind == SWAP_BYTES) { /* rewrite the bytes: cut or swap */
        f = fopen(path, "rb");
        static unsigned char data[1 << 16];
        size_t size = fread(data, 1, sizeof data, f);
        fclose(f);
        if (kind == SWAP_BYTES) { /* swap the pieces <0x10> and <0x11> (ids 19, 20) */
            size_t pos = 4;
            for (int i = 0; i < 19; i++)
                pos += 8 + (size_t)read_le_i32(data + pos + 4);
            data[pos + 8 + 4] = '1';
            data[pos + 8 + 14 + 4] = '0';
        } else {
            size = (size_t)arg;
        }
        f = fopen(path, "wb");
        fwrite(data, 1, size, f);
        fclose(f);
    }
    return path;
}

static void test_load_errors(void)
{
    char path[512];
    check_load_error(__LINE__, tmp_path(path, sizeof path, "missing.bin"), SMALL_VOCAB, 1, 2,
                     "No such file");
    check_load_error(__LINE__, tmp_dir, SMALL_VOCAB, 1, 2, "directory");
    check_load_error(__LINE__, write_damaged("empty.bin", CUT_AT, 0), SMALL_VOCAB, 1, 2, "empty");
    check_load_error(__LINE__, write_damaged("short.bin", CUT_AT, 2), SMALL_VOCAB, 1, 2,
                     "only 2 of the 4 header bytes");
    /* 4 + 3 entries of 13/14 bytes ("<unk>", BOS, EOS) ends at 4+13+13+14 = 44 */
    check_load_error(__LINE__, write_damaged("cut_head.bin", CUT_AT, 44 + 5), SMALL_VOCAB, 1, 2,
                     "token 3 of");
    check_load_error(__LINE__, write_damaged("cut_piece.bin", CUT_AT, 44 + 8 + 2), SMALL_VOCAB, 1,
                     2, "token 3 of");
    check_load_error(__LINE__, write_damaged("cut_clean.bin", CUT_AT, 44), SMALL_VOCAB, 1, 2,
                     "holds 3 tokens but the model has vocab_size");
    check_load_error(__LINE__, write_damaged("neg.bin", NEG_LEN, 262), SMALL_VOCAB, 1, 2,
                     "token 262 has negative length");
    check_load_error(__LINE__, write_damaged("long.bin", LONG_PIECE, 265), SMALL_VOCAB, 1, 2,
                     "more than max_token_length");
    check_load_error(__LINE__, write_damaged("nan.bin", NAN_SCORE, 270), SMALL_VOCAB, 1, 2,
                     "token 270 has a NaN score");
    check_load_error(__LINE__, write_damaged("swap.bin", SWAP_BYTES, 0), SMALL_VOCAB, 1, 2,
                     "not at consecutive ids");
    char expect[128];
    snprintf(expect, sizeof expect, "holds %d tokens but the model has vocab_size %d",
             SMALL_VOCAB + 5, SMALL_VOCAB);
    check_load_error(__LINE__, write_damaged("extra.bin", EXTRA_TOKENS, 5), SMALL_VOCAB, 1, 2,
                     expect);
    check_load_error(__LINE__, write_damaged("trail.bin", TRAILING, 0), SMALL_VOCAB, 1, 2,
                     "3 trailing bytes");
    char good[512];
    snprintf(good, sizeof good, "%s", write_damaged("good.bin", WHOLE, 0));
    snprintf(expect, sizeof expect, "holds %d tokens", SMALL_VOCAB);
    check_load_error(__LINE__, good, SMALL_VOCAB + 1, 1, 2, expect);
    check_load_error(__LINE__, good, SMALL_VOCAB - 1, 1, 2, expect);
    check_load_error(__LINE__, good, 0, 1, 2, "invalid vocab_size 0");
    check_load_error(__LINE__, good, SMALL_VOCAB, SMALL_VOCAB, 2, "outside the vocabulary");

    /* max_token_length out of range: rewrite the header of a good file. */
    const int32_t bad_max[] = {0, -3, 1000000000};
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "max%d.bin", i);
        const char *p = write_damaged(name, WHOLE, 0);
        FILE *f = fopen(p, "r+b");
        put_i32(f, bad_max[i]);
        fclose(f);
        check_load_error(__LINE__, p, SMALL_VOCAB, 1, 2, "max_token_length");
    }
    Tokenizer t;
    char err[256];
    int rc = tokenizer_build(&t, good, SMALL_VOCAB, 1, 2, err, sizeof err);
    CHECK(rc == 0, "loading the intact file: expected 0, got %d (%s)", rc, err);
    tokenizer_free(&t);
}

/* ------------------------------------------------------------------------
 * Version 2 files ("LTOK"): a writer, byte-level BPE, loader errors
 * ------------------------------------------------------------------------ */

#define V2_MAX_PIECES 600
#define V2_MAX_MERGES 64

/* A version 2 vocabulary under construction, then written to a file. */
typedef struct {
    int32_t field[11]; /* header i32s at offsets 0..40: magic .. add_bos */
    int n;             /* pieces */
    char text[V2_MAX_PIECES][24];
    int len[V2_MAX_PIECES], kind[V2_MAX_PIECES];
    float score[V2_MAX_PIECES];
    int n_merges;
    int merge[V2_MAX_MERGES][2];
} V2Vocab;

/* Header field indexes (byte offset / 4). */
enum { F_MAGIC, F_VERSION, F_TYPE, F_PRE, F_VOCAB, F_MERGES, F_BOS, F_EOS, F_EOT, F_PAD, F_ADD_BOS };

static int v2_add(V2Vocab *v, const char *text, int len, int kind, float score)
{
    memcpy(v->text[v->n], text, (size_t)len);
    v->len[v->n] = len;
    v->kind[v->n] = kind;
    v->score[v->n] = score;
    return v->n++;
}

/* Id of the piece of the given kind spelling text[0..len), or -1. */
static int v2_find(const V2Vocab *v, const char *text, int len, int kind)
{
    for (int i = 0; i < v->n; i++)
        if (v->kind[i] == kind && v->len[i] == len && memcmp(v->text[i], text, (size_t)len) == 0)
            return i;
    return -1;
}

/* Append the merge (left, right) of two normal pieces, adding the joined
 * piece; returns its id. */
static int v2_merge(V2Vocab *v, const char *left, const char *right)
{
    int a = v2_find(v, left, (int)strlen(left), PIECE_NORMAL);
    int b = v2_find(v, right, (int)strlen(right), PIECE_NORMAL);
    char joined[48];
    snprintf(joined, sizeof joined, "%s%s", left, right);
    int id = v2_find(v, joined, (int)strlen(joined), PIECE_NORMAL);
    if (id < 0)
        id = v2_add(v, joined, (int)strlen(joined), PIECE_NORMAL, 0);
    v->merge[v->n_merges][0] = a;
    v->merge[v->n_merges][1] = b;
    v->n_merges++;
    return id;
}

/* Store v little-endian at p. */
static void store_i32(unsigned char *p, int32_t v)
{
    uint32_t u = (uint32_t)v;
    for (int k = 0; k < 4; k++)
        p[k] = (unsigned char)(u >> (8 * k));
}

/* File image of v: header (vocab_size and n_merges counted), pieces,
 * merges. Returns its size. */
static size_t v2_image(const V2Vocab *v, unsigned char *out)
{
    memset(out, 0, TOK_HEADER_BYTES);
    for (int k = 0; k < 11; k++)
        store_i32(out + 4 * k, k == F_VOCAB ? v->n : k == F_MERGES ? v->n_merges : v->field[k]);
    size_t pos = TOK_HEADER_BYTES;
    for (int i = 0; i < v->n; i++) {
        uint32_t score;
        memcpy(&score, &v->score[i], 4);
        store_i32(out + pos, (int32_t)score);
        store_i32(out + pos + 4, v->kind[i]);
        store_i32(out + pos + 8, v->len[i]);
        memcpy(out + pos + 12, v->text[i], (size_t)v->len[i]);
        pos += 12 + (size_t)v->len[i];
    }
    for (int k = 0; k < v->n_merges; k++, pos += 8) {
        store_i32(out + pos, v->merge[k][0]);
        store_i32(out + pos + 4, v->merge[k][1]);
    }
    return pos;
}

/* Paths of the files written below, removed at the end. */
static char v2_paths[96][512];
static int n_v2_paths;

/* Write bytes[0..n) to tmp_dir/name; returns the path (static buffer). */
static const char *write_tmp(const char *name, const unsigned char *bytes, size_t n)
{
    static char path[512];
    tmp_path(path, sizeof path, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        printf("cannot write %s\n", path);
        exit(2);
    }
    fwrite(bytes, 1, n, f);
    fclose(f);
    if (n_v2_paths < 96)
        memcpy(v2_paths[n_v2_paths++], path, sizeof path);
    return path;
}

static unsigned char image[1 << 16];

static const char *write_v2(const char *name, const V2Vocab *v)
{
    return write_tmp(name, image, v2_image(v, image));
}

/* The byte-level test vocabulary: ids 0..255 the bytes, 256.. special and
 * unused pieces, then the merges' pieces from BL_FIRST_MERGED in rank order. */
enum { BL_EOT = 256, BL_IM_START, BL_IM_END, BL_BOS, BL_A, BL_AB, BL_EMPTY, BL_UNUSED, BL_FIRST_MERGED };

static const char *const bl_merges[][2] = {
    {"b", "c"}, {"a", "b"}, {"a", "a"}, {"aa", "aa"}, {" ", " "}, {"  ", "  "}, {" ", "a"},
    {"'", "s"}, {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "hello"}, {"1", "2"},
    {"12", "3"}, {"\xEF", "\xBF"}, {"\xEF\xBF", "\xBD"}, {"o", " "}, {"!", "!"}, {".", "\n"},
    {"x", "y"}, {"y", "z"}, {"z", "x"},
};
#define N_BL_MERGES ((int)(sizeof bl_merges / sizeof bl_merges[0]))

static void build_byte_level(V2Vocab *v, int pre, int missing_byte)
{
    memset(v, 0, sizeof *v);
    const int32_t field[11] = {(int32_t)TOK_MAGIC, 2, TOK_BYTE_BPE, pre, 0, 0, BL_BOS, BL_EOT,
                               BL_IM_END, -1, 0};
    memcpy(v->field, field, sizeof field);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        v2_add(v, &c, 1, b == missing_byte ? PIECE_UNUSED : PIECE_NORMAL, 0);
    }
    const char *specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "<|a|>", "<|a|>b"};
    for (int k = 0; k < 6; k++)
        v2_add(v, specials[k], (int)strlen(specials[k]), PIECE_SPECIAL, 0);
    v2_add(v, "", 0, PIECE_UNUSED, 0);
    v2_add(v, "unused", 6, PIECE_UNUSED, 0);
    for (int k = 0; k < N_BL_MERGES; k++)
        v2_merge(v, bl_merges[k][0], bl_merges[k][1]);
}

/* Load a byte-level vocabulary built with pre (and without one byte's piece
 * when missing_byte >= 0); exits on failure, as nothing else can run. */
static void load_byte_level(Tokenizer *t, V2Vocab *v, int pre, int missing_byte, const char *name)
{
    build_byte_level(v, pre, missing_byte);
    char err[512];
    if (tokenizer_build(t, write_v2(name, v), v->n, BL_BOS, BL_EOT, err, sizeof err) != 0) {
        printf("FAIL: cannot load the byte-level test vocabulary: %s\n", err);
        exit(1);
    }
}

/* Id of a normal piece of v (a test bug when absent). */
static int bl_id(const V2Vocab *v, const char *text)
{
    int id = v2_find(v, text, (int)strlen(text), PIECE_NORMAL);
    if (id < 0) {
        printf("test bug: no piece \"%s\"\n", text);
        exit(2);
    }
    return id;
}

/* Pre-token splits, lengths in bytes, from Hugging Face's tokenizers
 * (pre_tokenize_str of the pre-tokenizers tests/test_tokenizer_bpe.py builds). */
static const struct {
    int pre;
    const char *text;
    int lens[20];
} splits[] = {
    {PRE_GPT2, "Hello world's  end", {5, 6, 2, 1, 4}},
    {PRE_GPT2, "don't DON'T we'Ll 'sup '\xC5\xBF", {3, 2, 4, 1, 1, 3, 1, 2, 2, 3, 2, 2}},
    {PRE_GPT2, "  x\x09\x09y  \x0A\x0A z \x0D\x0A", {1, 2, 1, 1, 1, 4, 2, 3}},
    {PRE_GPT2, "a1234567b 42 \xD9\xA1\xD9\xA2", {1, 7, 1, 3, 5}},
    {PRE_GPT2, "(hello ((x)) ?!\x0A\x0Aok", {1, 5, 3, 1, 2, 3, 1, 1, 2}},
    {PRE_GPT2, "\xC2\xA0\xE3\x80\x80x\xC2\x85y\xE1\xA0\x8Ez \xE2\x80\xA8", {2, 3, 1, 2, 1, 3, 1, 4}},
    {PRE_GPT2, "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",
     {5, 10, 13}},
    {PRE_GPT2, "x  .\x0A\x0A  \x0A y", {1, 1, 2, 5, 2}},
    {PRE_LLAMA3, "Hello world's  end", {5, 6, 2, 1, 4}},
    {PRE_LLAMA3, "don't DON'T we'Ll 'sup '\xC5\xBF", {3, 2, 4, 2, 3, 3, 2, 3, 2, 2}},
    {PRE_LLAMA3, "  x\x09\x09y  \x0A\x0A z \x0D\x0A", {1, 2, 1, 2, 4, 2, 3}},
    {PRE_LLAMA3, "a1234567b 42 \xD9\xA1\xD9\xA2", {1, 3, 3, 1, 1, 1, 2, 1, 4}},
    {PRE_LLAMA3, "(hello ((x)) ?!\x0A\x0Aok", {6, 3, 1, 2, 5, 2}},
    {PRE_LLAMA3, "\xC2\xA0\xE3\x80\x80x\xC2\x85y\xE1\xA0\x8Ez \xE2\x80\xA8", {2, 4, 3, 4, 4}},
    {PRE_LLAMA3, "x  .\x0A\x0A  \x0A y", {1, 1, 4, 3, 2}},
    {PRE_QWEN2, "don't DON'T we'Ll 'sup '\xC5\xBF", {3, 2, 4, 2, 3, 3, 2, 3, 2, 2}},
    {PRE_QWEN2, "a1234567b 42 \xD9\xA1\xD9\xA2", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2}},
    {PRE_QWEN2, "(hello ((x)) ?!\x0A\x0Aok", {6, 3, 1, 2, 5, 2}},
    {PRE_SMOLLM, "a1234567b 42 \xD9\xA1\xD9\xA2", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2}},
    {PRE_SMOLLM, "don't DON'T we'Ll 'sup '\xC5\xBF", {3, 2, 4, 1, 1, 3, 1, 2, 2, 3, 2, 2}},
    {PRE_SMOLLM, "x  .\x0A\x0A  \x0A y", {1, 1, 2, 5, 2}},
    {PRE_GPT2, "it'\xC5\xBF x'\xC5\xBFt'S'\xE2\x84\xAA", {2, 1, 2, 2, 1, 3, 1, 1, 1, 3}}, /* 'ſ, 'K (Kelvin) */
    {PRE_LLAMA3, "it'\xC5\xBF x'\xC5\xBFt'S'\xE2\x84\xAA", {2, 3, 2, 3, 1, 2, 4}},
    {PRE_NONE, "Hello world's  end", {18}},
};

static void test_pre_tokenizer_splits(void)
{
    for (size_t k = 0; k < sizeof splits / sizeof splits[0]; k++) {
        const char *text = splits[k].text;
        size_t n = strlen(text);
        PreTokens p = pre_tokens(splits[k].pre, (const unsigned char *)text, n);
        int got[64], want[20], n_want = 0, count = 0;
        for (size_t start = 0, end; count < 64 && (end = pre_token_next(&p)) > 0; start = end)
            got[count++] = (int)(end - start);
        while (n_want < 20 && splits[k].lens[n_want] > 0)
            n_want++;
        memcpy(want, splits[k].lens, sizeof want);
        char what[300], esc[200];
        snprintf(what, sizeof what, "pre-tokenizer %d on \"%s\"", splits[k].pre,
                 format_bytes(esc, sizeof esc, text, n));
        check_ids(__LINE__, what, got, count, want, n_want);
    }
}

/* The obvious quadratic byte-level BPE of one pre-token: join the pair of
 * lowest rank, leftmost first, until none has a merge. Returns the id count. */
static int naive_byte_level(const Tokenizer *t, const char *s, int n, int *ids)
{
    int m = 0;
    for (int k = 0; k < n; k++)
        if (t->byte_id[(unsigned char)s[k]] >= 0)
            ids[m++] = t->byte_id[(unsigned char)s[k]];
    for (;;) {
        int best = -1, best_rank = INT_MAX, result = -1;
        for (int i = 0; i + 1 < m; i++) {
            const MergeRule *r = find_merge(t, ids[i], ids[i + 1]);
            if (r != NULL && r->rank < best_rank) {
                best = i;
                best_rank = r->rank;
                result = r->result;
            }
        }
        if (best < 0)
            return m;
        ids[best] = result;
        memmove(ids + best + 1, ids + best + 2, (size_t)(m - best - 2) * sizeof *ids);
        m--;
    }
}

/* Long texts encoded in pieces equal one encoding, for every pre-tokenizer,
 * and with a special piece that holds a space. */
static void test_byte_level_encode_long(void)
{
    Tokenizer t;
    V2Vocab *v = malloc(sizeof *v);
    const int pres[] = {PRE_GPT2, PRE_LLAMA3, PRE_QWEN2, PRE_SMOLLM};
    const char *pre_names[] = {"byte-level gpt2", "byte-level llama3", "byte-level qwen2", "byte-level smollm"};
    for (int p = 0; p < 4; p++) { // no special piece holds a space: cut into pieces
        load_byte_level(&t, v, pres[p], -1, "bl_long.bin");
        check_encode_long(&t, pre_names[p], 1);
        tokenizer_free(&t);
    }
    { // a special piece with a space in it could be cut in two: encoded whole
        char err[512];
        build_byte_level(v, PRE_GPT2, -1);
        v2_add(v, "<a b>", 5, PIECE_SPECIAL, 0);
        CHECK(tokenizer_build(&t, write_v2("bl_spaced_special.bin", v), v->n, BL_BOS, BL_EOT, err, sizeof err) == 0,
              "byte-level vocabulary with \"<a b>\": %s", err);
        check_encode_long(&t, "byte-level, a special piece with a space", 0);
        tokenizer_free(&t);
    }
    free(v);
}

static void test_byte_level_heap_and_pretokenizers(const Tokenizer *t, const V2Vocab *v);

static void test_byte_level_encode(void)
{
    Tokenizer t;
    V2Vocab *v = malloc(sizeof *v);
    load_byte_level(&t, v, PRE_GPT2, -1, "bl_gpt2.bin");
    const int A = 'a', B = 'b', C = 'c', SP = ' ', FFFD = bl_id(v, "\xEF\xBF\xBD");
    CHECK(strcmp(tokenizer_type_name(&t), "byte-level BPE (gpt2)") == 0, "type name: got \"%s\"",
          tokenizer_type_name(&t));
    CHECK(t.n_merges == N_BL_MERGES && t.n_special == 6 && t.eot_id == BL_IM_END && t.add_bos == 0 &&
              t.max_token_length == 13,
          "byte-level header: n_merges %d n_special %d eot_id %d add_bos %d max_token_length %d", t.n_merges,
          t.n_special, t.eot_id, t.add_bos, t.max_token_length);

    /* Merges by rank: "bc" (rank 0) before "ab" (rank 1). */
    ENCODE_PLAIN(&t, "abc", A, bl_id(v, "bc"));
    ENCODE_PLAIN(&t, "ab", bl_id(v, "ab"));
    ENCODE_PLAIN(&t, "hello", bl_id(v, "hello"));
    ENCODE_PLAIN(&t, " hello", bl_id(v, " hello"));
    check_encode(__LINE__, &t, 0, "", 0, NULL, 0);
    /* One merge at several places: the leftmost first ("aa" then "aaaa"). */
    ENCODE_PLAIN(&t, "aaa", bl_id(v, "aa"), A);
    ENCODE_PLAIN(&t, "aaaaa", bl_id(v, "aaaa"), A);
    ENCODE_PLAIN(&t, "aaaaaa", bl_id(v, "aaaa"), bl_id(v, "aa"));
    /* Chained merges that compete: xy (rank 20), yz (21), zx (22). */
    ENCODE_PLAIN(&t, "xyz", bl_id(v, "xy"), 'z');
    ENCODE_PLAIN(&t, "zxyz", 'z', bl_id(v, "xy"), 'z');
    ENCODE_PLAIN(&t, "yzx", bl_id(v, "yz"), 'x');
    /* The pre-tokenizer keeps merges inside pre-tokens: "o " never forms. */
    ENCODE_PLAIN(&t, "hello world", bl_id(v, "hello"), SP, 'w', 'o', 'r', 'l', 'd');
    ENCODE_PLAIN(&t, "a's", A, bl_id(v, "'s"));
    ENCODE_PLAIN(&t, "x  a", 'x', SP, bl_id(v, " a"));
    ENCODE_PLAIN(&t, "!!!", bl_id(v, "!!"), '!');
    ENCODE_PLAIN(&t, ".\n", '.', '\n'); /* GPT-2: "." and "\n" are separate pre-tokens */
    ENCODE_PLAIN(&t, "a\0b", A, 0, B);

    /* Special pieces: exact text only, leftmost, longest; the text between
     * is encoded normally. */
    ENCODE_PLAIN(&t, "<|im_start|>hello<|im_end|>", BL_IM_START, bl_id(v, "hello"), BL_IM_END);
    ENCODE_PLAIN(&t, "<|im_end|><|im_start|>", BL_IM_END, BL_IM_START);
    ENCODE_PLAIN(&t, "x<s>y", 'x', BL_BOS, 'y');
    ENCODE_PLAIN(&t, "<<s>>", '<', BL_BOS, '>');
    ENCODE_PLAIN(&t, "<|a|>b", BL_AB);
    ENCODE_PLAIN(&t, "<|a|>bc", BL_AB, C);
    ENCODE_PLAIN(&t, "<|a|>c", BL_A, C);
    ENCODE_PLAIN(&t, "<|a|", '<', '|', A, '|');
    ENCODE_PLAIN(&t, "<s", '<', 's');
    ENCODE_PLAIN(&t, "unused", 'u', 'n', 'u', 's', 'e', 'd'); /* unused pieces are never produced */
    ENCODE_PLAIN(&t, "<|endoftext|> a", BL_EOT, bl_id(v, " a"));

    /* Invalid UTF-8: one U+FFFD per maximal invalid subsequence, as Python's
     * bytes.decode("utf-8", "replace"); U+FFFD is a piece here. */
    ENCODE_PLAIN(&t, "\xFF", FFFD);
    ENCODE_PLAIN(&t, "a\xE2\x82" "b", A, FFFD, B);        /* a cut 3-byte sequence: one U+FFFD */
    ENCODE_PLAIN(&t, "\xF0\x9F\x98", FFFD);               /* a cut 4-byte sequence */
    ENCODE_PLAIN(&t, "\xC0\xAF", FFFD, FFFD);             /* overlong: two */
    ENCODE_PLAIN(&t, "\xED\xA0\x80", FFFD, FFFD, FFFD);   /* surrogate: three */
    ENCODE_PLAIN(&t, "\xF4\x90\x80\x80", FFFD, FFFD, FFFD, FFFD);
    ENCODE_PLAIN(&t, "\xE2\x82\xAC", 0xE2, 0x82, 0xAC);   /* valid: its bytes */
    ENCODE_PLAIN(&t, "<s\xFF>", '<', 's', FFFD, '>');
    int ids[64];
    int n = tokenizer_encode(&t, "\xFF\xFF", 2, 1, 1, ids);
    CHECK(n == 4 && ids[0] == BL_BOS && ids[1] == FFFD && ids[2] == FFFD && ids[3] == BL_EOT,
          "encode with add_bos/add_eos: n=%d", n);

    test_byte_level_heap_and_pretokenizers(&t, v);
    tokenizer_free(&t);
    free(v);
}

/* The heap encoder against the quadratic reference; the other pre-tokenizers;
 * a byte without a piece. t, v: the GPT-2 byte-level vocabulary and its
 * pieces, for comparison. */
static void test_byte_level_heap_and_pretokenizers(const Tokenizer *t, const V2Vocab *v)
{
    const int A = 'a';
    /* The heap encoder against the quadratic reference, on one pre-token of
     * random bytes from an alphabet rich in merges (PRE_NONE). */
    Tokenizer none;
    V2Vocab *w = malloc(sizeof *w);
    load_byte_level(&none, w, PRE_NONE, -1, "bl_none.bin");
    ENCODE_PLAIN(&none, "hello world", bl_id(w, "hello"), bl_id(w, " "), 'w', 'o', 'r', 'l', 'd');
    ENCODE_PLAIN(&none, "hello ", bl_id(w, "hello"), ' '); /* "hello" (rank 11) before "o " (17) */
    ENCODE_PLAIN(&none, "go ", 'g', bl_id(w, "o "));
    ENCODE_PLAIN(t, "go ", 'g', 'o', ' ');
    ENCODE_PLAIN(&none, ".\n", bl_id(w, ".\n"));
    const char alphabet[] = "abcxyz hello!.\n'123";
    unsigned seed = 99;
    int mismatches = 0;
    for (int round = 0; round < 500; round++) {
        char text[64];
        seed = seed * 1103515245u + 12345u;
        int len = (int)(seed >> 16) % 60;
        for (int i = 0; i < len; i++) {
            seed = seed * 1103515245u + 12345u;
            text[i] = alphabet[(seed >> 16) % (sizeof alphabet - 1)];
        }
        int got[64], want[64];
        int n_got = tokenizer_encode(&none, text, (size_t)len, 0, 0, got);
        int n_want = naive_byte_level(&none, text, len, want);
        if ((n_got != n_want || memcmp(got, want, (size_t)n_got * sizeof *got) != 0) && mismatches++ < 3)
            check_ids(__LINE__, "byte-level heap encoder vs naive reference", got, n_got, want, n_want);
    }
    CHECK(mismatches == 0, "byte-level heap encoder differs from the naive reference on %d of 500", mismatches);
    tokenizer_free(&none);

    /* The other pre-tokenizers: Llama 3 keeps "." with its newline. */
    load_byte_level(&none, w, PRE_LLAMA3, -1, "bl_llama3.bin");
    ENCODE_PLAIN(&none, ".\n", bl_id(w, ".\n"));
    ENCODE_PLAIN(&none, "4123", '4', bl_id(w, "12"), '3'); /* \p{N}{1,3}: "412", "3" */
    ENCODE_PLAIN(t, "4123", '4', bl_id(v, "123"));
    tokenizer_free(&none);
    load_byte_level(&none, w, PRE_QWEN2, -1, "bl_qwen2.bin");
    ENCODE_PLAIN(&none, "123", '1', '2', '3');
    tokenizer_free(&none);
    load_byte_level(&none, w, PRE_SMOLLM, -1, "bl_smollm.bin");
    ENCODE_PLAIN(&none, "a123 hello", A, '1', '2', '3', bl_id(w, " hello"));
    tokenizer_free(&none);

    /* A byte without a piece is dropped, and its neighbours may merge, as in
     * tokenizers (SmolLM2 lacks 21 byte pieces). */
    load_byte_level(&none, w, PRE_GPT2, 0x04, "bl_missing.bin");
    CHECK(none.byte_id[0x04] == -1, "missing byte: byte_id[4] = %d", none.byte_id[0x04]);
    ENCODE_PLAIN(&none, "!\x04!", bl_id(w, "!!"));
    check_encode(__LINE__, &none, 0, "\x04", 1, NULL, 0);
    ENCODE_PLAIN(&none, "a\x04", A);
    tokenizer_free(&none);
    free(w);
}

/* A long run of one character is one pre-token: it must not be quadratic. */
static void test_byte_level_long_runs(void)
{
    Tokenizer t;
    V2Vocab *v = malloc(sizeof *v);
    const int pres[] = {PRE_GPT2, PRE_LLAMA3};
    for (int p = 0; p < 2; p++) {
        load_byte_level(&t, v, pres[p], -1, "bl_runs.bin");
        const char fill[] = {' ', 'a'};
        const char *piece[] = {"    ", "aaaa"};
        for (int k = 0; k < 2; k++) {
            size_t n = 200000;
            char *text = malloc(n);
            int *ids = malloc(tokenizer_bound(n) * sizeof *ids);
            memset(text, fill[k], n);
            clock_t start = clock();
            int count = tokenizer_encode(&t, text, n, 0, 0, ids);
            double seconds = (double)(clock() - start) / CLOCKS_PER_SEC;
            int want = bl_id(v, piece[k]), all = count == 50000;
            for (int i = 0; all && i < count; i++)
                all = ids[i] == want;
            printf("note: %s, 200 KB of '%c': %d ids in %.3f s\n", tokenizer_type_name(&t), fill[k], count, seconds);
            CHECK(all, "200 KB of '%c': expected 50000 x id %d, got %d ids", fill[k], want, count);
            CHECK(seconds < 1.0, "200 KB of '%c' took %.3f s (limit 1 s)", fill[k], seconds);
            free(text);
            free(ids);
        }
        tokenizer_free(&t);
    }
    free(v);
}

static void test_byte_level_decode(void)
{
    Tokenizer t;
    V2Vocab *v = malloc(sizeof *v);
    load_byte_level(&t, v, PRE_GPT2, -1, "bl_decode.bin");
    DECODE(&t, "<|im_start|>hello<|im_end|>", BL_BOS, BL_IM_START, bl_id(v, "hello"), BL_IM_END);
    DECODE(&t, "<s>a<s>b", BL_BOS, BL_BOS, 'a', BL_BOS, 'b');     /* add_bos 0: BOS is text like any special */
    t.add_bos = 1;
    DECODE(&t, "ab", BL_BOS, BL_BOS, 'a', BL_BOS, 'b');           /* a BOS the tokenizer adds prints nothing */
    t.add_bos = 0;
    DECODE(&t, " hello", BL_BOS, bl_id(v, " hello"));            /* no dummy prefix to drop */
    DECODE(&t, "\xE2\x82\xAC", 'a', 0xE2, 0x82, 0xAC);            /* a character over three ids */
    DECODE(&t, "\xEF\xBF\xBD\xEF\xBF\xBD" "a", 'a', 0xE2, 0x82, 'a'); /* cut: one U+FFFD per byte */
    DECODE(&t, "\xEF\xBF\xBD\xEF\xBF\xBD<s", 'a', 0xE2, 0x82, '<', 's');
    DECODE(&t, "\xEF\xBF\xBD<|a|>", 'a', 0xC3, BL_A);             /* a special piece flushes */
    DECODE(&t, "unused", 'a', BL_UNUSED, BL_EMPTY);

    /* decode(encode(x)) == x for valid UTF-8 x, special pieces included (but
     * not BOS, which decodes to nothing). */
    static const char *const alphabet[] = {"a", "b", "c", "x", "y", "z", " ", "  ", "\n", "\t", "hello", "'s",
                                           "'S", "123", "<|a|>", "<|a|>b", "<|im_start|>", "<|im_end|>", "<", "|",
                                           ">", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xEF\xBF\xBD",
                                           "!!", ".\n"};
    check_round_trip(&t, "byte-level", alphabet, (int)(sizeof alphabet / sizeof *alphabet), 5, 400);
    tokenizer_free(&t);
    free(v);
}

/* The small sentencepiece vocabulary as a version 2 file (stored kinds):
 * the same encodings and decodings as version 1. */
static void test_sentencepiece_v2(void)
{
    V2Vocab *v = malloc(sizeof *v);
    memset(v, 0, sizeof *v);
    const int32_t field[11] = {(int32_t)TOK_MAGIC, 2, TOK_SENTENCEPIECE, PRE_NONE, 0, 0, 1, 2, -1, -1, 1};
    memcpy(v->field, field, sizeof field);
    v2_add(v, "<unk>", 5, PIECE_SPECIAL, 0);
    v2_add(v, "\n<s>\n", 5, PIECE_SPECIAL, 0);
    v2_add(v, "\n</s>\n", 6, PIECE_SPECIAL, 0);
    for (int b = 0; b < 256; b++) {
        char piece[8];
        snprintf(piece, sizeof piece, "<0x%02X>", b);
        v2_add(v, piece, 6, PIECE_BYTE, 0);
    }
    for (int i = 0; i < N_SMALL; i++)
        v2_add(v, small_pieces[i].piece, (int)strlen(small_pieces[i].piece), PIECE_NORMAL, small_pieces[i].score);
    Tokenizer t;
    char err[512];
    const char *path = write_v2("small_v2.bin", v);
    if (tokenizer_build(&t, path, SMALL_VOCAB, 1, 2, err, sizeof err) != 0) {
        CHECK(0, "loading the version 2 sentencepiece file: %s", err);
        free(v);
        return;
    }
    CHECK(strcmp(tokenizer_type_name(&t), "sentencepiece") == 0 && t.version == 2 && t.add_bos == 1,
          "version 2 sentencepiece: type \"%s\" version %d add_bos %d", tokenizer_type_name(&t), t.version, t.add_bos);
    /* Version 2 names no template or stop ids: stop at EOS (there is no EOT). */
    CHECK(t.chat_template == CHAT_UNSTATED && t.n_stop == 1 && t.stop_ids[0] == 2 && !t.system_default[0] &&
          !t.system_prefix[0], "version 2 chat fields: template %d, %d stop ids", t.chat_template, t.n_stop);
    test_encode_small(&t);
    test_decode_small(&t);
    check_round_trip(&t, "small vocabulary, version 2", sp_alphabet, N_SP_ALPHABET, 1, 200);
    tokenizer_free(&t);

    /* The stored kinds decide: "ab" unused is never produced. */
    v->kind[small_id("ab")] = PIECE_UNUSED;
    path = write_v2("small_v2_unused.bin", v);
    if (tokenizer_build(&t, path, SMALL_VOCAB, 1, 2, err, sizeof err) == 0) {
        ENCODE(&t, "ab", 1, small_id(" "), small_id("a"), small_id("b"));
        tokenizer_free(&t);
    } else {
        CHECK(0, "loading %s: %s", path, err);
    }
    free(v);
}

/* Version 3: the byte-level vocabulary with a chat template, two stop ids and
 * both system texts after the merges; then each way those can be bad. */
static void test_v3_chat_fields(void)
{
    V2Vocab *v = malloc(sizeof *v);
    build_byte_level(v, PRE_GPT2, -1);
    const int n = v->n;
    size_t merges_end = v2_image(v, image);
    free(v);
    store_i32(image + 4, 3);
    store_i32(image + 44, CHAT_CHATML);
    store_i32(image + 48, 2);
    store_i32(image + 52, 5);
    store_i32(image + 56, 3);
    store_i32(image + merges_end, BL_IM_END);
    store_i32(image + merges_end + 4, BL_EOT);
    memcpy(image + merges_end + 8, "HelloPre", 8);
    const size_t size = merges_end + 16;
    Tokenizer t;
    char err[512];
    const char *path = write_tmp("v3.bin", image, size);
    if (tokenizer_build(&t, path, n, BL_BOS, BL_EOT, err, sizeof err) != 0) {
        CHECK(0, "loading the version 3 file: %s", err);
        return;
    }
    CHECK(t.version == 3 && t.chat_template == CHAT_CHATML && t.n_stop == 2 && t.stop_ids[0] == BL_IM_END &&
          t.stop_ids[1] == BL_EOT && !strcmp(t.system_default, "Hello") && !strcmp(t.system_prefix, "Pre"),
          "version 3: version %d template %d, %d stop ids, system texts \"%s\" \"%s\"", t.version,
          t.chat_template, t.n_stop, t.system_default, t.system_prefix);
    tokenizer_free(&t);

    /* Header fields: patch one i32 at a time. */
    static const struct {
        int offset;
        int32_t value;
        const char *expect;
    } cases[] = {
        {44, 5, "chat_template 5, expected 0..4"},
        {44, -1, "chat_template -1, expected 0..4"},
        {48, 257, "n_stop 257, expected 0..256"},
        {48, -1, "n_stop -1, expected 0..256"},
        {52, 65537, "system text lengths 65537 and 3, expected 0..65536 each"},
        {56, -1, "system text lengths 5 and -1"},
        {60, 1, "reserved header byte 60 is 0x01"},
        {48, 3, "truncated: 16 of the 20 bytes of stop ids and system texts after the merges"},
        {48, 1, "4 trailing bytes after the system texts"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char name[32];
        snprintf(name, sizeof name, "v3_header%zu.bin", k);
        unsigned char saved[4];
        memcpy(saved, image + cases[k].offset, 4);
        store_i32(image + cases[k].offset, cases[k].value);
        check_load_error(__LINE__, write_tmp(name, image, size), n, BL_BOS, BL_EOT, cases[k].expect);
        memcpy(image + cases[k].offset, saved, 4);
    }
    /* What follows the merges. */
    char expect[160];
    store_i32(image + merges_end + 4, n);
    snprintf(expect, sizeof expect, "stop id 1 is %d, outside 0..%d", n, n - 1);
    check_load_error(__LINE__, write_tmp("v3_stop_range.bin", image, size), n, BL_BOS, BL_EOT, expect);
    store_i32(image + merges_end + 4, BL_IM_END);
    snprintf(expect, sizeof expect, "stop id 1 repeats stop id 0 (%d)", BL_IM_END);
    check_load_error(__LINE__, write_tmp("v3_stop_twice.bin", image, size), n, BL_BOS, BL_EOT, expect);
    store_i32(image + merges_end + 4, BL_EOT);
    image[merges_end + 10] = '\0';
    check_load_error(__LINE__, write_tmp("v3_nul.bin", image, size), n, BL_BOS, BL_EOT,
                     "a system text holds a NUL byte");
    image[merges_end + 10] = 'l';
    check_load_error(__LINE__, write_tmp("v3_cut.bin", image, size - 1), n, BL_BOS, BL_EOT,
                     "truncated: 15 of the 16 bytes of stop ids");
}

/* Each way a version 2 file can be bad: one clear message naming the file. */
static void test_v2_load_errors(void)
{
    V2Vocab *v = malloc(sizeof *v);
    build_byte_level(v, PRE_GPT2, -1);
    const int n = v->n;
    size_t size = v2_image(v, image);
    char expect[160];

    /* Header fields: patch one i32 of the intact image at a time. */
    static const struct {
        int field;
        int32_t value;
        const char *expect;
    } header_cases[] = {
        {F_VERSION, 4, "version 4, expected 2 or 3"},
        {F_VERSION, 1, "version 1, expected 2 or 3"},
        {F_TYPE, 2, "type 2, expected 0 (sentencepiece) or 1"},
        {F_TYPE, -1, "type -1, expected"},
        {F_PRE, 5, "pre 5, expected 0..4"},
        {F_PRE, -2, "pre -2"},
        {F_MERGES, -1, "n_merges -1"},
        {F_BOS, 999, "bos_id 999 is outside -1.."},
        {F_EOS, -7, "eos_id -7 is outside -1.."},
        {F_EOT, 100000, "eot_id 100000 is outside"},
        {F_PAD, -2, "pad_id -2 is outside"},
        {F_BOS, 5, "bos_id 5 disagrees with the checkpoint's 259"},
        {F_EOS, 7, "eos_id 7 disagrees with the checkpoint's 256"},
        {F_ADD_BOS, 2, "add_bos 2, expected 0 or 1"},
    };
    for (size_t k = 0; k < sizeof header_cases / sizeof header_cases[0]; k++) {
        char name[32];
        snprintf(name, sizeof name, "v2_header%zu.bin", k);
        int32_t saved;
        memcpy(&saved, image + 4 * header_cases[k].field, 4);
        memcpy(image + 4 * header_cases[k].field, &header_cases[k].value, 4);
        check_load_error(__LINE__, write_tmp(name, image, size), n, BL_BOS, BL_EOT, header_cases[k].expect);
        memcpy(image + 4 * header_cases[k].field, &saved, 4);
    }
    image[50] = 1;
    check_load_error(__LINE__, write_tmp("v2_reserved.bin", image, size), n, BL_BOS, BL_EOT,
                     "reserved header byte 50 is 0x01");
    image[50] = 0;
    snprintf(expect, sizeof expect, "holds %d tokens but the model has vocab_size %d", n, n + 1);
    check_load_error(__LINE__, write_tmp("v2_vocab.bin", image, size), n + 1, BL_BOS, BL_EOT, expect);
    check_load_error(__LINE__, write_tmp("v2_cut_header.bin", image, 40), n, BL_BOS, BL_EOT,
                     "only 40 of the 64 header bytes");
    check_load_error(__LINE__, write_tmp("v2_cut_piece.bin", image, 64 + 13 * 5 + 6), n, BL_BOS, BL_EOT,
                     "truncated in token 5 of");
    check_load_error(__LINE__, write_tmp("v2_cut_merge.bin", image, size - 5), n, BL_BOS, BL_EOT,
                     "truncated in merge 22 of 23 (3 of its 8 bytes present)");
    memcpy(image + size, "\1\2\3", 3);
    check_load_error(__LINE__, write_tmp("v2_trailing.bin", image, size + 3), n, BL_BOS, BL_EOT,
                     "3 trailing bytes after the last merge");
    int32_t one = 1;
    memcpy(image + 4 * F_MERGES, &one, 4); /* merges 1..22 become trailing bytes */
    check_load_error(__LINE__, write_tmp("v2_few_merges.bin", image, size), n, BL_BOS, BL_EOT,
                     "176 trailing bytes after the last merge");

    /* Pieces and merges: change the vocabulary, then write it. */
    static const char *const piece_cases[] = {
        "token 284 has negative length -3", "token 284 is 70000 bytes long, more than the limit of 65536",
        "token 284 has kind 4, expected 0..3", "token 284 is a byte piece (kind 2)",
        "token 284 is a normal piece of length 0", "token 284 has a NaN score",
        "tokens 97 and 284 are the same normal piece \"a\"", "merge 1 names tokens 97 and 5000, outside",
        "merge 1 names tokens -1 and 98", "merge 1 joins tokens 97 and 99 into \"ac\", which is not a normal piece",
        "merge 1 joins tokens 97 and 258 into \"a<|im_end|>\", which is not a normal piece",
        "merge 2 repeats merge 1 (tokens 97 and 98)",
    };
    for (int k = 0; k < (int)(sizeof piece_cases / sizeof piece_cases[0]); k++) {
        build_byte_level(v, PRE_GPT2, -1);
        int at = 284; /* the record of "xy", a merged piece */
        size_t pos = TOK_HEADER_BYTES;
        for (int i = 0; i < at; i++)
            pos += 12 + (size_t)v->len[i];
        size = v2_image(v, image);
        int32_t value;
        switch (k) {
        case 0: value = -3; memcpy(image + pos + 8, &value, 4); break;
        case 1: value = 70000; memcpy(image + pos + 8, &value, 4); break;
        case 2: value = 4; memcpy(image + pos + 4, &value, 4); break;
        case 3: value = PIECE_BYTE; memcpy(image + pos + 4, &value, 4); break;
        case 4: v->len[at] = 0; break;
        case 5: v->score[at] = NAN; break;
        case 6: v->text[at][0] = 'a'; v->len[at] = 1; break;
        case 7: v->merge[1][1] = 5000; break;
        case 8: v->merge[1][0] = -1; break;
        case 9: v->merge[1][1] = 'c'; break;
        case 10: v->merge[1][1] = BL_IM_END; break;
        case 11: v->merge[2][0] = 'a'; v->merge[2][1] = 'b'; break;
        }
        if (k >= 4)
            size = v2_image(v, image);
        char name[32];
        snprintf(name, sizeof name, "v2_piece%d.bin", k);
        check_load_error(__LINE__, write_tmp(name, image, size), n, BL_BOS, BL_EOT, piece_cases[k]);
    }

    /* A sentencepiece (type 0) file: pre and merges must be 0, byte pieces
     * must read <0xHH>. */
    build_byte_level(v, PRE_NONE, -1);
    v->field[F_TYPE] = TOK_SENTENCEPIECE;
    check_load_error(__LINE__, write_v2("v2_spm_merges.bin", v), n, BL_BOS, BL_EOT,
                     "n_merges 23, expected 0 for a sentencepiece vocabulary");
    v->n_merges = 0;
    v->field[F_PRE] = PRE_GPT2;
    check_load_error(__LINE__, write_v2("v2_spm_pre.bin", v), n, BL_BOS, BL_EOT,
                     "pre 1, expected 0 (none) for a sentencepiece vocabulary");
    v->field[F_PRE] = PRE_NONE;
    v->kind[BL_UNUSED] = PIECE_BYTE;
    check_load_error(__LINE__, write_v2("v2_spm_byte.bin", v), n, BL_BOS, BL_EOT,
                     "token 263 is a byte piece but reads \"unused\", not <0xHH>");
    free(v);
}

/* ------------------------------------------------------------------------
 * The shared models, when present
 * ------------------------------------------------------------------------ */

static void test_tok512(const char *models)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tok512.bin", models);
    Tokenizer t;
    char err[512];
    if (tokenizer_build(&t, path, 512, 1, 2, err, sizeof err) != 0) {
        CHECK(0, "loading %s: %s", path, err);
        return;
    }
    /* Expected ids from an independent quadratic reference in Python (the
     * same code matches sentencepiece on the Llama 2 vocabulary). */
    ENCODE(&t, "Once upon a time, there was a little girl named Lily.", 1, 403, 407, 261, 378,
           432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426);
    ENCODE(&t, "Hello world", 1, 346, 306, 414, 263, 304, 341);
    ENCODE(&t, "The cat sat on the mat. She was happy!", 1, 291, 280, 294, 262, 294, 353, 265,
           284, 294, 426, 338, 286, 393, 443);
    ENCODE(&t, "caf\xC3\xA9 \xF0\x9F\x98\x80", 1, 280, 412, 431, 485, 410, 243, 162, 155, 131);
    ENCODE(&t, "<s></s><unk><0x41>", 1, 410, 504, 419, 505, 504, 492, 419, 505, 504, 379, 433,
           505, 504, 477, 444, 484, 475, 505);
    ENCODE(&t, "  two  spaces", 1, 410, 410, 259, 424, 414, 410, 262, 427, 412, 331, 419);
    check_round_trip(&t, "tok512", sp_alphabet, N_SP_ALPHABET, 99, 300);
    tokenizer_free(&t);
    check_load_error(__LINE__, path, 32000, 1, 2, "holds 512 tokens but the model has vocab_size 32000");
}

/* Encode about 1 MB of text with the Llama 2 vocabulary; generous bound. */
static void test_speed(const char *models)
{
    char path[512];
    snprintf(path, sizeof path, "%s/llama2-tokenizer.bin", models);
    Tokenizer t;
    char err[512];
    if (tokenizer_build(&t, path, 32000, 1, 2, err, sizeof err) != 0) {
        printf("note: skipping the speed check (%s)\n", err);
        return;
    }
    check_load_error(__LINE__, path, 512, 1, 2, "holds 32000 tokens but the model has vocab_size 512");
    const char *words[] = {"Once", "upon", "a", "time,", "there", "was", "\xC3\xA9t\xC3\xA9",
                           "\xE6\x97\xA5\xE6\x9C\xAC", "\xF0\x9F\x98\x80", "42", "\n", "  "};
    size_t n = 1 << 20, len = 0;
    char *text = malloc(n);
    int *ids = malloc(tokenizer_bound(n) * sizeof *ids);
    unsigned seed = 7;
    while (len < n - 16) {
        seed = seed * 1103515245u + 12345u;
        const char *w = words[(seed >> 16) % (sizeof words / sizeof *words)];
        memcpy(text + len, w, strlen(w));
        len += strlen(w);
        text[len++] = ' ';
    }
    clock_t start = clock();
    int count = tokenizer_encode(&t, text, len, 1, 0, ids);
    double seconds = (double)(clock() - start) / CLOCKS_PER_SEC;
    printf("note: encoded %zu bytes into %d ids in %.3f s\n", len, count, seconds);
    CHECK(count > 0 && seconds < 20.0, "encoding 1 MB: %d ids in %.3f s (limit 20 s)", count, seconds);
    check_round_trip(&t, "llama2", sp_alphabet, N_SP_ALPHABET, 4242, 300);
    free(text);
    free(ids);
    tokenizer_free(&t);
}

int main(int argc, char **argv)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof tmp_dir, "%s/tokenizer_test_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(tmp_dir) == NULL) {
        printf("cannot create a temporary directory %s\n", tmp_dir);
        return 2;
    }

    char path[512];
    write_small_vocab(tmp_path(path, sizeof path, "small.bin"));
    Tokenizer t;
    char err[512];
    if (tokenizer_build(&t, path, SMALL_VOCAB, 1, 2, err, sizeof err) != 0) {
        printf("FAIL: cannot load the test vocabulary: %s\n", err);
        return 1;
    }
    test_encode_small(&t);
    test_decode_small(&t);
    check_round_trip(&t, "small vocabulary", sp_alphabet, N_SP_ALPHABET, 1, 500);
    check_encode_long(&t, "small vocabulary", 1);
    tokenizer_free(&t);
    if (tokenizer_build(&t, "models/tokenizer.bin", 4096, 1, 2, err, sizeof err) == 0) { // the bundled one
        check_encode_long(&t, "bundled sentencepiece vocabulary", 1);
        tokenizer_free(&t);
    }
    test_load_errors();
    test_sentencepiece_v2();
    test_pre_tokenizer_splits();
    test_byte_level_encode_long();
    test_byte_level_encode();
    test_byte_level_long_runs();
    test_byte_level_decode();
    test_v2_load_errors();
    test_v3_chat_fields();

    char models[256];
    const char *shared = getenv("SHARED_DIR");
    if (argc > 1)
        snprintf(models, sizeof models, "%s", argv[1]);
    else
        snprintf(models, sizeof models, "%s/models", shared && *shared ? shared : "../shared");
    snprintf(path, sizeof path, "%s/tok512.bin", models);
    FILE *probe = fopen(path, "rb");
    if (probe != NULL) {
        fclose(probe);
        test_tok512(models);
        test_speed(models);
    } else {
        printf("note: %s not found; skipping the shared-model checks\n", path);
    }

    /* Clean up the temporary files (names as created above). */
    const char *names[] = {"small.bin", "empty.bin", "short.bin", "cut_head.bin", "cut_piece.bin",
                           "cut_clean.bin", "neg.bin", "long.bin", "nan.bin", "swap.bin", "extra.bin",
                           "trail.bin", "good.bin", "max0.bin", "max1.bin", "max2.bin"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        remove(tmp_path(path, sizeof path, names[i]));
    for (int i = 0; i < n_v2_paths; i++)
        remove(v2_paths[i]);
    remove(tmp_dir);

    printf("tokenizer: %d passed, %d failed\n", n_passed, n_failed);
    return n_failed == 0 ? 0 : 1;
}
