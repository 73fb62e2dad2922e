// llama.cpp's RPC backend from uma: workers registered as devices before a model loads, a
// worker served in this process (`uma rpc-worker`), and a hold on ggml's abort.
//
// ggml-rpc aborts the process when a worker's connection fails mid-run (RPC_STATUS_ASSERT ->
// GGML_ABORT -> abort()). With the hold installed, the thread that would abort (the engine's
// thread that decodes, inside a decode) records the message and waits forever instead: the daemon
// stays up, its other threads fail the requests and report the state, and a restart (once
// the worker is back) serves again. Every function here is safe without the GIL.
#pragma once

#include <cstddef>
#include <cstdint>

namespace uma {

// Whether llama.cpp's RPC backend is compiled in.
bool rpc_compiled();
// Registers the worker at endpoint ("host:port") as devices for models loaded from now on.
// Returns the number of devices it adds (0: unreachable, or RPC not compiled in); names[i]
// (cap bytes each) gets each device's name. Registering an endpoint again adds nothing.
int32_t rpc_add_worker(const char * endpoint, char * names, std::size_t cap, int32_t max_names);
// Serves this process's devices (GPUs, else the CPU) to clients at endpoint until killed.
// cache_dir may be null. Returns false if RPC is not compiled in.
bool rpc_serve(const char * endpoint, const char * cache_dir, std::size_t n_threads);

// From now on a ggml abort holds its thread instead of ending the process.
void abort_hold_install();
// Blocks until a thread has been held (returns true, the message in buf; at once if one was)
// or abort_wait_cancel is called (false).
bool abort_wait(char * buf, std::size_t cap);
void abort_wait_cancel();

}  // namespace uma
