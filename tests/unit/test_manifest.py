"""The shipped Kubernetes manifest (``deploy/kubernetes/sidecar-deployment.yaml``) configures
what the docs say: every GROUPGATE_ variable is a real setting, several replicas form a fleet
(each sidecar has a fleet listener on its pod's own address), and readiness depends on the
cluster only, never on a group having a coordinator."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from proxy import config

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "kubernetes" / "sidecar-deployment.yaml"


def _documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def _sidecar() -> dict[str, Any]:
    (deployment,) = [d for d in _documents() if d["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    (sidecar,) = [c for c in spec["initContainers"] if c["name"] == "groupgate"]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar
    return dict(sidecar, replicas=deployment["spec"]["replicas"])


def _environment(sidecar: dict[str, Any], pod_ip: str) -> dict[str, str]:
    """The sidecar's environment as the kubelet gives it (dependent variables expanded)."""
    env: dict[str, str] = {}
    for item in sidecar["env"]:
        if "valueFrom" in item:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
            env[item["name"]] = pod_ip
        else:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)],
                                       str(item["value"]))
    return env


def test_every_groupgate_variable_is_a_setting() -> None:
    known = {s.env for s in config.SETTINGS}
    names = {item["name"] for item in _sidecar()["env"] if item["name"].startswith("GROUPGATE_")}
    assert names and names <= known, names - known


def test_several_replicas_form_a_fleet_on_the_pods_addresses() -> None:
    sidecar = _sidecar()
    assert sidecar["replicas"] > 1
    loaded = config.load(None, _environment(sidecar, "10.1.2.3"))
    assert loaded.listen == ("127.0.0.1", 9092)  # the app reaches it on the pod's loopback
    assert loaded.fleet_listen is not None and loaded.fleet_listen[0] == "10.1.2.3"
    assert loaded.advertised_fleet_address == loaded.fleet_listen
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports["fleet"] == loaded.fleet_listen[1]
    policies = [d for d in _documents() if d["kind"] == "NetworkPolicy"]
    assert [p["spec"]["ingress"][0]["ports"][0]["port"] for p in policies] == [ports["fleet"]]


def test_readiness_is_about_the_cluster_not_a_group() -> None:
    sidecar = _sidecar()
    for probe in ("startupProbe", "readinessProbe"):
        assert sidecar[probe]["httpGet"]["path"] == "/readyz"
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/livez"
