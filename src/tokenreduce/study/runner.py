"""Executing a study's plan (plan.py): once its needs are done, a run becomes one request (execute.py), its kind's
executor turns it into the body of its record, and :meth:`Runner._record`, the one place records are built, writes
``<results>/runs/<id>.json`` atomically; a run is done when that file exists. A training run resumes what an
interrupted one left under ``<checkpoints>/<id>/``, so a killed study continues where it stopped. ``--jobs N``:
a pool of N spawned worker processes (threads // N torch threads each, logs in ``<checkpoints>/<id>.log``), a run
as soon as its needs are done; measures and benches, which time, run last, alone, in this process.

Records are what a study keeps (checkpoints are not committed): a measure reads each fine-tuned run's evaluation
from its record and times its model afresh, and a run that needs a gone checkpoint runs its source again first
(:meth:`Runner._checkpoint`). A training record names its checkpoint's SHA-256; a run that reads a checkpoint
refuses one whose digest differs (records made before digests hold none) and names each one it read under ``read``.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import shlex
import threading
import time
import traceback
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import nullcontext, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from ..bench import load
from ..bench.compare import BenchRequest
from ..bench.evaluation import SPEED, EvalRequest, FoldRequest, Recorded
from ..bench.evaluation import log as stderr_line
from ..bench.report import provenance, read_provenance, write_json
from ..core.errors import TokenReduceError
from ..core.registry import format_spec, parse_spec
from ..models.references import file_sha256
from ..probes.base import ProbeRequest, RunContext, get_experiment
from ..tasks.items import item_pair
from ..train import lock
from ..train.config import TrainConfig
from .declare import REFERENCE, Study
from .execute import execute
from .plan import TIMED, Layout, Unit, plan, select
from .records import read_record, relative, resolved
from .tables import planned_seeds


class Runner:
    """Runs a study's plan. ``device``, ``amp``: where every run's model runs and its autocast; ``flags``: what
    :meth:`commands` repeat; ``where``: the grid slice run and listed (:meth:`unit` still finds any run)."""

    def __init__(self, study: Study, layout: Layout, *, threads: int, device: str = "cpu", amp: str = "off",
                 flags: Sequence[str] = (), where: Mapping[str, Collection[str]] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.study, self.layout, self.threads, self.device, self.amp = study, layout, threads, device, amp
        self.flags = list(flags)
        self.log = log or stderr_line
        everything = plan(study)
        self.by_id = {u.id: u for u in everything}
        self.units = select(study, everything, where) if where else everything
        self.where = " ".join(f"{k}={','.join(sorted(v))}" for k, v in (where or {}).items())

    def unit(self, run_id: str) -> Unit:
        if run_id not in self.by_id:
            raise TokenReduceError(f"study {self.study.name} has no run {run_id!r}; its runs: "
                                   f"{', '.join(self.by_id)}")
        return self.by_id[run_id]

    def done(self, unit: Unit) -> bool:
        """Whether ``unit``'s JSON exists; one made on another test bed is refused, not reused."""
        path = self.layout.json(unit.id)
        if not path.is_file():
            return False
        made_on = read_record(path).get("testbed")
        if made_on != self.study.bed.describe():
            raise TokenReduceError(f"{path} was made on the test bed {made_on}, not {self.study.bed.describe()}; "
                                   "give another --out for this test bed")
        read_record(path, self.study, units=self.by_id)
        return True

    def command(self, unit: Unit, threads: int | None = None) -> list[str]:
        """The shell command (as argv) that runs ``unit`` alone."""
        t = self.threads if threads is None else threads
        bed = [] if self.study.is_default_bed else ["--testbed", self.study.bed_name]
        return ["tokenreduce", "study", self.study.name, *bed, "--run", unit.id, *self.flags, "--threads", str(t)]

    def commands(self) -> list[str]:
        return [shlex.join(self.command(u)) for u in self.units]

    # -- requests: what each run computes, named in full once its needs are done

    def request(self, unit: Unit, threads: int | None = None) -> tuple[Any, list[dict[str, str]]]:
        """``unit``'s request (execute.py) for ``threads`` torch threads, and the checkpoint it reads with its
        digest (:meth:`_checkpoint`: a gone one is made again here); its needs must be done."""
        missing = [n for n in unit.needs if not self.layout.json(n).is_file()]
        if missing:
            raise TokenReduceError(f"run {unit.id} reads the runs {missing}, which are not done; run them first")
        read = [self._checkpoint(unit.reads)] if unit.reads else []
        source = read[0]["path"] if read else None
        return self._request(unit, source, self.threads if threads is None else threads), read

    def _request(self, unit: Unit, source: str | None, threads: int) -> Any:
        """``unit``'s request; ``source``: the checkpoint of the run it reads (:attr:`Unit.reads`)."""
        study, p, where = self.study, unit.point, self.layout.checkpoints
        if unit.kind == "train":  # resumed where an interrupted one stopped; a second phase starts from the first
            fields = study.train_fields(p, where)
            if source:
                fields["init"] = source
            fields.update(out=str(where / unit.id), resume=True, threads=threads, device=self.device)
            if self.amp != "off":  # off leaves a study's own amp (none of them sets one today) standing
                fields["amp"] = self.amp
            return TrainConfig.from_dict(fields)
        if unit.evaluates == REFERENCE:  # its spec on the fold of the test items its seed's place among the seeds names
            seeds = list(planned_seeds(study))
            data_dir, subset = study.eval_items(where)
            return FoldRequest(spec=study.arms[p.arm].spec.format(**p.values), checkpoint=self._reference(),
                               fold=(seeds.index(p.values["seed"]), len(seeds)), data_dir=data_dir, subset=subset)
        if unit.kind == "evaluate":
            # its spec may name the run's settings: "oracle_at_counts(subset={eval_subset})", the source's items
            return self._experiment(study.arms[p.arm].spec.format(**study.train_fields(p, where)), source)
        if unit.kind == "measure":
            return self._measure(unit, source)
        if unit.kind == "bench":
            return BenchRequest(**study.bench_run(unit.step), argv=tuple(self.command(unit, threads)))
        return self._experiment(unit.step.experiment, source or study.bed.checkpoint())

    def _measure(self, unit: Unit, source: str | None) -> EvalRequest:
        """The measure ``unit``: the reference's specs (``source``'s, else the test bed's) beside the fine-tuned
        runs' recorded evaluations."""
        from ..train import final_evaluation

        m, reference = unit.step, source or self._reference()
        recorded = []
        for n in self.study.measure_runs(m)[1]:  # its fine-tuned runs, whichever arm its reference is
            doc = self._doc(n)
            recorded.append(Recorded(n, self._model(n), doc["metrics"].get("spec"), doc["metrics"]["task"],
                                     doc["config"].get("seed"), final_evaluation(doc["metrics"])))
        defaults = {k: SPEED[k] for k in ("batch", "warmup", "repeats")}  # the eval command's
        speed = {**defaults, **m.settings, **self.study.smoke_over("measure")}
        data_dir, subset = self.study.eval_items(self.layout.checkpoints)  # the runs' test items
        return EvalRequest(reference, specs=tuple(m.specs), recorded=tuple(recorded), speed=speed, data_dir=data_dir,
                           subset=subset, device=self.device, amp=self.amp)

    def _experiment(self, spec: str, checkpoint: str | None) -> ProbeRequest:
        """The experiment ``spec`` on ``checkpoint``, with the test bed's data where it takes one."""
        name, params = parse_spec(spec)
        params["checkpoint"] = checkpoint
        bed = self.study.bed.train_fields(self.layout.checkpoints)
        cfg = get_experiment(name).Config
        takes = {f.name for f in dataclasses.fields(cfg)} if dataclasses.is_dataclass(cfg) else set()
        for key in ("data", "data_dir"):  # Fashion-MNIST by name is left out: an experiment reads the checkpoint's
            if key in takes and bed.get(key) and bed[key] != "fashion_mnist":
                params[key] = bed[key]
        params.update(self.study.smoke_over("probe"))
        return ProbeRequest(format_spec(name, params))

    def _reference(self) -> str:
        """The test bed's reference checkpoint; without one (a smoke's), its model at the seed-0 initialisation."""
        shipped = self.study.bed.checkpoint()
        if shipped:
            return shipped
        path = self.layout.checkpoints / "initialised" / "model.safetensors"
        if not path.is_file():
            import torch

            from ..models import build_model, save_checkpoint

            bed, fields = self.study.bed, self.study.bed.train_fields(self.layout.checkpoints)
            config = {"name": bed.model, "kwargs": dict(bed.kwargs)}
            torch.manual_seed(0)
            save_checkpoint(path, build_model(config), meta={"model": config, "spec": None, "task": "classify",
                                                             "data": {"name": fields.get("data")}, "complete": True})
        return str(path)

    def _doc(self, run_id: str) -> dict[str, Any]:
        """The record of run ``run_id``, checked, its paths resolved where the study is now."""
        return resolved(read_record(self.layout.json(run_id), self.study, units=self.by_id), self.layout)

    def _checkpoint(self, run_id: str) -> dict[str, str]:
        """The checkpoint of the done training run ``run_id`` and its SHA-256, as a run that reads it records them.
        One that is gone (checkpoints are not kept) is made again by running the run again; where that does not
        reproduce the recorded metric, the new run replaces the record (:meth:`_record`), so a record describes the
        checkpoint later runs read, and a done run that read the old one is named in an error."""
        doc = self._doc(run_id)
        path = doc["metrics"]["checkpoint"]  # resolved (_doc)
        if Path(path).is_file():
            digest, recorded = file_sha256(path), doc.get("checkpoint_sha256")
            if recorded is not None and digest != recorded:
                raise TokenReduceError(f"{path} is not the checkpoint run {run_id} wrote: its SHA-256 is "
                                       f"{digest[:12]}..., its record {self.layout.json(run_id)} names "
                                       f"{recorded[:12]}... (the file was replaced or changed); restore it, or "
                                       f"delete it to make it again by running {run_id} again")
        else:
            unit = self.unit(run_id)
            if unit.kind != "train":
                raise TokenReduceError(f"run {run_id} has no checkpoint of its own to read ({unit.kind})")
            readers = [u.id for u in self.by_id.values() if run_id in u.needs and self.done(u)]
            self.log(f"{self.study.key}/{run_id}: its checkpoint {path} is gone; running it again to make it")
            again = self._run(unit, replacing=doc)  # under the hold of the run that reads it
            if "replaces" in again and readers:
                metric = doc["metrics"]["metric"]
                raise TokenReduceError(f"{run_id} made again gave {metric} {again['metrics'][metric]}, not the "
                                       f"recorded {doc['metrics'][metric]} (its record now holds the new run), and "
                                       f"the done runs {readers} read the old run: delete their records to make "
                                       "them again from the new one")
            path, digest = again["metrics"]["checkpoint"], again["checkpoint_sha256"]
        return {"path": path, "sha256": digest}

    def _model(self, run_id: str) -> dict[str, Any]:
        """The model config the training run ``run_id`` trained: its own, else that of the run it started
        from (a second phase), else the test bed reference's."""
        from ..models import read_meta

        unit = self.unit(run_id)
        if unit.kind != "train":
            raise TokenReduceError(f"run {run_id} trains no model ({unit.kind}); a measure reads training runs")
        config = self._doc(run_id)["config"]
        if config.get("model"):
            return config["model"]
        if unit.reads:
            return self._model(unit.reads)
        start = self.study.bed.checkpoint() or config.get("init")
        if start is None:
            raise TokenReduceError(f"run {run_id} names no model and starts from no run or reference")
        return read_meta(start)["model"]

    # -- execution

    def run_one(self, unit: Unit) -> dict[str, Any]:
        """Execute ``unit`` in this process (its needs must be done) and write its record; returns it. Meanwhile the
        study's output is held (train/lock.py): shared by a run that trains or evaluates, alone by a timing, which so
        shares its cores with no other run writing there."""
        timing = unit.kind in TIMED
        with lock.hold(self.layout.results, what=f"{'timing' if timing else 'study'} run {unit.id}", shared=not timing):
            return self._run(unit)

    def _run(self, unit: Unit, replacing: dict[str, Any] | None = None) -> dict[str, Any]:
        """:meth:`run_one` under the hold this process has; ``replacing``: the record of a run made again
        (:meth:`_checkpoint`). The machine's load around a timing goes into its record (bench/load.py)."""
        timing = unit.kind in TIMED
        t0 = time.perf_counter()
        request, read = self.request(unit)
        with load.watched(self.threads, self.log) if timing else nullcontext() as seen:
            body = execute(request, self._context(unit, self.threads, self.log))
        return self._record(unit, body, read=read, threads=self.threads, t0=t0,
                            extra={load.KEY: seen} if timing else {}, replacing=replacing)

    def _context(self, unit: Unit, threads: int, log: Callable[[str], None]) -> RunContext:
        return RunContext(threads=threads, device=self.device, amp=self.amp, out_dir=self.layout.checkpoints / unit.id,
                          log=log)

    def _record(self, unit: Unit, body: dict[str, Any], *, read: list[dict[str, str]], threads: int, t0: float,
                extra: dict[str, Any], replacing: dict[str, Any] | None = None) -> dict[str, Any]:
        """The one place a record is built: ``unit``'s coordinates, its request's ``body``, the checkpoints it
        ``read``, its provenance (``extra``: a timing's load) and, for a run made again that did not reproduce the
        record it ``replac``es, the old metric; written atomically. Returns it."""
        argv = self.command(unit, threads)
        doc: dict[str, Any] = {"id": f"{self.study.key}/{unit.id}", "study": self.study.name,
                               "bed": self.study.bed_name, "run": unit.id, "kind": unit.kind,
                               "testbed": self.study.bed.describe(), "smoke": self.study.is_smoke,
                               "command": shlex.join(argv)}
        if unit.point is not None:
            doc.update(arm=unit.point.arm, point=unit.point.values)
            if unit.evaluates:
                doc["evaluates"] = unit.evaluates
        elif unit.kind == "measure":
            doc["point"] = unit.step.at
        doc.update(body)
        if unit.evaluates not in (None, REFERENCE):  # an experiment's metrics, item-paired with the run it reads
            metrics, source = body["result"].get("metrics", {}), self._doc(unit.reads)
            for metric in sorted(set(metrics.get("items") or {}) & set(source["metrics"].get("items") or {})):
                item_pair({"id": doc["id"], "metrics": metrics}, source, metric)  # refused here, not at the report
            doc["metrics"] = metrics
        if read:
            doc["read"] = read
        doc["provenance"] = provenance(argv=argv, threads=threads, device=self.device, amp=self.amp,
                                       wall_s=round(time.perf_counter() - t0, 1), **extra)
        metric = doc["metrics"]["metric"] if replacing is not None else None  # a training run's, made again
        if metric is not None and doc["metrics"][metric] != (old := replacing["metrics"].get(metric)):
            cpu = read_provenance(replacing).get("cpu")
            self.log(f"{self.study.key}/{unit.id}: made again, {metric} {doc['metrics'][metric]} (recorded "
                     f"{old}, {cpu or 'machine not recorded'}); the new run replaces its record")
            doc["replaces"] = {"why": "its checkpoint was gone and running it again did not reproduce its metric",
                               "metrics": {metric: old}, "provenance": replacing.get("provenance"), "cpu": cpu}
        write_json(self.layout.json(unit.id), relative(doc, self.layout))
        return doc

    def run(self, jobs: int = 1) -> list[str]:
        """Run every run not done yet (``jobs`` > 1: in the pool; timings last, alone, here); returns the ids run."""
        pending = [u for u in self.units if not self.done(u)]
        total, ran, times = len(self.units), [], []
        self.log(f"study {self.study.key}: {len(pending)} of {total} runs{f' at {self.where}' if self.where else ''} "
                 f"to do on {self.study.bed.text()}"
                 f"{' (smoke)' if self.study.is_smoke else ''}; results in {self.layout.results}")
        for name, count in self.study.by_setting([u.point for u in pending if u.point is not None]).items():
            if len(count) > 1:
                self.log(f"  to do by {name}: " + ", ".join(f"{v}: {n}" for v, n in count.items())
                         + f" (--where {name}=V runs one)")

        def finished(u: Unit, seconds: float, lanes: int) -> None:
            times.append(seconds)
            ran.append(u.id)
            left = len(pending) - len(ran)
            eta = sum(times) / len(times) * left / max(1, min(lanes, left or 1))
            self.log(f"[{total - left}/{total}] {self.study.key}/{u.id} done in {seconds:.0f} s; "
                     f"{left} left, about {eta / 60:.1f} min")

        timed = [u for u in pending if u.kind in TIMED]
        rest = [u for u in pending if u not in timed]
        if jobs > 1 and rest:
            self._pool(rest, jobs, finished)
            rest = []
        for u in rest + timed:
            t0 = time.perf_counter()
            self.run_one(u)
            finished(u, time.perf_counter() - t0, 1)
        return ran

    def _pool(self, units: list[Unit], jobs: int, finished: Callable[[Unit, float, int], None]) -> None:
        """Run ``units`` (no timing) in a pool of ``jobs`` workers; the requests are made and the records written
        here. A failed run ends the pool once the running ones finish, with one line naming it."""
        lane = max(1, self.threads // jobs)
        waiting, running, failed = list(units), {}, []
        with lock.hold(self.layout.results, what="study run pool", shared=True), ProcessPoolExecutor(
                jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_orphaned_exit) as pool:
            while waiting or running:
                busy = {u.id for u in waiting} | {u.id for u, *_ in running.values()}
                for u in [u for u in waiting if not failed and not set(u.needs) & busy][:jobs - len(running)]:
                    waiting.remove(u)
                    t0 = time.perf_counter()
                    log = self.layout.checkpoints / f"{u.id}.log"
                    try:
                        request, read = self.request(u, lane)
                    except TokenReduceError as e:
                        failed.append(f"run {u.id} failed: {e}")
                        continue
                    running[pool.submit(_work, request, self._context(u, lane, print), log)] = (u, read, t0, log)
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    u, read, t0, log = running.pop(future)
                    try:
                        body = future.result()
                    except Exception as e:  # noqa: BLE001 - any failure of a worker is reported, naming its run
                        failed.append(f"run {u.id} failed ({e}); its log: {log}")
                        continue
                    self._record(u, body, read=read, threads=lane, t0=t0, extra={})
                    finished(u, time.perf_counter() - t0, jobs)
        if failed:
            raise TokenReduceError("; ".join(failed))


def _orphaned_exit() -> None:
    """A worker's start: it ends when the runner's process is gone (killed: its pool never tells the workers), as
    a killed run in-process would; the study resumes its runs where their checkpoints stand."""
    def watch() -> None:
        multiprocessing.parent_process().join()  # returns once the parent's end of the spawn pipe is closed
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _work(request: Any, ctx: RunContext, log: Path) -> dict[str, Any]:
    """A worker's run: ``request`` executed in ``ctx``, its output and progress lines into ``log``; a failure is
    re-raised as one line (its traceback stays in the log)."""
    import torch

    torch.set_num_threads(ctx.threads)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f, redirect_stdout(f), redirect_stderr(f):
        try:
            return execute(request, dataclasses.replace(ctx, log=lambda msg: print(msg, file=f, flush=True)))
        except BaseException as e:
            traceback.print_exc(file=f)
            raise TokenReduceError(f"{type(e).__name__}: {e}".splitlines()[0]) from None

