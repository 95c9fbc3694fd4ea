/* stream.c: how close float32 generation's matrix products come to reading
 * memory and nothing else, for docs/performance.md (the section on float32
 * generation at the read limit). Per token it reads the matrices of a Llama
 * shape in the order run.c's forward pass does (per layer wq, wk, wv, wo, w1,
 * w3, w2, then the classifier), from an array of exactly those bytes, in one
 * of two ways:
 *   kernel  kernels.c's matmul for one token (generation's float32 kernel,
 *           with kernels_init's choices for this CPU) against a fixed input;
 *   bare    each thread sums its share of every matrix's rows (the same
 *           contiguous share matmul's runs of rows give it on AMD) as 4
 *           independent streams of the widest vectors: the loads, their sums
 *           and nothing else.
 * Each layer's matrices lie next to each other in the array (a model file
 * holds every layer's wq, then every layer's wk, ...; each matrix is a
 * contiguous read of at least a few hundred KB either way). It prints the
 * median tokens/s of the tokens it times, so that the two, run itself and
 * llama.cpp can be compared in one rotation:
 *
 *   cc -O3 -march=native -fno-trapping-math -fopenmp -o stream tools/stream.c kernels.c -lm
 *   OMP_NUM_THREADS=1 ./stream kernel 768 2048 12 768 32000     # the 110M shape
 *   OMP_NUM_THREADS=1 ./stream bare 576 1536 30 192 49152       # SmolLM2-135M's
 *
 * Arguments: kernel|bare DIM HIDDEN_DIM N_LAYERS KV_DIM VOCAB [TOKENS]
 * (KV_DIM at most DIM, as in every Llama; default 60 tokens, after one
 * untimed token that warms the caches and starts the threads).
 * The array is anonymous memory, written once, in 4 KiB pages like a model
 * file's mapping (madvise(MADV_NOHUGEPAGE), where the system would otherwise
 * give it 2 MiB pages), rather than a file, so that any shape can be tried
 * without a checkpoint. Exit 2 with one line for
 * bad arguments, 1 when out of memory. */
#define _DEFAULT_SOURCE // MAP_ANONYMOUS
#include <stdint.h> // SIZE_MAX
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "../kernels.h"

#define WIDTH SIMD_FLOATS // kernels.h: the widest vectors the compiler targets (8 in a portable build)
typedef float vec __attribute__((vector_size(WIDTH * sizeof(float)), aligned(4))); // loads at any float

#define MAX_TOKENS 1000

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The sum of n floats at p read as 4 streams side by side (n split in 4
 * parts, one vector from each in turn; the last n % (4 * WIDTH) floats left
 * out). */
static float sum_4_streams(const float *p, size_t n) {
    size_t part = n / 4 / WIDTH * WIDTH;
    const float *p0 = p, *p1 = p + part, *p2 = p + 2 * part, *p3 = p + 3 * part;
    vec s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (size_t i = 0; i < part; i += WIDTH) {
        s0 += *(const vec *)(p0 + i), s1 += *(const vec *)(p1 + i);
        s2 += *(const vec *)(p2 + i), s3 += *(const vec *)(p3 + i);
    }
    vec all = (s0 + s1) + (s2 + s3);
    float total = 0;
    for (int j = 0; j < WIDTH; j++) total += all[j];
    return total;
}

/* bare: each thread sums its rows of w (d, n): ceil(d / threads) rows each,
 * in thread order (the share matmul's runs of rows take on AMD). */
static float bare(const float *w, int n, int d) {
    float total = 0;
#pragma omp parallel reduction(+ : total)
    {
        int threads = 1, t = 0;
#ifdef _OPENMP
        threads = omp_get_num_threads(), t = omp_get_thread_num();
#endif
        int per = (d + threads - 1) / threads, a = t * per < d ? t * per : d, b = a + per < d ? a + per : d;
        total += sum_4_streams(w + (size_t)a * n, (size_t)(b - a) * n);
    }
    return total;
}

/* One token: out = w x for every matrix of the shape, in the forward pass's
 * order, the matrices one after another in the array. Returns a number that
 * depends on every read, so that none is left out. */
static float one_token(int use_kernel, const float *array, const int *shape, const float *x, float *out) {
    int dim = shape[0], hidden = shape[1], layers = shape[2], kv_dim = shape[3], vocab = shape[4];
    int rows[7] = {dim, kv_dim, kv_dim, dim, hidden, hidden, dim}; // wq wk wv wo w1 w3 w2: (rows, cols)
    int cols[7] = {dim, dim, dim, dim, dim, dim, hidden};
    const float *w = array;
    float total = 0;
    for (int m = 0; m <= 7 * layers; m++) {
        int last = m == 7 * layers; // the classifier
        int d = last ? vocab : rows[m % 7], n = last ? dim : cols[m % 7];
        if (use_kernel) {
            Matrix mat = {.type = WEIGHT_F32, .values = w}; // float32: no scales
            matmul(out, x, mat, 1, n, d, NULL);
            total += out[d - 1];
        } else {
            total += bare(w, n, d);
        }
        w += (size_t)d * n;
    }
    return total;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *names[6] = {"DIM", "HIDDEN_DIM", "N_LAYERS", "KV_DIM", "VOCAB", "TOKENS"};
    if (argc < 7 || argc > 8 || (strcmp(argv[1], "kernel") != 0 && strcmp(argv[1], "bare") != 0)) {
        fprintf(stderr, "stream: expected kernel|bare DIM HIDDEN_DIM N_LAYERS KV_DIM VOCAB [TOKENS], got %d "
                "argument(s)%s%s\n", argc - 1, argc > 1 ? " starting with " : "", argc > 1 ? argv[1] : "");
        return 2;
    }
    int shape[6] = {0, 0, 0, 0, 0, 60}; // the last: tokens
    for (int i = 0; i < argc - 2; i++) {
        char *end;
        long v = strtol(argv[i + 2], &end, 10);
        long most = i == 5 ? MAX_TOKENS : 1 << 20;
        if (end == argv[i + 2] || *end || v < 1 || v > most) {
            fprintf(stderr, "stream: %s: expected a whole number from 1 to %ld, got '%s'\n", names[i], most,
                    argv[i + 2]);
            return 2;
        }
        shape[i] = (int)v;
    }
    if (shape[3] > shape[0]) {
        fprintf(stderr, "stream: KV_DIM: expected at most DIM (%d), got %d\n", shape[0], shape[3]);
        return 2;
    }
    int dim = shape[0], hidden = shape[1], layers = shape[2], kv_dim = shape[3], vocab = shape[4], tokens = shape[5];
    size_t floats = (size_t)layers * ((size_t)2 * dim * dim + (size_t)2 * kv_dim * dim + (size_t)3 * hidden * dim) +
                    (size_t)vocab * dim;
    double mib = (double)floats * sizeof(float) / 1048576.0;
    float *array = floats > SIZE_MAX / sizeof(float) ? MAP_FAILED :
                   mmap(NULL, floats * sizeof(float), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int widest = dim > hidden ? dim : hidden, longest = vocab > widest ? vocab : widest; // kv_dim <= dim
    float *x = malloc((size_t)widest * sizeof(float)), *out = malloc((size_t)longest * sizeof(float));
    if (array == MAP_FAILED || !x || !out) {
        fprintf(stderr, "stream: out of memory for %.0f MiB of weights\n", mib);
        return 1;
    }
#ifdef MADV_NOHUGEPAGE
    madvise(array, floats * sizeof(float), MADV_NOHUGEPAGE); // 4 KiB pages, as a model file's mapping; advice only
#endif
    for (size_t i = 0; i < floats; i++) array[i] = (float)(i % 7) * 0.01f;
    for (int i = 0; i < widest; i++) x[i] = (float)(i % 5) * 0.1f;
    kernels_init();
    int use_kernel = strcmp(argv[1], "kernel") == 0;
    double times[MAX_TOKENS];
    volatile float sink = one_token(use_kernel, array, shape, x, out);
    for (int t = 0; t < tokens; t++) {
        double start = seconds();
        sink += one_token(use_kernel, array, shape, x, out);
        times[t] = seconds() - start;
    }
    qsort(times, (size_t)tokens, sizeof times[0], compare);
    printf("%s: %.1f tokens/s (median of %d), %.3f MB per token\n", argv[1], 1.0 / times[tokens / 2], tokens,
           (double)floats * sizeof(float) / 1e6);
    (void)sink; // volatile: the sums were stored, so none was left out
    return 0;
}
