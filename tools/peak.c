/* peak.c: this machine's peaks, for tools/bench.py: the floating-point rate
 * and the memory read rate, each at 1 thread and then at every core.
 *
 *   cc -O2 -march=native -fopenmp -o peak tools/peak.c && ./peak
 *
 * FMA: each thread runs 12 independent chains of fused multiply-adds on
 * vectors of the widest width the compiler targets (AVX-512: 16 floats, AVX2:
 * 8, else 4 with whatever the compiler makes of them), enough chains to hide
 * the FMA latency on current x86 cores; an FMA counts as two floating-point
 * operations. Read: generation reads every weight once per token, so the read
 * rate bounds its tokens/s; each thread sums its share of a 1 GiB float32
 * array (far larger than the caches) in four vector sums. Prints
 *   fma threads N: G GFLOP/s (W-bit vectors)
 *   read threads N: G GB/s
 * best of 5 runs each. */
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
#define CHAINS 12

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* iters x CHAINS FMAs of WIDTH lanes; returns a value so the work is kept.
 * The chains are named variables, so they stay in registers. */
static float chains(long iters) {
    vec a, b, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11;
    for (int i = 0; i < WIDTH; i++) {
        a[i] = 0.999999f, b[i] = 1e-7f;
        c0[i] = 0, c1[i] = 1, c2[i] = 2, c3[i] = 3, c4[i] = 4, c5[i] = 5;
        c6[i] = 6, c7[i] = 7, c8[i] = 8, c9[i] = 9, c10[i] = 10, c11[i] = 11;
    }
    for (long k = 0; k < iters; k++) { // one FMA per chain (a * x + b contracts to an FMA)
        c0 = c0 * a + b, c1 = c1 * a + b, c2 = c2 * a + b, c3 = c3 * a + b, c4 = c4 * a + b, c5 = c5 * a + b;
        c6 = c6 * a + b, c7 = c7 * a + b, c8 = c8 * a + b, c9 = c9 * a + b, c10 = c10 * a + b, c11 = c11 * a + b;
    }
    vec all = c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7 + c8 + c9 + c10 + c11;
    float sum = 0;
    for (int i = 0; i < WIDTH; i++) sum += all[i];
    return sum;
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
    int cores = 1;
#ifdef _OPENMP
    cores = omp_get_num_procs();
#endif
    volatile float sink = 0;
#define EVERY_THREAD_COUNT(threads) \
    for (int threads = 1; threads <= cores; threads = threads == 1 && cores > 1 ? cores : threads + cores)
    long iters = 20000000; // about 0.2 s per thread at a few GHz
    EVERY_THREAD_COUNT(threads) {
        double best = 0;
        for (int rep = 0; rep < 5; rep++) {
            double start = seconds();
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : sink)
#endif
            sink += chains(iters);
            double flops = 2.0 * WIDTH * CHAINS * (double)iters * threads / (seconds() - start);
            if (flops > best) best = flops;
        }
        printf("fma threads %d: %.1f GFLOP/s (%d-bit vectors)\n", threads, best / 1e9, WIDTH * 32);
    }
    size_t n = (size_t)1 << 28; // 1 GiB of floats
    vec *a = aligned_alloc(64, n * sizeof(float));
    if (!a) {
        fprintf(stderr, "peak: cannot allocate 1 GiB for the read test\n");
        return 1;
    }
    for (size_t i = 0; i < n / WIDTH; i++)
        for (int j = 0; j < WIDTH; j++) a[i][j] = 1.0f; // touched, so the pages exist
    EVERY_THREAD_COUNT(threads) {
        size_t share = n / threads / (4 * WIDTH) * (4 * WIDTH); // floats per thread, whole steps
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
                total += sum(a + id * share / WIDTH, share);
            }
            sink += total;
            double t = seconds() - start;
            if (t < best) best = t;
        }
        printf("read threads %d: %.1f GB/s\n", threads, (double)share * threads * sizeof(float) / best / 1e9);
    }
    free(a);
    return sink == 12345.0f; // never: keeps the sums alive
}
