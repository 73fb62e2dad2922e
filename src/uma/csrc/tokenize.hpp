// Tokenising long texts on a stack sized for them.
//
// Some of llama.cpp's pre-tokenizers (deepseek-coder's, among others, at the pinned commit)
// split text with std::regex, whose matcher recurses once per character: a 60 KB run of one
// letter overflowed an 8 MiB thread stack and took the whole process down (upstream knows it;
// the pinned source is not ours to edit). A long text is therefore tokenised on a thread of
// its own whose stack grows with the text. The stack is reserved address space; only the
// pages the recursion touches are ever committed.
#pragma once

#include <cstddef>
#include <cstdint>

struct llama_vocab;

namespace uma {

// Below this many bytes a text is tokenised on the calling thread.
constexpr int32_t kBigStackBytes = 8192;

// llama_tokenize on a thread with `stack_bytes` of stack; INT32_MIN + 1 if no such thread
// could be made.
int32_t tokenize_on_stack(const llama_vocab * vocab, const char * text, int32_t n_text,
                          int32_t * tokens, int32_t n_tokens_max, bool add_special,
                          bool parse_special, std::size_t stack_bytes);

}  // namespace uma
