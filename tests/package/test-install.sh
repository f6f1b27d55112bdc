#!/usr/bin/env bash
# tests/package/test-install.sh BUILD_DIR VERSION
#
# `cmake --install BUILD_DIR --prefix P` into a scratch prefix: the binaries report VERSION, only the
# public headers are installed, and tests/package/consumer — a model server's smallest client — is
# built against P once with find_package(tierd) and once with pkg-config, and both run against the
# installed daemon, storing and fetching back 1 MiB. The README's C++ example is compiled in the
# find_package build too.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
build=$(cd "${1:?usage: test-install.sh BUILD_DIR VERSION}" && pwd)
version=${2:?VERSION}
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for program in tierd tierctl; do
  [[ $("$prefix/bin/$program" --version) == "$program $version" ]] ||
    fail "$program --version says '$("$prefix/bin/$program" --version)', not '$program $version'"
done
headers=$(cd "$prefix/include" && find . -type f | sort | tr '\n' ' ')
[[ $headers == "./tierd/client/tierd_client.h ./tierd/device/device.h ./tierd/tierd/v1/tierd.grpc.pb.h ./tierd/tierd/v1/tierd.pb.h " ]] ||
  fail "installed headers: $headers"
libdir=$(dirname "$(find "$prefix" -name "libtierd_client.so" | head -n 1)")
[[ -f $libdir/cmake/tierd/tierdConfig.cmake && -f $libdir/pkgconfig/tierd-client.pc ]] ||
  fail "no package files beside $libdir/libtierd_client.so"
echo "installed into a scratch prefix: $(find "$prefix" -type f | wc -l) files"

# The README's C++ example: the ```cpp block under "## Using tierd from C++".
readme=$here/../../README.md
awk '/^## Using tierd from C\+\+/ { section = 1; next }
     /^## / { section = 0 }
     section && /^```cpp$/ { code = 1; next }
     code && /^```$/ { exit }
     code { print }' "$readme" > "$work/readme_example.cc"
grep -q 'tierd::Client::Connect' "$work/readme_example.cc" ||
  fail "no C++ example under '## Using tierd from C++' in $readme"

# find_package(tierd) → tierd::client, and the README's example.
cmake -S "$here/consumer" -B "$work/with-cmake" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DREADME_EXAMPLE="$work/readme_example.cc" \
  > "$work/configure.log" || { cat "$work/configure.log"; fail "configuring the consumer"; }
cmake --build "$work/with-cmake" > "$work/build.log" || { cat "$work/build.log"; fail "building it"; }
# pkg-config --cflags --libs tierd-client.
flags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs tierd-client)
c++ -std=c++17 -o "$work/with-pkg-config" "$here/consumer/consumer.cc" $flags \
  -Wl,-rpath,"$libdir" || fail "building the consumer with pkg-config ($flags)"

start_daemon "$prefix/bin/tierd" "$prefix/bin/tierctl"
"$work/with-cmake/consumer" "$work/tierd.sock" || fail "the find_package consumer"
"$work/with-pkg-config" "$work/tierd.sock" || fail "the pkg-config consumer"
echo "PASS"
