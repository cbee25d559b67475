"""`orchard proxy`: forward Chat Completions, Responses and Anthropic Messages calls to an
OpenAI-compatible model server (the other two translated to chat calls), recording each one.

uvicorn, Starlette and SQLAlchemy are imported inside the command, so `orchard --help` stays fast.
"""

from __future__ import annotations

import contextlib
import os
from typing import Annotated

import typer

from orchard.clikit import command, group
from orchard.errors import ConfigError
from orchard.proxy import MAX_ANSWER_MIB, MAX_REQUEST_MIB

app = group("The recording proxy for model servers.")


@command(app, "proxy")
def proxy(
    upstream: Annotated[
        str, typer.Option(metavar="URL", help="The model server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1.")
    ],
    host: Annotated[
        str,
        typer.Option(
            metavar="ADDRESS",
            help="Address to listen on (whoever reaches it needs the proxy's key).",
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(metavar="PORT", min=1, max=65535, help="Port to listen on.")] = 8009,
    api_key_env: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="Environment variable holding the upstream's API key, sent as its Authorization (no client key is).",
        ),
    ] = None,
    key_env: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="Environment variable holding the key clients must send; none: a new one, printed at the start.",
        ),
    ] = None,
    run: Annotated[
        str,
        typer.Option(
            metavar="NAME",
            help="Record untagged calls in run proxy-NAME; a path /t/RUN/SANDBOX/v1 tags a call with another.",
        ),
    ] = "default",
    timeout: Annotated[
        float, typer.Option(metavar="SECONDS", min=1, help="How long the upstream may take over one answer.")
    ] = 600.0,
    max_request: Annotated[
        int, typer.Option(metavar="MIB", min=1, help="Refuse (413) a request whose body is larger.")
    ] = MAX_REQUEST_MIB,
    max_answer: Annotated[
        int, typer.Option(metavar="MIB", min=1, help="Drop an answer that is larger (an error for the client).")
    ] = MAX_ANSWER_MIB,
) -> None:
    """Forward OpenAI-compatible calls to a model server, recording every call and conversation.

    Each conversation becomes a trajectory of run proxy-NAME (kind proxy); it runs until Ctrl-C."""
    from orchard.proxy.recorder import run_summary
    from orchard.proxy.server import Proxy

    api_key, key = _secret("--api-key-env", api_key_env), _secret("--key-env", key_env)
    server = Proxy(
        upstream,
        key=key,
        host=host,
        port=port,
        api_key=api_key,
        run=run,
        timeout=timeout,
        max_request=max_request << 20,
        max_answer=max_answer << 20,
    )
    typer.echo(
        f"orchard proxy on {server.url} -> {server.upstream}, recording run {server.run_id} "
        f"(tag calls with {server.tagged('RUN', 'SANDBOX')})"
    )
    typer.echo(f"clients send the key {server.keys.key}" if key is None else f"clients send the key in ${key_env}")
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: uvicorn has stopped, every call is written
        server.serve()
    figures = run_summary(server.run_id, server.recorder.store)
    typer.echo(
        f"stopped; run {server.run_id} holds {figures['calls']} calls, {figures['trajectories']} trajectories", err=True
    )


def _secret(option: str, variable: str | None) -> str | None:
    """The value of environment variable `variable` (None when not named): secrets never go on the
    command line, which any user of the machine can read."""
    if variable is None:
        return None
    value = os.environ.get(variable)
    if not value:
        raise ConfigError(f"{option} {variable}: that environment variable is not set")
    return value
