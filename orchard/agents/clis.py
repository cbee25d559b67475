"""The agent CLIs labs use, each run unmodified in the sandbox from the tools bundle
(`orchard.env.tools`), non-interactively, on the task's prompt, in its working folder, with every
tool use approved and every outbound call but the model's turned off (the sandbox's network is
blocked anyway). How the episode runs around them: `orchard.agents.external`.

| harness  | program        | speaks to the proxy            | ends when                         |
|----------|----------------|--------------------------------|-----------------------------------|
| codex    | Codex CLI      | OpenAI Responses API           | a reply without a tool call       |
| claude   | Claude Code    | Anthropic Messages API         | a reply without a tool call       |
| opencode | opencode       | OpenAI Chat Completions        | a reply without a tool call       |
| pi       | pi             | OpenAI Chat Completions        | a reply without a tool call       |
| hermes   | Hermes Agent   | OpenAI Chat Completions        | a reply without a tool call       |
| mini     | mini-swe-agent | OpenAI Chat Completions        | `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` |

A scripted model plays each with the tools the CLI offers (`orchard.agents.players`).
"""

from __future__ import annotations

import json
import math
import shlex

from orchard.agents.base import Message, Reply, Step
from orchard.agents.external import HOME, CliRun, ExternalHarness
from orchard.agents.players import play


class _ToolCli(ExternalHarness):
    """A CLI that offers its tools by function calling."""

    def encode(self, step: Step, index: int) -> Reply:
        return play(step, self.offered, index)


class CodexHarness(_ToolCli):
    name = "codex"

    def files(self, run: CliRun) -> dict[str, str]:
        config = f"""model = "{run.model}"
model_provider = "orchard"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.orchard]
name = "Orchard"
base_url = "{run.base_url}"
env_key = "ORCHARD_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[features]
plugins = false
"""
        return {f"{HOME}/codex/config.toml": config}

    def environment(self, run: CliRun) -> dict[str, str]:
        return {"CODEX_HOME": f"{HOME}/codex", "ORCHARD_API_KEY": run.key}

    def command(self, run: CliRun) -> str:
        return f"{run.bin}/codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox - < {shlex.quote(run.prompt_file)}"


class ClaudeHarness(_ToolCli):
    name = "claude"

    def environment(self, run: CliRun) -> dict[str, str]:
        return {
            "ANTHROPIC_BASE_URL": run.base_url.removesuffix("/v1"),
            "ANTHROPIC_API_KEY": run.key,
            "ANTHROPIC_MODEL": run.model,
            "ANTHROPIC_SMALL_FAST_MODEL": run.model,
            **{f"ANTHROPIC_DEFAULT_{size}_MODEL": run.model for size in ("HAIKU", "SONNET", "OPUS")},
            "IS_SANDBOX": "1",  # --dangerously-skip-permissions as root, in a sandbox
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
        }

    def command(self, run: CliRun) -> str:
        turns = run.limits.episode_steps + 1  # its own limit past ours: Orchard tells it to stop first
        return (
            f"{run.bin}/claude -p --dangerously-skip-permissions --output-format json --max-turns {turns} "
            f"< {shlex.quote(run.prompt_file)}"
        )


class OpencodeHarness(_ToolCli):
    name = "opencode"

    def files(self, run: CliRun) -> dict[str, str]:
        config = {
            "model": f"orchard/{run.model}",
            "small_model": f"orchard/{run.model}",
            "autoupdate": False,
            "share": "disabled",
            "permission": "allow",
            "agent": {"build": {"steps": run.limits.episode_steps + 1}},
            "provider": {
                "orchard": {
                    "npm": "@ai-sdk/openai-compatible",  # built into the binary
                    "name": "Orchard",
                    "options": {"baseURL": run.base_url, "apiKey": "{env:ORCHARD_API_KEY}"},
                    "models": {run.model: {"name": run.model, "tool_call": True}},
                }
            },
        }
        folder = f"{HOME}/home/.config/opencode"
        plugin = {"dependencies": {"@opencode-ai/plugin": "*"}}  # present: no background `npm install` of it
        lock = {"lockfileVersion": 3, "packages": {"": plugin}}
        return {
            f"{folder}/opencode.json": json.dumps(config, indent=2),
            f"{folder}/package.json": json.dumps(plugin),
            f"{folder}/package-lock.json": json.dumps(lock),
            f"{folder}/node_modules/.keep": "",
        }

    def environment(self, run: CliRun) -> dict[str, str]:
        return {
            "ORCHARD_API_KEY": run.key,
            "XDG_CONFIG_HOME": f"{HOME}/home/.config",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
        }

    def command(self, run: CliRun) -> str:
        return f"{run.bin}/opencode run --title task < {shlex.quote(run.prompt_file)}"  # the prompt on stdin, which must end


class PiHarness(_ToolCli):
    name = "pi"

    def files(self, run: CliRun) -> dict[str, str]:
        models = {
            "providers": {
                "orchard": {
                    "baseUrl": run.base_url,
                    "api": "openai-completions",
                    "apiKey": "ORCHARD_API_KEY",  # the name of the variable holding it
                    "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
                    "models": [{"id": run.model, "contextWindow": 128000, "maxTokens": 4096}],
                }
            }
        }
        settings = {"defaultProvider": "orchard", "defaultModel": run.model, "enableInstallTelemetry": False}
        return {
            f"{HOME}/pi/models.json": json.dumps(models, indent=2),
            f"{HOME}/pi/settings.json": json.dumps(settings | {"quietStartup": True}),
        }

    def environment(self, run: CliRun) -> dict[str, str]:
        return {"ORCHARD_API_KEY": run.key, "PI_CODING_AGENT_DIR": f"{HOME}/pi", "PI_OFFLINE": "1"}

    def command(self, run: CliRun) -> str:
        options = "--no-session --offline --no-extensions --no-skills --no-prompt-templates"
        prompt = shlex.quote(run.prompt_file)
        return f'{run.bin}/pi -p {options} --provider orchard --model {shlex.quote(run.model)} "$(cat {prompt})" < /dev/null'


class HermesHarness(_ToolCli):
    name = "hermes"

    def files(self, run: CliRun) -> dict[str, str]:
        config = f"""model:
  provider: custom
  base_url: {run.base_url}
  default: {run.model}
  api_key: {run.key}
  context_length: 128000
  max_tokens: 4096
agent:
  max_turns: {run.limits.episode_steps + 1}
security:
  allow_lazy_installs: false
  tirith_enabled: false
"""
        # a far-future last check: `hermes chat` asks PyPI for a newer release otherwise
        return {f"{HOME}/hermes/config.yaml": config, f"{HOME}/hermes/.update_check": "4102444800"}

    def environment(self, run: CliRun) -> dict[str, str]:
        return {"HERMES_HOME": f"{HOME}/hermes", "TIRITH_ENABLED": "false"}

    def command(self, run: CliRun) -> str:
        prompt = shlex.quote(run.prompt_file)
        turns = run.limits.episode_steps + 1
        return f'{run.bin}/hermes chat -Q --yolo --max-turns {turns} -t terminal,file -q "$(cat {prompt})" < /dev/null'


SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class MiniHarness(_ToolCli):
    """mini-swe-agent's `mini` with its SWE-bench configuration, commands run where it runs (its
    `local` environment): one `bash` tool; it ends on a command whose output starts with
    `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`."""

    name = "mini"

    def environment(self, run: CliRun) -> dict[str, str]:
        return {
            "OPENAI_API_KEY": run.key,
            "MSWEA_CONFIGURED": "true",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_GLOBAL_CONFIG_DIR": f"{HOME}/mini",
            "MSWEA_COST_TRACKING": "ignore_errors",  # an unknown model has no price
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm fetches its price list at import otherwise
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
        }

    def command(self, run: CliRun) -> str:
        settings = [
            "swebench.yaml",
            "environment.environment_class=local",
            f"environment.cwd={run.workdir}",
            f"model.model_kwargs.api_base={run.base_url}",
            f"agent.step_limit={run.limits.episode_steps + 1}",  # past ours: Orchard tells it to stop first
        ]
        if math.isfinite(run.limits.max_seconds):
            settings.append(f"agent.wall_time_limit_seconds={int(run.limits.max_seconds)}")
        config = " ".join(f"-c {shlex.quote(setting)}" for setting in settings)
        prompt = shlex.quote(run.prompt_file)
        model = shlex.quote(f"openai/{run.model}")
        return f'{run.bin}/mini -m {model} {config} -y --exit-immediately -o {HOME}/mini/trajectory.json -t "$(cat {prompt})" < /dev/null'

    def encode(self, step: Step, index: int) -> Reply:
        if step.kind in ("submit", "say"):
            step = Step("bash", command=SUBMIT, thought=step.thought or "Done: submitting.")
        return play(step, self.offered, index)

    def ended(self, reply: Message) -> bool:
        calls = reply.get("tool_calls") or []
        return any(SUBMIT in str(call.get("function", {}).get("arguments", "")) for call in calls)
