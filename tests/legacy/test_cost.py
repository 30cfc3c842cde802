"""What judging cost, counted by the legacy pipelined trainer's tickets by the same rule as the v1
metrics (the rest of it: tests/judge/test_cost.py)."""

from __future__ import annotations

import numpy as np

from async_reward.legacy.chunks import GroupLayout
from async_reward.legacy.state import Ticket, TicketState
from tests.judge.test_cost import score_a_rubric_with_a_failing_criterion


async def test_the_pipelined_trainer_counts_a_rubrics_retries_by_the_same_rule(
    server, verl_config_factory, tokenizer, batch_factory
):
    """A rubric of six calls answered at once, and one with a criterion that always fails (two extra
    attempts): the ticket's ``reward/retries`` is 2, as the v1 metrics count it (issue 42, item 6)."""
    answered, failed = await score_a_rubric_with_a_failing_criterion(
        server, verl_config_factory, tokenizer, batch_factory
    )
    state = TicketState(Ticket(1, 2, "m"), GroupLayout.from_keys(["a", "b"], 2), None, np.arange(2), -1.0)
    for index, info in enumerate([answered, failed]):
        state.record(index, {"reward_score": 0.0, "reward_extra_info": info, "run_s": 0.1})
    assert state.metrics(in_flight=0)["reward/retries"] == 2
