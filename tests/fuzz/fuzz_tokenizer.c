/* fuzz_tokenizer.c: libFuzzer target for the tokenizer loader (every file
 * version: llama2.c's version 1, LTOK 2 and 3, sentencepiece-type and
 * byte-level BPE with its pre-tokenizers), then encode and decode
 * (make fuzz; seeds: tests/fuzz/make_seeds.py).
 *
 * Input: vocab_size - 1, bos_id + 1, eos_id + 1 (little-endian u16 each; 0
 * means "none" for the ids), then the tokenizer file's bytes, loaded from an
 * anonymous in-memory file. When it loads: a few fixed texts (ASCII, UTF-8,
 * invalid UTF-8, typed special pieces) are encoded with and without BOS, every
 * id is decoded, and so is every id of the vocabulary once; each id must lie
 * inside the vocabulary and the output inside tokenizer_decode_bound. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tokenizer.h"

static const char *const TEXTS[] = {
    "the cat sat on the mat", " leading space", "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80",
    "\xff\xfe\xc3 bad", "<|im_start|>user\nhi<|im_end|>", "<s>[INST]", "don't  12345\n\n\t", "",
};

static void decode_all(const Tokenizer *t, const int *ids, int n) {
    char *out = malloc(tokenizer_decode_bound(t) + 8);
    DecodeState st = {{0}, 0};
    int prev = -1;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size) abort(); // an id outside the vocabulary: a bug
        size_t k = tokenizer_decode(t, &st, prev, ids[i], out);
        if (k > tokenizer_decode_bound(t)) abort();
        prev = ids[i];
    }
    tokenizer_decode_flush(&st, out);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 6) return 0;
    int vocab = 1 + (data[0] | data[1] << 8), bos = (data[2] | data[3] << 8) - 1, eos = (data[4] | data[5] << 8) - 1;
    int fd = memfd_create("fuzz", 0);
    if (fd < 0) return 0;
    if (write(fd, data + 6, size - 6) != (ssize_t)(size - 6)) {
        close(fd);
        return 0;
    }
    char path[64], err[512];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    Tokenizer t;
    if (tokenizer_build(&t, path, vocab, bos, eos, err, sizeof err) == 0) {
        for (size_t i = 0; i < sizeof TEXTS / sizeof TEXTS[0]; i++)
            for (int add_bos = 0; add_bos < 2; add_bos++) {
                size_t len = strlen(TEXTS[i]);
                int *ids = malloc(tokenizer_bound(len) * sizeof(int));
                int n = tokenizer_encode(&t, TEXTS[i], len, add_bos, 0, ids);
                if (n >= 0 && (size_t)n > tokenizer_bound(len)) abort(); // past the promised bound
                if (n > 0) decode_all(&t, ids, n);
                free(ids);
            }
        int *every = malloc((size_t)t.vocab_size * sizeof(int));
        for (int i = 0; i < t.vocab_size; i++) every[i] = i;
        decode_all(&t, every, t.vocab_size);
        free(every);
        tokenizer_free(&t);
    }
    close(fd);
    return 0;
}
