#include "bench/node_worker.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/bench_model.h"
#include "bench/bench_support.h"
#include "client/tierd_client.h"
#include "device/shared_memory.h"
#include "storage/model/shard.h"

namespace tierd::bench {
namespace {

// One worker's client, session and reference buffers; requests come one at a time.
class NodeWorker {
 public:
  ~NodeWorker() { Disconnect(); }

  nlohmann::json Handle(const nlohmann::json& request) {
    const std::string op = request.value("op", "");
    absl::StatusOr<nlohmann::json> answer = absl::InvalidArgumentError("unknown op " + op);
    if (op == "connect") {
      answer = Connect(request.value("socket", ""), request.value("model", ""));
    } else if (session_ == nullptr && op != "disconnect") {
      answer = absl::FailedPreconditionError(op + " before connect");
    } else if (op == "load") {
      answer = Load(request.value("shard", nlohmann::json()));
    } else if (op == "evict_gpu") {
      answer = Empty(EvictWaiting(*session_, model_ + "/", tierd::v1::TIER_GPU));
    } else if (op == "map_reference") {
      answer = Empty(MapReference(request.value("shm", "")));
    } else if (op == "copy_reference") {
      answer = CopyReference();
    } else if (op == "disconnect") {
      Disconnect();
      answer = nlohmann::json::object();
    }
    if (!answer.ok()) return {{"error", answer.status().ToString()}};
    (*answer)["error"] = "";
    return *answer;
  }

 private:
  static absl::StatusOr<nlohmann::json> Empty(const absl::Status& status) {
    if (!status.ok()) return status;
    return nlohmann::json::object();
  }

  absl::StatusOr<nlohmann::json> Connect(const std::string& socket, const std::string& model) {
    Disconnect();
    tierd::ClientOptions options;
    options.socket_path = socket;
    options.client_name = "node_bench";
    options.call_timeout = absl::Minutes(10);
    absl::StatusOr<std::unique_ptr<tierd::Client>> client = tierd::Client::Connect(options);
    if (!client.ok()) return client.status();
    client_ = *std::move(client);
    absl::StatusOr<std::vector<tierd::v1::ObjectInfo>> listed = client_->ListObjects(model);
    if (!listed.ok()) return listed.status();
    absl::StatusOr<std::unique_ptr<tierd::Session>> session = client_->OpenSession();
    if (!session.ok()) return session.status();
    session_ = *std::move(session);
    absl::StatusOr<std::unique_ptr<tierd::Stream>> stream =
        session_->device().CreateStream(tierd::StreamPriority::kHigh);
    if (!stream.ok()) return stream.status();
    stream_ = *std::move(stream);
    model_ = model;
    objects_.clear();
    shapes_.clear();
    for (const tierd::v1::ObjectInfo& info : *listed) {
      objects_.push_back({info.key(), info.size()});
      shapes_.emplace_back();
      if (info.tensors_size() == 1) {
        shapes_.back().assign(info.tensors(0).shape().begin(), info.tensors(0).shape().end());
      }
    }
    if (objects_.empty()) return absl::NotFoundError(model + " has no objects");
    return nlohmann::json{{"device", session_->info().device()},
                          {"transport", session_->transport()},
                          {"objects", objects_.size()},
                          {"bytes", TotalBytes(objects_)}};
  }

  // `shard`: null, or {dim, index, count}.
  absl::StatusOr<nlohmann::json> Load(const nlohmann::json& shard) {
    std::vector<Object> objects = objects_;
    if (shard.is_object()) {
      absl::StatusOr<std::vector<Object>> shards =
          Shards(shard.value("dim", 0u), shard.value("index", 0u), shard.value("count", 1u));
      if (!shards.ok()) return shards.status();
      objects = *std::move(shards);
    }
    const double start = MonotonicSeconds();
    absl::StatusOr<double> seconds =
        FetchAndWait(*session_, *stream_, objects, /*prefetch_first=*/true);
    if (!seconds.ok()) return seconds.status();
    return nlohmann::json{
        {"start_s", start}, {"end_s", start + *seconds}, {"bytes", TotalBytes(objects)}};
  }

  // Each object's shard and its size (U8 tensors: a byte per element).
  absl::StatusOr<std::vector<Object>> Shards(uint32_t dim, uint32_t index, uint32_t count) const {
    std::vector<Object> shards;
    for (size_t i = 0; i < objects_.size(); ++i) {
      const std::vector<uint64_t>& shape = shapes_[i];
      if (dim >= shape.size() || count == 0 || index >= count || shape[dim] < count) {
        return absl::InvalidArgumentError(
            absl::StrCat(objects_[i].key, " (", shape.size(), " dimensions) has no shard ", dim,
                         ":", index, "/", count, "; write the model with --row-bytes"));
      }
      uint64_t bytes = objects_[i].size / shape[dim];
      bytes *= ShardRows(shape[dim], index, count).second;
      shards.push_back({ShardKey(objects_[i].key, dim, index, count), bytes});
    }
    return shards;
  }

  absl::Status MapReference(const std::string& name) {
    DropReference();
    absl::StatusOr<std::unique_ptr<tierd::SharedMemory>> shared = tierd::SharedMemory::Open(name);
    if (!shared.ok()) return shared.status();
    if ((*shared)->size() < TotalBytes(objects_)) {
      return absl::InvalidArgumentError(name + " is smaller than the model");
    }
    tierd::Device& device = session_->device();
    if (absl::Status status = device.RegisterHostMemory((*shared)->data(), (*shared)->size());
        !status.ok()) {
      return status;
    }
    shared_ = *std::move(shared);
    uint64_t largest = 0;
    for (const Object& object : objects_) largest = std::max(largest, object.size);
    absl::StatusOr<std::unique_ptr<tierd::Slab>> target = device.AllocateSlab(2 * largest);
    if (!target.ok()) return target.status();
    target_ = *std::move(target);
    absl::StatusOr<std::unique_ptr<tierd::Stream>> stream =
        device.CreateStream(tierd::StreamPriority::kHigh);
    if (!stream.ok()) return stream.status();
    copy_stream_ = *std::move(stream);
    return absl::OkStatus();
  }

  // The objects' bytes from where they lie in the shared buffer, into two halves of the target in
  // turn (as staging holds distinct objects), back to back on one stream.
  absl::StatusOr<nlohmann::json> CopyReference() {
    if (shared_ == nullptr) return absl::FailedPreconditionError("copy_reference before map");
    tierd::Device& device = session_->device();
    const uint8_t* source = static_cast<const uint8_t*>(shared_->data());
    uint8_t* target = static_cast<uint8_t*>(target_->data());
    const uint64_t half = target_->size() / 2;
    const double start = MonotonicSeconds();
    uint64_t offset = 0;
    for (size_t i = 0; i < objects_.size(); ++i) {
      absl::Status status = device.CopyAsync(*copy_stream_, target + (i % 2) * half,
                                             source + offset, objects_[i].size);
      if (!status.ok()) return status;
      offset += objects_[i].size;
    }
    if (absl::Status status = device.SynchronizeStream(*copy_stream_); !status.ok()) return status;
    return nlohmann::json{
        {"start_s", start}, {"end_s", MonotonicSeconds()}, {"bytes", TotalBytes(objects_)}};
  }

  void DropReference() {
    copy_stream_.reset();
    target_.reset();
    if (shared_ != nullptr) {
      absl::Status status = session_->device().UnregisterHostMemory(shared_->data());
      if (!status.ok()) Progress("unregistering the reference buffer: " + status.ToString());
      shared_.reset();
    }
  }

  void Disconnect() {
    if (session_ != nullptr) DropReference();
    stream_.reset();
    session_.reset();
    client_.reset();
  }

  std::unique_ptr<tierd::Client> client_;
  std::unique_ptr<tierd::Session> session_;
  std::unique_ptr<tierd::Stream> stream_;
  std::string model_;
  std::vector<Object> objects_;
  std::vector<std::vector<uint64_t>> shapes_;  // of each object's one tensor; empty for several
  std::unique_ptr<tierd::SharedMemory> shared_;
  std::unique_ptr<tierd::Slab> target_;
  std::unique_ptr<tierd::Stream> copy_stream_;
};

}  // namespace

int RunNodeWorker(int index, WorkerChannel& channel) {
  NodeWorker worker;
  for (;;) {
    absl::StatusOr<std::string> message = channel.Receive(absl::InfiniteFuture());
    if (!message.ok()) return 0;  // the parent is done
    nlohmann::json request = nlohmann::json::parse(*message, nullptr, /*allow_exceptions=*/false);
    nlohmann::json answer = request.is_object()
                                ? worker.Handle(request)
                                : nlohmann::json{{"error", "a request that is no JSON object"}};
    answer["worker"] = index;
    if (!channel.Send(answer.dump()).ok()) return 0;
  }
}

NodeClients::NodeClients(int count, absl::Duration timeout)
    : processes_(Check(WorkerProcesses::Start(count, RunNodeWorker), "starting the clients")),
      timeout_(timeout) {}

NodeClients::~NodeClients() {
  for (const WorkerExit& exit : processes_->Reap(absl::Now() + absl::Seconds(30))) {
    if (!exit.clean) Progress("a client process " + exit.how);
  }
}

std::vector<nlohmann::json> NodeClients::Ask(const std::vector<int>& workers,
                                             const nlohmann::json& request) {
  return AskEach(workers, std::vector<nlohmann::json>(workers.size(), request));
}

std::vector<nlohmann::json> NodeClients::AskEach(const std::vector<int>& workers,
                                                 const std::vector<nlohmann::json>& requests) {
  std::vector<std::string> messages;
  for (const nlohmann::json& request : requests) messages.push_back(request.dump());
  for (size_t i = 0; i < workers.size(); ++i) {
    Check(processes_->Send(workers[i], messages[i]),
          absl::StrCat("client ", workers[i], ": sending ", requests[i].value("op", "?")));
  }
  std::map<int, absl::StatusOr<std::string>> received =
      processes_->ReceiveFromEach(workers, absl::Now() + timeout_);
  std::vector<nlohmann::json> answers;
  for (size_t i = 0; i < workers.size(); ++i) {
    const std::string what =
        absl::StrCat("client ", workers[i], ": ", requests[i].value("op", "?"));
    const std::string& message = Check(received.at(workers[i]), what);
    nlohmann::json answer = nlohmann::json::parse(message, nullptr, /*allow_exceptions=*/false);
    if (!answer.is_object()) Die(what + ": an answer that is no JSON object");
    if (!answer.value("error", "").empty()) Die(what + ": " + answer["error"].get<std::string>());
    answers.push_back(std::move(answer));
  }
  return answers;
}

std::vector<int> FirstWorkers(int count) {
  std::vector<int> workers;
  for (int i = 0; i < count; ++i) workers.push_back(i);
  return workers;
}

}  // namespace tierd::bench
