/* run.h: what the modes (chat.c, ppl.c, passkey.c, tokenize.c, rope_mode.c),
 * the command line (cli.c) and the tests use from run.c: the Transformer and
 * its settings, the forward pass, the sampler and the decode step that
 * generate and chat share. run.c defines everything declared here, in the same
 * order; read it there.
 */
#ifndef RUN_H
#define RUN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels.h"
#include "messages.h"
#include "model.h"
#include "tokenizer.h"

#define PI 3.14159265358979323846 /* M_PI is not in strict C11 */

/* ---- 1. The model in memory ---------------------------------------------- */

/* Sanity limits on header values: far above any model this program can run on
 * a CPU, low enough that every size below fits in 64 bits without overflow. */
#define MAX_DIM (1 << 16)
#define MAX_HIDDEN (1 << 18)
#define MAX_LAYERS 1024
#define MAX_VOCAB (1 << 22)
#define MAX_CTX (1 << 24)

/* Tokens one forward_block call carries (prompt prefill, ppl windows); every
 * weight row loaded from memory then serves this many tokens, and attention
 * reads each cached key once per tile of 128 queries (kernels.c). Measured on
 * a 2-core AVX-512 VM, 2 threads: 128 against 32 gives 1.4x the prompt rate
 * of a 110M-shaped model and 1.6x ppl --ctx 8192 on a 15M one; 256 was no
 * faster than 128, and its logits take twice the memory (B x vocab_size). */
#define FORWARD_BLOCK 128

/* How keys get their positions (run.c's rope_stage; docs/rope.md §11). Set
 * once, when the model is built, from the position settings. */
typedef enum {
    KEYS_ROTATED_ONCE, // (a) every method: a key is rotated as it enters the cache and keeps that rotation
    KEYS_PER_LENGTH,   // (b) --rope-dynamic exact with dynamic NTK or LongRoPE: the cache holds keys
                       //     before RoPE, each rotated anew for each query's sequence length
    KEYS_SELF_EXTEND,  // (c) --self-extend G W: keys before RoPE; a key W or more tokens back is also
                       //     rotated at its group position
    KEYS_SINKS,        // (d) --sinks: a rolling cache of keys before RoPE, each rotated at its place in it
                       //     (a block: at its distance to each query)
} KeyStrategy;

/* Run-time position settings: chosen on the command line, never stored in a
 * checkpoint (except the sliding window, which a checkpoint may carry). */
typedef struct {
    int dynamic_exact;      // dynamic NTK and LongRoPE: 1 = every key rotated for the current length
                            // (--rope-dynamic exact), 0 = each keeps the rotation it got (Hugging Face)
    int se_group;           // Self-Extend group size G; 0 = off
    int se_window;          // Self-Extend neighbour window W, in tokens
    int n_sinks;            // attention sinks: the first n_sinks tokens stay in the rolling cache
                            // (KEYS_SINKS only)
    int window;             // sliding window: a query sees the `window` most recent positions; 0 = all
    int window_first_layer; // layers l >= this one use the window
} PositionSettings;

/* Command-line values that replace the checkpoint's RoPE parameters or set
 * the position settings. A field applies only when `given` is 1. */
typedef struct { int given; int value; } IntSetting;
typedef struct { int given; double value; } RealSetting;
typedef struct {
    IntSetting scaling, orig_ctx;  // --rope-scaling (ROPE_NONE ..), --rope-orig-ctx
    RealSetting base, factor;      // --rope-base, --rope-factor
    RealSetting beta_fast, beta_slow, attn_factor, low_freq, high_freq; // --yarn-*, --rope-attn-factor, --llama3-*
    IntSetting dynamic_exact;      // --rope-dynamic hf|exact
    IntSetting se_group, se_window; // --self-extend G W (given together)
    IntSetting sinks;              // --sinks n
    IntSetting window;             // --window W: every layer; 0 = none
    const char *ctx_flag;          // the flag that set the context when --ctx did not (passkey: "--lengths"),
                                   // for the messages; NULL: --ctx
} PositionOverrides;

/* Attention statistics a ppl run collects (attn_stats.h), or none. */
typedef struct AttnStats AttnStats;

/* Activations for a block of B <= FORWARD_BLOCK tokens, the KV cache and the
 * RoPE table. Owned by Transformer; allocated in build_transformer (run.c,
 * section 3), freed in free_transformer. */
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
    float *attn_tiles;  // (threads, attention_block_floats(head_size, n_heads / n_kv_heads)) attention_block's
                        // scratch, B > 1 or sinks
    float *logits;      // (B, vocab_size)
    void *key_cache;    // (n_layers, n_ctx, kv_dim) float32, IEEE half or q8_0 blocks (--kv; kernels.h); keys
                        // rotated, or before RoPE for every strategy but KEYS_ROTATED_ONCE
    void *value_cache;  // (n_layers, n_ctx, kv_dim) of the same type
    MatmulScratch mm;   // matmul's scratch (kernels.h)
    float *rope_cos;    // (table_rows, n_pairs) mscale * cos(pos * inv_freq[i]); n_pairs = rot_dim/2
    float *rope_sin;    // (table_rows, n_pairs) mscale * sin(pos * inv_freq[i])
    double *inv_freq;   // (n_pairs) scratch for rebuilding table rows
    float *q_second;    // (B, dim) the queries rotated a second way: Self-Extend's group positions, or a
                        // block's places in the rolling cache of sinks
    float *key_rot;     // (table_rows, kv_dim) keys before RoPE only: one layer's keys rotated for
                        // this step, float32 whatever the cache's type
    float *key_grouped; // (n_ctx, kv_dim) Self-Extend: one layer's keys rotated at their group positions
    float *value_rows;  // (table_rows, kv_dim) sinks, a block: one layer's values in key_rot's order
    float *frame_rows;  // exact dynamic NTK, a block: 2 B (ATT_KEYS + n_coarse) n_pairs, each query's rows
    QueryFrames frames; //   of its own table, and `frames` points into them (kernels.h has the layout)
    double *frame_freq; // (B, n_pairs) the frames' inverse frequencies, one set per query
    AttnStats *attn_stats; // ppl --attn-stats: each query's statistics go there (owned by ppl.c); NULL = none
} RunState;

typedef struct {
    Config config;
    RopeConfig rope;      // the checkpoint's RoPE parameters, with the command line's overrides
    PositionSettings pos; // run-time position settings
    KeyStrategy keys;     // how keys get their positions (from rope and pos, at build time)
    int n_ctx;            // positions this run can hold (KV cache and table rows)
    int table_rows;       // rows of the RoPE table: n_ctx, and with sinks in blocks FORWARD_BLOCK - 1 more
    int table_len;        // KEYS_PER_LENGTH: the sequence length the table rows were built for
    int kv_type;          // KV_F32 | KV_F16 | KV_Q8_0: what key_cache and value_cache hold (--kv)
    Weights weights;
    RunState state;
    void *mapping;        // the whole checkpoint file, mmap'd read-only
    size_t file_size;
    void *converted;      // a GGUF's tensors converted at load (gguf_model.c), one allocation; NULL otherwise
    size_t converted_size;
} Transformer;

/* Names as the command line and the outputs spell them (index = ROPE_NONE ..,
 * ROPE_INTERLEAVED .., KV_F32 .., WEIGHT_F32 .., PositionSettings.dynamic_exact,
 * KEYS_ROTATED_ONCE ..; NULL ends a list of choices). */
extern const char *const SCALING_NAMES[];
extern const char *const LAYOUT_NAMES[];
extern const char *const KV_NAMES[];
extern const char *const WEIGHT_NAMES[];
extern const char *const GGUF_CONVERT_NAMES[]; // --gguf-convert's choices (gguf.h's GGUF_TO_F32 ..)
extern const char *const DYNAMIC_NAMES[];
extern const char *const KEY_NAMES[];

/* Checkpoint loading (run.c, section 1); the three below it are for the tests. */
int load_checkpoint(Transformer *t, const char *path, char *err, size_t err_len);
int parse_header(const char *path, const unsigned char *h, size_t n_read, Config *c, RopeConfig *r, char *err,
                 size_t err_len);
size_t place_tensors(const Config *c, RopeConfig *r, Weights *w, const char *map);
size_t expected_file_size(const Config *c, const RopeConfig *r);

/* ---- 2. RoPE ------------------------------------------------------------- */

void rope_frequencies(const RopeConfig *r, int cur_len, double *inv_freq, double *mscale);
void rope_fill_table(float *cos_out, float *sin_out, int first_row, int n_rows, const double *inv_freq, int n_pairs,
                     double mscale);
void rope(float *vec, const float *cos, const float *sin, int B, int n_heads, int head_size, int rot_dim, int layout);
/* Whether the frequencies depend on the sequence length (dynamic NTK, LongRoPE). */
int rope_length_dependent(const RopeConfig *r);
/* Rows [first, first + n) of t's table, for a sequence of length len. */
void rope_build_rows(Transformer *t, int len, int first, int n);

/* The cache as attention reads it for a block, as the RoPE stage left it:
 * rows of keys and of values, and where the block's queries sit among them.
 * Query b sits at row pos0 + b and sees the rows up to it (the last `window`
 * of them with a window, and the sinks' rows whatever the window). */
typedef struct {
    const void *keys;       // (rows, kv_dim) of one layer: rotated keys; with frames, keys before RoPE
    int key_type;           // KV_F32 | KV_F16 | KV_Q8_0
    const void *values;     // (rows, kv_dim) of one layer, the values of the same rows
    int value_type;         // KV_F32 | KV_F16 | KV_Q8_0
    int pos0;               // the row of the block's first query
    int window;             // a query sees this many most recent rows (itself included); 0 = all
    SecondQueries second;   // Self-Extend's grouped pairs, or the sinks; q NULL = none (kernels.h)
    const QueryFrames *frames; // exact dynamic NTK, a block: q and keys unrotated, rotated per query
                               // (kernels.h); NULL = rotated already
} CacheView;

/* ---- 3. Building the model ----------------------------------------------- */

/* What build_transformer returns besides 0. */
enum { BUILD_BAD_INPUT = -1, BUILD_BAD_SETTINGS = -2 };
int build_transformer(Transformer *t, const char *path, const PositionOverrides *overrides, int n_ctx, int kv_type,
                      char *err, size_t err_len);
/* build_transformer without the run state (KV cache, activations, RoPE
 * table): for the modes that run no model. */
int configure_transformer(Transformer *t, const char *path, const PositionOverrides *overrides, int n_ctx,
                          int kv_type, char *err, size_t err_len);
void free_transformer(Transformer *t);
int block_limit(const Transformer *t);
/* Bytes the KV cache takes per position: a key and a value row of every
 * layer, of kv_type (KV_F32 ..; -m info, the load line and the JSON reports
 * say it); 0 for a q8_0 cache the model's kv_dim cannot hold. */
size_t kv_position_bytes(const Transformer *t, int kv_type);

/* ---- 4. Ops -------------------------------------------------------------- */

void rmsnorm(float *out, const float *x, const float *w, int B, int n, float eps);
void matmul_reference(float *out, const float *x, const float *w, int B, int n, int d);
void softmax(float *x, int n);
void attention(float *out, const float *q, const CacheView *view, int B, Transformer *t);
void swiglu(float *hb, const float *hb2, int n);
void residual_add(float *x, const float *y, int n);

/* ---- 5. Forward ---------------------------------------------------------- */

/* Which logits forward_block computes: the classifier is the largest matrix
 * (vocab_size rows), so a prompt block that only fills the cache skips it. */
typedef enum { LOGITS_NONE, LOGITS_LAST, LOGITS_ALL } LogitsWanted;
/* What forward_block returns besides 0. */
enum { FORWARD_DOES_NOT_FIT = -1, FORWARD_NOT_FINITE = -2 };

int forward_block(Transformer *t, const int *tokens, int B, int pos0, LogitsWanted want);
float *forward(Transformer *t, int token, int pos, int *status);
float *prefill(Transformer *t, const int *tokens, int n, int pos0, int *status);
void forward_failed(const Transformer *t, int status, int token, int pos) __attribute__((noreturn));

/* ---- 6. Sampler ---------------------------------------------------------- */

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

uint32_t random_u32(uint64_t *state); // xorshift64*
float random_f32(uint64_t *state);   // uniform in [0, 1)
int build_sampler(Sampler *s, int vocab_size, float temperature, float topp, int topk, float minp,
                  float repeat_penalty, int repeat_last_n, uint64_t seed);
void free_sampler(Sampler *s);
int argmax(const float *x, int n);
void apply_repetition_penalty(Sampler *s, float *logits, const int *history, int n);
int sample(Sampler *s, float *logits, const int *history, int n);

/* ---- 7. Generate, and the decode step chat shares ------------------------- */

/* Bytes of text encoded in one piece; longer texts go in pieces of this size
 * (tokenizer_encode_long: the same ids, memory that follows the ids). */
#define ENCODE_PIECE ((size_t)1 << 20)
/* text's ids (BOS first when add_bos) in a new array; exits with a message
 * naming `what` (the input) when memory runs out. */
int *encode_or_die(const Tokenizer *tok, const char *what, const char *text, size_t len, int add_bos,
                   int *n_out);
char *tokens_text(const Tokenizer *tok, const int *ids, int n, int prev, size_t *len);

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

void decoder_init(Decoder *d, Transformer *t, const Tokenizer *tok, Sampler *sampler, int capacity);
void decoder_free(Decoder *d);
void end_text(Decoder *d);
int decode_step(Decoder *d, float *logits, const int *end, int n_end);

#endif
