"""Reading a verdict costs time linear in the reply, whatever the reply holds.

The parser runs on a reward worker's event loop, outside the per-call deadline: a reply that makes
it quadratic blocks every other sample of that worker (``"Score:"`` and 16k spaces took 4 s; ``'{"'
* 500_000`` took 95 s). The policy controls much of the reply (the judge quotes it), and a judge may
be allowed thousands of tokens, so each reply here is multi-megabyte and must be read within a
generous bound; after the fix they take milliseconds. CPU time of this thread is measured, so a
loaded machine does not make the test flaky.
"""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from async_reward.judge.verdict import VerdictError, VerdictRules, read_verdict
from async_reward.tools.devserver.judge import extract_final_answer

BOUND_S = 2.0
MB = 1_000_000


def _read(text: str, rules: VerdictRules) -> float | None:
    try:
        return read_verdict(text, rules)
    except VerdictError:
        return None


def timed_read(reply: str, rules: VerdictRules) -> tuple[float | None, float]:
    """The verdict (None: invalid) and the CPU seconds this thread spent reading it (not the whole
    process: Ray's and the judge server's threads run beside it)."""
    start = time.thread_time()
    verdict = _read(reply, rules)
    return verdict, time.thread_time() - start


#: (name, parser, reply): replies built to make a backtracking or rescanning parser quadratic.
HOSTILE_REPLIES: list[tuple[str, str, str]] = [
    ("score label, spaces", "score", "Score:" + " " * 2 * MB + "x"),
    ("score label, newlines", "score", "Score:" + "\n" * 2 * MB + "x"),
    ("score label, stars and spaces", "score", "Score" + "*" * MB + " " * MB + "x"),
    ("score label, bold then spaces", "score", "Score: **" + " " * 2 * MB),
    ("score label, 'is' then spaces", "score", "score is" + " " * 2 * MB),
    ("score labels repeated", "score", "score: ** " * 200_000),
    ("score with out-of", "score", "score: 1 / " * 200_000),
    ("brackets, spaces inside", "brackets", "[[1" + " " * MB + "/" + " " * MB),
    ("brackets opened repeatedly", "brackets", "[[" * MB),
    ("brackets and digits", "brackets", "[[" + "1" * MB + "." + "1" * MB),
    ("brackets, verdict then trailer", "brackets", "[[1]]" + "*" * 2 * MB + "x"),
    ("boxed opened repeatedly", "boxed", "\\boxed{1/" * 250_000),
    ("boxed, spaces inside", "boxed", "\\boxed{1" + " " * 2 * MB),
    ("json starts", "json", '{"' * MB),
    ("json unterminated objects", "json", '{"a":1,' * 300_000),
    ("json nested arrays", "json", ('{"a":[' + "0," * 5000) * 200 + "X"),
    ("json nested objects", "json", '{"score":' * 250_000),
    ("json unterminated strings", "json", ('{"a": "' + "x" * 8000) * 256),
    ("json key text, spaces", "json", '"score"' + " " * MB + ":" + " " * MB + '"' + " " * MB),
    ("json key text repeated, then a verdict", "json", '"score": 1, ' * 200_000 + '{"score": 2}'),
    ("json verdict after nested arrays", "json", ('{"a":[' + "0," * 3000) * 300 + '{"score": 2}'),
    ("structured, long reasoning", "structured", '{"reasoning": "' + "x" * 2 * MB + '", "score": 3}'),
    ("structured, repeated keys", "structured", "{" + '"a":1,' * 300_000 + '"a":1}'),
    ("structured, nested", "structured", '{"reasoning": ' + "[" * MB),
    ("think opened repeatedly", "brackets", "<think>" * 300_000 + "[[1]]"),
    ("think closed repeatedly", "brackets", "</think>" * 250_000 + "[[1]]"),
    ("think, spaces first", "brackets", " " * 2 * MB + "<think>"),
]


@pytest.mark.parametrize(
    ("parser", "reply"), [(p, r) for _, p, r in HOSTILE_REPLIES], ids=[n for n, _, _ in HOSTILE_REPLIES]
)
def test_a_multi_megabyte_hostile_reply_is_read_in_linear_time(parser: str, reply: str) -> None:
    assert len(reply) >= MB
    for think in ("leading", "prefilled"):
        for position in ("end", "anywhere"):
            verdict, spent = timed_read(reply, VerdictRules(parser=parser, position=position, think=think))
            assert spent < BOUND_S, (parser, think, position, spent)
            assert verdict is None or math.isfinite(verdict)


def test_the_judges_verdict_is_still_read_after_a_capped_scan() -> None:
    """Not hollow: a judge's object after megabytes of JSON-looking text is found (tried first)."""
    reply = ('{"a":[' + "0," * 3000) * 300 + 'X\n{"reasoning": "fine", "score": 7}'
    assert read_verdict(reply, VerdictRules(parser="json")) == 7.0
    reply = '{"' * MB + '\n{"reasoning": "fine", "score": 7}'
    assert read_verdict(reply, VerdictRules(parser="json")) == 7.0


FRAGMENTS = (
    " ",
    "\n",
    "*",
    "**",
    "{",
    '{"',
    '{"a":',
    '{"score":',
    '"score": ',
    "[",
    "[[",
    "[[1",
    "]]",
    "1",
    "/",
    "\\boxed{",
    "}",
    "<think>",
    "</think>",
    "score:",
    "Score: **",
    "rating is ",
    '"',
    "\\",
    ".",
)


@settings(max_examples=25, deadline=None, database=None)
@given(
    parts=st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=4),
    parser=st.sampled_from(["brackets", "boxed", "score", "json", "structured"]),
    position=st.sampled_from(["end", "anywhere"]),
)
def test_property_repeated_fragments_are_read_in_linear_time(
    parts: list[str], parser: str, position: str
) -> None:
    """Any short run of verdict-like fragments, repeated to a megabyte, in any format."""
    unit = "".join(parts)
    reply = unit * (MB // len(unit) + 1)
    _, spent = timed_read(reply, VerdictRules(parser=parser, position=position))
    assert spent < BOUND_S, (unit, parser, position, spent)


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("\\boxed{" * 200_000, None),
        ("\\boxed{" * 100_000 + "}" * 100_000, ""),  # the innermost box opens last
        ("{" * MB + "\\boxed{5}", "5"),
        ("\\boxed{x}" + "}" * MB, "x"),
    ],
    ids=["unclosed boxes", "nested boxes", "open braces then a box", "a box then closing braces"],
)
def test_the_dev_server_finds_the_final_answer_in_linear_time(response: str, answer: str | None) -> None:
    """The dev server judges by the last ``\\boxed{}``; a rescan per box took 30 s for 5000 boxes."""
    start = time.thread_time()
    found = extract_final_answer(response)
    assert time.thread_time() - start < BOUND_S
    assert found == answer
