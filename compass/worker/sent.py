"""What a worker sent each peer for jobs not done here yet, sans-IO: a link that breaks may
have lost it, and nobody else knows.

Peer messages are one-way: nothing acknowledges them. A worker that declares a peer dead
closes its connection to it, and what that peer had sent on it and was still on the way is
discarded (:meth:`compass.wire.channel.Channel.aclose`); so is what a lost connection held. A
starved worker, the one a busy machine gets falsely suspected, may take a second to notice
the close, and every task output it pushes meanwhile is gone. When the receiver is the job's
ingress, or the ingress lost the same peer, the job is planned again; when it is a third
worker, the ingress, which lost neither, waits for the job forever.

So the sender keeps, per peer, the last message of each job it sent there (its attempt, the
task, the job's ingress; a failure report whole), until the job is done here (its ingress's
:class:`~compass.worker.messages.DoneMsg`, or this worker answered it). When the link to that
peer breaks, which the core learns as the peer being lost or joining again (a reconnection
after a close, a return after being declared dead, a restart), :meth:`SentLog.take` hands back
what may have been lost, and the core has each job's ingress plan it again (a report of a
failure is sent again). What had arrived counts too: an attempt planned again for nothing
costs a re-run, a lost one a job that never ends.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from compass.worker.messages import JOB_INPUTS, FailedMsg, PeerMessage, ResultMsg, TaskMsg

__all__ = ["Sent", "SentLog"]


class Sent(NamedTuple):
    """A message of ``job``'s ``attempt`` sent to a peer: about ``task``, for ``ingress``;
    ``failed``: the failure report itself (sent again as it was)."""

    job: str
    attempt: int
    task: str
    ingress: str
    failed: FailedMsg | None = None


class SentLog:
    """Per peer, the last message sent of each job not done here (at most ``limit`` jobs a
    peer, the oldest forgotten first)."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._sent: dict[str, OrderedDict[str, Sent]] = {}
        #: job -> the peers that have a message of it here
        self._peers: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return sum(map(len, self._sent.values()))

    def note(self, peer: str, msg: PeerMessage) -> None:
        """``msg`` went to ``peer``. Only the messages a job waits for count: a task's input,
        and a result or a failure report, which go to the job's ingress."""
        if isinstance(msg, TaskMsg):
            task = msg.task if msg.source == JOB_INPUTS else msg.source
            sent = Sent(msg.job, msg.attempt, task, msg.ingress)
        elif isinstance(msg, ResultMsg):
            sent = Sent(msg.job, msg.attempt, msg.task, peer)
        elif isinstance(msg, FailedMsg):
            sent = Sent(msg.job, msg.attempt, msg.task, peer, msg)
        else:
            return
        jobs = self._sent.setdefault(peer, OrderedDict())
        known = jobs.get(sent.job)
        # the newest attempt's; of one attempt, a report of a failure over a task's output
        if known is None or (known.attempt, known.failed is not None) <= (
            sent.attempt,
            sent.failed is not None,
        ):
            jobs[sent.job] = sent
        jobs.move_to_end(sent.job)
        self._peers.setdefault(sent.job, set()).add(peer)
        while len(jobs) > self.limit:
            old, _ = jobs.popitem(last=False)
            self._unlink(old, peer)

    def forget(self, job: str, below: int | None = None) -> None:
        """``job``'s attempts below ``below`` (every one: None) are done here."""
        for peer in list(self._peers.get(job, ())):
            jobs = self._sent[peer]
            if below is None or jobs[job].attempt < below:
                del jobs[job]
                if not jobs:
                    del self._sent[peer]
                self._unlink(job, peer)

    def take(self, peer: str) -> list[Sent]:
        """The link to ``peer`` broke: what was sent there, oldest first, forgotten here."""
        jobs = self._sent.pop(peer, OrderedDict())
        for job in jobs:
            self._unlink(job, peer)
        return list(jobs.values())

    def _unlink(self, job: str, peer: str) -> None:
        peers = self._peers.get(job)
        if peers is not None:
            peers.discard(peer)
            if not peers:
                del self._peers[job]
