#include "logsink.hpp"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

#include "ggml.h"
#include "llama.h"

namespace uma {
namespace {

// Silent by default: failures reach the user as exceptions that quote these lines.
std::atomic<int> g_stderr_level{GGML_LOG_LEVEL_NONE};

struct ThreadLog {
    std::string problem;     // WARN/ERROR lines since the last log_clear_problem()
    int last_level = GGML_LOG_LEVEL_NONE;
};
thread_local ThreadLog t_log;

void sink(ggml_log_level level, const char * text, void * /*user_data*/) {
    int effective = level;
    if (level == GGML_LOG_LEVEL_CONT) {
        effective = t_log.last_level;
    } else {
        t_log.last_level = level;
    }
    // The first lines say what went wrong; later ones ("failed to decode") only echo it.
    // Bounded, since some failures print long tensor listings.
    if (effective >= GGML_LOG_LEVEL_WARN && t_log.problem.size() < 2048) t_log.problem += text;
    int threshold = g_stderr_level.load(std::memory_order_relaxed);
    if (threshold > 0 && effective >= threshold) std::fputs(text, stderr);
}

}  // namespace

void log_install() { llama_log_set(sink, nullptr); }

void log_set_level(int level) { g_stderr_level.store(level, std::memory_order_relaxed); }

int log_get_level() { return g_stderr_level.load(std::memory_order_relaxed); }

std::size_t log_last_problem(char * buf, std::size_t cap) {
    if (cap == 0) return 0;
    // One line: newlines and runs of spaces collapse to single spaces.
    std::string line;
    for (char c : t_log.problem) {
        if (c == '\n' || c == '\r' || c == '\t') c = ' ';
        if (c == ' ' && (line.empty() || line.back() == ' ')) continue;
        line += c;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::size_t n = line.size() < cap - 1 ? line.size() : cap - 1;
    std::memcpy(buf, line.data(), n);
    buf[n] = '\0';
    return n;
}

void log_clear_problem() {
    t_log.problem.clear();
    t_log.last_level = GGML_LOG_LEVEL_NONE;
}

}  // namespace uma
