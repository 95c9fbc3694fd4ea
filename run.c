/* run.c: inference for Llama-architecture models in plain C.
 *
 * Read it top to bottom; the sections follow the data:
 *   1. errors and timing
 *   2. checkpoint: the model in memory; header -> validate -> expected size
 *      == file size -> mmap -> weight pointers
 *   3. RoPE: inverse frequencies (every scaling method) -> cos/sin table,
 *      built once; the rotation; the RoPE stage of each layer
 *   4. building and freeing the model: checkpoint + RoPE table + run state
 *   5. ops: rmsnorm, matmul, softmax, attention, swiglu, residual_add, each
 *      one formula (matmul's as a plain loop; attention calls kernels.c for
 *      its products over the KV cache)
 *   6. forward: a block of tokens through every layer, as a sequence of those
 *      ops and the RoPE stage
 *   7. sampler: repetition penalty -> temperature -> top-k -> top-p -> min-p -> draw
 *   8. modes: generate, chat, tokenize, ppl, rope
 *   9. command line and main (left out when tests #define TESTING and #include this file)
 * model.h describes the checkpoint format and the weights' shapes; kernels.c
 * computes matmul and attention over the KV cache fast (SIMD, q8_0 weights,
 * a half-precision cache, threads) and can be skipped on a first reading;
 * tokenizer.c is the only code that knows BPE; export.py is the only writer
 * of checkpoints.
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

#include "kernels.h"
#include "model.h"

#define PI 3.14159265358979323846 /* M_PI is not in strict C11 */

/* ==========================================================================
 * 1. Errors and timing
 *
 * Functions below report a bad input by returning -1 with a one-line
 * message in an err buffer (model.h's fail); only the modes and main, the
 * command line, print it and exit.
 * ========================================================================== */

/* Exit codes: 0 ok, 1 = bad input or runtime failure, 2 = bad usage. */
enum { EXIT_BAD_INPUT = 1, EXIT_USAGE = 2 };

#ifdef FUZZING
#include <setjmp.h>
static jmp_buf *die_jump; // a fuzz target's landing point (tests/fuzz): die returns there instead of exiting
#endif

/* Print one line to stderr and exit with `code`. Every message names the file
 * or flag at fault and what was expected; nothing is printed to stdout. */
static void die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void die(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
#ifdef FUZZING
    if (die_jump) longjmp(*die_jump, code);
#endif
    exit(code);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ==========================================================================
 * 2. Checkpoint: the model in memory; header -> validation -> size check ->
 *    mmap -> weight pointers
 * ========================================================================== */

/* Tokens one forward_block call carries (prompt prefill, ppl windows); every
 * weight row loaded from memory then serves this many tokens, and attention
 * reads each cached key once per tile of 128 queries (kernels.c). Measured on
 * a 2-core AVX-512 VM, 2 threads: 128 against 32 gives 1.4x the prompt rate
 * of a 110M-shaped model and 1.6x ppl --ctx 8192 on a 15M one; 256 was no
 * faster than 128, and its logits take twice the memory (B x vocab_size). */
#define FORWARD_BLOCK 128

/* Activations for a block of B <= FORWARD_BLOCK tokens, the KV cache and the
 * RoPE table. Owned by Transformer; allocated in build_transformer (section
 * 4), freed in free_transformer. */
typedef struct {
    float *x;           // (B, dim) residual stream
    float *xb;          // (B, dim) normalized input / attention output
    float *xb2;         // (B, dim) projection output before the residual add
    float *hb;          // (B, hidden_dim) gate, then SwiGLU output
    float *hb2;         // (B, hidden_dim) up projection
    float *q;           // (B, dim) query heads
    float *k;           // (B, kv_dim) keys of the block
    float *v;           // (B, kv_dim) values of the block
    float *scores;      // (n_heads, n_ctx) one query's attention scores, turned into weights by
                        // softmax in place (a block of queries keeps no scores: kernels.c's attention_block)
    float *attn_tiles;  // (threads, attention_block_floats(head_size)) attention_block's scratch, B > 1 only
    float *logits;      // (B, vocab_size)
    void *key_cache;    // (n_layers, n_ctx, kv_dim) float32 or IEEE half (--kv f16); keys
                        // rotated, or unrotated with a pre-RoPE cache
    void *value_cache;  // (n_layers, n_ctx, kv_dim) float32 or IEEE half
    MatmulScratch mm;   // matmul's scratch (kernels.h)
    float *rope_cos;    // (n_ctx, n_pairs) mscale * cos(pos * inv_freq[i]); n_pairs = rot_dim/2
    float *rope_sin;    // (n_ctx, n_pairs) mscale * sin(pos * inv_freq[i])
    double *inv_freq;   // (n_pairs) scratch for rebuilding table rows
    float *q_grouped;   // (B, dim) Self-Extend: the queries rotated at their group positions
    float *key_rot;     // (n_ctx, kv_dim) pre-RoPE cache only: one layer's keys rotated for
                        // this step, float32 whatever the cache's type
    float *key_grouped; // (n_ctx, kv_dim) Self-Extend: one layer's keys rotated at their group positions
} RunState;

typedef struct {
    Config config;
    RopeConfig rope;
    int n_ctx;          // positions this run can hold (KV cache and table rows)
    int prerope;        // 1: key_cache holds keys before RoPE, rotated for each query
                        //    (exact dynamic NTK and Self-Extend need this)
    int table_len;      // exact dynamic NTK: the sequence length the table rows were built for
    int kv_type;        // KV_F32 | KV_F16: what key_cache and value_cache hold (--kv)
    int window;         // sliding window W in effect (the checkpoint's, or --window); 0 = none.
                        // The cache still holds n_ctx positions: older keys stay, unread
    int window_first_layer; // layers l >= this one use the window
    Weights weights;
    RunState state;
    void *mapping;      // the whole checkpoint file, mmap'd read-only
    size_t file_size;
} Transformer;

/* Sanity limits on header values: far above any model this program can run on
 * a CPU, low enough that every size below fits in 64 bits without overflow. */
#define MAX_DIM (1 << 16)
#define MAX_HIDDEN (1 << 18)
#define MAX_LAYERS 1024
#define MAX_VOCAB (1 << 22)
#define MAX_CTX (1 << 24)

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
static size_t place_tensors(const Config *c, RopeConfig *r, Weights *w, const char *map) {
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
            *table[i].mat = (Matrix){c->weight_type, c->group_size, values, (const float *)scales};
    }
    return offset;
}

/* Total bytes a checkpoint with this header must have. */
static size_t expected_file_size(const Config *c, const RopeConfig *r) {
    Weights unused_w;
    RopeConfig unused_r = *r;
    return place_tensors(c, &unused_r, &unused_w, NULL);
}

/* Names of the RoPE settings, as the command line and the outputs spell them
 * (index = ROPE_NONE .., ROPE_INTERLEAVED ..; NULL ends a list of choices). */
static const char *const SCALING_NAMES[] = {"none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope", NULL};
static const char *const LAYOUT_NAMES[2] = {"interleaved", "neox"};

/* Parse the header bytes (n_read of them) into c and r. Values are only
 * copied here; validate_config checks them. */
static int parse_header(const char *path, const unsigned char *h, size_t n_read, Config *c, RopeConfig *r,
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
        if (weight_type < 0 || weight_type >= WEIGHT_N_TYPES)
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
static int validate_config(const char *path, const Config *c, const RopeConfig *r, char *err, size_t err_len) {
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

/* Open, validate and map a checkpoint into t->config, t->rope, t->weights.
 * Nothing is mapped and no pointer is formed until the header has passed
 * validation and the file size equals the size the header implies.
 * Returns 0, or -1 with a one-line message in err. */
int load_checkpoint(Transformer *t, const char *path, char *err, size_t err_len) {
    memset(t, 0, sizeof *t);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return fail(err, err_len, "%s: cannot open checkpoint: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return fail(err, err_len, "%s: cannot stat checkpoint: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fail(err, err_len, "%s: expected a checkpoint file, got a %s", path,
                    S_ISDIR(st.st_mode) ? "directory" : "special file");
    }
    size_t file_size = (size_t)st.st_size;
    if (file_size == 0) {
        close(fd);
        return fail(err, err_len, "%s: empty file (expected a checkpoint)", path);
    }
    unsigned char header[CKPT_HEADER_BYTES];
    ssize_t got = pread(fd, header, sizeof header, 0);
    if (got < 0) {
        close(fd);
        return fail(err, err_len, "%s: read error: %s", path, strerror(errno));
    }
    Config *c = &t->config;
    RopeConfig *r = &t->rope;
    if (parse_header(path, header, (size_t)got, c, r, err, err_len) != 0 ||
        validate_config(path, c, r, err, err_len) != 0) {
        close(fd);
        return -1;
    }
    if (c->version == 0) r->rot_dim = c->dim / c->n_heads;
    if (r->orig_ctx == 0) r->orig_ctx = c->train_ctx; // 0 = the training context
    size_t expected = expected_file_size(c, r);
    if (file_size != expected) {
        close(fd);
        if (file_size < expected)
            return fail(err, err_len, "%s: truncated: the header implies %zu bytes, the file has %zu", path, expected,
                        file_size);
        return fail(err, err_len, "%s: %zu trailing bytes: the header implies %zu bytes, the file has %zu", path,
                    file_size - expected, expected, file_size);
    }
    void *map = mmap(NULL, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd); // the mapping stays valid after close
    if (map == MAP_FAILED) return fail(err, err_len, "%s: mmap failed: %s", path, strerror(errno));
    t->mapping = map;
    t->file_size = file_size;

    place_tensors(c, r, &t->weights, (const char *)map); // point each weight (and LongRoPE factor) into the mapping
    if (c->shared_classifier) t->weights.wcls = t->weights.token_embedding;
    for (int i = 0; r->short_factor && i < r->rot_dim / 2; i++) // divisors of a frequency: finite and positive
        for (int which = 0; which < 2; which++) {
            float v = (which ? r->long_factor : r->short_factor)[i];
            if (!(v > 0.0f && isfinite(v))) {
                fail(err, err_len, "%s: rope_%s_factor[%d]=%g (expected a finite value > 0)", path,
                     which ? "long" : "short", i, (double)v);
                munmap(map, file_size);
                memset(t, 0, sizeof *t);
                return -1;
            }
        }
    return 0;
}

/* ==========================================================================
 * 3. RoPE: inverse frequencies -> cos/sin table -> the RoPE stage
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
static int rope_length_dependent(const RopeConfig *r) {
    return r->scaling == ROPE_DYNAMIC || r->scaling == ROPE_LONGROPE;
}

/* The length a table is built for, for a sequence of length S: L while S <= L;
 * past it dynamic NTK needs S itself, LongRoPE only "longer than L" (L + 1). */
static int rope_table_length(const RopeConfig *r, int S) {
    int L = r->orig_ctx;
    if (S <= L) return L;
    return r->scaling == ROPE_LONGROPE ? L + 1 : S;
}

/* Check the effective RoPE parameters (after command-line overrides). */
static int validate_rope(const RopeConfig *r, int head_size, char *err, size_t err_len) {
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
    if (r->se_group > 0 && rope_length_dependent(r))
        return fail(err, err_len, "--self-extend with --rope-scaling %s: choose one (both re-assign how "
                    "cached keys are rotated)", r->scaling == ROPE_DYNAMIC ? "dynamic" : "longrope");
    if (r->scaling == ROPE_LONGROPE && !r->short_factor)
        return fail(err, err_len, "--rope-scaling longrope: the checkpoint has no LongRoPE factor arrays (they "
                    "come from a Hugging Face rope_type \"longrope\" export)");
    if (r->sinks >= 0 && r->se_group > 0)
        return fail(err, err_len, "--sinks with --self-extend: choose one (both re-assign the positions of "
                    "cached keys)");
    return 0;
}

/* Rows [first, first + n) of the table, for a sequence of length len. */
static void rope_build_rows(Transformer *t, int len, int first, int n) {
    RunState *s = &t->state;
    int n_pairs = t->rope.rot_dim / 2;
    double mscale;
    rope_frequencies(&t->rope, len, s->inv_freq, &mscale);
    rope_fill_table(s->rope_cos + (size_t)first * n_pairs, s->rope_sin + (size_t)first * n_pairs, first, n,
                    s->inv_freq, n_pairs, mscale);
}

/* Build the whole (n_ctx, n_pairs) table once, at load.
 * Most methods have one table for all lengths. Dynamic NTK (docs/rope.md §8.5)
 * and LongRoPE (§8.8) give a sequence of length S > L other frequencies than
 * a shorter one:
 *   hf:    the token at position p is rotated once, when it arrives, for
 *          length S = p + 1; cached keys keep that rotation. So row p is
 *          simply built for length max(p + 1, L), and the table never changes.
 *   exact: every key is re-rotated for the current length (pre-RoPE cache);
 *          rope_sync_length rebuilds rows 0..pos once pos + 1 > L. */
static void rope_build_table(Transformer *t) {
    int L = t->rope.orig_ctx, n = t->n_ctx;
    if (!rope_length_dependent(&t->rope)) {
        rope_build_rows(t, n, 0, n);
        return;
    }
    rope_build_rows(t, L, 0, n < L ? n : L); // S <= L: the frequencies of short sequences
    t->table_len = L;
    if (n <= L) return;
    if (t->rope.dynamic_exact) rope_build_rows(t, L, L, n - L);                    // rebuilt when reached
    else if (t->rope.scaling == ROPE_LONGROPE) rope_build_rows(t, L + 1, L, n - L); // long factors
    else
        for (int p = L; p < n; p++) rope_build_rows(t, p + 1, p, 1);                // a base per length
}

/* The exact variant: before the token at pos, make the rows up to pos right
 * for the current length S = pos + 1 (back to the short-sequence rows when
 * S <= L: a new sequence started). Dynamic NTK rebuilds rows 0..pos for every
 * new length (later rows are rebuilt before they are used); LongRoPE rebuilds
 * the whole table when the sequence crosses L, in either direction. */
static void rope_sync_length(Transformer *t, int pos) {
    if (!rope_length_dependent(&t->rope) || !t->rope.dynamic_exact) return;
    int S = rope_table_length(&t->rope, pos + 1);
    if (S == t->table_len) return;
    int whole = S == t->rope.orig_ctx || t->rope.scaling == ROPE_LONGROPE;
    rope_build_rows(t, S, 0, whole ? t->n_ctx : pos + 1);
    t->table_len = S;
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
        const float *c = cos + (size_t)b * n_pairs, *s = sin + (size_t)b * n_pairs;
        for (int h = 0; h < n_heads; h++) {
            float *v = vec + ((size_t)b * n_heads + h) * head_size;
            for (int i = 0; i < n_pairs; i++) {
                int a = layout == ROPE_INTERLEAVED ? 2 * i : i;
                int z = layout == ROPE_INTERLEAVED ? 2 * i + 1 : i + n_pairs;
                float x = v[a], y = v[z];
                v[a] = x * c[i] - y * s[i];
                v[z] = x * s[i] + y * c[i];
            }
        }
    }
}

/* Attention sinks (--sinks S, StreamingLLM; docs/rope.md §13): the cache
 * holds n_ctx tokens. Once it is full, the token at position pos >= n_ctx
 * takes the slot of the oldest token after the S sinks,
 *   slot(pos)  = S + (pos - S) mod R,   R = n_ctx - S,
 * and positions become places in the cache: the newest token is at n_ctx - 1
 * and the one in slot p at
 *   place(p)   = p                                  (p < S: a sink)
 *              = n_ctx - 1 - (slot(pos) - p) mod R  (the rest, oldest first).
 * Before the cache is full (and without sinks) slot and place are pos. */
int cache_slot(const Transformer *t, int pos) {
    int S = t->rope.sinks, R = t->n_ctx - S;
    return S < 0 || pos < t->n_ctx ? pos : S + (pos - S) % R;
}

int cache_place(const Transformer *t, int slot, int pos) {
    int S = t->rope.sinks, R = t->n_ctx - S;
    if (S < 0 || pos < t->n_ctx || slot < S) return slot;
    return t->n_ctx - 1 - ((cache_slot(t, pos) - slot) % R + R) % R;
}

/* Pre-RoPE key cache: rotate the cached keys the queries at positions
 * pos .. pos+B-1 read (slots 0..pos+B-1, or the whole cache once sinks have
 * wrapped it) into key_rot at their own positions (their places, with
 * sinks), and with Self-Extend into key_grouped at their group positions
 * floor(t / G). One query (B = 1) reads each key one way only (grouped when
 * it lies W or more positions back), so only that rotation is made; a block
 * makes both for every key, since attention_block's tiles across the line
 * compute both scores for all their keys (and keep one).
 * keys: one layer's (n_ctx, kv_dim) of t->kv_type; key_rot, key_grouped:
 * (n_ctx, kv_dim) float32. */
void rotate_cached_keys(float *key_rot, float *key_grouped, const void *keys, int pos, int B, const Transformer *t) {
    const Config *c = &t->config;
    int head_size = c->dim / c->n_heads, kv_dim = head_size * c->n_kv_heads, n_pairs = t->rope.rot_dim / 2;
    int last = pos + B - 1, n = last < t->n_ctx ? last + 1 : t->n_ctx, i;
    int G = t->rope.se_group, W = t->rope.se_window, n_grouped = G > 0 && last >= W ? last - W + 1 : 0;
    // keys first_own..n-1 at their own positions, keys 0..end_grouped-1 at their group positions
    int first_own = B == 1 ? n_grouped : 0, end_grouped = B == 1 || !n_grouped ? n_grouped : n;
#pragma omp parallel for private(i) if ((long)n * kv_dim >= PARALLEL_MIN_WORK)
    for (i = 0; i < n; i++)
        for (int grouped = 0; grouped < 2; grouped++) {
            if (grouped ? i >= end_grouped : i < first_own) continue;
            int key_pos = grouped ? i / G : cache_place(t, i, last);
            float *k = (grouped ? key_grouped : key_rot) + (size_t)i * kv_dim;
            kv_load(k, keys, t->kv_type, (size_t)i * kv_dim, kv_dim);
            rope(k, t->state.rope_cos + (size_t)key_pos * n_pairs, t->state.rope_sin + (size_t)key_pos * n_pairs, 1,
                 c->n_kv_heads, head_size, t->rope.rot_dim, t->rope.layout);
        }
}

/* The keys attention scores the queries against, as the RoPE stage left them. */
typedef struct {
    const void *keys;       // (n_ctx, kv_dim) of one layer, rotated
    int key_type;           // KV_F32 | KV_F16
    const float *q_grouped; // Self-Extend: (B, n_heads, head_size) the queries at their group positions
    const float *grouped;   // Self-Extend: (n_ctx, kv_dim) float32, the keys at their group positions
    int n_grouped;          // the last query scores keys 0..n_grouped-1 against q_grouped; 0 = none
} RotatedKeys;

/* The RoPE stage of one layer: give the block's queries and keys their
 * positions, and put the keys into the layer's cache. Which of four
 * strategies runs follows from the RoPE settings; the caller never knows:
 *   (a) rotate once (every method, the default): q and k are rotated by the
 *      table rows of their positions; keys enter the cache rotated and keep
 *      that rotation for good.
 *   (b) rotate for the current length (--rope-dynamic exact): the table
 *      depends on the sequence length, so keys enter the cache unrotated (a
 *      pre-RoPE cache) and every cached key is rotated anew for each query.
 *   (c) Self-Extend's grouped second query (--self-extend G W): keys enter
 *      unrotated too; a key W or more tokens back is rotated at its group
 *      position floor(t/G) and scored against a second query rotated at
 *      floor(pos/G) + W - floor(W/G); nearer keys keep their own positions.
 *      Neither rotation depends on the query, so a block rotates each key
 *      both ways once (key_rot, key_grouped) and attention picks per pair.
 *   (d) attention sinks (--sinks S): keys enter unrotated; once the cache is
 *      full each new token overwrites the oldest after the S sinks, and every
 *      key is rotated at its place in the cache (cache_slot, cache_place).
 * (b) and (d) go one token at a time (block_limit). docs/rope.md §11
 * has the details, §10 Self-Extend's position map and §13 the sinks.
 * In: s->q (B, n_heads, head_size) and s->k (B, kv_dim) from the projections.
 * Out: s->q rotated in place; the B keys written into key_cache (one layer's
 * (n_ctx, kv_dim)) at pos0..; returns the keys attention reads. */
static RotatedKeys rope_stage(Transformer *t, void *key_cache, int B, int pos0) {
    const Config *c = &t->config;
    const RopeConfig *r = &t->rope;
    RunState *s = &t->state;
    int head_size = c->dim / c->n_heads, kv_dim = head_size * c->n_kv_heads, n_pairs = r->rot_dim / 2;
    int place = cache_place(t, cache_slot(t, pos0), pos0);   // pos0, or with sinks its place in the cache
    rope_sync_length(t, place); // (b): table rows for length place + 1 (once per token)
    const float *cos_rows = s->rope_cos + (size_t)place * n_pairs; // (B, n_pairs): the B positions' rows
    const float *sin_rows = s->rope_sin + (size_t)place * n_pairs;
    int G = r->se_group, W = r->se_window;
    int n_grouped = G > 0 && pos0 + B - 1 >= W ? pos0 + B - W : 0; // keys W or more tokens before the last query
    if (n_grouped) { // (c): the queries at their group positions
        memcpy(s->q_grouped, s->q, (size_t)B * c->dim * sizeof(float));
        for (int b = 0; b < B; b++) {
            size_t row = (size_t)((pos0 + b) / G + W - W / G) * n_pairs;
            rope(s->q_grouped + (size_t)b * c->dim, s->rope_cos + row, s->rope_sin + row, 1, c->n_heads, head_size,
                 r->rot_dim, r->layout);
        }
    }
    rope(s->q, cos_rows, sin_rows, B, c->n_heads, head_size, r->rot_dim, r->layout);
    if (!t->prerope) { // (a): keys rotated once, as they enter the cache
        rope(s->k, cos_rows, sin_rows, B, c->n_kv_heads, head_size, r->rot_dim, r->layout);
        kv_store(key_cache, t->kv_type, (size_t)pos0 * kv_dim, s->k, B * kv_dim);
        return (RotatedKeys){key_cache, t->kv_type, NULL, NULL, 0};
    }
    kv_store(key_cache, t->kv_type, (size_t)cache_slot(t, pos0) * kv_dim, s->k, B * kv_dim); // (b)-(d): unrotated
    rotate_cached_keys(s->key_rot, s->key_grouped, key_cache, pos0, B, t);
    return (RotatedKeys){s->key_rot, KV_F32, s->q_grouped, s->key_grouped, n_grouped};
}

/* ==========================================================================
 * 4. Building and freeing the model: checkpoint + RoPE table + run state
 * ========================================================================== */

/* How many tokens forward_block may take at once. A pre-RoPE key cache for
 * exact dynamic NTK or sinks rotates the keys for each query position
 * separately, so it goes 1 by 1; Self-Extend's two rotations of a key do not
 * depend on the query (rope_stage), so it takes blocks. */
int block_limit(const Transformer *t) {
    int per_query = t->rope.sinks >= 0 || (rope_length_dependent(&t->rope) && t->rope.dynamic_exact);
    return t->prerope && per_query ? 1 : FORWARD_BLOCK;
}

/* Allocate the activations and KV cache for n_ctx positions and build the
 * RoPE table from t->rope. Returns -1 with a message if memory runs out. */
static int build_run_state(Transformer *t, char *err, size_t err_len) {
    const Config *c = &t->config;
    RunState *s = &t->state;
    size_t dim = c->dim, hidden = c->hidden_dim, head_size = dim / c->n_heads;
    size_t kv_dim = head_size * c->n_kv_heads, n_ctx = t->n_ctx, n_pairs = t->rope.rot_dim / 2;
    size_t cache_values = (size_t)c->n_layers * n_ctx * kv_dim;
    size_t B = (size_t)block_limit(t); // tokens one forward_block call may carry
    size_t widest = hidden > dim ? hidden : dim, q8 = c->weight_type == WEIGHT_Q8_0, threads = 1;
#ifdef _OPENMP
    threads = (size_t)omp_get_max_threads();
#endif
    s->mm.threads = (int)threads;
    struct { void **p; size_t n, size; } bufs[] = {
#define FLOATS(ptr, n) {(void **)&(ptr), (n), sizeof(float)}
        FLOATS(s->x, B * dim), FLOATS(s->xb, B * dim), FLOATS(s->xb2, B * dim), FLOATS(s->hb, B * hidden),
        FLOATS(s->hb2, B * hidden), FLOATS(s->q, B * dim), FLOATS(s->k, B * kv_dim), FLOATS(s->v, B * kv_dim),
        FLOATS(s->scores, c->n_heads * n_ctx), FLOATS(s->logits, B * c->vocab_size),
        FLOATS(s->attn_tiles, B > 1 ? threads * attention_block_floats((int)head_size) : 0),
        {&s->key_cache, cache_values, kv_elem_bytes(t->kv_type)},
        {&s->value_cache, cache_values, kv_elem_bytes(t->kv_type)},
        FLOATS(s->rope_cos, n_ctx * n_pairs), FLOATS(s->rope_sin, n_ctx * n_pairs),
        // only with a pre-RoPE key cache: one layer of rotated keys; and with Self-Extend the
        // block's queries and the layer's keys at their group positions
        FLOATS(s->key_rot, t->prerope ? n_ctx * kv_dim : 0), FLOATS(s->q_grouped, t->rope.se_group > 0 ? B * dim : 0),
        FLOATS(s->key_grouped, t->rope.se_group > 0 ? n_ctx * kv_dim : 0),
        // matmul's input transposed (blocks); with q8_0 weights, quantized
        FLOATS(s->mm.x_t, B > 1 ? widest * simd_round_up((int)B) : 0),
        {(void **)&s->mm.x_q, q8 ? B * widest : 0, sizeof(int8_t)},
        FLOATS(s->mm.x_scale, q8 ? B * widest / c->group_size : 0),
        FLOATS(s->mm.w_rows, q8 && B > 1 ? (size_t)threads * ROW_CHUNK * widest : 0),
        {(void **)&s->mm.x_qt, q8 && B > 1 ? widest * simd_round_up((int)B) : 0, sizeof(uint8_t)},
        FLOATS(s->mm.x_scale_t, q8 && B > 1 ? widest / c->group_size * simd_round_up((int)B) : 0),
        {(void **)&s->mm.w_sums, q8 && B > 1 ? (size_t)threads * ROW_CHUNK * widest / c->group_size : 0,
         sizeof(int32_t)},
#undef FLOATS
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (bufs[i].n == 0) continue;
        *bufs[i].p = calloc(bufs[i].n, bufs[i].size);
        if (!*bufs[i].p)
            return fail(err, err_len, "--ctx %d: cannot allocate %.1f MiB (KV cache and buffers for this context)",
                        t->n_ctx, (double)bufs[i].n * bufs[i].size / (1 << 20));
    }
    s->inv_freq = malloc(n_pairs * sizeof(double));
    if (!s->inv_freq) return fail(err, err_len, "out of memory building the RoPE table");
    rope_build_table(t);
    return 0;
}

/* Load a checkpoint, apply the RoPE overrides in *rope_override (fields < 0 or
 * NAN are "not given"), size everything for n_ctx positions (0 = train_ctx)
 * with a KV cache of kv_type (KV_F32 | KV_F16).
 * Returns 0; -1 with a message for a bad checkpoint or no memory; -2 for
 * RoPE settings that do not fit together (bad usage: they come from flags).
 * Owns the mapping and the run state; release with free_transformer. */
int build_transformer(Transformer *t, const char *path, const RopeConfig *rope_override, int n_ctx, int kv_type,
                      char *err, size_t err_len) {
    if (load_checkpoint(t, path, err, err_len) != 0) return -1;
    t->kv_type = kv_type;
    t->rope.sinks = -1; // a run-time choice, never in a checkpoint
    t->window = t->config.sliding_window;
    t->window_first_layer = t->config.window_first_layer;
    if (rope_override) {
        const RopeConfig *o = rope_override;
        RopeConfig *r = &t->rope;
        if (!isnan(o->factor) && (o->scaling >= 0 ? o->scaling : r->scaling) == ROPE_NONE)
            return fail(err, err_len, "--rope-factor %g: the RoPE scaling in effect is none (%s), so a factor "
                        "changes nothing (add --rope-scaling linear|ntk|dynamic|yarn|llama3|longrope)", o->factor,
                        o->scaling >= 0 ? "--rope-scaling none" : path), -2;
        if (!isnan(o->base)) r->base = o->base;
        if (o->scaling >= 0) r->scaling = o->scaling;
        if (!isnan(o->factor)) r->factor = o->factor;
        if (o->orig_ctx > 0) r->orig_ctx = o->orig_ctx;
        if (!isnan(o->beta_fast)) r->beta_fast = o->beta_fast;
        if (!isnan(o->beta_slow)) r->beta_slow = o->beta_slow;
        if (!isnan(o->attn_factor)) r->attn_factor = o->attn_factor;
        if (!isnan(o->low_freq)) r->low_freq = o->low_freq;
        if (!isnan(o->high_freq)) r->high_freq = o->high_freq;
        if (o->dynamic_exact >= 0) r->dynamic_exact = o->dynamic_exact;
        if (o->se_group > 0) r->se_group = o->se_group, r->se_window = o->se_window;
        r->sinks = o->sinks;
        if (o->window >= 0) t->window = o->window, t->window_first_layer = 0; // --window: every layer
    }
    // Defaults for parameters the checkpoint leaves at 0 (legacy files, or no scaling stored).
    if (t->rope.beta_fast == 0) t->rope.beta_fast = 32;
    if (t->rope.beta_slow == 0) t->rope.beta_slow = 1;
    if (t->rope.low_freq == 0) t->rope.low_freq = 1;
    if (t->rope.high_freq == 0) t->rope.high_freq = 4;
    t->n_ctx = n_ctx > 0 ? n_ctx : t->config.train_ctx;
    t->prerope = t->rope.se_group > 0 || t->rope.sinks >= 0 ||
                 (rope_length_dependent(&t->rope) && t->rope.dynamic_exact);
    if (t->rope.sinks >= t->n_ctx) {
        fail(err, err_len, "--sinks %d: expected fewer than the %d tokens of the cache (--ctx)", t->rope.sinks,
             t->n_ctx);
        return -2;
    }
    if (t->window >= t->n_ctx) t->window = 0; // a window as long as the cache never leaves a key out
    if (t->window > 0 && (t->rope.sinks >= 0 || t->rope.se_group > 0)) {
        fail(err, err_len, "%s with a sliding window of %d (%s): choose one (--window 0 turns the window off)",
             t->rope.sinks >= 0 ? "--sinks" : "--self-extend", t->window,
             rope_override && rope_override->window > 0 ? "--window" : "the checkpoint's");
        return -2;
    }
    if (validate_rope(&t->rope, t->config.dim / t->config.n_heads, err, err_len) != 0) return -2;
    if (build_run_state(t, err, err_len) != 0) return -1;
    return 0;
}

/* Release everything build_transformer (or a failed call of it) acquired. */
void free_transformer(Transformer *t) {
    RunState *s = &t->state;
    void *bufs[] = {s->x, s->xb, s->xb2, s->hb, s->hb2, s->q, s->k, s->v, s->scores, s->attn_tiles, s->logits,
                    s->key_cache, s->value_cache, s->rope_cos, s->rope_sin, s->q_grouped, s->key_rot, s->key_grouped,
                    s->mm.x_q, s->mm.x_scale, s->mm.w_rows, s->mm.x_t, s->mm.x_qt, s->mm.x_scale_t, s->mm.w_sums};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(s->inv_freq);
    if (t->mapping) munmap(t->mapping, t->file_size);
    memset(t, 0, sizeof *t);
}

/* ==========================================================================
 * 5. Ops: each is one formula; output first, inputs next, sizes last.
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

/* out = x @ W^T,  out[b][i] = sum_k x[b][k] * W[i][k]
 * x (B, n), W (d, n) float32 -> out (B, d)
 * The definition of matmul. The forward pass calls kernels.c's matmul, which
 * computes this same product over float32 or q8_0 weights with SIMD tiles
 * and threads; the tests check every one of its paths against this loop. */
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
    for (int t = lo; t < n; t++) row[t] *= scale;
    softmax(row + lo, n - lo);
    for (int t = 0; t < lo; t++) row[t] = 0.0f;
    for (int t = n; t < width; t++) row[t] = 0.0f;
}

/* The first key a query that sees n keys may attend to: n - window with a
 * sliding window (window > 0), else 0. */
static int window_start(int n, int window) { return window > 0 && n > window ? n - window : 0; }

/* Causal multi-head attention for B tokens at positions pos0 .. pos0+B-1;
 * row b attends to cached positions t = lo_b .. pos0+b:
 *   scores[t] = q . k_t / sqrt(head_size)
 *   weights   = softmax(scores)
 *   out       = sum_t weights[t] * v_t
 * with lo_b = 0, or with a sliding window of W positions (window = W > 0)
 * lo_b = max(0, pos0 + b + 1 - W): the W most recent keys, its own included.
 * Query head h reads kv head h / (n_heads / n_kv_heads): the contiguous
 * grouping of GQA/MQA, as Hugging Face's repeat_kv. With Self-Extend, keys
 * W or more positions before row b's are scored as q_grouped_b . k_grouped_t
 * instead (keys.q_grouped, keys.grouped: rope_stage's (c)).
 * out, q: (B, n_heads, head_size); values: one layer's (n_ctx, kv_dim) of
 * t->kv_type.
 * A block (B > 1: prompts, ppl windows) goes to kernels.c's attention_block,
 * which computes this formula in tiles of queries x keys with an online
 * softmax (a running maximum and sum per query, kernels.h), never storing a
 * row of scores. One query (generation; B = 1 also for exact dynamic NTK and
 * attention sinks, whose keys move with each query) goes as written above,
 * head by head: kv_scores, attention_weights, kv_mix. The two agree to float
 * rounding. t gives the shapes, and its state the scratch: scores for one
 * query, attn_tiles for a block. */
void attention(float *out, const float *q, const RotatedKeys *keys, const void *values, int B, int pos0,
               int window, Transformer *t) {
    const Config *c = &t->config;
    int n_heads = c->n_heads, head_size = c->dim / n_heads, kv_dim = head_size * c->n_kv_heads;
    int kv_mul = n_heads / c->n_kv_heads, n_ctx = t->n_ctx;
    if (B > 1) {
        GroupedQueries grouped = {keys->q_grouped, keys->grouped, t->rope.se_window};
        attention_block(out, q, keys->keys, keys->key_type, values, t->kv_type, keys->n_grouped ? &grouped : NULL, B,
                        pos0, window, n_heads, c->n_kv_heads, head_size, t->state.attn_tiles, t->state.mm.threads);
        return;
    }
    int n = pos0 + 1, g = keys->n_grouped, h; // one query: n keys, the first g grouped
    int lo = window_start(n, window);        // keys lo..n-1; Self-Extend (g > 0) has no window
#pragma omp parallel for private(h) if ((long)n_heads * head_size * n >= PARALLEL_MIN_WORK)
    for (h = 0; h < n_heads; h++) {
        size_t row = (size_t)h * head_size, kv_offset = (size_t)(h / kv_mul) * head_size;
        float *S = t->state.scores + (size_t)h * n_ctx;
        if (g) kv_scores(S, keys->q_grouped + row, keys->grouped, KV_F32, kv_offset, kv_dim, g, head_size);
        kv_scores(S + g + lo, q + row, keys->keys, keys->key_type, (size_t)(g + lo) * kv_dim + kv_offset, kv_dim,
                  n - g - lo, head_size);
        attention_weights(S, lo, n, n, head_size);
        kv_mix(out + row, S + lo, values, t->kv_type, (size_t)lo * kv_dim + kv_offset, kv_dim, n - lo, head_size);
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
 * 6. Forward pass: B tokens at positions pos0.. -> logits
 * ========================================================================== */

/* out = x @ W_l^T + b_l for layer l's rows of a stacked matrix W (n_layers, d, n)
 * and, when the model has one, its bias b (n_layers, d); with the run state's
 * matmul scratch.        x (B, n) -> out (B, d) */
static void project(RunState *s, float *out, const float *x, Matrix w, const float *bias, int l, int B, int n,
                    int d) {
    matmul(out, x, matrix_rows(w, (size_t)l * d, (size_t)n), B, n, d, &s->mm);
    if (!bias) return;
    const float *b_l = bias + (size_t)l * d;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < d; i++) out[(size_t)b * d + i] += b_l[i];
}

/* The sliding window of layer l: W when the run has one (the checkpoint's, or
 * --window) and l is one of the layers that use it, else 0 (every key). */
static int layer_window(const Transformer *t, int l) {
    return l >= t->window_first_layer ? t->window : 0;
}

/* Which logits forward_block computes: the classifier is the largest matrix
 * (vocab_size rows), so a prompt block that only fills the cache skips it. */
typedef enum { LOGITS_NONE, LOGITS_LAST, LOGITS_ALL } LogitsWanted;

/* What forward_block returns besides 0. */
enum { FORWARD_DOES_NOT_FIT = -1, FORWARD_NOT_FINITE = -2 };

/* Run tokens[0..B) at positions pos0..pos0+B-1 through the model, writing
 * their keys and values into the cache, and compute the logits `want` asks
 * for into t->state.logits: (B, vocab_size) for LOGITS_ALL, the last token's
 * (vocab_size) for LOGITS_LAST. Returns 0; FORWARD_DOES_NOT_FIT (nothing
 * computed) when the block does not fit (B above block_limit, past n_ctx) or
 * a token is outside the vocabulary; FORWARD_NOT_FINITE when a logit is NaN
 * or infinite: a NaN or infinite weight, or activations that overflowed (the
 * check sits here, where every mode reads the logits, instead of a scan of
 * every weight at load). */
int forward_block(Transformer *t, const int *tokens, int B, int pos0, LogitsWanted want) {
    const Config *c = &t->config;
    const Weights *w = &t->weights;
    RunState *s = &t->state;
    if (B < 1 || B > block_limit(t) || pos0 < 0 || (pos0 + B > t->n_ctx && t->rope.sinks < 0))
        return FORWARD_DOES_NOT_FIT;
    for (int b = 0; b < B; b++)
        if (tokens[b] < 0 || tokens[b] >= c->vocab_size) return FORWARD_DOES_NOT_FIT;
    int dim = c->dim, hidden_dim = c->hidden_dim, kv_dim = dim / c->n_heads * c->n_kv_heads;
    // Where the block sits in the cache: slot pos0 and place pos0, unless
    // attention sinks have wrapped it (then B = 1: slot and place of §13).
    int slot = cache_slot(t, pos0), place = cache_place(t, slot, pos0);

    // x = token_embedding[tokens]                                  (B, dim)
    for (int b = 0; b < B; b++) matrix_row(s->x + (size_t)b * dim, w->token_embedding, tokens[b], dim);

    for (int l = 0; l < c->n_layers; l++) {
        size_t ld = (size_t)l * dim;                                       // layer l's norm weights
        size_t kv_layer = (size_t)l * t->n_ctx * kv_dim * kv_elem_bytes(t->kv_type); // layer l in the caches
        void *key_cache = (char *)s->key_cache + kv_layer;                 // (n_ctx, kv_dim)
        void *value_cache = (char *)s->value_cache + kv_layer;             // (n_ctx, kv_dim)

        // attention block: x += wo @ attention(rope(wq @ h), rope(wk @ h), wv @ h)
        rmsnorm(s->xb, s->x, w->rms_att_weight + ld, B, dim, c->norm_eps); // h (B, dim)
        project(s, s->q, s->xb, w->wq, w->bq, l, B, dim, dim);             // q (B, n_heads, head_size)
        project(s, s->k, s->xb, w->wk, w->bk, l, B, dim, kv_dim);          // k (B, n_kv_heads, head_size)
        project(s, s->v, s->xb, w->wv, w->bv, l, B, dim, kv_dim);          // v (B, n_kv_heads, head_size)
        RotatedKeys keys = rope_stage(t, key_cache, B, pos0);              // q rotated; k into the cache
        kv_store(value_cache, t->kv_type, (size_t)slot * kv_dim, s->v, B * kv_dim); // v into the cache
        attention(s->xb, s->q, &keys, value_cache, B, place, layer_window(t, l), t); // (B, dim)
        project(s, s->xb2, s->xb, w->wo, w->bo, l, B, dim, dim);           // (B, dim)
        residual_add(s->x, s->xb2, B * dim);

        // feed-forward block: x += w2 @ (silu(w1 @ h) * (w3 @ h))
        rmsnorm(s->xb, s->x, w->rms_ffn_weight + ld, B, dim, c->norm_eps);
        project(s, s->hb, s->xb, w->w1, w->b1, l, B, dim, hidden_dim);     // (B, hidden_dim)
        project(s, s->hb2, s->xb, w->w3, w->b3, l, B, dim, hidden_dim);    // (B, hidden_dim)
        swiglu(s->hb, s->hb2, B * hidden_dim);
        project(s, s->xb2, s->hb, w->w2, w->b2, l, B, hidden_dim, dim);    // (B, dim)
        residual_add(s->x, s->xb2, B * dim);
    }

    // logits = rmsnorm(x) @ wcls^T          (B, vocab_size), or the last row only
    if (want == LOGITS_NONE) return 0;
    int first = want == LOGITS_ALL ? 0 : B - 1, n_out = B - first;
    float *x_out = s->x + (size_t)first * dim;
    rmsnorm(x_out, x_out, w->rms_final_weight, n_out, dim, c->norm_eps);
    project(s, s->logits, x_out, w->wcls, NULL, 0, n_out, dim, c->vocab_size);
    int finite = 1;
    for (size_t i = 0; i < (size_t)n_out * c->vocab_size; i++) finite &= isfinite(s->logits[i]);
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
static void forward_failed(const Transformer *t, int status, int token, int pos) __attribute__((noreturn));
static void forward_failed(const Transformer *t, int status, int token, int pos) {
    if (status == FORWARD_NOT_FINITE)
        die(EXIT_BAD_INPUT, "forward: the logits at position %d are NaN or infinite (the checkpoint holds a NaN "
            "or infinite weight, or the activations overflowed)", pos);
    die(EXIT_BAD_INPUT, "forward: token %d at position %d does not fit (context %d, vocabulary %d)", token, pos,
        t->n_ctx, t->config.vocab_size);
}

/* ==========================================================================
 * 7. Sampler
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

typedef struct {
    float prob;
    int index;
} ProbIndex;

typedef struct {
    int vocab_size;
    float temperature;    // 0 = greedy
    float topp;           // 1 = off
    int topk;             // 0 = off
    float minp;           // 0 = off
    float repeat_penalty; // 1 = off
    int repeat_last_n;    // window of recent tokens the penalty looks at
    uint64_t rng_state;
    ProbIndex *candidates; // (vocab_size) scratch
    unsigned char *seen;   // (vocab_size) scratch for the penalty
} Sampler;

/* xorshift64* (Marsaglia's xorshift, with a multiplying output step). */
static uint32_t random_u32(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}
static float random_f32(uint64_t *state) { return (random_u32(state) >> 8) / 16777216.0f; } // [0, 1)

/* Allocates the sampler's scratch; free_sampler releases it. Any seed is
 * valid: it is mixed (splitmix64) so that the xorshift state is never zero. */
int build_sampler(Sampler *s, int vocab_size, float temperature, float topp, int topk, float minp,
                  float repeat_penalty, int repeat_last_n, uint64_t seed) {
    *s = (Sampler){vocab_size, temperature, topp, topk, minp, repeat_penalty, repeat_last_n, 0, NULL, NULL};
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    s->rng_state = (z ^ (z >> 31)) | 1;
    s->candidates = malloc((size_t)vocab_size * sizeof(ProbIndex));
    s->seen = calloc((size_t)vocab_size, 1);
    return s->candidates && s->seen ? 0 : -1;
}

void free_sampler(Sampler *s) {
    free(s->candidates);
    free(s->seen);
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
void apply_repetition_penalty(Sampler *s, float *logits, const int *history, int n) {
    if (s->repeat_penalty == 1.0f || s->repeat_last_n == 0) return;
    int start = n > s->repeat_last_n ? n - s->repeat_last_n : 0;
    for (int i = start; i < n; i++) {
        int id = history[i];
        if (s->seen[id]) continue;
        s->seen[id] = 1;
        logits[id] = logits[id] > 0 ? logits[id] / s->repeat_penalty : logits[id] * s->repeat_penalty;
    }
    for (int i = start; i < n; i++) s->seen[history[i]] = 0;
}

/* Choose the next token from logits (modified in place). history holds the n
 * tokens so far (prompt included), for the repetition penalty. */
int sample(Sampler *s, float *logits, const int *history, int n) {
    apply_repetition_penalty(s, logits, history, n);
    int greedy = argmax(logits, s->vocab_size);
    if (s->temperature == 0.0f) return greedy;
    for (int i = 0; i < s->vocab_size; i++) logits[i] /= s->temperature;
    softmax(logits, s->vocab_size);

    // Candidates worth sorting. Without top-k, a token below (1 - topp)/(V - 1)
    // cannot be inside the top-p nucleus (llama2.c's argument: if all of the
    // nucleus were below it, the rest could not sum to more than 1 - topp).
    int n_cand = 0;
    float cutoff = 0.0f;
    if (s->topk == 0 && s->topp < 1.0f && s->vocab_size > 1) cutoff = (1.0f - s->topp) / (s->vocab_size - 1);
    for (int i = 0; i < s->vocab_size; i++)
        if (logits[i] >= cutoff) s->candidates[n_cand++] = (ProbIndex){logits[i], i};
    int truncating = s->topk > 0 || s->topp < 1.0f || s->minp > 0.0f;
    if (truncating) qsort(s->candidates, (size_t)n_cand, sizeof(ProbIndex), compare_prob_desc);
    if (s->topk > 0 && s->topk < n_cand) n_cand = s->topk;
    if (s->topp < 1.0f) { // the nucleus of what top-k kept, renormalized (as HF and llama.cpp)
        float kept = 0.0f, cum = 0.0f;
        for (int i = 0; i < n_cand; i++) kept += s->candidates[i].prob;
        for (int i = 0; i < n_cand; i++) {
            cum += s->candidates[i].prob;
            if (cum >= s->topp * kept) {
                n_cand = i + 1;
                break;
            }
        }
    }
    if (s->minp > 0.0f) {
        float threshold = s->minp * s->candidates[0].prob;
        int keep = 1;
        while (keep < n_cand && s->candidates[keep].prob >= threshold) keep++;
        n_cand = keep;
    }
    float total = 0.0f;
    for (int i = 0; i < n_cand; i++) total += s->candidates[i].prob;
    // Nothing left to draw from: every probability was NaN or 0 (a temperature
    // so small that logits / t overflowed, or non-finite logits). Be greedy.
    if (n_cand == 0 || !(total > 0.0f) || !isfinite(total)) return greedy;
    float r = random_f32(&s->rng_state) * total, cum = 0.0f;
    for (int i = 0; i < n_cand; i++) {
        cum += s->candidates[i].prob;
        if (r < cum) return s->candidates[i].index;
    }
    return s->candidates[n_cand - 1].index; // rounding: r landed on the total
}

/* ==========================================================================
 * 8. Modes
 * ========================================================================== */

/* Encode text (with BOS first when add_bos) into a new array; exits on failure. */
static int *encode_or_die(const Tokenizer *tok, const char *text, size_t len, int add_bos, int *n_out) {
    int *ids = malloc(tokenizer_bound(len) * sizeof(int));
    if (!ids) die(EXIT_BAD_INPUT, "prompt: cannot allocate token buffer for %zu bytes", len);
    int n = tokenizer_encode(tok, text, len, add_bos, 0, ids);
    if (n < 0) die(EXIT_BAD_INPUT, "prompt: out of memory while encoding %zu bytes", len);
    *n_out = n;
    return ids;
}

/* What generate and chat share while they produce text: the tokens so far
 * and the decoder's state for printing them. */
typedef struct {
    Transformer *t;
    const Tokenizer *tok;
    Sampler *sampler;
    int *history;   // (capacity + 1) the tokens so far (the context's, or with sinks the last ones), and
                    // the last one sampled
    int n;          // tokens in history
    DecodeState ds; // bytes of a UTF-8 character not yet complete
    char *buf;      // (tokenizer_decode_bound) one token's text
} Decoder;

static void decoder_init(Decoder *d, Transformer *t, const Tokenizer *tok, Sampler *sampler, int capacity) {
    *d = (Decoder){t, tok, sampler, malloc(((size_t)capacity + 1) * sizeof(int)), 0, {{0}, 0},
                   malloc(tokenizer_decode_bound(tok))};
    if (!d->history || !d->buf) die(EXIT_BAD_INPUT, "out of memory");
}

static void decoder_free(Decoder *d) {
    free(d->history);
    free(d->buf);
}

/* Decode `token` after the last token of history and write it to stdout. */
static void emit(Decoder *d, int token) {
    size_t n = tokenizer_decode(d->tok, &d->ds, d->n > 0 ? d->history[d->n - 1] : -1, token, d->buf);
    fwrite(d->buf, 1, n, stdout);
    fflush(stdout);
}

/* Print what the decoder still holds back, then a newline. */
static void end_text(Decoder *d) {
    size_t n = tokenizer_decode_flush(&d->ds, d->buf);
    fwrite(d->buf, 1, n, stdout);
    printf("\n");
    fflush(stdout);
}

/* The decode step generate and chat share: sample the next token from the
 * logits of the last one; unless it is one of the n_end end tokens, print it
 * and append it to history. Returns the token, or -1 when the text ends
 * here. The caller feeds it back (forward) if there is room. */
static int decode_step(Decoder *d, float *logits, const int *end, int n_end) {
    int next = sample(d->sampler, logits, d->history, d->n);
    for (int i = 0; i < n_end; i++)
        if (next == end[i]) return -1;
    emit(d, next);
    d->history[d->n++] = next;
    return next;
}

/* generate: stdout = the prompt's text, then the continuation, then "\n"
 * (llama2.c prints the same). The prompt (after BOS, when the tokenizer adds
 * one) goes through in blocks; sampling starts at its last token and stops at
 * max_new new tokens, a stop token (the tokenizer's stop ids, and BOS when it
 * adds one; not with ignore_eos, for benchmarks), or a full context (never,
 * with attention sinks: the cache rolls).
 * Statistics go to stderr. */
static void generate(Transformer *t, const Tokenizer *tok, Sampler *sampler, const char *prompt, size_t prompt_len,
                     int max_new, int ignore_eos, const char *summary) {
    int n_prompt;
    int *prompt_ids = encode_or_die(tok, prompt, prompt_len, tok->add_bos, &n_prompt);
    if (n_prompt == 0)
        die(EXIT_BAD_INPUT, "prompt: empty, and this tokenizer adds no BOS to start from (give one with -i or -f)");
    if (n_prompt > t->n_ctx && t->rope.sinks < 0) // a rolling cache takes any length
        die(EXIT_BAD_INPUT, "prompt: %d tokens (BOS included) do not fit in the context of %d tokens (raise --ctx, "
            "or roll the cache with --sinks S)", n_prompt, t->n_ctx);
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
    double start = now_seconds();
    int status;
    float *logits = prefill(t, d.history, n_prompt, 0, &status);
    if (!logits) forward_failed(t, status, d.history[n_prompt - 1], n_prompt - 1);
    double prefill_end = now_seconds();
    // Decode: sample, print, feed back, one token at a time.
    int n_new = 0, stops[TOK_MAX_STOP + 1], n_stop = 0;
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
        if (next < 0) break; // a stop token
        if (pos == t->n_ctx && t->rope.sinks < 0) {
            if (n_new < max_new)
                fprintf(stderr, "generate: the context of %d tokens is full after %d new tokens; raise --ctx, or "
                        "go on past it with attention sinks (--sinks 4)\n", t->n_ctx, n_new);
            break;
        }
        logits = forward(t, next, pos, &status);
        if (!logits) forward_failed(t, status, next, pos);
    }
    end_text(&d);
    double end = now_seconds(), prefill_s = prefill_end - start, decode_s = end - prefill_end;
    fprintf(stderr, "%d prompt + %d new tokens; prefill %.1f tok/s, generation %.1f tok/s\n", n_prompt, n_new,
            prefill_s > 0 ? n_prompt / prefill_s : 0.0,
            decode_s > 0 ? (n_new - 1 > 0 ? n_new - 1 : 0) / decode_s : 0.0);
    decoder_free(&d);
}

/* ---- Chat -----------------------------------------------------------------
 * A conversation is a list of messages: an optional system prompt, then user
 * and assistant turns in alternation. A chat template renders it to token ids
 * the way the model was trained to read it; the chat loop re-renders the
 * whole conversation every turn and runs only the tokens the KV cache does not
 * already hold. */

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT };
static const char *const ROLE_NAMES[] = {"system", "user", "assistant", NULL};
/* Index = CHAT_* (model.h); --chat-template chooses from the names after "unstated". */
static const char *const CHAT_TEMPLATE_NAMES[] = {"unstated", "plain", "llama2", "chatml", "llama3", NULL};

typedef struct {
    int role;    // ROLE_SYSTEM | ROLE_USER | ROLE_ASSISTANT
    char *text;  // the message, NUL-terminated (owned)
    size_t len;  // its length in bytes
} Message;

typedef struct {
    Message *m;
    int n, cap;
} Conversation;

static void conversation_add(Conversation *c, int role, const char *text, size_t len) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 8;
        c->m = realloc(c->m, (size_t)c->cap * sizeof *c->m);
        if (!c->m) die(EXIT_BAD_INPUT, "out of memory");
    }
    char *copy = malloc(len + 1);
    if (!copy) die(EXIT_BAD_INPUT, "out of memory");
    memcpy(copy, text, len);
    copy[len] = '\0';
    c->m[c->n++] = (Message){role, copy, len};
}

static void conversation_free(Conversation *c) {
    for (int i = 0; i < c->n; i++) free(c->m[i].text);
    free(c->m);
    *c = (Conversation){0};
}

/* A template with the ids of the special pieces it writes. */
typedef struct {
    int kind;                    // CHAT_PLAIN .. CHAT_LLAMA3
    int bos, eos;                // the tokenizer's; -1 = none
    int open, close;             // ChatML: <|im_start|>, <|im_end|>; Llama 3: <|start_header_id|>, <|end_header_id|>
    int eot;                     // Llama 3: <|eot_id|>; else -1
    int add_bos;                 // plain: the tokenizer's add_bos
    const char *system_default;  // the template's system prompt when the conversation has none; "" = none
    const char *system_prefix;   // text before every system prompt (Llama 3.1); "" = none
} ChatTemplate;

/* The id of the special piece whose text is `text`, or -1. */
static int special_piece(const Tokenizer *tok, const char *text) {
    size_t n = strlen(text);
    for (int i = 0; i < tok->vocab_size; i++)
        if (tok->kind[i] == PIECE_SPECIAL && (size_t)tok->vocab_len[i] == n && !memcmp(tok->vocab[i], text, n))
            return i;
    return -1;
}

/* Resolve template `kind` against tok: the special pieces it needs must be
 * there. The system texts come from the tokenizer file only when kind is the
 * template the file names (they belong to it). Exits with a usage error
 * naming the missing piece. */
static ChatTemplate chat_template(const Tokenizer *tok, int kind, const char *tok_path) {
    ChatTemplate ct = {kind, tok->bos_id, tok->eos_id, -1, -1, -1, tok->add_bos, "", ""};
    if (kind == tok->chat_template) {
        ct.system_default = tok->system_default;
        ct.system_prefix = tok->system_prefix;
    }
    const char *need[3] = {NULL, NULL, NULL};
    int *slot[3] = {&ct.open, &ct.close, &ct.eot};
    if (kind == CHAT_CHATML) need[0] = "<|im_start|>", need[1] = "<|im_end|>";
    if (kind == CHAT_LLAMA3) need[0] = "<|start_header_id|>", need[1] = "<|end_header_id|>", need[2] = "<|eot_id|>";
    for (int k = 0; k < 3; k++)
        if (need[k] && (*slot[k] = special_piece(tok, need[k])) < 0)
            die(EXIT_USAGE, "--chat-template %s: tokenizer %s has no special piece %s", CHAT_TEMPLATE_NAMES[kind],
                tok_path, need[k]);
    if ((kind == CHAT_LLAMA2 && (ct.bos < 0 || ct.eos < 0)) || (kind == CHAT_LLAMA3 && ct.bos < 0))
        die(EXIT_USAGE, "--chat-template %s: tokenizer %s has no %s", CHAT_TEMPLATE_NAMES[kind], tok_path,
            ct.bos < 0 ? "BOS" : "EOS");
    return ct;
}

/* Token ids under construction: text is collected until a special token
 * follows (or the end), then encoded in one piece, so that text spanning
 * several template parts tokenizes as the whole string would. */
typedef struct {
    const Tokenizer *tok;
    int *ids;
    int n, cap;
    char *text;      // pending text, not yet encoded
    size_t len, text_cap;
} Rendering;

static void put_text(Rendering *r, const char *s, size_t n) {
    if (r->len + n + 1 > r->text_cap) {
        r->text_cap = 2 * (r->len + n + 1);
        r->text = realloc(r->text, r->text_cap);
        if (!r->text) die(EXIT_BAD_INPUT, "out of memory");
    }
    memcpy(r->text + r->len, s, n);
    r->len += n;
}
static void put_str(Rendering *r, const char *s) { put_text(r, s, strlen(s)); }

static void reserve_ids(Rendering *r, size_t more) {
    if ((size_t)r->n + more <= (size_t)r->cap) return;
    if ((size_t)r->n + more > INT_MAX / 2) die(EXIT_BAD_INPUT, "chat: the conversation is too long to encode");
    r->cap = 2 * (r->n + (int)more);
    r->ids = realloc(r->ids, (size_t)r->cap * sizeof(int));
    if (!r->ids) die(EXIT_BAD_INPUT, "out of memory");
}

/* Encode the pending text (no BOS) onto the ids. */
static void flush_text(Rendering *r) {
    if (r->len == 0) return;
    reserve_ids(r, tokenizer_bound(r->len));
    int n = tokenizer_encode(r->tok, r->text, r->len, 0, 0, r->ids + r->n);
    if (n < 0) die(EXIT_BAD_INPUT, "chat: out of memory while encoding %zu bytes", r->len);
    r->n += n;
    r->len = 0;
}

static void put_token(Rendering *r, int id) {
    flush_text(r);
    reserve_ids(r, 1);
    r->ids[r->n++] = id;
}

/* Bytes of Unicode white space (Python's str.isspace, which Jinja's trim and
 * str.strip use) at s[0..n): the length of the one at the start (from_end = 0)
 * or at the end (1), or 0 when there is none. */
static size_t space_at(const char *s, size_t n, int from_end) {
    static const uint32_t spaces[] = {0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000};
    for (size_t k = 1; k <= 3 && k <= n; k++) { // candidate lengths 1..3 bytes
        const unsigned char *p = (const unsigned char *)(from_end ? s + n - k : s);
        uint32_t cp;
        if (k == 1 && p[0] < 0x80) cp = p[0];
        else if (k == 2 && (p[0] & 0xE0) == 0xC0 && (p[1] & 0xC0) == 0x80) cp = (p[0] & 0x1Fu) << 6 | (p[1] & 0x3F);
        else if (k == 3 && (p[0] & 0xF0) == 0xE0 && (p[1] & 0xC0) == 0x80 && (p[2] & 0xC0) == 0x80)
            cp = (p[0] & 0x0Fu) << 12 | (p[1] & 0x3Fu) << 6 | (p[2] & 0x3F);
        else continue;
        int space = (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || (cp >= 0x2000 && cp <= 0x200A);
        for (size_t j = 0; j < sizeof spaces / sizeof spaces[0]; j++) space |= cp == spaces[j];
        return space ? k : 0;
    }
    return 0;
}

/* s[0..n) without white space at either end (Python's str.strip()). */
static void put_stripped(Rendering *r, const char *s, size_t n) {
    size_t k;
    while (n > 0 && (k = space_at(s, n, 0)) > 0) s += k, n -= k;
    while (n > 0 && (k = space_at(s, n, 1)) > 0) n -= k;
    put_text(r, s, n);
}

/* Render conversation c with template ct into r->ids, as Hugging Face's
 * apply_chat_template renders the template the tokenizer file names and then
 * tokenizes the text (special tokens as their ids). With generation_prompt
 * the ids end where the assistant's reply starts.
 *   plain   BOS (when the tokenizer adds one), then every message's text and "\n"
 *   llama2  per user turn: BOS "[INST] " strip(text) " [/INST]", the system prompt
 *           put before the first user text as "<<SYS>>\n" system "\n<</SYS>>\n\n";
 *           per reply: " " strip(text) " " EOS
 *   chatml  per message: <|im_start|> role "\n" text <|im_end|> "\n"; the system
 *           turn is prefix + system, with the template's default system prompt
 *           when the conversation has none;
 *           prompt: <|im_start|> "assistant\n"
 *   llama3  BOS, then per message: <|start_header_id|> role <|end_header_id|>
 *           "\n\n" trim(text) <|eot_id|>; the system turn is prefix + trim(system),
 *           written whenever either is non-empty;
 *           prompt: <|start_header_id|> "assistant" <|end_header_id|> "\n\n" */
static void render_chat(Rendering *r, const ChatTemplate *ct, const Conversation *c, int generation_prompt) {
    r->n = 0;
    r->len = 0;
    const Message *m = c->m;
    int n = c->n;
    // The system prompt: the conversation's own, else the template's default.
    const char *system = ct->system_default;
    size_t system_len = strlen(system);
    int has_system = system_len > 0 || ct->system_prefix[0];
    if (n > 0 && m[0].role == ROLE_SYSTEM) {
        system = m[0].text, system_len = m[0].len, has_system = 1;
        m++, n--;
    }
    switch (ct->kind) {
    case CHAT_PLAIN:
        if (ct->add_bos) put_token(r, ct->bos);
        if (has_system) put_text(r, system, system_len), put_str(r, "\n");
        for (int i = 0; i < n; i++) put_text(r, m[i].text, m[i].len), put_str(r, "\n");
        break;
    case CHAT_LLAMA2:
        for (int i = 0; i < n; i++) {
            if (m[i].role == ROLE_USER) {
                put_token(r, ct->bos);
                put_str(r, "[INST] ");
                Rendering content = {.tok = r->tok}; // strip() applies to the system block and the text together
                if (i == 0 && has_system) {
                    put_str(&content, "<<SYS>>\n");
                    put_text(&content, system, system_len);
                    put_str(&content, "\n<</SYS>>\n\n");
                }
                put_text(&content, m[i].text, m[i].len);
                put_stripped(r, content.text, content.len);
                free(content.text);
                put_str(r, " [/INST]");
            } else {
                put_str(r, " ");
                put_stripped(r, m[i].text, m[i].len);
                put_str(r, " ");
                put_token(r, ct->eos);
            }
        }
        break;
    case CHAT_CHATML:
        if (has_system) {
            put_token(r, ct->open);
            put_str(r, "system\n");
            put_str(r, ct->system_prefix);
            put_text(r, system, system_len);
            put_token(r, ct->close);
            put_str(r, "\n");
        }
        for (int i = 0; i < n; i++) {
            put_token(r, ct->open);
            put_str(r, ROLE_NAMES[m[i].role]);
            put_str(r, "\n");
            put_text(r, m[i].text, m[i].len);
            put_token(r, ct->close);
            put_str(r, "\n");
        }
        if (generation_prompt) put_token(r, ct->open), put_str(r, "assistant\n");
        break;
    case CHAT_LLAMA3:
        put_token(r, ct->bos);
        for (int i = has_system ? -1 : 0; i < n; i++) { // -1: the system turn
            put_token(r, ct->open);
            put_str(r, i < 0 ? "system" : ROLE_NAMES[m[i].role]);
            put_token(r, ct->close);
            put_str(r, "\n\n");
            if (i < 0) put_str(r, ct->system_prefix);
            put_stripped(r, i < 0 ? system : m[i].text, i < 0 ? system_len : m[i].len);
            put_token(r, ct->eot);
        }
        if (generation_prompt) put_token(r, ct->open), put_str(r, "assistant"), put_token(r, ct->close),
            put_str(r, "\n\n");
        break;
    }
    flush_text(r);
}

/* Read one line from stdin (any length) after printing label; NULL at end
 * of input. */
static char *read_line(const char *label) {
    printf("%s", label);
    fflush(stdout);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) { // end of input: end the label's line
        free(line);
        printf("\n");
        return NULL;
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
    if (!isatty(STDIN_FILENO)) printf("%s\n", line); // piped: show the turn, as a terminal would
    return line;
}

/* The text of ids[0..n) following token prev, as the decoder prints it. */
static char *tokens_text(const Tokenizer *tok, const int *ids, int n, int prev, size_t *len) {
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

/* chat: continue conversation conv (a system prompt, turns from -i or a
 * conversation file, or nothing; chat takes it over) with the model's
 * replies and user turns, one per line of stdin, until EOF. Each turn
 * re-renders the conversation with the template and runs only the tokens
 * after what the KV cache already holds (usually the reply's end marker and
 * the new user turn). A reply ends at a stop token, at max_new tokens, or
 * when the context is full. A turn from stdin that leaves no room for a reply
 * ends the chat with a message; a conversation from the command line that
 * does not fit is bad input. */
static void chat(Transformer *t, const Tokenizer *tok, const ChatTemplate *ct, Sampler *sampler, Conversation conv,
                 int max_new, int ignore_eos, const char *summary) {
    // Stop at the tokenizer's stop ids, its EOS, and the template's end of turn.
    int stops[TOK_MAX_STOP + 3], n_stop = 0;
    for (int i = 0; i < tok->n_stop; i++) stops[n_stop++] = tok->stop_ids[i];
    int ends[3] = {tok->eos_id, ct->kind == CHAT_CHATML ? ct->close : ct->eot, ct->kind == CHAT_LLAMA2 ? ct->eos : -1};
    for (int k = 0; k < 3; k++)
        if (ends[k] >= 0) stops[n_stop++] = ends[k];
    if (ignore_eos) n_stop = 0;
    Decoder d;
    decoder_init(&d, t, tok, sampler, t->n_ctx);
    Rendering r = {.tok = tok};
    int summary_shown = 0;
    for (;;) {
        int from_stdin = conv.n == 0 || conv.m[conv.n - 1].role != ROLE_USER;
        if (from_stdin) { // the user's turn
            if (!summary_shown++) fputs(summary, stderr); // inputs are good
            char *user = read_line("User: ");
            if (!user) break;
            conversation_add(&conv, ROLE_USER, user, strlen(user));
            free(user);
        }
        render_chat(&r, ct, &conv, 1);
        if (r.n >= t->n_ctx) { // no room for even one token of reply
            if (!from_stdin)
                die(EXIT_BAD_INPUT, "prompt: the conversation renders to %d tokens and the reply needs one more; "
                    "the context holds %d (raise --ctx)", r.n, t->n_ctx);
            fprintf(stderr, "chat: the next turn needs %d tokens in all (%d held, %d more) and one for the reply; "
                    "the context holds %d: ending the chat (raise --ctx)\n", r.n, d.n, r.n - d.n, t->n_ctx);
            break;
        }
        if (!summary_shown++) fputs(summary, stderr);
        // Keep the cached tokens the rendering starts with; run at least one.
        int keep = 0;
        while (keep < d.n && keep < r.n - 1 && d.history[keep] == r.ids[keep]) keep++;
        memcpy(d.history + keep, r.ids + keep, (size_t)(r.n - keep) * sizeof(int));
        d.n = r.n;
        printf("Assistant: ");
        fflush(stdout);
        int status;
        float *logits = prefill(t, d.history + keep, r.n - keep, keep, &status);
        if (!logits) forward_failed(t, status, d.history[r.n - 1], r.n - 1);
        int reply_start = d.n;
        for (int n_new = 0; n_new < max_new && d.n < t->n_ctx; n_new++) {
            int next = decode_step(&d, logits, stops, n_stop);
            if (next < 0) break;
            logits = forward(t, next, d.n - 1, &status);
            if (!logits) forward_failed(t, status, next, d.n - 1);
        }
        end_text(&d);
        size_t reply_len;
        char *reply = tokens_text(tok, d.history + reply_start, d.n - reply_start, d.history[reply_start - 1],
                                  &reply_len);
        conversation_add(&conv, ROLE_ASSISTANT, reply, reply_len);
        free(reply);
        if (d.n >= t->n_ctx) {
            fprintf(stderr, "chat: the reply filled the context of %d tokens; ending the chat (raise --ctx)\n",
                    t->n_ctx);
            break;
        }
    }
    free(r.ids);
    free(r.text);
    decoder_free(&d);
    conversation_free(&conv);
}

/* A conversation written as text (-m tokenize --chat, -m chat --chat): one message per
 * line, "role: text" (role system, user or assistant; the text after ": ",
 * where \n, \t and \\ stand for a newline, a tab and a backslash); blank
 * lines are skipped. An optional system message first, then user and
 * assistant in turn, starting with user. Exits with a message naming the
 * line on anything else. */
static void parse_conversation(Conversation *c, const char *what, const char *text, size_t len) {
    size_t pos = 0;
    for (int line = 1; pos < len; line++) {
        const char *start = text + pos, *nl = memchr(start, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - start) : len - pos;
        pos += n + (nl != NULL);
        if (n > 0 && start[n - 1] == '\r') n--;
        if (n == 0) continue;
        int role = 0;
        size_t head = 0;
        for (; ROLE_NAMES[role]; role++) {
            head = strlen(ROLE_NAMES[role]);
            if (n > head && !memcmp(start, ROLE_NAMES[role], head) && start[head] == ':') break;
        }
        if (!ROLE_NAMES[role])
            die(EXIT_BAD_INPUT, "%s line %d: expected \"system: \", \"user: \" or \"assistant: \" and the text", what,
                line);
        head += 1 + (head + 1 < n && start[head + 1] == ' ');
        int expected = c->n == 0 ? -1 : c->m[c->n - 1].role == ROLE_USER ? ROLE_ASSISTANT : ROLE_USER;
        if (expected < 0 ? role == ROLE_ASSISTANT : role != expected)
            die(EXIT_BAD_INPUT, "%s line %d: expected %s, got %s", what, line,
                expected < 0 ? "system or user first" : ROLE_NAMES[expected], ROLE_NAMES[role]);
        char *msg = malloc(n - head + 1);
        if (!msg) die(EXIT_BAD_INPUT, "out of memory");
        size_t k = 0;
        for (size_t i = head; i < n; i++) {
            char ch = start[i];
            if (ch == '\\') {
                if (i + 1 == n) {
                    free(msg);
                    die(EXIT_BAD_INPUT, "%s line %d: a \"\\\" ends the line (escapes: \\n, \\t, \\\\)", what, line);
                }
                char e = start[++i];
                ch = e == 'n' ? '\n' : e == 't' ? '\t' : e == '\\' ? '\\' : '\0';
                if (!ch) {
                    free(msg);
                    die(EXIT_BAD_INPUT, "%s line %d: \"\\%c\" is no escape (\\n, \\t, \\\\)", what, line, e);
                }
            }
            msg[k++] = ch;
        }
        conversation_add(c, role, msg, k);
        free(msg);
    }
    if (c->n == 0 || (c->n == 1 && c->m[0].role == ROLE_SYSTEM))
        die(EXIT_BAD_INPUT, "%s: no user message", what);
}

/* tokenize: one line of space-separated ids, BOS first when the tokenizer
 * adds one. With a template: the ids the conversation in text renders to,
 * ending with the assistant's prompt when the last message is the user's. */
static void tokenize_mode(const Tokenizer *tok, const ChatTemplate *ct, const char *what, const char *text,
                          size_t len) {
    int n, *ids;
    Rendering r = {.tok = tok};
    if (ct) {
        Conversation conv = {0};
        parse_conversation(&conv, what, text, len);
        render_chat(&r, ct, &conv, conv.m[conv.n - 1].role == ROLE_USER);
        conversation_free(&conv);
        ids = r.ids, n = r.n;
    } else {
        ids = encode_or_die(tok, text, len, tok->add_bos, &n);
    }
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    free(r.text);
}

/* -log softmax(logits)[target] = logsumexp(logits) - logits[target]
 *   logsumexp(l) = max + log(sum_i exp(l_i - max))
 * The exponentials by exp_fast (float, within 2 ulp, in SIMD lanes), the sum
 * and the rest in double. Each term's relative error is at most 2.4e-7 (exp)
 * plus 6e-8 |l_i - max| (l_i - max rounded to float), and so is the log's
 * absolute error after the sum: within 2.4e-7 + 6e-8 x (the softmax-weighted
 * mean of max - l_i) of the formula in double, under 1e-6 while that mean is
 * under 12 nats. libm's exp in double took a third of a ppl run (32000 terms
 * per token, on one thread). */
double token_nll(const float *logits, int n, int target) {
    float max = logits[0];
#pragma omp simd reduction(max : max)
    for (int i = 1; i < n; i++) max = logits[i] > max ? logits[i] : max;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < n; i++) sum += exp_fast(logits[i] - max);
    return max + log(sum) - logits[target];
}

typedef struct {
    int start, end; // in-window positions [start, end) of the predicted token
    long tokens;
    double nll_sum, nll_sq; // the tokens' NLL summed, and its squares summed
} Bucket;

/* Position buckets [0, L/2), [L/2, L), [L, 2L), [2L, 4L), ... cut at n_ctx,
 * with L the original context of the RoPE settings (rope.orig_ctx: the
 * training context unless --rope-orig-ctx says otherwise). Returns the count
 * (at most 64). */
int ppl_buckets(Bucket *b, int L, int n_ctx) {
    int n = 0, edge = 0, next = L / 2 > 0 ? L / 2 : L;
    while (edge < n_ctx && n < 64) {
        int end = next < n_ctx ? next : n_ctx;
        b[n++] = (Bucket){edge, end, 0, 0.0, 0.0};
        edge = end;
        next = edge < L ? L : (edge > INT_MAX / 2 ? INT_MAX : edge * 2);
    }
    return n;
}

/* v as a JSON number (6 digits after the point), or null when it is not
 * finite (JSON has no inf or nan). */
static void print_json_number(double v) {
    if (isfinite(v)) printf("%.6f", v);
    else printf("null");
}

/* "key": v, and a ", " after it; null when v is not finite. */
static void print_json_field(const char *key, double v) {
    if (isfinite(v)) printf("\"%s\": %.9g, ", key, v);
    else printf("\"%s\": null, ", key);
}

static void print_json_string(const char *s) {
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if (*p < 0x20) printf("\\u%04x", *p);
        else putchar(*p);
    }
    putchar('"');
}

/* What ppl_score measures. */
typedef struct {
    long n_scored;      // tokens scored
    double nll_sum;     // their NLL, summed
    double nll_sq;      // and its squares summed, for the standard error
    double *win_sum;    // (n_windows) NLL summed over the tokens each window scored
    long *win_count;    // (n_windows) how many tokens each window scored
    int n_windows;
    Bucket buckets[64]; // NLL by in-window position range (ppl_buckets)
    int n_buckets;
    double *pos_sum;    // (n_positions) NLL summed per in-window position (streaming: absolute position)
    long *pos_count;    // (n_positions) tokens scored per position
    int n_positions;    // n_ctx, or with streaming the text's length
    int streaming;      // 1: scored by ppl_stream_score (positions are absolute)
} PplScore;

void free_ppl_score(PplScore *score) {
    free(score->pos_sum);
    free(score->pos_count);
    free(score->win_sum);
    free(score->win_count);
    score->pos_sum = NULL, score->pos_count = NULL, score->win_sum = NULL, score->win_count = NULL;
}

/* Standard error of a mean NLL over n tokens, from their sum and sum of
 * squares, as if the tokens were independent draws:
 *   se = sqrt(s^2 / n),  s^2 = (sq - sum^2 / n) / (n - 1)
 * NAN for fewer than 2 tokens. */
double nll_se(double sum, double sq, long n) {
    if (n < 2) return NAN;
    double var = (sq - sum * sum / n) / (n - 1);
    return isnan(var) ? NAN : sqrt(var > 0 ? var / n : 0); // var < 0: rounding of a zero spread
}

/* The same standard error with the windows as the independent units (tokens
 * of one window share its text, so they are not independent); the mean is a
 * ratio sum / count, whose standard error over W windows is
 *   se = sqrt(W / (W - 1) * sum_w (S_w - m n_w)^2) / N,  m = N-weighted mean
 * (S_w, n_w: window w's NLL sum and token count; N = sum_w n_w). NAN for
 * fewer than 2 windows. */
double nll_se_windows(const double *win_sum, const long *win_count, int W) {
    if (W < 2) return NAN;
    double total = 0, dev = 0;
    long N = 0;
    for (int w = 0; w < W; w++) total += win_sum[w], N += win_count[w];
    double m = total / N;
    for (int w = 0; w < W; w++) dev += (win_sum[w] - m * win_count[w]) * (win_sum[w] - m * win_count[w]);
    return sqrt((double)W / (W - 1) * dev) / N;
}

/* Count one scored token's nll, scored by window w at position p (in-window,
 * or absolute when streaming), into the totals, its window's and its
 * position's sums, and its bucket. */
static void ppl_add(PplScore *out, int w, int p, double nll) {
    out->nll_sum += nll, out->nll_sq += nll * nll, out->n_scored++;
    out->win_sum[w] += nll, out->win_count[w]++;
    out->pos_sum[p] += nll, out->pos_count[p]++;
    for (int k = 0; k < out->n_buckets; k++)
        if (p >= out->buckets[k].start && p < out->buckets[k].end) {
            out->buckets[k].tokens++;
            out->buckets[k].nll_sum += nll;
            out->buckets[k].nll_sq += nll * nll;
        }
}

/* Called after each window with the windows done and their total. */
typedef void (*PplProgress)(int done, int total);

/* Called with the logits of each scored token, in text order, and the token
 * they predict (ppl --save-logits and --kl-base). Returns 0, or -1 with a
 * message in err to stop scoring. */
typedef struct {
    int (*fn)(void *ctx, const float *logits, int vocab, int target, char *err, size_t err_len);
    void *ctx;
} TokenHook;

/* Teacher-forced NLL of the text ids[0..n_ids) (no BOS among them), the
 * windowing the extrapolation study relies on (docs/rope.md §12.2;
 * tests/reference.py's ppl_reference computes the same in numpy):
 *   - a window is a span of the text; the model reads BOS (when the
 *     tokenizer adds one: add_bos) and then the span but its last token,
 *     from position 0, and predicts every token after the BOS: at most
 *     n_ctx - 1 positions, so a span is n_ctx - 1 tokens with BOS and n_ctx
 *     without (then its first token is context only);
 *   - a window starts every `stride` text tokens (1 <= stride <= n_ctx - 1),
 *     and the last one ends at the text's end;
 *   - a window scores only the text tokens no earlier window scored, each
 *     given its whole in-window prefix; so every token is scored once, the
 *     text's first one only with BOS.
 * Fills *out (its arrays allocated here, freed by free_ppl_score); hands
 * each scored token's logits to hook (when not NULL); returns 0, or -1 with a
 * message in err (nothing to score, a stride out of range, a token outside
 * the vocabulary, no memory, the hook's complaint). */
int ppl_score(Transformer *t, const int *ids, int n_ids, int add_bos, int stride, PplScore *out,
              PplProgress progress, const TokenHook *hook, char *err, size_t err_len) {
    int bos = add_bos ? 1 : 0, span = t->n_ctx - bos; // text tokens in a window's span
    int V = t->config.vocab_size, max_block = block_limit(t), scored_upto = 0;
    memset(out, 0, sizeof *out);
    if (n_ids < 2 - bos)
        return fail(err, err_len, "no tokens to score (%d text tokens%s)", n_ids, bos ? "" : " and no BOS");
    if (t->n_ctx < 2) return fail(err, err_len, "--ctx %d: ppl needs at least 2 positions", t->n_ctx);
    if (stride < 1 || stride > t->n_ctx - 1)
        return fail(err, err_len, "--stride %d: expected 1..%d (ctx - 1)", stride, t->n_ctx - 1);
    int n_windows = n_ids <= span ? 1 : 1 + (n_ids - span + stride - 1) / stride;
    out->n_positions = t->n_ctx;
    out->pos_sum = calloc((size_t)t->n_ctx, sizeof(double));
    out->pos_count = calloc((size_t)t->n_ctx, sizeof(long));
    out->win_sum = calloc((size_t)n_windows, sizeof(double));
    out->win_count = calloc((size_t)n_windows, sizeof(long));
    out->n_buckets = ppl_buckets(out->buckets, t->rope.orig_ctx, t->n_ctx);
    int *input = malloc((size_t)t->n_ctx * sizeof(int)); // one window: [BOS], then its span but the last
    double *nll = malloc((size_t)max_block * sizeof(double)); // a block's scored tokens' NLLs
    int rc = !input || !nll || !out->pos_sum || !out->pos_count || !out->win_sum || !out->win_count
                 ? fail(err, err_len, "ppl: out of memory") : 0;
    for (int start = 0; rc == 0; start += stride) {
        int end = start + span < n_ids ? start + span : n_ids;
        // Input position q holds input[q]; its logits predict the text token
        // j = start + q + 1 - bos, which sits at in-window position q + 1.
        int n_in = end - start - 1 + bos;
        if (bos) input[0] = t->config.bos_id;
        memcpy(input + bos, ids + start, (size_t)(n_in - bos) * sizeof(int));
        for (int p0 = 0; p0 < n_in && rc == 0; p0 += max_block) {
            int B = n_in - p0 < max_block ? n_in - p0 : max_block;
            int status = forward_block(t, input + p0, B, p0, LOGITS_ALL); // logits (B, vocab_size)
            if (status == FORWARD_NOT_FINITE) {
                rc = fail(err, err_len, "ppl: the logits of window %d are NaN or infinite (a NaN or infinite weight, "
                          "or activations that overflowed)", out->n_windows);
                break;
            }
            if (status != 0) {
                rc = fail(err, err_len, "ppl: a token of window %d is outside the vocabulary (0..%d)",
                          out->n_windows, V - 1);
                break;
            }
            int b; // the block's NLLs, in parallel (the logits are B x 32000 for a Llama 2 vocabulary)
#pragma omp parallel for private(b) if ((long)B * V >= PARALLEL_MIN_WORK)
            for (b = 0; b < B; b++) {
                int j = start + p0 + b + 1 - bos; // the token input position p0 + b predicts
                nll[b] = j >= scored_upto && ids[j] >= 0 && ids[j] < V
                             ? token_nll(t->state.logits + (size_t)b * V, V, ids[j]) : NAN;
            }
            for (b = 0; b < B; b++) {
                int q = p0 + b, j = start + q + 1 - bos, p = q + 1; // scored token, its in-window position
                if (j < scored_upto) continue;                       // an earlier window scored it
                if (ids[j] < 0 || ids[j] >= V) {
                    rc = fail(err, err_len, "ppl: token %d at %d is outside the vocabulary (0..%d)", ids[j], j, V - 1);
                    break;
                }
                const float *logits = t->state.logits + (size_t)b * V;
                if (hook && hook->fn(hook->ctx, logits, V, ids[j], err, err_len) != 0) {
                    rc = -1;
                    break;
                }
                ppl_add(out, out->n_windows, p, nll[b]);
            }
        }
        if (rc != 0) break;
        out->n_windows++;
        if (progress) progress(out->n_windows, n_windows);
        scored_upto = end;
        if (end == n_ids) break;
    }
    free(input);
    free(nll);
    if (rc != 0) free_ppl_score(out);
    return rc;
}

/* Teacher-forced NLL of ids[0..n_ids) in one pass through the rolling cache
 * of attention sinks (--sinks S; StreamingLLM's long-text evaluation): BOS
 * first when add_bos, then token by token, each text token scored given
 * what the cache holds when it comes (the first one only after BOS). Fills
 * *out as ppl_score does, as one window, with buckets and per-position sums
 * by absolute position. Returns 0, or -1 with a message in err. */
int ppl_stream_score(Transformer *t, const int *ids, int n_ids, int add_bos, PplScore *out, PplProgress progress,
                     const TokenHook *hook, char *err, size_t err_len) {
    int bos = add_bos ? 1 : 0, n = n_ids + bos, V = t->config.vocab_size; // n: tokens fed, BOS included
    memset(out, 0, sizeof *out);
    if (t->rope.sinks < 0) return fail(err, err_len, "--streaming: needs a rolling cache (--sinks S)");
    if (n < 2) return fail(err, err_len, "no tokens to score (%d text tokens%s)", n_ids, bos ? "" : " and no BOS");
    out->n_positions = n;
    out->pos_sum = calloc((size_t)n, sizeof(double));
    out->pos_count = calloc((size_t)n, sizeof(long));
    out->win_sum = calloc(1, sizeof(double));
    out->win_count = calloc(1, sizeof(long));
    out->n_buckets = ppl_buckets(out->buckets, t->rope.orig_ctx, n);
    if (!out->pos_sum || !out->pos_count || !out->win_sum || !out->win_count) {
        free_ppl_score(out);
        return fail(err, err_len, "ppl: out of memory for %d positions", n);
    }
    for (int p = 0; p + 1 < n; p++) { // feed token p, score token p + 1
        int token = p < bos ? t->config.bos_id : ids[p - bos], target = ids[p + 1 - bos];
        int status;
        const float *logits = forward(t, token, p, &status);
        if (!logits || target < 0 || target >= V) {
            free_ppl_score(out);
            if (status == FORWARD_NOT_FINITE)
                return fail(err, err_len, "ppl: the logits at token %d are NaN or infinite (a NaN or infinite weight, "
                            "or activations that overflowed)", p);
            return fail(err, err_len, "ppl: a token near %d is outside the vocabulary (0..%d)", p, V - 1);
        }
        if (hook && hook->fn(hook->ctx, logits, V, target, err, err_len) != 0) {
            free_ppl_score(out);
            return -1;
        }
        ppl_add(out, 0, p + 1, token_nll(logits, V, target));
        if (progress && (p + 2) % 256 == 0) progress(p + 2, n);
    }
    out->n_windows = 1;
    out->streaming = 1;
    if (progress) progress(n, n);
    return 0;
}

/* ---- Comparing a run with a saved baseline (ppl --save-logits, --kl-base) --
 * A logits file holds every scored token's logits, so that a later run (q8_0
 * weights, an f16 cache, a scaling method) can be compared with this one
 * token by token, as llama.cpp's perplexity tool does. Little-endian:
 *   0   u32  magic 0x474f4c4c, the bytes "LLOG"
 *   4   i32  version 1
 *   8   i32  vocab_size
 *  12   i32  ctx, 16 i32 stride, 20 i32 add_bos: the windowing that scored them
 *  24   i64  n_tokens
 *  32   i32  streaming (1: ppl --streaming), 36 i32 sinks (-1: none)
 *  40..63    zero
 *  then n_tokens records: i32 the token predicted, vocab_size f32 logits */
#define LOGITS_MAGIC 0x474f4c4cu
#define LOGITS_HEADER_BYTES 64

typedef struct {
    FILE *f;
    const char *path;
    long n;
} LogitsWriter;

static int save_logits(void *ctx, const float *logits, int vocab, int target, char *err, size_t err_len) {
    LogitsWriter *w = ctx;
    int32_t id = target;
    if (fwrite(&id, 4, 1, w->f) != 1 || fwrite(logits, sizeof(float), (size_t)vocab, w->f) != (size_t)vocab)
        return fail(err, err_len, "--save-logits %s: write failed after %ld tokens (disk full?)", w->path, w->n);
    w->n++;
    return 0;
}

/* Per-token comparison with the baseline B of this run R, accumulated:
 *   KL(B || R) = sum_v p_B(v) (log p_B(v) - log p_R(v))
 *   top-1 agreement: argmax B == argmax R
 *   delta NLL = -log p_R(target) + log p_B(target) */
typedef struct {
    FILE *f;
    const char *path;
    float *base;               // (vocab_size) the baseline's logits of the current token
    long n, n_total;           // tokens compared so far, and in the file
    long top1;                 // tokens whose most likely id agrees
    double kl, kl_sq, dnll, dnll_sq;
} KlCompare;

static double log_sum_exp(const float *x, int n) {
    double max = x[argmax(x, n)], sum = 0;
    for (int i = 0; i < n; i++) sum += exp(x[i] - max);
    return max + log(sum);
}

static int compare_logits(void *ctx, const float *logits, int vocab, int target, char *err, size_t err_len) {
    KlCompare *c = ctx;
    int32_t id;
    if (c->n == c->n_total)
        return fail(err, err_len, "--kl-base %s: holds %ld tokens, this run scores more", c->path, c->n_total);
    if (fread(&id, 4, 1, c->f) != 1 || fread(c->base, sizeof(float), (size_t)vocab, c->f) != (size_t)vocab)
        return fail(err, err_len, "--kl-base %s: read error at token %ld", c->path, c->n);
    if (id != target)
        return fail(err, err_len, "--kl-base %s: token %ld is %ld in the file, %d here (another text?)", c->path, c->n,
                    (long)id, target);
    double lse_b = log_sum_exp(c->base, vocab), lse_r = log_sum_exp(logits, vocab), kl = 0;
    for (int v = 0; v < vocab; v++) {
        double lb = c->base[v] - lse_b, lr = logits[v] - lse_r;
        kl += exp(lb) * (lb - lr);
    }
    double dnll = (lse_r - logits[target]) - (lse_b - c->base[target]);
    c->kl += kl, c->kl_sq += kl * kl, c->dnll += dnll, c->dnll_sq += dnll * dnll;
    c->top1 += argmax(c->base, vocab) == argmax(logits, vocab);
    c->n++;
    return 0;
}

/* Open path as the baseline of a run with these settings that scores the
 * text tokens targets[0..n_targets): the header must match, the file hold
 * exactly its n_tokens records, and those predict the same tokens. Exits
 * with a message naming the file and what differs otherwise. */
static void open_kl_base(KlCompare *c, const char *path, const Transformer *t, int stride, int add_bos,
                         int streaming, const int *targets, int n_targets) {
    *c = (KlCompare){.f = fopen(path, "rb"), .path = path};
    c->base = malloc((size_t)t->config.vocab_size * sizeof(float));
    if (!c->f) die(EXIT_BAD_INPUT, "--kl-base %s: %s", path, strerror(errno));
    if (!c->base) die(EXIT_BAD_INPUT, "--kl-base %s: out of memory", path);
    unsigned char h[LOGITS_HEADER_BYTES];
    if (fread(h, 1, sizeof h, c->f) != sizeof h)
        die(EXIT_BAD_INPUT, "--kl-base %s: shorter than the %d-byte header", path, LOGITS_HEADER_BYTES);
    if ((uint32_t)read_le_i32(h) != LOGITS_MAGIC || read_le_i32(h + 4) != 1)
        die(EXIT_BAD_INPUT, "--kl-base %s: not a logits file of version 1 (written by -m ppl --save-logits)", path);
    const char *names[6] = {"vocab_size", "ctx", "stride", "add_bos", "streaming", "sinks"};
    int want[6] = {t->config.vocab_size, t->n_ctx, stride, add_bos, streaming, t->rope.sinks};
    const int at[6] = {8, 12, 16, 20, 32, 36};
    for (int k = 0; k < 6; k++)
        if (read_le_i32(h + at[k]) != want[k])
            die(EXIT_BAD_INPUT, "--kl-base %s: saved with %s %d, this run has %d", path, names[k],
                read_le_i32(h + at[k]), want[k]);
    int64_t n = (int64_t)((uint64_t)(uint32_t)read_le_i32(h + 24) | (uint64_t)(uint32_t)read_le_i32(h + 28) << 32);
    struct stat st;
    size_t record = 4 + 4 * (size_t)t->config.vocab_size;
    if (fstat(fileno(c->f), &st) != 0 || n < 0 || (uint64_t)n > (UINT64_MAX - LOGITS_HEADER_BYTES) / record ||
        (uint64_t)st.st_size != LOGITS_HEADER_BYTES + (uint64_t)n * record)
        die(EXIT_BAD_INPUT, "--kl-base %s: %lld bytes, expected %llu for its %lld tokens", path,
            (long long)st.st_size,
            (unsigned long long)(n < 0 || (uint64_t)n > (UINT64_MAX - 64) / record ? 0 : 64 + (uint64_t)n * record),
            (long long)n);
    c->n_total = (long)n;
    if (n != n_targets)
        die(EXIT_BAD_INPUT, "--kl-base %s: holds %lld tokens, this run scores %d (another text?)", path, (long long)n,
            n_targets);
    for (long i = 0; i < n; i++) {
        int32_t id;
        if (fseek(c->f, (long)(LOGITS_HEADER_BYTES + i * record), SEEK_SET) != 0 || fread(&id, 4, 1, c->f) != 1)
            die(EXIT_BAD_INPUT, "--kl-base %s: read error at token %ld", path, i);
        if (id != targets[i])
            die(EXIT_BAD_INPUT, "--kl-base %s: token %ld is %ld in the file, %d here (another text?)", path, i,
                (long)id, targets[i]);
    }
    if (fseek(c->f, LOGITS_HEADER_BYTES, SEEK_SET) != 0) die(EXIT_BAD_INPUT, "--kl-base %s: cannot seek", path);
}

/* Print a PplScore: JSON (--json; with --per-position the mean NLL at every
 * in-window position) or a table. */
static void ppl_report(const Transformer *t, const PplScore *score, const char *path, int stride, int json,
                       int per_position, const KlCompare *kl) {
    long n_scored = score->n_scored;
    int n_windows = score->n_windows, n_buckets = score->n_buckets;
    const Bucket *buckets = score->buckets;
    const double *pos_sum = score->pos_sum;
    const long *pos_count = score->pos_count;
    double nll = score->nll_sum / n_scored, se = nll_se(score->nll_sum, score->nll_sq, n_scored);
    double se_win = nll_se_windows(score->win_sum, score->win_count, n_windows);
    if (json) {
        printf("{\"file\": ");
        print_json_string(path);
        printf(", \"tokens\": %ld, ", n_scored);
        print_json_field("nll", nll);
        print_json_field("ppl", exp(nll));
        print_json_field("nll_se", se);
        print_json_field("nll_se_windows", se_win);
        print_json_field("ppl_lo", exp(nll - 1.96 * se)); // 95% interval under nll_se
        print_json_field("ppl_hi", exp(nll + 1.96 * se));
        printf("\"ctx\": %d, \"stride\": %d, \"windows\": %d, \"orig_ctx\": %d, \"scaling\": \"%s\", ",
               t->n_ctx, score->streaming ? 0 : stride, n_windows, t->rope.orig_ctx, SCALING_NAMES[t->rope.scaling]);
        if (t->rope.sinks >= 0) printf("\"sinks\": %d, ", t->rope.sinks);
        printf("\"streaming\": %s, \"buckets\": [", score->streaming ? "true" : "false");
        int first = 1;
        for (int b = 0; b < n_buckets; b++) {
            if (!buckets[b].tokens) continue;
            double bn = buckets[b].nll_sum / buckets[b].tokens;
            printf("%s{\"start\": %d, \"end\": %d, \"tokens\": %ld, ", first ? "" : ", ", buckets[b].start,
                   buckets[b].end, buckets[b].tokens);
            print_json_field("nll_se", nll_se(buckets[b].nll_sum, buckets[b].nll_sq, buckets[b].tokens));
            printf("\"nll\": ");
            print_json_number(bn);
            printf(", \"ppl\": ");
            print_json_number(exp(bn));
            printf("}");
            first = 0;
        }
        printf("]");
        if (per_position) { // mean NLL at in-window positions 0..ctx-1 (null: nothing scored there)
            printf(", \"per_position\": [");
            for (int p = 0; p < score->n_positions; p++) {
                if (p) printf(", ");
                if (pos_count[p]) print_json_number(pos_sum[p] / pos_count[p]);
                else printf("null");
            }
            printf("]");
        }
        if (kl) {
            printf(", \"kl_base\": {\"file\": ");
            print_json_string(kl->path);
            printf(", \"tokens\": %ld, ", kl->n);
            print_json_field("kl", kl->kl / kl->n);
            print_json_field("kl_se", nll_se(kl->kl, kl->kl_sq, kl->n));
            print_json_field("delta_nll", kl->dnll / kl->n);
            print_json_field("delta_nll_se", nll_se(kl->dnll, kl->dnll_sq, kl->n));
            printf("\"top1\": %.6f}", (double)kl->top1 / kl->n);
        }
        printf("}\n");
    } else {
        if (score->streaming)
            printf("%s: %ld tokens, streamed through a cache of %d tokens (%d sinks), scaling %s; positions are "
                   "absolute\n", path, n_scored, t->n_ctx, t->rope.sinks, SCALING_NAMES[t->rope.scaling]);
        else
            printf("%s: %ld tokens, %d windows of ctx %d (stride %d), scaling %s\n", path, n_scored, n_windows,
                   t->n_ctx, stride, SCALING_NAMES[t->rope.scaling]);
        printf("nll %.4f +- %.4f  ppl %.3f [%.3f, %.3f]\n", nll, se, exp(nll), exp(nll - 1.96 * se),
               exp(nll + 1.96 * se));
        if (isnan(se_win))
            printf("(+- one standard error, [95%% interval], counting tokens as independent)\n");
        else
            printf("(+- one standard error, [95%% interval], counting tokens as independent; with windows as the\n"
                   " independent units the standard error is %.4f)\n", se_win);
        printf("%-18s %8s %8s %8s %10s\n", "positions", "tokens", "nll", "+-", "ppl");
        for (int b = 0; b < n_buckets; b++) {
            if (!buckets[b].tokens) continue;
            double bn = buckets[b].nll_sum / buckets[b].tokens;
            char range[40];
            snprintf(range, sizeof range, "[%d, %d)", buckets[b].start, buckets[b].end);
            printf("%-18s %8ld %8.4f %8.4f %10.3f\n", range, buckets[b].tokens, bn,
                   nll_se(buckets[b].nll_sum, buckets[b].nll_sq, buckets[b].tokens), exp(bn));
        }
        if (kl)
            printf("against %s (%ld tokens): KL %.4g +- %.2g nats/token, delta nll %+.4g +- %.2g, "
                   "top-1 agreement %.2f%%\n", kl->path, kl->n, kl->kl / kl->n, nll_se(kl->kl, kl->kl_sq, kl->n),
                   kl->dnll / kl->n, nll_se(kl->dnll, kl->dnll_sq, kl->n), 100.0 * kl->top1 / kl->n);
    }
}

/* ppl's progress line, on a terminal only, at most every 2 seconds. */
static void progress_line(const char *unit, int done, int total) {
    static double last = 0; // when the line was last written; 0 = never
    if (!isatty(STDERR_FILENO)) return;
    if (done == total) { // clear the line, if there is one
        if (last > 0) fprintf(stderr, "\r%40s\r", "");
        return;
    }
    if (now_seconds() - last < 2.0) return;
    last = now_seconds();
    fprintf(stderr, "\rppl: %s %d of %d", unit, done, total);
}
static void ppl_progress(int done, int total) { progress_line("window", done, total); }
static void tokenize_progress(size_t done, size_t total) { // in MiB, rounded up: the last call clears the line
    progress_line("MiB tokenized:", (int)((done + 0xFFFFF) >> 20), (int)((total + 0xFFFFF) >> 20));
}
static void stream_progress(int done, int total) { progress_line("token", done, total); }

/* ppl: the NLL of a text file under teacher forcing (ppl_score), reported by
 * ppl_report. The text is encoded once, without BOS. */
/* The hook of a ppl run that saves its logits, compares them with a
 * baseline, or both. */
typedef struct {
    LogitsWriter *save;
    KlCompare *compare;
} PplHooks;

static int ppl_hooks(void *ctx, const float *logits, int vocab, int target, char *err, size_t err_len) {
    PplHooks *h = ctx;
    if (h->save && save_logits(h->save, logits, vocab, target, err, err_len) != 0) return -1;
    if (h->compare && compare_logits(h->compare, logits, vocab, target, err, err_len) != 0) return -1;
    return 0;
}

static void ppl_mode(Transformer *t, const Tokenizer *tok, const char *path, const char *text, size_t len,
                     int stride, int json, int per_position, int streaming, const char *save_path,
                     const char *kl_path, const char *summary) {
    // In pieces of 1 MiB: memory follows the ids (4 bytes each), not the
    // encoder's work buffers (about 30 bytes per byte of text at once).
    int *ids, n_ids = tokenizer_encode_long(tok, text, len, 1 << 20, &ids, tokenize_progress);
    if (n_ids < 0) die(EXIT_BAD_INPUT, "-f %s: out of memory while encoding %zu bytes", path, len);
    if (n_ids == 0) die(EXIT_BAD_INPUT, "-f %s: no tokens to score (empty text)", path);
    int max_stride = t->n_ctx - 1; // positions a window predicts
    if (max_stride < 1) die(EXIT_USAGE, "--ctx %d: ppl needs at least 2 positions", t->n_ctx);
    if (stride <= 0) stride = max_stride;
    if (stride > max_stride) die(EXIT_USAGE, "--stride %d: expected 1..%d (ctx - 1)", stride, max_stride);
    // The baseline to compare with, and the file to save into (written under
    // a temporary name, renamed when complete: never a half-written file).
    KlCompare kl = {0};
    if (kl_path) // every text token is scored once, in order; the first only after BOS
        open_kl_base(&kl, kl_path, t, stride, tok->add_bos, streaming, ids + !tok->add_bos, n_ids - !tok->add_bos);
    LogitsWriter saver = {NULL, save_path, 0};
    char *tmp_path = NULL;
    if (save_path) {
        tmp_path = malloc(strlen(save_path) + 5);
        if (!tmp_path) die(EXIT_BAD_INPUT, "out of memory");
        sprintf(tmp_path, "%s.tmp", save_path);
        unsigned char zeros[LOGITS_HEADER_BYTES] = {0};
        saver.f = fopen(tmp_path, "wb");
        if (!saver.f || fwrite(zeros, 1, sizeof zeros, saver.f) != sizeof zeros) {
            int e = errno;
            if (saver.f) fclose(saver.f), remove(tmp_path);
            die(EXIT_BAD_INPUT, "--save-logits %s: %s", save_path, strerror(e));
        }
        fprintf(stderr, "ppl: saving %.1f MiB of logits (%zu bytes per token)\n",
                (double)n_ids * (4 + 4.0 * t->config.vocab_size) / 1048576, 4 + 4 * (size_t)t->config.vocab_size);
    }
    PplHooks hooks = {save_path ? &saver : NULL, kl_path ? &kl : NULL};
    TokenHook hook = {ppl_hooks, &hooks};
    fputs(summary, stderr);
    PplScore score;
    char err[512];
    double start_time = now_seconds();
    const TokenHook *h = save_path || kl_path ? &hook : NULL;
    int rc = streaming ? ppl_stream_score(t, ids, n_ids, tok->add_bos, &score, stream_progress, h, err, sizeof err)
                       : ppl_score(t, ids, n_ids, tok->add_bos, stride, &score, ppl_progress, h, err, sizeof err);
    if (rc == 0 && kl_path && kl.n != kl.n_total)
        rc = fail(err, sizeof err, "--kl-base %s: holds %ld tokens, this run scored %ld", kl_path, kl.n_total, kl.n);
    if (rc == 0 && save_path) { // the header, now that the count is known; then the file under its name
        unsigned char h[LOGITS_HEADER_BYTES] = {0};
        int32_t fields[10] = {(int32_t)LOGITS_MAGIC, 1, t->config.vocab_size, t->n_ctx, stride, tok->add_bos,
                              (int32_t)((uint64_t)saver.n & 0xffffffffu), (int32_t)((uint64_t)saver.n >> 32), streaming,
                              t->rope.sinks};
        for (int k = 0; k < 10; k++) // little-endian whatever the machine
            for (int b = 0; b < 4; b++) h[4 * k + b] = (unsigned char)((uint32_t)fields[k] >> (8 * b));
        if (fseek(saver.f, 0, SEEK_SET) != 0 || fwrite(h, 1, sizeof h, saver.f) != sizeof h || fclose(saver.f) != 0 ||
            rename(tmp_path, save_path) != 0)
            rc = fail(err, sizeof err, "--save-logits %s: %s", save_path, strerror(errno));
        saver.f = NULL;
    }
    if (rc != 0) {
        if (saver.f) fclose(saver.f);
        if (tmp_path) remove(tmp_path);
        if (!strncmp(err, "--", 2)) die(EXIT_BAD_INPUT, "%s", err); // names its flag and file
        die(EXIT_BAD_INPUT, "-f %s: %s", path, err);
    }
    if (streaming)
        fprintf(stderr, "ppl: %ld tokens scored, streamed, %.1f s\n", score.n_scored, now_seconds() - start_time);
    else
        fprintf(stderr, "ppl: %ld tokens scored in %d windows, %.1f s\n", score.n_scored, score.n_windows,
                now_seconds() - start_time);
    ppl_report(t, &score, path, stride, json, per_position, kl_path ? &kl : NULL);
    if (kl.f) fclose(kl.f);
    free(kl.base);
    free(tmp_path);
    free(ids);
    free_ppl_score(&score);
}

/* ---- Passkey retrieval (docs/passkey.md) ----------------------------------
 * Can the model still find one fact placed far back? A prompt of `length`
 * tokens hides "The pass key is K" at a chosen depth inside filler text and
 * ends with the question; greedy decoding must give back K. */

static const char PASSKEY_TASK[] = "There is an important info hidden inside a lot of irrelevant text. Find it and "
                                   "memorize them. I will quiz you about the important information there.";
static const char PASSKEY_FILLER[] = "The grass is green. The sky is blue. The sun is yellow. Here we go. "
                                     "There and back again.";
static const char PASSKEY_QUESTION[] = "What is the pass key? The pass key is";

/* Filler sentences: a text with white space runs made single spaces, cut
 * after each ".", "!" or "?" that a space follows (docs/passkey.md §1). */
typedef struct {
    char *text;    // the normalized text, each sentence NUL-terminated in place
    char **s;      // (n) the sentences
    size_t *len;   // (n) their lengths
    int n;
} Sentences;

static void split_sentences(Sentences *out, const char *text, size_t n) {
    *out = (Sentences){malloc(n + 1), malloc((n / 2 + 1) * sizeof(char *)), malloc((n / 2 + 1) * sizeof(size_t)), 0};
    if (!out->text || !out->s || !out->len) die(EXIT_BAD_INPUT, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) { // white space runs -> one space, none at the ends
        int space = strchr(" \t\n\r\v\f", text[i]) != NULL && text[i] != '\0';
        if (!space) out->text[k++] = text[i];
        else if (k > 0 && out->text[k - 1] != ' ') out->text[k++] = ' ';
    }
    if (k > 0 && out->text[k - 1] == ' ') k--;
    out->text[k] = '\0';
    for (size_t start = 0, i = 0; i < k; i++) { // a sentence is at least two bytes: the split needs a space
        int last = i + 1 == k;
        int ends = out->text[i] && strchr(".!?", out->text[i]) && i + 1 < k && out->text[i + 1] == ' ';
        if (!ends && !last) continue;
        out->s[out->n] = out->text + start;
        out->len[out->n++] = i + 1 - start;
        if (ends) out->text[++i] = '\0'; // the space between sentences
        start = i + 1;
    }
}

static void free_sentences(Sentences *s) {
    free(s->text);
    free(s->s);
    free(s->len);
}

/* TASK " " filler[start..start+i) KEY filler[start+i..start+k) " " QUESTION,
 * all joined by single spaces, the filler wrapping around (docs/passkey.md §1). */
static char *passkey_prompt(const Sentences *f, int start, int k, int i, const char *key, size_t *len) {
    char key_line[96];
    snprintf(key_line, sizeof key_line, "The pass key is %s. Remember it. %s is the pass key.", key, key);
    size_t cap = sizeof PASSKEY_TASK + sizeof PASSKEY_QUESTION + strlen(key_line) + 4;
    for (int j = 0; j < k; j++) cap += f->len[(start + j) % f->n] + 1;
    char *p = malloc(cap);
    if (!p) die(EXIT_BAD_INPUT, "passkey: cannot allocate a prompt of %zu bytes", cap);
    size_t at = 0;
#define APPEND(str, n) (memcpy(p + at, (str), (n)), at += (n))
    APPEND(PASSKEY_TASK, strlen(PASSKEY_TASK));
    for (int j = 0; j <= k; j++) {
        if (j == i) APPEND(" ", 1), APPEND(key_line, strlen(key_line));
        if (j < k) APPEND(" ", 1), APPEND(f->s[(start + j) % f->n], f->len[(start + j) % f->n]);
    }
    APPEND(" ", 1);
    APPEND(PASSKEY_QUESTION, strlen(PASSKEY_QUESTION));
#undef APPEND
    p[at] = '\0';
    *len = at;
    return p;
}

/* The ids of the prompt with k filler sentences, the key after round(depth * k). */
static int *passkey_encode(const Tokenizer *tok, const Sentences *f, int start, double depth, const char *key, int k,
                           int *n_ids) {
    size_t len;
    char *text = passkey_prompt(f, start, k, (int)lround(depth * k), key, &len);
    int *ids = encode_or_die(tok, text, len, tok->add_bos, n_ids);
    free(text);
    return ids;
}

/* One trial's prompt: the most filler sentences k whose prompt (BOS first
 * when the tokenizer adds one) has at most `length` tokens, the key after
 * i = round(depth * k) of them. Returns the ids (n_ids of them), or NULL when
 * not even the prompt without filler fits; *k_out, *i_out say what was used. */
static int *passkey_ids(const Tokenizer *tok, const Sentences *f, int start, double depth, const char *key,
                        int length, int *n_ids, int *k_out, int *i_out) {
    int lo = 0, hi = 1, *best = NULL, n_best = 0;
    for (int step = 0;; step++) { // exponential search for an upper bound, then bisection: lo fits, hi does not
        int k = step == 0 ? 0 : hi, n;
        int *ids = passkey_encode(tok, f, start, depth, key, k, &n);
        if (n > length) {
            free(ids);
            if (step == 0) return NULL;
            break;
        }
        free(best);
        best = ids, n_best = n, lo = k;
        if (step > 0) {
            if (hi > INT_MAX / 2) break;
            hi *= 2;
        }
    }
    while (hi - lo > 1) {
        int k = lo + (hi - lo) / 2, n;
        int *ids = passkey_encode(tok, f, start, depth, key, k, &n);
        if (n <= length) free(best), best = ids, n_best = n, lo = k;
        else free(ids), hi = k;
    }
    *n_ids = n_best, *k_out = lo, *i_out = (int)lround(depth * lo);
    return best;
}

/* The answer in a continuation's text: its first run of decimal digits
 * (*n_digits of them, 0 when there is none). */
const char *passkey_answer(const char *text, size_t *n_digits) {
    const char *digits = text + strcspn(text, "0123456789");
    *n_digits = strspn(digits, "0123456789");
    return digits;
}

/* Whether a continuation's text answers key: its first digit run is key. */
int passkey_correct(const char *text, const char *key) {
    size_t n;
    const char *digits = passkey_answer(text, &n);
    return n == strlen(key) && !memcmp(digits, key, n);
}

/* Comma-separated numbers of flag (integers when integer), each in [lo, hi];
 * exits with a usage error naming the flag otherwise. Returns the count. */
static int parse_list(const char *flag, const char *text, int integer, double lo, double hi, double *out, int max) {
    int n = 0;
    const char *p = text;
    for (;;) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        int bad = end == p || errno == ERANGE || !(v >= lo && v <= hi) || (integer && v != floor(v)) ||
                  (*end != ',' && *end != '\0') || n == max;
        if (bad)
            die(EXIT_USAGE, "%s %s: expected at most %d comma-separated %s in [%.10g, %.10g]", flag, text, max,
                integer ? "integers" : "numbers", lo, hi);
        out[n++] = v;
        if (*end == '\0') return n;
        p = end + 1;
    }
}

/* One trial's draws, in this order: the key (digits decimal digits, the
 * first not 0) into key, then the first filler sentence, which it returns
 * (0 for the fixed filler, whose sentences all repeat). */
static int passkey_draw(uint64_t *rng, int digits, int n_sentences, int from_file, char *key) {
    key[0] = (char)('1' + random_u32(rng) % 9);
    for (int d = 1; d < digits; d++) key[d] = (char)('0' + random_u32(rng) % 10);
    key[digits] = '\0';
    return from_file ? (int)(random_u32(rng) % (uint32_t)n_sentences) : 0;
}

/* What -m passkey was asked to do. */
typedef struct {
    double lengths[64], depths[64];
    int n_lengths, n_depths, trials, digits;
    uint64_t seed;
    const char *filler_path; // NULL: the fixed filler sentences
    int json, prompts_only;
} PasskeyPlan;

/* passkey: for each length x depth, `trials` prompts with random keys; the
 * accuracy of greedy answers (docs/passkey.md). Text: a table of accuracies;
 * --json: every cell and trial; --prompts-only prints the prompts instead of
 * running the model. Progress goes to stderr. */
static void passkey_mode(Transformer *t, const Tokenizer *tok, const PasskeyPlan *plan, const char *filler,
                         size_t filler_len, const char *summary) {
    Sentences f;
    if (!plan->filler_path) filler = PASSKEY_FILLER, filler_len = strlen(PASSKEY_FILLER);
    split_sentences(&f, filler, filler_len);
    if (f.n == 0) die(EXIT_BAD_INPUT, "-f %s: no filler sentences (empty text)", plan->filler_path);
    int n_new = plan->digits + 4, longest = 0;
    uint64_t seed_state = plan->seed * 0x9E3779B97F4A7C15ull + 1;
    if (seed_state == 0) seed_state = 1; // xorshift's fixed point
    uint64_t rng = seed_state;
    // Check every cell before printing anything: the context, and that each
    // trial's prompt without filler fits its length (keys differ in tokens).
    for (int li = 0; li < plan->n_lengths; li++) {
        int length = (int)plan->lengths[li];
        longest = length > longest ? length : longest;
        if (length + n_new > t->n_ctx && t->rope.sinks < 0) // attention sinks roll past the cache
            die(EXIT_USAGE, "--lengths %d: a prompt of %d tokens and its %d answer tokens need --ctx %d, got %d "
                "(or a rolling cache, --sinks S)", length, length, n_new, length + n_new, t->n_ctx);
        for (int k = 0; k < plan->n_depths * plan->trials; k++) {
            char key[24];
            passkey_draw(&rng, plan->digits, f.n, plan->filler_path != NULL, key);
            int n_bare;
            free(passkey_encode(tok, &f, 0, 0, key, 0, &n_bare));
            if (n_bare > length)
                die(EXIT_USAGE, "--lengths %d: the prompt without filler has %d tokens (key %s)", length, n_bare, key);
        }
    }
    rng = seed_state; // the same draws again, for the run
    if (!plan->prompts_only) fputs(summary, stderr);
    int *history = malloc(((size_t)longest + n_new + 1) * sizeof(int));
    if (!history) die(EXIT_BAD_INPUT, "out of memory");
    if (plan->json) printf("{\"mode\": \"passkey\", \"filler\": %s", plan->filler_path ? "" : "\"fixed\"");
    if (plan->json && plan->filler_path) print_json_string(plan->filler_path);
    if (plan->json)
        printf(", \"key_digits\": %d, \"trials_per_cell\": %d, \"seed\": %llu, \"ctx\": %d, \"orig_ctx\": %d, "
               "\"scaling\": \"%s\", ", plan->digits, plan->trials, (unsigned long long)plan->seed, t->n_ctx,
               t->rope.orig_ctx, SCALING_NAMES[t->rope.scaling]);
    if (plan->json && t->rope.sinks >= 0) printf("\"sinks\": %d, ", t->rope.sinks);
    if (plan->json) printf("\"cells\": [");
    else if (!plan->prompts_only) {
        printf("passkey: %d trials per cell, %d-digit keys, filler %s, ctx %d, scaling %s\n%8s", plan->trials,
               plan->digits, plan->filler_path ? plan->filler_path : "fixed", t->n_ctx,
               SCALING_NAMES[t->rope.scaling], "length");
        for (int di = 0; di < plan->n_depths; di++) printf("  d=%-5.2f", plan->depths[di]);
        printf("  %8s\n", "mean");
    }
    double start_time = now_seconds();
    for (int li = 0; li < plan->n_lengths; li++) {
        int length = (int)plan->lengths[li], row_correct = 0;
        if (!plan->json && !plan->prompts_only) printf("%8d", length);
        for (int di = 0; di < plan->n_depths; di++) {
            double depth = plan->depths[di];
            int correct = 0;
            if (plan->json)
                printf("%s{\"length\": %d, \"depth\": %g, \"trials\": [", li + di ? ", " : "", length, depth);
            for (int trial = 0; trial < plan->trials; trial++) {
                char key[24];
                int start = passkey_draw(&rng, plan->digits, f.n, plan->filler_path != NULL, key);
                int n_ids, k, i;
                int *ids = passkey_ids(tok, &f, start, depth, key, length, &n_ids, &k, &i);
                if (!ids) die(EXIT_BAD_INPUT, "passkey: a prompt checked to fit no longer does (a bug)");
                if (plan->prompts_only) {
                    size_t len;
                    char *text = passkey_prompt(&f, start, k, i, key, &len);
                    if (plan->json) {
                        printf("%s{\"key\": \"%s\", \"start\": %d, \"sentences\": %d, \"key_after\": %d, "
                               "\"prompt_tokens\": %d, \"prompt\": ", trial ? ", " : "", key, start, k, i, n_ids);
                        print_json_string(text);
                        printf("}");
                    } else {
                        printf("# length %d depth %g trial %d: key %s, %d tokens, %d filler sentences, "
                               "key after %d\n%s\n", length, depth, trial, key, n_ids, k, i, text);
                    }
                    free(text);
                    free(ids);
                    continue;
                }
                // Prefill the prompt; greedy answer of up to n_new tokens.
                memcpy(history, ids, (size_t)n_ids * sizeof(int));
                free(ids);
                int status;
                float *logits = prefill(t, history, n_ids, 0, &status);
                if (!logits) forward_failed(t, status, history[n_ids - 1], n_ids - 1);
                int n = n_ids;
                for (int s = 0; s < n_new && logits; s++) {
                    int next = argmax(logits, t->config.vocab_size), stop = 0;
                    for (int j = 0; j < tok->n_stop; j++) stop |= next == tok->stop_ids[j];
                    if (stop) break;
                    history[n++] = next;
                    if (s + 1 == n_new) break;
                    logits = forward(t, next, n - 1, &status);
                    if (!logits) forward_failed(t, status, next, n - 1);
                }
                size_t answer_len;
                char *answer = tokens_text(tok, history + n_ids, n - n_ids, history[n_ids - 1], &answer_len);
                size_t n_digits;
                const char *digits = passkey_answer(answer, &n_digits);
                int ok = passkey_correct(answer, key);
                correct += ok;
                if (plan->json) {
                    printf("%s{\"key\": \"%s\", \"start\": %d, \"sentences\": %d, \"key_after\": %d, "
                           "\"prompt_tokens\": %d, \"answer\": \"%.*s\", \"text\": ", trial ? ", " : "", key, start,
                           k, i, n_ids, (int)n_digits, digits);
                    print_json_string(answer);
                    printf(", \"correct\": %s}", ok ? "true" : "false");
                }
                free(answer);
            }
            row_correct += correct;
            if (plan->json && plan->prompts_only) printf("]}");
            else if (plan->json)
                printf("], \"correct\": %d, \"accuracy\": %.4f}", correct, (double)correct / plan->trials);
            else if (!plan->prompts_only) printf("  %6.0f%%", 100.0 * correct / plan->trials), fflush(stdout);
            if (!plan->prompts_only)
                fprintf(stderr, "passkey: length %d depth %.2f: %d of %d correct (%.1f s)\n", length, depth, correct,
                        plan->trials, now_seconds() - start_time);
        }
        if (!plan->json && !plan->prompts_only)
            printf("  %7.0f%%\n", 100.0 * row_correct / ((double)plan->trials * plan->n_depths));
    }
    if (plan->json) printf("]}\n");
    free(history);
    free_sentences(&f);
}

/* rope: the inverse frequencies used for the full context, per pair i:
 * inv_freq, its wavelength 2*pi/inv_freq in tokens, its ratio to the unscaled
 * frequency, and whether the pair is extrapolated (frequency kept as trained:
 * positions past the training length simply turn it further) or interpolated
 * (frequency lowered, so the longer context maps into angles seen in
 * training); plus the attention factor. Dynamic NTK is shown for length ctx. */
static void rope_mode(const Transformer *t, int json) {
    const RopeConfig *r = &t->rope;
    int n_pairs = r->rot_dim / 2;
    double *inv = malloc((size_t)n_pairs * sizeof(double)), *plain = malloc((size_t)n_pairs * sizeof(double)), mscale, unused;
    if (!inv || !plain) die(EXIT_BAD_INPUT, "out of memory");
    rope_frequencies(r, t->n_ctx, inv, &mscale);
    RopeConfig unscaled = *r;
    unscaled.scaling = ROPE_NONE;
    rope_frequencies(&unscaled, t->n_ctx, plain, &unused);
    // LongRoPE: which of its two factor arrays a sequence of --ctx tokens uses
    const char *factors = r->scaling != ROPE_LONGROPE ? NULL : t->n_ctx > r->orig_ctx ? "long" : "short";
    if (json) {
        printf("{\"rot_dim\": %d, \"layout\": \"%s\", \"base\": %.17g, \"scaling\": \"%s\", \"factor\": %.17g, "
               "\"orig_ctx\": %d, \"ctx\": %d, \"attn_factor\": %.17g, ",
               r->rot_dim, LAYOUT_NAMES[r->layout], r->base, SCALING_NAMES[r->scaling], r->factor, r->orig_ctx,
               t->n_ctx, mscale);
        if (factors) printf("\"longrope_factors\": \"%s\", ", factors);
        printf("\"inv_freq\": [");
        for (int i = 0; i < n_pairs; i++) printf("%s%.17g", i ? ", " : "", inv[i]);
        printf("], \"wavelength\": [");
        for (int i = 0; i < n_pairs; i++) printf("%s%.17g", i ? ", " : "", 2 * PI / inv[i]);
        printf("], \"ratio\": [");
        for (int i = 0; i < n_pairs; i++) printf("%s%.17g", i ? ", " : "", inv[i] / plain[i]);
        printf("], \"status\": [");
        for (int i = 0; i < n_pairs; i++)
            printf("%s\"%s\"", i ? ", " : "", fabs(inv[i] / plain[i] - 1) < 1e-12 ? "extrapolated" : "interpolated");
        printf("]}\n");
    } else {
        printf("rot_dim %d, layout %s, base %g, scaling %s (factor %g, orig_ctx %d), ctx %d, attn_factor %.10f\n",
               r->rot_dim, LAYOUT_NAMES[r->layout], r->base, SCALING_NAMES[r->scaling], r->factor, r->orig_ctx,
               t->n_ctx, mscale);
        if (factors)
            printf("longrope: the %s factors (a sequence of %d tokens is %s than orig_ctx %d)\n", factors, t->n_ctx,
                   t->n_ctx > r->orig_ctx ? "longer" : "no longer", r->orig_ctx);
        printf("%5s %16s %16s %12s  %s\n", "pair", "inv_freq", "wavelength", "/ unscaled", "status");
        for (int i = 0; i < n_pairs; i++) {
            double ratio = inv[i] / plain[i];
            printf("%5d %16.10g %16.6g %12.6g  %s\n", i, inv[i], 2 * PI / inv[i], ratio,
                   fabs(ratio - 1) < 1e-12 ? "extrapolated" : "interpolated");
        }
    }
    free(inv);
    free(plain);
}

/* ==========================================================================
 * 9. Command line
 * ========================================================================== */
#ifndef TESTING

/* Everything the command line sets; the defaults are in main. */
typedef struct {
    const char *tokenizer, *prompt, *prompt_file, *system;
    double temperature, topp, minp, repeat_penalty;
    int topk, repeat_last_n, steps, ctx, stride, mode, kv_type, threads, q8_activations;
    int json, per_position, ignore_eos, help, chat_template, conversation_input;
    const char *lengths, *depths; // passkey: comma-separated lists
    const char *save_logits, *kl_base; // ppl: logits files
    int streaming;                     // ppl: token by token through the rolling cache
    int trials, key_digits, prompts_only;
    long seed;
    RopeConfig rope; // overrides of the checkpoint's RoPE settings; NAN / -1 = not given
} Options;

enum { GENERATE, CHAT, PPL, TOKENIZE, ROPE_MODE, PASSKEY };
static const char *const MODE_NAMES[] = {"generate", "chat", "ppl", "tokenize", "rope", "passkey", NULL};
static const char *const DYNAMIC_NAMES[] = {"hf", "exact", NULL};        // rope.dynamic_exact = 0, 1
static const char *const KV_NAMES[] = {"f32", "f16", NULL};              // KV_F32, KV_F16
static const char *const WEIGHT_NAMES[] = {"f32", "q8_0"};               // WEIGHT_F32, WEIGHT_Q8_0
static const char *const ACTIVATION_NAMES[] = {"f32", "int8", NULL};     // MatmulScratch.int8_blocks = 0, 1

/* How a flag's value is read into its field of Options. */
typedef enum {
    SWITCH, // no value: the int field becomes 1
    INT,    // an integer in [lo, hi] into an int
    LONG,   // an integer in [lo, hi] into a long
    REAL,   // a number in [lo, hi] into a double
    TEXT,   // any string into a const char *
    CHOICE, // one of `choices`; its index into an int
    PAIR,   // two integers in [lo, hi] into two consecutive ints (--self-extend G W: se_group, se_window)
} ValueKind;

/* One row per flag: the usage text, the parser and the range checks all read
 * this table, so they cannot disagree. */
typedef struct {
    const char *name, *alias; // e.g. "--top-k", "-k" (alias may be NULL)
    ValueKind kind;
    double lo, hi;            // the accepted range of INT, LONG, REAL and PAIR: [lo, hi], or (lo, hi]
                              // when lo is EXCLUSIVE; hi = NO_MAX: only the type's limit
    size_t field;             // offsetof(Options, ...)
    const char *const *choices;
    const char *value, *help; // how usage names the value, and what the flag does
} Flag;

_Static_assert(offsetof(RopeConfig, se_window) == offsetof(RopeConfig, se_group) + sizeof(int),
               "--self-extend G W fills se_group and the int after it");
#define FIELD(f) offsetof(Options, f)
#define NO_MAX 1e300            // no upper limit but the field's type
#define EXCLUSIVE(lo) (-(lo))   // a REAL lower bound lo > 0 that is excluded (--rope-base > 1)
static const Flag FLAGS[] = {
    {"-t", NULL, REAL, 0, 100, FIELD(temperature), NULL, "<float>", "temperature, default 1.0; 0 = greedy argmax"},
    {"-p", NULL, REAL, 0, 1, FIELD(topp), NULL, "<float>", "top-p, default 0.9; 1 = off, 0 = the most likely token"},
    {"--top-k", "-k", INT, 0, NO_MAX, FIELD(topk), NULL, "<int>", "keep the k most likely tokens, default 0 = off"},
    {"--min-p", NULL, REAL, 0, 1, FIELD(minp), NULL, "<float>", "min-p, default 0 = off"},
    {"--repeat-penalty", NULL, REAL, 1e-3, 1e3, FIELD(repeat_penalty), NULL, "<float>", "default 1.0 = off"},
    {"--repeat-last-n", NULL, INT, 0, NO_MAX, FIELD(repeat_last_n), NULL, "<int>",
     "tokens the penalty looks back over, default 64"},
    {"-s", NULL, LONG, 0, NO_MAX, FIELD(seed), NULL, "<int>",
     "seed, default: the time (passkey: 0); the same seed, the same text"},
    {"-n", NULL, INT, 0, NO_MAX, FIELD(steps), NULL, "<int>", "maximum NEW tokens, default 256 (the prompt does not count)"},
    {"-i", NULL, TEXT, 0, 0, FIELD(prompt), NULL, "<text>", "prompt"},
    {"-f", NULL, TEXT, 0, 0, FIELD(prompt_file), NULL, "<file>", "prompt (or ppl text) read from a file"},
    {"-z", NULL, TEXT, 0, 0, FIELD(tokenizer), NULL, "<file>",
     "tokenizer; default tokenizer.bin beside the checkpoint, else ./tokenizer.bin"},
    {"-m", NULL, CHOICE, 0, 0, FIELD(mode), MODE_NAMES, "<mode>", "what to do, default generate"},
    {"-y", NULL, TEXT, 0, 0, FIELD(system), NULL, "<text>", "system prompt for chat"},
    {"--chat-template", NULL, CHOICE, 0, 0, FIELD(chat_template), CHAT_TEMPLATE_NAMES + 1, "<name>",
     "chat and --chat: how turns are written, default the tokenizer file's"},
    {"--chat", NULL, SWITCH, 0, 0, FIELD(conversation_input), NULL, "",
     "-f / -i is a conversation, one \"role: text\" per line (role system,\n"
     "user or assistant; \\n for a newline): tokenize prints the ids the chat\n"
     "template renders it to, chat continues it"},
    {"--ctx", "-c", INT, 1, MAX_CTX, FIELD(ctx), NULL, "<int>",
     "context length; default the training context; may exceed it"},
    {"--stride", NULL, INT, 1, MAX_CTX, FIELD(stride), NULL, "<int>", "ppl: text tokens between window starts, "
     "default ctx - 1"},
    {"--save-logits", NULL, TEXT, 0, 0, FIELD(save_logits), NULL, "<file>",
     "ppl: save every scored token's logits (4 bytes x vocab each) as a baseline"},
    {"--kl-base", NULL, TEXT, 0, 0, FIELD(kl_base), NULL, "<file>",
     "ppl: compare with a saved baseline: KL divergence, delta NLL, top-1 agreement"},
    {"--rope-scaling", NULL, CHOICE, 0, 0, FIELD(rope.scaling), SCALING_NAMES, "<method>",
     "RoPE scaling, default the checkpoint's"},
    {"--rope-factor", NULL, REAL, 1, 1e6, FIELD(rope.factor), NULL, "<float>",
     "scale s; needs a scaling method (the checkpoint's, or --rope-scaling)"},
    {"--rope-base", NULL, REAL, EXCLUSIVE(1), 1e12, FIELD(rope.base), NULL, "<float>",
     "RoPE base (theta); default the checkpoint's (legacy: 10000)"},
    {"--rope-orig-ctx", NULL, INT, 1, MAX_CTX, FIELD(rope.orig_ctx), NULL, "<int>",
     "original context L the scaling uses; default the training context"},
    {"--yarn-beta-fast", NULL, REAL, 1e-6, 1e6, FIELD(rope.beta_fast), NULL, "<float>", "default 32"},
    {"--yarn-beta-slow", NULL, REAL, 1e-6, 1e6, FIELD(rope.beta_slow), NULL, "<float>", "default 1"},
    {"--rope-attn-factor", "--yarn-attn-factor", REAL, 1e-6, 1e3, FIELD(rope.attn_factor), NULL, "<float>",
     "YaRN's and LongRoPE's magnitude mscale: Hugging Face's attention_factor,\n"
     "not llama.cpp's multiplier; default the checkpoint's, else from s:\n"
     "YaRN 0.1 ln s + 1, LongRoPE sqrt(1 + ln s / ln L)"},
    {"--llama3-low-freq", NULL, REAL, 1e-6, 1e6, FIELD(rope.low_freq), NULL, "<float>", "default 1"},
    {"--llama3-high-freq", NULL, REAL, 1e-6, 1e6, FIELD(rope.high_freq), NULL, "<float>", "default 4"},
    {"--rope-dynamic", NULL, CHOICE, 0, 0, FIELD(rope.dynamic_exact), DYNAMIC_NAMES, "<kind>",
     "dynamic NTK and LongRoPE: hf (default) = each key keeps the rotation it\n"
     "got when it arrived, as Hugging Face; exact = every key re-rotated for the\n"
     "current length (a pre-RoPE key cache)"},
    {"--self-extend", NULL, PAIR, 1, MAX_CTX, FIELD(rope.se_group), NULL, "<G> <W>",
     "Self-Extend: keys W or more tokens back take grouped positions floor(t/G)\n"
     "(group size G, neighbour window W); a pre-RoPE key cache"},
    {"--lengths", NULL, TEXT, 0, 0, FIELD(lengths), NULL, "<list>",
     "passkey: prompt lengths in tokens, comma-separated; default the training\n"
     "context less the answer's tokens"},
    {"--depths", NULL, TEXT, 0, 0, FIELD(depths), NULL, "<list>",
     "passkey: where the key sits, fractions of the filler; default 0,0.25,0.5,0.75,1"},
    {"--trials", NULL, INT, 1, 100000, FIELD(trials), NULL, "<int>", "passkey: random keys per cell, default 5"},
    {"--key-digits", NULL, INT, 1, 18, FIELD(key_digits), NULL, "<int>", "passkey: digits of a key, default 5"},
    {"--prompts-only", NULL, SWITCH, 0, 0, FIELD(prompts_only), NULL, "",
     "passkey: print the prompts and their token counts; run nothing"},
    {"--sinks", NULL, INT, 0, MAX_CTX - 1, FIELD(rope.sinks), NULL, "<S>",
     "attention sinks (StreamingLLM): a rolling cache of --ctx tokens that keeps\n"
     "the first S and evicts the oldest of the rest, positions by place in the\n"
     "cache; generation goes on past --ctx; 0 = a plain sliding window"},
    {"--window", NULL, INT, 0, MAX_CTX, FIELD(rope.window), NULL, "<W>",
     "sliding-window attention in every layer: a query sees the W most recent\n"
     "positions, itself included; 0 = none; default the checkpoint's"},
    {"--streaming", NULL, SWITCH, 0, 0, FIELD(streaming), NULL, "",
     "ppl: score the text token by token through the rolling cache of --sinks,\n"
     "NLL by absolute position"},
    {"--json", NULL, SWITCH, 0, 0, FIELD(json), NULL, "", "machine-readable output for ppl, rope and passkey"},
    {"--per-position", NULL, SWITCH, 0, 0, FIELD(per_position), NULL, "",
     "ppl --json: add the mean NLL at every in-window position"},
    {"--kv", NULL, CHOICE, 0, 0, FIELD(kv_type), KV_NAMES, "<type>", "KV cache element type, default f32; f16 halves it"},
    {"--q8-activations", NULL, CHOICE, 0, 0, FIELD(q8_activations), ACTIVATION_NAMES, "<type>",
     "q8_0 weights: how prompts and ppl windows multiply them, default f32\n"
     "(float32 activations); int8 quantizes the activations as generation,\n"
     "llama.cpp and llama2.c do: a little less accurate, faster prompts on\n"
     "CPUs with VNNI (slower on others)"},
    {"--ignore-eos", NULL, SWITCH, 0, 0, FIELD(ignore_eos), NULL, "",
     "generate, chat: keep going past stop tokens (EOS, end of turn), for benchmarks"},
    {"--threads", NULL, INT, 1, 1024, FIELD(threads), NULL, "<int>",
     "OpenMP threads; default OMP_NUM_THREADS, else one per core"},
    {"--help", "-h", SWITCH, 0, 0, FIELD(help), NULL, "", "this text"},
};
#undef FIELD
#define N_FLAGS (sizeof FLAGS / sizeof FLAGS[0])

/* "a|b|c" for a NULL-terminated list of names. */
static const char *choice_list(const char *const *names) {
    static char list[200];
    list[0] = '\0';
    for (int i = 0; names[i]; i++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", i ? "|" : "", names[i]);
    }
    return list;
}

/* A flag's accepted range as usage and its error messages print it: "[0, 1]",
 * "(1, 1e+12]", or ">= 0" when only the type limits it; "" for no number. */
static const char *range_text(const Flag *f) {
    static char text[64];
    int integer = f->kind == INT || f->kind == LONG || f->kind == PAIR;
    if (!integer && f->kind != REAL) return "";
    double lo = f->lo < 0 ? -f->lo : f->lo;
    if (f->hi == NO_MAX) snprintf(text, sizeof text, integer ? ">= %.0f" : ">= %g", lo);
    else if (integer) snprintf(text, sizeof text, "[%.0f, %.0f]", lo, f->hi);
    else snprintf(text, sizeof text, "%s%g, %g]", f->lo < 0 ? "(" : "[", lo, f->hi);
    return text;
}

/* The usage text, one entry per row of FLAGS: the flag, its value, what it
 * does, then its choices or its range. */
static void usage(FILE *out) {
    fprintf(out, "Usage: run <checkpoint> [options]\n");
    for (size_t i = 0; i < N_FLAGS; i++) {
        const Flag *f = &FLAGS[i];
        char head[64];
        snprintf(head, sizeof head, "%s%s%s %s", f->alias ? f->alias : "", f->alias ? ", " : "", f->name, f->value);
        if (strlen(head) > 26) fprintf(out, "  %s\n  %-26s ", head, ""); // too wide: help on the next line
        else fprintf(out, "  %-26s ", head);
        for (const char *h = f->help; *h; h++) { // help lines after the first are indented
            fputc(*h, out);
            if (*h == '\n') fprintf(out, "  %-26s ", "");
        }
        if (f->kind == CHOICE) fprintf(out, ": %s", choice_list(f->choices));
        else if (*range_text(f)) fprintf(out, f->hi == NO_MAX ? "  (%s)" : "  %s", range_text(f));
        fputc('\n', out);
    }
    fprintf(out, "Weights: float32 or q8_0, as the checkpoint says (export.py --dtype).\n"
                 "Exit status: 0 ok, 1 bad input or runtime failure, 2 bad usage.\n");
}

/* Strict number parsing: the whole string must be a number in f's range. */
static long parse_long(const char *flag, const char *s, const Flag *f) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE || v < f->lo || (f->hi != NO_MAX && v > f->hi) ||
        (f->kind == INT && v > INT_MAX))
        die(EXIT_USAGE, "%s %s: expected an integer %s%s", flag, s, f->hi == NO_MAX ? "" : "in ", range_text(f));
    return v;
}
static double parse_real(const char *flag, const char *s, const Flag *f) {
    char *end;
    errno = 0;
    double v = strtod(s, &end), lo = f->lo < 0 ? -f->lo : f->lo;
    if (end == s || *end != '\0' || errno == ERANGE || !(f->lo < 0 ? v > lo : v >= lo) || !(v <= f->hi))
        die(EXIT_USAGE, "%s %s: expected a number %s%s", flag, s, f->hi == NO_MAX ? "" : "in ", range_text(f));
    return v;
}

/* Read argv into *o by the FLAGS table; the one argument that is no flag is
 * the checkpoint. Exits with a usage error on anything it cannot read. */
static const char *parse_args(int argc, char **argv, Options *o) {
    const char *checkpoint = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            if (checkpoint) die(EXIT_USAGE, "%s: unexpected argument (the checkpoint is already %s)", a, checkpoint);
            checkpoint = a;
            continue;
        }
        const Flag *f = NULL;
        for (size_t j = 0; j < N_FLAGS && !f; j++)
            if (!strcmp(a, FLAGS[j].name) || (FLAGS[j].alias && !strcmp(a, FLAGS[j].alias))) f = &FLAGS[j];
        if (!f) die(EXIT_USAGE, "%s: unknown option (see --help)", a);
        char *field = (char *)o + f->field;
        if (f->kind == SWITCH) {
            *(int *)field = 1;
            if (f->field == offsetof(Options, help)) { // --help: at once, whatever follows
                usage(stdout);
                exit(0);
            }
            continue;
        }
        int n_values = f->kind == PAIR ? 2 : 1;
        if (i + n_values >= argc)
            die(EXIT_USAGE, "%s: missing value (expected %s; see --help)", a, f->kind == CHOICE ? choice_list(f->choices)
                                                                                            : f->value);
        const char *v = argv[++i];
        switch (f->kind) {
        case INT: *(int *)field = (int)parse_long(a, v, f); break;
        case LONG: *(long *)field = parse_long(a, v, f); break;
        case REAL: *(double *)field = parse_real(a, v, f); break;
        case TEXT: *(const char **)field = v; break;
        case CHOICE: {
            int k = 0;
            while (f->choices[k] && strcmp(v, f->choices[k])) k++;
            if (!f->choices[k]) die(EXIT_USAGE, "%s %s: expected one of %s", a, v, choice_list(f->choices));
            *(int *)field = k;
            break;
        }
        case PAIR: // --self-extend G W: consecutive int fields
            ((int *)field)[0] = (int)parse_long("--self-extend G", v, f);
            ((int *)field)[1] = (int)parse_long("--self-extend W", argv[++i], f);
            break;
        case SWITCH: break;
        }
    }
    return checkpoint;
}

/* The tokenizer beside the checkpoint if there is one, else ./tokenizer.bin. */
static char *default_tokenizer_path(const char *checkpoint) {
    const char *slash = strrchr(checkpoint, '/');
    size_t dir_len = slash ? (size_t)(slash - checkpoint + 1) : 0;
    char *path = malloc(dir_len + sizeof "tokenizer.bin");
    if (!path) die(EXIT_BAD_INPUT, "out of memory");
    memcpy(path, checkpoint, dir_len);
    memcpy(path + dir_len, "tokenizer.bin", sizeof "tokenizer.bin");
    if (access(path, F_OK) != 0) memcpy(path, "tokenizer.bin", sizeof "tokenizer.bin");
    return path;
}

int main(int argc, char **argv) {
    Options o = {.temperature = 1.0, .topp = 0.9, .repeat_penalty = 1.0, .repeat_last_n = 64, .steps = 256,
                 .mode = GENERATE, .kv_type = KV_F32, .seed = -1, .chat_template = -1, .trials = 5, .key_digits = 5,
                 .rope = {.base = NAN, .layout = -1, .rot_dim = -1, .scaling = -1, .factor = NAN, .orig_ctx = -1,
                          .beta_fast = NAN, .beta_slow = NAN, .attn_factor = NAN, .low_freq = NAN,
                          .high_freq = NAN, .dynamic_exact = -1, .sinks = -1, .window = -1}};
    const char *checkpoint = parse_args(argc, argv, &o);
    if (!checkpoint) {
        usage(stderr);
        die(EXIT_USAGE, "missing <checkpoint>");
    }
    if (o.prompt && o.prompt_file) die(EXIT_USAGE, "-i and -f: give the prompt one way, not both");
    if (o.mode == PPL && !o.prompt_file) die(EXIT_USAGE, "-m ppl: needs -f <text file> to score");
    if (o.stride && o.mode != PPL) die(EXIT_USAGE, "--stride: only used by -m ppl");
    if (o.streaming && (o.mode != PPL || o.rope.sinks < 0))
        die(EXIT_USAGE, "--streaming: only used by -m ppl, with a rolling cache (--sinks S)");
    if (o.streaming && o.stride) die(EXIT_USAGE, "--stride: windows are not used with --streaming");
    if (o.rope.sinks >= 0 && o.mode != GENERATE && o.mode != PASSKEY && !(o.mode == PPL && o.streaming))
        die(EXIT_USAGE, "--sinks: only used by -m generate, -m passkey and -m ppl --streaming");
    if ((o.save_logits || o.kl_base) && o.mode != PPL)
        die(EXIT_USAGE, "%s: only used by -m ppl", o.save_logits ? "--save-logits" : "--kl-base");
    if (o.per_position && !(o.mode == PPL && o.json)) die(EXIT_USAGE, "--per-position: only used by -m ppl --json");
    if (o.ignore_eos && o.mode != GENERATE && o.mode != CHAT)
        die(EXIT_USAGE, "--ignore-eos: only used by -m generate and -m chat");
    if (o.conversation_input && o.mode != TOKENIZE && o.mode != CHAT)
        die(EXIT_USAGE, "--chat: only used by -m tokenize and -m chat");
    if (o.conversation_input && !o.prompt && !o.prompt_file)
        die(EXIT_USAGE, "--chat: needs the conversation, with -f or -i");
    if (o.chat_template >= 0 && o.mode != CHAT && !o.conversation_input)
        die(EXIT_USAGE, "--chat-template: only used by -m chat and -m tokenize --chat");
    if (o.system && o.mode != CHAT) die(EXIT_USAGE, "-y: only used by -m chat");
    if ((o.lengths || o.depths || o.prompts_only) && o.mode != PASSKEY)
        die(EXIT_USAGE, "%s: only used by -m passkey",
            o.lengths ? "--lengths" : o.depths ? "--depths" : "--prompts-only");
    if (o.seed < 0) o.seed = o.mode == PASSKEY ? 0 : (long)time(NULL); // passkey's keys repeat unless -s says
    // passkey: the lists first, since the longest prompt sets the default context.
    PasskeyPlan plan = {.trials = o.trials, .digits = o.key_digits, .seed = (uint64_t)o.seed,
                        .filler_path = o.prompt_file, .json = o.json, .prompts_only = o.prompts_only};
    if (o.mode == PASSKEY) {
        if (o.prompt) die(EXIT_USAGE, "-i: -m passkey builds its own prompts (-f gives the filler text)");
        plan.n_depths = o.depths ? parse_list("--depths", o.depths, 0, 0, 1, plan.depths, 64) : 5;
        if (!o.depths)
            for (int k = 0; k < 5; k++) plan.depths[k] = k / 4.0;
        if (o.lengths) {
            plan.n_lengths = parse_list("--lengths", o.lengths, 1, 1, MAX_CTX, plan.lengths, 64);
            double longest = 0;
            for (int k = 0; k < plan.n_lengths; k++) longest = fmax(longest, plan.lengths[k]);
            if (o.ctx == 0) o.ctx = (int)fmin(longest + o.key_digits + 4, MAX_CTX);
        }
    }
#ifdef _OPENMP
    if (o.threads > 0) omp_set_num_threads(o.threads);
#else
    if (o.threads > 1) fprintf(stderr, "--threads %d: this build has no OpenMP; running on one thread\n", o.threads);
#endif

    char err[512];
    Transformer t;
    double t0 = now_seconds();
    int built = build_transformer(&t, checkpoint, &o.rope, o.ctx, o.kv_type, err, sizeof err);
    if (built != 0) die(built == -2 ? EXIT_USAGE : EXIT_BAD_INPUT, "%s", err); // -2: RoPE settings
    const Config *c = &t.config;
    if (o.q8_activations && c->weight_type != WEIGHT_Q8_0)
        die(EXIT_USAGE, "--q8-activations int8: expected q8_0 weights, %s has %s ones", checkpoint,
            WEIGHT_NAMES[c->weight_type]);
    t.state.mm.int8_blocks = o.q8_activations;
    // The model summary goes to stderr once a mode has checked its inputs, so
    // that a rejected input gets a one-line message and nothing else.
    size_t kv_bytes = 2 * (size_t)c->n_layers * t.n_ctx * (c->dim / c->n_heads) * c->n_kv_heads *
                      kv_elem_bytes(t.kv_type);
    int n_threads = 1;
#ifdef _OPENMP
    n_threads = omp_get_max_threads();
#endif
    Tokenizer tok; // every mode but rope reads text
    memset(&tok, 0, sizeof tok);
    const char *tok_path = NULL;
    char *owned_tok_path = NULL;
    if (o.mode != ROPE_MODE) {
        owned_tok_path = o.tokenizer ? NULL : default_tokenizer_path(checkpoint);
        tok_path = o.tokenizer ? o.tokenizer : owned_tok_path;
        if (tokenizer_build(&tok, tok_path, c->vocab_size, c->bos_id, c->eos_id, err, sizeof err) != 0)
            die(EXIT_BAD_INPUT, "%s (give the tokenizer with -z)", err);
    }
    char extras[160] = ""; // what only some families have: biases, a sliding window
    if (c->bias_flags)
        snprintf(extras, sizeof extras, "; biases%s%s%s", c->bias_flags & BIAS_QKV ? " qkv" : "",
                 c->bias_flags & BIAS_O ? " o" : "", c->bias_flags & BIAS_MLP ? " mlp" : "");
    if (t.window > 0)
        snprintf(extras + strlen(extras), sizeof extras - strlen(extras), "; window %d (layers %d..%d)", t.window,
                 t.window_first_layer, c->n_layers - 1);
    char summary[1024];
    int len = snprintf(summary, sizeof summary,
            "%s: dim %d, hidden %d, %d layers, %d heads (%d kv), vocab %d, train_ctx %d%s; rope %s base %g rot %d "
            "scaling %s; weights %s; ctx %d, KV cache %s %.1f MiB; %d threads%s%s; loaded in %.2f s\n",
            checkpoint, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, c->train_ctx,
            extras, LAYOUT_NAMES[t.rope.layout], t.rope.base, t.rope.rot_dim, SCALING_NAMES[t.rope.scaling],
            WEIGHT_NAMES[c->weight_type], t.n_ctx, KV_NAMES[t.kv_type], kv_bytes / 1048576.0, n_threads,
            o.mode != ROPE_MODE ? "; tokenizer " : "", o.mode != ROPE_MODE ? tokenizer_type_name(&tok) : "",
            now_seconds() - t0);
    if (!isnan(o.rope.factor) && isnan(o.rope.attn_factor) && t.rope.attn_factor > 0 &&
        (t.rope.scaling == ROPE_YARN || t.rope.scaling == ROPE_LONGROPE) && len > 0 &&
        (size_t)len < sizeof summary) // a stored magnitude is not derived from the factor
        snprintf(summary + len, sizeof summary - (size_t)len,
                 "note: --rope-factor %g keeps the checkpoint's attention factor %g (not the one derived from s); "
                 "set it with --rope-attn-factor\n", o.rope.factor, t.rope.attn_factor);
    if (o.mode == ROPE_MODE) {
        fputs(summary, stderr);
        rope_mode(&t, o.json);
        free_transformer(&t);
        return 0;
    }

    size_t text_len = o.prompt ? strlen(o.prompt) : 0;
    char *text = NULL;
    if (o.prompt_file) {
        text = read_file(o.prompt_file, "-f", &text_len, err, sizeof err);
        if (!text) die(EXIT_BAD_INPUT, "%s", err);
    }
    const char *input = text ? text : o.prompt ? o.prompt : "";

    // The chat template: --chat-template, else the tokenizer file's; a
    // sentencepiece file of a version that cannot name one (1 or 2) gets
    // Llama 2's, llama2.c's chat.
    ChatTemplate ct = {0};
    if (o.mode == CHAT || o.conversation_input) {
        int kind = o.chat_template >= 0 ? o.chat_template + 1 : tok.chat_template;
        if (kind == CHAT_UNSTATED && tok.type == TOK_SENTENCEPIECE && tok.version < 3) kind = CHAT_LLAMA2;
        if (kind == CHAT_UNSTATED)
            die(EXIT_USAGE, "%s: tokenizer %s names no chat template; choose one with --chat-template %s",
                o.mode == CHAT ? "-m chat" : "--chat", tok_path, choice_list(CHAT_TEMPLATE_NAMES + 1));
        ct = chat_template(&tok, kind, tok_path);
    }

    Sampler sampler;
    if (build_sampler(&sampler, c->vocab_size, (float)o.temperature, (float)o.topp, o.topk, (float)o.minp,
                      (float)o.repeat_penalty, o.repeat_last_n, (uint64_t)o.seed))
        die(EXIT_BAD_INPUT, "out of memory for the sampler");
    switch (o.mode) {
    case GENERATE: generate(&t, &tok, &sampler, input, text_len, o.steps, o.ignore_eos, summary); break;
    case CHAT: {
        // The conversation so far: -y's system prompt, then -i / -f as the
        // first user turn, or (--chat) as a whole conversation.
        Conversation conv = {0};
        if (o.system) conversation_add(&conv, ROLE_SYSTEM, o.system, strlen(o.system));
        if (o.conversation_input) {
            Conversation given = {0};
            parse_conversation(&given, o.prompt_file ? o.prompt_file : "-i", input, text_len);
            if (o.system && given.m[0].role == ROLE_SYSTEM)
                die(EXIT_USAGE, "-y: the conversation in %s has its own system message",
                    o.prompt_file ? o.prompt_file : "-i");
            for (int i = 0; i < given.n; i++)
                conversation_add(&conv, given.m[i].role, given.m[i].text, given.m[i].len);
            conversation_free(&given);
        } else if (text || o.prompt) {
            conversation_add(&conv, ROLE_USER, input, text_len);
        }
        chat(&t, &tok, &ct, &sampler, conv, o.steps, o.ignore_eos, summary);
        break;
    }
    case PPL:
        ppl_mode(&t, &tok, o.prompt_file, input, text_len, o.stride, o.json, o.per_position, o.streaming,
                 o.save_logits, o.kl_base, summary);
        break;
    case PASSKEY:
        if (plan.n_lengths == 0) { // default: prompt and answer fill the training context (or --ctx)
            plan.n_lengths = 1;
            plan.lengths[0] = t.n_ctx - o.key_digits - 4 < c->train_ctx ? t.n_ctx - o.key_digits - 4 : c->train_ctx;
        }
        passkey_mode(&t, &tok, &plan, text, text_len, summary);
        break;
    case TOKENIZE: tokenize_mode(&tok, o.conversation_input ? &ct : NULL, o.prompt_file ? o.prompt_file : "-i", input,
                                 text_len); break;
    }
    free_sampler(&sampler);
    free(text);
    tokenizer_free(&tok);
    free(owned_tok_path);
    free_transformer(&t);
    return 0;
}
#endif
