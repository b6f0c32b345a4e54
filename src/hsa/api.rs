//! The HSA symbol table, declared once.
//!
//! Each entry names a C function and its Rust function-pointer type. Required symbols must all be
//! present or the runtime is refused with an error naming the first missing one; optional symbols
//! become `Option`s that callers check (newer ROCR entry points, for example).

use std::path::{Path, PathBuf};

use libloading::Library;

use super::error::HsaError;
use super::sys::*;

macro_rules! hsa_symbols {
    (
        required { $($req:ident: $req_ty:ty,)* }
        optional { $($opt:ident: $opt_ty:ty,)* }
    ) => {
        /// Function pointers resolved from one loaded `libhsa-runtime64`.
        #[derive(Debug)]
        pub struct HsaApi {
            /// The file (or soname) the symbols came from.
            pub library: PathBuf,
            $(pub $req: $req_ty,)*
            $(pub $opt: Option<$opt_ty>,)*
        }

        impl HsaApi {
            /// Names of the required symbols, in declaration order.
            pub const REQUIRED: &'static [&'static str] = &[$(stringify!($req)),*];
            /// Names of the optional symbols, in declaration order.
            pub const OPTIONAL: &'static [&'static str] = &[$(stringify!($opt)),*];

            /// Resolves every symbol of the table from `lib`.
            ///
            /// # Safety
            /// `lib` must be an HSA runtime whose exported functions have the signatures declared
            /// in [`super::sys`], and it must never be unloaded while the table is in use.
            pub unsafe fn resolve(lib: &Library, library: &Path) -> Result<HsaApi, HsaError> {
                Ok(HsaApi {
                    library: library.to_owned(),
                    $($req: {
                        // SAFETY: the caller guarantees the declared signature; the pointer is
                        // copied out and stays valid because the library is never unloaded.
                        let symbol = unsafe {
                            lib.get::<$req_ty>(concat!(stringify!($req), "\0").as_bytes())
                        };
                        *symbol.map_err(|e| HsaError::MissingSymbol {
                            library: library.to_owned(),
                            symbol: stringify!($req),
                            reason: e.to_string(),
                        })?
                    },)*
                    $($opt: {
                        // SAFETY: as above.
                        let symbol = unsafe {
                            lib.get::<$opt_ty>(concat!(stringify!($opt), "\0").as_bytes())
                        };
                        symbol.ok().map(|s| *s)
                    },)*
                })
            }
        }
    };
}

hsa_symbols! {
    required {
        hsa_init: hsa_init_fn,
        hsa_status_string: hsa_status_string_fn,
        hsa_iterate_agents: hsa_iterate_agents_fn,
        hsa_agent_get_info: hsa_agent_get_info_fn,
        hsa_amd_agent_iterate_memory_pools: hsa_amd_agent_iterate_memory_pools_fn,
        hsa_amd_memory_pool_get_info: hsa_amd_memory_pool_get_info_fn,
        hsa_amd_memory_pool_allocate: hsa_amd_memory_pool_allocate_fn,
        hsa_amd_memory_pool_free: hsa_amd_memory_pool_free_fn,
        hsa_queue_create: hsa_queue_create_fn,
        hsa_queue_destroy: hsa_queue_destroy_fn,
        hsa_queue_load_read_index_scacquire: hsa_queue_index_fn,
        hsa_queue_load_write_index_relaxed: hsa_queue_index_fn,
        hsa_queue_add_write_index_relaxed: hsa_queue_add_index_fn,
        hsa_signal_create: hsa_signal_create_fn,
        hsa_signal_destroy: hsa_signal_destroy_fn,
        hsa_signal_store_screlease: hsa_signal_store_fn,
        hsa_signal_load_scacquire: hsa_signal_load_fn,
        hsa_signal_wait_scacquire: hsa_signal_wait_fn,
    }
    optional {
        // Only used to probe the packet ABI and to convert wait timeouts.
        hsa_system_get_info: hsa_system_get_info_fn,
        // Packet ABI c: AIE code objects (hsaco) loaded into executables; the kernel object of
        // a symbol goes into the packet. Present in every ROCR, but only a generation-c ROCR
        // loads an AIE code object for an AIE agent.
        hsa_code_object_reader_create_from_memory: hsa_code_object_reader_create_from_memory_fn,
        hsa_code_object_reader_destroy: hsa_code_object_reader_destroy_fn,
        hsa_executable_create_alt: hsa_executable_create_alt_fn,
        hsa_executable_load_agent_code_object: hsa_executable_load_agent_code_object_fn,
        hsa_executable_freeze: hsa_executable_freeze_fn,
        hsa_executable_destroy: hsa_executable_destroy_fn,
        hsa_executable_get_symbol_by_name: hsa_executable_get_symbol_by_name_fn,
        hsa_executable_symbol_get_info: hsa_executable_symbol_get_info_fn,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_the_c_names() {
        assert_eq!(HsaApi::REQUIRED[0], "hsa_init");
        assert!(HsaApi::REQUIRED.contains(&"hsa_agent_get_info"));
    }

    #[test]
    fn a_library_without_hsa_reports_the_first_missing_symbol() {
        // libm is loadable everywhere and exports none of the HSA functions.
        // SAFETY: loading libm runs no initialisers of consequence.
        let lib = unsafe { Library::new("libm.so.6") }.unwrap();
        // SAFETY: resolution fails at the first symbol, so no pointer is ever used.
        let err = unsafe { HsaApi::resolve(&lib, Path::new("libm.so.6")) }.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("libm.so.6 is not a usable HSA runtime"),
            "{text}"
        );
        assert!(text.contains("`hsa_init`"), "{text}");
    }
}
