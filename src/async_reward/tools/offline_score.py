"""Offline batch scoring of a JSONL file with a real reward manager (``async-reward score``).

The manager is built exactly as a verl reward worker builds it and scores the file's rows (the row
format and resuming are ``async_reward.tools.offline_rows``'s) with ``concurrency`` rows in flight. A
failed row scores the manager's ``fallback_score``, as it would in training, and its ``status`` says
why. Rows are appended and flushed one by one as they finish (so in completion order, not input
order): an interrupted run loses only the rows in flight, and a rerun with the same arguments skips
every id already in the output. A last output line cut short by a crash (no final newline) is
removed before appending; any other line that is not a row stops the run before it starts. Group
post-processing (``post_process_scores``) is not applied: it needs complete groups, and rows are
written as they are scored.

Longer than 400 lines: the scoring run with its progress, resume and signal handling;
the rows' format is :mod:`async_reward.tools.offline_rows`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from async_reward._core.result import Status
from async_reward.config import AsyncRewardConfig, ConfigError, parse_config
from async_reward.judge.cost import add_cost
from async_reward.tools.offline_rows import (
    RESULT_FIELDS,
    InputRow,
    OutputFileError,
    PreviousOutput,
    count_rows,
    duplicate_reason,
    invalid_row,
    iter_input_rows,
    load_done_keys,
    read_previous_output,
    scored_row,
)

if TYPE_CHECKING:
    from async_reward.managers.base import AsyncRewardManager

__all__ = [
    "FUNCTION_MANAGERS",
    "MANAGERS",
    "RESULT_FIELDS",
    "OutputFileError",
    "ScoreJob",
    "ScoreProgress",
    "count_rows",
    "load_done_keys",
    "load_settings",
    "score_file",
]

#: The managers ``score`` builds: ``async_reward.MANAGER_NAMES``, written out so that the command
#: line's parser does not import the managers (verl, torch); a test pins the two equal.
MANAGERS = (
    "async_naive",
    "async_rate_limited",
    "async_remote",
    "llm_judge",
    "async_stateful",
    "async_composite",
)
#: Managers that score with ``custom_reward_function`` (``--function-path`` / ``--function-name``).
FUNCTION_MANAGERS = ("async_naive", "async_rate_limited", "async_stateful", "async_composite")


@dataclass
class ScoreJob:
    """One ``async-reward score`` run."""

    input_path: Path
    """JSONL file of samples (see ``async_reward.tools.offline_rows`` for the row shape)."""
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
    """Show progress on stderr (a live bar on a terminal, plain lines otherwise)."""
    retry_failed: bool = False
    """Score again the output's rows whose status is not ``ok`` (rewriting the output atomically, each
    row once: see ``async_reward.tools.offline_rows``); ``ok`` rows are kept, missing rows scored as usual."""


@dataclass
class ScoreProgress:
    """Counters of a run, filled as it goes, so they are still right after an interruption."""

    total_rows: int = 0
    """Non-blank lines in the input."""
    already_done: int = 0
    """Rows in the output before this run started."""
    repaired_tail: bool = False
    """A truncated last output line was removed."""
    retried: int = 0
    """Rows of the output whose status was not ``ok``, scored again (``retry_failed``)."""
    skipped: int = 0
    """Input rows skipped because their id was already in the output."""
    written: int = 0
    """Rows written by this run."""
    by_status: Counter[str] = field(default_factory=Counter)
    """Rows written by this run, per status."""
    elapsed_s: float = 0.0
    """Wall time of the scoring loop."""
    stopped_by: int | None = None
    """The signal (``SIGINT``, ``SIGTERM``) that stopped the run, None when it was not stopped."""
    cost: dict[str, float] = field(default_factory=dict)
    """What the rows written by this run cost, summed under the training metrics' names
    (``reward/cost/calls``, ``shared``, ``prompt_tokens``, ``completion_tokens``, ``tokens``,
    ``cache_hits``, ``money``; see ``async_reward.judge.cost.cost_metrics``)."""

    @property
    def remaining(self) -> int:
        """Input rows not in the output yet."""
        return max(0, self.total_rows - self.skipped - self.written)

    def status_counts(self) -> str:
        """``ok=8 timeout=0 error=2 invalid=0``."""
        return " ".join(f"{status.value}={self.by_status[status.value]}" for status in Status)

    def cost_summary(self) -> str:
        """``calls=12 shared=3 cache_hits=1 tokens=5400 (prompt 5000, completion 400) money=0.0123``:
        the token and money parts only where the manager reports them."""
        cost = {name.removeprefix("reward/cost/"): value for name, value in self.cost.items()}
        parts = [f"calls={cost.get('calls', 0):g}", f"shared={cost.get('shared', 0):g}"]
        if "tokens" in cost:
            parts.append(f"cache_hits={cost['cache_hits']:g}")
            parts.append(
                f"tokens={cost['tokens']:g} (prompt {cost['prompt_tokens']:g}, "
                f"completion {cost['completion_tokens']:g})"
            )
        if "money" in cost:
            parts.append(f"money={cost['money']:.6g}")
        return " ".join(parts)


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
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise ConfigError(f"cannot read --config {config_path}: {reason}") from None
        except Exception as exc:
            raise ConfigError(f"cannot read --config {config_path}: {_error_kind(exc)}") from None
        if not isinstance(base, DictConfig):
            raise ConfigError(f"--config {config_path} must hold the async_reward mapping, not a list")
    dotlist: list[Any] = []
    for override in overrides:  # one by one, so that an error names the key it is about
        key = override.partition("=")[0]
        try:
            dotlist.append(OmegaConf.from_dotlist([override]))
        except Exception as exc:
            raise ConfigError(f"--set {key}: {_error_kind(exc, position=False)}") from None
    try:
        merged = OmegaConf.merge(base, *dotlist)
        container = OmegaConf.to_container(merged, resolve=True)
    except Exception as exc:  # a value that does not fit its place, an interpolation that does not resolve
        full_key = getattr(exc, "full_key", None)
        where = f" at key {full_key}" if full_key else ""
        raise ConfigError(f"bad --config or --set value{where}: {_error_kind(exc)}") from None
    assert isinstance(container, dict)  # merged onto a mapping
    raw = {str(key): value for key, value in container.items()}
    parse_config(AsyncRewardConfig, raw).validate()  # ConfigError names the valid keys
    return raw


def _error_kind(exc: Exception, position: bool = True) -> str:
    """What went wrong in a YAML or omegaconf error, without its text: the text quotes the value (a YAML
    error shows the line with a caret, an omegaconf grammar error the fragment it stopped at), and a
    value may be a secret (``--set remote.headers.X-Api-Key=...``). With ``position``, a YAML error
    says where (a file's line and column; not for a ``--set`` value, where it tells nothing)."""
    import yaml
    from omegaconf.errors import GrammarParseError, InterpolationKeyError, InterpolationResolutionError

    kind = type(exc).__name__
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None and position else ""
        return (
            f"not valid YAML{at} ({kind}: an unbalanced quote, bracket or brace, or a ': ' in an "
            "unquoted value?); the text is not shown, in case it holds a secret"
        )
    if isinstance(exc, GrammarParseError):
        return (
            f"not valid omegaconf syntax ({kind}: an unclosed '${{'? a literal '${{' is written '\\${{'); "
            "the value is not shown, in case it holds a secret"
        )
    if isinstance(exc, InterpolationKeyError):
        return f"an interpolation ${{...}} names a key that does not exist ({kind}); the value is not shown"
    if isinstance(exc, InterpolationResolutionError):
        return (
            f"an interpolation ${{...}} cannot be resolved ({kind}: ${{oc.env:VAR}} with VAR unset?); "
            "the value is not shown"
        )
    return f"{kind}; the value is not shown, in case it holds a secret"


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


# -- scoring --------------------------------------------------------------------------------------


def score_file(
    job: ScoreJob, progress: ScoreProgress, notify: Callable[[str], None] = lambda _message: None
) -> None:
    """Score ``job.input_path`` into ``job.output_path``, resuming; fills ``progress`` as it goes.

    ``notify`` receives one-line notices (resumption, a repaired output file). SIGINT (Ctrl-C) or
    SIGTERM stops the run at once: the rows in flight are cancelled, every row already scored is on
    disk, ``progress.stopped_by`` names the signal and KeyboardInterrupt is raised (see
    :class:`_StopOnSignals`; a second signal while stopping acts as it would without us).

    Raises:
        ConfigError: the manager cannot be built from ``job``.
        OutputFileError: the output file has a damaged line before its last, or cannot be a file (its
            directory does not exist, or a directory is in its place).
        RewardScoringError: a row failed under ``on_failure: raise`` (rows written so far are kept).
    """
    # Before the manager is built (seconds), not by open() after it: the command line checks this too.
    if not job.output_path.parent.is_dir():
        raise OutputFileError(f"{job.output_path}: its directory {job.output_path.parent} does not exist")
    if job.output_path.exists() and not job.output_path.is_file():
        raise OutputFileError(f"{job.output_path} is not a file")
    if job.retry_failed:
        previous = read_previous_output(job.output_path, job.id_field)
        progress.already_done, progress.retried = len(previous.ok_keys), len(previous.failed)
        progress.repaired_tail = previous.truncated_tail
        if previous.truncated_tail:
            notify(f"left out a truncated last line of {job.output_path} (a run stopped mid-write)")
        notify(
            f"retrying {progress.retried} rows of {job.output_path} whose status is not ok; "
            f"keeping {progress.already_done} ok rows"
        )
        progress.total_rows = count_rows(job.input_path)
        scoring = _score_rows(job, progress, previous.ok_keys, previous.ok_duplicates, previous)
        _run_stoppable(scoring, progress, notify)
        return
    done = load_done_keys(job.output_path, job.id_field)
    progress.already_done, progress.repaired_tail = done.rows, done.repaired_tail
    if progress.repaired_tail:
        notify(f"removed a truncated last line from {job.output_path} (a run stopped mid-write)")
    if done.rows:
        notify(f"resuming: {progress.already_done} rows already in {job.output_path}; their ids are skipped")
    progress.total_rows = count_rows(job.input_path)
    _run_stoppable(_score_rows(job, progress, done.keys, done.duplicates), progress, notify)


def _run_stoppable(scoring: Any, progress: ScoreProgress, notify: Callable[[str], None]) -> None:
    """``asyncio.run(scoring)``; KeyboardInterrupt once a signal stopped it (rows kept)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Whoever started us asked for it (a shell starts a background job so, to keep the terminal's
        # Ctrl-C from it): honoured, and said, with the way to stop the run that still works.
        if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
            how = "SIGTERM is ignored too: only SIGKILL stops it, losing the rows in flight"
        else:
            how = "SIGTERM (kill PID) stops it, keeping every scored row"
        notify(
            "SIGINT is ignored in this process (started in the background?): Ctrl-C will not stop "
            f"this run; {how}"
        )
    asyncio.run(scoring)
    if progress.stopped_by is not None:
        raise KeyboardInterrupt


class _StopOnSignals:
    """For the run: the first SIGINT or SIGTERM records itself in ``progress.stopped_by`` and cancels
    the scoring loop (while it scores; in its clean-up, which writes the output's end, it is only
    recorded); the handlers the process had are restored on exit.

    Why not asyncio.run's own Ctrl-C handling: it is installed only when the process has Python's
    default handler (under a program with a SIGINT handler of its own, the KeyboardInterrupt is
    raised inside whatever runs, a reward function included, which fails that row and scores on),
    it does not cover SIGTERM, and a signal the kernel hands to another thread (aiohttp's resolver,
    torch's pools) waits for the event loop to wake by itself, at its next timer (up to a judge
    call's timeout). ``loop.add_signal_handler`` wakes the loop through its wakeup fd and runs the handler on
    it. A signal whose disposition is ``SIG_IGN`` stays ignored; off the main thread nothing is set.
    """

    def __init__(self, task: asyncio.Task[Any], progress: ScoreProgress) -> None:
        self.task = task
        self.progress = progress
        self.scoring = True
        """False once the loop is in its clean-up: a signal then must not cancel the output's end."""
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> _StopOnSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(signum)
            if handler in (signal.SIG_IGN, None):  # ignored by whoever started us, or set outside Python
                continue
            try:
                loop.add_signal_handler(signum, self._stop, signum)
            except NotImplementedError:  # event loops without signal support (Windows)
                continue
            self.previous[signum] = handler
        return self

    def _stop(self, signum: int) -> None:
        if self.progress.stopped_by is None:
            self.progress.stopped_by = signum
            if self.scoring:
                self.task.cancel()
        # A second signal while the run stops acts as with no handler of ours (Ctrl-C: KeyboardInterrupt).
        asyncio.get_running_loop().remove_signal_handler(signum)
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)

    def __exit__(self, *_exc: object) -> None:
        loop = asyncio.get_running_loop()
        for signum, handler in self.previous.items():
            loop.remove_signal_handler(signum)
            signal.signal(signum, handler)


async def _score_rows(
    job: ScoreJob,
    progress: ScoreProgress,
    done: set[str],
    done_duplicates: set[tuple[str, int]],
    previous: PreviousOutput | None = None,
) -> None:
    """Score the rows not in ``done`` (keys) or ``done_duplicates`` ((key, line) of the ``duplicate id``
    rows written); with ``previous`` (``retry_failed``), into a temporary file that replaces the output
    at the end (its ok rows first, its failed rows not reached last).

    A duplicate's row waits until its id's own row is written (at once if it is already): written
    first, it would mark the id done (for a resume, or for ``--retry-failed``'s old rows) while the
    id's row could still be lost to an interruption. A run that stops first drops it: the rerun
    writes it.
    """
    from async_reward._core.http import close_sessions
    from async_reward._core.progress import progress_bar

    manager = _build_manager(job)
    fallback_score = manager.settings.fallback_score
    first_line: dict[str, int] = {}  # key -> line of its first row in the input
    written_keys: set[str] = set()  # keys whose own row (the first line's) this run wrote
    written_lines: set[tuple[str, int]] = set()  # (key, input line) of every row this run wrote
    held: dict[str, list[InputRow]] = {}  # key -> its duplicates, waiting for the key's own row
    in_flight: set[asyncio.Task[None]] = set()
    bar = progress_bar(progress.total_rows, unit="row", enabled=job.progress, desc="scoring")
    target = job.output_path
    if previous is not None:
        target = job.output_path.with_name(job.output_path.name + ".retry-tmp")
        with open(target, "wb") as kept:
            kept.writelines(previous.ok_lines)
    output = open(target, "ab")  # noqa: SIM115 (closed in the finally below)

    def write(row: dict[str, Any], key: str) -> None:
        text = json.dumps(row, ensure_ascii=False, default=str) + "\n"
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (from a manager's extras): escaped, still JSON
            data = (json.dumps(row, default=str) + "\n").encode("ascii")
        # One write and a flush per row: a crash loses no finished row and cuts at most the last line.
        output.write(data)
        output.flush()
        written_lines.add((key, row["input_line"]))
        progress.written += 1
        progress.by_status[row["status"]] += 1
        add_cost(progress.cost, row)
        bar.set_postfix(progress.by_status, refresh=False)
        bar.update(1)

    def emit(row: dict[str, Any], key: str) -> None:
        """The row of the key's first input line, then the duplicates that waited for it."""
        write(row, key)
        written_keys.add(key)
        for duplicate in held.pop(key, []):
            write(invalid_row(duplicate, fallback_score), key)

    async def score_and_emit(item: InputRow) -> None:
        assert item.sample is not None
        emit(scored_row(item, await manager.score_decoded(item.sample), job.id_field), item.key)

    async def wait_for_one() -> None:
        finished, _ = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        in_flight.difference_update(finished)
        # Every finished task's outcome is read before the first failure stops the run (on_failure=
        # raise, or a bug): a failure left unread would be logged at exit as "Task exception was
        # never retrieved", a second report of a row the output already accounts for.
        outcomes = [asyncio.CancelledError() if task.cancelled() else task.exception() for task in finished]
        for error in outcomes:
            if error is not None:
                raise error

    started = time.monotonic()
    task = asyncio.current_task()
    assert task is not None  # run by asyncio.run
    with _StopOnSignals(task, progress) as stopping:
        try:
            for item in iter_input_rows(job.input_path, job.id_field):
                first = first_line.setdefault(item.key, item.line)
                if item.key in done if first == item.line else (item.key, item.line) in done_duplicates:
                    progress.skipped += 1
                    bar.update(1)
                    continue
                if first != item.line:
                    item.sample, item.error = None, duplicate_reason(job.id_field, first)
                    if item.key in done or item.key in written_keys:
                        write(invalid_row(item, fallback_score), item.key)
                    else:
                        held.setdefault(item.key, []).append(item)
                    continue
                if item.sample is None:
                    emit(invalid_row(item, fallback_score), item.key)
                    continue
                # A bounded set of tasks, not one per row: a million-row file holds `concurrency` rows.
                while len(in_flight) >= job.concurrency:
                    await wait_for_one()
                in_flight.add(asyncio.create_task(score_and_emit(item)))
            while in_flight:
                await wait_for_one()
        except asyncio.CancelledError:
            if progress.stopped_by is None:  # not our signal: someone else's cancellation
                raise
            task.uncancel()  # stopped by a signal: clean up below, then score_file raises KeyboardInterrupt
        finally:
            stopping.scoring = False
            for pending in in_flight:
                pending.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
            if previous is not None:
                # Failed rows this run did not replace stay as they were: every row once. Per row, not
                # per key: an id's later lines the run did not reach keep theirs (OldRow.replaced_by).
                output.flush()
                with open(target, "ab") as rest:
                    for old_rows in previous.failed.values():
                        for old in old_rows:
                            if not old.replaced_by(written_keys, written_lines):
                                rest.write(old.raw)
            output.close()
            if previous is not None:
                os.replace(target, job.output_path)
            bar.close()
            await close_sessions()
            progress.elapsed_s = time.monotonic() - started
