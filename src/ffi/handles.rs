//! The handle table: the ggml objects of each device (the `ggml_backend_device` and its two
//! buffer types), created once when ggml first asks for a device and never freed, as ggml
//! expects. Incoming pointers are recognised by comparing them with this table, so a foreign
//! pointer is never dereferenced as one of ours. The tables of functions behind the objects are
//! in `device_iface` and `buffer_type_iface`.

use std::ffi::CString;
use std::sync::OnceLock;

use super::buffer_type_iface::BUFT_IFACE;
use super::device_iface::DEVICE_IFACE;
use super::sys::*;
use super::{platform, reg};
use crate::backend::Device;
use crate::log;

pub(super) struct Objects {
    device: ggml_backend_dev_t,
    buft: ggml_backend_buffer_type_t,
    host_buft: ggml_backend_buffer_type_t,
    pub(super) name: CString,
    pub(super) host_name: CString,
    pub(super) description: CString,
}

/// The per-device objects, in device order.
struct Table(Vec<Objects>);

// SAFETY: the table is written once inside OnceLock::get_or_init and only read afterwards; the
// objects it points to are leaked, never freed, and ggml only reads them.
unsafe impl Sync for Table {}
// SAFETY: as above.
unsafe impl Send for Table {}

pub(super) fn table() -> &'static [Objects] {
    static TABLE: OnceLock<Table> = OnceLock::new();
    &TABLE
        .get_or_init(|| {
            let objects = platform()
                .devices
                .iter()
                .map(|d| {
                    let device = Box::into_raw(Box::new(ggml_backend_device {
                        iface: DEVICE_IFACE,
                        reg: reg::reg(),
                        context: std::ptr::null_mut(),
                    }));
                    let new_buft = || {
                        Box::into_raw(Box::new(ggml_backend_buffer_type {
                            iface: BUFT_IFACE,
                            device,
                            context: std::ptr::null_mut(),
                        }))
                    };
                    Objects {
                        device,
                        buft: new_buft(),
                        host_buft: new_buft(),
                        name: CString::new(d.name.clone()).expect("no NUL in HSA<n>"),
                        host_name: CString::new(format!("{}_Host", d.name))
                            .expect("no NUL in HSA<n>_Host"),
                        description: CString::new(d.description().replace('\0', ""))
                            .expect("NULs removed"),
                    }
                })
                .collect();
            Table(objects)
        })
        .0
}

/// The ggml device object of device `index`.
pub(crate) fn device_ptr(index: usize) -> Option<ggml_backend_dev_t> {
    table().get(index).map(|o| o.device)
}

/// The buffer type of device `index`.
pub(crate) fn buft_ptr(index: usize) -> Option<ggml_backend_buffer_type_t> {
    table().get(index).map(|o| o.buft)
}

/// The index of the device whose ggml object is `dev`.
pub(crate) fn device_index(dev: ggml_backend_dev_t) -> Option<usize> {
    table().iter().position(|o| o.device == dev)
}

/// The host buffer type of device `index`.
pub(crate) fn host_buft_ptr(index: usize) -> Option<ggml_backend_buffer_type_t> {
    table().get(index).map(|o| o.host_buft)
}

/// The index of the device owning `buft` (either of its buffer types).
pub(crate) fn device_of_buft(buft: ggml_backend_buffer_type_t) -> Option<usize> {
    table()
        .iter()
        .position(|o| o.buft == buft || o.host_buft == buft)
}

/// Whether `buft` is one of the host buffer types.
pub(super) fn is_host_buft(buft: ggml_backend_buffer_type_t) -> bool {
    table().iter().any(|o| o.host_buft == buft)
}

pub(crate) fn device(index: usize) -> Option<&'static Device> {
    platform().devices.get(index)
}

/// The device behind a ggml device pointer; logs and returns `None` for a foreign pointer.
pub(super) fn device_of(dev: ggml_backend_dev_t, slot: &str) -> Option<(usize, &'static Device)> {
    let found = device_index(dev).and_then(|i| device(i).map(|d| (i, d)));
    if found.is_none() {
        log::error(&format!("{slot}: not a device of this backend"));
    }
    found
}

/// Identifies backends (streams) created by this library.
static GUID: ggml_guid = [
    0x5e, 0x1b, 0x7c, 0x43, 0x9a, 0x0d, 0x4e, 0x6f, 0xb2, 0x88, 0x31, 0xc4, 0x0f, 0x7a, 0xd9, 0x26,
];

/// The GUID of this library's backends, as ggml's `ggml_guid_t` (a pointer to 16 bytes).
pub(crate) fn guid() -> ggml_guid_t {
    (&GUID as *const ggml_guid).cast_mut()
}
