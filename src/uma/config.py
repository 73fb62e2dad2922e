"""Validated, frozen configuration objects.

Everything a user passes in (keyword arguments, CLI flags, config files, socket frames) ends up
in one of these dataclasses, whose constructors check every field and name the bad one.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from uma import checks
from uma.app import app_name, app_weight
from uma.errors import InvalidRequestError, shown
from uma.knobs import check_knobs

# The native sampler holds its options as 32-bit floats; every bound below keeps the values,
# and what it computes from them (logits / temperature, logits / repeat_penalty), finite there.
# A value checked only as a 64-bit float (temperature 1e308) became inf in the sampler.
MAX_TEMPERATURE = 100.0  # far past the point where sampling is uniform noise
GREEDY_BELOW = 1e-5  # a temperature this low is greedy decoding (1/temperature stays finite)
FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal 32-bit float
REPEAT_PENALTY_RANGE = (0.01, 100.0)
MAX_PENALTY_LAST_N = 1 << 20
_INT32_LIMIT = 1 << 31
_MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS


def cache_root() -> Path:
    """UMA Serve's folder in the user's cache directory (its models, its prefix cache's
    files): $UMA_CACHE_DIR, else $XDG_CACHE_HOME/uma-serve or ~/.cache/uma-serve."""
    base = os.environ.get("UMA_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "uma-serve"


def _in_range(name: str, value: object, low: float, high: float, note: str = "") -> float:
    """value as a float, if low <= value <= high."""
    number = checks.number(name, value)
    if not low <= number <= high:
        raise InvalidRequestError(
            f"{name} must be in [{low:g}, {high:g}]{note}, not {shown(value)}")
    return number


def check_sampling(
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    repeat_penalty: float,
    frequency_penalty: float,
    presence_penalty: float,
    penalty_last_n: int,
    seed: int,
) -> None:
    """Raises InvalidRequestError naming the first sampler option out of range: the ranges the
    native sampler can hold and compute with (32-bit floats, C ints, a 64-bit seed)."""
    _in_range("temperature", temperature, 0.0, MAX_TEMPERATURE, " (0 is greedy)")
    if not 0 <= checks.integer("top_k", top_k) < _INT32_LIMIT:
        raise InvalidRequestError(
            f"top_k must be in [0, 2**31) (0 disables it), not {shown(top_k)}")
    if not 0.0 < checks.number("top_p", top_p) <= 1.0:
        raise InvalidRequestError(f"top_p must be in (0, 1], not {shown(top_p)}")
    _in_range("min_p", min_p, 0.0, 1.0)
    _in_range("repeat_penalty", repeat_penalty, *REPEAT_PENALTY_RANGE, " (1 disables it)")
    _in_range("frequency_penalty", frequency_penalty, -2.0, 2.0)
    _in_range("presence_penalty", presence_penalty, -2.0, 2.0)
    if not 0 <= checks.integer("penalty_last_n", penalty_last_n) <= MAX_PENALTY_LAST_N:
        raise InvalidRequestError(
            f"penalty_last_n must be in [0, {MAX_PENALTY_LAST_N}], not {shown(penalty_last_n)}")
    if not 0 <= checks.integer("seed", seed) < 1 << 64:
        raise InvalidRequestError(f"seed must be in [0, 2**64), not {shown(seed)}")


def check_masks(masks: object, mask_index: object, n_rows: int, n_vocab: int
                ) -> tuple[Any, Any]:
    """Token masks for n_rows logits rows as a sampler takes them (constrained decoding):
    (uint32 (k, ceil(n_vocab / 32)), int32 (n_rows,), -1 for an unconstrained row), or
    (None, None) when none are given. InvalidRequestError naming a bad shape or index."""
    if masks is None and mask_index is None:
        return None, None
    import numpy as np  # here: the settings load without numpy (`uma --help`)

    words = (n_vocab + 31) // 32
    m = np.ascontiguousarray(masks, dtype=np.uint32)
    i = np.ascontiguousarray(mask_index, dtype=np.int32)
    if m.ndim != 2 or m.shape[1] != words:
        raise InvalidRequestError(f"masks must have shape (k, {words})")
    if i.shape != (n_rows,):
        raise InvalidRequestError("mask_index must hold one entry per row")
    if i.size and (i.max() >= m.shape[0] or i.min() < -1):
        raise InvalidRequestError(f"mask_index must be in [-1, {m.shape[0]})")
    return m, i


MAX_LOGIT_BIAS = 1024  # tokens one request may bias
MAX_TOP_LOGPROBS = 20  # most probable tokens reported beside each sampled one (OpenAI's cap)


def check_logit_bias(value: object, n_vocab: int | None = None
                     ) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias as (token, bias) pairs sorted by token: a map (token ids as
    integers or their decimal text, as JSON keys are) or (token, bias) pairs; each bias in
    [-100, 100] (-100 all but bans the token, 100 all but forces it). InvalidRequestError
    naming what is wrong; an id the vocabulary (of n_vocab tokens) lacks too."""
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)) and all(
            isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        items = [tuple(p) for p in value]
    else:
        raise InvalidRequestError("logit_bias must map token ids to biases")
    if len(items) > MAX_LOGIT_BIAS:
        raise InvalidRequestError(f"logit_bias may hold at most {MAX_LOGIT_BIAS} tokens")
    pairs = {}
    for token, bias in items:
        # JSON keys are text; more than 10 digits is no C int (and int() of 4300 would fail)
        if isinstance(token, str) and token.isdecimal() and len(token) <= 10:
            token = int(token)
        if isinstance(token, bool) or not isinstance(token, int) or token < 0 or (
                n_vocab is not None and token >= n_vocab):
            raise InvalidRequestError(f"logit_bias has a key that is no token id: {shown(token)}")
        pairs[token] = _in_range(f"logit_bias[{token}]", bias, -100.0, 100.0)
    return tuple(sorted(pairs.items()))


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens. temperature 0 is greedy (the default)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int = 0
    max_tokens: int = 256
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    logprobs: bool = False
    # also the log-probabilities of the most probable tokens at each step, up to
    # MAX_TOP_LOGPROBS (OpenAI's top_logprobs); more than 0 implies logprobs
    top_logprobs: int = 0
    cache_prompt: bool = True  # reuse a cached prefix of the prompt (llama-server's name)
    # special-token text in a text prompt ("<|im_start|>", FIM markers) read as those tokens,
    # as llama-server reads a completion's prompt; False keeps all of it plain text
    parse_special: bool = True
    # added to these tokens' logits (OpenAI's): (token, bias) pairs, or a map when given
    logit_bias: tuple[tuple[int, float], ...] = ()
    # guess tokens ahead and verify them in one pass: "ngram" (prompt lookup), "draft" (the
    # engine's draft model), "off", or None for the engine's default (EngineConfig.speculation)
    speculation: str | None = None

    def __post_init__(self) -> None:
        check_sampling(**{name: getattr(self, name) for name in _SAMPLER_OPTIONS})
        if checks.integer("max_tokens", self.max_tokens) < 1:
            raise InvalidRequestError(f"max_tokens must be >= 1, not {shown(self.max_tokens)}")
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (tuple, list)) or not all(isinstance(s, str) for s in stop):
            raise InvalidRequestError("stop must be a string or a list of strings")
        if any(s == "" for s in stop):
            raise InvalidRequestError("stop strings must not be empty")
        object.__setattr__(self, "stop", tuple(stop))
        object.__setattr__(self, "logit_bias", check_logit_bias(self.logit_bias))
        for name in ("ignore_eos", "logprobs", "cache_prompt", "parse_special"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"{name} must be a boolean")
        if self.speculation is not None and self.speculation not in SPECULATION:
            raise InvalidRequestError(
                f"speculation must be one of {', '.join(SPECULATION)}, "
                f"not {shown(self.speculation)}")
        if not 0 <= checks.integer("top_logprobs", self.top_logprobs) <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(
                f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], not {shown(self.top_logprobs)}")
        if self.top_logprobs:
            object.__setattr__(self, "logprobs", True)

    @property
    def device_capable(self) -> bool:
        """Whether the device's samplers compute what these options ask: all but log-probs,
        the penalties (whose history the host sampler keeps) and logit biases."""
        return not self.logprobs and self.repeat_penalty == 1 and not self.frequency_penalty \
            and not self.presence_penalty and not self.logit_bias

    def device_options(self) -> DeviceOptions:
        """The fields uma._core.Context.set_sampler takes."""
        greedy = self.temperature < GREEDY_BELOW
        return DeviceOptions(temperature=0.0 if greedy else self.temperature, top_k=self.top_k,
                             top_p=self._top_p32, min_p=self.min_p, seed=self.seed)

    def sampler_options(self) -> dict[str, Any]:
        """The fields the native sampler takes (uma._core.Sampler.configure). A temperature
        below GREEDY_BELOW is greedy: dividing logits by it would overflow a 32-bit float."""
        options = {name: getattr(self, name) for name in _SAMPLER_OPTIONS}
        if self.temperature < GREEDY_BELOW:
            options["temperature"] = 0.0
        options["top_p"] = self._top_p32
        if self.logit_bias:
            options["logit_bias"] = self.logit_bias
        return options

    @property
    def _top_p32(self) -> float:
        """top_p as the samplers' 32-bit float can hold it: a top_p below its smallest normal
        (5e-324 passes as a double) would become 0, which they refuse; the smallest normal
        keeps the meaning, the most probable token alone."""
        return max(self.top_p, FLOAT32_TINY)


class DeviceOptions(TypedDict):
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int


# how a request guesses tokens ahead (SamplingParams.speculation, EngineConfig.speculation)
SPECULATION = ("off", "ngram", "draft")

_SAMPLER_OPTIONS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty",
                    "frequency_penalty", "presence_penalty", "penalty_last_n", "seed")


EMBEDDING_POOLING = ("auto", "mean", "cls", "last")
_KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
# the design notes' short names for the quantised types llama.cpp's KV cache has
_KV_ALIASES = {"q8": "q8_0", "q5": "q5_0", "q4": "q4_0"}


@dataclass(frozen=True)
class EngineConfig:
    """Everything uma.Engine needs to load a model and run it."""

    model: str
    n_ctx: int = 4096  # KV cache positions in all (shared by the sequences when kv_unified)
    n_seq_max: int = 8  # requests decoded at once; more wait in the queue
    # most tokens in one decode call: as llama-server's, so that a long prompt with no stream
    # to protect goes in whole, and a pause beside streams is as long as its time allows (at
    # 512, a GPU's pauses were cut to a fraction of their time)
    n_batch: int = 2048
    # most tokens in one physical compute step (llama.cpp splits a decode call into these);
    # None: the smaller of n_batch and 512, llama-server's default, which sizes the compute
    # buffers
    n_ubatch: int | None = None
    n_threads: int | None = None  # None: the cores this process may use (at most 16)
    n_threads_batch: int | None = None
    n_gpu_layers: int = -1  # layers offloaded to the GPU when there is one; -1: all
    # an MoE's experts per token (1..its experts per layer): fewer read fewer bytes per decode
    # token at some cost in quality; 0: the model's own. Fixed at load (llama.cpp builds it
    # into the graph), refused for a dense model
    n_expert_used: int = 0
    kv_unified: bool = True  # one KV buffer shared by all sequences
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: str = "auto"
    # sample on the device (llama.cpp's backend samplers) where a request's options allow:
    # "auto" where the model runs on a CUDA GPU (with at most 16 sequences), "on", or "off"
    # (the host sampler for every row)
    device_sampling: str = "auto"
    # publish a tick's tokens while the device runs the next decode: "auto" where the model
    # runs on a GPU (a decode call returns once queued there), "on" or "off"
    overlap: str = "auto"
    policy: str = "bound"  # the latency bound, or "baseline" (docs/design/scheduling.md)
    tick_target_ms: float = 30.0  # the baseline policy's tick time budget
    latency_cap: float = 1.20  # the streams' gap p95 allowed, relative to their own
    tick_budget_ms: float | None = None  # a fixed tick line instead of the cap
    bmt_budget_gbps: float | None = None  # memory bandwidth for ticks; None: probe on CPU, 0: off
    max_queue: int = 1024  # requests waiting beyond this are refused
    # prefix cache: finished requests' KV kept for prompts that start the same (0: off; needs
    # kv_unified), in at most this many spare sequences and prefix_cache_tokens tokens (None:
    # half the context)
    prefix_cache: int = 8
    prefix_cache_tokens: int | None = None
    prefix_cache_ram_mb: int = 1024  # host memory for entries that leave the KV cache (0: none)
    # disk for snapshots that outlive the process (uma.engine.prefix_disk), in
    # prefix_cache_dir (None: the user's cache directory); read back at the next start. 0
    # (off) for an embedded engine; the daemon's default is on (uma.server.settings)
    prefix_cache_disk_mb: int = 0
    prefix_cache_dir: str | None = None
    # the scheduling policy's knobs given (the config file's [slo] table), as (name, value)
    # pairs (hashable, so the config stays frozen; a dict is taken too); the rest keep their
    # policy's defaults (uma.knobs)
    slo: tuple[tuple[str, float | int | bool], ...] = ()
    # fair share between apps (uma.sched.fair): each app's weight, as (name, weight) pairs or a
    # dict (apps not named weigh 1); fair_share off: first come, first served within a class
    app_weights: tuple[tuple[str, float], ...] = ()
    fair_share: bool = True
    # running background requests give their KV sequences to interactive requests waiting for
    # one, at the next token boundary (uma.sched.demotion); off: they keep them until they end
    preempt_at_token: bool = True
    # chat messages' template (uma.templates): a built-in name (chatml, llama2, llama3) or a
    # Jinja file; None: the model's own, else ChatML
    chat_template: str | None = None
    # fair share's time slice: an app served this many tick ms (per unit of weight) beyond
    # one waiting for a sequence gives it one; None: half the largest recent request's cost
    fair_quantum_ms: float | None = None
    # each app's own latency_cap, as (name, cap) pairs or a dict (others: latency_cap); the
    # bound policy holds a tick to the lowest cap among the apps decoding in it
    app_latency_caps: tuple[tuple[str, float], ...] = ()
    # embeddings (Engine.embed): the most tokens of one input, and so of the second context
    # that pools them (made at the first request); and how it pools: the model's own ('auto',
    # else mean), 'mean', 'cls' or 'last'
    embedding_ctx: int = 2048
    embedding_pooling: str = "auto"
    # llama.cpp RPC workers ("host:port"; a list, or 'H:P,H:P') whose devices hold layers of
    # the model (`uma rpc-worker`, or llama.cpp's rpc-server); tensor_split: each device's
    # share of the offloaded layers, workers first then local GPUs (empty: by free memory)
    rpc: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] = ()
    # background requests in a second context on the same weights, of this many KV positions
    # (0: off, they share the interactive requests' KV), running background_seqs at once in
    # the time the streams' policy grants it before their ticks (uma.engine.background): their cells
    # never slow the streams' attention, and a background tick pays a decode call of its own
    background_ctx: int = 0
    background_seqs: int = 2
    # requests that do not choose: "ngram" guesses tokens ahead from each request's own text,
    # "draft" with draft_model, and verifies them in the tick's one decode call, where the
    # guesses pay (uma.sched.speculation); "off" decodes a token per tick. Not given: "draft"
    # where a draft model is, else "off"
    speculation: str = ""
    # a small GGUF with the model's vocabulary that guesses for "draft" (uma.engine.
    # draft_model): loaded beside the model, on the same devices, with a context of its own
    draft_model: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise InvalidRequestError("model must be a path to a GGUF file")
        for name in ("n_ctx", "n_seq_max", "n_batch", "max_queue", "embedding_ctx"):
            if not 1 <= checks.integer(name, getattr(self, name)) < _INT32_LIMIT:  # C ints
                raise InvalidRequestError(
                    f"{name} must be in [1, 2**31), not {getattr(self, name)}")
        ubatch = self.n_ubatch
        if ubatch is not None and not 1 <= checks.integer("n_ubatch", ubatch) <= self.n_batch:
            raise InvalidRequestError(
                f"n_ubatch must be in [1, n_batch={self.n_batch}], not {ubatch}")
        for name in ("n_threads", "n_threads_batch"):
            value = getattr(self, name)
            if value is not None and not 1 <= checks.integer(name, value) < _INT32_LIMIT:
                raise InvalidRequestError(f"{name} must be in [1, 2**31), not {value}")
        if not -1 <= checks.integer("n_gpu_layers", self.n_gpu_layers) < _INT32_LIMIT:
            raise InvalidRequestError(
                f"n_gpu_layers must be in [-1, 2**31) (-1: all), not {self.n_gpu_layers}")
        if not 0 <= checks.integer("n_expert_used", self.n_expert_used) <= _MAX_EXPERTS:
            raise InvalidRequestError(
                f"n_expert_used must be in [0, {_MAX_EXPERTS}] (0: the model's own), "
                f"not {self.n_expert_used}")
        for name in ("type_k", "type_v"):
            value = getattr(self, name)
            if value in _KV_ALIASES:
                object.__setattr__(self, name, value := _KV_ALIASES[value])
            if value == "q6":
                raise InvalidRequestError(
                    f"{name} must be one of {', '.join(_KV_TYPES)} (or q8, q5, q4): llama.cpp "
                    f"has no 6-bit KV cache type, the nearest are q8_0 and q5_1, not 'q6'")
            if value not in _KV_TYPES:
                raise InvalidRequestError(
                    f"{name} must be one of {', '.join(_KV_TYPES)} (or q8, q5, q4), not "
                    f"{value!r}")
        if self.embedding_pooling not in EMBEDDING_POOLING:
            raise InvalidRequestError(f"embedding_pooling must be one of "
                                      f"{', '.join(EMBEDDING_POOLING)}, not "
                                      f"{self.embedding_pooling!r}")
        if self.flash_attn not in ("auto", "on", "off"):
            raise InvalidRequestError(
                f"flash_attn must be 'auto', 'on' or 'off', not {self.flash_attn!r}")
        for name in ("device_sampling", "overlap"):
            if getattr(self, name) not in ("auto", "on", "off"):
                raise InvalidRequestError(
                    f"{name} must be 'auto', 'on' or 'off', not {getattr(self, name)!r}")
        if not isinstance(self.kv_unified, bool):
            raise InvalidRequestError("kv_unified must be a boolean")
        if checks.number("tick_target_ms", self.tick_target_ms) <= 0:
            raise InvalidRequestError(f"tick_target_ms must be > 0, not {self.tick_target_ms}")
        if checks.number("latency_cap", self.latency_cap) < 1.0:
            raise InvalidRequestError(f"latency_cap must be >= 1, not {self.latency_cap}")
        if self.tick_budget_ms is not None and checks.number(
                "tick_budget_ms", self.tick_budget_ms) <= 0:
            raise InvalidRequestError(f"tick_budget_ms must be > 0, not {self.tick_budget_ms}")
        if self.bmt_budget_gbps is not None and checks.number(
                "bmt_budget_gbps", self.bmt_budget_gbps) < 0:
            raise InvalidRequestError(f"bmt_budget_gbps must be >= 0, not {self.bmt_budget_gbps}")
        if not 0 <= checks.integer("background_ctx", self.background_ctx) < _INT32_LIMIT:
            raise InvalidRequestError(
                f"background_ctx must be in [0, 2**31) (0: off), not {self.background_ctx}")
        if not 1 <= checks.integer("background_seqs", self.background_seqs) <= 64:
            raise InvalidRequestError(
                f"background_seqs must be in [1, 64], not {self.background_seqs}")
        if 0 < self.background_ctx < self.background_seqs:
            raise InvalidRequestError(
                f"background_ctx ({self.background_ctx}) must hold at least one position for "
                f"each of background_seqs ({self.background_seqs})")
        if not 0 <= checks.integer("prefix_cache", self.prefix_cache) <= 64:
            raise InvalidRequestError(
                f"prefix_cache must be in [0, 64] (0: off), not {self.prefix_cache}")
        if self.prefix_cache_tokens is not None and not 0 <= checks.integer(
                "prefix_cache_tokens", self.prefix_cache_tokens) < _INT32_LIMIT:
            raise InvalidRequestError(
                f"prefix_cache_tokens must be in [0, 2**31), not {self.prefix_cache_tokens}")
        for name in ("prefix_cache_ram_mb", "prefix_cache_disk_mb"):
            if not 0 <= checks.integer(name, getattr(self, name)) < 1 << 24:
                raise InvalidRequestError(
                    f"{name} must be in [0, 2**24), not {getattr(self, name)}")
        if self.prefix_cache_dir is not None and (not isinstance(self.prefix_cache_dir, str)
                                                  or not self.prefix_cache_dir):
            raise InvalidRequestError("prefix_cache_dir must be a folder's path")
        if self.policy not in ("bound", "baseline"):
            raise InvalidRequestError(
                f"policy must be 'bound' or 'baseline', not {self.policy!r}")
        if self.speculation == "":
            object.__setattr__(self, "speculation",
                               "off" if self.draft_model is None else "draft")
        if self.speculation not in SPECULATION:
            raise InvalidRequestError(f"speculation must be one of {', '.join(SPECULATION)}, "
                                      f"not {self.speculation!r}")
        if self.draft_model is not None and (not isinstance(self.draft_model, str)
                                             or not self.draft_model):
            raise InvalidRequestError("draft_model must be a path to a GGUF file")
        if self.speculation == "draft" and self.draft_model is None:
            raise InvalidRequestError("speculation 'draft' needs a draft model (draft_model, "
                                      "--draft-model)")
        if self.chat_template is not None and (not isinstance(self.chat_template, str)
                                               or not self.chat_template):
            raise InvalidRequestError("chat_template must be a built-in name or a file path")
        if not isinstance(self.fair_share, bool):
            raise InvalidRequestError("fair_share must be a boolean")
        if not isinstance(self.preempt_at_token, bool):
            raise InvalidRequestError("preempt_at_token must be a boolean")
        if self.fair_quantum_ms is not None and checks.number(
                "fair_quantum_ms", self.fair_quantum_ms) <= 0:
            raise InvalidRequestError(f"fair_quantum_ms must be > 0, not {self.fair_quantum_ms}")
        object.__setattr__(self, "rpc", check_endpoints(self.rpc))
        object.__setattr__(self, "tensor_split", _shares(self.tensor_split))
        object.__setattr__(self, "app_weights",
                           _per_app("app_weights", self.app_weights, app_weight))
        object.__setattr__(self, "app_latency_caps",
                           _per_app("app_latency_caps", self.app_latency_caps, _latency_cap))
        object.__setattr__(self, "slo", check_knobs(self.slo))

    @property
    def ubatch(self) -> int:
        """The physical step llama.cpp computes a decode call in (n_ubatch, its default)."""
        return self.n_ubatch if self.n_ubatch is not None else min(self.n_batch, 512)


def check_endpoint(value: object, field: str = "rpc") -> str:
    """'host:port' with a host name or an IPv4 address (llama.cpp's RPC client splits at the
    first colon: no IPv6), port in [1, 65535]; InvalidRequestError naming the field
    otherwise."""
    if not isinstance(value, str) or value.strip().count(":") != 1:
        raise InvalidRequestError(f"{field}: {value!r} is not host:port (IPv6 addresses are "
                                  f"not supported by llama.cpp's RPC)")
    host, _, port = value.strip().partition(":")
    if not host or any(c.isspace() or c in ",[]" for c in host):
        raise InvalidRequestError(f"{field}: {value!r} has no valid host")
    if not port.isdecimal() or not 1 <= int(port) <= 65535:
        raise InvalidRequestError(f"{field}: {value!r} needs a port in [1, 65535]")
    return f"{host}:{int(port)}"


def check_endpoints(value: object, field: str = "rpc") -> tuple[str, ...]:
    """A list of endpoints, or 'H:P,H:P'; each checked, none twice."""
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise InvalidRequestError(f"{field} must be host:port endpoints")
    out = tuple(check_endpoint(v, field) for v in value)
    if len(set(out)) != len(out):
        raise InvalidRequestError(f"{field} names an endpoint twice")
    return out


def _shares(value: object) -> tuple[float, ...]:
    """tensor_split: a list of numbers >= 0 (or '1,1,2'), not all zero; at most 16."""
    if isinstance(value, str):
        value = [v for v in value.replace("/", ",").split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or len(value) > 16:
        raise InvalidRequestError("tensor_split must be at most 16 numbers")
    try:
        shares = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise InvalidRequestError(f"tensor_split must be numbers, not {value!r}") from None
    if any(not 0 <= x < float("inf") for x in shares) or (shares and not any(shares)):
        raise InvalidRequestError("tensor_split shares must be >= 0, and not all 0")
    return shares


def _per_app(field: str, value: object,
             check: Callable[[object, str], float]) -> tuple[tuple[str, float], ...]:
    """(name, value) pairs, checked, sorted by name; a dict, or 'NAME=V,NAME=V' (the
    setting's form), is taken too."""
    if isinstance(value, str):
        value = [_pair(field, item) for item in value.split(",") if item.strip()]
    try:
        pairs = dict(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise InvalidRequestError(
            f"{field} must map app names to numbers, or be (name, number) pairs") from None
    return tuple(sorted((app_name(name, f"an {field} name"), check(v, f"{field}[{name!r}]"))
                        for name, v in pairs.items()))


def _pair(field: str, item: str) -> tuple[str, float]:
    name, eq, number = item.strip().partition("=")
    try:
        if not eq:
            raise ValueError
        return name.strip(), float(number)
    except ValueError:
        raise InvalidRequestError(
            f"{field} must be NAME=NUMBER pairs separated by commas, not {item!r}") from None


def _latency_cap(value: object, field: str) -> float:
    cap = checks.number(field, value)
    if not 1.0 <= cap <= 100.0:
        raise InvalidRequestError(f"{field} must be in [1, 100], not {value!r}")
    return cap


@dataclass(frozen=True)
class ServerConfig:
    """The daemon's socket and limits (the engine's settings are an EngineConfig)."""

    socket: str  # Unix socket path
    max_connections: int = 64
    max_inflight: int = 16  # requests in flight on one connection
    max_prompt_bytes: int = 1 << 20  # UTF-8 bytes of a prompt (or of all chat messages)
    max_tokens: int = 4096  # cap on a request's max_tokens (more is refused, not clamped)
    default_max_tokens: int = 256  # for requests that name none
    idle_timeout_s: float = 300.0  # close connections with no request for this long
    max_frame_bytes: int | None = None  # largest request frame; None: request_bytes_limit()
    # Request bytes buffered across all connections: a frame's length is reserved from this
    # when its prefix arrives, and a connection whose frame does not fit is not read until
    # earlier frames are done (docs/guide/socket-protocol.md, "Limits").
    max_input_bytes: int = 32 << 20
    frame_timeout_s: float = 30.0  # a frame must arrive whole this long after it began
    max_outbuf_bytes: int = 8 << 20  # output a slow reader may fall behind before it is dropped
    grace_s: float = 5.0  # on SIGTERM/SIGINT: time in-flight requests get to finish
    http: str | None = None  # "host:port" of the OpenAI-compatible HTTP gateway; None: off
    api_key: str | None = field(default=None, repr=False)  # required as a Bearer token on /v1
    allow_public: bool = False  # serve HTTP beyond loopback without an api_key
    http_max_connections: int = 64  # more are answered 503 and closed
    http_header_timeout_s: float = 10.0  # a request's headers must arrive within this
    http_body_timeout_s: float = 30.0  # its body, within this once the headers are in
    http_max_body_bytes: int | None = None  # largest request body; None: request_bytes_limit()
    scorecard_interval_s: float = 0.0  # the scorecard logged this often (0: off)
    scorecard_csv: str | None = None  # ... and appended to this CSV file
    models_dir: str | None = None  # GGUF files the listings offer; None: the model cache
    max_loaded: int = 3  # models loaded at once (uma.host)
    keep_alive_s: float = 300.0  # a model loaded on demand stays this long idle (-1: for good)
    max_loaded_mb: int = 0  # most MB the loaded models' weights and KV caches take (0: no cap)

    def __post_init__(self) -> None:
        if not isinstance(self.socket, str) or not self.socket:
            raise InvalidRequestError("socket must be a path")
        if len(self.socket.encode()) > 100:
            raise InvalidRequestError(
                f"socket path is {len(self.socket.encode())} bytes; Unix sockets allow ~100")
        for name in ("max_frame_bytes", "http_max_body_bytes"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, request_bytes_limit(self.max_prompt_bytes))
        for name in ("max_connections", "max_inflight", "max_prompt_bytes", "max_tokens",
                     "default_max_tokens", "max_frame_bytes", "max_input_bytes",
                     "max_outbuf_bytes", "http_max_connections", "http_max_body_bytes"):
            if not 1 <= checks.integer(name, getattr(self, name)) < 1 << 32:
                raise InvalidRequestError(
                    f"{name} must be in [1, 2**32), not {getattr(self, name)}")
        if self.max_input_bytes < self.max_frame_bytes:
            raise InvalidRequestError(
                f"max_input_bytes ({self.max_input_bytes}) must be at least max_frame_bytes "
                f"({self.max_frame_bytes}): the largest frame must fit in the input budget")
        for name in ("idle_timeout_s", "frame_timeout_s", "grace_s", "http_header_timeout_s",
                     "http_body_timeout_s"):
            if checks.number(name, getattr(self, name)) <= 0:
                raise InvalidRequestError(f"{name} must be > 0, not {getattr(self, name)}")
        if checks.number("scorecard_interval_s", self.scorecard_interval_s) < 0:
            raise InvalidRequestError(
                f"scorecard_interval_s must be >= 0 (0: off), not {self.scorecard_interval_s}")
        if self.scorecard_csv is not None:
            if not isinstance(self.scorecard_csv, str) or not self.scorecard_csv.strip():
                raise InvalidRequestError("scorecard_csv must be a file path")
            if not self.scorecard_interval_s:
                raise InvalidRequestError("scorecard_csv needs scorecard_interval_s > 0 (how "
                                          "often a row is written)")
        if not 1 <= checks.integer("max_loaded", self.max_loaded) < 1 << 16:
            raise InvalidRequestError(f"max_loaded must be in [1, 65536), not {self.max_loaded}")
        if not 0 <= checks.integer("max_loaded_mb", self.max_loaded_mb) < 1 << 32:
            raise InvalidRequestError(
                f"max_loaded_mb must be MB in [0, 2**32) (0: no cap), not {self.max_loaded_mb}")
        keep = checks.number("keep_alive", self.keep_alive_s)
        if keep < 0 and keep != -1:
            raise InvalidRequestError(
                f"keep_alive must be seconds >= 0, or -1 (until unloaded), not {keep}")
        if self.models_dir is not None and (not isinstance(self.models_dir, str)
                                            or not self.models_dir.strip()):
            raise InvalidRequestError("models_dir must be a folder's path")
        if self.api_key is not None and (
                not isinstance(self.api_key, str) or not self.api_key.strip()
                or self.api_key != self.api_key.strip()):
            raise InvalidRequestError("api_key must be non-empty text without surrounding spaces")
        if not isinstance(self.allow_public, bool):
            raise InvalidRequestError("allow_public must be a boolean")
        if self.http is not None:
            host, _ = parse_http_address(self.http)
            if not is_loopback(host) and self.api_key is None and not self.allow_public:
                raise InvalidRequestError(
                    f"refusing to serve HTTP on {self.http} (beyond this machine) without an API "
                    f"key; give --api-key-file (or --api-key), or --allow-public to serve it "
                    f"to anyone who can reach it")


def default_socket_path() -> str:
    """Where the daemon listens unless told otherwise, and so where clients look for it.

    $UMA_SOCKET if set; else uma.sock in $XDG_RUNTIME_DIR (per user, private, emptied at
    logout); else /tmp/uma-UID.sock. The daemon calls this too, so both meet without settings.
    """
    path = os.environ.get("UMA_SOCKET")
    if path:
        return path
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir:
        return os.path.join(runtime_dir, "uma.sock")
    return f"/tmp/uma-{os.getuid()}.sock"


def request_bytes_limit(max_prompt_bytes: int) -> int:
    """The default size limit of one request (a socket frame, an HTTP body): room for a prompt
    of max_prompt_bytes written with escapes ("\\n", "\\u00e9" take two bytes and more), and
    for the fields around it."""
    return 2 * max_prompt_bytes + (64 << 10)


def parse_http_address(address: object) -> tuple[str, int]:
    """'host:port', '[v6 host]:port' or a bare port (on 127.0.0.1) as (host, port)."""
    if not isinstance(address, str) or not address:
        raise InvalidRequestError(f"http must be 'host:port' or a port, not {address!r}")
    host, sep, port = address.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", address
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not port.isdigit() or int(port) > 65535:
        raise InvalidRequestError(
            f"http must be 'host:port' (port 0-65535; 0 picks a free one), not {address!r}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """True only for addresses that never leave this machine. Any other name counts as public:
    what it resolves to can change."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
