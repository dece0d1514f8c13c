"""What a broken link may have lost, sans-IO: per peer, what a worker sent there of jobs not
done here; per ingress it lost, the jobs whose tasks it dropped. Nobody else knows of either.

Peer messages are one-way: nothing acknowledges them. A worker that declares a peer dead
closes its connection to it, and what that peer had sent on it and was still on the way is
discarded (:meth:`compass.wire.channel.Channel.aclose`); so is what a lost connection held. A
starved worker, the one a busy machine gets falsely suspected, may take a second to notice
the close, and every task output it pushes meanwhile is gone. When the receiver is the job's
ingress, or the ingress lost the same peer, the job is planned again; when it is a third
worker, the ingress, which lost neither, waits for the job forever.

So the sender keeps, per peer, the last message of each job it sent there (its attempt, the
task, the job's ingress; a failure report whole), until the job is done here (its ingress's
:class:`~compass.core.messages.DoneMsg`, or this worker answered it). When the link to that
peer breaks, which the core learns as the peer being lost or joining again (a reconnection
after a close, a return after being declared dead, a restart), :meth:`Links.lost` and
:meth:`Links.joined` hand back the reports to send: each job's ingress hears that a link of
the job broke (:data:`~compass.core.messages.LINK_LOST`) and plans it again; a report of a
failure goes again as it was. What had arrived counts too: an attempt planned again for nothing
costs a re-run, a lost one a job that never ends. A report to an ingress that is itself the
lost peer waits here until it comes back (it was alive: a false suspicion, a partition), as do
the jobs whose tasks this worker dropped when it lost their ingress (:meth:`Links.orphan`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from compass.core.messages import (
    JOB_INPUTS,
    LINK_LOST,
    DoneMsg,
    FailedMsg,
    PeerMessage,
    ResultMsg,
    TaskMsg,
)

__all__ = ["Links", "Sent"]


class Sent(NamedTuple):
    """A message of ``job``'s ``attempt`` sent to a peer: about ``task``, for ``ingress``;
    ``failed``: the failure report itself (sent again as it was)."""

    job: str
    attempt: int
    task: str
    ingress: str
    failed: FailedMsg | None = None


#: whether what was sent of a job's attempt for an ingress is stale here (job, attempt, ingress)
Stale = Callable[[str, int, str], bool]

#: what :meth:`Links.note` keeps of the last message of a job sent to a peer: a :class:`Sent`
#: less its job (the key), as a plain tuple (attempt, task, ingress, failed). A worker notes
#: every task output it pushes on, and a NamedTuple is built through a Python-level
#: ``__new__`` (a call and about 11 bytecode instructions more than a tuple); the
#: :class:`Sent` is made only when a link breaks (:meth:`Links._take`)
_Kept = tuple[int, str, str, FailedMsg | None]


#: lost ingresses whose dropped jobs a worker remembers at most: one that never comes back
#: under its name (a pod replaced under another) is forgotten once this many were lost since
MAX_ORPHANED = 64


class Links:
    """Worker ``name``'s record of what broken links may have lost: per peer the last message
    sent of each job not done here, per lost ingress the jobs whose tasks were dropped (at most
    ``limit`` jobs each, and ``max_orphaned`` ingresses, the oldest forgotten first)."""

    def __init__(self, name: str, limit: int = 4096, max_orphaned: int = MAX_ORPHANED) -> None:
        self.name = name
        self.limit = limit
        self.max_orphaned = max_orphaned
        self._sent: dict[str, OrderedDict[str, _Kept]] = {}
        #: job -> the peers that have a message of it here
        self._peers: dict[str, set[str]] = {}
        #: per ingress this worker lost: what it must hear if it comes back, by job; the
        #: ingress lost longest ago first
        self._orphans: OrderedDict[str, OrderedDict[str, Sent]] = OrderedDict()
        #: per worker this ingress lost: the jobs it held an attempt of, planned again
        #: meanwhile, with the first attempt still live (what it holds below is stale)
        self._owed: OrderedDict[str, OrderedDict[str, int]] = OrderedDict()

    def __len__(self) -> int:
        return sum(map(len, self._sent.values()))

    @property
    def orphaned(self) -> int:
        """Jobs remembered for lost ingresses, and for lost workers of this ingress's jobs."""
        return sum(map(len, self._orphans.values())) + sum(map(len, self._owed.values()))

    def note(self, peer: str, msg: PeerMessage) -> None:
        """``msg`` went to ``peer``. Only the messages a job waits for count: a task's input,
        and a result or a failure report, which go to the job's ingress."""
        kept: _Kept
        if isinstance(msg, TaskMsg):
            source = msg.source
            kept = (msg.attempt, msg.task if source == JOB_INPUTS else source, msg.ingress, None)
        elif isinstance(msg, ResultMsg):
            kept = (msg.attempt, msg.task, peer, None)
        elif isinstance(msg, FailedMsg):
            kept = (msg.attempt, msg.task, peer, msg)
        else:
            return
        jobs = self._sent.get(peer)
        if jobs is None:
            jobs = self._sent[peer] = OrderedDict()
        job = msg.job
        known = jobs.get(job)
        if known is not None:
            # the newest attempt's; of one attempt, a report of a failure over a task's output
            if known[0] < kept[0] or (
                known[0] == kept[0] and (known[3] is None or kept[3] is not None)
            ):
                jobs[job] = kept
            jobs.move_to_end(job)
            return  # the peer is linked to the job already, and no job was added
        jobs[job] = kept
        peers = self._peers.get(job)
        if peers is None:
            self._peers[job] = {peer}
        else:
            peers.add(peer)
        while len(jobs) > self.limit:
            old, _ = jobs.popitem(last=False)
            self._unlink(old, peer)

    def forget(self, job: str, below: int | None = None) -> None:
        """``job``'s attempts below ``below`` (every one: None) are done here."""
        linked = self._peers.get(job)
        if linked is None:
            return  # nothing sent of it (every worker of a job hears it is done)
        for peer in list(linked):
            jobs = self._sent[peer]
            if below is None or jobs[job][0] < below:
                del jobs[job]
                if not jobs:
                    del self._sent[peer]
                self._unlink(job, peer)

    def orphan(self, ingress: str, sent: Sent) -> None:
        """What ``sent`` says (a task of its job dropped here, or a report of its failure)
        could not reach ``ingress``, which this worker lost: it hears if it comes back."""
        jobs = self._orphans.get(ingress)
        if jobs is None:
            jobs = self._orphans[ingress] = OrderedDict()
            while len(self._orphans) > self.max_orphaned:
                self._orphans.popitem(last=False)
        known = jobs.get(sent.job)
        if known is None or known.attempt <= sent.attempt:
            jobs[sent.job] = sent
        jobs.move_to_end(sent.job)
        while len(jobs) > self.limit:
            jobs.popitem(last=False)

    def owe_done(self, peer: str, job: str, below: int) -> None:
        """Ingress side: lost ``peer`` held an attempt of ``job``, which is planned again
        (attempts below ``below`` are stale). It may be alive (a false suspicion, a cut
        link): if it comes back it must hear it, or it keeps their inputs waiting for ever."""
        jobs = self._owed.get(peer)
        if jobs is None:
            jobs = self._owed[peer] = OrderedDict()
            while len(self._owed) > self.max_orphaned:
                self._owed.popitem(last=False)
        jobs[job] = max(jobs.get(job, 0), below)
        jobs.move_to_end(job)
        while len(jobs) > self.limit:
            jobs.popitem(last=False)

    def lost(self, peer: str, stale: Stale) -> list[tuple[str, FailedMsg]]:
        """``peer`` is lost: the reports to send, (to, report), of what was sent there. Those
        to ``peer`` itself, an ingress, wait for its return."""
        reports = []
        for sent in self._take(peer):
            if stale(sent.job, sent.attempt, sent.ingress):
                continue
            if sent.ingress == peer:
                self.orphan(peer, sent)
            else:
                reports.append((sent.ingress, self._report(sent, peer)))
        return reports

    def joined(self, peer: str, stale: Stale) -> list[tuple[str, FailedMsg | DoneMsg]]:
        """``peer`` is connected again (or anew): what to send, (to, message): the reports of
        what was sent there, what it must hear as an ingress this worker had lost, and, as a
        worker this ingress had lost, the attempts it held that were planned again since
        (:meth:`owe_done`)."""
        owed: list[tuple[str, FailedMsg | DoneMsg]] = [
            (peer, DoneMsg(job, below)) for job, below in self._owed.pop(peer, {}).items()
        ]
        reports = {}
        for sent in self._orphans.pop(peer, {}).values():  # stale or not: it knows
            reports[sent.job, sent.attempt] = (peer, self._report(sent, peer, dropped=True))
        for sent in self._take(peer):
            mark = (sent.job, sent.attempt)
            if mark not in reports and not stale(*mark, sent.ingress):
                reports[mark] = (sent.ingress, self._report(sent, peer))
        return [*reports.values(), *owed]

    def _report(self, sent: Sent, peer: str, *, dropped: bool = False) -> FailedMsg:
        if sent.failed is not None:
            return sent.failed
        if dropped:
            why = f"worker {self.name} lost its ingress {peer} and what it had of the job"
        else:
            why = (
                f"the link from {self.name} to {peer} broke after it sent a message of the job "
                "there, which may be lost"
            )
        return FailedMsg(
            sent.job, sent.attempt, sent.task, self.name, f"{why}; planning the job again",
            code=LINK_LOST,
        )  # fmt: skip

    def _take(self, peer: str) -> list[Sent]:
        """What was sent to ``peer``, oldest first, forgotten here."""
        jobs = self._sent.pop(peer, OrderedDict())
        for job in jobs:
            self._unlink(job, peer)
        return [Sent(job, *kept) for job, kept in jobs.items()]

    def _unlink(self, job: str, peer: str) -> None:
        peers = self._peers.get(job)
        if peers is not None:
            peers.discard(peer)
            if not peers:
                del self._peers[job]
