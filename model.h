/* model.h: the checkpoint format, the structs that hold what it contains
 * (Config, RopeConfig, Weights), and the small helpers that run.c, tokenizer.c
 * and the modes share. tokenizer.h has the tokenizer's formats and API.
 *
 * Dimension names used in every shape comment below (example values are
 * llama2.c's stories15M):
 *   dim        model width                          e.g. 288
 *   hidden_dim SwiGLU inner width                   e.g. 768
 *   n_layers   transformer blocks                   e.g. 6
 *   n_heads    query heads                          e.g. 6
 *   n_kv_heads key/value heads (GQA when < n_heads) e.g. 6
 *   head_size  dim / n_heads                        e.g. 48
 *   kv_dim     n_kv_heads * head_size               e.g. 288
 *   rot_dim    rotated dims per head (<= head_size) e.g. 48
 *   vocab_size tokens                               e.g. 32000
 *   train_ctx  training context (the header's seq_len) e.g. 256
 *   n_ctx      context this run allocates (--ctx; may exceed train_ctx)
 *   n_pairs    rot_dim / 2, the pairs RoPE rotates  e.g. 24
 */
#ifndef MODEL_H
#define MODEL_H

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------
 * Checkpoint format, versions 1 and 2 ("LRPE")
 *
 * All values little-endian. A fixed 256-byte header, then the tensors as
 * float32, each starting at a file offset that is a multiple of 64 bytes
 * (zero padding between them). export.py (convert/checkpoint.py:
 * write_checkpoint, TENSOR_TABLE) is the only writer; run.c (weight_table)
 * walks the same ordered table. Keep the two in step: reordering one without
 * the other is a format change.
 * Version 2 adds the fields at 104..115 and the LongRoPE scaling (6); export.py
 * writes version 1 whenever a file uses none of them, so older programs still
 * read it.
 *
 *  offset type    field             meaning
 *    0    u32     magic             0x4550524c, the bytes "LRPE"
 *    4    i32     version           1 or 2
 *    8    i32     dim
 *   12    i32     hidden_dim
 *   16    i32     n_layers
 *   20    i32     n_heads
 *   24    i32     n_kv_heads        divides n_heads
 *   28    i32     vocab_size
 *   32    i32     seq_len           training context (Config.train_ctx)
 *   36    i32     shared_classifier 1: logits use token_embedding; 0: wcls follows
 *   40    i32     bos_id            e.g. 1
 *   44    i32     eos_id            e.g. 2
 *   48    i32     weight_type       0 = float32, 1 = q8_0 (see "q8_0 tensors" below)
 *   52    i32     group_size        0 for float32; q8_0: values per scale, dividing
 *                                   dim and hidden_dim (e.g. 32)
 *   56    f32     norm_eps          RMSNorm epsilon, e.g. 1e-5
 *   60    f32     rope_theta        RoPE base b, e.g. 10000
 *   64    i32     rope_layout       0 = interleaved pairs (2i, 2i+1), 1 = neox halves (i, i+rot/2)
 *   68    i32     rot_dim           even, 2..head_size (partial rotary when < head_size)
 *   72    i32     rope_scaling      0 none, 1 linear, 2 ntk, 3 dynamic, 4 yarn, 5 llama3,
 *                                   6 longrope (version 2)
 *   76    f32     rope_factor       scale s (1 = no scaling)
 *   80    i32     rope_orig_ctx     original context L for the scaling; 0 = seq_len
 *   84    f32     yarn_beta_fast    default 32
 *   88    f32     yarn_beta_slow    default 1
 *   92    f32     rope_attn_factor  YaRN's and LongRoPE's magnitude mscale; 0 = derive it
 *                                   from s (YaRN 0.1 ln s + 1, LongRoPE sqrt(1 + ln s / ln L))
 *   96    f32     llama3_low_freq   default 1
 *  100    f32     llama3_high_freq  default 4
 *  104    i32     bias_flags        version 2: which projections add a bias, BIAS_QKV (1:
 *                                   q, k, v; Qwen2), BIAS_O (2: the attention output),
 *                                   BIAS_MLP (4: gate, up, down); 0 = none (Llama)
 *  108    i32     sliding_window    version 2: >= 1, a query attends only to this many most
 *                                   recent positions, itself included (Mistral); 0 = none
 *  112    i32     window_first_layer version 2: layers l >= this one use the window, the
 *                                   ones before attend to everything (Qwen2's
 *                                   max_window_layers); 0 = every layer
 *  116..255       reserved, must be zero (version 1: 104..255)
 *
 * Tensors, in this order (shapes row-major; "n_layers" stacks the layers):
 *   token_embedding  (vocab_size, dim)
 *   rms_att_weight   (n_layers, dim)
 *   wq               (n_layers, n_heads*head_size, dim)
 *   wk               (n_layers, kv_dim, dim)
 *   wv               (n_layers, kv_dim, dim)
 *   wo               (n_layers, dim, n_heads*head_size)
 *   rms_ffn_weight   (n_layers, dim)
 *   w1               (n_layers, hidden_dim, dim)    gate
 *   w2               (n_layers, dim, hidden_dim)    down
 *   w3               (n_layers, hidden_dim, dim)    up
 *   rms_final_weight (dim)
 *   wcls             (vocab_size, dim)       only when shared_classifier == 0
 *   bq, bk, bv       (n_layers, dim), (n_layers, kv_dim) twice    with BIAS_QKV
 *   bo               (n_layers, dim)                              with BIAS_O
 *   b1, b2, b3       (n_layers, hidden_dim), (n_layers, dim), (n_layers, hidden_dim)
 *                                                                 with BIAS_MLP
 *   rope_short_factor (n_pairs)  LongRoPE's per-pair divisors of the frequencies up to
 *   rope_long_factor  (n_pairs)  L tokens and beyond: only when rope_scaling == 6
 * Biases and factors are float32 whatever weight_type says.
 * The file size must equal the end of the last tensor exactly.
 *
 * q8_0 tensors (weight_type 1). The matrices token_embedding, wq, wk, wv, wo,
 * w1, w2, w3 and wcls are stored quantized in groups of group_size
 * consecutive values along a row; the norm weights stay float32. A quantized
 * tensor of n values (all layers together, e.g. wq: n_layers * dim * dim) is two
 * parts, each starting at a multiple of 64 bytes:
 *   values  int8    (n)                 q = round(v / scale), in -127..127
 *   scales  float32 (n / group_size)    scale = max|v| over the group / 127
 * and v is read back as q * scale. Group g of a row covers columns
 * g*group_size .. (g+1)*group_size - 1, so a row of `cols` values has
 * cols / group_size scales, and row r of layer l has its scales at
 * ((l * rows + r) * cols) / group_size.
 *
 * The legacy llama2.c format (version 0, no magic) is read too: 7 int32
 * (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a
 * negative vocab_size means an unshared classifier), then float32 tensors in
 * the order above with no padding, with two unused (seq_len, head_size/2)
 * freq_cis tables between rms_final_weight and wcls. Its conventions are
 * fixed: interleaved RoPE, base 10000, eps 1e-5, BOS 1, EOS 2.
 * ------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------
 * Helpers run.c and tokenizer.c share (static inline: each file that
 * includes this header gets its own copy, and no file needs another to link)
 * ------------------------------------------------------------------------ */

/* Write a one-line message into err and return -1. Every function that the
 * tests call reports a bad input this way; only the command line exits. */
static inline int fail(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline int fail(char *err, size_t err_len, const char *fmt, ...) {
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* A path (or another name the user typed) as a message shows it. A message is
 * one line, but a file name may hold any byte except '/' and NUL, a newline
 * too. So: the path itself when it holds no control byte (the usual case:
 * messages show paths as typed); else the path in double quotes with C's
 * escapes, \n \r \t \" \\ and \xHH for the other control bytes, cut with
 * "..." when it would pass SHOWN_PATH_BYTES. Such a rendering lives in one of
 * SHOWN_PATH_SLOTS static buffers, reused in turn: print it in the message
 * that asked for it. */
#define SHOWN_PATH_SLOTS 8
#define SHOWN_PATH_BYTES 4400
static inline const char *shown_path(const char *path) {
    const unsigned char *p = (const unsigned char *)path;
    while (*p && *p >= 0x20 && *p != 0x7f) p++;
    if (!*p) return path; // no control byte: as it is
    static char slots[SHOWN_PATH_SLOTS][SHOWN_PATH_BYTES];
    static int next;
    char *out = slots[next];
    next = (next + 1) % SHOWN_PATH_SLOTS;
    size_t n = 0;
    out[n++] = '"';
    static const char hex[] = "0123456789ABCDEF";
    for (p = (const unsigned char *)path; *p && n + 4 + sizeof "...\"" <= SHOWN_PATH_BYTES; p++) {
        char named = *p == '\n' ? 'n' : *p == '\r' ? 'r' : *p == '\t' ? 't' : *p == '"' ? '"' : *p == '\\' ? '\\' : 0;
        if (named) { // \n \r \t \" \\ (two bytes)
            out[n++] = '\\';
            out[n++] = named;
        } else if (*p < 0x20 || *p == 0x7f) { // \xHH (four bytes)
            out[n++] = '\\';
            out[n++] = 'x';
            out[n++] = hex[*p >> 4];
            out[n++] = hex[*p & 15];
        } else
            out[n++] = (char)*p;
    }
    snprintf(out + n, SHOWN_PATH_BYTES - n, "%s\"", *p ? "..." : "");
    return out;
}

/* Little-endian int32 and float32 from p, whatever the host's byte order or
 * p's alignment: every file this program reads stores numbers this way. */
static inline int32_t read_le_i32(const unsigned char *p) {
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}
static inline float read_le_f32(const unsigned char *p) {
    int32_t i = read_le_i32(p);
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}

/* Read the whole file at path into a new NUL-terminated buffer (caller
 * frees) and its length into *n_out: a regular file, or a pipe (e.g. bash's
 * <(...)), read to its end. A named pipe is opened without waiting for a
 * writer: with none, it reads as empty at once instead of blocking forever.
 * On failure returns NULL with a message in err that starts with `what` (e.g.
 * "-f" or "tokenizer") and the path: missing, unreadable, a directory or
 * device, a pipe that gave nothing, or out of memory. */
static inline char *read_file(const char *path, const char *what, size_t *n_out, char *err, size_t err_len) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fail(err, err_len, "%s %s: %s", what, shown_path(path), strerror(errno));
        return NULL;
    }
    if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) {
        fail(err, err_len, "%s %s: expected a regular file or a pipe, got a %s", what, shown_path(path),
             S_ISDIR(st.st_mode) ? "directory" : "device or socket");
        return NULL;
    }
    int fd = open(path, O_RDONLY | (S_ISFIFO(st.st_mode) ? O_NONBLOCK : 0));
    FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
    if (!f || (S_ISFIFO(st.st_mode) && fcntl(fd, F_SETFL, 0) != 0)) { // then reads wait for data again
        fail(err, err_len, "%s %s: %s", what, shown_path(path), strerror(errno));
        if (f) fclose(f);
        else if (fd >= 0) close(fd);
        return NULL;
    }
    size_t n = 0, cap = S_ISREG(st.st_mode) ? (size_t)st.st_size + 1 : 1 << 16; // + 1: room for the NUL
    char *buf = NULL;
    for (;;) { // a regular file takes one pass; a pipe grows the buffer
        if (!buf || n + 1 >= cap) {
            if (buf) cap = cap > (size_t)-1 / 2 ? (size_t)-1 : cap * 2;
            char *bigger = realloc(buf, cap);
            if (!bigger) {
                free(buf);
                fclose(f);
                fail(err, err_len, "%s %s: cannot allocate %zu bytes", what, shown_path(path), cap);
                return NULL;
            }
            buf = bigger;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        fail(err, err_len, "%s %s: read error after %zu bytes", what, shown_path(path), n);
        return NULL;
    }
    if (n == 0 && S_ISFIFO(st.st_mode)) {
        free(buf);
        fail(err, err_len, "%s %s: a pipe that gave no data (expected a file, or a pipe with a writer)", what,
             shown_path(path));
        return NULL;
    }
    buf[n] = '\0';
    *n_out = n;
    return buf;
}

#define CKPT_MAGIC 0x4550524cu /* "LRPE" read as a little-endian u32 */
#define CKPT_VERSION 2 /* the newest this program reads; it reads 1 too */
#define CKPT_HEADER_BYTES 256
#define CKPT_ALIGN 64
#define LEGACY_HEADER_BYTES 28

/* Weight types. Our checkpoint format stores WEIGHT_F32 or WEIGHT_Q8_0 (its
 * header's weight_type; WEIGHT_FILE_TYPES of them); WEIGHT_Q4_0 and
 * WEIGHT_Q4_1 are GGUF matrices kept as stored (gguf_model.c; their layout
 * in memory: kernels.h). */
enum { WEIGHT_F32 = 0, WEIGHT_Q8_0 = 1, WEIGHT_FILE_TYPES = 2, WEIGHT_Q4_0 = 2, WEIGHT_Q4_1 = 3, WEIGHT_N_TYPES };
enum { ROPE_INTERLEAVED = 0, ROPE_NEOX = 1 };
enum { KV_F32 = 0, KV_F16 = 1, KV_Q8_0 = 2 }; /* KV cache element type (run --kv; kernels.h) */
enum { ROPE_NONE = 0, ROPE_LINEAR, ROPE_NTK, ROPE_DYNAMIC, ROPE_YARN, ROPE_LLAMA3, ROPE_LONGROPE, ROPE_N_SCALINGS };
enum { BIAS_QKV = 1, BIAS_O = 2, BIAS_MLP = 4, BIAS_ALL = 7 };

typedef struct {
    int dim;               // model width, e.g. 288
    int hidden_dim;        // SwiGLU inner width, e.g. 768
    int n_layers;          // e.g. 6
    int n_heads;           // query heads, e.g. 6
    int n_kv_heads;        // key/value heads, e.g. 6 (GQA when fewer than n_heads)
    int vocab_size;        // e.g. 32000
    int train_ctx;         // training context in tokens (the header's seq_len), e.g. 256
    int shared_classifier; // 1 = logits reuse token_embedding
    int bos_id, eos_id;    // e.g. 1, 2
    float norm_eps;        // RMSNorm epsilon, e.g. 1e-5
    int version;           // 0 = legacy llama2.c file, 1 or 2 = ours
    int weight_type;       // WEIGHT_F32 | WEIGHT_Q8_0; a GGUF's layer matrices may be WEIGHT_Q4_0 | WEIGHT_Q4_1
                           // (each Matrix has its type; WEIGHT_F32 here only when every matrix is float32)
    int group_size;        // quantized: values per scale, e.g. 32; 0 for float32
    int bias_flags;        // BIAS_QKV | BIAS_O | BIAS_MLP: which projections add a bias; 0 = none
    int sliding_window;    // a query sees this many most recent positions (itself included); 0 = all
    int window_first_layer; // layers l >= this use sliding_window; 0 = every layer
} Config;

/* RoPE parameters as the checkpoint stores them (the command line may
 * override each: run.h's PositionOverrides). docs/rope.md specifies what each
 * one does. The run-time position settings (Self-Extend, sinks, the exact
 * dynamic variant) are run.h's PositionSettings. */
typedef struct {
    double base;        // b, e.g. 10000
    int layout;         // ROPE_INTERLEAVED | ROPE_NEOX
    int rot_dim;        // d, rotated dims per head, even, <= head_size
    int scaling;        // ROPE_NONE .. ROPE_LONGROPE
    double factor;      // s, 1 = unscaled
    int orig_ctx;       // L, the original context the scaling uses, e.g. train_ctx
    double beta_fast;   // YaRN, default 32
    double beta_slow;   // YaRN, default 1
    double attn_factor; // YaRN's and LongRoPE's magnitude mscale (Hugging Face's attention_factor);
                        // 0 = derive it from s (YaRN 0.1 ln s + 1, LongRoPE sqrt(1 + ln s / ln L))
    double low_freq;    // Llama 3 low_freq_factor, default 1
    double high_freq;   // Llama 3 high_freq_factor, default 4
    const float *short_factor; // LongRoPE (n_pairs): divisors of f_i while the sequence fits in L,
    const float *long_factor;  // and once it is longer; in the mapping; NULL when the checkpoint has none
} RopeConfig;

/* A weight matrix (rows, cols) in the mapping (or in a GGUF's converted
 * buffer), float32, q8_0, q4_0 or q4_1 (kernels.h shows each layout).
 * kernels.c's matmul reads it through this struct, so the forward pass never
 * sees the weight type. */
typedef struct {
    int type;           // WEIGHT_F32 | WEIGHT_Q8_0 | WEIGHT_Q4_0 | WEIGHT_Q4_1
    int group_size;     // values per scale: q8_0 e.g. 32; q4_0 and q4_1 32; 0 for float32
    const void *values; // (rows, cols) float32, int8 for q8_0, two 4-bit values a byte for q4_0 and q4_1
    const float *scale; // q8_0: (rows, cols / group_size); NULL otherwise
    const uint16_t *half_scale; // q4_0, q4_1: (rows, cols / 32) IEEE half d; NULL otherwise
    const uint16_t *half_min;   // q4_1: (rows, cols / 32) IEEE half m; NULL otherwise
} Matrix;

/* Pointers into the read-only mapping; never written, never freed one by one.
 * A Matrix covers all layers; kernels.h's matrix_rows selects one layer's rows. */
typedef struct {
    Matrix token_embedding;        // (vocab_size, dim)
    const float *rms_att_weight;   // (n_layers, dim)
    Matrix wq;                     // (n_layers, dim, dim)
    Matrix wk;                     // (n_layers, kv_dim, dim)
    Matrix wv;                     // (n_layers, kv_dim, dim)
    Matrix wo;                     // (n_layers, dim, dim)
    const float *rms_ffn_weight;   // (n_layers, dim)
    Matrix w1;                     // (n_layers, hidden_dim, dim)
    Matrix w2;                     // (n_layers, dim, hidden_dim)
    Matrix w3;                     // (n_layers, hidden_dim, dim)
    const float *rms_final_weight; // (dim)
    Matrix wcls;                   // (vocab_size, dim); == token_embedding when shared
    // Biases (bias_flags), NULL when the checkpoint has none:
    const float *bq;               // (n_layers, dim)
    const float *bk, *bv;          // (n_layers, kv_dim)
    const float *bo;               // (n_layers, dim)
    const float *b1, *b3;          // (n_layers, hidden_dim) gate, up
    const float *b2;               // (n_layers, dim) down
} Weights;

#endif
