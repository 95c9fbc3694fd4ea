/* gguf_quants.c: ggml's block-quantized tensor types, dequantized to float32
 * (gguf_quants.h). Each type's block layout is written out beside its
 * formula, so that kernels that run the blocks as they are can be written
 * from the same page.
 *
 * Notation. A block holds n values x[0 .. n-1]. "f16" is an IEEE half,
 * little-endian, widened to float32 exactly (every half is a float32). "q"
 * is a small integer read from packed bits (unsigned but for Q8_0's int8).
 * Every formula is evaluated in float32 in the order written, as the gguf
 * Python package computes it with numpy, so the results are the same bits.
 * In fact every product here is exact in float32: a half has 11 significant
 * bits, a sub-block scale at most 7 (6 bits, or Q6_K's int8), a value at
 * most 5 (Q8_0's int8: 7, with no sub-block scale), and 11 + 7 + 5 = 23
 * bits fit float32's 24; only the sums (+ m, - M) round. So the products
 * may be done in any order, and a fused multiply-add would give the same
 * bits too; the sums are still written as statements of their own, in the
 * order numpy uses.
 *
 * Packing of 4-bit values, used by every type below but Q8_0: byte j of a
 * run of 16 bytes holds value j in its low nibble and value j + 16 in its
 * high nibble (runs of 32 bytes in Q4_K and Q5_K: values j and j + 32; of 64
 * in Q6_K: j and j + 64), so that one mask and one shift unpack a whole run.
 */
#include <math.h>
#include <string.h>

#include "gguf_quants.h"

/* The little-endian IEEE half at p as float32, exactly (every half is a
 * float32): sign, 5-bit exponent e, 10-bit fraction f; e = 0 is zero or a
 * subnormal f * 2^-24, e = 31 infinity or NaN. */
static float f16_at(const unsigned char *p) {
    unsigned h = (unsigned)(p[0] | p[1] << 8), e = h >> 10 & 0x1F, f = h & 0x3FF;
    float v = e == 0 ? ldexpf((float)f, -24) : e == 31 ? (f ? NAN : INFINITY) : ldexpf((float)(f | 0x400), (int)e - 25);
    return h & 0x8000 ? -v : v;
}

static uint32_t u32_at(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- 32 values a block, one scale ------------------------------------------ */

/* Q4_0, 18 bytes:  f16 d | 16 bytes of 4-bit q (low nibbles x[0..15], high x[16..31])
 *   x[i] = d * (q[i] - 8)                                   (q in 0..15: -8d .. 7d) */
static void q4_0_block(const unsigned char *b, float *x) {
    float d = f16_at(b);
    for (int j = 0; j < 16; j++) {
        x[j] = d * (float)((b[2 + j] & 0x0F) - 8);
        x[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
    }
}

/* Q4_1, 20 bytes:  f16 d | f16 m | 16 bytes of 4-bit q (as Q4_0)
 *   x[i] = d * q[i] + m                                     (q in 0..15: m .. m + 15d) */
static void q4_1_block(const unsigned char *b, float *x) {
    float d = f16_at(b), m = f16_at(b + 2);
    for (int j = 0; j < 16; j++) {
        float lo = d * (float)(b[4 + j] & 0x0F), hi = d * (float)(b[4 + j] >> 4);
        x[j] = lo + m;
        x[j + 16] = hi + m;
    }
}

/* The fifth bit of Q5_0's and Q5_1's values: bit i of a little-endian u32
 * qh is bit 4 of q[i]; the low four bits are packed as in Q4_0. */
static int q5_value(uint32_t qh, const unsigned char *qs, int i) {
    int low = i < 16 ? qs[i] & 0x0F : qs[i - 16] >> 4;
    return low | (int)((qh >> i) & 1) << 4;
}

/* Q5_0, 22 bytes:  f16 d | u32 qh (bit 4 of each q) | 16 bytes of low nibbles (as Q4_0)
 *   x[i] = d * (q[i] - 16)                                  (q in 0..31: -16d .. 15d) */
static void q5_0_block(const unsigned char *b, float *x) {
    float d = f16_at(b);
    uint32_t qh = u32_at(b + 2);
    for (int i = 0; i < 32; i++) x[i] = d * (float)(q5_value(qh, b + 6, i) - 16);
}

/* Q5_1, 24 bytes:  f16 d | f16 m | u32 qh | 16 bytes of low nibbles (as Q5_0)
 *   x[i] = d * q[i] + m                                     (q in 0..31: m .. m + 31d) */
static void q5_1_block(const unsigned char *b, float *x) {
    float d = f16_at(b), m = f16_at(b + 2);
    uint32_t qh = u32_at(b + 4);
    for (int i = 0; i < 32; i++) {
        float p = d * (float)q5_value(qh, b + 8, i);
        x[i] = p + m;
    }
}

/* Q8_0, 34 bytes:  f16 d | 32 int8 q
 *   x[i] = q[i] * d                                         (run's own q8_0 keeps a float32 d) */
static void q8_0_block(const unsigned char *b, float *x) {
    float d = f16_at(b);
    for (int i = 0; i < 32; i++) x[i] = (float)(int8_t)b[2 + i] * d;
}

/* ---- 256 values a block ("K-quants"): sub-blocks with scales of their own ---- */

/* Q4_K's and Q5_K's 12 bytes of scales: a 6-bit scale sc[s] and a 6-bit min
 * m[s] for each of the 8 sub-blocks of 32 values. Bytes 0-3 hold sc[0..3] in
 * their low 6 bits, bytes 4-7 m[0..3]; sub-blocks 4-7 have their low 4 bits
 * in bytes 8-11 (sc in the low nibble, m in the high one) and their top 2
 * bits in the spare top bits of bytes 0-3 (sc) and 4-7 (m):
 *   byte  0..3   [sc[j+4] bits 4-5 | sc[j] ]      j = 0..3
 *   byte  4..7   [ m[j+4] bits 4-5 |  m[j] ]
 *   byte  8..11  [ m[j+4] bits 0-3 | sc[j+4] bits 0-3 ] */
static void k_scales(const unsigned char *s, int sc[8], int m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 0x3F;
        m[j] = s[j + 4] & 0x3F;
        sc[j + 4] = (s[j + 8] & 0x0F) | (s[j] >> 6) << 4;
        m[j + 4] = (s[j + 8] >> 4) | (s[j + 4] >> 6) << 4;
    }
}

/* Q4_K, 144 bytes:  f16 d | f16 dmin | 12 bytes of scales (k_scales) | 128 bytes of 4-bit q
 *   Sub-block s (values 32s .. 32s + 31) has the scale D = d * sc[s] and the
 *   offset M = dmin * m[s] (each rounded to float32); its 4-bit values are in
 *   bytes 32 * (s / 2) .. + 31 of q, the low nibbles for even s, the high
 *   nibbles for odd s:
 *   x[32s + i] = D * q - M                                  (q in 0..15) */
static void q4_k_block(const unsigned char *b, float *x) {
    float d = f16_at(b), dmin = f16_at(b + 2);
    int sc[8], m[8];
    k_scales(b + 4, sc, m);
    const unsigned char *qs = b + 16;
    for (int s = 0; s < 8; s++) {
        float D = d * (float)sc[s], M = dmin * (float)m[s];
        const unsigned char *run = qs + 32 * (s / 2);
        for (int i = 0; i < 32; i++) {
            float p = D * (float)(s % 2 ? run[i] >> 4 : run[i] & 0x0F);
            x[32 * s + i] = p - M;
        }
    }
}

/* Q5_K, 176 bytes:  f16 d | f16 dmin | 12 bytes of scales (k_scales) | 32 bytes qh | 128 bytes of low nibbles
 *   As Q4_K, with a fifth bit: bit s of qh[i] is bit 4 of value 32s + i.
 *   x[32s + i] = D * q - M                                  (q in 0..31) */
static void q5_k_block(const unsigned char *b, float *x) {
    float d = f16_at(b), dmin = f16_at(b + 2);
    int sc[8], m[8];
    k_scales(b + 4, sc, m);
    const unsigned char *qh = b + 16, *qs = b + 48;
    for (int s = 0; s < 8; s++) {
        float D = d * (float)sc[s], M = dmin * (float)m[s];
        const unsigned char *run = qs + 32 * (s / 2);
        for (int i = 0; i < 32; i++) {
            int q = (s % 2 ? run[i] >> 4 : run[i] & 0x0F) | ((qh[i] >> s) & 1) << 4;
            float p = D * (float)q;
            x[32 * s + i] = p - M;
        }
    }
}

/* Q6_K, 210 bytes:  128 bytes ql (low 4 bits) | 64 bytes qh (high 2 bits) | 16 int8 scales | f16 d
 *   The block is two halves of 128 values; half h uses ql[64h .. 64h + 63]
 *   and qh[32h .. 32h + 31]. Value 128h + r (r in 0..127):
 *     low 4 bits:  ql[64h + r % 64], the low nibble for r < 64, else the high one
 *     high 2 bits: qh[32h + r % 32] >> (2 * (r / 32)), two bits
 *   Sub-block s (values 16s .. 16s + 15) has the scale D = d * sc[s]
 *   (rounded to float32; sc signed):
 *   x[16s + i] = D * (q - 32)                               (q in 0..63: -32D .. 31D) */
static void q6_k_block(const unsigned char *b, float *x) {
    const unsigned char *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = f16_at(b + 208);
    for (int v = 0; v < 256; v++) {
        int h = v / 128, r = v % 128;
        int low = r < 64 ? ql[64 * h + r] & 0x0F : ql[64 * h + r - 64] >> 4;
        int high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
        float D = d * (float)sc[v / 16];
        x[v] = D * (float)((low | high << 4) - 32);
    }
}

/* ---- The table ------------------------------------------------------------- */

static const struct {
    uint32_t type;
    size_t values, bytes;
    void (*block)(const unsigned char *b, float *x);
} QUANTS[] = {
    {GGML_Q4_0, 32, 18, q4_0_block},   {GGML_Q4_1, 32, 20, q4_1_block},   {GGML_Q5_0, 32, 22, q5_0_block},
    {GGML_Q5_1, 32, 24, q5_1_block},   {GGML_Q8_0, 32, 34, q8_0_block},   {GGML_Q4_K, 256, 144, q4_k_block},
    {GGML_Q5_K, 256, 176, q5_k_block}, {GGML_Q6_K, 256, 210, q6_k_block},
};
#define N_QUANTS (sizeof QUANTS / sizeof QUANTS[0])

int gguf_quant_block(uint32_t type, size_t *values, size_t *bytes) {
    for (size_t k = 0; k < N_QUANTS; k++)
        if (QUANTS[k].type == type) {
            *values = QUANTS[k].values;
            *bytes = QUANTS[k].bytes;
            return 1;
        }
    return 0;
}

int gguf_dequantize(uint32_t type, const unsigned char *src, size_t n_blocks, float *out) {
    for (size_t k = 0; k < N_QUANTS; k++)
        if (QUANTS[k].type == type) {
            for (size_t i = 0; i < n_blocks; i++)
                QUANTS[k].block(src + i * QUANTS[k].bytes, out + i * QUANTS[k].values);
            return 0;
        }
    return -1;
}

int gguf_q4_split(uint32_t type, const unsigned char *src, size_t n_blocks, uint8_t *qs, uint16_t *d, uint16_t *m) {
    if (type != GGML_Q4_0 && type != GGML_Q4_1) return -1;
    size_t halves = type == GGML_Q4_1 ? 2 : 1, bytes = 2 * halves + 16; // 18 or 20
    for (size_t k = 0; k < n_blocks; k++) {
        const unsigned char *b = src + k * bytes;
        d[k] = (uint16_t)(b[0] | b[1] << 8);
        if (halves == 2) m[k] = (uint16_t)(b[2] | b[3] << 8);
        memcpy(qs + 16 * k, b + 2 * halves, 16);
    }
    return 0;
}
