# The compiled core's own declarations: the native helpers in csrc/ and the cdef classes.

from libc.stdint cimport int32_t, uint32_t, uint64_t
from libcpp cimport bool as cbool

from uma._llama cimport llama_batch, llama_context, llama_model, llama_sampler, llama_vocab


cdef extern from "logsink.hpp" namespace "uma" nogil:
    void log_install()
    void log_set_level(int level)
    int log_get_level()
    size_t log_last_problem(char * buf, size_t cap)
    void log_clear_problem()


cdef extern from "tokenize.hpp" namespace "uma" nogil:
    int32_t kBigStackBytes
    int32_t tokenize_on_stack(const llama_vocab * vocab, const char * text, int32_t n_text,
                              int32_t * tokens, int32_t n_tokens_max, cbool add_special,
                              cbool parse_special, size_t stack_bytes)


cdef extern from "kv_span.hpp" namespace "uma" nogil:
    int32_t native_kv_span "uma::kv_span"(const llama_context * ctx)


cdef extern from "decode_thread.hpp" namespace "uma" nogil:
    int32_t native_decode "uma::decode"(llama_context * ctx, llama_batch batch,
                                        cbool on_decode_thread, char * problem, size_t cap)
    uint64_t native_decode_thread_calls "uma::decode_thread_calls"()
    long long native_decode_thread_id "uma::decode_thread_id"()


cdef extern from "rpc.hpp" namespace "uma" nogil:
    cbool rpc_compiled()
    int32_t native_rpc_add_worker "uma::rpc_add_worker"(const char * endpoint, char * names,
                                                        size_t cap, int32_t max_names)
    cbool native_rpc_serve "uma::rpc_serve"(const char * endpoint, const char * cache_dir,
                                            size_t n_threads)
    void abort_hold_install()
    cbool native_abort_wait "uma::abort_wait"(char * buf, size_t cap)
    void abort_wait_cancel()


cdef extern from "sampler.hpp" namespace "uma" nogil:
    cdef cppclass SamplingParams:
        float temperature
        int32_t top_k
        float top_p
        float min_p
        float repeat_penalty
        float frequency_penalty
        float presence_penalty
        int32_t penalty_last_n
        uint64_t seed

    cdef cppclass SampleJob:
        const float * logits
        const int32_t * rows
        const int32_t * slots
        int32_t n
        int32_t * out_tokens
        float * out_logprobs
        const uint32_t * masks
        const int32_t * mask_index
        int32_t mask_words

    cdef cppclass NativeSampler "uma::Sampler":
        NativeSampler(int32_t n_slots, int32_t n_vocab, int32_t n_threads) except +
        int32_t n_slots()
        int32_t n_vocab()
        void configure(int32_t slot, const SamplingParams & params) except +
        void accept(int32_t slot, const int32_t * tokens, int32_t n) except +
        void set_bias(int32_t slot, const int32_t * tokens, const float * values,
                      int32_t n) except +
        void sample(const SampleJob & job) except +
        void submit(const SampleJob & job) except +
        void wait()
        cbool busy()
        int32_t candidates(int32_t slot, const float * row, int32_t * out_ids,
                           float * out_probs) except +
        void top_logprobs(const float * logits, const int32_t * rows, int32_t n, int32_t k,
                          int32_t * out_ids, float * out_logprobs) except +


cdef class Model:
    cdef llama_model * _model
    cdef const llama_vocab * _vocab
    cdef readonly str path
    cdef readonly int n_vocab
    cdef readonly bint vocab_only
    cdef readonly bint layers_on_cpu  # its contexts then decode on the one decode thread
    cdef int _n_contexts
    cdef bint _closing
    cdef object _progress
    cdef object _progress_error
    cdef int _n_expert_used  # set at load; 0: the file's own

    cdef int _check_open(self) except -1
    cdef int _check_token(self, long token) except -1
    cdef int32_t _tokenize(self, const char * text, int32_t n_text, int32_t * tokens,
                           int32_t n_max, cbool add_special, cbool parse_special) except? -1
    cdef void _free(self) noexcept
    cdef void _release_context(self) noexcept


cdef class Batch:
    cdef llama_batch _batch
    cdef readonly int capacity
    cdef readonly int n_outputs

    cdef void _put(self, int i, int32_t token, int32_t pos, int32_t seq, bint out) noexcept nogil
    cdef object _output_index(self)


cdef class Context:
    cdef llama_context * _ctx
    cdef readonly Model model
    cdef int _n_outputs
    cdef int _exports
    cdef bint _sampling
    cdef bint _closing
    cdef object _output_seqs
    cdef long long _decode_ns
    cdef int _abort  # read by ggml's compute threads between graph nodes (abort())
    cdef llama_sampler ** _chains  # each sequence's device sampler chain, or NULL (owned)
    cdef object _chain_keys  # the parameters each chain was built from
    cdef int _n_chains
    cdef object _output_index  # batch position of each logits row, while chains exist
    cdef int _outputs_per_seq  # logits rows a device-sampled sequence may have

    cdef void _free(self) noexcept
    cdef void _free_if_idle(self) noexcept

    cdef int _check_open(self) except -1
    cdef int _check_seq(self, long seq_id) except -1
    cdef int _validate(self, Batch batch) except -1
    cdef const float * _logits(self) except NULL
    cdef void _drop_chain(self, int seq_id) noexcept


cdef class Embedder:
    cdef llama_context * _ctx
    cdef llama_batch _batch
    cdef readonly Model model
    cdef readonly int n_ctx
    cdef readonly int n_seq_max
    cdef readonly int n_embd
    cdef readonly str pooling

    cdef void _free(self) noexcept


cdef class Sampler:
    cdef NativeSampler * _native
    cdef Context _inflight
    cdef object _keep

    cdef NativeSampler * _check(self) except NULL
    cdef SampleJob _job(self, size_t data, r, s, tokens, lp, masks=*, mask_index=*)
