"""One dispatch mode around a capture that sees every aten op of the captured body.

:class:`CaptureWatch` records, per op (Triton launches do not pass through aten and are not
seen; the replay probes cover them):

* ``allocations`` -- outputs owning storage none of the op's inputs had: memory taken from
  the graph pool (``torch.empty``, ``a + b`` without ``out=``, a library's result...), with
  a weak reference that tells later whether the memory was freed;
* ``host_reads`` -- a CPU tensor outside the arena's staging handed to an op on the GPU, or a
  device->host copy: what the graph would read from (or write to) host memory is baked in
  at capture. 0-dim CPU tensors are values, like Python scalars, and are not counted;
* ``rng`` -- ops that draw random numbers, and whether from the default CUDA generator (the
  one ``CUDAGraph.replay`` advances);
* ``arena_writes`` -- ops of the step (``phase == "step"``) that mutate arena storage;
* ``wrong_stream`` -- GPU ops or collectives issued while the current stream is not the one
  being captured;
* ``external`` -- weak references to every device tensor read that lives neither in the
  arena nor in memory allocated during this capture (weights, caches, owned buffers): a
  graph that outlives one of them reads freed memory;
* ``calls`` -- every op as a :class:`~staticattn.checks.frozen.Call` (its arguments, where
  each tensor lives, the line that issued it): what :func:`~staticattn.checks.frozen.
  frozen_cause` compares between the capture and an eager run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from staticattn.checks.frozen import Call, Seen, call_of
from staticattn.graphs.graph_launch import cuda_index

__all__ = ["ArenaIndex", "CaptureWatch", "TensorRef"]

_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional")


class ArenaIndex:
    """Which storage is the arena's, and the name of the view an address falls in.

    Built from ``(name, tensor)`` pairs of views and the blocks they are carved from; a
    tensor belongs to the arena when its storage is one of the blocks' storages.
    """

    def __init__(self, blocks: list[torch.Tensor], views: dict[str, torch.Tensor]) -> None:
        self._storages = {b.untyped_storage().data_ptr() for b in blocks}
        self._spans = sorted((v.data_ptr(), v.data_ptr() + v.numel() * v.element_size(), n)
                             for n, v in views.items())

    @classmethod
    def of(cls, arena) -> ArenaIndex:
        views = {n: arena[n] for n in arena.names()}
        return cls([arena.block("device"), arena.block("host")], views)

    def holds(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s storage (any dtype and shape) is one of the arena's blocks."""
        return _storage_ptr(t) in self._storages

    def name(self, t: torch.Tensor) -> str:
        """The arena views ``t`` (any dtype and shape) overlaps, e.g. ``"input.seq_lens"``."""
        lo, hi = t.data_ptr(), t.data_ptr() + max(t.numel(), 1) * t.element_size()
        names = [n for a, b, n in self._spans if a < hi and lo < b]
        return ", ".join(names) or "the arena (between views)"


@dataclass(slots=True)
class TensorRef:
    """A tensor seen by the watch: the op, shape and dtype it was seen with, its storage's
    address and size, and a weak reference to the storage (``expired()`` once freed)."""

    op: str
    phase: str
    shape: tuple[int, ...]
    dtype: str
    ptr: int
    nbytes: int
    ref: StorageWeakRef

    @classmethod
    def of(cls, t: torch.Tensor, op: str, phase: str) -> TensorRef:
        s = t.untyped_storage()
        return cls(op, phase, tuple(t.shape), str(t.dtype).removeprefix("torch."),
                   s.data_ptr(), s.nbytes(), StorageWeakRef(s))

    def expired(self) -> bool:
        """Whether the storage seen has been freed since."""
        return self.ref.expired()

    def describe(self) -> str:
        """The op, shape and dtype the tensor was seen with, for a finding's message."""
        return f"{self.dtype}{list(self.shape)} from '{self.op}' ({self.phase})"



@dataclass
class CaptureWatch(TorchDispatchMode):
    """Records what the captured body does (see the module docstring).

    Parameters
    ----------
    arena : ArenaIndex, optional
        Tells arena storage apart (host reads of the staging are allowed; writes of the
        step into it are not).
    device_type : str
        The graph's device ("cuda"); "cpu" lets the bookkeeping be tested without a GPU
        (no stream check, no host reads).
    """

    arena: ArenaIndex | None = None
    device_type: str = "cuda"
    phase: str = "build"
    ops: list[str] = field(default_factory=list)
    fresh: dict[str, int] = field(default_factory=dict)
    allocations: list[TensorRef] = field(default_factory=list)
    host_reads: list[str] = field(default_factory=list)
    rng: list[tuple[str, bool]] = field(default_factory=list)
    arena_writes: list[str] = field(default_factory=list)
    wrong_stream: list[str] = field(default_factory=list)
    external: dict[int, TensorRef] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()
        #: Storage address -> index of the allocation (in this run) that owns it now.
        self._fresh_ptrs: dict[int, int] = {}

    @property
    def last_op(self) -> str | None:
        return self.ops[-1] if self.ops else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket.__name__)
        collective = func.namespace in _COLLECTIVE_NAMESPACES
        self.ops.append(f"{func.namespace}.{name}" if collective else name)
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        # Recorded before the op runs: a pageable copy or a sync raises inside it.
        if collective or self._on_device(tensors, kwargs):
            self._inspect(func, name, collective, tensors, args, kwargs)
        known = {_storage_ptr(t) for t in tensors if _has_storage(t)}
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if (isinstance(t, torch.Tensor) and t.device.type == self.device_type
                    and _has_storage(t) and _storage_ptr(t) not in known):
                self.fresh[name] = self.fresh.get(name, 0) + 1
                self.allocations.append(TensorRef.of(t, name, self.phase))
                self._fresh_ptrs[_storage_ptr(t)] = len(self.allocations)
        arguments = [(arg.name, value) for arg, value in _arguments(func, args, kwargs)]
        self.calls.append(call_of(name, self.phase, arguments, out, self._seen))
        return out

    def _seen(self, t: torch.Tensor) -> Seen:
        """Where ``t`` lives, for a :class:`~staticattn.checks.frozen.Call`: allocations of
        this run by their index, so that two runs compare whatever addresses the allocator
        gave them."""
        dtype, shape = str(t.dtype).removeprefix("torch."), tuple(t.shape)
        if t.layout != torch.strided or not _has_storage(t):
            return Seen("external", None, dtype, shape, ())
        stride = t.stride()
        if self.arena is not None and self.arena.holds(t):
            return Seen("arena", t.data_ptr(), dtype, shape, stride)
        if t.device.type != self.device_type:
            return Seen("host", t.item() if t.dim() == 0 else None, dtype, shape, stride)
        index = self._fresh_ptrs.get(_storage_ptr(t))
        if index is not None:
            return Seen("fresh", (index, t.storage_offset()), dtype, shape, stride)
        return Seen("external", t.data_ptr(), dtype, shape, stride)

    def _on_device(self, tensors: list[torch.Tensor], kwargs: dict) -> bool:
        device = kwargs.get("device")
        return (any(t.device.type == self.device_type for t in tensors)
                or (device is not None and torch.device(device).type == self.device_type))

    def _inspect(self, func, name: str, collective: bool, tensors, args, kwargs) -> None:
        if self.device_type == "cuda" and not torch.cuda.is_current_stream_capturing():
            what = "collective" if collective else "op"
            self.wrong_stream.append(f"{what} '{func.namespace}.{name}' ({self.phase})")
        if self.device_type != "cpu":
            self._host_reads(name, tensors, kwargs)
        if torch.Tag.nondeterministic_seeded in func.tags:
            gen = kwargs.get("generator")
            self.rng.append((name, gen is None or _is_default_generator(gen)))
        if self.phase == "step" and self.arena is not None:
            for t in _mutated(func, args, kwargs):
                if self.arena.holds(t):
                    self.arena_writes.append(f"'{name}' writes {self.arena.name(t)}")
        for t in tensors:
            if (t.device.type == self.device_type and _has_storage(t)
                    and not (self.arena is not None and self.arena.holds(t))):
                ptr = _storage_ptr(t)
                if ptr not in self._fresh_ptrs and ptr not in self.external:
                    self.external[ptr] = TensorRef.of(t, name, self.phase)

    def _host_reads(self, name: str, tensors, kwargs) -> None:
        for t in tensors:
            if t.device.type != "cpu" or t.dim() == 0:
                continue
            if self.arena is not None and self.arena.holds(t):
                continue  # the staging: read in place, guarded by the staging event
            kind = "pinned" if t.is_pinned() else "pageable"
            self.host_reads.append(f"'{name}' reads a {kind} host tensor "
                                   f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}")
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cpu":
            self.host_reads.append(f"'{name}' copies device memory to the host")


def _has_storage(t: torch.Tensor) -> bool:
    try:
        return t.untyped_storage().nbytes() > 0
    except (RuntimeError, NotImplementedError):  # tensors without storage (meta, sparse)
        return False


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _arguments(func, args, kwargs):
    """``(schema argument, value)`` of every argument an op was given."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.name in kwargs:
            yield arg, kwargs[arg.name]
        elif i < len(args) and not arg.kwarg_only:
            yield arg, args[i]


def _mutated(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors an op writes: its arguments the schema marks as written (in-place
    ``self``, ``out=``)."""
    found = []
    for arg, value in _arguments(func, args, kwargs):
        if arg.alias_info is not None and arg.alias_info.is_write:
            found += [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
    return found


def _is_default_generator(gen) -> bool:
    if gen.device.type != "cuda":
        return False
    return gen is torch.cuda.default_generators[cuda_index(gen.device)]
