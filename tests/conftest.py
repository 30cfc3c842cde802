"""Shared fixtures: a locally built tokenizer, real verl configs and batches, one Ray cluster per session,
and the local judge/reward server on loopback."""

from __future__ import annotations

import functools
import importlib.util
import os
import pickle
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf, open_dict

#: Prints the Ray workers, subprocesses and slowest files at the end of every run (tests/support/budget.py).
pytest_plugins = ["tests.support.budget"]

# Bytecode is written for this run (src/, the test modules as pytest rewrites them) even where the
# machine sets PYTHONDONTWRITEBYTECODE (this one does): the first process to import a module compiles
# it once, and the ~170 processes after it (xdist workers, Ray workers, the CLI and main_ppo
# subprocesses, which inherit the environment) read it instead of compiling async_reward again.
# Measured 2026-11-30: collecting the suite 18.0 -> 12.1 CPU-s a process, `import async_reward`
# 7.35 -> 7.0. Site-packages are compiled at install (scripts/install_venv.py).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# One intra-op thread for torch (and the subprocesses and Ray workers that inherit the environment):
# the tests' tensors are tiny, and on a busy 2-core machine torch's extra threads spin against the
# other processes. Measured on test_toy.py: 207 s against 65 s at a load of 12-17; 27 s either way on
# a quiet machine, so it costs nothing there.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Ray's log monitor (one per cluster) globs the session's log directory for new worker logs on every
# pass, ten a second, until there are 1000 files; the suite starts ~35 workers a cluster. At 0 it looks
# for new files every 0.5 s (LOG_NAME_UPDATE_INTERVAL_S) and still reads the open ones every pass.
os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
# Ray starts two workers ahead for the first driver of a cluster; no actor of the suite ever took one
# (each actor needs a process of its own), so each cluster paid 2-3 CPU-s for two idle imports of Ray.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
# Ray's dashboard agent (one per cluster, started even without the dashboard) walks every worker
# process with psutil for node stats every 5 s; nothing in the suite reads them, so once a minute.
os.environ.setdefault("REPORTER_UPDATE_INTERVAL_MS", "60000")

#: This folder: the test files are named by their path under it.
TESTS = Path(__file__).resolve().parent
#: verl's trainer configs, found without importing verl (6 CPU-s): pytest-xdist's controller loads this
#: file but runs no test.
VERL_CONFIG_DIR = str(Path(importlib.util.find_spec("verl").origin).parent / "trainer" / "config")  # type: ignore[arg-type, union-attr]


def build_tokenizer(directory: Path) -> Any:
    from async_reward.testing import build_tiny_tokenizer

    return build_tiny_tokenizer(directory)


# -- markers for the inner loop (``make test-fast`` deselects both): ``ray`` is set here on every test
# that needs the session's Ray cluster, ``subprocess`` by hand on tests that start a Python interpreter,
# and ``_python_subprocesses_are_marked`` fails an unmarked test that starts one, so the marker stays true.


#: In-process verl v1 training files: each pytest process that runs one starts verl's v1 actors
#: (reward and agent-loop workers, load balancer, servers, TransferQueue), about 80 CPU-s, kept warm
#: for the session (tests/support/warm_actors.py). ``make test`` (``--dist loadgroup``) hands them to
#: one process as one unit, so those actors start once per run, not once per process. All of them in
#: one unit (2026-11-29): 318 CPU-s against 454 for the same files spread over three processes (both
#: runs beside other work).
V1_WARM_FILES = (
    "judge/in_job/test_in_job.py",  # its v1 modes start the same agent-loop, router and TransferQueue actors
    "v1/pipelined/test_pipelined.py",
    "v1/pipelined/test_edges.py",
    "v1/decoupled/test_decoupled.py",
    "bench/test_toy_v1_parity.py",
    "judge/group/test_group_v1.py",
    "v1/test_v1_integration.py",
    "v1/test_separate_async.py",
    "v1/test_reward_failover.py",
    "v1/test_transfer_queue.py",
    "managers/test_composite_v1.py",
    "wiring/test_warm_actors.py",  # the warm pool's own tests: the same reward workers and TransferQueue
)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups set here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)
    # The long files first (each file keeps its own order): `make test` hands whole files to its pytest
    # processes in this order, so no long file starts last while the other processes sit idle. The
    # longest measured come first in their order, then the rest by their count of Ray/subprocess tests.
    slow_tests: Counter[Path] = Counter(
        item.path for item in items if item.get_closest_marker("ray") or item.get_closest_marker("subprocess")
    )

    def rank(item: pytest.Item) -> tuple[int, int]:
        name = item.path.relative_to(TESTS).as_posix()
        return (
            (LONGEST_FILES.index(name), 0)
            if name in LONGEST_FILES
            else (len(LONGEST_FILES), -slow_tests[item.path])
        )

    items.sort(key=rank)


#: The test files (paths under tests/) that cost most in a full run (CPU-seconds of a file's
#: processes, as the budget prints them at the end of `make test`, 2-core machine, 2026-11-29),
#: costliest first.
#: ``test_job_admission.py`` (2026-11-29: 190-230 s, most of it waiting for heartbeats and broker
#: restarts) had no place here, so it was handed out after every listed file and could run last, alone.
LONGEST_FILES = [
    "end_to_end/test_v1_pipelined_entry.py",
    "judge/in_job/test_in_job.py",  # the first of V1_WARM_FILES: their unit goes out second
    "legacy/test_bench.py",
    "legacy/test_entry_point.py",
    "managers/test_composite.py",
    "config/test_legacy_keys.py",
    "_core/test_job_admission.py",
    "v1/pipelined/test_edges.py",
    "v1/pipelined/test_pipelined.py",
    "judge/group/test_group_v1.py",
    "v1/test_v1_integration.py",
    "v1/decoupled/test_decoupled.py",
    "wiring/test_warm_actors.py",
    "legacy/test_package_structure.py",
    "config/test_config_validation.py",
    "end_to_end/test_verl_integration.py",
    "v1/test_separate_async.py",
    "legacy/test_exclusion.py",
    "legacy/test_trainer.py",
    "wiring/test_worker_imports.py",
    "v1/test_reward_failover.py",
    "v1/test_transfer_queue.py",
    "managers/test_composite_v1.py",
    # last of V1_WARM_FILES: one of its runs ends with the benchmark's own clean-up, which kills the
    # warm reward and agent-loop workers that the unit's other files would otherwise start again
    "bench/test_toy_v1_parity.py",
]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test`` (``--dist loadgroup`` or ``loadfile``): one work unit per test file, so a module's
    fixtures (a ``main_ppo`` sweep, a served judge) are built in one process only, and one unit for the
    :data:`V1_WARM_FILES`. pytest-xdist's own ``loadgroup`` reads the group from a rewritten
    ``item._nodeid``, which pytest 9's ``nodeid`` no longer reads: every test went out on its own, the
    sweeps ran once per process, and the three processes ended on the same file."""
    if config.getvalue("dist") not in ("loadgroup", "loadfile"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "v1-warm-actors" if path.removeprefix("tests/") in V1_WARM_FILES else path

    return FileScheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """Keep the order :func:`pytest_collection_modifyitems` gives the files under ``--dist loadfile``:
    pytest-xdist reorders files by their count of tests unless told not to, which started the long Ray
    files last (a run's processes ended at 552, 572 and 611 s, the last one running
    test_v1_pipelined_entry.py, 173 s of it, alone)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _starts_python(args: Any) -> bool:
    """Whether ``subprocess.Popen(args)`` starts a Python interpreter (or our console script)."""
    argv = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
    if not argv:
        return False
    program = os.fsdecode(argv[0]).split()[0] if argv[0] else ""
    name = os.path.basename(program)
    return (
        name.startswith("python")
        or name == "async-reward"
        or os.path.realpath(program) == os.path.realpath(sys.executable)
    )


@pytest.fixture(autouse=True)
def _python_subprocesses_are_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test not marked ``subprocess`` (or ``ray``) that starts a Python interpreter fails, naming the
    marker: ``make test-fast`` relies on the markers to leave the slow tests out."""
    if request.node.get_closest_marker("subprocess") or request.node.get_closest_marker("ray"):
        return
    original = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        if _starts_python(args):
            raise AssertionError(
                f"{request.node.nodeid} starts a Python subprocess ({args!r}): mark it "
                "@pytest.mark.subprocess so that `make test-fast` leaves it out"
            )
        original(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)


@pytest.fixture(autouse=True)
async def _close_http_sessions() -> AsyncIterator[None]:
    """Close the test loop's aiohttp session: one left to the garbage collector warns from ``__del__``,
    and a warning formatted while Python 3.11 is inside ``ast.parse`` (pytest importing a module
    late) fails the run with "AST constructor recursion depth mismatch"."""
    yield
    from async_reward._core.http import close_sessions

    await close_sessions()


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(directory)
    return directory


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def make_batch(
    tokenizer: Any,
    rows: list[dict[str, Any]],
    *,
    prompt_length: int = 48,
    response_length: int = 64,
    group_size: int = 1,
) -> Any:
    """A real verl ``DataProto`` shaped like a rollout (``async_reward.testing.rollout_batch``), from rows.

    Each row: ``prompt``, ``response`` (text) or ``response_ids``, ``ground_truth``, optional
    ``data_source``, ``uid``, ``extra_info``. Rows without ``uid`` get one per ``group_size`` rows.
    Prompts and responses longer than the lengths are truncated, as a rollout's limits do.
    """
    from async_reward.testing import rollout_batch

    group_uids = [uuid.uuid4().hex for _ in range(0, len(rows), group_size)]
    return rollout_batch(
        tokenizer,
        [row.get("prompt", "question") for row in rows],
        [row["response_ids"] if row.get("response_ids") is not None else row["response"] for row in rows],
        [row.get("ground_truth") for row in rows],
        uids=[row.get("uid", group_uids[i // group_size]) for i, row in enumerate(rows)],
        data_source=[row.get("data_source", "test") for row in rows],
        extra_infos=[row.get("extra_info", {"index": i}) for i, row in enumerate(rows)],
        prompt_length=prompt_length,
        response_length=response_length,
        truncate=True,
    )


@pytest.fixture(scope="session")
def batch_factory(tokenizer: Any) -> Callable[..., Any]:
    return lambda rows, **kw: make_batch(tokenizer, rows, **kw)


def compose_verl_config(overrides: list[str] | None = None) -> DictConfig:
    """verl's real ``ppo_trainer`` config, composed by hydra as ``main_ppo`` would (a copy of the one
    composed for the same overrides earlier in the process: composing costs a quarter of a second,
    and tests change the config they get)."""
    return copy_config(_composed(tuple(overrides or ())))


def copy_config(config: DictConfig) -> DictConfig:
    """A deep copy of an OmegaConf config, flags and parents included. A pickle round trip: 5 ms for
    verl's config where ``copy.deepcopy`` or ``OmegaConf.create`` of its container take 38 ms, and the
    suite copies it a few thousand times (py-spy, 2026-11-28)."""
    return pickle.loads(pickle.dumps(config, protocol=pickle.HIGHEST_PROTOCOL))


@functools.cache
def _composed(overrides: tuple[str, ...]) -> DictConfig:
    """Value overrides (``key=v``, ``+key=v``, ``++key=v``, ``~key``) are applied to a copy of the config
    composed without overrides, by hydra's own ``_apply_overrides_to_config``, the step its compose
    takes for them after loading the defaults; anything else (a config group, a hydra key, a sweep)
    goes through hydra's whole compose. Why: composing parses verl's YAML tree again each time (~0.4
    CPU-seconds), and the tests compose a few hundred distinct override lists (a third of
    ``tests/v1/pipelined/test_pipelined.py``'s CPU time, py-spy 2026-11-28). ``ASYNC_REWARD_CHECK_COMPOSE=1``
    composes each list both ways and fails on any difference; ``tests/managers/test_compose_fast_path.py``
    checks a sample of every override form."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    value_overrides = _value_overrides(overrides) if overrides else None
    if value_overrides is None:
        return _hydra_compose(overrides)
    config = copy_config(_composed(()))
    ConfigLoaderImpl._apply_overrides_to_config(value_overrides, config)
    if os.environ.get("ASYNC_REWARD_CHECK_COMPOSE"):
        assert_same_config(config, _hydra_compose(overrides), overrides)
    return config


def _hydra_compose(overrides: tuple[str, ...]) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


def _value_overrides(overrides: tuple[str, ...]) -> list[Any] | None:
    """hydra's parsed ``overrides`` if every one sets, adds or deletes a value (no config group of verl's
    tree, no ``hydra`` key, no sweep, no package ``@``); else None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
    for override in parsed:
        parts = override.key_or_group.replace(".", "/").split("/")
        group_path = Path(VERL_CONFIG_DIR, *parts)
        if (
            override.is_sweep_override()
            or override.package is not None
            or parts[0] == "hydra"
            or group_path.is_dir()
            or group_path.with_suffix(".yaml").is_file()
        ):
            return None
    return parsed


def assert_same_config(fast: DictConfig, composed: DictConfig, overrides: tuple[str, ...]) -> None:
    """The two configs are the same: values, interpolations (unresolved) and the struct flag."""
    assert OmegaConf.to_yaml(fast) == OmegaConf.to_yaml(composed), overrides
    assert OmegaConf.is_struct(fast) == OmegaConf.is_struct(composed), overrides


@pytest.fixture(scope="session")
def verl_config_factory(tokenizer_dir: Path) -> Callable[..., DictConfig]:
    composed = compose_verl_config([f"actor_rollout_ref.model.path={tokenizer_dir}"])
    # Without hydra's struct flag, as tests have always had it; copied per call (copy_config).
    base = OmegaConf.create(OmegaConf.to_container(composed, resolve=False))

    def factory(
        manager: str = "async_naive",
        async_reward: dict[str, Any] | None = None,
        num_workers: int = 1,
        custom_reward_function: dict[str, Any] | None = None,
    ) -> DictConfig:
        config = copy_config(base)
        with open_dict(config):
            config.reward.reward_manager.name = manager
            config.reward.num_workers = num_workers
            config.reward.async_reward = async_reward or {}
            if custom_reward_function:
                config.reward.custom_reward_function.update(custom_reward_function)
        return config

    return factory


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster for the whole session, with our worker setup hook; verl's reward-loop and
    agent-loop workers built in this process are kept warm between tests (tests/support/warm_actors.py)."""
    import ray

    from async_reward.wiring.integration import ray_runtime_env
    from tests.support import warm_actors

    ray.init(
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=ray_runtime_env({"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}),
    )
    warm_actors.install()
    yield
    _SESSION_TQ.close()
    warm_actors.WARM.close()
    ray.shutdown()


def shutdown_reward_loop(manager: Any) -> None:
    """Hand a verl ``RewardLoopManager``'s workers back to the warm pool (tests/support/warm_actors.py), which
    keeps them for the next manager of the same class and slot, or kills them if they are not its."""
    from tests.support.warm_actors import release

    release(manager.reward_loop_workers)


@pytest.fixture
def reward_loop(ray_cluster: None) -> Iterator[Callable[[DictConfig], Any]]:
    """Build verl's real ``RewardLoopManager`` (Ray workers) and tear it down after the test."""
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    created: list[Any] = []

    def build(config: DictConfig) -> Any:
        manager = RewardLoopManager(config)
        created.append(manager)
        return manager

    yield build
    for manager in created:
        shutdown_reward_loop(manager)


def judge_server_config() -> Any:
    """The configuration the session's judge server starts with, and is put back to before each test."""
    from async_reward.tools.devserver import DevServerConfig

    return DevServerConfig(seed=0)


def reset_judge_server(server: Any) -> None:
    """Put every runtime knob (``RUNTIME_CONFIG_KEYS``) back to its start value and zero the counters.

    Every key is reset, not a hand-kept list of them: a knob a test turns (``retry_after_s``,
    ``api_key``, or one added later) must not leak into the tests after it."""
    from async_reward.tools.devserver.config import RUNTIME_CONFIG_KEYS

    start = judge_server_config()
    server.update_config(**{key: getattr(start, key) for key in RUNTIME_CONFIG_KEYS})
    server.reset()


@pytest.fixture(scope="session")
def judge_server() -> Iterator[Any]:
    """The local OpenAI-compatible judge + reward service, shared by the session (reset per use)."""
    from async_reward.tools.devserver import ThreadedDevServer

    server = ThreadedDevServer(judge_server_config())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def server(judge_server: Any) -> Any:
    """The session's server with counters and every runtime knob reset for this test."""
    reset_judge_server(judge_server)
    return judge_server


# -- verl v1 training on CPU (tests/support/v1_standins.py): per test module, since each Ray process costs
# seconds to start and each module's runs share them


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model directory verl's ``HFModelConfig`` accepts (tokenizer, chat template, config)."""
    from tests.support.v1_standins import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("v1_model"))


@pytest.fixture(scope="session")
def rollout(model_dir: Path, ray_cluster: None) -> Iterator[Any]:
    """The scripted token server behind verl's real load balancer (``ScriptedRollout``), shared by the
    session's runs: each run starts it with its own script (``start`` resets its state)."""
    from tests.support.v1_standins import ScriptedRollout

    scripted = ScriptedRollout(model_dir)
    yield scripted
    scripted.close()


class _SessionTransferQueue:
    """One TransferQueue (controller + one storage unit, as ``TaskRunnerV1`` starts it) for the
    pytest process, opened when a test needs it. TransferQueue names its actors in a fixed namespace
    of the cluster, so it is closed before a ``main_ppo`` subprocess joins the cluster
    (:func:`cluster_env`): verl's task runner there opens and closes its own."""

    def __init__(self) -> None:
        self.open = False

    def ensure_open(self) -> None:
        """Open it, or reopen it when code under test closed it behind the flag's back (a
        ``tq.close()`` in this process leaves TransferQueue's client ``None``, and every later call
        of the module's tests failed with "has not been initialized")."""
        import transfer_queue as tq
        from transfer_queue import interface

        if self.open and interface._TQ_CLIENT is None:
            self.open = False
        if not self.open:
            _wait_until_no_transfer_queue_runs()
            tq.init({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}})
            self.open = True

    def close(self) -> None:
        if self.open:
            import transfer_queue as tq

            tq.close()
            self.open = False


_SESSION_TQ = _SessionTransferQueue()


def _wait_until_no_transfer_queue_runs(timeout_s: float = 60.0) -> None:
    """Wait for the cluster's TransferQueue controller name to be free. A ``main_ppo`` subprocess's
    task runner kills its controller as the job ends, and ``ray.kill`` only sends the request: a
    ``tq.init`` in that window attaches to the dying controller instead of starting ours."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.get_actor("TransferQueueController", namespace="transfer_queue")
        except ValueError:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"a TransferQueueController still runs on the test cluster {timeout_s:.0f} s after this "
                "process closed its own: a job started by a test did not close its TransferQueue"
            )
        time.sleep(0.1)


@pytest.fixture(scope="module")
def transfer_queue(ray_cluster: None) -> None:
    """The process's TransferQueue, open for the module (see :class:`_SessionTransferQueue`; a module
    that uses it starts no ``main_ppo`` subprocess); each run leaves its ``train`` partition empty
    (``run_v1_training``)."""
    _SESSION_TQ.ensure_open()


def cluster_env() -> dict[str, str]:
    """The environment for a ``main_ppo`` subprocess that joins the session's Ray cluster (``RAY_ADDRESS``),
    with this process's TransferQueue closed first (the subprocess's task runner opens its own)."""
    import ray

    _SESSION_TQ.close()
    return {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "HYDRA_FULL_ERROR": "1"}
