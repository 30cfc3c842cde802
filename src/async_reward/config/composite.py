"""The settings of ``async_composite`` (``reward.async_reward.composite``) and the checks of its gate
graph.

A composite reward is a list of components, each one of our managers with its own settings, a
weight, and at most one gate (``only_if``) on a component listed before it. The gate language is
deliberately tiny, and read from the config only, never from a sample: a gate names one component and
a closed range of its score (``score_at_least``, ``score_at_most``). Nothing is evaluated as code, and
a gate reads the number the gate component's own manager produced under its own verdict rules, so no
text in a response can open or close it except by changing that score the honest way.

Checked here, with the value rules of every section (``AsyncRewardConfig.validate``): names, managers,
weights, gates on unknown, later or own components, cycles, empty or inverted ranges, and the keys a
component may not set (``on_failure`` and the others that belong to the whole sample). What needs a
component's manager (its required settings, its user code, limits shared by two components that call
one service) is checked by ``managers.composite`` at start-up.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from async_reward._core.config_rules import bad_value, missing_value, rule, validate_fields
from async_reward._core.errors import ConfigError

__all__ = [
    "COMPONENT_MANAGERS",
    "COMPONENT_NAME",
    "FUNCTION_MANAGERS",
    "SAMPLE_KEYS",
    "SECTION_READERS",
    "ComponentConfig",
    "ComponentFunction",
    "CompositeConfig",
    "GateCondition",
]

#: A component's name: it becomes part of extras keys (``composite_<name>_score``), like a criterion's.
COMPONENT_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
#: The managers a component may be (``async_composite`` itself is not one: no nesting).
COMPONENT_MANAGERS = ("async_naive", "async_rate_limited", "async_remote", "llm_judge", "async_stateful")
#: The components that call a user's code (``reward.custom_reward_function``, or their ``function``).
FUNCTION_MANAGERS = ("async_naive", "async_rate_limited", "async_stateful")
#: ``reward.async_reward`` keys that belong to the whole sample, not to one component: a component's
#: ``async_reward`` may not set them (see ``docs/composite.md``, "Failures").
SAMPLE_KEYS = ("on_failure", "fallback_score", "num_workers", "composite")
#: Sections of ``reward.async_reward`` that one manager alone reads: a component of another manager
#: that sets one in its own ``async_reward`` would have it silently ignored.
SECTION_READERS = {"judge": "llm_judge", "remote": "async_remote", "stateful": "async_stateful"}

_ComponentManager = Literal[
    "async_naive", "async_rate_limited", "async_remote", "llm_judge", "async_stateful"
]


@dataclass(frozen=True)
class GateCondition:
    """``only_if``: the component runs for a sample only when this holds; otherwise it is ``skipped``
    (no call, recorded in the extras). Both bounds are inclusive; at least one must be set."""

    component: str = ""
    """Name of the gate component, listed before this one. The gate holds only when that component
    ran and is ``ok``: a gate component that failed or was skipped skips this one too."""
    score_at_least: float | None = None
    """The gate component's own score (before its weight) must be >= this. None: no lower bound."""
    score_at_most: float | None = None
    """The gate component's own score (before its weight) must be <= this. None: no upper bound."""

    def holds(self, score: float) -> bool:
        """Whether a score of the gate component opens the gate."""
        if self.score_at_least is not None and score < self.score_at_least:
            return False
        return self.score_at_most is None or score <= self.score_at_most

    def describe(self) -> str:
        """The range in words, for a skipped sample's reason (``rule scored 0, needs >= 1``)."""
        parts = []
        if self.score_at_least is not None:
            parts.append(f">= {self.score_at_least:g}")
        if self.score_at_most is not None:
            parts.append(f"<= {self.score_at_most:g}")
        return " and ".join(parts)


@dataclass(frozen=True)
class ComponentFunction:
    """A component's own reward function or class (its ``reward.custom_reward_function``)."""

    path: str = field(
        default="", metadata=rule(lambda v: bool(v.strip()), "is empty", "give the file's path")
    )
    """File (or ``pkg://`` module) defining it."""
    name: str = "compute_score"
    """The function's (``async_naive``, ``async_rate_limited``) or class's (``async_stateful``) name."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of every call, as verl's ``custom_reward_function.reward_kwargs``."""


@dataclass(frozen=True)
class ComponentConfig:
    """One source of the composite reward."""

    name: str = field(
        default="",
        metadata=rule(
            lambda v: bool(COMPONENT_NAME.fullmatch(v)),
            "is not a component name",
            "write a lower-case identifier of at most 40 characters (a-z, 0-9, _), e.g. rule or judge",
        ),
    )
    """Identifier: gates name it, and its extras are ``composite_<name>_*`` (so no name may be another
    one followed by ``_``: their extras keys could be the same)."""
    manager: _ComponentManager = "async_naive"
    """Which of our managers scores it: ``async_naive`` / ``async_rate_limited`` (a function: the job's
    ``custom_reward_function``, its own ``function``, or verl's default scorer for the data source),
    ``async_remote``, ``llm_judge`` or ``async_stateful``."""
    weight: float = 1.0
    """Its score's weight in the sample's reward (a weighted sum; any finite number, 0 to record a
    component without counting it)."""
    only_if: GateCondition | None = None
    """The gate: run only when a component listed before it scored in a range. None: always runs."""
    score_if_skipped: float = 0.0
    """What a component its gate skipped adds to the sum, before its weight. The component is still
    recorded as ``skipped``: the value is explicit, never a silent 0. Only with ``only_if``."""
    score_range: tuple[float, float] | None = field(
        default=None,
        metadata=rule(
            lambda v: v[0] <= v[1], "is not [low, high] with low <= high", "write [low, high], e.g. [0, 1]"
        ),
    )
    """The range ``[low, high]`` of a non-judge component's own scores (a judge's is its judge
    settings'): a score outside it makes the component ``invalid``. It lets the start-up check
    bound the composite's lowest reward under ``on_failure: fallback``. None: unknown."""
    function: ComponentFunction | None = None
    """Its own function (or class, for ``async_stateful``). None: the job's
    ``reward.custom_reward_function``, or verl's default scorer where there is none."""
    async_reward: dict[str, Any] = field(default_factory=dict)
    """Its own settings: any ``reward.async_reward`` key but those of the whole sample
    (``on_failure``, ``fallback_score``, ``num_workers``), merged over the ones set at
    ``reward.async_reward`` (its ``timeout_s``, ``limits``, ``retry``, ``judge``, ``remote``, ...)."""


@dataclass
class CompositeConfig:
    """``reward.async_reward.composite``: the components of ``async_composite`` (refused with any
    other manager, which would ignore it)."""

    components: tuple[ComponentConfig, ...] = ()
    """The components, in order: a gate names a component listed before it, so this order is one in
    which every gate is decided before the component it opens; components without a gate between
    them run at once."""

    def validate(self, path: str = "reward.async_reward.composite") -> None:
        """Check every component and the gate graph (names, gates, cycles, the sample's own keys)."""
        seen: dict[str, int] = {}
        for index, component in enumerate(self.components):
            key = f"{path}.components[{index}]"
            validate_fields(component, key)
            if component.name in seen:
                raise bad_value(
                    f"{key}.name",
                    component.name,
                    f"repeats the name of components[{seen[component.name]}]",
                    "give each component its own name (it names its extras and its gates)",
                )
            seen[component.name] = index
            self._check_own_settings(component, key)
        self._check_name_prefixes(path)
        for index, component in enumerate(self.components):
            if component.only_if is not None:
                self._check_gate(index, component.only_if, seen, f"{path}.components[{index}].only_if")

    def require(self, path: str = "reward.async_reward.composite") -> None:
        """What ``async_composite`` cannot run without: at least one component."""
        if not self.components:
            raise missing_value(
                f"{path}.components",
                "the async_composite manager",
                "list the components, e.g. [{name: rule, manager: async_naive}, {name: judge, manager: "
                "llm_judge, only_if: {component: rule, score_at_least: 1}}]",
            )

    def gate_chain(self, name: str) -> list[str]:
        """``name`` and the components its gate depends on, nearest first (for error messages)."""
        by_name = {c.name: c for c in self.components}
        chain = [name]
        while (gate := by_name[chain[-1]].only_if) is not None and gate.component in by_name:
            chain.append(gate.component)
            if gate.component == name or len(chain) > len(by_name):
                break
        return chain

    @staticmethod
    def _check_own_settings(component: ComponentConfig, key: str) -> None:
        for sample_key in SAMPLE_KEYS:
            if sample_key in component.async_reward:
                value = component.async_reward[sample_key]
                raise bad_value(
                    f"{key}.async_reward.{sample_key}",
                    value,
                    "is a setting of the whole sample, not of one component (a failed component fails "
                    "its sample, which on_failure then handles)",
                    f"set reward.async_reward.{sample_key} instead",
                    # a nested composite is a section: its components' settings may hold a header
                    hide=isinstance(value, (Mapping, list, tuple)),
                )
        if component.function is not None and component.manager not in FUNCTION_MANAGERS:
            raise bad_value(
                f"{key}.function",
                {"path": component.function.path, "name": component.function.name},
                f"names a function, and {component.manager} calls none",
                f"remove it, or make the component one of {list(FUNCTION_MANAGERS)}",
            )
        CompositeConfig._check_unused_settings(component, key)

    @staticmethod
    def _check_unused_settings(component: ComponentConfig, key: str) -> None:
        """Refuse what a component sets and nothing would read: every value a user sets must act."""
        if component.only_if is None and component.score_if_skipped != 0:
            raise bad_value(
                f"{key}.score_if_skipped",
                component.score_if_skipped,
                "is what a component its gate skipped adds, and this one has no gate (only_if): it always "
                "runs, so the value would never be used",
                "remove it, or give the component an only_if gate",
            )
        for section, reader in SECTION_READERS.items():
            if section in component.async_reward and component.manager != reader:
                raise bad_value(
                    f"{key}.async_reward.{section}",
                    component.async_reward[section],
                    f"is read by {reader} only, and this component is {component.manager}: it would be "
                    "ignored",
                    f"remove it, or make the component manager: {reader}",
                    # a section is never echoed: remote.headers (or a judge's extra_body) may hold a key
                    hide=True,
                )
        if component.score_range is not None and component.manager == "llm_judge":
            raise bad_value(
                f"{key}.score_range",
                list(component.score_range),
                "is the range of a non-judge component; a judge's range is its judge settings' "
                "(judge.normalize_to, or judge.min_score and judge.max_score)",
                "remove it (set judge.normalize_to to change the judge's range)",
            )

    def _check_name_prefixes(self, path: str) -> None:
        """Refuse a name that is another one followed by ``_``: component ``rule``'s extra
        ``format_score`` would be written as ``composite_rule_format_score``, component
        ``rule_format``'s own score key. (Names that are not so prefixed cannot make equal keys.)"""
        names = [c.name for c in self.components]
        for index, name in enumerate(names):
            for other, shorter in enumerate(names):
                if other != index and name.startswith(shorter + "_"):
                    raise bad_value(
                        f"{path}.components[{index}].name",
                        name,
                        f"begins with the name of components[{other}] ({shorter!r}) and '_': an extra "
                        f"of {shorter!r} could be written at {name!r}'s own keys (composite_{name}_*)",
                        f"rename one of them so that {name!r} does not begin with {shorter + '_'!r}",
                    )

    def _check_gate(self, index: int, gate: GateCondition, seen: dict[str, int], key: str) -> None:
        name = self.components[index].name
        if gate.component not in seen:
            raise bad_value(
                f"{key}.component",
                gate.component,
                "names no component",
                f"name one of the components listed before {name!r}: {list(seen)[:index] or 'none'}",
            )
        chain = self.gate_chain(gate.component)
        if name in chain:
            cycle = [name, *chain[: chain.index(name) + 1]]
            raise bad_value(
                f"{key}.component",
                gate.component,
                f"makes a cycle of gates ({' -> '.join(cycle)}): no component in it could ever run first",
                "gate a component only on components listed before it, down to one without only_if",
            )
        if seen[gate.component] > index:
            raise bad_value(
                f"{key}.component",
                gate.component,
                f"is listed after {name!r} (components[{seen[gate.component]}]): a gate is decided by a "
                "component computed before the one it opens",
                f"list {gate.component!r} before {name!r}",
            )
        if gate.score_at_least is None and gate.score_at_most is None:
            raise ConfigError(
                f"{key} has no bound: it would only repeat that {gate.component!r} succeeded; write "
                "score_at_least and/or score_at_most (inclusive), e.g. {component: "
                f"{gate.component}, score_at_least: 1}}",
                key=f"{key}.score_at_least",
                fix="write score_at_least and/or score_at_most",
            )
        if (
            gate.score_at_least is not None
            and gate.score_at_most is not None
            and gate.score_at_least > gate.score_at_most
        ):
            raise bad_value(
                f"{key}.score_at_most",
                gate.score_at_most,
                f"is below score_at_least ({gate.score_at_least:g}): no score could open the gate",
                "write score_at_least <= score_at_most",
            )
