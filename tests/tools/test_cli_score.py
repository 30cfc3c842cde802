"""``async-reward score`` and ``bench`` from the command line: real managers, real HTTP to the local
judge, real files. ``main`` runs in-process; ``--help`` and Ctrl-C run the real script in a subprocess.

The pipeline benchmark itself runs end to end in test_bench.py; here only its forwarding is checked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from async_reward.tools.cli import main

CLI = [sys.executable, "-m", "async_reward_cli"]  # the console script's entry point, the front door
# The script as a terminal's foreground job starts it: SIGINT at its default disposition, whatever the
# test process inherited (a suite started in the background by a shell has SIGINT ignored, and a child
# inherits that). exec keeps SIG_DFL, so the script itself runs unchanged.
CLI_IN_THE_FOREGROUND = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, '-m', 'async_reward_cli', *sys.argv[1:]])",
]


def make_rows(n: int, *, fault_every: int = 0) -> list[dict[str, Any]]:
    """Rows alternating right and wrong answers; every ``fault_every``-th gets a 400 from the judge."""
    rows = []
    for i in range(n):
        answer = i + 2
        given = answer if i % 2 == 0 else answer + 1
        response = f"The answer is {given}."
        if fault_every and i % fault_every == fault_every - 1:
            response += " @@fault:400@@"
        rows.append(
            {"id": f"r{i}", "prompt": f"What is {i} + 2?", "response": response, "ground_truth": str(answer)}
        )
    return rows


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read_output(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def score(server: Any, src: Path, out: Path, *extra: str) -> int:
    argv = ["score", "--input", str(src), "--output", str(out), "--manager", "llm_judge"]
    argv += ["--set", f"judge.base_url={server.url}/v1", *extra]
    return main(argv)


def judge_calls(server: Any) -> int:
    return server.stats()["requests_by_path"].get("/v1/chat/completions", 0)


def test_scores_right_and_wrong_answers(server, tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", make_rows(6))
    out = tmp_path / "out.jsonl"
    assert score(server, src, out) == 0  # with the progress bar, as a user runs it

    rows = {r["id"]: r for r in read_output(out)}
    assert sorted(rows) == [f"r{i}" for i in range(6)]
    for i in range(6):
        row = rows[f"r{i}"]
        assert row["score"] == (1.0 if i % 2 == 0 else 0.0)
        assert row["status"] == "ok" and row["attempts"] == 1 and row["failure_reason"] == ""
        assert row["input_line"] == i + 1 and row["latency_s"] > 0
        assert row["prompt"] == f"What is {i} + 2?"  # the input's fields are kept
        assert row["judge_verdict"] == (10.0 if i % 2 == 0 else 0.0)  # the manager's extras
    captured = capsys.readouterr()
    assert "scored 6 rows" in captured.out and "ok=6 timeout=0 error=0 invalid=0" in captured.out
    assert "6/6" in captured.err  # the tqdm bar, on stderr


def test_failing_server_rows_are_errors_and_every_row_is_written_once(server, tmp_path, capsys):
    rows = make_rows(12, fault_every=3)
    rows[0]["response"] = "@@fault:500:1@@ " + rows[0]["response"]  # transient: retried, then ok
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    retry_now = ["retry.initial_backoff_s=0", "retry.jitter_s=0"]
    assert score(server, src, out, "--no-progress", "--concurrency", "4", "--set", *retry_now) == 0

    written = read_output(out)
    assert sorted(r["id"] for r in written) == sorted(r["id"] for r in rows)  # each exactly once
    by_id = {r["id"]: r for r in written}
    for i in range(12):
        row = by_id[f"r{i}"]
        if i % 3 == 2:
            assert row["status"] == "error" and row["attempts"] == 1  # 4xx: not retried
            assert row["failure_reason"].startswith("HTTP 400") and row["score"] == 0.0
            assert row["judge_verdict"] is None  # NaN extras are written as JSON null
        else:
            assert row["status"] == "ok" and row["score"] == (1.0 if i % 2 == 0 else 0.0)
    assert by_id["r0"]["attempts"] == 2
    out_text = capsys.readouterr().out
    assert "ok=8 timeout=0 error=4 invalid=0" in out_text
    # What the run cost: every call (the retry and the refused ones included) and the server's tokens.
    (cost_line,) = [line for line in out_text.splitlines() if line.startswith("cost of this run: ")]
    tokens = server.stats()["tokens_total"]
    assert f"calls={judge_calls(server)} shared=0 cache_hits=0 tokens={tokens} (prompt " in cost_line
    assert judge_calls(server) == 13 and "money=" not in cost_line  # no prices set


def test_resume_skips_rows_already_scored(server, tmp_path, capsys):
    rows = make_rows(10)
    out = tmp_path / "out.jsonl"
    assert score(server, write_jsonl(tmp_path / "half.jsonl", rows[:5]), out, "--no-progress") == 0
    capsys.readouterr()
    assert score(server, write_jsonl(tmp_path / "all.jsonl", rows), out, "--no-progress") == 0

    written = read_output(out)
    assert sorted(r["id"] for r in written) == sorted(r["id"] for r in rows)
    assert judge_calls(server) == 10  # nothing scored twice
    captured = capsys.readouterr()
    assert "resuming: 5 rows already in" in captured.err
    assert "scored 5 rows" in captured.out and "skipped 5 already in the output" in captured.out


def test_truncated_last_output_line_is_repaired(server, tmp_path, capsys):
    rows = make_rows(6)
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    assert score(server, src, out, "--no-progress") == 0
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:3]) + lines[3][: len(lines[3]) // 2])  # a crash mid-write
    capsys.readouterr()

    assert score(server, src, out, "--no-progress") == 0
    written = read_output(out)  # every line parses
    assert sorted(r["id"] for r in written) == sorted(r["id"] for r in rows)
    captured = capsys.readouterr()
    assert "removed a truncated last line" in captured.err and "scored 3 rows" in captured.out


def test_damaged_line_before_the_last_is_refused(server, tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", make_rows(2))
    out = write_jsonl(tmp_path / "out.jsonl", ["not a scored row", {"id": "r0", "input_line": 1}])
    with pytest.raises(SystemExit) as exc:
        score(server, src, out, "--no-progress")
    assert exc.value.code == 2
    assert "line 1 is not a scored row" in capsys.readouterr().err
    assert len(out.read_text().splitlines()) == 2  # left untouched


def test_malformed_input_lines_are_recorded_as_invalid(server, tmp_path, capsys):
    good = make_rows(2)
    lines = [
        good[0],
        "{not json",
        [1, 2],
        {"id": "no-response", "prompt": "q", "ground_truth": "1"},
        {"id": "bad-extra", "prompt": "q", "response": "1", "ground_truth": "1", "extra_info": "x"},
        "",  # blank lines are not rows
        {"prompt": "no id: keyed by line number", "response": "The answer is 3.", "ground_truth": "3"},
        {"id": "r0", "prompt": "duplicate id", "response": "1", "ground_truth": "1"},
    ]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    assert score(server, src, out, "--no-progress") == 0

    by_line = {r["input_line"]: r for r in read_output(out)}
    assert sorted(by_line) == [1, 2, 3, 4, 5, 7, 8]
    assert by_line[1]["status"] == "ok" and by_line[7]["status"] == "ok" and by_line[7]["score"] == 1.0
    expected = {
        2: "not JSON",
        3: "not a JSON object",
        4: "missing 'response'",
        5: "'extra_info' must be an object",
        8: "duplicate id (first on line 1)",
    }
    for line, reason in expected.items():
        row = by_line[line]
        assert row["status"] == "invalid" and reason in row["failure_reason"], row
        assert row["attempts"] == 0 and row["score"] == 0.0
    assert by_line[2]["input_text"] == "{not json" and by_line[4]["id"] == "no-response"
    assert "ok=2 timeout=0 error=0 invalid=5" in capsys.readouterr().out

    assert score(server, src, out, "--no-progress") == 0  # a rerun finds every row done
    assert len(read_output(out)) == 7
    assert "scored 0 rows" in capsys.readouterr().out


def test_bad_configuration_exits_2_naming_valid_keys(server, tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", make_rows(2))
    out = tmp_path / "out.jsonl"
    with pytest.raises(SystemExit) as exc:
        score(server, src, out, "--set", "judge.base_urll=http://x")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert (
        "unknown key(s) ['base_urll']" in err and "'base_url'" in err and "usage: async-reward score" in err
    )

    config = tmp_path / "cfg.yaml"
    config.write_text("timeout_s: 5\nrequest_per_minute: 10\n")
    with pytest.raises(SystemExit) as exc:
        score(server, src, out, "--config", str(config))
    assert exc.value.code == 2 and "valid keys" in capsys.readouterr().err

    with pytest.raises(SystemExit) as exc:  # caught by the manager itself
        main(["score", "--input", str(src), "--output", str(out), "--manager", "llm_judge"])
    assert exc.value.code == 2 and "judge.base_url is required" in capsys.readouterr().err
    assert not out.exists()


def test_config_file_and_overrides_reach_the_manager(server, tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text("fallback_score: -1.0\njudge:\n  base_url: http://127.0.0.1:9/v1\n")
    src = write_jsonl(tmp_path / "in.jsonl", make_rows(3, fault_every=3))
    out = tmp_path / "out.jsonl"
    argv = ["score", "--input", str(src), "--output", str(out), "--manager", "llm_judge", "--no-progress"]
    assert main([*argv, "--config", str(config), "--set", f"judge.base_url={server.url}/v1"]) == 0
    scores = {r["id"]: (r["status"], r["score"]) for r in read_output(out)}
    assert scores == {"r0": ("ok", 1.0), "r1": ("ok", 0.0), "r2": ("error", -1.0)}


REWARD_FUNCTIONS = textwrap.dedent(
    """
    import asyncio
    import os
    import signal
    import threading
    import time

    calls = 0

    async def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0 if solution_str.strip() == ground_truth else 0.0

    async def interrupted_after_five(data_source, solution_str, ground_truth, extra_info=None):
        global calls
        calls += 1
        if calls > 5:
            # Ctrl-C lands in the middle of scoring (a KeyboardInterrupt the function raises itself is
            # the function's failure, status error, not an interrupt of the run).
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(30)
        return 1.0

    async def terminated_after_five(data_source, solution_str, ground_truth, extra_info=None):
        global calls
        calls += 1
        if calls > 5:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.sleep(30)
        return 1.0

    async def interrupted_on_another_thread(data_source, solution_str, ground_truth, extra_info=None):
        # The kernel hands a process's signal to any thread that does not block it; here another
        # thread gets it, after the event loop has gone to sleep on a timer two minutes away.
        global calls
        calls += 1
        if calls > 5:
            def deliver():
                time.sleep(1.0)
                signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            threading.Thread(target=deliver).start()
            await asyncio.sleep(120)
        return 1.0

    async def ignored_interrupt(data_source, solution_str, ground_truth, extra_info=None):
        global calls
        calls += 1
        if calls == 6:
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(0.1)
        return 1.0
    """
)


@pytest.fixture
def signal_handlers() -> Iterator[None]:
    """Restore SIGINT's and SIGTERM's handlers after a test that sets them."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def function_argv(tmp_path: Path) -> tuple[list[str], Path]:
    """``score`` of ten rows, one at a time, with REWARD_FUNCTIONS (pick one with --function-name)."""
    functions = tmp_path / "reward_fn.py"
    functions.write_text(REWARD_FUNCTIONS)
    rows = [{"id": i, "prompt": "p", "response": str(i % 3), "ground_truth": "1"} for i in range(10)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    argv = ["score", "--input", str(src), "--output", str(out), "--manager", "async_naive", "--no-progress"]
    return [*argv, "--function-path", str(functions), "--concurrency", "1"], out


def test_keyboard_interrupt_keeps_scored_rows_and_resumes(tmp_path, capsys, signal_handlers):
    # Python's own Ctrl-C handling, as in a terminal's foreground job: the test must not depend on how
    # the suite was started (a background job of a shell inherits SIGINT ignored, honoured below).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    argv, out = function_argv(tmp_path)

    assert main([*argv, "--function-name", "interrupted_after_five"]) == 130
    assert [r["id"] for r in read_output(out)] == [0, 1, 2, 3, 4]
    err = capsys.readouterr().err
    assert "interrupted (SIGINT): wrote 5 rows" in err and "5 of 10 rows remain" in err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the process's handler is back

    assert main(argv) == 0
    written = read_output(out)
    assert sorted(r["id"] for r in written) == list(range(10))
    assert {r["id"]: r["score"] for r in written[5:]} == {i: float(i % 3 == 1) for i in range(5, 10)}


def chained_interrupt(signum: int, frame: Any) -> None:
    """A SIGINT handler of a calling program: it logs, say, then raises as Python's does."""
    signal.default_int_handler(signum, frame)


def exit_on_sigterm(signum: int, frame: Any) -> None:
    """A SIGTERM handler of a calling program: SystemExit, so that its finally blocks run."""
    raise SystemExit(143)


@pytest.mark.parametrize(
    ("handlers", "function", "code"),
    [
        # Under a program's own SIGINT handler asyncio.run leaves Ctrl-C to it: the KeyboardInterrupt
        # was raised inside the reward function, failed that row, and scoring went on.
        ({signal.SIGINT: chained_interrupt}, "interrupted_after_five", 130),
        # SIGTERM: the process died (SIG_DFL), or the program's SystemExit failed one row.
        ({signal.SIGTERM: exit_on_sigterm}, "terminated_after_five", 143),
        # A signal handed to another thread woke nobody until the loop's next timer (two minutes).
        ({signal.SIGINT: signal.default_int_handler}, "interrupted_on_another_thread", 130),
    ],
    ids=["program_sigint_handler", "sigterm", "signal_on_another_thread"],
)
def test_a_signal_stops_the_run_at_once_whatever_handled_it_before(
    tmp_path, capsys, signal_handlers, handlers, function, code
):
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    argv, out = function_argv(tmp_path)
    started = time.monotonic()
    assert main([*argv, "--function-name", function]) == code
    assert time.monotonic() - started < 60  # the reward function was left sleeping 30 s or 120 s
    assert [r["id"] for r in read_output(out)] == [0, 1, 2, 3, 4]
    name = signal.Signals(code - 128).name
    assert f"interrupted ({name}): wrote 5 rows" in capsys.readouterr().err
    for signum, handler in handlers.items():
        assert signal.getsignal(signum) is handler  # the program's handlers are back


def test_an_ignored_sigint_stays_ignored_and_says_how_to_stop(tmp_path, capsys, signal_handlers):
    # A shell starts a background job with SIGINT ignored, so that the terminal's Ctrl-C is not for it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    argv, out = function_argv(tmp_path)
    assert main([*argv, "--function-name", "ignored_interrupt"]) == 0
    assert sorted(r["id"] for r in read_output(out)) == list(range(10))
    assert "Ctrl-C will not stop this run; SIGTERM (kill PID) stops it" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


@pytest.mark.subprocess
def test_sigint_to_the_script_loses_no_scored_row(server, tmp_path, capsys):
    rows = make_rows(40)
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    # The judge answers 4 requests, then holds the rest: the signal then comes with exactly 4 rows
    # scored and 2 waiting, whatever the machine's speed.
    server.update_config(hold=4)
    argv = ["score", "--input", str(src), "--output", str(out), "--manager", "llm_judge"]
    argv += ["--set", f"judge.base_url={server.url}/v1", "--concurrency", "2", "--no-progress"]
    proc = subprocess.Popen(
        [*CLI_IN_THE_FOREGROUND, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 240  # the script imports verl and torch: slow on a loaded machine
        while not (out.exists() and len(out.read_text().splitlines()) >= 4 and server.stats()["held"] == 2):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted (SIGINT): wrote" in stderr and "rerun the same command to resume" in stderr
    written = read_output(out)  # every line is a whole row
    assert len(written) == 4 and len({r["id"] for r in written}) == 4  # every row scored, none else

    server.update_config(hold=False)
    assert score(server, src, out, "--no-progress") == 0
    assert sorted(r["id"] for r in read_output(out)) == sorted(r["id"] for r in rows)
    assert f"skipped {len(written)} already in the output" in capsys.readouterr().out


HELP_MENTIONS = {
    "serve": ["--latency-ms", "--fault"],
    "bench": ["--quick", "--bench-help", "passed to the benchmark"],
    "score": ["--input", "--output", "--manager", "--set", "--id-field", "--concurrency", "resumes"],
}


@pytest.mark.parametrize("command", list(HELP_MENTIONS))
def test_help_of_each_subcommand(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: async-reward {command}")
    for needle in HELP_MENTIONS[command]:
        assert needle in out, needle


@pytest.mark.subprocess
def test_help_from_the_installed_script():
    # The installed script (else its entry point, the front door), twice at once.
    script = Path(sys.executable).with_name("async-reward")
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "async_reward_cli"]
    env = {**os.environ, "COLUMNS": "200"}
    procs = {
        name: subprocess.Popen([*launcher, name, "--help"], stdout=subprocess.PIPE, text=True, env=env)
        for name in ("bench", "score")
    }
    for name, proc in procs.items():
        stdout, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, name
        assert stdout.startswith(f"usage: async-reward {name}")
        assert all(needle in stdout for needle in HELP_MENTIONS[name])


def test_bench_forwards_its_options(monkeypatch):
    from async_reward_bench import speedup

    calls: list[list[str]] = []
    monkeypatch.setattr(speedup, "main", lambda argv: calls.append(list(argv)) or 0)
    assert main(["bench", "--quick", "--steps", "3", "--out=somewhere", "--regimes", "recipe"]) == 0
    assert main(["bench"]) == 0
    assert main(["bench", "--bench-help"]) == 0
    assert calls == [["--quick", "--steps", "3", "--out=somewhere", "--regimes", "recipe"], [], ["--help"]]
    # what the benchmark makes of the bare command: the README's performance table, 12 steps, one run
    cfg = speedup.config_from_args(
        speedup.configure_parser(__import__("argparse").ArgumentParser()).parse_args([])
    )
    assert cfg.strategies == ("v1_pipelined_both", "v1_pipelined_both_stale2", "v1_colocate_async")
    assert len(cfg.regimes) == 5 and (cfg.steps, cfg.repeats) == (12, 1)


def test_bench_help_forwarding_and_strictness_of_other_subcommands(capsys):
    assert main(["bench", "--bench-help"]) == 0
    assert "--time-scale" in capsys.readouterr().out  # the benchmark's own options
    with pytest.raises(SystemExit) as exc:  # forwarding is bench's only: elsewhere unknown args fail
        main(["serve", "--no-such-flag"])
    assert exc.value.code == 2 and "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
