/* fuzz_gguf.c: libFuzzer target for the GGUF reader (gguf.c) and the model
 * loader on top of it (gguf_model.c), followed by a forward pass (make fuzz;
 * seeds: tests/fuzz/make_seeds.py, small GGUF files written with the gguf
 * package's GGUFWriter).
 *
 * Input: two option bytes, then the GGUF file's bytes.
 *   byte 0: bit 0 KV cache f16 instead of f32; bit 1 portable kernels (when
 *           built in)
 *   byte 1: n_ctx = 1 + byte % 40
 * The bytes are parsed as they are (gguf_parse, then every typed lookup on
 * every key and every tensor name), and given to build_transformer through an
 * anonymous in-memory file (memfd). When the model loads, a prompt goes
 * through in blocks, then greedy steps. Any crash, sanitizer report or leak
 * is a finding; a one-line refusal is the expected answer to a bad file. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gguf.h"

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int opt = data[0], n_ctx = 1 + data[1] % 40;
    char path[64], err[512];
    GgufFile g;
    if (gguf_parse(&g, "fuzz.gguf", data + 2, size - 2, err, sizeof err) == 0) look_everywhere(&g);
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
    PositionOverrides o = {0};
    Transformer t;
    if (build_transformer(&t, path, &o, n_ctx, opt & 1 ? KV_F16 : KV_F32, err, sizeof err) == 0) {
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
