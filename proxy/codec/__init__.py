"""Schema-driven Kafka message codec (sans-I/O).

Decodes and encodes Kafka request/response bodies from the JSON message schemas vendored in
``proxy/codec/schemas`` (see ``dev/vendor-schemas``). ``messages`` is the entry point;
``header`` peeks at request headers without decoding bodies. Connection code keeps frames
opaque and only calls the codec for APIs the proxy owns or rewrites.
"""

from proxy.codec.errors import CodecError

__all__ = ["CodecError"]
