"""Prompt lookup (uma.engine.drafters)."""

import numpy as np

from uma.config import SamplingParams
from uma.engine.drafters import MATCH_MAX, NgramDrafter, lookup
from uma.request import Request
from uma.sched.state import Priority


def a(*tokens):
    return np.array(tokens, np.int32)


def found(history, k):
    tokens, agreement = lookup(history, k)
    return tokens.tolist(), agreement


def test_the_tokens_after_the_earlier_occurrence_that_agrees_furthest_back():
    # "2 3" occurs twice before the end; the first agrees back to "1 2 3", the second only "2 3"
    history = a(1, 2, 3, 6, 0, 9, 2, 3, 4, 0, 1, 2, 3)
    assert found(history, 1) == ([6], 3)


def test_the_latest_of_equally_agreeing_occurrences():
    history = a(1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3)
    assert found(history, 2) == ([7, 8], 3)


def test_agreement_is_counted_up_to_its_limit():
    passage = list(range(100, 100 + 2 * MATCH_MAX))
    history = a(*passage, 0, *passage[:MATCH_MAX + 5])
    tokens, agreement = found(history, 3)
    assert tokens == passage[MATCH_MAX + 5:MATCH_MAX + 8] and agreement == MATCH_MAX


def test_nothing_when_the_end_is_new_or_a_single_token():
    assert found(a(1, 2, 3, 4, 5), 3) == ([], 0)
    assert found(a(5, 1, 2, 5), 3) == ([], 0)  # only a 1-token match
    assert found(a(7), 3) == ([], 0)
    assert found(a(), 3) == ([], 0)
    assert found(a(1, 2, 1, 2), 0) == ([], 0)


def test_at_most_k_and_a_match_that_runs_into_the_end_repeats():
    history = a(1, 2, 3, 4, 1, 2)
    assert found(history, 1) == ([3], 2)
    assert found(history, 4) == ([3, 4, 1, 2], 2)
    # "1 2 3 4" is repeating: what follows the end is that stretch again
    assert found(history, 10) == ([3, 4, 1, 2, 3, 4, 1, 2, 3, 4], 2)
    assert len(found(a(*[5, 6] * 3), 200)[0]) == MATCH_MAX


def test_the_drafter_follows_a_growing_answer():
    req = Request(1, a(10, 11, 12, 13, 14), SamplingParams(), Priority.INTERACTIVE, 0)
    drafter = NgramDrafter()
    assert drafter.propose(req, 4)[0].tolist() == []
    for token in (99, 10, 11):
        req.generated.append(token)
    assert drafter.propose(req, 4)[0].tolist() == [12, 13, 14, 99]
    assert drafter.propose(req, 8)[0].tolist() == [12, 13, 14, 99, 10, 11, 12, 13]
    req.generated.extend(range(200, 400))  # grows past the first buffer
    req.generated.extend([12, 13])
    assert drafter.propose(req, 2)[0].tolist() == [14, 99]
    drafter.forget(1)
    assert drafter._histories == {}


def test_the_drafters_index_finds_what_a_scan_finds():
    """The drafter looks the last pair up in its index of every pair's places; a scan of the
    whole history must find the same guesses, whatever the text (a small vocabulary, so that
    pairs recur), as the history grows a token or several at a time (a stream left quiet
    catches up on the tokens it made meanwhile)."""
    rng = np.random.default_rng(7)
    for trial in range(30):
        vocab = int(rng.integers(2, 12))
        prompt = rng.integers(0, vocab, int(rng.integers(0, 80))).astype(np.int32)
        req = Request(trial, prompt, SamplingParams(), Priority.INTERACTIVE, 0)
        drafter = NgramDrafter()
        for _ in range(60):
            got = drafter.propose(req, 9)
            history = np.concatenate([prompt, np.array(req.generated, np.int32)])
            want = lookup(history, 9)
            assert got[0].tolist() == want[0].tolist() and got[1] == want[1]
            req.generated.extend(rng.integers(0, vocab, int(rng.integers(1, 6))).tolist())
