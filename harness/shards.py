"""`--shard I/N`: a deterministic split of the collected tests across N CI jobs.

A test belongs to shard 1 + (sha256 of its pytest node id) mod N. The node id is relative to
the repository root and holds the case id, so the split is the same on every machine, in
every process (Python's own hash() is salted per process, PYTHONHASHSEED) and whatever order
the tests were collected in; each test lands in exactly one shard. It balances the number of
tests, not their time.

A shard also records the count and a digest of every test id it collected before the split
(after the other filters): the N shards of one split must agree on them, or their union is
not the suite (another commit, other options), and the merge refuses them.
"""
from __future__ import annotations

import hashlib

WORKER_OUTPUT = "kernelcheck_shard"   # xdist workeroutput key: a worker's shard info, for the controller


class ShardError(ValueError):
    pass


def parse(text: str) -> tuple[int, int]:
    """`--shard 2/3` -> (2, 3): shard I of N, 1 <= I <= N."""
    usage = f"--shard {text}: expected I/N with whole numbers 1 <= I <= N, e.g. --shard 2/3 for the second of three"
    parts = str(text).strip().split("/")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ShardError(usage)
    index, count = int(parts[0]), int(parts[1])
    if not 1 <= index <= count:
        raise ShardError(usage)
    return index, count


def shard_of(nodeid: str, count: int) -> int:
    """The shard (1..count) a test id belongs to."""
    digest = hashlib.sha256(nodeid.encode("utf-8")).digest()
    return 1 + int.from_bytes(digest[:8], "big") % count


def split(nodeids: list[str], index: int, count: int) -> list[str]:
    """The ids of shard `index` of `count`, in their given order."""
    return [n for n in nodeids if shard_of(n, count) == index]


def collection_digest(nodeids: list[str]) -> str:
    """A digest of a set of test ids (order-independent)."""
    h = hashlib.sha256()
    for n in sorted(nodeids):
        h.update(n.encode("utf-8") + b"\n")
    return h.hexdigest()


def info(nodeids: list[str], index: int, count: int) -> dict:
    """What a shard writes into its audit's meta (`shard`)."""
    return {"index": index, "count": count, "collected": len(nodeids),
            "collected_digest": collection_digest(nodeids), "selected": len(split(nodeids, index, count))}


def check(shards: list[dict | None], names: list[str]) -> dict | None:
    """The shards' `meta.shard` of the audits to merge (None for an audit of an unsharded run).
    Returns what the merged audit records of the split (None when no audit is a shard), or
    raises ShardError when the shards do not add up to one whole run: a mix of sharded and
    unsharded audits, shards of different splits or collections, a shard given twice, or a
    missing shard (a gap)."""
    if all(s is None for s in shards):
        return None
    plain = [n for n, s in zip(names, shards) if s is None]
    if plain:
        sharded = [n for n, s in zip(names, shards) if s is not None]
        raise ShardError(f"{plain[0]} is not a shard (its run had no --shard), but {sharded[0]} is: merge the "
                         "N shards of one split, or unsharded parts, not both")
    first = shards[0]
    for name, s in zip(names, shards):
        if s.get("count") != first.get("count"):
            raise ShardError(f"shards of different splits: {names[0]} is {first.get('index')}/{first.get('count')}, "
                             f"{name} is {s.get('index')}/{s.get('count')}")
        if s.get("collected_digest") is None or s.get("collected") is None:
            raise ShardError(f"{name}: shard {s.get('index')}/{s.get('count')} did not record what it collected "
                             "(its run ended before collection finished?)")
        if (s["collected"], s["collected_digest"]) != (first.get("collected"), first.get("collected_digest")):
            raise ShardError(f"shards of different collections: {names[0]} collected {first.get('collected')} tests "
                             f"(digest {str(first.get('collected_digest'))[:12]}), {name} {s['collected']} "
                             f"(digest {s['collected_digest'][:12]}): run every shard on the same commit with the "
                             "same options")
    count = first["count"]
    where: dict = {}
    for name, s in zip(names, shards):
        if s["index"] in where:
            raise ShardError(f"shard {s['index']}/{count} is given twice ({where[s['index']]} and {name}): "
                             "its checks would be counted twice")
        where[s["index"]] = name
    missing = [i for i in range(1, count + 1) if i not in where]
    if missing:
        raise ShardError(f"missing shard(s) {', '.join(f'{i}/{count}' for i in missing)}: the merged audit would "
                         f"have a gap (give the audits of all {count} shards)")
    selected = sum(s.get("selected", 0) for s in shards)
    if selected != first["collected"]:
        raise ShardError(f"the {count} shards selected {selected} tests in all, but each collected "
                         f"{first['collected']}: not one split of one collection")
    return {"count": count, "collected": first["collected"], "collected_digest": first["collected_digest"]}
