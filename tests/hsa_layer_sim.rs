//! The HSA layer (`src/hsa`) driving the hsa-sim software NPU the way the backend will: find the
//! AIE agent and its pools, load a kernel into the dev heap, create a queue, encode dispatches with
//! each packet ABI, ring the doorbell and read the results back.
//!
//! The simulator reads its configuration at `hsa_init`, once per process, so each packet ABI runs
//! in its own child process (this test binary, running the ignored `child_*` test).

mod common;

use std::path::Path;
use std::process::Command;

use ggml_hsa::hsa::loader::Candidate;
use ggml_hsa::hsa::memory::{select_pools, AgentPools};
use ggml_hsa::hsa::packet::{Dispatch, Operand, PacketAbi};
use ggml_hsa::hsa::signal::DEVICE_TIMEOUT;
use ggml_hsa::hsa::sys::HSA_DEVICE_TYPE_AIE;
use ggml_hsa::hsa::{AgentDesc, Runtime};

const N: usize = 256;

fn run_child(abi: PacketAbi, counters: &Path) -> String {
    common::run_child_test(
        "child_add_and_batch",
        &[
            ("HSA_SIM_PACKET_ABI", abi.name().as_ref()),
            ("HSA_SIM_COUNTERS", counters.as_os_str()),
            ("GGML_HSA_TEST_ABI", abi.name().as_ref()),
        ],
    );
    std::fs::read_to_string(counters).expect("counters written by the simulator")
}

fn counter(json: &str, key: &str) -> u64 {
    let at = json
        .find(&format!("\"{key}\": "))
        .unwrap_or_else(|| panic!("{key} in {json}"));
    json[at + key.len() + 4..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap()
}

#[test]
fn every_packet_abi_dispatches_on_the_simulator() {
    let dir = common::scratch_dir("hsa-layer-sim");
    for abi in PacketAbi::ALL {
        let counters = dir.join(format!("counters-{abi}.json"));
        let json = run_child(abi, &counters);
        assert!(
            json.contains(&format!("\"packet_abi\": \"{abi}\"")),
            "{json}"
        );
        // Two single dispatches, then 20 packets behind one doorbell (and under c one refused
        // packet naming a destroyed executable's kernel object).
        let c = u64::from(abi == PacketAbi::C);
        assert_eq!(counter(&json, "doorbells"), 3 + c, "{abi}: {json}");
        assert_eq!(counter(&json, "dispatches"), 22, "{abi}: {json}");
        assert_eq!(counter(&json, "chains"), 3, "{abi}: {json}");
        assert_eq!(counter(&json, "pdi_loads"), 1, "{abi}: {json}");
        assert_eq!(counter(&json, "dispatch_errors"), c, "{abi}: {json}");
    }
}

struct Kernel {
    pdi: ggml_hsa::hsa::memory::PoolAlloc,
    insts: ggml_hsa::hsa::memory::PoolAlloc,
    /// ABI c: the kernel loaded as an AIE code object (wrapping the same PDI and instructions).
    object: Option<ggml_hsa::hsa::executable::KernelObject>,
}

fn compile_add(
    rt: &'static Runtime,
    agent: ggml_hsa::hsa::sys::hsa_agent_t,
    pools: &AgentPools,
    dir: &Path,
) -> Kernel {
    let t = format!(
        r#"{{"ne":[{N},1,1,1],"nb":[4,{},{},{}],"type":"f32"}}"#,
        4 * N,
        4 * N,
        4 * N
    );
    let request = format!(
        r#"{{"name":"add_f32_{N}","arch":"aie2p","op":"ADD","op_params":[],"inputs":[{t},{t}],"output":{t}}}"#
    );
    let req = dir.join("request.json");
    std::fs::write(&req, request).unwrap();
    let out = Command::new(common::sim_artifact("hsa-sim-compile"))
        .args(["compile", "--request"])
        .arg(&req)
        .arg("--output-dir")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let load = |file: &str| {
        let bytes = std::fs::read(dir.join(file)).unwrap();
        let mut alloc = rt.allocate(pools.dev_heap.pool, bytes.len()).unwrap();
        alloc.as_mut_slice()[..bytes.len()].copy_from_slice(&bytes);
        (alloc, bytes.len())
    };
    let (pdi, _) = load(&format!("add_f32_{N}.pdi"));
    let (insts, _) = load(&format!("add_f32_{N}_insts.bin"));
    let name = format!("add_f32_{N}");
    let hsaco = aie_hsaco::write_single(
        "aie2p",
        &name,
        &std::fs::read(dir.join(format!("{name}.pdi"))).unwrap(),
        &std::fs::read(dir.join(format!("{name}_insts.bin"))).unwrap(),
        3,
        1,
    )
    .unwrap();
    let loaded = rt.load_code_object(agent, &hsaco, &[&name]);
    // Only a generation-c runtime loads an AIE code object (what the auto probe relies on).
    let c = std::env::var("GGML_HSA_TEST_ABI").unwrap() == "c";
    assert_eq!(loaded.is_ok(), c, "{loaded:?}");
    assert_eq!(rt.probe_code_objects(agent, "aie2p"), c);
    let object = loaded.ok().map(|mut k| k.remove(0));
    if let Some(k) = &object {
        assert_ne!(k.handle, 0);
        assert_eq!(k.kernarg_size, 48);
    }
    Kernel { pdi, insts, object }
}

fn f32s(alloc: &ggml_hsa::hsa::memory::PoolAlloc) -> Vec<f32> {
    alloc.as_slice()[..4 * N]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
#[ignore = "run by every_packet_abi_dispatches_on_the_simulator in a child process"]
fn child_add_and_batch() {
    let abi: PacketAbi = std::env::var("GGML_HSA_TEST_ABI").unwrap().parse().unwrap();
    let sim = common::sim_artifact("libhsa_runtime64.so");
    let rt: &'static Runtime = Box::leak(Box::new(
        Runtime::open(&[Candidate::File(sim)]).expect("the simulator loads"),
    ));
    let agents = rt.agents().unwrap();
    let npu: &AgentDesc = agents
        .iter()
        .find(|a| a.device_type == HSA_DEVICE_TYPE_AIE)
        .expect("an AIE agent");
    assert_eq!(npu.name, "aie2p");
    let pools = select_pools(&rt.pools(npu.agent).unwrap()).unwrap();
    assert_eq!(pools.dev_heap.size, 64 << 20, "ROCR's 64 MiB dev heap");

    let dir = common::scratch_dir(&format!("hsa-layer-sim-{abi}"));
    let kernel = compile_add(rt, npu.agent, &pools, &dir);
    let mut a = rt.allocate(pools.data.pool, 4 * N).unwrap();
    let mut b = rt.allocate(pools.data.pool, 4 * N).unwrap();
    for i in 0..N {
        a.as_mut_slice()[4 * i..4 * i + 4].copy_from_slice(&(i as f32).to_le_bytes());
        b.as_mut_slice()[4 * i..4 * i + 4].copy_from_slice(&(0.5f32).to_le_bytes());
    }
    let outs: Vec<_> = (0..20)
        .map(|_| rt.allocate(pools.data.pool, 4 * N).unwrap())
        .collect();

    let format = abi.format();
    let mut queue = rt.queue(npu.agent).unwrap();
    let signal = rt.signal(0).unwrap();
    let operands = |out: &ggml_hsa::hsa::memory::PoolAlloc| {
        [a.device_addr(), b.device_addr(), out.device_addr()].map(|addr| Operand {
            addr,
            size: 4 * N as u64,
        })
    };
    let encode = |ops: &[Operand], args: &mut ggml_hsa::hsa::memory::PoolAlloc| {
        let addr = args.device_addr();
        format
            .encode(
                &Dispatch {
                    kernel_object: kernel.object.as_ref().map_or(0, |k| k.handle),
                    pdi_addr: kernel.pdi.device_addr(),
                    insts_addr: kernel.insts.device_addr(),
                    insts_bytes: kernel.insts.size() as u64 & !3,
                    operands: ops,
                },
                args.as_mut_slice(),
                addr,
                signal.handle(),
            )
            .unwrap()
    };
    let arg_bytes = format.args_bytes(3);

    // One dispatch, then a second one with freshly filled argument memory: the runtime rewrote
    // part of the first payload, so reusing it would fail.
    for _ in 0..2 {
        let mut args = rt.allocate(pools.kernarg.pool, arg_bytes).unwrap();
        let packet = encode(&operands(&outs[0]), &mut args);
        signal.store(1);
        queue.submit(&[packet]).unwrap();
        if format.signals_completion() {
            signal.wait_eq(0, DEVICE_TIMEOUT).unwrap();
        }
        let got = f32s(&outs[0]);
        assert!(
            got.iter().enumerate().all(|(i, &v)| v == i as f32 + 0.5),
            "{got:?}"
        );
    }

    // Twenty dispatches behind one doorbell.
    let mut args: Vec<_> = (0..20)
        .map(|_| rt.allocate(pools.kernarg.pool, arg_bytes).unwrap())
        .collect();
    let packets: Vec<[u8; 64]> = outs
        .iter()
        .zip(args.iter_mut())
        .map(|(out, args)| encode(&operands(out), args))
        .collect();
    signal.store(20);
    queue.submit(&packets).unwrap();
    if format.signals_completion() {
        signal.wait_eq(0, DEVICE_TIMEOUT).unwrap();
    }
    for out in &outs {
        assert_eq!(f32s(out)[N - 1], (N - 1) as f32 + 0.5);
    }

    // ABI c: dropping the last reference destroys the executable (RAII); its kernel object is
    // then refused by the runtime, which reports it through the queue's error callback and
    // suspends the queue.
    if let Some(object) = kernel.object.as_ref() {
        let stale = object.handle;
        drop(packets);
        let Kernel { object, .. } = kernel;
        drop(object);
        let mut args = rt.allocate(pools.kernarg.pool, arg_bytes).unwrap();
        let addr = args.device_addr();
        let packet = format
            .encode(
                &Dispatch {
                    kernel_object: stale,
                    pdi_addr: 0,
                    insts_addr: 0,
                    insts_bytes: 0,
                    operands: &operands(&outs[0]),
                },
                args.as_mut_slice(),
                addr,
                signal.handle(),
            )
            .unwrap();
        match queue.submit(&[packet]) {
            Err(ggml_hsa::hsa::queue::SubmitError::Runtime { status, ran }) => {
                assert_eq!(
                    status,
                    ggml_hsa::hsa::sys::HSA_STATUS_ERROR_INVALID_PACKET_FORMAT
                );
                assert_eq!(ran, 0);
            }
            other => panic!("a destroyed executable's kernel object ran: {other:?}"),
        }
    }
}
