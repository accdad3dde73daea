//! A row as pgoutbox sees it: a relation's columns and one tuple's values. The pgoutput
//! decoder (`postgres::pgoutput`) fills these; the row mapping (`outbox`) reads them.

use bytes::Bytes;

/// A table as pgoutput describes it, before the first row after any change to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub rel_id: u32,
    pub namespace: String,
    pub name: String,
    pub replica_identity: u8,
    pub columns: Vec<Column>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// 1 when the column is part of the key.
    pub flags: u8,
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
}

/// One column of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnValue {
    Null,
    /// A TOASTed value that did not change (updates only); its value is not sent.
    UnchangedToast,
    /// The type's text output.
    Text(Bytes),
    /// The type's binary output (only with the `binary` option).
    Binary(Bytes),
}
