"""Command line: ``python -m staticattn demo | check | bench`` (also the ``staticattn`` script)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

__all__ = ["main"]


def _config(args):
    from staticattn.arena import ArenaConfig

    overrides = {}
    if getattr(args, "next_n", None):
        overrides["num_speculative_tokens"] = args.next_n - 1
    if getattr(args, "max_model_len", None):
        overrides["max_model_len"] = args.max_model_len
    return ArenaConfig.preset(args.preset, **overrides)


def _builders(config):
    from staticattn.builders.indexer.builder import IndexerMetadataBuilder
    from staticattn.builders.swa.builder import SparseSWAMetadataBuilder

    return [IndexerMetadataBuilder()] + ([SparseSWAMetadataBuilder()] if config.has_swa else [])


def _step_factory(spec: str | None):
    """``module:function`` called with the ArenaConfig, returning the step; default: the
    built-in gather consumer."""
    if not spec:
        from staticattn.consumers.gather import GatherConsumer

        return GatherConsumer
    module, _, name = spec.partition(":")
    if not name:
        raise SystemExit(f"--step {spec!r}: expected module:function")
    return getattr(importlib.import_module(module), name)


def cmd_demo(args) -> int:
    if args.dcp:
        from staticattn.distributed.demo import run_dcp_demo

        return run_dcp_demo(args.dcp, steps=args.steps, seed=args.seed,
                            preset=args.dcp_preset)
    from staticattn.demo import run_demo

    return run_demo(steps=args.steps, seed=args.seed, progress=not args.no_progress,
                    consumer=args.consumer)


def cmd_check(args) -> int:
    import torch

    from staticattn.builders import make_arena
    from staticattn.checks import check_graph_safety

    if not torch.cuda.is_available():
        reason = "no CUDA device; the graph sanity check needs one"
        # A CI job reading JSON from stdout gets JSON here too.
        print(json.dumps({"verdict": "skipped", "reason": reason}) if args.json == "-"
              else f"check: {reason}")
        return 2
    cfg = _config(args)
    builders = _builders(cfg)
    arena, inputs = make_arena(cfg, builders)
    step = _step_factory(args.step)(cfg)
    report = check_graph_safety(arena, inputs, builders, step, sizes=args.sizes,
                                num_batches=args.batches, seed=args.seed, dot_dir=args.dot)
    return print_check_report(report, args.json)


def print_check_report(report, json_path: str | None) -> int:
    """Print the report: as text, or as JSON (``-`` for stdout, else a file beside the text);
    the exit status of ``check`` (0 PASS, 1 FAIL)."""
    if json_path == "-":
        print(report.to_json())
    else:
        print(report)
        if json_path:
            with open(json_path, "w") as f:
                f.write(report.to_json())
    return 0 if report.ok else 1


def cmd_bench(args) -> int:
    import torch

    from staticattn.bench.replay import run_bench
    from staticattn.graphs.options import StagingGuard
    from staticattn.graphs.sizes import default_capture_sizes

    if args.dcp:
        from staticattn.distributed.bench import run_dcp_bench

        return run_dcp_bench(args.dcp, batches=args.batch or (1, 8, 16), reps=args.reps,
                             seed=args.seed, preset=args.preset, json_path=args.json)
    if not torch.cuda.is_available():
        print("bench: no CUDA device; replay latency is a GPU measurement")
        return 2
    cfg = _config(args)
    if args.breakdown:
        from staticattn.bench.breakdown import run_breakdown

        print(run_breakdown(cfg, _builders, reps=args.reps, seed=args.seed,
                            staging_guard=StagingGuard(args.staging_guard)))
        return 0
    if args.mix:
        from staticattn.bench.mixed import run_mixed_bench

        mixed = run_mixed_bench(_builders, None, reps=args.reps, seed=args.seed,
                                progress=not args.no_progress)
        print(mixed.table())
        return _save_report(mixed, args)
    step, name = _bench_step(args)
    if args.context:
        from staticattn.bench.context import run_context_bench

        report = run_context_bench(args.preset, args.context, cfg.max_model_len,
                                   lambda: _builders(cfg), step, batches=args.batch or (32,),
                                   reps=args.reps, seed=args.seed, consumer_name=name)
        print(report.table())
        return _save_report(report, args)
    n = cfg.next_n
    sizes = [b * n for b in args.batch] if args.batch else default_capture_sizes(cfg)
    report = run_bench(cfg, lambda: _builders(cfg), step, sizes, reps=args.reps,
                       preset=args.preset, consumer_name=name, seed=args.seed,
                       progress=not args.no_progress,
                       staging_guard=StagingGuard(args.staging_guard))
    print(report.header())
    print(report.table())
    return _save_report(report, args)


def _bench_step(args) -> tuple:
    """``(step factory or None, its name)`` of the bench's ``--step`` / ``--consumer``."""
    if args.step:
        return _step_factory(args.step), args.step
    if args.consumer == "gather":
        return _step_factory(None), "built-in gather consumer"
    if args.consumer == "real":
        from staticattn.consumers.real import real_consumer_step, real_consumers_available

        have = real_consumers_available()
        names = " + ".join(k for k, v in sorted(have.items()) if v)
        return real_consumer_step, f"real kernels ({names})"
    return None, "metadata only"


def _save_report(report, args: argparse.Namespace) -> int:
    """Write ``--json`` and ``--plot`` where asked; the exit status of ``bench``."""
    if args.json:
        with open(args.json, "w") as f:
            f.write(report.to_json())
    if args.plot:
        if hasattr(report, "plot"):
            report.plot(args.plot)
        else:
            print(f"bench: this report has no plot; --plot {args.plot} ignored")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line: ``demo``, ``check`` or ``bench`` (``--help`` for each); the
    exit status."""
    p = argparse.ArgumentParser(prog="staticattn", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("demo", help="synthetic serving loop through the graph manager")
    d.add_argument("--steps", type=int, default=300)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--no-progress", action="store_true")
    d.add_argument("--consumer", choices=["gather", "real"], default="gather",
                   help="gather: the built-in consumer, every step replays; real: DeepGEMM + "
                   "FlashMLA (when installed) on decode graphs, steps with prefills eager")
    d.add_argument("--dcp", type=int, default=0, metavar="WORLD",
                   help="decode context parallelism over WORLD ranks, one process each: "
                   "torchrun --nproc-per-node WORLD -m staticattn demo --dcp WORLD")
    d.add_argument("--dcp-preset", choices=["deepseek-v4", "deepseek-v3.2"],
                   default="deepseek-v4", help="the model of the --dcp demo's arena")
    d.set_defaults(fn=cmd_demo)

    for name, fn, help_ in (("check", cmd_check, "graph-capture sanity checks"),
                            ("bench", cmd_bench, "replay-latency benchmark")):
        c = sub.add_parser(name, help=help_)
        c.add_argument("--preset", default="deepseek-v4", choices=["deepseek-v4", "deepseek-v3.2"])
        c.add_argument("--next-n", type=int, default=None, help="1 + speculative tokens")
        c.add_argument("--max-model-len", type=int, default=None)
        c.add_argument("--step", default=None, help="module:function(config) -> step")
        c.add_argument("--seed", type=int, default=0)
        c.set_defaults(fn=fn)
        if name == "check":
            c.add_argument("--sizes", type=int, nargs="*", default=None, help="tokens")
            c.add_argument("--batches", type=int, default=100, help="random replays per size")
            c.add_argument("--dot", default=None, help="folder for DOT dumps of each graph")
            c.add_argument("--json", nargs="?", const="-", default=None,
                           help="the report as JSON: to stdout (no value or -) instead of "
                           "the text, or into this file beside the text")
        else:
            c.add_argument("--no-progress", action="store_true")
            c.add_argument("--batch", type=int, nargs="*", default=None,
                           help="batch sizes in requests (default: every capture size)")
            c.add_argument("--reps", type=int, default=200)
            c.add_argument("--consumer", choices=["none", "gather", "real"], default="none",
                           help="the step after the metadata build: none, the built-in "
                           "gather consumer, or DeepGEMM + FlashMLA (when installed)")
            c.add_argument("--mix", action="store_true",
                           help="steps of a loaded server with chunked prefill (the reference "
                           "mixed batch on V4 n=1, n=2 and V3.2 n=1; a chunked-prefill trace), "
                           "token-bucket graphs vs the eager reference builds")
            c.add_argument("--breakdown", action="store_true",
                           help="host time per phase of the captured and eager paths, next "
                           "to the one-kernel launch floor")
            c.add_argument("--context", type=int, nargs="+", default=None, metavar="C",
                           help="contexts (tokens): the decode step with every context <= C "
                           "replayed through a graph captured for --max-model-len and one "
                           "captured for C (what a context bucket of C would hold)")
            c.add_argument("--dcp", type=int, default=0, metavar="WORLD",
                           help="decode context parallelism over WORLD ranks, one process "
                           "each: torchrun --nproc-per-node WORLD -m staticattn bench --dcp "
                           "WORLD (per-rank host and GPU time, the collectives' share, host "
                           "jitter across ranks, the same step on one GPU)")
            c.add_argument("--staging-guard", choices=["staging", "step"], default="staging",
                           help="where the graphs record the event the host waits for before "
                           "rewriting the staging (GraphOptions' staging_guard; batch sizes "
                           "and --breakdown)")
            c.add_argument("--json", default=None)
            c.add_argument("--plot", default=None, help="PNG of latency vs batch size")
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
