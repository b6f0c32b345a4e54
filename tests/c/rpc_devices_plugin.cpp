// A ggml backend "plugin" for the tests (tests/rpc_e2e.rs) that makes the devices of one RPC
// server visible to a program that has no --rpc option, such as the pinned test-backend-ops:
// loaded through GGML_BACKEND_PATH after ggml's RPC backend (ggml_backend_load_all loads "rpc"
// first), its ggml_backend_init adds the server named by GGML_HSA_TEST_RPC_ENDPOINT
// (host:port) exactly as llama.cpp's --rpc does and returns that server's registry, so its
// devices (RPC0, RPC1, ..., described by the endpoint) are registered like any backend's.
#include "ggml-backend.h"

#include <cstdio>
#include <cstdlib>

extern "C" ggml_backend_reg_t ggml_backend_init(void) {
    const char * endpoint = std::getenv("GGML_HSA_TEST_RPC_ENDPOINT");
    if (!endpoint || !*endpoint) {
        fprintf(stderr, "rpc_devices_plugin: GGML_HSA_TEST_RPC_ENDPOINT is not set\n");
        return nullptr;
    }
    ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
    if (!rpc) {
        fprintf(stderr, "rpc_devices_plugin: ggml's RPC backend is not loaded\n");
        return nullptr;
    }
    typedef ggml_backend_reg_t (*add_server_t)(const char * endpoint);
    auto add_server = (add_server_t) ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_add_server");
    if (!add_server) {
        fprintf(stderr, "rpc_devices_plugin: the RPC backend has no ggml_backend_rpc_add_server\n");
        return nullptr;
    }
    return add_server(endpoint);
}
