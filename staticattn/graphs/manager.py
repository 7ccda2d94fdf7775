"""GraphManager: every step replays a captured graph, metadata build included.

Workflow:

1. ``GraphManager(arena, inputs, builders, step, options)`` -- builders already bound to
   ``arena`` (see :func:`staticattn.builders.make_arena`); ``step(batch, metadata)`` is the
   user's own work, called with the batch and ``{builder.name: metadata}``. It may launch any
   kernels; it must write its outputs into memory it owns (or the arena) and return them (a
   tensor, a tuple, list or dict of tensors, or None), leading dimension = tokens.
   ``options`` is a :class:`~staticattn.graphs.options.GraphOptions`; its ``num_kv_blocks``
   (the blocks of the engine's KV pool) is required while it validates: it bounds every slot
   and block id.
2. ``capture(sizes, buckets)`` -- one graph per uniform decode size (``sizes``, tokens) and
   one per token bucket (``buckets``: steps of any composition -- decodes with chunked
   prefill, prefills, decodes of unequal lengths); largest first, one shared memory pool,
   Python's gc frozen; each graph = staging kernels + every builder's build + ``step``,
   warmed up first at minimal sequence lengths.
3. Per step, either

   * ``run(query_lens, seq_lens, slot_mapping, replay_start=None, image_spans=None)`` --
     validate, write the host arrays into the staging and launch: a uniform decode step
     replays the smallest decode graph that holds it, any other step the smallest token
     bucket that holds it; only a step beyond every captured graph runs eagerly (the
     manager counts why); or
   * the in-place API of an engine's decode loop (:mod:`staticattn.graphs.in_place`, whose
     docstring gives the views to write and the step contract): ``views = begin_step()``,
     write the step into the views, then ``launch(k)`` (uniform decode) or ``launch(k, t)``:
     bounds checked in a few vectorized passes, one graph launch, nothing else.

   ``replay_start`` and ``image_spans``: as :meth:`StepRunner.run <staticattn.graphs.runner.
   StepRunner.run>` describes them.

   Block tables are not arguments: the engine updates the rows that changed in
   ``inputs.block_table`` (and ``inputs.swa_block_table``) in place, through
   ``write_blocks(table, row, ids)`` to have the ids checked against the pool (on a CPU
   arena every validated step also checks the rows it uses).
4. ``close()`` (or leave the ``with`` block) -- drops the graphs and their pool.

The manager composes parts, each with its interface in its docstring: ``pool``
(:class:`~staticattn.graphs.pool.GraphPool`: the memory pool, capture and replay streams;
replays run on ``pool.stream``, the stream current when ``capture`` first ran),
``capturer`` (:class:`~staticattn.graphs.capturer.Capturer`), ``dispatcher``
(:class:`~staticattn.graphs.dispatch.Dispatcher`: every graph, and the one decision of
which graph replays a step or why it runs eagerly), ``checks``
(:class:`~staticattn.validation.step_checks.StepChecks`: every check of a step), ``eager``
(:class:`~staticattn.graphs.eager.EagerSteps`), and two front ends that describe a step
to the dispatcher: ``runner`` (:class:`~staticattn.graphs.runner.StepRunner`), whose
``run`` is the manager's, and ``in_place`` (:class:`~staticattn.graphs.in_place.
InPlaceSteps`), whose ``begin_step`` and ``launch`` are the manager's.

Example (on a CUDA machine; ``step`` reads metadata views and writes buffers it owns)::

    cfg = ArenaConfig.deepseek_v4(max_model_len=65536)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    with GraphManager(arena, inputs, builders, step, GraphOptions(num_kv_blocks=4096)) as gm:
        gm.capture()  # default decode sizes and token buckets
        for b in range(3):  # engine-owned rows, checked against the pool
            gm.write_blocks("block_table", b, np.arange(1, 5) + 4 * b)
        res = gm.run([2, 2, 2], [100, 37, 5000], np.arange(6))  # graph, decode, size 8
        res = gm.run([2, 1, 300], [100, 37, 300], np.arange(303))  # graph, mixed, 512
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from staticattn.arena import Arena
from staticattn.builders.batch import Batch
from staticattn.builders.contract import MetadataBuilder, check_bound
from staticattn.errors import GraphError
from staticattn.graphs.captured import CapturedGraph, GraphKind
from staticattn.graphs.capturer import Capturer
from staticattn.graphs.dispatch import Dispatcher, DispatchStats
from staticattn.graphs.eager import EagerSteps
from staticattn.graphs.in_place import InPlaceSteps
from staticattn.graphs.options import EagerBuild, GraphOptions
from staticattn.graphs.pool import GraphPool
from staticattn.graphs.runner import StepRunner
from staticattn.graphs.sizes import normalize_context_buckets
from staticattn.staging import HostViews, StepInputs
from staticattn.validation.block_ids import BlockIds
from staticattn.validation.step_checks import StepChecks
from staticattn.validation.values import slot_bound

__all__ = ["GraphManager", "StepFn"]

StepFn = Callable[[Batch, dict[str, Any]], Any]


class GraphManager:
    """Captures and replays the graphs of every step (see the module docstring).

    Parameters
    ----------
    arena : Arena
        Allocated; every builder is bound to it.
    inputs : StepInputs
        The arena's input views and staging.
    builders : sequence of MetadataBuilder
        At least one. Their ``build_decode`` / ``build_mixed`` run inside the graphs,
        ``build`` eagerly.
    step : callable ``(batch, metadata) -> outputs``
        The user's work. Outputs must live in memory the step owns: a fresh tensor
        returned from inside a capture would come from the graph pool and be overwritten
        by the next replay of any graph -- results are valid until the next step.
    options : GraphOptions, optional
        Validation, progress, GPU timing, the KV pool's size, raw launches, the eager build,
        recorded launches, the staging guard (:class:`~staticattn.graphs.options.
        GraphOptions`).
    pool : GraphPool, optional
        A pool shared with other managers of the same arena (a draft model's, say); by
        default the manager makes its own, and drops it on :meth:`close`.
    contexts : sequence of int, optional
        Context buckets (tokens): the decode graphs are captured once per bucket, for
        sequences of at most its length, and each decode step replays the smallest bucket
        holding its longest sequence: its cost follows the contexts it serves rather than
        ``max_model_len`` (:class:`~staticattn.graphs.contexts.ContextGraphs`). Default: one
        bucket, ``max_model_len``; the last is always ``max_model_len`` (added when missing).

    Raises :class:`GraphError` when ``options`` is not a :class:`GraphOptions`, ``step`` is
    not callable, ``builders`` is empty, ``inputs`` are not the arena's, a context bucket
    is not an int in ``[1, max_model_len]`` or the options validate without
    ``num_kv_blocks``, and
    :class:`~staticattn.errors.ArenaError` when a builder is not bound to ``arena``.
    """

    def __init__(self, arena: Arena, inputs: StepInputs, builders: Sequence[MetadataBuilder],
                 step: StepFn, options: GraphOptions | None = None, *,
                 pool: GraphPool | None = None, contexts: Sequence[int] | None = None) -> None:
        options = GraphOptions() if options is None else options
        _check_arguments(arena, inputs, builders, step, options)
        cfg = arena.config
        self.contexts = normalize_context_buckets(cfg, () if contexts is None else contexts)
        self.arena, self.inputs, self.config = arena, inputs, cfg
        self.options = options
        self._builders, self._step = list(builders), step
        self._owns_pool = pool is None
        self.pool = GraphPool(arena.device) if pool is None else pool
        self.dispatcher = Dispatcher(cfg, self.contexts)
        #: Slots must be below it: the KV pool's slot count (None without a pool size,
        #: which only a manager that does not validate may lack).
        self.slot_bound = slot_bound(cfg, options.num_kv_blocks, None)
        #: The block tables' ids against the pool (None without a pool size).
        self.block_ids = (None if options.num_kv_blocks is None
                          else BlockIds(inputs, options.num_kv_blocks))
        self.checks = StepChecks(cfg, inputs.host, self.slot_bound, self.block_ids,
                                 options.validate)
        self.capturer = Capturer(arena, inputs, builders, step, self.pool, options,
                                 self.contexts)
        self.eager = EagerSteps(inputs, builders, step, self.capturer, options.eager_build,
                                options.recorded_launches)
        self.runner = StepRunner(inputs, self.dispatcher, self.eager, self.pool, self.checks,
                                 options)
        self.in_place = InPlaceSteps(inputs, self.dispatcher, self.eager, self.checks,
                                     self.require_open)
        #: The producer of the device-length graphs in this manager's dispatcher (None until
        #: a :class:`~staticattn.graphs.DeviceLengthSteps` takes one: its graphs hold it,
        #: so a manager serves one).
        self.device_producer = None
        # The step APIs are the parts' own bound methods, not wrappers: a wrapper would add
        # a Python call to every step.
        self.run = self.runner.run
        self.begin_step = self.in_place.begin_step
        self.launch = self.in_place.launch

    def write_blocks(self, table: str, row: int, block_ids, start: int = 0) -> None:
        """Write ``block_ids`` into ``inputs.<table>[row, start : start + n]`` after checking
        every id against the KV pool (:meth:`BlockIds.write <staticattn.builders.
        validation.blocks.BlockIds.write>`): the way an engine has its block ids checked on
        a CUDA arena, where the steps cannot read the tables. ``table``: "block_table" or
        "swa_block_table"; ``block_ids`` host ints ``(n,)``. A :class:`GraphError` without
        a pool size (``GraphOptions(num_kv_blocks=...)``)."""
        if self.block_ids is None:
            raise GraphError("write_blocks checks ids against the KV pool: build the manager "
                             "with GraphOptions(num_kv_blocks=...)")
        self.block_ids.write(table, row, block_ids, start)

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> GraphManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release every graph and the recorded launches (after the device is idle), and
        the pool when the manager made it; every later step or capture is refused."""
        if self.closed:
            return
        if len(self.dispatcher) and torch.cuda.is_available():
            torch.cuda.synchronize(self.arena.device)
        self.dispatcher.clear()
        if self._owns_pool:
            self.pool.close()
        if self.eager.recorded_launches is not None:
            self.eager.recorded_launches.clear()
        self.runner.close()
        self.inputs.handed_out = False  # no step of a closed manager is launched

    @property
    def closed(self) -> bool:
        return self.runner.closed

    def require_open(self) -> None:
        """Raise :class:`GraphError` once the manager is closed."""
        self.runner.require_open()

    # ---------------------------------------------------------------- settings
    @property
    def builders(self) -> list[MetadataBuilder]:
        """The builders (fixed at construction)."""
        return self._builders

    @property
    def step(self) -> StepFn:
        """The user's step (fixed at construction: the parts hold it)."""
        return self._step

    @property
    def eager_build(self) -> EagerBuild:
        """What a step no captured graph holds runs (the option, resolved)."""
        return self.eager.build

    @property
    def validate(self) -> bool:
        """Whether ``run`` and ``launch`` check each step (from the options; switchable)."""
        return self.checks.validate

    @validate.setter
    def validate(self, on: bool) -> None:
        if on:
            self.checks.require_pool()
        self.checks.validate = bool(on)

    @property
    def time_gpu(self) -> bool:
        """Whether ``run`` records CUDA events (from the options; switchable; CUDA only)."""
        return self.runner.time_gpu

    @time_gpu.setter
    def time_gpu(self, on: bool) -> None:
        self.runner.time_gpu = bool(on) and self.arena.device.type == "cuda"

    @property
    def stats(self) -> DispatchStats:
        """The step counts so far: replays per kind, eager steps per reason, decode replays
        per context bucket (:class:`~staticattn.graphs.dispatch.DispatchStats`)."""
        return self.dispatcher.stats

    @property
    def host(self) -> HostViews:
        """The pinned staging as numpy views; write them after :meth:`begin_step`."""
        return self.inputs.host

    @property
    def stream(self) -> torch.cuda.Stream | None:
        """The stream every graph replays on (the pool's; None before the first capture)."""
        return self.pool.stream

    # ------------------------------------------------------------------ graphs
    def capture(self, sizes: Sequence[int] | None = None,
                buckets: Sequence[int] | None = None) -> list[CapturedGraph]:
        """Capture one graph per decode size (per context bucket) and one per token bucket
        (all in tokens), widest context and largest size first, into the pool.

        ``sizes`` default to :func:`~staticattn.graphs.sizes.default_capture_sizes`,
        ``buckets`` to :func:`~staticattn.graphs.sizes.default_mixed_buckets`; an empty
        sequence captures none of that kind. Already-captured graphs are kept.
        """
        self.require_open()
        return self.capturer.capture(sizes, buckets, self.dispatcher)

    @property
    def graphs(self) -> dict[int, CapturedGraph]:
        """The decode graphs by size (tokens), of the widest context bucket."""
        return self.dispatcher.graphs(GraphKind.DECODE)

    @property
    def mixed_graphs(self) -> dict[int, CapturedGraph]:
        """The token buckets by size (tokens)."""
        return self.dispatcher.graphs(GraphKind.MIXED)

    @property
    def capture_sizes(self) -> list[int]:
        """The captured decode sizes, ascending (tokens)."""
        return self.dispatcher.sizes(GraphKind.DECODE)

    @property
    def buckets(self) -> list[int]:
        """The captured token buckets, ascending (tokens)."""
        return self.dispatcher.sizes(GraphKind.MIXED)

    def graph_for(self, size: int, kind: GraphKind = GraphKind.DECODE,
                  context_len: int | None = None) -> CapturedGraph:
        """The graph of ``kind`` captured for ``size`` tokens (a decode graph: of context
        bucket ``context_len``, default the widest)."""
        self.require_open()
        return self.dispatcher.get(kind, size, context_len)

    @property
    def pool_bytes(self) -> int:
        """What this manager's captures added to the graph pool (bytes): the pool's size when
        the pool is its own."""
        return self.dispatcher.pool_bytes

    # ---------------------------------------------------------------- eagerly
    def run_eager(self, q, s, slots, replay_start=None, image_spans=None) -> Any:
        """Stage, build every builder eagerly (the reference builds), run the step; outputs
        for the real tokens. Host ints: ``q``, ``s``, ``replay_start`` (or None)
        ``(num_reqs,)``, ``slots`` ``(num_tokens,)``, checked by the caller."""
        return self.eager.reference_builds(self.inputs.stage(
            q, s, slots, checked=True, replay_start=replay_start, image_spans=image_spans))

    # ------------------------------------------------------------------ reports
    def describe(self) -> str:
        """A table per captured graph (kind, tokens, requests, capture time, nodes, pool
        memory, how it is launched), the totals, the step counts and the recorded
        launches."""
        text = self.dispatcher.describe()
        recorded = self.eager.recorded_launches
        if recorded is None:
            return text
        st = recorded.stats
        return (f"{text}\nrecorded launches: {len(recorded)} extents kept, {st.hits} steps "
                f"through them, {st.recorded} recorded, {st.unrecordable} extents unrecordable")


def _check_arguments(arena: Arena, inputs: StepInputs, builders: Sequence, step: Callable,
                     options: GraphOptions) -> None:
    """Raise a typed error for what a manager cannot be built from."""
    if not isinstance(options, GraphOptions):
        raise GraphError(f"options must be a GraphOptions; got {type(options).__name__}")
    if not callable(step):
        raise GraphError(f"step must be callable as step(batch, metadata); got "
                         f"{type(step).__name__}")
    if not builders:
        raise GraphError("a GraphManager needs at least one builder; got none")
    check_bound(arena, builders)
    if "input.seq_lens" not in arena or inputs.seq_lens is not arena["input.seq_lens"]:
        raise GraphError(f"inputs are not the step inputs of {arena!r}: pass the inputs "
                         "make_arena returned with it")
    if options.validate and options.num_kv_blocks is None:
        raise GraphError(
            "GraphOptions(num_kv_blocks=...) is required: the blocks of your KV pool bound "
            "every slot and block id a step may address (or validate=False, and the engine "
            "vouches for them)")
