"""The command line's arguments: the parser, and every check an argument gets before the
command says or does anything else (an invalid argument exits 2 with one line naming it)."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

from staticattn.errors import StepSpecError
from staticattn.model import PRESETS as MODEL_PRESETS

__all__ = ["ExitCode", "build_parser", "config_overrides", "load_step", "validate"]


class ExitCode(enum.IntEnum):
    """The exit status of every command, one meaning each."""

    PASS = 0  #: every check passed (bench: measured)
    FAIL = 1  #: a check failed
    BAD_ARGUMENT = 2  #: a bad argument, named on one line (argparse's own status)
    SKIPPED = 3  #: nothing could run here (bench without CUDA), said why


#: The presets every command takes (``staticattn.model.PRESETS``), and those ``--dcp`` serves
#: (every one without image spans).
PRESETS = tuple(MODEL_PRESETS)
DCP_PRESETS = tuple(n for n in PRESETS if not MODEL_PRESETS[n].fields.get("max_image_tokens"))
MAX_SEED = 2**32 - 1

DESCRIPTION = """\
staticattn: sparse-attention metadata (DeepSeek V3.2 indexer, V4 sparse SWA, V4.1 c1a/c2a)
built inside CUDA graphs from a static buffer arena.

  demo   a synthetic serving loop, every step checked (without CUDA: run eagerly on the
         CPU and checked against the reference)
  check  graph-capture sanity checks of a step (without CUDA: the checks that need no
         capture, on the same step)
  bench  replay latency per batch size, and other benches (needs CUDA)

Batch sizes are counted in requests and contexts in tokens, in every command.
Exit status: 0 pass, 1 fail, 2 bad argument (named on one line), 3 skipped (nothing
could run here, e.g. bench without CUDA; said why).
'staticattn COMMAND --help' describes each command's flags."""

#: The bench flags each other bench does not use (an error when given, rather than ignored).
UNUSED = {
    "--mix": ("batch_requests", "consumer", "step", "staging_guard", "next_n",
              "max_model_len", "preset", "compare"),
    "--breakdown": ("batch_requests", "consumer", "step", "compare"),
    "--context": ("staging_guard", "compare"),
    "--dcp": ("consumer", "step", "staging_guard", "next_n", "max_model_len", "compare"),
    "--pcp": ("consumer", "step", "staging_guard", "next_n", "max_model_len", "compare",
              "preset", "batch_requests"),
}

def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an int in ``[low, high]`` (no upper bound when None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The ``staticattn`` parser: ``demo``, ``check`` and ``bench``, every flag with help."""
    # No abbreviations: a renamed flag's old spelling must not pass as a prefix of the new.
    p = argparse.ArgumentParser(prog="staticattn", description=DESCRIPTION, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    d = sub.add_parser("demo", help="a synthetic serving loop, every step checked",
                       allow_abbrev=False,
                       description="A synthetic serving loop with chunked prefill through the "
                       "graph manager. On a GPU every step replays a graph and is checked "
                       "against the eager reference build; without CUDA every step runs "
                       "eagerly on the CPU kernels and is checked against the reference "
                       "build and the plain-Python reference. Ends with a PASS or FAIL line; "
                       "exit 0 on PASS, 1 on FAIL.")
    d.add_argument("--steps", type=int_in(1), default=None,
                   help="steps to run (default: 300 with CUDA, 60 without)")
    d.add_argument("--preset", default="deepseek-v4", choices=PRESETS,
                   help="the model of the arena (default: deepseek-v4); without CUDA its "
                   "capacities are shrunk (32 requests, 1024 tokens, 16K context)")
    d.add_argument("--seed", type=int_in(0, MAX_SEED), default=0,
                   help="seed of the random requests (default: 0)")
    d.add_argument("--consumer", choices=["gather", "real"], default="gather",
                   help="gather: the built-in consumer, every step replays; real: DeepGEMM + "
                   "FlashMLA on decode graphs, steps with prefills eager (falls back to "
                   "gather, saying why, where neither library can run)")
    d.add_argument("--dcp", type=int_in(2), default=None, metavar="WORLD",
                   help="decode context parallelism over WORLD >= 2 ranks, one process each: "
                   "torchrun --nproc-per-node WORLD -m staticattn demo --dcp WORLD")
    d.add_argument("--dcp-preset", choices=DCP_PRESETS, default="deepseek-v4",
                   help="the model of the --dcp demo's arena (default: deepseek-v4)")
    d.add_argument("--dcp-deadline", type=int_in(1), default=30, metavar="SECONDS",
                   help="the --dcp / --pcp step deadline: a rank that dies or stalls is a typed "
                   "error (RankFailureError, RankTimeoutError) on every rank within it "
                   "(default: 30)")
    _pcp_flags(d)
    for name, help_, text in (
            ("check", "graph-capture sanity checks (without CUDA: those that need no capture)",
             "Capture a step (the built-in gather consumer, or --step) per batch size under "
             "guards and replay it against eager runs on random batches: host syncs, "
             "allocations, addresses, replay vs eager, staging races. Without CUDA, on the "
             "same step at smaller capacities (32 requests, 1024 tokens, 16K context unless "
             "--max-model-len): random steps run eagerly, the step through the graph builds "
             "(staging kernels included) against the step through the reference builds, "
             "the metadata against the plain-Python reference, and the replay emulated at "
             "the capture extents against the step at its own; then what needs a GPU. Ends "
             "with a PASS or FAIL line; exit 0 on PASS, 1 on FAIL, 2 on a bad argument."),
            ("bench", "replay latency per batch size (needs CUDA)",
             "Host and GPU time of a step replayed through its graph against the same step "
             "run eagerly, per batch size; --mix, --breakdown, --context, --dcp and --pcp "
             "measure other things (one at a time). Without CUDA only --dcp and --pcp run "
             "(gloo ranks on the CPU); anything else says SKIPPED and exits 3.")):
        c = sub.add_parser(name, help=help_, description=text, allow_abbrev=False)
        _config_flags(c)
        if name == "check":
            c.add_argument("--batch-requests", type=int_in(1), nargs="+", default=None,
                           metavar="R", help="batch sizes to capture, in requests (default: "
                           "the smallest, a middle and the largest capture size)")
            c.add_argument("--batches", type=int_in(1), default=None,
                           help="random batches replayed per batch size, each also run "
                           "eagerly (default: 100); without CUDA, random steps run eagerly "
                           "(default: 20)")
            c.add_argument("--dot", default=None, metavar="DIR",
                           help="write a DOT dump of each captured graph into DIR")
        else:
            _bench_flags(c)
            _pcp_flags(c)
    for c in sub.choices.values():  # demo, check, bench
        c.set_defaults(cmd_parser=c)
        c.add_argument("--no-progress", action="store_true", help="no progress bars")
        c.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                       help="print the result as JSON: to stdout (no value, or -) instead "
                       "of the text, or into this file beside the text")
    return p


def _pcp_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("--pcp", type=int_in(2), default=None, metavar="WORLD",
                   help="prefill context parallelism over WORLD >= 2 ranks, one process each: "
                   f"torchrun --nproc-per-node WORLD -m staticattn {c.prog.split()[-1]} "
                   "--pcp WORLD; with --dcp WORLD too, the KV sharded over the same ranks")
    c.add_argument("--pcp-preset", choices=PRESETS, default="deepseek-v3.2",
                   help="the model of the --pcp run's arena (default: deepseek-v3.2; "
                   "deepseek-v4.1-*: in graphs too, although the reference runs its PCP "
                   "eagerly; deepseek-v4*: a typed error saying why)")
    c.add_argument("--pcp-next-n", type=int_in(1, 8), default=1, metavar="N",
                   help="tokens a decode row of the --pcp run verifies at most: 1 + single-"
                   "module MTP's draft tokens (default: 1; deepseek-v3.2 only: V4.1's PCP "
                   "takes no speculative decoding, a typed error)")


def _config_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("--preset", default="deepseek-v4", choices=PRESETS,
                   help="the model of the arena (default: deepseek-v4)")
    c.add_argument("--next-n", type=int_in(1, 16), default=None,
                   help="tokens per decode request: 1 + speculative tokens (default: the "
                   "preset's)")
    c.add_argument("--max-model-len", type=int_in(1), default=None, metavar="TOKENS",
                   help="the context limit in tokens (default: the preset's, 1M for "
                   "deepseek-v4 and deepseek-v4.1-*, 160K for deepseek-v3.2)")
    c.add_argument("--step", default=None, metavar="MODULE:FUNCTION",
                   help="your step instead of the built-in one: FUNCTION(config) returns a "
                   "callable (batch, metadata) -> outputs")
    c.add_argument("--seed", type=int_in(0, MAX_SEED), default=0,
                   help="seed of the random batches (default: 0)")


def _bench_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("--batch-requests", type=int_in(1), nargs="+", default=None, metavar="R",
                   help="batch sizes, in requests (default: every capture size; --context: "
                   "32; --dcp: 1 8 16)")
    c.add_argument("--reps", type=int_in(1), default=200,
                   help="timed steps per batch size (default: 200)")
    c.add_argument("--consumer", choices=["none", "gather", "real"], default="none",
                   help="the step after the metadata build: none, the built-in gather "
                   "consumer, or DeepGEMM + FlashMLA (default: none)")
    c.add_argument("--compare", choices=PRESETS, nargs="+", default=None, metavar="PRESET",
                   help="the same bench on these presets too, their rows beside --preset's "
                   "with the ratios to it (e.g. --preset deepseek-v4 --compare "
                   "deepseek-v4.1-flash; the batch-size bench only)")
    c.add_argument("--mix", action="store_true",
                   help="steps of a loaded server with chunked prefill (the reference mixed "
                   "batch on V4 n=1, n=2 and V3.2 n=1; a chunked-prefill trace), token-bucket "
                   "graphs vs the eager reference builds")
    c.add_argument("--breakdown", action="store_true",
                   help="host time per phase of the captured and eager paths, next to the "
                   "one-kernel launch floor")
    c.add_argument("--context", type=int_in(1), nargs="+", default=None, metavar="TOKENS",
                   help="contexts in tokens: the decode step with every context <= C replayed "
                   "through a graph captured for --max-model-len and one captured for C")
    c.add_argument("--dcp", type=int_in(2), default=None, metavar="WORLD",
                   help="decode context parallelism over WORLD >= 2 ranks, one process each: "
                   "torchrun --nproc-per-node WORLD -m staticattn bench --dcp WORLD")
    c.add_argument("--staging-guard", choices=["staging", "step"], default="staging",
                   help="where the graphs record the event the host waits for before "
                   "rewriting the staging: after the staging kernels or at the step's end "
                   "(default: staging)")
    c.add_argument("--plot", default=None, metavar="PNG",
                   help="a plot of the batch-size or --mix bench (needs matplotlib: the plot "
                   "extra)")


def config_of(args: argparse.Namespace, device: str, preset: str | None = None):
    """The ArenaConfig of ``check`` / ``bench`` arguments on ``device`` (of ``preset``
    instead of ``--preset`` when given: a ``--compare`` preset)."""
    from staticattn.arena import ArenaConfig

    return ArenaConfig.preset(preset or args.preset, device=device, **config_overrides(args))


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields ``--next-n`` and ``--max-model-len`` set (those given)."""
    overrides: dict[str, Any] = {}
    if args.next_n is not None:
        overrides["num_speculative_tokens"] = args.next_n - 1
    if args.max_model_len is not None:
        overrides["max_model_len"] = args.max_model_len
    return overrides


def load_step(spec: str) -> Callable:
    """The function ``module:function`` names, or :class:`StepSpecError` saying why not."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise StepSpecError(f"--step {spec!r}: expected MODULE:FUNCTION, e.g. my_steps:make")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise StepSpecError(f"--step {spec}: cannot import {module_name!r}: "
                            f"{type(exc).__name__}: {exc}") from None
    try:
        value = getattr(module, name)
    except AttributeError:
        raise StepSpecError(f"--step {spec}: module {module_name!r} has no attribute "
                            f"{name!r}") from None
    if not callable(value):
        raise StepSpecError(f"--step {spec}: {module_name}.{name} is a "
                            f"{type(value).__name__}, not a function of the config")
    return value


def validate(args: argparse.Namespace, cuda: bool) -> None:
    """Check what argparse cannot (combinations, bounds from the config, the step, the
    plot); ``args.cmd_parser.error`` (exit 2) on the first problem."""
    error = args.cmd_parser.error
    if getattr(args, "pcp", None) is not None:
        _validate_pcp(args, error)
    elif getattr(args, "pcp_next_n", 1) != 1:
        error("--pcp-next-n: only a --pcp run reads it (a single-GPU bench takes --next-n)")
    if args.cmd == "demo":
        return
    if args.cmd == "bench":
        # With --pcp, --dcp says how the PCP ranks shard the KV: one bench.
        modes = [f"--{m}" for m in ("mix", "breakdown", "context", "dcp", "pcp")
                 if getattr(args, m) not in (None, False)
                 and not (m == "dcp" and args.pcp is not None)]
        if len(modes) > 1:
            error(f"{' and '.join(modes)}: one bench at a time")
        if args.plot is not None:
            if modes and modes[0] != "--mix":
                error(f"--plot: {modes[0]} has no plot (the batch-size and --mix benches do)")
            if args.compare:
                error("--plot: --compare has no plot (one preset's batch-size bench has)")
            if importlib.util.find_spec("matplotlib") is None:
                error("--plot needs matplotlib, the plot extra: pip install matplotlib (or "
                      "pip install '.[plot]' in a clone of staticattn)")
        if args.step and args.consumer != "none":
            error(f"--step and --consumer {args.consumer}: one step at a time")
        ignored = [f"--{name.replace('_', '-')}" for name in UNUSED.get(modes[0], ())
                   if getattr(args, name) != args.cmd_parser.get_default(name)] if modes else []
        if ignored:
            error(f"{modes[0]} times fixed steps of its own: {', '.join(ignored)} would be "
                  "ignored")
        if args.pcp is not None:
            return  # its own small arena per rank (distributed/pcp_world.py)
        if args.dcp is not None:
            if args.preset not in DCP_PRESETS:
                error(f"--preset {args.preset}: decode context parallelism does not serve it "
                      f"(its layer types or image spans); --dcp takes "
                      f"{', '.join(DCP_PRESETS)}")
            return  # its own small arena per rank (distributed/world.py)
        if args.consumer == "real" and cuda:
            from staticattn.kernels.runtime.dsa_libs import available, import_error

            if not any(available().values()):
                why = "; ".join(f"{name}: {import_error(name)}" for name in sorted(available()))
                error(f"--consumer real: no real consumer can run here ({why})")
    from staticattn.errors import ConfigError

    try:
        for preset in getattr(args, "compare", None) or ():
            config_of(args, "cuda" if cuda else "cpu", preset)
        cfg = config_of(args, "cuda" if cuda else "cpu")
    except ConfigError as exc:
        error(str(exc))
    if args.batch_requests:
        most = min(cfg.max_num_seqs, cfg.max_num_batched_tokens // cfg.next_n)
        over = [r for r in args.batch_requests if r > most]
        if over:
            error(f"--batch-requests {' '.join(map(str, over))}: at most {most} requests fit "
                  f"a step of {args.preset} (max_num_seqs {cfg.max_num_seqs}, "
                  f"{cfg.max_num_batched_tokens} tokens of next_n {cfg.next_n})")
    if getattr(args, "context", None):
        over = [c for c in args.context if c > cfg.max_model_len]
        if over:
            error(f"--context {' '.join(map(str, over))}: beyond --max-model-len "
                  f"{cfg.max_model_len}")
    if args.step:
        try:
            load_step(args.step)
        except StepSpecError as exc:
            error(str(exc))


def _validate_pcp(args: argparse.Namespace, error: Callable[[str], Any]) -> None:
    """``--pcp``: the configuration the run would build, refused here as the typed error
    it raises (the reference's refusals, then what is not served yet)."""
    from staticattn.distributed.pcp_world import configs
    from staticattn.errors import ConfigError

    dcp = getattr(args, "dcp", None) or 1
    try:
        configs(args.pcp_preset, args.pcp, "cpu", pcp_sizes(args), dcp)
    except ConfigError as exc:
        error(f"--pcp {args.pcp} --dcp {dcp} --pcp-preset {args.pcp_preset} --pcp-next-n "
              f"{args.pcp_next_n}: ConfigError: {exc}")


def pcp_sizes(args: argparse.Namespace):
    """The ``--pcp`` run's capacities (:data:`~staticattn.distributed.pcp_world.
    DEFAULT_SIZES`, decode rows of ``--pcp-next-n`` tokens at most)."""
    from staticattn.distributed.pcp_world import DEFAULT_SIZES

    return dataclasses.replace(DEFAULT_SIZES, num_speculative_tokens=args.pcp_next_n - 1)
