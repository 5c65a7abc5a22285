# Debian packages (cpack -G DEB in a build configured with
# -DCMAKE_INSTALL_PREFIX=/usr, so that the library lands in Debian's
# multiarch directory): the daemon with its units and tools, the library
# (named after its SONAME), its development files, and the NCCL-API
# library, each a package of its own.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ccs)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "ccs developers <ccs@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "collectives as a service")
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)   # the libraries' packages, from the binaries
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR}/client) # libccs: ours
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_COMPONENTS_ALL daemon lib dev nccl)

set(CPACK_DEBIAN_LIB_PACKAGE_NAME libccs0)
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
set(CPACK_COMPONENT_LIB_DESCRIPTION "ccs client library: jobs reach the node's ccsd through it")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libccs-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libccs0 (= ${PROJECT_VERSION})")
set(CPACK_COMPONENT_DEV_DESCRIPTION "ccs client library: header, pkg-config file")

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME ccsd)
set(CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS "libccs0 (= ${PROJECT_VERSION}), systemd")
set(CPACK_COMPONENT_DAEMON_DESCRIPTION "ccs collectives daemon, its systemd units, ccsctl and ccs-perf")
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/systemd/debian/postinst ${PROJECT_SOURCE_DIR}/systemd/debian/prerm
    ${PROJECT_SOURCE_DIR}/systemd/debian/postrm)
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_NCCL_PACKAGE_NAME libccs-nccl)
set(CPACK_DEBIAN_NCCL_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_NCCL_PACKAGE_DEPENDS "libccs0 (= ${PROJECT_VERSION})")
set(CPACK_COMPONENT_NCCL_DESCRIPTION "NCCL's API on ccs: libnccl.so.2 in LIBDIR/ccs-nccl, for LD_LIBRARY_PATH")
include(CPack)
