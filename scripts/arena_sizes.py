"""The device arena of every preset at its defaults, and what the reference engine allocates
for the same C128A buffers: the markdown table of ``docs/results/arena_sizes.md``.

Run from the repository root on any machine (the arena is allocated on the CPU: its size is
the same on a GPU)::

    PYTHONPATH=. python scripts/arena_sizes.py

Per preset (``default_builders``, every field at its default), measured from this tree's
arena: the whole device arena (``arena.nbytes("device")``) with the C128A prefill rows in
one chunk of a whole step -- the layout before the chunked workspace, a ``(T, maxC)`` buffer
-- and with the default workspace (``dense_prefill_workspace_bytes``); and the C128A row
buffers of the default arena (``swa.dense_decode_indices``, ``swa.dense_decode_lens``,
``swa.dense_prefill_indices``, ``swa.dense_prefill_lens``). Computed from the spec
(``vllm-semantics.md`` §7, the V4 FlashMLA sparse builder of vLLM 0.33 when a layer has
ratio 128): the reference's three C128A buffers, ``c128a_global_decode_buffer`` and
``c128a_prefill_buffer`` int32 ``(T, maxC)`` and ``c128a_decode_lens_buffer`` int32 ``(T,)``;
none for a model without a C128A layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from staticattn.arena import ArenaConfig
from staticattn.builders import default_builders, make_arena
from staticattn.builders.swa.declarations import dense_prefill_chunk_rows
from staticattn.model import PRESETS

MIB = 1 << 20
#: The arena's C128A row buffers, the ones the reference's three C128A buffers hold.
DENSE_BUFFERS = ("swa.dense_decode_indices", "swa.dense_decode_lens",
                 "swa.dense_prefill_indices", "swa.dense_prefill_lens")


@dataclass(frozen=True, slots=True)
class Sizes:
    """One preset's sizes in bytes, and its C128A row geometry."""

    preset: str
    max_c: int
    chunk_rows: int
    chunks: int
    arena_whole_step: int
    arena: int
    dense_buffers: int
    reference_dense_buffers: int


def arena_bytes(config: ArenaConfig) -> tuple[int, int]:
    """``(device arena bytes, bytes of its C128A row buffers)`` with the default builders."""
    arena, _ = make_arena(config, default_builders(config))
    dense = sum(arena.decl(name).nbytes for name in DENSE_BUFFERS if name in arena)
    return arena.nbytes("device"), dense


def measure(preset: str) -> Sizes:
    cfg = ArenaConfig.preset(preset, device="cpu")
    t, max_c = cfg.max_num_batched_tokens, cfg.dense_width
    # A workspace of a whole step's rows is the layout before the chunks: (T, maxC).
    whole_step = cfg.replace(dense_prefill_workspace_bytes=max(4 * t * max_c, 1))
    arena, dense = arena_bytes(cfg)
    reference = (2 * t * max_c + t) * 4 if max_c else 0
    chunks = -(-t // dense_prefill_chunk_rows(cfg)) if max_c else 0
    return Sizes(preset, max_c, dense_prefill_chunk_rows(cfg), chunks, arena_bytes(whole_step)[0],
                 arena, dense, reference)


def table(rows: list[Sizes]) -> str:
    head = ("| preset | maxC | rows a chunk (chunks a step of T) | device arena, a (T, maxC) "
            "buffer (measured) | device arena, chunked (measured) | C128A row buffers, ours "
            "(measured) | C128A buffers, vLLM 0.33 (computed) |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        geometry = f"{r.chunk_rows} ({r.chunks})" if r.max_c else "-"
        sizes = (r.arena_whole_step, r.arena, r.dense_buffers, r.reference_dense_buffers)
        lines.append(f"| {r.preset} | {r.max_c or '-'} | {geometry} | "
                     + " | ".join(f"{n / MIB:.1f} MiB" for n in sizes) + " |")
    return "\n".join(lines)


def main() -> None:
    print(table([measure(name) for name in PRESETS]))


if __name__ == "__main__":
    main()
