"""Running an evaluation: every task x harness x sample solved, graded, stored; resumable.

Tasks may be of any kind (`orchard.tasks.base`). A `Solver` turns an attempt into a submission: a
prediction file's, the gold patch, or an agent working in a sandbox (`orchard.eval.agent`). The
runner prepares the task images, runs attempts `concurrency` at a time (each solved, then graded
by its task's kind; kinds whose sandboxes start a browser get warm pools of them meanwhile,
`orchard.eval.attempt.TaskPools`, drained when the run ends), records each result as soon as it
is graded, with its files in the run's folder (`orchard.eval.report.write_attempt`: SWE-bench's
`logs/<instance_id>/` layout, the whole test log), and writes the summary (per harness: resolve
rate, mean score, pass@k, pass^k) and SWE-bench's report into the run's folder.

A run is named by what it does (`run_id_for` of `run_config`: the tasks' records and every
setting that changes what it finds), so the same evaluation started again resumes its run:
recorded attempts are skipped, except those the machine failed (`to_retry`: an `error` whose
fault is not the task's, tried again up to `MAX_RETRIES` times); `rerun` starts it afresh. Ctrl-C
stops a run within seconds, even while attempts wait on a model server: it is recorded as
interrupted with everything finished so far (`RunInterrupted`), and the attempts still running
get `INTERRUPT_GRACE` seconds, then are abandoned (their sandboxes go with the client). A run
stopped otherwise (a model server gone) waits for the attempts under way, which are recorded.
One process at a time runs a given run (`only_run`). Attempts a machine error ended
(`machine_error`) are no verdicts: the rates leave them out, and a run that has any ends `failed`.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
import time
from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from orchard.agents.loop import record_verdict
from orchard.agents.models import ModelUnavailable
from orchard.errors import OrchardError
from orchard.eval.attempt import TaskPools
from orchard.eval.live import Live, grading
from orchard.eval.metrics import mean_over_tasks, pass_at_k, pass_hat_k, spread, swebench_report
from orchard.eval.report import attempt_folder, outcome_cell, write_attempt, write_report
from orchard.store import ResultRecord, Store
from orchard.store.runs import add_result, delete_run, finish_run, record_metrics, results_of, start_run
from orchard.tasks.base import Grade, Prepare

if TYPE_CHECKING:
    from orchard.env.client import Client
    from orchard.tasks.base import TaskBase

LOG_TAIL = 4000
"""Characters of an attempt's log kept in the store; the whole log is in its `test_output.txt`."""
MAX_RETRIES = 2
"""Times a resumed run tries an attempt the machine failed again; then its `error` stands (a fault
that is the task's, or one that comes back every time, is no reason to try for ever)."""
INTERRUPT_GRACE = 5.0
"""Seconds the attempts under way at Ctrl-C get to finish (and be recorded) before they are abandoned."""


@dataclass(frozen=True)
class Attempt:
    task: TaskBase
    harness: str
    sample: int

    def result_id(self, run_id: str) -> str:
        return f"{run_id}/{self.task.instance_id}/{self.harness}/{self.sample}"


@dataclass
class Solved:
    """What a solver produced: the submission (SWE: a patch), and how it got there."""

    submission: str
    trajectory_id: str | None = None
    steps: int = 0
    tokens: int = 0
    error: str | None = None
    """Why the solver could not finish for a reason that is not the model's (a sandbox died, the
    model server did not answer): the attempt is an `error`, whatever the sandbox held."""
    ended: str | None = None
    """How an agent's episode ended when it did not submit (`truncated`, `aborted: 5 format errors
    in a row`): the model's doing, so its submission is graded all the same."""
    failure: OrchardError | None = None
    """The exception that ended the attempt, if one did; some stop the whole run (`stops_the_run`)."""
    submission_none: bool = False
    """A prediction whose submission was null, not even empty (SWE-bench's `patch_is_None`)."""


class Solver(Protocol):
    """Solves one attempt. One that makes no sandbox (a predictions file's) may say so with an
    attribute `needs_sandbox = False`: the run then warms no pools for it (`TaskPools`)."""

    def __call__(self, attempt: Attempt, image: str, client: Client, run_id: str) -> Solved: ...


@dataclass
class EvalResult:
    run_id: str
    folder: Path
    summary: dict[str, Any]
    results: list[ResultRecord] = field(default_factory=list)


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run; it is recorded as interrupted, with the attempts it finished."""

    def __init__(self, run_id: str, finished: int, total: int):
        super().__init__(f"run {run_id} stopped with {finished} of {total} attempts done")
        self.run_id, self.finished, self.total = run_id, finished, total


def run_id_for(kind: str, config: dict[str, Any]) -> str:
    """Runs are named by what they do, so the same evaluation finds its earlier run."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    return f"{kind}-{digest}"


def to_retry(record: ResultRecord) -> bool:
    """Whether a resumed run tries this attempt again: an `error` the machine made (its grade's
    `fault` is not `task`: a sandbox died, the model server failed, an image was missing) that
    has been retried fewer than `MAX_RETRIES` times. Every other outcome is a verdict, done."""
    if record.outcome != "error":
        return False
    details = _details(record)
    return details.get("fault") != "task" and int(details.get("retries") or 0) < MAX_RETRIES


def _details(record: ResultRecord) -> dict[str, Any]:
    try:
        details = json.loads(record.grade or "{}")
    except ValueError:
        return {}
    return details if isinstance(details, dict) else {}


def run_config(config: dict[str, Any], tasks: Sequence[TaskBase]) -> dict[str, Any]:
    """What an evaluation's run is filed under (and named by): its settings and its tasks' records,
    so that a changed task, like a changed setting, makes a new run."""
    return {**config, "task_records": tasks_digest(tasks)}


def tasks_digest(tasks: Sequence[TaskBase]) -> str:
    """A hash of the tasks' records (what a task file holds for each), in no particular order."""
    records = sorted(json.dumps(t.record(), sort_keys=True, default=str) for t in tasks)
    return hashlib.sha256(json.dumps(records).encode()).hexdigest()


def stops_the_run(exc: BaseException) -> bool:
    """Whether a solver's failure ends the whole run: the model server is gone for good, so every
    attempt after it would fail the same way (`ModelUnavailable`)."""
    return isinstance(exc, ModelUnavailable)


def evaluate(
    tasks: Sequence[TaskBase],
    harnesses: Sequence[str],
    samples: int,
    solve: Solver,
    *,
    client: Client,
    prepare: Prepare,
    config: dict[str, Any],
    name: str,
    concurrency: int = 2,
    store: Store | None = None,
    on_progress: Callable[[int, int, ResultRecord | None], None] | None = None,
    report_ids: Sequence[str] | None = None,
    kind: str = "eval",
    rerun: bool = False,
    recorded: dict[str, Any] | None = None,
) -> EvalResult:
    """Solve and grade every attempt not yet recorded in this evaluation's run (`kind` eval or
    collect), or every attempt with `rerun` (what the run recorded before is deleted first).
    The run is named by `config` and the tasks; `recorded` is kept with them in its config but
    names nothing (where the tasks came from: the same tasks from elsewhere are the same run).

    Ctrl-C raises `RunInterrupted`; a solver's failure that stops the run (`stops_the_run`) is
    raised as it is; either way the run is recorded as stopped with what it finished."""
    store = store or Store.open()
    config = run_config(config, tasks)
    run_id = run_id_for(kind, config)
    with only_run(run_id, store):
        if rerun:
            delete_run(run_id, store=store)
        attempts = [Attempt(t, h, s) for t in tasks for h in harnesses for s in range(samples)]
        kept = {**config, **(recorded or {}), "total_attempts": len(attempts)}  # for a live view's progress
        run, _resumed = start_run(run_id, kind, name, kept, store=store)
        earlier = {r.id: r for r in results_of(run_id, store=store)}
        retries = {key: int(_details(r).get("retries") or 0) + 1 for key, r in earlier.items() if to_retry(r)}
        pending = [a for a in attempts if a.result_id(run_id) not in earlier or a.result_id(run_id) in retries]
        total, finished = len(attempts), len(attempts) - len(pending)
        folder = store.run_folder(run_id)
        live = Live(folder)  # what is in flight, for a live view
        single = len(harnesses) * samples == 1
        if on_progress:
            on_progress(finished, total, None)
        try:
            images, image_facts = _images(pending, prepare, concurrency)
            startable = [(a.task, image) for a in pending if isinstance(image := images[a.task.instance_id], str)]
            pools = TaskPools(client, concurrency if getattr(solve, "needs_sandbox", True) else 0)

            def work(attempt: Attempt) -> ResultRecord:
                key = attempt.result_id(run_id)
                image = images[attempt.task.instance_id]
                if isinstance(image, str):
                    pools.taking(attempt.task, image)
                with live.attempt(key, attempt.task.instance_id, attempt.harness, attempt.sample):
                    return _attempt(run_id, attempt, images, solve, client, store, folder, single, retries.get(key, 0))

            with pools.warm(startable), _finished(in_threads(work, pending, concurrency)) as records:
                for record in records:
                    finished += 1
                    if on_progress:
                        on_progress(finished, total, record)
        except BaseException as exc:
            live.close()
            stopped = isinstance(exc, KeyboardInterrupt)
            partial = summarize(
                results_of(run_id, store=store), report_ids or [t.instance_id for t in tasks], metric_of(tasks)
            )
            error = "stopped by Ctrl-C" if stopped else str(exc) or type(exc).__name__
            finish_run(run_id, "interrupted" if stopped else "failed", partial, error=error, store=store)
            if stopped and not isinstance(exc, RunInterrupted):
                raise RunInterrupted(run_id, finished, total) from None
            raise
        live.close()
        results = results_of(run_id, store=store)
        summary = summarize(results, report_ids or [t.instance_id for t in tasks], metric_of(tasks))
        summary["images"] = image_facts
        (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (folder / "report.json").write_text(json.dumps(summary["report"], indent=2) + "\n")
        write_report(folder, summary, name)
        rates = {f"resolve_rate/{h}": row["resolve_rate"] for h, row in summary["harnesses"].items()}
        rates |= {
            f"score/{h}": row["mean_score"] for h, row in summary["harnesses"].items() if summary["metric"] == "score"
        }
        record_metrics(run_id, 0, rates, store=store)
        errors = sum(summary["machine_errors"].values())
        if errors:  # not a verdict on the model: the run says so, and its command exits non-zero
            error = f"{errors} of {len(results)} attempts ended by machine errors: " + ", ".join(
                summary["machine_errors"]
            )
            finish_run(run_id, "failed", summary, error=error, store=store)
        else:
            finish_run(run_id, "finished", summary, store=store)
        return EvalResult(run.id, folder, summary, results)


@contextmanager
def only_run(run_id: str, store: Store) -> Generator[None, None, None]:
    """Hold run `run_id` for this process: the same run started again while it runs (the same
    command twice on one home) is refused with one line, so that nothing is done or written twice.
    A lock on a file under the store's runs folder, which the system frees when its process ends."""
    import fcntl
    import os

    folder = store.runs / ".locks"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{run_id}.lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise OrchardError(
                f"run {run_id} is already running (process {holder}): wait for it to end, or stop it "
                "(Ctrl-C); the same command then resumes it"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def in_threads(work: Callable[[Any], Any], items: Sequence[Any], concurrency: int) -> Generator[Any, None, None]:
    """`work(item)` for every item, `concurrency` at a time, each result as soon as it is ready;
    the first exception one raises is raised here, and once it is (or the generator is closed)
    nothing more is started and the work under way is waited for, so that nothing still uses
    what the caller cleans up next (its sandboxes' client).

    At Ctrl-C (a KeyboardInterrupt in here, or thrown in: `_finished`) the work under way gets
    `INTERRUPT_GRACE` seconds, then is abandoned: daemon threads, not an executor, whose threads
    are joined at exit however long a model request hangs."""
    todo: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for item in items:
        todo.put(item)
    finished: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            try:
                item = todo.get_nowait()
            except queue.Empty:
                return
            try:
                finished.put((True, work(item)))
            except BaseException as exc:  # the caller raises it; no worker starts anything more
                stop.set()
                finished.put((False, exc))

    threads = [
        threading.Thread(target=worker, name=f"orchard-eval-{index}", daemon=True)
        for index in range(min(max(1, concurrency), len(items)))
    ]
    for thread in threads:
        thread.start()
    grace: float | None = None
    try:
        for _ in items:
            ok, value = finished.get()
            if not ok:
                raise value
            yield value
    except KeyboardInterrupt:
        grace = INTERRUPT_GRACE
        raise
    finally:
        stop.set()
        deadline = None if grace is None else time.monotonic() + grace
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))


@contextmanager
def _finished(work: Generator[Any, None, None]) -> Generator[Generator[Any, None, None], None, None]:
    """`in_threads`' results, closed when the block ends; a Ctrl-C in the block is thrown into it
    first, so the work under way gets only its grace, not all the time it needs."""
    try:
        yield work
    except KeyboardInterrupt as exc:
        with suppress(KeyboardInterrupt):
            work.throw(exc)
        raise
    finally:
        work.close()


def _images(
    attempts: Sequence[Attempt], prepare: Prepare, concurrency: int
) -> tuple[dict[str, str | OrchardError], dict[str, dict[str, Any]]]:
    """Each task's image (or why it could not be built), built `concurrency` at a time; and for
    the report, what each took this run (`seconds`: its build, or finding it built) with what its
    kind says of it (`TaskBase.image_facts`)."""
    tasks = {a.task.instance_id: a.task for a in attempts}
    began = time.time()

    def build(task: TaskBase) -> tuple[str, str | OrchardError, dict[str, Any]]:
        started = time.monotonic()
        try:
            image: str | OrchardError = task.sandbox_image(prepare)
        except OrchardError as exc:
            image = exc
        except Exception as exc:  # a kind's bug: that task's attempts are errors, the run goes on
            image = OrchardError(f"{type(exc).__name__}: {exc}")
        facts: dict[str, Any] = {"seconds": round(time.monotonic() - started, 1)}
        if isinstance(image, str):
            facts |= {"image": image, **task.image_facts(image)}
            facts["built"] = bool((facts.get("build") or {}).get("at", 0) >= began)
        return task.instance_id, image, facts

    done = list(in_threads(build, list(tasks.values()), concurrency))
    return {i: image for i, image, _ in done}, {i: facts for i, _, facts in done}


def _attempt(
    run_id: str,
    attempt: Attempt,
    images: dict[str, str | OrchardError],
    solve: Solver,
    client: Client,
    store: Store | None,
    folder: Path,
    single: bool,
    retry: int = 0,
) -> ResultRecord:
    """One attempt solved, graded, its files written (`single`: the run's only attempt at its task,
    filed in SWE-bench's own layout) and its result recorded (`retry`: how many times a resumed run
    has tried it again); then a failure that stops the run is raised."""
    task = attempt.task
    image = images[task.instance_id]
    solved = Solved(submission="")
    grade: Grade
    if isinstance(image, OrchardError):
        grade = Grade(task.instance_id, "error", error=f"no image for the task: {image}", fault="machine")
    else:
        fault: Literal["task", "machine"] = "machine"
        try:
            solved = solve(attempt, image, client, run_id)
        except OrchardError as exc:
            solved = Solved(submission="", error=f"the solver failed: {exc}", failure=exc)
        except Exception as exc:  # a bug in one attempt must not end the run; running it again finds it again
            solved = Solved(submission="", error=f"the solver failed ({type(exc).__name__}): {exc}")
            fault = "task"
        if solved.error:  # cut short by the machine: whatever the sandbox held is no verdict
            grade = Grade(task.instance_id, "error", error=solved.error, fault=fault)
        else:
            grading()
            grade = _graded(task, client, solved.submission, image)
    if solved.trajectory_id:
        record_verdict(solved.trajectory_id, grade.outcome, grade.resolved, store=store)
    files = attempt_folder(task.instance_id, attempt.harness, attempt.sample, single=single)
    details = grade.public()
    details["log"] = details["log"][-LOG_TAIL:]
    details["files"] = files
    if grade.outcome == "error" and grade.fault is None:  # a kind's error that names no fault: the machine's
        details["fault"] = "machine"
    for key, value in (
        ("solver_error", solved.error),
        ("episode", solved.ended),
        ("retries", retry),
        ("submission_none", solved.submission_none),
    ):
        if value:
            details[key] = value
    write_attempt(folder / files, task, grade, solved.submission, details)
    record = ResultRecord(
        id=attempt.result_id(run_id),
        run_id=run_id,
        instance_id=task.instance_id,
        harness=attempt.harness,
        sample=attempt.sample,
        outcome=grade.outcome,
        resolved=grade.resolved,
        patch=solved.submission,
        grade=json.dumps(details),
        trajectory_id=solved.trajectory_id,
        steps=solved.steps,
        tokens=solved.tokens,
        created_at=time.time(),
    )
    add_result(record, store=store)
    if solved.failure is not None and stops_the_run(solved.failure):
        raise solved.failure  # recorded first, as an error that a resumed run tries again
    return record


def metric_of(tasks: Sequence[TaskBase]) -> str:
    """`score` when any task's kind grades with scores, else `resolve_rate`."""
    return "score" if any(type(t).metric == "score" for t in tasks) else "resolve_rate"


def _graded(task: TaskBase, client: Client, submission: str, image: str) -> Grade:
    """The kind's grade, its score held to [0, 1]; a grader that fails is an `error` outcome."""
    try:
        grade = task.grade(client, submission, image)
    except OrchardError as exc:  # the sandbox went away, ...: not the attempt's fault
        return Grade(task.instance_id, "error", error=f"grading failed ({type(exc).__name__}): {exc}", fault="machine")
    except Exception as exc:  # a kind's bug: it fails the same way every time
        return Grade(task.instance_id, "error", error=f"grading failed ({type(exc).__name__}): {exc}", fault="task")
    grade.score = min(1.0, max(0.0, float(grade.score)))
    return grade


def summarize(results: Sequence[ResultRecord], task_ids: Sequence[str], metric: str = "resolve_rate") -> dict[str, Any]:
    """Per harness: resolve rate (the share that passed), mean score, pass@k and pass^k for k up to
    the samples, steps and tokens (means, and the spread of graded attempts'), outcomes by kind, how many attempts the grader flagged as
    suspicious (and of those, how many resolved: they count as resolved, flagged, so a reader sees
    them and can take them out); the flagged attempts with their reasons; which figure ranks them
    (`metric`); and SWE-bench's report for sample 0 of the first harness."""
    harnesses: dict[str, list[ResultRecord]] = {}
    for record in results:
        harnesses.setdefault(record.harness, []).append(record)
    table = {}
    for harness, records in harnesses.items():
        graded = [r for r in records if machine_error(r) is None]
        per_task: dict[str, tuple[int, int]] = {}
        for record in graded:
            n, c = per_task.get(record.instance_id, (0, 0))
            per_task[record.instance_id] = (n + 1, c + int(record.resolved))
        k_max = min((n for n, _ in per_task.values()), default=0)
        outcomes: dict[str, int] = {}
        for record in records:
            outcomes[record.outcome] = outcomes.get(record.outcome, 0) + 1
        flagged = [r for r in records if suspicious_of(r)]
        table[harness] = {
            "attempts": len(records),
            "graded": len(graded),
            "machine_errors": len(records) - len(graded),
            "tasks": len(per_task),
            "resolved": sum(r.resolved for r in records),
            "suspicious": len(flagged),
            "suspicious_resolved": sum(r.resolved for r in flagged),
            "resolve_rate": sum(r.resolved for r in graded) / max(1, len(graded)),
            "mean_score": sum(score_of(r) for r in graded) / max(1, len(graded)),
            "pass_at_k": {str(k): mean_over_tasks(per_task, k, pass_at_k) for k in range(1, k_max + 1)},
            "pass_hat_k": {str(k): mean_over_tasks(per_task, k, pass_hat_k) for k in range(1, k_max + 1)},
            "mean_steps": sum(r.steps for r in records) / len(records),
            "mean_tokens": sum(r.tokens for r in records) / len(records),
            "steps": spread([r.steps for r in graded]),
            "tokens": spread([r.tokens for r in graded]),
            "outcomes": dict(sorted(outcomes.items())),
        }
    first = next(iter(harnesses), None)
    outcomes_0 = {r.instance_id: r.outcome for r in harnesses.get(first or "", []) if r.sample == 0}
    causes: dict[str, int] = {}
    for record in results:
        cause = machine_error(record)
        if cause is not None:
            causes[cause] = causes.get(cause, 0) + 1
    cells: dict[str, dict[str, list[ResultRecord]]] = {}
    for record in results:
        cells.setdefault(record.instance_id, {}).setdefault(record.harness, []).append(record)
    return {
        "metric": metric,
        "harnesses": table,
        "tasks": {task: {h: outcome_cell(rs) for h, rs in row.items()} for task, row in sorted(cells.items())},
        "machine_errors": dict(sorted(causes.items(), key=lambda item: -item[1])),
        "report": swebench_report(task_ids, outcomes_0),
        "suspicious": [
            {"id": r.id, "outcome": r.outcome, "reasons": suspicious_of(r)} for r in results if suspicious_of(r)
        ],
    }


MACHINE_CAUSES = {
    "the model server failed": "is it up at --base-url, serving the model? After timeouts, raise --request-timeout",
    "the task's image could not be built": "its run_instance.log says why",
    "a sandbox failed": "is the Docker engine (or the cluster) up, with room to start sandboxes?",
    "the machine failed": "its run_instance.log says why",
}
"""The kinds of machine error a run reports, each with what to check; the same command tries the
attempts again (`to_retry`)."""


def machine_error(record: ResultRecord) -> str | None:
    """The kind of machine fault that ended an attempt (a `MACHINE_CAUSES` key), or None for an
    attempt that was graded (a verdict on the model, an `error` that is the task's included)."""
    if record.outcome != "error":
        return None
    details = _details(record)
    if details.get("fault") == "task":
        return None
    error = str(details.get("error") or "")
    if "model server" in error:
        return "the model server failed"
    if error.startswith("no image for the task"):
        return "the task's image could not be built"
    if "sandbox" in error.lower():
        return "a sandbox failed"
    return "the machine failed"


def machine_error_lines(causes: dict[str, int]) -> list[str]:
    """One line per kind of machine error, with its count and what to do."""
    return [
        f"machine error: {count} attempt{'s' if count > 1 else ''}: {cause} ({MACHINE_CAUSES.get(cause, '')}); "
        "not counted in the rates, and the same command tries them again"
        for cause, count in causes.items()
    ]


def score_of(record: ResultRecord) -> float:
    """The grade's score; for records made before grades had one, 1 when resolved, else 0."""
    try:
        score = json.loads(record.grade or "{}").get("score")
    except (ValueError, AttributeError):
        score = None
    return float(score) if isinstance(score, int | float) else float(record.resolved)


def suspicious_of(record: ResultRecord) -> list[str]:
    """Why the grader flagged an attempt (`Grade.suspicious`); none for records made before it did."""
    try:
        reasons = json.loads(record.grade or "{}").get("suspicious") or []
    except (ValueError, AttributeError):
        return []
    return [str(reason) for reason in reasons] if isinstance(reasons, list) else []
