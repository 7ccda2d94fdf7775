"""Prefill context parallelism (PCP): the configuration, validated at construction.

PCP adds ``pcp_size`` (P) ranks that each compute part of every prefill's query: a prefill
is cut into ``2P`` chunks and rank ``p`` computes chunks ``p`` and ``2P-1-p``
(``docs/spec/prefill-context-parallel.md`` §2). It combines with decode context
parallelism (DCP, ``dcp_size`` = D) only when the DCP group is empty, is the PCP group, or
spans the whole TP x PCP block (§1); every other combination the spec's table (§6) refuses
is a :class:`~staticattn.errors.ConfigError` here, raised before anything is built.

One refusal is lifted on purpose: the reference runs DeepSeek V4.1's PCP steps eagerly only
(``cudagraph_mode`` must be NONE, §4.2, §6); here V4.1's PCP ranks take the graph modes too
and capture their whole step, as V3.2's do. That is safe because every piece the reference
computes on the host has a fixed-capacity device formulation here (§8): the split, the
gathered layout and slots, and V4.1's ratio-2 ring links (sort and ``searchsorted`` over
``P * 2 * max_num_seqs`` rows), all written into arena views. ``GraphMode.NONE`` still runs
a rank eagerly.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from staticattn.errors import ConfigError
from staticattn.model import architecture

__all__ = ["GraphMode", "PCPConfig", "Speculation"]


class GraphMode(enum.Enum):
    """The engine's CUDA-graph mode (vLLM's ``cudagraph_mode``)."""

    NONE = "none"
    PIECEWISE = "piecewise"
    #: Full graphs for every batch, mixed ones included: refused under PCP.
    FULL = "full"
    FULL_DECODE_ONLY = "full_decode_only"
    FULL_AND_PIECEWISE = "full_and_piecewise"


class Speculation(enum.Enum):
    """The speculative-decoding method."""

    NONE = "none"
    #: Single-module MTP.
    MTP = "mtp"
    #: DSpark with an MLA draft.
    DSPARK = "dspark"
    #: Anything else (multi-module MTP, EAGLE, n-gram, ...): refused under PCP.
    OTHER = "other"


def _head_envelope(heads: int) -> int:
    """The fp8 FlashMLA-sparse decode kernel pads query heads to 64 or 128."""
    return 64 if heads <= 64 else 128


@dataclass(frozen=True)
class PCPConfig:
    """How a step is spread over the PCP (and DCP) ranks.

    Parameters
    ----------
    pcp_size : int
        P, the ranks a prefill's query is split over (``2P`` chunks).
    dcp_size : int
        D, the ranks a sequence's KV is sharded over; 1: replicated on every PCP rank.
    tp_size : int
        Tensor-parallel ranks; D may be ``TP * P`` (the DCP group spans TP x PCP).
    cp_kv_cache_interleave_size : int
        I, tokens dealt to a DCP rank at a time (matters only when D > 1).
    block_size : int
        KV block size (64 for V3.2's FlashMLA-sparse cache).
    architecture : str
        ``"deepseek_v32"``, ``"deepseek_v4"`` or ``"deepseek_v41"`` (see
        :func:`staticattn.model.architecture`).
    graph_mode : GraphMode
        ``NONE`` (the default) runs a rank's steps eagerly; any other accepted mode
        captures the rank's whole step, for V3.2 and V4.1 alike (the reference runs
        V4.1's PCP eagerly only; the module says why capturing it is safe).
    speculation : Speculation
    dcp_comm_backend, kv_cache_dtype : str
        Under D > 1 only ``"ag_rs"`` and ``"fp8_ds_mla"`` are accepted.
    num_q_heads : int
        Query heads of the model (128 for V3.2).
    max_num_seqs : int
        Requests per step; a rank holds at most ``2 * max_num_seqs`` rows.

    Raises
    ------
    ConfigError
        For every combination of §6 that vLLM refuses, with its gist.

    >>> PCPConfig(pcp_size=2, dcp_size=2).dcp_rank(1)
    1
    """

    pcp_size: int
    dcp_size: int = 1
    tp_size: int = 1
    cp_kv_cache_interleave_size: int = 1
    block_size: int = 64
    architecture: str = "deepseek_v32"
    graph_mode: GraphMode = GraphMode.NONE
    speculation: Speculation = Speculation.NONE
    dcp_comm_backend: str = "ag_rs"
    kv_cache_dtype: str = "fp8_ds_mla"
    num_q_heads: int = 128
    max_num_seqs: int = 256

    def __post_init__(self) -> None:
        for name in ("pcp_size", "dcp_size", "tp_size", "cp_kv_cache_interleave_size",
                     "block_size", "num_q_heads", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")
        architecture(self.architecture)
        self._check_parallel()
        if self.pcp_size > 1:
            self._check_model()
            self._check_runtime()

    @property
    def num_chunks(self) -> int:
        """K = 2P, the chunks of a split prefill."""
        return 2 * self.pcp_size

    @property
    def max_rows(self) -> int:
        """Rows a rank may hold: two chunks of every request."""
        return 2 * self.max_num_seqs

    def dcp_rank(self, pcp_rank: int, tp_rank: int = 0) -> int:
        """The DCP rank of PCP rank ``pcp_rank`` (§1): 0 without DCP, the PCP rank when
        D = P, ``tp_rank * P + pcp_rank`` when D = TP x P."""
        if not 0 <= pcp_rank < self.pcp_size or not 0 <= tp_rank < self.tp_size:
            raise ConfigError(f"pcp_rank={pcp_rank}, tp_rank={tp_rank} outside "
                              f"[0, {self.pcp_size}) x [0, {self.tp_size})")
        if self.dcp_size == 1:
            return 0
        return pcp_rank if self.dcp_size == self.pcp_size else tp_rank * self.pcp_size + pcp_rank

    def _check_parallel(self) -> None:
        P, D, tp, interleave = (self.pcp_size, self.dcp_size, self.tp_size,
                                self.cp_kv_cache_interleave_size)
        if P > 1 and D not in (1, P, tp * P):
            raise ConfigError(
                f"When PCP is enabled, DCP must be disabled, span the PCP axis, or span the full "
                f"TP x PCP axis: dcp_size={D}; valid DCP sizes are {sorted({1, P, tp * P})}")
        if P == 1 and tp % D:
            raise ConfigError(f"tp_size={tp} must be divisible by dcp_size={D}")
        if D > 1 and (interleave > self.block_size or self.block_size % interleave):
            raise ConfigError(
                f"Block_size({self.block_size}) should be greater than or equal to and "
                f"divisible by cp_kv_cache_interleave_size ({interleave})")

    def _check_model(self) -> None:
        P, D = self.pcp_size, self.dcp_size
        if self.architecture == "deepseek_v4":
            raise ConfigError("PCP requires attention backend support, but DeepSeek-V4's "
                              "sparse MLA, SWA and compressor backends do not support PCP")
        if self.architecture == "deepseek_v41" and (D != 1 or self.speculation
                                                    is not Speculation.NONE):
            raise ConfigError(
                "DeepSeek-V4.1 PCP currently requires PP=DP=DCP=1, with no microbatching, "
                f"speculative decoding, KV transfer, or MegaMoE (dcp_size={D}, "
                f"speculation={self.speculation.value})")
        if self.speculation is Speculation.OTHER:
            raise ConfigError("PCP only supports DSpark or single-module MTP speculative "
                              "decoding")
        if self.speculation is Speculation.DSPARK and D not in (1, P):
            raise ConfigError(f"PCP DSpark requires DCP=1 or DCP=PCP (dcp_size={D}, "
                              f"pcp_size={P})")

    def _check_runtime(self) -> None:
        # The reference refuses graphs for sparse-MLA PCP (D = 1) but on V3.2 and GLM; of
        # the architectures PCP serves here (V4 is refused above) V4.1 is the other, and
        # its graphs are served on purpose (the module says why).
        D, mode = self.dcp_size, self.graph_mode
        if mode is GraphMode.FULL:
            raise ConfigError("PCP supports full CUDA graphs for decode-only routines: use "
                              "FULL_DECODE_ONLY, FULL_AND_PIECEWISE, PIECEWISE, or NONE")
        if D == 1:
            return
        if self.dcp_comm_backend != "ag_rs":
            raise ConfigError(f"PCP + DCP requires dcp_comm_backend='ag_rs'; got "
                              f"{self.dcp_comm_backend!r}")
        if self.kv_cache_dtype != "fp8_ds_mla":
            raise ConfigError("PCP+DCP sparse prefill gathers the KV through the fp8_ds_mla "
                              f"upconvert; got a {self.kv_cache_dtype!r} cache")
        local = self.num_q_heads // self.tp_size
        gathered = local * (D // self.pcp_size)
        if _head_envelope(local) != _head_envelope(gathered):
            raise ConfigError(
                "DCP for FlashMLA sparse requires the local and DCP-gathered head counts to pad "
                f"to the same fp8 decode kernel envelope: {local} local heads pad to "
                f"{_head_envelope(local)}, {gathered} gathered to {_head_envelope(gathered)}")
