/* fuzz_chat_input.c: libFuzzer target for what chat reads from its user: the
 * line reader of the chat loop (chat.c's read_turn) and the conversation-file
 * parser of --chat -f (parse_conversation), in bounded memory (make fuzz runs
 * it with -rss_limit_mb).
 *
 * Input: a selector byte, then the bytes a user would type or put in a file.
 * The low 5 bits of the selector give the reader's bound, max_bytes = the
 * selector's value x 7 (0 .. 217 bytes, as n_ctx x the longest piece would);
 * the reader reads every line of the rest from an in-memory stream. A line the
 * reader refuses (too long, a NUL byte) reaches die(), which returns here
 * through FUZZING's longjmp instead of exiting. Every line read must be within
 * the bound, hold no NUL byte and no "\n", and end in no "\r". Then the same
 * bytes are parsed as a conversation file: each message must be one of the
 * three roles, in an order the parser allows. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "run.h" /* die_jump: built with -DFUZZING, die() returns here */

static void read_every_line(const uint8_t *data, size_t size, size_t max_bytes) {
    FILE *in = fmemopen((void *)data, size, "rb");
    if (!in) return;
    static char *line; // static: still reachable for the cleanup after a longjmp
    jmp_buf here;
    die_jump = &here;
    if (setjmp(here) == 0) {
        size_t len;
        for (int line_no = 1; (line = read_turn(in, "fuzz", line_no, max_bytes, &len)) != NULL; line_no++) {
            if (len > max_bytes || strlen(line) != len || memchr(line, '\n', len) || (len && line[len - 1] == '\r'))
                abort();
            free(line);
            line = NULL;
        }
    }
    die_jump = NULL;
    free(line);
    line = NULL;
    fclose(in);
}

static void parse_as_file(const uint8_t *data, size_t size) {
    static Conversation conv;
    memset(&conv, 0, sizeof conv);
    jmp_buf here;
    die_jump = &here;
    if (setjmp(here) == 0) {
        parse_conversation(&conv, "fuzz", (const char *)data, size);
        for (int i = 0; i < conv.n; i++) {
            int role = conv.m[i].role, expected = i == 0 ? -1 : conv.m[i - 1].role == ROLE_USER ? ROLE_ASSISTANT
                                                                                              : ROLE_USER;
            if (role < ROLE_SYSTEM || role > ROLE_ASSISTANT || strlen(conv.m[i].text) > conv.m[i].len) abort();
            if (expected < 0 ? role == ROLE_ASSISTANT : role != expected) abort();
        }
    }
    die_jump = NULL;
    conversation_free(&conv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    read_every_line(data + 1, size - 1, (size_t)(data[0] & 31) * 7);
    parse_as_file(data + 1, size - 1);
    return 0;
}
