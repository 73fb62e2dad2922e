// How far a tick's attention runs in a context's KV cache: the cells up to the highest one in
// use, padded as llama.cpp pads them (llama_kv_cache::get_n_kv).
//
// Why: with one KV buffer for every sequence, llama.cpp sizes each tick's attention to the
// highest cell in use, whoever holds it; every row runs over all of those cells, the ones of
// other sequences and the free ones below the top masked out. What a tick costs therefore
// follows this span, not the cells the tick's own sequences hold nor how many cells are in use
// (docs/lab/2026-11-29-kept-cells-span.md). llama.cpp's public API does not say it, so this
// reads it from the cache object of the vendored commit (its internal headers; nothing of
// llama.cpp is changed).
#pragma once

#include <cstdint>

#include "llama.h"

namespace uma {

// The span in cells of `ctx`'s KV cache (one buffer for every sequence; for a model with
// sliding-window layers beside full ones, the full layers' cache); -1 where the context has no
// such cache: a KV buffer per sequence, a recurrent or hybrid model, or no memory at all.
int32_t kv_span(const llama_context * ctx);

}  // namespace uma
