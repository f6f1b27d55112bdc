// The tierd.v1 API end to end (api_test's second half): each failure's status, sessions driven with
// raw protocol messages, models dropped and registered again, and tierctl.
#include "tests/system/api_test_fixture.h"
#include "wire/wire_format.h"

namespace tierd {
namespace api_test {
namespace {

// A session driven with raw protocol messages, for the errors the C++ client never provokes.
class RawSession {
 public:
  explicit RawSession(Client& client) : stream_(client.stub().Session(&context_)) {
    v1::SessionRequest open;
    open.mutable_open()->set_client_name("raw");
    open.mutable_open()->set_protocol(SessionProtocolVersion());
    EXPECT_EQ(Call(open).code(), 0);
  }
  ~RawSession() {
    stream_->WritesDone();
    (void)stream_->Finish();
  }
  v1::SessionResponse Call(v1::SessionRequest request) {
    request.set_request_id(++next_id_);
    EXPECT_TRUE(stream_->Write(request));
    v1::SessionResponse response;
    EXPECT_TRUE(stream_->Read(&response));
    EXPECT_EQ(response.request_id(), request.request_id());
    return response;
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> stream_;
  uint64_t next_id_ = 0;
};

// Lease ids belong to their session: another session naming the same id releases nothing of the
// first one's.
TEST_F(ApiTest, ASessionCannotReleaseAnotherSessionsLease) {
  RawSession owner(*client_);
  v1::SessionRequest fetch;
  fetch.mutable_fetch()->set_key(Key(0));
  const v1::SessionResponse leased = owner.Call(fetch);
  ASSERT_EQ(leased.code(), 0) << leased.message();
  const uint64_t lease_id = leased.lease().lease_id();
  RawSession intruder(*client_);
  v1::SessionRequest release;
  release.mutable_release()->set_lease_id(lease_id);
  const v1::SessionResponse refused = intruder.Call(release);
  EXPECT_EQ(refused.code(), static_cast<int>(absl::StatusCode::kNotFound)) << refused.message();
  EXPECT_EQ(Stats().leases(), 1u);  // still the owner's
  const v1::SessionResponse released = owner.Call(release);
  EXPECT_EQ(released.code(), 0) << released.message();
  EXPECT_TRUE(WaitForStats([](const v1::Stats& s) { return s.leases() == 0; }, kTimeout));
}

TEST_F(ApiTest, EachFailureHasItsPreciseStatus) {
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  // NOT_FOUND: unknown keys and models.
  EXPECT_THAT((*session)->Fetch("m/blocks.99"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT((*session)->Fetch("nope/x"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(client_->ListObjects("nope"), StatusIs(absl::StatusCode::kNotFound));
  // INVALID_ARGUMENT: malformed keys and requests, with the field named.
  auto malformed = (*session)->Fetch("no-slash");
  EXPECT_THAT(malformed, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(malformed.status().message()), HasSubstr("fetch.key"));
  std::string bytes(1024, 'x');
  StoreRequest bad;
  bad.key = "acts/bad";
  bad.data = bytes.data();
  bad.size = bytes.size();
  v1::TensorInfo tensor;
  tensor.set_name("t");
  tensor.set_dtype("F77");
  bad.tensors.push_back(tensor);
  absl::Status bad_store = (*session)->StoreAsync(bad);
  EXPECT_THAT(bad_store, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(bad_store.message()), HasSubstr("reserve.tensors[0]"));
  bad.tensors.clear();
  bad.key = "m/taken";  // a registered model's namespace
  EXPECT_THAT((*session)->StoreAsync(bad), StatusIs(absl::StatusCode::kInvalidArgument));
  // RESOURCE_EXHAUSTED: the session's lease quota (3), then the pool (four objects).
  std::vector<Lease> held;
  for (int block = 0; block < 3; ++block) {
    auto lease = (*session)->Fetch(Key(block));
    ASSERT_THAT(lease, IsOk());
    held.push_back(*std::move(lease));
  }
  EXPECT_THAT((*session)->Fetch(Key(3)), StatusIs(absl::StatusCode::kResourceExhausted));
  auto other = client_->OpenSession();
  ASSERT_THAT(other, IsOk());
  auto fourth = (*other)->Fetch(Key(3));
  ASSERT_THAT(fourth, IsOk());
  EXPECT_THAT((*other)->Fetch(Key(4)), StatusIs(absl::StatusCode::kResourceExhausted));
  held.clear();
  // The releases went out quiet, unanswered; a call on the same session is answered only after the
  // daemon took them, so the fetch below, on another connection, waits for their buffers instead
  // of finding the pool full.
  ASSERT_THAT((*session)->Prefetch({}), IsOk());
  // FAILED_PRECONDITION: releasing twice, committing what was not reserved, unpinning what was
  // not pinned.
  {
    RawSession raw(*client_);
    v1::SessionRequest fetch;
    fetch.mutable_fetch()->set_key(Key(5));
    v1::SessionResponse leased = raw.Call(fetch);
    ASSERT_EQ(leased.code(), 0) << leased.message();
    v1::SessionRequest release;
    release.mutable_release()->set_lease_id(leased.lease().lease_id());
    EXPECT_EQ(raw.Call(release).code(), 0);
    EXPECT_EQ(raw.Call(release).code(), Code(absl::StatusCode::kFailedPrecondition));
    release.mutable_release()->set_lease_id(12345);
    EXPECT_EQ(raw.Call(release).code(), Code(absl::StatusCode::kNotFound));
    v1::SessionRequest commit;
    commit.mutable_commit()->set_reservation_id(7);
    EXPECT_EQ(raw.Call(commit).code(), Code(absl::StatusCode::kFailedPrecondition));
    v1::SessionRequest unpin;
    unpin.mutable_unpin()->set_key(Key(5));
    EXPECT_EQ(raw.Call(unpin).code(), Code(absl::StatusCode::kFailedPrecondition));
    v1::SessionRequest empty;
    EXPECT_EQ(raw.Call(empty).code(), Code(absl::StatusCode::kInvalidArgument));
  }
  // DATA_LOSS: a byte changed on disk behind the daemon's back (same size and mtime).
  fourth->Release();
  ASSERT_THAT(EvictOnceFree(Key(6), v1::TIER_ALL), IsOk());
  {
    auto lease = (*session)->Fetch(Key(6));  // the first read records the checksum
    ASSERT_THAT(lease, IsOk());
  }
  // Every lease is released by now; wait for the releases to drain and the copy to finish.
  ASSERT_TRUE(WaitForStats(
      [](const v1::Stats& s) { return s.leases() == 0 && s.copies_in_flight() == 0; }, kTimeout));
  ASSERT_THAT(EvictOnceFree(Key(6), v1::TIER_ALL), IsOk());
  const std::string file = absl::StrCat(model_dir("model"), "/model.safetensors");
  struct stat before;
  ASSERT_EQ(::stat(file.c_str(), &before), 0);
  const int fd = ::open(file.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  // Block 6's first tensor starts 12 tensors of 256 KiB into the data.
  const off_t header_and_more = before.st_size - (kBlocks * 2 - 12) * kRows * kCols * 4 + 100;
  ASSERT_EQ(::pwrite(fd, "\xff\xfe", 2, header_and_more), 2);
  ::close(fd);
  const struct timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
  EXPECT_THAT((*session)->Fetch(Key(6)), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_GE(Stats().checksum_failures(), 1u);
  // UNAVAILABLE: the daemon is shutting down.
  daemon_->Signal(SIGTERM);
  EXPECT_THAT(daemon_->Wait(kTimeout), ::tierd::testing::IsOkAndHolds(0));
  daemon_.reset();
  EXPECT_THAT((*session)->Fetch(Key(0)), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(client_->OpenSession(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(ApiTest, ADroppedAndReRegisteredModelNeverServesItsOldBytes) {
  auto session = client_->OpenSession();
  ASSERT_THAT(session, IsOk());
  {
    auto lease = (*session)->Fetch(Key(0));
    ASSERT_THAT(lease, IsOk());
    ExpectTensorsMatch(**session, *lease);
  }
  ASSERT_THAT(client_->DropModel("m"), IsOk());
  EXPECT_THAT((*session)->Fetch(Key(0)), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_THAT(WriteModel("model2", /*seed=*/2), IsOk());
  ASSERT_THAT(client_->RegisterModel("m", model_dir("model2"), v1::GROUPING_BLOCK), IsOk());
  auto lease = (*session)->Fetch(Key(0));
  ASSERT_THAT(lease, IsOk());
  ExpectTensorsMatch(**session, *lease);  // expected_ now holds the second model's bytes
}

TEST_F(ApiTest, TierctlCommandsWorkAndFailWithTheStatusName) {
  auto loaded = Tierctl({"load", "p", model_dir("model"), "--group=tensor"});
  EXPECT_EQ(loaded.exit_code, 0) << loaded.output;
  EXPECT_THAT(loaded.output, HasSubstr("16 tensors"));
  EXPECT_THAT(Tierctl({"ls"}).output, HasSubstr("p "));
  EXPECT_THAT(Tierctl({"ls", "m"}).output, HasSubstr("m/blocks.7"));
  EXPECT_EQ(Tierctl({"prefetch", Key(1), Key(2)}).exit_code, 0);

  const std::string out = absl::StrCat(dir_.path(), "/out.bin");
  EXPECT_EQ(Tierctl({"get", "p/blocks.3.ffn.up.weight", "-o", out}).exit_code, 0);
  EXPECT_EQ(testing::ReadWholeFile(out), expected_["blocks.3.ffn.up.weight"]);

  const std::string in = absl::StrCat(dir_.path(), "/in.bin");
  ASSERT_THAT(testing::WriteFile(in, "stored through tierctl"), IsOk());
  EXPECT_EQ(Tierctl({"put", "acts/t", in}).exit_code, 0);
  EXPECT_EQ(Tierctl({"evict", "acts/t", "--tier=host"}).exit_code, 0);
  EXPECT_EQ(Tierctl({"get", "acts/t", "-o", out}).exit_code, 0);
  EXPECT_EQ(testing::ReadWholeFile(out), "stored through tierctl");

  auto stats = Tierctl({"stats", "--json"});
  ASSERT_EQ(stats.exit_code, 0);
  nlohmann::json json = nlohmann::json::parse(stats.output);
  EXPECT_EQ(json["models"], 2);
  EXPECT_GE(json["bytes_host_to_gpu"].get<uint64_t>(), kRows * kCols * 4);

  // The status name goes to stderr.
  auto missing = RunProgram({"/bin/sh", "-c",
                             absl::StrCat(SiblingBinary("tierctl"), " --socket=", socket_path(),
                                          " get m/blocks.42 -o ", out, " 2>&1")},
                            kTimeout);
  ASSERT_THAT(missing, IsOk());
  EXPECT_EQ(missing->exit_code, 1);
  EXPECT_THAT(missing->output, HasSubstr("NOT_FOUND"));
  EXPECT_EQ(Tierctl({"frobnicate"}).exit_code, 2);
}

// A key holds whatever bytes a tensor's name does. tierctl ls shows every key whole, control
// characters escaped as --json escapes them, rather than stopping at a NUL or letting a name
// drive the terminal (ESC).
TEST_F(ApiTest, TierctlLsEscapesKeysAsJsonDoes) {
  const std::string odd = model_dir("odd");
  ASSERT_EQ(::mkdir(odd.c_str(), 0755), 0);
  const std::string nul_name("w\0hidden", 8);
  ASSERT_THAT(testing::WriteSafetensors(absl::StrCat(odd, "/model.safetensors"),
                                        {RandomTensor(nul_name, "F32", {2, 2}, 1),
                                         RandomTensor("clear\x1b[2J", "F32", {2, 2}, 2),
                                         RandomTensor("back\\slash", "F32", {2, 2}, 3)}),
              IsOk());
  auto loaded = Tierctl({"load", "odd", odd, "--group=tensor"});
  ASSERT_EQ(loaded.exit_code, 0) << loaded.output;

  auto listed = Tierctl({"ls", "odd"});
  EXPECT_EQ(listed.exit_code, 0);
  EXPECT_THAT(listed.output, HasSubstr("odd/w\\u0000hidden "));
  EXPECT_THAT(listed.output, HasSubstr("odd/clear\\u001b[2J "));
  EXPECT_THAT(listed.output, HasSubstr("odd/back\\\\slash "));
  EXPECT_THAT(listed.output, HasSubstr("3 objects"));
  EXPECT_EQ(listed.output.find('\0'), std::string::npos);
  EXPECT_EQ(listed.output.find('\x1b'), std::string::npos);

  // --json carries the same keys, escaped by JSON itself.
  auto json = Tierctl({"--json", "ls", "odd"});
  ASSERT_EQ(json.exit_code, 0);
  const nlohmann::json listing = nlohmann::json::parse(json.output);
  std::vector<std::string> keys;
  for (const auto& object : listing["objects"]) {
    keys.push_back(object["key"].get<std::string>());
  }
  EXPECT_THAT(keys, ::testing::UnorderedElementsAre(absl::StrCat("odd/", nul_name),
                                                    "odd/clear\x1b[2J", "odd/back\\slash"));
}

}  // namespace
}  // namespace api_test
}  // namespace tierd
