/* gguf_tokenizer.c: the tokenizer a GGUF file carries in its metadata,
 * read as export.py reads it.
 *
 * `python3 export.py tok.bin --tokenizer model.gguf` converts a GGUF's
 * vocabulary into run's version 3 tokenizer file ("LTOK", tokenizer.h), with
 * convert/gguf_tokenizer.py, convert/ltok.py and convert/chat_templates.py.
 * This file computes in C the bytes that command writes, from the file as
 * gguf.c parsed it, and tokenizer.c loads them with the same loader that
 * reads export.py's file (tokenizer_build_bytes). So `./run model.gguf` holds
 * the tokenizer `./run model.gguf -z tok.bin` holds whenever the bytes are
 * equal, and tests/test_gguf_tokenizer.py checks that they are, byte for byte
 * (tests/gguf_tok_driver.c prints them), and that the token ids are.
 *
 * What the keys become (docs/convert.md has the same table for export.py):
 *   tokenizer.ggml.model       "llama": sentencepiece; "gpt2": byte-level BPE; anything else is refused
 *   tokenizer.ggml.tokens      the pieces, in id order. llama: "▁" (U+2581) becomes a space, byte tokens
 *                              stay "<0xHH>". gpt2: normal and unused tokens are written in GPT-2's byte
 *                              alphabet and become raw bytes; control, user-defined and unknown tokens keep
 *                              their text
 *   tokenizer.ggml.token_type  1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte ->
 *                              normal, special, special, special, unused, byte (absent: all normal)
 *   tokenizer.ggml.scores      llama: the merge scores, required; gpt2: not read (byte-level pieces score 0)
 *   tokenizer.ggml.merges      gpt2: "left right", the texts of two normal tokens -> their ids, rank 0 first
 *   tokenizer.ggml.pre         gpt2: gpt-2 -> gpt2, llama-bpe and llama3 -> llama3, qwen2, smollm; absent,
 *                              "default" (llama.cpp's fallback rules) or another name: refused
 *   tokenizer.ggml.add_space_prefix  llama: false is refused; gpt2: true is refused
 *   tokenizer.ggml.{bos,eos,eot,padding}_token_id  the ids (negative or 0xFFFFFFFF: none). No EOT: the last special
 *                              piece reading <|eot_id|>, else <|im_end|>, <|end|>, <end_of_turn>
 *   tokenizer.ggml.add_bos_token  default: true for llama when there is a BOS, false for gpt2
 *   tokenizer.ggml.eom_token_id   one more stop id
 *   tokenizer.chat_template    one of the templates run renders, recognized by markers (section 3)
 * The stop ids are EOS, EOT, EOM, the template's end-of-turn piece, and every
 * special piece whose text ends a generation in llama.cpp (<|endoftext|>, ...).
 *
 * Sections: 1. typed arrays of the metadata  2. the pieces  3. the chat
 * template  4. ids, stop ids, the file's bytes  5. a GGUF file as a tokenizer.
 * Every count, length and id from the file is checked before it is used.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf_tokenizer.h"
#include "model.h"

/* tokenizer.ggml.token_type's values. */
enum { TT_NORMAL = 1, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE };
/* Limits of the version 3 file, as export.py and tokenizer.c hold them: a
 * piece's bytes, and merges (so that tokenizer.c's hash table stays an int). */
#define MAX_PIECE_BYTES 65536
#define MAX_MERGES (1 << 28)
/* The largest score export.py takes (ltok.py: abs(s) > 3.4e38 is refused). */
#define MAX_SCORE 3.4e38

/* Everything the conversion reads and makes; vocab_free releases it. */
typedef struct {
    const GgufFile *g;
    char *err;
    size_t err_len;
    int type;               // TOK_SENTENCEPIECE ("llama") or TOK_BYTE_BPE ("gpt2")
    int pre;                // PRE_NONE, or the byte-level pre-tokenizer
    int n;                  // tokens
    GgufStr *text;          // (n) each token's text as the file stores it (points into the file)
    unsigned char *ttype;   // (n) its token type, TT_NORMAL .. TT_BYTE
    unsigned char *bytes;   // the pieces' bytes, one after another (a piece is never longer than its text)
    size_t *at;             // (n) where each piece starts in bytes
    int *len;               // (n) its length
    int *kind;              // (n) PIECE_NORMAL .. PIECE_UNUSED
    float *score;           // (n) sentencepiece's scores; NULL for byte-level BPE (all zero)
    int32_t *merges;        // (2 * n_merges) left and right ids, rank 0 first
    int n_merges;
    int bos, eos, eot, pad, eom; // ids, -1 = none
    int add_bos;
    int chat;               // CHAT_UNSTATED .. CHAT_LLAMA3
    char *system_default;   // the template's default system prompt, system_default_len bytes (owned)
    char *system_prefix;    // its text before every system prompt, system_prefix_len bytes (owned)
    size_t system_default_len, system_prefix_len;
    int *stop;              // (n_stop) stop ids, sorted, each once
    int n_stop;
} Vocab;

static void vocab_free(Vocab *v) {
    free(v->text);
    free(v->ttype);
    free(v->bytes);
    free(v->at);
    free(v->len);
    free(v->kind);
    free(v->score);
    free(v->merges);
    free(v->system_default);
    free(v->system_prefix);
    free(v->stop);
}

/* A string from the file for a message: printable, cut to the buffer. */
static const char *show(GgufStr s, char *buf, size_t size) { return gguf_show(s, buf, size); }

/* ==========================================================================
 * 1. Typed arrays of the metadata
 *
 * gguf_parse has checked that every array lies inside the file; the walks
 * below check each length against the file's end once more before using it,
 * so that this file relies on nothing it did not see.
 * ========================================================================== */

static uint64_t le_u64(const unsigned char *p) {
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--) x = x << 8 | p[i];
    return x;
}

/* Bytes of one element of a numeric value type; 0 for the others (bool,
 * string, array). */
static size_t number_bytes(uint32_t type) {
    switch (type) {
    case GGUF_U8: case GGUF_I8: return 1;
    case GGUF_U16: case GGUF_I16: return 2;
    case GGUF_U32: case GGUF_I32: case GGUF_F32: return 4;
    case GGUF_U64: case GGUF_I64: case GGUF_F64: return 8;
    }
    return 0;
}

/* "key is TYPE[ of ELEM], expected WANT" */
static int wrong_type(const Vocab *v, const GgufKV *kv, const char *key, const char *want) {
    char elem[48] = "";
    if (kv->type == GGUF_ARRAY) snprintf(elem, sizeof elem, " of %s", gguf_value_type_name(kv->elem_type));
    return fail(v->err, v->err_len, "%s: %s is %s%s, expected %s", v->g->path, key, gguf_value_type_name(kv->type),
                elem, want);
}

/* kv (named key) as an array of numbers: integers only (ints) or integers
 * and floats. An empty array passes whatever its element type (export.py
 * reads it as an empty list). Returns 0, or -1 with a message. */
static int numeric_array(const Vocab *v, const GgufKV *kv, const char *key, int ints) {
    uint32_t e = kv->elem_type;
    int ok = kv->type == GGUF_ARRAY &&
             (kv->count == 0 || (number_bytes(e) && (!ints || (e != GGUF_F32 && e != GGUF_F64))));
    if (!ok) return wrong_type(v, kv, key, ints ? "an array of integers" : "an array of numbers");
    size_t left = (size_t)(v->g->bytes + v->g->size - kv->value);
    if (kv->count && kv->count > left / number_bytes(e))
        return fail(v->err, v->err_len, "%s: %s: %" PRIu64 " entries run past the end of the file", v->g->path, key,
                    kv->count);
    return 0;
}

/* Element i of a numeric array (numeric_array passed): as an integer (a u64
 * above INT64_MAX reads as INT64_MAX; floats are not asked for as one) and as
 * a double, as numpy's astype(float64) gives it. */
static int64_t integer_at(const GgufKV *kv, uint64_t i) {
    const unsigned char *p = kv->value + i * number_bytes(kv->elem_type);
    uint64_t u = 0;
    for (size_t k = number_bytes(kv->elem_type); k-- > 0;) u = u << 8 | p[k];
    switch (kv->elem_type) {
    case GGUF_I8: return (int8_t)u;
    case GGUF_I16: return (int16_t)u;
    case GGUF_I32: return (int32_t)u;
    case GGUF_I64: return (int64_t)u;
    case GGUF_U64: return u > INT64_MAX ? INT64_MAX : (int64_t)u;
    }
    return (int64_t)u;
}
static double number_at(const GgufKV *kv, uint64_t i) {
    const unsigned char *p = kv->value + i * number_bytes(kv->elem_type);
    if (kv->elem_type == GGUF_F32) return read_le_f32(p);
    if (kv->elem_type == GGUF_F64) {
        uint64_t u = le_u64(p);
        double d;
        memcpy(&d, &u, sizeof d);
        return d;
    }
    if (kv->elem_type == GGUF_U64) return (double)le_u64(p);
    return (double)integer_at(kv, i);
}

/* The array of strings under key (required): its count strings into *out
 * (malloc'd, pointing into the file) and *count. Returns 0, or -1 with a
 * message (absent, another type, a length past the end of the file). */
static int string_array(const Vocab *v, const char *key, GgufStr **out, uint64_t *count) {
    const GgufFile *g = v->g;
    const GgufKV *kv = gguf_find_key(g, key);
    *out = NULL;
    *count = 0;
    if (!kv) return fail(v->err, v->err_len, "%s: missing required key %s", g->path, key);
    if (kv->type != GGUF_ARRAY || (kv->count > 0 && kv->elem_type != GGUF_STRING))
        return wrong_type(v, kv, key, "an array of strings");
    const unsigned char *p = kv->value, *end = g->bytes + g->size;
    if (kv->count > (uint64_t)(end - p) / 8)
        return fail(v->err, v->err_len, "%s: %s: %" PRIu64 " strings run past the end of the file", g->path, key,
                    kv->count);
    *out = malloc((kv->count ? (size_t)kv->count : 1) * sizeof **out);
    if (!*out) return fail(v->err, v->err_len, "%s: out of memory for %s", g->path, key);
    for (uint64_t i = 0; i < kv->count; i++) {
        uint64_t len = (size_t)(end - p) >= 8 ? le_u64(p) : UINT64_MAX;
        if (len > (uint64_t)(end - p) - 8)
            return fail(v->err, v->err_len, "%s: %s: string %" PRIu64 " runs past the end of the file", g->path,
                        key, i);
        (*out)[i] = (GgufStr){p + 8, len};
        p += 8 + len;
    }
    *count = kv->count;
    return 0;
}

/* ==========================================================================
 * 2. The pieces: tokens and token types -> pieces, kinds, scores, merges
 * ========================================================================== */

/* tokenizer.ggml.tokens and token_type; room for the pieces. */
static int read_tokens(Vocab *v) {
    const char *path = v->g->path;
    uint64_t count;
    if (string_array(v, "tokenizer.ggml.tokens", &v->text, &count)) return -1;
    if (count == 0) return fail(v->err, v->err_len, "%s: tokenizer.ggml.tokens is empty", path);
    if (count > INT32_MAX)
        return fail(v->err, v->err_len, "%s: tokenizer.ggml.tokens has %" PRIu64 " entries (a vocabulary holds at "
                    "most %d)", path, count, INT32_MAX);
    v->n = (int)count;
    size_t n = (size_t)count, total = 1;
    for (size_t i = 0; i < n; i++) total += (size_t)v->text[i].len; // each inside the file: no overflow
    v->ttype = malloc(n);
    v->bytes = malloc(total);
    v->at = malloc(n * sizeof *v->at);
    v->len = malloc(n * sizeof *v->len);
    v->kind = malloc(n * sizeof *v->kind);
    if (!v->ttype || !v->bytes || !v->at || !v->len || !v->kind)
        return fail(v->err, v->err_len, "%s: out of memory for %d tokens", path, v->n);
    const char *key = "tokenizer.ggml.token_type";
    const GgufKV *kv = gguf_find_key(v->g, key);
    if (!kv) { // export.py: every token is taken as normal
        memset(v->ttype, TT_NORMAL, n);
        return 0;
    }
    if (numeric_array(v, kv, key, 1)) return -1;
    if (kv->count != count)
        return fail(v->err, v->err_len, "%s: %s has %" PRIu64 " entries but tokenizer.ggml.tokens has %d", path, key,
                    kv->count, v->n);
    for (size_t i = 0; i < n; i++) {
        int64_t t = integer_at(kv, i);
        if (t < TT_NORMAL || t > TT_BYTE)
            return fail(v->err, v->err_len, "%s: %s has the unknown type %" PRId64 " (token %zu; 1..6: normal, "
                        "unknown, control, user defined, unused, byte)", path, key, t, i);
        v->ttype[i] = (unsigned char)t;
    }
    return 0;
}

/* The byte GPT-2's alphabet writes as the character cp, or -1 when cp is
 * none of its 256. The printable Latin-1 bytes stand for themselves; the
 * other 68 (0x00..0x20, 0x7F..0xA0, 0xAD) are U+0100.. in byte order. */
static int gpt2_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp < 0x100 || cp >= 0x100 + 68) return -1;
    int k = (int)(cp - 0x100);
    return k < 33 ? k : k < 67 ? 0x7F + (k - 33) : 0xAD;
}

/* The code point of the well-formed UTF-8 sequence of len bytes at s (len
 * from utf8_length). */
static uint32_t code_point(const unsigned char *s, int len) {
    static const unsigned char lead_bits[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    uint32_t cp = s[0] & lead_bits[len];
    for (int k = 1; k < len; k++) cp = cp << 6 | (s[k] & 0x3F);
    return cp;
}

/* A gpt2 token's text s as raw bytes into out: strict UTF-8 (as Python's
 * decode), each character one of GPT-2's alphabet. Returns the number of
 * bytes, or -1 when s is not written that way. */
static long gpt2_to_bytes(GgufStr s, unsigned char *out) {
    size_t i = 0, n = (size_t)s.len;
    long k = 0;
    while (i < n) {
        int len = utf8_length((const char *)s.p + i, n - i);
        int b = len ? gpt2_byte(code_point(s.p + i, len)) : -1;
        if (b < 0) return -1;
        out[k++] = (unsigned char)b;
        i += (size_t)len;
    }
    return k;
}

/* Record piece i: its bytes at v->bytes + *fill (already written there). */
static int set_piece(Vocab *v, int i, size_t *fill, size_t len, int kind) {
    if (len > MAX_PIECE_BYTES)
        return fail(v->err, v->err_len, "%s: tokenizer.ggml.tokens: token %d is %zu bytes long (at most %d)",
                    v->g->path, i, len, MAX_PIECE_BYTES);
    v->at[i] = *fill;
    v->len[i] = (int)len;
    v->kind[i] = kind;
    *fill += len;
    return 0;
}

/* The pre-tokenizer of a "gpt2" vocabulary (tokenizer.ggml.pre), and no
 * space before the text. */
static int byte_level_pre(Vocab *v) {
    static const struct { const char *name; int pre; } names[] = {
        {"gpt-2", PRE_GPT2}, {"llama-bpe", PRE_LLAMA3}, {"llama3", PRE_LLAMA3}, {"qwen2", PRE_QWEN2},
        {"smollm", PRE_SMOLLM}};
    const char *supported = "gpt-2, llama-bpe, llama3, qwen2, smollm", *path = v->g->path;
    GgufStr pre;
    char shown[128];
    int got = gguf_get_str(v->g, "tokenizer.ggml.pre", &pre, v->err, v->err_len);
    if (got < 0) return -1;
    if (got == 0 || gguf_str_is(pre, "default")) // llama.cpp's fallback rules are not GPT-2's split
        return fail(v->err, v->err_len, "%s: tokenizer.ggml.pre is %s (llama.cpp's fallback pre-tokenizer), which "
                    "this program does not implement; supported: %s", path, got ? "default" : "absent", supported);
    v->pre = PRE_NONE;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (gguf_str_is(pre, names[k].name)) v->pre = names[k].pre;
    if (v->pre == PRE_NONE)
        return fail(v->err, v->err_len, "%s: tokenizer.ggml.pre is \"%s\"; supported: %s", path,
                    show(pre, shown, sizeof shown), supported);
    int space = 0;
    got = gguf_get_bool(v->g, "tokenizer.ggml.add_space_prefix", &space, v->err, v->err_len);
    if (got < 0) return -1;
    if (space)
        return fail(v->err, v->err_len, "%s: tokenizer.ggml.add_space_prefix is true: a space before the text is "
                    "not supported for byte-level BPE", path);
    return 0;
}

/* A "gpt2" vocabulary's pieces: normal and unused tokens turned back into
 * bytes (an unused one not in GPT-2's alphabet keeps its text), control,
 * user-defined and unknown tokens special with their text. */
static int byte_level_pieces(Vocab *v) {
    if (byte_level_pre(v)) return -1;
    size_t fill = 0;
    char shown[128];
    for (int i = 0; i < v->n; i++) {
        GgufStr s = v->text[i];
        int t = v->ttype[i];
        long len = -1;
        if (t == TT_BYTE)
            return fail(v->err, v->err_len, "%s: token %d \"%s\" has type byte (6), which a gpt2 vocabulary does "
                        "not use", v->g->path, i, show(s, shown, sizeof shown));
        if (t == TT_NORMAL || t == TT_UNUSED) len = gpt2_to_bytes(s, v->bytes + fill);
        if (len < 0 && t == TT_NORMAL)
            return fail(v->err, v->err_len, "%s: token %d \"%s\" is normal but not written in GPT-2's byte "
                        "alphabet: not a byte-level BPE vocabulary", v->g->path, i, show(s, shown, sizeof shown));
        if (len < 0) { // special, or an unused token outside the alphabet: its text as it is
            memcpy(v->bytes + fill, s.p, (size_t)s.len);
            len = (long)s.len;
        }
        int kind = t == TT_NORMAL ? PIECE_NORMAL : t == TT_UNUSED ? PIECE_UNUSED : PIECE_SPECIAL;
        if (set_piece(v, i, &fill, (size_t)len, kind)) return -1;
    }
    return 0;
}

/* Whether s is a byte token's text, <0xHH> (hex digits of either case). */
static int is_byte_text(GgufStr s) {
    if (s.len != 6 || memcmp(s.p, "<0x", 3) != 0 || s.p[5] != '>') return 0;
    for (int k = 3; k < 5; k++) {
        unsigned char c = s.p[k];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return 0;
    }
    return 1;
}

/* tokenizer.ggml.scores (required, one per token, each a finite float32),
 * and the keys a sentencepiece vocabulary must not contradict. */
static int sentencepiece_scores(Vocab *v) {
    const char *key = "tokenizer.ggml.scores", *path = v->g->path;
    const GgufKV *kv = gguf_find_key(v->g, key);
    if (!kv) return fail(v->err, v->err_len, "%s: missing required key %s", path, key);
    if (numeric_array(v, kv, key, 0)) return -1;
    if (kv->count != (uint64_t)v->n)
        return fail(v->err, v->err_len, "%s: %s has %" PRIu64 " entries but tokenizer.ggml.tokens has %d", path, key,
                    kv->count, v->n);
    v->score = malloc((size_t)v->n * sizeof *v->score);
    if (!v->score) return fail(v->err, v->err_len, "%s: out of memory for %d scores", path, v->n);
    for (int i = 0; i < v->n; i++) {
        double s = number_at(kv, (uint64_t)i);
        if (!isfinite(s) || fabs(s) > MAX_SCORE)
            return fail(v->err, v->err_len, "%s: %s: token %d has score %g, not a finite float32", path, key, i, s);
        v->score[i] = (float)s; // rounded to nearest, as export.py's struct.pack("<f")
    }
    GgufStr pre; // a pre-tokenizer name is ignored (a sentencepiece vocabulary has none), a wrong type is not
    if (gguf_get_str(v->g, "tokenizer.ggml.pre", &pre, v->err, v->err_len) < 0) return -1;
    int space = 1;
    if (gguf_get_bool(v->g, "tokenizer.ggml.add_space_prefix", &space, v->err, v->err_len) < 0) return -1;
    if (!space)
        return fail(v->err, v->err_len, "%s: tokenizer.ggml.add_space_prefix is false: run's sentencepiece "
                    "tokenizer always puts a space before the text", path);
    return 0;
}

/* A "llama" vocabulary's pieces: "▁" as a space, byte tokens <0xHH> as they
 * are; the kinds by token type. */
static int sentencepiece_pieces(Vocab *v) {
    if (sentencepiece_scores(v)) return -1;
    static const unsigned char lower_one_eighth[3] = {0xE2, 0x96, 0x81}; // U+2581 in UTF-8
    size_t fill = 0;
    char shown[128];
    for (int i = 0; i < v->n; i++) {
        GgufStr s = v->text[i];
        unsigned char *out = v->bytes + fill;
        size_t len = 0;
        int t = v->ttype[i];
        if (t == TT_BYTE && !is_byte_text(s))
            return fail(v->err, v->err_len, "%s: token %d \"%s\" has type byte but is not <0xHH>", v->g->path, i,
                        show(s, shown, sizeof shown));
        for (size_t k = 0; k < s.len;) { // byte tokens hold no U+2581: copied as they are
            if (s.len - k >= 3 && memcmp(s.p + k, lower_one_eighth, 3) == 0) {
                out[len++] = ' ';
                k += 3;
            } else
                out[len++] = s.p[k++];
        }
        int kind = t == TT_BYTE ? PIECE_BYTE : t == TT_NORMAL ? PIECE_NORMAL : t == TT_UNUSED ? PIECE_UNUSED
                                                                                            : PIECE_SPECIAL;
        if (set_piece(v, i, &fill, len, kind)) return -1;
    }
    return 0;
}

/* A normal token's text and id, sorted to find a merge's sides. */
typedef struct {
    GgufStr text;
    int id;
} TextId;

static int compare_text(const unsigned char *a, uint64_t alen, const unsigned char *b, uint64_t blen) {
    uint64_t n = alen < blen ? alen : blen;
    int c = n ? memcmp(a, b, (size_t)n) : 0;
    return c ? c : (alen > blen) - (alen < blen);
}
static int compare_text_id(const void *pa, const void *pb) {
    const TextId *a = pa, *b = pb;
    int c = compare_text(a->text.p, a->text.len, b->text.p, b->text.len);
    return c ? c : (a->id > b->id) - (a->id < b->id);
}

/* The lowest id of a normal token whose text is a[0..alen) then b[0..blen),
 * or -1 (binary search over the sorted normal tokens). */
static int find_normal(const TextId *sorted, int n, const unsigned char *a, size_t alen, const unsigned char *b,
                       size_t blen) {
    int lo = 0, hi = n;
    while (lo < hi) { // the first entry not below the key
        int mid = lo + (hi - lo) / 2;
        GgufStr t = sorted[mid].text;
        size_t head = t.len < alen ? (size_t)t.len : alen;
        int c = compare_text(t.p, head, a, head);
        if (c == 0 && t.len <= alen) c = t.len < alen ? -1 : blen ? -1 : 0; // a prefix of a, or a itself
        else if (c == 0) c = compare_text(t.p + alen, t.len - alen, b, blen);
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    if (lo == n) return -1;
    GgufStr t = sorted[lo].text;
    int equal = t.len == alen + blen && memcmp(t.p, a, alen) == 0 && (blen == 0 || memcmp(t.p + alen, b, blen) == 0);
    return equal ? sorted[lo].id : -1;
}

/* One merge "left right" as the ids of its two normal tokens; its result
 * must be a normal token too. */
static int parse_merge(Vocab *v, const TextId *sorted, int n_sorted, int rank, GgufStr m) {
    const unsigned char *space = m.len ? memchr(m.p, ' ', (size_t)m.len) : NULL;
    size_t at = space ? (size_t)(space - m.p) : 0, rest = space ? (size_t)m.len - at - 1 : 0;
    char shown[128], side[128];
    if (!space || at == 0 || rest == 0 || memchr(space + 1, ' ', rest))
        return fail(v->err, v->err_len, "%s: tokenizer.ggml.merges: merge %d \"%s\" is not two pieces separated by "
                    "one space", v->g->path, rank, show(m, shown, sizeof shown));
    int left = find_normal(sorted, n_sorted, m.p, at, NULL, 0);
    int right = find_normal(sorted, n_sorted, space + 1, rest, NULL, 0);
    if (left < 0 || right < 0) {
        GgufStr missing = left < 0 ? (GgufStr){m.p, at} : (GgufStr){space + 1, rest};
        return fail(v->err, v->err_len, "%s: tokenizer.ggml.merges: merge %d \"%s\" names \"%s\", which is not a "
                    "normal token", v->g->path, rank, show(m, shown, sizeof shown), show(missing, side, sizeof side));
    }
    if (find_normal(sorted, n_sorted, m.p, at, space + 1, rest) < 0)
        return fail(v->err, v->err_len, "%s: tokenizer.ggml.merges: merge %d \"%s\": the two pieces joined are not "
                    "a normal token", v->g->path, rank, show(m, shown, sizeof shown));
    v->merges[2 * (size_t)rank] = left;
    v->merges[2 * (size_t)rank + 1] = right;
    return 0;
}

/* tokenizer.ggml.merges (required for gpt2): each "a b" names two normal
 * tokens by their text (the first id when a text repeats). */
static int read_merges(Vocab *v) {
    const char *key = "tokenizer.ggml.merges", *path = v->g->path;
    GgufStr *m;
    uint64_t count;
    if (string_array(v, key, &m, &count)) {
        free(m);
        return -1;
    }
    int rc = 0;
    TextId *sorted = NULL;
    if (count == 0) rc = fail(v->err, v->err_len, "%s: %s is empty", path, key);
    else if (count > MAX_MERGES)
        rc = fail(v->err, v->err_len, "%s: %s has %" PRIu64 " merges (at most %d)", path, key, count, MAX_MERGES);
    else {
        sorted = malloc((size_t)v->n * sizeof *sorted);
        v->merges = malloc(2 * (size_t)count * sizeof *v->merges);
        if (!sorted || !v->merges) rc = fail(v->err, v->err_len, "%s: out of memory for %s", path, key);
    }
    if (rc == 0) {
        int n_sorted = 0;
        for (int i = 0; i < v->n; i++)
            if (v->ttype[i] == TT_NORMAL) sorted[n_sorted++] = (TextId){v->text[i], i};
        qsort(sorted, (size_t)n_sorted, sizeof *sorted, compare_text_id);
        v->n_merges = (int)count;
        for (int r = 0; r < v->n_merges && rc == 0; r++) rc = parse_merge(v, sorted, n_sorted, r, m[r]);
    }
    free(sorted);
    free(m);
    return rc;
}

/* Little-endian int32s and raw bytes into a buffer; each returns the position after. */
static unsigned char *put_i32(unsigned char *p, int32_t x) {
    uint32_t u = (uint32_t)x;
    for (int k = 0; k < 4; k++) p[k] = (unsigned char)(u >> 8 * k);
    return p + 4;
}
static unsigned char *put_bytes(unsigned char *p, const void *data, size_t n) {
    if (n) memcpy(p, data, n);
    return p + n;
}

/* ==========================================================================
 * 3. The chat template, recognized by markers as convert/chat_templates.py
 *    does, without evaluating any Jinja
 *
 *   <|im_start|> and <|im_end|>          chatml (with <think>, a reasoning template: unstated,
 *                                        with a note); its default system prompt is the text of a
 *                                        string literal "<|im_start|>system\n...<|im_end|>"
 *   <|start_header_id|> and <|eot_id|>   llama3; with "Cutting Knowledge Date" (Llama 3.1) the
 *                                        system prefix "Cutting Knowledge Date: CUTOFF\nToday
 *                                        Date: DATE\n\n" from the template's literal and its
 *                                        default date (set date_string = "..."), else unstated
 *   [INST] and <<SYS>>                   llama2
 *   anything else                        unstated, with a note
 * The template is UTF-8 (checked); every marker is ASCII, so a search over
 * its bytes finds what a search over its characters finds.
 * ========================================================================== */

#define NOT_FOUND ((size_t)-1)

/* The first position >= from where w occurs in s[0..n), or NOT_FOUND. */
static size_t find(const char *s, size_t n, size_t from, const char *w) {
    size_t wn = strlen(w);
    for (size_t i = from; i <= n && wn <= n - i; i++)
        if (memcmp(s + i, w, wn) == 0) return i;
    return NOT_FOUND;
}
static int has(const char *s, size_t n, const char *w) { return find(s, n, 0, w) != NOT_FOUND; }

/* A Jinja (Python-style) string literal's source s[0..n) with the escapes
 * \n \t \r \\ \' \" undone into out; any other backslash pair stays as it
 * is. Returns the length written (never more than n). */
static size_t jinja_unescape(const char *s, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\' || i + 1 == n) {
            out[k++] = s[i++];
            continue;
        }
        char c = s[i + 1], done = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r'
                                  : c == '\\' || c == '\'' || c == '"' ? c : 0;
        if (!done) out[k++] = '\\';
        out[k++] = done ? done : c;
        i += 2;
    }
    return k;
}

/* The values of the string literals inside the template's Jinja tags ({{ }}
 * and {% %}; comments {# #} skipped), in order, escapes undone. */
typedef struct {
    char *value;   // the values one after another
    size_t *start; // (n) where each begins in value
    size_t *len;   // (n) its length
    size_t n;
} Literals;

/* The literal that starts with the quote at s[k] (inside a tag): its value
 * into lit when it closes. Returns the position after it. */
static size_t read_literal(const char *s, size_t n, size_t k, Literals *lit, size_t *fill) {
    char quote = s[k];
    size_t m = k + 1;
    while (m < n && s[m] != quote) m += s[m] == '\\' ? 2 : 1; // a backslash takes the next byte with it
    if (m < n) {
        lit->start[lit->n] = *fill;
        lit->len[lit->n] = jinja_unescape(s + k + 1, m - k - 1, lit->value + *fill);
        *fill += lit->len[lit->n++];
    }
    return m + 1;
}

static int jinja_literals(const char *s, size_t n, Literals *lit) {
    lit->n = 0;
    lit->value = malloc(n + 1);
    lit->start = malloc((n / 2 + 1) * sizeof *lit->start); // a literal takes two quotes at least
    lit->len = malloc((n / 2 + 1) * sizeof *lit->len);
    if (!lit->value || !lit->start || !lit->len) return -1;
    size_t i = 0, fill = 0;
    while (i < n) {
        size_t j = find(s, n, i, "{");
        if (j == NOT_FOUND || j + 1 >= n) break;
        char c = s[j + 1];
        if (c == '#') { // a comment: skip to its end
            size_t k = find(s, n, j + 2, "#}");
            i = k == NOT_FOUND ? n : k + 2;
            continue;
        }
        if (c != '{' && c != '%') {
            i = j + 1;
            continue;
        }
        const char *close = c == '{' ? "}}" : "%}";
        size_t k = j + 2;
        while (k < n) {
            if (s[k] == '\'' || s[k] == '"') k = read_literal(s, n, k, lit, &fill);
            else if (k + 1 < n && s[k] == close[0] && s[k + 1] == close[1]) {
                k += 2;
                break;
            } else k++;
        }
        i = k;
    }
    return 0;
}

/* The default system prompt of a ChatML template: the text of the first
 * literal "<|im_start|>system\n" + at least one byte + "<|im_end|>" (up to
 * the first <|im_end|>), or none (*len 0). Points into lit. */
static const char *chatml_default(const Literals *lit, size_t *len) {
    const char *head = "<|im_start|>system\n";
    size_t hn = strlen(head);
    for (size_t k = 0; k < lit->n; k++) {
        const char *s = lit->value + lit->start[k];
        size_t n = lit->len[k];
        if (n < hn || memcmp(s, head, hn) != 0) continue;
        size_t end = find(s, n, hn + 1, "<|im_end|>");
        if (end != NOT_FOUND) {
            *len = end - hn;
            return s + hn;
        }
    }
    *len = 0;
    return NULL;
}

/* Whether cp is whitespace to Python (str.isspace, and \s in its regular
 * expressions). */
static int python_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* The length of the Python whitespace character at s[i..n), or 0 when none
 * starts there. */
static size_t space_at(const char *s, size_t n, size_t i) {
    int len = i < n ? utf8_length(s + i, n - i) : 0;
    return len && python_space(code_point((const unsigned char *)s + i, len)) ? (size_t)len : 0;
}

/* Python's str.strip() on s[*a..*b): whitespace characters off both ends. */
static void strip(const char *s, size_t *a, size_t *b) {
    for (size_t w; *a < *b && (w = space_at(s, *b, *a)) > 0;) *a += w;
    while (*b > *a) {
        size_t start = *b - 1; // the last character starts after its continuation bytes
        while (start > *a && ((unsigned char)s[start] & 0xC0) == 0x80 && *b - start < 4) start--;
        if (space_at(s, *b, start) != *b - start) break;
        *b = start;
    }
}

/* Llama 3.1's default date: the value of the leftmost `set date_string =
 * "..."` (Python's regular expression set\s+date_string\s*=\s*(["'])((?:\\.|
 * (?!\1)[^\\])*)\1 searched in the whole template): its source range
 * [*a, *b). Returns 1, or 0 when there is none. */
static int date_string(const char *s, size_t n, size_t *a, size_t *b) {
    // A value in " (0) or ' (1) that runs to the end unclosed: every later one in the same quote does too
    // (it starts at an escaped quote of that value, and reads the same bytes from there on), so it is
    // not scanned again; each `set` costs the bytes up to its value, and a template is read in linear time.
    int open_to_end[2] = {0, 0};
    for (size_t p = find(s, n, 0, "set"); p != NOT_FOUND; p = find(s, n, p + 1, "set")) {
        size_t q = p + 3, w, sp = 0;
        while ((w = space_at(s, n, q)) > 0) q += w, sp++;
        if (!sp || n - q < strlen("date_string") || memcmp(s + q, "date_string", strlen("date_string"))) continue;
        q += strlen("date_string");
        while ((w = space_at(s, n, q)) > 0) q += w;
        if (q >= n || s[q] != '=') continue;
        q++;
        while ((w = space_at(s, n, q)) > 0) q += w;
        if (q >= n || (s[q] != '"' && s[q] != '\'') || open_to_end[s[q] == '\'']) continue;
        size_t r = q + 1; // the value: escaped pairs and other bytes, up to the same quote
        while (r < n && s[r] != s[q] && !(s[r] == '\\' && r + 1 == n)) r += s[r] == '\\' ? 2 : 1;
        if (r < n && s[r] == s[q]) {
            *a = q + 1;
            *b = r;
            return 1;
        }
        open_to_end[s[q] == '\''] = 1;
    }
    return 0;
}

/* The cutoff of the first literal holding "Cutting Knowledge Date:": what
 * follows it (spaces skipped) up to its newline, stripped. Returns 1 with
 * [*a, *b) in lit->value, or 0 when there is none (or it is empty). */
static int knowledge_cutoff(const Literals *lit, size_t *a, size_t *b) {
    const char *marker = "Cutting Knowledge Date:";
    for (size_t k = 0; k < lit->n; k++) {
        const char *s = lit->value + lit->start[k];
        size_t n = lit->len[k], at = find(s, n, 0, marker);
        if (at == NOT_FOUND) continue;
        size_t from = at + strlen(marker);
        while (from < n && s[from] == ' ') from++;
        size_t end = find(s, n, from, "\n");
        if (end == NOT_FOUND || end == from) return 0;
        *a = lit->start[k] + from;
        *b = lit->start[k] + end;
        strip(lit->value, a, b);
        return *a < *b;
    }
    return 0;
}

/* Llama 3.1's system prefix "Cutting Knowledge Date: CUTOFF\nToday Date:
 * DATE\n\n" into v->system_prefix, and DATE's range in it. Returns 1, 0
 * when a part is missing, -1 out of memory. */
static int llama3_system_prefix(Vocab *v, const char *s, size_t n, const Literals *lit, size_t *date_at,
                                size_t *date_len) {
    size_t ca, cb, da, db;
    int today = 0;
    for (size_t k = 0; k < lit->n && !today; k++) today = has(lit->value + lit->start[k], lit->len[k], "Today Date:");
    if (!knowledge_cutoff(lit, &ca, &cb) || !date_string(s, n, &da, &db) || !today) return 0;
    char *date = malloc(db - da + 1);
    if (!date) return -1;
    size_t dn = jinja_unescape(s + da, db - da, date);
    if (memchr(date, '\n', dn)) {
        free(date);
        return 0;
    }
    const char *one = "Cutting Knowledge Date: ", *two = "\nToday Date: ";
    size_t total = strlen(one) + (cb - ca) + strlen(two) + dn + 2;
    char *p = v->system_prefix = malloc(total + 1);
    if (!p) {
        free(date);
        return -1;
    }
    p = (char *)put_bytes((unsigned char *)p, one, strlen(one)); // memcpy: the texts may hold a NUL (refused later)
    p = (char *)put_bytes((unsigned char *)p, lit->value + ca, cb - ca);
    p = (char *)put_bytes((unsigned char *)p, two, strlen(two));
    p = (char *)put_bytes((unsigned char *)p, date, dn);
    memcpy(p, "\n\n", 3);
    v->system_prefix_len = total;
    free(date);
    // export.py's note quotes prefix.split("Today Date: ", 1)[1].rstrip("\n")
    *date_at = find(v->system_prefix, total, 0, "Today Date: ") + strlen("Today Date: ");
    *date_len = total - *date_at;
    while (*date_len > 0 && v->system_prefix[*date_at + *date_len - 1] == '\n') --*date_len;
    return 1;
}

/* Python's repr() of a str without newlines, as export.py's note shows the
 * date: in single quotes (double when it holds ' and no "), backslashes, the
 * quote and control characters escaped. */
static void python_repr(const char *s, size_t n, char *out, size_t size) {
    char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
    size_t k = 0;
    out[k++] = q;
    for (size_t i = 0; i < n && k + 6 < size; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\' || c == (unsigned char)q) k += (size_t)snprintf(out + k, size - k, "\\%c", c);
        else if (c == '\t' || c == '\r') k += (size_t)snprintf(out + k, size - k, "\\%c", c == '\t' ? 't' : 'r');
        else if (c < 0x20 || c == 0x7F) k += (size_t)snprintf(out + k, size - k, "\\x%02x", c);
        else out[k++] = (char)c;
    }
    snprintf(out + k, size - k, "%c", q);
}

/* The template's first 60 characters, newlines written \n, then "..." when
 * it is longer: how export.py's note quotes an unknown template. */
static void template_head(const char *s, size_t n, char *out, size_t size) {
    size_t k = 0, chars = 0, i = 0;
    for (; i < n && chars < 60 && k + 8 < size; chars++) {
        if (s[i] == '\n') { // "\n" is two characters of the flattened text
            out[k++] = '\\';
            if (++chars < 60) out[k++] = 'n', i++;
            else break;
            continue;
        }
        int len = utf8_length(s + i, n - i);
        len = len ? len : 1;
        memcpy(out + k, s + i, (size_t)len);
        k += (size_t)len;
        i += (size_t)len;
    }
    snprintf(out + k, size - k, "%s", i < n ? "..." : "");
}

#define NEED_TEMPLATE "run -m chat will need --chat-template plain|llama2|chatml|llama3"

/* ChatML or Llama 3 (the first two rules); note as recognize_chat_template. */
static int chatml_or_llama3(Vocab *v, const char *s, size_t n, const Literals *lit, char *note) {
    if (has(s, n, "<|im_start|>") && has(s, n, "<|im_end|>")) {
        if (has(s, n, "<think>")) {
            snprintf(note, GGUF_TOK_NOTE_BYTES, "chat template is ChatML with <think> (a reasoning template, as "
                     "Qwen3's), whose thinking sections run does not reproduce: stored as unstated; " NEED_TEMPLATE);
            return 0;
        }
        v->chat = CHAT_CHATML;
        const char *text = chatml_default(lit, &v->system_default_len);
        v->system_default = malloc(v->system_default_len + 1);
        if (!v->system_default) return -1;
        if (v->system_default_len) memcpy(v->system_default, text, v->system_default_len);
        return 0;
    }
    if (!has(s, n, "Cutting Knowledge Date")) {
        v->chat = CHAT_LLAMA3;
        return 0;
    }
    size_t date_at, date_len;
    int found = llama3_system_prefix(v, s, n, lit, &date_at, &date_len);
    if (found <= 0) {
        if (found == 0)
            snprintf(note, GGUF_TOK_NOTE_BYTES, "chat template is Llama 3's with a knowledge date, but its cutoff "
                     "(\"Cutting Knowledge Date: ...\\n\") or default date (set date_string = \"...\") was not "
                     "found: stored as unstated; " NEED_TEMPLATE);
        return found;
    }
    v->chat = CHAT_LLAMA3;
    char date[256];
    python_repr(v->system_prefix + date_at, date_len, date, sizeof date);
    snprintf(note, GGUF_TOK_NOTE_BYTES, "chat template llama3 with Llama 3.1's system text (knowledge dates); its "
             "date is the template's fixed default %s (Llama 3.2's template puts today's date there under Hugging "
             "Face), and its tool sections are not reproduced", date);
    return 0;
}

/* tokenizer.chat_template -> v->chat and the two system texts (absent or
 * empty: unstated); what export.py notes into note. */
static int recognize_chat_template(Vocab *v, char *note) {
    const char *key = "tokenizer.chat_template", *path = v->g->path;
    GgufStr t = {NULL, 0};
    int got = gguf_get_str(v->g, key, &t, v->err, v->err_len);
    if (got < 0) return -1;
    const char *s = (const char *)t.p;
    size_t n = got ? (size_t)t.len : 0; // inside the file (gguf_parse)
    for (size_t i = 0, len; i < n; i += len) // Python decodes it strictly
        if ((len = (size_t)utf8_length(s + i, n - i)) == 0)
            return fail(v->err, v->err_len, "%s: %s is not UTF-8 text (byte %zu)", path, key, i);
    v->chat = CHAT_UNSTATED;
    int rc = 0;
    if (n == 0) return 0; // no template (or an empty one): unstated, no note
    if ((has(s, n, "<|im_start|>") && has(s, n, "<|im_end|>")) ||
               (has(s, n, "<|start_header_id|>") && has(s, n, "<|eot_id|>"))) {
        Literals lit = {0};
        rc = jinja_literals(s, n, &lit) ? -1 : chatml_or_llama3(v, s, n, &lit, note);
        free(lit.value);
        free(lit.start);
        free(lit.len);
    } else if (has(s, n, "[INST]") && has(s, n, "<<SYS>>")) {
        v->chat = CHAT_LLAMA2;
    } else {
        char head[400];
        template_head(s, n, head, sizeof head);
        snprintf(note, GGUF_TOK_NOTE_BYTES, "chat template not recognized (%s): " NEED_TEMPLATE, head);
    }
    if (rc < 0) return fail(v->err, v->err_len, "%s: out of memory reading %s", path, key);
    return 0;
}

/* ==========================================================================
 * 4. Ids, stop ids and the file's bytes
 * ========================================================================== */

/* An id key: absent, negative or 0xFFFFFFFF -> -1 (none: llama.cpp stores
 * its "no token", -1, as a u32, e.g. llama-convert-llama2c-to-ggml's
 * padding_token_id); else inside the vocabulary. */
#define NO_TOKEN_U32 0xFFFFFFFFll
static int token_id(Vocab *v, const char *key, int *out) {
    int64_t x;
    int got = gguf_get_int(v->g, key, &x, v->err, v->err_len);
    *out = -1;
    if (got < 0) return -1;
    if (got == 0 || x < 0 || x == NO_TOKEN_U32) return 0;
    if (x >= v->n)
        return fail(v->err, v->err_len, "%s: %s=%" PRId64 " is outside the vocabulary (%d tokens)", v->g->path, key, x,
                    v->n);
    *out = (int)x;
    return 0;
}

/* Whether piece i reads text. */
static int piece_is(const Vocab *v, int i, const char *text) {
    size_t n = strlen(text);
    return (size_t)v->len[i] == n && memcmp(v->bytes + v->at[i], text, n) == 0;
}

/* The end of turn when the file names none: the last special piece reading
 * the first of these texts that some special piece reads, or -1. */
static int guess_eot(const Vocab *v) {
    static const char *const texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>"};
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++)
        for (int i = v->n - 1; i >= 0; i--)
            if (v->kind[i] == PIECE_SPECIAL && piece_is(v, i, texts[k])) return i;
    return -1;
}

/* The ids, and whether a prompt starts with BOS. */
static int read_ids(Vocab *v) {
    if (token_id(v, "tokenizer.ggml.bos_token_id", &v->bos) || token_id(v, "tokenizer.ggml.eos_token_id", &v->eos) ||
        token_id(v, "tokenizer.ggml.eot_token_id", &v->eot) ||
        token_id(v, "tokenizer.ggml.padding_token_id", &v->pad) || token_id(v, "tokenizer.ggml.eom_token_id", &v->eom))
        return -1;
    if (v->eot < 0) v->eot = guess_eot(v);
    int got = gguf_get_bool(v->g, "tokenizer.ggml.add_bos_token", &v->add_bos, v->err, v->err_len);
    if (got < 0) return -1;
    if (got == 0) v->add_bos = v->type == TOK_SENTENCEPIECE && v->bos >= 0; // llama.cpp's default for each model
    else if (v->add_bos && v->bos < 0)
        return fail(v->err, v->err_len, "%s: tokenizer.ggml.add_bos_token is true but there is no "
                    "tokenizer.ggml.bos_token_id", v->g->path);
    return 0;
}

/* The stop ids, sorted, each once: EOS, EOT, EOM, the template's end-of-turn
 * piece (the first special piece reading it, else the first piece), and every
 * special piece whose text ends a generation. */
static int stop_ids(Vocab *v) {
    static const char *const stop_texts[] = {"<|endoftext|>", "<|im_end|>", "<|end_of_text|>", "<|eot_id|>",
                                             "<|eom_id|>", "<end_of_turn>", "<|end|>"};
    unsigned char *stops = calloc((size_t)v->n, 1);
    if (!stops) return fail(v->err, v->err_len, "%s: out of memory", v->g->path);
    const int named[3] = {v->eos, v->eot, v->eom};
    for (int k = 0; k < 3; k++)
        if (named[k] >= 0) stops[named[k]] = 1;
    const char *end = v->chat == CHAT_CHATML ? "<|im_end|>" : v->chat == CHAT_LLAMA3 ? "<|eot_id|>" : NULL;
    int special_end = -1, any_end = -1;
    for (int i = 0; end && i < v->n && special_end < 0; i++)
        if (piece_is(v, i, end)) {
            if (v->kind[i] == PIECE_SPECIAL) special_end = i;
            else if (any_end < 0) any_end = i;
        }
    if (special_end >= 0 || any_end >= 0) stops[special_end >= 0 ? special_end : any_end] = 1;
    for (int i = 0; i < v->n; i++)
        for (size_t k = 0; v->kind[i] == PIECE_SPECIAL && k < sizeof stop_texts / sizeof stop_texts[0]; k++)
            if (piece_is(v, i, stop_texts[k])) stops[i] = 1;
    v->n_stop = 0;
    for (int i = 0; i < v->n; i++) v->n_stop += stops[i];
    int rc = 0;
    if (v->n_stop > TOK_MAX_STOP)
        rc = fail(v->err, v->err_len, "%s: %d stop ids (EOS, end of turn and special pieces that end a text; at most "
                  "%d)", v->g->path, v->n_stop, TOK_MAX_STOP);
    else if (!(v->stop = malloc(((size_t)v->n_stop + 1) * sizeof *v->stop)))
        rc = fail(v->err, v->err_len, "%s: out of memory", v->g->path);
    for (int i = 0, k = 0; rc == 0 && i < v->n; i++)
        if (stops[i]) v->stop[k++] = i;
    free(stops);
    return rc;
}

/* The two system texts: at most TOK_MAX_SYSTEM bytes, no NUL. */
static int check_system_texts(Vocab *v) {
    const char *names[2] = {"default system prompt", "system prefix"};
    const char *texts[2] = {v->system_default, v->system_prefix};
    size_t lens[2] = {v->system_default_len, v->system_prefix_len};
    for (int k = 0; k < 2; k++) {
        if (lens[k] > TOK_MAX_SYSTEM)
            return fail(v->err, v->err_len, "%s: tokenizer.chat_template: its %s is %zu bytes (at most %d)",
                        v->g->path, names[k], lens[k], TOK_MAX_SYSTEM);
        if (lens[k] && memchr(texts[k], 0, lens[k]))
            return fail(v->err, v->err_len, "%s: tokenizer.chat_template: its %s contains a NUL character",
                        v->g->path, names[k]);
    }
    return 0;
}

/* The version 3 file (tokenizer.h's layout) of v. */
static int pack(const Vocab *v, unsigned char **out, size_t *out_size) {
    size_t size = TOK_HEADER_BYTES + 8 * (size_t)v->n_merges + 4 * (size_t)v->n_stop + v->system_default_len +
                  v->system_prefix_len;
    for (int i = 0; i < v->n; i++) size += 12 + (size_t)v->len[i];
    unsigned char *buf = malloc(size), *p = buf;
    if (!buf) return fail(v->err, v->err_len, "%s: out of memory for the tokenizer (%zu bytes)", v->g->path, size);
    const int32_t header[15] = {(int32_t)TOK_MAGIC, TOK_VERSION, v->type, v->pre, v->n, v->n_merges, v->bos,
                                v->eos, v->eot, v->pad, v->add_bos, v->chat, v->n_stop,
                                (int32_t)v->system_default_len, (int32_t)v->system_prefix_len};
    for (int k = 0; k < 15; k++) p = put_i32(p, header[k]);
    p = put_i32(p, 0); // reserved
    for (int i = 0; i < v->n; i++) {
        float score = v->score ? v->score[i] : 0.0f;
        uint32_t bits;
        memcpy(&bits, &score, sizeof bits);
        p = put_i32(p, (int32_t)bits);
        p = put_i32(p, v->kind[i]);
        p = put_i32(p, v->len[i]);
        p = put_bytes(p, v->bytes + v->at[i], (size_t)v->len[i]);
    }
    for (size_t k = 0; k < 2 * (size_t)v->n_merges; k++) p = put_i32(p, v->merges[k]);
    for (int k = 0; k < v->n_stop; k++) p = put_i32(p, v->stop[k]);
    p = put_bytes(p, v->system_default, v->system_default_len);
    put_bytes(p, v->system_prefix, v->system_prefix_len);
    *out = buf;
    *out_size = size;
    return 0;
}

/* The conversion, in export.py's order: model, tokens, pieces, merges, ids,
 * chat template, stop ids. */
static int convert(Vocab *v, char *note) {
    const char *path = v->g->path;
    GgufStr model;
    char shown[128];
    int got = gguf_get_str(v->g, "tokenizer.ggml.model", &model, v->err, v->err_len);
    if (got < 0) return -1;
    if (got == 0) return fail(v->err, v->err_len, "%s: missing required key tokenizer.ggml.model", path);
    if (!gguf_str_is(model, "gpt2") && !gguf_str_is(model, "llama"))
        return fail(v->err, v->err_len, "%s: tokenizer.ggml.model is \"%s\"; supported: \"gpt2\" (byte-level BPE) "
                    "and \"llama\" (sentencepiece)", path, show(model, shown, sizeof shown));
    v->type = gguf_str_is(model, "gpt2") ? TOK_BYTE_BPE : TOK_SENTENCEPIECE;
    if (read_tokens(v)) return -1;
    if (v->type == TOK_BYTE_BPE ? byte_level_pieces(v) || read_merges(v) : sentencepiece_pieces(v)) return -1;
    if (read_ids(v) || recognize_chat_template(v, note) || stop_ids(v) || check_system_texts(v)) return -1;
    return 0;
}

int gguf_tokenizer_ltok(const GgufFile *g, unsigned char **out, size_t *out_size, char *note, char *err,
                        size_t err_len) {
    Vocab v = {.g = g, .err = err, .err_len = err_len, .bos = -1, .eos = -1, .eot = -1, .pad = -1, .eom = -1};
    *out = NULL;
    *out_size = 0;
    note[0] = '\0';
    int rc = convert(&v, note);
    if (rc == 0) rc = pack(&v, out, out_size);
    if (rc != 0) note[0] = '\0';
    vocab_free(&v);
    return rc;
}

/* ==========================================================================
 * 5. A GGUF file as a tokenizer
 * ========================================================================== */

int gguf_tokenizer_build(Tokenizer *t, const char *path, int vocab_size, int bos_id, int eos_id, char *note,
                         char *err, size_t err_len) {
    memset(t, 0, sizeof *t);
    tokenizer_free(t); // an empty tokenizer: every id "none"
    note[0] = '\0';
    const char *name = shown_path(path);
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return fail(err, err_len, "tokenizer %s: %s", name, strerror(e));
    }
    if (!S_ISREG(st.st_mode) || st.st_size < 4) { // gguf_is_file said "GGUF": a regular file of 4 bytes or more
        close(fd);
        return fail(err, err_len, "tokenizer %s: expected a regular GGUF file", name);
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return fail(err, err_len, "tokenizer %s: cannot map %zu bytes: %s", name, size, strerror(e));
    GgufFile g;
    unsigned char *ltok = NULL;
    size_t ltok_size = 0;
    int rc = gguf_parse(&g, name, map, size, err, err_len);
    if (rc == 0) rc = gguf_tokenizer_ltok(&g, &ltok, &ltok_size, note, err, err_len);
    gguf_free(&g);
    munmap(map, size);
    if (rc == 0) rc = tokenizer_build_bytes(t, name, ltok, ltok_size, vocab_size, bos_id, eos_id, err, err_len);
    free(ltok);
    if (rc == 0) t->from_gguf = 1;
    else note[0] = '\0';
    return rc;
}
