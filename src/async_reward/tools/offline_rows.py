"""The JSONL files of ``async-reward score``: input rows in, scored rows out, resuming.

Each non-blank input line is one sample whose texts are already decoded::

    {"id"?, "prompt", "response", "ground_truth", "data_source"?, "extra_info"?, "uid"?}

``response`` must be a string; ``prompt`` (text or chat messages) and ``ground_truth`` may be absent
(None) when the scorer does not need them (a judge template that does fails that row with status
``error``). A row's id is ``row[id_field]`` when present and not null, else its 1-based line number,
so rows without ids are only resumable while the input file is unchanged.

Every input line gets exactly one output line: the input's fields, then ``input_line``, ``score``,
``status``, ``attempts``, ``latency_s``, ``failure_reason`` and the manager's extras. An extra never
replaces an input field, the id field or one of those: it is written as ``user_<name>`` instead
(``user_user_<name>`` if that is taken too), so a rerun finds every row by its own id. A line that
is not a JSON object with a string ``response`` is recorded as ``invalid`` with the reason (and the
raw line as ``input_text``), never dropped; so is a
line that could not be written back as JSON: a lone surrogate escape (``"\\ud800"``), ``NaN`` or
``Infinity``, or nesting deeper than :data:`MAX_DEPTH`. A later line with an id already seen is
recorded as ``invalid`` (``duplicate id (first on line N)``), written only after the first line's row,
so an interrupted run never leaves a duplicate's row without the first one's; such a row marks only its
own line done, never the id. Rows are written whole, one at a time, each ending in a newline, so a
crash can cut only the last output line short: only a last line without its newline is removed.

``--retry-failed`` scores again the rows whose status is not ``ok``: the new output is written to a
temporary file next to it (the ``ok`` rows first, then each row as it is scored, then any failed row
the run did not reach) and moved over the output in one ``os.replace``, so every row is in the
output exactly once, whether the run finishes, stops on ``on_failure: raise`` or is interrupted; a
hard kill leaves the old output as it was (and the temporary file, rewritten by the next run).

Longer than 400 lines: the row format both ways (input rows in, scored rows out) and the two readers
of an output (resume, ``--retry-failed``), which share how a row is keyed; apart, each half would
need the other's private helpers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from async_reward._core.result import USER_KEY_PREFIX, RewardSample, Status

__all__ = [
    "MAX_DEPTH",
    "RESULT_FIELDS",
    "DoneRows",
    "InputRow",
    "OldRow",
    "OutputFileError",
    "PreviousOutput",
    "count_rows",
    "duplicate_reason",
    "extra_field_name",
    "invalid_row",
    "iter_input_rows",
    "load_done_keys",
    "read_previous_output",
    "scored_row",
]

#: Fields every output row gets after the input's own (the manager's extras follow them).
RESULT_FIELDS = ("input_line", "score", "status", "attempts", "latency_s", "failure_reason")
#: Deepest nesting of arrays and objects an input line may have: a deeper one is an ``invalid`` row, since
#: writing it back (or reading the output) could exceed Python's recursion limit (about 1000 levels).
MAX_DEPTH = 100


class OutputFileError(ValueError):
    """The output file cannot be resumed: a line other than the last is not a row we wrote."""


@dataclass
class InputRow:
    """One input line: its id key, its fields, and the sample or why it is invalid."""

    line: int
    key: str
    fields: dict[str, Any] | None
    """The parsed object; None when the line is not a JSON object."""
    raw_text: str = ""
    sample: RewardSample | None = None
    error: str = ""
    """Why the row is invalid (then ``sample`` is None)."""


def _key(value: Any, line: int | None) -> str:
    if value is not None:
        return "id:" + json.dumps(value, sort_keys=True, ensure_ascii=False)
    return f"line:{line}"


def count_rows(path: Path) -> int:
    """Non-blank lines of ``path``."""
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def duplicate_reason(id_field: str, first_line: int) -> str:
    """The ``failure_reason`` of a later line repeating an id: how resuming tells it from the id's row."""
    return f"duplicate {id_field} (first on line {first_line})"


def _is_duplicate(row: dict[str, Any], id_field: str) -> bool:
    """A row recording a repeated id: it stands for its own input line only, never for the id."""
    reason = row.get("failure_reason")
    return (
        row.get("status") == Status.INVALID.value
        and isinstance(reason, str)
        and reason.startswith(f"duplicate {id_field} (first on line ")
    )


def _unwritable(value: Any) -> str:
    """Why a parsed line cannot be echoed into the output as strict UTF-8 JSON; "" when it can.

    ``json.loads`` accepts lone surrogate escapes (not encodable as UTF-8: writing them crashed the
    run), ``NaN``/``Infinity`` (not JSON: other readers reject the output) and any depth (the writer
    and the resume readers recurse). Iterative, so the check itself cannot overflow the stack.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "not valid Unicode: a lone surrogate escape (\\ud800-\\udfff)"
        elif isinstance(item, float) and not math.isfinite(item):
            return f"{item!r} is not a JSON number (NaN and Infinity are not JSON)"
        elif isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels"
            children = [*item, *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return ""


def _parse_input_line(line: int, raw: bytes, id_field: str) -> InputRow:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return InputRow(
            line, _key(None, line), None, raw.decode("utf-8", "replace"), error=f"not UTF-8: {exc}"
        )
    try:
        fields = json.loads(text)
    except ValueError as exc:
        return InputRow(line, _key(None, line), None, text.rstrip("\r\n"), error=f"not JSON: {exc}")
    except RecursionError:
        problem = f"nested deeper than {MAX_DEPTH} levels"
        return InputRow(line, _key(None, line), None, text.rstrip("\r\n"), error=problem)
    if not isinstance(fields, dict):
        return InputRow(line, _key(None, line), None, text.rstrip("\r\n"), error="not a JSON object")
    problem = _unwritable(fields)
    if problem:  # recorded with the raw line (valid UTF-8, the escapes as written), not the fields
        return InputRow(line, _key(None, line), None, text.rstrip("\r\n"), error=problem)
    row = InputRow(line, _key(fields.get(id_field), line), fields)
    try:
        row.sample = _sample(fields)
    except (TypeError, ValueError) as exc:
        row.error = str(exc)
    return row


def _sample(fields: dict[str, Any]) -> RewardSample:
    """The ``RewardSample`` a manager's ``decode`` would produce for this row."""
    response = fields.get("response")
    if not isinstance(response, str):
        raise ValueError("'response' must be a string" if "response" in fields else "missing 'response'")
    prompt = fields.get("prompt")
    if not (prompt is None or isinstance(prompt, str) or _is_chat(prompt)):
        raise ValueError("'prompt' must be a string or a list of chat messages")
    extra_info = fields.get("extra_info")
    if extra_info is not None and not isinstance(extra_info, dict):
        raise ValueError("'extra_info' must be an object")
    extra_info = dict(extra_info or {})
    try:
        index = int(extra_info.get("index", -1))
    except (TypeError, ValueError):
        raise ValueError("'extra_info.index' must be an integer") from None
    uid = fields.get("uid")
    return RewardSample(
        index=index,
        uid=None if uid is None else str(uid),
        data_source=str(fields.get("data_source", "unknown")),
        prompt=[dict(m) for m in prompt] if isinstance(prompt, list) else prompt,
        response=response,
        ground_truth=fields.get("ground_truth"),
        extra_info=extra_info,
    )


def _is_chat(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(m, dict) for m in value)


def iter_input_rows(path: Path, id_field: str) -> Iterator[InputRow]:
    with open(path, "rb") as f:
        for line, raw in enumerate(f, start=1):
            if raw.strip():
                yield _parse_input_line(line, raw, id_field)


def _output_row(raw: bytes, id_field: str) -> tuple[str, dict[str, Any]] | None:
    """The key and fields of an output line we wrote; None when it is not one (or is cut short)."""
    if not raw.endswith(b"\n"):
        return None
    try:
        row = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: a line nested deeper than any row we write
        return None
    if not isinstance(row, dict) or "input_line" not in row:
        return None
    return _key(row.get(id_field), row["input_line"]), row


def _not_a_row(path: Path, number: int, raw: bytes, is_last: bool) -> bool:
    """True for a last line cut short by a crash (left out); raises for any other line not a row.

    Only a last line without its newline can be a crash's: rows are written as one ``row + "\\n"``
    (json escapes newlines). A whole line that is not a row is someone else's: never deleted.
    """
    if is_last and not raw.endswith(b"\n"):
        return True
    raise OutputFileError(f"{path} line {number} is not a scored row; fix or remove it before resuming")


def _lines(f: BinaryIO) -> Iterator[tuple[int, bytes, bool]]:
    """(1-based number, line, whether it is the file's last) of each line, streamed: one line ahead."""
    previous: bytes | None = None
    number = 0
    for raw in f:
        if previous is not None:
            yield number, previous, False
        previous, number = raw, number + 1
    if previous is not None:
        yield number, previous, True


@dataclass
class DoneRows:
    """What an existing output holds, for a plain rerun (see :func:`load_done_keys`)."""

    keys: set[str]
    """Keys whose own row (that of the id's first input line) is in the output: skipped."""
    duplicates: set[tuple[str, int]]
    """(key, input line) of the ``duplicate id`` rows: each stands for its own line only."""
    rows: int
    """Rows in the output."""
    repaired_tail: bool
    """A last line cut short by a crash was removed."""


def load_done_keys(path: Path, id_field: str) -> DoneRows:
    """The rows already in the output, removing a last line cut short by a crash.

    A ``duplicate id`` row does not mark its id done (it may be written before the id's own row when
    an older version wrote it; an id's row is scored again unless it is there itself).

    Raises:
        OutputFileError: a line is not a row written by ``score`` (the last one only if it is whole).
    """
    done = DoneRows(set(), set(), 0, False)
    if not path.exists():
        return done
    bad_tail: int | None = None  # byte offset where a cut-short last line starts
    offset = 0
    with open(path, "rb") as f:
        for number, raw, is_last in _lines(f):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            parsed = _output_row(raw, id_field)
            if parsed is None:
                if _not_a_row(path, number, raw, is_last):
                    bad_tail = start
                continue
            key, row = parsed
            if _is_duplicate(row, id_field):
                done.duplicates.add((key, row["input_line"]))
            else:
                done.keys.add(key)
            done.rows += 1
    if bad_tail is not None:
        with open(path, "rb+") as f:
            f.truncate(bad_tail)
        done.repaired_tail = True
    return done


@dataclass(frozen=True)
class OldRow:
    """A row of the output ``--retry-failed`` scores again: its raw line and what it stands for."""

    key: str
    input_line: int
    duplicate: bool
    """A ``duplicate id`` row: it stands for its own input line only, not for the id."""
    raw: bytes

    def replaced_by(self, written_keys: set[str], written_lines: set[tuple[str, int]]) -> bool:
        """Whether the retry wrote the row that replaces this one: the id's own row for the id's row
        (wherever the id now is in the input), the same (key, input line) for a duplicate's row.

        Why per line for a duplicate: a run stopped after rescoring an id's first line but before
        reaching a later line of the same id must keep that line's old row, or the line is lost.
        """
        if self.duplicate:
            return (self.key, self.input_line) in written_lines
        return self.key in written_keys


@dataclass
class PreviousOutput:
    """An output file read for ``--retry-failed``: its rows split by status, the file untouched."""

    ok_lines: list[bytes]
    """The raw lines kept as they are, in file order: rows whose status is ``ok``, and any other row
    sharing an ``ok`` row's key (an input line recorded as a duplicate of that id)."""
    ok_keys: set[str]
    """Keys of the ``ok`` rows (skipped when scoring)."""
    ok_duplicates: set[tuple[str, int]]
    """(key, input line) of the ``duplicate id`` rows kept in ``ok_lines`` (skipped when scoring)."""
    failed: dict[str, list[OldRow]]
    """Key -> the rows whose status is not ``ok`` and whose key has no ``ok`` row, in file order: scored
    again. Each is replaced only by the new row standing for the same thing (:meth:`OldRow.replaced_by`);
    one the run did not reach is put back as it was."""
    truncated_tail: bool
    """A last line cut short by a crash was left out."""


def read_previous_output(path: Path, id_field: str) -> PreviousOutput:
    """The rows of an existing output, split into ``ok`` ones and the rest (see :class:`PreviousOutput`).

    Raises:
        OutputFileError: a line is not a row written by ``score`` (the last one only if it is whole).
    """
    previous = PreviousOutput([], set(), set(), {}, False)
    if not path.exists():
        return previous
    rows: list[tuple[str, bytes, dict[str, Any]]] = []
    with open(path, "rb") as f:
        numbered = list(_lines(f))
    for number, raw, is_last in numbered:
        if not raw.strip():
            continue
        parsed = _output_row(raw, id_field)
        if parsed is None:
            previous.truncated_tail = _not_a_row(path, number, raw, is_last)
            continue
        key, row = parsed
        rows.append((key, raw, row))
        if row.get("status") == Status.OK.value:
            previous.ok_keys.add(key)
    for key, raw, row in rows:
        if key in previous.ok_keys:
            previous.ok_lines.append(raw)
            if _is_duplicate(row, id_field):
                previous.ok_duplicates.add((key, row["input_line"]))
        else:
            old = OldRow(key, row["input_line"], _is_duplicate(row, id_field), raw)
            previous.failed.setdefault(key, []).append(old)
    return previous


def _finite(value: Any) -> Any:
    # NaN/inf are not JSON; a neutral extra of a failed row (e.g. judge_verdict) becomes null.
    return None if isinstance(value, float) and not math.isfinite(value) else value


def extra_field_name(name: str, taken: set[str] | dict[str, Any]) -> str:
    """The output field an extra called ``name`` is written under: ``name`` itself, or ``user_<name>``
    (the prefix repeated until free) when ``taken`` (the row's input fields, the id field and
    :data:`RESULT_FIELDS`, then the extras already placed) holds it.

    Why: resuming keys a row by its ``id_field`` and ``input_line``, so an extra replacing either
    (``async_remote`` turns every key of the service's reply, an ``id`` too, into an extra) would make
    the rerun miss the row and score and write it again; and a row must keep the input it was scored
    on. Same prefix as the managers' own renaming (``async_reward._core.result.extras_key_for``).
    """
    while name in taken:
        name = USER_KEY_PREFIX + name
    return name


def scored_row(item: InputRow, verl_result: dict[str, Any], id_field: str) -> dict[str, Any]:
    """The output row of a scored input row, from the manager's verl result (``reward_score`` and
    ``reward_extra_info``); non-finite numbers become null. An extra never replaces an input field,
    the id field (even one the input row lacks) or a result field: see :func:`extra_field_name`."""
    extra = dict(verl_result["reward_extra_info"])
    row: dict[str, Any] = dict(item.fields or {})
    row["input_line"] = item.line
    row["score"] = _finite(float(verl_result["reward_score"]))
    for name in RESULT_FIELDS[2:]:
        row[name] = extra.pop(name)
    taken = {*row, id_field}
    for name, value in extra.items():
        field_name = extra_field_name(str(name), taken)
        taken.add(field_name)
        row[field_name] = _finite(value)
    return row


def invalid_row(item: InputRow, fallback_score: float) -> dict[str, Any]:
    """The output row of an input line that is not a valid row: status ``invalid`` with the reason."""
    row: dict[str, Any] = dict(item.fields or {})
    row["input_line"] = item.line
    if item.fields is None:
        row["input_text"] = item.raw_text
    row.update(
        score=fallback_score,
        status=Status.INVALID.value,
        attempts=0,
        latency_s=0.0,
        failure_reason=item.error,
    )
    return row
