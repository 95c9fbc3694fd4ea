/* tokenizer.c: load a vocabulary, encode text to token ids and decode ids
 * back to text as a stream. Two kinds of vocabulary (tokenizer.h's "Tokenizer
 * files" gives both file formats):
 *   type 0  sentencepiece BPE (Llama 2, llama2.c's models): version 1
 *           tokenizer.bin, or an "LTOK" file (version 2 or 3)
 *   type 1  GPT-2's byte-level BPE (SmolLM2, Llama 3, Qwen2): "LTOK" only
 *
 * A vocabulary is a list of pieces. Four kinds of piece live in it:
 *   normal pieces   text fragments BPE builds by joining smaller pieces
 *   special pieces  control and added tokens: "<unk>", BOS, EOS, <|im_start|>
 *   byte pieces     type 0's "<0x00>" .. "<0xFF>", one raw byte each (byte fallback)
 *   unused pieces   never produced
 * Only normal pieces are ever made by merging. An "LTOK" file stores each
 * piece's kind; a version 1 file does not, so its kinds are guessed from the
 * text: "<0xHH>" is a byte piece, "<unk>" and the checkpoint's BOS and EOS are
 * special. (Scores cannot tell them apart: control and byte pieces score 0.0
 * and Llama 2's best normal merge scores -0.0.)
 *
 * Encoding type 0 (tokenizer_encode), the way sentencepiece's BPE model does:
 *   1. prepend one space (sentencepiece's "dummy prefix") to non-empty text;
 *   2. split it into UTF-8 code points, each one symbol (an invalid byte is a
 *      symbol of its own);
 *   3. repeatedly join the adjacent pair of symbols whose concatenation is a
 *      normal piece with the highest score; on equal scores the leftmost pair
 *      wins;
 *   4. emit each remaining symbol's id; a symbol that is no piece (a code
 *      point missing from the vocabulary, or an invalid byte) becomes one
 *      byte piece per byte.
 * Special pieces are never matched in the text: a user who types "<s>" or
 * "<0x41>" gets those characters encoded as plain text, as in sentencepiece.
 *
 * Encoding type 1, the way Hugging Face's tokenizers does with its default
 * settings:
 *   1. invalid UTF-8 becomes U+FFFD, one per maximal invalid subsequence, as
 *      Python's bytes.decode("utf-8", "replace") does (tokenizers only ever
 *      sees such a decoded string);
 *   2. special pieces: wherever the text holds a special piece's exact bytes,
 *      that piece's id stands for them (leftmost match first, the longest at
 *      a position); the text between matches goes through steps 3 and 4;
 *   3. the pre-tokenizer splits the text into pre-tokens with the vocabulary's
 *      regular expression (GPT-2, Llama 3, Qwen2, or SmolLM2's digits then
 *      GPT-2), hand-written here over the character classes of
 *      unicode_tables.h (section 4);
 *   4. with the Llama 3 pre-tokenizer, a pre-token that is itself a normal
 *      piece is that piece (its tokenizer.json's ignore_merges; tiktoken
 *      does the same). Otherwise each pre-token's bytes start as one-byte
 *      pieces (a byte the vocabulary has no piece for is dropped, as
 *      tokenizers does without an unknown token), and the adjacent pair whose
 *      merge has the lowest rank is joined, leftmost first on equal ranks,
 *      until no pair has a merge; the symbols left are the ids.
 * Nothing crosses a pre-token boundary: merges work inside one pre-token.
 *
 * Cost. Done naively, BPE rescans every pair after every merge: quadratic in
 * the length (a run of 100 KB of spaces is one pre-token). Here the symbols
 * form a doubly linked list (a merge unlinks one node in O(1)) and the
 * candidate pairs sit in a binary heap ordered by (score or rank, position).
 * A merge changes only the two pairs around it, so it pushes at most two new
 * candidates; pairs made stale by earlier merges stay in the heap and are
 * recognised and skipped when popped ("lazy invalidation"). Type 0 looks a
 * joined piece up by binary search over the normal pieces sorted by bytes;
 * type 1 looks a pair up in a hash table of merges. The pre-tokenizer reads
 * each code point a bounded number of times, and the special-piece matcher
 * runs only at positions whose byte starts some special piece, walking the
 * sorted special pieces like a trie. Total: O(n log n) for n bytes of text.
 *
 * Decoding (tokenizer_decode) writes a token's bytes: type 0 turns "<0xHH>"
 * into the raw byte HH and drops the dummy-prefix space after BOS; type 1
 * pieces are raw bytes already, special pieces print their text, a BOS the
 * tokenizer adds (add_bos) nothing.
 * Because one character can be split over several tokens, the decoder holds
 * back the bytes of an incomplete UTF-8 sequence in a DecodeState until the
 * sequence completes, so it only ever prints whole code points. A byte that
 * can neither start nor continue a valid sequence is printed as U+FFFD (the
 * replacement character, bytes EF BF BD), one per bad byte: the output is
 * always valid UTF-8 and no byte vanishes silently.
 *
 * Read it top to bottom; the sections follow the data:
 *   1. pieces and lookup: byte pieces, byte-string order, binary search over the normal pieces
 *   2. loading: file -> validated pieces -> kinds, sorted lookup, byte pieces, special pieces, merges
 *   3. UTF-8 rules the encoder (splitting, U+FFFD) and the decoder (streaming) share
 *   4. pre-tokenizers: character classes -> the regular expressions of GPT-2, Llama 3, Qwen2, SmolLM2
 *   5. encoding: symbols -> BPE merges through a heap of candidate pairs -> ids, for either type
 *   6. decoding: ids -> bytes, whole code points only
 */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer.h"
#include "unicode_tables.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * 1. Pieces and lookup
 * ========================================================================== */

/* If piece[0..len) is a byte piece "<0xHH>" (two upper-case hex digits, as
 * sentencepiece writes them), return the byte HH; otherwise return -1. */
static int parse_byte_piece(const char *piece, int len) {
    if (len != 6 || piece[0] != '<' || piece[1] != '0' || piece[2] != 'x' || piece[5] != '>') return -1;
    int value = 0;
    for (int k = 3; k < 5; k++) {
        char c = piece[k];
        int digit;
        if (c >= '0' && c <= '9') digit = c - '0';
        else if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
        else return -1;
        value = value * 16 + digit;
    }
    return value;
}

/* Three-way comparison of byte strings a[0..alen) and b[0..blen): memcmp
 * order, a proper prefix sorting first. */
static int compare_bytes(const char *a, int alen, const char *b, int blen) {
    int n = alen < blen ? alen : blen;
    int c = memcmp(a, b, (size_t)n);
    if (c != 0) return c;
    return (alen > blen) - (alen < blen);
}

/* An entry of the temporary array sorted to build t->sorted_ids and
 * t->special_ids. */
typedef struct {
    const char *bytes;
    int len;
    int id;
} SortEntry;

/* qsort order: by bytes, then by id so duplicates keep the lowest id first. */
static int compare_sort_entries(const void *pa, const void *pb) {
    const SortEntry *a = pa, *b = pb;
    int c = compare_bytes(a->bytes, a->len, b->bytes, b->len);
    if (c != 0) return c;
    return (a->id > b->id) - (a->id < b->id);
}

/* Id of the normal piece equal to s[0..len), or -1 if there is none.
 * Binary search (lower bound) over t->sorted_ids: O(log vocab_size). */
static int lookup_piece(const Tokenizer *t, const char *s, int len) {
    int lo = 0, hi = t->n_sorted; // the answer lies in [lo, hi)
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int id = t->sorted_ids[mid];
        if (compare_bytes(t->vocab[id], t->vocab_len[id], s, len) < 0) lo = mid + 1;
        else hi = mid;
    }
    if (lo < t->n_sorted) {
        int id = t->sorted_ids[lo];
        if (compare_bytes(t->vocab[id], t->vocab_len[id], s, len) == 0) return id;
    }
    return -1;
}

/* Piece bytes s[0..len) for an error message: printable ASCII as is, other
 * bytes as \xHH, cut after 40 bytes; written to buf (>= 200 bytes). */
static const char *printable(char *buf, const char *s, int len) {
    size_t pos = 0;
    for (int k = 0; k < len && k < 40; k++) {
        unsigned char c = (unsigned char)s[k];
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"') buf[pos++] = (char)c;
        else pos += (size_t)snprintf(buf + pos, 5, "\\x%02X", c);
    }
    if (len > 40) pos += (size_t)snprintf(buf + pos, 4, "...");
    buf[pos] = '\0';
    return buf;
}

/* ==========================================================================
 * 2. Loading: file -> validated pieces -> kinds, lookup, byte and special
 *    pieces, merges
 * ========================================================================== */

/* Longest piece a file may hold: real vocabularies stay below a few hundred
 * bytes per piece, so anything larger means a corrupt or foreign file. */
#define TOKENIZER_MAX_PIECE_BYTES 65536
/* Most merges an "LTOK" file may hold (Llama 3 has 280 147), so that the
 * hash table's size stays an int. */
#define TOKENIZER_MAX_MERGES (1 << 28)

/* After vocab_size entries parsed cleanly and rest bytes remain at p, count
 * how many further whole entries follow. Returns that count, or -1 when the
 * remainder is not a clean sequence of entries (then it is "trailing bytes"). */
static long count_extra_entries(const unsigned char *p, size_t rest) {
    long count = 0;
    while (rest > 0) {
        if (rest < 8) return -1;
        int32_t len = read_le_i32(p + 4);
        if (len < 0 || (size_t)len > rest - 8) return -1;
        p += 8 + (size_t)len;
        rest -= 8 + (size_t)len;
        count++;
    }
    return count;
}

/* Validate the t->vocab_size piece records that start at data[*pos] and copy
 * them into t (vocab, vocab_len, scores, kind, piece_storage). A version 1
 * record is (f32 score, i32 len, bytes), at most max_len bytes; an "LTOK"
 * record is (f32 score, i32 kind, i32 len, bytes). On success moves *pos past
 * the last record and returns 0; else returns -1 with a message. */
static int read_pieces(Tokenizer *t, const char *path, const unsigned char *data, size_t size, size_t *pos,
                       int max_len, char *err, size_t err_len) {
    const int ltok = t->version >= 2, n_tokens = t->vocab_size;
    const size_t head = ltok ? 12 : 8; // record bytes before the piece's bytes
    size_t at = *pos, storage = 0;
    int longest = 0;

    // First pass: validate every record and total the piece bytes.
    for (int i = 0; i < n_tokens; i++) {
        size_t rest = size - at;
        if (rest == 0 && !ltok)
            return fail(err, err_len, "tokenizer %s: holds %d tokens but the model has vocab_size %d", path, i,
                        n_tokens);
        if (rest < head)
            return fail(err, err_len, "tokenizer %s: truncated in token %d of %d (%zu of its %zu header bytes present)",
                        path, i, n_tokens, rest, head);
        float score = read_le_f32(data + at);
        int32_t kind = ltok ? read_le_i32(data + at + 4) : PIECE_NORMAL;
        int32_t len = read_le_i32(data + at + head - 4);
        if (isnan(score)) return fail(err, err_len, "tokenizer %s: token %d has a NaN score", path, i);
        if (len < 0) return fail(err, err_len, "tokenizer %s: token %d has negative length %ld", path, i, (long)len);
        if (len > max_len)
            return fail(err, err_len, "tokenizer %s: token %d is %ld bytes long, more than %s %ld", path, i, (long)len,
                        ltok ? "the limit of" : "max_token_length", (long)max_len);
        if (kind < 0 || kind >= PIECE_N_KINDS)
            return fail(err, err_len, "tokenizer %s: token %d has kind %ld, expected 0..%d (normal, special, byte, "
                        "unused)", path, i, (long)kind, PIECE_N_KINDS - 1);
        if (kind == PIECE_BYTE && t->type != TOK_SENTENCEPIECE)
            return fail(err, err_len, "tokenizer %s: token %d is a byte piece (kind 2), which only type 0 "
                        "(sentencepiece) vocabularies have", path, i);
        if (kind == PIECE_NORMAL && len == 0 && ltok)
            return fail(err, err_len, "tokenizer %s: token %d is a normal piece of length 0", path, i);
        if ((size_t)len > rest - head)
            return fail(err, err_len, "tokenizer %s: truncated in token %d of %d (needs %ld piece bytes, %zu present)",
                        path, i, n_tokens, (long)len, rest - head);
        at += head + (size_t)len;
        storage += (size_t)len + 1;
        if (len > longest) longest = len;
    }

    // Second pass: copy the pieces, NUL-terminated, into one block.
    size_t n = (size_t)n_tokens;
    t->vocab = malloc(n * sizeof *t->vocab);
    t->vocab_len = malloc(n * sizeof *t->vocab_len);
    t->scores = malloc(n * sizeof *t->scores);
    t->kind = malloc(n);
    t->sorted_ids = malloc(n * sizeof *t->sorted_ids);
    t->piece_storage = malloc(storage);
    if (!t->vocab || !t->vocab_len || !t->scores || !t->kind || !t->sorted_ids || !t->piece_storage)
        return fail(err, err_len, "tokenizer %s: out of memory loading %d tokens", path, n_tokens);
    at = *pos;
    char *dst = t->piece_storage;
    for (int i = 0; i < n_tokens; i++) {
        int len = (int)read_le_i32(data + at + head - 4);
        t->scores[i] = read_le_f32(data + at);
        t->kind[i] = (unsigned char)(ltok ? read_le_i32(data + at + 4) : PIECE_NORMAL);
        memcpy(dst, data + at + head, (size_t)len);
        dst[len] = '\0';
        t->vocab[i] = dst;
        t->vocab_len[i] = len;
        dst += (size_t)len + 1;
        at += head + (size_t)len;
    }
    if (ltok) t->max_token_length = longest;
    *pos = at;
    return 0;
}

/* Version 1 has no kinds: a piece "<0xHH>" is a byte piece, "<unk>" and the
 * checkpoint's BOS and EOS are special, an empty piece is unused, the rest
 * are normal. Also finds byte_offset (the first "<0x00>") and unk_id. */
static void guess_kinds(Tokenizer *t) {
    for (int i = 0; i < t->vocab_size; i++) {
        int byte = parse_byte_piece(t->vocab[i], t->vocab_len[i]);
        if (byte == 0 && t->byte_offset < 0) t->byte_offset = i;
        if (t->unk_id < 0 && compare_bytes(t->vocab[i], t->vocab_len[i], "<unk>", 5) == 0) t->unk_id = i;
        t->kind[i] = byte >= 0 ? PIECE_BYTE : t->vocab_len[i] == 0 ? PIECE_UNUSED : PIECE_NORMAL;
    }
    if (t->unk_id >= 0) t->kind[t->unk_id] = PIECE_SPECIAL;
    if (t->bos_id >= 0) t->kind[t->bos_id] = PIECE_SPECIAL;
    if (t->eos_id >= 0) t->kind[t->eos_id] = PIECE_SPECIAL;
}

/* Write to ids the ids of the non-empty pieces of the given kind, sorted by
 * bytes then id; returns how many, or -1 out of memory. */
static int sort_pieces(const Tokenizer *t, int kind, int *ids) {
    SortEntry *entries = malloc((size_t)t->vocab_size * sizeof *entries);
    if (!entries) return -1;
    int n = 0;
    for (int i = 0; i < t->vocab_size; i++) {
        if (t->kind[i] == kind && t->vocab_len[i] > 0) {
            entries[n].bytes = t->vocab[i];
            entries[n].len = t->vocab_len[i];
            entries[n].id = i;
            n++;
        }
    }
    qsort(entries, (size_t)n, sizeof *entries, compare_sort_entries);
    for (int k = 0; k < n; k++) ids[k] = entries[k].id;
    free(entries);
    return n;
}

/* Type 0: the byte pieces. Encoding maps byte b to id byte_offset + b, so the
 * 256 byte pieces must sit at consecutive ids in order (ids 3..258 in Llama
 * 2's vocabulary). Version 1 found byte_offset while guessing the kinds; a
 * "LTOK" byte piece must read "<0xHH>". Returns 0, or -1 with a message. */
static int index_byte_pieces(Tokenizer *t, const char *path, char *err, size_t err_len) {
    int n_byte = 0; // "LTOK" byte pieces
    for (int i = 0; i < t->vocab_size && t->version >= 2; i++) {
        if (t->kind[i] != PIECE_BYTE) continue;
        int byte = parse_byte_piece(t->vocab[i], t->vocab_len[i]);
        char shown[200];
        if (byte < 0)
            return fail(err, err_len, "tokenizer %s: token %d is a byte piece but reads \"%s\", not <0xHH>", path, i,
                        printable(shown, t->vocab[i], t->vocab_len[i]));
        if (byte == 0 && t->byte_offset < 0) t->byte_offset = i;
        n_byte++;
    }
    if (n_byte > 0 && t->byte_offset < 0)
        return fail(err, err_len, "tokenizer %s: has %d byte pieces but no <0x00>", path, n_byte);
    if (t->byte_offset >= 0) {
        for (int b = 0; b < 256; b++) {
            int id = t->byte_offset + b;
            if (id >= t->vocab_size || parse_byte_piece(t->vocab[id], t->vocab_len[id]) != b ||
                (t->version >= 2 && t->kind[id] != PIECE_BYTE))
                return fail(err, err_len, "tokenizer %s: byte pieces <0x00>..<0xFF> are not at consecutive ids from %d",
                            path, t->byte_offset);
        }
    }
    return 0;
}

/* Longest special piece a byte-level vocabulary may have: real ones are a
 * few dozen bytes (<|begin_of_text|>); matching costs up to this much per
 * text position. */
#define MAX_SPECIAL_BYTES 256

/* Type 1: the one-byte normal piece of every byte value, and the special
 * pieces sorted for the matcher. GPT-2's vocabulary has all 256 one-byte
 * pieces; SmolLM2's lacks 21 (bytes 0x04, 0xC0, 0xF5..0xFF, ...), whose
 * byte_id stays -1. Returns 0, or -1 with a message. */
static int index_byte_level(Tokenizer *t, const char *path, char *err, size_t err_len) {
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = lookup_piece(t, &c, 1);
    }
    t->special_ids = malloc((size_t)t->vocab_size * sizeof *t->special_ids);
    if (!t->special_ids) return fail(err, err_len, "tokenizer %s: out of memory indexing tokens", path);
    t->n_special = sort_pieces(t, PIECE_SPECIAL, t->special_ids);
    if (t->n_special < 0) return fail(err, err_len, "tokenizer %s: out of memory indexing tokens", path);
    for (int k = 0; k < t->n_special; k++) {
        int id = t->special_ids[k];
        // The matcher may compare a special piece's bytes at every text position: keep that cost bounded.
        if (t->vocab_len[id] > MAX_SPECIAL_BYTES)
            return fail(err, err_len, "tokenizer %s: special piece %d is %d bytes long (expected at most %d)", path,
                        id, t->vocab_len[id], MAX_SPECIAL_BYTES);
        t->special_lead[(unsigned char)t->vocab[id][0]] = 1;
    }
    return 0;
}

/* Kinds (guessed for version 1), the sorted normal pieces (unique in
 * "LTOK"), <unk>, then the byte pieces of type 0 or the byte and special
 * pieces of type 1. Returns 0, or -1 with a message. */
static int index_pieces(Tokenizer *t, const char *path, char *err, size_t err_len) {
    if (t->version == 1) guess_kinds(t);
    for (int i = 0; i < t->vocab_size && t->unk_id < 0; i++)
        if (t->kind[i] != PIECE_NORMAL && compare_bytes(t->vocab[i], t->vocab_len[i], "<unk>", 5) == 0) t->unk_id = i;
    if (t->unk_id < 0) t->unk_id = 0; // sentencepiece's default

    t->n_sorted = sort_pieces(t, PIECE_NORMAL, t->sorted_ids);
    if (t->n_sorted < 0) return fail(err, err_len, "tokenizer %s: out of memory indexing tokens", path);
    for (int k = 1; k < t->n_sorted && t->version >= 2; k++) {
        int a = t->sorted_ids[k - 1], b = t->sorted_ids[k];
        char shown[200];
        if (compare_bytes(t->vocab[a], t->vocab_len[a], t->vocab[b], t->vocab_len[b]) == 0)
            return fail(err, err_len, "tokenizer %s: tokens %d and %d are the same normal piece \"%s\" (normal pieces "
                        "must be unique)", path, a, b, printable(shown, t->vocab[a], t->vocab_len[a]));
    }
    if (t->type == TOK_SENTENCEPIECE) return index_byte_pieces(t, path, err, err_len);
    return index_byte_level(t, path, err, err_len);
}

/* Hash of a merge's pair of ids (Fibonacci hashing of the 64-bit pair). */
static unsigned merge_hash(int left, int right) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    return (unsigned)((key * 0x9E3779B97F4A7C15ull) >> 32);
}

/* The slot of t->merges that holds the merge of (left, right), or the empty
 * slot where it would go (then ->left is -1). Linear probing; the table is
 * never more than half full, so the probe ends quickly. */
static MergeRule *merge_slot(const Tokenizer *t, int left, int right) {
    unsigned mask = (unsigned)t->merge_slots - 1;
    for (unsigned i = merge_hash(left, right) & mask;; i = (i + 1) & mask) {
        MergeRule *m = &t->merges[i];
        if (m->left < 0 || (m->left == left && m->right == right)) return m;
    }
}

/* The merge of pieces (left, right), or NULL when they do not merge. */
static const MergeRule *find_merge(const Tokenizer *t, int left, int right) {
    if (t->merge_slots == 0) return NULL;
    const MergeRule *m = merge_slot(t, left, right);
    return m->left < 0 ? NULL : m;
}

/* Read the n_merges merges at the start of p[0..rest) into the hash table.
 * Each must name two pieces whose bytes joined are a normal piece, and no
 * pair may repeat. Returns 0, or -1 with a message. */
static int read_merges(Tokenizer *t, const char *path, const unsigned char *p, size_t rest, int n_merges, char *err,
                       size_t err_len) {
    size_t need = (size_t)n_merges * 8;
    if (rest < need)
        return fail(err, err_len, "tokenizer %s: truncated in merge %zu of %d (%zu of its 8 bytes present)", path,
                    rest / 8, n_merges, rest % 8);
    if (n_merges == 0) return 0;
    size_t slots = 16;
    while (slots < 2 * (size_t)n_merges) slots *= 2;
    t->merges = malloc(slots * sizeof *t->merges);
    char *joined = malloc(2 * (size_t)t->max_token_length + 1);
    if (!t->merges || !joined) {
        free(joined);
        return fail(err, err_len, "tokenizer %s: out of memory loading %d merges", path, n_merges);
    }
    t->merge_slots = (int)slots;
    for (size_t k = 0; k < slots; k++) t->merges[k].left = -1;
    int rc = 0;
    for (int k = 0; k < n_merges && rc == 0; k++) {
        int32_t left = read_le_i32(p + 8 * (size_t)k), right = read_le_i32(p + 8 * (size_t)k + 4);
        if (left < 0 || left >= t->vocab_size || right < 0 || right >= t->vocab_size) {
            rc = fail(err, err_len, "tokenizer %s: merge %d names tokens %ld and %ld, outside 0..%d", path, k,
                      (long)left, (long)right, t->vocab_size - 1);
            break;
        }
        int len = t->vocab_len[left] + t->vocab_len[right];
        memcpy(joined, t->vocab[left], (size_t)t->vocab_len[left]);
        memcpy(joined + t->vocab_len[left], t->vocab[right], (size_t)t->vocab_len[right]);
        int result = lookup_piece(t, joined, len);
        MergeRule *slot = merge_slot(t, left, right);
        char shown[200];
        if (result < 0)
            rc = fail(err, err_len, "tokenizer %s: merge %d joins tokens %ld and %ld into \"%s\", which is not a "
                      "normal piece", path, k, (long)left, (long)right, printable(shown, joined, len));
        else if (slot->left >= 0)
            rc = fail(err, err_len, "tokenizer %s: merge %d repeats merge %d (tokens %ld and %ld)", path, k, slot->rank,
                      (long)left, (long)right);
        else
            *slot = (MergeRule){left, right, k, result};
    }
    free(joined);
    t->n_merges = n_merges;
    return rc;
}

/* Fill t from a version 1 file image data[0..size) (llama2.c's tokenizer.bin,
 * sentencepiece). Returns 0, or -1 with a message. */
static int parse_version1(Tokenizer *t, const char *path, const unsigned char *data, size_t size, char *err,
                          size_t err_len) {
    if (size == 0) return fail(err, err_len, "tokenizer %s: tokenizer file is empty", path);
    if (size < 4) return fail(err, err_len, "tokenizer %s: truncated: only %zu of the 4 header bytes", path, size);
    int32_t max_len = read_le_i32(data);
    if (max_len <= 0 || max_len > TOKENIZER_MAX_PIECE_BYTES)
        return fail(err, err_len, "tokenizer %s: max_token_length %ld is out of range 1..%d (not a tokenizer.bin, and "
                    "no \"LTOK\" magic either)", path, (long)max_len, TOKENIZER_MAX_PIECE_BYTES);
    t->version = 1;
    t->type = TOK_SENTENCEPIECE;
    t->add_bos = 1;
    t->max_token_length = max_len;
    size_t pos = 4;
    if (read_pieces(t, path, data, size, &pos, max_len, err, err_len) != 0) return -1;
    if (pos != size) {
        long extra = count_extra_entries(data + pos, size - pos);
        if (extra > 0)
            return fail(err, err_len, "tokenizer %s: holds %ld tokens but the model has vocab_size %d", path,
                        (long)t->vocab_size + extra, t->vocab_size);
        return fail(err, err_len, "tokenizer %s: has more than vocab_size %d entries (%zu trailing bytes after token "
                    "%d)", path, t->vocab_size, size - pos, t->vocab_size - 1);
    }
    return index_pieces(t, path, err, err_len);
}

/* Read the stop ids and the two system texts that follow the merges of a
 * version 3 file (p[0..rest) is everything after the merges; the header gave
 * the counts). Returns 0, or -1 with a message. */
static int read_chat_fields(Tokenizer *t, const char *path, const unsigned char *p, size_t rest, int n_stop,
                            int default_len, int prefix_len, char *err, size_t err_len) {
    size_t need = 4 * (size_t)n_stop + (size_t)default_len + (size_t)prefix_len;
    if (rest < need)
        return fail(err, err_len, "tokenizer %s: truncated: %zu of the %zu bytes of stop ids and system texts "
                    "after the merges", path, rest, need);
    if (rest > need)
        return fail(err, err_len, "tokenizer %s: %zu trailing bytes after the system texts", path, rest - need);
    t->stop_ids = malloc(((size_t)n_stop + 1) * sizeof(int));
    t->system_default = malloc((size_t)default_len + 1);
    t->system_prefix = malloc((size_t)prefix_len + 1);
    if (!t->stop_ids || !t->system_default || !t->system_prefix)
        return fail(err, err_len, "tokenizer %s: out of memory", path);
    for (int k = 0; k < n_stop; k++) {
        int32_t id = read_le_i32(p + 4 * (size_t)k);
        if (id < 0 || id >= t->vocab_size)
            return fail(err, err_len, "tokenizer %s: stop id %d is %ld, outside 0..%d", path, k, (long)id,
                        t->vocab_size - 1);
        for (int j = 0; j < k; j++)
            if (t->stop_ids[j] == id)
                return fail(err, err_len, "tokenizer %s: stop id %d repeats stop id %d (%ld)", path, k, j, (long)id);
        t->stop_ids[k] = id;
    }
    t->n_stop = n_stop;
    const unsigned char *text = p + 4 * (size_t)n_stop;
    if (memchr(text, 0, (size_t)default_len + (size_t)prefix_len))
        return fail(err, err_len, "tokenizer %s: a system text holds a NUL byte", path);
    memcpy(t->system_default, text, (size_t)default_len);
    t->system_default[default_len] = '\0';
    memcpy(t->system_prefix, text + default_len, (size_t)prefix_len);
    t->system_prefix[prefix_len] = '\0';
    return 0;
}

/* Fill t from a version 2 or 3 ("LTOK") file image data[0..size): the header
 * (tokenizer.h gives its fields), the pieces, the merges and (version 3) the stop
 * ids and system texts. bos_id and eos_id are the checkpoint's; the file's
 * must be the same or -1. Returns 0, or -1 with a message. */
static int parse_ltok(Tokenizer *t, const char *path, const unsigned char *data, size_t size, int bos_id, int eos_id,
                      char *err, size_t err_len) {
    if (size < TOK_HEADER_BYTES)
        return fail(err, err_len, "tokenizer %s: truncated: only %zu of the %d header bytes", path, size,
                    TOK_HEADER_BYTES);
    int32_t version = read_le_i32(data + 4), type = read_le_i32(data + 8), pre = read_le_i32(data + 12);
    int32_t n_tokens = read_le_i32(data + 16), n_merges = read_le_i32(data + 20), add_bos = read_le_i32(data + 40);
    if (version != 2 && version != TOK_VERSION)
        return fail(err, err_len, "tokenizer %s: version %ld, expected 2 or %d", path, (long)version, TOK_VERSION);
    if (type < 0 || type >= TOK_N_TYPES)
        return fail(err, err_len, "tokenizer %s: type %ld, expected 0 (sentencepiece) or 1 (byte-level BPE)", path,
                    (long)type);
    if (pre < 0 || pre >= PRE_N_TYPES || (type == TOK_SENTENCEPIECE && pre != PRE_NONE))
        return fail(err, err_len, "tokenizer %s: pre %ld, expected %s", path, (long)pre,
                    type == TOK_SENTENCEPIECE ? "0 (none) for a sentencepiece vocabulary" : "0..4");
    if (n_tokens != t->vocab_size)
        return fail(err, err_len, "tokenizer %s: holds %ld tokens but the model has vocab_size %d", path,
                    (long)n_tokens, t->vocab_size);
    if (n_merges < 0 || n_merges > TOKENIZER_MAX_MERGES || (type == TOK_SENTENCEPIECE && n_merges != 0))
        return fail(err, err_len, "tokenizer %s: n_merges %ld, expected %s", path, (long)n_merges,
                    type == TOK_SENTENCEPIECE ? "0 for a sentencepiece vocabulary" : "0..268435456");
    static const char *const id_names[4] = {"bos_id", "eos_id", "eot_id", "pad_id"};
    int32_t ids[4];
    for (int k = 0; k < 4; k++) {
        ids[k] = read_le_i32(data + 24 + 4 * k);
        if (ids[k] < -1 || ids[k] >= n_tokens)
            return fail(err, err_len, "tokenizer %s: %s %ld is outside -1..%ld", path, id_names[k], (long)ids[k],
                        (long)n_tokens - 1);
    }
    const int checkpoint_ids[2] = {bos_id, eos_id};
    for (int k = 0; k < 2; k++)
        if (ids[k] != -1 && ids[k] != checkpoint_ids[k])
            return fail(err, err_len, "tokenizer %s: %s %ld disagrees with the checkpoint's %d", path, id_names[k],
                        (long)ids[k], checkpoint_ids[k]);
    if (add_bos != 0 && add_bos != 1)
        return fail(err, err_len, "tokenizer %s: add_bos %ld, expected 0 or 1", path, (long)add_bos);
    for (int k = version == 2 ? 44 : 60; k < TOK_HEADER_BYTES; k++)
        if (data[k] != 0)
            return fail(err, err_len, "tokenizer %s: reserved header byte %d is 0x%02X, expected 0", path, k, data[k]);
    // Version 3's chat fields (zero in version 2).
    int32_t chat = read_le_i32(data + 44), n_stop = read_le_i32(data + 48);
    int32_t default_len = read_le_i32(data + 52), prefix_len = read_le_i32(data + 56);
    if (chat < 0 || chat >= CHAT_N_TEMPLATES)
        return fail(err, err_len, "tokenizer %s: chat_template %ld, expected 0..%d", path, (long)chat,
                    CHAT_N_TEMPLATES - 1);
    if (n_stop < 0 || n_stop > TOK_MAX_STOP)
        return fail(err, err_len, "tokenizer %s: n_stop %ld, expected 0..%d", path, (long)n_stop, TOK_MAX_STOP);
    if (default_len < 0 || default_len > TOK_MAX_SYSTEM || prefix_len < 0 || prefix_len > TOK_MAX_SYSTEM)
        return fail(err, err_len, "tokenizer %s: system text lengths %ld and %ld, expected 0..%d each", path,
                    (long)default_len, (long)prefix_len, TOK_MAX_SYSTEM);

    t->version = version;
    t->type = type;
    t->pre = pre;
    t->eot_id = ids[2];
    t->pad_id = ids[3];
    t->add_bos = add_bos;
    t->chat_template = chat;
    size_t pos = TOK_HEADER_BYTES;
    if (read_pieces(t, path, data, size, &pos, TOKENIZER_MAX_PIECE_BYTES, err, err_len) != 0) return -1;
    if (index_pieces(t, path, err, err_len) != 0) return -1;
    if (read_merges(t, path, data + pos, size - pos, n_merges, err, err_len) != 0) return -1;
    pos += 8 * (size_t)n_merges;
    if (version == 2) // the file ends here; tokenizer_build sets the default stop ids
        return pos == size ? 0 : fail(err, err_len, "tokenizer %s: %zu trailing bytes after the last %s", path,
                                      size - pos, n_merges > 0 ? "merge" : "token");
    return read_chat_fields(t, path, data + pos, size - pos, n_stop, default_len, prefix_len, err, err_len);
}

/* Versions 1 and 2 name no stop ids: stop at EOS and end of turn (those that
 * exist), with no system texts. Returns 0, or -1 with a message. */
static int default_chat_fields(Tokenizer *t, const char *path, char *err, size_t err_len) {
    t->stop_ids = malloc(2 * sizeof(int));
    t->system_default = calloc(1, 1);
    t->system_prefix = calloc(1, 1);
    if (!t->stop_ids || !t->system_default || !t->system_prefix)
        return fail(err, err_len, "tokenizer %s: out of memory", path);
    t->n_stop = 0;
    if (t->eos_id >= 0) t->stop_ids[t->n_stop++] = t->eos_id;
    if (t->eot_id >= 0 && t->eot_id != t->eos_id) t->stop_ids[t->n_stop++] = t->eot_id;
    return 0;
}

/* Empty t: no memory held, every id "none". */
static void tokenizer_clear(Tokenizer *t) {
    memset(t, 0, sizeof *t);
    t->byte_offset = -1;
    t->unk_id = -1;
    t->bos_id = t->eos_id = t->eot_id = t->pad_id = -1;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
}

/* Fill t from a tokenizer file image data[0..size): an "LTOK" file (version 2
 * or 3) when it starts with the magic "LTOK", else a version 1
 * tokenizer.bin. name is the file as the messages call it. bos_id and
 * eos_id (the checkpoint's) must be valid ids, or -1 for "this model has
 * none". Returns 0, or -1 with t empty and a message. */
static int build_from_image(Tokenizer *t, const char *name, const unsigned char *data, size_t size, int vocab_size,
                            int bos_id, int eos_id, char *err, size_t err_len) {
    t->vocab_size = vocab_size;
    t->bos_id = bos_id;
    t->eos_id = eos_id;
    int rc = size >= 4 && (uint32_t)read_le_i32(data) == TOK_MAGIC
                 ? parse_ltok(t, name, data, size, bos_id, eos_id, err, err_len)
                 : parse_version1(t, name, data, size, err, err_len);
    if (rc == 0 && t->version < 3) rc = default_chat_fields(t, name, err, err_len);
    if (rc != 0) {
        tokenizer_free(t);
        return -1;
    }
    return 0;
}

/* The checkpoint's side of a load: a vocabulary size and ids inside it. */
static int check_model_ids(const char *name, int vocab_size, int bos_id, int eos_id, char *err, size_t err_len) {
    if (vocab_size <= 0) return fail(err, err_len, "tokenizer %s: invalid vocab_size %d", name, vocab_size);
    if (bos_id < -1 || bos_id >= vocab_size || eos_id < -1 || eos_id >= vocab_size)
        return fail(err, err_len, "tokenizer %s: bos_id %d / eos_id %d outside the vocabulary of %d tokens", name,
                    bos_id, eos_id, vocab_size);
    return 0;
}

/* Load path as a vocabulary of exactly vocab_size pieces (build_from_image
 * says which formats). Returns 0 on success; on failure returns -1, leaves t
 * empty (safe to tokenizer_free) and writes a one-line message naming the
 * file to err. Never aborts on bad input. */
int tokenizer_build(Tokenizer *t, const char *path, int vocab_size, int bos_id, int eos_id, char *err,
                    size_t err_len) {
    tokenizer_clear(t);
    const char *name = shown_path(path); // the path as the messages show it (the parse functions' `path`)
    if (check_model_ids(name, vocab_size, bos_id, eos_id, err, err_len) != 0) return -1;
    size_t size;
    char *data = read_file(path, "tokenizer", &size, err, err_len);
    if (!data) return -1;
    int rc = build_from_image(t, shown_path(path), (const unsigned char *)data, size, vocab_size, bos_id, eos_id,
                              err, err_len);
    free(data);
    return rc;
}

int tokenizer_build_bytes(Tokenizer *t, const char *name, const unsigned char *data, size_t size, int vocab_size,
                          int bos_id, int eos_id, char *err, size_t err_len) {
    tokenizer_clear(t);
    if (check_model_ids(name, vocab_size, bos_id, eos_id, err, err_len) != 0) return -1;
    return build_from_image(t, name, data, size, vocab_size, bos_id, eos_id, err, err_len);
}

/* Release everything tokenizer_build allocated; t is left empty, so calling
 * this twice, or after a failed build, is harmless. */
void tokenizer_free(Tokenizer *t) {
    free(t->vocab);
    free(t->vocab_len);
    free(t->scores);
    free(t->kind);
    free(t->sorted_ids);
    free(t->merges);
    free(t->special_ids);
    free(t->piece_storage);
    free(t->stop_ids);
    free(t->system_default);
    free(t->system_prefix);
    tokenizer_clear(t);
}

/* "sentencepiece" or "byte-level BPE (PRE)", PRE naming the pre-tokenizer. */
const char *tokenizer_type_name(const Tokenizer *t) {
    static const char *const byte_level[PRE_N_TYPES] = {"byte-level BPE (no pre-tokenizer)", "byte-level BPE (gpt2)",
                                                        "byte-level BPE (llama3)", "byte-level BPE (qwen2)",
                                                        "byte-level BPE (smollm)"};
    if (t->type == TOK_BYTE_BPE && t->pre >= 0 && t->pre < PRE_N_TYPES) return byte_level[t->pre];
    return "sentencepiece";
}

/* ==========================================================================
 * 3. UTF-8 rules shared by the encoder (splitting, U+FFFD) and the decoder
 *    (streaming)
 *
 * A well-formed sequence (RFC 3629) is one of
 *   00..7F
 *   C2..DF 80..BF
 *   E0 A0..BF 80..BF | E1..EC 80..BF 80..BF | ED 80..9F 80..BF | EE..EF 80..BF 80..BF
 *   F0 90..BF 80..BF 80..BF | F1..F3 80..BF x3 | F4 80..8F 80..BF 80..BF
 * which excludes overlong forms, UTF-16 surrogates and values above U+10FFFF.
 * ========================================================================== */

/* U+FFFD REPLACEMENT CHARACTER in UTF-8. */
static const char utf8_replacement[3] = {'\xEF', '\xBF', '\xBD'};

/* Length of the sequence a lead byte announces: 1..4, or 0 for a byte that
 * cannot start one (a continuation byte, C0, C1, F5..FF). */
static int utf8_sequence_length(unsigned char lead) {
    if (lead < 0x80) return 1;
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    return 0;
}

/* Whether b may stand at position index (1..3) of a sequence led by lead. */
static int utf8_continuation_ok(unsigned char lead, int index, unsigned char b) {
    unsigned char lo = 0x80, hi = 0xBF;
    if (index == 1) {
        if (lead == 0xE0) lo = 0xA0;
        else if (lead == 0xED) hi = 0x9F;
        else if (lead == 0xF0) lo = 0x90;
        else if (lead == 0xF4) hi = 0x8F;
    }
    return b >= lo && b <= hi;
}

/* How many bytes of s[0..n) (n >= 1) belong to the sequence its first byte
 * starts: the whole code point when well-formed (*complete = 1), else the
 * maximal invalid subsequence (*complete = 0): the lead byte and the
 * continuation bytes that fit it, at least 1. */
static int utf8_prefix_length(const unsigned char *s, size_t n, int *complete) {
    int need = utf8_sequence_length(s[0]), k = 1;
    while (k < need && (size_t)k < n && utf8_continuation_ok(s[0], k, s[k])) k++;
    *complete = need > 0 && k == need;
    return k;
}

/* Length of the well-formed code point at s[0..n) (n >= 1), or 1 when the
 * bytes there are not one: an invalid byte is a one-byte symbol. */
static int utf8_char_length(const unsigned char *s, size_t n) {
    int complete, len = utf8_prefix_length(s, n, &complete);
    return complete ? len : 1;
}

/* Whether s[0..n) is all well-formed UTF-8. */
static int utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int complete, len = utf8_prefix_length(s + i, n - i, &complete);
        if (!complete) return 0;
        i += (size_t)len;
    }
    return 1;
}

/* Copy s[0..n) to out (room for 3 n bytes) as valid UTF-8: each maximal
 * invalid subsequence becomes one U+FFFD, as Python's
 * bytes.decode("utf-8", "replace") does. Returns the bytes written. */
static size_t utf8_sanitize(const unsigned char *s, size_t n, char *out) {
    size_t written = 0;
    for (size_t i = 0; i < n;) {
        int complete, len = utf8_prefix_length(s + i, n - i, &complete);
        memcpy(out + written, complete ? (const char *)s + i : utf8_replacement, complete ? (size_t)len : 3);
        written += complete ? (size_t)len : 3;
        i += (size_t)len;
    }
    return written;
}

int utf8_length(const char *s, size_t n) {
    int complete, len = utf8_prefix_length((const unsigned char *)s, n, &complete);
    return complete ? len : 0;
}

/* ==========================================================================
 * 4. Pre-tokenizers (type 1): the regular expressions, by hand
 *
 * Hugging Face's tokenizers splits text with one of these expressions (find
 * every match left to right; every character is in some match):
 *   PRE_GPT2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   PRE_LLAMA3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
 *               | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   PRE_QWEN2   as PRE_LLAMA3 with \p{N} (one digit) for \p{N}{1,3}
 *   PRE_SMOLLM  first every \p{N} alone (the Digits pre-tokenizer), then
 *               PRE_GPT2 within the text between them
 * Alternation is ordered: at a position the first alternative that matches
 * wins, not the longest. Each piece_end function below returns where the
 * match at i ends, trying the alternatives in that order. Two behaviours
 * need care:
 *   - \s+(?!\S) backtracks: a run of white space followed by a non-space
 *     leaves its last character to start the next match (" world" keeps its
 *     space), unless the run is one character (then \s+ takes it) or ends
 *     the text (then the whole run matches);
 *   - \s*[\r\n]+ takes the run of white space up to its last \r or \n.
 * (?i:...) folds case as Unicode does: besides ASCII, 'ſ' (U+017F, long s)
 * matches 's', and nothing else folds to a letter of the contractions (the
 * Kelvin sign folds to k, which none has).
 * The classes (letter, number, white space, other) come from
 * unicode_tables.h; \s is Unicode's White_Space property, so U+0085, U+00A0,
 * U+1680, U+2028 and U+3000 are spaces while U+180E, U+200B and U+001C..U+001F
 * are not.
 * ========================================================================== */

/* One code point of the text: its value, its length in bytes, its class
 * (UC_OTHER .. UC_SPACE, or -1 past the end). */
typedef struct {
    uint32_t cp;
    int len;
    int cls;
} CodePoint;

/* Class of code point cp: the last range of unicode_tables.h that starts at
 * or before cp (binary search over about 1500 ranges). */
static int unicode_class(uint32_t cp) {
    int lo = 0, hi = UNICODE_N_RANGES - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (unicode_class_ranges[mid] >> 2 <= cp) lo = mid;
        else hi = mid - 1;
    }
    return (int)(unicode_class_ranges[lo] & 3);
}

/* The code point at s[i] of the text s[0..end); cls -1 when i == end. The
 * text is valid UTF-8 (utf8_sanitize); a stray invalid byte would read as a
 * one-byte UC_OTHER. */
static CodePoint code_point_at(const unsigned char *s, size_t i, size_t end) {
    CodePoint c = {0, 0, -1};
    if (i >= end) return c;
    c.len = utf8_char_length(s + i, end - i);
    if (c.len == 1) {
        c.cp = s[i];
        c.cls = s[i] < 0x80 ? unicode_class(c.cp) : UC_OTHER;
        return c;
    }
    c.cp = s[i] & (0x7F >> c.len);
    for (size_t k = 1; k < (size_t)c.len; k++) c.cp = c.cp << 6 | (s[i + k] & 0x3Fu);
    c.cls = unicode_class(c.cp);
    return c;
}

/* End of the run of class cls that starts at i (i when s[i] is not in it). */
static size_t skip_class(const unsigned char *s, size_t i, size_t end, int cls) {
    for (;;) {
        CodePoint c = code_point_at(s, i, end);
        if (c.cls != cls) return i;
        i += (size_t)c.len;
    }
}

/* Length of the contraction 's 't 're 've 'm 'll 'd at s[i], or 0. With fold
 * the letters match in either case and 's also as 'ſ, like (?i:...). */
static size_t contraction_length(const unsigned char *s, size_t i, size_t end, int fold) {
    if (s[i] != '\'' || i + 1 >= end) return 0;
    unsigned char a = s[i + 1], b = i + 2 < end ? s[i + 2] : 0;
    if (fold) {
        if (a == 0xC5 && b == 0xBF) return 3; // 'ſ: U+017F folds to s
        if (a >= 'A' && a <= 'Z') a = (unsigned char)(a - 'A' + 'a');
        if (b >= 'A' && b <= 'Z') b = (unsigned char)(b - 'A' + 'a');
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (((a == 'r' || a == 'v') && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* End of the match of a white-space run at i: with newlines, \s*[\r\n]+ first
 * (the run up to its last \r or \n); then \s+(?!\S), then \s+. */
static size_t space_piece_end(const unsigned char *s, size_t i, size_t end, int newlines) {
    size_t j = i, last = i, after_newline = 0;
    for (;;) {
        CodePoint c = code_point_at(s, j, end);
        if (c.cls != UC_SPACE) break;
        last = j;
        j += (size_t)c.len;
        if (c.cp == '\r' || c.cp == '\n') after_newline = j;
    }
    if (newlines && after_newline > 0) return after_newline;
    return j == end || last == i ? j : last;
}

/* End of the PRE_GPT2 match at i (i < end). */
static size_t gpt2_piece_end(const unsigned char *s, size_t i, size_t end) {
    size_t n = contraction_length(s, i, end, 0);
    if (n > 0) return i + n;
    CodePoint c = code_point_at(s, i, end);
    if (c.cp == ' ') { // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+' with the space
        CodePoint d = code_point_at(s, i + 1, end);
        if (d.cls >= 0 && d.cls != UC_SPACE) return skip_class(s, i + 1, end, d.cls);
    }
    if (c.cls != UC_SPACE) return skip_class(s, i, end, c.cls);
    return space_piece_end(s, i, end, 0);
}

/* End of the PRE_LLAMA3 (max_digits 3) or PRE_QWEN2 (max_digits 1) match at
 * i (i < end). */
static size_t llama3_piece_end(const unsigned char *s, size_t i, size_t end, int max_digits) {
    size_t n = contraction_length(s, i, end, 1);
    if (n > 0) return i + n;
    CodePoint c = code_point_at(s, i, end);
    size_t next = i + (size_t)c.len;
    CodePoint d = code_point_at(s, next, end);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c.cls == UC_LETTER) return skip_class(s, i, end, UC_LETTER);
    if (c.cls != UC_NUMBER && c.cp != '\r' && c.cp != '\n' && d.cls == UC_LETTER)
        return skip_class(s, next, end, UC_LETTER);
    // \p{N}{1,max_digits}
    if (c.cls == UC_NUMBER) {
        for (int k = 1; k < max_digits && d.cls == UC_NUMBER; k++) {
            next += (size_t)d.len;
            d = code_point_at(s, next, end);
        }
        return next;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    if (c.cls == UC_OTHER || (c.cp == ' ' && d.cls == UC_OTHER)) {
        size_t j = skip_class(s, c.cls == UC_OTHER ? i : next, end, UC_OTHER);
        while (j < end && (s[j] == '\r' || s[j] == '\n')) j++;
        return j;
    }
    return space_piece_end(s, i, end, 1);
}

/* End of the match at i (i < end) of pre-tokenizer pre, for text that holds
 * no \p{N} when pre is PRE_SMOLLM (pre_token_next splits the numbers off). */
static size_t piece_end(int pre, const unsigned char *s, size_t i, size_t end) {
    switch (pre) {
    case PRE_GPT2:
    case PRE_SMOLLM: return gpt2_piece_end(s, i, end);
    case PRE_LLAMA3: return llama3_piece_end(s, i, end, 3);
    case PRE_QWEN2: return llama3_piece_end(s, i, end, 1);
    default: return end; // PRE_NONE: the whole text is one pre-token
    }
}

/* A pre-tokenizer walking the valid UTF-8 text s[0..n), one pre-token per
 * pre_token_next call. */
typedef struct {
    int pre;                // PRE_NONE .. PRE_SMOLLM
    const unsigned char *s; // the text
    size_t n;               // its length in bytes
    size_t pos;             // where the next pre-token starts
    size_t limit;           // where the current match scan stops: n, or PRE_SMOLLM's next number
} PreTokens;

/* A PreTokens for pre-tokenizer pre at the start of s[0..n). */
static PreTokens pre_tokens(int pre, const unsigned char *s, size_t n) {
    PreTokens p = {pre, s, n, 0, pre == PRE_SMOLLM ? 0 : n};
    return p;
}

/* End of the next pre-token (it starts where the previous one ended), or 0
 * when the text is used up. PRE_SMOLLM first cuts each number off alone
 * (tokenizers' Digits), then matches GPT-2's expression in the text between
 * them. Over the whole text O(n): each code point is read a bounded number
 * of times. */
static size_t pre_token_next(PreTokens *p) {
    if (p->pos >= p->n) return 0;
    if (p->pos >= p->limit) { // PRE_SMOLLM, at a number or at the start of a run without one
        CodePoint c = code_point_at(p->s, p->pos, p->n);
        if (c.cls == UC_NUMBER) return p->pos += (size_t)c.len;
        for (p->limit = p->pos; p->limit < p->n;) {
            CodePoint d = code_point_at(p->s, p->limit, p->n);
            if (d.cls == UC_NUMBER) break;
            p->limit += (size_t)d.len;
        }
    }
    return p->pos = piece_end(p->pre, p->s, p->pos, p->limit);
}

/* ==========================================================================
 * 5. Encoding: symbols -> BPE merges through a heap of candidate pairs -> ids
 *
 * Both types share the BPE loop (merge_symbols). Type 0 runs it once over
 * the whole text's code points. Type 1 (encode_byte_level) goes: U+FFFD for
 * invalid UTF-8 (a copy only when needed) -> special pieces matched at the
 * bytes that may start one (match_special) -> for the text between them,
 * pre-tokens (section 4) -> for each pre-token, its bytes' one-byte pieces
 * -> merge_symbols by rank -> ids. A pre-token of m bytes costs O(m log m)
 * (at most m - 1 merges, each popping and pushing O(1) heap entries, each
 * candidate looked up in O(1) expected time in the merge table), so n bytes
 * cost O(n log n) however they split; the scratch space grows to the
 * longest pre-token and is reused.
 * ========================================================================== */

/* One node of the symbol list: the text bytes [start, start+len) of the
 * working buffer (type 1: len counts the bytes joined into it, which skip
 * bytes without a piece). len == 0 marks a node merged into its left
 * neighbour. */
typedef struct {
    int start, len;
    int prev, next; // neighbours in the list, -1 at the ends
    int id;         // piece id, or -1 for a type 0 symbol that is no piece
} Symbol;

/* A candidate merge of symbols left and right (adjacent when pushed). */
typedef struct {
    double key; // type 0: score of the joined piece; type 1: minus the merge's rank
    int left, right;
    int len; // left.len + right.len when pushed; detects stale entries
    int id;  // id of the joined piece
} MergePair;

typedef struct {
    MergePair *items;
    size_t n, cap;
} MergeHeap;

/* Heap order: a before b when a has the higher key (the higher score, or the
 * lower rank), or the same key and lies further left (a smaller symbol index
 * is further left, because a merge keeps the left symbol's index). This is
 * sentencepiece's order and tokenizers' order. */
static int pair_before(const MergePair *a, const MergePair *b) {
    if (a->key != b->key) return a->key > b->key;
    return a->left < b->left;
}

/* Push p, growing the array as needed. Returns 0, or -1 out of memory. */
static int heap_push(MergeHeap *h, MergePair p) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        MergePair *bigger = realloc(h->items, cap * sizeof *bigger);
        if (!bigger) return -1;
        h->items = bigger;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) { // sift up
        size_t parent = (i - 1) / 2;
        if (!pair_before(&p, &h->items[parent])) break;
        h->items[i] = h->items[parent];
        i = parent;
    }
    h->items[i] = p;
    return 0;
}

/* Remove and return the first pair; the heap must not be empty. */
static MergePair heap_pop(MergeHeap *h) {
    MergePair top = h->items[0];
    MergePair last = h->items[--h->n];
    size_t i = 0;
    for (;;) { // sift down
        size_t child = 2 * i + 1;
        if (child >= h->n) break;
        if (child + 1 < h->n && pair_before(&h->items[child + 1], &h->items[child])) child++;
        if (!pair_before(&h->items[child], &last)) break;
        h->items[i] = h->items[child];
        i = child;
    }
    if (h->n > 0) h->items[i] = last;
    return top;
}

/* If symbols left and right (adjacent) may merge, push that candidate: type
 * 0 when their bytes joined are a normal piece, type 1 when the merges hold
 * the pair of their ids. Returns 0, or -1 out of memory. */
static int push_pair_if_merge(const Tokenizer *t, const char *buf, const Symbol *sym, int left, int right,
                              MergeHeap *h) {
    if (left < 0 || right < 0) return 0;
    MergePair p = {0, left, right, sym[left].len + sym[right].len, -1};
    if (t->type == TOK_BYTE_BPE) {
        const MergeRule *m = find_merge(t, sym[left].id, sym[right].id);
        if (!m) return 0;
        p.key = -(double)m->rank;
        p.id = m->result;
    } else {
        if (p.len > t->max_token_length) return 0; // no piece is that long
        p.id = lookup_piece(t, buf + sym[left].start, p.len);
        if (p.id < 0) return 0;
        p.key = t->scores[p.id];
    }
    return heap_push(h, p);
}

/* Run BPE over the list sym[0..n_sym) (in text order, linked through
 * prev/next): repeatedly join the best candidate pair until none is left.
 * Returns 0, or -1 out of memory. */
static int merge_symbols(const Tokenizer *t, const char *buf, Symbol *sym, int n_sym, MergeHeap *heap) {
    heap->n = 0;
    for (int i = 0; i + 1 < n_sym; i++)
        if (push_pair_if_merge(t, buf, sym, i, i + 1, heap) != 0) return -1;
    while (heap->n > 0) {
        MergePair p = heap_pop(heap);
        Symbol *l = &sym[p.left], *r = &sym[p.right];
        if (l->len == 0 || r->len == 0 || l->next != p.right || l->len + r->len != p.len)
            continue; // stale: a neighbour changed since this pair was pushed
        l->len = p.len;
        l->id = p.id;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = p.left;
        r->len = 0;
        if (push_pair_if_merge(t, buf, sym, l->prev, p.left, heap) != 0 ||
            push_pair_if_merge(t, buf, sym, p.left, l->next, heap) != 0)
            return -1;
    }
    return 0;
}

/* Type 0: encode text[0..n_bytes) (n_bytes > 0) the way sentencepiece does
 * (the steps at the top of this file), appending ids to tokens at
 * *n_tokens. Returns 0, or -1 out of memory. */
static int encode_sentencepiece(const Tokenizer *t, const char *text, size_t n_bytes, int *tokens, int *n_tokens) {
    // Working copy with the dummy-prefix space in front.
    int n = (int)n_bytes + 1;
    char *buf = malloc((size_t)n);
    Symbol *sym = malloc((size_t)n * sizeof *sym);
    MergeHeap heap = {NULL, 0, 0};
    int ok = buf && sym;
    if (ok) {
        buf[0] = ' ';
        memcpy(buf + 1, text, n_bytes);
    }

    // Split into code points: the initial symbols.
    int n_sym = 0;
    for (int pos = 0; ok && pos < n; n_sym++) {
        int len = utf8_char_length((const unsigned char *)buf + pos, (size_t)(n - pos));
        sym[n_sym] = (Symbol){pos, len, n_sym - 1, pos + len < n ? n_sym + 1 : -1, lookup_piece(t, buf + pos, len)};
        pos += len;
    }
    if (ok && merge_symbols(t, buf, sym, n_sym, &heap) != 0) ok = 0;

    // Emit ids; unknown symbols fall back to byte pieces (or one <unk> per
    // run of unknown symbols when the vocabulary has no byte pieces, as
    // sentencepiece does).
    int after_unk = 0; // previous symbol was emitted as <unk>
    for (int i = 0; ok && n_sym > 0 && i >= 0; i = sym[i].next) {
        if (sym[i].id >= 0) {
            tokens[(*n_tokens)++] = sym[i].id;
            after_unk = 0;
        } else if (t->byte_offset >= 0) {
            for (int k = 0; k < sym[i].len; k++)
                tokens[(*n_tokens)++] = t->byte_offset + (unsigned char)buf[sym[i].start + k];
        } else {
            if (!after_unk) tokens[(*n_tokens)++] = t->unk_id;
            after_unk = 1;
        }
    }
    free(heap.items);
    free(sym);
    free(buf);
    return ok ? 0 : -1;
}

/* Type 1: length of the longest special piece that s[0..n) starts with (its
 * id to *id), or 0 for none. The special pieces are sorted by bytes, so those
 * sharing the prefix s[0..k) form a range, the one equal to it (if any)
 * first: narrow the range byte by byte, like walking a trie. O(L log S) for
 * S special pieces and a match of L bytes. */
static int match_special(const Tokenizer *t, const char *s, size_t n, int *id) {
    int lo = 0, hi = t->n_special, best = 0;
    for (int k = 0; lo < hi; k++) {
        if (t->vocab_len[t->special_ids[lo]] == k) { // equals s[0..k); the lowest id of equal pieces comes first
            if (k > 0) {
                best = k;
                *id = t->special_ids[lo];
            }
            while (lo < hi && t->vocab_len[t->special_ids[lo]] == k) lo++;
        }
        if ((size_t)k == n) break;
        unsigned char c = (unsigned char)s[k];
        int a = lo, b = hi; // first piece in the range whose byte k is >= c
        while (a < b) {
            int mid = a + (b - a) / 2;
            if ((unsigned char)t->vocab[t->special_ids[mid]][k] < c) a = mid + 1;
            else b = mid;
        }
        lo = a;
        for (b = hi; a < b;) { // first piece whose byte k is > c
            int mid = a + (b - a) / 2;
            if ((unsigned char)t->vocab[t->special_ids[mid]][k] <= c) a = mid + 1;
            else b = mid;
        }
        hi = a;
    }
    return best;
}

/* Scratch space of one type 1 encode, grown to the longest pre-token. */
typedef struct {
    Symbol *sym;    // (cap) the symbols of the current pre-token
    size_t cap;
    MergeHeap heap; // its candidate pairs
} ByteLevelScratch;

/* Type 1: pre-tokenize the valid UTF-8 text buf[from..to) (no special pieces
 * in it) and BPE each pre-token from its one-byte pieces, appending the ids.
 * Returns 0, or -1 out of memory. */
static int encode_segment(const Tokenizer *t, const char *buf, size_t from, size_t to, ByteLevelScratch *w,
                          int *tokens, int *n_tokens) {
    const unsigned char *seg = (const unsigned char *)buf + from;
    PreTokens p = pre_tokens(t->pre, seg, to - from);
    for (size_t start = 0, end; (end = pre_token_next(&p)) > 0; start = end) {
        if (end - start > w->cap) {
            size_t cap = 2 * (end - start);
            Symbol *bigger = realloc(w->sym, cap * sizeof *bigger);
            if (!bigger) return -1;
            w->sym = bigger;
            w->cap = cap;
        }
        if (t->pre == PRE_LLAMA3) { // Llama 3 ignores merges for a pre-token that is a whole piece
            int whole = lookup_piece(t, (const char *)seg + start, (int)(end - start));
            if (whole >= 0) {
                tokens[(*n_tokens)++] = whole;
                continue;
            }
        }
        int m = 0; // symbols: the pre-token's bytes that have a piece (tokenizers drops the others)
        for (size_t j = start; j < end; j++) {
            int id = t->byte_id[seg[j]];
            if (id < 0) continue;
            w->sym[m] = (Symbol){(int)(from + j), 1, m - 1, m + 1, id};
            m++;
        }
        if (m > 0) w->sym[m - 1].next = -1;
        if (m > 1 && merge_symbols(t, buf, w->sym, m, &w->heap) != 0) return -1;
        for (int i = 0; m > 0 && i >= 0; i = w->sym[i].next) tokens[(*n_tokens)++] = w->sym[i].id;
    }
    return 0;
}

/* Type 1: encode text[0..n_bytes) the way tokenizers does (the steps at the
 * top of this file), appending ids to tokens at *n_tokens. Works on the text
 * itself when it is valid UTF-8, else on a copy with U+FFFD. Returns 0, or
 * -1 out of memory. */
static int encode_byte_level(const Tokenizer *t, const char *text, size_t n_bytes, int *tokens, int *n_tokens) {
    char *copy = NULL;
    const char *buf = text;
    size_t n = n_bytes;
    if (!utf8_valid((const unsigned char *)text, n_bytes)) {
        copy = malloc(3 * n_bytes);
        if (!copy) return -1;
        n = utf8_sanitize((const unsigned char *)text, n_bytes, copy);
        buf = copy;
    }
    ByteLevelScratch w = {NULL, 0, {NULL, 0, 0}};
    int rc = 0;
    size_t from = 0; // start of the text not yet encoded
    for (size_t i = 0; rc == 0 && i < n;) {
        int id = -1, len = t->special_lead[(unsigned char)buf[i]] ? match_special(t, buf + i, n - i, &id) : 0;
        if (len == 0) {
            i += (size_t)utf8_char_length((const unsigned char *)buf + i, n - i);
            continue;
        }
        rc = encode_segment(t, buf, from, i, &w, tokens, n_tokens);
        tokens[(*n_tokens)++] = id;
        i += (size_t)len;
        from = i;
    }
    if (rc == 0) rc = encode_segment(t, buf, from, n, &w, tokens, n_tokens);
    free(w.heap.items);
    free(w.sym);
    free(copy);
    return rc;
}

/* Upper bound on the ids tokenizer_encode writes for n_bytes of text: at
 * most 3 per byte (type 1 turns an invalid byte into U+FFFD, bytes EF BF BD,
 * which may stay three one-byte pieces; type 0 writes at most one per byte),
 * plus the dummy-prefix space, BOS and EOS. */
size_t tokenizer_bound(size_t n_bytes) {
    return 3 * n_bytes + 3;
}

/* Encode text[0..n_bytes) (any bytes, NUL included; not NUL-terminated) into
 * tokens, which must hold tokenizer_bound(n_bytes) ids. With add_bos / add_eos
 * the ids bos_id / eos_id are put first / last (when the model has them).
 * Returns the number of ids, or -1 when out of memory or when the text is too
 * long for an int count. See the comment at the top of this file for the
 * algorithm. */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t n_bytes, int add_bos, int add_eos, int *tokens) {
    if (n_bytes > ((size_t)INT_MAX - 3) / 3) return -1;
    int n_tokens = 0;
    if (add_bos && t->bos_id >= 0) tokens[n_tokens++] = t->bos_id;
    if (n_bytes > 0) {
        int rc = t->type == TOK_BYTE_BPE ? encode_byte_level(t, text, n_bytes, tokens, &n_tokens)
                                         : encode_sentencepiece(t, text, n_bytes, tokens, &n_tokens);
        if (rc != 0) return -1;
    }
    if (add_eos && t->eos_id >= 0) tokens[n_tokens++] = t->eos_id;
    return n_tokens;
}

/* Whether a long text may be encoded in pieces cut at a space between two
 * ASCII letters ("x y") with the same ids as one encode of the whole. Type 0
 * merges only into pieces of the vocabulary, so no token can reach across the
 * cut when no piece holds a space after something other than a space ("x ",
 * "a b"; a run of leading spaces is fine); the part after the cut is encoded
 * without its space, which the dummy prefix puts back. Type 1: every
 * pre-tokenizer ends a pre-token before such a space, so only a special piece
 * with a space in it could reach across. */
static int can_cut_at_spaces(const Tokenizer *t) {
    for (int id = 0; id < t->vocab_size; id++) {
        const char *p = t->vocab[id];
        int len = t->vocab_len[id];
        int special = t->kind[id] == PIECE_SPECIAL;
        if (t->type == TOK_BYTE_BPE ? special && memchr(p, ' ', (size_t)len) : t->kind[id] == PIECE_NORMAL)
            for (int i = 1; i < len; i++)
                if (p[i] == ' ' && (t->type == TOK_BYTE_BPE || p[i - 1] != ' ')) return 0;
    }
    return 1;
}

static int ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* Encode a long text (no BOS, no EOS) in pieces of about `chunk` bytes, each
 * cut at a space between two ASCII letters where the vocabulary cannot join
 * tokens across it (can_cut_at_spaces), so the ids equal tokenizer_encode's for
 * the whole text while the work buffers stay the size of one piece. Without
 * such cuts the text is encoded whole. *ids (grown with realloc; caller frees)
 * receives the ids; progress(done, total), when not NULL, is called with the
 * bytes encoded so far after each piece. Returns the number of ids, or -1 out
 * of memory. */
int tokenizer_encode_long(const Tokenizer *t, const char *text, size_t n_bytes, size_t chunk, int **ids,
                          void (*progress)(size_t done, size_t total)) {
    int cut = chunk > 0 && n_bytes > chunk && can_cut_at_spaces(t);
    size_t cap = 0, n = 0, at = 0;
    int *out = NULL, *scratch = NULL;
    while (at < n_bytes) {
        size_t end = n_bytes;
        if (cut && n_bytes - at > chunk) { // the first "x y" after at + chunk
            end = at + chunk;
            while (end + 1 < n_bytes && !(text[end] == ' ' && ascii_letter(text[end - 1]) && ascii_letter(text[end + 1])))
                end++;
            if (end + 1 >= n_bytes) end = n_bytes;
        }
        // Type 0: the part after a cut starts after its space (the dummy prefix restores it).
        size_t from = at > 0 && t->type == TOK_SENTENCEPIECE ? at + 1 : at;
        int *more = realloc(scratch, tokenizer_bound(end - from) * sizeof(int));
        if (!more) goto out_of_memory;
        scratch = more;
        int k = tokenizer_encode(t, text + from, end - from, 0, 0, scratch);
        if (k < 0 || n + (size_t)k > (size_t)INT_MAX) goto out_of_memory;
        if (n + (size_t)k > cap) {
            size_t want = cap * 2 > n + (size_t)k ? cap * 2 : n + (size_t)k;
            if (!(more = realloc(out, want * sizeof(int)))) goto out_of_memory;
            out = more, cap = want;
        }
        memcpy(out + n, scratch, (size_t)k * sizeof(int));
        n += (size_t)k;
        at = end;
        if (progress) progress(at, n_bytes);
    }
    free(scratch);
    *ids = out;
    return (int)n;
out_of_memory:
    free(scratch);
    free(out);
    *ids = NULL;
    return -1;
}

/* ==========================================================================
 * 6. Decoding: ids -> bytes, whole UTF-8 code points only
 * ========================================================================== */

/* Upper bound on the bytes one tokenizer_decode (or tokenizer_decode_flush)
 * call writes, terminating NUL included: every input byte, the up to 3 held
 * in the state plus the piece's, becomes at most 3 output bytes (U+FFFD). */
size_t tokenizer_decode_bound(const Tokenizer *t) {
    size_t piece = t->max_token_length > 0 ? (size_t)t->max_token_length : 1;
    return 3 * (3 + piece) + 1;
}

/* Write U+FFFD for each byte held in st and clear it. Returns bytes written. */
static size_t flush_pending(DecodeState *st, char *out) {
    size_t n = 0;
    for (int k = 0; k < st->n_pending; k++) {
        memcpy(out + n, utf8_replacement, 3);
        n += 3;
    }
    st->n_pending = 0;
    return n;
}

/* Feed one byte to the streaming UTF-8 check. Writes a whole code point once
 * its last byte arrives, U+FFFD for each byte that cannot be part of a valid
 * sequence, and nothing while a sequence is still incomplete. Returns bytes
 * written. */
static size_t feed_byte(DecodeState *st, unsigned char b, char *out) {
    size_t n = 0;
    if (st->n_pending > 0) {
        unsigned char lead = st->pending[0];
        if (utf8_continuation_ok(lead, st->n_pending, b)) {
            st->pending[st->n_pending++] = b;
            if (st->n_pending == utf8_sequence_length(lead)) {
                memcpy(out, st->pending, (size_t)st->n_pending);
                n = (size_t)st->n_pending;
                st->n_pending = 0;
            }
            return n;
        }
        // The held bytes can never complete: replace them, then treat b as
        // the start of something new.
        n = flush_pending(st, out);
    }
    int need = utf8_sequence_length(b);
    if (need == 1) {
        out[n++] = (char)b;
    } else if (need == 0) {
        memcpy(out + n, utf8_replacement, 3);
        n += 3;
    } else {
        st->pending[0] = b;
        st->n_pending = 1;
    }
    return n;
}

/* Append the text of token (which follows prev in the stream) to out, which
 * must hold tokenizer_decode_bound(t) bytes, and NUL-terminate it. Type 0: a
 * byte piece "<0xHH>" stands for the raw byte HH, and after BOS a leading
 * space of a normal piece is dropped (it is the dummy prefix encoding added).
 * Type 1: a piece is its bytes (special pieces print their text), except a
 * BOS the tokenizer adds itself (add_bos), which prints nothing. Only whole
 * UTF-8 code points are written (see feed_byte); st carries an incomplete
 * sequence over to the next call and must start zeroed. Returns the number
 * of bytes written, not counting the NUL; 0 for an out-of-range token. */
size_t tokenizer_decode(const Tokenizer *t, DecodeState *st, int prev, int token, char *out) {
    out[0] = '\0';
    if (token < 0 || token >= t->vocab_size || (t->type == TOK_BYTE_BPE && token == t->bos_id && t->add_bos)) return 0;
    const unsigned char *piece = (const unsigned char *)t->vocab[token];
    int len = t->vocab_len[token];
    unsigned char raw;
    if (t->type == TOK_BYTE_BPE) {
        // raw bytes already
    } else if (t->byte_offset >= 0 && token >= t->byte_offset && token < t->byte_offset + 256) {
        raw = (unsigned char)(token - t->byte_offset);
        piece = &raw;
        len = 1;
    } else if (prev == t->bos_id && prev >= 0 && len > 0 && piece[0] == ' ') {
        piece++;
        len--;
    }
    size_t n = 0;
    for (int k = 0; k < len; k++) n += feed_byte(st, piece[k], out + n);
    out[n] = '\0';
    return n;
}

/* End of stream: write U+FFFD for each byte of an unfinished sequence still
 * held in st (at most 3, so out needs 10 bytes), NUL-terminate, and reset st.
 * Returns the number of bytes written, not counting the NUL. */
size_t tokenizer_decode_flush(DecodeState *st, char *out) {
    size_t n = flush_pending(st, out);
    out[n] = '\0';
    return n;
}
