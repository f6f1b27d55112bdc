#include "storage/model/object_checksum.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fd_io.h"
#include "common/posix_error.h"
#include "common/status_macros.h"
#include "storage/model/model_scan.h"

namespace tierd {
namespace {

constexpr uint64_t kReadBytes = 4ull << 20;
constexpr uint64_t kProgressEveryBytes = 256ull << 20;

// The object's extents in object order.
std::vector<const Extent*> InObjectOrder(const ObjectInfo& object) {
  std::vector<const Extent*> extents;
  extents.reserve(object.extents.size());
  for (const Extent& extent : object.extents) extents.push_back(&extent);
  std::sort(extents.begin(), extents.end(),
            [](const Extent* a, const Extent* b) { return a->object_offset < b->object_offset; });
  return extents;
}

}  // namespace

void ForEachObjectGap(const ObjectInfo& object,
                      const std::function<void(uint64_t begin, uint64_t end)>& gap) {
  uint64_t cursor = 0;
  for (const Extent* extent : InObjectOrder(object)) {
    if (extent->object_offset > cursor) gap(cursor, extent->object_offset);
    cursor = std::max(cursor, extent->object_offset + extent->length);
  }
  if (object.size > cursor) gap(cursor, object.size);
}

void ZeroObjectGaps(const ObjectInfo& object, uint8_t* data) {
  ForEachObjectGap(object, [data](uint64_t begin, uint64_t end) {
    std::memset(data + begin, 0, end - begin);
  });
}

uint64_t CombineSegmentChecksums(uint64_t size, absl::Span<const uint64_t> segments) {
  if (size <= kChecksumSegmentBytes) return segments.empty() ? XXH3_64bits(nullptr, 0) : segments[0];
  std::vector<uint8_t> encoded(segments.size() * sizeof(uint64_t));
  for (size_t i = 0; i < segments.size(); ++i) {
    for (size_t byte = 0; byte < sizeof(uint64_t); ++byte) {
      encoded[i * sizeof(uint64_t) + byte] = static_cast<uint8_t>(segments[i] >> (8 * byte));
    }
  }
  return XXH3_64bits(encoded.data(), encoded.size());
}

uint64_t WholeObjectChecksum(const uint8_t* data, uint64_t size) {
  return XXH3_64bits(data, size);
}

uint64_t ObjectChecksum(const uint8_t* data, uint64_t size) {
  if (size <= kChecksumSegmentBytes) return XXH3_64bits(data, size);
  std::vector<uint64_t> segments;
  segments.reserve((size + kChecksumSegmentBytes - 1) / kChecksumSegmentBytes);
  for (uint64_t at = 0; at < size; at += kChecksumSegmentBytes) {
    segments.push_back(XXH3_64bits(data + at, std::min(kChecksumSegmentBytes, size - at)));
  }
  return CombineSegmentChecksums(size, segments);
}

Xxh3State NewXxh3State() {
  Xxh3State state(XXH3_createState());
  // XXH3_createState fails only when malloc does.
  if (state == nullptr) std::abort();
  XXH3_64bits_reset(state.get());
  return state;
}

ObjectHasher::ObjectHasher() : segment_(NewXxh3State()) { Reset(); }

void ObjectHasher::Reset() {
  XXH3_64bits_reset(segment_.get());
  in_segment_ = 0;
  size_ = 0;
  segments_.clear();
}

void ObjectHasher::Update(const uint8_t* data, uint64_t size) {
  while (size > 0) {
    const uint64_t take = std::min(size, kChecksumSegmentBytes - in_segment_);
    XXH3_64bits_update(segment_.get(), data, take);
    data += take;
    size -= take;
    in_segment_ += take;
    size_ += take;
    if (in_segment_ == kChecksumSegmentBytes) {
      segments_.push_back(XXH3_64bits_digest(segment_.get()));
      XXH3_64bits_reset(segment_.get());
      in_segment_ = 0;
    }
  }
}

uint64_t ObjectHasher::Digest() const {
  if (size_ <= kChecksumSegmentBytes) {
    return segments_.empty() ? XXH3_64bits_digest(segment_.get()) : segments_[0];
  }
  if (in_segment_ == 0) return CombineSegmentChecksums(size_, segments_);
  std::vector<uint64_t> segments = segments_;
  segments.push_back(XXH3_64bits_digest(segment_.get()));
  return CombineSegmentChecksums(size_, segments);
}

absl::StatusOr<std::map<std::string, uint64_t>> ChecksumModelObjects(
    const ModelInfo& model, const ModelRoots& roots, const VerifyProgress& progress) {
  // One file open at a time: a model may have thousands, more than this process may hold open.
  // Each is checked when opened and again when done with, so that a write during its reading is
  // not vouched for.
  ScopedFd open_file(-1);
  size_t open_index = 0;
  const auto file_fd = [&](size_t index) -> absl::StatusOr<int> {
    if (open_file.get() >= 0 && open_index == index) return open_file.get();
    if (open_file.get() >= 0)
      RETURN_IF_ERROR(CheckModelFile(open_file.get(), model.files[open_index]));
    ASSIGN_OR_RETURN(open_file, OpenModelFile(roots, model.files[index], O_RDONLY));
    open_index = index;
    return open_file.get();
  };
  ObjectHasher hasher;
  std::vector<uint8_t> buffer(kReadBytes);
  std::map<std::string, uint64_t> checksums;
  uint64_t done = 0;
  uint64_t reported = 0;
  const std::string* last_file = nullptr;
  const auto hash_zeros = [&](uint64_t bytes) {
    done += bytes;
    std::memset(buffer.data(), 0, std::min(bytes, kReadBytes));
    for (; bytes > 0; bytes -= std::min(bytes, kReadBytes)) {
      hasher.Update(buffer.data(), std::min(bytes, kReadBytes));
    }
  };
  for (const ObjectInfo& object : model.objects) {
    hasher.Reset();
    uint64_t cursor = 0;
    for (const Extent* extent : InObjectOrder(object)) {
      hash_zeros(extent->object_offset - cursor);
      const ModelFile& file = model.files[extent->file];
      last_file = &file.path;
      ASSIGN_OR_RETURN(const int fd, file_fd(extent->file));
      for (uint64_t read = 0; read < extent->length;) {
        const size_t want = std::min(extent->length - read, kReadBytes);
        const ssize_t got =
            ::pread(fd, buffer.data(), want, static_cast<off_t>(extent->file_offset + read));
        if (got < 0) {
          if (errno == EINTR) continue;
          return PosixError(absl::StrCat("reading ", file.path), errno);
        }
        if (got == 0) {
          return absl::DataLossError(absl::StrCat(file.path, " ends before byte ",
                                                  extent->file_offset + extent->length,
                                                  ", which object '", object.name, "' needs"));
        }
        hasher.Update(buffer.data(), static_cast<uint64_t>(got));
        read += static_cast<uint64_t>(got);
        done += static_cast<uint64_t>(got);
      }
      cursor = extent->object_offset + extent->length;
      if (progress && done - reported >= kProgressEveryBytes) {
        progress(done, model.total_bytes, file.path);
        reported = done;
      }
    }
    hash_zeros(object.size - cursor);
    checksums.emplace(object.name, hasher.Digest());
  }
  if (open_file.get() >= 0)
    RETURN_IF_ERROR(CheckModelFile(open_file.get(), model.files[open_index]));
  if (progress && last_file != nullptr) progress(done, model.total_bytes, *last_file);
  return checksums;
}

}  // namespace tierd
