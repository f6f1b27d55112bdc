// Teaches ThreadSanitizer Abseil's synchronization, for the TSan build (TIERD_SANITIZE=thread).
//
// Debian's Abseil is not built with TSan, so TSan does not see absl::Mutex lock or unlock: every
// access guarded by one would be reported as a race. This library, LD_PRELOADed into the tests
// (tests/run-sanitizers.sh), interposes the out-of-line entry points of absl::Mutex, CondVar and
// Notification, calls the real ones (RTLD_NEXT) and tells TSan about the happens-before edges
// they make: whatever a thread did before releasing a mutex happens before whatever the next
// holder does after acquiring it. That is all race detection needs; lock-order checking is not
// modelled. Code compiled here calls these through the PLT, as does gRPC, and Abseil itself for
// the mutex inside a Notification.
//
// Abseil evaluates a Condition with the mutex held, but not always on the waiting thread: the
// thread that unlocks evaluates its waiters' conditions. So every Condition handed to Abseil is
// wrapped in one that acquires before evaluating and releases after, as a critical section of its
// own. Abseil's deadlock detection is turned off: its graph is guarded by a lock TSan cannot see.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace {

#define TIERD_STRINGIFY_INNER(x) #x
#define TIERD_STRINGIFY(x) TIERD_STRINGIFY_INNER(x)

// The mangled name of absl::<inline namespace>::`rest`, e.g. "5Mutex4LockEv"; `konst` for a const
// member function.
std::string AbslSymbol(const char* rest, bool konst) {
  const std::string inline_namespace = TIERD_STRINGIFY(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  return std::string(konst ? "_ZNK4absl" : "_ZN4absl") + std::to_string(inline_namespace.size()) +
         inline_namespace + rest;
}

// The next definition of the symbol after this library's: Abseil's.
template <typename Function>
Function Next(const char* rest, bool konst = false) {
  const std::string name = AbslSymbol(rest, konst);
  void* symbol = dlsym(RTLD_NEXT, name.c_str());
  if (symbol == nullptr) {
    std::fprintf(stderr, "tsan absl annotations: %s not found\n", name.c_str());
    std::abort();
  }
  return reinterpret_cast<Function>(symbol);
}

// Notification::HasBeenNotified() is inline: an acquire load of the flag that follows the mutex.
// Releasing at the flag's address makes that load synchronise with Notify.
void* NotifiedFlag(absl::Notification* notification) {
  static_assert(sizeof(absl::Notification) == sizeof(absl::Mutex) + sizeof(void*),
                "absl::Notification is laid out as { Mutex mutex_; atomic<bool> notified_yet_; }");
  return reinterpret_cast<char*>(notification) + sizeof(absl::Mutex);
}

// A Condition evaluated as a critical section of `mu`'s (see the header comment).
struct AnnotatedCondition {
  AnnotatedCondition(absl::Mutex* mu, const absl::Condition& condition)
      : mu(mu), condition(condition), wrapped(&Eval, this) {}
  static bool Eval(AnnotatedCondition* self) {
    __tsan_acquire(self->mu);
    const bool met = self->condition.Eval();
    __tsan_release(self->mu);
    return met;
  }
  absl::Mutex* mu;
  const absl::Condition& condition;
  absl::Condition wrapped;
};

[[gnu::constructor]] void IgnoreDeadlockCycles() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static auto real = Next<void (*)(Mutex*)>("5Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::ReaderLock() {
  static auto real = Next<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}

bool Mutex::TryLock() {
  static auto real = Next<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

bool Mutex::ReaderTryLock() {
  static auto real = Next<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

void Mutex::Unlock() {
  static auto real = Next<void (*)(Mutex*)>("5Mutex6UnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::ReaderUnlock() {
  static auto real = Next<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::LockWhen(const Condition& condition) {
  static auto real = Next<void (*)(Mutex*, const Condition&)>("5Mutex8LockWhenERKNS0_9ConditionE");
  AnnotatedCondition annotated(this, condition);
  real(this, annotated.wrapped);
  __tsan_acquire(this);
}

void Mutex::ReaderLockWhen(const Condition& condition) {
  static auto real =
      Next<void (*)(Mutex*, const Condition&)>("5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  AnnotatedCondition annotated(this, condition);
  real(this, annotated.wrapped);
  __tsan_acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& condition, Duration timeout) {
  static auto real = Next<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  AnnotatedCondition annotated(this, condition);
  const bool met = real(this, annotated.wrapped, timeout);
  __tsan_acquire(this);  // held whether or not the condition became true
  return met;
}

bool Mutex::LockWhenWithDeadline(const Condition& condition, Time deadline) {
  static auto real = Next<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AnnotatedCondition annotated(this, condition);
  const bool met = real(this, annotated.wrapped, deadline);
  __tsan_acquire(this);
  return met;
}

// Await releases the mutex while it waits and holds it again when it returns.
void Mutex::Await(const Condition& condition) {
  static auto real = Next<void (*)(Mutex*, const Condition&)>("5Mutex5AwaitERKNS0_9ConditionE");
  AnnotatedCondition annotated(this, condition);
  __tsan_release(this);
  real(this, annotated.wrapped);
  __tsan_acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& condition, Duration timeout) {
  static auto real = Next<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  __tsan_release(this);
  AnnotatedCondition annotated(this, condition);
  const bool met = real(this, annotated.wrapped, timeout);
  __tsan_acquire(this);
  return met;
}

bool Mutex::AwaitWithDeadline(const Condition& condition, Time deadline) {
  static auto real = Next<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_release(this);
  AnnotatedCondition annotated(this, condition);
  const bool met = real(this, annotated.wrapped, deadline);
  __tsan_acquire(this);
  return met;
}

void CondVar::Wait(Mutex* mu) {
  static auto real = Next<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  real(this, mu);
  __tsan_acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static auto real = Next<bool (*)(CondVar*, Mutex*, Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  const bool timed_out = real(this, mu, timeout);
  __tsan_acquire(mu);
  return timed_out;
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static auto real = Next<bool (*)(CondVar*, Mutex*, Time)>(
      "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  const bool timed_out = real(this, mu, deadline);
  __tsan_acquire(mu);
  return timed_out;
}

void Notification::Notify() {
  static auto real = Next<void (*)(Notification*)>("12Notification6NotifyEv");
  __tsan_release(NotifiedFlag(this));
  real(this);
}

void Notification::WaitForNotification() const {
  static auto real = Next<void (*)(const Notification*)>("12Notification19WaitForNotificationEv", true);
  real(this);
  __tsan_acquire(NotifiedFlag(const_cast<Notification*>(this)));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static auto real = Next<bool (*)(const Notification*, Duration)>(
      "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE", true);
  const bool notified = real(this, timeout);
  if (notified) __tsan_acquire(NotifiedFlag(const_cast<Notification*>(this)));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static auto real = Next<bool (*)(const Notification*, Time)>(
      "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE", true);
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(NotifiedFlag(const_cast<Notification*>(this)));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
