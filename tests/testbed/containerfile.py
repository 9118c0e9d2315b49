"""Build ``deploy/Containerfile`` without a container engine, so the test bed runs the image
the project ships and not a look-alike.

The Containerfile is read step by step and each step is carried out on a root file system
directory: ``FROM debian:<suite>-slim`` is ``debootstrap --variant=minbase <suite>`` (Debian's
own tool, fetched with ``apt-get download`` and run from where it was unpacked), ``RUN`` runs
in a ``chroot`` of it (with ``/proc`` and ``/dev`` mounted and the host's resolver, so
``apt-get`` and ``pip`` reach their archives), ``COPY`` copies from the build context, and
``ENV``, ``USER``, ``WORKDIR``, ``EXPOSE``, ``ENTRYPOINT`` and ``CMD`` make the image's
configuration. Anything else in the file is an error here, so the file cannot grow a step the
test bed would silently skip. The result is packed by :func:`tests.testbed.images.write_archive`.

Root file systems are cached under ``$GROUPGATE_CACHE/images/``: the one after the steps
before the first ``COPY`` (the Debian base with Python; keyed by those steps' text), and the
finished one (keyed by every step and the context's files). ``extra_steps`` appends steps of
the test bed's own (a client library for test pods) to a derived image with its own key.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.testbed import artifacts
from tests.testbed.images import DEFAULT_PATH, ImageConfig, write_archive

__all__ = ["Step", "build_image", "parse"]

MIRROR = "http://deb.debian.org/debian"
_SUPPORTED = frozenset({"FROM", "RUN", "COPY", "ENV", "USER", "WORKDIR", "EXPOSE", "ENTRYPOINT",
                        "CMD"})


@dataclass(frozen=True)
class Step:
    instruction: str
    argument: str

    @property
    def text(self) -> str:
        return f"{self.instruction} {self.argument}"


def parse(text: str) -> list[Step]:
    """The steps of a Containerfile (comments dropped, continuation lines joined)."""
    steps: list[Step] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line, pending = pending + line, ""
        instruction, _, argument = line.partition(" ")
        instruction = instruction.upper()
        if instruction not in _SUPPORTED:
            raise ValueError(f"Containerfile instruction {instruction} is not supported by the "
                             f"test bed's builder ({', '.join(sorted(_SUPPORTED))})")
        steps.append(Step(instruction, argument.strip()))
    if pending:
        raise ValueError("Containerfile ends inside a continued line")
    if not steps or steps[0].instruction != "FROM":
        raise ValueError("a Containerfile starts with FROM")
    return steps


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def _context_digest(context: Path, steps: Sequence[Step]) -> str:
    """The files COPY steps read (names and contents)."""
    h = hashlib.sha256()
    for step in steps:
        if step.instruction != "COPY":
            continue
        for source in shlex.split(step.argument)[:-1]:
            for path in sorted(glob.glob(str(context / source))):
                for file in sorted(Path(path).rglob("*")) if Path(path).is_dir() else [Path(path)]:
                    if file.is_file():
                        h.update(str(file.relative_to(context)).encode())
                        h.update(file.read_bytes())
    return h.hexdigest()[:16]


def _run(cmd: Sequence[str], **kwargs: object) -> None:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, check=False,
                          **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise RuntimeError(f"{' '.join(cmd)[:200]} failed ({proc.returncode}):\n{tail}")


def _debootstrap(suite: str, rootfs: Path, work: Path) -> None:
    """A minimal Debian ``suite`` (like the ``debian:<suite>-slim`` image) into ``rootfs``."""
    tool = work / "debootstrap"
    tool.mkdir()
    _run(["apt-get", "download", "-q", "debootstrap"], cwd=tool)
    (deb,) = tool.glob("debootstrap_*.deb")
    _run(["dpkg", "-x", str(deb), str(tool / "x")])
    env = dict(os.environ, DEBOOTSTRAP_DIR=str(tool / "x/usr/share/debootstrap"))
    _run([str(tool / "x/usr/sbin/debootstrap"), "--variant=minbase", suite, str(rootfs), MIRROR],
         env=env)
    # like the -slim images: no documentation, no apt lists
    for junk in ("usr/share/doc", "usr/share/man", "usr/share/info", "var/lib/apt/lists",
                 "var/cache/apt/archives"):
        shutil.rmtree(rootfs / junk, ignore_errors=True)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def _chroot_mounts(rootfs: Path) -> Iterator[None]:
    mounted: list[Path] = []
    resolv = rootfs / "etc/resolv.conf"
    saved = resolv.read_bytes() if resolv.is_file() else None
    try:
        for kind, target in (("proc", "proc"), ("bind", "dev")):
            point = rootfs / target
            point.mkdir(exist_ok=True)
            if kind == "proc":
                _run(["mount", "-t", "proc", "proc", str(point)])
            else:
                _run(["mount", "--bind", "/dev", str(point)])
            mounted.append(point)
        if resolv.is_symlink():
            resolv.unlink()
        shutil.copy2("/etc/resolv.conf", resolv)
        yield
    finally:
        for point in reversed(mounted):
            subprocess.run(["umount", "-l", str(point)], check=False)
        if saved is not None:
            resolv.write_bytes(saved)


def _apply(steps: Sequence[Step], rootfs: Path, context: Path, config: ImageConfig) -> None:
    """Carry out the steps after FROM on ``rootfs``, updating ``config``."""
    env: dict[str, str] = dict(e.split("=", 1) for e in config.env)
    for step in steps:
        arg = step.argument
        if step.instruction == "RUN":
            script = f"cd {shlex.quote(config.working_dir)} && {arg}"
            user, _, group = config.user.partition(":")
            as_user = ([f"--userspec={user}:{group or user}"]
                       if user not in ("", "0", "root") else [])
            with _chroot_mounts(rootfs):
                _run(["chroot", *as_user, str(rootfs), "/bin/sh", "-c", script], env=env)
        elif step.instruction == "COPY":
            *sources, dest = shlex.split(arg)
            target = rootfs / (dest if dest.startswith("/") else
                               os.path.join(config.working_dir, dest)).lstrip("/")
            matched = [Path(p) for s in sources for p in sorted(glob.glob(str(context / s)))]
            if not matched:
                raise ValueError(f"COPY {arg}: nothing in the context matches")
            for source in matched:
                if source.is_dir():
                    shutil.copytree(source, target, dirs_exist_ok=True)
                elif dest.endswith("/") or len(matched) > 1:
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, target / source.name)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, target)
        elif step.instruction == "ENV":
            for item in shlex.split(arg):
                key, sep, value = item.partition("=")
                if not sep:
                    raise ValueError(f"ENV {arg}: use the KEY=value form")
                env[key] = value
        elif step.instruction == "USER":
            config.user = arg
        elif step.instruction == "WORKDIR":
            config.working_dir = arg
            (rootfs / arg.lstrip("/")).mkdir(parents=True, exist_ok=True)
        elif step.instruction == "EXPOSE":
            config.exposed_ports = [p if "/" in p else f"{p}/tcp" for p in arg.split()]
        elif step.instruction == "ENTRYPOINT":
            config.entrypoint = json.loads(arg)
        elif step.instruction == "CMD":
            config.cmd = json.loads(arg)
    config.env = [f"{k}={v}" for k, v in env.items()]


def _suite(from_step: Step) -> str:
    image = from_step.argument.split()[0]
    name, _, tag = image.partition(":")
    if name not in ("debian", "docker.io/debian", "docker.io/library/debian") or not tag:
        raise ValueError(f"FROM {image}: the test bed builds Debian bases only "
                         "(debian:<suite>-slim)")
    return tag.removesuffix("-slim")


def _remove_tree(path: Path) -> None:
    """``rm -rf path``, after unmounting whatever a RUN step killed midway left mounted under
    it (its bind mount of the host's /dev above all: removing through it would remove the
    host's device nodes)."""
    mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True,
                            check=False).stdout.splitlines()
    inside = sorted((m for m in mounts if m.startswith(f"{path}/")), reverse=True)
    for mount in inside:
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
    mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True,
                            check=False).stdout.splitlines()
    if any(m.startswith(f"{path}/") for m in mounts):
        raise RuntimeError(f"cannot unmount everything under {path}: not removing it")
    shutil.rmtree(path, ignore_errors=True)


def _snapshot(source: Path, target: Path) -> None:
    partial = target.with_name(target.name + ".partial")
    _remove_tree(partial)
    _run(["cp", "-a", str(source), str(partial)])
    partial.rename(target)


def _cache() -> Path:
    root = artifacts.cache_root() / "images"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _rootfs(steps: Sequence[Step], context: Path) -> tuple[Path, ImageConfig]:
    """The finished root file system of ``steps`` (cached) and its configuration."""
    cache = _cache()
    first_copy = next((i for i, s in enumerate(steps) if s.instruction == "COPY"), len(steps))
    base_steps, rest = steps[:first_copy], steps[first_copy:]
    base = cache / f"base-{_digest(*(s.text for s in base_steps))}"
    config = ImageConfig(entrypoint=[], env=[DEFAULT_PATH])
    if not base.is_dir():
        work = Path(tempfile.mkdtemp(prefix="build.", dir=cache))
        try:
            rootfs = work / "rootfs"
            _debootstrap(_suite(base_steps[0]), rootfs, work)
            _apply(base_steps[1:], rootfs, context, config)
            _run(["mv", str(rootfs), str(base)])
        finally:
            _remove_tree(work)
    else:
        _apply([s for s in base_steps[1:] if s.instruction != "RUN"], base, context, config)
    final = cache / f"rootfs-{_digest(base.name, *(s.text for s in rest))}-" \
                    f"{_context_digest(context, rest)}"
    if not final.is_dir():
        _snapshot(base, final.with_name(final.name + ".work"))
        work_root = final.with_name(final.name + ".work")
        try:
            _apply(rest, work_root, context, config)
        except BaseException:
            _remove_tree(work_root)
            raise
        work_root.rename(final)
        (final.parent / (final.name + ".json")).write_text(json.dumps(config.__dict__))
    else:
        config = ImageConfig(**json.loads((final.parent / (final.name + ".json")).read_text()))
    return final, config


def build_image(containerfile: Path, context: Path, name: str, out: Path,
                extra_steps: Sequence[str] = ()) -> Path:
    """Build ``containerfile`` with ``context`` into the docker-archive ``out`` as ``name``;
    ``extra_steps`` (Containerfile lines) are carried out on a copy afterwards."""
    steps = parse(containerfile.read_text())
    rootfs, config = _rootfs(steps, context)
    if extra_steps:
        extra = parse("FROM scratch\n" + "\n".join(extra_steps))[1:]
        derived = rootfs.with_name(f"{rootfs.name}+{_digest(*(s.text for s in extra))}")
        meta = derived.parent / (derived.name + ".json")
        if not derived.is_dir() or not meta.is_file():
            work_root = derived.with_name(derived.name + ".work")
            _remove_tree(work_root)
            _snapshot(rootfs, work_root)
            try:
                _apply(extra, work_root, context, config)
            except BaseException:
                _remove_tree(work_root)
                raise
            work_root.rename(derived)
            meta.write_text(json.dumps(config.__dict__))
        rootfs, config = derived, ImageConfig(**json.loads(meta.read_text()))
    (rootfs.parent / (rootfs.name + ".json")).touch()
    _prune()
    key = out.with_name(out.name + ".source")
    if not out.is_file() or not key.is_file() or key.read_text() != rootfs.name:
        write_archive(name, rootfs, out, config)
        key.write_text(rootfs.name)
    return out


KEEP_ROOTFS = 6
"""Finished root file systems kept in the cache (the most recently used)."""


def _prune() -> None:
    """Remove all but the :data:`KEEP_ROOTFS` most recently used finished root file systems
    (each source change of the project makes a new one of about 300 MB)."""
    cache = _cache()
    used = sorted(cache.glob("rootfs-*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for meta in used[KEEP_ROOTFS:]:
        _remove_tree(cache / meta.name.removesuffix(".json"))
        meta.unlink(missing_ok=True)
