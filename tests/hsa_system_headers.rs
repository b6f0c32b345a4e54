//! The HSA declarations of `src/hsa/sys.rs` (written from the documented ABI, no header copied)
//! checked against the system's HSA headers with bindgen, when they are installed (Debian's
//! `libhsa-runtime-dev`, ROCm 5.2, in CI): enum values, struct sizes and field offsets, and the
//! parameter lists of every function the backend resolves.
//!
//! The AIE-only declarations (the ERT and kernel-dispatch packets, `HSA_DEVICE_TYPE_AIE`, ...)
//! are newer than those headers; they are checked against the documented offsets in
//! `src/hsa/sys.rs`'s own tests. Names absent from the headers are listed, not failed.

use std::collections::HashMap;
use std::path::PathBuf;

use ggml_hsa::hsa::sys::*;

fn include_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("GGML_HSA_HSA_INCLUDE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/include"));
    dir.join("hsa/hsa_ext_amd.h").is_file().then_some(dir)
}

/// The headers as bindgen sees them: the generated Rust source.
fn generated() -> Option<String> {
    let Some(dir) = include_dir() else {
        assert!(
            std::env::var("GGML_HSA_REQUIRE_ROCR").as_deref() != Ok("1"),
            "GGML_HSA_REQUIRE_ROCR=1 but the HSA headers (libhsa-runtime-dev) are not installed"
        );
        eprintln!("skipped: no HSA headers (install libhsa-runtime-dev)");
        return None;
    };
    let code = bindgen::Builder::default()
        .header(dir.join("hsa/hsa.h").to_str().unwrap())
        .header(dir.join("hsa/hsa_ext_amd.h").to_str().unwrap())
        .clang_arg(format!("-I{}", dir.display()))
        .allowlist_item("hsa_.*|HSA_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .layout_tests(true)
        .generate()
        .expect("bindgen reads the system HSA headers")
        .to_string();
    std::fs::write(std::env::temp_dir().join("ggml-hsa-system-hsa.rs"), &code).unwrap();
    Some(normalise(&code))
}

/// Runs of whitespace as one space, so both sides compare however they were formatted.
fn normalise(code: &str) -> String {
    code.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `pub const NAME: type = value;` items.
fn constants(code: &str) -> HashMap<String, i128> {
    code.split("pub const ")
        .skip(1)
        .filter_map(|rest| {
            let rest = rest.split(';').next()?;
            let (name, rest) = rest.split_once(':')?;
            let value = rest.split_once('=')?.1.trim().trim_end_matches(';').trim();
            let value = value.trim_end_matches("usize").trim_end_matches("u32");
            Some((name.trim().to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The layout facts bindgen's layout tests assert: `"Size of T"` and `"Offset of field: T::f"`.
fn layouts(code: &str) -> HashMap<String, usize> {
    let mut facts = HashMap::new();
    for part in code.split("[\"").skip(1) {
        let Some((label, rest)) = part.split_once("\"]") else {
            continue;
        };
        let value = rest
            .split_once(" - ")
            .and_then(|(_, v)| v.split("usize").next())
            .and_then(|v| v.trim().parse().ok());
        if let Some(value) = value {
            facts.insert(label.to_owned(), value);
        }
    }
    facts
}

/// Number of parameters of the function whose declaration starts with `signature_start` (which
/// ends with the opening parenthesis).
fn arity(code: &str, signature_start: &str) -> Option<usize> {
    let at = code.find(signature_start)? + signature_start.len();
    // Parentheses and generic brackets nest (the `>` of `->` does not close a bracket).
    let mut depth = 1;
    let mut angle = 0;
    let mut commas = 0;
    let mut last = '(';
    for c in code[at..].chars() {
        match c {
            '(' => depth += 1,
            ')' if depth == 1 => break,
            ')' => depth -= 1,
            '<' => angle += 1,
            '>' if last != '-' => angle -= 1,
            ',' if depth == 1 && angle == 0 => commas += 1,
            _ => {}
        }
        if !c.is_whitespace() {
            last = c;
        }
    }
    Some(match last {
        '(' => 0,
        ',' => commas,
        _ => commas + 1,
    })
}

#[test]
fn enum_values_match_the_system_headers() {
    let Some(code) = generated() else { return };
    let consts = constants(&code);
    let ours: &[(&str, i128)] = &[
        ("HSA_STATUS_SUCCESS", HSA_STATUS_SUCCESS.into()),
        ("HSA_STATUS_INFO_BREAK", HSA_STATUS_INFO_BREAK.into()),
        ("HSA_STATUS_ERROR", HSA_STATUS_ERROR.into()),
        (
            "HSA_STATUS_ERROR_INVALID_ARGUMENT",
            HSA_STATUS_ERROR_INVALID_ARGUMENT.into(),
        ),
        (
            "HSA_STATUS_ERROR_INVALID_QUEUE_CREATION",
            HSA_STATUS_ERROR_INVALID_QUEUE_CREATION.into(),
        ),
        (
            "HSA_STATUS_ERROR_INVALID_ALLOCATION",
            HSA_STATUS_ERROR_INVALID_ALLOCATION.into(),
        ),
        (
            "HSA_STATUS_ERROR_INVALID_AGENT",
            HSA_STATUS_ERROR_INVALID_AGENT.into(),
        ),
        (
            "HSA_STATUS_ERROR_INVALID_REGION",
            HSA_STATUS_ERROR_INVALID_REGION.into(),
        ),
        (
            "HSA_STATUS_ERROR_INVALID_SIGNAL",
            HSA_STATUS_ERROR_INVALID_SIGNAL.into(),
        ),
        (
            "HSA_STATUS_ERROR_INVALID_QUEUE",
            HSA_STATUS_ERROR_INVALID_QUEUE.into(),
        ),
        (
            "HSA_STATUS_ERROR_OUT_OF_RESOURCES",
            HSA_STATUS_ERROR_OUT_OF_RESOURCES.into(),
        ),
        (
            "HSA_STATUS_ERROR_INVALID_PACKET_FORMAT",
            HSA_STATUS_ERROR_INVALID_PACKET_FORMAT.into(),
        ),
        (
            "HSA_STATUS_ERROR_RESOURCE_FREE",
            HSA_STATUS_ERROR_RESOURCE_FREE.into(),
        ),
        (
            "HSA_STATUS_ERROR_NOT_INITIALIZED",
            HSA_STATUS_ERROR_NOT_INITIALIZED.into(),
        ),
        (
            "HSA_STATUS_ERROR_INVALID_CACHE",
            HSA_STATUS_ERROR_INVALID_CACHE.into(),
        ),
        (
            "HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS",
            HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS.into(),
        ),
        (
            "HSA_STATUS_ERROR_INVALID_CODE_OBJECT",
            HSA_STATUS_ERROR_INVALID_CODE_OBJECT.into(),
        ),
        (
            "HSA_STATUS_ERROR_INVALID_EXECUTABLE",
            HSA_STATUS_ERROR_INVALID_EXECUTABLE.into(),
        ),
        (
            "HSA_STATUS_ERROR_FROZEN_EXECUTABLE",
            HSA_STATUS_ERROR_FROZEN_EXECUTABLE.into(),
        ),
        (
            "HSA_STATUS_ERROR_INVALID_SYMBOL_NAME",
            HSA_STATUS_ERROR_INVALID_SYMBOL_NAME.into(),
        ),
        (
            "HSA_STATUS_ERROR_VARIABLE_ALREADY_DEFINED",
            HSA_STATUS_ERROR_VARIABLE_ALREADY_DEFINED.into(),
        ),
        (
            "HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER",
            HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER.into(),
        ),
        ("HSA_PROFILE_FULL", HSA_PROFILE_FULL.into()),
        (
            "HSA_DEFAULT_FLOAT_ROUNDING_MODE_DEFAULT",
            HSA_DEFAULT_FLOAT_ROUNDING_MODE_DEFAULT.into(),
        ),
        (
            "HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT",
            HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT.into(),
        ),
        (
            "HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE",
            HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE.into(),
        ),
        (
            "HSA_STATUS_ERROR_INVALID_RUNTIME_STATE",
            HSA_STATUS_ERROR_INVALID_RUNTIME_STATE.into(),
        ),
        ("HSA_STATUS_ERROR_FATAL", HSA_STATUS_ERROR_FATAL.into()),
        (
            "HSA_STATUS_ERROR_INVALID_MEMORY_POOL",
            HSA_STATUS_ERROR_INVALID_MEMORY_POOL.into(),
        ),
        (
            "HSA_STATUS_ERROR_RESOURCE_BUSY",
            HSA_STATUS_ERROR_RESOURCE_BUSY.into(),
        ),
        (
            "HSA_STATUS_ERROR_NOT_SUPPORTED",
            HSA_STATUS_ERROR_NOT_SUPPORTED.into(),
        ),
        ("HSA_AGENT_INFO_NAME", HSA_AGENT_INFO_NAME.into()),
        ("HSA_AGENT_INFO_DEVICE", HSA_AGENT_INFO_DEVICE.into()),
        (
            "HSA_AGENT_INFO_QUEUE_MIN_SIZE",
            HSA_AGENT_INFO_QUEUE_MIN_SIZE.into(),
        ),
        (
            "HSA_AGENT_INFO_QUEUE_MAX_SIZE",
            HSA_AGENT_INFO_QUEUE_MAX_SIZE.into(),
        ),
        ("HSA_DEVICE_TYPE_CPU", HSA_DEVICE_TYPE_CPU.into()),
        ("HSA_DEVICE_TYPE_GPU", HSA_DEVICE_TYPE_GPU.into()),
        ("HSA_DEVICE_TYPE_DSP", HSA_DEVICE_TYPE_DSP.into()),
        ("HSA_DEVICE_TYPE_AIE", HSA_DEVICE_TYPE_AIE.into()),
        ("HSA_QUEUE_TYPE_MULTI", HSA_QUEUE_TYPE_MULTI.into()),
        ("HSA_QUEUE_TYPE_SINGLE", HSA_QUEUE_TYPE_SINGLE.into()),
        ("HSA_SIGNAL_CONDITION_EQ", HSA_SIGNAL_CONDITION_EQ.into()),
        ("HSA_SIGNAL_CONDITION_NE", HSA_SIGNAL_CONDITION_NE.into()),
        ("HSA_SIGNAL_CONDITION_LT", HSA_SIGNAL_CONDITION_LT.into()),
        ("HSA_SIGNAL_CONDITION_GTE", HSA_SIGNAL_CONDITION_GTE.into()),
        ("HSA_WAIT_STATE_BLOCKED", HSA_WAIT_STATE_BLOCKED.into()),
        ("HSA_WAIT_STATE_ACTIVE", HSA_WAIT_STATE_ACTIVE.into()),
        (
            "HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY",
            HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY.into(),
        ),
        (
            "HSA_AMD_SYSTEM_INFO_EXT_VERSION_MAJOR",
            HSA_AMD_SYSTEM_INFO_EXT_VERSION_MAJOR.into(),
        ),
        (
            "HSA_AMD_SYSTEM_INFO_EXT_VERSION_MINOR",
            HSA_AMD_SYSTEM_INFO_EXT_VERSION_MINOR.into(),
        ),
        ("HSA_AMD_SEGMENT_GLOBAL", HSA_AMD_SEGMENT_GLOBAL.into()),
        (
            "HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT",
            HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT.into(),
        ),
        (
            "HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED",
            HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED.into(),
        ),
        (
            "HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED",
            HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED.into(),
        ),
        (
            "HSA_AMD_MEMORY_POOL_INFO_SEGMENT",
            HSA_AMD_MEMORY_POOL_INFO_SEGMENT.into(),
        ),
        (
            "HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS",
            HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS.into(),
        ),
        (
            "HSA_AMD_MEMORY_POOL_INFO_SIZE",
            HSA_AMD_MEMORY_POOL_INFO_SIZE.into(),
        ),
        (
            "HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED",
            HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED.into(),
        ),
        (
            "HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_GRANULE",
            HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_GRANULE.into(),
        ),
        (
            "HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALIGNMENT",
            HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALIGNMENT.into(),
        ),
        (
            "HSA_AMD_MEMORY_POOL_INFO_ACCESSIBLE_BY_ALL",
            HSA_AMD_MEMORY_POOL_INFO_ACCESSIBLE_BY_ALL.into(),
        ),
        (
            "HSA_AMD_MEMORY_POOL_INFO_ALLOC_MAX_SIZE",
            HSA_AMD_MEMORY_POOL_INFO_ALLOC_MAX_SIZE.into(),
        ),
        (
            "HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_REC_GRANULE",
            HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_REC_GRANULE.into(),
        ),
    ];
    let mut checked = 0;
    let mut absent = Vec::new();
    for &(name, value) in ours {
        match consts.get(name) {
            Some(&theirs) => {
                assert_eq!(
                    theirs, value,
                    "{name}: headers say {theirs}, src/hsa/sys.rs {value}"
                );
                checked += 1;
            }
            None => absent.push(name),
        }
    }
    eprintln!("{checked} values match; not in these headers (newer than them): {absent:?}");
    assert!(checked >= 40, "only {checked} values found in the headers");
}

#[test]
fn struct_layouts_match_the_system_headers() {
    let Some(code) = generated() else { return };
    let facts = layouts(&code);
    let size = |t: &str| facts.get(&format!("Size of {t}")).copied();
    let offset = |t: &str, f: &str| facts.get(&format!("Offset of field: {t}::{f}")).copied();
    use std::mem::{offset_of, size_of};
    assert_eq!(size("hsa_agent_s"), Some(size_of::<hsa_agent_t>()));
    assert_eq!(size("hsa_signal_s"), Some(size_of::<hsa_signal_t>()));
    assert_eq!(
        size("hsa_amd_memory_pool_s"),
        Some(size_of::<hsa_amd_memory_pool_t>())
    );
    assert_eq!(size("hsa_queue_s"), Some(size_of::<hsa_queue_t>()));
    for (t, ours) in [
        (
            "hsa_code_object_reader_s",
            size_of::<hsa_code_object_reader_t>(),
        ),
        ("hsa_executable_s", size_of::<hsa_executable_t>()),
        (
            "hsa_executable_symbol_s",
            size_of::<hsa_executable_symbol_t>(),
        ),
        (
            "hsa_loaded_code_object_s",
            size_of::<hsa_loaded_code_object_t>(),
        ),
    ] {
        assert_eq!(size(t), Some(ours), "{t}");
    }
    for (field, ours) in [
        ("type_", offset_of!(hsa_queue_t, type_)),
        ("features", offset_of!(hsa_queue_t, features)),
        ("base_address", offset_of!(hsa_queue_t, base_address)),
        ("doorbell_signal", offset_of!(hsa_queue_t, doorbell_signal)),
        ("size", offset_of!(hsa_queue_t, size)),
        ("reserved1", offset_of!(hsa_queue_t, reserved1)),
        ("id", offset_of!(hsa_queue_t, id)),
    ] {
        assert_eq!(
            offset("hsa_queue_s", field),
            Some(ours),
            "hsa_queue_t.{field}"
        );
    }
    assert_eq!(
        size("hsa_amd_packet_header_s"),
        Some(size_of::<hsa_amd_vendor_packet_header_t>())
    );
    for (field, ours) in [
        ("header", offset_of!(hsa_amd_vendor_packet_header_t, header)),
        (
            "AmdFormat",
            offset_of!(hsa_amd_vendor_packet_header_t, amd_format),
        ),
        (
            "reserved",
            offset_of!(hsa_amd_vendor_packet_header_t, reserved),
        ),
    ] {
        assert_eq!(
            offset("hsa_amd_packet_header_s", field),
            Some(ours),
            "hsa_amd_vendor_packet_header_t.{field}"
        );
    }
}

#[test]
fn resolved_functions_take_the_parameters_the_headers_declare() {
    let Some(code) = generated() else { return };
    let ours = normalise(include_str!("../src/hsa/sys.rs"));
    // (function in the headers, its type in src/hsa/sys.rs)
    let functions = [
        ("hsa_init", "hsa_init_fn"),
        ("hsa_status_string", "hsa_status_string_fn"),
        ("hsa_iterate_agents", "hsa_iterate_agents_fn"),
        ("hsa_agent_get_info", "hsa_agent_get_info_fn"),
        ("hsa_system_get_info", "hsa_system_get_info_fn"),
        (
            "hsa_amd_agent_iterate_memory_pools",
            "hsa_amd_agent_iterate_memory_pools_fn",
        ),
        (
            "hsa_amd_memory_pool_get_info",
            "hsa_amd_memory_pool_get_info_fn",
        ),
        (
            "hsa_amd_memory_pool_allocate",
            "hsa_amd_memory_pool_allocate_fn",
        ),
        ("hsa_amd_memory_pool_free", "hsa_amd_memory_pool_free_fn"),
        ("hsa_queue_create", "hsa_queue_create_fn"),
        ("hsa_queue_destroy", "hsa_queue_destroy_fn"),
        ("hsa_queue_load_write_index_relaxed", "hsa_queue_index_fn"),
        ("hsa_queue_load_read_index_scacquire", "hsa_queue_index_fn"),
        (
            "hsa_queue_add_write_index_relaxed",
            "hsa_queue_add_index_fn",
        ),
        ("hsa_signal_create", "hsa_signal_create_fn"),
        ("hsa_signal_destroy", "hsa_signal_destroy_fn"),
        ("hsa_signal_store_screlease", "hsa_signal_store_fn"),
        ("hsa_signal_load_scacquire", "hsa_signal_load_fn"),
        ("hsa_signal_wait_scacquire", "hsa_signal_wait_fn"),
        (
            "hsa_code_object_reader_create_from_memory",
            "hsa_code_object_reader_create_from_memory_fn",
        ),
        (
            "hsa_code_object_reader_destroy",
            "hsa_code_object_reader_destroy_fn",
        ),
        ("hsa_executable_create_alt", "hsa_executable_create_alt_fn"),
        (
            "hsa_executable_load_agent_code_object",
            "hsa_executable_load_agent_code_object_fn",
        ),
        ("hsa_executable_freeze", "hsa_executable_freeze_fn"),
        ("hsa_executable_destroy", "hsa_executable_destroy_fn"),
        (
            "hsa_executable_get_symbol_by_name",
            "hsa_executable_get_symbol_by_name_fn",
        ),
        (
            "hsa_executable_symbol_get_info",
            "hsa_executable_symbol_get_info_fn",
        ),
    ];
    for (f, ty) in functions {
        let theirs = arity(&code, &format!("pub fn {f}("))
            .unwrap_or_else(|| panic!("{f} is not declared in the headers"));
        let ours = arity(&ours, &format!("pub type {ty} = unsafe extern \"C\" fn("))
            .unwrap_or_else(|| panic!("no {ty} in src/hsa/sys.rs"));
        assert_eq!(
            ours, theirs,
            "{f}: {ours} parameters here ({ty}), {theirs} in the headers"
        );
    }
}
