#include "kv_span.hpp"

#include "llama-context.h"
#include "llama-kv-cache-iswa.h"
#include "llama-kv-cache.h"

namespace uma {

int32_t kv_span(const llama_context * ctx) {
    if (ctx == nullptr || !ctx->get_cparams().kv_unified) {
        return -1;
    }
    const auto * memory = ctx->get_memory();
    const auto * cache = dynamic_cast<const llama_kv_cache *>(memory);
    if (const auto * iswa = dynamic_cast<const llama_kv_cache_iswa *>(memory)) {
        // sliding-window layers beside full ones (Gemma 3): the full layers' cache is the
        // one whose span grows with what is kept; the window's stays within its size
        cache = iswa->get_base();
    }
    if (cache == nullptr) {
        return -1;
    }
    // one buffer: stream 0 is every sequence's
    llama_kv_cache::slot_info whole{};
    whole.s0 = 0;
    whole.s1 = 0;
    whole.strm = {0};
    whole.idxs = {{}};
    return static_cast<int32_t>(cache->get_n_kv(whole));
}

}  // namespace uma
