"""uma.Engine: one model, one context, many concurrent requests, one llama_decode per tick.

Apps embed it directly; the daemon wraps it. Three kinds of threads meet here:

* callers (any thread or event loop) tokenize and submit requests, then consume their handles;
* the compute thread runs the scheduler's ticks and sleeps on a condition when there is no work;
* the output thread detokenises and publishes events (uma.engine.output), overlapping the next
  decode.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import importlib
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar, cast

import numpy as np

from uma import grammar as uma_grammar
from uma import infill as uma_infill
from uma import templates
from uma import tools as uma_tools
from uma.app import DEFAULT_APP, app_name, app_weight
from uma.config import EngineConfig, SamplingParams, check_logit_bias
from uma.embeddings import EmbeddingJob, Embeddings, inputs_of
from uma.engine import rpc_workers
from uma.engine.background import BackgroundLane
from uma.engine.calibration import KeptTiming, build_id, machine_id
from uma.engine.contexts import Contexts
from uma.engine.device_share import DeviceShare
from uma.engine.draft_model import ModelDrafter
from uma.engine.output import OutputStage
from uma.engine.prefix_cache import KvPrefixCache
from uma.engine.prefix_disk import DiskTier, state_key
from uma.engine.prefix_disk import default_dir as default_disk_dir
from uma.engine.scheduler import Scheduler
from uma.errors import (
    ClosedError,
    ContextOverflowError,
    EngineBusyError,
    EngineFailedError,
    InvalidRequestError,
    UmaError,
)
from uma.handle import RequestHandle, Result
from uma.metrics import Registry
from uma.priority import Priority
from uma.request import Request
from uma.sched import speculation
from uma.sched.bmt import BmtModel, machine_bandwidth_gbps
from uma.sched.policies import create_policy
from uma.scorecard import Reading, rss_bytes, scorecard
from uma.templates import ChatTemplate

log = logging.getLogger("uma.engine")
T = TypeVar("T")

Progress = Callable[[float], object]  # a load's fraction done; returning False cancels it


Messages = Sequence[Mapping[str, Any]]  # chat messages (uma.templates.checked_messages)
Prompt = str | Sequence[int] | np.ndarray | Messages


_GPU_BACKENDS = {"cuda", "metal", "vulkan"}  # what uma._core.backends() may name besides cpu
DEVICE_SAMPLING_MAX_SEQ = 16  # device_sampling=auto: sequences beyond which the host samples


def _gpu_devices(core: ModuleType) -> list[dict[str, Any]]:
    """This machine's GPU devices, as ggml found them at run time. A GPU backend compiled in
    may find none (a Vulkan build on a machine without a Vulkan GPU): the model then runs on
    the CPU. RPC workers' devices are another machine's and do not count."""
    return [d for d in core.devices()
            if d["type"] in ("gpu", "igpu") and d["backend"] != "RPC"]


class Engine:
    """Continuous batching over one llama.cpp context. Thread-safe and asyncio-friendly.

    >>> with Engine("model.gguf", n_seq_max=8) as engine:
    ...     print(engine.generate("Once upon a time", max_tokens=32).text)
    """

    # where the device's timing is kept across starts (from_config's timing_dir)
    _timing_dir: str | os.PathLike[str] | None = None

    def __init__(self, model: str | os.PathLike[str], *, progress: Progress | None = None,
                 core: ModuleType | None = None, calibrate: bool = True,
                 **config: Any) -> None:
        self._start(EngineConfig(model=os.fspath(model), **config), progress, core, calibrate)

    @classmethod
    def from_config(cls, config: EngineConfig, *, progress: Progress | None = None,
                    core: ModuleType | None = None, calibrate: bool = True,
                    beside_others: bool = False,
                    timing_dir: str | os.PathLike[str] | None = None) -> Engine:
        """progress: optional callable(fraction) observed while the model loads. core: the
        module with Model, Context, Batch, Sampler and backends (uma._core; tests pass a
        stand-in, uma.testing.fake_core). calibrate: time the device before serving
        (uma.engine.calibration); False starts the cost model from its prior and lets it learn
        from the first ticks. beside_others: other models serve meanwhile (uma.host), so the
        device is not timed (its scratch decodes would take the cores from their streams for
        seconds) and the model and its context are made at the lowest CPU priority
        (_at_idle_priority). timing_dir: a folder where the device's timing is kept for the
        next start with the same model, settings and machine (uma.engine.calibration.
        KeptTiming; the daemon's), and read from where it was."""
        engine = cls.__new__(cls)
        engine._timing_dir = timing_dir
        engine._start(config, progress, core, calibrate and not beside_others, beside_others)
        return engine

    def _start(self, config: EngineConfig, progress: Progress | None,
               core_module: ModuleType | None, calibrate: bool = True,
               quietly: bool = False) -> None:
        # Imported here: the engine's module loads without the compiled core (uma.fake_core).
        core = core_module if core_module is not None else importlib.import_module("uma._core")
        self.config = config
        self._calibrate = calibrate
        self._weights = dict(config.app_weights)
        self._caps = dict(config.app_latency_caps)
        self._closed = False
        # background requests' own context, if any, and both contexts' schedulers as one
        self._lane: BackgroundLane | None = None
        self._cond = threading.Condition()
        self._inbox: list[Request] = []
        self._core = core
        # embeddings requests, run a decode at a time between ticks (uma.embeddings), by an
        # embeddings context made at the first
        self._jobs: collections.deque[EmbeddingJob] = collections.deque()
        self._embedder: Any = None
        self._submitting = 0  # callers tokenizing right now (they use the model)
        self._reprioritize: list[tuple[Request, Priority]] = []
        self._closing: str | None = None  # None, "drain" or "cancel"
        self._poked = False
        self._rids = itertools.count(1)
        self.metrics = Registry()
        self._origin = Reading.origin(time.monotonic())  # the scorecard's "since start"
        self._active = self.metrics.counter(
            "active_seconds_total", "wall time with a generate request queued or running")
        # set once a ggml abort held the compute thread (a lost RPC worker): every request
        # ends with it, and nothing more is served
        self.failure: str | None = None
        self._add_rpc_workers(config, core)
        made = _at_idle_priority if quietly else _now
        self.model = made(lambda: core.Model(
            config.model, n_gpu_layers=config.n_gpu_layers, progress=progress,
            tensor_split=config.tensor_split, n_expert_used=config.n_expert_used))
        try:
            self.chat_template = self._chat_template(config.chat_template)
            # constrained decoding; masks on a thread pool where the host's cores are free
            self.grammars = uma_grammar.Grammars(
                self.model, parallel=self._on_gpu("auto", config, core))
            # how the model writes tool calls: as its template says, else as the system
            # message given for a template without tools asks (uma.tools)
            source = self.chat_template.source
            self.tool_format = uma_tools.format_of(source) if uma_tools.takes_tools(source) \
                else "generic"
            n_seq = config.n_seq_max + self._cache_seqs(config, core)
            self.ctx = made(lambda: core.Context(
                self.model, n_ctx=config.n_ctx, n_batch=config.n_batch, n_ubatch=config.ubatch,
                n_seq_max=n_seq, kv_unified=config.kv_unified, type_k=config.type_k,
                type_v=config.type_v, flash_attn=config.flash_attn, n_threads=config.n_threads,
                n_threads_batch=config.n_threads_batch,
                n_outputs_per_seq=self._outputs_per_seq(config)))
        except BaseException:
            self.model.close()
            raise
        self.n_ctx_seq = self.ctx.n_ctx_seq
        try:
            draft = self._draft_model(config, core, made)
        except BaseException:
            self.ctx.close()
            self.model.close()
            raise
        self._output = OutputStage(self.model, on_stop=self._poke, metrics=self.metrics)
        policy = create_policy(config.policy, config)
        spare = range(config.n_seq_max, self.ctx.n_seq_max)
        budget = (self.ctx.n_ctx // 2 if config.prefix_cache_tokens is None
                  else config.prefix_cache_tokens)
        prefix = KvPrefixCache(self.ctx, spare, budget, config.prefix_cache_ram_mb << 20,
                               self._disk_tier(config, core)) if spare and budget else None
        if prefix is not None and prefix.disk is not None:
            warmed = prefix.warm()
            if warmed:
                log.info("prefix cache: %d prompts read back from %s", warmed, prefix.disk.dir)
        self._scheduler = Scheduler(self.ctx, policy, self._output, self.metrics, core,
                                  n_running=config.n_seq_max, prefix=prefix,
                                  bmt=BmtModel.of(self.model, config.type_k),
                                  bmt_budget_gbps=self._bandwidth(config, core),
                                  device_sampling=self._device_sampling(config, core),
                                  overlap=self._on_gpu(config.overlap, config, core),
                                  fair_share=config.fair_share,
                                  demote=config.preempt_at_token,
                                  fair_quantum_ms=config.fair_quantum_ms,
                                  grammars=self.grammars, speculation=config.speculation,
                                  draft=draft,
                                  # a newcomer noted between ticks holds back a long prompt
                                  # tick only while it waits to be taken in
                                  newcomer_waiting=self._arrived)
        self._submitted = self.metrics.counter("requests_submitted_total", "requests accepted")
        self.metrics.gauge("slots_total", "requests decoded at once (KV sequences)").set(
            config.n_seq_max)
        self.metrics.gauge("kv_cells_total", "KV cache positions in all").set(self.ctx.n_ctx)
        try:
            self._lane = self._background_lane(config, core)
        except BaseException:
            self._scheduler.close()
            self.ctx.close()
            self.model.close()
            raise
        self._contexts = Contexts(self._scheduler, self._lane)
        self._ready = threading.Event()  # set once calibrated: requests are then served at once
        self._thread = threading.Thread(target=self._compute, name="uma-compute", daemon=True)
        self._thread.start()
        if config.rpc:
            threading.Thread(target=self._watch_aborts, name="uma-abort-watch",
                             daemon=True).start()

    def _draft_model(self, config: EngineConfig, core: ModuleType,
                     made: Callable[[Callable[[], Any]], Any]) -> ModelDrafter | None:
        """The draft model's drafter, where config.draft_model names one: loaded on the
        model's devices, refused (InvalidModelError) where its vocabulary is not the model's,
        with a context of the streams' size and sequences (uma.engine.draft_model)."""
        if config.draft_model is None:
            return None
        model = made(lambda: core.Model(config.draft_model, n_gpu_layers=config.n_gpu_layers,
                                        tensor_split=config.tensor_split))
        try:
            ModelDrafter.check_vocabulary(model, self.model)
            ctx = made(lambda: core.Context(
                model, n_ctx=config.n_ctx, n_batch=min(config.n_batch, 512),
                n_seq_max=config.n_seq_max, kv_unified=config.kv_unified,
                type_k=config.type_k, type_v=config.type_v, flash_attn=config.flash_attn,
                n_threads=config.n_threads, n_threads_batch=config.n_threads_batch))
        except BaseException:
            model.close()
            raise
        try:
            return ModelDrafter(ctx, core, on_device=self._device_sampling(config, core))
        except BaseException:
            ctx.close()
            model.close()
            raise

    def _background_lane(self, config: EngineConfig, core: ModuleType
                         ) -> BackgroundLane | None:
        """Background requests' own context, when configured (uma.engine.background)."""
        if not config.background_ctx:
            return None
        ctx = core.Context(
            self.model, n_ctx=config.background_ctx, n_batch=config.n_batch,
            n_ubatch=config.ubatch, n_seq_max=config.background_seqs,
            kv_unified=config.kv_unified, type_k=config.type_k, type_v=config.type_v,
            flash_attn=config.flash_attn, n_threads=config.n_threads,
            n_threads_batch=config.n_threads_batch)
        self.metrics.gauge("background_kv_cells_total",
                           "KV positions of the background context").set(ctx.n_ctx)
        lane = BackgroundLane(ctx, self._output, self.metrics, core,
                              device_sampling=self._device_sampling(config, core))
        # its ticks' bytes count in the scorecard's ΣBMT too (its policy sets no budget, so
        # it plans the same with the model as without)
        lane.scheduler.bmt = self._scheduler.bmt
        return lane

    @staticmethod
    def _outputs_per_seq(config: EngineConfig) -> int:
        """Logits rows a device-sampled sequence may have in a decode: a verify item's where
        requests speculate by default (larger sampling graphs otherwise buy nothing; a request
        that asks for speculation itself is then sampled on the host)."""
        if config.speculation == "off":
            return 1
        return min(1 + speculation.MAX_DRAFT, config.n_batch)

    @staticmethod
    def _add_rpc_workers(config: EngineConfig, core: ModuleType) -> None:
        """Registers config.rpc's workers as devices before the model loads; a worker that
        does not listen within a few seconds (rpc_workers.WAIT_S) fails the start, naming
        it. From here on a ggml abort (what llama.cpp's RPC client does when a worker is lost
        mid-run) holds its thread instead of ending the process (_watch_aborts)."""
        if not config.rpc:
            return
        for endpoint in config.rpc:
            if not rpc_workers.wait_until_listening(endpoint):
                log.warning("the RPC worker at %s did not listen within %.0f s", endpoint,
                            rpc_workers.WAIT_S)
        core.hold_aborts()
        devices = [d for endpoint in config.rpc for d in core.rpc_add_worker(endpoint)]
        log.info("RPC workers %s: devices %s", ", ".join(config.rpc), ", ".join(devices))

    def _watch_aborts(self) -> None:
        """Waits for a ggml abort to hold a thread: the compute thread, inside a decode, when
        an RPC worker is lost. It never comes back, so this thread ends every request in
        flight with the failure, and submit() refuses new ones; the process stays up to say
        so (health) until it is restarted."""
        message = self._core.wait_for_abort()
        if message is None:  # the engine closed first
            return
        failure = (f"the engine stopped: {message.strip()}. An RPC worker was probably "
                   f"lost; restart the daemon once the workers are back")
        log.critical("%s", failure)
        with self._cond:
            self.failure = failure
            queued, self._inbox = self._inbox, []
            self._cond.notify_all()
        for k, scheduler in enumerate(self._contexts.schedulers):
            scheduler.abandon(queued if k == 0 else [], EngineFailedError(failure))

    @staticmethod
    def _bandwidth(config: EngineConfig, core: ModuleType) -> float:
        """The ΣBMT budget: as configured, or probed where the model's memory is host memory
        (CPU builds). A discrete GPU's bandwidth cannot be probed from here: off unless given."""
        if config.bmt_budget_gbps is not None:
            return config.bmt_budget_gbps
        if core.backends() == ("cpu",) or config.n_gpu_layers == 0 or not _gpu_devices(core):
            return machine_bandwidth_gbps()
        return 0.0

    @staticmethod
    def _disk_tier(config: EngineConfig, core: ModuleType) -> DiskTier | None:
        """Where the prefix cache's snapshots outlive the process (prefix_cache_disk_mb), in a
        folder of their model, KV types and llama.cpp build; None where off or the folder
        cannot be made (the cache goes on in memory)."""
        if config.prefix_cache_disk_mb <= 0 or config.prefix_cache_ram_mb <= 0:
            return None
        root = Path(config.prefix_cache_dir).expanduser() if config.prefix_cache_dir \
            else default_disk_dir()
        key = state_key(model=config.model, type_k=config.type_k, type_v=config.type_v,
                        flash_attn=config.flash_attn, llama_commit=core.llama_commit())
        try:
            return DiskTier(root, key, config.prefix_cache_disk_mb << 20)
        except OSError as exc:
            log.warning("prefix cache: no disk tier in %s (%s); prompts are kept in memory "
                        "only", root, exc)
            return None

    @staticmethod
    def _cache_seqs(config: EngineConfig, core: ModuleType) -> int:
        """Spare sequences for the prefix cache: with one KV buffer for all sequences a cached
        prefix shares its cells with the request that made it and with those that reuse it.
        With a buffer per sequence each spare one would take its share of the context from
        the requests, so the cache is off there."""
        if not config.kv_unified or config.prefix_cache_tokens == 0:
            return 0
        room = int(core.max_parallel_sequences()) - config.n_seq_max
        # and one more, kept empty, through which entries leaving for host memory are copied
        # in slices (uma.engine.snapshots)
        spares = max(0, min(config.prefix_cache, room))
        scratch = spares > 0 and config.prefix_cache_ram_mb > 0 and room > spares
        return spares + scratch

    @classmethod
    def _device_sampling(cls, config: EngineConfig, core: ModuleType) -> bool:
        """auto: on a CUDA GPU, with at most DEVICE_SAMPLING_MAX_SEQ sequences. llama.cpp's
        backend samplers are one sub-graph per sequence: under CUDA, with a large vocabulary,
        they beat copying the logits to the host at a few streams and lose to it at many, where
        one arg-max kernel per sequence outweighs one copy of every row
        (docs/results/gpu-speed.md). Under Vulkan they lost a little even at one stream
        (docs/lab/2026-11-25-vulkan-traced.md); on Metal they are unmeasured, and unified
        memory makes the copy they save cheap."""
        if config.device_sampling == "auto":
            if config.n_seq_max > DEVICE_SAMPLING_MAX_SEQ:
                return False
            if not any(d["backend"] == "CUDA" for d in _gpu_devices(core)):
                return False
        return cls._on_gpu(config.device_sampling, config, core)

    @staticmethod
    def _on_gpu(setting: str, config: EngineConfig, core: ModuleType) -> bool:
        """An auto/on/off setting that pays where the model runs on a GPU: device sampling
        (the device's arg-max saves copying each logits row, 512 KB with a 128k vocabulary,
        and the host's pass over it; on a CPU it runs slower than the host sampler) and
        overlapped ticks (a GPU decode call returns once queued; a CPU one once done)."""
        if setting != "auto":
            return setting == "on"
        return (bool(_GPU_BACKENDS & set(core.backends())) and config.n_gpu_layers != 0
                and bool(_gpu_devices(core)))

    # --- submitting ------------------------------------------------------------------------

    def submit(self, prompt: Prompt, params: SamplingParams | None = None, *,
               priority: str | Priority = "interactive", app: str | None = None,
               weight: float | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
               tool_choice: object = None, response_format: object = None,
               grammar: str | None = None, **options: Any) -> RequestHandle:
        """Queues a request and returns its handle at once.

        prompt: text, token ids, or chat messages ([{'role': ..., 'content': ...}], rendered
        with the model's chat template). options override fields of params (SamplingParams).
        app: who sends it, for fair share between apps ('default' if None); weight: its app's
        share relative to others' (None: the app_weights setting's, else 1).
        tools, tool_choice: OpenAI's, for chat messages (uma.tools); the result's tool_calls
        hold the calls the model made. tool_choice 'required' or a named function makes the
        answer a call (a grammar constrains it).
        response_format (OpenAI's: json_object, json_schema) or grammar (GBNF): what the
        output must match, token by token (uma.grammar).
        Raises InvalidRequestError (and subclasses) for input that can never run.
        """
        choice, use_tools, constraint = self._answer_shape(prompt, tools, tool_choice,
                                                           response_format, grammar)
        app = DEFAULT_APP if app is None else app_name(app)
        weight = self._weights.get(app, 1.0) if weight is None else app_weight(weight)
        params = params or SamplingParams()
        if options:
            try:
                params = dataclasses.replace(params, **options)
            except TypeError as exc:
                raise InvalidRequestError(str(exc)) from None
        prio = Priority.parse(priority)
        if params.speculation == "draft" and self.config.draft_model is None:
            raise InvalidRequestError("speculation 'draft' needs a draft model, and this "
                                      "engine has none (draft_model, --draft-model)")
        if params.logit_bias:  # ids the vocabulary lacks: refused now, not at admission
            check_logit_bias(params.logit_bias, self.model.n_vocab)
        with self._using_model():
            tokens = self.render_chat(cast(Messages, prompt), tools, choice) if use_tools \
                else self._tokens(prompt, params.parse_special)
            matcher = None if constraint is None else self.grammars.matcher(constraint)
        room = self._contexts.room(prio)
        if len(tokens) > room:
            raise ContextOverflowError(
                f"prompt has {len(tokens)} tokens; the context holds {room} per sequence")
        with self._cond:
            if self._closing or self._closed:
                raise ClosedError("engine is closed")
            if self.failure is not None:
                raise EngineFailedError(self.failure)
            if len(self._inbox) + self._contexts.n_waiting >= self.config.max_queue:
                raise EngineBusyError(
                    f"{self.config.max_queue} requests are already waiting; try again later")
            rid = next(self._rids)
            req = Request(rid, tokens, params, prio, time.monotonic_ns(), app, weight,
                          self._caps.get(app, 0.0))
            req.tool_format = self.tool_format if use_tools else None
            req.matcher = matcher
            req.handle = RequestHandle(rid, functools.partial(self._cancel, req))
            req.handle._request = req
            self._inbox.append(req)
            self._submitted.inc()
            self._cond.notify()
        if prio is Priority.INTERACTIVE:
            # its first tick waits for no other prompt's long tick, nor a background decode
            self._contexts.interrupt(len(tokens))
        return req.handle

    def _answer_shape(self, prompt: Prompt, tools: Sequence[Mapping[str, Any]] | None,
                      tool_choice: object, response_format: object, grammar: object
                      ) -> tuple[str | None, bool, uma_grammar.Constraint | None]:
        """The checked tool choice, whether tools go into the prompt, and what constrains
        the answer: a response_format or grammar, or the call tool_choice requires."""
        if (tools is not None or tool_choice is not None) and (
                isinstance(prompt, str) or not len(prompt)
                or not all(isinstance(m, Mapping) for m in prompt)):
            raise InvalidRequestError("tools and tool_choice go with chat messages")
        choice = uma_tools.check_tool_choice(
            tool_choice, None if tools is None else uma_tools.check_tools(list(tools)))
        use_tools = bool(tools) and choice != "none"
        constraint = uma_grammar.constraint_of(response_format, grammar)
        if use_tools and choice not in (None, "auto"):
            if constraint is not None:
                raise InvalidRequestError("a required tool call and response_format or "
                                          "grammar cannot both constrain the answer")
            constraint = uma_grammar.tool_call(
                tools or (), None if choice == "required" else choice, self.tool_format)
        return choice, use_tools, constraint

    def tokenize(self, text: str, *, add_special: bool = True,
                 parse_special: bool = False) -> list[int]:
        """Text to token ids with the model's tokenizer (add_special: the BOS the model puts
        before a prompt; parse_special: special-token text as those tokens)."""
        if not isinstance(text, str):
            raise InvalidRequestError("text must be a string")
        with self._using_model():
            tokens = self.model.tokenize(text, add_special=add_special,
                                         parse_special=parse_special)
        return [int(t) for t in tokens]

    def infill_tokens(self, prefix: str, suffix: str,
                      extra: Sequence[uma_infill.Chunk] = (), prompt: str = "") -> np.ndarray:
        """A fill-in-the-middle prompt's token ids, laid out as llama-server's /infill lays
        them (uma.infill): submit() them as the prompt. InvalidRequestError where the model has
        no FIM tokens."""
        with self._using_model():
            model = self.model

            def tokenize(text: str) -> list[int]:
                return [int(t) for t in model.tokenize(text, add_special=False)]

            tokens = uma_infill.prompt_tokens(
                tokenize, model.fim_tokens, prefix=prefix, suffix=suffix, extra=extra,
                prompt=[int(t) for t in model.tokenize(prompt, add_special=False,
                                                       parse_special=True)],
                bos=model.bos if model.add_bos else None, n_batch=self.config.n_batch,
                n_ctx=self.n_ctx_seq)
        return np.asarray(tokens, dtype=np.int32)

    def submit_embeddings(self, inputs: object, *, normalize: bool = True
                          ) -> Future[Embeddings]:
        """Queues inputs (a text, token ids, or a list of either; OpenAI's forms) to be pooled
        into one vector each (uma.embeddings); the future gets the Embeddings. Each input is
        tokenised as a prompt (special-token text as those tokens, as llama-server does) and
        must hold 1 to embedding_ctx tokens."""
        if not isinstance(normalize, bool):
            raise InvalidRequestError("normalize must be a boolean")
        forms = inputs_of(inputs)
        limit = self.config.embedding_ctx
        with self._using_model():
            # special-token text read as those tokens, as llama-server reads embeddings input
            tokens = [self.model.tokenize(x, parse_special=True) if isinstance(x, str)
                      else self.model._token_array(x) for x in forms]
        for i, t in enumerate(tokens):
            if not 0 < len(t) <= limit:
                where = "input" if len(tokens) == 1 else f"input[{i}]"
                raise InvalidRequestError(
                    f"{where} has {len(t)} tokens; an input takes 1 to {limit} "
                    f"(embedding_ctx)")
        job = EmbeddingJob([np.asarray(t, np.int32) for t in tokens], normalize)
        with self._cond:
            if self._closing or self._closed:
                raise ClosedError("engine is closed")
            if self.failure is not None:
                raise EngineFailedError(self.failure)
            if len(self._jobs) >= self.config.max_queue:
                raise EngineBusyError(f"{self.config.max_queue} embeddings requests are "
                                      f"already waiting; try again later")
            self._jobs.append(job)
            self._cond.notify()
        return job.future

    def embed(self, inputs: object, *, normalize: bool = True,
              timeout: float | None = None) -> Embeddings:
        """submit_embeddings(), waited for."""
        return self.submit_embeddings(inputs, normalize=normalize).result(timeout)

    def detokenize(self, tokens: Sequence[int] | np.ndarray) -> str:
        """Token ids to text (special tokens as their text); InvalidTokenError for an id the
        vocabulary does not have."""
        with self._using_model():
            return str(self.model.detokenize(self.model._token_array(tokens),
                                             unparse_special=True))

    @contextlib.contextmanager
    def _using_model(self) -> Iterator[None]:
        """The model stays open while a caller's thread uses it: close() frees it only once
        no caller is tokenising, templating or compiling a grammar."""
        with self._cond:
            if self._closing or self._closed:
                raise ClosedError("engine is closed")
            self._submitting += 1
        try:
            yield
        finally:
            with self._cond:
                self._submitting -= 1
                self._cond.notify_all()

    def generate(self, prompt: Prompt, params: SamplingParams | None = None, *,
                 priority: str | Priority = "interactive", **options: Any) -> Result:
        """Runs one request to the end and returns its result."""
        return self.submit(prompt, params, priority=priority, **options).result()

    def chat(self, messages: Sequence[dict[str, str]], params: SamplingParams | None = None, *,
             priority: str | Priority = "interactive", **options: Any) -> Result:
        """generate() for chat messages, rendered with the model's chat template."""
        if isinstance(messages, str) or not isinstance(messages, Sequence):
            raise InvalidRequestError("chat() takes a list of {'role', 'content'} messages")
        return self.generate(list(messages), params, priority=priority, **options)

    def _chat_template(self, choice: str | None) -> ChatTemplate:
        """The template chat messages are rendered with (uma.templates), with the model's own
        BOS and EOS texts."""
        name, source = templates.source_of(choice, self.model.chat_template)
        model = self.model

        def text(token: int) -> str:
            return model.token_to_piece(token, special=True).decode("utf-8", "replace") \
                if token >= 0 else ""
        return ChatTemplate(source, name=name, bos_token=text(model.bos),
                            eos_token=text(model.eos))

    def render_chat(self, messages: Sequence[Mapping[str, Any]],
                    tools: Sequence[Mapping[str, Any]] | None = None,
                    tool_choice: str | None = None) -> np.ndarray:
        """Chat messages as prompt tokens: checked, rendered with the chat template (and the
        tools, where given: in the template where it takes them, else as a system message),
        then tokenised with special tokens parsed. Where the template writes the BOS text
        itself and the model adds BOS when tokenising, the text's is dropped: one BOS."""
        msgs = uma_tools.template_messages(templates.checked_messages(messages))
        if not uma_tools.takes_tools(self.chat_template.source):
            msgs = uma_tools.as_plain_turns(msgs)
            if tools:
                msgs = uma_tools.with_system_prompt(
                    msgs, uma_tools.system_prompt(tools, tool_choice))
                tools = None
        text = self.chat_template.render(msgs, tools=tools or None)
        bos = self.chat_template.bos_token
        if bos and self.model.add_bos and text.startswith(bos):
            text = text[len(bos):]
        return np.asarray(self.model.tokenize(text, parse_special=True), dtype=np.int32)

    def _tokens(self, prompt: Prompt, parse_special: bool = True) -> np.ndarray:
        if isinstance(prompt, str):
            tokens = self.model.tokenize(prompt, parse_special=parse_special)
        elif isinstance(prompt, (bytes, bytearray)):
            raise InvalidRequestError("prompt must be text (str), token ids or chat messages")
        elif len(prompt) and all(isinstance(m, dict) for m in prompt):
            tokens = self.render_chat(cast(Messages, prompt))
        else:
            try:
                tokens = np.asarray(prompt)
            except (TypeError, ValueError):
                raise InvalidRequestError("prompt must be text, token ids or messages") from None
            if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
                raise InvalidRequestError("token ids must be a flat sequence of integers")
            tokens = self.model._token_array(tokens)
        if len(tokens) == 0:
            raise InvalidRequestError("the prompt is empty")
        return np.asarray(tokens, dtype=np.int32)

    def set_priority(self, handle: RequestHandle, priority: str | Priority) -> None:
        """Promotes or demotes a queued or running request; it takes effect at the next tick."""
        prio = Priority.parse(priority)
        request = handle._request
        if not isinstance(request, Request):
            raise InvalidRequestError("that handle is not one of this engine's requests")
        with self._cond:
            self._reprioritize.append((request, prio))
            self._cond.notify()

    def _cancel(self, req: Request) -> None:
        req.cancelled = True
        self._poke()

    def _poke(self) -> None:
        with self._cond:
            self._poked = True
            self._cond.notify()

    # --- the compute thread ------------------------------------------------------------------

    def _compute(self) -> None:
        contexts = self._contexts
        # Timing on this thread keeps the constructor quick; the decodes themselves run on the
        # process's one decode thread, as every decode does (uma._core.decode_thread).
        if self._calibrate:
            self._scheduler.calibrate(self._kept_timing())
        if self._lane is not None:  # the same device and weights: the same prices to start
            self._lane.scheduler.adopt_calibration(self._scheduler.timing)
        self._scheduler.speculator.warm_up()
        self._ready.set()
        busy_since = 0.0  # when this turn began, if a request was in the engine then
        while True:
            if busy_since:  # the turn that just ended had requests: active time
                self._active.inc(time.perf_counter() - busy_since)
            if contexts.idle:
                contexts.rest()
            with self._cond:
                while not (self._inbox or self._poked or self._closing or self._reprioritize
                           or self._jobs or contexts.busy):
                    self._cond.wait()
                inbox, self._inbox, self._poked = self._inbox, [], False
                changes, self._reprioritize = self._reprioritize, []
                closing = self._closing
            for req in inbox:
                contexts.enqueue(req)
            for req, prio in changes:
                contexts.move(req, prio)
            if closing == "cancel":
                contexts.release_all("cancelled")
                self._end_jobs()
            if closing and contexts.idle and not self._jobs:
                return
            busy_since = 0.0 if contexts.idle else time.perf_counter()
            if self._jobs:
                self._embed_step()
            contexts.turn(self._arrived)

    def _arrived(self) -> bool:
        """Whether work came in that the compute thread has not taken yet: a request, an
        embeddings job, a close. Read without the lock: an answer a moment late costs one
        more background tick."""
        return bool(self._inbox or self._jobs or self._closing)

    def _embed_step(self) -> None:
        """One decode of the first embeddings request, on this thread between ticks."""
        job = self._jobs[0]
        try:
            if self._embedder is None:
                cfg = self.config
                self._embedder = self._core.Embedder(
                    self.model, n_ctx=cfg.embedding_ctx, pooling=cfg.embedding_pooling,
                    n_threads=cfg.n_threads)
                log.info("embeddings: %s pooling, inputs of up to %d tokens",
                         self._embedder.pooling, cfg.embedding_ctx)
            done = job.step(self._embedder)
        except Exception as exc:  # noqa: BLE001 - this request's alone
            job.fail(exc)
            done = True
        if done:
            with self._cond:
                self._jobs.popleft()

    def _end_jobs(self) -> None:
        with self._cond:
            jobs, self._jobs = list(self._jobs), collections.deque()
        for job in jobs:
            job.fail(ClosedError("engine is closed"))

    # --- status and shutdown -------------------------------------------------------------------

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Waits until the engine has timed the device (a few seconds at start, see
        `calibration`); requests submitted before then wait for it. True once ready."""
        return self._ready.wait(timeout)

    @property
    def calibration(self) -> tuple[int, int]:
        """(scratch decodes done, planned) of the start-up calibration, for progress."""
        return self._scheduler.calibration

    def snapshot(self) -> dict[str, object]:
        """All metrics as a plain dict."""
        snap = self.metrics.snapshot()
        snap["model"] = os.path.basename(self.config.model)  # the one field not a metric
        return snap

    def reading(self) -> Reading:
        """The metrics the scorecard reads, now (uma.scorecard.Reading)."""
        return Reading.of(self.metrics)

    def scorecard(self, since: Reading | None = None, at: Reading | None = None
                  ) -> dict[str, object]:
        """The scorecard (uma.scorecard; docs/design/metrics.md "Scorecard") of the window from
        `since` (default: the engine's start) to `at` (default: now). Safe from any thread."""
        return scorecard(at or self.reading(), since or self._origin,
                         model=os.path.basename(self.config.model),
                         latency_cap=self.config.latency_cap, rss_bytes=rss_bytes(),
                         window="since_start" if since is None else "interval")

    def _kept_timing(self) -> KeptTiming | None:
        """Where the device's timing is kept across starts (from_config's timing_dir), by
        everything it depends on."""
        folder = self._timing_dir
        if folder is None:
            return None
        cfg, ctx = self.config, self.ctx
        try:
            stat = os.stat(cfg.model)
        except OSError:
            return None
        return KeptTiming(folder, {
            "model": os.path.realpath(cfg.model), "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns, "n_ctx": ctx.n_ctx, "n_seq_max": ctx.n_seq_max,
            "n_batch": cfg.n_batch, "ubatch": cfg.ubatch, "kv_unified": cfg.kv_unified,
            "type_k": cfg.type_k, "type_v": cfg.type_v, "flash_attn": cfg.flash_attn,
            "threads": [cfg.n_threads, cfg.n_threads_batch], "gpu_layers": cfg.n_gpu_layers,
            "tensor_split": cfg.tensor_split, "rpc": cfg.rpc,
            "backends": list(self._core.backends()), "core": build_id(self._core),
            "machine": machine_id()})

    def share_device(self, share: DeviceShare) -> None:
        """Takes turns on the device with the other engines of `share` (the other models a
        daemon serves): while one of them has interactive requests and this one has only
        background work, this one runs only in time that one's plan grants it
        (uma.engine.device_share). Call once, before requests arrive."""
        if self._contexts.member is None:
            self._contexts.member = share.join(self._scheduler)

    def requests_in_flight(self) -> int:
        """Generation requests queued or running, in either context. Safe from any thread."""
        n = len(self._scheduler.running) + self._contexts.n_waiting + len(self._inbox)
        if self._lane is not None:
            n += len(self._lane.scheduler.running)
        return n

    def status(self) -> dict[str, object]:
        """What `uma status` shows: slots, queue, load and memory. Safe from any thread."""
        ex = self._scheduler
        n_ctx = self.ctx.n_ctx if not self.ctx.closed else 0
        out: dict[str, object] = {
            "model": os.path.basename(self.config.model),
            "ready": self._ready.is_set(),
            "slots": self.config.n_seq_max,
            "running": len(ex.running),
            "queued": self._contexts.n_waiting + len(self._inbox),  # in either context
            "load": round(ex.load.value(time.monotonic()), 3),
            "kv_cells": {"used": int(ex.m.kv_cells.value), "total": n_ctx,
                         "span": int(ex.m.kv_span.value)},
            "memory": {"rss_bytes": rss_bytes(), "model_bytes": self.model.size_bytes,
                       "kv_bytes": int(ex.bmt.kv_bytes_per_pos * n_ctx) if ex.bmt else 0},
        }
        if self.model.n_expert:  # a mixture of experts, and how many each token reaches
            out["experts"] = {"per_layer": self.model.n_expert,
                              "per_token": self.model.n_expert_used}
        if ex.prefix is not None:  # what the prefix cache holds, and saved each app
            hits, reused = ex.m.app_prefix_hits.children, ex.m.app_prefix_tokens.children
            out["prefix_cache"] = {
                "tokens": ex.prefix.tokens, "ram_bytes": ex.prefix.ram_bytes,
                "hits": int(ex.m.prefix_hits.value), "reused_tokens": int(ex.m.prefix_tokens.value),
                "apps": {app: {"hits": int(c.value),
                               "reused_tokens": int(reused[app].value) if app in reused else 0}
                         for app, c in list(hits.items())}}  # another thread may add an app
        if self._lane is not None:
            bg = self._lane.scheduler
            bg_ctx = self._lane.ctx.n_ctx if not self._lane.ctx.closed else 0
            out["background"] = {
                "slots": self.config.background_seqs, "running": len(bg.running),
                "queued": bg.n_waiting,
                "kv_cells": {"used": int(bg.m.kv_cells.value), "total": bg_ctx}}
        return out

    def close(self, *, cancel: bool = True, timeout: float | None = None) -> None:
        """Stops the engine: in-flight requests end as 'cancelled' (or, with cancel=False,
        run to completion first), threads are joined and native memory is freed. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closing = "cancel" if cancel else "drain"
            self._cond.notify()
        if self.failure is not None:
            # The compute thread is held mid-decode for good: it cannot be joined, and the
            # native state it holds cannot be freed under it; the process's exit frees it.
            self._output.close()
            self._closed = True
            return
        if cancel:  # a decode in flight (a long prompt on a CPU: up to a minute) stops now
            self._contexts.abort()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("the engine did not stop in time")
        self._output.close()
        prefix = self._scheduler.prefix
        if prefix is not None and prefix.disk is not None:
            try:  # nothing runs now: what is cached goes to disk for the next start
                prefix.persist()
            except (OSError, UmaError) as exc:
                log.warning("prefix cache: not saved to disk: %s", exc)
        self._contexts.close()
        with self._cond:
            self._cond.wait_for(lambda: self._submitting == 0)
        self._end_jobs()  # queued after the compute thread's last look
        if self.config.rpc:
            self._core.cancel_abort_waits()  # the watcher ends: nothing aborted
        if self._embedder is not None:
            self._embedder.close()
        self.ctx.close()
        if self._lane is not None:
            self._lane.ctx.close()
        self.model.close()
        self._closed = True

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_thread", None) is not None and not self._closed:
            with contextlib.suppress(Exception):
                self.close()


def _now(make: Callable[[], T]) -> T:
    return make()


def _at_idle_priority(make: Callable[[], T]) -> T:
    """make() on a thread of its own at the lowest CPU priority, for a model loading beside
    others that serve. Reading a model (its vocabulary, repacking its weights for the CPU's
    kernels) keeps a core busy for most of a second: at normal priority that thread took a
    core from a serving model's decode threads, which wait for each other at every step of the
    graph, and stalled its stream for up to 190 ms (16x its p95); at the lowest it runs in the
    time they leave, and the worst gap stayed within 2x (docs/results/several-models.md). Its
    own thread because on Linux a thread's priority is its own and cannot be raised back
    (the compute thread, started later from the caller's thread, keeps normal priority).
    Elsewhere it is made at once."""
    if sys.platform != "linux":
        return make()
    out: list[Any] = []

    def run() -> None:
        with contextlib.suppress(OSError):  # not allowed here: made at normal priority
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            out.append((True, make()))
        except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
            out.append((False, exc))

    thread = threading.Thread(target=run, name="uma-load", daemon=True)
    thread.start()
    thread.join()
    ok, value = out[0]
    if not ok:
        raise value
    return cast(T, value)
