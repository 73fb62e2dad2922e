"""A pure-Python stand-in for uma._core, for testing the engine without llama.cpp.

    engine = uma.Engine("any.gguf", core=uma.testing.fake_core, n_ctx=512, n_seq_max=4)

It has the surface uma.Engine and its scheduler use (Model, Context, Batch, Sampler, backends)
with the real signatures, validation and errors, and a model that is a deterministic function
instead of a network:

* Vocabulary: N_VOCAB ids. EOS (the one end-of-generation token) and BOS are special, TRIGGER is
  the word "bye", every other id is a short made-up word ("ba", "bane", ...). Text is tokenized
  one token per whitespace-separated word (a BOS first when add_special): vocabulary words map
  to their ids, any other word to a word id by a stable hash, so tokenize(detokenize(ids)) gives
  the ids back for generated text, but not for arbitrary text.
* KV cache: the cells llama.cpp would hold, per sequence and position, with its rules: n_ctx
  rounded up to a multiple of 256; unified (one pool of n_ctx cells) or one stream of n_ctx_seq
  cells per sequence; positions of a sequence must continue from its last one; a batch that
  does not fit raises NoKVSlotError and changes nothing; an aborted or failed decode keeps the
  micro-batches (n_ubatch tokens each) before the one it stopped in.
* Logits: a row depends only on its sequence's tokens up to and including its position (a
  hash chain over (position, token)), never on the sequence id or the rest of the batch, so a
  prompt gives the same greedy tokens alone, batched, or re-prefilled after a preemption. EOS,
  BOS and TRIGGER are never likely, except that from EOG_AFTER positions after a TRIGGER on,
  EOS is by far the most likely token: "... bye" generates EOG_AFTER words, then EOS.
* Sampler: the native sampler's pipeline (penalties, temperature, top-k, top-p, min-p, draw),
  greedy at temperature 0, each slot seeded on its own: a seed gives the same tokens every run.

Test hooks the real core lacks: Context.stall()/resume()/wait_stalled() make decodes block as
a long decode on a slow device would (abort() still ends them), Context.before_decode is called
with each batch on the decoding thread (to keep it in step with a test), Context.failing_tokens
makes decodes of batches holding those ids fail (a DecodeError, as a broken kernel would raise),
and Context.cells_used and Context.n_decodes count cells in use and decodes run. Decoding
costs microseconds, so last_decode_seconds is a made-up time from the batch's shape, not a
measurement.

This module imports neither uma._core nor anything that does.
"""

from __future__ import annotations

import collections
import os
import struct
import threading
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from uma import errors, token_ids
from uma.config import MAX_TOP_LOGPROBS, check_logit_bias, check_masks, check_sampling
from uma.embeddings import decode_end

__all__ = [
    "BOS", "EOG_AFTER", "EOS", "N_VOCAB", "TRIGGER", "Batch", "Context", "Model", "Sampler",
    "backends", "default_threads", "devices", "live_handles", "llama_commit",
    "llama_grammar_steps",
    "set_log_level", "system_info",
]

N_VOCAB = 512
EOS = 0  # "</s>", the end-of-generation token
BOS = 1  # "<s>", put first by tokenize(add_special=True)
TRIGGER = 2  # the word "bye": EOS becomes the likely next token EOG_AFTER positions later
EOG_AFTER = 4
FIRST_WORD = 3  # ids from here on are ordinary words

_SPECIAL = {EOS: "</s>", BOS: "<s>"}
_CONSONANTS = "bdfgklmnprstvz"
_SYLLABLES = [c + v for c in _CONSONANTS for v in "aeiou"]  # 70


def _word(token: int) -> str:
    # One syllable for the first 70 words, two after: short, distinct, pronounceable.
    i = token - FIRST_WORD
    n = len(_SYLLABLES)
    return _SYLLABLES[i % n] + ("" if i < n else _SYLLABLES[(i // n * 31 + 5) % n])


_WORDS = ["</s>", "<s>", "bye"] + [_word(t) for t in range(FIRST_WORD, N_VOCAB)]
_IDS = {w: t for t, w in enumerate(_WORDS) if t >= TRIGGER}
_SPECIAL_IDS = {w: t for t, w in _SPECIAL.items()}

_MASK = (1 << 64) - 1
_SEED = 0x243F6A8885A308D3  # the chain's value before a sequence's first position
_SCALE = 3.0  # logits' spread: a peaked distribution, as a trained model's mostly is
_NEVER = -1e4  # the logit of tokens generation never picks (stays finite when scaled)

_KV_TYPES = ("f32", "f16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "bf16")
_MAX_SEQ = 256  # llama.cpp's LLAMA_MAX_SEQ
_LOG_LEVELS = ("none", "debug", "info", "warn", "error")

# Objects not yet closed, by kind, like uma._core.live_handles(): tests assert they return to
# where they were (nothing leaked).
_live = {"model": 0, "context": 0, "batch": 0, "sampler": 0}
_live_lock = threading.Lock()


def _count(kind: str, delta: int) -> None:
    with _live_lock:
        _live[kind] += delta


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash, the same on every platform."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _int(value) -> int:
    # What Cython's C int arguments accept: integers (numpy ones too), never floats.
    return int(value.__index__())


# --- module functions ----------------------------------------------------------------------


def max_parallel_sequences() -> int:
    return _MAX_SEQ


def rpc_supported() -> bool:
    """No RPC workers for the fake core."""
    return False


def rpc_add_worker(endpoint: str) -> tuple[str, ...]:
    raise errors.ModelLoadError("the fake core has no RPC backend")


def rpc_serve(endpoint: str, *, n_threads: int = 0, cache_dir=None) -> None:
    raise errors.UmaError("the fake core has no RPC backend")


_abort_cond = threading.Condition()
_abort_cancels = 0


def hold_aborts() -> None:
    """Nothing of the fake core aborts."""


def wait_for_abort() -> str | None:
    """Blocks until cancel_abort_waits(): the fake core never aborts."""
    with _abort_cond:
        cancels = _abort_cancels
        _abort_cond.wait_for(lambda: _abort_cancels != cancels)
    return None


def cancel_abort_waits() -> None:
    global _abort_cancels
    with _abort_cond:
        _abort_cancels += 1
        _abort_cond.notify_all()


def backends() -> tuple[str, ...]:
    """('fake',): not ('cpu',), so the engine does not time host memory bandwidth for its
    ΣBMT budget (a few hundred ms) unless the config asks for n_gpu_layers=0."""
    return ("fake",)


def llama_commit() -> str:
    """A fake build's: state it saves is the fake's own."""
    return "fake"


def devices() -> tuple[dict[str, Any], ...]:
    """One GPU-like device, so that the engine takes the fake for a device of its own (no
    bandwidth probe), as backends() says."""
    return ({"name": "Fake0", "description": "fake core (uma.fake_core)", "type": "gpu",
             "backend": "fake", "memory_free": 0, "memory_total": 0},)


def system_info() -> str:
    return "fake core (uma.fake_core): no llama.cpp"


def set_log_level(level: str) -> None:
    if level not in _LOG_LEVELS:
        raise errors.InvalidRequestError(
            f"log level must be one of {', '.join(_LOG_LEVELS)}, not {level!r}")


def live_handles() -> dict[str, int]:
    """Counts of fake objects not yet closed, by kind."""
    with _live_lock:
        return dict(_live)


def decode_thread() -> tuple[int, int]:
    """(decodes run, thread id): the fake core decodes on the caller's thread, and counts none."""
    return 0, 0


def default_threads() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return max(1, min(n, 16))


def llama_grammar_steps(model: Model, grammar: str, tokens, logits):
    """The real core replays tokens through llama.cpp's grammar sampler; there is none here."""
    raise errors.UmaError("the fake core has no llama.cpp grammar sampler")


def _fixed(value, doc: str | None = None) -> property:
    """A read-only model property that, like the real ones, refuses on a closed model."""

    def get(self):
        self._check_open()
        return value

    return property(get, doc=doc)


# --- Model -----------------------------------------------------------------------------------


class Model:
    """A model of N_VOCAB made-up words that reads no file: `path` may be any string.

    progress: optional callable(fraction), called with 0.0 and 1.0; returning False cancels
    the load (ModelLoadError), as with the real core."""

    def __init__(self, path, *, n_gpu_layers: int = -1, progress=None,
                 vocab_only: bool = False, tensor_split=(), n_expert_used: int = 0) -> None:
        self._closed = True  # until constructed: close() of a half-made model does nothing
        path = os.fspath(path)
        self.path = path if isinstance(path, str) else os.fsdecode(path)
        _int(n_gpu_layers)
        if _int(n_expert_used):  # a dense model, as the real core says of one
            raise errors.InvalidRequestError(
                f"experts per token (n_expert_used={n_expert_used}) cannot be set: "
                f"{self.path} is not a mixture of experts")
        if any(not 0 <= float(x) < float("inf") for x in tensor_split):
            raise errors.InvalidRequestError("tensor_split shares must be finite and >= 0")
        if progress is not None and not callable(progress):
            raise errors.InvalidRequestError("progress must be callable")
        if progress is not None:
            for fraction in (0.0, 1.0):
                if progress(fraction) is False:
                    raise errors.ModelLoadError(
                        f"loading {self.path} was cancelled by the progress callback")
        self.vocab_only = bool(vocab_only)
        self.layers_on_cpu = True  # the fake core has no GPU
        self.n_vocab = N_VOCAB
        self._n_contexts = 0
        self._closed = False
        _count("model", 1)

    def close(self) -> None:
        """Idempotent; the model is unusable from here on (contexts on it keep working)."""
        if not self._closed:
            self._closed = True
            _count("model", -1)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise errors.ClosedError("model is closed")

    def _check_token(self, token: int) -> None:
        if token < 0 or token >= self.n_vocab:
            raise errors.InvalidTokenError(
                f"token id {token} is outside the vocabulary [0, {self.n_vocab})")

    # metadata ----------------------------------------------------------------------------

    _META = {"general.architecture": "fake", "general.name": "fake",
             "fake.context_length": "4096", "fake.feed_forward_length": "256"}

    def meta(self, key: str) -> str | None:
        self._check_open()
        return self._META.get(key)

    architecture = property(lambda self: self.meta("general.architecture") or "")
    description = _fixed("fake 2-layer word model")
    n_params = _fixed(2 * N_VOCAB * 64 + 2 * 12 * 64**2)
    size_bytes = _fixed(2 * (2 * N_VOCAB * 64 + 2 * 12 * 64**2), "Bytes of weights (f16).")
    n_layer = _fixed(2)
    n_embd = _fixed(64)
    n_head = _fixed(4)
    n_head_kv = _fixed(4)
    n_ctx_train = _fixed(4096)
    n_expert = _fixed(0, "Experts per MoE layer; 0 for a dense model.")
    n_expert_used = _fixed(0)

    def info(self) -> dict:
        """What uma._core.Model.info() holds (uma.sched.bmt reads it)."""
        return {
            "path": self.path, "architecture": self.architecture,
            "description": self.description, "n_params": self.n_params,
            "size_bytes": self.size_bytes, "n_layer": self.n_layer, "n_embd": self.n_embd,
            "n_head": self.n_head, "n_head_kv": self.n_head_kv, "n_vocab": self.n_vocab,
            "n_ctx_train": self.n_ctx_train, "n_expert": self.n_expert,
            "n_expert_used": self.n_expert_used, "name": self.meta("general.name"),
        }

    # special tokens ------------------------------------------------------------------------

    bos = _fixed(BOS)
    eos = _fixed(EOS)
    eot = _fixed(-1)  # llama.cpp's LLAMA_TOKEN_NULL: the model has none
    add_bos = _fixed(True)
    fim_tokens = _fixed({"pre": -1, "suf": -1, "mid": -1, "pad": -1, "rep": -1, "sep": -1})

    def is_eog(self, token: int) -> bool:
        self._check_open()
        self._check_token(_int(token))
        return token == EOS

    def eog_tokens(self) -> np.ndarray:
        self._check_open()
        return np.array([EOS], dtype=np.int32)

    # text ----------------------------------------------------------------------------------

    def tokenize(self, text, *, add_special: bool = True, parse_special: bool = False
                 ) -> np.ndarray:
        """One token per whitespace-separated word; "<s>" and "</s>" are the special tokens
        only with parse_special (otherwise ordinary unknown words)."""
        self._check_open()
        if not isinstance(text, str):
            text = bytes(text).decode("utf-8", errors="replace")
        ids = [BOS] if add_special else []
        for word in text.split():
            token = _SPECIAL_IDS.get(word) if parse_special else None
            if token is None:
                token = _IDS.get(word)
            if token is None:
                token = FIRST_WORD + zlib.crc32(word.encode()) % (N_VOCAB - FIRST_WORD)
            ids.append(token)
        return np.array(ids, dtype=np.int32)

    def tokenizer_addresses(self) -> tuple[int, int]:
        """The real core's hands llama.cpp's tokenizer to a grammar engine; there is none here."""
        self._check_open()
        raise errors.UmaError("the fake core has no llama.cpp tokenizer for grammars")

    def vocab_pieces(self) -> tuple[list[bytes], np.ndarray]:
        """Every token's bytes (special ones as their text) and which are control tokens."""
        self._check_open()
        control = np.zeros(N_VOCAB, dtype=bool)
        control[list(_SPECIAL)] = True
        return [self.token_to_piece(t, special=True) for t in range(N_VOCAB)], control

    def token_to_piece(self, token: int, *, special: bool = False) -> bytes:
        """A word with its leading space (as SentencePiece pieces have); special tokens are
        empty unless special=True."""
        self._check_open()
        token = _int(token)
        self._check_token(token)
        if token in _SPECIAL:
            return _SPECIAL[token].encode() if special else b""
        return b" " + _WORDS[token].encode()

    def detokenize(self, tokens, *, remove_special: bool = False,
                   unparse_special: bool = False) -> str:
        self._check_open()
        arr = self._token_array(tokens)
        return "".join(
            self.token_to_piece(int(t), special=unparse_special).decode()
            for t in arr.tolist() if not (remove_special and t in _SPECIAL))

    def _token_array(self, tokens) -> np.ndarray:
        return token_ids.checked(tokens, self.n_vocab)

    @property
    def chat_template(self) -> str:
        """A Jinja template rendering as apply_chat_template does."""
        self._check_open()
        return ("{% for m in messages %}<s> {{ m['role'] }}: {{ m['content'] }} </s>\n"
                "{% endfor %}{% if add_generation_prompt %}<s> assistant:{% endif %}")

    def apply_chat_template(self, messages, *, add_assistant: bool = True,
                            template=None) -> str:
        """Renders messages as "<s> role: content </s>" turns, then "<s> assistant:"; validates
        them as the real core does."""
        self._check_open()
        if not isinstance(messages, (list, tuple)) or not messages:
            raise errors.InvalidRequestError("messages must be a non-empty list")
        parts = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) \
                    or not isinstance(m.get("content"), str):
                raise errors.InvalidRequestError(
                    f"messages[{i}] must be a dict with string 'role' and 'content'")
            if "\0" in m["role"] or "\0" in m["content"]:
                raise errors.InvalidRequestError(f"messages[{i}] contains a NUL character")
            parts.append(f"<s> {m['role']}: {m['content']} </s>\n")
        if add_assistant:
            parts.append("<s> assistant:")
        return "".join(parts)


# --- Batch -----------------------------------------------------------------------------------


class Batch:
    """Up to `capacity` tokens, one sequence each, as uma._core.Batch."""

    def __init__(self, capacity: int) -> None:
        capacity = _int(capacity)
        if capacity <= 0:
            raise errors.InvalidRequestError(f"batch capacity must be positive, not {capacity}")
        self.capacity = capacity
        self._token = np.zeros(capacity, np.int32)
        self._pos = np.zeros(capacity, np.int32)
        self._seq = np.zeros(capacity, np.int32)
        self._logits = np.zeros(capacity, bool)
        self._n = 0
        self.n_outputs = 0
        self._open = True
        _count("batch", 1)

    def close(self) -> None:
        """Idempotent; a closed batch holds nothing."""
        if self._open:
            self._open = False
            self._n = self.capacity = self.n_outputs = 0
            _count("batch", -1)

    @property
    def n_tokens(self) -> int:
        return self._n

    def __len__(self) -> int:
        return self._n

    def clear(self) -> None:
        self._n = 0
        self.n_outputs = 0

    def _reserve(self, n: int) -> None:
        if not self._open:
            raise errors.ClosedError("batch is closed")
        if self._n + n > self.capacity:
            raise errors.BatchFullError(
                f"batch holds {self.capacity} tokens; {self._n} used, {n} more requested")

    @staticmethod
    def _int32s(values) -> np.ndarray:
        # The real methods take `const int32_t[::1]`: a C-contiguous int32 buffer, nothing else
        # (an int64 array raises there too, and so must here, or the fake would hide the bug).
        arr = np.asarray(values)
        if arr.dtype != np.int32:
            raise ValueError(f"Buffer dtype mismatch, expected 'int32_t' but got {arr.dtype}")
        if arr.ndim != 1:
            raise ValueError(f"Buffer has wrong number of dimensions (expected 1, got {arr.ndim})")
        if not arr.flags.c_contiguous:
            raise ValueError("ndarray is not C-contiguous")
        return arr

    def add(self, token: int, pos: int, seq_id: int, logits: bool = False) -> None:
        """Appends one token."""
        token, pos, seq_id = _int(token), _int(pos), _int(seq_id)
        self._reserve(1)
        i = self._n
        self._token[i], self._pos[i], self._seq[i] = token, pos, seq_id
        self._logits[i] = bool(logits)
        self._n += 1
        self.n_outputs += bool(logits)

    def add_sequence(self, tokens, pos0: int, seq_id: int, *, logits_last: bool = True) -> None:
        """Appends a run of one sequence's tokens at pos0, pos0+1, ...; only the last produces
        logits when logits_last."""
        tokens = self._int32s(tokens)
        pos0, seq_id = _int(pos0), _int(seq_id)
        n = len(tokens)
        if n == 0:
            return
        self._reserve(n)
        s = slice(self._n, self._n + n)
        self._token[s] = tokens
        self._pos[s] = np.arange(pos0, pos0 + n, dtype=np.int32)
        self._seq[s] = seq_id
        self._logits[s] = False
        if logits_last:
            self._logits[self._n + n - 1] = True
        self._n += n
        self.n_outputs += bool(logits_last)

    def add_rows(self, tokens, pos, seq_ids, *, logits: bool = True) -> None:
        """Appends one token for each of several sequences (a decode step)."""
        tokens, pos, seq_ids = self._int32s(tokens), self._int32s(pos), self._int32s(seq_ids)
        n = len(tokens)
        if len(pos) != n or len(seq_ids) != n:
            raise errors.InvalidRequestError("tokens, pos and seq_ids must have the same length")
        if n == 0:
            return
        self._reserve(n)
        s = slice(self._n, self._n + n)
        self._token[s], self._pos[s], self._seq[s] = tokens, pos, seq_ids
        self._logits[s] = bool(logits)
        self._n += n
        if logits:
            self.n_outputs += n

    def output_seqs(self) -> np.ndarray:
        """Sequence id of each logits row, in row order."""
        n = self._n
        return self._seq[:n][self._logits[:n]].copy()

    def tokens(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, positions, seq_ids, logits flags) as copies, for inspection."""
        n = self._n
        return (self._token[:n].copy(), self._pos[:n].copy(), self._seq[:n].copy(),
                self._logits[:n].copy())


# --- Context ---------------------------------------------------------------------------------


class _Cell:
    """One KV cell: a position, what the sequence's chain was there, and the sequences that
    hold it (seq_cp shares a cell, as llama.cpp's unified cache does)."""

    __slots__ = ("chain", "pos", "seqs", "stream", "trigger")

    def __init__(self, pos: int, chain: int, trigger: int, stream: int) -> None:
        self.pos = pos
        self.chain = chain  # hash of the sequence's (position, token) pairs up to pos
        self.trigger = trigger  # position of the latest TRIGGER up to pos, -1 if none
        self.stream = stream
        self.seqs: set[int] = set()


def _pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class _ModelContext:
    """What every context over a Model shares: it counts among the model's contexts (and the
    live objects) from _opened() until close()."""

    model: Model
    _closed = True  # until constructed

    def _opened(self, model: Model) -> None:
        self.model = model
        model._n_contexts += 1
        self._closed = False
        _count("context", 1)

    def close(self) -> None:
        """Idempotent."""
        if not self._closed:
            self._closed = True
            self.model._n_contexts -= 1
            _count("context", -1)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Context(_ModelContext):
    """A KV cache over a Model, with llama.cpp's bookkeeping and none of its arithmetic.
    Driven by one thread; abort(), resume() and stall() may come from any."""

    def __init__(self, model: Model, *, n_ctx: int = 4096, n_batch: int = 512, n_ubatch=None,
                 n_seq_max: int = 1, kv_unified: bool = True, type_k: str = "f16",
                 type_v: str = "f16", flash_attn: str = "auto", n_threads=None,
                 n_threads_batch=None, n_outputs_per_seq: int = 1) -> None:
        if not isinstance(model, Model):
            raise TypeError(f"model must be a fake_core.Model, not {type(model).__name__}")
        model._check_open()
        if model.vocab_only:
            raise errors.InvalidRequestError("a vocab-only model cannot run: load its weights")
        n_ctx, n_batch, n_seq_max = _int(n_ctx), _int(n_batch), _int(n_seq_max)
        if n_ctx <= 0:
            raise errors.InvalidRequestError(f"n_ctx must be positive, not {n_ctx}")
        if n_batch <= 0:
            raise errors.InvalidRequestError(f"n_batch must be positive, not {n_batch}")
        ubatch = n_batch if n_ubatch is None else _int(n_ubatch)
        if not 0 < ubatch <= n_batch:
            raise errors.InvalidRequestError(f"n_ubatch must be in [1, n_batch={n_batch}]")
        if not 0 < n_seq_max <= _MAX_SEQ:
            raise errors.InvalidRequestError(f"n_seq_max must be in [1, {_MAX_SEQ}]")
        for name, value in (("type_k", type_k), ("type_v", type_v)):
            if value not in _KV_TYPES:
                raise errors.InvalidRequestError(
                    f"{name} must be one of {', '.join(_KV_TYPES)}, not {value!r}")
        if flash_attn not in ("auto", "on", "off"):
            raise errors.InvalidRequestError("flash_attn must be 'auto', 'on' or 'off'")
        threads = default_threads() if n_threads is None else _int(n_threads)
        threads_batch = threads if n_threads_batch is None else _int(n_threads_batch)
        if threads <= 0 or threads_batch <= 0:
            raise errors.InvalidRequestError("thread counts must be positive")
        # llama.cpp's sizes (llama_context's constructor): n_ctx padded to 256; without a
        # unified cache every sequence gets its own stream of n_ctx_seq cells, padded too.
        n_ctx = _pad(n_ctx, 256)
        if kv_unified:
            n_ctx_seq = n_ctx
        else:
            n_ctx_seq = _pad(n_ctx // n_seq_max, 256)
            n_ctx = n_ctx_seq * n_seq_max
        self.model = model
        self.kv_unified = bool(kv_unified)
        self._n_ctx, self._n_ctx_seq = n_ctx, n_ctx_seq
        self._n_batch, self._n_ubatch, self._n_seq_max = n_batch, ubatch, n_seq_max
        n_outputs_per_seq = _int(n_outputs_per_seq)
        if not 0 < n_outputs_per_seq <= n_batch:
            raise errors.InvalidRequestError(
                f"n_outputs_per_seq must be in [1, n_batch={n_batch}], not {n_outputs_per_seq}")
        self._outputs_per_seq = n_outputs_per_seq
        self._threads = (threads, threads_batch)
        n_streams = 1 if kv_unified else n_seq_max
        self._stream_cells = n_ctx if kv_unified else n_ctx_seq
        self._used = [0] * n_streams  # cells in use, per stream
        self._seqs: list[dict[int, _Cell]] = [{} for _ in range(n_seq_max)]
        # each sequence's largest position, None once a removal may have changed it: decode
        # checks it every time, and max() over a long sequence per decode would be slow
        self._last: list[int | None] = [-1] * n_seq_max
        self._rows: list[_Cell] = []  # the cell behind each logits row of the last decode
        self._row_cache: dict[int, np.ndarray] = {}
        self._logits_buf: np.ndarray | None = None  # logits() of the last decode, once asked
        self._n_outputs = 0
        self._output_seqs = np.empty(0, np.int32)
        self._decode_s = 0.0
        self._cond = threading.Condition()
        self._abort = False
        self._stall = False
        self._stalled = 0  # decodes blocked by stall() right now
        self.failing_tokens: set[int] = set()  # test hook: decodes of these ids fail
        # test hook: called with the batch first thing in every decode, on the decoding thread
        # (the engine's compute thread), e.g. to keep it in step with another thread
        self.before_decode: Callable[[Batch], None] | None = None
        self.n_decodes = 0  # decode calls that ran (not refused by validation)
        self._reused = 0
        self._last_shape: tuple[int, int] | None = None  # (tokens, logits rows) of the last
        self._opened(model)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise errors.ClosedError("context is closed")

    def _check_seq(self, seq_id: int) -> None:
        if seq_id < 0 or seq_id >= self._n_seq_max:
            raise errors.InvalidRequestError(f"seq_id {seq_id} is outside [0, {self._n_seq_max})")

    # sizes -----------------------------------------------------------------------------------

    def _open(self, value):
        self._check_open()
        return value

    n_ctx = property(lambda self: self._open(self._n_ctx), doc="KV cells in all.")
    n_ctx_seq = property(lambda self: self._open(self._n_ctx_seq),
                         doc="Positions one sequence may use.")
    n_batch = property(lambda self: self._open(self._n_batch))
    n_ubatch = property(lambda self: self._open(self._n_ubatch))
    n_seq_max = property(lambda self: self._open(self._n_seq_max))
    n_outputs_per_seq = property(lambda self: self._open(self._outputs_per_seq))
    n_threads = property(lambda self: self._open(self._threads))
    graphs_reused = property(lambda self: self._open(self._reused),
                             doc="Micro-batches shaped as the one before (the real core: "
                                 "llama.cpp reused its compute graph).")

    def set_threads(self, n_threads: int, n_threads_batch: int) -> None:
        self._check_open()
        if n_threads <= 0 or n_threads_batch <= 0:
            raise errors.InvalidRequestError("thread counts must be positive")
        self._threads = (_int(n_threads), _int(n_threads_batch))

    @property
    def cells_used(self) -> int:
        """KV cells in use (shared cells once): what llama.cpp's cache holds."""
        return sum(self._used)

    # stopping decodes --------------------------------------------------------------------

    def abort(self, on: bool = True) -> None:
        """Makes decodes end with DecodeAbortedError until abort(False), a stalled one at once.
        Safe from any thread."""
        with self._cond:
            self._abort = bool(on)
            self._cond.notify_all()

    def stall(self) -> None:
        """Test hook: from here on, decodes block once their batch is in the cache's plan (as
        one running for a long time would), until resume() or abort()."""
        with self._cond:
            self._stall = True

    def resume(self) -> None:
        """Lets stalled and later decodes run."""
        with self._cond:
            self._stall = False
            self._cond.notify_all()

    def wait_stalled(self, timeout: float | None = None) -> bool:
        """Waits until a decode is blocked by stall(); True if one is."""
        with self._cond:
            return self._cond.wait_for(lambda: self._stalled > 0, timeout)

    def _gate(self) -> None:
        with self._cond:
            if self._stall and not self._abort:
                self._stalled += 1
                self._cond.notify_all()
                try:
                    self._cond.wait_for(lambda: not self._stall or self._abort)
                finally:
                    self._stalled -= 1
            if self._abort:
                raise errors.decode_error(2, "aborted by Context.abort()")

    # decode ----------------------------------------------------------------------------------

    def _validate(self, tokens, pos, seqs) -> None:
        """What uma._core.Context._validate checks before llama_decode, in its order."""
        n = len(tokens)
        if n == 0:
            raise errors.InvalidRequestError("cannot decode an empty batch")
        if n > self._n_batch:
            raise errors.BatchFullError(
                f"batch has {n} tokens; the context's n_batch is {self._n_batch}")
        bad = (tokens < 0) | (tokens >= self.model.n_vocab) | (seqs < 0) \
            | (seqs >= self._n_seq_max) | (pos < 0) | (pos >= self._n_ctx_seq)
        if bad.any():
            i = int(np.argmax(bad))
            if not 0 <= tokens[i] < self.model.n_vocab:
                self.model._check_token(int(tokens[i]))
            if not 0 <= seqs[i] < self._n_seq_max:
                self._check_seq(int(seqs[i]))
            raise errors.ContextOverflowError(
                f"position {pos[i]} of sequence {seqs[i]} is outside the context window of "
                f"{self._n_ctx_seq} tokens per sequence")

    def _check_positions(self, pos, seqs) -> None:
        """llama_batch_allocr's consistency checks (rc -1): a sequence's positions in the
        batch never decrease, have no gaps, and continue from its last one in the cache."""
        for s in np.unique(seqs).tolist():
            p = pos[seqs == s]
            if (np.diff(p) < 0).any():
                raise errors.decode_error(-1, f"sequence {s} positions are decreasing")
            last = self._pos_max(s)
            if last >= 0 and p[0] != last + 1:
                raise errors.decode_error(
                    -1, f"sequence {s} continues at position {p[0]}; the cache holds it up to "
                        f"{last}, so it must be {last + 1}")
            if p[-1] - p[0] + 1 > len(np.unique(p)):
                raise errors.decode_error(-1, f"sequence {s} positions are not continuous")

    def decode(self, batch: Batch) -> int:
        """Puts the batch in the cache; returns the number of logits rows.

        Raises NoKVSlotError when the cells do not fit (the cache is unchanged),
        DecodeAbortedError after abort() and DecodeError for failing_tokens (both keep the
        micro-batches before the one they stopped in, as llama.cpp does)."""
        self._check_open()
        if not isinstance(batch, Batch):
            raise TypeError(f"batch must be a fake_core.Batch, not {type(batch).__name__}")
        if self.before_decode is not None:
            self.before_decode(batch)
        tokens, pos, seqs, logits = batch.tokens()
        self._validate(tokens, pos, seqs)
        self.n_decodes += 1
        self._n_outputs = 0
        self._check_positions(pos, seqs)
        n = len(tokens)
        need = collections.Counter([0] * n if self.kv_unified else seqs.tolist())
        for stream, k in need.items():
            if self._used[stream] + k > self._stream_cells:
                raise errors.decode_error(
                    1, f"{k} cells wanted, {self._stream_cells - self._used[stream]} free")
        toks, poss, seq_ids = tokens.tolist(), pos.tolist(), seqs.tolist()
        rows: list[_Cell] = []
        for start in range(0, n, self._n_ubatch):
            end = min(n, start + self._n_ubatch)
            self._gate()
            if self.failing_tokens and not self.failing_tokens.isdisjoint(toks[start:end]):
                raise errors.decode_error(-3, "a token of the batch is in failing_tokens")
            shape = (end - start, int(logits[start:end].sum()))
            self._reused += shape == self._last_shape
            self._last_shape = shape
            for i in range(start, end):
                cell = self._put(seq_ids[i], poss[i], toks[i])
                if logits[i]:
                    rows.append(cell)
        self._rows = rows
        self._row_cache = {}
        self._logits_buf = None
        self._n_outputs = len(rows)
        self._output_seqs = seqs[logits]
        # Made up, but from the shape as a real decode's time is: a step, the tokens, and the
        # cache the decode rows read.
        read = sum(len(self._seqs[s]) for s in set(seq_ids))
        self._decode_s = 1e-4 + 2e-6 * n + 1e-8 * read
        return self._n_outputs

    def _put(self, seq: int, pos: int, token: int) -> _Cell:
        held = self._seqs[seq]
        before = held.get(pos - 1)
        chain, trigger = (before.chain, before.trigger) if before is not None else (_SEED, -1)
        if token == TRIGGER:
            trigger = pos
        cell = _Cell(pos, _mix(chain ^ (token * 0x100000001B3 + pos)), trigger,
                     0 if self.kv_unified else seq)
        if pos in held:  # a position given twice in one batch: the later token wins
            self._drop(seq, held[pos])
        cell.seqs.add(seq)
        held[pos] = cell
        self._used[cell.stream] += 1
        if self._last[seq] is not None and pos > self._last[seq]:
            self._last[seq] = pos
        return cell

    def _pos_max(self, seq: int) -> int:
        if self._last[seq] is None:
            self._last[seq] = max(self._seqs[seq], default=-1)
        return self._last[seq]

    def _drop(self, seq: int, cell: _Cell) -> None:
        cell.seqs.discard(seq)
        if not cell.seqs:
            self._used[cell.stream] -= 1

    @property
    def last_decode_seconds(self) -> float:
        """A made-up time for the last decode, from its shape (the fake takes microseconds)."""
        return self._decode_s

    @property
    def n_outputs(self) -> int:
        return self._n_outputs

    @property
    def output_seqs(self) -> np.ndarray:
        """Sequence id of each logits row of the last decode."""
        return self._output_seqs

    def _logits(self, row: int) -> np.ndarray:
        """Logits row `row` of the last decode: a function of its cell's chain alone."""
        self._check_open()
        if self._n_outputs == 0:
            raise errors.UmaError("no logits: the last decode produced none")
        cached = self._row_cache.get(row)
        if cached is not None:
            return cached
        cell = self._rows[row]
        out = np.random.default_rng(cell.chain).standard_normal(
            self.model.n_vocab, dtype=np.float32) * np.float32(_SCALE)
        out[[EOS, BOS, TRIGGER]] = _NEVER
        if cell.trigger >= 0 and cell.pos - cell.trigger >= EOG_AFTER:
            out[EOS] = out.max() + 10
        out.flags.writeable = False
        self._row_cache[row] = out
        return out

    def logits(self) -> np.ndarray:
        """The last decode's logits, (n_outputs, n_vocab) float32, read-only: views of one
        buffer per decode, as the real core's. (The real core refuses to decode while a view
        is alive, LogitsInUseError; the fake does not track views.)"""
        self._check_open()
        if self._n_outputs == 0:
            raise errors.UmaError("no logits: the last decode produced none")
        if self._logits_buf is None:
            self._logits_buf = np.stack([self._logits(k) for k in range(self._n_outputs)])
            self._logits_buf.flags.writeable = False
        return self._logits_buf[:]

    def logits_address(self) -> int:
        """Address of the buffer logits() views."""
        return int(self.logits().ctypes.data)

    # sampling on the device -------------------------------------------------------------------

    def set_sampler(self, seq_id: int, *, temperature: float = 0.0, top_k: int = 0,
                    top_p: float = 1.0, min_p: float = 0.0, seed: int = 0) -> bool:
        """The fake device has no samplers: False, the rows stay the host's (as where the
        real backend cannot run a chain)."""
        self._check_open()
        self._check_seq(_int(seq_id))
        return False

    def clear_sampler(self, seq_id: int) -> None:
        self._check_open()
        self._check_seq(_int(seq_id))

    def device_sampled(self, seq_id: int) -> bool:
        self._check_open()
        self._check_seq(_int(seq_id))
        return False

    def sampled_tokens(self) -> np.ndarray:
        self._check_open()
        return np.full(self._n_outputs, -1, dtype=np.int32)

    def synchronize(self) -> None:
        self._check_open()

    # per-sequence memory ----------------------------------------------------------------------

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Removes positions [p0, p1) of a sequence (-1: open end). Always True (a plain KV
        cache can remove any range)."""
        self._check_open()
        seq_id, p0, p1 = _int(seq_id), _int(p0), _int(p1)
        self._check_seq(seq_id)
        lo = max(p0, 0)
        hi = p1 if p1 >= 0 else float("inf")
        held = self._seqs[seq_id]
        for p in [p for p in held if lo <= p < hi]:
            self._drop(seq_id, held.pop(p))
        self._last[seq_id] = None
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Shares positions [p0, p1) of src with dst: the same cells in a unified cache,
        copies in dst's own stream otherwise (as llama.cpp)."""
        self._check_open()
        src, dst = _int(src), _int(dst)
        self._check_seq(src)
        self._check_seq(dst)
        lo, hi = max(p0, 0), (p1 if p1 >= 0 else float("inf"))
        for p, cell in list(self._seqs[src].items()):
            if not lo <= p < hi or src == dst:
                continue
            old = self._seqs[dst].pop(p, None)
            if old is not None:
                self._drop(dst, old)
            if not self.kv_unified:
                cell = _Cell(cell.pos, cell.chain, cell.trigger, dst)
                self._used[dst] += 1
            cell.seqs.add(dst)
            self._seqs[dst][p] = cell
        self._last[dst] = None

    def seq_keep(self, seq_id: int) -> None:
        """Removes every sequence but this one."""
        self._check_open()
        self._check_seq(_int(seq_id))
        for s in range(self._n_seq_max):
            if s != seq_id:
                self.seq_rm(s)

    def seq_pos_max(self, seq_id: int) -> int:
        self._check_open()
        self._check_seq(_int(seq_id))
        return self._pos_max(seq_id)

    def seq_pos_min(self, seq_id: int) -> int:
        self._check_open()
        self._check_seq(_int(seq_id))
        return min(self._seqs[seq_id], default=-1)

    @property
    def kv_span(self) -> int:
        """-1: this stand-in places no cell anywhere, so it cannot say how far a tick's
        attention runs (the real core can)."""
        self._check_open()
        return -1

    def clear(self) -> None:
        """Empties the whole cache."""
        self._check_open()
        for s in range(self._n_seq_max):
            self.seq_rm(s)

    _STATE = b"FAKESEQ1"
    _CELL = struct.Struct("<iQi")  # position, chain, trigger position

    def seq_state(self, seq_id: int) -> bytes:
        """The sequence's cells as bytes, for set_seq_state (of this fake only)."""
        self._check_open()
        self._check_seq(_int(seq_id))
        held = self._seqs[seq_id]
        return self._STATE + b"".join(
            self._CELL.pack(p, held[p].chain, held[p].trigger) for p in sorted(held))

    def set_seq_state(self, seq_id: int, data) -> int:
        """Restores a state from seq_state() into seq_id, replacing what it held; returns the
        bytes read. What does not fit the cache is refused, as llama.cpp does."""
        self._check_open()
        seq_id = _int(seq_id)
        self._check_seq(seq_id)
        data = bytes(memoryview(data))
        if not data:
            raise errors.InvalidRequestError("sequence state is empty")
        body = data[len(self._STATE):]
        if not data.startswith(self._STATE) or len(body) % self._CELL.size:
            raise errors.InvalidRequestError("could not restore the sequence state: rejected")
        cells = list(self._CELL.iter_unpack(body))
        if any(not 0 <= pos < self._n_ctx_seq for pos, _, _ in cells):
            raise errors.InvalidRequestError(
                "could not restore the sequence state: positions outside the context")
        self.seq_rm(seq_id)
        stream = 0 if self.kv_unified else seq_id
        if self._used[stream] + len(cells) > self._stream_cells:
            raise errors.InvalidRequestError(
                "could not restore the sequence state: no room in the KV cache")
        for pos, chain, trigger in cells:
            cell = _Cell(pos, chain, trigger, stream)
            cell.seqs.add(seq_id)
            self._seqs[seq_id][pos] = cell
        self._used[stream] += len(cells)
        self._last[seq_id] = None
        return len(data)


# --- Sampler ---------------------------------------------------------------------------------


class _Slot:
    __slots__ = ("bias", "counts", "params", "rng", "window")

    def __init__(self, params: dict) -> None:
        self.params = params
        self.bias: tuple[tuple[int, float], ...] = ()
        self.rng = np.random.default_rng(params["seed"])
        n = params["penalty_last_n"]
        self.window: collections.deque[int] = collections.deque(maxlen=n)
        self.counts: collections.Counter[int] = collections.Counter()

    def remember(self, token: int) -> None:
        window = self.window
        if window.maxlen == 0:
            return
        if len(window) == window.maxlen:
            old = window[0]
            self.counts[old] -= 1
            if not self.counts[old]:
                del self.counts[old]
        window.append(token)
        self.counts[token] += 1


class Embedder(_ModelContext):
    """An embeddings context: each input's vector a fixed function of its tokens (the mean of
    per-token random vectors for 'mean', the first's for 'cls', the last's for 'last';
    'auto' is mean), packed into decodes as the real one packs them."""

    def __init__(self, model: Model, *, n_ctx: int = 2048, pooling: str = "auto",
                 n_seq_max: int = 8, n_threads: int | None = None) -> None:
        model._check_open()
        n_ctx, n_seq_max = _int(n_ctx), _int(n_seq_max)
        if n_ctx <= 0:
            raise errors.InvalidRequestError(f"n_ctx must be positive, not {n_ctx}")
        if pooling not in ("auto", "mean", "cls", "last"):
            raise errors.InvalidRequestError(
                f"pooling must be 'auto', 'mean', 'cls' or 'last', not {pooling!r}")
        if not 0 < n_seq_max <= _MAX_SEQ:
            raise errors.InvalidRequestError(f"n_seq_max must be in [1, {_MAX_SEQ}]")
        if n_threads is not None and _int(n_threads) <= 0:
            raise errors.InvalidRequestError("thread counts must be positive")
        self.n_ctx, self.n_seq_max = n_ctx, n_seq_max
        self.n_embd = model.n_embd
        self.pooling = "mean" if pooling == "auto" else pooling
        self.n_decodes = 0  # decode calls made, as the real one packs inputs into them
        self._opened(model)

    def embed(self, inputs) -> np.ndarray:
        """The pooled vector of each input (1 to n_ctx token ids), float32 (n, n_embd)."""
        if self._closed:
            raise errors.ClosedError("embedder is closed")
        arrays = [self.model._token_array(t) for t in inputs]
        for i, a in enumerate(arrays):
            if not 0 < a.size <= self.n_ctx:
                raise errors.InvalidRequestError(
                    f"input {i} has {a.size} tokens; an input takes 1 to {self.n_ctx}")
        out = np.empty((len(arrays), self.n_embd), np.float32)
        first = 0
        lengths = [a.size for a in arrays]
        while first < len(arrays):
            last = decode_end(lengths, first, self.n_ctx, self.n_seq_max)
            self.n_decodes += 1
            for k in range(first, last):
                states = np.stack([np.random.default_rng(int(t)).standard_normal(
                    self.n_embd, dtype=np.float32) for t in arrays[k].tolist()])
                out[k] = {"mean": states.mean(0), "cls": states[0],
                          "last": states[-1]}[self.pooling]
            first = last
        return out


_DEFAULTS = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0,
             "frequency_penalty": 0.0, "presence_penalty": 0.0, "penalty_last_n": 64, "seed": 0}


class Sampler:
    """The native sampler's pipeline in numpy: penalties -> temperature -> top-k -> top-p ->
    min-p -> draw, greedy at temperature 0. Each slot has its own parameters, seeded RNG and
    penalty history. submit() samples at once; wait() returns what it sampled."""

    def __init__(self, n_slots: int, n_vocab: int, n_threads: int = 0) -> None:
        self._slots: list[_Slot] | None = None
        n_slots, n_vocab, n_threads = _int(n_slots), _int(n_vocab), _int(n_threads)
        if n_slots <= 0 or n_vocab <= 0:
            raise errors.InvalidRequestError("n_slots and n_vocab must be positive")
        if n_threads < 0:
            raise errors.InvalidRequestError("n_threads must be >= 0 (0: automatic)")
        self._n_vocab = n_vocab
        self._slots = [_Slot(dict(_DEFAULTS)) for _ in range(n_slots)]
        self._pending = None
        _count("sampler", 1)

    def close(self) -> None:
        if self._slots is not None:
            self._slots = None
            self._pending = None
            _count("sampler", -1)

    def _check(self) -> list[_Slot]:
        if self._slots is None:
            raise errors.ClosedError("sampler is closed")
        return self._slots

    @property
    def n_slots(self) -> int:
        return len(self._check())

    @property
    def n_vocab(self) -> int:
        self._check()
        return self._n_vocab

    def _slot(self, slot: int) -> int:
        slot = _int(slot)
        if not 0 <= slot < len(self._check()):
            raise errors.InvalidRequestError(f"slot {slot} is outside [0, {len(self._slots)})")
        return slot

    def configure(self, slot: int, *, temperature: float = 0.0, top_k: int = 0,
                  top_p: float = 1.0, min_p: float = 0.0, repeat_penalty: float = 1.0,
                  frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                  penalty_last_n: int = 64, seed: int = 0, logit_bias=()) -> None:
        """Resets a slot for a new sequence. temperature <= 0 is greedy."""
        slot = self._slot(slot)
        params = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p,
                  "repeat_penalty": repeat_penalty, "frequency_penalty": frequency_penalty,
                  "presence_penalty": presence_penalty, "penalty_last_n": penalty_last_n,
                  "seed": seed}
        check_sampling(**params)
        self._slots[slot] = _Slot(params)
        self._slots[slot].bias = check_logit_bias(logit_bias, self._n_vocab)

    def accept(self, slot: int, tokens) -> None:
        """Adds tokens (e.g. the prompt) to the slot's penalty history."""
        slot = self._slot(slot)
        for t in np.ascontiguousarray(tokens, dtype=np.int32).tolist():
            self._slots[slot].remember(t)

    def _masks(self, masks, mask_index, n: int) -> list[np.ndarray | None]:
        """Each row's mask as a boolean array over the vocabulary (None: unconstrained),
        checked as the real core checks them."""
        m, i = check_masks(masks, mask_index, n, self._n_vocab)
        if m is None or i is None:
            return [None] * n
        bits = np.unpackbits(m.view(np.uint8), axis=1, bitorder="little")[:, :self._n_vocab]
        return [None if k < 0 else bits[k].astype(bool) for k in i.tolist()]

    def _sample_row(self, slot: _Slot, raw: np.ndarray,
                    allowed: np.ndarray | None = None) -> tuple[int, float]:
        p = slot.params
        row = self._penalised(slot, raw)
        if allowed is not None:
            row = np.where(allowed, row, np.float32(-np.inf))
        if p["temperature"] <= 0:
            token = int(np.argmax(row))
        else:
            ids, scaled = self._filter(p, row)
            weights = np.exp((scaled - scaled[0]).astype(np.float64))
            cum = np.cumsum(weights)
            u = slot.rng.random() * cum[-1]
            token = int(ids[min(int(np.searchsorted(cum, u, side="right")), len(ids) - 1)])
        slot.remember(token)
        shifted = raw.astype(np.float64) - float(raw.max())
        logprob = float(shifted[token] - np.log(np.exp(shifted).sum()))
        return token, logprob

    @staticmethod
    def _penalised(slot: _Slot, raw: np.ndarray) -> np.ndarray:
        """The row after the slot's repetition penalties (llama.cpp's rule: divide positive
        logits, multiply negative ones), or the row itself when none apply."""
        p = slot.params
        penalties = slot.counts and (p["repeat_penalty"] != 1 or p["frequency_penalty"]
                                     or p["presence_penalty"])
        if not penalties and not slot.bias:
            return raw
        row = raw.copy()
        for token, bias in slot.bias:
            row[token] += np.float32(bias)
        if not penalties:
            return row
        for token, count in slot.counts.items():
            if 0 <= token < len(row):
                v = row[token]
                if p["repeat_penalty"] != 1:
                    v = v / p["repeat_penalty"] if v > 0 else v * p["repeat_penalty"]
                row[token] = v - count * p["frequency_penalty"] - p["presence_penalty"]
        return row

    @staticmethod
    def _filter(p: dict, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The candidates after temperature, top-k, top-p and min-p: ids most probable first
        (equal logits by id), and their scaled logits."""
        scaled = row.astype(np.float32) / np.float32(p["temperature"])
        order = np.lexsort((np.arange(len(scaled)), -scaled))
        if 0 < p["top_k"] < len(order):
            order = order[:p["top_k"]]
        logits = scaled[order]
        if p["top_p"] < 1:
            w = np.exp((logits - logits[0]).astype(np.float64))
            cum = np.cumsum(w)
            keep = int(np.searchsorted(cum, p["top_p"] * cum[-1], side="left")) + 1
            order, logits = order[:keep], logits[:keep]
        if p["min_p"] > 0:
            ok = logits >= logits[0] + np.float32(np.log(p["min_p"]))
            order, logits = order[ok], logits[ok]
        return order, logits

    def _rows(self, ctx: Context, rows, slots) -> tuple[np.ndarray, np.ndarray]:
        slot_list = self._check()
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx must be a fake_core.Context, not {type(ctx).__name__}")
        if len(rows):
            ctx._logits(0)  # raises as the real one does when the decode made no logits
        if ctx.model.n_vocab != self._n_vocab:
            raise errors.InvalidRequestError(
                f"sampler n_vocab {self._n_vocab} != model n_vocab {ctx.model.n_vocab}")
        r = np.ascontiguousarray(rows, dtype=np.int32)
        s = np.ascontiguousarray(slots, dtype=np.int32)
        if r.ndim != 1 or r.shape != s.shape:
            raise errors.InvalidRequestError("rows and slots must be 1-D and of equal length")
        if r.size:
            if r.min() < 0 or r.max() >= ctx._n_outputs:
                raise errors.InvalidRequestError(
                    f"logits rows must be in [0, {ctx._n_outputs})")
            if s.min() < 0 or s.max() >= len(slot_list):
                raise errors.InvalidRequestError(f"slots must be in [0, {len(slot_list)})")
        return r, s

    def sample(self, ctx: Context, rows, slots, *, logprobs: bool = False, masks=None,
               mask_index=None):
        """Samples logits rows `rows` of ctx's last decode with slots `slots`. Returns tokens
        (int32), or (tokens, logprobs) if asked (log-softmax of the raw row). masks as the
        real core takes them."""
        r, s = self._rows(ctx, rows, slots)
        allowed = self._masks(masks, mask_index, r.size)
        tokens = np.empty(r.size, np.int32)
        lps = np.empty(r.size, np.float32)
        for i, (row, slot) in enumerate(zip(r.tolist(), s.tolist(), strict=True)):
            tokens[i], lps[i] = self._sample_row(self._slots[slot], ctx._logits(row), allowed[i])
        return (tokens, lps) if logprobs else tokens

    def submit(self, ctx: Context, rows, slots, *, logprobs: bool = False, masks=None,
               mask_index=None) -> None:
        """sample(), done now; wait() returns its answer."""
        if self._pending is not None:
            raise errors.UmaError("a sampler job is already in flight; wait() first")
        self._pending = self.sample(ctx, rows, slots, logprobs=logprobs, masks=masks,
                                    mask_index=mask_index)

    def wait(self):
        """What the submitted job sampled; None if there was none."""
        out, self._pending = self._pending, None
        return out

    def sample_array(self, logits, slots, *, logprobs: bool = False, masks=None,
                     mask_index=None):
        """Samples each row of a float32 array (rows, n_vocab) with the matching slot."""
        self._check()
        arr = np.ascontiguousarray(logits, dtype=np.float32)
        if arr.ndim != 2 or arr.shape[1] != self._n_vocab:
            raise errors.InvalidRequestError(f"logits must have shape (rows, {self._n_vocab})")
        s = np.ascontiguousarray(slots, dtype=np.int32)
        if s.shape != (arr.shape[0],):
            raise errors.InvalidRequestError("one slot per logits row is required")
        if s.size and (s.min() < 0 or s.max() >= len(self._slots)):
            raise errors.InvalidRequestError(f"slots must be in [0, {len(self._slots)})")
        allowed = self._masks(masks, mask_index, len(s))
        tokens = np.empty(len(s), np.int32)
        lps = np.empty(len(s), np.float32)
        for i, slot in enumerate(s.tolist()):
            tokens[i], lps[i] = self._sample_row(self._slots[slot], arr[i], allowed[i])
        return (tokens, lps) if logprobs else tokens

    def top_logprobs(self, ctx: Context, rows, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k most probable tokens of each row by the raw logits' log softmax, most
        probable first (ties by id): (ids (n, k), logprobs (n, k))."""
        if not 1 <= k <= MAX_TOP_LOGPROBS:
            raise errors.InvalidRequestError(f"k must be in [1, {MAX_TOP_LOGPROBS}], not {k}")
        r, _ = self._rows(ctx, rows, np.zeros(len(rows), np.int32))
        return self.top_logprobs_array([ctx._logits(row) for row in r.tolist()], k)

    def top_logprobs_array(self, logits, k: int) -> tuple[np.ndarray, np.ndarray]:
        """top_logprobs() of each row of a float32 array (rows, n_vocab)."""
        if not 1 <= k <= MAX_TOP_LOGPROBS:
            raise errors.InvalidRequestError(f"k must be in [1, {MAX_TOP_LOGPROBS}], not {k}")
        arr = np.asarray(logits, dtype=np.float32).reshape(-1, self._n_vocab)
        k = min(k, self._n_vocab)
        ids = np.empty((len(arr), k), np.int32)
        lps = np.empty((len(arr), k), np.float32)
        for i, x in enumerate(arr.astype(np.float64)):
            order = np.lexsort((np.arange(x.size), -x))[:k]
            m = x.max()
            ids[i] = order
            lps[i] = x[order] - m - np.log(np.exp(x - m).sum())
        return ids, lps

    def candidates(self, slot: int, row) -> tuple[np.ndarray, np.ndarray]:
        """The token ids that survive the slot's filters for this row, most probable first,
        and their renormalised probabilities. Leaves the RNG be."""
        slot = self._slot(slot)
        arr = np.ascontiguousarray(row, dtype=np.float32)
        if arr.shape != (self._n_vocab,):
            raise errors.InvalidRequestError(f"row must have {self._n_vocab} logits")
        p = self._slots[slot].params
        arr = self._penalised(self._slots[slot], arr)
        if p["temperature"] <= 0:
            return np.array([int(np.argmax(arr))], np.int32), np.ones(1, np.float32)
        ids, scaled = self._filter(p, arr)
        w = np.exp((scaled - scaled[0]).astype(np.float64))
        return ids.astype(np.int32), (w / w.sum()).astype(np.float32)
