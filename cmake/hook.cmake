# ggml-hsa in an unmodified upstream ggml / llama.cpp, for GGML_BACKEND_DL=ON builds:
#
#   cmake -S llama.cpp -B build -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON \
#         -DCMAKE_PROJECT_ggml_INCLUDE=/path/to/ggml-hsa/cmake/hook.cmake
#
# CMake includes this file right after ggml's project() call, before its targets exist, so it
# defers the real work to the end of ggml/CMakeLists.txt, where ggml and ggml-base are defined.
# The plugin lands next to the other backends as bin/libggml-hsa.so; upstream's loader does not
# look for "hsa" by name, so point GGML_BACKEND_PATH at it (or load it with ggml_backend_load()).
option(GGML_HSA "ggml: use HSA (AMD XDNA NPUs) through ggml-hsa" ON)
if (GGML_HSA)
    if (NOT GGML_BACKEND_DL)
        message(FATAL_ERROR "ggml-hsa: the hook (CMAKE_PROJECT_ggml_INCLUDE) works with -DGGML_BACKEND_DL=ON "
            "only: an unmodified ggml cannot register a statically linked backend. For GGML_BACKEND_DL=OFF, "
            "prepare the tree with ggml-hsa's cmake/integrate.sh and configure with -DGGML_HSA=ON.")
    endif()
    # DEFER evaluates its arguments when it runs; EVAL binds the path now.
    set(_ggml_hsa_impl "${CMAKE_CURRENT_LIST_DIR}/ggml-hsa.cmake")
    cmake_language(EVAL CODE "
        cmake_language(DEFER CALL include [[${_ggml_hsa_impl}]])
        cmake_language(DEFER CALL ggml_hsa_add_backend)")
endif()
