"""The decoupled mode's prompt ledger (``async_reward.v1.decoupled.window.PromptLedger``), without Ray:
every dispatched prompt accounted once, reconciled with the prompt keys TransferQueue lists, and
``balanced()`` false for good after any lost, unknown or double-counted prompt (hypothesis histories
with a fault injected anywhere), true through every history without one."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from async_reward.v1.decoupled.window import EVICTION_REASONS, PromptLedger


def test_ledger_accounts_each_prompt_once_and_finds_lost_and_double_counted_ones():
    ledger = PromptLedger()
    ledger.dispatched(["a", "b", "c", "d"], "window")
    assert [ledger.dispatch_order(uid) for uid in "dbz"] == [3, 1, 4]  # the sampler's tie-break
    ledger.evicted("c", "generation_error")
    ledger.refill_credit += 1
    assert ledger.take_refills(3) == 1
    ledger.dispatched(["e"], "refill")
    ledger.sampled(["a", "b"])
    ledger.step_trained(["a"])  # b was sampled and dropped (every session excluded)
    report = ledger.check(["d", "e"])
    assert report.ok and ledger.balanced()
    metrics = ledger.metrics(report)
    assert metrics["ledger/dispatched"] == 5 and metrics["ledger/refilled"] == 1
    assert metrics["ledger/trained"] == 1 and metrics["ledger/in_flight"] == 2
    assert metrics["ledger/evicted/generation_error"] == 1 and metrics["ledger/evicted/untrained"] == 1
    assert metrics["ledger/unaccounted"] == 0

    assert ledger.balanced() and metrics["ledger/balanced"] == 1.0

    ledger.evicted("a", "stale")  # already trained
    lost = ledger.check(["e", "zz"])  # d vanished; zz was never dispatched
    assert lost.unaccounted == ["d"] and lost.unknown == ["zz"] and lost.double_counted == ["a"]
    assert not lost.ok and ledger.metrics(lost)["ledger/unaccounted"] == 2
    assert not ledger.balanced()  # for good: each fault is counted once and stays counted
    assert ledger.check(["e", "zz"]).ok and not ledger.balanced()  # zz adopted, reported once


#: One step of a history: (operation, choice among the candidates, how many).
HISTORY_OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["dispatch", "evict", "sample", "step_end", "check"]),
        st.integers(0, 50),
        st.integers(1, 3),
    ),
    max_size=40,
)
FAULTS = ("lose", "unknown", "evict_twice", "sample_twice", "train_unsampled", "dispatch_twice")


class _World:
    """What TransferQueue holds (prompt keys in flight) and what the trainer did, driving a ledger."""

    def __init__(self) -> None:
        self.ledger = PromptLedger()
        self.listed: set[str] = set()
        self.sampled: list[str] = []
        self.settled: list[str] = []
        self.fresh = 0

    def new_uid(self) -> str:
        self.fresh += 1
        return f"u{self.fresh}"

    def apply(self, operation: str, choice: int, count: int) -> None:
        ledger, listed = self.ledger, sorted(self.listed)
        if operation == "dispatch":
            uids = [self.new_uid() for _ in range(count)]
            ledger.dispatched(uids, "window")
            self.listed.update(uids)
        elif operation == "evict" and listed:
            uid = listed[choice % len(listed)]
            self.listed.discard(uid)
            ledger.evicted(uid, EVICTION_REASONS[choice % len(EVICTION_REASONS)])
            self.settled.append(uid)
        elif operation == "sample" and listed:
            uids = [listed[(choice + i) % len(listed)] for i in range(min(count, len(listed)))]
            uids = list(dict.fromkeys(uids))
            self.listed.difference_update(uids)
            ledger.sampled(uids)
            self.sampled.extend(uids)
        elif operation == "step_end":
            trained = [uid for i, uid in enumerate(self.sampled) if (choice >> (i % 6)) & 1 == 0]
            ledger.step_trained(trained)
            self.settled.extend(self.sampled)
            self.sampled = []
            ledger.check(self.listed)
        elif operation == "check":
            ledger.check(self.listed)

    def inject(self, fault: str, choice: int) -> bool:
        """One lost, unknown or double-counted prompt; False when the history offers none to fault."""
        ledger, listed = self.ledger, sorted(self.listed)
        if fault == "lose" and listed:
            self.listed.discard(listed[choice % len(listed)])  # gone from TransferQueue, nobody told
        elif fault == "unknown":
            self.listed.add(f"stray{choice}")  # a prompt key nobody dispatched
        elif fault == "evict_twice" and self.settled:
            ledger.evicted(self.settled[choice % len(self.settled)], "stale")
        elif fault == "sample_twice" and self.settled:
            ledger.sampled([self.settled[choice % len(self.settled)]])
        elif fault == "train_unsampled" and listed:
            ledger.step_trained([listed[choice % len(listed)]])
        elif fault == "dispatch_twice" and listed:
            ledger.dispatched([listed[choice % len(listed)]], "window")
        else:
            return False
        return True


@settings(max_examples=300, deadline=None)
@given(history=HISTORY_OPERATIONS)
def test_ledger_stays_balanced_through_every_history_without_a_fault(history):
    world = _World()
    for operation, choice, count in history:
        world.apply(operation, choice, count)
    world.apply("step_end", 0, 1)
    assert world.ledger.balanced()
    assert world.ledger.metrics(world.ledger.check(world.listed))["ledger/dispatched"] == (
        world.ledger.counts["trained"] + world.ledger.counts["evicted"] + len(world.listed)
    )


@settings(max_examples=300, deadline=None)
@given(
    before=HISTORY_OPERATIONS,
    after=HISTORY_OPERATIONS,
    fault=st.sampled_from(FAULTS),
    choice=st.integers(0, 50),
)
def test_a_lost_unknown_or_double_counted_prompt_unbalances_the_ledger_for_good(before, after, fault, choice):
    """Any history, one fault anywhere in it, anything after: at the next check and ever after the
    ledger is out of balance (``PromptLedger.balanced`` reconciles with TransferQueue's keys)."""
    world = _World()
    for operation, pick, count in before:
        world.apply(operation, pick, count)
    assume(world.inject(fault, choice))
    report = world.ledger.check(world.listed)
    assert not report.ok
    assert not world.ledger.balanced()
    for operation, pick, count in after:
        world.apply(operation, pick, count)
    world.apply("step_end", 0, 1)
    assert not world.ledger.balanced()
