/* quant_driver: gguf_quants.c's dequantizers on the command line, for
 * tests/test_gguf_quants.py (which compares them with the gguf package's
 * gguf.quants.dequantize, bit for bit).
 *
 *   quant_driver TYPE [matrix]
 *       TYPE:   the ggml type number (2 = Q4_0, 3 = Q4_1, ..., 14 = Q6_K)
 *       stdin:  whole blocks of that type
 *       stdout: their values, float32 little-endian
 *       stderr: "values V bytes B" (the type's block size)
 *       matrix: (Q4_0 and Q4_1) the values as the kernels read them: the
 *               blocks split as the loader splits them (gguf_q4_split) into
 *               a Matrix of one block a row, each row through matrix_row
 *   Exit 1 with one line for a type gguf_quants.c does not read, or input
 *   that is not whole blocks; 2 for bad usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_quants.h"
#include "kernels.h"

/* The values of n blocks of Q4_0 or Q4_1 through the kernels' Matrix (one block a row). */
static int matrix_values(uint32_t type, const unsigned char *in, size_t n, float *out) {
    uint8_t *qs = malloc(16 * n + 1);
    uint16_t *d = malloc(2 * n + 2), *m = malloc(2 * n + 2);
    int rc = qs && d && m ? gguf_q4_split(type, in, n, qs, d, m) : -1;
    Matrix mat = {type == GGML_Q4_1 ? WEIGHT_Q4_1 : WEIGHT_Q4_0, 32, qs, NULL, d, type == GGML_Q4_1 ? m : NULL};
    for (size_t k = 0; rc == 0 && k < n; k++) matrix_row(out + 32 * k, mat, (int)k, 32);
    free(qs), free(d), free(m);
    return rc;
}

int main(int argc, char **argv) {
    int matrix = argc == 3 && !strcmp(argv[2], "matrix");
    if (argc != 2 && !matrix) {
        fprintf(stderr, "usage: quant_driver TYPE [matrix] < blocks > float32 values\n");
        return 2;
    }
    char *end;
    unsigned long type = strtoul(argv[1], &end, 10);
    size_t values, bytes;
    if (*end || end == argv[1] || type > UINT32_MAX || !gguf_quant_block((uint32_t)type, &values, &bytes)) {
        fprintf(stderr, "quant_driver: type %s is not one gguf_dequantize reads\n", argv[1]);
        return 1;
    }
    size_t n = 0, cap = 1 << 16;
    unsigned char *in = malloc(cap);
    for (size_t got; in && (got = fread(in + n, 1, cap - n, stdin)) > 0;) {
        n += got;
        unsigned char *grown = n == cap ? realloc(in, cap *= 2) : in;
        if (!grown) free(in);
        in = grown;
    }
    if (!in || n % bytes) {
        fprintf(stderr, "quant_driver: %zu bytes of input: expected whole blocks of %zu bytes\n", n, bytes);
        return 1;
    }
    float *out = malloc((n / bytes * values + 1) * sizeof *out);
    if (!out || (matrix ? matrix_values((uint32_t)type, in, n / bytes, out)
                        : gguf_dequantize((uint32_t)type, in, n / bytes, out)) != 0) {
        fprintf(stderr, "quant_driver: type %s %s\n", argv[1], matrix ? "is not Q4_0 or Q4_1" : "failed");
        return 1;
    }
    fwrite(out, sizeof *out, n / bytes * values, stdout); // the test machines are little-endian, as GGUF
    fprintf(stderr, "values %zu bytes %zu\n", values, bytes);
    free(in);
    free(out);
    return 0;
}
