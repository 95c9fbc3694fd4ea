/* cli.c: the command line. One table, FLAGS, drives everything: the parser,
 * the range checks, which modes read each flag (a flag the chosen mode does
 * not read is refused), and the help (--help: an overview; --help MODE: that
 * mode's flags). main (run.c) calls parse_args, then position_overrides.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chat.h"
#include "cli.h"
#include "gguf.h"
#include "gguf_tokenizer.h"
#include "filekind.h"

const char *const MODE_NAMES[] = {"generate", "chat", "ppl", "tokenize", "rope", "passkey", "info", NULL};
static const char *const MODE_HELP[] = {
    "continue a prompt (the default)",
    "talk with an instruct model: a turn per line (\\ or \"\"\" for more), Ctrl-C stops a reply",
    "perplexity of a text file, by position; every RoPE method, sinks, KL",
    "print the token ids of a text, or of a conversation (--chat)",
    "print the RoPE frequencies of the settings",
    "find a key hidden in filler text, by prompt length and depth",
    "what the checkpoint and its tokenizer hold: shapes, RoPE, tokens, template",
};
static const char *const ACTIVATION_NAMES[] = {"f32", "int8", NULL}; // MatmulScratch.int8_blocks = 0, 1

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

/* Which modes read a flag: a bit per mode. */
#define GEN (1u << MODE_GENERATE)
#define CHAT (1u << MODE_CHAT)
#define PPL (1u << MODE_PPL)
#define TOK (1u << MODE_TOKENIZE)
#define ROPE (1u << MODE_ROPE)
#define PASS (1u << MODE_PASSKEY)
#define INFO (1u << MODE_INFO)
#define ALL (GEN | CHAT | PPL | TOK | ROPE | PASS | INFO)
#define MODEL (GEN | CHAT | PPL | PASS) /* the modes that run the model */

/* One row per flag: the help text, the parser, the range checks and the mode
 * check all read this table, so they cannot disagree. */
typedef struct {
    const char *name, *alias; // e.g. "--top-k", "-k" (alias may be NULL)
    unsigned modes;           // the modes that read it (GEN | CHAT ...)
    ValueKind kind;
    double lo, hi;            // the accepted range of INT, LONG, REAL and PAIR: [lo, hi], or (lo, hi]
                              // when lo is EXCLUSIVE; hi = NO_MAX: only the type's limit
    size_t field;             // offsetof(Options, ...)
    const char *const *choices;
    const char *value, *help; // how the help names the value, and what the flag does
} Flag;

_Static_assert(offsetof(Options, se_window) == offsetof(Options, se_group) + sizeof(int),
               "--self-extend G W fills se_group and the int after it");
#define FIELD(f) offsetof(Options, f)
#define NO_MAX 1e300            // no upper limit but the field's type
#define EXCLUSIVE(lo) (-(lo))   // a REAL lower bound lo > 0 that is excluded (--rope-base > 1)
static const Flag FLAGS[] = {
    {"-m", NULL, ALL, CHOICE, 0, 0, FIELD(mode), MODE_NAMES, "<mode>", "what to do, default generate"},
    {"-z", NULL, ALL & ~ROPE, TEXT, 0, 0, FIELD(tokenizer), NULL, "<file>",
     "tokenizer file, or a GGUF (its vocabulary); default: a GGUF checkpoint's own,\n"
     "else tokenizer.bin beside the checkpoint, else ./tokenizer.bin"},
    {"--gguf-convert", NULL, ALL, CHOICE, 0, 0, FIELD(gguf_convert), GGUF_CONVERT_NAMES, "<type>",
     "what a GGUF's quantized tensors (Q8_0, Q4_0 .. Q6_K) become at load:\n"
     "native (default: Q4_0 and Q4_1 run as stored, the others become q8_0),\n"
     "q8_0 (every one), or f32: the values as dequantized, 4x the memory"},
    {"--ctx", "-c", ALL & ~(TOK | INFO), INT, 1, MAX_CTX, FIELD(ctx), NULL, "<int>",
     "context length; default the training context; may exceed it"},
    {"--threads", NULL, MODEL, INT, 1, 1024, FIELD(threads), NULL, "<int>",
     "OpenMP threads; default OMP_NUM_THREADS, else one per core"},
    {"--help", "-h", ALL, SWITCH, 0, 0, FIELD(help), NULL, "[mode]", "this overview; --help MODE: MODE's options"},
    {"-i", NULL, GEN | CHAT | TOK, TEXT, 0, 0, FIELD(prompt), NULL, "<text>", "prompt"},
    {"-f", NULL, GEN | CHAT | TOK | PPL | PASS, TEXT, 0, 0, FIELD(prompt_file), NULL, "<file>",
     "prompt read from a file (ppl: the text to score; passkey: the filler)"},
    {"-n", NULL, GEN | CHAT, INT, 0, NO_MAX, FIELD(steps), NULL, "<int>",
     "maximum NEW tokens, default 256 (the prompt does not count)"},
    {"-t", NULL, GEN | CHAT, REAL, 0, 100, FIELD(temperature), NULL, "<float>",
     "temperature, default 1.0; 0 = greedy argmax"},
    {"-p", NULL, GEN | CHAT, REAL, 0, 1, FIELD(topp), NULL, "<float>",
     "top-p, default 0.9; 1 = off, 0 = the most likely token"},
    {"--top-k", "-k", GEN | CHAT, INT, 0, NO_MAX, FIELD(topk), NULL, "<int>",
     "keep the k most likely tokens, default 0 = off"},
    {"--min-p", NULL, GEN | CHAT, REAL, 0, 1, FIELD(minp), NULL, "<float>", "min-p, default 0 = off"},
    {"--repeat-penalty", NULL, GEN | CHAT, REAL, 1e-3, 1e3, FIELD(repeat_penalty), NULL, "<float>",
     "default 1.0 = off"},
    {"--repeat-last-n", NULL, GEN | CHAT, INT, 0, NO_MAX, FIELD(repeat_last_n), NULL, "<int>",
     "tokens the penalty looks back over, default 64"},
    {"-s", NULL, GEN | CHAT | PASS, LONG, 0, NO_MAX, FIELD(seed), NULL, "<int>",
     "seed, default: the time (passkey: 0); the same seed, the same text"},
    {"--ignore-eos", NULL, GEN | CHAT, SWITCH, 0, 0, FIELD(ignore_eos), NULL, "",
     "keep going past stop tokens (EOS, end of turn), for benchmarks"},
    {"-y", NULL, CHAT, TEXT, 0, 0, FIELD(system), NULL, "<text>", "system prompt"},
    {"--chat-template", NULL, CHAT | TOK | PASS, CHOICE, 0, 0, FIELD(chat_template), CHAT_TEMPLATE_NAMES + 1, "<name>",
     "how turns are written, default the tokenizer's (or GGUF's)"},
    {"--chat", NULL, CHAT | TOK | PASS, SWITCH, 0, 0, FIELD(conversation_input), NULL, "",
     "-f / -i is a conversation, one \"role: text\" per line (role system,\n"
     "user or assistant; \\n for a newline): tokenize prints the ids the chat\n"
     "template renders it to, chat continues it; passkey: each prompt is the\n"
     "one user turn of the chat template, the answer the assistant's reply"},
    {"--pieces", NULL, TOK, SWITCH, 0, 0, FIELD(pieces), NULL, "",
     "print each id with its piece (escaped text), one per line; with\n"
     "neither -i nor -f, every piece of the vocabulary"},
    {"--stride", NULL, PPL, INT, 1, MAX_CTX, FIELD(stride), NULL, "<int>",
     "text tokens between window starts, default ctx - 1"},
    {"--streaming", NULL, PPL, SWITCH, 0, 0, FIELD(streaming), NULL, "",
     "score the text as one stream through the rolling cache of --sinks,\n"
     "NLL by absolute position"},
    {"--per-position", NULL, PPL, SWITCH, 0, 0, FIELD(per_position), NULL, "",
     "with --json: add the mean NLL at every in-window position"},
    {"--save-logits", NULL, PPL, TEXT, 0, 0, FIELD(save_logits), NULL, "<file>",
     "save every scored token's logits (4 bytes x vocab each) as a baseline\n"
     "(a file: - is refused, stdout carries the report)"},
    {"--kl-base", NULL, PPL, TEXT, 0, 0, FIELD(kl_base), NULL, "<file>",
     "compare with a saved baseline: KL divergence, delta NLL, top-1 agreement"},
    {"--attn-stats", NULL, PPL, TEXT, 0, 0, FIELD(attn_stats), NULL, "<file>",
     "write attention statistics as JSON: per layer and head, the entropy by\n"
     "query position and the mass by query-key distance (NLL buckets), over\n"
     "every scored query (tallied inside the attention's blocks); a file: -\n"
     "is refused, stdout carries the report"},
    {"--lengths", NULL, PASS, TEXT, 0, 0, FIELD(lengths), NULL, "<list>",
     "prompt lengths in tokens, comma-separated; default the training\n"
     "context less the answer's tokens"},
    {"--depths", NULL, PASS, TEXT, 0, 0, FIELD(depths), NULL, "<list>",
     "where the key sits, fractions of the filler; default 0,0.25,0.5,0.75,1"},
    {"--trials", NULL, PASS, INT, 1, 100000, FIELD(trials), NULL, "<int>", "random keys per cell, default 5"},
    {"--key-digits", NULL, PASS, INT, 1, 18, FIELD(key_digits), NULL, "<int>", "digits of a key, default 5"},
    {"--skip-draws", NULL, PASS, INT, 0, 100000000, FIELD(skip_draws), NULL, "<int>",
     "draw and drop n trials' keys first: with --trials 1, trial n of a\n"
     "longer run (counted over its lengths, depths, trials) alone"},
    {"--prompts-only", NULL, PASS, SWITCH, 0, 0, FIELD(prompts_only), NULL, "",
     "print the prompts and their token counts; run nothing (no KV cache,\n"
     "and no --ctx check)"},
    {"--json", NULL, PPL | ROPE | PASS | INFO, SWITCH, 0, 0, FIELD(json), NULL, "", "machine-readable output"},
    {"--rope-scaling", NULL, MODEL | ROPE, CHOICE, 0, 0, FIELD(rope_scaling), SCALING_NAMES, "<method>",
     "RoPE scaling, default the checkpoint's"},
    {"--rope-factor", NULL, MODEL | ROPE, REAL, 1, 1e6, FIELD(rope_factor), NULL, "<float>",
     "scale s; needs a scaling method (the checkpoint's, or --rope-scaling)"},
    {"--rope-base", NULL, MODEL | ROPE, REAL, EXCLUSIVE(1), 1e12, FIELD(rope_base), NULL, "<float>",
     "RoPE base (theta); default the checkpoint's (legacy: 10000)"},
    {"--rope-orig-ctx", NULL, MODEL | ROPE, INT, 1, MAX_CTX, FIELD(rope_orig_ctx), NULL, "<int>",
     "original context L the scaling uses; default the training context"},
    {"--yarn-beta-fast", NULL, MODEL | ROPE, REAL, 1e-6, 1e6, FIELD(yarn_beta_fast), NULL, "<float>",
     "default 32"},
    {"--yarn-beta-slow", NULL, MODEL | ROPE, REAL, 1e-6, 1e6, FIELD(yarn_beta_slow), NULL, "<float>", "default 1"},
    {"--rope-attn-factor", "--yarn-attn-factor", MODEL | ROPE, REAL, 1e-6, 1e3, FIELD(rope_attn_factor), NULL,
     "<float>",
     "YaRN's and LongRoPE's magnitude mscale: Hugging Face's attention_factor,\n"
     "not llama.cpp's multiplier; default the checkpoint's, else from s:\n"
     "YaRN 0.1 ln s + 1, LongRoPE sqrt(1 + ln s / ln L)"},
    {"--llama3-low-freq", NULL, MODEL | ROPE, REAL, 1e-6, 1e6, FIELD(llama3_low_freq), NULL, "<float>",
     "default 1"},
    {"--llama3-high-freq", NULL, MODEL | ROPE, REAL, 1e-6, 1e6, FIELD(llama3_high_freq), NULL, "<float>",
     "default 4"},
    {"--rope-dynamic", NULL, MODEL | ROPE, CHOICE, 0, 0, FIELD(rope_dynamic), DYNAMIC_NAMES, "<kind>",
     "dynamic NTK and LongRoPE: hf (default) = each key keeps the rotation it\n"
     "got when it arrived, as Hugging Face; exact = every key re-rotated for the\n"
     "current length (a pre-RoPE key cache)"},
    {"--self-extend", NULL, MODEL | ROPE, PAIR, 1, MAX_CTX, FIELD(se_group), NULL, "<G> <W>",
     "Self-Extend: a key W or more tokens back takes the grouped position\n"
     "floor(its position / G) (group size G, neighbour window W); a pre-RoPE\n"
     "key cache"},
    {"--sinks", NULL, GEN | PPL | PASS | ROPE, INT, 0, MAX_CTX - 1, FIELD(sinks), NULL, "<n>",
     "attention sinks (StreamingLLM): a rolling cache of --ctx tokens that keeps\n"
     "the first n and evicts the oldest of the rest, positions by place in the\n"
     "cache; generation goes on past --ctx; 0 = a plain sliding window"},
    {"--window", NULL, MODEL | ROPE, INT, 0, MAX_CTX, FIELD(window), NULL, "<n>",
     "sliding-window attention in every layer: a query sees the n most recent\n"
     "positions, itself included; 0 = none; default the checkpoint's"},
    {"--kv", NULL, MODEL | ROPE, CHOICE, 0, 0, FIELD(kv_type), KV_NAMES, "<type>",
     "KV cache element type, default f32; f16 halves it; q8_0 (blocks of 32,\n"
     "kv_dim a multiple of 32) takes 9/32 of it"},
    {"--q8-activations", NULL, MODEL, CHOICE, 0, 0, FIELD(q8_activations), ACTIVATION_NAMES, "<type>",
     "q8_0 weights: how prompts and ppl windows multiply them, default f32\n"
     "(float32 activations); int8 quantizes the activations as generation,\n"
     "llama.cpp and llama2.c do: a little less accurate, faster prompts on\n"
     "CPUs with VNNI (slower on others)"},
};
#undef FIELD
#define N_FLAGS (sizeof FLAGS / sizeof FLAGS[0])
_Static_assert(N_FLAGS <= MAX_FLAGS, "Options.given needs a slot per flag");

const char *choice_list(const char *const *names) {
    static char list[200];
    list[0] = '\0';
    for (int i = 0; names[i]; i++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", i ? "|" : "", names[i]);
    }
    return list;
}

/* A flag's accepted range as the help and its error messages print it:
 * "[0, 1]", "(1, 1e+12]", or ">= 0" when only the type limits it; "" for no
 * number. */
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

/* The modes that read f, as "ppl, passkey". */
static const char *mode_list(const Flag *f) {
    static char list[120];
    list[0] = '\0';
    for (int m = 0; m < N_MODES; m++)
        if (f->modes & (1u << m)) {
            size_t used = strlen(list);
            snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "", MODE_NAMES[m]);
        }
    return list;
}

/* The row of flag `name` (its name or alias), or NULL. */
static const Flag *find_flag(const char *name) {
    for (size_t j = 0; j < N_FLAGS; j++)
        if (!strcmp(name, FLAGS[j].name) || (FLAGS[j].alias && !strcmp(name, FLAGS[j].alias))) return &FLAGS[j];
    return NULL;
}

/* One flag's help entry: the flag, its value, what it does, then its choices
 * or its range. */
static void flag_help(FILE *out, const Flag *f) {
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

/* --help: the modes and the flags every mode reads; --help MODE (mode >= 0):
 * every flag that mode reads. */
static void usage(FILE *out, int mode) {
    if (mode >= 0) {
        fprintf(out, "Usage: run <checkpoint> -m %s [options]   (%s)\n", MODE_NAMES[mode], MODE_HELP[mode]);
        for (size_t i = 0; i < N_FLAGS; i++)
            if (FLAGS[i].modes & (1u << mode)) flag_help(out, &FLAGS[i]);
        return;
    }
    static const char *const common[] = {"-m", "-z", "--ctx", "--threads", "--help"}; // the overview's flags
    fprintf(out, "Usage: run <checkpoint> [-m mode] [options]\nModes:\n");
    for (int m = 0; m < N_MODES; m++) fprintf(out, "  %-10s %s\n", MODE_NAMES[m], MODE_HELP[m]);
    fprintf(out, "Common options (run --help MODE lists every option MODE reads):\n");
    for (size_t i = 0; i < sizeof common / sizeof common[0]; i++) flag_help(out, find_flag(common[i]));
    fprintf(out, "Weights: float32 or q8_0, as the checkpoint says (export.py --dtype); a GGUF's\n"
                 "Q4_0 and Q4_1 run as stored, its other quantized ones become q8_0 at load\n"
                 "(--gguf-convert q8_0: all of them; f32: float32).\n"
                 "Exit status: 0 ok, 1 bad input or runtime failure, 2 bad usage.\n"
                 "Examples:\n"
                 "  run models/model.bin -i \"It was a dark and stormy night\" -t 0.8 -n 200\n"
                 "  run models/model.bin -m ppl -f book.txt --ctx 1024 --rope-scaling yarn --rope-factor 4\n"
                 "  run models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf -m chat\n");
}

/* Strict number parsing: the whole string must be a number in f's range. */
static long parse_long(const char *flag, const char *s, const Flag *f) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno == ERANGE || v < f->lo || (f->hi != NO_MAX && v > f->hi) ||
        (f->kind == INT && v > INT_MAX))
        die(EXIT_USAGE, "%s %s: expected an integer %s%s", flag, shown_path(s), f->hi == NO_MAX ? "" : "in ",
            range_text(f));
    return v;
}
static double parse_real(const char *flag, const char *s, const Flag *f) {
    char *end;
    errno = 0;
    double v = strtod(s, &end), lo = f->lo < 0 ? -f->lo : f->lo;
    if (end == s || *end != '\0' || errno == ERANGE || !(f->lo < 0 ? v > lo : v >= lo) || !(v <= f->hi))
        die(EXIT_USAGE, "%s %s: expected a number %s%s", flag, shown_path(s), f->hi == NO_MAX ? "" : "in ",
            range_text(f));
    return v;
}

int flag_given(const Options *o, const char *name) {
    const Flag *f = find_flag(name);
    return f && o->given[f - FLAGS];
}

/* A PAIR flag (--self-extend G W) needs both values: the arguments after it
 * up to the end, or up to the next flag, must be at least two. Exits with a
 * usage error that says so otherwise (rather than reading a flag as W). */
static void check_pair_given(const Flag *f, int argc, char **argv, int i) {
    int n = 0;
    while (n < 2 && i + 1 + n < argc && !find_flag(argv[i + 1 + n])) n++;
    if (n == 2) return;
    die(EXIT_USAGE, "%s%s%s: needs two values, G and W (the group size and the neighbour window, e.g. %s 32 128); "
        "got %s", f->name, n ? " " : "", n ? shown_path(argv[i + 1]) : "", f->name, n ? "G alone" : "neither");
}

/* Read one flag's value(s) from argv[*i + 1 ..] into its field; advances *i. */
static void read_value(const Flag *f, int argc, char **argv, int *i, Options *o) {
    const char *a = argv[*i];
    char *field = (char *)o + f->field;
    int n_values = f->kind == PAIR ? 2 : 1;
    if (f->kind == PAIR) check_pair_given(f, argc, argv, *i);
    if (*i + n_values >= argc)
        die(EXIT_USAGE, "%s: missing value (expected %s; see --help)", a,
            f->kind == CHOICE ? choice_list(f->choices) : f->value);
    const char *v = argv[++*i];
    switch (f->kind) {
    case INT: *(int *)field = (int)parse_long(a, v, f); break;
    case LONG: *(long *)field = parse_long(a, v, f); break;
    case REAL: *(double *)field = parse_real(a, v, f); break;
    case TEXT: *(const char **)field = v; break;
    case CHOICE: {
        int k = 0;
        while (f->choices[k] && strcmp(v, f->choices[k])) k++;
        if (!f->choices[k]) die(EXIT_USAGE, "%s %s: expected one of %s", a, shown_path(v), choice_list(f->choices));
        *(int *)field = k;
        break;
    }
    case PAIR: // --self-extend G W: consecutive int fields
        ((int *)field)[0] = (int)parse_long("--self-extend G", v, f);
        ((int *)field)[1] = (int)parse_long("--self-extend W", argv[++*i], f);
        break;
    case SWITCH: break;
    }
}

/* Flags that the mode reads but that need, or exclude, another one. */
static void check_combinations(const Options *o) {
    int ppl = o->mode == MODE_PPL;
    if (o->prompt && o->prompt_file) die(EXIT_USAGE, "-i and -f: give the prompt one way, not both");
    if (ppl && !o->prompt_file) die(EXIT_USAGE, "-m ppl: needs -f <text file> to score");
    if (o->streaming && !flag_given(o, "--sinks"))
        die(EXIT_USAGE, "--streaming: needs a rolling cache (--sinks n)");
    if (o->streaming && flag_given(o, "--stride")) die(EXIT_USAGE, "--stride: windows are not used with --streaming");
    if (ppl && flag_given(o, "--sinks") && !o->streaming)
        die(EXIT_USAGE, "--sinks: -m ppl reads it only with --streaming");
    if (o->per_position && !o->json) die(EXIT_USAGE, "--per-position: only used with --json");
    const char *out_flags[] = {"--save-logits", "--attn-stats"}, *out_paths[] = {o->save_logits, o->attn_stats};
    for (int k = 0; k < 2; k++) // "-" would be a file named "-": stdout carries ppl's report
        if (out_paths[k] && !strcmp(out_paths[k], "-"))
            die(EXIT_USAGE, "%s -: expected a file path (stdout carries ppl's report; ./- names a file \"-\")",
                out_flags[k]);
    if (o->attn_stats && o->save_logits && !strcmp(o->attn_stats, o->save_logits))
        die(EXIT_USAGE, "--attn-stats %s: is also the --save-logits file; give each its own path",
            shown_path(o->attn_stats));
    if (o->conversation_input && o->mode != MODE_PASSKEY && !o->prompt && !o->prompt_file)
        die(EXIT_USAGE, "--chat: needs the conversation, with -f or -i");
    if ((o->mode == MODE_TOKENIZE || o->mode == MODE_PASSKEY) && flag_given(o, "--chat-template") &&
        !o->conversation_input)
        die(EXIT_USAGE, "--chat-template: -m %s reads it only with --chat", MODE_NAMES[o->mode]);
}

const char *parse_args(int argc, char **argv, Options *o) {
    *o = (Options){.temperature = 1.0, .topp = 0.9, .repeat_penalty = 1.0, .repeat_last_n = 64, .steps = 256,
                   .mode = MODE_GENERATE, .kv_type = KV_F32, .trials = 5, .key_digits = 5,
                   .gguf_convert = GGUF_KEEP};
    const char *checkpoint = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            if (checkpoint)
                die(EXIT_USAGE, "%s: unexpected argument (the checkpoint is already %s)", shown_path(a),
                    shown_path(checkpoint));
            checkpoint = a;
            continue;
        }
        const Flag *f = find_flag(a);
        if (!f) die(EXIT_USAGE, "%s: unknown option (see --help)", shown_path(a));
        o->given[f - FLAGS] = 1;
        if (f->field == offsetof(Options, help)) { // --help [MODE]: at once, whatever follows
            int mode = flag_given(o, "-m") ? o->mode : -1; // -m ppl --help: ppl's options
            if (i + 1 < argc && argv[i + 1][0] != '-') {
                for (mode = 0; mode < N_MODES && strcmp(argv[i + 1], MODE_NAMES[mode]); mode++) {}
                if (mode == N_MODES)
                    die(EXIT_USAGE, "--help %s: expected one of %s", shown_path(argv[i + 1]), choice_list(MODE_NAMES));
            }
            usage(stdout, mode);
            exit(0);
        }
        if (f->kind == SWITCH) *(int *)((char *)o + f->field) = 1;
        else read_value(f, argc, argv, &i, o);
    }
    if (!checkpoint) die(EXIT_USAGE, "missing <checkpoint> (usage: run <checkpoint> [options]; see run --help)");
    for (size_t j = 0; j < N_FLAGS; j++)
        if (o->given[j] && !(FLAGS[j].modes & (1u << o->mode)))
            die(EXIT_USAGE, "%s: not read by -m %s (only by %s)%s", FLAGS[j].name, MODE_NAMES[o->mode],
                mode_list(&FLAGS[j]), FLAGS[j].field == offsetof(Options, prompt) && (o->mode == MODE_PPL ||
                o->mode == MODE_PASSKEY) ? "; -f gives its text" : "");
    check_combinations(o);
    return checkpoint;
}

PositionOverrides position_overrides(const Options *o) {
#define INT_SETTING(flag, v) ((IntSetting){flag_given(o, flag), (v)})
#define REAL_SETTING(flag, v) ((RealSetting){flag_given(o, flag), (v)})
    return (PositionOverrides){
        .scaling = INT_SETTING("--rope-scaling", o->rope_scaling),
        .orig_ctx = INT_SETTING("--rope-orig-ctx", o->rope_orig_ctx),
        .base = REAL_SETTING("--rope-base", o->rope_base),
        .factor = REAL_SETTING("--rope-factor", o->rope_factor),
        .beta_fast = REAL_SETTING("--yarn-beta-fast", o->yarn_beta_fast),
        .beta_slow = REAL_SETTING("--yarn-beta-slow", o->yarn_beta_slow),
        .attn_factor = REAL_SETTING("--rope-attn-factor", o->rope_attn_factor),
        .low_freq = REAL_SETTING("--llama3-low-freq", o->llama3_low_freq),
        .high_freq = REAL_SETTING("--llama3-high-freq", o->llama3_high_freq),
        .dynamic_exact = INT_SETTING("--rope-dynamic", o->rope_dynamic),
        .se_group = INT_SETTING("--self-extend", o->se_group),
        .se_window = INT_SETTING("--self-extend", o->se_window),
        .sinks = INT_SETTING("--sinks", o->sinks),
        .window = INT_SETTING("--window", o->window),
        .ctx_flag = o->mode == MODE_PASSKEY && o->lengths && !flag_given(o, "--ctx") ? "--lengths" : NULL,
    };
#undef INT_SETTING
#undef REAL_SETTING
}

/* ==========================================================================
 * The tokenizer: -z, a GGUF's own, or the file beside the checkpoint
 * ========================================================================== */

/* Whether path is a regular file that starts with "GGUF" (a pipe is not
 * looked into: the bytes read would be gone for the loader). */
static int regular_gguf(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && gguf_is_file(path);
}

/* Where this run's tokenizer comes from: -z's file (a GGUF given there: its
 * vocabulary); else a GGUF checkpoint's own vocabulary (tokenizer.ggml.*, a
 * tokenizer.bin beside it notwithstanding); else tokenizer.bin beside the
 * checkpoint, else ./tokenizer.bin when there is none beside it. How it was
 * chosen goes into `origin` for the messages. Exits, naming the paths it
 * looked at, when -z was not given and neither file exists. */
static char *tokenizer_path(const Options *o, const char *checkpoint, char *origin, size_t origin_len) {
    if (o->tokenizer || regular_gguf(checkpoint)) {
        snprintf(origin, origin_len, o->tokenizer ? "given with -z" : "the GGUF's own vocabulary, tokenizer.ggml.*");
        char *path = strdup(o->tokenizer ? o->tokenizer : checkpoint);
        if (!path) die(EXIT_BAD_INPUT, "out of memory");
        return path;
    }
    const char *slash = strrchr(checkpoint, '/');
    size_t dir_len = slash ? (size_t)(slash - checkpoint + 1) : 0;
    char beside[PATH_MAX + sizeof "tokenizer.bin"]; // on the stack: the exits below leave nothing allocated
    if (dir_len > PATH_MAX) die(EXIT_BAD_INPUT, "checkpoint %s: its folder's name is longer than %d bytes",
                                shown_path(checkpoint), PATH_MAX);
    memcpy(beside, checkpoint, dir_len);
    memcpy(beside + dir_len, "tokenizer.bin", sizeof "tokenizer.bin");
    const char *chosen = beside;
    if (access(beside, F_OK) == 0) {
        snprintf(origin, origin_len, "the default, beside the checkpoint");
    } else if (dir_len == 0) { // the checkpoint's folder is the current one: there is no other place to look
        die(EXIT_BAD_INPUT, "tokenizer: no -z given, and no ./tokenizer.bin beside the checkpoint %s; give the "
            "tokenizer with -z", shown_path(checkpoint));
    } else if (access("tokenizer.bin", F_OK) != 0) {
        die(EXIT_BAD_INPUT, "tokenizer: no -z given, and neither %s (beside the checkpoint) nor ./tokenizer.bin "
            "exists; give the tokenizer with -z", shown_path(beside));
    } else {
        snprintf(origin, origin_len, "the default in the current directory, as there is no %s beside the checkpoint",
                 shown_path(beside));
        chosen = "tokenizer.bin";
    }
    char *path = strdup(chosen);
    if (!path) die(EXIT_BAD_INPUT, "out of memory");
    return path;
}

/* Load the tokenizer for the checkpoint's vocabulary into tok and return its
 * path (the caller frees it): a GGUF's vocabulary through gguf_tokenizer.c
 * (with export.py's note on its chat template, when there is one, on
 * stderr), any other file through tokenizer.c. On failure exit with one line
 * that names the path tried and how it was chosen, says what the file is
 * when it is not a tokenizer file at all (filekind.c), and suggests -z when
 * -z was not given. */
char *load_tokenizer(Tokenizer *tok, const Options *o, const char *checkpoint, const Config *c) {
    char origin[4200], err[1024], what[768], note[GGUF_TOK_NOTE_BYTES]; // origin: a path (up to 4096 bytes) and words
    char *path = tokenizer_path(o, checkpoint, origin, sizeof origin);
    int gguf = regular_gguf(path);
    int rc = gguf ? gguf_tokenizer_build(tok, path, c->vocab_size, c->bos_id, c->eos_id, note, err, sizeof err)
                  : tokenizer_build(tok, path, c->vocab_size, c->bos_id, c->eos_id, err, sizeof err);
    if (rc == 0) {
        if (gguf && note[0]) notice("tokenizer %s: note: %s", shown_path(path), note);
        return path;
    }
    if (!gguf && explain_foreign_file(path, AS_TOKENIZER, what, sizeof what))
        die(EXIT_BAD_INPUT, "tokenizer %s (%s): not a tokenizer file: %s", shown_path(path), origin, what);
    // The loaders' messages start "tokenizer PATH: " or (a GGUF's keys) "PATH: ", PATH as shown_path shows it;
    // the origin goes after PATH
    const char *shown = shown_path(path), *why = err;
    size_t skip = strncmp(err, "tokenizer ", 10) == 0 ? 10 : 0, n = strlen(shown);
    if (strncmp(err + skip, shown, n) == 0 && strncmp(err + skip + n, ": ", 2) == 0) why = err + skip + n + 2;
    die(EXIT_BAD_INPUT, "tokenizer %s (%s): %s%s", shown, origin, why,
        o->tokenizer ? "" : gguf ? "; give another tokenizer with -z" : "; give the tokenizer with -z");
}
