"""One server's prefix cache: SGLang's radix tree over token ids, for the emulated engine.

The rules are SGLang 0.5.23's ``RadixCache`` (``python/sglang/srt/mem_cache/radix_cache.py``) at
page size 1, ported rather than approximated; only KV indices are not kept (the emulator counts
tokens):

* ``match(ids)`` walks the tree from the root, one child per first token, and returns the
  longest cached prefix; a match that ends inside an edge splits it (``_split_node``); every node
  on the path gets the current ``last_access`` (``_match_prefix_helper``).
* ``insert(ids, ...)`` walks and splits the same way and adds one leaf for the rest; it returns
  the tokens that were already cached (the caller frees its duplicates), as ``_insert_helper``.
* ``lock`` / ``unlock`` (``inc_lock_ref`` / ``dec_lock_ref``): a request holds the path of its
  matched prefix; a node with ``lock_ref > 0`` is *protected*, else *evictable*.
* ``evict(n)``: LRU over the evictable leaves (no children, ``lock_ref == 0``) by
  ``last_access``, whole leaves, until at least ``n`` tokens are freed; a parent left without
  children and unlocked becomes an evictable leaf and joins the heap (``evict``).
* ``reset()``: the flush (``flush_cache``, run on a weight update and a memory release).

Edges are *views* ``(seq, lo, hi)`` of the token sequence that inserted them (a list, a tuple, or
a trajectory's shared append-only buffer: positions below a view's length never change), never
copies: a 32K-token conversation costs its nodes, not its tokens. Two edges compare as slices
(``seq[lo:hi] == ids[p:p + k]``, C speed); a mismatch inside an edge is located by bisection.

Accounting (``evictable`` + ``protected`` = tokens in the tree): the engine adds the tokens its
running requests own outside the tree (new prompt tokens not inserted yet, decoded tokens) to get
the KV pool's use, as SGLang's allocator does.

Public names: ``RadixCache``, ``Node``, ``flat``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

Tokens = Sequence[int]


def flat(ids: Tokens) -> tuple[list[int], int]:
    """``ids`` as (a list, its length): a trajectory context's shared buffer (the ``flat()`` of
    ``pearl.runtime.pipeline.TokenContext``, no copy), else a list of ``ids``. Edges are lists, so
    that two slices compare as tokens (a tuple never equals a list)."""
    f = getattr(ids, "flat", None)
    if f is not None:
        buf, n = f()
        return buf, n
    if isinstance(ids, list):
        return ids, len(ids)
    return list(ids), len(ids)


class Node:
    """A radix tree node: the edge ``seq[lo:hi]`` from its parent, children by first token."""

    __slots__ = ("children", "hi", "last_access", "lo", "lock_ref", "parent", "seq", "tick")

    def __init__(self, seq: Sequence[int], lo: int, hi: int, parent: Node | None, now: float, tick: int = 0,
                 lock_ref: int = 0) -> None:
        self.seq = seq
        self.lo = lo
        self.hi = hi
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.lock_ref = lock_ref
        self.last_access = now
        self.tick = tick  # the tree's access count at its last access: orders accesses at one instant

    def __len__(self) -> int:
        return self.hi - self.lo


def _common(a: Sequence[int], alo: int, b: Sequence[int], blo: int, n: int) -> int:
    """Length of the common prefix of ``a[alo:alo + n]`` and ``b[blo:blo + n]``."""
    if a is b and alo == blo:
        return n
    if a[alo:alo + n] == b[blo:blo + n]:
        return n
    lo, hi = 0, n  # a[alo:alo+lo] == b[blo:blo+lo]; the first ``hi`` differ somewhere
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[alo + lo:alo + mid] == b[blo + lo:blo + mid]:
            lo = mid
        else:
            hi = mid
    return lo


class RadixCache:
    """SGLang's radix tree at page size 1 (module docstring); times come from the caller."""

    __slots__ = ("_leaves", "_tick", "evictable", "protected", "root")

    def __init__(self) -> None:
        self.root = Node([], 0, 0, None, 0.0)
        self.root.lock_ref = 1
        self.evictable = 0
        self.protected = 0
        self._leaves: dict[Node, None] = {}  # evictable leaves (a dict: a deterministic order)
        self._tick = 0

    @property
    def size(self) -> int:
        return self.evictable + self.protected

    def reset(self) -> None:
        """Drop every node (SGLang's ``flush_cache``; only valid with no lock held)."""
        self.root = Node([], 0, 0, None, 0.0)
        self.root.lock_ref = 1
        self.evictable = self.protected = 0
        self._leaves.clear()

    def _touch(self, node: Node, now: float) -> None:
        """``node`` accessed at ``now``: LRU orders by (time, access count), so two accesses at one
        virtual instant keep the order they happened in, as distinct real timestamps would."""
        self._tick += 1
        node.last_access, node.tick = now, self._tick

    # ------------------------------------------------------------------ lookup and insertion
    def match(self, ids: Tokens, now: float, limit: int | None = None) -> tuple[int, Node]:
        """The longest cached prefix of ``ids[:limit]``: (its length, its last node)."""
        seq, n = flat(ids)
        if limit is not None:
            n = min(n, limit)
        node = self.root
        self._touch(node, now)
        p = 0
        while p < n:
            child = node.children.get(seq[p])
            if child is None:
                break
            self._touch(child, now)
            k = _common(child.seq, child.lo, seq, p, min(len(child), n - p))
            if k < len(child):
                node = self._split(child, k)
                p += k
                break
            node = child
            p += k
        return p, node

    def insert(self, ids: Tokens, now: float, start: Node | None = None, offset: int = 0,
               limit: int | None = None) -> tuple[int, Node]:
        """Insert ``ids[offset:limit]`` below ``start`` (default: the root, ``offset`` 0): (the tokens
        already cached, the node of its last token). ``start`` must hold ``ids[:offset]``."""
        seq, n = flat(ids)
        if limit is not None:
            n = min(n, limit)
        node = start if start is not None else self.root
        self._touch(node, now)
        p = offset
        cached = 0
        while p < n:
            child = node.children.get(seq[p])
            if child is None:
                break
            self._touch(child, now)
            k = _common(child.seq, child.lo, seq, p, min(len(child), n - p))
            cached += k
            p += k
            if k < len(child):
                node = self._split(child, k)
            else:
                node = child
        if p < n:
            self._tick += 1
            leaf = Node(seq, p, n, node, now, self._tick)
            node.children[seq[p]] = leaf
            self.evictable += n - p
            self._status(node)
            self._status(leaf)
            node = leaf
        return cached, node

    def _split(self, child: Node, k: int) -> Node:
        """``parent -> child`` becomes ``parent -> new -> child`` with ``new`` holding the first ``k``
        tokens (SGLang's ``_split_node``: the new node inherits the lock)."""
        parent = child.parent
        assert parent is not None and 0 < k < len(child)
        new = Node(child.seq, child.lo, child.lo + k, parent, child.last_access, child.tick, child.lock_ref)
        parent.children[child.seq[child.lo]] = new
        child.lo += k
        child.parent = new
        new.children[child.seq[child.lo]] = child
        return new

    # ------------------------------------------------------------------ locks and eviction
    def lock(self, node: Node) -> None:
        """``inc_lock_ref``: every node from ``node`` up to the root (excluded) is held once more."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable -= len(node)
                self.protected += len(node)
            node.lock_ref += 1
            self._status(node)
            assert node.parent is not None
            node = node.parent

    def unlock(self, node: Node) -> None:
        """``dec_lock_ref``: the inverse of ``lock``."""
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable += len(node)
                self.protected -= len(node)
            node.lock_ref -= 1
            self._status(node)
            assert node.parent is not None
            node = node.parent

    def _status(self, node: Node) -> None:
        if node is not self.root and not node.children and node.lock_ref == 0 and node.parent is not None:
            self._leaves[node] = None
        else:
            self._leaves.pop(node, None)

    def evict(self, tokens: int) -> int:
        """Free at least ``tokens`` evictable tokens, least recently used leaves first (whole
        leaves); returns the tokens freed (less when the tree holds fewer evictable ones)."""
        if tokens <= 0 or not self._leaves:
            return 0
        heap = [(x.last_access, x.tick, x) for x in self._leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < tokens and heap:
            _, _, x = heapq.heappop(heap)
            parent = x.parent
            assert parent is not None
            freed += len(x)
            self.evictable -= len(x)
            del parent.children[x.seq[x.lo]]
            self._leaves.pop(x, None)
            x.parent = None
            self._status(parent)
            if parent in self._leaves:
                heapq.heappush(heap, (parent.last_access, parent.tick, parent))
        return freed

    def stats(self) -> dict[str, Any]:
        """Node and token counts (for tests and reports)."""
        nodes, stack = 0, [self.root]
        while stack:
            x = stack.pop()
            nodes += 1
            stack.extend(x.children.values())
        return {"nodes": nodes - 1, "evictable": self.evictable, "protected": self.protected,
                "leaves": len(self._leaves)}
