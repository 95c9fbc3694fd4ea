/* keys.h: the long-context key strategies (keys.c) that run.c's RoPE stage
 * calls, (b) to (d) of KeyStrategy (run.h), and the rolling cache's slots and
 * places, which attention statistics read too.
 */
#ifndef KEYS_H
#define KEYS_H

#include "run.h"

/* Attention sinks' rolling cache: the slot the token at pos is stored in, and
 * the place (the position RoPE gives it) of slot `slot` when the newest token
 * is at pos. Without sinks, or before the cache is full, both are pos. */
int cache_slot(const Transformer *t, int pos);
int cache_place(const Transformer *t, int slot, int pos);
/* Write B rows of kv_dim values of the tokens at pos0.. into their slots of
 * one layer's cache (t->kv_type). */
void cache_store(const Transformer *t, void *cache, int pos0, int B, const float *src);
/* Rotate the cached keys the queries at pos .. pos+B-1 read (a pre-RoPE
 * cache) into key_rot, and with Self-Extend into key_grouped. */
void rotate_cached_keys(float *key_rot, float *key_grouped, const void *keys, int pos, int B, const Transformer *t);

/* Once per block, before the layers: exact dynamic NTK's frames. */
void rope_prepare(Transformer *t, int B, int pos0);
/* One layer's RoPE stage for each strategy but (a): the B keys and values
 * stored, q rotated (or left to frames), and the view attention reads. */
CacheView per_length_keys(Transformer *t, void *key_cache, void *value_cache, int B, int pos0, int window);
CacheView self_extend_keys(Transformer *t, void *key_cache, void *value_cache, int B, int pos0, int window);
CacheView sinks_keys(Transformer *t, void *key_cache, void *value_cache, int B, int pos0, int window);

#endif
