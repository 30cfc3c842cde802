"""What a gate saves: a GSM8K rule + a judge, with the judge asked everywhere or only where the rule
scored 1 (issue 45, item 5).

``async_composite`` against ``async-reward serve``'s judge in this process, over real HTTP, on
GRPO-shaped steps (``--prompts`` prompts x ``--group`` responses, GSM8K-style ``#### <answer>``
responses, a seeded share of right answers per prompt, some explaining themselves). Four rewards,
each one step per seed:

* ``rule``: verl's GSM8K scorer alone (``async_naive`` with the job's default scorer for
  ``openai/gsm8k``);
* ``judge``: the judge alone (``llm_judge`` with a 2-criterion rubric: the final answer, weight 2,
  and "explains itself", the response saying ``because``);
* ``rule+judge``: the rule plus half the judge's rubric score, the judge asked for every response;
* ``rule+gated judge``: the same with the judge ``only_if: {component: rule, score_at_least: 1}``.

Per step: judge calls and judge tokens (the judge server's own counts; its tokens are whitespace
words, it has no tokenizer, so the ratio is the figure), the calls of the step's ``reward/cost/calls``
(rule and judge), the step's scoring wall time (the judge answering in ``--latency-ms``, 16 calls at
once per judge), and the mean reward. Where both composites asked the judge (right answers), their
rewards must agree exactly (the local judge is deterministic); the mean rewards differ by what the
ungated judge gives wrong answers that explain themselves.

Run: ``python benchmarks/composite_gate.py`` (seconds; ``--json PATH`` writes the figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf, open_dict

GSM8K = "openai/gsm8k"
RUBRIC = [
    {"name": "correct", "description": "The final answer matches the reference", "weight": 2},
    {"name": "explains", "description": "The response mentions 'because'"},
]
JUDGE = {"name": "judge", "manager": "llm_judge", "weight": 0.5}
#: verl's GSM8K rule scores 0 or 1: declared, so that the fallback can be checked against the lowest sum.
RULE = {"name": "rule", "manager": "async_naive", "score_range": [0, 1]}
GATE = {"component": "rule", "score_at_least": 1.0}
#: label -> (manager, composite components or None).
REWARDS: dict[str, tuple[str, list[dict[str, Any]] | None]] = {
    "rule": ("async_naive", None),
    "judge": ("llm_judge", None),
    "rule+judge": ("async_composite", [RULE, JUDGE]),
    "rule+gated judge": (
        "async_composite",
        [RULE, {**JUDGE, "only_if": GATE}],
    ),
}


def step_rows(prompts: int, group: int, seed: int) -> list[dict[str, str]]:
    """A GRPO step's samples: per prompt, a share of right answers drawn from {0, 1/4, ..., 1}; half the
    responses explain themselves ("because ...")."""
    rng = random.Random(seed)
    rows = []
    for p in range(prompts):
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        truth = a + b
        share = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0])
        for k in range(group):
            answer = truth if rng.random() < share else truth + rng.choice([-2, -1, 1, 10])
            because = f"because {a} + {b} = {answer}" if rng.random() < 0.5 else f"so it is {answer}"
            rows.append(
                {
                    "prompt": f"Ann has {a} apples and buys {b} more. How many apples does she have? ({p})",
                    "response": f"Draft {k}: {because}.\n#### {answer}",
                    "ground_truth": str(truth),
                    "uid": f"p{p}",
                }
            )
    return rows


def verl_config(tokenizer_dir: Path, manager: str, settings: dict[str, Any]) -> Any:
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        base = compose(config_name="ppo_trainer", overrides=[f"actor_rollout_ref.model.path={tokenizer_dir}"])
    config = OmegaConf.create(OmegaConf.to_container(base, resolve=False))
    with open_dict(config):
        config.reward.reward_manager.name = manager
        config.reward.num_workers = 1
        config.reward.async_reward = settings
    return config


def build(server_url: str, tokenizer_dir: Path, label: str) -> Any:
    from transformers import AutoTokenizer
    from verl.trainer.ppo.reward import load_reward_manager

    manager, components = REWARDS[label]
    settings: dict[str, Any] = {"limits": {"max_concurrency": 16}}
    if manager != "async_naive":
        settings["judge"] = {"base_url": server_url + "/v1", "criteria": RUBRIC}
    if components is not None:
        settings["composite"] = {"components": components}
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    return load_reward_manager(verl_config(tokenizer_dir, manager, settings), tokenizer)


async def score(
    manager: Any, tokenizer_dir: Path, rows: list[dict[str, str]]
) -> tuple[list[dict[str, Any]], float]:
    """Each row's reward and extras, and the wall time of scoring them all at once."""
    from transformers import AutoTokenizer

    from async_reward.testing import rollout_batch

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    batch = rollout_batch(
        tokenizer,
        [row["prompt"] for row in rows],
        [row["response"] for row in rows],
        [row["ground_truth"] for row in rows],
        uids=[row["uid"] for row in rows],
        data_source=GSM8K,
        prompt_length=64,
        response_length=48,
    )
    started = time.perf_counter()
    outputs = await asyncio.gather(*(manager.run_single(batch[i : i + 1]) for i in range(len(batch))))
    wall_s = time.perf_counter() - started
    return [{"score": float(o["reward_score"]), **o["reward_extra_info"]} for o in outputs], wall_s


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    from async_reward.judge.cost import cost_metrics
    from async_reward.testing import build_tiny_tokenizer
    from async_reward.tools.devserver import DevServerConfig, ThreadedDevServer

    tokenizer_dir = Path(tempfile.mkdtemp(prefix="composite_gate_"))
    build_tiny_tokenizer(tokenizer_dir)
    server = ThreadedDevServer(DevServerConfig(seed=0, latency_ms=tuple(args.latency_ms)))
    server.start()
    per_label: dict[str, list[dict[str, Any]]] = {label: [] for label in REWARDS}
    agreement: list[float] = []
    right_shares: list[float] = []
    try:
        for step in range(args.steps):
            rows = step_rows(args.prompts, args.group, args.seed + step)
            scores: dict[str, list[float]] = {}
            for label in REWARDS:
                server.reset()
                results, wall_s = await score(build(server.url, tokenizer_dir, label), tokenizer_dir, rows)
                assert all(r["status"] == "ok" for r in results), [r["failure_reason"] for r in results][:3]
                stats = server.stats()
                cost = cost_metrics(results)
                scores[label] = [r["score"] for r in results]
                per_label[label].append(
                    {
                        "judge_calls": stats["requests_by_path"].get("/v1/chat/completions", 0),
                        "judge_tokens": stats["tokens_total"],
                        "cost_calls": cost["reward/cost/calls"],
                        "wall_s": wall_s,
                        "mean_reward": statistics.fmean(scores[label]),
                    }
                )
            right_shares.append(statistics.fmean(scores["rule"]))
            judged = [i for i, s in enumerate(scores["rule"]) if s == 1.0]
            agreement.append(
                max(
                    (abs(scores["rule+judge"][i] - scores["rule+gated judge"][i]) for i in judged),
                    default=0.0,
                )
            )
    finally:
        from async_reward._core.http import close_sessions

        await close_sessions()
        server.stop()
    figures: dict[str, Any] = {
        "samples_per_step": args.prompts * args.group,
        "steps": args.steps,
        "latency_ms": list(args.latency_ms),
        "largest_difference_where_both_judged": max(agreement),
        "rewards": {},
    }
    for label, steps in per_label.items():
        figures["rewards"][label] = {
            key: statistics.fmean(s[key] for s in steps)
            for key in ("judge_calls", "judge_tokens", "cost_calls", "wall_s", "mean_reward")
        }
    figures["right_share"] = statistics.fmean(right_shares)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3, help="steps (seeds) averaged")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, nargs=2, default=[20.0, 80.0], metavar=("LOW", "HIGH"))
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    figures = asyncio.run(measure(args))
    print(
        f"{figures['steps']} steps of {figures['samples_per_step']} samples ({args.prompts} prompts x "
        f"{args.group}), {figures['right_share']:.0%} right answers; judge latency "
        f"{args.latency_ms[0]:g}-{args.latency_ms[1]:g} ms, 16 calls at once; means per step:"
    )
    print(
        f"{'reward':<18} {'judge calls':>11} {'judge tokens':>12} {'calls (all)':>11} {'wall s':>7} "
        f"{'mean reward':>11}"
    )
    for label, row in figures["rewards"].items():
        print(
            f"{label:<18} {row['judge_calls']:>11.0f} {row['judge_tokens']:>12.0f} "
            f"{row['cost_calls']:>11.0f} {row['wall_s']:>7.2f} {row['mean_reward']:>11.3f}"
        )
    print(
        "largest reward difference between rule+judge and rule+gated judge where both asked the judge: "
        f"{figures['largest_difference_where_both_judged']:g}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
