/* test_loader.c: the checkpoint loader: a valid tiny checkpoint loads; a
 * truncated or padded file, every out-of-range header field of versions 1 and
 * 2, a bad magic, legacy headers that crash llama2.c, a missing file and a
 * directory are rejected with an error naming the field and the file. Part
 * of test_run (test_run.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"

/* Write header + `payload` zero bytes and try to load it. */
static int try_load(const unsigned char *h, size_t header_len, size_t payload, char *err, size_t err_len) {
    const char *path = tmp_path("ckpt.bin");
    FILE *f = fopen(path, "wb");
    fwrite(h, 1, header_len, f);
    for (size_t i = 0; i < payload; i++) fputc(0, f);
    fclose(f);
    Transformer t;
    int rc = load_checkpoint(&t, path, err, err_len);
    if (rc == 0) free_transformer(&t);
    remove(path);
    return rc;
}

void test_loader(void) {
    unsigned char h[CKPT_HEADER_BYTES];
    char err[512];
    good_header(h);
    Config c;
    RopeConfig r;
    parse_header("x", h, sizeof h, &c, &r, err, sizeof err);
    size_t payload = expected_file_size(&c, &r) - CKPT_HEADER_BYTES;
    CHECK(try_load(h, sizeof h, payload, err, sizeof err) == 0, "valid tiny checkpoint rejected: %s", err);
    CHECK(try_load(h, sizeof h, payload - 1, err, sizeof err) != 0 && strstr(err, "truncated"),
          "one byte short must be 'truncated': %s", err);
    CHECK(try_load(h, sizeof h, payload + 1, err, sizeof err) != 0 && strstr(err, "trailing"),
          "one byte extra must be 'trailing': %s", err);
    CHECK(try_load(h, 100, 0, err, sizeof err) != 0 && strstr(err, "header"), "short header: %s", err);
    CHECK(try_load(h, 0, 0, err, sizeof err) != 0 && strstr(err, "empty"), "empty file: %s", err);

    struct { int offset; int32_t value; const char *expect; } bad[] = {
        {4, 3, "version"}, {4, 0, "version"}, {8, 0, "dim"}, {20, 0, "n_heads"}, {24, 3, "n_kv_heads"}, {20, 3, "n_heads"},
        {16, -1, "n_layers"}, {28, 1 << 30, "vocab_size"}, {36, 2, "shared_classifier"}, {44, 10, "eos_id"},
        {48, 7, "weight_type"}, {64, 2, "rope_layout"}, {68, 5, "rot_dim"}, {68, 6, "rot_dim"}, {72, 9, "rope_scaling"},
        {200, 1, "reserved"}, {104, 1, "reserved"}, {72, ROPE_LONGROPE, "rope_scaling"}, // the last two: version 1
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        good_header(h);
        put_i32(h + bad[i].offset, bad[i].value);
        int rc = try_load(h, sizeof h, payload, err, sizeof err);
        CHECK(rc != 0 && strstr(err, bad[i].expect) && strstr(err, "test_run_"),
              "header field at %d = %d: expected an error naming '%s' and the file, got rc=%d '%s'", bad[i].offset,
              bad[i].value, bad[i].expect, rc, rc ? err : "");
    }
    good_header(h);
    put_f32(h + 56, -1.0f);
    CHECK(try_load(h, sizeof h, payload, err, sizeof err) != 0 && strstr(err, "norm_eps"), "negative eps: %s", err);
    good_header(h);
    put_f32(h + 92, 1e30f); // an attention factor this large turns every logit into NaN
    CHECK(try_load(h, sizeof h, payload, err, sizeof err) != 0 && strstr(err, "rope_attn_factor"),
          "rope_attn_factor 1e30: %s", err);
    // Version 2's fields: biases, the sliding window, the layers it covers.
    struct { int offset; int32_t value; const char *expect; } bad2[] = {
        {104, 8, "bias_flags"}, {104, -1, "bias_flags"}, {108, -1, "sliding_window"}, {108, MAX_CTX + 1, "sliding_window"},
        {112, -1, "window_first_layer"}, {112, 99, "window_first_layer"}, {116, 1, "reserved"}, {72, 7, "rope_scaling"},
    };
    for (size_t i = 0; i < sizeof bad2 / sizeof bad2[0]; i++) {
        good_header(h);
        put_i32(h + 4, 2);
        put_i32(h + bad2[i].offset, bad2[i].value);
        int rc = try_load(h, sizeof h, payload, err, sizeof err);
        CHECK(rc != 0 && strstr(err, bad2[i].expect), "version 2, header field at %d = %d: expected an error naming "
              "'%s', got rc=%d '%s'", bad2[i].offset, bad2[i].value, bad2[i].expect, rc, rc ? err : "");
    }
    good_header(h); // version 2 with every bias: the file must hold them
    put_i32(h + 4, 2);
    put_i32(h + 104, BIAS_ALL);
    put_i32(h + 108, 3);
    parse_header("x", h, sizeof h, &c, &r, err, sizeof err);
    size_t with_biases = expected_file_size(&c, &r) - CKPT_HEADER_BYTES;
    CHECK(with_biases > payload && try_load(h, sizeof h, with_biases, err, sizeof err) == 0 &&
          try_load(h, sizeof h, payload, err, sizeof err) != 0 && strstr(err, "truncated"),
          "version 2 with biases: %zu bytes (without: %zu): %s", with_biases, payload, err);
    put_i32(h, 0x12345678); // not our magic: read as a legacy header with absurd dims
    CHECK(try_load(h, sizeof h, payload, err, sizeof err) != 0 && strstr(err, "out of range"), "bad magic: %s", err);

    // Legacy: a header claiming stories15M over 4 KB of data (crashes llama2.c).
    unsigned char lh[28];
    int32_t l15[7] = {288, 768, 6, 6, 6, 32000, 256};
    for (int i = 0; i < 7; i++) put_i32(lh + 4 * i, l15[i]);
    CHECK(try_load(lh, sizeof lh, 4096, err, sizeof err) != 0 && strstr(err, "truncated"), "legacy 15M over 4KB: %s",
          err);
    put_i32(lh + 12, 0); // n_heads = 0 (llama2.c divides by zero)
    CHECK(try_load(lh, sizeof lh, 4096, err, sizeof err) != 0 && strstr(err, "n_heads"), "legacy n_heads=0: %s", err);

    Transformer t;
    CHECK(load_checkpoint(&t, "/nonexistent/model.bin", err, sizeof err) != 0 && strstr(err, "/nonexistent/model.bin"),
          "missing file: %s", err);
    CHECK(load_checkpoint(&t, "/tmp", err, sizeof err) != 0 && strstr(err, "directory"), "directory: %s", err);
}
