"""The figures the README and the guides quote are those of the result files they name: a
figure copied by hand, or a result file replaced without its quotes, fails here."""

from __future__ import annotations

import json
import re

from helpers.paths import ROOT

RESULTS = ROOT / "docs" / "results"


def _section(text: str, start: str, end: str) -> str:
    return text[text.index(start):text.index(end, text.index(start))]


def test_the_readme_table_is_the_published_bench():
    readme = (ROOT / "README.md").read_text()
    table = _section(readme, "| batch (requests) |", "\n\n")
    rows = [[float(x) for x in line.strip("|").split("|")]
            for line in table.splitlines()[2:]]
    assert len(rows) >= 3
    assert "`docs/results/bench_v4_h200.json`" in readme
    published = {r["num_reqs"]: r for r in
                 json.loads((RESULTS / "bench_v4_h200.json").read_text())["rows"]}
    keys = ("in_place_host_us", "graph_host_us", "graph_gpu_us", "eager_host_us",
            "eager_gpu_us")
    for reqs, *figures in rows:
        row = published[int(reqs)]
        assert figures == [round(row[k]["median"], 1) for k in keys], int(reqs)


def _run_d_totals() -> dict[str, float]:
    text = (RESULTS / "breakdown_h200.txt").read_text()
    run_d = _section(text, "D, --staging-guard staging (default):", "D, --preset deepseek-v3.2:")
    return {line.split(":")[0]: float(line.rsplit("total ", 1)[1])
            for line in run_d.splitlines() if "total " in line}


def test_the_guides_quote_the_breakdown_the_results_page_quotes():
    """The embedding guide's launch-plan figures are run D's, as on the results page."""
    totals = _run_d_totals()
    want = [totals['run(eager="graph"), decode'], totals['run(eager="graph"), decode, no plans'],
            totals['run(eager="graph"), reference mixed batch'],
            totals['run(eager="graph"), reference mixed batch, no plans']]
    guide = " ".join((ROOT / "docs" / "embedding.md").read_text().split())
    quoted = re.search(r"costs ([\d.]+) µs of host this way against ([\d.]+) µs plain, the "
                       r"reference mixed batch ([\d.]+) µs against ([\d.]+) µs", guide)
    assert quoted and [float(x) for x in quoted.groups()] == want
    page = " ".join((RESULTS / "README.md").read_text().split())
    assert (f"costs **{want[0]} µs** of host through its plan against {want[1]} plainly" in page
            and f"the reference mixed batch **{want[2]} µs** against {want[3]}" in page)
