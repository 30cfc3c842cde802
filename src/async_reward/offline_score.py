"""Offline batch scoring of a JSONL file with a real reward manager (``async-reward score``).

Each non-blank input line is one sample whose texts are already decoded::

    {"id"?, "prompt", "response", "ground_truth", "data_source"?, "extra_info"?, "uid"?}

``response`` must be a string; ``prompt`` (text or chat messages) and ``ground_truth`` may be absent
(None) when the scorer does not need them (a judge template that does fails that row with status
``error``). A row's id is ``row[id_field]`` when present and not null, else its 1-based line number,
so rows without ids are only resumable while the input file is unchanged.

Every input line gets exactly one output line: the input's fields, then ``input_line``, ``score``,
``status``, ``attempts``, ``latency_s``, ``failure_reason`` and the manager's extras (these replace
input fields of the same name). A failed row scores the manager's ``fallback_score``, as it would in
training, and its ``status`` says why. A line that is not a JSON object with a string ``response``
is recorded as ``invalid`` with the reason (and the raw line as ``input_text``), never dropped.

Rows are appended and flushed one by one as they finish (so in completion order, not input order):
an interrupted run loses only the rows in flight, and a rerun with the same arguments skips every id
already in the output. A last output line cut short by a crash is removed before appending. Group
post-processing (``post_process_scores``) is not applied: it needs complete groups, and rows are
written as they are scored.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from async_reward.config import AsyncRewardConfig, ConfigError, parse_config
from async_reward.result import RewardSample, Status

if TYPE_CHECKING:
    from async_reward.managers.base import AsyncRewardManager

__all__ = [
    "FUNCTION_MANAGERS",
    "RESULT_FIELDS",
    "OutputFileError",
    "ScoreJob",
    "ScoreProgress",
    "count_rows",
    "load_done_keys",
    "load_settings",
    "score_file",
]

#: Fields every output row gets after the input's own (the manager's extras follow them).
RESULT_FIELDS = ("input_line", "score", "status", "attempts", "latency_s", "failure_reason")
#: Managers that score with ``custom_reward_function`` (``--function-path`` / ``--function-name``).
FUNCTION_MANAGERS = ("async_naive", "async_rate_limited", "async_stateful")


class OutputFileError(ValueError):
    """The output file cannot be resumed: a line other than the last is not a row we wrote."""


@dataclass
class ScoreJob:
    """One ``async-reward score`` run."""

    input_path: Path
    """JSONL file of samples (see the module docstring for the row shape)."""
    output_path: Path
    """JSONL file the scored rows are appended to; rows whose id it already holds are skipped."""
    manager: str
    """Registered manager name: ``llm_judge``, ``async_remote``, ``async_naive``, ..."""
    async_reward: dict[str, Any] = field(default_factory=dict)
    """The ``reward.async_reward`` mapping (see :func:`load_settings`)."""
    function_path: str | None = None
    """``reward.custom_reward_function.path`` for the managers in :data:`FUNCTION_MANAGERS`."""
    function_name: str = "compute_score"
    """``reward.custom_reward_function.name`` (a function, or a class for ``async_stateful``)."""
    concurrency: int = 32
    """Rows in flight at once; the manager's own ``limits.*`` apply on top."""
    id_field: str = "id"
    """Input field holding the row id; rows without it are identified by line number."""
    progress: bool = True
    """Show a tqdm progress bar on stderr."""


@dataclass
class ScoreProgress:
    """Counters of a run, filled as it goes, so they are still right after an interruption."""

    total_rows: int = 0
    """Non-blank lines in the input."""
    already_done: int = 0
    """Rows in the output before this run started."""
    repaired_tail: bool = False
    """A truncated last output line was removed."""
    skipped: int = 0
    """Input rows skipped because their id was already in the output."""
    written: int = 0
    """Rows written by this run."""
    by_status: Counter[str] = field(default_factory=Counter)
    """Rows written by this run, per status."""
    elapsed_s: float = 0.0
    """Wall time of the scoring loop."""

    @property
    def remaining(self) -> int:
        """Input rows not in the output yet."""
        return max(0, self.total_rows - self.skipped - self.written)

    def status_counts(self) -> str:
        """``ok=8 timeout=0 error=2 invalid=0``."""
        return " ".join(f"{status.value}={self.by_status[status.value]}" for status in Status)


# -- configuration --------------------------------------------------------------------------------


def load_settings(config_path: str | Path | None, overrides: list[str]) -> dict[str, Any]:
    """The ``reward.async_reward`` mapping: a YAML file holding it, then ``key=value`` dotlist
    overrides (omegaconf syntax), validated like the managers validate it.

    Raises:
        ConfigError: unreadable file, bad override, unknown key (naming the valid ones), bad value.
    """
    base: Any = OmegaConf.create({})
    if config_path is not None:
        try:
            base = OmegaConf.load(config_path)
        except Exception as exc:
            raise ConfigError(f"cannot read --config {config_path}: {exc}") from None
        if not isinstance(base, DictConfig):
            raise ConfigError(f"--config {config_path} must hold the async_reward mapping, not a list")
    try:
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(list(overrides)))
        container = OmegaConf.to_container(merged, resolve=True)
    except Exception as exc:  # omegaconf's grammar and interpolation errors
        raise ConfigError(f"bad --config or --set value: {exc}") from None
    assert isinstance(container, dict)  # merged onto a mapping
    raw = {str(key): value for key, value in container.items()}
    parse_config(AsyncRewardConfig, raw).validate()  # ConfigError names the valid keys
    return raw


def _build_manager(job: ScoreJob) -> AsyncRewardManager:
    """The manager exactly as a verl reward worker builds it, from a minimal verl-shaped config.

    Must run on the event loop that will use it (verl's base class binds the running loop).
    """
    from verl.trainer.ppo.reward import load_reward_manager

    import async_reward  # registers our managers in verl's registry

    function: dict[str, Any] = {"path": job.function_path, "name": job.function_name, "reward_kwargs": {}}
    config = OmegaConf.create(
        {
            "reward": {
                "num_workers": 1,
                "reward_manager": {"source": "register", "name": job.manager},
                "custom_reward_function": function,
                "sandbox_fusion": None,
                "async_reward": job.async_reward,
            }
        }
    )
    try:
        # verl's own loader: the registry lookup (get_reward_manager_cls) and custom_reward_function
        # resolution, as in every RewardLoopWorker. Texts are decoded already, so no tokenizer.
        manager = load_reward_manager(config, tokenizer=None)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"cannot build the {job.manager} reward manager: {exc}") from exc
    if not isinstance(manager, async_reward.AsyncRewardManager):
        raise ConfigError(f"{job.manager} is not an async-reward manager")
    return manager


# -- files ----------------------------------------------------------------------------------------


@dataclass
class _InputRow:
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


def _parse_input_line(line: int, raw: bytes, id_field: str) -> _InputRow:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _InputRow(
            line, _key(None, line), None, raw.decode("utf-8", "replace"), error=f"not UTF-8: {exc}"
        )
    try:
        fields = json.loads(text)
    except ValueError as exc:
        return _InputRow(line, _key(None, line), None, text.rstrip("\r\n"), error=f"not JSON: {exc}")
    if not isinstance(fields, dict):
        return _InputRow(line, _key(None, line), None, text.rstrip("\r\n"), error="not a JSON object")
    row = _InputRow(line, _key(fields.get(id_field), line), fields)
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


def _iter_input(path: Path, id_field: str) -> Iterator[_InputRow]:
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


def _finite(value: Any) -> Any:
    # NaN/inf are not JSON; a neutral extra of a failed row (e.g. judge_verdict) becomes null.
    return None if isinstance(value, float) and not math.isfinite(value) else value


# -- scoring --------------------------------------------------------------------------------------


def _scored_row(item: _InputRow, verl_result: dict[str, Any]) -> dict[str, Any]:
    extra = dict(verl_result["reward_extra_info"])
    row: dict[str, Any] = dict(item.fields or {})
    row["input_line"] = item.line
    row["score"] = _finite(float(verl_result["reward_score"]))
    for name in RESULT_FIELDS[2:]:
        row[name] = extra.pop(name)
    row.update({k: _finite(v) for k, v in extra.items()})
    return row


def _invalid_row(item: _InputRow, fallback_score: float) -> dict[str, Any]:
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


def score_file(
    job: ScoreJob, progress: ScoreProgress, notify: Callable[[str], None] = lambda _message: None
) -> None:
    """Score ``job.input_path`` into ``job.output_path``, resuming; fills ``progress`` as it goes.

    ``notify`` receives one-line notices (resumption, a repaired output file). On KeyboardInterrupt
    the rows in flight are cancelled, every row already scored is on disk, and the exception
    propagates with ``progress`` current.

    Raises:
        ConfigError: the manager cannot be built from ``job``.
        OutputFileError: the output file has a damaged line before its last.
        RewardScoringError: a row failed under ``on_failure: raise`` (rows written so far are kept).
    """
    done, progress.already_done, progress.repaired_tail = load_done_keys(job.output_path, job.id_field)
    if progress.repaired_tail:
        notify(f"removed a truncated last line from {job.output_path} (a run stopped mid-write)")
    if done:
        notify(f"resuming: {progress.already_done} rows already in {job.output_path}; their ids are skipped")
    progress.total_rows = count_rows(job.input_path)
    asyncio.run(_score_rows(job, progress, done))


async def _score_rows(job: ScoreJob, progress: ScoreProgress, done: set[str]) -> None:
    from tqdm import tqdm

    from async_reward.http import close_sessions

    manager = _build_manager(job)
    fallback_score = manager.settings.fallback_score
    first_line: dict[str, int] = {}  # key -> line of its first row in this run
    in_flight: set[asyncio.Task[None]] = set()
    bar = tqdm(
        total=progress.total_rows, unit="row", file=sys.stderr, disable=not job.progress, desc="scoring"
    )
    output = open(job.output_path, "a", encoding="utf-8")  # noqa: SIM115 (closed in the finally below)

    def emit(row: dict[str, Any]) -> None:
        # One write and a flush per row: a crash loses no finished row and cuts at most the last line.
        output.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        output.flush()
        progress.written += 1
        progress.by_status[row["status"]] += 1
        bar.set_postfix(progress.by_status, refresh=False)
        bar.update(1)

    async def score_and_emit(item: _InputRow) -> None:
        assert item.sample is not None
        emit(_scored_row(item, await manager.score_decoded(item.sample)))

    async def wait_for_one() -> None:
        finished, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        in_flight.difference_update(finished)
        for task in finished:
            task.result()  # on_failure=raise (or a bug) stops the run here

    started = time.monotonic()
    try:
        for item in _iter_input(job.input_path, job.id_field):
            if item.key in done:
                progress.skipped += 1
                bar.update(1)
                continue
            first = first_line.setdefault(item.key, item.line)
            if first != item.line:
                item.sample, item.error = None, f"duplicate {job.id_field} (first on line {first})"
            if item.sample is None:
                emit(_invalid_row(item, fallback_score))
                continue
            # A bounded set of tasks, not one per row: a million-row file holds `concurrency` rows.
            while len(in_flight) >= job.concurrency:
                await wait_for_one()
            in_flight.add(asyncio.create_task(score_and_emit(item)))
        while in_flight:
            await wait_for_one()
    finally:
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        output.close()
        bar.close()
        await close_sessions()
        progress.elapsed_s = time.monotonic() - started
