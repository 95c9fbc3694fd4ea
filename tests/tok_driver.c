/* tok_driver: a small command-line front end to tokenizer.c for batch tests
 * (tests/test_tokenizer_sp.py compares it with sentencepiece,
 * tests/test_tokenizer_bpe.py with Hugging Face's tokenizers). TOKENIZER is
 * a version 1 tokenizer.bin or a version 2 "LTOK" file.
 *
 *   tok_driver [-t] TOKENIZER VOCAB_SIZE [BOS_ID EOS_ID]
 *       stdin:  records, each a u32 little-endian byte length then the bytes
 *       stdout: one line per record: the ids, space-separated, BOS first
 *               when the tokenizer's add_bos says so (always for version 1)
 *       -t:     also print "encode_seconds S" (CPU time in tokenizer_encode)
 *               to stderr at the end
 *   tok_driver -s TOKENIZER VOCAB_SIZE [BOS_ID EOS_ID]
 *       stdin:  records as above
 *       stdout: one line per record: the byte lengths of the pre-tokens of
 *               the record (invalid UTF-8 replaced by U+FFFD first; special
 *               pieces not matched), space-separated; type 1 only
 *   tok_driver -i TOKENIZER VOCAB_SIZE [BOS_ID EOS_ID]
 *       stdout: "name value" lines: type (tokenizer_type_name), version,
 *               bos_id, eos_id, eot_id, pad_id, add_bos, n_merges, n_special,
 *               max_token_length
 *   tok_driver -d TOKENIZER VOCAB_SIZE [BOS_ID EOS_ID]
 *       stdin:  lines of space-separated ids
 *       stdout: one record per line (u32 little-endian length, then bytes):
 *               the ids after the first decoded token by token with
 *               tokenizer_decode, each call given the previous id, then
 *               tokenizer_decode_flush. The first id is context only, the
 *               way run.c starts from BOS without printing it.
 *
 * BOS_ID and EOS_ID (the checkpoint's; -1 = none) default to 1 and 2 (Llama 2
 * and llama2.c's models).
 * Exit status 1 with a message on stderr for a load failure or bad input.
 *
 * Build from the repository root: cc -O2 -I. tests/tok_driver.c -o tok_driver -lm
 */
#include "../tokenizer.c"

#include <time.h>

static int usage(void)
{
    fprintf(stderr, "usage: tok_driver [-t | -d | -s | -i] TOKENIZER VOCAB_SIZE [BOS_ID EOS_ID]\n");
    return 1;
}

/* Read exactly n bytes from f into buf. Returns 0, or -1 at EOF or error. */
static int read_exact(FILE *f, void *buf, size_t n)
{
    return fread(buf, 1, n, f) == n ? 0 : -1;
}

/* Read one input record (u32 little-endian length, then the bytes) into a
 * new buffer *text (caller frees) of *len bytes. Returns 1 for a record, 0
 * at the end of the input, -1 (with a message) for a cut record or no
 * memory. */
static int read_record(char **text, size_t *len)
{
    unsigned char header[4];
    *text = NULL;
    if (read_exact(stdin, header, 4) != 0)
        return 0;
    *len = (size_t)header[0] | (size_t)header[1] << 8 | (size_t)header[2] << 16 | (size_t)header[3] << 24;
    *text = malloc(*len ? *len : 1);
    if (*text == NULL || read_exact(stdin, *text, *len) != 0) {
        fprintf(stderr, "tok_driver: truncated input record or out of memory\n");
        free(*text);
        *text = NULL;
        return -1;
    }
    return 1;
}

static int encode_records(const Tokenizer *t, int timing)
{
    double seconds = 0;
    char *text;
    size_t len;
    int got;
    while ((got = read_record(&text, &len)) == 1) {
        int *ids = malloc(tokenizer_bound(len) * sizeof *ids);
        clock_t start = clock();
        int n = ids ? tokenizer_encode(t, text, len, t->add_bos, 0, ids) : -1;
        seconds += (double)(clock() - start) / CLOCKS_PER_SEC;
        free(text);
        if (n < 0) {
            fprintf(stderr, "tok_driver: tokenizer_encode failed\n");
            free(ids);
            return 1;
        }
        for (int i = 0; i < n; i++)
            printf(i ? " %d" : "%d", ids[i]);
        putchar('\n');
        free(ids);
    }
    if (timing)
        fprintf(stderr, "encode_seconds %.6f\n", seconds);
    return got == 0 && fflush(stdout) == 0 ? 0 : 1;
}

/* -s: print the pre-token lengths of each input record. */
static int split_records(const Tokenizer *t)
{
    char *text;
    size_t len;
    int got;
    while ((got = read_record(&text, &len)) == 1) {
        char *clean = malloc(3 * len + 1);
        if (clean == NULL) {
            fprintf(stderr, "tok_driver: out of memory\n");
            free(text);
            return 1;
        }
        size_t n = utf8_sanitize((const unsigned char *)text, len, clean);
        PreTokens p = pre_tokens(t->pre, (const unsigned char *)clean, n);
        for (size_t start = 0, end; (end = pre_token_next(&p)) > 0; start = end)
            printf(start ? " %zu" : "%zu", end - start);
        putchar('\n');
        free(text);
        free(clean);
    }
    return got == 0 && fflush(stdout) == 0 ? 0 : 1;
}

/* -i: print what tokenizer_build read. */
static int print_info(const Tokenizer *t)
{
    printf("type %s\nversion %d\nbos_id %d\neos_id %d\neot_id %d\npad_id %d\nadd_bos %d\n",
           tokenizer_type_name(t), t->version, t->bos_id, t->eos_id, t->eot_id, t->pad_id, t->add_bos);
    printf("n_merges %d\nn_special %d\nmax_token_length %d\n", t->n_merges, t->n_special,
           t->max_token_length);
    return fflush(stdout) == 0 ? 0 : 1;
}

/* Write one output record: u32 little-endian length, then the bytes. */
static void write_record(const char *bytes, size_t len)
{
    unsigned char header[4] = {(unsigned char)len, (unsigned char)(len >> 8),
                               (unsigned char)(len >> 16), (unsigned char)(len >> 24)};
    fwrite(header, 1, 4, stdout);
    fwrite(bytes, 1, len, stdout);
}

/* A growable byte buffer for one decoded line. */
typedef struct {
    char *bytes;
    size_t len, cap;
} Text;

/* Append n bytes to tx. Returns 0, or -1 out of memory. */
static int text_append(Text *tx, const char *bytes, size_t n)
{
    if (n == 0)
        return 0;
    if (tx->len + n > tx->cap) {
        size_t cap = tx->cap ? tx->cap : 1024;
        while (cap < tx->len + n)
            cap *= 2;
        char *bigger = realloc(tx->bytes, cap);
        if (bigger == NULL)
            return -1;
        tx->bytes = bigger;
        tx->cap = cap;
    }
    memcpy(tx->bytes + tx->len, bytes, n);
    tx->len += n;
    return 0;
}

static int decode_lines(const Tokenizer *t)
{
    char *piece = malloc(tokenizer_decode_bound(t));
    Text line = {NULL, 0, 0};
    DecodeState st = {{0}, 0};
    int prev = -1, first = 1, c, rc = 0;
    long id = -1; /* the number being read, -1 when between numbers */
    if (piece == NULL)
        rc = 1;
    while (rc == 0 && (c = getchar()) != EOF) {
        if (c >= '0' && c <= '9') {
            id = (id < 0 ? 0 : id * 10) + (c - '0');
            if (id > INT_MAX)
                id = INT_MAX;
            continue;
        }
        if (id >= 0) { /* a number just ended: decode it (unless it is the first) */
            if (!first) {
                size_t n = tokenizer_decode(t, &st, prev, (int)id, piece);
                if (text_append(&line, piece, n) != 0)
                    rc = 1;
            }
            prev = (int)id;
            first = 0;
            id = -1;
        }
        if (c == '\n') {
            size_t n = tokenizer_decode_flush(&st, piece);
            if (text_append(&line, piece, n) != 0)
                rc = 1;
            write_record(line.len ? line.bytes : "", line.len);
            line.len = 0;
            prev = -1;
            first = 1;
        } else if (c != ' ' && c != '\r') {
            fprintf(stderr, "tok_driver: unexpected character %d in id input\n", c);
            free(piece);
            free(line.bytes);
            return 1;
        }
    }
    if (rc != 0)
        fprintf(stderr, "tok_driver: out of memory\n");
    free(piece);
    free(line.bytes);
    if (fflush(stdout) != 0)
        rc = 1;
    return rc;
}

int main(int argc, char **argv)
{
    char mode = 'e'; /* e encode, t encode with timing, d decode, s split, i info */
    int arg = 1;
    if (arg < argc && argv[arg][0] == '-' && argv[arg][1] && strchr("tdsi", argv[arg][1]) && !argv[arg][2])
        mode = argv[arg++][1];
    if (argc - arg != 2 && argc - arg != 4)
        return usage();
    const char *path = argv[arg];
    int vocab_size = atoi(argv[arg + 1]);
    int bos_id = argc - arg == 4 ? atoi(argv[arg + 2]) : 1;
    int eos_id = argc - arg == 4 ? atoi(argv[arg + 3]) : 2;

    Tokenizer t;
    char err[512];
    if (tokenizer_build(&t, path, vocab_size, bos_id, eos_id, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int rc;
    if (mode == 'd')
        rc = decode_lines(&t);
    else if (mode == 's')
        rc = t.type == TOK_BYTE_BPE ? split_records(&t) : usage();
    else if (mode == 'i')
        rc = print_info(&t);
    else
        rc = encode_records(&t, mode == 't');
    tokenizer_free(&t);
    return rc;
}
