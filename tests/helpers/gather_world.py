"""The setting of the gather-consumer tests: a config's builders and their arena, the
built-in gather consumer, and host copies of its caches for the checksum oracle."""

from __future__ import annotations

from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder, make_arena
from staticattn.consumers import GatherConsumer


def gather_world(cfg, num_kv_blocks: int = 100_000, backend: str | None = None):
    """``(arena, inputs, builders, consumer, caches)``: the indexer builder (and the SWA
    builder when the config has a window) bound to a new arena, a gather consumer over
    ``num_kv_blocks`` blocks (its kernels on ``backend``, None: the config's), and its
    SWA, C128A and indexer caches as host lists."""
    builders = [IndexerMetadataBuilder()] + ([SparseSWAMetadataBuilder()] if cfg.has_swa
                                             else [])
    arena, inputs = make_arena(cfg, builders)
    consumer = GatherConsumer(cfg, num_kv_blocks=num_kv_blocks, backend=backend)
    caches = [consumer.caches[name].cpu().tolist() for name in ("swa", "dense", "indexer")]
    return arena, inputs, builders, consumer, caches


def consume(consumer, builders, batch, build: str) -> list[list[int]]:
    """The consumer's rows fed by every builder's ``build`` ("build", "build_decode",
    "build_mixed") of ``batch``."""
    metadata = {b.name: getattr(b, build)(batch) for b in builders}
    return consumer(batch, metadata).tolist()
