//! Reading the runner's JSON lines with bounded memory.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// One step of [`read_line`].
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A complete line (without the newline) is in the buffer.
    Complete,
    /// The stream ended; the buffer holds whatever came after the last newline.
    Eof,
    /// The line is longer than the limit; what was read of it is discarded.
    TooLong,
}

/// Reads one line into `buf` (cleared first), never holding more than `max` bytes.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Line> {
    buf.clear();
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(Line::Eof);
        }
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (avail.len(), false),
        };
        if buf.len() + take > max {
            buf.clear();
            buf.shrink_to(64 * 1024);
            return Ok(Line::TooLong);
        }
        buf.extend_from_slice(&avail[..take]);
        r.consume(if done { take + 1 } else { take });
        if done {
            return Ok(Line::Complete);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_split_and_bounded() {
        let data: &[u8] = b"ab\ncdefgh\nij";
        let mut r = tokio::io::BufReader::with_capacity(4, data);
        let mut buf = Vec::new();
        assert_eq!(
            read_line(&mut r, &mut buf, 5).await.unwrap(),
            Line::Complete
        );
        assert_eq!(buf, b"ab");
        assert_eq!(read_line(&mut r, &mut buf, 5).await.unwrap(), Line::TooLong);
        assert!(buf.capacity() <= 64 * 1024);
    }

    #[tokio::test]
    async fn eof_keeps_the_unterminated_rest() {
        let data: &[u8] = b"x\nyz";
        let mut r = tokio::io::BufReader::new(data);
        let mut buf = Vec::new();
        assert_eq!(
            read_line(&mut r, &mut buf, 10).await.unwrap(),
            Line::Complete
        );
        assert_eq!(read_line(&mut r, &mut buf, 10).await.unwrap(), Line::Eof);
        assert_eq!(buf, b"yz");
    }
}
