"""The group-event journal: what the coordinating proxy's groups did, appended to a Kafka topic.

``schema`` defines the versioned events, ``observer`` turns the engine's effects and listener
calls into them (pure, no I/O), ``clients`` remembers the client software (KIP-511) seen per
client, ``writer`` appends events to the journal topic from a trio task and ``settings`` holds
its configuration. ``docs/pipeline.md`` documents the schema and ``groupgate report`` reads it.
"""
