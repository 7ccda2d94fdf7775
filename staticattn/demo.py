"""The demo: a synthetic serving loop with chunked prefill, through the graph manager.

Decode batches grow and shrink, MTP is on (some requests accept fewer drafts), new prompts
are prefilled in chunks beside the running decodes; every step runs through
:meth:`GraphManager.run`. On a GPU every step replays a captured graph -- a decode graph
or a token bucket -- and is checked against the reference eager build through the gather
consumer, token by token; without CUDA the loop runs eagerly on the CPU kernels (the graph
builds, as a step no graph holds does), every step's output is checked against the
reference build's through the gather consumer, and the reference build's metadata against
the independent oracle of the test suite.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from staticattn.arena import ArenaConfig, cdiv
from staticattn.builders import make_arena
from staticattn.builders.indexer.builder import IndexerMetadataBuilder
from staticattn.builders.swa.builder import SparseSWAMetadataBuilder
from staticattn.checks.outputs import same_outputs, snapshot_outputs
from staticattn.consumers.gather import GatherConsumer
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.options import GraphOptions
from staticattn.graphs.records import GraphKind

__all__ = ["run_demo", "DemoReport"]

NUM_KV_BLOCKS = 4096


@dataclass
class Request:
    row: int  # block-table row = its index in the batch (decodes first)
    seq_len: int  # tokens in the cache after its last step
    prompt_left: int  # prompt tokens not yet prefilled
    swa_row: np.ndarray
    main_row: np.ndarray


@dataclass
class DemoReport:
    steps: int = 0
    replayed: int = 0
    replayed_mixed: int = 0
    eager: dict = field(default_factory=dict)
    checked: int = 0
    mismatches: int = 0
    host_us: list = field(default_factory=list)
    gpu_us: list = field(default_factory=list)
    check_kind: str = ""

    def lines(self) -> list[str]:
        """The report as printable lines: counts, mismatches, host and GPU time per step."""
        out = [
            f"steps {self.steps}: replayed {self.replayed} ({self.replayed_mixed} through token "
            f"buckets), eager {sum(self.eager.values())} {dict(sorted(self.eager.items()))}",
            f"checked {self.checked} steps ({self.check_kind}): mismatches {self.mismatches}",
        ]
        if self.host_us:
            out.append(f"host time per step: median {statistics.median(self.host_us):.1f} us")
        if self.gpu_us:
            out.append(f"GPU time per step:  median {statistics.median(self.gpu_us):.1f} us")
        return out


class SyntheticServer:
    """Requests that arrive (prefill, sometimes chunked), decode with MTP, and finish."""

    def __init__(self, inputs, rng: np.random.Generator, max_active: int, max_len: int) -> None:
        self.inputs, self.cfg, self.rng = inputs, inputs.config, rng
        self.max_active, self.max_len = max_active, max_len
        self.requests: list[Request] = []

    def _new_request(self, row: int) -> Request:
        cfg, rng = self.cfg, self.rng
        context = int(rng.integers(0, self.max_len // 2))
        prompt = int(rng.integers(16, 600))
        final = min(cfg.max_model_len, context + prompt + 4096)
        main = rng.integers(1, NUM_KV_BLOCKS, size=cdiv(final, cfg.block_size), dtype=np.int32)
        swa = rng.integers(1, NUM_KV_BLOCKS, size=cdiv(final, cfg.swa_block_size),
                           dtype=np.int32)
        return Request(row, context, prompt, swa, main)

    def _write_row(self, r: Request) -> None:
        """An engine writes a request's row when it is placed, not every step."""
        self.inputs.block_table[r.row, : r.main_row.shape[0]].copy_(torch.from_numpy(r.main_row))
        self.inputs.swa_block_table[r.row, : r.swa_row.shape[0]].copy_(
            torch.from_numpy(r.swa_row))

    def _place(self, r: Request, row: int) -> None:
        if r.row != row:
            r.row = row
            self._write_row(r)

    def next_step(self, step_no: int):
        cfg, rng, n = self.cfg, self.rng, self.cfg.next_n
        # Finish a few, admit a few: the decode batch grows and shrinks.
        target = int(self.max_active * (0.55 + 0.45 * np.sin(step_no / 23.0)))
        while len(self.requests) > max(1, target):
            self.requests.pop(int(rng.integers(0, len(self.requests))))
        admit = step_no % 9 == 0 or not self.requests
        if admit and len(self.requests) < self.max_active:
            r = self._new_request(len(self.requests))
            self._write_row(r)
            self.requests.append(r)
        # Decode-first order: decodes, then requests still prefilling.
        self.requests.sort(key=lambda r: r.prompt_left > 0)
        for i, r in enumerate(self.requests):
            self._place(r, i)
        q, s, slots = [], [], []
        for r in self.requests:
            if r.prompt_left > 0:
                take = min(r.prompt_left, int(rng.integers(64, 512)))  # chunked prefill
            else:
                # Mostly uniform MTP decodes; now and then a request drafts fewer tokens.
                take = n if rng.random() > 0.01 else int(rng.integers(1, n + 1))
            L = r.seq_len + take
            p = np.arange(L - take, L)
            bs = cfg.swa_block_size
            slots.append(r.swa_row[p // bs].astype(np.int64) * bs + p % bs)
            q.append(take)
            s.append(L)
        return (np.asarray(q, dtype=np.int32), np.asarray(s, dtype=np.int32),
                np.concatenate(slots))

    def advance(self, q: np.ndarray) -> None:
        n = self.cfg.next_n
        for r, take in zip(self.requests, q):
            if r.prompt_left > 0:
                r.prompt_left -= int(take)
                r.seq_len += int(take)
            else:
                # Accepted tokens: 1..take (the rest of the drafts are rejected).
                r.seq_len += int(self.rng.integers(1, int(take) + 1)) if n > 1 else 1
            r.seq_len = min(r.seq_len, self.cfg.max_model_len - 2 * n - 600)


def _say(msg: str) -> None:
    print(msg, flush=True)


def _consumer(cuda: bool, choice: str):
    """``(config, step factory, description)``: the built-in gather consumer (every step
    graph-first), or the real kernels (DeepGEMM, FlashMLA), which serve decode tokens only:
    with them only decode steps replay, and steps with prefills run eagerly."""
    if cuda and choice == "real":
        from staticattn.consumers.real import real_consumer_step, real_consumers_available

        have = real_consumers_available()
        # The real indexer materialises fp32 logits (tokens x max context) and the
        # attention step owns bf16 outputs per layer: smaller capacities keep both small.
        cfg = ArenaConfig.deepseek_v4(max_model_len=65536, max_num_seqs=64,
                                      max_num_batched_tokens=2048)
        names = " + ".join(k for k, v in sorted(have.items()) if v) or "none"
        return cfg, lambda c: real_consumer_step(c, num_kv_blocks=NUM_KV_BLOCKS), (
            f"real kernels ({names})")
    if cuda:
        cfg = ArenaConfig.deepseek_v4()
    else:
        cfg = ArenaConfig.deepseek_v4(max_num_seqs=32, max_num_batched_tokens=1024,
                                      max_model_len=16384, device="cpu")
    return cfg, lambda c: GatherConsumer(c, NUM_KV_BLOCKS), "built-in gather consumer"


def run_demo(steps: int = 300, seed: int = 0, progress: bool = True,
             consumer: str = "gather") -> int:
    """Run the demo; returns the process exit code (0 when every check passed).

    ``consumer``: "gather" (the built-in consumer; every step replays) or "real" (DeepGEMM +
    FlashMLA on decode graphs; steps with prefills run eagerly).
    """
    cuda = torch.cuda.is_available()
    cfg, make_step, consumer_name = _consumer(cuda, consumer)
    if not cuda:
        _say("no CUDA device: running the same loop eagerly on the CPU kernels, each step "
             "checked against the oracle (smaller capacities)")
        steps = min(steps, 60)
    builders = [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()]
    arena, inputs = make_arena(cfg, builders)
    _say(f"arena for the DeepSeek-V4-like preset (next_n {cfg.next_n}, window "
         f"{cfg.sliding_window}, compress ratios {cfg.compress_ratios}):")
    _say(arena.describe())
    _say(f"consumer step: {consumer_name}")
    step = make_step(cfg)
    rng = np.random.default_rng(seed)
    server = SyntheticServer(inputs, rng, max_active=min(cfg.max_num_seqs, 256 if cuda else 24),
                             max_len=min(cfg.max_model_len, 200_000))
    report = DemoReport()
    verifier = None if cuda else _oracle_verifier(cfg)
    options = GraphOptions(progress=progress, time_gpu=cuda)
    with GraphManager(arena, inputs, builders, step, options) as gm:
        if cuda:
            t0 = time.perf_counter()
            gm.capture(buckets=() if consumer == "real" else None)
            _say(f"captured {len(gm.graphs)} decode graphs (sizes {gm.capture_sizes[0]}.."
                 f"{gm.capture_sizes[-1]} tokens) and {len(gm.mixed_graphs)} token buckets "
                 f"({gm.buckets[0] if gm.buckets else '-'}..{gm.buckets[-1] if gm.buckets else '-'}"
                 f" tokens) in {time.perf_counter() - t0:.1f} s (buckets "
                 f"{sum(g.capture_s for g in gm.mixed_graphs.values()):.1f} s, decode graphs "
                 f"{sum(g.capture_s for g in gm.graphs.values()):.1f} s)")
            report.check_kind = f"replay vs eager, bit for bit, through the {consumer_name}"
        else:
            report.check_kind = (
                "the step's output vs the reference build through the gather consumer, and "
                "the reference build's indexer and SWA metadata vs the oracle" if verifier
                else "the step's output vs the reference build through the gather consumer "
                     "(no oracle found: not a source checkout)")
        for i in range(steps):
            q, s, slots = server.next_step(i)
            t0 = time.perf_counter()
            res = gm.run(q, s, slots)
            report.host_us.append((time.perf_counter() - t0) * 1e6)
            if res.gpu_events is not None:
                report.gpu_us.append(res.gpu_us())
            report.steps += 1
            if res.mode == "graph":
                report.replayed += 1
                report.replayed_mixed += res.graph_kind is GraphKind.MIXED
                replayed = snapshot_outputs(res.outputs)
                eager = snapshot_outputs(gm.run_eager(q, s, slots))
                report.checked += 1
                report.mismatches += int(not same_outputs(replayed, eager))
            else:
                report.eager[res.reason] = report.eager.get(res.reason, 0) + 1
                if not cuda:  # (on a GPU: the real consumers' prefill steps, counted only)
                    report.checked += 1
                    report.mismatches += int(not _eager_step_ok(gm, verifier, res, q, s, slots))
            server.advance(q)
    _say("")
    for line in report.lines():
        _say(line)
    return 0 if report.mismatches == 0 else 1


def _eager_step_ok(gm: GraphManager, verifier, res, q, s, slots) -> bool:
    """What ran (the graph builds, eagerly) against the reference builds through the
    consumer, then the reference builds' metadata against the oracle (when found)."""
    ok = same_outputs(snapshot_outputs(res.outputs), snapshot_outputs(gm.run_eager(q, s, slots)))
    return (verifier is None or verifier(gm, q, s, slots)) and ok


def _oracle_verifier(cfg: ArenaConfig):
    """Check a step's metadata against the test suite's oracle (a source checkout)."""
    tests = Path(__file__).resolve().parents[1] / "tests"
    if not (tests / "oracle").is_dir():
        return None
    sys.path.insert(0, str(tests))
    from oracle import indexer as indexer_oracle
    from oracle import swa as swa_oracle
    from support import HostStep

    def verify(gm: GraphManager, q, s, slots) -> bool:
        r = q.shape[0]
        step = HostStep(q, s, slots, gm.inputs.block_table[:r].numpy().copy(),
                        gm.inputs.swa_block_table[:r].numpy().copy(), r, int(q.sum()))
        counts = gm.inputs.stage(q, s, slots)
        gm.inputs.copy_to_device(counts.num_reqs, counts.num_tokens)
        from staticattn.builders import Batch

        batch = Batch.from_staged(gm.inputs, counts)
        idx, swa = (b.build(batch) for b in gm.builders)
        try:
            indexer_oracle.assert_matches(
                idx, indexer_oracle.indexer_metadata(cfg, step), step, gm.arena)
            swa_oracle.assert_matches(swa, swa_oracle.expected_for_step(cfg, step))
        except AssertionError as exc:
            _say(f"oracle mismatch: {str(exc)[:300]}")
            return False
        return True

    return verify
