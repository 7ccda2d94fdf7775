"""A tiny builder and steps for graph-manager and checker tests (not a product builder)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from staticattn.arena import Arena, ArenaConfig, BufferDecl
from staticattn.builders import Batch
from staticattn.builders.contract import claim_arena


@dataclass(slots=True)
class ToyMetadata:
    doubled_seq_lens: torch.Tensor  # int32 (num_reqs,)


class ToyBuilder:
    """Writes ``2 * seq_lens`` into its arena view; graph-safe by construction."""

    name = "toy"
    arena: Arena | None = None

    def buffers(self, config: ArenaConfig) -> list[BufferDecl]:
        return [BufferDecl("toy.doubled", (config.max_num_seqs,), torch.int32)]

    def bind(self, arena: Arena) -> None:
        claim_arena(self, arena)
        self.doubled = arena["toy.doubled"]

    def build(self, batch: Batch) -> ToyMetadata:
        out = self.doubled[: batch.num_reqs]
        torch.add(batch.seq_lens, batch.seq_lens, out=out)
        return ToyMetadata(out)

    build_decode = build
    build_mixed = build


class ToyStep:
    """out[t] = positions[t] + doubled_seq_lens[token_to_req[t]], into buffers it owns."""

    def __init__(self, config: ArenaConfig, device) -> None:
        t = config.max_num_batched_tokens
        self.gathered = torch.zeros(t, dtype=torch.int32, device=device)
        self.out = torch.zeros(t, dtype=torch.int64, device=device)

    def __call__(self, batch: Batch, md) -> torch.Tensor:
        n = batch.num_actual_tokens
        g = self.gathered[:n]
        torch.index_select(md["toy"].doubled_seq_lens, 0, batch.token_to_req, out=g)
        torch.add(batch.positions, g, out=self.out[:n])
        return self.out[:n]


def toy_expected(query_lens, seq_lens) -> list[int]:
    out = []
    for q, L in zip(query_lens, seq_lens):
        out += [int(L) - int(q) + j + 2 * int(L) for j in range(int(q))]
    return out


def emulated_graph(manager, kind, size: int, context_len: int | None = None):
    """A graph of ``kind`` (:class:`~staticattn.graphs.GraphKind`) and ``size`` tokens for
    ``manager`` whose launch runs the graph's body eagerly -- staging kernels, builds at the
    capture extents, the step: what its replay computes, on any device. Its request slots
    are those ``capture`` would give it; a decode graph's context bucket is ``context_len``
    (default the widest)."""
    from staticattn.graphs import CapturedGraph, GraphKind
    from staticattn.graphs.sizes import bucket_requests

    num_reqs = (size // manager.config.next_n if kind is GraphKind.DECODE
                else bucket_requests(manager.config, size))

    context = manager.capturer.context_len if context_len is None else context_len

    def body():
        return manager.capturer.body(kind, num_reqs, size, context)

    manager.capturer.stage_warm_up(kind, num_reqs, size)
    outputs, metadata = body()
    return CapturedGraph(kind, size, num_reqs, None, outputs, metadata, 0.0, 0, None, body,
                         "eagerly", context)
