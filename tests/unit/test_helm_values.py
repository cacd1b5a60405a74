"""The Helm chart's values (helm/mship/values.yaml): broken values fail the render, naming the value
(values.schema.json, templates/_validate.tpl), and the chart's README names every value."""

from __future__ import annotations

from typing import Any

import helm_python
import pytest

from tests.unit.test_helm_chart import CHART


@pytest.fixture(scope="module")
def chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART)


def group(**overrides: Any) -> dict:
    base = {"name": "g", "replicas": 1, "minReplicas": 0, "maxReplicas": 2, "capabilities": ["vllm"],
            "resources": {"limits": {"cpu": "8", "memory": "32Gi"}}}
    return {**base, **overrides}


BROKEN = {
    "gpu group without a GPU resource": ({"workerGroups": [group(gpu=True)]},
                                         "'/workerGroups/0/resources/limits': missing property 'nvidia.com/gpu'"),
    "GCS FT on, no Redis address": ({"redis": {"internal": {"enabled": False}}, "ray": {"gcsFaultTolerance":
                                     {"enabled": True}}}, "'/redis/address'"),
    "a misspelled key": ({"workerGroup": []}, "additional properties 'workerGroup' not allowed"),
    "an unknown capability": ({"workerGroups": [group(capabilities=["tpu"])]},
                              "'/workerGroups/0/capabilities/0': value must be one of 'vllm', 'llama_cpp'"),
    "no CPU limit": ({"workerGroups": [group(resources={"requests": {"cpu": "8"}})]},
                     "'/workerGroups/0/resources': missing property 'limits'"),
    "replicas above maxReplicas": ({"workerGroups": [group(replicas=3)]},
                                   "workerGroups[0] (g): replicas 3 must lie between minReplicas 0 and maxReplicas 2"),
    "a loader no node runs": ({"workerGroups": [group(capabilities=["llama_cpp"])],
                               "models": [{"name": "m", "model": "org/m", "loader": "vllm"}]},
                              "models[0] (m): loader vllm runs on no node"),
    "two groups of one name": ({"workerGroups": [group(), group()]}, 'workerGroups[1].name: "g" is used twice'),
    "a group hosting nothing": ({"workerGroups": [group(), group(name="h", capabilities=[])]},
                                "workerGroups[1] (h): no capabilities and no gateway"),
    "gateway max below min": ({"gateway": {"minReplicas": 3, "maxReplicas": 2}},
                              "gateway.maxReplicas 2 is below gateway.minReplicas 3"),
    "a PodMonitor without metrics": ({"observability": {"metricsPort": 0, "podMonitor": {"enabled": True}}},
                                     "observability.podMonitor.enabled needs observability.metricsPort above 0"),
    "a GCS port in Ray's worker range": ({"ray": {"gcsPort": 16380}}, "'/ray/gcsPort'"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_broken_values_fail_the_render_naming_the_value(chart: helm_python.Chart, case: str) -> None:
    values, message = BROKEN[case]
    with pytest.raises(helm_python.HelmError) as failure:
        chart.render(values, name="demo", namespace="ai")
    assert message in str(failure.value)


OPAQUE = {"resources", "nodeSelector", "affinity", "podAnnotations", "podLabels", "labels", "annotations",
          "podSecurityContext", "securityContext", "models", "seccompProfile"}


def leaves(values: Any, path: str = "") -> list[str]:
    if isinstance(values, dict) and values and path.rsplit(".", 1)[-1] not in OPAQUE:
        return [leaf for k, v in values.items() for leaf in leaves(v, f"{path}.{k}" if path else k)]
    if isinstance(values, list) and values and isinstance(values[0], dict) and path not in OPAQUE:
        return leaves(values[0], f"{path}[]")
    return [path]


def test_every_value_is_documented(chart: helm_python.Chart) -> None:
    """helm/mship/README.md names every value (a row may name siblings as `parent.a`, `.b`)."""
    lines = (CHART / "README.md").read_text().splitlines()
    missing = []
    for leaf in leaves(chart.values):
        parent, _, key = leaf.rpartition(".")
        if not any(f"`{leaf}`" in line or (parent and f"`{parent}." in line and f"`.{key}`" in line)
                   for line in lines):
            missing.append(leaf)
    assert missing == []
