"""SGLang's own ``RadixCache`` playing a list of operations, in its own process.

``python -m tests.contract.sglang_radix --ops ops.json``: SGLang 0.5.23's
``srt/mem_cache/radix_cache.py`` ``RadixCache.create_simulated`` (its own constructor for a tree
without memory pools) runs each operation of ``ops.json`` and prints, per operation, its result and
the tree's ``evictable_size`` / ``protected_size`` as one JSON list. Operations: ``["insert",
ids]`` (-> the prefix already cached), ``["match", ids]`` (-> the matched length), ``["lock", k]``
/ ``["unlock", k]`` (the node operation ``k`` returned; ``inc_lock_ref`` / ``dec_lock_ref``),
``["evict", n]`` (-> the tokens freed). Two seams are faked, each as the real one behaves: the KV
allocator's ``free_segment`` (a tree without pools has none; it only counts what it is given) and
``time.monotonic`` in that module, which returns the operation's index, so that both trees see the
same access times.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import warnings
from pathlib import Path


class _Allocator:
    """Stands for ``BaseTokenToKVPoolAllocator``: ``free_segment`` releases KV indices (counted)."""

    device = "cpu"

    def __init__(self) -> None:
        self.freed = 0

    def free_segment(self, value, start_pos: int = 0) -> None:  # type: ignore[no-untyped-def]
        self.freed += len(value) - start_pos


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", required=True)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.contract.sglang_env import MISSING, use_sglang

    if not use_sglang():
        raise SystemExit(MISSING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import time

        from sglang.srt.mem_cache import radix_cache as rc
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams

    now = [0.0]
    rc.time = types.SimpleNamespace(monotonic=lambda: now[0], perf_counter=time.perf_counter)
    tree = rc.RadixCache.create_simulated(mock_allocator=_Allocator())
    nodes: dict[int, object] = {}
    out = []
    for i, op in enumerate(json.loads(Path(args.ops).read_text())):
        now[0] = float(i + 1)
        kind = op[0]
        if kind == "insert":
            r = tree.insert(InsertParams(key=rc.RadixKey(token_ids=list(op[1]))))
            nodes[i], res = r.last_device_node, r.prefix_len
        elif kind == "match":
            m = tree.match_prefix(MatchPrefixParams(key=rc.RadixKey(token_ids=list(op[1]))))
            nodes[i], res = m.last_device_node, m.device_prefix_len
        elif kind == "lock":
            tree.inc_lock_ref(nodes[op[1]])
            res = None
        elif kind == "unlock":
            tree.dec_lock_ref(nodes[op[1]])
            res = None
        elif kind == "evict":
            res = tree.evict(EvictParams(num_tokens=op[1])).num_tokens_evicted
        else:
            raise SystemExit(f"unknown operation {kind!r}")
        out.append([res, tree.evictable_size(), tree.protected_size()])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
