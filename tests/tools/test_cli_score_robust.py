"""``async-reward score`` against hostile input and interruptions (review of the command, D1-D6): every
input line ends with exactly one output row of its own, whatever the input holds and wherever a run
stops; ``main`` in-process with a custom reward function (no judge, no subprocess).
"""

from __future__ import annotations

import json
import signal
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from async_reward.tools.cli import main
from tests.tools.test_cli_score import read_output, write_jsonl

FUNCTIONS = textwrap.dedent(
    """
    import asyncio, os, signal

    async def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0 if solution_str == ground_truth else 0.0

    async def stop_on_stop(data_source, solution_str, ground_truth, extra_info=None):
        # Every row waits; the row "stop" sends Ctrl-C while the others are in flight.
        if solution_str == "stop":
            os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(30)
        return 1.0

    async def outage(data_source, solution_str, ground_truth, extra_info=None):
        raise ConnectionError("judge down")

    async def down_for_b(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "b":
            raise ConnectionError("judge down again")
        return 1.0
    """
)


@pytest.fixture
def ctrl_c() -> Iterator[None]:
    """Python's own Ctrl-C handling, as in a terminal's foreground job; restored after the test."""
    saved = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, saved)


def score(tmp_path: Path, rows: list[Any], *extra: str, out: Path | None = None) -> tuple[int, Path]:
    functions = tmp_path / "reward_fn.py"
    functions.write_text(FUNCTIONS)
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = out or tmp_path / "out.jsonl"
    argv = ["score", "--input", str(src), "--output", str(out), "--manager", "async_naive", "--no-progress"]
    argv += ["--function-path", str(functions), "--concurrency", "4", *extra]
    return main(argv), out


def strict_rows(out: Path) -> list[dict[str, Any]]:
    """The output read as any JSON reader would: strict UTF-8, no NaN/Infinity."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return [json.loads(line, parse_constant=refuse) for line in out.read_bytes().decode("utf-8").splitlines()]


DUPLICATED = [
    {"id": "a", "prompt": "q", "response": "4", "ground_truth": "4"},
    {"id": "a", "prompt": "q", "response": "5", "ground_truth": "4"},
    {"id": "b", "prompt": "q", "response": "stop", "ground_truth": "4"},
]
CALM = [*DUPLICATED[:2], {**DUPLICATED[2], "response": "4"}]  # the same rows without the Ctrl-C
DUPLICATE_ROW = {
    "id": "a",
    "input_line": 2,
    "status": "invalid",
    "failure_reason": "duplicate id (first on line 1)",
}


def assert_each_line_once(out: Path) -> None:
    """One row per input line: the id's first line scored, the later one recorded as its duplicate."""
    rows = {r["input_line"]: r for r in read_output(out)}
    assert len(read_output(out)) == 3 and sorted(rows) == [1, 2, 3], rows
    assert rows[1]["status"] == "ok" and rows[1]["score"] == 1.0
    assert rows[2]["status"] == "invalid" and rows[2]["failure_reason"] == "duplicate id (first on line 1)"


def test_a_duplicate_id_interrupted_before_its_first_row_loses_neither(tmp_path, capsys, ctrl_c):
    # D1: the duplicate's row was written while line 1 was in flight; the rerun took id "a" as done.
    code, out = score(tmp_path, DUPLICATED, "--function-name", "stop_on_stop")
    assert code == 130
    assert all(r["input_line"] != 2 for r in read_output(out))  # never before line 1's row
    assert score(tmp_path, DUPLICATED)[0] == 0
    assert_each_line_once(out)


def test_a_duplicate_row_alone_in_the_output_does_not_mark_its_id_done(tmp_path, capsys):
    # An output left so by an older version: the id's own row is scored, the duplicate not again.
    out = write_jsonl(
        tmp_path / "out.jsonl",
        [
            {
                "id": "a",
                "input_line": 2,
                "status": "invalid",
                "failure_reason": "duplicate id (first on line 1)",
            }
        ],
    )
    rows = [*DUPLICATED[:2], {**DUPLICATED[2], "response": "4"}]
    assert score(tmp_path, rows, out=out)[0] == 0
    assert_each_line_once(out)
    assert "scored 2 rows" in capsys.readouterr().out


def test_retry_failed_interrupted_keeps_the_failed_row_of_a_duplicated_id(tmp_path, capsys, ctrl_c):
    # D1 for --retry-failed: the duplicate's new row put id "a" in the written keys, and line 1's old
    # error row was dropped from the replaced output although line 1 was never scored again.
    code, out = score(tmp_path, DUPLICATED, "--function-name", "outage")
    assert code == 0
    before = sorted(out.read_text().splitlines())
    assert score(tmp_path, DUPLICATED, "--retry-failed", "--function-name", "stop_on_stop")[0] == 130
    assert sorted(out.read_text().splitlines()) == before  # nothing finished: every old row is back
    assert score(tmp_path, CALM, "--retry-failed")[0] == 0
    assert_each_line_once(out)


SURROGATE = '{"id": 2, "prompt": "q", "response": "bad \\ud800", "ground_truth": "4"}'
SURROGATE_INVALID = '{"id": 3, "prompt": "\\udfff", "ground_truth": "4"}'  # no response, too


def test_lone_surrogates_nan_and_deep_nesting_are_invalid_rows_not_crashes(tmp_path, capsys):
    # D2, D3, D6: a lone surrogate crashed the write (and every rerun), deep nesting crashed the parse,
    # and NaN was echoed into the output as a bare NaN that no strict JSON reader accepts.
    deep = '{"id": 6, "response": "4", "x": ' + "[" * 5000 + "]" * 5000 + "}"
    deep_ok_for_json = '{"id": 7, "response": "4", "x": ' + "[" * 150 + "]" * 150 + "}"
    lines = [
        {"id": 1, "prompt": "q", "response": "4", "ground_truth": "4"},
        SURROGATE,
        SURROGATE_INVALID,
        '{"id": 4, "prompt": "q", "response": "4", "ground_truth": NaN}',
        '{"id": Infinity, "prompt": "q", "response": "4", "ground_truth": "4"}',
        deep,
        deep_ok_for_json,
    ]
    code, out = score(tmp_path, lines)
    assert code == 0
    rows = {r["input_line"]: r for r in strict_rows(out)}
    assert sorted(rows) == list(range(1, 8))
    assert rows[1]["status"] == "ok"
    reasons = {
        2: "not valid Unicode",
        3: "not valid Unicode",
        4: "NaN and Infinity are not JSON",
        5: "NaN and Infinity are not JSON",
        6: "nested deeper than 100 levels",
        7: "nested deeper than 100 levels",
    }
    for line, reason in reasons.items():
        assert rows[line]["status"] == "invalid" and reason in rows[line]["failure_reason"], rows[line]
        assert rows[line]["input_text"] == lines[line - 1]  # the line as written, escapes included
    capsys.readouterr()
    assert score(tmp_path, lines)[0] == 0  # the rerun reads that output back and finds every row done
    assert len(strict_rows(out)) == 7 and "scored 0 rows" in capsys.readouterr().out


def test_a_whole_last_output_line_that_is_not_a_row_is_refused_not_deleted(tmp_path, capsys):
    # D4: it was removed as "truncated by a crash"; only a last line without its newline can be that.
    rows = [{"id": 1, "prompt": "q", "response": "4", "ground_truth": "4"}]
    assert score(tmp_path, rows)[0] == 0
    out = tmp_path / "out.jsonl"
    with open(out, "a") as f:
        f.write('{"note": "hand-written, keep me"}\n')
    kept = out.read_bytes()
    for retry in ([], ["--retry-failed"]):
        with pytest.raises(SystemExit) as exc:
            score(tmp_path, rows, *retry)
        assert exc.value.code == 2
        assert "line 2 is not a scored row" in capsys.readouterr().err
        assert out.read_bytes() == kept


@pytest.mark.parametrize("manager", ["async_naive", "llm_judge"])
def test_function_name_without_function_path_is_refused(tmp_path, capsys, manager):
    # D5: it was ignored, the row scored by verl's default compute_score or by the judge.
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "response": "4"}])
    argv = ["score", "--input", str(src), "--output", str(tmp_path / "out.jsonl"), "--manager", manager]
    argv += ["--no-progress", "--set", "retry.max_attempts=1"]
    if manager == "llm_judge":  # a judge the run could start with (nothing listens on port 9)
        argv += ["judge.base_url=http://127.0.0.1:9/v1"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--function-name", "no_such_function"])
    assert exc.value.code == 2
    assert "--function-name" in capsys.readouterr().err and not (tmp_path / "out.jsonl").exists()


def test_retry_failed_stopped_before_a_later_line_of_a_rescored_id_keeps_that_line(tmp_path, capsys):
    """Review item 2: old rows were put back per key, so once line 1 (id a) was rescored, line 4 (id a
    again) lost its old row although the run stopped (at b) before reaching it."""
    rows = [
        {"id": "a", "response": "a1"},
        {"id": "b", "response": "b"},
        {"id": "c", "response": "c"},
        {"id": "a", "response": "a2"},
    ]
    code, out = score(tmp_path, rows, "--function-name", "outage")
    assert code == 0
    assert {r["input_line"]: r["status"] for r in read_output(out)} == {
        1: "error",
        2: "error",
        3: "error",
        4: "invalid",
    }
    old_line_4 = next(line for line in out.read_text().splitlines() if json.loads(line)["input_line"] == 4)
    stop_at_b = ["--function-name", "down_for_b", "--concurrency", "1"]
    stop_at_b += ["--set", "on_failure=raise", "retry.max_attempts=1"]
    assert score(tmp_path, rows, "--retry-failed", *stop_at_b)[0] == 1
    after = read_output(out)
    assert sorted(r["input_line"] for r in after) == [1, 2, 3, 4]  # every line exactly once
    by_line = {r["input_line"]: r for r in after}
    assert by_line[1]["status"] == "ok"  # rescored before the stop
    assert by_line[2]["status"] == by_line[3]["status"] == "error"  # old rows, put back
    assert old_line_4 in out.read_text().splitlines()  # never reached: its old row, as it was
    capsys.readouterr()
    assert score(tmp_path, rows, "--retry-failed")[0] == 0  # the judge is back
    final = {r["input_line"]: r for r in read_output(out)}
    assert len(read_output(out)) == 4 and sorted(final) == [1, 2, 3, 4]
    assert [final[line]["status"] for line in (1, 2, 3)] == ["ok", "ok", "ok"]
    assert final[4]["failure_reason"] == "duplicate id (first on line 1)"


class _ServiceNamingItsId(BaseHTTPRequestHandler):
    """A reward service whose reply carries its own ``id`` (and fields named like an output row's)."""

    calls = 0

    def do_POST(self) -> None:  # http.server's name for it
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).calls += 1
        body = {"score": 1.0, "id": "svc-123", "input_line": 99, "prompt": "the service's", "user_id": "u"}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: Any) -> None:  # quiet
        pass


@pytest.fixture
def service_naming_its_id() -> Iterator[str]:
    _ServiceNamingItsId.calls = 0
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _ServiceNamingItsId)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/score"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def test_an_extra_named_like_the_id_or_an_input_field_never_replaces_it(
    tmp_path, capsys, service_naming_its_id
):
    """Review item 1: async_remote's reply {"score": 1, "id": "svc-123"} replaced the row's id, so a
    rerun did not find id "a" and scored and wrote the row again."""
    rows = [{"id": "a", "prompt": "q", "response": "4"}, {"prompt": "q", "response": "5"}]  # line 2: no id
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    argv = ["score", "--input", str(src), "--output", str(out), "--manager", "async_remote", "--no-progress"]
    argv += ["--set", f"remote.url={service_naming_its_id}", "retry.max_attempts=1"]
    assert main(argv) == 0
    assert _ServiceNamingItsId.calls == 2
    by_line = {r["input_line"]: r for r in read_output(out)}
    assert sorted(by_line) == [1, 2]  # input_line is the row's own, not the service's 99
    first, second = by_line[1], by_line[2]
    assert first["id"] == "a" and first["prompt"] == "q" and first["status"] == "ok"
    assert first["user_input_line"] == 99 and first["user_prompt"] == "the service's"
    assert "id" not in second  # a row keyed by its line number gets no id from an extra either
    for row in (first, second):
        assert {row["user_id"], row["user_user_id"]} == {"svc-123", "u"}  # prefixed until free
    capsys.readouterr()
    assert main(argv) == 0  # the rerun finds both rows: nothing scored or written again
    assert _ServiceNamingItsId.calls == 2 and len(read_output(out)) == 2
    assert "scored 0 rows" in capsys.readouterr().out
