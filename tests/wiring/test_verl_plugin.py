"""async-reward as a verl plugin (issue 43): what ``import verl`` loads of ours, what it registers,
what it leaves alone, and how it says that it could not.

The in-process tests run in this pytest process, where ``import verl`` already loaded the plugin
from the installed distribution's ``verl.plugins`` entry point. The subprocess probe starts one fresh
interpreter that forks a child per case, each importing verl itself as a process of a job does:
the plugin on, turned off (ours and verl's switch), failing, and with our managers failing; and every
verl module a job's processes import first. The whole job through ``python -m verl.trainer.main_ppo``
is in tests/end_to_end/test_v1_pipelined_entry.py and tests/end_to_end/test_verl_integration.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from omegaconf import OmegaConf

from async_reward import ConfigError
from async_reward.v1 import AGENT_LOOP_MANAGER, REPLAY_BUFFER_NAME, REPLAY_BUFFER_PATH
from async_reward.v1.pipelined.config import load_pipelined_mode_config
from async_reward.wiring.verl_plugin import asks_for_async_reward, prepare_where_verl_builds
from tests.conftest import compose_verl_config
from tests.support.first_import_probe import run_probe
from tests.support.plugin_probe import VERL_FIRST

JUDGE = "+reward.async_reward.judge.base_url=http://judge.invalid:8000/v1"
#: What a plain verl job may hold that our hooks would act on if they ran: the legacy reward keys
#: (we would migrate them) and a value our check refuses (we would refuse it).
PLAIN = [
    "reward_model.reward_manager=naive",
    "reward_model.num_workers=3",
    "reward.num_workers=0",
]


def container(config: Any) -> Any:
    return OmegaConf.to_container(config, resolve=False)


# ----------------------------------------------------------------------------- inert unless asked for


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_a_plain_verl_config_is_left_exactly_as_it_is(mode, capsys) -> None:
    """verl's own manager, modes and keys: no key rewritten, no legacy key migrated, no check run
    (``reward.num_workers=0`` is refused by ours), nothing said."""
    config = compose_verl_config([*PLAIN, f"trainer.v1.trainer_mode={mode}"])
    before = container(config)
    assert asks_for_async_reward(config) is None
    assert prepare_where_verl_builds(config) is None
    assert container(config) == before
    assert "async_reward" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (["reward.reward_manager.name=llm_judge"], "reward.reward_manager.name=llm_judge"),
        (["reward_model.reward_manager=async_naive"], "reward_model.reward_manager=async_naive"),
        (["trainer.v1.trainer_mode=pipelined"], "trainer.v1.trainer_mode=pipelined"),
        (["trainer.v1.trainer_mode=decoupled"], "trainer.v1.trainer_mode=decoupled"),
        (  # our mode's name under the legacy trainer: ours to refuse, not verl's to ignore
            ["trainer.use_v1=false", "trainer.v1.trainer_mode=pipelined"],
            "trainer.v1.trainer_mode=pipelined",
        ),
        (["+reward.async_reward.timeout_s=5"], "reward.async_reward"),
        (["+async_reward.pipeline.mini_batch=true"], "async_reward"),
        (["+trainer.v1.pipelined.mini_batch=true"], "trainer.v1.pipelined"),
        (
            [f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={AGENT_LOOP_MANAGER}"],
            f"actor_rollout_ref.rollout.agent.agent_loop_manager_class={AGENT_LOOP_MANAGER}",
        ),
        (
            [f"trainer.v1.sampler.custom_sampler.path={REPLAY_BUFFER_PATH}"],
            f"trainer.v1.sampler.custom_sampler.path={REPLAY_BUFFER_PATH}",
        ),
    ],
)
def test_each_of_our_names_modes_keys_and_classes_asks_for_async_reward(overrides, reason) -> None:
    assert asks_for_async_reward(compose_verl_config(overrides)) == reason


def test_a_subclass_of_ours_registered_under_its_own_name_asks_for_async_reward() -> None:
    from async_reward import AsyncNaiveRewardManager, register_manager

    register_manager("plugin_test_subclass")(type("PluginTestSubclass", (AsyncNaiveRewardManager,), {}))
    config = compose_verl_config(["reward.reward_manager.name=plugin_test_subclass"])
    assert asks_for_async_reward(config) == "reward.reward_manager.name=plugin_test_subclass"


@pytest.mark.parametrize("mode", ["pipelined", "decoupled"])
@pytest.mark.parametrize("manager", [["reward.reward_manager.name=llm_judge", JUDGE], []])
def test_our_mode_under_the_legacy_trainer_is_refused_where_verl_builds_it(mode, manager) -> None:
    """``trainer.use_v1=false`` runs verl's legacy trainer, which never reads ``trainer.v1.*``: our
    mode's line would train unpipelined without a word. Refused where verl builds its trainer (the
    plugin's hook on ``RayPPOTrainer``, which the legacy task runner builds), with one of our managers
    or verl's own, naming ``trainer.use_v1`` and both ways out."""
    from async_reward.v1.checks import apply_legacy_and_check

    lines = [*manager, "trainer.use_v1=false", f"trainer.v1.trainer_mode={mode}"]
    for build in (prepare_where_verl_builds, apply_legacy_and_check):
        with pytest.raises(ConfigError) as refused:
            build(compose_verl_config(lines))
        assert refused.value.key == "trainer.use_v1", refused.value
        assert f"trainer.v1.trainer_mode={mode}" in str(refused.value)
        assert "trainer.use_v1=true" in (refused.value.fix or "")
        assert f"remove trainer.v1.trainer_mode={mode}" in (refused.value.fix or "")


# ----------------------------------------------------------------------------- the mode brings its own wiring


def test_verls_modes_with_our_manager_get_our_seams_where_none_is_named(capsys, monkeypatch) -> None:
    from async_reward._core import start_lines

    monkeypatch.setattr(start_lines, "_SAID", set())  # said once per process: this test's process
    config = compose_verl_config(["reward.reward_manager.name=llm_judge", JUDGE])
    assert prepare_where_verl_builds(config) is not None
    assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class == AGENT_LOOP_MANAGER
    assert container(config.trainer.v1.sampler.custom_sampler) == {
        "path": REPLAY_BUFFER_PATH,
        "name": REPLAY_BUFFER_NAME,
    }
    said = capsys.readouterr().out
    assert "async_reward: verl v1 with an async-reward manager: using" in said and AGENT_LOOP_MANAGER in said


def test_the_legacy_line_alone_runs_our_manager_with_its_seams() -> None:
    """``reward_model.reward_manager=llm_judge`` (the mission's line), nothing else of ours but the
    judge's URL: migrated where verl builds its trainer, our v1 seams with it."""
    config = compose_verl_config(["reward_model.reward_manager=llm_judge", JUDGE])
    assert config.reward.reward_manager.name == "naive"  # what verl's own main_ppo would use
    prepare_where_verl_builds(config)
    assert config.reward.reward_manager.name == "llm_judge"
    assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class == AGENT_LOOP_MANAGER


VERLS_AGENT_LOOP = "verl.trainer.ppo.v1.agent_loop_tq.AgentLoopManagerTQ"


def test_a_users_own_agent_loop_wins_and_is_refused_where_it_cannot_work_with_ours() -> None:
    own = [f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={VERLS_AGENT_LOOP}"]
    config = compose_verl_config(["reward.reward_manager.name=llm_judge", JUDGE, *own])
    prepare_where_verl_builds(config)
    assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class == VERLS_AGENT_LOOP
    excluding = compose_verl_config(
        ["reward.reward_manager.name=llm_judge", JUDGE, *own, "+reward.async_reward.on_failure=exclude"]
    )
    with pytest.raises(ConfigError, match=r"reward\.async_reward\.on_failure.*agent_loop_manager_class"):
        prepare_where_verl_builds(excluding)


@pytest.mark.parametrize("mode", ["pipelined", "decoupled"])
def test_our_modes_are_not_given_the_seams_of_verls_modes(mode) -> None:
    """Each of our modes names its own agent-loop manager (and replay buffer) when verl builds it."""
    config = compose_verl_config(
        ["reward.reward_manager.name=llm_judge", JUDGE, f"trainer.v1.trainer_mode={mode}"]
    )
    agent = container(config.actor_rollout_ref.rollout.agent)
    from async_reward.wiring.implied_seams import imply_v1_seams

    assert imply_v1_seams(config) == []
    assert container(config.actor_rollout_ref.rollout.agent) == agent


def test_the_pipelined_mode_pipelines_unless_told_otherwise() -> None:
    base = ["trainer.v1.trainer_mode=pipelined", "algorithm.adv_estimator=grpo"]
    assert load_pipelined_mode_config(compose_verl_config(base)).mode == "both"
    off = ["+trainer.v1.pipelined.mini_batch=false", "+trainer.v1.pipelined.max_staleness=0"]
    assert load_pipelined_mode_config(compose_verl_config([*base, *off])).mode == "baseline"
    assert load_pipelined_mode_config(compose_verl_config([*base, off[0]])).mode == "one_step_off"


def test_a_refused_default_says_it_is_the_default_and_how_to_turn_it_off() -> None:
    """verl's default estimator (gae) cannot run mini-batch updates: the refusal of a flag the user
    never wrote names it as the mode's default and the override; one the user wrote stays as it was."""
    with pytest.raises(ConfigError) as error:
        load_pipelined_mode_config(compose_verl_config(["trainer.v1.trainer_mode=pipelined"]))
    message = str(error.value)
    assert "trainer.v1.pipelined.mini_batch=true" in message
    assert "on by default under trainer.v1.trainer_mode=pipelined" in message
    assert "+trainer.v1.pipelined.mini_batch=false" in (error.value.fix or "")
    with pytest.raises(ConfigError) as explicit:
        load_pipelined_mode_config(
            compose_verl_config(
                ["trainer.v1.trainer_mode=pipelined", "+trainer.v1.pipelined.mini_batch=true"]
            )
        )
    assert "by default" not in str(explicit.value)
    # max_staleness (1 unless set) is named the same way, with the value that turns it off
    grpo = ["trainer.v1.trainer_mode=pipelined", "algorithm.adv_estimator=grpo"]
    with pytest.raises(ConfigError) as staleness:
        load_pipelined_mode_config(
            compose_verl_config([*grpo, "trainer.v1.sampler.max_off_policy_threshold=1"])
        )
    assert "(max_staleness: on by default under trainer.v1.trainer_mode=pipelined" in str(staleness.value)
    assert "+trainer.v1.pipelined.max_staleness=0" in (staleness.value.fix or "")
    with pytest.raises(ConfigError) as written:
        load_pipelined_mode_config(
            compose_verl_config(
                [
                    *grpo,
                    "+trainer.v1.pipelined.max_staleness=1",
                    "trainer.v1.sampler.max_off_policy_threshold=1",
                ]
            )
        )
    assert "spanning 2 model versions" in str(written.value) and "by default" not in str(written.value)


# ----------------------------------------------------------------------------- fresh processes

#: What the plugin loads with ``import verl``: wrapt and our light modules, no manager, no config.
PLUGIN_MODULES = [
    "async_reward.wiring",
    "async_reward.wiring.trainer_modes",
    "async_reward.wiring.verl_plugin",
    "async_reward.wiring.worker_imports",
    "async_reward_verl_plugin",
]
OURS = {
    "sync": "PPOTrainerSync",
    "pipelined": "PPOTrainerPipelined",
    "decoupled": "PPOTrainerDecoupled",
    "naive": "NaiveRewardManager",
    "llm_judge": "LLMJudgeRewardManager",
}
HOOK = "worker_process_setup_hook=async_reward.wiring.integration.setup_worker"


@pytest.mark.subprocess
@pytest.mark.timeout(600)
def test_import_verl_loads_the_plugin_and_says_when_it_cannot() -> None:
    reports = {
        r["case"]: r for r in run_probe("from tests.support.plugin_probe import probe_the_plugin as p; p()")
    }

    # On: a few light modules, then our names resolve, whichever verl module a process loads first.
    assert reports["plugin"]["ours_after_verl"] == PLUGIN_MODULES
    for case in ["plugin", *(f"first:{name}" for name in VERL_FIRST)]:
        assert reports[case]["found"] == OURS, case
        assert reports[case]["errors"] == [] and reports[case]["said"] == [], case
    # Where verl loads its trainers, ours are not imported until a lookup asks for them, nor our
    # managers (and verl's scoring step's replacement) until verl's registry is read.
    for name in ("verl.trainer.ppo.v1", "verl.trainer.ppo.v1.trainer_base", "verl.trainer.main_ppo"):
        assert reports[f"first:{name}"]["loaded_before_lookups"] == [], name
    assert reports["plugin"]["loaded_before_lookups"] == []

    # Our switch off: nothing registered, and verl refuses our names saying why and the fix.
    off = reports["our switch off"]
    assert off["ours_after_verl"] == ["async_reward_verl_plugin"]
    for name in ("pipelined", "decoupled", "llm_judge"):
        assert "is not registered in this process" in off["found"][name]
        assert "ASYNC_REWARD_VERL_PLUGIN=0" in off["found"][name] and HOOK in off["found"][name]
    assert {off["found"][n] for n in ("sync", "naive")} == {OURS["sync"], OURS["naive"]}

    # verl's switch off (or a list without ours): verl imports nothing of ours, and only verl speaks.
    for case in ("verl's switch off", "other plugins only"):
        assert reports[case]["ours_after_verl"] == [], case
        assert reports[case]["found"]["pipelined"] == (
            "ValueError: Unknown trainer 'pipelined'. Available trainers: "
            "colocate_async, separate_async, sync."
        )

    # A plugin that fails says so at WARNING (verl alone would log it at DEBUG), and so do our names.
    broken = reports["plugin broken"]
    assert any(
        w.startswith("WARNING async-reward's verl plugin failed to load in this process (ImportError")
        for w in broken["said"]
    ), broken
    assert "failed to load in this process" in broken["found"]["pipelined"]
    assert broken["found"]["sync"] == OURS["sync"] and broken["found"]["naive"] == OURS["naive"]

    # Our managers failing to import (and so the package): verl's own managers and modes still load;
    # ours are refused with the cause, never verl's bare "Unknown".
    managers = reports["managers broken"]
    assert sum("async-reward's managers failed to import" in w for w in managers["said"]) == 1, managers
    for name in ("llm_judge", "pipelined"):
        assert "async_reward.managers.llm_judge is broken in this test" in managers["found"][name], name
        assert "Unknown" not in managers["found"][name]
    assert managers["found"]["naive"] == OURS["naive"] and managers["found"]["sync"] == OURS["sync"]


# ----------------------------------------------------------------------------- ASYNC_REWARD_VERL_PLUGIN


@pytest.mark.parametrize(
    ("value", "unrecognised"),
    [
        ("", False),
        ("1", False),
        (" On ", False),
        ("yes", False),
        ("0", False),
        ("OFF", False),
        ("none", False),
        ("disabled", True),
        ("off!", True),
        ("2", True),
    ],
)
def test_each_value_of_the_switch_is_on_off_or_refused(value, unrecognised) -> None:
    import async_reward_verl_plugin as plugin

    problem = plugin.unrecognised_setting({plugin.OPT_OUT_ENV: value})
    assert (problem is not None) == unrecognised
    if unrecognised:
        assert f"ASYNC_REWARD_VERL_PLUGIN={value!r}" in problem and plugin.ACCEPTED_VALUES in problem
    assert plugin.unrecognised_setting({}) is None  # unset: on


def test_an_unrecognised_switch_installs_nothing_and_says_so(monkeypatch, caplog) -> None:
    """``ASYNC_REWARD_VERL_PLUGIN=disabled`` had left the plugin on. Raising is no refusal here (verl
    logs a plugin's exception at DEBUG only), so nothing is installed, a WARNING names the variable
    and the accepted values, and the guard makes verl's lookups of our names say the same."""
    import async_reward_verl_plugin as plugin

    guarded: list[tuple[str, str]] = []
    monkeypatch.setenv(plugin.OPT_OUT_ENV, "disabled")
    monkeypatch.setattr(plugin, "install_guard", lambda cause, fix: guarded.append((cause, fix)))
    monkeypatch.setattr(plugin, "_import_without_package_init", lambda name: pytest.fail("installed"))
    with caplog.at_level("WARNING", logger="async_reward"):
        plugin.load()
    assert len(guarded) == 1
    cause, fix = guarded[0]
    assert "ASYNC_REWARD_VERL_PLUGIN='disabled' is not a value it accepts" in cause
    assert plugin.ACCEPTED_VALUES in cause and "ASYNC_REWARD_VERL_PLUGIN" in fix
    assert any("ASYNC_REWARD_VERL_PLUGIN='disabled'" in r.getMessage() for r in caplog.records)


#: Each value imports verl in a forked child of one fresh interpreter, as a job's process does.
UNRECOGNISED_SWITCH_PROBE = """
import logging, os, sys
from tests.support.first_import_probe import preload_third_party, report_each_in_a_fork

def probe(value):
    said = []

    class Collect(logging.Handler):
        def emit(self, record):
            said.append(f"{record.levelname} {record.getMessage()}")

    logging.getLogger().addHandler(Collect(level=logging.WARNING))
    os.environ["ASYNC_REWARD_VERL_PLUGIN"] = value
    import verl  # loads the plugin
    from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
    from verl.trainer.ppo.v1 import get_trainer_cls

    found = {}
    for name, lookup in (("pipelined", get_trainer_cls), ("llm_judge", get_reward_manager_cls),
                         ("naive", get_reward_manager_cls)):
        try:
            found[name] = lookup(name).__qualname__
        except Exception as error:
            found[name] = f"{type(error).__name__}: {error}"
    return {"value": value, "found": found, "said": said}

preload_third_party()
report_each_in_a_fork(["disabled", "off!"], probe)
"""


@pytest.mark.subprocess
@pytest.mark.timeout(600)
def test_an_unrecognised_switch_stops_a_job_using_our_names_naming_the_variable() -> None:
    for report in run_probe(UNRECOGNISED_SWITCH_PROBE):
        value, found = report["value"], report["found"]
        for name in ("pipelined", "llm_judge"):
            assert found[name].startswith("NotRegistered: "), (value, found)
            assert f"ASYNC_REWARD_VERL_PLUGIN={value!r} is not a value it accepts" in found[name]
        assert found["naive"] == OURS["naive"]  # verl's own names: verl's
        assert any(
            w.startswith("WARNING ") and f"ASYNC_REWARD_VERL_PLUGIN={value!r}" in w for w in report["said"]
        ), report


def test_the_plugins_names_are_ours() -> None:
    """The plugin's entry module spells our names out (it must load where the package cannot)."""
    import async_reward_verl_plugin as plugin
    from async_reward import MANAGER_NAMES
    from async_reward.wiring.trainer_modes import OUR_TRAINER_MODULES

    assert tuple(MANAGER_NAMES) == plugin.OUR_MANAGER_NAMES
    assert tuple(OUR_TRAINER_MODULES) == plugin.OUR_TRAINER_MODES
    assert HOOK in plugin.HOOK_LINE
