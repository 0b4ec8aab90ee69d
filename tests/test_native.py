"""The native decoder (tracekit/core/_columns.c, native.py) reads what msgspec's typed decode
reads — the oracle: every field of every complete event, on generated events with escapes,
surrogate pairs, floats of every form and integers at int64's ends — and gives the loader the
same tables, metadata and facts as the msgspec path on every trace in tests/data and
../shared. Where it does not read a text (malformed JSON, another field type than the typed
structs hold, a form converted in Python), it says so (None) and the loader's msgspec path
gives what it gave before."""

import json
import math
import random
import struct
from pathlib import Path

import msgspec
import polars as pl
import pytest
from conftest import DATA

from tracekit.core import files, loading, native
from tracekit.core.errors import TraceError
from tracekit.core.kineto import EVENTS, LOOSE_EVENTS
from tracekit.core.stream import RAWS

SHARED = Path(__file__).resolve().parents[2] / "shared"  # ../shared of the checkout
ROOTS = [DATA] + [SHARED] * SHARED.is_dir()
TRACES = sorted(p for root in ROOTS for p in root.rglob("*.json*")
                if p.name not in ("manifest.json",) and "truth" not in p.name)
ARGS = {"external_id": "External id", "external_id_2021": "external id", "correlation": "correlation",
        "device": "device", "stream": "stream", "bytes": "bytes", "in_nelems": "In msg nelems",
        "out_nelems": "Out msg nelems", "group_size": "Group size", "wait_on_stream": "wait_on_stream",
        "wait_on_record": "wait_on_cuda_event_record_corr_id", "rank": "rank", "collective": "Collective name",
        "dtype": "dtype", "pg_name": "Process Group Name", "pg_desc": "Process Group Description",
        "pg_ranks": "Process Group Ranks", "sync_kind": "cuda_sync_kind"}
INTS = {name for name in ARGS if name not in ("collective", "dtype", "pg_name", "pg_desc", "pg_ranks", "sync_kind")}
RAW = {"input_dims": "Input Dims", "input_types": "Input type", "concrete_inputs": "Concrete Inputs"}


def test_the_extension_is_built():
    """The install compiles it (the README's install, CI); without it every chunk is msgspec's."""
    assert native.available()


def random_text(rng: random.Random) -> str:
    pieces = ["a", "é", "名", "\U0001F600", '"', "\\", "/", "\n", "\t", "\x00", "\x1f", "\u2028", " "]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))


def random_number(rng: random.Random) -> str:
    whole = str(rng.randint(0, 10 ** rng.randint(0, 17)))
    decimals = rng.choice([0, 1, 3, 6, 9, 17, 25])
    text = ("-" if rng.random() < 0.2 else "") + whole
    if decimals:
        text += "." + str(rng.randint(0, 10 ** decimals)).zfill(decimals)
    if rng.random() < 0.1:
        text += rng.choice(["e", "E"]) + rng.choice(["", "+", "-"]) + str(rng.randint(0, 30))
    return text


def random_event(rng: random.Random) -> str:
    """One event's JSON text, with each field there or not, null or not, escaped or not."""
    fields = []
    if rng.random() < 0.9:
        fields.append(f'"ph": "{rng.choice(["X", "X", "X", "i", "M", "f", "s"])}"')
    for key in ("name", "cat"):
        if rng.random() < 0.9:
            fields.append(f'"{key}": {json.dumps(random_text(rng), ensure_ascii=rng.random() < 0.5)}')
    for key in ("pid", "tid"):
        if rng.random() < 0.9:
            fields.append(f'"{key}": ' + (json.dumps(random_text(rng)) if rng.random() < 0.2
                                          else str(rng.choice([0, -1, 7, 2 ** 63 - 1, -2 ** 63, rng.randint(0, 10 ** 6)]))))
    for key in ("ts", "dur"):
        if rng.random() < 0.95:
            fields.append(f'"{key}": ' + ("null" if rng.random() < 0.05 else random_number(rng)))
    if rng.random() < 0.3:
        fields.append('"unknown": {"a": [1, 2.5e3, -0, true, false, null, "x\\"y", {}], "b": []}')
    if rng.random() < 0.9:
        args = []
        for name, key in ARGS.items():
            if rng.random() < 0.3:
                if rng.random() < 0.1:
                    value = "null"
                elif name in ("collective", "dtype", "pg_name", "pg_desc", "pg_ranks", "sync_kind"):
                    value = json.dumps(random_text(rng))
                elif name == "stream" and rng.random() < 0.2:  # text the typed structs hold
                    value = rng.choice(['"0x0"', '"0x7fA9"', '"12"', '"-3"'])
                elif rng.random() < 0.002:  # roctracer's integers as text: the event is lenient
                    value = json.dumps(str(rng.choice([0, 1, -5, 2 ** 63 - 1, -2 ** 63, rng.randint(0, 10 ** 12)])))
                else:
                    value = str(rng.choice([0, 1, -5, 2 ** 63 - 1, rng.randint(0, 10 ** 12)]))
                args.append(f'"{key}": {value}')
        for key in ("grid", "block"):
            if rng.random() < 0.3:
                dims = [rng.randint(-1, 10 ** 6) for _ in range(rng.randint(0, 3))]
                text = rng.choice(["grid(100,)", "[1, 2]", "'[4]'", "None", "[None]", "", "a, b, , c", "[]x]"])
                args.append(f'"{key}": ' + ("null" if rng.random() < 0.1 else json.dumps(text) if rng.random() < 0.2
                                            else json.dumps(dims)))
        for key in RAW.values():
            if rng.random() < 0.3:
                args.append(f'"{key}": ' + rng.choice(['[[1, 2], [], [[3]]]', '["c10::BFloat16", ""]', '"x"', "null",
                                                      '[ "a" , 1.5 ]']))
        if rng.random() < 0.3:
            args.append('"Input Strides": [[1], [], [2, 1]], "Ev Idx": 50')
        rng.shuffle(args)
        fields.append('"args": {' + ", ".join(args) + "}")
    rng.shuffle(fields)
    return "{\n    " + ",\n    ".join(fields) + "\n  }"


def valid_utf8(text: bytes) -> bool:
    try:
        text.decode()
    except UnicodeDecodeError:
        return False
    return True


def same_float(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and struct.pack("d", a) == struct.pack("d", b))


def test_every_field_is_what_msgspec_reads():
    """4,000 generated events in chunks of 50: each complete event's every field as the typed
    structs hold it (the floats bit for bit), or where the typed decode refuses the chunk (an
    integer written as text), as the lenient decode holds it and the loader's `ints` reads it;
    the counts of events and of lenient events (`loading._lenient`)."""
    rng = random.Random(7)
    typed = lenient = 0
    for _ in range(80):
        text = ("[\n  " + ",\n  ".join(random_event(rng) for _ in range(50)) + "\n]").encode()
        try:
            events, odd = EVENTS.decode(text), 0
            typed += 1
        except msgspec.ValidationError:
            events, odd = LOOSE_EVENTS.decode(text), loading._lenient(RAWS.decode(text))
            lenient += 1
        raw = native.raw_columns(text)
        assert raw is not None
        table = native.frame(raw)
        assert (raw.events, raw.lenient) == (len(events), odd)
        complete = [e for e in events if e.ph == "X"]
        assert table.height == len(complete)
        for row, e in zip(table.iter_rows(named=True), complete):
            assert (row["cat"], row["name"]) == (e.cat, e.name)
            for key in ("pid", "tid"):
                value = getattr(e, key)
                assert (row[key], row[f"{key}_text"]) == ((value, None) if isinstance(value, int) else (None, value))
            for key in ("ts", "dur"):  # the lenient decode keeps a float's text
                value = getattr(e, key)
                assert same_float(row[key], None if value is None else float(value))
            for name in ARGS:
                value = getattr(e.args, name)
                assert row[name] == (loading.ints([value])[0] if name in INTS else value), name
            for name in ("grid", "block"):
                assert row[name] == loading.dims([getattr(e.args, name)])[0]
            for name in RAW:
                value = bytes(getattr(e.args, name))
                assert row[name] == (value.decode() if value else None)
    assert typed > 10 and lenient > 10  # both kinds of chunk were made


# Texts msgspec reads but the native decoder leaves to the msgspec path, and texts that are
# not JSON at all.
LEFT = {
    "an integer beyond int64": '[{"ph": "X", "ts": 1, "dur": 1, "args": {"External id": 9223372036854775808}}]',
    "a float where an int goes": '[{"ph": "X", "ts": 1, "dur": 1, "args": {"correlation": 1.0}}]',
    "a bool where an int goes": '[{"ph": "X", "ts": 1, "dur": 1, "pid": true}]',
    "ts as text": '[{"ph": "X", "ts": "1", "dur": 1}]',
    "args not an object": '[{"ph": "X", "ts": 1, "dur": 1, "args": [1]}]',
    "a stream as other text": '[{"ph": "X", "ts": 1, "dur": 1, "args": {"stream": "s7"}}]',
    "a stream as a bare 0x": '[{"ph": "X", "ts": 1, "dur": 1, "args": {"stream": "0x"}}]',
    "an int as text not canonical": '[{"ph": "X", "ts": 1, "dur": 1, "args": {"bytes": "07"}}]',
    "an int as text with a sign": '[{"ph": "X", "ts": 1, "dur": 1, "args": {"bytes": "+5"}}]',
    "an int as text with a point": '[{"ph": "X", "ts": 1, "dur": 1, "args": {"correlation": "7.0"}}]',
    "an int as text beyond int64": '[{"ph": "X", "ts": 1, "dur": 1, "args": {"bytes": "9223372036854775808"}}]',
    "an int as empty text": '[{"ph": "X", "ts": 1, "dur": 1, "args": {"bytes": ""}}]',
    "minus zero as text": '[{"ph": "X", "ts": 1, "dur": 1, "args": {"bytes": "-0"}}]',
    "ranks as a list": '[{"ph": "X", "ts": 1, "dur": 1, "args": {"Process Group Ranks": [0, 1]}}]',
    "an element not an object": '[{"ph": "X", "ts": 1, "dur": 1}, 3]',
    "a lone surrogate": '[{"ph": "X", "ts": 1, "dur": 1, "name": "\\ud800"}]',
    "an escaped key": '[{"ph": "X", "ts": 1, "dur": 1, "n\\u0061me": "a"}]',
    "a float beyond a double": '[{"ph": "X", "ts": 1e999, "dur": 1}]',
    "a trailing comma": '[{"ph": "X", "ts": 1, "dur": 1},]',
    "an unclosed object": '[{"ph": "X", "ts": 1, "dur": 1',
    "text after the array": '[{"ph": "X", "ts": 1, "dur": 1}] x',
    "a bad number": '[{"ph": "X", "ts": 01, "dur": 1}]',
    "a raw control character": '[{"ph": "X", "ts": 1, "dur": 1, "name": "a\tb"}]',
}


def test_texts_of_every_length_about_a_views_inline_size():
    """Texts are handed over as Arrow string views, which hold a text of up to 12 bytes inline
    and a longer one in a buffer: names of 0 to 40 bytes (and 1 to 4 bytes a character), beside
    absent ones, read back as msgspec reads them."""
    names = ["", None] + ["a" * n for n in range(1, 41)] + ["é" * n for n in range(1, 15)] + ["\U0001F600" * n for n in range(1, 8)]
    events = [{"ph": "X", "cat": "cpu_op", "ts": i, "dur": 1} | ({} if name is None else {"name": name})
              for i, name in enumerate(names)]
    text = json.dumps(events, ensure_ascii=False).encode()
    table = native.frame(native.raw_columns(text))
    assert table["name"].to_list() == [e.name for e in EVENTS.decode(text)]


@pytest.mark.parametrize("text", LEFT.values(), ids=LEFT.keys())
def test_what_it_leaves_to_msgspec(text):
    assert native.raw_columns(text.encode()) is None


def test_text_that_is_not_utf8_is_left_to_msgspec():
    assert native.raw_columns(b'[{"ph": "X", "ts": 1, "dur": 1, "name": "\xff"}]') is None


@pytest.mark.parametrize("path", TRACES, ids=lambda p: str(p.relative_to(p.parents[2])))
def test_the_loader_gives_what_the_msgspec_path_gives(path, monkeypatch):
    """Every table, the metadata and the facts (or the same error), the native decoder on and
    off; and it read some chunk of every trace that loads."""
    used = []
    real = native.raw_columns
    monkeypatch.setattr(native, "raw_columns", lambda *args: used.append(r := real(*args)) or r)

    def traces(flag):
        monkeypatch.setenv("TRACEKIT_NATIVE", flag)
        try:
            return loading.load_traces(path, cache=False)
        except TraceError as e:
            return str(e)

    fast, slow = traces("1"), traces("0")
    if isinstance(slow, str):
        assert fast == slow
        return
    assert any(u is not None for u in used) or not valid_utf8(files.read_bytes(path))  # such text: msgspec's alone
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        for name in ("gpu", "calls", "ops", "marks", "steps"):
            assert getattr(a, name).equals(getattr(b, name)), name
        assert (a.meta, a.facts, a.rank, a.origin_us) == (b.meta, b.facts, b.rank, b.origin_us)


def test_epoch_timestamps_are_read_from_their_text_as_the_exact_decode_reads_them():
    """Timestamps ≥ 2^43 µs (epoch microseconds), whose ns a float cannot hold: the native
    decoder reads each from its text, as `loading.exact_ns` (msgspec's path) reads it —
    0 to 7 decimals, negative, at int64's end — where one with an exponent leaves the chunk to
    msgspec's path; a smaller one beside them is read from its double, as everywhere."""
    rng = random.Random(7)
    texts = ["1700000000000000.123", "-1700000000000000.1235", "1700000000000000.0005", "9223372036854774.9999",
             "-9223372036854774", "1700000000000000", "-0", "0.00049"]
    texts += [f"{rng.choice(['', '-'])}{rng.randrange(2**43, 2**53)}.{rng.randrange(10**7):0{rng.randrange(1, 8)}d}"
              for _ in range(2000)]
    events = ",".join(f'{{"ph": "X", "cat": "cpu_op", "name": "a", "ts": {t}, "dur": 1}}' for t in texts)
    wide = native.frame(native.raw_columns(f"[{events}]".encode()))
    exact = loading.exact_ns(pl.Series(texts)).to_list()
    assert wide["ts_exact"].to_list() == [ns if abs(float(t)) >= 2 ** 43 else None for t, ns in zip(texts, exact)]
    text = f"[{events}]".encode()
    facts = loading.fresh_facts()
    assert loading._native_tables(text, facts) is not None
    plausible = [-loading.CLOCK_LIMIT_NS // 2 <= ns < loading.CLOCK_LIMIT_NS for ns in exact]  # `loading.far`'s clock
    assert facts["exact_timestamps"] == sum(abs(int(float(t))) >= 2**43 and ok for t, ok in zip(texts, plausible))
    assert facts["dropped"] == {loading.FAR: plausible.count(False)}  # not wrapped
    assert loading.native_columns(b'[{"ph": "X", "ts": 1.7e15, "dur": 1}]') is None
    for ts, kept in ((int(loading.EXACT_LIMIT_US) - 1, False), (int(loading.EXACT_LIMIT_US), True)):  # the C's limit is the loader's
        wide = native.frame(native.raw_columns(f'[{{"ph": "X", "ts": {ts}, "dur": 1}}]'.encode()))
        assert wide["ts_exact"].to_list() == [ts * 1000 if kept else None]
    assert loading.native_columns(b'[{"ph": "X", "ts": 1.5e3, "dur": 1}]') is not None
    assert loading.native_columns(b'[{"ph": "X", "ts": 1.5e3, "dur": 1, "args": {"bytes": "1"}}]') is not None  # a lenient chunk too


def test_a_tid_beyond_a_streams_digits_is_read_as_msgspec_reads_it(tmp_path, monkeypatch):
    """A kernel's stream is its `stream` arg, else the number in its tid: a tid of -2^63 (whose
    digits overflow an int64) beside a stream arg is a kernel on that stream, the decoder on
    and off; a kernel with neither has no stream."""
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "dur": 1, "args": {"device": 0, "correlation": 1}}
    events = [kernel | {"ts": 1, "tid": -2**63, "args": kernel["args"] | {"stream": 7}},
              kernel | {"ts": 2, "tid": 9},
              kernel | {"ts": 3, "tid": -2**63}]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    streams = []
    for flag in ("1", "0"):
        monkeypatch.setenv("TRACEKIT_NATIVE", flag)
        streams.append(loading.load_traces(path, cache=False)[0].gpu.sort("start")["stream"].to_list())
    assert streams == [[7, 9, None]] * 2


REPEATED = {  # msgspec keeps a repeated key's last value: a repeated ts or args is the last one's
    "a lenient event's ts twice": '{"ph":"X","cat":"cpu_op","name":"a","ts":5,"ts":1.5e0,"dur":1,"args":{"bytes":"1"}}',
    "an epoch ts twice": '{"ph":"X","cat":"cpu_op","name":"a","ts":1700000000000000.5,"ts":1700000000000001e0,"dur":1}',
    "a ts then null": '{"ph":"X","cat":"cpu_op","name":"b","ts":2,"dur":1},'
                      '{"ph":"X","cat":"cpu_op","name":"a","ts":1.5,"ts":null,"dur":1,"args":{"bytes":"1"}}',
    "args twice": '{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":7,"ts":1,"dur":1,"args":{"bytes":1,"stream":3},"args":{}}',
}


@pytest.mark.parametrize("events", REPEATED.values(), ids=REPEATED.keys())
def test_a_repeated_key_is_read_as_msgspec_reads_it(events, tmp_path, monkeypatch):
    """Found by a review: the native decoder kept the first ts's exact ns, and the first args'
    fields, where msgspec keeps the last."""
    path = tmp_path / "trace.json"
    path.write_text('{"traceEvents": [' + events + "]}")
    loaded = []
    for flag in ("1", "0"):
        monkeypatch.setenv("TRACEKIT_NATIVE", flag)
        trace = loading.load_traces(path, cache=False)[0]
        loaded.append((trace.ops.rows(), trace.gpu.rows(), trace.origin_us, trace.facts))
    assert loaded[0] == loaded[1]


def test_an_infinite_timestamp_is_dropped_and_counted_not_a_traceback(tmp_path, monkeypatch):
    """`1e999` is a JSON number no double holds: it was a polars error (a traceback, exit 1) on
    every path; now the event is dropped as one without a numeric ts (or dur), decoder on and off."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": "INF", "dur": 1},
              {"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 5, "dur": "INF"},
              {"ph": "X", "cat": "cpu_op", "name": "c", "pid": 1, "tid": 1, "ts": 7, "dur": 1}]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}).replace('"INF"', "1e999"))
    for flag in ("1", "0"):
        monkeypatch.setenv("TRACEKIT_NATIVE", flag)
        trace = loading.load_traces(path, cache=False)[0]
        assert trace.ops["name"].to_list() == ["c"]
        assert dict(trace.facts["dropped"]) == {"events without a numeric ts": 1, "events without a numeric dur": 1}


def test_groups_are_the_wide_tables_rows_by_cat_with_their_columns():
    """`raw_columns(text, groups)`: each group's frame is the one-group (`WIDE`) frame's rows
    whose cat is one of the group's (the rest group: every other row), in file order, with the
    group's columns in its order — on generated events, their cats drawn from the groups'
    and others; without a rest group the other rows are in none. Text ids are counted only in
    the groups that hold pid or tid."""
    rng = random.Random(11)
    cats = ["kernel", "cpu_op", "cuda_runtime", "Trace", "", "é名"]
    text = ("[\n  " + ",\n  ".join(random_event(rng) for _ in range(600)) + "\n]").encode()
    # the generated cats are random text: give a third of the events one of `cats`
    decoded = json.loads(text)
    for i, e in enumerate(decoded):
        if i % 3 and "cat" in e:
            e["cat"] = rng.choice(cats)
    text = ("[\n  " + ",\n  ".join(json.dumps(e, ensure_ascii=False) for e in decoded) + "\n]").encode()
    wide = native.frame(native.raw_columns(text))
    spec = ((("kernel", "Trace"), ("name", "ts", "grid", "cat")), (("cpu_op",), ("pid_text", "input_dims")),
            (None, ("dur", "tid", "correlation", "cat")), (("cuda_runtime", ""), ("ts_exact",)))
    raw = native.raw_columns(text, spec)
    taken = [c for group, _ in spec if group for c in group]
    got = native.frames(raw)
    for (group, names), frame in zip(spec, got):
        rows = wide.filter(pl.col("cat").is_in(list(group)) if group else ~pl.col("cat").is_in(taken))
        assert frame.equals(rows.select(names)), (group, names)
    assert sum(f.height for f in got) == wide.height == raw.rows
    held = wide.filter(pl.col("cat").is_in(["cpu_op"]) | ~pl.col("cat").is_in(taken))  # groups 2 and 3 hold pid_text or tid
    assert raw.text_ids == held.filter(pl.col("pid_text").is_not_null() | pl.col("tid_text").is_not_null()).height
    assert raw.text_ids > 0
    alone = native.frames(native.raw_columns(text, ((("cpu_op",), ("name",)),)))
    assert alone[0].equals(wide.filter(pl.col("cat") == "cpu_op").select("name"))


@pytest.mark.parametrize("groups", [(), ((None, ("name",)), (None, ("ts",))), ((("a",), ()),), ((("a",), ("nope",)),),
                                    ((("a",), ("ts", "ts")),), (("a", ("ts",)),), ((("a",), ("ts",), 1),),
                                    tuple(((f"c{i}",), ("ts",)) for i in range(9))],
                         ids=["none", "two rests", "no columns", "an unknown column", "a column twice",
                              "cats not a tuple", "not a pair", "nine groups"])
def test_groups_that_are_not_groups_are_refused(groups):
    with pytest.raises(ValueError, match="groups"):
        native.raw_columns(b'[{"ph": "X", "ts": 1, "dur": 1}]', groups)
