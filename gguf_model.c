/* gguf_model.c: a GGUF file of the llama, qwen2 or phi3 architecture (ARCHS
 * below says what each adds to Llama) as run's Transformer,
 * read directly (run.c's load_checkpoint calls gguf_load_checkpoint for a
 * file that starts with "GGUF"; gguf.c reads the format).
 *
 * The metadata maps to Config and RopeConfig exactly as export.py's GGUF
 * reader maps it (convert/gguf.py, convert/gguf_rope.py), float fields
 * rounded to float32 as export.py's header stores them, so that the model
 * is the one `export.py OUT --gguf FILE` writes. q/k rows stay as llama.cpp's
 * converter leaves them: Meta's interleaved pairs for llama, Hugging Face's
 * half-split (neox) order for qwen2 and phi3 (docs/rope.md §4.3).
 *
 * Tensors: run's Weights stack the layers of each matrix in one block, and
 * GGUF stores each layer as a tensor of its own, so the per-layer tensors are
 * copied once, at load, into stacked buffers the Transformer owns
 * (t->converted, one allocation): F32 as it is, F16 and BF16 widened to
 * float32 exactly; Q4_0 and Q4_1, which the kernels run as stored, kept:
 * their blocks' bytes split into nibbles and half scales (kernels.h's q4_0
 * and q4_1); the other quantized types (Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)
 * dequantized as the gguf package does (gguf_quants.c), then quantized again
 * into our q8_0 (int8 values, a float32 scale per 32) with export.py's
 * arithmetic, so that the logits are bit-identical to its `--dtype q8_0`
 * conversion. --gguf-convert q8_0 makes Q4_0 and Q4_1 q8_0 too; --gguf-convert
 * f32 makes every quantized tensor float32, as export.py's default
 * conversion. One function, memory_type, decides what each tensor becomes. token_embd,
 * output and output_norm in F32 are read from the mapping as they are. Other
 * tensor types (Q2_K, IQ4_NL, ...) are refused by name. docs/gguf.md says
 * what it costs.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE // madvise
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_tokenizer.h"

/* The architectures run reads, and what each adds to Llama's tensors and keys
 * (GGUF_ARCHS in convert/gguf.py; docs/gguf.md says why):
 *   llama  nothing; q/k rows in Meta's interleaved pair order: llama.cpp's
 *          converter undoes Hugging Face's permutation for this architecture
 *   qwen2  blk.N.attn_q/attn_k/attn_v.bias, required; q/k rows as Hugging
 *          Face stores them (neox: the converter leaves them)
 *   phi3   blk.N.attn_qkv (q, k and v rows stacked) and blk.N.ffn_up (the
 *          gate rows, then the up rows: llama.cpp's SwiGLU takes silu of the
 *          first half) instead of attn_q/k/v and ffn_gate/ffn_up, split by rows;
 *          q/k neox; its attention.sliding_window on every layer; LongRoPE
 *          from the rope_factors_short/long tensors */
typedef struct {
    const char *name; // general.architecture, and the prefix of its keys ("qwen2.context_length")
    int layout;       // how the converter leaves the q/k rows: ROPE_INTERLEAVED or ROPE_NEOX
    int qkv_bias;     // blk.N.attn_q/attn_k/attn_v.bias per layer
    int fused;        // attn_qkv and a gate|up ffn_up
    int window;       // <arch>.attention.sliding_window is the model's (else refused unless 0)
    int longrope;     // rope_factors_short/long tensors may give LongRoPE
    int rope_freqs;   // a rope_freqs tensor may give Llama 3's scaling
} Arch;

static const Arch ARCHS[] = {
    {"llama", ROPE_INTERLEAVED, 0, 0, 0, 0, 1},
    {"qwen2", ROPE_NEOX, 1, 0, 0, 0, 0},
    {"phi3", ROPE_NEOX, 0, 1, 1, 1, 0},
};

typedef struct {
    const GgufFile *g;
    const char *path;
    char *err;
    size_t err_len;
    const Arch *arch; // set by check_architecture
} Reader;

/* ---- Metadata -> Config, RopeConfig ---------------------------------------- */

#define KEY_MAX 96 /* the longest key this file builds, "phi3.rope.scaling.original_context_length", fits */

/* The file's key "<arch>.<name>" (e.g. "phi3.context_length") in buf. */
static const char *arch_key(const Reader *rd, const char *name, char *buf) {
    snprintf(buf, KEY_MAX, "%s.%s", rd->arch->name, name);
    return buf;
}

/* gguf_get_int/float/str on the key "<arch>.<name>" (their messages name the whole key). */
static int arch_int(const Reader *rd, const char *name, int64_t *out) {
    char key[KEY_MAX];
    return gguf_get_int(rd->g, arch_key(rd, name, key), out, rd->err, rd->err_len);
}
static int arch_float(const Reader *rd, const char *name, double *out) {
    char key[KEY_MAX];
    return gguf_get_float(rd->g, arch_key(rd, name, key), out, rd->err, rd->err_len);
}
static int arch_str(const Reader *rd, const char *name, GgufStr *out) {
    char key[KEY_MAX];
    return gguf_get_str(rd->g, arch_key(rd, name, key), out, rd->err, rd->err_len);
}

/* <arch>.* keys of features run cannot reproduce: refused unless they hold the value that means "off"
 * (GGUF_REJECTED in convert/gguf.py). An architecture with `window` maps the first one instead. */
static const struct { const char *key, *what; double off; } REJECTED[] = {
    {"attention.sliding_window", "sliding-window attention", 0},
    {"attention.scale", "a custom attention scale", 0},
    {"logit_scale", "scaled logits", 1},
    {"embedding_scale", "a scaled embedding", 1},
    {"residual_scale", "scaled residuals", 1},
    {"attention.clamp_kqv", "clamped q/k/v", 0},
    {"attention.max_alibi_bias", "ALiBi", 0},
    {"rope.scaling.alpha", "NTK-alpha RoPE scaling", 1},
};

/* The positive int32 value of "<arch>.<name>"; 0 absent (then *out = def), -1 bad or required and absent. */
static int count_key(const Reader *rd, const char *name, int required, int def, int *out) {
    char key[KEY_MAX];
    int64_t v;
    int got = gguf_get_int(rd->g, arch_key(rd, name, key), &v, rd->err, rd->err_len);
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

/* general.architecture one of ARCHS (-> rd->arch), one file (no split), none of REJECTED, no experts. */
static int check_architecture(Reader *rd) {
    GgufStr name;
    char shown[64], key[KEY_MAX];
    int got = gguf_get_str(rd->g, "general.architecture", &name, rd->err, rd->err_len);
    if (got < 0) return -1;
    if (!got) return fail(rd->err, rd->err_len, "%s: missing required key general.architecture", rd->path);
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if (gguf_str_is(name, ARCHS[i].name)) rd->arch = &ARCHS[i];
    if (!rd->arch)
        return fail(rd->err, rd->err_len, "%s: general.architecture is \"%s\": run reads \"llama\" (Llama, Mistral, "
                    "SmolLM2), \"qwen2\" and \"phi3\" GGUF files", rd->path, gguf_show(name, shown, sizeof shown));
    int64_t split;
    got = gguf_get_int(rd->g, "split.count", &split, rd->err, rd->err_len);
    if (got < 0) return -1;
    if (got && split > 1)
        return fail(rd->err, rd->err_len, "%s: one part of a split GGUF (split.count %" PRId64 "); merge the parts "
                    "first (llama-gguf-split --merge)", rd->path, split);
    for (size_t i = rd->arch->window ? 1 : 0; i < sizeof REJECTED / sizeof REJECTED[0]; i++) {
        double v;
        got = arch_float(rd, REJECTED[i].key, &v);
        if (got < 0) return -1;
        if (got && v != REJECTED[i].off)
            return fail(rd->err, rd->err_len, "%s: %s=%g (%s) is not supported", rd->path,
                        arch_key(rd, REJECTED[i].key, key), v, REJECTED[i].what);
    }
    if (gguf_find_key(rd->g, arch_key(rd, "attention.sliding_window_pattern", key)))
        return fail(rd->err, rd->err_len, "%s: %s (sliding-window attention on some layers) is not supported",
                    rd->path, key);
    int64_t experts;
    got = arch_int(rd, "expert_count", &experts);
    if (got < 0) return -1;
    if (got && experts > 0)
        return fail(rd->err, rd->err_len, "%s: %s=%" PRId64 ": mixture of experts is not supported", rd->path,
                    arch_key(rd, "expert_count", key), experts);
    return 0;
}

/* Sizes, norm epsilon, RoPE base, dimensions and layout, biases and window
 * (_gguf_sizes in convert/gguf.py). */
static int read_sizes(const Reader *rd, Config *c, RopeConfig *r) {
    const char *a = rd->arch->name;
    char key[KEY_MAX];
    const GgufKV *ff = gguf_find_key(rd->g, arch_key(rd, "feed_forward_length", key));
    if (ff && ff->type == GGUF_ARRAY)
        return fail(rd->err, rd->err_len, "%s: %s is an array (a width per layer); run has one FFN width", rd->path,
                    key);
    if (count_key(rd, "embedding_length", 1, 0, &c->dim) < 0 || count_key(rd, "block_count", 1, 0, &c->n_layers) < 0 ||
        count_key(rd, "feed_forward_length", 1, 0, &c->hidden_dim) < 0 ||
        count_key(rd, "attention.head_count", 1, 0, &c->n_heads) < 0 ||
        count_key(rd, "attention.head_count_kv", 0, c->n_heads, &c->n_kv_heads) < 0 ||
        count_key(rd, "context_length", 1, 0, &c->train_ctx) < 0)
        return -1;
    if (c->dim % c->n_heads || c->n_heads % c->n_kv_heads)
        return fail(rd->err, rd->err_len, "%s: %s.attention.head_count=%d, head_count_kv=%d do not divide "
                    "embedding_length=%d and head_count", rd->path, a, c->n_heads, c->n_kv_heads, c->dim);
    int hs = c->dim / c->n_heads, v = 0;
    const char *lengths[] = {"attention.key_length", "attention.value_length"};
    for (int i = 0; i < 2; i++) {
        int got = count_key(rd, lengths[i], 0, hs, &v);
        if (got < 0) return -1;
        if (got && v != hs)
            return fail(rd->err, rd->err_len, "%s: %s.%s=%d differs from embedding_length / head_count = %d (not "
                        "supported: run derives the head size)", rd->path, a, lengths[i], v, hs);
    }
    double eps, theta = 10000.0; // llama.cpp's default base
    int got = arch_float(rd, "attention.layer_norm_rms_epsilon", &eps);
    if (got < 0) return -1;
    if (!got)
        return fail(rd->err, rd->err_len, "%s: missing required key %s.attention.layer_norm_rms_epsilon", rd->path, a);
    if (arch_float(rd, "rope.freq_base", &theta) < 0) return -1;
    if (count_key(rd, "rope.dimension_count", 0, hs, &r->rot_dim) < 0) return -1;
    int64_t window = 0; // phi3: every layer slides; 0 = none (Phi-4's files say 0)
    if (rd->arch->window && arch_int(rd, "attention.sliding_window", &window) < 0) return -1;
    if (window < 0 || window > MAX_CTX)
        return fail(rd->err, rd->err_len, "%s: %s.attention.sliding_window=%" PRId64 " is out of range (0 = none, or "
                    "1..%d)", rd->path, a, window, MAX_CTX);
    c->norm_eps = (float)eps;
    r->base = (float)theta; // the header stores float32
    r->layout = rd->arch->layout;
    c->bias_flags = rd->arch->qkv_bias ? BIAS_QKV : 0;
    c->sliding_window = (int)window;
    c->window_first_layer = 0;
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

/* vocab_size from token_embd's rows (checked against <arch>.vocab_size and
 * tokenizer.ggml.tokens), bos_id and eos_id as export.py chooses them
 * (_gguf_vocab in convert/gguf.py). */
static int read_vocab(const Reader *rd, Config *c) {
    const GgufTensor *emb = gguf_find_tensor(rd->g, "token_embd.weight");
    if (!emb) return fail(rd->err, rd->err_len, "%s: missing tensor token_embd.weight", rd->path);
    if (emb->n_dims != 2 || emb->dims[1] > INT32_MAX)
        return fail(rd->err, rd->err_len, "%s: tensor token_embd.weight has %" PRIu32 " dimensions, expected "
                    "[vocab_size, %d]", rd->path, emb->n_dims, c->dim);
    c->vocab_size = (int)emb->dims[1];
    int v = 0, got = count_key(rd, "vocab_size", 0, 0, &v);
    if (got < 0) return -1;
    if (got && v != c->vocab_size)
        return fail(rd->err, rd->err_len, "%s: %s.vocab_size=%d but token_embd.weight has %d rows", rd->path,
                    rd->arch->name, v, c->vocab_size);
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

/* One of the float scaling keys, "<arch>.<name>", or def when absent. */
static int scaling_float(const Reader *rd, const char *name, double def, double *out) {
    *out = def;
    return arch_float(rd, name, out);
}

/* YaRN's keys (_gguf_yarn in convert/gguf_rope.py). */
static int read_yarn(const Reader *rd, RopeConfig *r, double factor) {
    const char *a = rd->arch->name;
    int64_t orig;
    int got = arch_int(rd, "rope.scaling.original_context_length", &orig);
    if (got < 0) return -1;
    if (got && (orig < 0 || orig > INT32_MAX))
        return fail(rd->err, rd->err_len, "%s: %s.rope.scaling.original_context_length=%" PRId64 " is out of range",
                    rd->path, a, orig);
    r->orig_ctx = got ? (int)orig : 0; // 0: the training context
    double fast, slow, logm, ext, a1, a2;
    if (scaling_float(rd, "rope.scaling.yarn_beta_fast", 32.0, &fast) < 0 ||
        scaling_float(rd, "rope.scaling.yarn_beta_slow", 1.0, &slow) < 0 ||
        scaling_float(rd, "rope.scaling.yarn_log_multiplier", 0.0, &logm) < 0 ||
        scaling_float(rd, "rope.scaling.yarn_ext_factor", -1.0, &ext) < 0 ||
        scaling_float(rd, "rope.scaling.attn_factor", 1.0, &a1) < 0 ||
        scaling_float(rd, "rope.scaling.yarn_attn_factor", 1.0, &a2) < 0)
        return -1;
    if (logm != 0)
        return fail(rd->err, rd->err_len, "%s: %s.rope.scaling.yarn_log_multiplier (DeepSeek's YaRN magnitude) is "
                    "not supported", rd->path, a);
    if (ext != -1.0 && ext != 1.0)
        return fail(rd->err, rd->err_len, "%s: %s.rope.scaling.yarn_ext_factor=%g (partial YaRN extrapolation) is "
                    "not supported", rd->path, a, ext);
    r->beta_fast = (float)fast;
    r->beta_slow = (float)slow;
    double mult = a1 * a2; // llama.cpp multiplies YaRN's own 0.1 ln s + 1 by these; 0 = derive it
    r->attn_factor = mult == 1.0 ? 0.0 : (float)(mult * (0.1 * log(factor) + 1.0));
    return 0;
}

/* rope.scaling.type none / linear / yarn, or the older rope.scale_linear.
 * A rope_freqs tensor (Llama 3) is handled by read_rope_freqs, phi3's type
 * "longrope" and its factor tensors by read_longrope. */
static int read_scaling(const Reader *rd, RopeConfig *r) {
    const char *a = rd->arch->name;
    GgufStr kind = {(const unsigned char *)"", 0};
    double factor = 1.0, linear = 1.0;
    int has_kind = arch_str(rd, "rope.scaling.type", &kind);
    int has_factor = scaling_float(rd, "rope.scaling.factor", 1.0, &factor);
    int has_linear = scaling_float(rd, "rope.scale_linear", 1.0, &linear);
    if (has_kind < 0 || has_factor < 0 || has_linear < 0) return -1;
    int linear_kind = has_kind ? gguf_str_is(kind, "linear") : has_linear && linear != 1.0;
    if (!has_kind && linear_kind) factor = linear, has_factor = 1;
    int yarn = has_kind && gguf_str_is(kind, "yarn");
    int longrope = has_kind && gguf_str_is(kind, "longrope") && rd->arch->longrope;
    char shown[64];
    if (has_kind && !linear_kind && !yarn && !longrope && !gguf_str_is(kind, "none"))
        return fail(rd->err, rd->err_len, "%s: %s.rope.scaling.type \"%s\" is not supported (none, linear, yarn%s)",
                    rd->path, a, gguf_show(kind, shown, sizeof shown), rd->arch->longrope ? ", longrope" : "");
    r->scaling = ROPE_NONE;
    r->factor = 1.0;
    r->beta_fast = 32.0;
    r->beta_slow = 1.0;
    r->low_freq = 1.0;
    r->high_freq = 4.0;
    if (!linear_kind && !yarn) return 0;
    if (!has_factor)
        return fail(rd->err, rd->err_len, "%s: %s.rope.scaling.type is %s but there is no %s.rope.scaling.factor",
                    rd->path, a, yarn ? "yarn" : "linear", a);
    if (!(factor >= 1.0))
        return fail(rd->err, rd->err_len, "%s: %s.rope.scaling.factor=%g < 1 is not supported", rd->path, a, factor);
    r->scaling = yarn ? ROPE_YARN : ROPE_LINEAR;
    r->factor = (float)factor;
    return yarn ? read_yarn(rd, r, factor) : 0;
}

/* ---- Phi-3's LongRoPE ----------------------------------------------------------
 * llama.cpp's converter writes Phi-3's two sets of per-pair divisors as the
 * tensors rope_factors_short and rope_factors_long (rot_dim / 2 F32 values
 * each), L as <arch>.rope.scaling.original_context_length and the magnitude
 * as <arch>.rope.scaling.attn_factor: sqrt(1 + ln s / ln L) for s =
 * context_length / L, computed by the converter. As export.py
 * (gguf_longrope in convert/gguf_rope.py): both tensors or neither, L
 * required with them, the magnitude as the file gives it (absent, as from
 * older converters: 0, which run derives as transformers does), s =
 * max(context_length / L, 1). The factors themselves are slots (build_slots),
 * checked positive once read (check_rope_factors). */
static int read_longrope(const Reader *rd, const Config *c, RopeConfig *r) {
    const char *a = rd->arch->name, *names[] = {"rope_factors_short.weight", "rope_factors_long.weight"};
    if (!rd->arch->longrope) return 0;
    int has[2] = {gguf_find_tensor(rd->g, names[0]) != NULL, gguf_find_tensor(rd->g, names[1]) != NULL};
    GgufStr kind;
    int has_kind = arch_str(rd, "rope.scaling.type", &kind);
    if (has_kind < 0) return -1;
    if (!has[0] && !has[1]) {
        if (has_kind && gguf_str_is(kind, "longrope"))
            return fail(rd->err, rd->err_len, "%s: %s.rope.scaling.type is longrope but there are no "
                        "rope_factors_short/rope_factors_long tensors", rd->path, a);
        return 0;
    }
    if (!has[0] || !has[1])
        return fail(rd->err, rd->err_len, "%s: missing tensor %s (LongRoPE needs both rope_factors_short and "
                    "rope_factors_long; the file has %s)", rd->path, names[has[0]], names[!has[0]]);
    if (r->scaling != ROPE_NONE)
        return fail(rd->err, rd->err_len, "%s: both %s.rope.scaling.type %s and rope_factors tensors (LongRoPE): not "
                    "supported", rd->path, a, r->scaling == ROPE_YARN ? "yarn" : "linear");
    int64_t L;
    double att = 0.0;
    int got = arch_int(rd, "rope.scaling.original_context_length", &L);
    if (got < 0) return -1;
    if (!got)
        return fail(rd->err, rd->err_len, "%s: missing required key %s.rope.scaling.original_context_length", rd->path,
                    a);
    if (L <= 0 || L > INT32_MAX)
        return fail(rd->err, rd->err_len, "%s: %s.rope.scaling.original_context_length=%" PRId64 " is not a positive "
                    "integer", rd->path, a, L);
    int has_att = arch_float(rd, "rope.scaling.attn_factor", &att);
    if (has_att < 0) return -1;
    if (has_att && !(isfinite(att) && att > 0))
        return fail(rd->err, rd->err_len, "%s: %s.rope.scaling.attn_factor=%g: expected a finite value > 0", rd->path,
                    a, att);
    double s = (double)c->train_ctx / (double)L; // only the derived magnitude uses it
    r->scaling = ROPE_LONGROPE;
    r->factor = (float)(s > 1.0 ? s : 1.0);
    r->orig_ctx = (int)L;
    r->attn_factor = has_att ? (float)att : 0.0;
    return 0;
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
    if (!t || !rd->arch->rope_freqs) return 0; // another architecture's: check_no_extra refuses it
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
 * cols; per layer), and where it goes. A part of a fused tensor (phi3's
 * attn_qkv, ffn_up) is rows first_row .. first_row + rows - 1 of a tensor of
 * file_rows rows. */
typedef struct {
    const char *gguf;
    int per_layer;
    size_t rows, cols;
    Matrix *mat;        // a matrix (float32, q8_0, q4_0 or q4_1), or
    const float **vec;  // a float32 vector
    int optional;
    size_t first_row;   // fused: the first of the tensor's rows this slot takes (0 otherwise)
    size_t file_rows;   // fused: the tensor's rows in the file (0: rows)
    // filled by plan_tensor:
    int type;           // WEIGHT_F32 | WEIGHT_Q8_0 | WEIGHT_Q4_0 | WEIGHT_Q4_1: what it is held as
    int mapped;         // one F32 tensor, 4-byte aligned: read from the file as it is
    size_t values_at, scales_at, mins_at; // offsets in the converted buffer
} Slot;

#define N_SLOTS 17 /* Llama's 12, q/k/v biases, LongRoPE's two factor sets */

/* A matrix slot, a float32 vector slot, and a matrix taken from rows first ..
 * first + rows - 1 of a fused tensor of file_rows rows. */
static Slot matrix_slot(const char *gguf, int per_layer, size_t rows, size_t cols, Matrix *m) {
    return (Slot){.gguf = gguf, .per_layer = per_layer, .rows = rows, .cols = cols, .mat = m};
}
static Slot vector_slot(const char *gguf, int per_layer, size_t n, const float **v) {
    return (Slot){.gguf = gguf, .per_layer = per_layer, .rows = 1, .cols = n, .vec = v};
}
static Slot fused_slot(const char *gguf, size_t first, size_t rows, size_t file_rows, size_t cols, Matrix *m) {
    return (Slot){.gguf = gguf, .per_layer = 1, .rows = rows, .cols = cols, .mat = m, .first_row = first,
                  .file_rows = file_rows};
}

/* The tensors of the file's architecture (GGUF_LAYER_TENSORS, the fused ones
 * and the biases in convert/gguf.py), output.weight last: it alone is
 * optional (absent: the classifier is tied to the embedding). */
static int build_slots(const Arch *arch, const Config *c, RopeConfig *r, Weights *w, Slot s[N_SLOTS]) {
    size_t dim = (size_t)c->dim, hidden = (size_t)c->hidden_dim, vocab = (size_t)c->vocab_size;
    size_t kv_dim = dim / (size_t)c->n_heads * (size_t)c->n_kv_heads, pairs = (size_t)r->rot_dim / 2;
    int n = 0;
    s[n++] = matrix_slot("token_embd.weight", 0, vocab, dim, &w->token_embedding);
    s[n++] = vector_slot("blk.%d.attn_norm.weight", 1, dim, &w->rms_att_weight);
    if (arch->fused) { // attn_qkv: the q rows, then k's, then v's
        size_t qkv = dim + 2 * kv_dim;
        s[n++] = fused_slot("blk.%d.attn_qkv.weight", 0, dim, qkv, dim, &w->wq);
        s[n++] = fused_slot("blk.%d.attn_qkv.weight", dim, kv_dim, qkv, dim, &w->wk);
        s[n++] = fused_slot("blk.%d.attn_qkv.weight", dim + kv_dim, kv_dim, qkv, dim, &w->wv);
    } else {
        s[n++] = matrix_slot("blk.%d.attn_q.weight", 1, dim, dim, &w->wq);
        s[n++] = matrix_slot("blk.%d.attn_k.weight", 1, kv_dim, dim, &w->wk);
        s[n++] = matrix_slot("blk.%d.attn_v.weight", 1, kv_dim, dim, &w->wv);
    }
    s[n++] = matrix_slot("blk.%d.attn_output.weight", 1, dim, dim, &w->wo);
    s[n++] = vector_slot("blk.%d.ffn_norm.weight", 1, dim, &w->rms_ffn_weight);
    if (arch->fused) { // ffn_up: the gate rows (w1), then the up rows (w3)
        s[n++] = fused_slot("blk.%d.ffn_up.weight", 0, hidden, 2 * hidden, dim, &w->w1);
        s[n++] = matrix_slot("blk.%d.ffn_down.weight", 1, dim, hidden, &w->w2);
        s[n++] = fused_slot("blk.%d.ffn_up.weight", hidden, hidden, 2 * hidden, dim, &w->w3);
    } else {
        s[n++] = matrix_slot("blk.%d.ffn_gate.weight", 1, hidden, dim, &w->w1);
        s[n++] = matrix_slot("blk.%d.ffn_down.weight", 1, dim, hidden, &w->w2);
        s[n++] = matrix_slot("blk.%d.ffn_up.weight", 1, hidden, dim, &w->w3);
    }
    if (arch->qkv_bias) {
        s[n++] = vector_slot("blk.%d.attn_q.bias", 1, dim, &w->bq);
        s[n++] = vector_slot("blk.%d.attn_k.bias", 1, kv_dim, &w->bk);
        s[n++] = vector_slot("blk.%d.attn_v.bias", 1, kv_dim, &w->bv);
    }
    if (r->scaling == ROPE_LONGROPE) { // read_longrope found both
        s[n++] = vector_slot("rope_factors_short.weight", 0, pairs, &r->short_factor);
        s[n++] = vector_slot("rope_factors_long.weight", 0, pairs, &r->long_factor);
    }
    s[n++] = vector_slot("output_norm.weight", 0, dim, &w->rms_final_weight);
    s[n] = matrix_slot("output.weight", 0, vocab, dim, &w->wcls);
    s[n++].optional = 1;
    return n;
}

/* The GGUF tensor of slot s, layer l (NULL when absent). */
static const GgufTensor *slot_tensor(const Reader *rd, const Slot *s, int l, char *name, size_t size) {
    snprintf(name, size, s->gguf, l);
    return gguf_find_tensor(rd->g, name);
}

/* Whether run reads tensors of this ggml type: the float types, and those gguf_quants.c dequantizes, whose
 * block sizes must be the ones gguf.c checked the tensor's bytes against (they are: this keeps it so). */
static int readable_type(uint32_t type) {
    size_t values, bytes;
    uint64_t block, size;
    if (type == GGML_F32 || type == GGML_F16 || type == GGML_BF16) return 1;
    return gguf_quant_block(type, &values, &bytes) && ggml_type_size(type, &block, &size) && block == values &&
           size == bytes;
}

/* What the quantized tensors become (--gguf-convert): gguf.h's GGUF_KEEP, GGUF_TO_Q8_0 or GGUF_TO_F32. */
static int conversion = GGUF_KEEP;

void gguf_set_conversion(int how) { conversion = how == GGUF_TO_F32 || how == GGUF_TO_Q8_0 ? how : GGUF_KEEP; }

/* The in-memory type of one tensor of a matrix, the loader's one decision per
 * type: the float types become float32 (exactly); Q4_0 and Q4_1 stay as they
 * are (GGUF_KEEP); the other quantized ones become q8_0, or all of them
 * float32 under --gguf-convert f32. A matrix's layers share one type
 * (plan_slot): the layers' one type, else q8_0 when every layer is
 * quantized, else float32. */
static int memory_type(uint32_t ggml_type) {
    if (ggml_type == GGML_F32 || ggml_type == GGML_F16 || ggml_type == GGML_BF16 || conversion == GGUF_TO_F32)
        return WEIGHT_F32;
    if (conversion == GGUF_KEEP && ggml_type == GGML_Q4_0) return WEIGHT_Q4_0;
    if (conversion == GGUF_KEEP && ggml_type == GGML_Q4_1) return WEIGHT_Q4_1;
    return WEIGHT_Q8_0;
}

/* Check one tensor: present, the shape the metadata gives, a type run converts. */
static int check_part(const Reader *rd, const Slot *s, const GgufTensor *t, const char *name) {
    char tn[32];
    if (!t) return fail(rd->err, rd->err_len, "%s: missing tensor %s", rd->path, name);
    int vector = s->vec != NULL;
    size_t rows = s->file_rows ? s->file_rows : s->rows; // a fused tensor: all its parts' rows (then never 1)
    int flat = t->n_dims == 1 && (vector || rows == 1);   // a vector, or a matrix of one row stored as one
    if (!(flat || (!vector && t->n_dims == 2 && t->dims[1] == rows)) || t->dims[0] != s->cols) {
        char got[96] = "";
        for (uint32_t d = t->n_dims, len = 0; d > 0 && len < sizeof got; d--)
            len += (uint32_t)snprintf(got + len, sizeof got - len, "%s%" PRIu64, d < t->n_dims ? ", " : "",
                                      t->dims[d - 1]);
        if (vector)
            return fail(rd->err, rd->err_len, "%s: tensor %s has shape [%s], expected [%zu] from the metadata", rd->path,
                        name, got, s->cols);
        return fail(rd->err, rd->err_len, "%s: tensor %s has shape [%s], expected [%zu, %zu] from the metadata",
                    rd->path, name, got, rows, s->cols);
    }
    if (!readable_type(t->type))
        return fail(rd->err, rd->err_len, "%s: tensor %s has type %s, which run does not read yet (it reads F32, F16, "
                    "BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K); convert it with: python3 export.py "
                    "model.bin --gguf %s (also writes its tokenizer.bin beside model.bin)", rd->path, name,
                    ggml_type_name(t->type, tn, sizeof tn), rd->path);
    return 0;
}

static size_t align64(size_t n) { return (n + 63) / 64 * 64; }

/* Check slot s's tensors, decide how it is stored, and reserve its place in
 * the converted buffer (at *used). Returns 0 (1 for an absent optional slot), -1. */
static int plan_slot(const Reader *rd, const Config *c, Slot *s, size_t *used) {
    char name[64];
    int parts = s->per_layer ? c->n_layers : 1, same = 1, any_f32 = 0;
    const GgufTensor *first = slot_tensor(rd, s, 0, name, sizeof name);
    if (!first && s->optional) return 1;
    for (int l = 0; l < parts; l++) {
        const GgufTensor *t = slot_tensor(rd, s, l, name, sizeof name);
        if (check_part(rd, s, t, name)) return -1;
        same &= memory_type(t->type) == memory_type(first->type);
        any_f32 |= memory_type(t->type) == WEIGHT_F32;
    }
    size_t n = s->rows * s->cols * (size_t)parts;
    s->type = !s->mat || any_f32 ? WEIGHT_F32 : same ? memory_type(first->type) : WEIGHT_Q8_0;
    s->mapped = parts == 1 && s->first_row == 0 && first->type == GGML_F32 && ((uintptr_t)first->data % 4) == 0;
    if (s->mapped) return 0;
    int q4 = s->type == WEIGHT_Q4_0 || s->type == WEIGHT_Q4_1;
    s->values_at = *used; // float32 4 bytes a value, q8_0 1, q4 half a byte; then the scales (and mins)
    *used = align64(*used + (s->type == WEIGHT_F32 ? 4 * n : q4 ? n / 2 : n));
    if (s->type != WEIGHT_F32) {
        s->scales_at = *used;
        *used = align64(*used + n / 32 * (q4 ? sizeof(uint16_t) : sizeof(float)));
    }
    if (s->type == WEIGHT_Q4_1) {
        s->mins_at = *used;
        *used = align64(*used + n / 32 * sizeof(uint16_t));
    }
    return 0;
}

/* Values first .. first + n - 1 of a tensor as float32: F32, F16 and BF16
 * exactly, a quantized type (first and n whole blocks: one row) as the gguf
 * package's dequantize computes it (gguf_quants.c). */
static void to_f32(float *out, const GgufTensor *t, size_t first, size_t n) {
    const unsigned char *p = t->data;
    size_t block, bytes;
    if (gguf_quant_block(t->type, &block, &bytes)) {
        gguf_dequantize(t->type, p + first / block * bytes, n / block, out);
        return;
    }
    for (size_t k = 0, i = first; k < n; k++, i++) {
        float *o = &out[k];
        if (t->type == GGML_F32) {
            *o = read_le_f32(p + 4 * i);
        } else if (t->type == GGML_F16) {
            *o = half_to_float_c((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        } else { // BF16: the top half of a float32
            uint32_t bits = (uint32_t)(p[2 * i] | p[2 * i + 1] << 8) << 16;
            memcpy(o, &bits, 4);
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

/* Drop the process's copy of the file pages of a tensor just converted, so
 * that memory holds the converted tensor and not the file's bytes as well
 * (the page cache keeps them; peak memory is then about the converted
 * buffer). The mapping is private and never written, so a page dropped is
 * read again from the file when touched: a fused tensor's next part, or a
 * mapped neighbour sharing a page. */
static void release_pages(const GgufTensor *t) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start = (uintptr_t)t->data / page * page;
    madvise((void *)start, (uintptr_t)(t->data + t->n_bytes) - start, MADV_DONTNEED); // advice only: may fail
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
            float *dst = s->type != WEIGHT_F32 || s->mapped ? row : (float *)(buf + s->values_at) + at;
            to_f32(dst, t, (s->first_row + r) * s->cols, s->cols); // (q4 too: its values checked finite)
            long bad = not_finite(dst, s->cols);
            if (bad >= 0)
                return fail(rd->err, rd->err_len, "%s: tensor %s contains NaN or infinite values (value %zu)",
                            rd->path, name, (s->first_row + r) * s->cols + (size_t)bad);
            for (size_t g = 0; s->type == WEIGHT_Q8_0 && g < s->cols / 32; g++)
                quantize_group((int8_t *)(buf + s->values_at) + at + g * 32,
                               (float *)(buf + s->scales_at) + (at + g * 32) / 32, dst + g * 32);
            if (s->type == WEIGHT_Q4_0 || s->type == WEIGHT_Q4_1) // the row's blocks as they are, split
                gguf_q4_split(t->type, t->data + (s->first_row + r) * s->cols / 32 * (s->type == WEIGHT_Q4_1 ? 20 : 18),
                              s->cols / 32, buf + s->values_at + at / 2, (uint16_t *)(buf + s->scales_at) + at / 32,
                              (uint16_t *)(buf + s->mins_at) + at / 32);
        }
        if (!s->mapped) release_pages(t);
    }
    if (s->vec) *s->vec = values;
    if (s->mat && s->type == WEIGHT_Q8_0)
        *s->mat = (Matrix){WEIGHT_Q8_0, 32, buf + s->values_at, (const float *)(buf + s->scales_at), NULL, NULL};
    else if (s->mat && s->type != WEIGHT_F32)
        *s->mat = (Matrix){s->type, 32, buf + s->values_at, NULL, (const uint16_t *)(buf + s->scales_at),
                           s->type == WEIGHT_Q4_1 ? (const uint16_t *)(buf + s->mins_at) : NULL};
    else if (s->mat)
        *s->mat = (Matrix){WEIGHT_F32, 0, values, NULL, NULL, NULL};
    return 0;
}

/* Whether tensor name is one of the slots' (or rope_freqs, for llama). */
static int known_tensor(const Reader *rd, const Config *c, const Slot *slots, int n, GgufStr name) {
    char want[64];
    if (rd->arch->rope_freqs && gguf_str_is(name, "rope_freqs.weight")) return 1;
    for (int i = 0; i < n; i++)
        for (int l = 0; slots[i].gguf && l < (slots[i].per_layer ? c->n_layers : 1); l++) {
            snprintf(want, sizeof want, slots[i].gguf, l);
            if (gguf_str_is(name, want)) return 1;
        }
    return 0;
}

/* Every tensor in the file is one the model uses (export.py refuses the others too). */
static int check_no_extra(const Reader *rd, const Config *c, const Slot *slots, int n) {
    uint64_t used = rd->arch->rope_freqs && gguf_find_tensor(rd->g, "rope_freqs.weight") != NULL;
    for (int i = 0; i < n; i++) // a fused tensor once: its first slot
        if (slots[i].gguf && slots[i].first_row == 0) used += slots[i].per_layer ? (uint64_t)c->n_layers : 1;
    if (used == rd->g->n_tensors) return 0; // names are unique and every slot's are present
    for (uint64_t k = 0; k < rd->g->n_tensors; k++)
        if (!known_tensor(rd, c, slots, n, rd->g->tensors[k].name)) {
            char shown[96];
            return fail(rd->err, rd->err_len, "%s: unexpected tensor %s (not part of a %s model)", rd->path,
                        gguf_show(rd->g->tensors[k].name, shown, sizeof shown), rd->arch->name);
        }
    return 0;
}

/* LongRoPE's factors divide frequencies: each must be > 0 (fill_slot checked them finite), as run.c checks a
 * checkpoint's. */
static int check_rope_factors(const Reader *rd, const RopeConfig *r) {
    for (int which = 0; r->scaling == ROPE_LONGROPE && which < 2; which++)
        for (int i = 0; i < r->rot_dim / 2; i++) {
            float v = (which ? r->long_factor : r->short_factor)[i];
            if (!(v > 0.0f))
                return fail(rd->err, rd->err_len, "%s: tensor %s[%d]=%g: expected a finite value > 0", rd->path,
                            which ? "rope_factors_long.weight" : "rope_factors_short.weight", i, (double)v);
        }
    return 0;
}

/* The metadata -> config and RoPE parameters, checked as a checkpoint's header is. */
static int read_config(Reader *rd, Config *c, RopeConfig *r) {
    c->version = 2; // what export.py would write for it (run.c's validate_config checks by version)
    if (check_architecture(rd) || read_sizes(rd, c, r) || read_vocab(rd, c) || read_scaling(rd, r) ||
        read_longrope(rd, c, r) || validate_config(rd->path, c, r, rd->err, rd->err_len) || read_rope_freqs(rd, r) ||
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
    for (int i = 0; i < n; i++) // model.h's Config: wq's type when quantized, else any quantized matrix's
        if (slots[i].gguf && slots[i].type != WEIGHT_F32 &&
            (c->weight_type == WEIGHT_F32 || slots[i].mat == &t->weights.wq))
            c->weight_type = slots[i].type, c->group_size = 32;
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

/* One notice: what was converted (tensors of each type, and what each became: "copied" for F32, "kept" for
 * a type held as stored) and the memory it takes, beside what the same tensors take in the file, e.g. "(61
 * F32 copied, 1 Q8_0 -> q8_0, 210 Q4_1 kept; layers stacked): 98.3 MiB of memory (92.6 MiB in the file)". */
static void conversion_notice(const Reader *rd, const Slot *slots, int n, int n_layers, size_t used) {
    static const uint32_t types[] = {GGML_F32,  GGML_F16,  GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1,
                                     GGML_Q5_0, GGML_Q5_1, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K};
    char what[512] = "", tn[32];
    size_t len = 0;
    uint64_t in_file = 0;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++)
        for (int became = 0; became < WEIGHT_N_TYPES; became++) { // float32, q8_0, q4_0, q4_1
            int count = 0;
            for (int i = 0; i < n; i++)
                for (int l = 0; slots[i].gguf && !slots[i].mapped && !slots[i].first_row && // a fused tensor once
                                l < (slots[i].per_layer ? n_layers : 1); l++) {
                    char name[64];
                    const GgufTensor *t = slot_tensor(rd, &slots[i], l, name, sizeof name);
                    if (t->type != types[k] || slots[i].type != became) continue;
                    count++;
                    in_file += t->n_bytes;
                }
            if (count && len < sizeof what)
                len += (size_t)snprintf(what + len, sizeof what - len, "%s%d %s %s", len ? ", " : "", count,
                                        ggml_type_name(types[k], tn, sizeof tn),
                                        became == WEIGHT_Q8_0 ? "-> q8_0"
                                        : became != WEIGHT_F32 ? "kept"
                                        : types[k] == GGML_F32 ? "copied"
                                        : "-> f32");
        }
    if (used)
        notice("%s: GGUF tensors converted at load (%s; layers stacked): %.1f MiB of memory (%.1f MiB in the file)",
               rd->path, what, used / 1048576.0, in_file / 1048576.0);
}

int gguf_load_checkpoint(Transformer *t, const char *path, int fd, size_t file_size, char *err, size_t err_len) {
    memset(t, 0, sizeof *t);
    void *map = mmap(NULL, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) return fail(err, err_len, "%s: mmap failed: %s", path, strerror(errno));
    t->mapping = map;
    t->file_size = file_size;
    GgufFile g;
    Reader rd = {&g, path, err, err_len, NULL}; // arch: check_architecture sets it
    Slot slots[N_SLOTS];
    int rc = gguf_parse(&g, path, map, file_size, err, err_len);
    if (rc == 0) rc = read_config(&rd, &t->config, &t->rope);
    int n = rc == 0 ? build_slots(rd.arch, &t->config, &t->rope, &t->weights, slots) : 0;
    if (rc == 0) rc = read_weights(&rd, t, slots, n);
    if (rc == 0) rc = check_rope_factors(&rd, &t->rope);
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

int gguf_key_usage(const Transformer *t, int tokenizer, GgufKeyVisit visit, void *ctx, char *err, size_t err_len) {
    GgufFile g;
    Config c = {0}; // zeroed, as gguf_load_checkpoint's are: read_config fills what the file holds
    RopeConfig r = {0};
    unsigned char *ltok = NULL;
    size_t ltok_size;
    char note[GGUF_TOK_NOTE_BYTES], key[256];
    Reader rd = {&g, "checkpoint", err, err_len, NULL};
    int rc = gguf_parse(&g, "checkpoint", t->mapping, t->file_size, err, err_len);
    if (rc == 0) rc = read_config(&rd, &c, &r);
    if (rc == 0 && tokenizer && gguf_tokenizer_ltok(&g, &ltok, &ltok_size, note, err, err_len) == 0) free(ltok);
    for (uint64_t k = 0; rc == 0 && k < g.n_kv; k++) visit(gguf_show(g.kv[k].key, key, sizeof key), g.kv[k].looked_up, ctx);
    gguf_free(&g);
    return rc;
}
