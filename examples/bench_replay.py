"""Measure replay latency from Python, read the JSON back, plot it.

On a GPU it measures: captures the decode graphs of a small DeepSeek-V4-like config, times
each step through the graph and through the eager build (host and GPU, medians with
min/max), writes the report's JSON and reads it back the way a dashboard would. Without CUDA
there is nothing to time (replay latency is a GPU measurement): the script says so, and what
it shows instead is the reading of a report, on the H200 figures published in
``docs/results``, labelled as such. Either way ``--plot`` draws them when matplotlib (the
``plot`` extra) is installed, and says how to install it when not.

    python -m examples.bench_replay [--out bench.json] [--plot bench.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from staticattn import ArenaConfig, run_bench
from staticattn.builders import IndexerMetadataBuilder, SparseSWAMetadataBuilder

PUBLISHED = Path(__file__).resolve().parents[1] / "docs" / "results" / "bench_v4_h200.json"


def measure(out: Path) -> None:
    cfg = ArenaConfig.deepseek_v4(max_num_seqs=64, max_model_len=65536, device="cuda")
    report = run_bench(cfg, lambda: [IndexerMetadataBuilder(), SparseSWAMetadataBuilder()],
                       None, sizes=[2, 16, 64, 128], reps=100, preset="deepseek_v4 64K",
                       progress=False)
    print(report.header())
    print(report.table())
    out.write_text(report.to_json())


def summarize(data: dict) -> list[tuple[int, float, float, float]]:
    """``(requests, graph host us, eager host us, host ratio)`` per row of a report's JSON."""
    return [(r["num_reqs"], r["graph_host_us"]["median"], r["eager_host_us"]["median"],
             r["host_ratio"]) for r in data["rows"]]


def plot(data: dict, path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print(f"no plot: --plot {path} needs matplotlib, the plot extra (pip install "
              "matplotlib, or pip install '.[plot]' in the clone)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["num_reqs"] for r in data["rows"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("graph_gpu_us", "graph replay (GPU)"), ("eager_gpu_us", "eager (GPU)"),
                       ("graph_host_us", "graph replay (host)"),
                       ("eager_host_us", "eager (host)")):
        ax.plot(sizes, [r[key]["median"] for r in data["rows"]], "o-", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("requests per decode step")
    ax.set_ylabel("us per step (median)")
    ax.set_title(data["env"]["device"], fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench.json"))
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    if torch.cuda.is_available():
        measure(args.out)
        data = json.loads(args.out.read_text())
        print(f"measured here, on {data['env']['device']} ({args.out}):")
    else:
        print("no CUDA device: nothing is measured here (replay latency is a GPU measurement); "
              "what follows shows how to read a report, on published figures")
        data = json.loads(PUBLISHED.read_text())
        print(f"published, not this machine: {data['env']['device']} "
              f"(docs/results/{PUBLISHED.name}):")
    print(f"{'requests':>8} {'graph host us':>14} {'eager host us':>14} {'eager / graph':>14}")
    for num_reqs, graph, eager, ratio in summarize(data):
        print(f"{num_reqs:>8} {graph:>14.1f} {eager:>14.1f} {ratio:>14.1f}")
    if args.plot is not None:
        plot(data, args.plot)


if __name__ == "__main__":
    main()
