"""SGLang 0.5.23: DeepSeek-V4 chat parsed by DeepSeek's deepseek-recipe StreamProcessor (a Rust parser).

Its behaviour, as measured on its wheel (tests/fixtures/real_parsers/sglang-0.5.23.jsonl):
- `<｜DSML｜` ends reasoning or content and opens tool mode, whatever block name follows (misspelled or
  missing wrapper, a bare invoke, a block before `</think>` are all read); reasoning and content lose their
  trailing newlines; a later `</think>` is swallowed, so replayed reasoning lands in the content.
- A block opener runs to its `>`, or stops short of the next tag when it lost its `>` (an `invoke name="`
  counts as one, even without its `<`).
- Tool mode reads invokes up to the first block closer and drops everything after it: later blocks,
  trailing text, stray closers. Inside the block a tag is known by its word and name attribute
  (`invoke name="`, `parameter name=`), whatever its sentinel; an invoke opener runs from its name's
  closing quote to its next `>` (so a block restarted inside a name yields a call under a garbage name),
  or to a tag or a parameter that comes before it, and a text that ends there still has the call;
  an invoke whose name is not in ASCII quotes is skipped with its parameters; unknown tools are returned.
- Arguments are written as they stream: a `string="true"` value as a JSON string (not stripped), any
  other value pasted verbatim (invalid JSON stays invalid). A parameter's name is read from its `name=`
  to the first space and pasted as it stands, quotes included or not; its value opens at the next
  `true">` or `false">` (a header without either stalls the parse where it stands) and ends at the
  first `</｜DSML｜`. A closer that does not
  match there (cut short, misspelt) leaves the parser between tags: later parameters are still read,
  and the next closer of any kind ends the invoke but not the block, so later invokes and re-sent
  blocks are read too. Between parameters, a closer whose sentinel is cut short does the same; one
  with the whole sentinel and a misspelt word ends the invoke (not the block), and so does a block
  closer after a tag left unread (`<｜DSML｜parameter nam</｜DSML｜tool_calls>`). A text that ends inside a
  value or inside the parameter's own closer leaves the arguments open; one that ends after a parameter,
  once a closer's whole sentinel is there, closes them.
"""

from __future__ import annotations

import json
from typing import Any

from dsml_checker.formats import SENTINEL, THINK_CLOSE
from dsml_checker.server_parsers._common import TAGS, Parsed

_TOOL = "<" + SENTINEL
_CLOSE = "</" + SENTINEL
_NAME_AT = ' name="'
# Inside the block, a tag is known by its word and name attribute, whatever its sentinel (a bar lost, a
# letter misspelt): deepseek-recipe reads `<DSMLinvoke name="…">` as an invoke.
_INVOKE_AT = "invoke" + _NAME_AT
_PARAM_AT = "parameter name="
"""A parameter is known by its word and `name=`: its name is read from there, quote or none."""


class _Stall(Exception):
    """The parser met a parameter header it cannot read: it stops where it stands."""


class _Reader:
    """Tool mode over `text` from `pos`: calls into `out`, as (name, arguments written so far)."""

    def __init__(self, text: str, pos: int, out: Parsed) -> None:
        self.text, self.pos, self.out = text, pos, out
        self.block_closed = False

    def find(self, token: str) -> int:
        at = self.text.find(token, self.pos)
        return len(self.text) if at < 0 else at

    def closer_name(self) -> str | None:
        """At `</｜DSML｜`: the closer's name, consuming it up to its `>`; None when the text ends first."""
        start = self.pos + len(_CLOSE)
        end = self.text.find(">", start)
        if end < 0:
            self.pos = len(self.text)
            return None
        self.pos = end + 1
        return self.text[start:end]

    def run(self) -> None:
        if not self.text.startswith(TAGS.invoke_open, self.pos):
            # The opener runs to its `>`, or stops short of the next tag when it lost its `>`.
            end = self.text.find(">", self.pos)
            tags = [at for at in (self.text.find("<", self.pos + 1), self.text.find(_INVOKE_AT, self.pos)) if at >= 0]
            next_tag = min(tags, default=-1)
            if end < 0 and next_tag < 0:
                return
            self.pos = next_tag if end < 0 or 0 <= next_tag < end else end + 1
            if self.text[self.pos - len(TAGS.opener):self.pos] != TAGS.opener:
                self.out.actions.append("opener-repaired")
        else:
            self.out.actions.append("bare-invokes-read")
        try:
            while self.pos < len(self.text):
                invoke, close = self.find(_INVOKE_AT), self.find(_CLOSE)
                if invoke == close == len(self.text):
                    return
                if invoke < close:
                    self.pos = invoke
                    self.invoke()
                    if self.block_closed:
                        return
                    continue
                self.pos = close
                name = self.closer_name()
                if name not in ("invoke", "parameter", None):
                    if self.text[self.pos:].strip():
                        self.out.actions.append("trailing-text-dropped")
                    return
        except _Stall:
            self.out.actions.append("stalled-on-malformed-parameter")

    def invoke(self) -> None:
        start = self.pos + len("invoke")
        if not self.text.startswith(_NAME_AT, start):
            self.out.actions.append("invoke-dropped")
            self.pos = start
            return
        name_end = self.text.find('"', start + len(_NAME_AT))
        if name_end < 0:
            self.pos = len(self.text)
            return
        name = self.text[start + len(_NAME_AT):name_end]
        if self.text.startswith("/>", name_end + 1):
            self.out.calls.append((name, "{}"))
            self.pos = name_end + 3
            return
        if not self.text.startswith(">", name_end + 1):
            # Text after the name's closing quote: the opener runs on to its next `>`, or stops short of a
            # tag or a parameter that comes first; a text that ends first still has the call, with no arguments.
            head_end = self.text.find(">", name_end + 1)
            tags = [at for at in (self.text.find("<", name_end + 1), self.text.find(_PARAM_AT, name_end + 1)) if at >= 0]
            next_tag = min(tags, default=-1)
            if 0 <= next_tag < head_end or (head_end < 0 and next_tag >= 0):
                self.pos = next_tag
            elif head_end < 0:
                self.out.calls.append((name, ""))
                self.pos = len(self.text)
                return
            else:
                self.out.actions.append("invoke-opener-skipped")
                self.pos = head_end + 1
        else:
            self.pos = name_end + 2
        self.out.calls.append((name, ""))
        self.body()

    def write(self, piece: str) -> None:
        name, args = self.out.calls[-1]
        self.out.calls[-1] = (name, args + piece)

    def _closer_at(self, at: int) -> str | None:
        """The known closer (`invoke`, `parameter`, `tool_calls`) spelt in full at `at`, else None."""
        return next((w for w in ("invoke", "parameter", "tool_calls") if self.text.startswith(f"{_CLOSE}{w}>", at)), None)

    def _cut_closer(self, at: int) -> str | None:
        """How the text ends inside a known closer starting at `at`: "word" once the closer's whole sentinel is
        there, "sentinel" before; None when it does not end there."""
        rest = self.text[at:]
        if not any(f"{_CLOSE}{w}>".startswith(rest) for w in ("invoke", "parameter", "tool_calls")):
            return None
        return "word" if len(rest) >= len(_CLOSE) else "sentinel"

    def body(self) -> None:
        params = 0
        # A closer that failed to match (cut short, misspelt) leaves the parser between tags: the next closer of
        # any kind then ends the invoke, never the block, so later invokes and re-sent blocks are still read.
        stray = False
        while True:
            param, close = self.find(_PARAM_AT), self.find("</")
            if param == close == len(self.text):
                self.pos = len(self.text)
                return
            if param < close:
                self.pos = param
                self.write("{" if params == 0 else ", ")
                params += 1
                ended = self.parameter()
                if ended == "cut":
                    return
                stray = stray or ended == "stray"
                continue
            known = self._closer_at(close)
            if known is None:
                cut = self._cut_closer(close)
                if cut is not None:
                    if cut == "word":  # the text ends after a closer's sentinel, between parameters: they are closed
                        self.write("}" if params else "{}")
                    self.pos = len(self.text)
                    return
                if self.text.startswith(_CLOSE, close):
                    # The whole sentinel and a word no closer has: the invoke ends there, the block does not.
                    self.out.actions.append("closer-misspelt")
                    self.write("}" if params else "{}")
                    self.pos = close + len(_CLOSE)
                    return
                self.out.actions.append("stray-closer")
                stray, self.pos = True, close + 2
                continue
            # Any closer ends the invoke (a stray parameter closer too); a block closer ends the block, unless a
            # tag before it was left unread (`<｜DSML｜parameter nam</｜DSML｜tool_calls>`).
            stray = stray or self.text.find("<", self.pos, close) >= 0
            self.pos = close + len(_CLOSE) + len(known) + 1
            self.write("}" if params else "{}")
            self.block_closed = known == "tool_calls" and not stray
            return

    def parameter(self) -> str:
        """One parameter written: "ok" when its closer followed, "stray" when a closer failed to match there (the
        parse goes on between tags), "cut" when the text ends inside its closer (the arguments stay open)."""
        start = self.pos + len("parameter")
        if not self.text.startswith(" name=", start):
            raise _Stall
        # The name runs to the first space and is pasted as it stands, its quotes included when it has them
        # (`name="q string="true">` gives the key `"q: `); the value opens at the next `true">` or `false">`,
        # however far on, whatever attribute spelling comes before it.
        key_at = start + len(" name=")
        key_end = self.text.find(" ", key_at)
        if key_end < 0:
            self.write(self.text[key_at:])
            raise _Stall
        self.write(self.text[key_at:key_end] + ": ")
        opens = [(at, flag) for flag in ("true", "false") if (at := self.text.find(f'{flag}">', key_end)) >= 0]
        if not opens:
            raise _Stall
        flag_at, flag = min(opens)
        value_at = flag_at + len(flag) + 2
        value_end = self.text.find(_CLOSE, value_at)
        value = self.text[value_at:] if value_end < 0 else self.text[value_at:value_end]
        written = json.dumps(value, ensure_ascii=False) if flag == "true" else value
        if value_end < 0:
            self.write(written[:-1] if flag == "true" else written)  # cut mid-value: left open
            self.pos = len(self.text)
            raise _Stall
        self.write(written)
        if self._closer_at(value_end) == "parameter":
            self.pos = value_end + len(_CLOSE) + len("parameter") + 1
            return "ok"
        if self._cut_closer(value_end) is not None:
            self.pos = len(self.text)
            return "cut"
        self.out.actions.append("closer-failed-inside-value")
        self.pos = value_end + 2
        return "stray"


def parse(text: str, tools: list[dict[str, Any]], tool_choice: Any) -> Parsed:
    """Reasoning up to `</think>` or the first `<｜DSML｜`, then content, then tool mode (see the module docstring)."""
    parse_tools = bool(tools) and tool_choice != "none"
    text = text.lstrip("\n")  # the reasoning of a new turn starts after its leading newlines
    think = text.find(THINK_CLOSE)
    tool_at = text.find(_TOOL) if parse_tools else -1
    if tool_at >= 0 and (think < 0 or tool_at < think):
        out = Parsed(text[:tool_at].rstrip("\n"), "")
        out.actions.append("block-in-reasoning-read")
    elif think < 0:
        return Parsed(text, "")
    else:
        out = Parsed(text[:think].rstrip("\n"), "")
        body = text[think + len(THINK_CLOSE):].lstrip("\n")  # so does the answer
        tool_at = body.find(_TOOL) if parse_tools else -1
        head = body if tool_at < 0 else body[:tool_at]
        if THINK_CLOSE in head:
            out.actions.append("think-close-swallowed")
        out.content = head.replace(THINK_CLOSE, "")
        if tool_at < 0:
            return out
        out.content = out.content.rstrip("\n")
        text = body
    _Reader(text, tool_at, out).run()
    return out
