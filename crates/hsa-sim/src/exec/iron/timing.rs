//! Device time of one emulated IRON design, from what its dataflow does.
//!
//! The scheduler (`sched`) carries times beside the data: every object buffer remembers when it
//! was made full and when it was given back, every DMA channel and every core has a clock, and
//! the runtime sequence has its own. A transfer of an object starts when its producer has it,
//! every consumer has a free buffer and the channels are idle; it lasts its bytes over the
//! channel's rate, and a shim channel's bytes also pass through the DRAM ledger shared by all
//! shim channels. A core's kernel call lasts the cycles its library counted (the AIE-API
//! stand-in's slot counters, `ggml_hsa_emu_core_cycles`). The dispatch ends when the sequence
//! has run and its last task is done: the critical path of the dataflow, not a max of totals.
//!
//! Rates and costs come from [`crate::cost::ArchModel`]; docs/timing-model.md states their
//! sources and what is not modelled.

use crate::cost::ArchModel;

/// Cycles per bucket of the DRAM ledger.
const BUCKET_CYCLES: f64 = 128.0;

/// The array's rates in cycles of its clock.
#[derive(Clone, Copy, Debug)]
pub struct Rates {
    pub cycle_ns: f64,
    /// A shim tile's MM2S or S2MM channel, bytes per cycle.
    pub shim_channel: f64,
    /// A memory tile's or compute tile's DMA channel, bytes per cycle.
    pub tile_channel: f64,
    /// DRAM bytes per cycle, all shim channels together.
    pub dram: f64,
}

impl Rates {
    pub fn of(m: &ArchModel) -> Rates {
        Rates {
            cycle_ns: 1e9 / m.clock_hz,
            shim_channel: m.shim_channel_bytes_per_cycle,
            tile_channel: m.tile_channel_bytes_per_cycle,
            dram: m.bandwidth_bytes_per_s / m.clock_hz,
        }
    }
}

/// DRAM capacity over time: a shim transfer takes its bytes from consecutive buckets, at most
/// its channel's rate and what the bucket has left. Transfers are booked in the scheduler's
/// order, which is not time order; a transfer booked later into a bucket another filled waits
/// for the next (the first booked gets the bandwidth, a bias the docs state).
#[derive(Debug, Default)]
pub struct DramLedger {
    used: Vec<f64>,
}

impl DramLedger {
    /// Books `bytes` from `start` at `channel` bytes per cycle; returns the end time.
    pub fn transfer(&mut self, r: &Rates, start: f64, bytes: f64, channel: f64) -> f64 {
        let cap = r.dram * BUCKET_CYCLES;
        let mut left = bytes;
        let mut t = start;
        while left > 0.0 {
            let k = (t / BUCKET_CYCLES) as usize;
            if self.used.len() <= k {
                self.used.resize(k + 1, 0.0);
            }
            let bucket_end = (k as f64 + 1.0) * BUCKET_CYCLES;
            let room = (cap - self.used[k]).max(0.0);
            let by_channel = channel * (bucket_end - t);
            let moved = left.min(room).min(by_channel);
            self.used[k] += moved;
            left -= moved;
            if left <= 0.0 {
                // Ends inside this bucket, at the slower of the channel and the bucket's room.
                return t + moved / channel.min(room / (bucket_end - t));
            }
            t = bucket_end;
        }
        t
    }
}

/// One task group of the runtime sequence, as a span of time: from the previous await's return
/// (the dispatch's start) to its own await's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskGroupTime {
    /// The sequence's clock once the await returned (from the dispatch's start).
    pub end_ns: u64,
    /// Bytes the shim channels moved between DRAM and the array within the span (whole
    /// objects, by when each one's move ended), whichever task group issued them: a design
    /// that issues the next group's fills early (weights streaming ahead) moves them here.
    pub shim_bytes: u64,
    /// The busiest core's kernel calls within the span (each call by when it ended).
    pub core_busy_ns: u64,
}

/// Where a dispatch's time went (cycles of the array clock, converted to ns on output).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    /// Start of the runtime sequence to its last task's completion.
    pub device_ns: u64,
    /// The busiest core's kernel calls.
    pub core_busy_ns: u64,
    /// The busiest shim channel's transfers (DRAM waits included).
    pub shim_busy_ns: u64,
    /// The busiest memory-tile or core-to-core channel's transfers.
    pub tile_busy_ns: u64,
    /// Whether every core's library counted its cycles (false: calls cost nothing).
    pub cores_counted: bool,
    /// The runtime sequence's task groups in order (a design's phases are runs of them).
    pub groups: Vec<TaskGroupTime>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(dram: f64) -> Rates {
        Rates {
            cycle_ns: 1.0,
            shim_channel: 4.0,
            tile_channel: 4.0,
            dram,
        }
    }

    #[test]
    fn a_channel_alone_moves_at_its_rate() {
        let r = rates(64.0);
        let mut d = DramLedger::default();
        assert_eq!(d.transfer(&r, 0.0, 4096.0, 4.0), 1024.0);
        assert_eq!(d.transfer(&r, 1000.0, 40.0, 4.0), 1010.0);
    }

    #[test]
    fn channels_share_the_dram_bandwidth() {
        // Two channels fit in 8 bytes per cycle; a third does not.
        let r = rates(8.0);
        let mut d = DramLedger::default();
        assert_eq!(d.transfer(&r, 0.0, 4096.0, 4.0), 1024.0);
        assert_eq!(d.transfer(&r, 0.0, 4096.0, 4.0), 1024.0);
        // The third gets nothing until the others are done: 4096 bytes from cycle 1024.
        assert_eq!(d.transfer(&r, 0.0, 4096.0, 4.0), 2048.0);
        // Whatever the order, the DRAM's total holds: 12 KiB in 1536 cycles at best.
        let mut d = DramLedger::default();
        let ends: Vec<f64> = (0..3).map(|_| d.transfer(&r, 0.0, 4096.0, 8.0)).collect();
        assert_eq!(ends, [512.0, 1024.0, 1536.0]);
    }
}
