"""A task runner for one task with no worker around it, its outcomes in a queue: what the
executor's unit tests share."""

from __future__ import annotations

import asyncio

from compass.config import WorkerConfig
from compass.core.outcome import TaskOutcome
from compass.worker.executor import TaskRunner
from compass.workflow.dag import Task


def runner_of(task: Task, outcomes: asyncio.Queue[TaskOutcome]) -> TaskRunner:
    """A real-mode runner of ``task`` (every lookup finds it, no model module), reporting to
    ``outcomes``."""
    return TaskRunner(
        lookup=lambda wf, name: task,
        module_of=lambda model: None,
        config=WorkerConfig(name="w"),
        on_outcome=outcomes.put_nowait,
        on_returned=lambda entry: None,
    )
