// The buffer operations ggml's RPC server performs on the backend's buffers, driven from a client
// (tests/rpc_e2e.rs): on the RPC device of one server (HSA0 behind it), two tensors in one
// buffer and one in another; then
//   set_tensor, get_tensor                 (RPC_CMD_SET_TENSOR / GET_TENSOR)
//   cpy_tensor between the two buffers     (RPC_CMD_COPY_TENSOR: the server's buffer cpy_tensor)
//   memset_tensor                          (RPC_CMD_MEMSET_TENSOR)
//   buffer clear                           (RPC_CMD_BUFFER_CLEAR)
//   get_alloc_size of a quantized tensor   (RPC_CMD_GET_ALLOC_SIZE)
// each checked by reading the data back. Prints one line per check and "all ok"; exits 1 on the
// first failure.
//
//   rpc_buffer_ops BACKEND_DIR HOST:PORT
#include "ggml-alloc.h"
#include "ggml-backend-impl.h"
#include "ggml-backend.h"
#include "ggml.h"

#include <cstdio>
#include <cstring>
#include <vector>

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAILED: " __VA_ARGS__);                                               \
            fprintf(stderr, "\n");                                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s BACKEND_DIR HOST:PORT\n", argv[0]);
        return 2;
    }
    ggml_backend_load_all_from_path(argv[1]);
    ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
    CHECK(rpc, "ggml's RPC backend is not loaded");
    typedef ggml_backend_reg_t (*add_server_t)(const char * endpoint);
    auto add_server = (add_server_t) ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_add_server");
    CHECK(add_server, "no ggml_backend_rpc_add_server");
    ggml_backend_reg_t server = add_server(argv[2]);
    CHECK(server && ggml_backend_reg_dev_count(server) == 1, "the server has no device");
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(server, 0);
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);

    const int n = 1000;
    ggml_init_params params = { 8 * ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx_a = ggml_init(params);
    ggml_context * ctx_b = ggml_init(params);
    ggml_tensor * a = ggml_new_tensor_1d(ctx_a, GGML_TYPE_F32, n);
    ggml_tensor * a2 = ggml_new_tensor_1d(ctx_a, GGML_TYPE_F32, n);
    ggml_tensor * b = ggml_new_tensor_1d(ctx_b, GGML_TYPE_F32, n);
    ggml_backend_buffer_t buf_a = ggml_backend_alloc_ctx_tensors_from_buft(ctx_a, buft);
    ggml_backend_buffer_t buf_b = ggml_backend_alloc_ctx_tensors_from_buft(ctx_b, buft);
    CHECK(buf_a && buf_b, "cannot allocate buffers on %s", ggml_backend_dev_name(dev));

    std::vector<float> x(n), y(n);
    for (int i = 0; i < n; ++i) {
        x[i] = 0.5f * i - 17.0f;
    }
    ggml_backend_tensor_set(a, x.data(), 0, n * sizeof(float));
    ggml_backend_tensor_get(a, y.data(), 0, n * sizeof(float));
    CHECK(x == y, "set_tensor/get_tensor");
    printf("set_tensor, get_tensor: ok\n");

    // dst's buffer copies from src's: over RPC, both on one server, the server's cpy_tensor.
    CHECK(b->buffer->iface.cpy_tensor, "the RPC buffer has no cpy_tensor");
    CHECK(b->buffer->iface.cpy_tensor(b->buffer, a, b), "cpy_tensor between two buffers returned false");
    std::fill(y.begin(), y.end(), 0.0f);
    ggml_backend_tensor_get(b, y.data(), 0, n * sizeof(float));
    CHECK(x == y, "cpy_tensor: the copy differs");
    printf("cpy_tensor (buffer to buffer on the server): ok\n");

    const uint8_t fill = 0x3f;
    ggml_backend_tensor_memset(b, fill, 4 * sizeof(float), 10 * sizeof(float));
    ggml_backend_tensor_get(b, y.data(), 0, n * sizeof(float));
    for (int i = 0; i < n; ++i) {
        float want = x[i];
        if (i >= 4 && i < 14) {
            std::memset(&want, fill, sizeof(want));
        }
        CHECK(std::memcmp(&y[i], &want, sizeof(float)) == 0, "memset_tensor: element %d", i);
    }
    printf("memset_tensor: ok\n");

    ggml_backend_tensor_set(a2, x.data(), 0, n * sizeof(float));
    ggml_backend_buffer_clear(buf_a, 0);
    for (ggml_tensor * t : { a, a2 }) {
        ggml_backend_tensor_get(t, y.data(), 0, n * sizeof(float));
        for (int i = 0; i < n; ++i) {
            CHECK(y[i] == 0.0f, "buffer clear: %s[%d] = %g", t->name, i, y[i]);
        }
    }
    ggml_backend_tensor_get(b, y.data(), 0, sizeof(float));
    CHECK(y[0] == x[0], "buffer clear touched another buffer");
    printf("buffer clear: ok\n");

    // A quantized tensor whose rows are not a multiple of 512 values: ggml-rpc asks the server.
    ggml_tensor * q = ggml_new_tensor_2d(ctx_b, GGML_TYPE_Q4_0, 96, 3);
    const size_t alloc = ggml_backend_buft_get_alloc_size(buft, q);
    CHECK(alloc >= ggml_nbytes(q), "get_alloc_size %zu < nbytes %zu", alloc, ggml_nbytes(q));
    printf("get_alloc_size(q4_0 96x3): %zu (nbytes %zu): ok\n", alloc, ggml_nbytes(q));

    ggml_backend_buffer_free(buf_a);
    ggml_backend_buffer_free(buf_b);
    ggml_free(ctx_a);
    ggml_free(ctx_b);
    printf("all ok\n");
    return 0;
}
