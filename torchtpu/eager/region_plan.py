"""Where a long defer_and_fuse region is cut into chunks that repeat.

A loop that never reads a value on the host (greedy decoding that keeps its tokens on the
device, a rollout, a benchmark loop) records all its iterations into one region, and a
region compiles whole: 32 tokens of a small GPT's greedy decoding were one 1024-op region
and 8.9 s of XLA compiling on XLA:CPU, where strict compiled the same ops in 1.4 s; a
different number of tokens compiled all of it again. The iterations are the same ops on
the same shapes (a growing KV cache changes shape only at a bucket edge: eager/growth.py),
so cut before each iteration and each distinct chunk compiles once, the others are hits.

No marker says where an iteration starts. The cut is chosen from the region's own op
sequence: for each op executable that occurs at least three times, cutting before each
of its occurrences gives chunks (or before each of two such ops', the first's all before the
second's: a loop's forward, then its backward); the chosen cut is the one whose chunks leave the least to
compile (the ops of the distinct chunks, plus a few ops' worth per launch). A region is
cut only where that is at most half of compiling it whole. A training step's region (ended
by its optimizer step) is never cut: it runs every step, and whole it runs fastest (a
24-layer GPT's step: 20 ms whole, 30 ms as the 33 chunks its residual adds cut it into,
and the compile was no shorter: the optimizer's foreach ops over every parameter are most
of it).

Pure bookkeeping on op identities and wiring: no JAX here (eager/deferred.py runs the chunks).
"""
from __future__ import annotations

from typing import NamedTuple

from ..config import startup

MIN_OPS = startup.defer_chunk_ops or float("inf")  # shorter regions compile whole (0: all do)
MIN_CHUNK = 16   # a loop body shorter than this (on average) is cut every few iterations
HOT = 8          # a chunk repeated this often in its region compiles optimized at once
GAIN = 2.0       # cut only where the distinct chunks hold at most 1/GAIN of the region's ops
LAUNCH = 4       # a chunk's launch weighed as this many ops of compile work
NEAR = 1.25      # cuts this close to the cheapest count as as good
PAIRED = 8       # the ops cutting the widest spans, tried in pairs (a forward's, then a backward's)


class Chunk(NamedTuple):
    """One cut piece of a region: nodes [start, stop) run as a region of their own."""

    start: int
    stop: int
    sources: tuple   # per chunk input, where it comes from in the region: (1, input) or (0, node, key)
    nodes: tuple     # per node, (its op executable, its refs with inputs renumbered to `sources`)
    outputs: tuple   # (node, key) in the region of each value the chunk leaves (a later chunk's or the region's)
    local_outputs: tuple  # the same, node numbered within the chunk
    first_scalar: int
    stop_scalar: int
    done: tuple      # the values earlier chunks left that no later chunk reads nor the region leaves
    repeats: int     # how many chunks of the region are this one's program (same ops, wiring, outputs)


def choose_cuts(keys: list) -> tuple[int, ...] | None:
    """The node indices each chunk starts at (the first is 0), or None: compile whole."""
    n = len(keys)
    if n < MIN_OPS:
        return None
    where: dict = {}
    for i, k in enumerate(keys):
        where.setdefault(k, []).append(i)
    cuts = []  # per op that repeats: the positions it cuts at
    for pos in where.values():
        count = len(pos)
        if count < 3:
            continue
        # a short loop body: its iterations k at a time, so chunks hold MIN_CHUNK ops or more
        # (k from the body's length, not the trip count: another trip count cuts alike)
        k = max(1, -(-MIN_CHUNK * (count - 1) // (pos[-1] - pos[0])))
        if count >= 3 * k:
            cuts.append(tuple(pos[::k]))
    # one op's cuts; and two ops' where the first's all come before the second's: a loop's
    # forward then its backward, whose bodies share no op (a residual add's gradient is
    # accumulated in place, add_, where the forward has add)
    widest = sorted(cuts, key=lambda c: c[0] - c[-1])[:PAIRED]
    tries = cuts + [a + b for a in widest for b in widest if a[-1] < b[0]]
    found = []
    tried = set()
    for c in tries:
        starts = c if c[0] == 0 else (0, *c)
        if starts in tried:
            continue
        tried.add(starts)
        cost = _cost(keys, starts)
        if cost < n / GAIN:
            found.append((cost, c[0], starts))
    if not found:
        return None
    # Of the cuts within NEAR of the cheapest, the one at the earliest op: the loop body's
    # first op, the same one whatever the trip count, so another run's chunks line up with
    # this one's and are cache hits (the cheapest alone can flip with the leftover ends).
    least = min(cost for cost, _, _ in found)
    best = min((first, cost, starts) for cost, first, starts in found if cost <= least * NEAR)[2]
    return best


def _cost(keys: list, starts: tuple) -> float:
    """The compile work of cutting at `starts`: the ops of its distinct chunks and a few ops'
    worth per launch (counted up to the point where it is no gain)."""
    n = len(keys)
    edges = starts + (n,)
    cost = LAUNCH * len(starts)
    seen = set()
    for a, b in zip(edges, edges[1:]):
        piece = tuple(keys[a:b])
        if piece not in seen:
            seen.add(piece)
            cost += b - a
            if cost >= n / GAIN:
                break
    return cost


def _order(ref) -> tuple:
    node, key = ref
    return (node, 1, key[1]) if type(key) is tuple else (node, 0, key)  # ("u", slot): an in-place update


def plan(nodes: tuple, out_refs: tuple, nscalars: list, starts: tuple) -> tuple[Chunk, ...]:
    """The chunks of a region cut at `starts`. `nodes`: per node (op executable, refs), refs
    as recorded ((1, input) or (0, node, key) or None); `out_refs`: the (node, key) values the
    region leaves; `nscalars`: each node's count of runtime scalars."""
    n = len(nodes)
    edges = starts + (n,)
    chunk_of = [0] * n
    for c, (a, b) in enumerate(zip(edges, edges[1:])):
        for j in range(a, b):
            chunk_of[j] = c
    leaving = set(out_refs)
    for j, (_, refs) in enumerate(nodes):
        for r in refs:
            if r is not None and r[0] == 0 and chunk_of[r[1]] != chunk_of[j]:
                leaving.add((r[1], r[2]))
    per_chunk: list = [[] for _ in starts]
    for ref in leaving:
        per_chunk[chunk_of[ref[0]]].append(ref)
    last_read: dict = {}  # (node, key) -> the last chunk reading it
    for j, (_, refs) in enumerate(nodes):
        for r in refs:
            if r is not None and r[0] == 0 and chunk_of[r[1]] != chunk_of[j]:
                last_read[(r[1], r[2])] = chunk_of[j]
    done: list = [[] for _ in starts]
    kept = set(out_refs)
    for ref, c in last_read.items():
        if ref not in kept:
            done[c].append(ref)
    first = [0] * (n + 1)
    for j in range(n):
        first[j + 1] = first[j] + nscalars[j]
    chunks = []
    for c, (a, b) in enumerate(zip(edges, edges[1:])):
        sources: list = []
        index: dict = {}
        local = []
        for j in range(a, b):
            compiled, refs = nodes[j]
            renamed = []
            for r in refs:
                if r is None:
                    renamed.append(None)
                elif r[0] == 0 and r[1] >= a:
                    renamed.append((0, r[1] - a, r[2]))
                else:
                    i = index.get(r)
                    if i is None:
                        i = index[r] = len(sources)
                        sources.append(r)
                    renamed.append((1, i))
            local.append((compiled, tuple(renamed)))
        outs = tuple(sorted(per_chunk[c], key=_order))
        chunks.append(Chunk(a, b, tuple(sources), tuple(local), outs,
                            tuple((node - a, key) for node, key in outs), first[a], first[b], tuple(done[c]), 0))
    same: dict = {}
    for c in chunks:
        k = (c.nodes, c.local_outputs)
        same[k] = same.get(k, 0) + 1
    return tuple(c._replace(repeats=same[(c.nodes, c.local_outputs)]) for c in chunks)
