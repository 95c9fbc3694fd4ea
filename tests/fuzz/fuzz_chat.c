/* fuzz_chat.c: libFuzzer target for the conversation-file parser and the chat
 * templates (chat.c's parse_conversation and render_chat; make fuzz).
 *
 * Input: a selector byte (bits 0-1: template plain, llama2, chatml, llama3;
 * bit 2: the byte-level tokenizer with ChatML pieces instead of the
 * sentencepiece one; bit 3: end with the assistant's prompt), then a
 * conversation file ("role: text" lines, \n \t \\ escapes). A file run refuses
 * reaches die(), which returns here through FUZZING's longjmp instead of
 * exiting; a template the tokenizer cannot write (llama3 pieces in these
 * vocabularies) is refused the same way. The rendered ids must lie inside the
 * vocabulary. Tokenizers as in fuzz_encode.c ($FUZZ_TOKENIZERS). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "run.h" /* die_jump: built with -DFUZZING, die() returns here */

static Tokenizer toks[2];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = getenv("FUZZ_TOKENIZERS") ? getenv("FUZZ_TOKENIZERS") : "tests/fuzz/build/seeds/tokenizers";
    const char *names[2] = {"sp.bin", "bpe.bin"};
    int vocab[2] = {4096, 0}, bos[2] = {1, -1}, eos[2] = {2, -1}; // bpe.bin's from its LTOK header
    for (int i = 0; i < 2; i++) {
        char path[1024], err[512];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unsigned char h[32];
        FILE *f = i == 1 ? fopen(path, "rb") : NULL;
        if (f && fread(h, 1, sizeof h, f) == sizeof h)
            vocab[1] = read_le_i32(h + 16), bos[1] = read_le_i32(h + 24), eos[1] = read_le_i32(h + 28);
        if (f) fclose(f);
        if (tokenizer_build(&toks[i], path, vocab[i], bos[i], eos[i], err, sizeof err) != 0) {
            fprintf(stderr, "fuzz_chat: %s (run tests/fuzz/make_seeds.py, or set FUZZ_TOKENIZERS)\n", err);
            exit(1);
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const Tokenizer *tok = &toks[(data[0] >> 2) & 1];
    int kind = CHAT_PLAIN + (data[0] & 3), prompt = (data[0] >> 3) & 1;
    static Conversation conv; // static: still reachable for the cleanup after a longjmp
    static Rendering r;
    memset(&conv, 0, sizeof conv);
    memset(&r, 0, sizeof r);
    jmp_buf here;
    die_jump = &here;
    if (setjmp(here) == 0) {
        ChatTemplate ct = chat_template(tok, kind, "fuzz");
        parse_conversation(&conv, "fuzz", (const char *)data + 1, size - 1);
        r.tok = tok;
        render_chat(&r, &ct, &conv, prompt);
        for (int i = 0; i < r.n; i++)
            if (r.ids[i] < 0 || r.ids[i] >= tok->vocab_size) abort();
    }
    die_jump = NULL;
    conversation_free(&conv);
    free(r.ids);
    free(r.text);
    return 0;
}
