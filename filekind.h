/* filekind.h: what a file given to run is when it is not what run reads
 * there: a safetensors or PyTorch file, a tokenizer, or a checkpoint,
 * recognised by its first bytes, with the export.py command that converts it
 * (filekind.c). Only the error paths call it: the checkpoint loader (run.c)
 * and the tokenizer loading in main.
 */
#ifndef FILEKIND_H
#define FILEKIND_H

#include <stddef.h>

/* What the file was given as. */
typedef enum { AS_CHECKPOINT, AS_TOKENIZER } FileRole;

/* When the file at path is a format this program knows of but not one run
 * reads in `role` (a safetensors file given as the checkpoint, a checkpoint
 * given to -z, ...), write what it is and what to do, e.g. "a Hugging Face
 * tokenizer.json; convert it with: python3 export.py tokenizer.bin
 * --tokenizer x.json", into out and
 * return 1. Return 0 (out untouched) when it is not recognised, or is the
 * right kind of file (then the loader's own message stands). */
int explain_foreign_file(const char *path, FileRole role, char *out, size_t out_len);

#endif
