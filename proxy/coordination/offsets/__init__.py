"""Offsets of coordinated groups: validated by the engine, stored in the broker.

* :mod:`.handlers`: the handlers of OffsetCommit, TxnOffsetCommit, OffsetFetch and
  OffsetDelete (engine validation, the commit stamped with the proxy's broker membership,
  member checks of fetches, subscribed topics kept from deletion);
* :mod:`.bridged`: the same checks for bridged members (groups in the broker phase), which the
  bridges decide instead of the engine;
* :mod:`.retries`: the stale-retry guard, a stage of the client-facing list;
* :mod:`.ticketed`: commit tickets, the commit of a member behind a follower sidecar validated
  by the holder and sent on the client's own connection;
* :mod:`.answers`: the failed-commit answer and the debug lines they share.
"""

from proxy.coordination.offsets.answers import commit_error
from proxy.coordination.offsets.handlers import (
    HANDLERS,
    STABLE_WAIT_SECONDS,
    OffsetCommitHandler,
    OffsetDeleteHandler,
    OffsetFetchHandler,
    TxnOffsetCommitHandler,
    check_membership,
    fetch_member_error,
    partitions_of,
    topic_id_of,
)
from proxy.coordination.remainders import merge_in_order

__all__ = ["HANDLERS", "STABLE_WAIT_SECONDS", "OffsetCommitHandler", "OffsetDeleteHandler",
           "OffsetFetchHandler", "TxnOffsetCommitHandler", "check_membership", "commit_error",
           "fetch_member_error", "merge_in_order", "partitions_of", "topic_id_of"]
