/* gguf_tokenizer.h: the tokenizer a GGUF file carries in its metadata
 * (tokenizer.ggml.*, tokenizer.chat_template), built exactly as export.py
 * converts it (gguf_tokenizer.c; docs/gguf.md, "The tokenizer").
 */
#ifndef GGUF_TOKENIZER_H
#define GGUF_TOKENIZER_H

#include <stddef.h>

#include "gguf.h"
#include "tokenizer.h"

/* Room for the note gguf_tokenizer_ltok may write (a template's first 60
 * characters and some words). */
#define GGUF_TOK_NOTE_BYTES 1024

/* The bytes of the version 3 tokenizer file (tokenizer.h, "LTOK") that
 * `python3 export.py OUT --tokenizer FILE.gguf` writes for the parsed file
 * g: *out (malloc'd; the caller frees it) and *out_size. note (at least
 * GGUF_TOK_NOTE_BYTES) receives the note export.py prints about the chat
 * template, or "" when it prints none. Returns 0, or -1 with one line in err
 * naming the file and the key: what export.py refuses is refused here. */
int gguf_tokenizer_ltok(const GgufFile *g, unsigned char **out, size_t *out_size, char *note, char *err,
                        size_t err_len);

/* Map the GGUF file at path and build its own tokenizer into t, for a
 * checkpoint of vocab_size tokens with bos_id and eos_id (-1 = none), through
 * tokenizer_build_bytes: the same checks as a tokenizer file. Sets
 * t->from_gguf. note as above. Returns 0, or -1 with t empty and one line in
 * err. */
int gguf_tokenizer_build(Tokenizer *t, const char *path, int vocab_size, int bos_id, int eos_id, char *note,
                         char *err, size_t err_len);

#endif
