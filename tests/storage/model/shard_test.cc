// Tensor-parallel shards ("MODEL/OBJECT@DIM:INDEX/COUNT") end to end on real files: registered in
// a real catalog, read by a real disk reader into the host cache, compared with tensor_split of
// the whole tensor; only the shard's bytes read from disk; bad specs refused.
#include "storage/model/shard.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "storage/model/object_layout.h"
#include "tests/storage/host/host_cache_test_fixture.h"

namespace tierd {
namespace host_cache_test {
namespace {

class ShardTest : public HostCacheTest {
 protected:
  // Writes `files` (each a list of tensors) as model "m" and registers it with `grouping`.
  void Register(const std::vector<std::vector<testing::TensorSpec>>& files, Grouping grouping) {
    model_dir_ = absl::StrCat(dir_.path(), "/models/sharded");
    std::filesystem::create_directories(model_dir_);
    for (size_t i = 0; i < files.size(); ++i) {
      ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(model_dir_, "/model-", i, ".safetensors"),
                                            files[i]),
                  IsOk());
    }
    ASSERT_THAT(catalog_->RegisterModel("m", model_dir_, grouping, GroupingRules::Defaults()),
                IsOk());
  }

  // Fetches `key` and returns its bytes ("" and a failure when it cannot be fetched).
  std::string FetchBytes(const std::string& key) {
    absl::StatusOr<HostObject> object = FetchNow(key);
    EXPECT_THAT(object, IsOk()) << key;
    if (!object.ok()) return "";
    return std::string(reinterpret_cast<const char*>(object->data()), object->size());
  }

  // The bytes of tensor `tensor` inside shard `key`, checked against its lookup.
  std::string TensorOfShard(const std::string& key, size_t tensor) {
    absl::StatusOr<ObjectRef> ref = catalog_->Lookup(key);
    EXPECT_THAT(ref, IsOk()) << key;
    if (!ref.ok()) return "";
    const TensorPlacement& placement = ref->object->tensors.at(tensor);
    return FetchBytes(key).substr(placement.offset, placement.size);
  }

  // Checks that shard `key` cut out of its whole object's bytes (ObjectInfo::from_base, as the GPU
  // tier copies it) has every tensor's bytes of the shard read as itself.
  void ExpectCutEqualsRead(const std::string& key) {
    absl::StatusOr<ObjectRef> ref = catalog_->Lookup(key);
    ASSERT_THAT(ref, IsOk()) << key;
    const ObjectInfo& shard = *ref->object;
    ASSERT_FALSE(shard.base.empty()) << key;
    const std::string whole = FetchBytes(absl::StrCat(ref->model->name, "/", shard.base));
    std::string cut(shard.size, '\0');
    for (const StridedRange& range : shard.from_base) {
      for (uint64_t row = 0; row < range.rows; ++row) {
        ASSERT_LE(range.src_offset + row * range.src_pitch + range.width, whole.size()) << key;
        ASSERT_LE(range.dst_offset + row * range.dst_pitch + range.width, cut.size()) << key;
        cut.replace(range.dst_offset + row * range.dst_pitch, range.width,
                    whole.substr(range.src_offset + row * range.src_pitch, range.width));
      }
    }
    const std::string read = FetchBytes(key);
    for (const TensorPlacement& tensor : shard.tensors) {
      EXPECT_EQ(cut.substr(tensor.offset, tensor.size), read.substr(tensor.offset, tensor.size))
          << key << " " << tensor.name;
    }
  }
};

// A shard's layout is derived once per registration, not at every lookup: the tiers look a key
// up each time it is fetched, some under their lock.
TEST_F(ShardTest, AShardsLayoutIsDerivedOnceAndKeptForItsRegistration) {
  Start(8);
  Register({{testing::RandomTensor("w", "F32", {64, 32}, 9)}}, Grouping::kTensor);
  const uint64_t derived = catalog_->shards_derived();
  absl::StatusOr<ObjectRef> first = catalog_->Lookup("m/w@1:1/4");
  absl::StatusOr<ObjectRef> again = catalog_->Lookup("m/w@1:1/4");
  ASSERT_THAT(first, IsOk());
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(first->object, again->object) << "derived again";
  EXPECT_EQ(catalog_->shards_derived(), derived + 1);
  // A registration of its own: derived anew, from the new files.
  ASSERT_THAT(catalog_->DropModel("m"), IsOk());
  Register({{testing::RandomTensor("w", "F32", {64, 32}, 10)}}, Grouping::kTensor);
  absl::StatusOr<ObjectRef> renewed = catalog_->Lookup("m/w@1:1/4");
  ASSERT_THAT(renewed, IsOk());
  EXPECT_NE(renewed->model, first->model);
  EXPECT_NE(renewed->object, first->object);
}

TEST_F(ShardTest, ShardsAreTensorSplitForEveryDtypeDimAndCount) {
  Start(8);
  const std::vector<testing::TensorSpec> tensors = {
      testing::RandomTensor("bias", "F32", {7}, 1),
      testing::RandomTensor("proj.weight", "BF16", {6, 10}, 2),
      testing::RandomTensor("conv.weight", "F16", {5, 4, 3}, 3),
      testing::RandomTensor("u8", "U8", {3, 5, 2, 4}, 4),
      testing::RandomTensor("f64", "F64", {4, 9}, 5),
      testing::RandomTensor("fp8", "F8_E4M3", {9, 3}, 6),
      testing::RandomTensor("i64", "I64", {2, 3, 5}, 7),
  };
  Register({tensors}, Grouping::kTensor);
  int checked = 0;
  for (const testing::TensorSpec& tensor : tensors) {
    for (size_t dim = 0; dim < tensor.shape.size(); ++dim) {
      for (uint64_t count : {uint64_t{1}, uint64_t{2}, uint64_t{3}, tensor.shape[dim]}) {
        if (count > tensor.shape[dim]) continue;
        for (uint64_t index = 0; index < count; ++index) {
          const std::string key = absl::StrCat("m/", tensor.name, "@", dim, ":", index, "/", count);
          const std::string expected = testing::TensorSplit(tensor, dim, index, count);
          ASSERT_EQ(FetchBytes(key), expected) << key;
          ExpectCutEqualsRead(key);
          absl::StatusOr<ObjectRef> ref = catalog_->Lookup(key);
          ASSERT_THAT(ref, IsOk());
          std::vector<uint64_t> shape = tensor.shape;
          shape[dim] = ShardRows(shape[dim], index, count).second;
          EXPECT_EQ(ref->object->tensors.at(0).shape, shape) << key;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
  // A shard's checksum is recorded at its first read, as an object's.
  EXPECT_TRUE(catalog_->Checksum("m/proj.weight@1:1/2").has_value());
}

// Columns [first, first + count) (dim 1) or rows (dim 0) of a 2-D tensor, as a tensor of its own.
testing::TensorSpec Slice2D(const testing::TensorSpec& tensor, size_t dim, uint64_t first,
                            uint64_t count) {
  const uint64_t element = tensor.data.size() / (tensor.shape[0] * tensor.shape[1]);
  testing::TensorSpec slice{tensor.name, tensor.dtype, tensor.shape, ""};
  slice.shape[dim] = count;
  for (uint64_t r = 0; r < slice.shape[0]; ++r) {
    for (uint64_t c = 0; c < slice.shape[1]; ++c) {
      const uint64_t row = dim == 0 ? first + r : r;
      const uint64_t column = dim == 1 ? first + c : c;
      slice.data += tensor.data.substr((row * tensor.shape[1] + column) * element, element);
    }
  }
  return slice;
}

// torch.cat along `dim` of 2-D tensors' bytes.
std::string Cat2D(const std::vector<testing::TensorSpec>& parts, size_t dim) {
  std::string out;
  if (dim == 0) {
    for (const testing::TensorSpec& part : parts) out += part.data;
    return out;
  }
  for (uint64_t r = 0; r < parts.at(0).shape[0]; ++r) {
    for (const testing::TensorSpec& part : parts) {
      const uint64_t row_bytes = part.data.size() / part.shape[0];
      out += part.data.substr(r * row_bytes, row_bytes);
    }
  }
  return out;
}

// A fused tensor (q, k and v stacked along one dimension) split segment by segment: each rank gets
// its slice of every segment, together, as torch.cat of tensor_split of each segment.
TEST_F(ShardTest, AFusedTensorIsSplitSegmentBySegment) {
  Start(8);
  const testing::TensorSpec qkv = testing::RandomTensor("qkv.weight", "BF16", {20, 6}, 1);
  const testing::TensorSpec bias = testing::RandomTensor("qkv.bias", "F32", {20, 1}, 2);
  const testing::TensorSpec columns = testing::RandomTensor("fused_in.weight", "F16", {3, 10}, 3);
  Register({{qkv, bias, columns}}, Grouping::kTensor);
  const struct {
    const testing::TensorSpec* tensor;
    size_t dim;
    std::vector<uint64_t> segments;
  } cases[] = {{&qkv, 0, {12, 4, 4}}, {&bias, 0, {12, 4, 4}}, {&columns, 1, {6, 4}}};
  for (const auto& c : cases) {
    for (uint64_t count : {1u, 2u, 3u, 4u}) {
      for (uint64_t index = 0; index < count; ++index) {
        std::vector<testing::TensorSpec> parts;
        uint64_t start = 0;
        for (uint64_t segment : c.segments) {
          const testing::TensorSpec piece = Slice2D(*c.tensor, c.dim, start, segment);
          testing::TensorSpec split = piece;
          split.data = testing::TensorSplit(piece, c.dim, index, count);
          split.shape[c.dim] = ShardRows(segment, index, count).second;
          parts.push_back(split);
          start += segment;
        }
        const std::string key = absl::StrCat("m/", c.tensor->name, "@", c.dim, ":", index, "/",
                                             count, ":", absl::StrJoin(c.segments, ","));
        EXPECT_EQ(FetchBytes(key), Cat2D(parts, c.dim)) << key;
        ExpectCutEqualsRead(key);
        absl::StatusOr<ObjectRef> ref = catalog_->Lookup(key);
        ASSERT_THAT(ref, IsOk());
        uint64_t rows = 0;
        for (const testing::TensorSpec& part : parts) rows += part.shape[c.dim];
        EXPECT_EQ(ref->object->tensors.at(0).shape[c.dim], rows) << key;
      }
    }
  }
  for (const std::string& bad : std::vector<std::string>{
           "m/qkv.weight@0:0/2:12,4", "m/qkv.weight@0:0/2:20", "m/qkv.weight@0:0/8:12,4,4",
           "m/qkv.weight@0:0/2:12,4,04", "m/qkv.weight@0:0/2:12,,8", "m/qkv.weight@0:0/2:",
           "m/qkv.weight@0:0/2:" + absl::StrJoin(std::vector<std::string>(65, "1"), ",")}) {
    EXPECT_THAT(catalog_->Lookup(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

// An object of several tensors in two files: each tensor with the dimension is split, the others
// stay whole; the shard's tensors sit at the gathered alignment.
TEST_F(ShardTest, AnObjectOfSeveralTensorsAcrossFilesSplitsThoseWithTheDimension) {
  Start(8);
  const testing::TensorSpec q = testing::RandomTensor("layers.0.q.weight", "BF16", {8, 12}, 1);
  const testing::TensorSpec norm = testing::RandomTensor("layers.0.norm.weight", "F32", {12}, 2);
  const testing::TensorSpec o = testing::RandomTensor("layers.0.o.weight", "BF16", {12, 7}, 3);
  Register({{q, norm}, {o}}, Grouping::kBlock);
  for (uint32_t index = 0; index < 3; ++index) {
    const std::string key = absl::StrCat("m/layers.0@1:", index, "/3");
    absl::StatusOr<ObjectRef> ref = catalog_->Lookup(key);
    ASSERT_THAT(ref, IsOk());
    ASSERT_EQ(ref->object->tensors.size(), 3u);
    for (size_t t = 0; t < 3; ++t) {
      const TensorPlacement& placement = ref->object->tensors[t];
      EXPECT_EQ(placement.offset % kGatheredTensorAlignment, 0u);
      const testing::TensorSpec& source = placement.name == q.name   ? q
                                          : placement.name == o.name ? o
                                                                     : norm;
      const std::string expected = source.shape.size() > 1
                                       ? testing::TensorSplit(source, 1, index, 3)
                                       : source.data;  // the 1-D norm stays whole
      EXPECT_EQ(TensorOfShard(key, t), expected) << key << " " << placement.name;
    }
    ExpectCutEqualsRead(key);
  }
  ExpectCutEqualsRead("m/layers.0@0:1/2");
  // Dim 0 splits the norm too: it has a dimension 0.
  absl::StatusOr<ObjectRef> rows = catalog_->Lookup("m/layers.0@0:1/2");
  ASSERT_THAT(rows, IsOk());
  for (const TensorPlacement& placement : rows->object->tensors) {
    if (placement.name == norm.name) {
      EXPECT_EQ(placement.shape, std::vector<uint64_t>{6});
    }
  }
}

// A dim-0 shard is one range of the file: only its bytes (rounded out to the read alignment) are
// read, never the tensor's. A dim-1 shard reads each row's slice once, its neighbouring slices in
// one read where their blocks touch.
TEST_F(ShardTest, OnlyTheShardsBytesAreReadFromDisk) {
  Start(8, EvictionPolicy::kFifo, testing::ReaderOptions(1, 4, 1 << 20));
  const uint64_t rows = 1024, row_bytes = 1024;  // F32 [1024, 256]: 1 MiB
  const uint64_t tensor_bytes = rows * row_bytes;
  Register({{testing::RandomTensor("w", "F32", {rows, row_bytes / 4}, 9)}}, Grouping::kTensor);
  const uint64_t before = storage_->reader().stats().bytes_read;
  ASSERT_EQ(FetchBytes("m/w@0:1/4").size(), tensor_bytes / 4);
  const uint64_t dim0_read = storage_->reader().stats().bytes_read - before;
  EXPECT_GE(dim0_read, tensor_bytes / 4);
  EXPECT_LE(dim0_read, tensor_bytes / 4 + 4096);
  // 1024 slices of 256 bytes, four to a block: read one by one, each would read its block (4 MiB
  // in all); read together, the blocks they span are read once.
  ASSERT_EQ(FetchBytes("m/w@1:2/4").size(), tensor_bytes / 4);
  const uint64_t dim1_read = storage_->reader().stats().bytes_read - before - dim0_read;
  EXPECT_LE(dim1_read, tensor_bytes + 4096);
  // A quarter of what it reads is the shard's: through the page cache, for the other ranks.
  EXPECT_EQ(storage_->reader().stats().sparse_bytes_read, dim1_read);
}

// A shard's checksum, recorded at its first read, is kept across a restart and checks its later
// reads: a byte flipped on disk under it (size and mtime kept) is DATA_LOSS, never handed out,
// while the other rank's shard, which does not hold that byte, is still served.
TEST_F(ShardTest, AShardsChecksumOutlivesARestartAndChecksItsReads) {
  Start(8);
  const testing::TensorSpec w = testing::RandomTensor("w", "F32", {64, 256}, 5);  // 64 KiB
  Register({{w}}, Grouping::kTensor);
  ASSERT_EQ(FetchBytes("m/w@0:1/2"), testing::TensorSplit(w, 0, 1, 2));
  ASSERT_THAT(catalog_->Flush(), IsOk());
  const std::optional<uint64_t> recorded = catalog_->Checksum("m/w@0:1/2");
  ASSERT_TRUE(recorded.has_value());

  storage_.reset();
  Start(8);
  EXPECT_EQ(catalog_->Checksum("m/w@0:1/2"), recorded);
  {
    // The file ends with rank 1's rows: flip a byte near its end.
    const std::string path = absl::StrCat(model_dir_, "/model-0.safetensors");
    const ScopedMtime keep(path);
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-100, std::ios::end);
    const std::streamoff position = file.tellg();
    const char byte = static_cast<char>(file.get());
    file.seekp(position);
    file.put(static_cast<char>(byte ^ 0x40));
  }
  EXPECT_THAT(FetchNow("m/w@0:1/2"), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(FetchBytes("m/w@0:0/2"), testing::TensorSplit(w, 0, 0, 2));
}

TEST_F(ShardTest, BadSpecsAreRefused) {
  Start(2);
  Register(
      {{testing::RandomTensor("w", "F32", {4, 3}, 1), testing::RandomTensor("b", "F32", {3}, 2),
        testing::RandomTensor("tall", "U8", {(1 << 18) + 1, 1}, 3)}},
      Grouping::kTensor);
  for (const char* key : {"m/w@2:0/2",        // dim out of range
                          "m/b@1:0/1",        // a 1-D tensor has no dimension 1
                          "m/w@0:2/2",        // index >= count
                          "m/w@0:0/0",        // count 0
                          "m/w@1:0/4",        // count > the dim's size
                          "m/w@0:1",          // malformed
                          "m/w@0:-1/2",       // malformed
                          "m/w@x:/",          // malformed
                          "m/w@0:01/2",       // not written canonically
                          "m/w@0:0/2 ",       // trailing space
                          "m/tall@1:0/1"}) {  // a range per row: more than the bound
    EXPECT_THAT(FetchNow(key), StatusIs(absl::StatusCode::kInvalidArgument)) << key;
    EXPECT_THAT(catalog_->Lookup(key), StatusIs(absl::StatusCode::kInvalidArgument)) << key;
  }
  EXPECT_THAT(FetchNow("m/nothing@0:0/2"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(catalog_->Lookup("m/tall@0:0/1"), IsOk());  // one range
  // No spec at all after the '@': just a name the model lacks.
  EXPECT_THAT(FetchNow("m/w@x"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(catalog_->Checksum("m/w@0:0/0").has_value());
}

}  // namespace
}  // namespace host_cache_test
}  // namespace tierd

namespace tierd {
namespace {

// A [8192, 8192] bf16 weight (128 MiB) in one file, as the catalog would describe it.
ModelInfo WideModel() {
  ModelInfo model;
  model.name = "m";
  ObjectInfo object;
  object.name = "w";
  TensorPlacement tensor;
  tensor.name = "w";
  tensor.dtype = DType::kBF16;
  tensor.shape = {8192, 8192};
  tensor.size = 8192ull * 8192 * 2;
  object.tensors = {tensor};
  object.size = tensor.size;
  object.extents = {Extent{0, 4096, tensor.size, 0}};
  model.objects = {object};
  return model;
}

// A narrow slice along a high dimension reads every row's blocks: one column of a 128 MiB
// weight (16 KiB) would read all 128 MiB, once per rank. Such a shard is refused before anything
// is read; a tensor-parallel rank's share, which reads at most a few times its bytes, is not.
TEST(ShardLayoutTest, AShardThatWouldReadFarMoreThanItsBytesIsRefused) {
  const ModelInfo model = WideModel();
  absl::StatusOr<ObjectInfo> column = FindShard(model, "w@1:0/8192");
  EXPECT_THAT(column, testing::StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(column.status().message()),
              ::testing::HasSubstr("would read 134205440 bytes from disk for 16384"));
  EXPECT_THAT(FindShard(model, "w@1:7/128"), testing::StatusIs(absl::StatusCode::kInvalidArgument));
  // Rows: read exactly. Columns of a TP group of 8: the whole tensor for an eighth of it.
  EXPECT_THAT(FindShard(model, "w@0:3/8"), testing::IsOk());
  EXPECT_THAT(FindShard(model, "w@1:3/8"), testing::IsOk());
  EXPECT_EQ(DiskBytesToRead({{4096, 100}, {4096 + 80000, 100}}), 8192u);   // too far apart
  EXPECT_EQ(DiskBytesToRead({{4096, 100}, {4096 + 60000, 100}}), 61440u);  // read as one
}

// Tensors of no bytes may have huge dimensions ([2^63, 1, 0] is a valid safetensors shape). Two
// of them in one object once made the count of a dimension-1 shard's ranges wrap to 0, after
// which the layout walked 2^63 rows of nothing on the session's thread. Every count is checked:
// such a shard is an empty one, derived at once; one that would really need more ranges than the
// bound is refused, however its count would wrap.
TEST(ShardLayoutTest, HugeDimensionsOfEmptyTensorsCostNothingAndNeverWrapACount) {
  ModelInfo model;
  model.name = "m";
  ObjectInfo& object = model.objects.emplace_back();
  object.name = "blocks.0";
  for (const char* name : {"blocks.0.a", "blocks.0.b"}) {
    object.tensors.push_back(TensorPlacement{name, DType::kU8, {uint64_t{1} << 63, 2, 0}, 0, 0});
  }
  const absl::Time start = absl::Now();
  for (const char* spec : {"@1:0/1", "@1:1/2", "@0:3/4", "@2:0/1"}) {
    absl::StatusOr<ObjectInfo> shard = FindShard(model, absl::StrCat("blocks.0", spec));
    if (absl::string_view(spec) == "@2:0/1") {  // no rows there: fewer than the count
      EXPECT_THAT(shard, testing::StatusIs(absl::StatusCode::kInvalidArgument)) << spec;
      continue;
    }
    ASSERT_THAT(shard, testing::IsOk()) << spec;
    EXPECT_EQ(shard->size, 0u) << spec;
    EXPECT_TRUE(shard->extents.empty()) << spec;
    EXPECT_TRUE(shard->from_base.empty()) << spec;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  // With bytes, 2^63 rows of one byte each would be 2^63 ranges per tensor; two of them wrap a
  // plain sum to 0. The bound holds instead.
  ModelInfo wide;
  wide.name = "m";
  ObjectInfo& big = wide.objects.emplace_back();
  big.name = "w";
  for (const char* name : {"w.a", "w.b"}) {
    big.tensors.push_back(
        TensorPlacement{name, DType::kU8, {uint64_t{1} << 63, 1}, 0, uint64_t{1} << 63});
  }
  big.size = UINT64_MAX;
  absl::StatusOr<ObjectInfo> refused = FindShard(wide, "w@1:0/1");
  EXPECT_THAT(refused, testing::StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("separate ranges"));
}

// Which shards the GPU tier cuts out of their whole object in host memory: any, when the object
// is there already; otherwise a strided one (read alone, it reads blocks its neighbours' shards
// read too) whose object is within the read bound; never a dim-0 shard whose rows are contiguous.
TEST(ShardLayoutTest, StridedShardsAreCutFromTheirObjectAndContiguousOnesReadAlone) {
  const ModelInfo model = WideModel();
  const uint64_t whole = model.objects[0].size;
  absl::StatusOr<ObjectInfo> rows = FindShard(model, "w@0:3/8");
  absl::StatusOr<ObjectInfo> columns = FindShard(model, "w@1:3/8");
  ASSERT_THAT(rows, testing::IsOk());
  ASSERT_THAT(columns, testing::IsOk());
  EXPECT_EQ(columns->base, "w");
  ASSERT_EQ(columns->from_base.size(), 1u);
  const StridedRange& range = columns->from_base[0];
  EXPECT_EQ(range.rows, 8192u);
  EXPECT_EQ(range.width, 1024u * 2);
  EXPECT_EQ(range.src_pitch, 8192u * 2);
  EXPECT_EQ(range.src_offset, 3u * 1024 * 2);
  EXPECT_EQ(range.dst_pitch, 1024u * 2);
  EXPECT_TRUE(CutShardFromObject(*columns, whole, /*object_in_host_memory=*/false));
  EXPECT_FALSE(CutShardFromObject(*rows, whole, /*object_in_host_memory=*/false));
  EXPECT_TRUE(CutShardFromObject(*rows, whole, /*object_in_host_memory=*/true));
  // An object far larger than the shard (past the read bound) is not read whole for it.
  EXPECT_FALSE(CutShardFromObject(*columns, 65 * columns->size + (16 << 20), false));
  // An object that is no shard is never cut.
  EXPECT_FALSE(CutShardFromObject(model.objects[0], whole, true));
}

}  // namespace
}  // namespace tierd
