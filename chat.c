/* chat.c: -m chat. A conversation is a list of messages: an optional system
 * prompt, then user and assistant turns in alternation. A chat template
 * renders it to token ids the way the model was trained to read it (plain,
 * llama2, chatml, llama3: render_chat); the chat loop re-renders the whole
 * conversation every turn and runs only the tokens the KV cache does not
 * already hold. Conversations can also come from a file of "role: text" lines
 * (--chat; parse_conversation), which -m tokenize --chat renders too.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chat.h"
#include "lineedit.h"
#include "modes.h"

const char *const ROLE_NAMES[] = {"system", "user", "assistant", NULL};
const char *const CHAT_TEMPLATE_NAMES[] = {"unstated", "plain", "llama2", "chatml", "llama3", NULL};


void conversation_add(Conversation *c, int role, const char *text, size_t len) {
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

void conversation_free(Conversation *c) {
    for (int i = 0; i < c->n; i++) free(c->m[i].text);
    free(c->m);
    *c = (Conversation){0};
}


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
ChatTemplate chat_template(const Tokenizer *tok, int kind, const char *tok_path) {
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
                shown_path(tok_path), need[k]);
    if ((kind == CHAT_LLAMA2 && (ct.bos < 0 || ct.eos < 0)) || (kind == CHAT_LLAMA3 && ct.bos < 0))
        die(EXIT_USAGE, "--chat-template %s: tokenizer %s has no %s", CHAT_TEMPLATE_NAMES[kind], shown_path(tok_path),
            ct.bos < 0 ? "BOS" : "EOS");
    return ct;
}


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
void render_chat(Rendering *r, const ChatTemplate *ct, const Conversation *c, int generation_prompt) {
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

int chat_stop_ids(const Tokenizer *tok, const ChatTemplate *ct, int *stops) {
    int n_stop = 0;
    for (int i = 0; i < tok->n_stop; i++) stops[n_stop++] = tok->stop_ids[i];
    int ends[3] = {tok->eos_id, ct->kind == CHAT_CHATML ? ct->close : ct->eot, ct->kind == CHAT_LLAMA2 ? ct->eos : -1};
    for (int k = 0; k < 3; k++)
        if (ends[k] >= 0) stops[n_stop++] = ends[k];
    return n_stop;
}

char *read_turn(FILE *in, const char *what, int line_no, size_t max_bytes, size_t *len) {
    size_t n = 0, cap = 256;
    char *line = malloc(cap);
    if (!line) die(EXIT_BAD_INPUT, "%s line %d: out of memory", what, line_no);
    int ch;
    while ((ch = getc(in)) != EOF && ch != '\n') {
        if (ch == '\0') {
            free(line);
            die(EXIT_BAD_INPUT, "%s line %d: holds a NUL byte (expected text)", what, line_no);
        }
        if (n == max_bytes) {
            free(line);
            die(EXIT_BAD_INPUT, "%s line %d: longer than %zu bytes, more than the context can hold (raise --ctx)",
                what, line_no, max_bytes);
        }
        if (n + 1 == cap) {
            char *bigger = realloc(line, cap *= 2);
            if (!bigger) {
                free(line);
                die(EXIT_BAD_INPUT, "%s line %d: out of memory after %zu bytes", what, line_no, n);
            }
            line = bigger;
        }
        line[n++] = (char)ch;
    }
    if (ferror(in)) {
        free(line);
        die(EXIT_BAD_INPUT, "%s: read error: %s", what, strerror(errno));
    }
    if (ch == EOF && n == 0) { // end of input
        free(line);
        return NULL;
    }
    while (n > 0 && line[n - 1] == '\r') n--;
    line[n] = '\0';
    *len = n;
    return line;
}

/* ---- The user's turns ---------------------------------------------------- */

#define PROMPT_USER "User: "
#define PROMPT_MORE "...   " // the next line of a turn of several lines
#define BLOCK_MARK "\"\"\""  // a line of its own that opens and closes a turn of several lines

/* Where the user's turns come from: the line editor when stdin is a terminal
 * (lineedit_terminal), else stdin's lines through read_turn (a pipe, a file). */
typedef struct {
    LineEditor ed;    // ed.fd: the terminal it draws on, -1 = no editor
    int line_no;      // lines read from stdin so far (messages name them)
    int ended;        // stdin ended (a turn it cut short was still sent)
    size_t max_bytes; // the longest turn the context could hold
} TurnReader;

/* A growing text. */
typedef struct {
    char *s;
    size_t len, cap;
} Text;

static void text_append(Text *t, const char *s, size_t n) {
    if (t->len + n + 1 > t->cap) {
        t->cap = 2 * (t->len + n + 1);
        t->s = realloc(t->s, t->cap);
        if (!t->s) die(EXIT_BAD_INPUT, "stdin: out of memory for a turn of %zu bytes", t->len + n);
    }
    memcpy(t->s + t->len, s, n);
    t->len += n;
    t->s[t->len] = '\0';
}

/* One line of the user's, after label. From the editor; or from stdin by
 * read_turn, the label printed first and, when stdin is not a terminal, the
 * line after it (as a terminal would show it). When the editor draws on
 * stderr (stdout is not a terminal), stdout gets the label and the line too:
 * stdout is the transcript. */
static LineResult next_line(TurnReader *r, const char *label, char **line, size_t *len) {
    r->line_no++;
    if (r->ed.fd >= 0) {
        LineResult got = lineedit_read(&r->ed, label, r->max_bytes, line, len);
        if (r->ed.fd == STDOUT_FILENO) out_line_ended(); // the editor ends every line it draws
        else if (got == LINE_ENTERED) out_printf("%s%s\n", label, *line);
        return got;
    }
    out_printf("%s", label);
    flush_stdout();
    *line = read_turn(stdin, "stdin", r->line_no, r->max_bytes, len);
    if (!*line) { // end of input: end the label's line
        out_printf("\n");
        return LINE_END;
    }
    if (!isatty(STDIN_FILENO)) out_printf("%s\n", *line);
    else if (isatty(STDOUT_FILENO)) out_line_ended(); // the terminal echoed the user's Enter
    return LINE_ENTERED;
}

/* The user's next turn in a new string (its length in *len): one line; or,
 * when a line ends in "\" (which is dropped), that line, a newline and the
 * next; or, when the turn opens with a line of """, the lines up to the next
 * such line, joined by newlines. NULL ends the chat: end of input before a
 * turn, or Ctrl-C at an empty "User: " prompt. Ctrl-C anywhere else drops the
 * turn and asks again; end of input within a turn sends what was read. */
static char *read_user_turn(TurnReader *r, size_t *len) {
    if (r->ended) return NULL;
    Text turn = {0};
    text_append(&turn, "", 0);
    int lines = 0, block = 0, first_line = r->line_no + 1;
    for (;;) {
        int at_start = lines == 0 && !block;
        char *line;
        size_t n;
        LineResult got = next_line(r, at_start ? PROMPT_USER : PROMPT_MORE, &line, &n);
        if (got == LINE_CANCELLED) {
            if (at_start && n == 0) break; // Ctrl-C at an empty prompt: the end
            turn.len = 0, lines = 0, block = 0, first_line = r->line_no + 1;
            continue;
        }
        if (got == LINE_END) {
            r->ended = 1;
            if (at_start) break;
            *len = turn.len;
            return turn.s;
        }
        int mark = !strcmp(line, BLOCK_MARK), more = block || (n > 0 && line[n - 1] == '\\');
        if (mark && (at_start || block)) { // opens or closes a block
            free(line);
            if (at_start) {
                block = 1;
                continue;
            }
            *len = turn.len;
            return turn.s;
        }
        if (lines++ > 0) text_append(&turn, "\n", 1);
        text_append(&turn, line, n - (!block && more)); // a continuing line's "\" goes
        free(line);
        if (turn.len > r->max_bytes)
            die(EXIT_BAD_INPUT, "stdin lines %d-%d: one turn of more than %zu bytes, more than the context can hold "
                "(raise --ctx)", first_line, r->line_no, r->max_bytes);
        if (!more) {
            *len = turn.len;
            return turn.s;
        }
    }
    free(turn.s);
    return NULL;
}

/* Chat reads the user's turns from stdin: it must be something to read. */
static void check_stdin(void) {
    struct stat st;
    if (fstat(STDIN_FILENO, &st) != 0)
        die(EXIT_BAD_INPUT, "stdin: %s (chat reads the user's turns from it)", strerror(errno));
    if (S_ISDIR(st.st_mode)) die(EXIT_BAD_INPUT, "stdin: a directory (chat reads the user's turns from it)");
}

/* ---- Ctrl-C during a reply ------------------------------------------------ */

/* Set by SIGINT (Ctrl-C) while a reply is made: the reply stops there. */
static volatile sig_atomic_t interrupted;

static void on_interrupt(int sig) {
    (void)sig;
    interrupted = 1;
}

/* From here until release_interrupt(previous), Ctrl-C stops the reply instead
 * of the program (unless SIGINT is ignored, as in a background job). Writes
 * that it interrupts are restarted (SA_RESTART). */
static void catch_interrupt(struct sigaction *previous) {
    interrupted = 0;
    sigaction(SIGINT, NULL, previous);
    if (previous->sa_handler == SIG_IGN) return;
    struct sigaction sa = {0};
    sa.sa_handler = on_interrupt;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

static void release_interrupt(const struct sigaction *previous) { sigaction(SIGINT, previous, NULL); }

/* ---- Replies ------------------------------------------------------------- */

/* What a reply took, for the line after it. */
typedef struct {
    int tokens;      // the reply's tokens (a stop token not counted)
    double seconds;  // from its first sampled token to its end
    int interrupted; // Ctrl-C stopped it
} ReplyStats;

/* d->history[keep..n) into the KV cache (which holds d->history[0..keep)), in
 * the blocks prefill takes, so that Ctrl-C can stop between them; d->n counts
 * what the cache holds. Returns the logits of the last token, or NULL when
 * Ctrl-C came first. */
static float *prefill_turn(Decoder *d, int keep, int n) {
    float *logits = NULL;
    for (int at = keep; at < n && !interrupted;) {
        int B = n - at < FORWARD_BLOCK ? n - at : FORWARD_BLOCK, status;
        logits = prefill(d->t, d->history + at, B, at, &status);
        if (!logits) forward_failed(d->t, status, d->history[at + B - 1], at + B - 1);
        d->n = at += B;
    }
    return interrupted ? NULL : logits;
}

/* The reply to rendering r: the tokens after those the cache already holds
 * go through the model, then the reply is sampled and printed until a stop
 * id, max_new tokens, a full context or Ctrl-C. Whatever was printed stays:
 * its tokens are in d->history and in the cache (an interrupted turn leaves
 * the tokens it got through, and a reply of what was printed, maybe nothing).
 * Returns the reply's text, its length in *len. */
static char *reply(Decoder *d, const Rendering *r, const int *stops, int n_stop, int max_new, size_t *len,
                   ReplyStats *stats) {
    Transformer *t = d->t;
    // Keep the cached tokens the rendering starts with; run at least one.
    int keep = 0;
    while (keep < d->n && keep < r->n - 1 && d->history[keep] == r->ids[keep]) keep++;
    memcpy(d->history + keep, r->ids + keep, (size_t)(r->n - keep) * sizeof(int));
    d->n = keep;
    out_printf("Assistant: ");
    flush_stdout();
    struct sigaction previous;
    catch_interrupt(&previous);
    float *logits = prefill_turn(d, keep, r->n);
    int reply_start = d->n, status;
    double start = now_seconds();
    for (int n_new = 0; logits && n_new < max_new && d->n < t->n_ctx && !interrupted; n_new++) {
        int next = decode_step(d, logits, stops, n_stop);
        if (next < 0) break;
        logits = forward(t, next, d->n - 1, &status);
        if (!logits) forward_failed(t, status, next, d->n - 1);
    }
    end_text(d);
    *stats = (ReplyStats){d->n - reply_start, now_seconds() - start, interrupted};
    release_interrupt(&previous);
    return tokens_text(d->tok, d->history + reply_start, d->n - reply_start,
                       reply_start > 0 ? d->history[reply_start - 1] : -1, len);
}

/* The line after a reply, on stderr when it is a terminal: the reply's
 * tokens and rate, and how much of the context the conversation holds. */
static void reply_summary(const ReplyStats *s, int held, int n_ctx) {
    if (!isatty(STDERR_FILENO)) return;
    char rate[48] = "";
    if (s->tokens > 0 && s->seconds > 0) snprintf(rate, sizeof rate, ", %.1f tok/s", s->tokens / s->seconds);
    notice("[%s%d tokens%s; context %d of %d tokens used]", s->interrupted ? "stopped by Ctrl-C: " : "", s->tokens,
           rate, held, n_ctx);
}

/* What a chat prints before its first turn: the load line and, on a
 * terminal, how to type (stderr); the conversation it was given, from
 * message `shown_from` on (stdout), as the chat shows its own turns. */
static void chat_opening(const char *summary, const Conversation *c, int shown_from) {
    static const char *const LABELS[] = {"System: ", PROMPT_USER, "Assistant: "}; // index = ROLE_*
    fputs(summary, stderr);
    if (isatty(STDIN_FILENO) && isatty(STDERR_FILENO))
        notice("chat: Enter sends a turn; end a line with \\ to go on, or put \"\"\" on a line before and after "
               "several; Ctrl-C stops a reply; Ctrl-D, or Ctrl-C on an empty line, ends");
    for (int i = shown_from; i < c->n; i++) {
        out_printf("%s", LABELS[c->m[i].role]);
        out_write(c->m[i].text, c->m[i].len);
        out_printf("\n");
    }
    flush_stdout();
}

/* chat: continue conversation conv (a system prompt, turns from -i or a
 * conversation file, or nothing; chat takes it over) with the model's
 * replies and user turns from stdin (read_user_turn) until the user ends it.
 * Messages conv.m[shown_from..] are printed before the first new turn. Each
 * turn re-renders the conversation with the template and runs only the
 * tokens after what the KV cache already holds (usually the reply's end
 * marker and the new user turn). A reply ends at a stop token, at max_new
 * tokens, at Ctrl-C, or when the context is full. A turn from stdin that
 * leaves no room for a reply ends the chat with a message; a conversation from
 * the command line that does not fit is bad input. */
static void chat(Transformer *t, const Tokenizer *tok, const ChatTemplate *ct, Sampler *sampler, Conversation conv,
                 int shown_from, int max_new, int ignore_eos, const char *summary) {
    // Stop at the tokenizer's stop ids, its EOS, and the template's end of turn.
    int stops[CHAT_MAX_STOPS], n_stop = chat_stop_ids(tok, ct, stops);
    if (ignore_eos) n_stop = 0;
    Decoder d;
    decoder_init(&d, t, tok, sampler, t->n_ctx);
    Rendering r = {.tok = tok};
    check_stdin();
    if (conv.n > 0 && conv.m[conv.n - 1].role != ROLE_USER) { // -y, or a conversation ending with a reply:
        conversation_add(&conv, ROLE_USER, "", 0);             // it must leave room for a turn and a reply
        render_chat(&r, ct, &conv, 1);
        free(conv.m[--conv.n].text);
        if (r.n >= t->n_ctx)
            die(EXIT_BAD_INPUT, "prompt: the conversation renders to %d tokens with an empty turn, and the reply "
                "needs one more; the context holds %d (raise --ctx)", r.n, t->n_ctx);
    }
    TurnReader in = {.ed = {.fd = lineedit_terminal()},
                     .max_bytes = (size_t)t->n_ctx * (size_t)(tok->max_token_length > 0 ? tok->max_token_length : 1)};
    int opened = 0;
    for (;;) {
        int from_stdin = conv.n == 0 || conv.m[conv.n - 1].role != ROLE_USER;
        if (from_stdin) { // the user's turn
            if (!opened++) chat_opening(summary, &conv, shown_from); // inputs are good
            size_t len;
            char *user = read_user_turn(&in, &len);
            if (!user) break;
            conversation_add(&conv, ROLE_USER, user, len);
            free(user);
        }
        render_chat(&r, ct, &conv, 1);
        if (r.n >= t->n_ctx) { // no room for even one token of reply
            if (!from_stdin)
                die(EXIT_BAD_INPUT, "prompt: the conversation renders to %d tokens and the reply needs one more; "
                    "the context holds %d (raise --ctx)", r.n, t->n_ctx);
            notice("chat: the next turn needs %d tokens in all (%d held, %d more) and one for the reply; the "
                   "context holds %d: ending the chat (raise --ctx)", r.n, d.n, r.n - d.n, t->n_ctx);
            break;
        }
        if (!opened++) chat_opening(summary, &conv, shown_from);
        size_t reply_len;
        ReplyStats stats;
        char *text = reply(&d, &r, stops, n_stop, max_new, &reply_len, &stats);
        conversation_add(&conv, ROLE_ASSISTANT, text, reply_len);
        free(text);
        reply_summary(&stats, d.n, t->n_ctx);
        if (d.n >= t->n_ctx) {
            notice("chat: the reply filled the context of %d tokens; ending the chat (raise --ctx)", t->n_ctx);
            break;
        }
    }
    lineedit_free(&in.ed);
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
void parse_conversation(Conversation *c, const char *what, const char *text, size_t len) {
    what = shown_path(what); // a file's path: one line in every message below
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

/* Whether the run's template is assumed rather than stated: no
 * --chat-template, and a sentencepiece tokenizer file of a version that cannot
 * name one (1 or 2), which gets Llama 2's, as llama2.c's chat does. */
static int template_assumed(const ModeInput *in) {
    const Tokenizer *tok = in->tok;
    return !flag_given(in->o, "--chat-template") && tok->chat_template == CHAT_UNSTATED &&
           tok->type == TOK_SENTENCEPIECE && tok->version < 3;
}

/* The template of this run: --chat-template, else the tokenizer file's, else
 * (template_assumed) Llama 2's. Exits with a usage error when there is none. */
ChatTemplate mode_chat_template(const ModeInput *in) {
    const Tokenizer *tok = in->tok;
    int kind = flag_given(in->o, "--chat-template") ? in->o->chat_template + 1 : tok->chat_template;
    if (template_assumed(in)) kind = CHAT_LLAMA2;
    if (kind == CHAT_UNSTATED)
        die(EXIT_USAGE, "%s: tokenizer %s names no chat template; choose one with --chat-template %s",
            in->o->mode == MODE_CHAT ? "-m chat" : "--chat", shown_path(in->tok_path),
            choice_list(CHAT_TEMPLATE_NAMES + 1));
    return chat_template(tok, kind, in->tok_path);
}

void assumed_template_note(const ModeInput *in, char *out, size_t size) {
    if (size == 0) return;
    out[0] = '\0';
    if (template_assumed(in))
        snprintf(out, size, "note: tokenizer %s states no chat template (a version %d file cannot); using llama2's, "
                 "as llama2.c's chat does; choose another with --chat-template %s\n", shown_path(in->tok_path),
                 in->tok->version, choice_list(CHAT_TEMPLATE_NAMES + 1));
}

/* -m chat: the conversation so far is -y's system prompt, then -i / -f as the
 * first user turn, or (--chat) as a whole conversation, which is shown before
 * the first new turn; chat goes on from it. */
void chat_mode(const ModeInput *in) {
    const Options *o = in->o;
    ChatTemplate ct = mode_chat_template(in);
    Conversation conv = {0};
    if (o->system) conversation_add(&conv, ROLE_SYSTEM, o->system, strlen(o->system));
    int shown_from = conv.n;
    if (o->conversation_input) {
        Conversation given = {0};
        parse_conversation(&given, in->text_name, in->text, in->text_len);
        if (o->system && given.m[0].role == ROLE_SYSTEM)
            die(EXIT_USAGE, "-y: the conversation in %s has its own system message", shown_path(in->text_name));
        for (int i = 0; i < given.n; i++) conversation_add(&conv, given.m[i].role, given.m[i].text, given.m[i].len);
        conversation_free(&given);
    } else if (o->prompt || o->prompt_file) {
        if (o->prompt_file && in->text_len == 0) // as ppl and passkey refuse one; -i "" is an empty turn
            die(EXIT_BAD_INPUT, "-f %s: empty file (expected the first user turn)", shown_path(o->prompt_file));
        if (o->prompt_file)
            notice("-m chat: -f %s is the first user turn, the whole file as one message (with --chat it is a "
                   "conversation, one \"role: text\" line per message)", shown_path(o->prompt_file));
        conversation_add(&conv, ROLE_USER, in->text, in->text_len);
        shown_from = conv.n; // a first turn from the command line is not shown
    }
    char summary[8192], note[4608]; // the load line, and the note of an assumed template after it
    assumed_template_note(in, note, sizeof note);
    snprintf(summary, sizeof summary, "%s%s", in->summary, note);
    chat(in->t, in->tok, &ct, in->sampler, conv, shown_from, o->steps, o->ignore_eos, summary);
}
