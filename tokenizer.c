/* tokenizer.c: load llama2.c's tokenizer.bin, encode text to token ids the way
 * sentencepiece's BPE model does, and decode ids back to text as a stream.
 *
 * The file (see model.h) is a list of pieces, each with a score. Three kinds
 * of piece live in it:
 *   control pieces  "<unk>", BOS ("\n<s>\n"), EOS ("\n</s>\n")
 *   byte pieces     "<0x00>" .. "<0xFF>", one raw byte each (byte fallback)
 *   normal pieces   everything else: the text fragments BPE builds
 * Only normal pieces are "mergeable": encoding may produce them by joining
 * smaller pieces. Control and byte pieces are never produced by merging, so
 * a user who types "<s>" or "<0x41>" gets those characters encoded as plain
 * text, exactly as sentencepiece does. (Their scores cannot tell them apart:
 * control and byte pieces score 0.0 and the best normal merge scores -0.0.)
 *
 * Encoding (tokenizer_encode), the way sentencepiece's BPE model encodes:
 *   1. prepend one space (sentencepiece's "dummy prefix") to non-empty text;
 *   2. split it into UTF-8 code points, each one symbol (an invalid byte is a
 *      symbol of its own);
 *   3. repeatedly join the adjacent pair of symbols whose concatenation is a
 *      mergeable piece with the highest score; on equal scores the leftmost
 *      pair wins;
 *   4. emit each remaining symbol's id; a symbol that is no piece (a code
 *      point missing from the vocabulary, or an invalid byte) becomes one
 *      byte token per byte.
 * Done naively, step 3 rescans every pair after every merge: quadratic in the
 * text length. Here the symbols form a doubly linked list (a merge unlinks
 * one node in O(1)) and the candidate pairs sit in a binary max-heap ordered
 * by (score, position). A merge changes only the two pairs around it, so it
 * pushes at most two new candidates; pairs made stale by earlier merges stay
 * in the heap and are recognised and skipped when popped ("lazy
 * invalidation"). Piece lookup is a binary search over the mergeable pieces
 * sorted by their bytes. Total cost: O(n log n) for n bytes of text.
 *
 * Decoding (tokenizer_decode) writes a token's bytes, turning "<0xHH>" into
 * the raw byte HH. Because byte tokens can split one character over several
 * tokens, the decoder holds back the bytes of an incomplete UTF-8 sequence in
 * a DecodeState until the sequence completes, so it only ever prints whole
 * code points. A byte that can neither start nor continue a valid sequence is
 * printed as U+FFFD (the replacement character, bytes EF BF BD), one per bad
 * byte: the output is always valid UTF-8 and no byte vanishes silently.
 *
 * Read it top to bottom; the sections follow the data:
 *   1. pieces and lookup: byte pieces, byte-string order, binary search over the mergeable pieces
 *   2. loading: tokenizer.bin -> validated pieces -> classified and sorted for lookup
 *   3. UTF-8 rules the encoder (splitting) and the decoder (streaming) share
 *   4. encoding: code points -> BPE merges through a heap of candidate pairs -> ids
 *   5. decoding: ids -> bytes, whole code points only
 */
#define _POSIX_C_SOURCE 200809L
#include "model.h"

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

/* An entry of the temporary array sorted to build t->sorted_ids. */
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

/* Id of the mergeable piece equal to s[0..len), or -1 if there is none.
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

/* ==========================================================================
 * 2. Loading: tokenizer.bin -> validated pieces -> classified and sorted
 * ========================================================================== */

/* Sanity cap on max_token_length: real vocabularies stay below a few hundred
 * bytes per piece, so anything larger means a corrupt or foreign file. */
#define TOKENIZER_MAX_PIECE_BYTES 65536

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

/* Fill t from a file image data[0..size) already read from path. Returns 0,
 * or -1 with a message. Memory taken here is released by tokenizer_free. */
static int parse_tokenizer(Tokenizer *t, const char *path, const unsigned char *data, size_t size, int vocab_size,
                           char *err, size_t err_len) {
    if (size == 0) return fail(err, err_len, "tokenizer %s: tokenizer file is empty", path);
    if (size < 4) return fail(err, err_len, "tokenizer %s: truncated: only %zu of the 4 header bytes", path, size);
    int32_t max_len = read_le_i32(data);
    if (max_len <= 0 || max_len > TOKENIZER_MAX_PIECE_BYTES)
        return fail(err, err_len, "tokenizer %s: max_token_length %ld is out of range 1..%d (not a tokenizer.bin?)", path,
                    (long)max_len, TOKENIZER_MAX_PIECE_BYTES);
    t->max_token_length = max_len;

    // First pass: validate every entry and total the piece bytes.
    size_t pos = 4, storage = 0;
    for (int i = 0; i < vocab_size; i++) {
        size_t rest = size - pos;
        if (rest == 0)
            return fail(err, err_len, "tokenizer %s: holds %d tokens but the model has vocab_size %d", path, i, vocab_size);
        if (rest < 8)
            return fail(err, err_len, "tokenizer %s: truncated in token %d of %d (%zu of its 8 header bytes present)", path, i,
                        vocab_size, rest);
        float score = read_le_f32(data + pos);
        int32_t len = read_le_i32(data + pos + 4);
        if (isnan(score)) return fail(err, err_len, "tokenizer %s: token %d has a NaN score", path, i);
        if (len < 0) return fail(err, err_len, "tokenizer %s: token %d has negative length %ld", path, i, (long)len);
        if (len > max_len)
            return fail(err, err_len, "tokenizer %s: token %d is %ld bytes long, more than max_token_length %ld", path, i,
                        (long)len, (long)max_len);
        if ((size_t)len > rest - 8)
            return fail(err, err_len, "tokenizer %s: truncated in token %d of %d (needs %ld piece bytes, %zu present)", path, i,
                        vocab_size, (long)len, rest - 8);
        pos += 8 + (size_t)len;
        storage += (size_t)len + 1;
    }
    if (pos != size) {
        long extra = count_extra_entries(data + pos, size - pos);
        if (extra > 0)
            return fail(err, err_len, "tokenizer %s: holds %ld tokens but the model has vocab_size %d", path,
                        (long)vocab_size + extra, vocab_size);
        return fail(err, err_len, "tokenizer %s: has more than vocab_size %d entries (%zu trailing bytes after token %d)", path,
                    vocab_size, size - pos, vocab_size - 1);
    }

    // Second pass: copy the pieces, NUL-terminated, into one block.
    size_t n = (size_t)vocab_size;
    t->vocab = malloc(n * sizeof *t->vocab);
    t->vocab_len = malloc(n * sizeof *t->vocab_len);
    t->scores = malloc(n * sizeof *t->scores);
    t->mergeable = malloc(n);
    t->sorted_ids = malloc(n * sizeof *t->sorted_ids);
    t->piece_storage = malloc(storage);
    if (!t->vocab || !t->vocab_len || !t->scores || !t->mergeable || !t->sorted_ids || !t->piece_storage)
        return fail(err, err_len, "tokenizer %s: out of memory loading %d tokens", path, vocab_size);
    pos = 4;
    char *dst = t->piece_storage;
    for (int i = 0; i < vocab_size; i++) {
        t->scores[i] = read_le_f32(data + pos);
        int len = (int)read_le_i32(data + pos + 4);
        memcpy(dst, data + pos + 8, (size_t)len);
        dst[len] = '\0';
        t->vocab[i] = dst;
        t->vocab_len[i] = len;
        dst += (size_t)len + 1;
        pos += 8 + (size_t)len;
    }
    return 0;
}

/* Classify the pieces (mergeable or not), find the byte tokens and <unk>,
 * and build the sorted lookup array. Returns 0, or -1 with a message. */
static int index_pieces(Tokenizer *t, const char *path, char *err, size_t err_len) {
    t->byte_offset = -1;
    t->unk_id = -1;
    for (int i = 0; i < t->vocab_size; i++) {
        int byte = parse_byte_piece(t->vocab[i], t->vocab_len[i]);
        if (byte == 0 && t->byte_offset < 0) t->byte_offset = i;
        if (t->unk_id < 0 && compare_bytes(t->vocab[i], t->vocab_len[i], "<unk>", 5) == 0) t->unk_id = i;
        t->mergeable[i] = byte < 0 && t->vocab_len[i] > 0;
    }
    if (t->unk_id >= 0) t->mergeable[t->unk_id] = 0;
    else t->unk_id = 0; // sentencepiece's default
    if (t->bos_id >= 0) t->mergeable[t->bos_id] = 0;
    if (t->eos_id >= 0) t->mergeable[t->eos_id] = 0;

    // Encoding maps byte b to id byte_offset + b, so the 256 byte pieces must
    // sit at consecutive ids in order (ids 3..258 in Llama 2's vocabulary).
    if (t->byte_offset >= 0) {
        for (int b = 0; b < 256; b++) {
            int id = t->byte_offset + b;
            if (id >= t->vocab_size || parse_byte_piece(t->vocab[id], t->vocab_len[id]) != b)
                return fail(err, err_len, "tokenizer %s: byte pieces <0x00>..<0xFF> are not at consecutive ids from %d", path,
                            t->byte_offset);
        }
    }

    SortEntry *entries = malloc((size_t)t->vocab_size * sizeof *entries);
    if (!entries) return fail(err, err_len, "tokenizer %s: out of memory indexing tokens", path);
    int n = 0;
    for (int i = 0; i < t->vocab_size; i++) {
        if (t->mergeable[i]) {
            entries[n].bytes = t->vocab[i];
            entries[n].len = t->vocab_len[i];
            entries[n].id = i;
            n++;
        }
    }
    qsort(entries, (size_t)n, sizeof *entries, compare_sort_entries);
    for (int k = 0; k < n; k++) t->sorted_ids[k] = entries[k].id;
    t->n_sorted = n;
    free(entries);
    return 0;
}

/* Load path as a vocabulary of exactly vocab_size pieces. bos_id and eos_id
 * must be valid ids, or -1 for "this model has none". Returns 0 on success;
 * on failure returns -1, leaves t empty (safe to tokenizer_free) and writes a
 * one-line message naming the file to err. Never aborts on bad input. */
int tokenizer_build(Tokenizer *t, const char *path, int vocab_size, int bos_id, int eos_id, char *err,
                    size_t err_len) {
    memset(t, 0, sizeof *t);
    t->byte_offset = -1;
    t->bos_id = t->eos_id = -1;
    if (vocab_size <= 0) return fail(err, err_len, "tokenizer %s: invalid vocab_size %d", path, vocab_size);
    if (bos_id < -1 || bos_id >= vocab_size || eos_id < -1 || eos_id >= vocab_size)
        return fail(err, err_len, "tokenizer %s: bos_id %d / eos_id %d outside the vocabulary of %d tokens", path, bos_id,
                    eos_id, vocab_size);
    size_t size;
    char *data = read_file(path, "tokenizer", &size, err, err_len);
    if (!data) return -1;
    t->vocab_size = vocab_size;
    t->bos_id = bos_id;
    t->eos_id = eos_id;
    int rc = parse_tokenizer(t, path, (const unsigned char *)data, size, vocab_size, err, err_len);
    free(data);
    if (rc == 0) rc = index_pieces(t, path, err, err_len);
    if (rc != 0) {
        tokenizer_free(t);
        return -1;
    }
    return 0;
}

/* Release everything tokenizer_build allocated; t is left zeroed, so calling
 * this twice, or after a failed build, is harmless. */
void tokenizer_free(Tokenizer *t) {
    free(t->vocab);
    free(t->vocab_len);
    free(t->scores);
    free(t->mergeable);
    free(t->sorted_ids);
    free(t->piece_storage);
    memset(t, 0, sizeof *t);
    t->byte_offset = -1;
    t->bos_id = t->eos_id = -1;
}

/* ==========================================================================
 * 3. UTF-8 rules shared by the encoder (splitting) and the decoder (streaming)
 *
 * A well-formed sequence (RFC 3629) is one of
 *   00..7F
 *   C2..DF 80..BF
 *   E0 A0..BF 80..BF | E1..EC 80..BF 80..BF | ED 80..9F 80..BF | EE..EF 80..BF 80..BF
 *   F0 90..BF 80..BF 80..BF | F1..F3 80..BF x3 | F4 80..8F 80..BF 80..BF
 * which excludes overlong forms, UTF-16 surrogates and values above U+10FFFF.
 * ========================================================================== */

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

/* Length of the well-formed code point at s[0..n) (n >= 1), or 1 when the
 * bytes there are not one: an invalid byte is a one-byte symbol. */
static int utf8_char_length(const unsigned char *s, size_t n) {
    int need = utf8_sequence_length(s[0]);
    if (need <= 1 || (size_t)need > n) return 1;
    for (int k = 1; k < need; k++)
        if (!utf8_continuation_ok(s[0], k, s[k])) return 1;
    return need;
}

/* ==========================================================================
 * 4. Encoding: code points -> BPE merges by score -> ids
 * ========================================================================== */

/* One node of the symbol list: the text bytes [start, start+len) of the
 * working buffer. len == 0 marks a node merged into its left neighbour. */
typedef struct {
    int start, len;
    int prev, next; // neighbours in the list, -1 at the ends
    int id;         // mergeable piece id, or -1 for an unknown symbol
} Symbol;

/* A candidate merge of symbols left and right (adjacent when pushed). */
typedef struct {
    float score; // score of the joined piece
    int left, right;
    int len; // left.len + right.len when pushed; detects stale entries
    int id;  // id of the joined piece
} MergePair;

typedef struct {
    MergePair *items;
    size_t n, cap;
} MergeHeap;

/* Heap order: a before b when a has the higher score, or the same score and
 * lies further left (a smaller symbol index is further left, because a merge
 * keeps the left symbol's index). This is sentencepiece's order. */
static int pair_before(const MergePair *a, const MergePair *b) {
    if (a->score != b->score) return a->score > b->score;
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

/* If symbols left and right (adjacent) join into a mergeable piece, push that
 * candidate. Returns 0, or -1 out of memory. */
static int push_pair_if_piece(const Tokenizer *t, const char *buf, const Symbol *sym, int left, int right,
                              MergeHeap *h) {
    if (left < 0 || right < 0) return 0;
    int len = sym[left].len + sym[right].len;
    if (len > t->max_token_length) return 0; // no piece is that long
    int id = lookup_piece(t, buf + sym[left].start, len);
    if (id < 0) return 0;
    MergePair p = {t->scores[id], left, right, len, id};
    return heap_push(h, p);
}

/* Upper bound on the ids tokenizer_encode writes for n_bytes of text: one id
 * per byte at worst (byte fallback), plus the dummy-prefix space, BOS, EOS. */
size_t tokenizer_bound(size_t n_bytes) {
    return n_bytes + 3;
}

/* Encode text[0..n_bytes) (any bytes, NUL included; not NUL-terminated) into
 * tokens, which must hold tokenizer_bound(n_bytes) ids. With add_bos / add_eos
 * the ids bos_id / eos_id are put first / last (when the model has them).
 * Returns the number of ids, or -1 when out of memory or when the text is too
 * long for an int count. See the comment at the top of this file for the
 * algorithm. */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t n_bytes, int add_bos, int add_eos, int *tokens) {
    if (n_bytes > (size_t)INT_MAX - 3) return -1;
    int n_tokens = 0;
    if (add_bos && t->bos_id >= 0) tokens[n_tokens++] = t->bos_id;

    if (n_bytes > 0) {
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
            sym[n_sym].start = pos;
            sym[n_sym].len = len;
            sym[n_sym].prev = n_sym - 1;
            sym[n_sym].next = pos + len < n ? n_sym + 1 : -1;
            sym[n_sym].id = lookup_piece(t, buf + pos, len);
            pos += len;
        }
        for (int i = 0; ok && i + 1 < n_sym; i++)
            if (push_pair_if_piece(t, buf, sym, i, i + 1, &heap) != 0) ok = 0;

        // Merge the best pair until no candidate is left.
        while (ok && heap.n > 0) {
            MergePair p = heap_pop(&heap);
            Symbol *l = &sym[p.left], *r = &sym[p.right];
            if (l->len == 0 || r->len == 0 || l->next != p.right || l->len + r->len != p.len)
                continue; // stale: a neighbour changed since this pair was pushed
            l->len = p.len;
            l->id = p.id;
            l->next = r->next;
            if (r->next >= 0) sym[r->next].prev = p.left;
            r->len = 0;
            if (push_pair_if_piece(t, buf, sym, l->prev, p.left, &heap) != 0 ||
                push_pair_if_piece(t, buf, sym, p.left, l->next, &heap) != 0)
                ok = 0;
        }

        // Emit ids; unknown symbols fall back to byte tokens (or one <unk>
        // per run of unknown symbols when the vocabulary has no byte tokens,
        // as sentencepiece does).
        int after_unk = 0; // previous symbol was emitted as <unk>
        for (int i = 0; ok && n_sym > 0 && i >= 0; i = sym[i].next) {
            if (sym[i].id >= 0) {
                tokens[n_tokens++] = sym[i].id;
                after_unk = 0;
            } else if (t->byte_offset >= 0) {
                for (int k = 0; k < sym[i].len; k++)
                    tokens[n_tokens++] = t->byte_offset + (unsigned char)buf[sym[i].start + k];
            } else {
                if (!after_unk) tokens[n_tokens++] = t->unk_id;
                after_unk = 1;
            }
        }
        free(heap.items);
        free(sym);
        free(buf);
        if (!ok) return -1;
    }

    if (add_eos && t->eos_id >= 0) tokens[n_tokens++] = t->eos_id;
    return n_tokens;
}

/* ==========================================================================
 * 5. Decoding: ids -> bytes, whole UTF-8 code points only
 * ========================================================================== */

/* U+FFFD REPLACEMENT CHARACTER in UTF-8. */
static const char utf8_replacement[3] = {'\xEF', '\xBF', '\xBD'};

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
 * must hold tokenizer_decode_bound(t) bytes, and NUL-terminate it. A byte
 * piece "<0xHH>" stands for the raw byte HH. After BOS, a leading space of a
 * normal piece is dropped: it is the dummy prefix encoding added. Only whole
 * UTF-8 code points are written (see feed_byte); st carries an incomplete
 * sequence over to the next call and must start zeroed. Returns the number
 * of bytes written, not counting the NUL; 0 for an out-of-range token. */
size_t tokenizer_decode(const Tokenizer *t, DecodeState *st, int prev, int token, char *out) {
    out[0] = '\0';
    if (token < 0 || token >= t->vocab_size) return 0;
    const unsigned char *piece = (const unsigned char *)t->vocab[token];
    int len = t->vocab_len[token];
    unsigned char raw;
    if (t->byte_offset >= 0 && token >= t->byte_offset && token < t->byte_offset + 256) {
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
