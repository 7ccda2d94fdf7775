"""The bounds a config's capacities must respect for every buffer and kernel to work: at least
one block per request, and every position, key count and row offset within int32.

The kernels index with int32 (Triton's default for offsets computed from program ids and
int32 tensors) and the staging holds sequence lengths and query starts as int32, so a config
whose sizes pass 2**31 - 1 would wrap around in some offset instead of failing. Each bound
is checked once, at construction (:meth:`ArenaConfig.__post_init__`), and a config past it
is a :class:`~staticattn.errors.ConfigError` naming the field, its value and the limit.
"""

from __future__ import annotations

from typing import Protocol

from staticattn.errors import ConfigError

__all__ = ["INT32_MAX", "Capacities", "check_bounds", "check_image_capacity"]

#: The largest value an int32 position, length or offset holds.
INT32_MAX = 2**31 - 1


class Capacities(Protocol):
    """What :func:`check_bounds` reads of an :class:`~staticattn.arena.ArenaConfig` (a
    protocol, so that this module needs no import of the config that calls it)."""

    next_n: int
    block_size: int
    swa_block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_prefill_workspace: int
    max_logits_bytes: int
    max_image_tokens: int
    max_image_spans: int
    sliding_window: int | None
    dcp_world_size: int

    @property
    def has_swa(self) -> bool: ...
    @property
    def max_blocks_per_req(self) -> int: ...
    @property
    def max_swa_blocks_per_req(self) -> int: ...
    @property
    def max_decode_tokens(self) -> int: ...
    @property
    def dense_width(self) -> int: ...


def check_bounds(config: Capacities) -> None:
    """Raise a :class:`ConfigError` for the first capacity past its bound (see the module).

    ``max_model_len`` must hold one block of each cache group and one decode step (``next_n``
    tokens), and fit an int32 position; the widths the kernels address with int32 offsets
    must fit too: the block tables (``max_num_seqs`` rows, and the indexer's expanded table
    of ``max_decode_tokens`` rows), the dense (C128A) index rows (``max_num_batched_tokens x
    dense_width``), the indexer's prefill workspace and logits budget.
    """
    cfg = config
    if cfg.next_n > cfg.max_num_batched_tokens:
        raise ConfigError(
            f"next_n={cfg.next_n} exceeds max_num_batched_tokens={cfg.max_num_batched_tokens}: "
            "not even one decode request fits a step")
    floors = [("block_size", cfg.block_size), ("next_n", cfg.next_n)]
    if cfg.has_swa:
        floors.append(("swa_block_size", cfg.swa_block_size))
    for name, floor in floors:
        if cfg.max_model_len < floor:
            raise ConfigError(
                f"max_model_len={cfg.max_model_len} is below {name}={floor}: a request must "
                f"be able to hold at least one block and one decode step")
    if cfg.max_model_len > INT32_MAX:
        raise ConfigError(f"max_model_len={cfg.max_model_len} exceeds {INT32_MAX} (2**31 - 1): "
                          "positions and sequence lengths are int32")
    widths = [
        ("max_num_seqs x max_blocks_per_req (the block table)",
         cfg.max_num_seqs * cfg.max_blocks_per_req),
        ("max_decode_tokens x max_blocks_per_req (the indexer's expanded block table)",
         cfg.max_decode_tokens * cfg.max_blocks_per_req),
        ("max_num_batched_tokens x dense_width (the dense type's index rows)",
         cfg.max_num_batched_tokens * cfg.dense_width),
        ("max_prefill_workspace (compressed keys of one prefill chunk)",
         cfg.max_prefill_workspace),
        ("max_logits_bytes // 4 (fp32 logits of one prefill chunk)", cfg.max_logits_bytes // 4),
    ]
    if cfg.has_swa:
        widths.append(("max_num_seqs x max_swa_blocks_per_req (the SWA block table)",
                       cfg.max_num_seqs * cfg.max_swa_blocks_per_req))
    for what, value in widths:
        if value > INT32_MAX:
            raise ConfigError(f"{what} = {value} exceeds {INT32_MAX} (2**31 - 1), what the "
                              "kernels index with int32 offsets: lower max_model_len or the "
                              "capacities it multiplies")


def check_image_capacity(config: Capacities, family_has_images: bool) -> None:
    """Raise a :class:`ConfigError` unless the image-span capacities fit
    (``vllm-0.33-extras.md`` §3): both 0 for a text model; else ``max_image_tokens``
    (``mit``) on a family with image spans and a window, a span (at most ``mit + 3`` tokens,
    scheduled whole) fits one step, and ``1 <= max_image_spans <= max_num_batched_tokens``
    (a span holds a token at least)."""
    mit, spans = config.max_image_tokens, config.max_image_spans
    for name, value in (("max_image_tokens", mit), ("max_image_spans", spans)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{name}={value!r} must be an int >= 0")
    if mit == 0:
        if spans:
            raise ConfigError(f"max_image_spans={spans} needs max_image_tokens > 0 (a text "
                              "model carries no image spans)")
        return
    if not family_has_images or not config.has_swa:
        raise ConfigError(
            f"max_image_tokens={mit}: this architecture has no image spans (DeepSeek V4's "
            "vision variant has; V4.1's image tokens use the plain causal window)")
    if config.dcp_world_size > 1:
        raise ConfigError(f"max_image_tokens={mit} with dcp_world_size="
                          f"{config.dcp_world_size}: image spans are not served under decode "
                          "context parallelism")
    if mit + 3 > config.max_num_batched_tokens:
        raise ConfigError(
            f"max_image_tokens={mit} does not fit a step: a span of up to mit + 3 = {mit + 3} "
            f"tokens is scheduled whole, max_num_batched_tokens="
            f"{config.max_num_batched_tokens}")
    if not 1 <= spans <= config.max_num_batched_tokens:
        raise ConfigError(
            f"max_image_spans={spans} must be in [1, max_num_batched_tokens="
            f"{config.max_num_batched_tokens}] with max_image_tokens={mit}")
    width = config.max_num_batched_tokens * (config.sliding_window + mit)
    if width > INT32_MAX:
        raise ConfigError(
            f"max_num_batched_tokens x (sliding_window + max_image_tokens) = {width} exceeds "
            f"{INT32_MAX}: the prefill SWA rows are addressed with int32 offsets")
