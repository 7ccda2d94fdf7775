"""Command line: ``python -m staticattn demo | check | bench`` (also the ``staticattn`` script).

Every argument is checked (:mod:`staticattn.cli`) before a command says or does anything
else; a bad one exits 2 with one line naming it. Exit statuses
(:class:`~staticattn.cli.ExitCode`): 0 pass, 1 fail, 2 bad argument, 3 skipped."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta

from staticattn.cli import (
    ExitCode,
    build_parser,
    config_of,
    config_overrides,
    load_step,
    pcp_sizes,
    validate,
)
from staticattn.errors import StepSpecError

__all__ = ["main", "print_check_report"]


def _make_step(spec: str | None, config):
    """The step of ``--step module:function`` built for ``config`` (default: the built-in
    gather consumer); :class:`StepSpecError` when calling the function fails."""
    if not spec:
        from staticattn.consumers.emulated.gather import GatherConsumer

        return GatherConsumer(config)
    factory = load_step(spec)
    try:
        return factory(config)
    except Exception as exc:  # the user's code: any failure is the spec's, said as such
        raise StepSpecError(f"--step {spec}: {factory.__name__}(config) raised "
                            f"{type(exc).__name__}: {exc}") from exc


def cmd_demo(args) -> int:
    if args.pcp:
        from staticattn.distributed.pcp_demo import run_pcp_demo

        kwargs = {} if args.steps is None else {"steps": args.steps}
        return run_pcp_demo(args.pcp, seed=args.seed, preset=args.pcp_preset,
                            json_path=args.json, progress=not args.no_progress,
                            deadline=timedelta(seconds=args.dcp_deadline), dcp=args.dcp or 1,
                            sizes=pcp_sizes(args), **kwargs)
    if args.dcp:
        from staticattn.distributed.dcp_demo import run_dcp_demo

        kwargs = {} if args.steps is None else {"steps": args.steps}
        return run_dcp_demo(args.dcp, seed=args.seed, preset=args.dcp_preset,
                            json_path=args.json, progress=not args.no_progress,
                            deadline=timedelta(seconds=args.dcp_deadline), **kwargs)
    from staticattn.demo import run_demo

    return run_demo(steps=args.steps, seed=args.seed, progress=not args.no_progress,
                    consumer=args.consumer, json_path=args.json, preset=args.preset)


def cmd_check(args, cuda: bool) -> int:
    if not cuda:
        return check_without_cuda(args)
    from staticattn.builders import default_builders, make_arena
    from staticattn.checks import check_graph_safety

    cfg = config_of(args, "cuda")
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    step = _make_step(args.step, cfg)
    sizes = None if args.batch_requests is None else [r * cfg.next_n for r in args.batch_requests]
    report = check_graph_safety(arena, inputs, builders, step, sizes=sizes,
                                num_batches=args.batches or 100, seed=args.seed,
                                dot_dir=args.dot, progress=not args.no_progress)
    return print_check_report(report, args.json)


def check_without_cuda(args) -> int:
    """``check`` without CUDA: the checks that need no capture
    (:func:`~staticattn.checks.check_eagerly`) on the same step, at the demo's CPU
    capacities; then what needs a GPU, and the verdict. The exit status (0 PASS, 1 FAIL)."""
    from staticattn.builders import default_builders, make_arena
    from staticattn.checks import check_eagerly
    from staticattn.checks.reference_check import CAPTURE_ONLY
    from staticattn.demo import NUM_KV_BLOCKS, cpu_config
    from staticattn.graphs import GraphManager, GraphOptions

    cfg = cpu_config(args.preset, **config_overrides(args))
    builders = default_builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    step = _make_step(args.step, cfg)
    name = args.step or "the built-in gather consumer"
    options = GraphOptions(progress=False, num_kv_blocks=NUM_KV_BLOCKS)
    with GraphManager(arena, inputs, builders, step, options) as gm:
        found = check_eagerly(gm, num_steps=args.batches or 20, seed=args.seed,
                              progress=not args.no_progress)
    word = "PASS" if found.ok else "FAIL"
    bad = found.output_mismatches + found.reference_mismatches + found.extent_mismatches
    unused = [flag for flag, value in (("--batch-requests", args.batch_requests),
                                       ("--dot", args.dot)) if value is not None]
    lines = [f"no CUDA device: the checks that need no graph capture, on {name} "
             f"({args.preset} at {cfg.max_num_seqs} requests, {cfg.max_num_batched_tokens} "
             f"tokens, {cfg.max_model_len}-token context)", *found.lines(),
             "needs a GPU (not checked here): " + ", ".join(CAPTURE_ONLY)
             + (f"; {', '.join(unused)} (capture only) unused" if unused else ""),
             f"{word} without CUDA: {found.steps} random steps run eagerly, {bad} mismatches "
             "(the capture checks need a GPU)"]
    result = {"schema": "staticattn.check-eager/1", "verdict": word, "device": "cpu",
              "preset": args.preset, "step": name, "max_num_seqs": cfg.max_num_seqs,
              "max_num_batched_tokens": cfg.max_num_batched_tokens,
              "max_model_len": cfg.max_model_len, **found.to_dict(),
              "not_checked": list(CAPTURE_ONLY)}
    _emit("\n".join(lines), json.dumps(result, indent=2), args.json)
    return ExitCode.PASS if found.ok else ExitCode.FAIL


def print_check_report(report, json_path: str | None) -> int:
    """Print the report: as text, or as JSON (``-`` for stdout, else a file beside the text);
    the exit status of ``check`` (0 PASS, 1 FAIL)."""
    _emit(str(report), report.to_json(), json_path)
    return ExitCode.PASS if report.ok else ExitCode.FAIL


def _emit(text: str, data: str, json_path: str | None) -> None:
    """``text`` on stdout, or ``data`` (JSON) instead (``-``), or both (a file path)."""
    if json_path == "-":
        print(data)
        return
    print(text)
    if json_path:
        with open(json_path, "w") as f:
            f.write(data)


def cmd_bench(args, cuda: bool) -> int:
    if args.pcp:
        from staticattn.distributed.pcp_bench import run_pcp_bench

        return run_pcp_bench(args.pcp, reps=args.reps, seed=args.seed, preset=args.pcp_preset,
                             json_path=args.json, progress=not args.no_progress,
                             dcp=args.dcp or 1, sizes=pcp_sizes(args))
    if args.dcp:
        from staticattn.distributed.dcp_bench import run_dcp_bench

        return run_dcp_bench(args.dcp, batches=args.batch_requests or (1, 8, 16),
                             reps=args.reps, seed=args.seed, preset=args.preset,
                             json_path=args.json, progress=not args.no_progress)
    if not cuda:
        reason = "no CUDA device; replay latency (a GPU measurement) needs one"
        # As JSON to stdout for a CI job reading it (-); no file is written.
        _emit(f"SKIPPED: {reason}", json.dumps({"verdict": "skipped", "reason": reason}),
              "-" if args.json == "-" else None)
        return ExitCode.SKIPPED
    from staticattn.builders import default_builders
    from staticattn.graphs.options import StagingGuard

    cfg = config_of(args, "cuda")
    progress = not args.no_progress
    if args.breakdown:
        from staticattn.bench.breakdown import run_breakdown

        report = run_breakdown(cfg, default_builders, reps=args.reps, seed=args.seed,
                               staging_guard=StagingGuard(args.staging_guard),
                               progress=progress)
        _emit(report.table(), report.to_json(), args.json)
        return ExitCode.PASS
    if args.mix:
        from staticattn.bench.mixed_steps import run_mixed_bench

        report = run_mixed_bench(default_builders, None, reps=args.reps, seed=args.seed,
                                 progress=progress)
        return _save(report, args, report.table())
    step, name = _bench_step(args)
    if args.context:
        from staticattn.bench.context import run_context_bench

        report = run_context_bench(args.preset, args.context, cfg.max_model_len,
                                   lambda: default_builders(cfg), step,
                                   batches=args.batch_requests or (32,), reps=args.reps,
                                   seed=args.seed, consumer_name=name, progress=progress)
        return _save(report, args, report.table())
    from staticattn.bench.replay import run_bench
    from staticattn.graphs.sizes import default_capture_sizes

    reports = []
    for preset in [args.preset, *(args.compare or ())]:
        cfg = config_of(args, "cuda", preset)
        n = cfg.next_n
        sizes = ([r * n for r in args.batch_requests] if args.batch_requests
                 else default_capture_sizes(cfg))
        reports.append(run_bench(cfg, lambda c=cfg: default_builders(c), step, sizes,
                                 reps=args.reps, preset=preset, consumer_name=name,
                                 seed=args.seed, progress=progress,
                                 staging_guard=StagingGuard(args.staging_guard)))
    if len(reports) == 1:
        return _save(reports[0], args, reports[0].header() + "\n" + reports[0].table())
    from staticattn.bench.preset_compare import PresetComparison

    comparison = PresetComparison(reports)
    return _save(comparison, args, comparison.text())


def _bench_step(args) -> tuple:
    """``(step factory or None, its name)`` of the bench's ``--step`` / ``--consumer``."""
    if args.step:
        return (lambda cfg: _make_step(args.step, cfg)), args.step
    if args.consumer == "gather":
        return (lambda cfg: _make_step(None, cfg)), "built-in gather consumer"
    if args.consumer == "real":
        from staticattn.consumers.real.factory import real_consumer_step
        from staticattn.kernels.runtime.dsa_libs import available

        have = available()
        names = " + ".join(k for k, v in sorted(have.items()) if v)
        return real_consumer_step, f"real kernels ({names})"
    return None, "metadata only"


def _save(report, args: argparse.Namespace, text: str) -> int:
    """Print or write the report (``--json``), plot it (``--plot``); the exit status."""
    _emit(text, report.to_json(), args.json)
    if args.plot:
        report.plot(args.plot)
        if args.json != "-":
            print(f"plot: {args.plot}")
    return ExitCode.PASS


def main(argv: list[str] | None = None) -> int:
    """The command line: ``demo``, ``check`` or ``bench`` (``--help`` for each); the
    exit status, an :class:`~staticattn.cli.ExitCode` (2 for a bad argument, with one line
    saying which and why)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    validate(args, cuda)
    try:
        if args.cmd == "demo":
            return cmd_demo(args)
        if args.cmd == "check":
            return cmd_check(args, cuda)
        return cmd_bench(args, cuda)
    except StepSpecError as exc:
        args.cmd_parser.error(str(exc))
    return ExitCode.BAD_ARGUMENT  # not reached: error() exits


if __name__ == "__main__":
    sys.exit(main())
