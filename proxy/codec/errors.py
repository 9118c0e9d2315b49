"""The one exception the codec raises.

Every malformed input (truncated buffer, negative or oversized length, bad varint, invalid UTF-8,
unknown version) and every unencodable value surfaces as :class:`CodecError`, so callers at the
connection level need a single ``except`` to decide between "forward opaque" and "close".
"""


class CodecError(ValueError):
    """A Kafka message could not be decoded or encoded."""
