"""The Helm chart in a real Kubernetes (the test bed's single node,
:mod:`tests.testbed.kubernetes`): a three-replica consumer Deployment whose pods run an
unmodified librdkafka client (confluent-kafka, ``group.protocol=consumer``, by the image's own
Python: ``tests/benchmarks/soak/member.py`` from a ConfigMap) behind groupgate as a native
sidecar, in front of a Kafka 3.9 broker on the host (reached at the node's bridge address).

While a producer on the host writes continuously, the Deployment goes through
``kubectl rollout restart``, a scale from 3 to 5 and back to 3, a forced delete of the pod whose
sidecar coordinates the group, an eviction refused by the chart's PodDisruptionBudget and a
``helm upgrade`` from the chart as first committed to today's, with changed settings.
Throughout: no partition owned by two members at once (on the members' own callback
timelines), every record consumed, committed offsets (polled from the broker) never moving
backwards, and after every step the group served
again by exactly one coordinating sidecar (by every sidecar's ``groupgate_groups_held`` and by
the broker, whose group has that sidecar's pod as its only member), each member owning
partitions, and the records produced after the step consumed.

What each step took is printed (``-rA`` shows it) and written to ``steps.json`` in the test's
directory, with the sidecars' logs (``pod-logs/``, copied while the pods run) for a failure.

Slow (minutes; ``--run-slow``): the cluster is built on first use (about 8 minutes, cached).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import tarfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.benchmarks.rebalance.timeline import Event, overlaps
from tests.benchmarks.soak.checks import Intervals, OffsetWatch, add_run, missing
from tests.testbed import kubernetes
from tests.testbed.broker import KafkaBroker
from tests.unit.test_chart import own_chart

pytestmark = [pytest.mark.slow, pytest.mark.broker]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "groupgate"
FIRST_CHART_COMMIT = "290367b"
"""The commit that added the chart: the test installs the chart as it was first committed and
upgrades it to today's."""


def first_chart(tmp_path: Path) -> Path:
    """The chart as it was first committed, extracted from the repository's history."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", FIRST_CHART_COMMIT,
                              "deploy/helm/groupgate"], capture_output=True, check=True)
    dest = tmp_path / "first-chart"
    dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "deploy" / "helm" / "groupgate"
MEMBER = ROOT / "tests" / "benchmarks" / "soak" / "member.py"
RELEASE = "orders"
TOPIC = GROUP = "orders"
PARTITIONS = 6
SELECTOR = f"app.kubernetes.io/name={RELEASE},app.kubernetes.io/instance={RELEASE}"
SETTLE_SECONDS = 180.0
"""Longest the group may take to be served again after a step (a failure names the step)."""


@pytest.fixture(scope="module")
def broker(kubernetes_cluster: kubernetes.Cluster, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[KafkaBroker]:
    """Kafka 3.9 on the host, listening on the node's bridge address (pods reach it there)."""
    with KafkaBroker.start("3.9", tmp_path_factory.mktemp("kafka"),
                           host=kubernetes.HOST_ADDRESS) as started:
        started.create_topic(TOPIC, PARTITIONS, 1)
        yield started


class Producer:
    """Numbered records to every partition, continuously, acknowledged offsets counted."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Producer as KafkaProducer

        self._producer = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                        "acks": "all"})
        self.produced: dict[int, int] = {}
        """partition -> highest acknowledged offset + 1."""
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err: Any, message: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
            return
        partition, offset = message.partition(), message.offset()
        self.produced[partition] = max(self.produced.get(partition, 0), offset + 1)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            for _ in range(20):
                self._producer.produce(TOPIC, value=str(n).encode(), partition=n % PARTITIONS,
                                       on_delivery=self._delivered)
                n += 1
            self._producer.poll(0)
            time.sleep(0.1)  # about 200 records a second
        self._producer.flush(30)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


class OffsetPoller:
    """The group's committed offsets, polled from the broker (an OffsetFetch of a client that
    never joins the group), into an :class:`OffsetWatch`."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Consumer

        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP,
                                   "enable.auto.commit": False})
        self.watch = OffsetWatch()
        self.latest: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def poll_once(self) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            result = self._consumer.committed(
                [TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=10)
        except KafkaException:  # the broker busy or the group moving: next poll
            return
        committed = {tp.partition: tp.offset for tp in result
                     if tp.error is None and tp.offset >= 0}
        self.latest = committed
        self.watch.observe(time.monotonic(), GROUP, committed)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.poll_once()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._consumer.close()


class PodLogs:
    """The sidecars' logs, copied from the node's pod log directory every second, so that the
    logs of pods the test replaces are kept for a failure's diagnosis."""

    def __init__(self, source: Path, target: Path) -> None:
        self.source = source
        self.target = target
        self.target.mkdir()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def copy(self) -> None:
        for log in self.source.glob("default_*/groupgate/*.log"):
            pod = log.parent.parent.name.split("_")[1]
            with contextlib.suppress(OSError):
                shutil.copyfile(log, self.target / f"{pod}-{log.stem}.log")  # stem: restarts

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.copy()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.copy()

    def count(self, text: str) -> int:
        """Lines of the sidecars' logs containing ``text``."""
        return sum(line.count(text) for log in self.target.glob("*.log")
                   for line in log.read_text(errors="replace").splitlines())


class Members:
    """What the members wrote (JSON lines in the events directory, one file per pod)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.crashed: set[str] = set()

    def lines(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for path in sorted(self.directory.glob("*.jsonl")):
            parsed = []
            for line in path.read_text().splitlines():
                try:
                    parsed.append(json.loads(line))
                except ValueError:
                    break  # a line being written
            out[path.stem] = parsed
        return out

    def events(self) -> list[Event]:
        events = []
        for member, lines in self.lines().items():
            for line in lines:
                kind = line["e"]
                if kind in ("join", "assign", "revoke", "lost", "stall", "resume", "leave"):
                    events.append(Event(line["t"], member, kind, tuple(line.get("p", ()))))
            if member in self.crashed and lines and lines[-1]["e"] != "closed":
                # killed: it owned nothing after the last thing it did
                events.append(Event(lines[-1]["t"], member, "crash"))
        return sorted(events)

    def consumed(self) -> dict[int, Intervals]:
        runs: dict[int, Intervals] = {}
        for lines in self.lines().values():
            for line in lines:
                if line["e"] == "c":
                    for partition, first, last in line["r"]:
                        runs[partition] = add_run(runs.get(partition, []), first, last)
        return runs

    def owners(self, live: set[str]) -> dict[str, set[int]]:
        """What each live member owns now, by its own callbacks."""
        owned: dict[str, set[int]] = {m: set() for m in live}
        for event in self.events():
            if event.member not in owned:
                continue
            if event.kind == "assign":
                owned[event.member] |= set(event.partitions)
            elif event.kind in ("revoke", "lost"):
                owned[event.member] -= set(event.partitions)
            elif event.kind in ("leave", "crash"):
                owned[event.member] = set()
        return owned


def _values(events: Path, **changes: Any) -> dict[str, Any]:
    app = {
        "name": "app",
        "image": kubernetes.CLIENT_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c",
                    "exec python /member/member.py --library confluent --protocol consumer "
                    f"--commit async --bootstrap 127.0.0.1:9092 --topic {TOPIC} --group {GROUP} "
                    "--name $POD_NAME --max-poll-interval-ms 30000 "
                    ">> /events/$POD_NAME.jsonl 2>> /events/$POD_NAME.err"],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "volumeMounts": [{"name": "member", "mountPath": "/member"},
                         {"name": "events", "mountPath": "/events"}],
        "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}},
    }
    image, _, tag = kubernetes.GROUPGATE_IMAGE.rpartition(":")
    values: dict[str, Any] = {
        "image": {"repository": image, "tag": tag, "pullPolicy": "Never"},
        # a fleet's sessions cover a failover: 1 s + broker-session-timeout-ms (6 s) + 11 s
        "settings": {"group-session-timeout-ms": 18000, "group-heartbeat-interval-ms": 1000},
        "shutdownGrace": 10,
        "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}},
        "workload": {
            "enabled": True, "name": RELEASE, "replicas": 3, "terminationGracePeriodSeconds": 30,
            "containers": [app],
            "volumes": [{"name": "member", "configMap": {"name": f"{RELEASE}-member"}},
                        {"name": "events",
                         "hostPath": {"path": str(events), "type": "Directory"}}],
        },
    }
    values.update(changes)
    return values


class Deployment:
    """The release in the cluster and what the test does to it."""

    def __init__(self, cluster: kubernetes.Cluster, broker: KafkaBroker, work: Path) -> None:
        self.cluster = cluster
        self.broker = broker
        self.work = work
        self.events = work / "events"
        self.events.mkdir()
        self.events.chmod(0o1777)  # the pods' users write their own files
        self.members = Members(self.events)
        self.producer = Producer(broker.bootstrap)
        self.steps: list[tuple[float, str]] = []
        """(when the wait for the group to be served again began, the step before it)."""
        self.summary: list[dict[str, Any]] = []
        """Per step: how long until the group was served again and its records consumed."""
        self.pod_logs = PodLogs(cluster.run_dir / "pod-logs", work / "pod-logs")
        from confluent_kafka.admin import AdminClient

        self.admin = AdminClient({"bootstrap.servers": broker.bootstrap})

    def kubectl(self, *args: str, **kwargs: Any) -> Any:
        return self.cluster.kubectl(*args, **kwargs)

    def helm_values(self, name: str, values: dict[str, Any]) -> Path:
        path = self.work / name
        path.write_text(yaml.safe_dump(values))
        return path

    def pods(self) -> list[dict[str, Any]]:
        out = self.kubectl("get", "pods", "-l", SELECTOR, "-o", "json").stdout
        return [p for p in json.loads(out)["items"]
                if p["metadata"].get("deletionTimestamp") is None]

    def ready_pods(self) -> dict[str, str]:
        """Ready pods: name -> pod IP."""
        ready = {}
        for pod in self.pods():
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            if conditions.get("Ready") == "True" and pod["status"].get("podIP"):
                ready[pod["metadata"]["name"]] = pod["status"]["podIP"]
        return ready

    def groups_held(self, ip: str) -> float | None:
        try:
            with urllib.request.urlopen(f"http://{ip}:9644/metrics", timeout=3) as response:
                text = response.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("groupgate_groups_held "):
                return float(line.split()[1])
        return None

    def coordinators(self) -> list[str]:
        return [name for name, ip in self.ready_pods().items() if self.groups_held(ip) == 1.0]

    def broker_members(self) -> list[str] | None:
        """The hosts of the members of the broker's group (the sidecars holding it)."""
        from confluent_kafka import KafkaException

        try:
            description = self.admin.describe_consumer_groups([GROUP])[GROUP].result(timeout=10)
        except KafkaException:
            return None
        return [m.host.lstrip("/") for m in description.members]

    def settled(self, replicas: int) -> tuple[bool, str]:
        """Every replica ready, one coordinating sidecar (the broker's group has its pod as its
        only member), every partition owned by exactly one live member, every live member
        owning some."""
        ready = self.ready_pods()
        if len(ready) != replicas or len(self.pods()) != replicas:
            return False, f"{len(ready)} of {replicas} pods ready"
        coordinators = self.coordinators()
        if len(coordinators) != 1:
            return False, f"coordinating sidecars: {coordinators}"
        at_broker = self.broker_members()
        if at_broker != [ready[coordinators[0]]]:
            return False, (f"the broker's group has members at {at_broker}, not only the "
                           f"coordinating sidecar's pod {coordinators[0]} "
                           f"({ready[coordinators[0]]})")
        owned = self.members.owners(set(ready))
        counts = [sum(p in parts for parts in owned.values()) for p in range(PARTITIONS)]
        if counts != [1] * PARTITIONS or not all(owned.values()):
            return False, f"ownership {owned}"
        return True, "ok"

    def wait_settled(self, step: str, replicas: int) -> None:
        began = time.monotonic()
        self.steps.append((began, step))
        deadline = began + SETTLE_SECONDS
        why = ""
        while time.monotonic() < deadline:
            ok, why = self.settled(replicas)
            if ok:
                self.summary.append({"step": step, "replicas": replicas,
                                     "served_again_s": round(time.monotonic() - began, 1),
                                     "coordinator": self.coordinators()})
                return
            time.sleep(1)
        pytest.fail(f"after {step}: the group was not served again: {why}\n"
                    + self.diagnostics())

    def wait_consuming(self, step: str) -> None:
        """Records produced after ``step`` are consumed (progress, not just no violation)."""
        target = dict(self.producer.produced)
        began = time.monotonic()
        deadline = began + SETTLE_SECONDS
        while time.monotonic() < deadline:
            if not missing(target, self.members.consumed()):
                if self.summary and "caught_up_s" not in self.summary[-1]:
                    self.summary[-1].update(caught_up_s=round(time.monotonic() - began, 1),
                                            produced=sum(target.values()))
                return
            time.sleep(1)
        pytest.fail(f"after {step}: records not consumed: "
                    f"{missing(target, self.members.consumed())}\n" + self.diagnostics())

    def diagnostics(self) -> str:
        out = [f"steps: {self.summary}", f"the sidecars' logs: {self.pod_logs.target}",
               self.kubectl("get", "pods", "-o", "wide", check=False).stdout]
        for pod in self.pods():
            name = pod["metadata"]["name"]
            out.append(f"--- {name} groupgate")
            out.append(self.kubectl("logs", name, "-c", "groupgate", "--tail=30",
                                    check=False).stdout)
        return "\n".join(out)

    def around(self, t: float, partition: int, before: float = 20.0, after: float = 3.0
               ) -> str:
        """What the members did with ``partition`` around ``t`` (for a failure's message)."""
        lines = [(when, f"  step done: {step}") for when, step in self.steps
                 if t - before <= when <= t + after]
        for member, events in self.members.lines().items():
            for e in events:
                if not t - before <= e["t"] <= t + after:
                    continue
                kind = e["e"]
                if kind in ("assign", "revoke", "lost") and partition in e.get("p", ()):
                    lines.append((e["t"], f"{member} {kind} {e['p']}"))
                elif kind == "commit":
                    offsets = [o for p, o in e.get("o", []) if p == partition]
                    if offsets:
                        lines.append((e["t"], f"{member} commit ok={e['ok']} {offsets} "
                                              f"sent={e.get('sent', 0) - t:+.3f} {e['err'] or ''}"))
                elif kind == "c":
                    runs = [(a, b) for p, a, b in e["r"] if p == partition]
                    if runs:
                        lines.append((e["t"], f"{member} consumed {runs}"))
                elif kind in ("join", "leave", "closed"):
                    lines.append((e["t"], f"{member} {kind}"))
        return "\n".join(f"{when - t:+8.3f} {what}" for when, what in sorted(lines))

    def evict(self, pod: str) -> tuple[bool, str]:
        eviction = json.dumps({"apiVersion": "policy/v1", "kind": "Eviction",
                               "metadata": {"name": pod, "namespace": "default"}})
        proc = self.kubectl("create", "--raw",
                            f"/api/v1/namespaces/default/pods/{pod}/eviction", "-f", "-",
                            input=eviction, check=False)
        return proc.returncode == 0, proc.stderr + proc.stdout


SERVICE_MONITOR_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: servicemonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  names: {kind: ServiceMonitor, plural: servicemonitors, singular: servicemonitor}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
"""
"""A stand-in for the Prometheus Operator's CRD (its schema is not checked here)."""


def test_the_api_server_accepts_every_shape_of_the_chart(
        kubernetes_cluster: kubernetes.Cluster, tmp_path: Path) -> None:
    """``helm template | kubectl apply --dry-run=server`` (``helm install --dry-run=server``
    does not validate): the workload with Secrets and a ServiceMonitor, the objects for your
    own Deployment, your own chart including the sidecar, and a broken manifest refused."""
    cluster = kubernetes_cluster
    cluster.kubectl("apply", "-f", "-", input=SERVICE_MONITOR_CRD)
    cluster.kubectl("wait", "--for=condition=Established",
                    "crd/servicemonitors.monitoring.coreos.com", "--timeout=60s")
    shapes = {
        "workload": _values(tmp_path, upstream="10.245.0.1:9092",
                            sasl={"existingSecret": "kafka-user"},
                            tls={"existingSecret": "kafka-ca"},
                            fleetTls={"existingSecret": "fleet-tls"},
                            settings={"security-protocol": "SASL_SSL",
                                      "sasl-mechanism": "SCRAM-SHA-512"},
                            metrics={"serviceMonitor": {"enabled": True}},
                            podDisruptionBudget={"enabled": True, "minAvailable": 2},
                            fleet={"networkPolicy": {"extraIngress": [
                                {"ports": [{"protocol": "TCP", "port": 8080}]}]}}),
        "own deployment": {"upstream": "kafka:9092", "podSelector": {"app": "orders"},
                           "metrics": {"service": {"enabled": True}}},
    }
    for name, values in shapes.items():
        path = tmp_path / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        lint = cluster.helm("lint", "--strict", str(CHART), "-f", str(path), check=False)
        assert lint.returncode == 0, (name, lint.stdout)
        rendered = cluster.helm("template", RELEASE, str(CHART), "-f", str(path)).stdout
        validated = cluster.validate(rendered)
        assert validated.returncode == 0, (name, validated.stderr)
        assert "(server dry run)" in validated.stdout
    # an application's own chart with the sidecar included from groupgate's named templates
    chart = own_chart(tmp_path)
    rendered_own = cluster.helm("template", RELEASE, str(chart)).stdout
    validated = cluster.validate(rendered_own)
    assert validated.returncode == 0, validated.stderr
    assert "deployment.apps/orders created (server dry run)" in validated.stdout
    broken = rendered.replace("clusterIP: None", "clusterIP: Nowhere")
    assert cluster.validate(broken).returncode != 0


@pytest.mark.timeout(2400)
def test_a_consumer_deployment_through_restart_scaling_forced_delete_eviction_and_upgrade(
        kubernetes_cluster: kubernetes.Cluster, broker: KafkaBroker, tmp_path: Path) -> None:
    cluster = kubernetes_cluster
    deployment = Deployment(cluster, broker, tmp_path)
    cluster.kubectl("create", "configmap", f"{RELEASE}-member", f"--from-file={MEMBER}")
    values = _values(deployment.events, upstream=broker.bootstrap)

    # the chart's manifests, validated by the API server before anything is installed
    rendered = cluster.helm("template", RELEASE, str(CHART), "-f",
                            str(deployment.helm_values("values.yaml", values))).stdout
    validated = cluster.validate(rendered)
    assert validated.returncode == 0, validated.stderr

    producer = deployment.producer
    poller = OffsetPoller(broker.bootstrap)
    deployment.pod_logs.start()
    producer.start()
    poller.start()
    try:
        # installed as the chart was first committed; upgraded to today's at the end
        cluster.helm("install", RELEASE, str(first_chart(tmp_path)), "-f",
                     str(deployment.work / "values.yaml"), "--wait", "--timeout", "5m")
        deployment.wait_settled("install", 3)
        deployment.wait_consuming("install")

        cluster.kubectl("rollout", "restart", f"deployment/{RELEASE}")
        cluster.kubectl("rollout", "status", f"deployment/{RELEASE}", "--timeout=300s",
                        timeout=320)
        deployment.wait_settled("rollout restart", 3)
        deployment.wait_consuming("rollout restart")

        for replicas in (5, 3):
            cluster.kubectl("scale", f"deployment/{RELEASE}", f"--replicas={replicas}")
            cluster.kubectl("rollout", "status", f"deployment/{RELEASE}", "--timeout=300s",
                            timeout=320)
            deployment.wait_settled(f"scale to {replicas}", replicas)
            deployment.wait_consuming(f"scale to {replicas}")

        (coordinator,) = deployment.coordinators()
        deployment.members.crashed.add(coordinator)
        cluster.kubectl("delete", "pod", coordinator, "--force", "--grace-period=0")
        deployment.wait_settled(f"forced delete of the coordinating pod {coordinator}", 3)
        deployment.wait_consuming("forced delete")

        first, second = sorted(deployment.ready_pods())[:2]
        evicted, answer = deployment.evict(first)
        assert evicted, answer
        refused, answer = deployment.evict(second)  # the budget allows one at a time
        assert not refused and "disruption budget" in answer, answer
        deployment.wait_settled(f"eviction of {first}", 3)
        deployment.wait_consuming("eviction")
        assert second in deployment.ready_pods()  # the refused eviction left it alone

        # helm upgrade from the chart's first version to today's, with changed settings
        changed = tmp_path / "chart"
        shutil.copytree(CHART, changed)
        chart_yaml = yaml.safe_load((changed / "Chart.yaml").read_text())
        first_version = chart_yaml["version"]
        chart_yaml["version"] = first_version + "-changed"
        (changed / "Chart.yaml").write_text(yaml.safe_dump(chart_yaml))
        upgraded = _values(deployment.events, upstream=broker.bootstrap,
                           settings={"group-session-timeout-ms": 19000,
                                     "group-heartbeat-interval-ms": 1500})
        cluster.helm("upgrade", RELEASE, str(changed), "-f",
                     str(deployment.helm_values("upgraded.yaml", upgraded)), "--wait",
                     "--timeout", "5m")
        cluster.kubectl("rollout", "status", f"deployment/{RELEASE}", "--timeout=300s",
                        timeout=320)
        deployment.wait_settled("helm upgrade", 3)
        deployment.wait_consuming("helm upgrade")
        history = json.loads(cluster.helm("history", RELEASE, "-o", "json").stdout)
        assert [h["chart"] for h in history] == [f"groupgate-{first_version}",
                                                 f"groupgate-{first_version}-changed"]
        for pod in deployment.pods():
            (sidecar,) = pod["spec"]["initContainers"]
            env = {e["name"]: e.get("value") for e in sidecar["env"]}
            assert env["GROUPGATE_GROUP_SESSION_TIMEOUT_MS"] == "19000"
    finally:
        producer.stop()
    # every record consumed, and committed
    deployment.wait_consuming("the end")
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline and poller.latest != producer.produced:
        time.sleep(1)
    poller.stop()
    deployment.pod_logs.stop()
    commits = [line for lines in deployment.members.lines().values() for line in lines
               if line["e"] == "commit"]
    totals = {"produced": sum(producer.produced.values()),
              "consumed": sum(b - a + 1 for runs in deployment.members.consumed().values()
                              for a, b in runs),
              "commits_ok": sum(1 for c in commits if c["ok"]),
              "commits_failed": sum(1 for c in commits if not c["ok"]),
              "offset_polls": poller.watch.polls,
              "offsets_backwards": len(poller.watch.regressions),
              "fleet_unreachable_warnings": deployment.pod_logs.count(
                  "cannot be reached at its fleet address")}
    (tmp_path / "steps.json").write_text(json.dumps(
        {"steps": deployment.summary, "totals": totals}, indent=1))
    for step in deployment.summary:
        print(step)
    print(totals)
    assert not producer.errors, producer.errors[:5]
    assert missing(producer.produced, deployment.members.consumed()) == {}
    assert sum(producer.produced.values()) > 1000  # it ran
    assert poller.watch.regressions == [], (
        f"the sidecars' logs: {deployment.pod_logs.target}\n" + "\n".join(
            f"{r}\n{deployment.around(r.t, r.partition)}" for r in poller.watch.regressions[:3]))
    assert poller.watch.polls > 10
    assert poller.latest == producer.produced  # and committed
    double = overlaps(deployment.members.events())
    assert double == [], "\n".join(f"{o}\n{deployment.around(o.t, o.partition)}"
                                   for o in double[:3])
    members = deployment.members.lines()
    assert len(members) >= 3 + 3 + 2 + 1 + 1 + 3  # every pod that ran had a member
