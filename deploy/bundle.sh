#!/usr/bin/env bash
# deploy/bundle.sh [--tests | --bench] [--keep-symbols] [--build-dir DIR] OUT_DIR | OUT.tar.gz
#
# Makes a relocatable tree of a finished build: OUT_DIR/bin (tierd, tierctl) and OUT_DIR/lib (every
# shared library they load that is not part of the base system: gRPC, Protobuf, Abseil, liburing,
# OpenSSL, ...). The binaries carry RPATH $ORIGIN/../lib, so OUT_DIR can be copied to a node that
# has no -dev packages and run from anywhere. glibc, libstdc++, libgcc and the CUDA driver stay the
# node's own. With --tests, the test binaries and a CTestTestfile.cmake come along too, so
# `cd OUT_DIR && ctest -L gpu` runs the GPU tests there (the Python client's among them: OUT_DIR/python
# holds the package, its tests and examples; the node's own Python with torch, grpcio and protobuf
# runs them). With --bench, the benchmarks, their scripts
# (OUT_DIR/bench) and fio with its libraries (OUT_DIR/fio.tar.xz, unpacked by the scripts) come
# along instead, for bench/run-gpu-path-bench.sh, bench/run-load-bench.sh,
# bench/run-disk-read-bench.sh and bench/run-node-bench.sh. Binaries are stripped
# of debug information unless --keep-symbols is given. Given a name ending in .tar.gz, the tree is packed into that tarball
# instead, under one top folder tierd/ (tar xzf OUT.tar.gz -C /opt gives /opt/tierd/bin/tierd).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build_dir=build
with_tests=0
with_bench=0
strip_binaries=1
while (($# > 1)); do
  case $1 in
    --tests) with_tests=1; shift ;;
    --bench) with_bench=1; shift ;;
    --keep-symbols) strip_binaries=0; shift ;;
    --build-dir) build_dir=$2; shift 2 ;;
    *) echo "bundle: unknown option $1" >&2; exit 2 ;;
  esac
done
out=${1:?usage: deploy/bundle.sh [--tests | --bench] [--keep-symbols] [--build-dir DIR] OUT_DIR | OUT.tar.gz}
[[ -x "$build_dir/bin/tierd" ]] || { echo "bundle: no build in $build_dir (run deploy/build.sh)" >&2; exit 1; }
tarball=
if [[ $out == *.tar.gz ]]; then
  tarball=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
  packing=$(mktemp -d)
  trap 'rm -rf "$packing"' EXIT
  out=$packing/tierd
fi

mkdir -p "$out/bin" "$out/lib"
binaries=("$build_dir/bin/tierd" "$build_dir/bin/tierctl")
if ((with_tests)); then
  for file in "$build_dir"/bin/*; do
    [[ -x "$file" && "$file" != */tierd && "$file" != */tierctl ]] && binaries+=("$file")
  done
  cp "$build_dir/relocatable/CTestTestfile.cmake" "$out/"
fi
if ((with_tests || with_bench)); then
  # The Python client package, with its tests and examples beside it (python/tests/run.sh), and
  # what makes it installable (tests/package/test-python-package.sh builds a wheel from it there).
  mkdir -p "$out/python"
  cp -r "$build_dir/python/tierd" "$build_dir"/python/{pyproject.toml,setup.py,README.md} "$out/python/"
  cp -r "$here/python/tests" "$here/python/examples" "$out/python/"
  find "$out/python" -name __pycache__ -prune -exec rm -rf {} +
  binaries+=("$build_dir/python/tierd/libtierd_host_event.so")
fi
if ((with_bench)); then
  binaries+=("$build_dir/bin/gpu_path_bench" "$build_dir/bin/disk_read_bench"
    "$build_dir/bin/arena_pin_bench" "$build_dir/bin/load_bench" "$build_dir/bin/event_limit_bench"
    "$build_dir/bin/node_bench" "$build_dir/bin/codec_bench")
  mkdir -p "$out/bench"
  cp "$here/bench/run-gpu-path-bench.sh" "$here/bench/run-load-bench.sh" \
    "$here/bench/run-disk-read-bench.sh" "$here/bench/run-node-bench.sh" "$here/bench/safetensors_load.py" \
    "$here/bench/stream_weights_bench.py" "$here/bench/kv_cache_bench.py" "$here/bench/llama_decode_bench.py" \
    "$here/bench/moe_decode_bench.py" "$here/bench/pipeline_bench.py" "$here/bench/tp_forward_check.py" \
    "$here/bench/restart_bench.py" \
    "$here/bench/bench_harness.py" "$here/bench/run-kv-cache-bench.sh" "$out/bench/"
  fio=$(command -v fio) || { echo "bundle: --bench needs fio (apt-get install fio)" >&2; exit 1; }
  staging=$(mktemp -d)
  mkdir -p "$staging/fio/lib"
  cp -L "$fio" "$staging/fio/"
  ldd "$fio" | awk '/=>/ && $3 ~ /^\// {print $3}' | grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -Ln "$lib" "$staging/fio/lib/"; done
  tar cJf "$out/fio.tar.xz" -C "$staging" fio
  rm -rf "$staging"
fi

system_libs='/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libnvidia[^/]*)\.so'
for binary in "${binaries[@]}"; do
  if [[ $binary == *.so ]]; then
    installed="$out/python/tierd/$(basename "$binary")"  # already copied with its package
  else
    cp -L "$binary" "$out/bin/"
    installed="$out/bin/$(basename "$binary")"
  fi
  ((strip_binaries)) && strip --strip-debug "$installed"
  # A binary that loads only system libraries leaves grep nothing to print (status 1).
  ldd "$binary" | awk '/=>/ && $3 ~ /^\// {print $3}' | { grep -vE "$system_libs" || true; } |
    while read -r lib; do cp -Ln "$lib" "$out/lib/"; done
done
if [[ -n $tarball ]]; then
  tar czf "$tarball" -C "$(dirname "$out")" tierd
  echo "bundle: ${#binaries[@]} binaries and $(ls "$out/lib" | wc -l) libraries in $tarball ($(du -sh "$tarball" | cut -f1))"
else
  echo "bundle: ${#binaries[@]} binaries and $(ls "$out/lib" | wc -l) libraries in $out ($(du -sh "$out" | cut -f1))"
fi
