"""Where a decode graph's launch time goes, and what the staging guard's event costs by
where it sits: the host time of ``cudaGraphLaunch`` on copies of a captured decode graph
rebuilt as one chain of its kernels with the event behind the staging kernel (a link of
the chain, or a leaf nothing waits for), at the end, or without it; the host time of
asking each copy's event right after its replay; both calls together (what a step of the
in-place API makes); then the in-place calls themselves. Next to the one-kernel floor.

Each copy is a clone of the graph's ``cudaGraph_t``, instantiated the way torch
instantiates (auto-free on launch) and launched on an idle device: medians of ``--reps``
(min, max). Results: ``docs/results/launch_costs_h200.txt``.

    PYTHONPATH=$PWD python scripts/launch_anatomy.py --preset deepseek-v3.2 [--staging-guard step]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch

from staticattn.arena import ArenaConfig
from staticattn.bench.floor import host_times_us, launch_floor
from staticattn.bench.random_batches import NUM_KV_BLOCKS, fixed_step
from staticattn.builders.contract import make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.graphs.introspect import cudart_or_none
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.options import GraphOptions, StagingGuard
from staticattn.kernels.runtime.frozen_launch import driver_or_none

AUTO_FREE = 1  # cudaGraphInstantiateFlagAutoFreeOnLaunch, what torch instantiates with
TYPES = {0: "kernel", 7: "event_record", 6: "event_wait", 1: "memcpy", 2: "memset", 5: "empty"}


def _ok(result):
    err, *rest = result
    if int(getattr(err, "value", err)) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return rest[0] if len(rest) == 1 else rest


def _nodes(rt, graph):
    _, count = _ok(rt.cudaGraphGetNodes(graph, 0))
    nodes, _ = _ok(rt.cudaGraphGetNodes(graph, count))
    return list(nodes)


def _describe(rt, drv, node) -> str:
    kind = int(_ok(rt.cudaGraphNodeGetType(node)))
    name = TYPES.get(kind, f"type{kind}")
    if kind != 0:
        return name
    p = _ok(drv.cuGraphKernelNodeGetParams(drv.CUgraphNode(init_value=int(node))))
    try:
        fname = _ok(drv.cuFuncGetName(p.func)).decode()
    except Exception:  # noqa: BLE001 - a name is only a label here
        fname = "?"
    return (f"kernel {fname} grid ({p.gridDimX},{p.gridDimY},{p.gridDimZ}) block "
            f"{p.blockDimX} smem {p.sharedMemBytes}")


def _edge(change, graph, a, b) -> None:
    """Add or remove (``change``: cudaGraphAdd/RemoveDependencies) the edge ``a -> b``."""
    try:  # CUDA 13: (graph, from, to, edge data, count)
        _ok(change(graph, [a], [b], None, 1))
    except TypeError:
        _ok(change(graph, [a], [b], 1))


def _chain(rt, graph, kernels, events, event_after, blocking):
    """A clone as one chain of the kernels (the captured event nodes taken out), with a new
    event-record node after kernel ``event_after`` (None: no event) that the next kernel
    waits for when ``blocking`` (a link of the chain) or not (a leaf). Returns the
    instantiated clone, the clone and the new event (or None)."""
    clone = _ok(rt.cudaGraphClone(graph))
    for node in events:
        _ok(rt.cudaGraphDestroyNode(_ok(rt.cudaGraphNodeFindInClone(node, clone))))
    mine = [_ok(rt.cudaGraphNodeFindInClone(node, clone)) for node in kernels]
    for a, b in zip(mine, mine[1:]):
        try:
            _edge(rt.cudaGraphAddDependencies, clone, a, b)
        except RuntimeError:  # the edge is there already
            pass
    spare = None
    if event_after is not None:
        spare = torch.cuda.Event(external=True)
        spare.record()
        ev = rt.cudaEvent_t(init_value=spare.cuda_event)
        node = _ok(rt.cudaGraphAddEventRecordNode(clone, [mine[event_after]], 1, ev))
        if blocking and event_after + 1 < len(mine):
            nxt = mine[event_after + 1]
            _edge(rt.cudaGraphRemoveDependencies, clone, mine[event_after], nxt)
            _edge(rt.cudaGraphAddDependencies, clone, node, nxt)
    return _ok(rt.cudaGraphInstantiateWithFlags(clone, AUTO_FREE)), clone, spare


def _stat(xs) -> str:
    return f"{statistics.median(xs):.2f} (min {min(xs):.2f}, max {max(xs):.2f})"


def _host_us(fn, reps: int, before=None) -> list[float]:
    """Host time of ``fn()`` (us) after 20 calls of warm-up, each after ``before()``
    (untimed) on an idle device."""
    for _ in range(20):
        fn()
    return host_times_us(fn, reps, before=before)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="deepseek-v3.2")
    ap.add_argument("--num-reqs", type=int, default=32)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--staging-guard", choices=["staging", "step"], default="staging")
    args = ap.parse_args()
    rt, drv = cudart_or_none(), driver_or_none()
    config = ArenaConfig.preset(args.preset)
    builders = [IndexerMetadataBuilder()] + ([SparseSWAMetadataBuilder()] if config.has_swa
                                              else [])
    arena, inputs = make_arena(config, builders)
    n, k = config.next_n, args.num_reqs
    floor = launch_floor(args.reps)
    print(f"preset {args.preset}, next_n {n}, {k} requests, staging guard after the "
          f"{args.staging_guard}; host us, medians of {args.reps}")
    print(f"one-kernel floor through cudaGraphLaunch: {floor['raw_launch_host_us'].median:.2f}")
    options = GraphOptions(progress=False, staging_guard=StagingGuard(args.staging_guard),
                           num_kv_blocks=NUM_KV_BLOCKS)
    with GraphManager(arena, inputs, builders, lambda b, md: None, options) as gm:
        gm.capture([k * n], buckets=())
        g = gm.dispatcher.decode(k)
        rng = np.random.default_rng(0)
        step = fixed_step(inputs, np.full(k, n), rng.integers(n, 32_768, size=k), rng)
        gm.run(step.query_lens, step.seq_lens, step.slot_mapping)
        torch.cuda.synchronize()
        graph = rt.cudaGraph_t(init_value=int(g.graph.raw_cuda_graph()))
        nodes = _nodes(rt, graph)
        labels = [_describe(rt, drv, node) for node in nodes]
        for i, label in enumerate(labels):
            print(f"  node {i}: {label}")
        stream = rt.cudaStream_t(init_value=gm.stream.cuda_stream)
        events = [nd for nd, lb in zip(nodes, labels) if lb == "event_record"]
        kernels = [nd for nd, lb in zip(nodes, labels) if lb.startswith("kernel")]
        chains = [("one chain, event after the staging kernel, blocking", 0, True),
                  ("one chain, event after the staging kernel, a leaf", 0, False),
                  ("one chain, event at the end", len(kernels) - 1, True),
                  ("one chain, no event", None, False)]
        steps = [("the graph as captured", g.launch, inputs.staging_events[0])]
        keep = []
        for label, after, blocking in chains:
            try:
                ex, clone, ev = _chain(rt, graph, kernels, events, after, blocking)
            except (RuntimeError, TypeError) as exc:
                print(f"  {label}: {exc!r}")
                continue
            keep.append((ex, clone))
            steps.append((label, lambda ex=ex: rt.cudaGraphLaunch(ex, stream),
                          ev if ev is not None else torch.cuda.Event()))
        print("per structure: launch alone | the event asked right after its replay | ask + "
              "launch (an in-place step's two driver calls), each after a synchronize:")
        for label, launch, ev in steps:
            alone = _host_us(launch, args.reps)
            asked = _host_us(ev.query, args.reps, before=launch)
            both = _host_us(lambda ev=ev, launch=launch: (ev.query(), launch()), args.reps)
            print(f"{label}:\n    {_stat(alone)} | {_stat(asked)} | {_stat(both)}")

        def timed(label, fn) -> None:
            print(f"  {label:<24}{_stat(_host_us(fn, args.reps))}")

        exec_handle = rt.cudaGraphExec_t(init_value=int(g.graph.raw_cuda_graph_exec()))
        print("the captured graph's launch, bare and as the manager calls it:")
        timed("cudaGraphLaunch", lambda: rt.cudaGraphLaunch(exec_handle, stream))
        timed("g.launch()", g.launch)

        print("in place, the step written once (each after a synchronize):")
        timed("gm.begin_step()", gm.begin_step)
        gm.validate = False
        timed("begin_step + launch(k), unchecked", lambda: (gm.begin_step(), gm.launch(k)))
        gm.validate = True
        timed("begin_step + launch(k), checked", lambda: (gm.begin_step(), gm.launch(k)))
        timed("view checks alone", lambda: gm.checks.views.decode(k))
        for ex, clone in keep:
            rt.cudaGraphExecDestroy(ex)
            rt.cudaGraphDestroy(clone)

if __name__ == "__main__":
    main()
