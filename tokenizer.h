/* tokenizer.h: the tokenizer file formats, the Tokenizer struct and the API
 * of tokenizer.c, the only code that knows BPE. run.c and the modes call
 * tokenizer_build, tokenizer_encode and tokenizer_decode; tests/ check them
 * against sentencepiece and Hugging Face tokenizers. */
#ifndef TOKENIZER_H
#define TOKENIZER_H

#include "model.h" /* fail, read_le_i32, read_file */

/* ------------------------------------------------------------------------
 * Tokenizer files (tokenizer.c reads every version; export.py writes 1 and 3)
 *
 * Version 1: llama2.c's tokenizer.bin, sentencepiece vocabularies only
 *   i32 max_token_length
 *   vocab_size times: f32 score, i32 len, len bytes (no terminator)
 *
 * Version 3 ("LTOK"): any vocabulary this program runs, with its chat template
 * and stop tokens. Little-endian; a 64-byte header, then the pieces, the
 * merges, the stop ids and the template's two system texts. (Version 2 is the
 * same file without the last four header fields, which it keeps zero, and
 * without what follows the merges; it is still read.)
 *  offset type  field
 *    0    u32   magic       0x4b4f544c, the bytes "LTOK"
 *    4    i32   version     3 (or 2)
 *    8    i32   type        TOK_SENTENCEPIECE (0): merge the pair whose joined piece
 *                           scores highest, byte fallback <0xHH>; TOK_BYTE_BPE (1):
 *                           GPT-2 byte-level BPE, merge the pair of lowest rank
 *   12    i32   pre         pre-tokenizer splitting text before BPE (type 1 only,
 *                           else PRE_NONE): PRE_GPT2, PRE_LLAMA3, PRE_QWEN2, PRE_SMOLLM;
 *                           PRE_LLAMA3 also means a pre-token that is a whole normal
 *                           piece is that piece, unmerged (Llama 3's ignore_merges)
 *   16    i32   vocab_size  must equal the checkpoint's
 *   20    i32   n_merges    type 1: merges after the pieces (rank = order); type 0: 0
 *   24    i32   bos_id      -1 = none
 *   28    i32   eos_id      -1 = none
 *   32    i32   eot_id      end of turn (e.g. <|eot_id|>), -1 = none
 *   36    i32   pad_id      -1 = none
 *   40    i32   add_bos     1: a prompt starts with BOS; 0: it does not (SmolLM2, Qwen2)
 *   44    i32   chat_template  CHAT_UNSTATED (0): the source named none that export.py
 *                           knows; CHAT_PLAIN (1), CHAT_LLAMA2 (2), CHAT_CHATML (3),
 *                           CHAT_LLAMA3 (4): chat.c's render_chat says what each renders
 *   48    i32   n_stop      0..TOK_MAX_STOP stop ids after the merges
 *   52    i32   system_default_len  0..TOK_MAX_SYSTEM bytes: the system prompt the
 *                           template puts in when the conversation has none (SmolLM2's
 *                           "You are a helpful AI assistant named SmolLM, ...")
 *   56    i32   system_prefix_len   0..TOK_MAX_SYSTEM bytes: text the template puts
 *                           before every system prompt, and that makes it write a
 *                           system turn even without one (Llama 3.1's knowledge dates)
 *   60..63      reserved, zero
 *  then vocab_size pieces, in id order:
 *         f32   score       type 0: merge priority; type 1: 0
 *         i32   kind        PIECE_NORMAL (0): text BPE may produce; PIECE_SPECIAL (1):
 *                           a control or added token (<s>, <|im_start|>): never made by
 *                           merging; in type 1 a prompt's exact text of it becomes this id,
 *                           as Hugging Face's tokenizers do by default; PIECE_BYTE (2): type
 *                           0's <0xHH>, one raw byte; PIECE_UNUSED (3): never produced
 *         i32   len         bytes that follow, 0..65536
 *         len   bytes       the piece's text as raw bytes (type 1: GPT-2's byte-to-unicode
 *                           mapping already undone, so "Ġthe" is stored as " the")
 *  then n_merges merges, rank 0 first:
 *         i32   left, right ids of the two pieces; left's bytes then right's must be a
 *                           normal piece of the vocabulary (the merge's result)
 *  then n_stop stop ids:
 *         i32   id          0..vocab_size-1, each once: a token that ends a reply or a
 *                           generated text (EOS, end of turn, every id of Hugging Face's
 *                           eos_token_id)
 *  then system_default_len bytes, then system_prefix_len bytes: the two texts (export.py
 *                           writes UTF-8), no NUL byte.
 * The file ends right after the last of these. Normal pieces are unique.
 * ------------------------------------------------------------------------ */

enum { TOK_SENTENCEPIECE = 0, TOK_BYTE_BPE = 1, TOK_N_TYPES };
enum { PRE_NONE = 0, PRE_GPT2, PRE_LLAMA3, PRE_QWEN2, PRE_SMOLLM, PRE_N_TYPES };
enum { PIECE_NORMAL = 0, PIECE_SPECIAL = 1, PIECE_BYTE = 2, PIECE_UNUSED = 3, PIECE_N_KINDS };
#define TOK_MAGIC 0x4b4f544cu /* "LTOK" read as a little-endian u32 */
enum { CHAT_UNSTATED = 0, CHAT_PLAIN, CHAT_LLAMA2, CHAT_CHATML, CHAT_LLAMA3, CHAT_N_TEMPLATES };
#define TOK_VERSION 3
#define TOK_HEADER_BYTES 64
#define TOK_MAX_STOP 256
#define TOK_MAX_SYSTEM 65536

/* One merge of a byte-level BPE vocabulary (type 1), a slot of Tokenizer's
 * hash table keyed by the pair (left, right). */
typedef struct {
    int left, right; // ids of the adjacent pieces; left == -1 marks an empty slot
    int rank;        // the merge's position in the file: lower ranks merge first
    int result;      // id of the normal piece left's bytes then right's spell
} MergeRule;

/* A loaded vocabulary (any version); tokenizer_build fills it, run.c reads
 * the ids, add_bos, the chat template, the stop ids and the system texts,
 * tokenizer_free releases it. */
typedef struct {
    int type;               // TOK_SENTENCEPIECE | TOK_BYTE_BPE
    int pre;                // PRE_NONE | PRE_GPT2 .. PRE_SMOLLM: how type 1 splits text before BPE
    int version;            // 1 = llama2.c's tokenizer.bin, 2 or 3 = "LTOK"
    int vocab_size;         // e.g. 32000
    char **vocab;           // (vocab_size) NUL-terminated piece bytes
    int *vocab_len;         // (vocab_size) piece lengths in bytes
    float *scores;          // (vocab_size) type 0: merge priority, higher merges first; type 1: unused
    unsigned char *kind;    // (vocab_size) PIECE_NORMAL .. PIECE_UNUSED; version 1 guesses it from the text
    int max_token_length;   // longest piece in bytes (version 1: the file's field), e.g. 16
    int *sorted_ids;        // (n_sorted) ids of the normal pieces sorted by bytes, for lookup
    int n_sorted;           // number of normal pieces
    int byte_offset;        // type 0: id of "<0x00>" (<0x00>..<0xFF> consecutive), or -1: no byte pieces
    int byte_id[256];       // type 1: id of the one-byte normal piece of each byte value, -1 when the
                            // vocabulary lacks it (encoding drops that byte, as tokenizers does); type 0: -1
    int unk_id;             // type 0: id of "<unk>" (0 when absent); used only without byte pieces
    int bos_id, eos_id;     // the checkpoint's, e.g. 1, 2; -1 = none; an LTOK file must agree
    int eot_id, pad_id;     // LTOK: end of turn (e.g. <|im_end|>), padding; -1 = none
    int add_bos;            // 1: a prompt starts with BOS (version 1 always); 0: it does not (SmolLM2)
    int chat_template;      // CHAT_UNSTATED .. CHAT_LLAMA3; versions 1 and 2: CHAT_UNSTATED
    int *stop_ids;          // (n_stop) version 3: the file's; versions 1 and 2: eos_id, eot_id
    int n_stop;             // e.g. 2 (SmolLM2: <|im_end|>, <|endoftext|>)
    char *system_default;   // the template's system prompt when none is given; "" = none
    char *system_prefix;    // text before every system prompt (Llama 3.1); "" = none
    MergeRule *merges;      // (merge_slots) type 1: open-addressing hash table of the n_merges merges
    int n_merges;           // merges in the file, e.g. 48900 (SmolLM2)
    int merge_slots;        // a power of two >= 2 * n_merges, or 0 without merges (type 0)
    int *special_ids;       // (n_special) type 1: non-empty PIECE_SPECIAL ids sorted by bytes, then id
    int n_special;          // e.g. 17 (SmolLM2)
    unsigned char special_lead[256]; // type 1: 1 = some special piece starts with this byte
    char *piece_storage;    // one block holding every piece of vocab, owned here
    int from_gguf;          // 1: built from a GGUF's own metadata (tokenizer.ggml.*, gguf_tokenizer.c), 0: a file
} Tokenizer;

/* Streaming decode state: bytes of a UTF-8 sequence not yet complete. */
typedef struct {
    unsigned char pending[4];
    int n_pending;
} DecodeState;

/* Load path (version 1, or 2 / 3 with the magic "LTOK"), check it holds exactly
 * vocab_size entries and agrees with the checkpoint's bos_id / eos_id (-1 =
 * none). On failure returns -1 and writes a one-line message (naming the file,
 * expected and actual) to err. */
int tokenizer_build(Tokenizer *t, const char *path, int vocab_size, int bos_id, int eos_id,
                    char *err, size_t err_len);
/* The same from a file's bytes already in memory, data[0..size) (not kept):
 * gguf_tokenizer.c builds a GGUF's vocabulary this way, from the version 3
 * file export.py would write for it. name stands for the file in the
 * messages ("tokenizer NAME: ..."). */
int tokenizer_build_bytes(Tokenizer *t, const char *name, const unsigned char *data, size_t size, int vocab_size,
                          int bos_id, int eos_id, char *err, size_t err_len);
void tokenizer_free(Tokenizer *t);
/* What kind of tokenizer t is, for the load line: "sentencepiece",
 * "byte-level BPE (smollm)", ... (a static string). */
const char *tokenizer_type_name(const Tokenizer *t);
/* Upper bound on the ids tokenizer_encode writes for n_bytes of text, for
 * either type: 3 per byte (type 1 turns an invalid byte into U+FFFD, up to
 * three ids), plus BOS, EOS and sentencepiece's dummy prefix. */
size_t tokenizer_bound(size_t n_bytes);
/* Encode text[0..n_bytes) (any bytes), optionally with BOS first and EOS
 * last. Type 0 like sentencepiece (dummy prefix, BPE by score, byte
 * fallback); type 1 like Hugging Face's tokenizers (special pieces, invalid
 * UTF-8 as U+FFFD, pre-tokenizer, BPE by merge rank). tokens must hold
 * tokenizer_bound(n_bytes). Returns the number of ids, or -1 if out of memory
 * or the text is too long. */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t n_bytes, int add_bos, int add_eos,
                     int *tokens);
/* Upper bound on the bytes one tokenizer_decode call writes. */
/* Encode a long text (no BOS, no EOS) in pieces of about `chunk` bytes cut
 * where no token can reach across (the same ids as one tokenizer_encode),
 * so memory follows the ids rather than the work buffers of the whole text;
 * *ids is malloc'd (caller frees); progress (may be NULL) gets the bytes done.
 * Returns the number of ids, or -1 out of memory. */
int tokenizer_encode_long(const Tokenizer *t, const char *text, size_t n_bytes, size_t chunk, int **ids,
                          void (*progress)(size_t done, size_t total));
size_t tokenizer_decode_bound(const Tokenizer *t);
/* Append the text of `token` (following `prev`) to out, printing only whole
 * UTF-8 code points; returns the number of bytes written. */
size_t tokenizer_decode(const Tokenizer *t, DecodeState *st, int prev, int token, char *out);
/* Emit what is still pending at the end of a stream (as U+FFFD per byte). */
size_t tokenizer_decode_flush(DecodeState *st, char *out);
/* Length of the well-formed UTF-8 code point at s[0..n) (n >= 1): 1..4, or
 * 0 when the bytes there do not form one (-m tokenize --pieces and -m info
 * show such bytes escaped). */
int utf8_length(const char *s, size_t n);

#endif
