/* test_sampler.c: the sampler: greedy, the repetition penalty and its
 * window, top-k / top-p / min-p at their limits, temperature-1 draws against
 * softmax, and the same seed giving the same draws. Part of test_run
 * (test_run.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"

void test_sampler(void) {
    enum { V = 6 };
    const float base[V] = {1.0f, 3.0f, 2.5f, -1.0f, 0.5f, 2.9f};
    float logits[V];
    Sampler s;
    int hist[4] = {1, 1, 5, 0};

    build_sampler(&s, V, 0.0f, 0.9f, 0, 0.0f, 1.0f, 64, 1);
    memcpy(logits, base, sizeof base);
    CHECK(sample(&s, logits, hist, 0) == 1, "greedy must pick the argmax 1");
    free_sampler(&s);

    // Repetition penalty 2 over history {1, 5}: 3 -> 1.5, 2.9 -> 1.45, so 2 wins.
    build_sampler(&s, V, 0.0f, 1.0f, 0, 0.0f, 2.0f, 64, 1);
    memcpy(logits, base, sizeof base);
    CHECK(sample(&s, logits, hist, 3) == 2, "repetition penalty should make token 2 the argmax");
    memcpy(logits, base, sizeof base);
    s.repeat_last_n = 1; // only token 5 is recent: 1 (3.0) stays the best
    CHECK(sample(&s, logits, hist, 3) == 1, "repeat_last_n=1 should only penalize the last token");
    free_sampler(&s);

    // top-k 1, tiny top-p and min-p 1 all reduce to greedy.
    float settings[3][3] = {{1, 1.0f, 0}, {0, 1e-6f, 0}, {0, 1.0f, 1.0f}}; // topk, topp, minp
    for (int c = 0; c < 3; c++) {
        build_sampler(&s, V, 1.0f, settings[c][1], (int)settings[c][0], settings[c][2], 1.0f, 64, (uint64_t)c);
        int all_one = 1;
        for (int i = 0; i < 200; i++) {
            memcpy(logits, base, sizeof base);
            all_one &= sample(&s, logits, hist, 0) == 1;
        }
        CHECK(all_one, "truncation setting %d should always pick token 1", c);
        free_sampler(&s);
    }

    // Plain temperature-1 sampling follows softmax(logits): 40000 draws, 0.01 absolute.
    build_sampler(&s, V, 1.0f, 1.0f, 0, 0.0f, 1.0f, 64, 1234);
    int counts[V] = {0};
    for (int i = 0; i < 40000; i++) {
        memcpy(logits, base, sizeof base);
        counts[sample(&s, logits, hist, 0)]++;
    }
    float p[V];
    memcpy(p, base, sizeof base);
    softmax(p, V);
    for (int i = 0; i < V; i++)
        CHECK(close_to(counts[i] / 40000.0, p[i], 0.01), "token %d drawn %.4f of the time, softmax says %.4f", i,
              counts[i] / 40000.0, p[i]);
    free_sampler(&s);

    // top-k 2 only ever returns the two best (1 and 5); same seed, same draws.
    Sampler a, b;
    build_sampler(&a, V, 1.0f, 1.0f, 2, 0.0f, 1.0f, 64, 99);
    build_sampler(&b, V, 1.0f, 1.0f, 2, 0.0f, 1.0f, 64, 99);
    int only_top2 = 1, same = 1;
    for (int i = 0; i < 500; i++) {
        float la[V], lb[V];
        memcpy(la, base, sizeof base), memcpy(lb, base, sizeof base);
        int x = sample(&a, la, hist, 0), y = sample(&b, lb, hist, 0);
        only_top2 &= x == 1 || x == 5;
        same &= x == y;
    }
    CHECK(only_top2, "top-k 2 returned a token outside the top 2");
    CHECK(same, "two samplers with the same seed diverged");
    free_sampler(&a);
    free_sampler(&b);
}
