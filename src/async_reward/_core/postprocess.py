"""Group post-processing of scores: a stateful class's ``post_process_scores`` once per complete group.

The recipe's ``RewardAgent.post_process_scores(scores)`` receives one GRPO group's scores with failed
ones as NaN (e.g. to impute them with the group mean). verl assembles scores on the driver, where no
manager instance exists, so each score carries (as a :class:`ScoredFloat`) whether it failed and
which class post-processes it; the class is loaded and instantiated once per process here.
"""

from __future__ import annotations

import ast
import functools
import logging
import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from async_reward._core.result import ScoredFloat, _shown, as_score

logger = logging.getLogger(__name__)

__all__ = [
    "apply_group_postprocessing",
    "load_user_instance",
    "make_postprocess_spec",
    "passes_as_literal",
    "postprocess_group",
]


def make_postprocess_spec(path: str, name: str, init_kwargs: dict[str, Any]) -> tuple[str, str, str]:
    """A reference to a user class: (file path, class name, init kwargs as :func:`_kwargs_literal`).

    Plain text, because it travels with every score (a :class:`ScoredFloat`, through Ray) to where
    groups are assembled, verl's driver included, where no manager exists: it must pickle, hash (it
    keys the per-process instance and the grouping of scores) and be equal for equal settings in
    every worker. A Python literal, not JSON, so that the constructor gets the values as configured:
    JSON turned int keys into strings (``{1: 0.5}`` became ``{'1': 0.5}``) and other values into
    their ``str``."""
    return (path, name, _kwargs_literal(init_kwargs))


def _kwargs_literal(init_kwargs: dict[str, Any]) -> str:
    """``init_kwargs`` as the text of a Python literal, top-level keys sorted (the same text for the
    same settings in every process), read back by ``ast.literal_eval``."""
    return repr(dict(sorted(init_kwargs.items())))


def passes_as_literal(value: Any) -> bool:
    """Whether ``value`` reads back equal from its ``repr`` (numbers, text, booleans, None, bytes,
    and lists, tuples and mappings of them): what :func:`make_postprocess_spec` can carry."""
    try:
        return bool(ast.literal_eval(repr(value)) == value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


@functools.lru_cache(maxsize=16)
def load_user_instance(spec: tuple[str, str, str]) -> Any:
    """Load and instantiate the user class named by ``spec``, once per process.

    Raises:
        ConfigError: the constructor raised, named as ``reward.async_reward.stateful.init_kwargs``
            (:func:`~async_reward._core.user_class.construct`): this runs in every reward worker and
            on verl's driver, where a bare ``TypeError`` named no setting.
    """
    from async_reward._core.user_class import INIT_KWARGS_KEY, construct
    from async_reward._core.user_code import load_user_object

    path, name, literal = spec
    cls = load_user_object(path, name)
    if not isinstance(cls, type):
        raise TypeError(
            f"custom_reward_function.name={name!r} in {path} must name a class for async_stateful"
        )
    return construct(cls, name, path, ast.literal_eval(literal), INIT_KWARGS_KEY)


def postprocess_group(instance: Any, scores: Sequence[float], failed: Sequence[bool]) -> list[Any]:
    """Run ``instance.post_process_scores`` on one group; failed scores are passed as NaN. Returns
    what it returned, one value per score, unchecked (see :func:`apply_group_postprocessing`).

    Raises:
        ValueError: the user function returned a different number of scores.
    """
    values = [
        math.nan if is_failed else float(score) for score, is_failed in zip(scores, failed, strict=True)
    ]
    processed = list(instance.post_process_scores(values))
    if len(processed) != len(values):
        raise ValueError(f"post_process_scores returned {len(processed)} scores for a group of {len(values)}")
    return processed


def apply_group_postprocessing(uids: Sequence[Any] | None, scores: Sequence[float]) -> list[float]:
    """Post-process every complete group of a batch and return plain floats.

    Only scores that are :class:`ScoredFloat` with a post-process spec are touched; without ``uids``
    each sample is its own group. A returned value is read by the rule of a user function's score
    (:func:`~async_reward._core.result.as_score`: a real number, bool included, finite): a value
    still NaN (e.g. a group where every sample failed) keeps the sample's own score, and so does
    one that is no score at all (text such as ``"0.9"``, None), which is logged.
    """
    result = [float(s) for s in scores]
    groups: OrderedDict[Any, list[int]] = OrderedDict()
    for position, score in enumerate(scores):
        if isinstance(score, ScoredFloat) and score.postprocess_spec is not None:
            key = (score.postprocess_spec, uids[position] if uids is not None else ("__single__", position))
            groups.setdefault(key, []).append(position)
    for (spec, _uid), positions in groups.items():
        instance = load_user_instance(spec)
        if not hasattr(instance, "post_process_scores"):
            continue
        group_scores = [scores[p] for p in positions]
        failed = [bool(getattr(s, "failed", False)) for s in group_scores]
        try:
            processed = postprocess_group(instance, group_scores, failed)
        except Exception as exc:  # a user bug must not stop the training step: keep the scores as they are
            logger.warning(
                "post_process_scores failed for a group of %d (%r); scores kept", len(positions), exc
            )
            continue
        for position, value in zip(positions, processed, strict=True):
            usable = as_score(value)
            result[position] = float(scores[position]) if usable is None else usable
        _log_unusable(processed)
    return result


def _log_unusable(processed: Sequence[Any]) -> None:
    """Warn of returned values that are no score (NaN, where nothing could be imputed, is expected)."""
    unusable = [v for v in processed if as_score(v) is None and not (isinstance(v, float) and math.isnan(v))]
    if unusable:
        logger.warning(
            "post_process_scores returned %d unusable score(s) for a group of %d (e.g. %s): those "
            "samples keep their own scores; return real numbers",
            len(unusable),
            len(processed),
            _shown(unusable[0]),
        )
