"""A real single-node Kubernetes for the test bed, built from source on first use and cached.

What it is: etcd, kube-apiserver (token authentication, RBAC), kube-controller-manager and
kube-scheduler on loopback ports, and one node: a kubelet with containerd, runc and a CNI
bridge (``10.245.0.0/24``) whose gateway is the host at :data:`HOST_ADDRESS`, so pods reach a
broker of the test bed listening on the host there. There is no kube-proxy: Service ClusterIPs
do not route (pod addresses do), and no image registry: images are built locally
(:mod:`tests.testbed.images`) and imported into containerd when the node starts.

Where it comes from (:func:`build`, once, into ``$GROUPGATE_CACHE/kubernetes/<versions>/``):

* Kubernetes :data:`K8S_VERSION` and etcd :data:`ETCD_VERSION` compiled with this machine's Go
  toolchain from the Go module proxy (a scratch module pins every staging repository to its
  published ``v0.Y.Z``), Helm :data:`HELM_VERSION` by ``go install``. Each compile runs under
  the shared heavy-work lock (:data:`HEAVY_LOCK`), held for that compile only. No Go toolchain
  (``go`` on PATH or in ``/usr/local/go/bin``, at least :data:`MIN_GO`): :class:`Unavailable`
  says so and the tests that need the cluster skip.
* containerd, runc, the CNI plugins and busybox from Debian packages (``apt-get download`` and
  ``dpkg -x``: nothing is installed system-wide), and a tiny static ``pause`` for the pod
  sandbox, compiled here.

Cold, the build takes about 8 minutes on two cores (the compiles about 5.5, kube-apiserver
alone 3; more while others hold the shared lock; the Go build caches, about 5 GB under
``kubernetes/go``, are removed afterwards unless ``GROUPGATE_KEEP_GO_CACHE=1``), the Debian
base of the images about a minute more; once cached, :func:`build` does nothing and
:class:`Cluster` has a Ready node in about 15 seconds (most of it importing the images).

Pitfalls this setup avoids: containerd's ``restrict_oom_score_adj``
(runc cannot set a negative OOM score without CAP_SYS_RESOURCE), the kubelet's
``failCgroupV1: false`` (cgroup v1 hosts), the API server's
``--kubelet-preferred-address-types=InternalIP`` (for logs and exec), and ``helm install
--dry-run=server``, which does not validate: pipe ``helm template`` into
``kubectl apply --dry-run=server`` instead (:meth:`Cluster.validate`).

Command line (``dev/kubernetes`` runs it): ``python -m tests.testbed.kubernetes build|up|down``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.testbed import artifacts

__all__ = [
    "ETCD_VERSION",
    "HELM_VERSION",
    "HOST_ADDRESS",
    "K8S_VERSION",
    "Toolchain",
    "Unavailable",
    "available",
    "build",
    "toolchain",
]

K8S_VERSION = "1.35.4"
ETCD_VERSION = "3.6.5"
HELM_VERSION = "3.22.0"
MIN_GO = (1, 25)
"""Kubernetes 1.35's go.mod asks for Go 1.25."""
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
DEBIAN_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "busybox-static")
HEAVY_LOCK = Path("/tmp/groupgate-heavy.lock")
"""Compiles take this lock (shared with the other heavy work on the machine) one at a time."""

POD_CIDR = "10.245.0.0/24"
HOST_ADDRESS = "10.245.0.1"
"""The node's bridge address on the host: pods reach the host's brokers here."""
BRIDGE = "ggk8sbr0"
NODE_NAME = "groupgate-node"

_PAUSE_GO = """\
// The pod sandbox's process: sleeps until SIGINT/SIGTERM, reaps zombies.
package main

import (
\t"os"
\t"os/signal"
\t"syscall"
)

func main() {
\tc := make(chan os.Signal, 4)
\tsignal.Notify(c, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
\tfor s := range c {
\t\tif s == syscall.SIGCHLD {
\t\t\tfor {
\t\t\t\tvar ws syscall.WaitStatus
\t\t\t\tpid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
\t\t\t\tif pid <= 0 || err != nil {
\t\t\t\t\tbreak
\t\t\t\t}
\t\t\t}
\t\t\tcontinue
\t\t}
\t\tos.Exit(0)
\t}
}
"""


class Unavailable(RuntimeError):
    """This machine cannot build or run the test bed's Kubernetes (the message says why)."""


class Toolchain:
    """The cached binaries: where they are and whether they are all there."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.cni_bin = root / "cni" / "bin"
        self.images = root / "images"

    def tool(self, name: str) -> str:
        return str(self.bin / name)

    @property
    def complete(self) -> bool:
        names = (*COMPONENTS, "etcd", "helm", "kubectl", "containerd",
                 "containerd-shim-runc-v2", "ctr", "runc")
        return (all((self.bin / n).is_file() for n in names)
                and all((self.cni_bin / n).is_file() for n in ("bridge", "host-local", "loopback"))
                and (self.images / "pause.tar").is_file())


def toolchain() -> Toolchain:
    """Where :func:`build` puts (or has put) the binaries of the pinned versions."""
    name = f"k8s-{K8S_VERSION}-etcd-{ETCD_VERSION}-helm-{HELM_VERSION}"
    return Toolchain(artifacts.cache_root() / "kubernetes" / name)


GO_FALLBACK = "/usr/local/go/bin/go"
"""Where Go's own installer puts it (often not on PATH)."""


def _go() -> str:
    found = shutil.which("go") or (GO_FALLBACK if Path(GO_FALLBACK).is_file() else None)
    if found is None:
        raise Unavailable(
            "no Go toolchain (go on PATH or /usr/local/go/bin/go): the Kubernetes test bed "
            f"compiles Kubernetes {K8S_VERSION} from source and needs Go >= "
            f"{MIN_GO[0]}.{MIN_GO[1]} (https://go.dev/dl/)")
    out = subprocess.run([found, "env", "GOVERSION"], capture_output=True, text=True,
                         check=False).stdout.strip()
    match = re.match(r"go(\d+)\.(\d+)", out)
    if match is None or (int(match.group(1)), int(match.group(2))) < MIN_GO:
        raise Unavailable(f"{found} is {out or 'unknown'}; Kubernetes {K8S_VERSION} needs "
                          f"Go >= {MIN_GO[0]}.{MIN_GO[1]}")
    return found


def available() -> tuple[bool, str]:
    """Whether the cluster can run here (built or buildable), and why not."""
    if sys.platform != "linux":
        return False, "the Kubernetes test bed needs Linux"
    if os.geteuid() != 0:
        return False, "the Kubernetes test bed needs root (kubelet, containerd, a bridge)"
    for tool in ("ip", "openssl", "mount"):
        if shutil.which(tool) is None:
            return False, f"the Kubernetes test bed needs {tool} on PATH"
    if toolchain().complete:
        return True, ""
    if shutil.which("apt-get") is None:
        return False, "the Kubernetes test bed fetches containerd and runc with apt-get"
    try:
        _go()
    except Unavailable as exc:
        return False, str(exc)
    return True, ""


# -- the shared heavy-work lock -------------------------------------------------------------


def _lock_holders(path: Path) -> set[int]:
    """The pids holding a flock on ``path`` (from /proc/locks)."""
    try:
        st = path.stat()
        text = Path("/proc/locks").read_text()
    except OSError:
        return set()
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == want:
            holders.add(int(fields[4]))
    return holders


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return pids


@contextlib.contextmanager
def heavy_lock() -> Iterator[None]:
    """Hold :data:`HEAVY_LOCK`, unless this process already runs under it (``flock LOCK cmd``
    in an ancestor), where waiting for it would wait forever."""
    HEAVY_LOCK.touch(exist_ok=True)
    if _lock_holders(HEAVY_LOCK) & _ancestors():
        yield
        return
    with open(HEAVY_LOCK, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# -- the build ----------------------------------------------------------------------------


def _say(message: str) -> None:
    print(f"[kubernetes] {message}", file=sys.stderr, flush=True)


def _run(cmd: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
         nice: bool = False) -> str:
    """Run a build step (``nice``: at the lowest priority, for compiles)."""
    argv = ["nice", "-n", "19", *cmd] if nice else list(cmd)
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    _say(f"({time.monotonic() - started:.0f}s) {' '.join(cmd)[:110]}")
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{tail}")
    return proc.stdout


@dataclass(frozen=True)
class _Compile:
    """One Go compile, run with the others under one hold of :data:`HEAVY_LOCK`."""

    argv: tuple[str, ...]
    cwd: Path | None
    env: dict[str, str]


def _go_env(tc: Toolchain) -> dict[str, str]:
    go_cache = tc.root.parent / "go"
    env = dict(os.environ)
    env.update(GOFLAGS="-buildvcs=false", GOTOOLCHAIN="local", GOMODCACHE=str(go_cache / "mod"),
               GOCACHE=str(go_cache / "build"), GOPATH=str(go_cache / "path"))
    env["PATH"] = f"{Path(_go()).parent}:{env.get('PATH', '')}"
    return env


def _prepare_kubernetes(tc: Toolchain, env: dict[str, str]) -> list[_Compile]:
    """A scratch module pinning every staging repository to its published ``v0.Y.Z``, with
    the sources downloaded; the compiles of the missing components."""
    missing = [n for n in (*COMPONENTS, "kubectl") if not (tc.bin / n).is_file()]
    if not missing:
        return []
    go = _go()
    src = tc.root / "src" / "k8s"
    src.mkdir(parents=True, exist_ok=True)
    info = json.loads(_run([go, "mod", "download", "-json", f"k8s.io/kubernetes@v{K8S_VERSION}"],
                           cwd=src, env=env))
    upstream = Path(info["GoMod"]).read_text()
    block = re.search(r"^replace \($(.*?)^\)", upstream, re.M | re.S)
    if block is None:
        raise RuntimeError(f"no replace block in k8s.io/kubernetes@v{K8S_VERSION}'s go.mod")
    staging = f"v0.{K8S_VERSION.split('.', 1)[1]}"
    pins = [f"\t{line.split()[0]} => {line.split()[0]} {staging}"
            for line in block.group(1).splitlines() if "=>" in line]
    (src / "go.mod").write_text(
        f"module k8sbuild\n\ngo 1.25.0\n\nrequire k8s.io/kubernetes v{K8S_VERSION}\n\n"
        "replace (\n" + "\n".join(pins) + "\n)\n")
    minor = K8S_VERSION.split(".")[1]
    ldflags = (f"-s -w -X k8s.io/component-base/version.gitVersion=v{K8S_VERSION} "
               f"-X k8s.io/component-base/version.gitMajor=1 "
               f"-X k8s.io/component-base/version.gitMinor={minor}")
    compiles = []
    for name in missing:
        package = f"k8s.io/kubernetes/cmd/{name}"
        _run([go, "get", f"{package}@v{K8S_VERSION}"], cwd=src, env=env)
        compiles.append(_Compile((go, "build", "-trimpath", "-ldflags", ldflags, "-o",
                                  str(tc.bin / name), package), src, env))
    return compiles


def _prepare_etcd(tc: Toolchain, env: dict[str, str]) -> list[_Compile]:
    if (tc.bin / "etcd").is_file():
        return []
    go = _go()
    src = tc.root / "src" / "etcd"
    src.mkdir(parents=True, exist_ok=True)
    pins = "".join(f"\tgo.etcd.io/etcd/{m} => go.etcd.io/etcd/{m} v{ETCD_VERSION}\n"
                   for m in ("api/v3", "client/pkg/v3", "client/v3", "pkg/v3"))
    (src / "go.mod").write_text(
        f"module etcdbuild\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 v{ETCD_VERSION}\n\n"
        f"replace (\n{pins})\n")
    _run([go, "get", f"go.etcd.io/etcd/server/v3@v{ETCD_VERSION}"], cwd=src, env=env)
    return [_Compile((go, "build", "-trimpath", "-ldflags", "-s -w", "-o", str(tc.bin / "etcd"),
                      "go.etcd.io/etcd/server/v3"), src, env)]


def _prepare_helm(tc: Toolchain, env: dict[str, str]) -> list[_Compile]:
    if (tc.bin / "helm").is_file():
        return []
    go = _go()
    src = tc.root / "src" / "helm"
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text("module helmbuild\n\ngo 1.24\n")
    _run([go, "get", f"helm.sh/helm/v3/cmd/helm@v{HELM_VERSION}"], cwd=src, env=env)
    # as Helm's own Makefile: without these, `helm template` and `helm lint` assume a
    # Kubernetes 1.20 and refuse charts that require a newer one
    major, minor = K8S_VERSION.split(".")[:2]
    ldflags = " ".join(["-s -w", f"-X helm.sh/helm/v3/internal/version.version=v{HELM_VERSION}",
                        *(f"-X helm.sh/helm/v3/pkg/{pkg}.k8sVersion{part}={value}"
                          for pkg in ("chartutil", "lint/rules")
                          for part, value in (("Major", major), ("Minor", minor)))])
    return [_Compile((go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(tc.bin / "helm"),
                      "helm.sh/helm/v3/cmd/helm"), src, env)]


def _prepare_pause(tc: Toolchain, env: dict[str, str]) -> list[_Compile]:
    if (tc.images / "pause.tar").is_file():
        return []
    src = tc.root / "src" / "pause"
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text("module pause\n\ngo 1.22\n")
    (src / "main.go").write_text(_PAUSE_GO)
    return [_Compile((_go(), "build", "-trimpath", "-ldflags", "-s -w", "-o",
                      str(src / "pause"), "."), src, dict(env, CGO_ENABLED="0"))]


def _node_binaries(tc: Toolchain) -> None:
    """containerd, runc, the CNI plugins and busybox from Debian's packages (unpacked here,
    not installed)."""
    if all((tc.bin / n).is_file() for n in ("containerd", "runc", "ctr")) and (
            tc.cni_bin / "bridge").is_file():
        return
    with tempfile.TemporaryDirectory(prefix="debs.", dir=tc.root) as tmp:
        work = Path(tmp)
        _run(["apt-get", "download", "-q", *DEBIAN_PACKAGES], cwd=work)
        for deb in sorted(work.glob("*.deb")):
            _run(["dpkg", "-x", str(deb), str(work / "x")])
        x = work / "x"
        tc.cni_bin.mkdir(parents=True, exist_ok=True)
        for source in ("usr/bin/containerd", "usr/bin/containerd-shim-runc-v2", "usr/bin/ctr",
                       "usr/sbin/runc", "bin/busybox"):
            shutil.copy2(x / source, tc.bin / Path(source).name)
        for plugin in ("bridge", "host-local", "loopback"):
            shutil.copy2(x / "usr/lib/cni" / plugin, tc.cni_bin / plugin)


def _pause_image(tc: Toolchain) -> None:
    source = tc.root / "src" / "pause" / "pause"
    if (tc.images / "pause.tar").is_file() or not source.is_file():
        return
    from tests.testbed import images

    with tempfile.TemporaryDirectory(prefix="pause.", dir=tc.root) as tmp:
        rootfs = Path(tmp)
        shutil.copy2(source, rootfs / "pause")
        images.write_archive(PAUSE_IMAGE, rootfs, tc.images / "pause.tar",
                             images.ImageConfig(entrypoint=["/pause"]))


PAUSE_IMAGE = "localhost/pause:3.10"


def build() -> Toolchain:
    """Build whatever of the pinned toolchain is missing (nothing once cached)."""
    ok, why = available()
    if not ok:
        raise Unavailable(why)
    tc = toolchain()
    if tc.complete:
        return tc
    tc.bin.mkdir(parents=True, exist_ok=True)
    lock = tc.root.parent / (tc.root.name + ".lock")
    with open(lock, "a+b") as fh:  # one builder at a time; the others wait and find it built
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        if tc.complete:
            return tc
        started = time.monotonic()
        _say(f"building Kubernetes {K8S_VERSION}, etcd {ETCD_VERSION}, Helm {HELM_VERSION} "
             f"into {tc.root} (once; about 8 minutes on two cores, more while others hold "
             f"{HEAVY_LOCK})")
        env = _go_env(tc)
        # downloads first, then every compile under one hold of the shared lock
        compiles = [*_prepare_kubernetes(tc, env), *_prepare_etcd(tc, env),
                    *_prepare_helm(tc, env), *_prepare_pause(tc, env)]
        _node_binaries(tc)
        if compiles:
            _say(f"waiting for {HEAVY_LOCK} to compile {len(compiles)} programs")
            with heavy_lock():
                for step in compiles:
                    _run(step.argv, cwd=step.cwd, env=step.env, nice=True)
        _pause_image(tc)
        if os.environ.get("GROUPGATE_KEEP_GO_CACHE", "") in ("", "0"):
            subprocess.run([_go(), "clean", "-modcache"], env=env, capture_output=True,
                           check=False)  # the module cache is read-only: rmtree alone fails
            shutil.rmtree(tc.root.parent / "go", ignore_errors=True)
            shutil.rmtree(tc.root / "src", ignore_errors=True)
        _say(f"built in {time.monotonic() - started:.0f}s")
    return tc


# -- images -------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
GROUPGATE_IMAGE = "localhost/groupgate:test"
CLIENT_IMAGE = "localhost/groupgate-client:test"
CLIENT_LIBRARY = "confluent-kafka==2.16.1"
CLIENT_STEPS = (
    "USER root",
    "COPY client/*.whl /tmp/wheels/",
    "RUN /opt/groupgate/bin/pip install --no-cache-dir --disable-pip-version-check --no-index "
    f"--find-links /tmp/wheels {CLIENT_LIBRARY.split('==')[0]} && rm -rf /tmp/wheels",
    "USER 10001",
)
"""The test pods' application image: the groupgate image plus librdkafka's Python client (an
unmodified client, run by the image's own Python)."""


def images(out_dir: Path) -> list[Path]:
    """The groupgate image (``deploy/Containerfile`` with a wheel built from this checkout)
    and the test pods' client image, as archives in ``out_dir`` (cached root file systems:
    seconds when nothing changed, a few minutes for the first Debian base)."""
    from tests.testbed import containerfile

    with tempfile.TemporaryDirectory(prefix="groupgate-context.") as tmp:
        context = Path(tmp)
        # the Containerfile's build context: wheels of groupgate and its dependencies (the
        # image build reaches only Debian's archive), and the client library's
        _run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--quiet",
              "--disable-pip-version-check", "-w", str(context / "dist"), str(ROOT)])
        _run([sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-deps",
              "--quiet", "--disable-pip-version-check", "-d", str(context / "client"),
              CLIENT_LIBRARY])
        made = [containerfile.build_image(CONTAINERFILE, context, GROUPGATE_IMAGE,
                                          out_dir / "groupgate.tar"),
                containerfile.build_image(CONTAINERFILE, context, CLIENT_IMAGE,
                                          out_dir / "groupgate-client.tar",
                                          extra_steps=CLIENT_STEPS)]
    return made


# -- the cluster --------------------------------------------------------------------------

ETCD_PORT = 23892
API_PORT = 16547
KUBELET_PORT = 10451
TOKEN = "groupgate-test-token"


class Cluster:
    """A running control plane and node (``with Cluster(tc, run_dir) as cluster: ...``).

    :meth:`start` brings up etcd, the API server, controller-manager, scheduler, containerd
    (with ``images`` imported) and the kubelet, and waits for a Ready node; :meth:`stop`
    removes everything, also what the kubelet and containerd leave outside ``run_dir``.
    """

    def __init__(self, tc: Toolchain, run_dir: Path, images: Sequence[Path] = ()) -> None:
        self.tc = tc
        self.run_dir = run_dir
        self.images = list(images)
        self.kubeconfig = run_dir / "kubeconfig"
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # processes

    def _start(self, name: str, argv: Sequence[str]) -> None:
        log = open(self.run_dir / "log" / f"{name}.log", "ab")  # noqa: SIM115 - owned by Popen
        self._procs[name] = proc = subprocess.Popen(
            ["nice", "-n", "10", *argv], stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        (self.run_dir / "pid").mkdir(exist_ok=True)
        (self.run_dir / "pid" / name).write_text(str(proc.pid))

    def _wait(self, what: str, seconds: float, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}) while waiting for "
                                       f"{what}; see {self.run_dir / 'log' / name}.log:\n"
                                       + self.log_tail(name))
            try:
                if check():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{what} not ready after {seconds:.0f}s (logs in {self.run_dir}/log)")

    def log_tail(self, name: str, lines: int = 20) -> str:
        try:
            text = (self.run_dir / "log" / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([self.tc.tool("kubectl"), f"--kubeconfig={self.kubeconfig}",
                               *args], input=input, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({proc.returncode}): "
                               f"{proc.stderr.strip()}")
        return proc

    def helm(self, *args: str, check: bool = True, timeout: float = 300
             ) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig),
                   HELM_CACHE_HOME=str(self.run_dir / "helm/cache"),
                   HELM_CONFIG_HOME=str(self.run_dir / "helm/config"),
                   HELM_DATA_HOME=str(self.run_dir / "helm/data"))
        proc = subprocess.run([self.tc.tool("helm"), *args], capture_output=True, text=True,
                              timeout=timeout, env=env, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)} failed ({proc.returncode}): "
                               f"{proc.stderr.strip()}")
        return proc

    def validate(self, manifests: str) -> subprocess.CompletedProcess[str]:
        """What the API server says of ``manifests`` (``kubectl apply --dry-run=server``)."""
        return self.kubectl("apply", "--dry-run=server", "-f", "-", input=manifests,
                            check=False)

    # lifecycle

    def start(self) -> None:
        started = time.monotonic()
        run = self.run_dir
        for sub in ("log", "pki", "etcd"):
            (run / sub).mkdir(parents=True, exist_ok=True)
        pki = run / "pki"
        _run(["openssl", "genrsa", "-out", str(pki / "sa.key"), "2048"])
        _run(["openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out",
              str(pki / "sa.pub")])
        (pki / "tokens.csv").write_text(f"{TOKEN},admin,admin,system:masters\n")
        etcd_url = f"http://127.0.0.1:{ETCD_PORT}"
        peer_url = f"http://127.0.0.1:{ETCD_PORT + 10}"
        self._start("etcd", [self.tc.tool("etcd"), "--name", "gg", "--data-dir", str(run / "etcd"),
                             "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls",
                             peer_url, "--initial-cluster", f"gg={peer_url}",
                             "--log-level", "warn"])
        self._wait("etcd", 60, lambda: _http_ok(f"{etcd_url}/health"))
        self._start("apiserver", [
            self.tc.tool("kube-apiserver"), f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={API_PORT}", f"--cert-dir={pki / 'serving'}",
            f"--token-auth-file={pki / 'tokens.csv'}", "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.98.0.0/16", "--endpoint-reconciler-type=none",
            "--kubelet-preferred-address-types=InternalIP"])
        self._wait("the API server's certificate", 120,
                   lambda: (pki / "serving" / "apiserver.crt").is_file())
        for args in (
            ["config", "set-cluster", "t", f"--server=https://127.0.0.1:{API_PORT}",
             f"--certificate-authority={pki / 'serving' / 'apiserver.crt'}", "--embed-certs"],
            ["config", "set-credentials", "t", f"--token={TOKEN}"],
            ["config", "set-context", "t", "--cluster=t", "--user=t"],
            ["config", "use-context", "t"],
        ):
            self.kubectl(*args)
        self._wait("the API server", 120,
                   lambda: self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0)
        common = [f"--kubeconfig={self.kubeconfig}",
                  f"--authentication-kubeconfig={self.kubeconfig}",
                  f"--authorization-kubeconfig={self.kubeconfig}", "--bind-address=127.0.0.1",
                  "--leader-elect=false"]
        self._start("controller-manager", [
            self.tc.tool("kube-controller-manager"), *common, f"--secure-port={API_PORT + 1}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            "--use-service-account-credentials=false"])
        self._start("scheduler", [self.tc.tool("kube-scheduler"), *common,
                                  f"--secure-port={API_PORT + 2}"])
        self._wait("the default service account", 120, lambda: self.kubectl(
            "get", "serviceaccount", "default", check=False).returncode == 0)
        self._node()
        _say(f"cluster up in {time.monotonic() - started:.1f}s (KUBECONFIG={self.kubeconfig})")

    def _node(self) -> None:
        run, tc = self.run_dir, self.tc
        c = run / "containerd"
        for sub in (c, run / "cni/net.d", run / "kubelet", run / "pod-logs"):
            sub.mkdir(parents=True, exist_ok=True)
        _cleanup_bridge()
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        _run(["ip", "addr", "add", f"{HOST_ADDRESS}/24", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])
        (run / "cni/net.d/10-groupgate.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "groupgate", "plugins": [{
                "type": "bridge", "bridge": BRIDGE, "isGateway": False, "ipMasq": False,
                "hairpinMode": True, "ipam": {
                    "type": "host-local", "dataDir": str(run / "cni/ipam"),
                    "ranges": [[{"subnet": POD_CIDR, "gateway": HOST_ADDRESS}]],
                    "routes": [{"dst": "0.0.0.0/0", "gw": HOST_ADDRESS}]}}]}))
        (c / "config.toml").write_text(f"""\
version = 2
root = "{c}/root"
state = "{c}/state"
[grpc]
  address = "{c}/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "{c}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  netns_mounts_under_state_dir = true
  # runc cannot set a negative oom_score_adj without CAP_SYS_RESOURCE
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      BinaryName = "{tc.bin}/runc"
      Root = "{c}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{tc.cni_bin}"
    conf_dir = "{run}/cni/net.d"
""")
        env_path = f"{tc.bin}:{os.environ.get('PATH', '')}"  # the shim is found on PATH
        self._start("containerd", ["env", f"PATH={env_path}", tc.tool("containerd"),
                                   "--config", str(c / "config.toml")])
        sock = str(c / "containerd.sock")
        self._wait("containerd", 60, lambda: subprocess.run(
            [tc.tool("ctr"), "-a", sock, "version"], capture_output=True,
            check=False).returncode == 0)
        for image in [tc.images / "pause.tar", *self.images]:
            _run([tc.tool("ctr"), "-a", sock, "-n", "k8s.io", "images", "import",
                  "--all-platforms", str(image)])
        (run / "kubelet.yaml").write_text(f"""\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {HOST_ADDRESS}
port: {KUBELET_PORT}
readOnlyPort: 0
healthzPort: 0
authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}
authorization: {{mode: AlwaysAllow}}
cgroupDriver: cgroupfs
failCgroupV1: false
containerRuntimeEndpoint: unix://{sock}
podLogsDir: {run}/pod-logs
failSwapOn: false
makeIPTablesUtilChains: false
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
""")
        self._start("kubelet", [tc.tool("kubelet"), f"--config={run / 'kubelet.yaml'}",
                                f"--kubeconfig={self.kubeconfig}", f"--root-dir={run / 'kubelet'}",
                                f"--cert-dir={run / 'kubelet/pki'}",
                                f"--hostname-override={NODE_NAME}", f"--node-ip={HOST_ADDRESS}"])
        self._wait("the node", 240, lambda: self.kubectl(
            "wait", "--for=condition=Ready", f"node/{NODE_NAME}", "--timeout=1s",
            check=False).returncode == 0)

    def stop(self) -> None:
        self._stop("kubelet")
        self.kill_containers()
        for name in ("containerd", "scheduler", "controller-manager", "apiserver", "etcd"):
            self._stop(name)
        _cleanup_outside(self.run_dir)

    def kill_containers(self) -> None:
        """Kill and remove every container of the node (through containerd)."""
        sock = self.run_dir / "containerd" / "containerd.sock"
        if sock.exists():
            ctr = [self.tc.tool("ctr"), "-a", str(sock), "-n", "k8s.io"]

            def ids(*what: str) -> list[str]:
                out = subprocess.run([*ctr, *what, "ls", "-q"], capture_output=True, text=True,
                                     check=False).stdout
                return out.split()

            for task in ids("tasks"):
                subprocess.run([*ctr, "tasks", "kill", "-s", "SIGKILL", task],
                               capture_output=True, check=False)
            time.sleep(1)
            for task in ids("tasks"):
                subprocess.run([*ctr, "tasks", "delete", "-f", task], capture_output=True,
                               check=False)
            for container in ids("containers"):
                subprocess.run([*ctr, "containers", "delete", container], capture_output=True,
                               check=False)

    def _stop(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _http_ok(url: str) -> bool:
    import urllib.request

    with urllib.request.urlopen(url, timeout=2) as response:
        return bool(response.status == 200)


def _cleanup_bridge() -> None:
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)


def _cleanup_outside(run_dir: Path) -> None:
    """Undo what the node leaves behind: mounts under ``run_dir``, pod cgroups, the bridge,
    and the few paths kubelet 1.35 and containerd 1.6 write outside their directories."""
    mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True,
                            check=False).stdout.split("\n")
    for mount in sorted((m for m in mounts if m.startswith(f"{run_dir}/")), reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
    for hierarchy in Path("/sys/fs/cgroup").glob("*/kubepods"):
        for directory in sorted((p for p in hierarchy.rglob("*") if p.is_dir()),
                                key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            hierarchy.rmdir()
    _cleanup_bridge()
    logs = Path("/var/log/containers")
    if logs.is_dir():
        for link in logs.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(f"{run_dir}/"):
                    link.unlink()
    for result in Path("/var/lib/cni/results").glob("groupgate-*"):
        with contextlib.suppress(OSError):
            result.unlink()
    left = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True,
                          check=False).stdout.split("\n")
    if any(m.startswith(f"{run_dir}/") for m in left):
        # a volume still mounted (a hostPath, the host's files): never remove through it
        _say(f"mounts left under {run_dir}: not removing it")
        return
    shutil.rmtree(run_dir, ignore_errors=True)


@contextlib.contextmanager
def running(run_dir: Path | None = None) -> Iterator[Cluster]:
    """Build if needed, then a started cluster with the groupgate images imported."""
    tc = build()
    with contextlib.ExitStack() as stack:
        if run_dir is None:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(
                prefix="groupgate-k8s.", ignore_cleanup_errors=True)))
        made = images(tc.root.parent / "images")
        with Cluster(tc, run_dir, made) as cluster:
            yield cluster


DEFAULT_RUN_DIR = Path("/tmp/groupgate-k8s")
STOP_ORDER = ("kubelet", "containerd", "scheduler", "controller-manager", "apiserver", "etcd")


def down(run_dir: Path) -> None:
    """Stop what a cluster left running in ``run_dir`` (by its pid files) and clean up."""
    tc = toolchain()
    cluster = Cluster(tc, run_dir)
    for name in STOP_ORDER:
        try:
            pid = int((run_dir / "pid" / name).read_text())
        except (OSError, ValueError):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
        for _ in range(40):
            try:
                os.killpg(pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.25)
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        if name == "kubelet":
            cluster.kill_containers()  # through containerd, still running
    _cleanup_outside(run_dir)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testbed.kubernetes",
                                     description="The test bed's Kubernetes: build (once, "
                                     "cached), up (until Ctrl-C), down (clean up after a crash).")
    parser.add_argument("command", choices=("build", "up", "down"))
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            tc = build()
            images(tc.root.parent / "images")
            print(tc.root)
        elif args.command == "down":
            down(args.run_dir)
        else:
            if args.run_dir.exists():
                down(args.run_dir)
            stopping = threading.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: stopping.set())
            with running(args.run_dir) as cluster:
                print(f"export KUBECONFIG={cluster.kubeconfig}\n"
                      f"kubectl: {cluster.tc.tool('kubectl')}, helm: {cluster.tc.tool('helm')}\n"
                      f"pods reach the host at {HOST_ADDRESS}; Ctrl-C stops the cluster",
                      flush=True)
                stopping.wait()
    except Unavailable as exc:
        print(f"kubernetes test bed unavailable: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
