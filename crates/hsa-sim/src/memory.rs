//! Allocation table. Every pool allocation is real, zeroed, page-aligned host memory (the NPU
//! shares system memory) rounded up to 4096 bytes, and is recorded so that any address inside it
//! (an interior pointer) resolves to `(base, size, pool)`, the way ROCR resolves packet VAs to
//! XDNA buffer objects.

use crate::consts::PAGE_SIZE;
use std::alloc::Layout;
use std::collections::BTreeMap;

/// One live allocation.
#[derive(Debug)]
pub struct Allocation {
    /// Unique for the lifetime of the runtime instance; never reused (unlike ROCR's BO handles).
    pub id: u64,
    pub base: usize,
    /// Rounded size in bytes.
    pub size: usize,
    /// Index of the pool in the topology.
    pub pool: usize,
    /// Runtime-internal allocations (queue rings) are not client allocations and cannot be freed
    /// through `hsa_amd_memory_pool_free`.
    pub internal: bool,
    /// The block obtained from the allocator (it may start before `base` and be larger, see
    /// `alloc_block`), released as a whole.
    raw: usize,
    raw_size: usize,
}

impl Allocation {
    pub fn end(&self) -> usize {
        self.base + self.size
    }
}

/// Why an allocation failed.
#[derive(Debug, PartialEq, Eq)]
pub enum AllocError {
    OutOfResources,
}

#[derive(Debug, Default)]
pub struct MemoryTable {
    by_base: BTreeMap<usize, Allocation>,
    /// Bytes in use per pool index.
    used: BTreeMap<usize, usize>,
    next_id: u64,
}

/// Rounds up to the page size; `None` on overflow.
pub fn round_to_page(size: usize) -> Option<usize> {
    size.checked_add(PAGE_SIZE - 1)
        .map(|s| s & !(PAGE_SIZE - 1))
}

impl MemoryTable {
    /// Allocates `size` bytes (already validated non-zero) in `pool`, whose capacity is `limit`.
    /// `avoid_insts_alias` (dev heap) places the block so that no address in it equals its own
    /// instruction device address (see [`aliases_device_address`]).
    pub fn allocate(
        &mut self,
        pool: usize,
        size: usize,
        limit: usize,
        internal: bool,
        avoid_insts_alias: bool,
    ) -> Result<usize, AllocError> {
        let rounded = round_to_page(size).ok_or(AllocError::OutOfResources)?;
        let used = self.used.get(&pool).copied().unwrap_or(0);
        if rounded > limit || used + rounded > limit {
            return Err(AllocError::OutOfResources);
        }
        let layout =
            Layout::from_size_align(rounded, PAGE_SIZE).map_err(|_| AllocError::OutOfResources)?;
        let (ptr, raw, raw_layout) = alloc_block(layout, avoid_insts_alias)?;
        self.next_id += 1;
        let base = ptr as usize;
        self.by_base.insert(
            base,
            Allocation {
                id: self.next_id,
                base,
                size: rounded,
                pool,
                internal,
                raw: raw as usize,
                raw_size: raw_layout.size(),
            },
        );
        *self.used.entry(pool).or_insert(0) += rounded;
        Ok(base)
    }

    /// Frees the allocation whose base is `base`. Returns false if `base` is not the exact base
    /// of a live (non-internal unless `internal` is set) allocation.
    pub fn free(&mut self, base: usize, internal: bool) -> bool {
        match self.by_base.get(&base) {
            Some(a) if a.internal == internal => {}
            _ => return false,
        }
        let Some(a) = self.by_base.remove(&base) else {
            return false;
        };
        if let Some(u) = self.used.get_mut(&a.pool) {
            *u -= a.size;
        }
        release(&a);
        true
    }

    /// The allocation containing `addr` (base or interior pointer).
    pub fn lookup(&self, addr: usize) -> Option<&Allocation> {
        let (_, a) = self.by_base.range(..=addr).next_back()?;
        (addr < a.end()).then_some(a)
    }

    /// The allocation containing the whole byte range `[addr, addr + len)`, if any.
    pub fn lookup_range(&self, addr: usize, len: usize) -> Option<&Allocation> {
        let a = self.lookup(addr)?;
        let end = addr.checked_add(len)?;
        (end <= a.end()).then_some(a)
    }

    /// Bytes in use in `pool`.
    pub fn used(&self, pool: usize) -> usize {
        self.used.get(&pool).copied().unwrap_or(0)
    }

    /// Number of live allocations (client and internal).
    pub fn len(&self) -> usize {
        self.by_base.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_base.is_empty()
    }

    /// Copies `len` bytes at `addr` out of a live allocation; `None` if the range is not
    /// entirely inside one allocation.
    pub fn read(&self, addr: usize, len: usize) -> Option<Vec<u8>> {
        self.lookup_range(addr, len)?;
        let mut out = vec![0u8; len];
        // SAFETY: [addr, addr+len) lies inside a live allocation owned by this table (checked
        // above), and `out` is a distinct Vec of exactly `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), len) };
        Some(out)
    }

    /// Writes `bytes` at `addr` inside a live allocation; false if out of bounds.
    pub fn write(&self, addr: usize, bytes: &[u8]) -> bool {
        if self.lookup_range(addr, bytes.len()).is_none() {
            return false;
        }
        // SAFETY: the destination range lies inside a live allocation owned by this table
        // (checked above); the source is a distinct Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
        true
    }
}

/// True if some address in `[base, base + len)` has low 32 bits equal to its instruction device
/// address `0x04000000 | (va & 0x02FFFFFF)`, i.e. low word in 0x04000000..=0x04FFFFFF or
/// 0x06000000..=0x06FFFFFF. For such an address the runtime's rewrite of payload `data[2]` would
/// be a no-op and a reused payload would go unnoticed, so the dev heap never hands them out.
pub fn aliases_device_address(base: usize, len: usize) -> bool {
    let (lo, hi) = (base as u64, base as u64 + len as u64 - 1);
    let window = lo & !0xFFFF_FFFF;
    [window, window + (1 << 32)].iter().any(|w| {
        [(0x0400_0000u64, 0x04FF_FFFFu64), (0x0600_0000, 0x06FF_FFFF)]
            .iter()
            .any(|(a, b)| lo <= w + b && w + a <= hi)
    })
}

/// Extra room allocated around a dev-heap block of `size` bytes that would alias, so that a
/// non-aliasing start is always inside: a block that fits the 16 MiB gap between the two windows
/// moves at most one window plus its own size (34 MiB covers every block up to 16 MiB); a larger
/// one must clear both windows and the gap (48 MiB) plus its own size. A fixed 34 MiB for every
/// size made a 64 MiB block fail whenever the allocator happened to place it across the windows.
fn alias_skip(size: usize) -> usize {
    const WINDOW: usize = 16 << 20;
    if size <= WINDOW {
        34 << 20
    } else {
        3 * WINDOW + size
    }
}

/// The first page offset in `0..=skip` at which `[raw + off, raw + off + size)` aliases no
/// instruction device address.
fn non_aliasing_offset(raw: usize, size: usize, skip: usize) -> Option<usize> {
    (0..=skip)
        .step_by(PAGE_SIZE)
        .find(|&off| !aliases_device_address(raw + off, size))
}

/// Allocates a zeroed block of `layout`; returns the block handed out and the raw block to free.
/// With `avoid_insts_alias`, a block whose addresses alias instruction device addresses is
/// replaced by a larger raw block inside which a non-aliasing start is chosen (the heap may sit
/// inside an aliasing window for many consecutive small blocks, so retrying is not enough).
fn alloc_block(
    layout: Layout,
    avoid_insts_alias: bool,
) -> Result<(*mut u8, *mut u8, Layout), AllocError> {
    // SAFETY: the layout has a non-zero size (at least one page).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(AllocError::OutOfResources);
    }
    if !avoid_insts_alias || !aliases_device_address(ptr as usize, layout.size()) {
        return Ok((ptr, ptr, layout));
    }
    // SAFETY: ptr was returned by alloc_zeroed with `layout` above and never handed out.
    unsafe { std::alloc::dealloc(ptr, layout) };
    alloc_outside_aliases(layout)
}

/// A zeroed block of `layout` placed inside a raw block `alias_skip` bytes larger so that it
/// does not alias instruction device addresses; returns the block, the raw block and its layout.
fn alloc_outside_aliases(layout: Layout) -> Result<(*mut u8, *mut u8, Layout), AllocError> {
    let skip = alias_skip(layout.size());
    let big = layout
        .size()
        .checked_add(skip)
        .and_then(|n| Layout::from_size_align(n, PAGE_SIZE).ok())
        .ok_or(AllocError::OutOfResources)?;
    // Not `alloc_zeroed`: with page alignment the standard allocator zeroes by writing every
    // byte, which would make all the skipped bytes resident for each such block (dev-heap blocks
    // live as long as their kernel, so a heap sitting in an aliasing window cost 34 MiB of RSS
    // per loaded kernel). Only the part handed out is zeroed; the rest is never touched.
    // SAFETY: `big` has a non-zero size.
    let raw = unsafe { std::alloc::alloc(big) };
    if raw.is_null() {
        return Err(AllocError::OutOfResources);
    }
    match non_aliasing_offset(raw as usize, layout.size(), skip) {
        Some(off) => {
            // SAFETY: off + layout.size() <= big.size(), so the block lies inside `raw`, which
            // is writable and not yet handed out.
            let block = unsafe { raw.add(off) };
            // SAFETY: as above; `block` is valid for layout.size() bytes.
            unsafe { std::ptr::write_bytes(block, 0, layout.size()) };
            Ok((block, raw, big))
        }
        None => {
            // SAFETY: raw was returned by alloc with `big` and never handed out.
            unsafe { std::alloc::dealloc(raw, big) };
            Err(AllocError::OutOfResources)
        }
    }
}

fn release(a: &Allocation) {
    if let Ok(layout) = Layout::from_size_align(a.raw_size, PAGE_SIZE) {
        // SAFETY: `a.raw` was returned by `alloc`/`alloc_zeroed` with exactly this layout and is removed
        // from the table before being released, so it is freed once.
        unsafe { std::alloc::dealloc(a.raw as *mut u8, layout) };
    }
}

impl Drop for MemoryTable {
    fn drop(&mut self) {
        for a in self.by_base.values() {
            release(a);
        }
        self.by_base.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's resident set size in bytes, from /proc/self/status.
    fn rss() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let kb: usize = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        kb * 1024
    }

    /// Every block size the dev heap can hold (up to its 64 MiB) finds a non-aliasing start
    /// inside its raw block wherever the allocator puts that raw block: a fixed 34 MiB of room
    /// made a 64 MiB allocation fail on machines whose allocator placed it across the windows.
    #[test]
    fn every_size_and_placement_finds_a_non_aliasing_start() {
        for size in [
            PAGE_SIZE,
            1 << 20,
            16 << 20,
            17 << 20,
            18 << 20,
            19 << 20,
            40 << 20,
            64 << 20,
        ] {
            let skip = alias_skip(size);
            // Raw blocks starting anywhere in a 4 GiB window (every 256 KiB), and near its end.
            for raw in (0..(1usize << 32))
                .step_by(256 << 10)
                .chain([(1 << 32) - PAGE_SIZE])
            {
                let raw = (7usize << 32) + raw;
                assert!(
                    non_aliasing_offset(raw, size, skip).is_some(),
                    "{size} bytes at {raw:#x}: no start within {skip} bytes"
                );
            }
        }
    }

    /// Dev-heap blocks placed away from an aliasing window keep only their own pages resident
    /// (they used to zero the whole 34 MiB raw block: 16 such kernels cost 544 MiB of RSS).
    #[test]
    fn blocks_placed_outside_aliases_touch_only_their_pages() {
        let layout = Layout::from_size_align(2 * PAGE_SIZE, PAGE_SIZE).unwrap();
        let before = rss();
        let blocks: Vec<_> = (0..16)
            .map(|_| alloc_outside_aliases(layout).unwrap())
            .collect();
        let grown = rss().saturating_sub(before);
        for &(block, raw, big) in &blocks {
            assert!(!aliases_device_address(block as usize, layout.size()));
            // SAFETY: `block` is valid for layout.size() zeroed bytes.
            let bytes = unsafe { std::slice::from_raw_parts(block, layout.size()) };
            assert!(bytes.iter().all(|&b| b == 0));
            // SAFETY: `raw` was allocated with `big` and is freed once.
            unsafe { std::alloc::dealloc(raw, big) };
        }
        assert!(
            grown < 64 << 20,
            "16 blocks made {} MiB resident",
            grown >> 20
        );
    }
}
