"""Client software from ApiVersions requests (KIP-511) and the bounded directory of it."""

from __future__ import annotations

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.codec.header import encode_request_header
from proxy.journal.clients import MAX_TEXT, ClientSoftwareDirectory, client_software


def api_versions(version: int, client_id: str | None, name: str = "", software: str = ""
                 ) -> bytes:
    body = messages.encode_request(ApiKey.API_VERSIONS, version, {
        "client_software_name": name, "client_software_version": software})
    return encode_request_header(ApiKey.API_VERSIONS, version, 7, client_id) + body


def test_read_from_a_v3_request() -> None:
    frame = api_versions(3, "orders-app", "apache-kafka-java", "3.9.1")
    assert client_software(memoryview(frame), 3) == ("orders-app", "apache-kafka-java", "3.9.1")
    assert client_software(api_versions(4, None, "librdkafka", "2.16.1"), 4) == \
        ("", "librdkafka", "2.16.1")


def test_nothing_before_v3_without_a_name_or_from_garbage() -> None:
    assert client_software(api_versions(2, "app"), 2) is None
    assert client_software(api_versions(3, "app", "", "1.0"), 3) is None
    frame = api_versions(3, "app", "librdkafka", "2.16.1")
    assert client_software(frame[:14], 3) is None
    assert client_software(b"\x00\x12\x00\x03", 3) is None


def test_long_names_are_cut() -> None:
    frame = api_versions(3, "app", "x" * 1000, "1")
    found = client_software(frame, 3)
    assert found is not None and len(found[1]) == MAX_TEXT


def test_directory_is_bounded_and_expires() -> None:
    now = [0.0]
    directory = ClientSoftwareDirectory(max_entries=2, ttl_s=10, timer=lambda: now[0])
    directory.note_request("/10.0.0.1", api_versions(3, "a", "librdkafka", "2.16.1"), 3)
    assert directory.lookup("/10.0.0.1", "a") == ("librdkafka", "2.16.1")
    assert directory.lookup("/10.0.0.2", "a") is None
    directory.note("/10.0.0.1", "b", "kafka-python", "3.0.12")
    directory.note("/10.0.0.1", "c", "apache-kafka-java", "4.1.0")
    assert len(directory) == 2
    now[0] = 11
    assert directory.lookup("/10.0.0.1", "c") is None
