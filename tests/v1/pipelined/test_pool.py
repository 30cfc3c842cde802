"""The rule that forms each step's batch at ``max_staleness`` >= 2 (:mod:`async_reward.v1.pipelined.pool`).

Pure bookkeeping, so its properties are checked over many generated schedules (hypothesis): groups
take random numbers of polls to generate, generation advances only while the trainer waits (the
colocated engine sleeps while it trains), batches are dispatched as the trainer dispatches them. The
training runs through verl's ``fit`` are in tests/v1/pipelined/test_pipelined.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from async_reward.v1.pipelined.batches import GroupState
from async_reward.v1.pipelined.pool import GroupPool


def states(pool_sizes: dict[str, int], generated: set[str], failed: frozenset[str] = frozenset()) -> dict:
    """Tag-listing states: a generated group has all its sessions written; a failed one is terminal."""
    out = {}
    for uid, size in pool_sizes.items():
        if uid in failed:
            out[uid] = GroupState(status="failure")
        elif uid in generated:
            out[uid] = GroupState(status="running", sessions={str(i) for i in range(size)})
        else:
            out[uid] = GroupState(status="running", sessions={"0"} if size > 1 else set())
    return out


def simulate(
    durations: list[int],
    batch: int,
    steps: int,
    max_staleness: int,
    own_rollout: tuple[bool, ...] = (False,),
) -> tuple[list[list[str]], dict[str, int], dict[str, int]]:
    """Run the trainer's dispatch-and-choose loop over ``steps``: returns each step's chosen groups,
    each group's dispatch version and its dispatch number. Group ``i`` (dispatch ``i // batch``)
    needs ``durations[i]`` polls of generation. After step k's batch is known, the next one is chosen
    ahead (in step k's rollout) or, where ``own_rollout[k - 1]`` (cycled) says so, in its own
    rollout with the batches of the next s steps dispatched first, as the trainer does when the
    judge caught up (``async_reward.v1.pipelined.choice``). Each choice is checked as it is made:
    only generated groups, and no generated group of an older dispatch left out for one of a newer
    dispatch."""
    pool = GroupPool()
    left: dict[str, int] = {}
    version: dict[str, int] = {}
    order: dict[str, int] = {}
    dispatched = 0
    chosen_per_step: list[list[str]] = []

    def dispatch(step: int) -> None:
        nonlocal dispatched
        uids = [f"g{dispatched}x{i}" for i in range(batch)]
        for i, uid in enumerate(uids):
            left[uid] = durations[(dispatched * batch + i) % len(durations)]
            version[uid], order[uid] = step - 1, dispatched
        pool.add(dict.fromkeys(uids, 2), version=step - 1)
        dispatched += 1

    def choose(train_step: int) -> list[str]:
        for _ in range(10_000):
            watched = pool.watched(train_step)
            generated = {uid for uid in watched.sizes if left[uid] <= 0}
            picked = pool.choose(states(watched.sizes, generated), train_step, batch, max_staleness)
            if picked is not None:
                assert set(picked) <= generated
                skipped = generated - set(picked)  # generated, left for a later step
                for uid in picked:  # oldest dispatch first: no older generated group skipped
                    assert all(order[other] >= order[uid] for other in skipped), (uid, skipped)
                pool.take(picked, train_step)
                return picked
            for uid in watched.sizes:  # one poll of generation
                left[uid] -= 1
        raise AssertionError("the batch was never formed")

    upcoming: list[str] | None = None
    own = False
    for step in range(1, steps + 1):
        if upcoming is None:
            horizon = min(steps, step + max_staleness) if own else step
            while dispatched < max(step, horizon):
                dispatch(step)
            upcoming = choose(step)
        chosen_per_step.append(upcoming)
        upcoming = None
        own = own_rollout[(step - 1) % len(own_rollout)]
        if step + 1 <= steps and not own:
            while dispatched < min(steps, step + max_staleness):
                dispatch(step)
            upcoming = choose(step + 1)
    assert not pool
    return chosen_per_step, version, order


@settings(max_examples=150, deadline=None)
@given(
    durations=st.lists(st.integers(0, 40), min_size=1, max_size=30),
    batch=st.integers(1, 5),
    steps=st.integers(1, 8),
    max_staleness=st.integers(2, 4),
    own_rollout=st.lists(st.booleans(), min_size=1, max_size=8).map(tuple),
)
def test_every_group_is_trained_once_within_the_staleness_limit_oldest_dispatch_first(
    durations: list[int], batch: int, steps: int, max_staleness: int, own_rollout: tuple[bool, ...]
) -> None:
    """Whatever the durations, and whenever each batch is chosen (ahead or in its own rollout)."""
    chosen, version, order = simulate(durations, batch, steps, max_staleness, own_rollout)
    trained = [uid for step in chosen for uid in step]
    assert len(trained) == len(set(trained)) == steps * batch  # each once, none left in the pool
    assert all(len(step) == batch for step in chosen)  # every step a whole batch
    for step, uids in enumerate(chosen, start=1):
        assert all((step - 1) - version[uid] <= max_staleness for uid in uids)
    assert sorted(order[uid] for uid in chosen[0]) == [0] * batch  # step 1 trains the first dispatch


def test_a_long_group_is_left_for_a_later_step_and_forced_in_at_the_limit() -> None:
    """Group ``slow`` of step 2's batch is slow. With staleness 2 allowed, step 2 trains the fast groups of
    dispatches 1 and 2 instead of waiting for it; step 3 must train it (2 versions after the policy
    that started it), so its batch waits for it."""
    pool = GroupPool()
    pool.add({"a": 1, "b": 1}, version=0)  # dispatched at step 1: trained at step 1
    assert pool.choose(states({"a": 1, "b": 1}, {"a", "b"}), 1, 2, 2) == ["a", "b"]
    pool.take(["a", "b"], 1)
    pool.add({"slow": 1, "c": 1}, version=0)  # step 1's one-step-off batch
    pool.add({"d": 1, "e": 1}, version=0)  # and the batch after next, dispatched at step 1 too
    sizes = dict.fromkeys(["slow", "c", "d", "e"], 1)
    assert pool.choose(states(sizes, {"c"}), 2, 2, 2) is None  # one generated: not yet
    picked = pool.choose(states(sizes, {"c", "e", "d"}), 2, 2, 2)
    assert picked == ["c", "d"]  # oldest dispatch first, then by uid; "slow" left generating
    second = pool.take(picked, 2)
    assert second.version == 0 and second.sizes == {"c": 1, "d": 1}
    pool.add({"f": 1, "g": 1}, version=1)  # step 2 dispatches the batch of step 4
    sizes = {"slow": 1, "e": 1, "f": 1, "g": 1}
    # "slow" and "e" (version 0) must be trained by step 3: trained at step 4 they would be 3 late
    assert pool.choose(states(sizes, {"e", "f", "g"}), 3, 2, 2) is None  # waits for "slow"
    assert pool.choose(states(sizes, {"slow", "e", "f", "g"}), 3, 2, 2) == ["slow", "e"]


def test_a_failed_group_counts_as_ended_and_the_last_pool_is_taken_whole() -> None:
    """A group whose session raised (prompt tag ``failure``) never writes all its sessions: it ends
    generating all the same (the trainer drops it from the batch). A pool smaller than a batch (the
    last step's) is taken once every group has ended."""
    pool = GroupPool()
    pool.add({"a": 2, "b": 2, "c": 2}, version=3)
    sizes = {"a": 2, "b": 2, "c": 2}
    assert pool.choose(states(sizes, {"a"}, failed=frozenset({"b"})), 5, 4, 2) is None
    assert pool.choose(states(sizes, {"a", "c"}, failed=frozenset({"b"})), 5, 4, 2) == ["a", "b", "c"]


def test_a_group_is_never_dispatched_twice() -> None:
    pool = GroupPool()
    pool.add({"a": 1}, version=0)
    with pytest.raises(ValueError, match="group a is dispatched twice"):
        pool.add({"a": 1}, version=1)
