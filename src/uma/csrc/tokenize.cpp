#include "tokenize.hpp"

#include <pthread.h>

#include <climits>

#include "llama.h"

namespace uma {

namespace {

struct Call {
    const llama_vocab * vocab;
    const char * text;
    int32_t n_text;
    int32_t * tokens;
    int32_t n_tokens_max;
    bool add_special;
    bool parse_special;
    int32_t result;
};

void * run(void * arg) {
    auto * call = static_cast<Call *>(arg);
    call->result = llama_tokenize(call->vocab, call->text, call->n_text, call->tokens,
                                  call->n_tokens_max, call->add_special, call->parse_special);
    return nullptr;
}

}  // namespace

int32_t tokenize_on_stack(const llama_vocab * vocab, const char * text, int32_t n_text,
                          int32_t * tokens, int32_t n_tokens_max, bool add_special,
                          bool parse_special, std::size_t stack_bytes) {
    Call call{vocab, text, n_text, tokens, n_tokens_max, add_special, parse_special, 0};
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) {
        return INT32_MIN + 1;
    }
    pthread_t thread;
    const bool made = pthread_attr_setstacksize(&attr, stack_bytes) == 0 &&
                      pthread_create(&thread, &attr, run, &call) == 0;
    pthread_attr_destroy(&attr);
    if (!made) {
        return INT32_MIN + 1;
    }
    pthread_join(thread, nullptr);
    return call.result;
}

}  // namespace uma
