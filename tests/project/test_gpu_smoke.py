"""``examples/gpu_smoke/summarize.py`` reads the GPU runs' logs as verl writes them.

The step lines are made by verl's own console logger (``concat_dict_to_str``, numpy values as a
trainer logs them) behind Ray's actor prefix, so the parser meets the real format; the run itself
needs a GPU (``examples/gpu_smoke/run.sh``).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from verl.utils.logger.aggregate_logger import concat_dict_to_str

from tests.support.script_module import load_script

SCRIPT = Path(__file__).parents[2] / "examples" / "gpu_smoke" / "summarize.py"
OUR_START = (
    "(PipelinedTaskRunner pid=7) async_reward: trainer async_reward.legacy.trainer.PipelinedRayPPOTrainer, "
    "pipeline mode {mode} (mini_batch=True, one_step_off_policy=True)"
)


@pytest.fixture(scope="module")
def summarize() -> ModuleType:
    return load_script(SCRIPT, "gpu_smoke_summarize")


def step_line(step: int, **metrics: float) -> str:
    data = {key.replace("__", "/"): np.float64(value) for key, value in metrics.items()}
    return f"(PipelinedTaskRunner pid=7) {concat_dict_to_str(data, step=step)}"


def write_log(out: Path, mode: str, lines: list[str], rc: int = 0) -> None:
    (out / f"train_{mode}.log").write_text("\n".join([*lines, f"MAIN_PPO_RC={rc} WALL=236s", ""]))


def test_pipeline_runs_pass_and_the_table_has_every_step(summarize, tmp_path):
    both = [
        OUR_START.format(mode="both"),
        *(
            step_line(
                s,
                timing_s__step=t,
                timing_s__reward_blocked=b,
                off_policy__staleness=st,
                pipeline__num_updates=2,
            )
            for s, t, b, st in [(1, 9.5, 1.2, 0), (2, 2.78, 0.0024, 1), (3, 1.84, 0.0015, 1)]
        ),
    ]
    write_log(tmp_path, "both", both)
    v1 = [step_line(s, timing_s__step=4.0) for s in (1, 2, 3)]
    write_log(tmp_path, "v1", [line.replace("PipelinedTaskRunner", "TaskRunnerV1") for line in v1])

    assert summarize.main(["summarize.py", str(tmp_path)]) == 0
    runs = {
        mode: summarize.parse_log((tmp_path / f"train_{mode}.log").read_text()) for mode in ("both", "v1")
    }
    assert runs["both"]["steps"][2] == {
        "timing_s/step": 2.78,
        "timing_s/reward_blocked": 0.0024,
        "off_policy/staleness": 1.0,
        "pipeline/num_updates": 2.0,
    }
    assert (runs["both"]["rc"], runs["both"]["wall_s"], runs["both"]["trainer_mode"]) == (0, 236, "both")
    table = (tmp_path / "summary.md").read_text()
    assert (
        "| both | ok | 0 | 236 | 3 | 9.5 / 2.78 / 1.84 | 1.2 / 0.0024 / 0.0015 | 0 / 1 / 1 | 2 / 2 / 2 |"
        in table
    )
    assert "| v1 | ok |" in table


def test_a_run_trained_by_verls_own_trainer_fails(summarize, tmp_path):
    """Issue 8's symptom: rc 0 and three steps, but verl's metrics only (scored in its agent loop)."""
    verls = [
        step_line(s, timing_s__step=3.7, timing_s__agent_loop__compute_score__mean=1.1) for s in (1, 2, 3)
    ]
    write_log(tmp_path, "mini_batch", verls)
    assert summarize.main(["summarize.py", str(tmp_path)]) == 1
    run = summarize.parse_log((tmp_path / "train_mini_batch.log").read_text())
    assert summarize.verdict("mini_batch", run).startswith("FAILED: trainer None")
    # Our trainer's start line in another mode than asked, or without the pipeline metrics: failed too.
    wrong_mode = [OUR_START.format(mode="baseline"), *verls, "MAIN_PPO_RC=0 WALL=1s"]
    assert "asked mini_batch" in summarize.verdict("mini_batch", summarize.parse_log("\n".join(wrong_mode)))
    no_metrics = [OUR_START.format(mode="mini_batch"), *verls, "MAIN_PPO_RC=0 WALL=1s"]
    assert "no pipeline metrics" in summarize.verdict(
        "mini_batch", summarize.parse_log("\n".join(no_metrics))
    )
    assert (
        summarize.verdict("both", summarize.parse_log("MAIN_PPO_RC=124 WALL=540s"))
        == "FAILED: exit status 124"
    )


V1_START = (
    "(TaskRunnerV1 pid=9) async_reward: trainer async_reward.v1.pipelined.trainer.PPOTrainerPipelined "
    "(verl v1 trainer_mode=pipelined), schedule {schedule} (mini_batch=True, max_staleness=1)"
)
#: What every agent-loop worker logged on the GPU run of 2026-11-26 (registration inside an import).
WORKER_IMPORT_ERROR = (
    "(pid=9147) ImportError: cannot import name 'RewardAgentLoopManager' from partially initialized module "
    "'async_reward.v1.agent_loop' (most likely due to a circular import)"
)


def test_our_v1_runs_need_their_start_line_metrics_and_no_import_error_of_ours(summarize, tmp_path):
    pipelined = [
        step_line(s, timing_s__step=2.7, off_policy__staleness=min(s - 1, 1), pipeline__num_updates=2)
        for s in (1, 2, 3)
    ]
    v1_pipelined = [
        V1_START.format(schedule="both"),
        *(line.replace("Pipelined", "V1") for line in pipelined),
    ]
    write_log(tmp_path, "v1_pipelined", v1_pipelined)
    write_log(tmp_path, "v1_lines", [step_line(s, reward__status_ok=32) for s in (1, 2, 3)])
    assert summarize.main(["summarize.py", str(tmp_path)]) == 0
    run = summarize.parse_log((tmp_path / "train_v1_pipelined.log").read_text())
    assert run["trainer"].endswith("PPOTrainerPipelined") and run["trainer_mode"] == "both"
    assert "| v1_pipelined | ok | 0 | 236 | 3 |" in (tmp_path / "summary.md").read_text()

    def verdict(mode: str, lines: list[str]) -> str:
        return summarize.verdict(mode, summarize.parse_log("\n".join([*lines, "MAIN_PPO_RC=0 WALL=1s"])))

    # Trained with rc 0, but a worker of ours failed an import: failed, in every mode.
    assert verdict("v1_pipelined", [*v1_pipelined, WORKER_IMPORT_ERROR]).startswith("FAILED: 1 ImportError")
    assert verdict("v1", [step_line(1, timing_s__step=4.0), WORKER_IMPORT_ERROR]).startswith("FAILED")
    # Another schedule than both, or no start line of ours (verl's own mode ran): failed.
    assert "asked both" in verdict("v1_pipelined", [V1_START.format(schedule="mini_batch"), *pipelined])
    assert "no start line" in verdict("v1_pipelined", pipelined)
    # The v1 lines without our replay buffer's reward/* metrics on a step: failed.
    lines_without = [step_line(1, reward__status_ok=32), step_line(2, timing_s__step=6.0)]
    assert (
        verdict("v1_lines", lines_without)
        == "FAILED: steps [2] without reward/* (our replay buffer not used)"
    )


IN_JOB_START = (
    "(TaskRunnerV1 pid=9) async_reward: llm_judge scores through the judge verl serves in the job "
    "(reward.reward_model.enable=true), behind verl's router, as model '/tmp/gpu_assets/model'; colocated"
)
LOCAL_JUDGE_STATS = '{"requests_total": %d, "requests_by_path": {}}'


def test_the_judge_in_job_run_needs_its_line_statuses_and_no_request_to_the_local_judge(summarize, tmp_path):
    steps = [
        step_line(s, timing_s__step=5.0, reward__status_ok=20, reward__status_invalid=12) for s in (1, 2, 3)
    ]
    run_log = [IN_JOB_START, *steps, LOCAL_JUDGE_STATS % 0]
    write_log(tmp_path, "v1_judge_in_job", run_log)
    assert summarize.main(["summarize.py", str(tmp_path)]) == 0
    assert "| v1_judge_in_job | ok | 0 | 236 | 3 |" in (tmp_path / "summary.md").read_text()

    def verdict(lines: list[str]) -> str:
        return summarize.verdict(
            "v1_judge_in_job", summarize.parse_log("\n".join([*lines, "MAIN_PPO_RC=0 WALL=1s"]))
        )

    assert verdict(run_log) == "ok"
    # Scored by the kit's own server (the URL left in), or no line of ours: not the served judge.
    assert verdict([IN_JOB_START, *steps, LOCAL_JUDGE_STATS % 96]).startswith("FAILED: the kit's judge")
    assert verdict([*steps, LOCAL_JUDGE_STATS % 0]).startswith("FAILED: no start line")
    assert verdict([IN_JOB_START, *steps]).startswith("FAILED: the kit's judge server got None")
    # A step without any reward status (scored by verl's /classify path, or not at all): failed.
    unscored = [IN_JOB_START, step_line(1, timing_s__step=5.0), *steps[1:], LOCAL_JUDGE_STATS % 0]
    assert verdict(unscored) == "FAILED: steps [1] without reward/* statuses"
    # Samples the served judge did not answer, as on the H100 run of 2026-11-27 (29 of 32 `error`).
    erring = [
        IN_JOB_START,
        step_line(1, timing_s__step=5.0, reward__status_ok=3, reward__status_error=29),
        *steps[1:],
        LOCAL_JUDGE_STATS % 0,
    ]
    assert verdict(erring).startswith("FAILED: steps [1] with samples in error or timeout")
    timing_out = [
        IN_JOB_START,
        *steps[:2],
        step_line(3, reward__status_ok=31, reward__status_timeout=1),
        LOCAL_JUDGE_STATS % 0,
    ]
    assert verdict(timing_out).startswith("FAILED: steps [3] with samples in error or timeout")
    # Every verdict refused, as on the GPU run of 2026-11-27 (32 invalid a step): nothing was scored.
    refused = [step_line(s, reward__status_ok=0, reward__status_invalid=32) for s in (1, 2)]
    assert verdict([IN_JOB_START, *refused, LOCAL_JUDGE_STATS % 0]).startswith("FAILED: no sample scored ok")
    # Weighting asked for (verl prints the config) but no sample weighted, as on the H200 run of
    # 2026-11-27; one weighted step is enough to pass.
    asked = "     'async_reward': {'judge': {'expected_verdict': True,"
    unweighted = [
        step_line(s, reward__status_ok=32, reward__extra__judge_weighted__mean=0.0) for s in (1, 2, 3)
    ]
    assert verdict([asked, IN_JOB_START, *unweighted, LOCAL_JUDGE_STATS % 0]).startswith(
        "FAILED: judge.expected_verdict on, but no sample weighted"
    )
    assert verdict([IN_JOB_START, *unweighted, LOCAL_JUDGE_STATS % 0]) == "ok"  # not asked for
    weighted = [*unweighted[:2], step_line(3, reward__status_ok=32, reward__extra__judge_weighted__mean=1.0)]
    assert verdict([asked, IN_JOB_START, *weighted, LOCAL_JUDGE_STATS % 0]) == "ok"


def test_the_plugin_run_needs_our_mode_and_our_wiring_on_every_step(summarize):
    def verdict(lines: list[str]) -> str:
        return summarize.verdict(
            "v1_plugin", summarize.parse_log("\n".join([*lines, "MAIN_PPO_RC=0 WALL=1s"]))
        )

    start = V1_START.format(schedule="both")
    scored = [step_line(s, pipeline__num_updates=2, reward__status_ok=32) for s in (1, 2, 3)]
    assert verdict([start, *scored]) == "ok"
    # Our mode ran, but a step without our replay buffer's statuses: the mode did not wire itself.
    unscored = [*scored[:2], step_line(3, pipeline__num_updates=2)]
    assert verdict([start, *unscored]).startswith("FAILED: steps [3] without reward/*")
    # verl's own sync mode ran (the plugin did not register ours): no start line of ours.
    assert "no start line" in verdict(scored)
    # run.sh writes this when the package is not installed where verl runs.
    not_installed = "MAIN_PPO_RC=2 WALL=0s (async-reward not installed: no verl.plugins entry point)"
    assert summarize.verdict("v1_plugin", summarize.parse_log(not_installed)) == "FAILED: exit status 2"


def weighted_row(verdict: float, expected: float | None, status: str = "ok", why: str = "expected") -> dict:
    """A row as ``async-reward score`` writes it for llm_judge with judge.expected_verdict."""
    return {
        "status": status,
        "score": (expected if expected is not None else verdict) / 10,
        "judge_verdict": verdict,
        "judge_expected_verdict": expected if expected is not None else float("nan"),
        "judge_verdict_mass": 1.0 if expected is not None else float("nan"),
        "judge_weighted": 1.0 if expected is not None else 0.0,
        "judge_weighting": why if expected is not None else f"plain: {why}",
    }


def write_rows(out: Path, case: str, rows: list[dict]) -> None:
    (out / f"judge_weighted_{case}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_the_weighted_verdict_check_needs_every_constrained_row_weighted_between_its_verdicts(
    summarize, tmp_path
):
    write_rows(tmp_path, "choice_3_7", [weighted_row(3, 4.6), weighted_row(7, 5.2)])
    write_rows(tmp_path, "choice_0_10", [weighted_row(0, None, why="no alternative")])
    assert summarize.main(["summarize.py", "--weighted", str(tmp_path)]) == 0
    table = (tmp_path / "judge_weighted.md").read_text()
    assert "| choice_3_7 | ok | 2 | 2 | 2 | 4.600-5.200 | 1.000 | 3, 7 | - |" in table
    assert "1x plain: no alternative" in table

    case = summarize.weighted_case
    verdict = summarize.weighted_verdict
    # A row left unweighted where only 3 and 7 are allowed, a weighted verdict outside them, a row
    # not ok: each fails the check.
    assert verdict("choice_3_7", case([weighted_row(3, 4.6), weighted_row(3, None)])) == (
        "FAILED: 1 row(s) not weighted"
    )
    assert verdict("choice_3_7", case([weighted_row(7, 8.0)])).startswith("FAILED: weighted verdicts outside")
    assert verdict(
        "scale_0_10", case([weighted_row(5, 5.0), weighted_row(0, None, status="error")])
    ).startswith("FAILED: statuses")
    assert verdict("scale_0_10", case([])) == "FAILED: no row scored"
    write_rows(tmp_path, "scale_0_10", [weighted_row(5, 5.0, status="invalid")])
    assert summarize.main(["summarize.py", "--weighted", str(tmp_path)]) == 1
