#include "gpu/retained_sets.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "gpu/detail/retained_record.h"
#include "gpu/gpu_tier.h"

namespace tierd {
namespace {

bool IsModelTarget(const std::string& target) { return target.find('/') == std::string::npos; }

}  // namespace

absl::Status CheckRetainTarget(const std::string& target, const std::string& field) {
  if (target.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  if (target.size() > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is longer than 1024 bytes"));
  }
  for (unsigned char c : target) {
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(field, " holds a control character"));
    }
  }
  if (target.front() == '/' || target.find("//") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " '", target, "' is not MODEL, NAMESPACE/ or NAMESPACE/KEY"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RetainedSets>> RetainedSets::Create(GpuTier& tier,
                                                                   const Catalog& catalog,
                                                                   Options options) {
  ClientLimits limits;
  limits.max_leases = 0;
  limits.max_staging_bytes = options.budget_bytes;
  limits.done_events = 0;
  limits.daemons_own = true;
  ASSIGN_OR_RETURN(const ClientId client, tier.OpenClient(limits));
  return std::unique_ptr<RetainedSets>(
      new RetainedSets(tier, catalog, std::move(options), client));
}

RetainedSets::RetainedSets(GpuTier& tier, const Catalog& catalog, Options options, ClientId client)
    : tier_(tier), catalog_(catalog), options_(std::move(options)), client_(client) {
  sweeper_ = std::make_unique<PeriodicThread>(options_.sweep_period, [this] { Sweep(absl::Now()); });
}

RetainedSets::~RetainedSets() {
  sweeper_.reset();
  liveness_->MarkGone();
  // What still waits is answered: the tier (the daemon) is going.
  std::vector<Answer> pending;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [target, set] : sets_) {
      for (Answer& done : set.waiting) pending.push_back(std::move(done));
      for (Answer& done : set.sleeping) pending.push_back(std::move(done));
      set.waiting.clear();
      set.sleeping.clear();
    }
  }
  for (Answer& done : pending) {
    std::move(done)(absl::UnavailableError("the daemon is shutting down"));
  }
  tier_.CloseClient(client_);
}

absl::Status RetainedSets::Expand(const std::string& target, std::vector<std::string>& keys,
                                  uint64_t& bytes) const {
  keys.clear();
  bytes = 0;
  if (IsModelTarget(target)) {
    ASSIGN_OR_RETURN(std::shared_ptr<const ModelInfo> model, catalog_.GetModel(target));
    for (const ObjectInfo& object : model->objects) {
      keys.push_back(absl::StrCat(target, "/", object.name));
      bytes += RoundUp(object.size, kStagingAlignment);  // what it takes in staging
    }
    if (keys.empty()) return absl::NotFoundError(absl::StrCat("model ", target, " has no objects"));
    return absl::OkStatus();
  }
  if (target.back() == '/') {
    keys = tier_.StoredKeysUnder(target);
    if (keys.empty()) {
      return absl::NotFoundError(absl::StrCat("no stored object under ", target));
    }
  } else {
    keys.push_back(target);
  }
  for (const std::string& key : keys) {
    ASSIGN_OR_RETURN(const uint64_t size, tier_.ObjectSize(key));
    bytes += RoundUp(size, kStagingAlignment);  // what it takes in staging
  }
  return absl::OkStatus();
}

absl::Status RetainedSets::BudgetAllowsLocked(const std::string& target, uint64_t bytes) const {
  if (committed_bytes_ + bytes <= options_.budget_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "retaining ", target, " takes ", FormatByteSize(bytes), " of the GPU; this group's retained "
      "sets hold ", FormatByteSize(committed_bytes_), " of its ", FormatByteSize(options_.budget_bytes),
      " budget (--retain-bytes, or a client group's fourth field): release or put to sleep a set "
      "(tierctl retained, unretain, sleep) or raise the budget"));
}

void RetainedSets::Retain(const std::string& target, absl::Duration ttl, Answer done) {
  if (absl::Status valid = CheckRetainTarget(target, "retain.target"); !valid.ok()) {
    return std::move(done)(valid);
  }
  if (ttl < absl::ZeroDuration() || ttl > kMaxTtl) {
    return std::move(done)(
        absl::InvalidArgumentError("retain.ttl must be from 0 (no time to live) to a year"));
  }
  std::vector<std::string> keys;
  uint64_t bytes = 0;
  if (absl::Status expanded = Expand(target, keys, bytes); !expanded.ok()) {
    return std::move(done)(expanded);
  }
  std::optional<absl::StatusOr<RetainedSetInfo>> answer_now;  // answered after the lock
  {
    absl::MutexLock lock(&mu_);
    if (auto it = sets_.find(target); it != sets_.end()) {
      Set& set = it->second;
      if (set.state == State::kAsleep) {
        answer_now = absl::FailedPreconditionError(
            absl::StrCat(target, " is asleep: wake it to have it on the GPU again"));
      } else {
        set.ttl = ttl;
        RecordLocked();
        if (set.state == State::kLoading) {
          set.waiting.push_back(std::move(done));
          return;
        }
        answer_now = InfoLocked(target, set, absl::Now());
      }
    } else if (absl::Status budget = BudgetAllowsLocked(target, bytes); !budget.ok()) {
      answer_now = budget;
    } else if (sets_.size() >= kMaxSets) {
      answer_now = absl::ResourceExhaustedError(absl::StrCat(
          "this group has ", kMaxSets, " retained sets already: release one, or retain a prefix "
          "(NAMESPACE/) or a model instead of its objects one by one"));
    } else {
      Set& set = sets_[target];
      set.keys = keys;
      set.bytes = bytes;
      set.ttl = ttl;
      set.state = State::kLoading;
      set.waiting.push_back(std::move(done));
      committed_bytes_ += bytes;
    }
  }
  if (answer_now.has_value()) return std::move(done)(*std::move(answer_now));
  PinAll(std::move(keys), [this, target](absl::Status status) {
    LoadEnded(target, /*failed_state=*/State::kLoading, std::move(status));
  });
}

void RetainedSets::PinAll(std::vector<std::string> keys,
                          absl::AnyInvocable<void(absl::Status) &&> done) {
  struct Progress {
    absl::Mutex mu;
    size_t left ABSL_GUARDED_BY(mu) = 0;
    std::vector<std::string> pinned ABSL_GUARDED_BY(mu);
    absl::Status first_error ABSL_GUARDED_BY(mu);
    absl::AnyInvocable<void(absl::Status) &&> done;
  };
  if (keys.empty()) return std::move(done)(absl::OkStatus());
  auto progress = std::make_shared<Progress>();
  progress->done = std::move(done);
  {
    absl::MutexLock lock(&progress->mu);
    progress->left = keys.size();
  }
  for (const std::string& key : keys) {
    // A load may complete after this is gone (the tier waits for its copies after destroying
    // it): the answer then goes nowhere, and the destructor has answered the requests.
    tier_.Pin(client_, key, [this, liveness = liveness_, progress, key](absl::Status status) {
      liveness->RunIfAlive([&] {
        std::vector<std::string> to_unpin;
        absl::Status result;
        {
          absl::MutexLock lock(&progress->mu);
          if (status.ok()) {
            progress->pinned.push_back(key);
          } else if (progress->first_error.ok()) {
            progress->first_error =
                absl::Status(status.code(), absl::StrCat(key, ": ", status.message()));
          }
          if (--progress->left > 0) return;
          result = progress->first_error;
          if (!result.ok()) to_unpin = std::move(progress->pinned);
        }
        UnpinKeys(to_unpin);
        std::move(progress->done)(std::move(result));
      });
    });
  }
}

void RetainedSets::UnpinKeys(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    if (absl::Status unpinned = tier_.Unpin(client_, key); !unpinned.ok()) {
      TIERD_LOG(WARNING) << "retained sets: unpinning " << key << ": " << unpinned;
    }
  }
}

void RetainedSets::LoadEnded(const std::string& target, State failed_state, absl::Status status) {
  std::vector<Answer> waiting;
  absl::StatusOr<RetainedSetInfo> answer = absl::UnknownError("unanswered");
  {
    absl::MutexLock lock(&mu_);
    auto it = sets_.find(target);
    if (it == sets_.end()) return;  // REQUIRES-wise impossible: a loading set is not removed
    Set& set = it->second;
    waiting = std::move(set.waiting);
    set.waiting.clear();
    const absl::Time now = absl::Now();
    for (const auto& [key, range] : set.placements) tier_.ForgetPreferredPlacement(key);
    if (status.ok()) {
      set.state = State::kAwake;
      set.since = now;
      set.moved = 0;
      for (const auto& [key, range] : set.placements) {
        std::optional<GpuObjectUse> use = tier_.ObjectUse(key);
        if (!use.has_value() || use->range.slab != range.slab ||
            use->range.offset != range.offset) {
          ++set.moved;
        }
      }
      set.placements.clear();
      answer = InfoLocked(target, set, now);
      RecordLocked();
    } else {
      answer = status;
      committed_bytes_ -= set.bytes;
      if (failed_state == State::kAsleep) {
        set.state = State::kAsleep;  // keeps its placements for the next wake
      } else {
        sets_.erase(it);
        RecordLocked();
      }
    }
  }
  for (Answer& done : waiting) std::move(done)(answer);
}

absl::Status RetainedSets::Release(const std::string& target) {
  std::vector<std::string> to_unpin;
  std::vector<Answer> sleeping;
  RetainedSetInfo info;
  {
    absl::MutexLock lock(&mu_);
    auto it = sets_.find(target);
    if (it == sets_.end()) {
      return absl::NotFoundError(absl::StrCat(target, " is not retained"));
    }
    if (it->second.state == State::kLoading) {
      return absl::FailedPreconditionError(
          absl::StrCat(target, " is being loaded; release it once that is answered"));
    }
    if (it->second.state == State::kAwake) {
      to_unpin = it->second.keys;
      committed_bytes_ -= it->second.bytes;
    }
    // A sleep still waiting for copies is answered: the set slept, then went.
    sleeping = std::move(it->second.sleeping);
    info = InfoLocked(target, it->second, absl::Now());
    sets_.erase(it);
    RecordLocked();
  }
  UnpinKeys(to_unpin);
  for (Answer& done : sleeping) std::move(done)(info);
  return absl::OkStatus();
}

void RetainedSets::Sleep(const std::string& target, Answer done) {
  std::optional<absl::StatusOr<RetainedSetInfo>> answer_now;  // answered after the lock
  std::vector<std::string> keys;
  RetainedSetInfo slept;
  {
    absl::MutexLock lock(&mu_);
    auto it = sets_.find(target);
    if (it == sets_.end()) {
      answer_now = absl::NotFoundError(absl::StrCat(target, " is not retained"));
    } else if (it->second.state != State::kAwake) {
      answer_now = absl::FailedPreconditionError(absl::StrCat(
          target, it->second.state == State::kAsleep ? " is asleep already" : " is being loaded"));
    } else {
      Set& set = it->second;
      std::map<std::string, StagingRange> placements;
      for (const std::string& key : set.keys) {
        std::optional<GpuObjectUse> use = tier_.ObjectUse(key);
        if (!use.has_value()) continue;
        if (use->leases > 0 && !answer_now.has_value()) {
          answer_now = absl::FailedPreconditionError(absl::StrCat(
              target, " cannot sleep: ", key, " is leased (", use->leases,
              " lease(s)); release the leases of every process using it first"));
        }
        placements[key] = use->range;
      }
      if (!answer_now.has_value()) {
        // Asleep from now on: no other call on the set interleaves with the unpinning below.
        set.placements = std::move(placements);
        set.state = State::kAsleep;
        set.since = absl::Now();
        committed_bytes_ -= set.bytes;
        keys = set.keys;
        slept = InfoLocked(target, set, set.since);
        RecordLocked();
      }
    }
  }
  if (answer_now.has_value()) return std::move(done)(*std::move(answer_now));
  // Outside the lock: an unpin lets waiting loads go on, whose answers (on this thread) take it.
  // A lease granted from now on keeps its object on the GPU until it is released; the pool's
  // eviction order then takes it.
  UnpinKeys(keys);
  std::vector<std::string> leaving = EvictFromGpu(keys);
  {
    absl::MutexLock lock(&mu_);
    auto it = sets_.find(target);
    if (!leaving.empty() && it != sets_.end() && it->second.state == State::kAsleep) {
      it->second.leaving = std::move(leaving);
      it->second.slept = slept;
      it->second.sleeping.push_back(std::move(done));
      return;
    }
  }
  std::move(done)(slept);
}

std::vector<std::string> RetainedSets::EvictFromGpu(const std::vector<std::string>& keys) {
  std::vector<std::string> again;
  for (const std::string& key : keys) {
    absl::StatusOr<EvictResult> evicted = tier_.Evict(key, EvictTier::kGpu);
    if (evicted.ok() || absl::IsNotFound(evicted.status())) continue;
    // Pinned (another set holds it), leased (it leaves once released) or its copy in flight.
    std::optional<GpuObjectUse> use = tier_.ObjectUse(key);
    if (use.has_value() && use->copying && use->pins == 0 && use->leases == 0) {
      again.push_back(key);
    }
  }
  return again;
}

void RetainedSets::Wake(const std::string& target, Answer done) {
  std::vector<std::string> keys;
  std::optional<absl::StatusOr<RetainedSetInfo>> answer_now;  // answered after the lock
  {
    absl::MutexLock lock(&mu_);
    auto it = sets_.find(target);
    if (it == sets_.end()) {
      answer_now = absl::NotFoundError(absl::StrCat(target, " is not retained"));
    } else if (it->second.state == State::kAwake) {
      answer_now = InfoLocked(target, it->second, absl::Now());
    } else if (it->second.state == State::kLoading) {
      it->second.waiting.push_back(std::move(done));
      return;
    } else if (absl::Status budget = BudgetAllowsLocked(target, it->second.bytes); !budget.ok()) {
      answer_now = budget;
    } else {
      Set& set = it->second;
      // A sleep still waiting for copies to complete is over: its set is asleep, and the sweep
      // answers it (with the set as it fell asleep).
      set.leaving.clear();
      for (const auto& [key, range] : set.placements) {
        if (range.size > 0) tier_.PreferPlacement(key, range);
      }
      set.state = State::kLoading;
      set.waiting.push_back(std::move(done));
      committed_bytes_ += set.bytes;
      keys = set.keys;
    }
  }
  if (answer_now.has_value()) return std::move(done)(*std::move(answer_now));
  PinAll(std::move(keys), [this, target](absl::Status status) {
    LoadEnded(target, /*failed_state=*/State::kAsleep, std::move(status));
  });
}

std::vector<RetainedSetInfo> RetainedSets::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<RetainedSetInfo> infos;
  const absl::Time now = absl::Now();
  for (const auto& [target, set] : sets_) infos.push_back(InfoLocked(target, set, now));
  return infos;
}

RetainedSetsStats RetainedSets::stats() const {
  absl::MutexLock lock(&mu_);
  RetainedSetsStats stats;
  stats.sets = sets_.size();
  for (const auto& [target, set] : sets_) stats.asleep += set.state == State::kAsleep ? 1 : 0;
  stats.bytes = committed_bytes_;
  stats.budget_bytes = options_.budget_bytes;
  stats.expired = expired_;
  return stats;
}

RetainedSetInfo RetainedSets::InfoLocked(const std::string& target, const Set& set,
                                         absl::Time now) const {
  RetainedSetInfo info;
  info.target = target;
  info.objects = set.keys.size();
  info.bytes = set.bytes;
  info.ttl = set.ttl;
  info.asleep = set.state == State::kAsleep;
  info.moved = set.moved;
  absl::Time last = set.since;
  if (set.state == State::kAwake) {
    for (const std::string& key : set.keys) {
      std::optional<GpuObjectUse> use = tier_.ObjectUse(key);
      if (!use.has_value()) continue;
      if (use->leases > 0) {
        last = now;
        break;
      }
      last = std::max(last, use->last_released);
    }
  }
  info.idle = std::max(absl::ZeroDuration(), now - last);
  return info;
}

void RetainedSets::Sweep(absl::Time now) {
  std::map<std::string, std::vector<std::string>> leaving;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [target, set] : sets_) {
      // A set woken while falling asleep has nothing leaving, but its sleeps are still owed.
      if (!set.leaving.empty() || !set.sleeping.empty()) leaving[target] = set.leaving;
    }
  }
  for (auto& [target, keys] : leaving) keys = EvictFromGpu(keys);
  std::vector<std::string> to_unpin;
  std::vector<std::pair<Answer, RetainedSetInfo>> answers;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [target, keys] : leaving) {
      auto it = sets_.find(target);
      if (it == sets_.end()) continue;  // released: its sleeps were answered then
      Set& set = it->second;
      // Woken meanwhile (leaving cleared): what was evicted now is loaded again by the wake.
      set.leaving = set.leaving.empty() ? std::vector<std::string>{} : std::move(keys);
      if (set.leaving.empty()) {
        for (Answer& done : set.sleeping) answers.emplace_back(std::move(done), set.slept);
        set.sleeping.clear();
      }
    }
    if (now - last_expiry_check_ >= absl::Seconds(1)) {
      last_expiry_check_ = now;
      to_unpin = ExpireLocked(now);
    }
  }
  UnpinKeys(to_unpin);
  for (auto& [done, info] : answers) std::move(done)(std::move(info));
}

std::vector<std::string> RetainedSets::ExpireLocked(absl::Time now) {
  std::vector<std::string> to_unpin;
  bool changed = false;
  for (auto it = sets_.begin(); it != sets_.end();) {
    const std::string& target = it->first;
    Set& set = it->second;
    std::string why;
    if (set.state == State::kAwake) {
      // A set whose objects changed under it (a model dropped or registered again, a stored
      // object replaced) pins an older version nobody can fetch: it goes.
      for (const std::string& key : set.keys) {
        std::optional<GpuObjectUse> use = tier_.ObjectUse(key);
        if (!use.has_value() || use->pins == 0) {
          why = absl::StrCat(key, " changed or is gone");
          break;
        }
      }
    }
    if (why.empty() && set.state != State::kLoading && set.sleeping.empty() &&
        set.ttl > absl::ZeroDuration() && InfoLocked(target, set, now).idle >= set.ttl) {
      why = absl::StrCat("idle past its time to live of ", absl::FormatDuration(set.ttl));
      ++expired_;
    }
    if (why.empty() || set.state == State::kLoading || !set.sleeping.empty()) {
      ++it;
      continue;
    }
    TIERD_LOG(INFO) << "retained set " << target << " released: " << why;
    if (set.state == State::kAwake) {
      to_unpin.insert(to_unpin.end(), set.keys.begin(), set.keys.end());
      committed_bytes_ -= set.bytes;
    }
    it = sets_.erase(it);
    changed = true;
  }
  if (changed) RecordLocked();
  return to_unpin;
}

void RetainedSets::RecordLocked() const {
  if (options_.state_file.empty()) return;
  std::vector<RecordedSet> sets;
  for (const auto& [target, set] : sets_) {
    sets.push_back({set.ttl, set.state == State::kAsleep, set.keys.size(), target});
  }
  if (absl::Status written = WriteRetainedRecord(options_.state_file, sets); !written.ok()) {
    TIERD_LOG_EVERY_N_SEC(WARNING, 10)
        << "retained sets: cannot record them in " << options_.state_file << ": " << written
        << " (they are kept, but would not come back after a restart)";
  }
}

void RetainedSets::Restore() {
  if (options_.state_file.empty()) return;
  std::vector<RecordedSet> recorded =
      ReadRetainedRecord(options_.state_file, kMaxTtl, kMaxSets, [](const std::string& target) {
        return CheckRetainTarget(target, "target").ok();
      });
  for (RecordedSet& set : recorded) {
    // A set comes back whole or not at all: stored objects that did not survive the restart (not
    // durable) would make it partial.
    std::vector<std::string> keys;
    uint64_t bytes = 0;
    if (absl::Status expanded = Expand(set.target, keys, bytes); !expanded.ok()) {
      TIERD_LOG(WARNING) << "retained set " << set.target << " is gone: " << expanded;
      continue;
    }
    if (keys.size() != set.objects) {
      TIERD_LOG(WARNING) << "retained set " << set.target << " is not retained again: "
                         << keys.size() << " of its " << set.objects
                         << " objects are there after the restart";
      continue;
    }
    if (set.asleep) {
      absl::MutexLock lock(&mu_);
      Set& asleep = sets_[set.target];
      asleep.keys = std::move(keys);
      asleep.bytes = bytes;
      asleep.ttl = set.ttl;
      asleep.state = State::kAsleep;
      asleep.since = absl::Now();
      continue;
    }
    const std::string target = set.target;
    Retain(target, set.ttl, [target](absl::StatusOr<RetainedSetInfo> retained) {
      if (retained.ok()) {
        TIERD_LOG(INFO) << "retained set " << target << " is back on the GPU ("
                        << FormatByteSize(retained->bytes) << ")";
      } else {
        TIERD_LOG(WARNING) << "retained set " << target << " could not be retained again: "
                           << retained.status();
      }
    });
  }
  absl::MutexLock lock(&mu_);
  RecordLocked();
}

}  // namespace tierd
