/* fuzz_checkpoint.c: libFuzzer target for the checkpoint loader followed by a
 * forward pass (make fuzz; seeds: tests/fuzz/make_seeds.py).
 *
 * Input: two option bytes, then the checkpoint file's bytes.
 *   byte 0: bit 0   KV cache f16 instead of f32
 *           bit 1   portable kernels instead of the SIMD ones (when built in)
 *           bits 2-3 key-cache strategy: 0 rotate once, 1 exact dynamic NTK
 *                   (pre-RoPE cache), 2 Self-Extend G=2 W=4, 3 attention sinks S=2
 *           bits 4-5 window: 0 the checkpoint's, 1 --window 3, 2 --window 0
 *           bit 6   --rope-scaling yarn --rope-factor 2 on top of the checkpoint's
 *           bit 7   KV cache q8_0 (over bit 0; refused unless kv_dim is a multiple of 32)
 *   byte 1: n_ctx = 1 + byte % 40 (small, so a run stays fast whatever the header says)
 * The checkpoint goes into an anonymous in-memory file (memfd), which the
 * loader maps like any regular file. When it loads, a prompt of up to n_ctx
 * tokens goes through in blocks, then greedy steps (past n_ctx with sinks).
 * Any crash, sanitizer report (address, undefined, float-cast-overflow) or
 * leak is a finding; a one-line refusal is the expected answer to a bad file. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "run.h"

/* A file descriptor's path for the loader; the descriptor stays open. */
static int memory_file(const uint8_t *data, size_t size, char *path, size_t path_len) {
    int fd = memfd_create("fuzz", 0);
    if (fd < 0) return -1;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return -1;
    }
    snprintf(path, path_len, "/proc/self/fd/%d", fd);
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int opt = data[0], n_ctx = 1 + data[1] % 40;
    char path[64], err[512];
    int fd = memory_file(data + 2, size - 2, path, sizeof path);
    if (fd < 0) return 0;
    PositionOverrides o = {0};
    switch ((opt >> 2) & 3) {
    case 1:
        o.scaling = (IntSetting){1, ROPE_DYNAMIC}, o.factor = (RealSetting){1, 2};
        o.dynamic_exact = (IntSetting){1, 1};
        break;
    case 2: o.se_group = (IntSetting){1, 2}, o.se_window = (IntSetting){1, 4}; break;
    case 3: o.sinks = (IntSetting){1, 2}; break;
    }
    if (((opt >> 4) & 3) == 1) o.window = (IntSetting){1, 3};
    if (((opt >> 4) & 3) == 2) o.window = (IntSetting){1, 0};
    if (opt & 64 && ((opt >> 2) & 3) != 1) o.scaling = (IntSetting){1, ROPE_YARN}, o.factor = (RealSetting){1, 2};
#if HAVE_SIMD
    use_simd = !(opt & 2);
#endif
    Transformer t;
    int kv_type = opt & 128 ? KV_Q8_0 : opt & 1 ? KV_F16 : KV_F32;
    int rc = build_transformer(&t, path, &o, n_ctx, kv_type, err, sizeof err);
    if (rc == 0) {
        int V = t.config.vocab_size, n = t.keys == KEYS_SINKS ? n_ctx + 3 : n_ctx, tokens[64];
        for (int i = 0; i < n && i < 64; i++) tokens[i] = (i * 7 + 1) % V;
        int prompt = n < 5 ? n : 5, status;
        float *logits = prefill(&t, tokens, prompt, 0, &status);
        for (int pos = prompt; logits && pos < n && pos < 64; pos++)
            logits = forward(&t, argmax(logits, V), pos, &status);
    }
    free_transformer(&t); // after a failed build too: it releases what the build got
    close(fd);
    return 0;
}
