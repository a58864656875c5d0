"""deploy/kubernetes: every manifest valid against the Kubernetes schemas (kubernetes-validate, strict: no unknown
field), kustomization listing each file, and what the recipe promises (probes, the drain, the router's discovery
and kv_aware routing, the replicas' KV events)."""
import copy
import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from inference.operations.kv_events import KVEventsConfig

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
VERSION = kubernetes_validate.latest_version()


def documents() -> dict[tuple[str, str], dict]:
    """(kind, name) -> manifest, of every file kustomization.yaml lists."""
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
    return {(d["kind"], d["metadata"]["name"]): d for name in listed
            for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d}


def container(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]["containers"][0]


def test_every_manifest_is_valid_against_the_kubernetes_schemas():
    docs = documents()
    for doc in docs.values():
        kubernetes_validate.validate(doc, VERSION, strict=True)
    broken = copy.deepcopy(docs[("StatefulSet", "metrale-replica")])
    container(broken)["readinessProbe"]["httpGett"] = {"path": "/health"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)


def test_replicas_are_probed_drained_and_publish_kv_events_the_router_discovers():
    docs = documents()
    replica = container(docs[("StatefulSet", "metrale-replica")])
    assert replica["readinessProbe"]["httpGet"]["path"] == "/health"
    assert replica["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert replica["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    grace = docs[("StatefulSet", "metrale-replica")]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    config = docs[("ConfigMap", "metrale-config")]["data"]
    assert grace > int(replica["lifecycle"]["preStop"]["exec"]["command"][1]) + int(config["METRALE_SHUTDOWN_GRACE"])
    events = KVEventsConfig.parse(config["METRALE_KV_EVENTS"])
    ports = {p["name"]: p["containerPort"] for p in replica["ports"]}
    assert (events.endpoint, events.replay_endpoint) == (f"tcp://*:{ports['kv-events']}", f"tcp://*:{ports['kv-replay']}")
    assert config["DJANGO_SETTINGS_MODULE"] == "metrale_site.settings_production"
    assert {"name": "DJANGO_ALLOWED_HOSTS", "value": "$(POD_IP),$(PUBLIC_HOST)"} in replica["env"]

    router = container(docs[("Deployment", "metrale-router")])
    args = router["args"]
    assert args[args.index("--policy") + 1] == "kv_aware" and "--service-discovery" in args
    labels = docs[("StatefulSet", "metrale-replica")]["spec"]["template"]["metadata"]["labels"]
    assert args[args.index("--selector") + 1] == "app=" + labels["app"]
    assert args[args.index("--service-discovery-port") + 1] == str(ports["http"])
    role = docs[("Role", "metrale-router")]["rules"][0]
    assert role["resources"] == ["pods"] and {"list", "watch"} <= set(role["verbs"])

    worker = container(docs[("Deployment", "metrale-batch-worker")])
    assert worker["args"][:2] == ["manage", "batch_worker"]
    assert not KVEventsConfig.parse(next(e["value"] for e in worker["env"] if e["name"] == "METRALE_KV_EVENTS")).enabled
    assert {("Service", "metrale-postgres"), ("Service", "metrale-redis"), ("Job", "metrale-migrate")} <= set(docs)
    assert json.loads(config["METRALE_KV_EVENTS"])  # the value is JSON, as vLLM's --kv-events-config


def test_files_are_shared_and_only_chat_and_completions_go_through_the_router():
    docs = documents()
    files = docs[("PersistentVolumeClaim", "metrale-files")]
    assert files["spec"]["accessModes"] == ["ReadWriteMany"]
    for kind, name in (("StatefulSet", "metrale-replica"), ("Deployment", "metrale-batch-worker")):
        pod = docs[(kind, name)]["spec"]["template"]["spec"]
        volume = next(v["name"] for v in pod["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName")
                      == "metrale-files")
        mount = next(m for m in container(docs[(kind, name)])["volumeMounts"] if m["name"] == volume)
        assert mount["mountPath"] == docs[("ConfigMap", "metrale-config")]["data"]["METRALE_FILES_DIR"]
    paths = {p["path"]: p["backend"]["service"]["name"]
             for p in docs[("Ingress", "metrale")]["spec"]["rules"][0]["http"]["paths"]}
    assert paths == {"/v1/chat/completions": "metrale", "/v1/completions": "metrale", "/": "metrale-replicas-api"}
    assert docs[("Service", "metrale")]["spec"]["selector"] == {"app": "metrale-router"}
    assert docs[("Service", "metrale-replicas-api")]["spec"]["selector"] == {"app": "metrale-replica"}
