"""On the GPU: where a captured graph records the staging guard's event
(``GraphOptions(staging_guard=...)``) -- right behind the staging kernels, or at the graph's
end -- and that either way the host never rewrites the staging a replay has not read yet
(against a negative control), and every replay computes the step written for it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.staging_graph import S
from helpers.staging_graph import staged_sums as staging_step_expected
from helpers.support import quiet

from staticattn.arena import ArenaConfig
from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder, make_arena
from staticattn.graphs import GraphKind, GraphManager, StagingGuard
from staticattn.graphs.introspect import cudart_or_none

pytestmark = pytest.mark.gpu

KERNEL, EVENT_RECORD = 0, 7
GUARDS = list(StagingGuard)


def _expected(seq_lens, n, size):
    """What the step below computes (the staging test's step): each token's position plus
    its sequence length; padded tokens belong to request 0 at position 0."""
    assert size == S * n
    return staging_step_expected([n] * len(seq_lens), [int(x) for x in seq_lens], n)


def _manager(staging_guard, buckets=(), branch_builds=True):
    cfg = ArenaConfig.deepseek_v4(max_model_len=65536, max_num_seqs=64,
                                  max_num_batched_tokens=512)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    size = S * cfg.next_n

    def step(batch, metadata):
        t2r = inputs.token_to_req[:size].long()
        return inputs.positions[:size] + inputs.seq_lens[t2r]

    gm = GraphManager(arena, inputs, builders, step,
                      quiet(staging_guard=staging_guard, branch_builds=branch_builds))
    gm.capture([size], buckets=buckets)
    return cfg, inputs, gm


def _structure(graph: torch.cuda.CUDAGraph):
    """``(node types in capture order, edges as index pairs)`` of a graph."""
    rt = cudart_or_none()
    handle = rt.cudaGraph_t(init_value=int(graph.raw_cuda_graph()))
    count = rt.cudaGraphGetNodes(handle, 0)[-1]
    nodes = rt.cudaGraphGetNodes(handle, count)[1]
    index = {int(node): i for i, node in enumerate(nodes)}
    types = [int(rt.cudaGraphNodeGetType(node)[1]) for node in nodes]
    n_edges = rt.cudaGraphGetEdges(handle, 0)[-1]
    found = rt.cudaGraphGetEdges(handle, n_edges)
    return types, {(index[int(a)], index[int(b)]) for a, b in zip(found[1], found[2])}


def _reach(node: int, edges: set[tuple[int, int]], back: bool) -> set[int]:
    """The nodes ``node`` depends on (``back``) or that depend on it, through ``edges``."""
    step = {}
    for a, b in edges:
        step.setdefault(b if back else a, []).append(a if back else b)
    seen, todo = set(), [node]
    while todo:
        for n in step.get(todo.pop(), []):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


@pytest.mark.skipif(cudart_or_none() is None, reason="needs cuda-bindings")
@pytest.mark.parametrize("branch_builds", [True, False])
@pytest.mark.parametrize("staging_guard", GUARDS)
def test_the_event_node_sits_where_the_guard_says(staging_guard, branch_builds):
    _, _, gm = _manager(staging_guard, buckets=(256,), branch_builds=branch_builds)
    try:
        assert gm.graphs and gm.mixed_graphs
        for g in [*gm.graphs.values(), *gm.mixed_graphs.values()]:
            types, edges = _structure(g.graph)
            assert types.count(EVENT_RECORD) == 1, types
            event = types.index(EVENT_RECORD)
            before, after = _reach(event, edges, back=True), _reach(event, edges, back=False)
            others = set(range(len(types))) - {event}
            if staging_guard is StagingGuard.STEP:
                assert before == others and not after, ("the event is the graph's end", types)
            else:  # behind the staging kernels (one for a decode graph, two for a bucket),
                # before everything else (the builds, on their branches, and the step)
                assert len(before) == (1 if g.kind is GraphKind.DECODE else 2), before
                assert {types[i] for i in before} == {KERNEL} and after == others - before
    finally:
        gm.close()


@pytest.mark.parametrize("staging_guard, guarded", [(StagingGuard.STAGING, True),
                                                    (StagingGuard.STEP, True),
                                                    (StagingGuard.STEP, False)])
def test_the_host_waits_for_an_in_flight_replay(staging_guard, guarded):
    """Queue a long sleep on the replay stream, launch step A in place, then write step B
    into the views at once. With the guard, ``begin_step`` waits and A computes A; without
    it (the negative control) A reads B's lengths."""
    cfg, inputs, gm = _manager(staging_guard)
    n, size = cfg.next_n, S * cfg.next_n
    try:
        # The negative control: no wait. The graph still records the event (kept alive
        # here: a replay must not record into a destroyed event).
        event = inputs._consumed
        if not guarded:
            inputs._consumed = None
        la, lb = [1000 + i for i in range(S)], [5000 + i for i in range(S)]
        # Step B must be written while A is held back; a host starved by other work may
        # miss the window, so each attempt checks and the next one holds twice as long.
        for cycles in (200_000_000, 400_000_000, 800_000_000):  # ~0.1, 0.2, 0.4 s held
            torch.cuda.synchronize()
            views = gm.begin_step()
            views.seq_lens[:S] = la
            views.slot_mapping[:size] = -1
            with torch.cuda.stream(gm.stream):
                torch.cuda._sleep(cycles)
            held = torch.cuda.Event()
            held.record(gm.stream)
            out = gm.launch(S)
            views = gm.begin_step()
            views.seq_lens[:S] = lb
            in_window = not held.query()
            torch.cuda.synchronize()
            result_a = out.tolist()
            if guarded or in_window:
                break
        if guarded:
            assert result_a == _expected(la, n, size)
        else:
            assert in_window, "the host never wrote step B while replay A was held back"
            assert result_a == _expected(lb, n, size), (
                "negative control: without the guard step A should have read B's lengths")
    finally:
        gm.close()
        del event


def test_replays_with_the_guard_at_the_end_compute_their_steps():
    """300 steps of random sizes through run() and the in-place launch, back to back
    (the host stages each while the last may still run), every output as staged."""
    cfg, inputs, gm = _manager(StagingGuard.STEP)
    n, size = cfg.next_n, S * cfg.next_n
    rng = np.random.default_rng(0)
    outs = []
    try:
        for i in range(300):
            k = int(rng.integers(1, S + 1))
            lens = rng.integers(n, cfg.max_model_len, size=k)
            if i % 2:
                views = gm.begin_step()
                views.seq_lens[:k] = lens
                views.slot_mapping[: k * n] = -1
                out = gm.launch(k)
            else:
                out = gm.run(np.full(k, n), lens, np.full(k * n, -1)).outputs
            outs.append((lens.tolist(), k, out.clone()))
        torch.cuda.synchronize()
        for lens, k, out in outs:
            assert out[: k * n].tolist() == _expected(lens, n, size)[: k * n]
    finally:
        gm.close()
