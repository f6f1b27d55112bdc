// Which daemon of a node is each model object's home (docs/NODE.md): rendezvous hashing — the
// member whose hash of (member, key) is highest. Every daemon configured with the same members
// (tierd --peers, which may or may not list the daemon itself) computes the same homes with no
// coordination; homes spread evenly over the members; and a member added or removed moves only
// the keys it gains or loses. Members are named by their gRPC socket paths. Immutable; thread-safe.
#ifndef TIERD_SERVER_NODE_NODE_HOMES_H_
#define TIERD_SERVER_NODE_NODE_HOMES_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tierd {

class NodeHomes {
 public:
  // `members`, with `self` added when missing; duplicates count once.
  NodeHomes(const std::vector<std::string>& members, std::string self);

  const std::string& HomeOf(absl::string_view key) const;
  bool IsHomedHere(absl::string_view key) const { return HomeOf(key) == self_; }
  const std::string& self() const { return self_; }
  // Sorted, each once, `self` among them.
  const std::vector<std::string>& members() const { return members_; }

 private:
  std::string self_;
  std::vector<std::string> members_;
};

}  // namespace tierd

#endif  // TIERD_SERVER_NODE_NODE_HOMES_H_
