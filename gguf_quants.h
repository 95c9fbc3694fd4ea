/* gguf_quants.h: ggml's tensor type numbers, and the dequantization of the
 * block-quantized types run reads from a GGUF file (gguf_quants.c, where each
 * block's layout is written out beside its formula).
 *
 * A quantized tensor is a sequence of blocks; a block holds `values` numbers
 * in `bytes` bytes: a few scales (IEEE half precision, or small integers
 * scaled by one), then the quantized values packed as 4, 5, 6 or 8 bits. Rows
 * are whole blocks (gguf.c checks it), so a row dequantizes on its own.
 *
 * gguf_dequantize gives, bit for bit, the float32 numbers that the gguf
 * Python package's dequantizer (gguf.quants.dequantize, which export.py
 * uses) gives for the same bytes: each half is widened exactly and each
 * product and sum is rounded to float32 in the same order.
 */
#ifndef GGUF_QUANTS_H
#define GGUF_QUANTS_H

#include <stddef.h>
#include <stdint.h>

/* ggml tensor types run reads (the numbers the GGUF tensor table stores;
 * gguf.c knows every type's name and block size). */
enum {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
    GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_BF16 = 30
};

/* Values and bytes per block of a type gguf_dequantize reads (Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K): 1 and the sizes; 0 for another type. */
int gguf_quant_block(uint32_t type, size_t *values, size_t *bytes);

/* n_blocks blocks of `type` at src (n_blocks * bytes bytes) as float32 into
 * out (n_blocks * values floats). Returns 0, or -1 (nothing written) for a
 * type it does not read. A NaN or infinite scale gives NaN or infinite
 * values; the caller checks (gguf_model.c refuses them). */
int gguf_dequantize(uint32_t type, const unsigned char *src, size_t n_blocks, float *out);

/* n_blocks Q4_0 or Q4_1 blocks at src in the kernels' layout (kernels.h's
 * q4_0 and q4_1): block k's 16 bytes of nibbles to qs + 16 k, its half d to
 * d[k] and (Q4_1) its half m to m[k], bytes and bits unchanged. Returns 0,
 * or -1 (nothing written) for another type. */
int gguf_q4_split(uint32_t type, const unsigned char *src, size_t n_blocks, uint8_t *qs, uint16_t *d, uint16_t *m);

#endif
