"""`dsml-check FILE|-`: judge JSON lines of chat completions; one JSON verdict per line, a summary on stderr.

Each input line is an OpenAI `chat.completion` object or `{"message": …, "finish_reason": …}`, optionally with
`"request": {"tools": […], "tool_choice": …, "chat_template_kwargs": {"thinking": …}}` and with `"raw": "…"`, the
text the model generated for the turn (judged in the thinking mode the request states, if it states one).
A line with raw text gets three verdicts: on the message, on the raw text, and on what the parse lost of it; it
is corrupt if any is, and the summary counts the damage the server's parser hid (raw text corrupt, message not)
and made (raw text clean, message or parse corrupt). Exit 0 when every input is clean or suspect, 1 when any is
corrupt (or suspect, with --strict), 2 on unreadable input, naming the line (not UTF-8, not JSON, nested
too deeply, not a completion object, an unreadable path), 255 on an internal error, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass
from typing import IO, Any, Iterator

from dsml_checker.check import check
from dsml_checker.findings import RULES
from dsml_checker.formats import FORMATS, stated_thinking
from dsml_checker.verdicts import judge_turn

# Model text is untrusted: C1 controls, bidi overrides and line separators survive ensure_ascii=False and
# could drive or reorder a terminal, and lone surrogates cannot be encoded at all, so all of them are written
# as JSON \\u escapes (still the same JSON string).
_TERMINAL_UNSAFE = {
    c: f"\\u{c:04x}"
    for c in [*range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029, *range(0xD800, 0xE000)]
}

EXIT_CLEAN = 0
EXIT_CORRUPT = 1
EXIT_UNREADABLE = 2

# A bug here must not pass for a verdict (0, 1) or bad input (2), and must be above 127 so that `git bisect run`
# stops instead of marking the commit bad: the harness's internal-error code.
EXIT_INTERNAL = 255


class InputError(Exception):
    """An input line that cannot be judged: its message names the source and line."""


@dataclass(frozen=True)
class Turn:
    """One judged input: the message, how it finished, and the request's tools and tool_choice."""

    line: int
    message: Any
    finish_reason: Any
    tools: Any
    tool_choice: Any
    response_id: str | None
    raw: str | None = None
    """The text the model generated for this turn, when the line carries it."""
    thinking: bool | None = None
    """The thinking mode the request states (`chat_template_kwargs`), None when it states none."""


def _turn(obj: Any, where: str, line: int) -> Turn:
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, found {type(obj).__name__}")
    request = obj.get("request")
    if request is not None and not isinstance(request, dict):
        raise InputError(f'{where}: "request" must be an object')
    request = request or {}
    response_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    if "choices" in obj:
        choices = obj["choices"]
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise InputError(f'{where}: "choices" must be a non-empty list of objects')
        message, finish = choices[0].get("message"), choices[0].get("finish_reason")
    elif "message" in obj:
        message, finish = obj["message"], obj.get("finish_reason")
    else:
        raise InputError(f'{where}: expected a chat.completion object (with "choices") or {{"message": …}}')
    raw = obj.get("raw")
    if raw is not None and not isinstance(raw, str):
        raise InputError(f'{where}: "raw" must be a string (the text the model generated)')
    return Turn(line, message, finish, request.get("tools"), request.get("tool_choice"), response_id, raw,
                stated_thinking(request))


def read_turns(stream: IO[bytes], source: str) -> Iterator[Turn]:
    """Parse JSON lines lazily, so verdicts for good lines come out before a bad line stops the run."""
    number = 0
    while True:
        try:
            raw = stream.readline()
        except OSError as err:  # EIO and the like, mid-file: the input, not a bug, and not a verdict
            raise InputError(f"cannot read {source} after line {number}: {err.strerror or err}") from None
        if not raw:
            return
        number += 1
        where = f"{source}:{number}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            if err.reason == "unexpected end of data" and not raw.endswith(b"\n"):
                raise InputError(f"{where}: the last line ends inside a UTF-8 character (a torn line?)") from None
            raise InputError(f"{where}: not UTF-8 ({err.reason} at byte {err.start})") from None
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except ValueError as err:
            raise InputError(f"{where}: not valid JSON ({err})") from None
        except RecursionError:
            # The line's nesting is the response's structure, which a server or the harness wrote: the model's
            # text reaches it only inside strings. A line nested past the parser's limit is damaged input.
            raise InputError(f"{where}: JSON nested too deeply to read (about a thousand levels or more)") from None
        yield _turn(obj, where, number)


def _open(path: str) -> IO[bytes]:
    if path == "-":
        return sys.stdin.buffer
    try:
        return open(path, "rb")  # noqa: SIM115 - closed by main
    except OSError as err:
        raise InputError(f"cannot read {path}: {err.strerror}") from None


def judge(turn: Turn, fmt: str) -> tuple[dict[str, Any], str | None]:
    """The output row of one turn, and what the server's parser did to it: "hid" (raw text corrupt, parsed
    message not), "made" (raw text clean, parser's side corrupt), or None (also when there is no raw text).

    With raw text the row has three verdicts: `parsed` (the message, what an agent saw: `findings`), `raw`
    (`check_raw`), `lost` (what the parse lost of the raw text); `label` is the worst of them.
    """
    row: dict[str, Any] = {"line": turn.line, "id": turn.response_id}
    if turn.raw is None:
        seen = check(turn.message, finish_reason=turn.finish_reason, tools=turn.tools, tool_choice=turn.tool_choice)
        return {**row, **seen.to_dict()}, None
    verdicts = judge_turn(turn.message, turn.raw, finish_reason=turn.finish_reason, tools=turn.tools,
                          tool_choice=turn.tool_choice, fmt=fmt, thinking=turn.thinking)
    effect = "hid" if verdicts.hid else "made" if verdicts.made else None
    row |= {"label": verdicts.label, "findings": verdicts.parsed.to_dict()["findings"], "parsed": verdicts.parsed.label}
    row |= {"raw": verdicts.raw.to_dict(), "lost": verdicts.lost.to_dict(), "parser": effect}
    return row, effect


def run(path: str, *, strict: bool, out: IO[str], err: IO[str], fmt: str = "v4") -> int:
    """Judge every line of `path`, write verdicts to `out` and the summary to `err`; return the exit code."""
    counts: Counter[str] = Counter()
    effects: Counter[str | None] = Counter()
    source = "<stdin>" if path == "-" else path
    # Model text is mostly non-ASCII markup: where the output cannot encode it, write it as JSON escapes.
    ascii_only = codecs.lookup(getattr(out, "encoding", None) or "utf-8").name != "utf-8"
    try:
        stream = _open(path)
        try:
            for turn in read_turns(stream, source):
                row, effect = judge(turn, fmt)
                counts[row["label"]] += 1
                if turn.raw is not None:
                    effects[effect] += 1
                out.write(json.dumps(row, ensure_ascii=ascii_only).translate(_TERMINAL_UNSAFE) + "\n")
        finally:
            if stream is not sys.stdin.buffer:
                stream.close()
    except InputError as problem:
        out.flush()
        err.write(f"dsml-check: error: {problem}\n")
        return EXIT_UNREADABLE
    total = sum(counts.values())
    with_raw = sum(effects.values())
    parser = f"; with raw text {with_raw}: the parser hid {effects['hid']}, made {effects['made']}" if with_raw else ""
    err.write(
        f"dsml-check: {total} input{'s' if total != 1 else ''}: {counts['clean']} clean, "
        f"{counts['corrupt']} corrupt, {counts['suspect']} suspect{parser}\n"
    )
    if counts["corrupt"] or (strict and counts["suspect"]):
        return EXIT_CORRUPT
    return EXIT_CLEAN


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="dsml-check",
        description="Judge chat completions (JSON lines) for broken DeepSeek DSML tool-call markup.",
        epilog="A line with raw text gets a verdict on the message (\"parsed\", with \"findings\"), on the raw text "
        '("raw") and on what the parse lost of it ("lost"); "label" is the worst, and "parser" says whether the '
        'server\'s parser "hid" damage (raw corrupt, message not) or "made" it (raw clean). Exit codes: 0 clean or '
        "suspect, 1 corrupt (or suspect with --strict), 2 unreadable input (one line naming it), 255 internal error, "
        "130 interrupted.",
    )
    parser.add_argument(
        "file",
        nargs="?",
        help="JSON-lines file of chat.completion objects or {message, finish_reason}, each optionally with "
        '"request": {tools, tool_choice} and "raw": the text the model generated (judged too); - for stdin',
    )
    parser.add_argument("--format", choices=FORMATS, default="v4", help="the DSML format of raw texts (default v4)")
    parser.add_argument("--strict", action="store_true", help="count suspect turns (soft findings) as failures")
    parser.add_argument("--list-rules", action="store_true", help="print every rule id, severity and description")
    opts = parser.parse_args(argv)
    if opts.list_rules:
        for rule, (severity, description) in RULES.items():
            sys.stdout.write(f"{rule:24s} {severity:5s} {description}\n")
        sys.exit(EXIT_CLEAN)
    if opts.file is None:
        parser.error("a FILE (or - for stdin) is required")
    try:
        code = run(opts.file, strict=opts.strict, out=sys.stdout, err=sys.stderr, fmt=opts.format)
        sys.stdout.flush()
    except KeyboardInterrupt:
        sys.stderr.write("dsml-check: interrupted\n")
        code = 130
    except MemoryError:
        sys.stderr.write("dsml-check: internal error: out of memory\n")
        code = EXIT_INTERNAL
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_CLEAN
    except Exception as bug:  # noqa: BLE001 - whatever it is, `git bisect run` must not read it as a verdict
        detail = " ".join(str(bug).split())
        sys.stderr.write(f"dsml-check: internal error: {type(bug).__name__}: {detail}\n".translate(_TERMINAL_UNSAFE))
        code = EXIT_INTERNAL
    sys.exit(code)


if __name__ == "__main__":
    main()
