"""The demo: a synthetic serving loop with chunked prefill, through the graph manager.

Decode batches grow and shrink, MTP is on (some requests accept fewer drafts), new prompts
are prefilled in chunks beside the running decodes; every step runs through
:meth:`GraphManager.run`. On a GPU every step replays a captured graph -- a decode graph
or a token bucket -- and is checked against the reference eager build through the gather
consumer, token by token, and every 20th step's reference build against the reference
(:mod:`staticattn.reference`, plain loops: about a second a step at the 1M-context preset).
Without CUDA the loop runs eagerly on the CPU kernels (the graph builds, as a step no graph
holds does, at smaller capacities), and every step is checked twice: its output against the
reference build's through the gather consumer, and the reference build's metadata against
the reference. On a model with image spans (``deepseek-v4-vision``) three prefill chunks in
four carry an image, a span inside the chunk, checked like the rest of the step.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from staticattn.arena import ArenaConfig, cache_groups, cdiv
from staticattn.bench.random_batches import block_ids, group_columns
from staticattn.builders import default_builders, make_arena
from staticattn.checks.output_compare import same_outputs, snapshot_outputs
from staticattn.checks.reference_check import compared_builders, reference_mismatch
from staticattn.consumers.emulated.gather import GatherConsumer
from staticattn.graphs.captured import GraphKind
from staticattn.graphs.manager import GraphManager
from staticattn.graphs.options import GraphOptions
from staticattn.model import model_preset

__all__ = ["run_demo", "DemoReport", "DEFAULT_STEPS", "cpu_config"]

NUM_KV_BLOCKS = 4096
#: Steps run when none are asked for: with CUDA, without (every step then runs eagerly and
#: through the plain-Python reference: a few seconds).
DEFAULT_STEPS = {"cuda": 300, "cpu": 60}
#: On a GPU, every so many steps the reference build is also compared with the reference.
GPU_REFERENCE_EVERY = 20
#: The capacities of an arena without CUDA: every step then runs eagerly and through the
#: plain-Python reference, whose loops grow with them.
CPU_CAPACITIES = dict(max_num_seqs=32, max_num_batched_tokens=1024, max_model_len=16384)
#: Without CUDA, images too are smaller (a span fits a step's chunk).
CPU_MAX_IMAGE_TOKENS = 256


@dataclass
class Request:
    row: int  # block-table row = its index in the batch (decodes first)
    seq_len: int  # tokens in the cache after its last step
    prompt_left: int  # prompt tokens not yet prefilled
    swa_row: np.ndarray | None  # None without SWA layers (DeepSeek V3.2)
    main_row: np.ndarray
    #: Its rows of the cache groups' tables (DeepSeek V4.1), by group name.
    group_rows: dict = field(default_factory=dict)


@dataclass
class DemoReport:
    """What the demo ran and checked: step counts, mismatches, host and GPU time."""

    steps: int = 0
    replayed: int = 0
    replayed_mixed: int = 0
    eager: dict = field(default_factory=dict)
    checked: int = 0
    mismatches: int = 0
    reference_checked: int = 0
    reference_mismatches: int = 0
    first_mismatch: str | None = None
    host_us: list = field(default_factory=list)
    gpu_us: list = field(default_factory=list)
    check_kind: str = ""
    #: Image spans run (a vision model), and the steps that carried them.
    image_spans: int = 0
    image_steps: int = 0
    #: The builders whose reference builds are compared with the reference.
    compared: str = "indexer, swa"

    @property
    def ok(self) -> bool:
        """Every step checked, none differing."""
        return (self.checked + self.reference_checked > 0 and self.mismatches == 0
                and self.reference_mismatches == 0)

    def verdict(self) -> str:
        """The last line: PASS or FAIL, with what was checked."""
        bad = self.mismatches + self.reference_mismatches
        word = "PASS" if self.ok else "FAIL"
        return (f"{word}: {self.steps} steps, {self.checked} checked against the reference "
                f"build and {self.reference_checked} against the reference, {bad} mismatches")

    def lines(self) -> list[str]:
        """The report as printable lines: counts, mismatches, host and GPU time, verdict."""
        reasons = ", ".join(f"{why} {n}" for why, n in sorted(self.eager.items()))
        out = [
            f"steps {self.steps}: replayed {self.replayed} ({self.replayed_mixed} through token "
            f"buckets), eager {sum(self.eager.values())}" + (f" ({reasons})" if reasons else ""),
            f"checked {self.checked} steps ({self.check_kind}): {self.mismatches} mismatches",
            f"checked {self.reference_checked} steps' reference builds ({self.compared}; "
            f"field by field) against staticattn.reference: "
            f"{self.reference_mismatches} mismatches",
        ]
        if self.image_spans:
            out.append(f"image spans: {self.image_spans} in {self.image_steps} steps, each "
                       "step checked with its spans as above")
        if self.first_mismatch:
            out.append(f"first mismatch: {self.first_mismatch[:300]}")
        if self.host_us:
            out.append(f"host time per step: median {statistics.median(self.host_us):.1f} us")
        if self.gpu_us:
            out.append(f"GPU time per step:  median {statistics.median(self.gpu_us):.1f} us")
        return out + [self.verdict()]

    def to_dict(self) -> dict:
        """The report as JSON-ready values (times as medians, us)."""
        median = lambda xs: round(statistics.median(xs), 2) if xs else None
        return {"verdict": "PASS" if self.ok else "FAIL", "steps": self.steps,
                "replayed": self.replayed, "replayed_mixed": self.replayed_mixed,
                "eager": dict(sorted(self.eager.items())), "checked": self.checked,
                "check_kind": self.check_kind, "mismatches": self.mismatches,
                "reference_checked": self.reference_checked,
                "reference_mismatches": self.reference_mismatches,
                "image_spans": self.image_spans, "image_steps": self.image_steps,
                "first_mismatch": self.first_mismatch,
                "host_us_median": median(self.host_us), "gpu_us_median": median(self.gpu_us)}


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
        main = block_ids(rng, NUM_KV_BLOCKS, cdiv(final, cfg.block_size))
        swa = (None if self.inputs.swa_block_table is None
               else block_ids(rng, NUM_KV_BLOCKS, cdiv(final, cfg.swa_block_size)))
        groups = {g.name: block_ids(rng, NUM_KV_BLOCKS, group_columns(g, final))
                  for g in cache_groups(cfg)}
        return Request(row, context, prompt, swa, main, groups)

    def _write_row(self, r: Request) -> None:
        """An engine writes a request's rows when it is placed, not every step."""
        self.inputs.block_table[r.row, : r.main_row.shape[0]].copy_(torch.from_numpy(r.main_row))
        if r.swa_row is not None:
            self.inputs.swa_block_table[r.row, : r.swa_row.shape[0]].copy_(
                torch.from_numpy(r.swa_row))
        for name, row in r.group_rows.items():
            self.inputs.block_tables[name][r.row, : row.shape[0]].copy_(torch.from_numpy(row))

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
            if r.row != i:
                r.row = i
                self._write_row(r)
        q, s, slots, spans = [], [], [], []
        for b, r in enumerate(self.requests):
            if r.prompt_left > 0:
                take = min(r.prompt_left, int(rng.integers(64, 512)))  # chunked prefill
                spans += self._image(b, r.seq_len, take)[: cfg.max_image_spans - len(spans)]
            else:
                # Mostly uniform MTP decodes; now and then a request drafts fewer tokens.
                take = n if rng.random() > 0.01 else int(rng.integers(1, n + 1))
            L = r.seq_len + take
            p = np.arange(L - take, L)
            # The slots address the SWA group where there is one, else the main one.
            row, bs = ((r.main_row, cfg.block_size) if r.swa_row is None
                       else (r.swa_row, cfg.swa_block_size))
            slots.append(row[p // bs].astype(np.int64) * bs + p % bs)
            q.append(take)
            s.append(L)
        return (np.asarray(q, dtype=np.int32), np.asarray(s, dtype=np.int32),
                np.concatenate(slots), spans or None)

    def _image(self, b: int, start: int, take: int) -> list[tuple[int, int, int]]:
        """On a model with image spans, three chunks in four carry one image inside the
        chunk's positions ``[start, start + take)`` of request ``b`` (an image is scheduled
        whole): ``[(b, first, last)]``; else none."""
        mit = self.cfg.max_image_tokens
        if not mit or self.rng.random() < 0.25:
            return []
        length = int(self.rng.integers(1, min(mit, take) + 1))
        first = start + int(self.rng.integers(0, take - length + 1))
        return [(b, first, first + length - 1)]

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


def _consumer(cuda: bool, choice: str, say: Callable[[str], None], preset: str):
    """``(config, step factory, description)``: the built-in gather consumer (every step
    graph-first), or the real kernels (DeepGEMM, FlashMLA), which serve decode tokens only:
    with them only decode steps replay, and steps with prefills run eagerly. Asked for the
    real kernels where none can run, says why and falls back to the gather consumer."""
    if choice == "real":
        from staticattn.consumers.real.factory import real_consumer_step
        from staticattn.kernels.runtime.dsa_libs import available, import_error

        have = available()
        if any(have.values()):
            # The real indexer materialises fp32 logits (tokens x max context) and the
            # attention step owns bf16 outputs per layer: smaller capacities keep both small.
            cfg = ArenaConfig.preset(preset, max_model_len=65536, max_num_seqs=64,
                                     max_num_batched_tokens=2048)
            names = " + ".join(k for k, v in sorted(have.items()) if v)
            return cfg, lambda c: real_consumer_step(c, num_kv_blocks=NUM_KV_BLOCKS), (
                f"real kernels ({names})")
        why = "; ".join(f"{name}: {import_error(name)}" for name in sorted(have))
        say(f"--consumer real: no real consumer can run here ({why}); falling back to the "
            "built-in gather consumer")
    cfg = ArenaConfig.preset(preset) if cuda else cpu_config(preset)
    return cfg, lambda c: GatherConsumer(c, NUM_KV_BLOCKS), "built-in gather consumer"


def cpu_config(preset: str, **overrides) -> ArenaConfig:
    """``preset`` at the capacities of a run without CUDA (:data:`CPU_CAPACITIES`, images
    of at most :data:`CPU_MAX_IMAGE_TOKENS`), on the CPU; ``overrides`` win."""
    small = dict(CPU_CAPACITIES, device="cpu")
    if model_preset(preset).fields.get("max_image_tokens"):
        small["max_image_tokens"] = CPU_MAX_IMAGE_TOKENS
    return ArenaConfig.preset(preset, **{**small, **overrides})


def run_demo(steps: int | None = None, seed: int = 0, progress: bool = True,
             consumer: str = "gather", json_path: str | None = None,
             preset: str = "deepseek-v4") -> int:
    """Run the demo; returns the process exit code (0 when every check passed).

    ``preset``: the model (:data:`staticattn.model.PRESETS`; without CUDA at smaller
    capacities), served by ``default_builders``. ``consumer``: "gather" (the built-in
    consumer; every step replays) or "real" (DeepGEMM + FlashMLA on decode graphs; steps
    with prefills run eagerly). ``steps``: default
    :data:`DEFAULT_STEPS` of the machine. ``json_path``: the report as JSON into this file, or
    to stdout for "-" (the text then goes to stderr).
    """
    out = sys.stderr if json_path == "-" else sys.stdout
    say = lambda msg: print(msg, file=out, flush=True)
    cuda = torch.cuda.is_available()
    cfg, make_step, consumer_name = _consumer(cuda, consumer, say, preset)
    if not cuda:
        say("no CUDA device: running the same loop eagerly on the CPU kernels (smaller "
            "capacities), each step checked against the reference build and the reference")
    if steps is None:
        steps = DEFAULT_STEPS["cuda" if cuda else "cpu"]
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    report_compared = ", ".join(compared_builders(builders))
    say(f"arena for the {preset} preset (next_n {cfg.next_n}, window {cfg.sliding_window}, "
        f"layer types {', '.join(t.name for t in cfg.layer_types)}; builders "
        f"{', '.join(b.name for b in builders)}):")
    say(arena.describe())
    say(f"consumer step: {consumer_name}")
    rng = np.random.default_rng(seed)
    server = SyntheticServer(inputs, rng, max_active=min(cfg.max_num_seqs, 256 if cuda else 24),
                             max_len=min(cfg.max_model_len, 200_000))
    report = DemoReport(compared=report_compared)
    options = GraphOptions(progress=progress, time_gpu=cuda, num_kv_blocks=NUM_KV_BLOCKS)
    with GraphManager(arena, inputs, builders, make_step(cfg), options) as gm:
        if cuda:
            _capture(gm, consumer_name.startswith("real"), say)
            report.check_kind = f"replay vs eager, bit for bit, through the {consumer_name}"
        else:
            report.check_kind = ("the step's output vs the reference build's, through the "
                                 "gather consumer")
        every = GPU_REFERENCE_EVERY if cuda else 1
        for i in tqdm(range(steps), desc="demo", unit="step", disable=not progress,
                      leave=False):
            _run_step(gm, server, i, report, cuda, check_reference=i % every == 0)
    say("")
    for line in report.lines():
        say(line)
    if json_path is not None:
        text = json.dumps(report.to_dict(), indent=2)
        if json_path == "-":
            print(text)
        else:
            with open(json_path, "w") as f:
                f.write(text + "\n")
    return 0 if report.ok else 1


def _capture(gm: GraphManager, decode_only: bool, say: Callable[[str], None]) -> None:
    t0 = time.perf_counter()
    gm.capture(buckets=() if decode_only else None)
    buckets = f"{gm.buckets[0]}..{gm.buckets[-1]}" if gm.buckets else "-"
    say(f"captured {len(gm.graphs)} decode graphs (sizes {gm.capture_sizes[0]}.."
        f"{gm.capture_sizes[-1]} tokens) and {len(gm.mixed_graphs)} token buckets "
        f"({buckets} tokens) in {time.perf_counter() - t0:.1f} s (buckets "
        f"{sum(g.capture_s for g in gm.mixed_graphs.values()):.1f} s, decode graphs "
        f"{sum(g.capture_s for g in gm.graphs.values()):.1f} s)")


def _run_step(gm: GraphManager, server: SyntheticServer, i: int, report: DemoReport,
              cuda: bool, check_reference: bool) -> None:
    """One step: run it, check it (replay vs eager; what ran eagerly vs the reference build;
    the reference build vs the reference when asked), advance the server."""
    q, s, slots, spans = server.next_step(i)
    t0 = time.perf_counter()
    res = gm.run(q, s, slots, image_spans=spans)
    report.host_us.append((time.perf_counter() - t0) * 1e6)
    if res.gpu_events is not None:
        report.gpu_us.append(res.gpu_us())
    report.steps += 1
    report.image_spans += len(spans or ())
    report.image_steps += bool(spans)
    if res.mode == "graph":
        report.replayed += 1
        report.replayed_mixed += res.graph_kind is GraphKind.MIXED
    else:
        why = res.reason.value
        report.eager[why] = report.eager.get(why, 0) + 1
    # On a GPU a step that ran eagerly (the real consumers' prefill steps) is counted only.
    if res.mode == "graph" or not cuda:
        ran = snapshot_outputs(res.outputs)
        report.checked += 1
        report.mismatches += int(not same_outputs(ran, snapshot_outputs(
            gm.run_eager(q, s, slots, image_spans=spans))))
    if check_reference:
        mismatch = reference_mismatch(gm, q, s, slots, image_spans=spans)
        report.reference_checked += 1
        report.reference_mismatches += mismatch is not None
        report.first_mismatch = report.first_mismatch or mismatch
    server.advance(q)
