"""Executing a study: its plan of idempotent runs, each writing one JSON.

A study's plan is its training runs (arm x grid point, id ``d_eet-b16-s0``) followed by its measures
(id = their name), which read the training runs' records, its probes (id = their name), which read
their checkpoints, and its benches (id = their name), which read nothing and run last, alone. A run
is done when its JSON exists (``<results>/runs/<id>.json``, written atomically at the end); a run is
executed in-process through study/entries.py, its checkpoints under ``<checkpoints>/<id>/``,
and a training run always resumes what an interrupted one left there (train()'s resume). So a killed
study continues where it stopped, ``--jobs N`` runs N at once (N processes of threads // N torch
threads each; measures and benches, which time, one at a time after the rest), and ``commands()``
gives one shell command per run for any scheduler. ``where`` (:func:`select`) narrows the plan to a slice
of the grid, e.g. the one-epoch runs on a CPU and the ten-epoch ones on a GPU.

The records are what a study keeps (results/ is committed; checkpoints are not): a measure takes each
fine-tuned run's own final evaluation, made on the same test items, from its record, and counts and
times its model and spec afresh (weights do not change the cost), so a study spread over machines or
checkouts measures runs whose checkpoints are long gone. A run that needs a checkpoint that is gone (a
probe, a second training phase) runs its source again first (:meth:`Runner._checkpoint`).

Digests: a training run's record names the SHA-256 of the checkpoint it wrote (``checkpoint_sha256``); a
run that reads a run's checkpoint (an evaluated arm, a probe, a measure, a second phase) refuses one whose
digest differs from its record's (a file swapped or changed in the checkpoints folder), and names the digest of
each checkpoint it read under ``read``. Records made before digests were kept hold none: their checkpoints are
read unchecked.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import TokenReduceError
from ..models.references import file_sha256
from .declare import EVALUATED, OFF_THE_SHELF, REFERENCE, Bench, Measure, Point, Probe, Study
from .records import load_records, read_record, relative, resolved
from .tables import item_pair


@dataclass(frozen=True)
class Layout:
    """Where a study's results (``results/runs/<id>.json``, summary.md) and checkpoints go."""

    results: Path
    checkpoints: Path

    def json(self, run_id: str) -> Path:
        return self.results / "runs" / f"{run_id}.json"


def layout_for(study: Study, out: str | None) -> Layout:
    """``--out DIR``: results in DIR, checkpoints in DIR/checkpoints. Without it: results/<study>/<bed>
    and runs/<study>/<bed> for a declared test bed, runs/studies/<study>-<bed>-<test bed or smoke>
    otherwise (a run on another test bed never lands beside the committed results)."""
    if out:
        return Layout(Path(out), Path(out) / "checkpoints")
    if study.default_bed and not study.is_smoke:
        return Layout(Path("results") / study.key, Path("runs") / study.key)
    root = Path("runs") / "studies" / f"{study.name}-{study.bed_name}-{'smoke' if study.is_smoke else study.bed.slug()}"
    return Layout(root, root / "checkpoints")


#: The kinds of run that time (measures and benches): each runs last, alone, with every thread.
TIMED = ("measure", "bench")


@dataclass(frozen=True)
class Unit:
    """One run of the plan: a training ``point`` (``needs``: the run an evaluated arm reads, or the one a
    second training phase starts from), a ``measure`` / ``probe`` that ``needs`` runs, or a ``bench``."""

    id: str
    point: Point | None = None
    step: Measure | Probe | Bench | None = None
    needs: tuple[str, ...] = ()

    evaluated: bool = False

    @property
    def kind(self) -> str:
        if self.point is not None:
            return "evaluate" if self.evaluated else "train"
        return "measure" if isinstance(self.step, Measure) else "bench" if isinstance(self.step, Bench) else "probe"


def plan(study: Study) -> list[Unit]:
    """The study's runs in execution order."""
    units = []
    for p in study.points():
        arm = study.arms[p.arm]
        units.append(Unit(p.id, point=p, needs=(study.point(arm.reads, p.values).id,) if arm.reads else (),
                          evaluated=arm.kind in (EVALUATED, OFF_THE_SHELF)))
    for m in study.measures:
        ref, tuned = study.measure_runs(m)
        units.append(Unit(m.name, step=m, needs=(*([ref] if ref else []), *tuned)))
    for pr in study.probes:
        if pr.fmnist_only and not study.bed.fmnist():
            continue  # the summary says why it is not run
        needs = (study.point(pr.arm, pr.at).id,) if pr.arm else \
            () if study.bed.reference else (study.point(study.baseline, {}).id,)
        units.append(Unit(pr.name, step=pr, needs=needs))
    units += [Unit(b.name, step=b) for b in study.benches]
    return units


def select(study: Study, units: Sequence[Unit], where: Mapping[str, Collection[str]]) -> list[Unit]:
    """The ``units`` in the grid slice ``where`` (axis name -> the values kept, written as in run ids'
    values: ``{"steps": {"937"}}``): the runs at those values, and the measures and probes whose every
    run read is in the slice; a bench, on no grid, is in none. An axis or value the study's grid lacks
    is refused, naming the valid ones."""
    axes = {a.name: a.values for a in study.axes()}
    for name, values in where.items():
        if name not in axes:
            raise TokenReduceError(f"study {study.name} has no grid axis {name!r}; its axes: {', '.join(axes)}")
        unknown = sorted(set(values) - {str(v) for v in axes[name]})
        if unknown:
            raise TokenReduceError(f"study {study.name}: {name}={','.join(unknown)} is not on its grid; valid: "
                                   f"{name}={','.join(map(str, axes[name]))}")

    def at(p: Point) -> bool:
        return all(str(p.values[name]) in values for name, values in where.items())

    inside = {u.id for u in units if u.point is not None and at(u.point)}
    return [u for u in units if u.id in inside or (u.point is None and u.needs and set(u.needs) <= inside)]


class Runner:
    """Runs a study's plan (module docstring). ``device``, ``amp``: where every run and measure runs its
    model and the forward's autocast (bf16, fp16, off); ``flags``: the test bed, device and output flags that
    the commands of :meth:`commands` repeat; ``where``: only this slice of the grid is run and listed
    (:func:`select`; :meth:`unit` still finds any run); ``log``: progress lines (stderr)."""

    def __init__(self, study: Study, layout: Layout, *, threads: int, device: str = "cpu", amp: str = "off",
                 flags: Sequence[str] = (), where: Mapping[str, Collection[str]] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.study, self.layout, self.threads, self.device, self.amp = study, layout, threads, device, amp
        self.flags = list(flags)
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        everything = plan(study)
        self.by_id = {u.id: u for u in everything}
        self.units = select(study, everything, where) if where else everything
        self.where = " ".join(f"{k}={','.join(sorted(v))}" for k, v in (where or {}).items())
        self._read: list[dict[str, str]] = []  # the checkpoints the run being made read, with their digests
        self._holding = False  # whether run_one holds the study's output (train/lock.py) in this process

    # -- state

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
        """One shell command per run, in plan order (runs that read others come after them)."""
        return [shlex.join(self.command(u)) for u in self.units]

    # -- execution

    def run_one(self, unit: Unit) -> dict[str, Any]:
        """Execute ``unit`` in-process (its needs must be done) and write its JSON; returns the document.

        Meanwhile the study's output is held (train/lock.py): shared by a run that trains or evaluates, alone
        by a timing (a measure, a bench), which so shares its cores with no other run writing there, another
        study's into the same ``--out`` included; the machine's load around it goes into its record
        (bench/load.py)."""
        if self._holding:  # a run made again inside another (_checkpoint): this process holds the output already
            return self._run_one(unit)
        from ..train import lock

        timing = unit.kind in TIMED
        with lock.hold(self.layout.results, what=f"{'timing' if timing else 'study'} run {unit.id}", shared=not timing):
            self._holding = True
            try:
                return self._run_one(unit)
            finally:
                self._holding = False

    def _run_one(self, unit: Unit) -> dict[str, Any]:
        from ..bench import load
        from ..bench.report import provenance, write_json

        missing = [n for n in unit.needs if not self.layout.json(n).is_file()]
        if missing:
            raise TokenReduceError(f"run {unit.id} reads the runs {missing}, which are not done; run them first")
        t0 = time.perf_counter()
        doc: dict[str, Any] = {"id": f"{self.study.key}/{unit.id}", "study": self.study.name,
                               "bed": self.study.bed_name, "run": unit.id, "kind": unit.kind,
                               "testbed": self.study.bed.describe(), "smoke": self.study.is_smoke,
                               "command": shlex.join(self.command(unit))}
        timing = unit.kind in TIMED
        outer, self._read = self._read, []  # a gone checkpoint is made again inside this run: its own list
        try:
            with load.watched(self.threads, self.log) if timing else nullcontext() as seen:
                self._work(unit, doc)
        finally:
            read, self._read = self._read, outer
        if read:
            doc["read"] = read
        doc["provenance"] = provenance(argv=self.command(unit), threads=self.threads, device=self.device,
                                       amp=self.amp, wall_s=round(time.perf_counter() - t0, 1),
                                       **({load.KEY: seen} if timing else {}))
        write_json(self.layout.json(unit.id), relative(doc, self.layout))
        return doc

    def _work(self, unit: Unit, doc: dict[str, Any]) -> None:
        """Do ``unit``'s work, adding its results to its record ``doc``."""
        from . import entries

        work = self.layout.checkpoints / unit.id
        if unit.kind == "evaluate" and self.study.arms[unit.point.arm].kind == OFF_THE_SHELF:
            doc.update(arm=unit.point.arm, point=unit.point.values, evaluates=REFERENCE, **self._off_the_shelf(unit))
        elif unit.kind == "evaluate":
            arm = self.study.arms[unit.point.arm]
            # its spec may name the run's settings: "oracle_at_counts(subset={eval_subset})", the source's items
            spec = arm.spec.format(**self.study.train_fields(unit.point, self.layout.checkpoints))
            probe = self._experiment(spec, self._checkpoint(unit.needs[0]), work)
            metrics, source = probe["result"].get("metrics", {}), self._doc(unit.needs[0])
            for metric in sorted(set(metrics.get("items") or {}) & set(source["metrics"].get("items") or {})):
                item_pair({"id": doc["id"], "metrics": metrics}, source, metric)  # refused here, not at the report
            doc.update(arm=unit.point.arm, point=unit.point.values, evaluates=unit.needs[0], **probe, metrics=metrics)
        elif unit.point is not None:
            doc.update(arm=unit.point.arm, point=unit.point.values, **self._train(unit))
        elif isinstance(unit.step, Measure):
            m = unit.step
            ref_id, tuned_ids = self.study.measure_runs(m)
            ref = self._checkpoint(ref_id) if ref_id else self._reference()
            tuned = [{"name": n, "model": self._model(n), "seed": self._doc(n)["config"].get("seed"),
                      "metrics": self._doc(n)["metrics"]} for n in tuned_ids]
            speed = {**m.speed, **self.study.smoke_over("measure")}
            data_dir, subset = self.study.eval_items(self.layout.checkpoints)  # the runs' test items
            doc.update(point=m.at, result=entries.evaluate(ref, m.specs, tuned, out=work, threads=self.threads,
                                                           speed=speed, data_dir=data_dir, subset=subset,
                                                           device=self.device, amp=self.amp, log=self.log))
        elif isinstance(unit.step, Bench):
            b = self.study.bench_run(unit.step)
            doc["result"] = entries.bench(b.model, b.specs, checkpoint=b.checkpoint, control=b.control,
                                          match_random=b.match_random, stem=b.stem, speed=b.speed, threads=self.threads,
                                          device=self.device, amp=self.amp, argv=self.command(unit), log=self.log)
        else:
            doc.update(self._probe(unit, work))

    def _off_the_shelf(self, unit: Unit) -> dict[str, Any]:
        """An arm evaluated on the test bed's reference (``Arm.kind`` off_the_shelf): its spec off the shelf on the fold
        of the test items its seed names (the seed's place among the planned seeds)."""
        from . import entries

        p = unit.point
        spec = self.study.arms[p.arm].spec.format(**p.values)
        seeds = list(next(a.values for a in self.study.axes() if a.name == "seed"))
        data_dir, subset = self.study.eval_items(self.layout.checkpoints)
        return entries.off_the_shelf(spec, checkpoint=self._reference(), data_dir=data_dir, subset=subset,
                                     fold=(seeds.index(p.values["seed"]), len(seeds)), threads=self.threads,
                                     device=self.device, amp=self.amp)

    def _reference(self) -> str:
        """The test bed's reference checkpoint; on a bed without one (a smoke's), its model at the seed-0
        initialisation, saved once under the checkpoints folder (what off-the-shelf arms and measures read)."""
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

    def _train(self, unit: Unit) -> dict[str, Any]:
        """Train (or resume) the training run ``unit``; returns its config and final metrics."""
        from . import entries

        fields = self.study.train_fields(unit.point, self.layout.checkpoints)
        if unit.needs:  # a second phase: it starts from the first phase's checkpoint
            fields["init"] = self._checkpoint(unit.needs[0])
        fields.update(out=str(self.layout.checkpoints / unit.id), resume=True, threads=self.threads,
                      device=self.device)
        if self.amp != "off":  # off leaves a study's own amp (none of them sets one today) standing
            fields["amp"] = self.amp
        made = entries.train_run(fields)
        return {**made, "checkpoint_sha256": file_sha256(made["metrics"]["checkpoint"])}

    def _doc(self, run_id: str) -> dict[str, Any]:
        """The record of run ``run_id``, checked, its paths resolved where the study is now."""
        return resolved(read_record(self.layout.json(run_id), self.study, units=self.by_id), self.layout)

    def _checkpoint(self, run_id: str) -> str:
        """The checkpoint of the done training run ``run_id``. One that is gone (the results are kept,
        the checkpoints are not: a new checkout, another machine) is made again by running the run
        again. Where that does not reproduce the recorded metric (another machine's arithmetic), the
        new run replaces the record, which keeps the old one's metric and provenance under
        ``replaces``: a record describes the checkpoint later runs read. Where a done run read the old
        run, the error names it (its result no longer matches the record)."""
        from ..bench.report import write_json

        doc = self._doc(run_id)
        path = doc["metrics"]["checkpoint"]  # resolved (_doc)
        if Path(path).is_file():
            digest, recorded = file_sha256(path), doc.get("checkpoint_sha256")
            if recorded is not None and digest != recorded:
                raise TokenReduceError(f"{path} is not the checkpoint run {run_id} wrote: its SHA-256 is "
                                       f"{digest[:12]}..., its record {self.layout.json(run_id)} names "
                                       f"{recorded[:12]}... (the file was replaced or changed); restore it, or "
                                       f"delete it to make it again by running {run_id} again")
            self._read.append({"path": path, "sha256": digest})
            return path
        unit = self.unit(run_id)
        if unit.kind != "train":
            raise TokenReduceError(f"run {run_id} has no checkpoint of its own to read ({unit.kind})")
        readers = [u.id for u in self.by_id.values() if run_id in u.needs and self.done(u)]
        self.log(f"{self.study.key}/{run_id}: its checkpoint {path} is gone; running it again to make it")
        again = self.run_one(unit)
        metric = doc["metrics"]["metric"]
        if again["metrics"][metric] != doc["metrics"][metric]:
            self.log(f"{self.study.key}/{run_id}: made again, {metric} {again['metrics'][metric]} (recorded "
                     f"{doc['metrics'][metric]}, {doc['metrics']['provenance'].get('cpu')}); the new run replaces "
                     "its record")
            again["replaces"] = {"why": "its checkpoint was gone and running it again did not reproduce its metric",
                                 "metrics": {metric: doc["metrics"][metric]}, "provenance": doc["provenance"],
                                 "cpu": doc["metrics"]["provenance"].get("cpu")}
            write_json(self.layout.json(run_id), relative(again, self.layout))
            if readers:
                raise TokenReduceError(f"{run_id} made again gave {metric} {again['metrics'][metric]}, not the "
                                       f"recorded {doc['metrics'][metric]} (its record now holds the new run), and "
                                       f"the done runs {readers} read the old run: delete their records to make "
                                       "them again from the new one")
        self._read.append({"path": again["metrics"]["checkpoint"], "sha256": again["checkpoint_sha256"]})
        return again["metrics"]["checkpoint"]

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
        if unit.needs:
            return self._model(unit.needs[0])
        start = self.study.bed.checkpoint() or config.get("init")
        if start is None:
            raise TokenReduceError(f"run {run_id} names no model and starts from no run or reference")
        return read_meta(start)["model"]

    def _probe(self, unit: Unit, work: Path) -> dict[str, Any]:
        checkpoint = self._checkpoint(unit.needs[0]) if unit.needs else self.study.bed.checkpoint()
        return self._experiment(unit.step.experiment, checkpoint, work)

    def _experiment(self, spec: str, checkpoint: str | None, work: Path) -> dict[str, Any]:
        """Run the experiment ``spec`` on ``checkpoint``, with the test bed's data where it takes one."""
        from ..core.registry import format_spec, parse_spec
        from . import entries

        name, params = parse_spec(spec)
        params["checkpoint"] = checkpoint
        bed = self.study.bed.train_fields(self.layout.checkpoints)
        takes = _fields(name)
        if bed.get("data") and bed["data"] != "fashion_mnist" and "data" in takes:  # others read the checkpoint's
            params["data"] = bed["data"]
        if bed.get("data_dir") and "data_dir" in takes:
            params["data_dir"] = bed["data_dir"]
        params.update(self.study.smoke_over("probe"))
        return entries.probe(format_spec(name, params), out=work, threads=self.threads, device=self.device,
                             amp=self.amp, log=self.log)

    def run(self, jobs: int = 1) -> list[str]:
        """Run every run not done yet (``jobs`` at a time, in subprocesses when > 1; measures and benches,
        which time, last, one at a time in-process with every thread: a timing shares its cores with
        nothing); returns the ids run."""
        pending = [u for u in self.units if not self.done(u)]
        total, ran, times = len(self.units), [], []
        self.log(f"study {self.study.key}: {len(pending)} of {total} runs{f' at {self.where}' if self.where else ''} "
                 f"to do on {self.study.bed.text()}"
                 f"{' (smoke)' if self.study.is_smoke else ''}; results in {self.layout.results}")
        for axis in (a for a in self.study.axes() if a.sets and len(a.values) > 1):  # a setting such as the length
            count = {v: sum(u.point is not None and u.point.values.get(axis.name) == v for u in pending)
                     for v in axis.values}
            if sum(n > 0 for n in count.values()) > 1:
                self.log(f"  to do by {axis.name}: " + ", ".join(f"{v}: {n}" for v, n in count.items() if n)
                         + f" (--where {axis.name}=V runs one)")
        timed = [u for u in pending if u.kind in TIMED]
        rest = [u for u in pending if u not in timed]
        waves = [([u for u in rest if not u.needs], jobs), ([u for u in rest if u.needs], jobs), (timed, 1)]
        for wave, lanes in waves:
            def one(u: Unit, lanes: int = lanes) -> str:
                t0 = time.perf_counter()
                if lanes > 1:
                    self._subprocess(u, max(1, self.threads // jobs))
                else:
                    self.run_one(u)
                times.append(time.perf_counter() - t0)
                ran.append(u.id)
                left = len(pending) - len(ran)
                eta = sum(times) / len(times) * left / max(1, min(lanes, left or 1))
                self.log(f"[{total - left}/{total}] {self.study.key}/{u.id} done in {times[-1]:.0f} s; "
                         f"{left} left, about {eta / 60:.1f} min")
                return u.id

            if lanes > 1:
                with ThreadPoolExecutor(max_workers=lanes) as pool:
                    list(pool.map(one, wave))
            else:
                for u in wave:
                    one(u)
        return ran

    def _subprocess(self, unit: Unit, threads: int) -> None:
        argv = [sys.executable, "-m", "tokenreduce.cli", *self.command(unit, threads)[1:]]
        log = self.layout.checkpoints / f"{unit.id}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as f:
            rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            raise TokenReduceError(f"run {unit.id} failed (exit status {rc}); its log: {log}")


def _fields(experiment: str) -> set[str]:
    import dataclasses

    from ..probes.base import get_experiment

    cfg = get_experiment(experiment).Config
    return {f.name for f in dataclasses.fields(cfg)} if dataclasses.is_dataclass(cfg) else set()


def load_runs(layout: Layout, study: Study | None = None) -> dict[str, dict[str, Any]]:
    """Run id -> the record of every run JSON in ``layout``, each checked against ``study`` (records.py: a
    record that fails is refused, naming the file and the field, never dropped or read as it is)."""
    return load_records(layout.results / "runs", study)

