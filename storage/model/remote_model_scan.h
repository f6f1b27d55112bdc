// Reading a model in object storage for registration: the objects directly under an s3:// prefix
// make up the model as a local directory's files do (exactly those model.safetensors.index.json
// names, or else every .safetensors object), each object's size and ETag recorded, and its
// safetensors header read with one ranged GET of its first 256 KiB (a second for a larger header)
// — the tensors' bytes beyond are not read.
//
// The store is not trusted: its listing is bounded (ListLimits), every key a model uses must be
// one a registered URL may be (ParseS3Url: no control characters, no dot segments, at most 1024
// bytes) and must carry an ETag, and a model has at most max_files files. Up to parallel_reads
// files are read at once, each header parsed as soon as it is read and its bytes let go, the
// bytes read and not yet parsed held under max_bytes_in_flight: memory follows the headers'
// tensors, not the file count.
//
// Stateless; thread-safe (the client is).
#ifndef TIERD_STORAGE_MODEL_REMOTE_MODEL_SCAN_H_
#define TIERD_STORAGE_MODEL_REMOTE_MODEL_SCAN_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>

#include "absl/status/statusor.h"
#include "remote/object_store.h"
#include "remote/s3_location.h"
#include "storage/model.h"
#include "storage/model/model_scan.h"

namespace tierd {

struct RemoteScanOptions {
  size_t max_tensors = std::numeric_limits<size_t>::max();
  size_t max_files = 4096;
  int parallel_reads = 16;
  // Header bytes read and not yet parsed, across the scan's readers; a header larger than this is
  // read alone.
  uint64_t max_bytes_in_flight = 64ull << 20;
  // The registration's caller went away: the scan stops (CANCELLED). Null: never.
  const std::atomic<bool>* cancelled = nullptr;
};

// Scans the model under `prefix` (its key a "directory": a trailing "/" is added when missing),
// calling `progress` after each file's header, one call at a time. The ScannedModel's directory is
// the prefix's URL without the trailing "/", each file's path its object's s3:// URL. Errors:
// NOT_FOUND when no .safetensors object is there; INVALID_ARGUMENT, DATA_LOSS and the tensor
// limit as ScanModelDirectory's; INVALID_ARGUMENT for more files than max_files; DATA_LOSS for a
// key the model would use that a URL may not hold, or an object without an ETag; UNAVAILABLE when
// an object changed while it was read; CANCELLED; the client's (PERMISSION_DENIED, UNAVAILABLE,
// DATA_LOSS for a listing it refused, ...).
absl::StatusOr<ScannedModel> ScanRemoteModel(
    S3Url prefix, ObjectStore& client,
    const std::function<void(const RegistrationProgress&)>& progress,
    const RemoteScanOptions& options = {});

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_REMOTE_MODEL_SCAN_H_
