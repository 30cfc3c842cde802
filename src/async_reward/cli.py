"""The ``async-reward`` command line.

One parser with a subcommand per task. To add one (``bench``, ``score``), write an
``_add_<name>_parser(subparsers)`` that registers its arguments and sets ``handler`` to a small
``_run_<name>(args) -> int``, then call it from ``build_parser``. Heavy imports belong inside the
handler, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from typing import Any

from async_reward._devserver_config import FAULT_KINDS, DevServerConfig

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The full parser: one subparser per subcommand, each carrying its handler in ``handler``."""
    parser = argparse.ArgumentParser(
        prog="async-reward",
        description="asyncio-native reward managers for verl: tools for serving, benchmarking and scoring.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_serve_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``async-reward`` script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
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
        help="run the local OpenAI-compatible judge and /score reward service (with fault injection)",
        description=(
            "Serve POST /v1/chat/completions (a rule-based judge), POST /score (a reward service), "
            "GET /health and /admin/{stats,reset,config} until interrupted. A request body containing "
            "@@fault:KIND@@ (or @@fault:KIND:N@@, first N identical bodies only) gets that fault."
        ),
    )
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: %(default)s)")
    serve.add_argument(
        "--port", type=int, default=8000, help="port to listen on, 0 picks a free one (default: %(default)s)"
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
        default=defaults.overflow,
        help="over capacity: wait FIFO for a slot, or answer 429 at once (default: %(default)s)",
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
        "--think", action="store_true", help="prefix replies with a <think> block holding a decoy verdict"
    )
    serve.add_argument(
        "--echo-response",
        action="store_true",
        help="quote the policy response in the reply before the verdict",
    )
    serve.set_defaults(handler=_run_serve, subparser=serve)


def _serve_config(args: argparse.Namespace) -> DevServerConfig:
    api_key = None
    if args.api_key_env is not None:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise _UsageError(f"--api-key-env: environment variable {args.api_key_env} is not set or empty")
    config = DevServerConfig(
        latency_ms=tuple(args.latency_ms),
        capacity=args.capacity,
        overflow=args.overflow,
        retry_after_s=args.retry_after,
        fault_rates=dict(args.fault),
        seed=args.seed,
        api_key=api_key,
        verdict_format=args.verdict_format,
        think=args.think,
        echo_response=args.echo_response,
    )
    try:
        config.validate()
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    return config


def _run_serve(args: argparse.Namespace) -> int:
    config = _serve_config(args)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_forever(config, args.host, args.port))
    return 0


async def _serve_forever(config: DevServerConfig, host: str, port: int) -> None:
    from async_reward.devserver import DevServer

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # SIGTERM (a supervisor, or a test's terminate()) stops as cleanly as Ctrl-C does.
    with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows event loops
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with DevServer(config, host, port) as server:
        print(f"async-reward devserver listening on {server.url}", flush=True)
        print(f"  OpenAI base_url: {server.url}/v1   reward service: {server.url}/score", flush=True)
        print(f"  {config!r}", flush=True)  # repr leaves the API key out
        await stop.wait()


if __name__ == "__main__":
    raise SystemExit(main())
