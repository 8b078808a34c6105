#!/usr/bin/env bash
# The Docker check a maintainer runs on a machine with a Docker daemon and Docker Hub (this project's CI machines
# have neither): build the CPU image, start it on loopback, wait for /health, answer one chat request, stop it.
#   scripts/docker_smoke.sh            # exit 0 when the image served the request
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
docker info > /dev/null 2>&1 || { echo "docker_smoke: no Docker daemon answers (docker info failed)" >&2; exit 2; }
tag=sglang-dspark:cpu-smoke
docker build -f docker/Dockerfile.cpu -t "$tag" .
container=$(docker run -d --rm -p 127.0.0.1::30000 "$tag")
trap 'docker stop "$container" > /dev/null 2>&1 || true' EXIT
port=$(docker port "$container" 30000 | head -1 | awk -F: '{print $NF}')
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
  sleep 2
done
curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}'
echo
echo "docker_smoke: the CPU image served a chat request"
