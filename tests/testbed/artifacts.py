"""Resolve Maven coordinates to a local classpath, cached outside the repository.

The test bed runs real Kafka brokers and Kafka's Java tools, assembled from Maven Central. A
*bundle* is a named set of coordinates (``group:artifact:version[:classifier]``) resolved with
their runtime dependencies into one directory of jars under ``$GROUPGATE_CACHE/bundles/`` (default
``~/.cache/groupgate``). Maven does the resolution, with its local repository kept under the same
cache; once a bundle is complete a marker file is written, so later calls read the directory and
need neither Maven nor the network. A file lock per bundle makes concurrent callers safe.

    from tests.testbed.artifacts import classpath, require_java
    jars = classpath("kafka-clients-3.9.2", ["org.apache.kafka:kafka-clients:3.9.2"])
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from xml.sax.saxutils import escape

__all__ = [
    "ArtifactError",
    "JavaNotFoundError",
    "bundle_dir",
    "cache_root",
    "classpath",
    "classpath_string",
    "is_cached",
    "java_executable",
    "java_version",
    "require_java",
]

MIN_JAVA = 17
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_MARKER = "bundle.json"
_COORD = re.compile(r"^[\w.\-]+:[\w.\-]+:[\w.\-+]+(:[\w.\-]+)?$")
_SAFE_NAME = re.compile(r"^[\w.\-]+$")


class ArtifactError(RuntimeError):
    """Maven could not resolve a bundle (bad coordinates, no network and no cache, ...)."""


class JavaNotFoundError(RuntimeError):
    """No usable ``java`` (version >= 17) was found."""


def cache_root() -> Path:
    """The cache directory: ``$GROUPGATE_CACHE`` or ``~/.cache/groupgate``."""
    env = os.environ.get("GROUPGATE_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "groupgate"
    return root


def _fingerprint(coordinates: Sequence[str], exclusions: Sequence[str]) -> str:
    payload = json.dumps({"c": list(coordinates), "x": sorted(exclusions)}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def bundle_dir(
    bundle_name: str, coordinates: Sequence[str], exclusions: Sequence[str] = ()
) -> Path:
    """Where the bundle's jars live (``.../bundles/NAME-FINGERPRINT/lib``'s parent)."""
    if not _SAFE_NAME.match(bundle_name):
        raise ValueError(f"bundle name must match {_SAFE_NAME.pattern}: {bundle_name!r}")
    return cache_root() / "bundles" / f"{bundle_name}-{_fingerprint(coordinates, exclusions)}"


def is_cached(bundle_name: str, coordinates: Sequence[str], exclusions: Sequence[str] = ()) -> bool:
    """True when the bundle is complete on disk (no Maven run needed)."""
    return _read_marker(bundle_dir(bundle_name, coordinates, exclusions)) is not None


def classpath(
    bundle_name: str,
    coordinates: Sequence[str],
    exclusions: Sequence[str] = (),
    *,
    offline: bool = False,
) -> list[Path]:
    """Return the jars of ``coordinates`` plus their runtime dependencies, resolving if needed.

    ``coordinates`` are ``group:artifact:version`` or ``group:artifact:version:classifier``;
    ``exclusions`` are ``group:artifact`` pairs (``*`` allowed) left out of every dependency tree.
    The first call runs Maven (minutes on a cold cache); later calls only list the cached
    directory. With ``offline=True`` a missing bundle raises instead of running Maven.
    """
    coordinates = list(coordinates)
    if not coordinates:
        raise ValueError("no coordinates given")
    for coord in coordinates:
        if not _COORD.match(coord):
            raise ValueError(f"bad Maven coordinate {coord!r} (want group:artifact:version)")
    for excl in exclusions:
        if excl.count(":") != 1:
            raise ValueError(f"bad exclusion {excl!r} (want group:artifact)")
    target = bundle_dir(bundle_name, coordinates, exclusions)
    jars = _read_marker(target)
    if jars is not None:
        return jars
    if offline:
        raise ArtifactError(f"bundle {bundle_name} is not cached in {target} and offline=True")
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / (target.name + ".lock")):
        jars = _read_marker(target)  # another process may have finished it meanwhile
        if jars is not None:
            return jars
        _resolve(target, coordinates, exclusions)
        jars = _read_marker(target)
        if jars is None:  # pragma: no cover - _resolve writes the marker or raises
            raise ArtifactError(f"bundle {bundle_name} incomplete after resolution")
        return jars


def classpath_string(jars: Sequence[Path]) -> str:
    """Join jars for ``java -cp``."""
    return os.pathsep.join(str(j) for j in jars)


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _read_marker(target: Path) -> list[Path] | None:
    marker = target / _MARKER
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    jars = [target / "lib" / name for name in data.get("jars", [])]
    if not jars or not all(j.is_file() for j in jars):
        return None
    return jars


def _pom(coordinates: Sequence[str], exclusions: Sequence[str]) -> str:
    excl_xml = "".join(
        "<exclusion><groupId>{}</groupId><artifactId>{}</artifactId></exclusion>".format(
            *map(escape, e.split(":"))
        )
        for e in exclusions
    )
    deps = []
    for coord in coordinates:
        parts = coord.split(":")
        group, artifact, version = parts[:3]
        classifier = f"<classifier>{escape(parts[3])}</classifier>" if len(parts) == 4 else ""
        deps.append(
            f"<dependency><groupId>{escape(group)}</groupId>"
            f"<artifactId>{escape(artifact)}</artifactId><version>{escape(version)}</version>"
            f"{classifier}<exclusions>{excl_xml}</exclusions></dependency>"
        )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>groupgate.testbed</groupId>
  <artifactId>bundle</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>{"".join(deps)}</dependencies>
</project>
"""


def _resolve(target: Path, coordinates: Sequence[str], exclusions: Sequence[str]) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ArtifactError("Maven (mvn) is not on PATH; it is needed to fetch Kafka artifacts")
    require_java()
    local_repo = cache_root() / "m2"
    work = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        (work / "pom.xml").write_text(_pom(coordinates, exclusions))
        cmd = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(work / "pom.xml"),
            f"-Dmaven.repo.local={local_repo}",
            f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-DoutputDirectory={work / 'lib'}",
            "-DincludeScope=runtime",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
            raise ArtifactError(f"mvn failed ({proc.returncode}) for {coordinates}:\n{tail}")
        jars = sorted(p.name for p in (work / "lib").glob("*.jar"))
        if not jars:
            raise ArtifactError(f"mvn resolved no jars for {coordinates}")
        (work / _MARKER).write_text(
            json.dumps(
                {"coordinates": list(coordinates), "exclusions": list(exclusions), "jars": jars},
                indent=1,
            )
        )
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def java_executable() -> str:
    """``$JAVA_HOME/bin/java`` when set, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise JavaNotFoundError(
            f"java not found: install a JDK >= {MIN_JAVA} (e.g. apt-get install "
            f"openjdk-{MIN_JAVA}-jre-headless) or set JAVA_HOME"
        )
    return found


_java_cache: dict[str, int] = {}


def java_version(java: str | None = None) -> int:
    """The feature version of ``java`` (17 for 17.0.15, 8 for 1.8.0_x)."""
    java = java or java_executable()
    if java in _java_cache:
        return _java_cache[java]
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError as exc:
        raise JavaNotFoundError(f"cannot run {java}: {exc}") from exc
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        raise JavaNotFoundError(f"cannot parse `{java} -version`: {out.stderr.strip()!r}")
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))
    _java_cache[java] = major
    return major


def require_java(minimum: int = MIN_JAVA) -> str:
    """Return the java executable, or raise :class:`JavaNotFoundError` if it is older."""
    java = java_executable()
    version = java_version(java)
    if version < minimum:
        raise JavaNotFoundError(
            f"{java} is Java {version}; Kafka's test bed needs Java >= {minimum} "
            f"(set JAVA_HOME to a newer JDK)"
        )
    return java
