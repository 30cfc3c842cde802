"""``async-reward score --retry-failed`` after an outage (issue 17, item 4b): the command's ``main``
in-process (the script's start-up and signals are tested in a subprocess in tests/tools/test_cli_score.py
and tests/tools/test_cli_front.py), the local judge server on loopback going down for part of a run, then
back up.

A plain rerun keeps every failed row as final (its id is in the output); ``--retry-failed`` scores
only the rows whose status is not ``ok`` again and leaves each row in the output exactly once.
"""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from async_reward.tools.cli import main
from tests.tools.test_cli_score import judge_calls, make_rows, read_output, write_jsonl


@dataclass
class Run:
    """One ``async-reward score`` run: its exit code and what it wrote."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run_score(server: Any, capsys: pytest.CaptureFixture[str]) -> Any:
    def run(src: Path, out: Path, *extra: str) -> Run:
        argv = ["score", "--input", str(src), "--output", str(out), "--manager", "llm_judge"]
        argv += ["--no-progress", "--concurrency", "4"]
        argv += ["--set", f"judge.base_url={server.url}/v1", "retry.max_attempts=1", *extra]
        code = main(argv)
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


def test_retry_failed_rescores_only_failed_rows_and_writes_each_row_once(server, tmp_path, run_score):
    rows = make_rows(16)
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"

    server.update_config(fault_rates={"503": 0.5})  # the judge is half down
    first = run_score(src, out)
    assert first.returncode == 0, first.stderr[-3000:]
    before = {r["id"]: r for r in read_output(out)}
    failed = sorted(i for i, r in before.items() if r["status"] != "ok")
    assert failed and len(failed) < len(rows)  # an outage that hit some rows, not all
    assert all(before[i]["failure_reason"].startswith("HTTP 503") for i in failed)

    server.update_config(fault_rates={})  # the judge is back
    calls = judge_calls(server)
    plain = run_score(src, out)  # the old way: every failed row stays final
    assert plain.returncode == 0 and judge_calls(server) == calls
    assert {r["id"]: r["status"] for r in read_output(out)} == {i: r["status"] for i, r in before.items()}

    retried = run_score(src, out, "--retry-failed")
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert judge_calls(server) == calls + len(failed)  # ok rows were not scored again
    after = read_output(out)
    assert sorted(r["id"] for r in after) == sorted(r["id"] for r in rows)  # each row exactly once
    by_id = {r["id"]: r for r in after}
    assert all(r["status"] == "ok" for r in after)
    for i, row in enumerate(rows):
        assert by_id[row["id"]]["score"] == (1.0 if i % 2 == 0 else 0.0)
    for row_id, row in before.items():
        if row["status"] == "ok":
            assert by_id[row_id] == row  # kept as written
    assert f"retried {len(failed)} rows that were not ok" in retried.stdout
    assert not (tmp_path / "out.jsonl.retry-tmp").exists()


def test_retry_failed_during_a_lasting_outage_keeps_every_row_once(server, tmp_path, run_score):
    """Retrying while the judge is still down: the rows fail again and replace their old copies."""
    rows = make_rows(6)
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    server.update_config(fault_rates={"503": 1.0})
    assert run_score(src, out).returncode == 0
    again = run_score(src, out, "--retry-failed")
    assert again.returncode == 0, again.stderr[-3000:]
    after = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in after) == sorted(r["id"] for r in rows)
    assert {r["status"] for r in after} == {"error"}


def test_retry_failed_stopped_by_on_failure_raise_still_writes_each_row_once(
    server, tmp_path, run_score, caplog
):
    """The run stops at the first row that fails again: rows it did not reach keep their old row."""
    rows = make_rows(8)
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    server.update_config(fault_rates={"503": 0.5})
    assert run_score(src, out).returncode == 0
    before = {r["id"]: r for r in read_output(out)}
    assert any(r["status"] != "ok" for r in before.values())
    server.update_config(fault_rates={"503": 1.0})  # still down
    stopped = run_score(src, out, "--retry-failed", "--set", "on_failure=raise")
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    after = read_output(out)
    assert sorted(r["id"] for r in after) == sorted(r["id"] for r in rows)
    assert {r["id"]: r for r in after} == before  # nothing was scored: every old row is back
    gc.collect()  # a failed row's task whose outcome was never read is reported when collected
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_rows_sharing_an_ok_rows_id_are_kept_and_a_cut_last_line_left_out(tmp_path):
    from async_reward.tools.offline_rows import read_previous_output

    out = tmp_path / "out.jsonl"
    ok = {"id": "a", "input_line": 1, "status": "ok", "score": 1.0}
    duplicate = {"id": "a", "input_line": 2, "status": "invalid", "failure_reason": "duplicate id"}
    failed = {"id": "b", "input_line": 3, "status": "error", "failure_reason": "HTTP 503"}
    out.write_text("".join(json.dumps(r) + "\n" for r in (duplicate, ok, failed)) + '{"id": "c", "inp')
    previous = read_previous_output(out, "id")
    assert [json.loads(line)["input_line"] for line in previous.ok_lines] == [2, 1]
    assert list(previous.failed) == ['id:"b"'] and previous.truncated_tail
