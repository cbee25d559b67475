"""`orchard train RECIPE --config FILE`: a recipe, stage by stage, each a run in the store.

Every recipe runs this one pipeline on its task kinds: the stages only call the task-kind protocol
(`orchard.tasks.base`) and the student (`orchard.train.student`: a text or a vision-language
model), so what differs is the config.

1. collect: each teacher (any model spec) works every task under the collection harnesses, k
   samples each, graded; every trajectory is kept with its verdict;
2. credit: the unresolved trajectories get per-step values, credits and rise segments (replay
   or judge);
3. sft: the student learns from resolved trajectories whole and unresolved ones by their rise
   segments (TRL SFT);
4. rl: GRPO with Balanced Adaptive Rollout from the SFT checkpoint, harness drawn per rollout;
5. value: a value model on every graded trajectory so far (collection and RL rollouts alike);
6. eval (optional): the final policy under the eval harnesses (one may be held out of training),
   k samples, reranked by the value model.

A stage whose run finished before is skipped when the pipeline runs again, so an interrupted
pipeline continues where it stopped. Everything lands under `work_dir`.
"""

from __future__ import annotations

import functools
import itertools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.configfile import load_config_file
from orchard.errors import ConfigError
from orchard.store import Store
from orchard.train.config import RecipeConfig
from orchard.train.student import Student, build_student

if TYPE_CHECKING:
    from orchard.eval.config import Attempts, CollectRunConfig
    from orchard.train.launch import Launch

Log = Callable[[str], None]


def load_config(path: str | Path) -> RecipeConfig:
    """The recipe in YAML file `path` (the keys: `orchard.train.config`); its paths are relative to the file."""
    return load_config_file(path, RecipeConfig)


def run_recipe(
    config: RecipeConfig, *, recipe: str | None = None, log: Log = print, store: Store | None = None
) -> dict[str, Any]:
    """Run (or continue) every stage; the summary of each. With `recipe`, tasks of another recipe
    are refused before anything starts. Under a multi-process launch, see `orchard.train.launch`."""
    from orchard.env import Client
    from orchard.recipes import check_kinds
    from orchard.tasks import load_tasks
    from orchard.tasks.base import Prepare
    from orchard.train.launch import Launch

    launch = Launch()
    log = launch.log(log)
    tasks = load_tasks(config.tasks, ids=config.ids)
    held_out = load_tasks(config.eval.tasks, ids=config.eval.ids) if config.eval.enabled and config.eval.tasks else []
    if recipe is not None:
        check_kinds(recipe, {task.kind for task in tasks}, f"the tasks {config.tasks}")
        check_kinds(recipe, {task.kind for task in held_out}, f"the eval tasks {config.eval.tasks}")
    check_held_out(tasks, held_out, config.eval.tasks)
    prepare = Prepare(config.repos)
    work = Path(config.work_dir)
    work.mkdir(parents=True, exist_ok=True)  # once the tasks are found: a mistake leaves nothing behind

    def setup() -> tuple[dict[str, str], Student]:
        log(f"[setup] {len(tasks)} tasks; building their images")
        vision = config.student.vision if config.student.vision is not None else all(type(t).vision for t in tasks)
        return {t.instance_id: t.sandbox_image(prepare) for t in tasks}, build_student(
            config.student, work, log, vision=vision
        )

    images, student = launch.once(setup)
    summary: dict[str, Any] = {"student": student.path}
    stage = functools.partial(_stage, config, launch, store, log)
    with Client(store=store) as client:
        started = time.monotonic()
        collect_runs = launch.once(lambda: _collect(config, tasks, client, log, store))
        summary["collect"] = collect_runs
        summary["collect_seconds"] = round(time.monotonic() - started, 1)
        summary["credit"] = stage(
            "credit", lambda _run: _credit(config, tasks, images, client, collect_runs, store), everywhere=False
        )
        summary["sft"] = stage("sft", lambda run: _sft(config, student, work, collect_runs, run, store))
        policy = type(student)(summary["sft"]["output_dir"])
        checkpoints = [("before", student)]
        if config.rl.enabled:
            checkpoints.append(("sft", policy))
            summary["rl"] = stage("rl", lambda run: _rl(config, policy, tasks, images, client, work, run, store))
            policy = type(student)(summary["rl"]["output_dir"])
        checkpoints.append(("after", policy))
        graded = collect_runs + ([f"{config.name}-rl"] if config.rl.enabled else [])
        summary["value"] = stage("value", lambda run: _value(config, student, work, graded, run, store))
        if config.eval.enabled and launch.is_main:  # the last stage: the other processes are done
            value_dir = summary["value"]["output_dir"]
            summary["eval"] = _stage(
                config,
                Launch(processes=1),
                store,
                log,
                "eval",
                lambda _run: _eval(config, held_out or tasks, client, checkpoints, value_dir, log, store),
            )
            log(f"[report] {write_report(config, summary, tasks, work)}")
    launch.close()
    summary["policy"] = policy.path
    summary["main_process"] = launch.is_main
    return summary


def check_held_out(trained: Sequence[Any], held_out: Sequence[Any], source: str | None) -> None:
    """A `ConfigError` naming what a held-out set shares with the training tasks: a task id, or a
    repository (tasks of one repository teach its code, whatever the issue)."""
    ids = sorted({t.instance_id for t in trained} & {t.instance_id for t in held_out})
    repos = sorted(
        {r for t in trained if (r := getattr(t, "repo", None))} & {getattr(t, "repo", None) for t in held_out}
    )
    shared = [f"task {ids[0]}" + (f" (and {len(ids) - 1} more)" if len(ids) > 1 else "")] if ids else []
    shared += [f"repository {repos[0]}" + (f" (and {len(repos) - 1} more)" if len(repos) > 1 else "")] if repos else []
    if shared:
        raise ConfigError(
            f"eval.tasks {source} is not held out: it shares {' and '.join(shared)} with the training tasks; "
            "evaluate on tasks (and repositories) the recipe never trains on"
        )


def _stage(
    config: RecipeConfig,
    launch: Launch,
    store: Store | None,
    log: Log,
    stage: str,
    body: Callable[[str], dict[str, Any]],
    *,
    everywhere: bool = True,
) -> dict[str, Any]:
    """A stage as a run: skipped when it finished before; failures are recorded. A training stage runs
    `everywhere` (every process of a launch takes part); the others run on the main process only."""
    from orchard.store.runs import delete_run, finish_run, get_run, start_run

    run_id = f"{config.name}-{stage}"

    def begin() -> dict[str, Any] | None:
        previous = get_run(run_id, store=store)
        if previous is not None and previous.status == "finished":
            log(f"[{stage}] done before (run {run_id}); skipping")
            return json.loads(previous.summary)
        if previous is not None:  # an attempt that did not finish: its metrics and rollouts go with it
            delete_run(run_id, store=store)
        start_run(run_id, stage, f"{config.name} {stage}", config.model_dump(), store=store)
        log(f"[{stage}] running (run {run_id})")
        return None

    def recorded(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        started = time.monotonic()
        try:
            result = run() | {"seconds": round(time.monotonic() - started, 1)}
        except BaseException as exc:
            if launch.is_main:
                stopped = isinstance(exc, KeyboardInterrupt | SystemExit)  # Ctrl-C; SIGTERM (a launcher, kill)
                error = "stopped by a signal" if stopped else str(exc) or type(exc).__name__
                finish_run(run_id, "interrupted" if stopped else "failed", {}, error=error, store=store)
            raise
        if launch.is_main:
            finish_run(run_id, "finished", result, store=store)
            scalars = ", ".join(f"{k}={_short(v)}" for k, v in result.items() if not isinstance(v, list | dict))
            log(f"[{stage}] {scalars or 'done'}")
        return result

    done = launch.once(begin)
    if done is not None:
        return done
    if everywhere:
        return recorded(lambda: body(run_id))
    return launch.once(lambda: recorded(lambda: body(run_id)))


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _attempts(config: RecipeConfig, stage: Attempts, models: list[str], samples: int) -> CollectRunConfig:
    """A stage's attempts (collect's, eval's) as `orchard collect` would make them on the stage's
    tasks: the eval stage's own set where it names one, else the recipe's."""
    from orchard.eval.config import Attempts, CollectRunConfig

    fields = stage.model_dump(include=set(Attempts.model_fields))
    own = getattr(stage, "tasks", None)
    tasks, ids = (own, getattr(stage, "ids", None)) if own else (config.tasks, config.ids)
    return CollectRunConfig.model_validate(
        {**fields, "tasks": tasks, "ids": ids, "repos": config.repos, "models": models, "k": samples}
        | {"concurrency": config.concurrency}
    )


def _named(name: str) -> Callable[[Any], str]:
    """A run's name, whatever the job."""
    return lambda _job: name


def _collect(config: RecipeConfig, tasks, client, log: Log, store: Store | None) -> list[str]:
    from orchard.eval.jobs import jobs, run_jobs

    attempts = _attempts(config, config.collect, config.collect.teachers, config.collect.samples)
    chosen, found = jobs(attempts, tasks=tasks, store=store)
    runs = []
    for job, result in run_jobs(
        attempts, chosen, found, "collect", client, name=lambda job: f"{config.name} collect {job.name}", store=store
    ):
        rates = {h: f"{r['resolve_rate']:.0%}" for h, r in result.summary["harnesses"].items()}
        log(f"[collect] {job.name}: {len(result.results)} trajectories, resolved {rates} (run {result.run_id})")
        runs.append(result.run_id)
    return runs


def _credit(config: RecipeConfig, tasks, images, client, runs: list[str], store: Store | None) -> dict[str, Any]:
    from sqlmodel import col, select

    from orchard.store import TrajectoryRecord, session
    from orchard.train.credit import JudgeEstimator, ReplayEstimator, assess

    by_id = {t.instance_id: t for t in tasks}
    with session(store) as db:
        query = select(TrajectoryRecord).where(
            col(TrajectoryRecord.run_id).in_(runs), col(TrajectoryRecord.resolved).is_(False)
        )
        unresolved = list(db.exec(query))
    judge = None
    if config.credit.estimator == "judge":
        from orchard.agents.models import model_from_spec

        assert config.credit.judge  # CreditConfig requires one
        judge = JudgeEstimator(model_from_spec(config.credit.judge, check=False))
    segments = steps = 0
    for trajectory in unresolved:
        task = by_id.get(trajectory.instance_id)
        if task is None:
            continue
        estimator = judge or ReplayEstimator(client, images[task.instance_id])
        assessed = assess(trajectory, task, estimator, epsilon=config.credit.epsilon, store=store)
        segments += len(assessed.segments)
        steps += sum(b - a for a, b in assessed.segments)
    return {
        "unresolved": len(unresolved),
        "rise_segments": segments,
        "rise_steps": steps,
        "estimator": config.credit.estimator,
    }


def _sft(
    config: RecipeConfig, student: Student, work: Path, runs: list[str], run_id: str, store: Store | None
) -> dict[str, Any]:
    from orchard.train.sft import SFTFilters
    from orchard.train.tracking import StoreMetrics

    filters = SFTFilters(
        max_tokens=config.sft.max_tokens,
        drop_unparsable=config.sft.drop_unparsable,
        drop_undefined_tools=config.sft.drop_undefined_tools,
    )
    return student.sft(
        config.sft,
        work / "sft",
        runs,
        epsilon=config.credit.epsilon,
        filters=filters,
        callbacks=[StoreMetrics(run_id, store=store)],
        store=store,
    )


def _rl(
    config: RecipeConfig, policy: Student, tasks, images, client, work: Path, run_id: str, store: Store | None
) -> dict[str, Any]:
    from orchard.agents.models import model_from_spec
    from orchard.store.runs import record_metrics
    from orchard.train.rl import train_rl
    from orchard.train.tracking import StoreMetrics

    rl = config.rl
    judge = model_from_spec(rl.judge, check=False) if rl.judge else None
    chosen = list(tasks)[: rl.tasks] if rl.tasks else list(tasks)
    result = train_rl(
        policy.path,
        chosen,
        images,
        client,
        str(work / "rl"),
        rl,
        judge=judge,
        callbacks=[StoreMetrics(run_id, store=store)],
        on_step=lambda step, values: record_metrics(run_id, step, values, store=store),
        run_id=run_id,
        store=store,
        serve=config.student.serve,
    )
    history = result["bar"]
    if history:
        result["reward_mean"] = sum(h["reward_mean"] for h in history) / len(history)
        result["informative_share"] = sum(h["informative_share"] for h in history) / len(history)
        result["rollouts_per_group"] = sum(h["rollouts_per_group"] for h in history) / len(history)
    return result


def _value(
    config: RecipeConfig, student: Student, work: Path, runs: list[str], run_id: str, store: Store | None
) -> dict[str, Any]:
    from orchard.train.tracking import StoreMetrics
    from orchard.train.value import graded_trajectories, train_value

    trajectories = graded_trajectories(runs, store=store)
    base = student.value_base(work)
    return train_value(base, trajectories, work / "value", config.value, callbacks=[StoreMetrics(run_id, store=store)])


def _eval(
    config: RecipeConfig,
    tasks,
    client,
    checkpoints: list[tuple[str, Student]],
    value_dir: str,
    log: Log,
    store: Store | None,
) -> dict[str, Any]:
    """Each checkpoint (the student before training, after SFT when RL follows, the policy after)
    under every eval harness (one may have been held out of training): the model x harness matrix,
    each rate with its 95% interval over tasks (`orchard.eval.intervals`), each stage's change
    against the one before it, paired by task; the last one's samples reranked by the value model."""
    from orchard.eval import intervals
    from orchard.eval.jobs import jobs, run_jobs
    from orchard.eval.rerank import rerank_run

    kind = type(tasks[0])
    if config.eval.tasks:
        log(f"[eval] on {len(tasks)} held-out tasks ({config.eval.tasks})")
    else:
        log(f"[eval] on the {len(tasks)} training tasks (name held-out ones in eval.tasks to measure generalisation)")
    trained = set(config.collect.harnesses_for(tasks))
    if config.rl.enabled:
        trained |= set(config.rl.harnesses or kind.harnesses)
    scheme = "llama" if config.student.serve == "llama.cpp" else "hf"
    matrix: dict[str, dict[str, float]] = {}
    passing: dict[str, dict[str, dict[str, float]]] = {}
    rates: dict[str, dict[str, dict[str, Any]]] = {}
    per_task: dict[str, dict[str, dict[str, float]]] = {}
    runs: dict[str, str] = {}
    drawn: dict[str, int] = {}
    for label, acting in checkpoints:
        last = label == checkpoints[-1][0]
        samples = config.eval.samples if last else config.eval.earlier_samples or config.eval.samples
        k = str(samples)
        attempts = _attempts(config, config.eval, [f"{scheme}:{acting.path}"], samples)
        chosen, found = jobs(attempts, tasks=tasks, store=store)
        try:
            ((_, result),) = run_jobs(
                attempts, chosen, found, "eval", client, name=_named(f"{config.name} eval {label}"), store=store
            )
        finally:
            for job in found:
                getattr(job.model, "close", lambda: None)()
        runs[label] = result.run_id
        rows = result.summary["harnesses"]
        matrix[label] = {h: r["resolve_rate"] for h, r in rows.items()}
        drawn[label] = samples
        passing[label] = {h: {"pass@k": r["pass_at_k"][k], "pass^k": r["pass_hat_k"][k]} for h, r in rows.items()}
        per_task[label] = {h: intervals.shares(r for r in result.results if r.harness == h) for h in rows}
        rates[label] = {h: intervals.rate(shares) for h, shares in per_task[label].items()}
    labels = [label for label, _ in checkpoints]
    changes = {
        f"{after} - {before}": {h: intervals.change(per_task[before][h], per_task[after][h]) for h in per_task[after]}
        for before, after in itertools.pairwise(labels)
    }
    scored = kind.metric == "score"  # a kind graded by scores is judged by pass@k and pass^k
    for label, by_harness in matrix.items():
        cells = ", ".join(
            f"{h}{'' if h in trained else ' (held out)'} {rate:.0%}"
            f" [{rates[label][h]['low']:.0%}, {rates[label][h]['high']:.0%}]"
            + (
                f" (pass@{drawn[label]} {passing[label][h]['pass@k']:.0%},"
                f" pass^{drawn[label]} {passing[label][h]['pass^k']:.0%})"
                if scored
                else ""
            )
            for h, rate in by_harness.items()
        )
        log(f"[eval] {label}: {cells}")
    reranked = rerank_run(runs[labels[-1]], value_dir, empty_fails=kind.empty_submission_fails, store=store)
    return {
        "runs": runs,
        "matrix": matrix,
        "intervals": rates,
        "changes": changes,
        "pass": passing,
        "samples": drawn,
        "held_out": sorted(set(matrix[labels[-1]]) - trained),
        "tasks": {"held_out": bool(config.eval.tasks), "count": len(tasks), "ids": [t.instance_id for t in tasks]},
        "rerank": reranked,
    }


def write_report(config: RecipeConfig, summary: dict[str, Any], trained: Sequence[Any], work: Path) -> Path:
    """`report.json` (every number of the run, the tasks used) and `report.md` in `work`; the latter's path."""
    evaluated = summary["eval"]
    stages = ("credit", "sft", "rl", "value", "eval")
    seconds = {"collect": summary.get("collect_seconds", 0.0)}
    seconds |= {s: summary[s].get("seconds", 0.0) for s in stages if isinstance(summary.get(s), dict)}
    cost = summary.get("rl", {}).get("bar_cost")
    data = {
        "name": config.name,
        "student": summary["student"],
        "serve": config.student.serve,
        "tasks": {
            "train": {"source": config.tasks, "ids": [t.instance_id for t in trained]},
            "eval": {"source": config.eval.tasks or config.tasks, "held_out": evaluated["tasks"]["held_out"]}
            | {"ids": evaluated["tasks"]["ids"]},
        },
        "eval": {key: evaluated[key] for key in ("matrix", "intervals", "changes", "rerank", "runs", "held_out")},
        "settings": {"samples": config.eval.samples, "temperature": config.eval.temperature}
        | {"episode_steps": config.eval.episode_steps, "max_tokens": config.eval.max_tokens},
        "bar": cost,
        "seconds": seconds | {"total": round(sum(seconds.values()), 1)},
        "config": config.model_dump(mode="json"),
    }
    (work / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    n = evaluated["tasks"]["count"]
    where = "held-out" if evaluated["tasks"]["held_out"] else "training (not held out)"
    lines = [
        f"# {config.name}: the student on {n} {where} tasks, before and after training",
        "",
        f"Student `{summary['student']}`, generating with {config.student.serve}. Trained on "
        f"{len(trained)} tasks of `{config.tasks}`; evaluated on {n} tasks of `{config.eval.tasks or config.tasks}`, "
        f"{config.eval.samples} sample(s) per task and harness at temperature {config.eval.temperature}, "
        f"at most {config.eval.episode_steps} steps. Rates are per task (the mean of each task's share of "
        "resolved samples) with 95% Wilson intervals over tasks; changes are paired by task.",
        "",
        "| checkpoint | harness | resolved | 95% interval | tasks |",
        "|---|---|---:|---|---:|",
    ]
    for label, by_harness in evaluated["intervals"].items():
        for harness, r in by_harness.items():
            lines.append(f"| {label} | {harness} | {r['rate']:.1%} | {r['low']:.1%} to {r['high']:.1%} | {r['n']} |")
    lines += ["", "| change | harness | mean | 95% interval | tasks |", "|---|---|---:|---|---:|"]
    for label, by_harness in evaluated["changes"].items():
        for harness, c in by_harness.items():
            lines.append(
                f"| {label} | {harness} | {c['change']:+.1%} | {c['low']:+.1%} to {c['high']:+.1%} | {c['n']} |"
            )
    filtered = any("non_empty" in r for r in evaluated["rerank"].values())
    lines += [
        "",
        f"The value model's pick among the {config.eval.samples} samples of each task (last checkpoint)"
        + (
            " (never an empty submission where one always fails; `non-empty`: a sample drawn from the rest):"
            if filtered
            else ":"
        ),
        "",
        "| harness | one sample | non-empty | reranked | oracle pass@k | tasks |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for harness, r in evaluated["rerank"].items():
        rule = f"{r['non_empty']:.1%}" if "non_empty" in r else "-"
        lines.append(
            f"| {harness} | {r['one_sample']:.1%} | {rule} | {r['reranked']:.1%} | {r['oracle_pass_at_n']:.1%}"
            f" | {r['tasks']} |"
        )
    if cost:
        measured, fixed = cost["rollouts_per_informative"], cost["fixed_rollouts_per_informative"]
        lines += [
            "",
            f"BAR{' with memory' if config.rl.bar_memory else ''}: {cost['rollouts']:.0f} rollouts for "
            f"{cost['groups']:.0f} groups, {cost['informative']:.0f} informative"
            + (f", {measured:.2f} rollouts per informative group" if measured else "")
            + f"; fixed groups of {config.rl.group_size} at the pass rates seen would spend "
            + (f"{fixed:.2f}" if fixed else "every rollout for nothing")
            + (f" ({cost['saving']:.2f}x as many)" if cost.get("saving") else ""),
        ]
    lines += ["", "Seconds: " + ", ".join(f"{stage} {value:.0f}" for stage, value in data["seconds"].items())]
    path = work / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
