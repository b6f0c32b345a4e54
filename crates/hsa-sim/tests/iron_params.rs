//! Run-time parameters of image-version-2 programs (`exec::iron::params`): a hand-written
//! program whose fill and drain sizes follow a param `n` and whose worker loops `n / 16` times
//! through an RTP word, instantiated, run at several values from one load, dispatched with the
//! values in its instruction stream; and the template errors.

mod common;
#[path = "../../../tests/fuzz/mutate.rs"]
mod mutate;

use common::*;
use hsa_runtime64::consts::*;
use hsa_runtime64::cost::AIE2P;
use hsa_runtime64::exec::iron::params::Template;
use hsa_runtime64::exec::iron::program::{BodyOp, CallArg, Program, SeqOp};
use hsa_runtime64::exec::iron::{self, timing::Rates};
use hsa_runtime64::*;
use mutate::{cases, mutated_text, no_hang};
use proptest::prelude::*;
use std::path::PathBuf;
use std::process::Command;

/// y[i] = x[i] + n over int32 objects of 16 elements: the sequence writes n / 16 (the object
/// count) and n into RTP words 0 and 1 of the worker's tile, fills and drains n elements.
const PROGRAM: &str = r#"{
 "name": "addn-aie2p-test", "arch": "aie2p", "device": {"name": "NPU2", "cols": 8},
 "params": [{"name": "n", "min": 16, "max": 64, "step": 16}],
 "rtps": [{"id": 0, "tile": [0, 2], "words": 2}],
 "args": [{"index": 0, "type": "i32", "elem_bytes": 4, "bytes": 256},
          {"index": 1, "type": "i32", "elem_bytes": 4, "bytes": 256}],
 "kernels": [{"symbol": "ggml_hsa_emu_0", "name": "addn",
              "args": [{"kind": "buffer", "bytes": 64}, {"kind": "buffer", "bytes": 64},
                       {"kind": "i32"}]}],
 "fifos": [{"id": 0, "name": "x", "obj_bytes": 64, "elem_bytes": 4, "depth": 2,
            "producer": {"kind": "shim", "tile": [0, 0], "depth": 0},
            "consumers": [{"kind": "core", "tile": [0, 2], "depth": 2}]},
           {"id": 1, "name": "y", "obj_bytes": 64, "elem_bytes": 4, "depth": 2,
            "producer": {"kind": "core", "tile": [0, 2], "depth": 2},
            "consumers": [{"kind": "shim", "tile": [0, 0], "depth": 0}]}],
 "links": [],
 "workers": [{"tile": [0, 2], "stack_bytes": 1024, "body": [
   {"op": "loop", "forever": true, "body": [
     {"op": "loop", "count": {"rtp": [0, 0]}, "body": [
       {"op": "acquire", "fifo": 0, "cons": 0, "n": 1, "var": 0},
       {"op": "acquire", "fifo": 1, "n": 1, "var": 1},
       {"op": "call", "kernel": 0,
        "args": [{"var": 0, "index": 0}, {"var": 1, "index": 0}, {"i32": {"rtp": [0, 1]}}]},
       {"op": "release", "fifo": 0, "cons": 0, "n": 1},
       {"op": "release", "fifo": 1, "n": 1}]}]}]}],
 "sequence": [
   {"op": "rtp", "buffer": 0, "index": 0, "value": {"param": 0, "div": 16}},
   {"op": "rtp", "buffer": 0, "index": 1, "value": {"param": 0}},
   {"op": "fill", "task": 0, "fifo": 0, "arg": 0, "elem_bytes": 4, "wait": false,
    "tap": {"offset": 0, "sizes": [{"param": 0}], "strides": [1]}},
   {"op": "drain", "task": 1, "fifo": 1, "arg": 1, "elem_bytes": 4, "wait": true,
    "tap": {"offset": 0, "sizes": [{"param": 0, "mul": 2, "div": 2}], "strides": [1]}},
   {"op": "await", "tasks": [1]}]}"#;

const KERNEL_C: &str = r#"
#include <stdint.h>
void ggml_hsa_emu_0(const uint64_t *a) {
    const int32_t *x = (const int32_t *)(uintptr_t)a[0];
    int32_t *y = (int32_t *)(uintptr_t)a[1];
    int32_t n = (int32_t)a[2];
    for (int i = 0; i < 16; i++) y[i] = x[i] + n;
}
"#;

/// PROGRAM with `from` replaced by `to` (which must occur).
fn variant(from: &str, to: &str) -> String {
    assert!(PROGRAM.contains(from), "{from}");
    PROGRAM.replacen(from, to, 1)
}

fn template(text: &str) -> Template {
    Template::parse(text)
        .expect("the template parses")
        .expect("the program has parameters")
}

fn parse_err(text: &str) -> String {
    Template::parse(text).expect_err("the template is refused")
}

/// The inner loop's count and the call's i32 argument.
fn loop_count_and_i32(p: &Program) -> (u64, Option<i32>) {
    let BodyOp::Loop { body, .. } = &p.workers[0].body[0] else {
        panic!("outer loop")
    };
    let BodyOp::Loop { count, body, .. } = &body[0] else {
        panic!("inner loop")
    };
    let BodyOp::Call { args, .. } = &body[2] else {
        panic!("call")
    };
    let CallArg { i32: n, .. } = &args[2];
    (*count, *n)
}

/// PROGRAM with n = 32 written out: no params, rtps, rtp ops or expressions.
fn plain_program() -> String {
    let s = PROGRAM
        .replacen(r#"{"rtp": [0, 0]}"#, "2", 1)
        .replacen(r#"{"i32": {"rtp": [0, 1]}}"#, r#"{"i32": 32}"#, 1)
        .replacen(r#"{"param": 0, "mul": 2, "div": 2}"#, "32", 1)
        .replacen(
            r#""params": [{"name": "n", "min": 16, "max": 64, "step": 16}],"#,
            "",
            1,
        )
        .replacen(r#""rtps": [{"id": 0, "tile": [0, 2], "words": 2}],"#, "", 1)
        .replacen(
            r#"{"op": "rtp", "buffer": 0, "index": 0, "value": {"param": 0, "div": 16}},"#,
            "",
            1,
        )
        .replacen(
            r#"{"op": "rtp", "buffer": 0, "index": 1, "value": {"param": 0}},"#,
            "",
            1,
        )
        .replace(r#"{"param": 0}"#, "32");
    assert!(!s.contains("param") && !s.contains("rtp"), "{s}");
    s
}

fn tap_sizes(p: &Program) -> Vec<Vec<u64>> {
    p.sequence
        .iter()
        .filter_map(|op| match op {
            SeqOp::Fill { tap, .. } | SeqOp::Drain { tap, .. } => Some(tap.sizes.clone()),
            SeqOp::Await { .. } => None,
        })
        .collect()
}

#[test]
fn instantiates_taps_and_loop_counts_at_each_value() {
    let t = template(PROGRAM);
    assert_eq!(t.params().len(), 1);
    assert_eq!(t.params()[0].name, "n");
    assert_eq!((t.min_values(), t.max_values()), (vec![16], vec![64]));
    for (n, tiles) in [(32u32, 2u64), (64, 4)] {
        let p = t.instantiate(&[n]).unwrap();
        assert_eq!(
            tap_sizes(&p),
            vec![vec![n as u64], vec![n as u64]],
            "n = {n}"
        );
        assert_eq!(loop_count_and_i32(&p), (tiles, Some(n as i32)), "n = {n}");
        assert_eq!(p.sequence.len(), 3, "the rtp ops are gone");
    }
    // A program without any of the additions is read as it always was.
    let plain = plain_program();
    assert!(Template::parse(&plain).unwrap().is_none());
    let p = Program::parse(&plain).unwrap();
    assert_eq!(loop_count_and_i32(&p), (2, Some(32)));
}

#[test]
fn values_outside_the_params_are_refused() {
    let t = template(PROGRAM);
    for (values, want) in [
        (
            &[8u32][..],
            "run-time parameter n = 8 is not one of 16 to 64 in steps of 16",
        ),
        (&[40], "n = 40 is not one of"),
        (&[80], "n = 80 is not one of"),
        (
            &[],
            "takes 1 run-time parameter(s) (n), the instruction stream carries 0",
        ),
        (&[16, 16], "carries 2 value(s)"),
    ] {
        let e = t.instantiate(values).unwrap_err();
        assert!(e.contains(want), "{values:?}: {e}");
        assert!(e.contains("kernel addn-aie2p-test"), "{e}");
    }
}

#[test]
fn malformed_templates_are_refused_at_parse() {
    let cases: Vec<(String, &str)> = vec![
        // params and rtps
        (
            variant(r#""min": 16"#, r#""min": 0"#),
            "needs 1 <= min <= max",
        ),
        (
            variant(r#""max": 64"#, r#""max": 8"#),
            "needs 1 <= min <= max",
        ),
        (variant(r#""max": 64"#, r#""max": 72"#), "multiples of step"),
        (variant(r#""step": 16"#, r#""step": 0"#), "step >= 1"),
        (variant(r#""max": 64"#, r#""max": 8589934592"#), "< 2^32"),
        (
            variant(r#""step": 16}"#, r#""step": 16, "x": 1}"#),
            "params: unknown field",
        ),
        (
            variant(r#""tile": [0, 2], "words""#, r#""tile": [0, 1], "words""#),
            "row >= 2",
        ),
        (
            variant(r#""words": 2"#, r#""words": 65"#),
            "words (1 to 64)",
        ),
        (
            variant(r#""id": 0, "tile": [0, 2]"#, r#""id": 1, "tile": [0, 2]"#),
            "id 1 at position 0",
        ),
        // rtp ops
        (
            variant(r#""index": 1, "value""#, r#""index": 2, "value""#),
            "word 2 of rtp buffer 0 (2 words)",
        ),
        (
            variant(r#""index": 1, "value""#, r#""index": 0, "value""#),
            "written twice",
        ),
        (
            variant(
                r#"{"op": "rtp", "buffer": 0, "index": 1"#,
                r#"{"op": "rtp", "buffer": 1, "index": 1"#,
            ),
            "rtp buffer 1 does not exist",
        ),
        (
            variant(
                r#"{"op": "await", "tasks": [1]}"#,
                r#"{"op": "await", "tasks": [1]}, {"op": "rtp", "buffer": 0, "index": 1, "value": 3}"#,
            ),
            "sequence op 5: an rtp write after the first task or await",
        ),
        (
            variant(r#""value": {"param": 0}}"#, r#""value": 2147483648}"#),
            "is not an int32",
        ),
        // expressions
        (
            variant(r#"{"param": 0, "div": 16}"#, r#"{"param": 1}"#),
            "param 1 does not exist",
        ),
        (
            variant(r#"{"param": 0, "div": 16}"#, r#"{"param": 0, "div": 0}"#),
            "division by 0",
        ),
        (
            variant(r#"{"param": 0, "div": 16}"#, r#"{"param": 0, "dvi": 16}"#),
            "sequence op 0 (rtp): malformed expression: unknown field `dvi`",
        ),
        (
            variant(
                r#""sizes": [{"param": 0}]"#,
                r#""sizes": [{"rtp": [0, 0]}]"#,
            ),
            "sequence op 2 tap sizes[0]: only a worker reads rtp words",
        ),
        (
            variant(r#""count": {"rtp": [0, 0]}"#, r#""count": {"param": 0}"#),
            "worker 0 body/0/body/0/count (loop count): a worker cannot read a param",
        ),
        (
            variant(
                r#""name": "x", "obj_bytes": 64"#,
                r#""name": "x", "obj_bytes": {"param": 0}"#,
            ),
            "/fifos/0/obj_bytes: an expression where the program takes a constant",
        ),
        (
            variant(
                r#""elem_bytes": 4, "wait": false"#,
                r#""elem_bytes": {"param": 0}, "wait": false"#,
            ),
            "/sequence/2/elem_bytes: an expression where the program takes a constant",
        ),
        (
            variant(
                r#""stack_bytes": 1024"#,
                r#""stack_bytes": {"rtp": [0, 0]}"#,
            ),
            "/workers/0/stack_bytes: an expression",
        ),
        (
            variant(
                r#""acquire", "fifo": 0, "cons": 0, "n": 1"#,
                r#""acquire", "fifo": 0, "cons": 0, "n": {"rtp": [0, 0]}"#,
            ),
            "/workers/0/body/0/body/0/body/0/n: an expression",
        ),
        // rtp words a worker reads
        (
            variant(
                r#"{"op": "rtp", "buffer": 0, "index": 1, "value": {"param": 0}},"#,
                "",
            ),
            "(i32 argument): rtp word [0, 1] is never written by the sequence",
        ),
        (
            variant(
                r#""rtps": [{"id": 0, "tile": [0, 2]"#,
                r#""rtps": [{"id": 0, "tile": [1, 2]"#,
            ),
            "rtp buffer 0 is on tile [1, 2], not on the worker's tile [0, 2]",
        ),
        (
            variant(r#""count": {"rtp": [0, 0]}"#, r#""count": {"rtp": [3, 0]}"#),
            "rtp buffer 3 does not exist",
        ),
    ];
    for (text, want) in &cases {
        let e = parse_err(text);
        assert!(e.contains(want), "want {want:?}, got {e}");
    }
}

#[test]
fn values_that_make_no_integer_are_refused_at_instantiation() {
    // n / 32: exact at 32 and 64, not at 16 or 48.
    let t = template(&variant(
        r#"{"param": 0, "div": 16}"#,
        r#"{"param": 0, "div": 32}"#,
    ));
    assert_eq!(
        loop_count_and_i32(&t.instantiate(&[64]).unwrap()),
        (2, Some(64))
    );
    let e = t.instantiate(&[48]).unwrap_err();
    assert!(
        e.contains("sequence op 0 (rtp): (n = 48) * 1 / 32 + 0 is not an integer")
            && e.contains("(at n = 48)"),
        "{e}"
    );
    // A tap below 0.
    let t = template(&variant(
        r#""offset": 0, "sizes": [{"param": 0}]"#,
        r#""offset": {"param": 0, "add": -32}, "sizes": [{"param": 0}]"#,
    ));
    let e = t.instantiate(&[16]).unwrap_err();
    assert!(
        e.contains("sequence op 2 tap offset: (n = 16) * 1 / 1 + -32 is -16, not a non-negative"),
        "{e}"
    );
    // A tap the concrete program's checks refuse (beyond the operand's 64 elements).
    let e = t.instantiate(&[64]).unwrap_err();
    assert!(
        e.contains("goes beyond 64 elements") && e.contains("(at n = 64)"),
        "{e}"
    );
    // A loop count from a negative word.
    let t = template(&variant(
        r#""value": {"param": 0, "div": 16}"#,
        r#""value": -1"#,
    ));
    let e = t.instantiate(&[16]).unwrap_err();
    assert!(
        e.contains(
            "worker 0 body/0/body/0/count (loop count): loop count from rtp word [0, 0] is -1"
        ),
        "{e}"
    );
}

/// The kernel library, built once with the host's C compiler.
fn library() -> Vec<u8> {
    static LIB: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    LIB.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("iron-params-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, lib): (PathBuf, PathBuf) = (dir.join("k.c"), dir.join("k.so"));
        std::fs::write(&src, KERNEL_C).unwrap();
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&lib)
            .arg(&src)
            .output()
            .expect("run cc");
        assert!(
            out.status.success(),
            "cc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bytes = std::fs::read(&lib).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        bytes
    })
    .clone()
}

fn image_of(program: &str, library: &[u8]) -> Vec<u8> {
    let mut img = image::IMAGE_MAGIC.to_vec();
    for w in [
        image::IMAGE_V2,
        program.len() as u32,
        library.len() as u32,
        0,
    ] {
        img.extend(w.to_le_bytes());
    }
    img.extend_from_slice(program.as_bytes());
    img.extend_from_slice(library);
    img
}

fn x_bytes() -> Vec<u8> {
    (0..64i32).flat_map(|i| (i * 3).to_le_bytes()).collect()
}

fn ints(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// y = x + n over the first n elements, the rest untouched.
fn want(n: usize) -> Vec<i32> {
    (0..64i32)
        .map(|i| {
            if (i as usize) < n {
                i * 3 + n as i32
            } else {
                -1
            }
        })
        .collect()
}

#[test]
fn one_load_runs_at_every_value() {
    let img = image_of(PROGRAM, &library());
    let loaded = iron::load(&img).expect("loads");
    assert!(
        std::sync::Arc::ptr_eq(&loaded, &iron::load(&img).unwrap()),
        "cached"
    );
    let mut l = loaded.lock();
    assert_eq!(l.params()[0].name, "n");
    for n in [32usize, 16, 64, 48, 32] {
        let mut bufs = vec![x_bytes(), vec![0xff; 256]];
        let stats = iron::execute_buffers(&mut l, &[n as u32], &mut bufs, Rates::of(&AIE2P))
            .unwrap_or_else(|e| panic!("n = {n}: {e}"));
        assert_eq!(ints(&bufs[1]), want(n), "n = {n}");
        assert!(stats.timeline.is_some());
    }
    let mut bufs = vec![x_bytes(), vec![0xff; 256]];
    let e = iron::execute_buffers(&mut l, &[], &mut bufs, Rates::of(&AIE2P)).unwrap_err();
    assert!(e.contains("takes 1 run-time parameter(s) (n)"), "{e}");
    let e = iron::execute_buffers(&mut l, &[24], &mut bufs, Rates::of(&AIE2P)).unwrap_err();
    assert!(e.contains("n = 24 is not one of 16 to 64"), "{e}");
}

#[test]
fn a_template_failing_at_its_maximum_fails_to_load() {
    // The drain walks 2n elements: fine at n = 16, beyond the operand at n = 64.
    let text = variant(
        r#"{"param": 0, "mul": 2, "div": 2}"#,
        r#"{"param": 0, "mul": 2}"#,
    );
    let e = iron::load(&image_of(&text, b"not loaded before the check")).unwrap_err();
    assert!(
        e.starts_with("emulation image: ")
            && e.contains("goes beyond")
            && e.contains("(at n = 64)"),
        "{e}"
    );
}

/// The image in the dev heap with the instruction stream carrying `values`.
fn load_with(pools: &Pools, img: &[u8], insts: &[u8]) -> Kernel {
    let pdi = alloc(pools.dev, img.len());
    write_bytes(pdi, img);
    let ip = alloc(pools.dev, insts.len());
    write_bytes(ip, insts);
    Kernel {
        pdi,
        insts: ip,
        insts_bytes: insts.len(),
        kernel_object: 0,
    }
}

/// Dispatches `img` with `insts` under ABI A2: the output's ints, or the error message.
fn dispatch(img: &[u8], insts: &[u8], execute: bool) -> Result<Vec<i32>, String> {
    let s = Session::start(Config {
        execute,
        ..quiet(PacketAbi::A2)
    });
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    let k = load_with(&pools, img, insts);
    let x = alloc(pools.data, 256);
    write_bytes(x, &x_bytes());
    let y = alloc(pools.data, 256);
    write_bytes(y, &[0xff; 256]);
    let sig = new_signal(1);
    q.submit(&[packet_for(
        PacketAbi::A2,
        &pools,
        &k,
        &[(x, 256), (y, 256)],
        sig.handle,
    )]);
    if errors().is_empty() {
        assert_eq!(load(sig), 0);
        let mut out = vec![0u8; 256];
        // SAFETY: y is a live 256-byte allocation of this session.
        unsafe { std::ptr::copy_nonoverlapping(y, out.as_mut_ptr(), 256) };
        Ok(ints(&out))
    } else {
        assert_eq!(errors(), vec![HSA_STATUS_ERROR]);
        assert_eq!(load(sig), -1);
        Err(counters().last_error)
    }
}

#[test]
fn dispatch_takes_the_values_from_the_instruction_stream() {
    let img = image_of(PROGRAM, &library());
    let with = |v: &[u32]| image::encode_insts_v2_with(&img, v);
    assert_eq!(dispatch(&img, &with(&[48]), true), Ok(want(48)));
    assert_eq!(dispatch(&img, &with(&[16]), true), Ok(want(16)));
    // HSA_SIM_EXECUTE=0 accepts the values a run would (and leaves the output as it was).
    assert_eq!(dispatch(&img, &with(&[64]), false), Ok(vec![-1; 64]));
    for (values, msg) in [
        (&[][..], "kernel addn-aie2p-test takes 1 run-time parameter(s) (n), the instruction stream carries 0 value(s)"),
        (&[40], "kernel addn-aie2p-test: run-time parameter n = 40 is not one of 16 to 64 in steps of 16"),
        (&[0], "n = 0 is not one of"),
        (&[16, 16], "carries 2 value(s)"),
    ] {
        for execute in [true, false] {
            let e = dispatch(&img, &with(values), execute).unwrap_err();
            assert!(e.contains(msg), "{values:?} (execute {execute}): {e}");
        }
    }
    // The stream's words must be the ones it says it has.
    let mut short = with(&[32]);
    short[12] = 8;
    let e = dispatch(&img, &short, true).unwrap_err();
    assert!(e.contains("does not match the stream's own length"), "{e}");
}

#[test]
fn programs_without_params_take_no_values() {
    let plain = plain_program();
    let img = image_of(&plain, &library());
    assert_eq!(
        dispatch(&img, &image::encode_insts_v2(&img), true),
        Ok(want(32))
    );
    let e = dispatch(&img, &image::encode_insts_v2_with(&img, &[32]), true).unwrap_err();
    assert!(
        e.contains("kernel addn-aie2p-test takes no run-time parameters, the instruction stream carries 1 value(s)"),
        "{e}"
    );
    // A reference image (version 1) takes none either.
    let d = add_desc();
    let img = image::encode_image(&d);
    let mut insts = image::encode_insts(&img);
    insts[12] = 9;
    insts.extend(7u32.to_le_bytes());
    let s = Session::start(quiet(PacketAbi::A2));
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    let k = load_with(&pools, &img, &insts);
    let ops: Vec<(*mut u8, usize)> = (0..3).map(|_| (alloc(pools.data, 96), 96)).collect();
    q.submit(&[packet_for(PacketAbi::A2, &pools, &k, &ops, 0)]);
    assert_eq!(errors(), vec![HSA_STATUS_ERROR]);
    let e = counters().last_error;
    assert!(e.contains("kernel add takes no run-time parameters"), "{e}");
}

fn add_desc() -> image::KernelDesc {
    desc(
        "add",
        "aie2p",
        "ADD",
        vec![f32_tensor([8, 3, 1, 1]), f32_tensor([8, 3, 1, 1])],
        f32_tensor([8, 3, 1, 1]),
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// A mutated template never panics: it is refused with a message, or it instantiates (or
    /// is refused) at its range's ends and at values outside it.
    #[test]
    fn mutated_templates_are_refused_or_instantiated(
        text in mutated_text(vec![PROGRAM.as_bytes().to_vec()]),
    ) {
        let errors = no_hang("Template::parse", move || match Template::parse(&text) {
            Ok(Some(t)) => [t.min_values(), t.max_values(), vec![32], vec![], vec![7, 7]]
                .iter()
                .filter_map(|v| t.instantiate(v).err())
                .collect(),
            Ok(None) => Vec::new(),
            Err(e) => vec![e],
        });
        prop_assert!(errors.iter().all(|e| !e.is_empty()));
    }
}
