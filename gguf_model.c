/* gguf_model.c: a GGUF file of the Llama architecture as run's Transformer,
 * read directly (run.c's load_checkpoint calls gguf_load_checkpoint for a
 * file that starts with "GGUF"; gguf.c reads the format).
 *
 * The metadata maps to Config and RopeConfig exactly as export.py's GGUF
 * reader maps it (convert/gguf.py, convert/gguf_rope.py), float fields
 * rounded to float32 as export.py's header stores them, so that the model
 * is the one `export.py OUT --gguf FILE` writes. q/k rows stay as llama.cpp's
 * converter leaves them: Meta's interleaved pairs (docs/rope.md).
 *
 * Tensors: run's Weights stack the layers of each matrix in one block, and
 * GGUF stores each layer as a tensor of its own, so the per-layer tensors are
 * copied once, at load, into stacked buffers the Transformer owns
 * (t->converted, one allocation): F32 as it is, F16 and BF16 widened to
 * float32 exactly, Q8_0 into our q8_0 (int8 values, a float32 scale per 32),
 * dequantized and quantized again with export.py's arithmetic, so that the
 * logits are bit-identical to its `--dtype q8_0` conversion. token_embd,
 * output and output_norm in F32 are read from the mapping as they are. Other
 * tensor types (Q4_0, Q4_1, Q4_K, ...) are refused by name. docs/gguf.md
 * says what it costs.
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gguf.h"

typedef struct {
    const GgufFile *g;
    const char *path;
    char *err;
    size_t err_len;
} Reader;

/* ---- Metadata -> Config, RopeConfig ---------------------------------------- */

/* llama.* keys of features run cannot reproduce: refused unless they hold the value that means "off"
 * (GGUF_LLAMA_REJECTED in convert/gguf.py). */
static const struct { const char *key, *what; double off; } REJECTED[] = {
    {"llama.attention.sliding_window", "sliding-window attention", 0},
    {"llama.attention.scale", "a custom attention scale", 0},
    {"llama.logit_scale", "scaled logits", 1},
    {"llama.embedding_scale", "a scaled embedding", 1},
    {"llama.residual_scale", "scaled residuals", 1},
    {"llama.attention.clamp_kqv", "clamped q/k/v", 0},
    {"llama.attention.max_alibi_bias", "ALiBi", 0},
    {"llama.rope.scaling.alpha", "NTK-alpha RoPE scaling", 1},
};

/* A positive int32 value; 0 absent (then *out = def), -1 bad or required and absent. */
static int count_key(const Reader *rd, const char *key, int required, int def, int *out) {
    int64_t v;
    int got = gguf_get_int(rd->g, key, &v, rd->err, rd->err_len);
    if (got < 0) return -1;
    if (!got) {
        if (required) return fail(rd->err, rd->err_len, "%s: missing required key %s", rd->path, key);
        *out = def;
        return 0;
    }
    if (v <= 0 || v > INT32_MAX)
        return fail(rd->err, rd->err_len, "%s: %s=%" PRId64 " is not a positive integer", rd->path, key, v);
    *out = (int)v;
    return 1;
}

/* general.architecture "llama", one file (no split), none of REJECTED, no experts. */
static int check_architecture(const Reader *rd) {
    GgufStr arch;
    char shown[64];
    int got = gguf_get_str(rd->g, "general.architecture", &arch, rd->err, rd->err_len);
    if (got < 0) return -1;
    if (!got) return fail(rd->err, rd->err_len, "%s: missing required key general.architecture", rd->path);
    if (!gguf_str_is(arch, "llama"))
        return fail(rd->err, rd->err_len, "%s: general.architecture is \"%s\": run reads only \"llama\" GGUF files "
                    "(Llama, Mistral, SmolLM2) directly", rd->path, gguf_show(arch, shown, sizeof shown));
    int64_t split;
    got = gguf_get_int(rd->g, "split.count", &split, rd->err, rd->err_len);
    if (got < 0) return -1;
    if (got && split > 1)
        return fail(rd->err, rd->err_len, "%s: one part of a split GGUF (split.count %" PRId64 "); merge the parts "
                    "first (llama-gguf-split --merge)", rd->path, split);
    for (size_t i = 0; i < sizeof REJECTED / sizeof REJECTED[0]; i++) {
        double v;
        got = gguf_get_float(rd->g, REJECTED[i].key, &v, rd->err, rd->err_len);
        if (got < 0) return -1;
        if (got && v != REJECTED[i].off)
            return fail(rd->err, rd->err_len, "%s: %s=%g (%s) is not supported", rd->path, REJECTED[i].key, v,
                        REJECTED[i].what);
    }
    int64_t experts;
    got = gguf_get_int(rd->g, "llama.expert_count", &experts, rd->err, rd->err_len);
    if (got < 0) return -1;
    if (got && experts > 0)
        return fail(rd->err, rd->err_len, "%s: llama.expert_count=%" PRId64 ": mixture of experts is not supported",
                    rd->path, experts);
    return 0;
}

/* Sizes, norm epsilon and RoPE base and dimensions (_gguf_sizes in convert/gguf.py). */
static int read_sizes(const Reader *rd, Config *c, RopeConfig *r) {
    const GgufKV *ff = gguf_find_key(rd->g, "llama.feed_forward_length");
    if (ff && ff->type == GGUF_ARRAY)
        return fail(rd->err, rd->err_len, "%s: llama.feed_forward_length is an array (a width per layer); run has "
                    "one FFN width", rd->path);
    if (count_key(rd, "llama.embedding_length", 1, 0, &c->dim) < 0 ||
        count_key(rd, "llama.block_count", 1, 0, &c->n_layers) < 0 ||
        count_key(rd, "llama.feed_forward_length", 1, 0, &c->hidden_dim) < 0 ||
        count_key(rd, "llama.attention.head_count", 1, 0, &c->n_heads) < 0 ||
        count_key(rd, "llama.attention.head_count_kv", 0, c->n_heads, &c->n_kv_heads) < 0 ||
        count_key(rd, "llama.context_length", 1, 0, &c->train_ctx) < 0)
        return -1;
    if (c->dim % c->n_heads || c->n_heads % c->n_kv_heads)
        return fail(rd->err, rd->err_len, "%s: llama.attention.head_count=%d, head_count_kv=%d do not divide "
                    "embedding_length=%d and head_count", rd->path, c->n_heads, c->n_kv_heads, c->dim);
    int hs = c->dim / c->n_heads, v = 0;
    const char *lengths[] = {"llama.attention.key_length", "llama.attention.value_length"};
    for (int i = 0; i < 2; i++) {
        int got = count_key(rd, lengths[i], 0, hs, &v);
        if (got < 0) return -1;
        if (got && v != hs)
            return fail(rd->err, rd->err_len, "%s: %s=%d differs from embedding_length / head_count = %d (not "
                        "supported: run derives the head size)", rd->path, lengths[i], v, hs);
    }
    double eps, theta = 10000.0; // llama.cpp's default base
    int got = gguf_get_float(rd->g, "llama.attention.layer_norm_rms_epsilon", &eps, rd->err, rd->err_len);
    if (got < 0) return -1;
    if (!got)
        return fail(rd->err, rd->err_len, "%s: missing required key llama.attention.layer_norm_rms_epsilon", rd->path);
    if (gguf_get_float(rd->g, "llama.rope.freq_base", &theta, rd->err, rd->err_len) < 0) return -1;
    if (count_key(rd, "llama.rope.dimension_count", 0, hs, &r->rot_dim) < 0) return -1;
    c->norm_eps = (float)eps;
    r->base = (float)theta; // the header stores float32
    r->layout = ROPE_INTERLEAVED;
    return 0;
}

/* A token id key: -1 when absent or negative; an error past the vocabulary. */
static int token_id(const Reader *rd, const char *key, int vocab, int *id) {
    int64_t v;
    int got = gguf_get_int(rd->g, key, &v, rd->err, rd->err_len);
    if (got < 0) return -1;
    *id = !got || v < 0 ? -1 : (int)(v < INT32_MAX ? v : INT32_MAX);
    if (*id >= vocab)
        return fail(rd->err, rd->err_len, "%s: %s=%" PRId64 " is outside the vocabulary (%d tokens)", rd->path, key, v,
                    vocab);
    return 0;
}

/* vocab_size from token_embd's rows (checked against llama.vocab_size and
 * tokenizer.ggml.tokens), bos_id and eos_id as export.py chooses them
 * (_gguf_vocab in convert/gguf.py). */
static int read_vocab(const Reader *rd, Config *c) {
    const GgufTensor *emb = gguf_find_tensor(rd->g, "token_embd.weight");
    if (!emb) return fail(rd->err, rd->err_len, "%s: missing tensor token_embd.weight", rd->path);
    if (emb->n_dims != 2 || emb->dims[1] > INT32_MAX)
        return fail(rd->err, rd->err_len, "%s: tensor token_embd.weight has %" PRIu32 " dimensions, expected "
                    "[vocab_size, %d]", rd->path, emb->n_dims, c->dim);
    c->vocab_size = (int)emb->dims[1];
    int v = 0, got = count_key(rd, "llama.vocab_size", 0, 0, &v);
    if (got < 0) return -1;
    if (got && v != c->vocab_size)
        return fail(rd->err, rd->err_len, "%s: llama.vocab_size=%d but token_embd.weight has %d rows", rd->path, v,
                    c->vocab_size);
    const GgufKV *tokens = gguf_find_key(rd->g, "tokenizer.ggml.tokens");
    if (tokens && (tokens->type != GGUF_ARRAY || tokens->count != (uint64_t)c->vocab_size))
        return fail(rd->err, rd->err_len, "%s: tokenizer.ggml.tokens has %" PRIu64 " entries but token_embd.weight "
                    "has %d rows", rd->path, tokens->type == GGUF_ARRAY ? tokens->count : 0, c->vocab_size);
    int bos, eos, eot;
    if (token_id(rd, "tokenizer.ggml.bos_token_id", c->vocab_size, &bos) ||
        token_id(rd, "tokenizer.ggml.eos_token_id", c->vocab_size, &eos) ||
        token_id(rd, "tokenizer.ggml.eot_token_id", c->vocab_size, &eot))
        return -1;
    if (eos < 0) eos = eot;
    if (eos < 0) // export.py then looks for an end-of-turn piece among the special tokens
        return fail(rd->err, rd->err_len, "%s: no tokenizer.ggml.eos_token_id or eot_token_id: run does not read "
                    "this GGUF directly yet; convert it with: python3 export.py model.bin --gguf %s (also writes its "
                    "tokenizer.bin beside model.bin)", rd->path, rd->path);
    c->bos_id = bos < 0 ? eos : bos;
    c->eos_id = eos;
    return 0;
}

/* One of the float scaling keys, rounded to float32 as the header stores it. */
static int scaling_float(const Reader *rd, const char *key, double def, double *out) {
    *out = def;
    return gguf_get_float(rd->g, key, out, rd->err, rd->err_len);
}

/* YaRN's keys (_gguf_rope_scaling in convert/gguf_rope.py). */
static int read_yarn(const Reader *rd, RopeConfig *r, double factor) {
    int64_t orig;
    int got = gguf_get_int(rd->g, "llama.rope.scaling.original_context_length", &orig, rd->err, rd->err_len);
    if (got < 0) return -1;
    if (got && (orig < 0 || orig > INT32_MAX))
        return fail(rd->err, rd->err_len, "%s: llama.rope.scaling.original_context_length=%" PRId64 " is out of range",
                    rd->path, orig);
    r->orig_ctx = got ? (int)orig : 0; // 0: the training context
    double fast, slow, logm, ext, a1, a2;
    if (scaling_float(rd, "llama.rope.scaling.yarn_beta_fast", 32.0, &fast) < 0 ||
        scaling_float(rd, "llama.rope.scaling.yarn_beta_slow", 1.0, &slow) < 0 ||
        scaling_float(rd, "llama.rope.scaling.yarn_log_multiplier", 0.0, &logm) < 0 ||
        scaling_float(rd, "llama.rope.scaling.yarn_ext_factor", -1.0, &ext) < 0 ||
        scaling_float(rd, "llama.rope.scaling.attn_factor", 1.0, &a1) < 0 ||
        scaling_float(rd, "llama.rope.scaling.yarn_attn_factor", 1.0, &a2) < 0)
        return -1;
    if (logm != 0)
        return fail(rd->err, rd->err_len, "%s: llama.rope.scaling.yarn_log_multiplier (DeepSeek's YaRN magnitude) is "
                    "not supported", rd->path);
    if (ext != -1.0 && ext != 1.0)
        return fail(rd->err, rd->err_len, "%s: llama.rope.scaling.yarn_ext_factor=%g (partial YaRN extrapolation) is "
                    "not supported", rd->path, ext);
    r->beta_fast = (float)fast;
    r->beta_slow = (float)slow;
    double mult = a1 * a2; // llama.cpp multiplies YaRN's own 0.1 ln s + 1 by these; 0 = derive it
    r->attn_factor = mult == 1.0 ? 0.0 : (float)(mult * (0.1 * log(factor) + 1.0));
    return 0;
}

/* rope.scaling.type none / linear / yarn, or the older rope.scale_linear.
 * A rope_freqs tensor (Llama 3) is handled by read_rope_freqs. */
static int read_scaling(const Reader *rd, RopeConfig *r) {
    GgufStr kind = {(const unsigned char *)"", 0};
    double factor = 1.0, linear = 1.0;
    int has_kind = gguf_get_str(rd->g, "llama.rope.scaling.type", &kind, rd->err, rd->err_len);
    int has_factor = scaling_float(rd, "llama.rope.scaling.factor", 1.0, &factor);
    int has_linear = scaling_float(rd, "llama.rope.scale_linear", 1.0, &linear);
    if (has_kind < 0 || has_factor < 0 || has_linear < 0) return -1;
    int linear_kind = has_kind ? gguf_str_is(kind, "linear") : has_linear && linear != 1.0;
    if (!has_kind && linear_kind) factor = linear, has_factor = 1;
    int yarn = has_kind && gguf_str_is(kind, "yarn");
    char shown[64];
    if (has_kind && !linear_kind && !yarn && !gguf_str_is(kind, "none"))
        return fail(rd->err, rd->err_len, "%s: llama.rope.scaling.type \"%s\" is not supported (none, linear, yarn)",
                    rd->path, gguf_show(kind, shown, sizeof shown));
    r->scaling = ROPE_NONE;
    r->factor = 1.0;
    r->beta_fast = 32.0;
    r->beta_slow = 1.0;
    r->low_freq = 1.0;
    r->high_freq = 4.0;
    if (!linear_kind && !yarn) return 0;
    if (!has_factor)
        return fail(rd->err, rd->err_len, "%s: llama.rope.scaling.type is %s but there is no llama.rope.scaling.factor",
                    rd->path, yarn ? "yarn" : "linear");
    if (!(factor >= 1.0))
        return fail(rd->err, rd->err_len, "%s: llama.rope.scaling.factor=%g < 1 is not supported", rd->path, factor);
    r->scaling = yarn ? ROPE_YARN : ROPE_LINEAR;
    r->factor = (float)factor;
    return yarn ? read_yarn(rd, r, factor) : 0;
}

/* ---- Llama 3's rope_freqs ---------------------------------------------------
 * llama.cpp stores Llama 3's scaling as a tensor rope_freqs: per pair i the
 * divisor of its frequency. export.py recovers the scaling's parameters from
 * it (fit_llama3_rope_freqs in convert/gguf_rope.py, which explains the fit);
 * this is the same fit, so that the model is the one export.py writes. */

#define FREQS_TOL 1e-5
#define MAX_PAIRS 4096 /* rot_dim / 2 this fit handles (real heads: 32..128 pairs) */

/* Llama 3's divisor of pair i's frequency for these parameters (llama3_rope_factors). */
static double llama3_divisor(double base, int rot, int i, double factor, double low, double high, double L) {
    double inv = pow(base, -(double)(2 * i) / rot), wavelen = 2 * PI / inv;
    if (wavelen < L / high) return 1.0;
    if (wavelen > L / low) return factor;
    double a = (L / wavelen - low) / (high - low);
    return 1.0 / ((1 - a) / factor + a);
}

/* The largest relative difference between the rule's divisors and r. */
static double llama3_misfit(const double *r, int n, double base, double factor, double low, double high, double L) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs(llama3_divisor(base, 2 * n, i, factor, low, high, L) - r[i]) / r[i];
        worst = e > worst ? e : worst;
    }
    return worst;
}

/* v rounded to a multiple of step when that is within 1e-4 relative (_snap). */
static double snap(double v, double step) {
    double q = nearbyint(v / step) * step; // Python's round: half to even, as nearbyint by default
    return fabs(q - v) <= 1e-4 * (fabs(v) > 1.0 ? fabs(v) : 1.0) ? q : v;
}

/* low, high and L from the pairs between the plateaus (a = A x + B by least squares). */
static void fit_smooth(const double *r, int n, double base, double factor, int n_smooth, double *L, double *low,
                       double *high) {
    double x[MAX_PAIRS], a[MAX_PAIRS], mx = 0, ma = 0, sxx = 0, sxa = 0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (!(fabs(r[i] - 1) > FREQS_TOL && fabs(r[i] - factor) > FREQS_TOL * factor)) continue;
        x[m] = pow(base, -(double)(2 * i) / (2 * n)) / (2 * PI);
        a[m] = (1 / r[i] - 1 / factor) / (1 - 1 / factor);
        mx += x[m], ma += a[m], m++;
    }
    if (n_smooth == 1) { // one pair: Meta's L (unless given) and low 1 fix high
        *L = *L > 0 ? *L : 8192.0, *low = 1.0;
        if (a[0] > 0) *high = *low + (*L * x[0] - *low) / a[0];
        return;
    }
    mx /= m, ma /= m;
    for (int k = 0; k < m; k++) sxx += (x[k] - mx) * (x[k] - mx), sxa += (x[k] - mx) * (a[k] - ma);
    double A = sxa / sxx, B = ma - A * mx, width;
    if (*L <= 0 && B < 0) {
        *low = 1.0, width = -1.0 / B;
        *L = nearbyint(A * width);
    } else if (*L > 0 && A > 0) {
        width = *L / A;
        *low = -B * width;
    } else {
        return;
    }
    *high = *low + width;
}

/* A rope_freqs tensor -> llama3 scaling in r (all ones: none). */
static int read_rope_freqs(const Reader *rd, RopeConfig *r) {
    const GgufTensor *t = gguf_find_tensor(rd->g, "rope_freqs.weight");
    const char *where = "tensor rope_freqs.weight";
    if (!t) return 0;
    int n = r->rot_dim / 2;
    if (t->type != GGML_F32 || t->n_values != (uint64_t)n || n > MAX_PAIRS)
        return fail(rd->err, rd->err_len, "%s: %s: expected %d F32 values (rot_dim / 2, at most %d)", rd->path, where,
                    n, MAX_PAIRS);
    double rv[MAX_PAIRS], factor = 0, base = 10000.0, L = 0, low = -1, high = -1;
    int ones = 1, n_smooth = 0;
    for (int i = 0; i < n; i++) {
        rv[i] = read_le_f32(t->data + 4 * i);
        if (!(rv[i] > 0 && isfinite(rv[i])))
            return fail(rd->err, rd->err_len, "%s: %s has values that are not positive numbers", rd->path, where);
        ones &= fabs(rv[i] - 1) <= FREQS_TOL;
        factor = rv[i] > factor ? rv[i] : factor;
    }
    if (ones) return 0;
    if (r->scaling != ROPE_NONE)
        return fail(rd->err, rd->err_len, "%s: both llama.rope.scaling.type %s and a rope_freqs tensor: not supported",
                    rd->path, r->scaling == ROPE_YARN ? "yarn" : "linear");
    int64_t orig;
    if (gguf_get_float(rd->g, "llama.rope.freq_base", &base, rd->err, rd->err_len) < 0 ||
        gguf_get_int(rd->g, "llama.rope.scaling.original_context_length", &orig, rd->err, rd->err_len) < 0)
        return -1;
    if (gguf_find_key(rd->g, "llama.rope.scaling.original_context_length")) L = (double)orig;
    for (int i = 0; i < n; i++) n_smooth += fabs(rv[i] - 1) > FREQS_TOL && fabs(rv[i] - factor) > FREQS_TOL * factor;
    if (n_smooth >= 2 && factor > 1 + FREQS_TOL) fit_smooth(rv, n, base, factor, n_smooth, &L, &low, &high);
    else if (n_smooth == 1) fit_smooth(rv, n, base, factor, 1, &L, &low, &high);
    else L = L > 0 ? L : 8192.0, low = 1.0, high = 4.0;
    if (!(L >= 1 && L <= MAX_CTX && low > 0 && low < high && factor > 1))
        return fail(rd->err, rd->err_len, "%s: %s does not follow Llama 3's RoPE scaling rule (no low_freq_factor < "
                    "high_freq_factor and original context fit it); run cannot reproduce arbitrary per-frequency "
                    "factors", rd->path, where);
    double sl = snap(low, 1e-3), sh = snap(high, 1e-3);
    if (llama3_misfit(rv, n, base, factor, sl, sh, L) <= FREQS_TOL) low = sl, high = sh;
    if (llama3_misfit(rv, n, base, factor, low, high, L) > FREQS_TOL)
        return fail(rd->err, rd->err_len, "%s: %s does not follow Llama 3's RoPE scaling rule (best fit: factor %g, "
                    "low_freq_factor %g, high_freq_factor %g, original context %g); run cannot reproduce arbitrary "
                    "per-frequency factors", rd->path, where, factor, low, high, L);
    r->scaling = ROPE_LLAMA3;
    r->factor = (float)factor;
    r->low_freq = (float)low;
    r->high_freq = (float)high;
    r->orig_ctx = (int)L;
    return 0;
}

/* ---- Tensors -> Weights ---------------------------------------------------- */

/* One of our tensors: its GGUF name (with %d for the layer), its shape (rows,
 * cols; per layer), and where it goes. */
typedef struct {
    const char *gguf;
    int per_layer;
    size_t rows, cols;
    Matrix *mat;        // a matrix (float32 or q8_0), or
    const float **vec;  // a float32 vector
    int optional;
    // filled by plan_tensor:
    int q8;             // every part is Q8_0: stored as our q8_0
    int mapped;         // one F32 tensor, 4-byte aligned: read from the file as it is
    size_t values_at, scales_at; // offsets in the converted buffer
} Slot;

#define N_SLOTS 12

static int build_slots(const Config *c, Weights *w, Slot s[N_SLOTS]) {
    size_t dim = (size_t)c->dim, hidden = (size_t)c->hidden_dim, vocab = (size_t)c->vocab_size;
    size_t kv_dim = dim / (size_t)c->n_heads * (size_t)c->n_kv_heads;
    int n = 0;
    s[n++] = (Slot){"token_embd.weight", 0, vocab, dim, &w->token_embedding, NULL, 0, 0, 0, 0, 0};
    s[n++] = (Slot){"blk.%d.attn_norm.weight", 1, 1, dim, NULL, &w->rms_att_weight, 0, 0, 0, 0, 0};
    s[n++] = (Slot){"blk.%d.attn_q.weight", 1, dim, dim, &w->wq, NULL, 0, 0, 0, 0, 0};
    s[n++] = (Slot){"blk.%d.attn_k.weight", 1, kv_dim, dim, &w->wk, NULL, 0, 0, 0, 0, 0};
    s[n++] = (Slot){"blk.%d.attn_v.weight", 1, kv_dim, dim, &w->wv, NULL, 0, 0, 0, 0, 0};
    s[n++] = (Slot){"blk.%d.attn_output.weight", 1, dim, dim, &w->wo, NULL, 0, 0, 0, 0, 0};
    s[n++] = (Slot){"blk.%d.ffn_norm.weight", 1, 1, dim, NULL, &w->rms_ffn_weight, 0, 0, 0, 0, 0};
    s[n++] = (Slot){"blk.%d.ffn_gate.weight", 1, hidden, dim, &w->w1, NULL, 0, 0, 0, 0, 0};
    s[n++] = (Slot){"blk.%d.ffn_down.weight", 1, dim, hidden, &w->w2, NULL, 0, 0, 0, 0, 0};
    s[n++] = (Slot){"blk.%d.ffn_up.weight", 1, hidden, dim, &w->w3, NULL, 0, 0, 0, 0, 0};
    s[n++] = (Slot){"output_norm.weight", 0, 1, dim, NULL, &w->rms_final_weight, 0, 0, 0, 0, 0};
    s[n++] = (Slot){"output.weight", 0, vocab, dim, &w->wcls, NULL, 1, 0, 0, 0, 0};
    return n;
}

/* The GGUF tensor of slot s, layer l (NULL when absent). */
static const GgufTensor *slot_tensor(const Reader *rd, const Slot *s, int l, char *name, size_t size) {
    snprintf(name, size, s->gguf, l);
    return gguf_find_tensor(rd->g, name);
}

/* Check one tensor: present, the shape the metadata gives, a type run converts. */
static int check_part(const Reader *rd, const Slot *s, const GgufTensor *t, const char *name) {
    char tn[32];
    if (!t) return fail(rd->err, rd->err_len, "%s: missing tensor %s", rd->path, name);
    int vector = s->rows == 1;
    if ((vector ? t->n_dims != 1 : t->n_dims != 2) || t->dims[0] != s->cols || (!vector && t->dims[1] != s->rows)) {
        char got[96] = "";
        for (uint32_t d = t->n_dims, len = 0; d > 0 && len < sizeof got; d--)
            len += (uint32_t)snprintf(got + len, sizeof got - len, "%s%" PRIu64, d < t->n_dims ? ", " : "",
                                      t->dims[d - 1]);
        if (vector)
            return fail(rd->err, rd->err_len, "%s: tensor %s has shape [%s], expected [%zu] from the metadata", rd->path,
                        name, got, s->cols);
        return fail(rd->err, rd->err_len, "%s: tensor %s has shape [%s], expected [%zu, %zu] from the metadata",
                    rd->path, name, got, s->rows, s->cols);
    }
    if (t->type != GGML_F32 && t->type != GGML_F16 && t->type != GGML_BF16 && t->type != GGML_Q8_0)
        return fail(rd->err, rd->err_len, "%s: tensor %s has type %s, which run does not read yet (it reads F32, F16, "
                    "BF16 and Q8_0); convert it with: python3 export.py model.bin --gguf %s (also writes its "
                    "tokenizer.bin beside model.bin)", rd->path, name, ggml_type_name(t->type, tn, sizeof tn), rd->path);
    return 0;
}

static size_t align64(size_t n) { return (n + 63) / 64 * 64; }

/* Check slot s's tensors, decide how it is stored, and reserve its place in
 * the converted buffer (at *used). Returns 0 (1 for an absent optional slot), -1. */
static int plan_slot(const Reader *rd, const Config *c, Slot *s, size_t *used) {
    char name[64];
    int parts = s->per_layer ? c->n_layers : 1, all_q8 = 1;
    const GgufTensor *first = slot_tensor(rd, s, 0, name, sizeof name);
    if (!first && s->optional) return 1;
    for (int l = 0; l < parts; l++) {
        const GgufTensor *t = slot_tensor(rd, s, l, name, sizeof name);
        if (check_part(rd, s, t, name)) return -1;
        all_q8 &= t->type == GGML_Q8_0;
    }
    size_t n = s->rows * s->cols * (size_t)parts;
    s->q8 = s->mat && all_q8;
    s->mapped = parts == 1 && first->type == GGML_F32 && ((uintptr_t)first->data % 4) == 0;
    if (s->mapped) return 0;
    s->values_at = *used;
    *used = align64(*used + n * (s->q8 ? 1 : 4));
    if (s->q8) {
        s->scales_at = *used;
        *used = align64(*used + n / 32 * 4);
    }
    return 0;
}

/* Values first .. first + n - 1 of a tensor as float32: F32, F16 and BF16
 * exactly, Q8_0 (first and n whole blocks) as gguf's dequantize computes it. */
static void to_f32(float *out, const GgufTensor *t, size_t first, size_t n) {
    const unsigned char *p = t->data;
    for (size_t k = 0, i = first; k < n; k++, i++) {
        float *o = &out[k];
        if (t->type == GGML_F32) {
            *o = read_le_f32(p + 4 * i);
        } else if (t->type == GGML_F16) {
            *o = half_to_float_c((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        } else if (t->type == GGML_BF16) {
            uint32_t bits = (uint32_t)(p[2 * i] | p[2 * i + 1] << 8) << 16;
            memcpy(o, &bits, 4);
        } else { // Q8_0: blocks of a half scale d and 32 int8, v = q * d in float32 (gguf's dequantize)
            const unsigned char *b = p + i / 32 * 34;
            float d = half_to_float_c((uint16_t)(b[0] | b[1] << 8));
            *o = (float)(int8_t)b[2 + i % 32] * d;
        }
    }
}

/* export.py's quantize_q8 (convert/checkpoint.py) on one group of 32:
 * scale = max|v| / 127 in float32, q = round-half-even(v / scale). */
static void quantize_group(int8_t *q, float *scale, const float *v) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
    float s = amax / 127.0f, safe = s > 0.0f ? s : 1.0f;
    for (int i = 0; i < 32; i++) {
        float r = rintf(v[i] / safe);
        q[i] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
    }
    *scale = s;
}

/* The first value of n that is NaN or infinite, or -1. */
static long not_finite(const float *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return (long)i;
    return -1;
}

/* Fill slot s from the file: its Matrix or vector pointer, into the mapping
 * or into `buf` (the converted buffer) as plan_slot decided. */
static int fill_slot(const Reader *rd, const Config *c, const Slot *s, unsigned char *buf, float *row) {
    char name[64];
    int parts = s->per_layer ? c->n_layers : 1;
    size_t per_part = s->rows * s->cols;
    const GgufTensor *first = slot_tensor(rd, s, 0, name, sizeof name);
    const float *values = s->mapped ? (const float *)(const void *)first->data : (const float *)(buf + s->values_at);
    for (int l = 0; l < parts; l++) {
        const GgufTensor *t = slot_tensor(rd, s, l, name, sizeof name);
        for (size_t r = 0; r < s->rows; r++) {
            size_t at = (size_t)l * per_part + r * s->cols;
            float *dst = s->q8 || s->mapped ? row : (float *)(buf + s->values_at) + at;
            to_f32(dst, t, r * s->cols, s->cols);
            long bad = not_finite(dst, s->cols);
            if (bad >= 0)
                return fail(rd->err, rd->err_len, "%s: tensor %s contains NaN or infinite values (value %zu)",
                            rd->path, name, r * s->cols + (size_t)bad);
            for (size_t g = 0; s->q8 && g < s->cols / 32; g++)
                quantize_group((int8_t *)(buf + s->values_at) + at + g * 32,
                               (float *)(buf + s->scales_at) + (at + g * 32) / 32, dst + g * 32);
        }
    }
    if (s->vec) *s->vec = values;
    if (s->mat && s->q8)
        *s->mat = (Matrix){WEIGHT_Q8_0, 32, buf + s->values_at, (const float *)(buf + s->scales_at)};
    else if (s->mat)
        *s->mat = (Matrix){WEIGHT_F32, 0, values, NULL};
    return 0;
}

/* Whether tensor name is one of the slots' (or rope_freqs). */
static int known_tensor(const Reader *rd, const Config *c, const Slot *slots, int n, GgufStr name) {
    char want[64];
    if (gguf_str_is(name, "rope_freqs.weight")) return 1;
    for (int i = 0; i < n; i++)
        for (int l = 0; slots[i].gguf && l < (slots[i].per_layer ? c->n_layers : 1); l++) {
            snprintf(want, sizeof want, slots[i].gguf, l);
            if (gguf_str_is(name, want)) return 1;
        }
    (void)rd;
    return 0;
}

/* Every tensor in the file is one the model uses (export.py refuses the others too). */
static int check_no_extra(const Reader *rd, const Config *c, const Slot *slots, int n) {
    uint64_t used = gguf_find_tensor(rd->g, "rope_freqs.weight") != NULL;
    for (int i = 0; i < n; i++)
        if (slots[i].gguf) used += slots[i].per_layer ? (uint64_t)c->n_layers : 1;
    if (used == rd->g->n_tensors) return 0; // names are unique and every slot's are present
    for (uint64_t k = 0; k < rd->g->n_tensors; k++)
        if (!known_tensor(rd, c, slots, n, rd->g->tensors[k].name)) {
            char shown[96];
            return fail(rd->err, rd->err_len, "%s: unexpected tensor %s (not part of a llama model)", rd->path,
                        gguf_show(rd->g->tensors[k].name, shown, sizeof shown));
        }
    return 0;
}

/* The metadata -> config and RoPE parameters, checked as a checkpoint's header is. */
static int read_config(const Reader *rd, Config *c, RopeConfig *r) {
    c->version = 2; // what export.py would write for it (run.c's validate_config checks by version)
    if (check_architecture(rd) || read_sizes(rd, c, r) || read_vocab(rd, c) || read_scaling(rd, r) ||
        validate_config(rd->path, c, r, rd->err, rd->err_len) || read_rope_freqs(rd, r) ||
        validate_config(rd->path, c, r, rd->err, rd->err_len)) // again: with Llama 3's scaling from rope_freqs
        return -1;
    if (r->orig_ctx == 0) r->orig_ctx = c->train_ctx;
    return 0;
}

/* Plan every slot, allocate the converted buffer, fill the slots. */
static int read_weights(const Reader *rd, Transformer *t, Slot *slots, int n) {
    Config *c = &t->config;
    size_t used = 0, widest = c->dim > c->hidden_dim ? (size_t)c->dim : (size_t)c->hidden_dim;
    for (int i = 0; i < n; i++) {
        int rc = plan_slot(rd, c, &slots[i], &used);
        if (rc < 0) return -1;
        if (rc == 1) slots[i].gguf = NULL; // absent and optional: output.weight, tied to the embedding
    }
    c->shared_classifier = slots[n - 1].gguf == NULL;
    for (int i = 0; i < n; i++)
        if (slots[i].gguf && slots[i].q8) c->weight_type = WEIGHT_Q8_0, c->group_size = 32;
    t->converted = used ? aligned_alloc(64, used) : NULL;
    float *row = malloc(widest * sizeof *row);
    if ((used && !t->converted) || !row) {
        free(row);
        return fail(rd->err, rd->err_len, "%s: out of memory for %.1f MiB of converted tensors", rd->path,
                    used / 1048576.0);
    }
    for (int i = 0; i < n; i++)
        if (slots[i].gguf && fill_slot(rd, c, &slots[i], t->converted, row)) {
            free(row);
            return -1;
        }
    free(row);
    if (c->shared_classifier) t->weights.wcls = t->weights.token_embedding;
    t->converted_size = used;
    return 0;
}

/* One notice: what was converted (tensors of each type, and what each became) and the memory it takes. */
static void conversion_notice(const Reader *rd, const Slot *slots, int n, int n_layers, size_t used) {
    const char *names[] = {"F32 copied", "F16 -> f32", "BF16 -> f32", "Q8_0 -> f32", "Q8_0 -> q8_0"};
    const uint32_t types[] = {GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q8_0};
    char what[256] = "";
    size_t len = 0;
    for (int k = 0; k < 5; k++) {
        int count = 0;
        for (int i = 0; i < n; i++)
            for (int l = 0; slots[i].gguf && !slots[i].mapped && l < (slots[i].per_layer ? n_layers : 1); l++) {
                char name[64];
                count += slot_tensor(rd, &slots[i], l, name, sizeof name)->type == types[k] && slots[i].q8 == (k == 4);
            }
        if (count && len < sizeof what)
            len += (size_t)snprintf(what + len, sizeof what - len, "%s%d %s", len ? ", " : "", count, names[k]);
    }
    if (used) notice("%s: GGUF tensors converted at load (%s; layers stacked): %.1f MiB of memory", rd->path, what,
                     used / 1048576.0);
}

int gguf_load_checkpoint(Transformer *t, const char *path, int fd, size_t file_size, char *err, size_t err_len) {
    memset(t, 0, sizeof *t);
    void *map = mmap(NULL, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) return fail(err, err_len, "%s: mmap failed: %s", path, strerror(errno));
    t->mapping = map;
    t->file_size = file_size;
    GgufFile g;
    Reader rd = {&g, path, err, err_len};
    Slot slots[N_SLOTS];
    int rc = gguf_parse(&g, path, map, file_size, err, err_len);
    if (rc == 0) rc = read_config(&rd, &t->config, &t->rope);
    int n = rc == 0 ? build_slots(&t->config, &t->weights, slots) : 0;
    if (rc == 0) rc = read_weights(&rd, t, slots, n);
    if (rc == 0) rc = check_no_extra(&rd, &t->config, slots, n);
    if (rc == 0) conversion_notice(&rd, slots, n, t->config.n_layers, t->converted_size);
    gguf_free(&g);
    if (rc != 0) {
        free(t->converted);
        munmap(map, file_size);
        memset(t, 0, sizeof *t);
        return -1;
    }
    return 0;
}
