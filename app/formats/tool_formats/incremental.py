"""Tool calls read as the output streams, the way vLLM's `extract_tool_calls_streaming` reads
them: a call's name as soon as it is written, then its arguments in pieces.

The arguments of the JSON formats (hermes, llama3_json, mistral, forced calls) stream as the
*canonical* JSON text the finished response carries (`json.dumps(arguments,
ensure_ascii=False)`), whatever whitespace the model writes: every piece is final, so the
pieces join to exactly the non-streamed `arguments` and nothing sent has to be taken back.
Worked example, the model writing `{"name": "f", "arguments": {"city":"Paris",\\n "n": 1}}`:

    '{"name": "f", "argu'   ->  CallDelta(0, name="f")
    'ments": {"city":"Pa'   ->  CallDelta(0, arguments='{"city": "Pa')
    'ris",\\n "n": 1'        ->  CallDelta(0, arguments='ris", "n": ')   (1 may go on: 12)
    '}}'                     ->  CallDelta(0, arguments='1}')

Pythonic calls are Python, not JSON: a call's name goes out when its `(` is written and its
arguments (as JSON) when its `)` closes it (app/formats/tool_formats/pythonic.py).

A stream is fed the output from the call's start marker on (`ToolFormat.call_start`); what
it reads is the best it can say before the end. The finished output's parse
(`ToolFormat.parse`) stays the truth: app/api/streaming.py sends whatever the stream did not.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass

_WHITESPACE = " \t\n\r"
_NUMBER_CHARS = frozenset("-+.eE0123456789")
_NUMBER_RE = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?\Z")
_LITERALS = ("true", "false", "null")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r",
            "t": "\t"}


@dataclass
class CallDelta:
    """One step of one call: its name (the call's first delta only) and/or the next piece of
    its arguments' JSON text."""

    index: int
    name: str | None = None
    arguments: str = ""


class JsonValue:
    """One JSON value read character by character, written out canonically as it goes.

    `feed` consumes characters until the value is complete (what follows it is left to the
    caller) and appends the canonical text to `out`; a value that cannot be JSON sets
    `failed` and reads nothing more. A number is written once the character after it shows
    it has ended."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self.done = False
        self.failed = False
        # Containers open: [kind, state]; kind '{' or '['; state what comes next:
        # 'key|end', 'key', 'colon', 'value', 'value|end', 'comma|end'.
        self._stack: list[list[str]] = []
        self._token: str | None = None  # 'string', 'number', 'literal' while one is open
        self._chars = ""  # the number or literal so far; an escape sequence so far
        self._escape: str | None = None  # None, or the escape read so far ('\\', '\\u00')
        self._high: str | None = None  # a high surrogate waiting for its low half

    def text(self) -> str:
        return "".join(self.out)

    def feed(self, text: str, start: int = 0) -> int:
        """Read `text` from `start`; returns the index after the last character consumed."""
        i = start
        while i < len(text) and not self.done and not self.failed:
            if self._token is None:
                i = self._between(text, i)
            elif self._token == "string":
                i = self._string(text, i)
            else:
                i = self._word(text, i)
        return i

    def finish(self) -> None:
        """The text has ended: a number at the very end is complete."""
        if self._token == "number" and not self._stack:
            self._end_number()

    # ----- between tokens -------------------------------------------------------------
    def _between(self, text: str, i: int) -> int:
        char = text[i]
        if char in _WHITESPACE:
            return i + 1
        state = self._stack[-1][1] if self._stack else "value"
        if state in ("value", "value|end") and char not in "]}":
            self._open_value(char)
        elif state in ("key|end", "key") and char == '"':
            self.out.append('"')
            self._token = "string"
        elif state == "colon" and char == ":":
            self.out.append(": ")
            self._stack[-1][1] = "value"
        elif state == "comma|end" and char == ",":
            self.out.append(", ")
            self._stack[-1][1] = "key" if self._stack[-1][0] == "{" else "value"
        elif (state in ("key|end", "comma|end") and char == "}" and self._stack[-1][0] == "{") \
                or (state in ("value|end", "comma|end") and char == "]"
                    and self._stack[-1][0] == "["):
            self.out.append(char)
            self._stack.pop()
            self._value_ended()
        else:
            self.failed = True
        return i + 1

    def _open_value(self, char: str) -> None:
        if char in "{[":
            self.out.append(char)
            self._stack.append([char, "key|end" if char == "{" else "value|end"])
        elif char == '"':
            self.out.append('"')
            self._token = "string"
        elif char == "-" or char.isdigit():
            self._token, self._chars = "number", char
        elif char.isalpha():
            self._token, self._chars = "literal", char
            self._check_literal()
        else:
            self.failed = True

    def _value_ended(self) -> None:
        """A value (or a key) just closed: what comes next in its container."""
        if not self._stack:
            self.done = True
            return
        top = self._stack[-1]
        top[1] = "colon" if top[1] in ("key|end", "key") else "comma|end"

    # ----- strings ----------------------------------------------------------------------
    def _string(self, text: str, i: int) -> int:
        char = text[i]
        if self._escape is not None:
            self._escape += char
            self._read_escape()
            return i + 1
        if char == "\\":
            self._escape = "\\"
        elif char == '"':
            self._flush_high()
            self.out.append('"')
            self._token = None
            self._value_ended()
        elif ord(char) < 0x20:  # json.loads (strict) refuses raw control characters
            self.failed = True
        else:
            self._emit_char(char)
        return i + 1

    def _read_escape(self) -> None:
        escape = self._escape or ""
        if len(escape) == 2 and escape[1] != "u":
            if escape[1] not in _ESCAPES:
                self.failed = True
                return
            self._escape = None
            self._emit_char(_ESCAPES[escape[1]])
        elif len(escape) == 6:
            self._escape = None
            try:
                self._emit_char(chr(int(escape[2:], 16)))
            except ValueError:
                self.failed = True
        elif len(escape) > 2 and escape[-1] not in "0123456789abcdefABCDEF":
            self.failed = True

    def _emit_char(self, char: str) -> None:
        if self._high is not None:
            high, self._high = self._high, None
            if 0xDC00 <= ord(char) <= 0xDFFF:  # a surrogate pair is one character
                char = chr(0x10000 + ((ord(high) - 0xD800) << 10) + (ord(char) - 0xDC00))
            else:
                self.out.append(_escaped(high))
        if 0xD800 <= ord(char) <= 0xDBFF:
            self._high = char
            return
        self.out.append(_escaped(char))

    def _flush_high(self) -> None:
        if self._high is not None:
            self.out.append(_escaped(self._high))
            self._high = None

    # ----- numbers and literals ---------------------------------------------------------
    def _word(self, text: str, i: int) -> int:
        char = text[i]
        if self._token == "number":
            if char in _NUMBER_CHARS:
                self._chars += char
                return i + 1
            self._end_number()
            return i  # the character after the number belongs to its container
        self._chars += char
        self._check_literal()
        return i + 1

    def _end_number(self) -> None:
        self._token = None
        if not _NUMBER_RE.match(self._chars):
            self.failed = True
            return
        self.out.append(json.dumps(json.loads(self._chars)))
        self._value_ended()

    def _check_literal(self) -> None:
        if self._chars in _LITERALS:
            self.out.append(self._chars)
            self._token = None
            self._value_ended()
        elif not any(word.startswith(self._chars) for word in _LITERALS):
            self.failed = True  # NaN and Infinity too: what the grammar never writes


def _escaped(char: str) -> str:
    return json.dumps(char, ensure_ascii=False)[1:-1]


class CallObject:
    """One call object, `{"name": ..., "arguments": {...}}` (keys in any order, others
    skipped): its name once read, and its arguments' canonical text as it is written.

    Only an object under an arguments key streams; other arguments (a string holding JSON,
    a list) are left to the finished parse. `arguments_keys`: the keys that hold the
    arguments, in the order the format's parser looks for them."""

    def __init__(self, arguments_keys: tuple[str, ...]) -> None:
        self.arguments_keys = arguments_keys
        self.name: str | None = None
        self.arguments: list[str] = []  # canonical pieces not yet taken
        self.done = False
        self.failed = False
        self._state = "start"  # start, key|end, key, colon, value, comma|end
        self._key: JsonValue | None = None
        self._key_text = ""
        self._value: JsonValue | None = None
        self._streams_value = False
        self._streamed = False  # an arguments value has streamed (the first one wins)

    def feed(self, text: str, start: int = 0) -> int:
        i = start
        while i < len(text) and not self.done and not self.failed:
            if self._key is not None:
                i = self._read_key(text, i)
            elif self._value is not None:
                i = self._read_value(text, i)
            else:
                i = self._between(text, i)
        return i

    def _between(self, text: str, i: int) -> int:
        char = text[i]
        if char in _WHITESPACE:
            return i + 1
        state = self._state
        if state == "start" and char == "{":
            self._state = "key|end"
        elif state in ("key|end", "key") and char == '"':
            self._key = JsonValue()
            return self._read_key(text, i)
        elif state == "colon" and char == ":":
            self._state = "value"
        elif state == "value":
            self._value = JsonValue()
            self._streams_value = (self._key_text in self.arguments_keys and char == "{"
                                   and not self._streamed)
            self._streamed = self._streamed or self._streams_value
            return self._read_value(text, i)
        elif state == "comma|end" and char == ",":
            self._state = "key"
        elif state in ("key|end", "comma|end") and char == "}":
            self.done = True
        else:
            self.failed = True
        return i + 1

    def _read_key(self, text: str, i: int) -> int:
        assert self._key is not None
        i = self._key.feed(text, i)
        if self._key.failed:
            self.failed = True
        elif self._key.done:
            self._key_text = json.loads(self._key.text())
            self._key = None
            self._state = "colon"
        return i

    def _read_value(self, text: str, i: int) -> int:
        value = self._value
        assert value is not None
        i = value.feed(text, i)
        if self._streams_value and value.out:
            self.arguments.extend(value.out)
            value.out.clear()
        if value.failed:
            self.failed = True
        elif value.done:
            if self._key_text == "name" and self.name is None:
                name = json.loads(value.text())
                self.name = name if isinstance(name, str) else None
            self._value = None
            self._state = "comma|end"
        return i

    def take_arguments(self) -> str:
        piece = "".join(self.arguments)
        self.arguments.clear()
        return piece


class CallStream(ABC):
    """The calls of one output as it streams. `feed` takes the next piece of the output from
    the call's start on and returns what it adds: a call's name as its first delta, then
    pieces of its arguments."""

    def __init__(self) -> None:
        self.buffer = ""
        self.started = 0  # calls whose name has gone out

    @abstractmethod
    def feed(self, piece: str) -> list[CallDelta]: ...


class JsonCallStream(CallStream):
    """JSON call objects, one after another: where the next one starts is the format's
    (`_next_object`); each object is read by a `CallObject`."""

    arguments_keys: tuple[str, ...] = ("arguments",)

    def __init__(self) -> None:
        super().__init__()
        self.pos = 0
        self.current: CallObject | None = None
        self.index: int | None = None  # the current object's call index, once named
        self.objects = 0  # call objects read to their end
        self.finished = False

    def feed(self, piece: str) -> list[CallDelta]:
        self.buffer += piece
        deltas: list[CallDelta] = []
        while not self.finished:
            if self.current is None:
                start = self._next_object()
                if start is None:
                    break
                self.current, self.index, self.pos = CallObject(self.arguments_keys), None, start
            call = self.current
            self.pos = call.feed(self.buffer, self.pos)
            if self.index is None and call.name is not None:
                self.index, self.started = self.started, self.started + 1
                deltas.append(CallDelta(self.index, name=call.name))
            if self.index is not None and call.arguments:
                piece_text = call.take_arguments()
                if deltas and deltas[-1].index == self.index:
                    deltas[-1].arguments += piece_text
                else:
                    deltas.append(CallDelta(self.index, arguments=piece_text))
            if not (call.done or call.failed):
                break
            self.current = None
            self.objects += 1
            self._object_ended(call)
        return deltas

    @abstractmethod
    def _next_object(self) -> int | None:
        """Index in `buffer` (from `pos`) of the next call object's `{`; None: not yet (or
        never: set `finished`)."""

    def _object_ended(self, call: CallObject) -> None:
        """A call object is complete (or broken): e.g. read the list's `,` or `]`."""


def _held_marker(text: str, marker: str) -> int:
    """How many characters at the end of `text` may be the start of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class TaggedCalls(JsonCallStream):
    """hermes: every `<tool_call>` opens one call object; the text between blocks is
    dropped (the finished parse keeps only the text before the first block)."""

    arguments_keys = ("arguments", "parameters")

    def __init__(self, open_tag: str) -> None:
        super().__init__()
        self.open_tag = open_tag

    def _next_object(self) -> int | None:
        found = self.buffer.find(self.open_tag, self.pos)
        if found < 0:
            self.pos = max(self.pos, len(self.buffer) - _held_marker(self.buffer, self.open_tag))
            return None
        return found + len(self.open_tag)


class LooseObjects(JsonCallStream):
    """llama3_json: objects one after another (`; ` between them, `<|python_tag|>` before)."""

    arguments_keys = ("arguments", "parameters")

    def _next_object(self) -> int | None:
        found = self.buffer.find("{", self.pos)
        if found < 0:
            self.pos = len(self.buffer)
            return None
        return found


class CallList(JsonCallStream):
    """A JSON list of call objects after an optional marker (mistral's `[TOOL_CALLS]`, the
    forced `required` output), or one object (mistral; a forced named call: `single`)."""

    def __init__(self, marker: str = "", single: bool = False) -> None:
        super().__init__()
        self.marker = marker
        self.single = single
        self.in_list = False

    def _next_object(self) -> int | None:
        while self.pos < len(self.buffer):
            rest = self.buffer[self.pos:]
            char = rest[0]
            if char in _WHITESPACE:
                self.pos += 1
            elif (self.marker and not self.in_list
                  and self.marker.startswith(rest[:len(self.marker)])):
                if len(rest) < len(self.marker):
                    return None  # maybe the marker: wait
                self.pos += len(self.marker)  # mistral may repeat it; the parse skips it too
            elif char == "{":
                return self.pos
            elif char == "[" and not self.in_list and not self.single:
                self.in_list = True
                self.pos += 1
            elif char == "," and self.in_list and self.objects:
                self.pos += 1
            else:
                self.finished = True  # `]`, or anything that is not a call: done reading
                return None
        return None

    def _object_ended(self, call: CallObject) -> None:
        if call.failed or not self.in_list:
            self.finished = True
