// Leaving an object to the process's exit on purpose, where freeing it could block forever (device
// memory whose streams may never go idle). LeakSanitizer is told, so that a sanitizer build reports
// only the leaks nobody meant.
#ifndef TIERD_COMMON_LEAK_ON_PURPOSE_H_
#define TIERD_COMMON_LEAK_ON_PURPOSE_H_

#include <memory>

#if defined(__SANITIZE_ADDRESS__)
#define TIERD_HAVE_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TIERD_HAVE_LSAN 1
#endif
#endif
#ifdef TIERD_HAVE_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace tierd {

// Releases `owner` without destroying what it owns; what that object reaches is not reported
// as leaked either.
template <typename T>
void LeakOnPurpose(std::unique_ptr<T>& owner) {
  T* leaked = owner.release();
#ifdef TIERD_HAVE_LSAN
  __lsan_ignore_object(leaked);
#else
  (void)leaked;
#endif
}

}  // namespace tierd

#endif  // TIERD_COMMON_LEAK_ON_PURPOSE_H_
