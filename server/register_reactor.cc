#include "server/register_reactor.h"

#include <limits.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/quote.h"
#include "server/proto_convert.h"
#include "server/raw_call.h"
#include "storage/model_location.h"

namespace tierd {

RegisterReactor::RegisterReactor(Catalog& catalog, RegistrationQueue& queue,
                                 const grpc::ByteBuffer& raw, bool remote,
                                 std::function<void(const std::string& name)> registered,
                                 std::function<grpc::Status(const absl::Status&)> answer)
    : catalog_(catalog),
      queue_(queue),
      raw_(raw),  // shares the slices: no copy of the bytes
      request_bytes_(raw.Length()),
      remote_(remote),
      registered_(std::move(registered)),
      answer_(std::move(answer)) {
  queue_.Post(remote_, [this] { Run(); });
}

void RegisterReactor::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  writing_ = false;
  if (!ok) client_gone_ = true;
}

void RegisterReactor::Run() {
  absl::StatusOr<ModelSummary> summary = Register();
  if (!summary.ok()) {
    TIERD_LOG(WARNING) << "registering " << Quote(request_.name())
                       << " failed: " << summary.status();
    return Answer(summary.status());
  }
  TIERD_LOG(INFO) << "registered model " << summary->name << ": " << summary->objects
                  << " objects, " << summary->tensors << " tensors in " << summary->files
                  << " file(s)"
                  << (summary->derived_tensors > 0
                          ? absl::StrCat(", ", summary->derived_tensors,
                                         " of the tensors derived from the checkpoint's")
                          : "");
  registered_(summary->name);
  v1::RegisterModelProgress last;
  last.set_files_done(summary->files);
  last.set_files_total(summary->files);
  ToProto(*summary, last.mutable_summary());
  Write(last);
  Answer(absl::OkStatus());
}

absl::StatusOr<ModelSummary> RegisterReactor::Register() {
  if (queue_.shutting_down()) return absl::UnavailableError("tierd is shutting down");
  const auto gone = [this] { return cancelled_.load() || queue_.shutting_down(); };
  if (cancelled_) {
    return absl::CancelledError("the caller went away before its registration started");
  }
  const uint64_t memory = RegistrationQueue::EstimatedBytes(request_bytes_, remote_);
  if (!queue_.memory().Acquire(memory, gone)) {
    return queue_.shutting_down()
               ? absl::UnavailableError("tierd is shutting down")
               : absl::CancelledError("the caller went away while its registration waited");
  }
  HeldBytes held(queue_.memory(), memory);
  absl::Status parsed = ParseRequest(raw_, request_);
  raw_.Clear();
  if (!parsed.ok()) return parsed;
  if (absl::Status checked = Check(); !checked.ok()) return checked;
  absl::StatusOr<std::vector<DerivedTensorSpec>> derived = FromProto(request_.derived());
  // The specs hold what the request's derived tensors said: their messages go before the
  // registration's own peak.
  google::protobuf::RepeatedPtrField<v1::DerivedTensor>().Swap(request_.mutable_derived());
  if (!derived.ok()) return derived.status();
  const Grouping grouping = *FromProto(request_.grouping());
  TIERD_LOG(INFO) << "registering model " << request_.name() << " from "
                  << Quote(request_.directory()) << " (" << GroupingName(grouping)
                  << (request_.verify() ? ", verifying every object" : "")
                  << (request_.keep_raw() ? ", kept raw in host memory" : "") << ")";
  return catalog_.RegisterModel(
      request_.name(), request_.directory(), grouping, GroupingRules::Defaults(),
      [this](const RegistrationProgress& progress) {
        v1::RegisterModelProgress message;
        message.set_files_done(progress.files_done);
        message.set_files_total(progress.files_total);
        message.set_current_file(progress.current_file);
        message.set_bytes_verified(progress.bytes_verified);
        message.set_bytes_to_verify(progress.bytes_to_verify);
        Write(message);
      },
      request_.verify(), *derived, request_.keep_raw(), &cancelled_);
}

absl::Status RegisterReactor::Check() const {
  if (absl::Status name = ValidateModelName(request_.name()); !name.ok()) return name;
  if (absl::StatusOr<Grouping> grouping = FromProto(request_.grouping()); !grouping.ok()) {
    return grouping.status();
  }
  const std::string& directory = request_.directory();
  absl::StatusOr<ModelLocation> location = ParseModelLocation(directory);
  if (!location.ok()) return location.status();
  if (location->in_object_store()) {
    // A model in object storage: the catalog checks the roots.
  } else if (directory.empty() || directory.front() != '/') {
    // A relative path would be resolved against the daemon's working directory, not the
    // caller's; the client libraries send absolute ones.
    return absl::InvalidArgumentError(absl::StrCat(
        "register.directory must be an absolute path or an s3:// URL, not ", Quote(directory)));
  }
  if (directory.size() >= PATH_MAX || directory.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("register.directory ", Quote(directory),
                                                   " is not a path (longer than ", PATH_MAX - 1,
                                                   " bytes, or holding a NUL byte)"));
  }
  return absl::OkStatus();
}

void RegisterReactor::Write(const v1::RegisterModelProgress& message) {
  absl::MutexLock lock(&mu_);
  if (client_gone_ || cancelled_) return;
  if (absl::Status serialized = Serialize(message, message_); !serialized.ok()) {
    TIERD_LOG(WARNING) << "registration progress not sent: " << serialized;
    return;
  }
  writing_ = true;
  StartWrite(&message_);
  mu_.Await(absl::Condition(
      +[](bool* writing) { return !*writing; }, &writing_));
}

void RegisterReactor::Answer(const absl::Status& status) {
  queue_.Leave();
  Finish(answer_(status));  // `this` may be gone once it returns
}

}  // namespace tierd
