//! Memory pools of an agent and RAII allocations from them.

use std::ffi::c_void;
use std::ptr::NonNull;

use super::error::HsaError;
use super::runtime::Runtime;
use super::sys::*;

/// What a memory pool reports about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolDesc {
    pub pool: hsa_amd_memory_pool_t,
    pub segment: hsa_amd_segment_t,
    pub global_flags: u32,
    pub size: usize,
    pub alloc_allowed: bool,
    pub granule: usize,
    /// Recommended granule: 0 marks ROCR's AIE dev heap.
    pub rec_granule: usize,
    pub alignment: usize,
    pub alloc_max: usize,
}

/// The three pools the backend uses on one AIE agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentPools {
    /// Holds PDIs and instruction streams (ROCR requires them there): global, coarse-grained,
    /// recommended granule 0 (the 64 MiB dev heap).
    pub dev_heap: PoolDesc,
    /// Tensors: global, coarse-grained, recommended granule non-zero.
    pub data: PoolDesc,
    /// Dispatch payloads and kernarg arrays: the kernarg pool, or the data pool when the agent has
    /// none.
    pub kernarg: PoolDesc,
}

/// Picks the dev heap, data and kernarg pools by their properties (never by position).
pub fn select_pools(pools: &[PoolDesc]) -> Result<AgentPools, String> {
    let global = |p: &&PoolDesc| p.segment == HSA_AMD_SEGMENT_GLOBAL && p.alloc_allowed;
    let coarse =
        |p: &&PoolDesc| p.global_flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED != 0;
    let dev_heap = pools
        .iter()
        .filter(global)
        .filter(coarse)
        .find(|p| p.rec_granule == 0)
        .ok_or("no dev-heap pool (global, coarse-grained, recommended granule 0)")?;
    let data = pools
        .iter()
        .filter(global)
        .filter(coarse)
        .find(|p| p.rec_granule != 0)
        .ok_or("no data pool (global, coarse-grained, recommended granule > 0)")?;
    let kernarg = pools
        .iter()
        .filter(global)
        .find(|p| {
            p.global_flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT != 0 && p.rec_granule != 0
        })
        .unwrap_or(data);
    Ok(AgentPools {
        dev_heap: *dev_heap,
        data: *data,
        kernarg: *kernarg,
    })
}

/// An allocation from an HSA memory pool, freed on drop. The memory is host-mapped (the NPU shares
/// system memory), so the host reads and writes it directly.
#[derive(Debug)]
pub struct PoolAlloc {
    runtime: &'static Runtime,
    ptr: NonNull<u8>,
    size: usize,
}

// SAFETY: the allocation is plain memory owned by this value; HSA allows freeing it from any
// thread.
unsafe impl Send for PoolAlloc {}
// SAFETY: shared access only hands out the address; reads and writes go through `&mut self` or
// through raw pointers whose synchronisation is the caller's.
unsafe impl Sync for PoolAlloc {}

impl PoolAlloc {
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The address the device uses (the same as the host address on these APUs).
    pub fn device_addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the allocation is `size` bytes of host-mapped memory owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.size) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.size) }
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<(), OutOfBounds> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(OutOfBounds {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    /// Copies `data` to `offset`. Shared access: callers that write overlapping ranges from
    /// several threads at once get unspecified bytes, as with any shared device memory.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), OutOfBounds> {
        self.check_range(offset, data.len())?;
        // SAFETY: the range lies inside the allocation (checked above); `data` is a separate Rust
        // slice, so the regions do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len())
        };
        Ok(())
    }

    /// Copies `out.len()` bytes from `offset` into `out`.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfBounds> {
        self.check_range(offset, out.len())?;
        // SAFETY: the range lies inside the allocation (checked above); `out` is a separate Rust
        // slice, so the regions do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// Sets `len` bytes from `offset` to `value`.
    pub fn fill_at(&self, offset: usize, len: usize, value: u8) -> Result<(), OutOfBounds> {
        self.check_range(offset, len)?;
        // SAFETY: the range lies inside the allocation (checked above).
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(offset), value, len) };
        Ok(())
    }
}

/// An access outside an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{len} bytes at offset {offset} are outside the {size}-byte allocation")]
pub struct OutOfBounds {
    pub offset: usize,
    pub len: usize,
    pub size: usize,
}

impl Drop for PoolAlloc {
    fn drop(&mut self) {
        // A failed free cannot be acted on in a destructor: the runtime keeps the memory.
        // SAFETY: ptr is the base of a live allocation of this runtime, freed exactly once here.
        let _ = unsafe { (self.runtime.api().hsa_amd_memory_pool_free)(self.ptr.as_ptr().cast()) };
    }
}

impl Runtime {
    /// The memory pools of `agent`, in the runtime's order.
    pub fn pools(&'static self, agent: hsa_agent_t) -> Result<Vec<PoolDesc>, HsaError> {
        let mut handles = Vec::new();
        self.iterate_pools(agent, |pool| handles.push(pool))?;
        handles
            .into_iter()
            .map(|pool| self.pool_desc(pool))
            .collect()
    }

    fn pool_desc(&self, pool: hsa_amd_memory_pool_t) -> Result<PoolDesc, HsaError> {
        Ok(PoolDesc {
            pool,
            segment: self.pool_info::<u32>(pool, HSA_AMD_MEMORY_POOL_INFO_SEGMENT)?,
            global_flags: self.pool_info::<u32>(pool, HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS)?,
            size: self.pool_info::<usize>(pool, HSA_AMD_MEMORY_POOL_INFO_SIZE)?,
            alloc_allowed: self
                .pool_info::<bool>(pool, HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED)?,
            granule: self
                .pool_info::<usize>(pool, HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_GRANULE)?,
            rec_granule: self
                .pool_info::<usize>(pool, HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_REC_GRANULE)?,
            alignment: self
                .pool_info::<usize>(pool, HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALIGNMENT)?,
            alloc_max: self.pool_info::<usize>(pool, HSA_AMD_MEMORY_POOL_INFO_ALLOC_MAX_SIZE)?,
        })
    }

    fn pool_info<T: PoolInfoValue>(
        &self,
        pool: hsa_amd_memory_pool_t,
        attribute: hsa_amd_memory_pool_info_t,
    ) -> Result<T, HsaError> {
        let mut value = T::default();
        // SAFETY: the attribute's C type is T (u32 for enums and flags, size_t for sizes, bool for
        // the two flags), and `value` is valid for writes of that size.
        let rc = unsafe {
            (self.api().hsa_amd_memory_pool_get_info)(
                pool,
                attribute,
                (&mut value as *mut T).cast::<c_void>(),
            )
        };
        self.check("hsa_amd_memory_pool_get_info", rc)?;
        Ok(value)
    }

    /// Allocates `size` bytes from `pool`.
    pub fn allocate(
        &'static self,
        pool: hsa_amd_memory_pool_t,
        size: usize,
    ) -> Result<PoolAlloc, HsaError> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is valid for the runtime to write the allocation's address.
        let rc = unsafe { (self.api().hsa_amd_memory_pool_allocate)(pool, size, 0, &mut ptr) };
        self.check("hsa_amd_memory_pool_allocate", rc)?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(HsaError::Call {
            call: "hsa_amd_memory_pool_allocate",
            status: HSA_STATUS_ERROR,
            description: "the runtime returned success and a NULL pointer".into(),
        })?;
        Ok(PoolAlloc {
            runtime: self,
            ptr,
            size,
        })
    }
}

/// The C types `hsa_amd_memory_pool_get_info` writes.
trait PoolInfoValue: Default + Copy {}
impl PoolInfoValue for u32 {}
impl PoolInfoValue for usize {}
impl PoolInfoValue for bool {}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(handle: u64, flags: u32, rec_granule: usize) -> PoolDesc {
        PoolDesc {
            pool: hsa_amd_memory_pool_t { handle },
            segment: HSA_AMD_SEGMENT_GLOBAL,
            global_flags: flags,
            size: 1 << 30,
            alloc_allowed: true,
            granule: 4096,
            rec_granule,
            alignment: 4096,
            alloc_max: 1 << 30,
        }
    }

    #[test]
    fn rocr_aie_pool_layout() {
        // ROCR's order: {kernarg|coarse, 4096}, {coarse, 0} (dev heap), {coarse, 4096}.
        let pools = [pool(1, 5, 4096), pool(2, 4, 0), pool(3, 4, 4096)];
        let sel = select_pools(&pools).unwrap();
        assert_eq!(sel.dev_heap.pool.handle, 2);
        assert_eq!(sel.data.pool.handle, 1);
        assert_eq!(sel.kernarg.pool.handle, 1);
    }

    #[test]
    fn kernarg_falls_back_to_data_and_missing_pools_are_named() {
        let sel = select_pools(&[pool(2, 4, 0), pool(3, 4, 4096)]).unwrap();
        assert_eq!(sel.kernarg.pool.handle, 3);
        let err = select_pools(&[pool(3, 4, 4096)]).unwrap_err();
        assert!(err.contains("dev-heap"), "{err}");
        let err = select_pools(&[pool(2, 4, 0)]).unwrap_err();
        assert!(err.contains("data pool"), "{err}");
        let mut locked = pool(2, 4, 0);
        locked.alloc_allowed = false;
        assert!(select_pools(&[locked, pool(3, 4, 4096)]).is_err());
    }
}
