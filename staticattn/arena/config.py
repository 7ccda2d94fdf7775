"""Capacities of one arena: everything that fixes a buffer's shape.

An :class:`ArenaConfig` is frozen and validated at construction; every buffer the builders
declare is sized from it, so nothing has to grow at run time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from staticattn.errors import ConfigError

__all__ = ["ArenaConfig", "SUPPORTED_COMPRESS_RATIOS", "cdiv", "round_up"]

#: Compress ratios of DeepSeek V4 layer types: 1 = sliding window only, 4 = C4A, 128 = C128A.
SUPPORTED_COMPRESS_RATIOS = (1, 4, 128)

#: Query lengths the paged-MQA-logits kernels take natively on Hopper (larger next_n flattens).
NATIVE_NEXT_N = (1, 2)


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    """``a`` rounded up to a multiple of ``b``."""
    return cdiv(a, b) * b


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True, slots=True)
class ArenaConfig:
    """Frozen, validated capacities of an arena.

    Parameters
    ----------
    max_num_seqs : int
        Requests per step, at most.
    max_num_batched_tokens : int
        Tokens per step (all requests together), at most.
    max_model_len : int
        Longest sequence (context + scheduled tokens) a request may reach.
    block_size : int
        Uncompressed tokens per KV block of the main cache group (indexer and compressed
        caches): 64 for DeepSeek V3.2, 256 for DeepSeek V4.
    num_speculative_tokens : int
        MTP draft tokens per decode step; ``next_n = 1 + num_speculative_tokens``.
    compress_ratios : tuple of int
        The model's per-layer compress ratios (``(1,)`` for V3.2, ``(1, 4, 128)`` for V4).
    index_compress_ratio : int
        Compress ratio of the indexer's K cache (1 for V3.2, 4 for V4); its storage block
        holds ``block_size // index_compress_ratio`` entries.
    sliding_window : int or None
        Window of the sparse sliding-window attention (128 for V4); None when the model has
        no SWA layers.
    swa_block_size : int
        Tokens per block of the SWA cache group (64 for V4).
    index_topk : int
        Keys the indexer keeps per query token.
    max_prefill_workspace : int or None
        Compressed keys one indexer prefill chunk may gather; default ``40 * max_model_len``.
    max_logits_bytes : int
        Logits budget of one indexer prefill chunk (fp32), default 512 MiB.
    dcp_world_size : int
        Decode-context-parallel ranks the main cache group's KV is sharded over (1: none).
        Each rank owns its arena; its main block table holds the rank's local blocks, one
        column per ``block_size * dcp_world_size`` tokens. The SWA group and the C128A
        entries are replicated on every rank (see :mod:`staticattn.builders.swa.builder`).
    dcp_rank : int
        This arena's rank in ``[0, dcp_world_size)``: a static int of the rank's arena and
        graphs, never read from the device.
    cp_kv_cache_interleave_size : int
        ``I``: tokens dealt to a rank at a time; positions ``[k I, (k + 1) I)`` live on rank
        ``k % dcp_world_size``. With ``dcp_world_size > 1`` it must divide ``block_size`` and
        be a multiple of every sharded compress ratio (the indexer's and C4A's, not C128A's:
        C128A is replicated), so no compressed entry straddles two ranks.
    device : str
        Where the arena lives: ``"cuda"``, ``"cuda:1"``, ``"cpu"``. Default: CUDA if present.
    num_sms : int or None
        Multiprocessors the paged-MQA-logits schedule is split over; default: the device's
        count on CUDA, 132 (an H100/H200) elsewhere.
    use_flattening : bool or None
        Whether the indexer flattens MTP decodes into single-token rows; default: the
        Hopper rule, flatten iff ``next_n`` is not in (1, 2).
    kernel_backend : {"auto", "torch", "triton"}
        "auto" runs Triton kernels on CUDA and plain-torch kernels elsewhere. "triton" on a
        CPU needs ``TRITON_INTERPRET=1`` set before Triton is imported.

    Examples
    --------
    >>> cfg = ArenaConfig.deepseek_v4(max_model_len=8192, device="cpu")
    >>> cfg.next_n, cfg.storage_block_size, cfg.max_decode_tokens
    (2, 64, 512)
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 163840
    block_size: int = 64
    num_speculative_tokens: int = 0
    compress_ratios: tuple[int, ...] = (1,)
    index_compress_ratio: int = 1
    sliding_window: int | None = None
    swa_block_size: int = 64
    index_topk: int = 2048
    max_prefill_workspace: int | None = None
    max_logits_bytes: int = 512 * 1024 * 1024
    dcp_world_size: int = 1
    dcp_rank: int = 0
    cp_kv_cache_interleave_size: int = 1
    device: str = field(default_factory=_default_device)
    num_sms: int | None = None
    use_flattening: bool | None = None
    kernel_backend: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "compress_ratios", tuple(int(r) for r in self.compress_ratios))
        self._check_positive()
        self._check_ratios()
        self._check_dcp()
        self._check_device()
        if self.max_prefill_workspace is None:
            object.__setattr__(self, "max_prefill_workspace", 40 * self.max_model_len)
        if self.num_sms is None:
            object.__setattr__(self, "num_sms", self._device_sm_count())
        if self.use_flattening is None:
            object.__setattr__(self, "use_flattening", self.next_n not in NATIVE_NEXT_N)
        if self.kernel_backend not in ("auto", "torch", "triton"):
            raise ConfigError(
                f"kernel_backend={self.kernel_backend!r} is not one of 'auto', 'torch', 'triton'"
            )
        if not self.use_flattening and self.next_n not in NATIVE_NEXT_N:
            raise ConfigError(
                f"use_flattening=False needs next_n in {NATIVE_NEXT_N} (the natively supported "
                f"query lengths), got next_n={self.next_n}"
            )
        if self.next_n > self.max_num_batched_tokens:
            raise ConfigError(
                f"next_n={self.next_n} exceeds max_num_batched_tokens="
                f"{self.max_num_batched_tokens}: not even one decode request fits a step"
            )

    def _check_positive(self) -> None:
        for name in (
            "max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size",
            "swa_block_size", "index_topk", "max_logits_bytes", "dcp_world_size",
            "cp_kv_cache_interleave_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name}={value!r} must be a positive int")
        if self.num_speculative_tokens < 0 or self.num_speculative_tokens > 15:
            raise ConfigError(
                f"num_speculative_tokens={self.num_speculative_tokens} must be in [0, 15]"
            )
        if self.max_prefill_workspace is not None and self.max_prefill_workspace < 1:
            raise ConfigError(
                f"max_prefill_workspace={self.max_prefill_workspace} must be a positive int"
            )
        if self.num_sms is not None and self.num_sms < 1:
            raise ConfigError(f"num_sms={self.num_sms} must be a positive int")
        if self.max_logits_bytes < 4:
            raise ConfigError(
                f"max_logits_bytes={self.max_logits_bytes} must hold at least one fp32 logit (4)"
            )

    def _check_ratios(self) -> None:
        if not self.compress_ratios:
            raise ConfigError("compress_ratios is empty; use (1,) for a model without compression")
        for r in self.compress_ratios:
            if r not in SUPPORTED_COMPRESS_RATIOS:
                raise ConfigError(
                    f"compress ratio {r} is not supported; the layer types are "
                    f"{SUPPORTED_COMPRESS_RATIOS} (SWA-only, C4A, C128A)"
                )
            if self.block_size % r:
                raise ConfigError(
                    f"block_size={self.block_size} is not a multiple of compress ratio {r}: "
                    "a compressed storage block must hold a whole number of entries"
                )
        if self.index_compress_ratio not in SUPPORTED_COMPRESS_RATIOS[:2]:
            raise ConfigError(
                f"index_compress_ratio={self.index_compress_ratio} must be 1 or 4"
            )
        if self.block_size % self.index_compress_ratio:
            raise ConfigError(
                f"block_size={self.block_size} is not a multiple of index_compress_ratio="
                f"{self.index_compress_ratio}"
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ConfigError(f"sliding_window={self.sliding_window} must be >= 1 or None")
        if self.sliding_window is None and any(r > 1 for r in self.compress_ratios):
            raise ConfigError(
                f"compress_ratios={self.compress_ratios} describe DeepSeek V4 layers, which "
                "attend a sliding window: set sliding_window"
            )

    def _check_dcp(self) -> None:
        world, rank = self.dcp_world_size, self.dcp_rank
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world:
            raise ConfigError(f"dcp_rank={rank!r} is outside [0, dcp_world_size={world})")
        if world == 1:
            return
        interleave = self.cp_kv_cache_interleave_size
        if self.block_size % interleave:
            raise ConfigError(
                f"cp_kv_cache_interleave_size={interleave} does not divide block_size="
                f"{self.block_size}: a rank's local block must hold whole interleave groups"
            )
        for r in self.dcp_sharded_ratios:
            if interleave % r:
                raise ConfigError(
                    f"cp_kv_cache_interleave_size={interleave} is not a multiple of the "
                    f"sharded compress ratio {r}: a compressed entry would straddle two ranks"
                )

    def _check_device(self) -> None:
        try:
            dev = torch.device(self.device)
        except (RuntimeError, TypeError) as exc:
            raise ConfigError(f"device={self.device!r} is not a torch device: {exc}") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device={self.device!r} asks for CUDA, but CUDA is not available")
        if dev.type not in ("cuda", "cpu"):
            raise ConfigError(f"device={self.device!r}: only 'cuda' and 'cpu' are supported")

    def _device_sm_count(self) -> int:
        dev = self.torch_device
        if dev.type == "cuda":
            return torch.cuda.get_device_properties(dev).multi_processor_count
        return 132

    # ----------------------------------------------------------------- derived sizes
    @property
    def torch_device(self) -> torch.device:
        dev = torch.device(self.device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        return dev

    @property
    def next_n(self) -> int:
        """Query length of a uniform (MTP) decode request: ``1 + num_speculative_tokens``."""
        return 1 + self.num_speculative_tokens

    @property
    def decode_threshold(self) -> int:
        """The one decode threshold every builder and the reorder use (= ``next_n``)."""
        return self.next_n

    @property
    def storage_block_size(self) -> int:
        """Compressed indexer-K entries per block: ``block_size // index_compress_ratio``."""
        return self.block_size // self.index_compress_ratio

    @property
    def max_blocks_per_req(self) -> int:
        """Columns of the main block table: under DCP a rank's local blocks, one per
        ``block_size * dcp_world_size`` tokens."""
        return cdiv(self.max_model_len, self.block_size * self.dcp_world_size)

    @property
    def max_swa_blocks_per_req(self) -> int:
        """Columns of the SWA block table (replicated under DCP: every token's block)."""
        return cdiv(self.max_model_len, self.swa_block_size)

    @property
    def dcp_sharded_ratios(self) -> tuple[int, ...]:
        """Compress ratios of the caches DCP shards, which the interleave must respect: the
        indexer's and C4A's (C128A and the SWA window are replicated)."""
        return tuple(sorted({self.index_compress_ratio} | {r for r in self.compress_ratios
                                                           if 1 < r < 128}))

    @property
    def dcp_compressed_interleave(self) -> int:
        """The interleave of the indexer's compressed entries: ``I // index_compress_ratio``
        (entry ``c`` covers tokens ``[cR, (c + 1) R)``, all in interleave group ``cR // I``)."""
        return max(self.cp_kv_cache_interleave_size // self.index_compress_ratio, 1)

    @property
    def max_decode_tokens(self) -> int:
        """Decode tokens one step can hold: each decode request has at most ``next_n``."""
        return min(self.max_num_batched_tokens, self.max_num_seqs * self.next_n)

    @property
    def c128a_max_compressed(self) -> int:
        """Width of a C128A top-k row: ``round_up(cdiv(max_model_len, 128), 128)``."""
        return round_up(cdiv(self.max_model_len, 128), 128)

    @property
    def has_swa(self) -> bool:
        return self.sliding_window is not None

    def replace(self, **changes) -> ArenaConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # ----------------------------------------------------------------------- presets
    @classmethod
    def deepseek_v32(cls, **overrides) -> ArenaConfig:
        """DeepSeek-V3.2-like: 160K context, 64-token blocks, no compression, top-2048."""
        base = dict(
            max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=163840,
            block_size=64, num_speculative_tokens=0, compress_ratios=(1,),
            index_compress_ratio=1, sliding_window=None, index_topk=2048,
        )
        base.update(overrides)
        return cls(**base)

    @classmethod
    def deepseek_v4(cls, **overrides) -> ArenaConfig:
        """DeepSeek-V4-like: 1M context, 256-token compressed blocks (C4A indexer storage
        64 entries per block), SWA window 128 on 64-token blocks, layer types SWA/C4A/C128A,
        one MTP draft token (next_n = 2), top-512."""
        base = dict(
            max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=1048576,
            block_size=256, num_speculative_tokens=1, compress_ratios=(1, 4, 128),
            index_compress_ratio=4, sliding_window=128, swa_block_size=64, index_topk=512,
        )
        base.update(overrides)
        return cls(**base)

    @classmethod
    def preset(cls, name: str, **overrides) -> ArenaConfig:
        """A named preset: ``"deepseek-v3.2"`` or ``"deepseek-v4"``."""
        presets = {"deepseek-v3.2": cls.deepseek_v32, "deepseek-v4": cls.deepseek_v4}
        if name not in presets:
            raise ConfigError(f"unknown preset {name!r}; known: {sorted(presets)}")
        return presets[name](**overrides)
