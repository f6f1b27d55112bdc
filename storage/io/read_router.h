// Sends each read to the reader of its files: model files of an object store (ModelFile::object)
// to the remote reader, every other file to the local one, with request ids of its own that say
// which reader has the request. It is itself a Reader: the host cache speaks one contract.
//
// What the host cache reads through (storage/host/host_cache.h). Thread-safe.
#ifndef TIERD_STORAGE_IO_READ_ROUTER_H_
#define TIERD_STORAGE_IO_READ_ROUTER_H_

#include <cstdint>

#include "storage/read_request.h"

namespace tierd {

class ReadRouter final : public Reader {
 public:
  // `remote` may be null: then a read of an object store's file fails FAILED_PRECONDITION. Both
  // must outlive the router.
  ReadRouter(Reader& local, Reader* remote) : local_(local), remote_(remote) {}

  // A request's targets are all local or all remote (INVALID_ARGUMENT in `done` otherwise).
  RequestId Submit(ReadRequest request) override;
  bool Cancel(RequestId id) override;
  bool Reprioritize(RequestId id, ReadPriority priority, absl::Time deadline) override;

 private:
  // The low bit says which reader has it.
  static RequestId Local(uint64_t id) { return id << 1; }
  static RequestId Remote(uint64_t id) { return (id << 1) | 1; }
  static bool IsRemote(RequestId id) { return (id & 1) != 0; }

  Reader& local_;
  Reader* const remote_;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_IO_READ_ROUTER_H_
