"""The journal's settings: which topic, how it is created when missing, how much is buffered.

:data:`SETTINGS` lists them as ``groupgate run`` declares them (name, default, help), and
:class:`JournalSettings` holds their values; the journal is off while ``journal-topic`` is
unset. The topic is created only when it is missing, with these values: append-only
(``cleanup.policy=delete``), time retention, and the partitions and replication factor given,
or the cluster's own defaults (``num.partitions``, ``default.replication.factor``) for -1.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.records import Compression

DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000
DEFAULT_BUFFER_EVENTS = 100_000
DEFAULT_SNAPSHOT_INTERVAL_MS = 300_000

SETTINGS: tuple[tuple[str, str, str], ...] = (
    ("journal-topic", "off",
     "Kafka topic the proxy appends its group events to (docs/pipeline.md); 'off': no "
     "journal. Created when missing with the journal-* settings below."),
    ("journal-partitions", "-1",
     "Partitions of the journal topic when the proxy creates it; -1: the cluster's "
     "num.partitions."),
    ("journal-replication-factor", "-1",
     "Replication factor of the journal topic when the proxy creates it; -1: the cluster's "
     "default.replication.factor."),
    ("journal-retention-ms", str(DEFAULT_RETENTION_MS),
     "retention.ms of the journal topic when the proxy creates it (cleanup.policy=delete; "
     "-1: unlimited)."),
    ("journal-buffer-events", str(DEFAULT_BUFFER_EVENTS),
     "Events held in memory while the journal topic cannot be written; more are dropped and "
     "counted in groupgate_journal_events_dropped_total."),
    ("journal-snapshot-interval-ms", str(DEFAULT_SNAPSHOT_INTERVAL_MS),
     "How often every coordinated group is written whole to the journal (a report can start "
     "at any snapshot)."),
    ("journal-acks", "all",
     "Produce acks for journal writes: 'all' (every in-sync replica) or 'leader'."),
    ("journal-compression", "gzip",
     "Compression of journal record batches: 'gzip' or 'none' (docs/decisions/0011)."),
    ("journal-source", "auto",
     "How this proxy names itself in its events; 'auto': the advertised host and the listen "
     "port."),
)
"""``(name, default, help)`` of every journal setting, as ``groupgate run`` declares them."""


@dataclass(frozen=True, slots=True)
class JournalSettings:
    topic: str | None = None
    """None: the journal is off."""
    partitions: int = -1
    replication_factor: int = -1
    retention_ms: int = DEFAULT_RETENTION_MS
    buffer_events: int = DEFAULT_BUFFER_EVENTS
    snapshot_interval_ms: int = DEFAULT_SNAPSHOT_INTERVAL_MS
    acks: int = -1
    """-1 (all) or 1 (the leader)."""
    compression: Compression = Compression.GZIP
    source: str = ""

    def __post_init__(self) -> None:
        if self.topic is not None and not self.topic.strip():
            raise ValueError("journal-topic must not be blank")
        if self.partitions == 0 or self.partitions < -1:
            raise ValueError("journal-partitions must be positive or -1")
        if self.replication_factor == 0 or self.replication_factor < -1:
            raise ValueError("journal-replication-factor must be positive or -1")
        if self.retention_ms < 1 and self.retention_ms != -1:
            raise ValueError("journal-retention-ms must be positive (or -1: unlimited)")
        if self.buffer_events < 1:
            raise ValueError("journal-buffer-events must be positive")
        if self.snapshot_interval_ms < 1_000:
            raise ValueError("journal-snapshot-interval-ms must be at least 1000")
        if self.acks not in (-1, 1):
            raise ValueError("journal-acks must be 'all' or 'leader'")
        if self.compression not in (Compression.NONE, Compression.GZIP):
            raise ValueError("journal-compression must be 'gzip' or 'none'")

    @property
    def enabled(self) -> bool:
        return self.topic is not None


def parse_topic(text: str) -> str | None:
    """``journal-topic``: a topic name, or None for 'off' / empty."""
    text = text.strip()
    return None if text in ("", "off", "none") else text


def parse_acks(text: str) -> int:
    """``journal-acks``: 'all' (-1) or 'leader' (1)."""
    value = {"all": -1, "-1": -1, "leader": 1, "1": 1}.get(text.strip().lower())
    if value is None:
        raise ValueError(f"{text!r}: expected 'all' or 'leader'")
    return value


def parse_compression(text: str) -> Compression:
    """``journal-compression``: 'gzip' or 'none'."""
    value = {"gzip": Compression.GZIP, "none": Compression.NONE}.get(text.strip().lower())
    if value is None:
        raise ValueError(f"{text!r}: expected 'gzip' or 'none'")
    return value


def parse_source(text: str) -> str | None:
    """``journal-source``: a name, or None for 'auto'."""
    text = text.strip()
    return None if text in ("", "auto") else text
