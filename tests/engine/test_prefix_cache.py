"""The prefix cache's KV tier on the real core: hits prefill only the rest and change no token,
entries leave for running work (those worth least to keep first), and it can be turned off
(per engine and per request)."""

import numpy as np
import pytest

import uma
from uma import _core
from uma.engine.prefix_cache import MIN_REUSE_TOKENS, KvPrefixCache
from uma.engine.prefix_disk import DiskTier
from uma.engine.prefix_index import Reuses
from uma.sched.cost import CostEstimate

from ..helpers import assert_same_greedy

SYSTEM = "You are a careful assistant who answers in one short sentence. " * 12
QUESTIONS = ["What is a lighthouse?", "Why is the sea salty at all?", "Name three birds."]


def engine(tiny_path, **options):
    return uma.Engine(tiny_path, **{"n_ctx": 4096, "n_seq_max": 2, **options})


@pytest.fixture(scope="module")
def cold(tiny_path):
    """Each prompt's greedy tokens with no cache."""
    with engine(tiny_path, prefix_cache=0) as e:
        return {q: e.generate(SYSTEM + q, max_tokens=16, ignore_eos=True, logprobs=True)
                for q in QUESTIONS}


def same(expected, got):
    assert_same_greedy(expected.token_ids, got.token_ids, expected.logprobs, got.logprobs)


def test_a_shared_system_prompt_is_prefilled_once(tiny_path, cold):
    with engine(tiny_path) as e:
        results = [e.generate(SYSTEM + q, max_tokens=16, ignore_eos=True, logprobs=True)
                   for q in QUESTIONS]
        snap = e.snapshot()
        system = len(e.model.tokenize(SYSTEM))
    assert results[0].usage.cached_tokens == 0
    for r, q in zip(results, QUESTIONS, strict=True):
        same(cold[q], r)
    # every later request reuses at least the system prompt, never its own last token
    for r in results[1:]:
        assert system - 2 <= r.usage.cached_tokens < r.usage.prompt_tokens
    assert snap["prefix_cache_hits_total"] == 2
    assert snap["prefix_cache_reused_tokens_total"] == sum(r.usage.cached_tokens
                                                          for r in results)


def test_the_same_prompt_again_re_evaluates_only_its_last_token(tiny_path, cold):
    q = QUESTIONS[0]
    with engine(tiny_path) as e:
        first = e.generate(SYSTEM + q, max_tokens=16, ignore_eos=True, logprobs=True)
        again = e.generate(SYSTEM + q, max_tokens=16, ignore_eos=True, logprobs=True)
    assert again.usage.cached_tokens == again.usage.prompt_tokens - 1
    same(cold[q], first)
    same(cold[q], again)


def test_a_chats_next_turn_starts_where_the_last_one_ended(tiny_path):
    with engine(tiny_path) as e, engine(tiny_path, prefix_cache=0) as plain:
        turn1 = e.model.tokenize(SYSTEM + QUESTIONS[0])
        reply = e.generate(turn1, max_tokens=24, ignore_eos=True)
        # the next turn: the history as tokens (the reply as generated), a new question
        turn2 = np.concatenate([turn1, reply.token_ids,
                                e.model.tokenize(QUESTIONS[1], add_special=False)])
        hit = e.generate(turn2, max_tokens=16, ignore_eos=True, logprobs=True)
        miss = plain.generate(turn2, max_tokens=16, ignore_eos=True, logprobs=True)
    # the KV held the prompt and every reply token but the last (sampled, never decoded)
    assert hit.usage.cached_tokens == len(turn1) + len(reply.token_ids) - 1
    same(miss, hit)


def test_cached_entries_leave_when_running_work_needs_the_room(tiny_path, cold):
    """A context with room for about one request at a time: each new prompt finds the cache
    holding the last one's cells, which must go for the decode to fit."""
    prompts = [SYSTEM + q for q in QUESTIONS] * 2
    with engine(tiny_path, n_ctx=256, n_seq_max=1) as e:
        results = [e.generate(p, max_tokens=16, ignore_eos=True, logprobs=True)
                   for p in prompts]
        snap = e.snapshot()
    for r, q in zip(results, QUESTIONS * 2, strict=True):
        same(cold[q], r)
    assert snap["preemptions_total"] == 0 and snap["requests_error_total"] == 0


def test_a_small_budget_keeps_the_most_reused(tiny_path):
    """Room for one entry (and no host memory): the first question's entry, which every later
    question reused, stays, and each new one (never reused) leaves; the system prompt still
    hits."""
    with engine(tiny_path, prefix_cache_tokens=200, prefix_cache_ram_mb=0) as e:
        for q in QUESTIONS:
            e.generate(SYSTEM + q, max_tokens=4, ignore_eos=True)
        again = e.generate(SYSTEM + QUESTIONS[0], max_tokens=4, ignore_eos=True)
        other = e.generate(SYSTEM + QUESTIONS[-1], max_tokens=4, ignore_eos=True)
        system = len(e.model.tokenize(SYSTEM))
    assert again.usage.cached_tokens == again.usage.prompt_tokens - 1
    assert system - 2 <= other.usage.cached_tokens < other.usage.prompt_tokens - 1
    # After close: a result goes out before its KV is kept (a snapshot of an entry leaving
    # for room would hold it), so the cache's figures are final once the thread has joined.
    assert 0 < e.snapshot()["prefix_cache_tokens"] <= 200


def test_a_system_prompt_several_apps_share_outlives_one_off_conversations(tiny_path):
    """A working day in miniature: three apps send one system prompt, then three chats of four
    turns fill the token budget (no host memory to fall back on). Under least-recent use the
    chats' turns pushed every entry holding the system prompt out (see
    tests/engine/test_prefix_index.py); weighed by reuse one of them stays, a fourth app's
    prompt finds it, and every chat's turn still starts where the last one ended."""
    with engine(tiny_path, n_seq_max=1, prefix_cache=8, prefix_cache_tokens=600,
                prefix_cache_ram_mb=0) as e:
        for a, q in enumerate(QUESTIONS):
            e.generate(SYSTEM + q, max_tokens=4, ignore_eos=True, app=f"app{a}")
        for c in range(3):
            history = e.model.tokenize(f"Chat {c}: let us talk about harbours and ships. ")
            kept = 0  # the last turn's KV: its prompt and reply but the reply's last token
            for turn in range(4):
                r = e.generate(history, max_tokens=4, ignore_eos=True, app=f"chat{c}")
                assert r.usage.cached_tokens == kept
                kept = len(history) + len(r.token_ids) - 1
                more = e.model.tokenize(f" Turn {turn}: and the lighthouses on the coast?" * 2,
                                        add_special=False)
                history = np.concatenate([history, r.token_ids, more])
        later = e.generate(SYSTEM + "How far is the moon?", max_tokens=4, ignore_eos=True,
                           app="app3")
        snap = e.snapshot()
        system = len(e.model.tokenize(SYSTEM))
    assert later.usage.cached_tokens >= system - 2
    assert snap["prefix_cache_hits_total"] == 2 + 3 * 3 + 1
    assert snap["prefix_cache_kv_evictions_total"] > 0 and snap["prefix_cache_tokens"] <= 600
    # the cache's figures per app: apps 1-2 and the later app3 reused the system prompt, each
    # chat its own turns from the second on
    hits = snap["app_prefix_cache_hits_total"]
    assert hits == {"app1": 1, "app2": 1, "app3": 1, "chat0": 3, "chat1": 3, "chat2": 3}
    tokens = snap["app_prefix_cache_reused_tokens_total"]
    assert tokens["app3"] == later.usage.cached_tokens
    assert sum(tokens.values()) == snap["prefix_cache_reused_tokens_total"]


def test_an_entrys_record_goes_with_it_to_host_memory_and_back(model):
    """Reused by a second app, an entry leaves the KV cache with its record; restored for a
    third app, the entry that request leaves carries it on."""
    ctx = _core.Context(model, n_ctx=512, n_seq_max=2)
    batch = _core.Batch(128)
    try:
        cache = KvPrefixCache(ctx, range(1, 2), budget=512, ram_budget=1 << 24)
        tokens = np.arange(100, 200, dtype=np.int32)
        prompt = np.append(tokens, 7).astype(np.int32)
        batch.add_sequence(tokens, 0, 0)
        ctx.decode(batch)
        cache.keep(0, tokens, app="a")
        ctx.seq_rm(0)
        assert cache.reuse(0, prompt, app="b") == 100  # shared live cells: a hit
        ctx.seq_rm(0)
        assert cache.evict_one() and len(cache) == 0  # copied whole: nothing runs
        ram = cache.index.longest(tokens, "ram").entry
        assert cache.index.entry(ram).reuses == Reuses(1, frozenset("ab"), matched=100)
        assert cache.reuse(0, prompt, app="c") == 100  # restored: a hit on the snapshot
        assert cache.index.entry(ram).reuses == Reuses(2, frozenset("abc"), matched=100)
        cache.keep(0, tokens, app="c")
        kv = cache.index.longest(tokens, "kv").entry
        assert cache.index.entry(kv).reuses == Reuses(2, frozenset("abc"), matched=100)
    finally:
        batch.close()
        ctx.close()


def test_an_entry_leaving_in_slices_keeps_its_record(model):
    """A chat's next turn extends an entry another app reused: the earlier one, worth nothing
    now, leaves in slices, and its snapshot carries the record."""
    ctx = _core.Context(model, n_ctx=1024, n_seq_max=4)
    batch = _core.Batch(256)
    try:
        cache = KvPrefixCache(ctx, range(1, 4), budget=200, ram_budget=1 << 24)
        cache.idle = lambda: False  # slices do not ask
        longer = np.arange(100, 250, dtype=np.int32)
        batch.add_sequence(longer[:100], 0, 0)
        ctx.decode(batch)
        cache.keep(0, longer[:100], app="a")
        ctx.seq_rm(0)
        assert cache.reuse(0, longer, app="b") == 100  # the next turn starts there
        batch.clear()
        batch.add_sequence(longer[100:], 100, 0)
        ctx.decode(batch)
        cache.keep(0, longer, app="b")  # over the budget: the shorter entry leaves
        ctx.seq_rm(0)
        assert cache.saving and len(cache) == 1
        cache.save(float("inf"))
        ram = cache.index.longest(longer[:100], "ram")
        assert ram.length == 100 and cache.ram_bytes > 0
        assert cache.index.entry(ram.entry).reuses == Reuses(1, frozenset("ab"), matched=100)
    finally:
        batch.close()
        ctx.close()


@pytest.mark.parametrize("options", [{"prefix_cache": 0}, {"prefix_cache_tokens": 0},
                                     {"kv_unified": False}])
def test_the_cache_can_be_off(tiny_path, options):
    with engine(tiny_path, **options) as e:
        for _ in range(2):
            r = e.generate(SYSTEM + QUESTIONS[0], max_tokens=4, ignore_eos=True)
        assert r.usage.cached_tokens == 0
        assert e.snapshot()["prefix_cache_lookups_total"] == 0
        assert e.ctx.n_seq_max == 2  # no spare sequences


def test_a_request_may_opt_out(tiny_path):
    with engine(tiny_path) as e:
        e.generate(SYSTEM + QUESTIONS[0], max_tokens=4, ignore_eos=True)
        r = e.generate(SYSTEM + QUESTIONS[0], max_tokens=4, ignore_eos=True,
                       cache_prompt=False)
    assert r.usage.cached_tokens == 0


def test_short_prefixes_are_not_worth_a_copy(model):
    ctx = _core.Context(model, n_ctx=512, n_seq_max=3)
    batch = _core.Batch(64)
    try:
        cache = KvPrefixCache(ctx, range(1, 3), budget=512)
        short = np.arange(100, 100 + MIN_REUSE_TOKENS - 1, dtype=np.int32)
        batch.add_sequence(short, 0, 0)
        ctx.decode(batch)
        cache.keep(0, short)
        assert len(cache) == 0
        long = np.arange(100, 140, dtype=np.int32)
        ctx.seq_rm(0)
        batch.clear()
        batch.add_sequence(long, 0, 0)
        ctx.decode(batch)
        cache.keep(0, long)
        ctx.seq_rm(0)
        assert len(cache) == 1 and cache.tokens == 40
        assert cache.reuse(0, long[:MIN_REUSE_TOKENS]) == 0  # all but the last: too short
        assert cache.reuse(0, long[:30]) == 29 and ctx.seq_pos_max(0) == 28
        assert cache.evict_one() and not cache.evict_one()
    finally:
        batch.close()
        ctx.close()


@pytest.mark.parametrize("ram_mb", [64, 0])
def test_an_entry_that_leaves_the_kv_cache_comes_back_from_host_memory(tiny_path, cold, ram_mb):
    """One spare sequence: an unrelated prompt pushes the system prompt's entry out; with
    host memory it is restored for the next question (trimmed to the match), without it the
    prompt is prefilled whole; the greedy tokens are the uncached ones either way."""
    with engine(tiny_path, n_seq_max=1, prefix_cache=1, prefix_cache_ram_mb=ram_mb) as e:
        e.generate(SYSTEM + QUESTIONS[0], max_tokens=8, ignore_eos=True)
        e.generate("Something else entirely, " * 20, max_tokens=4, ignore_eos=True)
        back = e.generate(SYSTEM + QUESTIONS[1], max_tokens=16, ignore_eos=True,
                          logprobs=True)
        snap = e.snapshot()
        system = len(e.model.tokenize(SYSTEM))
    same(cold[QUESTIONS[1]], back)
    if ram_mb:
        assert system - 2 <= back.usage.cached_tokens < back.usage.prompt_tokens
        assert snap["prefix_cache_restored_bytes_total"] > 0
        assert 0 < snap["prefix_cache_ram_bytes"] <= ram_mb << 20
    else:
        assert back.usage.cached_tokens == 0 and snap["prefix_cache_ram_bytes"] == 0


def test_a_restore_keeps_only_the_matching_positions(model):
    ctx = _core.Context(model, n_ctx=512, n_seq_max=2)
    batch = _core.Batch(128)
    try:
        cache = KvPrefixCache(ctx, range(1, 2), budget=512, ram_budget=1 << 24)
        tokens = np.arange(100, 200, dtype=np.int32)
        batch.add_sequence(tokens, 0, 0)
        ctx.decode(batch)
        cache.keep(0, tokens)
        ctx.seq_rm(0)
        assert cache.evict_one() and len(cache) == 0 and cache.ram_bytes > 0
        prompt = np.concatenate([tokens[:90], np.arange(500, 520, dtype=np.int32)])
        # where prefilling the match is predicted cheaper than copying the snapshot back,
        # the prompt is prefilled instead
        assert cache.reuse(0, prompt, CostEstimate(per_prefill_ms=1e-6)) == 0
        assert ctx.seq_pos_max(0) == -1 and cache.restored_bytes == 0
        assert cache.reuse(0, prompt) == 90
        assert ctx.seq_pos_max(0) == 89 and cache.restored_bytes > 0
        assert cache.restore_ms > 0  # timed: later choices use the bandwidth it showed
    finally:
        batch.close()
        ctx.close()


def test_an_entry_that_must_leave_at_once_is_copied_only_while_idle(model):
    """No scratch sequence (one spare): an entry pushed out for room is copied whole where
    the scheduler says nothing runs or waits, and dropped, counted unsaved, where it does not."""
    ctx = _core.Context(model, n_ctx=512, n_seq_max=2)
    batch = _core.Batch(128)
    idle, unsaved = [False], []
    try:
        cache = KvPrefixCache(ctx, range(1, 2), budget=512, ram_budget=1 << 24)
        cache.idle = lambda: idle[0]
        cache.on_unsaved = lambda: unsaved.append(1)
        tokens = np.arange(100, 200, dtype=np.int32)
        for allowed in (False, True):
            idle[0] = allowed
            batch.clear()
            batch.add_sequence(tokens, 0, 0)
            ctx.decode(batch)
            cache.keep(0, tokens)
            ctx.seq_rm(0)
            assert cache.evict_one() and len(cache) == 0 and not cache.saving
            assert (cache.ram_bytes > 0) == allowed
            tokens = tokens + 100  # a new entry: one the RAM tier does not cover yet
        assert unsaved == [1] and cache.snapshot_seconds > 0
    finally:
        batch.close()
        ctx.close()


def test_entries_over_the_budget_leave_in_slices_and_come_back(model):
    """Three 100-token entries in a budget of 250 (a scratch sequence among the spares): the
    oldest leaves through slices, its cells held until `save` copies them; restored, the
    next token's logits are those it gave before it left."""
    ctx = _core.Context(model, n_ctx=1024, n_seq_max=5)
    batch = _core.Batch(128)
    try:
        cache = KvPrefixCache(ctx, range(1, 5), budget=250, ram_budget=1 << 24)
        cache.idle = lambda: False  # slices do not ask
        entries = [np.arange(100 * k, 100 * k + 100, dtype=np.int32) for k in (1, 2, 3)]
        expected = None
        for tokens in entries:
            batch.clear()
            batch.add_sequence(tokens, 0, 0)
            ctx.decode(batch)
            if expected is None:  # the next token's logits, decoded as after the restore
                batch.clear()
                batch.add(7, 100, 0, True)
                ctx.decode(batch)
                expected = np.array(ctx.logits()[0], copy=True)
                ctx.seq_rm(0, 100, -1)
            cache.keep(0, tokens)
            ctx.seq_rm(0)
        assert len(cache) == 2 and cache.saving and cache.ram_bytes == 0
        assert cache.reuse(0, np.append(entries[0], 7)) == 0  # out of the KV tier already
        cache.save(float("inf"))
        assert not cache.saving and cache.ram_bytes > 0
        assert cache.snapshots.tokens_copied == 100
        prompt = np.append(entries[0], 7).astype(np.int32)
        assert cache.reuse(0, prompt) == 100
        batch.clear()
        batch.add(7, 100, 0, True)
        ctx.decode(batch)
        # the same KV in other cells, among the other entries': attention sums in another
        # order (a few thousandths apart; a wrong or partial restore is whole units off)
        np.testing.assert_allclose(ctx.logits()[0], expected, atol=0.02)
    finally:
        batch.close()
        ctx.close()


def test_entries_leave_in_slices_while_others_run_and_none_is_unsaved(tiny_path):
    """A small token budget with spares to spare: entries pushed out while another request
    decodes leave in slices, none dropped unsaved, and no request's tokens change."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(100, 2000, 40).astype(np.int32) for _ in range(4)]
    with engine(tiny_path, n_seq_max=2, prefix_cache=0) as e:
        expected = [e.generate(p, max_tokens=4, ignore_eos=True, logprobs=True)
                    for p in prompts[1:]]
    with engine(tiny_path, n_seq_max=2, prefix_cache=4, prefix_cache_tokens=100,
                prefix_cache_ram_mb=64, n_gpu_layers=0) as e:
        long = e.submit(prompts[0], max_tokens=200, ignore_eos=True)
        got = [e.generate(p, max_tokens=4, ignore_eos=True, logprobs=True)
               for p in prompts[1:]]
        long.result()
        snap = e.snapshot()
    for a, b in zip(expected, got, strict=True):
        same(a, b)
    assert snap["prefix_cache_kv_evictions_total"] >= 1
    assert snap["prefix_cache_unsaved_total"] == 0


def test_a_request_cancelled_at_its_restore_leaves_other_work_and_the_cache_intact(
        tiny_path, cold):
    """A request whose prompt is restored from host memory is cancelled as soon as it is
    submitted, wherever that lands (queued, at its restore, prefilling): a stream running
    beside it keeps its tokens, and the snapshot still serves the next such prompt."""
    other = "Something else entirely, " * 20
    with engine(tiny_path, prefix_cache=0) as e:
        beside_cold = e.generate(other, max_tokens=48, ignore_eos=True, logprobs=True)
    with engine(tiny_path, n_seq_max=2, prefix_cache=1, prefix_cache_ram_mb=64) as e:
        e.generate(SYSTEM + QUESTIONS[0], max_tokens=4, ignore_eos=True)
        e.generate(other, max_tokens=4, ignore_eos=True)  # pushes the system prompt to RAM
        beside = e.submit(other, max_tokens=48, ignore_eos=True, logprobs=True)
        gone = e.submit(SYSTEM + QUESTIONS[1], max_tokens=64, ignore_eos=True)
        gone.cancel()
        assert gone.result(timeout=60).finish_reason == "cancelled"
        same(beside_cold, beside.result(timeout=60))
        again = e.generate(SYSTEM + QUESTIONS[1], max_tokens=16, ignore_eos=True,
                           logprobs=True)
        snap = e.snapshot()
        system = len(e.model.tokenize(SYSTEM))
    same(cold[QUESTIONS[1]], again)
    assert again.usage.cached_tokens >= system - 2
    assert snap["requests_error_total"] == 0


def test_entries_leave_while_requests_run_side_by_side(tiny_path):
    """Rounds of two requests at once, each round's prompts new, in a context that holds
    about two requests: every round finds the last round's entries in the way and they leave
    for it; no request fails, is preempted or changes a token."""
    prompts = [[f"Round {r} app {a}: " + "tell me more about the harbour. " * 8
                for a in range(2)] for r in range(3)]
    with engine(tiny_path, n_ctx=512, prefix_cache=0) as e:
        expected = {p: e.generate(p, max_tokens=24, ignore_eos=True, logprobs=True)
                    for pair in prompts for p in pair}
    with engine(tiny_path, n_ctx=512, n_seq_max=2) as e:
        for pair in prompts:
            handles = [e.submit(p, max_tokens=24, ignore_eos=True, logprobs=True)
                       for p in pair]
            for p, h in zip(pair, handles, strict=True):
                same(expected[p], h.result(timeout=60))
        snap = e.snapshot()
    assert snap["prefix_cache_tokens"] > 0  # entries were kept...
    assert snap["prefix_cache_kv_evictions_total"] > 0  # ...and left for the next rounds
    assert snap["requests_error_total"] == 0 and snap["preemptions_total"] == 0


def test_an_entry_whose_copy_costs_more_than_its_prefill_leaves_unsaved(model):
    """Where prefilling an entry is predicted cheaper than copying it out (a GPU's one-off
    request, its cells scattered), its first slice shows it and the rest is not copied: its
    cells are freed, nothing is filed, and it is not counted unsaved (nothing worth it was
    lost)."""
    ctx = _core.Context(model, n_ctx=1024, n_seq_max=5)
    batch = _core.Batch(128)
    unsaved = []
    try:
        cache = KvPrefixCache(ctx, range(1, 5), budget=150, ram_budget=1 << 24)
        cache.prefill_ms = lambda n: 0.0
        cache.on_unsaved = lambda: unsaved.append(1)
        for k in (1, 2):
            tokens = np.arange(100 * k, 100 * k + 100, dtype=np.int32)
            batch.clear()
            batch.add_sequence(tokens, 0, 0)
            ctx.decode(batch)
            cache.keep(0, tokens)
            ctx.seq_rm(0)
        assert cache.saving
        cache.save(float("inf"))
        assert not cache.saving and cache.ram_bytes == 0 and not unsaved
        assert cache.snapshots.tokens_copied < 100
        assert ctx.seq_pos_max(4) == -1 and len(cache) == 1
    finally:
        batch.close()
        ctx.close()


def test_one_spare_is_kept_free_by_one_entry_leaving_not_by_all(model):
    """Eight spares, nothing copied meanwhile: the eighth entry sends the least recently used
    one out in slices (its sequence counts as free: it comes back once copied); the ninth,
    finding no free spare, gives that one up and sends the next out. Seven stay in the KV
    tier throughout, however long the copies take."""
    ctx = _core.Context(model, n_ctx=1024, n_seq_max=10)
    batch = _core.Batch(128)
    try:
        cache = KvPrefixCache(ctx, range(1, 10), budget=1000, ram_budget=1 << 24)
        for k in range(9):
            tokens = np.arange(20 * k + 100, 20 * k + 140, dtype=np.int32)
            batch.clear()
            batch.add_sequence(tokens, 0, 0)
            ctx.decode(batch)
            cache.keep(0, tokens)
            ctx.seq_rm(0)
        assert len(cache.snapshots) == 1 and len(cache) == 7
    finally:
        batch.close()
        ctx.close()


def test_the_disk_gets_what_leaves_host_memory_reused_and_the_rest_at_close(model, tmp_path):
    """Snapshots are not written through: one reused and pushed out of host memory goes to
    disk then, one never reused is let go, and what host memory holds is written as the
    cache closes."""
    ctx = _core.Context(model, n_ctx=1024, n_seq_max=2)
    batch = _core.Batch(128)
    disk = DiskTier(tmp_path, "key", 1 << 26)
    try:
        cache = KvPrefixCache(ctx, range(1, 2), budget=512, ram_budget=1 << 24, disk=disk)

        def to_ram(tokens, reused):
            batch.clear()
            batch.add_sequence(tokens, 0, 0)
            ctx.decode(batch)
            cache.keep(0, tokens, app="a")
            ctx.seq_rm(0)
            if reused:
                assert cache.reuse(0, np.append(tokens, 7).astype(np.int32), app="b") > 0
                ctx.seq_rm(0)
            assert cache.evict_one()  # copied whole into host memory: nothing runs
            disk.flush()

        once, shared, later = (np.arange(s, s + 100, dtype=np.int32) for s in (100, 300, 500))
        to_ram(once, reused=False)
        assert not disk.path_of(once).exists()  # in host memory only
        cache.ram_budget = cache.ram_bytes + cache.ram_bytes // 2  # room for one snapshot
        to_ram(shared, reused=True)  # pushes the unused one out: let go
        assert cache.index.longest(once, "ram") is None and not disk.path_of(once).exists()
        assert not disk.path_of(shared).exists()
        to_ram(later, reused=True)  # pushes the older reused one out: to disk
        assert cache.index.longest(shared, "ram") is None and disk.path_of(shared).exists()
        assert not disk.path_of(later).exists()
        # a chat's next turn: the earlier one, reused, is held whole by the longer entry
        longer = np.concatenate([later, np.arange(900, 920, dtype=np.int32)])
        to_ram(longer, reused=True)
        held = cache.index.longest(later, "ram").entry  # `later` left; `longer` holds it
        assert cache.index.entry(held).tokens == len(longer)
        assert not disk.path_of(later).exists()
        cache.persist()  # what host memory holds, written as it closes
        assert disk.path_of(longer).exists()
        assert not disk.path_of(once).exists() and not disk.path_of(later).exists()
    finally:
        disk.close()
        batch.close()
        ctx.close()


def test_an_entry_reused_for_its_start_goes_to_disk_as_that_start_once(model, tmp_path):
    """Agents' entries, each a shared system prompt and a question of its own, were reused by
    other agents for the system prompt only: what leaves host memory for disk is that prompt,
    one file for both, and reading it back restores it."""
    ctx = _core.Context(model, n_ctx=1024, n_seq_max=2)
    batch = _core.Batch(256)
    disk = DiskTier(tmp_path, "key", 1 << 26)
    try:
        cache = KvPrefixCache(ctx, range(1, 2), budget=512, ram_budget=1 << 24, disk=disk)
        system = np.arange(100, 180, dtype=np.int32)

        def agent(question_start):
            return np.concatenate([system, np.arange(question_start, question_start + 30,
                                                     dtype=np.int32)])

        def to_ram(tokens):
            batch.clear()
            batch.add_sequence(tokens, 0, 0)
            ctx.decode(batch)
            cache.keep(0, tokens, app="a")
            ctx.seq_rm(0)
            # another agent: the same system prompt, its own question
            assert cache.reuse(0, agent(900), app="b") == len(system)
            ctx.seq_rm(0)
            assert cache.evict_one()  # copied whole into host memory: nothing runs
            disk.flush()

        first, second = agent(400), agent(600)
        to_ram(first)
        cache.ram_budget = cache.ram_bytes + cache.ram_bytes // 2  # room for one snapshot
        to_ram(second)  # pushes the first out of host memory: to disk, as the shared prompt
        disk.flush()
        assert disk.path_of(system).exists() and not disk.path_of(first).exists()
        cache.ram_budget = 1 << 24
        cache.clear()
        to_ram(agent(700))
        cache.ram_budget = cache.ram_bytes + cache.ram_bytes // 2
        to_ram(agent(800))  # the next agent's entry leaves as the same prompt: no new file
        disk.flush()
        assert [p.name for p in tmp_path.rglob("*.kv")] == [disk.path_of(system).name]
        saved = list(disk.read(1 << 26))
        assert [len(s.tokens) for s in saved] == [len(system)]
        assert all(p.start < len(system) for p in saved[0].parts)
    finally:
        disk.close()
        batch.close()
        ctx.close()
