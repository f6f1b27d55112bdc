#!/usr/bin/env bash
# python/build-wheel.sh PACKAGE_DIR OUT_DIR [PYTHON]
#
# Builds the tierd wheel from PACKAGE_DIR, the package the build assembled (<build>/python), into
# OUT_DIR, offline, with PYTHON's setuptools (default /usr/bin/python3: Debian's python3-setuptools
# and python3-wheel). pip builds in a copy: it leaves its scratch files beside the sources. Prints
# the wheel's path.
set -euo pipefail
package=$(cd "${1:?usage: python/build-wheel.sh PACKAGE_DIR OUT_DIR [PYTHON]}" && pwd)
out=${2:?OUT_DIR}
python=${3:-/usr/bin/python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
cp -r "$package" "$copy/python"
rm -rf "$copy/python/build" "$copy/python"/*.egg-info
find "$copy/python" -name __pycache__ -prune -exec rm -rf {} +
"$python" -m pip wheel --quiet --no-deps --no-build-isolation --no-index --wheel-dir "$out" \
  "$copy/python" >&2
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$package/tierd/_version.py")
ls "$out"/tierd-"$version"-*.whl
