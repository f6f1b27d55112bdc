# What `cmake --install` installs and how CPack packs it (included last by CMakeLists.txt).
#
#   cmake --install build --prefix P   bin/tierd, bin/tierctl, lib/libtierd_client.so, the client's
#                                      headers under include/tierd, lib/cmake/tierd (find_package)
#                                      and lib/pkgconfig/tierd-client.pc
#   cpack -G DEB --config build/CPackConfig.cmake
#                                      tierd_VERSION_ARCH.deb: the same under /usr, plus the
#                                      systemd unit, /etc/tierd/tierd.conf (a conffile) and the
#                                      tierd user's sysusers.d entry (the "system" component)
# deploy/README.md says how to build, inspect and install the package.
include(CMakePackageConfigHelpers)

install(TARGETS tierd RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/tierd)
install(EXPORT tierdTargets NAMESPACE tierd:: DESTINATION ${cmake_dir})
configure_package_config_file(cmake/tierdConfig.cmake.in ${CMAKE_BINARY_DIR}/cmake/tierdConfig.cmake
  INSTALL_DESTINATION ${cmake_dir})
# 0.x: a new minor version may change the API.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/tierdConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/tierdConfig.cmake
              ${CMAKE_BINARY_DIR}/cmake/tierdConfigVersion.cmake
        DESTINATION ${cmake_dir})

# The .pc file finds its prefix from where it lies, so that the tree can be installed anywhere.
file(RELATIVE_PATH TIERD_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
configure_file(cmake/tierd-client.pc.in ${CMAKE_BINARY_DIR}/cmake/tierd-client.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/cmake/tierd-client.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The node's service files, for the Debian package only: absolute paths, which an install under a
# prefix must not touch. The unit runs the daemon from /usr/bin rather than the bundle's /opt/tierd.
file(READ deploy/systemd/tierd@.service unit)
string(REPLACE "/opt/tierd/bin/tierd" "/usr/bin/tierd" unit "${unit}")
file(WRITE ${CMAKE_BINARY_DIR}/deb/tierd@.service "${unit}")
install(FILES ${CMAKE_BINARY_DIR}/deb/tierd@.service DESTINATION /lib/systemd/system
        COMPONENT system EXCLUDE_FROM_ALL)
install(FILES deploy/tierd.conf DESTINATION /etc/tierd COMPONENT system EXCLUDE_FROM_ALL)
install(FILES deploy/debian/sysusers.conf DESTINATION /usr/lib/sysusers.d RENAME tierd.conf
        COMPONENT system EXCLUDE_FROM_ALL)

# One package of every component, named tierd_VERSION_ARCH.deb. Its runtime dependencies are the
# system's shared libraries, as dpkg-shlibdeps finds them (gRPC, protobuf, Abseil, liburing, ...):
# nothing is bundled. The CUDA runtime is linked statically and loads the driver at run time.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME tierd)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "tierd maintainers <tierd@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "GPU memory-tiering daemon: disk, pinned host memory and GPU staging for model servers")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_COMPONENTS_ALL Unspecified system)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_SOURCE_DIR}/deploy/debian/conffiles ${CMAKE_SOURCE_DIR}/deploy/debian/postinst
    ${CMAKE_SOURCE_DIR}/deploy/debian/prerm ${CMAKE_SOURCE_DIR}/deploy/debian/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
