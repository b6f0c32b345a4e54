//! Tensor buffers: one data-pool allocation each, behind ggml's `ggml_backend_buffer_i`.
//!
//! Every access is bounds-checked against the allocation (an out-of-range request is logged and
//! ignored, never a wild write).

use std::ffi::c_void;

use super::guard::guard;
use super::handles;
use super::sys::*;
use crate::hsa::memory::{OutOfBounds, PoolAlloc};

/// The context of one of our buffers.
#[derive(Debug)]
struct Buffer {
    alloc: PoolAlloc,
}

/// Allocates a buffer of `size` bytes on device `index` and wraps it for ggml.
pub(crate) fn alloc(
    buft: ggml_backend_buffer_type_t,
    index: usize,
    size: usize,
) -> ggml_backend_buffer_t {
    let Some(device) = handles::device(index) else {
        return std::ptr::null_mut();
    };
    let alloc = match device.alloc_buffer(size) {
        Ok(alloc) => alloc,
        Err(e) => {
            crate::log::error(&format!(
                "{}: cannot allocate a buffer of {size} bytes: {e}",
                device.name
            ));
            return std::ptr::null_mut();
        }
    };
    let context = Box::into_raw(Box::new(Buffer { alloc })).cast::<c_void>();
    // SAFETY: buft is our buffer type; the interface functions below match ggml's table; the
    // context is a leaked Box<Buffer> reclaimed in free_buffer.
    let buffer = unsafe { ggml_backend_buffer_init(buft, BUFFER_IFACE, context, size) };
    if buffer.is_null() {
        // SAFETY: ggml did not take the context; reclaim it.
        drop(unsafe { Box::from_raw(context.cast::<Buffer>()) });
    }
    buffer
}

/// The 2-D slots exist from ggml 0.10 on (`ggml_buffer_tensor_2d`, set by the build script from the
/// generated bindings); an older ggml has no 2-D copies, so nothing there asks for them.
static BUFFER_IFACE: ggml_backend_buffer_i = ggml_backend_buffer_i {
    free_buffer: Some(free_buffer),
    get_base: Some(get_base),
    init_tensor: None,
    memset_tensor: Some(memset_tensor),
    set_tensor: Some(set_tensor),
    get_tensor: Some(get_tensor),
    #[cfg(ggml_buffer_tensor_2d)]
    set_tensor_2d: Some(set_tensor_2d),
    #[cfg(ggml_buffer_tensor_2d)]
    get_tensor_2d: Some(get_tensor_2d),
    cpy_tensor: Some(cpy_tensor),
    clear: Some(clear),
    reset: None,
};

/// Our context of `buffer`, or `None` (logged, naming `slot`) when `buffer` is NULL or not a
/// buffer of this backend: it must belong to one of our buffer types and carry a context.
///
/// # Safety
/// `buffer` is NULL or a valid ggml buffer; a buffer of ours is live (not yet freed).
unsafe fn context<'a>(buffer: ggml_backend_buffer_t, slot: &str) -> Option<&'a Buffer> {
    // SAFETY: a non-NULL buffer is a valid ggml buffer (the caller's guarantee).
    let ours = !buffer.is_null()
        && unsafe {
            handles::device_of_buft((*buffer).buft).is_some() && !(*buffer).context.is_null()
        };
    if !ours {
        crate::log::error(&format!("buffer::{slot}: not a buffer of this backend"));
        return None;
    }
    // SAFETY: buffers of our buffer types carry a Box<Buffer> context until free_buffer.
    Some(unsafe { &*(*buffer).context.cast::<Buffer>() })
}

/// Offset of `tensor`'s data plus `offset` inside `buf`, or an error message.
///
/// # Safety
/// `tensor` is a valid tensor.
unsafe fn offset_of(buf: &Buffer, tensor: *const ggml_tensor, offset: usize) -> Option<usize> {
    // SAFETY: the caller passes a valid tensor.
    let data = unsafe { (*tensor).data } as usize;
    let base = buf.alloc.as_ptr() as usize;
    data.checked_sub(base)?.checked_add(offset)
}

fn report(slot: &str, e: impl std::fmt::Display) {
    crate::log::error(&format!("buffer::{slot}: {e}; nothing was copied"));
}

unsafe extern "C" fn free_buffer(buffer: ggml_backend_buffer_t) {
    guard("buffer::free_buffer", (), || {
        // SAFETY: ggml passes a valid buffer (or NULL).
        if unsafe { context(buffer, "free_buffer") }.is_none() {
            return;
        }
        // SAFETY: ggml frees each buffer once; the context is the Box leaked in `alloc`.
        drop(unsafe { Box::from_raw((*buffer).context.cast::<Buffer>()) });
    })
}

unsafe extern "C" fn get_base(buffer: ggml_backend_buffer_t) -> *mut c_void {
    guard("buffer::get_base", std::ptr::null_mut(), || {
        // SAFETY: ggml passes a valid buffer (or NULL).
        unsafe { context(buffer, "get_base") }
            .map_or(std::ptr::null_mut(), |b| b.alloc.as_ptr().cast())
    })
}

unsafe extern "C" fn memset_tensor(
    buffer: ggml_backend_buffer_t,
    tensor: *mut ggml_tensor,
    value: u8,
    offset: usize,
    size: usize,
) {
    guard("buffer::memset_tensor", (), || {
        // SAFETY: ggml passes a valid buffer (or NULL) and a valid tensor.
        let Some(buf) = (unsafe { context(buffer, "memset_tensor") }) else {
            return;
        };
        // SAFETY: as above.
        match unsafe { offset_of(buf, tensor, offset) } {
            Some(at) => {
                if let Err(e) = buf.alloc.fill_at(at, size, value) {
                    report("memset_tensor", e);
                }
            }
            None => report("memset_tensor", "the tensor is not in this buffer"),
        }
    })
}

unsafe extern "C" fn set_tensor(
    buffer: ggml_backend_buffer_t,
    tensor: *mut ggml_tensor,
    data: *const c_void,
    offset: usize,
    size: usize,
) {
    guard("buffer::set_tensor", (), || {
        // SAFETY: ggml passes `size` readable bytes at `data`.
        unsafe { set_2d(buffer, tensor, data, offset, size, 1, 0, 0) }
    })
}

unsafe extern "C" fn get_tensor(
    buffer: ggml_backend_buffer_t,
    tensor: *const ggml_tensor,
    data: *mut c_void,
    offset: usize,
    size: usize,
) {
    guard("buffer::get_tensor", (), || {
        // SAFETY: ggml passes `size` writable bytes at `data`.
        unsafe { get_2d(buffer, tensor, data, offset, size, 1, 0, 0) }
    })
}

#[cfg(ggml_buffer_tensor_2d)]
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn set_tensor_2d(
    buffer: ggml_backend_buffer_t,
    tensor: *mut ggml_tensor,
    data: *const c_void,
    offset: usize,
    size: usize,
    n_copies: usize,
    stride_tensor: usize,
    stride_data: usize,
) {
    guard("buffer::set_tensor_2d", (), || {
        // SAFETY: ggml passes rows of `size` readable bytes every `stride_data` bytes.
        unsafe {
            set_2d(
                buffer,
                tensor,
                data,
                offset,
                size,
                n_copies,
                stride_tensor,
                stride_data,
            )
        }
    })
}

#[cfg(ggml_buffer_tensor_2d)]
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn get_tensor_2d(
    buffer: ggml_backend_buffer_t,
    tensor: *const ggml_tensor,
    data: *mut c_void,
    offset: usize,
    size: usize,
    n_copies: usize,
    stride_tensor: usize,
    stride_data: usize,
) {
    guard("buffer::get_tensor_2d", (), || {
        // SAFETY: ggml passes rows of `size` writable bytes every `stride_data` bytes.
        unsafe {
            get_2d(
                buffer,
                tensor,
                data,
                offset,
                size,
                n_copies,
                stride_tensor,
                stride_data,
            )
        }
    })
}

/// Walks `n` rows of a 2-D copy: calls `row(buffer, offset in the buffer, offset in the host
/// data)` for each, stopping at (and logging) the first failure.
///
/// # Safety
/// `buffer` is ours and `tensor` valid.
#[allow(clippy::too_many_arguments)]
unsafe fn for_rows(
    slot: &str,
    buffer: ggml_backend_buffer_t,
    tensor: *const ggml_tensor,
    offset: usize,
    n: usize,
    stride_tensor: usize,
    stride_data: usize,
    mut row: impl FnMut(&Buffer, usize, usize) -> Result<(), OutOfBounds>,
) {
    // SAFETY: the caller's guarantees.
    let Some(buf) = (unsafe { context(buffer, slot) }) else {
        return;
    };
    // SAFETY: as above.
    let Some(at) = (unsafe { offset_of(buf, tensor, offset) }) else {
        return report(slot, "the tensor is not in this buffer");
    };
    for i in 0..n {
        if let Err(e) = row(buf, at + i * stride_tensor, i * stride_data) {
            return report(slot, e);
        }
    }
}

/// Copies `n` rows of `size` bytes from host memory into the tensor.
///
/// # Safety
/// `buffer` is ours, `tensor` valid; `data + i*stride_data` has `size` readable bytes per row.
#[allow(clippy::too_many_arguments)]
unsafe fn set_2d(
    buffer: ggml_backend_buffer_t,
    tensor: *const ggml_tensor,
    data: *const c_void,
    offset: usize,
    size: usize,
    n: usize,
    stride_tensor: usize,
    stride_data: usize,
) {
    let copy = |buf: &Buffer, at: usize, d: usize| {
        // SAFETY: the caller guarantees `size` readable bytes at each row of `data`.
        let src = unsafe { std::slice::from_raw_parts(data.cast::<u8>().add(d), size) };
        buf.alloc.write_at(at, src)
    };
    // SAFETY: the caller's guarantees, passed on.
    unsafe {
        for_rows(
            "set_tensor",
            buffer,
            tensor,
            offset,
            n,
            stride_tensor,
            stride_data,
            copy,
        )
    }
}

/// Copies `n` rows of `size` bytes from the tensor into host memory.
///
/// # Safety
/// `buffer` is ours, `tensor` valid; `data + i*stride_data` has `size` writable bytes per row.
#[allow(clippy::too_many_arguments)]
unsafe fn get_2d(
    buffer: ggml_backend_buffer_t,
    tensor: *const ggml_tensor,
    data: *mut c_void,
    offset: usize,
    size: usize,
    n: usize,
    stride_tensor: usize,
    stride_data: usize,
) {
    let copy = |buf: &Buffer, at: usize, d: usize| {
        // SAFETY: the caller guarantees `size` writable bytes at each row of `data`.
        let dst = unsafe { std::slice::from_raw_parts_mut(data.cast::<u8>().add(d), size) };
        buf.alloc.read_at(at, dst)
    };
    // SAFETY: the caller's guarantees, passed on.
    unsafe {
        for_rows(
            "get_tensor",
            buffer,
            tensor,
            offset,
            n,
            stride_tensor,
            stride_data,
            copy,
        )
    }
}

/// Copies `src` (in any host-accessible buffer) into `dst` (in this buffer); false when the source
/// is not host-accessible, so ggml falls back to a copy through the host.
unsafe extern "C" fn cpy_tensor(
    buffer: ggml_backend_buffer_t,
    src: *const ggml_tensor,
    dst: *mut ggml_tensor,
) -> bool {
    guard("buffer::cpy_tensor", false, || {
        // SAFETY: ggml passes valid tensors; src's buffer is valid or NULL.
        let (src_buffer, src_data) = unsafe { ((*src).buffer, (*src).data) };
        if src_buffer.is_null() || src_data.is_null() {
            return false;
        }
        // SAFETY: a non-NULL buffer of a valid tensor is a valid buffer.
        let src_is_host = unsafe { ggml_backend_buffer_is_host(src_buffer) };
        if !src_is_host {
            return false;
        }
        // SAFETY: valid tensors.
        let (n_src, n_dst) = unsafe { (ggml_nbytes(src), ggml_nbytes(dst)) };
        if n_src != n_dst {
            return false;
        }
        // SAFETY: src's data is host memory of ggml_nbytes(src) bytes (a host buffer); it is
        // copied before anything is written.
        let bytes = unsafe { std::slice::from_raw_parts(src_data.cast::<u8>(), n_src) }.to_vec();
        // SAFETY: ggml passes a valid buffer (or NULL).
        let Some(buf) = (unsafe { context(buffer, "cpy_tensor") }) else {
            return false;
        };
        // SAFETY: as above.
        match unsafe { offset_of(buf, dst, 0) } {
            Some(at) => buf.alloc.write_at(at, &bytes).is_ok(),
            None => false,
        }
    })
}

unsafe extern "C" fn clear(buffer: ggml_backend_buffer_t, value: u8) {
    guard("buffer::clear", (), || {
        // SAFETY: ggml passes a valid buffer (or NULL).
        if let Some(buf) = unsafe { context(buffer, "clear") } {
            let _ = buf.alloc.fill_at(0, buf.alloc.size(), value);
        }
    })
}
