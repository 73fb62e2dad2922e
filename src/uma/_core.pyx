# cython: language_level=3
"""uma._core: the only compiled code of UMA Serve.

A thin boundary over llama.cpp: Model, Context, Batch, zero-copy logits views, and the native
Sampler. The GIL is released around every call that computes (load, decode, sampling); status
codes become exceptions of uma.errors in one place; each cdef class owns one native handle, keeps
a reference to its parent so free order is right, and has an idempotent close().
"""

from cpython.buffer cimport PyBUF_FORMAT, PyBUF_ND, PyBUF_STRIDES, PyBUF_WRITABLE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memset, strncpy
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from libcpp cimport bool as cbool

cimport cython

cimport uma._llama as L

import os

import numpy as np

from uma import errors, token_ids
from uma.config import (
    GREEDY_BELOW as _GREEDY_BELOW,
    MAX_TOP_LOGPROBS as _MAX_TOP_LOGPROBS,
    check_logit_bias,
    check_masks,
    check_sampling,
)
from uma.embeddings import decode_end as _decode_end

cdef extern from *:
    """
    #ifndef UMA_BACKENDS
    #define UMA_BACKENDS "cpu"
    #endif
    #ifndef UMA_LLAMA_COMMIT
    #define UMA_LLAMA_COMMIT ""
    #endif
    """
    const char * UMA_BACKENDS
    const char * UMA_LLAMA_COMMIT

# Native handles alive, by kind: tests assert these return to zero (no leaked models/contexts).
_live = {"model": 0, "context": 0, "batch": 0, "sampler": 0}

_KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}
_FLASH_ATTN = {"auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED}
_LOG_LEVELS = {"none": 0, "debug": 1, "info": 2, "warn": 3, "error": 4}

# The sink first: a GPU backend reports its devices while registering (ggml_vulkan's "Found 1
# Vulkan devices" on stderr otherwise, ahead of uma's own first line).
log_install()
L.llama_backend_init()


# --- module functions --------------------------------------------------------------------------

def backends():
    """The ggml backends compiled into this build, e.g. ('cpu', 'cuda')."""
    return tuple((<bytes>UMA_BACKENDS).decode().split(","))


_DEVICE_TYPES = {L.GGML_BACKEND_DEVICE_TYPE_CPU: "cpu", L.GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
                 L.GGML_BACKEND_DEVICE_TYPE_IGPU: "igpu", L.GGML_BACKEND_DEVICE_TYPE_ACCEL: "accel",
                 L.GGML_BACKEND_DEVICE_TYPE_META: "meta"}


cdef bint _has_gpu() noexcept:
    cdef size_t i
    cdef int kind
    for i in range(L.ggml_backend_dev_count()):
        kind = L.ggml_backend_dev_type(L.ggml_backend_dev_get(i))
        if kind == L.GGML_BACKEND_DEVICE_TYPE_GPU or kind == L.GGML_BACKEND_DEVICE_TYPE_IGPU:
            return True
    return False


def devices():
    """The devices ggml found at run time, in its order: one dict each with name ('CPU',
    'Vulkan0', 'CUDA0'), description, type ('cpu', 'gpu', 'igpu', 'accel'), backend ('CPU',
    'Vulkan', 'CUDA') and memory_free / memory_total in bytes. A GPU backend compiled in lists
    no device where the machine has none (no driver, or, for Vulkan, only a CPU implementation
    such as Mesa's lavapipe, which ggml uses only when GGML_VK_VISIBLE_DEVICES names it)."""
    cdef size_t i, n = L.ggml_backend_dev_count()
    cdef size_t free_b, total_b
    cdef L.ggml_backend_dev_t dev
    out = []
    for i in range(n):
        dev = L.ggml_backend_dev_get(i)
        free_b = total_b = 0
        L.ggml_backend_dev_memory(dev, &free_b, &total_b)
        out.append({
            "name": (<bytes>L.ggml_backend_dev_name(dev)).decode(errors="replace"),
            "description": (<bytes>L.ggml_backend_dev_description(dev)).decode(errors="replace"),
            "type": _DEVICE_TYPES.get(L.ggml_backend_dev_type(dev), "other"),
            "backend": (<bytes>L.ggml_backend_reg_name(
                L.ggml_backend_dev_backend_reg(dev))).decode(errors="replace"),
            "memory_free": free_b, "memory_total": total_b,
        })
    return tuple(out)


def llama_commit():
    """The llama.cpp commit this build was compiled from ("" where the build did not say)."""
    return (<bytes>UMA_LLAMA_COMMIT).decode()


def max_parallel_sequences():
    """The most sequences one context may hold (llama.cpp's LLAMA_MAX_SEQ)."""
    return L.llama_max_parallel_sequences()


def system_info():
    """llama.cpp's description of the CPU features and backends in use."""
    return (<bytes>L.llama_print_system_info()).decode(errors="replace")


def set_log_level(level):
    """Which llama.cpp log lines reach stderr: 'none', 'debug', 'info', 'warn' or 'error'."""
    if level not in _LOG_LEVELS:
        raise errors.InvalidRequestError(
            f"log level must be one of {', '.join(_LOG_LEVELS)}, not {level!r}")
    log_set_level(_LOG_LEVELS[level])


def live_handles():
    """Counts of native objects not yet freed, by kind."""
    return dict(_live)


def _load_problem(text):
    """llama.cpp's reason a model did not load, without its function names and the closing
    'failed to load model' (the caller says which file), e.g. "unknown model architecture:
    'xyz'" or "tensor 'token_embd.weight' data is not within the file bounds, model is
    corrupted or incomplete"."""
    reason = text.replace("llama_model_load_from_file_impl: failed to load model", "").strip()
    marker = "error loading model: "
    if marker in reason:
        reason = reason.split(marker, 1)[1].strip()
    if reason.startswith("unknown model architecture"):
        reason += " (this build of llama.cpp cannot run that architecture)"
    return f"llama.cpp could not load it: {reason}" if reason else "llama.cpp could not load it"


cdef str _last_problem():
    cdef char buf[1024]
    log_last_problem(buf, sizeof(buf))
    return _problem_text(buf)


cdef str _problem_text(const char * buf):
    return (<bytes>buf).decode("utf-8", errors="replace").strip()


def decode_thread():
    """(decodes run, kernel thread id) of the process's one decode thread, which runs every
    decode of every context whose model has layers on the CPU (Model.layers_on_cpu;
    csrc/decode_thread.hpp says why); (0, 0) before any."""
    return native_decode_thread_calls(), native_decode_thread_id()


cdef cbool _on_progress(float progress, void * user_data) noexcept with gil:
    # Called by llama.cpp on the loading thread; an exception here must not cross into C.
    cdef Model model = <Model>user_data
    try:
        if model._progress(progress) is False:
            model._progress_error = errors.ModelLoadError(
                f"loading {model.path} was cancelled by the progress callback")
            return False
        return True
    except BaseException as exc:
        model._progress_error = exc
        return False


cdef cbool _should_abort(void * data) noexcept nogil:
    # ggml's compute threads ask between graph nodes; Context.abort() sets the flag.
    return (<int *>data)[0] != 0


# --- Model -------------------------------------------------------------------------------------

def _checked_experts_used(str path, int n_expert_used):
    """The metadata key that sets an MoE's experts per token, once n_expert_used is known to
    fit the file: llama.cpp's loader aborts the process on an override out of range, so the
    GGUF's own figures are read first (metadata only, no weights)."""
    cdef L.gguf_init_params gparams
    gparams.no_alloc = True
    gparams.ctx = NULL
    cdef bytes bpath = os.fsencode(path)
    cdef const char * cpath = bpath
    cdef L.gguf_context * g
    with nogil:
        g = L.gguf_init_from_file(cpath, gparams)
    if g == NULL:
        raise errors.InvalidModelError(f"{path}: its GGUF metadata could not be read")
    try:
        key_id = L.gguf_find_key(g, b"general.architecture")
        if key_id < 0 or L.gguf_get_kv_type(g, key_id) != L.GGUF_TYPE_STRING:
            raise errors.InvalidModelError(f"{path}: no general.architecture in its metadata")
        arch = (<bytes>L.gguf_get_val_str(g, key_id)).decode(errors="replace")
        count_key = f"{arch}.expert_count".encode()
        key_id = L.gguf_find_key(g, count_key)
        n_expert = 0
        if key_id >= 0 and L.gguf_get_kv_type(g, key_id) == L.GGUF_TYPE_UINT32:
            n_expert = L.gguf_get_val_u32(g, key_id)
    finally:
        L.gguf_free(g)
    if n_expert == 0:
        raise errors.InvalidRequestError(
            f"experts per token (n_expert_used={n_expert_used}) cannot be set: {path} is not "
            f"a mixture of experts ({arch} without {arch}.expert_count)")
    if not 1 <= n_expert_used <= n_expert:
        raise errors.InvalidRequestError(
            f"experts per token (n_expert_used) must be in 1..{n_expert}, the experts per "
            f"layer of {path}, not {n_expert_used}")
    return f"{arch}.expert_used_count".encode()


cdef class Model:
    """A GGUF model loaded once (memory-mapped) and shared by every context.

    n_gpu_layers: layers to offload when a GPU backend is compiled in (-1: all, 0: none).
    progress: optional callable(fraction) observed while loading; returning False cancels.
    """

    def __cinit__(self, path, *, int n_gpu_layers=-1, progress=None, bint vocab_only=False,
                  tensor_split=(), int n_expert_used=0):
        self._model = NULL
        path = os.fspath(path)
        if not isinstance(path, str):
            path = os.fsdecode(path)
        self.path = path
        if not os.path.exists(path):
            raise errors.ModelNotFoundError(f"model file not found: {path}")
        if not os.path.isfile(path):
            raise errors.InvalidModelError(f"model path is not a file: {path}")
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise errors.InvalidModelError(
                f"{path} is not a GGUF file (starts with {magic!r}, expected b'GGUF')")
        if progress is not None and not callable(progress):
            raise errors.InvalidRequestError("progress must be callable")

        cdef L.llama_model_params params = L.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        # an MoE's experts per token, set at load: llama.cpp builds it into every graph, so
        # it cannot change between decodes (the array ends with an empty key)
        cdef L.llama_model_kv_override overrides[2]
        self._n_expert_used = 0
        if n_expert_used:
            key = _checked_experts_used(path, n_expert_used)
            memset(overrides, 0, sizeof(overrides))
            overrides[0].tag = L.LLAMA_KV_OVERRIDE_TYPE_INT
            strncpy(overrides[0].key, key, 127)
            overrides[0].val_i64 = n_expert_used
            params.kv_overrides = overrides
            self._n_expert_used = n_expert_used
        params.vocab_only = vocab_only
        # each device's share of the offloaded layers, in llama.cpp's order (RPC workers,
        # then GPUs); the rest of the array zero
        cdef size_t n_dev = L.llama_max_devices()
        split = np.zeros(n_dev, dtype=np.float32)
        if len(tensor_split) > <Py_ssize_t>n_dev:
            raise errors.InvalidRequestError(f"tensor_split has more than {n_dev} shares")
        split[:len(tensor_split)] = tensor_split
        if (split < 0).any() or not np.isfinite(split).all():
            raise errors.InvalidRequestError("tensor_split shares must be finite and >= 0")
        cdef float[::1] split_view = split
        if len(tensor_split):
            params.tensor_split = &split_view[0]
        if progress is not None:
            self._progress = progress
            params.progress_callback = _on_progress
            params.progress_callback_user_data = <void *>self
        cdef bytes bpath = os.fsencode(path)
        cdef const char * cpath = bpath
        log_clear_problem()
        with nogil:
            self._model = L.llama_model_load_from_file(cpath, params)
        self._progress = None
        if self._model == NULL:
            if self._progress_error is not None:
                exc, self._progress_error = self._progress_error, None
                raise exc
            raise errors.InvalidModelError(f"{path}: {_load_problem(_last_problem())}")
        self.vocab_only = vocab_only
        # where every layer runs on a GPU (all offloaded, a GPU present) the CPU's part of a
        # decode is a few small operations: those decode on their caller's thread
        self.layers_on_cpu = not (_has_gpu() and (
            n_gpu_layers < 0 or n_gpu_layers > L.llama_model_n_layer(self._model)))
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab = L.llama_vocab_n_tokens(self._vocab)
        _live["model"] += 1

    def __dealloc__(self):
        self._free()

    cdef void _free(self) noexcept:
        if self._model != NULL:
            L.llama_model_free(self._model)
            self._model = NULL
            _live["model"] -= 1

    cdef void _release_context(self) noexcept:
        self._n_contexts -= 1
        if self._closing and self._n_contexts == 0:
            self._free()

    def close(self):
        """Frees the weights now, or as soon as the last context on them is freed.
        Idempotent; the model is unusable from here on either way."""
        self._closing = True
        if self._n_contexts == 0:
            self._free()

    @property
    def closed(self):
        return self._closing or self._model == NULL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    cdef int _check_open(self) except -1:
        if self._closing or self._model == NULL:
            raise errors.ClosedError("model is closed")
        return 0

    cdef int _check_token(self, long token) except -1:
        if token < 0 or token >= self.n_vocab:
            raise errors.InvalidTokenError(
                f"token id {token} is outside the vocabulary [0, {self.n_vocab})")
        return 0

    # metadata the scheduler needs ---------------------------------------------------------

    def meta(self, str key):
        """A GGUF metadata value as a string, or None when the key is absent."""
        self._check_open()
        cdef char buf[512]
        cdef bytes bkey = key.encode()
        cdef int n = L.llama_model_meta_val_str(self._model, bkey, buf, sizeof(buf))
        if n < 0:
            return None
        if n >= <int>sizeof(buf):
            big = bytearray(n + 1)
            L.llama_model_meta_val_str(self._model, bkey, <char *>big, n + 1)
            return bytes(big[:n]).decode(errors="replace")
        return buf[:n].decode(errors="replace")

    def _meta_int(self, str key):
        value = self.meta(key)
        return int(value) if value not in (None, "") else 0

    @property
    def architecture(self):
        return self.meta("general.architecture") or ""

    @property
    def description(self):
        self._check_open()
        cdef char buf[256]
        cdef int n = L.llama_model_desc(self._model, buf, sizeof(buf))
        return buf[:max(n, 0)].decode(errors="replace")

    @property
    def n_params(self):
        self._check_open()
        return L.llama_model_n_params(self._model)

    @property
    def size_bytes(self):
        """Bytes of weight tensors (what a dense decode step reads)."""
        self._check_open()
        return L.llama_model_size(self._model)

    @property
    def n_layer(self):
        self._check_open()
        return L.llama_model_n_layer(self._model)

    @property
    def n_embd(self):
        self._check_open()
        return L.llama_model_n_embd(self._model)

    @property
    def n_head(self):
        self._check_open()
        # llama.cpp aborts the process when asked for layer 0 of a model without layers.
        return L.llama_model_n_head(self._model) if self.n_layer > 0 else 0

    @property
    def n_head_kv(self):
        self._check_open()
        return L.llama_model_n_head_kv(self._model) if self.n_layer > 0 else 0

    @property
    def n_ctx_train(self):
        self._check_open()
        return L.llama_model_n_ctx_train(self._model)

    @property
    def n_expert(self):
        """Experts per MoE layer; 0 for a dense model."""
        return self._meta_int(f"{self.architecture}.expert_count")

    @property
    def n_expert_used(self):
        """Experts each token is routed to (as loaded: the file's, or n_expert_used given);
        0 for a dense model."""
        if self._n_expert_used:
            self._check_open()
            return self._n_expert_used
        return self._meta_int(f"{self.architecture}.expert_used_count")

    def info(self):
        """Everything above as a plain dict."""
        return {
            "path": self.path, "architecture": self.architecture,
            "description": self.description, "n_params": self.n_params,
            "size_bytes": self.size_bytes, "n_layer": self.n_layer, "n_embd": self.n_embd,
            "n_head": self.n_head, "n_head_kv": self.n_head_kv, "n_vocab": self.n_vocab,
            "n_ctx_train": self.n_ctx_train, "n_expert": self.n_expert,
            "n_expert_used": self.n_expert_used, "name": self.meta("general.name"),
        }

    # special tokens -------------------------------------------------------------------------

    @property
    def bos(self):
        self._check_open()
        return L.llama_vocab_bos(self._vocab)

    @property
    def eos(self):
        self._check_open()
        return L.llama_vocab_eos(self._vocab)

    @property
    def eot(self):
        self._check_open()
        return L.llama_vocab_eot(self._vocab)

    @property
    def add_bos(self):
        self._check_open()
        return L.llama_vocab_get_add_bos(self._vocab)

    @property
    def fim_tokens(self):
        """The fill-in-the-middle tokens of the vocabulary, by role (pre, suf, mid, pad, rep,
        sep); -1 for each the model lacks."""
        self._check_open()
        v = self._vocab
        return {"pre": L.llama_vocab_fim_pre(v), "suf": L.llama_vocab_fim_suf(v),
                "mid": L.llama_vocab_fim_mid(v), "pad": L.llama_vocab_fim_pad(v),
                "rep": L.llama_vocab_fim_rep(v), "sep": L.llama_vocab_fim_sep(v)}

    def is_eog(self, int token):
        """True for end-of-generation tokens (EOS, EOT and the like)."""
        self._check_open()
        self._check_token(token)
        return L.llama_vocab_is_eog(self._vocab, token)

    def eog_tokens(self):
        """Every end-of-generation token id, as a sorted int32 array."""
        self._check_open()
        cdef int i
        return np.array([i for i in range(self.n_vocab) if L.llama_vocab_is_eog(self._vocab, i)],
                        dtype=np.int32)

    # text ----------------------------------------------------------------------------------

    def tokenize(self, text, *, bint add_special=True, bint parse_special=False):
        """Text (str or UTF-8 bytes) to an int32 array of token ids."""
        self._check_open()
        cdef bytes data
        try:
            data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        except UnicodeEncodeError as exc:
            raise errors.InvalidRequestError(
                f"text is not valid Unicode: a lone surrogate at character {exc.start}") from None
        if len(data) > 0x7FFFFFF0:
            raise errors.InvalidRequestError("text is too long to tokenize (over 2 GiB)")
        cdef int32_t n_text = <int32_t>len(data)
        cdef const char * ctext = data
        out = np.empty(n_text + 8, dtype=np.int32)
        cdef int32_t[::1] view = out
        cdef int32_t n = self._tokenize(ctext, n_text, &view[0], <int32_t>view.shape[0],
                                        add_special, parse_special)
        if n < 0:
            if n == -2147483648:
                raise errors.InvalidRequestError("tokenization overflowed int32")
            out = np.empty(-n, dtype=np.int32)
            view = out
            n = self._tokenize(ctext, n_text, &view[0], <int32_t>view.shape[0], add_special,
                               parse_special)
            if n < 0:
                raise errors.UmaError("tokenizer returned an inconsistent size")
        return out[:n]

    cdef int32_t _tokenize(self, const char * text, int32_t n_text, int32_t * tokens,
                           int32_t n_max, cbool add_special, cbool parse_special) except? -1:
        """llama_tokenize with the GIL released; a long text on a thread whose stack fits it
        (csrc/tokenize.hpp: a regex pre-tokenizer recurses once per character)."""
        cdef int32_t n
        cdef size_t stack = (<size_t>8 << 20) + <size_t>n_text * 1024
        if n_text < kBigStackBytes:
            with nogil:
                n = L.llama_tokenize(self._vocab, text, n_text, tokens, n_max, add_special,
                                     parse_special)
            return n
        with nogil:
            n = tokenize_on_stack(self._vocab, text, n_text, tokens, n_max, add_special,
                                  parse_special, stack)
        if n == -2147483647:
            raise errors.InvalidRequestError(
                f"text of {n_text} bytes is too long to tokenize here (no stack for it)")
        return n

    def tokenizer_addresses(self):
        """(the llama_vocab's address, llama_tokenize's address): for a grammar engine that
        tokenises through llama.cpp itself (llguidance's LLTokenizer.from_llamacpp). Valid
        while the model is open."""
        self._check_open()
        return <size_t>self._vocab, <size_t><void *>L.llama_tokenize

    def vocab_pieces(self):
        """Every token's bytes (special tokens as their text) and whether it is a control
        token: (list of bytes, bool array), for grammar engines that build token masks."""
        self._check_open()
        cdef int n = self.n_vocab
        control = np.zeros(n, dtype=bool)
        pieces = [self.token_to_piece(t, special=True) for t in range(n)]
        cdef int t, attr
        for t in range(n):
            attr = L.llama_vocab_get_attr(self._vocab, t)
            control[t] = (attr & 8) != 0  # LLAMA_TOKEN_ATTR_CONTROL
        return pieces, control

    def token_to_piece(self, int token, *, bint special=False):
        """The bytes of one token. A piece may be part of a UTF-8 character."""
        self._check_open()
        self._check_token(token)
        cdef char buf[64]
        cdef int n = L.llama_token_to_piece(self._vocab, token, buf, sizeof(buf), 0, special)
        if n >= 0:
            return buf[:n]
        big = bytearray(-n)
        n = L.llama_token_to_piece(self._vocab, token, <char *>big, len(big), 0, special)
        return bytes(big[:n])

    def detokenize(self, tokens, *, bint remove_special=False, bint unparse_special=False):
        """Token ids to text. Bytes that do not form valid UTF-8 become U+FFFD."""
        self._check_open()
        cdef int32_t[::1] toks = self._token_array(tokens)
        cdef int32_t n_tok = <int32_t>toks.shape[0]
        if n_tok == 0:
            return ""
        cdef int32_t cap = n_tok * 8 + 16
        cdef bytearray buf = bytearray(cap)
        cdef char * cbuf = buf
        cdef int32_t n
        with nogil:
            n = L.llama_detokenize(self._vocab, &toks[0], n_tok, cbuf, cap,
                                   remove_special, unparse_special)
        if n < 0:
            cap = -n
            buf = bytearray(cap)
            cbuf = buf
            with nogil:
                n = L.llama_detokenize(self._vocab, &toks[0], n_tok, cbuf, cap,
                                       remove_special, unparse_special)
        return bytes(buf[:max(n, 0)]).decode("utf-8", errors="replace")

    def _token_array(self, tokens):
        return token_ids.checked(tokens, self.n_vocab)

    @property
    def chat_template(self):
        """The model's chat template (a Jinja string), or None if it has none."""
        self._check_open()
        cdef const char * tmpl = L.llama_model_chat_template(self._model, NULL)
        return None if tmpl == NULL else (<bytes>tmpl).decode(errors="replace")

    def apply_chat_template(self, messages, *, bint add_assistant=True, template=None):
        """Renders [{'role': ..., 'content': ...}, ...] with the model's template (or the
        given one) through llama.cpp's built-in template engine."""
        self._check_open()
        tmpl = template if template is not None else self.chat_template
        if tmpl is None:
            raise errors.NoChatTemplateError(
                "the model has no chat template; pass template= (e.g. 'chatml')")
        if not isinstance(messages, (list, tuple)) or not messages:
            raise errors.InvalidRequestError("messages must be a non-empty list")
        encoded = []
        total = 0
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) \
                    or not isinstance(m.get("content"), str):
                raise errors.InvalidRequestError(
                    f"messages[{i}] must be a dict with string 'role' and 'content'")
            role, content = m["role"].encode(), m["content"].encode()
            if b"\0" in role or b"\0" in content:
                raise errors.InvalidRequestError(f"messages[{i}] contains a NUL character")
            encoded.append((role, content))
            total += len(role) + len(content)
        cdef size_t n_msg = len(encoded)
        cdef L.llama_chat_message * chat = <L.llama_chat_message *>malloc(
            n_msg * sizeof(L.llama_chat_message))
        if chat == NULL:
            raise MemoryError()
        cdef bytes btmpl = tmpl.encode()
        cdef int32_t cap = <int32_t>(2 * total + 1024)
        cdef bytearray buf = bytearray(cap)
        cdef int32_t n
        cdef size_t i_msg
        try:
            for i_msg in range(n_msg):
                chat[i_msg].role = PyBytes_AS_STRING(encoded[i_msg][0])
                chat[i_msg].content = PyBytes_AS_STRING(encoded[i_msg][1])
            n = L.llama_chat_apply_template(btmpl, chat, n_msg, add_assistant, <char *>buf, cap)
            if n > cap:
                cap = n
                buf = bytearray(cap)
                n = L.llama_chat_apply_template(btmpl, chat, n_msg, add_assistant,
                                                <char *>buf, cap)
        finally:
            free(chat)
        if n < 0:
            raise errors.InvalidRequestError(
                "llama.cpp does not support this chat template (it knows the common built-in "
                "ones; see llama_chat_builtin_templates)")
        return bytes(buf[:n]).decode("utf-8", errors="replace")


# --- Batch -------------------------------------------------------------------------------------

cdef class Batch:
    """A preallocated llama_batch of up to `capacity` tokens, one sequence per token.

    Rows are appended in C loops from int32 arrays; which rows produce logits is recorded so
    logits row k belongs to `output_seqs()[k]` after the decode.
    """

    def __cinit__(self, int capacity):
        if capacity <= 0:
            raise errors.InvalidRequestError(f"batch capacity must be positive, not {capacity}")
        self._batch = L.llama_batch_init(capacity, 0, 1)
        if self._batch.token == NULL:
            raise MemoryError()
        self.capacity = capacity
        self.n_outputs = 0
        _live["batch"] += 1

    def __dealloc__(self):
        self.close()

    def close(self):
        """Frees the arrays. Idempotent; a closed batch holds nothing."""
        if self._batch.token != NULL:
            L.llama_batch_free(self._batch)
            self._batch.token = NULL
            self._batch.n_tokens = 0
            self.capacity = 0
            self.n_outputs = 0
            _live["batch"] -= 1

    @property
    def n_tokens(self):
        return self._batch.n_tokens

    def __len__(self):
        return self._batch.n_tokens

    def clear(self):
        self._batch.n_tokens = 0
        self.n_outputs = 0

    cdef void _put(self, int i, int32_t token, int32_t pos, int32_t seq,
                   bint out) noexcept nogil:
        self._batch.token[i] = token
        self._batch.pos[i] = pos
        self._batch.n_seq_id[i] = 1
        self._batch.seq_id[i][0] = seq
        self._batch.logits[i] = out

    def _reserve(self, Py_ssize_t n):
        if self._batch.token == NULL:
            raise errors.ClosedError("batch is closed")
        if self._batch.n_tokens + n > self.capacity:
            raise errors.BatchFullError(
                f"batch holds {self.capacity} tokens; {self._batch.n_tokens} used, "
                f"{n} more requested")

    def add(self, int token, int pos, int seq_id, bint logits=False):
        """Appends one token."""
        self._reserve(1)
        self._put(self._batch.n_tokens, token, pos, seq_id, logits)
        self._batch.n_tokens += 1
        self.n_outputs += logits

    def add_sequence(self, const int32_t[::1] tokens, int pos0, int seq_id, *,
                     bint logits_last=True):
        """Appends a run of one sequence's tokens at positions pos0, pos0+1, ...; only the last
        produces logits when logits_last (a prompt chunk)."""
        cdef Py_ssize_t n = tokens.shape[0]
        if n == 0:
            return
        self._reserve(n)
        cdef int base = self._batch.n_tokens
        cdef Py_ssize_t i
        with nogil:
            for i in range(n):
                self._put(base + i, tokens[i], pos0 + i, seq_id, False)
            if logits_last:
                self._batch.logits[base + n - 1] = True
        self._batch.n_tokens += n
        self.n_outputs += logits_last

    def add_rows(self, const int32_t[::1] tokens, const int32_t[::1] pos,
                 const int32_t[::1] seq_ids, *, bint logits=True):
        """Appends one token for each of several sequences (a decode step), each producing
        logits by default."""
        cdef Py_ssize_t n = tokens.shape[0]
        if pos.shape[0] != n or seq_ids.shape[0] != n:
            raise errors.InvalidRequestError("tokens, pos and seq_ids must have the same length")
        if n == 0:
            return
        self._reserve(n)
        cdef int base = self._batch.n_tokens
        cdef Py_ssize_t i
        with nogil:
            for i in range(n):
                self._put(base + i, tokens[i], pos[i], seq_ids[i], logits)
        self._batch.n_tokens += n
        if logits:
            self.n_outputs += n

    def output_seqs(self):
        """Sequence id of each logits row, in row order."""
        out = np.empty(self.n_outputs, dtype=np.int32)
        cdef int32_t[::1] view = out
        cdef int i, k = 0
        for i in range(self._batch.n_tokens):
            if self._batch.logits[i]:
                view[k] = self._batch.seq_id[i][0]
                k += 1
        return out

    cdef object _output_index(self):
        """Batch position of each logits row, in row order (llama.cpp's `i` for a row)."""
        out = np.empty(self.n_outputs, dtype=np.int32)
        cdef int32_t[::1] view = out
        cdef int i, k = 0
        for i in range(self._batch.n_tokens):
            if self._batch.logits[i]:
                view[k] = i
                k += 1
        return out

    def tokens(self):
        """(tokens, positions, seq_ids, logits flags) as copies, for inspection."""
        cdef int i, n = self._batch.n_tokens
        tok = np.empty(n, dtype=np.int32)
        pos = np.empty(n, dtype=np.int32)
        seq = np.empty(n, dtype=np.int32)
        out = np.empty(n, dtype=np.uint8)
        cdef int32_t[::1] tv = tok, pv = pos, sv = seq
        cdef uint8_t[::1] ov = out
        for i in range(n):
            tv[i] = self._batch.token[i]
            pv[i] = self._batch.pos[i]
            sv[i] = self._batch.seq_id[i][0]
            ov[i] = self._batch.logits[i] != 0
        return tok, pos, seq, out.astype(bool)


# --- llama.cpp's own grammar sampler, for comparison ---------------------------------------------

cdef inline double _now() noexcept nogil:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return t.tv_sec + t.tv_nsec * 1e-9


def llama_grammar_steps(Model model not None, str grammar, tokens, logits):
    """Replays `tokens` through llama.cpp's own grammar sampler (GBNF `grammar`, rule "root")
    as a constrained request would use it: each step applies the grammar to a fresh copy of
    `logits` (float32, n_vocab) over every token, then accepts the step's token. Returns each
    step's apply time (seconds, float64) and how many tokens it left. For measuring grammar
    engines against each other (benches/constrained.py); uma.grammar serves requests."""
    model._check_open()
    cdef int n = model.n_vocab
    row = np.ascontiguousarray(logits, dtype=np.float32)
    if row.shape != (n,):
        raise errors.InvalidRequestError(f"logits must hold {n} values")
    toks = np.ascontiguousarray(tokens, dtype=np.int32)
    cdef L.llama_sampler * smpl = L.llama_sampler_init_grammar(
        model._vocab, grammar.encode(), b"root")
    if smpl == NULL:
        raise errors.InvalidRequestError("llama.cpp could not parse the grammar")
    cdef L.llama_token_data * cands = <L.llama_token_data *>malloc(n * sizeof(L.llama_token_data))
    if cands == NULL:
        L.llama_sampler_free(smpl)
        raise MemoryError()
    times = np.zeros(toks.shape[0], dtype=np.float64)
    left = np.zeros(toks.shape[0], dtype=np.int32)
    cdef const float[::1] rv = row
    cdef const int32_t[::1] tv = toks
    cdef double[::1] times_v = times
    cdef int32_t[::1] left_v = left
    cdef L.llama_token_data_array arr
    cdef int step, i, kept
    cdef int refused = -1
    cdef double t0
    try:
        with nogil:
            for step in range(tv.shape[0]):
                if tv[step] < 0 or tv[step] >= n:
                    refused = step
                    break
                t0 = _now()
                for i in range(n):
                    cands[i].id = i
                    cands[i].logit = rv[i]
                    cands[i].p = 0.0
                arr.data = cands
                arr.size = n
                arr.selected = -1
                arr.sorted = False
                L.llama_sampler_apply(smpl, &arr)
                times_v[step] = _now() - t0
                kept = 0
                for i in range(<int>arr.size):
                    if arr.data[i].logit > -1e30:
                        kept += 1
                left_v[step] = kept
                # accepting a token the grammar left out throws inside llama.cpp (and would
                # abort the process): stop before it
                if not cands[tv[step]].logit > -1e30:
                    refused = step
                    break
                L.llama_sampler_accept(smpl, tv[step])
    finally:
        free(cands)
        L.llama_sampler_free(smpl)
    if refused >= 0:
        raise errors.InvalidRequestError(f"the grammar refuses token {refused} of the sequence")
    return times, left


# --- zero-copy logits --------------------------------------------------------------------------

@cython.no_gc_clear
cdef class _LogitsBuffer:
    """Exports llama.cpp's logits rows through the buffer protocol without copying.

    While any export is alive the context refuses to decode (the memory would be overwritten),
    so a view can never show stale or foreign data."""

    cdef Context ctx
    cdef Py_ssize_t shape[2]
    cdef Py_ssize_t strides[2]

    def __getbuffer__(self, Py_buffer * view, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("logits views are read-only")
        cdef const float * data = self.ctx._logits()
        self.shape[0] = self.ctx._n_outputs
        self.shape[1] = self.ctx.model.n_vocab
        self.strides[1] = sizeof(float)
        self.strides[0] = self.shape[1] * sizeof(float)
        view.buf = <void *>data
        view.obj = self
        view.len = self.shape[0] * self.shape[1] * sizeof(float)
        view.readonly = 1
        view.itemsize = sizeof(float)
        view.format = NULL
        if flags & PyBUF_FORMAT:
            view.format = b"f"
        view.ndim = 2
        view.shape = NULL
        view.strides = NULL
        if flags & PyBUF_ND:
            view.shape = self.shape
        if flags & PyBUF_STRIDES:
            view.strides = self.strides
        view.suboffsets = NULL
        view.internal = NULL
        self.ctx._exports += 1

    def __releasebuffer__(self, Py_buffer * view):
        self.ctx._exports -= 1
        self.ctx._free_if_idle()


# --- Context -----------------------------------------------------------------------------------

@cython.no_gc_clear
cdef class Context:
    """One llama.cpp context (KV cache + compute buffers) over a Model.

    Not thread-safe: one thread drives a context at a time (uma.Engine's compute thread)."""

    def __cinit__(self, Model model not None, *, int n_ctx=4096, int n_batch=512,
                  n_ubatch=None, int n_seq_max=1, bint kv_unified=True, str type_k="f16",
                  str type_v="f16", str flash_attn="auto", n_threads=None,
                  n_threads_batch=None, int n_outputs_per_seq=1):
        self._ctx = NULL
        self._chains = NULL
        model._check_open()
        if model.vocab_only:
            raise errors.InvalidRequestError("a vocab-only model cannot run: load its weights")
        if n_ctx <= 0:
            raise errors.InvalidRequestError(f"n_ctx must be positive, not {n_ctx}")
        if n_batch <= 0:
            raise errors.InvalidRequestError(f"n_batch must be positive, not {n_batch}")
        ubatch = n_batch if n_ubatch is None else n_ubatch
        if not 0 < ubatch <= n_batch:
            raise errors.InvalidRequestError(f"n_ubatch must be in [1, n_batch={n_batch}]")
        _check_n_seq_max(n_seq_max)
        if not 0 < n_outputs_per_seq <= n_batch:
            raise errors.InvalidRequestError(
                f"n_outputs_per_seq must be in [1, n_batch={n_batch}], not {n_outputs_per_seq}")
        for name, value in (("type_k", type_k), ("type_v", type_v)):
            if value not in _KV_TYPES:
                raise errors.InvalidRequestError(
                    f"{name} must be one of {', '.join(_KV_TYPES)}, not {value!r}")
        if flash_attn not in _FLASH_ATTN:
            raise errors.InvalidRequestError("flash_attn must be 'auto', 'on' or 'off'")
        threads, threads_batch = _thread_counts(n_threads, n_threads_batch)

        cdef L.llama_context_params params = L.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = ubatch
        params.n_seq_max = n_seq_max
        # logits rows one sequence may have in a decode that its device sampler samples
        # (a speculating stream's verify rows); 1 keeps the sampling graphs smallest
        params.n_outputs_max_per_seq = n_outputs_per_seq
        self._outputs_per_seq = n_outputs_per_seq
        params.kv_unified = kv_unified
        params.type_k = _KV_TYPES[type_k]
        params.type_v = _KV_TYPES[type_v]
        params.flash_attn_type = _FLASH_ATTN[flash_attn]
        params.n_threads = threads
        params.n_threads_batch = threads_batch
        params.no_perf = True
        self._abort = 0
        params.abort_callback = _should_abort
        params.abort_callback_data = <void *>&self._abort
        log_clear_problem()
        with nogil:
            self._ctx = L.llama_init_from_model(model._model, params)
        if self._ctx == NULL:
            raise errors.UmaError(f"llama.cpp could not create the context: {_last_problem()}")
        self.model = model
        model._n_contexts += 1
        self._output_seqs = np.empty(0, dtype=np.int32)
        _live["context"] += 1
        self._chains = <L.llama_sampler **>calloc(n_seq_max, sizeof(L.llama_sampler *))
        if self._chains == NULL:
            raise MemoryError()
        self._chain_keys = [None] * n_seq_max

    def __dealloc__(self):
        self._free()

    cdef void _free(self) noexcept:
        cdef int i
        if self._ctx != NULL:
            L.llama_free(self._ctx)
            self._ctx = NULL
            _live["context"] -= 1
            self.model._release_context()
        if self._chains != NULL:  # after the context: it uses them to the end
            for i in range(len(self._chain_keys)):
                if self._chains[i] != NULL:
                    L.llama_sampler_free(self._chains[i])
            free(self._chains)
            self._chains = NULL

    cdef void _free_if_idle(self) noexcept:
        if self._closing and self._exports == 0 and not self._sampling:
            self._free()

    def close(self):
        """Frees the KV cache and buffers now, or, while logits views or a sampler job still
        use the logits memory, as soon as they are done. Idempotent."""
        self._closing = True
        self._free_if_idle()

    @property
    def closed(self):
        return self._closing or self._ctx == NULL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    cdef int _check_open(self) except -1:
        if self._closing or self._ctx == NULL:
            raise errors.ClosedError("context is closed")
        return 0

    cdef int _check_seq(self, long seq_id) except -1:
        cdef long n = L.llama_n_seq_max(self._ctx)
        if seq_id < 0 or seq_id >= n:
            raise errors.InvalidRequestError(f"seq_id {seq_id} is outside [0, {n})")
        return 0

    # sizes -----------------------------------------------------------------------------------

    @property
    def n_ctx(self):
        self._check_open()
        return L.llama_n_ctx(self._ctx)

    @property
    def n_ctx_seq(self):
        """Positions one sequence may use."""
        self._check_open()
        return L.llama_n_ctx_seq(self._ctx)

    @property
    def n_batch(self):
        self._check_open()
        return L.llama_n_batch(self._ctx)

    @property
    def n_ubatch(self):
        self._check_open()
        return L.llama_n_ubatch(self._ctx)

    @property
    def n_outputs_per_seq(self):
        """Logits rows one device-sampled sequence may have in a decode."""
        return self._outputs_per_seq

    @property
    def n_seq_max(self):
        self._check_open()
        return L.llama_n_seq_max(self._ctx)

    @property
    def n_threads(self):
        self._check_open()
        return (L.llama_n_threads(self._ctx), L.llama_n_threads_batch(self._ctx))

    @property
    def graphs_reused(self):
        """Micro-batches since the context opened that ran the compute graph of the one before
        (llama.cpp builds and allocates none when the shape is unchanged). A steady decode should
        reuse nearly every graph; one that does not pays the graph's construction each tick."""
        self._check_open()
        return L.llama_perf_context(self._ctx).n_reused

    def set_threads(self, int n_threads, int n_threads_batch):
        self._check_open()
        if n_threads <= 0 or n_threads_batch <= 0:
            raise errors.InvalidRequestError("thread counts must be positive")
        L.llama_set_n_threads(self._ctx, n_threads, n_threads_batch)

    def abort(self, bint on=True):
        """Makes decodes end early with DecodeAbortedError until abort(False); a decode already
        running on another thread stops at its next graph node (CPU backend), and llama.cpp
        removes what its unfinished micro-batch added to the cache. For shutting down: a long
        prompt's decode can take a minute on a CPU. The one method safe from any thread."""
        self._abort = 1 if on else 0

    # decode ----------------------------------------------------------------------------------

    cdef int _validate(self, Batch batch) except -1:
        cdef int n = batch._batch.n_tokens
        cdef int32_t n_vocab = self.model.n_vocab
        cdef int32_t n_seq = L.llama_n_seq_max(self._ctx)
        cdef int32_t n_pos = L.llama_n_ctx_seq(self._ctx)
        cdef int i, bad = -1, kind = 0
        if n == 0:
            raise errors.InvalidRequestError("cannot decode an empty batch")
        if n > <int>L.llama_n_batch(self._ctx):
            raise errors.BatchFullError(
                f"batch has {n} tokens; the context's n_batch is {L.llama_n_batch(self._ctx)}")
        with nogil:
            for i in range(n):
                if batch._batch.token[i] < 0 or batch._batch.token[i] >= n_vocab:
                    kind = 1
                elif batch._batch.seq_id[i][0] < 0 or batch._batch.seq_id[i][0] >= n_seq:
                    kind = 2
                elif batch._batch.pos[i] < 0 or batch._batch.pos[i] >= n_pos:
                    kind = 3
                if kind:
                    bad = i
                    break
        if kind == 1:
            self.model._check_token(batch._batch.token[bad])
        elif kind == 2:
            self._check_seq(batch._batch.seq_id[bad][0])
        elif kind == 3:
            raise errors.ContextOverflowError(
                f"position {batch._batch.pos[bad]} of sequence {batch._batch.seq_id[bad][0]} "
                f"is outside the context window of {n_pos} tokens per sequence")
        return 0

    def decode(self, Batch batch not None):
        """Runs the model over the batch (GIL released). Returns the number of logits rows.

        Raises NoKVSlotError when the KV cache has no room (the cache is unchanged: shrink
        the batch or free a sequence and retry)."""
        self._check_open()
        if self._exports:
            raise errors.LogitsInUseError(
                "a logits view from the previous decode is still alive; drop it or copy it "
                "(numpy.array(view)) before decoding again")
        if self._sampling:
            raise errors.UmaError("sampling of the previous logits is in flight; wait() first")
        self._validate(batch)
        cdef int rc
        cdef timespec t0, t1
        cdef char problem[1024]
        cdef bint on_cpu = self.model.layers_on_cpu
        with nogil:
            clock_gettime(CLOCK_MONOTONIC, &t0)
            rc = native_decode(self._ctx, batch._batch, on_cpu, problem, sizeof(problem))
            clock_gettime(CLOCK_MONOTONIC, &t1)
        self._decode_ns = (t1.tv_sec - t0.tv_sec) * 1000000000 + (t1.tv_nsec - t0.tv_nsec)
        if rc != 0:
            self._n_outputs = 0
            raise errors.decode_error(rc, _problem_text(problem))
        self._n_outputs = batch.n_outputs
        self._output_seqs = batch.output_seqs()
        if self._n_chains:
            self._output_index = batch._output_index()
        return self._n_outputs

    @property
    def last_decode_seconds(self):
        """Time llama_decode itself took in the last decode (without reacquiring the GIL)."""
        return self._decode_ns / 1e9

    @property
    def n_outputs(self):
        """Logits rows produced by the last decode."""
        return self._n_outputs

    @property
    def output_seqs(self):
        """Sequence id of each logits row of the last decode."""
        return self._output_seqs

    cdef const float * _logits(self) except NULL:
        self._check_open()
        if self._n_outputs == 0:
            raise errors.UmaError("no logits: the last decode produced none")
        cdef const float * data = L.llama_get_logits(self._ctx)
        if data == NULL:
            raise errors.UmaError("llama.cpp returned no logits buffer")
        return data

    def logits(self):
        """The last decode's logits as a read-only float32 array (n_outputs, n_vocab) that views
        llama.cpp's own buffer: nothing is copied. Row k belongs to output_seqs[k]. The next
        decode refuses to run while the array (or any view of it) is alive."""
        self._logits()  # raise here: numpy would turn a failing buffer into an object array
        cdef _LogitsBuffer buf = _LogitsBuffer()
        buf.ctx = self
        return np.asarray(buf)

    def logits_address(self):
        """Address of llama.cpp's logits buffer, for checking that views do not copy."""
        return <size_t>self._logits()

    # sampling on the device --------------------------------------------------------------------

    def set_sampler(self, int seq_id, *, float temperature=0.0, int top_k=0, float top_p=1.0,
                    float min_p=0.0, seed=0):
        """Samples seq_id's logits rows on the device from the next decode on (llama.cpp's
        backend sampling): the rows never reach the host, sampled_tokens() has the tokens.
        temperature <= 0 is greedy (an arg-max in the graph); otherwise temperature, top-k,
        top-p and min-p filter in that order, as the host Sampler does, and a seeded draw
        picks (reproducible, though not the host's draw for the same seed). Returns False where
        the backend cannot run the chain: the sequence's rows then keep their logits.

        Changing a sequence's chain makes the next decode re-plan its compute graph, so the
        same parameters again keep the chain and only restart its draws from the seed: keep
        chains on sequences across requests."""
        self._check_open()
        self._check_seq(seq_id)
        check_sampling(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                       repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0,
                       penalty_last_n=0, seed=seed)
        greedy = temperature < _GREEDY_BELOW
        if top_k >= self.model.n_vocab:  # keeps every token; ggml_top_k needs k <= n
            top_k = 0
        # The device's min-p keeps logits strictly above max + log(min_p) (ggml_step): at 1
        # that drops the best token too. 1 - 1e-4 stays clear of float32 rounding at logits
        # up to ~100 and keeps what the host keeps but for tokens 0.01 % less likely.
        min_p = min(min_p, 0.9999)
        key = ("greedy",) if greedy else (temperature, top_k, top_p, min_p, seed)
        if self._chain_keys[seq_id] == key:
            L.llama_sampler_reset(self._chains[seq_id])  # host state only: no graph change
            return True
        cdef uint64_t s64 = <uint64_t>(seed & 0xFFFFFFFFFFFFFFFF)
        cdef uint32_t s32 = <uint32_t>((s64 ^ (s64 >> 32)) & 0xFFFFFFFF)
        if s32 == 0xFFFFFFFF:  # LLAMA_DEFAULT_SEED: llama.cpp would draw a random seed
            s32 = 0xFFFFFFFE
        cdef L.llama_sampler * chain = L.llama_sampler_chain_init(
            L.llama_sampler_chain_default_params())
        if greedy:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
        else:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(temperature))
            if top_k > 0:
                L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(top_k))
            if top_p < 1.0:
                L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(top_p, 1))
            if min_p > 0.0:
                L.llama_sampler_chain_add(chain, L.llama_sampler_init_min_p(min_p, 1))
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(s32))
        cdef bint ok
        with nogil:
            L.llama_synchronize(self._ctx)  # a decode in flight may still use the old chain
            ok = L.llama_set_sampler(self._ctx, seq_id, chain)
        self._drop_chain(seq_id)  # llama.cpp let go of it either way
        if not ok:
            L.llama_sampler_free(chain)
            return False
        self._chains[seq_id] = chain
        self._chain_keys[seq_id] = key
        self._n_chains += 1
        return True

    def clear_sampler(self, int seq_id):
        """Hands seq_id's rows back to the host (logits() and the host Sampler)."""
        self._check_open()
        self._check_seq(seq_id)
        if self._chains[seq_id] == NULL:
            return
        with nogil:
            L.llama_synchronize(self._ctx)
            L.llama_set_sampler(self._ctx, seq_id, NULL)
        self._drop_chain(seq_id)

    cdef void _drop_chain(self, int seq_id) noexcept:
        if self._chains[seq_id] != NULL:
            L.llama_sampler_free(self._chains[seq_id])
            self._chains[seq_id] = NULL
            self._n_chains -= 1
        self._chain_keys[seq_id] = None

    def device_sampled(self, int seq_id):
        """Whether seq_id's rows are sampled on the device (set_sampler)."""
        self._check_open()
        self._check_seq(seq_id)
        return self._chains[seq_id] != NULL

    def sampled_tokens(self):
        """The last decode's tokens sampled on the device, one per logits row (int32, -1 for
        rows of sequences without a device sampler). Waits for the device (GIL released)."""
        self._check_open()
        out = np.full(self._n_outputs, -1, dtype=np.int32)
        if not self._n_chains or not self._n_outputs:
            return out
        cdef int32_t[::1] view = out
        cdef const int32_t[::1] index = self._output_index
        cdef int i, n = self._n_outputs
        with nogil:
            for i in range(n):
                view[i] = L.llama_get_sampled_token_ith(self._ctx, index[i])
        return out

    def synchronize(self):
        """Waits for the last decode to finish on the device (GIL released). A decode returns
        once its work is queued on a GPU; reading logits or tokens waits anyway."""
        self._check_open()
        with nogil:
            L.llama_synchronize(self._ctx)

    # per-sequence memory ----------------------------------------------------------------------

    def seq_rm(self, int seq_id, int p0=-1, int p1=-1):
        """Removes positions [p0, p1) of a sequence (-1: open end). Returns False if the
        memory cannot remove a partial range."""
        self._check_open()
        self._check_seq(seq_id)
        return L.llama_memory_seq_rm(L.llama_get_memory(self._ctx), seq_id, p0, p1)

    def seq_cp(self, int src, int dst, int p0=-1, int p1=-1):
        """Shares positions [p0, p1) of src with dst (no copy of the KV data)."""
        self._check_open()
        self._check_seq(src)
        self._check_seq(dst)
        L.llama_memory_seq_cp(L.llama_get_memory(self._ctx), src, dst, p0, p1)

    def seq_keep(self, int seq_id):
        """Removes every sequence but this one."""
        self._check_open()
        self._check_seq(seq_id)
        L.llama_memory_seq_keep(L.llama_get_memory(self._ctx), seq_id)

    def seq_pos_max(self, int seq_id):
        """Largest position held for the sequence, -1 when it is empty."""
        self._check_open()
        self._check_seq(seq_id)
        return L.llama_memory_seq_pos_max(L.llama_get_memory(self._ctx), seq_id)

    def seq_pos_min(self, int seq_id):
        """Smallest position held for the sequence, -1 when it is empty."""
        self._check_open()
        self._check_seq(seq_id)
        return L.llama_memory_seq_pos_min(L.llama_get_memory(self._ctx), seq_id)

    @property
    def kv_span(self):
        """The cells a tick's attention runs over: up to the highest cell in use, whoever
        holds it, padded to 256 as llama.cpp pads it (a model with sliding-window layers: its
        full layers'); -1 where it cannot say (a KV buffer per sequence, a recurrent or hybrid
        model)."""
        self._check_open()
        return native_kv_span(self._ctx)

    def clear(self):
        """Empties the whole KV cache."""
        self._check_open()
        L.llama_memory_clear(L.llama_get_memory(self._ctx), True)

    def seq_state(self, int seq_id):
        """The sequence's KV state as bytes (for save/restore or moving between slots)."""
        self._check_open()
        self._check_seq(seq_id)
        cdef size_t size = L.llama_state_seq_get_size(self._ctx, seq_id)
        data = PyBytes_FromStringAndSize(NULL, size)
        cdef uint8_t * dst = <uint8_t *>PyBytes_AS_STRING(data)
        cdef size_t written
        with nogil:
            written = L.llama_state_seq_get_data(self._ctx, dst, size, seq_id)
        if written != size:
            raise errors.UmaError(f"sequence state copy wrote {written} of {size} bytes")
        return data

    def set_seq_state(self, int seq_id, const uint8_t[::1] data):
        """Restores a state from seq_state() into seq_id (which should be empty)."""
        self._check_open()
        self._check_seq(seq_id)
        if data.shape[0] == 0:
            raise errors.InvalidRequestError("sequence state is empty")
        cdef size_t read
        log_clear_problem()
        with nogil:
            read = L.llama_state_seq_set_data(self._ctx, &data[0], data.shape[0], seq_id)
        if read == 0:
            raise errors.InvalidRequestError(
                f"could not restore the sequence state: {_last_problem() or 'rejected'}")
        return read


# --- llama.cpp's RPC backend ---------------------------------------------------------------------

def rpc_supported():
    """Whether llama.cpp's RPC backend is compiled in (CMake UMA_RPC, on by default)."""
    return rpc_compiled()


def rpc_add_worker(str endpoint not None):
    """Registers the RPC worker at endpoint ('host:port') as devices that models loaded from
    now on put layers on, in this process for good (llama.cpp has no way to drop them).
    Returns their names. ModelLoadError naming the worker when it cannot be reached."""
    if not rpc_compiled():
        raise errors.ModelLoadError("this build has no RPC backend (build with -DUMA_RPC=ON)")
    cdef bytes bend = endpoint.encode()
    cdef const char * cend = bend
    cdef char names[16 * 128]
    cdef int32_t n
    log_clear_problem()
    with nogil:
        n = native_rpc_add_worker(cend, names, 128, 16)
    if n <= 0:
        problem = _last_problem()
        raise errors.ModelLoadError(
            f"cannot reach the RPC worker at {endpoint}"
            + (f": {problem}" if problem else "")
            + " (is `uma rpc-worker` running there, and its port open to this machine?)")
    return tuple((<bytes>names[i * 128:(i + 1) * 128]).split(b"\0", 1)[0].decode()
                 for i in range(min(n, 16)))


def rpc_serve(str endpoint not None, *, int n_threads=0, cache_dir=None):
    """Serves this process's devices (its GPUs, else its CPU) to RPC clients at endpoint
    ('host:port') until the process is killed; the GIL is released meanwhile."""
    if not rpc_compiled():
        raise errors.UmaError("this build has no RPC backend (build with -DUMA_RPC=ON)")
    threads = n_threads if n_threads > 0 else default_threads()
    cdef bytes bend = endpoint.encode()
    cdef bytes bdir = os.fsencode(cache_dir) if cache_dir is not None else b""
    cdef const char * cend = bend
    cdef const char * cdir = NULL
    if cache_dir is not None:
        cdir = bdir
    cdef size_t nt = threads
    with nogil:
        native_rpc_serve(cend, cdir, nt)


def hold_aborts():
    """From now on, a failure that would make ggml abort the process (a lost RPC worker,
    mid-decode) holds the failing thread forever instead; wait_for_abort() tells of it."""
    abort_hold_install()


def wait_for_abort():
    """Blocks until a thread has been held (returns ggml's message; at once if one was) or
    cancel_abort_waits() is called (returns None). The GIL is released meanwhile."""
    cdef char buf[2048]
    cdef cbool held
    with nogil:
        held = native_abort_wait(buf, sizeof(buf))
    return (<bytes>buf).decode(errors="replace") if held else None


def cancel_abort_waits():
    """Ends the wait_for_abort() calls under way."""
    abort_wait_cancel()


def _check_n_seq_max(int n_seq_max):
    max_seq = L.llama_max_parallel_sequences()
    if not 0 < n_seq_max <= max_seq:
        raise errors.InvalidRequestError(f"n_seq_max must be in [1, {max_seq}]")


def _thread_counts(n_threads, n_threads_batch):
    """(threads, batch threads) of a context: default_threads() where not given, the batch
    count the decode count's."""
    threads = n_threads if n_threads is not None else default_threads()
    threads_batch = n_threads_batch if n_threads_batch is not None else threads
    if threads <= 0 or threads_batch <= 0:
        raise errors.InvalidRequestError("thread counts must be positive")
    return threads, threads_batch


def default_threads():
    """Threads llama.cpp should use: the cores this process may run on, at most 16 beyond
    which decode stops scaling and starts fighting the I/O and sampler threads."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return max(1, min(n, 16))


# --- Embedder ----------------------------------------------------------------------------------

_POOLING = {"mean": L.LLAMA_POOLING_TYPE_MEAN, "cls": L.LLAMA_POOLING_TYPE_CLS,
            "last": L.LLAMA_POOLING_TYPE_LAST}
_POOLING_NAMES = {int(v): k for k, v in _POOLING.items()}


cdef L.llama_context * _embeddings_context(Model model,
                                           L.llama_context_params params) except NULL:
    cdef L.llama_context * ctx
    log_clear_problem()
    with nogil:
        ctx = L.llama_init_from_model(model._model, params)
    if ctx == NULL:
        raise errors.UmaError(
            f"llama.cpp could not create the embeddings context: {_last_problem()}")
    return ctx


@cython.no_gc_clear
cdef class Embedder:
    """A second llama.cpp context over a Model, in embeddings mode: each input's hidden states
    pooled into one vector (llama.cpp's pooling: mean, cls or last).

    n_ctx: the most tokens of one decode, and so of one input (a sequence's pooled vector comes
    from one physical batch). pooling 'auto' is the model's own (its GGUF's pooling_type),
    else 'mean'. Inputs share decodes, up to n_seq_max of them. The weights are the Model's:
    the context adds only its KV cache and compute buffers. Not thread-safe.
    """

    def __cinit__(self, Model model not None, *, int n_ctx=2048, str pooling="auto",
                  int n_seq_max=8, n_threads=None):
        self._ctx = NULL
        model._check_open()
        if model.vocab_only:
            raise errors.InvalidRequestError("a vocab-only model cannot run: load its weights")
        if n_ctx <= 0:
            raise errors.InvalidRequestError(f"n_ctx must be positive, not {n_ctx}")
        if pooling != "auto" and pooling not in _POOLING:
            raise errors.InvalidRequestError(
                f"pooling must be 'auto', 'mean', 'cls' or 'last', not {pooling!r}")
        _check_n_seq_max(n_seq_max)
        threads, _ = _thread_counts(n_threads, None)
        cdef L.llama_context_params params = L.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_ctx
        params.n_ubatch = n_ctx
        params.n_seq_max = n_seq_max
        params.kv_unified = True
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        params.embeddings = True
        params.pooling_type = L.LLAMA_POOLING_TYPE_UNSPECIFIED if pooling == "auto" \
            else _POOLING[pooling]
        self._ctx = _embeddings_context(model, params)
        cdef int kind = L.llama_context_pooling(self._ctx)
        if kind not in _POOLING_NAMES:
            # a generative model declares none (or a reranker's 'rank'): mean pooling
            L.llama_free(self._ctx)
            self._ctx = NULL
            params.pooling_type = L.LLAMA_POOLING_TYPE_MEAN
            self._ctx = _embeddings_context(model, params)
            kind = L.llama_context_pooling(self._ctx)
        self._batch = L.llama_batch_init(n_ctx, 0, 1)
        if self._batch.token == NULL:
            self._free()
            raise MemoryError()
        self.model = model
        model._n_contexts += 1
        _live["context"] += 1
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        self.n_embd = L.llama_model_n_embd_out(model._model)
        self.pooling = _POOLING_NAMES[kind]

    def __dealloc__(self):
        self._free()

    cdef void _free(self) noexcept:
        if self._batch.token != NULL:
            L.llama_batch_free(self._batch)
            self._batch.token = NULL
        if self._ctx != NULL:
            L.llama_free(self._ctx)
            self._ctx = NULL
            if self.model is not None:
                _live["context"] -= 1
                self.model._release_context()

    def close(self):
        """Frees the context now. Idempotent."""
        self._free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def embed(self, inputs):
        """The pooled vector of each input (a sequence of token ids, 1 to n_ctx of them), as
        float32 rows (len(inputs), n_embd), not normalised. Inputs are packed into decodes of
        at most n_ctx tokens and n_seq_max inputs; the GIL is released around each."""
        if self._ctx == NULL:
            raise errors.ClosedError("embedder is closed")
        arrays = [self.model._token_array(t) for t in inputs]
        for i, a in enumerate(arrays):
            if not 0 < a.size <= self.n_ctx:
                raise errors.InvalidRequestError(
                    f"input {i} has {a.size} tokens; an input takes 1 to {self.n_ctx}")
        out = np.empty((len(arrays), self.n_embd), dtype=np.float32)
        cdef float[:, ::1] ov = out
        cdef int32_t[::1] tv
        cdef int first = 0, last, k, j, n, pos, rc
        cdef const float * vec
        cdef L.llama_memory_t mem = L.llama_get_memory(self._ctx)
        cdef char problem[1024]
        cdef bint on_cpu = self.model.layers_on_cpu
        lengths = [a.size for a in arrays]
        while first < len(arrays):
            last = _decode_end(lengths, first, self.n_ctx, self.n_seq_max)
            n = 0
            for k in range(last - first):
                tv = arrays[first + k]
                for pos in range(tv.shape[0]):
                    self._batch.token[n] = tv[pos]
                    self._batch.pos[n] = pos
                    self._batch.n_seq_id[n] = 1
                    self._batch.seq_id[n][0] = k
                    self._batch.logits[n] = True  # pooling reads every token's state
                    n += 1
            self._batch.n_tokens = n
            with nogil:
                rc = native_decode(self._ctx, self._batch, on_cpu, problem, sizeof(problem))
            if rc != 0:
                L.llama_memory_clear(mem, True)
                raise errors.DecodeError(
                    f"the embeddings decode failed ({rc}): {_problem_text(problem)}")
            for k in range(last - first):
                vec = L.llama_get_embeddings_seq(self._ctx, k)
                if vec == NULL:
                    L.llama_memory_clear(mem, True)
                    raise errors.UmaError("llama.cpp returned no pooled embedding")
                for j in range(self.n_embd):
                    ov[first + k, j] = vec[j]
            L.llama_memory_clear(mem, True)
            first = last
        return out


# --- Sampler -----------------------------------------------------------------------------------

@cython.no_gc_clear
cdef class Sampler:
    """Samples all rows of a tick in one native call, without the GIL, optionally on the
    sampler's own thread (submit/wait) so Python can work meanwhile.

    Each of n_slots slots holds one sequence's parameters, seeded RNG and penalty history.
    n_threads threads (0: the hardware's count, at most 8) share the rows of a large job.
    """

    def __cinit__(self, int n_slots, int n_vocab, int n_threads=0):
        self._native = NULL
        if n_slots <= 0 or n_vocab <= 0:
            raise errors.InvalidRequestError("n_slots and n_vocab must be positive")
        if n_threads < 0:
            raise errors.InvalidRequestError("n_threads must be >= 0 (0: automatic)")
        self._native = new NativeSampler(n_slots, n_vocab, n_threads)
        _live["sampler"] += 1

    def __dealloc__(self):
        if self._native != NULL:
            with nogil:
                self._native.wait()
            del self._native
            self._native = NULL
            _live["sampler"] -= 1

    def close(self):
        if self._native == NULL:
            return
        self.wait()
        del self._native
        self._native = NULL
        _live["sampler"] -= 1

    @property
    def n_slots(self):
        return self._check().n_slots()

    @property
    def n_vocab(self):
        return self._check().n_vocab()

    cdef NativeSampler * _check(self) except NULL:
        if self._native == NULL:
            raise errors.ClosedError("sampler is closed")
        return self._native

    def _slot(self, slot):
        if not 0 <= slot < self._check().n_slots():
            raise errors.InvalidRequestError(
                f"slot {slot} is outside [0, {self._native.n_slots()})")
        return slot

    def configure(self, int slot, *, float temperature=0.0, int top_k=0, float top_p=1.0,
                  float min_p=0.0, float repeat_penalty=1.0, float frequency_penalty=0.0,
                  float presence_penalty=0.0, int penalty_last_n=64, seed=0, logit_bias=()):
        """Resets a slot for a new sequence. temperature <= 0 is greedy. logit_bias: values
        added to tokens' logits (uma.config.check_logit_bias's forms)."""
        self._slot(slot)
        check_sampling(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                       repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                       presence_penalty=presence_penalty, penalty_last_n=penalty_last_n,
                       seed=seed)
        bias = check_logit_bias(logit_bias, self._native.n_vocab())
        cdef int32_t[::1] bias_ids = np.array([t for t, _ in bias], dtype=np.int32)
        cdef float[::1] bias_values = np.array([v for _, v in bias], dtype=np.float32)
        if self._native.busy():
            raise errors.UmaError("cannot configure while a sampler job is in flight")
        cdef SamplingParams p
        p.temperature = temperature
        p.top_k = top_k
        p.top_p = top_p
        p.min_p = min_p
        p.repeat_penalty = repeat_penalty
        p.frequency_penalty = frequency_penalty
        p.presence_penalty = presence_penalty
        p.penalty_last_n = penalty_last_n
        p.seed = <unsigned long long>(seed & 0xFFFFFFFFFFFFFFFF)
        self._native.configure(slot, p)
        if bias:
            self._native.set_bias(slot, &bias_ids[0], &bias_values[0], <int32_t>len(bias))

    def accept(self, int slot, tokens):
        """Adds tokens (e.g. the prompt) to the slot's penalty history."""
        self._slot(slot)
        cdef int32_t[::1] toks = np.ascontiguousarray(tokens, dtype=np.int32)
        if self._native.busy():
            raise errors.UmaError("cannot accept tokens while a sampler job is in flight")
        if toks.shape[0]:
            self._native.accept(slot, &toks[0], <int32_t>toks.shape[0])

    def _prepare(self, Context ctx, rows, slots, bint logprobs):
        if self._check().busy():
            raise errors.UmaError("a sampler job is already in flight; wait() first")
        cdef const float * data = NULL
        if len(rows):
            data = ctx._logits()
        if ctx.model.n_vocab != self._native.n_vocab():
            raise errors.InvalidRequestError(
                f"sampler n_vocab {self._native.n_vocab()} != model n_vocab {ctx.model.n_vocab}")
        r = np.ascontiguousarray(rows, dtype=np.int32)
        s = np.ascontiguousarray(slots, dtype=np.int32)
        if r.ndim != 1 or r.shape != s.shape:
            raise errors.InvalidRequestError("rows and slots must be 1-D and of equal length")
        if r.size:
            if r.min() < 0 or r.max() >= ctx._n_outputs:
                raise errors.InvalidRequestError(
                    f"logits rows must be in [0, {ctx._n_outputs})")
            if s.min() < 0 or s.max() >= self._native.n_slots():
                raise errors.InvalidRequestError(
                    f"slots must be in [0, {self._native.n_slots()})")
        tokens = np.empty(r.size, dtype=np.int32)
        lp = np.empty(r.size, dtype=np.float32) if logprobs else None
        return r, s, tokens, lp, <size_t>data

    def _masks(self, masks, mask_index, Py_ssize_t n):
        """Checked token masks for n rows: (uint32 (k, words), int32 (n,)), or (None, None)."""
        return check_masks(masks, mask_index, n, self._check().n_vocab())

    cdef SampleJob _job(self, size_t data, r, s, tokens, lp, masks=None, mask_index=None):
        cdef SampleJob job
        cdef int32_t[::1] rv = r
        cdef int32_t[::1] sv = s
        cdef int32_t[::1] tv = tokens
        cdef float[::1] lv
        cdef const uint32_t[:, ::1] mv
        cdef const int32_t[::1] iv
        job.masks = NULL
        job.mask_index = NULL
        job.mask_words = 0
        if masks is not None and rv.shape[0] and masks.shape[0]:
            mv = masks
            iv = mask_index
            job.masks = &mv[0, 0]
            job.mask_index = &iv[0]
            job.mask_words = <int32_t>mv.shape[1]
        job.logits = <const float *>data
        job.n = <int32_t>rv.shape[0]
        job.rows = &rv[0] if job.n else NULL
        job.slots = &sv[0] if job.n else NULL
        job.out_tokens = &tv[0] if job.n else NULL
        job.out_logprobs = NULL
        if lp is not None and job.n:
            lv = lp
            job.out_logprobs = &lv[0]
        return job

    def sample(self, Context ctx not None, rows, slots, *, bint logprobs=False, masks=None,
               mask_index=None):
        """Samples logits rows `rows` of ctx's last decode with slots `slots`, on this thread
        with the GIL released. Returns tokens (int32), or (tokens, logprobs) if asked.
        masks (uint32, (k, ceil(n_vocab / 32))) and mask_index (int32, one per row, -1: none):
        row i samples only tokens whose bit is set in masks[mask_index[i]] (token t: bit
        t % 32 of word t // 32), as constrained decoding asks."""
        r, s, tokens, lp, data = self._prepare(ctx, rows, slots, logprobs)
        m, i = self._masks(masks, mask_index, r.size)
        cdef SampleJob job = self._job(data, r, s, tokens, lp, m, i)
        with nogil:
            self._native.sample(job)
        return (tokens, lp) if logprobs else tokens

    def submit(self, Context ctx not None, rows, slots, *, bint logprobs=False, masks=None,
               mask_index=None):
        """Starts the same work on the sampler thread and returns at once; wait() collects
        it. The context refuses to decode until then."""
        r, s, tokens, lp, data = self._prepare(ctx, rows, slots, logprobs)
        m, i = self._masks(masks, mask_index, r.size)
        cdef SampleJob job = self._job(data, r, s, tokens, lp, m, i)
        self._keep = (r, s, tokens, lp, logprobs, m, i)
        self._inflight = ctx
        ctx._sampling = True
        self._native.submit(job)

    def wait(self):
        """Waits for the submitted job; returns what sample() would have. None if idle."""
        if self._native == NULL:
            return None
        with nogil:
            self._native.wait()
        if self._inflight is None:
            return None
        self._inflight._sampling = False
        self._inflight._free_if_idle()
        self._inflight = None
        r, s, tokens, lp, logprobs, _, _ = self._keep
        self._keep = None
        return (tokens, lp) if logprobs else tokens

    def sample_array(self, logits, slots, *, bint logprobs=False, masks=None,
                     mask_index=None):
        """Samples each row of a float32 array (rows, n_vocab) with the matching slot; for
        logits that did not come from a context (tests, custom processing). masks as for
        sample()."""
        arr = np.ascontiguousarray(logits, dtype=np.float32)
        if arr.ndim != 2 or arr.shape[1] != self._check().n_vocab():
            raise errors.InvalidRequestError(
                f"logits must have shape (rows, {self._native.n_vocab()})")
        if self._native.busy():
            raise errors.UmaError("a sampler job is already in flight; wait() first")
        s = np.ascontiguousarray(slots, dtype=np.int32)
        if s.shape != (arr.shape[0],):
            raise errors.InvalidRequestError("one slot per logits row is required")
        if s.size and (s.min() < 0 or s.max() >= self._native.n_slots()):
            raise errors.InvalidRequestError(f"slots must be in [0, {self._native.n_slots()})")
        r = np.arange(arr.shape[0], dtype=np.int32)
        tokens = np.empty(r.size, dtype=np.int32)
        lp = np.empty(r.size, dtype=np.float32) if logprobs else None
        m, i = self._masks(masks, mask_index, r.size)
        cdef float[:, ::1] view = arr
        cdef size_t data = <size_t>&view[0, 0] if arr.shape[0] else 0
        cdef SampleJob job = self._job(data, r, s, tokens, lp, m, i)
        with nogil:
            self._native.sample(job)
        return (tokens, lp) if logprobs else tokens

    def top_logprobs(self, Context ctx not None, rows, int k):
        """The k most probable tokens of logits rows `rows` of ctx's last decode by the model's
        own distribution (log softmax of the raw logits, before any option or mask of the
        sampler), most probable first: (ids int32 (n, k), logprobs float32 (n, k)). k in
        [1, 20]; GIL released."""
        if not 1 <= k <= _MAX_TOP_LOGPROBS:
            raise errors.InvalidRequestError(f"k must be in [1, {_MAX_TOP_LOGPROBS}], not {k}")
        r, _, _, _, data = self._prepare(ctx, rows, np.zeros(len(rows), np.int32), False)
        return self._top(data, r, k)

    def top_logprobs_array(self, logits, int k):
        """top_logprobs() of each row of a float32 array (rows, n_vocab)."""
        if not 1 <= k <= _MAX_TOP_LOGPROBS:
            raise errors.InvalidRequestError(f"k must be in [1, {_MAX_TOP_LOGPROBS}], not {k}")
        arr = np.ascontiguousarray(logits, dtype=np.float32)
        if arr.ndim != 2 or arr.shape[1] != self._check().n_vocab():
            raise errors.InvalidRequestError(
                f"logits must have shape (rows, {self._native.n_vocab()})")
        cdef float[:, ::1] view = arr
        cdef size_t data = <size_t>&view[0, 0] if arr.shape[0] else 0
        return self._top(data, np.arange(arr.shape[0], dtype=np.int32), k)

    def _top(self, size_t data, r, int k):
        k = min(k, self._native.n_vocab())
        ids = np.empty((r.size, k), dtype=np.int32)
        lps = np.empty((r.size, k), dtype=np.float32)
        if not r.size:
            return ids, lps
        cdef int32_t[::1] rv = r
        cdef int32_t[:, ::1] iv = ids
        cdef float[:, ::1] lv = lps
        cdef const float * logits = <const float *>data
        cdef int32_t n = <int32_t>r.size
        with nogil:
            self._native.top_logprobs(logits, &rv[0], n, k, &iv[0, 0], &lv[0, 0])
        return ids, lps

    def candidates(self, int slot, row):
        """The token ids that survive the slot's filters for this logits row, most probable
        first, and their renormalised probabilities. Does not touch the RNG."""
        self._slot(slot)
        cdef float[::1] view = np.ascontiguousarray(row, dtype=np.float32)
        if view.shape[0] != self._native.n_vocab():
            raise errors.InvalidRequestError(f"row must have {self._native.n_vocab()} logits")
        if self._native.busy():
            raise errors.UmaError("a sampler job is in flight; wait() first")
        ids = np.empty(view.shape[0], dtype=np.int32)
        probs = np.empty(view.shape[0], dtype=np.float32)
        cdef int32_t[::1] iv = ids
        cdef float[::1] pv = probs
        cdef int32_t n
        with nogil:
            n = self._native.candidates(slot, &view[0], &iv[0], &pv[0])
        return ids[:n], probs[:n]
