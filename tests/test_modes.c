/* test_modes.c: the C functions of the modes ppl.c and passkey.c: ppl_score's
 * rejections and window counts, the passkey filler's sentences, its prompt and
 * the answer's scoring. Part of test_run (test_run.c); tests/test_modes.py,
 * tests/test_passkey.py and tests/test_kl.py run the modes themselves.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "passkey.h"
#include "ppl.h"

/* ppl_score rejects what it cannot score with -1 and a one-line message
 * (no crash, nothing leaked: the sanitizer builds run this too), and on good
 * input scores every text token once: n_ids tokens in ceil(...) windows. */
void test_ppl_score_arguments(void) {
    const char *path = tmp_path("ppl.bin");
    write_random_checkpoint(path, 64, 96, 2, 4, 2, 50, 64);
    char err[512];
    Transformer t;
    if (build_transformer(&t, path, NULL, 16, KV_F32, err, sizeof err) != 0) {
        CHECK(0, "random checkpoint rejected: %s", err);
        return;
    }
    int ids[40];
    for (int i = 0; i < 40; i++) ids[i] = i % 50;
    PplScore score;
    struct { const char *name; int n_ids, stride, bad_token; const char *expect; } cases[] = {
        {"empty text", 0, 15, 0, "no tokens"}, {"stride 0", 40, 0, 0, "--stride"},
        {"stride above ctx - 1", 40, 16, 0, "--stride"}, {"token outside the vocabulary", 40, 15, 1, "vocabulary"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ids[30] = cases[c].bad_token ? 50 : 30;
        err[0] = '\0';
        int rc = ppl_score(&t, ids, cases[c].n_ids, 1, cases[c].stride, &score, NULL, NULL, err, sizeof err);
        CHECK(rc == -1 && strstr(err, cases[c].expect) && !strchr(err, '\n') && !score.pos_sum,
              "ppl_score, %s: expected -1 and \"%s\", got %d \"%s\"", cases[c].name, cases[c].expect, rc, err);
    }
    ids[30] = 30;
    int rc = ppl_score(&t, ids, 40, 1, 10, &score, NULL, NULL, err, sizeof err);
    CHECK(rc == 0 && score.n_scored == 40 && score.n_windows == 4, "ppl_score of 40 tokens, ctx 16, stride 10: "
          "rc %d, %ld scored in %d windows (expected 40 in 4)", rc, score.n_scored, score.n_windows);
    free_ppl_score(&score);
    // Without BOS: spans of 16 tokens from 0, 10, 20, 30 (the last ends the text); the first token is
    // context only, and a window's first token was scored by the one before, so 39 scored.
    rc = ppl_score(&t, ids, 40, 0, 10, &score, NULL, NULL, err, sizeof err);
    CHECK(rc == 0 && score.n_scored == 39 && score.n_windows == 4 && score.pos_count[0] == 0 &&
              score.pos_count[1] == 1 && score.pos_count[15] == 3,
          "ppl_score without BOS, 40 tokens, ctx 16, stride 10: rc %d, %ld scored in %d windows (expected 39 in 4)",
          rc, score.n_scored, score.n_windows);
    free_ppl_score(&score);
    rc = ppl_score(&t, ids, 1, 0, 10, &score, NULL, NULL, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "no tokens"), "ppl_score without BOS of one token: %d \"%s\"", rc, err);
    free_transformer(&t);
    remove(path);
}

/* Passkey: filler sentences (white space runs made one space, cut after
 * ".", "!" or "?" before a space), the prompt's layout, and the answer (the
 * first run of digits). docs/passkey.md is the specification. */
void test_passkey_text(void) {
    const char text[] = "  One.  Two!\n\nThree?\tMr. Smith said \"hi.\" Four 2.5 five. end";
    const char *want[] = {"One.", "Two!", "Three?", "Mr.", "Smith said \"hi.\" Four 2.5 five.", "end"};
    Sentences f;
    split_sentences(&f, text, strlen(text));
    int ok = f.n == 6;
    for (int i = 0; ok && i < 6; i++) ok = strlen(want[i]) == f.len[i] && !memcmp(f.s[i], want[i], f.len[i]);
    CHECK(ok, "split_sentences: %d sentences, first \"%s\"", f.n, f.n ? f.s[0] : "");
    size_t len;
    char *p = passkey_prompt(&f, 4, 3, 1, "123", &len);
    const char *expect = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
                         "them. I will quiz you about the important information there. Smith said \"hi.\" Four 2.5 "
                         "five. The pass key is 123. Remember it. 123 is the pass key. end One. What is the pass "
                         "key? The pass key is";
    CHECK(len == strlen(expect) && !strcmp(p, expect), "passkey_prompt (start 4, 3 sentences, key after 1): %s", p);
    free(p);
    p = passkey_prompt(&f, 0, 2, 2, "7", &len); // the key after the last sentence
    CHECK(strstr(p, "there. One. Two! The pass key is 7. Remember it. 7 is the pass key. What is") != NULL,
          "passkey_prompt (key last): %s", p);
    free(p);
    free_sentences(&f);
    split_sentences(&f, " \n\t ", 4);
    CHECK(f.n == 0, "split_sentences of white space: %d sentences", f.n);
    free_sentences(&f);
    struct { const char *text, *answer; } answers[] = {
        {" 12345.", "12345"}, {" is 123 or 456", "123"}, {"no digits", ""}, {"", ""}, {"x0042y", "0042"},
    };
    for (size_t k = 0; k < sizeof answers / sizeof answers[0]; k++) {
        size_t n;
        const char *a = passkey_answer(answers[k].text, &n);
        CHECK(n == strlen(answers[k].answer) && !memcmp(a, answers[k].answer, n), "passkey_answer(\"%s\"): \"%.*s\"",
              answers[k].text, (int)n, a);
    }
    struct { const char *text, *key; int correct; } scores[] = {
        {" 12345.", "12345", 1}, {" 12345", "12345", 1}, {" 123456.", "12345", 0}, {" 1234.", "12345", 0},
        {" is 12345 or 9", "12345", 1}, {" 9 or 12345", "12345", 0}, {"", "1", 0}, {"x1y", "1", 1},
    };
    for (size_t k = 0; k < sizeof scores / sizeof scores[0]; k++)
        CHECK(passkey_correct(scores[k].text, scores[k].key) == scores[k].correct, "passkey_correct(\"%s\", %s)",
              scores[k].text, scores[k].key);
}
