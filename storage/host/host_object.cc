// HostObject: a reference to one of the host cache's objects (storage/host/host_cache.h).
#include "storage/host/host_cache.h"

#include <cstdint>
#include <string>
#include <utility>

#include "storage/host/detail/host_cache_record.h"

namespace tierd {

HostObject& HostObject::operator=(HostObject&& other) noexcept {
  if (this != &other) {
    Reset();
    cache_ = std::exchange(other.cache_, nullptr);
    entry_ = std::exchange(other.entry_, nullptr);
    held_by_copy_ = std::exchange(other.held_by_copy_, false);
  }
  return *this;
}

const std::string& HostObject::key() const { return entry_->key(); }
uint8_t* HostObject::data() const { return cache_->arena_.data(*entry_->memory) + entry_->head; }
uint64_t HostObject::size() const { return entry_->size; }
// A referenced entry's form does not change: the compressor swaps only unreferenced ones.
const codec::CompressedLayout* HostObject::compressed() const {
  return entry_->compressed ? &*entry_->compressed : nullptr;
}
uint64_t HostObject::stored_size() const { return StoredBytes(*entry_); }

void HostObject::Reset() {
  if (entry_ != nullptr) cache_->Release(entry_, held_by_copy_);
  cache_ = nullptr;
  entry_ = nullptr;
  held_by_copy_ = false;
}

void HostObject::HeldByCopy() {
  if (entry_ == nullptr || held_by_copy_) return;
  held_by_copy_ = true;
  cache_->HoldForCopy();
}

}  // namespace tierd
