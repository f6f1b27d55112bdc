#include "server/node/node_homes.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tierd {
namespace {

std::vector<std::string> Sockets(int n) {
  std::vector<std::string> sockets;
  for (int i = 0; i < n; ++i) sockets.push_back(absl::StrCat("/run/tierd/gpu", i, ".sock"));
  return sockets;
}

TEST(NodeHomesTest, EveryDaemonComputesTheSameHomes) {
  const std::vector<std::string> sockets = Sockets(4);
  // Each daemon is told the node in its own way: all of it, or the others only, in any order.
  const NodeHomes first(sockets, sockets[0]);
  const NodeHomes second({sockets[3], sockets[0], sockets[2]}, sockets[1]);
  const NodeHomes third({sockets[1], sockets[1], sockets[0], sockets[3]}, sockets[2]);
  EXPECT_EQ(first.members(), second.members());
  EXPECT_EQ(first.members(), third.members());
  for (int i = 0; i < 1000; ++i) {
    const std::string key = absl::StrCat("llama/layers.", i);
    EXPECT_EQ(first.HomeOf(key), second.HomeOf(key)) << key;
    EXPECT_EQ(first.HomeOf(key), third.HomeOf(key)) << key;
  }
  EXPECT_TRUE(first.IsHomedHere("m/x") == (first.HomeOf("m/x") == sockets[0]));
}

TEST(NodeHomesTest, HomesSpreadEvenly) {
  const std::vector<std::string> sockets = Sockets(8);
  const NodeHomes homes(sockets, sockets[0]);
  std::map<std::string, int> count;
  constexpr int kKeys = 16000;
  for (int i = 0; i < kKeys; ++i) ++count[homes.HomeOf(absl::StrCat("model/object-", i))];
  ASSERT_EQ(count.size(), sockets.size());
  for (const auto& [socket, n] : count) {
    // 2000 expected each; a binomial's standard deviation here is about 42.
    EXPECT_GT(n, 1750) << socket;
    EXPECT_LT(n, 2250) << socket;
  }
}

TEST(NodeHomesTest, ADaemonLeavingMovesOnlyItsOwnKeys) {
  const std::vector<std::string> sockets = Sockets(5);
  const NodeHomes all(sockets, sockets[0]);
  const NodeHomes without_last({sockets[0], sockets[1], sockets[2], sockets[3]}, sockets[0]);
  int moved = 0;
  for (int i = 0; i < 5000; ++i) {
    const std::string key = absl::StrCat("m/", i);
    if (all.HomeOf(key) == sockets[4]) {
      ++moved;
      continue;
    }
    EXPECT_EQ(all.HomeOf(key), without_last.HomeOf(key)) << key;
  }
  EXPECT_GT(moved, 800);  // about a fifth had their home there
  EXPECT_LT(moved, 1200);
}

TEST(NodeHomesTest, ADaemonAloneIsEveryObjectsHome) {
  const NodeHomes alone({}, "/run/tierd/gpu0.sock");
  EXPECT_EQ(alone.members().size(), 1u);
  EXPECT_TRUE(alone.IsHomedHere("m/a"));
  EXPECT_EQ(alone.HomeOf("m/b"), "/run/tierd/gpu0.sock");
}

}  // namespace
}  // namespace tierd
