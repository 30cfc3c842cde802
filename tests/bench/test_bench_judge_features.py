"""``benchmarks/judge_features.py`` runs and its figures hold together (a small step)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.script_module import load_script

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "judge_features.py"


def test_the_judge_features_benchmark_counts_calls_tokens_and_ties(tmp_path, capsys):
    module = load_script(SCRIPT, "judge_features")
    out = tmp_path / "figures.json"
    assert module.main(["--prompts", "6", "--group", "4", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    rubric = figures["rubric"]
    assert rubric["calls_one_call"] == figures["samples"] == 24
    assert rubric["calls_per_criterion"] == 3 * figures["samples"]  # one call per criterion
    assert 0 < rubric["tokens_one_call"] < rubric["tokens_per_criterion"]
    assert rubric["max_score_difference"] == 0.0  # the same verdicts either way
    zero = figures["zero_advantage_groups"]
    assert zero["expected_verdict"] <= zero["plain"]
    agreement = figures["agreement_with_pointwise"]
    weighted, rubric_order = agreement["expected_verdict"], agreement["rubric"]
    assert weighted["pairs"] == rubric_order["pairs"] > 0
    assert weighted["same"] == 1.0  # weighting never reverses the judge's own order
    assert rubric_order["opposite"] == 0.0  # correctness weighs most in this rubric
    assert rubric_order["same"] + rubric_order["tied"] == 1.0
    group = figures["group"]
    assert group["calls_group"] == figures["groups"] == 6  # one call a group
    assert group["calls_pointwise"] == figures["samples"]
    assert 0 < group["tokens_group"] < group["tokens_pointwise"]
    assert group["agreement_with_pointwise"]["same"] == 1.0  # the local judge's rule is the same
    fixed, shuffled = group["shift_by_member_fixed_order"], group["shift_by_member_shuffled"]
    assert fixed[0] > 0 and fixed[1:] == [0.0] * 3  # unshuffled, the first member takes the bias
    assert max(shuffled) < fixed[0] and sum(shift > 0 for shift in shuffled) >= 2  # shuffled: spread
    printed = capsys.readouterr().out
    assert "zero-advantage groups" in printed and "against pointwise verdicts" in printed
    assert "group judging (4 responses a call)" in printed and "position bias" in printed
