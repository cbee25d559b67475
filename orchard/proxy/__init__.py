"""`orchard proxy`: a proxy in front of an OpenAI-compatible model server that records every
model call it forwards, and speaks three APIs to its clients: OpenAI's Chat Completions (and
Completions), Anthropic's Messages API, and OpenAI's Responses API.

Put it in front of any OpenAI-compatible model server (vLLM, SGLang, llama.cpp, a hosted API) and
point a harness whose agent loop Orchard does not own (OpenClaw, ZeroClaw, mini-swe-agent, Claude
Code, Codex CLI) at it:

    orchard proxy --upstream http://127.0.0.1:8000/v1 --run openclaw-day1   # prints the key clients send
    # the harness: OPENAI_BASE_URL=http://127.0.0.1:8009/t/openclaw-day1/sandbox-7/v1 OPENAI_API_KEY=that key
    # Claude Code: ANTHROPIC_BASE_URL=http://127.0.0.1:8009/t/RUN/SANDBOX ANTHROPIC_API_KEY=that key

Every `POST /v1/chat/completions` and `POST /v1/completions` goes to the upstream with its body
unchanged, and its answer comes back unchanged (a stream relayed chunk by chunk as it arrives);
`GET /v1/models` is forwarded too, not recorded. `POST /v1/messages` (Anthropic's Messages API,
what Claude Code speaks) and `POST /v1/responses` (OpenAI's Responses API, what Codex CLI speaks)
are translated into the chat call they mean, which goes upstream and is recorded as a native chat
call would be, and its answer (a stream event by event, as it arrives) translated back into the
client's API (`orchard.proxy.translate`); `POST /v1/messages/count_tokens` is answered with an
estimate, the upstream not asked. A path may carry tags, `/t/RUN/v1/...` or
`/t/RUN/SANDBOX/v1/...`, for clients that let you set only a base URL.

Each call is a `ProxyCallRecord` (request, answer with streams assembled, token ids and log-probs
when the upstream sends them, failed calls too), in run `proxy-RUN` (kind `proxy`). The chat calls
of one conversation form one `TrajectoryRecord` (harness `proxy`), one `StepRecord` per call: a
request whose messages start with an earlier call's messages and answer continues that call's
trajectory (`orchard.proxy.recorder`). Recording happens in a process of its own, one
transaction per call, so the proxy adds little latency (bench/proxy.py) and an interrupted proxy
leaves whole records only.

Bodies are bounded (32 MiB a request, 16 MiB an answer by default: `--max-request`, `--max-answer`): a larger request is
refused, a larger answer dropped and its call recorded failed, so memory stays bounded whatever a
sandbox sends or an upstream answers; a stream that breaks, carries an error event or ends without
its `[DONE]` is an error for the client (in its API's shape) and a failed call in the record.

Every call needs the proxy's key (`--key-env`, else a new one printed at the start) or a key
granted for one attempt, which binds its calls to that attempt's run and sandbox; no key a
client sends is forwarded or stored.

Not covered: `/v1/completions` calls are recorded as calls, not grouped
into trajectories (a raw prompt has no messages); of an answer with several choices, the first
one goes into the trajectory; the Responses API's stored responses (`previous_response_id` is
refused: clients send the whole conversation) and its hosted tools (web search and the like).

    ├── recorder.py   calls in, records out: streams assembled, conversations grouped (no HTTP)
    ├── translate.py  Anthropic's Messages and OpenAI's Responses API to and from chat calls (no HTTP)
    ├── upstream.py   the HTTP/1.1 client to the upstream (kept-alive connections)
    ├── server.py     the ASGI app forwarding to the upstream, and `Proxy`, the running server
    └── cli.py        the `orchard proxy` command
"""

MAX_REQUEST_MIB = 32
"""The default bound on a request's body, in MiB (a long context, images included, is a few MB)."""
MAX_ANSWER_MIB = 16
"""The default bound on an answer's body, in MiB (a 32k-token stream with log-probs is a few MB)."""
