"""The pod runner's engine mode, without a cluster: its file, and how it hands out cores and engine slots."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from tests.support.cluster import eventually

from inferencepool.cluster import procs
from inferencepool.cluster.components import Layout
from inferencepool.cluster.podspec import PlanError, PodPlan
from inferencepool.cluster.runner import ManagedPod, PodRunner, RunningContainer, read_engine, write_engine
from inferencepool.cluster.vllm_cpu import CpuEngine


def engine_in(tmp_path: Path, max_engines: int = 2) -> CpuEngine:
    binary = tmp_path / "venv" / "bin" / "vllm"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    return CpuEngine(venv=str(tmp_path / "venv"), model=str(tmp_path / "model"), max_engines=max_engines)


def managed(name: str, cores: tuple[int, ...]) -> ManagedPod:
    plan = PodPlan("ns", name, f"uid-{name}", "127.20.0.2", 30, True, ())
    return ManagedPod(plan=plan, containers={}, cores=cores)


def test_the_mode_file_round_trips_and_its_absence_means_no_real_engines(tmp_path: Path) -> None:
    path = Layout(tmp_path).engine_file
    assert read_engine(path) is None
    engine = engine_in(tmp_path)
    write_engine(path, engine)
    assert read_engine(path) == engine
    write_engine(path, None)
    assert read_engine(path) is None and not path.exists()


def test_engines_get_the_least_used_core_and_no_more_than_the_limit(tmp_path: Path) -> None:
    engine = engine_in(tmp_path, max_engines=3)
    runner = PodRunner(api=None, layout=Layout(tmp_path / "state"), cpus=(0, 1))
    assert runner._engine_slot(engine) == (0,)
    runner.managed["a"] = managed("a", (0,))
    # A router pod holds no engine slot and no core.
    runner.managed["r"] = managed("r", ())
    assert runner._engine_slot(engine) == (1,)
    runner.managed["b"] = managed("b", (1,))
    assert runner._engine_slot(engine) == (0,)
    runner.managed["c"] = managed("c", (0,))
    with pytest.raises(PlanError, match="3 real engines run already"):
        runner._engine_slot(engine)
    # A stopped engine frees its slot and its core.
    del runner.managed["b"]
    assert runner._engine_slot(engine) == (1,)


def test_a_missing_venv_is_named(tmp_path: Path) -> None:
    runner = PodRunner(api=None, layout=Layout(tmp_path / "state"), cpus=(0,))
    missing = CpuEngine(venv=str(tmp_path / "nowhere"), model=str(tmp_path / "model"))
    with pytest.raises(PlanError, match="make real-engine"):
        runner._engine_slot(missing)
    assert os.access(engine_in(tmp_path).binary, os.X_OK)


def test_the_mode_can_be_kept_to_some_namespaces(tmp_path: Path) -> None:
    engine = CpuEngine(venv="/v", model="/m", namespaces=("demo",))
    assert engine.covers("demo") and not engine.covers("prod")
    assert CpuEngine(venv="/v", model="/m").covers("prod")
    path = Layout(tmp_path).engine_file
    write_engine(path, engine)
    assert read_engine(path) == engine


# What vLLM's NixlConnector does on CPU in the worker's main thread (nixl/base_worker.py), in a child process
# of the engine, beside a thread that stays free to run anywhere.
PINNING_ENGINE = """
import multiprocessing, os, threading, time

def worker():
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    time.sleep(60)

if __name__ == "__main__":
    multiprocessing.get_context("spawn").Process(target=worker).start()
    time.sleep(60)
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to bind to different ones")
def test_engine_threads_bound_to_a_core_they_were_not_given_are_moved_back(tmp_path: Path) -> None:
    machine = tuple(sorted(os.sched_getaffinity(0)))
    given = (machine[0],)
    script = tmp_path / "engine.py"
    script.write_text(PINNING_ENGINE)
    record = procs.spawn([sys.executable, str(script)], tmp_path / "engine.log")
    try:

        def once_pinned() -> dict[int, frozenset[int]]:
            affinities = {
                thread: frozenset(os.sched_getaffinity(thread))
                for thread in procs.session_threads([record.pid])[record.pid]
            }
            return affinities if frozenset({machine[-1]}) in affinities.values() else {}

        affinities = eventually(once_pinned, 60, "the child pinning its main thread as vLLM does", 0.1)
        pinned = [thread for thread, cores in affinities.items() if cores == {machine[-1]}]
        runner = PodRunner(api=None, layout=Layout(tmp_path / "state"), cpus=machine)
        engine = managed("engine", given)
        engine.containers["engine"] = RunningContainer(plan=None, record=record)  # type: ignore[arg-type]
        runner.managed["engine"] = engine
        runner.keep_engines_on_cores()
        after = {thread: frozenset(os.sched_getaffinity(thread)) for thread in affinities}
        assert all(after[thread] == set(given) for thread in pinned)
        free = [thread for thread, cores in affinities.items() if cores == set(machine)]
        assert free and all(after[thread] == set(machine) for thread in free)  # the free ones stay free
    finally:
        procs.terminate([record], 5)
