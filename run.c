/* run.c: inference for Llama-architecture models in one file of plain C.
 *
 * Read it top to bottom; the sections follow the data:
 *   1. errors and small helpers
 *   2. checkpoint: read header -> validate -> expected size == file size -> mmap -> pointers
 *   3. RoPE: inverse frequencies (every scaling method) -> cos/sin table, built once
 *   4. ops: rmsnorm, matmul, softmax, rope, attention, swiglu, residual_add, each one formula
 *   4b. kernels (skip on a first reading): the KV cache as float32 or IEEE half
 *      (--kv f16), the program's one block of SIMD code (AVX2, each kernel with
 *      its portable C version beside it), and matmul over float32 or q8_0 weights
 *   5. forward: a block of tokens through every layer, as a sequence of those ops
 *   6. sampler: repetition penalty -> temperature -> top-k -> top-p -> min-p -> draw
 *   7. modes: generate, chat, tokenize, ppl, rope
 *   8. command line and main (left out when tests #define TESTING and #include this file)
 * model.h describes the checkpoint format and every struct field's shape;
 * tokenizer.c is the only code that knows BPE; export.py is the only writer.
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
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

#include "model.h"

#define PI 3.14159265358979323846 /* M_PI is not in strict C11 */

/* ==========================================================================
 * 1. Errors and small helpers
 * ========================================================================== */

/* Exit codes (DESIGN.md §3): 1 = bad input or runtime failure, 2 = bad usage. */
enum { EXIT_BAD_INPUT = 1, EXIT_USAGE = 2 };

/* Print one line to stderr and exit with `code`. Every message names the file
 * or flag at fault and what was expected; nothing is printed to stdout. */
static void die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void die(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(code);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ==========================================================================
 * 2. Checkpoint: header -> validation -> size check -> mmap -> weight pointers
 * ========================================================================== */

/* Sanity limits on header values: far above any model this program can run on
 * a CPU, low enough that every size below fits in 64 bits without overflow. */
#define MAX_DIM (1 << 16)
#define MAX_HIDDEN (1 << 18)
#define MAX_LAYERS 1024
#define MAX_VOCAB (1 << 22)
#define MAX_SEQ_LEN (1 << 24)

/* One entry of the ordered tensor table: where a tensor's pointer goes and how
 * many values it holds. export.py's TENSOR_TABLE is the other side. */
typedef struct {
    const char *name;
    const float **vec; // a float32 vector (norm weights), or NULL
    Matrix *mat;       // a weight matrix, float32 or q8_0 as the header says, or NULL
    size_t n_values;   // all layers together; neither pointer: skipped (legacy freq_cis)
} TensorSpec;

/* Fill `table` with the checkpoint's tensors in file order; returns the count. */
static int weight_table(const Config *c, Weights *w, TensorSpec table[16]) {
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
        table[n++] = (TensorSpec){"freq_cis_real", NULL, NULL, (size_t)c->seq_len * head_size / 2};
        table[n++] = (TensorSpec){"freq_cis_imag", NULL, NULL, (size_t)c->seq_len * head_size / 2};
    }
    if (!c->shared_classifier) table[n++] = (TensorSpec){"wcls", NULL, &w->wcls, vocab * dim};
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
static size_t place_tensors(const Config *c, Weights *w, const char *map) {
    TensorSpec table[16];
    int n = weight_table(c, w, table);
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
static size_t expected_file_size(const Config *c) {
    Weights unused;
    return place_tensors(c, &unused, NULL);
}

static const char *const SCALING_NAMES[ROPE_N_SCALINGS] = {"none", "linear", "ntk", "dynamic", "yarn", "llama3"};
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
        if (c->version != CKPT_VERSION)
            return fail(err, err_len, "%s: unsupported format version %d (this program reads version %d)", path,
                        c->version, CKPT_VERSION);
        c->dim = read_le_i32(h + 8);
        c->hidden_dim = read_le_i32(h + 12);
        c->n_layers = read_le_i32(h + 16);
        c->n_heads = read_le_i32(h + 20);
        c->n_kv_heads = read_le_i32(h + 24);
        c->vocab_size = read_le_i32(h + 28);
        c->seq_len = read_le_i32(h + 32);
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
        c->weight_type = weight_type;
        c->group_size = group_size;
        if (weight_type < 0 || weight_type >= WEIGHT_N_TYPES)
            return fail(err, err_len, "%s: weight_type %d is not supported (expected 0 = float32 or 1 = q8_0)", path,
                        weight_type);
        if (weight_type == WEIGHT_F32 && group_size != 0)
            return fail(err, err_len, "%s: group_size %d given for float32 weights (expected 0)", path, group_size);
        if (c->shared_classifier != 0 && c->shared_classifier != 1)
            return fail(err, err_len, "%s: shared_classifier=%d (expected 0 or 1)", path, c->shared_classifier);
        for (int i = 104; i < CKPT_HEADER_BYTES; i++)
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
    c->seq_len = read_le_i32(h + 24);
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
        {"seq_len", c->seq_len, MAX_SEQ_LEN},
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
    if (r->scaling < 0 || r->scaling >= ROPE_N_SCALINGS)
        return fail(err, err_len, "%s: rope_scaling=%d (expected 0..%d)", path, r->scaling, ROPE_N_SCALINGS - 1);
    if (!(r->factor >= 1.0 && isfinite(r->factor)))
        return fail(err, err_len, "%s: rope_factor=%g (expected a finite value >= 1)", path, r->factor);
    if (r->orig_ctx < 0 || r->orig_ctx > MAX_SEQ_LEN)
        return fail(err, err_len, "%s: rope_orig_ctx=%d (expected 0..%d)", path, r->orig_ctx, MAX_SEQ_LEN);
    struct { const char *name; double value, max; } params[] = { // 0 = the default
        {"yarn_beta_fast", r->beta_fast, 1e6}, {"yarn_beta_slow", r->beta_slow, 1e6},
        {"yarn_attn_factor", r->attn_factor, 1e3}, {"llama3_low_freq", r->low_freq, 1e6},
        {"llama3_high_freq", r->high_freq, 1e6},
    };
    for (size_t i = 0; i < sizeof params / sizeof params[0]; i++)
        if (!(params[i].value >= 0 && params[i].value <= params[i].max))
            return fail(err, err_len, "%s: %s=%g (expected 0 = default, or a value up to %g)", path, params[i].name,
                        params[i].value, params[i].max);
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
    if (r->orig_ctx == 0) r->orig_ctx = c->seq_len;
    size_t expected = expected_file_size(c);
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

    place_tensors(c, &t->weights, (const char *)map); // point each weight into the mapping
    if (c->shared_classifier) t->weights.wcls = t->weights.token_embedding;
    return 0;
}

/* ==========================================================================
 * 3. RoPE: inverse frequencies -> cos/sin table (rope-spec.md)
 *
 * RoPE (RoFormer, arXiv:2104.09864) rotates pair i of every q and k head by
 * the angle pos * inv_freq[i], with inv_freq[i] = base^(-2i/rot_dim). A
 * scaling method changes only inv_freq and a magnitude factor `attn`, so the
 * table builder below is the same for all of them.
 * ========================================================================== */

/* inv_freq[i] for i < rot_dim/2 and the attention factor for the method in r
 * (rope-spec.md §2). `seq_len_now` is the current sequence length, used only
 * by dynamic NTK. Angles and frequencies are computed in double. */
void rope_frequencies(const RopeConfig *r, int seq_len_now, double *inv_freq, double *attn) {
    int half = r->rot_dim / 2;
    double d = r->rot_dim, b = r->base, s = r->factor, L = r->orig_ctx;
    *attn = 1.0;
    for (int i = 0; i < half; i++) inv_freq[i] = pow(b, -2.0 * i / d); // f_i = b^(-2i/d)
    switch (r->scaling) {
    case ROPE_NONE:
        break;
    case ROPE_LINEAR: // position interpolation: inv'_i = f_i / s
        for (int i = 0; i < half; i++) inv_freq[i] /= s;
        break;
    case ROPE_NTK:     // b' = b * alpha^(d/(d-2)); inv'_i = b'^(-2i/d)
    case ROPE_DYNAMIC: // alpha = s*S/L - (s-1) with S = max(seq_len_now, L)
    {
        double alpha = s;
        if (r->scaling == ROPE_DYNAMIC) {
            double S = seq_len_now > r->orig_ctx ? seq_len_now : L;
            alpha = s * S / L - (s - 1.0);
        }
        if (r->rot_dim > 2) { // with one pair the exponent is 0 for every base
            double b_new = b * pow(alpha, d / (d - 2.0));
            for (int i = 0; i < half; i++) inv_freq[i] = pow(b_new, -2.0 * i / d);
        }
        break;
    }
    case ROPE_YARN: { // NTK-by-parts ramp in the pair index, plus attention temperature
        *attn = r->attn_factor > 0 ? r->attn_factor : s <= 1.0 ? 1.0 : 0.1 * log(s) + 1.0;
        if (s == 1.0) break; // the blend below is f_i mathematically; keep it exact
        double low = floor(d * log(L / (2 * PI * r->beta_fast)) / (2 * log(b)));
        double high = ceil(d * log(L / (2 * PI * r->beta_slow)) / (2 * log(b)));
        if (low < 0) low = 0;
        if (high > d - 1) high = d - 1;
        if (low == high) high += 0.001;
        for (int i = 0; i < half; i++) {
            double ramp = (i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double keep = 1.0 - ramp; // 1 = keep f_i (extrapolate), 0 = f_i / s (interpolate)
            inv_freq[i] = inv_freq[i] / s * (1.0 - keep) + inv_freq[i] * keep;
        }
        break;
    }
    case ROPE_LLAMA3: { // Meta's apply_scaling: by wavelength, ramp linear in L/lambda
        if (s == 1.0) break; // every branch below is f_i when s = 1; keep it exact
        double low_wl = L / r->low_freq, high_wl = L / r->high_freq;
        for (int i = 0; i < half; i++) {
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

/* Fill cos/sin (n_rows, rot_dim/2) with attn * cos(pos * inv_freq[i]) and
 * attn * sin(...) for pos = first_row .. first_row + n_rows - 1. The angle is
 * formed in double: a float angle loses ~1e-4 at position 1000 (rope-spec §5.3).
 * Multiplying both cos and sin by attn scales q and k by attn, so every
 * attention logit q.k scales by attn^2, the convention of HF, ggml and YaRN. */
void rope_fill_table(float *cos_out, float *sin_out, int first_row, int n_rows, const double *inv_freq, int half,
                     double attn) {
    for (int p = 0; p < n_rows; p++) {
        double pos = (double)(first_row + p);
        for (int i = 0; i < half; i++) {
            double angle = pos * inv_freq[i];
            cos_out[(size_t)p * half + i] = (float)(attn * cos(angle));
            sin_out[(size_t)p * half + i] = (float)(attn * sin(angle));
        }
    }
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
    if (r->se_group > 0 && r->scaling == ROPE_DYNAMIC)
        return fail(err, err_len, "--self-extend with --rope-scaling dynamic: choose one (both re-assign how "
                    "cached keys are rotated)");
    return 0;
}

/* Rows [first, first + n) of the table for a sequence of length seq_len. */
static void rope_build_rows(Transformer *t, int seq_len, int first, int n) {
    RunState *s = &t->state;
    int half = t->rope.rot_dim / 2;
    double attn;
    rope_frequencies(&t->rope, seq_len, s->inv_freq, &attn);
    rope_fill_table(s->rope_cos + (size_t)first * half, s->rope_sin + (size_t)first * half, first, n, s->inv_freq,
                    half, attn);
}

/* Build the whole (n_ctx, rot_dim/2) table once, at load.
 * Every method but dynamic NTK has one table for all lengths. Dynamic NTK
 * (rope-spec §2.3) uses base b' = b * (s*S/L - (s-1))^(d/(d-2)) for a sequence
 * of length S > L:
 *   hf:    the token at position p is rotated once, when it arrives, for
 *          length S = p + 1; cached keys keep that rotation. So row p is
 *          simply built for length max(p + 1, L), and the table never changes.
 *   exact: every key is re-rotated for the current length (pre-RoPE cache);
 *          rope_sync_dynamic rebuilds rows 0..pos once pos + 1 > L. */
static void rope_build_table(Transformer *t) {
    int L = t->rope.orig_ctx;
    if (t->rope.scaling != ROPE_DYNAMIC) {
        rope_build_rows(t, t->n_ctx, 0, t->n_ctx);
        return;
    }
    rope_build_rows(t, L, 0, t->n_ctx < L ? t->n_ctx : L);  // S <= L: the unscaled frequencies
    t->table_len = L;
    if (t->rope.dynamic_exact) {
        if (t->n_ctx > L) rope_build_rows(t, L, L, t->n_ctx - L);
        return;
    }
    for (int p = L; p < t->n_ctx; p++) rope_build_rows(t, p + 1, p, 1);
}

/* Exact dynamic NTK: before the token at pos, make rows 0..pos right for the
 * current length S = pos + 1 (or back to the unscaled rows when S <= L). */
static void rope_sync_dynamic(Transformer *t, int pos) {
    if (t->rope.scaling != ROPE_DYNAMIC || !t->rope.dynamic_exact) return;
    int L = t->rope.orig_ctx, S = pos + 1 > L ? pos + 1 : L;
    if (S == t->table_len) return;
    if (S == L) rope_build_rows(t, L, 0, t->n_ctx); // a new sequence started: unscaled rows everywhere
    else rope_build_rows(t, S, 0, pos + 1);
    t->table_len = S;
}

/* ==========================================================================
 * Building and freeing the model: checkpoint + RoPE table + run state
 * ========================================================================== */

/* How many tokens forward_block may take at once. A pre-RoPE key cache
 * rotates the keys for each query position separately, so it goes 1 by 1. */
int block_limit(const Transformer *t) { return t->prerope ? 1 : FORWARD_BLOCK; }

/* Bytes of one KV cache element: float32, or IEEE half with --kv f16. */
static size_t kv_elem_bytes(int kv_type) { return kv_type == KV_F16 ? sizeof(uint16_t) : sizeof(float); }

/* Allocate the activations and KV cache for n_ctx positions and build the
 * RoPE table from t->rope. Returns -1 with a message if memory runs out. */
static int build_run_state(Transformer *t, char *err, size_t err_len) {
    const Config *c = &t->config;
    RunState *s = &t->state;
    size_t dim = c->dim, hidden = c->hidden_dim, head_size = dim / c->n_heads;
    size_t kv_dim = head_size * c->n_kv_heads, n_ctx = t->n_ctx, half = t->rope.rot_dim / 2;
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
        FLOATS(s->att, B * c->n_heads * n_ctx), FLOATS(s->logits, B * c->vocab_size),
        {&s->key_cache, cache_values, kv_elem_bytes(t->kv_type)},
        {&s->value_cache, cache_values, kv_elem_bytes(t->kv_type)},
        FLOATS(s->rope_cos, n_ctx * half), FLOATS(s->rope_sin, n_ctx * half),
        // only with a pre-RoPE key cache: the query at its group position, one layer of rotated keys
        FLOATS(s->q_group, t->prerope ? dim : 0), FLOATS(s->key_rot, t->prerope ? n_ctx * kv_dim : 0),
        // matmul's input transposed (blocks); with q8_0 weights, quantized
        FLOATS(s->mm.x_t, B > 1 ? widest * ((B + 7) / 8 * 8) : 0),
        {(void **)&s->mm.x_q, q8 ? B * widest : 0, sizeof(int8_t)},
        FLOATS(s->mm.x_scale, q8 ? B * widest / c->group_size : 0),
        FLOATS(s->mm.w_rows, q8 && B > 1 ? (size_t)threads * ROW_CHUNK * widest : 0),
#undef FLOATS
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (bufs[i].n == 0) continue;
        *bufs[i].p = calloc(bufs[i].n, bufs[i].size);
        if (!*bufs[i].p)
            return fail(err, err_len, "--ctx %d: cannot allocate %.1f MiB (KV cache and buffers for this context)",
                        t->n_ctx, (double)bufs[i].n * bufs[i].size / (1 << 20));
    }
    s->inv_freq = malloc(half * sizeof(double));
    if (!s->inv_freq) return fail(err, err_len, "out of memory building the RoPE table");
    rope_build_table(t);
    return 0;
}

/* Load a checkpoint, apply the RoPE overrides in *rope_override (fields < 0 or
 * NAN are "not given"), size everything for n_ctx positions (0 = seq_len)
 * with a KV cache of kv_type (KV_F32 | KV_F16).
 * Returns 0; -1 with a message for a bad checkpoint or no memory; -2 for
 * RoPE settings that do not fit together (bad usage: they come from flags).
 * Owns the mapping and the run state; release with free_transformer. */
int build_transformer(Transformer *t, const char *path, const RopeConfig *rope_override, int n_ctx, int kv_type,
                      char *err, size_t err_len) {
    if (load_checkpoint(t, path, err, err_len) != 0) return -1;
    t->kv_type = kv_type;
    if (rope_override) {
        const RopeConfig *o = rope_override;
        RopeConfig *r = &t->rope;
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
    }
    // Defaults for parameters the checkpoint leaves at 0 (legacy files, or no scaling stored).
    if (t->rope.beta_fast == 0) t->rope.beta_fast = 32;
    if (t->rope.beta_slow == 0) t->rope.beta_slow = 1;
    if (t->rope.low_freq == 0) t->rope.low_freq = 1;
    if (t->rope.high_freq == 0) t->rope.high_freq = 4;
    t->n_ctx = n_ctx > 0 ? n_ctx : t->config.seq_len;
    t->prerope = t->rope.se_group > 0 || (t->rope.scaling == ROPE_DYNAMIC && t->rope.dynamic_exact);
    if (validate_rope(&t->rope, t->config.dim / t->config.n_heads, err, err_len) != 0) return -2;
    if (build_run_state(t, err, err_len) != 0) return -1;
    return 0;
}

/* Release everything build_transformer (or a failed call of it) acquired. */
void free_transformer(Transformer *t) {
    RunState *s = &t->state;
    void *bufs[] = {s->x, s->xb, s->xb2, s->hb, s->hb2, s->q, s->k, s->v, s->att, s->logits, s->key_cache,
                    s->value_cache, s->rope_cos, s->rope_sin, s->q_group, s->key_rot, s->mm.x_q, s->mm.x_scale,
                    s->mm.w_rows, s->mm.x_t};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(s->inv_freq);
    if (t->mapping) munmap(t->mapping, t->file_size);
    memset(t, 0, sizeof *t);
}

/* ==========================================================================
 * 4. Ops: each is one formula; output first, inputs next, sizes last.
 *
 * The ops work on a block of B consecutive tokens at once (rows of a
 * (B, ...) array): generation uses B = 1; a prompt or a ppl window goes
 * through in blocks, so every weight row read from memory serves B tokens.
 * A row's result does not depend on the thread count; B = 1 and B > 1 use
 * different matmul kernels, which agree to float rounding.
 * ========================================================================== */

/* Below this many multiply-adds a parallel region costs more than it saves
 * (thread wake-up is microseconds; a 64x64 matmul is ~1 microsecond). */
#define PARALLEL_MIN_WORK (1 << 16)

/* a . b = sum_i a[i] * b[i]          a, b: (n)
 * `omp simd reduction` lets the compiler keep several partial sums in SIMD
 * registers (strict C would force one sum, added in order). */
static inline float dot(const float *a, const float *b, int n) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* out = x * w / sqrt(mean(x^2) + eps), per row        x, out: (B, n); w: (n) */
void rmsnorm(float *out, const float *x, const float *w, int B, int n, float eps) {
    for (int b = 0; b < B; b++) {
        const float *xr = x + (size_t)b * n;
        float *o = out + (size_t)b * n;
        float scale = 1.0f / sqrtf(dot(xr, xr, n) / n + eps);
        for (int i = 0; i < n; i++) o[i] = w[i] * (scale * xr[i]);
    }
}

/* The matmul and the KV cache element access are defined in section 4b
 * (weight types, SIMD tiles, half-precision cache); what they compute:
 *   matmul(out, x, W, B, n, d, q)     out = x @ W^T     x (B, n), W (d, n) -> out (B, d)
 *   kv_dot(q, cache, type, off, n)    q . cache[off .. off+n)
 *   kv_scores(out, q, cache, type, off, stride, m, n)   out[j] = q . (row j of m rows `stride` apart)
 *   kv_axpy(out, a, cache, type, off, n)    out += a * cache[off .. off+n)
 *   kv_axpy4(out, a, cache, type, off, stride, n)   the same for four rows at once
 *   attention_block(...)   attention below for a block, as matrix products; 0 when
 *                          it does not apply (no SIMD, head_size % 8 != 0) */
void matmul(float *out, const float *x, Matrix w, int B, int n, int d, const MatmulScratch *q);
static inline float kv_dot(const float *q, const void *cache, int kv_type, size_t offset, int n);
static void kv_scores(float *out, const float *q, const void *cache, int kv_type, size_t offset, int stride,
                      int n_keys, int n);
static int attention_block(float *out, const float *q, const float *keys, const float *values, float *att,
                           float *q_t, int B, int pos0, int n_heads, int n_kv_heads, int head_size, int n_ctx);
static inline void kv_axpy(float *out, float a, const void *cache, int kv_type, size_t offset, int n);
static inline void kv_axpy4(float *out, const float *a, const void *cache, int kv_type, size_t offset, int stride,
                            int n);

/* e^x for softmax and SiLU, written so that loops calling it vectorize (libm's
 * expf is one call per element: 12% of a prompt's instructions).
 *   e^x = 2^n * e^r,  n = round(x / ln 2),  r = x - n ln 2 in [-ln2/2, ln2/2]
 * e^r by its Taylor series to r^7 (truncation < 1e-8 relative); ln 2 split in
 * two (Cody and Waite) so that n ln 2 is exact enough; 2^n built in the
 * exponent bits. Within 2 ulp of expf (the tests check). Below -87.3 it
 * returns 0 (no subnormals), above 88.3 infinity; NaN stays NaN. */
static inline float exp_fast(float x) {
    float c = x < -87.3f ? -87.3f : x > 88.3f ? 88.3f : x; // n stays in [-126, 127]
    float t = c * 1.44269504f + 12582912.0f;                // 1.5 * 2^23: t's last bits hold n
    float n = t - 12582912.0f;
    float r = (c - n * 0.693359375f) - n * -2.12194440e-4f; // ln 2 = 0.693359375 - 2.12194440e-4
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720, p = p * r + 1.0f / 120, p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6, p = p * r + 0.5f, p = p * r + 1.0f, p = p * r + 1.0f;
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits - 0x4B400000u + 127u) << 23; // 2^n: bits(t) = bits(1.5 * 2^23) + n
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return x < -87.3f ? 0.0f : x > 88.3f ? INFINITY : p * two_n;
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

/* Rotate the first rot_dim dims of each head, row b by table row b:
 *   (x, y) -> (x cos - y sin, x sin + y cos)
 * vec: (B, n_heads, head_size); cos, sin: (B, rot_dim/2), the table rows of
 * the B positions. Pair i is (2i, 2i+1) in the interleaved layout (Meta,
 * llama2.c) and (i, i + rot_dim/2) in the neox layout (Hugging Face after its
 * q/k row permutation). Dims past rot_dim pass through unchanged. */
void rope(float *vec, const float *cos, const float *sin, int B, int n_heads, int head_size, int rot_dim,
          int layout) {
    int half = rot_dim / 2;
    for (int b = 0; b < B; b++) {
        const float *c = cos + (size_t)b * half, *s = sin + (size_t)b * half;
        for (int h = 0; h < n_heads; h++) {
            float *v = vec + ((size_t)b * n_heads + h) * head_size;
            for (int i = 0; i < half; i++) {
                int a = layout == ROPE_INTERLEAVED ? 2 * i : i;
                int z = layout == ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
                float x = v[a], y = v[z];
                v[a] = x * c[i] - y * s[i];
                v[z] = x * s[i] + y * c[i];
            }
        }
    }
}

/* One query head attending over positions 0..pos of its kv head:
 *   att[t] = softmax_t(q . k_t / sqrt(head_size)),  out = sum_t att[t] * v_t
 * With Self-Extend the first n_far keys (the far ones) are scored against
 * q_far, the query rotated at its group position; otherwise n_far = 0.
 * q, q_far, out: (head_size); keys, values: (n_ctx, kv_dim) of type
 * key_type / value_type (KV_F32 | KV_F16) with this head's slice starting at
 * kv_offset; att: (pos + 1) scratch. */
void attention_head(float *out, const float *q, const float *q_far, int n_far, const void *keys, int key_type,
                    const void *values, int value_type, float *att, int pos, int head_size, int kv_dim,
                    int kv_offset) {
    float scale = 1.0f / sqrtf((float)head_size);
    kv_scores(att, q_far, keys, key_type, kv_offset, kv_dim, n_far, head_size); // keys 0..n_far-1
    kv_scores(att + n_far, q, keys, key_type, (size_t)n_far * kv_dim + kv_offset, kv_dim, pos + 1 - n_far,
              head_size);                                                          // keys n_far..pos
    for (int t = 0; t <= pos; t++) att[t] *= scale;
    softmax(att, pos + 1);
    memset(out, 0, (size_t)head_size * sizeof(float));
    int t = 0;
    for (; t + 3 <= pos; t += 4) // four positions per pass over out
        kv_axpy4(out, att + t, values, value_type, (size_t)t * kv_dim + kv_offset, kv_dim, head_size);
    for (; t <= pos; t++) kv_axpy(out, att[t], values, value_type, (size_t)t * kv_dim + kv_offset, head_size);
}

/* Causal multi-head attention for B tokens at positions pos0 .. pos0+B-1:
 * row b attends to cached positions 0..pos0+b. (row, head) pairs are split
 * across threads. Query head h reads kv head h / kv_mul (kv_mul = n_heads /
 * n_kv_heads): the contiguous grouping of GQA/MQA, as in HF's repeat_kv.
 * A block (B > 1) with a float32 cache computes the same as two matrix
 * products per head, Q K^T and P V (attention_block, section 4b).
 * out, q: (B, n_heads, head_size); q_far: (n_heads, head_size), B = 1 only;
 * keys, values: one layer's (n_ctx, kv_dim), of key_type / value_type;
 * att: (B, n_heads, n_ctx) scratch; q_t: (dim, B rounded up to 8) scratch for
 * the block path, or NULL (then every B takes the per-(token, head) path). */
void attention(float *out, const float *q, const float *q_far, int n_far, const void *keys, int key_type,
               const void *values, int value_type, float *att, float *q_t, int B, int pos0, int n_heads,
               int n_kv_heads, int head_size, int n_ctx) {
    if (B > 1 && key_type == KV_F32 && value_type == KV_F32 && q_t &&
        attention_block(out, q, keys, values, att, q_t, B, pos0, n_heads, n_kv_heads, head_size, n_ctx))
        return;
    int kv_mul = n_heads / n_kv_heads, kv_dim = n_kv_heads * head_size;
    int bh;
#pragma omp parallel for private(bh) if ((long)B * n_heads * head_size * (pos0 + B) >= PARALLEL_MIN_WORK)
    for (bh = 0; bh < B * n_heads; bh++) {
        int b = bh / n_heads, h = bh % n_heads;
        size_t row = (size_t)bh * head_size; // (b, h) in (B, n_heads, head_size)
        attention_head(out + row, q + row, n_far ? q_far + (size_t)h * head_size : NULL, n_far, keys, key_type,
                       values, value_type, att + (size_t)bh * n_ctx, pos0 + b, head_size, kv_dim,
                       (h / kv_mul) * head_size);
    }
}

/* Pre-RoPE key cache: rotate each cached raw key t in 0..pos into key_rot at
 * the position it has for this query: its own, or with Self-Extend, when it
 * is W or more tokens back, its group floor(t / G).
 * keys: one layer's (n_ctx, kv_dim) of t->kv_type; key_rot: (n_ctx, kv_dim) float32. */
void rotate_cached_keys(float *key_rot, const void *keys, int pos, const Transformer *t) {
    const Config *c = &t->config;
    int head_size = c->dim / c->n_heads, kv_dim = head_size * c->n_kv_heads, half = t->rope.rot_dim / 2;
    int G = t->rope.se_group, W = t->rope.se_window, i;
#pragma omp parallel for private(i) if ((long)(pos + 1) * kv_dim >= PARALLEL_MIN_WORK)
    for (i = 0; i <= pos; i++) {
        int key_pos = G > 0 && pos - i >= W ? i / G : i;
        float *k = key_rot + (size_t)i * kv_dim;
        memset(k, 0, (size_t)kv_dim * sizeof(float));
        kv_axpy(k, 1.0f, keys, t->kv_type, (size_t)i * kv_dim, kv_dim); // k = cached key as float
        rope(k, t->state.rope_cos + (size_t)key_pos * half, t->state.rope_sin + (size_t)key_pos * half, 1,
             c->n_kv_heads, head_size, t->rope.rot_dim, t->rope.layout);
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
 * 4b. Kernels: how the ops above touch memory. Half-precision KV cache
 * elements, the SIMD dot-product tiles, and matmul over float32 or q8_0
 * weights. Skip on a first reading: each function computes exactly the
 * formula in its first comment line.
 * ========================================================================== */

/* --------------------------------------------------------------------------
 * KV cache elements: float32, or IEEE 754 half precision (--kv f16: half the
 * memory; 11 significant bits, range +-65504). Keys and values are converted
 * on write and read back as float for the arithmetic.
 * -------------------------------------------------------------------------- */

/* Portable conversions (round to nearest even; infinities, NaN, subnormals). */
uint16_t float_to_half_c(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
    if (mag >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0)); // inf, NaN
    if (mag >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);           // rounds past 65504: infinity
    if (mag < 0x38800000u) {                                              // below 2^-14: subnormal or zero
        float a;
        memcpy(&a, &mag, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));   // in units of 2^-24
    }
    uint32_t h = ((mag - 0x38000000u) >> 13), rest = mag & 0x1fffu;      // rebias 127 -> 15
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++;              // round to nearest even
    return (uint16_t)(sign | h);
}
float half_to_float_c(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, x;
    if (e == 0) { // zero or subnormal: m * 2^-24
        float f = (float)m / 16777216.0f;
        return sign ? -f : f;
    }
    x = sign | (e == 31 ? 0x7f800000u | m << 13 : (e + 112) << 23 | m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}
/* The compiler's _Float16 where it has one (one instruction with F16C). */
#ifdef __FLT16_MAX__
static inline float half_to_float(uint16_t h) {
    _Float16 f;
    memcpy(&f, &h, 2);
    return (float)f;
}
static inline uint16_t float_to_half(float x) {
    _Float16 f = (_Float16)x;
    uint16_t h;
    memcpy(&h, &f, 2);
    return h;
}
#else
#define half_to_float half_to_float_c
#define float_to_half float_to_half_c
#endif

/* cache[offset .. offset+n) = src, converted to the cache's type */
void kv_store(void *cache, int kv_type, size_t offset, const float *src, int n) {
    if (kv_type == KV_F32) {
        memcpy((float *)cache + offset, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *h = (uint16_t *)cache + offset;
    for (int i = 0; i < n; i++) h[i] = float_to_half(src[i]);
}

/* q . cache[offset .. offset+n) */
static inline float kv_dot(const float *q, const void *cache, int kv_type, size_t offset, int n) {
    if (kv_type == KV_F32) return dot(q, (const float *)cache + offset, n);
    const uint16_t *h = (const uint16_t *)cache + offset;
    float sum = 0.0f, row[64]; // converted 64 at a time, then the float dot
    for (int i0 = 0; i0 < n; i0 += 64) {
        int m = n - i0 < 64 ? n - i0 : 64;
        for (int i = 0; i < m; i++) row[i] = half_to_float(h[i0 + i]);
        sum += dot(q + i0, row, m);
    }
    return sum;
}

/* out += a * cache[offset .. offset+n) */
static inline void kv_axpy(float *out, float a, const void *cache, int kv_type, size_t offset, int n) {
    if (kv_type == KV_F32) {
        const float *v = (const float *)cache + offset;
        for (int i = 0; i < n; i++) out[i] += a * v[i];
        return;
    }
    const uint16_t *h = (const uint16_t *)cache + offset;
    for (int i = 0; i < n; i++) out[i] += a * half_to_float(h[i]);
}

/* out += a[0] * row t + a[1] * row t+1 + a[2] * row t+2 + a[3] * row t+3 of
 * a cache, rows `stride` apart from offset: one pass over out for four rows. */
static inline void kv_axpy4(float *out, const float *a, const void *cache, int kv_type, size_t offset, int stride,
                            int n) {
    if (kv_type == KV_F32) {
        const float *v0 = (const float *)cache + offset, *v1 = v0 + stride, *v2 = v1 + stride, *v3 = v2 + stride;
        for (int i = 0; i < n; i++) out[i] += a[0] * v0[i] + a[1] * v1[i] + a[2] * v2[i] + a[3] * v3[i];
        return;
    }
    const uint16_t *h0 = (const uint16_t *)cache + offset, *h1 = h0 + stride, *h2 = h1 + stride, *h3 = h2 + stride;
    for (int i = 0; i < n; i++)
        out[i] += a[0] * half_to_float(h0[i]) + a[1] * half_to_float(h1[i]) + a[2] * half_to_float(h2[i]) +
                  a[3] * half_to_float(h3[i]);
}

/* --------------------------------------------------------------------------
 * SIMD kernels: the program's only intrinsics, AVX2 + FMA (x86-64 since 2013).
 * Each kernel has its portable C version right beside it, which computes the
 * same sums in a different order (results agree to float rounding; the tests
 * compare the two). Builds without AVX2 (`make portable`, ARM) get only the C
 * versions; `use_simd = 0` selects them at run time (the tests do).
 * -------------------------------------------------------------------------- */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_SIMD 1
#else
#define HAVE_SIMD 0
#endif
int use_simd = HAVE_SIMD;

/* out[t * ldo + r] = w_r . x_t  for R rows w_r and T rows x_t of n floats.
 * Each weight row, once loaded, serves all T tokens. */
static void dot_tile_f32_c(float *out, int ldo, const float *w, const float *x, int R, int T, int n) {
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) out[(size_t)t * ldo + r] = dot(w + (size_t)r * n, x + (size_t)t * n, n);
}

/* The same as int8 dot products in groups: out[t * ldo + r] =
 *   sum over groups g of ws_r[g] * xs_t[g] * (sum of w_r[i] * x_t[i] over the group)
 * w: R rows of n int8 with scales ws (R, n/gs); x: T rows, scales xs (T, n/gs). */
static void dot_tile_q8_c(float *out, int ldo, const int8_t *w, const float *ws, const int8_t *x, const float *xs,
                          int R, int T, int n, int gs) {
    int groups = n / gs;
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) {
            const int8_t *wr = w + (size_t)r * n, *xt = x + (size_t)t * n;
            float sum = 0.0f;
            for (int g = 0; g < groups; g++) {
                int32_t isum = 0;
#pragma omp simd reduction(+ : isum)
                for (int i = g * gs; i < (g + 1) * gs; i++) isum += (int32_t)wr[i] * xt[i];
                sum += (float)isum * ws[(size_t)r * groups + g] * xs[(size_t)t * groups + g];
            }
            out[(size_t)t * ldo + r] = sum;
        }
}

#if HAVE_SIMD
static float hsum_avx(__m256 v) { // the 8 lanes of v added
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* dot_tile_f32_c for R <= 6 rows and up to 8J tokens (J <= 2, R and J
 * constants), with x given transposed: xt[k * ldx + t] = x_t[k], the tokens
 * side by side. Row r of W starts at w + r * ldw. For each column k, one
 * broadcast of w_r[k] per row meets one load of 8 tokens' x values: 12 sums of
 * 8 tokens each + 2 x vectors + 1 broadcast = 15 of the 16 AVX2 registers, and
 * no horizontal sums. Each output is one FMA chain over k in order, so it is
 * the same whatever the tile, B or the thread count. Only the first T tokens
 * are stored (the rest is padding): out[t * ldo + r], or out[r * ldo + t]
 * when by_rows. Measured against a 3 x 4 dot-product tile (horizontal sums
 * at the end): 1.65x the prefill rate of a 15M-shaped model. */
static inline __attribute__((always_inline)) void cols_tile_f32_avx(float *out, int ldo, int by_rows, const float *w,
                                                                   int ldw, int n, const float *xt, int ldx, int R,
                                                                   int J, int T) {
    __m256 acc[6][2];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) acc[r][j] = _mm256_setzero_ps();
    for (int k = 0; k < n; k++) {
        __m256 x0 = _mm256_loadu_ps(xt + (size_t)k * ldx), x1 = J > 1 ? _mm256_loadu_ps(xt + (size_t)k * ldx + 8) : x0;
        for (int r = 0; r < R; r++) {
            __m256 wr = _mm256_broadcast_ss(w + (size_t)r * ldw + k);
            acc[r][0] = _mm256_fmadd_ps(wr, x0, acc[r][0]);
            if (J > 1) acc[r][1] = _mm256_fmadd_ps(wr, x1, acc[r][1]);
        }
    }
    float tile[6][16]; // stored whole first: a partial store loop over acc makes
                       // GCC write every sum to memory at every k as well
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) _mm256_storeu_ps(&tile[r][8 * j], acc[r][j]);
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) out[by_rows ? (size_t)r * ldo + t : (size_t)t * ldo + r] = tile[r][t];
}

/* out[t * ldo + r] (or out[r * ldo + t] when by_rows) = w_r . x_t for the
 * rows w_r of W (rows, n; row r at w + r * ldw) and the B tokens of xt
 * (n, ldx; B <= ldx, padded to a multiple of 8): tiles of 6 rows x 16 tokens. */
static void cols_f32(float *out, int ldo, int by_rows, const float *w, int ldw, int rows, int n, const float *xt,
                     int ldx, int B) {
    for (int i = 0; i < rows; i += 6)
        for (int b = 0; b < B; b += 16) {
            float *o = out + (by_rows ? (size_t)i * ldo + b : (size_t)b * ldo + i);
            size_t next_row = by_rows ? (size_t)ldo : 1; // o's step from row r to r + 1
            const float *wi = w + (size_t)i * ldw, *x = xt + b;
            int T = B - b < 16 ? B - b : 16;
            if (rows - i >= 6 && T > 8) cols_tile_f32_avx(o, ldo, by_rows, wi, ldw, n, x, ldx, 6, 2, T);
            else if (rows - i >= 6) cols_tile_f32_avx(o, ldo, by_rows, wi, ldw, n, x, ldx, 6, 1, T);
            else
                for (int r = 0; r < rows - i; r++) { // the last rows, one at a time
                    float *orow = o + r * next_row;
                    const float *wr = wi + (size_t)r * ldw;
                    if (T > 8) cols_tile_f32_avx(orow, ldo, by_rows, wr, ldw, n, x, ldx, 1, 2, T);
                    else cols_tile_f32_avx(orow, ldo, by_rows, wr, ldw, n, x, ldx, 1, 1, T);
                }
        }
}

/* dot_tile_f32_c for one row and one token (generation): four partial sums
 * in turn, so that consecutive FMAs do not wait for each other (an FMA takes
 * 4 cycles; one chain would run at a quarter of the FMA rate). Measured: 7-15%
 * faster streaming of a 61 MB matrix than one sum, on 1 and 2 threads. */
static void dot_f32_avx(float *out, const float *w, const float *x, int n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    float sum = hsum_avx(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) sum += w[i] * x[i];
    *out = sum;
}

/* out[j] = q . k_j for the 8 keys k_j = k + j * stride, n floats each (n a
 * multiple of 8): one sum per key, then the 8 sums reduced together by a tree
 * of horizontal adds, which costs less than 8 separate reductions. */
static void dot8_f32_avx(float *out, const float *q, const float *k, int stride, int n) {
    __m256 acc[8];
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
        __m256 qv = _mm256_loadu_ps(q + i);
        for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + (size_t)j * stride + i), acc[j]);
    }
    // hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7]
    __m256 s01 = _mm256_hadd_ps(acc[0], acc[1]), s23 = _mm256_hadd_ps(acc[2], acc[3]);
    __m256 s45 = _mm256_hadd_ps(acc[4], acc[5]), s67 = _mm256_hadd_ps(acc[6], acc[7]);
    __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67); // keys 0-3 | keys 0-3
    __m256 lo = _mm256_permute2f128_ps(s0123, s4567, 0x20), hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
    _mm256_storeu_ps(out, _mm256_add_ps(lo, hi));
}

/* dot_tile_q8_c for R <= 4, T <= 2 and gs a multiple of 32. Per 32 values:
 * _mm256_maddubs_epi16 multiplies unsigned by signed bytes, so the sign of x
 * moves onto w (|x| * sign(x) w = x w); pairs are summed to int16 (at most
 * 2 * 127 * 127, no overflow) and then to int32 by _mm256_madd_epi16. */
static inline __attribute__((always_inline)) void dot_tile_q8_avx(float *out, int ldo, const int8_t *w,
                                                                 const float *ws, const int8_t *x, const float *xs,
                                                                 int R, int T, int n, int gs) {
    int groups = n / gs;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4][2];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++)
        for (int r = 0; r < R; r++)
            for (int t = 0; t < T; t++) {
                __m256i isum = _mm256_setzero_si256();
                for (int i = g * gs; i < (g + 1) * gs; i += 32) {
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(x + (size_t)t * n + i));
                    __m256i wv = _mm256_loadu_si256((const __m256i *)(w + (size_t)r * n + i));
                    __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(wv, xv));
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p16, ones));
                }
                __m256 scale = _mm256_set1_ps(ws[(size_t)r * groups + g] * xs[(size_t)t * groups + g]);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[r][t]);
            }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) out[(size_t)t * ldo + r] = hsum_avx(acc[r][t]);
}

/* The int32 sums of w[i] * x[i] over one group of gs int8 values (gs a
 * multiple of 32), in 8 lanes: as in dot_tile_q8_avx above. */
static inline __m256i group_dot_i8_avx(const int8_t *w, const int8_t *x, int gs) {
    __m256i isum = _mm256_setzero_si256();
    for (int i = 0; i < gs; i += 32) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x + i)), wv = _mm256_loadu_si256((const __m256i *)(w + i));
        __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(wv, xv));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
    }
    return isum;
}

/* dot_tile_q8_c for one row and one token (generation), gs a multiple of 32:
 * two groups per step into two float sums, so that the conversions and FMAs
 * of consecutive groups do not wait for each other. Called with gs = 32 as
 * a constant when it is (the default), so the group loop disappears. */
static inline __attribute__((always_inline)) void dot_q8_avx(float *out, const int8_t *w, const float *ws,
                                                            const int8_t *x, const float *xs, int n, int gs) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int groups = n / gs, g = 0;
    for (; g + 2 <= groups; g += 2) {
        __m256i s0 = group_dot_i8_avx(w + (size_t)g * gs, x + (size_t)g * gs, gs);
        __m256i s1 = group_dot_i8_avx(w + (size_t)(g + 1) * gs, x + (size_t)(g + 1) * gs, gs);
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(ws[g] * xs[g]), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_set1_ps(ws[g + 1] * xs[g + 1]), acc1);
    }
    if (g < groups) {
        __m256i s0 = group_dot_i8_avx(w + (size_t)g * gs, x + (size_t)g * gs, gs);
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(ws[g] * xs[g]), acc0);
    }
    *out = hsum_avx(_mm256_add_ps(acc0, acc1));
}
#endif

/* The tile functions matmul calls. With SIMD, float32 blocks go through
 * cols_f32 (above) and q8_0 int8 blocks through the one tile kernel
 * instantiated with constant sizes, so an output is the same sum in the same
 * order whatever the tile or the thread count. A single token (generation)
 * has its own one-row kernels, which read the rows one after the
 * other: one sequential stream, which the hardware prefetcher follows best
 * (measured: 4 rows side by side streamed 15-25% slower for float32, and 25%
 * slower for q8_0). They sum in another order than the tiles (float rounding;
 * the tests bound it). */
static void dot_tile_f32(float *out, int ldo, const float *w, const float *x, int R, int T, int n) {
#if HAVE_SIMD
    if (use_simd && T == 1) { // blocks of tokens go through cols_f32 (see matmul)
        for (int r = 0; r < R; r++) dot_f32_avx(out + r, w + (size_t)r * n, x, n);
        return;
    }
#endif
    dot_tile_f32_c(out, ldo, w, x, R, T, n);
}
static void dot_tile_q8(float *out, int ldo, const int8_t *w, const float *ws, const int8_t *x, const float *xs, int R,
                        int T, int n, int gs) {
#if HAVE_SIMD
    if (use_simd && gs % 32 == 0) {
        int step = R == 4 && T > 1 ? 4 : 1;
        for (int r = 0; r < R; r += step) {
            float *o = out + r;
            const int8_t *wr = w + (size_t)r * n;
            const float *wsr = ws + (size_t)r * (n / gs);
            if (step == 4) dot_tile_q8_avx(o, ldo, wr, wsr, x, xs, 4, 2, n, gs);
            else if (T == 2) dot_tile_q8_avx(o, ldo, wr, wsr, x, xs, 1, 2, n, gs);
            else if (gs == 32) dot_q8_avx(o, wr, wsr, x, xs, n, 32);
            else dot_q8_avx(o, wr, wsr, x, xs, n, gs);
        }
        return;
    }
#endif
    dot_tile_q8_c(out, ldo, w, ws, x, xs, R, T, n, gs);
}

/* out[j] = q . cache[offset + j * stride ..][0 .. n) for j < n_keys: the
 * attention scores of one query against n_keys cached keys. */
static void kv_scores(float *out, const float *q, const void *cache, int kv_type, size_t offset, int stride,
                      int n_keys, int n) {
    int j = 0;
#if HAVE_SIMD
    if (use_simd && kv_type == KV_F32 && n % 8 == 0)
        for (; j + 8 <= n_keys; j += 8) dot8_f32_avx(out + j, q, (const float *)cache + offset + (size_t)j * stride,
                                                     stride, n);
#endif
    for (; j < n_keys; j++) out[j] = kv_dot(q, cache, kv_type, offset + (size_t)j * stride, n);
}

/* attention (section 4) for a block of B > 1 tokens at positions
 * pos0..pos0+B-1 with a float32 cache, as matrix products per head h:
 *   S = Q_h K_h^T * scale        (B, T), T = pos0 + B keys
 *   P = softmax of each row b over t <= pos0 + b, the masked entries 0
 *   out_h = P V_h                (B, head_size)
 * Both products go through the column kernel: a key, once loaded, serves 16
 * queries, and a row of P 16 output dims; one thread per head. Results equal
 * the one-token path up to float summation order. Returns 0 (nothing done)
 * without SIMD or when head_size is not a multiple of 8.
 * q_t: (n_heads, head_size, B rounded up to 8) scratch, the queries transposed. */
static int attention_block(float *out, const float *q, const float *keys, const float *values, float *att,
                           float *q_t, int B, int pos0, int n_heads, int n_kv_heads, int head_size, int n_ctx) {
#if HAVE_SIMD
    if (!use_simd || head_size % 8 != 0) return 0;
    int kv_mul = n_heads / n_kv_heads, kv_dim = n_kv_heads * head_size, dim = n_heads * head_size;
    int T = pos0 + B, ldq = (B + 7) / 8 * 8, lds = n_heads * n_ctx, h; // lds: S's row stride in att
    float scale = 1.0f / sqrtf((float)head_size);
#pragma omp parallel for private(h) if ((long)B * dim * T >= PARALLEL_MIN_WORK)
    for (h = 0; h < n_heads; h++) {
        float *qt = q_t + (size_t)h * head_size * ldq, *S = att + (size_t)h * n_ctx;
        size_t kv_offset = (size_t)(h / kv_mul) * head_size;
        for (int i = 0; i < head_size; i++) // qt[i][b] = q[b][h][i], padded with zeros
            for (int b = 0; b < ldq; b++) qt[(size_t)i * ldq + b] = b < B ? q[(size_t)b * dim + h * head_size + i] : 0;
        cols_f32(S, lds, 0, keys + kv_offset, kv_dim, T, head_size, qt, ldq, B); // S[b][t] = q_b . k_t
        for (int b = 0; b < B; b++) {
            float *row = S + (size_t)b * lds;
            int n = pos0 + b + 1; // keys row b may see
            for (int t = 0; t < n; t++) row[t] *= scale;
            softmax(row, n);
            for (int t = n; t < T; t++) row[t] = 0.0f;
        }
        cols_f32(out + h * head_size, dim, 1, S, lds, B, T, values + kv_offset, kv_dim, head_size); // P V
    }
    return 1;
#else
    (void)out, (void)q, (void)keys, (void)values, (void)att, (void)q_t, (void)B, (void)pos0, (void)n_heads;
    (void)n_kv_heads, (void)head_size, (void)n_ctx;
    return 0;
#endif
}

/* --------------------------------------------------------------------------
 * matmul and the weight types
 * -------------------------------------------------------------------------- */

/* Rows [first_row, ...) of a stacked matrix, e.g. layer l of wq is
 * matrix_rows(w->wq, l * dim, dim). */
static Matrix matrix_rows(Matrix m, size_t first_row, size_t cols) {
    size_t first = first_row * cols; // values before the row
    if (m.type == WEIGHT_F32) {
        m.values = (const float *)m.values + first;
    } else {
        m.values = (const int8_t *)m.values + first;
        m.scale += first / (size_t)m.group_size;
    }
    return m;
}

/* out = row `row` of m as floats (the embedding lookup)        out: (cols) */
void matrix_row(float *out, Matrix m, int row, int cols) {
    m = matrix_rows(m, (size_t)row, (size_t)cols);
    if (m.type == WEIGHT_F32) {
        memcpy(out, m.values, (size_t)cols * sizeof(float));
        return;
    }
    const int8_t *q = m.values;
    for (int g = 0; g < cols / m.group_size; g++)
        for (int i = g * m.group_size; i < (g + 1) * m.group_size; i++) out[i] = q[i] * m.scale[g];
}

/* q8_0 quantization of B rows of n floats, groups of gs along each row:
 * scale = max|x| / 127, q = round(x / scale)   x: (B, n) -> q (B, n), scale (B, n/gs) */
void quantize_q8(int8_t *q, float *scale, const float *x, int B, int n, int gs) {
    for (size_t g = 0; g < (size_t)B * n / gs; g++) {
        const float *xg = x + g * gs;
        float amax = 0.0f;
        for (int i = 0; i < gs; i++) amax = fabsf(xg[i]) > amax ? fabsf(xg[i]) : amax;
        float s = amax / 127.0f, inv = s > 0.0f ? 1.0f / s : 0.0f;
        for (int i = 0; i < gs; i++) { // round half away from zero; |q| <= 127
            float v = xg[i] * inv;
            q[g * gs + i] = (int8_t)(int)(v + (v >= 0.0f ? 0.5f : -0.5f));
        }
        scale[g] = s;
    }
}

/* Tiles of the dot-product kernels: rows of W x tokens of x that one call
 * computes: 4 x 2 for q8_0 (partial sums in 16 AVX2 registers) and 3 x 4 for
 * the portable float32 one. Each row of a tile, once loaded, serves all of
 * the tile's tokens. */
#define TILE_ROWS_F32 3
#define TILE_TOKENS_F32 4
#define TILE_ROWS_Q8 4
#define TILE_TOKENS_Q8 2

/* Which q8_0 method a call uses: int8 dot products (one token: reading the
 * weights dominates, and they stay int8), or dequantized rows and the float
 * kernel (several tokens: without VNNI the float FMA does 8 multiply-adds per
 * instruction, the int8 kernel about 3, and dequantizing a chunk of rows once
 * costs little next to B tokens' products). The results differ by the
 * rounding of x to int8, within the q8_0 bounds the tests state. */
static int q8_dequantize_rows(const MatmulScratch *q, int B) {
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    return B > 1 && q && q->w_rows && threads <= q->threads;
}

/* xt[k * ldx + b] = x[b * n + k], zero for tokens B..ldx-1:
 * x (B, n) -> xt (n, ldx), the block's tokens side by side. */
static void transpose_block(float *xt, const float *x, int B, int ldx, int n) {
    for (int b0 = 0; b0 < ldx; b0 += 8) // 8 tokens at a time: 8 rows of x read side by side
        for (int k = 0; k < n; k++)
            for (int b = b0; b < b0 + 8; b++) xt[(size_t)k * ldx + b] = b < B ? x[(size_t)b * n + k] : 0.0f;
}

/* out = x @ W^T        x (B, n), W (d, n) -> out (B, d)
 * W is float32 or q8_0 (see q8_dequantize_rows). q: scratch (NULL allowed,
 * for tests: blocks then take the slow portable tiles). Chunks of ROW_CHUNK rows are split
 * across threads; a chunk, once loaded, serves all B tokens. Each output is
 * computed by the same code whatever the thread count. */
void matmul(float *out, const float *x, Matrix w, int B, int n, int d, const MatmulScratch *q) {
    int q8 = w.type == WEIGHT_Q8_0, gs = w.group_size, dequant = q8 && q8_dequantize_rows(q, B);
    int int8 = q8 && !dequant;
    if (int8) quantize_q8(q->x_q, q->x_scale, x, B, n, gs);
    // Several tokens against float rows (float32, or q8_0 dequantized): the
    // column kernel, on x transposed once here.
    int by_columns = HAVE_SIMD && use_simd && B > 1 && !int8 && q && q->x_t, ldx = (B + 7) / 8 * 8;
    if (by_columns) transpose_block(q->x_t, x, B, ldx, n);
    int tile_rows = int8 ? TILE_ROWS_Q8 : TILE_ROWS_F32, tile_tokens = int8 ? TILE_TOKENS_Q8 : TILE_TOKENS_F32;
    int n_chunks = (d + ROW_CHUNK - 1) / ROW_CHUNK, chunk;
#pragma omp parallel for private(chunk) if ((long)B * n * d >= PARALLEL_MIN_WORK)
    for (chunk = 0; chunk < n_chunks; chunk++) {
        int start = chunk * ROW_CHUNK, end = start + ROW_CHUNK < d ? start + ROW_CHUNK : d;
        const float *rows = q8 ? NULL : (const float *)w.values + (size_t)start * n; // (end - start, n) floats
        if (dequant) { // this thread's slice of w_rows = rows start..end of W
            int thread = 0;
#ifdef _OPENMP
            thread = omp_get_thread_num();
#endif
            float *slice = q->w_rows + (size_t)thread * ROW_CHUNK * n;
            for (int i = start; i < end; i++) matrix_row(slice + (size_t)(i - start) * n, w, i, n);
            rows = slice;
        }
#if HAVE_SIMD
        if (by_columns) {
            cols_f32(out + start, d, 0, rows, n, end - start, n, q->x_t, ldx, B);
            continue;
        }
#endif
        for (int b = 0; b < B; b += tile_tokens) {
            int T = B - b < tile_tokens ? B - b : tile_tokens;
            for (int i = start; i < end; i += tile_rows) {
                int R = end - i < tile_rows ? end - i : tile_rows;
                float *o = out + (size_t)b * d + i; // (T, d) from row i on
                if (int8)
                    dot_tile_q8(o, d, (const int8_t *)w.values + (size_t)i * n, w.scale + (size_t)i * (n / gs),
                                q->x_q + (size_t)b * n, q->x_scale + (size_t)b * (n / gs), R, T, n, gs);
                else
                    dot_tile_f32(o, d, rows + (size_t)(i - start) * n, x + (size_t)b * n, R, T, n);
            }
        }
    }
}

/* ==========================================================================
 * 5. Forward pass: B tokens at positions pos0.. -> logits
 * ========================================================================== */

/* out = x @ W_l^T for layer l's rows of a stacked matrix W (n_layers, d, n):
 * matmul with the run state's scratch for a quantized input.
 * x (B, n) -> out (B, d) */
static void project(RunState *s, float *out, const float *x, Matrix w, int l, int B, int n, int d) {
    matmul(out, x, matrix_rows(w, (size_t)l * d, (size_t)n), B, n, d, &s->mm);
}

/* Which logits forward_block computes: the classifier is the largest matrix
 * (vocab_size rows), so a prompt block that only fills the cache skips it. */
enum { LOGITS_NONE, LOGITS_LAST, LOGITS_ALL };

/* Run tokens[0..B) at positions pos0..pos0+B-1 through the model, writing
 * their keys and values into the cache. Returns the logits: (B, vocab_size)
 * for LOGITS_ALL, the last token's (vocab_size) for LOGITS_LAST, NULL for
 * LOGITS_NONE. */
float *forward_block(Transformer *t, const int *tokens, int B, int pos0, int logits) {
    const Config *c = &t->config;
    const Weights *w = &t->weights;
    const RopeConfig *r = &t->rope;
    RunState *s = &t->state;
    if (B < 1 || B > block_limit(t) || pos0 < 0 || pos0 + B > t->n_ctx)
        die(EXIT_BAD_INPUT, "forward: %d tokens at position %d do not fit (block limit %d, context %d)", B, pos0,
            block_limit(t), t->n_ctx);
    for (int b = 0; b < B; b++)
        if (tokens[b] < 0 || tokens[b] >= c->vocab_size)
            die(EXIT_BAD_INPUT, "forward: token %d is outside the vocabulary (0..%d)", tokens[b], c->vocab_size - 1);
    int dim = c->dim, hidden_dim = c->hidden_dim, head_size = dim / c->n_heads;
    int kv_dim = head_size * c->n_kv_heads, half = r->rot_dim / 2;
    rope_sync_dynamic(t, pos0);                               // exact dynamic NTK (B = 1): rows for length pos0+1
    const float *cos_rows = s->rope_cos + (size_t)pos0 * half; // (B, rot_dim/2) table rows of the B positions
    const float *sin_rows = s->rope_sin + (size_t)pos0 * half;
    // Self-Extend (B = 1): keys W or more tokens back are scored against the
    // query rotated at its group position floor(pos/G) + W - floor(W/G).
    int n_far = r->se_group > 0 && pos0 >= r->se_window ? pos0 - r->se_window + 1 : 0;
    size_t group_row = n_far ? (size_t)(pos0 / r->se_group + r->se_window - r->se_window / r->se_group) * half : 0;

    // x = token_embedding[tokens]                                  (B, dim)
    for (int b = 0; b < B; b++) matrix_row(s->x + (size_t)b * dim, w->token_embedding, tokens[b], dim);

    for (int l = 0; l < c->n_layers; l++) {
        size_t ld = (size_t)l * dim;                            // offset of layer l's norm weights
        size_t kv_layer = (size_t)l * t->n_ctx * kv_dim;        // offset of layer l in the caches
        size_t kv_elem = kv_elem_bytes(t->kv_type);
        void *keys = (char *)s->key_cache + kv_layer * kv_elem;     // (n_ctx, kv_dim)
        void *values = (char *)s->value_cache + kv_layer * kv_elem; // (n_ctx, kv_dim)

        // attention block: x += wo @ attention(rope(wq @ h), rope(wk @ h), wv @ h)
        rmsnorm(s->xb, s->x, w->rms_att_weight + ld, B, dim, c->norm_eps); // h (B, dim)
        project(s, s->q, s->xb, w->wq, l, B, dim, dim);                    // q (B, n_heads, head_size)
        project(s, s->k, s->xb, w->wk, l, B, dim, kv_dim);                 // k (B, n_kv_heads, head_size)
        project(s, s->v, s->xb, w->wv, l, B, dim, kv_dim);                 // v (B, n_kv_heads, head_size)
        if (n_far) { // Self-Extend's second query
            memcpy(s->q_group, s->q, (size_t)dim * sizeof(float));
            rope(s->q_group, s->rope_cos + group_row, s->rope_sin + group_row, 1, c->n_heads, head_size, r->rot_dim,
                 r->layout);
        }
        rope(s->q, cos_rows, sin_rows, B, c->n_heads, head_size, r->rot_dim, r->layout);
        if (!t->prerope) rope(s->k, cos_rows, sin_rows, B, c->n_kv_heads, head_size, r->rot_dim, r->layout);
        // KV cache write: the B positions' keys (rotated, or raw for a pre-RoPE cache) and values
        kv_store(keys, t->kv_type, (size_t)pos0 * kv_dim, s->k, B * kv_dim);
        kv_store(values, t->kv_type, (size_t)pos0 * kv_dim, s->v, B * kv_dim);
        const void *scored_keys = keys;
        int key_type = t->kv_type;
        if (t->prerope) { // rotate every cached key for this query
            rotate_cached_keys(s->key_rot, keys, pos0, t);
            scored_keys = s->key_rot, key_type = KV_F32;
        }
        // (B, dim); matmul's transposed-input scratch doubles as the queries' (q_t)
        attention(s->xb, s->q, s->q_group, n_far, scored_keys, key_type, values, t->kv_type, s->att, s->mm.x_t, B,
                  pos0, c->n_heads, c->n_kv_heads, head_size, t->n_ctx);
        project(s, s->xb2, s->xb, w->wo, l, B, dim, dim);                  // (B, dim)
        residual_add(s->x, s->xb2, B * dim);

        // feed-forward block: x += w2 @ (silu(w1 @ h) * (w3 @ h))
        rmsnorm(s->xb, s->x, w->rms_ffn_weight + ld, B, dim, c->norm_eps);
        project(s, s->hb, s->xb, w->w1, l, B, dim, hidden_dim);            // (B, hidden_dim)
        project(s, s->hb2, s->xb, w->w3, l, B, dim, hidden_dim);           // (B, hidden_dim)
        swiglu(s->hb, s->hb2, B * hidden_dim);
        project(s, s->xb2, s->hb, w->w2, l, B, hidden_dim, dim);           // (B, dim)
        residual_add(s->x, s->xb2, B * dim);
    }

    // logits = rmsnorm(x) @ wcls^T          (B, vocab_size), or the last row only
    if (logits == LOGITS_NONE) return NULL;
    int first = logits == LOGITS_ALL ? 0 : B - 1, n_out = B - first;
    float *x_out = s->x + (size_t)first * dim;
    rmsnorm(x_out, x_out, w->rms_final_weight, n_out, dim, c->norm_eps);
    project(s, s->logits, x_out, w->wcls, 0, n_out, dim, c->vocab_size);
    return s->logits;
}

/* One token at pos -> logits (vocab_size): generation's step. */
float *forward(Transformer *t, int token, int pos) { return forward_block(t, &token, 1, pos, LOGITS_LAST); }

/* tokens[0..n) at positions pos0.. into the cache, in blocks; the logits of
 * the last one (vocab_size). A prompt, or a chat turn. */
float *prefill(Transformer *t, const int *tokens, int n, int pos0) {
    float *logits = NULL;
    for (int i = 0; i < n; i += block_limit(t)) {
        int B = n - i < block_limit(t) ? n - i : block_limit(t);
        logits = forward_block(t, tokens + i, B, pos0 + i, i + B == n ? LOGITS_LAST : LOGITS_NONE);
    }
    return logits;
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

/* xorshift64* (Marsaglia 2003; https://en.wikipedia.org/wiki/Xorshift). */
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
 * 7. Modes
 * ========================================================================== */

/* Encode text with BOS into a new array; exits on failure. */
static int *encode_or_die(const Tokenizer *tok, const char *text, size_t len, int add_bos, int *n_out) {
    int *ids = malloc(tokenizer_bound(len) * sizeof(int));
    if (!ids) die(EXIT_BAD_INPUT, "prompt: cannot allocate token buffer for %zu bytes", len);
    int n = tokenizer_encode(tok, text, len, add_bos, 0, ids);
    if (n < 0) die(EXIT_BAD_INPUT, "prompt: out of memory while encoding %zu bytes", len);
    *n_out = n;
    return ids;
}

/* Decode `token` after `prev` and write it to stdout immediately. */
static void emit(const Tokenizer *tok, DecodeState *ds, char *buf, int prev, int token) {
    size_t n = tokenizer_decode(tok, ds, prev, token, buf);
    fwrite(buf, 1, n, stdout);
    fflush(stdout);
}

/* generate: stdout = the prompt's text, then the continuation, then "\n"
 * (llama2.c prints the same). The prompt goes through in blocks; sampling
 * starts at its last token and stops at max_new new tokens, an end token
 * (BOS or EOS; not with ignore_eos, for benchmarks), or a full context.
 * Statistics go to stderr. */
static void generate(Transformer *t, const Tokenizer *tok, Sampler *sampler, const char *prompt, size_t prompt_len,
                     int max_new, int ignore_eos, const char *summary) {
    int n_prompt;
    int *prompt_ids = encode_or_die(tok, prompt, prompt_len, 1, &n_prompt);
    if (n_prompt > t->n_ctx)
        die(EXIT_BAD_INPUT, "prompt: %d tokens (BOS included) do not fit in the context of %d tokens (raise --ctx)",
            n_prompt, t->n_ctx);
    fputs(summary, stderr); // every input check has passed
    int *history = malloc(((size_t)t->n_ctx + 1) * sizeof(int)); // prompt + continuation
    char *buf = malloc(tokenizer_decode_bound(tok));
    if (!history || !buf) die(EXIT_BAD_INPUT, "out of memory");
    memcpy(history, prompt_ids, (size_t)n_prompt * sizeof(int));
    free(prompt_ids);

    // The prompt's text, as the tokenizer reads it back.
    DecodeState ds = {{0}, 0};
    for (int i = 1; i < n_prompt; i++) emit(tok, &ds, buf, history[i - 1], history[i]);
    // Prefill: the prompt through the model in blocks; logits of its last token.
    double start = now_seconds();
    float *logits = prefill(t, history, n_prompt, 0);
    double prefill_end = now_seconds();
    // Decode: sample, print, feed back, one token at a time.
    int pos = n_prompt - 1, n_new = 0;
    while (n_new < max_new) {
        int next = sample(sampler, logits, history, pos + 1);
        n_new++;
        if (!ignore_eos && (next == t->config.bos_id || next == t->config.eos_id)) break;
        emit(tok, &ds, buf, history[pos], next);
        history[++pos] = next;
        if (pos >= t->n_ctx) break; // context full: no room to feed it back
        logits = forward(t, next, pos);
    }
    size_t n = tokenizer_decode_flush(&ds, buf);
    fwrite(buf, 1, n, stdout);
    printf("\n");
    fflush(stdout);
    double end = now_seconds(), prefill = prefill_end - start, decode = end - prefill_end;
    fprintf(stderr, "%d prompt + %d new tokens; prefill %.1f tok/s, generation %.1f tok/s\n", n_prompt, n_new,
            prefill > 0 ? n_prompt / prefill : 0.0, decode > 0 ? (n_new - 1 > 0 ? n_new - 1 : 0) / decode : 0.0);
    free(history);
    free(buf);
}

/* Read one line from stdin (any length); NULL at end of input. */
static char *read_line(const char *label) {
    printf("%s", label);
    fflush(stdout);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) {
        free(line);
        return NULL;
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
    return line;
}

/* Build "[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST]" (the system
 * part only on the first turn and only when given): Llama 2's chat template. */
static char *render_chat_turn(const char *system, const char *user) {
    const char *fmt = system && system[0] ? "[INST] <<SYS>>\n%s\n<</SYS>>\n\n%s [/INST]" : "[INST] %s%s [/INST]";
    const char *a = system && system[0] ? system : "";
    int n = snprintf(NULL, 0, fmt, a, user);
    char *out = malloc((size_t)n + 1);
    if (!out) die(EXIT_BAD_INPUT, "out of memory");
    snprintf(out, (size_t)n + 1, fmt, a, user);
    return out;
}

/* chat: alternate user turns (the first from -i, then stdin lines) and
 * assistant replies, all in one growing context. Each user turn is encoded
 * with BOS; the reply ends at EOS, which is fed back as the turn separator. */
static void chat(Transformer *t, const Tokenizer *tok, Sampler *sampler, const char *first_user,
                 const char *system, int max_new, const char *summary) {
    int *history = malloc(((size_t)t->n_ctx + 1) * sizeof(int));
    char *buf = malloc(tokenizer_decode_bound(tok));
    if (!history || !buf) die(EXIT_BAD_INPUT, "out of memory");
    int pos = 0, first = 1;
    int token = -1; // the token to feed next; -1 = the user's turn
    while (1) {
        char *user = first && first_user ? strdup(first_user) : read_line("User: ");
        if (!user) break;
        char *turn = render_chat_turn(first ? system : NULL, user);
        free(user);
        int n_turn;
        int *ids = encode_or_die(tok, turn, strlen(turn), 1, &n_turn);
        free(turn);
        if (pos + n_turn > t->n_ctx) {
            if (pos == 0) // not even the first turn fits: the same bad input as a long prompt
                die(EXIT_BAD_INPUT, "prompt: the first chat turn has %d tokens, the context holds %d (raise --ctx)",
                    n_turn, t->n_ctx);
            free(ids);
            fprintf(stderr, "chat: the context of %d tokens is full (raise --ctx)\n", t->n_ctx);
            break;
        }
        if (pos == 0) fputs(summary, stderr); // the first turn fits: inputs are good
        printf("Assistant: ");
        fflush(stdout);
        memcpy(history + pos, ids, (size_t)n_turn * sizeof(int)); // feed the user's turn
        float *logits = prefill(t, ids, n_turn, pos);
        pos += n_turn;
        free(ids);
        DecodeState ds = {{0}, 0};
        int prev = history[pos - 1];
        for (int n_new = 0; n_new < max_new; n_new++) { // the assistant's reply
            token = sample(sampler, logits, history, pos);
            if (token == t->config.eos_id || pos >= t->n_ctx) break;
            emit(tok, &ds, buf, prev, token);
            history[pos] = token;
            logits = forward(t, token, pos++);
            prev = token;
        }
        size_t n = tokenizer_decode_flush(&ds, buf);
        fwrite(buf, 1, n, stdout);
        printf("\n");
        fflush(stdout);
        if (pos >= t->n_ctx) {
            fprintf(stderr, "chat: the context of %d tokens is full (raise --ctx)\n", t->n_ctx);
            break;
        }
        history[pos] = t->config.eos_id; // close the reply
        forward_block(t, &t->config.eos_id, 1, pos++, LOGITS_NONE);
        first = 0;
    }
    free(history);
    free(buf);
}

/* tokenize: one line of space-separated ids, BOS first. */
static void tokenize_mode(const Tokenizer *tok, const char *text, size_t len) {
    int n;
    int *ids = encode_or_die(tok, text, len, 1, &n);
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
}

/* -log softmax(logits)[target], in double:  logsumexp(logits) - logits[target] */
double token_nll(const float *logits, int n, int target) {
    double max = logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > max) max = logits[i];
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp(logits[i] - max);
    return max + log(sum) - logits[target];
}

typedef struct {
    int start, end; // in-window positions [start, end) of the predicted token
    long tokens;
    double nll_sum;
} Bucket;

/* Position buckets [0, L/2), [L/2, L), [L, 2L), [2L, 4L), ... cut at n_ctx,
 * with L the training context. Returns the count (at most 64). */
int ppl_buckets(Bucket *b, int train_ctx, int n_ctx) {
    int n = 0, edge = 0, next = train_ctx / 2 > 0 ? train_ctx / 2 : train_ctx;
    while (edge < n_ctx && n < 64) {
        int end = next < n_ctx ? next : n_ctx;
        b[n++] = (Bucket){edge, end, 0, 0.0};
        edge = end;
        next = edge < train_ctx ? train_ctx : (edge > INT_MAX / 2 ? INT_MAX : edge * 2);
    }
    return n;
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

/* ppl: teacher-forced NLL of a text file (DESIGN.md §3). The text is encoded
 * once (no BOS); windows hold BOS + up to n_ctx-1 text tokens; a window starts
 * every `stride` text tokens, and scores only the tokens no earlier window
 * scored, each given its whole in-window prefix. */
static void ppl_mode(Transformer *t, const Tokenizer *tok, const char *path, const char *text, size_t len,
                     int stride, int json, int per_position, const char *summary) {
    int n_ids;
    int *ids = encode_or_die(tok, text, len, 0, &n_ids);
    if (n_ids == 0) die(EXIT_BAD_INPUT, "-f %s: no tokens to score (empty text)", path);
    int window = t->n_ctx - 1; // text tokens per window after BOS
    if (window < 1) die(EXIT_USAGE, "--ctx %d: ppl needs at least 2 (BOS plus one token)", t->n_ctx);
    if (stride <= 0) stride = window;
    if (stride > window) die(EXIT_USAGE, "--stride %d: expected 1..%d (ctx - 1)", stride, window);
    fputs(summary, stderr);
    Bucket buckets[64];
    int n_buckets = ppl_buckets(buckets, t->rope.orig_ctx, t->n_ctx);
    int V = t->config.vocab_size, n_windows = 0, scored_upto = 0, max_block = block_limit(t);
    int *input = malloc((size_t)t->n_ctx * sizeof(int)); // one window: BOS, then its text tokens
    double *pos_sum = calloc((size_t)t->n_ctx, sizeof(double)); // NLL summed per in-window position
    long *pos_count = calloc((size_t)t->n_ctx, sizeof(long));
    if (!input || !pos_sum || !pos_count) die(EXIT_BAD_INPUT, "out of memory");
    long n_scored = 0;
    double nll_sum = 0.0, start_time = now_seconds();
    for (int start = 0;; start += stride) {
        int end = start + window < n_ids ? start + window : n_ids;
        // Position p of the window holds input[p]; its logits predict the
        // text token at position p + 1, i.e. ids[start + p].
        int n_in = end - start;
        input[0] = t->config.bos_id;
        memcpy(input + 1, ids + start, (size_t)(n_in - 1) * sizeof(int));
        for (int p0 = 0; p0 < n_in; p0 += max_block) {
            int B = n_in - p0 < max_block ? n_in - p0 : max_block;
            float *logits = forward_block(t, input + p0, B, p0, LOGITS_ALL); // (B, vocab_size)
            for (int b = 0; b < B; b++) {
                int j = start + p0 + b, p = p0 + b + 1; // scored token and its in-window position
                if (j < scored_upto) continue;           // an earlier window scored it
                double nll = token_nll(logits + (size_t)b * V, V, ids[j]);
                nll_sum += nll;
                n_scored++;
                pos_sum[p] += nll;
                pos_count[p]++;
                for (int k = 0; k < n_buckets; k++)
                    if (p >= buckets[k].start && p < buckets[k].end) {
                        buckets[k].tokens++;
                        buckets[k].nll_sum += nll;
                    }
            }
        }
        n_windows++;
        scored_upto = end;
        if (end == n_ids) break;
    }
    free(input);
    double nll = nll_sum / n_scored, elapsed = now_seconds() - start_time;
    fprintf(stderr, "ppl: %ld tokens scored in %d windows, %.1f s\n", n_scored, n_windows, elapsed);
    if (json) {
        printf("{\"file\": ");
        print_json_string(path);
        printf(", \"tokens\": %ld, \"nll\": %.6f, \"ppl\": %.6f, \"ctx\": %d, \"stride\": %d, \"windows\": %d, "
               "\"train_ctx\": %d, \"scaling\": \"%s\", \"buckets\": [",
               n_scored, nll, exp(nll), t->n_ctx, stride, n_windows, t->rope.orig_ctx,
               SCALING_NAMES[t->rope.scaling]);
        int first = 1;
        for (int b = 0; b < n_buckets; b++) {
            if (!buckets[b].tokens) continue;
            double bn = buckets[b].nll_sum / buckets[b].tokens;
            printf("%s{\"start\": %d, \"end\": %d, \"tokens\": %ld, \"nll\": %.6f, \"ppl\": %.6f}", first ? "" : ", ",
                   buckets[b].start, buckets[b].end, buckets[b].tokens, bn, exp(bn));
            first = 0;
        }
        printf("]");
        if (per_position) { // mean NLL at in-window positions 0..ctx-1 (null: nothing scored there)
            printf(", \"per_position\": [");
            for (int p = 0; p < t->n_ctx; p++) {
                if (pos_count[p]) printf(p ? ", %.5f" : "%.5f", pos_sum[p] / pos_count[p]);
                else printf(p ? ", null" : "null");
            }
            printf("]");
        }
        printf("}\n");
    } else {
        printf("%s: %ld tokens, %d windows of ctx %d (stride %d), scaling %s\n", path, n_scored, n_windows, t->n_ctx,
               stride, SCALING_NAMES[t->rope.scaling]);
        printf("nll %.4f  ppl %.3f\n", nll, exp(nll));
        printf("%-18s %8s %8s %10s\n", "positions", "tokens", "nll", "ppl");
        for (int b = 0; b < n_buckets; b++) {
            if (!buckets[b].tokens) continue;
            double bn = buckets[b].nll_sum / buckets[b].tokens;
            char range[40];
            snprintf(range, sizeof range, "[%d, %d)", buckets[b].start, buckets[b].end);
            printf("%-18s %8ld %8.4f %10.3f\n", range, buckets[b].tokens, bn, exp(bn));
        }
    }
    free(ids);
    free(pos_sum);
    free(pos_count);
}

/* rope: the inverse frequencies used for the full context, per pair i:
 * inv_freq, its wavelength 2*pi/inv_freq in tokens, its ratio to the unscaled
 * frequency, and whether the pair is extrapolated (frequency kept as trained:
 * positions past the training length simply turn it further) or interpolated
 * (frequency lowered, so the longer context maps into angles seen in
 * training); plus the attention factor. Dynamic NTK is shown for length ctx. */
static void rope_mode(const Transformer *t, int json) {
    const RopeConfig *r = &t->rope;
    int half = r->rot_dim / 2;
    double *inv = malloc((size_t)half * sizeof(double)), *plain = malloc((size_t)half * sizeof(double)), attn, unused;
    if (!inv || !plain) die(EXIT_BAD_INPUT, "out of memory");
    rope_frequencies(r, t->n_ctx, inv, &attn);
    RopeConfig unscaled = *r;
    unscaled.scaling = ROPE_NONE;
    rope_frequencies(&unscaled, t->n_ctx, plain, &unused);
    if (json) {
        printf("{\"rot_dim\": %d, \"layout\": \"%s\", \"base\": %.17g, \"scaling\": \"%s\", \"factor\": %.17g, "
               "\"orig_ctx\": %d, \"ctx\": %d, \"attn_factor\": %.17g, \"inv_freq\": [",
               r->rot_dim, LAYOUT_NAMES[r->layout], r->base, SCALING_NAMES[r->scaling], r->factor, r->orig_ctx,
               t->n_ctx, attn);
        for (int i = 0; i < half; i++) printf("%s%.17g", i ? ", " : "", inv[i]);
        printf("], \"wavelength\": [");
        for (int i = 0; i < half; i++) printf("%s%.17g", i ? ", " : "", 2 * PI / inv[i]);
        printf("], \"ratio\": [");
        for (int i = 0; i < half; i++) printf("%s%.17g", i ? ", " : "", inv[i] / plain[i]);
        printf("], \"status\": [");
        for (int i = 0; i < half; i++)
            printf("%s\"%s\"", i ? ", " : "", fabs(inv[i] / plain[i] - 1) < 1e-12 ? "extrapolated" : "interpolated");
        printf("]}\n");
    } else {
        printf("rot_dim %d, layout %s, base %g, scaling %s (factor %g, orig_ctx %d), ctx %d, attn_factor %.10f\n",
               r->rot_dim, LAYOUT_NAMES[r->layout], r->base, SCALING_NAMES[r->scaling], r->factor, r->orig_ctx,
               t->n_ctx, attn);
        printf("%5s %16s %16s %12s  %s\n", "pair", "inv_freq", "wavelength", "/ unscaled", "status");
        for (int i = 0; i < half; i++) {
            double ratio = inv[i] / plain[i];
            printf("%5d %16.10g %16.6g %12.6g  %s\n", i, inv[i], 2 * PI / inv[i], ratio,
                   fabs(ratio - 1) < 1e-12 ? "extrapolated" : "interpolated");
        }
    }
    free(inv);
    free(plain);
}

/* ==========================================================================
 * 8. Command line
 * ========================================================================== */
#ifndef TESTING

static void usage(FILE *out) {
    fprintf(out,
        "Usage: run <checkpoint> [options]\n"
        "  -t <float>   temperature in [0, 100], default 1.0; 0 = greedy argmax\n"
        "  -p <float>   top-p in [0, 1], default 0.9; 1 = off, 0 = only the most likely token\n"
        "  -k, --top-k <int>          keep the k most likely tokens, default 0 = off\n"
        "  --min-p <float>            in [0, 1], default 0 = off\n"
        "  --repeat-penalty <float>   > 0, default 1.0 = off\n"
        "  --repeat-last-n <int>      tokens the penalty looks back over, default 64\n"
        "  -s <int>     seed, default: the time; the same seed gives the same text\n"
        "  -n <int>     maximum NEW tokens, default 256 (the prompt does not count)\n"
        "  -i <text>    prompt;  -f <file>  prompt (or ppl text) read from a file\n"
        "  -z <file>    tokenizer; default tokenizer.bin beside the checkpoint, else ./tokenizer.bin\n"
        "  -m <mode>    generate (default) | chat | ppl | tokenize | rope\n"
        "  -y <text>    system prompt for chat\n"
        "  -c, --ctx <int>            context length; default the checkpoint's seq_len; may exceed it\n"
        "  --stride <int>             ppl: text tokens between window starts, default ctx - 1\n"
        "  --rope-scaling none|linear|ntk|dynamic|yarn|llama3   (default: the checkpoint's)\n"
        "  --rope-factor <float>      scale s >= 1\n"
        "  --rope-base <float>        RoPE base (theta); default the checkpoint's (legacy: 10000)\n"
        "  --rope-orig-ctx <int>      original context the scaling uses; default seq_len\n"
        "  --yarn-beta-fast <float>, --yarn-beta-slow <float>   default 32, 1\n"
        "  --yarn-attn-factor <float> default 0.1 ln s + 1\n"
        "  --llama3-low-freq <float>, --llama3-high-freq <float>   default 1, 4\n"
        "  --rope-dynamic hf|exact    dynamic NTK: hf (default) = each key keeps the rotation it got\n"
        "                             when it arrived, as Hugging Face; exact = every key re-rotated\n"
        "                             for the current length (a full recompute; pre-RoPE key cache)\n"
        "  --self-extend <G> <W>      Self-Extend: keys W or more tokens back use grouped positions\n"
        "                             floor(n/G) (group size G, neighbour window W); pre-RoPE key cache\n"
        "  --json       machine-readable output for ppl and rope\n"
        "  --per-position             ppl --json: add the mean NLL at every in-window position\n"
        "  --kv f32|f16               KV cache element type, default f32; f16 halves its memory\n"
        "  --ignore-eos               generate: keep going past end tokens (BOS/EOS), for benchmarks\n"
        "  --threads <int>            OpenMP threads; default OMP_NUM_THREADS, else one per core\n"
        "  -h, --help   this text\n"
        "Threads: OpenMP; --threads N overrides OMP_NUM_THREADS.\n"
        "Weights: float32 or q8_0, as the checkpoint says (export.py --dtype).\n"
        "Exit status: 0 ok, 1 bad input or runtime failure, 2 bad usage.\n");
}

/* Strict number parsing: the whole string must be a number within [lo, hi]. */
static long parse_long(const char *flag, const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE || v < lo || v > hi)
        die(EXIT_USAGE, "%s %s: expected an integer in [%ld, %ld]", flag, s, lo, hi);
    return v;
}
static double parse_double(const char *flag, const char *s, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno == ERANGE || !(v >= lo && v <= hi))
        die(EXIT_USAGE, "%s %s: expected a number in [%g, %g]", flag, s, lo, hi);
    return v;
}

static int parse_choice(const char *flag, const char *s, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) return i;
    char list[200] = "";
    for (int i = 0; i < n; i++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", i ? "|" : "", names[i]);
    }
    die(EXIT_USAGE, "%s %s: expected one of %s", flag, s, list);
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
    static const char *const MODES[] = {"generate", "chat", "ppl", "tokenize", "rope"};
    static const char *const DYNAMIC_MODES[] = {"hf", "exact"};
    static const char *const KV_NAMES[] = {"f32", "f16"}; // index = KV_F32, KV_F16
    enum { GENERATE, CHAT, PPL, TOKENIZE, ROPE_MODE };
    const char *checkpoint = NULL, *tokenizer_path = NULL, *prompt = NULL, *prompt_file = NULL, *system = NULL;
    float temperature = 1.0f, topp = 0.9f, minp = 0.0f, repeat_penalty = 1.0f;
    int topk = 0, repeat_last_n = 64, steps = 256, ctx = 0, stride = 0, json = 0, per_position = 0, mode = GENERATE;
    int kv_type = KV_F32, threads = 0, ignore_eos = 0;
    uint64_t seed = (uint64_t)time(NULL);
    RopeConfig ov = {.base = NAN, .layout = -1, .rot_dim = -1, .scaling = -1, .factor = NAN, .orig_ctx = -1,
                     .beta_fast = NAN, .beta_slow = NAN, .attn_factor = NAN, .low_freq = NAN, .high_freq = NAN,
                     .dynamic_exact = -1, .se_group = 0, .se_window = 0}; // overrides; NAN / -1 = not given

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--json") == 0) {
            json = 1;
            continue;
        }
        if (strcmp(a, "--per-position") == 0) {
            per_position = 1;
            continue;
        }
        if (strcmp(a, "--ignore-eos") == 0) {
            ignore_eos = 1;
            continue;
        }
        if (a[0] != '-') {
            if (checkpoint) die(EXIT_USAGE, "%s: unexpected argument (the checkpoint is already %s)", a, checkpoint);
            checkpoint = a;
            continue;
        }
        static const char *const VALUED[] = {
            "-t", "-p", "-k", "--top-k", "--min-p", "--repeat-penalty", "--repeat-last-n", "-s", "-n", "-i", "-f",
            "-z", "-m", "-y", "-c", "--ctx", "--stride", "--rope-scaling", "--rope-factor", "--rope-base",
            "--rope-orig-ctx", "--yarn-beta-fast", "--yarn-beta-slow", "--yarn-attn-factor", "--llama3-low-freq",
            "--llama3-high-freq", "--rope-dynamic", "--self-extend", "--kv", "--threads"};
        int known = 0;
        for (size_t f = 0; f < sizeof VALUED / sizeof VALUED[0]; f++) known |= strcmp(a, VALUED[f]) == 0;
        if (!known) die(EXIT_USAGE, "%s: unknown option (see --help)", a);
        if (i + 1 >= argc) die(EXIT_USAGE, "%s: missing value (see --help)", a);
        const char *v = argv[++i];
        if (!strcmp(a, "-t")) temperature = (float)parse_double(a, v, 0.0, 100.0);
        else if (!strcmp(a, "-p")) topp = (float)parse_double(a, v, 0.0, 1.0);
        else if (!strcmp(a, "-k") || !strcmp(a, "--top-k")) topk = (int)parse_long(a, v, 0, INT_MAX);
        else if (!strcmp(a, "--min-p")) minp = (float)parse_double(a, v, 0.0, 1.0);
        else if (!strcmp(a, "--repeat-penalty")) repeat_penalty = (float)parse_double(a, v, 1e-3, 1e3);
        else if (!strcmp(a, "--repeat-last-n")) repeat_last_n = (int)parse_long(a, v, 0, INT_MAX);
        else if (!strcmp(a, "-s")) seed = (uint64_t)parse_long(a, v, 0, LONG_MAX);
        else if (!strcmp(a, "-n")) steps = (int)parse_long(a, v, 0, INT_MAX);
        else if (!strcmp(a, "-i")) prompt = v;
        else if (!strcmp(a, "-f")) prompt_file = v;
        else if (!strcmp(a, "-z")) tokenizer_path = v;
        else if (!strcmp(a, "-m")) mode = parse_choice(a, v, MODES, 5);
        else if (!strcmp(a, "-y")) system = v;
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) ctx = (int)parse_long(a, v, 1, MAX_SEQ_LEN);
        else if (!strcmp(a, "--stride")) stride = (int)parse_long(a, v, 1, MAX_SEQ_LEN);
        else if (!strcmp(a, "--rope-scaling")) ov.scaling = parse_choice(a, v, SCALING_NAMES, ROPE_N_SCALINGS);
        else if (!strcmp(a, "--rope-factor")) ov.factor = parse_double(a, v, 1.0, 1e6);
        else if (!strcmp(a, "--rope-base")) ov.base = parse_double(a, v, 1.0 + 1e-9, 1e12);
        else if (!strcmp(a, "--rope-orig-ctx")) ov.orig_ctx = (int)parse_long(a, v, 1, MAX_SEQ_LEN);
        else if (!strcmp(a, "--yarn-beta-fast")) ov.beta_fast = parse_double(a, v, 1e-6, 1e6);
        else if (!strcmp(a, "--yarn-beta-slow")) ov.beta_slow = parse_double(a, v, 1e-6, 1e6);
        else if (!strcmp(a, "--yarn-attn-factor")) ov.attn_factor = parse_double(a, v, 1e-6, 1e3);
        else if (!strcmp(a, "--llama3-low-freq")) ov.low_freq = parse_double(a, v, 1e-6, 1e6);
        else if (!strcmp(a, "--llama3-high-freq")) ov.high_freq = parse_double(a, v, 1e-6, 1e6);
        else if (!strcmp(a, "--rope-dynamic")) ov.dynamic_exact = parse_choice(a, v, DYNAMIC_MODES, 2);
        else if (!strcmp(a, "--kv")) kv_type = parse_choice(a, v, KV_NAMES, 2);
        else if (!strcmp(a, "--threads")) threads = (int)parse_long(a, v, 1, 1024);
        else if (!strcmp(a, "--self-extend")) { // two values: G W
            if (i + 1 >= argc) die(EXIT_USAGE, "--self-extend: expected two values, G (group size) and W (window)");
            ov.se_group = (int)parse_long("--self-extend G", v, 1, 1 << 20);
            ov.se_window = (int)parse_long("--self-extend W", argv[++i], 1, MAX_SEQ_LEN);
        } else die(EXIT_USAGE, "%s: listed in VALUED but not parsed (a bug in run.c)", a);
    }
    if (!checkpoint) {
        usage(stderr);
        die(EXIT_USAGE, "missing <checkpoint>");
    }
    if (prompt && prompt_file) die(EXIT_USAGE, "-i and -f: give the prompt one way, not both");
    if (mode == PPL && !prompt_file) die(EXIT_USAGE, "-m ppl: needs -f <text file> to score");
    if (stride && mode != PPL) die(EXIT_USAGE, "--stride: only used by -m ppl");
    if (per_position && !(mode == PPL && json)) die(EXIT_USAGE, "--per-position: only used by -m ppl --json");
    if (ignore_eos && mode != GENERATE) die(EXIT_USAGE, "--ignore-eos: only used by -m generate");
#ifdef _OPENMP
    if (threads > 0) omp_set_num_threads(threads);
#else
    if (threads > 1) fprintf(stderr, "--threads %d: this build has no OpenMP; running on one thread\n", threads);
#endif

    char err[512];
    Transformer t;
    double t0 = now_seconds();
    int built = build_transformer(&t, checkpoint, &ov, ctx, kv_type, err, sizeof err);
    if (built != 0) die(built == -2 ? EXIT_USAGE : EXIT_BAD_INPUT, "%s", err); // -2: RoPE settings
    const Config *c = &t.config;
    // The model summary goes to stderr once a mode has checked its inputs, so
    // that a rejected input gets a one-line message and nothing else.
    size_t kv_bytes = 2 * (size_t)c->n_layers * t.n_ctx * (c->dim / c->n_heads) * c->n_kv_heads *
                      kv_elem_bytes(t.kv_type);
    static const char *const WEIGHT_NAMES[] = {"f32", "q8_0"};
    int n_threads = 1;
#ifdef _OPENMP
    n_threads = omp_get_max_threads();
#endif
    char summary[512];
    snprintf(summary, sizeof summary,
            "%s: dim %d, hidden %d, %d layers, %d heads (%d kv), vocab %d, seq_len %d; rope %s base %g rot %d "
            "scaling %s; weights %s; ctx %d, KV cache %s %.1f MiB; %d threads; loaded in %.2f s\n",
            checkpoint, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len,
            LAYOUT_NAMES[t.rope.layout], t.rope.base, t.rope.rot_dim, SCALING_NAMES[t.rope.scaling],
            WEIGHT_NAMES[c->weight_type], t.n_ctx, KV_NAMES[t.kv_type], kv_bytes / 1048576.0, n_threads,
            now_seconds() - t0);
    if (mode == ROPE_MODE) {
        fputs(summary, stderr);
        rope_mode(&t, json);
        free_transformer(&t);
        return 0;
    }

    char *owned_tok_path = tokenizer_path ? NULL : default_tokenizer_path(checkpoint);
    Tokenizer tok;
    if (tokenizer_build(&tok, tokenizer_path ? tokenizer_path : owned_tok_path, c->vocab_size, c->bos_id, c->eos_id,
                        err, sizeof err) != 0)
        die(EXIT_BAD_INPUT, "%s (give the tokenizer with -z)", err);
    free(owned_tok_path);

    size_t text_len = prompt ? strlen(prompt) : 0;
    char *text = NULL;
    if (prompt_file) {
        text = read_file(prompt_file, "-f", &text_len, err, sizeof err);
        if (!text) die(EXIT_BAD_INPUT, "%s", err);
    }
    const char *input = text ? text : prompt ? prompt : "";

    Sampler sampler;
    if (build_sampler(&sampler, c->vocab_size, temperature, topp, topk, minp, repeat_penalty, repeat_last_n, seed))
        die(EXIT_BAD_INPUT, "out of memory for the sampler");
    switch (mode) {
    case GENERATE: generate(&t, &tok, &sampler, input, text_len, steps, ignore_eos, summary); break;
    case CHAT: chat(&t, &tok, &sampler, text || prompt ? input : NULL, system, steps, summary); break;
    case PPL: ppl_mode(&t, &tok, prompt_file, input, text_len, stride, json, per_position, summary); break;
    case TOKENIZE: tokenize_mode(&tok, input, text_len); break;
    }
    free_sampler(&sampler);
    free(text);
    tokenizer_free(&tok);
    free_transformer(&t);
    return 0;
}
#endif
