"""convert: the readers and writers behind export.py, the only writer of
checkpoints and tokenizers for `run`.

The checkpoint format (versions 1 and 2, magic "LRPE") is documented field by
field in the top comment of model.h. In short:

    256-byte header  magic, version, dimensions, shared-classifier flag, BOS/EOS,
                     weight type, norm eps and every RoPE parameter; version 2 also
                     which projections have biases and the sliding window; the
                     rest zero. Version 1 is written whenever a file needs none of
                     version 2's fields (no biases, no window, no LongRoPE)
    tensors          float32, little-endian, row-major, in TENSOR_TABLE order,
                     each starting at a file offset that is a multiple of 64
                     (zero padding in between); the file ends where the last
                     tensor ends. With --dtype q8_0 (weight_type 1) the
                     matrices are int8 values, then float32 scales, one per
                     group_size values of a row (model.h, "q8_0 tensors")

Tokenizers come in two formats (model.h, "Tokenizer files"): llama2.c's
tokenizer.bin for sentencepiece vocabularies converted from a .model file

    i32 max_token_length, then per token: f32 score, i32 length, the bytes

and version 3 ("LTOK") for every other source (tokenizer.json, tiktoken, GGUF):
a 64-byte header (type, pre-tokenizer, vocab_size, merges, BOS/EOS/EOT/PAD,
add_bos, chat template, stop ids, system text lengths), then per piece f32
score, i32 kind, i32 length, the raw bytes, then the merges as pairs of ids,
the stop ids, the template's default system prompt and system prefix.

Modules (each source's reader returns a Source: config, tensors, tokenizer,
notes; see common.py):
    common            ExportError, Source, checked config values, JSON, atomic
                      files, progress lines
    checkpoint        our checkpoint format: header, tensor table, normalize_config,
                      write_checkpoint (f32, q8_0), read_checkpoint, random_tensors
    lazy              lazy tensors (read a block of rows at a time), the q/k head
                      permutation between the two RoPE layouts
    llama2c           llama2.c checkpoints (version 0)
    safetensors       safetensors files, read with numpy
    hf                Hugging Face model directories: config.json and weights
    hf_rope           config.json's rope_scaling: one function per rope type
    meta              Meta consolidated.*.pth + params.json (needs torch)
    gguf              llama.cpp GGUF files of the Llama architecture
    gguf_file         the GGUF file itself: checked layout, metadata, tensors
    gguf_rope         a GGUF file's RoPE scaling (rope.scaling.*, rope_freqs)
    gguf_tokenizer    the tokenizer in a GGUF file's metadata
    tokenizer_bin     llama2.c's tokenizer.bin from a sentencepiece .model
    ltok              the version-3 tokenizer file (LTOK): checked, packed, written
    tokenizer_json    Hugging Face tokenizer.json (byte-level BPE)
    tiktoken_bpe      tiktoken files (Llama 3's tokenizer.model)
    chat_templates    a chat template recognized as one run renders; stop ids
    tokenizer_source  which reader a tokenizer file needs, by its content
"""
