"""Every setting is validated at start-up, and the error names the key, the bad value and the fix.

The table below has rows for every field of every training config dataclass (``reward.async_reward.*``
and ``async_reward.pipeline.*``), found by introspection: a field added later without rows fails
``test_every_field_has_rows``. Each bad value goes through the path a user's config takes
(``load_config`` on a real verl config, ``load_pipeline_config``); each good value must be accepted,
so the checks are not simply strict. Then the places that must refuse before any worker starts:
``prepare_verl_config``, the CLI, and verl's own path (the manager's constructor in a Ray worker, and
verl's ``RewardLoopManager`` built in a Ray actor with our hook); the legacy trainer's entry point and
``PipelinedRewardLoopManager``: tests/legacy/test_config_validation.py.
"""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf, open_dict

from async_reward import ConfigError, prepare_verl_config
from async_reward.config import AsyncRewardConfig, load_config
from async_reward.config.checks import check_reward
from async_reward.training.config import PipelineConfig, load_pipeline_config
from tests.conftest import compose_verl_config

NAN, INF = math.nan, math.inf

#: (dotted key under its root, bad value, words the problem must contain, other settings needed).
BAD: list[tuple[str, Any, str, dict[str, Any]]] = [
    ("timeout_s", NAN, "finite", {}),
    ("timeout_s", INF, "finite", {}),
    ("timeout_s", 0, "> 0", {}),
    ("timeout_s", "soon", "not a number", {}),
    ("admission_timeout_s", -5, "> 0", {}),
    ("admission_timeout_s", NAN, "finite", {}),
    ("fallback_score", NAN, "finite", {}),
    ("fallback_score", -INF, "finite", {}),
    ("on_failure", "ignore", "not allowed", {}),
    ("executor", "gpu", "not allowed", {}),
    ("executor_workers", 0, ">= 1", {}),
    ("executor_workers", 1.5, "not an integer", {}),
    ("extra_defaults", {"status": "x"}, "library sets", {}),
    ("extra_defaults", {"acc": [1, 2]}, "not a scalar", {}),
    ("extra_defaults", {"acc": INF}, "finite", {}),
    ("extra_defaults", {"uid": ""}, "field of verl's batch", {}),
    ("extra_defaults", {"acc": 2**64}, "64-bit integer", {}),
    ("extra_defaults", {"note": "x" * 5000}, "longer than", {}),
    ("extra_defaults", {"data_source": ""}, "field of verl's batch", {}),
    ("num_workers", -2, ">= 1", {}),
    ("limits.max_concurrency", 0, ">= 1", {}),
    ("limits.admission", "cluster", "not an admission scope", {}),
    ("limits.admission", None, "not a string", {}),
    ("limits.requests_per_minute", 0, "> 0", {}),
    ("limits.requests_per_minute", NAN, "finite", {}),
    ("limits.requests_per_minute", 3, "less than one request", {"reward.num_workers": 4}),
    ("limits.tokens_per_minute", -1, "> 0", {}),
    ("limits.tokens_per_minute", 3, "less than one token", {"reward.num_workers": 4}),
    ("limits.estimated_tokens_per_request", -1, ">= 0", {}),
    (
        "limits.estimated_tokens_per_request",
        600,
        "could ever be admitted",
        {"limits.tokens_per_minute": 1000, "reward.num_workers": 2},
    ),
    ("retry.max_attempts", 0, ">= 1", {}),
    ("retry.initial_backoff_s", -1, ">= 0", {}),
    ("retry.max_backoff_s", NAN, "finite", {}),
    ("retry.max_backoff_s", 0.1, "below initial_backoff_s", {"retry.initial_backoff_s": 2}),
    ("retry.jitter_s", -0.5, ">= 0", {}),
    ("retry.max_retry_after_s", INF, "finite", {}),
    ("retry.max_total_s", 0, "> 0", {}),
    ("judge.base_url", "judge:8000/v1", "http(s) URL", {}),
    ("judge.base_url", "http://", "http(s) URL", {}),
    ("judge.base_url", "http://  bad url", "http(s) URL", {}),
    ("judge.base_url", "http://judge:port/v1", "http(s) URL", {}),
    ("judge.api_key_env", "sk-live abc", "environment variable name", {}),
    ("judge.api_key_env", 12345, "not a string", {}),
    ("judge.model", " ", "empty", {}),
    ("judge.template", "Rate {prompt}", "template", {}),
    ("judge.template", "{response} {reference}", "template", {}),
    ("judge.system_prompt", 7, "not a string", {}),
    ("judge.parser", "regex", "not allowed", {}),
    ("judge.parser", "boxed", "does not fit the template", {"judge.template": "Grade {response}: [[n]]"}),
    ("judge.verdict_position", "last", "not allowed", {}),
    ("judge.on_conflict", "max", "not allowed", {}),
    ("judge.think", "trailing", "not allowed", {}),
    ("judge.min_score", NAN, "finite", {}),
    ("judge.max_score", 0, "must exceed min_score", {}),
    ("judge.normalize_to", [1, 0], "strictly increasing", {}),
    ("judge.normalize_to", [0.5, 0.5], "strictly increasing", {}),
    ("judge.normalize_to", [0, NAN], "finite", {}),
    ("judge.normalize_to", [1], "list of 2", {}),
    # Finite numbers whose spans overflow: every verdict normalised to 0.0, marked ok.
    ("judge.max_score", 1e308, "overflows floating point", {"judge.min_score": -1e308}),
    ("judge.normalize_to", [-1e308, 1e308], "overflows floating point", {}),
    ("judge.normalize_to", [0, 1e308], "overflows floating point", {}),
    # Finite spans whose rewards verl's float32 training cannot hold (a group's advantage NaN).
    ("judge.normalize_to", [0, 1e20], "past 1e+15 in magnitude", {}),
    ("judge.max_score", 1e16, "past 1e+15 in magnitude", {"judge.normalize_to": None}),
    ("judge.temperature", -0.1, "[0, 2]", {}),
    ("judge.temperature", NAN, "finite", {}),
    ("judge.max_tokens", -5, ">= 1", {}),
    ("judge.extra_body", {"temperature": 1.0}, "override", {}),
    ("judge.extra_body", {"messages": []}, "override", {}),
    # OpenAI's newer name for max_tokens (vLLM reads it first): it would replace judge.max_tokens.
    ("judge.extra_body", {"max_completion_tokens": 8}, "override", {}),
    ("judge.extra_body", {"top_p": NAN}, "finite", {}),
    ("judge.extra_body", {"logit_bias": {"42": INF}}, "finite", {}),
    (
        "judge.extra_body",
        {"response_format": {"type": "json_object"}},
        "structured",
        {"judge.parser": "structured"},
    ),
    # A structured reply is one JSON object: no position, no second verdict (never read with it).
    (
        "judge.verdict_position",
        "anywhere",
        "does not apply with judge.parser=structured",
        {"judge.parser": "structured"},
    ),
    (
        "judge.on_conflict",
        "min",
        "does not apply with judge.parser=structured",
        {"judge.parser": "structured"},
    ),
    ("judge.cache", "yes", "boolean", {}),
    ("judge.expected_verdict", "yes", "boolean", {}),
    ("judge.criteria", [{"name": "Bad Name", "description": "d"}], "criterion name", {}),
    ("judge.criteria", {"name": "a"}, "is not a list", {}),
    ("judge.criteria_per_call", 2, "without judge.criteria", {}),
    ("judge.mode", "groups", "is not allowed", {}),
    ("judge.group_wait_s", 5.0, "without judge.mode=group", {}),
    ("judge.group_wait_s", 0.0, "must be in", {"judge.mode": "group"}),
    ("judge.group_shuffle", False, "without judge.mode=group", {}),
    ("judge.group_shuffle", None, "not a boolean", {"judge.mode": "group"}),
    ("judge.criteria_per_call", 0, ">= 1", {"judge.criteria": [{"name": "a", "description": "d"}]}),
    ("judge.expected_verdict", True, "whole-number verdicts", {"judge.max_score": 9.5}),
    ("judge.extra_body", {"logprobs": True}, "override request fields", {"judge.expected_verdict": True}),
    ("judge.prompt_price_per_million", -1.0, ">= 0", {"judge.completion_price_per_million": 1.0}),
    ("judge.prompt_price_per_million", 3.0, "without reward.async_reward.judge.completion_price", {}),
    ("judge.completion_price_per_million", NAN, "finite", {"judge.prompt_price_per_million": 1.0}),
    ("judge.completion_price_per_million", 15.0, "the other kind of token would cost nothing", {}),
    ("remote.url", "ftp://host/score", "http(s) URL", {}),
    ("remote.url", "https://", "http(s) URL", {}),
    ("remote.api_key_env", "Bearer x", "environment variable name", {}),
    ("remote.api_key_env", ["Bearer x"], "not a string", {}),
    ("remote.headers", {"X-Token": 5}, "not a string", {}),
    ("remote.headers", "token", "mapping", {}),
    ("stateful.init_kwargs", [1, 2], "mapping", {}),
    ("stateful.init_kwargs", {"threshold": -INF}, "finite", {}),
    ("stateful.init_kwargs", {"root": Path("/data")}, "cannot be passed to your class as configured", {}),
    ("composite.components", {"name": "rule"}, "not a list", {}),
    ("composite.components", [{"name": "rule", "weight": "high"}], "not a number", {}),
    ("composite.components", [{"name": "rule", "weight": NAN}], "finite", {}),
    (
        "composite.components",
        [{"name": "j", "only_if": {"component": "rule", "score_at_least": 1}}],
        "names no",
        {},
    ),
    ("composite.components", [{"name": "rule"}, {"name": "rule"}], "repeats the name", {}),
    ("pipeline.mini_batch", "yes", "boolean", {}),
    ("pipeline.one_step_off_policy", 1, "boolean", {}),
    ("pipeline.chunk_timeout_s", NAN, "finite", {}),
    ("pipeline.chunk_timeout_s", 0, "> 0", {}),
    ("pipeline.assume_group_local", "true", "boolean", {}),
    ("pipeline.allow_ppo_epochs_per_chunk", "no", "boolean", {}),
    ("pipeline.dry_run", "yes", "boolean", {}),
]

#: (dotted key, a valid value other than the default).
GOOD: list[tuple[str, Any]] = [
    ("timeout_s", 0.5),
    ("admission_timeout_s", 30),
    ("fallback_score", -1),
    ("on_failure", "raise"),
    ("executor", "process"),
    ("executor_workers", 2),
    ("extra_defaults", {"acc": NAN, "tag": "", "ok": False, "note": None}),
    ("num_workers", 3),
    ("limits.max_concurrency", 1),
    ("limits.admission", "job"),
    ("limits.admission", "worker"),
    ("limits.requests_per_minute", 600),
    ("limits.tokens_per_minute", 100000),
    ("limits.estimated_tokens_per_request", 0),
    ("retry.max_attempts", 1),
    ("retry.initial_backoff_s", 0),
    ("retry.max_backoff_s", 60),
    ("retry.jitter_s", 0),
    ("retry.max_retry_after_s", 0),
    ("retry.max_total_s", 1),
    ("judge.base_url", "https://api.example.com/v1"),
    ("judge.api_key_env", "JUDGE_API_KEY"),
    ("judge.model", "gpt-x"),
    ("judge.template", "Grade {response} against {ground_truth}. End with: Score: n"),
    ("judge.system_prompt", "You grade."),
    ("judge.parser", "brackets"),
    ("judge.parser", "structured"),
    ("judge.verdict_position", "anywhere"),
    ("judge.on_conflict", "min"),
    ("judge.think", "none"),
    ("judge.min_score", -5),
    ("judge.max_score", 100),
    ("judge.normalize_to", [-1, 1]),
    ("judge.normalize_to", None),
    ("judge.temperature", 2),
    ("judge.max_tokens", 1),
    ("judge.extra_body", {"top_p": 0.9}),
    ("judge.extra_body", {"logit_bias": {"42": -100}}),
    ("judge.cache", True),
    ("judge.mode", "group"),
    ("judge.expected_verdict", True),
    ("judge.criteria", [{"name": "a", "description": "d", "weight": 2.5, "polarity": "negative"}]),
    ("remote.url", "http://127.0.0.1:9000/score"),
    ("remote.url", "https://[::1]:8443/score"),
    ("remote.api_key_env", "RM_TOKEN"),
    ("remote.headers", {"X-Team": "rl"}),
    ("stateful.init_kwargs", {"k": 3}),
    ("stateful.init_kwargs", {"table": {1: 0.5, 2: [0.25, None, "x", True]}}),  # int keys kept
    (
        "composite.components",
        [
            {"name": "rule", "manager": "async_naive"},
            {
                "name": "judge",
                "manager": "llm_judge",
                "weight": 0.5,
                "only_if": {"component": "rule", "score_at_least": 1},
            },
        ],
    ),
    ("pipeline.mini_batch", True),
    ("pipeline.one_step_off_policy", True),
    ("pipeline.chunk_timeout_s", 600),
    ("pipeline.assume_group_local", True),
    ("pipeline.allow_ppo_epochs_per_chunk", True),
    ("pipeline.dry_run", True),
]
#: Good values that are good only beside another key: (key, value, the others).
GOOD_WITH_OTHERS = [
    ("judge.prompt_price_per_million", 3.0, {"judge.completion_price_per_million": 15.0}),
    ("judge.extra_body", {"logprobs": True}, {"judge.expected_verdict": False}),  # then it is yours
    ("judge.expected_verdict", True, {"judge.min_score": 1, "judge.max_score": 5}),
    ("judge.criteria_per_call", 1, {"judge.criteria": [{"name": "a", "description": "d"}]}),
    ("judge.group_wait_s", 0.5, {"judge.mode": "group"}),
    ("judge.group_shuffle", False, {"judge.mode": "group"}),
    ("judge.prompt_price_per_million", 0.0, {"judge.completion_price_per_million": 0.0}),
    ("judge.completion_price_per_million", 15.0, {"judge.prompt_price_per_million": 3.0}),
]


#: Deprecated keys: derived now, still honoured for one release with a DeprecationWarning that names
#: the key, says what replaced it and the fix (their good rows above must warn so).
DEPRECATED = {
    "num_workers": "the reward workers sharing the RPM/TPM budgets are reward.num_workers",
}


def leaf_fields(cls: type, prefix: str = "") -> list[str]:
    """Dotted names of every non-dataclass field of ``cls``, nested dataclasses expanded."""
    names = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            names += leaf_fields(hint, f"{prefix}{f.name}.")
        else:
            names.append(f"{prefix}{f.name}")
    return names


ALL_FIELDS = leaf_fields(AsyncRewardConfig) + leaf_fields(PipelineConfig, "pipeline.")


def test_every_field_has_rows():
    """A field added to a config dataclass without a bad and a good row here fails this test."""
    assert ALL_FIELDS, "introspection found no fields"
    assert sorted(set(ALL_FIELDS) - {key for key, *_ in BAD}) == []
    good = {key for key, _ in GOOD} | {key for key, *_ in GOOD_WITH_OTHERS}
    assert sorted(set(ALL_FIELDS) - good) == []
    assert {key for key, *_ in BAD} | good <= set(ALL_FIELDS)  # no stale rows


#: Keys that were never released and are derived instead: (key, value, the others). Refused as unknown.
DERIVED_NOT_KEYS = [
    ("judge.top_logprobs", 11, {"judge.expected_verdict": True}),  # from the verdict scale
    ("judge.group_seed", 1, {"judge.mode": "group"}),  # the group's uid seeds the shuffle
]


@pytest.mark.parametrize(("key", "value", "others"), DERIVED_NOT_KEYS, ids=[k for k, *_ in DERIVED_NOT_KEYS])
def test_a_derived_setting_is_not_a_key(verl_config_factory, key, value, others):
    with pytest.raises(ConfigError) as refused:
        load(verl_config_factory, key, value, others)
    assert refused.value.key == f"reward.async_reward.{key}"
    assert "unknown key" in str(refused.value) and key not in ALL_FIELDS


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def load(verl_config_factory: Any, key: str, value: Any, others: dict[str, Any] | None = None) -> Any:
    """The user's path for ``key``: a real verl config holding it, read as the workers / trainer do."""
    settings = {**(others or {}), key: value}
    if key.startswith("pipeline."):
        config = verl_config_factory("async_naive", {})
        with open_dict(config):
            config.async_reward = nested(settings)
            config.algorithm.adv_estimator = "grpo"  # mini_batch needs a group-local estimator
        return load_pipeline_config(config)
    # The reward workers read only the `reward` node: a config holding just that is the same path
    # (verl's reward.num_workers, 1 unless a row's others set it).
    workers = settings.pop("reward.num_workers", 1)
    node = {"num_workers": workers, "async_reward": nested(settings)}
    return load_config(OmegaConf.create({"reward": node}))


def shown(value: Any) -> list[str]:
    """Ways the message may print ``value`` (after the parser turned ints into floats; a long
    value cut to its first 77 characters)."""
    texts = [repr(value) if len(repr(value)) <= 80 else repr(value)[:77]]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        texts.append(repr(float(value)))
    if isinstance(value, list):
        texts.append(
            repr([float(v) for v in value]) if all(isinstance(v, (int, float)) for v in value) else ""
        )
        texts.append(repr(tuple(value)))
    return [t for t in texts if t]


#: Keys whose bad values are never printed: they may be secrets (a header, a key pasted as a name).
HIDDEN_KEYS = ("judge.api_key_env", "remote.api_key_env", "remote.headers")


@pytest.mark.parametrize(("key", "value", "problem", "others"), BAD, ids=[f"{k}={v!r}" for k, v, *_ in BAD])
def test_bad_value_is_refused_naming_key_value_and_fix(verl_config_factory, key, value, problem, others):
    with pytest.raises(ConfigError) as info:
        load(verl_config_factory, key, value, others)
    error, message = info.value, str(info.value)
    root = "async_reward." if key.startswith("pipeline.") else "reward.async_reward."
    assert error.key is not None and error.key.startswith(root + key), (error.key, message)
    assert f"{error.key}=" in message and problem in message, message
    if key in HIDDEN_KEYS:
        assert f"{error.key}=<hidden>" in message and all(t not in message for t in shown(value)), message
    elif isinstance(value, dict) and len(value) == 1:  # a mapping is reported by its bad entry
        leaf = next(iter(value.values()))
        while isinstance(leaf, dict) and len(leaf) == 1:  # nested: the entry deep down
            leaf = next(iter(leaf.values()))
        assert any(t in message for t in [*shown(leaf), repr(sorted(value))]), message
    elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        # a list of mappings (judge.criteria) is reported by its bad entry's key and value
        leaves = [leaf for item in value for leaf in item.values()]
        assert any(t in message for leaf in leaves for t in shown(leaf)), message
    else:
        assert any(t in message for t in shown(value)), message
    assert error.fix and error.fix in message  # the fix is said, not only the problem


@pytest.mark.parametrize(
    ("key", "value", "others"),
    [(key, value, {}) for key, value in GOOD] + GOOD_WITH_OTHERS,
    ids=[f"{k}={v!r}" for k, v, *_ in [*GOOD, *GOOD_WITH_OTHERS]],
)
def test_good_value_is_accepted(verl_config_factory, key, value, others):
    if key in DEPRECATED:  # honoured, and the warning says what replaced it and the fix
        replaced_by = DEPRECATED[key]
        said = rf"reward\.async_reward\.{re.escape(key)} is deprecated: .*{replaced_by}.*; delete the line"
        with pytest.warns(DeprecationWarning, match=said):
            loaded = load(verl_config_factory, key, value, others)
    else:
        loaded = load(verl_config_factory, key, value, others)
    node: Any = loaded
    for part in key.removeprefix("pipeline.").split("."):
        node = getattr(node, part)
    expected = tuple(value) if isinstance(value, list) else value
    if isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(node)
    elif key == "extra_defaults":
        assert set(node) == set(value)
    elif key == "judge.criteria":
        from async_reward.judge.rubric.criteria import Criterion

        assert node == tuple(Criterion(**item) for item in value)
    elif key == "composite.components":
        assert [(c.name, c.manager, c.weight) for c in node] == [
            ("rule", "async_naive", 1.0),
            ("judge", "llm_judge", 0.5),
        ]
        assert node[1].only_if.component == "rule" and node[1].only_if.score_at_least == 1.0
    else:
        assert node == expected


def test_secrets_never_appear_in_errors(verl_config_factory, monkeypatch):
    secret = "sk-never-print-me-42"
    monkeypatch.setenv("JUDGE_KEY_FOR_TEST", secret)
    with pytest.raises(ConfigError) as info:
        load(verl_config_factory, "remote.headers", {"Authorization": 12345678})
    assert "12345678" not in str(info.value)
    monkeypatch.delenv("JUDGE_KEY_FOR_TEST")
    config = verl_config_factory(
        "llm_judge", {"judge": {"base_url": "http://x/v1", "api_key_env": "JUDGE_KEY_FOR_TEST"}}
    )
    with pytest.raises(ConfigError, match=r"the variable named in judge\.api_key_env is not set") as info:
        check_reward(config)
    assert info.value.key == "reward.async_reward.judge.api_key_env"
    assert secret not in str(info.value)


COMPONENT_SECRET = "sk-live-SECRET42-component"


@pytest.mark.parametrize(
    ("manager", "settings", "named"),
    [
        (  # the reviewer's line: a remote section (its headers) under a component that reads none
            "async_naive",
            {"remote": {"url": "http://svc/score", "headers": {"X-Api-Key": COMPONENT_SECRET}}},
            "remote",
        ),
        ("async_remote", {"judge": {"extra_body": {"api_key": COMPONENT_SECRET}}}, "judge"),
        (  # a nested composite is a setting of the whole sample, and its components hold sections
            "async_naive",
            {
                "composite": {
                    "components": [
                        {
                            "name": "inner",
                            "manager": "async_remote",
                            "async_reward": {"remote": {"headers": {"X-Api-Key": COMPONENT_SECRET}}},
                        }
                    ]
                }
            },
            "composite",
        ),
    ],
)
def test_a_components_refused_section_is_named_never_shown(verl_config_factory, manager, settings, named):
    """A component's settings are refused by key, never echoed: a section may hold a header's key
    (as managers.base's refusal of a section the manager does not read promises)."""
    component = {"name": "rule", "manager": manager, "async_reward": settings}
    with pytest.raises(ConfigError) as info:
        load(verl_config_factory, "composite.components", [component])
    message = str(info.value)
    assert info.value.key == f"reward.async_reward.composite.components[0].async_reward.{named}", message
    assert COMPONENT_SECRET not in message and f"{info.value.key}=<hidden>" in message, message


@pytest.mark.parametrize("name", ["Authorization", "authorization", "AUTHORIZATION"])
def test_an_authorization_header_beside_api_key_env_is_refused(verl_config_factory, name):
    # api_key_env's "Bearer <key>" silently replaced the user's header (in any letter case).
    header = {name: "Bearer sk-from-headers-0123456789"}
    with pytest.raises(ConfigError) as info:
        load(verl_config_factory, "remote.headers", header, {"remote.api_key_env": "RM_TOKEN"})
    error, message = info.value, str(info.value)
    assert error.key == f"reward.async_reward.remote.headers.{name}"
    assert "reward.async_reward.remote.api_key_env" in message and error.fix and error.fix in message
    assert "sk-from-headers" not in message and f"{error.key}=<hidden>" in message
    assert load(verl_config_factory, "remote.headers", header).remote.headers == header  # alone: fine


URL_WITH_CREDENTIALS = "http://user:pw-SECRETPW@127.0.0.1:9/score?token=QTOKEN"


@pytest.mark.parametrize(
    ("url_key", "others", "sender"),
    [
        ("remote.url", {"remote.api_key_env": "RM_TOKEN"}, "remote.api_key_env"),
        (
            "remote.url",
            {"remote.headers": {"authorization": "Basic abcdefgh"}},
            "remote.headers.authorization",
        ),
        ("judge.base_url", {"judge.api_key_env": "JUDGE_TOKEN"}, "judge.api_key_env"),
    ],
)
def test_url_credentials_beside_an_authorization_header_are_refused(
    verl_config_factory, url_key, others, sender
):
    # aiohttp refuses a request with both (every sample failed "Cannot combine AUTHORIZATION header").
    with pytest.raises(ConfigError) as info:
        load(verl_config_factory, url_key, URL_WITH_CREDENTIALS, others)
    error, message = info.value, str(info.value)
    assert error.key == f"reward.async_reward.{url_key}"
    assert f"reward.async_reward.{sender}" in message and error.fix and error.fix in message
    assert "SECRETPW" not in message and "QTOKEN" not in message
    load(verl_config_factory, url_key, URL_WITH_CREDENTIALS)  # alone: fine (sent as Basic)


@pytest.mark.parametrize("key", ["remote.url", "judge.base_url"])
def test_a_refused_url_is_shown_without_its_password_or_query(verl_config_factory, key):
    with pytest.raises(ConfigError) as info:
        load(verl_config_factory, key, "ftp://user:pw-SECRETPW@host/score?token=QTOKEN")
    message = str(info.value)
    assert "'ftp://<hidden>@host/score?<hidden>' is not an http(s) URL" in message, message
    assert "SECRETPW" not in message and "QTOKEN" not in message


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ({"X-Api-Key": "hdr-SECRET-abc\r\nX-Injected: 1"}, "remote.headers.X-Api-Key"),
        ({"X-Api-Key": "hdr-SECRET-abc\n"}, "remote.headers.X-Api-Key"),
        ({"X-Api-Key": "hdr-SECRET-abc\x00"}, "remote.headers.X-Api-Key"),
        ({"X-Api-Key: hdr-SECRET-abc\r\nX-Other": "1"}, "remote.headers"),
    ],
)
def test_a_control_character_in_a_header_is_refused_without_showing_it(verl_config_factory, headers, key):
    # aiohttp refused every request ("Forbidden control character detected in headers").
    with pytest.raises(ConfigError) as info:
        load(verl_config_factory, "remote.headers", headers)
    error, message = info.value, str(info.value)
    assert error.key == f"reward.async_reward.{key}" and "control character" in message
    assert "hdr-SECRET" not in message and error.fix and error.fix in message
    assert load(verl_config_factory, "remote.headers", {"X-Team": "rl\tteam"})  # a TAB is allowed


# -- manager-specific requirements, on the driver --------------------------------------------------


@pytest.mark.parametrize(
    ("manager", "settings", "key"),
    [
        ("llm_judge", {}, "reward.async_reward.judge.base_url"),
        (
            "llm_judge",
            {"judge": {"base_url": "http://x/v1", "api_key_env": "UNSET_VAR_X"}},
            "judge.api_key_env",
        ),
        ("async_remote", {}, "reward.async_reward.remote.url"),
        (
            "async_remote",
            {"remote": {"url": "http://x/s", "api_key_env": "UNSET_VAR_X"}},
            "remote.api_key_env",
        ),
        ("no_such_manager", {}, "reward.reward_manager.name"),
        # llm_judge: a fallback above the lowest verdict's reward pays a response for breaking the reply.
        ("llm_judge", {"judge": {"base_url": "http://x/v1", "normalize_to": [-1, 1]}}, "fallback_score"),
        ("llm_judge", {"judge": {"base_url": "http://x/v1"}, "fallback_score": 0.5}, "fallback_score"),
        (
            "llm_judge",
            {"judge": {"base_url": "http://x/v1", "normalize_to": None, "min_score": 1}, "fallback_score": 2},
            "fallback_score",
        ),
    ],
)
def test_prepare_verl_config_refuses_before_anything_starts(
    verl_config_factory, manager, settings, key, monkeypatch
):
    import ray

    monkeypatch.delenv("UNSET_VAR_X", raising=False)
    started = ray.is_initialized()
    with pytest.raises(ConfigError) as info:
        prepare_verl_config(verl_config_factory(manager, settings))
    assert info.value.key is not None and info.value.key.endswith(key)
    assert ray.is_initialized() == started  # nothing was started to find out


@pytest.mark.parametrize("section", ["remote", "judge"])
@pytest.mark.parametrize("control", ["\r", "\n", "\x1b"])
def test_an_api_key_with_a_control_character_is_refused_at_start_up(
    verl_config_factory, monkeypatch, section, control
):
    # A key read from an env file with its line break: aiohttp refuses the header, failing every
    # sample with a "header injection" ValueError; refused before anything starts, the key unshown.
    key = "sk-CTRL-SECRET-0123456789"
    monkeypatch.setenv("CTRL_KEY_FOR_TEST", key + control)
    manager, url_key, url = {
        "remote": ("async_remote", "url", "http://x/s"),
        "judge": ("llm_judge", "base_url", "http://x/v1"),
    }[section]
    config = verl_config_factory(manager, {section: {url_key: url, "api_key_env": "CTRL_KEY_FOR_TEST"}})
    with pytest.raises(ConfigError) as info:
        prepare_verl_config(config)
    assert info.value.key == f"reward.async_reward.{section}.api_key_env"
    assert "has a control character (CR, LF, ...)" in str(info.value)
    assert "SECRET" not in str(info.value) and "CTRL_KEY_FOR_TEST" not in str(info.value)
    monkeypatch.setenv("CTRL_KEY_FOR_TEST", key + "\t")  # a TAB is allowed in a header
    prepare_verl_config(config)


#: (settings, the reward floor the message names, where it comes from): llm_judge + on_failure fallback.
JUDGE_FALLBACK_BAD = [
    ({"judge": {"normalize_to": [-1, 1]}}, "-1", "judge.normalize_to[0]"),  # the default fallback, 0.0
    ({"fallback_score": 0.1}, "0", "judge.normalize_to[0]"),
    ({"judge": {"normalize_to": None, "min_score": -5, "max_score": 5}}, "-5", "judge.min_score"),
]
#: Settings a judge job may use: the fallback at or below the floor, or no fallback at all.
JUDGE_FALLBACK_GOOD = [
    {},  # the defaults: fallback 0.0 on [0, 1]
    {"judge": {"normalize_to": [-1, 1]}, "fallback_score": -1},
    {"judge": {"normalize_to": [-1, 1]}, "fallback_score": -3},
    {"judge": {"normalize_to": None, "min_score": 1}, "fallback_score": 1},
    {"fallback_score": 0.5, "on_failure": "raise"},
]


@pytest.mark.parametrize(("settings", "floor", "source"), JUDGE_FALLBACK_BAD)
def test_llm_judge_refuses_a_fallback_above_the_lowest_verdict(
    verl_config_factory, tokenizer, settings, floor, source
):
    from async_reward.managers import LLMJudgeRewardManager

    settings = {**settings, "judge": {"base_url": "http://x/v1", **settings.get("judge", {})}}
    config = verl_config_factory("llm_judge", settings)
    for refuse in (check_reward, lambda c: LLMJudgeRewardManager(c, tokenizer)):  # driver, worker
        with pytest.raises(ConfigError) as info:
            refuse(config)
        message = str(info.value)
        assert info.value.key == "reward.async_reward.fallback_score", message
        assert f"is above the lowest reward a judge verdict gives ({floor}, {source})" in message
        assert (
            info.value.fix == f"set fallback_score to {floor} or lower, or use on_failure: exclude or raise"
        )
        assert info.value.fix in message


@pytest.mark.parametrize("settings", JUDGE_FALLBACK_GOOD)
def test_llm_judge_accepts_a_fallback_at_or_below_the_lowest_verdict(
    verl_config_factory, tokenizer, settings
):
    from async_reward.managers import LLMJudgeRewardManager

    settings = {**settings, "judge": {"base_url": "http://x/v1", **settings.get("judge", {})}}
    config = verl_config_factory("llm_judge", settings)
    check_reward(config)
    assert LLMJudgeRewardManager(config, tokenizer).settings.judge.base_url == "http://x/v1"


def test_the_judge_fallback_rule_is_the_judges_only(verl_config_factory):
    """A reward function cannot be made to fail by what the response says: any fallback goes."""
    check_reward(verl_config_factory("async_naive", {"fallback_score": 0.5}))


def test_key_variable_from_the_runtime_env_counts(verl_config_factory, monkeypatch):
    """A key passed to the workers through Ray's runtime_env is where the workers run: accepted."""
    monkeypatch.delenv("KEY_ONLY_IN_RUNTIME_ENV", raising=False)
    config = verl_config_factory(
        "llm_judge", {"judge": {"base_url": "http://x/v1", "api_key_env": "KEY_ONLY_IN_RUNTIME_ENV"}}
    )
    with open_dict(config):
        config.ray_kwargs = {"ray_init": {"runtime_env": {"env_vars": {"KEY_ONLY_IN_RUNTIME_ENV": "k"}}}}
    prepare_verl_config(config)


#: Command lines whose ``reward.async_reward`` node is misshapen or unresolvable, and the key named.
WRONG_SHAPES: list[tuple[list[str], str]] = [
    (["++reward.async_reward=oops"], "reward.async_reward"),
    (["++reward.async_reward=[1,2]"], "reward.async_reward"),
    (["++reward.async_reward=5"], "reward.async_reward"),
    (["+reward.async_reward.timeout_s=" + "9" * 400], "reward.async_reward.timeout_s"),
    (
        ["++reward.async_reward.judge.base_url=${oc.env:ASYNC_REWARD_UNSET_URL}"],
        "reward.async_reward.judge.base_url",
    ),
]


def wrong_shape_refused(prepare: Any, overrides: list[str], monkeypatch: pytest.MonkeyPatch) -> ConfigError:
    """``prepare`` (an entry point's checks) on verl's config composed from the user's command line."""
    monkeypatch.delenv("ASYNC_REWARD_UNSET_URL", raising=False)
    base = ["reward.reward_manager.name=llm_judge", "+reward.async_reward.judge.base_url=http://x/v1"]
    if any("reward.async_reward=" in o for o in overrides):
        base = base[:1]  # the whole node is replaced
    with pytest.raises(ConfigError) as info:
        prepare(compose_verl_config([*base, *overrides]))
    return info.value


@pytest.mark.parametrize(("overrides", "key"), WRONG_SHAPES)
def test_wrong_shapes_and_unresolvable_values_are_config_errors(overrides, key, monkeypatch):
    """The user's command line through ``prepare_verl_config`` (a user's launcher; the legacy entry
    point's, with its own node's rows: tests/legacy/test_config_validation.py): each used to be a bare
    TypeError, ValueError, AttributeError, OverflowError or OmegaConf InterpolationResolutionError."""
    error = wrong_shape_refused(prepare_verl_config, overrides, monkeypatch)
    assert error.key == key, str(error)
    assert error.fix and error.fix in str(error)


def test_reward_budgets_cannot_be_split_over_fewer_workers_than_verl_starts(verl_config_factory):
    """``async_reward.num_workers: 1`` with 8 reward workers gave each of them the whole budget."""
    config = verl_config_factory(
        "async_rate_limited", {"num_workers": 2, "limits": {"requests_per_minute": 64}}
    )
    with open_dict(config):
        config.reward.num_workers = 8
    with pytest.raises(ConfigError, match=r"num_workers=2 is below reward\.num_workers \(8\)") as info:
        prepare_verl_config(config)
    assert info.value.key == "reward.async_reward.num_workers"
    assert "delete the line" in info.value.fix and "reward.num_workers" in info.value.fix
    with open_dict(config):
        config.reward.async_reward.num_workers = 8  # equal: honoured, deprecated
    with pytest.warns(
        DeprecationWarning, match=r"async_reward\.num_workers is deprecated: .*; delete the line\."
    ):
        assert load_config(config).worker_count == 8
    with open_dict(config):
        config.reward.async_reward.num_workers = 16  # more is conservative (a budget shared with others)
    with pytest.warns(
        DeprecationWarning, match=r"smaller share, still honoured\); delete the line, and lower"
    ):
        assert load_config(config).worker_count == 16
    with open_dict(config):
        del config.reward.async_reward.num_workers  # the replacement: verl's reward.num_workers alone
    assert load_config(config).worker_count == 8


USER_CODE = """
def score_fn(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0

NOT_CALLABLE = 3

class Agent:
    def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        return 1.0

class NoScore:
    pass

class Scaled:
    def __init__(self, scale=1.0):
        self.scale = scale

    def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        return self.scale

class Needs(Scaled):
    def __init__(self, threshold, *, scale=1.0):
        self.threshold, self.scale = threshold, scale

class TakesAny(Scaled):
    def __init__(self, **options):
        self.options = options
"""


@pytest.mark.parametrize(
    ("manager", "settings", "function", "key", "words"),
    [
        (
            "async_stateful",
            {"executor": "process"},
            {"name": "Agent"},
            "reward.async_reward.executor",
            "thread",
        ),
        (
            "async_stateful",
            {},
            {"path": None, "name": "Agent"},
            "reward.custom_reward_function.path",
            "required",
        ),
        ("async_stateful", {}, {"name": "NoScore"}, "reward.custom_reward_function.name", "no compute_score"),
        ("async_stateful", {}, {"name": "score_fn"}, "reward.custom_reward_function.name", "not a class"),
        # init_kwargs the constructor cannot take: each reward worker died with a bare TypeError.
        (
            "async_stateful",
            {"stateful": {"init_kwargs": {"scal": 2.0}}},
            {"name": "Scaled"},
            "reward.async_reward.stateful.init_kwargs.scal",
            "is not a parameter of Scaled(scale=1.0)",
        ),
        (
            "async_stateful",
            {"stateful": {"init_kwargs": {"scale": 2.0}}},
            {"name": "Needs"},
            "reward.async_reward.stateful.init_kwargs.threshold",
            "required by Needs(threshold, *, scale=1.0)",
        ),
        (
            "async_naive",
            {},
            {"path": "/nonexistent/reward.py", "name": "f"},
            "reward.custom_reward_function.path",
            "does not exist",
        ),
        ("async_naive", {}, {"name": "no_such_fn"}, "reward.custom_reward_function.name", "is not defined"),
        (
            "async_rate_limited",
            {},
            {"name": "NOT_CALLABLE"},
            "reward.custom_reward_function.name",
            "not a function",
        ),
    ],
)
def test_the_users_code_is_loaded_and_checked_on_the_driver(
    tmp_path, verl_config_factory, manager, settings, function, key, words
):
    """These were refused only in a reward worker's constructor: a Ray ActorDiedError at the first step."""
    import ray

    path = tmp_path / "user_code.py"
    path.write_text(USER_CODE)
    config = verl_config_factory(manager, settings, custom_reward_function={"path": str(path), **function})
    started = ray.is_initialized()
    with pytest.raises(ConfigError) as info:
        prepare_verl_config(config)
    assert info.value.key == key and words in str(info.value), str(info.value)
    assert ray.is_initialized() == started


def test_good_user_code_passes_the_driver_checks(tmp_path, verl_config_factory):
    path = tmp_path / "user_code.py"
    path.write_text(USER_CODE)
    for manager, name in (("async_stateful", "Agent"), ("async_naive", "score_fn")):
        prepare_verl_config(
            verl_config_factory(manager, {}, custom_reward_function={"path": str(path), "name": name})
        )
    for name, init_kwargs in (
        ("Scaled", {}),
        ("Scaled", {"scale": 2.0}),
        ("Needs", {"threshold": 0.5}),
        ("TakesAny", {"anything": 1, "at_all": "x"}),  # **options takes every key
    ):
        settings = {"stateful": {"init_kwargs": init_kwargs}}
        prepare_verl_config(
            verl_config_factory(
                "async_stateful", settings, custom_reward_function={"path": str(path), "name": name}
            )
        )


def test_a_misspelled_init_kwarg_is_refused_naming_the_key_the_signature_and_the_fix(
    tmp_path, verl_config_factory
):
    path = tmp_path / "user_code.py"
    path.write_text(USER_CODE)
    settings = {"stateful": {"init_kwargs": {"scal": 2.0}}}
    config = verl_config_factory(
        "async_stateful", settings, custom_reward_function={"path": str(path), "name": "Scaled"}
    )
    with pytest.raises(ConfigError) as info:
        check_reward(config)
    message = str(info.value)
    assert "reward.async_reward.stateful.init_kwargs.scal=2.0" in message, message
    assert "Scaled(scale=1.0)" in message and str(path) in message, message
    assert info.value.fix is not None and "rename it to 'scale'" in info.value.fix
    assert info.value.fix in message


def test_verl_reward_num_workers_is_checked(verl_config_factory):
    config = verl_config_factory("async_naive", {})
    with open_dict(config):
        config.reward.num_workers = 0
    with pytest.raises(ConfigError, match=r"reward\.num_workers=0"):
        prepare_verl_config(config)


# -- the CLI ---------------------------------------------------------------------------------------


def score_args(tmp_path: Path, override: str) -> list[str]:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "2+3?", "response": "5", "ground_truth": "5"}\n')
    return [
        "score",
        "--input",
        str(rows),
        "--output",
        str(tmp_path / "out.jsonl"),
        "--manager",
        "llm_judge",
        "--set",
        "judge.base_url=http://127.0.0.1:1/v1",
        "--set",
        override,
        "--no-progress",
    ]


@pytest.mark.subprocess
def test_cli_score_refuses_an_unknown_parser_before_scoring(tmp_path):
    """Through the user's path: the command line in a subprocess (it used to exit 0, every row error)."""
    result = subprocess.run(
        [sys.executable, "-m", "async_reward.tools.cli", *score_args(tmp_path, "judge.parser=regex")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 2, result.stderr
    assert "reward.async_reward.judge.parser='regex' is not allowed; use one of" in result.stderr
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("timeout_s=.nan", "timeout_s"),
        ("judge.normalize_to=[1,0]", "judge.normalize_to"),
        ("timeout_s=" + "9" * 400, "timeout_s"),  # OverflowError: exit 1 and a traceback, before
    ],
)
def test_cli_score_refuses_bad_numbers(tmp_path, capsys, override, key):
    from async_reward.tools.cli import main

    with pytest.raises(SystemExit) as info:
        main(score_args(tmp_path, override))
    assert info.value.code == 2
    assert f"reward.async_reward.{key}=" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


# -- verl's own path (the user added only the setup hook) --------------------------------------------


def test_worker_side_refusal_survives_rays_wrapping(
    ray_cluster, verl_config_factory, reward_loop, batch_factory, monkeypatch
):
    """The key is exported where the driver runs but not where the reward workers run: the manager's
    constructor refuses in the worker, and the message reaches the caller of compute_rm_score."""
    import ray

    monkeypatch.setenv("ONLY_ON_THE_DRIVER", "k")  # after ray.init: the workers do not inherit it
    config = verl_config_factory(
        "llm_judge", {"judge": {"base_url": "http://127.0.0.1:1/v1", "api_key_env": "ONLY_ON_THE_DRIVER"}}
    )
    manager = reward_loop(config)  # the driver-side check passes here
    with pytest.raises(ray.exceptions.RayError) as info:
        manager.compute_rm_score(batch_factory([{"response": "5", "ground_truth": "5"}] * 2))
    message = str(info.value)
    assert "ConfigError" in message
    assert (
        "reward.async_reward.judge.api_key_env=<hidden>: the variable named in judge.api_key_env" in message
    )
    assert "runtime_env.env_vars" in message  # the fix travels too


def test_verl_task_runner_gets_the_config_error_at_start_up(ray_cluster, verl_config_factory):
    """Where verl's trainer builds its RewardLoopManager (a Ray actor, so our hook ran there), the bad
    setting is the constructor's error, before any RewardLoopWorker starts."""
    import ray

    @ray.remote
    class TaskRunnerLike:
        def build(self, config: Any) -> str:
            from verl.experimental.reward_loop.reward_loop import RewardLoopManager

            RewardLoopManager(config)
            return "built"

    config = verl_config_factory("llm_judge", {"judge": {"base_url": "http://x/v1", "temperature": 9}})
    runner = TaskRunnerLike.remote()
    with pytest.raises(ConfigError) as info:  # Ray re-raises it as (a subclass of) our error
        ray.get(runner.build.remote(config), timeout=120)
    assert "reward.async_reward.judge.temperature=9.0 must be in [0, 2]" in str(info.value)
    with pytest.raises(ValueError):
        ray.get_actor("reward_loop_worker_0")  # the check ran before verl started any worker
    ray.kill(runner)


def test_config_error_pickles_with_its_fields():
    import pickle

    error = pickle.loads(pickle.dumps(ConfigError("k=1 bad; fix", key="k", fix="fix")))
    assert (str(error), error.key, error.fix) == ("k=1 bad; fix", "k", "fix")


def test_yaml_nan_is_what_users_write(tmp_path, verl_config_factory):
    """``.nan`` in YAML (the issue's example) reaches the parser as a float NaN and is refused."""
    text = OmegaConf.create({"timeout_s": float("nan")})
    path = Path(tmp_path) / "a.yaml"
    OmegaConf.save(text, path)
    raw = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(raw, dict) and math.isnan(raw["timeout_s"])
    with pytest.raises(ConfigError, match="timeout_s=nan is not a finite number"):
        load_config(verl_config_factory("async_naive", raw))


UNSET = "${oc.env:ASYNC_REWARD_TEST_SURELY_UNSET}"


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("reward.custom_reward_function", "reward.py", "reward.custom_reward_function"),
        ("reward.custom_reward_function.path", UNSET, "reward.custom_reward_function.path"),
        ("reward.async_reward", UNSET, "reward.async_reward"),
        ("reward.num_workers", UNSET, "reward.num_workers"),
    ],
)
def test_an_unresolvable_or_misshapen_reward_node_is_a_config_error(verl_config_factory, key, value, named):
    """Found by a hostile review: these escaped as raw OmegaConf / AttributeError tracebacks."""
    for check in (check_reward, prepare_verl_config):
        config = verl_config_factory("async_naive", {})
        with open_dict(config):
            OmegaConf.update(config, key, value, merge=False, force_add=True)
        with pytest.raises(ConfigError) as info:
            check(config)
        assert info.value.key is not None and info.value.key.startswith(named), (check, info.value)


def test_an_unresolvable_trainer_setting_is_a_config_error(verl_config_factory):
    """The legacy trainer's node unresolvable (its rollout settings' check: tests/legacy/)."""
    config = verl_config_factory("async_naive", {})
    with open_dict(config):
        OmegaConf.update(config, "async_reward", UNSET, merge=False, force_add=True)
    with pytest.raises(ConfigError, match="cannot be resolved"):
        load_pipeline_config(config)
