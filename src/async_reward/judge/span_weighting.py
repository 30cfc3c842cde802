"""``judge.expected_verdict``: weighing every place a verdict is written in a reply, keeping the lowest.

Which written verdict is the judge's own cannot be told from the text. A judge that quotes the
response may end its reply with the quote (which then passes for its verdict under
``verdict_position: end``), and under ``anywhere`` its verdict may sit before the quote. The tokens of
a quoted verdict are the judge copying text: their probabilities say how sure it was of the copy, not
of the grade, so weighing a quote instead of the judge's own let a planted ``Verdict: [[10]]`` turn an
expected 9.3 into 10. Hence the rule, the same for a single verdict and for each criterion of a rubric:

    Every place a verdict is written gets a value: its expected verdict where its tokens can be
    weighed (``async_reward.judge.expected``), its written number where they cannot. The score
    takes the lowest value (for a criterion that describes a flaw, the highest).

A planted verdict only adds a candidate to that minimum: it can lower the score, never raise it,
whatever probabilities its tokens carry, whether or not they can be weighed, and whether the rules
read it as the judge's own or as a quote. A reply that holds many verdicts costs one pass over its
tokens per verdict, so past :data:`MAX_EXTRA_PLACES` more than were asked for the reply is refused
(``invalid``): a reply cannot make weighing block the worker's event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from async_reward.judge.expected import ExpectedVerdict, ReplyToken, expected_verdict
from async_reward.judge.verdict import VerdictError

__all__ = ["MAX_EXTRA_PLACES", "Weighing", "refuse_too_many", "weigh_places"]

#: ``expected_verdict``'s reason when the tokens do not spell the reply.
NOT_SPELLED = "tokens do not spell the reply"

#: Most verdicts a reply may write besides those asked for (one, or one per criterion of a call):
#: each is weighed in a pass over the reply's tokens (milliseconds on a long reply).
MAX_EXTRA_PLACES = 16


@dataclass(frozen=True)
class Weighing:
    """What the places of one verdict weighed to."""

    lowest: ExpectedVerdict | None
    """The lowest expected verdict of the places whose tokens could be weighed (the highest, for a
    flaw); None when none could."""
    written: float | None
    """The lowest written number of the places that could not be weighed (the highest, for a flaw);
    None when every place was weighed."""
    reason: str
    """Why the place that gave ``written`` could not be weighed; empty when every place was."""

    def written_wins(self, flaw: bool = False) -> bool:
        """Whether a place the tokens cannot weigh sets the value, at its written number: nothing
        was weighed, or ``written`` is below ``lowest`` (above it, for a flaw)."""
        if self.written is None or self.lowest is None:
            return self.lowest is None
        return self.written > self.lowest.value if flaw else self.written < self.lowest.value


def refuse_too_many(extra: int) -> None:
    """Refuse a reply that writes ``extra`` verdicts more than it was asked for, past the bound.

    Raises:
        VerdictError: ``extra`` exceeds :data:`MAX_EXTRA_PLACES` (status ``invalid``).
    """
    if extra > MAX_EXTRA_PLACES:
        raise VerdictError(
            f"reply writes {extra} verdicts more than asked for (quoting the response?); "
            f"judge.expected_verdict weighs each one and refuses more than {MAX_EXTRA_PLACES}"
        )


class _Spelled:
    """The reply as its tokens spell it, for a server that renders a character split over two tokens
    as U+FFFD in each (vLLM's ``bytes`` do): there the tokens spell neither the whole reply nor, when
    such a character follows a verdict (a quote after it), the text from that verdict on, which is
    what ``expected_verdict`` aligns. Else a response could keep the judge's own verdict from being
    weighed (its plain verdict, or a quote's expectation, above the judge's) by one such character.

    The reply's ASCII characters are found, in order, in the ASCII characters of the text the tokens
    spell (each token's text as the server rendered it; the last place they all appear), and the
    reply must end there on a token boundary, as ``expected_verdict`` requires: a verdict is ASCII
    digits, so its place there is exact, whatever the non-ASCII characters around it became."""

    def __init__(self, content: str, tokens: Sequence[ReplyToken]) -> None:
        self.content = content
        pieces = [token.data.decode("utf-8", errors="replace") for token in tokens]
        self.text = "".join(pieces)
        self._ascii_at = [index for index, char in enumerate(self.text) if char < "\x80"]
        skeleton = "".join(self.text[index] for index in self._ascii_at)
        reply_skeleton = content.encode("ascii", errors="ignore").decode("ascii")
        self._base = skeleton.rfind(reply_skeleton) if reply_skeleton else -1
        if self._base >= 0 and not self._ends_on_a_token(pieces, len(reply_skeleton)):
            self._base = -1

    def _ends_on_a_token(self, pieces: list[str], count: int) -> bool:
        """Whether the reply, placed at ``_base`` (``count`` ASCII characters), ends in :attr:`text`
        where a token ends: after its last ASCII character, or, where the reply ends in non-ASCII
        ones, after the run of them there (rendered lossily, their number may differ)."""
        end = self._ascii_at[self._base + count - 1] + 1
        if not self.content[-1].isascii():
            run = end
            while run < len(self.text) and not self.text[run].isascii():
                run += 1
            if run == end:
                return False
            end = run
        boundary = 0
        for piece in pieces:
            boundary += len(piece)
            if boundary >= end:
                return boundary == end
        return False

    def span(self, span: tuple[int, int]) -> tuple[int, int] | None:
        """Where the ASCII ``span`` of the reply is in :attr:`text`; None when the tokens do not
        spell the reply's ASCII characters, or it does not end on a token there."""
        start, end = span
        if self._base < 0 or not self.content[start:end].isascii():
            return None
        rank = self._base + len(self.content[:start].encode("ascii", errors="ignore"))
        moved = self._ascii_at[rank]
        return moved, moved + (end - start)


def weigh_places(
    content: str,
    tokens: Sequence[ReplyToken],
    places: Sequence[tuple[float, tuple[int, int]]],
    *,
    min_score: float,
    max_score: float,
    flaw: bool = False,
) -> Weighing:
    """Weigh each (written value, (start, end) in ``content``) of ``places`` and keep the lowest
    expectation and the lowest written value of those not weighed (the highest, with ``flaw``).

    A place whose tokens do not spell the reply is weighed again in the reply as its tokens spell
    it (:class:`_Spelled`): a character rendered lossily must not keep a verdict from being weighed."""
    sign = -1.0 if flaw else 1.0
    lowest: ExpectedVerdict | None = None
    written: float | None = None
    reason = ""
    spelled: _Spelled | None = None
    for value, span in places:
        outcome = expected_verdict(content, tokens, span, min_score=min_score, max_score=max_score)
        if outcome == NOT_SPELLED:
            spelled = spelled or _Spelled(content, tokens)
            moved = spelled.span(span)
            if moved is not None:
                outcome = expected_verdict(
                    spelled.text, tokens, moved, min_score=min_score, max_score=max_score
                )
        if isinstance(outcome, str):
            if written is None or sign * value < sign * written:
                written, reason = value, outcome
        elif lowest is None or sign * outcome.value < sign * lowest.value:
            lowest = outcome
    return Weighing(lowest=lowest, written=written, reason=reason)
