/* fuzz_gguf.c: libFuzzer target for the GGUF reader (gguf.c) and the model
 * loader on top of it (gguf_model.c), followed by a forward pass (make fuzz;
 * seeds: tests/fuzz/make_seeds.py, small GGUF files written with the gguf
 * package's GGUFWriter).
 *
 * Input: two option bytes, then the GGUF file's bytes.
 *   byte 0: bit 0 KV cache f16 instead of f32, bit 4 q8_0 (over bit 0;
 *           refused unless kv_dim is a multiple of 32); bit 1 portable kernels (when
 *           built in); bit 2 quantized tensors converted to float32
 *           (--gguf-convert f32), else bit 3 to q8_0 (--gguf-convert q8_0),
 *           else as the loader's default (Q4_0 and Q4_1 kept as stored)
 *   byte 1: n_ctx = 1 + byte % 40
 * The bytes are parsed as they are (gguf_parse, then every typed lookup on
 * every key and every tensor name); the vocabulary in their metadata
 * (tokenizer.ggml.*) is converted to a version 3 tokenizer file
 * (gguf_tokenizer_ltok) and, when it is, loaded and run: a few texts encoded,
 * every id decoded. Then the bytes go to build_transformer through an
 * anonymous in-memory file (memfd). When the model loads, -m info's account
 * of its keys (gguf_key_usage) must visit each key once, and a prompt goes
 * through in blocks, then greedy steps. Any crash, sanitizer report or leak
 * is a finding; a one-line refusal is the expected answer to a bad file. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_tokenizer.h"

/* Every lookup on every key and tensor of a parsed file. */
static void look_everywhere(const GgufFile *g) {
    char key[256], err[512];
    for (uint64_t k = 0; k < g->n_kv; k++) {
        gguf_show(g->kv[k].key, key, sizeof key);
        int64_t i;
        double f;
        int b;
        GgufStr s;
        gguf_get_int(g, key, &i, err, sizeof err);
        gguf_get_float(g, key, &f, err, sizeof err);
        gguf_get_bool(g, key, &b, err, sizeof err);
        gguf_get_str(g, key, &s, err, sizeof err);
    }
    for (uint64_t k = 0; k < g->n_tensors; k++) {
        gguf_show(g->tensors[k].name, key, sizeof key);
        const GgufTensor *t = gguf_find_tensor(g, key);
        if (t && t->n_bytes) { // the data must be readable, first byte to last
            volatile unsigned char sink = t->data[0] ^ t->data[t->n_bytes - 1];
            (void)sink;
        }
    }
}

/* The GGUF's own tokenizer: converted, loaded with the ids its header
 * states, then each text encoded (BOS as the file says) and every id
 * decoded; an id outside the vocabulary or past the decode bound aborts. */
static void run_vocabulary(const GgufFile *g) {
    static const char *const texts[] = {"the cat sat", "caf\xc3\xa9 \xf0\x9f\x98\x80 12345", "\xff\xfe bad",
                                        "<|im_start|>user\nhi<|im_end|>", ""};
    unsigned char *ltok;
    size_t n_bytes;
    char note[GGUF_TOK_NOTE_BYTES], err[512];
    if (gguf_tokenizer_ltok(g, &ltok, &n_bytes, note, err, sizeof err) != 0) return;
    Tokenizer t; // the header's vocab_size, bos_id and eos_id (bytes 16, 24, 28)
    if (tokenizer_build_bytes(&t, "fuzz.gguf", ltok, n_bytes, read_le_i32(ltok + 16), read_le_i32(ltok + 24),
                              read_le_i32(ltok + 28), err, sizeof err) == 0) {
        char *out = malloc(tokenizer_decode_bound(&t) + 8);
        for (size_t i = 0; out && i < sizeof texts / sizeof texts[0]; i++) {
            size_t len = strlen(texts[i]);
            int *ids = malloc(tokenizer_bound(len) * sizeof *ids);
            int n = ids ? tokenizer_encode(&t, texts[i], len, t.add_bos, 0, ids) : -1;
            DecodeState st = {{0}, 0};
            for (int k = 0; k < n; k++) {
                if (ids[k] < 0 || ids[k] >= t.vocab_size) abort();
                if (tokenizer_decode(&t, &st, k ? ids[k - 1] : -1, ids[k], out) > tokenizer_decode_bound(&t)) abort();
            }
            tokenizer_decode_flush(&st, out);
            free(ids);
        }
        free(out);
    }
    tokenizer_free(&t);
    free(ltok);
}

/* The header's metadata count (bytes 16..23 of the file, little-endian). */
static uint64_t n_kv_of(const uint8_t *file) {
    uint64_t n = 0;
    for (int b = 7; b >= 0; b--) n = n << 8 | file[16 + b];
    return n;
}

static void count_key(const char *key, int read, void *ctx) {
    (void)key, (void)read;
    (*(int *)ctx)++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int opt = data[0], n_ctx = 1 + data[1] % 40;
    char path[64], err[512];
    GgufFile g;
    if (gguf_parse(&g, "fuzz.gguf", data + 2, size - 2, err, sizeof err) == 0) {
        look_everywhere(&g);
        run_vocabulary(&g);
    }
    gguf_free(&g);

    int fd = memfd_create("fuzz", 0);
    if (fd < 0) return 0;
    if (size > 2 && write(fd, data + 2, size - 2) != (ssize_t)(size - 2)) {
        close(fd);
        return 0;
    }
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
#if HAVE_SIMD
    use_simd = !(opt & 2);
#endif
    gguf_set_conversion(opt & 4 ? GGUF_TO_F32 : opt & 8 ? GGUF_TO_Q8_0 : GGUF_KEEP);
    PositionOverrides o = {0};
    Transformer t;
    if (build_transformer(&t, path, &o, n_ctx, opt & 16 ? KV_Q8_0 : opt & 1 ? KV_F16 : KV_F32, err, sizeof err) == 0) {
        int keys = 0; // -m info's mapped and ignored keys: every key visited once
        if (gguf_key_usage(&t, 1, count_key, &keys, err, sizeof err) == 0 && (uint64_t)keys != n_kv_of(data + 2))
            abort();
        int V = t.config.vocab_size, tokens[64];
        for (int i = 0; i < n_ctx; i++) tokens[i] = (i * 7 + 1) % V;
        int prompt = n_ctx < 5 ? n_ctx : 5, status;
        float *logits = prefill(&t, tokens, prompt, 0, &status);
        for (int pos = prompt; logits && pos < n_ctx; pos++) logits = forward(&t, argmax(logits, V), pos, &status);
    }
    free_transformer(&t);
    close(fd);
    return 0;
}
