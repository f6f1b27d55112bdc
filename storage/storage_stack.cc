#include "storage/storage_stack.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/leak_on_purpose.h"
#include "common/status_macros.h"

namespace tierd {

absl::StatusOr<std::unique_ptr<StorageStack>> StorageStack::Create(
    Device& device, const StorageStackOptions& options, std::vector<DurableRecord>* recovered) {
  if (options.state_dir.empty()) return absl::InvalidArgumentError("state directory is empty");
  std::unique_ptr<StorageStack> stack(new StorageStack);
  stack->file_system_ = FileSystemOrDefault(options.file_system);
  if (options.remote) {
    ASSIGN_OR_RETURN(stack->store_, S3Client::Create(*options.remote));
  }
  ASSIGN_OR_RETURN(stack->catalog_, Catalog::Open(options.state_dir, options.model_roots,
                                                  options.max_tensors_per_model,
                                                  stack->file_system_, stack->store_.get()));
  ASSIGN_OR_RETURN(stack->arena_, HostArena::Create(device, options.arena));
  DiskReaderOptions reader = options.reader;
  reader.model_roots = options.model_roots;  // model files are opened beneath them
  reader.file_system = stack->file_system_;
  ASSIGN_OR_RETURN(stack->reader_, DiskReader::Create(reader));
  if (stack->store_ != nullptr) {
    if (options.remote_cache) {
      RemoteCacheOptions cache = *options.remote_cache;
      if (cache.file_system == nullptr) cache.file_system = stack->file_system_;
      ASSIGN_OR_RETURN(stack->remote_cache_, RemoteCache::Open(cache));
    }
    ASSIGN_OR_RETURN(
        stack->remote_reader_,
        RemoteReader::Create(*stack->store_, options.remote_reader, stack->remote_cache_.get()));
  }
  const std::string spill_dir =
      options.spill_dir.empty() ? absl::StrCat(options.state_dir, "/spill") : options.spill_dir;
  SpillWriterOptions spill;
  spill.file_system = stack->file_system_;
  ASSIGN_OR_RETURN(stack->spill_, SpillWriter::Create(spill_dir, spill));
  if (options.durable_store) {
    DurableStoreOptions durable;
    durable.file_system = stack->file_system_;
    std::vector<DurableRecord> ignored;
    ASSIGN_OR_RETURN(stack->durable_,
                     DurableStore::Open(absl::StrCat(options.state_dir, "/durable"), durable,
                                        recovered != nullptr ? recovered : &ignored));
  } else if (recovered != nullptr) {
    recovered->clear();
  }
  stack->host_cache_ = std::make_unique<HostCache>(*stack->catalog_, *stack->reader_,
                                                   *stack->arena_, stack->spill_.get(),
                                                   options.host_cache, stack->remote_reader_.get());
  return stack;
}

StorageStack::~StorageStack() { StopIo(); }

void StorageStack::StopRemote() {
  if (remote_reader_ != nullptr) remote_reader_->Stop();
  if (store_ != nullptr) store_->Cancel();
}

void StorageStack::StopIo() {
  StopRemote();
  host_cache_.reset();
  durable_.reset();
  spill_.reset();
  remote_reader_.reset();
  reader_.reset();
}

void StorageStack::AbandonArena() { LeakOnPurpose(arena_); }

}  // namespace tierd
