//! The transaction of the replay table being filled: rows written into frames of at most
//! [`FRAME_BYTES`], handed over together once the chunk holds its rows or its bytes.

use crate::domain::row::{ColumnValue, Relation};
use crate::postgres::pgoutput::FrameWriter;
use crate::postgres::replay_table::FRAME_BYTES;

/// Bytes of frames per transaction, at most, whatever the rows weigh: a chunk is held in
/// memory until it is committed.
pub(super) const CHUNK_BYTES: usize = 8 << 20;

pub(super) struct Chunk<'a> {
    replay_id: &'a str,
    total: u64,
    relation: &'a Relation,
    /// Rows per chunk.
    size: usize,
    /// The closed frames, each with the place of its last row in the selection.
    frames: Vec<(i64, Vec<u8>)>,
    open: Option<FrameWriter>,
    /// The place of the last row written into the open frame.
    last: u64,
    rows: usize,
    bytes: usize,
}

impl<'a> Chunk<'a> {
    pub(super) fn new(replay_id: &'a str, total: u64, relation: &'a Relation, size: usize) -> Self {
        Chunk {
            replay_id,
            total,
            relation,
            size,
            frames: Vec::new(),
            open: None,
            last: 0,
            rows: 0,
            bytes: 0,
        }
    }

    /// Writes the row at place `seen` of the selection, in a new frame when the open one
    /// would outgrow [`FRAME_BYTES`]; whether the chunk is now full.
    pub(super) fn push(&mut self, seen: u64, tuple: &[ColumnValue]) -> bool {
        let row_len = FrameWriter::row_len(tuple);
        if self.open.as_ref().is_some_and(|f| f.bytes() + row_len > FRAME_BYTES) {
            self.close_frame();
        }
        let (id, total, relation) = (self.replay_id, self.total, self.relation);
        let writer = self.open.get_or_insert_with(|| FrameWriter::new(id, total, relation));
        writer.push(seen, tuple);
        self.last = seen;
        (self.rows, self.bytes) = (self.rows + 1, self.bytes + row_len);
        self.rows >= self.size || self.bytes >= CHUNK_BYTES
    }

    /// The chunk's frames, the open one closed, and how many rows they carry; the chunk is
    /// empty again.
    pub(super) fn take(&mut self) -> (Vec<(i64, Vec<u8>)>, u64) {
        self.close_frame();
        let rows = self.rows as u64;
        (self.rows, self.bytes) = (0, 0);
        (std::mem::take(&mut self.frames), rows)
    }

    fn close_frame(&mut self) {
        if let Some(writer) = self.open.take() {
            self.frames.push((self.last as i64, writer.finish()));
        }
    }
}
