// The precompiled header of tierd's libraries that speak gRPC (CMakeLists.txt,
// tierd_precompile_headers): the other libraries' header, and gRPC's C++ API.
#ifndef TIERD_CMAKE_PCH_GRPC_LIBRARIES_H_
#define TIERD_CMAKE_PCH_GRPC_LIBRARIES_H_

#include "cmake/pch/libraries.h"
#include "grpcpp/grpcpp.h"

#endif  // TIERD_CMAKE_PCH_GRPC_LIBRARIES_H_
