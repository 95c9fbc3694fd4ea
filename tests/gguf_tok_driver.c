/* gguf_tok_driver: the version 3 tokenizer file gguf_tokenizer.c makes from a
 * GGUF file's metadata, for tests/test_gguf_tokenizer.py to compare byte for
 * byte with the file `export.py OUT --tokenizer FILE.gguf` writes.
 *
 *   gguf_tok_driver FILE.gguf
 *       stdout: the file's bytes; stderr: export.py's note on the chat
 *               template, "note: ..." (when there is one)
 *       exit 1 with one line on stderr when the GGUF is refused; exit 3
 *       with tokenizer.c's message when the bytes are written but its loader
 *       refuses them (as it would export.py's file of the same bytes), with
 *       the vocabulary size and the BOS and EOS ids the file's header states
 *
 * Build from the repository root:
 *   cc -I. tests/gguf_tok_driver.c gguf.c gguf_tokenizer.c tokenizer.c -o gguf_tok_driver -lm
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>

#include "gguf_tokenizer.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gguf_tok_driver FILE.gguf\n");
        return 2;
    }
    char err[1024], note[GGUF_TOK_NOTE_BYTES];
    size_t size;
    char *data = read_file(argv[1], "gguf", &size, err, sizeof err);
    if (!data) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    GgufFile g;
    unsigned char *ltok = NULL;
    size_t ltok_size = 0;
    int rc = gguf_parse(&g, argv[1], data, size, err, sizeof err);
    if (rc == 0) rc = gguf_tokenizer_ltok(&g, &ltok, &ltok_size, note, err, sizeof err);
    gguf_free(&g);
    free(data);
    if (rc != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    if (note[0]) fprintf(stderr, "note: %s\n", note);
    int ok = fwrite(ltok, 1, ltok_size, stdout) == ltok_size && fflush(stdout) == 0;
    Tokenizer t; // header bytes 16, 24, 28: vocab_size, bos_id, eos_id
    int loads = tokenizer_build_bytes(&t, argv[1], ltok, ltok_size, read_le_i32(ltok + 16), read_le_i32(ltok + 24),
                                      read_le_i32(ltok + 28), err, sizeof err) == 0;
    if (!loads) fprintf(stderr, "%s\n", err);
    tokenizer_free(&t);
    free(ltok);
    return !ok ? 1 : loads ? 0 : 3;
}
