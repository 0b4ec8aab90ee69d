"""Reading a trace's events a block at a time, so that the file is never whole in memory.

A pretty-printed trace (Kineto's, or any JSON written with indentation) starts each element
of `traceEvents` on a line of its own at one indentation: the text between the array's `[`
and its first `{` is the separator every element after it follows a comma with. JSON strings
cannot hold a raw newline, and nested objects are indented deeper, so that separator occurs
only between elements. A compact trace separates its elements with `}, {` or `},{`, which a
nested list of objects could hold too: a cut there gives a piece that does not parse.
`EventStream` reads blocks (plain, gzip through ISA-L, or an fsspec file), cuts them at the
last separator, and gives each piece as the text of a JSON array of events; the top-level
members around the array are kept as a small JSON object (`metadata`).

Where that does not hold — an array at the top, `traceEvents` far from the start — it raises
`Unsplittable` before giving anything, and the caller reads the file whole. A piece that then
fails to parse as an array means a wrong cut: the caller starts again with the whole file.
"""

from __future__ import annotations

import re

import msgspec

from . import files

BLOCK = 8 << 20  # bytes read at a time
PIECE = 8 << 20  # bytes of events given at a time (about 20,000 Kineto events; their structs are in memory at once)
HEAD_LIMIT = 64 << 20  # `traceEvents` must start within this many bytes
WHITESPACE = b" \t\r\n"
NONSPACE = re.compile(rb"[^ \t\r\n]")
RAWS = msgspec.json.Decoder(list[msgspec.Raw])
MEMBERS = msgspec.json.Decoder()  # the top level's members after the events (`last_events`)
RECOVERY = 4  # `last_events` decodes at most this many times the text it is given (and 64 KiB)


class Unsplittable(Exception):
    """This file cannot be read a block at a time; read it whole."""


class EventStream:
    """`pieces()` gives the events as JSON-array texts; then `metadata` is the top level
    without them (`{"schemaVersion": …, "traceEvents": [], …}`)."""

    def __init__(self, location):
        self.file = files.open_stream(location)
        self.metadata = b""
        self.consumed = 0  # bytes of text read so far

    def read(self) -> bytes:
        block = self.file.read(BLOCK)
        self.consumed += len(block)
        return block

    def pieces(self):
        try:
            yield from self._pieces()
        finally:
            self.file.close()

    def start(self) -> tuple[bytes, bytes, bytes, int]:
        """(the text before `"traceEvents"`, the text read from the first element's `{` on
        (at offset `consumed - len(…)` of the text), the separator, how many of its bytes end
        the piece before it). Offsets into the block, not stripped copies of it: the block is
        megabytes."""
        buf = self.read().removeprefix(files.BOM)
        while b'"traceEvents"' not in buf:
            more = self.read()
            if not more or len(buf) > HEAD_LIMIT or buf[(lead := nonspace(buf, 0)):lead + 1] != b"{":
                raise Unsplittable
            buf += more
        key = buf.index(b'"traceEvents"')
        colon = nonspace(buf, key + len(b'"traceEvents"'))
        bracket = nonspace(buf, colon + 1)
        if buf[colon:colon + 1] != b":" or buf[bracket:bracket + 1] != b"[":
            raise Unsplittable
        first = nonspace(buf, bracket + 1)
        while first == len(buf):
            more = self.read()
            if not more:
                raise Unsplittable
            buf += more
            first = nonspace(buf, first)
        space, body = buf[bracket + 1:first], buf[first:]
        if body[:1] not in b"{]":
            raise Unsplittable
        separator, kept = (b"," + space + b"{", 0) if b"\n" in space else \
            (b"}, {", 1) if b"}, {" in body else (b"},{", 1)
        return buf[:key], body, separator, kept

    def _pieces(self):
        """Each piece as a JSON array's text; the last events (after the last separator) joined
        to the piece before them, since each piece costs the decoder ~10 ms however small (a
        small file is one piece, not two)."""
        head, body, separator, kept = self.start()
        buf = bytearray(b" " + body)  # buf[0], before the first "{", becomes the "[" of each piece
        eof, held = False, None
        while True:
            searched = 0  # the separator is not in buf before this (each byte searched once)
            while not eof:
                if len(buf) >= PIECE:
                    if buf.find(separator, searched) != -1:
                        break
                    searched = len(buf) - len(separator) + 1
                block = self.read()
                eof = not block
                buf += block
            cut = buf.rfind(separator)
            if cut == -1:
                break
            end = cut + kept  # the separator's comma: it becomes the "]"
            buf[0], buf[end] = ord("["), ord("]")
            if held is not None:
                yield held
            # a copy (milliseconds a piece): the events' raw fields (msgspec.Raw) point into it and
            # may outlive it, so it must not be a view of `buf`, which changes next
            held = bytes(memoryview(buf)[:end + 1])
            del buf[:cut + len(separator) - 2]  # the byte before the next "{" is the next buf[0]
            if eof and buf.rfind(separator) == -1:
                break
        piece, self.metadata = last_events(head, bytes(buf[1:]))
        yield piece if held is None else held[:-1] + b"," + piece[1:]  # the last events: never none


def nonspace(text: bytes, start: int) -> int:
    """The offset of the first byte at or after `start` that is not JSON whitespace (the
    text's length if none is)."""
    found = NONSPACE.search(text, start)
    return found.start() if found else len(text)


def last_events(head: bytes, body: bytes) -> tuple[bytes, bytes]:
    """(the last events as a JSON array's text, the top level without them) from the text
    before `"traceEvents"` and the text from the last events' first `{` to the end: the events
    end at the `]` after which the rest closes the top-level object and before which they parse.
    Each `]` tried costs the text after it (or before it), so that a text with many `]` that
    is not such a trace (truncated, trailing garbage) would cost the square of its length: the
    text decoded is bounded (`RECOVERY`), past which the file is read whole (`Unsplittable`),
    in time linear in its length."""
    budget = RECOVERY * len(body) + (64 << 10)
    end = len(body)
    while (end := body.rfind(b"]", 0, end)) != -1:
        after = nonspace(body, end + 1)
        mark = body[after:after + 1]
        if mark == b"}" and nonspace(body, after + 1) == len(body):
            tail = members = b"}"
        elif mark == b",":
            budget -= len(body) - after
            tail = body[after:].rstrip(WHITESPACE)
            members = b"{" + tail[1:]
        else:
            continue
        budget -= len(members)
        if budget < 0:
            raise Unsplittable
        try:
            MEMBERS.decode(members if members != b"}" else b"{}")
        except msgspec.DecodeError:
            continue
        budget -= end
        if budget < 0:
            raise Unsplittable
        try:
            RAWS.decode(b"[" + body[:end] + b"]")
        except msgspec.DecodeError:
            continue
        return b"[" + body[:end] + b"]", head + b'"traceEvents": []' + tail
    raise Unsplittable
