"""The --workers default: processes only for traces that are not in the cache."""

from conftest import DATA

from tracekit.core import cache, files, runs

FILES = [str(DATA / "h200x2-blocks4" / "fsdp2" / f"rank{r}.pt.trace.json.gz") for r in (0, 1)]


def test_one_worker_per_share_of_uncached_bytes_none_when_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "folder", lambda: tmp_path)
    monkeypatch.setattr(runs, "cores", lambda: 8)
    size = files.identity(FILES[0])["size"]
    monkeypatch.setattr(runs, "PARALLEL_BYTES", size)
    assert runs.default_workers(FILES, (), None) == 2  # two files, two shares: one each
    monkeypatch.setattr(runs, "PARALLEL_BYTES", 10 * size)
    assert runs.default_workers(FILES, (), None) == 1  # too little to pay for a process
    monkeypatch.setattr(runs, "PARALLEL_BYTES", 1)
    monkeypatch.setattr(runs, "cores", lambda: 1)
    assert runs.default_workers(FILES, (), None) == 1  # at most one per core
    monkeypatch.setattr(runs, "cores", lambda: 8)
    entry = tmp_path / cache.key(files.identity(FILES[0]), ())
    entry.mkdir()
    (entry / "trace.json").write_text("{}")
    assert runs.default_workers(FILES, (), None) == 1  # one file left to decode
    assert runs.default_workers(FILES, (), False) == 2  # --no-cache: both
