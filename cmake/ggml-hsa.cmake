# The `ggml-hsa` target: the Rust crate built by cargo, wired into a ggml build the way
# ggml_add_backend_library() wires a C++ backend. Included by the three entry points of this folder
# (CMakeLists.txt for the in-tree place ggml/src/ggml-hsa, hook.cmake for an unmodified upstream
# tree, and through the integration helper); they all call ggml_hsa_add_backend().
#
# It needs the targets ggml and ggml-base to exist, so it runs after ggml/src has been added.
#
# Options (cache variables):
#   GGML_HSA_SOURCE_DIR           the crate (the directory with Cargo.toml); default: this folder's parent
#   GGML_HSA_JIT_COMPILE          compile kernels at run time with the IRON package (installed when ON)
#   GGML_HSA_JIT_STDOUT_REDIRECT  kept for compatibility: the compiler's output is always captured
#   GGML_HSA_CPU_FALLBACK         claim every op; run the ones without a kernel on ggml's CPU backend
#   hsa-runtime64_DIR             a ROCR installation (its lib/cmake/hsa-runtime64 folder)
#   GGML_HSA_CARGO                the cargo program
#
# Configuring never downloads: cargo runs with --offline --locked, so the crate's dependencies must
# be in cargo's cache beforehand (scripts/fetch-deps.sh does that).

include_guard(GLOBAL)
include(GNUInstallDirs)

set(_GGML_HSA_CMAKE_DIR "${CMAKE_CURRENT_LIST_DIR}")

function(ggml_hsa_add_backend)
    if (NOT TARGET ggml OR NOT TARGET ggml-base)
        message(FATAL_ERROR "ggml-hsa: the targets ggml and ggml-base must exist before ggml-hsa is added")
    endif()

    # This folder may be reached through a symlink (ggml/src/ggml-hsa): resolve it before going up.
    get_filename_component(_cmake_dir "${_GGML_HSA_CMAKE_DIR}" REALPATH)
    get_filename_component(_default_source "${_cmake_dir}" DIRECTORY)
    set(GGML_HSA_SOURCE_DIR "${_default_source}" CACHE PATH "ggml-hsa: the crate's directory (with Cargo.toml)")
    option(GGML_HSA_JIT_COMPILE "ggml-hsa: enable JIT compilation of kernels (installs the IRON package)" OFF)
    option(GGML_HSA_JIT_STDOUT_REDIRECT "ggml-hsa: redirect stdout during JIT compilation (always done)" ON)
    option(GGML_HSA_CPU_FALLBACK "ggml-hsa: run ops without an NPU kernel on ggml's CPU backend (development, slow)" OFF)
    find_program(GGML_HSA_CARGO cargo HINTS "$ENV{CARGO_HOME}/bin" "$ENV{HOME}/.cargo/bin")

    set(_src "${GGML_HSA_SOURCE_DIR}")
    if (NOT EXISTS "${_src}/Cargo.toml")
        message(FATAL_ERROR "ggml-hsa: GGML_HSA_SOURCE_DIR=${_src} has no Cargo.toml; set it to the ggml-hsa checkout")
    endif()
    if (NOT GGML_HSA_CARGO)
        message(FATAL_ERROR "ggml-hsa: cargo not found (install Rust, or set GGML_HSA_CARGO)")
    endif()
    if (NOT GGML_HSA_JIT_STDOUT_REDIRECT)
        message(STATUS "ggml-hsa: GGML_HSA_JIT_STDOUT_REDIRECT=OFF has no effect: the kernel compiler's output is always captured")
    endif()

    # ROCR: where to look for libhsa-runtime64 first at run time, and the headers for the
    # build-time ABI check. The library is opened at run time, never linked.
    set(_rocr_lib_dir "")
    set(_rocr_include_dir "")
    find_package(hsa-runtime64 CONFIG QUIET)
    if (hsa-runtime64_FOUND AND TARGET hsa-runtime64::hsa-runtime64)
        get_target_property(_configs hsa-runtime64::hsa-runtime64 IMPORTED_CONFIGURATIONS)
        set(_props IMPORTED_LOCATION)
        foreach (_config IN LISTS _configs)
            list(APPEND _props "IMPORTED_LOCATION_${_config}")
        endforeach()
        foreach (_prop IN LISTS _props)
            get_target_property(_loc hsa-runtime64::hsa-runtime64 ${_prop})
            if (_loc)
                get_filename_component(_rocr_lib_dir "${_loc}" DIRECTORY)
                break()
            endif()
        endforeach()
        # The package names either the directory holding hsa/ or hsa/ itself.
        get_target_property(_inc hsa-runtime64::hsa-runtime64 INTERFACE_INCLUDE_DIRECTORIES)
        foreach (_dir IN LISTS _inc)
            if (EXISTS "${_dir}/hsa/hsa.h")
                set(_rocr_include_dir "${_dir}")
                break()
            elseif (EXISTS "${_dir}/hsa.h" AND EXISTS "${_dir}/hsa_ext_amd.h")
                get_filename_component(_rocr_include_dir "${_dir}" DIRECTORY)
                break()
            endif()
        endforeach()
        message(STATUS "ggml-hsa: ROCR found: library in ${_rocr_lib_dir}, headers in ${_rocr_include_dir}")
        message(STATUS "ggml-hsa: put ${_rocr_lib_dir} first in LD_LIBRARY_PATH when other ROCm libraries are installed")
    elseif (DEFINED hsa-runtime64_DIR AND hsa-runtime64_DIR)
        message(WARNING "ggml-hsa: hsa-runtime64_DIR=${hsa-runtime64_DIR} holds no usable hsa-runtime64 package")
    else()
        message(STATUS "ggml-hsa: ROCR not found at configure time; libhsa-runtime64 is searched at run time")
    endif()

    if (GGML_BACKEND_DL)
        set(_link dylib)
    else()
        set(_link static)
    endif()
    if (CMAKE_BUILD_TYPE STREQUAL "Debug")
        set(_profile debug)
        set(_profile_flag "")
    else()
        set(_profile release)
        set(_profile_flag "--release")
    endif()
    set(_target_dir "${CMAKE_CURRENT_BINARY_DIR}/ggml-hsa-cargo")
    set(_out_dir "${_target_dir}/${_profile}")
    if (CMAKE_RUNTIME_OUTPUT_DIRECTORY)
        set(_bin_dir "${CMAKE_RUNTIME_OUTPUT_DIRECTORY}")
    else()
        set(_bin_dir "${CMAKE_BINARY_DIR}/bin")
    endif()
    if (NOT GGML_BUILD_COMMIT)
        set(GGML_BUILD_COMMIT unknown)
    endif()

    # The IRON package: from the install tree once installed, from the source tree before.
    set(_iron_install_dir "${CMAKE_INSTALL_FULL_DATADIR}/ggml-hsa/python")
    set(_iron_pythonpath "${_iron_install_dir}:${_src}/src")

    set(_env
        "GGML_HSA_GGML_DIR=${ggml_SOURCE_DIR}"
        "GGML_HSA_GGML_LIB_DIR=$<TARGET_FILE_DIR:ggml-base>"
        "GGML_HSA_GGML_VERSION=${GGML_VERSION}"
        "GGML_HSA_GGML_COMMIT=${GGML_BUILD_COMMIT}"
        "GGML_HSA_LINK=${_link}"
        "GGML_HSA_RPATH=0"
        "GGML_HSA_JIT_COMPILE=$<IF:$<BOOL:${GGML_HSA_JIT_COMPILE}>,ON,OFF>"
        "GGML_HSA_IRON_PYTHONPATH=${_iron_pythonpath}"
        "GGML_HSA_CPU_FALLBACK=$<IF:$<BOOL:${GGML_HSA_CPU_FALLBACK}>,ON,OFF>"
        "GGML_HSA_ROCR_LIB_DIR=${_rocr_lib_dir}"
        "GGML_HSA_ROCR_INCLUDE_DIR=${_rocr_include_dir}"
        "CARGO_TARGET_DIR=${_target_dir}")
    set(_cargo ${CMAKE_COMMAND} -E env ${_env} "${GGML_HSA_CARGO}")
    set(_cargo_flags ${_profile_flag} --offline --locked --manifest-path "${_src}/Cargo.toml")
    set(_tool "${_bin_dir}/ggml-hsa-gen-kernels")

    # cargo decides what is stale; the target always runs it (a no-op build takes a moment).
    if (GGML_BACKEND_DL)
        set(_module "${_bin_dir}/libggml-hsa.so")
        add_custom_target(ggml-hsa-cargo ALL
            COMMAND ${_cargo} build ${_cargo_flags} --lib --bin ggml-hsa-gen-kernels
            COMMAND ${CMAKE_COMMAND} -E make_directory "${_bin_dir}"
            COMMAND ${CMAKE_COMMAND} -E copy_if_different "${_out_dir}/libggml_hsa.so" "${_module}"
            COMMAND ${CMAKE_COMMAND} -E copy_if_different "${_out_dir}/ggml-hsa-gen-kernels" "${_tool}"
            BYPRODUCTS "${_module}" "${_tool}"
            WORKING_DIRECTORY "${_src}"
            COMMENT "ggml-hsa: cargo build (${_profile}) -> ${_module}"
            USES_TERMINAL VERBATIM)
        add_dependencies(ggml-hsa-cargo ggml-base)
        add_custom_target(ggml-hsa DEPENDS ggml-hsa-cargo)
        # Like ggml_add_backend_library in DL mode: building ggml builds the backend.
        add_dependencies(ggml ggml-hsa)
        if (GGML_BACKEND_DIR)
            set(_module_dest "${GGML_BACKEND_DIR}")
        else()
            set(_module_dest "${CMAKE_INSTALL_BINDIR}")
        endif()
        install(FILES "${_module}" DESTINATION "${_module_dest}"
            PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
    else()
        # A static archive linked into ggml, registered by ggml-backend-reg.cpp (GGML_USE_HSA).
        set(_archive "${_out_dir}/libggml_hsa.a")
        add_custom_target(ggml-hsa-cargo ALL
            COMMAND ${_cargo} rustc ${_cargo_flags} --lib --crate-type staticlib
            COMMAND ${_cargo} build ${_cargo_flags} --bin ggml-hsa-gen-kernels
            COMMAND ${CMAKE_COMMAND} -E make_directory "${_bin_dir}"
            COMMAND ${CMAKE_COMMAND} -E copy_if_different "${_out_dir}/ggml-hsa-gen-kernels" "${_tool}"
            BYPRODUCTS "${_archive}" "${_tool}"
            WORKING_DIRECTORY "${_src}"
            COMMENT "ggml-hsa: cargo build (${_profile}, static) -> ${_archive}"
            USES_TERMINAL VERBATIM)
        add_dependencies(ggml-hsa-cargo ggml-base)
        add_library(ggml-hsa STATIC IMPORTED GLOBAL)
        set_target_properties(ggml-hsa PROPERTIES IMPORTED_LOCATION "${_archive}")
        # What a Rust static library needs from the system, and ggml-base for the ggml API.
        target_link_libraries(ggml-hsa INTERFACE ggml-base ${CMAKE_DL_LIBS} pthread m rt util gcc_s)
        target_include_directories(ggml-hsa INTERFACE "${_src}/include")
        add_dependencies(ggml-hsa ggml-hsa-cargo)
        target_link_libraries(ggml PUBLIC ggml-hsa)
        # GGML_HSA_CPU_FALLBACK reaches ggml's CPU backend through ggml_backend_init_by_type,
        # looked up among the process's dynamic symbols (src/ffi/cpu.rs), which a static
        # executable does not export: every program linking ggml exports that one symbol.
        # (ggml-rpc-server needs the fallback: docs/several-machines.md.)
        target_link_options(ggml-hsa INTERFACE
            "LINKER:--export-dynamic-symbol=ggml_backend_init_by_type")
        # ggml-config.cmake looks for each backend as lib<name>.
        install(FILES "${_archive}" DESTINATION "${CMAKE_INSTALL_LIBDIR}" RENAME libggml-hsa.a)
    endif()

    install(PROGRAMS "${_tool}" DESTINATION "${CMAKE_INSTALL_BINDIR}")
    install(FILES "${_src}/include/ggml-hsa.h" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
    install(DIRECTORY "${_src}/share/examples/" DESTINATION "${CMAKE_INSTALL_DATADIR}/ggml-hsa/examples")
    if (GGML_HSA_JIT_COMPILE)
        install(DIRECTORY "${_src}/src/ggml_hsa_iron" DESTINATION "${CMAKE_INSTALL_DATADIR}/ggml-hsa/python"
            PATTERN "__pycache__" EXCLUDE
            PATTERN "tests" EXCLUDE
            PATTERN ".ruff_cache" EXCLUDE)
        message(STATUS "ggml-hsa: JIT compilation on; the IRON package installs to ${_iron_install_dir} "
                       "(run the build inside the IRON environment: src/ggml_hsa_iron/env_setup.sh)")
    endif()

    if(NOT GGML_AVAILABLE_BACKENDS)
        set(GGML_AVAILABLE_BACKENDS "ggml-hsa" CACHE INTERNAL "List of backends for cmake package")
    elseif (NOT "ggml-hsa" IN_LIST GGML_AVAILABLE_BACKENDS)
        set(GGML_AVAILABLE_BACKENDS "${GGML_AVAILABLE_BACKENDS};ggml-hsa" CACHE INTERNAL "List of backends for cmake package")
    endif()
    message(STATUS "ggml-hsa: ${_link} backend from ${_src} (cargo ${_profile}, JIT ${GGML_HSA_JIT_COMPILE}, CPU fallback ${GGML_HSA_CPU_FALLBACK})")
endfunction()
