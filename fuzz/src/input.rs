//! A cursor over the fuzzer's bytes. Every read succeeds: past the end it
//! gives zeros or empty slices, so a target never has to reject an input
//! for being short, and the fuzzer's mutations keep their meaning.

pub struct Input<'a> {
    bytes: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Input { bytes }
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn byte(&mut self) -> u8 {
        match self.bytes.split_first() {
            Some((&b, rest)) => {
                self.bytes = rest;
                b
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    pub fn i64(&mut self) -> i64 {
        let mut b = [0u8; 8];
        for x in &mut b {
            *x = self.byte();
        }
        i64::from_le_bytes(b)
    }

    /// At most `n` bytes.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.bytes.split_at(n.min(self.bytes.len()));
        self.bytes = rest;
        head
    }

    /// A chunk prefixed by its length (two bytes, little-endian).
    pub fn chunk(&mut self) -> &'a [u8] {
        let n = self.u16() as usize;
        self.take(n)
    }

    /// The bytes up to the next `\n` (which is consumed, not returned).
    pub fn line(&mut self) -> &'a [u8] {
        match self.bytes.iter().position(|&b| b == b'\n') {
            Some(at) => {
                let line = &self.bytes[..at];
                self.bytes = &self.bytes[at + 1..];
                line
            }
            None => self.take(self.bytes.len()),
        }
    }

    pub fn rest(self) -> &'a [u8] {
        self.bytes
    }
}
