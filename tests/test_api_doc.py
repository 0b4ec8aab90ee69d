"""docs/api.md's example runs, and its figures are what a plain scan of the JSON gives."""

import re
from pathlib import Path

from conftest import DATA
from test_kernels import scanned

ROOT = Path(__file__).parent.parent


def test_the_example_runs_and_its_figures_are_the_traces(monkeypatch):
    (code,) = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "api.md").read_text(), re.S)
    monkeypatch.chdir(ROOT)
    namespace: dict = {}
    exec(compile(code, "docs/api.md", "exec"), namespace)
    want = scanned(DATA / "h200x2-blocks4" / "fsdp2" / "rank0.pt.trace.json.gz")
    comm = {name: v for name, v in want.items() if name.startswith("ncclDevKernel")}
    kinds = {"AllGather": "all_gather", "ReduceScatter": "reduce_scatter"}
    expected = {kind: [0, 0] for kind in kinds.values()}
    for name, (count, total) in comm.items():
        kind = kinds[name.split("_")[1]]
        expected[kind][0] += count
        expected[kind][1] += total
    got = {r["coll_kind"]: [r["count"], r["total_ns"]] for r in namespace["comm_by_kind"].to_dicts()}
    assert got == expected
    first = namespace["largest"].row(0, named=True)
    assert (first["name"], first["count"], first["total_ns"]) == max(
        ((n, c, t) for n, (c, t) in want.items()), key=lambda x: x[2])
    assert namespace["steps"].height == 2
