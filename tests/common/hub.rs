//! A mock Hugging Face hub on a local port, for the tests that download (`HF_ENDPOINT`). Not a
//! module of `common` (whose helpers load models): the tests that need it include it by path.

/// A hub serving `files` of any repository (path `/<org>/<name>/resolve/<rev>/<file>`) as the
/// Hugging Face hub does for hf-hub's client: the commit and an etag on a one-byte range read,
/// then the file from the range asked; 404 for any other file.
pub fn hub_serving(files: Vec<(&'static str, Vec<u8>)>) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let files = std::sync::Arc::new(files);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let files = files.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut request = String::new();
                let _ = reader.read_line(&mut request);
                let mut start = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                        break;
                    }
                    if let Some(r) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                        start = r.trim().split('-').next().unwrap().parse().unwrap_or(0);
                    }
                }
                let path = request.split_whitespace().nth(1).unwrap_or("");
                let mut out = stream;
                let Some((i, body)) = files
                    .iter()
                    .enumerate()
                    .find(|(_, (name, _))| path.ends_with(&format!("/{name}")))
                    .map(|(i, (_, body))| (i, body))
                else {
                    let _ = out.write_all(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    return;
                };
                let end = body.len();
                let head = format!(
                    "HTTP/1.1 206 Partial Content\r\nx-repo-commit: 0123456789abcdef0123456789abcdef01234567\r\n\
                     etag: \"etag-{i}\"\r\ncontent-range: bytes {start}-{}/{end}\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n",
                    end - 1,
                    end - start
                );
                let _ = out.write_all(head.as_bytes());
                let _ = out.write_all(&body[start..]);
            });
        }
    });
    format!("http://{addr}")
}
