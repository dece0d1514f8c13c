"""An agent decided at run time (issue 38): a planner step picks a tool, the tool runs, back
to the planner, until it answers or its bound of :data:`MAX_STEPS` planner steps is reached.
Plain Python tasks (no models), so that :func:`reference` runs the same functions directly
and must give the same answer.

Start workers with it (``compass worker start --app examples.agent_app``) and submit ``agent``
jobs with ``question``, an integer:

- ``think`` (the loop's entry and its ``until``) reads the question, or the last tool's state
  as ``carry``, and either answers (``compass.stop``) once it has :func:`facts_needed` facts,
  or asks for a tool (``compass.choose(state, "lookup" | "compute")``). A question that needs
  more facts than the bound allows never answers by itself: at the last step the loop stops
  whatever it asked for, and the tool it asked for does not run.
- ``lookup`` / ``compute`` (the tools) add a fact each.
- ``answer`` gets the last planner step's state and answers ``{"question": q, "facts": [...],
  "steps": n}``.
"""

from __future__ import annotations

from typing import Any

import compass
from compass.workflow.choices import Decision

#: the planner's most steps (one more than the most tool calls)
MAX_STEPS = 4

app = compass.App("agent")
flow = app.workflow("agent", inputs=["question"])


def facts_needed(question: int) -> int:
    """How many tool calls ``question`` takes: 0-5, so that some exceed the bound of 3."""
    return question % 6


@flow.task(output_bytes=256)
def think(module: None, question: int | None = None, carry: Any = None) -> Decision:
    state = carry if carry is not None else {"question": question, "facts": [], "steps": 0}
    state = {**state, "steps": state["steps"] + 1}
    if len(state["facts"]) >= facts_needed(state["question"]):
        return compass.stop(state)
    tool = "lookup" if len(state["facts"]) % 2 == 0 else "compute"
    return compass.choose(state, tool)


@flow.task(after=["think"], output_bytes=256)
def lookup(module: None, think: dict[str, Any]) -> dict[str, Any]:
    return {**think, "facts": [*think["facts"], f"looked up {think['question']}"]}


@flow.task(after=["think"], output_bytes=256)
def compute(module: None, think: dict[str, Any]) -> dict[str, Any]:
    return {**think, "facts": [*think["facts"], f"computed {think['question'] * 2}"]}


@flow.task(after=["think"], output_bytes=256)
def answer(module: None, think: dict[str, Any]) -> dict[str, Any]:
    return {"question": think["question"], "facts": think["facts"], "steps": think["steps"]}


flow.branch("think", {"lookup": 1, "compute": 1})
flow.loop(["think", "lookup", "compute"], until="think", max_iter=MAX_STEPS)


def reference(question: int) -> dict[str, Any]:
    """The answer of an ``agent`` job, from the same task functions run here directly: at the
    last step the loop stops, whatever the planner asked for."""
    tools = {"lookup": lookup, "compute": compute}
    state: dict[str, Any] = {"question": question}
    for step in range(MAX_STEPS):
        decision = think(None, **state)
        if decision.stop or step == MAX_STEPS - 1:
            break
        assert decision.to is not None
        state = {"carry": tools[decision.to](None, decision.value)}
    return answer(None, decision.value)
