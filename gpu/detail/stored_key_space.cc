#include "gpu/detail/stored_key_space.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tierd {

absl::StatusOr<std::string> StoredKeySpace::OwnHostKey(const std::string& key) const {
  if (Contains(key)) return HostKey(key, /*stored=*/true);
  if (!prefix_.empty() && !catalog_.Lookup(key).ok()) {
    // Not a weight, nor one of this group's objects: whatever the host cache has under this key
    // is someone else's, and not even its existence is this group's business.
    RETURN_IF_ERROR(SplitObjectKey(key).status());
    return absl::NotFoundError(absl::StrCat("no object ", key));
  }
  return key;
}

bool StoredKeySpace::MayActOn(const std::string& key, bool stored) const {
  return stored || prefix_.empty() || catalog_.Lookup(key).ok();
}

std::optional<StoredKeySpace::Meta> StoredKeySpace::Find(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = stored_.find(key);
  if (it == stored_.end()) return std::nullopt;
  return it->second;
}

bool StoredKeySpace::Contains(const std::string& key) const {
  absl::MutexLock lock(&mu_);
  return stored_.count(key) > 0;
}

void StoredKeySpace::Publish(const std::string& key, Meta meta) {
  absl::MutexLock lock(&mu_);
  stored_[key] = std::move(meta);
}

bool StoredKeySpace::Remove(const std::string& key) {
  absl::MutexLock lock(&mu_);
  return stored_.erase(key) > 0;
}

std::vector<std::string> StoredKeySpace::KeysUnder(const std::string& prefix) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> keys;
  for (auto it = stored_.lower_bound(prefix);
       it != stored_.end() && absl::StartsWith(it->first, prefix); ++it) {
    keys.push_back(it->first);
  }
  return keys;
}

}  // namespace tierd
