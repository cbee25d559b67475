"""The data a grader is given: the task's definition, the trace's messages and tool calls, scores."""
