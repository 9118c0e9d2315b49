"""Container images without a container engine: a root file system directory becomes a
docker-archive tarball (one layer) that ``ctr images import`` loads into containerd.

:func:`write_archive` packs a directory; :mod:`tests.testbed.containerfile` builds the
directory by running ``deploy/Containerfile``'s steps, so the test bed's groupgate image and the
shipped Containerfile are one description.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ImageConfig", "write_archive"]

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class ImageConfig:
    """The OCI image configuration fields the test bed uses."""

    entrypoint: list[str]
    cmd: list[str] | None = None
    env: list[str] = field(default_factory=lambda: [DEFAULT_PATH])
    working_dir: str = "/"
    user: str = ""
    exposed_ports: list[str] = field(default_factory=list)


def _layer(rootfs: Path) -> bytes:
    """The root file system as one uncompressed tar layer (owners root, times zero)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(rootfs):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                path = os.path.join(dirpath, name)
                info = tar.gettarinfo(path, arcname=os.path.relpath(path, rootfs))
                info.mtime = 0
                if info.isreg():
                    with open(path, "rb") as fh:
                        tar.addfile(info, fh)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def write_archive(name: str, rootfs: Path, out: Path, config: ImageConfig) -> str:
    """Write ``rootfs`` as image ``name`` (``localhost/x:tag``) to ``out``; return its layer's
    digest. File owners are kept (a Containerfile's ``useradd`` user owns its files)."""
    layer = _layer(rootfs)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    image_config: dict[str, object] = {
        "Entrypoint": config.entrypoint,
        "Cmd": config.cmd,
        "Env": config.env,
        "WorkingDir": config.working_dir,
    }
    if config.user:
        image_config["User"] = config.user
    if config.exposed_ports:
        image_config["ExposedPorts"] = {p: {} for p in config.exposed_ports}
    document = {
        "architecture": "amd64",
        "os": "linux",
        "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "created": "1970-01-01T00:00:00Z",
        "history": [{"created_by": "tests.testbed.images"}],
    }
    config_bytes = json.dumps(document, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [name], "Layers": ["layer.tar"]}]).encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with tarfile.open(partial, "w") as tar:
        for member, data in (("layer.tar", layer), (config_name, config_bytes),
                             ("manifest.json", manifest)):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    partial.rename(out)
    return diff_id
