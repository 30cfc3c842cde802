"""What ``async-reward serve`` and ``score`` refuse at start-up, and how (a hostile review's items 3-7):
a secret given where it does not belong is never echoed, a flag that would do nothing is refused
naming it and the fix, a timing must be finite, and a bad path or port is an error message (exit 2),
never a traceback, before anything heavy starts.

Through the command's own entry (``main`` in-process; the console script in a subprocess where the
imports or the process's end matter).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from async_reward.tools import cli
from async_reward.tools.cli import main
from tests.tools.test_cli_front import heavy_imports, run_console_script
from tests.tools.test_cli_score import write_jsonl

SECRET = "sk-SECRET123"


@pytest.fixture(autouse=True)
def no_server_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``serve`` that is not refused fails its test at once, rather than serving until killed."""

    async def serve_forever(*_args: object) -> None:
        raise AssertionError("serve was not refused: the server would have started")

    monkeypatch.setattr(cli, "_serve_forever", serve_forever)


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The error ``main(argv)`` exits 2 with (stderr), the usage line included."""
    with pytest.raises(SystemExit) as exc_info:
        main(argv)
    captured = capsys.readouterr()
    assert exc_info.value.code == 2, captured
    assert "Traceback" not in captured.err
    return captured.out + captured.err


# -- serve: secrets -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--api-key-env", "sk-abc123secret"],  # the key itself, where its variable's name goes
        ["serve", "--api-key", "sk-abc123secret"],  # argparse reads it as --api-key-env sk-abc123secret
    ],
    ids=["key_as_name", "api_key_abbreviation"],
)
def test_api_key_env_given_the_key_itself_does_not_echo_it(argv, capsys) -> None:
    error = refused(argv, capsys)
    assert "abc123secret" not in error
    assert "--api-key-env takes the name of an environment variable" in error


def test_api_key_env_naming_an_unset_variable_does_not_echo_the_name(capsys, monkeypatch) -> None:
    # A key made of letters and digits only looks like a name: it must not be shown either.
    monkeypatch.delenv("abc123SECRET", raising=False)
    error = refused(["serve", "--api-key-env", "abc123SECRET"], capsys)
    assert "SECRET" not in error and "is not set or empty" in error


# -- serve: values and flags that would do nothing ------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--retry-after", "nan"], "--retry-after"),
        (["--retry-after", "inf"], "--retry-after"),
        (["--latency-ms", "0", "inf"], "--latency-ms"),
        (["--latency-ms", "nan", "nan"], "--latency-ms"),
    ],
)
def test_serve_refuses_non_finite_timings(argv, flag, capsys) -> None:
    error = refused(["serve", *argv], capsys)
    assert f"{flag}: " in error and "finite" in error


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--think-style", "separate"], "--think-style only applies with --think"),
        (["--unescaped-json"], "--unescaped-json only applies with --verdict-format json"),
        (["--verdict-format", "score", "--unescaped-json"], "--unescaped-json only applies with"),
        (["--overflow", "reject"], "--overflow reject only applies with --capacity N"),
        (["--fault", "429=0.5", "--fault", "429=0.2"], "--fault 429 is given twice (429=0.5 and 429=0.2)"),
        (["--port", "70000"], "expected a port number from 0 to 65535, got 70000"),
        (["--port", "-1"], "expected a port number from 0 to 65535"),
    ],
)
def test_serve_refuses_a_flag_that_would_do_nothing_or_a_bad_port(argv, expected, capsys) -> None:
    assert expected in refused(["serve", *argv], capsys)


def test_the_same_flags_with_what_they_apply_to_are_accepted() -> None:
    parser = cli.build_parser()
    argv = ["serve", "--think", "--think-style", "separate", "--verdict-format", "json", "--unescaped-json"]
    argv += ["--capacity", "2", "--overflow", "reject", "--fault", "429=0.5", "--fault", "500=0.2"]
    argv += ["--retry-after", "0.5", "--latency-ms", "1", "2", "--port", "65535"]
    args = parser.parse_args(argv)
    cli._refuse_ignored_serve_flags(args)  # what _run_serve checks before building the config
    config = cli._serve_config(args)
    assert (config.think_style, config.unescaped_json, config.overflow) == ("separate", True, "reject")
    assert config.fault_rates == {"429": 0.5, "500": 0.2} and config.retry_after_s == 0.5
    defaults = cli._serve_config(parser.parse_args(["serve"]))  # nothing given: the config's defaults
    assert (defaults.think_style, defaults.overflow) == ("inline", "queue")


@pytest.mark.subprocess
def test_serve_on_a_port_taken_is_an_error_message_not_a_traceback() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "async_reward_cli", "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2, proc.stderr
    assert f"cannot listen on 127.0.0.1 port {port}" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- score: secrets in --set and --config ---------------------------------------------------------


def score_argv(tmp_path: Path, *extra: str) -> list[str]:
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "response": "4"}])
    argv = ["score", "--input", str(src), "--output", str(tmp_path / "out.jsonl")]
    return [*argv, "--manager", "async_naive", "--no-progress", *extra]


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (f"'{SECRET}", "not valid YAML (ScannerError"),  # an unbalanced quote
        (f"{{X: {SECRET}", "not valid YAML (ParserError"),  # an unbalanced brace
        (SECRET + "${oops", "not valid omegaconf syntax (GrammarParseError"),
        (SECRET + "${", "not valid omegaconf syntax (GrammarParseError"),
        (SECRET + "${oc.env:ASYNC_REWARD_TEST_UNSET_ZZ}", "cannot be resolved (InterpolationResolutionError"),
        (SECRET + "${no.such.key}", "names a key that does not exist (InterpolationKeyError"),
    ],
    ids=["quote", "brace", "grammar", "grammar_end", "env_unset", "missing_key"],
)
def test_a_bad_set_value_is_reported_by_key_and_kind_never_echoed(tmp_path, capsys, monkeypatch, value, kind):
    monkeypatch.delenv("ASYNC_REWARD_TEST_UNSET_ZZ", raising=False)
    error = refused(score_argv(tmp_path, "--set", f"remote.headers.X-Api-Key={value}"), capsys)
    assert "SECRET" not in error and "oops" not in error and "no.such" not in error  # no part of it
    assert "remote.headers.X-Api-Key" in error and kind in error
    assert not (tmp_path / "out.jsonl").exists()


def test_a_set_item_without_equals_is_not_echoed(tmp_path, capsys) -> None:
    error = refused(score_argv(tmp_path, "--set", f"remote.headers.X-Api-Key:{SECRET}"), capsys)
    assert "SECRET" not in error and "expected KEY=VALUE" in error


def test_a_bad_config_file_is_reported_by_line_never_echoed(tmp_path, capsys) -> None:
    config = tmp_path / "async_reward.yaml"
    config.write_text(f"remote:\n  url: http://x/score\n  headers:\n    X-Api-Key: {SECRET}: [oops\n")
    error = refused(score_argv(tmp_path, "--config", str(config)), capsys)
    assert "SECRET" not in error
    assert f"cannot read --config {config}: not valid YAML at line 4" in error


# -- score: paths checked before the manager is built ---------------------------------------------


@pytest.mark.subprocess
def test_score_into_a_missing_directory_is_refused_before_anything_heavy(tmp_path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "response": "4"}])
    missing = tmp_path / "missing" / "dir" / "out.jsonl"
    proc, imported = run_console_script(
        tmp_path, "score", "--input", str(src), "--output", str(missing), "--manager", "async_naive"
    )
    assert proc.returncode == 2, proc.stderr
    assert f"--output {missing}: its directory {missing.parent} does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not heavy_imports(imported)  # refused before the manager (verl, torch) was built


@pytest.mark.parametrize("retry", [[], ["--retry-failed"]])
def test_score_into_a_directory_is_refused(tmp_path, capsys, retry) -> None:
    (tmp_path / "out.jsonl").mkdir()
    error = refused([*score_argv(tmp_path), *retry], capsys)
    assert f"--output {tmp_path / 'out.jsonl'} is not a file" in error
