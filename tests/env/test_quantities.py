"""What a sandbox may ask for, as the published Orchard Env service (on Kubernetes) takes it.

CPU and memory are Kubernetes quantities (`k8s.io/apimachinery/pkg/api/resource`), case-sensitive;
sandbox ids are what Kubernetes takes in a pod name and a label value (a DNS-1123 subdomain, at
most 63 characters). The last test starts a real sandbox with a dotted id of the longest length.
"""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import Field, TypeAdapter, ValidationError

from orchard.env.backends.base import (
    SANDBOX_ID,
    SANDBOX_ID_MAX_LENGTH,
    check_sandbox_id,
    is_sandbox_id,
    make_spec,
    parse_cpu,
    parse_memory,
)
from orchard.errors import InvalidRequest

Ki, Mi, Gi, Ti, Pi, Ei = (2 ** (10 * n) for n in range(1, 7))


@pytest.mark.parametrize(
    ("text", "cores"),
    [
        ("2", 2.0),
        ("0.5", 0.5),
        ("2000m", 2.0),
        ("100m", 0.1),
        ("1e3", 1000.0),
        ("1E3", 1000.0),
        ("2.5e-1", 0.25),
        (".5", 0.5),
        ("5.", 5.0),
        ("+1", 1.0),
        (" 250m ", 0.25),  # Kubernetes trims whitespace around a quantity
        ("1k", 1000.0),
        ("1500u", 0.002),  # finer than a millicore: rounded up to one, as the kubelet does
        ("1n", 0.001),
        ("1e-30", 0.001),
        (0.5, 0.5),
        (2, 2.0),
    ],
)
def test_cpu_is_a_kubernetes_quantity_in_cores(text, cores):
    assert parse_cpu(text) == cores


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("16Gi", 16 * Gi),
        ("512Mi", 512 * Mi),
        ("1Ki", Ki),
        ("2Ti", 2 * Ti),
        ("1Pi", Pi),
        ("7Ei", 7 * Ei),
        ("1.5Gi", 1536 * Mi),
        (".5Ki", 512),
        ("1k", 10**3),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),  # exa, not an exponent
        ("1e9", 10**9),
        ("1E3", 10**3),
        ("1e+3", 10**3),
        ("1.G", 10**9),
        ("1000000", 10**6),
        (1000000, 10**6),
        ("1500m", 2),  # m is milli: 1.5 bytes, rounded up as Kubernetes rounds it
        ("1m", 1),
        ("1.0000000001", 2),
        ("4Gi\n", 4 * Gi),
    ],
)
def test_memory_is_a_kubernetes_quantity_in_bytes(text, size):
    assert parse_memory(text) == size


@pytest.mark.parametrize(
    "text",
    ["16gi", "2g", "512MB", "512mb", "1K", "1gi", "2GB", "1e3m", "1e3Ki", "1_000", "0x10", "1e", "1e+", "Gi", ".",
     "", " ", "lots", "inf", "nan", "1 Gi", "١٢"],
)  # fmt: skip
def test_memory_that_kubernetes_refuses_is_refused_with_examples(text):
    with pytest.raises(InvalidRequest) as refused:
        parse_memory(text)
    assert str(refused.value) == f"memory {text!r} is not a Kubernetes quantity: use e.g. 512Mi, 16Gi or 1G"


@pytest.mark.parametrize("text", ["1e3m", "2 cores", "2000 m", "nan", "inf", "1_0", ""])
def test_cpu_that_kubernetes_refuses_is_refused_with_examples(text):
    with pytest.raises(InvalidRequest, match=r"^cpu .* is not a Kubernetes quantity: use e\.g\. 2, 0\.5 or 500m$"):
        parse_cpu(text)


def test_zero_negative_and_huge_quantities_are_refused_clearly():
    for text in ("0", "-1Gi", "0.0", "-0", "0Ki"):
        with pytest.raises(InvalidRequest, match=f"^memory must be positive, not '{text}'$"):
            parse_memory(text)
    with pytest.raises(InvalidRequest, match=r"^cpu must be positive, not '-100m'$"):
        parse_cpu("-100m")
    for text in ("8Ei", "1e400", "1e999999999999", "9" * 30):  # past what an int64 holds (1e999999999999: quickly)
        with pytest.raises(InvalidRequest, match=r"^memory '.*' is too large: at most 2\^63-1 bytes$"):
            parse_memory(text)
    with pytest.raises(InvalidRequest, match="out of range"):
        parse_memory("1e" + "9" * 5000)  # more digits than Python turns into an int
    assert parse_memory(str(2**63 - 1)) == 2**63 - 1
    assert parse_memory("1e-999999999999") == 1  # a tiny positive quantity rounds up to one byte


def test_make_spec_takes_quantities_and_names_the_field_at_fault():
    spec = make_spec("img", cpu="500m", memory="4Gi", disk="10G", tmpfs={"/scratch": "16Mi"})
    assert (spec.cpu, spec.memory_bytes, spec.disk_bytes, spec.tmpfs) == (0.5, 4 * Gi, 10**10, {"/scratch": 16 * Mi})
    assert make_spec("img", cpu=0.25).cpu == 0.25
    with pytest.raises(InvalidRequest, match=r"^disk '2g' is not a Kubernetes quantity"):
        make_spec("img", disk="2g")
    with pytest.raises(InvalidRequest, match=r"^tmpfs /scratch '16mb' is not a Kubernetes quantity"):
        make_spec("img", tmpfs={"/scratch": "16mb"})
    with pytest.raises(InvalidRequest, match=r"^tmpfs /scratch must be positive"):
        make_spec("img", tmpfs={"/scratch": "0"})
    with pytest.raises(InvalidRequest, match=r"^cpu 'two' is not a Kubernetes quantity"):
        make_spec("img", cpu="two")


def test_the_repository_own_limits_are_kubernetes_quantities():
    from orchard.tasks.base import SANDBOX_LIMITS

    assert make_spec("img", **SANDBOX_LIMITS).memory_bytes == 4 * Gi


ACCEPTED_IDS = [
    "a",
    "0",
    "1a2b3c4d",  # the published service's own ids: 8 hex
    "bench-1a2b3c4d",  # the published SDK's SANDBOX_PREFIX form
    "a.b",
    "a-b.c-d.e",
    "my.sandbox.v2",
    "x" * 63,
    "a." + "b" * 61,
]
REFUSED_IDS = [
    "",
    ".",
    "..",
    "a..b",  # an empty label: no '..' can ever pass
    "../etc",
    "a/b",
    "a/../b",
    ".a",
    "a.",
    "-a",
    "a-",  # the old rule let this one through; Kubernetes does not
    "a.-b",
    "a-.b",
    "A",
    "Upper",
    "a_b",
    "a b",
    "a\n",
    "a%2fb",
    "é",
    "x" * 64,
    "a." + "b" * 62,
]


@pytest.mark.parametrize("sandbox_id", ACCEPTED_IDS)
def test_kubernetes_sandbox_ids_are_accepted(sandbox_id):
    assert is_sandbox_id(sandbox_id) and check_sandbox_id(sandbox_id) == sandbox_id


@pytest.mark.parametrize("sandbox_id", [*REFUSED_IDS, None, 5])
def test_ids_kubernetes_refuses_are_refused_and_say_what_an_id_is(sandbox_id):
    assert not is_sandbox_id(sandbox_id)
    with pytest.raises(InvalidRequest) as refused:
        check_sandbox_id(sandbox_id)
    assert str(refused.value) == (
        f"sandbox id {sandbox_id!r} is invalid: use up to 63 lowercase letters, digits, '-' or '.', "
        "starting and ending with a letter or digit"
    )


def test_the_pattern_and_bound_given_to_pydantic_agree_with_is_sandbox_id():
    """The service's body field takes `SANDBOX_ID` (pydantic's regex engine) and the bound apart."""
    field = TypeAdapter(Annotated[str, Field(max_length=SANDBOX_ID_MAX_LENGTH, pattern=f"^{SANDBOX_ID.pattern}$")])
    for sandbox_id in ACCEPTED_IDS:
        assert field.validate_python(sandbox_id) == sandbox_id
    for sandbox_id in REFUSED_IDS:
        with pytest.raises(ValidationError):
            field.validate_python(sandbox_id)


def test_a_dotted_id_of_the_longest_length_runs_end_to_end(client, base_image, docker_client):
    """A container may be named `orchard-<id>` with dots in it; the run folder is the id itself."""
    sandbox_id = "orchard.test-" + "d" * 45 + ".v2.x"
    assert len(sandbox_id) == SANDBOX_ID_MAX_LENGTH
    run_root = client._manager.backend._run_root
    with client.create(base_image, sandbox_id=sandbox_id) as box:
        assert box.id == sandbox_id
        assert box.exec("echo $((6*7))").stdout == "42\n"
        box.write_file("/workspace/f.txt", "dots\n")
        assert box.read_file("/workspace/f.txt") == b"dots\n"
        assert docker_client.api.inspect_container(f"orchard-{sandbox_id}")["State"]["Running"]
        assert (run_root / sandbox_id).is_dir() and (run_root / sandbox_id).parent == run_root
        assert client.attach(sandbox_id).exec("echo again").stdout == "again\n"
    assert not docker_client.api.containers(all=True, filters={"name": f"orchard-{sandbox_id}"})
    assert not (run_root / sandbox_id).exists()
