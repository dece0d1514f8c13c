"""The deployment recipes in deploy/ ask `compass worker start` only for what it has.

Each recipe (the Dockerfiles' ENTRYPOINT, CMD and ENV; the Kubernetes containers' args and env;
the systemd unit's ExecStart and environment file; the command lines in docs/DEPLOY.md) is
parsed, and every ``--flag`` it passes must be an option of the command, every ``COMPASS_*``
variable it sets one the command reads, and the whole command line must parse with those
variables set (so a value of the wrong type or an unknown choice fails here, not at 3 a.m. in a
pod). The recipes must also agree with themselves: the ports probed are the ports served, a
Kubernetes worker advertises the DNS name the headless Service gives it, and the first worker
finds its own address among its --join seeds.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.core
import typer.main

from compass._cli.main import build_app

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILES = [DEPLOY / "Dockerfile", DEPLOY / "Dockerfile.cuda"]
K8S = DEPLOY / "k8s"
UNIT = DEPLOY / "compass-worker@.service"
ENV_FILE = DEPLOY / "compass-worker.env"
INSTANCE_ENV_FILE = DEPLOY / "compass-worker-instance.env"
DOC = ROOT / "docs" / "DEPLOY.md"

WORKER_PORT = 7341
METRICS_PORT = 9341
#: what a Kubernetes variable reference $(NAME) stands for when a recipe's command line is parsed
K8S_SAMPLE = {"POD_NAME": "compass-1", "POD_NAMESPACE": "default"}


# -- the command the recipes run -----------------------------------------------------------------


def _worker_start() -> typer.core.TyperCommand:
    group = typer.main.get_command(build_app())
    assert isinstance(group, typer.core.TyperGroup)
    worker = group.commands["worker"]
    assert isinstance(worker, typer.core.TyperGroup)
    start = worker.commands["start"]
    assert isinstance(start, typer.core.TyperCommand)
    return start


START = _worker_start()
FLAGS = {opt for p in START.params for opt in (*p.opts, *p.secondary_opts) if opt.startswith("--")}
ENVVARS = {p.envvar for p in START.params if isinstance(p.envvar, str)}


def _flags_in(argv: Sequence[str]) -> list[str]:
    return [arg.partition("=")[0] for arg in argv if arg.startswith("--")]


def _check_command(
    where: str, argv: Sequence[str], env: Mapping[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``argv`` (what follows ``compass worker start``) and the ``COMPASS_*`` variables ``env``
    sets are all the command's, and parse together."""
    unknown = [flag for flag in _flags_in(argv) if flag not in FLAGS]
    assert not unknown, f"{where} passes {unknown}, not options of `compass worker start`"
    ours = {name: value for name, value in env.items() if name.startswith("COMPASS_")}
    unread = sorted(set(ours) - ENVVARS)
    assert not unread, f"{where} sets {unread}, which `compass worker start` does not read"
    for name in [n for n in os.environ if n.startswith("COMPASS_")]:
        monkeypatch.delenv(name)
    for name, value in ours.items():
        monkeypatch.setenv(name, value)
    try:
        START.make_context("start", list(argv))
    except (typer.TyperException, ValueError) as exc:  # a bad flag; a bad value (pydantic's)
        message = exc.format_message() if isinstance(exc, typer.TyperException) else str(exc)
        pytest.fail(f"{where}: `compass worker start {shlex.join(argv)}` with {ours}: {message}")


def _option(argv: Sequence[str], flag: str) -> list[str]:
    """Every value ``argv`` gives ``flag`` (``--flag value`` or ``--flag=value``)."""
    values = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name == flag:
            values.append(value if eq else argv[i + 1])
    return values


def test_the_command_has_the_options_the_recipes_rely_on() -> None:
    # a sanity check of the introspection itself: a flag absent from the command is found absent
    assert {"--host", "--join", "--advertise-address", "--metrics-port", "--no-warm"} <= FLAGS
    assert "--cach-mb" not in FLAGS
    assert {"COMPASS_TOKEN", "COMPASS_JOIN", "COMPASS_METRICS_PORT"} <= ENVVARS


# -- Dockerfiles ---------------------------------------------------------------------------------


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) of each Dockerfile instruction, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        keyword, _, rest = whole.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def _final_stage(text: str) -> list[tuple[str, str]]:
    steps = _instructions(text)
    last = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last:]


def _exec_form(rest: str) -> list[str]:
    if rest.startswith("["):
        value = json.loads(rest)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value)
        return value
    return shlex.split(rest)


def _env_pairs(rest: str) -> dict[str, str]:
    """``ENV A=1 B="two words"`` (or the legacy ``ENV A 1``)."""
    words = shlex.split(rest)
    if words and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    return dict(word.split("=", 1) for word in words)


def test_dockerfile_instructions_parse() -> None:
    steps = _instructions('FROM a AS b\n# c\nENV X=1 \\\n    # inside\n    Y="2 3"\nCMD ["--p"]\n')
    assert steps == [("FROM", "a AS b"), ("ENV", 'X=1  Y="2 3"'), ("CMD", '["--p"]')]
    assert _env_pairs(steps[1][1]) == {"X": "1", "Y": "2 3"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_a_dockerfile_runs_the_worker_with_flags_and_variables_it_has(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = _final_stage(path.read_text())
    (entrypoint,) = [_exec_form(rest) for keyword, rest in stage if keyword == "ENTRYPOINT"]
    (cmd,) = [_exec_form(rest) for keyword, rest in stage if keyword == "CMD"]
    assert entrypoint == ["compass", "worker", "start"], entrypoint
    env: dict[str, str] = {}
    for keyword, rest in stage:
        if keyword == "ENV":
            env.update(_env_pairs(rest))
    _check_command(path.name, cmd, env, monkeypatch)

    # served where it is probed and published, by a user who is not root
    assert env["COMPASS_HOST"] == "0.0.0.0" and env["COMPASS_METRICS_HOST"] == "0.0.0.0"
    exposed = {int(port) for keyword, rest in stage if keyword == "EXPOSE" for port in rest.split()}
    assert exposed == {int(env["COMPASS_PORT"]), int(env["COMPASS_METRICS_PORT"])}
    (health,) = [rest for keyword, rest in stage if keyword == "HEALTHCHECK"]
    assert "/ready" in health and "COMPASS_METRICS_PORT" in health
    (user,) = [rest for keyword, rest in stage if keyword == "USER"]
    assert user.split(":")[0] not in ("root", "0")


def test_the_cuda_image_installs_the_gpu_extra_and_the_cpu_image_cpu_torch() -> None:
    cpu = DOCKERFILES[0].read_text()
    cuda = DOCKERFILES[1].read_text()
    assert "python:3.11-slim" in cpu and "download.pytorch.org/whl/cpu" in cpu
    assert re.search(r"nvidia/cuda:\S+-runtime-", cuda) and "[gpu]" in cuda


# -- Kubernetes ----------------------------------------------------------------------------------


def _k8s_documents() -> list[tuple[Path, dict[str, Any]]]:
    yaml = pytest.importorskip("yaml", reason="PyYAML parses the Kubernetes manifests")
    out = []
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict):
                out.append((path, doc))
    return out


def _containers(node: Any) -> Iterator[dict[str, Any]]:
    """Every container anywhere in a manifest (a StatefulSet, a patch of one, ...)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict))
            else:
                yield from _containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _containers(item)


def _k8s_env(container: Mapping[str, Any]) -> dict[str, str]:
    """A container's variables: literal values, or the name of where the value comes from."""
    env = {}
    for item in container.get("env", []):
        source = item.get("valueFrom")
        env[item["name"]] = str(item.get("value", f"<from {next(iter(source))}>" if source else ""))
    return env


def _expand(arg: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(NAME) expansion in a container's args, with sample values."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def test_every_kubernetes_container_passes_flags_and_variables_the_worker_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    containers = [(path, c) for path, doc in _k8s_documents() for c in _containers(doc)]
    assert len(containers) >= 2, "expected the base StatefulSet and the cuda patch"
    for path, container in containers:
        where = f"{path.relative_to(ROOT)} container {container['name']}"
        env = _k8s_env(container)
        args = [str(a) for a in container.get("command", []) + container.get("args", [])]
        _check_command(where, [_expand(a, {**env, **K8S_SAMPLE}) for a in args], env, monkeypatch)


def test_the_statefulset_names_advertises_joins_and_probes_consistently() -> None:
    docs = _k8s_documents()
    (sts,) = [d for p, d in docs if d["kind"] == "StatefulSet" and p.parent.name == "base"]
    services = {d["metadata"]["name"]: d["spec"] for p, d in docs if d["kind"] == "Service"}
    headless = services[sts["spec"]["serviceName"]]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True

    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item for item in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "secretKeyRef" in env["COMPASS_TOKEN"]["valueFrom"]
    args = container["args"]
    for arg in args:  # every $(NAME) is a variable of the container, or Kubernetes leaves it as is
        assert set(re.findall(r"\$\(([^)]*)\)", arg)) <= set(env), arg

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert _option(args, "--port") == [str(WORKER_PORT)] == [str(ports["compass"])]
    assert _option(args, "--metrics-port") == [str(METRICS_PORT)] == [str(ports["metrics"])]
    assert _option(args, "--host") == ["0.0.0.0"] == _option(args, "--metrics-host")
    probe = container["readinessProbe"]["httpGet"]
    assert probe["path"] == "/ready" and ports[probe["port"]] == METRICS_PORT

    # a pod advertises its own name under the headless Service; pod 0's name is the seed, so
    # it skips itself and starts the cluster that the others join
    (advertise,) = _option(args, "--advertise-address")
    service = sts["spec"]["serviceName"]
    assert advertise.startswith(f"$(POD_NAME).{service}.") and advertise.endswith(f":{WORKER_PORT}")
    first = advertise.replace("$(POD_NAME)", f"{sts['metadata']['name']}-0")
    assert first in _option(args, "--join"), (first, _option(args, "--join"))
    assert _option(args, "--name") == ["$(POD_NAME)"]
    pod_security = sts["spec"]["template"]["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] is True and pod_security["runAsUser"] != 0


def test_every_kubernetes_object_is_valid_against_the_api_schema() -> None:
    validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate checks them")
    checked = 0
    for path, doc in _k8s_documents():
        if doc.get("kind") in ("Kustomization", "ScaledObject") or path.parent.name == "cuda":
            continue  # kustomize's file, KEDA's (a CRD: below), the GPU overlay's patch
        validate.validate(doc, "1.30.0", strict=True)  # raises on a field that is wrong
        checked += 1
    assert checked >= 4  # two Services, the StatefulSet, the PodDisruptionBudget


def test_the_autoscalers_size_the_statefulset_by_the_desired_worker_gauge() -> None:
    """The HPA and the KEDA ScaledObject target the base StatefulSet, read the gauge every
    worker exports, ask for one replica per desired worker, scale in one pod at a time (each
    through the drain), and each overlay builds on the base."""
    docs = _k8s_documents()
    (sts,) = [d for p, d in docs if d["kind"] == "StatefulSet" and p.parent.name == "base"]
    (hpa,) = [d for _, d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    (keda,) = [d for _, d in docs if d["kind"] == "ScaledObject"]
    target = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts["metadata"]["name"]}
    assert hpa["spec"]["scaleTargetRef"] == target == keda["spec"]["scaleTargetRef"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == "compass_desired_workers"
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    (trigger,) = keda["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["threshold"] == "1"
    assert "compass_desired_workers" in trigger["metadata"]["query"]
    assert keda["apiVersion"] == "keda.sh/v1alpha1"
    for low, high in (
        (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]),
        (keda["spec"]["minReplicaCount"], keda["spec"]["maxReplicaCount"]),
    ):
        assert 1 <= low <= high  # fmt: skip
    keda_behavior = keda["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    for behavior in (hpa["spec"]["behavior"], keda_behavior):
        assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0  # out at once
        assert behavior["scaleDown"]["policies"] == [{"type": "Pods", "value": 1,
                                                      "periodSeconds": 60}]  # fmt: skip
    # the metric is served where the pods are scraped
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(METRICS_PORT)
    for overlay in ("autoscale-hpa", "autoscale-keda"):
        (kust,) = [d for p, d in docs if p.parent.name == overlay and d["kind"] == "Kustomization"]
        assert "../base" in kust["resources"] and len(kust["resources"]) == 2
        for name in kust["resources"][1:]:
            assert (K8S / overlay / name).is_file()


def test_a_stopping_pod_drains_within_its_grace_period_one_at_a_time() -> None:
    docs = [doc for path, doc in _k8s_documents() if path.parent.name == "base"]
    (sts,) = [d for d in docs if d.get("kind") == "StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (drain_text,) = _option(container["args"], "--drain-timeout")
    grace = pod["terminationGracePeriodSeconds"]
    assert 0 < float(drain_text) < grace  # never killed mid-drain
    pre_stop = " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    assert "kill -TERM 1" in pre_stop and "kill -0 1" in pre_stop  # starts the drain, waits
    (budget,) = [d for d in docs if d.get("kind") == "PodDisruptionBudget"]
    assert budget["spec"]["maxUnavailable"] == 1
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    gpu = [d for path, d in _k8s_documents() if path.name == "gpu.yaml"]
    (gpu_args,) = [c["args"] for d in gpu for c in _containers(d)]
    assert _option(gpu_args, "--drain-timeout") == [drain_text]  # the overlay replaces args


def test_the_cuda_variant_asks_for_one_gpu_per_worker() -> None:
    (patch,) = [d for p, d in _k8s_documents() if p.parent.name == "cuda" and d.get("spec")]
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert _option(container["args"], "--backend") == ["cupy"]


# -- systemd -------------------------------------------------------------------------------------


def _unit_entries(text: str) -> list[tuple[str, str]]:
    """(key, value) of each ``Key=value`` line of a unit file, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;" or line.startswith("[")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        key, _, value = (pending + line).partition("=")
        pending = ""
        out.append((key.strip(), value.strip()))
    return out


def _assignment(word: str) -> tuple[str, str]:
    name, _, value = word.partition("=")
    return name, value


def _env_file(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and line[0] != "#")
    return {key.strip(): " ".join(shlex.split(value)) for key, value in pairs}


def test_the_systemd_unit_runs_the_worker_with_flags_and_variables_it_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entries = _unit_entries(UNIT.read_text())
    (exec_start,) = [value for key, value in entries if key == "ExecStart"]
    argv = shlex.split(exec_start.lstrip("-@:+!"))
    assert Path(argv[0]).name == "compass" and argv[1:3] == ["worker", "start"], argv
    env: dict[str, str] = {}
    for key, value in entries:
        if key == "Environment":
            env.update(_assignment(word) for word in shlex.split(value))
    env_files = [value for key, value in entries if key == "EnvironmentFile"]
    assert env_files == ["/etc/compass/worker.env", "/etc/compass/worker-%i.env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "%i"  # an instance per GPU
    from_file = {**_env_file(ENV_FILE.read_text()), **_env_file(INSTANCE_ENV_FILE.read_text())}
    assert "COMPASS_TOKEN" in from_file  # the token comes from the file, never the command line
    assert not _option(argv, "--token")
    # every instance binds its own ports: nothing in the unit pins one (a flag beats a variable)
    for flag in ("--port", "--metrics-port", "--name"):
        assert not _option(argv, flag), flag
    assert {"COMPASS_PORT", "COMPASS_METRICS_PORT", "COMPASS_NAME"} <= set(from_file)
    # systemd waits longer than the worker drains before it kills it
    (drain_text,) = _option(argv, "--drain-timeout")
    drain = float(drain_text)
    stop = float(dict(entries)["TimeoutStopSec"])
    assert 0 < drain < stop
    _check_command(f"{UNIT.name} with {ENV_FILE.name}", argv[3:], {**env, **from_file}, monkeypatch)
    user = dict(entries).get("User")
    assert user not in (None, "root", "0")


# -- the guide -----------------------------------------------------------------------------------


def _guide_commands(text: str) -> list[str]:
    """What follows ``compass worker start``, or an image name in ``docker run``, in every
    command the guide shows (in code blocks, continuation lines joined, or in inline code)."""
    fenced = re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)
    blocks = [body for lang, body in fenced if lang in ("", "sh", "bash", "console")]
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
    found = [c.split("compass worker start", 1)[1] for c in inline if "compass worker start" in c]
    for line in lines:
        command = line.split("#", 1)[0].split("&&", 1)[0]
        if "compass worker start" in command:
            found.append(command.split("compass worker start", 1)[1])
        elif command.strip().startswith("docker run"):
            image = re.search(r"\s\S+:(?:cpu|cuda)(?=\s|$)", command)
            assert image, f"docs/DEPLOY.md: no compass image in {command!r}"
            found.append(command[image.end() :])
    return found


def test_the_worker_command_lines_in_the_guide_use_flags_the_worker_has() -> None:
    text = DOC.read_text()
    commands = _guide_commands(text)
    assert len(commands) >= 3, commands
    for rest in commands:
        unknown = [flag for flag in _flags_in(shlex.split(rest)) if flag not in FLAGS]
        assert not unknown, f"docs/DEPLOY.md: `{rest.strip()}` passes {unknown}"
    for name in set(re.findall(r"\bCOMPASS_[A-Z_]+\b", text)):
        assert name in ENVVARS, f"docs/DEPLOY.md mentions {name}, which the worker does not read"
