"""A whole mini-swe-agent episode, create to delete, on its own `DockerEnvironment` and on Orchard's
sandboxes, side by side in one run (not a test).

    .venv/bin/python bench/mini_episode.py [--episodes 5] [--json out.json]

mini-swe-agent's `DefaultAgent` with its SWE-bench config and its `DeterministicModel` (no model
time: what is left is the environment's) works an example task (`orchard-examples__timecalc-1`'s
image, built offline if missing): 8 commands an agent typically runs (look around, read, search,
apply the fix, run the task's tests, diff), then the submission. Timed from before the
environment is made until after it is gone:

* **mini's DockerEnvironment**: `docker run -d` of the image (`--network none`, as ours is
  `blocked`), each command a `docker exec ... bash -lc`, then `docker stop` and `rm`, mini's own
  code unchanged;
* **Orchard, cold**: `Client.create` of the image, `OrchardEnvironment` (each command through the
  injected agent), `delete`;
* **Orchard, warm pool**: the same, the sandbox handed over from `Client.warm(image, 2)` (refilled
  between episodes, not timed);
* **4 at once**: 4 episodes in threads on each environment, the wall time of all four.

Targets (issue 32): an episode at least 4x faster on Orchard than on mini's DockerEnvironment
cold, and 8x from a warm pool.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

TASK = "orchard-examples__timecalc-1"
ROOT = Path(__file__).resolve().parents[1]


def commands(patch: str) -> list[str]:
    """What the episode runs: 8 commands, then the submission."""
    return [
        "ls -la && git status --short",
        "cat README.md | head -40",
        "grep -rn 'def ' --include=*.py timecalc | head -20",
        "sed -n '1,60p' timecalc/durations.py",
        "python3 -c 'import timecalc; print(timecalc.__file__)'",
        f"git apply <<'EOF'\n{patch}EOF",
        "python3 -m pytest -q -x tests 2>&1 | tail -5",
        "git diff --stat",
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff",
    ]


def episode(make_environment: Callable[[], tuple[object, Callable[[], None]]], task, config: dict) -> float:
    """Seconds from making the environment to its removal, mini's agent working `task` in it."""
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.test_models import DeterministicModel, make_output

    patch = task.patch if task.patch.endswith("\n") else task.patch + "\n"
    model = DeterministicModel(outputs=[make_output("Next.", [{"command": c}]) for c in commands(patch)])
    started = time.perf_counter()
    environment, remove = make_environment()
    try:
        agent = DefaultAgent(model, environment, **{**config["agent"], "cost_limit": 0})
        result = agent.run(task.problem_statement)
    finally:
        remove()
    elapsed = time.perf_counter() - started
    if result.get("exit_status") != "Submitted" or "timecalc" not in result.get("submission", ""):
        raise SystemExit(f"the episode did not submit the fix: {result.get('exit_status')}")
    return elapsed


def at_once(run: Callable[[], float], count: int) -> float:
    """Wall seconds for `count` episodes run together in threads."""
    errors: list[BaseException] = []

    def one() -> None:
        try:
            run()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(count)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=5, help="episodes timed per environment")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    import yaml
    from minisweagent.config import builtin_config_dir
    from minisweagent.environments.docker import DockerEnvironment

    from orchard.agents.minisweagent import OrchardEnvironment
    from orchard.env import Client
    from orchard.recipes.swe.environments import RepoMirror, task_image
    from orchard.store.runs import record_bench
    from orchard.tasks import load_tasks

    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    repos = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "orchard" / "example-repos"
    if not repos.is_dir():
        raise SystemExit(f"no example repositories at {repos}: run `python examples/tasks/make_repos.py {repos}`")
    task = load_tasks(ROOT / "examples" / "tasks" / "tasks.jsonl", ids=[TASK])[0]
    image = task_image(task, RepoMirror(repos))
    config = yaml.safe_load((builtin_config_dir / "benchmarks" / "swebench.yaml").read_text())
    env = config["environment"]["env"]

    def docker() -> tuple[object, Callable[[], None]]:
        made = DockerEnvironment(image=image, cwd=task.workdir, env=env, run_args=["--rm", "--network", "none"])
        return made, made.cleanup

    with Client() as client:

        def orchard() -> tuple[object, Callable[[], None]]:
            box = client.create(image)
            return OrchardEnvironment(sandbox=box, cwd=task.workdir, env=env), box.delete

        pools = client._manager.pools
        figures: dict[str, list[float]] = {"mini's DockerEnvironment": [], "Orchard, cold": []}
        for _ in range(args.episodes):
            figures["mini's DockerEnvironment"].append(episode(docker, task, config))
            figures["Orchard, cold"].append(episode(orchard, task, config))
        client.warm(image, 2)
        figures["Orchard, warm pool"] = []
        for _ in range(args.episodes):
            waited = time.perf_counter()
            while [ready for _spec, _size, ready in pools.sizes()] != [2] and time.perf_counter() - waited < 60:
                time.sleep(0.02)  # refilled: not timed
            figures["Orchard, warm pool"].append(episode(orchard, task, config))
        client.warm(image, 0, drain=True)
        together = {
            "4 at once, mini's DockerEnvironment": at_once(lambda: episode(docker, task, config), 4),
            "4 at once, Orchard, cold": at_once(lambda: episode(orchard, task, config), 4),
        }

    p50 = {name: statistics.median(values) * 1000 for name, values in figures.items()}
    print(f"\n  {'episode, create to delete':<40} {'p50 ms':>9} {'min ms':>9} {'max ms':>9}   n")
    for name, values in figures.items():
        print(f"  {name:<40} {p50[name]:>9.1f} {min(values) * 1000:>9.1f} {max(values) * 1000:>9.1f}  {len(values)}")
    for name, seconds in together.items():
        print(f"  {name + ' (wall)':<40} {seconds * 1000:>9.1f}")
    docker_p50 = p50["mini's DockerEnvironment"]
    failed = []
    for label, name, goal in (("cold", "Orchard, cold", 4.0), ("warm pool", "Orchard, warm pool", 8.0)):
        ratio = docker_p50 / p50[name]
        ok = ratio >= goal
        print(f"  target Orchard {label} at least {goal:g}x faster: {ratio:.2f}x  {'ok' if ok else 'MISSED'}")
        if not ok:
            failed.append(label)
    ratio = together["4 at once, mini's DockerEnvironment"] / together["4 at once, Orchard, cold"]
    print(f"  4 at once, Orchard cold faster by {ratio:.2f}x (no target)")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    result = {"p50_ms": p50, "together_s": together, "missed": failed}
    if args.json:
        args.json.write_text(json.dumps({"figures": figures, **result}, indent=2))
    print(f"recorded as run {record_bench('mini-episode', vars(args) | {'json': str(args.json)}, result)}")


if __name__ == "__main__":
    main()
