"""The native sampler on hand-made logits: exact candidate sets, seeds, greedy equivalence."""

import numpy as np
import pytest

from uma import _core
from uma.errors import InvalidRequestError

VOCAB = 1000


@pytest.fixture
def sampler():
    s = _core.Sampler(4, VOCAB)
    yield s
    s.close()


@pytest.fixture
def row():
    return np.random.default_rng(7).normal(size=VOCAB).astype(np.float32) * 3


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def expected_order(row):
    # Most probable first, ties by id: the sampler's documented order.
    return np.lexsort((np.arange(len(row)), -row))


def test_top_k_keeps_exactly_the_k_largest(sampler, row):
    sampler.configure(0, temperature=1.0, top_k=5)
    ids, probs = sampler.candidates(0, row)
    assert list(ids) == list(expected_order(row)[:5])
    np.testing.assert_allclose(probs, softmax(row[ids]), rtol=1e-5)


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.999])
def test_top_p_keeps_the_smallest_prefix_reaching_p(sampler, row, top_p):
    sampler.configure(0, temperature=0.7, top_p=top_p)
    ids, probs = sampler.candidates(0, row)
    order = expected_order(row)
    p = softmax(row / 0.7)[order]
    cum = np.cumsum(p)
    n_expected = int(np.searchsorted(cum, top_p * cum[-1]) + 1)
    assert list(ids) == list(order[:n_expected])
    assert top_p <= cum[len(ids) - 1] + 1e-6
    if len(ids) > 1:
        assert cum[len(ids) - 2] < top_p
    assert probs.sum() == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("min_p", [0.01, 0.2, 0.9])
def test_min_p_keeps_tokens_above_fraction_of_the_best(sampler, row, min_p):
    sampler.configure(0, temperature=1.0, min_p=min_p)
    ids, _ = sampler.candidates(0, row)
    p = softmax(row)
    assert set(ids) == set(np.flatnonzero(p >= min_p * p.max()))


def test_filters_compose_in_order(sampler, row):
    sampler.configure(0, temperature=1.0, top_k=50, top_p=0.8, min_p=0.05)
    ids, _ = sampler.candidates(0, row)
    top50 = expected_order(row)[:50]
    p = softmax(row[top50])
    n = int(np.searchsorted(np.cumsum(p), 0.8) + 1)
    survivors = [t for t, q in zip(top50[:n], p[:n], strict=True) if q >= 0.05 * p[0]]
    assert list(ids) == survivors


def test_same_seed_same_tokens(sampler, row):
    logits = np.stack([row] * 64)
    sampler.configure(0, temperature=1.0, seed=1234)
    a = sampler.sample_array(logits, [0] * 64)
    sampler.configure(0, temperature=1.0, seed=1234)
    b = sampler.sample_array(logits, [0] * 64)
    sampler.configure(0, temperature=1.0, seed=4321)
    c = sampler.sample_array(logits, [0] * 64)
    assert list(a) == list(b)
    assert list(a) != list(c)


def test_slots_do_not_share_randomness(sampler, row):
    # A slot's draws depend on its own seed only, not on what other slots sampled.
    logits = np.stack([row] * 8)
    sampler.configure(0, temperature=1.0, seed=5)
    alone = sampler.sample_array(logits, [0] * 8)
    sampler.configure(0, temperature=1.0, seed=5)
    sampler.configure(1, temperature=1.0, seed=99)
    mixed = sampler.sample_array(np.concatenate([logits, logits]), [0, 1] * 8)
    assert list(mixed[0::2]) == list(alone)


def test_temperature_zero_is_greedy(sampler, row):
    sampler.configure(0, temperature=0.0, top_k=3, top_p=0.2, seed=3)
    tokens = sampler.sample_array(np.stack([row] * 5), [0] * 5)
    assert set(tokens) == {int(np.argmax(row))}


def test_draws_follow_the_distribution(sampler):
    logits = np.full(VOCAB, -20.0, dtype=np.float32)
    logits[[3, 7, 11]] = np.log([0.5, 0.3, 0.2])
    sampler.configure(0, temperature=1.0, seed=0)
    tokens = sampler.sample_array(np.stack([logits] * 4000), [0] * 4000)
    freq = np.bincount(tokens, minlength=VOCAB)[[3, 7, 11]] / 4000
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.2], atol=0.04)


def test_rows_of_one_slot_draw_in_row_order_however_many(sampler):
    # a job large enough for the row-parallel pool: rows sharing a slot must still take
    # its RNG in row order (shared between threads they raced, and once crashed)
    logits = np.random.default_rng(3).normal(size=(2000, VOCAB)).astype(np.float32)
    sampler.configure(0, temperature=1.0, seed=11, repeat_penalty=1.1)
    together = sampler.sample_array(logits, [0] * 2000)
    sampler.configure(0, temperature=1.0, seed=11, repeat_penalty=1.1)
    one_by_one = [int(sampler.sample_array(logits[i:i + 1], [0])[0]) for i in range(2000)]
    assert list(together) == one_by_one


def test_tempered_draws_follow_the_scaled_distribution_within_min_p(sampler):
    # temperature and min-p alone take the sampler's direct draw (no candidate list)
    logits = np.full(VOCAB, -30.0, dtype=np.float32)
    logits[[3, 7, 11, 13]] = np.log([0.4, 0.3, 0.2, 0.1])
    sampler.configure(0, temperature=0.5, min_p=0.2, seed=1)
    tokens = sampler.sample_array(np.stack([logits] * 4000), [0] * 4000)
    # p ~ q^2 = .16, .09, .04, .01; min_p keeps p >= 0.2 * .16: token 13 goes
    assert set(tokens.tolist()) == {3, 7, 11}
    freq = np.bincount(tokens, minlength=VOCAB)[[3, 7, 11]] / 4000
    np.testing.assert_allclose(freq, np.array([0.16, 0.09, 0.04]) / 0.29, atol=0.04)


def test_repeat_penalty_demotes_seen_tokens(sampler):
    logits = np.zeros(VOCAB, dtype=np.float32)
    logits[10], logits[20] = 2.0, 1.9
    sampler.configure(0, temperature=0.0, repeat_penalty=1.5, penalty_last_n=8)
    sampler.accept(0, [10])
    assert sampler.sample_array(logits[None], [0])[0] == 20
    sampler.configure(0, temperature=0.0)
    assert sampler.sample_array(logits[None], [0])[0] == 10


def test_penalty_window_forgets_old_tokens(sampler):
    logits = np.zeros(VOCAB, dtype=np.float32)
    logits[10], logits[20] = 2.0, 1.9
    sampler.configure(0, temperature=0.0, presence_penalty=1.0, penalty_last_n=2)
    sampler.accept(0, [10, 500, 501])  # 10 has left the 2-token window
    assert sampler.sample_array(logits[None], [0])[0] == 10


def test_frequency_penalty_scales_with_count(sampler):
    logits = np.zeros(VOCAB, dtype=np.float32)
    logits[10], logits[20] = 2.0, 1.0
    sampler.configure(0, temperature=0.0, frequency_penalty=0.4, penalty_last_n=16)
    sampler.accept(0, [10, 10])  # 2.0 - 2*0.4 = 1.2 still wins
    assert sampler.sample_array(logits[None], [0])[0] == 10
    sampler.accept(0, [10])  # 2.0 - 3*0.4 = 0.8 loses
    assert sampler.sample_array(logits[None], [0])[0] == 20


def test_logprobs_are_log_softmax_of_the_raw_row(sampler, row):
    sampler.configure(0, temperature=0.0)
    tokens, logprobs = sampler.sample_array(row[None], [0], logprobs=True)
    expected = np.log(softmax(row.astype(np.float64)))[tokens[0]]
    assert logprobs[0] == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize(
    "option",
    [
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"min_p": -0.1},
        {"top_k": -2},
        {"repeat_penalty": 0.0},
        {"seed": -1},
        {"temperature": float("nan")},
    ],
)
def test_bad_options_name_the_field(sampler, option):
    with pytest.raises(InvalidRequestError, match=next(iter(option))):
        sampler.configure(0, **option)


def test_bad_slots_and_shapes_are_rejected(sampler, row):
    with pytest.raises(InvalidRequestError, match="slot"):
        sampler.configure(4)
    with pytest.raises(InvalidRequestError):
        sampler.sample_array(row[None], [9])
    with pytest.raises(InvalidRequestError):
        sampler.sample_array(row[:10][None], [0])


@pytest.mark.parametrize("n_vocab", [7, 1024, 5000, 128256])
def test_greedy_takes_the_first_of_equal_maxima_across_blocks_and_never_a_nan(n_vocab):
    s = _core.Sampler(1, n_vocab, 1)
    try:
        rng = np.random.default_rng(n_vocab)
        for _ in range(20):
            row = rng.normal(size=n_vocab).astype(np.float32)
            picks = np.sort(rng.choice(n_vocab, size=min(3, n_vocab), replace=False))
            row[picks] = row.max() + 1.0  # ties, often in different 1024-logit blocks
            row[rng.choice(n_vocab, size=n_vocab // 7, replace=False)] = np.nan
            best = np.nanmax(row)
            expected = int(np.flatnonzero(row == best)[0])
            assert s.sample_array(row[None], [0])[0] == expected
        last = np.zeros(n_vocab, np.float32)
        last[-1] = 1.0  # the maximum in the last, partial block
        assert s.sample_array(last[None], [0])[0] == n_vocab - 1
    finally:
        s.close()


def mask_of(allowed, vocab=VOCAB):
    words = np.zeros((vocab + 31) // 32, np.uint32)
    for t in allowed:
        words[t // 32] |= np.uint32(1 << (t % 32))
    return words


def test_a_mask_leaves_only_its_tokens_and_the_model_s_logprob(sampler, row):
    allowed = [5, 40, 999]  # one in the last, partly used word
    masks = mask_of(allowed)[None, :]
    rows = np.stack([row, row])
    greedy, lp = sampler.sample_array(rows, [0, 1], logprobs=True, masks=masks,
                                      mask_index=[0, -1])
    assert greedy[0] == max(allowed, key=lambda t: row[t])  # the best allowed
    assert greedy[1] == int(np.argmax(row))  # index -1: unconstrained
    # the log-probability is the model's own, before the mask
    assert lp[0] == pytest.approx(np.log(softmax(row.astype(np.float64))[greedy[0]]), rel=1e-4)
    sampler.configure(2, temperature=1.5, top_k=50, top_p=0.95, seed=3,
                      repeat_penalty=1.3, presence_penalty=0.5)
    drawn = {int(sampler.sample_array(row[None], [2], masks=masks, mask_index=[0])[0])
             for _ in range(200)}
    assert drawn <= set(allowed) and len(drawn) > 1  # top-k/top-p over the allowed ones


@pytest.mark.parametrize(("masks", "index", "words"), [
    (np.zeros((1, 3), np.uint32), [0], "masks must have shape"),
    (np.zeros((1, 32), np.uint32), [1], "mask_index must be in"),
    (np.zeros((1, 32), np.uint32), [0, 0], "one entry per row"),
])
def test_bad_masks_are_refused(sampler, row, masks, index, words):
    with pytest.raises(InvalidRequestError, match=words):
        sampler.sample_array(row[None], [0], masks=masks, mask_index=index)


def test_logit_bias_moves_tokens_and_lasts_until_the_slot_is_configured_again(sampler, row):
    best = int(np.argmax(row))
    other = int(np.argsort(row)[len(row) // 2])
    sampler.configure(0, logit_bias={str(best): -100, other: 100})  # JSON-style keys too
    assert sampler.sample_array(row[None], [0])[0] == other
    sampler.configure(0)
    assert sampler.sample_array(row[None], [0])[0] == best
    with pytest.raises(InvalidRequestError, match="no token id"):
        sampler.configure(0, logit_bias={VOCAB: 1.0})
    with pytest.raises(InvalidRequestError, match=r"logit_bias\[3\] must be in"):
        sampler.configure(0, logit_bias={3: 101})


@pytest.mark.parametrize("k", [1, 5, 20])
def test_top_logprobs_are_the_k_most_probable_by_the_raw_row(sampler, row, k):
    rows = np.stack([row, row[::-1].copy(), np.zeros(VOCAB, np.float32)])
    ids, lps = sampler.top_logprobs_array(rows, k)
    assert ids.shape == lps.shape == (3, k)
    for x, got_ids, got_lps in zip(rows, ids, lps, strict=True):
        log_softmax = np.log(softmax(x.astype(np.float64)))
        assert list(got_ids) == list(expected_order(x)[:k])  # ties by id: a flat row too
        np.testing.assert_allclose(got_lps, log_softmax[got_ids], atol=1e-5)
        assert np.all(np.diff(got_lps) <= 0)


def test_top_logprobs_hold_the_greedy_token_first_with_its_logprob(sampler, row):
    sampler.configure(1, temperature=0.0)
    token, lp = sampler.sample_array(row[None], [1], logprobs=True)
    ids, lps = sampler.top_logprobs_array(row[None], 3)
    assert ids[0, 0] == token[0] and lps[0, 0] == pytest.approx(lp[0], abs=1e-6)


@pytest.mark.parametrize("k", [0, 21])
def test_top_logprobs_outside_1_to_20_are_refused(sampler, row, k):
    with pytest.raises(InvalidRequestError, match="k must be in"):
        sampler.top_logprobs_array(row[None], k)
