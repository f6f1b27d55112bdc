// main() of the test binaries that run against one device; TIERD_TEST_DEVICE is set per binary.
#include "tests/test_support.h"

int main(int argc, char** argv) {
  return tierd::testing::RunDeviceTestMain(argc, argv, TIERD_TEST_DEVICE);
}
