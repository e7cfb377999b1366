"""Which replica serves a request: the least loaded one, the same one for every turn of a trajectory.

Load is the number of requests in flight on a replica. A request carries a *session* key (a
multi-turn trajectory, or the prompt whose samples share a prefix): its first request goes to the
replica with the fewest requests in flight (ties: the lowest index), and later requests of the
same session go to that replica again, where the prefix cache holds its context, as long as it is
up. A replica marked down gets nothing until it is marked up again; its sessions move.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable

__all__ = ["ReplicaRouter", "NoReplicaError"]


class NoReplicaError(RuntimeError):
    """No replica is up (or every one was excluded)."""


class ReplicaRouter:
    """Load-based routing with session stickiness over ``count`` replicas (thread-safe).

    Args:
        count: number of replicas (all up at first).
    """

    def __init__(self, count: int) -> None:
        self.in_flight = [0] * count
        self.up = [True] * count
        self.sessions: dict[Hashable, int] = {}
        self.served = [0] * count
        self._lock = threading.Lock()

    def acquire(self, session: Hashable, exclude: Iterable[int] = ()) -> int:
        """The replica for one request of ``session`` (its in-flight count goes up by one).

        Args:
            session: the request's session key.
            exclude: replicas not to use (they just failed this request).

        Raises:
            NoReplicaError: no replica is up outside ``exclude``.
        """
        excluded = set(exclude)
        with self._lock:
            candidates = [i for i, up in enumerate(self.up) if up and i not in excluded]
            if not candidates:
                raise NoReplicaError(f"no rollout server replica is up (up: {self.up}, excluded: {sorted(excluded)})")
            chosen = self.sessions.get(session)
            if chosen not in candidates:
                chosen = min(candidates, key=lambda i: (self.in_flight[i], i))
                self.sessions[session] = chosen
            self.in_flight[chosen] += 1
            self.served[chosen] += 1
            return chosen

    def release(self, replica: int) -> None:
        """One request on ``replica`` finished (successfully or not)."""
        with self._lock:
            self.in_flight[replica] -= 1

    def mark_down(self, replica: int) -> None:
        with self._lock:
            self.up[replica] = False

    def mark_up(self, replica: int) -> None:
        with self._lock:
            self.up[replica] = True

    def is_up(self, replica: int) -> bool:
        with self._lock:
            return self.up[replica]

    def forget_sessions(self) -> None:
        """Drop every session's replica (after a weight update the prefix caches are empty anyway)."""
        with self._lock:
            self.sessions.clear()
