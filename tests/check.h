/* check.h: what the files of the test_run binary share.
 *
 * test_run is one program built from several files, one subject each
 * (TEST_RUN_C in the Makefile): test_rope.c, test_kernels.c, test_forward.c,
 * test_sampler.c, test_loader.c and test_modes.c hold the checks, test_run.c
 * main, the counters and the helpers declared here. Every file includes this
 * header after defining _POSIX_C_SOURCE.
 */
#ifndef TESTS_CHECK_H
#define TESTS_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "run.h"

/* Passed and failed checks, over every file (test_run.c prints them). */
extern int n_pass, n_fail;

#define CHECK(cond, ...)                                                                                      \
    do {                                                                                                      \
        if (cond) {                                                                                           \
            n_pass++;                                                                                         \
        } else {                                                                                              \
            n_fail++;                                                                                         \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                       \
            printf(__VA_ARGS__);                                                                              \
            printf("\n");                                                                                     \
        }                                                                                                     \
    } while (0)

/* ---- Helpers (test_run.c) ------------------------------------------------ */

int close_to(double a, double b, double tol);
double dot64(const float *a, const float *b, int n); // a . b summed in double

/* One random stream for every test (the sampler's xorshift, seed 42): main
 * runs the tests in a fixed order, so each draws the same numbers every run. */
extern uint64_t test_rng;
float randn(void);
void fill_randn(float *x, size_t n, float scale);

Transformer attention_fixture(int n_heads, int n_kv_heads, int head_size, int n_ctx, float *scores,
                              float *attn_tiles);

/* Checkpoint files: a path in $TMPDIR (else the system's temporary folder)
 * named test_run_<pid>_<name> (one static buffer: the next call overwrites
 * it), little-endian fields, a tiny valid version-1 header, a random float32
 * checkpoint of the given dimensions. */
const char *tmp_path(const char *name);
void put_i32(unsigned char *p, int32_t v);
void put_f32(unsigned char *p, float f);
void good_header(unsigned char *h);
void write_random_checkpoint(const char *path, int dim, int hidden, int layers, int heads, int kv_heads, int vocab,
                             int seq_len);

/* ---- The tests, by file (test_run.c's main calls them) ------------------- */

/* test_rope.c */
void test_rope_worked_example(void);
void test_rope_properties(void);
void test_rope_scaling_vectors(void);
void test_rope_table_precision(void);
void test_attn_factor_applied_once(void);
/* test_forward.c */
void test_ops(void);
void test_block_prefill(void);
void test_block_strategies(void);
void test_cache_map(void);
/* test_sampler.c */
void test_sampler(void);
/* test_loader.c */
void test_loader(void);
/* test_kernels.c */
void test_matmul_kernels(void);
void test_generation_rows(void);
void test_generation_q8_runs(void);
void test_column_passes(void);
void test_q8_group_sizes(void);
void test_q8_rows_and_quantize(void);
void test_q4(void); // test_q4.c
void test_attention_scores(void);
void test_exp_fast(void);
void test_attention_block(void);
void test_attention_block_self_extend(void);
void test_attention_block_sinks_and_frames(void);
void test_half(void);
void test_kv_q8(void);
/* test_modes.c */
void test_ppl_score_arguments(void);
void test_passkey_text(void);

#endif
