"""`orchard eval` and `orchard collect` as library calls: a config (`orchard.eval.config`) in, runs out.

An evaluation is one job per model (or one for a predictions file), each a run of the store made
by `evaluate`: the same attempts, filed as `eval` or `collect` runs, named by what changes what
they find (`settings`, the model's own `settings`, the tasks' contents) and by nothing else. The
CLI builds the config from its flags or a file and prints what these return; a script can call
them the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.errors import InvalidRequest
from orchard.eval.runner import EvalResult, Solver, evaluate
from orchard.tasks import Prepare, load_tasks

if TYPE_CHECKING:
    from orchard.env.client import Client
    from orchard.eval.config import CollectRunConfig, EvalConfig
    from orchard.store import Store


HOW_IT_RUNS = frozenset({"concurrency", "repos", "report", "rerank", "rerun", "request_timeout"})
"""Settings that change how a run goes, not what it finds: runs that differ only in these are one
run (resumed with a bigger timeout, more at once, the repositories elsewhere)."""
MODEL_OPTIONS = ("base_url", "max_tokens", "temperature")
"""Settings that reach the model: a run is named by what the model makes of them (its `settings`:
`noop` takes none of them, `openai:NAME` 2048 tokens whether they are given or not)."""
GRADING = ("split", "image_source", "ids")
"""What a predictions run is named by, with the tasks' contents and the patches: grading takes no other setting."""


def settings(config: EvalConfig | CollectRunConfig) -> dict[str, Any]:
    """The settings a job's run is named by: every one of the config but `HOW_IT_RUNS`,
    `MODEL_OPTIONS` and who solves, with the ids in order. Not where the tasks came from: their
    contents name the run (in `evaluate`), so the same tasks moved elsewhere are the same run."""
    exclude = set(HOW_IT_RUNS) | set(MODEL_OPTIONS) | {"models", "predictions", "tasks"}
    values = config.model_dump(mode="json", exclude=exclude)
    if values.get("ids"):
        values["ids"] = sorted(values["ids"])
    return values


def model_settings(model: Any, config: EvalConfig | CollectRunConfig) -> dict[str, Any]:
    """What the model makes of `MODEL_OPTIONS` (its `settings`); for an adapter without them, the
    options as given, the server as the flag reads it."""
    own = getattr(model, "settings", None)
    if isinstance(own, dict):
        return own
    given = {name: getattr(config, name) for name in MODEL_OPTIONS}
    given["base_url"] = given["base_url"] or os.environ.get("OPENAI_BASE_URL")
    return {name: value for name, value in given.items() if value is not None}


@dataclass
class Job:
    """One run to make: who solves (a model, or predictions), which tasks, under which harnesses."""

    name: str
    tasks: list[Any]
    harnesses: list[str]
    samples: int
    solve: Solver
    config: dict[str, Any]
    """What its run is named by (`evaluate` adds the tasks' contents)."""
    recorded: dict[str, Any]
    model: Any = None
    """The model solving, when one does: whoever runs the job closes it after (`close()`, where it has
    one: a server it started)."""
    """Kept with the run's config, naming nothing: where the tasks came from."""


def jobs(
    config: EvalConfig | CollectRunConfig, *, tasks: list[Any] | None = None, store: Store | None = None
) -> tuple[list[Any], list[Job]]:
    """The task set (`tasks` when given: the config's, loaded already) and a job per model (or one
    for predictions), every name checked before anything runs (each model's server asked once:
    `model_from_spec`); the agents' trajectories go to `store`."""
    from orchard.agents import harness_factory
    from orchard.agents.loop import Limits
    from orchard.agents.models import model_from_spec
    from orchard.eval.agent import agent_solver

    every = load_tasks(config.tasks, split=config.split) if tasks is None else tasks
    config = config.model_copy(update={"harnesses": config.harnesses_for(every)})  # none named: the kind's own
    tasks = _only(every, config.ids, config.tasks)
    recorded = {"tasks": str(Path(config.tasks).resolve()) if Path(config.tasks).exists() else config.tasks}
    predictions = getattr(config, "predictions", None)
    if predictions is not None:
        from orchard.eval.predictions import load_predictions, solver_for

        name, patches = load_predictions(predictions, every)
        wanted = {t.instance_id for t in tasks}  # predictions for tasks --ids leaves out are not graded
        patches = {i: p for i, p in patches.items() if i in wanted}
        chosen = [t for t in tasks if t.instance_id in patches]
        digest = hashlib.sha256(json.dumps(sorted(patches.items())).encode()).hexdigest()
        run = {key: value for key, value in settings(config).items() if key in GRADING}
        run |= {"ids": sorted(patches), "predictions": name, "patches": digest}
        return tasks, [Job(name, chosen, [name], 1, solver_for(patches), run, recorded)]
    offers_tools = False
    harnesses = list(config.harnesses or ())
    for harness in harnesses:
        offers_tools |= bool(harness_factory(harness)().tools())  # a wrong name is one line now
    found = []
    for spec in config.models or []:
        agent = model_from_spec(
            spec,
            base_url=config.base_url or os.environ.get("OPENAI_BASE_URL"),
            max_tokens=config.max_tokens,
            temperature=config.temperature,
            request_timeout=config.request_timeout,
            tools=offers_tools,
        )
        run = settings(config) | {"model": spec, "model_settings": model_settings(agent, config)}
        solve = agent_solver(agent, Limits(episode_steps=config.episode_steps), store=store)
        found.append(Job(agent.name, tasks, harnesses, config.k, solve, run, recorded, agent))
    return tasks, found


def _only(tasks: list[Any], ids: list[str] | None, source: str) -> list[Any]:
    """The tasks `ids` names (all without), in the task set's order; an id it lacks is an error."""
    if not ids:
        return tasks
    missing = sorted(set(ids) - {t.instance_id for t in tasks})
    if missing:
        raise InvalidRequest(f"{source} has no task {', '.join(missing)}")
    return [t for t in tasks if t.instance_id in set(ids)]


def run_jobs(
    config: EvalConfig | CollectRunConfig,
    tasks: list[Any],
    found: list[Job],
    kind: str,
    client: Client,
    *,
    progress: Callable[[], Any] | None = None,
    name: Callable[[Job], str] | None = None,
    store: Store | None = None,
) -> Iterator[tuple[Job, EvalResult]]:
    """Each job's finished run (of `jobs(config)`), in order (`kind` eval or collect), in `store`;
    `progress()` makes a context manager that is called with (done, total, record) as attempts
    finish; `name(job)` names its run (default: the kind, the task file and the job)."""
    import contextlib

    prepare = Prepare(config.repos, image_source=config.image_source)
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
                name=name(job) if name else f"{kind} {Path(config.tasks).name} {job.name}",
                concurrency=config.concurrency,
                on_progress=on_progress,
                report_ids=[t.instance_id for t in tasks],
                kind=kind,
                rerun=config.rerun,
                recorded=job.recorded,
                store=store,
            )
        yield job, result


def swebench_reports(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """SWE-bench's report of the one job, or of each job by name."""
    reports = {name: summary["report"] for name, summary in summaries.items()}
    return reports if len(reports) > 1 else next(iter(reports.values()))
