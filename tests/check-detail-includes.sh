#!/usr/bin/env bash
# tests/check-detail-includes.sh [SOURCE_DIR]: fails when a private header is included from outside
# its folder, or a wing of storage/ includes one it must not (see below). A header under X/detail/
# belongs to X/: only sources under X/ (and tests) may include it; what other folders need goes
# into a public header of X/. Prints each offending include.
set -euo pipefail
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
cd "$root"
if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  mapfile -t sources < <(git ls-files --cached --others --exclude-standard -- '*.h' '*.cc' '*.cu')
else  # an unpacked source tree
  mapfile -t sources < <(find . -name 'build*' -prune -o \( -name '*.h' -o -name '*.cc' -o -name '*.cu' \) -print)
fi
((${#sources[@]} > 0)) || { echo "no sources found under $root" >&2; exit 1; }

offending=0
for source in "${sources[@]}"; do
  source=${source#./}
  [[ $source == tests/* ]] && continue
  while IFS= read -r header; do
    owner=${header%%/detail/*}
    if [[ $source != "$owner"/* ]]; then
      echo "$source includes $header, private to $owner/" >&2
      offending=$((offending + 1))
    fi
  done < <(sed -n 's|^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*/detail/[^"]*\)".*|\1|p' "$source")
done
# storage/'s wings use one another in one direction: model/ the shared parts only, io/ those and
# model/, host/ all three; the shared parts none but storage_stack, which builds them.
for source in "${sources[@]}"; do
  source=${source#./}
  case $source in
    storage/model/*) forbidden='storage/(io|host)/' ;;
    storage/io/*) forbidden='storage/host/' ;;
    storage/storage_stack.*) continue ;;
    storage/*/*) continue ;;
    storage/*) forbidden='storage/(model|io|host)/' ;;
    *) continue ;;
  esac
  while IFS= read -r header; do
    echo "$source includes $header, against storage/'s wing order" >&2
    offending=$((offending + 1))
  done < <(sed -n 's|^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*|\1|p' "$source" |
           grep -E "^$forbidden" || true)
done
if ((offending > 0)); then
  echo "$offending include(s) of a detail/ header from outside its folder, or against storage/'s wing order" >&2
  exit 1
fi
echo "checked ${#sources[@]} sources: detail/ headers are included only from their own folders, storage/'s wings in order"
