//! Compile-time check of [`super::sys`] against the ROCR headers the build was pointed at
//! (`GGML_HSA_ROCR_INCLUDE_DIR`, found by CMake through `hsa-runtime64_DIR`): the build script generates
//! one assertion per constant and struct that both declare, so a mismatch fails the build with
//! the name of the declaration.

#[allow(
    dead_code,
    unused_imports,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    clippy::all
)]
mod rocr {
    include!(concat!(env!("OUT_DIR"), "/rocr_sys.rs"));
}

include!(concat!(env!("OUT_DIR"), "/rocr_abi_check.rs"));
