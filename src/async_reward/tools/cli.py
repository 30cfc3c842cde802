"""The ``async-reward`` command line: one parser with a subcommand per task.

The console script enters at ``async_reward_cli`` (outside this package, so ``--help`` and
``--version`` answer without importing verl), which hands every command to :func:`main` here,
imported without the package's ``__init__`` (``async_reward_cli.import_command_line``): this
module's imports must not import verl, torch or Ray (``serve`` and every ``--help`` run without
them; ``tests/tools/test_cli_front.py`` checks). To
add a command (``bench``, ``score``), name it with its one-line help in ``async_reward_cli.COMMANDS``,
write an ``_add_<name>_parser(subparsers)`` that registers its arguments and sets ``handler`` to a
small ``_run_<name>(args) -> int``, and call it from ``build_parser``. Heavy imports belong inside
the handler.

Longer than 400 lines: one parser per command with its help texts (``serve`` has many flags);
the work of each command is elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

from async_reward.tools.devserver.config import (
    FAULT_KINDS,
    JUDGE_STYLES,
    STRUCTURED_OUTPUT_MODES,
    THINK_STYLES,
    DevServerConfig,
)
from async_reward.tools.offline_score import FUNCTION_MANAGERS, MANAGERS, RESULT_FIELDS
from async_reward_cli import COMMANDS, DESCRIPTION, PROG, add_front_arguments

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The full parser: one subparser per subcommand, each carrying its handler in ``handler``."""
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    add_front_arguments(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_serve_parser(subparsers)
    _add_bench_parser(subparsers)
    _add_score_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one ``async-reward`` command line (``python -m async_reward.tools.cli``, or the console script
    through ``async_reward_cli``); returns the process exit code."""
    parser = build_parser()
    # Known args only, so that a subcommand which forwards its options (bench) receives the rest;
    # for every other subcommand an unknown argument is the usual argparse error.
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "forwards_rest", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    try:
        return int(args.handler(args))
    except _UsageError as exc:
        # Reported by the subcommand's parser, so the usage line shown is the relevant one; exits 2.
        args.subparser.error(str(exc))
        return 2  # pragma: no cover (parser.error does not return)


class _UsageError(Exception):
    """A bad argument found by a handler (not by argparse); reported like an argparse error."""


# -- serve ----------------------------------------------------------------------------------------


def _fault(text: str) -> tuple[str, float]:
    kind, sep, rate = text.partition("=")
    if not sep or kind not in FAULT_KINDS:
        raise argparse.ArgumentTypeError(f"expected KIND=RATE with KIND one of {', '.join(FAULT_KINDS)}")
    try:
        return kind, float(rate)
    except ValueError:
        raise argparse.ArgumentTypeError(f"RATE must be a number, got {rate!r}") from None


def _port(text: str) -> int:
    """A TCP port, 0 to 65535: checked here, since the socket layer answers 70000 with OverflowError."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535, got {port}")
    return port


def _seed(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'none', got {text!r}") from None


def _add_serve_parser(subparsers: Any) -> None:
    defaults = DevServerConfig()
    serve = subparsers.add_parser(
        "serve",
        help=COMMANDS["serve"],
        description=(
            "Serve POST /v1/chat/completions (a rule-based judge), POST /score (a reward service), "
            "GET /health and /admin/{stats,reset,config} until interrupted. A request body containing "
            "@@fault:KIND@@ (or @@fault:KIND:N@@, first N identical bodies only) gets that fault."
        ),
    )
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: %(default)s)")
    serve.add_argument(
        "--port",
        type=_port,
        default=8000,
        help="port to listen on, 0 picks a free one (default: %(default)s)",
    )
    serve.add_argument(
        "--latency-ms",
        nargs=2,
        type=float,
        metavar=("LO", "HI"),
        default=defaults.latency_ms,
        help="each request waits uniform(LO, HI) milliseconds while holding a capacity slot (default: 0 0)",
    )
    serve.add_argument(
        "--capacity", type=int, default=None, help="most requests served at once (default: unlimited)"
    )
    serve.add_argument(
        "--overflow",
        choices=("queue", "reject"),
        default=None,  # None: not given, so that one given without --capacity is refused, not ignored
        help="with --capacity, over it: wait FIFO for a slot, or answer 429 at once "
        f"(default: {defaults.overflow})",
    )
    serve.add_argument(
        "--retry-after",
        type=float,
        default=defaults.retry_after_s,
        metavar="S",
        help="seconds announced by Retry-After on every 429 (default: %(default)s)",
    )
    serve.add_argument(
        "--fault",
        type=_fault,
        action="append",
        default=[],
        metavar="KIND=RATE",
        help=f"random fault probability per request, repeatable; KIND is one of {', '.join(FAULT_KINDS)}",
    )
    serve.add_argument(
        "--seed",
        type=_seed,
        default=defaults.seed,
        help="RNG seed for latency and faults, 'none' for unseeded (default: %(default)s)",
    )
    serve.add_argument(
        "--api-key-env",
        metavar="VAR",
        default=None,
        help="require 'Authorization: Bearer <key>' with the key read from this environment variable "
        "(the key itself is never taken on the command line, where other users could see it)",
    )
    serve.add_argument(
        "--verdict-format",
        choices=("brackets", "boxed", "score", "json"),
        default=defaults.verdict_format,
        help="how the judge states its verdict: [[7]], \\boxed{7}, 'Score: 7' or {\"score\": 7} "
        "(default: %(default)s)",
    )
    serve.add_argument(
        "--think",
        action="store_true",
        help="replies carry thinking holding a decoy verdict (see --think-style)",
    )
    serve.add_argument(
        "--think-style",
        choices=THINK_STYLES,
        default=None,  # None: not given, so that one given without --think is refused, not ignored
        help="with --think, that thinking as a <think> block opening the reply (inline), without <think> "
        f"(prefilled), or in the message's reasoning_content (separate) (default: {defaults.think_style})",
    )
    serve.add_argument(
        "--echo-response",
        action="store_true",
        help="quote the policy response in the reply before the verdict",
    )
    serve.add_argument(
        "--judge-style",
        choices=JUDGE_STYLES,
        default=defaults.judge_style,
        help="verdict-then-quote: give the verdict, then quote the response after it (default: %(default)s)",
    )
    serve.add_argument(
        "--fixed-verdict",
        type=int,
        default=None,
        metavar="N",
        help="always give verdict N (0-10) whatever the response says (default: judge by rule)",
    )
    serve.add_argument(
        "--structured-output",
        choices=STRUCTURED_OUTPUT_MODES,
        default=defaults.structured_output,
        help="a response_format json_schema request: honour it, reject it with 400, or ignore it "
        "(default: %(default)s)",
    )
    serve.add_argument(
        "--unescaped-json",
        action="store_true",
        help="with --verdict-format json, paste the response unescaped into the JSON verdict's reasoning",
    )
    serve.add_argument(
        "--no-max-tokens",
        dest="honour_max_tokens",
        action="store_false",
        help="never cut a reply at the request's max_tokens (default: cut, finish_reason length)",
    )
    serve.set_defaults(handler=_run_serve, subparser=serve)


#: What an environment variable's name looks like (POSIX): anything else given to --api-key-env is
#: most likely the key itself, which must then not be repeated in the error.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _api_key(env_name: str | None) -> str | None:
    """The key ``--api-key-env`` names, read from the environment; None without the flag.

    The argument is never echoed, even when it is a valid name: a user who typed the key itself (or
    ``--api-key KEY``, which argparse expands to ``--api-key-env KEY``) would see it in the error, and
    so would a terminal log or CI output.
    """
    if env_name is None:
        return None
    if not _ENV_NAME.fullmatch(env_name):
        raise _UsageError(
            "--api-key-env takes the name of an environment variable (letters, digits and '_', not "
            "starting with a digit), not the key: the value given is not one (and is not shown, in "
            "case it is the key); export the key, e.g. DEVSERVER_KEY=..., and pass "
            "--api-key-env DEVSERVER_KEY"
        )
    api_key = os.environ.get(env_name)
    if not api_key:
        raise _UsageError(
            "--api-key-env: the environment variable it names is not set or empty in this process "
            "(its name is not shown, in case it is the key itself); export it first"
        )
    return api_key


def _refuse_ignored_serve_flags(args: argparse.Namespace) -> None:
    """Refuse a flag that would do nothing with the others given: it must not be silently ignored."""
    if args.think_style is not None and not args.think:
        raise _UsageError("--think-style only applies with --think: add --think, or drop --think-style")
    if args.unescaped_json and args.verdict_format != "json":
        raise _UsageError(
            "--unescaped-json only applies with --verdict-format json: add it, or drop --unescaped-json"
        )
    if args.overflow is not None and args.capacity is None:
        raise _UsageError(
            f"--overflow {args.overflow} only applies with --capacity N (there is no overflow without "
            "a capacity): add --capacity, or drop --overflow"
        )
    rates: dict[str, float] = {}
    for kind, rate in args.fault:
        if kind in rates:
            raise _UsageError(
                f"--fault {kind} is given twice ({kind}={rates[kind]:g} and {kind}={rate:g}): "
                "give each fault kind once"
            )
        rates[kind] = rate


#: The serve flag behind each config field ``DevServerConfig.validate`` names first in its message.
_SERVE_FLAGS = {
    "latency_ms": "--latency-ms",
    "capacity": "--capacity",
    "retry_after_s": "--retry-after",
    "fault": "--fault",
    "fixed_verdict": "--fixed-verdict",
}


def _serve_config(args: argparse.Namespace) -> DevServerConfig:
    """The server's config from the flags, validated (``_run_serve`` first refuses flags that would do
    nothing: see :func:`_refuse_ignored_serve_flags`)."""
    defaults = DevServerConfig()
    config = DevServerConfig(
        latency_ms=tuple(args.latency_ms),
        capacity=args.capacity,
        overflow=args.overflow or defaults.overflow,
        retry_after_s=args.retry_after,
        fault_rates=dict(args.fault),
        seed=args.seed,
        api_key=_api_key(args.api_key_env),
        verdict_format=args.verdict_format,
        think=args.think,
        think_style=args.think_style or defaults.think_style,
        echo_response=args.echo_response,
        judge_style=args.judge_style,
        fixed_verdict=args.fixed_verdict,
        structured_output=args.structured_output,
        unescaped_json=args.unescaped_json,
        honour_max_tokens=args.honour_max_tokens,
    )
    try:
        config.validate()
    except ValueError as exc:
        field_name = str(exc).split(" ", 1)[0]
        flag = _SERVE_FLAGS.get(field_name)
        raise _UsageError(f"{flag}: {exc}" if flag else str(exc)) from None
    return config


def _run_serve(args: argparse.Namespace) -> int:
    _refuse_ignored_serve_flags(args)
    config = _serve_config(args)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_forever(config, args.host, args.port))
    return 0


async def _serve_forever(config: DevServerConfig, host: str, port: int) -> None:
    from async_reward.tools.devserver import DevServer

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # SIGTERM (a supervisor, or a test's terminate()) stops as cleanly as Ctrl-C does.
    with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows event loops
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    server = DevServer(config, host, port)
    try:
        await server.start()
    except OSError as exc:  # the port taken or not ours to bind, an unknown host: a bad argument
        raise _UsageError(f"cannot listen on {host} port {port}: {exc.strerror or exc}") from None
    try:
        print(f"async-reward devserver listening on {server.url}", flush=True)
        print(f"  OpenAI base_url: {server.url}/v1   reward service: {server.url}/score", flush=True)
        print(f"  {config!r}", flush=True)  # repr leaves the API key out
        await stop.wait()
    finally:
        await server.stop()


# -- bench ----------------------------------------------------------------------------------------


def _add_bench_parser(subparsers: Any) -> None:
    bench = subparsers.add_parser(
        "bench",
        help=COMMANDS["bench"],
        usage="%(prog)s [-h] [--quick] [--bench-help] [BENCHMARK_OPTION ...]",
        description=(
            "Run the pipeline speed-up benchmark (async_reward_bench.speedup): the step time of each "
            "schedule strategy against a slow, bounded local judge, with a table on stdout and raw JSON "
            "and timelines in the output directory."
        ),
        epilog=(
            "Every other option is passed to the benchmark unchanged (e.g. --steps 3 --out DIR); "
            "'async-reward bench --bench-help' lists them."
        ),
        allow_abbrev=False,  # an abbreviation of ours must not swallow one of the benchmark's options
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help="the short run 'make bench' does: the recipe regime only, fewer steps and samples",
    )
    bench.add_argument("--bench-help", action="store_true", help="show the benchmark's own options and exit")
    bench.set_defaults(handler=_run_bench, subparser=bench, forwards_rest=True)


def _run_bench(args: argparse.Namespace) -> int:
    from async_reward_bench import speedup

    argv = ["--help"] if args.bench_help else [*(["--quick"] if args.quick else []), *args.rest]
    try:
        return speedup.main(argv)
    except SystemExit as exc:  # the benchmark's own argparse: --help (0) or a bad option (2)
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)


# -- score ----------------------------------------------------------------------------------------


def _override(text: str) -> str:
    key, sep, _value = text.partition("=")
    if not sep or not key.strip():
        # Not echoed: a value meant to follow a key (a header's API key) may be all there is.
        raise argparse.ArgumentTypeError(
            "expected KEY=VALUE (e.g. judge.base_url=http://...); got an item "
            + ("without a key before '='" if sep else "without '='")
            + " (not shown, in case it holds a secret)"
        )
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _add_score_parser(subparsers: Any) -> None:
    score = subparsers.add_parser(
        "score",
        help=COMMANDS["score"],
        description=(
            "Score every row of a JSONL file with a reward manager (the same manager, admission, "
            "deadlines and retries as in training) and append one row per input row to --output as "
            "soon as it is scored. Input rows: {id?, prompt, response, ground_truth, data_source?, "
            "extra_info?, uid?}; 'response' is required text. A row's id is its --id-field value, or "
            "its line number when it has none. Output rows: the input's fields plus input_line, "
            "score, status (ok/timeout/error/invalid), attempts, latency_s, failure_reason and the "
            "manager's extras (one named like an input field, the id field or those is written as "
            "user_<name>), in completion order. A failed row scores fallback_score and says why; "
            "a line that is not a valid row is recorded as status invalid. Rerunning the same "
            "command resumes: ids already in --output are skipped, and a last line cut short by a "
            "crash is removed first. Ctrl-C or SIGTERM stops the run at once and keeps every scored "
            "row (a run started with SIGINT ignored, as a shell starts a background job, keeps "
            "ignoring it: stop it with SIGTERM). Group post-processing "
            "(post_process_scores) is not applied: rows are written one by one."
        ),
        epilog=(
            "exit status: 0 all rows recorded (failed rows included), 1 stopped by on_failure=raise, "
            "2 bad arguments or configuration, 130 interrupted by Ctrl-C, 143 stopped by SIGTERM "
            "(rerun to resume)"
        ),
    )
    score.add_argument(
        "--input", required=True, type=Path, metavar="PATH", help="JSONL file of rows to score"
    )
    score.add_argument(
        "--output", required=True, type=Path, metavar="PATH", help="JSONL file to append scored rows to"
    )
    score.add_argument("--manager", required=True, choices=MANAGERS, help="reward manager to score with")
    score.add_argument(
        "--config",
        metavar="YAML",
        help="YAML file holding the reward.async_reward mapping (timeout_s, limits, retry, judge, ...)",
    )
    score.add_argument(
        "--set",
        dest="overrides",
        type=_override,
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="override a reward.async_reward setting (omegaconf dotlist, applied after --config), "
        "e.g. --set judge.base_url=http://127.0.0.1:8000/v1 limits.max_concurrency=16",
    )
    score.add_argument(
        "--function-path",
        metavar="PATH",
        help="custom_reward_function file, for " + ", ".join(FUNCTION_MANAGERS),
    )
    score.add_argument(
        "--function-name",
        metavar="NAME",  # no default here: given without --function-path it is refused, not ignored
        help="function (async_stateful: class) in --function-path (default: compute_score)",
    )
    score.add_argument(
        "--concurrency",
        type=_positive_int,
        default=32,
        metavar="N",
        help="rows in flight at once; the manager's limits.* apply on top (default: %(default)s)",
    )
    score.add_argument(
        "--id-field",
        default="id",
        metavar="FIELD",
        help="input field holding the row id used for resuming (default: %(default)s)",
    )
    score.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    score.add_argument(
        "--retry-failed",
        action="store_true",
        help="score again the rows of --output whose status is not ok (after an outage); ok rows are "
        "kept, and the output is rewritten in one atomic replace, so each row is in it once",
    )
    score.set_defaults(handler=_run_score, subparser=score)


def _check_output(output: Path, retry_failed: bool) -> None:
    """Refuse an output the run could not write, before the manager is built (seconds, verl): a
    missing directory or a directory in the output's place would otherwise end the run in a traceback.
    Its folder must be writable to create it, and always with ``--retry-failed``, which writes its new
    output next to it and moves it over."""
    folder = output.parent
    if not folder.is_dir():
        raise _UsageError(f"--output {output}: its directory {folder} does not exist (create it first)")
    if output.exists() and not output.is_file():
        raise _UsageError(f"--output {output} is not a file")
    if output.exists() and not os.access(output, os.R_OK | os.W_OK):
        raise _UsageError(f"--output {output} is not readable and writable (permissions)")
    if (retry_failed or not output.exists()) and not os.access(folder, os.W_OK | os.X_OK):
        raise _UsageError(f"--output {output}: its directory {folder} is not writable (permissions)")


def _score_job(args: argparse.Namespace) -> Any:
    """The run the arguments ask for; a bad argument is a ``_UsageError``. The arguments are checked
    before the first ``import async_reward...`` here, which runs the package's ``__init__`` (verl,
    torch, Ray: seconds), so that a mistyped path is answered at once."""
    if not args.input.is_file():
        raise _UsageError(f"--input {args.input} is not a file")
    if not os.access(args.input, os.R_OK):
        raise _UsageError(f"--input {args.input} is not readable (permissions)")
    _check_output(args.output, args.retry_failed)
    if args.output.exists() and args.output.resolve() == args.input.resolve():
        raise _UsageError("--output must differ from --input")
    if args.id_field in RESULT_FIELDS:
        raise _UsageError(f"--id-field must not be one of the fields score adds: {', '.join(RESULT_FIELDS)}")
    if args.function_path is not None:
        if args.manager not in FUNCTION_MANAGERS:
            raise _UsageError(f"--function-path is used by {', '.join(FUNCTION_MANAGERS)} only")
        if not Path(args.function_path).is_file():
            raise _UsageError(f"--function-path {args.function_path} is not a file")
    elif args.manager == "async_stateful":
        raise _UsageError("async_stateful needs --function-path (and --function-name naming its class)")
    elif args.function_name is not None:
        # Without a path the manager would score with verl's default compute_score (or no function).
        raise _UsageError("--function-name names a function in --function-path: give --function-path too")
    from async_reward.config import ConfigError
    from async_reward.tools.offline_score import ScoreJob, load_settings

    try:
        settings = load_settings(args.config, args.overrides)
    except ConfigError as exc:
        raise _UsageError(str(exc)) from None
    return ScoreJob(
        input_path=args.input,
        output_path=args.output,
        manager=args.manager,
        async_reward=settings,
        function_path=args.function_path,
        function_name=args.function_name or "compute_score",
        concurrency=args.concurrency,
        id_field=args.id_field,
        progress=not args.no_progress,
        retry_failed=args.retry_failed,
    )


def _run_score(args: argparse.Namespace) -> int:
    job = _score_job(args)  # first: it answers a bad argument before the package's heavy imports
    from async_reward.config import ConfigError
    from async_reward.managers.base import RewardScoringError
    from async_reward.tools.offline_score import OutputFileError, ScoreProgress, score_file

    progress = ScoreProgress()
    try:
        score_file(job, progress, notify=lambda message: print(message, file=sys.stderr, flush=True))
    except (ConfigError, OutputFileError) as exc:
        raise _UsageError(str(exc)) from None
    except KeyboardInterrupt:
        stopped_by = progress.stopped_by or signal.SIGINT  # before the run, Python's own Ctrl-C
        print(
            f"\ninterrupted ({signal.Signals(stopped_by).name}): wrote {progress.written} rows to "
            f"{job.output_path} in this run; {progress.remaining} of {progress.total_rows} rows remain "
            "(rerun the same command to resume)",
            file=sys.stderr,
            flush=True,
        )
        return 128 + stopped_by  # the shell's convention: 130 for Ctrl-C, 143 for SIGTERM
    except RewardScoringError as exc:
        print(
            f"async-reward score: stopped (on_failure=raise): {exc}; wrote {progress.written} rows, "
            f"{progress.remaining} remain",
            file=sys.stderr,
        )
        return 1
    skipped = f", skipped {progress.skipped} already in the output" if progress.skipped else ""
    if job.retry_failed:
        skipped += f" (retried {progress.retried} rows that were not ok)"
    print(
        f"scored {progress.written} rows into {job.output_path} in {progress.elapsed_s:.1f} s: "
        f"{progress.status_counts()}{skipped}",
        flush=True,
    )
    print(f"cost of this run: {progress.cost_summary()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
