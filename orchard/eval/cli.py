"""The evaluation commands: `orchard eval` and `orchard collect`, the same attempts filed as runs of either kind.

Each builds its config (`orchard.eval.config`) from its flags, or reads it from `--config FILE`,
and hands it to the library (`orchard.eval.jobs`); what is here is only how results are shown.
Docker, rich and the models are imported inside the commands, so `orchard --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchard.agents import HARNESSES
from orchard.clikit import command, group
from orchard.errors import OrchardError
from orchard.recipes import merged
from orchard.registry import names
from orchard.store.cli import runs_app

app = group("Evaluation and collection.")

TASKS_HELP = (
    f"Task set: JSON, JSONL, a folder (a dataset, or tasks in a format of {', '.join(merged('folders'))}), a hub id, "
    f"or SCHEME:ARGUMENT for a set a package ships ({', '.join(merged('schemes'))})."
)
HARNESS_HELP = f"Harnesses, comma-separated: {names(HARNESSES, files=True)} (default: the task kind's own)."
MODEL_HELP = "Models, comma-separated: scripted:gold, scripted:regress, scripted:sed, scripted:FILE, noop, openai:NAME, hf:PATH, llama:PATH or module:Class[:ARG]."
CONFIG_HELP = "Read the settings from this YAML file instead of flags (keys: orchard/eval/config.py)."
MaxTokens = Annotated[int | None, typer.Option(min=1, help="Tokens per model reply (default: openai 2048, hf 256).")]
Temperature = Annotated[float | None, typer.Option(min=0, help="Sampling temperature (default: 0, greedy).")]
RequestTimeout = Annotated[
    float | None,
    typer.Option(metavar="SECONDS", help="Seconds one request to a model server may take (default: 120)."),
]
EpisodeSteps = Annotated[int | None, typer.Option(min=1, help="Turns per episode (default 40).")]
Rerun = Annotated[
    bool, typer.Option("--rerun", help="Start the run afresh instead of resuming it: what it recorded goes.")
]

FLAG_OF = {"models": "--model", "harnesses": "--harness"}
"""The config keys whose flag is not the key itself."""

if TYPE_CHECKING:
    from orchard.eval.config import CollectRunConfig, EvalConfig


@command(app, "eval")
def eval_(
    ctx: typer.Context,
    tasks: Annotated[str | None, typer.Option(metavar="SOURCE", help=TASKS_HELP)] = None,
    model: Annotated[str | None, typer.Option(metavar="SPECS", help=MODEL_HELP)] = None,
    harness: Annotated[str | None, typer.Option(metavar="NAMES", help=HARNESS_HELP)] = None,
    k: Annotated[int | None, typer.Option("--k", min=1, help="Samples per task and harness (default 1).")] = None,
    predictions: Annotated[
        str | None,
        typer.Option(
            metavar="FILE|gold",
            help="Grade these patches instead (JSONL of instance_id, model_patch); `gold`: the tasks' own.",
        ),
    ] = None,
    repos: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="Local mirror of the repositories: DIR/owner/name or DIR/owner__name."),
    ] = None,
    image_source: Annotated[
        str | None,
        typer.Option(
            metavar="build|swebench",
            help="Task images: build them offline (default), or SWE-bench's published instance images.",
        ),
    ] = None,
    ids: Annotated[str | None, typer.Option(metavar="IDS", help="Only these instance ids (comma-separated).")] = None,
    concurrency: Annotated[int | None, typer.Option(min=1, help="Attempts at once (default 2).")] = None,
    episode_steps: EpisodeSteps = None,
    base_url: Annotated[
        str | None,
        typer.Option(metavar="URL", envvar="OPENAI_BASE_URL", help="OpenAI-compatible server for openai:NAME."),
    ] = None,
    max_tokens: MaxTokens = None,
    temperature: Temperature = None,
    request_timeout: RequestTimeout = None,
    report: Annotated[
        Path | None, typer.Option(metavar="FILE", help="Also write SWE-bench's report JSON here.")
    ] = None,
    split: Annotated[str | None, typer.Option(metavar="SPLIT", help="Split of a dataset (default test).")] = None,
    rerank: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="A value model: submit its pick among the --k samples of each task."),
    ] = None,
    rerun: Rerun = False,
    config: Annotated[Path | None, typer.Option(metavar="FILE", help=CONFIG_HELP)] = None,
) -> None:
    """Evaluate models under harnesses (or grade predictions) on a task set; stored and reported."""
    from orchard.eval.config import EvalConfig

    if config is None and (model is None) == (predictions is None):
        raise OrchardError("say what to evaluate: --model SPEC (an agent), or --predictions FILE|gold")
    flags = {
        "tasks": tasks,
        "models": model,
        "harnesses": harness,
        "k": k,
        "predictions": predictions,
        "repos": repos,
        "image_source": image_source,
        "ids": ids,
        "concurrency": concurrency,
        "episode_steps": episode_steps,
        "base_url": base_url,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "request_timeout": request_timeout,
        "rerun": rerun,
        "report": report,
        "split": split,
        "rerank": rerank,
    }
    _show(_config(ctx, EvalConfig, config, flags), "eval")


@command(app, "collect")
def collect(
    ctx: typer.Context,
    tasks: Annotated[str | None, typer.Option(metavar="SOURCE", help=TASKS_HELP)] = None,
    model: Annotated[str | None, typer.Option(metavar="SPECS", help="The teachers: " + MODEL_HELP[8:])] = None,
    harness: Annotated[str | None, typer.Option(metavar="NAMES", help=HARNESS_HELP)] = None,
    k: Annotated[int | None, typer.Option("--k", min=1, help="Samples per task and harness (default 1).")] = None,
    repos: Annotated[Path | None, typer.Option(metavar="DIR", help="Local mirror of the repositories.")] = None,
    concurrency: Annotated[int | None, typer.Option(min=1, help="Episodes at once (default 2).")] = None,
    episode_steps: EpisodeSteps = None,
    base_url: Annotated[
        str | None, typer.Option(metavar="URL", envvar="OPENAI_BASE_URL", help="Server for openai:NAME.")
    ] = None,
    max_tokens: MaxTokens = None,
    temperature: Temperature = None,
    request_timeout: RequestTimeout = None,
    rerun: Rerun = False,
    config: Annotated[Path | None, typer.Option(metavar="FILE", help=CONFIG_HELP)] = None,
) -> None:
    """Run teachers on a task set and keep every trajectory, graded, as a `collect` run."""
    from orchard.eval.config import CollectRunConfig

    if config is None and model is None:
        raise OrchardError("say who collects: --model SPECS (the teachers)")
    flags = {
        "tasks": tasks,
        "models": model,
        "harnesses": harness,
        "k": k,
        "repos": repos,
        "concurrency": concurrency,
        "episode_steps": episode_steps,
        "base_url": base_url,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "request_timeout": request_timeout,
        "rerun": rerun,
    }
    _show(_config(ctx, CollectRunConfig, config, flags), "collect")


def _config(ctx: typer.Context, model: type, path: Path | None, flags: dict[str, Any]) -> Any:
    """The command's config: from `--config FILE` (then no other flag may be given), else from its flags."""
    from orchard.configfile import load_config_file, validated

    given = [
        f"--{name.replace('_', '-')}"
        for name in ctx.params
        if name != "config" and getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"
    ]
    if path is not None:
        if given:
            raise OrchardError(f"give either --config FILE or flags, not both (also given: {', '.join(given)})")
        return load_config_file(path, model)
    if flags["tasks"] is None:
        raise OrchardError("say which tasks: --tasks SOURCE (or --config FILE)")
    if flags["repos"] is not None and not flags["repos"].is_dir():
        raise OrchardError(f"--repos {flags['repos']} is not a folder")
    if flags.get("predictions") not in (None, "gold") and not Path(flags["predictions"]).is_file():
        raise OrchardError(
            f"no predictions file {flags['predictions']} (or say `gold` to grade the tasks' own patches)"
        )
    data = {  # a flag not given is left to the config's default (a switch not given is False)
        key: str(value) if isinstance(value, Path) else value
        for key, value in flags.items()
        if value is not None and value is not False
    }
    names = {key: FLAG_OF.get(key, f"--{key.replace('_', '-')}") for key in flags}
    return validated(model, data, flags=names)


def _show(config: EvalConfig | CollectRunConfig, kind: str) -> None:
    """Run the config's jobs with a progress bar; print each run's table, reranking and reports."""
    import json

    from rich.console import Console

    from orchard.env import Client
    from orchard.eval.console import EvalProgress, exits_on_interrupt, matrix_table, results_table
    from orchard.eval.jobs import jobs, run_jobs, swebench_reports
    from orchard.eval.report import image_lines
    from orchard.eval.runner import machine_error_lines

    rerank = getattr(config, "rerank", None)
    console, summaries = Console(), {}
    tasks, found = jobs(config)  # every name and file checked before a sandbox is made
    with exits_on_interrupt(), Client() as client:  # the sandboxes go first, then the line
        for job, result in run_jobs(config, tasks, found, kind, client, progress=EvalProgress):
            console.print(results_table(result.summary, f"run {result.run_id} - {job.name}"))
            for line in image_lines(result.summary.get("images") or {}):
                typer.echo(line)
            if rerank is not None and getattr(config, "predictions", None) is None:
                from orchard.eval.rerank import rerank_run

                empty_fails = bool(tasks) and type(tasks[0]).empty_submission_fails
                for each, figures in rerank_run(result.run_id, rerank, empty_fails=empty_fails).items():
                    rule = f", non-empty {figures['non_empty']:.1%}" if "non_empty" in figures else ""
                    typer.echo(
                        f"rerank {each}: one sample {figures['one_sample']:.1%}{rule}, value-model pick "
                        f"{figures['reranked']:.1%}, oracle pass@{job.samples} {figures['oracle_pass_at_n']:.1%}"
                    )
            typer.echo(f"report: {result.folder / 'report.md'} (SWE-bench JSON: {result.folder / 'report.json'})")
            summaries[job.name] = result.summary
    if len(summaries) > 1:
        console.print(matrix_table(summaries))
    report = getattr(config, "report", None)
    if report is not None:
        Path(report).write_text(json.dumps(swebench_reports(summaries), indent=2) + "\n")
        typer.echo(f"SWE-bench report: {report}")
    causes: dict[str, int] = {}
    for summary in summaries.values():
        for cause, count in (summary.get("machine_errors") or {}).items():
            causes[cause] = causes.get(cause, 0) + count
    if causes:  # no verdict on those attempts: not a run that went well
        for line in machine_error_lines(causes):
            typer.echo(line, err=True)
        raise typer.Exit(1)


@command(runs_app, "compare")
def runs_compare(
    run_ids: Annotated[list[str], typer.Argument(metavar="RUN_ID", help="Two or more eval (or collect) runs.")],
    out: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="Folder for compare.md and compare.png (default: under the runs)."),
    ] = None,
) -> None:
    """Compare evaluations: rates with 95% intervals, the tasks that flipped, each task's outcome
    in every run; a Markdown report with a picture."""
    from orchard.eval.compare import compare_runs

    if out is not None and out.exists() and not out.is_dir():
        raise OrchardError(f"--out {out} is a file: name a folder")
    typer.echo(f"report: {compare_runs(run_ids, out)}")
