"""Which steps get a graph: uniform decode sizes (spec §10.3) and token buckets for steps
of any composition, both in tokens, and the context buckets decode graphs are captured for."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from staticattn.arena.config import ArenaConfig, round_up
from staticattn.errors import GraphError

__all__ = [
    "bucket_requests", "default_capture_sizes", "default_context_buckets",
    "default_mixed_buckets", "normalize_capture_sizes", "normalize_context_buckets",
    "normalize_mixed_buckets",
]

#: The smallest token bucket: below it a graph costs the same whatever its size.
MIN_BUCKET = 16
#: The smallest context bucket: below it a decode step costs about the same.
MIN_CONTEXT = 2048


def default_capture_sizes(config: ArenaConfig, max_size: int | None = None) -> list[int]:
    """The reference engine's ladder: 1, 2, 4, multiples of 8 below 256, multiples of 16
    from 256, up to ``max_size`` tokens; under MTP every size rounded up to a multiple of
    ``next_n`` (sizes that then exceed the max are dropped).

    ``max_size`` defaults to ``min(max_num_seqs * next_n * 2, 512)`` capped by what one step
    can hold (``max_num_batched_tokens`` and ``max_num_seqs * next_n``).

    Examples
    --------
    ``max_num_seqs=256, next_n=2`` -> ``[2, 4, 8, 16, 24, ..., 248, 256, 272, ..., 512]``.
    """
    n = config.next_n
    cap = min(config.max_num_batched_tokens, config.max_num_seqs * n)
    if max_size is None:
        max_size = min(config.max_num_seqs * n * 2, 512)
    max_size = min(max_size, cap)
    base = [s for s in (1, 2, 4) if s <= max_size]
    base += list(range(8, min(max_size, 255) + 1, 8))
    base += list(range(256, max_size + 1, 16))
    if config.max_num_batched_tokens <= max_size:
        base.append(config.max_num_batched_tokens)
    return sorted({round_up(s, n) for s in base if round_up(s, n) <= max_size})


def normalize_capture_sizes(config: ArenaConfig, sizes: Iterable[int]) -> list[int]:
    """Validate a user's list: positive multiples of ``next_n`` that fit one step."""
    n = config.next_n
    cap = min(config.max_num_batched_tokens, config.max_num_seqs * n)
    out = sorted({int(s) for s in sizes})
    if not out:
        raise GraphError("capture sizes are empty; give at least one size or use the default")
    for s in out:
        if s < 1 or s % n:
            raise GraphError(
                f"capture size {s} must be a positive multiple of next_n={n} (uniform decode "
                "batches have next_n tokens per request)"
            )
        if s > cap:
            raise GraphError(
                f"capture size {s} exceeds what one step holds: min(max_num_batched_tokens, "
                f"max_num_seqs * next_n) = {cap}"
            )
    return out


def default_mixed_buckets(config: ArenaConfig) -> list[int]:
    """Token buckets for steps of any composition: powers of two from 16 up to
    ``max_num_batched_tokens``, which is always a bucket.

    Why powers of two: a step pads to at most twice its tokens, and the metadata build of
    a bucket costs about the same whatever its size up to thousands of tokens (a few launches
    whose work grows slowly with tokens), so more buckets would buy little and cost capture
    time and pool memory. A step whose own work grows with tokens may want a finer ladder:
    pass one to ``GraphManager.capture(buckets=...)``.

    Examples
    --------
    ``max_num_batched_tokens=8192`` -> ``[16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]``.
    """
    return _doublings(MIN_BUCKET, config.max_num_batched_tokens)


def bucket_requests(config: ArenaConfig, bucket: int) -> int:
    """Request slots of a token bucket: ``bucket`` (never more than ``max_num_seqs``), one
    per token. A step with zero-token requests may have more requests than tokens; the
    dispatcher then picks a larger bucket with the slots, or none
    (:meth:`~staticattn.graphs.dispatch.Dispatcher.bucket`)."""
    return min(config.max_num_seqs, bucket)


def normalize_mixed_buckets(config: ArenaConfig, buckets: Iterable[int]) -> list[int]:
    """Validate a user's token buckets: positive, at most ``max_num_batched_tokens``."""
    out = sorted({int(b) for b in buckets})
    for b in out:
        if not 1 <= b <= config.max_num_batched_tokens:
            raise GraphError(
                f"token bucket {b} must be in [1, max_num_batched_tokens="
                f"{config.max_num_batched_tokens}]"
            )
    return out


def default_context_buckets(config: ArenaConfig) -> list[int]:
    """Powers of two from :data:`MIN_CONTEXT` below ``max_model_len``, then
    ``max_model_len`` itself (1M: 2K, 4K, ..., 512K, 1M; 4K: 2K, 4K).

    Why: a decode graph bakes in the widths its consumer sizes from the batch's
    ``max_seq_len`` (the indexer's logits row and top-k scan, for one); captured for a
    1M-token limit, every replay pays for 1M even when every context is 2K."""
    return _doublings(MIN_CONTEXT, config.max_model_len)


def _doublings(first: int, top: int) -> list[int]:
    """``first``, ``2 * first``, ``4 * first``, ... below ``top``, then ``top``."""
    return [first << i for i in range(top.bit_length()) if first << i < top] + [top]


def normalize_context_buckets(config: ArenaConfig, contexts: Sequence[int]) -> list[int]:
    """A user's context buckets, sorted and deduplicated, ending at ``max_model_len`` (added
    when missing, so every step has a bucket); each a positive int no larger."""
    for c in contexts:
        if isinstance(c, bool) or not isinstance(c, int):
            raise GraphError(f"context bucket {c!r} must be an int in [1, max_model_len="
                             f"{config.max_model_len}]")
    out = sorted(set(contexts))
    for c in out:
        if c < 1 or c > config.max_model_len:
            raise GraphError(f"context bucket {c} must be in [1, max_model_len="
                             f"{config.max_model_len}]")
    if not out or out[-1] != config.max_model_len:
        out.append(config.max_model_len)
    return out
