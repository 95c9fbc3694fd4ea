/* cli.h: the command line. cli.c reads argv by one table of flags (FLAGS),
 * which also says which modes read each flag, and prints --help from it.
 */
#ifndef CLI_H
#define CLI_H

#include "run.h"

/* The modes, in -m's order. */
enum { MODE_GENERATE, MODE_CHAT, MODE_PPL, MODE_TOKENIZE, MODE_ROPE, MODE_PASSKEY, MODE_INFO, N_MODES };
extern const char *const MODE_NAMES[];

#define MAX_FLAGS 64 /* rows of cli.c's FLAGS, at most */

/* Everything the command line sets (cli.c's FLAGS fills it; parse_args sets
 * the defaults first). */
typedef struct {
    int mode;                                         // MODE_GENERATE ..
    const char *tokenizer, *prompt, *prompt_file;     // -z, -i, -f
    const char *system;                               // -y
    double temperature, topp, minp, repeat_penalty;   // -t, -p, --min-p, --repeat-penalty
    int topk, repeat_last_n, steps;                   // --top-k, --repeat-last-n, -n
    long seed;                                        // -s (default: the time; passkey: 0)
    int ctx, kv_type, threads, q8_activations;        // --ctx (0 = the training context), --kv, ...
    int gguf_convert;                                 // --gguf-convert: GGUF_KEEP | GGUF_TO_Q8_0 | GGUF_TO_F32
    int ignore_eos, json, per_position;
    int chat_template, conversation_input;            // --chat-template (CHAT_PLAIN - 1 ..), --chat
                                                      // (passkey: the prompts in the chat template)
    int pieces;                                       // tokenize --pieces
    int stride, streaming;                            // ppl
    const char *save_logits, *kl_base;                // ppl: logits files
    const char *attn_stats;                           // ppl: the attention statistics' JSON file
    const char *lengths, *depths;                     // passkey: comma-separated lists
    int trials, key_digits, prompts_only, skip_draws; // passkey
    // RoPE and position flags: position_overrides turns the given ones into a PositionOverrides
    int rope_scaling, rope_orig_ctx, rope_dynamic, se_group, se_window, sinks, window;
    double rope_base, rope_factor, yarn_beta_fast, yarn_beta_slow, rope_attn_factor, llama3_low_freq,
        llama3_high_freq;
    int help;
    unsigned char given[MAX_FLAGS]; // given[i] = 1: FLAGS[i] was on the command line
} Options;

/* Read argv into *o and return the checkpoint's path. Exits with a usage
 * error (one line naming the flag) on anything it cannot read, on a flag the
 * chosen mode does not read, and on flags that do not go together; --help
 * [MODE] prints the help and exits 0. */
const char *parse_args(int argc, char **argv, Options *o);
/* Whether flag `name` (its long name, e.g. "--ctx") was on the command line. */
int flag_given(const Options *o, const char *name);
/* The RoPE and position flags that were given. */
PositionOverrides position_overrides(const Options *o);
/* Load the tokenizer of -z, or else tokenizer.bin beside the checkpoint (or
 * ./tokenizer.bin when there is none beside it), for the model's vocabulary,
 * into tok; return its path (the caller frees it). Exits with one line naming
 * the path tried and how it was chosen on failure. */
char *load_tokenizer(Tokenizer *tok, const Options *o, const char *checkpoint, const Config *c);
/* "a|b|c" for a NULL-terminated list of names (a static buffer). */
const char *choice_list(const char *const *names);

#endif
