"""uma.Engine end to end on the real core and a tiny synthetic model."""

import asyncio
import threading
import time
import types

import numpy as np
import pytest

import uma
from uma import _core
from uma.config import EngineConfig
from uma.errors import ClosedError, ContextOverflowError, InvalidRequestError, InvalidTokenError

from ..helpers import assert_same_greedy

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog",
    "a b",
    "Once upon a time, in a land far away, there lived a",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15",
    "def main():\n    return 0",
    "🦙 llamas 🦙",
    "One more prompt of middling length here",
]


@pytest.fixture(scope="module", params=["off", "on"], ids=["serial", "overlapped"])
def engine(tiny_path, request):
    """Ticks serial (the CPU's default) and overlapped (the GPU's: a tick's output is handed
    on during the next decode); every test of it holds for both."""
    with uma.Engine(tiny_path, n_ctx=4096, n_seq_max=8, n_batch=256,
                    overlap=request.param) as e:
        yield e


@pytest.fixture(scope="module")
def alone(tiny_path):
    """Greedy results of each prompt generated with nothing else running."""
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=1) as e:
        return {p: e.generate(p, max_tokens=16, ignore_eos=True, logprobs=True) for p in PROMPTS}


def assert_matches_alone(results, prompts, alone, n=16):
    for r, p in zip(results, prompts, strict=True):
        assert_same_greedy(alone[p].token_ids[:n], r.token_ids[:n],
                           alone[p].logprobs[:n], (r.logprobs or ())[:n])


def sixteen():
    return [PROMPTS[i % 8] for i in range(16)]


def test_sixteen_concurrent_requests_match_each_alone(engine, alone):
    handles = [engine.submit(p, max_tokens=16, ignore_eos=True, logprobs=True) for p in sixteen()]
    results = [h.result(timeout=60) for h in handles]
    assert_matches_alone(results, sixteen(), alone)
    assert all(r.finish_reason == "length" and r.usage.completion_tokens == 16 for r in results)


def test_same_through_the_async_iterator(engine, alone):
    async def consume(prompt):
        handle = engine.submit(prompt, max_tokens=16, ignore_eos=True, logprobs=True)
        ids, lps, text = [], [], []
        async for event in handle:
            ids.extend(event.token_ids)
            lps.extend(event.logprobs or ())
            text.append(event.text)
        result = await handle.aresult()
        assert "".join(text) == result.text and tuple(ids) == result.token_ids
        return result

    async def main():
        return await asyncio.gather(*(consume(p) for p in sixteen()))

    assert_matches_alone(asyncio.run(main()), sixteen(), alone)


def test_events_add_up_to_the_result(engine):
    handle = engine.submit("Tell me a story", max_tokens=24, ignore_eos=True)
    events = list(handle)
    result = handle.result()
    assert "".join(e.text for e in events) == result.text
    assert tuple(t for e in events for t in e.token_ids) == result.token_ids
    assert result.usage.prompt_tokens == len(engine.model.tokenize("Tell me a story"))
    assert result.timings.ttft_ms > 0 and len(result.timings.token_ms) == 24
    assert list(result.timings.token_ms) == sorted(result.timings.token_ms)


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_64_requests_on_8_sequences_all_complete_in_order(tiny_path, overlap):
    with uma.Engine(tiny_path, n_ctx=2048, n_seq_max=8, overlap=overlap) as e:
        # prompts of one length: each is due as long after its arrival as the others
        handles = [e.submit(f"{PROMPTS[0]} {i:02d}", max_tokens=4, ignore_eos=True)
                   for i in range(64)]
        results = [h.result(timeout=60) for h in handles]
        assert len({h.rid for h in handles}) == 64
        assert all(r.finish_reason == "length" and len(r.token_ids) == 4 for r in results)
        admitted = [r.timings.admitted_ns for r in results]
        assert admitted == sorted(admitted)  # the one due first first: in order of arrival
        snap = e.snapshot()
        assert snap["requests_length_total"] == 64 and snap["kv_cells_used"] == 0


def test_interactive_is_admitted_before_background(tiny_path):
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=1) as e:
        blocker = e.submit("busy", max_tokens=8, ignore_eos=True)
        bg = [e.submit("later", max_tokens=2, priority="background") for _ in range(3)]
        fg = e.submit("now", max_tokens=2, priority="interactive")
        blocker.result(timeout=30)
        fg_at = fg.result(timeout=30).timings.admitted_ns
        assert all(fg_at < h.result(timeout=30).timings.admitted_ns for h in bg)


def test_a_promoted_request_moves_ahead_in_the_queue(tiny_path):
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=1) as e:
        blocker = e.submit("busy", max_tokens=300, ignore_eos=True)  # outlives the changes
        first_bg = e.submit("early background", max_tokens=2, priority="background")
        late_bg = e.submit("late background", max_tokens=2, priority="background")
        e.set_priority(late_bg, "interactive")
        blocker.result(timeout=30)
        assert (late_bg.result(timeout=30).timings.admitted_ns
                < first_bg.result(timeout=30).timings.admitted_ns)


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_cancel_mid_stream_frees_the_kv(tiny_path, overlap):
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=2, overlap=overlap) as e:
        handle = e.submit("Keep going forever", max_tokens=10_000, ignore_eos=True)
        for seen, _event in enumerate(handle, start=1):
            if seen == 5:
                handle.cancel()
        result = handle.result()
        assert result.finish_reason == "cancelled"
        assert 5 <= result.usage.completion_tokens < 10_000
        assert e.snapshot()["kv_cells_used"] == 0
        # The engine is idle now, so its context can be inspected from this thread.
        assert all(e.ctx.seq_pos_max(s) == -1 for s in range(2))


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_cancel_while_queued(tiny_path, overlap):
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=1, overlap=overlap) as e:
        running = e.submit("first", max_tokens=30, ignore_eos=True)
        queued = e.submit("second", max_tokens=30)
        queued.cancel()
        assert queued.result(timeout=30).finish_reason == "cancelled"
        assert queued.result().usage.completion_tokens == 0
        assert running.result(timeout=30).finish_reason == "length"


def test_stop_string_split_across_tokens_is_caught_and_not_emitted(engine):
    prompt = "Once upon a time"
    plain = engine.generate(prompt, max_tokens=24, ignore_eos=True)
    pieces = [engine.model.token_to_piece(t).decode("utf-8", "replace") for t in plain.token_ids]
    k = next(i for i in range(3, len(pieces) - 1)
             if len(pieces[i].strip()) >= 2 and len(pieces[i + 1].strip()) >= 2)
    stop = pieces[k][-2:] + pieces[k + 1][:2]  # spans the boundary between tokens k and k+1
    handle = engine.submit(prompt, max_tokens=24, ignore_eos=True, stop=[stop])
    emitted = "".join(e.text for e in handle)
    result = handle.result()
    assert result.finish_reason == "stop"
    assert stop not in emitted and emitted == result.text
    assert plain.text.startswith(result.text)
    assert plain.text[len(result.text):].startswith(stop)


def test_prompt_longer_than_the_context_fails_alone(tiny_path):
    with uma.Engine(tiny_path, n_ctx=256, n_seq_max=2) as e:
        others = [e.submit(p, max_tokens=8, ignore_eos=True) for p in PROMPTS[:3]]
        with pytest.raises(ContextOverflowError, match="context holds 256"):
            e.submit("word " * 400)
        assert all(h.result(timeout=30).finish_reason == "length" for h in others)


def test_full_kv_cache_preempts_and_everything_still_matches(tiny_path, alone):
    # Four sequences that each need at least 72 positions share a 256-position cache,
    # whichever four run first (admission goes by when each first token is due).
    with uma.Engine(tiny_path, n_ctx=256, n_seq_max=4, n_batch=64) as e:
        opts = {"ignore_eos": True, "logprobs": True}
        handles = [e.submit(p, max_tokens=70, **opts) for p in PROMPTS]
        ends = [h.result(timeout=60) for h in handles]
        assert all(r.finish_reason == "length" for r in ends)
        assert_matches_alone(ends, PROMPTS, alone)
        assert e.snapshot()["preemptions_total"] > 0


def test_long_prompts_prefill_in_chunks_between_decode_steps(tiny_path, alone):
    # A 16-token batch leaves a long prompt at most 16 tokens a tick, so it takes many ticks
    # while the short ones decode.
    long_prompt = " ".join(f"word{i}" for i in range(120))
    opts = {"ignore_eos": True, "logprobs": True}
    with uma.Engine(tiny_path, n_ctx=2048, n_seq_max=4, n_batch=16) as e:
        short = [e.submit(p, max_tokens=16, **opts) for p in PROMPTS[:3]]
        long = e.submit(long_prompt, max_tokens=8, **opts)
        assert_matches_alone([h.result(timeout=60) for h in short], PROMPTS[:3], alone)
        chunked = long.result(timeout=60)
        assert e.snapshot()["ticks_total"] > len(e.model.tokenize(long_prompt)) // 16
    with uma.Engine(tiny_path, n_ctx=2048, n_seq_max=1) as e:
        whole = e.generate(long_prompt, max_tokens=8, **opts)
    assert_same_greedy(whole.token_ids, chunked.token_ids, whole.logprobs, chunked.logprobs)


def test_chat_uses_the_template(engine):
    result = engine.chat([{"role": "user", "content": "Hi!"}], max_tokens=4)
    expected = engine.model.tokenize(
        engine.model.apply_chat_template([{"role": "user", "content": "Hi!"}]), parse_special=True)
    assert result.usage.prompt_tokens == len(expected)


def test_token_id_prompts_and_seeds(engine):
    ids = engine.model.tokenize("seeded sampling")
    a = engine.generate(ids, max_tokens=12, temperature=1.0, seed=3, ignore_eos=True)
    b = engine.generate(list(ids), max_tokens=12, temperature=1.0, seed=3, ignore_eos=True)
    c = engine.generate(ids, max_tokens=12, temperature=1.0, seed=4, ignore_eos=True)
    assert a.token_ids == b.token_ids != c.token_ids


def test_temperatures_too_small_for_the_samplers_floats_are_greedy(engine):
    greedy = engine.generate("seeded sampling", max_tokens=12, ignore_eos=True)
    for t in (5e-324, 1e-40, 1e-30, 9e-6):  # 1/t overflows a 32-bit float, or nearly
        tiny = engine.generate("seeded sampling", max_tokens=12, ignore_eos=True,
                               temperature=t, seed=5)
        assert tiny.token_ids == greedy.token_ids


def test_device_sampling_gives_the_hosts_greedy_tokens(tiny_path, alone):
    with uma.Engine(tiny_path, n_ctx=4096, n_seq_max=8, n_batch=256,
                    device_sampling="on") as e:
        handles = [e.submit(p, max_tokens=16, ignore_eos=True) for p in sixteen()]
        results = [h.result() for h in handles]
        assert all(e.ctx.device_sampled(s) for s in range(8))  # chains kept for the next
        snap = e.snapshot()  # no decode had a row for the host: no logits row was copied
        assert snap["tokens_copy_free_total"] == snap["tokens_generated_total"] == 16 * 16
    for r, p in zip(results, sixteen(), strict=True):
        assert_same_greedy(alone[p].token_ids, r.token_ids, alone[p].logprobs,
                           alone[p].logprobs)


def test_what_the_device_cannot_sample_stays_on_the_host(tiny_path, alone):
    """Log-probs and penalties need the host sampler: their rows keep their logits, beside
    device rows in the same decode; a seeded draw on the device repeats."""
    # No prefix cache: a finished request's cells stay kept, so the next one is decoded into
    # other cells of the KV buffer, and on lavapipe its logits then differ in their last bits
    with uma.Engine(tiny_path, n_ctx=4096, n_seq_max=4, n_batch=256, device_sampling="on",
                    prefix_cache=0) as e:
        p = PROMPTS[1]
        lp = e.submit(p, max_tokens=16, ignore_eos=True, logprobs=True)
        greedy = e.submit(p, max_tokens=16, ignore_eos=True)
        # a negative penalty favours what was seen: the output repeats itself
        penalised = e.submit(p, max_tokens=16, ignore_eos=True, presence_penalty=-2,
                             frequency_penalty=-2)
        assert lp.result().token_ids == alone[p].token_ids
        assert lp.result().logprobs == pytest.approx(alone[p].logprobs, abs=0.05)
        assert greedy.result().token_ids == alone[p].token_ids
        ids = penalised.result().token_ids
        assert len(set(ids)) < len(ids)
        assert len(set(alone[p].token_ids)) == len(alone[p].token_ids)
        # one after the other, alone (a draw depends on the logits' last bits: batch shapes)
        drawn = [e.generate(p, max_tokens=12, ignore_eos=True, temperature=1.0, seed=3)
                 for _ in range(2)]
        assert drawn[0].token_ids == drawn[1].token_ids != alone[p].token_ids[:12]
        # decodes with host rows copy every row's logits: only the draws alone were copy-free
        snap = e.snapshot()
        assert snap["tokens_copy_free_total"] == 24 < snap["tokens_generated_total"]


def test_a_top_p_too_small_for_the_samplers_floats_keeps_the_top_token(engine):
    """5e-324 passes as a double but is 0 as the samplers' 32-bit float (which they refuse):
    it keeps the most probable token alone, as any tiny top_p does."""
    greedy = engine.generate("seeded sampling", max_tokens=12, ignore_eos=True)
    tiny = engine.generate("seeded sampling", max_tokens=12, ignore_eos=True,
                           temperature=1.0, top_p=5e-324, seed=5)
    assert tiny.finish_reason == "length" and tiny.token_ids == greedy.token_ids


@pytest.mark.parametrize(
    ("prompt", "options", "match"),
    [
        ("x", {"max_tokens": 0}, "max_tokens"),
        ("x", {"temperature": -1}, "temperature"),
        ("x", {"bogus": 1}, "bogus"),
        ("x", {"stop": [""]}, "stop"),
        ("x", {"priority": "urgent"}, "priority"),
        ([], {}, "empty"),
        ([1, 2, 10**9], {}, "outside the vocabulary"),
        ([[1, 2]], {}, "flat"),
        (b"bytes", {}, "text"),
    ],
)
def test_bad_requests_are_refused_at_submit(engine, prompt, options, match):
    with pytest.raises(InvalidRequestError, match=match):
        engine.submit(prompt, **options)


def test_many_threads_submit_at_once(engine, alone):
    results = {}

    def worker(i):
        results[i] = engine.generate(PROMPTS[i % 8], max_tokens=16, ignore_eos=True, logprobs=True)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    prompts = [PROMPTS[i % 8] for i in range(12)]
    assert_matches_alone([results[i] for i in range(12)], prompts, alone)


def engine_threads():
    return [t for t in threading.enumerate() if t.name in ("uma-compute", "uma-output")]


def test_close_with_requests_in_flight(tiny_path):
    before = _core.live_handles()
    threads_before = len(engine_threads())
    e = uma.Engine(tiny_path, n_ctx=1024, n_seq_max=2)
    handles = [e.submit("go on", max_tokens=100_000, ignore_eos=True) for _ in range(4)]
    next(iter(handles[0]))  # the first is streaming
    e.close()
    assert {h.result(timeout=5).finish_reason for h in handles} == {"cancelled"}
    assert len(engine_threads()) == threads_before
    assert _core.live_handles() == before
    with pytest.raises(ClosedError):
        e.submit("too late")
    e.close()  # idempotent


def test_close_can_drain(tiny_path):
    e = uma.Engine(tiny_path, n_ctx=1024, n_seq_max=2)
    handles = [e.submit("finish me", max_tokens=6, ignore_eos=True) for _ in range(3)]
    e.close(cancel=False)
    assert [h.result(timeout=5).finish_reason for h in handles] == ["length"] * 3


def test_metrics_snapshot(engine):
    engine.generate("metrics please", max_tokens=8, ignore_eos=True)
    snap = engine.snapshot()
    assert snap["tokens_generated_total"] >= 8
    assert snap["ttft_ms_interactive"]["count"] >= 1
    assert snap["tick_decode_ms"]["count"] == snap["ticks_total"]
    assert np.isfinite(snap["decode_ms_ewma"])


def test_the_scorecards_figures_follow_what_ran(engine):
    before = engine.reading()
    t0 = time.monotonic()
    handles = [engine.submit(p, max_tokens=8, ignore_eos=True) for p in PROMPTS[:2]]
    assert all(h.result(timeout=60).usage.completion_tokens == 8 for h in handles)
    wall = time.monotonic() - t0
    after = engine.reading()
    snap = engine.snapshot()
    delta = {k: after.counters[k] - before.counters[k] for k in after.counters}
    assert delta["tokens_generated_total"] == 16
    assert delta["decode_rows_total"] == delta["decode_rows_ready_total"] == 14  # 7 each
    assert 0 < delta["active_seconds_total"] <= wall
    assert delta["tokens_copy_free_total"] == 0  # the host sampler: llama.cpp copied each row
    assert delta["bmt_bytes_total"] >= 14 * engine.model.size_bytes * 0.5  # weights each tick
    assert snap["ttf5_ms_interactive"]["count"] >= 2
    assert snap["time_logits_to_first_chunk"]["count"] >= 8
    assert snap["sampling_ms_last"] > 0
    card = engine.scorecard(before, after)
    assert card["window"] == "interval" and card["tokens_generated"] == 16
    assert card["scheduler_efficiency"] == 1.0 and card["copy_free_ratio"] == 0.0


def test_overlap_active_says_where_the_last_ticks_output_went(engine):
    handle = engine.submit("overlap", max_tokens=10_000, ignore_eos=True)
    for k, _ in enumerate(handle):
        if k == 20:  # well past the first token, which goes out at once either way
            overlapped = engine.snapshot()["overlap_active"]
            break
    handle.cancel()
    handle.result(timeout=60)
    assert overlapped == (1 if engine._scheduler.overlap else 0)


def test_tokenize_and_detokenize(engine):
    tokens = engine.tokenize("Hello world")
    assert tokens == engine.model.tokenize("Hello world").tolist() and tokens[0] == engine.model.bos
    assert engine.tokenize("Hello", add_special=False)[0] != engine.model.bos
    assert engine.detokenize(tokens[1:]).strip() == "Hello world"
    assert engine.detokenize([engine.model.bos]) == "<s>"  # special tokens as their text
    with pytest.raises(InvalidTokenError):
        engine.detokenize([engine.model.n_vocab])
    with pytest.raises(InvalidRequestError):
        engine.tokenize(b"bytes")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_top_logprobs_are_sorted_and_agree_with_the_sampled_token(engine, temperature):
    handle = engine.submit(PROMPTS[1], max_tokens=8, ignore_eos=True, top_logprobs=5,
                           temperature=temperature, seed=11)
    streamed = [step for event in handle for step in event.top_logprobs or ()]
    r = handle.result(timeout=60)
    assert r.logprobs is not None and r.top_logprobs is not None  # top implies logprobs
    assert tuple(streamed) == r.top_logprobs and len(r.top_logprobs) == 8
    for token, lp, top in zip(r.token_ids, r.logprobs, r.top_logprobs, strict=True):
        ids, lps = zip(*top, strict=True)
        assert len(top) == 5 and list(lps) == sorted(lps, reverse=True)
        if temperature == 0:
            assert ids[0] == token
        if token in ids:
            assert lps[ids.index(token)] == pytest.approx(lp, abs=1e-5)
        else:  # sampled from below the five most probable
            assert lp <= lps[-1]


def test_top_logprobs_outside_0_to_20_are_refused(engine):
    with pytest.raises(InvalidRequestError, match="top_logprobs must be in"):
        engine.submit("x", top_logprobs=21)


def gpu_core(backend: str):
    """A stand-in for uma._core with one GPU device of `backend`'s (only what the engine's
    settings read)."""
    return types.SimpleNamespace(
        backends=lambda: ("cpu", backend.lower()),
        devices=lambda: ({"name": f"{backend}0", "type": "gpu", "backend": backend},))


@pytest.mark.parametrize(("backend", "options", "expected"), [
    ("CUDA", {}, True),
    ("CUDA", {"n_seq_max": 32}, False),  # past DEVICE_SAMPLING_MAX_SEQ
    ("Vulkan", {}, False),  # the host sampler measured faster there
    ("Vulkan", {"device_sampling": "on"}, True),
    ("CUDA", {"device_sampling": "off"}, False),
    ("CUDA", {"n_gpu_layers": 0}, False),  # the model on the CPU
])
def test_device_sampling_auto_means_a_cuda_gpu(backend, options, expected):
    config = EngineConfig(model="m.gguf", **options)
    assert uma.Engine._device_sampling(config, gpu_core(backend)) is expected


@pytest.mark.parametrize("tokens", [[1, 2**32 + 5], np.array([2**63 + 5], dtype=np.uint64),
                                    [-1], [32000]])
def test_a_token_id_outside_the_vocabulary_is_refused_on_every_path_never_wrapped(
        engine, tokens):
    # a 64-bit id must not wrap into a valid 32-bit one (2**32 + 5 is not token 5)
    with pytest.raises(InvalidTokenError, match="outside the vocabulary"):
        engine.generate(tokens, max_tokens=2)
    with pytest.raises(InvalidTokenError, match="outside the vocabulary"):
        engine.detokenize(tokens)
    with pytest.raises(InvalidTokenError, match="outside the vocabulary"):
        engine.embed([np.asarray(tokens).tolist()])


def test_text_with_a_lone_surrogate_is_refused_naming_where(engine):
    for call in (engine.tokenize, lambda t: engine.generate(t, max_tokens=2)):
        with pytest.raises(InvalidRequestError, match="lone surrogate at character 2"):
            call("ab\ud800")


def test_an_moe_served_with_fewer_experts_prices_its_ticks_by_them(tiny_moe_path):
    with uma.Engine(tiny_moe_path, n_ctx=512, n_seq_max=2) as own, \
            uma.Engine(tiny_moe_path, n_ctx=512, n_seq_max=2, n_expert_used=1) as fewer:
        assert (own.model.n_expert_used, fewer.model.n_expert_used) == (2, 1)
        # one token reaches 1 of 4 experts instead of 2: the bytes a decode moves fall
        one, two = fewer._scheduler.bmt, own._scheduler.bmt
        assert one.tick_bytes(1, 0) < two.tick_bytes(1, 0)
        a = own.generate("experts at work", max_tokens=8, ignore_eos=True)
        b = fewer.generate("experts at work", max_tokens=8, ignore_eos=True)
        assert len(a.token_ids) == len(b.token_ids) == 8


def test_fewer_experts_on_a_dense_model_is_refused_naming_the_setting(tiny_path):
    with pytest.raises(InvalidRequestError,
                       match=r"n_expert_used=1\) cannot be set: .* is not a mixture"):
        uma.Engine(tiny_path, n_expert_used=1)


def first_token_ns(result) -> float:
    t = result.timings
    return t.admitted_ns + 1e6 * (t.ttft_ms - t.queue_ms)


def test_a_short_request_is_answered_before_a_long_prompt_that_came_first(tiny_path):
    # Nobody decodes: the long prompt's tick runs it whole, which the short one must not wait
    # for (it passes it in the queue, or ends its tick as it arrives: on a CPU backend, which
    # checks for an abort between graph nodes, hence no layer offloaded); the long one's
    # answer is the one it gives alone.
    # (long enough that its tick takes several times the idle budget, on any machine)
    long_prompt = np.random.default_rng(3).integers(100, 20000, 8000).astype(np.int32)
    with uma.Engine(tiny_path, n_ctx=16384, n_seq_max=2, n_batch=8192, n_gpu_layers=0,
                    prefix_cache_tokens=0) as engine:
        engine.generate([1, 300, 400], max_tokens=2)
        alone = engine.submit(long_prompt, max_tokens=8).result(timeout=120)
        long = engine.submit(long_prompt, max_tokens=8)
        short = engine.submit([1, 300, 400, 500], max_tokens=4).result(timeout=120)
        beside = long.result(timeout=120)
    assert first_token_ns(short) < first_token_ns(beside)
    assert beside.token_ids == alone.token_ids


def test_a_long_prompt_gives_its_sequence_to_a_short_request_due_before_it(tiny_path):
    # Both sequences hold long prompts from the same app when a short request arrives (sent
    # from inside the first tick that runs them): the one due last is set aside at the tick
    # boundary, its cells left to the prefix cache, and the short request's first token comes
    # before its; set aside, it still answers as it does alone.
    rng = np.random.default_rng(4)
    prompts = [rng.integers(100, 20000, 3000).astype(np.int32) for _ in range(2)]
    with uma.Engine(tiny_path, n_ctx=16384, n_seq_max=2, n_batch=4096, n_gpu_layers=0) as engine:
        engine.generate([1, 300, 400], max_tokens=2)
        runner = engine._scheduler.runner
        real_run, sent = runner.run, []

        def run(plan, running):
            if not sent and len(running) == 2:
                sent.append(engine.submit([1, 300, 400, 500], max_tokens=4))
            return real_run(plan, running)

        runner.run = run
        longs = [engine.submit(p, max_tokens=4) for p in prompts]
        beside = [h.result(timeout=120) for h in longs]
        short = sent[0].result(timeout=120)
        runner.run = real_run
        set_aside = engine.snapshot()["preemptions_total"]
        alone = [engine.submit(p, max_tokens=4).result(timeout=120) for p in prompts]
    assert set_aside == 1
    assert first_token_ns(short) < first_token_ns(beside[1])
    assert [r.token_ids for r in beside] == [r.token_ids for r in alone]
