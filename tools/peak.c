/* peak.c: this machine's peaks, for tools/bench.py: the floating-point rate
 * and the memory read rate, each at 1 thread and then at every core (or at
 * the one thread count --threads gives).
 *
 *   cc -O2 -march=native -fopenmp -o peak tools/peak.c
 *   ./peak                  FMA rate, and read rate over a 1 GiB array
 *   ./peak --read MIB,...   read rate over arrays of those sizes only (a
 *                           working set that fits in a cache reads faster)
 *   ./peak --all ...        also every read variant's figure, not only the best
 *   ./peak --threads N ...  at N threads only (the bench measures the read
 *                           limit this way between the programs' runs)
 *
 * FMA: each thread runs 12 independent chains of fused multiply-adds on
 * vectors of the widest width the compiler targets (AVX-512: 16 floats, AVX2:
 * 8, else 4 with whatever the compiler makes of them), enough chains to hide
 * the FMA latency on current x86 cores; an FMA counts as two floating-point
 * operations.
 *
 * Read: generation reads every weight once per token, so the read rate bounds
 * its tokens/s, and this figure must be at least what any program streams on
 * the machine. Each thread sums its share of the array, tried every way that
 * can be the fastest on some CPU (READ_VARIANTS): its share read as 1, 2, 4 or
 * 8 independent streams side by side (more streams keep more cache-line
 * misses in flight), with plain or non-temporal loads (MOVNTDQA, where the
 * compiler targets SSE4.1 or later), on an array in 4 KiB pages or in 2 MiB
 * pages (madvise(MADV_HUGEPAGE), fewer TLB misses; Linux only). Loads are of
 * the widest vector width. The best variant is the figure. Prints
 *   fma threads N: G GFLOP/s (W-bit vectors)
 *   read threads N: G GB/s (S streams, plain|non-temporal loads, 4k|2M pages)
 *   read threads N MiB M: G GB/s (...)        (with --read)
 * best of 5 runs each; with --all, "variant threads N MiB M: ..." lines too. */
#define _DEFAULT_SOURCE // madvise
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__SSE4_1__)
#include <immintrin.h>
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
#define REPS 5

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- FMA ---------------------------------------------------------------- */

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

/* ---- read --------------------------------------------------------------- */

/* One vector at p: a plain load, or a non-temporal one (MOVNTDQA: a hint to
 * keep the line out of the caches; on ordinary memory some CPUs treat it as a
 * plain load). Without SSE4.1 both are plain loads. */
static inline vec load_plain(const vec *p) { return *p; }
static inline vec load_nt(const vec *p) {
#if defined(__AVX512F__)
    return (vec)_mm512_stream_load_si512((void *)p);
#elif defined(__AVX2__)
    return (vec)_mm256_stream_load_si256((const __m256i *)p);
#elif defined(__SSE4_1__) && WIDTH == 4
    return (vec)_mm_stream_load_si128((__m128i *)p);
#else
    return *p;
#endif
}

/* One 64-byte cache line at p, summed into one vector (one load with
 * AVX-512, two with AVX, four with 128-bit vectors). */
#define LINE_VECS (64 / (int)sizeof(vec))
#if WIDTH == 16
#define LINE(LOAD, p) LOAD(p)
#elif WIDTH == 8
#define LINE(LOAD, p) (LOAD(p) + LOAD((p) + 1))
#else
#define LINE(LOAD, p) ((LOAD(p) + LOAD((p) + 1)) + (LOAD((p) + 2) + LOAD((p) + 3)))
#endif
/* STEP: vectors each stream reads per step: four cache lines, summed as a
 * tree, so that the one dependent add per step and stream is not the limit. */
#define STEP (4 * LINE_VECS)

/* The sum of a[0..n) vectors read as S streams: a split into S equal parts,
 * one step from each part in turn (n a multiple of S * STEP). S and the load
 * are constants in each instance below, and the stream loop is unrolled, so
 * that the S sums stay in registers. */
#define DEFINE_READ(S, LOAD)                                                                    \
    static float read_##S##_##LOAD(const vec *a, size_t n) {                                   \
        size_t part = n / S;                                                                    \
        vec acc[S];                                                                             \
        _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) acc[s] = (vec){0};                  \
        for (size_t i = 0; i < part; i += STEP) {                                               \
            _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) {                               \
                const vec *p = a + s * part + i;                                                \
                acc[s] += (LINE(LOAD, p) + LINE(LOAD, p + LINE_VECS)) +                         \
                          (LINE(LOAD, p + 2 * LINE_VECS) + LINE(LOAD, p + 3 * LINE_VECS));      \
            }                                                                                   \
        }                                                                                       \
        vec all = acc[0];                                                                       \
        for (int s = 1; s < S; s++) all += acc[s];                                              \
        float total = 0;                                                                        \
        for (int j = 0; j < WIDTH; j++) total += all[j];                                        \
        return total;                                                                           \
    }
DEFINE_READ(1, load_plain)
DEFINE_READ(2, load_plain)
DEFINE_READ(4, load_plain)
DEFINE_READ(8, load_plain)
DEFINE_READ(1, load_nt)
DEFINE_READ(2, load_nt)
DEFINE_READ(4, load_nt)
DEFINE_READ(8, load_nt)

typedef struct {
    int streams;
    const char *loads;
    float (*read)(const vec *a, size_t n);
} ReadVariant;
static const ReadVariant READ_VARIANTS[] = {
    {1, "plain", read_1_load_plain}, {2, "plain", read_2_load_plain},
    {4, "plain", read_4_load_plain}, {8, "plain", read_8_load_plain},
    {1, "non-temporal", read_1_load_nt}, {2, "non-temporal", read_2_load_nt},
    {4, "non-temporal", read_4_load_nt}, {8, "non-temporal", read_8_load_nt},
};
#define N_VARIANTS (int)(sizeof READ_VARIANTS / sizeof READ_VARIANTS[0])
#define MAX_STREAMS 8

/* An array of `bytes` (rounded down to whole steps of every variant), in 2
 * MiB pages when huge is set and the kernel grants them (else 4 KiB pages),
 * every page written once so that it exists. NULL when out of memory. */
static vec *alloc_array(size_t bytes, int huge, size_t *n) {
    size_t unit = sizeof(vec) * STEP * MAX_STREAMS * 64; // 64: the most threads that split it
    bytes = bytes / unit * unit;
    if (bytes == 0) bytes = unit;
    vec *a = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) return NULL;
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
    madvise(a, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE); // advice: failing it changes nothing
#else
    (void)huge;
#endif
    *n = bytes / sizeof(vec);
    for (size_t i = 0; i < *n; i++)
        for (int j = 0; j < WIDTH; j++) a[i][j] = 1.0f;
    return a;
}

/* Best-of-REPS bytes per second of `threads` threads reading a[0..n) with one
 * variant, each thread its contiguous share; passes over the array repeat
 * until at least 1 GiB has been read per run, so that arrays that fit in a
 * cache are timed over more than a few milliseconds. */
static double read_rate(const ReadVariant *v, const vec *a, size_t n, int threads, volatile float *sink) {
    size_t unit = (size_t)STEP * MAX_STREAMS;
    size_t share = n / threads / unit * unit; // vectors per thread
    size_t bytes = share * threads * sizeof(vec);
    int passes = (int)((((size_t)1 << 30) + bytes - 1) / bytes);
    double best = 1e30;
    for (int rep = 0; rep < REPS; rep++) {
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
            for (int p = 0; p < passes; p++) total += v->read(a + id * share, share);
        }
        *sink += total;
        double t = seconds() - start;
        if (t < best) best = t;
    }
    return (double)bytes * passes / best;
}

static int fma_rates(int lo, int hi, volatile float *sink);
static int read_rates(int lo, int hi, size_t bytes, int whole_gib, int all, volatile float *sink);

/* The sizes of a --read list ("60,438.5"): their count, or -1 when the list
 * is not positive numbers of MiB separated by single commas. */
#define MAX_SIZES 64
static int parse_sizes(const char *list, double *mib) {
    int count = 0;
    for (const char *p = list;; p++) {
        char *end;
        double v = strtod(p, &end);
        if (end == p || !(v > 0 && v <= 1 << 20) || count == MAX_SIZES || (*end && *end != ',')) return -1;
        mib[count++] = v;
        if (!*end) return count;
        p = end;
    }
}

/* Arguments: --read MIB[,MIB...], --threads N and --all; exit 2 with a
 * message for anything else. */
int main(int argc, char **argv) {
    int cores = 1;
#ifdef _OPENMP
    cores = omp_get_num_procs();
#endif
    volatile float sink = 0;
    double mib[MAX_SIZES];
    int n_sizes = 0, all = 0, only_threads = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--all") == 0) {
            all = 1;
        } else if (strcmp(argv[i], "--read") == 0) {
            if (i + 1 == argc) {
                fprintf(stderr, "peak: --read: expected sizes in MiB, e.g. 60,438, got nothing\n");
                return 2;
            }
            n_sizes = parse_sizes(argv[++i], mib);
            if (n_sizes < 0) {
                fprintf(stderr, "peak: --read: expected up to %d sizes in MiB separated by commas, e.g. 60,438, "
                        "got '%s'\n", MAX_SIZES, argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--threads") == 0) {
            char *end = NULL;
            long n = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (i + 1 == argc || *end || end == argv[i + 1] || n < 1 || n > 64) {
                if (i + 1 == argc)
                    fprintf(stderr, "peak: --threads: expected a whole number from 1 to 64, got nothing\n");
                else
                    fprintf(stderr, "peak: --threads: expected a whole number from 1 to 64, got '%s'\n", argv[i + 1]);
                return 2;
            }
            only_threads = (int)n;
            i++;
        } else {
            fprintf(stderr, "peak: unknown argument '%s'; expected --read MIB[,MIB...], --threads N or --all\n",
                    argv[i]);
            return 2;
        }
    }
    int lo = only_threads ? only_threads : 1, hi = only_threads ? only_threads : cores;
    if (n_sizes == 0) {
        fma_rates(lo, hi, &sink);
        if (read_rates(lo, hi, (size_t)1 << 30, 1, all, &sink)) return 1;
    }
    for (int i = 0; i < n_sizes; i++)
        if (read_rates(lo, hi, (size_t)(mib[i] * (1 << 20)), 0, all, &sink)) return 1;
    return sink == 12345.0f; // never: keeps the sums alive
}

/* The thread counts measured: lo, then hi (1 and every core, or the one
 * count --threads gives): at most two, read_rates' MAX_THREAD_COUNTS. */
#define EVERY_THREAD_COUNT(threads, lo, hi) \
    for (int threads = (lo); threads <= (hi); threads = threads < (hi) ? (hi) : (hi) + 1)

/* Prints "fma threads N: G GFLOP/s (W-bit vectors)", best of REPS. */
static int fma_rates(int lo, int hi, volatile float *sink) {
    long iters = 20000000; // about 0.2 s per thread at a few GHz
    EVERY_THREAD_COUNT(threads, lo, hi) {
        double best = 0;
        for (int rep = 0; rep < REPS; rep++) {
            double start = seconds();
            float total = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total)
#endif
            total += chains(iters);
            *sink += total;
            double flops = 2.0 * WIDTH * CHAINS * (double)iters * threads / (seconds() - start);
            if (flops > best) best = flops;
        }
        printf("fma threads %d: %.1f GFLOP/s (%d-bit vectors)\n", threads, best / 1e9, WIDTH * 32);
    }
    return 0;
}

/* Every read variant on an array of `bytes` in 4 KiB and in 2 MiB pages, at
 * each thread count; prints the best per thread count ("read threads N: ..."
 * for the 1 GiB default, "read threads N MiB M: ..." for --read sizes), and
 * every variant with --all. Returns 1 when out of memory. */
static int read_rates(int lo, int hi, size_t bytes, int whole_gib, int all, volatile float *sink) {
    enum { MAX_THREAD_COUNTS = 2 };
    double best[MAX_THREAD_COUNTS] = {0};
    char best_name[MAX_THREAD_COUNTS][96] = {{0}};
    double mib = 0;
    for (int huge = 0; huge <= 1; huge++) {
        size_t n;
        vec *a = alloc_array(bytes, huge, &n);
        if (!a) {
            fprintf(stderr, "peak: cannot allocate %.0f MiB for the read test\n", bytes / 1048576.0);
            return 1;
        }
        mib = n * sizeof(vec) / 1048576.0;
        int t = 0;
        EVERY_THREAD_COUNT(threads, lo, hi) {
            for (int v = 0; v < N_VARIANTS; v++) {
                double rate = read_rate(&READ_VARIANTS[v], a, n, threads, sink);
                char name[96];
                snprintf(name, sizeof name, "%d streams, %s loads, %s pages", READ_VARIANTS[v].streams,
                         READ_VARIANTS[v].loads, huge ? "2M" : "4k");
                if (all) printf("variant threads %d MiB %.0f: %.1f GB/s (%s)\n", threads, mib, rate / 1e9, name);
                if (rate > best[t]) best[t] = rate, memcpy(best_name[t], name, sizeof name);
            }
            t++;
        }
        munmap(a, n * sizeof(vec));
    }
    int t = 0;
    EVERY_THREAD_COUNT(threads, lo, hi) {
        if (whole_gib)
            printf("read threads %d: %.1f GB/s (%s)\n", threads, best[t] / 1e9, best_name[t]);
        else
            printf("read threads %d MiB %.0f: %.1f GB/s (%s)\n", threads, mib, best[t] / 1e9, best_name[t]);
        t++;
    }
    fflush(stdout);
    return 0;
}
