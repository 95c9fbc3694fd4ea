/* filekind.c: what a file given to run is when it is not what run reads
 * there, and the export.py command that converts it (docs/convert.md).
 *
 * A checkpoint that fails to load and a tokenizer file that fails to parse
 * end here: the file's first bytes are matched against the formats a user is
 * likely to have at hand (Hugging Face safetensors or tokenizer.json, a
 * PyTorch zip, a sentencepiece or tiktoken tokenizer.model, or the other of
 * run's own two files), so that `./run model.safetensors` says "a
 * safetensors file; convert its folder with ..." instead of reporting an
 * absurd dim. (A GGUF never ends here: run.c hands one given as the
 * checkpoint to gguf_model.c, and cli.c reads one given to -z, or a GGUF
 * checkpoint's own vocabulary, with gguf_tokenizer.c.)
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "filekind.h"
#include "run.h"

typedef enum {
    KIND_UNKNOWN,
    KIND_CHECKPOINT,     // run's own ("LRPE"), llama2.c's (no magic: it loads), llama2.c's export v1/v2 ("ak42")
    KIND_TOKENIZER_BIN,  // run's own: llama2.c's tokenizer.bin (version 1) or "LTOK" (versions 2, 3)
    KIND_GGUF,           // llama.cpp: "GGUF"
    KIND_SAFETENSORS,    // u64 header length, then a JSON header
    KIND_ZIP,            // "PK\3\4": PyTorch's .pth and pytorch_model.bin
    KIND_TOKENIZER_JSON, // Hugging Face tokenizers: a JSON object with "model" and "vocab"
    KIND_CONFIG_JSON,    // Hugging Face config.json: "model_type" or "architectures"
    KIND_SENTENCEPIECE,  // sentencepiece's tokenizer.model: a protobuf whose first field is a piece
    KIND_TIKTOKEN,       // Llama 3's tokenizer.model: lines "base64 rank"
} FileKind;

#define MAX_SNIFF_BYTES (16 << 20) // read at most this much of a file (a tokenizer.bin is a few MB at most)
#define MAX_PIECE_BYTES 65536      // the longest piece a version 1 tokenizer.bin may hold (as tokenizer.c)

/* Whether the version 1 tokenizer.bin layout (i32 max_token_length, then per
 * token f32 score, i32 len, len bytes) covers the whole file exactly; the
 * token count into *n_tokens. */
static int is_tokenizer_v1(const unsigned char *h, size_t n, long *n_tokens) {
    if (n < 12) return 0;
    int32_t max_len = read_le_i32(h);
    if (max_len <= 0 || max_len > MAX_PIECE_BYTES) return 0;
    size_t pos = 4;
    long count = 0;
    while (pos + 8 <= n) {
        int32_t len = read_le_i32(h + pos + 4);
        if (!isfinite(read_le_f32(h + pos)) || len < 0 || len > max_len) return 0;
        pos += 8 + (size_t)len;
        count++;
    }
    *n_tokens = count;
    return pos == n;
}

/* Whether p[0..n) starts with a protobuf length-delimited field 1 (tag 0x0a)
 * holding a message that itself starts with field 1: sentencepiece's
 * ModelProto, whose first field is the first SentencePiece {piece, score,
 * type}. The piece must be followed by its score (tag 0x15) or type (0x18). */
static int is_sentencepiece(const unsigned char *h, size_t n) {
    size_t pos = 0;
    uint64_t len[2];
    for (int level = 0; level < 2; level++) {
        if (pos >= n || h[pos++] != 0x0a) return 0;
        len[level] = 0;
        for (int shift = 0;; shift += 7) { // a varint, 5 bytes at most here
            if (pos >= n || shift > 28) return 0;
            len[level] |= (uint64_t)(h[pos] & 0x7f) << shift;
            if (!(h[pos++] & 0x80)) break;
        }
    }
    if (len[1] == 0 || len[1] >= len[0]) return 0;
    pos += len[1];
    return pos < n && (h[pos] == 0x15 || h[pos] == 0x18);
}

/* Whether the first two lines are tiktoken's "base64 rank" (Llama 3's
 * tokenizer.model: "IQ== 0"). */
static int is_tiktoken(const unsigned char *h, size_t n) {
    size_t pos = 0;
    for (int line = 0; line < 2; line++) {
        size_t start = pos;
        while (pos < n && (isalnum(h[pos]) || h[pos] == '+' || h[pos] == '/' || h[pos] == '=')) pos++;
        if (pos == start || pos >= n || h[pos++] != ' ') return 0;
        start = pos;
        while (pos < n && isdigit(h[pos])) pos++;
        if (pos == start || pos >= n || h[pos++] != '\n') return 0;
    }
    return 1;
}

/* Whether the NUL-terminated JSON text has the key "key" (followed by ':'). */
static int json_has_key(const char *text, const char *key) {
    size_t key_len = strlen(key);
    for (const char *p = strchr(text, '"'); p; p = strchr(p + 1, '"')) {
        if (strncmp(p + 1, key, key_len) || p[1 + key_len] != '"') continue;
        const char *after = p + 2 + key_len;
        while (*after == ' ' || *after == '\t' || *after == '\n' || *after == '\r') after++;
        if (*after == ':') return 1;
    }
    return 0;
}

/* The kind of a JSON object (text NUL-terminated): a tokenizer.json, a
 * config.json, or unknown. */
static FileKind json_kind(const char *text) {
    if (!strncmp(text, "\xef\xbb\xbf", 3)) text += 3; // a UTF-8 byte order mark
    while (*text == ' ' || *text == '\t' || *text == '\n' || *text == '\r') text++;
    if (*text != '{') return KIND_UNKNOWN;
    if (json_has_key(text, "model") && (json_has_key(text, "vocab") || json_has_key(text, "merges")))
        return KIND_TOKENIZER_JSON;
    if (json_has_key(text, "model_type") || json_has_key(text, "architectures")) return KIND_CONFIG_JSON;
    return KIND_UNKNOWN;
}

/* Whether path loads as a llama2.c checkpoint, which has no magic: its
 * seven header numbers must pass the loader's checks and imply the file's
 * exact size. */
static int loads_as_checkpoint(const char *path) {
    Transformer t;
    char unused[8];
    if (load_checkpoint(&t, path, unused, sizeof unused) != 0) return 0;
    free_transformer(&t);
    return 1;
}

/* The kind of h[0..n), the first n bytes of a file of `size` bytes (all of
 * it when n == size), by its bytes alone (a llama2.c checkpoint, which has no
 * magic, is KIND_UNKNOWN here); *n_tokens receives a tokenizer.bin's token
 * count. */
static FileKind kind_of(const unsigned char *h, size_t n, size_t size, long *n_tokens) {
    uint32_t magic = n >= 4 ? (uint32_t)read_le_i32(h) : 0;
    if (magic == CKPT_MAGIC || magic == 0x616b3432u) return KIND_CHECKPOINT; // "LRPE", "ak42"
    if (magic == TOK_MAGIC) {
        *n_tokens = n >= 20 ? read_le_i32(h + 16) : 0;
        return KIND_TOKENIZER_BIN;
    }
    if (n >= 4 && !memcmp(h, "GGUF", 4)) return KIND_GGUF;
    if (n >= 4 && !memcmp(h, "PK\3\4", 4)) return KIND_ZIP;
    if (n >= 9 && h[8] == '{') {
        uint64_t header_len = (uint64_t)(uint32_t)read_le_i32(h) | (uint64_t)(uint32_t)read_le_i32(h + 4) << 32;
        if (header_len >= 2 && header_len <= size - 8) return KIND_SAFETENSORS;
    }
    FileKind json = json_kind((const char *)h);
    if (json != KIND_UNKNOWN) return json;
    if (is_sentencepiece(h, n)) return KIND_SENTENCEPIECE;
    if (is_tiktoken(h, n)) return KIND_TIKTOKEN;
    if (n == size && is_tokenizer_v1(h, n, n_tokens)) return KIND_TOKENIZER_BIN;
    return KIND_UNKNOWN;
}

/* The folder that holds path ("." for a bare name), into dir. */
static void folder_of(const char *path, char *dir, size_t dir_len) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, dir_len, ".");
    else if (slash == path) snprintf(dir, dir_len, "/");
    else snprintf(dir, dir_len, "%.*s", (int)(slash - path), path);
}

/* What a file of `kind` is, and the command that makes of it what `role`
 * needs, into out. Returns 0 when kind is what role needs (or unknown). */
static int advice(FileKind kind, FileRole role, const char *path, long n_tokens, char *out, size_t out_len) {
    char dir[4096];
    folder_of(path, dir, sizeof dir);
    const char *tokenizer_name = kind == KIND_TOKENIZER_JSON ? "a Hugging Face tokenizer.json"
                                 : kind == KIND_SENTENCEPIECE ? "a sentencepiece tokenizer.model"
                                                              : "a tiktoken tokenizer.model (Llama 3)";
    if (role == AS_CHECKPOINT) {
        switch (kind) {
        case KIND_UNKNOWN: case KIND_CHECKPOINT: case KIND_GGUF: return 0; // a GGUF: gguf_model.c's message stands
        case KIND_SAFETENSORS:
            snprintf(out, out_len, "a safetensors file (Hugging Face weights); convert its folder, with config.json "
                     "beside it, with: python3 export.py model.bin --hf %s", shown_path(dir));
            break;
        case KIND_ZIP:
            snprintf(out, out_len, "a zip archive, as PyTorch saves .pth and pytorch_model.bin; convert a Meta "
                     "checkpoint's folder with: python3 export.py model.bin --meta-llama %s (a Hugging Face "
                     "pytorch_model.bin: save it as safetensors first, docs/convert.md)", shown_path(dir));
            break;
        case KIND_TOKENIZER_BIN:
            snprintf(out, out_len, "a tokenizer file of %ld tokens; give the checkpoint first and this file with -z: "
                     "run <checkpoint> -z %s", n_tokens, shown_path(path));
            break;
        case KIND_TOKENIZER_JSON: case KIND_SENTENCEPIECE: case KIND_TIKTOKEN:
            snprintf(out, out_len, "%s; convert it with: python3 export.py tokenizer.bin --tokenizer %s, and give "
                     "tokenizer.bin with -z after the checkpoint", tokenizer_name, shown_path(path));
            break;
        case KIND_CONFIG_JSON:
            snprintf(out, out_len, "a Hugging Face config.json; convert its folder with: python3 export.py model.bin "
                     "--hf %s", shown_path(dir));
            break;
        }
        return 1;
    }
    switch (kind) {
    case KIND_UNKNOWN: case KIND_TOKENIZER_BIN: case KIND_GGUF: return 0; // a GGUF: gguf_tokenizer.c's message stands
    case KIND_CHECKPOINT:
        snprintf(out, out_len, "a checkpoint; give it as the first argument, and its tokenizer.bin with -z");
        break;
    case KIND_SAFETENSORS: case KIND_CONFIG_JSON:
        snprintf(out, out_len, "%s; convert the tokenizer.json beside it with: python3 export.py tokenizer.bin "
                 "--tokenizer %s/tokenizer.json", kind == KIND_CONFIG_JSON ? "a Hugging Face config.json"
                 : "a safetensors file (Hugging Face weights)", shown_path(dir));
        break;
    case KIND_ZIP:
        snprintf(out, out_len, "a zip archive, as PyTorch saves weights; convert the tokenizer.model beside it with: "
                 "python3 export.py tokenizer.bin --tokenizer %s/tokenizer.model", shown_path(dir));
        break;
    case KIND_TOKENIZER_JSON: case KIND_SENTENCEPIECE: case KIND_TIKTOKEN:
        snprintf(out, out_len, "%s; convert it with: python3 export.py tokenizer.bin --tokenizer %s", tokenizer_name,
                 shown_path(path));
        break;
    }
    return 1;
}

int explain_foreign_file(const char *path, FileRole role, char *out, size_t out_len) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) return 0; // a pipe is read once only
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t size = (size_t)st.st_size, want = size < MAX_SNIFF_BYTES ? size : MAX_SNIFF_BYTES;
    unsigned char *h = malloc(want + 1);
    size_t n = h ? fread(h, 1, want, f) : 0;
    fclose(f);
    if (!h) return 0;
    h[n] = '\0'; // the JSON checks read it as a string
    long n_tokens = 0;
    FileKind kind = kind_of(h, n, size, &n_tokens);
    free(h);
    // Only as a tokenizer: the loader calls this function when a checkpoint fails to load
    if (kind == KIND_UNKNOWN && role == AS_TOKENIZER && loads_as_checkpoint(path)) kind = KIND_CHECKPOINT;
    return advice(kind, role, path, n_tokens, out, out_len);
}
