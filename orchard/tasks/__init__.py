"""SWE tasks: the schema (SWE-bench's), loading, offline task images, and grading."""

from orchard.tasks.loading import load_tasks
from orchard.tasks.schema import SWETask

__all__ = ["SWETask", "load_tasks"]
