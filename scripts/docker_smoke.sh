#!/usr/bin/env bash
# Build the CPU image, serve it on loopback, check it and load-test it; prints build time, image size, the greedy
# match against no-spec and the load-test table. Run from anywhere, as root where something must be installed.
#   scripts/docker_smoke.sh                 # exit 0 when every check passed
#   SMOKE_BASE=local scripts/docker_smoke.sh    # force the Debian-made base (docker/local_base.sh)
#
# What it does, in order:
#   1. Docker: installs Debian's docker.io (and debootstrap) with apt-get where `dockerd` is missing and the user is
#      root; starts `dockerd` (overlay2) where no daemon answers, and leaves it running. Builds with BuildKit (the
#      client's buildx, or DOCKER_BUILDKIT=1 with a client that still has the built-in BuildKit, e.g. Debian's).
#   2. Base: the official python:3.11-slim if it can be pulled, else docker/local_base.sh (debootstrap of Debian
#      bookworm, imported).
#   3. CPU torch: from TORCH_INDEX_URL (default PyTorch's CPU index) if it answers, else a torch-2.13.0+cpu wheel
#      found on this machine (pip's find-links, /opt/wheels, $SMOKE_WHEELS) copied into docker/wheels/ for the build
#      (removed afterwards; the served image never holds it).
#   4. Builds docker/Dockerfile.cpu with the host's CA bundle as a BuildKit secret (pip trusts a proxy's CA during
#      the build; the image does not keep it).
#   5. Runs the image on 127.0.0.1 (its DSPARK server), starts a no-spec server in the same container (docker exec),
#      checks that greedy answers of both are equal token for token, and runs a short load test of both from inside
#      the container (python -m sglang_dspark.loadtest --url ...).
# Every server has --max-total-tokens and --sleep-on-idle; published ports are loopback only; the container is
# stopped (by its id) on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$(pwd)
tag="${SMOKE_TAG:-sglang-dspark:cpu-smoke}"
ca="${SMOKE_CA:-/etc/ssl/certs/ca-certificates.crt}"
torch_index="${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
log() { echo "[docker_smoke] $*"; }

# ---------------------------------------------------------------------------------------------- 1. Docker
if ! command -v dockerd > /dev/null || ! command -v debootstrap > /dev/null; then
  [[ $(id -u) == 0 ]] || { log "dockerd or debootstrap is missing and this is not root: install docker.io" >&2; exit 2; }
  log "installing Debian's docker.io and debootstrap"
  apt-get update -q > /dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io debootstrap > /dev/null
fi
docker_cli="${DOCKER:-docker}"
command -v "$docker_cli" > /dev/null || docker_cli=/usr/bin/docker
if ! "$docker_cli" info > /dev/null 2>&1; then
  [[ $(id -u) == 0 ]] || { log "no Docker daemon answers and this is not root" >&2; exit 2; }
  log "starting dockerd (log: /tmp/dockerd.log)"
  nohup dockerd > /tmp/dockerd.log 2>&1 &
  for _ in $(seq 60); do "$docker_cli" info > /dev/null 2>&1 && break; sleep 1; done
  "$docker_cli" info > /dev/null 2>&1 || { tail -20 /tmp/dockerd.log >&2; exit 1; }
fi
# A client that builds with BuildKit (needed for the secret mount).
if "$docker_cli" buildx version > /dev/null 2>&1; then
  build=("$docker_cli" buildx build --load)
elif DOCKER_BUILDKIT=1 "$docker_cli" build --help 2>/dev/null | grep -q -- "--secret"; then
  build=(env DOCKER_BUILDKIT=1 "$docker_cli" build)
elif [[ -x /usr/bin/docker ]] && DOCKER_BUILDKIT=1 /usr/bin/docker build --help 2>/dev/null | grep -q -- "--secret"; then
  build=(env DOCKER_BUILDKIT=1 /usr/bin/docker build)
else
  log "no Docker client here builds with BuildKit (install docker buildx)" >&2; exit 2
fi
docker=("$docker_cli")
log "daemon $("${docker[@]}" version --format '{{.Server.Version}}'), storage $("${docker[@]}" info --format '{{.Driver}}'), build: ${build[*]}"

# ---------------------------------------------------------------------------------------------- 2. base image
base="${SMOKE_BASE:-}"
if [[ -z "$base" ]]; then
  if timeout 120 "${docker[@]}" pull -q python:3.11-slim > /dev/null 2>&1; then base=python:3.11-slim; else base=local; fi
fi
if [[ "$base" == local ]]; then
  base=sglang-dspark-base:bookworm
  if ! "${docker[@]}" image inspect "$base" > /dev/null 2>&1; then
    log "python:3.11-slim cannot be pulled: making $base from Debian's packages (docker/local_base.sh)"
    started=$(date +%s)
    DOCKER="$docker_cli" docker/local_base.sh "$base" > /dev/null
    log "base made in $(( $(date +%s) - started )) s"
  fi
fi
log "base image: $base"

# ---------------------------------------------------------------------------------------------- 3. CPU torch
wheels="$repo/docker/wheels"
cleanup_wheels() { rm -rf "$wheels"; }
build_args=(--build-arg "BASE_IMAGE=$base")
if [[ -n "$torch_index" ]] && curl -sf -m 15 -o /dev/null "$torch_index/torch/"; then
  build_args+=(--build-arg "TORCH_INDEX_URL=$torch_index")
else
  wheel=""
  for dir in ${SMOKE_WHEELS:-} ${PIP_FIND_LINKS:-} /opt/wheels; do
    for found in "$dir"/torch-2.13.0+cpu-cp311-*.whl; do
      [[ -f "$found" ]] && { wheel="$found"; break 2; }
    done
  done
  [[ -n "$wheel" ]] || { log "neither $torch_index nor a torch-2.13.0+cpu wheel (SMOKE_WHEELS=DIR) is at hand" >&2; exit 2; }
  log "CPU torch from $wheel (the PyTorch index does not answer)"
  mkdir -p "$wheels" && cp "$wheel" "$wheels/"
  build_args+=(--build-arg "TORCH_INDEX_URL=")
fi
secret=()
[[ -s "$ca" ]] && secret=(--secret "id=pip_cert,src=$ca")

# ---------------------------------------------------------------------------------------------- 4. build
container=""
cleanup() {
  cleanup_wheels
  [[ -n "$container" ]] && "${docker[@]}" stop -t 10 "$container" > /dev/null 2>&1 || true
}
trap cleanup EXIT
log "building $tag (log: /tmp/docker_smoke_build.log)"
started=$(date +%s)
if ! "${build[@]}" --progress=plain -f docker/Dockerfile.cpu "${build_args[@]}" "${secret[@]}" -t "$tag" . \
    > /tmp/docker_smoke_build.log 2>&1; then
  tail -40 /tmp/docker_smoke_build.log >&2; exit 1
fi
build_s=$(( $(date +%s) - started ))
cleanup_wheels
size=$("${docker[@]}" image inspect -f '{{.Size}}' "$tag")
log "build time: ${build_s} s; image size: $(( size / 1000000 )) MB ($tag, base $base)"

# ---------------------------------------------------------------------------------------------- 5. serve, check, load-test
container=$("${docker[@]}" run -d --rm -p 127.0.0.1::30000 -p 127.0.0.1::30001 "$tag")
dspark_port=$("${docker[@]}" port "$container" 30000/tcp | head -1 | awk -F: '{print $NF}')
nospec_port=$("${docker[@]}" port "$container" 30001/tcp | head -1 | awk -F: '{print $NF}')
# shellcheck disable=SC2016  # $(cat ...) expands inside the container, not here
"${docker[@]}" exec -d "$container" sh -c 'exec python -m sglang.launch_server --dtype float32 --model-path "$(cat /opt/target-path)" --device cpu --max-total-tokens 8192 --sleep-on-idle --host 0.0.0.0 --port 30001 > /tmp/nospec.log 2>&1'
started=$(date +%s)
for port in "$dspark_port" "$nospec_port"; do
  for _ in $(seq 300); do
    curl -sf -m 5 "http://127.0.0.1:$port/health" > /dev/null && break
    "${docker[@]}" inspect -f '{{.State.Running}}' "$container" 2>/dev/null | grep -q true \
      || { log "the container stopped" >&2; exit 1; }
    sleep 2
  done
  curl -sf -m 5 "http://127.0.0.1:$port/health" > /dev/null || { "${docker[@]}" logs "$container" | tail -30 >&2; exit 1; }
done
log "DSPARK (127.0.0.1:$dspark_port) and no-spec (127.0.0.1:$nospec_port) healthy $(( $(date +%s) - started )) s after docker run"
"${docker[@]}" exec -i "$container" python - <<'PY'
import json, urllib.request
prompts = ["Write a haiku about the sea.", "List three prime numbers and explain why they are prime.",
           "Explain what a hash map is in two sentences.", "Translate 'good morning' into French and Spanish.",
           "def fibonacci(n):", "What is the capital of Japan? Answer in one sentence."]
def ids(port, prompt):
    body = json.dumps({"text": prompt, "sampling_params": {"max_new_tokens": 48, "temperature": 0}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", body, {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=300))
info = json.load(urllib.request.urlopen("http://127.0.0.1:30000/server_info", timeout=30))
assert info["speculative_algorithm"] == "DSPARK", info["speculative_algorithm"]
same = verify_steps = tokens = 0
for prompt in prompts:
    dspark, nospec = ids(30000, prompt), ids(30001, prompt)
    same += dspark["output_ids"] == nospec["output_ids"]
    # The draft gate may run a request on plain steps only (drafting does not pay on a busy machine): counted, not
    # required.
    verify_steps += dspark["meta_info"].get("spec_verify_ct", 0)
    tokens += dspark["meta_info"]["completion_tokens"]
print(f"[docker_smoke] greedy match: {same}/{len(prompts)} prompts, DSPARK == no-spec token for token "
      f"({tokens} tokens, {verify_steps} DSPARK verify steps)")
raise SystemExit(0 if same == len(prompts) else 1)
PY
"${docker[@]}" exec "$container" python -m sglang_dspark.loadtest --quiet \
  --url http://127.0.0.1:30001 http://127.0.0.1:30000 --label no-spec DSPARK \
  --concurrency 1 4 --prompts-per-level 8 --max-tokens 64 --output-dir /tmp/loadtest \
  | tail -40
log "OK: built in ${build_s} s, $(( size / 1000000 )) MB, served DSPARK on loopback, greedy equal to no-spec"
