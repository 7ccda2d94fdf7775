"""Soak test on a GPU: many replays with random batch sizes and contents.

Uniform decode steps (default) or, with ``--mix``, steps of any composition (decodes of
unequal lengths, prefill chunks, fresh prompts) that replay through token buckets. Every
replay is checked on its lengths (SWA, C128A and indexer lengths of every token against a
numpy computation from the host inputs); a sample (--sample, default 1 in 100) is also run
through the reference eager build and compared bit for bit through the gather consumer.
Reports mismatches, device memory before/after, the arena fingerprint and replays per second.
With ``--every-kind --preset P`` the steps take every graph kind of preset P in turn
(:data:`KINDS`): a decode size, a token bucket through ``run()`` and through the in-place
``begin_step()``/``launch(k, t)``, a bucket of device-decided lengths
(:class:`DeviceLengthSteps`, the step's boundaries written by a producer captured in the
graph), a context bucket (:class:`ContextGraphs`) and, for DeepSeek V4.1-Flash, the DSpark
draft step's decode graphs. The graphs hold the preset's default builders (V4.1: with the
decoder-replay builder) and :class:`SoakStep`. V4.1's steps with prefills carry replay
starts (bounded replay); the vision preset's carry image spans, their count drawn anew each
step (rising and falling). Every replay's lengths are checked against numpy
(:func:`expected_columns`); one in ``--sample`` of each kind's replays is compared bit for
bit with the eager reference builds of the same step; mismatches are counted per kind.
``--device cpu`` runs the same steps at small capacities, each graph emulated (its body run
eagerly; ``TRITON_INTERPRET=1 ... --backend triton`` for the Triton kernels).

    python scripts/soak.py --replays 100000 --json soak.json
    python scripts/soak.py --mix --replays 100000 --max-model-len 65536 --json soak_mix.json
    python scripts/soak.py --every-kind --preset deepseek-v4.1-flash --replays 100000 \
        --sample 20 --max-model-len 65536 --json soak_v41.json
    python scripts/soak.py --every-kind --preset deepseek-v4-vision --device cpu --replays 500
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from staticattn.arena import ArenaConfig
from staticattn.bench.random_batches import (
    NUM_KV_BLOCKS,
    DecodeStream,
    DeviceStepSource,
    RandomStep,
)
from staticattn.builders import (
    DecoderReplayBuilder,
    DraftSWAMetadataBuilder,
    default_builders,
    make_arena,
)
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.builders.swa.declarations import prefill_swa_width
from staticattn.builders.swa.draft import draft_swa_width
from staticattn.consumers.emulated.gather import GatherConsumer
from staticattn.graphs import (
    CapturedGraph,
    ContextGraphs,
    DeviceLengthSteps,
    GraphKind,
    GraphManager,
    GraphOptions,
    StagingGuard,
)
from staticattn.graphs.sizes import default_mixed_buckets


def expected_lengths(cfg: ArenaConfig, q: np.ndarray, s: np.ndarray, slots: np.ndarray,
                     size: int) -> dict[str, np.ndarray]:
    """Per token of the padded step: SWA, C128A and indexer decode lengths."""
    n = cfg.next_n
    j = np.tile(np.arange(n), q.shape[0])
    L = np.repeat(s.astype(np.int64), n)
    p = L - n + j
    valid = slots >= 0
    pad = size - p.shape[0]
    swa = np.where(valid, np.minimum(p + 1, cfg.sliding_window), 0)
    c128 = np.where(valid, np.minimum((p + 1) // 128, cfg.dense_width), 0)
    index = np.maximum(L - n + 1 + j, 0) // cfg.index_compress_ratio
    return {k: np.concatenate([v, np.zeros(pad, dtype=np.int64)])
            for k, v in (("swa", swa), ("dense", c128), ("indexer", index))}


def expected_mixed_lengths(cfg: ArenaConfig, q: np.ndarray, s: np.ndarray,
                           slots: np.ndarray, size: int) -> dict[str, np.ndarray]:
    """A token bucket's per-row lengths: SWA, C128A and indexer over the decode rows (real
    decode tokens, then 0), dense over the prefill rows (real prefill tokens, then 0)."""
    n = cfg.next_n
    first_long = int(np.argmax(q > n)) if (q > n).any() else q.shape[0]
    td = int(q[:first_long].sum())
    starts = np.repeat(np.cumsum(q) - q, q)
    p = np.repeat(s.astype(np.int64) - q, q) + np.arange(int(q.sum())) - starts
    valid = slots >= 0
    rows = min(size, cfg.max_decode_tokens)

    def pad(values: np.ndarray, extent: int) -> np.ndarray:
        return np.concatenate([values, np.zeros(extent - values.shape[0], dtype=np.int64)])

    c128 = np.minimum((p + 1) // 128, cfg.dense_width)
    return {
        "swa": pad(np.where(valid, np.minimum(p + 1, cfg.sliding_window), 0)[:td], rows),
        "dense": pad(np.where(valid, c128, 0)[:td], rows),
        "dense_prefill": pad(c128[td:], size),
        "indexer": pad(((p + 1) // cfg.index_compress_ratio)[:td], rows),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replays", type=int, default=100_000)
    ap.add_argument("--sample", type=int, default=100, help="1 in N replays compared to eager")
    ap.add_argument("--max-model-len", type=int, default=1 << 20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mix", action="store_true", help="steps of any composition")
    ap.add_argument("--every-kind", action="store_true",
                    help="steps over every graph kind of --preset, in turn")
    ap.add_argument("--preset", choices=PRESETS, default="deepseek-v4",
                    help="--every-kind: the preset soaked")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="--every-kind: cpu runs small capacities, graphs emulated")
    ap.add_argument("--backend", choices=["torch", "triton"], default=None,
                    help="--every-kind: the kernels (default: the config's)")
    ap.add_argument("--max-requests", type=int, default=256,
                    help="--every-kind: the largest decode step (requests)")
    ap.add_argument("--num-kv-blocks", type=int, default=NUM_KV_BLOCKS)
    ap.add_argument("--staging-guard", choices=["staging", "step"], default="staging",
                    help="where the graphs record the staging event (GraphManager)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.every_kind:
        return every_kind(args)

    cfg = ArenaConfig.deepseek_v4(max_model_len=args.max_model_len)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    consumer = GatherConsumer(cfg)
    rng = np.random.default_rng(args.seed)
    report = {"replays": 0, "mixed_replays": 0, "eager_compared": 0,
              "length_mismatches": 0, "eager_mismatches": 0}
    replayed = eager = None
    report["staging_guard"] = args.staging_guard
    options = GraphOptions(progress=False, staging_guard=StagingGuard(args.staging_guard),
                           num_kv_blocks=NUM_KV_BLOCKS)
    with GraphManager(arena, inputs, builders, consumer, options) as gm:
        gm.capture(buckets=None if args.mix else ())
        sizes = gm.capture_sizes
        stream = DecodeStream(inputs, rng, max_seq_len=args.max_model_len)
        fingerprint = arena.fingerprint()
        torch.cuda.synchronize()
        mem0 = torch.cuda.memory_allocated()
        reserved0 = torch.cuda.memory_reserved()
        t0 = time.perf_counter()
        for i in range(args.replays):
            if args.mix:
                st = stream.next_mixed(int(rng.choice(gm.buckets)))
            else:
                st = stream.next(int(rng.integers(1, sizes[-1] // cfg.next_n + 1)))
            res = gm.run(st.query_lens, st.seq_lens, st.slot_mapping)
            assert res.mode == "graph", res
            g = gm.graph_for(res.graph_size, res.graph_kind)
            swa_md, index_md = g.metadata["swa"], g.metadata["indexer"]
            got = {
                "swa": swa_md.decode_swa_lens,
                "dense": swa_md.dense_decode_lens,
                "indexer": index_md.decode.seq_lens.reshape(-1),
            }
            if g.kind is GraphKind.MIXED:
                exp = expected_mixed_lengths(cfg, st.query_lens, st.seq_lens, st.slot_mapping,
                                             g.size)
                # The dense prefill lengths of every chunk, each copied before the next
                # chunk overwrites the workspace.
                chunks = swa_md.dense_prefill
                got["dense_prefill"] = torch.cat([chunks.write(c)[1].clone()
                                                  for c in range(chunks.num_chunks)])
                report["mixed_replays"] += 1
            else:
                exp = expected_lengths(cfg, st.query_lens, st.seq_lens, st.slot_mapping,
                                       g.size)
            for key, t in got.items():
                if not np.array_equal(t.cpu().numpy(), exp[key]):
                    report["length_mismatches"] += 1
                    print(f"replay {i}: {key} lengths differ", file=sys.stderr)
            if i % args.sample == 0:
                replayed = res.outputs.clone()
                eager = gm.run_eager(st.query_lens, st.seq_lens, st.slot_mapping)
                report["eager_compared"] += 1
                report["eager_mismatches"] += int(not torch.equal(replayed, eager))
            report["replays"] += 1
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        # Drop the loop's last references (sampled clones, metadata reads) before measuring.
        del res, replayed, eager, got, exp
        gc.collect()
        report.update(
            seconds=elapsed, replays_per_s=report["replays"] / elapsed,
            memory_allocated_delta=torch.cuda.memory_allocated() - mem0,
            memory_reserved_delta=torch.cuda.memory_reserved() - reserved0,
            fingerprint_unchanged=arena.fingerprint() == fingerprint,
            device=torch.cuda.get_device_name(), sizes=f"{sizes[0]}..{sizes[-1]}",
        )
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    ok = (report["length_mismatches"] == 0 and report["eager_mismatches"] == 0
          and report["fingerprint_unchanged"] and report["memory_allocated_delta"] == 0)
    return 0 if ok else 1


PRESETS = ("deepseek-v3.2", "deepseek-v4", "deepseek-v4.1-flash", "deepseek-v4-vision")
#: A CPU run's capacities (graphs emulated: each "replay" runs the graph's body eagerly).
SMALL = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=2048,
             max_prefill_workspace=2048, max_logits_bytes=1 << 20, num_sms=8)
#: A CPU run's window on the presets with one: prefills trimmed by decoder replay.
SMALL_WINDOW = dict(sliding_window=16)
SMALL_VISION = dict(max_image_tokens=16, max_image_spans=4)


def soak_config(preset: str, device: str, max_model_len: int, backend: str | None):
    """The preset's config: its own capacities on a GPU (``max_model_len`` set), small ones
    on a CPU."""
    extra = {} if backend is None else {"kernel_backend": backend}
    if device == "cpu":
        extra |= SMALL | (SMALL_VISION if preset == "deepseek-v4-vision" else {})
        extra |= SMALL_WINDOW if preset != "deepseek-v3.2" else {}
    else:
        extra["max_model_len"] = max_model_len
    return ArenaConfig.preset(preset, device=device, **extra)


class SoakStep:
    """The step every soak graph holds: the gather consumer's checksums (the metadata read
    the way attention kernels read it), then what it does not read, into buffers it owns --
    each prefill row's SWA row (the window widened by image spans, clamped at a replay
    start; ``rows``, int32 ``(T, Wp)``, -1 past), the decode and prefill SWA lengths and the
    first indexer's decode lengths (row order of each view), and the decoder-replay
    sub-batch (its rows, positions, slots, requests, ``kv_start``, the replay layers' SWA
    lengths; 0 past the sub-batch's own counts, read on the device). Returns ``(columns
    int64 (T, C), rows)``; :attr:`columns` names the columns."""

    def __init__(self, cfg: ArenaConfig, num_kv_blocks: int) -> None:
        self.cfg, dev, t = cfg, cfg.torch_device, cfg.max_num_batched_tokens
        self.gather = GatherConsumer(cfg, num_kv_blocks)
        self.index = self.gather.columns[2]
        self.columns = [*self.gather.columns, *LENGTHS]
        if cfg.bounded_replay:
            self.columns += REPLAY
        self.out = torch.zeros(t, len(self.columns), dtype=torch.int64, device=dev)
        self.rows = torch.full((t, prefill_swa_width(cfg) if cfg.has_swa else 1), -1,
                               dtype=torch.int32, device=dev)
        self.token = torch.arange(t, device=dev)[:, None]

    def __call__(self, batch, metadata):
        n, out, rows = batch.num_actual_tokens, self.out[: batch.num_actual_tokens], self.rows
        c = len(self.gather.columns)
        out.zero_()
        out[:, :c].copy_(self.gather(batch, metadata))
        rows[:n].fill_(-1)
        swa, index = metadata.get("swa"), metadata[self.index]
        lens = [swa and swa.decode_swa_lens, swa and swa.prefill_swa_lens,
                index.decode.seq_lens.reshape(-1) if index.decode is not None else None]
        if swa is not None and swa.prefill_swa_indices is not None:  # static: the build's
            r = min(swa.prefill_swa_indices.shape[0], n)
            rows[:r].copy_(swa.prefill_swa_indices[:r, 0])
        replay = metadata.get("replay")
        if replay is not None:
            sub = replay.batch
            lens += [replay.rows, sub.positions, sub.slot_mapping, sub.token_to_req,
                     replay.kv_start, replay.swa.decode_swa_lens, replay.swa.prefill_swa_lens,
                     replay.first_layer_swa.prefill_swa_lens]
        for j, column in enumerate(lens, start=c):
            if column is not None:  # static: the build's kind
                m = min(column.shape[0], n)
                out[:m, j].copy_(column[:m])
        if replay is not None:  # each column's real extent: the sub-batch's counts
            k, total, _, td = replay.batch.step_counts.long().unbind()
            ends = torch.stack([total, total, total, total, k, td, total - td, total - td])
            out[:, c + len(LENGTHS):].mul_(self.token[:n] < ends)
        return out, rows[:n]


#: SoakStep's length columns, after the gather consumer's.
LENGTHS = ["decode_swa_len", "prefill_swa_len", "indexer_len"]
#: SoakStep's decoder-replay columns (DeepSeek V4.1).
REPLAY = ["replay.rows", "replay.positions", "replay.slots", "replay.token_to_req",
          "replay.kv_start", "replay.decode_swa_len", "replay.prefill_swa_len",
          "replay.first_prefill_swa_len"]


class DraftStep:
    """The DSpark draft step's rows, lengths and validity: int32 ``(T, Wd + 2)`` it owns."""

    def __init__(self, cfg: ArenaConfig) -> None:
        self.width = draft_swa_width(cfg)
        self.out = torch.zeros(cfg.max_num_batched_tokens, self.width + 2, dtype=torch.int32,
                               device=cfg.torch_device)

    def __call__(self, batch, metadata):
        m, n = metadata["swa_draft"], batch.num_actual_tokens
        self.out[:n, : self.width].copy_(m.swa_indices[:n, 0])
        self.out[:n, self.width].copy_(m.swa_lens[:n])
        self.out[:n, self.width + 1].copy_(m.is_valid_token[:n])
        return self.out[:n]


def replay_starts(cfg: ArenaConfig, q: np.ndarray, s: np.ndarray,
                  rng: np.random.Generator) -> np.ndarray | None:
    """Bounded replay's starts of a step (DeepSeek V4.1, spec §8.1): each prefill request
    with a context replays from a prefix hit of ``H`` tokens half the time, ``H - min(W,
    H)`` (the scheduler's) or any start in ``[0, context]``; 0 for the decodes. None (nothing
    replays) one step in four."""
    if rng.random() < 0.25:
        return None
    context = (s - q).astype(np.int64)
    hit = rng.integers(0, context + 1)
    rs = np.where(rng.random(q.shape[0]) < 0.5, hit - np.minimum(cfg.sliding_window, hit),
                  rng.integers(0, context + 1))
    live = (q > cfg.decode_threshold) & (rng.random(q.shape[0]) < 0.7)
    return np.where(live, rs, 0).astype(np.int32)


def image_spans(cfg: ArenaConfig, q: np.ndarray, s: np.ndarray, count: int,
                rng: np.random.Generator) -> np.ndarray:
    """Up to ``count`` valid image spans ``(request, first, last)`` int32 ``(m, 3)`` of a
    vision step: in the prefill requests, each in a request's context or its query (never
    across the first query position), disjoint, at most ``W + mit`` tokens."""
    reach, spans = cfg.sliding_window + cfg.max_image_tokens, []
    prefills = np.flatnonzero(q > cfg.decode_threshold)
    for b in rng.permutation(prefills):
        context = int(s[b] - q[b])
        for lo, hi in ((0, context), (context, int(s[b]))):
            cursor = lo
            while len(spans) < count and cursor < hi and rng.random() < 0.8:
                first = int(rng.integers(cursor, min(hi, cursor + 4 * reach)))
                last = int(rng.integers(first, min(hi, first + reach)))
                spans.append((int(b), first, last))
                cursor = last + 1
    return np.array(spans, dtype=np.int32).reshape(-1, 3)


def step_positions(q: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each token's request and position."""
    req = np.repeat(np.arange(q.shape[0]), q)
    starts = np.cumsum(q) - q
    return req, (s - q)[req].astype(np.int64) + np.arange(req.shape[0]) - starts[req]


def expected_columns(cfg: ArenaConfig, ratio: int, q, s, slots, rs, spans) -> np.ndarray:
    """SoakStep's length columns over the step's ``nt`` tokens, int64 ``(nt, 3)``: each
    decode token's SWA length ``min(p + 1, W)`` and its first index type's ``(p + 1) //
    R``; each prefill row's SWA length ``end - start``, ``start = max(p - max(W - 1,
    left), replay_start, 0)``, ``end = p + right + 1`` (``left``, ``right``: how far the
    token sees into its image span, spec extras §3.3); 0 for invalid tokens and past each
    view's rows."""
    req, p = step_positions(q, s)
    nt, w = p.shape[0], cfg.sliding_window or 1
    td = int(q[: int(np.argmax(q > cfg.decode_threshold)) if (q > cfg.decode_threshold).any()
             else q.shape[0]].sum())
    valid = slots >= 0
    out = np.zeros((nt, 3), dtype=np.int64)
    if cfg.has_swa:
        out[:td, 0] = np.where(valid, np.minimum(p + 1, w), 0)[:td]
        left, right = np.zeros(nt, dtype=np.int64), np.zeros(nt, dtype=np.int64)
        if spans is not None and spans.shape[0]:  # the span holding each token, if any
            key = req * (cfg.max_model_len + 1) + p
            first = spans[:, 0].astype(np.int64) * (cfg.max_model_len + 1) + spans[:, 1]
            order = np.argsort(first)
            first, last = first[order], first[order] + (spans[order, 2] - spans[order, 1])
            j = np.searchsorted(first, key, side="right") - 1
            inside = (j >= 0) & (key <= last[np.maximum(j, 0)])
            mit = cfg.max_image_tokens
            left = np.where(inside, np.minimum(key - first[np.maximum(j, 0)], mit - 1), 0)
            right = np.where(inside, np.minimum(last[np.maximum(j, 0)] - key, mit), 0)
        floor = np.zeros(nt, dtype=np.int64) if rs is None else rs[req].astype(np.int64)
        start = np.maximum(np.maximum(p - np.maximum(w - 1, left), floor), 0)
        out[: nt - td, 1] = np.where(valid, p + right + 1 - start, 0)[td:]
    out[:td, 2] = ((p + 1) // ratio)[:td]
    return out


@dataclass(slots=True)
class SoakWorld:
    """The managers of one preset's soak and what feeds them."""

    cfg: ArenaConfig
    arena: object
    gm: GraphManager
    cg: ContextGraphs
    device: DeviceLengthSteps
    source: DeviceStepSource
    stream: DecodeStream
    draft: GraphManager | None = None
    draft_stream: DecodeStream | None = None
    contexts: list[int] = field(default_factory=list)

    def close(self) -> None:
        for gm in (self.gm, self.cg, self.draft):
            if gm is not None:
                gm.close()


def soak_world(cfg: ArenaConfig, rng: np.random.Generator, num_kv_blocks: int,
               contexts: list[int]) -> SoakWorld:
    """The preset's default builders (and, with bounded replay, the decoder-replay
    builder) under a manager, context buckets and device-decided lengths on one arena, the
    :class:`SoakStep` in every graph; with bounded replay also the DSpark draft step's
    manager on an arena of its own (a draft model's)."""
    builders = default_builders(cfg)
    if cfg.bounded_replay:
        builders.append(DecoderReplayBuilder())
    arena, inputs = make_arena(cfg, builders)
    step = SoakStep(cfg, num_kv_blocks)
    options = GraphOptions(progress=False, num_kv_blocks=num_kv_blocks)
    source = DeviceStepSource(cfg, arena.device)
    gm = GraphManager(arena, inputs, builders, step, options)
    world = SoakWorld(cfg, arena, gm, ContextGraphs(arena, inputs, builders, step,
                                                    contexts=contexts, options=options),
                      DeviceLengthSteps(gm, source), source,
                      DecodeStream(inputs, rng, num_kv_blocks=num_kv_blocks), contexts=contexts)
    if cfg.bounded_replay:
        draft = DraftSWAMetadataBuilder()
        draft_arena, draft_inputs = make_arena(cfg, [draft])
        world.draft = GraphManager(draft_arena, draft_inputs, [draft], DraftStep(cfg), options)
        world.draft_stream = DecodeStream(draft_inputs, rng, num_kv_blocks=num_kv_blocks)
    return world


def capture(world: SoakWorld, sizes: list[int], buckets: list[int]) -> None:
    """Capture every kind's graphs (on a CPU: records whose launch runs the graph's body
    eagerly, through the same lookup, staging and padding as a replay)."""
    decode = [(world.gm, GraphKind.DECODE, s) for s in sizes]
    decode += [(world.cg, GraphKind.DECODE, s) for s in sizes]
    decode += [(world.draft, GraphKind.DECODE, s) for s in sizes if world.draft is not None]
    if world.cfg.torch_device.type == "cuda":
        world.gm.capture(sizes, buckets)
        world.device.capture(buckets)
        world.cg.capture(sizes, buckets=())
        if world.draft is not None:
            world.draft.capture(sizes, buckets=())
        return
    for gm in {id(gm): gm for gm, _, _ in decode}.values():
        cap = gm.capturer
        specs = [cap.spec(GraphKind.DECODE, c, s) for c in gm.contexts for s in sizes]
        if gm is world.gm:
            specs += [cap.spec(GraphKind.MIXED, cap.context_len, b) for b in buckets]
            specs += [world.device.spec(b) for b in buckets]
        gm.dispatcher.add(*(_emulated(spec) for spec in specs))


def _emulated(spec) -> CapturedGraph:
    spec.stage()
    outputs, metadata = spec.body()
    return CapturedGraph(spec.kind, spec.size, spec.num_reqs, None, outputs, metadata, 0.0, 0,
                         None, spec.body, "eagerly", spec.context_len)


def kinds_of(cfg: ArenaConfig) -> list[str]:
    """The graph kinds (and entries) a preset's soak draws from, in turn."""
    return KINDS + (["draft"] if cfg.bounded_replay else [])


#: decode: a decode graph through run(); mixed: a token bucket through run(); in-place: a
#: token bucket through begin_step()/launch(k, t); device: device-decided lengths; context:
#: a decode graph of a context bucket; draft: the DSpark draft step's decode graphs.
KINDS = ["decode", "mixed", "in-place", "device", "context"]


@dataclass(slots=True)
class SoakStepDraw:
    """One drawn step: its host arrays and, where the preset has them, replay starts and
    image spans."""

    kind: str
    q: np.ndarray
    s: np.ndarray
    slots: np.ndarray
    replay_start: np.ndarray | None = None
    spans: np.ndarray | None = None


def draw_step(world: SoakWorld, kind: str, rng: np.random.Generator, max_requests: int,
              buckets: list[int]) -> SoakStepDraw:
    cfg = world.cfg
    if kind in ("decode", "context", "draft"):
        stream = world.draft_stream if kind == "draft" else world.stream
        longest = int(rng.choice(world.contexts)) if kind == "context" else None
        st = stream.next(int(rng.integers(1, max_requests + 1)), longest=longest)
        return SoakStepDraw(kind, st.query_lens, st.seq_lens, st.slot_mapping)
    st = world.stream.next_mixed(int(rng.choice(buckets)))
    q, s = st.query_lens, st.seq_lens
    rs = replay_starts(cfg, q, s, rng) if cfg.bounded_replay else None
    spans = None
    if cfg.image_spans and kind != "device":  # counts drawn anew each step: rising, falling
        spans = image_spans(cfg, q, s, int(rng.integers(0, cfg.max_image_spans + 1)), rng)
    return SoakStepDraw(kind, q, s, st.slot_mapping, rs, spans)


def replay(world: SoakWorld, d: SoakStepDraw) -> tuple[object, bool]:
    """Run the drawn step on its kind's path; ``(outputs, replayed)``."""
    q, s, slots = d.q, d.s, d.slots
    if d.kind == "device":
        world.source.fill(RandomStep(q, s, slots))
        out = world.device.launch(q.shape[0], int(q.sum()), replay_start=d.replay_start)
        return out, world.device.graph_for(q.shape[0], int(q.sum())) is not None
    if d.kind == "in-place":
        gm, k, t = world.gm, q.shape[0], int(q.sum())
        eager = gm.stats.eager_total
        host = gm.begin_step()
        host.query_start_loc[: k + 1] = np.concatenate(([0], np.cumsum(q)))
        host.seq_lens[:k] = s
        host.slot_mapping[:t] = slots
        if host.replay_start is not None:
            host.replay_start[:k] = 0 if d.replay_start is None else d.replay_start
        count = None
        if host.image_spans is not None:  # counted: the rows past it are staged as unused
            count = d.spans.shape[0]
            host.image_spans[:count] = d.spans
        out = gm.launch(k, t, num_spans=count)
        return out, gm.stats.eager_total == eager
    gm = {"context": world.cg, "draft": world.draft}.get(d.kind, world.gm)
    spans = None if d.spans is None else d.spans.tolist()
    res = gm.run(q, s, slots, replay_start=d.replay_start, image_spans=spans)
    return res.outputs, res.mode == "graph"


def eager_reference(world: SoakWorld, d: SoakStepDraw):
    gm = world.draft if d.kind == "draft" else world.gm
    spans = None if d.spans is None else d.spans.tolist()
    return gm.run_eager(d.q, d.s, d.slots, replay_start=d.replay_start, image_spans=spans)


def lengths_differ(world: SoakWorld, d: SoakStepDraw, out) -> bool:
    """Whether the replay's lengths differ from :func:`expected_columns` (a draft step's:
    ``L - max(L - q - W, 0)``, 0 for invalid tokens): one small read back."""
    cfg, nt = world.cfg, int(d.q.sum())
    if d.kind == "draft":
        got = out[:nt, -2].cpu().numpy()
        req = np.repeat(np.arange(d.q.shape[0]), d.q)
        s = d.s.astype(np.int64)[req]
        want = np.where(d.slots >= 0, s - np.maximum(s - d.q[req] - cfg.sliding_window, 0), 0)
        return not np.array_equal(got, want)
    step: SoakStep = world.gm.step
    first = step.columns.index(LENGTHS[0])
    got = out[0][:nt, first : first + len(LENGTHS)].cpu().numpy()
    ratio = cfg.index_layer_types[0].compress_ratio
    want = expected_columns(cfg, ratio, d.q, d.s, d.slots, d.replay_start, d.spans)
    return not np.array_equal(got, want)


def differing(world: SoakWorld, got, want) -> list[str]:
    """What differs between a replay's outputs and the eager reference's: the names of the
    columns (and ``rows``: the prefill SWA rows; a draft step's rows). The indexer's decode
    lengths are left out: the reference lays non-uniform decodes out its own way (each
    replay's are checked against :func:`expected_columns`, and the gather consumer reads
    them alike)."""
    if isinstance(got, torch.Tensor):
        return [] if torch.equal(got, want) else ["draft rows"]
    names = world.gm.step.columns
    bad = [name for j, name in enumerate(names) if name != "indexer_len"
           and not torch.equal(got[0][:, j], want[0][:, j])]
    return bad + ([] if torch.equal(got[1], want[1]) else ["rows"])


def _clone(out, nt: int):
    return out[:nt].clone() if isinstance(out, torch.Tensor) else tuple(o[:nt].clone()
                                                                           for o in out)


def every_kind(args) -> int:
    """Steps over every graph kind of a preset, in turn; every replay's lengths checked,
    a sample of each kind's replays compared with the eager reference builds bit for bit."""
    cuda = args.device == "cuda"
    cfg = soak_config(args.preset, args.device, args.max_model_len, args.backend)
    rng = np.random.default_rng(args.seed)
    top = cfg.max_model_len
    contexts = sorted({max(top // 64, cfg.next_n), max(top // 8, cfg.next_n), top})
    n = cfg.next_n
    max_requests = min(cfg.max_num_seqs, cfg.max_num_batched_tokens // n, args.max_requests)
    sizes = [n * r for r in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if r <= max_requests]
    if sizes[-1] != n * max_requests:
        sizes.append(n * max_requests)
    world = soak_world(cfg, rng, args.num_kv_blocks, contexts)
    kinds = kinds_of(cfg)
    report = {k: {"replays": 0, "eager": 0, "length_mismatches": 0, "eager_compared": 0,
                  "eager_mismatches": 0} for k in kinds}
    features = {"replay_start_steps": 0, "span_steps": 0, "span_counts_fell": 0,
                "spans": 0}
    t_capture = time.perf_counter()
    try:
        capture(world, sizes, default_mixed_buckets(cfg))
        buckets = default_mixed_buckets(cfg)
        capture_s = time.perf_counter() - t_capture
        fingerprint = world.arena.fingerprint()
        mem = _memory(cuda)
        warmup = min(args.replays, 1000)  # first uses (the eager path's caches) before mem0
        last_count, mem0 = 0, None
        t0 = time.perf_counter()
        for i in range(args.replays):
            if i == warmup:
                mem0 = _memory(cuda)
            if i and i % 10_000 == 0:  # a run stopped by a time limit still says how far it got
                print(f"step {i}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            kind = kinds[i % len(kinds)]
            d = draw_step(world, kind, rng, max_requests, buckets)
            if d.replay_start is not None and d.replay_start.any():
                features["replay_start_steps"] += 1
            if d.spans is not None:
                m = d.spans.shape[0]
                features["span_steps"] += m > 0
                features["spans"] += m
                features["span_counts_fell"] += m < last_count
                last_count = m
            out, graphed = replay(world, d)
            entry = report[kind]
            entry["replays" if graphed else "eager"] += 1
            if lengths_differ(world, d, out):
                entry["length_mismatches"] += 1
                print(f"step {i} ({kind}): lengths differ", file=sys.stderr)
            if (i // len(kinds)) % args.sample == 0:  # each kind sampled alike
                nt = int(d.q.sum())
                got = _clone(out, nt)
                entry["eager_compared"] += 1
                bad = differing(world, got, eager_reference(world, d))
                if bad:
                    entry["eager_mismatches"] += 1
                    print(f"step {i} ({kind}): replay differs from the eager reference in "
                          f"{bad}", file=sys.stderr)
        if cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        out = got = None
        gc.collect()
        end = _memory(cuda)
        result = {
            "command": "python scripts/soak.py " + " ".join(sys.argv[1:]),
            "preset": args.preset, "device": (torch.cuda.get_device_name() if cuda else "cpu"),
            "steps": args.replays, "kinds": report, "features": features,
            "seconds": elapsed, "steps_per_s": args.replays / elapsed,
            "capture_seconds": capture_s, "warmup_steps": warmup,
            "memory_allocated_delta": None if mem0 is None else end[0] - mem0[0],
            "memory_reserved_delta": None if mem0 is None else end[1] - mem0[1],
            "memory_allocated_since_capture": end[0] - mem[0],
            "fingerprint_unchanged": world.arena.fingerprint() == fingerprint,
            "decode_sizes": sizes, "buckets": buckets, "contexts": contexts,
            "sample": args.sample, "max_model_len": cfg.max_model_len,
        }
    finally:
        world.close()
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    ok = (all(e["length_mismatches"] == 0 and e["eager_mismatches"] == 0 and e["replays"] > 0
              for e in report.values())
          and result["fingerprint_unchanged"]
          # Growth after the warm-up fails; a shrink (the warm-up's last tensors freed) not.
          and (result["memory_allocated_delta"] or 0) <= 0)
    # memory_allocated_since_capture is reported, not judged: the eager reference builds of
    # the first sampled steps may keep caches of their own.
    if cfg.bounded_replay:
        ok = ok and features["replay_start_steps"] > 0
    if cfg.image_spans:
        ok = ok and features["span_steps"] > 0 and features["span_counts_fell"] > 0
    mismatches = sum(e["length_mismatches"] + e["eager_mismatches"] for e in report.values())
    print(f"soak {args.preset} {'PASS' if ok else 'FAIL'}: {args.replays} steps over "
          f"{len(kinds)} kinds in {elapsed:.0f} s (+{capture_s:.0f} s capture), "
          f"{mismatches} mismatches, {sum(e['eager_compared'] for e in report.values())} "
          f"compared with the eager reference")
    return 0 if ok else 1


def _memory(cuda: bool) -> tuple[int, int]:
    if not cuda:
        return 0, 0
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()


if __name__ == "__main__":
    sys.exit(main())
