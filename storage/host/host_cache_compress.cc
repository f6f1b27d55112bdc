// HostCache: weights kept compressed in host memory (HostCacheOptions::compress_weights).
//
// A weight that becomes resident is queued for the compressor. Its job takes a reference (the raw
// bytes stay put and the object is not evicted meanwhile), plans and encodes them into ordinary
// memory without the lock, and then — once its reference is the only one — frees the raw bytes,
// allocates the compressed form in their place, and copies it in while the entry is busy (fetches
// wait, as for a read). Until then every fetch is served the raw form. The checksum the catalog
// recorded stays the one of the raw bytes; the compressed form carries its own per-tile checksums
// of the raw words, which every decoder checks.
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/log.h"
#include "storage/host/detail/host_cache_record.h"
#include "storage/host/host_cache.h"

namespace tierd {

namespace {

using Kind = HostCacheRecord::Kind;
using State = HostCacheRecord::State;

// How long a compressed form waits for the object's other references (copies to a GPU in flight)
// to go before the compressor gives the object up.
constexpr absl::Duration kSwapWait = absl::Seconds(5);

}  // namespace

void HostCache::MaybeCompressLocked(Entry* entry) {
  if (!options_.compress_weights || entry->kind != Kind::kWeight || entry->compression_planned ||
      entry->size < options_.encoding.min_bytes || entry->source->model->keep_raw) {
    return;
  }
  entry->compression_planned = true;
  compressor_.Post([this, key = entry->key()] { Compress(key); });
}

void HostCache::Compress(const std::string& key) {
  HostObject raw;
  {
    absl::MutexLock lock(&mu_);
    if (!compressing_) return;
    Entry* entry = table_.Find(key);
    if (entry == nullptr || entry->state != State::kResident || entry->compressed ||
        entry->kind != Kind::kWeight) {
      return;
    }
    raw = RefLocked(entry);
    ++compressions_in_flight_;
  }
  // Without the lock: a referenced resident object's bytes do not change.
  const codec::EncodingPlan plan = codec::PlanEncoding(raw.data(), raw.size(), options_.encoding);
  std::vector<uint8_t> encoded;
  absl::Status encoding = absl::OkStatus();
  std::optional<codec::CompressedLayout> layout;
  if (plan.compress) {
    encoded.resize(plan.encoded_bytes);
    encoding = codec::Encode(raw.data(), raw.size(), plan, encoded.data());
    if (encoding.ok()) {
      absl::StatusOr<codec::CompressedLayout> parsed =
          codec::ParseCompressed(encoded.data(), encoded.size());
      if (parsed.ok()) {
        layout = *parsed;
      } else {
        encoding = parsed.status();
      }
    }
  }

  DeferredCalls deferred;
  absl::MutexLock lock(&mu_);
  Entry* entry = raw.entry_;
  // Counted until the reference is gone: the cache is not destroyed under it.
  struct Done {
    uint64_t& in_flight;
    ~Done() { --in_flight; }
  } done{compressions_in_flight_};
  if (!plan.compress || !encoding.ok()) {
    ++stats_.objects_kept_raw;
    if (!encoding.ok()) {
      TIERD_LOG(ERROR) << "compressing " << key << ": " << encoding << " (kept raw)";
    } else {
      TIERD_VLOG(2) << "keeping " << key << " raw: it " << plan.reason;
    }
    --entry->refs;  // the reference goes here, under the lock it needs
    raw.entry_ = nullptr;
    table_.FreeIfUnused(entry);
    return;
  }
  // The swap needs the raw bytes unreferenced: copies of them to a GPU finish in milliseconds.
  // Destruction wakes it: the object is then left raw.
  auto alone = [this, entry]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return entry->refs == 1 || !compressing_; };
  const bool swappable = mu_.AwaitWithTimeout(absl::Condition(&alone), kSwapWait) && compressing_ &&
                         entry->listed() && entry->state == State::kResident && !entry->compressed;
  --entry->refs;
  raw.entry_ = nullptr;
  if (!swappable) {
    TIERD_VLOG(1) << "not compressing " << key << ": still in use, gone or shutting down";
    table_.FreeIfUnused(entry);
    return;
  }
  SwapInCompressedLocked(entry, encoded, *layout, deferred.calls());
  table_.FreeIfUnused(entry);
  table_.RetryWaiters(deferred.calls());
}

void HostCache::SwapInCompressedLocked(Entry* entry, const std::vector<uint8_t>& encoded,
                                       const codec::CompressedLayout& layout, Deferred& deferred) {
  // The raw bytes go first, so that the smaller form always finds room where they were.
  entry->memory.reset();
  std::optional<ArenaAllocation> memory = arena_.Allocate(encoded.size());
  if (!memory) {
    // Not expected (the freed range alone fits it); the object is read again when asked for.
    TIERD_LOG(ERROR) << "no room for the compressed form of " << entry->key() << " after freeing "
                     << FormatByteSize(entry->size);
    entry->state = State::kSpilled;
    RemoveLocked(entry);
    return;
  }
  entry->memory = *std::move(memory);
  entry->head = 0;
  // Busy while the bytes go in: fetches wait, as they do for a read, and nothing evicts it.
  entry->state = State::kLoading;
  uint8_t* destination = arena_.data(*entry->memory);
  mu_.Unlock();
  std::memcpy(destination, encoded.data(), encoded.size());
  mu_.Lock();
  entry->state = State::kResident;
  entry->compressed = layout;
  ++stats_.objects_encoded;
  TIERD_VLOG(2) << "compressed " << entry->key() << " to " << FormatByteSize(encoded.size())
                << " of " << FormatByteSize(entry->size);
  if (!entry->listed()) {
    // Dropped meanwhile (its model went): whoever waits reads it again.
    for (FetchCallback& done : entry->waiters) {
      DeferAnswer(deferred, std::move(done),
                  absl::UnavailableError(absl::StrCat(entry->key(), " was dropped; ask again")));
    }
    entry->waiters.clear();
    return;
  }
  for (FetchCallback& done : entry->waiters) {
    DeferAnswer(deferred, std::move(done), RefLocked(entry));
  }
  entry->waiters.clear();
}

}  // namespace tierd
