#!/usr/bin/env bash
# Starts and stops a real S3 endpoint on this machine for tierd's tests and benchmarks: Ceph's RADOS
# Gateway over a single-node cluster (one monitor, one memstore OSD) on 127.0.0.1, from Debian's
# ceph-mon, ceph-osd, radosgw and ceph-common packages (deploy/install-deps.sh). No systemd: each
# daemon runs in the foreground as a background job of this script, stopped by its recorded pid.
#
#   s3-gateway.sh start DIR [--port PORT] [--memory-mib MIB]
#   s3-gateway.sh stop DIR
#   s3-gateway.sh restart-gateway DIR
#
# `start` makes DIR (which must not hold a running gateway), starts the cluster and the gateway,
# creates an S3 user and writes DIR/s3.env (S3_ENDPOINT; S3_TLS_ENDPOINT, its HTTPS twin, and
# S3_CA_FILE, the self-signed certificate it presents; AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
# AWS_REGION) for the caller to source. The OSD keeps objects in memory: about 1.5x the bytes stored,
# up to --memory-mib (default 1024), past which writes hang rather than fail, so size it to the
# data. `stop` stops every daemon started in DIR and removes DIR; it is safe to call twice.
# `restart-gateway` starts the gateway's process again, on its port, once it has been killed (the
# cluster, and so the objects, stay).
set -euo pipefail

usage() {
  echo "usage: $0 start DIR [--port PORT] [--memory-mib MIB] | stop DIR | restart-gateway DIR" >&2
  exit 2
}

# A free TCP port on 127.0.0.1, as the kernel hands one out (Debian's python3 where there is one:
# a version manager's shim costs a second).
free_port() {
  local python=python3
  [[ -x /usr/bin/python3 ]] && python=/usr/bin/python3
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

stop() {
  local dir=$1
  [[ -d $dir ]] || return 0
  local pids=() pidfile pid
  for name in rgw osd mon; do
    pidfile=$dir/run/$name.daemon-pid
    [[ -f $pidfile ]] && pids+=("$(cat "$pidfile")")
  done
  # Killed outright: the store is in memory and goes with the directory, so there is nothing to
  # shut down cleanly (SIGTERM took the three daemons 6 s).
  for pid in "${pids[@]}"; do
    kill -KILL "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  done
  rm -rf "$dir"
}

# Runs `ceph` against the cluster in $dir, bounded in time.
ceph_cli() {
  timeout 30 ceph -c "$dir/ceph.conf" --connect-timeout 20 "$@"
}

wait_for() {
  local what=$1 seconds=$2
  shift 2
  for _ in $(seq $((seconds * 10))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "s3-gateway: $what did not come up in $seconds s; logs in $dir/log" >&2
  tail -n 20 "$dir"/log/*.log >&2 || true
  return 1
}

# Starts the gateway's process on the cluster in $1, serving port $2, and waits until it answers.
start_gateway() {
  local dir=$1 port=$2
  radosgw -c "$dir/ceph.conf" -n client.rgw.gw -f </dev/null >>"$dir/log/rgw.out" 2>&1 &
  echo $! >"$dir/run/rgw.daemon-pid"
  wait_for "the gateway" 60 curl -sf "http://127.0.0.1:$port/"
}

# Starts the gateway again after its process was stopped (a test's fault), on the same port.
restart_gateway() {
  local dir=$1 pid port
  [[ -f $dir/s3.env ]] || { echo "s3-gateway: $dir holds no gateway" >&2; exit 1; }
  pid=$(cat "$dir/run/rgw.daemon-pid")
  if kill -0 "$pid" 2>/dev/null; then
    echo "s3-gateway: the gateway in $dir is still running (pid $pid)" >&2
    exit 1
  fi
  port=$(sed -n 's|^S3_ENDPOINT=http://127.0.0.1:||p' "$dir/s3.env")
  start_gateway "$dir" "$port"
}

start() {
  local dir=$1
  shift
  local port="" memory_mib=1024
  while (($#)); do
    case $1 in
      --port) port=$2; shift 2 ;;
      --memory-mib) memory_mib=$2; shift 2 ;;
      *) usage ;;
    esac
  done
  for tool in ceph-mon ceph-osd radosgw radosgw-admin ceph-authtool monmaptool ceph curl openssl; do
    command -v "$tool" >/dev/null || {
      echo "s3-gateway: $tool is missing (deploy/install-deps.sh installs it)" >&2
      exit 1
    }
  done
  if [[ -e $dir/run ]]; then
    echo "s3-gateway: $dir already holds a gateway; stop it first" >&2
    exit 1
  fi
  [[ -n $port ]] || port=$(free_port)
  local mon_port tls_port fsid osd_uuid
  mon_port=$(free_port)
  tls_port=$(free_port)
  fsid=$(cat /proc/sys/kernel/random/uuid)
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  dir=$(mkdir -p "$dir" && cd "$dir" && pwd)
  mkdir -p "$dir"/{run,log,mon,osd/ceph-0,rgw,tls}
  chmod 700 "$dir"
  # Started from here on: stop whatever did start if the rest fails.
  trap 'stop "$dir"' ERR

  cat >"$dir/ceph.conf" <<EOF
[global]
fsid = $fsid
mon_host = v2:127.0.0.1:$mon_port
ms_bind_msgr1 = false
ms_bind_msgr2 = true
public_addr = 127.0.0.1
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
auth_allow_insecure_global_id_reclaim = false
keyring = $dir/keyring
run_dir = $dir/run
admin_socket = $dir/run/\$name.asok
log_file = $dir/log/\$name.log
log_to_stderr = false
err_to_stderr = false
mon_cluster_log_file = $dir/log/cluster.log
mon_data = $dir/mon/\$cluster-\$id
osd_data = $dir/osd/\$cluster-\$id
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
paxos_propose_interval = 0.05
osd_objectstore = memstore
memstore_device_bytes = $((memory_mib << 20))
osd_op_num_shards = 1
osd_op_num_threads_per_shard = 2
ms_async_op_threads = 2
[client.rgw.gw]
rgw_frontends = beast endpoint=127.0.0.1:$port ssl_endpoint=127.0.0.1:$tls_port ssl_certificate=$dir/tls/cert.pem ssl_private_key=$dir/tls/key.pem tcp_nodelay=1
rgw_data = $dir/rgw
rgw_thread_pool_size = 32
EOF

  # HTTPS beside HTTP, with a certificate of its own for 127.0.0.1 (clients trust DIR/tls/cert.pem).
  openssl req -x509 -newkey rsa:2048 -nodes -days 7 -subj /CN=127.0.0.1 \
    -addext subjectAltName=IP:127.0.0.1 -keyout "$dir/tls/key.pem" -out "$dir/tls/cert.pem" \
    2>/dev/null
  ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool "$dir/keyring" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' \
    --cap mgr 'allow *' >/dev/null
  ceph-authtool "$dir/keyring" --gen-key -n osd.0 --cap mon 'allow profile osd' \
    --cap osd 'allow *' --cap mgr 'allow profile osd' >/dev/null
  ceph-authtool "$dir/keyring" --gen-key -n client.rgw.gw --cap mon 'allow rw' \
    --cap osd 'allow rwx' >/dev/null
  chmod 600 "$dir/keyring"
  monmaptool --create --addv a "[v2:127.0.0.1:$mon_port]" --fsid "$fsid" "$dir/monmap" >/dev/null
  ceph-mon -c "$dir/ceph.conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring"
  ceph-mon -c "$dir/ceph.conf" -i a -f </dev/null >>"$dir/log/mon.out" 2>&1 &
  echo $! >"$dir/run/mon.daemon-pid"
  wait_for "the monitor" 30 ceph_cli -s

  [[ $(ceph_cli osd new "$osd_uuid") == 0 ]]
  ceph-osd -c "$dir/ceph.conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >>"$dir/log/osd.out" 2>&1
  ceph-osd -c "$dir/ceph.conf" -i 0 -f </dev/null >>"$dir/log/osd.out" 2>&1 &
  echo $! >"$dir/run/osd.daemon-pid"
  wait_for "the OSD" 60 bash -c "ceph -c '$dir/ceph.conf' osd dump 2>/dev/null | grep -q '^osd.0 up'"

  start_gateway "$dir" "$port"

  local access_key secret_key
  access_key=$(head -c 10 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F)
  secret_key=$(head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n')
  timeout 60 radosgw-admin -c "$dir/ceph.conf" user create --uid=tierd-test \
    --display-name="tierd tests" --access-key="$access_key" --secret-key="$secret_key" >/dev/null
  umask 077
  cat >"$dir/s3.env" <<EOF
S3_ENDPOINT=http://127.0.0.1:$port
S3_TLS_ENDPOINT=https://127.0.0.1:$tls_port
S3_CA_FILE=$dir/tls/cert.pem
AWS_ACCESS_KEY_ID=$access_key
AWS_SECRET_ACCESS_KEY=$secret_key
AWS_REGION=us-east-1
EOF
  trap - ERR
  echo "s3-gateway: serving http://127.0.0.1:$port (credentials in $dir/s3.env)"
}

(($# >= 2)) || usage
case $1 in
  start) shift; start "$@" ;;
  stop) dir=$2; stop "$dir" ;;
  restart-gateway) dir=$2; restart_gateway "$dir" ;;
  *) usage ;;
esac
