"""The local Docker engine as a sandbox backend.

Each sandbox is one container of an unmodified image. The exec agent is injected, never baked
in: the agent bundle (see `orchard.env.bundle`) is bind-mounted read-only at `/.orchard` and is
the container's command, run under Docker's init (which reaps orphans). A per-sandbox host folder
is bind-mounted at `/.orchard-run`; the agent listens on a Unix socket there, so the host reaches
it without any network, even with `--network none`. A spec with `tools` also gets the agent CLIs'
bundle (`orchard.env.tools`) bind-mounted read-only at `/.orchard-tools`. The Docker API is used
to create, inspect and delete, never to run commands.

Security profile of every container: all capabilities dropped, `no-new-privileges`, a pids limit,
optional cpu/memory limits, optional runtime (`runsc` for gVisor), and Docker's default seccomp
profile with `io_uring_setup`, `io_uring_enter` and `io_uring_register` denied on top (ENOSYS, as
on a kernel without them), and `clone` with `CLONE_PARENT` (its child would be the agent's, out of
reach of a command's timeout). The rest of what no task needs, such as `bpf`, `perf_event_open`,
`userfaultfd`, `kexec_*` and the keyctl family, the default profile already denies without
CAP_SYS_ADMIN. gVisor ignores OCI seccomp profiles (without `--oci-seccomp`): there, system calls
reach gVisor's own kernel, not the host's.

The run folder holds only the socket. It is writable while the agent starts (only the agent runs
then: the image's entrypoint is replaced) and sealed once the agent answers (`seal`): mode 0555,
owned by `SEALED_UID` when Orchard runs as root, else by the operator. Without CAP_DAC_OVERRIDE,
CAP_FOWNER or CAP_CHOWN no sandbox process, root included, can then create, rename, unlink or
chmod anything there, so the sandbox can write nothing to the host through it (and leave nothing:
no setuid, executable or device file) and cannot move the socket. At the seal the folder must hold
the socket alone, else the sandbox fails: code that reached the agent's start through the image
(its `PYTHONPATH`, `/etc/ld.so.preload`) could have kept a folder of its own writable there.
`delete` unseals and removes it.
gVisor's Sentry honours the seal too (it checks the folder's owner and mode as the host reports them).

Network `blocked` means `--network none` (loopback only). Network `dropped` is `blocked` plus
`DROP_ROUTES`, set from the host (`nsenter` into the container's network namespace, run as root)
right after the start, so connections out time out rather than fail (where it cannot be set up,
as under runsc, whose network stack is the Sentry's, it stays `blocked`, with a warning). Network `open` means the Docker network
`orchard-open` (bridge `orchard-open0`, created on first use) with inter-container traffic off,
plus host firewall rules (`HOST_GUARDS`: iptables INPUT rejects new connections arriving from
that bridge; DOCKER-USER rejects what it sends to link-local addresses) so that a sandbox
reaches neither another sandbox nor any service of this host, on any of its addresses (a service
bound to 0.0.0.0 included), nor a cloud's instance metadata service (169.254.169.254). What
`open` allows: connections out to any other address (the internet, the LAN, other hosts'
services: Docker masquerades them as this host), name resolution through Docker's embedded
DNS, and answers to connections the host opens. IPv4 only: Docker disables IPv6 inside the
containers of a network without IPv6. When the rules cannot be installed (not root, no
iptables), `open` is refused; on Docker Desktop (the `port` route), whose engine runs in a VM
of its own, it is allowed with a warning. The network and the rules stay (they are shared by
every `open` sandbox of this host); `docker network rm orchard-open` and `iptables -D` remove them.

Ownership: `delete` and `state` act only on a container that carries Orchard's labels for that
sandbox id (and owner, when given), never on one that merely has the name `orchard-<id>`.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import os
import shlex
import shutil
import stat
import subprocess
import threading
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchard.config import settings
from orchard.env.agent.protocol import TOKEN_ENV
from orchard.env.backends.base import (
    LABEL_PREFIX,
    AgentEndpoint,
    BackendSandbox,
    SandboxSpec,
    SandboxState,
    labels_for,
)
from orchard.errors import (
    ConfigError,
    Conflict,
    EngineUnavailable,
    ImageNotFound,
    InvalidRequest,
    NotFound,
    SandboxError,
)

if TYPE_CHECKING:
    from orchard.env.tools import ToolsBundle

AGENT_MOUNT = "/.orchard"
RUN_MOUNT = "/.orchard-run"
AGENT_PORT = 7000
LOOPBACK_HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
"""/etc/hosts of a `blocked` (or `dropped`) sandbox, which has loopback only."""
MIN_NANO_CPUS = 10_000_000
"""runc refuses a CPU quota under 1 ms a period (Kubernetes raises such requests to it too)."""
DROP_ROUTES = """\
link add orchard0 type veth peer name orchard1
link set orchard0 up
link set orchard1 up
neigh add 169.254.0.1 lladdr 02:00:00:00:00:01 dev orchard0 nud permanent
route add default via 169.254.0.1 dev orchard0 onlink
"""
"""`ip -batch` lines that make a `dropped` sandbox's connections out time out instead of failing at once:
a veth pair with both ends inside the sandbox's own network namespace, a default route into one end
via a made-up neighbour. Packets leave one end and arrive at the other, which drops them (the frames
are for another host, and the namespace forwards nothing); no packet leaves the namespace."""
SEALED_UID = 2_147_483_646
"""Owner (uid and gid) of a sealed run folder when Orchard runs as root: no sandbox process has it."""
OPEN_NETWORK = "orchard-open"
OPEN_BRIDGE = "orchard-open0"
HOST_GUARDS = (
    ("INPUT", "-i", OPEN_BRIDGE, "-m", "conntrack", "!", "--ctstate", "ESTABLISHED,RELATED", "-j", "REJECT"),
    ("DOCKER-USER", "-i", OPEN_BRIDGE, "-d", "169.254.0.0/16", "-j", "REJECT"),
)
"""iptables rules keeping `open` sandboxes from this host's services: new connections from the bridge to
the host itself, and to link-local addresses (a cloud's instance metadata service: the host's credentials)."""
DENIED_SYSCALLS = ("io_uring_enter", "io_uring_register", "io_uring_setup")
"""Denied on top of Docker's default seccomp profile: no task needs them, and they widen the kernel surface."""
SECCOMP_DEFAULT = Path(__file__).with_name("docker-default-seccomp.json")
CLONE_PARENT = 0x8000
"""Denied to `clone` on top of the default profile: a child made with it is the agent's, outside the
command's process tree, so a timeout would not find it (no libc or runtime uses it for fork or threads)."""

log = logging.getLogger("orchard.env")


class DockerConfig(BaseModel):
    """Sandboxes as containers of a Docker engine."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["docker"] = "docker"
    base_url: str | None = Field(default=None, description="Engine address; default: DOCKER_HOST or the local socket.")
    runtime: str | None = Field(
        default=None, description="OCI runtime, e.g. `runsc` for gVisor; default: the engine's."
    )
    route: Literal["auto", "socket", "port"] = Field(
        default="auto",
        description="How the host reaches the agent: a Unix socket in a bind-mounted folder, or a "
        "published loopback port where sockets cannot cross (Docker Desktop's VM). `auto` picks.",
    )
    timeout: float = Field(default=300.0, description="Seconds to wait for one Docker API call.")

    def build(self) -> DockerBackend:
        """Connect to the engine (the docker package is imported only now)."""
        return DockerBackend(self)


class DockerBackend:
    """Lifecycle of sandbox containers in one Docker engine. Thread-safe."""

    name = "docker"

    def __init__(self, config: DockerConfig | None = None):
        import docker
        from docker.errors import DockerException

        from orchard.env.bundle import build_bundle

        self.config = config or DockerConfig()
        options = {"version": "auto", "timeout": int(self.config.timeout), "max_pool_size": 64}
        try:
            if self.config.base_url:
                self._api = docker.DockerClient(base_url=self.config.base_url, **options).api
            else:
                self._api = docker.from_env(**options).api
            info = self._api.info()
        except DockerException as exc:
            raise EngineUnavailable(
                f"cannot reach the Docker engine ({_first_line(exc)}); start it (`./dev engine` or `dockerd &`)"
            ) from None
        self._runtime_has_no_network = self._check_runtime(info.get("Runtimes") or {})
        self._disk_cap = _disk_cap_support(info)
        self.route = self.config.route
        if self.route == "auto":
            self.route = "port" if info.get("OperatingSystem") == "Docker Desktop" else "socket"
        self.bundle = build_bundle()
        self._tools_lock = threading.Lock()
        self._run_root = _private_folder(settings().run_dir)
        self._open_network_ready = False
        self._open_network_lock = threading.Lock()
        self._loopback_hosts = _write_once(self._run_root / ".hosts", LOOPBACK_HOSTS)  # no sandbox id starts with "."
        self._api.trust_env = False  # no proxy look-up on every call to a local engine

    def _check_runtime(self, runtimes: dict[str, dict]) -> bool:
        """Refuse a runtime the engine lacks; True when it is registered with no network at all."""
        runtime = self.config.runtime
        if runtime is None:
            return False
        if runtime not in runtimes:
            raise ConfigError(
                f"the Docker engine has no runtime {runtime!r} (it has {', '.join(sorted(runtimes)) or 'none'}); "
                "register it in /etc/docker/daemon.json (`./dev engine` does it for runsc)"
            )
        return "--network=none" in (runtimes[runtime].get("runtimeArgs") or [])

    # -- lifecycle --------------------------------------------------------------------

    def pod_name(self, sandbox_id: str) -> str:
        return f"orchard-{sandbox_id}"

    def create(self, sandbox_id: str, spec: SandboxSpec, token: str) -> AgentEndpoint:
        """Create and start the container; the agent answers shortly after this returns."""
        from docker.errors import APIError
        from docker.errors import ImageNotFound as DockerImageNotFound

        if self.route == "port" and spec.network != "open":
            raise ConfigError(
                f"network {spec.network!r} needs the socket route; this engine only allows a published "
                "port (Docker Desktop): create the sandbox with network 'open'"
            )
        if self._runtime_has_no_network and spec.network == "open":
            raise ConfigError(
                f"the engine's {self.config.runtime!r} runtime is registered with --network=none, so its "
                "sandboxes can only have network 'blocked'"
            )
        if spec.disk_bytes and self._disk_cap is not None:
            raise ConfigError(f"this Docker engine cannot cap a sandbox's disk: {self._disk_cap}")
        tools = self.tools_bundle() if spec.tools else None
        if spec.network == "open":
            self._ensure_open_network()
        run_dir = self._run_dir(sandbox_id)
        try:
            run_dir.mkdir(mode=0o777)
        except FileExistsError:
            raise Conflict(f"sandbox id {sandbox_id!r} is already in use on this host") from None
        run_dir.chmod(0o777)  # the image's own user, whoever it is, creates the socket here
        try:
            container = self._api.create_container(
                spec.image,
                entrypoint=self._agent_argv(spec),
                name=self.pod_name(sandbox_id),
                labels=labels_for(sandbox_id, spec),
                environment={**spec.env, **self.bundle.environment(AGENT_MOUNT), TOKEN_ENV: token},
                host_config=self._host_config(run_dir, spec, tools),
                ports=[AGENT_PORT] if self.route == "port" else None,
                # Blocked: not even Docker's network set-up runs (its busiest per-container
                # work); the container keeps only loopback.
                network_disabled=spec.network != "open",
                detach=True,
            )
        except DockerImageNotFound:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise ImageNotFound(
                f"image {spec.image!r} not found in the Docker engine; build it "
                "(`orchard image build-base`) or pull it where a registry is reachable"
            ) from None
        except APIError as exc:
            shutil.rmtree(run_dir, ignore_errors=True)  # the container, if any, is someone else's
            if exc.status_code == 409:
                raise Conflict(f"sandbox id {sandbox_id!r} is already in use in the Docker engine") from None
            raise SandboxError(f"Docker could not create a container of {spec.image!r}: {_first_line(exc)}") from None
        try:
            self._api.start(container["Id"])
            if self.route == "port":
                return AgentEndpoint(token=token, url=f"http://127.0.0.1:{self._published_port(container['Id'])}")
            if spec.network == "dropped":
                self._drop_packets(container["Id"])
        except APIError as exc:
            self._remove(container["Id"])
            shutil.rmtree(run_dir, ignore_errors=True)
            raise SandboxError(f"Docker could not start {spec.image!r}: {_first_line(exc)}") from None
        except BaseException:
            self._remove(container["Id"])
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        return AgentEndpoint(token=token, uds=str(run_dir / "agent.sock"))

    def state(self, sandbox_id: str) -> SandboxState:
        """Running or not, with the exit code and the last log lines when it stopped."""
        from docker.errors import APIError
        from docker.errors import NotFound as DockerNotFound

        container = self._sandbox_container(sandbox_id)
        if container is None or not self._is_sandbox(container, sandbox_id):
            return SandboxState(running=False, exists=False, message="the container is gone")
        state = container["State"]
        if state.get("Running"):
            return SandboxState(running=True)
        try:
            logs = self._api.logs(container["Id"], tail=5).decode(errors="replace").strip()
        except DockerNotFound:
            return SandboxState(running=False, exists=False, message="the container is gone")
        except APIError as exc:
            if exc.status_code == 409:  # dead or being removed: deleted meanwhile
                return SandboxState(running=False, exists=False, message="the container is being removed")
            logs = f"(its logs cannot be read: {_first_line(exc)})"
        message = f"the container exited with code {state.get('ExitCode')}"
        if state.get("Error"):
            message += f": {state['Error']}"
        if logs:
            message += f"; last output: {logs[-500:]}"
        return SandboxState(running=False, message=message)

    def seal(self, sandbox_id: str) -> None:
        """Make the run folder read-only for the sandbox, now that the agent listens there.

        Owned by `SEALED_UID` (as root) or by the operator, mode 0555: see the module docstring.
        A non-root operator whose uid the image's user shares would own the folder from inside
        too, so such a sandbox is refused (runc; gVisor's sockets do not show that uid).
        """
        if self.route == "port":
            return
        run_dir = self._run_dir(sandbox_id)
        if os.getuid() == 0:
            os.chown(run_dir, SEALED_UID, SEALED_UID)
        run_dir.chmod(0o555)
        try:
            entries = {name: os.lstat(run_dir / name).st_mode for name in os.listdir(run_dir)}
        except OSError as exc:
            raise SandboxError(f"the run folder of sandbox {sandbox_id} cannot be checked: {exc}") from None
        if stat.S_ISSOCK(entries.get("agent.sock.new", 0)):
            del entries["agent.sock.new"]  # under gVisor the agent's first bind cannot be renamed or unlinked
        if list(entries) != ["agent.sock"] or not stat.S_ISSOCK(entries["agent.sock"]):
            # Code that ran before the seal (an image's PYTHONPATH or ld.so.preload reaching the
            # agent, say) left something there that would stay writable: a folder of its own.
            raise SandboxError(
                f"the run folder of sandbox {sandbox_id} holds {sorted(entries)} instead of the agent's socket alone: "
                "something other than the agent ran in the sandbox before it was sealed; check the image"
            )
        socket_owner = os.lstat(run_dir / "agent.sock").st_uid
        if socket_owner == run_dir.stat().st_uid:
            raise SandboxError(
                f"the image's user (uid {socket_owner}) is this operator's uid, so sandbox {sandbox_id} could write "
                "to the host through its run folder: run Orchard as root or as another user"
            )

    def delete(self, sandbox_id: str, owner: str | None = None) -> None:
        """Remove the sandbox's container (forced, with its anonymous volumes) and its run folder.

        Idempotent. Only a container labelled as Orchard's sandbox `sandbox_id` (of `owner`,
        when given) is removed; a container that merely has the name `orchard-<id>` is left
        alone, and so is the sandbox of another owner: both raise NotFound.
        """
        container = self._sandbox_container(sandbox_id)
        if container is not None:
            if not self._is_sandbox(container, sandbox_id, owner):
                whose = "another owner's sandbox" if self._is_sandbox(container, sandbox_id) else "not Orchard's"
                raise NotFound(
                    f"no sandbox {sandbox_id!r} here: the container orchard-{sandbox_id} is {whose}; left alone"
                )
            self._remove(container["Id"])
        run_dir = self._run_dir(sandbox_id)
        with contextlib.suppress(FileNotFoundError):
            run_dir.chmod(0o700)  # unseal: as its owner, whoever runs Orchard
        shutil.rmtree(run_dir, ignore_errors=True)

    def list(self) -> list[BackendSandbox]:
        """Every Orchard container in this engine, found by label."""
        found = self._api.containers(all=True, filters={"label": LABEL_PREFIX + "managed=true"})
        return [
            BackendSandbox(sandbox_id=c["Labels"][LABEL_PREFIX + "sandbox"], labels=c["Labels"])
            for c in found
            if LABEL_PREFIX + "sandbox" in c.get("Labels", {})
        ]

    def close(self) -> None:
        """Close the engine connection pool."""
        self._api.close()

    # -- helpers ----------------------------------------------------------------------

    def _agent_argv(self, spec: SandboxSpec) -> builtins.list[str]:
        listen = ["--tcp", f"0.0.0.0:{AGENT_PORT}"] if self.route == "port" else ["--unix", f"{RUN_MOUNT}/agent.sock"]
        return [*self.bundle.command(AGENT_MOUNT), *listen, "--workdir", spec.workdir]

    def _sandbox_container(self, sandbox_id: str) -> dict | None:
        """The container named after the sandbox, whoever made it (None if there is none)."""
        from docker.errors import NotFound as DockerNotFound

        try:
            return self._api.inspect_container(self.pod_name(sandbox_id))
        except DockerNotFound:
            return None

    @staticmethod
    def _is_sandbox(container: dict, sandbox_id: str, owner: str | None = None) -> bool:
        """Whether Orchard labelled `container` as sandbox `sandbox_id` (of `owner`, if given)."""
        labels = (container.get("Config") or {}).get("Labels") or {}
        return (
            labels.get(LABEL_PREFIX + "managed") == "true"
            and labels.get(LABEL_PREFIX + "sandbox") == sandbox_id
            and (owner is None or labels.get(LABEL_PREFIX + "owner") == owner)
        )

    def _ensure_open_network(self) -> None:
        """Create `OPEN_NETWORK` if missing and check it and the host guard, once per backend."""
        with self._open_network_lock:
            if self._open_network_ready:
                return
            network = self._open_network()
            options = network.get("Options") or {}
            if options.get("com.docker.network.bridge.enable_icc") != "false" or (
                options.get("com.docker.network.bridge.name") != OPEN_BRIDGE
            ):
                raise ConfigError(
                    f"the Docker network {OPEN_NETWORK!r} lets containers reach each other or is not on bridge "
                    f"{OPEN_BRIDGE}; remove it (`docker network rm {OPEN_NETWORK}`) and Orchard makes it anew"
                )
            self._install_host_guards()
            self._open_network_ready = True

    def _open_network(self) -> dict:
        from docker.errors import APIError
        from docker.errors import NotFound as DockerNotFound

        for _ in range(2):
            with contextlib.suppress(DockerNotFound):
                return self._api.inspect_network(OPEN_NETWORK)
            try:
                self._api.create_network(
                    OPEN_NETWORK,
                    driver="bridge",
                    options={
                        "com.docker.network.bridge.enable_icc": "false",
                        "com.docker.network.bridge.name": OPEN_BRIDGE,
                    },
                    labels={LABEL_PREFIX + "managed": "true"},
                    check_duplicate=True,
                )
            except APIError as exc:  # made meanwhile by another process: inspect it again
                if exc.status_code != 409 and "already exists" not in str(exc):
                    raise SandboxError(
                        f"Docker could not create the network {OPEN_NETWORK}: {_first_line(exc)}"
                    ) from None
        return self._api.inspect_network(OPEN_NETWORK)

    def _install_host_guards(self) -> None:
        """Add each of `HOST_GUARDS` unless present; refuse `open` without them (warn on Docker Desktop)."""
        iptables = shutil.which("iptables") or shutil.which("iptables", path="/usr/sbin:/sbin")
        for rule in HOST_GUARDS:
            why = "no iptables command" if iptables is None else ""
            if iptables is not None:
                if subprocess.run([iptables, "-w", "-C", *rule], capture_output=True).returncode == 0:
                    continue
                add = subprocess.run([iptables, "-w", "-I", *rule], capture_output=True, text=True)
                if add.returncode == 0:
                    continue
                why = (add.stderr.strip().splitlines() or [f"iptables exited with {add.returncode}"])[0]
            if self.route != "port":
                raise ConfigError(
                    f"network 'open' needs firewall rules keeping sandboxes from this host's services, and one "
                    f"could not be installed ({why}): run Orchard as root once, or add it: "
                    f"iptables -I {shlex.join(rule)}"
                )
            log.warning("network 'open' sandboxes may reach the Docker VM's services: %s", why)

    def tools_bundle(self) -> ToolsBundle:
        """The agent CLIs' bundle a spec with `tools` mounts: built the first time (minutes), then a
        cache hit that marks it used (one build at a time across this backend's threads)."""
        from orchard.env.tools import build_tools

        with self._tools_lock:
            return build_tools()

    def _host_config(self, run_dir: Path, spec: SandboxSpec, tools: ToolsBundle | None = None) -> dict:
        from docker.types import Mount

        from orchard.env.tools import TOOLS_MOUNT

        mounts = [
            Mount(AGENT_MOUNT, str(self.bundle.path), type="bind", read_only=True),
            Mount(RUN_MOUNT, str(run_dir), type="bind"),
        ]
        if tools is not None:
            mounts.append(Mount(TOOLS_MOUNT, str(tools.path), type="bind", read_only=True))
        if spec.network != "open":  # Docker writes no /etc/hosts without networking
            mounts.append(Mount("/etc/hosts", str(self._loopback_hosts), type="bind", read_only=True))
        return self._api.create_host_config(
            mounts=mounts,
            network_mode="none" if spec.network != "open" else OPEN_NETWORK,
            port_bindings={AGENT_PORT: ("127.0.0.1", None)} if self.route == "port" else None,
            init=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges", f"seccomp={seccomp_profile()}"],
            pids_limit=spec.pids,
            nano_cpus=max(int(spec.cpu * 1e9), MIN_NANO_CPUS) if spec.cpu else None,
            mem_limit=spec.memory_bytes,
            storage_opt={"size": str(spec.disk_bytes)} if spec.disk_bytes else None,
            tmpfs={path: f"size={size},mode=1777" for path, size in spec.tmpfs.items()} or None,
            runtime=self.config.runtime,
        )

    def _drop_packets(self, container: str) -> None:
        """Add `DROP_ROUTES` to the started container's network namespace (never to this host's own).

        Where this host cannot (no root, no `nsenter` or `ip`, runsc), the sandbox stays `blocked`,
        which is as closed, and a warning says so: connections out then fail at once.
        """
        nsenter = shutil.which("nsenter") or shutil.which("nsenter", path="/usr/bin:/bin")
        ip = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin")
        if self._runtime_has_no_network or nsenter is None or ip is None:
            why = (
                f"the {self.config.runtime!r} runtime has its own network"
                if self._runtime_has_no_network
                else ("no nsenter or ip command (apt-get install util-linux iproute2)")
            )
            log.warning("network 'dropped' stays 'blocked' (connections out fail at once): %s", why)
            return
        pid = self._api.inspect_container(container)["State"]["Pid"]
        try:
            netns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise SandboxError(f"cannot open the sandbox's network namespace: {exc.strerror or exc}") from None
        try:
            found, own = os.fstat(netns), os.stat("/proc/self/ns/net")
            # Held open, the namespace is the container's even if its pid is reused from here on.
            if (found.st_dev, found.st_ino) == (own.st_dev, own.st_ino) or (
                self._api.inspect_container(container)["State"]["Pid"] != pid
            ):
                raise SandboxError("the sandbox stopped while its network was set up")
            done = subprocess.run(
                [nsenter, f"--net=/proc/self/fd/{netns}", ip, "-batch", "-"],
                input=DROP_ROUTES,
                pass_fds=(netns,),
                capture_output=True,
                text=True,
                timeout=30,
            )
        finally:
            os.close(netns)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[0]
            log.warning(
                "network 'dropped' stays 'blocked' (connections out fail at once): %s; run Orchard as root", why
            )

    def _published_port(self, container: str) -> int:
        ports = self._api.inspect_container(container)["NetworkSettings"]["Ports"]
        return int(ports[f"{AGENT_PORT}/tcp"][0]["HostPort"])

    def _remove(self, container: str) -> None:
        """Remove one container by name or id, forced; gone already is fine."""
        from docker.errors import APIError
        from docker.errors import NotFound as DockerNotFound

        try:
            self._api.remove_container(container, force=True, v=True)
        except DockerNotFound:
            pass
        except APIError as exc:
            if "already in progress" not in str(exc):
                raise SandboxError(f"Docker could not remove {container}: {_first_line(exc)}") from None

    def _run_dir(self, sandbox_id: str) -> Path:
        """The sandbox's socket folder: always a direct child of the run root, never elsewhere."""
        run_dir = self._run_root / sandbox_id
        if run_dir.parent != self._run_root or sandbox_id in ("", ".", ".."):
            raise InvalidRequest(f"sandbox id {sandbox_id!r} cannot name a folder")
        return run_dir


@lru_cache(maxsize=1)
def seccomp_profile() -> str:
    """Docker's default profile (shipped: Docker's API takes a profile only whole) minus `DENIED_SYSCALLS`,
    and `clone` refused with `CLONE_PARENT`."""
    profile = json.loads(SECCOMP_DEFAULT.read_text())
    for rule in profile["syscalls"]:
        rule["names"] = [name for name in rule["names"] if name not in DENIED_SYSCALLS]
    profile["syscalls"] = [rule for rule in profile["syscalls"] if rule["names"]]
    for rule in profile["syscalls"]:  # `clone` without CAP_SYS_ADMIN: namespace flags masked, and CLONE_PARENT
        for arg in rule.get("args") or []:
            if rule["names"] == ["clone"] and arg["op"] == "SCMP_CMP_MASKED_EQ":
                arg["value"] |= CLONE_PARENT
    profile["syscalls"].append(
        {"names": list(DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": 38, "comment": "ENOSYS: by Orchard"}
    )
    return json.dumps(profile, separators=(",", ":"))


def _private_folder(path: Path) -> Path:
    """Create `path` (mode 0700) or check an existing one is ours: others must not plant sockets there."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise ConfigError(f"{path} is not a folder of this user; set ORCHARD_RUN_DIR to a private folder")
    if stat.S_IMODE(info.st_mode) != 0o700:
        path.chmod(0o700)
    return path


def _write_once(path: Path, text: str) -> Path:
    """Write a file readable by all, atomically, unless it already holds `text` (it may be mounted)."""
    with contextlib.suppress(OSError):
        if path.read_text() == text:
            return path
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.chmod(0o644)
    os.replace(tmp, path)
    return path


def _disk_cap_support(info: dict) -> str | None:
    """None if the engine can cap a container's writable layer (`storage-opt size`), else why not."""
    driver = info.get("Driver", "")
    status = dict(tuple(pair) for pair in info.get("DriverStatus") or [] if len(pair) == 2)
    if driver in ("btrfs", "zfs", "windowsfilter"):
        return None
    if driver in ("overlay2", "fuse-overlayfs") and status.get("Backing Filesystem") == "xfs":
        return None  # the engine itself refuses at create if xfs lacks the pquota mount option
    backing = status.get("Backing Filesystem", "unknown")
    return (
        f"its storage driver is {driver} on {backing}; disk caps need overlay2 on xfs mounted with pquota, "
        "or btrfs/zfs (use tmpfs= folders for capped scratch space instead)"
    )


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "explanation", None) or str(exc)
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return str(text).strip().splitlines()[0] if str(text).strip() else type(exc).__name__


def engine_reachable() -> bool:
    """Whether a Docker engine answers (for `orchard status`)."""
    import docker

    try:
        client = docker.from_env(timeout=5)
    except Exception:  # no socket, bad DOCKER_HOST, ...
        return False
    try:
        return bool(client.ping())
    except Exception:  # any way of not reaching it
        return False
    finally:
        client.close()
