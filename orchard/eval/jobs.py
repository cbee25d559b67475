"""`orchard eval` and `orchard collect` as library calls: a config (`orchard.eval.config`) in, runs out.

An evaluation is one job per model (or one for a predictions file), each a run of the store made
by `evaluate`: the same attempts, filed as `eval` or `collect` runs. The CLI builds the config from
its flags or a file and prints what these return; a script can call them the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.eval.runner import EvalResult, Solver, evaluate
from orchard.tasks import Prepare, load_tasks

if TYPE_CHECKING:
    from orchard.env.client import Client
    from orchard.eval.config import CollectRunConfig, EvalConfig


@dataclass
class Job:
    """One run to make: who solves (a model, or predictions), which tasks, under which harnesses."""

    name: str
    tasks: list[Any]
    harnesses: list[str]
    samples: int
    solve: Solver
    config: dict[str, Any]


def jobs(config: EvalConfig | CollectRunConfig) -> tuple[list[Any], list[Job]]:
    """The task set and a job per model (or one for predictions), every name checked before anything runs."""
    from orchard.agents import harness_factory
    from orchard.agents.loop import Limits
    from orchard.agents.models import model_from_spec
    from orchard.eval.agent import agent_solver

    tasks = load_tasks(config.tasks, split=config.split, ids=config.ids)
    source = str(Path(config.tasks).resolve()) if Path(config.tasks).exists() else config.tasks
    base_url = config.base_url or os.environ.get("OPENAI_BASE_URL") or None  # as the flag reads it
    predictions = getattr(config, "predictions", None)
    if predictions is not None:
        from orchard.eval.predictions import load_predictions, solver_for

        name, patches = load_predictions(predictions, tasks)
        chosen = [t for t in tasks if t.instance_id in patches]
        digest = hashlib.sha256(json.dumps(sorted(patches.items())).encode()).hexdigest()
        run: dict[str, Any] = {
            "tasks": source,
            "ids": [t.instance_id for t in chosen],
            "predictions": name,
            "patches": digest,
        }
        return tasks, [Job(name, chosen, [name], 1, solver_for(patches), run)]
    for harness in config.harnesses:
        harness_factory(harness)  # a wrong name is one line now, not an error per attempt
    found = []
    for spec in config.models or []:
        agent = model_from_spec(spec, base_url=base_url)
        settings: dict[str, Any] = {
            "tasks": source,
            "ids": [t.instance_id for t in tasks],
            "model": spec,
            "base_url": base_url,
            "harnesses": config.harnesses,
            "k": config.k,
            "max_steps": config.episode_steps,  # the key older runs were filed under: a rerun resumes them
        }
        solve = agent_solver(agent, Limits(max_steps=config.episode_steps))
        found.append(Job(agent.name, tasks, list(config.harnesses), config.k, solve, settings))
    return tasks, found


def run_jobs(
    config: EvalConfig | CollectRunConfig,
    tasks: list[Any],
    found: list[Job],
    kind: str,
    client: Client,
    *,
    progress: Callable[[], Any] | None = None,
) -> Iterator[tuple[Job, EvalResult]]:
    """Each job's finished run (of `jobs(config)`), in order (`kind` eval or collect); `progress()`
    makes a context manager that is called with (done, total, record) as attempts finish."""
    import contextlib

    prepare = Prepare(config.repos)
    for job in found:
        with progress() if progress else contextlib.nullcontext() as on_progress:
            result = evaluate(
                job.tasks,
                job.harnesses,
                job.samples,
                job.solve,
                client=client,
                prepare=prepare,
                config=job.config,
                name=f"{kind} {Path(config.tasks).name} {job.name}",
                concurrency=config.concurrency,
                on_progress=on_progress,
                report_ids=[t.instance_id for t in tasks],
                kind=kind,
            )
        yield job, result


def swebench_reports(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """SWE-bench's report of the one job, or of each job by name."""
    reports = {name: summary["report"] for name, summary in summaries.items()}
    return reports if len(reports) > 1 else next(iter(reports.values()))
