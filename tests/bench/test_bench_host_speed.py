"""The host's speed during each figure (``async_reward_bench.host_speed``): the probe as the benchmark
starts it, each figure's slowdown against the run's median figure, and the flag and warning a figure
measured on a slowed host gets. The probe inside a real benchmark run:
tests/bench/test_bench_v1_strategies.py."""

from __future__ import annotations

import time
from typing import Any

import pytest

from async_reward_bench import host_speed
from async_reward_bench.host_speed import (
    HOST_SLOWED_SHARE,
    add_host_slowdown,
    host_speed_probe,
    slowed_figures,
    window_median_ms,
)
from async_reward_bench.repeats import combine_repeats
from async_reward_bench.report import add_relative, busy_machine_warnings, format_table
from tests.bench.test_bench_report import BOUND, LATENCY, figure, regime


def _figure(step_s: float, unit_ms: float | None) -> dict[str, Any]:
    summary: dict[str, Any] = figure(step_s, [0, 1, 1, 1, 1], [2, 3])
    summary |= {"cpu_busy_fraction": 0.5, "busiest_process_cpu": 0.4, "busiest_process": "benchmark"}
    if unit_ms is not None:
        summary["cpu_unit_ms"] = unit_ms
    return summary


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_the_probe_samples_the_fixed_work_in_a_child_process_and_stops_with_the_block(monkeypatch):
    """Started as the benchmark starts it: a median over the window once it holds enough samples,
    None for a window before it began, and the child process gone when the block ends."""
    monkeypatch.setattr(host_speed, "MIN_SAMPLES", 3)
    start = time.monotonic()
    with host_speed_probe() as probe:
        process = probe._process
        deadline = time.monotonic() + 60
        unit = None
        while unit is None and time.monotonic() < deadline:
            time.sleep(0.5)
            unit = probe.unit_ms(start, time.monotonic())
        assert unit is not None and 0 < unit < 1000  # milliseconds of a loop of 20000 steps
        assert probe.unit_ms(start - 100, start - 50) is None  # no sample in a window before it began
        assert process.poll() is None
    assert process.poll() is not None


def test_a_window_with_too_few_samples_gives_no_figure():
    samples = [(float(t), 0.002) for t in range(host_speed.MIN_SAMPLES - 1)]
    assert window_median_ms(samples, 0, 1000) is None
    samples.append((500.0, 0.004))
    assert window_median_ms(samples, 0, 1000) == pytest.approx(2.0)  # one slow sample moves no median
    assert window_median_ms(samples, 1, 1000) is None  # the window leaves the first sample out


def test_each_figure_is_measured_against_the_runs_median_figure():
    regimes = {
        "recipe": regime({"a": _figure(420.0, 1.5), "b": _figure(421.0, 2.0)}),
        "gpu_bound": regime({"a": _figure(240.0, 1.6), "c": _figure(250.0, None)}),
    }
    add_host_slowdown(regimes)
    recipe, gpu = regimes["recipe"]["strategies"], regimes["gpu_bound"]["strategies"]
    assert gpu["a"]["host_slowdown"] == 0.0  # the median of 1.5, 1.6 and 2.0
    assert recipe["a"]["host_slowdown"] == pytest.approx(1.5 / 1.6 - 1)  # faster than the median
    assert recipe["b"]["host_slowdown"] == pytest.approx(2.0 / 1.6 - 1)
    assert "host_slowdown" not in gpu["c"]  # no reading: no claim
    assert slowed_figures(regimes) == {"recipe/b": pytest.approx(0.25)}
    untouched = {"recipe": regime({"a": _figure(420.0, None)})}
    add_host_slowdown(untouched)
    assert slowed_figures(untouched) == {} and "host_slowdown" not in untouched["recipe"]["strategies"]["a"]


def test_a_figure_on_a_slowed_host_is_flagged_in_its_table_and_warned_of_by_name():
    strategies = {
        "v1_pipelined_both": _figure(420.0, 1.0),
        "v1_pipelined_both_stale2": _figure(400.0, 1.0),
        "v1_sync": _figure(500.0, 1.0),
        "v1_colocate_async": _figure(440.0, 1.3),
        "v1_decoupled": _figure(430.0, 1.0 + HOST_SLOWED_SHARE),  # at the threshold: not over it
    }
    add_relative(strategies, BOUND, LATENCY)
    results = {"cpus": 2, "cpu_busy_before_start": 0.0, "regimes": {"gpu_bound": regime(strategies)}}
    add_host_slowdown(results["regimes"])
    table = format_table(results["regimes"]["gpu_bound"], None).splitlines()
    rows = {line.split()[0]: line for line in table[3:8]}
    assert "50% 40% slower 30%*" in rows["v1_colocate_async"]
    for name in ("v1_pipelined_both", "v1_decoupled"):
        assert "*" not in rows[name] and "slower" not in rows[name], rows[name]
    (note,) = [line for line in table if line.startswith("  * ")]
    assert note.startswith(
        "  * v1_colocate_async: the CPUs did the same work 30 % slower than in this run's median figure"
    )
    (warning,) = busy_machine_warnings(results)
    assert warning.startswith(
        "WARNING: 1 of 5 figures ran on CPUs that did the same work more than 20 % slower"
    )
    assert "(gpu_bound/v1_colocate_async 30 %;" in warning


def test_repeats_keep_the_slowest_hosts_reading():
    runs = [_figure(420.0, 1.2), _figure(421.0, 1.8)]
    assert combine_repeats(runs, [0, 1])["cpu_unit_ms"] == 1.8
