/* passkey.c: -m passkey, retrieval of one fact placed far back (docs/passkey.md).
 * A prompt of `length` tokens hides "The pass key is K" at a chosen depth
 * inside filler text and ends with the question; greedy decoding must give
 * back K. With --chat the same text is the one user turn of the checkpoint's
 * chat template and the answer is the assistant's reply. For each length x
 * depth, `trials` prompts with random keys; the output is the accuracy per
 * cell (a table, or every trial with --json).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "modes.h"
#include "passkey.h"

static const char PASSKEY_TASK[] = "There is an important info hidden inside a lot of irrelevant text. Find it and "
                                   "memorize them. I will quiz you about the important information there.";
static const char PASSKEY_FILLER[] = "The grass is green. The sky is blue. The sun is yellow. Here we go. "
                                     "There and back again.";
static const char PASSKEY_QUESTION[] = "What is the pass key? The pass key is";


void split_sentences(Sentences *out, const char *text, size_t n) {
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

void free_sentences(Sentences *s) {
    free(s->text);
    free(s->s);
    free(s->len);
}

/* TASK " " filler[start..start+i) KEY filler[start+i..start+k) " " QUESTION,
 * all joined by single spaces, the filler wrapping around (docs/passkey.md §1). */
char *passkey_prompt(const Sentences *f, int start, int k, int i, const char *key, size_t *len) {
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

/* How a prompt's text becomes token ids, and where the answer ends: plain
 * (ct NULL: the text, BOS first when the tokenizer adds one; the tokenizer's
 * stop ids), or the chat form (the text as the one user turn of template ct,
 * up to where the assistant's reply starts; chat's stop ids, which add the
 * template's end of turn). */
typedef struct {
    const Tokenizer *tok;
    const ChatTemplate *ct;
    const int *stops;
    int n_stop;
} PromptForm;

/* The ids of text in the prompt form (docs/passkey.md §1 and §4). */
static int *form_ids(const PromptForm *form, const char *text, size_t len, int *n_ids) {
    if (!form->ct) return encode_or_die(form->tok, "passkey prompt", text, len, form->tok->add_bos, n_ids);
    Conversation conv = {0};
    conversation_add(&conv, ROLE_USER, text, len);
    Rendering r = {.tok = form->tok};
    render_chat(&r, form->ct, &conv, 1); // the template's default system prompt, if any, comes first
    conversation_free(&conv);
    free(r.text);
    *n_ids = r.n;
    return r.ids;
}

/* The ids of the prompt with k filler sentences, the key after round(depth * k). */
static int *passkey_encode(const PromptForm *form, const Sentences *f, int start, double depth, const char *key,
                           int k, int *n_ids) {
    size_t len;
    char *text = passkey_prompt(f, start, k, (int)lround(depth * k), key, &len);
    int *ids = form_ids(form, text, len, n_ids);
    free(text);
    return ids;
}

/* One trial's prompt: the most filler sentences k whose prompt (all its ids:
 * BOS, template tokens) has at most `length` tokens, the key after
 * i = round(depth * k) of them. Returns the ids (n_ids of them), or NULL when
 * not even the prompt without filler fits; *k_out, *i_out say what was used. */
static int *passkey_ids(const PromptForm *form, const Sentences *f, int start, double depth, const char *key,
                        int length, int *n_ids, int *k_out, int *i_out) {
    int lo = 0, hi = 1, *best = NULL, n_best = 0;
    for (int step = 0;; step++) { // exponential search for an upper bound, then bisection: lo fits, hi does not
        int k = step == 0 ? 0 : hi, n;
        int *ids = passkey_encode(form, f, start, depth, key, k, &n);
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
        int *ids = passkey_encode(form, f, start, depth, key, k, &n);
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
            die(EXIT_USAGE, "%s %s: expected at most %d comma-separated %s in [%.10g, %.10g]", flag, shown_path(text),
                max, integer ? "integers" : "numbers", lo, hi);
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
    int skip_draws; // --skip-draws: trials drawn and dropped before the first
    uint64_t seed;
    const char *filler_path; // NULL: the fixed filler sentences
    int chat;                // --chat: the prompt in the chat template
    int json, prompts_only;
} PasskeyPlan;

/* The plan of the options: --lengths (none: n_lengths 0), --depths (default
 * 0, 0.25, 0.5, 0.75, 1), trials, digits, seed, the prompt form. */
static PasskeyPlan passkey_plan(const Options *o) {
    PasskeyPlan plan = {.trials = o->trials, .digits = o->key_digits, .seed = (uint64_t)o->seed,
                        .skip_draws = o->skip_draws,
                        .filler_path = o->prompt_file, .chat = o->conversation_input, .json = o->json,
                        .prompts_only = o->prompts_only};
    plan.n_depths = o->depths ? parse_list("--depths", o->depths, 0, 0, 1, plan.depths, 64) : 5;
    if (!o->depths)
        for (int k = 0; k < 5; k++) plan.depths[k] = k / 4.0;
    if (o->lengths) plan.n_lengths = parse_list("--lengths", o->lengths, 1, 1, MAX_CTX, plan.lengths, 64);
    return plan;
}

/* The most tokens an answer may have: the key's digits and 4 more (plain,
 * after "The pass key is"); a chat reply gets ANSWER_CHAT_EXTRA more, room to
 * restate the question before the key (docs/passkey.md §3). */
#define ANSWER_CHAT_EXTRA 12
static int answer_tokens(const PasskeyPlan *plan) {
    return plan->digits + 4 + (plan->chat ? ANSWER_CHAT_EXTRA : 0);
}

int passkey_context(const Options *o) {
    PasskeyPlan plan = passkey_plan(o);
    double longest = 0;
    for (int k = 0; k < plan.n_lengths; k++) longest = fmax(longest, plan.lengths[k]);
    if (!plan.prompts_only && longest + answer_tokens(&plan) > MAX_CTX)
        die(EXIT_USAGE, "--lengths %.0f: a prompt and its %d answer tokens need a context of %.0f, more than the %d "
            "positions run holds", longest, answer_tokens(&plan), longest + answer_tokens(&plan), MAX_CTX);
    return plan.n_lengths ? (int)fmin(longest + answer_tokens(&plan), MAX_CTX) : 0;
}

/* Check every cell before printing anything: the context (not with
 * --prompts-only, which runs nothing), and that each trial's prompt without
 * filler fits its length (keys differ in tokens). Makes the same draws as the
 * run, from rng. Returns the longest length. */
static int check_cells(const Transformer *t, const PromptForm *form, const PasskeyPlan *plan, const Sentences *f,
                       int n_new, uint64_t rng) {
    int longest = 0;
    for (int li = 0; li < plan->n_lengths; li++) {
        int length = (int)plan->lengths[li];
        longest = length > longest ? length : longest;
        if (length + n_new > t->n_ctx && t->keys != KEYS_SINKS && !plan->prompts_only) // sinks roll past it
            die(EXIT_USAGE, "--lengths %d: a prompt of %d tokens and its %d answer tokens need --ctx %d, got %d "
                "(or a rolling cache, --sinks n)", length, length, n_new, length + n_new, t->n_ctx);
        for (int k = 0; k < plan->n_depths * plan->trials; k++) {
            char key[24];
            passkey_draw(&rng, plan->digits, f->n, plan->filler_path != NULL, key);
            int n_bare;
            free(passkey_encode(form, f, 0, 0, key, 0, &n_bare));
            if (n_bare > length)
                die(EXIT_USAGE, "--lengths %d: the %s prompt without filler has %d tokens (key %s)", length,
                    form->ct ? "chat-form" : "plain", n_bare, key);
        }
    }
    return longest;
}

/* The prompt form as the text header names it: "plain" or "chat (chatml)". */
static const char *form_label(const PromptForm *form, char *buf, size_t size) {
    if (!form->ct) return "plain";
    snprintf(buf, size, "chat (%s)", CHAT_TEMPLATE_NAMES[form->ct->kind]);
    return buf;
}

/* The table's or the JSON's opening. */
static void print_header(const Transformer *t, const PasskeyPlan *plan, const PromptForm *form) {
    if (plan->json) {
        out_printf("{\"mode\": \"passkey\", \"filler\": %s", plan->filler_path ? "" : "\"fixed\"");
        if (plan->filler_path) print_json_string(plan->filler_path);
        out_printf(", \"key_digits\": %d, \"trials_per_cell\": %d, \"seed\": %llu, \"ctx\": %d, \"orig_ctx\": %d, "
                   "\"scaling\": \"%s\", ", plan->digits, plan->trials, (unsigned long long)plan->seed, t->n_ctx,
                   t->rope.orig_ctx, SCALING_NAMES[t->rope.scaling]);
        out_printf("\"prompt_format\": \"%s\", ", form->ct ? "chat" : "plain");
        if (form->ct) out_printf("\"chat_template\": \"%s\", ", CHAT_TEMPLATE_NAMES[form->ct->kind]);
        if (t->keys == KEYS_SINKS) out_printf("\"sinks\": %d, ", t->pos.n_sinks);
        if (plan->skip_draws) out_printf("\"skip_draws\": %d, ", plan->skip_draws);
        out_printf("\"position\": ");
        print_position_json(t);
        out_printf(", \"cells\": [");
    } else if (!plan->prompts_only) {
        char setup[512], label[32];
        position_setup_text(setup, sizeof setup, t);
        out_printf("passkey: %d trials per cell, %d-digit keys, filler %s, prompt %s\nposition: %s\n%8s",
                   plan->trials, plan->digits, plan->filler_path ? shown_path(plan->filler_path) : "fixed",
                   form_label(form, label, sizeof label), setup, "length");
        for (int di = 0; di < plan->n_depths; di++) out_printf("  d=%-5.2f", plan->depths[di]);
        out_printf("  %8s\n", "mean");
    }
}

/* One trial's prompt and where its key sits. */
typedef struct {
    char key[24];
    int start, sentences, key_after; // first filler sentence, filler sentences used, the key after this many
    int *ids, n_ids;                  // the prompt's token ids
} Trial;

/* --prompts-only: print the trial's prompt instead of running it. JSON: the
 * prompt's text, in the chat form also the whole rendered prompt, and its
 * ids, and its draw (its place in the run's order, --skip-draws counted:
 * docs/passkey.md §2); text: what the model reads (the rendered prompt in
 * the chat form), after a line naming the trial in its cell and its draw. */
static void print_prompt(const PromptForm *form, const Sentences *f, const Trial *tr, int length, double depth,
                         int trial, int draw, int json) {
    size_t len, rendered_len;
    char *text = passkey_prompt(f, tr->start, tr->sentences, tr->key_after, tr->key, &len);
    char *rendered = form->ct ? tokens_text(form->tok, tr->ids, tr->n_ids, -1, &rendered_len) : NULL;
    if (json) {
        out_printf("%s{\"draw\": %d, \"key\": \"%s\", \"start\": %d, \"sentences\": %d, \"key_after\": %d, "
                   "\"prompt_tokens\": %d, \"prompt\": ", trial ? ", " : "", draw, tr->key, tr->start, tr->sentences,
                   tr->key_after, tr->n_ids);
        print_json_string(text);
        if (rendered) out_printf(", \"rendered\": "), print_json_string(rendered);
        out_printf(", \"ids\": [");
        for (int i = 0; i < tr->n_ids; i++) out_printf(i ? ", %d" : "%d", tr->ids[i]);
        out_printf("]}");
    } else {
        out_printf("# length %d depth %g trial %d (draw %d): key %s, %d tokens, %d filler sentences, "
                   "key after %d\n%s\n", length, depth, trial, draw, tr->key, tr->n_ids, tr->sentences,
                   tr->key_after, rendered ? rendered : text);
    }
    free(text);
    free(rendered);
}

/* Prefill the trial's prompt, then the greedy answer of up to n_new tokens
 * (until one of the form's stop tokens); returns the answer's text. history:
 * room for the prompt and the answer. */
static char *greedy_answer(Transformer *t, const PromptForm *form, const Trial *tr, int n_new, int *history) {
    memcpy(history, tr->ids, (size_t)tr->n_ids * sizeof(int));
    int status, n = tr->n_ids;
    float *logits = prefill(t, history, n, 0, &status);
    if (!logits) forward_failed(t, status, history[n - 1], n - 1);
    for (int step = 0; step < n_new && logits; step++) {
        int next = argmax(logits, t->config.vocab_size), stop = 0;
        for (int j = 0; j < form->n_stop; j++) stop |= next == form->stops[j];
        if (stop) break;
        history[n++] = next;
        if (step + 1 == n_new) break;
        logits = forward(t, next, n - 1, &status);
        if (!logits) forward_failed(t, status, next, n - 1);
    }
    size_t answer_len;
    return tokens_text(form->tok, history + tr->n_ids, n - tr->n_ids, history[tr->n_ids - 1], &answer_len);
}

/* Run (or with --prompts-only print) the trials of one cell; returns how
 * many answered correctly. *draw: the draws made so far, --skip-draws's
 * included (the --prompts-only text names each trial's). */
static int run_cell(Transformer *t, const PromptForm *form, const PasskeyPlan *plan, const Sentences *f, int length,
                    double depth, uint64_t *rng, int *draw, int *history) {
    int correct = 0, n_new = answer_tokens(plan);
    for (int trial = 0; trial < plan->trials; trial++) {
        Trial tr;
        tr.start = passkey_draw(rng, plan->digits, f->n, plan->filler_path != NULL, tr.key);
        int this_draw = (*draw)++;
        tr.ids = passkey_ids(form, f, tr.start, depth, tr.key, length, &tr.n_ids, &tr.sentences, &tr.key_after);
        if (!tr.ids) die(EXIT_BAD_INPUT, "passkey: a prompt checked to fit no longer does (a bug)");
        if (plan->prompts_only) {
            print_prompt(form, f, &tr, length, depth, trial, this_draw, plan->json);
            free(tr.ids);
            continue;
        }
        char *answer = greedy_answer(t, form, &tr, n_new, history);
        free(tr.ids);
        size_t n_digits;
        const char *digits = passkey_answer(answer, &n_digits);
        int ok = passkey_correct(answer, tr.key);
        correct += ok;
        if (plan->json) {
            out_printf("%s{\"key\": \"%s\", \"start\": %d, \"sentences\": %d, \"key_after\": %d, "
                       "\"prompt_tokens\": %d, \"answer\": \"%.*s\", \"text\": ", trial ? ", " : "", tr.key, tr.start,
                       tr.sentences, tr.key_after, tr.n_ids, (int)n_digits, digits);
            print_json_string(answer);
            out_printf(", \"correct\": %s}", ok ? "true" : "false");
        }
        free(answer);
    }
    return correct;
}

/* Where the run's progress goes. Where stderr is no terminal (a log, a pipe),
 * each cell's result is a notice line as the cell ends, and the table's row
 * is written cell by cell. On a terminal, one progress line is rewritten in
 * place (\r) as each cell ends and cleared when the row is printed, whole:
 * stdout is usually that same terminal, and a line of its own there would
 * split the row. With --json on a terminal that shows stdout too (one open
 * line of JSON), there is no progress line. */
typedef struct {
    int live;      // stderr is a terminal: the rewritten line, and whole rows
    int quiet;     // no progress at all (--prompts-only; --json on the terminal)
    int shown;     // the width of the progress line on the terminal now; 0 = none
    char row[1024]; // live: the table's row so far
} Progress;

static Progress progress_start(const PasskeyPlan *plan) {
    Progress p = {.live = isatty(STDERR_FILENO)};
    p.quiet = plan->prompts_only || (plan->json && p.live && isatty(STDOUT_FILENO));
    return p;
}

/* A cell has ended: its result, as a notice or on the live line. */
static void progress_cell(Progress *p, int length, double depth, int correct, int trials, double seconds) {
    if (p->quiet) return;
    char line[160];
    int n = snprintf(line, sizeof line, "passkey: length %d depth %.2f: %d of %d correct (%.1f s)", length, depth,
                     correct, trials, seconds);
    if (!p->live) {
        notice("%s", line);
        return;
    }
    flush_stdout(); // what stdout holds goes first
    fprintf(stderr, "\r%-*s", p->shown, line); // over the last one, padded to its width
    p->shown = n > p->shown ? n : p->shown;
}

/* Clear the live progress line (nothing when there is none). */
static void progress_clear(Progress *p) {
    if (p->shown) fprintf(stderr, "\r%*s\r", p->shown, "");
    p->shown = 0;
}

/* Part of the table's row: printed now, or (live) kept for row_end. */
static void row_put(Progress *p, const char *fmt, double value) {
    char part[32];
    snprintf(part, sizeof part, fmt, value);
    if (!p->live) {
        out_printf("%s", part);
        flush_stdout();
    } else if (strlen(p->row) + strlen(part) < sizeof p->row) {
        strcat(p->row, part);
    }
}

/* The row's end: live, the progress line gives way to the whole row. */
static void row_end(Progress *p) {
    progress_clear(p);
    out_printf("%s\n", p->row);
    p->row[0] = '\0';
    flush_stdout();
}

/* -m passkey: for each length x depth, `trials` prompts with random keys (in
 * the chat template with --chat); the accuracy of greedy answers. Text: a
 * table of accuracies; --json: every cell and trial; --prompts-only prints the
 * prompts instead of running the model. Progress goes to stderr. */
void passkey_mode(const ModeInput *in) {
    Transformer *t = in->t;
    const Tokenizer *tok = in->tok;
    PasskeyPlan plan = passkey_plan(in->o);
    PromptForm form = {tok, NULL, tok->stop_ids, tok->n_stop};
    ChatTemplate ct;
    int chat_stops[CHAT_MAX_STOPS];
    if (plan.chat) {
        ct = mode_chat_template(in);
        form = (PromptForm){tok, &ct, chat_stops, chat_stop_ids(tok, &ct, chat_stops)};
    }
    int n_new = answer_tokens(&plan);
    if (plan.n_lengths == 0) { // default: prompt and answer fill the training context (or --ctx)
        int fit = t->n_ctx - n_new;
        plan.n_lengths = 1;
        plan.lengths[0] = fit < t->config.train_ctx ? fit : t->config.train_ctx;
    }
    Sentences f;
    if (plan.filler_path) split_sentences(&f, in->text, in->text_len);
    else split_sentences(&f, PASSKEY_FILLER, strlen(PASSKEY_FILLER));
    if (f.n == 0) die(EXIT_BAD_INPUT, "-f %s: no filler sentences (empty text)", shown_path(plan.filler_path));
    uint64_t seed_state = plan.seed * 0x9E3779B97F4A7C15ull + 1;
    if (seed_state == 0) seed_state = 1; // xorshift's fixed point
    for (int k = 0; k < plan.skip_draws; k++) { // --skip-draws: the draws of trials that run elsewhere
        char key[24];
        passkey_draw(&seed_state, plan.digits, f.n, plan.filler_path != NULL, key);
    }
    int longest = check_cells(t, &form, &plan, &f, n_new, seed_state);
    uint64_t rng = seed_state; // the same draws again, for the run
    if (!plan.prompts_only) fputs(in->summary, stderr);
    if (plan.chat) { // its cells are good: the template of the prompts, if assumed
        char note[4608];
        assumed_template_note(in, note, sizeof note);
        fputs(note, stderr);
    }
    int *history = malloc(((size_t)longest + n_new + 1) * sizeof(int)), draw = plan.skip_draws;
    if (!history) die(EXIT_BAD_INPUT, "out of memory");
    print_header(t, &plan, &form);
    Progress progress = progress_start(&plan);
    int table = !plan.json && !plan.prompts_only;
    double start_time = now_seconds();
    for (int li = 0; li < plan.n_lengths; li++) {
        int length = (int)plan.lengths[li], row_correct = 0;
        if (table) row_put(&progress, "%8.0f", length);
        for (int di = 0; di < plan.n_depths; di++) {
            double depth = plan.depths[di];
            if (plan.json)
                out_printf("%s{\"length\": %d, \"depth\": %g, \"trials\": [", li + di ? ", " : "", length, depth);
            int correct = run_cell(t, &form, &plan, &f, length, depth, &rng, &draw, history);
            row_correct += correct;
            if (plan.json && plan.prompts_only) out_printf("]}");
            else if (plan.json)
                out_printf("], \"correct\": %d, \"accuracy\": %.4f}", correct, (double)correct / plan.trials);
            else if (table) row_put(&progress, "  %6.0f%%", 100.0 * correct / plan.trials);
            progress_cell(&progress, length, depth, correct, plan.trials, now_seconds() - start_time);
        }
        if (table) row_put(&progress, "  %7.0f%%", 100.0 * row_correct / ((double)plan.trials * plan.n_depths));
        if (table) row_end(&progress);
    }
    progress_clear(&progress);
    if (plan.json) out_printf("]}\n");
    free(history);
    free_sentences(&f);
}
