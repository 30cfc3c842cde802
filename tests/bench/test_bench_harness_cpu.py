"""The benchmark's own cost made visible and kept out of its figures: CPU busy shares
(``async_reward_bench.cpu_use``) and full garbage collections held off during a timed run
(``async_reward_bench.gc_pauses``)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from async_reward_bench import speedup
from async_reward_bench.cpu_use import (
    BUSY_BEFORE_START_SHARE,
    CPU_SATURATED_SHARE,
    PROCESS_SATURATED_SHARE,
    CpuTimes,
    ProcessCpu,
    busy_before_start,
    busy_share,
    process_ticks,
)
from async_reward_bench.gc_pauses import no_full_collections
from async_reward_bench.repeats import combine_repeats
from async_reward_bench.report import add_relative, busy_machine_warnings, busy_start_warning, format_table
from tests.bench.test_bench_report import BOUND, LATENCY, figure, regime

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def test_the_machines_busy_share_counts_iowait_as_idle_and_guest_time_once(tmp_path: Path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 50 800 50 0 0 0 40 0\ncpu0 50 0 25 400 25 0 0 0 20 0\n")
    before = CpuTimes.now(stat)
    assert before == CpuTimes(busy=150, idle=850)  # guest is already in user
    stat.write_text("cpu  400 0 150 1000 100 0 0 0 40 0\n")
    assert busy_share(before, CpuTimes.now(stat)) == pytest.approx(400 / (400 + 250))


@pytest.mark.parametrize("content", ["", "intr 1 2 3\n", "cpu\n", "cpu 1 2 x\n"])
def test_an_unreadable_stat_gives_no_figure_rather_than_a_wrong_one(tmp_path: Path, content: str):
    stat = tmp_path / "stat"
    stat.write_text(content)
    assert busy_share(CpuTimes.now(stat), CpuTimes.now(stat)) is None
    assert CpuTimes.now(tmp_path / "missing") is None
    assert busy_share(CpuTimes(1, 1), CpuTimes(1, 1)) is None  # no time passed


def test_a_process_name_with_spaces_and_parentheses_does_not_shift_its_cpu_fields(tmp_path: Path):
    (tmp_path / "42").mkdir()
    fields = ["S", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "700", "300", "0", "0"]
    (tmp_path / "42" / "stat").write_text("42 (ray::a (b) c) " + " ".join(fields) + "\n")
    assert process_ticks(42, tmp_path) == 1000
    assert process_ticks(43, tmp_path) is None


def test_each_process_cpu_seconds_between_two_readings(tmp_path: Path):
    """What each harness process spent (the JSON's ``process_cpu_s_per_step``): a process read only
    once is left out rather than counted from zero."""

    def write(pid: int, ticks: int) -> None:
        (tmp_path / str(pid)).mkdir(exist_ok=True)
        fields = ["S", *["0"] * 10, str(ticks), "0", "0", "0"]
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (python) " + " ".join(fields) + "\n")

    write(1, 100)
    write(2, 50)
    before = ProcessCpu.now({"benchmark": 1, "worker": 2, "judge": 3}, 0.0, tmp_path)
    write(1, 100 + 3 * 100)
    write(3, 10)  # started in between: not read before
    after = ProcessCpu.now({"benchmark": 1, "worker": 2, "judge": 3}, 10.0, tmp_path)
    assert before.cpu_seconds(after, 100) == {"benchmark": 3.0, "worker": 0.0}
    assert before.busiest(after, 100) == ("benchmark", pytest.approx(0.3))


@pytest.mark.subprocess
def test_the_busiest_process_is_the_one_that_spent_its_core():
    busy = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 30\nwhile time.time() < end: pass"]
    )
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(1.0)  # both started (the idle one's start-up is not counted)
        pids = {"busy": busy.pid, "idle": idle.pid, "gone": 2**22 + 7}
        before = ProcessCpu.now(pids, time.perf_counter())
        assert set(before.ticks) == {"busy", "idle"}  # a process that cannot be read is left out
        time.sleep(1.5)
        name, share = before.busiest(ProcessCpu.now(pids, time.perf_counter()), TICKS_PER_S) or ("", 0.0)
    finally:
        busy.kill()
        idle.kill()
    assert name == "busy"
    assert 0.3 < share < 1.2  # a core, give or take this 2-core machine's other load


def test_own_process_ticks_grow_with_the_cpu_it_spends():
    before = process_ticks(os.getpid())
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    after = process_ticks(os.getpid())
    assert before is not None and after is not None and after - before >= 0.2 * TICKS_PER_S


def _cpu_figure(step_s: float, machine: float | None, busiest: float | None, name: str = "benchmark") -> dict:
    summary: dict[str, Any] = figure(step_s, [0, 1, 1, 1, 1], [2, 3])
    if machine is not None:
        summary["cpu_busy_fraction"] = machine
    if busiest is not None:
        summary |= {"busiest_process_cpu": busiest, "busiest_process": name}
    return summary


def test_the_table_shows_both_cpu_shares_and_flags_a_saturated_run_naming_the_process():
    strategies = {
        "both": _cpu_figure(420.0, 0.45, 0.31),
        "v1_pipelined_both": _cpu_figure(430.0, 0.50, PROCESS_SATURATED_SHARE + 0.05, "v1 reward worker 1"),
        "v1_colocate_async": _cpu_figure(440.0, CPU_SATURATED_SHARE + 0.05, 0.5),
        "one_step_off": _cpu_figure(425.0, None, None),
    }
    add_relative(strategies, BOUND, LATENCY)
    table = format_table(regime(strategies), None).splitlines()
    assert "CPU busy, busiest" in table[2]
    rows = {line.split()[0]: line for line in table[3:7]}
    assert "45% 31%" in rows["both"] and "*" not in rows["both"]
    assert "50% 95%*" in rows["v1_pipelined_both"]
    assert "85% 50%*" in rows["v1_colocate_async"]
    assert "- -" in rows["one_step_off"]
    notes = [line for line in table if line.startswith("  * ")]
    assert len(notes) == 2
    assert notes[0].startswith("  * v1_pipelined_both: v1 reward worker 1 used 95 % of a core (over 90 %)")
    assert notes[1].startswith("  * v1_colocate_async: the CPUs were 85 % busy (over 80 %)")
    assert all("--time-scale" in note for note in notes)


def test_the_busy_share_before_the_start_is_read_over_a_sleep(tmp_path: Path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 0 100 0 0 0 0 0 0\n")
    assert busy_before_start(0.0, stat) is None  # nothing changed: no time passed, no figure
    assert busy_before_start(0.0, tmp_path / "missing") is None
    own = busy_before_start(0.05)  # this machine's: a share, whatever else runs
    assert own is None or 0.0 <= own <= 1.0


def test_a_busy_machine_is_warned_of_at_the_start_and_under_the_results():
    """Other work before the start, and each figure measured on saturated CPUs, named in one warning;
    a quiet machine gets none."""
    quiet = {"both": _cpu_figure(420.0, 0.45, 0.31), "v1_pipelined_both": _cpu_figure(421.0, 0.5, 0.4)}
    busy = {
        "both": _cpu_figure(420.0, CPU_SATURATED_SHARE + 0.05, 0.3),
        "v1_decoupled": _cpu_figure(421.0, 0.5, PROCESS_SATURATED_SHARE + 0.02, "benchmark"),
        "v1_pipelined_both": _cpu_figure(422.0, 0.5, 0.4),
    }
    calm = {
        "cpus": 2,
        "cpu_busy_before_start": BUSY_BEFORE_START_SHARE - 0.05,
        "regimes": {"recipe": regime(quiet)},
    }
    assert busy_start_warning(calm["cpu_busy_before_start"], 2) == "" and busy_machine_warnings(calm) == []
    assert busy_start_warning(None, 2) == ""  # no /proc: no claim either way
    loaded = {
        "cpus": 2,
        "cpu_busy_before_start": 0.6,
        "regimes": {"recipe": regime(quiet), "balanced": regime(busy)},
    }
    start, figures = busy_machine_warnings(loaded)
    assert start.startswith(
        "WARNING: the machine is busy: other work used 60 % of its 2 CPUs just before the start"
    )
    assert figures.startswith(
        "WARNING: 2 of 5 figures ran on saturated CPUs (balanced/both, balanced/v1_decoupled;"
    )
    assert "recipe/" not in figures and "v1_pipelined_both" not in figures


def test_the_run_says_a_busy_machine_under_its_verdict_and_where_its_output_ends(
    monkeypatch, tmp_path, capsys
):
    strategies = {"v1_pipelined_both": _cpu_figure(421.0, CPU_SATURATED_SHARE + 0.1, 0.4)}
    add_relative(strategies, BOUND, LATENCY)
    results = {
        "regimes": {"recipe": regime(strategies)},
        "recipe": {},
        "steady_state": "",
        "wall_time_s": 1.0,
        "setup_s": 0.5,
        "load_average_before": (3.0, 1.0, 1.0),
        "cpu_busy_before_start": 0.7,
        "cpus": 2,
    }
    monkeypatch.setattr(speedup, "run_benchmark", lambda cfg: results)
    assert (
        speedup.main(["--regimes", "recipe", "--strategies", "v1_pipelined_both", "--out", str(tmp_path)])
        == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("async-reward bench: v1 mode") and lines[1].startswith(
        "async-reward bench: no verdict"
    )
    assert lines[2].startswith("async-reward bench: WARNING: the machine is busy: other work used 70 %")
    assert lines[3].startswith(
        "async-reward bench: WARNING: 1 of 1 figures ran on saturated CPUs (recipe/v1_pipelined_both"
    )
    assert lines[-2] == "async-reward bench: WARNING: the machine was too busy for its figures (2 above)"
    assert lines[-1].startswith("wall time")  # the last line, as before


def test_repeats_keep_the_busiest_run_and_its_process():
    runs = [_cpu_figure(420.0, 0.4, 0.6, "benchmark"), _cpu_figure(421.0, 0.7, 0.93, "reward worker 0")]
    combined = combine_repeats(runs, [0, 1])
    assert combined["cpu_busy_fraction"] == 0.7 and combined["busiest_process_cpu"] == 0.93
    assert combined["busiest_process"] == "reward worker 0"


def _full_collections_while(body: Any) -> int:
    """Automatic generation-2 collections while ``body()`` runs (explicit ``gc.collect()`` excluded)."""
    seen: list[int] = []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2:
            seen.append(1)

    gc.callbacks.append(note)
    try:
        body()
    finally:
        gc.callbacks.remove(note)
    return len(seen)


def _make_long_lived_objects() -> None:
    """More surviving containers than a quarter of what the last full collection left (the rule that
    makes a full collection due, CPython 3.11), then dropped."""
    keep = [[] for _ in range(len(gc.get_objects()) // 2 + 100_000)]
    del keep


def test_no_full_collection_runs_in_a_timed_run_and_the_thresholds_come_back():
    thresholds = gc.get_threshold()
    assert _full_collections_while(_make_long_lived_objects) > 0  # the control: they do happen
    inside: list[int] = []
    with no_full_collections():
        inside.append(_full_collections_while(_make_long_lived_objects))
        young, middle, _ = gc.get_threshold()
        assert (young, middle) == thresholds[:2]  # the young generations still collect
    assert inside == [0]
    assert gc.get_threshold() == thresholds


def test_the_reward_worker_actors_hold_off_full_collections_too(ray_cluster: None):
    import ray

    @ray.remote
    class Worker:
        def thresholds(self) -> tuple[int, int, int]:
            return gc.get_threshold()

    workers = [Worker.remote() for _ in range(2)]
    before = ray.get([w.thresholds.remote() for w in workers])
    with no_full_collections(workers):
        during = ray.get([w.thresholds.remote() for w in workers])
    after = ray.get([w.thresholds.remote() for w in workers])
    assert all(d[:2] == b[:2] and d[2] > 10**6 for d, b in zip(during, before, strict=True))
    assert after == before
    for worker in workers:
        ray.kill(worker)
