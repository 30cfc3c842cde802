"""Pure group bookkeeping of the pipelined reward loop (no Ray): layouts, chunk picking, assembly."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from async_reward._core.postprocess import make_postprocess_spec
from async_reward._core.result import ScoredFloat
from async_reward.legacy.chunks import (
    ChunkBook,
    GroupLayout,
    assemble_rm_scores,
    neutral_value,
    postprocess_groups,
    split_groups,
    stack_extras,
)
from async_reward.legacy.state import Ticket, TicketState

# --------------------------------------------------------------------------- layouts


def test_layout_numbers_groups_by_first_member_and_allows_interleaving_and_unequal_sizes() -> None:
    keys = np.array(["b", "a", "b", "c", "a", "b"], dtype=object)
    layout = GroupLayout.from_keys(keys, 6)
    assert layout.keys == ("b", "a", "c")
    assert layout.group_of.tolist() == [0, 1, 0, 2, 1, 0]
    assert [m.tolist() for m in layout.members] == [[0, 2, 5], [1, 4], [3]]
    assert layout.sizes().tolist() == [3, 2, 1]


def test_layout_without_keys_is_one_group_per_sample() -> None:
    layout = GroupLayout.from_keys(None, 3)
    assert layout.num_groups == 3
    assert [m.tolist() for m in layout.members] == [[0], [1], [2]]


def test_layout_rejects_wrong_length_and_unhashable_keys() -> None:
    with pytest.raises(ValueError, match="length 2"):
        GroupLayout.from_keys(["a", "b"], 3)
    with pytest.raises(ValueError, match="hashable"):
        GroupLayout.from_keys([["a"], ["b"]], 2)


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_split_groups_keeps_groups_whole_and_balances(parts: int) -> None:
    keys = np.repeat(np.arange(20), 5)  # 20 groups of 5
    layout = GroupLayout.from_keys(keys, 100)
    split = split_groups(layout, parts)
    assert len(split) == parts
    joined = np.concatenate(split)
    assert sorted(joined.tolist()) == list(range(100))
    for part in split:
        assert len(part) % 5 == 0  # whole groups only
        assert abs(len(part) - 100 / parts) <= 5
    with pytest.raises(ValueError):
        split_groups(layout, 0)


def test_split_groups_with_more_parts_than_groups_leaves_parts_empty() -> None:
    layout = GroupLayout.from_keys(["a", "a", "b"], 3)
    split = split_groups(layout, 4)
    assert sum(len(p) for p in split) == 3
    assert sum(1 for p in split if len(p) == 0) == 2


# --------------------------------------------------------------------------- chunk picking


def make_book(keys: list[Any]) -> ChunkBook:
    return ChunkBook(GroupLayout.from_keys(keys, len(keys)))


def test_chunks_take_only_complete_groups_in_first_member_order() -> None:
    book = make_book(["a", "a", "b", "b", "c", "c"])
    for index in (5, 4, 3):  # group c complete, b half done
        book.record(index)
    assert book.ready_for(2) and not book.ready_for(3)
    assert book.take(1) == [2]  # group c: two samples (at least one asked, never split)
    book.record(2)  # b complete
    book.record(0)
    assert book.ready_for(2) and not book.ready_for(4)
    book.record(1)
    assert book.take(2) == [0]  # a before b: lower first member
    assert book.take(100) == [1]  # more than left means "the rest"
    assert book.finished and not book.ready_for(1)


def test_asking_for_more_than_left_waits_for_everything() -> None:
    book = make_book(["a", "a", "b", "b"])
    for index in (0, 1):
        book.record(index)
    assert not book.ready_for(10)  # two ready, four left: "the rest" is not scored yet
    assert book.ready_for(2)
    book.record(2)
    book.record(3)
    assert book.ready_for(10)
    assert book.take(10) == [0, 1]


def test_record_is_idempotent_and_restore_undoes_take() -> None:
    book = make_book(["a", "a"])
    assert book.record(0) and not book.record(0)
    assert book.num_scored == 1 and book.num_pending == 1
    book.record(1)
    groups = book.take(2)
    assert book.finished
    book.restore(groups)
    assert not book.finished and book.ready_for(2) and book.num_left == 2
    with pytest.raises(RuntimeError):
        make_book(["a"]).take(1)


# --------------------------------------------------------------------------- assembly


def test_stack_extras_fills_missing_keys_with_neutral_values() -> None:
    infos = [{"status": "ok", "v": 1.5}, {"status": "error", "flag": True}, {"status": "ok", "s": "x"}]
    stacked = stack_extras(infos, known={"late": math.nan})
    assert list(stacked) == ["status", "v", "flag", "s", "late"]
    assert stacked["status"].tolist() == ["ok", "error", "ok"]
    assert stacked["v"][0] == 1.5 and np.isnan(stacked["v"][1:]).all()
    assert stacked["flag"].tolist() == [False, True, False]
    assert stacked["s"].tolist() == ["", "", "x"]
    assert all(len(v) == 3 for v in stacked.values())
    assert neutral_value(3) is not None and math.isnan(neutral_value(3)) and neutral_value(object()) is None
    # A fill value from ``known`` wins over the neutral one.
    assert stack_extras([{"status": "error"}, {}], known={"status": "ok"})["status"].tolist() == [
        "error",
        "ok",
    ]


def test_assemble_matches_verl_layout_on_the_selected_rows(batch_factory: Any) -> None:
    rows = [{"prompt": f"q{i}", "response": "x " * (i + 1), "ground_truth": "1"} for i in range(6)]
    batch = batch_factory(rows)
    indices = np.array([1, 3, 4])
    scores = [0.25, 1.0, -2.0]
    expected = RewardManagerBase.assemble_rm_scores(batch[indices], scores)
    got = assemble_rm_scores(batch.batch, indices, scores)
    assert torch.equal(got, expected)
    # Without a "prompts" tensor the prompt width comes from attention_mask minus responses.
    got_no_prompts = assemble_rm_scores(batch.batch.select("responses", "attention_mask"), indices, scores)
    assert torch.equal(got_no_prompts, expected)


STATEFUL_SOURCE = """
import math

class GroupMean:
    def compute_score(self, data_source, solution_str, ground_truth, extra_info):
        return 1.0

    def post_process_scores(self, scores):
        finite = [s for s in scores if not math.isnan(s)]
        mean = sum(finite) / len(finite) if finite else float("nan")
        return [mean if math.isnan(s) else s for s in scores]
"""


def test_postprocess_groups_runs_once_per_group_and_imputes_failures(tmp_path: Path) -> None:
    path = tmp_path / "group_mean.py"
    path.write_text(STATEFUL_SOURCE)
    spec = make_postprocess_spec(str(path), "GroupMean", {})
    layout = GroupLayout.from_keys(["a", "a", "a", "b", "b"], 5)
    raw = [
        ScoredFloat(1.0, postprocess_spec=spec),
        ScoredFloat(0.0, failed=True, postprocess_spec=spec),
        ScoredFloat(0.5, postprocess_spec=spec),
        ScoredFloat(0.0, failed=True, postprocess_spec=spec),  # all of b failed: keep the fallback
        ScoredFloat(-1.0, failed=True, postprocess_spec=spec),
    ]
    final = postprocess_groups(layout, [0, 1], raw)
    assert final == {0: 1.0, 1: 0.75, 2: 0.5, 3: 0.0, 4: -1.0}
    assert postprocess_groups(layout, [1], [0.0, 0.0, 0.0, 0.3, 0.4]) == {3: 0.3, 4: 0.4}


# --------------------------------------------------------------------------- ticket state


def test_ticket_state_records_statuses_retries_and_errors() -> None:
    layout = GroupLayout.from_keys(["a", "a", "b"], 3)
    state = TicketState(Ticket(1, 3, "m"), layout, None, np.arange(3), fallback_score=-1.0)
    ok = {"reward_score": 1.0, "reward_extra_info": {"status": "ok", "attempts": 3}, "run_s": 0.2}
    assert state.record(0, ok) and not state.record(0, ok)
    state.record(1, {"error": "RewardScoringError: boom", "run_s": 0.1})
    assert state.error is not None and "boom" in state.error
    assert float(state.scores[1]) == -1.0 and state.scores[1].failed
    metrics = state.metrics(in_flight=5)
    assert metrics["reward/status_ok"] == 1 and metrics["reward/status_error"] == 1
    assert metrics["reward/retries"] == 2
    assert metrics["reward/in_flight"] == 1 and metrics["reward/queued"] == 0  # capped by pending
    assert metrics["reward/latency_max"] == pytest.approx(0.2)
    assert state.done_at is None
    state.record(2, state.failure_payload("all workers died"))
    assert state.done_at is not None
    assert state.extras[2]["failure_reason"] == "all workers died"
    assert state.known_extras["status"] == "ok"  # the fill value of a sample without a status
