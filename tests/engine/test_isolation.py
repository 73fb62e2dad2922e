"""Isolation is a property of the engine: whatever fails for one request, at any step of the
tick (admission, batching, decoding, sampling) or of its output (detokenising, stop strings,
the consumer's listener), ends that request alone; the others' output is unchanged.

Faults are injected by wrapping the runner's core objects (sampler, context) or the output
stage's per-request stream in test doubles that raise for a poisoned request, marked by its
seed. The production code paths are the ones every request takes."""

import threading

import pytest

import uma
from uma.engine import output
from uma.errors import DecodeError, UmaError

from ..helpers import assert_same_greedy

POISON = 666  # the seed that marks a poisoned request
VICTIM = "Once upon a time, in a land far away, there lived a"
N = 24


@pytest.fixture(scope="module")
def solo(tiny_path):
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=1) as e:
        return e.generate(VICTIM, max_tokens=N, ignore_eos=True, logprobs=True)


@pytest.fixture
def engine(tiny_path):
    # The failures are injected into the host sampler: on a GPU the device samples by default.
    with uma.Engine(tiny_path, n_ctx=2048, n_seq_max=4, device_sampling="off") as e:
        yield e


class Proxy:
    """Delegates to `target`; `method` raises `error` whenever `involves(args, kwargs)`."""

    def __init__(self, target, method, involves, error):
        self._target, self._method, self._involves, self._error = (
            target, method, involves, error)
        self.raised = 0

    def __getattr__(self, name):
        attr = getattr(self._target, name)
        if name != self._method:
            return attr

        def call(*args, **kwargs):
            if self._involves(args, kwargs):
                self.raised += 1
                raise self._error
            return attr(*args, **kwargs)
        return call


def poisoned(engine, seqs):
    running = engine._scheduler.running
    return any(running[s].params.seed == POISON for s in seqs if s in running)


def run_beside_victim(engine, solo, *, poisoned_requests=1):
    """Starts the victim, lets it decode a few tokens, then submits the poisoned requests and
    a healthy neighbour; returns (victim, poisoned results, neighbour)."""
    victim = engine.submit(VICTIM, max_tokens=N, ignore_eos=True, logprobs=True)
    for _ in range(4):
        next(victim)  # the victim is decoding: the poison arrives mid-stream
    bad = [engine.submit("x", max_tokens=8, ignore_eos=True, temperature=0.5, seed=POISON)
           for _ in range(poisoned_requests)]
    neighbour = engine.submit("Hello", max_tokens=8, ignore_eos=True)
    result = victim.result(timeout=60)
    assert result.finish_reason == "length"
    assert_same_greedy(solo.token_ids, result.token_ids, solo.logprobs, result.logprobs)
    return result, [b.result(timeout=60) for b in bad], neighbour.result(timeout=60)


def assert_serves_on_and_frees_its_cache(engine):
    assert engine.generate("again", max_tokens=4, ignore_eos=True).finish_reason == "length"
    engine.close()
    snap = engine.snapshot()
    assert snap["kv_cells_used"] == 0 and snap["requests_running"] == 0


def test_a_request_whose_admission_fails_ends_alone(engine, solo):
    runner = engine._scheduler.runner
    runner.sampler = Proxy(runner.sampler, "configure", lambda a, kw: kw.get("seed") == POISON,
                           ValueError("boom in configure"))
    _, [bad], neighbour = run_beside_victim(engine, solo)
    assert bad.finish_reason == "error" and "boom in configure" in str(bad.error)
    assert bad.usage.completion_tokens == 0
    assert neighbour.finish_reason == "length"
    assert_serves_on_and_frees_its_cache(engine)


def test_a_request_whose_sampling_fails_ends_alone(engine, solo):
    runner = engine._scheduler.runner
    proxy = runner.sampler = Proxy(runner.sampler, "sample",
                                   lambda a, kw: poisoned(engine, list(a[2])),
                                   UmaError("boom in sampling"))
    _, [bad], neighbour = run_beside_victim(engine, solo)
    assert proxy.raised >= 2  # the batched call, then the poisoned row alone
    assert bad.finish_reason == "error" and str(bad.error) == "boom in sampling"
    assert neighbour.finish_reason == "length" and neighbour.usage.completion_tokens == 8
    assert_serves_on_and_frees_its_cache(engine)


class CorruptingSampler:
    """The real sampler, except that configuring a poisoned request (at its admission)
    corrupts the tokens it is about to prefill with an id past the vocabulary."""

    def __init__(self, engine):
        self._ex = engine._scheduler
        self._sampler = self._ex.runner.sampler
        self._bad_id = engine.model.n_vocab + 5

    def __getattr__(self, name):
        return getattr(self._sampler, name)

    def configure(self, slot, **options):
        self._sampler.configure(slot, **options)
        if options["seed"] == POISON:
            req = self._ex.running[slot]
            req.tokens = req.tokens.copy()
            req.tokens[-1] = self._bad_id


def test_a_failed_decode_is_narrowed_to_the_requests_that_fail_alone(engine, solo):
    # The batch holding a poisoned request's tokens is refused by the real context, and the
    # tick has to find whose tokens those were.
    engine._scheduler.runner.sampler = CorruptingSampler(engine)
    _, bad, neighbour = run_beside_victim(engine, solo, poisoned_requests=2)
    for result in bad:
        assert result.finish_reason == "error"
        assert "outside the vocabulary" in str(result.error)
        assert result.usage.completion_tokens == 0
    assert neighbour.finish_reason == "length" and neighbour.usage.completion_tokens == 8
    assert_serves_on_and_frees_its_cache(engine)


def test_a_context_that_fails_every_decode_ends_each_request_with_the_cause(engine):
    runner = engine._scheduler.runner
    real = runner.ctx
    runner.ctx = Proxy(real, "decode", lambda a, kw: True,
                       DecodeError("llama_decode failed with code -3: GPU fault", -3))
    results = [engine.generate(p, max_tokens=4) for p in ("a", "b", "c")]
    assert all(r.finish_reason == "error" and "GPU fault" in str(r.error) for r in results)
    runner.ctx = real  # the fault clears: the engine serves again, with a clean cache
    assert_serves_on_and_frees_its_cache(engine)


class PoisonedStream(output._Stream):
    """The output stage's per-request state, with one part failing for poisoned requests."""

    part = "text"  # which part: "text" (detokenising) or "stops" (stop strings)

    def __init__(self, model, req):
        super().__init__(model, req)
        if req.params.seed == POISON:
            setattr(self, self.part, Failing())


class Failing:
    def __getattr__(self, name):
        def fail(*args, **kwargs):
            raise RuntimeError(f"boom in {name}")
        return fail


@pytest.mark.parametrize("part, method", [("text", "push"), ("stops", "feed")])
def test_a_request_whose_output_fails_ends_alone(engine, solo, monkeypatch, part, method):
    monkeypatch.setattr(PoisonedStream, "part", part)
    monkeypatch.setattr(output, "_Stream", PoisonedStream)
    _, [bad], neighbour = run_beside_victim(engine, solo)
    assert bad.finish_reason == "error" and f"boom in {method}" in str(bad.error)
    assert bad.text == ""  # nothing of it was shown
    assert neighbour.finish_reason == "length" and neighbour.usage.completion_tokens == 8
    assert_serves_on_and_frees_its_cache(engine)


def test_a_request_whose_listener_fails_ends_alone(engine, solo):
    victim = engine.submit(VICTIM, max_tokens=N, ignore_eos=True, logprobs=True)
    for _ in range(4):
        next(victim)
    bad = engine.submit("x", max_tokens=8, ignore_eos=True)

    def listener(handle):
        if threading.current_thread().name == "uma-output":
            raise RuntimeError("boom in the listener")

    bad.listen(listener)
    result = victim.result(timeout=60)
    assert_same_greedy(solo.token_ids, result.token_ids, solo.logprobs, result.logprobs)
    failed = bad.result(timeout=60)
    assert failed.finish_reason == "error" and "boom in the listener" in str(failed.error)
    assert_serves_on_and_frees_its_cache(engine)


def test_a_tick_whose_statistics_fail_ends_what_is_in_flight_and_serving_goes_on(engine):
    # A bug in the statistics (a division by zero once) reaches the compute thread's
    # recovery, which ends every request in flight with the cause; its own flush must not
    # meet the same failing report again, or the thread stops and every request waits for ever.
    stats = engine._scheduler.stats
    real = stats.record
    bad = []  # the first report: it fails whenever it is recorded, as a bug in it would

    def record(report):
        if not bad:
            bad.append(report)
        if report is bad[0]:
            raise ZeroDivisionError("float division by zero")
        real(report)

    stats.record = record
    result = engine.submit("a", max_tokens=8, ignore_eos=True).result(timeout=30)
    assert result.finish_reason == "error" and "ZeroDivisionError" in str(result.error)
    assert_serves_on_and_frees_its_cache(engine)
