/* gguf.h: llama.cpp's GGUF file format, read in place (gguf.c), and the
 * model loader that turns a GGUF of the llama, qwen2 or phi3 architecture
 * into run's Transformer (gguf_model.c). docs/gguf.md says what loads and what is
 * refused.
 *
 * The format (versions 2 and 3, little-endian; strings are a u64 length and
 * that many bytes, no NUL):
 *   "GGUF"  u32 version  u64 n_tensors  u64 n_kv
 *   n_kv times:      string key, u32 value type, the value
 *                    (an array: u32 element type, u64 count, the elements)
 *   n_tensors times: string name, u32 n_dims (1..4), u64 dims[n_dims]
 *                    (innermost first), u32 ggml type, u64 offset
 *   padding to general.alignment (a u32 power of two; default 32), then the
 *   data section: tensor t's bytes start at data_start + offset (a multiple
 *   of the alignment).
 * gguf_parse checks every count, length, dimension and offset against the
 * file size before it is used (overflow-safe), and returns -1 with one line
 * naming the file and what is wrong; it never exits.
 */
#ifndef GGUF_H
#define GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "gguf_quants.h"
#include "run.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NESTING 4   /* arrays of arrays: at most this many levels (as export.py) */
#define GGUF_DEFAULT_ALIGNMENT 32

/* Metadata value types. */
enum {
    GGUF_U8 = 0, GGUF_I8, GGUF_U16, GGUF_I16, GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STRING,
    GGUF_ARRAY, GGUF_U64, GGUF_I64, GGUF_F64, GGUF_N_VALUE_TYPES
};

/* The ggml tensor types run reads (GGML_F32 ...) and the dequantization of
 * the quantized ones are gguf_quants.h's; gguf.c knows every other type by
 * its name and block size only. */

/* A string inside the file: `len` bytes at p, not NUL-terminated. */
typedef struct {
    const unsigned char *p;
    uint64_t len;
} GgufStr;

typedef struct {
    GgufStr key;
    uint32_t type;              // GGUF_U8 .. GGUF_F64
    const unsigned char *value; // the value's bytes; an array: its first element
    uint32_t elem_type;         // an array: its elements' type
    uint64_t count;             // an array: its elements
    int looked_up;              // 1 once gguf_find_key found it (a reader asked for this key; the one
                                // field a lookup writes, through the const GgufFile it is given)
} GgufKV;

typedef struct {
    GgufStr name;
    uint32_t n_dims;
    uint64_t dims[GGUF_MAX_DIMS]; // innermost first; unused ones are 1
    uint32_t type;                // ggml type (GGML_F32, ...)
    uint64_t offset;              // from the data section's start
    uint64_t n_values, n_bytes;
    const unsigned char *data;    // in the file's bytes
} GgufTensor;

typedef struct {
    const char *path;           // for the messages
    const unsigned char *bytes; // the whole file (not owned)
    size_t size;
    uint32_t version;
    uint64_t n_tensors, n_kv;
    GgufKV *kv;                 // (n_kv) owned; gguf_free releases it
    GgufTensor *tensors;        // (n_tensors) owned
    uint64_t alignment, data_start;
} GgufFile;

/* Parse the size bytes at `bytes` (the file at path, mapped by the caller,
 * who keeps it mapped while g is used). Returns 0, or -1 with one line in
 * err; g needs gguf_free either way. */
int gguf_parse(GgufFile *g, const char *path, const void *bytes, size_t size, char *err, size_t err_len);
void gguf_free(GgufFile *g);

/* Lookups: NULL when absent. */
const GgufKV *gguf_find_key(const GgufFile *g, const char *key);
const GgufTensor *gguf_find_tensor(const GgufFile *g, const char *name);

/* Typed metadata. Each returns 1 and the value when key is present with a
 * type of that kind, 0 when it is absent, -1 with a message (the key, the
 * type expected, the type found) otherwise.
 *   int:   any integer type (a u64 above INT64_MAX is refused)
 *   float: any integer or float type, as a double
 *   bool:  bool, or an integer 0 or 1
 *   str:   a string */
int gguf_get_int(const GgufFile *g, const char *key, int64_t *out, char *err, size_t err_len);
int gguf_get_float(const GgufFile *g, const char *key, double *out, char *err, size_t err_len);
int gguf_get_bool(const GgufFile *g, const char *key, int *out, char *err, size_t err_len);
int gguf_get_str(const GgufFile *g, const char *key, GgufStr *out, char *err, size_t err_len);
/* Whether a string equals a C string. */
int gguf_str_is(GgufStr s, const char *c);
/* s as printable text in buf (control bytes as '?', cut to size - 1 bytes). */
const char *gguf_show(GgufStr s, char *buf, size_t size);

/* Names as GGUF spells them; "type N" in buf for one it does not know. */
const char *gguf_value_type_name(uint32_t type);
const char *ggml_type_name(uint32_t type, char *buf, size_t size);
/* Values per block and bytes per block of a ggml type; 0 when unknown. */
int ggml_type_size(uint32_t type, uint64_t *block, uint64_t *bytes);

/* Whether the file at path starts with "GGUF". */
int gguf_is_file(const char *path);

/* run.c's check of a checkpoint header's values; a GGUF's go through it too. */
int validate_config(const char *path, const Config *c, const RopeConfig *r, char *err, size_t err_len);
/* The model loader (gguf_model.c): run.c's load_checkpoint calls it for a
 * file that starts with "GGUF", with the file open as fd (the caller closes
 * it) and its size. Maps the file and fills t's config, RoPE and weights; the
 * mapping and the converted tensors are t's (free_transformer releases them).
 * Returns 0, or -1 with one line in err and t zeroed. */
int gguf_load_checkpoint(Transformer *t, const char *path, int fd, size_t file_size, char *err, size_t err_len);
/* What the loader makes of the quantized tensors (--gguf-convert, whose
 * choices GGUF_CONVERT_NAMES spells in this order): GGUF_KEEP (the default)
 * keeps Q4_0 and Q4_1 matrices as stored (the kernels run them) and makes
 * the other quantized types q8_0; GGUF_TO_Q8_0 makes every quantized tensor
 * q8_0; GGUF_TO_F32 float32. main sets it before the model loads. */
enum { GGUF_TO_F32 = 0, GGUF_TO_Q8_0 = 1, GGUF_KEEP = 2 };
void gguf_set_conversion(int conversion);
/* -m info's account of a GGUF checkpoint's metadata: each key in file order,
 * with 1 when the load looks the key up (to read it: the model's
 * configuration and RoPE scaling, and with `tokenizer` the tokenizer's
 * tokenizer.ggml.* and chat template; or to check that a feature it does not
 * run is off, such as a sliding window of 0) and 0 when the load passes it
 * by (general.name, licences, ...). The file in t's mapping is parsed again
 * and the readers run on it as at load (the tokenizer's only when the
 * tokenizer came from this file). 0, or -1 and err. */
typedef void (*GgufKeyVisit)(const char *key, int read, void *ctx);
int gguf_key_usage(const Transformer *t, int tokenizer, GgufKeyVisit visit, void *ctx, char *err, size_t err_len);
#endif
