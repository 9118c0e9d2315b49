"""The exceptions of the group state log (:mod:`proxy.state_log.log`).

Every one is a :class:`StateLogError`. A caller that answers a client only after a write tells
them apart like this: :class:`Fenced` means another writer holds the group (stop acting for
it); :class:`WriteFailed` means this write was not acknowledged (the answer must not leave;
``committed`` says whether the records may still become visible); :class:`Unavailable` means
the cluster did not give what was needed in time; :class:`StateTopicError` means the topic is
unusable as it is.
"""

from __future__ import annotations


class StateLogError(Exception):
    """Base of the state log's errors."""


class Unavailable(StateLogError):
    """What was asked for could not be had before the deadline (the last reason inside)."""


class StateTopicError(StateLogError):
    """The state log's topic cannot be used: not compacted, or not creatable as configured."""


class Fenced(StateLogError):
    """Another writer opened the group's transactional id after this one (or the id no longer
    maps to this writer's producer): this writer can never write again."""


class WriteFailed(StateLogError):
    """A write was not acknowledged. ``committed`` is False when its records are known to be
    aborted, None when they may still have been committed (the commit was sent and no answer
    came back). ``retriable`` is False for errors no retry can fix (authorization)."""

    def __init__(self, message: str, *, committed: bool | None, retriable: bool = True) -> None:
        super().__init__(message)
        self.committed = committed
        self.retriable = retriable


class LoadFailed(StateLogError):
    """A group's records could not be read to the end."""
