"""Orchard exec agent: a small HTTP/1.1 server that runs commands and moves files in a sandbox.

The agent is injected into arbitrary, unmodified images and started by a bundled CPython with
``-s -S``, so this package is self-contained and uses the standard library only (its modules
import each other relatively, and nothing else of Orchard); every module is imported at the top
(a bundling tool, `orchard.env.bundle`, computes the module closure by importing the package).
This file imports nothing: the host imports `protocol` from here cheaply.

Usage (the bundle copies this folder to ``/.orchard/agent`` and runs ``__main__.py`` by its path)::

    ORCHARD_AGENT_TOKEN=... python agent/__main__.py --unix /run/agent.sock [--workdir /workspace]
    ORCHARD_AGENT_TOKEN=... python agent/__main__.py --tcp 0.0.0.0:7000 [--workdir /workspace]
    ORCHARD_AGENT_TOKEN_SHA256=<hex sha256 of the token> python agent/__main__.py --tcp 0.0.0.0:7000

The modules, each on the ones before it:

* `protocol`: the wire protocol (documented there): routes, field sets, content types, upgrade
  names, the token's variables and the limits, `ApiError` and the parsing of request fields. The
  host imports these names from here rather than spelling them again.
* `processes`: running one command (`run_process`: capture, time-out, killing its whole tree),
  the children's environment, out-of-memory notes, the ``/exec`` answer, ``git apply``.
* `files`: folder listings, tar archives out and in, and the file errors answered as such.
* `upstream`: ``POST /http``, one bounded HTTP/1.1 call to a port of the sandbox's loopback.
* `tunnels`: ports listened on for the host (``/listen``, ``/accept``) and the byte splice.
* `shells`: the shell commands run under, long commands, persistent shell sessions.
* `config`: `AgentConfig`, what every request handler shares (token digest, workdir, shell,
  sessions, listeners).
* `terminals`: ``POST /pty``, a process on a pseudo-terminal bridged to JSON frames.
* `handler`: `AgentHandler`, the HTTP/1.1 server side and one method a route.
* `server`: the Unix and TCP servers, `serve` and the command line (`main`); the security notes.
* `__main__`: the entry the bundle runs.
"""
