#!/usr/bin/env bash
# tests/package/test-python-package.sh BUILD_DIR VERSION [unittest arguments...]
#
# Builds the wheel from BUILD_DIR's Python package (python/build-wheel.sh), installs it offline into
# a fresh virtual environment (`python3 -m venv --system-site-packages`: torch, grpcio and protobuf
# come from the system), checks that tierd there is VERSION with its generated modules and helper
# library, and runs the client tests with that environment's Python against BUILD_DIR's daemon.
# Arguments after VERSION go to python/tests/run.sh (`--device cuda:0 test_client` on a GPU
# machine). A Python that is itself a virtual environment's lends the new one the base system's
# packages, not its own: put its site-packages on PYTHONPATH then. TIERD_WHEEL_PYTHON picks the
# Python (/usr/bin/python3). Then installs the assembled tree with the README's own command,
# dependencies resolved against the system's packages.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
build=$(cd "${1:?usage: test-python-package.sh BUILD_DIR VERSION [tests...]}" && pwd)
version=${2:?VERSION}
shift 2
python=${TIERD_WHEEL_PYTHON:-/usr/bin/python3}

# The source tree lacks the generated modules: pip says so and how to build, instead of installing
# a package that cannot import.
if "$python" -m pip wheel --no-deps --no-build-isolation --no-index --wheel-dir "$work/refused" \
    "$here/../../python" > "$work/refused.log" 2>&1; then
  fail "a wheel was built from the source tree"
fi
grep -q "this is the source tree" "$work/refused.log" || { cat "$work/refused.log"; fail "no clear refusal"; }
wheel=$(bash "$here/../../python/build-wheel.sh" "$build/python" "$work/dist" "$python")
echo "built $(basename "$wheel")"
"$python" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --no-index --no-deps "$wheel"
(cd / && "$work/venv/bin/python" - "$version" "$work/venv" <<'PY'
import os, sys
import tierd, tierd.v1.tierd_pb2, tierd.v1.tierd_pb2_grpc, tierd.v1.wire_pb2
version, venv = sys.argv[1], os.path.realpath(sys.argv[2])
package = os.path.dirname(os.path.realpath(tierd.__file__))
assert tierd.__version__ == version, f"tierd.__version__ is {tierd.__version__}, not {version}"
assert package.startswith(venv), f"tierd imported from {package}, not from the environment"
assert os.path.exists(os.path.join(package, "libtierd_host_event.so")), "no helper library"
print(f"tierd {tierd.__version__} installed in a fresh environment")
PY
) || fail "the installed package"
# The README's own command, dependencies resolved against what Debian installed (its torch calls
# itself 1.13.0a0): from a copy of the assembled tree, which pip builds in place.
cp -r "$build/python" "$work/assembled"
"$python" -m venv --system-site-packages "$work/readme-venv"
"$work/readme-venv/bin/python" -m pip install --quiet --no-build-isolation --no-index \
  "$work/assembled" || fail "pip install build/python --no-build-isolation --no-index (the README's command)"
(cd / && "$work/readme-venv/bin/python" -c "import tierd, torch; assert tierd.__version__ == '$version'") \
  || fail "the package installed by the README's command"
echo "the README's pip install works offline with Debian's packages"
TIERD_PYTHON=$work/venv/bin/python bash "$here/../../python/tests/run.sh" --root "$build" \
  --installed "${@:-test_client}"
