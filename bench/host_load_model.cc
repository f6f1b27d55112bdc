#include "bench/host_load_model.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_support.h"
#include "common/byte_size.h"
#include "common/directory.h"
#include "common/fd_io.h"
#include "common/posix_error.h"

namespace tierd::bench {
namespace {

constexpr char kStampName[] = ".host-load-model";
constexpr uint64_t kIoBytes = 4ull << 20;

std::string FileName(size_t index, size_t count) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1, count);
}

// What the stamp file holds for `model`: enough to tell one layout from another.
std::string StampText(const HostLoadModel& model) {
  std::string text = absl::StrCat("objects ", model.objects.size(), " bytes ", model.object_bytes,
                                  " first ", model.objects.front().bytes, "\n");
  for (const HostLoadFile& file : model.files) {
    absl::StrAppend(&text, file.path.substr(file.path.rfind('/') + 1), " ", file.bytes, "\n");
  }
  return text;
}

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Writes the file's length prefix, header and `data_bytes` of pseudo-random bytes (splitmix64
// from `seed`, which it advances).
void WriteModelFile(const HostLoadFile& file, uint64_t data_bytes, uint64_t& seed) {
  ScopedFd fd(::open(file.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) Die(PosixError("cannot create " + file.path, errno).ToString());
  const uint64_t length = file.header.size();  // little-endian on every machine tierd runs on
  std::string prefix(reinterpret_cast<const char*>(&length), sizeof(length));
  Check(WriteAll(fd.get(), prefix + file.header, file.path), "writing the model");
  std::vector<uint64_t> block(kIoBytes / sizeof(uint64_t));
  for (uint64_t written = 0; written < data_bytes;) {
    FillRandomWords(block, seed);
    const uint64_t n = std::min<uint64_t>(kIoBytes, data_bytes - written);
    Check(WriteAll(fd.get(), {reinterpret_cast<const char*>(block.data()), n}, file.path),
          "writing the model");
    written += n;
  }
  Check(fd.Close(file.path), "writing the model");
}

}  // namespace

HostLoadModel PlanHostLoadModel(const std::string& directory, uint64_t model_bytes,
                                uint64_t object_bytes, uint64_t shard_bytes) {
  HostLoadModel model;
  model.directory = directory;
  const uint64_t object_count = (model_bytes + object_bytes - 1) / object_bytes;
  const uint64_t per_file = std::max<uint64_t>(1, shard_bytes / object_bytes);
  const size_t file_count = (object_count + per_file - 1) / per_file;
  for (size_t f = 0; f < file_count; ++f) {
    const uint64_t first = f * per_file;
    const uint64_t last = std::min(object_count, first + per_file);
    nlohmann::json header = nlohmann::json::object();
    uint64_t data_bytes = 0;
    for (uint64_t i = first; i < last; ++i) {
      const uint64_t bytes = std::min(object_bytes, model_bytes - i * object_bytes);
      model.objects.push_back({absl::StrCat("model.layers.", i), f, data_bytes, bytes});
      header[absl::StrCat("model.layers.", i, ".weight")] = {
          {"dtype", "U8"}, {"shape", {bytes}}, {"data_offsets", {data_bytes, data_bytes + bytes}}};
      data_bytes += bytes;
      model.object_bytes += bytes;
    }
    HostLoadFile file;
    file.path = absl::StrCat(directory, "/", FileName(f, file_count));
    file.header = header.dump();
    file.header.append((8 - file.header.size() % 8) % 8, ' ');
    const uint64_t data_start = sizeof(uint64_t) + file.header.size();
    for (uint64_t i = first; i < last; ++i) model.objects[i].offset += data_start;
    file.bytes = data_start + data_bytes;
    model.file_bytes += file.bytes;
    model.files.push_back(std::move(file));
  }
  return model;
}

void EnsureHostLoadModel(const HostLoadModel& model) {
  const std::string stamp_path = absl::StrCat(model.directory, "/", kStampName);
  const std::string stamp = StampText(model);
  const std::optional<std::string> old_stamp = ReadSmallFile(stamp_path);
  if (old_stamp == stamp) return;
  if (::mkdir(model.directory.c_str(), 0755) != 0 && errno != EEXIST) {
    Die(PosixError("cannot create " + model.directory, errno).ToString());
  }
  for (const std::string& name : Check(ListDirectory(model.directory), "listing the model")) {
    if (!absl::EndsWith(name, ".safetensors")) continue;
    if (!old_stamp.has_value()) {
      Die(absl::StrCat(model.directory, " holds ", name,
                       " but no model this benchmark wrote: give --model-dir an empty or new "
                       "directory"));
    }
    ::unlink(absl::StrCat(model.directory, "/", name).c_str());
  }
  ::unlink(stamp_path.c_str());
  uint64_t seed = 1;
  for (size_t f = 0; f < model.files.size(); ++f) {
    const HostLoadFile& file = model.files[f];
    Progress(absl::StrCat("writing ", file.path, " (", FormatByteSize(file.bytes), ")"));
    WriteModelFile(file, file.bytes - sizeof(uint64_t) - file.header.size(), seed);
  }
  std::ofstream(stamp_path) << stamp;  // last: a model written halfway is written again
  if (ReadSmallFile(stamp_path) != stamp) Die("cannot write " + stamp_path);
}

size_t VerifyHostLoadObjects(const HostLoadModel& model,
                             const std::function<const uint8_t*(size_t)>& bytes_of, int threads) {
  std::vector<ScopedFd> fds;
  for (const HostLoadFile& file : model.files) {
    fds.emplace_back(::open(file.path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fds.back().get() < 0) Die(PosixError("cannot open " + file.path, errno).ToString());
  }
  std::atomic<size_t> next{0};
  FirstError first_error;
  auto verify = [&] {
    std::vector<uint8_t> expected(kIoBytes);
    for (size_t i = next++; i < model.objects.size(); i = next++) {
      const HostLoadObject& object = model.objects[i];
      const uint8_t* actual = bytes_of(i);
      for (uint64_t done = 0; done < object.bytes;) {
        const uint64_t n = std::min(kIoBytes, object.bytes - done);
        const ssize_t got = ::pread(fds[object.file].get(), expected.data(), n,
                                    static_cast<off_t>(object.offset + done));
        std::string error;
        if (got != static_cast<ssize_t>(n)) {
          error = absl::StrCat("cannot read ", object.name, " back from ",
                               model.files[object.file].path);
        } else if (std::memcmp(expected.data(), actual + done, n) != 0) {
          const auto [file_byte, loaded_byte] =
              std::mismatch(expected.data(), expected.data() + n, actual + done);
          error = absl::StrCat(object.name, ": the loaded bytes differ from the file's at offset ",
                               done + (file_byte - expected.data()), " (",
                               static_cast<int>(*loaded_byte), " against ",
                               static_cast<int>(*file_byte), ")");
        }
        if (!error.empty()) {
          first_error.Note(std::move(error));
          next = model.objects.size();
          return;
        }
        done += n;
      }
    }
  };
  std::vector<std::thread> workers;
  for (int t = 0; t < std::max(1, threads); ++t) workers.emplace_back(verify);
  for (std::thread& worker : workers) worker.join();
  first_error.DieIfAny("verification failed");
  return model.objects.size();
}

}  // namespace tierd::bench
