"""What one worker remembers of each worker it has seen (:class:`Member`), sans-IO: the record
the member table (:mod:`~compass.membership.table`) keeps and its failure detector
(:mod:`~compass.membership.detector`) reads. It imports neither of them, so they import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Member"]


@dataclass(slots=True)
class Member:
    """What this worker remembers of a worker it has seen, live or lost. Only the table
    changes it; read it, do not write it."""

    name: str
    address: str
    #: its incarnation as this worker last heard it
    incarnation: int = 0
    #: its process's random id: another one under the same live name is a duplicate name
    instance: str = ""
    #: when it was last removed (this worker's clock); None while it is a peer
    lost_at: float | None = None
    #: the incarnation it was last declared dead at; it must come back with a higher one
    dead_incarnation: int | None = None
    #: failed reconnections since it was lost
    failures: int = 0
    #: when to try it next (lost members only)
    retry_at: float = math.inf
    #: it said it left (a planned stop): retried often, forgotten sooner
    left: bool = False
    #: when it last became a peer, and when it was last heard from (this worker's clock)
    joined_at: float = 0.0
    last_seen: float = 0.0

    @property
    def declared_dead(self) -> bool:
        """This worker declared it dead and has not heard of a newer incarnation since."""
        return self.dead_incarnation is not None and self.incarnation <= self.dead_incarnation
