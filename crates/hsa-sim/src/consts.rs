//! Numeric constants of the HSA / ROCR ABI (x86-64, LP64), declared from the documented values.
//! All enums are 32-bit in C; they are carried as `u32` here.

/// `hsa_status_t`.
pub type Status = u32;

pub const HSA_STATUS_SUCCESS: Status = 0x0;
pub const HSA_STATUS_INFO_BREAK: Status = 0x1;
pub const HSA_STATUS_ERROR: Status = 0x1000;
pub const HSA_STATUS_ERROR_INVALID_ARGUMENT: Status = 0x1001;
pub const HSA_STATUS_ERROR_INVALID_QUEUE_CREATION: Status = 0x1002;
pub const HSA_STATUS_ERROR_INVALID_ALLOCATION: Status = 0x1003;
pub const HSA_STATUS_ERROR_INVALID_AGENT: Status = 0x1004;
pub const HSA_STATUS_ERROR_INVALID_REGION: Status = 0x1005;
pub const HSA_STATUS_ERROR_INVALID_SIGNAL: Status = 0x1006;
pub const HSA_STATUS_ERROR_INVALID_QUEUE: Status = 0x1007;
pub const HSA_STATUS_ERROR_OUT_OF_RESOURCES: Status = 0x1008;
pub const HSA_STATUS_ERROR_INVALID_PACKET_FORMAT: Status = 0x1009;
pub const HSA_STATUS_ERROR_RESOURCE_FREE: Status = 0x100A;
pub const HSA_STATUS_ERROR_NOT_INITIALIZED: Status = 0x100B;
pub const HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS: Status = 0x100D;
pub const HSA_STATUS_ERROR_INVALID_CODE_OBJECT: Status = 0x1010;
pub const HSA_STATUS_ERROR_INVALID_EXECUTABLE: Status = 0x1011;
pub const HSA_STATUS_ERROR_FROZEN_EXECUTABLE: Status = 0x1012;
pub const HSA_STATUS_ERROR_INVALID_SYMBOL_NAME: Status = 0x1013;
pub const HSA_STATUS_ERROR_VARIABLE_ALREADY_DEFINED: Status = 0x1014;
pub const HSA_STATUS_ERROR_INVALID_EXECUTABLE_SYMBOL: Status = 0x1019;
pub const HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER: Status = 0x1021;
pub const HSA_STATUS_ERROR_INVALID_CACHE: Status = 0x1022;
pub const HSA_STATUS_ERROR_INVALID_RUNTIME_STATE: Status = 0x1025;
pub const HSA_STATUS_ERROR_FATAL: Status = 0x1026;
pub const HSA_STATUS_ERROR_INVALID_MEMORY_POOL: Status = 0x28;
pub const HSA_STATUS_ERROR_RESOURCE_BUSY: Status = 0x2E;
pub const HSA_STATUS_ERROR_NOT_SUPPORTED: Status = 0x2F;

/// Every status with its name and description, for `hsa_status_string`.
pub const STATUS_STRINGS: &[(Status, &std::ffi::CStr)] = &[
    (HSA_STATUS_SUCCESS, c"HSA_STATUS_SUCCESS: The function has been executed successfully."),
    (HSA_STATUS_INFO_BREAK, c"HSA_STATUS_INFO_BREAK: A traversal over a list of elements has been interrupted by the application before completing."),
    (HSA_STATUS_ERROR, c"HSA_STATUS_ERROR: A generic error has occurred."),
    (HSA_STATUS_ERROR_INVALID_ARGUMENT, c"HSA_STATUS_ERROR_INVALID_ARGUMENT: One of the actual arguments does not meet a precondition stated in the documentation of the corresponding formal argument."),
    (HSA_STATUS_ERROR_INVALID_QUEUE_CREATION, c"HSA_STATUS_ERROR_INVALID_QUEUE_CREATION: The requested queue creation is not valid."),
    (HSA_STATUS_ERROR_INVALID_ALLOCATION, c"HSA_STATUS_ERROR_INVALID_ALLOCATION: The requested allocation is not valid."),
    (HSA_STATUS_ERROR_INVALID_AGENT, c"HSA_STATUS_ERROR_INVALID_AGENT: The agent is invalid."),
    (HSA_STATUS_ERROR_INVALID_REGION, c"HSA_STATUS_ERROR_INVALID_REGION: The memory region is invalid."),
    (HSA_STATUS_ERROR_INVALID_SIGNAL, c"HSA_STATUS_ERROR_INVALID_SIGNAL: The signal is invalid."),
    (HSA_STATUS_ERROR_INVALID_QUEUE, c"HSA_STATUS_ERROR_INVALID_QUEUE: The queue is invalid."),
    (HSA_STATUS_ERROR_OUT_OF_RESOURCES, c"HSA_STATUS_ERROR_OUT_OF_RESOURCES: The runtime failed to allocate the necessary resources."),
    (HSA_STATUS_ERROR_INVALID_PACKET_FORMAT, c"HSA_STATUS_ERROR_INVALID_PACKET_FORMAT: The AQL packet is malformed."),
    (HSA_STATUS_ERROR_RESOURCE_FREE, c"HSA_STATUS_ERROR_RESOURCE_FREE: An error has been detected while releasing a resource."),
    (HSA_STATUS_ERROR_NOT_INITIALIZED, c"HSA_STATUS_ERROR_NOT_INITIALIZED: An API other than hsa_init has been invoked while the reference count of the HSA runtime is zero."),
    (HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS, c"HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS: The arguments passed to a functions are not compatible."),
    (HSA_STATUS_ERROR_INVALID_CODE_OBJECT, c"HSA_STATUS_ERROR_INVALID_CODE_OBJECT: The code object is invalid."),
    (HSA_STATUS_ERROR_INVALID_EXECUTABLE, c"HSA_STATUS_ERROR_INVALID_EXECUTABLE: The executable is invalid."),
    (HSA_STATUS_ERROR_FROZEN_EXECUTABLE, c"HSA_STATUS_ERROR_FROZEN_EXECUTABLE: The executable is frozen."),
    (HSA_STATUS_ERROR_INVALID_SYMBOL_NAME, c"HSA_STATUS_ERROR_INVALID_SYMBOL_NAME: There is no symbol with the given name."),
    (HSA_STATUS_ERROR_VARIABLE_ALREADY_DEFINED, c"HSA_STATUS_ERROR_VARIABLE_ALREADY_DEFINED: The variable is already defined."),
    (HSA_STATUS_ERROR_INVALID_EXECUTABLE_SYMBOL, c"HSA_STATUS_ERROR_INVALID_EXECUTABLE_SYMBOL: The executable symbol is invalid."),
    (HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER, c"HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER: The code object reader is invalid."),
    (HSA_STATUS_ERROR_INVALID_CACHE, c"HSA_STATUS_ERROR_INVALID_CACHE: The cache is invalid."),
    (HSA_STATUS_ERROR_INVALID_RUNTIME_STATE, c"HSA_STATUS_ERROR_INVALID_RUNTIME_STATE: The runtime is in an invalid state."),
    (HSA_STATUS_ERROR_FATAL, c"HSA_STATUS_ERROR_FATAL: A fatal error has occurred (hsa-sim: the queue is in an error state)."),
    (HSA_STATUS_ERROR_INVALID_MEMORY_POOL, c"HSA_STATUS_ERROR_INVALID_MEMORY_POOL: The memory pool is invalid."),
    (HSA_STATUS_ERROR_RESOURCE_BUSY, c"HSA_STATUS_ERROR_RESOURCE_BUSY: The resource is busy."),
    (HSA_STATUS_ERROR_NOT_SUPPORTED, c"HSA_STATUS_ERROR_NOT_SUPPORTED: The operation is not supported."),
];

// hsa_device_type_t
pub const HSA_DEVICE_TYPE_CPU: u32 = 0;
pub const HSA_DEVICE_TYPE_AIE: u32 = 3;

// hsa_agent_info_t (core) and hsa_amd_agent_info_t (AMD extension)
pub const HSA_AGENT_INFO_NAME: u32 = 0;
pub const HSA_AGENT_INFO_VENDOR_NAME: u32 = 1;
pub const HSA_AGENT_INFO_FEATURE: u32 = 2;
pub const HSA_AGENT_INFO_MACHINE_MODEL: u32 = 3;
pub const HSA_AGENT_INFO_PROFILE: u32 = 4;
pub const HSA_AGENT_INFO_WAVEFRONT_SIZE: u32 = 6;
pub const HSA_AGENT_INFO_WORKGROUP_MAX_SIZE: u32 = 8;
pub const HSA_AGENT_INFO_GRID_MAX_SIZE: u32 = 10;
pub const HSA_AGENT_INFO_FBARRIER_MAX_SIZE: u32 = 11;
pub const HSA_AGENT_INFO_QUEUES_MAX: u32 = 12;
pub const HSA_AGENT_INFO_QUEUE_MIN_SIZE: u32 = 13;
pub const HSA_AGENT_INFO_QUEUE_MAX_SIZE: u32 = 14;
pub const HSA_AGENT_INFO_QUEUE_TYPE: u32 = 15;
pub const HSA_AGENT_INFO_NODE: u32 = 16;
pub const HSA_AGENT_INFO_DEVICE: u32 = 17;
pub const HSA_AGENT_INFO_CACHE_SIZE: u32 = 18;
pub const HSA_AGENT_INFO_VERSION_MAJOR: u32 = 21;
pub const HSA_AGENT_INFO_VERSION_MINOR: u32 = 22;
pub const HSA_AMD_AGENT_INFO_CHIP_ID: u32 = 0xA000;
pub const HSA_AMD_AGENT_INFO_COMPUTE_UNIT_COUNT: u32 = 0xA002;
pub const HSA_AMD_AGENT_INFO_DRIVER_NODE_ID: u32 = 0xA004;
pub const HSA_AMD_AGENT_INFO_BDFID: u32 = 0xA006;
pub const HSA_AMD_AGENT_INFO_PRODUCT_NAME: u32 = 0xA009;
pub const HSA_AMD_AGENT_INFO_UUID: u32 = 0xA011;
pub const HSA_AMD_AGENT_INFO_SVM_DIRECT_HOST_ACCESS: u32 = 0xA013;

pub const HSA_AGENT_FEATURE_AGENT_DISPATCH: u32 = 2;
pub const HSA_PROFILE_BASE: u32 = 0;
pub const HSA_MACHINE_MODEL_LARGE: u32 = 1;

// hsa_queue_type_t
pub const HSA_QUEUE_TYPE_MULTI: u32 = 0;
pub const HSA_QUEUE_TYPE_SINGLE: u32 = 1;
pub const HSA_QUEUE_TYPE_COOPERATIVE: u32 = 2;

// hsa_signal_condition_t / hsa_wait_state_t
pub const HSA_SIGNAL_CONDITION_EQ: u32 = 0;
pub const HSA_SIGNAL_CONDITION_NE: u32 = 1;
pub const HSA_SIGNAL_CONDITION_LT: u32 = 2;
pub const HSA_SIGNAL_CONDITION_GTE: u32 = 3;
pub const HSA_WAIT_STATE_BLOCKED: u32 = 0;
pub const HSA_WAIT_STATE_ACTIVE: u32 = 1;

// hsa_system_info_t
pub const HSA_SYSTEM_INFO_VERSION_MAJOR: u32 = 0;
pub const HSA_SYSTEM_INFO_VERSION_MINOR: u32 = 1;
pub const HSA_SYSTEM_INFO_TIMESTAMP: u32 = 2;
pub const HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY: u32 = 3;
pub const HSA_SYSTEM_INFO_SIGNAL_MAX_WAIT: u32 = 4;
pub const HSA_SYSTEM_INFO_ENDIANNESS: u32 = 5;
pub const HSA_SYSTEM_INFO_MACHINE_MODEL: u32 = 6;
pub const HSA_SYSTEM_INFO_EXTENSIONS: u32 = 7;
pub const HSA_AMD_SYSTEM_INFO_EXT_VERSION_MAJOR: u32 = 0x207;
pub const HSA_AMD_SYSTEM_INFO_EXT_VERSION_MINOR: u32 = 0x208;

// Memory pools (hsa_amd_memory_pool_info_t and friends)
pub const HSA_AMD_SEGMENT_GLOBAL: u32 = 0;
pub const HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT: u32 = 1;
pub const HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED: u32 = 2;
pub const HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED: u32 = 4;
pub const HSA_AMD_MEMORY_POOL_INFO_SEGMENT: u32 = 0;
pub const HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS: u32 = 1;
pub const HSA_AMD_MEMORY_POOL_INFO_SIZE: u32 = 2;
pub const HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED: u32 = 5;
pub const HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_GRANULE: u32 = 6;
pub const HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALIGNMENT: u32 = 7;
pub const HSA_AMD_MEMORY_POOL_INFO_ACCESSIBLE_BY_ALL: u32 = 15;
pub const HSA_AMD_MEMORY_POOL_INFO_ALLOC_MAX_SIZE: u32 = 16;
pub const HSA_AMD_MEMORY_POOL_INFO_LOCATION: u32 = 17;
pub const HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_REC_GRANULE: u32 = 18;
pub const HSA_AMD_MEMORY_POOL_LOCATION_CPU: u32 = 0;
pub const HSA_AMD_AGENT_MEMORY_POOL_INFO_ACCESS: u32 = 0;
pub const HSA_AMD_MEMORY_POOL_ACCESS_ALLOWED_BY_DEFAULT: u32 = 1;

// AQL / AMD vendor packet header
pub const HSA_PACKET_TYPE_VENDOR_SPECIFIC: u8 = 0;
pub const HSA_PACKET_TYPE_INVALID: u8 = 1;
/// `HSA_AMD_PACKET_TYPE_AIE_ERT` in Gen A0..A2 headers.
pub const HSA_AMD_PACKET_TYPE_AIE_ERT: u8 = 3;
/// `HSA_AMD_PACKET_TYPE_RESERVED200`, the AIE ERT format byte of Gen A3.
pub const HSA_AMD_PACKET_TYPE_RESERVED200: u8 = 200;

// AIE ERT enums
pub const HSA_AMD_AIE_ERT_STATE_NEW: u32 = 1;
pub const HSA_AMD_AIE_ERT_START_CU: u32 = 0;
pub const HSA_AMD_AIE_ERT_CMD_CHAIN: u32 = 19;

// Gen B
pub const HSA_AMD_AIE_PACKET_TYPE_READY: u8 = 0;
pub const HSA_AMD_AIE_PACKET_OPCODE_KMQ: u16 = 0;
pub const HSA_AMD_AIE_KERNEL_DISPATCH_COUNT: u16 = 24;

/// Size of one queue slot in bytes.
pub const PACKET_SIZE: usize = 64;
/// Packets per AIE queue (QUEUE_MIN_SIZE = QUEUE_MAX_SIZE).
pub const AIE_QUEUE_SIZE: u32 = 64;
/// Page size used for rounding and alignment of every allocation.
pub const PAGE_SIZE: usize = 4096;
/// Size of an AIE agent's device heap (pool 1).
pub const DEV_HEAP_SIZE: usize = 64 << 20;
/// Distinct PDIs one queue can hold (one CU-mask bit each).
pub const MAX_PDIS_PER_QUEUE: usize = 32;
/// Device-address window of instruction buffers: `0x04000000 | (va & 0x02FFFFFF)`.
pub const INSTS_DEVICE_BASE: u32 = 0x0400_0000;
pub const INSTS_DEVICE_MASK: u64 = 0x02FF_FFFF;
