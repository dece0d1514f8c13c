"""How a simulation is set up beyond its settings' numbers: what each planner sees (the mesh, or
a bounded view's candidates) and which worker a job enters at."""

from __future__ import annotations

from compass.config import SchedConfig
from compass.errors import ConfigError
from compass.sched.candidates import CandidateRule
from compass.sched.policy import LARGE_CLUSTER

__all__ = [
    "DEFAULT_CANDIDATES",
    "DEFAULT_HOLDERS",
    "INGRESS_MODES",
    "SPREAD_FROM",
    "VIEW_MODES",
    "auto_view",
    "ingress_spread",
    "view_rule",
]

#: what a planner sees (:func:`~compass.sim.engine.simulate`'s ``view``)
VIEW_MODES = ("mesh", "bounded")
#: ``compass sim --view bounded``'s workers sampled per job beyond the holders, and holders
#: kept per model the job needs, the real worker's (measured: docs/RESULTS.md, "Bounded view:
#: planning over candidates": every holder is nearly every worker once caches are warm, and
#: "What each planner knows, and when")
DEFAULT_CANDIDATES = SchedConfig().candidates
DEFAULT_HOLDERS = SchedConfig().holders


#: from this many workers on, ``ingress="auto"`` deals jobs over every worker, and
#: ``compass sim --view auto`` (its default) models the bounded view
SPREAD_FROM = LARGE_CLUSTER
INGRESS_MODES = ("auto", "client", "spread")


def auto_view(workers: int) -> str:
    """``compass sim``'s view when none is asked for: the real worker's bounded view from
    :data:`SPREAD_FROM` workers on (a mesh of hundreds of workers is not what compass runs),
    the mesh below, where every figure was measured with it."""
    return "bounded" if workers >= SPREAD_FROM else "mesh"


def view_rule(view: str, candidates: int, holders: int | None) -> CandidateRule | None:
    """The candidate rule of a bounded view (None: the mesh, every worker in view)."""
    if view not in VIEW_MODES:
        raise ConfigError(f"unknown view {view!r}; expected one of {', '.join(VIEW_MODES)}")
    explore = SchedConfig().explore  # the sampled drawn from the watched first, as the worker
    return CandidateRule(candidates, holders, explore) if view == "bounded" else None


def ingress_spread(mode: str, workers: int) -> bool:
    """Whether jobs are dealt over every worker (see
    :class:`~compass.sim.settings.SimSettings`'s ``ingress``)."""
    if mode not in INGRESS_MODES:
        raise ConfigError(
            f"unknown ingress mode {mode!r}; expected one of {', '.join(INGRESS_MODES)}"
        )
    return mode == "spread" or (mode == "auto" and workers >= SPREAD_FROM)
