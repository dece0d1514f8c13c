"""A nested loop decided at run time (issue 38): rounds of drafting, each round a loop of
drafts until a check passes, until a judge is satisfied. Plain Python tasks (no models), so
that :func:`reference` runs the same functions directly and must give the same answer.

Start workers with it (``compass worker start --app examples.nested_app``) and submit
``revise`` jobs with ``target``, an integer:

- ``plan`` opens a round (the outer loop's entry: the job's ``target`` at first, the last
  round's outcome as ``carry`` after that).
- ``draft`` / ``check`` (the inner loop): ``check`` stops it once the round has had
  :func:`drafts_needed` drafts; it reads the round's plan too (an input from outside the
  inner loop).
- ``judge`` ends a round and stops the outer loop after :func:`rounds_needed` rounds.
- ``finish`` answers ``{"target": t, "log": ["round:drafts", ...]}``.
"""

from __future__ import annotations

from typing import Any

import compass
from compass.workflow.choices import Decision

#: the loops' bounds
MAX_ROUNDS, MAX_DRAFTS = 3, 4


def rounds_needed(target: int) -> int:
    return target % MAX_ROUNDS + 1


def drafts_needed(target: int, round_: int) -> int:
    return (target + 2 * round_) % MAX_DRAFTS + 1


app = compass.App("nested")
flow = app.workflow("revise", inputs=["target"])


@flow.task(output_bytes=256)
def plan(module: None, target: int | None = None, carry: Any = None) -> dict[str, Any]:
    if carry is None:
        assert target is not None
        return {"target": target, "round": 0, "drafts": 0, "log": []}
    return {**carry, "round": carry["round"] + 1, "drafts": 0}


@flow.task(after=["plan"], output_bytes=256)
def draft(module: None, plan: Any = None, carry: Any = None) -> dict[str, Any]:
    state = plan if carry is None else carry
    return {**state, "drafts": state["drafts"] + 1}


@flow.task(after=["draft", "plan"], output_bytes=256)
def check(module: None, draft: dict[str, Any], plan: dict[str, Any]) -> Any:
    assert draft["round"] == plan["round"]
    if draft["drafts"] >= drafts_needed(draft["target"], draft["round"]):
        return compass.stop(
            {**draft, "log": [*draft["log"], f"{draft['round']}:{draft['drafts']}"]}
        )
    return draft


@flow.task(after=["check"], output_bytes=256)
def judge(module: None, check: dict[str, Any]) -> Any:
    done = check["round"] + 1 >= rounds_needed(check["target"])
    return compass.stop(check) if done else check


@flow.task(after=["judge"], output_bytes=256)
def finish(module: None, judge: dict[str, Any]) -> dict[str, Any]:
    return {"target": judge["target"], "log": judge["log"]}


flow.loop(["plan", "draft", "check", "judge"], until="judge", max_iter=MAX_ROUNDS)
flow.loop(["draft", "check"], until="check", max_iter=MAX_DRAFTS)


def _value(out: Any) -> Any:
    return out.value if isinstance(out, Decision) else out


def reference(target: int) -> dict[str, Any]:
    """The answer of a ``revise`` job, from the same task functions run here directly."""
    round_state = plan(None, target=target)
    for _ in range(MAX_ROUNDS):
        state = draft(None, plan=round_state)
        for _ in range(MAX_DRAFTS):
            out = check(None, state, round_state)
            if isinstance(out, Decision) and out.stop:
                break
            state = draft(None, carry=out)
        judged = judge(None, _value(out))
        if isinstance(judged, Decision) and judged.stop:
            break
        round_state = plan(None, carry=judged)
    return finish(None, _value(judged))
