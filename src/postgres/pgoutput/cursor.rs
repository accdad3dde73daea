//! A bounds-checked reader over one message: every read either succeeds or says where the
//! input ended, so malformed bytes become errors, never panics.

use bytes::Bytes;

use super::DecodeError;

pub(crate) struct Cursor {
    bytes: Bytes,
    pos: usize,
}

impl Cursor {
    pub(crate) fn new(bytes: Bytes) -> Self {
        Cursor { bytes, pos: 0 }
    }

    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let end = self.pos + N;
        let slice = self
            .bytes
            .get(self.pos..end)
            .ok_or(DecodeError::UnexpectedEof { need: N, at: self.pos })?;
        self.pos = end;
        // The slice has exactly N bytes.
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take::<1>()?[0])
    }

    pub(crate) fn i16(&mut self) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.take()?))
    }

    pub(crate) fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.take()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.take()?))
    }

    pub(crate) fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.take()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.take()?))
    }

    /// `n` bytes, sharing the underlying buffer (no copy).
    pub(crate) fn bytes(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::UnexpectedEof { need: n, at: self.pos });
        }
        let out = self.bytes.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(out)
    }

    /// A NUL-terminated UTF-8 string.
    pub(crate) fn cstr(&mut self) -> Result<String, DecodeError> {
        let start = self.pos;
        let len = self.bytes[start..]
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::MissingNul { at: start })?;
        let text = std::str::from_utf8(&self.bytes[start..start + len])
            .map_err(|_| DecodeError::InvalidUtf8 { at: start })?
            .to_owned();
        self.pos = start + len + 1;
        Ok(text)
    }
}
