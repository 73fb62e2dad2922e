"""The fake core (uma.fake_core): its own contract, then uma.Engine and its scheduler driven by
it, with exact expectations (its tokens are a deterministic function of each sequence)."""

import ast
import inspect
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import uma
import uma.testing
from uma import _core
from uma.engine.output import Logits, Token
from uma.errors import (
    BatchFullError,
    ClosedError,
    ContextOverflowError,
    DecodeAbortedError,
    DecodeError,
    InvalidBatchError,
    InvalidRequestError,
    InvalidTokenError,
    NoKVSlotError,
)
from uma.testing import fake_core as fc

STUB = Path(__file__).resolve().parents[1] / "src" / "uma" / "_core.pyi"  # the real surface
TIMEOUT = 30  # seconds: every wait below is bounded by it; none should take a fraction of it

PROMPTS = [
    "ba be bi",
    "hello there my friend",
    "the quick brown fox jumps over the lazy dog",
    "a",
    "one two three four five six seven eight nine ten",
    "zu zo zi",
    "lorem ipsum dolor sit amet",
    "x y",
]


def make_engine(**config) -> uma.Engine:
    return uma.Engine("fake.gguf", core=fc, **{"n_ctx": 1024, "n_seq_max": 4, **config})


def ids(*tokens) -> np.ndarray:
    return np.array(tokens, dtype=np.int32)


@pytest.fixture
def model():
    with fc.Model("no/such/file.gguf") as m:
        yield m


def greedy(model, prompt: np.ndarray, n: int) -> list[int]:
    """n greedy tokens after prompt, one sequence alone, decoded by hand."""
    with fc.Context(model, n_ctx=1024, n_seq_max=1) as ctx:
        batch, sampler = fc.Batch(256), fc.Sampler(1, model.n_vocab)
        batch.add_sequence(prompt, 0, 0)
        out = []
        for pos in range(len(prompt), len(prompt) + n):
            ctx.decode(batch)
            out.append(int(sampler.sample(ctx, [0], [0])[0]))
            batch.clear()
            batch.add(out[-1], pos, 0, True)
        batch.close()
        sampler.close()
        return out


# --- the fake core's own contract ------------------------------------------------------------


def test_it_imports_without_the_compiled_core():
    code = ("import sys; sys.modules['uma._core'] = None; import uma.testing; "
            "from uma import fake_core; assert fake_core.Model('x').tokenize('a').size == 2")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert uma.testing.fake_core is fc and "fake_core" in uma.testing.__all__


Params = list[tuple[str, str, object]]  # (name, kind, default or None)


def stub_params(func: ast.FunctionDef, *, method: bool) -> Params:
    """A stub function's parameters, without self/cls for a method."""
    a, P = func.args, inspect.Parameter
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = [(arg.arg, P.POSITIONAL_OR_KEYWORD.name, d)
           for arg, d in zip(positional, defaults, strict=True)]
    out += [(a.vararg.arg, P.VAR_POSITIONAL.name, None)] if a.vararg else []
    out += [(arg.arg, P.KEYWORD_ONLY.name, d)
            for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    out += [(a.kwarg.arg, P.VAR_KEYWORD.name, None)] if a.kwarg else []
    out = [(n, k, None if d is None else ast.literal_eval(d)) for n, k, d in out]
    return out[1:] if method else out


def fake_params(func, *, method: bool) -> Params:
    out = [(p.name, p.kind.name, None if p.default is p.empty else p.default)
           for p in inspect.signature(func).parameters.values()]
    return out[1:] if method else out


def test_it_has_the_real_cores_surface_with_the_same_parameters():
    """Every public name, method and property of uma._core as its stub declares them (which
    tests/core/test_stubs.py holds to the compiled module), with the same parameter names,
    kinds and defaults. The fake may have more: its test hooks."""
    model = fc.Model("x")
    instances = {"Model": model, "Batch": fc.Batch(1), "Context": fc.Context(model),
                 "Sampler": fc.Sampler(1, fc.N_VOCAB), "Embedder": fc.Embedder(model)}
    problems = []

    def compare(where: str, stub: ast.FunctionDef, func, method: bool, defaults: bool):
        want, got = stub_params(stub, method=method), fake_params(func, method=method)
        if not defaults:
            want, got = [w[:2] for w in want], [g[:2] for g in got]
        if want != got:
            problems.append(f"{where}: the stub has {want}, the fake {got}")

    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            if hasattr(fc, node.name):
                compare(node.name, node, getattr(fc, node.name), False, True)
            else:
                problems.append(f"{node.name} is missing")
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(fc, node.name)
        for member in (m for m in node.body if isinstance(m, ast.FunctionDef)):
            where = f"{node.name}.{member.name}"
            decorators = {ast.unparse(d) for d in member.decorator_list}
            if "property" in decorators:  # a property or a plain attribute in the fake
                if not hasattr(instances[node.name], member.name):
                    problems.append(f"{where} is missing")
                continue
            func = cls.__init__ if member.name == "__new__" else getattr(cls, member.name, None)
            if func is None:
                problems.append(f"{where} is missing")
            else:  # @overload variants differ in their defaults only
                compare(where, member, func, True, "overload" not in decorators)
    for obj in instances.values():
        obj.close()
    assert problems == []


def test_sequence_state_round_trips(model):
    with fc.Context(model, n_ctx=256, n_seq_max=2) as ctx:
        batch = fc.Batch(8)
        batch.add_sequence(ids(5, 6, 7), 0, 0)
        ctx.decode(batch)
        row = ctx.logits()[0].copy()
        assert ctx.logits_address() == ctx.logits().ctypes.data  # views, not copies
        state = ctx.seq_state(0)
        assert ctx.set_seq_state(1, state) == len(state) and ctx.cells_used == 6
        batch.clear()
        batch.add(8, 3, 0, True)
        batch.add(8, 3, 1, True)
        ctx.decode(batch)
        np.testing.assert_array_equal(ctx.logits()[0], ctx.logits()[1])
        assert not np.array_equal(ctx.logits()[0], row)
        with pytest.raises(InvalidRequestError):
            ctx.set_seq_state(1, b"")
        with pytest.raises(InvalidRequestError):
            ctx.set_seq_state(1, b"not a state")
        batch.close()


def test_words_round_trip_and_special_tokens_need_parse_special(model):
    tokens = model.tokenize("ba bane bye")
    assert tokens.dtype == np.int32 and tokens[0] == fc.BOS and tokens[-1] == fc.TRIGGER
    assert model.detokenize(tokens) == " ba bane bye"  # BOS shows no text
    assert model.tokenize(model.detokenize(tokens), add_special=False).tolist() == \
        tokens[1:].tolist()
    # any other word is some ordinary word, the same every time
    hello = model.tokenize("hello", add_special=False)
    assert hello.tolist() == model.tokenize("hello", add_special=False).tolist()
    assert fc.TRIGGER < hello[0] < fc.N_VOCAB
    assert model.tokenize("</s>", add_special=False, parse_special=True).tolist() == [fc.EOS]
    assert model.tokenize("</s>", add_special=False).tolist() != [fc.EOS]
    assert model.eog_tokens().tolist() == [fc.EOS] and model.is_eog(fc.EOS)
    assert model.token_to_piece(fc.EOS) == b"" and model.token_to_piece(fc.EOS, special=True)
    with pytest.raises(InvalidTokenError):
        model._token_array([1, fc.N_VOCAB])
    with pytest.raises(InvalidTokenError):
        model.token_to_piece(-1)
    info = model.info()
    assert info["n_vocab"] == fc.N_VOCAB and info["size_bytes"] == model.size_bytes > 0


def test_kv_positions_follow_decodes_and_seq_rm(model):
    with fc.Context(model, n_ctx=512, n_seq_max=2) as ctx:
        batch = fc.Batch(64)
        batch.add_sequence(np.arange(3, 13, dtype=np.int32), 0, 0)
        batch.add_sequence(np.arange(3, 8, dtype=np.int32), 0, 1, logits_last=False)
        assert ctx.decode(batch) == 1 and ctx.output_seqs.tolist() == [0]
        assert (ctx.seq_pos_min(0), ctx.seq_pos_max(0), ctx.seq_pos_max(1)) == (0, 9, 4)
        assert ctx.cells_used == 15
        assert ctx.seq_rm(0, 7)  # [7, end)
        assert ctx.seq_pos_max(0) == 6 and ctx.cells_used == 12
        ctx.seq_rm(0, 0, 2)  # [0, 2)
        assert (ctx.seq_pos_min(0), ctx.seq_pos_max(0), ctx.cells_used) == (2, 6, 10)
        ctx.seq_rm(1)
        assert ctx.seq_pos_max(1) == -1 and ctx.cells_used == 5
        # A sequence continues right after its last position, as llama.cpp requires...
        batch.clear()
        batch.add(5, 9, 0, True)
        with pytest.raises(InvalidBatchError):
            ctx.decode(batch)
        batch.clear()
        batch.add(5, 7, 0, True)
        assert ctx.decode(batch) == 1 and ctx.seq_pos_max(0) == 7
        # ...never going back within a batch; an empty one starts anywhere.
        batch.clear()
        batch.add(5, 4, 1)
        batch.add(5, 3, 1, True)
        with pytest.raises(InvalidBatchError):
            ctx.decode(batch)
        batch.clear()
        batch.add(5, 40, 1, True)
        assert ctx.decode(batch) == 1 and ctx.seq_pos_min(1) == 40
        with pytest.raises(InvalidRequestError):
            ctx.seq_rm(2)
        ctx.clear()
        assert ctx.cells_used == 0
        batch.close()


def test_a_batch_that_does_not_fit_raises_no_kv_slot_and_changes_nothing(model):
    with fc.Context(model, n_ctx=200, n_batch=512, n_seq_max=4) as ctx:
        assert ctx.n_ctx == ctx.n_ctx_seq == 256  # llama.cpp pads n_ctx to 256
        batch = fc.Batch(512)
        batch.add_sequence(np.full(200, 5, np.int32), 0, 0)
        ctx.decode(batch)
        batch.clear()
        batch.add_sequence(np.full(40, 5, np.int32), 0, 1)
        batch.add_sequence(np.full(20, 5, np.int32), 0, 2)
        with pytest.raises(NoKVSlotError):
            ctx.decode(batch)
        assert ctx.cells_used == 200 and ctx.seq_pos_max(1) == ctx.seq_pos_max(2) == -1
        ctx.seq_rm(0, 150)
        assert ctx.decode(batch) == 2 and ctx.cells_used == 210
        batch.close()
    # Without a unified cache every sequence has a stream of its own.
    with fc.Context(model, n_ctx=1024, n_seq_max=4, kv_unified=False) as ctx:
        assert (ctx.n_ctx, ctx.n_ctx_seq) == (1024, 256)


def test_decode_validates_like_the_real_core(model):
    with fc.Context(model, n_ctx=256, n_batch=8, n_seq_max=2) as ctx:
        batch = fc.Batch(16)
        with pytest.raises(InvalidRequestError, match="empty"):
            ctx.decode(batch)
        batch.add_sequence(np.full(9, 5, np.int32), 0, 0)
        with pytest.raises(BatchFullError):
            ctx.decode(batch)
        for token, pos, seq, error in [(fc.N_VOCAB, 0, 0, InvalidTokenError),
                                       (-1, 0, 0, InvalidTokenError),
                                       (5, 0, 2, InvalidRequestError),
                                       (5, 256, 0, ContextOverflowError),
                                       (5, -1, 0, ContextOverflowError)]:
            batch.clear()
            batch.add(token, pos, seq, True)
            with pytest.raises(error):
                ctx.decode(batch)
        assert ctx.cells_used == 0
        with pytest.raises(BatchFullError):
            fc.Batch(2).add_sequence(np.zeros(3, np.int32), 0, 0)
        with pytest.raises(ValueError, match="dtype"):  # as Cython's int32_t[::1] refuses it
            batch.add_sequence(np.zeros(3, np.int64), 0, 0)
        batch.close()
        with pytest.raises(ClosedError):
            batch.add(5, 0, 0)
    with pytest.raises(ClosedError):
        ctx.decode(fc.Batch(1))
    with pytest.raises(InvalidRequestError, match="n_ubatch"):
        fc.Context(model, n_batch=8, n_ubatch=16)


def test_aborts_and_failures_keep_only_finished_micro_batches(model):
    with fc.Context(model, n_ctx=256, n_batch=64, n_ubatch=4, n_seq_max=1) as ctx:
        batch = fc.Batch(64)
        tokens = np.full(10, 5, np.int32)
        tokens[5] = 7
        batch.add_sequence(tokens, 0, 0)
        ctx.abort()
        with pytest.raises(DecodeAbortedError):
            ctx.decode(batch)
        assert ctx.cells_used == 0
        ctx.abort(False)
        ctx.failing_tokens = {7}
        with pytest.raises(DecodeError) as exc:
            ctx.decode(batch)
        assert type(exc.value) is DecodeError and ctx.n_outputs == 0
        assert ctx.seq_pos_max(0) == 3  # the first micro-batch ran, as in llama.cpp
        ctx.failing_tokens = set()
        ctx.seq_rm(0)
        assert ctx.decode(batch) == 1
        batch.close()


def test_a_stalled_decode_blocks_until_aborted(model):
    with fc.Context(model, n_ctx=256, n_seq_max=1) as ctx:
        batch = fc.Batch(8)
        batch.add_sequence(ids(5, 6, 7), 0, 0)
        ctx.stall()
        raised = []

        def decode():
            try:
                ctx.decode(batch)
            except DecodeAbortedError as exc:
                raised.append(exc)

        thread = threading.Thread(target=decode)
        thread.start()
        assert ctx.wait_stalled(TIMEOUT)
        ctx.abort()
        thread.join(TIMEOUT)
        assert not thread.is_alive() and len(raised) == 1 and ctx.cells_used == 0
        ctx.abort(False)
        ctx.resume()
        assert ctx.decode(batch) == 1


def test_logits_depend_only_on_the_sequence_so_far(model):
    prompt, other = model.tokenize("ba be bi bo"), model.tokenize("something else")
    with fc.Context(model, n_ctx=1024, n_seq_max=4) as ctx:
        batch = fc.Batch(64)
        batch.add_sequence(prompt, 0, 0)
        ctx.decode(batch)
        alone = ctx.logits()[0].copy()
        # In two chunks, on another sequence, beside another one's prompt and decode step.
        ctx.clear()
        batch.clear()
        batch.add_sequence(other, 0, 0)
        batch.add_sequence(prompt[:2], 0, 3, logits_last=False)
        ctx.decode(batch)
        batch.clear()
        batch.add(9, len(other), 0, True)
        batch.add_sequence(prompt[2:], 2, 3)
        assert ctx.decode(batch) == 2 and ctx.output_seqs.tolist() == [0, 3]
        np.testing.assert_array_equal(ctx.logits()[1], alone)
        assert not np.array_equal(ctx.logits()[0], alone)
        batch.close()


def test_sampling_is_greedy_at_zero_and_repeats_per_seed_above(model):
    with fc.Context(model, n_ctx=256, n_seq_max=4) as ctx:
        batch = fc.Batch(64)
        for seq in range(4):  # four rows with the same logits
            batch.add_sequence(ids(1, 5, 6), 0, seq)
        assert ctx.decode(batch) == 4
        row = ctx.logits()[0]
        sampler = fc.Sampler(4, model.n_vocab)
        sampler.configure(1, temperature=1.0, seed=7)
        sampler.configure(2, temperature=1.0, seed=7)
        sampler.configure(3, temperature=1.0, seed=8)
        draws = np.array([sampler.sample(ctx, [0, 1, 2, 3], [0, 1, 2, 3]) for _ in range(20)])
        assert (draws[:, 0] == np.argmax(row)).all()
        assert (draws[:, 1] == draws[:, 2]).all() and (draws[:, 1] != draws[:, 3]).any()
        assert len(set(draws[:, 1].tolist())) > 1
        tokens, lps = sampler.sample(ctx, [0], [0], logprobs=True)
        shifted = row.astype(np.float64) - row.max()
        assert lps[0] == pytest.approx(shifted[tokens[0]] - np.log(np.exp(shifted).sum()),
                                       abs=1e-5)
        with pytest.raises(InvalidRequestError, match="temperature"):
            sampler.configure(0, temperature=-1.0)
        with pytest.raises(InvalidRequestError, match="rows"):
            sampler.sample(ctx, [4], [0])
        sampler.close()
        with pytest.raises(ClosedError):
            sampler.sample(ctx, [0], [0])
        batch.close()


def test_top_logprobs_match_the_real_sampler(model):
    rows = np.random.default_rng(3).normal(size=(3, model.n_vocab)).astype(np.float32)
    rows[2] = 0.0  # ties go by token id
    real = _core.Sampler(1, model.n_vocab)
    try:
        want_ids, want_lps = real.top_logprobs_array(rows, 7)
    finally:
        real.close()
    ids, lps = fc.Sampler(1, model.n_vocab).top_logprobs_array(rows, 7)
    assert ids.tolist() == want_ids.tolist()
    np.testing.assert_allclose(lps, want_lps, atol=1e-5)


def test_eos_comes_eog_after_tokens_after_the_trigger_word_and_never_otherwise(model):
    out = greedy(model, model.tokenize("ba be bye"), fc.EOG_AFTER + 1)
    assert out[-1] == fc.EOS and all(t > fc.TRIGGER for t in out[:-1])
    out = greedy(model, model.tokenize("ba be bi"), 200)
    assert min(out) > fc.TRIGGER  # neither EOS, BOS nor the trigger word


# --- the engine on the fake core ---------------------------------------------------------------


@pytest.fixture(scope="module")
def alone():
    """Greedy results of each prompt generated with nothing else running."""
    with make_engine(n_seq_max=1) as e:
        return {p: e.generate(p, max_tokens=16, logprobs=True) for p in PROMPTS}


def assert_as_alone(result, expected) -> None:
    assert result.token_ids == expected.token_ids and result.text == expected.text
    assert result.logprobs == expected.logprobs if result.logprobs else True


def test_sixteen_concurrent_requests_match_each_alone(alone):
    prompts = [PROMPTS[i % 8] for i in range(16)]
    with make_engine(n_seq_max=8) as e:
        handles = [e.submit(p, max_tokens=16, logprobs=True) for p in prompts]
        results = [h.result(TIMEOUT) for h in handles]
        events = list(handles[0])
    for p, r in zip(prompts, results, strict=True):
        assert_as_alone(r, alone[p])
        assert r.finish_reason == "length" and r.usage.completion_tokens == 16
    assert "".join(ev.text for ev in events) == results[0].text
    snap = e.snapshot()
    assert snap["kv_cells_used"] == 0 and snap["requests_length_total"] == 16


def test_cancelling_a_request_frees_its_sequence():
    with make_engine() as e:
        assert e.wait_ready(TIMEOUT)
        e.ctx.stall()
        handle = e.submit(PROMPTS[2], max_tokens=500)
        try:
            assert e.ctx.wait_stalled(TIMEOUT)  # its prompt is being decoded
            handle.cancel()
        finally:
            e.ctx.resume()
        result = handle.result(TIMEOUT)
        assert result.finish_reason == "cancelled" and result.usage.completion_tokens <= 1
        assert e.snapshot()["kv_cells_used"] == 0 and e.ctx.cells_used == 0
        assert e.generate(PROMPTS[0], max_tokens=4).usage.completion_tokens == 4
    snap = e.snapshot()
    assert snap["kv_cells_used"] == 0 and snap["requests_cancelled_total"] == 1


def test_background_and_interactive_requests_both_complete(alone):
    with make_engine(n_seq_max=3) as e:
        handles = [e.submit(p, max_tokens=16, logprobs=True,
                            priority="background" if i % 2 else "interactive")
                   for i, p in enumerate(PROMPTS)]
        for p, h in zip(PROMPTS, handles, strict=True):
            result = h.result(TIMEOUT)
            assert result.finish_reason == "length"
            assert_as_alone(result, alone[p])
    assert e.snapshot()["kv_cells_used"] == 0


def test_max_tokens_and_eos_end_requests_with_their_reason(alone):
    base = alone[PROMPTS[1]]
    with make_engine() as e:
        result = e.generate(PROMPTS[1], max_tokens=5)
        assert result.finish_reason == "length" and result.token_ids == base.token_ids[:5]
        # "bye": EOG_AFTER words, then EOS, which ends the request and shows no text
        result = e.generate("ba be bye", max_tokens=16)
        assert result.finish_reason == "stop" and result.token_ids[-1] == fc.EOS
        assert result.usage.completion_tokens == fc.EOG_AFTER + 1
        assert result.text == e.model.detokenize(result.token_ids)
        ignored = e.generate("ba be bye", max_tokens=8, ignore_eos=True)
        assert ignored.finish_reason == "length" and len(ignored.token_ids) == 8
        assert ignored.token_ids[:fc.EOG_AFTER + 1] == result.token_ids


def stop_after_seventh_word(e, base) -> str:
    """A stop string that the 7th generated token completes (or an earlier one)."""
    return e.model.token_to_piece(base.token_ids[6]).decode()


def test_a_stop_string_ends_its_request_with_stop(alone):
    base = alone[PROMPTS[1]]
    with make_engine() as e:
        assert e.wait_ready(TIMEOUT)
        stop = stop_after_seventh_word(e, base)
        # In step, as on a real device, whose decodes take longer than publishing a token: a
        # decode that samples waits until the output stage has published the token before it.
        # (Free-running, the fake's decodes can outrun it: the test below.)
        published = threading.Semaphore(1)  # the prompt's decode needs none published

        def after_output(batch):
            if batch.n_outputs and not published.acquire(timeout=TIMEOUT):
                raise TimeoutError("the output stage did not publish the previous token")

        e.ctx.before_decode = after_output
        handle = e.submit(PROMPTS[1], max_tokens=16, stop=[stop, "never there"])
        handle.listen(lambda h: published.release())
        result = handle.result(TIMEOUT)
        assert result.finish_reason == "stop"
        assert result.text == base.text[:base.text.find(stop)]
        assert result.token_ids == base.token_ids[:len(result.token_ids)]
        assert len(result.token_ids) <= 7


def test_a_stop_string_reports_stop_even_when_the_compute_thread_ran_ahead(alone):
    base = alone[PROMPTS[1]]
    with make_engine() as e:
        assert e.wait_ready(TIMEOUT)
        stop = stop_after_seventh_word(e, base)
        # The output thread is held at the 6th token until the compute thread has begun the
        # decode that samples the 16th (the last): what a fast device does on its own at
        # times (4 runs in 50 free-running on the fake).
        ran_ahead, sampled, shown = threading.Event(), [0], [0]

        def count(batch):
            sampled[0] += bool(batch.n_outputs)
            if sampled[0] == 16:
                ran_ahead.set()

        def hold_output(h):
            events, _ = h.drain()
            before, shown[0] = shown[0], shown[0] + sum(len(ev.token_ids) for ev in events)
            if before < 6 <= shown[0]:
                ran_ahead.wait(TIMEOUT)

        e.ctx.before_decode = count
        e.ctx.stall()  # no token before the listener is in place
        handle = e.submit(PROMPTS[1], max_tokens=16, stop=stop)
        handle.listen(hold_output)
        e.ctx.resume()
        result = handle.result(TIMEOUT)
        assert result.text == base.text[:base.text.find(stop)]  # holds: the text is cut
        assert result.finish_reason == "stop"  # fails: 'length'


def test_a_batch_lists_its_rows_in_sequence_order_with_prompts_among_the_decoders():
    # With a KV buffer per sequence llama.cpp makes a micro-batch of consecutive sequence ids
    # only, in batch order: a prompt on sequence 0 listed after decoders 1 and 2 would cost a
    # micro-batch more. D takes sequence 0 (A's, the lowest free) while B and C decode.
    batches = []
    with make_engine(kv_unified=False) as e:
        e.ctx.before_decode = lambda batch: batches.append(batch.tokens()[2].tolist())
        first = e.submit(PROMPTS[0], max_tokens=2, ignore_eos=True)
        streams = [e.submit(p, max_tokens=200, ignore_eos=True) for p in PROMPTS[1:3]]
        first.result(TIMEOUT)
        late = e.submit(PROMPTS[4], max_tokens=2, ignore_eos=True).result(TIMEOUT)
        for h in streams:
            h.cancel()
    assert late.finish_reason == "length"
    mixed = [seqs for seqs in batches if seqs.count(0) > 1 and {1, 2} <= set(seqs)]
    assert mixed, "no tick put D's prompt beside B's and C's decode rows"
    assert all(seqs == sorted(seqs) for seqs in batches)


def test_a_full_kv_cache_preempts_and_every_request_still_matches_alone():
    # 4 requests of 61 prompt and 100 generated tokens in 256 cells: two fit while short,
    # never both whole, so the newer is preempted and later prefills its tokens again.
    prompts = [" ".join(f"w{i}x{j}" for j in range(60)) for i in range(4)]
    with make_engine(n_ctx=256, n_seq_max=1) as e:
        expected = [e.generate(p, max_tokens=100, logprobs=True) for p in prompts]
    # Two sequences: one request is preempted at a time, so prompts waiting together need at
    # most 160 + 61 cells (with more, re-prefilled prompts that need more than the cache holds
    # together are shed in halves: the test below).
    with make_engine(n_ctx=256, n_seq_max=2) as e:
        handles = [e.submit(p, max_tokens=100, logprobs=True,
                            priority="background" if i == 1 else "interactive")
                   for i, p in enumerate(prompts)]
        results = [h.result(TIMEOUT) for h in handles]
    snap = e.snapshot()
    assert snap["preemptions_total"] > 0 and snap["kv_full_total"] > 0
    assert snap["kv_cells_used"] == 0 and snap["requests_length_total"] == 4
    for r, x in zip(results, expected, strict=True):
        assert r.finish_reason == x.finish_reason == "length"
        assert_as_alone(r, x)


def test_prompts_that_fit_one_at_a_time_but_not_together_both_run():
    # Two prompts of 150 tokens, 256 cells, an empty cache: each fits, both do not. The
    # baseline policy plans both whole (the bound policy does the same with no stream
    # decoding, and with more sequences preempted requests' prompts get here on their own,
    # real core too).
    prompts = [" ".join(f"w{i}x{j}" for j in range(149)) for i in range(2)]
    with make_engine(n_ctx=256, n_seq_max=2, policy="baseline") as e:
        assert e.wait_ready(TIMEOUT)
        handles = []
        decodes = [0]

        def give_up(batch):  # the two need about ten decodes; a livelock would spin here
            decodes[0] += 1
            if decodes[0] == 2000:
                for h in handles:
                    h.cancel()

        e.ctx.before_decode = give_up
        handles += [e.submit(p, max_tokens=4) for p in prompts]
        results = [h.result(TIMEOUT) for h in handles]
    assert [r.finish_reason for r in results] == ["length", "length"]  # not cancelled


def test_invalid_prompts_are_refused_at_submit():
    with make_engine(n_ctx=256) as e:
        with pytest.raises(InvalidTokenError):
            e.submit([5, fc.N_VOCAB])
        with pytest.raises(InvalidTokenError):
            e.submit(np.array([-1], np.int32))
        with pytest.raises(ContextOverflowError):
            e.submit(" ".join(["ba"] * 300))
        with pytest.raises(InvalidRequestError):
            e.submit([])
        assert e.snapshot()["requests_submitted_total"] == 0
        tokens = e.model.tokenize("ba be bi")
        assert e.generate(tokens.tolist(), max_tokens=3).token_ids == \
            e.generate("ba be bi", max_tokens=3).token_ids


def test_closing_with_requests_in_flight_ends_them_cancelled():
    before = fc.live_handles()
    e = make_engine(n_seq_max=2)
    assert e.wait_ready(TIMEOUT)
    e.ctx.stall()
    handles = [e.submit(p, max_tokens=500) for p in PROMPTS[:4]]  # two run, two wait
    assert e.ctx.wait_stalled(TIMEOUT)
    e.close(timeout=TIMEOUT)  # aborts the stalled decode
    assert all(h.result(TIMEOUT).finish_reason == "cancelled" for h in handles)
    snap = e.snapshot()
    assert snap["kv_cells_used"] == 0 and snap["requests_cancelled_total"] == 4
    assert fc.live_handles() == before  # the model, context, batch and sampler are closed
    with pytest.raises(ClosedError):
        e.submit("ba")


def test_a_request_whose_decode_fails_ends_alone(alone):
    with make_engine() as e:
        assert e.wait_ready(TIMEOUT)
        e.ctx.failing_tokens = {fc.TRIGGER}  # never generated: only its prompt holds it
        bad = e.submit("this one says bye", max_tokens=16)
        good = [e.submit(p, max_tokens=16, logprobs=True) for p in PROMPTS[:3]]
        result = bad.result(TIMEOUT)
        assert result.finish_reason == "error" and isinstance(result.error, DecodeError)
        for p, h in zip(PROMPTS, good, strict=False):
            assert_as_alone(h.result(TIMEOUT), alone[p])
    assert e.snapshot()["kv_cells_used"] == 0


def test_chat_messages_and_from_config_on_the_fake_core():
    config = uma.EngineConfig(model="fake.gguf", n_ctx=512, n_seq_max=2)
    with uma.Engine.from_config(config, core=fc) as e:
        messages = [{"role": "user", "content": "ba be bi"}]
        result = e.chat(messages, max_tokens=4)
        prompt = e.render_chat(messages)
        assert result.usage.prompt_tokens == len(prompt)
        # the template writes the BOS text; the tokenizer's own BOS is the only one before it
        assert prompt[0] == fc.BOS and prompt[1] != fc.BOS
        assert result.token_ids == e.generate(prompt, max_tokens=4).token_ids
        with pytest.raises(InvalidRequestError):
            e.chat([{"role": "user"}])


def test_overlapped_ticks_hand_a_token_on_with_the_next_decode_but_a_first_token_at_once():
    pending = []  # the events waiting in the scheduler as each decode starts
    with make_engine(overlap="on") as e:
        assert e.wait_ready(TIMEOUT)
        e.ctx.before_decode = lambda batch: pending.append(
            [type(event) for event in e._scheduler._outbox])
        result = e.generate(PROMPTS[1], max_tokens=6, ignore_eos=True)
    assert len(result.token_ids) == 6
    # the prompt's decode; the first token's (handed on at once); then each later token's,
    # behind its tick's marker (time_logits_to_first_chunk), handed on once the decode after
    # it is under way; the last goes with the request's end
    assert pending == [[], [], *[[Logits, Token]] * 4]


@pytest.mark.parametrize("overlap", ["on", "off"])
def test_a_steady_plan_runs_again_without_asking_the_policy(overlap):
    """Interactive decoders alone, nothing queued: the policy is asked again only when the
    running set changes, on overlapped (GPU) and serial (CPU) ticks alike. A background
    request makes it plan every tick."""
    for priority, steady in (("interactive", True), ("background", False)):
        with make_engine(overlap=overlap) as e:
            assert e.wait_ready(TIMEOUT)
            ex = e._scheduler
            asked = []

            class Counting:  # the policy is frozen: count its plans through a proxy
                def __getattr__(self, name, policy=ex.policy):
                    return getattr(policy, name)

                def schedule_tick(self, state, policy=ex.policy, asked=asked):
                    asked.append(state.tick)
                    return policy.schedule_tick(state)

            ex.policy = Counting()
            handles = [e.submit(p, max_tokens=40, ignore_eos=True, priority=priority)
                       for p in PROMPTS[:2]]
            results = [h.result(TIMEOUT) for h in handles]
            ticks = e.snapshot()["ticks_total"]
        assert all(len(r.token_ids) == 40 for r in results)
        if steady:
            assert len(asked) <= 6 < ticks - 30
        else:
            assert len(asked) >= 40


def test_overlapped_the_policy_hears_how_long_the_plan_it_remembers_took():
    """Overlapped, a tick's report reaches the statistics during the next decode; the policy,
    planning the tick after, must still get the time of the plan whose memory it gets back
    (the background floor pays for its chunks from that pairing)."""
    with make_engine(overlap="on") as e:
        assert e.wait_ready(TIMEOUT)
        ex = e._scheduler
        seen = []  # (the memory handed back, the last tick's ms) of each plan asked for

        class Recording:  # the policy is frozen: watch its snapshots through a proxy
            def __getattr__(self, name, policy=ex.policy):
                return getattr(policy, name)

            def schedule_tick(self, state, policy=ex.policy, seen=seen):
                seen.append((state.memory, state.last_tick_ms))
                return policy.schedule_tick(state)

        ex.policy = Recording()
        ex.trace = []
        handles = [e.submit(p, max_tokens=48, ignore_eos=True, priority="background")
                   for p in PROMPTS[:2]]
        assert all(len(h.result(TIMEOUT).token_ids) == 48 for h in handles)
    took = {id(plan.memory): tick_s * 1e3 for *_, tick_s, _native, plan in ex.trace}
    paired = [(took[id(memory)], ms) for memory, ms in seen if id(memory) in took]
    assert len(paired) >= 40
    assert all(ms == pytest.approx(tick_ms) for tick_ms, ms in paired)


def test_a_request_that_ends_has_its_result_out_before_a_snapshot_holds_the_compute_thread():
    # Its KV pushes the older entry out of the prefix cache with nothing else running, so that
    # entry is snapshotted there and then. On an H100 such a copy took 367 ms (a storm's
    # background prompt), and the request's last token and result waited behind it.
    seen = []
    with make_engine(n_ctx=16384, n_seq_max=1, prefix_cache=1, prefix_cache_ram_mb=64) as e:
        rng = np.random.default_rng(5)
        e.generate(rng.integers(100, 500, 40).astype(np.int32), max_tokens=4, ignore_eos=True)
        seq_state = e.ctx.seq_state

        def snapshot(seq):
            seen.append(ending.result(TIMEOUT).finish_reason)  # times out unless out already
            return seq_state(seq)

        e.ctx.seq_state = snapshot
        e.ctx.stall()
        ending = e.submit(rng.integers(100, 500, 40).astype(np.int32), max_tokens=4,
                          ignore_eos=True)
        e.ctx.resume()
        assert ending.result(TIMEOUT).finish_reason == "length"
        e.generate("flush", max_tokens=1)  # the compute thread is past the snapshot
    assert seen == ["length"]
    assert e.snapshot()["prefix_cache_ram_bytes"] > 0


def test_a_snapshot_in_a_tick_is_not_counted_as_the_ticks_time(monkeypatch):
    # A clock that a snapshot moves on by 100 s: the tick holding it must not report them
    # (the cost model and the policy would learn them as the batch's).
    import time as time_module
    real, skipped = time_module.perf_counter, [0.0]
    monkeypatch.setattr(time_module, "perf_counter", lambda: real() + skipped[0])
    with make_engine(n_ctx=16384, n_seq_max=1, prefix_cache=1, prefix_cache_ram_mb=64) as e:
        seq_state = e.ctx.seq_state

        def slow_snapshot(seq):
            skipped[0] += 100.0
            return seq_state(seq)

        e.ctx.seq_state = slow_snapshot
        rng = np.random.default_rng(6)
        for _ in range(2):  # the second's KV pushes the first's out, snapshotted
            e.generate(rng.integers(100, 500, 40).astype(np.int32), max_tokens=4,
                       ignore_eos=True)
    assert e._scheduler.prefix.snapshot_seconds >= 100.0
    assert e.snapshot()["tick_seconds_total"] < 100.0


def test_a_snapshot_does_not_hold_up_a_queued_request():
    # One sequence: B waits while A runs. A's end pushes the older entry out with nothing
    # running, but B waiting: an untimed snapshot (a GPU's first) would delay B's admission by
    # its whole copy, so that entry leaves unsaved; B's end, with nobody waiting, snapshots.
    with make_engine(n_ctx=16384, n_seq_max=1, prefix_cache=1, prefix_cache_ram_mb=64) as e:
        rng = np.random.default_rng(7)
        prompts = [rng.integers(100, 500, 40).astype(np.int32) for _ in range(3)]
        e.generate(prompts[0], max_tokens=4, ignore_eos=True)  # kept; nothing pushed out
        e.ctx.stall()
        a, b = (e.submit(p, max_tokens=4, ignore_eos=True) for p in prompts[1:])
        e.ctx.resume()
        assert a.result(TIMEOUT).finish_reason == b.result(TIMEOUT).finish_reason == "length"
        e.generate("flush", max_tokens=1)  # the compute thread is past B's release
        snap = e.snapshot()
    assert snap["prefix_cache_unsaved_total"] == 1 and snap["prefix_cache_ram_bytes"] > 0


def test_an_entry_that_must_leave_at_once_waits_for_an_idle_moment():
    """One spare sequence: entries pushed out for it while another request decodes leave
    unsaved and are counted; the first one pushed out with nothing running is snapshotted."""
    with make_engine(n_ctx=16384, n_seq_max=2, prefix_cache=1, prefix_cache_ram_mb=64) as e:
        rng = np.random.default_rng(3)
        long = e.submit(rng.integers(100, 500, 40).astype(np.int32), max_tokens=8000,
                        ignore_eos=True)
        for _ in range(3):
            e.generate(rng.integers(100, 500, 40).astype(np.int32), max_tokens=4,
                       ignore_eos=True)
        busy = e.snapshot()
        long.cancel()
        assert long.result().finish_reason == "cancelled"  # it ran through all of the above
        # Its result is out before the snapshot its release makes (_may_hold hands it on
        # first); a request after it runs once that snapshot is done. It takes the sequence
        # the snapshot freed, so it pushes nothing out.
        e.generate("flush", max_tokens=1)
        idle = e.snapshot()
    assert busy["prefix_cache_unsaved_total"] == 2 and busy["prefix_cache_ram_bytes"] == 0
    assert idle["prefix_cache_unsaved_total"] == 2 and idle["prefix_cache_ram_bytes"] > 0
    assert e._scheduler.prefix.snapshots.tokens_copied > 0
