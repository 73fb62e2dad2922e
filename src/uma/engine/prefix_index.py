"""Which cached token prefixes exist, which one a prompt should reuse, and which to drop.

A prefix cache keeps the KV of earlier requests in two tiers: "kv" (cells still in the live
KV cache, shared with a new sequence at no copy cost) and "ram" (a host snapshot that has to be
restored first). This module only decides: it records what exists, answers "what is the longest
cached prefix of this prompt", and plans evictions against a budget. It does no I/O and never
calls the native core, so the caller owns the memory and frees it when told an entry goes.

Each entry records its reuse (`Reuses`: the prompts admitted with a prefix from it, and the
apps that inserted or reused it), and evictions take the entries worth least to keep first
(uma.sched.reuse.keep_value: what they save per unit they hold, decayed by the uses of the
cache since their last), ties least recently used first. What an entry saves is what the
tier would lose without it: a prefix several entries hold is credited to one of them, its
keeper (a pinned one, else the most valuable: the one likeliest to stay), and the others only
with the tokens past it. So an entry that a longer one of its tier extends (a chat's earlier
turn) is worth nothing, and of six apps' entries that start with one system prompt, five are
worth their own questions. A prefix is lost only when every entry holding it goes, its keeper
among them, so a plan made in one pass never undervalues what its victims take with them.

The index is a radix (compressed) trie over token ids. Every node stores the tokens of its
incoming edge and, for each tier, the most recently used entry anywhere in its subtree, so
a lookup walks one root-to-leaf path and reads the answer at the node where the prompt
diverges. Costs, with L the prompt length and d the number of trie nodes on its path
(d <= min(L, number of entries) + 1):

- longest(), covering(): O(L) token comparisons (vectorised, per edge) plus O(d) Python steps,
  independent of how many entries share nothing with the prompt;
- insert(), touch(): O(L + d);
- remove(): O(d * fan-out), since subtree maxima must be recomputed from the children;
- evictions(), value(): O(N + n log n), with n the entries of the tier and N < 2 x all
  entries the trie's nodes: one pass over the nodes finds each prefix's keeper, then a sort
  by keep value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from uma.errors import InvalidRequestError
from uma.sched.reuse import MAX_APPS, keep_value

Tier = Literal["kv", "ram"]
TIERS: tuple[Tier, ...] = ("kv", "ram")  # also the preference order at equal match length

Tokens = npt.NDArray[np.int64]
Recency = tuple[int, int]  # (last use on the logical clock, entry id): larger is fresher


@dataclasses.dataclass(frozen=True)
class Match:
    entry: int  # id of the cached entry to reuse
    tier: Tier  # where its KV lives
    length: int  # tokens shared with the prompt; may be shorter than the entry


@dataclasses.dataclass(frozen=True)
class Reuses:
    """An entry's record of reuse; it goes with the entry's KV when that moves between tiers."""

    hits: int = 0  # prompts admitted with a prefix from it (not inserts or refreshes)
    apps: frozenset[str] = frozenset()  # who inserted or reused it, at most MAX_APPS of them
    matched: int = 0  # the longest prefix of it a hit reused, in tokens (0: never reused)

    def used_by(self, app: str, hit: bool = False, length: int = 0) -> Reuses:
        """This record once `app` ("": not told) refreshed it, or reused its first `length`
        tokens where `hit`."""
        apps = self.apps
        if app and app not in apps and len(apps) < MAX_APPS:
            apps = apps | {app}
        return Reuses(self.hits + hit, apps, max(self.matched, length) if hit else self.matched)


@dataclasses.dataclass(frozen=True)
class EntryInfo:
    entry: int
    tier: Tier
    tokens: int  # length of the cached sequence
    nbytes: int  # size of a "ram" snapshot; 0 for "kv"
    last_used: int  # logical clock value of the last insert, touch or hit
    pins: int  # running requests that depend on it; pinned entries are never evicted
    reuses: Reuses  # how often and by whom it was reused


@dataclasses.dataclass(frozen=True)
class EvictionPlan:
    victims: tuple[int, ...]  # entry ids to free and remove(), least worth keeping first
    total_after: int  # the tier's total once they are gone (tokens or bytes)
    budget: int

    @property
    def fits(self) -> bool:
        """False when pinned entries alone exceed the budget: every unpinned one is a victim
        and the tier stays over; the caller serves the request anyway."""
        return self.total_after <= self.budget


@dataclasses.dataclass(frozen=True)
class TierStats:
    entries: int
    pinned: int  # entries with at least one pin
    tokens: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class PrefixStats:
    kv: TierStats
    ram: TierStats
    node_visits: int  # trie nodes walked by all lookups so far


@dataclasses.dataclass(eq=False)
class _Node:
    label: Tokens  # tokens on the edge from the parent
    depth: int  # tokens from the root to the end of this node's edge
    parent: _Node | None
    children: dict[int, _Node] = dataclasses.field(default_factory=dict)
    entries: dict[str, _Entry] = dataclasses.field(default_factory=dict)  # at most one a tier
    best: dict[str, Recency] = dataclasses.field(default_factory=dict)  # freshest in subtree


@dataclasses.dataclass(eq=False)
class _Entry:
    id: int
    tier: Tier
    nbytes: int
    last_used: int
    node: _Node
    reuses: Reuses
    pins: int = 0

    @property
    def tokens(self) -> int:
        return self.node.depth


def _as_tokens(tokens: Sequence[int] | npt.ArrayLike, *, copy: bool) -> Tokens:
    try:
        array = np.array(tokens, dtype=np.int64, copy=copy or None)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidRequestError(f"tokens must be a sequence of integer ids: {exc}") from None
    if array.ndim != 1:
        raise InvalidRequestError(f"tokens must be one-dimensional, not shape {array.shape}")
    return array


def _check_tier(tier: str) -> Tier:
    if tier not in TIERS:
        raise InvalidRequestError(f"tier must be 'kv' or 'ram', not {tier!r}")
    return tier  # narrowed to Tier by the membership test


def _common_prefix(a: Tokens, b: Tokens) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differs = a[:n] != b[:n]
    first = int(differs.argmax())
    return first if differs[first] else n


class PrefixIndex:
    """Cached token prefixes in two tiers, with recency, reuse records and pins. Not
    thread-safe: the scheduler that owns the KV cache is its only user."""

    def __init__(self) -> None:
        self._root = _Node(label=np.empty(0, dtype=np.int64), depth=0, parent=None)
        self._entries: dict[int, _Entry] = {}
        self._next_id = 0
        self._clock = 0
        self._tokens = dict.fromkeys(TIERS, 0)
        self._bytes = dict.fromkeys(TIERS, 0)
        self.node_visits = 0  # counts trie nodes walked by lookups, for tests and metrics

    # --- queries --------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, entry: object) -> bool:
        return entry in self._entries

    def total(self, tier: str) -> int:
        """What the budget of a tier counts: tokens for "kv", bytes for "ram"."""
        tier = _check_tier(tier)
        return self._tokens[tier] if tier == "kv" else self._bytes[tier]

    def longest(self, tokens: Sequence[int] | npt.ArrayLike, tier: str | None = None
                ) -> Match | None:
        """The entry sharing the longest prefix with `tokens`, or None if none shares one.

        At equal length "kv" wins over "ram" (no restore needed), then the most recently used.
        `tier` restricts the search to one tier. A pure query: call touch() on the entry you
        actually reuse."""
        wanted = TIERS if tier is None else (_check_tier(tier),)
        path, matched = self._descend(_as_tokens(tokens, copy=False))
        # Every entry below the point where the prompt leaves the trie shares exactly
        # `matched` tokens with it; entries at ancestors share their own (shorter) length.
        for node in reversed(path):
            length = matched if node is path[-1] else node.depth
            if length == 0:
                return None
            for t in wanted:
                if t in node.best:
                    return Match(entry=node.best[t][1], tier=t, length=length)
        return None

    def covering(self, tokens: Sequence[int] | npt.ArrayLike, tier: str) -> int | None:
        """An entry of `tier` whose tokens start with all of `tokens` (equal or longer), so a
        new copy of `tokens` in that tier would be redundant; None if there is none."""
        tier = _check_tier(tier)
        array = _as_tokens(tokens, copy=False)
        path, matched = self._descend(array)
        if matched < len(array) or tier not in path[-1].best or not len(array):
            return None
        return path[-1].best[tier][1]

    def entry(self, entry: int) -> EntryInfo:
        e = self._get(entry)
        return EntryInfo(entry=e.id, tier=e.tier, tokens=e.tokens, nbytes=e.nbytes,
                         last_used=e.last_used, pins=e.pins, reuses=e.reuses)

    def stats(self) -> PrefixStats:
        def tier_stats(tier: Tier) -> TierStats:
            mine = [e for e in self._entries.values() if e.tier == tier]
            return TierStats(entries=len(mine), pinned=sum(1 for e in mine if e.pins),
                             tokens=self._tokens[tier], nbytes=self._bytes[tier])

        return PrefixStats(kv=tier_stats("kv"), ram=tier_stats("ram"),
                           node_visits=self.node_visits)

    def evictions(self, tier: str, budget: int) -> EvictionPlan:
        """The unpinned entries of `tier` worth least to keep (value(), ties least recently
        used first) whose removal brings its total within `budget`. Plans only: free each
        victim's memory, then remove() it. When pinned entries alone are over budget every
        unpinned entry is a victim and `fits` is False; this never raises, because a full
        cache must not fail a request."""
        tier = _check_tier(tier)
        if budget < 0:
            raise InvalidRequestError(f"budget must be >= 0, not {budget}")
        total = self.total(tier)
        worth = self._worth(tier)
        candidates = sorted((e for e in self._entries.values() if e.tier == tier and not e.pins),
                            key=lambda e: (worth[e.id], e.last_used, e.id))
        victims: list[int] = []
        for e in candidates:
            if total <= budget:
                break
            victims.append(e.id)
            total -= e.tokens if tier == "kv" else e.nbytes
        return EvictionPlan(victims=tuple(victims), total_after=total, budget=budget)

    def value(self, entry: int) -> float:
        """What keeping the entry is worth now (uma.sched.reuse.keep_value, for the tokens the
        tier would lose without it): evictions() take the lowest first."""
        e = self._get(entry)
        return self._worth(e.tier)[e.id]

    # --- updates --------------------------------------------------------------------------

    def insert(self, tokens: Sequence[int] | npt.ArrayLike, tier: str,
               nbytes: int | None = None, *, app: str = "", reuses: Reuses | None = None
               ) -> int:
        """Records that the KV of `tokens` is cached in `tier` and returns the entry id.

        If an entry of the same tier already starts with all of `tokens` (equal, or longer:
        its first len(tokens) cells are the same KV), that entry is refreshed and its id
        returned, and nothing is added: the caller's new copy is redundant and can be freed
        (compare the id with covering() beforehand to skip making it). A longer insert over
        a shorter entry does add a new entry; the shorter one then loses every tie to it and
        is the first to be evicted. "ram" entries need `nbytes`, the snapshot's size; "kv"
        entries are measured in tokens and take none. `app` inserted it ("": not told);
        `reuses` is the record of the entry whose KV this is, moved from another tier."""
        tier = _check_tier(tier)
        if tier == "ram" and nbytes is None:
            raise InvalidRequestError("a 'ram' entry needs nbytes, the snapshot's size")
        if tier == "kv" and nbytes is not None:
            raise InvalidRequestError("a 'kv' entry is measured in tokens: pass no nbytes")
        if nbytes is not None and nbytes < 0:
            raise InvalidRequestError(f"nbytes must be >= 0, not {nbytes}")
        array = _as_tokens(tokens, copy=True)
        if not len(array):
            raise InvalidRequestError("cannot cache an empty token sequence")
        existing = self.covering(array, tier)
        if existing is not None:
            self.touch(existing, app)
            return existing
        node = self._node_for(array)
        self._clock += 1
        e = _Entry(id=self._next_id, tier=tier, nbytes=nbytes or 0, last_used=self._clock,
                   node=node, reuses=(reuses or Reuses()).used_by(app))
        self._next_id += 1
        self._entries[e.id] = e
        node.entries[tier] = e  # covering() was None, so this tier's slot here is free
        self._tokens[tier] += e.tokens
        self._bytes[tier] += e.nbytes
        self._freshen(e)
        return e.id

    def touch(self, entry: int, app: str = "") -> None:
        """Marks an entry used now (a logical clock, so tests are deterministic), refreshed by
        `app` ("": not told): not a hit."""
        self._use(self._get(entry), app, hit=False)

    def hit(self, entry: int, app: str = "", length: int = 0) -> None:
        """A prompt of `app` ("": not told) was admitted with this entry's first `length`
        tokens: it is used now, and its record counts the reuse and how much of it."""
        self._use(self._get(entry), app, hit=True, length=length)

    def pin(self, entry: int) -> None:
        """A running request depends on this entry: never plan to evict it. Pins count."""
        self._get(entry).pins += 1

    def unpin(self, entry: int) -> None:
        e = self._get(entry)
        if e.pins == 0:
            raise InvalidRequestError(f"entry {entry} is not pinned")
        e.pins -= 1

    def remove(self, entry: int) -> None:
        """Forgets an entry (pinned or not: the caller decides when its memory is gone)."""
        e = self._get(entry)
        del self._entries[entry]
        self._tokens[e.tier] -= e.tokens
        self._bytes[e.tier] -= e.nbytes
        node = e.node
        del node.entries[e.tier]
        self._recompute_upwards(self._prune(node))

    # --- the trie -------------------------------------------------------------------------

    def _use(self, e: _Entry, app: str, hit: bool, length: int = 0) -> None:
        self._clock += 1
        e.last_used = self._clock
        e.reuses = e.reuses.used_by(app, hit, length)
        self._freshen(e)

    def _worth(self, tier: Tier) -> dict[int, float]:
        """Each entry of `tier`'s keep value, for the tokens past the longest prefix it shares
        with another entry that keeps that prefix: none for a prefix it only duplicates."""
        mine = [e for e in self._entries.values() if e.tier == tier]
        full = {e.id: self._keep_value(e, e.tokens) for e in mine}
        keeper = self._keepers(tier, lambda e: (e.pins > 0, full[e.id], e.last_used, e.id))
        worth = {}
        for e in mine:
            node: _Node | None = e.node
            while node is not None and keeper[node] is e:  # each node has one keeper, so
                node = node.parent  # these walks visit every node once in all
            worth[e.id] = self._keep_value(e, e.tokens - (0 if node is None else node.depth))
        return worth

    def _keep_value(self, e: _Entry, tokens: int) -> float:
        cost = e.tokens if e.tier == "kv" else e.nbytes  # cells or bytes of its tier's budget
        return keep_value(tokens, cost, e.reuses.hits, len(e.reuses.apps),
                          self._clock - e.last_used)

    def _keepers(self, tier: Tier, rank: Callable[[_Entry], tuple[bool, float, int, int]]
                 ) -> dict[_Node, _Entry]:
        """For every node whose subtree holds entries of `tier`, the one of them that keeps
        its prefix: the highest ranked of those no longer entry extends (an extended entry's
        KV is all in the longer one's)."""
        order, stack = [], [self._root]
        while stack:  # iterative: a trie of many nested prefixes is deep
            node = stack.pop()
            order.append(node)
            stack.extend(c for c in node.children.values() if tier in c.best)
        keeper: dict[_Node, _Entry] = {}
        for node in reversed(order):  # children before their parents
            below = [keeper[c] for c in node.children.values() if c in keeper]
            if not below and tier in node.entries:
                below.append(node.entries[tier])
            if below:
                keeper[node] = max(below, key=rank)
        return keeper

    def _get(self, entry: int) -> _Entry:
        try:
            return self._entries[entry]
        except KeyError:
            raise InvalidRequestError(f"no prefix entry with id {entry!r}") from None

    def _descend(self, tokens: Tokens) -> tuple[list[_Node], int]:
        """The nodes whose edges the prompt enters, root first, and how many tokens match."""
        node, matched, path = self._root, 0, [self._root]
        self.node_visits += 1
        while matched < len(tokens):
            child = node.children.get(int(tokens[matched]))
            if child is None:
                break
            self.node_visits += 1
            path.append(child)
            k = _common_prefix(child.label, tokens[matched:])
            matched += k
            if k < len(child.label):
                break
            node = child
        return path, matched

    def _node_for(self, tokens: Tokens) -> _Node:
        """The node ending exactly at `tokens`, splitting an edge or adding a leaf."""
        node, matched = self._root, 0
        while matched < len(tokens):
            first = int(tokens[matched])
            child = node.children.get(first)
            if child is None:
                leaf = _Node(label=tokens[matched:], depth=len(tokens), parent=node)
                node.children[first] = leaf
                return leaf
            k = _common_prefix(child.label, tokens[matched:])
            if k < len(child.label):
                child = self._split(child, k)
            node, matched = child, matched + k
        return node

    def _split(self, child: _Node, k: int) -> _Node:
        """Puts a node after the first k tokens of `child`'s edge and returns it."""
        parent = child.parent
        assert parent is not None  # the root has no edge to split
        mid = _Node(label=child.label[:k], depth=child.depth - len(child.label) + k,
                    parent=parent, best=dict(child.best))
        parent.children[int(child.label[0])] = mid
        child.label = child.label[k:]
        child.parent = mid
        mid.children[int(child.label[0])] = child
        return mid

    def _prune(self, node: _Node) -> _Node:
        """Drops a node left with no entries and no children, or merges one with a single
        child into it, so every non-root node holds an entry or branches. Returns the lowest
        node whose subtree maxima may be stale."""
        parent = node.parent
        if parent is None or node.entries:
            return node
        if not node.children:
            del parent.children[int(node.label[0])]
            if parent.parent is not None and not parent.entries and len(parent.children) == 1:
                return self._merge_into_child(parent)
            return parent
        if len(node.children) == 1:
            return self._merge_into_child(node)
        return node

    def _merge_into_child(self, node: _Node) -> _Node:
        parent = node.parent
        assert parent is not None
        (child,) = node.children.values()
        child.label = np.concatenate((node.label, child.label))
        child.parent = parent
        parent.children[int(child.label[0])] = child
        return parent

    def _freshen(self, e: _Entry) -> None:
        # The clock only grows, so the touched entry is now the freshest in every subtree
        # that holds it: its ancestors.
        recency = (e.last_used, e.id)
        node: _Node | None = e.node
        while node is not None:
            node.best[e.tier] = recency
            node = node.parent

    def _recompute_upwards(self, node: _Node | None) -> None:
        while node is not None:
            for tier in TIERS:
                candidates = [c.best[tier] for c in node.children.values() if tier in c.best]
                if tier in node.entries:
                    own = node.entries[tier]
                    candidates.append((own.last_used, own.id))
                if candidates:
                    node.best[tier] = max(candidates)
                else:
                    node.best.pop(tier, None)
            node = node.parent
