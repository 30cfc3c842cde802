"""``PipelinedRayPPOTrainer`` driven through verl's real ``fit`` machinery on CPU.

The GPU worker groups and the rollout servers are small in-process stand-ins (``trainer_standins``):
a tiny torch policy that really computes log-probs and takes optimizer steps, and a rollout that
samples from its own synced copy of it. Everything else is real: verl's ``RayPPOTrainer`` methods,
``DataProto``, dataloader and checkpoint code, ``core_algos`` (GRPO / GAE advantages, PPO loss),
``_balance_batch``, metrics; our schedule and ``PipelinedRewardLoopManager`` with Ray workers
running ``llm_judge`` against the local judge server over loopback.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

from async_reward.config import ConfigError
from async_reward_bench.toy.task import ArithmeticTask, build_char_tokenizer
from tests.conftest import compose_verl_config
from tests.support.trainer_standins import ArithmeticPrompts, StageDelays, build_standins

pytestmark = [
    pytest.mark.usefixtures("ray_cluster"),
]

TASK = ArithmeticTask(max_operand=2)
PROMPTS, GROUP, MINI = 4, 4, 2  # per step: 4 prompts x 4 responses, mini-batches of 2 prompts


@pytest.fixture(scope="module")
def char_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("char_tokenizer")
    build_char_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def char_tokenizer(char_tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(char_tokenizer_dir))


def make_config(tokenizer_dir: Path, judge_url: str, tmp_path: Path, *overrides: str) -> DictConfig:
    """verl's real ``ppo_trainer`` config, shrunk to the toy task."""
    return compose_verl_config(
        [
            f"actor_rollout_ref.model.path={tokenizer_dir}",
            f"data.train_batch_size={PROMPTS}",
            "data.max_prompt_length=4",
            "data.max_response_length=3",
            "data.dataloader_num_workers=0",
            "data.shuffle=true",
            "data.seed=7",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI}",
            f"actor_rollout_ref.rollout.n={GROUP}",
            "actor_rollout_ref.rollout.prompt_length=4",
            "actor_rollout_ref.rollout.response_length=3",
            "algorithm.adv_estimator=grpo",
            "critic.enable=false",
            "reward.reward_manager.name=llm_judge",
            "reward.num_workers=2",
            f"+reward.async_reward.judge.base_url={judge_url}/v1",
            "trainer.total_epochs=1",
            "trainer.total_training_steps=3",
            "trainer.save_freq=-1",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "trainer.logger=[]",
            "trainer.resume_mode=disable",
            f"trainer.default_local_dir={tmp_path / 'checkpoints'}",
            *overrides,
        ]
    )


@pytest.fixture(scope="module")
def rewards(
    ray_cluster: None, judge_server: Any, char_tokenizer_dir: Path, tmp_path_factory: Any
) -> Iterator[Any]:
    """One real pipelined reward manager for the module: two Ray workers running ``llm_judge``."""
    from async_reward.legacy import PipelinedRewardLoopManager

    config = make_config(char_tokenizer_dir, judge_server.url, tmp_path_factory.mktemp("rewards"))
    manager = PipelinedRewardLoopManager(config)
    yield manager
    manager.close()


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, dict[str, Any]]]:
    """Every ``Tracking.log`` call of verl's and our ``fit`` as ``(step, metrics)``."""
    from verl.utils.tracking import Tracking

    calls: list[tuple[int, dict[str, Any]]] = []
    monkeypatch.setattr(Tracking, "log", lambda self, data, step, **kw: calls.append((step, dict(data))))
    return calls


def build_trainer(
    cls: type,
    config: DictConfig,
    tokenizer: Any,
    standins: Any,
    *,
    train_size: int = 6 * PROMPTS,
    **kwargs: Any,
) -> Any:
    """A trainer built as verl's TaskRunner does, minus ``init_workers`` (which needs GPUs): the
    worker groups, rollout and weight sync are the stand-ins."""
    from verl.single_controller.ray.base import ResourcePoolManager
    from verl.trainer.ppo.utils import Role

    trainer = cls(
        config=config,
        tokenizer=tokenizer,
        role_worker_mapping={Role.ActorRollout: object},
        resource_pool_manager=ResourcePoolManager({"global_pool": [1]}, {Role.ActorRollout: "global_pool"}),
        train_dataset=ArithmeticPrompts(TASK, train_size, seed=1),
        val_dataset=ArithmeticPrompts(TASK, 8, seed=2),
        **kwargs,
    )
    return standins.attach(trainer)


def run_ours(config: DictConfig, tokenizer: Any, rewards: Any, **standin_kwargs: Any) -> Any:
    from async_reward.legacy.trainer import PipelinedRayPPOTrainer

    standins = build_standins(config, tokenizer, **standin_kwargs)
    build_trainer(PipelinedRayPPOTrainer, config, tokenizer, standins, reward_source=rewards).fit()
    return standins


def train_steps(logged: list[tuple[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [metrics for _, metrics in logged if "training/global_step" in metrics]


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param([], id="grpo"),
        pytest.param(
            ["algorithm.adv_estimator=gae", "critic.enable=true", "algorithm.use_kl_in_reward=true"],
            id="gae-critic-kl",
        ),
    ],
)
def test_baseline_matches_verl_fit(
    overrides, rewards, server, char_tokenizer, char_tokenizer_dir, tmp_path, logged
):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    config = lambda: make_config(  # noqa: E731
        char_tokenizer_dir, server.url, tmp_path, "trainer.test_freq=2", *overrides
    )
    theirs = build_standins(config(), char_tokenizer, score_with=rewards)
    build_trainer(RayPPOTrainer, config(), char_tokenizer, theirs).fit()
    verl_logs = train_steps(logged)
    logged.clear()
    ours = run_ours(config(), char_tokenizer, rewards)
    our_logs = train_steps(logged)

    # Same optimizer steps on the same samples with the same losses, and the same final weights.
    assert len(ours.actor.updates) == len(theirs.actor.updates) == 3 * PROMPTS // MINI
    for mine, verls in zip(ours.actor.updates, theirs.actor.updates, strict=True):
        assert mine.sample_ids == verls.sample_ids
        assert mine.metrics == verls.metrics
    for mine, verls in zip(ours.actor.policy.parameters(), theirs.actor.policy.parameters(), strict=True):
        assert torch.equal(mine, verls)
    if ours.critic is not None:
        assert ours.critic.steps == theirs.critic.steps == 3 * PROMPTS // MINI
        for mine, verls in zip(ours.critic.net.parameters(), theirs.critic.net.parameters(), strict=True):
            assert torch.equal(mine, verls)
    # The rewards were not trivial, and verl's own metrics agree (validation included).
    assert any(abs(u.metrics["actor/pg_loss"]) > 0 for u in ours.actor.updates)
    assert [m["training/global_step"] for m in our_logs] == [1, 2, 3]
    shared = [k for k in verl_logs[0] if k.startswith(("critic/", "actor/", "val-core/", "response_length/"))]
    assert any(k.startswith("val-core/") for k in verl_logs[1])
    for mine, verls in zip(our_logs, verl_logs, strict=True):
        for key in shared + [k for k in verls if k.startswith("val-core/")]:
            assert mine[key] == pytest.approx(verls[key], nan_ok=True), key
        assert mine["off_policy/staleness"] == 0 and mine["pipeline/num_updates"] == 1
        assert mine["timing_s/reward_blocked"] >= 0 and mine["reward/status_ok"] == PROMPTS * GROUP


def test_mini_batch_updates_each_sample_once_in_complete_groups(
    rewards, server, char_tokenizer, char_tokenizer_dir, tmp_path, logged, capsys
):
    dumps = tmp_path / "rollouts"
    config = make_config(
        char_tokenizer_dir,
        server.url,
        tmp_path,
        "+async_reward.pipeline.mini_batch=true",
        f"trainer.rollout_data_dir={dumps}",
    )
    standins = run_ours(config, char_tokenizer, rewards)
    steps = train_steps(logged)
    # The one start-up line naming the trainer and its mode.
    started = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith("async_reward: trainer")
    ]
    assert started == [
        "async_reward: trainer async_reward.legacy.trainer.PipelinedRayPPOTrainer, pipeline mode "
        "mini_batch (mini_batch=True, one_step_off_policy=False)"
    ]
    # verl's rollout dump sees the whole trained batch, scores and reward extras included.
    rows = [json.loads(line) for line in (dumps / "3.jsonl").read_text().splitlines()]
    assert len(rows) == PROMPTS * GROUP and {row["status"] for row in rows} == {"ok"}

    # Same number of optimizer steps as baseline: train_batch_size // ppo_mini_batch_size per step,
    # each its own update_actor call on one chunk.
    assert len(standins.actor.updates) == 3 * PROMPTS // MINI
    assert [len(call) for call in standins.actor.update_calls] == [1] * (3 * PROMPTS // MINI)
    assert [m["pipeline/num_updates"] for m in steps] == [PROMPTS // MINI] * 3
    generations = [c for c in standins.rollout.calls if not c.validate]
    for step, generation in enumerate(generations):
        chunks = standins.actor.updates[step * (PROMPTS // MINI) : (step + 1) * (PROMPTS // MINI)]
        used = [sample for chunk in chunks for sample in chunk.sample_ids]
        expected = [f"{i}:{k}" for i in dict.fromkeys(generation.prompt_indices) for k in range(GROUP)]
        assert sorted(used) == sorted(expected)  # every sample of the step exactly once
        for chunk in chunks:
            assert len(chunk.sample_ids) == MINI * GROUP
            assert set(Counter(chunk.prompt_indices).values()) == {GROUP}  # complete groups only
    assert all(m["off_policy/staleness"] == 0 for m in steps)


def test_the_tracker_never_gets_a_key_or_a_header_value(
    server, char_tokenizer, char_tokenizer_dir, tmp_path, monkeypatch
):
    """``fit`` hands the resolved config to wandb / mlflow (verl's ``Tracking``); it used to hand over
    ``runtime_env.env_vars`` and ``remote.headers`` as they were. The header is set where a manager
    reads it (``async_remote``, scoring at the local server's ``/score``): under ``llm_judge`` the
    ``remote`` section is refused at start-up, never reaching the tracker."""
    from verl.utils.tracking import Tracking

    from async_reward.legacy import PipelinedRewardLoopManager

    tracked: list[Any] = []
    original = Tracking.__init__

    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        tracked.append(kwargs.get("config"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(Tracking, "__init__", recording_init)
    config = make_config(
        char_tokenizer_dir,
        server.url,
        tmp_path,
        "trainer.total_training_steps=1",
        "reward.reward_manager.name=async_remote",
        "~reward.async_reward.judge",
        f"+reward.async_reward.remote.url={server.url}/score",
        "+reward.async_reward.remote.headers.X-Api-Key=hdr-secret-in-config",
        "+ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN=hf-secret-in-runtime-env",
    )
    remote_rewards = PipelinedRewardLoopManager(config)
    try:
        run_ours(config, char_tokenizer, remote_rewards)
    finally:
        remote_rewards.close()
    [logged_config] = tracked
    assert "hdr-secret-in-config" not in repr(logged_config)
    assert "hf-secret-in-runtime-env" not in repr(logged_config)
    assert logged_config["reward"]["async_reward"]["remote"]["headers"] == {"X-Api-Key": "<hidden>"}
    assert logged_config["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]["HF_TOKEN"] == "<hidden>"
    assert logged_config["data"]["train_batch_size"] == PROMPTS  # the rest is logged as it was


def test_one_step_off_policy_overlaps_and_resumes_without_skipping(
    rewards, server, char_tokenizer, char_tokenizer_dir, tmp_path, logged
):
    def config(*extra: str) -> DictConfig:
        return make_config(
            char_tokenizer_dir,
            server.url,
            tmp_path,
            "+async_reward.pipeline.one_step_off_policy=true",
            "trainer.total_training_steps=4",
            "trainer.save_freq=2",
            *extra,
        )

    first = run_ours(config(), char_tokenizer, rewards)
    first_logs = train_steps(logged)
    generations = [c for c in first.rollout.calls if not c.validate]
    updates = first.actor.update_calls
    assert len(generations) == len(updates) == 4
    # Batch k+1 is generated (with the pre-update policy) before the first update on batch k.
    for k in range(3):
        assert generations[k + 1].end <= updates[k][0].start
    assert [g.weights_version for g in generations] == [0, 0, 1, 2]
    assert first.sync.syncs == [0, 0, 1, 2]  # one sync per generation, none while training
    assert [m["off_policy/staleness"] for m in first_logs] == [0, 1, 1, 1]
    assert [m["off_policy/policy_version"] for m in first_logs] == [0, 0, 1, 2]
    prompts = [sorted(set(g.prompt_indices)) for g in generations]
    for generation, call in zip(generations, updates, strict=True):  # each sample once, in its step
        expected = [f"{i}:{k}" for i in dict.fromkeys(generation.prompt_indices) for k in range(GROUP)]
        assert sorted(s for mini_batch in call for s in mini_batch.sample_ids) == sorted(expected)

    # Resume from step 2 (saved while batch 3 was already drawn): batches 3 and 4 again, no others.
    logged.clear()
    checkpoint = tmp_path / "checkpoints" / "global_step_2"
    resumed = run_ours(
        config("trainer.resume_mode=resume_path", f"trainer.resume_from_path={checkpoint}"),
        char_tokenizer,
        rewards,
    )
    resumed_logs = train_steps(logged)
    assert [m["training/global_step"] for m in resumed_logs] == [3, 4]
    assert [m["off_policy/staleness"] for m in resumed_logs] == [0, 1]
    resumed_prompts = [sorted(set(g.prompt_indices)) for g in resumed.rollout.calls]
    assert resumed_prompts == prompts[2:]
    assert [g.weights_version for g in resumed.rollout.calls] == [2, 2]  # batch 3 regenerated on-policy
    seen = [i for batch in prompts[:2] + resumed_prompts for i in batch]
    assert len(set(seen)) == len(seen) == 4 * PROMPTS  # distinct dataset rows: none twice, none lost


def _wait_for(condition: Any, timeout_s: float = 60.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passes (False): a bound that only a
    broken schedule reaches, never a guess at how long the right one takes."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def test_the_judge_is_busy_while_the_actor_updates_in_the_pipelined_modes(
    rewards, server, char_tokenizer, char_tokenizer_dir, tmp_path, logged, monkeypatch
):
    """Why the trainer blocks less (structural, not timed: a loaded machine stretches any ratio of
    wall-clock times). At the start of each actor update the judge server is asked what it is doing:
    in the baseline it serves nothing (every reward is in before training starts); in the mini-batch
    mode each step's first update starts while requests of that step are still unanswered; in the
    off-policy modes the next batch's requests reach the judge while this one trains.

    Made causal rather than a race with the judge's latency: in the mini-batch mode the judge answers
    only 14 of a step's 16 requests (``hold``; any 14 complete at least two of its four groups, one
    mini-batch) until the step's first update, which waits (bounded) until the judge holds one of the
    other two, then lets them through with the next step's 14. In the off-policy modes a step's
    first update waits (bounded) until requests beyond the step's own 16 have reached the judge: the
    next batch's, which a schedule that generated it only after this update could never send (it
    reaches the 60 s bound and records 0). A mini-batch schedule that waited for its whole batch
    before updating would never get the two held answers: it stalls until the test's timeout."""
    from tests.support.trainer_standins import ActorStandIn

    server.update_config(latency_ms=[300.0, 300.0], capacity=4)  # 16 samples: four rounds of 0.3 s
    samples = PROMPTS * GROUP  # judge requests a step
    delays = StageDelays(generate=0.05, log_prob=0.0, optimizer_step=0.0)
    judging_at_update: list[int] = []
    mode_flags: list[str] = []
    total_steps = [2]
    update_actor = ActorStandIn.update_actor

    def recording_update(self: Any, td: Any) -> Any:
        calls_per_step = PROMPTS // MINI if mini in mode_flags else 1
        call = len(judging_at_update)
        step, first = call // calls_per_step, call % calls_per_step == 0
        if off in mode_flags and first and step < total_steps[0] - 1:  # the next batch is sent meanwhile
            sent = samples * (step + 1)  # this step's requests and those before
            arrived = _wait_for(lambda: server.stats()["requests_total"] > sent)
            judging_at_update.append(server.stats()["requests_total"] - sent if arrived else 0)
        elif mini in mode_flags and off not in mode_flags and first:  # this step's last two, held
            judging_at_update.append(
                server.stats()["held"] if _wait_for(lambda: server.stats()["held"]) else 0
            )
            server.update_config(hold=samples)  # those two, then the next step's first 14
        else:
            judging_at_update.append(server.stats()["in_flight_total"])
        return update_actor(self, td)

    monkeypatch.setattr(ActorStandIn, "update_actor", recording_update)
    mini, off = "+async_reward.pipeline.mini_batch=true", "+async_reward.pipeline.one_step_off_policy=true"
    seen = {}
    for mode, flags in {
        "baseline": [],
        "mini_batch": [mini],
        "one_step_off": [off],
        "both": [mini, off],
    }.items():
        logged.clear()
        judging_at_update.clear()
        mode_flags[:] = flags
        # "both" trains 3 steps, so that its first two steps each have a next batch to overlap.
        total_steps[0] = steps_run = 3 if mode == "both" else 2
        assert _wait_for(lambda: server.stats()["in_flight_total"] == 0)  # nothing left of the last run
        server.reset()
        server.update_config(hold=samples - 2 if flags == [mini] else False)
        config = make_config(
            char_tokenizer_dir, server.url, tmp_path, f"trainer.total_training_steps={steps_run}", *flags
        )
        try:
            run_ours(config, char_tokenizer, rewards, delays=delays)
        finally:
            server.update_config(hold=False)
        steps = train_steps(logged)
        assert all(m["reward/status_ok"] == PROMPTS * GROUP for m in steps)
        calls_per_step = PROMPTS // MINI if mini in flags else 1
        assert len(judging_at_update) == steps_run * calls_per_step, (mode, judging_at_update)
        seen[mode] = [
            judging_at_update[k : k + calls_per_step]
            for k in range(0, steps_run * calls_per_step, calls_per_step)
        ]
    assert seen["baseline"] == [[0], [0]], seen
    # Mini-batches: each step's first update runs while the step's later samples are judged.
    assert all(step[0] > 0 for step in seen["mini_batch"]), seen
    # Off-policy: a step trains while the next step's batch is judged; in "both", every step that
    # has a next one (that its mini-batches overlap their own step's scoring is the mini-batch mode's
    # check above, on the same chunking code).
    assert seen["one_step_off"][0][0] > 0, seen
    assert all(step[0] > 0 for step in seen["both"][:-1]), seen


# -- start-up checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.train_batch_size=5"], "multiple of actor_rollout_ref.actor.ppo_mini_batch_size"),
        (["algorithm.adv_estimator=reinforce_plus_plus"], "group-local advantage estimator"),
        (["actor_rollout_ref.actor.ppo_epochs=2"], "allow_ppo_epochs_per_chunk"),
        # A judge server and the judge verl serves in the job: refused before the trainer's own checks.
        (["reward_model.enable=true"], "would have two judges"),
        (["+async_reward.pipeline.chunk_timeout=5"], "valid keys"),
        (["+reward.async_reward.pipeline.mini_batch=true"], "put the trainer's pipeline settings under"),
    ],
)
def test_bad_settings_fail_at_start_up(overrides, message, char_tokenizer, char_tokenizer_dir, tmp_path):
    from async_reward.legacy.main_ppo import prepare_config
    from async_reward.legacy.trainer import PipelinedRayPPOTrainer

    config = make_config(
        char_tokenizer_dir,
        "http://127.0.0.1:1",
        tmp_path,
        "+async_reward.pipeline.mini_batch=true",
        *overrides,
    )
    with pytest.raises(ConfigError, match=message):
        prepare_config(config)  # the entry point, before Ray starts (legacy keys migrated first)
    if not any(o.startswith("reward_model.") for o in overrides):
        with pytest.raises(ConfigError, match=message):  # and the trainer, before datasets or workers
            PipelinedRayPPOTrainer(
                config=config, tokenizer=char_tokenizer, role_worker_mapping={}, resource_pool_manager=None
            )


def test_epochs_per_chunk_and_off_policy_correction_settings(char_tokenizer_dir, tmp_path):
    from async_reward.training.config import load_pipeline_config

    base = ("+async_reward.pipeline.mini_batch=true", "actor_rollout_ref.actor.ppo_epochs=2")
    config = make_config(
        char_tokenizer_dir,
        "http://x",
        tmp_path,
        *base,
        "+async_reward.pipeline.allow_ppo_epochs_per_chunk=true",
    )
    assert load_pipeline_config(config).mode == "mini_batch"
    config = make_config(
        char_tokenizer_dir,
        "http://x",
        tmp_path,
        "+async_reward.pipeline.one_step_off_policy=true",
        "algorithm.rollout_correction.rollout_is=token",
        "actor_rollout_ref.rollout.calculate_log_probs=false",
    )
    with pytest.raises(ConfigError, match="calculate_log_probs"):
        load_pipeline_config(config)


def test_entry_point_prepares_verl_config_for_our_task_runner(char_tokenizer_dir, tmp_path, monkeypatch):
    """What ``run`` hands verl's ``run_ppo``; the actor side is tested through Ray in
    ``test_entry_point.py``."""
    from async_reward.legacy import main_ppo
    from async_reward.legacy.task_runner import PipelinedTaskRunnerActor

    config = make_config(
        char_tokenizer_dir,
        "http://x",
        tmp_path,
        "reward_model.reward_manager=async_naive",
        "~reward.async_reward.judge",  # make_config's llm_judge section: async_naive refuses it
        # verl's own validate_config wants these; the stand-ins never needed them.
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        "trainer.n_gpus_per_node=1",
    )
    # Only the legacy line names the manager (reward.reward_manager.name at verl's default): a legacy
    # key and a different new one would be a conflict, refused.
    config.reward.reward_manager.name = "naive"
    captured = {}
    monkeypatch.setattr(
        main_ppo, "run_ppo", lambda cfg, task_runner_class: captured.update(cfg=cfg, cls=task_runner_class)
    )
    assert main_ppo.run(config) is None
    prepared = captured["cfg"]
    assert captured["cls"] is PipelinedTaskRunnerActor
    assert prepared.trainer.use_v1 is False
    assert prepared.reward.reward_manager.name == "async_naive"  # legacy key honoured
    assert (
        prepared.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook
        == "async_reward.wiring.integration.setup_worker"
    )


@pytest.mark.parametrize("script", ["run_gsm8k_grpo_fsdp2.sh", "run_gsm8k_grpo_megatron.sh"])
def test_example_scripts_compose_and_pass_start_up_checks(script, tmp_path):
    """The GPU example scripts' overrides exist in verl 0.9.1's configs and pass our checks (which load
    the reward file the script names, as the driver does before any worker starts)."""
    import os
    import subprocess

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from async_reward.legacy.main_ppo import prepare_config
    from tests.conftest import VERL_CONFIG_DIR

    path = Path(__file__).parents[2] / "examples" / script
    reward_file = tmp_path / "reward.py"
    reward_file.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
    )
    # Print the command line instead of training.
    env = {**os.environ, "PYTHON": "printf %s\\n", "REWARD_FILE": str(reward_file)}
    args = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, check=True).stdout
    module, *overrides = args.splitlines()[1:]
    assert module == "async_reward.legacy.main_ppo"
    names = [o.split("=", 1)[1] for o in overrides if o.startswith("--config-name=")]
    overrides = [o for o in overrides if not o.startswith("--")]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        config = prepare_config(compose(config_name=(names or ["ppo_trainer"])[0], overrides=overrides))
    assert config.reward.reward_manager.name == "async_naive" and config.reward.num_workers == 8
    assert config.data.train_batch_size == 1024 and config.actor_rollout_ref.rollout.n == 5
    assert config.actor_rollout_ref.actor.ppo_mini_batch_size == 256
    assert config.async_reward.pipeline.mini_batch and config.async_reward.pipeline.one_step_off_policy
    assert config.actor_rollout_ref.actor.strategy == ("megatron" if names else "fsdp2")
