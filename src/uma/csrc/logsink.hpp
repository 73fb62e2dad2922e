// Where llama.cpp's and ggml's log lines go.
//
// llama.cpp reports why a load or a decode failed only through its logger. The sink keeps each
// thread's warning/error lines since the last clear, so that the exception raised on that thread
// can quote them, and writes lines at or above a chosen level to stderr (none by default). It
// never touches Python, so it is safe from any thread, GIL or not.
#pragma once

#include <cstddef>

namespace uma {

void log_install();
// GGML_LOG_LEVEL_* threshold for stderr; 0 silences everything, 5 or more prints nothing new.
void log_set_level(int level);
int log_get_level();
// Copies the calling thread's warning/error text since the last clear, as one line
// (NUL-terminated), and returns its length.
std::size_t log_last_problem(char * buf, std::size_t cap);
void log_clear_problem();

}  // namespace uma
