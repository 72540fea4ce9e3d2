//! The messages between rank 0 and the other ranks, over one TCP connection each: length-prefixed
//! frames (`u32` little-endian length of kind + payload, a kind byte, the payload). A step plan
//! is the scheduler's [`SchedulerOutput`] as flat little-endian `u32` arrays: plain data, so
//! every rank builds the same batch from it, the window group's slots and tables included.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use crate::scheduler::{ScheduledSeq, SchedulerOutput};
use crate::sequence::SeqId;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A rank introduces itself: its rank and its settings (JSON).
    Hello = 1,
    /// Rank 0 admits a rank: the NCCL unique id.
    Welcome = 2,
    /// Rank 0 turns a rank away: why (UTF-8).
    Refuse = 3,
    /// A number every rank must agree on (`u64`): a rank's own, then rank 0's agreed one (the
    /// KV-cache bytes every rank can hold; whether every rank opened the one-shot regions).
    Agree = 4,
    /// A step to compute (an encoded [`SchedulerOutput`]).
    Step = 5,
    /// The group is shutting down.
    Stop = 6,
    /// CUDA IPC handles of the one-shot all-reduce regions: a rank's own, then every rank's.
    Handles = 7,
}

impl Kind {
    fn from_u8(b: u8) -> io::Result<Kind> {
        Ok(match b {
            1 => Kind::Hello,
            2 => Kind::Welcome,
            3 => Kind::Refuse,
            4 => Kind::Agree,
            5 => Kind::Step,
            6 => Kind::Stop,
            7 => Kind::Handles,
            _ => return Err(bad(format!("unknown message kind {b}"))),
        })
    }
}

/// Largest frame accepted (a step of 64k tokens and 64k block-table entries is ~1 MiB).
const MAX_FRAME: usize = 64 << 20;

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// One end of a rank-0-to-rank connection.
pub struct Link {
    stream: TcpStream,
}

impl Link {
    /// Frames over `stream` (Nagle off: a step plan goes out at once).
    pub fn new(stream: TcpStream) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        Ok(Link { stream })
    }

    /// The connection, for timeouts and for a second handle.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Sends one frame.
    pub fn send(&mut self, kind: Kind, payload: &[u8]) -> io::Result<()> {
        let len = u32::try_from(payload.len() + 1).map_err(|_| bad("frame too long".into()))?;
        let mut head = [0u8; 5];
        head[..4].copy_from_slice(&len.to_le_bytes());
        head[4] = kind as u8;
        self.stream.write_all(&head)?;
        self.stream.write_all(payload)
    }

    /// Receives one frame into `payload` (reusing its allocation).
    pub fn recv_into(&mut self, payload: &mut Vec<u8>) -> io::Result<Kind> {
        let mut head = [0u8; 5];
        self.stream.read_exact(&mut head)?;
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if len == 0 || len > MAX_FRAME {
            return Err(bad(format!("frame of {len} bytes")));
        }
        let kind = Kind::from_u8(head[4])?;
        payload.resize(len - 1, 0);
        self.stream.read_exact(payload)?;
        Ok(kind)
    }

    /// Receives one frame.
    pub fn recv(&mut self) -> io::Result<(Kind, Vec<u8>)> {
        let mut payload = Vec::new();
        let kind = self.recv_into(&mut payload)?;
        Ok((kind, payload))
    }
}

fn put(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_all(buf: &mut Vec<u8>, vs: &[u32]) {
    for &v in vs {
        put(buf, v);
    }
}

/// Words of one scheduled sequence: id (2), computed, new, token range (2), table range (2),
/// samples, drafts, prompt-logprob rows.
const SEQ_WORDS: usize = 11;

/// Encodes a step plan into `buf` (cleared first): a header (sequences, tokens, table entries,
/// whether a window group's slots and tables follow), the sequences, then the arrays. Preemptions
/// are the scheduler's business and are not sent.
pub fn encode_step(out: &SchedulerOutput, buf: &mut Vec<u8>) {
    buf.clear();
    let n = out.token_ids.len();
    let window = out.has_window();
    let arrays = (3 + usize::from(window)) * n + (1 + usize::from(window)) * out.block_tables.len();
    buf.reserve(4 * (4 + SEQ_WORDS * out.seqs.len() + arrays));
    put(buf, out.seqs.len() as u32);
    put(buf, n as u32);
    put(buf, out.block_tables.len() as u32);
    put(buf, u32::from(window));
    for s in &out.seqs {
        put(buf, s.seq_id.0 as u32);
        put(buf, (s.seq_id.0 >> 32) as u32);
        put(buf, s.num_computed_tokens as u32);
        put(buf, s.num_new_tokens as u32);
        put(buf, s.tokens.start as u32);
        put(buf, s.tokens.end as u32);
        put(buf, s.block_table.start as u32);
        put(buf, s.block_table.end as u32);
        put(buf, u32::from(s.samples));
        put(buf, s.num_draft_tokens as u32);
        put(buf, s.num_prompt_rows as u32);
    }
    put_all(buf, &out.token_ids);
    put_all(buf, &out.positions);
    put_all(buf, &out.slot_mapping);
    put_all(buf, &out.block_tables);
    if window {
        put_all(buf, &out.window_slot_mapping);
        put_all(buf, &out.window_block_tables);
    }
}

/// Decodes a step plan into `out` (its buffers reused), checking every range against the arrays
/// it indexes.
pub fn decode_step(bytes: &[u8], out: &mut SchedulerOutput) -> io::Result<()> {
    if !bytes.len().is_multiple_of(4) {
        return Err(bad("a step plan is whole 32-bit words".into()));
    }
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let [num_seqs, n, tables, window, ref rest @ ..] = words[..] else {
        return Err(bad("a step plan without its header".into()));
    };
    let (num_seqs, n, tables) = (num_seqs as usize, n as usize, tables as usize);
    let window = match window {
        0 => false,
        1 => true,
        w => return Err(bad(format!("a step plan's window flag is {w}"))),
    };
    let arrays = (3 + usize::from(window)) * n + (1 + usize::from(window)) * tables;
    if rest.len() != SEQ_WORDS * num_seqs + arrays {
        return Err(bad("a step plan of the wrong length".into()));
    }
    let (seq_words, arrays) = rest.split_at(SEQ_WORDS * num_seqs);
    out.seqs.clear();
    for w in seq_words.chunks_exact(SEQ_WORDS) {
        let s = ScheduledSeq {
            seq_id: SeqId(u64::from(w[0]) | (u64::from(w[1]) << 32)),
            num_computed_tokens: w[2] as usize,
            num_new_tokens: w[3] as usize,
            tokens: w[4] as usize..w[5] as usize,
            block_table: w[6] as usize..w[7] as usize,
            samples: w[8] != 0,
            num_draft_tokens: w[9] as usize,
            num_prompt_rows: w[10] as usize,
        };
        if s.tokens.start > s.tokens.end
            || s.num_draft_tokens > s.num_new_tokens
            || s.num_prompt_rows + usize::from(s.samples) > s.num_new_tokens
            || s.tokens.end > n
            || s.block_table.start > s.block_table.end
            || s.block_table.end > tables
        {
            return Err(bad(format!(
                "sequence {:?} indexes past the plan",
                s.seq_id
            )));
        }
        out.seqs.push(s);
    }
    let (ids, rest) = arrays.split_at(n);
    let (positions, rest) = rest.split_at(n);
    let (slots, rest) = rest.split_at(n);
    let (block_tables, rest) = rest.split_at(tables);
    // Without a window group the window arrays are empty (`SchedulerOutput::has_window`).
    let (window_slots, window_tables) = rest.split_at(rest.len().min(n));
    for (v, src) in [
        (&mut out.token_ids, ids),
        (&mut out.positions, positions),
        (&mut out.slot_mapping, slots),
        (&mut out.block_tables, block_tables),
        (&mut out.window_slot_mapping, window_slots),
        (&mut out.window_block_tables, window_tables),
    ] {
        v.clear();
        v.extend_from_slice(src);
    }
    out.preempted.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> SchedulerOutput {
        SchedulerOutput {
            seqs: vec![
                ScheduledSeq {
                    seq_id: SeqId(7 + (1 << 40)),
                    num_computed_tokens: 30,
                    num_new_tokens: 1,
                    num_draft_tokens: 0,
                    tokens: 0..1,
                    block_table: 0..2,
                    samples: true,
                    num_prompt_rows: 0,
                },
                ScheduledSeq {
                    seq_id: SeqId(9),
                    num_computed_tokens: 0,
                    num_new_tokens: 3,
                    num_draft_tokens: 2,
                    tokens: 1..4,
                    block_table: 2..3,
                    samples: false,
                    num_prompt_rows: 2,
                },
            ],
            token_ids: vec![5, 6, 7, 8],
            positions: vec![30, 0, 1, 2],
            slot_mapping: vec![46, 48, 49, 50],
            block_tables: vec![1, 2, 3],
            preempted: vec![SeqId(4)],
            ..SchedulerOutput::default()
        }
    }

    #[test]
    fn a_step_plan_round_trips_over_a_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sender = std::thread::spawn(move || {
            let mut link = Link::new(TcpStream::connect(addr).unwrap()).unwrap();
            let mut buf = Vec::new();
            encode_step(&plan(), &mut buf);
            link.send(Kind::Step, &buf).unwrap();
            link.send(Kind::Stop, &[]).unwrap();
        });
        let mut link = Link::new(listener.accept().unwrap().0).unwrap();
        let (kind, bytes) = link.recv().unwrap();
        assert_eq!(kind, Kind::Step);
        let mut out = SchedulerOutput::default();
        decode_step(&bytes, &mut out).unwrap();
        let want = plan();
        assert_eq!(out.seqs, want.seqs);
        assert_eq!(out.token_ids, want.token_ids);
        assert_eq!(out.positions, want.positions);
        assert_eq!(out.slot_mapping, want.slot_mapping);
        assert_eq!(out.block_tables, want.block_tables);
        assert!(out.preempted.is_empty());
        assert!(!out.has_window());
        assert_eq!(link.recv().unwrap().0, Kind::Stop);
        sender.join().unwrap();
        // The sender is gone: the next read fails instead of blocking.
        assert!(link.recv().is_err());
    }

    #[test]
    fn a_window_groups_slots_and_tables_round_trip() {
        let mut with = plan();
        with.window_slot_mapping = vec![14, 16, 17, 18];
        with.window_block_tables = vec![0, 2, 3];
        let mut buf = Vec::new();
        encode_step(&with, &mut buf);
        // A plan decoded into buffers that held another step's window fields.
        let mut out = SchedulerOutput {
            window_slot_mapping: vec![9; 7],
            ..SchedulerOutput::default()
        };
        decode_step(&buf, &mut out).unwrap();
        assert_eq!(out.seqs, with.seqs);
        assert_eq!(out.slot_mapping, with.slot_mapping);
        assert_eq!(out.block_tables, with.block_tables);
        assert_eq!(out.window_slot_mapping, with.window_slot_mapping);
        assert_eq!(out.window_block_tables, with.window_block_tables);
        // The next plan has no window group: its fields are cleared.
        encode_step(&plan(), &mut buf);
        decode_step(&buf, &mut out).unwrap();
        assert!(!out.has_window() && out.window_slot_mapping.is_empty());
        // A window flag that is neither 0 nor 1, and window arrays cut short, are refused.
        encode_step(&with, &mut buf);
        let mut bad_flag = buf.clone();
        bad_flag[12] = 2;
        assert!(decode_step(&bad_flag, &mut out).is_err());
        buf.truncate(buf.len() - 4);
        assert!(decode_step(&buf, &mut out).is_err());
    }

    #[test]
    fn a_plan_that_indexes_past_its_arrays_is_refused() {
        let mut bad_plan = plan();
        bad_plan.seqs[1].tokens = 1..9;
        let mut buf = Vec::new();
        encode_step(&bad_plan, &mut buf);
        let e = decode_step(&buf, &mut SchedulerOutput::default()).unwrap_err();
        assert!(e.to_string().contains("indexes past the plan"), "{e}");
        encode_step(&plan(), &mut buf);
        buf.truncate(buf.len() - 4);
        assert!(decode_step(&buf, &mut SchedulerOutput::default()).is_err());
    }
}
