"""A secured listener for test-bed brokers: SASL_SSL with SCRAM and PLAIN users, the standard
authorizer and ACLs, certificates made on the spot with ``trustme``.

``KafkaCluster(..., security=BrokerSecurity.create(directory, users))`` gives every node a
second listener, ``SASL_SSL`` on its own port (``node.secure_port``, the cluster's
``secure_bootstrap``), next to the plaintext one the test bed itself uses (readiness probes,
topic administration, the brokers among themselves and the controller). The plaintext
listener's anonymous principal is a super user: it is the test bed's administration port and
no client under test is given it. On the secured listener the ``StandardAuthorizer`` checks
every request against the ACLs the test adds (:meth:`BrokerSecurity.grant`); SCRAM users are
created when the storage is formatted (``--add-scram``), PLAIN users in the listener's JAAS
configuration. ``reauth_ms`` sets ``connections.max.reauth.ms`` (KIP-368): every client must
authenticate again within it, which the tests use to show that re-authentication works
through the proxy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme
from cryptography.hazmat.primitives import serialization

LISTENER = "SASL_SSL"
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")


def _pkcs8(pem: bytes) -> bytes:
    """Kafka's PEM key store reads PKCS#8 keys only; trustme writes the traditional format."""
    key = serialization.load_pem_private_key(pem, password=None)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass
class Certificates:
    """A CA and files of certificates it issued, for brokers, proxies and clients."""

    directory: Path
    ca: trustme.CA = field(default_factory=trustme.CA)

    @property
    def ca_file(self) -> Path:
        path = self.directory / "ca.pem"
        if not path.exists():
            self.directory.mkdir(parents=True, exist_ok=True)
            self.ca.cert_pem.write_to_path(str(path))
        return path

    def issue(self, name: str, *hosts: str, common_name: str | None = None
              ) -> tuple[Path, Path]:
        """(certificate chain file, PKCS#8 key file) for ``hosts`` (DNS names or IPs)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        leaf = self.ca.issue_cert(*hosts, common_name=common_name)
        cert = self.directory / f"{name}.pem"
        key = self.directory / f"{name}.key"
        cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        key.write_bytes(_pkcs8(leaf.private_key_pem.bytes()))
        key.chmod(0o600)
        return cert, key


@dataclass
class BrokerSecurity:
    """See the module docstring."""

    certificates: Certificates
    users: dict[str, str]
    """User name -> password, for SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN alike."""
    reauth_ms: int | None = None
    host: str = "127.0.0.1"

    @classmethod
    def create(cls, directory: Path, users: Mapping[str, str], *, reauth_ms: int | None = None,
               host: str = "127.0.0.1") -> BrokerSecurity:
        return cls(Certificates(directory), dict(users), reauth_ms, host)

    @property
    def ca_file(self) -> Path:
        return self.certificates.ca_file

    def broker_properties(self) -> dict[str, str]:
        cert, key = self.certificates.issue("broker", self.host, "localhost")
        keystore = self.certificates.directory / "broker-keystore.pem"
        if not keystore.exists():
            keystore.write_bytes(key.read_bytes() + cert.read_bytes())
        prefix = f"listener.name.{LISTENER.lower()}"
        plain_users = " ".join(f'user_{name}="{password}"'
                               for name, password in self.users.items())
        props = {
            "sasl.enabled.mechanisms": ",".join(MECHANISMS),
            f"{prefix}.ssl.keystore.type": "PEM",
            f"{prefix}.ssl.keystore.location": str(keystore),
            f"{prefix}.ssl.truststore.type": "PEM",
            f"{prefix}.ssl.truststore.location": str(self.ca_file),
            f"{prefix}.ssl.client.auth": "none",
            f"{prefix}.plain.sasl.jaas.config":
                f"org.apache.kafka.common.security.plain.PlainLoginModule required "
                f"{plain_users};",
            "authorizer.class.name":
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",
            "allow.everyone.if.no.acl.found": "false",
        }
        for mechanism in MECHANISMS[:2]:
            props[f"{prefix}.{mechanism.lower()}.sasl.jaas.config"] = (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;")
        if self.reauth_ms is not None:
            props["connections.max.reauth.ms"] = str(self.reauth_ms)
        return props

    def format_args(self) -> list[str]:
        """StorageTool arguments creating the SCRAM users."""
        args: list[str] = []
        for name, password in self.users.items():
            for mechanism in MECHANISMS[:2]:
                args += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
        return args

    # -- clients --------------------------------------------------------------------------

    def librdkafka(self, user: str, password: str | None = None,
                   mechanism: str = "SCRAM-SHA-256") -> dict[str, Any]:
        """confluent-kafka settings for ``user`` (``password``: a wrong one, to test that)."""
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": mechanism,
                "sasl.username": user,
                "sasl.password": self.users[user] if password is None else password,
                "ssl.ca.location": str(self.ca_file)}

    def java(self, user: str, mechanism: str = "SCRAM-SHA-256") -> dict[str, str]:
        """Java client properties for ``user``."""
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule"
                  if mechanism == "PLAIN" else
                  "org.apache.kafka.common.security.scram.ScramLoginModule")
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": mechanism,
                "sasl.jaas.config": f'{module} required username="{user}" '
                                    f'password="{self.users[user]}";',
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(self.ca_file)}

    def proxy_flags(self, user: str, mechanism: str = "SCRAM-SHA-256") -> list[str]:
        """``groupgate run`` flags for the proxy's own identity ``user``."""
        return ["--security-protocol", "SASL_SSL", "--tls-ca-file", str(self.ca_file),
                "--sasl-mechanism", mechanism, "--sasl-username", user,
                "--sasl-password", self.users[user]]


USERS = {"groupgate": "groupgate-secret", "alice": "alice-secret", "bob": "bob-secret"}
"""The test bed's users: the proxies' own identity, an application allowed everything on
topics and groups, and one allowed nothing."""
PROXY_USER = "groupgate"
REAUTH_MS = 10_000
"""``connections.max.reauth.ms`` of the secured test-bed brokers: clients, the proxy's own
links among them, authenticate again every few seconds of a test."""
PROXY_GRANTS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("GROUP", "*", "LITERAL", ("READ", "DESCRIBE")),
    ("TOPIC", "*", "LITERAL", ("DESCRIBE",)),
    ("TOPIC", "_groupgate-", "PREFIXED",
     ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "READ", "WRITE")),
    ("TRANSACTIONAL_ID", "groupgate-state", "PREFIXED", ("DESCRIBE", "WRITE")),
)
"""What the proxy's own identity is allowed (docs/security.md, "ACLs"): its member in the
broker's group of every group it coordinates, DescribeGroups of fleet lookups, Metadata of the
groups' topics, the state log (its topic and transactional ids) and the journal (a topic named
``_groupgate-...``). No READ on the applications' topics: what the proxy does for clients
behind other sidecars reaches the broker on the clients' own connections."""


def secured(version: str, directory: Path) -> Any:
    """A single-node broker of ``version`` with :class:`BrokerSecurity` for :data:`USERS`,
    ACLs for the proxy (:data:`PROXY_GRANTS`) and for ``alice`` (everything on topics and
    groups); ``bob`` has none."""
    from tests.testbed.broker import KafkaBroker

    security = BrokerSecurity.create(directory / "certs", USERS, reauth_ms=REAUTH_MS)
    broker = KafkaBroker.start(version, directory, security=security)
    broker.grant(f"User:{PROXY_USER}", *PROXY_GRANTS)
    broker.grant("User:alice", ("TOPIC", "*", "LITERAL", ("ALL",)),
                 ("GROUP", "*", "LITERAL", ("ALL",)))
    return broker


def acl_bindings(principal: str, grants: Iterable[tuple[str, str, str, Iterable[str]]]
                 ) -> list[Any]:
    """confluent-kafka ``AclBinding``s: (resource type, name, pattern, operations) each, e.g.
    ``("GROUP", "*", "LITERAL", ["READ", "DESCRIBE"])``, allowed for ``principal``."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    return [AclBinding(ResourceType[kind], name, ResourcePatternType[pattern], principal, "*",
                       AclOperation[operation], AclPermissionType.ALLOW)
            for kind, name, pattern, operations in grants for operation in operations]
