"""The Helm chart (helm/mship), checked here without a cluster: rendered by Helm's own SDK for the
default, GPU and multi-group values, every manifest validated against the Kubernetes schemas
(kubernetes-validate) and the custom resources against their CRDs' schemas (tests/data/crds/:
KubeRay's RayCluster, the Prometheus Operator's PodMonitor and PrometheusRule), unknown fields
refused as the API server would prune them. Then the contract with the code: the flags the
containers pass parse with the CLI's own parser, the ports agree, the capability resources and
environment variables are the ones the code reads. (The values themselves: test_helm_values.py.)"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from clients import cli
from clients.modelset import load_model_set
from services.cluster.capabilities import SLOTS, parse
from services.cluster.telemetry import DEFAULT_METRICS_PORT
from services.common import vocabulary
from services.common.vocabulary import GATEWAY_RESOURCE, IMPLEMENTED_LOADERS, LOADERS, capability_resource

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "mship"
CRDS = ROOT / "tests" / "data" / "crds"
KUBE_VERSION = "1.31"  # the oldest Kubernetes the chart supports (Job podFailurePolicy is GA there)
VALUE_SETS = {
    "default": {},
    "gpu": yaml.safe_load((CHART / "examples" / "values-gpu.yaml").read_text()),
    "multi-group": yaml.safe_load((CHART / "examples" / "values-multi-group.yaml").read_text()),
}
CRD_SCHEMAS = {("ray.io/v1", "RayCluster"): "raycluster-v1.schema.json",
               ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-v1.schema.json",
               ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-v1.schema.json"}


@pytest.fixture(scope="module")
def chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART)


def render(chart: helm_python.Chart, values: dict | None = None) -> list[dict[str, Any]]:
    out = chart.render(values, name="demo", namespace="ai", is_install=True)
    docs = [d for name, text in sorted(out.items()) if not name.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]
    return docs


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def the(docs: list[dict], kind: str) -> dict:
    (doc,) = of_kind(docs, kind)
    return doc


def strict(schema: Any) -> Any:
    """A CRD schema as the API server applies it: fields it does not know are refused here (the
    server would silently prune them, which is how a misspelled option goes unnoticed)."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        if isinstance(schema.get("pattern"), str) and schema["pattern"].startswith("^(?i)"):
            schema["pattern"] = "(?i)^" + schema["pattern"][5:]  # Go's inline flag; Python wants it first
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def crd_validators() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    return {key: jsonschema.Draft7Validator(strict(json.loads((CRDS / name).read_text())))
            for key, name in CRD_SCHEMAS.items()}


def all_on(values: dict) -> dict:
    """A value set with every optional object switched on."""
    values = copy.deepcopy(values)
    obs = values.setdefault("observability", {})
    for key in ("podMonitor", "prometheusRule", "grafanaDashboard"):
        obs.setdefault(key, {})["enabled"] = True
    values.setdefault("ray", {}).setdefault("autoscaling", {})["enabled"] = True
    values.setdefault("huggingFace", {})["tokenSecret"] = {"name": "hf", "key": "token"}
    values.setdefault("gateway", {})["apiKeysSecret"] = "keys"
    values["gateway"]["mcpAllowedHosts"] = "mcp.internal:443,10.0.0.0/8"
    return values


def test_lint_reports_nothing_above_info() -> None:
    for values in VALUE_SETS.values():
        report = helm_python.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}.0")
        assert not report["errors"], report
        assert [m for m in report["messages"] if m["severity"] > 1] == [], report["messages"]


@pytest.mark.parametrize("name", [*VALUE_SETS, *(f"{n}+all-on" for n in VALUE_SETS)])
def test_every_manifest_validates(chart: helm_python.Chart, crd_validators: dict, name: str) -> None:
    base, _, extra = name.partition("+")
    values = all_on(VALUE_SETS[base]) if extra else VALUE_SETS[base]
    docs = render(chart, values)
    kinds = {d["kind"] for d in docs}
    assert {"RayCluster", "Service", "ConfigMap", "Secret", "Job"} <= kinds
    if extra:
        assert {"PodMonitor", "PrometheusRule"} <= kinds
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        if key in crd_validators:
            errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                      for e in crd_validators[key].iter_errors(doc)]
            assert errors == [], f"{doc['kind']} {doc['metadata']['name']}: {errors[:5]}"
        else:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        # the custom resources' pod templates are core PodSpecs, which the CRD leaves open
        for spec in pod_specs(doc):
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": spec},
                                         KUBE_VERSION, strict=True)


def pod_specs(doc: dict) -> list[dict]:
    if doc["kind"] != "RayCluster":
        return []
    spec = doc["spec"]
    return [spec["headGroupSpec"]["template"]["spec"], *(g["template"]["spec"] for g in spec["workerGroupSpecs"])]


def ray_container(template_spec: dict) -> dict:
    return template_spec["containers"][0]  # KubeRay's convention: the Ray container comes first


def expand(args: list[str]) -> list[str]:
    """Kubernetes' $(VAR) expansion, with values a pod would have."""
    fake = {"POD_IP": "10.1.2.3", "POD_NAME": "demo-cpu-abcde", "POD_CPU_LIMIT": "8",
            "POD_MEMORY_LIMIT": str(32 * 2**30), "FQ_RAY_IP": "demo-head-svc.ai.svc.cluster.local"}
    return [re.sub(r"\$\((\w+)\)", lambda m: fake[m.group(1)], a) for a in args]


def ports(container: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def env_names(container: dict) -> set[str]:
    return {e["name"] for e in container.get("env", [])}


@pytest.mark.parametrize("name", VALUE_SETS)
def test_commands_parse_with_the_cli_and_agree_on_ports(chart: helm_python.Chart, name: str) -> None:
    docs = render(chart, all_on(VALUE_SETS[name]))
    cluster = the(docs, "RayCluster")["spec"]
    head = ray_container(cluster["headGroupSpec"]["template"]["spec"])
    assert head["command"] == ["mship"]
    start = cli.parser().parse_args(expand(head["args"]))
    assert start.command == "start"
    head_ports = ports(head)
    assert (start.http_port, start.coordinator_port, start.state_port, start.gcs_port, start.metrics_port) == \
        (head_ports["http"], head_ports["coordinator"], head_ports["state"], head_ports["gcs-server"],
         head_ports["metrics"])
    assert int(cluster["headGroupSpec"]["rayStartParams"]["port"]) == start.gcs_port  # what KubeRay tells workers
    assert start.dashboard_agent_port == head_ports["ray-agent"]
    assert start.enable_ray_auth and cluster["authOptions"]["mode"] == "token"
    assert start.advertise_address == "10.1.2.3" and start.host == "0.0.0.0"
    assert start.no_ray_monitor  # all_on: KubeRay's autoscaler runs beside the head
    for group in cluster["workerGroupSpecs"]:
        worker = ray_container(group["template"]["spec"])
        join = cli.parser().parse_args(expand(worker["args"]))
        assert join.command == "join"
        assert join.gcs_address.endswith(f":{start.gcs_port}")
        assert join.metrics_port == ports(worker)["metrics"] and join.dashboard_agent_port == ports(worker)["ray-agent"]
        limits = worker["resources"]["limits"]
        if "nvidia.com/gpu" in limits:
            assert join.node_num_gpus == int(limits["nvidia.com/gpu"])
            assert ray_container(group["template"]["spec"])["image"].endswith("-cuda")
    job = ray_container(the(docs, "Job")["spec"]["template"]["spec"])
    deploy = cli.parser().parse_args(expand(job["args"]))
    coordinator = the([s for s in of_kind(docs, "Service") if s["metadata"]["name"].endswith("-coordinator")],
                      "Service")
    assert deploy.command == "deploy" and deploy.reconcile and deploy.wait
    assert deploy.coordinator == f"{coordinator['metadata']['name']}:{coordinator['spec']['ports'][0]['port']}"
    assert coordinator["spec"]["ports"][0]["port"] == start.coordinator_port


def test_defaults_are_the_codes_defaults(chart: helm_python.Chart) -> None:
    """The chart's default ports are the ones `mship start` / `join` use on VMs (docs/multi-node.md)."""
    values = chart.values
    defaults = cli.parser().parse_args(["start"])
    assert values["gateway"]["httpPort"] == defaults.http_port
    assert values["coordinatorPort"] == defaults.coordinator_port
    assert values["statePort"] == defaults.state_port
    assert values["ray"]["gcsPort"] == defaults.gcs_port
    assert values["observability"]["metricsPort"] == DEFAULT_METRICS_PORT == defaults.metrics_port
    assert values["head"]["stopTimeoutSeconds"] == defaults.stop_timeout
    schema = json.loads((CHART / "values.schema.json").read_text())
    group = schema["properties"]["workerGroups"]["items"]["properties"]
    assert set(group["capabilities"]["items"]["enum"]) == IMPLEMENTED_LOADERS
    assert set(schema["properties"]["head"]["properties"]["capabilities"]["items"]["enum"]) == IMPLEMENTED_LOADERS
    assert set(schema["properties"]["models"]["items"]["properties"]["loader"]["enum"]) == set(LOADERS)


@pytest.mark.parametrize("name", VALUE_SETS)
def test_capability_resources_and_environment_are_the_codes(chart: helm_python.Chart, name: str) -> None:
    docs = render(chart, all_on(VALUE_SETS[name]))
    cluster = the(docs, "RayCluster")["spec"]
    known_env = {v for k, v in vars(vocabulary).items() if k.startswith("ENV_") and isinstance(v, str)}
    groups = [(cluster["headGroupSpec"], True), *((g, False) for g in cluster["workerGroupSpecs"])]
    for group, is_head in groups:
        container = ray_container(group["template"]["spec"])
        env = {e["name"]: e for e in container["env"]}
        caps = parse(env[vocabulary.ENV_NODE_CAPABILITIES]["value"]) if vocabulary.ENV_NODE_CAPABILITIES in env \
            else []
        gateway = is_head or group["template"]["metadata"]["labels"].get("mship.io/gateway") == "true"
        # KubeRay's autoscaler sees exactly what the node advertises when it joins (capabilities.py)
        expected = {capability_resource(c): str(int(SLOTS)) for c in caps}
        if gateway:
            expected[GATEWAY_RESOURCE] = str(int(SLOTS))
        assert group["resources"] == expected
        assert ("--no-gateway" in container["args"]) == (not gateway)
        if not is_head:  # said, never probed: the autoscaler's view above must be what the node advertises
            assert vocabulary.ENV_NODE_CAPABILITIES in env
        mship_env = {n for n in env if n.startswith("MSHIP_")}
        assert mship_env <= known_env, f"variables no code reads: {sorted(mship_env - known_env)}"
        assert vocabulary.ENV_RAY_AUTH_TOKEN in env and vocabulary.ENV_CACHE_DIR in env
    head_env = env_names(ray_container(cluster["headGroupSpec"]["template"]["spec"]))
    assert {vocabulary.ENV_REDIS_PASSWORD, vocabulary.ENV_COMPACTION_KEY, vocabulary.ENV_API_KEYS_FILE,
            vocabulary.ENV_MCP_ALLOWED_HOSTS} <= head_env
    # what reaches the gateway replicas is the head's environment (the job's runtime_env)
    assert {vocabulary.ENV_MCP_ALLOWED_HOSTS, vocabulary.ENV_API_KEYS_FILE} <= set(vocabulary.PLATFORM_ENV)


@pytest.mark.parametrize("name", VALUE_SETS)
def test_references_resolve(chart: helm_python.Chart, name: str) -> None:
    """Services select pods that have the named ports; secrets and volumes exist (or are the
    operator's own, named in the values); probes name ports the container has."""
    values = all_on(VALUE_SETS[name])
    docs = render(chart, values)
    cluster = the(docs, "RayCluster")
    templates = [cluster["spec"]["headGroupSpec"]["template"],
                 *(g["template"] for g in cluster["spec"]["workerGroupSpecs"])]
    # labels KubeRay adds to every pod it makes
    kuberay = [{"ray.io/cluster": cluster["metadata"]["name"], "ray.io/node-type": "head" if i == 0 else "worker"}
               for i in range(len(templates))]
    for service in of_kind(docs, "Service"):
        if service["metadata"]["name"].endswith("-redis"):
            continue
        selector = service["spec"]["selector"]
        chosen = [t for t, extra in zip(templates, kuberay, strict=True)
                  if selector.items() <= {**t["metadata"]["labels"], **extra}.items()]
        assert chosen, f"{service['metadata']['name']} selects no pod"
        for t in chosen:
            names = ports(ray_container(t["spec"]))
            for port in service["spec"]["ports"]:
                assert port["targetPort"] in names
    own = {s["metadata"]["name"]: set(s["data"]) for s in of_kind(docs, "Secret")}
    external = {values["huggingFace"]["tokenSecret"]["name"], values["gateway"]["apiKeysSecret"],
                values.get("redis", {}).get("passwordSecret", {}).get("name")}
    for spec in [t["spec"] for t in templates] + [the(docs, "Job")["spec"]["template"]["spec"]]:
        for container in spec["containers"]:
            for e in container.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["name"] not in external:
                    assert ref["key"] in own.get(ref["name"], set()), f"{e['name']}: {ref}"
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                if probe in container:
                    assert container[probe]["httpGet"]["port"] in ports(container), probe
            mounted = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounted <= {v["name"] for v in spec.get("volumes", [])}
    if ref := cluster["spec"].get("gcsFaultToleranceOptions", {}).get("redisPassword", {}).get("valueFrom"):
        key = ref["secretKeyRef"]
        assert key["name"] in external or key["key"] in own[key["name"]]


def test_model_set_is_what_mship_deploy_reads(chart: helm_python.Chart, tmp_path: Path) -> None:
    for values in VALUE_SETS.values():
        docs = render(chart, values)
        config = tmp_path / "models.yaml"
        (models,) = [c for c in of_kind(docs, "ConfigMap") if c["metadata"]["name"].endswith("-models")]
        config.write_text(models["data"]["models.yaml"])
        parsed = load_model_set(config)
        assert [m.name for m in parsed] == [m["name"] for m in (values.get("models") or chart.values["models"])]


def test_images_one_version_across_variants(chart: helm_python.Chart) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart.metadata["appVersion"] == version
    docs = render(chart, VALUE_SETS["gpu"])
    cluster = the(docs, "RayCluster")["spec"]
    assert ray_container(cluster["headGroupSpec"]["template"]["spec"])["image"] == f"mship:{version}-control"
    assert [ray_container(g["template"]["spec"])["image"] for g in cluster["workerGroupSpecs"]] == \
        [f"mship:{version}-cuda"]
    assert ray_container(the(docs, "Job")["spec"]["template"]["spec"])["image"] == f"mship:{version}-control"
    default = the(render(chart), "RayCluster")["spec"]
    assert ray_container(default["workerGroupSpecs"][0]["template"]["spec"])["image"] == f"mship:{version}-cpu"


def test_observability_objects_carry_the_repository_files(chart: helm_python.Chart) -> None:
    docs = render(chart, all_on({}))
    alerts = yaml.safe_load((ROOT / "deploy" / "prometheus" / "mship-alerts.yml").read_text())
    assert the(docs, "PrometheusRule")["spec"]["groups"] == alerts["groups"]
    (dashboard,) = [c for c in of_kind(docs, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]
    assert json.loads(dashboard["data"]["mship-dashboard.json"]) == \
        json.loads((ROOT / "deploy" / "grafana" / "mship-dashboard.json").read_text())
    relabel = the(docs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert {"action": "replace", "targetLabel": "job", "replacement": "mship"} in relabel  # up{job="mship"}


def test_deploy_job_is_renamed_when_the_model_set_changes(chart: helm_python.Chart) -> None:
    """A Job's spec is immutable: a new set must be a new Job, the same set the same one."""
    first = the(render(chart), "Job")["metadata"]["name"]
    again = the(render(chart), "Job")["metadata"]["name"]
    other = the(render(chart, {"models": [{"name": "x", "model": "builtin:tiny-qwen2", "loader": "llama_cpp"}]}),
                "Job")["metadata"]["name"]
    assert first == again != other


@pytest.mark.parametrize("name", VALUE_SETS)
def test_ray_pods_get_shared_memory_and_an_init(chart: helm_python.Chart, name: str) -> None:
    """What docker/README.md asks of `docker run` (--shm-size, --init), the pods get: a container's
    /dev/shm is 64 MiB (Ray's object store falls back to disk, tensor-parallel vLLM's NCCL fails),
    and `mship` as PID 1 would never reap the orphans of killed engine processes."""
    for spec in pod_specs(the(render(chart, all_on(VALUE_SETS[name])), "RayCluster")):
        volumes = {v["name"]: v for v in spec["volumes"]}
        (shm,) = [m for m in ray_container(spec)["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        assert volumes[shm["name"]] == {"name": shm["name"], "emptyDir": {"medium": "Memory"}}
        assert spec["shareProcessNamespace"] is True


def test_a_head_only_cluster_renders_a_valid_raycluster(chart: helm_python.Chart, crd_validators: dict) -> None:
    """No worker groups, the models on the head: the schema allows it, so must the CRD."""
    values = {"workerGroups": [], "head": {"capabilities": ["llama_cpp"],
                                           "resources": {"limits": {"cpu": "4", "memory": "8Gi"}}}}
    cluster = the(render(chart, values), "RayCluster")
    assert cluster["spec"]["workerGroupSpecs"] == []
    assert [e.message for e in crd_validators[("ray.io/v1", "RayCluster")].iter_errors(cluster)] == []
