"""Evaluation: tasks of any kind attempted, graded, stored and reported.

`orchard.eval.attempt` is the one attempt flow (a model works a task in a fresh sandbox, the
task's kind grades the submission); a `Solver` (`orchard.eval.runner`) turns an attempt into a
submission, an agent's (`agent_solver`) or a predictions file's; `evaluate` runs every task x
harness x sample into a resumable run with per-kind metrics; `orchard.eval.jobs` is `orchard eval`
and `orchard collect` as library calls on their configs (`orchard.eval.config`); reranking with a
value model is `orchard.eval.rerank`.
"""
