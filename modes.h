/* modes.h: what main (run.c) hands every mode, and each mode's entry point.
 * A mode checks its inputs, prints the load line (summary) to stderr once they
 * are good (tokenize and info, which run no model, print none), and writes
 * its results to stdout; a bad input ends it with die().
 *   generate   run.c       continue a prompt
 *   chat       chat.c      chat templates, conversation files, the chat loop
 *   tokenize   tokenize.c  token ids of a text or a conversation
 *   ppl        ppl.c       perplexity windows, streaming, error bars, KL
 *   passkey    passkey.c   passkey retrieval
 *   rope       rope_mode.c the RoPE frequencies of the settings
 *   info       info.c      what the checkpoint and its tokenizer hold
 * The reports state the run's position setup through info.c's two functions
 * below, so that the load line, the text and the JSON cannot disagree.
 */
#ifndef MODES_H
#define MODES_H

#include <math.h>
#include <stdio.h>

#include "chat.h"
#include "cli.h"
#include "run.h"

typedef struct {
    const char *checkpoint; // the checkpoint's path
    Transformer *t;        // built for the options' context and position settings
    const Tokenizer *tok;  // loaded for every mode but rope
    const char *tok_path;  // where it came from
    Sampler *sampler;      // generate and chat
    const Options *o;      // the command line
    const char *text;      // -i's text or -f's contents; "" when neither
    size_t text_len;
    const char *text_name; // -f's path, else "-i"
    const char *summary;   // the load line
} ModeInput;

void generate_mode(const ModeInput *in); // run.c
void chat_mode(const ModeInput *in);     // chat.c
void tokenize_mode(const ModeInput *in); // tokenize.c
void ppl_mode(const ModeInput *in);      // ppl.c
void passkey_mode(const ModeInput *in);  // passkey.c
void rope_mode(const ModeInput *in);     // rope_mode.c
void info_mode(const ModeInput *in);     // info.c

/* chat.c: the chat template of this run (--chat-template, else the tokenizer
 * file's), for chat, tokenize --chat and passkey --chat; exits when there is
 * none. A sentencepiece tokenizer file that cannot name one (version 1 or 2)
 * gets Llama 2's, as llama2.c's chat; then assumed_template_note writes the
 * line (starting "note: ", ending in a newline) that the mode prints once its
 * inputs are good, and "" otherwise. */
ChatTemplate mode_chat_template(const ModeInput *in);
void assumed_template_note(const ModeInput *in, char *out, size_t size);

/* passkey.c: the context -m passkey needs for its --lengths (0: none given),
 * so that main can size the model before building it. Exits on a bad list. */
int passkey_context(const Options *o);

/* info.c: the position setup of the run t (context, RoPE and the scaling
 * method with the parameters it reads, how keys get their positions,
 * Self-Extend, sinks, the sliding window, the KV cache type) as one line of
 * text into out, "ctx 512; rope neox, base 10000, rot 64; scaling yarn
 * (factor 2, ...); keys rotated-once; self-extend off; sinks off; window off;
 * KV cache f32" (no newline); and as one JSON object on stdout (no newline),
 * with null for what the run does not use. */
void position_setup_text(char *out, size_t size, const Transformer *t);
void print_position_json(const Transformer *t);
/* info.c: when t runs Self-Extend (and no scaling method) with a group size
 * G and window W that leave relative positions past the training length L
 * (the RoPE's original context) for its context, a notice that states the
 * rule, ctx <= G (L - W) + G floor(W/G), and the smallest G that fits. */
void self_extend_notice(const Transformer *t);
/* info.c: the magnitude mscale t's RoPE table carries (YaRN's and LongRoPE's
 * attention factor; 1 for the other methods). */
double rope_magnitude(const Transformer *t);

/* tokenize.c: piece bytes s[0..n) in double quotes, readably: well-formed
 * UTF-8 as it is; \" \\ \n \t \r escaped; every other control byte and every
 * byte that is not UTF-8 as \xHH. PIECE_KIND_NAMES: index = PIECE_NORMAL ... */
void print_piece(FILE *out, const char *s, size_t n);
extern const char *const PIECE_KIND_NAMES[];

/* JSON output the reports share. v as a number (6 digits after the point), or
 * null when it is not finite (JSON has no inf or nan). */
static inline void print_json_number(double v) {
    if (isfinite(v)) printf("%.6f", v);
    else printf("null");
}

/* "key": v, and a ", " after it; null when v is not finite. */
static inline void print_json_field(const char *key, double v) {
    if (isfinite(v)) printf("\"%s\": %.9g, ", key, v);
    else printf("\"%s\": null, ", key);
}

static inline void print_json_string(const char *s) {
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if (*p < 0x20) printf("\\u%04x", *p);
        else putchar(*p);
    }
    putchar('"');
}

#endif
