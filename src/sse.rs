//! Reading a server-sent event stream as the OpenAI-style endpoints write it: bytes in, in
//! whatever pieces the network delivers them, and each complete event's `data:` payload out.
//! Bytes are kept until an event is complete, so a character split between two pieces arrives
//! whole.

/// Splits a stream of bytes into events' data.
#[derive(Debug, Default)]
pub struct SseEvents {
    buf: Vec<u8>,
}

impl SseEvents {
    /// Appends `piece` and returns the data of every event it completed, in order (events
    /// without a `data:` line are skipped; several `data:` lines are joined by newlines, as
    /// the standard says).
    pub fn push(&mut self, piece: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(piece);
        let mut out = Vec::new();
        while let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                out.push(data.join("\n"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_arrive_whole() {
        let stream = "data: {\"t\":\"é\"}\n\n: comment\n\ndata: a\ndata: b\n\ndata: [DONE]\n\n";
        let bytes = stream.as_bytes();
        for cut in 0..bytes.len() {
            let mut sse = SseEvents::default();
            let mut got = sse.push(&bytes[..cut]);
            got.extend(sse.push(&bytes[cut..]));
            assert_eq!(got, ["{\"t\":\"é\"}", "a\nb", "[DONE]"], "cut at {cut}");
        }
    }
}
