"""The suite's budget, printed at the end of every run: Ray worker processes and Python subprocesses
started, and the slowest test files, so that growth is visible in every ``make test``.

Most of the suite's CPU goes to starting processes (each Ray worker imports torch and verl), so the
worker count is the number to watch. It is read from the session's Ray cluster: every worker process
(an actor, a task worker, and those of a ``main_ppo`` subprocess that joins the cluster) leaves one
``python-core-worker-*.log`` in the session's log directory (Ray moves a dead worker's logs to
``old/``), counted after each test and charged to its file. A Python subprocess a test starts (the
CLI, ``main_ppo``) is counted where it is started (``subprocess.Popen``); Ray's own daemons are not.

Under pytest-xdist each process counts its own and hands its counts to the controller
(``workeroutput``), which prints the total; test time per file is summed on the controller from the
reports of every phase (setup, call, teardown), so a module fixture's set-up counts for its file.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

#: How many files the summary lists (``ASYNC_REWARD_BUDGET_FILES`` sets another number, e.g. all of
#: them while looking for what to cut).
SLOWEST_SHOWN = int(os.environ.get("ASYNC_REWARD_BUDGET_FILES", "10"))
#: The wall time a whole run may take before its summary says, loudly, that it is over budget
#: (``ASYNC_REWARD_TEST_BUDGET_S`` sets another). 540 s of pytest keeps a fresh clone's ``make test``
#: (the virtualenv about 40 s more) under the project's 10 minutes on a 2-core machine. Over it, the
#: run still passes or fails on its tests alone: a loaded machine must not turn CI red, but growth
#: must be seen the day it happens.
WALL_BUDGET_S = float(os.environ.get("ASYNC_REWARD_TEST_BUDGET_S", "540"))
_WORKER_LOG_PREFIX = "python-core-worker-"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ProcessTreeCPU:
    """CPU seconds this process and everything under it have used: its Ray cluster (the raylet and
    GCS it started, every worker the raylet forked, the actors of a ``main_ppo`` subprocess that
    joined it) and its subprocesses, including those that have ended. The suite is CPU-bound, so CPU
    seconds, not a file's wall time (which grows with whatever runs beside it), say what a file costs.

    Read from ``/proc`` (0.0 where there is none) by a daemon thread every :data:`SAMPLE_S`: the raylet
    does not wait for the workers it kills (so their time never reaches its ``cutime``), and a worker's
    time can only be read while it lives. A process that lives less than a sample is missed; one that
    ends loses at most its last sample's worth. A scan of ``/proc`` takes a few milliseconds."""

    SAMPLE_S = 1.0

    def __init__(self, root: int | None = None) -> None:
        self.root = os.getpid() if root is None else root
        self._seen: dict[tuple[int, int], float] = {}
        """(pid, start time) -> the CPU seconds last read for it."""
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None and os.path.isdir("/proc"):
            self._thread = threading.Thread(target=self._run, name="budget-cpu-sampler", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            self.sample()
            time.sleep(self.SAMPLE_S)

    def sample(self) -> None:
        children: dict[int, list[int]] = {}
        read: dict[int, tuple[int, float]] = {}
        try:
            entries = os.listdir("/proc")
        except OSError:
            return
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as stream:
                    stat = stream.read()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            pid = int(entry)
            children.setdefault(int(fields[1]), []).append(pid)
            read[pid] = (int(fields[19]), (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS)  # utime+stime
        stack = [self.root]
        with self._lock:
            while stack:
                pid = stack.pop()
                stack.extend(children.get(pid, ()))
                if pid in read:
                    started, cpu = read[pid]
                    self._seen[(pid, started)] = cpu

    def total_s(self) -> float:
        """CPU seconds used so far by the tree, ended processes included (read now)."""
        self.sample()
        with self._lock:
            return sum(self._seen.values())


def _ray_worker_logs() -> int:
    """Worker processes the Ray cluster of this process has started so far (0 without one)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return 0
    node = getattr(ray._private.worker, "_global_node", None)
    if node is None:
        return 0
    logs = Path(node.get_session_dir_path()) / "logs"
    return sum(
        1
        for directory in (logs, logs / "old")
        if directory.is_dir()
        for name in os.listdir(directory)
        if name.startswith(_WORKER_LOG_PREFIX)
    )


def _ray_actor_classes() -> Counter[str]:
    """Actors this process's Ray cluster has started, by class (Ray writes ``:actor_name:<class>`` at
    the top of an actor's ``worker-*.out``)."""
    ray = sys.modules.get("ray")
    classes: Counter[str] = Counter()
    if ray is None or not ray.is_initialized():
        return classes
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    for directory in (logs, logs / "old"):
        for path in directory.glob("worker-*.out") if directory.is_dir() else ():
            with path.open(errors="replace") as stream:
                for line in itertools.islice(stream, 5):
                    if line.startswith(":actor_name:"):
                        classes[line.strip().removeprefix(":actor_name:")] += 1
                        break
    return classes


class MachineLoad:
    """What the whole machine did during the run, read from ``/proc`` (Linux; zeros elsewhere): how
    busy its CPUs were, how much of the time some task waited for a CPU (``/proc/pressure/cpu``), and
    the hypervisor's steal. A run over budget on a machine that was also busy with other work is told
    apart from a suite that grew."""

    def __init__(self) -> None:
        self.started = self._sample()

    @staticmethod
    def _sample() -> tuple[float, list[int], int]:
        try:
            ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except OSError:
            ticks = []
        try:
            line = Path("/proc/pressure/cpu").read_text().split("\n", 1)[0]
            stall_us = int(line.rsplit("total=", 1)[1])
        except (OSError, IndexError, ValueError):
            stall_us = 0
        return time.time(), ticks, stall_us

    def since_start(self) -> str:
        """One line: the CPUs' busy share, CPU pressure and steal since the run started."""
        (t0, ticks0, stall0), (t1, ticks1, stall1) = self.started, self._sample()
        if not ticks0 or len(ticks0) != len(ticks1):
            return "machine load: not readable here"
        delta = [b - a for a, b in zip(ticks0, ticks1, strict=True)]
        total = sum(delta) or 1
        idle = delta[3] + (delta[4] if len(delta) > 4 else 0)  # idle + iowait
        steal = delta[7] if len(delta) > 7 else 0
        wall = max(t1 - t0, 1e-9)
        return (
            f"machine load over the run: {os.cpu_count()} CPUs {100 * (total - idle) / total:.0f} % busy, "
            f"some task waiting for a CPU {100 * (stall1 - stall0) / 1e6 / wall:.0f} % of the time, "
            f"steal {100 * steal / total:.0f} %"
        )


class _Counts:
    """This process's counts, per test file."""

    def __init__(self) -> None:
        self.workers: Counter[str] = Counter()
        self.actor_classes: Counter[str] = Counter()
        self.subprocesses: Counter[str] = Counter()
        self.cpu_s: Counter[str] = Counter()
        """CPU seconds per file of this process and all it started (:class:`ProcessTreeCPU`)."""
        self.tree = ProcessTreeCPU()
        self.is_xdist_controller = False
        """Set in :func:`pytest_configure`: this process hands tests to pytest-xdist's processes."""
        self.cpu_seen = 0.0
        self.seen_workers = 0
        self.current_file = ""
        self.file_starts: list[tuple[str, float]] = []
        """Each file this process started and when (``time.time()``), in order."""
        self.clusters_seen: set[str] = set()

    def charge_workers(self, path: str) -> None:
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            session = ray._private.worker._global_node.get_session_dir_path()
            if session not in self.clusters_seen:  # a new cluster's count starts from zero
                self.clusters_seen.add(session)
                self.seen_workers = 0
        total = _ray_worker_logs()
        if total > self.seen_workers:
            self.workers[path] += total - self.seen_workers
            self.seen_workers = total

    def charge_cpu(self, path: str) -> None:
        """The CPU used since the last charge goes to ``path`` (called as each file ends). Not in
        pytest-xdist's controller: its process tree holds every test process, whose CPU they report."""
        if self.is_xdist_controller:
            return
        now = self.tree.total_s()
        self.cpu_s[path] += max(0.0, now - self.cpu_seen)
        self.cpu_seen = now

    def as_json(self) -> str:
        return json.dumps(
            {
                "workers": dict(self.workers),
                "actor_classes": dict(self.actor_classes),
                "subprocesses": dict(self.subprocesses),
                "cpu_s": dict(self.cpu_s),
                "finished_at": time.time(),
                "file_starts": self.file_starts,
            }
        )


_COUNTS = _Counts()
_ORIGINAL_POPEN_INIT = subprocess.Popen.__init__


def _counting_popen_init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
    from tests.conftest import _starts_python  # the same rule the subprocess marker is checked by

    if _starts_python(args) and not _started_by_ray():
        _COUNTS.subprocesses[_COUNTS.current_file or "(outside a test)"] += 1
    _ORIGINAL_POPEN_INIT(self, args, *rest, **kwargs)


def _started_by_ray() -> bool:
    """Whether Ray itself is starting the process (its raylet, GCS, agents): those are the cluster's,
    counted once per pytest process, not a test's."""
    frame = sys._getframe(2)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith("ray."):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class Budget:
    """The plugin (registered by :func:`pytest_configure`): counts here, totals on the controller."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        """Test time per file (every phase of every test), from the reports this process sees."""
        self.workers: Counter[str] = Counter()
        self.actor_classes: Counter[str] = Counter()
        self.subprocesses: Counter[str] = Counter()
        self.cpu_s: Counter[str] = Counter()
        self.started_at = time.time()
        self.load = MachineLoad()
        self.processes: list[tuple[float, list[tuple[str, float]]]] = []
        """Each pytest process's end and its files with the second each started (seconds after the
        session started): a process that ends long after the others is a run's tail, its last file
        running alone."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        path = nodeid.split("::")[0]
        if path != _COUNTS.current_file:
            if _COUNTS.is_xdist_controller:  # it sees its processes' tests start; their CPU is theirs
                pass
            elif _COUNTS.current_file:
                _COUNTS.charge_cpu(_COUNTS.current_file)
            else:  # the process's own start-up (imports, collection) is no file's
                _COUNTS.tree.start()
                _COUNTS.cpu_seen = _COUNTS.tree.total_s()
            _COUNTS.file_starts.append((path, time.time()))
        _COUNTS.current_file = path

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        # before the teardown: the last test of a process tears the Ray cluster down with it
        _COUNTS.charge_workers(item.nodeid.split("::")[0])
        if nextitem is None:
            _COUNTS.actor_classes.update(_ray_actor_classes())
        yield

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        _COUNTS.charge_workers(nodeid.split("::")[0])

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::")[0]] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        _COUNTS.charge_workers(_COUNTS.current_file or "(outside a test)")
        _COUNTS.charge_cpu(_COUNTS.current_file or "(outside a test)")
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist process: the controller adds it up
            workeroutput["budget"] = _COUNTS.as_json()
        else:  # one process, or the xdist controller (its counts: the processes it started)
            self._add(_COUNTS.as_json(), ended=not session.config.pluginmanager.has_plugin("dsession"))

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """xdist controller: one process's counts, as it ends."""
        output = getattr(node, "workeroutput", None) or {}
        if "budget" in output:
            self._add(output["budget"])

    def _add(self, payload: str, ended: bool = True) -> None:
        counts = json.loads(payload)
        self.workers.update(counts["workers"])
        self.actor_classes.update(counts["actor_classes"])
        self.subprocesses.update(counts["subprocesses"])
        self.cpu_s.update(counts["cpu_s"])
        if ended:
            files = [(path, at - self.started_at) for path, at in counts["file_starts"]]
            self.processes.append((counts["finished_at"] - self.started_at, files))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.seconds:
            return
        write = terminalreporter.write_line
        terminalreporter.section("test budget")
        write(
            f"Ray worker processes started: {sum(self.workers.values())}; Python subprocesses started: "
            f"{sum(self.subprocesses.values())}; test time summed over files: "
            f"{sum(self.seconds.values()):.0f} s; CPU used by the files' processes: "
            f"{sum(self.cpu_s.values()):.0f} CPU-s"
        )
        if self.actor_classes:
            write(
                "Ray actors by class: "
                + ", ".join(f"{name} {count}" for name, count in self.actor_classes.most_common())
            )
        if len(self.processes) > 1:
            write(
                "pytest processes ended at (s after the start, last file): "
                + ", ".join(
                    f"{ended:.0f} s {files[-1][0] if files else '-'}"
                    for ended, files in sorted(self.processes)
                )
            )
        if os.environ.get("ASYNC_REWARD_BUDGET_TIMELINE"):
            for number, (_, files) in enumerate(self.processes):
                write(f"process {number}: " + ", ".join(f"{at:.0f} {path}" for path, at in files))
        # By CPU: on a CPU-bound run a file's wall time also holds whatever ran beside it.
        costliest = (
            self.cpu_s.most_common(SLOWEST_SHOWN) if self.cpu_s else self.seconds.most_common(SLOWEST_SHOWN)
        )
        write(
            f"costliest {SLOWEST_SHOWN} files (CPU-s of the file's processes, test time, Ray workers, "
            "Python subprocesses):"
        )
        for path, _ in costliest:
            write(
                f"  {self.cpu_s[path]:7.1f}  {self.seconds[path]:7.1f} s  {self.workers[path]:4d}  "
                f"{self.subprocesses[path]:3d}  {path}"
            )
        wall = time.time() - self.started_at
        write(f"wall time {wall:.0f} s of a budget of {WALL_BUDGET_S:.0f} s; {self.load.since_start()}")
        if wall > WALL_BUDGET_S and len(self.seconds) > 1:
            for line in over_budget_message(wall, WALL_BUDGET_S):
                write(line, red=True, bold=True)


def over_budget_message(wall_s: float, budget_s: float) -> list[str]:
    """The banner a run over its wall-time budget ends with (the tests' outcome is not changed)."""
    return [
        "=" * 78,
        f"OVER BUDGET: this run took {wall_s:.0f} s, over the suite's budget of {budget_s:.0f} s",
        "(ASYNC_REWARD_TEST_BUDGET_S; docs/development.md). If the machine was busy with other work",
        "(the load line above), run it again on a quiet one; otherwise the suite grew: the slowest files",
        "above say where (ASYNC_REWARD_BUDGET_FILES=100 lists every file).",
        "=" * 78,
    ]


def pytest_configure(config: pytest.Config) -> None:
    _COUNTS.is_xdist_controller = not hasattr(config, "workerinput") and bool(
        getattr(config.option, "numprocesses", None)
    )
    subprocess.Popen.__init__ = _counting_popen_init  # type: ignore[method-assign]
    config.pluginmanager.register(Budget(), "async_reward_budget")


def pytest_unconfigure(config: pytest.Config) -> None:
    subprocess.Popen.__init__ = _ORIGINAL_POPEN_INIT  # type: ignore[method-assign]
