#!/usr/bin/env bash
# deploy/install.sh [--prefix DIR] [--bundle DIR] [--enable N|auto] [--destdir DIR]
#
# Installs tierd on a node, as root, for systemd (one tierd@N.service per GPU):
#   PREFIX/bin, PREFIX/lib      the relocatable bundle (deploy/bundle.sh OUT): tierd, tierctl and
#                               their libraries; PREFIX defaults to /opt/tierd. The new tree is
#                               copied to PREFIX.new and swapped in with two renames, so a failed
#                               copy leaves the installed one untouched. Running daemons keep the
#                               binaries they started with until restarted.
#   /usr/local/bin/tierctl      a symlink to PREFIX/bin/tierctl
#   /etc/systemd/system/tierd@.service   the unit (its /opt/tierd paths rewritten to PREFIX)
#   /etc/tierd/tierd.conf       the example configuration, only when there is none: an existing
#                               file is never overwritten (the new example is left in
#                               PREFIX/share/tierd/tierd.conf for comparison)
#   user and group "tierd"      a system user without home or login shell, which the daemons run
#                               as; add the users of model servers to group tierd
#
#   --bundle DIR    a bundle made by deploy/bundle.sh (bin/ and lib/); default: make one from the
#                   build in build/ of this repository
#   --enable N      systemctl daemon-reload, then systemctl enable --now tierd@0 ... tierd@N-1;
#                   "auto": one per GPU (nvidia-smi -L, or /dev/nvidia[0-9]* without nvidia-smi)
#   --destdir DIR   install everything under DIR instead of / (for packages and tests); then no
#                   user is created and systemctl is not run
#
# Run from a clone of the repository, or from a copy of its deploy/ directory next to a bundle
# (install.sh reads systemd/tierd@.service and tierd.conf beside itself).
set -euo pipefail
prog=install
here=$(cd "$(dirname "$0")" && pwd)
usage="usage: deploy/install.sh [--prefix DIR] [--bundle DIR] [--enable N|auto] [--destdir DIR]"

say() { echo "$prog: $*"; }
die() { echo "$prog: error: $*" >&2; exit 1; }
bad_usage() { echo "$prog: $*" >&2; echo "$usage" >&2; exit 2; }

prefix=/opt/tierd
bundle=
enable=
destdir=
while (($# > 0)); do
  case $1 in
    --prefix | --bundle | --enable | --destdir)
      if (($# < 2)) || [[ -z $2 ]]; then bad_usage "$1 needs a value"; fi
      case $1 in
        --prefix) prefix=$2 ;;
        --bundle) bundle=$2 ;;
        --enable) enable=$2 ;;
        --destdir) destdir=$2 ;;
      esac
      shift 2 ;;
    --prefix=* | --bundle=* | --enable=* | --destdir=*)
      value=${1#*=}
      [[ -n $value ]] || bad_usage "${1%%=*} needs a value"
      case $1 in
        --prefix=*) prefix=$value ;;
        --bundle=*) bundle=$value ;;
        --enable=*) enable=$value ;;
        --destdir=*) destdir=$value ;;
      esac
      shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) bad_usage "unknown argument: $1" ;;
  esac
done
[[ $prefix == /* ]] || bad_usage "--prefix must be an absolute path: $prefix"
while [[ $prefix == */ ]]; do prefix=${prefix%/}; done
[[ -n $prefix ]] || bad_usage "--prefix cannot be /"
[[ -z $enable || $enable == auto || $enable =~ ^[1-9][0-9]*$ ]] ||
  bad_usage "--enable takes a number of GPUs (1 or more) or auto, not: $enable"
if [[ -n $destdir ]]; then
  mkdir -p "$destdir" || die "cannot create --destdir $destdir"
  destdir=$(cd "$destdir" && pwd)
elif ((EUID != 0)); then
  die "run as root (or with --destdir DIR to install under DIR)"
fi
unit_source="$here/systemd/tierd@.service"
config_source="$here/tierd.conf"
[[ -f $unit_source ]] || die "missing $unit_source (run this script from the repository's deploy/)"
[[ -f $config_source ]] || die "missing $config_source (run this script from the repository's deploy/)"

tmp=$(mktemp -d)
target="$destdir$prefix"
cleanup() {
  rm -rf "$tmp"
  # A swap interrupted half-way is finished rather than undone: PREFIX.new is complete by then.
  if [[ ! -e $target && -d $target.new ]]; then mv "$target.new" "$target"; fi
  rm -rf "$target.new"
}
trap cleanup EXIT

# ---- The bundle -----------------------------------------------------------------------------------
if [[ -z $bundle ]]; then
  repo=$(cd "$here/.." && pwd)
  [[ -x $repo/build/bin/tierd ]] ||
    die "no --bundle given and no build in $repo/build (run deploy/build.sh, or pass --bundle DIR)"
  [[ -x $repo/deploy/bundle.sh ]] || die "no --bundle given and no $repo/deploy/bundle.sh"
  say "making a bundle from $repo/build"
  "$repo/deploy/bundle.sh" --build-dir "$repo/build" "$tmp/bundle" | sed "s/^/$prog: /"
  bundle=$tmp/bundle
fi
for file in bin/tierd bin/tierctl; do
  [[ -x $bundle/$file ]] || die "$bundle is not a bundle: no executable $file (make one with deploy/bundle.sh OUT)"
done
[[ -d $bundle/lib ]] || die "$bundle is not a bundle: no lib/ (make one with deploy/bundle.sh OUT)"

# ---- PREFIX: copy to PREFIX.new, then swap -------------------------------------------------------
say "installing $bundle into $target"
mkdir -p "$(dirname "$target")"
rm -rf "$target.new"
mkdir "$target.new"
# Whatever else an operator keeps in PREFIX comes along; bin/, lib/ and share/tierd are replaced.
if [[ -d $target ]]; then
  for entry in "$target"/* "$target"/.[!.]*; do
    [[ -e $entry || -L $entry ]] || continue
    case ${entry##*/} in bin | lib | share) continue ;; esac
    cp -a "$entry" "$target.new/"
  done
  if [[ -d $target/share ]]; then
    cp -a "$target/share" "$target.new/"
    rm -rf "$target.new/share/tierd"
  fi
fi
cp -a "$bundle/bin" "$bundle/lib" "$target.new/"
mkdir -p "$target.new/share/tierd"
cp "$config_source" "$target.new/share/tierd/tierd.conf"
chmod 0644 "$target.new/share/tierd/tierd.conf"
chmod -R u+rwX,go+rX,go-w "$target.new/bin" "$target.new/lib" "$target.new/share/tierd"
# Owned by root, whoever made the bundle (cp -a kept its owner): only root may replace the binaries.
if ((EUID == 0)); then chown -R 0:0 "$target.new/bin" "$target.new/lib" "$target.new/share/tierd"; fi
if [[ -e $target ]]; then
  rm -rf "$target.old"
  mv "$target" "$target.old"
fi
mv "$target.new" "$target"
rm -rf "$target.old"
say "installed $prefix/bin/tierd and $prefix/bin/tierctl with $(find "$target/lib" -maxdepth 1 -type f | wc -l) libraries in $prefix/lib"

# ---- tierctl on the PATH ---------------------------------------------------------------------------
mkdir -p "$destdir/usr/local/bin"
ln -sfn "$prefix/bin/tierctl" "$destdir/usr/local/bin/tierctl"
say "linked /usr/local/bin/tierctl -> $prefix/bin/tierctl"

# ---- The systemd unit ------------------------------------------------------------------------------
unit_dir="$destdir/etc/systemd/system"
mkdir -p "$unit_dir"
if [[ $prefix == /opt/tierd ]]; then
  cp "$unit_source" "$tmp/tierd@.service"
else
  # The prefix as a literal sed replacement: escape \, & and the | delimiter.
  replacement=$(printf '%s' "$prefix" | sed 's/[\\&|]/\\&/g')
  sed "s|/opt/tierd/|$replacement/|g" "$unit_source" >"$tmp/tierd@.service"
fi
chmod 0644 "$tmp/tierd@.service"
mv "$tmp/tierd@.service" "$unit_dir/tierd@.service"
say "installed /etc/systemd/system/tierd@.service (binaries under $prefix)"

# ---- The configuration: never overwritten ---------------------------------------------------------
config="$destdir/etc/tierd/tierd.conf"
if [[ -e $config ]]; then
  say "kept the existing /etc/tierd/tierd.conf (never overwritten; compare with $prefix/share/tierd/tierd.conf)"
else
  mkdir -p "$destdir/etc/tierd"
  cp "$config_source" "$tmp/tierd.conf"
  chmod 0644 "$tmp/tierd.conf"
  mv "$tmp/tierd.conf" "$config"
  say "installed /etc/tierd/tierd.conf (the example; edit it, it will not be overwritten)"
fi

# ---- Instances to enable ---------------------------------------------------------------------------
gpus=
if [[ $enable =~ ^[0-9]+$ ]]; then
  gpus=$enable
elif [[ $enable == auto && -z $destdir ]]; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    listing=$(nvidia-smi -L) || die "--enable auto: nvidia-smi -L failed (is the NVIDIA driver loaded?)"
    gpus=$(grep -c '^GPU ' <<<"$listing" || true)
    say "nvidia-smi -L lists $gpus GPUs"
  else
    shopt -s nullglob
    nodes=(/dev/nvidia[0-9]*)
    shopt -u nullglob
    gpus=${#nodes[@]}
    say "no nvidia-smi; found $gpus /dev/nvidia[0-9]* devices"
  fi
  ((gpus > 0)) || die "--enable auto: no GPU found on this node (give a number instead)"
fi
instances=()
if [[ -n $gpus ]]; then
  for ((n = 0; n < gpus; n++)); do instances+=("tierd@$n"); done
fi

# ---- User, group and systemd (not under --destdir) ------------------------------------------------
if [[ -n $destdir ]]; then
  say "--destdir given: not creating the tierd user and group, not running systemctl"
  if [[ $enable == auto ]]; then
    say "--destdir given: would enable one tierd@N per GPU of the node"
  elif ((${#instances[@]} > 0)); then
    say "--destdir given: would enable ${instances[*]}"
  fi
  say "done: installed under $destdir"
  exit 0
fi

if ! getent group tierd >/dev/null; then
  groupadd --system tierd
  say "created system group tierd"
fi
if ! getent passwd tierd >/dev/null; then
  nologin=/usr/sbin/nologin
  [[ -x $nologin ]] || nologin=/sbin/nologin
  [[ -x $nologin ]] || nologin=/bin/false
  useradd --system --gid tierd --no-create-home --home-dir /nonexistent --shell "$nologin" \
    --comment "tierd GPU memory-tiering daemon" tierd
  say "created system user tierd (no home, shell $nologin)"
fi

if [[ -d /run/systemd/system ]]; then
  systemctl daemon-reload
  say "systemctl daemon-reload"
  if ((${#instances[@]} > 0)); then
    systemctl enable --now "${instances[@]}"
    say "enabled and started ${instances[*]}"
  fi
  running=$(systemctl list-units --plain --no-legend --state=active 'tierd@*.service' | awk '{print $1}' | tr '\n' ' ')
  if [[ -n $running ]]; then
    say "running: ${running% }; an instance that was already running keeps its old binaries until: systemctl restart 'tierd@*'"
  fi
  ((${#instances[@]} > 0)) || say "start one daemon per GPU with: systemctl enable --now tierd@0 tierd@1 ..."
elif ((${#instances[@]} > 0)); then
  die "systemd is not running on this machine: cannot enable ${instances[*]}"
else
  say "systemd is not running on this machine: the unit is installed but nothing was started"
fi
say "done; users of the GPUs through tierd join the group: usermod -aG tierd USER"
