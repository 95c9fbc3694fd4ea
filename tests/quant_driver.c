/* quant_driver: gguf_quants.c's dequantizers on the command line, for
 * tests/test_gguf_quants.py (which compares them with the gguf package's
 * gguf.quants.dequantize, bit for bit).
 *
 *   quant_driver TYPE
 *       TYPE:   the ggml type number (2 = Q4_0, 3 = Q4_1, ..., 14 = Q6_K)
 *       stdin:  whole blocks of that type
 *       stdout: their values, float32 little-endian
 *       stderr: "values V bytes B" (the type's block size)
 *   Exit 1 with one line for a type gguf_quants.c does not read, or input
 *   that is not whole blocks; 2 for bad usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_quants.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: quant_driver TYPE < blocks > float32 values\n");
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
    if (!out || gguf_dequantize((uint32_t)type, in, n / bytes, out) != 0) return 1;
    fwrite(out, sizeof *out, n / bytes * values, stdout); // the test machines are little-endian, as GGUF
    fprintf(stderr, "values %zu bytes %zu\n", values, bytes);
    free(in);
    free(out);
    return 0;
}
