"""Reading a trace a block at a time (tracekit/core/stream.py) gives exactly what reading it whole
gives — for Kineto's indented layout, compact JSON and gzip, with names holding the
separators themselves and args holding lists of objects, cut into many small pieces."""

import gzip
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth import doc, kernel, launched, op, step

from tracekit.core import loading, stream

TRICKY = st.sampled_from(["}, {", "},{", ",\n  {", "]", "[", '"', "\\", "ü", "x"])
NAMES = st.lists(TRICKY, min_size=1, max_size=4).map("".join)
LAYOUTS = {
    "kineto": lambda d: json.dumps(d, indent=2),
    "compact": lambda d: json.dumps(d, separators=(",", ":")),
    "spaced": json.dumps,
}


def events(names, nested):
    out = [step(1, 0, 1000)]
    for i, name in enumerate(names):
        out += [op(name, 10 + 20 * i, 10, shapes=[[{"a": 1}, {"b": 2}]] if nested else [[4, 4]]),
                *launched(f"k{i} {name}", 11 + 20 * i, 100 + 20 * i, 5, corr=i + 1)]
    out.append(kernel("unlaunched", 900, 5, corr=999))
    return out


def tables(trace):
    return [trace.gpu, trace.calls, trace.ops, trace.marks, trace.steps]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(NAMES, min_size=1, max_size=30), nested=st.booleans(), layout=st.sampled_from(sorted(LAYOUTS)),
       gz=st.booleans(), piece=st.integers(64, 2048))
def test_streamed_equals_whole(tmp_path, monkeypatch, names, nested, layout, gz, piece):
    text = LAYOUTS[layout](doc(events(names, nested))).encode()
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    with monkeypatch.context() as patch:  # undone after each example
        patch.setattr(stream, "BLOCK", 97)
        patch.setattr(stream, "PIECE", piece)
        pieces = []
        real = loading._chunk_tables
        patch.setattr(loading, "_chunk_tables", lambda chunk, facts: pieces.append(1) or real(chunk, facts))
        streamed = loading.decode(path, ())[0]
        if layout == "kineto" and len(text) > 4 * piece:  # one event per line at one indentation: cut
            assert len(pieces) > 1
        patch.setattr(loading, "streamed", lambda p: (_ for _ in ()).throw(stream.Unsplittable()))
        whole = loading.decode(path, ())[0]
    for a, b in zip(tables(streamed), tables(whole)):
        assert a.equals(b)
    assert streamed.meta == whole.meta and streamed.facts == whole.facts
    assert streamed.gpu.height == len(names) + 1
    assert set(names) <= set(streamed.ops["name"].to_list())


def test_a_small_file_is_one_piece_and_the_last_events_join_the_piece_before(tmp_path, monkeypatch):
    """Each piece costs the decoder a fixed ~10 ms however few events it holds: the events after
    the last separator go with the piece before them, so a small file is one piece; cut
    small, the pieces are the events in order."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc(events(["a", "b", "c"], False)), indent=2))
    written = json.loads(path.read_text())["traceEvents"]
    (one,) = stream.EventStream(path).pieces()
    assert json.loads(one) == written
    monkeypatch.setattr(stream, "PIECE", 256)
    monkeypatch.setattr(stream, "BLOCK", 97)
    cut = list(stream.EventStream(path).pieces())
    assert len(cut) > 3 and [e for piece in cut for e in json.loads(piece)] == written
