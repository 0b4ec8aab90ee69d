"""Bad bytes never crash: each case a review found (issue 66, `../shared/repro/bad-bytes`) gives
one clear line and exit 2, or the right answer, with the native decoder on and off, and both
paths give the same tables; a truncated file is read in time linear in its length; and a
fixed-seed fuzz campaign over the committed small traces finds no traceback, no signal and no
disagreement between the paths."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
from click.testing import CliRunner
from conftest import DATA, messages

from tracekit.core import files, loading, stream
from tracekit.core.errors import TraceError
from tracekit.front.cli import main

BASE = [b'{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 100, "dur": 50, '
        b'"args": {"External id": 1}}',
        b'{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 110, "dur": 5, '
        b'"args": {"correlation": 11, "External id": 1}}',
        b'{"ph": "X", "cat": "kernel", "name": "k1", "pid": 0, "tid": 7, "ts": 130, "dur": 10, '
        b'"args": {"device": 0, "stream": 7, "correlation": 11, "External id": 1}}']
OP = b'{"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": %s, "dur": 5%s}'


def trace(*extra: bytes, events=BASE, head=b'"schemaVersion": 1') -> bytes:
    """A small trace's text (one event a line, as Kineto writes it): `events`, then `extra`."""
    return b"{\n  " + head + b',\n  "traceEvents": [\n  ' + b",\n  ".join([*events, *extra]) + b"\n  ]\n}\n"


def cli(tmp_path, text: bytes, *args, native="1", cache=False, name="t.json"):
    """(exit code, stdout, stderr's messages) of `tracekit ARGS FILE` on `text`."""
    path = tmp_path / name
    if not path.exists() or path.read_bytes() != text:
        path.write_bytes(text)
    env = {"TRACEKIT_NATIVE": native, "TRACEKIT_NO_CACHE": "0" if cache else "1",
           "TRACEKIT_CACHE_DIR": str(tmp_path / "cache")}
    result = CliRunner().invoke(main, [*args, str(path)], env=env)
    assert "Traceback" not in result.output and not isinstance(result.exception, Exception) \
        or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stdout, messages(result.stderr)


def both(tmp_path, text: bytes, *args, **kwargs) -> tuple:
    """`cli` with the native decoder on and off: the same (exit code, output, messages)."""
    on, off = (cli(tmp_path, text, *args, native=n, **kwargs) for n in ("1", "0"))
    assert on == off
    return on


def loaded(tmp_path, text: bytes):
    """The file's traces with the decoder on and off: the same tables, metadata and facts."""
    path = tmp_path / "t.json"
    path.write_bytes(text)
    out = []
    for flag in ("1", "0"):
        with pytest.MonkeyPatch.context() as m:
            m.setenv("TRACEKIT_NATIVE", flag)
            out.append(loading.load_traces(path, cache=False))
    for a, b in zip(*out):
        for name in ("gpu", "calls", "ops", "marks", "steps"):
            assert getattr(a, name).equals(getattr(b, name)), name
        assert (a.meta, a.facts, a.origin_us) == (b.meta, b.facts, b.origin_us)
    return out[0]


def split_character(where: str) -> bytes:
    """D1: "é" (c3 a9) split across two adjacent kernels' names (or categories)."""
    kernels = [b'{"ph": "X", "cat": "kernel", "name": "kern_a\xc3", "pid": 0, "tid": 7, "ts": 130, "dur": 10, '
               b'"args": {"device": 0, "stream": 7, "correlation": 11}}',
               b'{"ph": "X", "cat": "kernel", "name": "\xa9kern_b", "pid": 0, "tid": 7, "ts": 145, "dur": 10, '
               b'"args": {"device": 0, "stream": 7, "correlation": 12}}']
    if where == "cat":
        kernels = [k.replace(b'"kern_a\xc3"', b'"kern_a"').replace(b'"\xa9kern_b"', b'"kern_b"') for k in kernels]
        kernels = [kernels[0].replace(b'"kernel"', b'"kernel\xc3"'), kernels[1].replace(b'"kernel"', b'"\xa9kernel"')]
    return trace(*kernels, events=BASE[:2])


@pytest.mark.parametrize("where", ["name", "cat"])
def test_a_character_split_across_two_events_is_replaced_on_both_paths_and_cached_alike(tmp_path, where):
    """D1: the native decoder checked the joined text, not each value: invalid UTF-8 reached
    polars (a Rust panic), and the entry it cached failed every later command, decoder on or
    off. Now each byte that is not UTF-8 is U+FFFD and counted, on both paths."""
    text = split_character(where)
    traces = loaded(tmp_path, text)
    assert traces[0].facts["replaced_text"] == 2
    if where == "name":
        assert sorted(traces[0].gpu["name"].to_list()) == ["kern_a\ufffd", "\ufffdkern_b"]
    for verb in ("kernels", "summary", "lint"):
        code, out, _ = both(tmp_path, text, verb, "--format", "json")
        assert code == 0
    uncached = cli(tmp_path, text, "kernels", "--format", "json", native="0")
    for flag in ("1", "0", "1"):  # a cached entry of one decoder never answers for the other wrongly
        assert cli(tmp_path, text, "kernels", "--format", "json", native=flag, cache=True) == uncached
    assert "replaced_text" in cli(tmp_path, text, "lint", "--format", "json")[1]


@pytest.mark.parametrize("field", [b"Input Dims", b"Input type", b"Concrete Inputs"])
def test_bytes_that_are_not_utf8_in_a_raw_field_are_replaced(tmp_path, field):
    """D2: such a field (kept as raw JSON text) with a byte that is not UTF-8 was a
    UnicodeDecodeError traceback on both paths."""
    text = trace(OP % (b"120", b', "args": {"' + field + b'": ["\xff"]}'))
    (trace_,) = loaded(tmp_path, text)
    column = {b"Input Dims": "input_dims", b"Input type": "input_types", b"Concrete Inputs": "concrete_inputs"}[field]
    assert trace_.ops.filter(name="aten::mul")[column].to_list() == ['["\ufffd"]']
    assert trace_.facts["replaced_text"] == 1
    assert both(tmp_path, text, "summary")[0] == 0


FAR = loading.FAR


@pytest.mark.parametrize("ts", [b"12345678901234567890123", b"9300000000000000.5", b"-9300000000000000",
                                b"4611686018427388", b"9.3e15", b"1e30"])
def test_a_timestamp_beyond_any_clock_is_dropped_by_name_not_wrapped(tmp_path, ts):
    """D3, D4: a ts beyond int64 was a polars traceback; one near 9.22e15 µs wrapped around
    int64 (a 5 µs op 9,146,744,073,709 ms long). At 2^62 ns or more it is dropped, counted
    under its own reason; the rest of the trace is read as without it."""
    (trace_,) = loaded(tmp_path, trace(OP % (ts, b"")))
    (without,) = loaded(tmp_path, trace())
    assert dict(trace_.facts["dropped"]) == {FAR: 1}
    assert trace_.ops.equals(without.ops) and trace_.origin_us == without.origin_us
    code, out, _ = both(tmp_path, trace(OP % (ts, b"")), "lint")
    assert code == 0 and "beyond any plausible clock" in " ".join(out.split())


def test_a_timestamp_just_below_the_limit_is_read_exactly(tmp_path):
    """The limit is 2^62 ns: a ts 1 ns below it (an epoch in 2116) is kept, to the ns."""
    below = 2**62 - 1
    (trace_,) = loaded(tmp_path, trace(OP % (b"%d.%03d" % divmod(below, 1000), b"")))
    assert trace_.ops.height == 2 and trace_.ops["end"].max() + trace_.origin_us * 1000 == below + 5000


def test_two_timestamps_a_span_apart_that_int64_cannot_hold_are_not_a_traceback(tmp_path):
    """Each of −4.6e15 and +4.6e15 µs lies within ±2^62 ns, but they are 2^63 ns apart: the
    span from the trace's origin wrapped int64 (an OverflowError traceback, exit 1; found in
    review). A ts below −2^61 ns is beyond any plausible clock: dropped, counted; the rest read."""
    events = [*BASE, (OP % (b"-4611686018427387", b"")), (OP % (b"4611686018427387", b""))]
    (trace_,) = loaded(tmp_path, trace(events=events))
    assert dict(trace_.facts["dropped"]) == {FAR: 1}
    code, _, lines = both(tmp_path, trace(events=events), "summary")
    assert code == 0 and not any("Traceback" in line for line in lines)


@pytest.mark.parametrize("dur", [b"1" + b"0" * 5000, b"1" + b"0" * 30, b"4611686018427388"])
def test_a_huge_integer_dur_is_a_dur_beyond_any_clock_or_no_number(tmp_path, dur):
    """D7: a dur of thousands of digits (no Python int is read from it) was counted as an
    element that is not an event object; now as an event without a numeric dur, and a merely
    huge one as beyond any clock."""
    (trace_,) = loaded(tmp_path, trace((OP % (b"120", b"")).replace(b'"dur": 5', b'"dur": ' + dur)))
    reason = loading.NO_DUR if len(dur) > 400 else FAR
    assert dict(trace_.facts["dropped"]) == {reason: 1}


@pytest.mark.parametrize("depth", [1000, 2000])
@pytest.mark.parametrize("last", [True, False])
def test_json_nested_too_deeply_is_one_line(tmp_path, depth, last):
    """D5: an arg nested ~1,000 levels was an uncaught RecursionError (in the last event, or
    any other)."""
    nested = b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1, "args": {"x": ' \
             + b"[" * depth + b"]" * depth + b"}}"
    events = [*BASE, nested] if last else [nested, *BASE]
    code, _, lines = both(tmp_path, trace(events=events), "summary")
    assert code == 2 and len(lines) == 1 and "JSON nested too deeply" in lines[0]


def truncated_with_members(n: int) -> bytes:
    """D6: a trace whose last event has `n` members `"k<i>": [0]`, then a byte of garbage."""
    members = ", ".join(f'"k{i}": [0]' for i in range(n)).encode()
    return trace(OP % (b"120", b', "args": {' + members + b"}")) + b"x"


def test_the_end_of_file_recovery_is_linear_in_the_files_length(tmp_path, monkeypatch):
    """D6: each `]` of the last event was tried as the end of the events, each try parsing the
    rest: 122 s for 289 KB. The text the recovery hands to a JSON decoder is counted (not
    timed): at most 4 times the text (and 64 KiB), whatever its size, before the file is read
    whole."""
    decoded = []

    class Counting:
        def __init__(self, real):
            self.real = real

        def decode(self, text):
            decoded.append(len(text))
            return self.real.decode(text)

    monkeypatch.setattr(stream, "RAWS", Counting(stream.RAWS))
    monkeypatch.setattr(stream, "MEMBERS", Counting(msgspec.json.Decoder()), raising=False)
    monkeypatch.setattr(msgspec.json, "decode", Counting(SimpleNamespace(decode=msgspec.json.decode)).decode)
    for n in (1000, 4000, 16000):
        decoded.clear()
        path = tmp_path / f"{n}.json"
        path.write_bytes(truncated_with_members(n))
        with pytest.raises(stream.Unsplittable):
            list(stream.EventStream(path).pieces())
        assert sum(decoded) <= 4 * path.stat().st_size + (64 << 10)
    code, _, lines = both(tmp_path, truncated_with_members(5000), "summary")
    assert code == 2 and "not valid JSON" in lines[0]


def test_a_truncated_file_with_metadata_of_an_odd_type_is_one_line(tmp_path):
    """D7: the decode that skips the metadata's odd types ran inside an `except` that did not
    catch its own error: a msgspec.DecodeError traceback."""
    text = trace(head=b'"schemaVersion": "1"')[:-40]
    code, _, lines = both(tmp_path, text, "summary")
    assert code == 2 and len(lines) == 1 and "not valid JSON" in lines[0]


def test_bytes_that_are_not_utf8_in_an_event_not_kept_are_counted_on_both_paths(tmp_path):
    """D9: in an event the native decoder does not keep (metadata), and in a field neither
    reads, the native decoder saw no such bytes: `replaced_text` on one path only."""
    text = trace(b'{"ph": "M", "name": "thread_name\xff", "pid": 1, "tid": 1, "args": {"name": "x"}}',
                 OP % (b"120", b', "unread": "\xfe\xfe"'))
    (trace_,) = loaded(tmp_path, text)
    assert trace_.facts["replaced_text"] == 3
    code, out, _ = both(tmp_path, text, "lint")
    assert code == 0 and "replaced_text" in out


# The fuzz campaign: mutations of the committed small traces.
SMALL = [DATA / "gloo-cpu" / "rank0.pt.trace.json.gz", DATA / "cupti-fields-sample.json",
         DATA / "wild" / "hta" / "inference_rank_1.json.gz", DATA / "wild" / "tensorboard-plugin" / "published.json",
         DATA / "external" / "hta-tests-data" / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"]
NASTY = [b"\xff", b"\xc3", b"\xa9", b"\xe2\x82", b'"', b"\\", b"[", b"]", b"{", b"}", b",", b":", b"-", b"e9",
         b"99999999999999999999999", b"1e999", b"null", b"\x00", b"\n", b"\\ud800", b"[" * 300]


def mutated(text: bytes, rng: random.Random) -> bytes:
    """`text` with one to three random edits: a byte flipped, a piece of `NASTY` put in or in
    place of some bytes, a piece cut out or repeated, or the end cut off."""
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(text))
        kind = rng.randrange(5)
        if kind == 0:
            text = text[:at] + bytes([text[at] ^ (1 << rng.randrange(8))]) + text[at + 1:]
        elif kind == 1:
            text = text[:at] + rng.choice(NASTY) + text[at + rng.randrange(3):]
        elif kind == 2:
            text = text[:at] + text[at + rng.randint(1, 64):]
        elif kind == 3:
            text = text[:at] + text[at:at + rng.randint(1, 64)] * 2 + text[at + 64:]
        else:
            text = text[:at]
    return text


def campaign(folder: Path, cases: int, seed: int) -> dict:
    """Load `cases` mutations of each of `SMALL`, the decoder on and off: each either loads or
    raises TraceError (anything else raises), both paths alike (the same tables, or the same
    error). Returns how many loaded and how many were refused."""
    rng = random.Random(seed)
    counts = {"loaded": 0, "refused": 0}
    for source in SMALL:
        text = files.read_bytes(source)
        for i in range(cases):
            path = folder / f"{source.name.split('.')[0]}-{i}.json"
            path.write_bytes(mutated(text, rng))
            got = []
            for flag in ("1", "0"):
                with pytest.MonkeyPatch.context() as m:
                    m.setenv("TRACEKIT_NATIVE", flag)
                    try:
                        got.append(loading.load_traces(path, cache=False))
                    except TraceError as e:
                        got.append(str(e))
            if isinstance(got[0], str) or isinstance(got[1], str):
                assert got[0] == got[1], path
                counts["refused"] += 1
                continue
            for a, b in zip(*got, strict=True):
                for name in ("gpu", "calls", "ops", "marks", "steps"):
                    assert getattr(a, name).equals(getattr(b, name)), (path, name)
                assert (a.meta, a.facts, a.origin_us) == (b.meta, b.facts, b.origin_us), path
            counts["loaded"] += 1
            path.unlink()
    return counts


def test_a_fuzz_campaign_finds_no_traceback_no_signal_and_no_disagreement(tmp_path):
    """A fixed seed, in a process of its own, so that a signal (a crash of the C decoder) is
    seen as one: its exit status."""
    script = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import json, pathlib, test_bad_bytes as t; " \
             f"print(json.dumps(t.campaign(pathlib.Path({str(tmp_path)!r}), 40, 66)))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRACEKIT_NO_CACHE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.splitlines()[-1])
    assert counts["loaded"] and counts["refused"]  # the campaign reached both
