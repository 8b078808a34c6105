"""The README's two set-up commands are the ones the project really runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_commands():
    text = (ROOT / "README.md").read_text()
    quick_start = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", quick_start, flags=re.S)


def test_readme_has_exactly_two_setup_commands():
    commands = readme_commands()
    assert len(commands) == 2, commands
    assert commands[0].startswith("scripts/install.sh cpu") and "demo" in commands[0]


def test_ci_runs_the_readme_test_command():
    assert readme_commands()[1] in (ROOT / ".ci" / "run").read_text().splitlines()


def test_cpu_image_installs_with_the_install_script_and_serves_the_embedded_pair():
    dockerfile = (ROOT / "docker" / "Dockerfile.cpu").read_text()
    instructions = re.sub(r"\\\n\s*", " ", dockerfile).splitlines()  # continuation lines joined
    assert any(i.startswith("RUN ") and "scripts/install.sh cpu" in i for i in instructions)
    assert "python -m sglang_dspark.embedded.smollm2 --dtype float32" in dockerfile  # converted at build time
    cmd = [line for line in dockerfile.splitlines() if line.startswith("CMD")][0]
    for flag in ("--speculative-algorithm DSPARK", "--dtype float32", "--device cpu", "--max-total-tokens",
                 "--sleep-on-idle"):
        assert flag in cmd, flag
    assert "HEALTHCHECK" in dockerfile and "/health" in dockerfile
    assert ".venv/" in (ROOT / ".dockerignore").read_text()  # the host's venv never lands in the image


def test_readme_stays_a_guide_of_at_most_300_lines():
    """One current table per capability; every dated run lives in benchmarks/RESULTS.md."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move dated runs to benchmarks/RESULTS.md"
