"""When the pipelined mode chooses the next batch (:mod:`async_reward.v1.pipelined.choice`).

Pure bookkeeping over tag-listing states; the training runs that show both choices through verl's
``fit`` are in tests/v1/pipelined/test_pipelined.py.
"""

from __future__ import annotations

from async_reward.v1.pipelined.batches import GroupState
from async_reward.v1.pipelined.choice import JudgeCatchUp


def generating() -> GroupState:
    return GroupState(status="running", sessions={"0"})


def generated() -> GroupState:
    return GroupState(status="running", sessions={"0", "1"})


def scored() -> GroupState:
    return GroupState(status="finished", sessions={"0", "1"})


SIZES = {"a": 2, "b": 2, "c": 2, "d": 2}


def test_before_any_measure_the_next_batch_is_chosen_ahead() -> None:
    assert JudgeCatchUp().choose_in_own_rollout() is False


def test_the_backlog_is_what_the_rollout_left_generated_and_unscored() -> None:
    catch_up = JudgeCatchUp()
    states = {"a": scored(), "b": generated(), "c": generating(), "d": generated()}
    noted = catch_up.rollout_ended(states, SIZES)
    assert noted == 2 and catch_up.backlog == {"b", "d"}  # "c" still generating, "a" already scored


def test_caught_up_only_when_every_group_of_the_backlog_is_scored() -> None:
    catch_up = JudgeCatchUp()
    catch_up.rollout_ended({"a": generated(), "b": generated(), "c": generating(), "d": scored()}, SIZES)
    # "c" finished generating meanwhile and is unscored: not in the backlog, so it does not count
    assert catch_up.prepare_ended({"a": scored(), "b": generated(), "c": generated()}) is False
    assert catch_up.choose_in_own_rollout() is False
    failed = GroupState(status="failure")  # a failed group has ended: the judge is done with it
    assert catch_up.prepare_ended({"a": scored(), "b": failed, "c": generated()}) is True
    assert catch_up.choose_in_own_rollout() is True


def test_a_group_missing_from_the_listing_is_not_scored() -> None:
    """A backlog group whose prompt tag is absent (``status`` None) has not ended: not caught up."""
    catch_up = JudgeCatchUp()
    catch_up.rollout_ended({"a": generated(), "b": scored(), "c": scored(), "d": scored()}, SIZES)
    assert catch_up.prepare_ended({"a": GroupState(status=None)}) is False


def test_an_empty_backlog_is_caught_up_and_each_step_measures_again() -> None:
    catch_up = JudgeCatchUp()
    catch_up.rollout_ended({uid: scored() for uid in SIZES}, SIZES)
    assert catch_up.prepare_ended({}) is True and catch_up.choose_in_own_rollout()
    catch_up.rollout_ended({uid: generated() for uid in SIZES}, SIZES)
    assert catch_up.prepare_ended({uid: generated() for uid in SIZES}) is False
    assert not catch_up.choose_in_own_rollout()
