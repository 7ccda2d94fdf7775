"""pytest plugin: assert in your own test suite that a step is safe to capture.

Registered through the ``pytest11`` entry point ``staticattn`` (installing staticattn, from
a clone or a git URL, is enough; without installing, ``-p staticattn.checks.pytest_plugin``).
Registering it costs a pytest run nothing: this module imports only pytest, and torch and
the checker load when a test first calls the fixture. A test reads::

    def test_my_step_is_graph_safe(assert_graph_safe):
        cfg = ArenaConfig.deepseek_v4(max_model_len=8192, max_num_seqs=16)
        report = assert_graph_safe(MyStep(cfg), config=cfg, sizes=[2, 16])
        assert "host_read" not in report.kinds()

``assert_graph_safe`` (the fixture, or the function of this module) runs
:func:`~staticattn.checks.check_graph_safety`, skips the test cleanly when there is no CUDA
device, fails it with the text report when the check finds an error
(:class:`GraphSafetyError`, whose ``report`` holds the structured findings), and returns the
:class:`~staticattn.checks.CheckReport` otherwise (notes included).

Options: ``--graph-safety-batches N`` (randomized replays per size; default 20) and
``--graph-safety-json DIR`` (each report as JSON, one file per test).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = ["GraphSafetyError", "assert_graph_safe"]

DEFAULT_BATCHES = 20


class GraphSafetyError(AssertionError):
    """A failed graph-safety check; ``report`` is the :class:`~staticattn.checks.CheckReport`."""

    def __init__(self, report) -> None:
        super().__init__(f"the step is not graph-safe:\n{report}")
        self.report = report


def assert_graph_safe(
    step: Callable,
    *,
    config=None,
    builders: Sequence | None = None,
    arena=None,
    inputs=None,
    sizes: Sequence[int] | None = None,
    batches: int = DEFAULT_BATCHES,
    seed: int = 0,
    json_path: str | Path | None = None,
    **check_kwargs: Any,
):
    """Check ``step`` for graph safety; skip without CUDA, raise on any error.

    Parameters
    ----------
    step : callable ``(batch, metadata) -> outputs``
        The step under test (outputs: tensors, leading dimension tokens).
    config : ArenaConfig, optional
        Builds the arena and the default builders (``default_builders(config)``: an
        indexer per index type, compressed KV and sparse SWA where the config's layer types
        need them; DeepSeek V4.1 included). Ignored when ``arena`` and ``inputs`` are given.
    builders, arena, inputs : optional
        An arena of your own (from :func:`staticattn.builders.make_arena`) and its builders.
    sizes, batches, seed, check_kwargs
        Passed to :func:`~staticattn.checks.check_graph_safety` (``batches`` as
        ``num_batches``; ``before_batch``, ``write_staging``, ``num_kv_blocks`` ...).
    json_path : path, optional
        Write the report as JSON there (pass or fail).

    Returns
    -------
    CheckReport
        Verdict PASS; ``report.notes`` lists what is allowed but worth knowing.
    """
    __tracebackhide__ = True
    import torch

    if not torch.cuda.is_available():
        pytest.skip("graph safety needs a CUDA device (CUDA graphs are captured)")
    from staticattn.checks import check_graph_safety

    if arena is None or inputs is None:
        if config is None:
            raise TypeError("assert_graph_safe needs config=, or arena= and inputs=")
        from staticattn.builders import default_builders, make_arena

        builders = default_builders(config) if builders is None else builders
        arena, inputs = make_arena(config, builders)
    elif builders is None:
        raise TypeError("assert_graph_safe with arena= and inputs= needs builders= too")
    report = check_graph_safety(arena, inputs, builders, step, sizes=sizes,
                                num_batches=batches, seed=seed, **check_kwargs)
    if json_path is not None:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(report.to_json())
    if not report.ok:
        raise GraphSafetyError(report)
    return report


def pytest_addoption(parser) -> None:
    group = parser.getgroup("staticattn", "staticattn graph-safety checks")
    group.addoption("--graph-safety-batches", type=int, default=DEFAULT_BATCHES,
                    help="randomized replays per captured size (default %(default)s)")
    group.addoption("--graph-safety-json", default=None, metavar="DIR",
                    help="write every graph-safety report as JSON into DIR")


@pytest.fixture(name="assert_graph_safe")
def assert_graph_safe_fixture(request) -> Callable:
    """:func:`assert_graph_safe` with the command line's batches and JSON folder."""
    options = request.config.option
    folder = getattr(options, "graph_safety_json", None)
    batches = getattr(options, "graph_safety_batches", DEFAULT_BATCHES)
    calls = 0

    def check(step: Callable, **kwargs: Any):
        __tracebackhide__ = True
        nonlocal calls
        calls += 1
        kwargs.setdefault("batches", batches)
        if folder is not None and "json_path" not in kwargs:
            name = re.sub(r"[^\w.-]+", "_", request.node.nodeid)
            kwargs["json_path"] = Path(folder) / f"{name}-{calls}.json"
        return assert_graph_safe(step, **kwargs)

    return check
