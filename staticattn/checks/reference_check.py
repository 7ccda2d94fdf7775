"""The checks that need no CUDA graph: a step's builds against :mod:`staticattn.reference`.

Two comparisons, on any device (the CPU included):

1. the built-in builders' reference builds (``build``) of a step, field by field, against
   the reference (the plain-Python oracle written from the spec): :func:`reference_mismatch`;
2. the user's step fed by the builds a graph holds, run eagerly, against the same step fed
   by the reference builds, outputs bit for bit (a capture of the graph builds replays what
   they compute here).

:func:`check_eagerly` runs both on random steps; the demo and the examples use them where no
graph can be captured. What only a capture can show (host syncs, allocations, addresses,
replay against eager, staging races) needs a GPU: :func:`~staticattn.checks.check_graph_safety`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np
from tqdm import tqdm

from staticattn.bench.random_batches import NUM_KV_BLOCKS, random_mixed_step
from staticattn.builders.batch import Batch
from staticattn.builders.compressed.builder import CompressedMetadataBuilder, kv_source_types
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.checks.extent_probe import emulated_replay, extent_mismatch
from staticattn.checks.output_compare import same_outputs, snapshot_outputs
from staticattn.errors import GraphError
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.options import EagerBuild
from staticattn.reference import (
    compressed,
    dcp_indexer,
    indexer,
    swa,
    v41_compressed,
    v41_dcp,
    v41_swa,
)
from staticattn.reference.assertions import ReferenceMismatch
from staticattn.reference.step import HostStep
from staticattn.validation.image_spans import check_image_spans

__all__ = ["CAPTURE_ONLY", "EagerCheck", "check_eagerly", "compared_builders",
           "reference_mismatch"]

#: What only a captured graph shows (the graph checks of ``check_graph_safety``).
CAPTURE_ONLY = ("host syncs and reads during capture", "allocations during capture",
                "stable addresses", "replay equal to eager", "staging races",
                "memory freed under a graph")


#: The built-in builders the reference covers.
_COMPARED = (IndexerMetadataBuilder, SparseSWAMetadataBuilder, CompressedMetadataBuilder)


def compared_builders(builders: Iterable) -> list[str]:
    """Names of the builders the reference covers (the built-in indexers, sparse SWA and
    compressed KV)."""
    return [b.name for b in builders if isinstance(b, _COMPARED)]


def _expected_indexer(cfg, builder, step: HostStep, tables: dict) -> tuple[dict, HostStep]:
    """The reference of one indexer builder's build and the step it addresses: a DeepSeek
    V4.1 index type's (its own ratio and ``index_k`` table), else the one indexer's; under
    decode context parallelism, the rank's."""
    prefix = "indexer."
    if builder.name.startswith(prefix):
        v41 = v41_compressed.V41Step(step, tables)
        name = builder.name[len(prefix):]
        want = (v41_dcp.indexer_metadata(cfg, v41, name, cfg.dcp_rank)
                if cfg.dcp_world_size > 1 else v41_compressed.indexer_metadata(cfg, v41, name))
        return want, v41_compressed.type_view(cfg, v41, name)[1]
    if cfg.dcp_world_size > 1:
        return dcp_indexer.indexer_metadata(cfg, step, cfg.dcp_rank), step
    return indexer.indexer_metadata(cfg, step), step


def reference_mismatch(manager: GraphManager, query_lens: np.ndarray, seq_lens: np.ndarray,
                       slot_mapping: np.ndarray, image_spans=None) -> str | None:
    """Stage the step, run the built-in builders' reference builds and compare every field
    with the reference; the first difference (builder and field named), or None.

    ``query_lens``, ``seq_lens``: host ints ``(num_reqs,)``, decodes first; ``slot_mapping``:
    int64 ``(num_tokens,)``; ``image_spans``: the step's ``(request, first, last)`` rows (a
    model with image spans), as :meth:`GraphManager.run` takes them, or None. The SWA
    builder's paged prefill rows are compared too, the spans' reach included
    (:mod:`staticattn.reference.v41_swa`). The block-table rows are read from the arena (the
    engine wrote them, the cache groups' tables too). Other builders are not compared.
    Overwrites the staging and the metadata views: call it between steps, never while a
    replay may still read them."""
    cfg, inputs = manager.config, manager.inputs
    q, s = np.asarray(query_lens), np.asarray(seq_lens)
    r = int(q.shape[0])
    swa_rows = inputs.swa_block_table
    step = HostStep(q, s, np.asarray(slot_mapping), inputs.block_table[:r].cpu().numpy(),
                    None if swa_rows is None else swa_rows[:r].cpu().numpy(), r, int(q.sum()))
    tables = {name: table[:r].cpu().numpy() for name, table in inputs.block_tables.items()}
    spans = check_image_spans(cfg, image_spans, q, s)
    counts = inputs.stage(q, s, slot_mapping, image_spans=spans)
    inputs.copy_to_device(counts.num_reqs_padded, counts.num_tokens_padded)
    batch = Batch.from_staged(inputs, counts)
    for builder in manager.builders:
        try:
            if isinstance(builder, IndexerMetadataBuilder):
                want, addressed = _expected_indexer(cfg, builder, step, tables)
                check = dcp_indexer if cfg.dcp_world_size > 1 else indexer
                check.assert_matches(builder.build(batch), want, addressed, manager.arena)
            elif isinstance(builder, SparseSWAMetadataBuilder):
                meta = builder.build(batch)
                swa.assert_matches(meta, swa.expected_for_step(cfg, step))
                _paged_rows_match(cfg, meta, step, spans or [])
            elif isinstance(builder, CompressedMetadataBuilder):
                want = compressed.expected(cfg, step, tables, list(kv_source_types(cfg)), r,
                                           step.num_tokens)
                compressed.assert_matches(builder.build(batch), want)
        except ReferenceMismatch as exc:
            return f"{builder.name}: {exc}"
    return None


def _paged_rows_match(cfg, meta, step: HostStep, spans: list) -> None:
    """The SWA build's paged prefill rows (with the image spans' reach), gather lengths and
    chunk plans equal the reference's; :class:`ReferenceMismatch` otherwise."""
    if meta.prefill_swa_indices is None and meta.num_prefills == 0:
        return  # no prefill: no paged rows, on either side
    swa_step = v41_swa.SWAStep(step.query_lens.tolist(), step.seq_lens.tolist(),
                               [0] * step.num_reqs, step.slot_mapping.tolist(),
                               step.swa_block_table.tolist(),
                               [tuple(int(x) for x in row) for row in spans])
    v41_swa.assert_eager(meta, v41_swa.expected_eager(cfg, swa_step))


@dataclass(slots=True)
class EagerCheck:
    """What :func:`check_eagerly` found: steps run, and how many differed."""

    steps: int = 0
    output_mismatches: int = 0
    reference_mismatches: int = 0
    extent_mismatches: int = 0
    compared: tuple[str, ...] = ()
    first_mismatch: str | None = None

    @property
    def ok(self) -> bool:
        return (self.output_mismatches == 0 and self.reference_mismatches == 0
                and self.extent_mismatches == 0)

    def add(self, outputs_equal: bool, mismatch: str | None,
            extent: str | None = None) -> None:
        """Count one step: its outputs equal or not, its metadata's first difference, and
        the first difference between its emulated replay and its eager run at its own
        extents (:func:`~staticattn.checks.extent_probe.extent_mismatch`)."""
        self.steps += 1
        self.output_mismatches += not outputs_equal
        self.reference_mismatches += mismatch is not None
        self.extent_mismatches += extent is not None
        if self.first_mismatch is None:
            self.first_mismatch = mismatch or (extent if outputs_equal else (
                "the step's outputs differ between the graph builds and the reference builds"))

    def lines(self) -> list[str]:
        """The result as printable lines."""
        compared = ", ".join(self.compared) or "none of the builders (not built-in)"
        out = [f"{self.steps} random steps run eagerly:",
               f"  the step's outputs, graph builds vs reference builds: "
               f"{self.output_mismatches} mismatches",
               f"  metadata vs the reference ({compared}): {self.reference_mismatches} "
               "mismatches",
               f"  replay (emulated) vs the eager step at its own extents: "
               f"{self.extent_mismatches} mismatches"]
        if self.first_mismatch:
            out.append(f"  first: {self.first_mismatch[:300]}")
        return out

    def to_dict(self) -> dict:
        """The result as JSON-ready values."""
        return {**asdict(self), "compared": list(self.compared)}


def check_eagerly(manager: GraphManager, *, num_steps: int = 20, seed: int = 0,
                  num_kv_blocks: int | None = None, max_seq_len: int | None = None,
                  progress: bool = False) -> EagerCheck:
    """Run ``num_steps`` random steps (decodes, then extends and fresh prefills) through
    ``manager`` eagerly: the step fed by the graph builds against the step fed by the
    reference builds, the reference builds' metadata against the reference, and what the
    replay of the graph that would hold the step computes (its body run eagerly at the
    capture extents) against the eager step at the step's own extents
    (:mod:`staticattn.checks.extent_probe`).

    ``num_kv_blocks``: the pool the random block ids are drawn from, ``[1, num_kv_blocks)``;
    default the manager's (``GraphOptions.num_kv_blocks``), or 4096 for a manager that does
    not validate and has none. A pool larger than the manager's is a :class:`GraphError`
    (its steps would be refused). ``max_seq_len`` bounds the drawn contexts (the
    reference's loops grow with them); ``progress`` shows a progress bar. Runs on any
    device; captures nothing."""
    num_kv_blocks = _pool_blocks(manager, num_kv_blocks)
    rng = np.random.default_rng(seed)
    check = EagerCheck(compared=tuple(compared_builders(manager.builders)))
    for _ in tqdm(range(num_steps), desc="eager checks", unit="step", disable=not progress,
                  leave=False):
        step = random_mixed_step(manager.inputs, rng, num_kv_blocks=num_kv_blocks,
                                 max_seq_len=max_seq_len)
        q, s, slots = step.query_lens, step.seq_lens, step.slot_mapping
        ours = snapshot_outputs(manager.run(q, s, slots, eager=EagerBuild.GRAPH).outputs)
        theirs = snapshot_outputs(manager.run_eager(q, s, slots))
        emulated = emulated_replay(manager, q, s, slots)
        extent = None if emulated is None else extent_mismatch(manager, *emulated, q, s, slots)
        check.add(same_outputs(ours, theirs), reference_mismatch(manager, q, s, slots), extent)
    return check


def _pool_blocks(manager: GraphManager, num_kv_blocks: int | None) -> int:
    """The pool random steps draw from: ``num_kv_blocks``, within the manager's own."""
    own = manager.options.num_kv_blocks
    if num_kv_blocks is None:
        return NUM_KV_BLOCKS if own is None else own
    if own is not None and num_kv_blocks > own:
        raise GraphError(f"check_eagerly: num_kv_blocks={num_kv_blocks} exceeds the manager's "
                         f"pool, GraphOptions(num_kv_blocks={own}): its steps would be refused")
    return num_kv_blocks
