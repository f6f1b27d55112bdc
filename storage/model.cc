#include "storage/model.h"

#include <xxhash.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/quote.h"

namespace tierd {

std::optional<Grouping> ParseGrouping(absl::string_view name) {
  if (name == "tensor") return Grouping::kTensor;
  if (name == "block") return Grouping::kBlock;
  if (name == "phase") return Grouping::kPhase;
  return std::nullopt;
}

const char* GroupingName(Grouping grouping) {
  switch (grouping) {
    case Grouping::kTensor:
      return "tensor";
    case Grouping::kBlock:
      return "block";
    case Grouping::kPhase:
      return "phase";
  }
  return "block";  // unreachable: the switch covers every enumerator
}

GroupingRules GroupingRules::Defaults() {
  GroupingRules rules;
  // Lazy prefix so "a.blocks.1.x" gives "a.blocks.1"; \d+ then \. so "blocks.1" never swallows
  // "blocks.10".
  rules.block_patterns = {R"(^(.*?(?:blocks|layers|h)\.\d+)\.)"};
  // cross_attn before attn: "attn2" and "encoder_attn" are cross-attention in common layouts.
  rules.phase_patterns = {
      {"cross_attn", R"(^(cross_attn|cross_attention|encoder_attn|attn2)\.)"},
      {"attn", R"(^(self_attn|attn|attention|attn1|self_attention)\.)"},
      {"ffn", R"(^(ffn|mlp|feed_forward|ff)\.)"},
      {"norm", R"(^([a-z_]*norm[a-z_0-9]*|ln_?\d*)\.)"},
  };
  return rules;
}

absl::Status ValidateModelName(absl::string_view name) {
  bool valid = !name.empty() && name.size() <= 128 && name.front() != '.';
  for (char c : name) {
    valid = valid && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-');
  }
  if (valid) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("model name ", Quote(name),
                   " must be 1-128 characters of [A-Za-z0-9._-], not starting with '.'"));
}

absl::StatusOr<std::pair<std::string, std::string>> SplitObjectKey(absl::string_view key) {
  const size_t slash = key.find('/');
  if (slash == absl::string_view::npos || slash == 0 || slash + 1 == key.size()) {
    return absl::InvalidArgumentError(absl::StrCat("key ", Quote(key), " is not MODEL/OBJECT"));
  }
  const absl::string_view model = key.substr(0, slash);
  const absl::Status valid = ValidateModelName(model);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("key ", Quote(key), ": ", valid.message()));
  }
  return std::make_pair(std::string(model), std::string(key.substr(slash + 1)));
}

std::shared_ptr<const std::vector<TensorPlacement>> ObjectRef::tensors() const {
  if (shard != nullptr) {
    // A copy: the shard's extents (a row each, for a strided one) need not live as long.
    return std::make_shared<const std::vector<TensorPlacement>>(object->tensors);
  }
  return std::shared_ptr<const std::vector<TensorPlacement>>(model, &object->tensors);
}

const ObjectInfo* FindObject(const ModelInfo& info, absl::string_view name) {
  auto it = std::lower_bound(
      info.objects.begin(), info.objects.end(), name,
      [](const ObjectInfo& object, absl::string_view key) { return object.name < key; });
  return it != info.objects.end() && it->name == name ? &*it : nullptr;
}

uint64_t ObjectSourceFingerprint(const ModelInfo& model, const ObjectInfo& object) {
  std::string text = absl::StrCat(object.size);
  for (const Extent& extent : object.extents) {
    const ModelFile& file = model.files.at(extent.file);
    if (file.device != 0 || file.inode != 0) {
      absl::StrAppend(&text, "|", file.device, ":", file.inode);
    } else {
      // A remote file is one version of its object: a node's daemons that registered two
      // versions of the same size must not lend each other their bytes.
      absl::StrAppend(&text, "|", file.path, "#", file.etag);
    }
    absl::StrAppend(&text, ":", file.size, ":", file.mtime_ns, "@", extent.file_offset, "+",
                    extent.length, ">", extent.object_offset);
  }
  const uint64_t fingerprint = XXH3_64bits(text.data(), text.size());
  return fingerprint != 0 ? fingerprint : 1;
}

}  // namespace tierd
