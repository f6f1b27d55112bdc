// Which sanitizer the build runs under, said the same way by GCC and clang: GCC defines
// __SANITIZE_ADDRESS__ and __SANITIZE_THREAD__, clang 14 answers __has_feature instead.
// TIERD_UNDER_ASAN and TIERD_UNDER_TSAN are 1 or 0, for #if.
#ifndef TIERD_COMMON_SANITIZERS_H_
#define TIERD_COMMON_SANITIZERS_H_

#if defined(__SANITIZE_ADDRESS__)
#define TIERD_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TIERD_UNDER_ASAN 1
#endif
#endif
#ifndef TIERD_UNDER_ASAN
#define TIERD_UNDER_ASAN 0
#endif

#if defined(__SANITIZE_THREAD__)
#define TIERD_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TIERD_UNDER_TSAN 1
#endif
#endif
#ifndef TIERD_UNDER_TSAN
#define TIERD_UNDER_TSAN 0
#endif

#endif  // TIERD_COMMON_SANITIZERS_H_
