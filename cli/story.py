"""A worker's story of a job, a peer or a cause id as ``compass status --story KEY`` prints it:
what its worker core and its member table logged about the key, oldest first, each event with
its time (seconds after the first), its cause id (where it is not the event's own name) and
what it decided."""

from __future__ import annotations

from typing import Any

__all__ = ["story_lines"]


def story_lines(story: dict[str, Any]) -> list[str]:
    """``Client.story()``'s answer as lines."""
    core, members = story.get("core", []), story.get("members", [])
    lines = [
        f"story of {story['key']} at worker {story['worker']}: {len(core)} events of its "
        f"worker core, {len(members)} of its member table (the last ones each keeps)"
    ]
    times = [entry["now"] for entry in (*core, *members)]
    start = min(times, default=0.0)
    for title, entries in (("worker core", core), ("member table", members)):
        if not entries:
            continue
        lines.append(f"{title}:")
        for entry in entries:
            # an anonymous event's cause is its name, the first word of its words
            cause = entry["cause"]
            named = "" if entry["event"].split(" ", 1)[0] == cause else f"  (cause {cause})"
            lines.append(f"  +{entry['now'] - start:.6f} s  {entry['event']}{named}")
            lines.extend(f"      -> {did}" for did in entry["did"])
    if not core and not members:
        lines.append(
            "nothing logged: a key it never saw, or one whose events its logs no longer keep"
        )
    return lines
