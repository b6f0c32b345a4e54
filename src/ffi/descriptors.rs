//! Copies `ggml_tensor`s into the planner's descriptors, and runs host-side ops on ggml's tensor
//! memory. The rest of the backend never sees a ggml pointer.

use std::ffi::{c_char, CStr};

use super::cpu::CpuFallback;
use super::handles;
use super::sys::*;
use crate::backend::HostMemory;
use crate::ops::host::Codec;
use crate::ops::host::HostOp;
use crate::ops::{DType, Memory, Node, Op, QuantType, Tensor};

/// A static name from one of ggml's name tables.
///
/// # Safety
/// `name` is NULL or points to a NUL-terminated string that lives for the whole process.
unsafe fn static_name(name: *const c_char) -> &'static str {
    if name.is_null() {
        return "?";
    }
    // SAFETY: the caller guarantees a static NUL-terminated string.
    unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("?")
}

fn dtype(ty: ggml_type) -> DType {
    match ty {
        GGML_TYPE_F32 => DType::F32,
        GGML_TYPE_F16 => DType::F16,
        GGML_TYPE_BF16 => DType::Bf16,
        GGML_TYPE_I8 => DType::I8,
        GGML_TYPE_I16 => DType::I16,
        GGML_TYPE_I32 => DType::I32,
        GGML_TYPE_I64 => DType::I64,
        other => {
            // SAFETY: ggml_type_name returns a static string (or NULL for unknown values).
            let name = unsafe { static_name(ggml_type_name(other)) };
            // SAFETY: ggml_get_type_traits returns a pointer into ggml's static trait table
            // for any type id below GGML_TYPE_COUNT, NULL-checked here.
            let traits = (other < GGML_TYPE_COUNT)
                .then(|| unsafe { ggml_get_type_traits(other).as_ref() })
                .flatten();
            match traits {
                Some(t) if t.is_quantized && t.blck_size > 0 => DType::Quant(QuantType {
                    name,
                    id: other,
                    block: t.blck_size as u64,
                    block_bytes: t.type_size as u64,
                    decode: t.to_float.is_some(),
                    encode: t.from_float_ref.is_some(),
                }),
                _ => DType::Other(name),
            }
        }
    }
}

/// The descriptor of `t`.
///
/// # Safety
/// `t` points to a valid `ggml_tensor` whose `buffer` is NULL or a valid buffer.
pub(crate) unsafe fn tensor(t: *const ggml_tensor) -> Tensor {
    // SAFETY: the caller passes a valid tensor.
    let tr = unsafe { &*t };
    let memory = if tr.data.is_null() || tr.buffer.is_null() {
        Memory::Unallocated
    } else {
        // SAFETY: a non-NULL buffer of a valid tensor is a valid buffer.
        let buft = unsafe { ggml_backend_buffer_get_type(tr.buffer) };
        match handles::device_of_buft(buft) {
            Some(index) => Memory::Device(index),
            // SAFETY: as above.
            None if unsafe { ggml_backend_buffer_is_host(tr.buffer) } => Memory::Host,
            None => Memory::Foreign,
        }
    };
    Tensor {
        dtype: dtype(tr.type_),
        ne: tr.ne,
        nb: tr.nb.map(|n| n as u64),
        addr: tr.data as u64,
        // SAFETY: `t` is a valid tensor.
        bytes: unsafe { ggml_nbytes(t) } as u64,
        memory,
    }
}

/// Whether `t` or one of its sources starts at a byte that is not a multiple of `alignment`: its
/// data address once allocated, before that its offset into the tensor it views (ggml keeps a
/// view's offset relative to the allocated tensor at the root of the chain, whose address is
/// aligned by its buffer).
///
/// # Safety
/// `t` points to a valid `ggml_tensor` whose sources are valid or NULL.
pub(crate) unsafe fn has_operand_at_offset(t: *const ggml_tensor, alignment: u64) -> bool {
    // SAFETY: the caller passes a valid tensor.
    let tr = unsafe { &*t };
    let off = |t: &ggml_tensor| {
        if t.data.is_null() {
            t.view_offs as u64
        } else {
            t.data as u64
        }
    };
    std::iter::once(tr)
        // SAFETY: non-NULL sources of a valid tensor are valid tensors.
        .chain(tr.src.iter().filter_map(|&s| unsafe { s.as_ref() }))
        .any(|t| off(t) % alignment != 0)
}

/// The op of `t`, from ggml's names for it (the mapping itself is `Op::from_ggml`, checked
/// against the op catalogue).
///
/// # Safety
/// `t` points to a valid `ggml_tensor`.
unsafe fn op(t: *const ggml_tensor) -> Op {
    // SAFETY: the caller passes a valid tensor.
    let code = unsafe { (*t).op };
    // SAFETY: ggml's name functions return static strings; the sub-op getters read a valid
    // UNARY/GLU tensor's op_params.
    let (name, sub) = unsafe {
        let name = static_name(ggml_op_name(code));
        let sub = match code {
            GGML_OP_UNARY => Some(static_name(ggml_unary_op_name(ggml_get_unary_op(t)))),
            GGML_OP_GLU => Some(static_name(ggml_glu_op_name(ggml_get_glu_op(t)))),
            _ => None,
        };
        (name, sub)
    };
    Op::from_ggml(name, sub)
}

/// The node descriptor of `t` (its op, parameters, output and inputs). `read_after` says
/// that something outside the graph being planned reads `t` after it (a node of another
/// split: [`GraphNodes::read_after`]); the descriptor then counts it as an output, which no
/// fusion may skip writing, as ggml's OUTPUT flag does.
///
/// # Safety
/// `t` points to a valid `ggml_tensor` whose sources and buffers are valid or NULL.
pub(crate) unsafe fn node(t: *const ggml_tensor, read_after: bool) -> Node {
    // SAFETY: the caller passes a valid tensor.
    let tr = unsafe { &*t };
    let mut op_params = [0i32; 16];
    op_params.copy_from_slice(&tr.op_params[..16]);
    let last = tr
        .src
        .iter()
        .rposition(|s| !s.is_null())
        .map_or(0, |i| i + 1);
    let src = tr.src[..last]
        .iter()
        // SAFETY: non-NULL sources of a valid tensor are valid tensors.
        .map(|&s| (!s.is_null()).then(|| unsafe { tensor(s) }))
        .collect();
    Node {
        // SAFETY: as above.
        op: unsafe { op(t) },
        op_params,
        // SAFETY: as above.
        dst: unsafe { tensor(t) },
        src,
        is_output: read_after || tr.flags & GGML_TENSOR_FLAG_OUTPUT as i32 != 0,
    }
}

/// Appends the words of tensor `t` to a graph key: everything [`tensor`] reads from it.
///
/// # Safety
/// `t` points to a valid `ggml_tensor` whose `buffer` is NULL or a valid buffer.
unsafe fn tensor_key(t: *const ggml_tensor, key: &mut Vec<u64>) {
    // SAFETY: the caller passes a valid tensor.
    let tr = unsafe { &*t };
    // The buffer type decides the memory kind (ours, host or foreign); the type, shape and
    // strides decide the rest of the descriptor, ggml_nbytes included.
    let buft = if tr.buffer.is_null() {
        0
    } else {
        // SAFETY: a non-NULL buffer of a valid tensor is a valid buffer.
        (unsafe { ggml_backend_buffer_get_type(tr.buffer) }) as u64
    };
    key.push(tr.type_ as u64);
    key.extend(tr.ne.map(|n| n as u64));
    key.extend(tr.nb.map(|n| n as u64));
    key.extend([tr.data as u64, buft]);
}

/// The nodes of a graph that must be computed (those with the COMPUTE flag), and the key of the
/// graph they make for the stream's plan cache.
pub(crate) struct GraphNodes {
    /// Per node its op, op_params, flags and `read_after`, and the words of the node and of
    /// each source (a marker for an empty slot). Equal keys give equal descriptors, so a
    /// repeated graph is recognised without building them.
    pub key: Vec<u64>,
    pub tensors: Vec<*mut ggml_tensor>,
    /// Per node, whether a node outside the graph reads it, or a view of it, afterwards: see
    /// [`read_by_other_splits`].
    pub read_after: Vec<bool>,
}

/// The nodes of `graph` and their key.
///
/// # Safety
/// `graph` points to a valid `ggml_cgraph`.
pub(crate) unsafe fn graph_key(graph: *mut ggml_cgraph) -> GraphNodes {
    // SAFETY: the caller passes a valid graph.
    let n = unsafe { ggml_graph_n_nodes(graph) };
    // SAFETY: as above.
    let elsewhere = unsafe { read_by_other_splits(graph) };
    let mut key = Vec::with_capacity(n.max(0) as usize * 64);
    let mut tensors = Vec::with_capacity(n.max(0) as usize);
    let mut read_after = Vec::with_capacity(n.max(0) as usize);
    for i in 0..n {
        // SAFETY: 0 <= i < n_nodes, so ggml_graph_node returns a valid node.
        let t = unsafe { ggml_graph_node(graph, i) };
        // SAFETY: graph nodes are valid tensors.
        let tr = unsafe { &*t };
        if tr.flags & GGML_TENSOR_FLAG_COMPUTE as i32 == 0 {
            continue;
        }
        let after = elsewhere.contains(&t.cast_const());
        tensors.push(t);
        read_after.push(after);
        key.extend([tr.op as u64, tr.flags as u32 as u64 | (after as u64) << 32]);
        key.extend(
            tr.op_params[..16]
                .chunks_exact(2)
                .map(|p| (p[0] as u32 as u64) << 32 | p[1] as u32 as u64),
        );
        // SAFETY: as above.
        unsafe { tensor_key(t, &mut key) };
        // The slots up to the last source, then a marker per slot: most nodes have two or
        // three of ggml's ten.
        let slots = tr
            .src
            .iter()
            .rposition(|s| !s.is_null())
            .map_or(0, |i| i + 1);
        key.push(slots as u64);
        for &src in &tr.src[..slots] {
            if src.is_null() {
                key.push(0);
            } else {
                key.push(1);
                // SAFETY: non-NULL sources of a valid tensor are valid tensors.
                unsafe { tensor_key(src, &mut key) };
            }
        }
    }
    GraphNodes {
        key,
        tensors,
        read_after,
    }
}

/// The nodes of `graph` that a node outside it reads: those ggml counts more uses of than
/// `graph`'s nodes make, and the tensors such a node views (its `view_src` chain), whose memory
/// that reader reads too.
///
/// A scheduler hands a backend one split of the model's graph, a view sharing the whole graph's
/// use counts (`ggml_graph_view`). A node of a later split, on the CPU say, reads this split's
/// results straight from its host-mapped memory, so a fusion that does not write an
/// intermediate result must know of readers it cannot see; ggml's own backends ask the same
/// counts (`ggml_node_has_n_uses`). A graph built by hand without them (ggml-rpc-server's) has
/// no visited set: nothing is found, and only the graph's own readers count.
///
/// # Safety
/// `graph` points to a valid `ggml_cgraph`.
unsafe fn read_by_other_splits(
    graph: *const ggml_cgraph,
) -> std::collections::HashSet<*const ggml_tensor> {
    use std::collections::{HashMap, HashSet};
    // SAFETY: the caller passes a valid graph.
    let g = unsafe { &*graph };
    let mut found = HashSet::new();
    let set = &g.visited_hash_set;
    if g.use_counts.is_null() || set.size == 0 || set.used.is_null() || set.keys.is_null() {
        return found;
    }
    let nodes: Vec<*const ggml_tensor> = (0..g.n_nodes.max(0) as usize)
        // SAFETY: `nodes` holds `n_nodes` valid tensors.
        .map(|i| unsafe { *g.nodes.add(i) }.cast_const())
        .collect();
    let mut uses_here: HashMap<*const ggml_tensor, i32> = HashMap::new();
    for &t in &nodes {
        // SAFETY: graph nodes are valid tensors.
        for &s in unsafe { &(*t).src } {
            if !s.is_null() {
                *uses_here.entry(s.cast_const()).or_default() += 1;
            }
        }
    }
    let bits = ggml_bitset_t::BITS as usize;
    // ggml's hash set: open addressing with linear probing from `address >> 4`
    // (ggml-impl.h, ggml_hash_find), slots marked in the `used` bit set.
    let use_count = |t: *const ggml_tensor| -> i32 {
        let start = (t as usize >> 4) % set.size;
        let mut i = start;
        loop {
            // SAFETY: i < size; `used` has size bits and `keys` size entries, `use_counts`
            // size counts (ggml_new_graph_custom allocates them together).
            let (used, key) =
                unsafe { (*set.used.add(i / bits) >> (i % bits) & 1, *set.keys.add(i)) };
            if used == 0 {
                return 0;
            }
            if key.cast_const() == t {
                // SAFETY: as above.
                return unsafe { *g.use_counts.add(i) };
            }
            i = (i + 1) % set.size;
            if i == start {
                return 0;
            }
        }
    };
    for &t in &nodes {
        if use_count(t) > uses_here.get(&t).copied().unwrap_or(0) {
            let mut v = t;
            while !v.is_null() && found.insert(v) {
                // SAFETY: a view's `view_src` is a valid tensor or NULL.
                v = unsafe { (*v).view_src }.cast_const();
            }
        }
    }
    found
}

/// Runs host-side ops directly on the memory of the graph's tensors, and the CPU fallback's
/// nodes on ggml's CPU backend.
#[derive(Debug)]
pub(crate) struct GraphMemory<'a> {
    /// The graph's nodes, in the order of the descriptors given to the stream.
    pub nodes: &'a [*mut ggml_tensor],
    pub cpu: &'a mut CpuFallback,
}

impl HostMemory for GraphMemory<'_> {
    fn run_on_cpu(&mut self, index: usize) -> Result<(), String> {
        let node = *self
            .nodes
            .get(index)
            .ok_or_else(|| format!("node {index} is not in the graph"))?;
        // SAFETY: a node of the graph being computed; supports_op accepted it only with
        // host-accessible memory.
        unsafe { self.cpu.compute(node) }
    }

    fn read(&mut self, t: &Tensor) -> Result<Vec<u8>, String> {
        host_accessible(t)?;
        // SAFETY: the descriptor was made from a tensor of the graph being computed, allocated
        // in a host-accessible buffer for at least `bytes` (ggml_nbytes) bytes; no kernel writes
        // it while it is read (the stream waits for pending writes first).
        Ok(unsafe { std::slice::from_raw_parts(t.addr as *const u8, t.bytes as usize) }.to_vec())
    }

    fn run(&mut self, op: &HostOp) -> Result<(), String> {
        let (inputs, dst) = op.tensors();
        for t in inputs.iter().copied().chain([dst]) {
            host_accessible(t)?;
        }
        // An input that overlaps the destination (an in-place DUP) is copied first: a Rust slice
        // must not alias a mutable one. The others are read in place, so that a GET_ROWS of one
        // row does not copy the whole embedding table.
        let overlaps = |t: &Tensor| t.addr < dst.addr + dst.bytes && dst.addr < t.addr + t.bytes;
        let copies: Vec<Option<Vec<u8>>> = inputs
            .iter()
            .map(|t| {
                overlaps(t).then(|| {
                    // SAFETY: the descriptors were made from tensors of the graph being
                    // computed, whose data is allocated in host-accessible buffers for at least
                    // `bytes` (ggml_nbytes) bytes.
                    unsafe { std::slice::from_raw_parts(t.addr as *const u8, t.bytes as usize) }
                        .to_vec()
                })
            })
            .collect();
        let input_bytes: Vec<&[u8]> = inputs
            .iter()
            .zip(&copies)
            .map(|(t, copy)| match copy {
                Some(bytes) => bytes.as_slice(),
                // SAFETY: as above; this range does not overlap the destination's, the only
                // memory written while the slice lives.
                None => unsafe {
                    std::slice::from_raw_parts(t.addr as *const u8, t.bytes as usize)
                },
            })
            .collect();
        // SAFETY: as above; nothing else accesses the destination while the graph computes.
        let dst_bytes =
            unsafe { std::slice::from_raw_parts_mut(dst.addr as *mut u8, dst.bytes as usize) };
        op.run(&input_bytes, dst_bytes, &GgmlCodec)
    }
}

/// Whether the host may read and write `t`'s memory in place.
fn host_accessible(t: &Tensor) -> Result<(), String> {
    if !matches!(t.memory, Memory::Device(_) | Memory::Host) || t.addr == 0 {
        return Err(format!(
            "tensor memory is not host-accessible ({:?})",
            t.memory
        ));
    }
    Ok(())
}

/// Block-quantized conversions with ggml's own routines, so results match ggml bit for bit.
#[derive(Debug)]
pub(crate) struct GgmlCodec;

/// ggml's trait table entry for `ty`.
fn traits(ty: QuantType) -> Result<&'static ggml_type_traits, String> {
    // SAFETY: the id came from a tensor's type and was checked against GGML_TYPE_COUNT when the
    // QuantType was made; the table is static.
    unsafe { ggml_get_type_traits(ty.id).as_ref() }
        .ok_or_else(|| format!("no traits for {}", ty.name))
}

/// Bytes of `n` elements of `ty`, if `n` is a whole number of blocks.
fn blocks_bytes(ty: QuantType, n: usize) -> Result<usize, String> {
    if ty.block == 0 || !(n as u64).is_multiple_of(ty.block) {
        return Err(format!("{n} elements are not whole {} blocks", ty.name));
    }
    Ok((n as u64 / ty.block * ty.block_bytes) as usize)
}

impl Codec for GgmlCodec {
    fn decode(&self, ty: QuantType, src: &[u8], out: &mut [f32]) -> Result<(), String> {
        let to_float = traits(ty)?
            .to_float
            .ok_or_else(|| format!("{} cannot be decoded", ty.name))?;
        if src.len() < blocks_bytes(ty, out.len())? {
            return Err(format!(
                "{} bytes hold fewer than {} {} elements",
                src.len(),
                out.len(),
                ty.name
            ));
        }
        // SAFETY: `src` holds the blocks of `out.len()` elements (checked above) and `out` has
        // room for them; ggml's to_float reads and writes exactly that much.
        unsafe { to_float(src.as_ptr().cast(), out.as_mut_ptr(), out.len() as i64) };
        Ok(())
    }

    fn encode(&self, ty: QuantType, src: &[f32], out: &mut [u8]) -> Result<(), String> {
        let from_float = traits(ty)?
            .from_float_ref
            .ok_or_else(|| format!("{} cannot be encoded", ty.name))?;
        if out.len() < blocks_bytes(ty, src.len())? {
            return Err(format!(
                "{} bytes cannot hold {} {} elements",
                out.len(),
                src.len(),
                ty.name
            ));
        }
        // SAFETY: `out` has room for the blocks of `src.len()` elements (checked above); ggml's
        // from_float_ref reads `src.len()` floats and writes exactly those blocks.
        unsafe { from_float(src.as_ptr(), out.as_mut_ptr().cast(), src.len() as i64) };
        Ok(())
    }
}
