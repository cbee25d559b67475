"""What a task's grader subclasses (`base.AbstractGrader`) and the judge it may be given (`llm_judge.LLMJudge`)."""
