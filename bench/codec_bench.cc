// codec_bench: the exponent-codebook codec alone — ratio, CPU encode and decode rates, GPU decode
// rate by launch size, and host→GPU delivery of compressed objects against cudaMemcpyAsync of the
// raw bytes, in one run on one device.
//
//   codec_bench --device=cuda:0 --sizes=16MiB,256MiB,700MiB --pieces=64KiB,1MiB,16MiB,0
//               --repeat=20 --json=out.json
//
// Data: normal weights N(0, 0.02²) rounded to bf16 and to fp16 (as transformers initialises linear
// layers; no real checkpoint is read), the same quantised to FP8 e4m3 and e5m2 with a scale per
// block of 128 × 128 (rows of 8192; as DeepSeek-V3's and Qwen3's FP8 checkpoints are made), and
// random bytes (the incompressible case). For each data
// set and size it reports the plan (layout, code width, ratio), the CPU encoder's and decoder's
// rates (one thread), and on the device:
//   raw_copy_gbps      cudaMemcpyAsync of the raw bytes, pinned host → device (the reference)
//   decode_gbps        decoding on the device alone, output bytes per second, for each --pieces
//                      launch size (0: the whole object in one launch)
//   serial_gbps        copy the compressed bytes, then decode, on one stream: raw bytes delivered
//                      per second
//   pipelined_gbps     objects back to back, copied on one stream into two alternating slots
//                      and decoded on a second stream, each object's copy cut in pieces (each of
//                      --pipeline-pieces; 0: whole) decoded as they land — how the daemon's
//                      prefetches run
// Every decoded object is compared with its raw bytes once, and every verdict checked.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_support.h"
#include "codec/exponent_codec.h"
#include "testing/sample_weights.h"
#include "common/byte_size.h"
#include "common/command_line.h"
#include "device/device_factory.h"
#include "device/pinned_host_buffer.h"

ABSL_FLAG(std::string, device, "auto", "Device to decode on: auto, host or cuda:N");
ABSL_FLAG(std::string, sizes, "16MiB,256MiB,700MiB", "Object sizes, comma-separated");
ABSL_FLAG(std::string, pieces, "64KiB,1MiB,16MiB,0",
          "Decode launch sizes in output bytes, comma-separated; 0 is the whole object");
ABSL_FLAG(std::string, pipeline_pieces, "1MiB,4MiB,16MiB,0",
          "Output bytes per piece of the pipelined copy and decode, comma-separated");
ABSL_FLAG(std::string, data, "bf16,fp16,e4m3,e5m2,random",
          "Data sets, comma-separated: bf16, fp16, e4m3, e5m2, random");
ABSL_FLAG(int, repeat, 20, "Timed repetitions of each device measurement");
ABSL_FLAG(std::string, json, "", "Write the results here as JSON");

namespace {

using tierd::bench::Check;
using tierd::bench::Clock;
using tierd::bench::Die;
using tierd::bench::SecondsSince;

std::vector<uint64_t> ParseSizes(const std::string& flag, const std::string& text) {
  std::vector<uint64_t> sizes;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    sizes.push_back(Check(tierd::ParseByteSize(part), "--" + flag));
  }
  if (sizes.empty()) Die("--" + flag + " names nothing");
  return sizes;
}

std::vector<uint8_t> MakeData(const std::string& kind, uint64_t bytes) {
  std::vector<uint8_t> data(bytes);
  if (kind == "random") {
    std::mt19937_64 engine(5);
    for (uint64_t i = 0; i + 8 <= bytes; i += 8) {
      const uint64_t word = engine();
      std::memcpy(&data[i], &word, 8);
    }
    return data;
  }
  if (kind == "e4m3" || kind == "e5m2") {
    constexpr uint64_t kCols = 8192, kBlock = 128;
    const uint64_t rows = (bytes + kCols - 1) / kCols;
    std::vector<uint8_t> matrix(rows * kCols);
    std::vector<float> scales(((rows + kBlock - 1) / kBlock) * (kCols / kBlock));
    tierd::codec::FillBlockScaledFp8Weights(
        kind == "e4m3" ? tierd::codec::Fp8Format::kE4m3 : tierd::codec::Fp8Format::kE5m2, 0.02,
        17, rows, kCols, kBlock, matrix.data(), scales.data());
    std::memcpy(data.data(), matrix.data(), bytes);
    return data;
  }
  const auto layout =
      kind == "fp16" ? tierd::codec::WordLayout::kFp16 : tierd::codec::WordLayout::kBf16;
  if (kind != "bf16" && kind != "fp16") Die("--data: unknown data set " + kind);
  tierd::codec::FillNormalWeights(layout, 0.02, 17, reinterpret_cast<uint16_t*>(data.data()),
                                  bytes / 2);
  return data;
}

double Gbps(uint64_t bytes, double seconds) { return bytes / seconds / 1e9; }

// Device-side measurements of one compressed object.
class DeviceRun {
 public:
  DeviceRun(tierd::Device& device, const std::vector<uint8_t>& raw,
            const std::vector<uint8_t>& encoded, const tierd::codec::CompressedLayout& layout)
      : device_(device), raw_(raw), encoded_(encoded), layout_(layout) {
    copy_stream_ = Check(device.CreateStream(tierd::StreamPriority::kNormal), "stream");
    decode_stream_ = Check(device.CreateStream(tierd::StreamPriority::kNormal), "stream");
    landed_ = Check(device.CreateEvent(), "event");
    host_raw_ = Check(tierd::PinnedHostBuffer::Create(device, raw.size()), "pinned");
    host_encoded_ = Check(tierd::PinnedHostBuffer::Create(device, encoded.size()), "pinned");
    verdict_buffer_ = Check(tierd::PinnedHostBuffer::Create(device, 4096), "pinned");
    verdict_ = static_cast<uint32_t*>(verdict_buffer_->data());
    slab_raw_ = Check(device.AllocateSlab(raw.size()), "slab");
    for (int slot = 0; slot < 2; ++slot) {
      slab_encoded_[slot] = Check(device.AllocateSlab(encoded.size()), "slab");
      decoded_[slot] = Check(device.CreateEvent(), "event");
    }
    std::memcpy(host_raw_->data(), raw.data(), raw.size());
    std::memcpy(host_encoded_->data(), encoded.data(), encoded.size());
  }

  double RawCopyGbps(int repeat) {
    return Timed(repeat, raw_.size(), [&] {
      Check(device_.CopyAsync(*copy_stream_, slab_raw_->data(), host_raw_->data(), raw_.size()),
            "copy");
    });
  }

  double DecodeGbps(int repeat, uint64_t piece_bytes) {
    CopyEncoded(*copy_stream_, 0, encoded_.size());
    Sync(*copy_stream_);
    const uint64_t tiles_per_launch = TilesPer(piece_bytes);
    const double gbps = Timed(repeat, raw_.size(), [&] {
      for (uint64_t first = 0; first < layout_.tiles; first += tiles_per_launch) {
        Decode(*copy_stream_, first, std::min(tiles_per_launch, layout_.tiles - first));
      }
    });
    CheckDecoded();
    return gbps;
  }

  double SerialGbps(int repeat) {
    const double gbps = Timed(repeat, raw_.size(), [&] {
      CopyEncoded(*copy_stream_, 0, encoded_.size());
      Decode(*copy_stream_, 0, layout_.tiles);
    });
    CheckDecoded();
    return gbps;
  }

  double PipelinedGbps(int repeat, uint64_t piece_bytes) {
    const uint64_t tiles_per_piece = TilesPer(piece_bytes);
    // Objects back to back through two slots: object i's copy waits only for the decode of object
    // i - 2 (which read the same slot), so one object's decode overlaps the next one's copy.
    int iteration = 0;
    const double gbps = Timed(repeat, raw_.size(), [&] {
      const int slot = iteration++ % 2;
      Check(device_.WaitEvent(*copy_stream_, *decoded_[slot]), "wait");
      CopyEncoded(*copy_stream_, 0, layout_.data_offset, slot);
      for (uint64_t first = 0; first < layout_.tiles; first += tiles_per_piece) {
        const uint64_t count = std::min(tiles_per_piece, layout_.tiles - first);
        CopyEncoded(*copy_stream_, layout_.data_offset + first * layout_.tile_bytes,
                    count * layout_.tile_bytes, slot);
        Check(device_.RecordEvent(*landed_, *copy_stream_), "record");
        Check(device_.WaitEvent(*decode_stream_, *landed_), "wait");
        Decode(*decode_stream_, first, count, slot);
      }
      Check(device_.RecordEvent(*decoded_[slot], *decode_stream_), "record");
    });
    CheckDecoded();
    return gbps;
  }

 private:
  uint64_t TilesPer(uint64_t piece_bytes) const {
    if (piece_bytes == 0) return layout_.tiles;
    return std::max<uint64_t>(1, piece_bytes / (2 * tierd::codec::kTileWords));
  }
  void CopyEncoded(tierd::Stream& stream, uint64_t offset, uint64_t bytes, int slot = 0) {
    Check(device_.CopyAsync(stream, static_cast<uint8_t*>(slab_encoded_[slot]->data()) + offset,
                            static_cast<uint8_t*>(host_encoded_->data()) + offset, bytes),
          "copy");
  }
  void Decode(tierd::Stream& stream, uint64_t first, uint64_t count, int slot = 0) {
    const auto* encoded = static_cast<const uint8_t*>(slab_encoded_[slot]->data());
    Check(device_.DecodeAsync(stream, layout_,
                              tierd::codec::TablesInPrefix(layout_, encoded, first),
                              tierd::codec::TileData(layout_, encoded, first), slab_raw_->data(),
                              first, count, verdict_),
          "decode");
  }
  void Sync(tierd::Stream& stream) { Check(device_.SynchronizeStream(stream), "synchronize"); }

  // Runs `enqueue` once to warm up, then `repeat` times back to back; raw bytes per second.
  template <typename F>
  double Timed(int repeat, uint64_t bytes, F enqueue) {
    *verdict_ = 0;
    enqueue();
    Sync(*copy_stream_);
    Sync(*decode_stream_);
    const Clock::time_point start = Clock::now();
    for (int i = 0; i < repeat; ++i) enqueue();
    Sync(*copy_stream_);
    Sync(*decode_stream_);
    const double seconds = SecondsSince(start);
    if (*verdict_ != 0) Die("the decoder found a tile that does not match its checksum");
    return Gbps(bytes * repeat, seconds);
  }

  void CheckDecoded() {
    Check(device_.CopyAsync(*copy_stream_, host_raw_->data(), slab_raw_->data(), raw_.size()),
          "copy back");
    Sync(*copy_stream_);
    if (std::memcmp(host_raw_->data(), raw_.data(), raw_.size()) != 0) {
      Die("the device decoded other bytes than the object's");
    }
  }

  tierd::Device& device_;
  const std::vector<uint8_t>& raw_;
  const std::vector<uint8_t>& encoded_;
  const tierd::codec::CompressedLayout layout_;
  std::unique_ptr<tierd::Stream> copy_stream_;
  std::unique_ptr<tierd::Stream> decode_stream_;
  std::unique_ptr<tierd::Event> landed_;
  std::unique_ptr<tierd::PinnedHostBuffer> host_raw_;
  std::unique_ptr<tierd::PinnedHostBuffer> host_encoded_;
  std::unique_ptr<tierd::PinnedHostBuffer> verdict_buffer_;
  uint32_t* verdict_ = nullptr;
  std::unique_ptr<tierd::Slab> slab_raw_;
  std::unique_ptr<tierd::Slab> slab_encoded_[2];
  std::unique_ptr<tierd::Event> decoded_[2];  // the last decode from each slot
};

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Measures the exponent-codebook codec alone; see bench/README.md");
  if (absl::StatusOr<std::vector<std::string>> parsed =
          tierd::ParseFlagsAndArguments(argc, argv, {__FILE__, {}});
      !parsed.ok()) {
    std::fprintf(stderr, "codec_bench: %s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  const std::vector<uint64_t> sizes = ParseSizes("sizes", absl::GetFlag(FLAGS_sizes));
  const std::vector<uint64_t> pieces = ParseSizes("pieces", absl::GetFlag(FLAGS_pieces));
  const std::vector<uint64_t> pipeline_pieces =
      ParseSizes("pipeline_pieces", absl::GetFlag(FLAGS_pipeline_pieces));
  const int repeat = absl::GetFlag(FLAGS_repeat);
  if (repeat < 1) Die("--repeat must be at least 1");
  std::unique_ptr<tierd::Device> device = Check(
      tierd::CreateDevice(Check(tierd::ParseDeviceSpec(absl::GetFlag(FLAGS_device)), "--device")),
      "device");

  nlohmann::json runs = nlohmann::json::array();
  for (absl::string_view kind_view : absl::StrSplit(absl::GetFlag(FLAGS_data), ',')) {
    const std::string kind(kind_view);
    for (const uint64_t size : sizes) {
      const std::vector<uint8_t> raw = MakeData(kind, size);
      nlohmann::json run = {{"data", kind}, {"raw_bytes", size}};
      Clock::time_point start = Clock::now();
      const tierd::codec::EncodingPlan plan = tierd::codec::PlanEncoding(raw.data(), raw.size());
      const double plan_s = SecondsSince(start);
      run["plan_gbps"] = Gbps(size, plan_s);
      run["compressed"] = plan.compress;
      run["ratio"] = plan.ratio();
      if (!plan.compress) {
        run["kept_raw_because"] = plan.reason;
        tierd::bench::Progress(absl::StrFormat("%s %s: kept raw (%s)", kind,
                                               tierd::FormatByteSize(size), plan.reason));
        runs.push_back(run);
        continue;
      }
      run["layout"] = tierd::codec::WordLayoutName(plan.layout);
      run["code_bits"] = plan.code_bits;
      run["escapes_per_word"] = static_cast<double>(plan.escapes) / (size / 2);
      std::vector<uint8_t> encoded(plan.encoded_bytes);
      start = Clock::now();
      Check(tierd::codec::Encode(raw.data(), raw.size(), plan, encoded.data()), "encode");
      run["cpu_encode_gbps"] = Gbps(size, SecondsSince(start));
      const tierd::codec::CompressedLayout layout =
          Check(tierd::codec::ParseCompressed(encoded.data(), encoded.size()), "parse");
      std::vector<uint8_t> decoded(size);
      start = Clock::now();
      Check(tierd::codec::Decode(layout, encoded.data(), decoded.data()), "decode");
      run["cpu_decode_gbps"] = Gbps(size, SecondsSince(start));
      if (decoded != raw) Die("the CPU decoder gave other bytes");

      DeviceRun device_run(*device, raw, encoded, layout);
      run["raw_copy_gbps"] = device_run.RawCopyGbps(repeat);
      nlohmann::json decode = nlohmann::json::object();
      for (const uint64_t piece : pieces) {
        decode[piece == 0 ? "whole" : tierd::FormatByteSize(piece)] =
            device_run.DecodeGbps(repeat, piece);
      }
      run["decode_gbps"] = decode;
      run["serial_gbps"] = device_run.SerialGbps(repeat);
      nlohmann::json pipelined = nlohmann::json::object();
      double best_pipelined = 0;
      for (const uint64_t piece : pipeline_pieces) {
        const double gbps = device_run.PipelinedGbps(repeat, piece);
        pipelined[piece == 0 ? "whole" : tierd::FormatByteSize(piece)] = gbps;
        best_pipelined = std::max(best_pipelined, gbps);
      }
      run["pipelined_gbps"] = pipelined;
      const double raw_copy = run["raw_copy_gbps"].get<double>();
      run["serial_vs_raw_copy"] = run["serial_gbps"].get<double>() / raw_copy;
      run["best_pipelined_vs_raw_copy"] = best_pipelined / raw_copy;
      tierd::bench::Progress(absl::StrFormat(
          "%s %s: ratio %.3f (%d bits), raw copy %.1f GB/s, decode %.0f GB/s, copy+decode %.1f "
          "serial / %.1f best pipelined GB/s (%.2fx / %.2fx)",
          kind, tierd::FormatByteSize(size), plan.ratio(), plan.code_bits,
          run["raw_copy_gbps"].get<double>(), decode.back().get<double>(),
          run["serial_gbps"].get<double>(), best_pipelined, run["serial_vs_raw_copy"].get<double>(),
          run["best_pipelined_vs_raw_copy"].get<double>()));
      runs.push_back(run);
    }
  }
  const nlohmann::json report = {
      {"benchmark", "codec_bench"},
      {"date", tierd::bench::TodayUtc()},
      {"device", device->Describe()},
      {"repeat", repeat},
      {"data_source",
       "normal N(0, 0.02^2) rounded to bf16/fp16 (transformers' init), or quantised to FP8 "
       "e4m3/e5m2 with a scale per 128 x 128 block (rows of 8192); random bytes"},
      {"runs", runs},
  };
  std::printf("%s\n", report.dump(2).c_str());
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream(path) << report.dump(2) << "\n";
  }
  return 0;
}
