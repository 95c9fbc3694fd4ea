/* tokenize.c: -m tokenize. Prints the token ids of -i's text or -f's file on
 * one line, BOS first when the tokenizer adds one; with --chat, the ids a
 * conversation file renders to under the chat template (chat.c), ending with
 * the assistant's prompt when the last message is the user's. With --pieces,
 * one id per line with its piece (and with neither -i nor -f, the whole
 * vocabulary). The tests compare these ids with sentencepiece's and Hugging
 * Face's, and the pieces with the tokenizer file's.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>

#include "chat.h"
#include "modes.h"

const char *const PIECE_KIND_NAMES[] = {"normal", "special", "byte", "unused", NULL};

void print_piece(FILE *out, const char *s, size_t n) {
    fputc('"', out);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        int len = utf8_length(s + i, n - i);
        if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
        else if (c == '\n') fputs("\\n", out);
        else if (c == '\t') fputs("\\t", out);
        else if (c == '\r') fputs("\\r", out);
        else if (c < 0x20 || c == 0x7f || len == 0) fprintf(out, "\\x%02X", c);
        else fwrite(s + i, 1, (size_t)len, out);
        i += len > 0 ? (size_t)len : 1;
    }
    fputc('"', out);
}

/* One line: the id, its piece, and the piece's kind unless it is normal. */
static void print_id_piece(const Tokenizer *tok, int id) {
    printf("%d ", id);
    print_piece(stdout, tok->vocab[id], (size_t)tok->vocab_len[id]);
    if (tok->kind[id] != PIECE_NORMAL) printf(" %s", PIECE_KIND_NAMES[tok->kind[id]]);
    putchar('\n');
}

void tokenize_mode(const ModeInput *in) {
    const Tokenizer *tok = in->tok;
    const Options *o = in->o;
    if (o->pieces && !o->prompt && !o->prompt_file) { // --pieces alone: the vocabulary
        for (int id = 0; id < tok->vocab_size; id++) print_id_piece(tok, id);
        return;
    }
    int n, *ids;
    Rendering r = {.tok = tok};
    if (o->conversation_input) {
        ChatTemplate ct = mode_chat_template(in);
        Conversation conv = {0};
        parse_conversation(&conv, in->text_name, in->text, in->text_len);
        render_chat(&r, &ct, &conv, conv.m[conv.n - 1].role == ROLE_USER);
        conversation_free(&conv);
        ids = r.ids, n = r.n;
        char note[4608];
        assumed_template_note(in, note, sizeof note);
        fputs(note, stderr); // the conversation was good: the template it was rendered in, if assumed
    } else {
        ids = encode_or_die(tok, in->text_name, in->text, in->text_len, tok->add_bos, &n);
    }
    for (int i = 0; i < n; i++) {
        if (o->pieces) print_id_piece(tok, ids[i]);
        else printf(i ? " %d" : "%d", ids[i]);
    }
    if (!o->pieces) printf("\n");
    free(ids);
    free(r.text);
}
