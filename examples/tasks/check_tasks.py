#!/usr/bin/env python3
"""Check that every task in tasks.jsonl behaves as a SWE-bench task should.

    python examples/tasks/check_tasks.py [--tasks FILE] [--repos DIR] [--only ID ...] [--python EXE]

For every task this

* validates the record (keys, ids, repo, base commit, difficulty...);
* checks that ``patch`` touches no file under ``tests/`` and ``test_patch``
  only files under ``tests/``;
* materialises the repositories with make_repos.py (twice, to check that the
  commit hashes are reproducible), or with ``--repos DIR`` takes them from DIR
  (``DIR/owner__name``, as generate.py writes them), and makes a fresh clone
  at ``base_commit``;
* applies ``test_patch`` with ``git apply`` and runs FAIL_TO_PASS (each must
  fail) and PASS_TO_PASS (each must pass);
* applies ``patch`` and runs both lists again (all must pass), then the whole
  test suite (must pass).

Each project's unpatched suite must pass as well, and PASS_TO_PASS ids must
come from it.  One line is printed per task, then a summary; the exit status
is non-zero on any problem.  Stdlib only; pytest is run as
``<python> -m pytest`` (default: this interpreter).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_repos  # noqa: E402

REQUIRED_KEYS = {
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "version",
    "environment_setup_commit",
    "hints_text",
    "created_at",
    "workdir",
    "difficulty",
}
OPTIONAL_KEYS = {"bug_kind"}  # generate.py's
DIFFICULTIES = {"easy", "medium", "hard"}
MIN_PASS_TO_PASS = 3

# A pytest plugin, loaded with -p, that records the outcome of every test.
OUTCOME_PLUGIN = """
import json, os

_outcomes = {}


def pytest_runtest_logreport(report):
    previous = _outcomes.get(report.nodeid)
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif report.skipped:
        if previous != "failed":
            _outcomes[report.nodeid] = "skipped"
    elif report.when == "call" and previous is None:
        _outcomes[report.nodeid] = "passed"


def pytest_sessionfinish(session, exitstatus):
    with open(os.environ["ORCHARD_OUTCOMES_FILE"], "w") as handle:
        json.dump(_outcomes, handle)
"""

_DIFF_HEADER_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
_FILE_LINE_RE = re.compile(r"^(?:---|\+\+\+) (?:[ab]/)?(\S+)", re.M)


def diff_paths(diff: str) -> set[str]:
    """Paths a git diff touches (old and new names; /dev/null excluded)."""
    paths = set()
    for old, new in _DIFF_HEADER_RE.findall(diff):
        paths.update((old, new))
    for path in _FILE_LINE_RE.findall(diff):
        if path != "/dev/null":
            paths.add(path)
    return paths


class Runner:
    """Runs git and pytest in a working tree."""

    def __init__(self, python: str, plugin_dir: Path) -> None:
        self.python = python
        self.plugin_dir = plugin_dir

    def git(self, args: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["git", *make_repos.GIT_CONFIG, *args],
            cwd=cwd,
            env=make_repos.git_env(),
            input=stdin,
            capture_output=True,
            text=True,
        )

    def pytest(self, cwd: Path, node_ids: list[str]) -> tuple[dict[str, str], str]:
        """Run pytest; returns ({nodeid: outcome}, output tail)."""
        outcomes_file = self.plugin_dir / "outcomes.json"
        if outcomes_file.exists():
            outcomes_file.unlink()
        env = dict(os.environ)
        env["PYTHONPATH"] = str(self.plugin_dir)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["ORCHARD_OUTCOMES_FILE"] = str(outcomes_file)
        command = [self.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "_orchard_outcomes", *node_ids]
        try:
            result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
            output = result.stdout + result.stderr
        except subprocess.TimeoutExpired:
            return {}, "pytest timed out"
        outcomes = json.loads(outcomes_file.read_text()) if outcomes_file.exists() else {}
        return outcomes, "\n".join(output.strip().splitlines()[-15:])


def validate_record(task: dict, commits: dict[str, str]) -> list[str]:
    """Problems of the row; `commits` maps each known repository (owner/name) to its commit."""
    problems = []
    keys = set(task)
    if not REQUIRED_KEYS <= keys <= REQUIRED_KEYS | OPTIONAL_KEYS:
        missing, extra = REQUIRED_KEYS - keys, keys - REQUIRED_KEYS - OPTIONAL_KEYS
        problems.append(f"keys: missing {sorted(missing)}, unexpected {sorted(extra)}")
        if missing:
            return problems
    repo = task["repo"]
    org, _, name = repo.partition("/")
    if repo not in commits:
        problems.append(f"unknown repo {repo!r}")
        return problems
    if not re.fullmatch(rf"{re.escape(org)}__{re.escape(name)}(-\d+)?", task["instance_id"]):
        problems.append(f"instance_id {task['instance_id']!r} does not match repo")
    if task["base_commit"] != commits[repo]:
        problems.append(f"base_commit {task['base_commit']} != materialised {commits[repo]}")
    if task["environment_setup_commit"] != task["base_commit"]:
        problems.append("environment_setup_commit differs from base_commit")
    if task["workdir"] != f"/workspace/{name}":
        problems.append(f"workdir should be /workspace/{name}")
    if task["difficulty"] not in DIFFICULTIES:
        problems.append(f"difficulty {task['difficulty']!r} not in {sorted(DIFFICULTIES)}")
    if task["version"] != "1.0":
        problems.append("version should be '1.0'")
    if task["hints_text"] != "":
        problems.append("hints_text should be empty")
    try:
        datetime.strptime(task["created_at"], "%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError):
        problems.append(f"created_at {task['created_at']!r} is not YYYY-MM-DDTHH:MM:SSZ")
    if not isinstance(task["problem_statement"], str) or len(task["problem_statement"]) < 80:
        problems.append("problem_statement is missing or too short")
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        ids = task[key]
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            problems.append(f"{key} must be a list of strings")
        elif len(set(ids)) != len(ids):
            problems.append(f"{key} has duplicates")
    if not task["FAIL_TO_PASS"]:
        problems.append("FAIL_TO_PASS is empty")
    if len(task["PASS_TO_PASS"]) < MIN_PASS_TO_PASS:
        problems.append(f"PASS_TO_PASS has fewer than {MIN_PASS_TO_PASS} tests")
    if set(task["FAIL_TO_PASS"]) & set(task["PASS_TO_PASS"]):
        problems.append("a test is in both FAIL_TO_PASS and PASS_TO_PASS")
    patch_paths, test_paths = diff_paths(task["patch"]), diff_paths(task["test_patch"])
    if not patch_paths:
        problems.append("patch touches no file")
    if any(p == "tests" or p.startswith("tests/") for p in patch_paths):
        problems.append(f"patch touches tests: {sorted(patch_paths)}")
    if not test_paths:
        problems.append("test_patch touches no file")
    if any(not p.startswith("tests/") for p in test_paths):
        problems.append(f"test_patch touches files outside tests/: {sorted(test_paths)}")
    return problems


def expect(outcomes: dict[str, str], ids: list[str], wanted: str, label: str) -> list[str]:
    problems = []
    for node_id in ids:
        got = outcomes.get(node_id, "missing")
        if got != wanted:
            problems.append(f"{label}: {node_id} {got}, expected {wanted}")
    return problems


def check_task(task: dict, repo_path: Path, work: Path, runner: Runner, base_suite: dict[str, str]) -> list[str]:
    cloned = runner.git(["clone", "-q", "--no-checkout", str(repo_path), str(work)], repo_path.parent)
    if cloned.returncode:
        return [f"git clone failed: {cloned.stderr.strip()}"]
    checkout = runner.git(["checkout", "-q", "--detach", task["base_commit"]], work)
    if checkout.returncode:
        return [f"checkout of base_commit failed: {checkout.stderr.strip()}"]

    problems = []
    f2p, p2p = task["FAIL_TO_PASS"], task["PASS_TO_PASS"]
    not_in_suite = [node_id for node_id in p2p if node_id not in base_suite]
    if not_in_suite:
        problems.append(f"PASS_TO_PASS not in the existing suite: {not_in_suite}")

    for label in ("test_patch", "patch"):
        applied = runner.git(["apply", "--check", "-"], work, stdin=task[label])
        if applied.returncode == 0:
            applied = runner.git(["apply", "-"], work, stdin=task[label])
        if applied.returncode:
            problems.append(f"{label} does not apply: {applied.stderr.strip()}")
            return problems
        outcomes, tail = runner.pytest(work, f2p + p2p)
        if not outcomes:
            return [*problems, f"pytest produced no results after {label}:\n{tail}"]
        if label == "test_patch":
            problems += expect(outcomes, f2p, "failed", "before gold patch")
            problems += expect(outcomes, p2p, "passed", "before gold patch")
        else:
            problems += expect(outcomes, f2p + p2p, "passed", "after gold patch")

    outcomes, tail = runner.pytest(work, [])
    bad = sorted(node_id for node_id, outcome in outcomes.items() if outcome != "passed")
    if not outcomes or bad:
        problems.append(f"full suite after gold patch: not passing {bad or tail}")
    return problems


def given_repos(root: Path, tasks: list[dict], runner: Runner) -> dict[str, tuple[Path, str]]:
    """{owner/name: (path, HEAD)} of the tasks' repositories found as `root/owner__name`."""
    repos = {}
    for repo in sorted({task["repo"] for task in tasks if isinstance(task.get("repo"), str)}):
        path = root / repo.replace("/", "__")
        head = runner.git(["rev-parse", "HEAD"], path) if (path / ".git").is_dir() else None
        if head is not None and head.returncode == 0:
            repos[repo] = (path, head.stdout.strip())
    return repos


def load_tasks(path: Path) -> list[dict]:
    tasks = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                tasks.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{path}:{number}: invalid JSON: {exc}") from None
    return tasks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=Path, default=HERE / "tasks.jsonl")
    parser.add_argument(
        "--repos", type=Path, metavar="DIR", help="the tasks' repositories are in DIR/owner__name (generate.py's)"
    )
    parser.add_argument(
        "--only", action="append", default=[], metavar="ID", help="check only this instance_id (repeatable)"
    )
    parser.add_argument("--python", default=sys.executable, help="interpreter used to run pytest (default: this one)")
    args = parser.parse_args(argv)

    tasks = load_tasks(args.tasks)
    if args.only:
        tasks = [task for task in tasks if task.get("instance_id") in args.only]
        if not tasks:
            print("no matching tasks", file=sys.stderr)
            return 2
    failures = 0
    general = []
    started = time.monotonic()

    with tempfile.TemporaryDirectory(prefix="orchard-tasks-") as tmp_name:
        tmp = Path(tmp_name)
        plugin_dir = tmp / "plugin"
        plugin_dir.mkdir()
        (plugin_dir / "_orchard_outcomes.py").write_text(OUTCOME_PLUGIN)
        runner = Runner(args.python, plugin_dir)

        if args.repos is None:
            made = make_repos.make_all(tmp / "repos")
            again = make_repos.make_all(tmp / "repos-again")
            repos = {f"{make_repos.ORG}/{name}": made_repo for name, made_repo in made.items()}
            for name, (_path, commit) in again.items():
                if commit != made[name][1]:
                    general.append(f"{name}: commit not reproducible ({made[name][1]} vs {commit})")
        else:
            repos = given_repos(args.repos, tasks, runner)
        commits = {repo: commit for repo, (_path, commit) in repos.items()}

        base_suites: dict[str, dict[str, str]] = {}
        for repo, (path, commit) in repos.items():
            work = tmp / "base" / repo.replace("/", "__")
            runner.git(["clone", "-q", str(path), str(work)], tmp)
            outcomes, tail = runner.pytest(work, [])
            base_suites[repo] = outcomes
            bad = sorted(node_id for node_id, outcome in outcomes.items() if outcome != "passed")
            status = "ok" if outcomes and not bad else "FAILING"
            print(f"base  {repo} {commit}: {len(outcomes)} tests, {status}")
            if status != "ok":
                general.append(f"{repo}: base suite not passing: {bad or tail}")

        seen_ids = set()
        for task in tasks:
            task_started = time.monotonic()
            instance_id = task.get("instance_id", "<no instance_id>")
            problems = validate_record(task, commits)
            if instance_id in seen_ids:
                problems.append("duplicate instance_id")
            seen_ids.add(instance_id)
            if not any(p.startswith(("keys:", "unknown repo")) for p in problems):
                work = tmp / "work" / instance_id
                problems += check_task(task, repos[task["repo"]][0], work, runner, base_suites[task["repo"]])
            seconds = time.monotonic() - task_started
            if problems:
                failures += 1
                print(f"FAIL  {instance_id} ({task.get('difficulty')}) [{seconds:.1f}s]")
                for problem in problems:
                    print(f"      - {problem}")
            else:
                print(
                    f"PASS  {instance_id} ({task['difficulty']}) "
                    f"F2P {len(task['FAIL_TO_PASS'])} P2P {len(task['PASS_TO_PASS'])} "
                    f"[{seconds:.1f}s]"
                )

    for problem in general:
        print(f"ERROR {problem}")
    total = len(tasks)
    print(
        f"\n{total} tasks checked: {total - failures} passed, {failures} failed; "
        f"{len(general)} general problems; {time.monotonic() - started:.1f}s"
    )
    return 1 if failures or general else 0


if __name__ == "__main__":
    sys.exit(main())
