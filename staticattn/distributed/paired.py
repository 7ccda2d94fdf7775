"""What the demo and the bench under decode context parallelism share: the rank's graph
manager of the DCP consumer beside one of the same steps on a one-rank arena (the
single-GPU step each rank is checked and timed against), the steps written into both, and
rank 0's output, text or JSON."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass

import torch.distributed as dist

from staticattn.distributed.world import Rank, dcp_config, dcp_world, write_decode_step
from staticattn.graphs import GraphManager, GraphOptions

__all__ = ["Paired", "emit", "paired_managers"]


@dataclass(slots=True)
class Paired:
    """The rank's manager (``rank``) and the single-GPU one (``single``) of the same steps.

    Attributes
    ----------
    rank, single : GraphManager
    consumers : tuple
        Their steps (a :class:`DCPDecodeAttention`, or a :class:`DCPDecodeLayers` of one per
        index type), the rank's first.
    """

    rank: GraphManager
    single: GraphManager
    consumers: tuple

    def write(self, step: dict) -> tuple:
        """Write a :func:`~staticattn.distributed.world.random_decode_step` into both
        (block-table rows, the caches, the queries); its host lengths ``(query_lens,
        seq_lens, slot_mapping)``, what ``run`` takes."""
        for manager, consumer in zip((self.rank, self.single), self.consumers):
            write_decode_step(manager.inputs, consumer, step)
        return step["query_lens"], step["seq_lens"], step["slot_mapping"]


@contextlib.contextmanager
def paired_managers(me: Rank, cfg, preset: str, options: GraphOptions) -> Iterator[Paired]:
    """The rank's manager of ``cfg`` (the DCP group: the default one) and the single-GPU
    manager of ``preset``, entered together; their arenas, consumers and graphs die with the
    block, before the launch is left."""
    arena, inputs, builders, consumer = dcp_world(cfg, dist.group.WORLD)
    s_arena, s_inputs, s_builders, s_consumer = dcp_world(
        dcp_config(preset, 1, 0, me.device), None)
    with GraphManager(arena, inputs, builders, consumer, options) as gm, \
            GraphManager(s_arena, s_inputs, s_builders, s_consumer, options) as one:
        yield Paired(gm, one, (consumer, s_consumer))


def emit(text: str, data: dict, json_path: str | None) -> None:
    """Rank 0's output: ``data`` as JSON instead of ``text`` for ``json_path`` "-", else the
    text, and the JSON written to ``json_path`` when one is named."""
    if json_path == "-":
        print(json.dumps(data, indent=1))
        return
    print(text)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(data, f, indent=1)
