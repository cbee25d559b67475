"""Running an evaluation: every task x harness x sample solved, graded, stored; resumable.

Tasks may be of any kind (`orchard.tasks.base`). A `Solver` turns an attempt into a submission: a
prediction file's, the gold patch, or an agent working in a sandbox (`orchard.eval.agent`). The
runner prepares the task images, runs attempts `concurrency` at a time (each solved, then graded
by its task's kind), records each result as soon as it is graded, and writes the summary (per
harness: resolve rate, mean score, pass@k, pass^k) and SWE-bench's report into the run's folder.
The same evaluation started again resumes its run: recorded attempts are skipped.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from orchard.agents.loop import record_verdict
from orchard.errors import OrchardError
from orchard.eval.metrics import mean_over_tasks, pass_at_k, pass_hat_k, swebench_report
from orchard.eval.report import write_report
from orchard.store import ResultRecord, Store
from orchard.store.runs import add_result, finish_run, record_metrics, results_of, start_run
from orchard.tasks.base import Grade, Prepare

if TYPE_CHECKING:
    from orchard.env.client import Client
    from orchard.tasks.base import TaskBase

LOG_TAIL = 4000


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


class Solver(Protocol):
    def __call__(self, attempt: Attempt, image: str, client: Client, run_id: str) -> Solved: ...


@dataclass
class EvalResult:
    run_id: str
    folder: Path
    summary: dict[str, Any]
    results: list[ResultRecord] = field(default_factory=list)


def run_id_for(kind: str, config: dict[str, Any]) -> str:
    """Runs are named by what they do, so the same evaluation finds its earlier run."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    return f"{kind}-{digest}"


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
) -> EvalResult:
    """Solve and grade every attempt not yet recorded in this evaluation's run (`kind` eval or collect)."""
    run_id = run_id_for(kind, config)
    run, _resumed = start_run(run_id, kind, name, config, store=store)
    attempts = [Attempt(t, h, s) for t in tasks for h in harnesses for s in range(samples)]
    done = {r.id for r in results_of(run_id, store=store)}
    pending = [a for a in attempts if a.result_id(run_id) not in done]
    total, finished = len(attempts), len(attempts) - len(pending)
    if on_progress:
        on_progress(finished, total, None)
    try:
        images = _images(pending, prepare, concurrency)
        with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="orchard-eval") as pool:
            futures = [pool.submit(_attempt, run_id, a, images, solve, client, store) for a in pending]
            try:
                for future in as_completed(futures):
                    record = future.result()
                    finished += 1
                    if on_progress:
                        on_progress(finished, total, record)
            except BaseException:
                for future in futures:  # Ctrl-C: start nothing more; what runs finishes and is recorded
                    future.cancel()
                raise
    except BaseException as exc:
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        partial = summarize(
            results_of(run_id, store=store), report_ids or [t.instance_id for t in tasks], metric_of(tasks)
        )
        finish_run(run_id, status, partial, error=str(exc) or type(exc).__name__, store=store)
        raise
    results = results_of(run_id, store=store)
    summary = summarize(results, report_ids or [t.instance_id for t in tasks], metric_of(tasks))
    folder = (store or Store.open()).run_folder(run_id)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (folder / "report.json").write_text(json.dumps(summary["report"], indent=2) + "\n")
    write_report(folder, summary, name)
    rates = {f"resolve_rate/{h}": row["resolve_rate"] for h, row in summary["harnesses"].items()}
    rates |= {
        f"score/{h}": row["mean_score"] for h, row in summary["harnesses"].items() if summary["metric"] == "score"
    }
    record_metrics(run_id, 0, rates, store=store)
    finish_run(run_id, "finished", summary, store=store)
    return EvalResult(run.id, folder, summary, results)


def _images(attempts: Sequence[Attempt], prepare: Prepare, concurrency: int) -> dict[str, str | OrchardError]:
    """Each task's image (or why it could not be built), built `concurrency` at a time."""
    tasks = {a.task.instance_id: a.task for a in attempts}
    images: dict[str, str | OrchardError] = {}

    def build(task: TaskBase) -> None:
        try:
            images[task.instance_id] = task.sandbox_image(prepare)
        except OrchardError as exc:
            images[task.instance_id] = exc
        except Exception as exc:  # a kind's bug: that task's attempts are errors, the run goes on
            images[task.instance_id] = OrchardError(f"{type(exc).__name__}: {exc}")

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        list(pool.map(build, tasks.values()))
    return images


def _attempt(
    run_id: str,
    attempt: Attempt,
    images: dict[str, str | OrchardError],
    solve: Solver,
    client: Client,
    store: Store | None,
) -> ResultRecord:
    task = attempt.task
    image = images[task.instance_id]
    solved = Solved(submission="")
    grade: Grade
    if isinstance(image, OrchardError):
        grade = Grade(task.instance_id, "error", error=f"no image for the task: {image}")
    else:
        try:
            solved = solve(attempt, image, client, run_id)
        except OrchardError as exc:
            solved = Solved(submission="", error=f"the solver failed: {exc}")
        except Exception as exc:  # a bug or a surprise in one attempt must not end the run
            solved = Solved(submission="", error=f"the solver failed ({type(exc).__name__}): {exc}")
        if solved.error and not solved.submission.strip():
            grade = Grade(task.instance_id, "error", error=solved.error)
        else:
            grade = _graded(task, client, solved.submission, image)
    if solved.trajectory_id:
        record_verdict(solved.trajectory_id, grade.outcome, grade.resolved, store=store)
    details = grade.public()
    details["log"] = details["log"][-LOG_TAIL:]
    if solved.error:
        details["solver_error"] = solved.error
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
    return record


def metric_of(tasks: Sequence[TaskBase]) -> str:
    """`score` when any task's kind grades with scores, else `resolve_rate`."""
    return "score" if any(type(t).metric == "score" for t in tasks) else "resolve_rate"


def _graded(task: TaskBase, client: Client, submission: str, image: str) -> Grade:
    """The kind's grade, its score held to [0, 1]; a grader that fails is an `error` outcome."""
    try:
        grade = task.grade(client, submission, image)
    except Exception as exc:  # OrchardError (the sandbox went away) or a kind's bug: not the attempt's fault
        return Grade(task.instance_id, "error", error=f"grading failed ({type(exc).__name__}): {exc}")
    grade.score = min(1.0, max(0.0, float(grade.score)))
    return grade


def summarize(results: Sequence[ResultRecord], task_ids: Sequence[str], metric: str = "resolve_rate") -> dict[str, Any]:
    """Per harness: resolve rate (the share that passed), mean score, pass@k and pass^k for k up to
    the samples, steps, tokens, outcomes by kind, how many attempts the grader flagged as
    suspicious (and of those, how many resolved: they count as resolved, flagged, so a reader sees
    them and can take them out); the flagged attempts with their reasons; which figure ranks them
    (`metric`); and SWE-bench's report for sample 0 of the first harness."""
    harnesses: dict[str, list[ResultRecord]] = {}
    for record in results:
        harnesses.setdefault(record.harness, []).append(record)
    table = {}
    for harness, records in harnesses.items():
        per_task: dict[str, tuple[int, int]] = {}
        for record in records:
            n, c = per_task.get(record.instance_id, (0, 0))
            per_task[record.instance_id] = (n + 1, c + int(record.resolved))
        k_max = min(n for n, _ in per_task.values())
        outcomes: dict[str, int] = {}
        for record in records:
            outcomes[record.outcome] = outcomes.get(record.outcome, 0) + 1
        flagged = [r for r in records if suspicious_of(r)]
        table[harness] = {
            "attempts": len(records),
            "tasks": len(per_task),
            "resolved": sum(r.resolved for r in records),
            "suspicious": len(flagged),
            "suspicious_resolved": sum(r.resolved for r in flagged),
            "resolve_rate": sum(r.resolved for r in records) / len(records),
            "mean_score": sum(score_of(r) for r in records) / len(records),
            "pass_at_k": {str(k): mean_over_tasks(per_task, k, pass_at_k) for k in range(1, k_max + 1)},
            "pass_hat_k": {str(k): mean_over_tasks(per_task, k, pass_hat_k) for k in range(1, k_max + 1)},
            "mean_steps": sum(r.steps for r in records) / len(records),
            "mean_tokens": sum(r.tokens for r in records) / len(records),
            "outcomes": dict(sorted(outcomes.items())),
        }
    first = next(iter(harnesses), None)
    outcomes_0 = {r.instance_id: r.outcome for r in harnesses.get(first or "", []) if r.sample == 0}
    return {
        "metric": metric,
        "harnesses": table,
        "report": swebench_report(task_ids, outcomes_0),
        "suspicious": [
            {"id": r.id, "outcome": r.outcome, "reasons": suspicious_of(r)} for r in results if suspicious_of(r)
        ],
    }


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
