/* read_bandwidth.c: how fast this machine reads memory, for tools/bench.py.
 *
 *   cc -O2 -march=native -fopenmp -o read_bandwidth tools/read_bandwidth.c && ./read_bandwidth
 *
 * Generation reads every weight once per token, so the read rate bounds its
 * tokens/s. Each thread sums its share of a 1 GiB float32 array (far larger
 * than the caches) with independent vector sums, at the widest vector width
 * the compiler targets. Prints one line per thread count (1, then every
 * core): "threads N: G GB/s", best of 5 passes. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__)
#define WIDTH 16
#elif defined(__AVX__)
#define WIDTH 8
#else
#define WIDTH 4
#endif
typedef float vec __attribute__((vector_size(WIDTH * sizeof(float))));

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The sum of a[0..n) (n a multiple of 4 * WIDTH) in four vector sums. */
static float sum(const vec *a, size_t n) {
    vec s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (size_t i = 0; i < n / WIDTH; i += 4) s0 += a[i], s1 += a[i + 1], s2 += a[i + 2], s3 += a[i + 3];
    vec all = s0 + s1 + s2 + s3;
    float total = 0;
    for (int i = 0; i < WIDTH; i++) total += all[i];
    return total;
}

int main(void) {
    size_t n = (size_t)1 << 28; // 1 GiB of floats
    vec *a = aligned_alloc(64, n * sizeof(float));
    if (!a) {
        fprintf(stderr, "read_bandwidth: cannot allocate 1 GiB\n");
        return 1;
    }
    for (size_t i = 0; i < n / WIDTH; i++)
        for (int j = 0; j < WIDTH; j++) a[i][j] = 1.0f; // touched, so the pages exist
    int cores = 1;
#ifdef _OPENMP
    cores = omp_get_num_procs();
#endif
    volatile float sink = 0;
    for (int threads = 1; threads <= cores; threads = threads == 1 && cores > 1 ? cores : threads + cores) {
        double best = 1e30;
        for (int rep = 0; rep < 5; rep++) {
            double start = seconds();
            float total = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total)
#endif
            {
                int id = 0;
#ifdef _OPENMP
                id = omp_get_thread_num();
#endif
                size_t share = n / threads / (4 * WIDTH) * (4 * WIDTH); // floats per thread, whole steps
                total += sum(a + id * share / WIDTH, share);
            }
            sink += total;
            double t = seconds() - start;
            if (t < best) best = t;
        }
        printf("threads %d: %.1f GB/s\n", threads, (double)(n / threads / (4 * WIDTH) * (4 * WIDTH)) * threads *
                                                      sizeof(float) / best / 1e9);
    }
    free(a);
    return sink == 12345.0f; // never: keeps the sums alive
}
