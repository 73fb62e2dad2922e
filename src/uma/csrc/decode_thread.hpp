// The process's one decode thread: every llama_decode of every context (each engine's, a draft
// model's, an embedder's) whose model has layers on the CPU runs on it, whichever thread asks.
//
// Why: ggml's CPU backend computes a graph in an OpenMP parallel region, and libgomp keeps a
// team of worker threads per thread that opens one. Two engines decoding on their own threads
// leave two teams behind; once the threads libgomp manages outnumber the cores, its barriers
// (one between every two graph nodes) stop spinning and sleep in the kernel at once, so a model
// decoded 2.5x slower beside a second model that sat idle. The barrier's spin limit for that
// case is fixed inside libgomp (no environment variable lifts it), so the only cure is a single
// team: a single thread that decodes. Callers wait on it without the GIL; a decode from two
// threads at once runs one after the other, as the cores would have run them anyway.
//
// A model wholly on a GPU decodes on its caller's thread instead (uma._core's Context.decode):
// there the CPU's part of a decode is a few small operations, and the hand-over's two thread
// wake-ups cost 0.2 ms a decode on an H200 host, 10-25 % of a host-bound engine's tokens/s.
#pragma once

#include <cstddef>
#include <cstdint>

#include "llama.h"

namespace uma {

// llama_decode(ctx, batch) on the decode thread (on_decode_thread; the caller waits for it) or
// on the calling thread. `problem` (cap bytes, may be null) gets the warning/error lines
// llama.cpp logged during that decode (see logsink.hpp).
int32_t decode(llama_context * ctx, llama_batch batch, bool on_decode_thread, char * problem,
               std::size_t cap);
// Decodes run on the decode thread so far (for tests: each path routes through it).
uint64_t decode_thread_calls();
// The decode thread's kernel thread id (0 before the first decode), for tests.
int64_t decode_thread_id();

}  // namespace uma
