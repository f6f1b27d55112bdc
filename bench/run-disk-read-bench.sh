#!/usr/bin/env bash
# bench/run-disk-read-bench.sh BUNDLE_DIR OUT_DIR [WORK_DIR]
#
# From a bundle made by `deploy/bundle.sh --bench BUNDLE_DIR`, both comparisons of disk_read_bench
# in one run:
#   direct     tierd's DiskReader reading a file of random bytes under WORK_DIR (default
#              /var/tmp/tierd-disk-bench; put it on the disk models live on) with O_DIRECT,
#              against fio with the same block size, queue depth and jobs (skipped, with a note,
#              where fio is missing). Run as root, so the page cache is dropped between runs.
#   host-load  a safetensors model on tmpfs (under /dev/shm) loaded into the host cache through
#              tierd with the daemon's default reader, against threads pread-ing its files into
#              pinned memory. The model is removed at the end.
# Each writes OUT_DIR/<mode>.json; OUT_DIR/summary.txt has the figures, OUT_DIR/environment.txt the
# machine (cores, kernel, memory, filesystems, block devices), OUT_DIR/bench.log the log.
#
# Environment:
#   DEVICE             device that pins the memory: auto, host or cuda:N (auto)
#   REPEAT             runs of each side (3)
#   FILE_BYTES         direct: size of the file (8GiB)
#   MODEL_BYTES        host-load: size of the model (8GiB); it must be under half of MemAvailable
#   OBJECT_BYTES       host-load: bytes per object (64MiB)
#   REFERENCE_THREADS  host-load: thread counts of the pread reference (4,8)
#   MODEL_ROOT         host-load: the tmpfs the model goes on (/dev/shm)
#   MODES              which to run ("direct host-load")
#   DIRECT_FLAGS / HOST_LOAD_FLAGS  extra flags for disk_read_bench in each mode
#   PYTHON             python3, to write the summary
set -uo pipefail
bundle=$(cd "${1:?usage: run-disk-read-bench.sh BUNDLE_DIR OUT_DIR [WORK_DIR]}" && pwd)
out=$(mkdir -p "${2:?OUT_DIR}" && cd "$2" && pwd)
work=${3:-/var/tmp/tierd-disk-bench}
mkdir -p "$work"
work=$(cd "$work" && pwd)
device=${DEVICE:-auto}
repeat=${REPEAT:-3}
file_bytes=${FILE_BYTES:-8GiB}
model_bytes=${MODEL_BYTES:-8GiB}
object_bytes=${OBJECT_BYTES:-64MiB}
reference_threads=${REFERENCE_THREADS:-4,8}
model_root=${MODEL_ROOT:-/dev/shm}
modes=${MODES:-direct host-load}
python=${PYTHON:-python3}
bench=$bundle/bin/disk_read_bench
exec > >(tee "$out/bench.log") 2>&1

# fio: the bundle's, else the system's, else none (the direct mode then times tierd alone).
fio=
if [[ -f "$bundle/fio.tar.xz" ]]; then
  [[ -x "$bundle/fio/fio" ]] || tar xJf "$bundle/fio.tar.xz" -C "$bundle"
  cat > "$bundle/fio/run" <<RUN
#!/bin/sh
LD_LIBRARY_PATH=$bundle/fio/lib exec $bundle/fio/fio "\$@"
RUN
  chmod +x "$bundle/fio/run"
  fio=$bundle/fio/run
elif command -v fio > /dev/null; then
  fio=$(command -v fio)
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "device: $device"
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  echo "gpu: ${gpu:-none}"
  echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); kernel $(uname -r)"
  echo "memory: $(free -g | awk '/Mem:/ {print $2 " GiB, " $7 " GiB available"}')"
  if [[ -n $fio ]]; then
    echo "fio: $("$fio" --version)"
  else
    echo "fio: none (the direct mode times tierd alone)"
  fi
  echo "direct: $file_bytes file under $work; host-load: $model_bytes model in objects of $object_bytes under $model_root, pread on $reference_threads threads; $repeat runs each"
  echo "filesystems:"
  df -T "$work" "$model_root" | sed 's/^/  /'
  echo "block devices:"
  lsblk -o NAME,TYPE,SIZE,ROTA,MODEL,MOUNTPOINT 2>&1 | sed 's/^/  /'
} | tee "$out/environment.txt"

status=0
jsons=()
for mode in $modes; do
  echo "## $mode"
  rm -f "$out/$mode.json"  # a failed run must not leave an older result to be summed up
  case $mode in
    direct)
      [[ -n $fio ]] || echo "note: fio is missing; the direct mode runs without its reference"
      "$bench" --mode=direct --file="$work/disk-read.bin" --file-bytes="$file_bytes" \
        --device="$device" --repeat="$repeat" --fio="$fio" --json="$out/direct.json" \
        ${DIRECT_FLAGS:-} || status=1
      ;;
    host-load)
      # A directory of its own, so that removing it at the end removes nothing else.
      model_dir=$(mktemp -d "$model_root/tierd-host-load.XXXXXX") || { status=1; continue; }
      trap 'rm -rf "$model_dir"' EXIT
      "$bench" --mode=host-load --model-dir="$model_dir/model" --model-bytes="$model_bytes" \
        --object-bytes="$object_bytes" --reference-threads="$reference_threads" \
        --device="$device" --repeat="$repeat" --json="$out/host-load.json" \
        ${HOST_LOAD_FLAGS:-} || status=1
      rm -rf "$model_dir"
      trap - EXIT
      ;;
    *)
      echo "unknown mode $mode (direct, host-load)"
      status=1
      continue
      ;;
  esac
  [[ -s "$out/$mode.json" ]] && jsons+=("$out/$mode.json")
done

"$python" - "$out" "${jsons[@]}" <<'PY' || status=1
import json, sys
out, paths = sys.argv[1], sys.argv[2:]
rows = []
for path in paths:
    run = json.load(open(path))
    if run.get("mode") == "host-load":
        model, reader = run["model"], run["reader"]
        rows.append(
            f"host-load: {model['object_bytes_total'] / 2**30:.2f} GiB model, {model['objects']} "
            f"objects in {len(model['files'])} files; reader {reader['threads']} threads x queue "
            f"depth {reader['queue_depth']} ({'defaults' if reader['defaults'] else 'set by flags'}), "
            f"{reader['engine']}, {reader['buffered_files']} files buffered; {run['load']}")
        rows.append(f"  tierd HostCache   median {run['tierd']['median_gb_per_s']:7.2f} GB/s  runs "
                    + " ".join(f"{v:.2f}" for v in run["tierd"]["gb_per_s"])
                    + "  (checksums " + ", ".join(run["tierd"]["checksums"]) + ")")
        for ref in run["reference"]["runs"]:
            rows.append(f"  pread x{ref['threads']:<3d}       median {ref['median_gb_per_s']:7.2f} GB/s"
                        "  runs " + " ".join(f"{v:.2f}" for v in ref["gb_per_s"])
                        + f"  ratio {ref['ratio']:.3f}")
    else:
        line = (f"direct: {run['file_bytes'] / 2**30:.2f} GiB file, {run['threads']} threads x "
                f"queue depth {run['queue_depth']}, {run['engine']}: tierd median "
                f"{run['tierd_median_gb_per_s']:.2f} GB/s")
        if "fio_median_gb_per_s" in run:
            line += (f", fio median {run['fio_median_gb_per_s']:.2f} GB/s, "
                     f"ratio {run['ratio_to_fio']:.3f}")
        else:
            line += " (no fio)"
        rows.append(line)
open(f"{out}/summary.txt", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
exit $status
