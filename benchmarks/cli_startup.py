"""Start-up of the ``async-reward`` console script: wall and CPU time of each command, from a source tree.

Each command runs as pip's generated script runs it (``from async_reward_cli import main``) in a
fresh interpreter with ``--src`` first on ``PYTHONPATH``, so two source trees (before and after a
change) can be compared on the same machine in the same minutes. CPU is the child's user + system
time (``RUSAGE_CHILDREN``), which a loaded machine inflates less than wall time. ``serve`` is timed
until it prints its listening line, then stopped with SIGTERM; ``score`` scores a small file with
``async_naive`` and a trivial reward function written to a temporary directory.

    python benchmarks/cli_startup.py --src src --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = "import sys; from async_reward_cli import main; sys.argv[0] = 'async-reward'; sys.exit(main())"
REWARD_FUNCTION = (
    "async def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
)


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one command (``serve``: until it listens)."""
    cpu, started = children_cpu_s(), time.monotonic()
    command = [sys.executable, "-c", SCRIPT, *args]
    if args[0] == "serve" and "--help" not in args:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        listening = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        if "listening" not in line:
            raise RuntimeError(f"serve did not start: {line!r}")
        return listening - started, children_cpu_s() - cpu
    proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{args} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return time.monotonic() - started, children_cpu_s() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=Path("src"), help="source tree to time (default: src)")
    parser.add_argument(
        "--runs", type=int, default=3, help="runs per command; the median is shown (default: 3)"
    )
    parser.add_argument("--rows", type=int, default=10, help="rows that score scores (default: 10)")
    args = parser.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": str(args.src.resolve())}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "reward_fn.py").write_text(REWARD_FUNCTION)
        rows = [{"id": i, "prompt": "p", "response": "1", "ground_truth": "1"} for i in range(args.rows)]
        (work / "in.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        score = ["score", "--input", str(work / "in.jsonl"), "--output", str(work / "out.jsonl")]
        score += ["--manager", "async_naive", "--function-path", str(work / "reward_fn.py"), "--no-progress"]
        commands = {
            "--help": ["--help"],
            "serve --help": ["serve", "--help"],
            "score --help": ["score", "--help"],
            "serve (to listening)": ["serve", "--port", "0"],
            f"score ({args.rows} rows, async_naive)": score,
        }
        print(f"{'command':34s} {'wall':>8s} {'cpu':>8s}   (median of {args.runs}; source {args.src})")
        for name, command in commands.items():
            runs = []
            for _ in range(args.runs):
                (work / "out.jsonl").unlink(missing_ok=True)
                runs.append(run_once(command, env))
            wall = statistics.median(run[0] for run in runs)
            cpu = statistics.median(run[1] for run in runs)
            print(f"{name:34s} {wall:7.2f}s {cpu:7.2f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
