/* chat.h: conversations and chat templates (chat.c), for -m chat, -m
 * tokenize --chat and the tests. */
#ifndef CHAT_H
#define CHAT_H

#include <stddef.h>
#include <stdio.h>

#include "tokenizer.h"

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT };
extern const char *const ROLE_NAMES[]; // index = ROLE_*; NULL-terminated
/* Index = CHAT_* (tokenizer.h); --chat-template chooses from the names after "unstated". */
extern const char *const CHAT_TEMPLATE_NAMES[];

typedef struct {
    int role;    // ROLE_SYSTEM | ROLE_USER | ROLE_ASSISTANT
    char *text;  // the message, NUL-terminated (owned)
    size_t len;  // its length in bytes
} Message;

typedef struct {
    Message *m;
    int n, cap;
} Conversation;

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

void conversation_add(Conversation *c, int role, const char *text, size_t len);
void conversation_free(Conversation *c);
/* Template `kind` (CHAT_PLAIN ..) resolved against tok's special pieces;
 * exits with a usage error naming a missing piece. */
ChatTemplate chat_template(const Tokenizer *tok, int kind, const char *tok_path);
/* Conversation c rendered by template ct into r->ids, as Hugging Face's
 * apply_chat_template; with generation_prompt, up to where the reply starts. */
void render_chat(Rendering *r, const ChatTemplate *ct, const Conversation *c, int generation_prompt);
/* Where a reply ends: the tokenizer's stop ids, its EOS and the template's
 * end of turn, into stops (room for CHAT_MAX_STOPS); returns their count. */
#define CHAT_MAX_STOPS (TOK_MAX_STOP + 3)
int chat_stop_ids(const Tokenizer *tok, const ChatTemplate *ct, int *stops);
/* One line of in (a chat turn) without its "\n" or trailing "\r"s, in a new
 * NUL-terminated buffer, its length in *len; NULL at end of input. The line is
 * bounded before it is kept: longer than max_bytes, a NUL byte, a read error
 * or no memory exit with one line naming `what` and line_no. */
char *read_turn(FILE *in, const char *what, int line_no, size_t max_bytes, size_t *len);
/* A conversation file ("role: text" per line) into c; exits naming the line. */
void parse_conversation(Conversation *c, const char *what, const char *text, size_t len);

#endif
