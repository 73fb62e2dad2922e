# The slice of llama.h that uma calls, declared once, nogil. Fields that uma never touches are
# left out of the struct declarations: Cython takes the layout from the real header.

from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libcpp cimport bool as cbool

cdef extern from "ggml.h" nogil:
    ctypedef enum ggml_log_level:
        GGML_LOG_LEVEL_NONE
        GGML_LOG_LEVEL_DEBUG
        GGML_LOG_LEVEL_INFO
        GGML_LOG_LEVEL_WARN
        GGML_LOG_LEVEL_ERROR
        GGML_LOG_LEVEL_CONT
    ctypedef int ggml_type
    ctypedef void (*ggml_log_callback)(ggml_log_level level, const char * text, void * user_data)

cdef extern from "ggml-backend.h" nogil:
    ctypedef struct ggml_backend_device:
        pass
    ctypedef ggml_backend_device * ggml_backend_dev_t
    ctypedef struct ggml_backend_reg:
        pass
    ctypedef ggml_backend_reg * ggml_backend_reg_t
    enum:  # enum ggml_backend_dev_type (its name is also the function's below)
        GGML_BACKEND_DEVICE_TYPE_CPU
        GGML_BACKEND_DEVICE_TYPE_GPU
        GGML_BACKEND_DEVICE_TYPE_IGPU
        GGML_BACKEND_DEVICE_TYPE_ACCEL
        GGML_BACKEND_DEVICE_TYPE_META
    size_t ggml_backend_dev_count()
    ggml_backend_dev_t ggml_backend_dev_get(size_t index)
    const char * ggml_backend_dev_name(ggml_backend_dev_t device)
    const char * ggml_backend_dev_description(ggml_backend_dev_t device)
    void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total)
    int ggml_backend_dev_type(ggml_backend_dev_t device)
    ggml_backend_reg_t ggml_backend_dev_backend_reg(ggml_backend_dev_t device)
    const char * ggml_backend_reg_name(ggml_backend_reg_t reg)

cdef extern from "gguf.h" nogil:
    # read a GGUF's metadata without loading it (checks that must come before llama.cpp's
    # loader, which aborts the process on a bad override)
    struct gguf_context:
        pass
    struct ggml_context:
        pass
    struct gguf_init_params:
        cbool no_alloc
        ggml_context ** ctx
    gguf_context * gguf_init_from_file(const char * fname, gguf_init_params params)
    void gguf_free(gguf_context * ctx)
    int64_t gguf_find_key(const gguf_context * ctx, const char * key)
    int gguf_get_kv_type(const gguf_context * ctx, int64_t key_id)
    uint32_t gguf_get_val_u32(const gguf_context * ctx, int64_t key_id)
    const char * gguf_get_val_str(const gguf_context * ctx, int64_t key_id)
    enum:
        GGUF_TYPE_UINT32
        GGUF_TYPE_STRING

cdef extern from "llama.h" nogil:
    ctypedef int32_t llama_pos
    ctypedef int32_t llama_token
    ctypedef int32_t llama_seq_id

    cdef struct llama_model:
        pass
    cdef struct llama_context:
        pass
    cdef struct llama_vocab:
        pass
    cdef struct llama_memory_i:
        pass
    ctypedef llama_memory_i * llama_memory_t

    ctypedef cbool (*llama_progress_callback)(float progress, void * user_data)
    ctypedef cbool (*ggml_abort_callback)(void * data)

    ctypedef struct llama_batch:
        int32_t n_tokens
        llama_token * token
        float * embd
        llama_pos * pos
        int32_t * n_seq_id
        llama_seq_id ** seq_id
        int8_t * logits

    enum llama_flash_attn_type:
        LLAMA_FLASH_ATTN_TYPE_AUTO
        LLAMA_FLASH_ATTN_TYPE_DISABLED
        LLAMA_FLASH_ATTN_TYPE_ENABLED

    enum llama_pooling_type:
        LLAMA_POOLING_TYPE_UNSPECIFIED
        LLAMA_POOLING_TYPE_NONE
        LLAMA_POOLING_TYPE_MEAN
        LLAMA_POOLING_TYPE_CLS
        LLAMA_POOLING_TYPE_LAST
        LLAMA_POOLING_TYPE_RANK

    enum llama_model_kv_override_type:
        LLAMA_KV_OVERRIDE_TYPE_INT

    struct llama_model_kv_override:
        llama_model_kv_override_type tag
        char key[128]
        int64_t val_i64  # a member of an anonymous union in llama.h

    struct llama_model_params:
        const llama_model_kv_override * kv_overrides
        int32_t n_gpu_layers
        const float * tensor_split
        llama_progress_callback progress_callback
        void * progress_callback_user_data
        bint vocab_only
        bint check_tensors

    struct llama_context_params:
        uint32_t n_ctx
        uint32_t n_batch
        uint32_t n_ubatch
        uint32_t n_seq_max
        uint32_t n_outputs_max_per_seq
        int32_t n_threads
        int32_t n_threads_batch
        llama_flash_attn_type flash_attn_type
        ggml_type type_k
        ggml_type type_v
        ggml_abort_callback abort_callback
        void * abort_callback_data
        llama_pooling_type pooling_type
        bint embeddings
        bint offload_kqv
        bint no_perf
        bint kv_unified
        bint swa_full

    cdef struct llama_sampler:
        pass

    struct llama_sampler_chain_params:
        bint no_perf

    llama_sampler_chain_params llama_sampler_chain_default_params()
    llama_sampler * llama_sampler_chain_init(llama_sampler_chain_params params)
    void llama_sampler_chain_add(llama_sampler * chain, llama_sampler * smpl)
    llama_sampler * llama_sampler_init_greedy()
    llama_sampler * llama_sampler_init_dist(uint32_t seed)
    llama_sampler * llama_sampler_init_top_k(int32_t k)
    llama_sampler * llama_sampler_init_top_p(float p, size_t min_keep)
    llama_sampler * llama_sampler_init_min_p(float p, size_t min_keep)
    llama_sampler * llama_sampler_init_temp(float t)
    void llama_sampler_free(llama_sampler * smpl)
    ctypedef struct llama_token_data:
        llama_token id
        float logit
        float p
    ctypedef struct llama_token_data_array:
        llama_token_data * data
        size_t size
        int64_t selected
        bint sorted
    llama_sampler * llama_sampler_init_grammar(const llama_vocab * vocab, const char * grammar_str,
                                               const char * grammar_root)
    void llama_sampler_apply(llama_sampler * smpl, llama_token_data_array * cur_p)
    void llama_sampler_accept(llama_sampler * smpl, llama_token token)
    void llama_sampler_reset(llama_sampler * smpl)
    bint llama_set_sampler(llama_context * ctx, llama_seq_id seq_id, llama_sampler * smpl)

    ctypedef struct llama_chat_message:
        const char * role
        const char * content

    llama_model_params llama_model_default_params()
    llama_context_params llama_context_default_params()
    void llama_backend_init()
    void llama_log_set(ggml_log_callback log_callback, void * user_data)
    const char * llama_print_system_info()
    bint llama_supports_gpu_offload()
    size_t llama_max_parallel_sequences()
    size_t llama_max_devices()

    llama_model * llama_model_load_from_file(const char * path_model, llama_model_params params)
    void llama_model_free(llama_model * model)
    llama_context * llama_init_from_model(llama_model * model, llama_context_params params)
    void llama_free(llama_context * ctx)

    uint32_t llama_n_ctx(const llama_context * ctx)
    uint32_t llama_n_ctx_seq(const llama_context * ctx)
    uint32_t llama_n_batch(const llama_context * ctx)
    uint32_t llama_n_ubatch(const llama_context * ctx)
    uint32_t llama_n_seq_max(const llama_context * ctx)
    int32_t llama_n_threads(llama_context * ctx)
    int32_t llama_n_threads_batch(llama_context * ctx)
    void llama_set_n_threads(llama_context * ctx, int32_t n_threads, int32_t n_threads_batch)
    llama_memory_t llama_get_memory(const llama_context * ctx)

    const llama_vocab * llama_model_get_vocab(const llama_model * model)
    int32_t llama_model_n_ctx_train(const llama_model * model)
    int32_t llama_model_n_embd(const llama_model * model)
    int32_t llama_model_n_embd_out(const llama_model * model)
    int32_t llama_model_n_layer(const llama_model * model)
    int32_t llama_model_n_head(const llama_model * model)
    int32_t llama_model_n_head_kv(const llama_model * model)
    int32_t llama_model_meta_val_str(const llama_model * model, const char * key, char * buf,
                                     size_t buf_size)
    int32_t llama_model_desc(const llama_model * model, char * buf, size_t buf_size)
    uint64_t llama_model_size(const llama_model * model)
    uint64_t llama_model_n_params(const llama_model * model)
    const char * llama_model_chat_template(const llama_model * model, const char * name)
    bint llama_model_has_encoder(const llama_model * model)
    bint llama_model_is_recurrent(const llama_model * model)

    int32_t llama_vocab_n_tokens(const llama_vocab * vocab)
    bint llama_vocab_is_eog(const llama_vocab * vocab, llama_token token)
    int llama_vocab_get_attr(const llama_vocab * vocab, llama_token token)
    llama_token llama_vocab_bos(const llama_vocab * vocab)
    llama_token llama_vocab_eos(const llama_vocab * vocab)
    llama_token llama_vocab_eot(const llama_vocab * vocab)
    bint llama_vocab_get_add_bos(const llama_vocab * vocab)
    llama_token llama_vocab_fim_pre(const llama_vocab * vocab)
    llama_token llama_vocab_fim_suf(const llama_vocab * vocab)
    llama_token llama_vocab_fim_mid(const llama_vocab * vocab)
    llama_token llama_vocab_fim_pad(const llama_vocab * vocab)
    llama_token llama_vocab_fim_rep(const llama_vocab * vocab)
    llama_token llama_vocab_fim_sep(const llama_vocab * vocab)

    int32_t llama_tokenize(const llama_vocab * vocab, const char * text, int32_t text_len,
                           llama_token * tokens, int32_t n_tokens_max, bint add_special,
                           bint parse_special)
    int32_t llama_token_to_piece(const llama_vocab * vocab, llama_token token, char * buf,
                                 int32_t length, int32_t lstrip, bint special)
    int32_t llama_detokenize(const llama_vocab * vocab, const llama_token * tokens,
                             int32_t n_tokens, char * text, int32_t text_len_max,
                             bint remove_special, bint unparse_special)
    int32_t llama_chat_apply_template(const char * tmpl, const llama_chat_message * chat,
                                      size_t n_msg, bint add_ass, char * buf, int32_t length)

    void llama_memory_clear(llama_memory_t mem, bint data)
    bint llama_memory_seq_rm(llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1)
    void llama_memory_seq_cp(llama_memory_t mem, llama_seq_id src, llama_seq_id dst,
                             llama_pos p0, llama_pos p1)
    void llama_memory_seq_keep(llama_memory_t mem, llama_seq_id seq_id)
    llama_pos llama_memory_seq_pos_min(llama_memory_t mem, llama_seq_id seq_id)
    llama_pos llama_memory_seq_pos_max(llama_memory_t mem, llama_seq_id seq_id)

    size_t llama_state_seq_get_size(llama_context * ctx, llama_seq_id seq_id)
    size_t llama_state_seq_get_data(llama_context * ctx, uint8_t * dst, size_t size,
                                    llama_seq_id seq_id)
    size_t llama_state_seq_set_data(llama_context * ctx, const uint8_t * src, size_t size,
                                    llama_seq_id dest_seq_id)

    llama_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max)
    void llama_batch_free(llama_batch batch)
    int32_t llama_decode(llama_context * ctx, llama_batch batch)
    int llama_context_pooling "llama_pooling_type"(const llama_context * ctx)
    float * llama_get_embeddings_seq(llama_context * ctx, llama_seq_id seq_id)
    void llama_synchronize(llama_context * ctx)

    struct llama_perf_context_data:
        int32_t n_reused
    llama_perf_context_data llama_perf_context(const llama_context * ctx)
    llama_token llama_get_sampled_token_ith(llama_context * ctx, int32_t i)
    float * llama_get_logits(llama_context * ctx)
    float * llama_get_logits_ith(llama_context * ctx, int32_t i)
