"""A key never reaches an error message, a printed config or the experiment tracker.

Errors: what sits where an API key variable's NAME belongs is often the key itself (pasted, or
resolved by ``${oc.env:...}``), so the value of an ``*api_key_env`` key is never printed, and no
error prints a value that is a secret of this environment. Configs: the pipelined trainer's task
runner prints the resolved config and hands it to wandb / mlflow; ``redact_config`` hides header
values and the keys passed through ``ray_kwargs.ray_init.runtime_env.env_vars``.
"""

from __future__ import annotations

from typing import Any

import pytest
from omegaconf import OmegaConf, open_dict

from async_reward import ConfigError, prepare_verl_config
from async_reward._core.redaction import is_secret_field, is_secret_name, redact_config

KEY = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


def refused(config: Any) -> str:
    with pytest.raises(ConfigError) as info:
        prepare_verl_config(config)
    return str(info.value)


def test_a_key_pasted_as_the_variable_name_is_never_printed(verl_config_factory, monkeypatch):
    monkeypatch.delenv(KEY, raising=False)
    message = refused(
        verl_config_factory("llm_judge", {"judge": {"base_url": "http://x/v1", "api_key_env": KEY}})
    )
    # It printed "api_key_env='hf_...' ...; export hf_...=<key>": the key, twice.
    assert KEY not in message
    assert "api_key_env=<hidden>: the variable named in judge.api_key_env is not set" in message


def test_a_key_resolved_from_the_environment_is_recognised_as_a_key(verl_config_factory, monkeypatch):
    monkeypatch.setenv("MY_JUDGE_CREDENTIAL", KEY)
    settings = {"judge": {"base_url": "http://x/v1", "api_key_env": "${oc.env:MY_JUDGE_CREDENTIAL}"}}
    message = refused(verl_config_factory("llm_judge", settings))
    assert KEY not in message
    assert "holds a key, not a variable name" in message
    assert "write reward.async_reward.judge.api_key_env=MY_JUDGE_CREDENTIAL" in message


@pytest.mark.parametrize(
    "settings",
    [
        {"remote": {"url": "http://x/s", "api_key_env": 1234567890123}},  # a numeric token: a type error
        {"remote": {"url": "http://x/s"}, "timeout_s": "${oc.env:SOME_SERVICE_TOKEN}"},  # any key, any error
    ],
)
def test_type_errors_never_print_a_secret(verl_config_factory, monkeypatch, settings):
    monkeypatch.setenv("SOME_SERVICE_TOKEN", KEY)
    message = refused(verl_config_factory("async_remote", settings))
    assert KEY not in message and "1234567890123" not in message and "=<hidden>" in message


WORKER_KEY = "sk-worker-only-AbCdEf0123456789"


@pytest.mark.parametrize(
    ("variable", "settings"),
    [
        # The key exists only in the workers' environment; a user pasted it where a value belongs too.
        ("JUDGE_API_KEY", {"judge": {"base_url": WORKER_KEY, "api_key_env": "JUDGE_API_KEY"}}),
        (
            "SERVICE_CRED",
            {"remote": {"url": "http://x/s", "api_key_env": "SERVICE_CRED"}, "timeout_s": WORKER_KEY},
        ),
        ("HF_TOKEN", {"remote": {"url": "http://x/s"}, "fallback_score": f"{WORKER_KEY}"}),
    ],
)
def test_a_key_passed_only_to_the_workers_is_never_echoed(
    verl_config_factory, monkeypatch, variable, settings
):
    monkeypatch.delenv(variable, raising=False)
    manager = "llm_judge" if "judge" in settings else "async_remote"
    config = verl_config_factory(manager, settings)
    with open_dict(config):
        config.ray_kwargs = {"ray_init": {"runtime_env": {"env_vars": {variable: WORKER_KEY}}}}
    message = refused(config)
    assert WORKER_KEY not in message and "<hidden>" in message


#: ``ray_kwargs`` nodes of every shape a config may hand the workers' secrets in (or none), and whether
#: the whole config converted finds a secret there.
RAY_KWARGS_SHAPES: list[tuple[Any, bool]] = [
    (None, False),  # no ray_kwargs at all
    ({}, False),
    ({"ray_init": {"runtime_env": {}}}, False),
    ({"ray_init": {"runtime_env": {"env_vars": None}}}, False),
    ({"ray_init": {"runtime_env": {"env_vars": {}}}}, False),
    ({"ray_init": {"runtime_env": {"env_vars": {"HF_TOKEN": WORKER_KEY}}}}, True),
    ({"ray_init": {"runtime_env": {"env_vars": {"JUDGE_CRED": WORKER_KEY}}}}, True),  # named by api_key_env
    ({"ray_init": {"runtime_env": {"env_vars": {"PLAIN": WORKER_KEY}}}}, False),  # neither
    ({"ray_init": {"runtime_env": {"env_vars": {"HF_TOKEN": "${trainer.project_name}-0123456789"}}}}, True),
    ({"ray_init": {"runtime_env": {"env_vars": "${oc.create:{HF_TOKEN: sk-by-a-resolver-0123}}"}}}, True),
    # unresolvable: the config is read as written, so the text of the value is what is hidden
    ({"ray_init": {"runtime_env": {"env_vars": {"HF_TOKEN": "${no.such.key}"}}}}, True),
    ({"ray_init": {"runtime_env": {"env_vars": "${no.such.node}"}}}, False),
    ({"ray_init": {"runtime_env": "not a mapping"}}, False),
]


@pytest.mark.parametrize(("ray_kwargs", "finds"), RAY_KWARGS_SHAPES)
def test_the_workers_secrets_are_found_as_the_whole_config_converted_finds_them(
    verl_config_factory, ray_kwargs, finds
):
    """``config_secret_values`` answers a config without ``env_vars`` from that node alone (the cost
    of every start-up check); it must find what converting the whole config finds, in every shape."""
    from async_reward._core.redaction import _MIN_SECRET_CHARS, _plain, _worker_secrets, config_secret_values

    judge = {"base_url": "http://x/v1", "api_key_env": "JUDGE_CRED"}
    config = verl_config_factory("llm_judge", {"judge": judge})
    with open_dict(config):
        if ray_kwargs is None:
            config.pop("ray_kwargs", None)
        else:
            config.ray_kwargs = ray_kwargs
    whole = {v for v in _worker_secrets(_plain(config)).values() if len(v) >= _MIN_SECRET_CHARS}
    assert config_secret_values(config) == whole
    assert bool(whole) == finds, whole  # each shape holds what it says


def test_redact_config_hides_keys_headers_and_their_copies(verl_config_factory, monkeypatch):
    monkeypatch.setenv("LOCAL_SECRET_KEY", "local-secret-value-1")
    config = verl_config_factory(
        "async_remote",
        {
            "remote": {
                "url": "http://x/score",
                "api_key_env": "REMOTE_CRED",
                "headers": {"X-Api-Key": "hdr-secret-456", "X-Team": "rl"},
            },
            "judge": {"extra_body": {"note": "Bearer tok-secret-in-env-123", "echo": "local-secret-value-1"}},
        },
    )
    with open_dict(config):
        config.ray_kwargs = {
            "ray_init": {
                "runtime_env": {
                    "env_vars": {
                        "REMOTE_CRED": "tok-secret-in-env-123",  # named by api_key_env, not secret-looking
                        "HF_TOKEN": "hf-secret-789",
                        "TOKENIZERS_PARALLELISM": "false",
                        "OMP_NUM_THREADS": "4",
                    }
                }
            }
        }
    shown = redact_config(config)
    text = repr(shown)
    for secret in ("hdr-secret-456", "tok-secret-in-env-123", "hf-secret-789", "local-secret-value-1"):
        assert secret not in text
    env_vars = shown["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]
    assert env_vars == {
        "REMOTE_CRED": "<hidden>",
        "HF_TOKEN": "<hidden>",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "4",
    }
    assert shown["reward"]["async_reward"]["remote"]["headers"] == {
        "X-Api-Key": "<hidden>",
        "X-Team": "<hidden>",
    }
    assert shown["reward"]["async_reward"]["remote"]["url"] == "http://x/score"  # the rest is as it was
    assert shown["data"] == OmegaConf.to_container(config.data, resolve=True)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("OPENAI_API_KEY", True),
        ("X-Api-Key", True),
        ("MYKEY", True),
        ("DB_PASSWORD", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("OMP_NUM_THREADS", False),
    ],
)
def test_secret_looking_names(name, secret):
    assert is_secret_name(name) is secret


def test_redact_config_hides_values_of_keys_that_name_a_secret(verl_config_factory):
    """A key written straight into the config (``reward_kwargs.api_key``, ``extra_body.api_key``) is
    hidden by its key's name, without being in any environment; data-column names (``prompt_key``),
    counts (``max_tokens``) and variable names (``api_key_env``) stay readable."""
    judge = {
        "base_url": "http://j/v1",
        "api_key_env": "JUDGE_KEY",
        "max_tokens": 512,
        "extra_body": {"api_key": "sk-in-body"},
    }
    config = verl_config_factory(
        "llm_judge",
        {"judge": judge},
        custom_reward_function={
            "reward_kwargs": {"api_key": "sk-in-kwargs", "openai_token": "tok-in-kwargs"}
        },
    )
    shown = redact_config(config)
    text = repr(shown)
    assert all(secret not in text for secret in ("sk-in-body", "sk-in-kwargs", "tok-in-kwargs"))
    assert shown["reward"]["custom_reward_function"]["reward_kwargs"]["openai_token"] == "<hidden>"
    shown_judge = shown["reward"]["async_reward"]["judge"]
    assert (shown_judge["api_key_env"], shown_judge["max_tokens"]) == ("JUDGE_KEY", 512)
    assert shown["data"]["prompt_key"] == config.data.prompt_key


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("api_key", True),
        ("openai_token", True),
        ("password", True),
        ("secret_key", True),
        ("prompt_key", False),
        ("reward_fn_key", False),
        ("max_tokens", False),
        ("api_key_env", False),
        ("tokenizer", False),
    ],
)
def test_secret_field_names(name, secret):
    assert is_secret_field(name) is secret


def test_redacted_output_hides_a_key_written_in_pieces_and_restores_the_streams(verl_config_factory, capsys):
    """What ``python -m async_reward.legacy.main_ppo`` prints runs through ``redacted_output``: a key
    split across writes (print writes text and newline apart; Ray relays lines from a thread) is
    still hidden, a partial line is written on flush, and the streams are given back afterwards."""
    import sys

    from async_reward._core.redaction import redacted_output

    config = verl_config_factory("async_naive", {})
    config.ray_kwargs = {"ray_init": {"runtime_env": {"env_vars": {"OPENAI_API_KEY": WORKER_KEY}}}}
    before = sys.stdout
    with redacted_output(config):
        sys.stdout.write(f"kwargs: {WORKER_KEY[:5]}")
        sys.stdout.write(f"{WORKER_KEY[5:]} end\n")
        print(f"again {WORKER_KEY}", file=sys.stderr)
        sys.stdout.write(f"progress {WORKER_KEY}")
        sys.stdout.flush()
    assert sys.stdout is before
    captured = capsys.readouterr()
    assert captured.out == "kwargs: <hidden> end\nprogress <hidden>"
    assert captured.err == "again <hidden>\n"
