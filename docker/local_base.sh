#!/usr/bin/env bash
# A base image for docker/Dockerfile.cpu made from Debian's packages, for machines that reach Debian's package
# mirror but not Docker Hub (so `FROM python:3.11-slim` cannot be pulled): a minimal Debian bookworm root file
# system (debootstrap --variant=minbase) with python3 (3.11), python3-venv, python3-pip and ca-certificates,
# imported as an image. Needs root, debootstrap and a running Docker daemon.
#   docker/local_base.sh [TAG]        # default TAG sglang-dspark-base:bookworm; prints the tag
#   docker build -f docker/Dockerfile.cpu --build-arg BASE_IMAGE=sglang-dspark-base:bookworm ...
set -euo pipefail
tag="${1:-sglang-dspark-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
docker="${DOCKER:-docker}"
command -v debootstrap > /dev/null || { echo "local_base: debootstrap is missing (apt-get install debootstrap)" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "local_base: debootstrap needs root" >&2; exit 2; }
root=$(mktemp -d /tmp/sglang-dspark-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
  bookworm "$root" "$mirror" > "$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
rm -f "$root.log"
# What a slim image leaves out: downloaded packages and package lists (the Dockerfile runs apt-get update itself).
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | "$docker" import \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$tag" > /dev/null
echo "$tag"
