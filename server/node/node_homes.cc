#include "server/node/node_homes.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "storage/model/object_checksum.h"

namespace tierd {
namespace {

uint64_t Score(const std::string& member, absl::string_view key) {
  const std::string both = absl::StrCat(member, std::string(1, '\0'), key);
  return ObjectChecksum(reinterpret_cast<const uint8_t*>(both.data()), both.size());
}

}  // namespace

NodeHomes::NodeHomes(const std::vector<std::string>& members, std::string self)
    : self_(std::move(self)), members_(members) {
  members_.push_back(self_);
  std::sort(members_.begin(), members_.end());
  members_.erase(std::unique(members_.begin(), members_.end()), members_.end());
}

const std::string& NodeHomes::HomeOf(absl::string_view key) const {
  const std::string* best = &members_.front();
  uint64_t best_score = Score(*best, key);
  for (size_t i = 1; i < members_.size(); ++i) {
    const uint64_t score = Score(members_[i], key);
    // Ties (vanishingly rare) go to the first in sorted order, the same on every daemon.
    if (score > best_score) {
      best = &members_[i];
      best_score = score;
    }
  }
  return *best;
}

}  // namespace tierd
