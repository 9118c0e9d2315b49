"""Security: TLS on both sides of the proxy, SASL for the proxy's own connections, and what
the proxy learns of each client's authentication.

* :mod:`.tls`: SSL contexts built from certificate files and rebuilt when the files change.
* :mod:`.identity`: the proxy's own SASL credentials (settings, environment or files).
* :mod:`.sasl_client`: SaslHandshake/SaslAuthenticate for the proxy's own connections (PLAIN,
  SCRAM-SHA-256/512), with KIP-368 re-authentication.
* :mod:`.session`: per client connection, whether and as whom it authenticated.
* :mod:`.gate`: the router wrapper of a SASL listener: before authentication only ApiVersions
  and the SASL APIs pass; what the broker answers to the SASL exchange fills the session.
* :mod:`.policy`: every security setting turned into the objects the server and links use.
"""
