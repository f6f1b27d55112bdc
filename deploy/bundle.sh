#!/usr/bin/env bash
# deploy/bundle.sh [--tests] [--keep-symbols] [--build-dir DIR] OUT_DIR
#
# Makes a relocatable tree of a finished build: OUT_DIR/bin (tierd, tierctl) and OUT_DIR/lib (every
# shared library they load that is not part of the base system: gRPC, Protobuf, Abseil, liburing,
# OpenSSL, ...). The binaries carry RPATH $ORIGIN/../lib, so OUT_DIR can be copied to a node that
# has no -dev packages and run from anywhere. glibc, libstdc++, libgcc and the CUDA driver stay the
# node's own. With --tests, the test binaries and a CTestTestfile.cmake come along too, so
# `cd OUT_DIR && ctest -L gpu` runs the GPU tests there. Binaries are stripped of debug information
# unless --keep-symbols is given.
set -euo pipefail
build_dir=build
with_tests=0
strip_binaries=1
while (($# > 1)); do
  case $1 in
    --tests) with_tests=1; shift ;;
    --keep-symbols) strip_binaries=0; shift ;;
    --build-dir) build_dir=$2; shift 2 ;;
    *) echo "bundle: unknown option $1" >&2; exit 2 ;;
  esac
done
out=${1:?usage: deploy/bundle.sh [--tests] [--keep-symbols] [--build-dir DIR] OUT_DIR}
[[ -x "$build_dir/bin/tierd" ]] || { echo "bundle: no build in $build_dir (run deploy/build.sh)" >&2; exit 1; }

mkdir -p "$out/bin" "$out/lib"
binaries=("$build_dir/bin/tierd" "$build_dir/bin/tierctl")
if ((with_tests)); then
  for file in "$build_dir"/bin/*; do
    [[ -x "$file" && "$file" != */tierd && "$file" != */tierctl ]] && binaries+=("$file")
  done
  cp "$build_dir/relocatable/CTestTestfile.cmake" "$out/"
fi

system_libs='/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libnvidia[^/]*)\.so'
for binary in "${binaries[@]}"; do
  cp -L "$binary" "$out/bin/"
  ((strip_binaries)) && strip --strip-debug "$out/bin/$(basename "$binary")"
  ldd "$binary" | awk '/=>/ && $3 ~ /^\// {print $3}' | grep -vE "$system_libs" |
    while read -r lib; do cp -Ln "$lib" "$out/lib/"; done
done
echo "bundle: ${#binaries[@]} binaries and $(ls "$out/lib" | wc -l) libraries in $out ($(du -sh "$out" | cut -f1))"
