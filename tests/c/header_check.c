/* Compiled as C and as C++ by tests/c_header.rs, together with ggml's own headers, then linked
 * against the plugin and run without an HSA runtime. A prototype in include/ggml-hsa.h that
 * disagrees with ggml's types fails to compile here. */
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-hsa.h"

#include <stdio.h>
#include <string.h>

int main(void) {
    char description[32];
    size_t free_mem = 1, total_mem = 1;
    ggml_backend_reg_t reg = ggml_backend_hsa_reg();

    memset(description, 'x', sizeof description);
    ggml_backend_hsa_get_device_description(0, description, sizeof description);
    ggml_backend_hsa_get_device_memory(0, &free_mem, &total_mem);

    printf("name=%s\n", GGML_HSA_NAME);
    printf("max_devices=%d\n", GGML_HSA_MAX_DEVICES);
    printf("reg=%s\n", reg ? ggml_backend_reg_name(reg) : "(null)");
    printf("devices=%d\n", (int) ggml_backend_hsa_get_device_count());
    printf("init=%s\n", ggml_backend_hsa_init(0) ? "backend" : "null");
    printf("buffer_type=%s\n", ggml_backend_hsa_buffer_type(0) ? "set" : "null");
    printf("description=[%s]\n", description);
    printf("memory=%zu/%zu\n", free_mem, total_mem);
    printf("is_hsa=%d\n", (int) ggml_backend_is_hsa(NULL));
    return 0;
}
