"""A real Kubernetes control plane on loopback for tests and benches: etcd and kube-apiserver, nothing else.

No cluster runs here, but its API server does: `./dev test` builds kube-apiserver 1.20.2 from Debian's
source package once (cached under ~/.cache/orchard/kube/KUBE_BUILD/; with reflect2 1.0.2 put in, so that a
pretty-printed answer does not crash it) and installs Debian's etcd. `start_cluster()`
runs both on free loopback ports with what a real cluster's API server has: TLS with its own CA, token
authentication (an admin token in `system:masters`), `Node,RBAC` authorization, admission (less the
ServiceAccount plugin, since no controller makes the default service accounts), server-side dry run, and
service-account tokens through the TokenRequest API.

What it is not: there is no scheduler, no controller manager and no kubelet (tests/kube/kubelet.py plays
the kubelet). So nothing binds, runs or garbage-collects Pods by itself; a Pod bound to a node and deleted
with a grace period > 0 only gets a deletionTimestamp and stays until something deletes it again with grace
0 (a kubelet's job); a deleted namespace stays Terminating forever (no namespace controller); no service
account or its token Secret is made by itself (create them, and ask for tokens with TokenRequest).

As any API server of its version: a Pod's delete is watched as MODIFIED (deletionTimestamp set) then
DELETED; after `restart()` the watch cache starts at etcd's revision then, so a watch from an older
resourceVersion gets 410 Gone (relist); `--allow-privileged` is off, so a privileged container is refused.

Outside pytest (a bench): `sys.path.insert(0, "tests/kube")`, then `with start_cluster(folder) as cluster:`.
"""

from __future__ import annotations

import ctypes
import datetime
import ipaddress
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import yaml

KUBE_VERSION = "1.20.2"
KUBE_BUILD = f"{KUBE_VERSION}-2"  # ./dev's cache folder: its suffix changes with the build (-2: reflect2 1.0.2)
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "orchard" / "kube"
APISERVER = CACHE / KUBE_BUILD / "kube-apiserver"
SERVICE_CIDR = "10.96.0.0/16"
ADMIN = "orchard-admin"


class ClusterMissing(RuntimeError):
    """The API server's binary or etcd is not installed; `./dev test` installs both."""


class Cluster:
    """A running etcd + kube-apiserver pair; the API server can be stopped and started again on the same
    port and etcd data (fault tests), while etcd runs throughout."""

    def __init__(self, folder: Path, etcd_url: str, port: int, apiserver_args: list[str]) -> None:
        self.folder = folder
        self.etcd_url = etcd_url
        self.url = f"https://127.0.0.1:{port}"
        self.token = (folder / "admin-token").read_text()
        self.ca_file = folder / "ca.crt"
        self.kubeconfig = folder / "kubeconfig"
        self._args = apiserver_args
        self._process: subprocess.Popen[bytes] | None = None
        self._log = folder / "kube-apiserver.log"

    def client(self, token: str | None = None):
        """A `kubernetes.client.ApiClient` for this API server, as the admin or with another bearer token."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        configuration.ssl_ca_cert = str(self.ca_file)
        configuration.api_key = {"BearerToken": f"Bearer {token or self.token}"}
        configuration.connection_pool_maxsize = 64  # the test kubelet's workers and watch, without reconnecting
        return client.ApiClient(configuration)

    @property
    def running(self) -> bool:
        """Whether the API server process is alive (it may not be ready yet)."""
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 120) -> float:
        """Start the API server and wait until /readyz answers 200; return the seconds it took."""
        if self.running:
            raise RuntimeError("the API server is already running")
        began = time.monotonic()
        with self._log.open("ab") as log:
            log.write(f"--- start {time.time():.3f}\n".encode())
            self._process = _spawn([str(APISERVER), *self._args], log)
        self._wait_ready(began + timeout)
        return time.monotonic() - began

    def stop(self) -> None:
        """Stop the API server (SIGTERM, then SIGKILL after 20 s); etcd and its data stay."""
        if self._process is not None:
            _terminate(self._process)
            self._process = None

    def restart(self) -> float:
        """Stop and start the API server on the same port and etcd data; return the start's seconds."""
        self.stop()
        return self.start()

    def log_tail(self, lines: int = 30) -> str:
        """The end of the API server's log, for a failure message."""
        text = self._log.read_text(errors="replace") if self._log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def _wait_ready(self, deadline: float) -> None:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.token}"})
        while True:
            if not self.running:
                raise RuntimeError(f"kube-apiserver exited while starting; its log ends:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(request, context=context, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or 500 while its post-start hooks run
            if time.monotonic() > deadline:
                raise TimeoutError(f"kube-apiserver was not ready in time; its log ends:\n{self.log_tail()}")
            time.sleep(0.1)


@contextmanager
def start_cluster(folder: Path, extra_args: tuple[str, ...] = ()) -> Iterator[Cluster]:
    """Run etcd and kube-apiserver with their state in `folder` (etcd's data on tmpfs when there is room);
    both are stopped on exit, and also if this process dies (the kernel's parent-death signal)."""
    _check_installed()
    folder.mkdir(parents=True, exist_ok=True)
    etcd_port, peer_port, api_port = _free_ports(3)
    _write_credentials(folder, api_port)
    with ExitStack() as stack:
        data = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=_etcd_prefix(), dir=_fast_folder())))
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        etcd_log = stack.enter_context((folder / "etcd.log").open("ab"))
        # etcd's own options: one member on loopback; the WAL's fsyncs are cheap on tmpfs.
        etcd = _spawn(
            [
                "etcd",
                "--name=orchard-test",
                f"--data-dir={data}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=orchard-test=http://127.0.0.1:{peer_port}",
                "--logger=zap",
                "--log-level=warn",
            ],
            etcd_log,
        )
        stack.callback(_terminate, etcd)
        cluster = Cluster(folder, etcd_url, api_port, _apiserver_args(folder, etcd_url, api_port, extra_args))
        stack.callback(cluster.stop)
        cluster.start()
        yield cluster


def _apiserver_args(folder: Path, etcd_url: str, port: int, extra: tuple[str, ...]) -> list[str]:
    return [
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={folder}",
        f"--tls-cert-file={folder / 'apiserver.crt'}",
        f"--tls-private-key-file={folder / 'apiserver.key'}",
        f"--client-ca-file={folder / 'ca.crt'}",
        f"--token-auth-file={folder / 'tokens.csv'}",
        "--authorization-mode=Node,RBAC",
        "--disable-admission-plugins=ServiceAccount",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-signing-key-file={folder / 'service-account.key'}",
        f"--service-account-key-file={folder / 'service-account.key'}",
        "--profiling=false",
        "--logtostderr=true",
        "--v=0",
        *extra,
    ]


def _write_credentials(folder: Path, port: int) -> None:
    """A CA and the server's certificate for loopback, the service-account signing key, the admin's token
    (token file and kubeconfig)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )

    now = datetime.datetime.now(datetime.UTC)
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "orchard-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    addresses = [ipaddress.ip_address("127.0.0.1"), next(ipaddress.ip_network(SERVICE_CIDR).hosts())]
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([*map(x509.DNSName, names), *map(x509.IPAddress, addresses)]), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (folder / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "apiserver.crt").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    _write_private(folder / "apiserver.key", key_pem(server_key))
    _write_private(folder / "service-account.key", key_pem(ec.generate_private_key(ec.SECP256R1())))
    token = secrets.token_hex(24)
    _write_private(folder / "admin-token", token.encode())
    _write_private(folder / "tokens.csv", f'{token},{ADMIN},{ADMIN},"system:masters"\n'.encode())
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "orchard-test",
                "cluster": {"server": f"https://127.0.0.1:{port}", "certificate-authority": str(folder / "ca.crt")},
            }
        ],
        "users": [{"name": ADMIN, "user": {"token": token}}],
        "contexts": [{"name": "orchard-test", "context": {"cluster": "orchard-test", "user": ADMIN}}],
        "current-context": "orchard-test",
    }
    _write_private(folder / "kubeconfig", yaml.safe_dump(kubeconfig, sort_keys=False).encode())


def _key_usage(cert_sign: bool):
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _write_private(path: Path, data: bytes) -> None:
    path.touch(mode=0o600)
    path.write_bytes(data)


def _check_installed() -> None:
    if not APISERVER.is_file():
        raise ClusterMissing(f"no kube-apiserver at {APISERVER}: run ./dev test, which builds it")
    if shutil.which("etcd") is None:
        raise ClusterMissing("no etcd on PATH: run ./dev test, which installs Debian's etcd-server")


def _free_ports(count: int) -> list[int]:
    """Ports free on loopback now (each socket held until all are picked, so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _fast_folder() -> str | None:
    """tmpfs for etcd's data where it has room (its WAL preallocates 64 MB files), else the default;
    what a killed test process left there (memory, on tmpfs) goes first."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or shutil.disk_usage(shm).free < 1 << 30:
        return None
    for left in shm.glob("orchard-etcd-*-*"):
        pid = left.name.split("-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(left, ignore_errors=True)
    return str(shm)


def _etcd_prefix() -> str:
    return f"orchard-etcd-{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's
    return True


def _die_with_parent() -> None:
    """In the child before exec: the kernel sends SIGTERM when the test process dies, so a killed run
    leaves no server behind."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _spawn(argv: list[str], log) -> subprocess.Popen[bytes]:
    """A server in a session of its own: a terminal's Ctrl-C (SIGINT to its whole process group) reaches
    only this process, which stops the servers in order (what uses the API server first, etcd last)."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent,
        start_new_session=True,
    )


def _terminate(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
KUBELET_STOP_SECONDS = 15.0


def main() -> None:
    """`python tests/kube/cluster.py [FOLDER]`: this control plane with the test kubelet (containers on
    the local Docker engine) and the namespace `orchard-sandboxes`, until Ctrl-C; it prints the
    kubeconfig to give `orchard up --backend kubernetes --kubeconfig ...`.

    Ctrl-C, SIGTERM or SIGHUP (a closed terminal) stops it whatever state the API server is in (even
    dead), in seconds (at worst KUBELET_STOP_SECONDS for the test kubelet, then the servers' own SIGTERM
    grace): the test kubelet's containers, volumes and Docker network are removed,
    kube-apiserver and etcd (and etcd's data) are gone, and so is the state folder, a temporary one,
    unless FOLDER was given: then it stays, with the servers' logs. A second signal while it stops is
    ignored, so the clean-up is not cut short."""
    import sys

    import docker
    from kubernetes import client

    _stop_on_signals()
    given = len(sys.argv) > 1
    folder = Path(sys.argv[1] if given else tempfile.mkdtemp(prefix="orchard-kube-"))
    try:
        with start_cluster(folder) as cluster, _test_kubelet(cluster, docker.from_env()):
            namespace = client.V1Namespace(metadata=client.V1ObjectMeta(name="orchard-sandboxes"))
            client.CoreV1Api(cluster.client()).create_namespace(namespace)
            print(f"kube-apiserver {KUBE_VERSION} at {cluster.url} with a test kubelet; Ctrl-C stops both", flush=True)
            print(f"kubeconfig: {cluster.kubeconfig}", flush=True)
            _wait_for_a_signal()
    except KeyboardInterrupt:
        pass  # a signal, while waiting or while starting: what had started is stopped all the same
    finally:
        if not given:
            shutil.rmtree(folder, ignore_errors=True)


def _stop_on_signals() -> None:
    """Each of STOP_SIGNALS raises KeyboardInterrupt in the main thread, once: from then on they are
    ignored. Installed whatever this process inherited (a background job of a non-interactive shell
    starts with SIGINT ignored, and SIGTERM's default would end it with nothing cleaned up), except
    an ignored SIGHUP (nohup)."""

    def stop(signum: int, frame: object) -> None:
        for number in STOP_SIGNALS:
            signal.signal(number, signal.SIG_IGN)
        # os.write, not print: a handler may run inside the main thread's own print
        os.write(2, f"{signal.Signals(signum).name}: stopping the test kubelet, kube-apiserver and etcd\n".encode())
        raise KeyboardInterrupt

    for number in STOP_SIGNALS:
        if number != signal.SIGHUP or signal.getsignal(number) != signal.SIG_IGN:
            signal.signal(number, stop)


def _wait_for_a_signal() -> None:
    """Sleep until a signal's handler raises. Not `signal.pause()`: it returns only if the signal is
    delivered to the main thread, and the kernel may pick any thread that does not block it (the test
    kubelet runs many), leaving the handler pending unseen. The wakeup fd is written whichever does."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    try:
        while True:
            os.read(read, 64)  # the handler runs (and raises) as soon as this returns, if not before
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)


@contextmanager
def _test_kubelet(cluster: Cluster, docker_client) -> Iterator[object]:
    """The test kubelet on this cluster, stopped on exit in at most KUBELET_STOP_SECONDS: with its API
    server dead, its calls retry meanwhile (a Pod's delete for up to a minute). What it made in Docker
    goes either way; its threads, daemons, end with this process."""
    from kubelet import LABEL, TestKubelet

    kubelet = TestKubelet(cluster.client(), docker_client).start()
    try:
        yield kubelet
    finally:
        stopping = threading.Thread(target=kubelet.stop, name="stop the test kubelet", daemon=True)
        stopping.start()
        stopping.join(KUBELET_STOP_SECONDS)
        if stopping.is_alive():
            print(f"the test kubelet did not stop in {KUBELET_STOP_SECONDS:.0f} s: removing what it made", flush=True)
        kubelet._remove_objects({f"{LABEL}/instance": kubelet.instance})


if __name__ == "__main__":
    main()
