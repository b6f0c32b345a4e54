//! The AIE hsaco container: an ELF64 file with one non-loaded section per AIE architecture
//! (`aie2`, `aie2p`), each starting with the `AIEK` magic, a 48-byte header, a table of 44-byte
//! kernel entries, a string table of kernel names and a pool of blobs (PDIs, instruction
//! streams, nested full ELFs).
//!
//! This crate is the one writer and the one strict reader of the format, shared by the backend
//! (which wraps a kernel's PDI and instruction stream into an in-memory hsaco for packet ABI
//! `c`), hsa-sim (whose code-object loader validates what it is given as ROCR does) and
//! `ggml-hsa-gen-kernels --format hsaco`. The reader never panics: every offset and size is
//! checked with overflow-free arithmetic and every failure is a typed [`HsacoError`].
//!
//! Layout (all little-endian; section offsets are relative to the section start, names to the
//! string table):
//!
//! | header (48) | `magic` u32, `version_major` u16 = 1, `version_minor` u16, `header_size` u32 ≥ 48, `kernel_count` u32 ≥ 1, `kernel_entry_size` u32 ≥ 44, `string_table_offset` u32, `string_table_size` u32, `blob_pool_offset` u32, `reserved` 16 bytes |
//! |---|---|
//! | entry (44) | `name_offset`, `insts_offset`, `insts_size`, `pdi_offset`, `pdi_size`, `kernarg_size`, `num_cols`, `kind` (u32 each), `reserved` 12 bytes |

use std::collections::{HashMap, HashSet};

/// `AIEK` read as a little-endian u32.
pub const MAGIC: u32 = 0x4B45_4941;
/// The only major version readers accept.
pub const VERSION_MAJOR: u16 = 1;
/// The minor version this writer emits.
pub const VERSION_MINOR: u16 = 0;
/// Size of the section header this writer emits (readers take it from the file, ≥ this).
pub const HEADER_SIZE: u32 = 48;
/// Size of one kernel entry this writer emits (readers take the stride from the file, ≥ this).
pub const ENTRY_SIZE: u32 = 44;
/// The architectures (section names) ROCR knows.
pub const ARCHS: [&str; 2] = ["aie2", "aie2p"];

const EM_AMDGPU: u16 = 224;
const ET_REL: u16 = 1;
const SHT_PROGBITS: u32 = 1;
const SHT_STRTAB: u32 = 3;
const ELF_HEADER: usize = 64;
const SECTION_HEADER: usize = 64;

/// What a kernel entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// A PDI and an instruction stream (32-bit words).
    PdiInsts,
    /// A complete nested ELF (`aiecc --get-full-elf`; aie2p only), no PDI.
    FullElf,
}

impl KernelKind {
    pub fn code(self) -> u32 {
        match self {
            KernelKind::PdiInsts => 0,
            KernelKind::FullElf => 1,
        }
    }

    pub fn from_code(c: u32) -> Option<KernelKind> {
        match c {
            0 => Some(KernelKind::PdiInsts),
            1 => Some(KernelKind::FullElf),
            _ => None,
        }
    }
}

/// One kernel of a section, with its blobs copied out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// The HSA symbol name (exactly the string table entry; no `.kd` suffix).
    pub name: String,
    pub kind: KernelKind,
    /// The instruction stream (PdiInsts) or the nested ELF (FullElf).
    pub insts: Vec<u8>,
    /// The PDI (PdiInsts); empty for FullElf.
    pub pdi: Vec<u8>,
    /// Kernarg bytes, normally 16 × the number of buffer arguments.
    pub kernarg_size: u32,
    /// Columns of the partition the kernel was compiled for (≥ 1).
    pub num_cols: u32,
}

impl Kernel {
    /// A PDI + instruction-stream kernel taking `n_args` buffer arguments.
    pub fn pdi_insts(
        name: impl Into<String>,
        pdi: Vec<u8>,
        insts: Vec<u8>,
        n_args: u32,
        num_cols: u32,
    ) -> Kernel {
        Kernel {
            name: name.into(),
            kind: KernelKind::PdiInsts,
            insts,
            pdi,
            kernarg_size: n_args.saturating_mul(16),
            num_cols,
        }
    }
}

/// One AIE section: an architecture and its kernels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    pub arch: String,
    pub kernels: Vec<Kernel>,
}

/// Everything that can be wrong with a file (reading) or a request (writing).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HsacoError {
    #[error("not an ELF64 little-endian file: {0}")]
    NotElf(&'static str),
    #[error("ELF structure out of bounds: {0}")]
    ElfBounds(&'static str),
    #[error("no AIE section named {0:?} (no code object for this architecture)")]
    NoSection(String),
    #[error("AIE section is {0} bytes, shorter than its 48-byte header")]
    Truncated(usize),
    #[error("AIE section magic {0:#010x}, expected {MAGIC:#010x} (\"AIEK\")")]
    BadMagic(u32),
    #[error("AIE section version {0}.x, only 1.x is understood")]
    BadVersion(u16),
    #[error("header_size {0} is smaller than 48")]
    HeaderSize(u32),
    #[error("kernel_entry_size {0} is smaller than 44")]
    EntrySize(u32),
    #[error("the section declares no kernel")]
    NoKernels,
    #[error("{what} out of bounds ({detail})")]
    OutOfBounds { what: &'static str, detail: String },
    #[error("kernel {index}: name is not a NUL-terminated UTF-8 string inside the string table")]
    BadName { index: usize },
    #[error("kernel name {0:?} appears twice in one section")]
    DuplicateName(String),
    #[error("kernel {name:?}: kind {kind} is unknown (0 = PDI + instructions, 1 = full ELF)")]
    BadKind { name: String, kind: u32 },
    #[error("kernel {name:?}: {msg}")]
    BadKernel { name: String, msg: String },
    #[error("section {0:?} appears twice in one file")]
    DuplicateSection(String),
    #[error(
        "the kernels' blobs add up to {copied} bytes, more than the {section}-byte section \
         (entries sharing one blob)"
    )]
    Amplified { copied: u64, section: u64 },
    #[error("cannot write: {0}")]
    Write(String),
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    let s = b.get(off..off.checked_add(2)?)?;
    Some(u16::from_le_bytes([s[0], s[1]]))
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    let s = b.get(off..off.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    let s = b.get(off..off.checked_add(8)?)?;
    let mut w = [0u8; 8];
    w.copy_from_slice(s);
    Some(u64::from_le_bytes(w))
}

fn oob(what: &'static str, detail: String) -> HsacoError {
    HsacoError::OutOfBounds { what, detail }
}

/// True when `bytes` starts with the ELF magic (what ROCR checks before anything else).
pub fn is_elf(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x7fELF")
}

/// One section of an ELF64 file: its name and its bytes (bounds checked).
#[derive(Clone, Copy, Debug)]
pub struct ElfSection<'a> {
    pub name: &'a [u8],
    pub data: &'a [u8],
}

/// Lists the sections of an ELF64 little-endian file. Sections whose name or contents lie
/// outside the file are errors; `SHT_NOBITS` sections are listed with empty contents.
pub fn elf_sections(file: &[u8]) -> Result<Vec<ElfSection<'_>>, HsacoError> {
    if !is_elf(file) {
        return Err(HsacoError::NotElf("no \\x7fELF magic"));
    }
    if file.len() < ELF_HEADER {
        return Err(HsacoError::NotElf("shorter than the 64-byte ELF64 header"));
    }
    if file[4] != 2 {
        return Err(HsacoError::NotElf("EI_CLASS is not ELFCLASS64"));
    }
    if file[5] != 1 {
        return Err(HsacoError::NotElf("EI_DATA is not little-endian"));
    }
    let shoff = u64_at(file, 0x28).ok_or(HsacoError::ElfBounds("e_shoff"))?;
    let shentsize = u16_at(file, 0x3A).ok_or(HsacoError::ElfBounds("e_shentsize"))? as usize;
    let shnum = u16_at(file, 0x3C).ok_or(HsacoError::ElfBounds("e_shnum"))? as usize;
    let shstrndx = u16_at(file, 0x3E).ok_or(HsacoError::ElfBounds("e_shstrndx"))? as usize;
    if shnum == 0 {
        return Ok(Vec::new());
    }
    if shentsize < SECTION_HEADER {
        return Err(HsacoError::ElfBounds("e_shentsize smaller than 64"));
    }
    let table_len = shentsize
        .checked_mul(shnum)
        .ok_or(HsacoError::ElfBounds("section header table size"))?;
    let shoff = usize::try_from(shoff).map_err(|_| HsacoError::ElfBounds("e_shoff"))?;
    let table_end = shoff
        .checked_add(table_len)
        .ok_or(HsacoError::ElfBounds("section header table"))?;
    if table_end > file.len() {
        return Err(HsacoError::ElfBounds(
            "section header table runs past the end of the file",
        ));
    }
    let mut raw = Vec::with_capacity(shnum);
    for i in 0..shnum {
        let h = shoff + i * shentsize;
        let name = u32_at(file, h).ok_or(HsacoError::ElfBounds("sh_name"))?;
        let ty = u32_at(file, h + 4).ok_or(HsacoError::ElfBounds("sh_type"))?;
        let off = u64_at(file, h + 24).ok_or(HsacoError::ElfBounds("sh_offset"))?;
        let size = u64_at(file, h + 32).ok_or(HsacoError::ElfBounds("sh_size"))?;
        let data: &[u8] = if ty == 0 || ty == 8 {
            &[]
        } else {
            let off = usize::try_from(off).map_err(|_| HsacoError::ElfBounds("sh_offset"))?;
            let size = usize::try_from(size).map_err(|_| HsacoError::ElfBounds("sh_size"))?;
            let end = off
                .checked_add(size)
                .ok_or(HsacoError::ElfBounds("section contents"))?;
            file.get(off..end).ok_or(HsacoError::ElfBounds(
                "section contents past the end of file",
            ))?
        };
        raw.push((name as usize, data));
    }
    let strtab = raw
        .get(shstrndx)
        .map(|r| r.1)
        .ok_or(HsacoError::ElfBounds("e_shstrndx"))?;
    raw.into_iter()
        .map(|(name_off, data)| {
            let rest = strtab
                .get(name_off..)
                .ok_or(HsacoError::ElfBounds("section name offset"))?;
            let len = rest
                .iter()
                .position(|&b| b == 0)
                .ok_or(HsacoError::ElfBounds("section name not NUL-terminated"))?;
            Ok(ElfSection {
                name: &rest[..len],
                data,
            })
        })
        .collect()
}

/// The first AIE section named `arch` (a section counts as AIE if it is at least 48 bytes and
/// starts with the magic, as ROCR's `FindArchSection` decides).
pub fn find_section<'a>(file: &'a [u8], arch: &str) -> Result<&'a [u8], HsacoError> {
    elf_sections(file)?
        .into_iter()
        .find(|s| {
            s.name == arch.as_bytes()
                && s.data.len() >= HEADER_SIZE as usize
                && u32_at(s.data, 0) == Some(MAGIC)
        })
        .map(|s| s.data)
        .ok_or_else(|| HsacoError::NoSection(arch.to_string()))
}

/// Parses and validates one AIE section (the strict reader). `arch` is the section's name;
/// full-ELF kernels are refused in an `aie2` section.
pub fn parse_section(sec: &[u8], arch: &str) -> Result<Vec<Kernel>, HsacoError> {
    if sec.len() < HEADER_SIZE as usize {
        return Err(HsacoError::Truncated(sec.len()));
    }
    let rd = |off: usize| u32_at(sec, off).unwrap_or(0);
    let magic = rd(0);
    if magic != MAGIC {
        return Err(HsacoError::BadMagic(magic));
    }
    let major = u16_at(sec, 4).unwrap_or(0);
    if major != VERSION_MAJOR {
        return Err(HsacoError::BadVersion(major));
    }
    let header_size = rd(8);
    let count = rd(12);
    let entry_size = rd(16);
    let str_off = rd(20) as u64;
    let str_size = rd(24) as u64;
    let pool_off = rd(28) as u64;
    if header_size < HEADER_SIZE {
        return Err(HsacoError::HeaderSize(header_size));
    }
    if count == 0 {
        return Err(HsacoError::NoKernels);
    }
    if entry_size < ENTRY_SIZE {
        return Err(HsacoError::EntrySize(entry_size));
    }
    let len = sec.len() as u64;
    let table_end = header_size as u64 + count as u64 * entry_size as u64;
    if table_end > len {
        return Err(oob(
            "kernel table",
            format!("ends at {table_end}, the section is {len} bytes"),
        ));
    }
    if str_off < table_end {
        return Err(oob(
            "string table",
            format!("starts at {str_off}, inside the kernel table (ends at {table_end})"),
        ));
    }
    let str_end = str_off + str_size;
    if pool_off < str_end || pool_off > len {
        return Err(oob(
            "blob pool",
            format!(
                "starts at {pool_off}; the string table ends at {str_end}, the section at {len}"
            ),
        ));
    }
    let strings = &sec[str_off as usize..str_end as usize];
    // Entries may point at the same bytes of the pool; each copy is counted, so that a small file
    // whose many entries share one large blob cannot make the reader allocate without bound.
    let copied = std::cell::Cell::new(0u64);
    let blob =
        |what: &'static str, name: &str, off: u32, size: u32| -> Result<Vec<u8>, HsacoError> {
            let (off, size) = (off as u64, size as u64);
            if off < pool_off || off + size > len {
                return Err(oob(
                    what,
                    format!(
                    "kernel {name:?}: [{off}, {}) is not inside the blob pool [{pool_off}, {len})",
                    off + size
                ),
                ));
            }
            copied.set(copied.get() + size);
            if copied.get() > len {
                return Err(HsacoError::Amplified {
                    copied: copied.get(),
                    section: len,
                });
            }
            Ok(sec[off as usize..(off + size) as usize].to_vec())
        };
    let mut kernels = Vec::with_capacity(count as usize);
    let mut names = HashSet::new();
    for i in 0..count as usize {
        let e = header_size as usize + i * entry_size as usize;
        let name_off = rd(e) as usize;
        let name = strings
            .get(name_off..)
            .and_then(|rest| rest.iter().position(|&b| b == 0).map(|n| &rest[..n]))
            .and_then(|n| std::str::from_utf8(n).ok())
            .filter(|n| !n.is_empty())
            .ok_or(HsacoError::BadName { index: i })?
            .to_string();
        if !names.insert(name.clone()) {
            return Err(HsacoError::DuplicateName(name));
        }
        let kind_code = rd(e + 28);
        let kind = KernelKind::from_code(kind_code).ok_or_else(|| HsacoError::BadKind {
            name: name.clone(),
            kind: kind_code,
        })?;
        let bad = |msg: &str| HsacoError::BadKernel {
            name: name.clone(),
            msg: msg.to_string(),
        };
        let (insts_off, insts_size) = (rd(e + 4), rd(e + 8));
        let (pdi_off, pdi_size) = (rd(e + 12), rd(e + 16));
        let kernarg_size = rd(e + 20);
        let num_cols = rd(e + 24);
        if insts_size == 0 {
            return Err(bad("insts_size is 0"));
        }
        if num_cols == 0 {
            return Err(bad("num_cols is 0"));
        }
        if pdi_size == 0 && pdi_off != 0 {
            return Err(bad("pdi_offset is non-zero with pdi_size 0"));
        }
        let insts = blob("instruction blob", &name, insts_off, insts_size)?;
        let pdi = if pdi_size == 0 {
            Vec::new()
        } else {
            blob("PDI blob", &name, pdi_off, pdi_size)?
        };
        match kind {
            KernelKind::PdiInsts => {
                if !insts_size.is_multiple_of(4) {
                    return Err(bad("insts_size is not a multiple of 4"));
                }
                if pdi.is_empty() {
                    return Err(bad("a PDI + instructions kernel has no PDI"));
                }
            }
            KernelKind::FullElf => {
                if !pdi.is_empty() {
                    return Err(bad("a full-ELF kernel carries a PDI"));
                }
                if arch == "aie2" {
                    return Err(bad("full-ELF kernels exist on aie2p only"));
                }
            }
        }
        kernels.push(Kernel {
            name,
            kind,
            insts,
            pdi,
            kernarg_size,
            num_cols,
        });
    }
    Ok(kernels)
}

/// Reads the kernels of the section for `arch` from an hsaco file.
pub fn read(file: &[u8], arch: &str) -> Result<Vec<Kernel>, HsacoError> {
    parse_section(find_section(file, arch)?, arch)
}

/// Reads every AIE section of a file (sections named like an architecture and starting with
/// the magic), each validated.
pub fn read_all(file: &[u8]) -> Result<Vec<Section>, HsacoError> {
    let mut out: Vec<Section> = Vec::new();
    for s in elf_sections(file)? {
        if s.data.len() < HEADER_SIZE as usize || u32_at(s.data, 0) != Some(MAGIC) {
            continue;
        }
        let arch = String::from_utf8_lossy(s.name).into_owned();
        if out.iter().any(|o| o.arch == arch) {
            continue; // ROCR takes the first one.
        }
        let kernels = parse_section(s.data, &arch)?;
        out.push(Section { arch, kernels });
    }
    Ok(out)
}

fn to_u32(v: usize, what: &str) -> Result<u32, HsacoError> {
    u32::try_from(v).map_err(|_| HsacoError::Write(format!("{what} exceeds 4 GiB")))
}

/// Places `b` in the blob pool once per distinct content; returns its section offset.
fn place<'a>(
    blobs: &mut HashMap<&'a [u8], u32>,
    pool: &mut Vec<u8>,
    pool_off: usize,
    b: &'a [u8],
) -> Result<u32, HsacoError> {
    if let Some(&o) = blobs.get(b) {
        return Ok(o);
    }
    let o = to_u32(pool_off + pool.len(), "section")?;
    pool.extend_from_slice(b);
    blobs.insert(b, o);
    Ok(o)
}

/// Builds the bytes of one AIE section (blobs de-duplicated by content). The request is
/// validated with the reader's rules, so what this writes always reads back.
pub fn build_section(arch: &str, kernels: &[Kernel]) -> Result<Vec<u8>, HsacoError> {
    if kernels.is_empty() {
        return Err(HsacoError::NoKernels);
    }
    let mut strings = Vec::new();
    let mut name_offs = Vec::new();
    let mut seen = HashSet::new();
    for k in kernels {
        if k.name.is_empty() || k.name.contains('\0') {
            return Err(HsacoError::Write(format!(
                "kernel name {:?} is empty or contains NUL",
                k.name
            )));
        }
        if !seen.insert(k.name.as_str()) {
            return Err(HsacoError::DuplicateName(k.name.clone()));
        }
        name_offs.push(to_u32(strings.len(), "string table")?);
        strings.extend_from_slice(k.name.as_bytes());
        strings.push(0);
    }
    let table_end = HEADER_SIZE as usize + ENTRY_SIZE as usize * kernels.len();
    let str_off = table_end;
    let pool_off = str_off + strings.len();
    let mut pool: Vec<u8> = Vec::new();
    let mut blobs: HashMap<&[u8], u32> = HashMap::new();
    let mut entries = Vec::with_capacity(table_end - HEADER_SIZE as usize);
    for (k, &name_off) in kernels.iter().zip(&name_offs) {
        let insts_off = place(&mut blobs, &mut pool, pool_off, &k.insts)?;
        let pdi_off = if k.pdi.is_empty() {
            0
        } else {
            place(&mut blobs, &mut pool, pool_off, &k.pdi)?
        };
        for v in [
            name_off,
            insts_off,
            to_u32(k.insts.len(), "instruction blob")?,
            pdi_off,
            to_u32(k.pdi.len(), "PDI blob")?,
            k.kernarg_size,
            k.num_cols,
            k.kind.code(),
        ] {
            entries.extend_from_slice(&v.to_le_bytes());
        }
        entries.extend_from_slice(&[0u8; 12]);
    }
    let mut sec = Vec::with_capacity(pool_off + pool.len());
    sec.extend_from_slice(&MAGIC.to_le_bytes());
    sec.extend_from_slice(&VERSION_MAJOR.to_le_bytes());
    sec.extend_from_slice(&VERSION_MINOR.to_le_bytes());
    for v in [
        HEADER_SIZE,
        to_u32(kernels.len(), "kernel count")?,
        ENTRY_SIZE,
        to_u32(str_off, "string table")?,
        to_u32(strings.len(), "string table")?,
        to_u32(pool_off, "blob pool")?,
    ] {
        sec.extend_from_slice(&v.to_le_bytes());
    }
    sec.extend_from_slice(&[0u8; 16]);
    sec.extend_from_slice(&entries);
    sec.extend_from_slice(&strings);
    sec.extend_from_slice(&pool);
    to_u32(sec.len(), "section")?;
    // What we write must pass our own reader.
    parse_section(&sec, arch)?;
    Ok(sec)
}

/// Writes an hsaco file: an ELF64 relocatable (EM_AMDGPU) with `.shstrtab` and one
/// non-loaded section per architecture.
pub fn write(sections: &[Section]) -> Result<Vec<u8>, HsacoError> {
    let mut archs = HashSet::new();
    let mut bodies = Vec::with_capacity(sections.len());
    for s in sections {
        if s.arch.is_empty() || s.arch.contains('\0') || s.arch.starts_with('.') {
            return Err(HsacoError::Write(format!(
                "bad architecture name {:?}",
                s.arch
            )));
        }
        if !archs.insert(s.arch.as_str()) {
            return Err(HsacoError::DuplicateSection(s.arch.clone()));
        }
        bodies.push(build_section(&s.arch, &s.kernels)?);
    }
    let mut shstrtab = vec![0u8];
    let shstrtab_name = shstrtab.len();
    shstrtab.extend_from_slice(b".shstrtab\0");
    let mut name_offs = Vec::new();
    for s in sections {
        name_offs.push(shstrtab.len());
        shstrtab.extend_from_slice(s.arch.as_bytes());
        shstrtab.push(0);
    }
    let mut out = vec![0u8; ELF_HEADER];
    let shstrtab_off = out.len();
    out.extend_from_slice(&shstrtab);
    let mut offs = Vec::new();
    for b in &bodies {
        offs.push(out.len());
        out.extend_from_slice(b);
    }
    while !out.len().is_multiple_of(8) {
        out.push(0);
    }
    let shoff = out.len();
    let shnum = 2 + sections.len();
    let shnum16 =
        u16::try_from(shnum).map_err(|_| HsacoError::Write("too many sections".to_string()))?;
    // ELF header.
    out[0..4].copy_from_slice(b"\x7fELF");
    out[4] = 2; // ELFCLASS64
    out[5] = 1; // little-endian
    out[6] = 1; // EV_CURRENT
    out[16..18].copy_from_slice(&ET_REL.to_le_bytes());
    out[18..20].copy_from_slice(&EM_AMDGPU.to_le_bytes());
    out[20..24].copy_from_slice(&1u32.to_le_bytes());
    out[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
    out[0x34..0x36].copy_from_slice(&(ELF_HEADER as u16).to_le_bytes());
    out[0x3A..0x3C].copy_from_slice(&(SECTION_HEADER as u16).to_le_bytes());
    out[0x3C..0x3E].copy_from_slice(&shnum16.to_le_bytes());
    out[0x3E..0x40].copy_from_slice(&1u16.to_le_bytes());
    let mut sh = |name: usize, ty: u32, flags: u64, off: usize, size: usize| {
        let mut h = [0u8; SECTION_HEADER];
        h[0..4].copy_from_slice(&(name as u32).to_le_bytes());
        h[4..8].copy_from_slice(&ty.to_le_bytes());
        h[8..16].copy_from_slice(&flags.to_le_bytes());
        h[24..32].copy_from_slice(&(off as u64).to_le_bytes());
        h[32..40].copy_from_slice(&(size as u64).to_le_bytes());
        h[48..56].copy_from_slice(&1u64.to_le_bytes()); // sh_addralign
        out.extend_from_slice(&h);
    };
    sh(0, 0, 0, 0, 0);
    sh(shstrtab_name, SHT_STRTAB, 0, shstrtab_off, shstrtab.len());
    for ((b, &off), &name) in bodies.iter().zip(&offs).zip(&name_offs) {
        // SHF_ALLOC clear: noload, readonly.
        sh(name, SHT_PROGBITS, 0, off, b.len());
    }
    Ok(out)
}

/// The common case: one architecture, one PDI + instruction-stream kernel.
pub fn write_single(
    arch: &str,
    name: &str,
    pdi: &[u8],
    insts: &[u8],
    n_args: u32,
    num_cols: u32,
) -> Result<Vec<u8>, HsacoError> {
    write(&[Section {
        arch: arch.to_string(),
        kernels: vec![Kernel::pdi_insts(
            name,
            pdi.to_vec(),
            insts.to_vec(),
            n_args,
            num_cols,
        )],
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_kernels() -> Vec<Kernel> {
        vec![
            Kernel::pdi_insts("k1", vec![9; 16], vec![1, 2, 3, 4], 3, 1),
            Kernel::pdi_insts("k2", vec![9; 16], vec![1, 2, 3, 4], 2, 4),
        ]
    }

    #[test]
    fn round_trip_and_dedup() {
        let f = write(&[Section {
            arch: "aie2p".into(),
            kernels: two_kernels(),
        }])
        .unwrap();
        assert_eq!(read(&f, "aie2p").unwrap(), two_kernels());
        assert_eq!(read(&f, "aie2"), Err(HsacoError::NoSection("aie2".into())));
        // The worked example's layout: entries at 0x30 and 0x5c, strings at 0x88, pool at 0x8e,
        // blobs shared by both kernels.
        let sec = find_section(&f, "aie2p").unwrap();
        assert_eq!(u32_at(sec, 20), Some(0x88));
        assert_eq!(u32_at(sec, 28), Some(0x8e));
        assert_eq!(sec.len(), 0x8e + 4 + 16);
    }

    #[test]
    fn both_archs_in_one_file() {
        let k = two_kernels();
        let f = write(&[
            Section {
                arch: "aie2".into(),
                kernels: k[..1].to_vec(),
            },
            Section {
                arch: "aie2p".into(),
                kernels: k.clone(),
            },
        ])
        .unwrap();
        assert_eq!(read(&f, "aie2").unwrap(), k[..1].to_vec());
        assert_eq!(read(&f, "aie2p").unwrap(), k);
        assert_eq!(read_all(&f).unwrap().len(), 2);
    }

    #[test]
    fn writer_refuses_what_the_reader_refuses() {
        let mut k = two_kernels();
        k[1].name = "k1".into();
        assert!(matches!(
            build_section("aie2p", &k),
            Err(HsacoError::DuplicateName(_))
        ));
        let no_pdi = Kernel::pdi_insts("x", vec![], vec![0; 4], 1, 1);
        assert!(matches!(
            build_section("aie2p", &[no_pdi]),
            Err(HsacoError::BadKernel { .. })
        ));
        let elf = Kernel {
            name: "main:sequence".into(),
            kind: KernelKind::FullElf,
            insts: vec![1; 7],
            pdi: vec![],
            kernarg_size: 32,
            num_cols: 1,
        };
        assert!(build_section("aie2p", std::slice::from_ref(&elf)).is_ok());
        assert!(build_section("aie2", &[elf]).is_err());
    }
}
