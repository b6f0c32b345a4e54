//! The table of rewrites, in the order they are tried, and the adapters that turn each builder's
//! finding into [`Rewritten`] kernels.

use super::builders as b;
use super::{CacheRows, Graph, Planned, Rewritten};
use crate::kernels::KernelDesc;
use crate::ops::plan::Plan;
use crate::ops::scatter::RowScatter;
use crate::ops::tensor::{Node, Op, Tensor};

/// When a rewrite is tried: the kernels of each stage are loaded (and the refused ones given
/// back their nodes' steps) before the next stage looks at the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Runs of nodes into one kernel, and kernels folded into the kernels reading their
    /// results.
    Fusions,
    /// Where the compiler refused a block's kernel, the largest part of it it may take.
    Parts,
    /// SET_ROWS as a copy into the cache rows its indices name.
    CacheCopies,
    /// The kernel computing a copy's source writing the rows itself.
    CacheProducers,
    /// Q's, K's and V's kernels into one.
    Projections,
    /// A decode layer's kernels into one.
    Layers,
}

impl Stage {
    pub const ALL: [Stage; 6] = [
        Stage::Fusions,
        Stage::Parts,
        Stage::CacheCopies,
        Stage::CacheProducers,
        Stage::Projections,
        Stage::Layers,
    ];
}

/// One rewrite.
#[derive(Debug)]
pub struct Rewrite {
    /// The kernel it makes (catalogue name; `<GLU>` and `[_FF]` are parameters).
    pub name: &'static str,
    pub stage: Stage,
    /// The node the builder is asked about.
    pub anchor: &'static str,
    /// The work its kernel takes over.
    pub absorbs: &'static str,
    /// The builder: the kernels to make when the graph has the pattern at the anchor (none
    /// otherwise).
    pub build: fn(&Graph, usize) -> Vec<Rewritten>,
}

/// Every rewrite, in the order they are tried.
pub const REWRITES: &[Rewrite] = &[
    Rewrite {
        name: "RMS_NORM_MUL",
        stage: Stage::Fusions,
        anchor: "RMS_NORM",
        absorbs: "the MUL by one weight row right after it (ggml's own fusion rule)",
        build: rms_norm_mul,
    },
    Rewrite {
        name: "MUL_MAT_<GLU>",
        stage: Stage::Fusions,
        anchor: "MUL_MAT",
        absorbs: "the next MUL_MAT of the same x (weights of one type and shape) and the split \
                  GLU of the two products after them",
        build: mul_mat_glu,
    },
    Rewrite {
        name: "MUL_MAT_<GLU>",
        stage: Stage::Fusions,
        anchor: "MUL_MAT",
        absorbs: "the split GLU of its product's two halves right after it (phi3's ffn_up: the \
                  gate's rows, then the up projection's)",
        build: mul_mat_glu_halves,
    },
    Rewrite {
        name: "MUL_MAT_ADD",
        stage: Stage::Fusions,
        anchor: "MUL_MAT",
        absorbs: "the ADD of its product and an f32 tensor after it (views in between)",
        build: mul_mat_add,
    },
    Rewrite {
        name: "RMS_NORM_MUL_ADD",
        stage: Stage::Fusions,
        anchor: "an ADD kernel",
        absorbs: "the RMS_NORM_MUL kernel computing one of its inputs (gemma's norms after the \
                  attention and the block, then the residual)",
        build: |g, at| one(b::fold_rms_norm_mul_add(g.nodes, at, |k| g.planned(k))),
    },
    Rewrite {
        name: "RMS_NORM_MUL_MAT[_<GLU>]",
        stage: Stage::Fusions,
        anchor: "an RMS_NORM_MUL kernel",
        absorbs: "itself, into every MUL_MAT or MUL_MAT_<GLU> kernel reading its output",
        build: |g, at| b::fold_rms_norm(g.nodes, at, |k| g.planned(k)).unwrap_or_default(),
    },
    Rewrite {
        name: "[RMS_NORM_]MUL_MAT of weight rows",
        stage: Stage::Fusions,
        anchor: "a MUL_MAT or RMS_NORM_MUL_MAT kernel of one token",
        absorbs: "itself, into the views of whole row ranges of its product (phi3's Q, K and V \
                  of one attn_qkv matrix), each computing its rows at its node",
        build: |g, at| b::split_projection(g.nodes, at, |k| g.planned(k)),
    },
    Rewrite {
        name: "RMS_NORM_MUL_MAT_<GLU>",
        stage: Stage::Fusions,
        anchor: "a GLU kernel",
        absorbs: "the two RMS_NORM_MUL_MAT kernels of one x computing its inputs, or the one \
                  computing both halves of its one input (phi3's ffn_up, one token)",
        build: |g, at| one(b::fold_glu(g.nodes, at, |k| g.planned(k))),
    },
    Rewrite {
        name: "RMS_NORM_MUL_MAT_ROPE[_FF]",
        stage: Stage::Fusions,
        anchor: "a ROPE kernel",
        absorbs: "the RMS_NORM_MUL_MAT kernel computing its input",
        build: |g, at| one(b::fold_rope(g.nodes, at, |k| g.planned(k))),
    },
    Rewrite {
        name: "FLASH_ATTN_EXT[_MASK][_SINKS]",
        stage: Stage::Fusions,
        anchor: "an attention kernel",
        absorbs: "the bias-free SCALE kernel computing its q, as a factor of its scale",
        build: |g, at| one(b::fold_scale_into_attention(g.nodes, at, |k| g.planned(k))),
    },
    Rewrite {
        name: "RMS_NORM_FFN_<GLU>",
        stage: Stage::Fusions,
        anchor: "a MUL_MAT_ADD kernel",
        absorbs: "the RMS_NORM_MUL_MAT_<GLU> kernel computing its activations",
        build: |g, at| one(b::fold_ffn(g.nodes, at, |k| g.planned(k))),
    },
    Rewrite {
        name: "MUL_MAT_ADD_RMS_NORM_FFN_<GLU>",
        stage: Stage::Fusions,
        anchor: "an RMS_NORM_FFN_<GLU> kernel",
        absorbs: "the MUL_MAT_ADD kernel computing its input and residual",
        build: |g, at| one(b::fold_attn_ffn(g.nodes, at, |k| g.planned(k))),
    },
    Rewrite {
        name: "FLASH_ATTN_FFN_<GLU>",
        stage: Stage::Fusions,
        anchor: "a MUL_MAT_ADD_RMS_NORM_FFN_<GLU> kernel",
        absorbs: "the FLASH_ATTN_EXT_MASK kernel computing its projection's input",
        build: |g, at| one(b::fold_flash_attn_ffn(g.nodes, at, |k| g.planned(k))),
    },
    Rewrite {
        name: "FLASH_ATTN_GLU_<GLU>",
        stage: Stage::Parts,
        anchor: "an RMS_NORM_MUL_MAT_<GLU> kernel (left where FLASH_ATTN_FFN_<GLU> was refused)",
        absorbs: "the MUL_MAT_ADD kernel computing its x and the FLASH_ATTN_EXT_MASK kernel \
                  computing that projection's input: the block's down projection stays a \
                  kernel of its own (a Wd of another weight type)",
        build: |g, at| one(b::fold_flash_attn_glu(g.nodes, at, |k| g.planned(k))),
    },
    Rewrite {
        name: "CPY",
        stage: Stage::CacheCopies,
        anchor: "a SET_ROWS (a kernel, or on the host or the CPU) whose indices no node of the \
                 graph writes",
        absorbs: "nothing: it copies into the rows the indices name, when they are consecutive",
        build: cache_copy,
    },
    Rewrite {
        name: "<the source's kernel, writing the cache's type>",
        stage: Stage::CacheProducers,
        anchor: "a SET_ROWS copy",
        absorbs: "the copy: the ROPE or MUL_MAT kernel computing its source writes the rows",
        build: cache_producer,
    },
    Rewrite {
        name: "RMS_NORM_QKV_ROPE[_FF]",
        stage: Stage::Projections,
        anchor: "V's RMS_NORM_MUL_MAT kernel writing cache rows (or, for a cache per \
                 sequence, its f32 output copied into them)",
        absorbs: "Q's and K's RMS_NORM_MUL_MAT_ROPE[_FF] kernels of the same x (K's writing \
                  cache rows, or copied into them as V's)",
        build: qkv_merge,
    },
    Rewrite {
        name: "DECODE_LAYER[_BIAS|_HEAD_NORM][_FF]_<GLU>",
        stage: Stage::Layers,
        anchor: "an RMS_NORM_QKV[_BIAS|_HEAD_NORM]_ROPE[_FF] kernel",
        absorbs: "K's and V's SET_ROWS and the FLASH_ATTN_FFN_<GLU> kernel reading Q and the \
                  caches",
        build: |g, at| layer_merge(g, at, b::merge_layer),
    },
    Rewrite {
        name: "DECODE_LAYER[_HEAD_NORM]_POST_NORM_<GLU>",
        stage: Stage::Layers,
        anchor: "an RMS_NORM_QKV[_HEAD_NORM]_ROPE kernel",
        absorbs: "K's and V's SET_ROWS and gemma's kernels after them: the FLASH_ATTN_EXT_MASK \
                  reading Q and the caches, the output projection's MUL_MAT, its norm and \
                  residual (RMS_NORM_MUL_ADD), the block's RMS_NORM_MUL_MAT_<GLU>, its down \
                  projection's MUL_MAT and their norm and residual (RMS_NORM_MUL_ADD)",
        build: |g, at| layer_merge(g, at, b::merge_post_norm_layer),
    },
];

/// The one kernel a builder found, if it found one.
fn one(found: Option<Rewritten>) -> Vec<Rewritten> {
    found.into_iter().collect()
}

/// A run of `n` nodes from `at` as the kernel `plan`: each a kernel of its own or a view.
fn run(g: &Graph, at: usize, n: usize, plan: Option<Plan>) -> Vec<Rewritten> {
    let Some(Plan::Kernel { desc, operands }) = plan else {
        return Vec::new();
    };
    let own = (at..at + n).all(|k| {
        matches!(g.planned(k), Planned::Kernel(..) | Planned::Nothing)
            && g.steps.covers(k).is_empty()
    });
    if !own {
        return Vec::new();
    }
    vec![Rewritten::kernel(
        at,
        (at + 1..at + n).collect(),
        desc,
        operands,
    )]
}

fn rms_norm_mul(g: &Graph, at: usize) -> Vec<Rewritten> {
    let [norm, mul, later @ ..] = &g.nodes[at..] else {
        return Vec::new();
    };
    run(g, at, 2, b::fuse_rms_norm_mul(norm, mul, later))
}

fn mul_mat_glu(g: &Graph, at: usize) -> Vec<Rewritten> {
    let [p, q, glu, later @ ..] = &g.nodes[at..] else {
        return Vec::new();
    };
    run(g, at, 3, b::fuse_mul_mat_glu([p, q], glu, later, g.options))
}

fn mul_mat_glu_halves(g: &Graph, at: usize) -> Vec<Rewritten> {
    let [mm, glu, later @ ..] = &g.nodes[at..] else {
        return Vec::new();
    };
    run(
        g,
        at,
        2,
        b::fuse_mul_mat_glu_halves(mm, glu, later, g.options),
    )
}

fn mul_mat_add(g: &Graph, at: usize) -> Vec<Rewritten> {
    let [mm, rest @ ..] = &g.nodes[at..] else {
        return Vec::new();
    };
    // Views between the product and its ADD compute nothing (llama's last layer: its two
    // one-row GET_ROWS, forwarded as views by `ops::forward_gathers`).
    let views = rest.iter().take_while(|n| n.op == Op::Layout).count();
    let [add, later @ ..] = &rest[views..] else {
        return Vec::new();
    };
    run(
        g,
        at,
        2 + views,
        b::fuse_mul_mat_add(mm, add, later, g.options),
    )
}

/// A SET_ROWS whose indices the application set (llama.cpp's KV-cache slots): a copy into the
/// rows they name. The SET_ROWS as planned (its kernel, or the host or the CPU where no kernel
/// takes its shape or types) is the copy's fallback.
fn cache_copy(g: &Graph, at: usize) -> Vec<Rewritten> {
    let node = &g.nodes[at];
    let planned = matches!(g.planned(at), Planned::Kernel(..) | Planned::Elsewhere);
    if !planned || !g.steps.rows(at).is_empty() {
        return Vec::new();
    }
    let Some(scatter) = RowScatter::of(node, |_| true) else {
        return Vec::new();
    };
    let computed = g.nodes[..at].iter().any(|n| n.dst.overlaps(&scatter.idx));
    if scatter.idx.addr == 0 || computed {
        return Vec::new();
    }
    let operands = scatter.copy_operands();
    vec![Rewritten {
        at,
        covers: Vec::new(),
        desc: scatter.copy.clone(),
        rows: vec![CacheRows {
            operand: operands.len() - 1,
            set_rows: at,
            scatter,
        }],
        operands,
        n_kv: None,
    }]
}

/// Whether the cache `dst` (a SET_ROWS's destination at node `at`) is read by an attention
/// over several streams: llama.cpp's cache per sequence with a step of several sequences, each
/// writing its own stream's rows, which are never consecutive.
fn per_sequence_cache(nodes: &[Node], at: usize, dst: &Tensor) -> bool {
    nodes[at + 1..].iter().any(|n| {
        n.op == Op::FlashAttnExt
            && n.src(0).is_some_and(|q| q.ne[3] > 1)
            && [n.src(1), n.src(2)]
                .into_iter()
                .flatten()
                .any(|kv| kv.overlaps(dst))
    })
}

/// The producer of a SET_ROWS copy's source, writing the rows itself. Not for a cache per
/// sequence read by several streams at once: its rows are apart, and the producer would run as
/// its f32 kernel and the copies anyway (Q's, K's and V's f32 kernels merge instead:
/// `qkv_merge`).
fn cache_producer(g: &Graph, at: usize) -> Vec<Rewritten> {
    let [copy] = g.steps.rows(at) else {
        return Vec::new();
    };
    if copy.set_rows != at || per_sequence_cache(g.nodes, at, copy.scatter.destination()) {
        return Vec::new();
    }
    // The kernel computing node j: its own, or the one covering it whose last node it is (a
    // MUL_MAT_ADD's ADD). A kernel computing nodes after j computes more than j: it is not
    // retargeted.
    let kernel_of = |j: usize| {
        let k = match g.planned(j) {
            Planned::Covered => (0..j).rev().find(|&k| g.steps.covers(k).contains(&j))?,
            _ => j,
        };
        match g.planned(k) {
            Planned::Kernel(desc, operands)
                if g.steps.rows(k).is_empty() && g.steps.covers(k).iter().all(|&c| c <= j) =>
            {
                Some((k, desc, operands))
            }
            _ => None,
        }
    };
    let skipped = |k: usize| matches!(g.planned(k), Planned::Nothing);
    let Some((j, producer)) = copy.scatter.producer(g.nodes, at, kernel_of, skipped) else {
        return Vec::new();
    };
    let mut operands = producer.inputs;
    operands.push(copy.scatter.rows_placeholder());
    vec![Rewritten {
        at: j,
        covers: Vec::new(),
        desc: producer.kernel,
        rows: vec![CacheRows {
            operand: operands.len() - 1,
            set_rows: at,
            scatter: copy.scatter.clone(),
        }],
        operands,
        n_kv: None,
    }]
}

/// The cache rows node `k`'s kernel writes in place of its SET_ROWS's copy.
fn produced_rows<'a>(g: &Graph<'a>, k: usize) -> Option<&'a CacheRows> {
    match g.steps.rows(k) {
        [rows] if rows.set_rows != k => Some(rows),
        _ => None,
    }
}

/// K's and V's cache rows as the next two operands (their placeholders until the graph runs).
fn append_rows(operands: &mut Vec<Tensor>, rows: [&CacheRows; 2]) -> Vec<CacheRows> {
    rows.iter()
        .map(|r| {
            operands.push(r.scatter.rows_placeholder());
            CacheRows {
                operand: operands.len() - 1,
                ..(*r).clone()
            }
        })
        .collect()
}

/// The SET_ROWS copy (its node) of the f32 output of node `k`'s kernel, where the kernel does
/// not write the rows itself (a cache per sequence: `cache_producer`): the copy of exactly that
/// output, before a node computes over its memory (reused by a later node's result).
fn copied_by(g: &Graph, k: usize) -> Option<usize> {
    let Planned::Kernel(_, operands) = g.planned(k) else {
        return None;
    };
    let out = operands.last()?;
    for s in k + 1..g.nodes.len() {
        match g.steps.rows(s) {
            [r] if r.set_rows == s => {
                let src = r.scatter.source();
                if src.addr == out.addr && src.bytes == out.bytes {
                    return Some(s);
                }
            }
            _ if g.nodes[s].op != Op::Layout && g.nodes[s].dst.overlaps(out) => return None,
            _ => {}
        }
    }
    None
}

/// Q's, K's and V's kernels into one: K's and V's writing their cache rows (the rows as its
/// last two operands, named when the graph runs), or, for a cache per sequence, their f32
/// outputs, which the SET_ROWS copies after it put into the rows.
fn qkv_merge(g: &Graph, v: usize) -> Vec<Rewritten> {
    let cache_kernel = |k: usize| match (g.planned(k), produced_rows(g, k)) {
        (Planned::Kernel(desc, _), Some(rows)) => Some((desc, rows.set_rows)),
        (Planned::Kernel(desc, _), None) => copied_by(g, k).map(|s| (desc, s)),
        _ => None,
    };
    let Some(merge) = b::merge_qkv(g.nodes, v, |k| g.planned(k), cache_kernel) else {
        return Vec::new();
    };
    let [_, k, v] = merge.members;
    let mut operands = merge.operands;
    let rows = match (produced_rows(g, k), produced_rows(g, v)) {
        (Some(k_rows), Some(v_rows)) => append_rows(&mut operands, [k_rows, v_rows]),
        (None, None) => {
            let output = |m: usize| match g.planned(m) {
                Planned::Kernel(_, ops) => ops.last().cloned(),
                _ => None,
            };
            let (Some(k_out), Some(v_out)) = (output(k), output(v)) else {
                return Vec::new();
            };
            operands.extend([k_out, v_out]);
            Vec::new()
        }
        _ => return Vec::new(),
    };
    vec![Rewritten {
        at: merge.at,
        covers: merge
            .members
            .into_iter()
            .filter(|&m| m != merge.at)
            .collect(),
        desc: merge.desc,
        operands,
        rows,
        n_kv: None,
    }]
}

/// The builder's signature of a decode layer's merge (`b::merge_layer`'s).
type LayerBuilder = for<'a> fn(
    &[Node],
    &dyn Fn(usize) -> Planned<'a>,
    usize,
    &KernelDesc,
    &[Tensor],
    [usize; 2],
) -> Option<b::LayerMerge>;

/// A decode layer's kernels into one, as `merge` finds them after the Q/K/V kernel at `at`
/// (which writes K's and V's cache rows).
fn layer_merge(g: &Graph, at: usize, merge: LayerBuilder) -> Vec<Rewritten> {
    let (Planned::Kernel(desc, operands), [k_rows, v_rows]) = (g.planned(at), g.steps.rows(at))
    else {
        return Vec::new();
    };
    let qkv_operands = &operands[..operands.len() - 2];
    let set_rows = [k_rows.set_rows, v_rows.set_rows];
    let planned = |k: usize| g.planned(k);
    let Some(layer) = merge(g.nodes, &planned, at, desc, qkv_operands, set_rows) else {
        return Vec::new();
    };
    let mut operands = layer.before_rows;
    let rows = append_rows(&mut operands, [k_rows, v_rows]);
    operands.extend(layer.after_rows);
    let mut covers = vec![at, set_rows[0], set_rows[1]];
    covers.extend(layer.absorbed);
    vec![Rewritten {
        at: layer.at,
        covers,
        desc: layer.desc,
        operands,
        rows,
        n_kv: None,
    }]
}
