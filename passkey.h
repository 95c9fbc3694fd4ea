/* passkey.h: the passkey prompt's parts (passkey.c), for -m passkey and the
 * tests (docs/passkey.md). */
#ifndef PASSKEY_H
#define PASSKEY_H

#include <stddef.h>

/* Filler sentences: a text with white space runs made single spaces, cut
 * after each ".", "!" or "?" that a space follows (docs/passkey.md §1). */
typedef struct {
    char *text;    // the normalized text, each sentence NUL-terminated in place
    char **s;      // (n) the sentences
    size_t *len;   // (n) their lengths
    int n;
} Sentences;

void split_sentences(Sentences *out, const char *text, size_t n);
void free_sentences(Sentences *s);
/* TASK " " filler[start..start+i) KEY filler[start+i..start+k) " " QUESTION. */
char *passkey_prompt(const Sentences *f, int start, int k, int i, const char *key, size_t *len);
/* The first run of decimal digits in a continuation, and whether it is key. */
const char *passkey_answer(const char *text, size_t *n_digits);
int passkey_correct(const char *text, const char *key);

#endif
