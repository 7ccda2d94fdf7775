"""The hazards users report in the reference engine and its peers, planted in toy steps.

Each shares one cause: something that depends on the step is frozen at capture. Every step
extends :class:`toy.ToyStep` (``out[t] = positions[t] + 2 * seq_len``) or stands beside it,
and takes one flag that turns the fault into its legitimate twin, which does the same work
graph-safely:

=====================  ========================================  ============================
hazard                 the fault                                 the twin
=====================  ========================================  ============================
a plan computed at     KV splits per request planned on the      the plan computed on the
warm-up                host, written by scalar fills             device from ``seq_lens``
a short-context        the top-k skipped when the host's         the bounded path, always
shortcut               longest sequence fits in it
a padded token count   the last token from                       from the device-side count,
                       ``batch.num_actual_tokens``               ``step_counts``
a row stride           a packed table viewed with the stride     packed and viewed with a
                       the engine used at capture                fixed stride (the capacity)
a per-call buffer      the engine's input handed in a new        one buffer, updated in
address                buffer every step (double-buffered)       place
=====================  ========================================  ============================

The row stride and the buffer address change between steps, in the engine: their
``update(i)`` is the checker's ``before_batch``.
"""

from __future__ import annotations

import torch

from helpers.toy import ToyStep
from staticattn.kernels.staging.stage_inputs import COUNT_TOKENS

#: Keys of one KV split (a split-KV decode kernel's plan: FlashMLA's tile scheduler,
#: FlashInfer's plan).
SPLIT = 64
#: Entries the sparse indexer selects per token: a context no longer than this needs none.
TOP_K = 256
#: Columns of the packed table's widest row.
MAX_COLS = 8


class HostPlanStep(ToyStep):
    """Adds each request's KV splits, ``ceil(L / SPLIT)``, to its tokens. The fault plans on
    the host from the staged lengths, as an eager engine plans before it launches; the graph
    replays the warm-up's plan. The twin (``on_device``) plans inside the step, on the
    device."""

    def __init__(self, cfg, dev, inputs, on_device: bool = False):
        super().__init__(cfg, dev)
        self.inputs, self.on_device = inputs, on_device
        self.plan = torch.zeros(cfg.max_num_seqs, dtype=torch.int32, device=dev)
        self.split_of_token = torch.zeros(cfg.max_num_batched_tokens, dtype=torch.int32,
                                          device=dev)

    def __call__(self, batch, md):
        out = super().__call__(batch, md)
        k, n = batch.num_reqs, batch.num_actual_tokens
        plan = self.plan[:k]
        if self.on_device:
            torch.add(batch.seq_lens, SPLIT - 1, out=plan)
            torch.div(plan, SPLIT, rounding_mode="floor", out=plan)
        else:
            for r, length in enumerate(self.inputs.host_seq_lens[:k]):
                plan[r].fill_(-(-int(length) // SPLIT))
        splits = self.split_of_token[:n]
        torch.index_select(plan, 0, batch.token_to_req, out=splits)
        return out.add_(splits)


class ShortcutStep(ToyStep):
    """Adds the entries each token's top-k selects, ``min(position + 1, TOP_K)``. The fault
    takes the short-context shortcut (every entry selected, the top-k skipped) when the
    host's longest sequence fits in ``TOP_K``: chosen at capture, with the warm-up's short
    sequences, and replayed for long ones. The twin (``bounded``) always bounds."""

    def __init__(self, cfg, dev, inputs, bounded: bool = False):
        super().__init__(cfg, dev)
        self.inputs, self.bounded = inputs, bounded
        self.selected = torch.zeros(cfg.max_num_batched_tokens, dtype=torch.int64,
                                    device=dev)

    def __call__(self, batch, md):
        out = super().__call__(batch, md)
        n = batch.num_actual_tokens
        selected = self.selected[:n]
        torch.add(batch.positions, 1, out=selected)
        longest = int(self.inputs.host_seq_lens[: batch.num_reqs].max())
        if self.bounded or longest > TOP_K:
            selected.clamp_(max=TOP_K)
        return out.add_(selected)


class LastTokenStep:
    """Marks the row a sampler reads, the step's last token (the reference engine's logits
    indices): ``is_last[t] = t == num_tokens - 1``. The fault takes the count from
    ``batch.num_actual_tokens``, which a graph fixes at its padded size; the twin
    (``device_count``) from the real count on the device, ``batch.step_counts``."""

    def __init__(self, cfg, dev, device_count: bool = False):
        t = cfg.max_num_batched_tokens
        self.device_count = device_count
        self.token_index = torch.arange(t, device=dev)
        self.last = torch.zeros(1, dtype=torch.int64, device=dev)
        self.is_last = torch.zeros(t, dtype=torch.bool, device=dev)

    def __call__(self, batch, md):
        n = batch.num_actual_tokens
        if self.device_count:
            real = batch.step_counts[COUNT_TOKENS:COUNT_TOKENS + 1]
            torch.sub(real, 1, out=self.last)
        else:
            self.last.fill_(n - 1)
        return torch.eq(self.token_index[:n], self.last, out=self.is_last[:n])


class PackedTableStep(ToyStep):
    """Adds column 0 of its token's row of a table the engine packs between steps into one
    persistent buffer, rows as wide as that step needs (a compact block table). The fault
    views the buffer with the row stride the engine reports when the step is called: at
    capture, the first step's. The twin (``fixed``) packs and views with ``MAX_COLS``."""

    def __init__(self, cfg, dev, fixed: bool = False):
        super().__init__(cfg, dev)
        self.fixed, self.rows = fixed, cfg.max_num_batched_tokens
        self.packed = torch.zeros(self.rows * MAX_COLS, dtype=torch.int64, device=dev)
        self.update(0)

    def update(self, i: int) -> None:
        """The engine packs step ``i``'s table: row ``r`` holds ``10 * r + i`` in every
        column, ``cols`` columns wide, in place."""
        cols = MAX_COLS if self.fixed else 2 + i % (MAX_COLS - 1)
        self.row_stride = cols
        flat = torch.arange(self.rows * cols, device=self.packed.device)
        self.packed[: flat.shape[0]].copy_(flat // cols * 10 + i)

    def __call__(self, batch, md):
        out = super().__call__(batch, md)
        n = batch.num_actual_tokens
        first_column = self.packed.as_strided((n,), (self.row_stride,))
        return out.add_(first_column)


class DoubleBufferedStep(ToyStep):
    """Multiplies by the engine's per-token scale, handed in a new buffer every step: the
    engine alternates between two (both stay alive, so no memory is freed under the graph).
    The twin (``in_place``) keeps one buffer and updates it in place."""

    def __init__(self, cfg, dev, in_place: bool = False):
        super().__init__(cfg, dev)
        self.in_place = in_place
        self.buffers = [torch.full((cfg.max_num_batched_tokens,), 2, dtype=torch.int64,
                                   device=dev) for _ in range(2)]
        self.scale = self.buffers[0]

    def update(self, i: int) -> None:
        """The engine's scale for step ``i``: ``i + 3`` for every token, in buffer ``i % 2``
        (the twin: in buffer 0)."""
        self.scale = self.buffers[0 if self.in_place else i % 2]
        self.scale.fill_(i + 3)

    def __call__(self, batch, md):
        out = super().__call__(batch, md)
        return out.mul_(self.scale[: batch.num_actual_tokens])
