"""What a worker serves, as fingerprints its peers compare (issue 39, item 3). Sans-IO.

A cluster serves one app, but a model's weights may change under it (a retrained checkpoint
rolled out worker by worker). Each worker advertises an :class:`AppStamp` in the join
handshake (both ways, joining and redialing):

- **the app**: one digest per workflow of what decides its answers' shape: its inputs, and per
  task its name, model, predecessors, function (by module and qualified name: the code itself
  is not hashed, so that workers on different Python builds still agree), job inputs,
  parameters, resources and batch size. Declared times are left out (they are estimates,
  learned over anyway). Workers whose workflows differ are refused: the join fails with one
  line naming the workflows that differ (:meth:`AppStamp.refusal`), and the newcomer exits.
- **the weights**: one digest per model of the bytes it serves (hashed from the weights staged in
  host memory, :meth:`ModelCache.prepare <compass.cache.models.ModelCache.prepare>`: what a task
  really runs, whether it came from a file or a loader; a model its builder initializes is hashed
  by its builder and tensor shapes, since a random initialization differs in every process; the
  size of an emulated model). Workers that differ here join, under another
  :attr:`AppStamp.version`: heartbeats carry it, and a planner keeps workers of another version
  out of its view (:class:`~compass.gossip.port.GossipPort`), so a job's tasks run only on workers
  of the version its ingress planned with, and both versions serve during a rolling upgrade.
  Every task message carries its sender's version too (:func:`version_id`; a worker takes a
  task only of its own version, so that is the version the job was planned with), and a
  worker refuses one of another version (:data:`~compass.core.messages.OTHER_VERSION`): the
  job's ingress plans it again without that worker. That covers a planner that has not heard
  a worker's version yet: one killed and restarted at once with other weights, before its
  first heartbeat reaches every planner.

Why the contents and not a file's size and time: copies of one checkpoint on two hosts have
different times, and an overwritten file can keep its size; hashing what is staged costs one
pass over the weights at start (SHA-256: on this project's 2-core VM 0.18-0.27 GB/s, under a third
of the time staging the same weights takes; ``compass bench versions``).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from compass.errors import ConfigError, ProtocolError
from compass.workflow.dag import Workflow

__all__ = ["VERSION_CHARS", "AppStamp", "version_id", "workflow_digest"]

#: hex characters of a weights version as shown and gossiped (48 bits: no two versions of one
#: cluster's weights collide by chance)
VERSION_CHARS = 12


@functools.lru_cache(maxsize=16)
def version_id(version: str) -> int:
    """``version`` as every task message carries it: its first 32 bits, an int (a few bytes
    on the wire, not a string per task; two versions of one cluster's weights collide once in
    four billion); 0 for "" (not known, which checks nothing)."""
    if not version:
        return 0
    return int(version[:8], 16) or 1


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def workflow_digest(workflow: Workflow) -> str:
    """A digest of what decides ``workflow``'s answers: see the module docstring."""
    tasks = []
    for task in workflow.tasks.values():
        fn = task.fn
        where = "" if fn is None else f"{fn.__module__}.{getattr(fn, '__qualname__', '')}"
        tasks.append(
            [
                task.name,
                task.model,
                sorted(task.after),
                where,
                None if task.inputs is None else sorted(task.inputs),
                sorted(task.params.items()),
                sorted(task.resources),
                task.batch,
            ]
        )
    return _sha256(json.dumps([workflow.name, sorted(workflow.inputs), tasks]))


def _names(body: Mapping[str, Any], key: str) -> dict[str, str]:
    value = body.get(key, {})
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ProtocolError(f"join: {key!r} must map names to digests")
    return dict(value)


@dataclass(frozen=True, slots=True)
class AppStamp:
    """The fingerprints of a worker's app: workflow -> digest, model -> weights digest. The
    empty stamp (a worker not started yet, or one that predates stamps) checks nothing."""

    workflows: Mapping[str, str] = field(default_factory=dict)
    weights: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, workflows: Mapping[str, Workflow], weights: Mapping[str, str]) -> AppStamp:
        """The stamp of an app with ``workflows`` whose models' weights hash to ``weights``."""
        digests = {name: workflow_digest(wf) for name, wf in sorted(workflows.items())}
        return cls(digests, dict(sorted(weights.items())))

    @property
    def version(self) -> str:
        """The version of the weights served: equal on two workers exactly when every model's
        weights are ("" for the empty stamp)."""
        if not self.workflows and not self.weights:
            return ""
        return _sha256(json.dumps(sorted(self.weights.items())))[:VERSION_CHARS]

    def to_wire(self) -> dict[str, Any]:
        """The handshake's fields (none for the empty stamp)."""
        if not self.workflows and not self.weights:
            return {}
        return {"app": dict(self.workflows), "weights": dict(self.weights)}

    @classmethod
    def from_wire(cls, body: object) -> AppStamp:
        """The stamp a join or its answer carried (the empty one where it carried none);
        :class:`ProtocolError` if malformed."""
        if not isinstance(body, Mapping) or "app" not in body:
            return cls()
        return cls(_names(body, "app"), _names(body, "weights"))

    def refusal(self, other: AppStamp, other_name: str) -> str | None:
        """Why this worker's app and ``other``'s (worker ``other_name``'s) cannot serve one
        cluster, in one line; None if they can (their weights may still differ)."""
        if not self.workflows or not other.workflows or self.workflows == other.workflows:
            return None
        mine, theirs = self.workflows, other.workflows
        differs = sorted(n for n in mine.keys() & theirs.keys() if mine[n] != theirs[n])
        parts = [f"workflow {', '.join(map(repr, differs))} differs"] if differs else []
        only = ((mine.keys() - theirs.keys(), "here"), (theirs.keys() - mine.keys(), "there"))
        for names, where in only:
            if names:
                parts.append(f"{', '.join(map(repr, sorted(names)))} only {where}")
        return (
            f"{other_name} serves another app ({'; '.join(parts)}): a cluster serves one app; "
            "start every worker with the same --app (weights may differ: versions are kept apart)"
        )

    def checked(self, body: object) -> object:
        """``body``, a join or its answer, once its stamp is checked: :class:`ConfigError` with
        :meth:`refusal`'s line (naming the worker by the ``name`` and ``address`` it gave) if
        its app is not this one's."""
        other = AppStamp.from_wire(body)
        if isinstance(body, Mapping):
            who = f"worker {body.get('name', '?')} at {body.get('address', '?')}"
            why = self.refusal(other, who)
            if why is not None:
                raise ConfigError(why)
        return body
