"""One prefill-context-parallel rank: its arena, its graph, its steps.

Workflow (every rank of the PCP group, the same calls in the same order):

1. ``PCPRank(pcp, config, num_tokens, group=..., rank=...)`` -- ``config`` is the rank's
   arena config, holding ``R = 2 * pcp.max_num_seqs`` requests (rows) and ``N`` tokens;
   the arena holds the input views, every builder's buffers (:func:`~staticattn.builders.
   default_builders`) and the PCP views (:mod:`staticattn.builders.pcp.rank_views`), all
   allocated once;
2. ``capture()`` (CUDA, any PCP graph mode but ``NONE``: DeepSeek V3.2 and V4.1 alike;
   the reference runs V4.1's PCP eagerly only, here it is captured on purpose, every piece
   having a fixed-capacity device formulation, :mod:`staticattn.arena.pcp_config`) -- one
   graph: the copy of the staged global batch, the PCP split and this rank's rows (V4.1:
   with every rank's compressor-ring links) written into the input views
   (:mod:`staticattn.builders.pcp.rank_step`), every builder's ``build_mixed`` over them,
   and the step (the emulated
   layer of :mod:`staticattn.distributed.pcp_consumer`, or under PCP + DCP of
   :mod:`staticattn.distributed.pcp_dcp_layer`, with its NCCL collectives). Every
   rank captures together: the capture's collectives pair up across ranks;
3. ``run(query_lens, is_prefilling, num_computed, req_state_idx)`` per step, with the
   global batch's block rows already in ``views.tables`` -- check the step on the
   host (typed errors, nothing written), write the four global host arrays into the pinned
   staging, replay (without CUDA: the same body, eagerly, gloo collectives). The host does
   no per-rank work: every rank's rows are derived inside the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from staticattn.arena import ArenaConfig
from staticattn.arena.pcp_config import GraphMode, PCPConfig, Speculation
from staticattn.builders import default_builders, make_arena
from staticattn.builders.batch import Batch
from staticattn.builders.compressed import ring_capacity
from staticattn.builders.pcp.rank_step import build_rank_step
from staticattn.builders.pcp.rank_views import PCPLayout, PCPViews
from staticattn.distributed.pcp_consumer import PCPGatherStep
from staticattn.distributed.pcp_dcp_layer import PCPDCPLayer
from staticattn.errors import ConfigError
from staticattn.graphs.capturer import capture, warm_up
from staticattn.validation.pcp_step import check_pcp_requests, check_pcp_step

__all__ = ["PCPRank"]


class PCPRank:
    """One PCP rank's arena, builders, step and graph (see the module): the graph copies the
    staged global batch, splits it, writes the rank's rows into its inputs and builds them.

    Parameters
    ----------
    pcp : PCPConfig
    config : ArenaConfig
        The rank's arena: ``max_num_seqs >= 2 * pcp.max_num_seqs`` (rows),
        ``max_num_batched_tokens >= num_tokens``; under PCP + DCP (``pcp.dcp_size =
        pcp_size``) its ``dcp_world_size`` and ``dcp_rank`` are the DCP group's.
    num_tokens : int
        ``N``, the tokens every rank pads to.
    max_num_tokens : int
        ``T``, the global step's token capacity.
    group : ProcessGroup or None
        The PCP group (None: the default one).
    rank : int
        This rank's PCP rank.
    num_kv_blocks, seed : int
        The step's caches (:class:`~staticattn.distributed.pcp_consumer.PCPGatherStep`).
    layer : callable, optional
        ``layer(rank) -> step``: a step of one's own for the graph to hold after the builds
        instead of the emulated layer, made once the rank's arena and views exist
        (``rank.config``, ``rank.views``); ``step(batch, md)`` returns ``step.out``, the
        same tensor every call, and runs the collectives it needs itself (the PCP + DCP
        prefill indexer, :mod:`~staticattn.distributed.pcp_dcp_indexer`, and V3.2's whole
        prefill attention, :mod:`~staticattn.distributed.pcp_dcp_attention`, are such).

    Attributes
    ----------
    arena, inputs, builders, views, step
    graph : torch.cuda.CUDAGraph or None
        Once captured.
    """

    def __init__(self, pcp: PCPConfig, config: ArenaConfig, num_tokens: int,
                 max_num_tokens: int, group, rank: int, num_kv_blocks: int,
                 seed: int = 0, layer: Callable[[PCPRank], Any] | None = None) -> None:
        if config.max_num_seqs < pcp.max_rows or config.max_num_batched_tokens < num_tokens:
            raise ConfigError(
                f"a PCP rank's arena must hold {pcp.max_rows} rows and {num_tokens} tokens; "
                f"it holds max_num_seqs={config.max_num_seqs}, max_num_batched_tokens="
                f"{config.max_num_batched_tokens}")
        if pcp.dcp_size not in (1, pcp.pcp_size) or config.dcp_world_size != pcp.dcp_size:
            raise ConfigError(
                f"a PCP rank serves dcp_size 1 or pcp_size={pcp.pcp_size} (the DCP group is "
                f"the PCP group) with an arena of the same dcp_world_size; got dcp_size="
                f"{pcp.dcp_size}, dcp_world_size={config.dcp_world_size}")
        # The PCP config's refusals (V4.1 takes no speculation, §5.2) judge what it says of
        # speculation: the arena, which sizes the decode rows, must say the same.
        if (config.num_speculative_tokens > 0) != (pcp.speculation is not Speculation.NONE):
            raise ConfigError(
                f"the rank's arena has num_speculative_tokens={config.num_speculative_tokens} "
                f"but the PCP config's speculation is {pcp.speculation.value!r}: decode rows "
                "of more than one token need speculation MTP (or DSpark), and no speculation "
                "needs num_speculative_tokens=0")
        self.pcp, self.config, self.rank = pcp, config, rank
        self.num_tokens, self.max_num_tokens = num_tokens, max_num_tokens
        self.builders = default_builders(config)
        # Every prefill region's D shards hold at most its length and one interleave a rank.
        workspace = pcp.max_num_seqs * (config.max_model_len
                                        + pcp.dcp_size * pcp.cp_kv_cache_interleave_size)
        layout = PCPLayout(pcp, num_tokens, max_num_tokens, workspace,
                           ring_capacity(config.num_speculative_tokens))
        self.arena, self.inputs = make_arena(config, [layout, *self.builders])
        self.views: PCPViews = layout.views
        if layer is not None:
            self.step = layer(self)
        elif pcp.dcp_size == 1:
            self.step = PCPGatherStep(config, self.views, rank, pcp.pcp_size, group,
                                      num_kv_blocks, seed)
        else:
            self.step = PCPDCPLayer(pcp, config, self.views, group, num_kv_blocks, seed)
        self.num_kv_blocks = num_kv_blocks
        self.graph = None
        # Recorded inside the graph (an event-record node: ``external``), waited for by the
        # host before it rewrites the staging the graph's copy node reads.
        self._staged = (torch.cuda.Event(external=True) if config.torch_device.type == "cuda"
                        else None)

    def body(self) -> torch.Tensor:
        """What the graph holds (see the module); the restored step rows, int64
        ``(T, columns)``."""
        return self.step(*self.metadata())

    def metadata(self) -> tuple[Batch, dict]:
        """The graph's work before the layer: the rank's rows of the staged global batch
        written into its input views, and every builder's mixed build over them. Returns
        the rank's batch (``R`` rows, ``N`` tokens) and its metadata by builder name; a
        layer of one's own runs on them (the rank's token ``i`` is the global token
        ``views.rows.token_to_global[rank, i]``)."""
        build_rank_step(self.pcp, self.views, self.inputs, self.rank)
        if self._staged is not None:
            self._staged.record()  # the pinned staging has been read: the host may rewrite it
        batch = Batch.for_mixed_capture(self.inputs, self.pcp.max_rows, self.num_tokens)
        return batch, {b.name: b.build_mixed(batch) for b in self.builders}

    @property
    def graphs(self) -> bool:
        """Whether the rank's steps replay a graph: on CUDA, under any PCP graph mode but
        ``GraphMode.NONE`` (which runs the same body eagerly), V3.2 and V4.1 alike."""
        return self._staged is not None and self.pcp.graph_mode is not GraphMode.NONE

    def capture(self) -> None:
        """Capture the rank's graph (every rank at once; see :attr:`graphs`). The warm-up
        and capture run on the empty step the zeroed staging holds."""
        if not self.graphs:
            raise ConfigError("capture() needs a CUDA arena and a PCP graph mode; run() "
                              "runs the body eagerly otherwise")
        stream = torch.cuda.Stream()
        warm_up(self.body, stream)
        self.graph, _ = capture(self.body, stream)

    def check(self, query_lens, is_prefilling, num_computed) -> np.ndarray:
        """The host checks of a step of ``S`` requests (host ints ``(S,)``, bools for
        ``is_prefilling``; typed errors before anything is written); each rank's token count,
        int64 ``(P,)``."""
        q = np.asarray(query_lens, dtype=np.int64)
        pre = np.asarray(is_prefilling, dtype=bool)
        computed = np.asarray(num_computed, dtype=np.int64)
        qsl = np.concatenate([[0], np.cumsum(q)])
        tokens = check_pcp_step(self.pcp, qsl, pre, computed, num_tokens_padded=self.num_tokens,
                                max_num_batched_tokens=self.num_tokens,
                                max_num_tokens=self.max_num_tokens,
                                prefill_workspace=self.config.max_prefill_workspace)
        check_pcp_requests(q, pre, computed, decode_threshold=self.config.decode_threshold,
                           max_model_len=self.config.max_model_len)
        return tokens

    def run(self, query_lens, is_prefilling, num_computed, req_state_idx) -> torch.Tensor:
        """Check, stage and run one step of ``S`` global requests (host arrays ``(S,)``;
        their block rows are in ``views.tables``). Returns the step's output (the emulated
        layers: the restored rows, int64 ``(T, columns)``), valid until the next step."""
        self.check(query_lens, is_prefilling, num_computed)
        self.stage(query_lens, is_prefilling, num_computed, req_state_idx)
        if self.graph is not None:
            self.graph.replay()
            return self.step.out
        return self.body()

    def stage(self, query_lens, is_prefilling, num_computed, req_state_idx) -> None:
        """Write the global host arrays into the pinned staging, padded to ``max_num_seqs``
        (query length 0, not prefilling, 0s), once the last step has read it."""
        if self._staged is not None and not self._staged.query():
            self._staged.synchronize()
        host = self.views.host_batch.numpy()
        S = len(query_lens)
        host[0, 0] = 0
        np.cumsum(query_lens, out=host[0, 1:S + 1])
        host[0, S + 1:] = host[0, S]
        for row, values in enumerate((is_prefilling, num_computed, req_state_idx), start=1):
            host[row, :S] = values
            host[row, S:] = 0
