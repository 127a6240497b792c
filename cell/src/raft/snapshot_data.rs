//! A snapshot's image as openraft handles it: a region of a file, from
//! `base` to the end, read and written in place.
//!
//! openraft asks the state machine for the current snapshot each time it
//! (re)starts sending one to a follower. Held in memory, that meant reading
//! and decoding the whole snapshot file on the state machine's worker every
//! retry, so a follower that was down and needed a snapshot stalled the
//! leader's apply every 200 ms (seen with a 300 MB snapshot: every write
//! timed out). Backed by the file, asking costs a header read, and the
//! chunks are read from disk as they are sent. Received chunks go to a
//! temp file the same way.

use std::io::SeekFrom;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

pub struct SnapshotData {
    file: tokio::fs::File,
    /// Where the image starts in the file; positions seen by openraft are
    /// relative to it.
    base: u64,
}

impl std::fmt::Debug for SnapshotData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SnapshotData(from byte {})", self.base)
    }
}

impl SnapshotData {
    /// The region of `file` from `base` to its end, positioned at its start.
    pub fn new(mut file: std::fs::File, base: u64) -> std::io::Result<SnapshotData> {
        use std::io::Seek;
        file.seek(SeekFrom::Start(base))?;
        Ok(SnapshotData {
            file: tokio::fs::File::from_std(file),
            base,
        })
    }

    /// The whole image, read from its start.
    pub async fn read_all(&mut self) -> std::io::Result<Vec<u8>> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        self.seek(SeekFrom::Start(0)).await?;
        let mut bytes = Vec::new();
        self.read_to_end(&mut bytes).await?;
        Ok(bytes)
    }
}

impl AsyncRead for SnapshotData {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.file).poll_read(cx, buf)
    }
}

impl AsyncSeek for SnapshotData {
    fn start_seek(mut self: Pin<&mut Self>, position: SeekFrom) -> std::io::Result<()> {
        let position = match position {
            SeekFrom::Start(n) => SeekFrom::Start(self.base + n),
            other => other,
        };
        Pin::new(&mut self.file).start_seek(position)
    }

    fn poll_complete(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<u64>> {
        // Also asked before a seek starts, when tokio may report a position
        // it has not tracked yet (0): never below the image's start.
        let base = self.base;
        Pin::new(&mut self.file)
            .poll_complete(cx)
            .map_ok(|at| at.saturating_sub(base))
    }
}

impl AsyncWrite for SnapshotData {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.file).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.file).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.file).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

    #[tokio::test]
    async fn positions_are_relative_to_the_image() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("f");
        std::fs::write(&path, b"HEADERimage-bytes").expect("write");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open");
        let mut data = SnapshotData::new(file, 6).expect("region");
        assert_eq!(data.seek(SeekFrom::End(0)).await.expect("end"), 11);
        assert_eq!(data.seek(SeekFrom::Start(6)).await.expect("start"), 6);
        let mut rest = String::new();
        data.read_to_string(&mut rest).await.expect("read");
        assert_eq!(rest, "bytes");
        data.seek(SeekFrom::Start(0)).await.expect("start");
        data.write_all(b"IMAGE").await.expect("write");
        data.flush().await.expect("flush");
        assert_eq!(data.read_all().await.expect("all"), b"IMAGE-bytes");
    }
}
