"""Multi-block patterns: a compute block followed by its fused epilogue.

An accelerator often applies elementwise steps to its accumulator before storing it (bias
add, ReLU, shift-and-clip). After ``FuseOps`` + ``FuseTIR`` such a chain is several blocks
of one PrimFunc, each consuming the previous one's output. This module builds the blocks'
producer-consumer graph and finds the template's chains in it with networkx's subgraph
matching: pattern nodes are intrinsics, graph nodes are blocks labelled with the
intrinsics they match.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import networkx as nx
from networkx.algorithms.isomorphism import DiGraphMatcher

from tirbyoc.ir.pattern import function_blocks
from tirbyoc.matching.candidates import Candidate, candidates
from tirbyoc.matching.matcher import match_block, prim_functions
from tirbyoc.matching.results import Match


@dataclass(frozen=True)
class ChainMatch:
    """A compute match and the epilogue blocks fused after it, in order."""

    compute: Match
    steps: tuple[Match, ...]

    @property
    def blocks(self) -> tuple[str, ...]:
        return (self.compute.block, *(s.block for s in self.steps))

    @property
    def intrinsics(self) -> tuple[str, ...]:
        return (self.compute.intrinsic.name, *(s.intrinsic.name for s in self.steps))

    def describe(self) -> str:
        return " -> ".join(f"{b}:{i.split('.')[-1]}" for b, i in zip(self.blocks, self.intrinsics))


def block_graph(blocks) -> nx.DiGraph:
    """Producer -> consumer edges between blocks (by the buffers they write and read)."""
    g = nx.DiGraph()
    writers: dict[str, list[int]] = {}
    for i, b in enumerate(blocks):
        g.add_node(i, name=b.name)
        if b.store is not None:
            writers.setdefault(b.store.buffer, []).append(i)
    for i, b in enumerate(blocks):
        for buf in b.buffers_read:
            for w in writers.get(buf, ()):
                if w != i:
                    g.add_edge(w, i, buffer=buf)
    return g


def _subsequences(steps):
    for n in range(len(steps), 0, -1):
        yield from combinations(steps, n)


def match_chains(func_or_mod, targets) -> list[ChainMatch]:
    """Every chain (compute block + in-order epilogue steps) of the targets' groups, longest
    first; each block belongs to at most one chain."""
    cands = candidates(targets)
    groups = {}
    for c in cands:
        if c.group is not None and c.group.epilogue:
            groups.setdefault(c.group.name, c)
    out: list[ChainMatch] = []
    for fname, func in prim_functions(func_or_mod):
        blocks = function_blocks(func)
        if len(blocks) < 2 or not groups:
            continue
        graph = block_graph(blocks)
        taken: set[int] = set()
        for cand in groups.values():
            group = cand.group
            labels: dict[int, dict[str, Match]] = {}
            for i, b in enumerate(blocks):
                # The blocks are read once above; each is matched directly, not re-read.
                found = {}
                compute = match_block(Candidate(group.compute, group, cand.template), b, fname)
                if isinstance(compute, Match):
                    found[group.compute.name] = compute
                for step in group.epilogue:
                    m = match_block(Candidate(step, group, cand.template), b, fname, as_epilogue=True)
                    if isinstance(m, Match):
                        found[step.name] = m
                labels[i] = found
                graph.nodes[i]["matches"] = found
            for steps in _subsequences(group.epilogue):
                pattern = nx.DiGraph()
                names = [group.compute.name, *(s.name for s in steps)]
                for k, n in enumerate(names):
                    pattern.add_node(k, intrinsic=n)
                    if k:
                        pattern.add_edge(k - 1, k)
                gm = DiGraphMatcher(graph, pattern,
                                    node_match=lambda g, p: p["intrinsic"] in g.get("matches", {}))
                for mapping in gm.subgraph_monomorphisms_iter():
                    order = sorted(mapping, key=mapping.get)  # graph nodes in pattern order
                    if taken & set(order) or not _is_chain(blocks, graph, order):
                        continue
                    ms = [labels[node][names[k]] for k, node in enumerate(order)]
                    out.append(ChainMatch(ms[0], tuple(ms[1:])))
                    taken |= set(order)
    return out


def _is_chain(blocks, graph: nx.DiGraph, order: list[int]) -> bool:
    """Each step reads its predecessor's whole output elementwise, and no block outside the
    chain reads an intermediate (it would never be written once fused)."""
    for prev, node in zip(order, order[1:]):
        produced = blocks[prev].store
        consumer = blocks[node]
        reads = [a for a in consumer.loads if a.buffer == produced.buffer]
        if not reads or any(a.indices != consumer.store.indices for a in reads):
            return False
        if produced.shape != consumer.store.shape:
            return False
        if any(succ not in order for succ in graph.successors(prev)):
            return False
    return True
