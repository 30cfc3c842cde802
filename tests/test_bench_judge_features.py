"""``benchmarks/judge_features.py`` runs and its figures hold together (a small step)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "judge_features.py"


def test_the_judge_features_benchmark_counts_calls_tokens_and_ties(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("judge_features", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
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
    printed = capsys.readouterr().out
    assert "zero-advantage groups" in printed and "against pointwise verdicts" in printed
