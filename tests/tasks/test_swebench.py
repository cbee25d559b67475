"""SWE-bench rows exactly as published: their specs, test commands and how their results are read.

The rows are seven real SWE-bench Lite instances (`data/swe-bench-lite-7.jsonl`, byte for byte as
the dataset ships them: test lists as JSON strings). Nothing here needs Docker or a repository:
building the images and grading the gold patches on the real repositories is
`tests/tasks/test_swe_real.py`, which needs their archives.
"""

from __future__ import annotations

import hmac
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from orchard.recipes.swe import specs
from orchard.recipes.swe.grading import RUNNER, read_channel
from orchard.recipes.swe.grading import test_command as command
from orchard.recipes.swe.task import SWETask
from orchard.tasks.loading import load_tasks

ROWS = Path(__file__).parent / "data" / "swe-bench-lite-7.jsonl"


@pytest.fixture(scope="module")
def tasks() -> dict[str, SWETask]:
    return {task.instance_id: task for task in load_tasks(ROWS)}


def test_published_rows_load_as_they_ship(tasks):
    first = json.loads(ROWS.read_text().splitlines()[0])
    assert isinstance(first["FAIL_TO_PASS"], str)  # the dataset's JSON strings, untouched
    assert len(tasks) == 7
    django = tasks["django__django-16379"]
    assert django.fail_to_pass == [
        "test_has_key_race_handling (cache.tests.FileBasedCachePathLibTests)",
        "test_has_key_race_handling (cache.tests.FileBasedCacheTests)",
    ]
    assert len(django.pass_to_pass) == 362


def test_none_means_the_default():
    """A Hugging Face dataset fills a row's missing fields with None."""
    row = json.loads(ROWS.read_text().splitlines()[2])
    task = SWETask.model_validate({**row, "hints_text": None, "image": None, "install": None, "test_cmd": None})
    assert task.hints_text == "" and task.image is None
    assert task.environment() == SWETask.model_validate(row).environment()
    with pytest.raises(ValueError, match="problem_statement"):
        SWETask.model_validate({**row, "problem_statement": None})


def test_specs_come_from_swebench(tasks):
    env = tasks["django__django-16379"].environment()
    assert env.source == f"swebench {specs.SWEBENCH_VERSION} django/django 4.2"
    assert env.python == "3.9" and env.requirements == ("tests/requirements/py3.txt",)
    assert env.install == ("python -m pip install -e .",)
    assert tasks["django__django-17087"].environment().python == "3.11"
    sympy = tasks["sympy__sympy-24213"].environment()
    assert sympy.packages == ("mpmath", "flake8") and sympy.pip_packages == ("mpmath==1.3.0", "flake8-comprehensions")
    assert tasks["psf__requests-3362"].environment().install == ("python -m pip install .",)


def test_a_row_overrides_its_spec_field_by_field(tasks):
    task = tasks["pallets__flask-5063"]
    custom = task.model_copy(update={"python": "3.13", "install": ["pip install -e .[dev]"], "test_cmd": "make check"})
    env, spec = custom.environment(), task.environment()
    assert (env.python, env.install, env.test_cmd) == ("3.13", ("pip install -e .[dev]",), "make check")
    assert env.pip_packages == spec.pip_packages and env.requirements == spec.requirements
    with pytest.raises(ValueError, match="python '3' must be a Python 3 version"):
        SWETask.model_validate({**task.record(), "python": "3"})


def test_test_commands_are_swebench_s(tasks):
    """Directives from the test patch (Django labels for Django), never the raw test ids."""
    django = command(tasks["django__django-16379"])
    assert django == "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 cache.tests"
    assert command(tasks["django__django-17087"]).endswith("--parallel 1 migrations.test_writer")
    sympy = command(tasks["sympy__sympy-24213"])
    assert sympy == (
        "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose "
        "sympy/physics/units/tests/test_quantities.py"
    )
    flask = command(tasks["pallets__flask-5063"])
    assert flask == f"python3 -c {shlex.quote(RUNNER)} -rA tests/test_cli.py"
    assert "addopts" not in flask  # the repository's own options apply
    for task in tasks.values():
        assert not any(test in command(task) for test in task.tests)


def test_rows_without_a_spec_run_pytest_on_their_test_files():
    task = SWETask(
        instance_id="acme__w-1", repo="acme/w", base_commit="abc", problem_statement="p",
        FAIL_TO_PASS=["tests/test_a.py::test_x", "tests/test_a.py::TestY::test_z[1 2]"],
        PASS_TO_PASS=["tests/test_b.py::test_q"],
    )  # fmt: skip
    env = task.environment()
    assert env.source == "row" and env.python is None and env.install == () and env.parser is None
    assert command(task).endswith(" tests/test_a.py tests/test_b.py")


KEY = "k" * 64


def signed(records, key: str = KEY) -> str:
    """The channel's text for these records, numbered in order (a record's own `n` wins), each
    signed as the runner signs it; a string stands for itself."""
    lines = []
    for n, record in enumerate(records):
        payload = json.dumps({"n": n, **record}, sort_keys=True) if isinstance(record, dict) else record
        lines.append(payload + "\t" + hmac.new(key.encode(), payload.encode(), "sha256").hexdigest())
    return "".join(line + "\n" for line in lines)


def channel(*records: dict, exit_code: int = 1, known=("t.py::a", "t.py::b[x")) -> tuple:
    """`read_channel` on these records."""
    read = read_channel(signed(records), exit_code, list(known), KEY)
    return read.statuses, dict(read.counts), read.problems


def phases(test: str, call: str = "passed", *, setup: str = "passed", teardown: str = "passed", xfail=False):
    return [
        {"id": test, "when": "setup", "outcome": setup, "xfail": xfail and call == ""},
        *([{"id": test, "when": "call", "outcome": call, "xfail": xfail}] if call else []),
        {"id": test, "when": "teardown", "outcome": teardown, "xfail": False},
    ]


def test_a_record_signed_with_another_key_is_not_the_runner_s():
    text = signed([*phases("t.py::a"), {"end": 0}], key="f" * 64)
    read = read_channel(text, 0, ["t.py::a"], KEY)
    assert read.problems == ["record 0 of the results channel is not the runner's (unsigned or out of order)"]
    assert read.statuses == {}


def test_channel_statuses_are_pytest_s_and_ids_cut_at_a_space_match_as_swebench_s_do():
    """SWE-bench's ids are what its parser takes from `PASSED <id>`: cut at the first space."""
    statuses, counts, problems = channel(
        *phases("t.py::a", "skipped", xfail=True), *phases("t.py::b[x y]", "failed"), *phases("t.py::c"), {"end": 1}
    )
    assert statuses == {"t.py::a": "XFAIL", "t.py::b[x": "FAILED"} and problems == []
    assert counts == {"XFAIL": 1, "FAILED": 1, "PASSED": 1}
    statuses, _, _ = channel(
        *phases("t.py::a", "passed", teardown="failed"), *phases("t.py::b[x", "", setup="failed"), {"end": 1}
    )
    assert statuses == {"t.py::a": "ERROR", "t.py::b[x": "ERROR"}
    statuses, _, _ = channel(
        *phases("t.py::a", "passed", xfail=True), *phases("t.py::b[x", "", setup="skipped"), {"end": 0}, exit_code=0
    )
    assert statuses == {"t.py::a": "XPASS", "t.py::b[x": "SKIPPED"}


@pytest.mark.parametrize(
    ("records", "exit_code", "problem"),
    [
        ([*phases("t.py::a"), {"end": 0}], 0, None),
        ([*phases("t.py::a")], 0, "the test process ended before pytest finished (it exited 0)"),
        ([*phases("t.py::a"), {"end": 1}], 0, "the test process exited 0 after pytest finished with 1"),
        ([*phases("t.py::a"), {"end": 1}], 1, "pytest exited 1, for failures, but no test failed"),
        (
            [*phases("t.py::a"), {"end": 0}, {"id": "t.py::b[x", "when": "call", "outcome": "passed"}],
            0,
            "goes on after",
        ),
        ([*phases("t.py::a"), phases("t.py::a")[1], {"end": 0}], 0, "reports t.py::a (call) twice"),
        ([{"violation": "gc.get_objects"}, *phases("t.py::a"), {"end": 0}], 0, "refuses: gc.get_objects"),
        ([{"id": "t.py::a", "when": "call", "outcome": "passed", "n": 3}, {"end": 0}], 0, "record 0 of the"),
        (["not a record"], 0, "record 0 of the results channel is not the runner's"),
    ],
)
def test_a_channel_the_test_process_interfered_with_is_a_problem(records, exit_code, problem):
    problems = read_channel(signed(records), exit_code, ["t.py::a"], KEY).problems
    assert (problems == []) if problem is None else any(problem in p for p in problems), problems


def test_swebench_s_pass_rule():
    assert [specs.passed(s) for s in ("PASSED", "XFAIL", "SKIPPED", "XPASS", "FAILED")] == [1, 1, 0, 0, 0]
    assert [specs.failed(s) for s in ("FAILED", "ERROR", "MISSING", None, "SKIPPED", "XPASS")] == [1, 1, 1, 1, 0, 0]


def test_a_datasets_folder_of_the_rows_loads_the_same_tasks(tmp_path: Path, tasks):
    """What `datasets` saves for SWE-bench (lists as JSON strings, missing fields None)."""
    import datasets

    rows = [json.loads(line) for line in ROWS.read_text().splitlines()]
    rows = [{**row, "image": None} for row in rows]  # a column some rows lack: None in the others
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "lite"))
    loaded = {task.instance_id: task for task in load_tasks(tmp_path / "lite")}
    assert loaded == tasks


LOGS = Path(__file__).parent / "data" / "logs"


@pytest.mark.parametrize("instance_id", ["django__django-16379", "django__django-17087", "sympy__sympy-24213"])
def test_runner_logs_read_with_swebench_s_parser(tasks, instance_id):
    """Real output of Django's and sympy's runners on the gold patch (`data/logs/`): every FAIL_TO_PASS
    and PASS_TO_PASS id is found and passes, docstring-named Django tests and the Python-version
    dependent names included (3.9's `test_x (mod.Class)`, 3.11's `test_x (mod.Class.test_x)`)."""
    task = tasks[instance_id]
    env = task.environment()
    log = (LOGS / f"{instance_id}.log").read_text()
    parsed = specs.log_parser(env.parser)(log)  # type: ignore[arg-type, misc]
    assert env.parser == task.repo
    assert all(specs.passed(parsed.get(test)) for test in task.tests), [t for t in task.tests if t not in parsed]
    broken = log.replace(f"{task.fail_to_pass[0]} ... ok", f"{task.fail_to_pass[0]} ... FAIL")
    broken = broken.replace(f"{task.fail_to_pass[0]} ok", f"{task.fail_to_pass[0]} F")
    assert specs.failed(specs.log_parser(env.parser)(broken).get(task.fail_to_pass[0]))  # type: ignore[arg-type, misc]


def test_pytest_anywhere_in_a_test_command_runs_through_orchard_s_runner():
    task = SWETask(
        instance_id="acme__w-1", repo="acme/w", base_commit="abc", problem_statement="p",
        FAIL_TO_PASS=["tests/test_a.py::test_x"], test_cmd="sleep 1; X=1 python3.9 -m pytest -rA",
    )  # fmt: skip
    assert task.environment().parser is None
    assert command(task) == f"sleep 1; X=1 python3 -c {shlex.quote(RUNNER)} -rA tests/test_a.py"
    for other in ("tox -epy39 --", "make test", "pip install pytest && ./run"):
        assert not specs.is_pytest(other), other


def test_install_runs_again_only_where_the_tests_would_not_see_the_patch(tasks):
    from orchard.recipes.swe.grading import needs_reinstall

    assert needs_reinstall(tasks["psf__requests-3362"], ["requests/models.py"])  # `pip install .`: a copy
    assert not needs_reinstall(tasks["pallets__flask-5063"], ["src/flask/cli.py"])  # editable
    assert needs_reinstall(tasks["pallets__flask-5063"], ["src/flask/cli.py", "setup.py"])


def test_swebench_leaves_logging_alone():
    """Some swebench modules call logging.basicConfig(level=INFO) at import; read through Orchard,
    they do not make every later HTTP request print a line."""
    script = (
        "import logging; from orchard.recipes.swe import specs; specs.test_directives('django/django', ''); "
        "specs.log_parser('django/django'); specs.swebench_spec('django/django', '4.0'); "
        "print(logging.getLogger().handlers, logging.getLogger().level)"
    )
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert shown == "[] 30\n"
