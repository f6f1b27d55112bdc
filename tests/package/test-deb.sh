#!/usr/bin/env bash
# tests/package/test-deb.sh BUILD_DIR VERSION
#
# Builds the Debian package from BUILD_DIR (cpack -G DEB), inspects it — its files, its conffile,
# its dependencies on the system's runtime libraries and not bundled copies, its maintainer
# scripts — then installs it into a scratch root with dpkg (--root, scripts run with DPKG_ROOT
# rather than chrooted), checks what the scripts did there (the tierd user, no service started),
# runs the installed daemon, and purges the package, leaving none of its files behind.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
build=$(cd "${1:?usage: test-deb.sh BUILD_DIR VERSION}" && pwd)
version=${2:?VERSION}

(cd "$work" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/out" > "$work/cpack.log") ||
  { cat "$work/cpack.log"; fail "cpack"; }
deb=$(ls "$work"/out/tierd_"$version"_*.deb) || fail "no tierd_${version}_ARCH.deb in $(ls "$work/out")"
echo "built $(basename "$deb")"

# What is in it.
contents=$(dpkg-deb -c "$deb" | awk '{print $6}')
for path in ./usr/bin/tierd ./usr/bin/tierctl ./usr/include/tierd/client/tierd_client.h \
    ./lib/systemd/system/tierd@.service ./etc/tierd/tierd.conf ./usr/lib/sysusers.d/tierd.conf; do
  grep -qx "$path" <<< "$contents" || fail "$path is not in the package"
done
grep -q 'libtierd_client\.so\.' <<< "$contents" || fail "no libtierd_client.so.* in the package"
grep -q 'tierd-client\.pc$' <<< "$contents" || fail "no tierd-client.pc in the package"
grep -q 'tierdConfig\.cmake$' <<< "$contents" || fail "no tierdConfig.cmake in the package"
if grep -E 'lib(grpc|protobuf|absl|uring|xxhash|re2)' <<< "$contents"; then
  fail "the package bundles the system's libraries"
fi
grep -q 'ExecStart=.*/usr/bin/tierd ' <<< "$(dpkg-deb --fsys-tarfile "$deb" | tar -xO ./lib/systemd/system/tierd@.service)" ||
  fail "the unit does not run /usr/bin/tierd"

# Its control data.
[[ $(dpkg-deb -f "$deb" Package) == tierd && $(dpkg-deb -f "$deb" Version) == "$version" ]] ||
  fail "package $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)"
depends=$(dpkg-deb -f "$deb" Depends)
for library in libgrpc++ libprotobuf libabsl liburing; do
  grep -q "$library" <<< "$depends" || fail "Depends lacks $library: $depends"
done
dpkg-deb -e "$deb" "$work/control"
[[ $(cat "$work/control/conffiles") == /etc/tierd/tierd.conf ]] || fail "conffiles: $(cat "$work/control/conffiles")"
for script in postinst prerm postrm; do
  [[ -x $work/control/$script ]] || fail "no executable $script"
done
echo "Depends: $depends"

# Installed into a scratch root, and purged.
root=$work/root
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/etc"
touch "$root/var/lib/dpkg/status" "$root/etc/passwd" "$root/etc/group" "$root/etc/shadow" "$root/etc/gshadow"
dpkg=(dpkg --root="$root" --force-script-chrootless --force-not-root --force-depends --log=/dev/null)
"${dpkg[@]}" --install "$deb" > "$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg --install"; }
[[ $("${dpkg[@]}" --status tierd | sed -n 's/^Status: //p') == "install ok installed" ]] ||
  fail "dpkg does not list tierd as installed"
grep -q '^tierd:' "$root/etc/passwd" || fail "postinst did not create the tierd user"
grep -q '^tierd:' "$root/etc/group" || fail "postinst did not create the tierd group"
[[ -z $(find "$root/etc/systemd" -name 'tierd@*' 2>/dev/null) ]] || fail "a tierd unit was enabled"
[[ $("$root/usr/bin/tierd" --version) == "tierd $version" ]] || fail "the installed tierd's --version"
start_daemon "$root/usr/bin/tierd" "$root/usr/bin/tierctl"
[[ $("$root/usr/bin/tierctl" --socket="$work/tierd.sock" stats | sed -n 's/^version: //p') == "$version" ]] ||
  fail "the installed daemon's stats do not name version $version"
kill -TERM "$daemon_pid" && wait "$daemon_pid"
daemon_pid=
"${dpkg[@]}" --purge tierd > "$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg --purge"; }
left=$(cd "$root" && find . -type f -not -path './var/lib/dpkg/*' -not -path './etc/*' | sort)
[[ -z $left ]] || fail "files left after purge: $left"
[[ ! -e $root/etc/tierd/tierd.conf ]] || fail "purge left the conffile"
echo "PASS"
