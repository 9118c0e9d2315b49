"""The Helm chart (``deploy/helm/groupgate``) renders a sidecar that configures what the docs
say: every GROUPGATE_ variable is a real setting, any setting can be given in ``settings``
(unknown ones fail the rendering), the fleet listener is on every address with the pod IP from
the downward API as its address, readiness depends on the cluster only, and the budget, policy
and metrics objects select the application's pods. Rendering needs ``helm`` (the Kubernetes
test bed's, or one on PATH); without it these tests skip. ``_settings.tpl`` is generated from
the settings table: ``python -m tests.unit.test_chart`` rewrites it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy import config

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "groupgate"
SETTINGS_TEMPLATE = CHART / "templates" / "_settings.tpl"
APP = {"name": "app", "image": "example/orders-consumer:1.0",
       "env": [{"name": "KAFKA_BOOTSTRAP_SERVERS", "value": "localhost:9092"}]}


def settings_template() -> str:
    names = "\n".join(s.name for s in config.SETTINGS)
    return ("{{/* Generated from proxy/config.py's settings table by "
            "`python -m tests.unit.test_chart`: do not edit. */}}\n"
            '{{- define "groupgate.knownSettings" -}}\n' + names + "\n{{- end -}}\n")


def test_the_chart_knows_every_setting() -> None:
    assert SETTINGS_TEMPLATE.read_text() == settings_template(), (
        "regenerate with: python -m tests.unit.test_chart")


def _helm() -> str:
    from tests.testbed import kubernetes

    cached = kubernetes.toolchain().bin / "helm"
    found = str(cached) if cached.is_file() else shutil.which("helm")
    if found is None:
        pytest.skip("no helm (the Kubernetes test bed builds one: dev/kubernetes build)")
    return found


def render(values: dict[str, Any], *, check: bool = True) -> list[dict[str, Any]]:
    proc = subprocess.run([_helm(), "template", "orders", str(CHART), "-f", "-"],
                          input=yaml.safe_dump(values), capture_output=True, text=True,
                          timeout=60, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(proc.stderr)
    if proc.returncode != 0:
        raise ValueError(proc.stderr)
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def workload(**extra: Any) -> dict[str, Any]:
    return {"upstream": "kafka-0.kafka:9092,kafka-1.kafka:9092",
            "workload": {"enabled": True, "containers": [APP]}, **extra}


def _kind(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in documents if d["kind"] == kind]
    return found


def _sidecar(documents: list[dict[str, Any]]) -> dict[str, Any]:
    spec = _kind(documents, "Deployment")["spec"]["template"]["spec"]
    (sidecar,) = spec["initContainers"]
    assert sidecar["name"] == "groupgate" and sidecar["restartPolicy"] == "Always"
    return sidecar


def _environment(sidecar: dict[str, Any], pod_ip: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in sidecar["env"]:
        if "valueFrom" in item:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
            env[item["name"]] = pod_ip
        else:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)],
                                       str(item["value"]))
    return env


def test_helm_lint_is_clean() -> None:
    proc = subprocess.run([_helm(), "lint", "--strict", str(CHART), "--set",
                           "upstream=kafka:9092,podSelector.app=orders"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_sidecar_forms_a_fleet_on_the_pods_addresses() -> None:
    documents = render(workload())
    sidecar = _sidecar(documents)
    env = _environment(sidecar, "10.1.2.3")
    known = {s.env for s in config.SETTINGS}
    assert set(env) <= known, set(env) - known
    loaded = config.load(None, env)
    assert loaded.listen == ("127.0.0.1", 9092)  # the app reaches it on the pod's loopback
    assert loaded.upstream == (("kafka-0.kafka", 9092), ("kafka-1.kafka", 9092))
    assert loaded.fleet_listen == ("0.0.0.0", 9191)
    assert loaded.advertised_fleet_address == ("10.1.2.3", 9191)
    assert loaded.metrics_listen == ("0.0.0.0", 9644)
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports == {"fleet": 9191, "metrics": 9644}
    for probe in ("startupProbe", "readinessProbe"):
        assert sidecar[probe]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
    deployment = _kind(documents, "Deployment")
    pod = deployment["spec"]["template"]
    assert pod["spec"]["containers"] == [APP]
    assert pod["spec"]["terminationGracePeriodSeconds"] > loaded.shutdown_grace
    labels = deployment["spec"]["selector"]["matchLabels"]
    assert labels.items() <= pod["metadata"]["labels"].items()
    policy = _kind(documents, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == labels
    fleet_rule, metrics_rule = policy["spec"]["ingress"]
    assert fleet_rule["from"] == [{"podSelector": {"matchLabels": labels}}]
    assert fleet_rule["ports"] == [{"protocol": "TCP", "port": 9191}]
    assert metrics_rule["ports"] == [{"protocol": "TCP", "port": 9644}]
    budget = _kind(documents, "PodDisruptionBudget")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": labels}}


def test_every_setting_is_reachable_and_typed_as_groupgate_reads_it() -> None:
    settings = {"log-level": "DEBUG", "state-log": False, "group-empty-expiry-ms": 10000000,
                "connect-timeout": 2.5, "fleet-listen": "0.0.0.0:9300",
                "state-log-topic-config": "segment.ms=600000"}
    sidecar = _sidecar(render(workload(settings=settings, extraArgs=["--max-groups", "7"])))
    env = _environment(sidecar, "10.1.2.3")
    assert env["GROUPGATE_STATE_LOG"] == "off"
    assert env["GROUPGATE_GROUP_EMPTY_EXPIRY_MS"] == "10000000"  # no 1e+07
    loaded = config.load(None, env)
    assert loaded.log_level == "DEBUG" and not loaded.state_log
    assert loaded.group_empty_expiry_ms == 10_000_000 and loaded.connect_timeout == 2.5
    assert loaded.advertised_fleet_address == ("10.1.2.3", 9300)
    assert loaded.state_log_topic_config == (("segment.ms", "600000"),)
    assert sidecar["args"] == ["--max-groups", "7"]
    with pytest.raises(ValueError, match="no such setting"):
        render(workload(settings={"fleet-lisen": "0.0.0.0:1"}), check=False)
    with pytest.raises(ValueError, match="upstream"):
        render({"workload": {"enabled": True, "containers": [APP]}}, check=False)


def test_the_network_policy_can_admit_the_application_s_own_ports() -> None:
    """A pod a NetworkPolicy selects accepts only what some policy admits (where policies are
    enforced): the application's own ports are added to the chart's policy."""
    own = {"ports": [{"protocol": "TCP", "port": 8080}]}
    policy = _kind(render(workload(fleet={"networkPolicy": {"extraIngress": [own]}})),
                   "NetworkPolicy")
    assert len(policy["spec"]["ingress"]) == 3 and policy["spec"]["ingress"][2] == own
    assert len(_kind(render(workload()), "NetworkPolicy")["spec"]["ingress"]) == 2


def test_credentials_and_tls_come_from_secrets_as_files() -> None:
    documents = render(workload(
        settings={"security-protocol": "SASL_SSL", "sasl-mechanism": "SCRAM-SHA-512"},
        sasl={"existingSecret": "kafka-user"}, tls={"existingSecret": "kafka-ca"},
        secretMounts=[{"name": "listener", "secretName": "listener-tls",
                       "mountPath": "/etc/groupgate/listener"}]))
    sidecar = _sidecar(documents)
    env = _environment(sidecar, "10.1.2.3")
    assert env["GROUPGATE_SASL_USERNAME_FILE"] == "/etc/groupgate/sasl/username"
    assert env["GROUPGATE_SASL_PASSWORD_FILE"] == "/etc/groupgate/sasl/password"
    assert env["GROUPGATE_TLS_CA_FILE"] == "/etc/groupgate/tls/ca.crt"
    assert "GROUPGATE_TLS_CERT_FILE" not in env and "GROUPGATE_SASL_PASSWORD" not in env
    mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    assert mounts == {"groupgate-sasl": "/etc/groupgate/sasl",
                      "groupgate-tls": "/etc/groupgate/tls", "listener": "/etc/groupgate/listener"}
    volumes = _kind(documents, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {v["name"]: v["secret"]["secretName"] for v in volumes} == {
        "groupgate-sasl": "kafka-user", "groupgate-tls": "kafka-ca", "listener": "listener-tls"}


def test_metrics_service_and_service_monitor_are_optional() -> None:
    assert not [d for d in render(workload()) if d["kind"] in ("Service", "ServiceMonitor")]
    documents = render(workload(metrics={"serviceMonitor": {"enabled": True}}))
    service = _kind(documents, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    monitor = _kind(documents, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"][
        "labels"].items()
    assert "helm.sh/chart" not in monitor["spec"]["selector"]["matchLabels"]  # stable


INCLUDE_SIDECAR = ('{{- include "groupgate.sidecar" (dict "Values" .Values.groupgate '
                   '"Release" .Release "Chart" .Chart) | nindent 8 }}')
OWN_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: orders}
spec:
  replicas: 3
  selector: {matchLabels: {app: orders}}
  template:
    metadata: {labels: {app: orders}}
    spec:
      terminationGracePeriodSeconds: 40
      initContainers:
        INCLUDE_SIDECAR
      containers:
        - name: app
          image: example/orders-consumer:1.0
          env: [{name: KAFKA_BOOTSTRAP_SERVERS, value: "localhost:9092"}]
      volumes:
        {{- include "groupgate.volumes" (dict "Values" .Values.groupgate) | nindent 8 }}
"""
"""An application's own Deployment with the sidecar included as docs/operations.md says."""


def own_chart(directory: Path) -> Path:
    """An application's own chart in ``directory`` that depends on groupgate and includes its
    named templates in its pod spec (docs/operations.md, "Your own chart")."""
    chart = directory / "orders"
    (chart / "templates").mkdir(parents=True)
    shutil.copytree(CHART, chart / "charts" / "groupgate")
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    (chart / "Chart.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v2", "name": "orders", "version": "1.0.0", "appVersion": "1.0",
        "dependencies": [{"name": "groupgate", "version": version}]}))
    (chart / "values.yaml").write_text(yaml.safe_dump({"groupgate": {
        "upstream": "kafka:9092", "image": {"tag": version}, "podSelector": {"app": "orders"},
        "sasl": {"existingSecret": "kafka-user"}}}))
    (chart / "templates" / "deployment.yaml").write_text(
        OWN_DEPLOYMENT.replace("INCLUDE_SIDECAR", INCLUDE_SIDECAR))
    return chart


def test_your_own_chart_includes_the_sidecar_and_the_chart_selects_its_pods(
        tmp_path: Path) -> None:
    proc = subprocess.run([_helm(), "template", "orders", str(own_chart(tmp_path))],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    documents = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert sorted(d["kind"] for d in documents) == [
        "Deployment", "NetworkPolicy", "PodDisruptionBudget"]
    sidecar = _sidecar(documents)
    env = _environment(sidecar, "10.1.2.3")
    assert env.pop("GROUPGATE_SASL_USERNAME_FILE") == "/etc/groupgate/sasl/username"
    assert env.pop("GROUPGATE_SASL_PASSWORD_FILE") == "/etc/groupgate/sasl/password"
    loaded = config.load(None, env)
    assert loaded.upstream == (("kafka", 9092),)
    assert loaded.advertised_fleet_address == ("10.1.2.3", 9191)
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    assert sidecar["image"] == f"groupgate:{version}"
    pod = _kind(documents, "Deployment")["spec"]["template"]
    assert pod["spec"]["volumes"] == [{"name": "groupgate-sasl",
                                       "secret": {"secretName": "kafka-user"}}]
    for kind in ("NetworkPolicy", "PodDisruptionBudget"):
        selector = _kind(documents, kind)["spec"]
        labels = selector.get("podSelector", selector.get("selector"))["matchLabels"]
        assert labels.items() <= pod["metadata"]["labels"].items()


def test_for_your_own_deployment_the_chart_renders_only_what_selects_your_pods() -> None:
    documents = render({"upstream": "kafka:9092", "podSelector": {"app": "orders"}})
    assert sorted(d["kind"] for d in documents) == ["NetworkPolicy", "PodDisruptionBudget"]
    assert _kind(documents, "PodDisruptionBudget")["spec"]["selector"] == {
        "matchLabels": {"app": "orders"}}
    with pytest.raises(ValueError, match="podSelector"):
        render({"upstream": "kafka:9092"}, check=False)


if __name__ == "__main__":
    SETTINGS_TEMPLATE.write_text(settings_template())
    print(f"wrote {SETTINGS_TEMPLATE}")
