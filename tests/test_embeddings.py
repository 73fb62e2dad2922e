"""Embeddings (uma.embeddings, uma._core.Embedder): input forms, and Engine.embed on the real
core and on the fake one (whose decodes can be counted)."""

import threading

import numpy as np
import pytest

import uma
from uma import _core
from uma.embeddings import MAX_INPUTS, inputs_of
from uma.errors import ClosedError, EngineBusyError, InvalidRequestError
from uma.testing import fake_core as fc

TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog", "🦙 llamas", "a"]


@pytest.mark.parametrize(("value", "forms"), [
    ("hi", ["hi"]),
    (["hi", "there"], ["hi", "there"]),
    ([1, 2, 3], [[1, 2, 3]]),
    ([[1, 2], [3]], [[1, 2], [3]]),
    (["hi", [5, 6]], ["hi", [5, 6]]),
    ((np.int32(4), 5), [[4, 5]]),
])
def test_openai_input_forms(value, forms):
    assert inputs_of(value) == forms


@pytest.mark.parametrize(("value", "words"), [
    ([], "non-empty list"),
    (None, "must be a text"),
    (3, "must be a text"),
    ([True, 2], "input[0] must be"),
    (["ok", []], "input[1] must be"),
    (["ok", {"text": "x"}], "input[1] must be"),
    (["x"] * (MAX_INPUTS + 1), f"at most {MAX_INPUTS}"),
])
def test_bad_inputs_are_named(value, words):
    with pytest.raises(InvalidRequestError, match=words.replace("[", r"\[").replace("]", r"\]")):
        inputs_of(value)


@pytest.fixture(scope="module")
def engine(tiny_path):
    with uma.Engine(tiny_path, n_ctx=1024, n_seq_max=2, embedding_ctx=64) as e:
        yield e


def test_each_input_gets_a_unit_vector_of_the_model_s_width_in_order(engine):
    result = engine.embed(TEXTS)
    assert result.vectors.shape == (len(TEXTS), engine.model.n_embd)
    assert result.vectors.dtype == np.float32 and result.pooling == "mean"
    np.testing.assert_allclose(np.linalg.norm(result.vectors, axis=1), 1.0, rtol=1e-5)
    assert result.prompt_tokens == sum(len(engine.tokenize(t)) for t in TEXTS)
    alone = [engine.embed(t).vectors[0] for t in TEXTS]  # one decode each
    # a GPU's kernels may sum another batch shape in another order (lavapipe: 2e-4 apart),
    # where another input's vector is ~0.1 away
    np.testing.assert_allclose(result.vectors, np.stack(alone), atol=1e-3)
    cos = result.vectors @ result.vectors.T
    assert np.all(cos[~np.eye(len(TEXTS), dtype=bool)] < 0.9999)  # different texts differ


def test_token_ids_embed_as_their_text_and_raw_vectors_are_not_unit(engine):
    tokens = engine.tokenize(TEXTS[1])
    np.testing.assert_allclose(engine.embed([tokens]).vectors, engine.embed(TEXTS[1]).vectors,
                               atol=1e-6)
    raw = engine.embed(TEXTS[1], normalize=False).vectors[0]
    unit = engine.embed(TEXTS[1]).vectors[0]
    assert abs(np.linalg.norm(raw) - 1) > 1e-3
    np.testing.assert_allclose(raw / np.linalg.norm(raw), unit, atol=1e-5)


def test_special_token_text_embeds_as_those_tokens_as_llama_server_reads_it(engine):
    text = "</s> the end"  # the Llama-2 tokenizer's EOS, written out
    tokens = engine.tokenize(text, parse_special=True)
    assert engine.model.eos in tokens and len(tokens) < len(engine.tokenize(text))
    np.testing.assert_allclose(engine.embed(text).vectors, engine.embed([tokens]).vectors,
                               atol=1e-6)


def test_an_input_longer_than_embedding_ctx_is_named(engine):
    with pytest.raises(InvalidRequestError, match=r"input\[1\] has \d+ tokens; an input takes "
                                                  r"1 to 64 \(embedding_ctx\)"):
        engine.embed(["short", "word " * 100])
    with pytest.raises(InvalidRequestError, match="token id"):
        engine.embed([[10**7]])


def test_streams_and_embeddings_share_the_compute_thread(engine):
    handle = engine.submit("Once upon a time", max_tokens=24, ignore_eos=True)
    vectors = [engine.embed(TEXTS).vectors for _ in range(3)]
    assert handle.result(timeout=60).usage.completion_tokens == 24
    np.testing.assert_allclose(vectors[0], vectors[2], atol=1e-6)


@pytest.mark.parametrize("pooling", ["last", "cls"])
def test_pooling_can_be_chosen(tiny_path, engine, pooling):
    with uma.Engine(tiny_path, n_ctx=256, n_seq_max=1, embedding_pooling=pooling) as e:
        result = e.embed(TEXTS[:2])
    assert result.pooling == pooling
    assert not np.allclose(result.vectors, engine.embed(TEXTS[:2]).vectors, atol=1e-3)


def test_a_closed_engine_refuses_embeddings(tiny_path):
    e = uma.Engine(tiny_path, n_ctx=256, n_seq_max=1)
    e.embed("warm")
    e.close()
    with pytest.raises(ClosedError):
        e.embed("late")


def test_the_embedder_keeps_the_weights_and_refuses_bad_settings(tiny_path):
    live = _core.live_handles()
    model = _core.Model(tiny_path)
    with pytest.raises(InvalidRequestError, match="pooling must be"):
        _core.Embedder(model, pooling="max")
    embedder = _core.Embedder(model, n_ctx=32, n_seq_max=2)
    assert embedder.n_embd == model.n_embd and embedder.pooling == "mean"
    with pytest.raises(InvalidRequestError, match="input 0 has 40 tokens"):
        embedder.embed([np.ones(40, np.int32)])
    n_embd = model.n_embd
    model.close()  # the weights stay until the embedder goes
    assert embedder.embed([[1, 2]]).shape == (1, n_embd)
    embedder.close()
    assert _core.live_handles() == live
    with pytest.raises(ClosedError):
        embedder.embed([[1, 2]])


# --- on the fake core: how a request is cut into decodes --------------------------------------


def test_a_request_is_embedded_a_decode_at_a_time_between_ticks():
    with uma.Engine("fake.gguf", core=fc, n_ctx=1024, n_seq_max=2, embedding_ctx=8) as e:
        inputs = [[5, 6, 7], [8, 9, 10], [11, 12, 13], [14]]
        result = e.embed(inputs)
        # at most 8 tokens a decode: [5 6 7][8 9 10] | [11 12 13][14]
        assert e._embedder.n_decodes == 2
        expected = e._embedder.embed(inputs)
        expected /= np.linalg.norm(expected, axis=1, keepdims=True)
        np.testing.assert_allclose(result.vectors, expected, rtol=1e-6)


def hold_the_compute_thread(e):
    """A request whose first decode waits for e.ctx.release: returned once the compute thread
    is inside it, so that nothing else runs until the test releases it."""
    entered, e.ctx.release = threading.Event(), threading.Event()

    def hold(batch):
        entered.set()
        e.ctx.release.wait(30)

    e.ctx.before_decode = hold
    busy = e.submit([5, 6, 7], max_tokens=2)
    assert entered.wait(30)
    e.ctx.before_decode = None
    return busy


def test_a_full_embeddings_queue_is_refused():
    with uma.Engine("fake.gguf", core=fc, n_ctx=1024, n_seq_max=2, max_queue=2) as e:
        busy = hold_the_compute_thread(e)
        queued = [e.submit_embeddings("x y"), e.submit_embeddings("z")]
        with pytest.raises(EngineBusyError, match="embeddings requests are already waiting"):
            e.submit_embeddings("one too many")
        e.ctx.release.set()
        busy.result(timeout=30)
        assert all(f.result(timeout=30).vectors.shape[0] == 1 for f in queued)


def test_a_cancelled_request_is_dropped_and_the_next_one_answered():
    with uma.Engine("fake.gguf", core=fc, n_ctx=1024, n_seq_max=2) as e:
        busy = hold_the_compute_thread(e)
        dropped = e.submit_embeddings("x y")
        assert dropped.cancel()
        e.ctx.release.set()
        busy.result(timeout=30)
        assert e.embed("x y").vectors.shape == (1, e.model.n_embd)
