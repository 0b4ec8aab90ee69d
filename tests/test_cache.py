"""The trace cache: a hit gives the same trace and the same output, a changed file, another
decoder or other code is a miss, a corrupt entry is ignored and written again, --no-cache skips it."""

import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest
import synth
from click.testing import CliRunner

import tracekit
from tracekit.core import cache, ipc
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


def test_a_changed_file_other_code_or_no_cache_is_a_miss(tmp_path, monkeypatch):
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
    monkeypatch.setattr(cache, "fingerprint", lambda: "other code")
    summary_json(path)
    assert decoded == [1, 1]


def test_the_key_names_the_decoder_and_the_code(monkeypatch):
    """Found by a review: an entry made by the native decoder (then wrong) answered with
    TRACEKIT_NATIVE=0 too; the key now names the decoder, and the code (`fingerprint`: its
    files' bytes, the native extension's among them), not a number bumped by hand."""
    identity = {"path": "/x", "size": 1}
    monkeypatch.setenv("TRACEKIT_NATIVE", "1")
    native = cache.key(identity, ())
    monkeypatch.setenv("TRACEKIT_NATIVE", "0")
    assert cache.key(identity, ()) != native and cache.decoder() == "msgspec"
    assert not hasattr(cache, "SCHEMA")
    root = Path(tracekit.core.__file__).parent
    assert any(p.suffix == ".so" for p in cache.source_files(root))  # the native extension is code too


def test_changed_analysis_code_gives_a_fresh_answer_on_the_next_command(tmp_path, monkeypatch):
    """A table an analysis keeps in the entry (the summary's) is made again once the
    analysis' code changes: here the function is patched (one kernel more per row) and its
    file's bytes, which the key hashes. The function patched alone still gets the kept table
    (what a forgotten bump served before)."""
    from tracekit.analyses import summary

    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    path = trace_file(tmp_path)
    before = json.loads(summary_json(path))["traces"][0]["steps"]
    cache.writer().submit(lambda: None).result()
    monkeypatch.setattr(summary, "made_summary", lambda trace, scope, real=summary.made_summary:
                        real(trace, scope).with_columns(pl.col("kernels") + 1))
    assert json.loads(summary_json(path))["traces"][0]["steps"] == before  # the code's bytes unchanged
    edited = shutil.copytree(Path(summary.__file__).parent, tmp_path / "analyses")  # the code after the edit
    with open(edited / "summary.py", "a") as f:
        f.write("# kernels counted one more\n")
    monkeypatch.setattr(cache, "code_folders", lambda real=cache.code_folders: {**real(), "tracekit.analyses": edited})
    monkeypatch.setattr(cache, "fingerprint", cache.fingerprint.__wrapped__)  # computed again, not the kept one
    after = json.loads(summary_json(path))["traces"][0]["steps"]
    assert [row["kernels"] for row in after] == [row["kernels"] + 1 for row in before]


def test_a_corrupt_entry_is_ignored_and_written_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    path = trace_file(tmp_path)
    cold = summary_json(path)
    cache.writer().submit(lambda: None).result()
    (entry,) = (tmp_path / "cache").iterdir()
    (entry / "gpu.arrow").write_bytes(b"not arrow")
    assert summary_json(path) == cold
    cache.writer().submit(lambda: None).result()
    assert cache.read(entry.name) is not None  # written again, whole


def flipped(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["trace.json", "gpu.arrow", "ops.arrow", "derived-summary-step.arrow"])
def test_a_flipped_byte_anywhere_in_an_entry_is_a_miss_never_an_answer(tmp_path, monkeypatch, name):
    """Found by a review: a byte flipped in an entry was trusted — a count of 91 for 1,
    altered kernel names, a Rust abort, polars tracebacks. Each file is checked (CRC-32): a
    flip anywhere is a miss, the answer the fresh one's, and the entry is whole again after
    that one command."""
    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    path = trace_file(tmp_path)
    fresh = summary_json("--no-cache", path)
    summary_json(path)
    cache.writer().submit(lambda: None).result()
    (entry,) = (tmp_path / "cache").iterdir()
    size = (entry / name).stat().st_size
    for at in sorted({0, size - 1, *range(0, size, max(1, size // 12))}):
        flipped(entry / name, at)
        assert summary_json(path) == fresh, at
        cache.writer().submit(lambda: None).result()
        assert cache.read(entry.name) is not None and (entry / name).exists()
        assert cache.opened((entry / "trace.json").read_bytes(), cache.named(entry / "trace.json")) is not None
        if name.startswith("derived-"):
            assert cache.opened((entry / name).read_bytes(), cache.named(entry / name)) is not None  # made again, whole


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


def late_rank_run(folder, rank1_starts_at=60.0):
    """The late-rank run of test_critical_path: rank 0 enters an all-reduce at 10 µs (90 µs
    long), rank 1 computes from 5 µs and enters it at `rank1_starts_at` µs; rank 0's kernel
    waits until then, and is comm for the rest."""
    blocked = synth.call("cudaDeviceSynchronize", 5.0, 190.0, corr=9)
    rank0 = [synth.step(1, 0.0, 200.0), *synth.nccl("all_reduce", 1.0, 10.0, 90.0, corr=1), blocked]
    rank1 = [synth.step(1, 0.0, 200.0), *synth.launched("work", 1.0, 5.0, rank1_starts_at - 5.0, corr=1),
             *synth.nccl("all_reduce", 3.0, rank1_starts_at, 100.0 - rank1_starts_at, corr=2), blocked]
    folder.mkdir(exist_ok=True)
    synth.write(folder, "rank0.json", synth.doc(rank0, rank=0))
    synth.write(folder, "rank1.json", synth.doc(rank1, rank=1))
    return folder


def test_a_cached_run_is_reported_without_analysing_its_traces_again(tmp_path, monkeypatch):
    """What `report` reads of each trace — its critical path with the run's collective
    arrivals, its diff material, its summary — is kept in the trace cache: a later command
    (the traces read back from the cache) gives the same tables without making any of it."""
    from tracekit.analyses import critical_path, diff, summary
    from tracekit.analyses.variants import critical_split, recorded_step, variant_diffs

    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    runs = {"a": tracekit.load(late_rank_run(tmp_path / "a")), "b": tracekit.load(late_rank_run(tmp_path / "b", 30.0))}

    def answers():
        diffs = variant_diffs(runs, top=8)
        return (critical_split(runs), recorded_step(runs["b"]),
                [(d.all_items, d.syncs, d.collectives) for r in diffs.values() for d in r.per_rank])

    first = answers()
    cache.writer().submit(lambda: None).result()
    runs = {name: tracekit.load(tmp_path / name) for name in ("a", "b")}  # as a later command reads them

    def no_analysis(*args, **kwargs):
        raise AssertionError("analysed again")

    for module, name in ((critical_path, "path_split"), (critical_path, "heaviest"), (diff, "path_and_work"),
                         (diff, "host_syncs"), (diff, "collective_kernels"), (summary, "figures")):
        monkeypatch.setattr(module, name, no_analysis)
    again = answers()
    assert again[0].equals(first[0]) and again[1] == first[1]
    assert all(x.equals(y) for got, want in zip(again[2], first[2]) for x, y in zip(got, want))


def test_a_changed_rank_gives_every_rank_a_fresh_critical_path(tmp_path, monkeypatch):
    """Rank 0's critical path depends on when rank 1 arrives: rank 1 entering the all-reduce
    at 60 µs leaves rank 0's kernel (10–100 µs) 50 µs waiting and 40 µs comm; rewritten to
    enter at 30 µs, 20 µs waiting and 70 µs comm — though rank 0's own file, and its cache
    entry, did not change."""
    from tracekit.analyses.critical_path import run_critical_paths

    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))

    def rank0(starts_at):
        run = tracekit.load(late_rank_run(tmp_path / "run", starts_at))
        cache.writer().submit(lambda: None).result()
        row = run_critical_paths(run.traces)[0].row(0, named=True)
        return [i["ns"] for i in row["items"] if i["kind"] == "collective arrival"], row["comm_ns"]

    assert rank0(60.0) == rank0(60.0) == ([50_000], 40_000)  # the second one read from the cache
    assert rank0(30.0) == ([20_000], 70_000)


def test_a_report_makes_each_traces_launch_context_and_collective_kernels_once(tmp_path, monkeypatch):
    """In one command, without the trace cache: a diff's items and its idle parts read one
    launch context of the trace, its material and the run's collective arrivals one table of
    collective kernels — each made once per trace (two variants of two ranks: four each)."""
    from collections import Counter

    from tracekit.analyses import comms, phases
    from tracekit.analyses.variants import critical_split, variant_diffs

    monkeypatch.setenv("TRACEKIT_NO_CACHE", "1")
    runs = {"a": tracekit.load(late_rank_run(tmp_path / "a")), "b": tracekit.load(late_rank_run(tmp_path / "b", 30.0))}
    made = Counter()
    for module, name in ((phases, "autograd_threads"), (comms, "group_ranks")):  # one call per table made
        monkeypatch.setattr(module, name, lambda *a, real=getattr(module, name), name=name: made.update([name]) or real(*a))
    variant_diffs(runs, top=8)
    critical_split(runs)
    assert made == {"autograd_threads": 4, "group_ranks": 4}


def test_a_report_reads_each_traces_graph_nodes_once(tmp_path, monkeypatch):
    """In one command, without the trace cache: the diff's critical path (without arrivals)
    and the report's (with the run's arrivals) build two graphs of each trace from one reading
    of its events (two variants of two ranks: four readings, eight graphs)."""
    from collections import Counter

    from tracekit.analyses import path_graph
    from tracekit.analyses.variants import critical_split, variant_diffs

    monkeypatch.setenv("TRACEKIT_NO_CACHE", "1")
    runs = {"a": tracekit.load(late_rank_run(tmp_path / "a")), "b": tracekit.load(late_rank_run(tmp_path / "b", 30.0))}
    made = Counter()
    for name in ("nodes_of", "build"):
        monkeypatch.setattr(path_graph, name, lambda *a, real=getattr(path_graph, name), name=name: made.update([name]) or real(*a))
    variant_diffs(runs, top=8)
    critical_split(runs)
    assert made == {"nodes_of": 4, "build": 8}


def test_a_small_table_is_kept_as_a_stream_a_large_one_as_a_file_and_both_read_back_whole(tmp_path):
    small = pl.DataFrame({"name": ["a", "b", None], "ns": [1, 2, 3]}, schema_overrides={"name": pl.Categorical})
    large = pl.DataFrame({"ns": range(ipc.STREAM_BELOW // 8 + 1)})
    for frame, magic in ((small, b"\xff\xff\xff\xff"), (large, ipc.FILE_MAGIC)):
        ipc.write_table(frame, tmp_path / "t.arrow")
        stored = (tmp_path / "t.arrow").read_bytes()
        assert stored.startswith(magic)
        sealed = cache.sealed(stored, "entry/t.arrow")
        assert cache.opened(sealed, "entry/t.arrow") == stored
        assert cache.opened(sealed[:-1], "entry/t.arrow") is None
        assert cache.opened(sealed[:len(sealed) // 2], "entry/t.arrow") is None
        back = ipc.table_from(stored)
        assert back.schema == frame.schema and back.equals(frame)


def test_a_kept_answer_with_a_flipped_byte_is_not_an_answer(tmp_path, monkeypatch):
    """A kept answer is a cache entry too: one byte flipped anywhere in its file and it is not
    printed (the command runs), where a JSON that still parsed was printed before."""
    from tracekit.core import answers

    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path / "cache"))
    answers.write("k", [("stdout", "count 1\n")])
    path = tmp_path / "cache" / cache.ANSWERS / "k.json"
    assert answers.read("k")["output"] == [["stdout", "count 1\n"]]
    for at in range(path.stat().st_size):
        flipped(path, at)
        assert answers.read("k") is None, at
        flipped(path, at)  # put back
    assert answers.read("k") is not None


def test_a_whole_file_copied_to_another_place_of_the_cache_is_not_an_answer(tmp_path, monkeypatch):
    """A sealed file's check is bound to its place: another trace's derived table copied over
    this trace's, another derived table of the same entry copied over it, or another command's
    kept answer copied over this one's, each passes its own CRC but is not read (found by a
    new-user trial: `summary` printed the other trace's figures, then kept them as its answer)."""
    from tracekit.core import answers

    monkeypatch.setenv("TRACEKIT_CACHE_DIR", str(tmp_path))
    data = b"some table's bytes"
    for here, there in (("entry-a/derived-summary-step.arrow", "entry-b/derived-summary-step.arrow"),
                        ("entry-a/derived-summary-step.arrow", "entry-a/derived-lint-findings.arrow"),
                        ("answers/one.json", "answers/two.json")):
        assert cache.opened(cache.sealed(data, there), here) is None
        assert cache.opened(cache.sealed(data, here), here) == data
    answers.write("one", [("stdout", "the first answer\n")])
    (tmp_path / cache.ANSWERS / "two.json").write_bytes((tmp_path / cache.ANSWERS / "one.json").read_bytes())
    assert answers.read("one")["output"] == [["stdout", "the first answer\n"]] and answers.read("two") is None

