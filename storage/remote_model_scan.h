// Reading a model in object storage for registration: the objects directly under an s3:// prefix
// make up the model as a local directory's files do (exactly those model.safetensors.index.json
// names, or else every .safetensors object), each object's size and ETag recorded, and its
// safetensors header read with one ranged GET of its first 256 KiB (a second for a larger header)
// — the tensors' bytes beyond are not read. Up to 16 files are read at once.
//
// Stateless; thread-safe (the client is).
#ifndef TIERD_STORAGE_REMOTE_MODEL_SCAN_H_
#define TIERD_STORAGE_REMOTE_MODEL_SCAN_H_

#include <cstddef>
#include <functional>
#include <limits>

#include "absl/status/statusor.h"
#include "remote/s3_client.h"
#include "remote/s3_location.h"
#include "storage/model.h"
#include "storage/model_scan.h"

namespace tierd {

// Scans the model under `prefix` (its key a "directory": a trailing "/" is added when missing),
// calling `progress` after each file's header. The ScannedModel's directory is the prefix's URL
// without the trailing "/", each file's path its object's s3:// URL. Errors: NOT_FOUND when no
// .safetensors object is there; INVALID_ARGUMENT, DATA_LOSS and the tensor limit as
// ScanModelDirectory's; UNAVAILABLE when an object changed while it was read; the client's
// (PERMISSION_DENIED, UNAVAILABLE, ...).
absl::StatusOr<ScannedModel> ScanRemoteModel(
    S3Url prefix, S3Client& client,
    const std::function<void(const RegistrationProgress&)>& progress,
    size_t max_tensors = std::numeric_limits<size_t>::max());

}  // namespace tierd

#endif  // TIERD_STORAGE_REMOTE_MODEL_SCAN_H_
