/* test_tokenizer.c: unit tests for tokenizer.c.
 *
 * Builds small vocabularies in a temporary directory and checks encoding
 * (merge order, ties, byte fallback, text that looks like special pieces,
 * against a naive reference), streaming decode (split characters, U+FFFD,
 * the space after BOS), round trips, and every way tokenizer_build rejects a
 * file. When the shared models are present it also checks known encodings for
 * tok512.bin and times a 1 MB encode with the Llama 2 vocabulary.
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

/* Encode a NUL-terminated string with BOS and compare with want (BOS
 * included). */
static void check_encode(int line, const Tokenizer *t, const char *text, size_t n, const int *want,
                         int n_want)
{
    int *ids = malloc(tokenizer_bound(n) * sizeof *ids);
    int got = tokenizer_encode(t, text, n, 1, 0, ids);
    char what[300], esc[200];
    snprintf(what, sizeof what, "encode \"%s\"", format_bytes(esc, sizeof esc, text, n));
    check_ids(line, what, ids, got, want, n_want);
    free(ids);
}
#define ENCODE(t, text, ...)                                                              \
    do {                                                                                  \
        const int want_[] = {__VA_ARGS__};                                                \
        check_encode(__LINE__, t, text, sizeof(text) - 1, want_, (int)(sizeof want_ / sizeof *want_)); \
    } while (0)

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

/* decode(encode(x)) == x for valid UTF-8 x, streamed token by token. */
static void check_round_trip(const Tokenizer *t, const char *label, unsigned seed, int rounds)
{
    static const char *alphabet[] = {"a", "b", "c", "x", "y", "z", " ", "  ", "\n", "\t", "<", ">",
                                     "<s>", "<unk>", "<0x41>", "0", "\xC3\xA9", "\xE2\x82\xAC",
                                     "\xF0\x9F\x98\x80", "\xE6\x97\xA5", "\xF4\x8F\xBF\xBF",
                                     "\xEF\xBF\xBD", "h", "i", "the", " the", "Once upon"};
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
            const char *s = alphabet[(seed >> 16) % (sizeof alphabet / sizeof *alphabet)];
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
    check_round_trip(&t, "tok512", 99, 300);
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
    check_round_trip(&t, "llama2", 4242, 300);
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
    check_round_trip(&t, "small vocabulary", 1, 500);
    tokenizer_free(&t);
    test_load_errors();

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
    remove(tmp_dir);

    printf("tokenizer: %d passed, %d failed\n", n_passed, n_failed);
    return n_failed == 0 ? 0 : 1;
}
