/* fuzz_encode.c: libFuzzer target for encoding arbitrary bytes with two fixed
 * tokenizers, a sentencepiece one (the bundled models/tokenizer.bin) and a
 * byte-level BPE one with special pieces (make fuzz; both are written by
 * tests/fuzz/make_seeds.py into $FUZZ_TOKENIZERS, default
 * tests/fuzz/build/seeds/tokenizers).
 *
 * Input: a selector byte (bit 0: the byte-level tokenizer, bit 1: add BOS and
 * EOS), then the text. Checks: the ids lie inside the vocabulary and within
 * tokenizer_bound; decoding them never writes past tokenizer_decode_bound;
 * with the byte-level tokenizer, valid UTF-8 text decodes back to itself
 * (its pieces are the text's bytes). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static Tokenizer toks[2];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = getenv("FUZZ_TOKENIZERS") ? getenv("FUZZ_TOKENIZERS") : "tests/fuzz/build/seeds/tokenizers";
    const char *names[2] = {"sp.bin", "bpe.bin"};
    int vocab[2] = {4096, 0}, bos[2] = {1, -1}, eos[2] = {2, -1}; // bpe.bin's from its LTOK header
    for (int i = 0; i < 2; i++) {
        char path[1024], err[512];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unsigned char h[32];
        FILE *f = i == 1 ? fopen(path, "rb") : NULL;
        if (f && fread(h, 1, sizeof h, f) == sizeof h)
            vocab[1] = read_le_i32(h + 16), bos[1] = read_le_i32(h + 24), eos[1] = read_le_i32(h + 28);
        if (f) fclose(f);
        if (tokenizer_build(&toks[i], path, vocab[i], bos[i], eos[i], err, sizeof err) != 0) {
            fprintf(stderr, "fuzz_encode: %s (run tests/fuzz/make_seeds.py, or set FUZZ_TOKENIZERS)\n", err);
            exit(1);
        }
    }
    return 0;
}

/* Whether s[0..n) is valid UTF-8 (shortest forms, no surrogates, <= U+10FFFF). */
static int valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
        if (!len || i + len > n) return 0;
        unsigned cp = len == 1 ? c : c & (0x7f >> len);
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += len;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const Tokenizer *t = &toks[data[0] & 1];
    int ends = (data[0] >> 1) & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int *ids = malloc(tokenizer_bound(len) * sizeof(int));
    int n = tokenizer_encode(t, text, len, ends && t->bos_id >= 0, ends, ids);
    if (n >= 0 && (size_t)n > tokenizer_bound(len)) abort();
    char *out = malloc(tokenizer_decode_bound(t) * (n > 0 ? (size_t)n : 1) + 8), *at = out;
    DecodeState st = {{0}, 0};
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size) abort();
        size_t k = tokenizer_decode(t, &st, i ? ids[i - 1] : -1, ids[i], at);
        if (k > tokenizer_decode_bound(t)) abort();
        at += k;
    }
    at += tokenizer_decode_flush(&st, at);
    // byte-level BPE keeps every byte of valid UTF-8 (BOS/EOS off: they decode to their text)
    if (t == &toks[1] && !ends && n >= 0 && valid_utf8(data + 1, len) &&
        ((size_t)(at - out) != len || memcmp(out, text, len) != 0))
        abort();
    free(out);
    free(ids);
    return 0;
}
