"""The Arena: every buffer a captured step touches, at a fixed address, for life.

All device buffers are carved out of ONE aligned device allocation and all host-staging
buffers out of ONE host allocation (pinned when CUDA is present). After :meth:`Arena.allocate`
the arena is frozen: no buffer is ever re-created, resized or re-pointed, so a CUDA graph that
baked an address during capture reads the same buffer on every replay.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from staticattn.arena.buffers import BufferDecl, Where
from staticattn.arena.config import ArenaConfig, round_up
from staticattn.errors import ArenaError

__all__ = ["Arena", "ALIGNMENT", "BufferRecord"]

#: Byte alignment of every view: enough for 16-byte vector loads and for cache-line starts.
ALIGNMENT = 256


@dataclass(frozen=True, slots=True)
class BufferRecord:
    """Where a declared buffer landed: its block and byte offset inside it."""

    decl: BufferDecl
    offset: int


class Arena:
    """One device block + one host block, carved into named, frozen views.

    Parameters
    ----------
    config : ArenaConfig
        Decides the device; builders size their declarations from it.

    Examples
    --------
    >>> import torch
    >>> arena = Arena(ArenaConfig(device="cpu", max_model_len=1024))
    >>> arena.declare(BufferDecl("demo.lens", (8,), torch.int32))
    >>> arena.allocate()
    >>> arena["demo.lens"] is arena["demo.lens"]
    True
    """

    def __init__(self, config: ArenaConfig) -> None:
        self.config = config
        self.device = config.torch_device
        self._decls: dict[str, BufferDecl] = {}
        self._records: dict[str, BufferRecord] = {}
        self._views: dict[str, torch.Tensor] = {}
        self._blocks: dict[Where, torch.Tensor] = {}
        self._allocated = False

    # ------------------------------------------------------------------ declaring
    def declare(self, *decls: BufferDecl | Iterable[BufferDecl]) -> None:
        """Add buffer declarations; each may be a :class:`BufferDecl` or an iterable of them."""
        if self._allocated:
            raise ArenaError(
                "the arena is already allocated and frozen; declare every buffer before "
                "allocate() (builders declare theirs through buffers(config))"
            )
        flat: list[BufferDecl] = []
        for d in decls:
            flat.extend([d] if isinstance(d, BufferDecl) else list(d))
        seen = set(self._decls)
        for d in flat:
            if not isinstance(d, BufferDecl):
                raise ArenaError(f"{d!r} is not a BufferDecl")
            if d.name in seen:
                raise ArenaError(f"buffer {d.name!r} is declared twice; names must be unique")
            seen.add(d.name)
        for d in flat:
            self._decls[d.name] = d

    # ----------------------------------------------------------------- allocating
    def allocate(self) -> None:
        """Allocate one block per place and carve every view; freezes the arena."""
        if self._allocated:
            raise ArenaError("allocate() was already called; an arena is allocated once")
        offsets: dict[Where, int] = {"device": 0, "host": 0}
        for d in self._decls.values():
            off = offsets[d.where]
            self._records[d.name] = BufferRecord(d, off)
            offsets[d.where] = round_up(off + d.nbytes, ALIGNMENT)
        pin = self.device.type == "cuda"
        # At least one aligned chunk each, so an arena with no host buffers still has a
        # well-defined (if unused) host block.
        self._blocks["device"] = torch.empty(
            max(offsets["device"], ALIGNMENT), dtype=torch.uint8, device=self.device
        )
        self._blocks["host"] = torch.empty(
            max(offsets["host"], ALIGNMENT), dtype=torch.uint8, pin_memory=pin
        )
        for name, rec in self._records.items():
            d = rec.decl
            raw = self._blocks[d.where][rec.offset : rec.offset + d.nbytes]
            view = raw.view(d.dtype).view(d.shape)
            if d.fill is not None:
                view.fill_(d.fill)
            self._views[name] = view
        self._allocated = True

    # -------------------------------------------------------------------- access
    @property
    def allocated(self) -> bool:
        return self._allocated

    def __getitem__(self, name: str) -> torch.Tensor:
        if not self._allocated:
            raise ArenaError(f"buffer {name!r} requested before allocate()")
        try:
            return self._views[name]
        except KeyError:
            raise ArenaError(
                f"unknown buffer {name!r}; the arena holds {len(self._views)} buffers "
                f"(see arena.describe())"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._decls

    def names(self) -> list[str]:
        """Every declared buffer's name, in declaration order (e.g. ``"input.seq_lens"``)."""
        return list(self._decls)

    def decl(self, name: str) -> BufferDecl:
        """The declaration of buffer ``name`` (shape, dtype, where, fill); raises
        :class:`ArenaError` for an unknown name."""
        try:
            return self._decls[name]
        except KeyError:
            raise ArenaError(f"unknown buffer {name!r}") from None

    def block(self, where: Where) -> torch.Tensor:
        """The one raw allocation behind every view of ``where``: uint8 ``(nbytes,)``."""
        if not self._allocated:
            raise ArenaError("the arena is not allocated yet")
        return self._blocks[where]

    # ----------------------------------------------------------------- reporting
    def nbytes(self, where: Where | None = None) -> int:
        """Bytes of the allocation(s) (``where`` None: both)."""
        if not self._allocated:
            return 0
        places = ("device", "host") if where is None else (where,)
        return sum(self._blocks[w].numel() for w in places)

    def fingerprint(self) -> dict[str, tuple[int, tuple[int, ...], tuple[int, ...], str]]:
        """Every view's (address, shape, stride, dtype): equal fingerprints mean no buffer
        moved, changed shape or was re-pointed."""
        return {
            name: (v.data_ptr(), tuple(v.shape), tuple(v.stride()), str(v.dtype))
            for name, v in self._views.items()
        }

    def describe(self) -> str:
        """A table of every buffer (name, where, shape, dtype, bytes, offset) and the totals."""
        rows = [("name", "where", "shape", "dtype", "bytes", "offset")]
        ordered = sorted(self._records.items(), key=lambda kv: (kv[1].decl.where, kv[1].offset))
        for name, rec in ordered:
            d = rec.decl
            rows.append((name, d.where, "x".join(map(str, d.shape)) or "()",
                         str(d.dtype).removeprefix("torch."), f"{d.nbytes:,}", f"{rec.offset:,}"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) if i < 4 else c.rjust(w)
                           for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
        lines.insert(1, "-" * len(lines[0]))
        dev, host = self.nbytes("device"), self.nbytes("host")
        lines.append(
            f"total: {len(self._records)} buffers, device {_human(dev)} on {self.device}, "
            f"host staging {_human(host)}"
            + (" (pinned)" if self._allocated and self._blocks["host"].is_pinned() else "")
        )
        return "\n".join(lines)

    def __repr__(self) -> str:
        if not self._allocated:
            return f"Arena({len(self._decls)} buffers, declaring, device={self.device})"
        # The device block's address tells two allocated arenas apart.
        return (f"Arena({len(self._decls)} buffers, allocated, device={self.device}, "
                f"device block at 0x{self._blocks['device'].data_ptr():x})")


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)
