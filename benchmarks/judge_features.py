"""What rubric judging, probability-weighted verdicts and group judging change, on the local judge
(issue 29, item 6).

Four measurements of ``llm_judge`` against ``async-reward serve``'s judge in this process, over real
HTTP, on one GRPO-shaped step (``--prompts`` prompts x ``--group`` responses, a seeded mix of right
and wrong answers, some spelling the answer out):

1. **Rubric in one call against one call per criterion**: a 3-criterion rubric graded with
   ``judge.criteria`` (one call a response) and with ``criteria_per_call: 1`` (one call a criterion,
   what pointwise judging of each criterion costs). Calls and tokens are the judge server's own
   counts; its "tokens" are whitespace words (it has no tokenizer), so the ratio is the figure, not
   the count. The two modes' rewards must agree exactly (the local judge's rule is deterministic).
2. **Zero-advantage groups with and without ``judge.expected_verdict``**: the share of groups whose
   rewards are all equal (GRPO gives them no gradient), with the judge's confidence in its verdict
   drawn per response in [0.55, 0.95] (``verdict_probability_low``). This shows the mechanism on a
   stated judge model, not what a real judge's probabilities give.
3. **Agreement with pointwise judging**: within each group (GRPO only uses the order within a group),
   the pairs of responses that pointwise ``llm_judge`` (one verdict a response) scores differently,
   and the share of them that the rubric, and the expected verdict, order the same way, the opposite
   way, or tie. The rubric also grades two criteria besides correctness, so its disagreements are
   what it adds, not errors.

4. **Group judging against pointwise** (``judge.mode: group``): calls and judge tokens of one step,
   the agreement of the within-group order with pointwise verdicts, and position bias: with the
   local judge adding 3 to the response it reads first, the mean reward change against pointwise of
   each member (by the order it was generated in), members listed in arrival order and shuffled.
   The local judge grades each response by the same rule in both modes, so the agreement shows the
   reading is right, not how a real judge grades in company.

Run: ``python benchmarks/judge_features.py`` (seconds; ``--json PATH`` writes the figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf, open_dict

CRITERIA = [
    {"name": "correct", "description": "The final answer matches the reference", "weight": 2},
    {"name": "spelled", "description": "The response mentions 'because'"},
    {"name": "apologises", "description": "The response mentions 'sorry'", "polarity": "negative"},
]


def step_rows(prompts: int, group: int, seed: int) -> list[dict[str, str]]:
    """A GRPO step's samples: per prompt, a share of right answers drawn from {0, 1/4, ..., 1}."""
    rng = random.Random(seed)
    rows = []
    for p in range(prompts):
        truth = p + 2
        share = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0])
        for k in range(group):
            answer = truth if rng.random() < share else truth + 1
            because = " because I added them" if rng.random() < 0.5 else ""
            sorry = "Sorry, " if rng.random() < 0.2 else ""
            rows.append(
                {
                    "prompt": f"What is {p} + 2? (prompt {p})",
                    "response": f"{sorry}draft {chr(97 + k % 26)}: the answer is {answer}{because}.",
                    "ground_truth": str(truth),
                    "uid": f"p{p}",
                }
            )
    return rows


def build(server_url: str, tokenizer_dir: Path, judge: dict[str, Any], group: int = 1) -> Any:
    import verl
    from hydra import compose, initialize_config_dir

    from async_reward.managers import LLMJudgeRewardManager

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        base = compose(config_name="ppo_trainer", overrides=[f"actor_rollout_ref.model.path={tokenizer_dir}"])
    config = OmegaConf.create(OmegaConf.to_container(base, resolve=False))
    with open_dict(config):
        config.reward.reward_manager.name = "llm_judge"
        config.reward.num_workers = 1
        config.reward.async_reward = {"judge": {"base_url": server_url + "/v1", **judge}}
        config.actor_rollout_ref.rollout.n = group  # judge.mode=group reads the group size here
        config.actor_rollout_ref.rollout.val_kwargs.n = group
    from transformers import AutoTokenizer

    return LLMJudgeRewardManager(config, AutoTokenizer.from_pretrained(str(tokenizer_dir)))


async def score(manager: Any, tokenizer_dir: Path, rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    from transformers import AutoTokenizer

    from async_reward.testing import rollout_batch

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    batch = rollout_batch(
        tokenizer,
        [row["prompt"] for row in rows],
        [row["response"] for row in rows],
        [row["ground_truth"] for row in rows],
        uids=[row["uid"] for row in rows],
        prompt_length=48,
        response_length=48,
        truncate=True,
    )
    outputs = await asyncio.gather(*(manager.run_single(batch[i : i + 1]) for i in range(len(batch))))
    return [{"score": float(o["reward_score"]), **o["reward_extra_info"]} for o in outputs]


def pairwise_agreement(
    rows: list[dict[str, str]], reference: list[float], other: list[float]
) -> dict[str, float | int]:
    """Within each group, over the pairs ``reference`` scores differently: the share ``other`` orders
    the same way (``same``), the opposite way (``opposite``) or ties (``tied``)."""
    groups: dict[str, list[int]] = {}
    for index, row in enumerate(rows):
        groups.setdefault(row["uid"], []).append(index)
    same = opposite = tied = 0
    for members in groups.values():
        for position, i in enumerate(members):
            for j in members[position + 1 :]:
                if reference[i] == reference[j]:
                    continue
                order = (reference[i] - reference[j]) * (other[i] - other[j])
                same += order > 0
                opposite += order < 0
                tied += order == 0
    pairs = same + opposite + tied
    return {
        "pairs": pairs,
        "same": same / pairs if pairs else 0.0,
        "opposite": opposite / pairs if pairs else 0.0,
        "tied": tied / pairs if pairs else 0.0,
    }


def zero_advantage_share(rows: list[dict[str, str]], results: list[dict[str, Any]]) -> float:
    groups: dict[str, list[float]] = {}
    for row, result in zip(rows, results, strict=True):
        groups.setdefault(row["uid"], []).append(result["score"])
    return sum(1 for scores in groups.values() if statistics.pstdev(scores) == 0.0) / len(groups)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    from async_reward.testing import build_tiny_tokenizer
    from async_reward.tools.devserver import DevServerConfig, ThreadedDevServer

    tokenizer_dir = Path(tempfile.mkdtemp(prefix="judge_features_"))
    build_tiny_tokenizer(tokenizer_dir)
    rows = step_rows(args.prompts, args.group, args.seed)
    server = ThreadedDevServer(DevServerConfig(seed=args.seed))
    server.start()
    try:
        figures: dict[str, Any] = {"samples": len(rows), "groups": args.prompts}
        rubric: dict[str, Any] = {}
        for label, per_call in (("one_call", None), ("per_criterion", 1)):
            server.reset()
            manager = build(server.url, tokenizer_dir, {"criteria": CRITERIA, "criteria_per_call": per_call})
            results = await score(manager, tokenizer_dir, rows)
            stats = server.stats()
            assert all(r["status"] == "ok" for r in results), [r["failure_reason"] for r in results][:3]
            rubric[label] = {
                "calls": stats["requests_by_path"].get("/v1/chat/completions", 0),
                "tokens": stats["tokens_total"],
                "scores": [r["score"] for r in results],
            }
        one, each = rubric["one_call"], rubric["per_criterion"]
        figures["rubric"] = {
            "calls_one_call": one["calls"],
            "calls_per_criterion": each["calls"],
            "tokens_one_call": one["tokens"],
            "tokens_per_criterion": each["tokens"],
            "token_ratio": one["tokens"] / each["tokens"],
            "max_score_difference": max(
                abs(a - b) for a, b in zip(one["scores"], each["scores"], strict=True)
            ),
        }
        server.update_config(verdict_probability=0.95, verdict_probability_low=0.55)
        shares, scores = {}, {}
        for label, weighted in (("plain", False), ("expected_verdict", True)):
            manager = build(server.url, tokenizer_dir, {"expected_verdict": weighted})
            results = await score(manager, tokenizer_dir, rows)
            assert all(r["status"] == "ok" for r in results)
            shares[label] = zero_advantage_share(rows, results)
            scores[label] = [r["score"] for r in results]
        figures["zero_advantage_groups"] = shares
        figures["agreement_with_pointwise"] = {
            "rubric": pairwise_agreement(rows, scores["plain"], one["scores"]),
            "expected_verdict": pairwise_agreement(rows, scores["plain"], scores["expected_verdict"]),
        }
        figures["group"] = await measure_group(server, tokenizer_dir, rows, args.group)
        return figures
    finally:
        from async_reward._core.http import close_sessions

        await close_sessions()
        server.stop()


async def measure_group(
    server: Any, tokenizer_dir: Path, rows: list[dict[str, str]], size: int
) -> dict[str, Any]:
    """Group judging (``judge.mode: group``) against pointwise: calls, tokens, agreement of the
    within-group order, and the position bias of a judge that adds ``_BONUS`` to the response it
    reads first, with the members in a fixed order and shuffled."""
    server.update_config(verdict_probability=1.0, verdict_probability_low=None, group_position_bonus=0)
    runs: dict[str, dict[str, Any]] = {}
    for label, judge in (
        ("pointwise", {}),
        ("group", {"mode": "group"}),
        ("biased_fixed_order", {"mode": "group", "group_shuffle": False}),
        ("biased_shuffled", {"mode": "group"}),
    ):
        server.reset()
        server.update_config(group_position_bonus=_BONUS if label.startswith("biased") else 0)
        results = await score(build(server.url, tokenizer_dir, judge, group=size), tokenizer_dir, rows)
        assert all(r["status"] == "ok" for r in results), [r["failure_reason"] for r in results][:3]
        stats = server.stats()
        runs[label] = {
            "calls": stats["requests_by_path"].get("/v1/chat/completions", 0),
            "tokens": stats["tokens_total"],
            "scores": [r["score"] for r in results],
        }
    server.update_config(group_position_bonus=0)
    pointwise, group = runs["pointwise"], runs["group"]

    def shift_by_member(label: str) -> list[float]:
        """Mean reward change against pointwise of each member, by its place in the batch (the
        order it was generated in), over the groups."""
        shifts = [b - a for a, b in zip(pointwise["scores"], runs[label]["scores"], strict=True)]
        return [statistics.fmean(shifts[k::size]) for k in range(size)]

    return {
        "calls_pointwise": pointwise["calls"],
        "calls_group": group["calls"],
        "tokens_pointwise": pointwise["tokens"],
        "tokens_group": group["tokens"],
        "token_ratio": group["tokens"] / pointwise["tokens"],
        "agreement_with_pointwise": pairwise_agreement(rows, pointwise["scores"], group["scores"]),
        "position_bonus": _BONUS,
        "shift_by_member_fixed_order": shift_by_member("biased_fixed_order"),
        "shift_by_member_shuffled": shift_by_member("biased_shuffled"),
    }


#: The local judge's bias for the response it reads first, on its 0-10 scale (``group_position_bonus``).
_BONUS = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    figures = asyncio.run(measure(args))
    rubric, zero = figures["rubric"], figures["zero_advantage_groups"]
    print(f"one step: {figures['groups']} prompts x {args.group} responses = {figures['samples']} samples")
    print(
        f"rubric of {len(CRITERIA)} criteria: {rubric['calls_one_call']} calls in one call each, "
        f"{rubric['calls_per_criterion']} one call per criterion; "
        f"judge tokens {rubric['tokens_one_call']} vs "
        f"{rubric['tokens_per_criterion']} ({rubric['token_ratio']:.2f}x); "
        f"largest reward difference {rubric['max_score_difference']:g}"
    )
    print(
        f"zero-advantage groups: plain verdicts {zero['plain']:.0%}, expected verdicts "
        f"{zero['expected_verdict']:.0%} (judge confidence drawn per response in [0.55, 0.95])"
    )
    for label, agreement in figures["agreement_with_pointwise"].items():
        print(
            f"{label} against pointwise verdicts, over the {agreement['pairs']} within-group pairs "
            f"pointwise orders: same order {agreement['same']:.0%}, opposite {agreement['opposite']:.0%}, "
            f"tied {agreement['tied']:.0%}"
        )
    group = figures["group"]
    agreement = group["agreement_with_pointwise"]
    print(
        f"group judging ({args.group} responses a call): {group['calls_group']} calls vs "
        f"{group['calls_pointwise']} pointwise; judge tokens {group['tokens_group']} vs "
        f"{group['tokens_pointwise']} ({group['token_ratio']:.2f}x); of the {agreement['pairs']} "
        f"within-group pairs pointwise orders: same order {agreement['same']:.0%}, opposite "
        f"{agreement['opposite']:.0%}, tied {agreement['tied']:.0%}"
    )
    for label in ("fixed_order", "shuffled"):
        shifts = ", ".join(f"{shift:+.3f}" for shift in group[f"shift_by_member_{label}"])
        order = label.replace("_", " ")
        print(
            f"position bias (+{group['position_bonus']} for the response read first), {order}: "
            f"mean reward change against pointwise by member in generation order: {shifts}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
