// The translation unit that makes tests/test_pch.h's precompiled header (tests/CMakeLists.txt).
