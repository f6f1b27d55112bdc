// Sends each read to the reader of its files: model files of an object store (ModelFile::object)
// to the RemoteReader, every other file to the DiskReader, with request ids of its own that say
// which reader has the request.
//
// Private to storage/ (the host cache's). Thread-safe.
#ifndef TIERD_STORAGE_DETAIL_READ_ROUTER_H_
#define TIERD_STORAGE_DETAIL_READ_ROUTER_H_

#include <cstdint>

#include "storage/disk_reader.h"
#include "storage/remote_reader.h"

namespace tierd {

class ReadRouter {
 public:
  using RequestId = uint64_t;

  // `remote` may be null: then a read of an s3:// path fails FAILED_PRECONDITION. Both must
  // outlive the router.
  ReadRouter(DiskReader& disk, RemoteReader* remote) : disk_(disk), remote_(remote) {}

  // As DiskReader::Submit. A request's targets are all local or all remote (INVALID_ARGUMENT in
  // `done` otherwise).
  RequestId Submit(ReadRequest request);
  bool Cancel(RequestId id);
  bool Reprioritize(RequestId id, ReadPriority priority, absl::Time deadline);

  DiskReader& disk() { return disk_; }
  RemoteReader* remote() { return remote_; }

 private:
  // The low bit says which reader has it.
  static RequestId Local(uint64_t id) { return id << 1; }
  static RequestId Remote(uint64_t id) { return (id << 1) | 1; }
  static bool IsRemote(RequestId id) { return (id & 1) != 0; }

  DiskReader& disk_;
  RemoteReader* const remote_;
};

}  // namespace tierd

#endif  // TIERD_STORAGE_DETAIL_READ_ROUTER_H_
