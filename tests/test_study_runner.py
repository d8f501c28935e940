"""The study runner's ``--jobs``: a pool of worker processes over the plan's requests (study/runner.py,
study/execute.py). Each run starts as soon as the runs it needs are done, with threads // jobs torch threads;
timings run last, alone, in the runner's process; a worker's failure is one line naming its run; nothing
re-enters the CLI. The scheduling is tested with an in-process stand-in for the pool; one test spawns real
workers and compares their records with one job's."""

from __future__ import annotations

import ast
import threading
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import TEST_STUDIES

import tokenreduce.study.runner as runner_module
from tokenreduce.bench.evaluation import EvalRequest
from tokenreduce.cli import main
from tokenreduce.core.errors import TokenReduceError
from tokenreduce.models.references import file_sha256
from tokenreduce.study import Arm, Axis, Bed, Expect, Study, execute, get_study, register_study
from tokenreduce.study.plan import Layout, layout_for
from tokenreduce.study.records import load_runs
from tokenreduce.study.runner import Runner
from tokenreduce.train.config import TrainConfig

EET_FMNIST = get_study("eet").beds["fmnist"]


@register_study("pool_test", TEST_STUDIES)
class _Pool(Study):
    """Two seeds of a trained arm ``a`` and of ``b``, a second phase that starts from ``a``'s checkpoint."""

    claim, source = "test", "test"
    expect = (Expect("b below a", "test", arm="b", baseline="a", metric="map_asym", direction=-1),)
    beds = {"fmnist": Bed(testbed=EET_FMNIST.testbed, recipe=EET_FMNIST.recipe,
                          arms={"a": Arm("(a)", options={"task": "eet(dkt=False, drg=False)"}),
                                "b": Arm("(b)", options={"task": "eet(dkt=False, drg=False)"}, kind="after",
                                         reads="a")},
                          baseline="a", grid=(Axis("bits", (8,), "b"), Axis("seed", (0, 1), "s")),
                          columns=EET_FMNIST.columns[:1], smoke=EET_FMNIST.smoke)}


class _InProcessPool:
    """ProcessPoolExecutor's stand-in: each submitted call runs here at once, except the runs named in ``hold``,
    which finish at the next submission (still running while another starts; after 10 s at the latest)."""

    hold: tuple[str, ...] = ()
    made: list[_InProcessPool] = []

    def __init__(self, max_workers: int, mp_context: Any, initializer: Any) -> None:
        self.jobs, self.start, self.initializer = max_workers, mp_context.get_start_method(), initializer
        self.submitted: list[tuple[str, int, tuple[str, ...]]] = []  # (run, threads, runs still running then)
        self.held: list[tuple[str, Future, Any]] = []
        _InProcessPool.made.append(self)

    def __enter__(self) -> _InProcessPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._release()

    def _release(self) -> None:
        held, self.held = self.held, []
        for _, future, call in held:
            _settle(future, call)

    def submit(self, fn: Any, request: Any, ctx: Any, log: Path) -> Future:
        self.submitted.append((log.stem, ctx.threads, tuple(run for run, *_ in self.held)))
        self._release()
        future: Future = Future()
        if log.stem in self.hold:
            self.held.append((log.stem, future, lambda: fn(request, ctx, log)))
            threading.Timer(10, self._release).start()  # a runner that waited for it would not hang the test
        else:
            _settle(future, lambda: fn(request, ctx, log))
        return future


def _settle(future: Future, call: Any) -> None:
    if future.done():
        return
    try:
        future.set_result(call())
    except Exception as e:  # noqa: BLE001 - handed to the runner as a worker's failure
        future.set_exception(e)


def _fake_train(cfg: TrainConfig, ctx: Any) -> dict[str, Any]:
    """A training run's body without training: a checkpoint file named after the run, a metric."""
    path = Path(cfg.out) / "model.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{cfg.out} from {cfg.init}")
    return {"config": cfg.to_dict(), "metrics": {"checkpoint": str(path), "metric": "map_asym", "map_asym": 50.0},
            "checkpoint_sha256": file_sha256(path)}


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> type[_InProcessPool]:
    monkeypatch.setattr(runner_module, "ProcessPoolExecutor", _InProcessPool)
    monkeypatch.setattr(_InProcessPool, "made", [])
    monkeypatch.setitem(execute.EXECUTORS, TrainConfig, _fake_train)
    return _InProcessPool


@pytest.mark.parametrize(("threads", "jobs", "each"), [(8, 3, 2), (1, 4, 1)])
def test_a_run_starts_as_soon_as_its_needs_are_done_with_threads_split(threads: int, jobs: int, each: int,
                                                                       pool: type[_InProcessPool], tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(pool, "hold", ("a-b8-s1",))  # seed 1's first phase runs long
    study = get_study("pool_test")(smoke=True)
    runner = Runner(study, layout_for(study, str(tmp_path)), threads=threads, log=lambda msg: None)
    assert sorted(runner.run(jobs=jobs)) == sorted(u.id for u in runner.units)
    (made,) = pool.made
    assert (made.jobs, made.start, made.initializer) == (jobs, "spawn", runner_module._orphaned_exit)
    assert made.submitted == [("a-b8-s0", each, ()), ("a-b8-s1", each, ()),
                              ("b-b8-s0", each, ("a-b8-s1",)),  # not in waves: a-b8-s1 is still running
                              ("b-b8-s1", each, ())]
    runs = load_runs(Layout(tmp_path, tmp_path), study)
    for run_id, doc in runs.items():
        assert doc["provenance"]["threads"] == each and f"--threads {each}" in doc["command"], run_id
    for seed in (0, 1):  # each second phase read its first phase's checkpoint, the digest its record names
        first, second = runs[f"a-b8-s{seed}"], runs[f"b-b8-s{seed}"]
        assert second["config"]["init"] == first["metrics"]["checkpoint"] == \
            f"{{checkpoints}}/a-b8-s{seed}/model.safetensors"
        assert [r["sha256"] for r in second["read"]] == [first["checkpoint_sha256"]]


def test_a_failing_run_in_a_worker_is_one_line_naming_it(pool: type[_InProcessPool], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch, capsys):
    def failing(cfg: TrainConfig, ctx: Any) -> dict[str, Any]:
        if cfg.out.endswith("a-b8-s1"):
            raise RuntimeError("boom\nsecond line")
        return _fake_train(cfg, ctx)

    monkeypatch.setitem(execute.EXECUTORS, TrainConfig, failing)
    assert main(["study", "pool_test", "--smoke", "--out", str(tmp_path), "--jobs", "2", "--threads", "2"]) == 2
    err = capsys.readouterr().err
    log = tmp_path / "checkpoints" / "a-b8-s1.log"
    assert err.splitlines()[-1] == f"tokenreduce study: error: run a-b8-s1 failed (RuntimeError: boom); its log: {log}"
    assert "Traceback" not in err and "Traceback" in log.read_text()
    assert [p.stem for p in (tmp_path / "runs").glob("*.json")] == ["a-b8-s0"]  # after a failure, nothing starts


def test_a_study_into_an_output_a_timing_holds_is_refused_cleanly(pool: type[_InProcessPool], tmp_path: Path,
                                                                  capsys):
    from tokenreduce.train import lock

    with lock.hold(tmp_path, what="timing run speed"):
        assert main(["study", "pool_test", "--smoke", "--out", str(tmp_path), "--jobs", "2"]) == 2
    assert f"error: {tmp_path} is in use by another timing run speed" in capsys.readouterr().err.splitlines()[-1]
    assert pool.made == [] and not (tmp_path / "runs").exists()


def test_timings_run_last_alone_in_this_process_with_every_thread(pool: type[_InProcessPool], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch):
    """baselines' training-free measure reads no run; it still times after every training run, in the runner's
    process; a bench-only study starts no pool (the measure and the bench are faked: only the order is tested)."""
    timed: list[tuple[str, int, int]] = []

    def timing(request: Any, ctx: Any) -> dict[str, Any]:
        timed.append((type(request).__name__, ctx.threads, len(pool.made[0].submitted) if pool.made else 0))
        return {"result": {"results": []}}

    monkeypatch.setitem(execute.EXECUTORS, EvalRequest, timing)
    monkeypatch.setitem(execute.EXECUTORS, execute.BenchRequest, timing)
    study = get_study("baselines")()
    runner = Runner(study, layout_for(study, str(tmp_path / "b")), threads=2, log=lambda msg: None)
    monkeypatch.setattr(runner, "_measure", lambda unit, source: EvalRequest(""))  # reads no checkpoint
    trained = [u.id for u in runner.units if u.kind == "train"]
    measures = [u.id for u in runner.units if u.kind == "measure"]
    assert runner.unit("free").needs == ()  # ready at once, yet it waits for every training run
    assert runner.run(jobs=2)[-len(measures):] == measures
    assert [run for run, *_ in pool.made[0].submitted] == trained
    assert timed == [("EvalRequest", 2, len(trained))] * len(measures)
    bench = get_study("deit_bench")(smoke=True)
    pool.made.clear()
    assert Runner(bench, layout_for(bench, str(tmp_path / "d")), threads=2, log=lambda msg: None).run(jobs=2) == \
        ["deit_small"]
    assert pool.made == [] and timed[-1] == ("BenchRequest", 2, 0)


def test_a_measure_is_the_eval_commands_evaluate_timed_on_the_contexts_threads(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch):
    """One implementation: a measure's EvalRequest, its recorded runs in it, goes to bench.evaluation.evaluate (what
    ``tokenreduce eval`` runs) with the context's threads, and its record holds what that returns."""
    from tokenreduce.bench import evaluation as ev
    from tokenreduce.probes.base import RunContext

    seen: list[EvalRequest] = []
    rows = [{"label": "unpatched", "top1": 50.0}]

    def evaluate(req: EvalRequest, progress: Any) -> ev.EvalResult:
        seen.append(req)
        ref = SimpleNamespace(task=SimpleNamespace(spec=lambda: "classify"))
        return ev.EvalResult(ref, SimpleNamespace(info={"name": "fashion_mnist", "n": 16}), rows, {})

    monkeypatch.setattr(ev, "evaluate", evaluate)
    monkeypatch.setattr(ev, "write_outputs", lambda *args, **kwargs: [])
    recorded = (ev.Recorded("tuned-s0", {"name": "vit"}, "tome(r=1)", "classify", 0, {"top1": 49.0}),)
    req = EvalRequest("ref.safetensors", specs=("tome(r=1)",), recorded=recorded,
                      speed={"batch": 2, "warmup": 0, "repeats": 1})
    body = execute.execute(req, RunContext(threads=3, out_dir=tmp_path, log=lambda msg: None))
    assert [r.recorded for r in seen] == [recorded] and seen[0].speed["threads"] == 3
    assert body["result"]["results"] == rows and body["result"]["speed"] == seen[0].speed


def test_the_runner_never_reenters_the_cli_nor_starts_a_subprocess():
    """--jobs is a pool of worker processes over requests (concurrent.futures with a spawn context), not a
    ``tokenreduce study --run ID`` per run."""
    for module in (runner_module, execute):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & {"subprocess", "tokenreduce.cli", "cli", "commands"}, module.__name__
        strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        assert not [s for s in strings if "tokenreduce.cli" in s or s == "-m"], module.__name__
        attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not attributes & {"executable", "Popen", "system", "run_module"}, module.__name__
    source = Path(runner_module.__file__).read_text()
    assert "ProcessPoolExecutor(" in source and 'get_context("spawn")' in source


def test_a_worker_ends_when_the_runners_process_is_gone(monkeypatch: pytest.MonkeyPatch):
    """A SIGKILLed runner's pool never tells its workers: each watches its parent and ends with it."""
    ended, killed = threading.Event(), threading.Event()

    class Parent:  # multiprocessing's handle on a spawned worker's parent: join returns when the parent is gone
        def join(self) -> None:
            killed.wait()

    monkeypatch.setattr(runner_module.multiprocessing, "parent_process", Parent)
    monkeypatch.setattr(runner_module.os, "_exit", lambda status: ended.set())
    runner_module._orphaned_exit()
    assert not ended.wait(0.05)  # the runner lives: so does the worker
    killed.set()
    assert ended.wait(5)


@pytest.mark.slow  # spawns two workers that import torch (~40 s on 2 busy cores); the scheduling: tests above
def test_jobs_run_the_plan_in_worker_processes_with_the_records_of_one_job(tmp_path: Path):
    """Real spawned workers: the same runs and numbers as one job in-process, each second phase from its first
    phase's checkpoint, a log per run, threads // jobs each."""
    study = get_study("pool_test")(smoke=True)
    one, two = tmp_path / "one", tmp_path / "two"
    Runner(study, layout_for(study, str(one)), threads=1, log=lambda msg: None).run()
    said: list[str] = []
    runner = Runner(study, layout_for(study, str(two)), threads=2, log=said.append)
    assert sorted(runner.run(jobs=2)) == sorted(u.id for u in runner.units)
    done = [m.split()[1].split("/")[-1] for m in said if m.startswith("[")]
    assert done.index("a-b8-s0") < done.index("b-b8-s0") and done.index("a-b8-s1") < done.index("b-b8-s1")
    mine, theirs = load_runs(Layout(two, two), study), load_runs(Layout(one, one), study)
    assert mine.keys() == theirs.keys() == {u.id for u in runner.units}

    def numbers(doc: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in doc["metrics"].items() if isinstance(v, (int, float)) and "time" not in k}

    for run_id, doc in mine.items():
        assert numbers(doc) == numbers(theirs[run_id]) and numbers(doc), run_id
        assert doc["provenance"]["threads"] == 1 and (two / "checkpoints" / f"{run_id}.log").is_file()
    assert [r["sha256"] for r in mine["b-b8-s0"]["read"]] == [mine["a-b8-s0"]["checkpoint_sha256"]]
    assert runner.run(jobs=2) == []  # done: nothing runs again


@pytest.mark.slow  # a CLI process with two spawned workers, then the study again in-process (~1 min)
def test_a_killed_study_leaves_no_worker_behind_and_resumes_with_jobs(tmp_path: Path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import default_sigint, wait_for

    import tokenreduce
    from tokenreduce.train import lock
    from tokenreduce.train.loop import HOLD_ENV

    out, held = tmp_path / "s", tmp_path / "held"
    flags = ["study", "platform", "--smoke", "--jobs", "2", "--threads", "2", "--out", str(out)]
    src = str(Path(tokenreduce.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p),
           HOLD_ENV: f"1:{held}"}  # each training run checkpoints its first step, then waits
    proc = subprocess.Popen([sys.executable, "-m", "tokenreduce.cli", *flags], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=default_sigint)
    try:
        wait_for(held, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    runs = sorted((out / "checkpoints").glob("hash-*/last.safetensors"))
    assert runs and not list((out / "runs").glob("*.json"))
    end = time.monotonic() + 120
    for run in runs:  # its worker ended with the runner: the run's own output is free again
        while True:
            try:
                with lock.hold(run.parent):
                    break
            except TokenReduceError:
                assert time.monotonic() < end, f"a worker still holds {run.parent}"
                time.sleep(0.2)
    assert main(flags) == 0  # resumes the killed runs from their checkpoints
    assert sorted(p.stem for p in (out / "runs").glob("*.json")) == ["hash-b8-s0", "hash-b8-s1"]
