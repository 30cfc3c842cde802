"""Progress output: tqdm's live bar on a real terminal (a pty), whole lines at the configured period
anywhere else, and ``async-reward score`` writing no carriage return into a piped stderr."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from async_reward._core.progress import PERIOD_ENV, PlainProgress, configured_period_s, progress_bar


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_come_at_start_every_period_and_at_close() -> None:
    clock, out = FakeClock(), io.StringIO()
    bar = PlainProgress(100, desc="scoring", unit="row", stream=out, period_s=10.0, clock=clock)
    for second in range(1, 26):  # one row a second for 25 s: lines at 10 s and 20 s only
        clock.now += 1.0
        bar.update(1)
        if second == 12:
            bar.set_postfix({"ok": 11, "error": 1}, refresh=False)
    clock.now += 2.0
    bar.close()
    bar.close()  # idempotent: no second final line

    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 4, lines
    assert lines[0].startswith("scoring:   0% 0/100 row [00:00<")
    assert lines[1].startswith("scoring:  10% 10/100 row [00:10<") and "1.00row/s" in lines[1]
    assert lines[2].startswith("scoring:  20% 20/100 row [00:20<") and lines[2].endswith("ok=11, error=1]")
    assert lines[3].startswith("scoring:  25% 25/100 row [00:27<")


def test_plain_lines_without_total_and_with_a_resumed_start() -> None:
    clock, out = FakeClock(), io.StringIO()
    with PlainProgress(None, unit="step", initial=5, stream=out, period_s=0.0, clock=clock) as bar:
        clock.now += 4.0
        bar.set_description("recipe/both")
        bar.update(2)  # period 0: every update writes a line
    assert out.getvalue().splitlines() == [
        "5 step [00:00, ?step/s]",
        "recipe/both: 7 step [00:04,  2.00s/step]",  # the update: 2 steps in 4 s (tqdm's rate format)
        "recipe/both: 7 step [00:04,  2.00s/step]",  # the close
    ]


def test_a_pipe_gets_plain_lines_and_a_disabled_bar_writes_nothing() -> None:
    out = io.StringIO()  # not a terminal, like CI's stderr or `| tee`
    bar = progress_bar(3, desc="work", stream=out, period_s=3600.0)
    assert isinstance(bar, PlainProgress)
    for _ in range(3):
        bar.update(1)
    bar.close()
    assert out.getvalue().splitlines()[-1].startswith("work: 100% 3/3 it")
    assert "\r" not in out.getvalue()

    quiet = io.StringIO()
    with progress_bar(3, stream=quiet, enabled=False) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""


def _read_everything_written(leader: int) -> str:
    """All bytes waiting on a pty's leader side. One ``os.read`` may return only the first of several
    writes (the bar's first draw), so read until nothing more arrives for a short while."""
    chunks: list[bytes] = []
    while select.select([leader], [], [], 0.5)[0]:
        chunk = os.read(leader, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


def test_a_terminal_gets_the_live_bar() -> None:
    leader, follower = pty.openpty()  # a real terminal device, 24 x 120 like a window
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    try:
        with open(follower, "w", closefd=False) as terminal:
            bar = progress_bar(4, desc="live", stream=terminal)
            assert not isinstance(bar, PlainProgress)
            for _ in range(4):
                bar.update(1)
            bar.close()
            terminal.flush()
        shown = _read_everything_written(leader)
    finally:
        os.close(leader)
        os.close(follower)
    assert "\r" in shown and "live: 100%" in shown and "4/4" in shown


def test_period_comes_from_the_environment_and_bad_values_are_refused(monkeypatch) -> None:
    monkeypatch.delenv(PERIOD_ENV, raising=False)
    assert configured_period_s() == 30.0
    monkeypatch.setenv(PERIOD_ENV, "2.5")
    assert configured_period_s() == 2.5
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv(PERIOD_ENV, bad)
        with pytest.raises(ValueError, match=PERIOD_ENV):
            configured_period_s()


@pytest.mark.subprocess
def test_score_command_writes_plain_lines_into_a_piped_stderr(server, tmp_path: Path) -> None:
    """The user's path: the real command in a subprocess whose stderr is a pipe, as in CI."""
    rows = [{"id": i, "prompt": "p", "response": f"\\boxed{{{i}}}", "ground_truth": str(i)} for i in range(5)]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["score", "--input", str(source), "--output", str(tmp_path / "out.jsonl")]
    argv += ["--manager", "llm_judge", "--set", f"judge.base_url={server.url}/v1"]
    env = {**os.environ, PERIOD_ENV: "0"}  # a line per row, so the period is seen at work
    proc = subprocess.run(
        [sys.executable, "-m", "async_reward_cli", *argv],  # the console script's entry point
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("scoring:")]
    assert lines[0].startswith("scoring:   0% 0/5 row")
    assert lines[-1].startswith("scoring: 100% 5/5 row") and "ok=5" in lines[-1]
    assert len(lines) == 1 + 5 + 1  # start, one per row (period 0), close
