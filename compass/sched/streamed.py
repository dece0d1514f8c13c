"""Streamed edges in the finish-time rule: a successor fed as its predecessor steps.

On a streamed edge ``p -> t`` the successor does not wait for ``p``'s end: its input arrives
with ``p``'s first step, ``start(p) + exec(p) / steps(p)``, plus one step's share of ``p``'s
output on the wire (the transfer cost counts per chunk). It cannot end before ``p`` does,
though: its last step follows ``p``'s last chunk, so

    finish(t, w) >= finish(p) + transfer(out_p / steps(p), worker(p) -> w) + exec(t, w) / steps(t)

:func:`~compass.sched.cost.finish_row` takes the first (each edge's bytes from
``WorkflowCosts.edge_bytes``, the predecessor's first step as its ``ready``); :func:`bound_end`
adds the second. A workflow with no streamed edge costs nothing here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compass.sched.cost import FloatArray, WorkflowCosts

__all__ = ["bound_end", "first_step", "stream_ready"]


def first_step(costs: WorkflowCosts, t: int, j: int, finish: float) -> float:
    """When task ``t``, planned on worker ``j`` to finish at ``finish``, ends its first step."""
    run = float(costs.exec_rows[t][j])
    return finish - run + run * costs.step_frac[t]


def stream_ready(
    costs: WorkflowCosts, t: int, finish: Sequence[float], first: Sequence[float]
) -> list[float]:
    """When each input of task ``t`` is there to start on: its predecessor's ``finish``, or
    on a streamed edge, its ``first`` step."""
    preds = costs.preds[t]
    ready = [finish[p] for p in preds]
    for k in costs.streamed[t]:
        ready[k] = first[preds[k]]
    return ready


def bound_end(
    costs: WorkflowCosts,
    t: int,
    sources: Sequence[int],
    finish: Sequence[float],
    eft: FloatArray,
) -> None:
    """Raise ``eft`` (task ``t``'s finish row) to one of its steps after each streamed
    input's last chunk arrives (``finish``: every task's planned finish)."""
    preds, row = costs.preds[t], costs.transfer.row
    step = costs.exec_rows[t] * costs.step_frac[t]
    for k in costs.streamed[t]:
        last = row(sources[k], costs.edge_bytes[t][k], finish[preds[k]])
        np.maximum(eft, last + step, out=eft)
