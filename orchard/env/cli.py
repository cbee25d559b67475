"""The environment's commands: `orchard up`, `down`, `status`, `cost`, `image ...`, `sandbox ...`, `bench env`.

Docker, httpx and FastAPI are imported inside the commands, so `orchard --help` stays fast.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Literal

import typer

from orchard.clikit import command, group
from orchard.config import BASE_IMAGE, private_file, private_folder, settings
from orchard.env import IMAGES
from orchard.env.backends import BACKENDS
from orchard.errors import ConfigError, OrchardError
from orchard.recipes import merged
from orchard.registry import names

app = group("The environment: the service, its sandboxes, base images.")
image_app = group("Build images offline (no registry needed): the shared ones and the recipes'.")
sandbox_app = group("Create, run and delete sandboxes of the running service (`orchard up`).")
bench_app = group("Run benchmarks that print ratios against baselines measured in the same run.")
app.add_typer(image_app, name="image")
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(bench_app, name="bench")

NO_ENGINE = "not reachable: start it (`sudo systemctl start docker`, or Docker Desktop), or point DOCKER_HOST at one"
"""`orchard status` without an engine: how to start one anywhere (`./dev` is only a checkout's)."""


# -- the service ----------------------------------------------------------------------------


@command(app, "up")
def up(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(metavar="ADDRESS", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(metavar="PORT", min=1, max=65535, help="Port to listen on.")] = 8765,
    api_key_file: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="File holding the API key (default: $ORCHARD_API_KEY, else one stored in ORCHARD_HOME). "
            "Never the key itself: any user can read a command line.",
        ),
    ] = None,
    backend: Annotated[
        str,
        typer.Option(
            metavar="|".join([*BACKENDS, "MODULE:CLASS"]),
            help=f"Where sandboxes run: {names(BACKENDS)} (a backend's config class).",
        ),
    ] = "docker",
    runtime: Annotated[
        str | None, typer.Option(metavar="RUNTIME", help="OCI runtime of the Docker engine, e.g. runsc for gVisor.")
    ] = None,
    foreground: Annotated[bool, typer.Option("--foreground", help="Run in this terminal until Ctrl-C.")] = False,
    pool: Annotated[
        list[str] | None,
        typer.Option(metavar="IMAGE=SIZE", help="Keep SIZE sandboxes of IMAGE started (repeatable)."),
    ] = None,
    namespace: Annotated[
        str | None, typer.Option(metavar="NAME", help="Kubernetes: the namespace of the sandbox Pods.")
    ] = None,
    agent_image: Annotated[
        str | None,
        typer.Option(
            metavar="IMAGE", help="Kubernetes: the injector image (orchard image build-agent), as the cluster pulls it."
        ),
    ] = None,
    kubeconfig: Annotated[
        str | None,
        typer.Option(metavar="FILE", help="Kubernetes: the kubeconfig (default $KUBECONFIG, ~/.kube/config)."),
    ] = None,
    fleet: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="Kubernetes: be one replica of the fleet NAME, sharing ORCHARD_DB_URL and the API key "
            "with the others: any replica serves any sandbox, and sandboxes outlive a replica.",
        ),
    ] = None,
) -> None:
    """Start the environment service (Orchard Env API) on the local Docker engine or a Kubernetes cluster."""
    from orchard.env.discovery import running_service
    from orchard.env.service import (
        check_fleet,
        configured_backend,
        load_or_create_key,
        parse_pool,
        read_key_file,
        serve,
    )

    for each in pool or []:
        parse_pool(each)  # a mistake is one line here, not a service that fails to start
    options = {"namespace": namespace, "agent_image": agent_image, "kubeconfig": kubeconfig}
    configured_backend(backend, runtime=runtime, **options)  # likewise an unknown backend or option
    check_fleet(fleet, backend, key_given=api_key_file is not None or bool(settings().api_key))

    running = running_service()
    if running:
        from click.core import ParameterSource

        asked = [n for n in ("host", "port") if ctx.get_parameter_source(n) is not ParameterSource.DEFAULT]
        if asked and running["url"].rstrip("/") != f"http://{host}:{port}":
            raise OrchardError(
                f"a service is already running at {running['url']} (pid {running['pid']}), not at {host}:{port}: "
                "`orchard down` stops it, then `orchard up` starts one where you ask"
            )
        typer.echo(f"already running at {running['url']} (pid {running['pid']}); `orchard down` stops it")
        return
    key = read_key_file(api_key_file) if api_key_file else load_or_create_key()
    if foreground:
        serve(host, port, backend=backend, runtime=runtime, api_key=key, pools=pool, options=options, fleet=fleet)
        return
    _start_in_background(host, port, backend, runtime, key, pool or [], {**options, "fleet": fleet})


def _start_in_background(
    host: str, port: int, backend: str, runtime: str | None, key: str, pools: list[str], options: dict[str, str | None]
) -> None:
    """Start the service as its own process; the key goes in its environment, never its argv."""
    from orchard.env.discovery import service_healthy

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
    argv += [f"--{name.replace('_', '-')}={value}" for name, value in options.items() if value is not None]
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
        if service_healthy(url):
            typer.echo(f"Orchard Env is up at {url} (pid {process.pid}); log: {log_path}")
            typer.echo(f"API key stored in {settings().service_state} (mode 0600); `orchard down` stops it")
            return
        time.sleep(0.1)
    process.terminate()
    raise OrchardError(f"the service did not answer within 120 s (log: {log_path})")


URL_OPTION = typer.Option(metavar="URL", help="The service's URL, as `orchard up` printed it.")
PORT_OPTION = typer.Option(metavar="PORT", min=1, max=65535, help="The service's port on this host.")


def _named_service(url: str | None, port: int | None) -> dict | None:
    """The state of this ORCHARD_HOME's running service, if any, checked against `--url`/`--port`.

    Naming a service that answers but is not this ORCHARD_HOME's is an error that says so (its key
    and sandboxes are another home's); naming one where nothing answers is just `None`.
    """
    from urllib.parse import urlparse

    from orchard.env.discovery import running_service, service_healthy

    if url and port:
        raise ConfigError("give --url or --port, not both")
    state = running_service()
    if not (url or port):
        return state
    wanted = url.rstrip("/") if url else f"http://127.0.0.1:{port}"
    if state and (state["url"].rstrip("/") == wanted or (port and urlparse(state["url"]).port == port)):
        return state
    if service_healthy(wanted):
        home = settings().home
        raise ConfigError(
            f"the service at {wanted} is not this ORCHARD_HOME's ({home}): run this with its ORCHARD_HOME"
        )
    return None


def _where(url: str | None, port: int | None) -> str:
    return f" at {url}" if url else f" on port {port}" if port else ""


@command(app, "down")
def down(
    url: Annotated[str | None, URL_OPTION] = None,
    port: Annotated[int | None, PORT_OPTION] = None,
) -> None:
    """Stop the service and remove every sandbox it owns.

    A service that was killed outright (its state file left behind, its process gone) has nothing
    to stop, but what it left in its backend is reaped all the same (its sandboxes, and on
    Kubernetes its owner's Lease).
    """
    from pydantic import ValidationError

    from orchard.env.discovery import read_state
    from orchard.process import process_alive

    state = _named_service(url, port)
    if not state:
        killed = read_state() if not (url or port) else None
        if killed is None or not isinstance(killed.get("pid"), int) or process_alive(killed["pid"]):
            typer.echo(f"no Orchard service is running{_where(url, port)}")
            return
        try:
            leftovers = _remove_orphans(killed.get("backend") or {"name": "docker"})
        except (OrchardError, ValidationError) as exc:
            reason = str(exc).splitlines()[0]
            raise OrchardError(
                f"the service (pid {killed['pid']}) was killed; could not reap its leftovers: {reason}"
            ) from None
        settings().service_state.unlink(missing_ok=True)
        typer.echo(
            f"no Orchard service is running (pid {killed['pid']} was killed); {leftovers} leftover sandbox(es) removed"
        )
        return
    pid = state["pid"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if process_alive(pid):
        os.kill(pid, signal.SIGKILL)
    try:
        leftovers = _remove_orphans(state.get("backend") or {"name": "docker"})
    except (OrchardError, ValidationError) as exc:  # the service is stopped; only the clean-up failed
        reason = str(exc).splitlines()[0]
        raise OrchardError(f"stopped the service (pid {pid}), but could not reap its leftovers: {reason}") from None
    typer.echo(f"stopped the service (pid {pid}); {leftovers} leftover sandbox(es) removed")


@command(app, "status")
def status(
    url: Annotated[str | None, URL_OPTION] = None,
    port: Annotated[int | None, PORT_OPTION] = None,
) -> None:
    """Show the state of the Docker engine, the base image, the service and the store."""
    from orchard.env import images
    from orchard.env.backends.docker import engine_reachable

    service = _named_service(url, port)
    engine = engine_reachable()
    typer.echo(f"docker engine : {'running' if engine else NO_ENGINE}")
    if engine:
        base = images.image_exists(BASE_IMAGE)
        typer.echo(f"base image    : {BASE_IMAGE if base else 'missing (orchard image build-base)'}")
        others = [release for release in images.RELEASES if images.base_tag(release) != BASE_IMAGE]
        missing = [release for release in others if not images.image_exists(images.base_tag(release))]
        built = [images.base_tag(release) for release in others if release not in missing]
        hint = [f"missing {r} (orchard image build-base --release {r})" for r in missing]
        typer.echo(f"other Pythons : {', '.join([*built, *hint])}")
    if service:
        with _service_client(service["url"]) as client:
            count = len(client.list())
        backend = (service.get("backend") or {"name": "docker"})["name"]
        typer.echo(f"service       : {service['url']} (pid {service['pid']}, {backend}), {count} sandbox(es)")
    else:
        typer.echo(f"service       : not running{_where(url, port)} (orchard up)")
    typer.echo(f"store         : {settings().db_url}")


@command(app, "cost")
def cost(
    sandboxes: Annotated[int, typer.Option(metavar="N", min=0, help="Sandboxes running at once.")] = 128,
    hours: Annotated[float, typer.Option(metavar="HOURS", min=0, help="Hours each exists.")] = 240,
    cpu: Annotated[float, typer.Option(metavar="VCPUS", min=0, help="vCPUs each is given.")] = 2,
    memory: Annotated[float, typer.Option(metavar="GIB", min=0, help="GiB of memory each is given.")] = 8,
    prices: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="Prices file (TOML); default: the shipped one, the paper's table."),
    ] = None,
) -> None:
    """Compare what a fleet of sandboxes costs: a managed service vs your cluster on-demand and on spot."""
    from orchard.env.cost import DEFAULT_PRICES, Fleet, cost_table, load_prices

    typer.echo(cost_table(Fleet(sandboxes, hours, cpu, memory), load_prices(prices)))
    typer.echo(f"\nprices: {prices or DEFAULT_PRICES} (edit a copy, pass --prices FILE)")


def _remove_orphans(backend: dict) -> int:
    """Reap what a stopped service may have left, in its backend (`name` and `config` as the
    service recorded them): its sandboxes are orphans now."""
    from orchard.env.backends import backend_config
    from orchard.env.manager import SandboxManager

    where = backend_config(backend["name"])
    if backend.get("config"):
        where = type(where).model_validate(backend["config"])
    manager = SandboxManager(where, reap_interval=None).start()  # reaps orphans and expired ones
    manager.close()
    return len(manager.reaped_at_start)


def _service_client(url: str | None = None):
    from orchard.env.client import Client
    from orchard.env.discovery import running_service_url

    url = url or running_service_url()
    if not url:
        raise OrchardError("no Orchard service is running: start one with `orchard up` (or set ORCHARD_URL)")
    return Client(url=url)


# -- images -------------------------------------------------------------------------------


@command(image_app, "build-base")
def image_build_base(
    release: Annotated[
        Literal["bullseye", "bookworm", "trixie"],
        typer.Option(help="Debian release: bullseye (Python 3.9), bookworm (3.11) or trixie (3.13)."),
    ] = "bookworm",
    tag: Annotated[
        str | None, typer.Option(metavar="TAG", help="Image tag to create (default orchard/base:RELEASE).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if the image exists.")] = False,
) -> None:
    """Build a minimal Debian image (python3, git, bash) from debootstrap + docker import: no registry."""
    from orchard.env import images

    typer.echo(images.build_base(tag, release=release, force=force, log=typer.echo))


@command(image_app, "build-busybox")
def image_build_busybox(
    tag: Annotated[str, typer.Option(metavar="TAG", help="Image tag to create.")] = "orchard/busybox:static",
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if the image exists.")] = False,
) -> None:
    """Build a static busybox image: no Python, no libc (to show the agent needs nothing from an image)."""
    from orchard.env import images

    typer.echo(images.build_busybox(tag, force=force))


@command(image_app, "build-agent")
def image_build_agent(
    tag: Annotated[
        str | None, typer.Option(metavar="TAG", help="Image tag to create (default orchard/agent:VERSION).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if the image holds the same bundle.")] = False,
) -> None:
    """Build the Kubernetes injector image (static busybox + agent bundle) offline; push it to your cluster's registry."""
    from orchard.env import images

    typer.echo(images.build_agent(tag, force=force))


@command(image_app, "build-service")
def image_build_service(
    wheel: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="Orchard's wheel to install (default: built from this source checkout; "
            "an installed Orchard has none and needs this).",
        ),
    ] = None,
    tag: Annotated[
        str | None, typer.Option(metavar="TAG", help="Image tag to create (default orchard/orchard:VERSION).")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Resolve the dependencies again and rebuild even if the image is current.")
    ] = False,
) -> None:
    """Build the service's image for a cluster (deploy/kubernetes) offline from Orchard's wheel; push it to your registry.

    The bookworm base with a venv of the wheel and its dependencies less the training ones (torch,
    transformers, trl, ...), entrypoint `orchard`, user 10001. Resolved on this host and installed
    with no network; rebuilt only when the wheel changes.
    """
    from orchard.env import images

    typer.echo(images.build_image("service", force=force, log=typer.echo, wheel=wheel, tag=tag))


@command(image_app, "build-tools")
def image_build_tools(
    injector: Annotated[
        bool,
        typer.Option(
            "--injector", help="Also build the Kubernetes injector image of the bundle (orchard/tools:VERSION)."
        ),
    ] = False,
    tag: Annotated[
        str | None, typer.Option(metavar="TAG", help="Tag of the injector image (default orchard/tools:VERSION).")
    ] = None,
) -> None:
    """Build the agent CLIs' bundle (codex, claude, opencode, pi, hermes, mini) from the npm registry and PyPI.

    Pinned in orchard/env/tools.toml and cached (minutes the first time); sandboxes created with
    tools=True get it read-only at /.orchard-tools, whatever their image holds.
    """
    from orchard.env import tools

    bundle = tools.build_tools(log=lambda line: typer.echo(line, err=True))
    manifest = bundle.manifest
    typer.echo(
        f"{bundle.path}: {bundle.size() / 2**30:.2f} GiB, mounted at {tools.TOOLS_MOUNT} (built in {manifest['build_seconds']:.0f} s)"
    )
    for name, tool in manifest["tools"].items():
        commands = " ".join(f"{tools.TOOLS_BIN}/{c}" for c in tool["commands"])
        typer.echo(f"{name:<9} {tool['version']:<9} {tool['registry']:<5} {tool['package']:<30} {commands}")
    typer.echo(f"{'node':<9} {manifest['node']:<9} npm   {manifest['node_package']:<30} {tools.TOOLS_BIN}/node")
    typer.echo(f"{'python':<9} {manifest['python']:<9} host  {'CPython':<30} {tools.TOOLS_BIN}/python3")
    if injector:
        typer.echo(tools.build_tools_image(tag, tools=bundle))


@command(image_app, "build")
def image_build(
    name: Annotated[str, typer.Argument(metavar="NAME", help=f"The image: {', '.join(IMAGES | merged('images'))}.")],
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if the image exists.")] = False,
) -> None:
    """Build an image offline (or reuse it): the base, busybox and agent images, or one a recipe's tasks run in."""
    from orchard.env import images

    typer.echo(images.build_image(name, force=force, log=typer.echo))


# -- sandboxes ----------------------------------------------------------------------------


@command(sandbox_app, "create")
def sandbox_create(
    image: Annotated[str, typer.Argument(help="Image to run, unmodified.")] = BASE_IMAGE,
    network: Annotated[
        Literal["blocked", "dropped", "open"],
        typer.Option(
            help="Network access: blocked (loopback only), dropped (as blocked, connections out time out) or open."
        ),
    ] = "blocked",
    cpu: Annotated[float | None, typer.Option(metavar="CORES", help="CPU cores.")] = None,
    memory: Annotated[str | None, typer.Option(metavar="SIZE", help="Memory limit, e.g. 2Gi.")] = None,
    ttl: Annotated[
        float | None, typer.Option(metavar="SECONDS", help="Seconds until it is reaped (default 7200).")
    ] = None,
) -> None:
    """Create a sandbox in the running service and print its id."""
    with _service_client() as client:
        box = client.create(
            image, network=network, cpu=cpu, memory=memory, keep=True, **({} if ttl is None else {"ttl": ttl})
        )
        typer.echo(box.id)


@command(sandbox_app, "exec")
def sandbox_exec(
    sandbox_id: Annotated[str, typer.Argument(help="Sandbox id.")],
    command_line: Annotated[
        list[str], typer.Argument(metavar="COMMAND", help="Command (after --) or one shell string.")
    ],
    timeout: Annotated[float, typer.Option(metavar="SECONDS", help="Seconds before the command is killed.")] = 300.0,
    cwd: Annotated[str | None, typer.Option(metavar="DIR", help="Working directory (default /workspace).")] = None,
    session: Annotated[
        str | None,
        typer.Option(metavar="NAME", help="Run in this persistent shell: cd and variables carry over between calls."),
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
        list[str] | None, typer.Argument(metavar="COMMAND", help="What to run (default: an interactive shell).")
    ] = None,
    cwd: Annotated[str | None, typer.Option(metavar="DIR", help="Working directory (default /workspace).")] = None,
    login: Annotated[bool, typer.Option("--login", help="Start a login shell.")] = False,
) -> None:
    """Open an interactive terminal in a sandbox; exit with its process's exit code."""
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
        network = row.get("network") or ("blocked" if row["block_network"] else "open")
        typer.echo(f"{row['sandbox_id']:<14} {row['status']:<8} {network:<8} {age:>6.0f}s  {row['image']}")


@command(sandbox_app, "rm")
def sandbox_rm(sandbox_ids: Annotated[list[str], typer.Argument(metavar="SANDBOX_ID", help="Sandbox ids.")]) -> None:
    """Delete sandboxes; an id the service does not know is an error, and then none is deleted."""
    with _service_client() as client:
        boxes = [client.attach(sandbox_id) for sandbox_id in sandbox_ids]  # a malformed id is refused here
        known = {row["sandbox_id"] for row in client.list()}
        unknown = [sandbox_id for sandbox_id in sandbox_ids if sandbox_id not in known]
        if unknown:
            raise OrchardError(
                f"no sandbox {unknown[0]!r} (`orchard sandbox ls` lists them)"
                + ("; none was deleted" if boxes[1:] else "")
            )
        for box in boxes:
            box.delete()
            typer.echo(f"deleted {box.id}")


# -- benchmarks ---------------------------------------------------------------------------


@command(bench_app, "env")
def bench_env(
    runs: Annotated[int, typer.Option(min=1, help="Commands measured per path and command.")] = 300,
    n: Annotated[list[int], typer.Option("--n", help="Concurrent sandboxes (repeat for several).")] = [10, 50, 100],  # noqa: B006
) -> None:
    """Measure environment latency (every path side by side) and lifecycle at N concurrent sandboxes."""
    folder = Path(__file__).resolve().parents[2] / "bench"
    scripts = [folder / "env_latency.py", folder / "env_lifecycle.py"]
    if not all(script.exists() for script in scripts):
        raise OrchardError(f"the benchmarks live in a source checkout's bench/ folder, not found at {folder}")
    latency = subprocess.run([sys.executable, str(scripts[0]), "--runs", str(runs)])
    lifecycle = subprocess.run([sys.executable, str(scripts[1]), "--n", *map(str, n)])
    raise typer.Exit(latency.returncode or lifecycle.returncode)
