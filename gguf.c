/* gguf.c: llama.cpp's GGUF format read in place (gguf.h has the layout).
 *
 * gguf_parse walks the header, the metadata and the tensor table with a
 * cursor that checks each read against the end of the file, so that a count,
 * a length or an offset is never used before the file is known to hold it;
 * sizes are multiplied only after a division shows they fit. Then each
 * tensor's data is checked: a known type, whole blocks, an aligned offset,
 * inside the file, no two overlapping, no name twice. Every refusal is one
 * line naming the file and the key or tensor. The model is gguf_model.c's.
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "model.h"

/* ---- Reading with bounds ---------------------------------------------------- */

typedef struct {
    const GgufFile *g;
    size_t pos;
    char *err;
    size_t err_len;
} Cursor;

static uint64_t le_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint32_t le_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* n more bytes at the cursor, or a "truncated" message naming what was read. */
static int need(Cursor *c, uint64_t n, const char *what, const char *name) {
    if (n <= c->g->size - c->pos) return 0;
    return fail(c->err, c->err_len, "%s: truncated in %s%s (byte %zu: %" PRIu64 " bytes needed, the file has %zu)",
                c->g->path, what, name, c->pos, n, c->g->size);
}
static int read_u32(Cursor *c, uint32_t *v, const char *what, const char *name) {
    if (need(c, 4, what, name)) return -1;
    *v = le_u32(c->g->bytes + c->pos);
    c->pos += 4;
    return 0;
}
static int read_u64(Cursor *c, uint64_t *v, const char *what, const char *name) {
    if (need(c, 8, what, name)) return -1;
    *v = le_u64(c->g->bytes + c->pos);
    c->pos += 8;
    return 0;
}
static int read_str(Cursor *c, GgufStr *s, const char *what, const char *name) {
    if (read_u64(c, &s->len, what, name) || need(c, s->len, what, name)) return -1;
    s->p = c->g->bytes + c->pos;
    c->pos += (size_t)s->len;
    return 0;
}

/* ---- Names and sizes ------------------------------------------------------ */

static const char *const VALUE_TYPE_NAMES[GGUF_N_VALUE_TYPES] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
static const int SCALAR_BYTES[GGUF_N_VALUE_TYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *gguf_value_type_name(uint32_t type) {
    return type < GGUF_N_VALUE_TYPES ? VALUE_TYPE_NAMES[type] : "an unknown type";
}

/* ggml's tensor types: name, values per block, bytes per block (the gguf
 * package's GGML_QUANT_SIZES, gguf 0.19.0). */
static const struct { uint32_t id; const char *name; uint64_t block, bytes; } GGML_TYPES[] = {
    {0, "F32", 1, 4}, {1, "F16", 1, 2}, {2, "Q4_0", 32, 18}, {3, "Q4_1", 32, 20}, {6, "Q5_0", 32, 22},
    {7, "Q5_1", 32, 24}, {8, "Q8_0", 32, 34}, {9, "Q8_1", 32, 40}, {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110}, {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176}, {14, "Q6_K", 256, 210},
    {15, "Q8_K", 256, 292}, {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74}, {18, "IQ3_XXS", 256, 98},
    {19, "IQ1_S", 256, 50}, {20, "IQ4_NL", 32, 18}, {21, "IQ3_S", 256, 110}, {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1}, {25, "I16", 1, 2}, {26, "I32", 1, 4}, {27, "I64", 1, 8},
    {28, "F64", 1, 8}, {29, "IQ1_M", 256, 56}, {30, "BF16", 1, 2}, {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66}, {39, "MXFP4", 32, 17}, {40, "NVFP4", 64, 36}, {41, "Q1_0", 128, 18},
};
#define N_GGML_TYPES (sizeof GGML_TYPES / sizeof GGML_TYPES[0])

int ggml_type_size(uint32_t type, uint64_t *block, uint64_t *bytes) {
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (GGML_TYPES[i].id == type) {
            *block = GGML_TYPES[i].block;
            *bytes = GGML_TYPES[i].bytes;
            return 1;
        }
    return 0;
}

const char *ggml_type_name(uint32_t type, char *buf, size_t size) {
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (GGML_TYPES[i].id == type) return GGML_TYPES[i].name;
    snprintf(buf, size, "type %" PRIu32, type);
    return buf;
}

const char *gguf_show(GgufStr s, char *buf, size_t size) {
    size_t n = s.len < size - 1 ? (size_t)s.len : size - 1;
    for (size_t i = 0; i < n; i++) buf[i] = s.p[i] < 0x20 || s.p[i] == 0x7f ? '?' : (char)s.p[i];
    if (s.len > n && n >= 3) memcpy(buf + n - 3, "...", 3);
    buf[n] = '\0';
    return buf;
}

int gguf_str_is(GgufStr s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.p, c, n) == 0;
}

/* ---- Metadata ------------------------------------------------------------- */

/* Move the cursor past one value of `type` (arrays nest up to GGUF_MAX_NESTING
 * levels). Before a loop over an array's entries, the count is checked against
 * the bytes left (each entry takes at least 8 bytes), so a corrupt count ends
 * quickly. */
static int skip_value(Cursor *c, uint32_t type, int depth, const char *name) {
    const char *what = "metadata ";
    if (type < GGUF_N_VALUE_TYPES && SCALAR_BYTES[type]) {
        if (need(c, (uint64_t)SCALAR_BYTES[type], what, name)) return -1;
        c->pos += (size_t)SCALAR_BYTES[type];
        return 0;
    }
    if (type == GGUF_STRING) {
        GgufStr s;
        return read_str(c, &s, what, name);
    }
    if (type != GGUF_ARRAY)
        return fail(c->err, c->err_len, "%s: metadata %s has value type %" PRIu32 " (expected 0..12)", c->g->path,
                    name, type);
    if (depth >= GGUF_MAX_NESTING)
        return fail(c->err, c->err_len, "%s: metadata %s: arrays nested more than %d deep", c->g->path, name,
                    GGUF_MAX_NESTING);
    uint32_t elem;
    uint64_t count;
    if (read_u32(c, &elem, what, name) || read_u64(c, &count, what, name)) return -1;
    if (elem < GGUF_N_VALUE_TYPES && SCALAR_BYTES[elem]) {
        uint64_t left = c->g->size - c->pos, each = (uint64_t)SCALAR_BYTES[elem];
        if (count > left / each)
            return fail(c->err, c->err_len, "%s: truncated in metadata %s (an array of %" PRIu64 " %s at byte %zu, "
                        "the file has %zu)", c->g->path, name, count, VALUE_TYPE_NAMES[elem], c->pos, c->g->size);
        c->pos += (size_t)(count * each);
        return 0;
    }
    if (elem != GGUF_STRING && elem != GGUF_ARRAY)
        return fail(c->err, c->err_len, "%s: metadata %s is an array of value type %" PRIu32 " (expected 0..12)",
                    c->g->path, name, elem);
    if (count > (c->g->size - c->pos) / 8)
        return fail(c->err, c->err_len, "%s: truncated in metadata %s (an array of %" PRIu64 " entries at byte %zu, "
                    "the file has %zu)", c->g->path, name, count, c->pos, c->g->size);
    for (uint64_t i = 0; i < count; i++)
        if (skip_value(c, elem, depth + 1, name)) return -1;
    return 0;
}

/* Order of names for the duplicate check. */
static int compare_str(const GgufStr *a, const GgufStr *b) {
    uint64_t n = a->len < b->len ? a->len : b->len;
    int d = n ? memcmp(a->p, b->p, (size_t)n) : 0;
    return d ? d : (a->len > b->len) - (a->len < b->len);
}
static int compare_kv(const void *a, const void *b) {
    return compare_str(&(*(const GgufKV *const *)a)->key, &(*(const GgufKV *const *)b)->key);
}
static int compare_tensor_name(const void *a, const void *b) {
    return compare_str(&(*(const GgufTensor *const *)a)->name, &(*(const GgufTensor *const *)b)->name);
}

/* The first name that appears twice among n items (sorted by cmp), or -1. */
static long find_duplicate(const void **items, size_t n, int (*cmp)(const void *, const void *)) {
    qsort(items, n, sizeof *items, cmp);
    for (size_t i = 1; i < n; i++)
        if (cmp(&items[i - 1], &items[i]) == 0) return (long)i;
    return -1;
}

/* Read the n_kv metadata entries; general.alignment is checked here. */
static int parse_metadata(Cursor *c, GgufFile *g) {
    char name[96];
    for (uint64_t k = 0; k < g->n_kv; k++) {
        GgufKV *kv = &g->kv[k];
        char which[96];
        snprintf(which, sizeof which, "the name of metadata entry %" PRIu64 " of %" PRIu64, k, g->n_kv);
        if (read_str(c, &kv->key, which, "")) return -1;
        gguf_show(kv->key, name, sizeof name);
        if (read_u32(c, &kv->type, "metadata ", name)) return -1;
        kv->value = g->bytes + c->pos;
        if (kv->type == GGUF_ARRAY && need(c, 12, "metadata ", name) == 0) {
            kv->elem_type = le_u32(kv->value);
            kv->count = le_u64(kv->value + 4);
        }
        if (skip_value(c, kv->type, 0, name)) return -1;
        if (kv->type == GGUF_ARRAY) kv->value += 12;
    }
    const void **order = malloc((g->n_kv ? g->n_kv : 1) * sizeof *order);
    if (!order) return fail(c->err, c->err_len, "%s: out of memory for %" PRIu64 " metadata entries", g->path, g->n_kv);
    for (uint64_t k = 0; k < g->n_kv; k++) order[k] = &g->kv[k];
    long dup = find_duplicate(order, (size_t)g->n_kv, compare_kv);
    if (dup >= 0) gguf_show(((const GgufKV *)order[dup])->key, name, sizeof name);
    free(order);
    if (dup >= 0) return fail(c->err, c->err_len, "%s: metadata key %s appears twice", g->path, name);
    const GgufKV *al = gguf_find_key(g, "general.alignment");
    if (al) {
        if (al->type != GGUF_U32)
            return fail(c->err, c->err_len, "%s: general.alignment is %s, expected u32", g->path,
                        gguf_value_type_name(al->type));
        g->alignment = le_u32(al->value);
        if (g->alignment == 0 || (g->alignment & (g->alignment - 1)))
            return fail(c->err, c->err_len, "%s: general.alignment is %" PRIu64 ", expected a power of two", g->path,
                        g->alignment);
    }
    return 0;
}

/* ---- Tensors ------------------------------------------------------------- */

/* One tensor table entry: name, dimensions, type, offset (checked later). */
static int parse_tensor_info(Cursor *c, GgufFile *g, uint64_t k) {
    GgufTensor *t = &g->tensors[k];
    char which[96], name[96];
    snprintf(which, sizeof which, "the name of tensor %" PRIu64 " of %" PRIu64, k, g->n_tensors);
    if (read_str(c, &t->name, which, "")) return -1;
    gguf_show(t->name, name, sizeof name);
    if (read_u32(c, &t->n_dims, "tensor ", name)) return -1;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return fail(c->err, c->err_len, "%s: tensor %s has %" PRIu32 " dimensions (expected 1..%d)", g->path, name,
                    t->n_dims, GGUF_MAX_DIMS);
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->dims[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        if (read_u64(c, &t->dims[d], "tensor ", name)) return -1;
    if (read_u32(c, &t->type, "tensor ", name) || read_u64(c, &t->offset, "tensor ", name)) return -1;
    return 0;
}

/* A tensor's type, dimensions and data range; sets n_values, n_bytes, data. */
static int check_tensor(const GgufFile *g, GgufTensor *t, char *err, size_t err_len) {
    char name[96], tn[32], dims[128] = "";
    gguf_show(t->name, name, sizeof name);
    for (uint32_t d = 0, len = 0; d < t->n_dims && len < sizeof dims; d++)
        len += (uint32_t)snprintf(dims + len, sizeof dims - len, "%s%" PRIu64, d ? ", " : "", t->dims[d]);
    uint64_t block, bytes, n = 1;
    if (!ggml_type_size(t->type, &block, &bytes))
        return fail(err, err_len, "%s: tensor %s has unknown type %" PRIu32, g->path, name, t->type);
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (t->dims[d] == 0 || t->dims[d] >= ((uint64_t)1 << 48) / n)
            return fail(err, err_len, "%s: tensor %s has dimensions [%s] (expected each >= 1, fewer than 2^48 values)",
                        g->path, name, dims);
        n *= t->dims[d];
    }
    if (t->dims[0] % block)
        return fail(err, err_len, "%s: tensor %s: rows of %" PRIu64 " values are not whole %s blocks of %" PRIu64,
                    g->path, name, t->dims[0], ggml_type_name(t->type, tn, sizeof tn), block);
    t->n_values = n;
    t->n_bytes = n / block * bytes;
    if (t->offset % g->alignment)
        return fail(err, err_len, "%s: tensor %s: data offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                    g->path, name, t->offset, g->alignment);
    uint64_t size = g->size;
    if (g->data_start > size || t->offset > size - g->data_start || t->n_bytes > size - g->data_start - t->offset)
        return fail(err, err_len, "%s: tensor %s: its data (%" PRIu64 " bytes at offset %" PRIu64 " after byte %" PRIu64
                    ") lies past the end of the file (%zu bytes); truncated?", g->path, name, t->n_bytes, t->offset,
                    g->data_start, g->size);
    t->data = g->bytes + g->data_start + t->offset;
    return 0;
}

static int compare_tensor_offset(const void *a, const void *b) {
    const GgufTensor *x = *(const GgufTensor *const *)a, *y = *(const GgufTensor *const *)b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* No name twice, no two tensors' data overlapping. */
static int check_tensor_set(const GgufFile *g, char *err, size_t err_len) {
    size_t n = (size_t)g->n_tensors;
    const void **order = malloc((n ? n : 1) * sizeof *order);
    if (!order) return fail(err, err_len, "%s: out of memory for %zu tensors", g->path, n);
    char a[96], b[96];
    for (size_t i = 0; i < n; i++) order[i] = &g->tensors[i];
    long dup = find_duplicate(order, n, compare_tensor_name);
    if (dup >= 0) {
        gguf_show(((const GgufTensor *)order[dup])->name, a, sizeof a);
        free(order);
        return fail(err, err_len, "%s: tensor %s appears twice", g->path, a);
    }
    qsort(order, n, sizeof *order, compare_tensor_offset);
    for (size_t i = 1; i < n; i++) {
        const GgufTensor *x = order[i - 1], *y = order[i];
        if (x->offset + x->n_bytes > y->offset) {
            gguf_show(x->name, a, sizeof a);
            gguf_show(y->name, b, sizeof b);
            free(order);
            return fail(err, err_len, "%s: tensors %s and %s overlap (bytes %" PRIu64 "..%" PRIu64 " and %" PRIu64
                        "..)", g->path, a, b, x->offset, x->offset + x->n_bytes, y->offset);
        }
    }
    free(order);
    return 0;
}

/* ---- The file ------------------------------------------------------------ */

/* Magic, version and the two counts; the counts are bounded by the bytes left
 * (a metadata entry takes at least 13, a tensor entry at least 32) before
 * anything is allocated for them. */
static int read_header(Cursor *c, GgufFile *g) {
    if (g->size < 4 || memcmp(g->bytes, GGUF_MAGIC, 4) != 0)
        return fail(c->err, c->err_len, "%s: not a GGUF file (expected the bytes \"GGUF\" first)", g->path);
    if (g->size < 24)
        return fail(c->err, c->err_len, "%s: truncated: %zu bytes, less than the 24-byte GGUF header", g->path,
                    g->size);
    c->pos = 4;
    read_u32(c, &g->version, "", "");
    read_u64(c, &g->n_tensors, "", "");
    read_u64(c, &g->n_kv, "", "");
    if (g->version != 2 && g->version != 3)
        return fail(c->err, c->err_len, "%s: GGUF version %" PRIu32 " is not supported (versions 2 and 3 are)%s",
                    g->path, g->version, g->version && !(g->version & 0xffff) ? " (a big-endian file?)" : "");
    uint64_t left = g->size - 24;
    if (g->n_kv > left / 13)
        return fail(c->err, c->err_len, "%s: the header counts %" PRIu64 " metadata entries; the file's %zu bytes "
                    "hold at most %" PRIu64, g->path, g->n_kv, g->size, left / 13);
    if (g->n_tensors > left / 32)
        return fail(c->err, c->err_len, "%s: the header counts %" PRIu64 " tensors; the file's %zu bytes hold at "
                    "most %" PRIu64, g->path, g->n_tensors, g->size, left / 32);
    return 0;
}

int gguf_parse(GgufFile *g, const char *path, const void *bytes, size_t size, char *err, size_t err_len) {
    memset(g, 0, sizeof *g);
    g->path = path;
    g->bytes = bytes;
    g->size = size;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    Cursor c = {g, 0, err, err_len};
    if (read_header(&c, g)) return -1;
    g->kv = calloc(g->n_kv ? (size_t)g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? (size_t)g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return fail(err, err_len, "%s: out of memory for the GGUF tables", path);
    if (parse_metadata(&c, g)) return -1;
    for (uint64_t k = 0; k < g->n_tensors; k++)
        if (parse_tensor_info(&c, g, k)) return -1;
    uint64_t pos = c.pos; // pos <= size < 2^63: no overflow below
    g->data_start = (pos + g->alignment - 1) / g->alignment * g->alignment;
    for (uint64_t k = 0; k < g->n_tensors; k++)
        if (check_tensor(g, &g->tensors[k], err, err_len)) return -1;
    return check_tensor_set(g, err, err_len);
}

void gguf_free(GgufFile *g) {
    free(g->kv);
    free(g->tensors);
    g->kv = NULL;
    g->tensors = NULL;
}

/* ---- Lookups --------------------------------------------------------------- */

const GgufKV *gguf_find_key(const GgufFile *g, const char *key) {
    for (uint64_t k = 0; g->kv && k < g->n_kv; k++)
        if (gguf_str_is(g->kv[k].key, key)) {
            g->kv[k].looked_up = 1; // for -m info's mapped and ignored keys (gguf_key_usage)
            return &g->kv[k];
        }
    return NULL;
}

const GgufTensor *gguf_find_tensor(const GgufFile *g, const char *name) {
    for (uint64_t k = 0; g->tensors && k < g->n_tensors; k++)
        if (gguf_str_is(g->tensors[k].name, name)) return &g->tensors[k];
    return NULL;
}

static int wrong_type(const GgufFile *g, const GgufKV *kv, const char *key, const char *want, char *err,
                      size_t err_len) {
    char elem[48] = "";
    if (kv->type == GGUF_ARRAY) snprintf(elem, sizeof elem, " of %s", gguf_value_type_name(kv->elem_type));
    return fail(err, err_len, "%s: %s is %s%s, expected %s", g->path, key, gguf_value_type_name(kv->type), elem, want);
}

/* An integer value of any integer type as int64 (1), or 0 when kv is not one. */
static int integer_value(const GgufKV *kv, int64_t *out, int *too_big) {
    const unsigned char *p = kv->value;
    *too_big = 0;
    switch (kv->type) {
    case GGUF_U8: *out = p[0]; return 1;
    case GGUF_I8: *out = (int8_t)p[0]; return 1;
    case GGUF_U16: *out = (uint16_t)(p[0] | p[1] << 8); return 1;
    case GGUF_I16: *out = (int16_t)(uint16_t)(p[0] | p[1] << 8); return 1;
    case GGUF_U32: *out = le_u32(p); return 1;
    case GGUF_I32: *out = (int32_t)le_u32(p); return 1;
    case GGUF_U64: *too_big = le_u64(p) > INT64_MAX; *out = (int64_t)(le_u64(p) & INT64_MAX); return 1;
    case GGUF_I64: {
        uint64_t u = le_u64(p);
        memcpy(out, &u, sizeof u);
        return 1;
    }
    }
    return 0;
}

int gguf_get_int(const GgufFile *g, const char *key, int64_t *out, char *err, size_t err_len) {
    const GgufKV *kv = gguf_find_key(g, key);
    if (!kv) return 0;
    int too_big;
    if (!integer_value(kv, out, &too_big)) return wrong_type(g, kv, key, "an integer", err, err_len);
    if (too_big) return fail(err, err_len, "%s: %s=%" PRIu64 " is too large", g->path, key, le_u64(kv->value));
    return 1;
}

int gguf_get_float(const GgufFile *g, const char *key, double *out, char *err, size_t err_len) {
    const GgufKV *kv = gguf_find_key(g, key);
    if (!kv) return 0;
    int64_t i;
    int too_big;
    if (kv->type == GGUF_F32) {
        *out = read_le_f32(kv->value);
    } else if (kv->type == GGUF_F64) {
        uint64_t u = le_u64(kv->value);
        memcpy(out, &u, sizeof u);
    } else if (integer_value(kv, &i, &too_big)) {
        *out = too_big ? (double)le_u64(kv->value) : (double)i;
    } else {
        return wrong_type(g, kv, key, "a number", err, err_len);
    }
    return 1;
}

int gguf_get_bool(const GgufFile *g, const char *key, int *out, char *err, size_t err_len) {
    const GgufKV *kv = gguf_find_key(g, key);
    if (!kv) return 0;
    int64_t i;
    int too_big;
    if (kv->type == GGUF_BOOL) i = kv->value[0];
    else if (!integer_value(kv, &i, &too_big)) return wrong_type(g, kv, key, "a bool", err, err_len);
    if (i != 0 && i != 1) return fail(err, err_len, "%s: %s=%" PRId64 ", expected a bool (0 or 1)", g->path, key, i);
    *out = (int)i;
    return 1;
}

int gguf_get_str(const GgufFile *g, const char *key, GgufStr *out, char *err, size_t err_len) {
    const GgufKV *kv = gguf_find_key(g, key);
    if (!kv) return 0;
    if (kv->type != GGUF_STRING) return wrong_type(g, kv, key, "a string", err, err_len);
    out->len = le_u64(kv->value);
    out->p = kv->value + 8;
    return 1;
}

int gguf_is_file(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    char magic[4];
    ssize_t got = read(fd, magic, 4);
    close(fd);
    return got == 4 && memcmp(magic, GGUF_MAGIC, 4) == 0;
}
