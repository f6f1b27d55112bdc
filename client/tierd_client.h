// The C++ client of tierd: the public surface model servers link against.
//
// A Client is a connection to one daemon (one GPU) over its Unix socket. It offers the unary calls
// a person or script would make (register, list, stats, evict, ...) and opens Sessions, which carry
// the data path: fetch, prefetch, store, pin. A Session opens the daemon's slab and event handles
// once, caches them, and hands out Leases: RAII views of a staging buffer that release themselves
// on destruction.
//
// The data never crosses the socket. Fetch makes the caller's stream wait on the lease's ready
// event (no CPU wait); releasing records the lease's done event on a stream after the last use, so
// the daemon does not overwrite the buffer before that work has finished.
//
// Thread-safety: Client and Session are thread-safe; several threads may fetch through one Session
// at once and their requests are pipelined. A Lease is used by one thread at a time.
#ifndef TIERD_CLIENT_TIERD_CLIENT_H_
#define TIERD_CLIENT_TIERD_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "device/device.h"
#include "tierd/v1/tierd.grpc.pb.h"

namespace tierd {

class Session;
class SessionCore;
struct SessionCommits;

// The key of a tensor-parallel shard of object `key`: part `index` of `count` of each of its
// tensors along dimension `dim`, as torch.tensor_split gives it ("MODEL/OBJECT@DIM:INDEX/COUNT").
// Fetch and prefetch it like any object: the daemon reads only its bytes from the files, and
// tensors without that dimension come whole. With `segments` (two or more: the sizes along `dim`
// of the segments a fused tensor stacks, such as q, k and v), each segment is split and the shard
// holds the rank's slice of each, together ("...@DIM:INDEX/COUNT:S1,S2,..."). See docs/SHARDS.md.
std::string ShardKey(const std::string& key, uint32_t dim, uint32_t index, uint32_t count,
                     const std::vector<uint32_t>& segments = {});

struct ClientOptions {
  std::string socket_path = "/run/tierd/gpu0.sock";
  // Shown in the daemon's logs and stats.
  std::string client_name;
  // Where sessions go: the daemon's session socket (tierd --session-socket), the fast path for
  // fetches. "default" is the daemon's default, beside socket_path; empty: the gRPC Session
  // stream. When nothing answers there, sessions use the gRPC stream.
  std::string session_socket_path = "default";
  // The client group (tierd --client-groups) this client's sessions belong to: they go to the
  // group's session socket beside socket_path (ClientGroupSocketPathFor) and nowhere else, and
  // see only the group's staging slabs and stored objects. Empty: the default group, over
  // session_socket_path. Unary calls (stats, models, evictions) always act on the default group.
  std::string client_group;
  // Deadline of each unary call; sessions have none.
  absl::Duration call_timeout = absl::Seconds(30);
  // On the session socket, a thread waiting for an answer polls for it without sleeping for up to
  // this long first (FrameReader in wire/session_socket.h): an answer that comes within it costs
  // no wake-up. Zero: it sleeps at once.
  absl::Duration session_busy_poll = absl::ZeroDuration();
  // The CUDA ordinal this process knows the daemon's GPU by; unset: the daemon's own. Set it where
  // this process sees GPUs numbered otherwise, e.g. in a container given only that GPU (0).
  std::optional<int> cuda_ordinal;
};

// A fetched object in a daemon staging buffer. Valid until released; its bytes do not change
// while it lives. Move-only.
class Lease {
 public:
  Lease() = default;
  Lease(Lease&& other) noexcept = default;
  Lease& operator=(Lease&& other) noexcept;
  // Releases with the stream the lease was fetched on.
  ~Lease();

  bool valid() const { return session_ != nullptr; }
  const std::string& key() const { return key_; }
  // Device address of the object's first byte in this process, and its size.
  void* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The tensors inside the object, offsets relative to data().
  const std::vector<v1::TensorInfo>& tensors() const { return tensors_; }

  // Records one of the session's done events on `stream` (after the work that reads the buffer)
  // and tells the daemon the buffer is free once that record completes. Does not wait for the
  // daemon's reply; a failure is logged. REQUIRES: valid(); `stream` comes from Session::device().
  void Release(Stream& stream);
  // Same, on the stream the lease was fetched on.
  void Release();

 private:
  friend class Session;
  std::shared_ptr<SessionCore> session_;
  uint64_t lease_id_ = 0;
  std::string key_;
  void* data_ = nullptr;
  uint64_t size_ = 0;
  std::vector<v1::TensorInfo> tensors_;
  Stream* stream_ = nullptr;
};

// What to store: bytes at `data` (device memory of Session::device(), e.g. a client buffer, or a
// registered host buffer), copied into staging on `stream`.
struct StoreRequest {
  std::string key;  // "NAMESPACE/NAME"; NAMESPACE must not be a registered model
  const void* data = nullptr;
  uint64_t size = 0;
  std::vector<v1::TensorInfo> tensors;  // optional index handed back on fetch
  bool spillable = true;
  // Survives a restart of the daemon: the commit (Flush) succeeds only once it is on disk.
  bool durable = false;
};

class Session {
 public:
  // Ends the session: the daemon releases whatever it still holds for it. Outstanding Leases
  // become invalid; release or destroy them first.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // The device the staging buffers belong to in this process: create the streams that use
  // leases from it.
  Device& device();
  // A stream of device(), owned by the session, for callers without one of their own.
  Stream& default_stream();
  const v1::SessionOpened& info() const;
  // How this session's messages travel: "socket" (the session socket) or "grpc".
  const char* transport() const;

  // Fetches `key` and makes `stream` wait for its bytes. Returns once the daemon has enqueued the
  // copy. Errors: the daemon's (NOT_FOUND, RESOURCE_EXHAUSTED, DATA_LOSS, ...), UNAVAILABLE when
  // the session has ended.
  absl::StatusOr<Lease> Fetch(const std::string& key, Stream& stream);
  absl::StatusOr<Lease> Fetch(const std::string& key);
  // One round trip for a step: releases `release` (as Lease::Release(stream) would, done events
  // recorded on `stream`) and fetches `keys`, all in one write to the daemon, and waits for the
  // answers together. The leases come in the order of `keys`, `stream` made to wait for each
  // one's bytes. When any fetch fails, the others' leases are released and the first failure is
  // returned, its message naming the key. Leases of another session are released the usual way.
  absl::StatusOr<std::vector<Lease>> FetchMany(const std::vector<std::string>& keys, Stream& stream,
                                               std::vector<Lease> release = {});

  // Starts bringing `keys` to the GPU without holding them (the seeds' begin_fetch_step). Errors
  // known at once (unknown key) are returned.
  absl::Status Prefetch(const std::vector<std::string>& keys, absl::Duration deadline = {});
  absl::Status BeginFetchStep(const std::vector<std::string>& keys) { return Prefetch(keys); }

  // Reserves a staging buffer, enqueues the copy of the bytes into it on `stream`, records the
  // written event there and sends the commit (the seeds' store_async). Returns once the commit is
  // sent, without waiting for the copy: the source must stay unchanged until `stream` has done it.
  // A later Fetch of the same key through this session waits for the commit first. Errors known
  // at once (bad key, no room) are returned; the commit's own outcome is reported by Flush().
  absl::Status StoreAsync(const StoreRequest& request, Stream& stream);
  absl::Status StoreAsync(const StoreRequest& request);
  // Waits until every commit sent so far is in the daemon's host tier; returns the first failure
  // since the last Flush.
  absl::Status Flush();

  // Keeps `key` resident on the GPU until Unpin or the session ends.
  absl::Status Pin(const std::string& key);
  absl::Status Unpin(const std::string& key);
  absl::StatusOr<v1::EvictResponse> Evict(const std::string& key_or_prefix, v1::Tier tier);

  // Retained sets (docs/CLIENTS.md, "Retained weights"): objects kept on the GPU beyond the
  // sessions that use them, in this session's client group. `target` is a model's name (every
  // object of it), "NAMESPACE/" (the stored objects under it) or one key. Retain answers once the
  // whole set is on the GPU; with a `ttl` the set is released once that long has passed since its
  // last lease ended. Errors: NOT_FOUND, RESOURCE_EXHAUSTED (past the group's --retain-bytes, or
  // the pool is full), FAILED_PRECONDITION (asleep), the loads' errors.
  absl::StatusOr<v1::RetainedSet> Retain(const std::string& target,
                                         absl::Duration ttl = absl::ZeroDuration());
  absl::Status Unretain(const std::string& target);
  // Gives the set's staging back to the pool (its bytes stay in the host tier).
  // FAILED_PRECONDITION while any process leases one of its objects.
  absl::StatusOr<v1::RetainedSet> Sleep(const std::string& target);
  // Brings a sleeping set back, each object where it was when that room is free
  // (RetainedSet.moved counts the others).
  absl::StatusOr<v1::RetainedSet> Wake(const std::string& target);
  absl::StatusOr<v1::RetainedSets> ListRetained();

 private:
  friend class Client;
  explicit Session(std::shared_ptr<SessionCore> core);
  // Waits until no commit of `key` sent through this session is in flight (read your own writes).
  void AwaitCommitsOf(const std::string& key);
  // The Lease a fetch's answer grants, `stream` made to wait for its bytes.
  absl::StatusOr<Lease> LeaseFrom(v1::SessionResponse& response, Stream& stream);
  std::shared_ptr<SessionCore> core_;
  std::shared_ptr<SessionCommits> commits_;
  v1::SessionOpened opened_;
  std::unique_ptr<Stream> default_stream_;
};

class Client {
 public:
  // Connects to the daemon at options.socket_path (without waiting for it: calls fail UNAVAILABLE
  // while it is not there).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Opens a data-path session. Errors: UNAVAILABLE when the daemon is not reachable.
  absl::StatusOr<std::unique_ptr<Session>> OpenSession();

  // Registers a model from `directory`, relative to this process's working directory or absolute
  // (the daemon is sent the absolute path); `progress` (optional) sees each progress message.
  // `verify`: the daemon reads every object now and records its checksum, so that even its first
  // read is checked (RegisterModelRequest.verify). No deadline: a large model on a cold disk takes
  // a while.
  absl::StatusOr<v1::ModelSummary> RegisterModel(
      const std::string& name, const std::string& directory, v1::Grouping grouping,
      const std::function<void(const v1::RegisterModelProgress&)>& progress = nullptr,
      bool verify = false);
  // The same with every field of the request the caller's, `derived` tensors among them
  // (docs/CLIENTS.md, "Checkpoint conversions"); its directory is made absolute as above. Past
  // `timeout` the call fails DEADLINE_EXCEEDED and the daemon stops the registration (nothing is
  // registered).
  absl::StatusOr<v1::ModelSummary> RegisterModel(
      v1::RegisterModelRequest request,
      const std::function<void(const v1::RegisterModelProgress&)>& progress = nullptr,
      absl::Duration timeout = absl::InfiniteDuration());
  absl::StatusOr<std::vector<v1::ModelSummary>> ListModels();
  absl::StatusOr<std::vector<v1::ObjectInfo>> ListObjects(const std::string& model);
  absl::Status DropModel(const std::string& name);
  absl::StatusOr<v1::PrefetchResponse> Prefetch(const std::vector<std::string>& keys,
                                                bool host_only = false);
  absl::StatusOr<v1::EvictResponse> Evict(const std::string& key_or_prefix, v1::Tier tier);
  absl::StatusOr<v1::Stats> GetStats();
  // Every object of `model` leased through `session` on `stream`, in the order ListObjects gives
  // them: the model's tensors as views of the daemon's staging, held until the leases go (mapped
  // parameters; with the model retained, a new process maps it without a copy).
  absl::StatusOr<std::vector<Lease>> MapModel(Session& session, const std::string& model,
                                              Stream& stream);

  // The generated stub, for calls this class does not wrap.
  v1::Tierd::Stub& stub() { return *stub_; }

 private:
  Client(ClientOptions options, std::unique_ptr<v1::Tierd::Stub> stub);
  void PrepareContext(grpc::ClientContext& context) const;
  // One unary call (a Stub method) with the client's deadline; gRPC errors become Status.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Unary(grpc::Status (v1::Tierd::Stub::*rpc)(grpc::ClientContext*,
                                                                      const Request&, Response*),
                                 const Request& request);
  // The device matching the daemon's backend, created on first use and shared by all sessions.
  absl::StatusOr<std::shared_ptr<Device>> DeviceFor(const v1::SessionOpened& opened);

  const ClientOptions options_;
  std::unique_ptr<v1::Tierd::Stub> stub_;
  absl::Mutex device_mu_;
  std::shared_ptr<Device> device_ ABSL_GUARDED_BY(device_mu_);
};

}  // namespace tierd

#endif  // TIERD_CLIENT_TIERD_CLIENT_H_
