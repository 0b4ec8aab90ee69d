"""The trace cache: a hit gives the same trace and the same output, a changed file or another
schema is a miss, a corrupt entry is ignored and written again, --no-cache skips it."""

import json
import os

import synth
from click.testing import CliRunner

import tracekit
from tracekit.core import cache
from tracekit.front.cli import main


def trace_file(tmp_path, dur=5.0):
    events = [synth.step(1, 0.0, 100.0), *synth.launched("k", 1.0, 10.0, dur, corr=1),
              *synth.nccl("all_gather", 2.0, 12.0, 4.0, corr=2)]
    return synth.write(tmp_path, "rank0.trace.json", synth.doc(events))


def summary_json(*args):
    result = CliRunner().invoke(main, ["summary", "--format", "json", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_a_hit_gives_the_same_output_without_decoding(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    path = trace_file(tmp_path)
    cold = summary_json(path)
    cache.writer().submit(lambda: None).result()  # the background writes are done
    assert cache.info()["entries"] == 1

    def no_decoding(*args):
        raise AssertionError("decoded again")

    monkeypatch.setattr(tracekit.core.loading, "decode", no_decoding)
    assert summary_json(path) == cold
    with_other_path = summary_json(os.path.relpath(path))  # the same file named otherwise: the output names it so
    assert json.loads(with_other_path)["traces"][0]["path"] == os.path.relpath(path)


def test_a_changed_file_another_schema_or_no_cache_is_a_miss(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    path = trace_file(tmp_path)
    first = json.loads(summary_json(path))["traces"][0]["steps"][0]["gpu_span_ns"]
    cache.writer().submit(lambda: None).result()
    trace_file(tmp_path, dur=50.0)  # the same path, another size and time
    assert json.loads(summary_json(path))["traces"][0]["steps"][0]["gpu_span_ns"] != first
    cache.writer().submit(lambda: None).result()
    decoded = []
    real = tracekit.core.loading.decode
    monkeypatch.setattr(tracekit.core.loading, "decode", lambda *a: decoded.append(1) or real(*a))
    summary_json("--no-cache", path)
    assert decoded == [1]
    monkeypatch.setattr(cache, "SCHEMA", cache.SCHEMA + 1)
    summary_json(path)
    assert decoded == [1, 1]


def test_a_corrupt_entry_is_ignored_and_written_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    path = trace_file(tmp_path)
    cold = summary_json(path)
    cache.writer().submit(lambda: None).result()
    (entry,) = (tmp_path / "cache").iterdir()
    (entry / "gpu.arrow").write_bytes(b"not arrow")
    assert summary_json(path) == cold
    cache.writer().submit(lambda: None).result()
    assert (entry / "gpu.arrow").read_bytes()[:6] == b"ARROW1"


def test_the_cache_is_bounded_and_can_be_cleared(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TRACEKIT_CACHE_MAX_GB", "0")  # every new entry pushes the older ones out
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        summary_json(trace_file(folder))
        cache.writer().submit(lambda: None).result()
    assert cache.info()["entries"] <= 1
    result = CliRunner().invoke(main, ["cache", "clear"])
    assert result.exit_code == 0 and cache.info()["entries"] == 0


def test_a_rewrite_with_the_same_size_and_mtime_is_a_miss(tmp_path, monkeypatch):
    """`cp -p` / `rsync -t` keep size and mtime; the change time and inode still differ."""
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    path = trace_file(tmp_path, dur=5.0)
    before = os.stat(path)
    first = json.loads(summary_json(path))["traces"][0]["steps"][0]["gpu_span_ns"]
    cache.writer().submit(lambda: None).result()
    (tmp_path / "new").mkdir()
    other = trace_file(tmp_path / "new", dur=7.0)  # same length of text: 5.0 → 7.0
    os.replace(other, path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_size == before.st_size and os.stat(path).st_mtime_ns == before.st_mtime_ns
    assert json.loads(summary_json(path))["traces"][0]["steps"][0]["gpu_span_ns"] != first


def test_a_url_is_keyed_by_its_version(monkeypatch):
    """Two versions of one URL (another ETag, the same size) are two cache keys."""
    from tracekit.core import files

    version = {"ETag": '"a"'}

    class Server:
        def info(self, path):
            return {"size": 10, **version}

    monkeypatch.setattr(files, "_fs", lambda location: (Server(), location))
    first = files.identity("https://example.org/t.json")
    version["ETag"] = '"b"'
    assert files.identity("https://example.org/t.json") != first
    version["Last-Modified"] = "Tue, 01 Dec 2026 09:00:00 GMT"
    assert files.identity("https://example.org/t.json")["version"]["Last-Modified"].startswith("Tue")


def test_an_interrupted_write_is_seen_and_cleared(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    left = tmp_path / "cache" / ".tmp-0123"
    left.mkdir(parents=True)
    (left / "gpu.arrow").write_bytes(b"x" * 100)
    assert (cache.info()["entries"], cache.info()["unfinished"], cache.info()["bytes"]) == (1, 1, 100)
    monkeypatch.setenv("TRACEKIT_CACHE_MAX_GB", "0")
    cache.evict()
    assert not left.exists()
    left.mkdir()
    assert CliRunner().invoke(main, ["cache", "clear"]).exit_code == 0 and not left.exists()
