/* run.c: inference for Llama-architecture models in plain C; the model.
 *
 * Read it top to bottom; the sections follow the data:
 *   1. checkpoint: the model in memory; header -> validate -> expected size
 *      == file size -> mmap -> weight pointers
 *   2. RoPE: inverse frequencies (every scaling method) -> cos/sin table,
 *      built once; the rotation; the RoPE stage of each layer, which switches
 *      on the key strategy (KeyStrategy, run.h): keys rotated once is written
 *      out here, the three long-context strategies are one call each into
 *      keys.c
 *   3. building and freeing the model: checkpoint + position settings + RoPE
 *      table + run state
 *   4. ops: rmsnorm, matmul, softmax, attention, swiglu, residual_add, each
 *      one formula (matmul's as a plain loop; attention calls kernels.c for
 *      its products over the KV cache)
 *   5. forward: a block of tokens through every layer, as a sequence of those
 *      ops and the RoPE stage
 *   6. sampler: repetition penalty -> temperature -> top-k -> top-p -> min-p -> draw
 *   7. generate: prompt -> prefill -> sample, print, feed back
 *   8. main: the command line (cli.c) -> the model -> the mode (left out when
 *      the tests build with -DTESTING)
 * Errors and timing are messages.c's: die() and notice() print one
 * line to stderr, out_write() the output to stdout.
 * run.h declares what the other files use from here; model.h describes the
 * checkpoint format and the weights' shapes. The other modes live in files of
 * their own (modes.h lists them: chat.c, ppl.c, passkey.c, tokenize.c,
 * rope_mode.c); kernels.c computes matmul and attention over the KV cache fast
 * (SIMD, q8_0 and 4-bit weights, half-precision and q8_0 caches, threads) and can be skipped on
 * a first reading; tokenizer.c is the only code that knows BPE; export.py is
 * the only writer of checkpoints.
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "attn_stats.h"
#include "filekind.h"
#include "gguf.h"
#include "keys.h"
#include "modes.h"
#include "run.h"

/* ==========================================================================
 * 1. Checkpoint: the model in memory; header -> validation -> size check ->
 *    mmap -> weight pointers
 * ========================================================================== */

/* One entry of the ordered tensor table: where a tensor's pointer goes and how
 * many values it holds. TENSOR_TABLE in convert/checkpoint.py (export.py's
 * writer) is the other side. */
typedef struct {
    const char *name;
    const float **vec; // a float32 vector (norm weights), or NULL
    Matrix *mat;       // a weight matrix, float32 or q8_0 as the header says, or NULL
    size_t n_values;   // all layers together; neither pointer: skipped (legacy freq_cis)
} TensorSpec;

#define MAX_TENSORS 32

/* Fill `table` with the checkpoint's tensors in file order; returns the count.
 * r receives the LongRoPE factor pointers (RopeConfig holds them). */
static int weight_table(const Config *c, RopeConfig *r, Weights *w, TensorSpec table[MAX_TENSORS]) {
    size_t dim = (size_t)c->dim, hidden = (size_t)c->hidden_dim, layers = (size_t)c->n_layers;
    size_t head_size = dim / (size_t)c->n_heads;
    size_t kv_dim = head_size * (size_t)c->n_kv_heads;
    size_t vocab = (size_t)c->vocab_size;
    int n = 0;
    table[n++] = (TensorSpec){"token_embedding", NULL, &w->token_embedding, vocab * dim};
    table[n++] = (TensorSpec){"rms_att_weight", &w->rms_att_weight, NULL, layers * dim};
    table[n++] = (TensorSpec){"wq", NULL, &w->wq, layers * dim * dim};
    table[n++] = (TensorSpec){"wk", NULL, &w->wk, layers * kv_dim * dim};
    table[n++] = (TensorSpec){"wv", NULL, &w->wv, layers * kv_dim * dim};
    table[n++] = (TensorSpec){"wo", NULL, &w->wo, layers * dim * dim};
    table[n++] = (TensorSpec){"rms_ffn_weight", &w->rms_ffn_weight, NULL, layers * dim};
    table[n++] = (TensorSpec){"w1", NULL, &w->w1, layers * hidden * dim};
    table[n++] = (TensorSpec){"w2", NULL, &w->w2, layers * dim * hidden};
    table[n++] = (TensorSpec){"w3", NULL, &w->w3, layers * hidden * dim};
    table[n++] = (TensorSpec){"rms_final_weight", &w->rms_final_weight, NULL, dim};
    if (c->version == 0) { // llama2.c's unused freq_cis_real and freq_cis_imag
        table[n++] = (TensorSpec){"freq_cis_real", NULL, NULL, (size_t)c->train_ctx * head_size / 2};
        table[n++] = (TensorSpec){"freq_cis_imag", NULL, NULL, (size_t)c->train_ctx * head_size / 2};
    }
    if (!c->shared_classifier) table[n++] = (TensorSpec){"wcls", NULL, &w->wcls, vocab * dim};
    if (c->bias_flags & BIAS_QKV) {
        table[n++] = (TensorSpec){"bq", &w->bq, NULL, layers * dim};
        table[n++] = (TensorSpec){"bk", &w->bk, NULL, layers * kv_dim};
        table[n++] = (TensorSpec){"bv", &w->bv, NULL, layers * kv_dim};
    }
    if (c->bias_flags & BIAS_O) table[n++] = (TensorSpec){"bo", &w->bo, NULL, layers * dim};
    if (c->bias_flags & BIAS_MLP) {
        table[n++] = (TensorSpec){"b1", &w->b1, NULL, layers * hidden};
        table[n++] = (TensorSpec){"b2", &w->b2, NULL, layers * dim};
        table[n++] = (TensorSpec){"b3", &w->b3, NULL, layers * hidden};
    }
    if (r->scaling == ROPE_LONGROPE) {
        size_t n_pairs = (size_t)r->rot_dim / 2;
        table[n++] = (TensorSpec){"rope_short_factor", &r->short_factor, NULL, n_pairs};
        table[n++] = (TensorSpec){"rope_long_factor", &r->long_factor, NULL, n_pairs};
    }
    return n;
}

/* Byte offset where each tensor (or q8_0 part) starts: version 1 aligns to CKPT_ALIGN. */
static size_t tensor_start(const Config *c, size_t offset) {
    if (c->version == 0) return offset;
    return (offset + CKPT_ALIGN - 1) / CKPT_ALIGN * CKPT_ALIGN;
}

/* Walk the tensor table from the end of the header; returns the file size it
 * implies. With map != NULL, also point each table entry into the mapping.
 * A float32 tensor is one part; a q8_0 matrix is int8 values, then float32
 * scales (model.h, "q8_0 tensors"). */
size_t place_tensors(const Config *c, RopeConfig *r, Weights *w, const char *map) {
    TensorSpec table[MAX_TENSORS];
    int n = weight_table(c, r, w, table);
    size_t offset = c->version == 0 ? LEGACY_HEADER_BYTES : CKPT_HEADER_BYTES;
    for (int i = 0; i < n; i++) {
        int q8 = table[i].mat && c->weight_type == WEIGHT_Q8_0;
        offset = tensor_start(c, offset);
        const char *values = map ? map + offset : NULL, *scales = NULL;
        offset += table[i].n_values * (q8 ? sizeof(int8_t) : sizeof(float));
        if (q8) {
            offset = tensor_start(c, offset);
            scales = map ? map + offset : NULL;
            offset += table[i].n_values / (size_t)c->group_size * sizeof(float);
        }
        if (!map) continue;
        if (table[i].vec) *table[i].vec = (const float *)values;
        if (table[i].mat)
            *table[i].mat = (Matrix){c->weight_type, c->group_size, values, (const float *)scales, NULL, NULL};
    }
    return offset;
}

/* Total bytes a checkpoint with this header must have. */
size_t expected_file_size(const Config *c, const RopeConfig *r) {
    Weights unused_w;
    RopeConfig unused_r = *r;
    return place_tensors(c, &unused_r, &unused_w, NULL);
}

/* Names of the RoPE settings, as the command line and the outputs spell them
 * (index = ROPE_NONE .., ROPE_INTERLEAVED ..; NULL ends a list of choices). */
const char *const SCALING_NAMES[] = {"none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope", NULL};
const char *const LAYOUT_NAMES[] = {"interleaved", "neox", NULL};
const char *const KV_NAMES[] = {"f32", "f16", "q8_0", NULL};
const char *const WEIGHT_NAMES[] = {"f32", "q8_0", "q4_0", "q4_1", NULL};
const char *const GGUF_CONVERT_NAMES[] = {"f32", "q8_0", "native", NULL};
const char *const DYNAMIC_NAMES[] = {"hf", "exact", NULL}; // PositionSettings.dynamic_exact = 0, 1
const char *const KEY_NAMES[] = {"rotated-once", "per-length", "self-extend", "sinks", NULL};

/* Parse the header bytes (n_read of them) into c and r. Values are only
 * copied here; validate_config checks them. */
int parse_header(const char *path, const unsigned char *h, size_t n_read, Config *c, RopeConfig *r,
                        char *err, size_t err_len) {
    memset(c, 0, sizeof *c);
    memset(r, 0, sizeof *r);
    if (n_read >= 4 && (uint32_t)read_le_i32(h) == CKPT_MAGIC) {
        if (n_read < CKPT_HEADER_BYTES)
            return fail(err, err_len, "%s: truncated header: expected %d bytes, file has %zu", path,
                        CKPT_HEADER_BYTES, n_read);
        c->version = read_le_i32(h + 4);
        if (c->version < 1 || c->version > CKPT_VERSION)
            return fail(err, err_len, "%s: unsupported format version %d (this program reads versions 1 to %d)",
                        path, c->version, CKPT_VERSION);
        c->dim = read_le_i32(h + 8);
        c->hidden_dim = read_le_i32(h + 12);
        c->n_layers = read_le_i32(h + 16);
        c->n_heads = read_le_i32(h + 20);
        c->n_kv_heads = read_le_i32(h + 24);
        c->vocab_size = read_le_i32(h + 28);
        c->train_ctx = read_le_i32(h + 32);
        c->shared_classifier = read_le_i32(h + 36);
        c->bos_id = read_le_i32(h + 40);
        c->eos_id = read_le_i32(h + 44);
        int weight_type = read_le_i32(h + 48), group_size = read_le_i32(h + 52);
        c->norm_eps = read_le_f32(h + 56);
        r->base = read_le_f32(h + 60);
        r->layout = read_le_i32(h + 64);
        r->rot_dim = read_le_i32(h + 68);
        r->scaling = read_le_i32(h + 72);
        r->factor = read_le_f32(h + 76);
        r->orig_ctx = read_le_i32(h + 80);
        r->beta_fast = read_le_f32(h + 84);
        r->beta_slow = read_le_f32(h + 88);
        r->attn_factor = read_le_f32(h + 92);
        r->low_freq = read_le_f32(h + 96);
        r->high_freq = read_le_f32(h + 100);
        int reserved_from = 104; // version 1 ends its fields here
        if (c->version >= 2) {
            c->bias_flags = read_le_i32(h + 104);
            c->sliding_window = read_le_i32(h + 108);
            c->window_first_layer = read_le_i32(h + 112);
            reserved_from = 116;
        }
        c->weight_type = weight_type;
        c->group_size = group_size;
        if (weight_type < 0 || weight_type >= WEIGHT_FILE_TYPES)
            return fail(err, err_len, "%s: weight_type %d is not supported (expected 0 = float32 or 1 = q8_0)", path,
                        weight_type);
        if (weight_type == WEIGHT_F32 && group_size != 0)
            return fail(err, err_len, "%s: group_size %d given for float32 weights (expected 0)", path, group_size);
        if (c->shared_classifier != 0 && c->shared_classifier != 1)
            return fail(err, err_len, "%s: shared_classifier=%d (expected 0 or 1)", path, c->shared_classifier);
        for (int i = reserved_from; i < CKPT_HEADER_BYTES; i++)
            if (h[i] != 0)
                return fail(err, err_len, "%s: reserved header byte %d is %d (expected 0; written by a newer export.py?)",
                            path, i, h[i]);
        return 0;
    }
    if (n_read >= 4 && read_le_i32(h) == 0x616b3432)
        return fail(err, err_len, "%s: this is a llama2.c export.py version 1/2 file (magic \"ak42\"); "
                    "convert the original with: python3 export.py OUT --llama2c or --hf", path);
    if (n_read < LEGACY_HEADER_BYTES)
        return fail(err, err_len, "%s: too short for a checkpoint: %zu bytes (a header needs %d)", path, n_read,
                    LEGACY_HEADER_BYTES);
    // Legacy llama2.c file: seven int32, then fixed conventions.
    c->version = 0;
    c->dim = read_le_i32(h);
    c->hidden_dim = read_le_i32(h + 4);
    c->n_layers = read_le_i32(h + 8);
    c->n_heads = read_le_i32(h + 12);
    c->n_kv_heads = read_le_i32(h + 16);
    int32_t vocab = read_le_i32(h + 20);
    c->shared_classifier = vocab > 0;
    c->vocab_size = vocab == INT32_MIN ? 0 : abs(vocab);
    c->train_ctx = read_le_i32(h + 24);
    c->bos_id = 1;
    c->eos_id = 2;
    c->norm_eps = 1e-5f;
    r->base = 10000.0;
    r->layout = ROPE_INTERLEAVED;
    r->rot_dim = 0; // filled in below once head_size is known to be valid
    r->scaling = ROPE_NONE;
    r->factor = 1.0;
    return 0;
}

/* Check every header value before anything is computed from it. */
int validate_config(const char *path, const Config *c, const RopeConfig *r, char *err, size_t err_len) {
    struct { const char *name; int value, max; } dims[] = {
        {"dim", c->dim, MAX_DIM}, {"hidden_dim", c->hidden_dim, MAX_HIDDEN},
        {"n_layers", c->n_layers, MAX_LAYERS}, {"n_heads", c->n_heads, MAX_DIM},
        {"n_kv_heads", c->n_kv_heads, MAX_DIM}, {"vocab_size", c->vocab_size, MAX_VOCAB},
        {"seq_len", c->train_ctx, MAX_CTX},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].value <= 0 || dims[i].value > dims[i].max)
            return fail(err, err_len, "%s: %s=%d is out of range (expected 1..%d)%s", path, dims[i].name,
                        dims[i].value, dims[i].max,
                        c->version == 0 ? "; is this a llama2.c checkpoint?" : "");
    if (c->dim % c->n_heads != 0)
        return fail(err, err_len, "%s: n_heads=%d does not divide dim=%d", path, c->n_heads, c->dim);
    if (c->n_heads % c->n_kv_heads != 0)
        return fail(err, err_len, "%s: n_kv_heads=%d does not divide n_heads=%d", path, c->n_kv_heads, c->n_heads);
    int head_size = c->dim / c->n_heads;
    if (head_size % 2 != 0)
        return fail(err, err_len, "%s: head size dim/n_heads=%d is odd (RoPE rotates pairs; expected even)", path,
                    head_size);
    if (c->version == 0) return 0; // the remaining fields are fixed for legacy files
    if (c->weight_type == WEIGHT_Q8_0 &&
        (c->group_size <= 0 || c->dim % c->group_size != 0 || c->hidden_dim % c->group_size != 0))
        return fail(err, err_len, "%s: group_size=%d does not divide dim=%d and hidden_dim=%d (q8_0 needs a "
                    "positive group size dividing both)", path, c->group_size, c->dim, c->hidden_dim);
    if (c->bos_id < 0 || c->bos_id >= c->vocab_size || c->eos_id < 0 || c->eos_id >= c->vocab_size)
        return fail(err, err_len, "%s: bos_id=%d eos_id=%d (expected 0..%d)", path, c->bos_id, c->eos_id,
                    c->vocab_size - 1);
    if (!(c->norm_eps > 0.0f && c->norm_eps < 1.0f))
        return fail(err, err_len, "%s: norm_eps=%g (expected 0 < eps < 1)", path, (double)c->norm_eps);
    if (!(r->base > 1.0 && isfinite(r->base)))
        return fail(err, err_len, "%s: rope_theta=%g (expected a finite value > 1)", path, r->base);
    if (r->layout != ROPE_INTERLEAVED && r->layout != ROPE_NEOX)
        return fail(err, err_len, "%s: rope_layout=%d (expected 0 = interleaved or 1 = neox)", path, r->layout);
    if (r->rot_dim < 2 || r->rot_dim > head_size || r->rot_dim % 2 != 0)
        return fail(err, err_len, "%s: rot_dim=%d (expected an even number in 2..head_size=%d)", path, r->rot_dim,
                    head_size);
    int n_scalings = c->version >= 2 ? ROPE_N_SCALINGS : ROPE_LONGROPE; // longrope came with version 2
    if (r->scaling < 0 || r->scaling >= n_scalings)
        return fail(err, err_len, "%s: rope_scaling=%d (expected 0..%d in format version %d)", path, r->scaling,
                    n_scalings - 1, c->version);
    if (!(r->factor >= 1.0 && isfinite(r->factor)))
        return fail(err, err_len, "%s: rope_factor=%g (expected a finite value >= 1)", path, r->factor);
    if (r->orig_ctx < 0 || r->orig_ctx > MAX_CTX)
        return fail(err, err_len, "%s: rope_orig_ctx=%d (expected 0..%d)", path, r->orig_ctx, MAX_CTX);
    struct { const char *name; double value, max; } params[] = { // 0 = the default
        {"yarn_beta_fast", r->beta_fast, 1e6}, {"yarn_beta_slow", r->beta_slow, 1e6},
        {"rope_attn_factor", r->attn_factor, 1e3}, {"llama3_low_freq", r->low_freq, 1e6},
        {"llama3_high_freq", r->high_freq, 1e6},
    };
    for (size_t i = 0; i < sizeof params / sizeof params[0]; i++)
        if (!(params[i].value >= 0 && params[i].value <= params[i].max))
            return fail(err, err_len, "%s: %s=%g (expected 0 = default, or a value up to %g)", path, params[i].name,
                        params[i].value, params[i].max);
    if (c->bias_flags < 0 || c->bias_flags > BIAS_ALL)
        return fail(err, err_len, "%s: bias_flags=%d (expected 0..%d: 1 q/k/v, 2 output, 4 MLP)", path,
                    c->bias_flags, BIAS_ALL);
    if (c->sliding_window < 0 || c->sliding_window > MAX_CTX)
        return fail(err, err_len, "%s: sliding_window=%d (expected 0 = none, or 1..%d)", path, c->sliding_window,
                    MAX_CTX);
    if (c->window_first_layer < 0 || c->window_first_layer > c->n_layers)
        return fail(err, err_len, "%s: window_first_layer=%d (expected 0..n_layers=%d)", path,
                    c->window_first_layer, c->n_layers);
    return 0;
}

/* A load that failed: when the file is a format filekind.c recognises (a
 * GGUF, a tokenizer, safetensors ...), replace the message in err by what the
 * file is and the export.py command that converts it. Returns -1. */
static int not_a_checkpoint(const char *path, char *err, size_t err_len) {
    char what[768];
    if (!explain_foreign_file(path, AS_CHECKPOINT, what, sizeof what)) return -1; // err keeps the loader's message
    return fail(err, err_len, "%s: not a checkpoint: %s", shown_path(path), what);
}

/* Open, validate and map a checkpoint into t->config, t->rope, t->weights.
 * Nothing is mapped and no pointer is formed until the header has passed
 * validation and the file size equals the size the header implies.
 * Returns 0, or -1 with a one-line message in err. */
int load_checkpoint(Transformer *t, const char *path, char *err, size_t err_len) {
    memset(t, 0, sizeof *t);
    const char *name = shown_path(path); // the path as the messages show it
    int fd = open(path, O_RDONLY | O_NONBLOCK); // a FIFO opens at once (and is refused below), never waits
    if (fd < 0) return fail(err, err_len, "%s: cannot open checkpoint: %s", name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return fail(err, err_len, "%s: cannot stat checkpoint: %s", name, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fail(err, err_len, "%s: expected a checkpoint file, got a %s", name,
                    S_ISDIR(st.st_mode) ? "directory" : S_ISFIFO(st.st_mode) ? "FIFO (a checkpoint is mapped: it "
                    "must be a regular file)" : "special file");
    }
    size_t file_size = (size_t)st.st_size;
    if (file_size == 0) {
        close(fd);
        return fail(err, err_len, "%s: empty file (expected a checkpoint)", name);
    }
    unsigned char header[CKPT_HEADER_BYTES];
    ssize_t got = pread(fd, header, sizeof header, 0);
    if (got < 0) {
        close(fd);
        return fail(err, err_len, "%s: read error: %s", name, strerror(errno));
    }
    if (got >= 4 && memcmp(header, GGUF_MAGIC, 4) == 0) { // llama.cpp's format, read by gguf_model.c
        int rc = gguf_load_checkpoint(t, path, fd, file_size, err, err_len);
        close(fd);
        return rc;
    }
    Config *c = &t->config;
    RopeConfig *r = &t->rope;
    if (parse_header(name, header, (size_t)got, c, r, err, err_len) != 0 ||
        validate_config(name, c, r, err, err_len) != 0) {
        close(fd);
        return not_a_checkpoint(path, err, err_len);
    }
    if (c->version == 0) r->rot_dim = c->dim / c->n_heads;
    if (r->orig_ctx == 0) r->orig_ctx = c->train_ctx; // 0 = the training context
    size_t expected = expected_file_size(c, r);
    if (file_size != expected) {
        close(fd);
        if (file_size < expected)
            fail(err, err_len, "%s: truncated: the header implies %zu bytes, the file has %zu", name, expected,
                 file_size);
        else
            fail(err, err_len, "%s: %zu trailing bytes: the header implies %zu bytes, the file has %zu", name,
                 file_size - expected, expected, file_size);
        return not_a_checkpoint(path, err, err_len);
    }
    void *map = mmap(NULL, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd); // the mapping stays valid after close
    if (map == MAP_FAILED) return fail(err, err_len, "%s: mmap failed: %s", name, strerror(errno));
    t->mapping = map;
    t->file_size = file_size;

    place_tensors(c, r, &t->weights, (const char *)map); // point each weight (and LongRoPE factor) into the mapping
    if (c->shared_classifier) t->weights.wcls = t->weights.token_embedding;
    for (int i = 0; r->short_factor && i < r->rot_dim / 2; i++) // divisors of a frequency: finite and positive
        for (int which = 0; which < 2; which++) {
            float v = (which ? r->long_factor : r->short_factor)[i];
            if (!(v > 0.0f && isfinite(v))) {
                fail(err, err_len, "%s: rope_%s_factor[%d]=%g (expected a finite value > 0)", name,
                     which ? "long" : "short", i, (double)v);
                munmap(map, file_size);
                memset(t, 0, sizeof *t);
                return -1;
            }
        }
    return 0;
}

/* ==========================================================================
 * 2. RoPE: inverse frequencies -> cos/sin table -> the RoPE stage
 *
 * RoPE rotates pair i of every q and k head by the angle pos * inv_freq[i],
 * with inv_freq[i] = base^(-2i/rot_dim), for i < n_pairs = rot_dim/2. A
 * scaling method changes only inv_freq and a magnitude factor mscale, so the
 * table builder below is the same for all of them. docs/rope.md is the
 * specification: every formula here, with its test vectors.
 * ========================================================================== */

/* inv_freq[i] for i < n_pairs and the magnitude factor mscale (YaRN's and
 * LongRoPE's; 1 for every other method) for the method in r (docs/rope.md §8;
 * test vectors §9). `cur_len` is the current sequence length, used only by
 * dynamic NTK and LongRoPE. Frequencies are computed in double. */
void rope_frequencies(const RopeConfig *r, int cur_len, double *inv_freq, double *mscale) {
    int n_pairs = r->rot_dim / 2;
    double d = r->rot_dim, b = r->base, s = r->factor, L = r->orig_ctx;
    *mscale = 1.0;
    for (int i = 0; i < n_pairs; i++) inv_freq[i] = pow(b, -2.0 * i / d); // f_i = b^(-2i/d)
    switch (r->scaling) {
    case ROPE_NONE:
        break;
    case ROPE_LINEAR: // position interpolation: inv'_i = f_i / s
        for (int i = 0; i < n_pairs; i++) inv_freq[i] /= s;
        break;
    case ROPE_NTK:     // b' = b * alpha^(d/(d-2)); inv'_i = b'^(-2i/d)
    case ROPE_DYNAMIC: // alpha = s*S/L - (s-1) with S = max(cur_len, L)
    {
        double alpha = s;
        if (r->scaling == ROPE_DYNAMIC) {
            double S = cur_len > r->orig_ctx ? cur_len : L;
            alpha = s * S / L - (s - 1.0);
        }
        if (r->rot_dim > 2) { // with one pair the exponent is 0 for every base
            double b_new = b * pow(alpha, d / (d - 2.0));
            for (int i = 0; i < n_pairs; i++) inv_freq[i] = pow(b_new, -2.0 * i / d);
        }
        break;
    }
    case ROPE_YARN: { // NTK-by-parts ramp in the pair index, plus attention temperature
        *mscale = r->attn_factor > 0 ? r->attn_factor : s <= 1.0 ? 1.0 : 0.1 * log(s) + 1.0;
        if (s == 1.0) break; // the blend below is f_i mathematically; keep it exact
        double low = floor(d * log(L / (2 * PI * r->beta_fast)) / (2 * log(b)));
        double high = ceil(d * log(L / (2 * PI * r->beta_slow)) / (2 * log(b)));
        if (low < 0) low = 0;
        if (high > d - 1) high = d - 1;
        if (low == high) high += 0.001;
        for (int i = 0; i < n_pairs; i++) {
            double ramp = (i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double keep = 1.0 - ramp; // 1 = keep f_i (extrapolate), 0 = f_i / s (interpolate)
            inv_freq[i] = inv_freq[i] / s * (1.0 - keep) + inv_freq[i] * keep;
        }
        break;
    }
    case ROPE_LONGROPE: { // per-pair divisors found by search: inv'_i = f_i / factor_i
        const float *div = cur_len > r->orig_ctx ? r->long_factor : r->short_factor; // long past L tokens
        for (int i = 0; i < n_pairs; i++) inv_freq[i] /= div[i];
        *mscale = r->attn_factor > 0 ? r->attn_factor : s <= 1.0 || L <= 1 ? 1.0 : sqrt(1.0 + log(s) / log(L));
        break;
    }
    case ROPE_LLAMA3: { // Meta's apply_scaling: by wavelength, ramp linear in L/lambda
        if (s == 1.0) break; // every branch below is f_i when s = 1; keep it exact
        double low_wl = L / r->low_freq, high_wl = L / r->high_freq;
        for (int i = 0; i < n_pairs; i++) {
            double f = inv_freq[i], wavelength = 2 * PI / f;
            if (wavelength < high_wl) continue; // fast pairs: untouched
            if (wavelength > low_wl) {          // slow pairs: interpolated
                inv_freq[i] = f / s;
                continue;
            }
            double smooth = (L / wavelength - r->low_freq) / (r->high_freq - r->low_freq);
            inv_freq[i] = (1.0 - smooth) * f / s + smooth * f;
        }
        break;
    }
    }
}

/* Fill cos/sin (n_rows, n_pairs) with mscale * cos(pos * inv_freq[i]) and
 * mscale * sin(...) for pos = first_row .. first_row + n_rows - 1. The angle
 * is formed in double: a float angle loses ~1e-4 at position 1000
 * (docs/rope.md §7.2). Multiplying both cos and sin by mscale scales
 * q and k by mscale, so every attention logit q.k scales by mscale^2, the
 * convention of Hugging Face, ggml and YaRN (docs/rope.md §7.3). */
void rope_fill_table(float *cos_out, float *sin_out, int first_row, int n_rows, const double *inv_freq, int n_pairs,
                     double mscale) {
    for (int p = 0; p < n_rows; p++) {
        double pos = (double)(first_row + p);
        for (int i = 0; i < n_pairs; i++) {
            double angle = pos * inv_freq[i];
            cos_out[(size_t)p * n_pairs + i] = (float)(mscale * cos(angle));
            sin_out[(size_t)p * n_pairs + i] = (float)(mscale * sin(angle));
        }
    }
}

/* Whether the frequencies depend on the sequence length: dynamic NTK's base
 * grows with it, LongRoPE switches factor arrays past L. */
int rope_length_dependent(const RopeConfig *r) {
    return r->scaling == ROPE_DYNAMIC || r->scaling == ROPE_LONGROPE;
}

/* Rows [first, first + n) of the table, for a sequence of length len. */
void rope_build_rows(Transformer *t, int len, int first, int n) {
    RunState *st = &t->state;
    int n_pairs = t->rope.rot_dim / 2;
    double mscale;
    rope_frequencies(&t->rope, len, st->inv_freq, &mscale);
    rope_fill_table(st->rope_cos + (size_t)first * n_pairs, st->rope_sin + (size_t)first * n_pairs, first, n,
                    st->inv_freq, n_pairs, mscale);
}

/* Build the whole (table_rows, n_pairs) table once, at load.
 * Most methods have one table for all lengths. Dynamic NTK (docs/rope.md §8.5)
 * and LongRoPE (§8.8) give a sequence of length S > L other frequencies than
 * a shorter one:
 *   hf:    the token at position p is rotated once, when it arrives, for
 *          length S = p + 1; cached keys keep that rotation. So row p is
 *          simply built for length max(p + 1, L), and the table never changes.
 *   exact: every key is re-rotated for the current length (pre-RoPE cache);
 *          keys.c's rope_sync_length rebuilds rows 0..pos once pos + 1 > L. */
static void rope_build_table(Transformer *t) {
    int L = t->rope.orig_ctx, n = t->n_ctx;
    if (!rope_length_dependent(&t->rope) || t->table_rows > n) { // one table; with sinks in blocks, the rows
        rope_build_rows(t, L, 0, t->table_rows);                  // past n_ctx too (then n_ctx <= L: block_limit)
        t->table_len = L;
        return;
    }
    rope_build_rows(t, L, 0, n < L ? n : L); // S <= L: the frequencies of short sequences
    t->table_len = L;
    if (n <= L) return;
    if (t->pos.dynamic_exact) rope_build_rows(t, L, L, n - L);                     // rebuilt when reached
    else if (t->rope.scaling == ROPE_LONGROPE) rope_build_rows(t, L + 1, L, n - L); // long factors
    else
        for (int p = L; p < n; p++) rope_build_rows(t, p + 1, p, 1);                // a base per length
}

/* Rotate the first rot_dim dims of each head, row b by table row b:
 *   (x, y) -> (x cos - y sin, x sin + y cos)
 * vec: (B, n_heads, head_size); cos, sin: (B, n_pairs), the table rows of the
 * B positions. Pair i is (2i, 2i+1) in the interleaved layout (Meta,
 * llama2.c) and (i, i + n_pairs) in the neox layout (Hugging Face after its
 * q/k row permutation). Dims past rot_dim pass through unchanged. */
void rope(float *vec, const float *cos, const float *sin, int B, int n_heads, int head_size, int rot_dim,
          int layout) {
    int n_pairs = rot_dim / 2;
    for (int b = 0; b < B; b++) {
        const float *cos_b = cos + (size_t)b * n_pairs, *sin_b = sin + (size_t)b * n_pairs; // row b
        for (int h = 0; h < n_heads; h++) {
            float *v = vec + ((size_t)b * n_heads + h) * head_size;
            for (int i = 0; i < n_pairs; i++) {
                int a = layout == ROPE_INTERLEAVED ? 2 * i : i;
                int z = layout == ROPE_INTERLEAVED ? 2 * i + 1 : i + n_pairs;
                float x = v[a], y = v[z];
                v[a] = x * cos_b[i] - y * sin_b[i];
                v[z] = x * sin_b[i] + y * cos_b[i];
            }
        }
    }
}

/* The RoPE stage of one layer: give the block's queries and keys their
 * positions, put the keys and values into the layer's cache, and say how
 * attention reads it (CacheView). It switches on the key strategy
 * (KeyStrategy, set when the model is built); each long-context strategy is
 * one call into keys.c, and the rest of the forward pass never knows which
 * one runs:
 *   (a) KEYS_ROTATED_ONCE (every method, the default): q and k are rotated
 *      by the table rows of their positions; keys enter the cache rotated and
 *      keep that rotation for good. The whole of it is below.
 *   (b) KEYS_PER_LENGTH (--rope-dynamic exact; per_length_keys): the table
 *      depends on the sequence length, so keys enter the cache unrotated (a
 *      pre-RoPE cache). Queries that share a table (one token; a block
 *      within L) have every cached key rotated anew for them; a block past
 *      L, whose every query has a length and a table of its own, leaves q
 *      and the keys unrotated, and attention rotates them per query from its
 *      frame (rope_prepare builds the frames once per block).
 *   (c) KEYS_SELF_EXTEND (--self-extend G W; self_extend_keys): keys enter
 *      unrotated too; a key W or more tokens back is rotated at its group
 *      position floor(j/G) and scored against a second query rotated at
 *      floor(pos/G) + W - floor(W/G); nearer keys keep their own positions.
 *      Neither rotation depends on the query, so a block rotates each key
 *      both ways once and attention picks per pair.
 *   (d) KEYS_SINKS (--sinks n_sinks; sinks_keys): keys enter unrotated; once
 *      the cache is full each new token overwrites the oldest after the
 *      sinks, and every key is rotated at its place in the cache; a block at
 *      the distances to its queries instead.
 * docs/rope.md §11 has the details, §10 Self-Extend's position map and §13
 * the sinks. In: st->q (B, n_heads, head_size), st->k and st->v
 * (B, kv_dim) from the projections; window: the layer's sliding window.
 * Out: st->q rotated in place (not with frames); the B keys and values
 * written into key_cache and value_cache (one layer's (n_ctx, kv_dim)) at
 * their slots. */
static CacheView rope_stage(Transformer *t, void *key_cache, void *value_cache, int B, int pos0, int window) {
    switch (t->keys) {
    case KEYS_PER_LENGTH: return per_length_keys(t, key_cache, value_cache, B, pos0, window);   // (b)
    case KEYS_SELF_EXTEND: return self_extend_keys(t, key_cache, value_cache, B, pos0, window); // (c)
    case KEYS_SINKS: return sinks_keys(t, key_cache, value_cache, B, pos0, window);             // (d)
    case KEYS_ROTATED_ONCE: break;                                                              // (a), here
    }
    const Config *c = &t->config;
    const RopeConfig *r = &t->rope;
    RunState *st = &t->state;
    int head_size = c->dim / c->n_heads, n_pairs = r->rot_dim / 2;
    const float *cos_rows = st->rope_cos + (size_t)pos0 * n_pairs; // (B, n_pairs): the B positions' rows
    const float *sin_rows = st->rope_sin + (size_t)pos0 * n_pairs;
    rope(st->q, cos_rows, sin_rows, B, c->n_heads, head_size, r->rot_dim, r->layout);
    rope(st->k, cos_rows, sin_rows, B, c->n_kv_heads, head_size, r->rot_dim, r->layout);
    cache_store(t, key_cache, pos0, B, st->k);
    cache_store(t, value_cache, pos0, B, st->v);
    return (CacheView){key_cache, t->kv_type, value_cache, t->kv_type, pos0, window, {NULL, NULL, 0, 0}, NULL};
}

/* ==========================================================================
 * 3. Building and freeing the model: checkpoint + position settings + RoPE
 *    table + run state
 * ========================================================================== */

/* How many tokens forward_block may take at once: FORWARD_BLOCK, since every
 * key strategy has a form for a block (rope_stage). One case goes one token
 * at a time: attention sinks with dynamic NTK or LongRoPE and a cache longer
 * than L, whose table rows past L each have frequencies of their own, so that
 * a key's score is no function of its distance to the query (keys.c's
 * sinks_block needs one). `make reference` takes exact dynamic NTK and sinks
 * one token at a time too: their token path, which the tests compare with the
 * blocks, and so do attention statistics (from the one-query path's
 * weights). */
int block_limit(const Transformer *t) {
#ifdef REFERENCE
    if (t->keys == KEYS_PER_LENGTH || t->keys == KEYS_SINKS || t->state.attn_stats) return 1;
#endif
    if (t->keys == KEYS_SINKS && rope_length_dependent(&t->rope) && t->n_ctx > t->rope.orig_ctx) return 1;
    return FORWARD_BLOCK;
}

/* The machine's physical memory in bytes, or 0 where libc cannot say. */
static size_t physical_memory(void) {
#ifdef _SC_PHYS_PAGES
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) return (size_t)pages * (size_t)page;
#endif
    return 0;
}

/* Allocate the activations and KV cache for n_ctx positions and build the
 * RoPE table from t->rope. ctx_name says what set n_ctx ("--ctx 4096"), for
 * the messages. Returns BUILD_BAD_SETTINGS with a message, allocating
 * nothing, when the buffers together would not fit in the machine's memory
 * (the pages of a calloc are only reserved: such a context would be accepted
 * and then fail, or swap, as the cache fills); BUILD_BAD_INPUT if an
 * allocation fails. */
static int build_run_state(Transformer *t, const char *ctx_name, char *err, size_t err_len) {
    const Config *c = &t->config;
    RunState *st = &t->state;
    size_t dim = c->dim, hidden = c->hidden_dim, head_size = dim / c->n_heads;
    size_t kv_dim = head_size * c->n_kv_heads, n_ctx = t->n_ctx, n_pairs = t->rope.rot_dim / 2;
    size_t cache_values = (size_t)c->n_layers * n_ctx * kv_dim;
    size_t B = (size_t)block_limit(t); // tokens one forward_block call may carry
    size_t rows = (size_t)t->table_rows, widest = hidden > dim ? hidden : dim;
    size_t quantized = c->weight_type != WEIGHT_F32; // q8_0, q4_0 or q4_1: x quantized for int8 products
    size_t threads = 1, sinks = t->keys == KEYS_SINKS && B > 1, frames = t->keys == KEYS_PER_LENGTH && B > 1;
    size_t n_coarse = (n_ctx - 1) / ATT_KEYS + 1; // a frame's coarse rows (kernels.h's QueryFrames)
#ifdef _OPENMP
    threads = (size_t)omp_get_max_threads();
#endif
    st->mm.threads = (int)threads;
    struct { void **p; size_t n, size; } bufs[] = {
#define FLOATS(ptr, n) {(void **)&(ptr), (n), sizeof(float)}
        FLOATS(st->x, B * dim), FLOATS(st->xb, B * dim), FLOATS(st->xb2, B * dim), FLOATS(st->hb, B * hidden),
        FLOATS(st->hb2, B * hidden), FLOATS(st->q, B * dim), FLOATS(st->k, B * kv_dim), FLOATS(st->v, B * kv_dim),
        FLOATS(st->scores, c->n_heads * n_ctx), FLOATS(st->logits, B * c->vocab_size),
        FLOATS(st->attn_tiles, B > 1 ? threads * attention_block_floats((int)head_size, c->n_heads / c->n_kv_heads)
                                     : 0),
        {&st->key_cache, kv_bytes(t->kv_type, cache_values), 1}, // (n_layers, n_ctx, kv_dim) of kv_type
        {&st->value_cache, kv_bytes(t->kv_type, cache_values), 1},
        FLOATS(st->rope_cos, rows * n_pairs), FLOATS(st->rope_sin, rows * n_pairs),
        // only with a pre-RoPE key cache: one layer of rotated keys; with Self-Extend the block's
        // queries and the layer's keys at their group positions; with sinks in blocks the queries
        // at their places and the layer's values in the keys' order; with exact dynamic NTK in
        // blocks each query's frame (the fine rows' cos and sin, then the coarse rows')
        FLOATS(st->key_rot, t->keys != KEYS_ROTATED_ONCE ? rows * kv_dim : 0),
        FLOATS(st->q_second, t->keys == KEYS_SELF_EXTEND || sinks ? B * dim : 0),
        FLOATS(st->key_grouped, t->keys == KEYS_SELF_EXTEND ? n_ctx * kv_dim : 0),
        FLOATS(st->value_rows, sinks ? rows * kv_dim : 0),
        FLOATS(st->frame_rows, frames ? B * 2 * (ATT_KEYS + n_coarse) * n_pairs : 0),
        {(void **)&st->frame_freq, frames ? B * n_pairs : 0, sizeof(double)},
        // matmul's input transposed (blocks); with q8_0 weights, quantized
        FLOATS(st->mm.x_t, B > 1 ? widest * cols_round_up((int)B) : 0),
        {(void **)&st->mm.x_q, quantized ? B * widest : 0, sizeof(int8_t)},
        FLOATS(st->mm.x_scale, quantized ? B * widest / c->group_size : 0),
        FLOATS(st->mm.w_rows, quantized && B > 1 ? (size_t)threads * ROW_CHUNK * widest : 0),
        {(void **)&st->mm.x_qt, quantized && B > 1 ? widest * simd_round_up((int)B) : 0, sizeof(uint8_t)},
        FLOATS(st->mm.x_scale_t, quantized && B > 1 ? widest / c->group_size * simd_round_up((int)B) : 0),
        {(void **)&st->mm.w_sums, quantized && B > 1 ? (size_t)threads * ROW_CHUNK * widest / c->group_size : 0,
         sizeof(int32_t)},
        FLOATS(st->mm.x_sum, quantized ? B * widest / 32 : 0), // q4_1's block sums (group_size 32)
#undef FLOATS
    };
    double total = 0, cache = 2.0 * kv_bytes(t->kv_type, cache_values), memory = (double)physical_memory();
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) total += (double)bufs[i].n * bufs[i].size;
    if (memory > 0 && total > memory) {
        fail(err, err_len, "%s: the KV cache (%.1f GiB) and buffers for this context need %.1f GiB, more than this "
             "machine's %.1f GiB of memory (a smaller context fits; %s)", ctx_name, cache / (1 << 30),
             total / (1 << 30), memory / (1 << 30), t->kv_type == KV_F32 ? "--kv f16 halves the cache, --kv q8_0 "
             "takes 9/32 of it" : t->kv_type == KV_F16 ? "--kv q8_0 takes 9/16 of this cache" : "the cache is q8_0");
        return BUILD_BAD_SETTINGS;
    }
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (bufs[i].n == 0) continue;
        *bufs[i].p = calloc(bufs[i].n, bufs[i].size);
        if (!*bufs[i].p) {
            fail(err, err_len, "%s: cannot allocate %.1f MiB (KV cache and buffers for this context)", ctx_name,
                 (double)bufs[i].n * bufs[i].size / (1 << 20));
            return BUILD_BAD_INPUT;
        }
    }
    st->inv_freq = malloc(n_pairs * sizeof(double));
    if (!st->inv_freq) {
        fail(err, err_len, "out of memory building the RoPE table");
        return BUILD_BAD_INPUT;
    }
    rope_build_table(t);
    if (frames) { // the frames' four arrays, in frame_rows (kernels.h's QueryFrames)
        float *fine = st->frame_rows, *coarse = fine + B * 2 * ATT_KEYS * n_pairs;
        st->frames = (QueryFrames){fine, fine + B * ATT_KEYS * n_pairs, coarse, coarse + B * n_coarse * n_pairs,
                                   (int)n_coarse, (int)B, t->rope.rot_dim, t->rope.layout};
    }
    return 0;
}

/* Put the command line's values over the checkpoint's RoPE parameters, set
 * the position settings, and give the parameters the checkpoint leaves at 0
 * (legacy files, or no scaling stored) their defaults. */
static void apply_overrides(Transformer *t, const PositionOverrides *ov) {
    RopeConfig *r = &t->rope;
    PositionSettings *p = &t->pos;
    p->window = t->config.sliding_window;
    p->window_first_layer = t->config.window_first_layer;
    if (ov) {
        if (ov->base.given) r->base = ov->base.value;
        if (ov->scaling.given) r->scaling = ov->scaling.value;
        if (ov->factor.given) r->factor = ov->factor.value;
        if (ov->orig_ctx.given) r->orig_ctx = ov->orig_ctx.value;
        if (ov->beta_fast.given) r->beta_fast = ov->beta_fast.value;
        if (ov->beta_slow.given) r->beta_slow = ov->beta_slow.value;
        if (ov->attn_factor.given) r->attn_factor = ov->attn_factor.value;
        if (ov->low_freq.given) r->low_freq = ov->low_freq.value;
        if (ov->high_freq.given) r->high_freq = ov->high_freq.value;
        if (ov->dynamic_exact.given) p->dynamic_exact = ov->dynamic_exact.value;
        if (ov->se_group.given) p->se_group = ov->se_group.value, p->se_window = ov->se_window.value;
        if (ov->sinks.given) p->n_sinks = ov->sinks.value;
        if (ov->window.given) p->window = ov->window.value, p->window_first_layer = 0; // --window: every layer
    }
    if (r->beta_fast == 0) r->beta_fast = 32;
    if (r->beta_slow == 0) r->beta_slow = 1;
    if (r->low_freq == 0) r->low_freq = 1;
    if (r->high_freq == 0) r->high_freq = 4;
}

/* How keys get their positions (run.h's KeyStrategy): attention sinks when
 * the command line asks for them, Self-Extend when it is on, per length for
 * the exact variant of a length-dependent method, else rotated once. */
static KeyStrategy key_strategy(const Transformer *t, const PositionOverrides *ov) {
    if (ov && ov->sinks.given) return KEYS_SINKS;
    if (t->pos.se_group > 0) return KEYS_SELF_EXTEND;
    if (rope_length_dependent(&t->rope) && t->pos.dynamic_exact) return KEYS_PER_LENGTH;
    return KEYS_ROTATED_ONCE;
}

/* Check every position setting in effect (the checkpoint's, with the
 * overrides applied), and the combinations: each message names the flag. */
static int check_positions(const Transformer *t, const PositionOverrides *ov, char *err, size_t err_len) {
    const RopeConfig *r = &t->rope;
    const PositionSettings *p = &t->pos;
    int head_size = t->config.dim / t->config.n_heads, sinks = t->keys == KEYS_SINKS;
    int kv_dim = head_size * t->config.n_kv_heads;
    if (t->kv_type == KV_Q8_0 && kv_dim % KV_Q8_BLOCK) // blocks run along a cache row (kernels.h)
        return fail(err, err_len, "--kv q8_0: expected kv_dim (n_kv_heads %d x head_size %d) a multiple of %d, "
                    "got %d (--kv f16 takes any shape)", t->config.n_kv_heads, head_size, KV_Q8_BLOCK, kv_dim);
    if (sinks && p->n_sinks >= t->n_ctx)
        return fail(err, err_len, "--sinks %d: expected fewer than the %d tokens of the cache (--ctx)", p->n_sinks,
                    t->n_ctx);
    if (p->window > 0 && (sinks || p->se_group > 0))
        return fail(err, err_len, "%s with a sliding window of %d (%s): choose one (--window 0 turns the window off)",
                    sinks ? "--sinks" : "--self-extend", p->window,
                    ov && ov->window.given && ov->window.value > 0 ? "--window" : "the checkpoint's");
    if (!(r->base > 1.0 && isfinite(r->base)))
        return fail(err, err_len, "--rope-base %g: expected a finite value > 1", r->base);
    if (!(r->factor >= 1.0 && isfinite(r->factor)))
        return fail(err, err_len, "--rope-factor %g: expected a finite value >= 1", r->factor);
    if (r->rot_dim < 2 || r->rot_dim > head_size || r->rot_dim % 2)
        return fail(err, err_len, "rot_dim %d: expected an even number in 2..%d", r->rot_dim, head_size);
    if (r->orig_ctx < 1) return fail(err, err_len, "--rope-orig-ctx %d: expected >= 1", r->orig_ctx);
    if (r->scaling == ROPE_YARN && !(r->beta_fast > r->beta_slow && r->beta_slow > 0))
        return fail(err, err_len, "--yarn-beta-fast %g / --yarn-beta-slow %g: expected beta_fast > beta_slow > 0",
                    r->beta_fast, r->beta_slow);
    if (r->scaling == ROPE_LLAMA3 && !(r->high_freq > r->low_freq && r->low_freq > 0))
        return fail(err, err_len, "--llama3-low-freq %g / --llama3-high-freq %g: expected high > low > 0",
                    r->low_freq, r->high_freq);
    if (p->se_group > 0 && rope_length_dependent(r))
        return fail(err, err_len, "--self-extend with --rope-scaling %s: choose one (both re-assign how "
                    "cached keys are rotated)", r->scaling == ROPE_DYNAMIC ? "dynamic" : "longrope");
    if (r->scaling == ROPE_LONGROPE && !r->short_factor)
        return fail(err, err_len, "--rope-scaling longrope: the checkpoint has no LongRoPE factor arrays (they "
                    "come from a Hugging Face rope_type \"longrope\" export)");
    if (sinks && p->se_group > 0)
        return fail(err, err_len, "--sinks with --self-extend: choose one (both re-assign the positions of "
                    "cached keys)");
    return 0;
}

/* A scaling method and its factor s only mean something together; before the
 * overrides are applied (t holds the checkpoint's values), refuse
 *  - --rope-factor when the scaling in effect is none: it would change nothing;
 *  - --rope-scaling METHOD without --rope-factor when the checkpoint stores no
 *    factor above 1: METHOD would run at s = 1, which for linear, ntk, yarn
 *    and llama3 is plain RoPE. (LongRoPE is exempt: its factor arrays, which
 *    only a longrope checkpoint has, scale the frequencies at any s.) */
static int check_factor(const Transformer *t, const PositionOverrides *ov, const char *path, int n_ctx, char *err,
                        size_t err_len) {
    if (!ov) return 0;
    int scaling = ov->scaling.given ? ov->scaling.value : t->rope.scaling, train_ctx = t->config.train_ctx;
    if (ov->factor.given && scaling == ROPE_NONE)
        return fail(err, err_len, "--rope-factor %g: the RoPE scaling in effect is none (%s), so a factor "
                    "changes nothing (add --rope-scaling linear|ntk|dynamic|yarn|llama3|longrope)",
                    ov->factor.value, ov->scaling.given ? "--rope-scaling none" : path);
    if (!ov->scaling.given || scaling == ROPE_NONE || scaling == ROPE_LONGROPE || ov->factor.given ||
        t->rope.factor > 1.0)
        return 0;
    if (n_ctx > train_ctx)
        return fail(err, err_len, "--rope-scaling %s: needs --rope-factor s (%s stores no factor); to stretch its "
                    "train_ctx %d to --ctx %d, s = %g", SCALING_NAMES[scaling], path, train_ctx, n_ctx,
                    (double)n_ctx / train_ctx);
    return fail(err, err_len, "--rope-scaling %s: needs --rope-factor s (%s stores no factor), e.g. s = ctx / %d "
                "for a --ctx past its train_ctx %d", SCALING_NAMES[scaling], path, train_ctx, train_ctx);
}

/* build_transformer without the run state: load the checkpoint, apply the
 * overrides, set and check the position settings for n_ctx positions (0 =
 * train_ctx), and allocate nothing more. The modes that run no model (rope,
 * tokenize, info, passkey --prompts-only) need no more. Returns as
 * build_transformer. */
int configure_transformer(Transformer *t, const char *path, const PositionOverrides *overrides, int n_ctx,
                          int kv_type, char *err, size_t err_len) {
    if (load_checkpoint(t, path, err, err_len) != 0) return BUILD_BAD_INPUT;
    const PositionOverrides *ov = overrides;
    if (check_factor(t, ov, shown_path(path), n_ctx, err, err_len) != 0) return BUILD_BAD_SETTINGS;
    t->kv_type = kv_type;
    apply_overrides(t, ov);
    t->n_ctx = n_ctx > 0 ? n_ctx : t->config.train_ctx;
    t->keys = key_strategy(t, ov);
    t->table_rows = t->n_ctx; // and with sinks in blocks the rows of a block past the cache (sinks_block)
    if (t->keys == KEYS_SINKS && block_limit(t) > 1) t->table_rows += block_limit(t) - 1;
    if (t->pos.window >= t->n_ctx) t->pos.window = 0; // a window as long as the cache never leaves a key out
    if (check_positions(t, ov, err, err_len) != 0) return BUILD_BAD_SETTINGS;
    return 0;
}

/* Load a checkpoint, apply the command line's overrides, size everything
 * for n_ctx positions (0 = train_ctx) with a KV cache of kv_type (KV_F32 |
 * KV_F16 | KV_Q8_0). Returns 0; BUILD_BAD_INPUT with a message for a bad
 * checkpoint or no memory; BUILD_BAD_SETTINGS for position settings that do
 * not fit together, a q8_0 cache on a kv_dim it cannot hold, or a context
 * whose buffers exceed the machine's memory (bad usage: they come from
 * flags). The messages name the flag that set the
 * context: overrides->ctx_flag, else --ctx.
 * Owns the mapping and the run state; release with free_transformer. */
int build_transformer(Transformer *t, const char *path, const PositionOverrides *overrides, int n_ctx, int kv_type,
                      char *err, size_t err_len) {
    int rc = configure_transformer(t, path, overrides, n_ctx, kv_type, err, err_len);
    if (rc != 0) return rc;
    char ctx_name[80];
    if (overrides && overrides->ctx_flag)
        snprintf(ctx_name, sizeof ctx_name, "%s (a context of %d positions)", overrides->ctx_flag, t->n_ctx);
    else snprintf(ctx_name, sizeof ctx_name, n_ctx > 0 ? "--ctx %d" : "--ctx %d (the default: train_ctx)", t->n_ctx);
    return build_run_state(t, ctx_name, err, err_len);
}

size_t kv_position_bytes(const Transformer *t, int kv_type) {
    const Config *c = &t->config;
    size_t kv_dim = (size_t)(c->dim / c->n_heads) * c->n_kv_heads;
    return kv_type == KV_Q8_0 && kv_dim % KV_Q8_BLOCK ? 0 : 2 * (size_t)c->n_layers * kv_bytes(kv_type, kv_dim);
}

/* Release everything build_transformer (or a failed call of it) acquired. */
void free_transformer(Transformer *t) {
    RunState *st = &t->state;
    void *bufs[] = {st->x, st->xb, st->xb2, st->hb, st->hb2, st->q, st->k, st->v, st->scores, st->attn_tiles,
                    st->logits, st->key_cache, st->value_cache, st->rope_cos, st->rope_sin, st->q_second,
                    st->key_rot, st->key_grouped, st->value_rows, st->frame_rows, st->frame_freq, st->mm.x_q,
                    st->mm.x_scale, st->mm.w_rows, st->mm.x_t, st->mm.x_qt, st->mm.x_scale_t, st->mm.w_sums,
                    st->mm.x_sum};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(st->inv_freq);
    if (t->mapping) munmap(t->mapping, t->file_size);
    free(t->converted); // a GGUF's converted tensors
    memset(t, 0, sizeof *t);
}

/* ==========================================================================
 * 4. Ops: each is one formula; output first, inputs next, sizes last.
 *
 * The ops work on a block of B consecutive tokens at once (rows of a
 * (B, ...) array): generation uses B = 1; a prompt or a ppl window goes
 * through in blocks, so every weight row read from memory serves B tokens.
 * A row's result does not depend on the thread count; B = 1 and B > 1 use
 * different kernels, which agree to float rounding.
 * ========================================================================== */

/* out = x * w / sqrt(mean(x^2) + eps), per row        x, out: (B, n); w: (n) */
void rmsnorm(float *out, const float *x, const float *w, int B, int n, float eps) {
    for (int b = 0; b < B; b++) {
        const float *xr = x + (size_t)b * n;
        float *o = out + (size_t)b * n;
        float scale = 1.0f / sqrtf(dot(xr, xr, n) / n + eps);
        for (int i = 0; i < n; i++) o[i] = w[i] * (scale * xr[i]);
    }
}

/* out = x @ w^T,  out[b][i] = sum_k x[b][k] * w[i][k]
 * x (B, n), w (d, n) float32 -> out (B, d)
 * The definition of matmul. The forward pass calls kernels.c's matmul, which
 * computes this same product over float32, q8_0, q4_0 or q4_1 weights with SIMD tiles
 * and threads; the tests check every one of its paths against this loop, and
 * `make reference` builds a ./run-reference whose forward pass calls this
 * loop instead (project, section 5). */
void matmul_reference(float *out, const float *x, const float *w, int B, int n, int d) {
    for (int b = 0; b < B; b++)
        for (int i = 0; i < d; i++) {
            float sum = 0.0f;
            for (int k = 0; k < n; k++) sum += x[(size_t)b * n + k] * w[(size_t)i * n + k];
            out[(size_t)b * d + i] = sum;
        }
}

/* x = exp(x - max) / sum(exp(x - max))          x: (n), in place.
 * Subtracting the max changes nothing mathematically and keeps exp() finite. */
void softmax(float *x, int n) {
    float max = x[0];
    for (int i = 1; i < n; i++) max = x[i] > max ? x[i] : max;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < n; i++) {
        x[i] = exp_fast(x[i] - max);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

/* Scale a row of scores by 1/sqrt(head_size) and softmax entries lo..n-1
 * (the keys the query may see); zero the rest of the row's `width`. */
static void attention_weights(float *row, int lo, int n, int width, int head_size) {
    float scale = 1.0f / sqrtf((float)head_size);
    for (int j = lo; j < n; j++) row[j] *= scale;
    softmax(row + lo, n - lo);
    for (int j = 0; j < lo; j++) row[j] = 0.0f;
    for (int j = n; j < width; j++) row[j] = 0.0f;
}

/* The first key a query that sees n keys may attend to: n - window with a
 * sliding window (window > 0), else 0. */
static int window_start(int n, int window) { return window > 0 && n > window ? n - window : 0; }

/* Whether attention takes B queries one at a time, keeping the weights in
 * st->scores (one query without frames or sinks' second queries), or in
 * blocks (attention_block). */
static int one_query_path(const CacheView *view, int B) {
    return B == 1 && !view->frames && !view->second.n_sinks;
}

/* Causal multi-head attention for B tokens, whose queries sit at rows
 * p_b = view.pos0 + b of the view of the cache (CacheView: the rows as the
 * RoPE stage laid them out, their positions; with sinks, their places); row b
 * attends to the rows j = lo_b .. p_b:
 *   scores[j] = q . k_j / sqrt(head_size)
 *   weights   = softmax(scores)
 *   out       = sum_j weights[j] * v_j
 * with lo_b = 0, or with a sliding window (view.window > 0)
 * lo_b = max(0, p_b + 1 - window): the `window` most recent keys, its own
 * included.
 * Query head h reads kv head h / (n_heads / n_kv_heads): the contiguous
 * grouping of GQA/MQA, as Hugging Face's repeat_kv. With second queries
 * (view.second), the keys they name are scored as q2_b . k2_j instead:
 * Self-Extend's keys W or more positions before row b's (rope_stage's (c)),
 * or a block's sinks, rows 0..n_sinks-1, which every query sees whatever the
 * window (sinks_block). With frames (view.frames: exact dynamic NTK past L,
 * rope_stage's (b)), q and the keys are rotated per query first.
 * out, q: (B, n_heads, head_size).
 * A block (B > 1: prompts, ppl windows) goes to kernels.c's attention_block,
 * which computes this formula in tiles of queries x keys with an online
 * softmax (a running maximum and sum per query, kernels.h), never storing a
 * row of scores. One query (generation) goes as written above, head by head:
 * kv_scores, attention_weights, kv_mix (frames and sinks' second queries come
 * only with blocks). The two agree to float rounding; `make reference` builds
 * a ./run-reference that takes every other block one query at a time this
 * way. t gives the shapes, and its state the scratch: scores for one query,
 * attn_tiles for a block. */
void attention(float *out, const float *q, const CacheView *view, int B, Transformer *t) {
    const Config *c = &t->config;
    int n_heads = c->n_heads, head_size = c->dim / n_heads, kv_dim = head_size * c->n_kv_heads;
    int kv_mul = n_heads / c->n_kv_heads, n_ctx = t->n_ctx;
    const SecondQueries *second = &view->second;
#ifdef REFERENCE
    if (B > 1 && !view->frames && !second->n_sinks) { // make reference: B single queries, the formula as below
        for (int b = 0; b < B; b++) {
            CacheView one = *view;
            one.pos0 += b;
            if (one.second.q) one.second.q += (size_t)b * c->dim;
            attention(out + (size_t)b * c->dim, q + (size_t)b * c->dim, &one, 1, t);
        }
        return;
    }
#endif
    if (!one_query_path(view, B)) {
        const AttnTally *tally = t->state.attn_stats ? attn_stats_tally(t->state.attn_stats) : NULL;
        attention_block(out, q, view->keys, view->key_type, view->values, view->value_type,
                        second->q ? second : NULL, view->frames, tally, B, view->pos0, view->window, n_heads,
                        c->n_kv_heads, head_size, t->state.attn_tiles, t->state.mm.threads);
        return;
    }
    int n = view->pos0 + 1, h; // one query: n keys, the first g against the second query (Self-Extend's grouped)
    int g = second->q && n > second->far ? n - second->far : 0;
    int lo = window_start(n, view->window); // keys lo..n-1; Self-Extend (g > 0) has no window
#pragma omp parallel for private(h) if ((long)n_heads * head_size * n >= PARALLEL_MIN_WORK)
    for (h = 0; h < n_heads; h++) {
        size_t row = (size_t)h * head_size, kv_offset = (size_t)(h / kv_mul) * head_size;
        float *scores = t->state.scores + (size_t)h * n_ctx;
        if (g) kv_scores(scores, second->q + row, second->keys, KV_F32, kv_offset, kv_dim, g, head_size);
        kv_scores(scores + g + lo, q + row, view->keys, view->key_type, (size_t)(g + lo) * kv_dim + kv_offset, kv_dim,
                  n - g - lo, head_size);
        attention_weights(scores, lo, n, n, head_size);
        kv_mix(out + row, scores + lo, view->values, view->value_type, (size_t)lo * kv_dim + kv_offset, kv_dim,
               n - lo, head_size);
    }
}

/* hb = silu(hb) * hb2,  silu(x) = x * sigmoid(x)        hb, hb2: (n)
 * PyTorch: w2(F.silu(w1(x)) * w3(x)); this is the part between the matmuls. */
void swiglu(float *hb, const float *hb2, int n) {
    for (int i = 0; i < n; i++) {
        float g = hb[i];
        hb[i] = g / (1.0f + exp_fast(-g)) * hb2[i];
    }
}

/* x += y        x, y: (n) */
void residual_add(float *x, const float *y, int n) {
    for (int i = 0; i < n; i++) x[i] += y[i];
}

/* ==========================================================================
 * 5. Forward pass: B tokens at positions pos0.. -> logits
 * ========================================================================== */

/* out = x @ w_l^T + b_l for layer l's rows of a stacked matrix w (n_layers, d, n)
 * and, when the model has one, its bias b (n_layers, d); with the run state's
 * matmul scratch.        x (B, n) -> out (B, d) */
static void project(RunState *st, float *out, const float *x, Matrix w, const float *bias, int l, int B, int n,
                    int d) {
    Matrix w_l = matrix_rows(w, (size_t)l * d, (size_t)n); // layer l's (d, n)
#ifdef REFERENCE
    // make reference: the definition, over the layer's rows as float32
    // (quantized rows dequantized by matrix_row: kernels.h gives each type's formula)
    float *w_f32 = w_l.type == WEIGHT_F32 ? NULL : malloc((size_t)d * n * sizeof(float));
    if (w_l.type != WEIGHT_F32 && !w_f32) die(EXIT_BAD_INPUT, "out of memory");
    for (int i = 0; w_f32 && i < d; i++) matrix_row(w_f32 + (size_t)i * n, w_l, i, n);
    matmul_reference(out, x, w_f32 ? w_f32 : (const float *)w_l.values, B, n, d);
    free(w_f32);
    (void)st;
#else
    matmul(out, x, w_l, B, n, d, &st->mm);
#endif
    if (!bias) return;
    const float *b_l = bias + (size_t)l * d;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < d; i++) out[(size_t)b * d + i] += b_l[i];
}

/* The sliding window of layer l: the run's window (the checkpoint's, or
 * --window) when l is one of the layers that use it, else 0 (every key). */
static int layer_window(const Transformer *t, int l) {
    return l >= t->pos.window_first_layer ? t->pos.window : 0;
}

/* Run tokens[0..B) at positions pos0..pos0+B-1 through the model, writing
 * their keys and values into the cache, and compute the logits `want` asks
 * for into t->state.logits: (B, vocab_size) for LOGITS_ALL, the last token's
 * (vocab_size) for LOGITS_LAST; LOGITS_NONE skips the classifier, the largest
 * matrix (vocab_size rows), for a prompt block that only fills the cache.
 * Returns 0; FORWARD_DOES_NOT_FIT (nothing
 * computed) when the block does not fit (B above block_limit, past n_ctx) or
 * a token is outside the vocabulary; FORWARD_NOT_FINITE when a logit is NaN
 * or infinite: a NaN or infinite weight, or activations that overflowed (the
 * check sits here, where every mode reads the logits, instead of a scan of
 * every weight at load). */
int forward_block(Transformer *t, const int *tokens, int B, int pos0, LogitsWanted want) {
    const Config *c = &t->config;
    const Weights *w = &t->weights;
    RunState *st = &t->state;
    if (B < 1 || B > block_limit(t) || pos0 < 0 || (pos0 + B > t->n_ctx && t->keys != KEYS_SINKS))
        return FORWARD_DOES_NOT_FIT;
    for (int b = 0; b < B; b++)
        if (tokens[b] < 0 || tokens[b] >= c->vocab_size) return FORWARD_DOES_NOT_FIT;
    int dim = c->dim, hidden_dim = c->hidden_dim, kv_dim = dim / c->n_heads * c->n_kv_heads;
    rope_prepare(t, B, pos0); // what the RoPE stage needs once for the block (exact dynamic NTK's frames)

    // x = token_embedding[tokens]                                  (B, dim)
    for (int b = 0; b < B; b++) matrix_row(st->x + (size_t)b * dim, w->token_embedding, tokens[b], dim);

    for (int l = 0; l < c->n_layers; l++) {
        size_t ld = (size_t)l * dim;                                       // layer l's norm weights
        size_t kv_layer = kv_bytes(t->kv_type, (size_t)l * t->n_ctx * kv_dim); // layer l in the caches
        void *key_cache = (char *)st->key_cache + kv_layer;                // (n_ctx, kv_dim)
        void *value_cache = (char *)st->value_cache + kv_layer;            // (n_ctx, kv_dim)

        // attention block: x += wo @ attention(rope(wq @ h), rope(wk @ h), wv @ h)
        rmsnorm(st->xb, st->x, w->rms_att_weight + ld, B, dim, c->norm_eps); // h (B, dim)
        project(st, st->q, st->xb, w->wq, w->bq, l, B, dim, dim);          // q (B, n_heads, head_size)
        project(st, st->k, st->xb, w->wk, w->bk, l, B, dim, kv_dim);       // k (B, n_kv_heads, head_size)
        project(st, st->v, st->xb, w->wv, w->bv, l, B, dim, kv_dim);       // v (B, n_kv_heads, head_size)
        CacheView view = rope_stage(t, key_cache, value_cache, B, pos0, layer_window(t, l)); // q rotated; k, v
        attention(st->xb, st->q, &view, B, t);                             // (B, dim)    into the cache
        if (st->attn_stats) // ppl --attn-stats: the block's tally, or one query's weights
            attn_stats_add(st->attn_stats, l, pos0, B, one_query_path(&view, B) ? st->scores : NULL);
        project(st, st->xb2, st->xb, w->wo, w->bo, l, B, dim, dim);        // (B, dim)
        residual_add(st->x, st->xb2, B * dim);

        // feed-forward block: x += w2 @ (silu(w1 @ h) * (w3 @ h))
        rmsnorm(st->xb, st->x, w->rms_ffn_weight + ld, B, dim, c->norm_eps);
        project(st, st->hb, st->xb, w->w1, w->b1, l, B, dim, hidden_dim);  // (B, hidden_dim)
        project(st, st->hb2, st->xb, w->w3, w->b3, l, B, dim, hidden_dim); // (B, hidden_dim)
        swiglu(st->hb, st->hb2, B * hidden_dim);
        project(st, st->xb2, st->hb, w->w2, w->b2, l, B, hidden_dim, dim); // (B, dim)
        residual_add(st->x, st->xb2, B * dim);
    }

    // logits = rmsnorm(x) @ wcls^T          (B, vocab_size), or the last row only
    if (want == LOGITS_NONE) return 0;
    int first = want == LOGITS_ALL ? 0 : B - 1, n_out = B - first;
    float *x_out = st->x + (size_t)first * dim;
    rmsnorm(x_out, x_out, w->rms_final_weight, n_out, dim, c->norm_eps);
    project(st, st->logits, x_out, w->wcls, NULL, 0, n_out, dim, c->vocab_size);
    int finite = 1;
    for (size_t i = 0; i < (size_t)n_out * c->vocab_size; i++) finite &= isfinite(st->logits[i]);
    return finite ? 0 : FORWARD_NOT_FINITE;
}

/* One token at pos -> its logits (vocab_size): generation's step. NULL when
 * forward_block fails; *status (may be NULL) gets its code. */
float *forward(Transformer *t, int token, int pos, int *status) {
    int rc = forward_block(t, &token, 1, pos, LOGITS_LAST);
    if (status) *status = rc;
    return rc == 0 ? t->state.logits : NULL;
}

/* tokens[0..n) at positions pos0.. into the cache, in blocks; returns the
 * logits of the last one (vocab_size), or NULL when forward_block fails
 * (*status, which may be NULL, gets its code). A prompt, or a chat turn. */
float *prefill(Transformer *t, const int *tokens, int n, int pos0, int *status) {
    int rc = FORWARD_DOES_NOT_FIT;
    for (int i = 0; i < n; i += block_limit(t)) {
        int B = n - i < block_limit(t) ? n - i : block_limit(t);
        rc = forward_block(t, tokens + i, B, pos0 + i, i + B == n ? LOGITS_LAST : LOGITS_NONE);
        if (rc != 0) break;
    }
    if (status) *status = rc;
    return rc == 0 ? t->state.logits : NULL;
}

/* Exit with a one-line message for a failed forward step at position pos. */
void forward_failed(const Transformer *t, int status, int token, int pos) {
    if (status == FORWARD_NOT_FINITE)
        die(EXIT_BAD_INPUT, "forward: the logits at position %d are NaN or infinite (the checkpoint holds a NaN "
            "or infinite weight, or the activations overflowed)", pos);
    die(EXIT_BAD_INPUT, "forward: token %d at position %d does not fit (context %d, vocabulary %d)", token, pos,
        t->n_ctx, t->config.vocab_size);
}

/* ==========================================================================
 * 6. Sampler
 *
 * Order, applied to the logits of each step:
 *   1. repetition penalty over the last repeat_last_n tokens (llama.cpp's
 *      rule: a positive logit is divided by the penalty, a negative one
 *      multiplied; each distinct token once);
 *   2. temperature 0 -> argmax (greedy), done;
 *   3. logits / temperature, softmax;
 *   4. top-k: keep the k most probable;
 *   5. top-p: keep the smallest prefix whose probability reaches p;
 *   6. min-p: keep tokens with prob >= min_p * (largest prob);
 *   7. draw from what is left, renormalized, with a seeded xorshift RNG.
 * ========================================================================== */

/* Sampler and its candidates (ProbIndex) are declared in run.h. */

/* xorshift64* (Marsaglia's xorshift, with a multiplying output step). */
uint32_t random_u32(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}
float random_f32(uint64_t *state) { return (random_u32(state) >> 8) / 16777216.0f; } // [0, 1)

/* Allocates the sampler's scratch; free_sampler releases it. Any seed is
 * valid: it is mixed (splitmix64) so that the xorshift state is never zero. */
int build_sampler(Sampler *sampler, int vocab_size, float temperature, float topp, int topk, float minp,
                  float repeat_penalty, int repeat_last_n, uint64_t seed) {
    *sampler = (Sampler){vocab_size, temperature, topp, topk, minp, repeat_penalty, repeat_last_n, 0, NULL, NULL};
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    sampler->rng_state = (z ^ (z >> 31)) | 1;
    sampler->candidates = malloc((size_t)vocab_size * sizeof(ProbIndex));
    sampler->seen = calloc((size_t)vocab_size, 1);
    return sampler->candidates && sampler->seen ? 0 : -1;
}

void free_sampler(Sampler *sampler) {
    free(sampler->candidates);
    free(sampler->seen);
}

static int compare_prob_desc(const void *a, const void *b) {
    const ProbIndex *x = a, *y = b;
    if (x->prob != y->prob) return x->prob > y->prob ? -1 : 1;
    return x->index - y->index; // ties: lower id first, so the order is total
}

int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Apply the penalty to logits for each distinct token among history[0..n). */
void apply_repetition_penalty(Sampler *sampler, float *logits, const int *history, int n) {
    if (sampler->repeat_penalty == 1.0f || sampler->repeat_last_n == 0) return;
    int start = n > sampler->repeat_last_n ? n - sampler->repeat_last_n : 0;
    for (int i = start; i < n; i++) {
        int id = history[i];
        if (sampler->seen[id]) continue;
        sampler->seen[id] = 1;
        logits[id] = logits[id] > 0 ? logits[id] / sampler->repeat_penalty : logits[id] * sampler->repeat_penalty;
    }
    for (int i = start; i < n; i++) sampler->seen[history[i]] = 0;
}

/* Choose the next token from logits (modified in place). history holds the n
 * tokens so far (prompt included), for the repetition penalty. */
int sample(Sampler *sampler, float *logits, const int *history, int n) {
    apply_repetition_penalty(sampler, logits, history, n);
    int greedy = argmax(logits, sampler->vocab_size);
    if (sampler->temperature == 0.0f) return greedy;
    for (int i = 0; i < sampler->vocab_size; i++) logits[i] /= sampler->temperature;
    softmax(logits, sampler->vocab_size);

    // Candidates worth sorting. Without top-k, a token below (1 - topp)/(V - 1)
    // cannot be inside the top-p nucleus (llama2.c's argument: if all of the
    // nucleus were below it, the rest could not sum to more than 1 - topp).
    int n_cand = 0;
    float cutoff = 0.0f;
    if (sampler->topk == 0 && sampler->topp < 1.0f && sampler->vocab_size > 1)
        cutoff = (1.0f - sampler->topp) / (sampler->vocab_size - 1);
    for (int i = 0; i < sampler->vocab_size; i++)
        if (logits[i] >= cutoff) sampler->candidates[n_cand++] = (ProbIndex){logits[i], i};
    int truncating = sampler->topk > 0 || sampler->topp < 1.0f || sampler->minp > 0.0f;
    if (truncating) qsort(sampler->candidates, (size_t)n_cand, sizeof(ProbIndex), compare_prob_desc);
    if (sampler->topk > 0 && sampler->topk < n_cand) n_cand = sampler->topk;
    if (sampler->topp < 1.0f) { // the nucleus of what top-k kept, renormalized (as HF and llama.cpp)
        float kept = 0.0f, cum = 0.0f;
        for (int i = 0; i < n_cand; i++) kept += sampler->candidates[i].prob;
        for (int i = 0; i < n_cand; i++) {
            cum += sampler->candidates[i].prob;
            if (cum >= sampler->topp * kept) {
                n_cand = i + 1;
                break;
            }
        }
    }
    if (sampler->minp > 0.0f) {
        float threshold = sampler->minp * sampler->candidates[0].prob;
        int keep = 1;
        while (keep < n_cand && sampler->candidates[keep].prob >= threshold) keep++;
        n_cand = keep;
    }
    float total = 0.0f;
    for (int i = 0; i < n_cand; i++) total += sampler->candidates[i].prob;
    // Nothing left to draw from: every probability was NaN or 0 (a temperature
    // so small that logits / t overflowed, or non-finite logits). Be greedy.
    if (n_cand == 0 || !(total > 0.0f) || !isfinite(total)) return greedy;
    float r = random_f32(&sampler->rng_state) * total, cum = 0.0f;
    for (int i = 0; i < n_cand; i++) {
        cum += sampler->candidates[i].prob;
        if (r < cum) return sampler->candidates[i].index;
    }
    return sampler->candidates[n_cand - 1].index; // rounding: r landed on the total
}

/* ==========================================================================
 * 7. Generate: prompt -> prefill -> sample, print, feed back
 *
 * The decode step here is shared with chat (chat.c); the other modes are in
 * files of their own (modes.h).
 * ========================================================================== */

/* Encode text (with BOS first when add_bos) into a new array; exits on failure. */
int *encode_or_die(const Tokenizer *tok, const char *what, const char *text, size_t len, int add_bos,
                   int *n_out) {
    if (len > ENCODE_PIECE) { // in pieces, as ppl does: memory follows the ids, not the encoder's buffers
        int *ids, n = tokenizer_encode_long(tok, text, len, ENCODE_PIECE, &ids, NULL);
        int *with_bos = n < 0 ? NULL : realloc(ids, ((size_t)n + 1) * sizeof(int));
        if (!with_bos) die(EXIT_BAD_INPUT, "%s: out of memory while encoding %zu bytes", shown_path(what), len);
        if (add_bos) memmove(with_bos + 1, with_bos, (size_t)n * sizeof(int)), with_bos[0] = tok->bos_id;
        *n_out = n + (add_bos != 0);
        return with_bos;
    }
    int *ids = malloc(tokenizer_bound(len) * sizeof(int));
    if (!ids) die(EXIT_BAD_INPUT, "%s: cannot allocate a token buffer for %zu bytes", shown_path(what), len);
    int n = tokenizer_encode(tok, text, len, add_bos, 0, ids);
    if (n < 0) die(EXIT_BAD_INPUT, "%s: out of memory while encoding %zu bytes", shown_path(what), len);
    *n_out = n;
    return ids;
}

/* The text of ids[0..n) following token prev, as the decoder prints it. */
char *tokens_text(const Tokenizer *tok, const int *ids, int n, int prev, size_t *len) {
    char *out = malloc((size_t)n * tokenizer_decode_bound(tok) + 16);
    if (!out) die(EXIT_BAD_INPUT, "out of memory");
    DecodeState ds = {{0}, 0};
    size_t k = 0;
    for (int i = 0; i < n; prev = ids[i++]) k += tokenizer_decode(tok, &ds, prev, ids[i], out + k);
    k += tokenizer_decode_flush(&ds, out + k);
    out[k] = '\0';
    *len = k;
    return out;
}

void decoder_init(Decoder *d, Transformer *t, const Tokenizer *tok, Sampler *sampler, int capacity) {
    *d = (Decoder){t, tok, sampler, malloc(((size_t)capacity + 1) * sizeof(int)), 0, {{0}, 0},
                   malloc(tokenizer_decode_bound(tok))};
    if (!d->history || !d->buf) die(EXIT_BAD_INPUT, "out of memory");
}

void decoder_free(Decoder *d) {
    free(d->history);
    free(d->buf);
}

/* Decode `token` after the last token of history and write it to stdout. */
static void emit(Decoder *d, int token) {
    size_t n = tokenizer_decode(d->tok, &d->ds, d->n > 0 ? d->history[d->n - 1] : -1, token, d->buf);
    out_write(d->buf, n);
    flush_stdout();
}

/* Print what the decoder still holds back, then a newline. */
void end_text(Decoder *d) {
    size_t n = tokenizer_decode_flush(&d->ds, d->buf);
    out_write(d->buf, n);
    out_write("\n", 1);
    flush_stdout();
}

/* The decode step generate and chat share: sample the next token from the
 * logits of the last one; unless it is one of the n_end end tokens, print it
 * and append it to history. Returns the token, or -1 when the text ends
 * here. The caller feeds it back (forward) if there is room. */
int decode_step(Decoder *d, float *logits, const int *end, int n_end) {
    int next = sample(d->sampler, logits, d->history, d->n);
    for (int i = 0; i < n_end; i++)
        if (next == end[i]) return -1;
    emit(d, next);
    d->history[d->n++] = next;
    return next;
}

/* A prompt shorter than this gets no rate: a few tokens' prefill is mostly
 * the first forward step's one-time costs (the weights cold in the caches,
 * the mapping's first page faults, threads starting), not the speed of a
 * block. On the bundled model, one thread, 2-core VM: prompts of 3 and 5
 * tokens went through at 1,300-2,500 tok/s, no faster than generation (about
 * 2,500 tok/s), and 9 tokens at 3,800-5,700. */
#define MIN_TIMED_PROMPT 8

/* generate's last line on stderr: the token counts; the time from the
 * prompt's encoding to the first new token (prefill and one sample); the
 * prompt's rate (prefill), for a prompt of MIN_TIMED_PROMPT tokens or more;
 * and generation's rate over the tokens after the first (a forward step and
 * a sample each). */
static void print_timing(int n_prompt, int n_new, double prefill_s, double first_token_s, double after_first_s) {
    char line[256];
    int k = snprintf(line, sizeof line, "%d prompt + %d new tokens", n_prompt, n_new);
    if (n_new > 0)
        k += snprintf(line + k, sizeof line - (size_t)k, "; first token after %.1f ms", 1e3 * first_token_s);
    if (n_prompt < MIN_TIMED_PROMPT)
        k += snprintf(line + k, sizeof line - (size_t)k, "; prompt too short to time (under %d tokens)",
                      MIN_TIMED_PROMPT);
    else
        k += snprintf(line + k, sizeof line - (size_t)k, "; prompt %.1f tok/s", n_prompt / prefill_s);
    if (n_new > 1)
        snprintf(line + k, sizeof line - (size_t)k, ", generation %.1f tok/s", (n_new - 1) / after_first_s);
    notice("%s", line);
}

/* generate: stdout = the prompt's text, then the continuation, then "\n"
 * (llama2.c prints the same). The prompt (after BOS, when the tokenizer adds
 * one) goes through in blocks; sampling starts at its last token and stops at
 * max_new new tokens, a stop token (the tokenizer's stop ids, and BOS when it
 * adds one; not with ignore_eos, for benchmarks), or a full context (never,
 * with attention sinks: the cache rolls).
 * Statistics go to stderr. */
static void generate(Transformer *t, const Tokenizer *tok, Sampler *sampler, const char *what, const char *prompt,
                     size_t prompt_len, int max_new, int ignore_eos, const char *summary) {
    double start = now_seconds();
    // A token covers at most max_token_length bytes: a longer prompt cannot fit (refused before encoding it).
    size_t most_bytes = (size_t)t->n_ctx * (size_t)(tok->max_token_length > 0 ? tok->max_token_length : 1);
    if (prompt_len > most_bytes && t->keys != KEYS_SINKS)
        die(EXIT_BAD_INPUT, "%s: %zu bytes cannot fit in the context of %d tokens (at most %d bytes a token; raise "
            "--ctx, or roll the cache with --sinks n)", shown_path(what), prompt_len, t->n_ctx, tok->max_token_length);
    int n_prompt;
    int *prompt_ids = encode_or_die(tok, what, prompt, prompt_len, tok->add_bos, &n_prompt);
    if (n_prompt == 0)
        die(EXIT_BAD_INPUT, "prompt: empty, and this tokenizer adds no BOS to start from (give one with -i or -f)");
    if (n_prompt > t->n_ctx && t->keys != KEYS_SINKS) // a rolling cache takes any length
        die(EXIT_BAD_INPUT, "prompt: %d tokens (BOS included) do not fit in the context of %d tokens (raise --ctx, "
            "or roll the cache with --sinks n)", n_prompt, t->n_ctx);
    fputs(summary, stderr); // every input check has passed
    Decoder d;
    int capacity = n_prompt > t->n_ctx ? n_prompt : t->n_ctx;
    decoder_init(&d, t, tok, sampler, capacity);
    // The prompt's text, as the tokenizer reads it back.
    for (int i = 0; i < n_prompt; i++) {
        if (i > 0 || !tok->add_bos) emit(&d, prompt_ids[i]); // the BOS it added prints nothing
        d.history[d.n++] = prompt_ids[i];
    }
    free(prompt_ids);
    // Prefill: the prompt through the model in blocks; logits of its last token.
    double prefill_start = now_seconds();
    int status;
    float *logits = prefill(t, d.history, n_prompt, 0, &status);
    if (!logits) forward_failed(t, status, d.history[n_prompt - 1], n_prompt - 1);
    double prefill_end = now_seconds(), first_token = 0, last_token = 0;
    // Decode: sample, print, feed back, one token at a time.
    int n_new = 0, cut_short = 0, stops[TOK_MAX_STOP + 1], n_stop = 0; // cut_short: -n not reached, context full
    for (int i = 0; i < tok->n_stop; i++) stops[n_stop++] = tok->stop_ids[i];
    if (tok->add_bos) stops[n_stop++] = tok->bos_id; // BOS starts the next text (llama2.c's stories)
    if (ignore_eos) n_stop = 0;
    for (int pos = n_prompt; n_new < max_new; pos++) { // pos: where the sampled token goes
        n_new++;
        if (d.n == capacity + 1) { // attention sinks went past the cache: history keeps the last ones
            memmove(d.history, d.history + 1, (size_t)capacity * sizeof(int));
            d.n--;
        }
        int next = decode_step(&d, logits, stops, n_stop);
        last_token = now_seconds();
        if (n_new == 1) first_token = last_token;
        if (next < 0) break; // a stop token
        if (pos == t->n_ctx && t->keys != KEYS_SINKS) {
            cut_short = n_new < max_new;
            break;
        }
        logits = forward(t, next, pos, &status);
        if (!logits) forward_failed(t, status, next, pos);
    }
    end_text(&d); // the text's line ends before the notices
    if (cut_short)
        notice("generate: the context of %d tokens is full after %d new tokens; raise --ctx, or go on past it with "
               "attention sinks (--sinks 4)", t->n_ctx, n_new);
    print_timing(n_prompt, n_new, prefill_end - prefill_start, first_token - start, last_token - first_token);
    decoder_free(&d);
}

void generate_mode(const ModeInput *in) {
    if (in->o->prompt_file && in->text_len == 0) // as ppl and passkey refuse one; -i "" starts from BOS alone
        die(EXIT_BAD_INPUT, "-f %s: empty file (expected a prompt; -i \"\" starts from BOS alone)",
            shown_path(in->o->prompt_file));
    generate(in->t, in->tok, in->sampler, in->o->prompt_file ? in->text_name : "prompt", in->text, in->text_len,
             in->o->steps, in->o->ignore_eos, in->summary);
}

/* ==========================================================================
 * 8. main: the command line (cli.c) -> the model -> the mode
 * ========================================================================== */
#ifndef TESTING

/* The load line every mode prints to stderr once its inputs are good: the
 * model's shape, weights, the position setup (info.c: context, RoPE, scaling,
 * Self-Extend, sinks, window, KV cache type) with the cache's size, threads
 * and tokenizer (tok NULL: none), and a note when --rope-factor leaves a
 * stored YaRN or LongRoPE magnitude as it is. */
static void describe(char *out, size_t size, const Transformer *t, const char *checkpoint, const Tokenizer *tok,
                     const PositionOverrides *ov, double load_seconds) {
    const Config *c = &t->config;
    size_t cache_bytes = kv_position_bytes(t, t->kv_type) * t->n_ctx;
    char biases[32] = ""; // only some families have them
    if (c->bias_flags)
        snprintf(biases, sizeof biases, "; biases%s%s%s", c->bias_flags & BIAS_QKV ? " qkv" : "",
                 c->bias_flags & BIAS_O ? " o" : "", c->bias_flags & BIAS_MLP ? " mlp" : "");
    char setup[512];
    position_setup_text(setup, sizeof setup, t); // ends with the KV cache's type and bytes per position
    int threads = 1; // as build_run_state counts them (a mode that runs no model has no run state)
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    int len = snprintf(out, size,
            "%s: dim %d, hidden %d, %d layers, %d heads (%d kv), vocab %d, train_ctx %d%s; weights %s; %s, %.1f MiB; "
            "%d threads%s%s%s; loaded in %.2f s\n",
            shown_path(checkpoint), c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
            c->train_ctx, biases, WEIGHT_NAMES[c->weight_type], setup, cache_bytes / 1048576.0, threads,
            tok ? "; tokenizer " : "", tok ? tokenizer_type_name(tok) : "",
            tok && tok->from_gguf ? " from the GGUF's metadata (tokenizer.ggml.*)" : "", load_seconds);
    if (ov->factor.given && !ov->attn_factor.given && t->rope.attn_factor > 0 &&
        (t->rope.scaling == ROPE_YARN || t->rope.scaling == ROPE_LONGROPE) && len > 0 &&
        (size_t)len < size) // a stored magnitude is not derived from the factor
        snprintf(out + len, size - (size_t)len,
                 "note: --rope-factor %g keeps the checkpoint's attention factor %g (not the one derived from s); "
                 "set it with --rope-attn-factor\n", ov->factor.value, t->rope.attn_factor);
}

int main(int argc, char **argv) {
    Options o;
    const char *checkpoint = parse_args(argc, argv, &o); // exits on bad usage
    if (!flag_given(&o, "-s")) o.seed = o.mode == MODE_PASSKEY ? 0 : (long)time(NULL); // passkey's keys repeat
    int ctx = o.ctx;
    if (o.mode == MODE_PASSKEY) { // its lists are checked before the model loads; they may set the context
        int fits = passkey_context(&o);
        if (!flag_given(&o, "--ctx")) ctx = fits;
    }
    kernels_init(); // the kernels' choices for this CPU (kernels.h)
#ifdef _OPENMP
    if (o.threads > 0) omp_set_num_threads(o.threads);
#else
    if (o.threads > 1) notice("--threads %d: this build has no OpenMP; running on one thread", o.threads);
#endif

    // The model, with the command line's RoPE and position settings.
    char err[1024];
    Transformer t;
    double t0 = now_seconds();
    PositionOverrides overrides = position_overrides(&o);
    gguf_set_conversion(o.gguf_convert); // what a GGUF's quantized tensors become (gguf_model.c)
    int runs_model = o.mode == MODE_GENERATE || o.mode == MODE_CHAT || o.mode == MODE_PPL ||
                     (o.mode == MODE_PASSKEY && !o.prompts_only); // the others need no KV cache
    int built = (runs_model ? build_transformer : configure_transformer)(&t, checkpoint, &overrides, ctx, o.kv_type,
                                                                          err, sizeof err);
    if (built != 0) die(built == BUILD_BAD_SETTINGS ? EXIT_USAGE : EXIT_BAD_INPUT, "%s", err);
    self_extend_notice(&t); // a warning only: positions past the training length are what is being studied
    if (o.q8_activations && t.config.weight_type != WEIGHT_Q8_0)
        die(EXIT_USAGE, "--q8-activations int8: expected q8_0 weights, %s has %s ones", shown_path(checkpoint),
            WEIGHT_NAMES[t.config.weight_type]);
    t.state.mm.int8_blocks = o.q8_activations;

    // The tokenizer (every mode but rope reads text) and the text of -i or -f.
    Tokenizer tok = {0};
    char *tok_path = o.mode != MODE_ROPE ? load_tokenizer(&tok, &o, checkpoint, &t.config) : NULL;
    char summary[2048];
    describe(summary, sizeof summary, &t, checkpoint, o.mode != MODE_ROPE ? &tok : NULL, &overrides,
             now_seconds() - t0);
    size_t text_len = o.prompt ? strlen(o.prompt) : 0;
    char *text = NULL;
    if (o.prompt_file && !(text = read_file(o.prompt_file, "-f", &text_len, err, sizeof err)))
        die(EXIT_BAD_INPUT, "%s", err);

    // The mode.
    Sampler sampler;
    if (build_sampler(&sampler, t.config.vocab_size, (float)o.temperature, (float)o.topp, o.topk, (float)o.minp,
                      (float)o.repeat_penalty, o.repeat_last_n, (uint64_t)o.seed))
        die(EXIT_BAD_INPUT, "out of memory for the sampler");
    ModeInput in = {checkpoint, &t, &tok, tok_path, &sampler, &o, text ? text : o.prompt ? o.prompt : "", text_len,
                    o.prompt_file ? o.prompt_file : "-i", summary};
    void (*const modes[N_MODES])(const ModeInput *) = {
        [MODE_GENERATE] = generate_mode, [MODE_CHAT] = chat_mode, [MODE_PPL] = ppl_mode,
        [MODE_TOKENIZE] = tokenize_mode, [MODE_ROPE] = rope_mode, [MODE_PASSKEY] = passkey_mode,
        [MODE_INFO] = info_mode,
    };
    modes[o.mode](&in);
    flush_stdout(); // the last of the output, and its close, checked
    if (fclose(stdout) != 0) die(EXIT_BAD_INPUT, "stdout: write failed: %s", strerror(errno));

    free_sampler(&sampler);
    free(text);
    tokenizer_free(&tok);
    free(tok_path);
    free_transformer(&t);
    return 0;
}
#endif
