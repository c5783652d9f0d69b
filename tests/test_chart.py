"""The Helm chart, rendered and linted by the real Helm engine (helm-python-sdk embeds it: no helm binary, no
cluster), over the value sets an operator uses. Every object it renders is checked against the Kubernetes
schemas (kubernetes-validate), KEDA's objects against KEDA's CRDs (tests/schemas/), and the ServiceMonitor by
hand; every command a container runs is one the CLI parses; wrong values are refused by the values schema or a
template's guard, with a message that names the key."""

from __future__ import annotations

import copy
import functools
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate as kv
import pytest
import yaml

from chatops.config import load_config
from commands.cli import PASSTHROUGH, build_parser

CHART = Path(__file__).resolve().parent.parent / "charts" / "mm-chatops"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
KUBE = "1.30"
RELEASE, NAMESPACE = "rel", "mm"
FULLNAME = f"{RELEASE}-mm-chatops"
IMAGE_ENTRYPOINT = ["tini", "--", "mm-bot"]  # the Dockerfile's

helm.disable_logging()

# The value sets: what an operator installs with.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "socket-mode": {"bot": {"socketMode": True}},
    "autoscaling": {
        "autoscaling": {"enabled": True, "redis": {"address": "redis-master:6379", "passwordKey": "REDIS_PASSWORD"}}
    },
    "external-services": {
        "existingSecret": "mm-prod-secrets",
        "databaseUrl": "postgresql://mm@db.example.internal:5432/mm",
        "brokerUrl": "redis://redis.example.internal:6379/0",
        "logFormat": "plain",
        "worker": {"workspaces": {"existingClaim": "mm-workspaces"}},
    },
    "ingress": {
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "hosts": ["mm.example.com"],
            "tls": [{"secretName": "mm-tls", "hosts": ["mm.example.com"]}],
        },
        "networkPolicy": {
            "enabled": True,
            "botFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}],
        },
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    },
    "single-worker-unsandboxed": {
        "config": "sandbox: none\n",
        "bot": {"replicas": 1},
        "worker": {"replicas": 1, "sandbox": {"enabled": False}, "workspaces": {"emptyDir": True}},
    },
}

# The custom resources the chart can render, and the CRD each is checked against.
CRDS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda-v2.20.2.sh_scaledobjects.yaml",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda-v2.20.2.sh_triggerauthentications.yaml",
}


# --- helpers --------------------------------------------------------------------------------------------------


def render_raw(values: dict[str, Any]) -> dict[str, str]:
    with helm.Chart.load(CHART) as chart:
        return chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object the chart renders with `values` (NOTES.txt left out)."""
    objects = []
    for path, text in render_raw(values).items():
        if path.endswith(".yaml"):
            objects += [doc for doc in yaml.safe_load_all(text) if doc is not None]
    return objects


@functools.cache
def rendered(value_set: str) -> tuple[dict[str, Any], ...]:
    return tuple(render(VALUE_SETS[value_set]))


def notes(values: dict[str, Any]) -> str:
    return next(text for path, text in render_raw(values).items() if path.endswith("NOTES.txt"))


def refusal(values: dict[str, Any]) -> str:
    """The message Helm refuses `values` with (the values schema, or a template's `fail`/`required`)."""
    with pytest.raises(helm.HelmError) as caught:
        render_raw(values)
    return str(caught.value)


def kinds(objects: tuple[dict[str, Any], ...] | list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: tuple[dict[str, Any], ...] | list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in kinds(objects, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
    return found[0]


def workload(objects: tuple[dict[str, Any], ...] | list[dict[str, Any]], component: str) -> dict[str, Any]:
    kind = "Job" if component == "migrate" else "Deployment"
    return named(objects, kind, f"{FULLNAME}-{component}")


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def pod_specs(objects: tuple[dict[str, Any], ...]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job"):
            yield obj["metadata"]["name"], pod_spec(obj)


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in containers(pod_spec(obj)) if c["name"] == name)


def env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c.get("env", [])}


def mm_bot_argvs(c: dict[str, Any]) -> list[list[str]]:
    """The argument lists of every `mm-bot` a container runs: its own (without a command, the image's ENTRYPOINT
    `tini -- mm-bot` runs its args: tests/test_image.py holds the image to that), a `sh -c` script's, and its exec
    probes'."""
    probes = [
        c[p]["exec"]["command"] for p in ("startupProbe", "livenessProbe", "readinessProbe") if "exec" in c.get(p, {})
    ]
    argvs = []
    for command in [[*c.get("command", IMAGE_ENTRYPOINT), *c.get("args", [])], *probes]:
        if command[: len(IMAGE_ENTRYPOINT)] == IMAGE_ENTRYPOINT:
            command = command[len(IMAGE_ENTRYPOINT) - 1 :]
        if command[:1] == ["mm-bot"]:
            argvs.append(command[1:])
        elif command[:2] == ["sh", "-c"]:
            argvs += [shlex.split(m) for m in re.findall(r"mm-bot ([^;&|]*)", command[2])]
        else:
            raise AssertionError(f"{c['name']} runs {command}, not mm-bot")
    return argvs


def closed(schema: Any) -> Any:
    """An OpenAPI v3 schema of a CRD that refuses unknown fields, as the API server prunes them (a misspelt key
    would otherwise pass): objects with properties get additionalProperties false, unless they keep unknown
    fields on purpose (x-kubernetes-preserve-unknown-fields)."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    crd = yaml.safe_load((SCHEMAS / CRDS[(api_version, kind)]).read_text())
    assert crd["spec"]["names"]["kind"] == kind
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    return jsonschema.Draft202012Validator(closed(served["schema"]["openAPIV3Schema"]))


def check_service_monitor(sm: dict[str, Any], objects: tuple[dict[str, Any], ...]) -> None:
    """monitoring.coreos.com/v1 is a CRD the repository does not keep: its required shape, checked by hand, and
    that each endpoint's port names a port of a Service it selects."""
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(sm) == {"apiVersion", "kind", "metadata", "spec"}
    spec = sm["spec"]
    assert set(spec) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    wanted = spec["selector"]["matchLabels"]
    services = [s for s in kinds(objects, "Service") if wanted.items() <= s["metadata"]["labels"].items()]
    ports = {p["name"] for s in services for p in s["spec"]["ports"]}
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}
        assert endpoint["port"] in ports, f"no selected Service has a port named {endpoint['port']}"
        assert endpoint["path"] == "/metrics"
        assert re.fullmatch(r"([0-9]+(ms|s|m|h))+", endpoint["interval"])


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# --- every value set: lint, schemas, commands -------------------------------------------------------------------


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_helm_lint_is_clean(value_set: str) -> None:
    for kube in ("v1.27.0", "v1.30.0"):  # before 1.30 AppArmor is an annotation, from 1.30 a field
        result = helm.lint(CHART, values=VALUE_SETS[value_set], strict=True, kube_version=kube)
        assert result["errors"] == [], result
        # Severity 1 is INFO ("icon is recommended"); warnings and errors fail under --strict.
        assert all(m["severity"] <= 1 for m in result["messages"]), result["messages"]


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_rendered_object_is_valid(value_set: str) -> None:
    objects = rendered(value_set)
    assert objects
    for obj in objects:
        what = f"{obj['kind']} {obj['metadata']['name']}"
        if obj["kind"] == "ServiceMonitor":
            check_service_monitor(obj, objects)
            continue
        if (obj["apiVersion"], obj["kind"]) in CRDS:
            errors = [
                f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                for e in crd_validator(obj["apiVersion"], obj["kind"]).iter_errors(obj)
            ]
            assert not errors, f"{what}: {errors}"
            continue
        try:
            kv.validate(obj, KUBE, strict=True)
        except kv.ValidationError as e:
            pytest.fail(f"{what}: {'.'.join(map(str, e.path))}: {e.message}")


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_command_is_one_the_cli_parses(value_set: str) -> None:
    parser = build_parser()
    ran = set()
    for name, spec in pod_specs(rendered(value_set)):
        for c in containers(spec):
            if c["name"] != "wait-for-schema":
                assert "command" not in c, f"{name}/{c['name']}: a command would replace tini, the image's PID 1"
            for argv in mm_bot_argvs(c):
                try:
                    args, unknown = parser.parse_known_args(argv)
                except SystemExit:
                    pytest.fail(f"{name}/{c['name']}: `mm-bot {shlex.join(argv)}` does not parse")
                if args.command not in PASSTHROUGH:
                    assert unknown == [], f"{name}/{c['name']}: `mm-bot {shlex.join(argv)}`: {unknown} unknown"
                ran.add(args.command)
                if args.command == "migrate" and c["name"] == "wait-for-schema":
                    assert args.check is True
                if args.command == "probe":
                    assert args.what in ("live", "ready")
    assert {"serve", "worker", "migrate", "probe"} <= ran


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_pod_is_non_root_with_a_read_only_root(value_set: str) -> None:
    log_format = VALUE_SETS[value_set].get("logFormat", "json")
    for name, spec in pod_specs(rendered(value_set)):
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 10001 and pod["runAsGroup"] == 10001, name
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["automountServiceAccountToken"] is False, name
        assert any(v["name"] == "tmp" and "emptyDir" in v for v in spec["volumes"]), name
        for c in containers(spec):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["capabilities"] == {"drop": ["ALL"]}, (name, c["name"])
            assert "privileged" not in sc and "runAsUser" not in sc, (name, c["name"])
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"], (name, c["name"])
            assert env(c)["HOME"] == "/tmp", (name, c["name"])
            assert env(c)["MM_LOG_FORMAT"] == log_format, (name, c["name"])
            assert c["envFrom"] == [{"secretRef": {"name": VALUE_SETS[value_set].get("existingSecret", "mm-chatops")}}]


# --- what each value set must render ---------------------------------------------------------------------------


def test_the_config_checksum_follows_the_config() -> None:
    def checksums(values: dict[str, Any]) -> set[str]:
        objects = render(values)
        return {
            workload(objects, c)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for c in ("bot", "worker", "beat")
        }

    before = checksums({})
    after = checksums({"config": "model:\n  url: http://other-model:8080/v1\n  name: ai/gemma3\nyolo: false\n"})
    assert len(before) == 1 and len(after) == 1, "every component rolls on the same config"
    assert before != after
    assert checksums({"bot": {"replicas": 3}}) == before, "only the config moves it"


def test_the_config_map_holds_the_config_the_pods_read() -> None:
    objects = rendered("defaults")
    config_map = named(objects, "ConfigMap", FULLNAME)
    default_config = yaml.safe_load((CHART / "values.yaml").read_text())["config"]
    assert config_map["data"]["mm.yaml"].strip() == default_config.strip()
    bot = container(workload(objects, "bot"), "bot")
    assert env(bot)["MM_CONFIG"] == "/etc/mm/mm.yaml"
    assert {"name": "config", "mountPath": "/etc/mm", "readOnly": True} in bot["volumeMounts"]


def test_http_mode_routes_only_slacks_paths_through_the_ingress() -> None:
    objects = rendered("ingress")
    bot = workload(objects, "bot")
    assert "--socket" not in container(bot, "bot")["args"]
    service = named(objects, "Service", f"{FULLNAME}-bot")
    ingress = named(objects, "Ingress", f"{FULLNAME}-bot")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"secretName": "mm-tls", "hosts": ["mm.example.com"]}]
    [rule] = ingress["spec"]["rules"]
    assert rule["host"] == "mm.example.com"
    paths = rule["http"]["paths"]
    # Events, and the install flow's two pages (many workspaces); /healthz and /metrics stay inside.
    routed = [(path["path"], path["pathType"]) for path in paths]
    assert routed == [(p, "Exact") for p in ("/slack/events", "/slack/install", "/slack/oauth_redirect")]
    for path in paths:
        assert path["backend"]["service"] == {"name": service["metadata"]["name"], "port": {"name": "http"}}
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert "https://mm.example.com/slack/events" in notes(VALUE_SETS["ingress"])
    assert kinds(rendered("defaults"), "Ingress") == [], "no Ingress unless asked for"


def test_socket_mode_renders_no_ingress_and_no_service() -> None:
    values = deep_merge(VALUE_SETS["socket-mode"], {"ingress": {"enabled": True, "hosts": ["mm.example.com"]}})
    objects = render(values)
    assert "--socket" in container(workload(objects, "bot"), "bot")["args"]
    assert kinds(objects, "Ingress") == []
    assert [s for s in kinds(objects, "Service") if s["metadata"]["name"] == f"{FULLNAME}-bot"] == []
    assert "Socket Mode" in notes(values) and "ingress.enabled is ignored" in notes(values)
    # The ServiceMonitor reaches the bot through a metrics Service of its own, not Slack's.
    monitored = render(deep_merge(values, {"serviceMonitor": {"enabled": True}}))
    assert named(monitored, "Service", f"{FULLNAME}-bot-metrics")["spec"]["ports"][0]["name"] == "metrics"
    assert [s for s in kinds(monitored, "Service") if s["metadata"]["name"] == f"{FULLNAME}-bot"] == []
    assert kinds(monitored, "Ingress") == []


def test_autoscaling_hands_the_worker_replicas_to_a_scaled_object() -> None:
    objects = rendered("autoscaling")
    worker = workload(objects, "worker")
    assert "replicas" not in worker["spec"], "KEDA's HPA owns the replicas"
    assert workload(rendered("defaults"), "worker")["spec"]["replicas"] == 2
    [scaled] = kinds(objects, "ScaledObject")
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        "apps/v1",
        "Deployment",
        worker["metadata"]["name"],
    )
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (2, 10)
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "redis"
    assert trigger["metadata"]["listName"] == "turns", "Celery's Redis transport: the turns queue is this list"
    assert trigger["metadata"]["address"] == "redis-master:6379"
    auth = named(objects, "TriggerAuthentication", trigger["authenticationRef"]["name"])
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "password", "name": "mm-chatops", "key": "REDIS_PASSWORD"}]
    assert named(objects, "PodDisruptionBudget", f"{FULLNAME}-worker")["spec"]["maxUnavailable"] == 1
    # No password key: no TriggerAuthentication, and the ScaledObject names none.
    bare = render({"autoscaling": {"enabled": True, "redis": {"address": "redis:6379"}}})
    assert kinds(bare, "TriggerAuthentication") == []
    assert "authenticationRef" not in kinds(bare, "ScaledObject")[0]["spec"]["triggers"][0]
    assert kinds(rendered("defaults"), "ScaledObject") == []


def test_external_services_and_the_existing_secret_reach_every_process() -> None:
    objects = rendered("external-services")
    for name, spec in pod_specs(objects):
        for c in containers(spec):
            assert env(c)["DATABASE_URL"] == "postgresql://mm@db.example.internal:5432/mm", (name, c["name"])
            assert env(c)["CELERY_BROKER_URL"] == "redis://redis.example.internal:6379/0", (name, c["name"])
    worker = pod_spec(workload(objects, "worker"))
    claim = next(v for v in worker["volumes"] if v["name"] == "workspaces")
    assert claim == {"name": "workspaces", "persistentVolumeClaim": {"claimName": "mm-workspaces"}}
    assert kinds(objects, "PersistentVolumeClaim") == [], "an existing claim: none made"
    # By default the URLs come from the Secret: no value in the pods' env to shadow it.
    assert "DATABASE_URL" not in env(container(workload(rendered("defaults"), "bot"), "bot"))


def test_the_made_workspace_claim_is_shared_and_kept() -> None:
    objects = rendered("defaults")
    claim = named(objects, "PersistentVolumeClaim", f"{FULLNAME}-workspaces")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    worker = workload(objects, "worker")
    assert {"name": "workspaces", "mountPath": "/var/lib/mm/workspaces"} in container(worker, "worker")["volumeMounts"]
    assert env(container(worker, "worker"))["MM_WORKSPACES"] == "/var/lib/mm/workspaces"


def test_only_the_worker_container_gets_the_sandbox_grants() -> None:
    objects = rendered("defaults")
    for name, spec in pod_specs(objects):
        is_worker = name == f"{FULLNAME}-worker"
        assert spec.get("hostUsers", True) is not is_worker, name
        for c in containers(spec):
            sc = c["securityContext"]
            if is_worker and c["name"] == "worker":
                assert sc["seccompProfile"] == {"type": "Unconfined"}
                assert sc["appArmorProfile"] == {"type": "Unconfined"}
                assert sc["procMount"] == "Unmasked"
                assert {"name": "tun", "mountPath": "/dev/net/tun"} in c["volumeMounts"]
            else:
                assert not {"seccompProfile", "appArmorProfile", "procMount"} & set(sc), (name, c["name"])
    tun = next(v for v in pod_spec(workload(objects, "worker"))["volumes"] if v["name"] == "tun")
    assert tun["hostPath"] == {"path": "/dev/net/tun", "type": "CharDevice"}
    assert "(NFS, so EFS/Filestore, does not)" in notes({})


def test_the_sandbox_can_take_its_tun_from_a_device_plugin_and_a_localhost_profile() -> None:
    objects = render(
        {
            "worker": {
                "sandbox": {
                    "tun": "resource",
                    "tunResource": "squat.ai/tun",
                    "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/mm-sandbox.json"},
                }
            }
        }
    )
    worker = container(workload(objects, "worker"), "worker")
    assert worker["resources"]["limits"] == {"memory": "4Gi", "squat.ai/tun": 1}
    assert worker["securityContext"]["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "profiles/mm-sandbox.json",
    }
    assert all(v["name"] != "tun" for v in pod_spec(workload(objects, "worker"))["volumes"])
    for obj in objects:
        kv.validate(obj, KUBE, strict=True)


def test_without_the_sandbox_the_worker_is_as_confined_as_the_others() -> None:
    worker = workload(rendered("single-worker-unsandboxed"), "worker")
    spec = pod_spec(worker)
    assert "hostUsers" not in spec
    assert container(worker, "worker")["securityContext"] == container(worker, "wait-for-schema")["securityContext"]
    assert all(v["name"] != "tun" for v in spec["volumes"])
    assert next(v for v in spec["volumes"] if v["name"] == "workspaces")["emptyDir"] == {}
    assert "SANDBOX is off" in notes(VALUE_SETS["single-worker-unsandboxed"])


def test_pods_wait_for_the_schema_that_the_hook_migrates() -> None:
    objects = rendered("defaults")
    job = workload(objects, "migrate")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert container(job, "migrate")["args"] == ["migrate"]
    assert all(v["name"] != "config" for v in pod_spec(job)["volumes"]), "its ConfigMap does not exist yet"
    for component in ("bot", "worker", "beat"):
        [init] = pod_spec(workload(objects, component))["initContainers"]
        assert init["command"] == ["sh", "-c", "until mm-bot migrate --check; do sleep 5; done"], component
    unwaiting = render({"migrations": {"waitForSchema": False}})
    assert all("initContainers" not in spec for _, spec in pod_specs(tuple(unwaiting)))


def test_probes_fit_each_process() -> None:
    objects = rendered("defaults")
    bot = container(workload(objects, "bot"), "bot")
    assert bot["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert bot["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    worker = container(workload(objects, "worker"), "worker")
    assert worker["livenessProbe"]["exec"]["command"] == ["mm-bot", "probe", "live"]
    assert worker["readinessProbe"]["exec"]["command"] == ["mm-bot", "probe", "ready"]
    beat = container(workload(objects, "beat"), "beat")
    assert beat["livenessProbe"]["exec"]["command"] == ["mm-bot", "probe", "live"]
    assert "readinessProbe" not in beat
    for c in (worker, beat):
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            if probe in c:  # each starts a Python process
                assert c[probe]["timeoutSeconds"] >= 10 and c[probe]["periodSeconds"] >= 10, (c["name"], probe)
        assert c["livenessProbe"]["periodSeconds"] == 30


def test_the_scheduler_is_one_pod_in_a_writable_directory() -> None:
    beat = workload(rendered("defaults"), "beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"] == {"type": "Recreate"}
    c = container(beat, "beat")
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == c["workingDir"])
    assert any(v["name"] == mount["name"] and "emptyDir" in v for v in pod_spec(beat)["volumes"])
    without = {d["metadata"]["name"] for d in kinds(render({"beat": {"enabled": False}}), "Deployment")}
    assert without == {f"{FULLNAME}-bot", f"{FULLNAME}-worker"}


def test_metrics_ports_env_and_scrape_annotations_agree() -> None:
    objects = rendered("defaults")
    for component in ("bot", "worker", "beat"):
        obj = workload(objects, component)
        c = container(obj, component)
        assert env(c)["MM_METRICS_PORT"] == "9100" and env(c)["MM_METRICS_HOST"] == "0.0.0.0", component
        assert {"name": "metrics", "containerPort": 9100} in c["ports"], component
        annotations = obj["spec"]["template"]["metadata"]["annotations"]
        assert (annotations["prometheus.io/scrape"], annotations["prometheus.io/port"]) == ("true", "9100")
    assert kinds(objects, "ServiceMonitor") == []
    quiet = render({"metrics": {"enabled": False}})
    for component in ("bot", "worker", "beat"):
        c = container(workload(quiet, component), component)
        assert "MM_METRICS_PORT" not in env(c) and all(p["name"] != "metrics" for p in c.get("ports", []))


def test_the_service_monitor_reaches_every_component() -> None:
    objects = rendered("ingress")
    [sm] = kinds(objects, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    for component in ("bot", "worker", "beat"):
        service = named(objects, "Service", f"{FULLNAME}-{component}-metrics")
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"]["app.kubernetes.io/component"] == component
        assert service["spec"]["ports"] == [{"name": "metrics", "port": 9100, "targetPort": "metrics"}]


def test_network_policies_cover_every_component() -> None:
    objects = rendered("ingress")
    policies = {p["metadata"]["name"]: p["spec"] for p in kinds(objects, "NetworkPolicy")}
    assert set(policies) == {f"{FULLNAME}-{c}" for c in ("bot", "worker", "beat", "migrate")}
    bot = policies[f"{FULLNAME}-bot"]
    slack, metrics = bot["ingress"]

    def sources(rule: dict[str, Any]) -> list[str]:
        return [p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in rule["from"]]

    assert slack["ports"] == [{"port": "http", "protocol": "TCP"}] and sources(slack) == ["ingress-nginx"]
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}] and sources(metrics) == ["monitoring"]

    def egress_ports(spec: dict[str, Any]) -> set[int]:
        return {p["port"] for rule in spec["egress"] for p in rule["ports"]}

    assert {53, 5432, 6379, 8080, 443, 80} <= egress_ports(policies[f"{FULLNAME}-worker"])
    assert {443} <= egress_ports(bot)
    assert egress_ports(policies[f"{FULLNAME}-beat"]) == {53, 5432, 6379}
    assert egress_ports(policies[f"{FULLNAME}-migrate"]) == {53, 5432}
    internet = next(
        r for r in policies[f"{FULLNAME}-worker"]["egress"] if {"port": 443, "protocol": "TCP"} in r["ports"]
    )
    assert "169.254.0.0/16" in internet["to"][0]["ipBlock"]["except"], "no cloud metadata endpoint"
    assert policies[f"{FULLNAME}-worker"]["ingress"][0]["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert kinds(rendered("defaults"), "NetworkPolicy") == []


def test_disruption_budgets_only_where_they_protect() -> None:
    budgets = {p["metadata"]["name"]: p["spec"] for p in kinds(rendered("defaults"), "PodDisruptionBudget")}
    assert set(budgets) == {f"{FULLNAME}-bot", f"{FULLNAME}-worker"}
    for spec in budgets.values():
        assert spec["maxUnavailable"] == 1 and "minAvailable" not in spec
        assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert kinds(rendered("single-worker-unsandboxed"), "PodDisruptionBudget") == [], "one replica: nothing to keep"


# --- refusals --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "names"),
    [
        ({"worker": {"replicas": "two"}}, "/worker/replicas"),
        ({"logFormat": "xml"}, "/logFormat"),
        ({"replica": 3}, "'replica' not allowed"),
        ({"bot": {"socketmode": True}}, "'socketmode' not allowed"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"bot": {"port": 70000}}, "/bot/port"),
        ({"worker": {"concurrency": 0}}, "/worker/concurrency"),
        ({"ingress": {"enabled": True}}, "/ingress/hosts"),
        ({"worker": {"sandbox": {"procMount": "Masked"}}}, "/worker/sandbox/procMount"),
        ({"worker": {"sandbox": {"seccompProfile": {"type": "Localhost"}}}}, "/worker/sandbox/seccompProfile"),
        ({"autoscaling": {"enabled": "yes"}}, "/autoscaling/enabled"),
        ({"autoscaling": {"redis": {"address": "redis://redis:6379"}}}, "/autoscaling/redis/address"),
        ({"worker": {"resources": {"limits": {"memory": "lots"}}}}, "/worker/resources/limits/memory"),
    ],
)
def test_a_wrong_value_is_refused_naming_its_key(values: dict[str, Any], names: str) -> None:
    message = refusal(values)
    assert "schema" in message and names in message, message


@pytest.mark.parametrize(("existing_secret", "says"), [("", "/existingSecret"), (None, "'existingSecret'")])
def test_the_existing_secret_is_required(existing_secret: str | None, says: str) -> None:
    # null removes the key (Helm's way to unset a default), which the schema then misses.
    message = refusal({"existingSecret": existing_secret})
    assert says in message, message


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"worker": {"workspaces": {"emptyDir": True}}}, "worker.workspaces.emptyDir gives each worker its own"),
        (
            {
                "worker": {"replicas": 1, "workspaces": {"emptyDir": True}},
                "autoscaling": {"enabled": True, "redis": {"address": "redis:6379"}},
            },
            "worker.workspaces.emptyDir gives each worker its own",
        ),
        ({"worker": {"sandbox": {"enabled": False}}}, "say `sandbox: none` in config"),
        ({"worker": {"sandbox": {"hostUsers": True}}}, "procMount Unmasked needs worker.sandbox.hostUsers false"),
        ({"worker": {"sandbox": {"tun": "resource"}}}, "worker.sandbox.tunResource"),
        ({"worker": {"sandbox": {"tun": "none"}}}, "say `bash: {network: false}` in config"),
        ({"databaseUrl": "postgresql://mm:pa/ss@pg/mm"}, "databaseUrl carries a password"),
        ({"brokerUrl": "redis://:hunter2@redis:6379/0"}, "put the whole URL in existingSecret as CELERY_BROKER_URL"),
        ({"databaseUrl": "postgresql://pg/mm?user=mm&password=x"}, "databaseUrl carries a password"),
        ({"serviceMonitor": {"enabled": True}, "metrics": {"enabled": False}}, "needs metrics.enabled"),
        ({"autoscaling": {"enabled": True}}, "autoscaling.redis.address"),
        (
            {"autoscaling": {"enabled": True, "minReplicaCount": 5, "maxReplicaCount": 2, "redis": {"address": "r:1"}}},
            "maxReplicaCount is below",
        ),
    ],
)
def test_a_template_guard_refuses_with_its_reason(values: dict[str, Any], says: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(says)):
        render_raw(values)


# --- the chart's files -------------------------------------------------------------------------------------------


def test_chart_metadata_and_values_parse() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "mm-chatops"
    assert chart["kubeVersion"] == ">=1.27.0-0"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["bot"]["port"] == 3000


def test_the_default_config_in_values_is_a_valid_mm_yaml(tmp_path: Path) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    (tmp_path / "mm.yaml").write_text(values["config"])
    config = load_config(tmp_path / "mm.yaml", environ={})
    assert config.agent.yolo is False


def test_every_value_the_templates_read_is_defined() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    used = set()
    for template in (CHART / "templates").iterdir():
        used |= set(re.findall(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", template.read_text()))
    assert used, "no .Values references found"
    for path in sorted(used):
        node = values
        for key in path.strip(".").split("."):
            assert isinstance(node, dict) and key in node, f".Values{path} is not in values.yaml"
            node = node[key]


def test_templates_balance_their_actions() -> None:
    for template in (CHART / "templates").iterdir():
        text = template.read_text()
        assert text.count("{{") == text.count("}}"), template.name
        opened = len(re.findall(r"\{\{-?\s*(?:if|with|range|define)\b", text))
        assert opened == len(re.findall(r"\{\{-?\s*end\b", text)), template.name


def test_the_forges_tokens_reach_the_workers_alone() -> None:
    """`workerSecret` holds what only workers use (the forges' tokens, an App's key): the bot never gets it."""
    objects = render({"workerSecret": "mm-forges"})
    worker, bot = container(workload(objects, "worker"), "worker"), container(workload(objects, "bot"), "bot")
    assert {"secretRef": {"name": "mm-forges"}} in worker["envFrom"]
    assert all(source.get("secretRef", {}).get("name") != "mm-forges" for source in bot["envFrom"])
    assert len(container(workload(render({}), "worker"), "worker")["envFrom"]) == 1  # unset: nothing more
