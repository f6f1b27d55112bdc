// The catalog: which models are registered, what objects each consists of, where each object's
// bytes are on disk, and the checksum each object had when first read.
//
// A model is registered from a directory of .safetensors files (with or without
// model.safetensors.index.json). Its tensors are grouped into objects per tensor, per block
// ("…blocks.N.", "…layers.N.", "…h.N.") or per phase ("…blocks.N.attn", "…blocks.N.ffn", …). An
// object is one contiguous byte range in memory plus the index of the tensors inside it; tensors
// that are not contiguous in the files are gathered: the object lists the file extents to read and
// where each lands inside the object.
//
// Keys are "MODEL/OBJECT"; with per-tensor grouping the object name is the tensor name
// ("m/blocks.3.ffn.up.weight"). Registered models are persisted under the state directory, one
// file per model written atomically, and come back when the catalog is opened again.
//
// Thread-safe: every method may be called from any thread.
#ifndef TIERD_STORAGE_MODEL_CATALOG_H_
#define TIERD_STORAGE_MODEL_CATALOG_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "remote/object_store.h"
#include "storage/file_system.h"
#include "storage/model.h"
#include "storage/model/derived_tensors.h"
#include "storage/model_roots.h"

namespace tierd {

class Catalog {
 public:
  // Opens (creating if needed) the catalog persisted under `state_dir`/catalog and loads every
  // model in it. A model file that cannot be parsed is set aside (renamed *.corrupt) with a
  // logged error rather than failing the daemon; a model whose files changed (CheckModelFile) is
  // loaded stale. Models are registered from `roots` only, with at most `max_tensors_per_model`
  // tensors each. Its files are written through `file_system` (null: the POSIX one). Models in
  // object storage (s3:// directories) are registered through `remote` (null: refused); it must
  // outlive the catalog.
  static absl::StatusOr<std::unique_ptr<Catalog>> Open(
      const std::string& state_dir, ModelRoots roots = ModelRoots(),
      size_t max_tensors_per_model = kDefaultMaxTensorsPerModel,
      std::shared_ptr<FileSystem> file_system = nullptr, ObjectStore* remote = nullptr);
  ~Catalog();  // flushes pending checksums
  Catalog(const Catalog&) = delete;
  Catalog& operator=(const Catalog&) = delete;

  // Registers every .safetensors file in `directory` as model `name`. The directory and its files
  // must pass the roots' check (ModelRoots::Check: absolute, no "..", inside a root). When
  // model.safetensors.index.json is present, exactly the files its weight_map names are used and
  // every tensor must be in the file the index says. With `verify`, every object is read and its
  // checksum recorded now (ChecksumModelObjects), so that its first read from disk is checked too;
  // without, the first read records it. All or nothing: on error nothing is registered. Errors:
  // INVALID_ARGUMENT (bad name, bad rules, malformed header or index — naming file and tensor —,
  // more tensors than the limit), DATA_LOSS (truncated file), NOT_FOUND (no directory or no
  // .safetensors in it), ALREADY_EXISTS (name taken), PERMISSION_DENIED (outside the roots, or a
  // link that appeared), UNAVAILABLE (a file changed while it was read: retry), FAILED_PRECONDITION
  // (a file changed while it was verified), and I/O errors. `derived`: tensors made of the
  // checkpoint's, which replace those they take bytes from (storage/model/derived_tensors.h; its
  // INVALID_ARGUMENT errors), before the tensors are grouped. `keep_raw`: its objects are never
  // compressed in host memory (ModelInfo::keep_raw). A `directory` that is an s3:// URL is a
  // model in object storage (storage/model/remote_model_scan.h): it must be under an s3:// root
  // when the roots confine, `verify` is refused (its objects are checksummed on their first read),
  // and the client's errors come back (PERMISSION_DENIED, UNAVAILABLE, ...). Once `cancelled` is
  // set (the caller went away) the registration stops where it is, CANCELLED, and nothing is
  // registered.
  absl::StatusOr<ModelSummary> RegisterModel(
      const std::string& name, const std::string& directory, Grouping grouping,
      const GroupingRules& rules,
      const std::function<void(const RegistrationProgress&)>& progress = nullptr,
      bool verify = false, const std::vector<DerivedTensorSpec>& derived = {},
      bool keep_raw = false, const std::atomic<bool>* cancelled = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // Forgets model `name` and deletes its persisted file. NOT_FOUND when unknown.
  absl::Status DropModel(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<ModelSummary> ListModels() const ABSL_LOCKS_EXCLUDED(mu_);
  // How many models are registered (without summarizing them).
  size_t model_count() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::shared_ptr<const ModelInfo>> GetModel(const std::string& name) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Whether `key`'s namespace (the part before its first '/') is a registered model's name: such a
  // key names model weights only, never a stored object, whether or not the model has that object.
  bool InModelNamespace(absl::string_view key) const ABSL_LOCKS_EXCLUDED(mu_);

  // Errors: INVALID_ARGUMENT for a malformed key, NOT_FOUND for an unknown model or object,
  // FAILED_PRECONDITION when the model's files changed since registration (drop and register it
  // again).
  absl::StatusOr<ObjectRef> Lookup(absl::string_view key) const ABSL_LOCKS_EXCLUDED(mu_);

  // True while `model` is the registration its name currently maps to and its files have not
  // changed: bytes read under it may be served. A map lookup and a pointer comparison, for the
  // tiers' hit paths.
  bool IsCurrent(const std::shared_ptr<const ModelInfo>& model) const ABSL_LOCKS_EXCLUDED(mu_);

  // Marks `model` stale with `why` (a file changed since registration, found by a read), so that
  // its objects are refused at once from now on and the listing says why. No-op unless `model` is
  // still the registration its name maps to.
  void MarkStale(const std::shared_ptr<const ModelInfo>& model, const std::string& why)
      ABSL_LOCKS_EXCLUDED(mu_);

  // How many shard layouts Lookup has derived (storage/model/shard.h), over every model: each is
  // derived once per registration while the catalog keeps it.
  uint64_t shards_derived() const { return shards_derived_.load(std::memory_order_relaxed); }

  // The roots model files are opened beneath.
  const ModelRoots& roots() const { return roots_; }

  // The checksum recorded at the object's first read (or at a verified registration), if any.
  std::optional<uint64_t> Checksum(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // Records an object's checksum (first read). Persisted within about a second, and on
  // destruction. No-op for a key whose model or object is gone.
  void RecordChecksum(const std::string& key, uint64_t checksum) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes pending checksums now.
  absl::Status Flush() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct ModelEntry;
  // REQUIRES: `file_system` is not null.
  Catalog(std::string directory, ModelRoots roots, size_t max_tensors_per_model,
          std::shared_ptr<FileSystem> file_system);
  // Replaces model `name`'s file with `text`, atomically. REQUIRES: persist_mu_ held.
  absl::Status WriteModelFile(const std::string& name, absl::string_view text)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(persist_mu_);
  void FlushLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string directory_;  // <state_dir>/catalog
  const std::shared_ptr<FileSystem> file_system_;
  const ModelRoots roots_;
  const size_t max_tensors_per_model_;
  ObjectStore* remote_ = nullptr;  // for models in object storage; null: none
  // Held while a model's file is written or deleted, and across the check-and-insert of a
  // registration, so that a flush never brings back a dropped model's file and two registrations
  // of one name never both write it. Slow (fsync) work happens under it, never under mu_.
  absl::Mutex persist_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable std::atomic<uint64_t> shards_derived_{0};
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<ModelEntry>> models_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<std::thread> flusher_;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_MODEL_CATALOG_H_
