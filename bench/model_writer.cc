#include "bench/model_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_support.h"
#include "common/byte_size.h"
#include "storage/dtype.h"
#include "testing/sample_weights.h"

namespace tierd::bench {
namespace {

constexpr size_t kBlockWords = 1 << 20;  // 8 MiB written at a time

// Fills `block` (kBlockWords) with the next words of `values`. Weights: one block of N(0, 0.02²)
// bf16 values or of their e4m3 quantisation (made once: drawing them is slow), each value's sign
// flipped at random, so that no two blocks are alike and each has the weights' statistics.
void FillBlock(WeightValues values, std::vector<uint64_t>& block, uint64_t& seed) {
  FillRandomWords(block, seed);
  if (values == WeightValues::kRandomBytes) return;
  static const std::vector<uint64_t>* const normal = [] {
    auto* words = new std::vector<uint64_t>(kBlockWords);
    codec::FillNormalWeights(codec::WordLayout::kBf16, 0.02, 1,
                             reinterpret_cast<uint16_t*>(words->data()), kBlockWords * 4);
    return words;
  }();
  static const std::vector<uint64_t>* const e4m3 = [] {
    constexpr uint64_t kCols = 4096;
    constexpr uint64_t kRows = kBlockWords * 8 / kCols;
    auto* words = new std::vector<uint64_t>(kBlockWords);
    std::vector<float> scales((kRows / 128) * (kCols / 128));
    codec::FillBlockScaledFp8Weights(codec::Fp8Format::kE4m3, 0.02, 1, kRows, kCols, 128,
                                     reinterpret_cast<uint8_t*>(words->data()), scales.data());
    return words;
  }();
  const bool fp8 = values == WeightValues::kE4m3;
  const std::vector<uint64_t>& weights = fp8 ? *e4m3 : *normal;
  const uint64_t signs = fp8 ? 0x8080808080808080ull : 0x8000800080008000ull;
  for (size_t i = 0; i < kBlockWords; ++i) block[i] = weights[i] ^ (block[i] & signs);
}

// The element type of the tensors `values` makes.
DType ValuesDType(WeightValues values) {
  switch (values) {
    case WeightValues::kNormalBf16:
      return DType::kBF16;
    case WeightValues::kE4m3:
      return DType::kF8E4M3;
    case WeightValues::kRandomBytes:
      break;
  }
  return DType::kU8;
}

// Writes one safetensors file of `values`: [bytes / row_bytes, row_bytes] (in elements of the
// values' dtype) where row_bytes divides the size, else 1-D.
void WriteSafetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                      uint64_t row_bytes, WeightValues values, uint64_t& seed) {
  const DType dtype = ValuesDType(values);
  const uint64_t word = DTypeSize(dtype);
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const TensorSpec& tensor : tensors) {
    const bool rows = row_bytes > 0 && tensor.bytes % row_bytes == 0;
    if (tensor.bytes % word != 0 || (rows && row_bytes % word != 0)) {
      Die(absl::StrCat(tensor.name, ": ", tensor.bytes, " bytes are not whole ", DTypeName(dtype),
                       " elements"));
    }
    header[tensor.name] = {
        {"dtype", DTypeName(dtype)},
        {"shape", rows ? nlohmann::json::array({tensor.bytes / row_bytes, row_bytes / word})
                       : nlohmann::json::array({tensor.bytes / word})},
        {"data_offsets", {offset, offset + tensor.bytes}}};
    offset += tensor.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t length = text.size();
  out.write(reinterpret_cast<const char*>(&length), sizeof(length));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<uint64_t> block(kBlockWords);
  for (uint64_t written = 0; written < offset;) {
    FillBlock(values, block, seed);
    const uint64_t n = std::min<uint64_t>(block.size() * 8, offset - written);
    out.write(reinterpret_cast<const char*>(block.data()), static_cast<std::streamsize>(n));
    written += n;
  }
  out.close();
  if (!out) Die("cannot write " + path);
}

}  // namespace

WeightValues ParseWeightValues(const std::string& text) {
  if (text == "random") return WeightValues::kRandomBytes;
  if (text == "normal") return WeightValues::kNormalBf16;
  if (text == "e4m3") return WeightValues::kE4m3;
  Die(absl::StrCat("--weights must be random, normal or e4m3, not \"", text, "\""));
}

std::vector<TensorSpec> ParseTensorList(const std::string& text) {
  std::vector<TensorSpec> tensors;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(item, 'x');
    int count = 0;
    absl::StatusOr<uint64_t> size =
        parts.size() == 2 ? tierd::ParseByteSize(parts[0]) : absl::InvalidArgumentError("");
    if (!size.ok() || *size == 0 || !absl::SimpleAtoi(parts[1], &count) || count <= 0) {
      Die(absl::StrCat("--tensors: \"", item, "\" is not SIZExCOUNT (e.g. 64MiBx16)"));
    }
    for (int i = 0; i < count; ++i) {
      tensors.push_back({absl::StrCat("s", *size >> 20, "m.", i), *size});
    }
  }
  if (tensors.empty()) Die("--tensors names no tensor");
  return tensors;
}

void WriteModel(const std::string& dir, const std::vector<TensorSpec>& tensors, int files,
                uint64_t row_bytes, WeightValues values) {
  files = std::max(1, files);
  ::mkdir(dir.c_str(), 0755);
  std::vector<std::vector<TensorSpec>> per_file(files);
  for (size_t i = 0; i < tensors.size(); ++i) per_file[i % files].push_back(tensors[i]);
  uint64_t seed = 1;
  for (int f = 0; f < files; ++f) {
    const std::string path = absl::StrCat(dir, "/model-", f + 1, "-of-", files, ".safetensors");
    Progress(absl::StrCat("writing ", path));
    WriteSafetensors(path, per_file[f], row_bytes, values, seed);
  }
  ::sync();
}

}  // namespace tierd::bench
