#!/usr/bin/env bash
# Installs what building and testing tierd needs, from Debian 12's own archive. Idempotent: packages
# already present are left alone and apt is not touched at all when nothing is missing. The Python
# client and its tests use Debian's python3-torch (CPU-only), python3-grpcio and python3-protobuf;
# the deployment files' test uses systemd (systemd-analyze verify) and python3-yaml; the package
# tests (tests/package/) dpkg-dev and file (cpack's DEB generator and dpkg-shlibdeps), and
# python3-venv, -pip, -setuptools and -wheel (the wheel, installed offline); the fuzzers clang 14
# with its libFuzzer and sanitizer runtimes; the remote (S3) source libcurl, and its tests and
# benchmark a real S3 endpoint, Ceph's RADOS Gateway (deploy/s3-gateway.sh), with awscli and
# python3-boto3 as the benchmark's references.
#
# The CUDA backend additionally needs the CUDA Toolkit (nvcc under /usr/local/cuda), which is not in
# Debian's archive; without it tierd builds with the host backend only.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler grpc-proto
  libabsl-dev liburing-dev libxxhash-dev libre2-dev nlohmann-json3-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev
  fio systemd python3-yaml
  dpkg-dev file python3-venv python3-pip python3-setuptools python3-wheel
  clang-14 libclang-rt-14-dev
  python3-torch python3-grpcio python3-protobuf python3-numpy
  libcurl4-openssl-dev libssl-dev curl openssl ceph-mon ceph-osd radosgw ceph-common awscli python3-boto3
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$package")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
else
  sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null || { echo "install-deps: run as root (or install sudo)" >&2; exit 1; }
    sudo=(sudo)
  fi
  echo "install-deps: installing ${missing[*]}"
  "${sudo[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "install-deps: CUDA Toolkit found: $(/usr/local/cuda/bin/nvcc --version | tail -n 2 | head -n 1)"
else
  echo "install-deps: no CUDA Toolkit under /usr/local/cuda; building the host backend only"
fi
