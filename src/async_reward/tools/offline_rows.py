"""The JSONL files of ``async-reward score``: input rows in, scored rows out, resuming.

Each non-blank input line is one sample whose texts are already decoded::

    {"id"?, "prompt", "response", "ground_truth", "data_source"?, "extra_info"?, "uid"?}

``response`` must be a string; ``prompt`` (text or chat messages) and ``ground_truth`` may be absent
(None) when the scorer does not need them (a judge template that does fails that row with status
``error``). A row's id is ``row[id_field]`` when present and not null, else its 1-based line number,
so rows without ids are only resumable while the input file is unchanged.

Every input line gets exactly one output line: the input's fields, then ``input_line``, ``score``,
``status``, ``attempts``, ``latency_s``, ``failure_reason`` and the manager's extras (these replace
input fields of the same name). A line that is not a JSON object with a string ``response`` is
recorded as ``invalid`` with the reason (and the raw line as ``input_text``), never dropped. Rows
are written whole, one at a time, so a crash can cut only the last output line short.

``--retry-failed`` scores again the rows whose status is not ``ok``: the new output is written to a
temporary file next to it (the ``ok`` rows first, then each row as it is scored, then any failed row
the run did not reach) and moved over the output in one ``os.replace``, so every row is in the
output exactly once, whether the run finishes, stops on ``on_failure: raise`` or is interrupted; a
hard kill leaves the old output as it was (and the temporary file, rewritten by the next run).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from async_reward._core.result import RewardSample, Status

__all__ = [
    "RESULT_FIELDS",
    "InputRow",
    "OutputFileError",
    "PreviousOutput",
    "count_rows",
    "invalid_row",
    "iter_input_rows",
    "load_done_keys",
    "read_previous_output",
    "scored_row",
]

#: Fields every output row gets after the input's own (the manager's extras follow them).
RESULT_FIELDS = ("input_line", "score", "status", "attempts", "latency_s", "failure_reason")


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
    if not isinstance(fields, dict):
        return InputRow(line, _key(None, line), None, text.rstrip("\r\n"), error="not a JSON object")
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


def _output_key(row: Any, id_field: str) -> str | None:
    if not isinstance(row, dict) or "input_line" not in row:
        return None
    return _key(row.get(id_field), row["input_line"])


def load_done_keys(path: Path, id_field: str) -> tuple[set[str], int, bool]:
    """Keys of the rows already in the output, how many rows it holds, and whether a truncated
    last line was removed.

    A crash can cut only the last line short (rows are written whole, one at a time), so an
    unreadable last line is removed; an unreadable line before it means the file is not ours.

    Raises:
        OutputFileError: a line before the last is not a row written by ``score``.
    """
    if not path.exists():
        return set(), 0, False
    keys: set[str] = set()
    rows = 0
    bad_tail: int | None = None  # byte offset where an unreadable line starts
    offset = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            start, offset = offset, offset + len(raw)
            if bad_tail is not None:
                raise OutputFileError(
                    f"{path} line {number - 1} is not a scored row; fix or remove it before resuming"
                )
            if not raw.strip():
                continue
            key = None
            if raw.endswith(b"\n"):
                try:
                    key = _output_key(json.loads(raw), id_field)
                except ValueError:
                    key = None
            if key is None:
                bad_tail = start
                continue
            keys.add(key)
            rows += 1
    if bad_tail is None:
        return keys, rows, False
    with open(path, "rb+") as f:
        f.truncate(bad_tail)
    return keys, rows, True


@dataclass
class PreviousOutput:
    """An output file read for ``--retry-failed``: its rows split by status, the file untouched."""

    ok_lines: list[bytes]
    """The raw lines kept as they are, in file order: rows whose status is ``ok``, and any other row
    sharing an ``ok`` row's key (an input line recorded as a duplicate of that id)."""
    ok_keys: set[str]
    """Keys of the ``ok`` rows (skipped when scoring)."""
    failed: dict[str, list[bytes]]
    """Key -> raw lines of the rows whose status is not ``ok`` and whose key has no ``ok`` row: scored
    again (all lines of a key are replaced by the rows the new run writes for it)."""
    truncated_tail: bool
    """A last line cut short by a crash was left out."""


def read_previous_output(path: Path, id_field: str) -> PreviousOutput:
    """The rows of an existing output, split into ``ok`` ones and the rest (see :class:`PreviousOutput`).

    Raises:
        OutputFileError: a line before the last is not a row written by ``score``.
    """
    previous = PreviousOutput([], set(), {}, False)
    if not path.exists():
        return previous
    with open(path, "rb") as f:
        lines = [raw for raw in f if raw.strip()]
    rows: list[tuple[str, bytes, bool]] = []
    for number, raw in enumerate(lines, start=1):
        row: Any = None
        key = None
        if raw.endswith(b"\n"):
            try:
                row = json.loads(raw)
                key = _output_key(row, id_field)
            except ValueError:
                key = None
        if key is None:
            if number == len(lines):
                previous.truncated_tail = True
                continue
            raise OutputFileError(f"{path}: row {number} is not a scored row; fix or remove it first")
        ok = row.get("status") == Status.OK.value
        rows.append((key, raw, ok))
        if ok:
            previous.ok_keys.add(key)
    for key, raw, _ok in rows:
        if key in previous.ok_keys:
            previous.ok_lines.append(raw)
        else:
            previous.failed.setdefault(key, []).append(raw)
    return previous


def _finite(value: Any) -> Any:
    # NaN/inf are not JSON; a neutral extra of a failed row (e.g. judge_verdict) becomes null.
    return None if isinstance(value, float) and not math.isfinite(value) else value


def scored_row(item: InputRow, verl_result: dict[str, Any]) -> dict[str, Any]:
    """The output row of a scored input row, from the manager's verl result (``reward_score`` and
    ``reward_extra_info``); non-finite numbers become null."""
    extra = dict(verl_result["reward_extra_info"])
    row: dict[str, Any] = dict(item.fields or {})
    row["input_line"] = item.line
    row["score"] = _finite(float(verl_result["reward_score"]))
    for name in RESULT_FIELDS[2:]:
        row[name] = extra.pop(name)
    row.update({k: _finite(v) for k, v in extra.items()})
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
