#!/usr/bin/env bash
# tests/deploy_test.sh BUNDLE_DIR | --build-dir BUILD_DIR
#
# Tests the deployment files against a bundle made by deploy/bundle.sh (BUNDLE_DIR/bin/tierd and
# bin/tierctl; the daemons run on the host backend, so no GPU is needed). With --build-dir, the
# bundle is first made from that build as a tarball and unpacked elsewhere (check f), and the
# unpacked tree is the bundle the other checks use.
#   a. the systemd unit, as deploy/install.sh --destdir installs it, passes `systemd-analyze verify`
#      (as instance tierd@0) without a complaint, and the tierd its ExecStart runs is installed;
#   b. deploy/install.sh --destdir lays out PREFIX/bin, PREFIX/lib, the tierctl symlink, the unit
#      (with --prefix rewritten into it) and the config, and a second run keeps an edited config;
#   c. the Kubernetes manifests parse (python3 with PyYAML) and the DaemonSet has hostIPC, hostPID,
#      the /run/tierd hostPath, its probes, and the uid/gid the Dockerfile gives the image;
#   d. deploy/k8s/tierd-node.sh starts a daemon per "GPU" (TIERD_GPUS=2, TIERD_DEVICE_PREFIX=host),
#      both answer `tierctl health` and tierd-health, SIGTERM stops both and tierd-node exits 0
#      within 20 s; SIGKILL of one daemon makes tierd-node stop the other and exit non-zero;
#   e. tierd starts with deploy/tierd.conf and with the ConfigMap's tierd.conf as --config;
#   g. (as root) the run directory, with the mode the unit and the DaemonSet give /run/tierd, lets a
#      member of only a client group's Unix group connect to that group's socket and not to the
#      main ones; a tierd whose user is not a member of a client group's Unix group exits 2 saying
#      so;
#   f. (--build-dir) the tarball unpacks into a tierd/ folder whose binaries load every non-system
#      library from its own lib/ (RPATH $ORIGIN/../lib), and its tierd serves from there.
# Prints each check; exits 0 when all pass, 1 when any fails, 2 on bad usage. Needs systemd-analyze
# (systemd) and python3-yaml; uses no fixed TCP port.
set -euo pipefail
prog="deploy_test"
repo=$(cd "$(dirname "$0")/.." && pwd)

usage() {
  echo "usage: tests/deploy_test.sh BUNDLE_DIR (made by deploy/bundle.sh) | --build-dir BUILD_DIR" >&2
  exit 2
}
build_dir=
case $# in
  1) [[ $1 != --* ]] || usage ;;
  2) [[ $1 == --build-dir ]] || usage; build_dir=$2 ;;
  *) usage ;;
esac

tmp=$(mktemp -d)
groups_started=()  # process groups of the tierd-node runs, killed on exit if still there
cleanup() {
  local group
  for group in "${groups_started[@]}"; do kill -KILL -- "-$group" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

if [[ -n $build_dir ]]; then
  echo "$prog: == f. the bundle as a tarball, unpacked elsewhere"
  "$repo/deploy/bundle.sh" --build-dir "$build_dir" "$tmp/tierd.tar.gz" || { echo "$prog: FAIL  deploy/bundle.sh"; exit 1; }
  mkdir -p "$tmp/elsewhere"
  tar xzf "$tmp/tierd.tar.gz" -C "$tmp/elsewhere"
  set -- "$tmp/elsewhere/tierd"
fi
for file in bin/tierd bin/tierctl; do
  [[ -x $1/$file ]] || { echo "$prog: $1/$file is missing or not executable" >&2; exit 2; }
done
bundle=$(cd "$1" && pwd)
tierd=$bundle/bin/tierd
tierctl=$bundle/bin/tierctl

checks=0
failures=0
ok() { checks=$((checks + 1)); echo "$prog: ok    $*"; }
fail() { checks=$((checks + 1)); failures=$((failures + 1)); echo "$prog: FAIL  $*"; }
check() {  # check DESCRIPTION COMMAND...: ok when COMMAND succeeds
  local description=$1
  shift
  if "$@"; then ok "$description"; else fail "$description"; fi
}
section() { echo; echo "$prog: == $*"; }

# ---- f: the unpacked tarball (with --build-dir) ----------------------------------------------
# Libraries the binaries load from outside the bundle: only the base system's.
outside_libraries() {  # BINARY
  ldd "$1" | awk '/=>/ && $3 ~ /^\// {print $3}' | xargs -r realpath | grep -v "^$bundle/lib/" |
    grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libnvidia[^/]*)\.so' || true
}
serves_from_bundle() {
  local dir=$tmp/from-bundle status=0
  mkdir -p "$dir"
  "$tierd" --device=host --socket="$dir/s.sock" --state-dir="$dir/state" --host-cache-bytes=64MiB \
    --gpu-pool-bytes=64MiB >"$dir/log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do "$tierctl" --socket="$dir/s.sock" health >/dev/null 2>&1 && break; sleep 0.1; done
  "$tierctl" --socket="$dir/s.sock" health >/dev/null || status=1
  kill -TERM "$pid"
  wait "$pid" || status=1
  return "$status"
}
if [[ -n $build_dir ]]; then
  for binary in tierd tierctl; do
    if ! ldd "$bundle/bin/$binary" | grep -q 'not found' && [[ -z $(outside_libraries "$bundle/bin/$binary") ]]; then
      ok "bin/$binary loads every non-system library from the bundle's lib/"
    else
      fail "bin/$binary loads every non-system library from the bundle's lib/"
      ldd "$bundle/bin/$binary" | sed 's/^/    /'
    fi
  done
  check "the unpacked tierd serves (tierctl health) and stops with status 0" serves_from_bundle
fi

# ---- b (first, since a verifies what it installs): install.sh --destdir -------------------------
section "b. install.sh --destdir"
dest=$tmp/dest
if timeout 120 "$repo/deploy/install.sh" --bundle "$bundle" --destdir "$dest" >"$tmp/install1.log" 2>&1; then
  ok "install.sh --bundle BUNDLE --destdir DEST exits 0"
else
  fail "install.sh --bundle BUNDLE --destdir DEST exits 0"
  sed 's/^/    /' "$tmp/install1.log"
fi
sed 's/^/    | /' "$tmp/install1.log"
check "PREFIX/bin/tierd and tierctl are executable" test -x "$dest/opt/tierd/bin/tierd" -a -x "$dest/opt/tierd/bin/tierctl"
check "PREFIX/lib holds the bundle's libraries" diff -r -q "$bundle/lib" "$dest/opt/tierd/lib"
check "the installed tierd is the bundle's" cmp -s "$tierd" "$dest/opt/tierd/bin/tierd"
check "/usr/local/bin/tierctl -> /opt/tierd/bin/tierctl" \
  test "$(readlink "$dest/usr/local/bin/tierctl" 2>/dev/null)" = /opt/tierd/bin/tierctl
check "the unit is installed unchanged for the default prefix" \
  cmp -s "$repo/deploy/systemd/tierd@.service" "$dest/etc/systemd/system/tierd@.service"
check "/etc/tierd/tierd.conf is the example" cmp -s "$repo/deploy/tierd.conf" "$dest/etc/tierd/tierd.conf"
check "it says it skipped useradd and systemctl" grep -q 'not creating the tierd user' "$tmp/install1.log"

echo "# edited by the operator" >>"$dest/etc/tierd/tierd.conf"
cp "$dest/etc/tierd/tierd.conf" "$tmp/edited.conf"
echo "kept" >"$dest/opt/tierd/operator-notes.txt"
touch "$dest/opt/tierd/bin/stale-binary"
if timeout 120 "$repo/deploy/install.sh" --bundle "$bundle" --destdir "$dest" >"$tmp/install2.log" 2>&1; then
  ok "a second install.sh over it exits 0"
else
  fail "a second install.sh over it exits 0"
  sed 's/^/    /' "$tmp/install2.log"
fi
check "the second run keeps the edited tierd.conf" cmp -s "$tmp/edited.conf" "$dest/etc/tierd/tierd.conf"
check "and says so" grep -q 'kept the existing /etc/tierd/tierd.conf' "$tmp/install2.log"
check "bin/ is replaced, not merged (a file only in the old bin/ is gone)" test ! -e "$dest/opt/tierd/bin/stale-binary"
check "other files in PREFIX are carried over" test -f "$dest/opt/tierd/operator-notes.txt"
check "no PREFIX.new or PREFIX.old is left" test ! -e "$dest/opt/tierd.new" -a ! -e "$dest/opt/tierd.old"

dest2=$tmp/dest-prefix
if timeout 120 "$repo/deploy/install.sh" --bundle "$bundle" --destdir "$dest2" --prefix /srv/tier\&d >"$tmp/install3.log" 2>&1; then
  ok "install.sh --prefix /srv/tier&d exits 0"
else
  fail "install.sh --prefix /srv/tier&d exits 0"
  sed 's/^/    /' "$tmp/install3.log"
fi
unit2=$dest2/etc/systemd/system/tierd@.service
check "--prefix: binaries under DEST/srv/tier&d" test -x "$dest2/srv/tier&d/bin/tierd"
check "--prefix: the unit runs /srv/tier&d/bin/tierd" grep -qF "exec /srv/tier&d/bin/tierd " "$unit2"
lacks() { ! grep -q -- "$1" "$2"; }  # lacks TEXT FILE
check "--prefix: no /opt/tierd left in the unit" lacks /opt/tierd "$unit2"
check "--prefix: the symlink points into it" test "$(readlink "$dest2/usr/local/bin/tierctl" 2>/dev/null)" = "/srv/tier&d/bin/tierctl"
status=0
timeout 30 "$repo/deploy/install.sh" --bogus >/dev/null 2>&1 || status=$?
check "install.sh with an unknown option exits 2" test "$status" -eq 2
status=0
timeout 30 "$repo/deploy/install.sh" --destdir "$tmp/x" --enable two >/dev/null 2>&1 || status=$?
check "install.sh --enable two exits 2" test "$status" -eq 2

# ---- a: systemd-analyze verify ---------------------------------------------------------------------
section "a. systemd-analyze verify"
analyze=/usr/bin/systemd-analyze
command -v "$analyze" >/dev/null || analyze=$(command -v systemd-analyze || true)
# verify_unit UNIT_FILE: verifies UNIT_FILE as instance tierd@0 (a template cannot be verified as
# such: the instance name fills in %i) and prints what systemd-analyze said about it. Fails when
# systemd-analyze fails or says anything about the unit: it only warns ("..., ignoring") about
# unknown keys and bad values, exiting 0.
verify_unit() {
  local dir
  dir=$(mktemp -d "$tmp/verify.XXXX")
  cp "$1" "$dir/tierd@.service"
  ln -s "tierd@.service" "$dir/tierd@0.service"
  local output status=0
  output=$(cd "$dir" && timeout 60 "$analyze" verify "$dir/tierd@0.service" 2>&1) || status=$?
  printf '%s\n' "$output" | sed '/^$/d; s/^/    | /'
  ((status == 0)) && ! grep -q 'tierd@' <<<"$output"
}
if [[ -z $analyze ]]; then
  fail "systemd-analyze is not installed (Debian: apt-get install systemd)"
else
  unit=$dest/etc/systemd/system/tierd@.service
  check "systemd-analyze verify: the installed unit, as tierd@0, has no errors or warnings" verify_unit "$unit"
  # The checker itself: the same unit with a bad value must be caught.
  sed 's/^Type=notify$/Type=notfy/' "$unit" >"$tmp/broken.service"
  if verify_unit "$tmp/broken.service" >/dev/null; then
    fail "systemd-analyze verify catches a broken copy (Type=notfy)"
  else
    ok "systemd-analyze verify catches a broken copy (Type=notfy)"
  fi
  # ExecStart is /bin/sh -c 'exec PREFIX/bin/tierd ...': verify checks /bin/sh; check tierd here.
  execd=$(sed -n "s|^ExecStart=/bin/sh -c 'exec \([^ ]*\) .*|\1|p" "$unit")
  check "ExecStart runs $execd, which the install provides" test -n "$execd" -a -x "$dest$execd"
  for directive in Type=notify NotifyAccess=main WatchdogSec=30s Restart=on-failure User=tierd \
    Group=tierd LimitMEMLOCK=infinity LimitCORE=0 RuntimeDirectory=tierd RuntimeDirectoryPreserve=yes \
    'StateDirectory=tierd/gpu%i'; do
    check "the unit sets $directive" grep -qx "$directive" "$unit"
  done
  # The metrics port arithmetic, as systemd hands it to /bin/sh ($$ -> $, %i -> 3).
  script=$(sed -n "s|^ExecStart=/bin/sh -c '\(.*\)'$|\1|p" "$unit" | sed 's/\$\$/$/g; s/%i/3/g; s/^exec /echo /')
  port=$(TIERD_METRICS_BASE_PORT=9400 /bin/sh -c "$script" | sed -n 's/.*--metrics-port=\([0-9]*\).*/\1/p')
  check "ExecStart gives tierd@3 --metrics-port=9403 (got ${port:-nothing})" test "$port" = 9403
  port=$(TIERD_METRICS_BASE_PORT=0 /bin/sh -c "$script" | sed -n 's/.*--metrics-port=\([0-9]*\).*/\1/p')
  check "TIERD_METRICS_BASE_PORT=0 gives --metrics-port=0 (got ${port:-nothing})" test "$port" = 0
fi

# ---- c: the Kubernetes manifests --------------------------------------------------------------------
section "c. Kubernetes manifests"
if ! /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
  fail "python3 cannot import yaml (Debian: apt-get install python3-yaml)"
elif timeout 60 /usr/bin/python3 - "$repo/deploy/k8s" <<'PYTHON'; then
import re
import sys

import yaml

k8s = sys.argv[1]
failed = []


def check(what, condition):
    print(f"    {'ok  ' if condition else 'FAIL'} {what}")
    if not condition:
        failed.append(what)


def load(name):
    with open(f"{k8s}/{name}") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


docs = load("tierd-daemonset.yaml")
kinds = {d["kind"]: d for d in docs}
check("tierd-daemonset.yaml parses into Namespace, ConfigMap, DaemonSet",
      sorted(kinds) == ["ConfigMap", "DaemonSet", "Namespace"])
conf = kinds["ConfigMap"]["data"]["tierd.conf"]
check("the ConfigMap's tierd.conf sets metrics-address = 0.0.0.0",
      re.search(r"^metrics-address\s*=\s*0\.0\.0\.0\s*$", conf, re.M) is not None)
check("the ConfigMap does not set device, socket, state-dir or metrics-port",
      re.search(r"^(device|socket|state-dir|metrics-port)\s*=", conf, re.M) is None)
ds = kinds["DaemonSet"]
pod = ds["spec"]["template"]["spec"]
check("the pod template's labels match the selector",
      ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items())
check("hostIPC: true", pod.get("hostIPC") is True)
check("hostPID: true", pod.get("hostPID") is True)
check("runtimeClassName: nvidia", pod.get("runtimeClassName") == "nvidia")
check("nodeSelector nvidia.com/gpu.present: \"true\"",
      pod.get("nodeSelector", {}).get("nvidia.com/gpu.present") == "true")
check("tolerates nvidia.com/gpu", any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])))
check("terminationGracePeriodSeconds: 30", pod.get("terminationGracePeriodSeconds") == 30)
volumes = {v["name"]: v for v in pod["volumes"]}
host_paths = {v["hostPath"]["path"]: name for name, v in volumes.items() if "hostPath" in v}
check("a hostPath volume /run/tierd (DirectoryOrCreate)",
      "/run/tierd" in host_paths and volumes[host_paths["/run/tierd"]]["hostPath"].get("type") == "DirectoryOrCreate")
check("a hostPath volume /var/lib/tierd", "/var/lib/tierd" in host_paths)
check("a hostPath volume /models", "/models" in host_paths)
containers = {c["name"]: c for c in pod["containers"]}
tierd = containers.get("tierd", {})
check("the container runs /opt/tierd/bin/tierd-node", tierd.get("command") == ["/opt/tierd/bin/tierd-node"])
mounts = {m["mountPath"]: m for m in tierd.get("volumeMounts", [])}
check("/run/tierd is mounted from the hostPath",
      mounts.get("/run/tierd", {}).get("name") == host_paths.get("/run/tierd"))
check("/models is mounted read-only", mounts.get("/models", {}).get("readOnly") is True)
check("every mount names a volume", all(m["name"] in volumes for m in mounts.values()))
env = {e["name"]: e.get("value") for e in tierd.get("env", [])}
check("NVIDIA_VISIBLE_DEVICES=all", env.get("NVIDIA_VISIBLE_DEVICES") == "all")
resources = tierd.get("resources", {})
check("no nvidia.com/gpu requested",
      all("nvidia.com/gpu" not in resources.get(k, {}) for k in ("requests", "limits")))
ports = [p["containerPort"] for p in tierd.get("ports", [])]
check("metrics ports 9400, 9401, ...", ports[:2] == [9400, 9401])
readiness = tierd.get("readinessProbe", {}).get("exec", {}).get("command", [])
liveness = tierd.get("livenessProbe", {}).get("exec", {}).get("command", [])
check("readinessProbe runs tierd-health (every GPU's socket)", readiness[:1] == ["/opt/tierd/bin/tierd-health"])
check("livenessProbe runs tierctl --socket=/run/tierd/gpu0.sock health",
      liveness[:1] == ["/opt/tierd/bin/tierctl"] and "--socket=/run/tierd/gpu0.sock" in liveness
      and liveness[-1] == "health")
security = pod.get("securityContext", {})
uid, gid = security.get("runAsUser"), security.get("runAsGroup")
check("the pod runs as a fixed non-root uid/gid", isinstance(uid, int) and uid > 0 and isinstance(gid, int) and gid > 0)
with open(f"{k8s}/Dockerfile") as f:
    dockerfile = f.read()
args = dict(re.findall(r"^ARG (TIERD_UID|TIERD_GID)=(\d+)$", dockerfile, re.M))
check(f"the Dockerfile's tierd user has uid {uid} and gid {gid}",
      args.get("TIERD_UID") == str(uid) and args.get("TIERD_GID") == str(gid))
check("the Dockerfile installs tierd-node and tierd-health",
      "/opt/tierd/bin/tierd-node" in dockerfile and "/opt/tierd/bin/tierd-health" in dockerfile)

client = load("model-server-example.yaml")
check("model-server-example.yaml parses into one Pod", [d["kind"] for d in client] == ["Pod"])
client_pod = client[0]["spec"]
check("the model server sets hostIPC and hostPID",
      client_pod.get("hostIPC") is True and client_pod.get("hostPID") is True)
check(f"the model server joins group {gid}", gid in client_pod.get("securityContext", {}).get("supplementalGroups", []))
client_volumes = {v["name"]: v for v in client_pod["volumes"]}
client_mounts = {m["mountPath"]: m["name"] for c in client_pod["containers"] for m in c.get("volumeMounts", [])}
check("the model server mounts the hostPath /run/tierd at /run/tierd",
      client_volumes.get(client_mounts.get("/run/tierd"), {}).get("hostPath", {}).get("path") == "/run/tierd")
sys.exit(1 if failed else 0)
PYTHON
  ok "the manifests parse and have what the node daemon and its clients need"
else
  fail "the manifests parse and have what the node daemon and its clients need (see above)"
fi

# ---- d: tierd-node.sh on the host backend --------------------------------------------------------
section "d. tierd-node.sh with TIERD_GPUS=2 TIERD_DEVICE_PREFIX=host"
node_dir=$tmp/node
mkdir -p "$node_dir/bin"
# As in the image: tierd-node, tierd-health, tierd and tierctl side by side.
cp "$repo/deploy/k8s/tierd-node.sh" "$node_dir/bin/tierd-node"
cp "$repo/deploy/k8s/tierd-health.sh" "$node_dir/bin/tierd-health"
ln -s "$tierd" "$node_dir/bin/tierd"
ln -s "$tierctl" "$node_dir/bin/tierctl"
node_env=(env -u TIERD_METRICS_BASE_PORT -u TIERD_BIN TIERD_GPUS=2 TIERD_DEVICE_PREFIX=host
  TIERD_CONFIG="$node_dir/no-such.conf" TIERD_SOCKET_DIR="$node_dir/run"
  TIERD_STATE_DIR="$node_dir/state" TIERD_NODE_SOCKETS_FILE="$node_dir/sockets")
extra=(--host-cache-bytes=64MiB --gpu-pool-bytes=64MiB --metrics-port=0)

node_pid=
start_node() {  # LOG: starts tierd-node in its own process group; sets node_pid
  "${node_env[@]}" setsid "$node_dir/bin/tierd-node" "${extra[@]}" >"$1" 2>&1 &
  node_pid=$!
  groups_started+=("$node_pid")
}
both_healthy() {  # up to 30 s
  local i
  for ((i = 0; i < 150; i++)); do
    if timeout 10 "$tierctl" --socket="$node_dir/run/gpu0.sock" health >/dev/null 2>&1 &&
      timeout 10 "$tierctl" --socket="$node_dir/run/gpu1.sock" health >/dev/null 2>&1; then
      return 0
    fi
    kill -0 "$node_pid" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}
wait_node() {  # SECONDS: waits for tierd-node to exit; sets node_status (or fails after SECONDS)
  local i
  for ((i = 0; i < $1 * 10; i++)); do
    kill -0 "$node_pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$node_pid" 2>/dev/null; then
    node_status=timeout
    return 1
  fi
  node_status=0
  wait "$node_pid" || node_status=$?
}
daemons_left() { pgrep -f -- "--socket=$node_dir/run/gpu" || true; }
show_log() { sed 's/^/    | /' "$1"; }

status=0
"${node_env[@]}" TIERD_GPUS=two "$node_dir/bin/tierd-node" >/dev/null 2>&1 || status=$?
check "TIERD_GPUS=two: exit 2" test "$status" -eq 2
status=0
"${node_env[@]}" "$node_dir/bin/tierd-node" positional >/dev/null 2>&1 || status=$?
check "a positional argument: exit 2" test "$status" -eq 2

start_node "$tmp/node1.log"
if both_healthy; then
  ok "two daemons started; tierctl health answers SERVING on gpu0.sock and gpu1.sock"
  health=0
  timeout 30 env TIERD_NODE_SOCKETS_FILE="$node_dir/sockets" "$node_dir/bin/tierd-health" >"$tmp/health.log" 2>&1 || health=$?
  check "tierd-health (the readiness probe) exits 0: $(cat "$tmp/health.log")" test "$health" -eq 0
  check "tierd-node printed a line per daemon started" \
    test "$(grep -c '^tierd-node: started tierd for GPU [01] ' "$tmp/node1.log")" -eq 2
  check "the daemons run with --device=host" grep -q -- "started tierd for GPU 1 .* --device=host " "$tmp/node1.log"
  check "each daemon names every GPU's daemon as a peer" \
    grep -q -- "started tierd for GPU 1 .* --peers=[^ ]*/gpu0.sock,[^ ]*/gpu1.sock" "$tmp/node1.log"
  check "and without --config (TIERD_CONFIG does not exist)" lacks "--config=" "$tmp/node1.log"
  head -c 3000000 /dev/urandom >"$tmp/activations"
  handed_over() {
    timeout 20 "$tierctl" --socket="$node_dir/run/gpu0.sock" put act/window-0 "$tmp/activations" &&
      timeout 20 "$tierctl" --socket="$node_dir/run/gpu1.sock" get act/window-0 -o "$tmp/handed" &&
      cmp -s "$tmp/activations" "$tmp/handed"
  }
  check "an object put through GPU 0's daemon is got, the same bytes, through GPU 1's" handed_over
  kill -TERM "$node_pid"
  if wait_node 20; then
    check "SIGTERM: tierd-node exits 0 within 20 s (status $node_status)" test "$node_status" = 0
  else
    fail "SIGTERM: tierd-node exits 0 within 20 s (still running)"
  fi
  check "SIGTERM: no daemon is left" test -z "$(daemons_left)"
  check "SIGTERM: a line per daemon exited, with status 0" \
    test "$(grep -c '^tierd-node: tierd for GPU [01] (pid [0-9]*) exited with status 0$' "$tmp/node1.log")" -eq 2
  check "SIGTERM: the daemons removed their sockets" test ! -e "$node_dir/run/gpu0.sock" -a ! -e "$node_dir/run/gpu1.sock"
  health=0
  timeout 30 env TIERD_NODE_SOCKETS_FILE="$node_dir/sockets" "$node_dir/bin/tierd-health" >/dev/null 2>&1 || health=$?
  check "tierd-health fails once tierd-node has stopped" test "$health" -ne 0
else
  fail "two daemons started; tierctl health answers SERVING on gpu0.sock and gpu1.sock"
fi
show_log "$tmp/node1.log"

start_node "$tmp/node2.log"
if both_healthy; then
  ok "started again: both daemons serving"
  victim=$(pgrep -P "$node_pid" -f -- "--socket=$node_dir/run/gpu0.sock" || true)
  if [[ -n $victim ]]; then
    kill -KILL "$victim"
    if wait_node 20; then
      check "SIGKILL of GPU 0's daemon: tierd-node exits non-zero within 20 s (status $node_status)" \
        test "$node_status" != 0
    else
      fail "SIGKILL of GPU 0's daemon: tierd-node exits within 20 s (still running)"
    fi
    check "SIGKILL: tierd-node stopped GPU 1's daemon" test -z "$(daemons_left)"
    check "SIGKILL: it said why" grep -q 'tierd for GPU 0 exited on its own' "$tmp/node2.log"
  else
    fail "found GPU 0's daemon among tierd-node's children"
  fi
else
  fail "started again: both daemons serving"
fi
show_log "$tmp/node2.log"

# ---- e: the example configurations ---------------------------------------------------------------
section "e. tierd accepts deploy/tierd.conf and the ConfigMap's tierd.conf"
# config_accepted FILE: tierd starts with --config=FILE (its sizes overridden on the command line,
# which wins; --metrics-port given as systemd's unit and tierd-node give it) and serves, then stops
# on SIGTERM with 0.
config_accepted() {
  local dir pid i status=0
  dir=$(mktemp -d "$tmp/config.XXXX")
  "$tierd" --config="$1" --device=host --socket="$dir/t.sock" --state-dir="$dir/state" \
    --host-cache-bytes=64MiB --gpu-pool-bytes=64MiB --gpu-slab-bytes=64MiB --metrics-port=0 \
    >"$dir/log" 2>&1 &
  pid=$!
  for ((i = 0; i < 150; i++)); do
    timeout 10 "$tierctl" --socket="$dir/t.sock" health >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" || status=$?
  sed 's/^/    | /' "$dir/log" | grep -v '^    | I' || true  # warnings and errors only
  ((status == 0)) && grep -q 'serving on unix:' "$dir/log"
}
check "tierd starts with --config=deploy/tierd.conf" config_accepted "$repo/deploy/tierd.conf"
/usr/bin/python3 -c 'import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap"]
sys.stdout.write(docs[0]["data"]["tierd.conf"])' "$repo/deploy/k8s/tierd-daemonset.yaml" >"$tmp/configmap.conf" || true
check "tierd starts with --config= the ConfigMap's tierd.conf" config_accepted "$tmp/configmap.conf"

# ---- g: who reaches which socket in the run directory ----------------------------------------------
section "g. the run directory's mode and the sockets' groups"
# Groups every Debian system has: "sys" stands for the daemon's group (tierd), "users" for a client
# group's Unix group; a member is uid 65534 with "users" alone.
unit_mode=$(sed -n 's/^RuntimeDirectoryMode=//p' "$repo/deploy/systemd/tierd@.service")
k8s_mode=$(sed -n 's|.*chmod \(0[0-7]*\) /run/tierd.*|\1|p' "$repo/deploy/k8s/tierd-daemonset.yaml")
check "the DaemonSet gives /run/tierd the unit's mode ($unit_mode; it gives ${k8s_mode:-none})" \
  test -n "$unit_mode" -a "$unit_mode" = "$k8s_mode"
if ((EUID != 0)) || ! command -v setpriv >/dev/null || ! getent group sys users >/dev/null; then
  echo "$prog: skipped: needs root, setpriv and the groups sys and users"
else
  chmod 0711 "$tmp"  # a path the member may pass through
  run_dir=$tmp/run-tierd
  mkdir -p "$run_dir"
  chgrp sys "$run_dir"
  chmod "$unit_mode" "$run_dir"
  "$tierd" --device=host --socket="$run_dir/gpu0.sock" --socket-group=sys --state-dir="$tmp/g-state" \
    --host-cache-bytes=64MiB --gpu-pool-bytes=16MiB --client-groups=team:users:4MiB \
    >"$tmp/g.log" 2>&1 &
  g_pid=$!
  for _ in $(seq 150); do
    "$tierctl" --socket="$run_dir/gpu0.sock" health >/dev/null 2>&1 && break
    kill -0 "$g_pid" 2>/dev/null || break
    sleep 0.1
  done
  member_connects() {  # SOCKET: a process of uid 65534 in group users alone connects to it
    setpriv --reuid=65534 --regid="$(getent group users | cut -d: -f3)" --clear-groups \
      /usr/bin/python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])' "$1" 2>/dev/null
  }
  check "a member of the client group's Unix group connects to its socket" \
    member_connects "$run_dir/gpu0.team.session.sock"
  check "but not to the main gRPC socket" eval '! member_connects "$run_dir/gpu0.sock"'
  check "nor to the main session socket" eval '! member_connects "$run_dir/gpu0.session.sock"'
  kill -TERM "$g_pid"
  wait "$g_pid" || true

  # tierd as a user that is not in the client group's Unix group: a usage error that says so.
  g_dir=$tmp/g-nobody
  mkdir -p "$g_dir"
  chown 65534:65534 "$g_dir"
  status=0
  timeout 30 setpriv --reuid=65534 --regid=65534 --clear-groups "$tierd" --device=host \
    --socket="$g_dir/gpu0.sock" --state-dir="$g_dir/state" --host-cache-bytes=64MiB \
    --gpu-pool-bytes=16MiB --client-groups=team:users:4MiB >"$tmp/g-nobody.log" 2>&1 || status=$?
  check "tierd whose user is not in a client group's Unix group exits 2 (status $status)" test "$status" -eq 2
  check "and says which group, and how to mend it" grep -q "not a member of Unix group 'users'.*usermod -aG users" "$tmp/g-nobody.log"
  show_log "$tmp/g-nobody.log"
fi

echo
if ((failures > 0)); then
  echo "$prog: FAILED: $failures of $checks checks"
  exit 1
fi
echo "$prog: all $checks checks passed"
