"""The decoder-side replay sub-batch and its SWA metadata (``docs/spec/deepseek-v41.md``
§8.2, §11 case 5), graph-safe.

DeepSeek V4.1's layers from the last kv source on run on each request's last ``min(q, W)``
rows only (decodes never trim). :class:`DecoderReplayBuilder` builds that sub-batch on the
device (:mod:`staticattn.kernels.swa.decoder_replay_rows`) into fixed-capacity views -- its rows
into the
batch, compacted query starts, positions, SWA slots, requests and per-request ``kv_start``
-- and the sliding-window metadata of the replay layers on it, with ``replay_start =
kv_start`` (their KV below it was never written); with ``first_layer`` also the metadata of
the first replay layer (the last kv source itself), which wrote KV for every row and keeps
the batch's ``replay_start``.

The reference builds all of it eagerly and only graphs the replay layers; here it is a
builder like the others: ``build`` (eager: the sub-batch's extents from the host), and
``build_decode`` / ``build_mixed`` inside graphs, the sub-batch's counts on the device. Not
served: the reference's exception for requests that ask for prompt logprobs or routed-expert
outputs (all their rows kept) -- every prefill is trimmed here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from staticattn.arena import Arena, ArenaConfig, BufferDecl
from staticattn.builders.attention_utils.split import split_decodes_and_prefills
from staticattn.builders.batch import Batch
from staticattn.builders.contract import bound_config, claim_arena
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.builders.swa.metadata import SparseSWAMetadata
from staticattn.kernels.runtime.backend import resolve_backend
from staticattn.kernels.swa.decoder_replay_rows import ReplayViews, replay_sub_batch

__all__ = ["DecoderReplayBuilder", "DecoderReplayMetadata"]


@dataclass(slots=True)
class DecoderReplayMetadata:
    """A step's decoder-replay sub-batch.

    Attributes
    ----------
    batch : Batch
        The sub-batch: views of the replay buffers (query starts, positions, SWA slots,
        requests, ``replay_start = kv_start``, ``step_counts``) and of the step's (sequence
        lengths, block tables). From a graph build its extents are the step's capacities.
    rows : int32 device ``(T',)``
        Each sub-batch token's row in the step (to gather the layers' inputs); 0 past the
        sub-batch.
    kv_start : int32 device ``(num_reqs,)``
        Where each request's replay-layer KV starts.
    swa : SparseSWAMetadata
        The replay layers' SWA metadata on the sub-batch.
    first_layer_swa : SparseSWAMetadata or None
        The first replay layer's (the batch's ``replay_start``), when asked for.
    """

    batch: Batch
    rows: torch.Tensor
    kv_start: torch.Tensor
    swa: SparseSWAMetadata
    first_layer_swa: SparseSWAMetadata | None = None


class DecoderReplayBuilder:
    """Builds :class:`DecoderReplayMetadata` (builder contract: ``buffers``, ``bind``,
    ``build``, ``build_decode``, ``build_mixed``).

    Parameters
    ----------
    first_layer : bool
        Also build the first replay layer's SWA metadata (two more launches per build).

    Buffers (``R = max_num_seqs``, ``T = max_num_batched_tokens``): ``replay.query_start_loc``
    int32 ``(R + 1,)`` and its host twin ``replay.host_query_start_loc``, ``replay.query_lens``
    and ``replay.kv_start`` int32 ``(R,)``, ``replay.rows`` and ``replay.token_to_req`` int32
    ``(T,)``, ``replay.positions`` and ``replay.slot_mapping`` int64 ``(T,)``,
    ``replay.step_counts`` int32 ``(4,)``; and the SWA builder's own, prefixed
    ``replay_swa`` (and ``replay_first_swa``), without a row scratch.
    """

    name = "replay"
    arena: Arena | None = None  # the arena bound to, for life

    def __init__(self, *, first_layer: bool = True) -> None:
        self.swa = SparseSWAMetadataBuilder(name="replay_swa", row_scratch=False)
        self.first = (SparseSWAMetadataBuilder(name="replay_first_swa", row_scratch=False)
                      if first_layer else None)
        self._views: ReplayViews | None = None
        self._host_qsl: torch.Tensor | None = None
        self._backend = "torch"

    def _inner(self) -> list[SparseSWAMetadataBuilder]:
        return [self.swa] + ([self.first] if self.first is not None else [])

    def buffers(self, config: ArenaConfig) -> list[BufferDecl]:
        """The ``replay.*`` declarations and the SWA builders' (class docstring)."""
        r, t = config.max_num_seqs, config.max_num_batched_tokens
        decls = [
            BufferDecl("replay.query_start_loc", (r + 1,), torch.int32),
            BufferDecl("replay.host_query_start_loc", (r + 1,), torch.int32, where="host"),
            BufferDecl("replay.query_lens", (r,), torch.int32),
            BufferDecl("replay.kv_start", (r,), torch.int32),
            BufferDecl("replay.rows", (t,), torch.int32),
            BufferDecl("replay.token_to_req", (t,), torch.int32),
            BufferDecl("replay.positions", (t,), torch.int64),
            BufferDecl("replay.slot_mapping", (t,), torch.int64, fill=-1),
            BufferDecl("replay.step_counts", (4,), torch.int32),
        ]
        for inner in self._inner():
            decls += inner.buffers(config)
        return decls

    def bind(self, arena: Arena) -> None:
        """Take the views of an allocated arena (and bind the SWA builders)."""
        claim_arena(self, arena)
        v = {name: arena[f"replay.{name}"] for name in (
            "query_start_loc", "query_lens", "kv_start", "rows", "token_to_req", "positions",
            "slot_mapping", "step_counts")}
        self._views = ReplayViews(**v)
        self._host_qsl = arena["replay.host_query_start_loc"]
        for inner in self._inner():
            inner.bind(arena)
        self._backend = resolve_backend(arena.config.kernel_backend, arena.device)

    def build(self, batch: Batch) -> DecoderReplayMetadata:
        """Eagerly: the split and the sub-batch's extents from the batch's host lengths."""
        cfg = bound_config(self)
        d, _, _, _ = split_decodes_and_prefills(batch, decode_threshold=cfg.decode_threshold)
        qsl, q, _ = batch.host_arrays()
        b = np.arange(batch.num_reqs)
        kept = np.where(b < d, q, np.minimum(q, cfg.sliding_window))
        host_qsl = self._host_qsl.numpy()
        host_qsl[0] = 0
        np.cumsum(kept, out=host_qsl[1 : batch.num_reqs + 1])
        total = int(host_qsl[batch.num_reqs])
        self._launch(batch, (batch.num_reqs, d))
        return self._metadata(batch, self._sub_batch(batch, total, int(kept.max(initial=0))),
                              "build")

    def build_decode(self, batch: Batch) -> DecoderReplayMetadata:
        """Graph-safe, a uniform decode batch: nothing is trimmed, the sub-batch is the
        batch's rows in order."""
        return self._build_on_device(batch, "build_decode")

    def build_mixed(self, batch: Batch) -> DecoderReplayMetadata:
        """Graph-safe, a token bucket: the sub-batch's counts only on the device, its views
        at the bucket's capacity."""
        return self._build_on_device(batch, "build_mixed")

    # ------------------------------------------------------------------- helpers
    def _build_on_device(self, batch: Batch, how: str) -> DecoderReplayMetadata:
        bound_config(self)
        self._launch(batch, batch.require_step_counts())
        return self._metadata(batch, self._sub_batch(batch, batch.num_actual_tokens,
                                                     batch.max_query_len), how)

    def _launch(self, batch: Batch, counts) -> None:
        replay_sub_batch(self._backend, self._views, batch.query_start_loc, batch.seq_lens,
                         batch.replay_start, batch.slot_mapping, batch.positions,
                         window=bound_config(self).sliding_window, num_reqs=batch.num_reqs,
                         num_tokens=batch.num_actual_tokens, counts=counts)

    def _sub_batch(self, batch: Batch, num_tokens: int, max_query_len: int) -> Batch:
        v, num_reqs = self._views, batch.num_reqs
        return Batch(
            v.query_start_loc[: num_reqs + 1], self._host_qsl[: num_reqs + 1], batch.seq_lens,
            batch.seq_lens_cpu, num_reqs, num_tokens, max_query_len, batch.max_seq_len,
            batch.block_table, v.slot_mapping[:num_tokens], v.positions[:num_tokens],
            v.token_to_req[:num_tokens], batch.swa_block_table, step_counts=v.step_counts,
            query_lens=v.query_lens[:num_reqs], replay_start=v.kv_start[:num_reqs])

    def _metadata(self, batch: Batch, sub: Batch, how: str) -> DecoderReplayMetadata:
        swa = getattr(self.swa, how)(sub)
        first = None
        if self.first is not None:
            first = getattr(self.first, how)(replace(sub, replay_start=batch.replay_start))
        return DecoderReplayMetadata(sub, self._views.rows[: sub.num_actual_tokens],
                                     self._views.kv_start[: sub.num_reqs], swa, first)
