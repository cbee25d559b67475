"""Orchard-Claw: personal-assistant agents on mock services in their sandbox.

`world` (the services' state and rules, standard library only) and `server` (them as a real HTTP
server) run inside a task's sandbox as well as on the host; `checks` are the rule-based grading;
`task` is the `claw` task kind and `harnesses` its two harnesses (`functions`, `assistant`).
"""
