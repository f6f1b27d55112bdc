// Leaving an object to the process's exit on purpose, where freeing it could block forever (device
// memory whose streams may never go idle). LeakSanitizer is told, so that a sanitizer build reports
// only the leaks nobody meant.
#ifndef TIERD_COMMON_LEAK_ON_PURPOSE_H_
#define TIERD_COMMON_LEAK_ON_PURPOSE_H_

#include <memory>

#include "common/sanitizers.h"
#if TIERD_UNDER_ASAN
#include <sanitizer/lsan_interface.h>
#endif

namespace tierd {

// Releases `owner` without destroying what it owns; what that object reaches is not reported
// as leaked either.
template <typename T>
void LeakOnPurpose(std::unique_ptr<T>& owner) {
  T* leaked = owner.release();
#if TIERD_UNDER_ASAN
  __lsan_ignore_object(leaked);
#else
  (void)leaked;
#endif
}

}  // namespace tierd

#endif  // TIERD_COMMON_LEAK_ON_PURPOSE_H_
