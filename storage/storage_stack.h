// The storage tiers wired together, in one place: the catalog, the pinned host arena, the disk
// reader, the spill writer, the durable store and the host cache, built in dependency order over
// one file system and torn down in the reverse order. The daemon, the fuzzers and the tests that
// need more than one tier build them through here rather than by hand.
//
// Thread-compatible: built and torn down by one thread; the tiers it hands out are thread-safe.
#ifndef TIERD_STORAGE_STORAGE_STACK_H_
#define TIERD_STORAGE_STORAGE_STACK_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "device/device.h"
#include "remote/s3_client.h"
#include "storage/file_system.h"
#include "storage/host/durable_store.h"
#include "storage/host/host_arena.h"
#include "storage/host/host_cache.h"
#include "storage/io/disk_reader.h"
#include "storage/io/remote_cache.h"
#include "storage/io/remote_reader.h"
#include "storage/io/spill_writer.h"
#include "storage/model/catalog.h"
#include "storage/model_roots.h"

namespace tierd {

struct StorageStackOptions {
  // Persistent state: the catalog under <state_dir>/catalog, durable objects under
  // <state_dir>/durable. Required.
  std::string state_dir;
  // Where stored objects spill; empty: <state_dir>/spill.
  std::string spill_dir;
  // False: no durable store (StorageStack::durable() is null).
  bool durable_store = true;
  // Where models may be registered from, and model files are opened beneath.
  ModelRoots model_roots;
  size_t max_tensors_per_model = kDefaultMaxTensorsPerModel;
  HostArenaOptions arena;
  // The reader's own settings; its model roots and file system are the stack's.
  DiskReaderOptions reader;
  // Where models in object storage are read from (s3:// directories); none: such models are
  // refused. With it, the remote reader's settings.
  std::optional<S3ClientOptions> remote;
  RemoteReaderOptions remote_reader;
  // With `remote`: a cache of remote models' bytes on local disk under the remote reader; none:
  // every read goes to the store.
  std::optional<RemoteCacheOptions> remote_cache;
  HostCacheOptions host_cache;
  // Every file of every tier goes through it. Null: the POSIX file system.
  std::shared_ptr<FileSystem> file_system;
};

class StorageStack {
 public:
  // Opens the catalog, creates the host arena on `device` (its first piece pinned, the rest in the
  // background), the disk reader, the spill writer (emptying the spill directory), the durable
  // store (recovering what it holds into `recovered` when not null) and the host cache.
  // REQUIRES: `device` outlives the stack. Errors: the first tier's that fails (INVALID_ARGUMENT
  // for bad options, I/O errors, the device's); nothing is left running then.
  static absl::StatusOr<std::unique_ptr<StorageStack>> Create(
      Device& device, const StorageStackOptions& options,
      std::vector<DurableRecord>* recovered = nullptr);
  // StopIo, then the arena (unless abandoned) and the catalog (which flushes its checksums).
  ~StorageStack();
  StorageStack(const StorageStack&) = delete;
  StorageStack& operator=(const StorageStack&) = delete;

  Catalog& catalog() { return *catalog_; }
  HostArena& arena() { return *arena_; }
  FileSystem& file_system() { return *file_system_; }
  // REQUIRES (these four): StopIo has not run.
  DiskReader& reader() { return *reader_; }
  // Null without StorageStackOptions::remote; the cache, without remote_cache too.
  RemoteReader* remote_reader() { return remote_reader_.get(); }
  RemoteCache* remote_cache() { return remote_cache_.get(); }
  SpillWriter& spill() { return *spill_; }
  HostCache& host_cache() { return *host_cache_; }
  // Null without a durable store.
  DurableStore* durable() { return durable_.get(); }

  // Ends every remote read at once (a daemon stopping): the store's requests in flight are
  // cancelled, queued remote reads and later ones fail UNAVAILABLE, registrations reading the
  // store fail CANCELLED. Nothing then waits on a slow store. Idempotent; no-op without remote.
  void StopRemote();
  // StopRemote, then destroys the host cache, the durable store, the spill writer and the remote
  // and disk readers,
  // in that order: their queued work finishes and their threads are joined. REQUIRES: nothing above
  // the stack (a GPU tier) uses them any more. Idempotent.
  void StopIo();
  // Leaves the host arena to the process's exit instead of freeing it: unregistering pinned memory
  // waits for the device to go idle, which a dead client's queued work may keep it from ever doing.
  // REQUIRES: StopIo has run.
  void AbandonArena();

 private:
  StorageStack() = default;

  // Declared in dependency order: destroyed from the bottom up.
  std::shared_ptr<FileSystem> file_system_;
  std::unique_ptr<ObjectStore> store_;  // null without `remote`
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<RemoteCache> remote_cache_;
  std::unique_ptr<HostArena> arena_;
  std::unique_ptr<DiskReader> reader_;
  std::unique_ptr<RemoteReader> remote_reader_;
  std::unique_ptr<SpillWriter> spill_;
  std::unique_ptr<DurableStore> durable_;
  std::unique_ptr<HostCache> host_cache_;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_STORAGE_STACK_H_
