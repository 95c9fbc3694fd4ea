/* tokenize.c: -m tokenize. Prints the token ids of -i's text or -f's file on
 * one line, BOS first when the tokenizer adds one; with --chat, the ids a
 * conversation file renders to under the chat template (chat.c), ending with
 * the assistant's prompt when the last message is the user's. The tests
 * compare these ids with sentencepiece's and Hugging Face's.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>

#include "chat.h"
#include "modes.h"

void tokenize_mode(const ModeInput *in) {
    const Tokenizer *tok = in->tok;
    int n, *ids;
    Rendering r = {.tok = tok};
    if (in->o->conversation_input) {
        ChatTemplate ct = mode_chat_template(in);
        Conversation conv = {0};
        parse_conversation(&conv, in->text_name, in->text, in->text_len);
        render_chat(&r, &ct, &conv, conv.m[conv.n - 1].role == ROLE_USER);
        conversation_free(&conv);
        ids = r.ids, n = r.n;
    } else {
        ids = encode_or_die(tok, in->text_name, in->text, in->text_len, tok->add_bos, &n);
    }
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    free(r.text);
}
