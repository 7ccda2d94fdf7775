"""Where a vision model's step spends its extra host time: ``run()`` and the in-place launch,
with and without image spans, beside DeepSeek V4, in one process with interleaved rounds.

The reference mixed batch through its token bucket (``span_cost.mixed_manager``). Per
variant the host time of one call on an idle device: ``run()`` of V4; of the vision preset
with no spans, an empty list and three images (:data:`~staticattn.bench.mixed_steps.IMAGE_SPANS`);
the same with the runner's span check replaced by the identity (the check's share inside a
step); the bare graph launch of each bucket; the in-place ``launch(k, t)`` of V4 and of the
vision preset with a scan of the block, ``num_spans=0`` and ``num_spans=3`` (the engine's
writes untimed); the check and staging alone. Medians, minima and first quartiles over 20
rounds of 50 calls. The scan follows the three-span launch, so it finds and checks those
rows.

    python scripts/span_probe.py
"""

from __future__ import annotations

import time

import numpy as np
import torch
from span_cost import mixed_manager  # this script's directory is on sys.path

import staticattn.validation.step_checks as checks_module
from staticattn.bench.mixed_steps import IMAGE_SPANS
from staticattn.graphs import GraphKind, GraphManager
from staticattn.validation.image_spans import check_image_spans

SPANS = list(IMAGE_SPANS)


def _timed(fn) -> float:
    """Seconds of ``fn()`` on an idle device."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _in_place(gm: GraphManager, args, num_spans: int | None, rows=None) -> float:
    """Seconds of ``launch(k, t[, num_spans])`` after the engine's (untimed) writes."""
    q, s, slots = args
    k, t = len(q), len(slots)
    views = gm.begin_step()
    views.seq_lens[:k] = s
    views.slot_mapping[:t] = slots
    views.query_start_loc[: k + 1] = np.concatenate(([0], np.cumsum(q)))
    if rows:
        views.image_spans[: len(rows)] = rows
    if num_spans is None:
        return _timed(lambda: gm.launch(k, t))
    return _timed(lambda: gm.launch(k, t, num_spans=num_spans))


def main() -> None:
    v4, v4_args = mixed_manager("deepseek-v4")
    vision, args = mixed_manager("deepseek-v4-vision")
    real_check = checks_module.check_image_spans

    def unchecked() -> float:
        checks_module.check_image_spans = lambda cfg, spans, q, s: spans
        try:
            return _timed(lambda: vision.run(*args, image_spans=SPANS))
        finally:
            checks_module.check_image_spans = real_check

    bucket_v4, bucket_vision = (gm.graph_for(8192, GraphKind.MIXED) for gm in (v4, vision))
    images = vision.inputs.images
    variants = {
        "run v4": lambda: _timed(lambda: v4.run(*v4_args)),
        "run vision none": lambda: _timed(lambda: vision.run(*args)),
        "run vision []": lambda: _timed(lambda: vision.run(*args, image_spans=[])),
        "run vision 3": lambda: _timed(lambda: vision.run(*args, image_spans=SPANS)),
        "run vision 3 nocheck": unchecked,
        "launch v4 graph": lambda: _timed(bucket_v4.launch),
        "launch vision graph": lambda: _timed(bucket_vision.launch),
        "inplace v4": lambda: _in_place(v4, v4_args, None),
        "inplace vision scan none": lambda: _in_place(vision, args, None),
        "inplace vision 0": lambda: _in_place(vision, args, 0),
        "inplace vision 3": lambda: _in_place(vision, args, 3, SPANS),
        "check+stage alone": lambda: _timed(lambda: images.stage(
            check_image_spans(vision.config, SPANS, args[0], args[1]))),
    }
    for fn in variants.values():  # warm every path
        for _ in range(20):
            fn()
    times = {name: [] for name in variants}
    for _ in range(20):
        for name, fn in variants.items():
            times[name] += [fn() * 1e6 for _ in range(50)]
    for name, t in times.items():
        t = np.asarray(t)
        print(f"{name:<28} median {np.median(t):6.2f} us  min {t.min():6.2f}  p25 "
              f"{np.percentile(t, 25):6.2f}")
    v4.close()
    vision.close()


if __name__ == "__main__":
    main()
