#!/usr/bin/env python3
"""One table from the GPU smoke runs' logs: step times, time blocked on rewards, staleness, updates.

usage: python3 examples/gpu_smoke/summarize.py [GPU_OUT]     (default ./gpu_out)
       python3 examples/gpu_smoke/summarize.py --weighted [GPU_OUT]   (judge_weighted.sh's rows)

Reads ``GPU_OUT/train_<mode>.log`` as written by the GPU kit's ``run_mode.sh`` (verl's console logger:
``step:N - key:value - ...`` per step, ``MAIN_PPO_RC=<rc> WALL=<s>s`` at the end), prints a Markdown
table and writes it with the raw numbers to ``GPU_OUT/summary.md`` and ``GPU_OUT/summary.json``.
Exits 1 when a mode failed: a non-zero exit status; for our entry point's modes, a run without
our trainer's start line (``async_reward: trainer ...PipelinedRayPPOTrainer, pipeline mode <mode>``)
or without its ``pipeline/num_updates`` metric, i.e. a run where verl's own trainer trained; for
``v1_pipelined`` and ``v1_plugin``, the same with our v1 trainer mode's start line (``v1_plugin``: and
``reward/status_ok`` on every step, since no wiring line was given); for ``v1_lines``, a step without our
replay buffer's ``reward/status_ok``; for ``v1_judge_in_job``, a run without the line saying llm_judge
scores through the judge verl serves in the job, a step without ``reward/*`` statuses, no sample
scored ``ok`` in any step, or any request reaching the kit's own judge server (scoring must go to the
served model); and in every mode an ``ImportError`` of ours in any process's log (the GPU run of
2026-11-26 trained, but every agent-loop worker logged one).

Standard library only: it runs with the GPU image's bare Python.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

MODES = (
    "baseline",
    "mini_batch",
    "one_step_off",
    "both",
    "v1",
    "v1_lines",
    "v1_pipelined",
    "v1_judge_in_job",
    "v1_plugin",
)
#: The metrics per step that go in the table (``None`` where a step lacks one).
KEYS = (
    "timing_s/step",
    "timing_s/reward_blocked",
    "off_policy/staleness",
    "pipeline/num_updates",
    "reward/status_ok",
    "reward/status_invalid",
    "reward/status_error",
    "timing_s/agent_loop/compute_score/mean",
    # judge.expected_verdict (the v1_judge_in_job mode): the share of samples weighted by the judge's
    # token probabilities; the H200 run of 2026-11-27 had none weighted, which no column showed
    "reward/extra/judge_weighted/mean",
)
#: Every per-sample status our managers report (``reward/status_<status>`` per step).
STATUSES = ("ok", "timeout", "error", "invalid")
_STEP = re.compile(r"(?:^|\s)step:(\d+) - (.*)$")
# verl formats values with pprint, so numpy scalars read ``np.float64(1.25)``.
_VALUE = re.compile(r"^(?:np\.\w+\()?([-+]?(?:[\d.]+(?:[eE][-+]?\d+)?|nan|inf))\)?$")
_RC = re.compile(r"MAIN_PPO_RC=(\d+) WALL=(\d+)s")
_START = re.compile(r"async_reward: trainer (\S+), pipeline mode (\w+)")
_V1_START = re.compile(r"async_reward: trainer (\S+) \(verl v1 trainer_mode=pipelined\), schedule (\w+)")
_OUR_IMPORT_ERROR = re.compile(r"ImportError: .*async_reward")
_IN_JOB = re.compile(r"async_reward: llm_judge scores through the judge verl serves in the job")
# verl prints the resolved config: the run asked for judge.expected_verdict.
_EXPECTED_VERDICT_ON = re.compile(r"'expected_verdict': True")
# The kit's judge server's counters (GET /admin/stats), printed after the run.
_LOCAL_JUDGE_REQUESTS = re.compile(r'"requests_total":\s*(\d+)')


def parse_log(text: str) -> dict[str, Any]:
    """Steps (``{step: {key: value}}``), exit status, wall seconds and the trainer's start line."""
    steps: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        match = _STEP.search(line)
        if not match:
            continue
        metrics = steps.setdefault(int(match.group(1)), {})
        for item in match.group(2).split(" - "):
            key, _, raw = item.strip().rpartition(":")
            value = _VALUE.match(raw)
            if key and value:
                metrics[key] = float(value.group(1))
    rc = _RC.findall(text)
    start = _START.findall(text) or _V1_START.findall(text)
    local_requests = _LOCAL_JUDGE_REQUESTS.findall(text)
    return {
        "rc": int(rc[-1][0]) if rc else None,
        "wall_s": int(rc[-1][1]) if rc else None,
        "trainer": start[0][0] if start else None,
        "trainer_mode": start[0][1] if start else None,
        "steps": {step: steps[step] for step in sorted(steps)},
        "import_errors": len(_OUR_IMPORT_ERROR.findall(text)),
        "judge_in_job": bool(_IN_JOB.search(text)),
        "expected_verdict": bool(_EXPECTED_VERDICT_ON.search(text)),
        "local_judge_requests": int(local_requests[-1]) if local_requests else None,
    }


def verdict(mode: str, run: dict[str, Any]) -> str:
    """``ok``, or what is wrong with the run."""
    if run["rc"] != 0:
        return f"FAILED: exit status {run['rc']}"
    if not run["steps"]:
        return "FAILED: no step logged"
    if run.get("import_errors"):
        return f"FAILED: {run['import_errors']} ImportError(s) of async_reward logged"
    if mode == "v1":
        return "ok"
    if mode == "v1_judge_in_job":
        return _judge_in_job_verdict(run)
    if mode == "v1_lines":
        missing = [step for step, metrics in run["steps"].items() if "reward/status_ok" not in metrics]
        return f"FAILED: steps {missing} without reward/* (our replay buffer not used)" if missing else "ok"
    if mode == "v1_plugin":
        # No wiring line on the command: the plugin's mode must bring our agent loop and replay buffer.
        missing = [step for step, metrics in run["steps"].items() if "reward/status_ok" not in metrics]
        if missing:
            return f"FAILED: steps {missing} without reward/* (the mode did not bring its own wiring)"
    trainer, trainer_mode = (
        ("PPOTrainerPipelined", "both")
        if mode in ("v1_pipelined", "v1_plugin")
        else ("PipelinedRayPPOTrainer", mode)
    )
    if run["trainer"] is None or not run["trainer"].endswith(trainer):
        return f"FAILED: trainer {run['trainer']} (no start line of ours)"
    if run["trainer_mode"] != trainer_mode:
        return f"FAILED: trainer in mode {run['trainer_mode']}, asked {trainer_mode}"
    last = run["steps"][max(run["steps"])]
    if "pipeline/num_updates" not in last:
        return "FAILED: no pipeline metrics (verl's own trainer trained)"
    return "ok"


def _judge_in_job_verdict(run: dict[str, Any]) -> str:
    if not run["judge_in_job"]:
        return "FAILED: no start line saying llm_judge scores through the judge served in the job"
    if run["local_judge_requests"] != 0:
        return f"FAILED: the kit's judge server got {run['local_judge_requests']} requests (want 0)"
    unscored = [
        step
        for step, metrics in run["steps"].items()
        if sum(metrics.get(f"reward/status_{status}", 0.0) for status in STATUSES) == 0
    ]
    if unscored:
        return f"FAILED: steps {unscored} without reward/* statuses"
    failed = [
        step
        for step, metrics in run["steps"].items()
        if metrics.get("reward/status_error", 0.0) + metrics.get("reward/status_timeout", 0.0) > 0
    ]
    if failed:
        # The H100 run of 2026-11-27: 28-31 of 32 a step `error`, the replica refusing prompts longer
        # than its context (a 400, a bare 500 through verl's router). A judge on the job's own GPU
        # answers every request it is sent, so any error or timeout is a defect to look at.
        return f"FAILED: steps {failed} with samples in error or timeout (the served judge did not answer)"
    if not any(metrics.get("reward/status_ok", 0.0) > 0 for metrics in run["steps"].values()):
        # The run of 2026-11-27: every verdict of the served judge refused (the mode now constrains
        # the reply to a verdict), so nothing it said reached a reward.
        return "FAILED: no sample scored ok in any step (every verdict of the served judge refused)"
    weighted = [metrics.get("reward/extra/judge_weighted/mean", 0.0) for metrics in run["steps"].values()]
    if run.get("expected_verdict") and not any(share > 0 for share in weighted):
        # The H200 run of 2026-11-27: weighting asked for, vLLM's probabilities returned, no sample
        # weighted (the rule read vLLM's end-of-sequence token as tokens that do not spell the reply).
        return "FAILED: judge.expected_verdict on, but no sample weighted in any step (see judge_weighting)"
    return "ok"


def _cells(run: dict[str, Any], key: str) -> str:
    values = [metrics.get(key) for metrics in run["steps"].values()]
    return " / ".join("-" if v is None else f"{v:.4g}" for v in values) or "-"


def table(runs: dict[str, dict[str, Any]]) -> str:
    """Markdown: one row per mode, the per-step values of :data:`KEYS` joined by ``/``."""
    head = ["mode", "verdict", "rc", "wall (s)", "steps", *KEYS]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mode, run in runs.items():
        cells = [mode, run["verdict"], str(run["rc"]), str(run["wall_s"]), str(len(run["steps"]))]
        rows.append("| " + " | ".join(cells + [_cells(run, key) for key in KEYS]) + " |")
    return "\n".join(rows)


#: The cases of ``judge_weighted.sh``: the verdicts vLLM's structured outputs allow in each.
WEIGHTED_CASES = {"choice_3_7": (3, 7), "choice_0_10": (0, 10), "scale_0_10": tuple(range(11))}


def weighted_case(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``async-reward score`` wrote for one case of ``judge_weighted.sh``: statuses, the share
    weighted, why the others were not, and the weighted verdicts' range."""
    statuses = {status: sum(row.get("status") == status for row in rows) for status in STATUSES}
    weighted = [row for row in rows if row.get("judge_weighted") == 1.0]
    reasons: dict[str, int] = {}
    for row in rows:
        if row.get("judge_weighted") != 1.0:
            reason = str(row.get("judge_weighting") or row.get("failure_reason") or "?")
            reasons[reason] = reasons.get(reason, 0) + 1
    expected = [float(row["judge_expected_verdict"]) for row in weighted]
    mass = [float(row["judge_verdict_mass"]) for row in weighted]
    return {
        "rows": len(rows),
        "statuses": statuses,
        "weighted": len(weighted),
        "not_weighted_reasons": reasons,
        "expected_min": min(expected, default=None),
        "expected_max": max(expected, default=None),
        "mass_min": min(mass, default=None),
        "plain_verdicts": sorted({float(row["judge_verdict"]) for row in rows if row.get("status") == "ok"}),
    }


def weighted_verdict(case: str, summary: dict[str, Any]) -> str:
    """``ok``, or what is wrong: every row ``ok`` (the reply is constrained to a verdict); in
    ``choice_3_7`` every row weighted, its weighted verdict between the two allowed."""
    if summary["rows"] == 0:
        return "FAILED: no row scored"
    if summary["statuses"]["ok"] != summary["rows"]:
        return f"FAILED: statuses {summary['statuses']}"
    low, high = WEIGHTED_CASES[case][0], WEIGHTED_CASES[case][-1]
    if case == "choice_3_7":
        if summary["weighted"] != summary["rows"]:
            return f"FAILED: {summary['rows'] - summary['weighted']} row(s) not weighted"
        if not low <= summary["expected_min"] <= summary["expected_max"] <= high:
            return f"FAILED: weighted verdicts outside [{low}, {high}]"
    return "ok"


def weighted_main(out: Path) -> int:
    """The table of ``judge_weighted.sh``'s cases: ``GPU_OUT/judge_weighted.md`` and ``.json``."""
    head = ["case", "verdict", "rows", "ok", "weighted", "weighted verdicts", "least mass", "plain verdicts"]
    head.append("not weighted, why")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    results: dict[str, dict[str, Any]] = {}
    for case in WEIGHTED_CASES:
        path = out / f"judge_weighted_{case}.jsonl"
        if not path.exists():
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        summary = weighted_case(rows)
        summary["verdict"] = weighted_verdict(case, summary)
        results[case] = summary
        span = (
            "-"
            if summary["expected_min"] is None
            else f"{summary['expected_min']:.3f}-{summary['expected_max']:.3f}"
        )
        mass = "-" if summary["mass_min"] is None else f"{summary['mass_min']:.3f}"
        plain = ", ".join(f"{v:g}" for v in summary["plain_verdicts"]) or "-"
        why = "; ".join(f"{n}x {reason}" for reason, n in summary["not_weighted_reasons"].items()) or "-"
        lines.append(
            f"| {case} | {summary['verdict']} | {summary['rows']} | {summary['statuses']['ok']} | "
            f"{summary['weighted']} | {span} | {mass} | {plain} | {why} |"
        )
    if not results:
        print(f"no judge_weighted_<case>.jsonl in {out}", file=sys.stderr)
        return 1
    text = "\n".join(lines)
    print(text)
    (out / "judge_weighted.md").write_text(text + "\n")
    (out / "judge_weighted.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(summary["verdict"] == "ok" for summary in results.values()) else 1


def main(argv: list[str]) -> int:
    if len(argv) > 1 and argv[1] == "--weighted":
        return weighted_main(Path(argv[2] if len(argv) > 2 else "gpu_out"))
    out = Path(argv[1] if len(argv) > 1 else "gpu_out")
    runs: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        log = out / f"train_{mode}.log"
        if log.exists():
            run = parse_log(log.read_text(errors="replace"))
            run["verdict"] = verdict(mode, run)
            runs[mode] = run
    if not runs:
        print(f"no train_<mode>.log in {out}", file=sys.stderr)
        return 1
    text = table(runs)
    print(text)
    (out / "summary.md").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps(runs, indent=1) + "\n")
    return 0 if all(run["verdict"] == "ok" for run in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
